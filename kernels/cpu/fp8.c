/* kvdrift: scalar and vector FP8/BF16 codecs on the CPU.
 * Rounding follows CUDA's host conversions exactly; tests/oracle holds us to them. */
#include "../fp8.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static inline uint32_t f2u(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float u2f(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Round a non-negative float below 2^23 to the nearest integer, ties to even,
 * without depending on the current rounding mode's library call. */
static inline float rne_small(float y) {
    return (y + 8388608.0f) - 8388608.0f;
}

/* Encoders are written as selects over both paths so the vector loops below
 * compile to straight-line SIMD; the scalar entry points share them. */
static inline uint8_t enc_e4m3(float x, int saturate) {
    uint32_t b = f2u(x);
    uint32_t sign = (b >> 24) & 0x80u;
    uint32_t a = b & 0x7fffffffu;
    /* normal range (>= 2^-6): round the float mantissa to 3 bits, RNE */
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
    uint32_t normal = (r >> 20) - (120u << 3);
    /* subnormal range: multiples of 2^-9; 8 lands exactly on the smallest normal */
    uint32_t sub = (uint32_t)rne_small(u2f(a < 0x3c800000u ? a : 0u) * 512.0f);
    uint32_t mag = a >= 0x3c800000u ? normal : sub;
    uint32_t over = saturate ? 0x7eu : 0x7fu;
    mag = a > 0x43e80000u ? over : mag; /* beyond 464 = 448 + half an ulp, Inf too */
    uint32_t res = sign | mag;
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : res); /* NaN: canonical, sign dropped */
}

static inline uint8_t enc_e5m2(float x, int saturate) {
    uint32_t b = f2u(x);
    uint32_t sign = (b >> 24) & 0x80u;
    uint32_t a = b & 0x7fffffffu;
    uint32_t r = a + 0xfffffu + ((a >> 21) & 1u);
    uint32_t normal = (r >> 21) - (112u << 2);
    uint32_t sub = (uint32_t)rne_small(u2f(a < 0x38800000u ? a : 0u) * 65536.0f);
    uint32_t mag = a >= 0x38800000u ? normal : sub;
    uint32_t over = saturate ? 0x7bu : 0x7cu;
    mag = a >= 0x47700000u ? over : mag; /* from 61440 = 57344 + half an ulp */
    uint32_t res = sign | mag;
    return (uint8_t)(a > 0x7f800000u ? 0x7fu : res);
}

