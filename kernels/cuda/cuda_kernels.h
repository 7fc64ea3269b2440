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

/* NULL when cuBLASLt (opened at run time, lt_open.c) is there; else why not. */
const char *kvd_cublaslt_missing(void);

/* Quantize on the device exactly as kvd_quant_* does on the CPU:
 * cvt(x / scale), round to nearest even, SATFINITE or NOSAT. 0 on success. */
int kvd_cuda_quant(kvd_fmt fmt, const float *x, void *out, size_t n, float scale, int saturate);

/* Decode attention for one query over a paged cache (kvd_attn_paged's
 * contract, without the probabilities), pools in host memory. */
int kvd_cuda_attn_decode(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int n_ctx,
                         const float *q, int n_heads, float sm_scale, float *out);
/* The same with a kernel version: 1 (plain reference kernels), 2 (split over
 * the context, coalesced rows, online softmax on FP32 cores; head_dim
 * 64/128/256, GQA group a power of two <= 16), 3 (split over the context,
 * tensor cores with the query and probabilities as 16-bit hi + lo pairs;
 * head_dim 64/128/256, any GQA group <= 16, where the device's shared memory
 * holds two stages), or 0: the best of these the shape allows. -1 when the
 * version asked for cannot take the shape. FP8 weights (kv->p_fp8; the
 * query is taken as given): versions 1 and 3 round them, 3 in two passes
 * (the row maxima, then the weights); 2 refuses them (-1). */
int kvd_cuda_attn_decode_v(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int n_ctx,
                           const float *q, int n_heads, float sm_scale, float *out, int version);

/* The attention distribution [n_heads][n_ctx] of one query (kvd_attn_paged's
 * probs), pools in host memory. */
int kvd_cuda_attn_probs(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int n_ctx,
                        const float *q, int n_heads, float sm_scale, float *probs);

/* kvd_cuda_attn_probs_rows_dev (below) with the pools, the block table
 * (n_blocks entries), qrow, n_ctx and q (q_rows rows of q_stride floats) in
 * host memory; probs [n][n_heads][the largest n_ctx]. */
int kvd_cuda_attn_probs_rows(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int n,
                             const int *qrow, const int *n_ctx, const float *q, size_t q_stride,
                             int q_rows, int n_heads, float sm_scale, float *probs);

/* The drift comparisons on the device (compare.cu), host memory in and out:
 * kvd_attn_compare, kvd_hidden_compare, kvd_compare_logits over rows
 * (target: each row's target token, or NULL for none). */
int kvd_cuda_attn_compare(const float *p, const float *q, int n_heads, int n_ctx, double *kl,
                          int *top_p, int *top_q);
int kvd_cuda_hidden_compare(const float *a, const float *x, int rows, int n, kvd_hidden_cmp *out);
int kvd_cuda_logits_compare(const float *a, const float *x, int rows, int V, const int *target,
                            kvd_logit_cmp *out);

/* Prefill attention for n_q query rows of one sequence, row r at position
 * pos0 + r over positions 0 .. pos0 + r (each row as kvd_attn_paged with
 * n_ctx = pos0 + r + 1); q and out [n_q][n_heads][head_dim]. Version 1:
 * FP32 cores, one block per row and KV head (head_dim 64/128/256, GQA group
 * a power of two <= 16); 2: tensor cores, rows and heads sharing each K/V
 * stage, query and probabilities as 16-bit hi + lo pairs (head_dim
 * 64/128/256, any group, where the device's shared memory holds two
 * stages); 3: 2 with the context split every 128 positions and the splits
 * merged (what a short chunk deep in a long context gets, at a test's
 * scale); 4 and 5: 2 and 3 with each warp splitting its query again every
 * stage instead of keeping the pieces in shared memory (what version 2 does
 * where shared memory is short, as on sm_120; the same results bit for
 * bit); 0: 2 where it can, else 1. -1 when the version asked for cannot
 * take the shape. FP8 weights (kv->p_fp8): versions 2 to 5 round them in
 * two passes, 1 refuses them (-1). */
int kvd_cuda_attn_prefill_v(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int pos0,
                            int n_q, const float *q, int n_heads, float sm_scale, float *out,
                            int version);
