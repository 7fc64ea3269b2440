/* kvdrift: attention over a paged KV cache on the CPU, reading BF16 or FP8
 * blocks and dequantizing in registers (scales folded into the logits and the
 * output, as the engines' kernels do). One query attends in parts that split
 * the context (flash-decoding): each part streams its blocks once, every KV
 * head of a block together, and the parts' partial softmaxes are merged. */
#include "../kernels.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KVD_AVX512 1
#endif

static inline size_t block_bytes(const kvd_kv_view *kv) {
    return (size_t)kv->kv_heads * (size_t)kv->block_size * (size_t)kv->head_dim *
           kvd_fmt_bytes(kv->fmt);
}

/* Start of head `head`'s rows in cache block number `blk` of a pool. */
static inline const uint8_t *head_base(const kvd_kv_view *kv, const void *pool, int32_t blk,
                                       int head) {
    size_t per_head = (size_t)kv->block_size * (size_t)kv->head_dim * kvd_fmt_bytes(kv->fmt);
    return (const uint8_t *)pool + (size_t)blk * block_bytes(kv) + (size_t)head * per_head;
}

/* Decode n stored values into floats, unscaled. */
static void decode_row(kvd_fmt fmt, const uint8_t *p, int n, float *out) {
    if (fmt == KVD_FMT_BF16) {
        kvd_dequant_bf16((const uint16_t *)p, out, (size_t)n);
    } else if (fmt == KVD_FMT_E4M3) {
        kvd_dequant_e4m3(p, out, (size_t)n, 1.0f);
    } else {
        kvd_dequant_e5m2(p, out, (size_t)n, 1.0f);
    }
}

void kvd_kv_row(const kvd_kv_view *kv, int which_v, const int32_t *blocks, int pos, int head,
                float *out) {
    int bs = kv->block_size;
    const uint8_t *p = head_base(kv, which_v ? kv->v : kv->k, blocks[pos / bs], head) +
                       (size_t)(pos % bs) * (size_t)kv->head_dim * kvd_fmt_bytes(kv->fmt);
    decode_row(kv->fmt, p, kv->head_dim, out);
    float s = which_v ? kv->v_scale[head] : kv->k_scale[head];
    for (int i = 0; i < kv->head_dim; i++) out[i] *= s;
}

/* ---- per-block kernels: G query heads against one KV head's block ----
 * scores: s[j * stride + t] = (q_j . k_t) * kmul for the nt rows at kp;
 * pv:     acc[j][:] += p[j * stride + t] * v_t for the nt rows at vp.
 * kmul and vmul fold in the softmax scale, the cache scale and any factor
 * the decoder leaves in its floats. */

static void scores_generic(const uint8_t *kp, int nt, const float *q, int G, int hd, kvd_fmt fmt,
                           float kmul, float *s, size_t stride) {
    size_t esz = kvd_fmt_bytes(fmt);
    float row[hd];
    for (int t = 0; t < nt; t++) {
        decode_row(fmt, kp + (size_t)t * hd * esz, hd, row);
        for (int j = 0; j < G; j++) {
            float dot = 0.0f;
            for (int d = 0; d < hd; d++) dot += q[(size_t)j * hd + d] * row[d];
            s[(size_t)j * stride + t] = dot * kmul;
        }
    }
}

static void pv_generic(const uint8_t *vp, int nt, const float *p, size_t stride, int G, int hd,
                       kvd_fmt fmt, float *acc) {
    size_t esz = kvd_fmt_bytes(fmt);
    float row[hd];
    for (int t = 0; t < nt; t++) {
        decode_row(fmt, vp + (size_t)t * hd * esz, hd, row);
        for (int j = 0; j < G; j++) {
            float pj = p[(size_t)j * stride + t];
            for (int d = 0; d < hd; d++) acc[(size_t)j * hd + d] += pj * row[d];
        }
    }
}