static inline uint16_t enc_bf16(float x) {
    uint32_t b = f2u(x);
    uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
    return (uint16_t)((b & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

uint8_t kvd_f32_to_e4m3(float x, int saturate) {
    return enc_e4m3(x, saturate);
}
uint8_t kvd_f32_to_e5m2(float x, int saturate) {
    return enc_e5m2(x, saturate);
}
uint16_t kvd_f32_to_bf16(float x) {
    return enc_bf16(x);
}
float kvd_bf16_to_f32(uint16_t v) {
    return u2f((uint32_t)v << 16);
}

static float e4m3_tab[256], e5m2_tab[256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static float dec_e4m3(unsigned c) {
    unsigned e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if (e == 15u && m == 7u) return NAN;
    v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8u + m), (int)e - 10);
    return (c & 0x80u) ? -v : v;
}

static float dec_e5m2(unsigned c) {
    unsigned e = (c >> 2) & 31u, m = c & 3u;
    float v;
    if (e == 31u) {
        if (m != 0) return NAN;
        v = INFINITY;
    } else {
        v = e == 0 ? ldexpf((float)m, -16) : ldexpf((float)(4u + m), (int)e - 17);
    }
    return (c & 0x80u) ? -v : v;
}

static void build_tables(void) {
    for (unsigned c = 0; c < 256; c++) {
        e4m3_tab[c] = dec_e4m3(c);
        e5m2_tab[c] = dec_e5m2(c);
    }
}

const float *kvd_e4m3_table(void) {
    pthread_once(&tab_once, build_tables);
    return e4m3_tab;
}
const float *kvd_e5m2_table(void) {
    pthread_once(&tab_once, build_tables);
    return e5m2_tab;
}
float kvd_e4m3_to_f32(uint8_t v) {
    return kvd_e4m3_table()[v];
}
float kvd_e5m2_to_f32(uint8_t v) {
    return kvd_e5m2_table()[v];
}

float kvd_e8m0_to_f32(uint8_t v) {
    /* the code is the biased exponent; 0 is 2^-127, a float subnormal */
    const uint32_t u = v == 0xff ? 0x7fc00000u : v ? (uint32_t)v << 23 : 0x00400000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float kvd_e2m1_to_f32(uint8_t v) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return v & 8 ? -mag[v & 7] : mag[v & 7];
}

uint8_t kvd_f32_to_e2m1(float x) {
    const uint8_t sign = (uint8_t)((f2u(x) >> 28) & 8u);
    const float a = fabsf(x);
    if (isnan(x)) return 7;
    /* the midpoints between neighbours; ties go to the even code */
    const uint8_t m = a <= 0.25f   ? 0
                      : a < 0.75f  ? 1
                      : a <= 1.25f ? 2
                      : a < 1.75f  ? 3
                      : a <= 2.5f  ? 4
                      : a < 3.5f   ? 5
                      : a <= 5.0f  ? 6
                                   : 7;
    return sign | m;
}

void kvd_quant_nvfp4(const float *x, uint8_t *out, size_t n, float scale, kvd_qstats *st) {
    uint8_t *sfo = out + n / 2;
    uint64_t sat = 0, ftz = 0, sub = 0;
    for (size_t g = 0; g < n / KVD_NVFP4_GROUP; g++) {
        const float *xg = x + g * KVD_NVFP4_GROUP;
        float a = 0.0f;
        for (int i = 0; i < KVD_NVFP4_GROUP; i++) a = fmaxf(a, fabsf(xg[i]));
        const uint8_t sfc = enc_e4m3((a / KVD_E2M1_MAX) / scale, 1);
        const float d = kvd_e4m3_to_f32(sfc) * scale;
        sfo[g] = sfc;
        for (int i = 0; i < KVD_NVFP4_GROUP; i += 2) {
            const float y0 = d > 0.0f ? xg[i] / d : xg[i] * 0.0f;
            const float y1 = d > 0.0f ? xg[i + 1] / d : xg[i + 1] * 0.0f;
            const uint8_t c0 = kvd_f32_to_e2m1(y0), c1 = kvd_f32_to_e2m1(y1);
            out[(g * KVD_NVFP4_GROUP + (size_t)i) / 2] = (uint8_t)(c0 | c1 << 4);
            sat += (fabsf(y0) >= 7.0f) + (fabsf(y1) >= 7.0f);
            ftz += ((c0 & 7) == 0 && xg[i] != 0.0f) + ((c1 & 7) == 0 && xg[i + 1] != 0.0f);
        }
        sub += (sfc & 0x78u) == 0 && sfc != 0 ? KVD_NVFP4_GROUP : 0;
    }
    if (st) {
        st->n += n;
        st->saturated += sat;
        st->flushed += ftz;
        st->subnormal += sub;
    }
}

/* Eight E2M1 codes (a 32-bit word, code i in bits 4i to 4i + 3) to floats
 * times s, then scale, in GNU C's vectors of 8 (AVX2 and NEON shift each
 * lane by its own count): codes 2-7 are 2^((m >> 1) - 1) (1 + (m & 1) / 2),
 * m's high bits landing in a float's exponent field and its low bit at the
 * top of the mantissa, rebiased; codes 0 and 1 are 0 and 0.5; the sign bit
 * moved into place. No lookup, so the lanes go together (unit_codecs holds
 * this to kvd_e2m1_to_f32 bit for bit). */
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));

static inline void e2m1x8(uint32_t w, float s, float scale, float *out) {
    const u32x8 shift = {0, 4, 8, 12, 16, 20, 24, 28};
    const u32x8 c = (((u32x8){0} + w) >> shift) & 15u, m = c & 7u;
    const u32x8 low = (u32x8)(m < 2u);
    const u32x8 mag = (low & -m & 0x3f000000u) | (~low & ((m << 22) + (126u << 23)));
    const f32x8 x = (f32x8)(mag | (c & 8u) << 28) * s * scale;
    memcpy(out, &x, sizeof x);
}

