/* kvdrift: the numerics contract. Every function here has a CPU implementation
 * in kernels/cpu/ (the reference) and, where it pays, a CUDA twin in kernels/cuda/. */
#ifndef KVD_KERNELS_H
#define KVD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "fp8.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[M,N] = x[M,K] * W[N,K]^T: a Hugging Face Linear with W stored [out, in]. */
void kvd_linear(const float *x, const float *w, float *y, int M, int N, int K);
/* Up to this many rows (decode: one per sequence of the batch), kvd_linear
 * on a CPU with AVX-512 or AVX2 + FMA sums every output in one fixed order,
 * whatever the other rows: kvd_linear_rows_ref's, written out in scalar C. */
#define KVD_FEW_ROWS 32
void kvd_linear_rows_ref(const float *x, const float *w, float *y, int M, int N, int K);
/* KVD_FEW_ROWS where this CPU sums them so, else 0 (the BLAS sums every
 * GEMM, in an order that changes with the batch). */
int kvd_linear_fixed_rows(void);
/* The CPU's GEMM kernels: "amx" (GEMMs over BF16 weights on the AMX-BF16
 * tiles, each output from its row and column alone: at any row count with
 * W laid out once, kvd_linear_tiled; past KVD_FEW_ROWS rows otherwise, the
 * AVX-512 kernel below them), "avx512", "avx2" (the same bits for a few
 * rows; the BLAS for more), or "blas" (OpenBLAS sums every GEMM). The best this
 * CPU runs, found when the program starts, unless the environment's
 * KVD_CPU_GEMM names others. */
const char *kvd_linear_kernels(void);
/* Takes the named kernels from now on (tests, bench): 0; -1 where this CPU
 * cannot run them; -2 for a name that is none of them. Call it before any
 * threads run GEMMs. */
int kvd_linear_use(const char *name);
/* -1, with the message in err, where KVD_CPU_GEMM names no kernels this CPU
 * runs (the best are taken instead); else 0 */
int kvd_cpu_gemm_env(char *err, size_t len);
/* W [N][K] laid out once for the AMX tiles, for kvd_linear_tiled, which
 * then takes them at any row count (kvd_linear lays out W's 256-column
 * chunks on every call, past KVD_FEW_ROWS rows only). NULL where the
 * kernels are not "amx" (or out of memory). Chunks whose values are not
 * all BF16 are left to the other kernels, as in kvd_linear. */
typedef struct kvd_wtiles kvd_wtiles;
kvd_wtiles *kvd_wtiles_new(const float *w, int N, int K);
void kvd_wtiles_free(kvd_wtiles *t);
/* the bytes its tiles take (0 where no chunk is BF16) */
size_t kvd_wtiles_bytes(const kvd_wtiles *t);
/* kvd_linear, with W's tiles from t where it is not NULL (made for this w,
 * N and K): kvd_linear's bits past KVD_FEW_ROWS rows, and below them the
 * bits those rows get in any larger batch */
void kvd_linear_tiled(const float *x, const float *w, const kvd_wtiles *t, float *y, int M, int N,
                      int K);
/* kvd_linear_tiled for several matrices over one x (M rows of K): y = x
 * W^T for each job, N outputs. Where every job's tiles are laid out (the
 * model's), x is split for the tiles once and one fork takes every job's
 * chunks; otherwise one call a job. The bits of one call a job either way. */
typedef struct {
    const float *w;
    const kvd_wtiles *t;
    float *y;
    int N;
} kvd_linear_job;
void kvd_linear_many(const float *x, const kvd_linear_job *jobs, int n_jobs, int M, int K);
/* The BLAS behind kvd_linear as it names itself (OpenBLAS: version, build
 * and the core type whose kernels it picked for this CPU). Another core
 * type's kernels sum in another order: the CPU back end's figures are the
 * same bytes on any thread count, and move in the last bits with this. */
const char *kvd_cpu_blas(void);

/* RMSNorm over n values in fp32: x * rsqrt(mean(x^2) + eps) * g, where
 * g = 1 + w (Qwen3-Next's zero-centred norms) when one_plus is set, else w. */
void kvd_rmsnorm(float *out, const float *x, const float *w, int n, float eps, int one_plus);

