/* kvdrift: the device API of kernels/cuda/cuda_kernels.h that the device
 * model uses, emulated on the CPU: "device" memory is host memory and every
 * operation runs its CPU twin (or, for the glue, the same loop as model.c).
 * Linked with runners/model_cuda.c and tests/gpu/test_cuda_model.c it tests
 * the device model's own code (buffers, strides, batch staging, expert
 * lists, counters) on machines without a GPU; the kernels themselves are
 * held to their twins by test_cuda_parity on a GPU. */
#include <math.h>
#include <stdint.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_kernels.h"

int kvd_cuda_available(char *why, int len) {
    (void)why, (void)len;
    return 1;
}
/* the emulation's products are the CPU's: nothing to tune */
void kvd_cuda_gemm_set_tune(int on) {
    (void)on;
}
int kvd_cuda_gemm_tuned(void) {
    return 0;
}
/* one device's memory for every rank: the bytes the allocator gave */
static size_t in_use;
void *kvd_cuda_alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (p) in_use += malloc_usable_size(p);
    return p;
}
void kvd_cuda_free(void *p) {
    if (p) in_use -= malloc_usable_size(p);
    free(p);
}
int kvd_cuda_mem_in_use(size_t *bytes) {
    *bytes = in_use;
    return 0;
}
int kvd_cuda_upload(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
    return 0;
}
int kvd_cuda_download(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
    return 0;
}
int kvd_cuda_copy(void *dst, const void *src, size_t n) {
    memmove(dst, src, n);
    return 0;
}
int kvd_cuda_stage_begin(void) {
    return 0;
}
int kvd_cuda_stage_upload(void *dst, const void *src, size_t n) {
    memcpy(dst, src, n);
    return 0;
}
int kvd_cuda_zero(void *p, size_t n) {
    memset(p, 0, n);
    return 0;
}
/* ranks run one after another in host memory; the sum goes in rank order */
struct kvd_comm {
    int n;
};
int kvd_cuda_set_device(int dev) {
    (void)dev;
    return 0;
}
kvd_comm *kvd_cuda_comm_new(int n, char *err, int len) {
    (void)err, (void)len;
    kvd_comm *c = malloc(sizeof *c);
    if (c) c->n = n;
    return c;
}
void kvd_cuda_comm_free(kvd_comm *c) {
    free(c);
}
int kvd_cuda_allreduce_sum(kvd_comm *c, float *const *bufs, size_t count) {
    for (size_t i = 0; i < count; i++) {
        float s = 0;
        for (int r = 0; r < c->n; r++) s += bufs[r][i];
        for (int r = 0; r < c->n; r++) bufs[r][i] = s;
    }
    return 0;
}
int kvd_cuda_sync(char *err, int len) {
    (void)err, (void)len;
    return 0;
}
/* BF16 weights back to FP32 (exact) for the CPU model's GEMM: with its
 * AMX tiles where the CPU's GEMMs take them (kvd_weights_tiles), laid out
 * here on every call */