int kvd_cuda_attn_prefill(const kvd_kv_view *kv, int n_blocks, const int32_t *blocks, int pos0,
                          int n_q, const float *q, int n_heads, float sm_scale, float *out);

/* y[M,N] = x[M,K] * W[N,K]^T with BF16 x and W (bit patterns), FP32
 * accumulation and output, through cuBLASLt; host memory in and out. */
int kvd_cuda_linear_bf16(const uint16_t *x, const uint16_t *w, float *y, int M, int N, int K);
/* The same on device pointers. */
int kvd_cuda_linear_bf16_dev(const void *x, const void *w, float *y, int M, int N, int K);
/* cuBLASLt's algorithm for a shape: the heuristic's first choice, or with
 * tuning on (KVD_CUDA_GEMM=tune in the environment, or
 * kvd_cuda_gemm_set_tune(1)) the fastest of the heuristic's first eight,
 * timed at the shape's first product on its own operands and kept for the
 * process (per device). The choice rests on timings, so two processes may
 * choose differently where two algorithms run alike, and their FP32 sums
 * then differ in order; within one process a shape keeps its algorithm.
 * kvd_cuda_gemm_set_tune(-1) goes back to the environment's setting. */
void kvd_cuda_gemm_set_tune(int on);
/* The shapes tuned so far on the current device. */
int kvd_cuda_gemm_tuned(void);
/* 1 where tuning is on (the environment's setting or set_tune's), else 0:
 * what a results file records, since it changes the last bits. */
int kvd_cuda_gemm_tuning(void);
/* Tuning's choice among n candidates timed ms[i] each (<= 0: it failed):
 * the first that ran, displaced by a later one only when at least 5%
 * faster than the one kept, so that near-ties keep the heuristic's order.
 * -1 when none ran. */
int kvd_cuda_gemm_pick(const float *ms, int n);

/* The layer building blocks, twins of the CPU functions named, host memory
 * in and out (0 on success):
 *   kvd_cuda_rmsnorm   kvd_rmsnorm over rows of n values
 *   kvd_cuda_rope      kvd_rope on heads of `stride` floats, position per row
 *   kvd_cuda_swiglu    kvd_swiglu
 *   kvd_cuda_kv_write  kvd_kvcache_write's quantize-on-write for one layer
 *                      and K or V: token t to physical slot[t] (block *
 *                      block_size + offset) of pool, counters added to st,
 *                      per-head absmax raised
 *   kvd_cuda_gdn_step  kvd_gdn_step for `heads` heads at once (g, beta per head)
 *   kvd_cuda_gdn_chunked  kvd_gdn_chunked for `heads` heads of n tokens each,
 *                      head-major: q, k [heads][n][dk], v, o [heads][n][dv],
 *                      g, beta [heads][n], S [heads][dk][dv]
 *   kvd_cuda_route     kvd_route over rows of E router logits
 *   kvd_cuda_argmax    kvd_argmax over rows of n logits */
int kvd_cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int n, float eps,
                     int one_plus);
int kvd_cuda_rope(float *v, int rows, int heads, int stride, const int *pos, int rot_dim,
                  const float *inv_freq);
int kvd_cuda_swiglu(float *g, const float *u, size_t n);
int kvd_cuda_kv_write(kvd_fmt fmt, int saturate, int block_size, int kv_heads, int head_dim,
                      void *pool, size_t pool_bytes, int n_tok, const int32_t *slot, const float *x,
                      const float *scale, kvd_qstats *st, float *absmax);
int kvd_cuda_gdn_step(float *S, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, float *o, int heads, int dk, int dv);
int kvd_cuda_gdn_chunked(float *S, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, float *o, int heads, int n, int dk, int dv);
int kvd_cuda_route(const float *logits, int rows, int E, int K, int norm, int *topi, float *topw);
int kvd_cuda_argmax(const float *x, int rows, int n, int *out);

/* ---- device memory and device-pointer operations (the device model) ----
 * Allocation is zeroed; the operations are launched on the default stream
 * and return at once; kvd_cuda_sync waits and reports the first error.
 * The model's weights: matrices in BF16, vectors in FP32. */
void *kvd_cuda_alloc(size_t n);
void kvd_cuda_free(void *p);
/* the current device's memory in use, in bytes (its total less what is
 * free), or -1 where the device cannot say */
