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
static void attn_group(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                       int g, int head, float sm_scale, float *out, float *s) {
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