void kvd_dequant_nvfp4(const uint8_t *row, float *out, size_t n, float scale) {
    const float *e4 = kvd_e4m3_table();
    for (size_t g = 0; g < n / KVD_NVFP4_GROUP; g++) {
        const float s = e4[row[n / 2 + g]]; /* the group's block scale, decoded once */
        uint32_t w[2];
        memcpy(w, row + g * KVD_NVFP4_GROUP / 2, sizeof w);
        e2m1x8(w[0], s, scale, out + g * KVD_NVFP4_GROUP);
        e2m1x8(w[1], s, scale, out + g * KVD_NVFP4_GROUP + 8);
    }
}

/* A row's own scale (E4M3T, I8T): its largest magnitude (a NaN passed
 * over) over the format's largest code, at least 1e-6, stored after the n
 * codes at out. */
static float own_scale(const float *x, uint8_t *out, size_t n, float max_code) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    const float s = fmaxf(a / max_code, KVD_E4M3T_MIN_SCALE);
    memcpy(out + n, &s, sizeof s);
    return s;
}

void kvd_quant_e4m3t(const float *x, uint8_t *out, size_t n, kvd_qstats *st) {
    const float inv = 1.0f / own_scale(x, out, n, KVD_E4M3_MAX);
    uint64_t sat = 0, ftz = 0, sub = 0;
    for (size_t i = 0; i < n; i++) {
        const float y = x[i] * inv;
        const uint8_t c = enc_e4m3(y, 1);
        out[i] = c;
        sat += fabsf(y) > 464.0f;
        ftz += (c & 0x7fu) == 0 && x[i] != 0.0f;
        sub += (c & 0x78u) == 0 && (c & 0x7fu) != 0;
    }
    if (st) {
        st->n += n;
        st->saturated += sat;
        st->flushed += ftz;
        st->subnormal += sub;
    }
}

float kvd_row_scale(const uint8_t *row, size_t n) {
    float s;
    memcpy(&s, row + n, sizeof s);
    return s;
}

static void quant_i8t(const float *x, uint8_t *out, size_t n, int rn, kvd_qstats *st) {
    const float inv = 1.0f / own_scale(x, out, n, KVD_I8T_MAX);
    uint64_t sat = 0, ftz = 0;
    for (size_t i = 0; i < n; i++) {
        const float y = x[i] * inv;
        /* clamp, then truncate toward zero (a NaN, which no comparison
         * holds, to 0) */
        const float c = y >= 127.0f ? 127.0f : y <= -128.0f ? -128.0f : y == y ? y : 0.0f;
        const int8_t q = (int8_t)(rn ? rintf(c) : c);
        out[i] = (uint8_t)q;
        sat += fabsf(y) >= 128.0f;
        ftz += q == 0 && x[i] != 0.0f;
    }
    if (st) {
        st->n += n;
        st->saturated += sat;
        st->flushed += ftz;
    }
}

void kvd_quant_i8t(const float *x, uint8_t *out, size_t n, kvd_qstats *st) {
    quant_i8t(x, out, n, 0, st);
}

void kvd_quant_i8t_rn(const float *x, uint8_t *out, size_t n, kvd_qstats *st) {
    quant_i8t(x, out, n, 1, st);
}

/* The rotation's signs as floats (kvd_rht_sign_bits). */
static float rht_signs[KVD_RHT_MAX];
static pthread_once_t rht_once = PTHREAD_ONCE_INIT;

static void build_rht_signs(void) {
    kvd_rht_bits b;
    kvd_rht_sign_bits(&b);
    for (int k = 0; k < KVD_RHT_MAX; k++)
        rht_signs[k] = b.w[k / 32] >> (k % 32) & 1u ? -1.0f : 1.0f;
}

float kvd_rht_sign(size_t i) {
    pthread_once(&rht_once, build_rht_signs);
    return rht_signs[i];
}

void kvd_rht_rows(const float *src, float *dst, int rows, size_t src_stride, size_t dst_stride,
                  int heads, int hd, int inverse) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            float *y = dst + (size_t)r * dst_stride + (size_t)h * hd;
            memmove(y, src + (size_t)r * src_stride + (size_t)h * hd, sizeof(float) * (size_t)hd);
            kvd_rht(y, (size_t)hd, inverse);
            if (inverse)
                for (int k = 0; k < hd; k++) y[k] /= (float)hd;
            kvd_round_bf16(y, (size_t)hd);
        }
}

