/* kvdrift: attention over a paged KV cache on the CPU, reading BF16 or FP8
 * blocks and dequantizing in registers (scales folded into the logits and the
 * output, as the engines' kernels do). */
#include "../kernels.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVD_SIMD 1
#endif

static inline const uint8_t *row_ptr(const kvd_kv_view *kv, const void *pool, const int32_t *blocks,
                                     int pos, int head) {
    int bs = kv->block_size;
    size_t blk = (size_t)blocks[pos / bs];
    size_t idx = ((blk * (size_t)kv->kv_heads + (size_t)head) * (size_t)bs + (size_t)(pos % bs)) *
                 (size_t)kv->head_dim;
    return (const uint8_t *)pool + idx * kvd_fmt_bytes(kv->fmt);
}

/* Decode head_dim stored values into floats, unscaled. */
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
    const uint8_t *p = row_ptr(kv, which_v ? kv->v : kv->k, blocks, pos, head);
    decode_row(kv->fmt, p, kv->head_dim, out);
    float s = which_v ? kv->v_scale[head] : kv->k_scale[head];
    for (int i = 0; i < kv->head_dim; i++) out[i] *= s;
}

#ifdef KVD_SIMD
/* Eight stored values to eight floats. FP8 goes through the hardware
 * half-precision converter: an E4M3 code shifted left by 7 is an FP16 whose
 * value is 2^-8 of the E4M3 value, subnormals included; an E5M2 code shifted
 * left by 8 is the FP16 of the same value. The 2^8 is folded into the scale.
 * E4M3's NaN code (S.1111.111) would read as 480: it is patched to NaN. */
static inline __m256 load8(kvd_fmt fmt, const uint8_t *p) {
    if (fmt == KVD_FMT_BF16) {
        __m128i h = _mm_loadu_si128((const __m128i *)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    if (fmt == KVD_FMT_E5M2) return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
    __m128i sign = _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8);
    __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(sign, _mm_slli_epi16(mag, 7));
    __m256 f = _mm256_cvtph_ps(h);
    __m128i nan16 = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
    if (_mm_movemask_epi8(nan16)) {
        __m256 m = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
        f = _mm256_blendv_ps(f, _mm256_set1_ps(NAN), m);
    }
    return f;
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

/* Extra factor the SIMD decoder leaves in its floats (see load8). */
static inline float fmt_unit(kvd_fmt fmt) {
#ifdef KVD_SIMD
    return fmt == KVD_FMT_E4M3 ? 256.0f : 1.0f;
#else
    (void)fmt;
    return 1.0f;
#endif
}

/* The query heads of one KV head: g heads, q and out are [g][head_dim],
 * s is [g][n_ctx] (scores in, probabilities out). */
static void attn_group_generic(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx,
                               const float *q, int g, int head, float sm_scale, float *out,
                               float *s) {
    const int hd = kv->head_dim;
    const kvd_fmt fmt = kv->fmt;
    const float kmul = sm_scale * kv->k_scale[head] * fmt_unit(fmt);
    const float vmul = kv->v_scale[head] * fmt_unit(fmt);
    const size_t esz = kvd_fmt_bytes(fmt);
    const int bs = kv->block_size;

    /* scores: one pass over the keys serves every query head of the group */
    for (int t0 = 0; t0 < n_ctx; t0 += bs) {
        const uint8_t *kp = row_ptr(kv, kv->k, blocks, t0, head);
        int nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        for (int t = 0; t < nt; t++, kp += (size_t)hd * esz) {
#ifdef KVD_SIMD
            if (g <= 8 && hd % 8 == 0) {
                __m256 acc[8];
                for (int j = 0; j < g; j++) acc[j] = _mm256_setzero_ps();
                for (int d = 0; d < hd; d += 8) {
                    __m256 kv8 = load8(fmt, kp + (size_t)d * esz);
                    for (int j = 0; j < g; j++)
                        acc[j] =
                            _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)j * hd + d), kv8, acc[j]);
                }
                for (int j = 0; j < g; j++) s[(size_t)j * n_ctx + t0 + t] = hsum8(acc[j]) * kmul;
                continue;
            }
#endif
            float row[hd];
            decode_row(fmt, kp, hd, row);
            for (int j = 0; j < g; j++) {
                const float *qj = q + (size_t)j * hd;
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot += qj[d] * row[d];
                s[(size_t)j * n_ctx + t0 + t] = dot * sm_scale * kv->k_scale[head];
            }
        }
    }
    for (int j = 0; j < g; j++) kvd_softmax(s + (size_t)j * n_ctx, n_ctx);

    /* output: probability-weighted sum of the values */
    memset(out, 0, sizeof(float) * (size_t)g * (size_t)hd);
    for (int t0 = 0; t0 < n_ctx; t0 += bs) {
        const uint8_t *vp = row_ptr(kv, kv->v, blocks, t0, head);
        int nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        for (int t = 0; t < nt; t++, vp += (size_t)hd * esz) {
#ifdef KVD_SIMD
            if (hd % 8 == 0) {
                for (int d = 0; d < hd; d += 8) {
                    __m256 v8 = load8(fmt, vp + (size_t)d * esz);
                    for (int j = 0; j < g; j++) {
                        float *oj = out + (size_t)j * hd + d;
                        __m256 p = _mm256_set1_ps(s[(size_t)j * n_ctx + t0 + t]);
                        _mm256_storeu_ps(oj, _mm256_fmadd_ps(p, v8, _mm256_loadu_ps(oj)));
                    }
                }
                continue;
            }
#endif
            float row[hd];
            decode_row(fmt, vp, hd, row);
            for (int j = 0; j < g; j++) {
                float p = s[(size_t)j * n_ctx + t0 + t];
                float *oj = out + (size_t)j * hd;
                for (int d = 0; d < hd; d++) oj[d] += p * row[d];
            }
        }
    }
    for (size_t i = 0; i < (size_t)g * (size_t)hd; i++) out[i] *= vmul;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KVD_AVX512 1