int kvd_cuda_mem_in_use(size_t *bytes);
int kvd_cuda_upload(void *dst, const void *src, size_t n);
int kvd_cuda_download(void *dst, const void *src, size_t n);
int kvd_cuda_copy(void *dst, const void *src, size_t n);
int kvd_cuda_zero(void *p, size_t n);
int kvd_cuda_sync(char *err, int len);
/* A step's uploads without a wait each: kvd_cuda_stage_begin drains the
 * current device's queue (the last step's copies are done) and empties its
 * page-locked arena (8 MB, made on first use); kvd_cuda_stage_upload copies
 * src into the arena at once and queues the copy to dst behind the work
 * already queued (a plain upload where the arena is full or missing). 0, or
 * -1. */
int kvd_cuda_stage_begin(void);
int kvd_cuda_stage_upload(void *dst, const void *src, size_t n);

/* decode (one query) and prefill (n_q causal rows) attention; the view's
 * pools and scales and the block table on the device; decode's scratch holds
 * kvd_cuda_attn_scratch_floats(n_ctx, ...) floats. Decode runs version 3
 * where it can, else 2; KVD_CUDA_DECODE=2 in the environment keeps it on 2,
 * and KVD_CUDA_PREFILL=1 keeps prefill on version 1 (diagnostics: the GPU
 * check compares the versions on the whole model). FP8 weights (p_fp8):
 * these and the batch and rows entry points below round them on the
 * tensor cores in two passes, their row maxima (n_heads floats a query) at
 * the scratch's end; where versions 3 / 2 cannot run they return -1 and
 * kvd_cuda_attn_fp8_dev is the caller's fallback. */
size_t kvd_cuda_attn_scratch_floats(int max_ctx, int n_heads, int head_dim);
/* Version 3 decode on the current device: the CTAs it runs in one wave
 * (every one resident at once) for a cache of this format and head_dim,
 * and the positions a split takes for n entries of up to max_ctx positions
 * with kv_heads KV heads (before any lengthening for a short scratch): the
 * fewest, 128 times a power of two, whose n * kv_heads * splits CTAs fit
 * that wave. 0 where version 3 cannot run the format and head_dim. */
int kvd_cuda_attn_wave(int fmt, int head_dim);
int kvd_cuda_attn_split_len(int fmt, int head_dim, int kv_heads, int n, int max_ctx);
int kvd_cuda_attn_decode_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                             const float *q, int n_heads, float sm_scale, float *out,
                             float *scratch);
/* Decode for every one-token entry of a step at once (version 3): entry z
 * (z < n) is row row0[z] at position pos[row0[z]] of sequence seqs[z],
 * whose block table is btab + seqs[z] * btab_stride; q and out rows of
 * n_heads * head_dim; entries of several tokens are left alone. All
 * pointers on the device; max_ctx bounds the entries' contexts; scratch
 * holds scratch_floats. -1 where version 3 cannot take the shape, or
 * KVD_CUDA_DECODE=2: then decode entry by entry. */
int kvd_cuda_attn_decode_batch_dev(const kvd_kv_view *dv, const int32_t *btab, int btab_stride,
                                   const int *seqs, const int *row0, const int *ntok,
                                   const int *pos, int n, int max_ctx, const float *q, int n_heads,
                                   float sm_scale, float *out, float *scratch,
                                   size_t scratch_floats);
/* Decode for n listed query rows of one sequence (block table blocks), the
 * drift figures' sampled rows: row k's query at q + qrow[k] * q_stride over
 * n_ctx[k] positions, its output at out + k * out_stride; qrow and n_ctx on
 * the device, max_ctx their largest context. One launch (version 3) whose
 * rows read each K and V row from HBM about once between them. -1, nothing
 * queued, where version 3 cannot take the shape or the scratch, or
 * KVD_CUDA_DECODE=2: then decode row by row. */
int kvd_cuda_attn_decode_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                  const int *qrow, const int *n_ctx, int max_ctx, const float *q,
                                  size_t q_stride, int n_heads, float sm_scale, float *out,
                                  size_t out_stride, float *scratch, size_t scratch_floats);
int kvd_cuda_attn_probs_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx, const float *q,
                            int n_heads, float sm_scale, float *probs);