/* Rotate-half RoPE on the first rot_dim of head_dim values (the rest pass
 * through); inv_freq has rot_dim / 2 entries. */
void kvd_rope(float *v, int pos, int rot_dim, const float *inv_freq);

/* A view of one layer's paged KV cache. Pools are laid out
 * [block][kv_head][slot][head_dim] so one head's keys stream contiguously
 * (the row-scaled formats' scales after each [block][kv_head]'s codes:
 * kvd_pool_codes_at below). */
typedef struct {
    kvd_fmt fmt;
    int block_size;
    int kv_heads;
    int head_dim;
    const void *k;
    const void *v;
    const float *k_scale; /* [kv_heads] dequantization scales (1.0 for BF16 and for the
                             row-scaled formats, whose rows carry their own on top) */
    const float *v_scale;
    int portable; /* 0: the kernels the CPU takes (kvd_attn_kernels); below */
    /* FP8 attention, as FlashAttention 3 computes over an FP8 cache (NULL /
     * 0: FP32 query and weights). q_scale [n_heads]: the query is written as
     * E4M3 (cvt(q / q_scale), saturating) and read back times q_scale.
     * p_fp8: the softmax weights exp(s - M), M the row's maximum over the
     * whole context, times 2^8, rounded to E4M3 for the weighted sum of V;
     * the sum that normalises them is of the unrounded weights. */
    const float *q_scale;
    int p_fp8;
} kvd_kv_view;
/* kvd_kv_view's portable: KVD_ATTN_PORTABLE, the portable kernels even
 * where vector ones exist; KVD_ATTN_NO_AMX, the AVX-512 ones even where the
 * AMX ones are taken (tests, bench) */
#define KVD_ATTN_PORTABLE 1
#define KVD_ATTN_NO_AMX 2

/* FP8 attention's weights: each e (a softmax weight exp(s - M), in [0, 1])
 * as 2^8 e in E4M3 (saturating) read back times 2^-8; the CPU twin of the
 * device's fp8_weight. out may be e. */
void kvd_fp8_weights(const float *e, size_t n, float *out);

/* The CPU twins of FP8 attention's query step and of calibration's query
 * absmax (kvd_cuda_attn_fp8_query_dev, kvd_cudaop_absmax_heads): rows of
 * n_heads x head_dim values, row_stride floats apart. kvd_fp8_query writes
 * each head's values as E4M3 with q_scale[head] (saturating) and reads them
 * back into out (may be q); kvd_absmax_heads raises absmax[head] to the
 * largest |value| of each head (a NaN is passed over). */
void kvd_fp8_query(const float *q, float *out, int rows, size_t row_stride, int n_heads,
                   int head_dim, const float *q_scale);
void kvd_absmax_heads(const float *x, int rows, size_t row_stride, size_t head_stride, int n_heads,
                      int head_dim, float *absmax);

/* Bytes of one row (one token's K or V of one KV head, head_dim values) in
 * a cache of this format: NVFP4 rows carry their block scales, E4M3T and
 * I8T rows their own scale. */
static inline size_t kvd_fmt_row_bytes(kvd_fmt f, int head_dim) {
    return f == KVD_FMT_NVFP4      ? kvd_nvfp4_row_bytes((size_t)head_dim)
           : kvd_fmt_row_scaled(f) ? kvd_scaled_row_bytes(kvd_fmt_code_bytes(f, (size_t)head_dim))
           : f == KVD_FMT_BF16     ? 2 * (size_t)head_dim
                                   : (size_t)head_dim;
}

/* Where a row sits in its pool. Row r of a pool (r = (block * kv_heads +
 * head) * bs + slot) is in segment r / bs (one KV head's bs rows of one
 * block, bs kvd_fmt_row_bytes long). Most formats keep each row whole, rows
 * side by side; the row-scaled ones keep the segment's codes side by side,
 * then its rows' scales (fp8.h: kvd_scaled_codes_at, kvd_scaled_scale_at).
 *   kvd_pool_code_stride: the bytes from one row's codes to the next in a
 *     segment; kvd_pool_codes_at: where row r's codes start;
 *   kvd_pool_quant_row: x (head_dim values) into row r through
 *     kvd_quant_row (its scale, saturate and stats);
 *   kvd_pool_get_row: row r as the codec writes a row (the codes, then a
 *     row-scaled format's scale);
 *   kvd_pool_row_scale: the scale of row slot of a row-scaled pool's
 *     segment seg (a pointer to its first byte); I4T's with its zero
 *     point's bits cleared. */