#ifdef KVD_AVX512
/* Sixteen stored values to sixteen floats. FP8 goes through the hardware
 * half-precision converter: an E5M2 code in the high byte of a 16-bit lane is
 * the FP16 of the same value; an E4M3 code there, shifted right one with the
 * sign copied and the copy cleared (s.0.eeee.mmm.0000000), is an FP16 of 2^-8
 * times its value, subnormals included (the 2^8 goes into kmul/vmul). E4M3's
 * NaN code would read as 480: patched when the cache can hold one (NOSAT). */
static inline __m512 load16(kvd_fmt fmt, int nan_codes, const uint8_t *p) {
    if (fmt == KVD_FMT_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    if (fmt == KVD_FMT_E5M2) return _mm512_cvtph_ps(b);
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(b, 1), _mm256_set1_epi16((short)0xbfff));
    __m512 f = _mm512_cvtph_ps(h);
    if (!nan_codes) return f;
    __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, _mm256_set1_epi16(0x7f00)),
                                            _mm256_set1_epi16(0x7f00));
    return nan ? _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(NAN)) : f;
}

/* exp(x) for x <= 0: 2^n * p(f), degree-6 polynomial on [-0.5, 0.5],
 * relative error below 2e-7; underflows cleanly to 0. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(y, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* G fixed at compile time, so the accumulators live in registers. */
#define KVD_DEFINE_BLOCK_KERNELS(G)                                                                \
    static void scores_g##G(const uint8_t *kp, int nt, const float *q, int hd, kvd_fmt fmt,        \
                            int nanc, float kmul, float *s, size_t stride) {                       \
        const size_t esz = kvd_fmt_bytes(fmt);                                                     \
        for (int t = 0; t < nt; t++) {                                                             \
            const uint8_t *row = kp + (size_t)t * hd * esz;                                        \
            __m512 acc[G];                                                                         \
            for (int j = 0; j < G; j++) acc[j] = _mm512_setzero_ps();                              \
            for (int c = 0; c < hd; c += 16) {                                                     \
                __m512 k16 = load16(fmt, nanc, row + (size_t)c * esz);                             \
                for (int j = 0; j < G; j++)                                                        \
                    acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * hd + c), k16, acc[j]);        \
            }                                                                                      \
            for (int j = 0; j < G; j++)                                                            \
                s[(size_t)j * stride + t] = _mm512_reduce_add_ps(acc[j]) * kmul;                   \
        }                                                                                          \
    }                                                                                              \
    static void pv_g##G(const uint8_t *vp, int nt, const float *p, size_t stride, int hd,          \
                        kvd_fmt fmt, int nanc, float *out) {                                       \
        const size_t esz = kvd_fmt_bytes(fmt);                                                     \
        for (int c = 0; c < hd; c += 16) {                                                         \
            __m512 acc[G];                                                                         \
            for (int j = 0; j < G; j++) acc[j] = _mm512_loadu_ps(out + j * hd + c);                \
            for (int t = 0; t < nt; t++) {                                                         \
                __m512 v16 = load16(fmt, nanc, vp + ((size_t)t * hd + (size_t)c) * esz);           \
                for (int j = 0; j < G; j++)                                                        \
                    acc[j] =                                                                       \
                        _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)j * stride + t]), v16, acc[j]);   \
            }                                                                                      \
            for (int j = 0; j < G; j++) _mm512_storeu_ps(out + j * hd + c, acc[j]);                \
        }                                                                                          \
    }
KVD_DEFINE_BLOCK_KERNELS(1)
KVD_DEFINE_BLOCK_KERNELS(2)
KVD_DEFINE_BLOCK_KERNELS(4)
KVD_DEFINE_BLOCK_KERNELS(8)
KVD_DEFINE_BLOCK_KERNELS(16)
#endif

/* The FP16 decoding trick leaves E4M3 values 2^-8 of their worth. */
static inline float fmt_unit(const kvd_kv_view *kv) {
#ifdef KVD_AVX512
    if (kv->head_dim % 16 == 0 && kv->fmt == KVD_FMT_E4M3) return 256.0f;
#endif
    (void)kv;
    return 1.0f;
}