/* the same with every pointer on the device */
int kvd_cuda_attn_compare_dev(const float *p, const float *q, int n_heads, int n_ctx, double *kl,
                              int *top_p, int *top_q);
int kvd_cuda_hidden_compare_dev(const float *a, const float *x, int rows, int n,
                                kvd_hidden_cmp *out);
int kvd_cuda_logits_compare_dev(const float *a, const float *x, int rows, int V, const int *target,
                                kvd_logit_cmp *out);
/* The distributions of n query rows of one sequence (block table blocks),
 * row k's query at q + qrow[k] * q_stride and its context n_ctx[k]
 * positions: probs [n][n_heads][stride], stride >= every n_ctx; qrow and
 * n_ctx on the device, max_ctx their largest context. Row by row what
 * kvd_cuda_attn_probs_dev gives, the K rows read once for all rows. And
 * kvd_cuda_attn_compare_dev over those rows' distributions (n_ctx[k] of
 * row k's), row k's figures at kl, top_p, top_q + k * out_stride. */
int kvd_cuda_attn_probs_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                 const int *qrow, const int *n_ctx, int max_ctx, const float *q,
                                 size_t q_stride, int n_heads, float sm_scale, float *probs,
                                 size_t stride);
int kvd_cuda_attn_compare_rows_dev(const float *p, const float *q, int n_heads, int n,
                                   const int *n_ctx, size_t stride, double *kl, int *top_p,
                                   int *top_q, size_t out_stride);
/* FP8 attention (kvd_kv_view's q_scale and p_fp8, FlashAttention 3's rule;
 * the twin of kvd_attn_paged's). The attention kernels take the query as
 * given: kvd_cuda_attn_fp8_query_dev writes rows of n_heads * head_dim values
 * (stride floats apart) as E4M3 with q_scale[head] and reads them back into
 * out (may be q). kvd_cuda_attn_fp8_dev is one query row over n_ctx
 * positions through the plain kernels, its weights rounded to E4M3 where
 * the view has p_fp8; scratch holds n_heads * n_ctx floats. Device
 * pointers; kvd_cuda_attn_fp8 takes a host view (its q_scale too), host q
 * and out (the tests'). */
int kvd_cuda_attn_fp8_query_dev(const float *q, float *out, int rows, size_t stride, int n_heads,
                                int head_dim, const float *q_scale);
int kvd_cuda_attn_fp8_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx, const float *q,
                          int n_heads, float sm_scale, float *out, float *scratch);
int kvd_cuda_attn_fp8(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks, int n_ctx,
                      const float *q, int n_heads, float sm_scale, float *out);
/* scratch (may be null) lets a short chunk split its context: n_q * splits
 * * n_heads * (head_dim + 2) floats for that many splits; FP8 weights need
 * n_q * n_heads floats more for the rows' maxima, and a scratch */
int kvd_cuda_attn_prefill_dev(const kvd_kv_view *dv, const int32_t *blocks, int pos0, int n_q,
                              const float *q, int n_heads, float sm_scale, float *out,
                              float *scratch, size_t scratch_floats);

/* the model's glue, as runners/model.c does it on the CPU (model_ops.cu):
 * y = x W^T with FP32 x and BF16 W; embedding rows; RMSNorm over strided
 * rows; RoPE; the query half of [query | gate]; the output gate; x += y;
 * SwiGLU; DeltaNet's un-grouping, conv1d + SiLU (per batch sequence), q/k
 * L2 norm, recurrence (per batch sequence and value head) and gated norm;
 * MoE gather / weighted scatter and the shared expert's gated add; the first
 * non-finite value. The per-layer blocks among them (RMSNorm, RoPE, SwiGLU,
 * the cache write, routing) are layers.cu's kernels, held to their twins. */
/* kvd_cudaop_linear runs more than 16 rows on BF16 tensor cores through
 * cuBLASLt with x split exactly into three BF16 parts
 * (kvd_cuda_linear_split_dev); up to 16 rows, where that fails, or with
 * KVD_CUDA_LINEAR=fp32, on FP32 cores (kvd_cudaop_linear_fp32): 64 x 64
 * tiles from KVD_LINEAR_TILED_ROWS rows on (prefill), one warp per column
 * below it (decode) and a tile of 1, 2, 4, 8 or 16 rows, the fewest that
 * hold M (every tile gives the same bits) */