static inline size_t kvd_pool_code_stride(kvd_fmt f, int head_dim) {
    return kvd_fmt_row_scaled(f) ? kvd_fmt_code_bytes(f, (size_t)head_dim)
                                 : kvd_fmt_row_bytes(f, head_dim);
}
/* the byte offset of row r's codes (its first byte) in a pool */
static inline size_t kvd_pool_codes_at(kvd_fmt f, int head_dim, int bs, size_t r) {
    return kvd_fmt_row_scaled(f) ? kvd_scaled_codes_at(kvd_fmt_code_bytes(f, (size_t)head_dim), bs,
                                                       r / (size_t)bs, (int)(r % (size_t)bs))
                                 : r * kvd_fmt_row_bytes(f, head_dim);
}
void kvd_pool_quant_row(kvd_fmt f, uint8_t *pool, int bs, int head_dim, size_t r, const float *x,
                        float scale, int saturate, kvd_qstats *stats);
void kvd_pool_get_row(kvd_fmt f, const uint8_t *pool, int bs, int head_dim, size_t r, uint8_t *row);
float kvd_pool_row_scale(kvd_fmt f, const uint8_t *seg, int bs, int head_dim, int slot);

/* Decode one K or V row (head_dim values) of the cache into floats (I4T's
 * rotated back: kvd_rht's inverse over head_dim). */
void kvd_kv_row(const kvd_kv_view *kv, int which_v, const int32_t *blocks, int pos, int head,
                float *out);

/* Attention for one query token over positions [0, n_ctx) of a sequence's
 * paged cache. q is [n_heads][head_dim] (GQA: n_heads / kv_heads query heads
 * per KV head, consecutive), out the same shape. probs, when not NULL,
 * receives the attention distribution [n_heads][n_ctx]. The context is split
 * into n_parts parts that run in parallel (OpenMP) and are merged by their
 * softmax maxima and sums; work holds kvd_attn_work_bytes(...) bytes. Softmax
 * sums accumulate in double. With the view's FP8 attention, probs is the
 * distribution of the FP8 query's scores before the weights are rounded
 * (the rounding shows in out). */
size_t kvd_attn_work_bytes(int n_heads, int head_dim, int n_ctx, int n_parts);
/* Parts for a context: one per 1024 tokens, at most 32 (a function of the
 * context alone, so a result never depends on the thread count). */
static inline int kvd_attn_parts(int n_ctx, int block_size) {
    int nb = (n_ctx + block_size - 1) / block_size, p = nb / (1024 / block_size);
    return p < 1 ? 1 : p > 32 ? 32 : p;
}
void kvd_attn_paged(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                    int n_heads, float sm_scale, float *out, float *probs, void *work, int n_parts);
/* int4-token (I4T) caches: kvd_attn_paged rotates q as the rows were
 * (kvd_rht_rows, in BF16), divides sm_scale by head_dim and rotates the
 * output back. kvd_attn_paged_rotated is the attention in the rotated
 * basis alone, q taken as given (the device kernels' twin: their callers
 * rotate); for every other format the two are one. */
void kvd_attn_paged_rotated(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                            int n_heads, float sm_scale, float *out, float *probs, void *work,
                            int n_parts);
/* Which kernels kvd_attn_paged takes where the view does not ask for
 * others: "AMX" (the AVX-512 ones, with AMX-BF16 tiles for the products at
 * 8 or 16 query heads a KV head, on an x86-64 CPU with AMX-BF16 and
 * AVX512-BF16 whose OS grants the tiles), "AVX-512" (on an x86-64 CPU with
 * AVX-512 VBMI, whatever the build was compiled for) or "portable" (GNU C
 * vectors, whatever the machine; also where the environment's
 * KVD_CPU_ATTENTION=portable asks for them; =avx512 leaves out AMX). They
 * round differently in the last bits. */
const char *kvd_attn_kernels(void);
/* -1, with the message in err, where KVD_CPU_ATTENTION names kernels this
 * CPU does not run (amx, avx512, portable); else 0 */
