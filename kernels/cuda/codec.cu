// kvdrift: quantize-on-write on the device. The conversion is CUDA's own
// __nv_cvt_float_to_fp8 / __float2bfloat16_rn, the functions the CPU codecs
// are held to bit for bit by tests/oracle; the division by the scale is
// IEEE (-prec-div is the default), as on the CPU.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_kernels.h"

__global__ void quant_fp8(const float *x, unsigned char *out, size_t n, float scale, int sat,
                          int e5m2) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float y = __fdiv_rn(x[i], scale);
    out[i] =
        __nv_cvt_float_to_fp8(y, sat ? __NV_SATFINITE : __NV_NOSAT, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

__global__ void quant_bf16(const float *x, unsigned short *out, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    out[i] = *reinterpret_cast<unsigned short *>(&h);
}

extern "C" int kvd_cuda_available(char *why, int len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        std::snprintf(why, (size_t)len, "no CUDA device visible (%s)",
                      e == cudaSuccess ? "none found" : cudaGetErrorString(e));
        return 0;
    }
    return 1;
}

extern "C" int kvd_cuda_quant(kvd_fmt fmt, const float *x, void *out, size_t n, float scale,
                              int saturate) {
    float *dx = nullptr;
    void *dout = nullptr;
    size_t esz = fmt == KVD_FMT_BF16 ? 2 : 1;
    if (cudaMalloc(&dx, n * sizeof(float)) != cudaSuccess) return -1;
    if (cudaMalloc(&dout, n * esz) != cudaSuccess) {
        cudaFree(dx);
        return -1;
    }
    cudaMemcpy(dx, x, n * sizeof(float), cudaMemcpyHostToDevice);
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (fmt == KVD_FMT_BF16) {
        quant_bf16<<<blocks, 256>>>(dx, (unsigned short *)dout, n);
    } else {
        quant_fp8<<<blocks, 256>>>(dx, (unsigned char *)dout, n, scale, saturate,
                                   fmt == KVD_FMT_E5M2);
    }
    cudaError_t e = cudaMemcpy(out, dout, n * esz, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dout);
    return e == cudaSuccess && cudaGetLastError() == cudaSuccess ? 0 : -1;
}