#define KVD_LINEAR_TILED_ROWS 64
void kvd_cudaop_linear(const float *x, const void *w, float *y, int M, int N, int K);
void kvd_cudaop_linear_fp32(const float *x, const void *w, float *y, int M, int N, int K);
/* Several projections of one input: outs[j].y[M, N_j] = x[M, K] W_j[N_j, K]^T
 * for j < n (at most KVD_LINEAR_OUTS). Up to 8 rows in one launch of
 * kvd_cudaop_linear's per-column kernel over all the outputs' columns (each
 * column's arithmetic unchanged, so each output's bits are those of its own
 * kvd_cudaop_linear); past 8 rows each through kvd_cudaop_linear. */
#define KVD_LINEAR_OUTS 4
typedef struct {
    const void *w; /* BF16 [N][K] */
    float *y;      /* [M][N] */
    int N;
} kvd_lin_out;
void kvd_cudaop_linear_multi(const float *x, int M, int K, const kvd_lin_out *outs, int n);
/* y[M,N] = x[M,K] W[N,K]^T for FP32 x and BF16 W on tensor cores: x as
 * hi + mid + lo BF16 parts (exact), three products summed in FP32 (stacked
 * into one product of 3M rows while the outputs fit 256 MB, so a decode step
 * reads the weights once; else three products accumulated into y). mode 0
 * chooses, 1 stacks, 2 accumulates (tests). Buffers per device, grown on
 * demand. 0 on success; asynchronous. */
int kvd_cuda_linear_split_dev(const float *x, const void *w, float *y, int M, int N, int K,
                              int mode);
void kvd_cudaop_embed(const void *E, const int32_t *tok, float *x, int rows, int H);
void kvd_cudaop_rmsnorm(float *out, size_t out_stride, const float *x, size_t x_stride,
                        const float *w, int rows, int n, float eps, int one_plus);
void kvd_cudaop_rope(float *v, int rows, int heads, int stride, const int *pos, int rot_dim,
                     const float *inv_freq);
/* the attention layer's query heads (row r's head h at q + (r nh + h)
 * q_stride) and key heads (k, [rows][kvh][hd]) normed (1 + q_norm, 1 +
 * k_norm) and rotated (rot_dim of hd, at pos[r]) in place, one launch: bit
 * for bit kvd_cudaop_rmsnorm (one_plus) then kvd_cudaop_rope on each */
void kvd_cudaop_qk_norm_rope(float *q, int q_stride, float *k, const float *q_norm,
                             const float *k_norm, int rows, int nh, int kvh, int hd, float eps,
                             const int *pos, int rot_dim, const float *inv_freq);
void kvd_cudaop_split_query(const float *qg, float *qh, int rows, int nh, int hd);
void kvd_cudaop_output_gate(float *att, const float *qg, int rows, int nh, int hd);
/* the residual stream's add, check and next norm in one launch: x[rows][n]
 * += y; the first non-finite value of y (check_sum 0) or of the sum
 * (check_sum 1) into *first as a flat index (atomic minimum); then, unless
 * w is NULL, out[rows][n] = RMSNorm(x) as kvd_cudaop_rmsnorm computes it */
void kvd_cudaop_add_norm(float *x, const float *y, int rows, int n, unsigned long long *first,
                         int check_sum, float *out, const float *w, float eps, int one_plus);
void kvd_cudaop_swiglu(float *g, const float *u, size_t n);
/* int4-token's rotations of rows of heads vectors of hd values, the twin
 * of kvd_rht_rows (fp8.h): forward (the query) or inverse (the output) */
void kvd_cudaop_rht(const float *src, float *dst, int rows, size_t src_stride, size_t dst_stride,
                    int heads, int hd, int inverse);
void kvd_cudaop_kv_write(kvd_fmt fmt, int saturate, int block_size, int kv_heads, int head_dim,
                         void *pool, int n_tok, const int32_t *slot, const float *x,
                         const float *scale, unsigned long long *stats, unsigned int *absmax);