static void scores_block(const kvd_kv_view *kv, const uint8_t *kp, int nt, const float *q, int G,
                         float kmul, float *s, size_t stride) {
#ifdef KVD_AVX512
    if (kv->head_dim % 16 == 0) {
        int hd = kv->head_dim, nc = kv->nan_codes;
        switch (G) {
        case 1:
            scores_g1(kp, nt, q, hd, kv->fmt, nc, kmul, s, stride);
            return;
        case 2:
            scores_g2(kp, nt, q, hd, kv->fmt, nc, kmul, s, stride);
            return;
        case 4:
            scores_g4(kp, nt, q, hd, kv->fmt, nc, kmul, s, stride);
            return;
        case 8:
            scores_g8(kp, nt, q, hd, kv->fmt, nc, kmul, s, stride);
            return;
        case 16:
            scores_g16(kp, nt, q, hd, kv->fmt, nc, kmul, s, stride);
            return;
        default:
            break;
        }
    }
#endif
    scores_generic(kp, nt, q, G, kv->head_dim, kv->fmt, kmul, s, stride);
}

static void pv_block(const kvd_kv_view *kv, const uint8_t *vp, int nt, const float *p,
                     size_t stride, int G, float *out) {
#ifdef KVD_AVX512
    if (kv->head_dim % 16 == 0) {
        int hd = kv->head_dim, nc = kv->nan_codes;
        switch (G) {
        case 1:
            pv_g1(vp, nt, p, stride, hd, kv->fmt, nc, out);
            return;
        case 2:
            pv_g2(vp, nt, p, stride, hd, kv->fmt, nc, out);
            return;
        case 4:
            pv_g4(vp, nt, p, stride, hd, kv->fmt, nc, out);
            return;
        case 8:
            pv_g8(vp, nt, p, stride, hd, kv->fmt, nc, out);
            return;
        case 16:
            pv_g16(vp, nt, p, stride, hd, kv->fmt, nc, out);
            return;
        default:
            break;
        }
    }
#endif
    pv_generic(vp, nt, p, stride, G, kv->head_dim, kv->fmt, out);
}

/* exp(x - m) in place over n values; returns their sum (double). */
static double exp_sum(float *x, int n, float m) {
    double sum = 0.0;
    int i = 0;
#ifdef KVD_AVX512
    __m512 vm = _mm512_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        __m512d d = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        sum += _mm512_reduce_add_pd(d);
    }
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    return sum;
}

/* At this compute density the hardware prefetcher does not run far enough
 * ahead of a block (and a scattered block table ends every stream), so each
 * KV head's pass over block b asks for its share of block b + 1: all of the
 * next block is in flight while this one is being worked on. */
static inline void prefetch(const void *p, size_t n) {
#ifdef KVD_AVX512
    for (size_t i = 0; i < n; i += 64) _mm_prefetch((const char *)p + i, _MM_HINT_T0);
#else
    (void)p, (void)n;
#endif
}

/* One part: blocks [b0, b1) of the context, all heads. s holds the scores
 * [n_heads][n_ctx] (this part's columns), out the unnormalised part output
 * [n_heads][head_dim], m and l the part's max and sum per query head. */
static void attn_part(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, int b0, int b1,
                      const float *q, int n_heads, float sm_scale, float *s, float *out, float *m,
                      double *l) {
    const int hd = kv->head_dim, bs = kv->block_size, kvh = kv->kv_heads, G = n_heads / kvh;
    const float unit = fmt_unit(kv);
    const int t_begin = b0 * bs, t_end = b1 * bs < n_ctx ? b1 * bs : n_ctx;
    for (int b = b0; b < b1; b++) {
        int t0 = b * bs, nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        const size_t share = block_bytes(kv) / (size_t)kvh;
        for (int h = 0; h < kvh; h++) {
            if (b + 1 < b1) prefetch(head_base(kv, kv->k, blocks[b + 1], h), share);
            scores_block(kv, head_base(kv, kv->k, blocks[b], h), nt, q + (size_t)h * G * hd, G,
                         sm_scale * kv->k_scale[h] * unit, s + (size_t)h * G * n_ctx + t0,
                         (size_t)n_ctx);
        }
    }
    for (int j = 0; j < n_heads; j++) {
        float *sj = s + (size_t)j * n_ctx + t_begin, mx = -INFINITY;
        for (int t = 0; t < t_end - t_begin; t++) mx = sj[t] > mx ? sj[t] : mx;
        m[j] = mx;
        l[j] = exp_sum(sj, t_end - t_begin, mx);
    }
    memset(out, 0, sizeof(float) * (size_t)n_heads * hd);
    for (int b = b0; b < b1; b++) {
        int t0 = b * bs, nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        const size_t share = block_bytes(kv) / (size_t)kvh;
        for (int h = 0; h < kvh; h++) {
            if (b + 1 < b1) prefetch(head_base(kv, kv->v, blocks[b + 1], h), share);
            pv_block(kv, head_base(kv, kv->v, blocks[b], h), nt, s + (size_t)h * G * n_ctx + t0,
                     (size_t)n_ctx, G, out + (size_t)h * G * hd);
        }
    }
}