void kvd_cudaop_linear(const float *x, const void *w, float *y, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    float *wf = malloc(sizeof(float) * (size_t)N * K);
    kvd_dequant_bf16(w, wf, (size_t)N * K);
    kvd_wtiles *t = kvd_wtiles_new(wf, N, K);
    kvd_linear_tiled(x, wf, t, y, M, N, K);
    kvd_wtiles_free(t);
    free(wf);
}
void kvd_cudaop_linear_add_gated(const float *x, const void *w, float *y, float *mix,
                                 const float *gate, int M, int N, int K) {
    kvd_cudaop_linear(x, w, y, M, N, K);
    kvd_cudaop_add_gated(mix, y, gate, M, N);
}
void kvd_cudaop_linear_multi(const float *x, int M, int K, const kvd_lin_out *outs, int n) {
    for (int j = 0; j < n; j++) kvd_cudaop_linear(x, outs[j].w, outs[j].y, M, outs[j].N, K);
}
void kvd_cudaop_embed(const void *E, const int32_t *tok, float *x, int rows, int H) {
    for (int r = 0; r < rows; r++)
        kvd_dequant_bf16((const uint16_t *)E + (size_t)tok[r] * H, x + (size_t)r * H, (size_t)H);
}
void kvd_cudaop_rmsnorm(float *out, size_t out_stride, const float *x, size_t x_stride,
                        const float *w, int rows, int n, float eps, int one_plus) {
    for (int r = 0; r < rows; r++)
        kvd_rmsnorm(out + (size_t)r * out_stride, x + (size_t)r * x_stride, w, n, eps, one_plus);
}
void kvd_cudaop_rope(float *v, int rows, int heads, int stride, const int *pos, int rot_dim,
                     const float *inv_freq) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++)
            kvd_rope(v + ((size_t)r * heads + h) * stride, pos[r], rot_dim, inv_freq);
}
void kvd_cudaop_qk_norm_rope(float *q, int q_stride, float *k, const float *q_norm,
                             const float *k_norm, int rows, int nh, int kvh, int hd, float eps,
                             const int *pos, int rot_dim, const float *inv_freq) {
    kvd_cudaop_rmsnorm(q, (size_t)q_stride, q, (size_t)q_stride, q_norm, rows * nh, hd, eps, 1);
    kvd_cudaop_rope(q, rows, nh, q_stride, pos, rot_dim, inv_freq);
    kvd_cudaop_rmsnorm(k, (size_t)hd, k, (size_t)hd, k_norm, rows * kvh, hd, eps, 1);
    kvd_cudaop_rope(k, rows, kvh, hd, pos, rot_dim, inv_freq);
}
void kvd_cudaop_split_query(const float *qg, float *qh, int rows, int nh, int hd) {
    for (size_t rh = 0; rh < (size_t)rows * nh; rh++)
        memcpy(qh + rh * hd, qg + rh * 2 * hd, sizeof(float) * (size_t)hd);
}
void kvd_cudaop_output_gate(float *att, const float *qg, int rows, int nh, int hd) {
    for (size_t rh = 0; rh < (size_t)rows * nh; rh++)
        for (int d = 0; d < hd; d++) att[rh * hd + d] *= kvd_sigmoidf(qg[(rh * 2 + 1) * hd + d]);
}
void kvd_cudaop_add_norm(float *x, const float *y, int rows, int n, unsigned long long *first,
                         int check_sum, float *out, const float *w, float eps, int one_plus) {
    for (size_t i = 0; i < (size_t)rows * n; i++) {
        const float v = y[i], s = x[i] + v;
        if (!isfinite(check_sum ? s : v) && i < *first) *first = i;
        x[i] = s;
    }
    if (w)
        for (int r = 0; r < rows; r++)
            kvd_rmsnorm(out + (size_t)r * n, x + (size_t)r * n, w, n, eps, one_plus);
}
void kvd_cudaop_swiglu(float *g, const float *u, size_t n) {
    kvd_swiglu(g, u, n);
}
void kvd_cudaop_rht(const float *src, float *dst, int rows, size_t src_stride, size_t dst_stride,
                    int heads, int hd, int inverse) {
    kvd_rht_rows(src, dst, rows, src_stride, dst_stride, heads, hd, inverse);
}
/* one token at a time through the CPU quantizers, the counters as the
 * device keeps them */