/* the running absmax (float bits, atomically) of rows of heads x head_dim
 * values, per head: the queries calibration notes (kvd_kvcache_note_queries) */
void kvd_cudaop_absmax_heads(const float *x, int rows, int heads, int head_dim,
                             unsigned int *absmax);
void kvd_cudaop_ungroup(const float *qkvz, const float *ba, const float *A_log,
                        const float *dt_bias, float *conv, float *z, float *beta, float *gdec,
                        int rows, int nk, int nv, int dk, int dv);
void kvd_cudaop_conv(float *conv, int cd, const float *w, int K, float *state_base,
                     size_t state_seq_stride, int n_seqs, const int *seqs, const int *row0,
                     const int *ntok);
void kvd_cudaop_l2norm(float *conv, int rows, int cd, int nk, int dk, float qscale);
void kvd_cudaop_gdn(const float *conv, const float *gdec, const float *beta, float *out, float *ssm,
                    size_t ssm_seq_stride, int n_seqs, const int *seqs, const int *row0,
                    const int *ntok, int nk, int nv, int dk, int dv);
/* kvd_cudaop_gdn holds each state column in registers where
 * kvd_cuda_gdn_regs(dk) (dk 32, 64 or 128), reading and writing S once a
 * launch; kvd_cudaop_gdn_columns always steps it in memory (the other
 * dk's path, and the tests' and benchmark's reference). Bit for bit alike. */
void kvd_cudaop_gdn_columns(const float *conv, const float *gdec, const float *beta, float *out,
                            float *ssm, size_t ssm_seq_stride, int n_seqs, const int *seqs,
                            const int *row0, const int *ntok, int nk, int nv, int dk, int dv);
int kvd_cuda_gdn_regs(int dk);
void kvd_cudaop_gated_norm(float *o, const float *z, const float *w, int rows, int nv, int dv,
                           float eps);
void kvd_cudaop_route(const float *logits, int rows, int E, int K, int norm, int *topi,
                      float *topw);
/* greedy sampling on the device: out[r] = the argmax of row r of x (rows
 * x n), the lowest index of a tie (kvd_cuda_argmax's kernel) */
void kvd_cudaop_argmax(const float *x, int rows, int n, int *out);
void kvd_cudaop_gather(const float *xn, const int *slots, int n, int K, float *gx, int H);
void kvd_cudaop_scatter(float *mix, const float *gy, const int *slots, const float *topw, int n,
                        int K, int H);
/* The MoE experts of one step in a launch each, by kvd_cudaop_linear_fp32's
 * one-warp-a-column arithmetic (so bit for bit the per-expert products
 * where every expert has at most 16 rows; more take further tiles, each
 * reading the weights again), over expert groups G on the
 * device: G[0] = ng, G[1 .. ng] the experts, G[ng + 1 .. 2 ng + 1] their
 * items' offsets. Group g multiplies items G[ng + 1 + g] .. G[ng + 2 + g] -
 * 1 by w_tab[G[1 + g]] (BF16 [N][K]; a device array of pointers); item i's
 * activations are x's row slots[i] / slot_div (slots null: row i), its
 * output y's row i. max_groups bounds ng (the launch's grid), max_rows a
 * group's items (the tile: 1, 2, 4, 8 or 16 rows). The weighted scatter
 * adds the groups' items to their rows (a block for 256 values of a row;
 * slots and topw as kvd_cudaop_scatter's) in the items' order: bit for bit
 * kvd_cudaop_scatter expert by expert. kvd_cudaop_expert_lists makes the
 * slots (expert e's items r K + j, row r's j-th choice, in (r, j) order,
 * experts in turn: as the host makes them) and G for experts e0 .. e1 - 1
 * from the routing's topi, on the device, one block. */
/* the most rows an expert may have for the model to group the experts: two
 * tiles (decode up to C = 32, where each row picks an expert at most once) */
#define KVD_GROUPED_ROWS 32
void kvd_cudaop_linear_grouped(const float *x, const int *slots, int slot_div,
                               const void *const *w_tab, const int *G, int max_groups, int max_rows,
                               float *y, int N, int K);
/* the experts' gate and up products and SwiGLU in one launch: g becomes
 * silu(x Wg^T) * (x Wu^T) for the groups' items (each item's expert's
 * weights from gate_tab and up_tab), bit for bit the gate and up products
 * (kvd_cudaop_linear_grouped) then kvd_cudaop_swiglu */