void kvd_rht(float *x, size_t n, int inverse) {
    pthread_once(&rht_once, build_rht_signs);
    if (!inverse)
        for (size_t i = 0; i < n; i++) x[i] *= rht_signs[i];
    for (size_t h = 1; h < n; h *= 2)
        for (size_t b = 0; b < n; b += 2 * h)
            for (size_t i = b; i < b + h; i++) {
                const float a = x[i], c = x[i + h];
                x[i] = a + c;
                x[i + h] = a - c;
            }
    if (inverse)
        for (size_t i = 0; i < n; i++) x[i] *= rht_signs[i];
}

/* (int)(v + 0.5) or (int)(v - 0.5) by v's sign, in FP32 as the engine
 * writes it, for v already clamped to [-1, 16] (a NaN taken as -1). */
static inline int round_away(float v) {
    v = fminf(fmaxf(v, -1.0f), 16.0f);
    return v >= 0.0f ? (int)(v + 0.5f) : (int)(v - 0.5f);
}

float kvd_i4t_scale(uint32_t word) {
    return u2f(kvd_i4t_scale_bits(word));
}

void kvd_quant_i4t(const float *x, uint8_t *out, size_t n, kvd_qstats *st) {
    float y[n];
    memcpy(y, x, sizeof y);
    kvd_rht(y, n, 0);
    kvd_round_bf16(y, n);
    float lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) lo = fminf(lo, y[i]), hi = fmaxf(hi, y[i]);
    const float s = fmaxf((hi - lo) / KVD_I4T_MAX, KVD_E4M3T_MIN_SCALE), inv = 1.0f / s;
    const int zi = round_away(-lo / s), z = zi < 0 ? 0 : zi > 15 ? 15 : zi;
    uint64_t sat = 0, ftz = 0;
    for (size_t i = 0; i < n; i++) {
        const int r = round_away(fmaf(y[i], inv, (float)z)), q = r < 0 ? 0 : r > 15 ? 15 : r;
        sat += r != q;
        ftz += q == z && y[i] != 0.0f;
        if (i % 2 == 0)
            out[i / 2] = (uint8_t)q;
        else
            out[i / 2] |= (uint8_t)(q << 4);
    }
    const uint32_t bits = kvd_i4t_word(f2u(s), z);
    memcpy(out + n / 2, &bits, sizeof bits);
    if (st) {
        st->n += n;
        st->saturated += sat;
        st->flushed += ftz;
    }
}

void kvd_dequant_i4t(const uint8_t *row, float *out, size_t n, float scale) {
    uint32_t bits;
    memcpy(&bits, row + n / 2, sizeof bits);
    const float s = kvd_i4t_scale(bits), z = (float)kvd_i4t_zero(bits);
    for (size_t i = 0; i < n; i++) {
        const int q = i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15;
        out[i] = ((float)q - z) * s * scale;
    }
}

void kvd_quant_row(int fmt, const float *x, uint8_t *out, size_t n, float scale, int saturate,
                   kvd_qstats *st) {
    switch (fmt) {
    case KVD_FMT_BF16:
        kvd_quant_bf16(x, (uint16_t *)out, n);
        if (st) st->n += n;
        break;
    case KVD_FMT_E4M3:
        kvd_quant_e4m3(x, out, n, scale, saturate, st);
        break;
    case KVD_FMT_E5M2:
        kvd_quant_e5m2(x, out, n, scale, saturate, st);
        break;
    case KVD_FMT_NVFP4:
        kvd_quant_nvfp4(x, out, n, scale, st);
        break;
    case KVD_FMT_E4M3T: /* the row makes its own scale */
        kvd_quant_e4m3t(x, out, n, st);
        break;
    case KVD_FMT_I8T:
        kvd_quant_i8t(x, out, n, st);
        break;
    case KVD_FMT_I8T_RN:
        kvd_quant_i8t_rn(x, out, n, st);
        break;
    case KVD_FMT_I4T:
        kvd_quant_i4t(x, out, n, st);
        break;
    }
}

void kvd_dequant_i8t(const uint8_t *row, float *out, size_t n, float scale) {
    const float s = kvd_row_scale(row, n);
    for (size_t i = 0; i < n; i++) out[i] = (float)(int8_t)row[i] * s * scale;
}

void kvd_dequant_e4m3t(const uint8_t *row, float *out, size_t n, float scale) {
    const float s = kvd_row_scale(row, n);
    for (size_t i = 0; i < n; i++) out[i] = kvd_e4m3_to_f32(row[i]) * s * scale;
}