/* blocks ahead to prefetch: a block is 16 positions of one head, 4-8 KiB */
#define KVD_PF 2
/* Sixteen stored values to sixteen floats; see load8 for the FP8 trick. */
static inline __m512 load16(kvd_fmt fmt, int nan_codes, const uint8_t *p) {
    if (fmt == KVD_FMT_BF16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    __m256i b = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
    if (fmt == KVD_FMT_E5M2) return _mm512_cvtph_ps(b);
    /* the code in the high byte, shifted right one with the sign copied,
     * then the copied sign cleared: s.0.eeee.mmm.0000000, the FP16 */
    __m256i h = _mm256_and_si256(_mm256_srai_epi16(b, 1), _mm256_set1_epi16((short)0xbfff));
    __m512 f = _mm512_cvtph_ps(h);
    if (!nan_codes) return f; /* SATFINITE writes never produce a NaN code */
    __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, _mm256_set1_epi16(0x7f00)),
                                            _mm256_set1_epi16(0x7f00));
    return nan ? _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(NAN)) : f;
}

/* The next block of a head is elsewhere in the pool: ask for it early. */
static inline void prefetch_block(const kvd_kv_view *kv, const void *pool, const int32_t *blocks,
                                  int pos, int head) {
    const char *p = (const char *)row_ptr(kv, pool, blocks, pos, head);
    size_t n = (size_t)kv->block_size * (size_t)kv->head_dim * kvd_fmt_bytes(kv->fmt);
    for (size_t i = 0; i < n; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
}

/* exp(x) for x <= 0 (softmax arguments): 2^n * p(f), degree-6 polynomial on
 * [-0.5, 0.5], relative error below 2e-7; underflows cleanly to 0. */
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

static void softmax16(float *x, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
    float mx = _mm512_reduce_max_ps(m);
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    __m512 vm = _mm512_set1_ps(mx);
    double sum = 0.0;
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        /* the normaliser in double, 16 at a time */
        __m256 lo = _mm512_castps512_ps256(e), hi = _mm512_extractf32x8_ps(e, 1);
        __m512d s = _mm512_add_pd(_mm512_cvtps_pd(lo), _mm512_cvtps_pd(hi));
        sum += _mm512_reduce_add_pd(s);
    }
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
    for (i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= (float)(1.0 / sum);
}

/* One KV head and its G query heads with G fixed at compile time, so the
 * accumulators live in registers. Scores: one pass over the keys, G dot
 * products per key. Output: block by block, a 16-wide slice of every query
 * head's accumulator stays in registers while the block's values stream by. */
#define KVD_DEFINE_GROUP(G)                                                                        \
    static void attn_g##G(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q, \
                          int head, float kmul, float vmul, float *out, float *s) {                \
        const int hd = kv->head_dim, nch = hd / 16, bs = kv->block_size;                           \
        const kvd_fmt fmt = kv->fmt;                                                               \
        const int nanc = kv->nan_codes;                                                            \
        const size_t esz = kvd_fmt_bytes(fmt);                                                     \
        for (int t0 = 0; t0 < n_ctx; t0 += bs) {                                                   \
            const uint8_t *kp = row_ptr(kv, kv->k, blocks, t0, head);                              \
            if (t0 + KVD_PF * bs < n_ctx)                                                          \
                prefetch_block(kv, kv->k, blocks, t0 + KVD_PF * bs, head);                         \
            int nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;                                            \
            for (int t = 0; t < nt; t++, kp += (size_t)hd * esz) {                                 \
                __m512 acc[G];                                                                     \
                for (int j = 0; j < G; j++) acc[j] = _mm512_setzero_ps();                          \
                for (int c = 0; c < nch; c++) {                                                    \
                    __m512 k16 = load16(fmt, nanc, kp + (size_t)c * 16 * esz);                     \
                    for (int j = 0; j < G; j++)                                                    \
                        acc[j] =                                                                   \
                            _mm512_fmadd_ps(_mm512_loadu_ps(q + j * hd + c * 16), k16, acc[j]);    \
                }                                                                                  \
                for (int j = 0; j < G; j++)                                                        \
                    s[(size_t)j * n_ctx + t0 + t] = _mm512_reduce_add_ps(acc[j]) * kmul;           \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; j < G; j++) softmax16(s + (size_t)j * n_ctx, n_ctx);                       \
        memset(out, 0, sizeof(float) * G * (size_t)hd);                                            \
        for (int t0 = 0; t0 < n_ctx; t0 += bs) {                                                   \
            const uint8_t *vp = row_ptr(kv, kv->v, blocks, t0, head);                              \
            int nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;                                            \
            if (t0 + KVD_PF * bs < n_ctx)                                                          \
                prefetch_block(kv, kv->v, blocks, t0 + KVD_PF * bs, head);                         \
            for (int c = 0; c < nch; c++) {                                                        \
                __m512 acc[G];                                                                     \
                for (int j = 0; j < G; j++) acc[j] = _mm512_loadu_ps(out + j * hd + c * 16);       \
                for (int t = 0; t < nt; t++) {                                                     \
                    __m512 v16 = load16(fmt, nanc, vp + ((size_t)t * hd + (size_t)c * 16) * esz);  \
                    for (int j = 0; j < G; j++)                                                    \
                        acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(s[(size_t)j * n_ctx + t0 + t]),    \
                                                 v16, acc[j]);                                     \
                }                                                                                  \
                for (int j = 0; j < G; j++) _mm512_storeu_ps(out + j * hd + c * 16, acc[j]);       \
            }                                                                                      \
        }                                                                                          \
        __m512 vm = _mm512_set1_ps(vmul);                                                          \
        for (int i = 0; i < G * hd; i += 16)                                                       \
            _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(out + i), vm));                \
    }