size_t kvd_attn_work_bytes(int n_heads, int head_dim, int n_ctx, int n_parts) {
    size_t p = (size_t)(n_parts > 0 ? n_parts : 1), nh = (size_t)n_heads;
    return sizeof(float) * nh * (size_t)n_ctx /* scores */
           + p * nh * (sizeof(float) * (size_t)head_dim + sizeof(float) + sizeof(double)) + 64;
}

void kvd_attn_paged(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                    int n_heads, float sm_scale, float *out, float *probs, void *work,
                    int n_parts) {
    const int hd = kv->head_dim, bs = kv->block_size, kvh = kv->kv_heads, G = n_heads / kvh;
    const int nb = (n_ctx + bs - 1) / bs;
    if (n_parts < 1) n_parts = 1;
    if (n_parts > nb) n_parts = nb;
    double *l = work;
    float *m = (float *)(l + (size_t)n_parts * n_heads);
    float *pout = m + (size_t)n_parts * n_heads;
    float *s = probs ? probs : pout + (size_t)n_parts * n_heads * hd;
    int per = (nb + n_parts - 1) / n_parts;
    if (n_parts == 1) {
        attn_part(kv, blocks, n_ctx, 0, nb, q, n_heads, sm_scale, s, pout, m, l);
    } else {
#pragma omp parallel for schedule(static)
        for (int p = 0; p < n_parts; p++) {
            int b0 = p * per, b1 = b0 + per < nb ? b0 + per : nb;
            if (b0 < b1)
                attn_part(kv, blocks, n_ctx, b0, b1, q, n_heads, sm_scale, s,
                          pout + (size_t)p * n_heads * hd, m + (size_t)p * n_heads,
                          l + (size_t)p * n_heads);
        }
    }
    /* merge the parts: rescale each to the global max */
    for (int j = 0; j < n_heads; j++) {
        float M = -INFINITY;
        int used = 0;
        for (int p = 0; p < n_parts && p * per < nb; p++, used++)
            M = m[(size_t)p * n_heads + j] > M ? m[(size_t)p * n_heads + j] : M;
        double L = 0.0;
        float w[used];
        for (int p = 0; p < used; p++) {
            w[p] = expf(m[(size_t)p * n_heads + j] - M);
            L += w[p] * l[(size_t)p * n_heads + j];
        }
        float vmul = kv->v_scale[j / G] * fmt_unit(kv);
        float *o = out + (size_t)j * hd;
        for (int d = 0; d < hd; d++) {
            double acc = 0.0;
            for (int p = 0; p < used; p++)
                acc += (double)w[p] * pout[((size_t)p * n_heads + j) * hd + d];
            o[d] = (float)(acc / L) * vmul;
        }
        if (probs) {
            for (int p = 0; p < used; p++) {
                int t0 = p * per * bs, t1 = (p + 1) * per * bs < n_ctx ? (p + 1) * per * bs : n_ctx;
                float f = (float)(w[p] / L);
                for (int t = t0; t < t1; t++) probs[(size_t)j * n_ctx + t] *= f;
            }
        }
    }
}