/* Block size for the vector loops: encode a block with no branches, then
 * count what happened to it in a second pass over the same cache lines. */
#define QBLK 256

static void count_block(const float *x, const uint8_t *q, size_t n, float scale, float maxv,
                        uint8_t exp_mask, kvd_qstats *st) {
    uint64_t sat = 0, ftz = 0, sub = 0;
    for (size_t i = 0; i < n; i++) {
        float y = fabsf(x[i] / scale);
        unsigned mag = q[i] & 0x7fu;
        sat += y > maxv;
        ftz += (mag == 0) & (x[i] != 0.0f);
        sub += ((mag & exp_mask) == 0) & (mag != 0);
    }
    st->n += n;
    st->saturated += sat;
    st->flushed += ftz;
    st->subnormal += sub;
}

void kvd_quant_e4m3(const float *x, uint8_t *out, size_t n, float scale, int saturate,
                    kvd_qstats *stats) {
    for (size_t i0 = 0; i0 < n; i0 += QBLK) {
        size_t m = n - i0 < QBLK ? n - i0 : QBLK;
        if (saturate) {
            for (size_t i = 0; i < m; i++) out[i0 + i] = enc_e4m3(x[i0 + i] / scale, 1);
        } else {
            for (size_t i = 0; i < m; i++) out[i0 + i] = enc_e4m3(x[i0 + i] / scale, 0);
        }
        if (stats) count_block(x + i0, out + i0, m, scale, KVD_E4M3_MAX, 0x78u, stats);
    }
}

void kvd_quant_e5m2(const float *x, uint8_t *out, size_t n, float scale, int saturate,
                    kvd_qstats *stats) {
    for (size_t i0 = 0; i0 < n; i0 += QBLK) {
        size_t m = n - i0 < QBLK ? n - i0 : QBLK;
        if (saturate) {
            for (size_t i = 0; i < m; i++) out[i0 + i] = enc_e5m2(x[i0 + i] / scale, 1);
        } else {
            for (size_t i = 0; i < m; i++) out[i0 + i] = enc_e5m2(x[i0 + i] / scale, 0);
        }
        if (stats) count_block(x + i0, out + i0, m, scale, KVD_E5M2_MAX, 0x7cu, stats);
    }
}

void kvd_quant_bf16(const float *x, uint16_t *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = enc_bf16(x[i]);
}

void kvd_round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = u2f((uint32_t)enc_bf16(x[i]) << 16);
}

/* The row decodes compute what the tables hold (unit_codecs holds them to
 * the tables bit for bit) with no lookup and no branch, so that the
 * compiler vectorizes them: the code's exponent and mantissa fields moved
 * into a float's and rebiased; a subnormal code (exponent field 0) given the
 * least normal exponent instead, and that power of two (the implicit bit)
 * subtracted, which is exact; the sign bit moved into place; the NaN codes
 * (and E5M2's infinities) chosen by mask (a comparison negated: all ones
 * where it holds). */
void kvd_dequant_e4m3(const uint8_t *v, float *out, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t c = v[i], em = c & 0x7fu, sub = em < 8u;
        const float mag = u2f((em << 20) + (120u << 23) + (sub << 23)) - u2f(-sub & 0x3c800000u);
        const uint32_t bits = f2u(mag) | (c & 0x80u) << 24, nan = -(uint32_t)(em == 0x7fu);
        out[i] = u2f((nan & 0x7fc00000u) | (~nan & bits)) * scale;
    }
}

void kvd_dequant_e5m2(const uint8_t *v, float *out, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        const uint32_t c = v[i], em = c & 0x7fu, sub = em < 4u;
        const float mag = u2f((em << 21) + (112u << 23) + (sub << 23)) - u2f(-sub & 0x38800000u);
        const uint32_t inf = -(uint32_t)(em >= 0x7cu), nan = -(uint32_t)(em > 0x7cu);
        const uint32_t bits = ((inf & 0x7f800000u) | (~inf & f2u(mag))) | (c & 0x80u) << 24;
        out[i] = u2f((nan & 0x7fc00000u) | (~nan & bits)) * scale;
    }
}

void kvd_dequant_bf16(const uint16_t *v, float *out, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = u2f((uint32_t)v[i] << 16);
}