int kvd_attn_env(char *err, size_t len);

/* Two attention distributions of one query compared head by head, as the
 * drift figures take them. p and q are [n_heads][n_ctx]; for each head h,
 * kl[h] = sum over t with p > 0 of p (log p - log max(q, 1e-300)), in double
 * (KL(P || Q), natural log, not clamped), and top_p[h], top_q[h] the
 * most-attended position of each (the first of equal maxima). */
void kvd_attn_compare(const float *p, const float *q, int n_heads, int n_ctx, double *kl,
                      int *top_p, int *top_q);

/* The residual stream of a test run against a reference's, row by row
 * (rows of n values, a the reference's): sums in double, in order, of the
 * squared difference, the reference's and the test's squares and their
 * products. The relative L2 error is sqrt(err2 / ref2), the cosine
 * dot / sqrt(ref2 test2). */
typedef struct {
    double err2, ref2, dot, test2;
} kvd_hidden_cmp;
void kvd_hidden_compare(const float *a, const float *x, int rows, int n, kvd_hidden_cmp *out);

/* Two next-token distributions from their logits: KL(P_a || P_x) in nats
 * (double, clamped at 0), whether their argmaxes agree (the first of equal
 * maxima), each side's log-sum-exp (so log p(token) = logit - lse), and
 * each side's logit of token `target` (NaN when target < 0). */
typedef struct {
    double kl, lse_a, lse_x, a_target, x_target;
    int same_argmax;
} kvd_logit_cmp;
kvd_logit_cmp kvd_compare_logits(const float *a, const float *x, int V, int target);

/* One step of the gated delta rule for one head. S is [dk][dv] (fp32),
 * q and k are already L2-normalised (q also scaled by dk^-0.5):
 *   S = exp(g) S;  S += k (x) beta (v - S^T k);  o = S^T q. */
void kvd_gdn_step(float *S, const float *q, const float *k, const float *v, float g, float beta,
                  float *o, int dk, int dv);

/* kvd_gdn_step over n tokens of one head, the same bits as n calls:
 * q and k rows at qk_stride, v at v_stride, o at o_stride, g and beta at
 * gb_stride. A column of S never meets another (S^T k, the update and
 * S^T q are per column), so each slice of 64 columns (16 and single
 * ones at the edge) goes through all n tokens while it sits in L1: S is
 * read and written once a call, not three times a token. */
void kvd_gdn_steps(float *S, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, float *o, int n, int dk, int dv, size_t qk_stride,
                   size_t v_stride, size_t gb_stride, size_t o_stride);

/* kvd_gdn_step over n tokens of one head in chunks (see gdn.c): q, k, v
 * and o rows at the given strides, g and beta one per token. The same
 * result up to rounding. */
#define KVD_GDN_CHUNK 64
void kvd_gdn_chunked(float *S, const float *q, const float *k, const float *v, const float *g,
                     const float *beta, float *o, int n, int dk, int dv, size_t q_stride,
                     size_t k_stride, size_t v_stride, size_t o_stride);

/* Zeroed memory for large pools, on huge pages where available. */
void *kvd_alloc_pool(size_t bytes);
void kvd_free_pool(void *p);

/* Softmax over n logits in place (fp32 values, double normaliser). */
void kvd_softmax(float *x, int n);

/* Indices of the k largest of x[0..n) in descending order (ties: lower index first). */
void kvd_topk(const float *x, int n, int k, int *idx);

/* MoE routing of one row: softmax over the E logits in place (fp32, double
 * sum), the top k (kvd_topk), their probabilities renormalised to sum to one
 * when norm (sum in double). */
void kvd_route(float *logits, int E, int K, int norm, int *topi, float *topw);

/* Index of the first largest of x[0..n) (greedy sampling). */
int kvd_argmax(const float *x, int n);

/* SwiGLU in place: g[i] = silu(g[i]) * u[i]. */
void kvd_swiglu(float *g, const float *u, size_t n);

static inline float kvd_sigmoidf(float x);
static inline float kvd_siluf(float x);

#ifdef __cplusplus
}
#endif

#include <math.h>
static inline float kvd_sigmoidf(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static inline float kvd_siluf(float x) {
    return x / (1.0f + expf(-x));
}

#endif