void kvd_cudaop_kv_write(kvd_fmt fmt, int saturate, int block_size, int kv_heads, int head_dim,
                         void *pool, int n_tok, const int32_t *slot, const float *x,
                         const float *scale, unsigned long long *stats, unsigned int *absmax) {
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < kv_heads; h++) {
            int64_t blk = slot[t] / block_size, off = slot[t] % block_size;
            const size_t r = (size_t)(blk * kv_heads + h) * block_size + (size_t)off;
            const float *xr = x + ((size_t)t * kv_heads + h) * head_dim;
            for (int d = 0; d < head_dim; d++) {
                float a = fabsf(xr[d]);
                unsigned int bits;
                memcpy(&bits, &a, sizeof bits);
                if (bits > absmax[h]) absmax[h] = bits;
            }
            kvd_qstats st = {0};
            kvd_pool_quant_row(fmt, (uint8_t *)pool, block_size, head_dim, r, xr, scale[h],
                               saturate, &st);
            stats[0] += st.n, stats[1] += st.saturated, stats[2] += st.flushed;
            stats[3] += st.subnormal;
        }
}
void kvd_cudaop_ungroup(const float *qkvz, const float *ba, const float *A_log,
                        const float *dt_bias, float *conv, float *z, float *beta, float *gdec,
                        int rows, int nk, int nv, int dk, int dv) {
    const int r_ = nv / nk, kd = nk * dk, vd = nv * dv, cd = 2 * kd + vd, pw = 2 * kd + 2 * vd;
    for (int r = 0; r < rows; r++) {
        const float *p = qkvz + (size_t)r * pw, *pba = ba + (size_t)r * 2 * nv;
        float *mixd = conv + (size_t)r * cd, *zr = z + (size_t)r * vd;
        for (int h = 0; h < nk; h++) {
            const float *g = p + (size_t)h * (2 * dk + 2 * r_ * dv);
            memcpy(mixd + h * dk, g, sizeof(float) * (size_t)dk);
            memcpy(mixd + kd + h * dk, g + dk, sizeof(float) * (size_t)dk);
            memcpy(mixd + 2 * kd + h * r_ * dv, g + 2 * dk, sizeof(float) * (size_t)(r_ * dv));
            memcpy(zr + h * r_ * dv, g + 2 * dk + r_ * dv, sizeof(float) * (size_t)(r_ * dv));
            for (int j = 0; j < r_; j++) {
                int vh = h * r_ + j;
                float sp = pba[h * 2 * r_ + r_ + j] + dt_bias[vh];
                sp = sp > 20.0f ? sp : log1pf(expf(sp));
                beta[(size_t)r * nv + vh] = kvd_sigmoidf(pba[h * 2 * r_ + j]);
                gdec[(size_t)r * nv + vh] = -expf(A_log[vh]) * sp;
            }
        }
    }
}
void kvd_cudaop_conv(float *conv, int cd, const float *w, int K, float *state_base,
                     size_t state_seq_stride, int n_seqs, const int *seqs, const int *row0,
                     const int *ntok) {
    for (int s = 0; s < n_seqs; s++)
        for (int ch = 0; ch < cd; ch++) {
            float *hist = state_base + (size_t)seqs[s] * state_seq_stride + (size_t)ch * (K - 1);
            const float *wc = w + (size_t)ch * K;
            for (int t = 0; t < ntok[s]; t++) {
                float *x = conv + (size_t)(row0[s] + t) * cd + ch;
                float in = *x, acc = wc[K - 1] * in;
                for (int j = 0; j < K - 1; j++) acc += wc[j] * hist[j];
                for (int j = 0; j < K - 2; j++) hist[j] = hist[j + 1];
                if (K > 1) hist[K - 2] = in;
                *x = kvd_siluf(acc);
            }
        }
}
void kvd_cudaop_l2norm(float *conv, int rows, int cd, int nk, int dk, float qscale) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2 * nk; h++) {
            float *v = conv + (size_t)r * cd + (size_t)h * dk;
            double ss = 0.0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            float inv = (float)(1.0 / sqrt(ss + 1e-6));
            if (h < nk) inv *= qscale;
            for (int i = 0; i < dk; i++) v[i] *= inv;
        }
}
void kvd_cudaop_gdn(const float *conv, const float *gdec, const float *beta, float *out, float *ssm,
                    size_t ssm_seq_stride, int n_seqs, const int *seqs, const int *row0,
                    const int *ntok, int nk, int nv, int dk, int dv) {
    const int cd = 2 * nk * dk + nv * dv, kd = nk * dk, vd = nv * dv, r_ = nv / nk;
    for (int s = 0; s < n_seqs; s++)
        for (int vh = 0; vh < nv; vh++) {
            float *S = ssm + (size_t)seqs[s] * ssm_seq_stride + (size_t)vh * dk * dv;
            for (int t = 0; t < ntok[s]; t++) {
                size_t r = (size_t)(row0[s] + t);
                const float *x = conv + r * cd;
                kvd_gdn_step(S, x + (vh / r_) * dk, x + kd + (vh / r_) * dk, x + 2 * kd + vh * dv,
                             gdec[r * nv + vh], beta[r * nv + vh], out + r * vd + vh * dv, dk, dv);
            }
        }
}
void kvd_cudaop_gated_norm(float *o, const float *z, const float *w, int rows, int nv, int dv,
                           float eps) {
    for (size_t rv = 0; rv < (size_t)rows * nv; rv++) {
        kvd_rmsnorm(o + rv * dv, o + rv * dv, w, dv, eps, 0);
        for (int d = 0; d < dv; d++) o[rv * dv + d] *= kvd_siluf(z[rv * dv + d]);
    }
}
void kvd_cudaop_route(const float *logits, int rows, int E, int K, int norm, int *topi,
                      float *topw) {
    float *p = malloc(sizeof(float) * (size_t)E);
    for (int r = 0; r < rows; r++) {
        memcpy(p, logits + (size_t)r * E, sizeof(float) * (size_t)E);
        kvd_route(p, E, K, norm, topi + (size_t)r * K, topw + (size_t)r * K);
    }
    free(p);
}
void kvd_cudaop_gather(const float *xn, const int *slots, int n, int K, float *gx, int H) {
    for (int i = 0; i < n; i++)
        memcpy(gx + (size_t)i * H, xn + (size_t)(slots[i] / K) * H, sizeof(float) * (size_t)H);
}
void kvd_cudaop_scatter(float *mix, const float *gy, const int *slots, const float *topw, int n,
                        int K, int H) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < H; d++)
            mix[(size_t)(slots[i] / K) * H + d] += topw[slots[i]] * gy[(size_t)i * H + d];
}
/* as the per-expert launches: each group's rows gathered, then its product */
void kvd_cudaop_linear_grouped(const float *x, const int *slots, int slot_div,
                               const void *const *w_tab, const int *G, int max_groups, int max_rows,
                               float *y, int N, int K) {
    (void)max_rows;
    const int ng = G[0] < max_groups ? G[0] : max_groups;
    for (int g = 0; g < ng; g++) {
        const int i0 = G[1 + G[0] + g], rows = G[2 + G[0] + g] - i0;
        float *xg = malloc(sizeof(float) * (size_t)(rows > 0 ? rows : 1) * K);
        for (int i = 0; i < rows; i++) {
            const size_t r = slots ? (size_t)(slots[i0 + i] / slot_div) : (size_t)(i0 + i);
            memcpy(xg + (size_t)i * K, x + r * K, sizeof(float) * (size_t)K);
        }
        kvd_cudaop_linear(xg, w_tab[G[1 + g]], y + (size_t)i0 * N, rows, N, K);
        free(xg);
    }
}
void kvd_cudaop_linear_grouped_swiglu(const float *x, const int *slots, int slot_div,
                                      const void *const *gate_tab, const void *const *up_tab,
                                      const int *G, int max_groups, int max_rows, float *g, int N,
                                      int K) {
    const int ng = G[0] < max_groups ? G[0] : max_groups;
    if (ng <= 0) return;
    const int lo = G[1 + G[0]], hi = G[1 + G[0] + ng];
    float *u = malloc(sizeof(float) * (size_t)hi * N + 1);
    kvd_cudaop_linear_grouped(x, slots, slot_div, gate_tab, G, max_groups, max_rows, g, N, K);
    kvd_cudaop_linear_grouped(x, slots, slot_div, up_tab, G, max_groups, max_rows, u, N, K);
    kvd_swiglu(g + (size_t)lo * N, u + (size_t)lo * N, (size_t)(hi - lo) * N);
    free(u);
}
void kvd_cudaop_scatter_grouped(float *mix, const float *gy, const int *slots, const float *topw,
                                int K, const int *G, int rows, int H) {
    (void)rows;
    const int lo = G[1 + G[0]], hi = G[1 + 2 * G[0]];
    kvd_cudaop_scatter(mix, gy + (size_t)lo * H, slots + lo, topw, hi - lo, K, H);
}
void kvd_cudaop_expert_lists(const int *topi, int rows, int K, int E, int e0, int e1, int *slots,
                             int *G) {
    int n = 0, ng = 0, off[E + 1];
    for (int e = 0; e < E; e++) {
        off[e] = n;
        for (int i = 0; i < rows * K; i++)
            if (topi[i] == e) slots[n++] = i;
    }
    off[E] = n;
    for (int e = e0; e < e1; e++)
        if (off[e + 1] > off[e]) G[1 + ng++] = e;
    G[0] = ng;
    for (int g = 0; g < ng; g++) G[1 + ng + g] = off[G[1 + g]];
    G[1 + 2 * ng] = off[e1];
}
void kvd_cudaop_argmax(const float *x, int rows, int n, int *out) {
    for (int r = 0; r < rows; r++) out[r] = kvd_argmax(x + (size_t)r * n, n);
}
void kvd_cudaop_add_gated(float *mix, const float *y, const float *gate, int rows, int H) {
    for (size_t i = 0; i < (size_t)rows * H; i++) mix[i] += kvd_sigmoidf(gate[i / H]) * y[i];
}
size_t kvd_cuda_attn_scratch_floats(int max_ctx, int n_heads, int head_dim) {
    return kvd_attn_work_bytes(n_heads, head_dim, max_ctx, 32) / sizeof(float) + 16;
}
/* The device's attention kernels take the query as given (FP8 attention's
 * is rounded by kvd_cuda_attn_fp8_query_dev before them) and round FP8
 * weights where the view has p_fp8. */
