/* kvdrift: the CUDA back end's C entry points. No CUDA type crosses this
 * header: the host code and the runners never include a CUDA header. The
 * host-memory wrappers copy in, run the kernel, copy out: they exist so a
 * test can hold every kernel to its CPU twin on the same inputs. */
#ifndef KVD_CUDA_KERNELS_H
#define KVD_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a device is usable; else 0 and why. */
int kvd_cuda_available(char *why, int len);

/* Quantize on the device exactly as kvd_quant_* does on the CPU:
 * cvt(x / scale), round to nearest even, SATFINITE or NOSAT. 0 on success. */
int kvd_cuda_quant(kvd_fmt fmt, const float *x, void *out, size_t n, float scale, int saturate);

/* Decode attention for one query over a paged cache (kvd_attn_paged's
 * contract, without the probabilities), pools in host memory. */
int kvd_cuda_attn_decode(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int n_ctx,
                         const float *q, int n_heads, float sm_scale, float *out);

#ifdef __cplusplus
}
#endif
#endif