void kvd_cudaop_linear_grouped_swiglu(const float *x, const int *slots, int slot_div,
                                      const void *const *gate_tab, const void *const *up_tab,
                                      const int *G, int max_groups, int max_rows, float *g, int N,
                                      int K);
void kvd_cudaop_scatter_grouped(float *mix, const float *gy, const int *slots, const float *topw,
                                int K, const int *G, int rows, int H);
void kvd_cudaop_expert_lists(const int *topi, int rows, int K, int E, int e0, int e1, int *slots,
                             int *G);
void kvd_cudaop_add_gated(float *mix, const float *y, const float *gate, int rows, int H);
/* the shared expert's down projection and its gated add: mix[M, N] +=
 * sigmoid(gate[m]) * (x[M, K] W[N, K]^T)[m, n], bit for bit
 * kvd_cudaop_linear into y then kvd_cudaop_add_gated; up to 16 rows in one
 * launch (y untouched), past 16 those two (y their scratch) */
void kvd_cudaop_linear_add_gated(const float *x, const void *w, float *y, float *mix,
                                 const float *gate, int M, int N, int K);

/* ---- tensor parallelism: ranks are devices 0 .. n-1 of this process ----
 * kvd_cuda_set_device makes a rank's device current (allocations and
 * launches go to it). A communicator sums a float buffer over the ranks in
 * place (NCCL, opened at run time; one rank needs none). */
#define KVD_MAX_RANKS 16
typedef struct kvd_comm kvd_comm;
int kvd_cuda_set_device(int dev);
kvd_comm *kvd_cuda_comm_new(int n, char *err, int len);
void kvd_cuda_comm_free(kvd_comm *c);
/* bufs[r] on rank r's device, count floats each; enqueued after each
 * device's earlier work */
int kvd_cuda_allreduce_sum(kvd_comm *c, float *const *bufs, size_t count);

/* Device-to-device copy bandwidth (read + write bytes per second). */
double kvd_cuda_copy_bandwidth(size_t bytes, int reps);
/* Seconds per decode-attention query with the cache on the device (fmt is a
 * kvd_fmt; version as kvd_cuda_attn_decode_v; attn_fp8: the weights rounded
 * to E4M3, an E4M3 cache's FP8 attention), the L2 flushed before each rep;
 * 0 when it could not run. */
double kvd_cuda_bench_attn(int fmt, int n_ctx, int n_heads, int kv_heads, int head_dim, int reps,
                           int version, int attn_fp8);
/* The same for v3 with its split length (positions, a multiple of 32) and
 * stage count (2 to 4) given; 0 for either: as v3 chooses them. */
double kvd_cuda_bench_attn_v3(int fmt, int n_ctx, int n_heads, int kv_heads, int head_dim, int reps,
                              int per_split, int nstage);
/* Seconds per prefill chunk of n_q rows at positions pos0 .. pos0 + n_q - 1
 * (version as kvd_cuda_attn_prefill_v; attn_fp8 as above, where version 1
 * is the plain kernels row by row), the cache on the device; 0 when it
 * could not run. */
double kvd_cuda_bench_prefill(int fmt, int pos0, int n_q, int n_heads, int kv_heads, int head_dim,
                              int reps, int version, int attn_fp8);
/* Seconds for `rows` sampled rows whose contexts end every 16 positions up
 * to n_ctx: their distributions (outputs 0) or their decode outputs (1),
 * one row at a time (batched 0) or by the group launches (1); 0 when it
 * could not run. */
double kvd_cuda_bench_sampled_rows(int outputs, int fmt, int n_ctx, int n_heads, int kv_heads,
                                   int head_dim, int rows, int reps, int batched);
/* Every algorithm the heuristic offers for a shape (up to 32), each timed:
 * GFLOP/s of its first choice (the one the back end runs), of the one
 * KVD_CUDA_GEMM=tune picks (tuned on the spot) and of the fastest. */
int kvd_cuda_bench_gemm_algos(int M, int N, int K, int reps, double *first, double *best,
                              double *tuned, int *n_algos);

#ifdef __cplusplus
}
#endif
#endif