KVD_DEFINE_GROUP(1)
KVD_DEFINE_GROUP(2)
KVD_DEFINE_GROUP(4)
KVD_DEFINE_GROUP(8)
KVD_DEFINE_GROUP(16)
#endif

static void attn_group(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                       int g, int head, float sm_scale, float *out, float *s) {
#ifdef KVD_AVX512
    if (kv->head_dim % 16 == 0) {
        float u = kv->fmt == KVD_FMT_E4M3 ? 256.0f : 1.0f; /* see load8 */
        float kmul = sm_scale * kv->k_scale[head] * u, vmul = kv->v_scale[head] * u;
        switch (g) {
        case 1:
            attn_g1(kv, blocks, n_ctx, q, head, kmul, vmul, out, s);
            return;
        case 2:
            attn_g2(kv, blocks, n_ctx, q, head, kmul, vmul, out, s);
            return;
        case 4:
            attn_g4(kv, blocks, n_ctx, q, head, kmul, vmul, out, s);
            return;
        case 8:
            attn_g8(kv, blocks, n_ctx, q, head, kmul, vmul, out, s);
            return;
        case 16:
            attn_g16(kv, blocks, n_ctx, q, head, kmul, vmul, out, s);
            return;
        default:
            break;
        }
    }
#endif
    attn_group_generic(kv, blocks, n_ctx, q, g, head, sm_scale, out, s);
}

void kvd_attn_paged(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                    int n_heads, float sm_scale, float *out, float *probs, float *work) {
    int g = n_heads / kv->kv_heads;
    float *s = probs ? probs : work;
    for (int h = 0; h < kv->kv_heads; h++) {
        size_t off = (size_t)h * (size_t)g;
        attn_group(kv, blocks, n_ctx, q + off * (size_t)kv->head_dim, g, h, sm_scale,
                   out + off * (size_t)kv->head_dim, s + off * (size_t)n_ctx);
    }
}

void kvd_attn_paged_group(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                          int g, int kv_head, float sm_scale, float *out, float *probs) {
    attn_group(kv, blocks, n_ctx, q, g, kv_head, sm_scale, out, probs);
}