static kvd_kv_view as_given(const kvd_kv_view *dv) {
    kvd_kv_view v = *dv;
    v.q_scale = NULL;
    return v;
}
int kvd_cuda_attn_decode_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                             const float *q, int n_heads, float sm_scale, float *out,
                             float *scratch) {
    const kvd_kv_view v = as_given(dv);
    kvd_attn_paged_rotated(&v, blocks, n_ctx, q, n_heads, sm_scale, out, NULL, scratch,
                           kvd_attn_parts(n_ctx, dv->block_size));
    return 0;
}
int kvd_cuda_attn_fp8_query_dev(const float *q, float *out, int rows, size_t stride, int n_heads,
                                int head_dim, const float *q_scale) {
    kvd_fp8_query(q, out, rows, stride, n_heads, head_dim, q_scale);
    return 0;
}
int kvd_cuda_attn_fp8_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx, const float *q,
                          int n_heads, float sm_scale, float *out, float *scratch) {
    const kvd_kv_view v = as_given(dv);
    kvd_attn_paged_rotated(&v, blocks, n_ctx, q, n_heads, sm_scale, out, NULL, scratch,
                           kvd_attn_parts(n_ctx, dv->block_size));
    return 0;
}
void kvd_cudaop_absmax_heads(const float *x, int rows, int heads, int head_dim,
                             unsigned int *absmax) {
    float am[heads]; /* the device keeps float bits */
    memcpy(am, absmax, sizeof am);
    kvd_absmax_heads(x, rows, (size_t)heads * head_dim, (size_t)head_dim, heads, head_dim, am);
    memcpy(absmax, am, sizeof am);
}
int kvd_cuda_attn_decode_batch_dev(const kvd_kv_view *dv, const int32_t *btab, int btab_stride,
                                   const int *seqs, const int *row0, const int *ntok,
                                   const int *pos, int n, int max_ctx, const float *q, int n_heads,
                                   float sm_scale, float *out, float *scratch,
                                   size_t scratch_floats) {
    (void)max_ctx, (void)scratch_floats;
    const size_t stride = (size_t)n_heads * dv->head_dim;
    const kvd_kv_view v = as_given(dv);
    for (int z = 0; z < n; z++) {
        if (ntok[z] != 1) continue;
        const int r = row0[z], n_ctx = pos[r] + 1;
        kvd_attn_paged_rotated(&v, btab + (size_t)seqs[z] * btab_stride, n_ctx, q + r * stride,
                               n_heads, sm_scale, out + r * stride, NULL, scratch,
                               kvd_attn_parts(n_ctx, dv->block_size));
    }
    return 0;
}
int kvd_cuda_attn_decode_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                  const int *qrow, const int *n_ctx, int max_ctx, const float *q,
                                  size_t q_stride, int n_heads, float sm_scale, float *out,
                                  size_t out_stride, float *scratch, size_t scratch_floats) {
    (void)max_ctx, (void)scratch_floats;
    const kvd_kv_view v = as_given(dv);
    for (int k = 0; k < n; k++)
        kvd_attn_paged_rotated(&v, blocks, n_ctx[k], q + (size_t)qrow[k] * q_stride, n_heads,
                               sm_scale, out + (size_t)k * out_stride, NULL, scratch,
                               kvd_attn_parts(n_ctx[k], dv->block_size));
    return 0;
}
int kvd_cuda_attn_probs_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx, const float *q,
                            int n_heads, float sm_scale, float *probs) {
    int parts = kvd_attn_parts(n_ctx, dv->block_size);
    void *work = malloc(kvd_attn_work_bytes(n_heads, dv->head_dim, n_ctx, parts));
    float *out = malloc(sizeof(float) * (size_t)n_heads * dv->head_dim);
    const kvd_kv_view v = as_given(dv);
    kvd_attn_paged_rotated(&v, blocks, n_ctx, q, n_heads, sm_scale, out, probs, work, parts);
    free(work), free(out);
    return 0;
}
int kvd_cuda_attn_probs_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                 const int *qrow, const int *n_ctx, int max_ctx, const float *q,
                                 size_t q_stride, int n_heads, float sm_scale, float *probs,
                                 size_t stride) {
    (void)max_ctx;
    float *row = malloc(sizeof(float) * (size_t)n_heads * stride);
    for (int k = 0; k < n; k++) {
        kvd_cuda_attn_probs_dev(dv, blocks, n_ctx[k], q + (size_t)qrow[k] * q_stride, n_heads,
                                sm_scale, row);
        for (int h = 0; h < n_heads; h++)
            memcpy(probs + ((size_t)k * n_heads + h) * stride, row + (size_t)h * n_ctx[k],
                   sizeof(float) * (size_t)n_ctx[k]);
    }
    free(row);
    return 0;
}
int kvd_cuda_attn_compare_rows_dev(const float *p, const float *q, int n_heads, int n,
                                   const int *n_ctx, size_t stride, double *kl, int *top_p,
                                   int *top_q, size_t out_stride) {
    for (int k = 0; k < n; k++)
        for (int h = 0; h < n_heads; h++) {
            const size_t off = ((size_t)k * n_heads + h) * stride, o = k * out_stride + h;
            kvd_attn_compare(p + off, q + off, 1, n_ctx[k], kl + o, top_p + o, top_q + o);
        }
    return 0;
}
int kvd_cuda_hidden_compare_dev(const float *a, const float *x, int rows, int n,
                                kvd_hidden_cmp *out) {
    kvd_hidden_compare(a, x, rows, n, out);
    return 0;
}
int kvd_cuda_logits_compare_dev(const float *a, const float *x, int rows, int V, const int *target,
                                kvd_logit_cmp *out) {
    for (int r = 0; r < rows; r++)
        out[r] =
            kvd_compare_logits(a + (size_t)r * V, x + (size_t)r * V, V, target ? target[r] : -1);
    return 0;
}
int kvd_cuda_attn_prefill_dev(const kvd_kv_view *dv, const int32_t *blocks, int pos0, int n_q,
                              const float *q, int n_heads, float sm_scale, float *out,
                              float *scratch, size_t scratch_floats) {
    (void)scratch, (void)scratch_floats;
    void *work = malloc(kvd_attn_work_bytes(n_heads, dv->head_dim, pos0 + n_q, 32));
    const kvd_kv_view v = as_given(dv);
    for (int r = 0; r < n_q; r++)
        kvd_attn_paged_rotated(&v, blocks, pos0 + r + 1, q + (size_t)r * n_heads * dv->head_dim,
                               n_heads, sm_scale, out + (size_t)r * n_heads * dv->head_dim, NULL,
                               work, kvd_attn_parts(pos0 + r + 1, dv->block_size));
    free(work);
    return 0;
}
