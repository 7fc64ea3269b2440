/* kvdrift: attention over a paged KV cache on the CPU, reading BF16 or FP8
 * blocks and dequantizing in registers (scales folded into the logits and the
 * output, as the engines' kernels do). One query attends in parts that split
 * the context (flash-decoding): each part streams its blocks once, every KV
 * head of a block together, and the parts' partial softmaxes are merged.
 * Products and sums in FP32 (softmax sums in double); stored values decode
 * exactly. */
#define _DEFAULT_SOURCE /* syscall */
#include "../fp8.h"
#include "../kernels.h"
#include "amx.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
/* AVX-512 kernels; FP8 decodes to BF16 by byte permutes (vpermi2b), BF16 to
 * FP32 by a shuffle and a mask. Compiled into every x86-64 build with a
 * target attribute (KVD_VEC_FN) and taken where the CPU has AVX-512 VBMI,
 * whatever the build was compiled for, as the GEMM kernels are (linalg.c). */
#define KVD_VEC 1
#define KVD_VEC_FN __attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi")))
#endif

static inline size_t block_bytes(const kvd_kv_view *kv) {
    return (size_t)kv->kv_heads * (size_t)kv->block_size * kvd_fmt_row_bytes(kv->fmt, kv->head_dim);
}

/* Start of head `head`'s rows in cache block number `blk` of a pool. */
static inline const uint8_t *head_base(const kvd_kv_view *kv, const void *pool, int32_t blk,
                                       int head) {
    size_t per_head = (size_t)kv->block_size * kvd_fmt_row_bytes(kv->fmt, kv->head_dim);
    return (const uint8_t *)pool + (size_t)blk * block_bytes(kv) + (size_t)head * per_head;
}

void kvd_pool_quant_row(kvd_fmt f, uint8_t *pool, int bs, int head_dim, size_t r, const float *x,
                        float scale, int saturate, kvd_qstats *stats) {
    const size_t n = (size_t)head_dim, nc = kvd_fmt_code_bytes(f, n);
    uint8_t *codes = pool + kvd_pool_codes_at(f, head_dim, bs, r);
    if (!kvd_fmt_row_scaled(f)) { /* rows whole: straight into place */
        kvd_quant_row(f, x, codes, n, scale, saturate, stats);
        return;
    }
    uint8_t row[kvd_scaled_row_bytes(nc)];
    kvd_quant_row(f, x, row, n, scale, saturate, stats);
    memcpy(codes, row, nc);
    memcpy(pool + kvd_scaled_scale_at(nc, bs, r / (size_t)bs, (int)(r % (size_t)bs)), row + nc, 4);
}

void kvd_pool_get_row(kvd_fmt f, const uint8_t *pool, int bs, int head_dim, size_t r,
                      uint8_t *row) {
    const size_t nc = kvd_pool_code_stride(f, head_dim);
    memcpy(row, pool + kvd_pool_codes_at(f, head_dim, bs, r), nc);
    if (kvd_fmt_row_scaled(f))
        memcpy(row + nc, pool + kvd_scaled_scale_at(nc, bs, r / (size_t)bs, (int)(r % (size_t)bs)),
               4);
}

/* The scale words of nt rows from slot t0 of a row-scaled segment seg (bs
 * rows; their words lie side by side after the codes): each row's scale
 * into rs, and an I4T row's with its zero point's bits cleared, that zero
 * point into zf. Returns zf for I4T, else NULL (zf untouched). */
static const float *row_words(const uint8_t *seg, kvd_fmt f, int bs, int head_dim, int t0, int nt,
                              float *rs, float *zf) {
    const uint8_t *w =
        seg + kvd_scaled_scale_at(kvd_fmt_code_bytes(f, (size_t)head_dim), bs, 0, t0);
    memcpy(rs, w, sizeof(float) * (size_t)nt);
    if (f != KVD_FMT_I4T) return NULL;
    for (int t = 0; t < nt; t++) {
        uint32_t word;
        memcpy(&word, &rs[t], sizeof word);
        rs[t] = kvd_i4t_scale(word), zf[t] = (float)kvd_i4t_zero(word);
    }
    return zf;
}

float kvd_pool_row_scale(kvd_fmt f, const uint8_t *seg, int bs, int head_dim, int slot) {
    float s, z;
    row_words(seg, f, bs, head_dim, slot, 1, &s, &z);
    return s;
}

/* What the CPU has, and which kernels run, settled once, before any kernel
 * runs: where the CPU has AVX-512 VBMI the AVX-512 ones (vec_on), and of
 * those, where it also has AMX-BF16 and AVX512-BF16 and Linux grants the
 * process the tile registers, the AMX ones for the group sizes they take
 * (amx_on); else the portable ones, whose FP8 rows decode through F16C
 * where it has AVX2 and F16C (f16c_decode).
 * KVD_CPU_ATTENTION=portable takes the portable kernels everywhere, and
 * expf in the softmax (an A/B of the two, or a run with the bits of a CPU
 * without AVX-512 VBMI: cli_generic holds the two together); =avx512 the
 * AVX-512 ones without AMX; =amx asks for AMX. attn_env_bad: a value that
 * names no kernels this CPU runs. */
static int vec_on, amx_on, attn_portable;
#ifdef KVD_VEC
static int f16c_decode;
#endif
static const char *attn_env_bad;
static pthread_once_t attn_env_once = PTHREAD_ONCE_INIT;

static void attn_env(void) {
    int vec_cpu = 0, amx_cpu = 0;
#ifdef KVD_VEC
    __builtin_cpu_init();
    vec_cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi");
    unsigned a, b, c = 0, d; /* CPUID leaf 1's ECX: F16C (bit 29; clang's builtin has no name
                                for it), OSXSAVE (27) */
    if (!__get_cpuid(1, &a, &b, &c, &d)) c = 0;
    f16c_decode = __builtin_cpu_supports("avx2") && (c >> 29 & 1);
#endif
    const char *e = getenv("KVD_CPU_ATTENTION");
    const int want_portable = e && !strcmp(e, "portable"), want_avx512 = e && !strcmp(e, "avx512");
#ifdef KVD_VEC
    /* the tiles are asked of the OS only where they would be used */
    if (vec_cpu && !want_portable && !want_avx512) amx_cpu = kvd_amx_usable(c);
#endif
    if (want_portable)
        attn_portable = 1;
    else if (e && *e && !(want_avx512 && vec_cpu) && !(!strcmp(e, "amx") && amx_cpu))
        attn_env_bad = e;
    vec_on = vec_cpu && !attn_portable;
    amx_on = amx_cpu && !attn_portable && !want_avx512;
}

static int vector_kernels(void) {
    pthread_once(&attn_env_once, attn_env);
    return vec_on;
}

int kvd_attn_env(char *err, size_t len) {
    pthread_once(&attn_env_once, attn_env);
    if (!attn_env_bad) return 0;
    snprintf(err, len, "KVD_CPU_ATTENTION: expected kernels this CPU runs (%s), got '%s'",
             amx_on   ? "amx, avx512, portable"
             : vec_on ? "avx512, portable: it has no AMX-BF16 the process may use"
                      : "portable: it has no AVX-512 VBMI",
             attn_env_bad);
    return -1;
}

#ifdef KVD_VEC
/* FP8 codes to floats through FP16, for the portable kernels on any x86 CPU
 * with AVX2 and F16C (chosen when the program starts, as the GEMMs are):
 * an E5M2 code is an FP16's high byte, and an E4M3 code moved up 7 bits
 * (its sign to bit 15) is an FP16 of 2^-8 its value, subnormals included.
 * vcvtph2ps widens exactly (every FP16 is a normal float, so no denormal
 * stalls) and the x256 is exact: the same floats as kvd_dequant_e4m3 /
 * _e5m2, NaN codes as their 0x7fc00000. Returns how many it decoded (the
 * 16s; the rest are the scalar decoder's). */
__attribute__((target("avx2,f16c"))) static int fp8_row_f16c(int e4m3, const uint8_t *p, int n,
                                                             float *out) {
    const __m256i m7f = _mm256_set1_epi16(0x7f), qnan = _mm256_set1_epi16(0x7e00);
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + i)));
        const __m256i em = _mm256_and_si256(w, m7f);
        __m256i h, nan;
        if (e4m3) {
            h = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16((short)0xbf80));
            nan = _mm256_cmpeq_epi16(em, m7f);
        } else {
            h = _mm256_slli_epi16(w, 8);
            nan = _mm256_cmpgt_epi16(em, _mm256_set1_epi16(0x7c));
        }
        h = _mm256_blendv_epi8(h, qnan, nan);
        __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        if (e4m3) {
            lo = _mm256_mul_ps(lo, _mm256_set1_ps(256.0f));
            hi = _mm256_mul_ps(hi, _mm256_set1_ps(256.0f));
        }
        _mm256_storeu_ps(out + i, lo);
        _mm256_storeu_ps(out + i + 8, hi);
    }
    return i;
}

#endif

/* n FP8 codes into floats, unscaled */
static void decode_fp8(int e4m3, const uint8_t *p, int n, float *out) {
    int i = 0;
#ifdef KVD_VEC
    pthread_once(&attn_env_once, attn_env);
    if (f16c_decode) i = fp8_row_f16c(e4m3, p, n, out);
#endif
    if (e4m3)
        kvd_dequant_e4m3(p + i, out + i, (size_t)(n - i), 1.0f);
    else
        kvd_dequant_e5m2(p + i, out + i, (size_t)(n - i), 1.0f);
}

/* Decode n stored values into floats, unscaled (E4M3T, I8T: the codes; the
 * row's scale is applied by the caller; I4T: the codes 0-15, whose zero
 * point the caller takes off). */
static void decode_row(kvd_fmt fmt, const uint8_t *p, int n, float *out) {
    if (fmt == KVD_FMT_BF16) {
        kvd_dequant_bf16((const uint16_t *)p, out, (size_t)n);
    } else if (fmt == KVD_FMT_E4M3 || fmt == KVD_FMT_E4M3T || fmt == KVD_FMT_E5M2) {
        decode_fp8(fmt != KVD_FMT_E5M2, p, n, out);
    } else if (fmt == KVD_FMT_NVFP4) {
        kvd_dequant_nvfp4(p, out, (size_t)n, 1.0f);
    } else if (fmt == KVD_FMT_I4T) {
        for (int i = 0; i < n; i++) out[i] = (float)(i % 2 ? p[i / 2] >> 4 : p[i / 2] & 15);
    } else {
        for (int i = 0; i < n; i++) out[i] = (float)(int8_t)p[i];
    }
}

void kvd_kv_row(const kvd_kv_view *kv, int which_v, const int32_t *blocks, int pos, int head,
                float *out) {
    int bs = kv->block_size;
    const uint8_t *seg = head_base(kv, which_v ? kv->v : kv->k, blocks[pos / bs], head);
    const int hd = kv->head_dim;
    decode_row(kv->fmt, seg + (size_t)(pos % bs) * kvd_pool_code_stride(kv->fmt, hd), hd, out);
    if (kvd_fmt_row_scaled(kv->fmt)) { /* the row's own scale (I4T: its zero point first) */
        float rs, z;
        if (row_words(seg, kv->fmt, bs, hd, pos % bs, 1, &rs, &z))
            for (int i = 0; i < hd; i++) out[i] -= z;
        for (int i = 0; i < hd; i++) out[i] *= rs;
    }
    float s = which_v ? kv->v_scale[head] : kv->k_scale[head];
    for (int i = 0; i < hd; i++) out[i] *= s;
    if (kv->fmt == KVD_FMT_I4T) { /* back from the rotated basis */
        kvd_rht(out, (size_t)hd, 1);
        for (int i = 0; i < hd; i++) out[i] /= (float)hd;
    }
}

/* ---- per-block kernels: G query heads against one KV head's block ----
 * scores: s[j * stride + t] = (q_j . k_t) * kmul for the nt rows at kp;
 * pv:     acc[j][:] += p[j * stride + t] * v_t for the nt rows at vp.
 * The vector kernels read q and write acc in their own order of the
 * dimensions (slot_dim); kmul folds in the softmax and cache scales. */

/* The portable kernels (every machine without the AVX-512 ones below: AVX2,
 * NEON) in GNU C's vectors of 8 floats, which the compiler maps to the
 * machine's own (one AVX register, two NEON ones): TP rows decoded at a
 * time, then for each query head TP dot products side by side (a vector
 * chain each, summed across its lanes in a fixed order at the end) and the
 * output's vectors read and written once a tile. The order of the sums is
 * the code's, not the machine's vector width. */
typedef float vec8 __attribute__((vector_size(32)));
enum { TP = 4 };
_Static_assert(TP == 4, "pv_portable's sum is written out for four rows");

/* (vectors through pointers: passed by value, their ABI would depend on
 * whether the build has AVX, which GCC warns of) */
static inline void load8(vec8 *v, const float *p) {
    memcpy(v, p, sizeof *v);
}

static inline float sum8(const vec8 *v) {
    return (((*v)[0] + (*v)[4]) + ((*v)[1] + (*v)[5])) +
           (((*v)[2] + (*v)[6]) + ((*v)[3] + (*v)[7]));
}

/* TP rows from t0 of a block decoded into rows (less the rows' zero points
 * zf, I4T's, where given); past nt, zeros */
static void decode_tile(kvd_fmt fmt, const uint8_t *p, int t0, int nt, int hd, const float *zf,
                        float (*rows)[hd]) {
    const size_t rb = kvd_pool_code_stride(fmt, hd);
    for (int i = 0; i < TP; i++) {
        if (t0 + i < nt) {
            decode_row(fmt, p + (size_t)(t0 + i) * rb, hd, rows[i]);
            for (int d = 0; zf && d < hd; d++) rows[i][d] -= zf[t0 + i];
        } else {
            memset(rows[i], 0, sizeof(float) * (size_t)hd);
        }
    }
}

static void scores_portable(const uint8_t *kp, int nt, const float *q, int G, int hd, kvd_fmt fmt,
                            const float *zf, float kmul, float *s, size_t stride) {
    float rows[TP][hd];
    const int d8 = hd / 8 * 8;
    for (int t0 = 0; t0 < nt; t0 += TP) {
        decode_tile(fmt, kp, t0, nt, hd, zf, rows);
        for (int j = 0; j < G; j++) {
            const float *qj = q + (size_t)j * hd;
            vec8 acc[TP] = {{0}};
            for (int d = 0; d < d8; d += 8) {
                vec8 qv, k;
                load8(&qv, qj + d);
                for (int i = 0; i < TP; i++) {
                    load8(&k, rows[i] + d);
                    acc[i] += qv * k;
                }
            }
            for (int i = 0; i < TP && t0 + i < nt; i++) {
                float dot = sum8(&acc[i]);
                for (int d = d8; d < hd; d++) dot += qj[d] * rows[i][d];
                s[(size_t)j * stride + t0 + i] = dot * kmul;
            }
        }
    }
}

static void pv_portable(const uint8_t *vp, int nt, const float *p, size_t stride, int G, int hd,
                        kvd_fmt fmt, const float *zf, float *acc) {
    float rows[TP][hd];
    const int d8 = hd / 8 * 8;
    for (int t0 = 0; t0 < nt; t0 += TP) {
        decode_tile(fmt, vp, t0, nt, hd, zf, rows);
        for (int j = 0; j < G; j++) {
            float w[TP]; /* zero weights under the zero rows past nt */
            for (int i = 0; i < TP; i++) w[i] = t0 + i < nt ? p[(size_t)j * stride + t0 + i] : 0.0f;
            float *o = acc + (size_t)j * hd;
            for (int d = 0; d < d8; d += 8) {
                vec8 x, r[TP];
                load8(&x, o + d);
                for (int i = 0; i < TP; i++) load8(&r[i], rows[i] + d);
                x += (w[0] * r[0] + w[1] * r[1]) + (w[2] * r[2] + w[3] * r[3]);
                memcpy(o + d, &x, sizeof x);
            }
            for (int d = d8; d < hd; d++)
                for (int i = 0; i < TP; i++) o[d] += w[i] * rows[i][d];
        }
    }
}

/* What a read path's rows hold: BF16 words, byte codes (FP8, through the
 * byte-permute tables; INT8, sign-extended), NVFP4 groups, or INT4 nibbles
 * (widened; each row's zero point taken off after). */
enum { CODES_BF16 = 0, CODES_FP8 = 1, CODES_INT8 = 2, CODES_NVFP4 = 3, CODES_INT4 = 4 };

#ifdef KVD_VEC
/* FP8 to BF16 by table: the low and high bytes of the BF16 of each 7-bit
 * magnitude (vpermi2b reads seven bits of each index), the sign copied in. */
typedef struct {
    __m512i lo0, lo1, hi0, hi1;
} fp8_tables;

static uint8_t tab_bytes[2][2][128]; /* [e4m3, e5m2][low, high][magnitude code] */
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_build(void) {
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 128; c++) {
            float x = f == 0 ? kvd_e4m3_to_f32((uint8_t)c) : kvd_e5m2_to_f32((uint8_t)c);
            uint16_t b = kvd_f32_to_bf16(x); /* exact: 3 or 2 mantissa bits */
            tab_bytes[f][0][c] = (uint8_t)(b & 0xff);
            tab_bytes[f][1][c] = (uint8_t)(b >> 8);
        }
}

KVD_VEC_FN static void tables_for(kvd_fmt fmt, fp8_tables *t) {
    pthread_once(&tab_once, tab_build);
    int f = fmt == KVD_FMT_E5M2;
    t->lo0 = _mm512_loadu_si512(tab_bytes[f][0]), t->lo1 = _mm512_loadu_si512(tab_bytes[f][0] + 64);
    t->hi0 = _mm512_loadu_si512(tab_bytes[f][1]), t->hi1 = _mm512_loadu_si512(tab_bytes[f][1] + 64);
}

/* 64 codes to 64 BF16: *a holds the codes at bytes 0-7 of each 128-bit lane,
 * *b those at bytes 8-15 (unpack order; see word_dim). */
KVD_VEC_FN static inline void fp8_to_bf16(__m512i codes, const fp8_tables *T, __m512i *a,
                                          __m512i *b) {
    __m512i lo = _mm512_permutex2var_epi8(T->lo0, codes, T->lo1);
    __m512i hi = _mm512_permutex2var_epi8(T->hi0, codes, T->hi1);
    hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8((char)0x80), 0xF8); /* a|(b&c) */
    *a = _mm512_unpacklo_epi8(lo, hi);
    *b = _mm512_unpackhi_epi8(lo, hi);
}

/* 32 BF16 to 32 floats, exactly: the even-numbered values (a byte shuffle,
 * off the FMA port) and the odd-numbered ones (a mask). */
KVD_VEC_FN static inline __m512 bf16_even(__m512i x) {
    const __m512i idx = _mm512_set4_epi32(0x0d0c8080, 0x09088080, 0x05048080, 0x01008080);
    return _mm512_castsi512_ps(_mm512_shuffle_epi8(x, idx));
}
KVD_VEC_FN static inline __m512 bf16_odd(__m512i x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* 64 stored values (one chunk of a row) as four vectors of 16 floats: BF16
 * and FP8 in slot_dim's orders, INT8 converted 16 at a time, in natural
 * order; INT4's 32 bytes, each 16's low nibbles then their high ones (the
 * codes 0-15). */
KVD_VEC_FN static inline void load64(int codes, const uint8_t *row, int c, const fp8_tables *T,
                                     __m512 *f) {
    __m512i a, b;
    if (codes == CODES_INT4) {
        for (int h = 0; h < 2; h++) {
            const __m512i x = _mm512_cvtepu8_epi32(
                _mm_loadu_si128((const __m128i *)(const void *)(row + c / 2 + 16 * h)));
            f[2 * h] = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(15)));
            f[2 * h + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
        }
        return;
    }
    if (codes == CODES_INT8) {
        for (int u = 0; u < 4; u++)
            f[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(const void *)(row + c + 16 * u))));
        return;
    }
    if (codes) {
        fp8_to_bf16(_mm512_loadu_si512(row + c), T, &a, &b);
    } else {
        a = _mm512_loadu_si512(row + 2 * c);
        b = _mm512_loadu_si512(row + 2 * c + 64);
    }
    f[0] = bf16_even(a), f[1] = bf16_odd(a), f[2] = bf16_even(b), f[3] = bf16_odd(b);
}

/* The next block's rows into L2 while this block's are worked on: one block
 * ahead, spread over the rows (the hardware prefetcher stops at every block
 * boundary of a scattered block table). */
KVD_VEC_FN static inline void prefetch_l2(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 64) _mm_prefetch((const char *)p + i, _MM_HINT_T1);
}

/* Sixteen horizontal sums: lane i of the result is the sum of v[i]'s lanes. */
KVD_VEC_FN static inline __m512 sum16(const __m512 *v) {
    __m512 a[8], b[4];
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit lane l of b[i]: v[4i + l]'s four partial sums */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    __m512 s0 = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
    __m512 s1 = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
    __m512 r = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(s0), _mm512_castps_pd(s1))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(s0), _mm512_castps_pd(s1))));
    /* lane 4l + k of r is v[4k + l]'s sum */
    const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(tr, r);
}

/* f (load64's four vectors) less z: an I4T row's codes less its zero
 * point, exact */
KVD_VEC_FN static inline void less_zero(__m512 *f, float z) {
    const __m512 zz = _mm512_set1_ps(z);
    for (int u = 0; u < 4; u++) f[u] = _mm512_sub_ps(f[u], zz);
}

/* G fixed at compile time, so the accumulators live in registers: scores
 * take 16 / G rows at a time (sixteen dot products, summed together), P.V
 * 16 / G vectors of 16 dimensions (at most four, one chunk) per pass. zf:
 * the rows' zero points (I4T), taken off their codes, or NULL. */
#define KVD_DEFINE_BLOCK_KERNELS(G)                                                                \
    KVD_VEC_FN static void scores_g##G(const uint8_t *kp, int nt, const float *qk, int hd,         \
                                       size_t rb, int codes, const fp8_tables *T, const float *zf, \
                                       float kmul, float *s, size_t stride, const uint8_t *pf) {   \
        enum { TG = 16 / (G) };                                                                    \
        const size_t pshare = TG * rb / (size_t)(hd / 64);                                         \
        for (int t = 0; t < nt; t += TG) {                                                         \
            const uint8_t *row[TG]; /* past the end: row t again, its sums unused */               \
            for (int tt = 0; tt < TG; tt++)                                                        \
                row[tt] = kp + (size_t)(t + tt < nt ? t + tt : t) * rb;                            \
            __m512 acc[16];                                                                        \
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();                             \
            for (int c = 0; c < hd; c += 64) {                                                     \
                if (pf && (!codes || c == 0)) /* BF16: a share per chunk, a steady stream */       \
                    prefetch_l2(pf + (size_t)t * rb + (codes ? 0 : (size_t)c / 64 * pshare),       \
                                codes ? TG * rb : pshare);                                         \
                _Pragma("GCC unroll 16") for (int tt = 0; tt < TG; tt++) {                         \
                    __m512 f[4];                                                                   \
                    load64(codes, row[tt], c, T, f);                                               \
                    if (zf) less_zero(f, zf[t + tt < nt ? t + tt : t]);                            \
                    _Pragma("GCC unroll 16") for (int j = 0; j < (G); j++) {                       \
                        const float *qj = qk + (size_t)j * hd + c;                                 \
                        __m512 x = acc[tt * (G) + j];                                              \
                        x = _mm512_fmadd_ps(f[0], _mm512_loadu_ps(qj), x);                         \
                        x = _mm512_fmadd_ps(f[1], _mm512_loadu_ps(qj + 16), x);                    \
                        x = _mm512_fmadd_ps(f[2], _mm512_loadu_ps(qj + 32), x);                    \
                        acc[tt * (G) + j] = _mm512_fmadd_ps(f[3], _mm512_loadu_ps(qj + 48), x);    \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            float r[16];                                                                           \
            _mm512_storeu_ps(r, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(kmul)));                  \
            for (int tt = 0; tt < TG && t + tt < nt; tt++)                                         \
                for (int j = 0; j < (G); j++) s[(size_t)j * stride + t + tt] = r[tt * (G) + j];    \
        }                                                                                          \
    }                                                                                              \
    KVD_VEC_FN static void pv_g##G(const uint8_t *vp, int nt, const float *p, size_t stride,       \
                                   int hd, size_t rb, int codes, const fp8_tables *T,              \
                                   const float *zf, float *out, const uint8_t *pf) {               \
        enum { U = (G) >= 4 ? 16 / (G) : 4 };                                                      \
        const size_t pshare = rb / (size_t)(hd / 64);                                              \
        for (int c = 0; c < hd; c += 64)                                                           \
            for (int u0 = 0; u0 < 4; u0 += U) {                                                    \
                __m512 acc[U * (G)];                                                               \
                for (int u = 0; u < U; u++)                                                        \
                    for (int j = 0; j < (G); j++)                                                  \
                        acc[u * (G) + j] =                                                         \
                            _mm512_loadu_ps(out + (size_t)j * hd + c + 16 * (u0 + u));             \
                for (int t = 0; t < nt; t++) {                                                     \
                    if (pf && u0 == 0 && (!codes || c == 0)) /* BF16: a share per chunk's pass */  \
                        prefetch_l2(pf + (size_t)t * rb + (codes ? 0 : (size_t)c / 64 * pshare),   \
                                    codes ? rb : pshare);                                          \
                    __m512 f[4];                                                                   \
                    load64(codes, vp + (size_t)t * rb, c, T, f);                                   \
                    if (zf) less_zero(f, zf[t]);                                                   \
                    for (int j = 0; j < (G); j++) {                                                \
                        __m512 pj = _mm512_set1_ps(p[(size_t)j * stride + t]);                     \
                        for (int u = 0; u < U; u++)                                                \
                            acc[u * (G) + j] = _mm512_fmadd_ps(f[u0 + u], pj, acc[u * (G) + j]);   \
                    }                                                                              \
                }                                                                                  \
                for (int u = 0; u < U; u++)                                                        \
                    for (int j = 0; j < (G); j++)                                                  \
                        _mm512_storeu_ps(out + (size_t)j * hd + c + 16 * (u0 + u),                 \
                                         acc[u * (G) + j]);                                        \
            }                                                                                      \
    }
KVD_DEFINE_BLOCK_KERNELS(1)
KVD_DEFINE_BLOCK_KERNELS(2)
KVD_DEFINE_BLOCK_KERNELS(4)
KVD_DEFINE_BLOCK_KERNELS(8)
KVD_DEFINE_BLOCK_KERNELS(16)

/* ---- AMX kernels (G = 8 or 16 query heads a KV head) ----
 * TDPBF16PS multiplies BF16 tiles into FP32 accumulators: products of two
 * BF16 are exact in FP32, and every stored value (BF16, FP8, INT8) is a
 * BF16 exactly. The FP32 query and weights are not, so each is split into
 * three BF16 (x = hi + mid + lo, each the rounding of what the ones before
 * left: 24 bits, the float exactly, a denormal rest aside) and the three
 * products summed in FP32. The products are exact, as in the AVX-512
 * kernels' fused multiply-adds; only the order and rounding of the sums
 * differ.
 * Scores: C[16 rows][G heads] += K rows (A: 16 rows x 32 dimensions) times
 * each part of the query's split (B: 32 dimensions x 16 heads, pairs of
 * dimensions interleaved), the three into one accumulator.
 * P.V: C[split heads][16 dimensions] += the weights' split (A: 32 rows of
 * the block) times the value rows (B: 16 pairs of rows x 16 dimensions, the
 * pair's two values side by side). G = 16 has a tile a part and sums them
 * into one accumulator; G = 8 packs the parts into rows (j, 8 + j, 16 + j of
 * two tiles), summed once a part, at its end.
 * Every tile is 16 rows of 64 bytes (amx.h sets them up). */

/* Per part: two 16-row groups of keys as A tiles [2][hd / 32][16][32], up
 * to 128 value rows as B tiles [4][hd / 16][16][32], their weights' split
 * as A tiles [4][3][16][32], an accumulator's copy [16][16], and the split
 * outputs [kv_heads][amx_out_rows][head_dim] (natural order). */
typedef struct {
    uint16_t *k, *v, *p;
    float *c, *acc;
} amx_work;

static inline int amx_stacked_pv(int G) {
    return G == 16;
}
/* A tiles of the weights' split (G = 8: also the accumulator tiles a
 * 16-dimension group), rows of split output */
static inline int amx_pv_tiles(int G) {
    return amx_stacked_pv(G) ? 3 : (3 * G + 15) / 16;
}
static inline int amx_out_rows(int G) {
    return amx_stacked_pv(G) ? 16 : 16 * amx_pv_tiles(G);
}

/* 64 codes to 64 BF16 in natural order: codes 0-31 into *a, 32-63 into *b
 * (fp8_to_bf16's unpack order undone by a byte permute first) */
KVD_AMX_FN static inline void fp8_to_bf16_natural(__m512i codes, const fp8_tables *T, __m512i *a,
                                                  __m512i *b) {
    /* byte 16 L + i of the permuted codes: code 8 L + i (i < 8), 32 + 8 L + i - 8 (i >= 8) */
    const __m512i idx = _mm512_set_epi8(
        63, 62, 61, 60, 59, 58, 57, 56, 31, 30, 29, 28, 27, 26, 25, 24, 55, 54, 53, 52, 51, 50, 49,
        48, 23, 22, 21, 20, 19, 18, 17, 16, 47, 46, 45, 44, 43, 42, 41, 40, 15, 14, 13, 12, 11, 10,
        9, 8, 39, 38, 37, 36, 35, 34, 33, 32, 7, 6, 5, 4, 3, 2, 1, 0);
    fp8_to_bf16(_mm512_permutexvar_epi8(idx, codes), T, a, b);
}

/* 64 stored values from value c of a row as BF16 in natural order */
KVD_AMX_FN static inline void row_bf16(int codes, const uint8_t *row, int c, const fp8_tables *T,
                                       __m512i *a, __m512i *b) {
    if (codes == CODES_BF16) {
        *a = _mm512_loadu_si512(row + 2 * c);
        *b = _mm512_loadu_si512(row + 2 * c + 64);
    } else if (codes == CODES_FP8) {
        fp8_to_bf16_natural(_mm512_loadu_si512(row + c), T, a, b);
    } else { /* INT8: exact in BF16 */
        __m512 f[4];
        for (int u = 0; u < 4; u++)
            f[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(const void *)(row + c + 16 * u))));
        *a = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]);
        *b = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]);
    }
}

/* n rows (the rest of 16 zero) as the A tiles of a key group, each row's
 * bytes of the next block (pf) asked for as it is read */
KVD_AMX_FN static void amx_key_rows(const uint8_t *p, int n, int hd, size_t rb, int codes,
                                    const fp8_tables *T, uint16_t *out, const uint8_t *pf) {
    for (int r = 0; r < 16; r++) {
        uint16_t *o = out + 32 * r;
        if (pf && r < n) prefetch_l2(pf + (size_t)r * rb, rb);
        for (int c = 0; c < hd; c += 64) {
            __m512i a = _mm512_setzero_si512(), b = a;
            if (r < n) row_bf16(codes, p + (size_t)r * rb, c, T, &a, &b);
            _mm512_storeu_si512(o + (size_t)c / 32 * 512, a);
            _mm512_storeu_si512(o + ((size_t)c / 32 + 1) * 512, b);
        }
    }
}

/* 16 rows' scores of G heads from an accumulator's copy c (column j is
 * head j), times kmul; n of them stored */
KVD_AMX_FN static inline void amx_scores_out(const float *c, int G, float kmul, int n, float *s,
                                             size_t stride) {
    const __m512i col =
        _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
    const __mmask16 m = (__mmask16)((1u << n) - 1);
    for (int j = 0; j < G; j++) {
        const __m512 x = _mm512_i32gather_ps(_mm512_add_epi32(col, _mm512_set1_epi32(j)), c, 4);
        _mm512_mask_storeu_ps(s + (size_t)j * stride, m, _mm512_mul_ps(x, _mm512_set1_ps(kmul)));
    }
}

/* Two groups of 16 rows at a time (two accumulators, so that the products'
 * chains overlap): tiles 0-1 accumulators, 2-3 the groups' keys, 5-7 the
 * query's split. BF16 groups of 16 whole rows are read from the cache. */
KVD_AMX_FN static void amx_scores(const uint8_t *kp, int nt, const uint16_t *qt, int G, int hd,
                                  size_t rb, int codes, const fp8_tables *T, float kmul, float *s,
                                  size_t stride, const uint8_t *pf, const amx_work *w) {
    const int nc = hd / 32;
    uint16_t *kb1 = w->k + (size_t)16 * hd;
    for (int t = 0; t < nt; t += 32) {
        const int n0 = nt - t < 16 ? nt - t : 16, n1 = nt - t - 16 < 16 ? nt - t - 16 : 16;
        const uint8_t *r0 = kp + (size_t)t * rb, *r1 = r0 + 16 * rb;
        const uint8_t *f0 = pf ? pf + (size_t)t * rb : NULL, *f1 = pf ? f0 + 16 * rb : NULL;
        const int d0 = codes == CODES_BF16 && n0 == 16, d1 = codes == CODES_BF16 && n1 == 16;
        if (!d0) amx_key_rows(r0, n0, hd, rb, codes, T, w->k, f0);
        if (n1 > 0 && !d1) amx_key_rows(r1, n1, hd, rb, codes, T, kb1, f1);
        /* the cache's rows read straight: the next block's asked for a share a chunk */
        const size_t share0 = d0 ? 16 * rb / (size_t)nc : 0, share1 = d1 ? 16 * rb / (size_t)nc : 0;
        AMX_ZERO(0);
        AMX_ZERO(1);
        for (int c = 0; c < nc; c++) {
            const uint16_t *b = qt + (size_t)c * 3 * 512;
            if (pf && share0) prefetch_l2(f0 + (size_t)c * share0, share0);
            if (pf && share1) prefetch_l2(f1 + (size_t)c * share1, share1);
            AMX_LOAD(5, b, 64);
            AMX_LOAD(6, b + 512, 64);
            AMX_LOAD(7, b + 1024, 64);
            if (d0)
                AMX_LOAD(2, r0 + (size_t)c * 64, rb);
            else
                AMX_LOAD(2, w->k + (size_t)c * 512, 64);
            AMX_DP(0, 2, 5);
            AMX_DP(0, 2, 6);
            AMX_DP(0, 2, 7);
            if (n1 > 0) {
                if (d1)
                    AMX_LOAD(3, r1 + (size_t)c * 64, rb);
                else
                    AMX_LOAD(3, kb1 + (size_t)c * 512, 64);
                AMX_DP(1, 3, 5);
                AMX_DP(1, 3, 6);
                AMX_DP(1, 3, 7);
            }
        }
        AMX_STORE(0, w->c, 64);
        amx_scores_out(w->c, G, kmul, n0, s + t, stride);
        if (n1 > 0) {
            AMX_STORE(1, w->c, 64);
            amx_scores_out(w->c, G, kmul, n1, s + t + 16, stride);
        }
    }
}

enum { AMX_PV_CHUNKS = 4 }; /* 32-row chunks a pass of P.V takes: 128 rows */

/* P.V over up to 128 rows at a time: their weights' split (A tiles) and
 * values (B tiles) laid out first, then two 16-dimension accumulators at a
 * time (per A tile, G = 8) held in tiles across the rows. Tiles: 0-1 (and
 * 3-4) accumulators, 2 (and 7, or 3-4) the split, 5-6 the values. */
KVD_AMX_FN static void amx_pv(const uint8_t *vp, int nt, const float *p, size_t stride, int G,
                              int hd, size_t rb, int codes, const fp8_tables *T, float *acc,
                              const uint8_t *pf, const amx_work *w) {
    const int MT = amx_pv_tiles(G), stacked = amx_stacked_pv(G), rstep = stacked ? 16 : G;
    const size_t ast = sizeof(float) * (size_t)hd; /* the split outputs' row stride */
    const size_t vchunk = (size_t)hd * 32;         /* words of a chunk's B tiles */
    /* word 2n + e of a B row: value n of row e of the pair (n < 16: dimensions 0-15 of the 32) */
    const __m512i lo_idx =
        _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                         37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
    for (int t0 = 0; t0 < nt; t0 += 32 * AMX_PV_CHUNKS) {
        const int ns = nt - t0 < 32 * AMX_PV_CHUNKS ? nt - t0 : 32 * AMX_PV_CHUNKS;
        const int nch = (ns + 31) / 32;
        for (int ch = 0; ch < nch; ch++) {
            const int tc = t0 + 32 * ch, n = nt - tc < 32 ? nt - tc : 32;
            /* the weights of rows tc .. tc + n, split: row part rstep + j */
            const __mmask16 m0 = kvd_lanes16(n), m1 = kvd_lanes16(n - 16);
            uint16_t *pt = w->p + (size_t)ch * 3 * 512;
            for (int j = 0; j < G; j++) {
                const float *pj = p + (size_t)j * stride + tc;
                uint16_t *const rows[3] = {pt + (size_t)j * 32, pt + (size_t)(rstep + j) * 32,
                                           pt + (size_t)(2 * rstep + j) * 32};
                kvd_split3(_mm512_maskz_loadu_ps(m0, pj), _mm512_maskz_loadu_ps(m1, pj + 16), rows);
            }
            /* the value rows as B tiles: pairs of rows interleaved, zeros past n */
            uint16_t *vt = w->v + (size_t)ch * vchunk;
            for (int r = 0; r < 16; r++) {
                const int t = tc + 2 * r;
                if (pf && 2 * r < n) prefetch_l2(pf + (size_t)t * rb, (2 * r + 1 < n ? 2 : 1) * rb);
                for (int c = 0; c < hd; c += 64) {
                    __m512i a0 = _mm512_setzero_si512(), b0 = a0, a1 = a0, b1 = a0;
                    if (2 * r < n) row_bf16(codes, vp + (size_t)t * rb, c, T, &a0, &b0);
                    if (2 * r + 1 < n) row_bf16(codes, vp + (size_t)(t + 1) * rb, c, T, &a1, &b1);
                    uint16_t *o = vt + (size_t)c / 16 * 512 + 32 * r;
                    _mm512_storeu_si512(o, _mm512_permutex2var_epi16(a0, lo_idx, a1));
                    _mm512_storeu_si512(o + 512, _mm512_permutex2var_epi16(a0, hi_idx, a1));
                    _mm512_storeu_si512(o + 1024, _mm512_permutex2var_epi16(b0, lo_idx, b1));
                    _mm512_storeu_si512(o + 1536, _mm512_permutex2var_epi16(b0, hi_idx, b1));
                }
            }
        }
        for (int d = 0; d < hd; d += 32) {
            float *c0 = acc + d, *c1 = acc + 16 * (size_t)hd + d;
            AMX_LOAD(0, c0, ast);
            AMX_LOAD(1, c0 + 16, ast);
            if (MT == 2) {
                AMX_LOAD(3, c1, ast);
                AMX_LOAD(4, c1 + 16, ast);
            }
            for (int ch = 0; ch < nch; ch++) {
                const uint16_t *pt = w->p + (size_t)ch * 3 * 512;
                const uint16_t *vt = w->v + (size_t)ch * vchunk + (size_t)d * 32;
                AMX_LOAD(5, vt, 64);
                AMX_LOAD(6, vt + 512, 64);
                AMX_LOAD(2, pt, 64);
                AMX_DP(0, 2, 5);
                AMX_DP(1, 2, 6);
                if (stacked) {
                    AMX_LOAD(3, pt + 512, 64);
                    AMX_LOAD(4, pt + 1024, 64);
                    AMX_DP(0, 3, 5);
                    AMX_DP(1, 3, 6);
                    AMX_DP(0, 4, 5);
                    AMX_DP(1, 4, 6);
                } else if (MT == 2) {
                    AMX_LOAD(7, pt + 512, 64);
                    AMX_DP(3, 7, 5);
                    AMX_DP(4, 7, 6);
                }
            }
            AMX_STORE(0, c0, ast);
            AMX_STORE(1, c0 + 16, ast);
            if (MT == 2) {
                AMX_STORE(3, c1, ast);
                AMX_STORE(4, c1 + 16, ast);
            }
        }
    }
}

/* The query's split as B tiles, per KV head [hd / 32][3 parts][16][32]:
 * word 2n + e of row r is dimension 32 c + 2 r + e of head n, so a head's
 * 32 dimensions of a chunk (16 dwords of pairs) are column n's dwords. */
KVD_AMX_FN static void amx_query(const float *qk, int n_heads, int kvh, int hd, uint16_t *qt) {
    const int G = n_heads / kvh, nc = hd / 32;
    uint32_t *qd = (uint32_t *)(void *)qt; /* a tile: 16 rows of 16 dwords */
    memset(qd, 0, sizeof(uint32_t) * 256 * (size_t)(kvh * nc * 3));
    for (int h = 0; h < kvh; h++)
        for (int j = 0; j < G; j++)
            for (int c = 0; c < nc; c++) {
                const float *x = qk + (size_t)(h * G + j) * hd + 32 * c;
                uint32_t parts[3][16];
                uint16_t *const rows[3] = {(uint16_t *)parts[0], (uint16_t *)parts[1],
                                           (uint16_t *)parts[2]};
                kvd_split3(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), rows);
                for (int part = 0; part < 3; part++) {
                    uint32_t *t = qd + ((size_t)(h * nc + c) * 3 + part) * 256;
                    for (int r = 0; r < 16; r++) t[16 * r + j] = parts[part][r];
                }
            }
}

/* The split outputs summed into out [kv_heads * G][hd] (packed: rows j,
 * G + j and 2G + j of a KV head's; stacked: row j) */
static void amx_sum_parts(const float *acc, int kvh, int G, int hd, float *out) {
    const int rows = amx_out_rows(G), packed = !amx_stacked_pv(G);
    for (int h = 0; h < kvh; h++)
        for (int j = 0; j < G; j++) {
            const float *a = acc + ((size_t)h * rows + j) * hd;
            float *o = out + (size_t)(h * G + j) * hd;
            if (packed)
                for (int d = 0; d < hd; d++)
                    o[d] = (a[d] + a[(size_t)G * hd + d]) + a[(size_t)2 * G * hd + d];
            else
                memcpy(o, a, sizeof(float) * (size_t)hd);
        }
}
#endif

/* Which path a view takes: the vector kernels want whole 64-value chunks
 * and a group size they were built for; NVFP4's take any. */
static int use_vector(const kvd_kv_view *kv, int G) {
    if (!vector_kernels() || kv->portable == KVD_ATTN_PORTABLE) return 0;
    if (kv->fmt == KVD_FMT_NVFP4) return 1; /* its own kernels: any G */
    return kv->head_dim % 64 == 0 && (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

/* Dimension of float slot k in the vector kernels' order, the same for the
 * query they read and the output they write: in each chunk of 64, four
 * vectors (even and odd values of the first 32 BF16 words, then of the
 * second 32; INT4's low and high nibbles alike), the words in the order the
 * FP8 decode leaves them. */
static int slot_dim(int codes, int k) {
    if (codes == CODES_INT8) return k;                                     /* natural order */
    if (codes == CODES_NVFP4) return k / 16 * 16 + k % 2 * 8 + k % 16 / 2; /* nvfp4_group's */
    int c = k / 64, u = (k % 64) / 16, i = k % 16, w = 32 * (u >> 1) + 2 * i + (u & 1);
    if (codes == CODES_BF16 || codes == CODES_INT4) return 64 * c + w; /* INT4: byte w / 2 */
    int part = w / 32, L = (w % 32) / 8;
    return 64 * c + 16 * L + 8 * part + w % 8;
}

#ifdef KVD_VEC
#define KVD_DISPATCH(CALL)                                                                         \
    switch (G) {                                                                                   \
    case 1:                                                                                        \
        CALL(1);                                                                                   \
        return;                                                                                    \
    case 2:                                                                                        \
        CALL(2);                                                                                   \
        return;                                                                                    \
    case 4:                                                                                        \
        CALL(4);                                                                                   \
        return;                                                                                    \
    case 8:                                                                                        \
        CALL(8);                                                                                   \
        return;                                                                                    \
    default:                                                                                       \
        CALL(16);                                                                                  \
        return;                                                                                    \
    }
#endif

/* How one call reads its cache, settled once per call: the vector kernels
 * (with the format's FP8 tables in registers) or the portable ones. */
typedef struct {
    int vec, codes, amx;
#ifdef KVD_VEC
    fp8_tables T;
    const uint16_t *qt; /* AMX: the query's split (amx_query), KV head by KV head */
#endif
} read_path;

/* The AMX kernels take a view the AVX-512 ones take, of BF16, FP8 or INT8
 * codes, at 8 or 16 query heads a KV head (qwen3-next-80b-a3b's and
 * qwen3.5-397b-a17b's attention). At 4 and fewer the AVX-512 multiply-adds
 * are not bound by arithmetic, and were faster. */
static int use_amx(const kvd_kv_view *kv, const read_path *rp, int G) {
    return amx_on && rp->vec && kv->portable != KVD_ATTN_NO_AMX && rp->codes != CODES_NVFP4 &&
           rp->codes != CODES_INT4 && (G == 8 || G == 16);
}

static void path_init(read_path *rp, const kvd_kv_view *kv, int G) {
    memset(rp, 0, sizeof *rp);
    rp->vec = use_vector(kv, G);
    rp->codes = kv->fmt == KVD_FMT_BF16    ? CODES_BF16
                : kv->fmt == KVD_FMT_NVFP4 ? CODES_NVFP4
                : kvd_fmt_int8(kv->fmt)    ? CODES_INT8
                : kv->fmt == KVD_FMT_I4T   ? CODES_INT4
                                           : CODES_FP8;
    rp->amx = use_amx(kv, rp, G);
#ifdef KVD_VEC
    if (rp->vec && rp->codes == CODES_FP8) tables_for(kv->fmt, &rp->T);
#endif
}

/* A part's AMX buffers in work, 64-byte aligned (amx_work_bytes each) */
static size_t amx_work_bytes(int n_heads, int hd) {
    return sizeof(uint16_t) * (size_t)hd * (32 + 128) + sizeof(uint16_t) * 4 * 3 * 512 +
           sizeof(float) * 256 + sizeof(float) * 4 * (size_t)n_heads * hd + 5 * 64;
}
static uint8_t *align64(uint8_t *p) {
    return p + ((64 - (uintptr_t)p % 64) % 64);
}
#ifdef KVD_VEC
static amx_work amx_work_at(uint8_t *base, int hd) {
    amx_work w;
    uint8_t *p = align64(base);
    w.k = (uint16_t *)(void *)p, p = align64(p + sizeof(uint16_t) * 32 * (size_t)hd);
    w.v = (uint16_t *)(void *)p, p = align64(p + sizeof(uint16_t) * 128 * (size_t)hd);
    w.p = (uint16_t *)(void *)p, p = align64(p + sizeof(uint16_t) * 4 * 3 * 512);
    w.c = (float *)(void *)p, p = align64(p + sizeof(float) * 256);
    w.acc = (float *)(void *)p;
    return w;
}
#endif

#ifdef KVD_VEC
/* NVFP4 rows (fp8.h), a 16-value group to one register, decoded where it
 * is used (a decoded tile of rows, written out and read back, cost more
 * than the decode). The group's 8 code bytes are broadcast to every 64-bit
 * lane; lane 2m shifts its dword (bytes 0-3) and lane 2m + 1 its dword
 * (bytes 4-7) right by 4m, so their low nibbles are codes m and 8 + m
 * (slot_dim's order); vpermps reads only an index's low 4 bits, from the 16
 * E2M1 values as floats, and the product with the group's block scale is
 * e2m1 * sf exactly, as the portable decode gives it. */
KVD_VEC_FN static inline __m512 nvfp4_table(void) {
    /* kvd_e2m1_to_f32 of codes 0-15 (unit_kvcache holds the decode to it) */
    static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return _mm512_loadu_ps(e2m1);
}

/* The query heads an NVFP4 tile takes together: the most of 8, 4, 2 and 1
 * that divides G. */
static inline int nvfp4_heads(int G) {
    return G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
}

KVD_VEC_FN static inline __m512i nvfp4_shifts(void) {
    return _mm512_set_epi32(28, 28, 24, 24, 20, 20, 16, 16, 12, 12, 8, 8, 4, 4, 0, 0);
}

KVD_VEC_FN static inline __m512 nvfp4_group(const uint8_t *row, int hd, int g, __m512 tab,
                                            __m512i shift, const float *e4) {
    uint64_t w;
    memcpy(&w, row + 8 * g, sizeof w);
    const __m512i idx = _mm512_srlv_epi32(_mm512_set1_epi64((long long)w), shift);
    return _mm512_mul_ps(_mm512_permutexvar_ps(idx, tab), _mm512_set1_ps(e4[row[hd / 2 + g]]));
}

/* x from here on in a register: the compiler would otherwise fold its load
 * into each multiply-add that reads it, a load per use */
#define KVD_IN_REGISTER(x) __asm__("" : "+v"(x))

/* Scores of H query heads (from j) against R = 16 / H rows: sixteen chains
 * of fused multiply-adds, each group of a row decoded once for the H heads
 * and each query vector loaded once for the R rows, summed in one sum16
 * (lane r H + i: row r, head j + i); n rows real (the rest repeat row 0,
 * their sums not stored). */
KVD_VEC_FN static inline __attribute__((always_inline)) void
nvfp4_dots(const uint8_t *const *row, int n, int hd, const float *e4, const float *q, int j, int H,
           float kmul, float *s, size_t stride) {
    const int R = 16 / H;
    const __m512 tab = nvfp4_table();
    const __m512i shift = nvfp4_shifts();
    __m512 a[16];
    for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
    for (int g = 0; g < hd / KVD_NVFP4_GROUP; g++) {
        __m512 qv[8];
        for (int i = 0; i < H; i++) {
            qv[i] = _mm512_loadu_ps(q + (size_t)(j + i) * hd + 16 * g);
            KVD_IN_REGISTER(qv[i]);
        }
        for (int r = 0; r < R; r++) {
            const __m512 k = nvfp4_group(row[r], hd, g, tab, shift, e4);
            for (int i = 0; i < H; i++) a[r * H + i] = _mm512_fmadd_ps(k, qv[i], a[r * H + i]);
        }
    }
    float out[16];
    _mm512_storeu_ps(out, _mm512_mul_ps(sum16(a), _mm512_set1_ps(kmul)));
    for (int r = 0; r < R && r < n; r++)
        for (int i = 0; i < H; i++) s[(size_t)(j + i) * stride + r] = out[r * H + i];
}

/* Tiles of H = nvfp4_heads(G) query heads by 16 / H rows. pf, when not NULL, is the next block's
 * rows: each row's fetch into L2 is started as the same row of this block is first read. */
KVD_VEC_FN static void scores_nvfp4(const uint8_t *kp, int nt, const float *q, int G, int hd,
                                    float kmul, float *s, size_t stride, const uint8_t *pf) {
    const size_t rb = kvd_nvfp4_row_bytes((size_t)hd);
    const float *e4 = kvd_e4m3_table();
    const int H = nvfp4_heads(G), R = 16 / H;
    for (int t0 = 0; t0 < nt; t0 += R) {
        const int n = nt - t0 < R ? nt - t0 : R;
        const uint8_t *row[16];
        for (int r = 0; r < R; r++) {
            row[r] = kp + (size_t)(t0 + (r < n ? r : 0)) * rb;
            if (pf && r < n) prefetch_l2(pf + (size_t)(t0 + r) * rb, rb);
        }
        for (int j = 0; j < G; j += H) {
            if (H == 8)
                nvfp4_dots(row, n, hd, e4, q, j, 8, kmul, s + t0, stride);
            else if (H == 4)
                nvfp4_dots(row, n, hd, e4, q, j, 4, kmul, s + t0, stride);
            else if (H == 2)
                nvfp4_dots(row, n, hd, e4, q, j, 2, kmul, s + t0, stride);
            else
                nvfp4_dots(row, n, hd, e4, q, j, 1, kmul, s + t0, stride);
        }
    }
}

/* acc[j][16 g ..] += p[j][t] v_t over the nt rows, for J query heads from
 * j0: J accumulators held across the rows, each group decoded once for them. */
KVD_VEC_FN static inline __attribute__((always_inline)) void
nvfp4_pv_group(const uint8_t *vp, size_t rb, int nt, int hd, const float *e4, int g, const float *p,
               size_t stride, int j0, int J, float *acc, const uint8_t *pf) {
    const __m512 tab = nvfp4_table();
    const __m512i shift = nvfp4_shifts();
    __m512 a[8];
    for (int i = 0; i < J; i++) a[i] = _mm512_loadu_ps(acc + (size_t)(j0 + i) * hd + 16 * g);
    for (int t = 0; t < nt; t++) {
        if (pf && g == 0 && j0 == 0) prefetch_l2(pf + (size_t)t * rb, rb);
        const __m512 v = nvfp4_group(vp + (size_t)t * rb, hd, g, tab, shift, e4);
        for (int i = 0; i < J; i++)
            a[i] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)(j0 + i) * stride + t]), v, a[i]);
    }
    for (int i = 0; i < J; i++) _mm512_storeu_ps(acc + (size_t)(j0 + i) * hd + 16 * g, a[i]);
}

/* P.V a group of 16 dimensions at a time, in J = nvfp4_heads(G) heads: the block's rows (18 KB at
 * head_dim 256 and 128 rows) stay in L1 across the groups. */
KVD_VEC_FN static void pv_nvfp4(const uint8_t *vp, int nt, const float *p, size_t stride, int G,
                                int hd, float *acc, const uint8_t *pf) {
    const size_t rb = kvd_nvfp4_row_bytes((size_t)hd);
    const float *e4 = kvd_e4m3_table();
    const int J = nvfp4_heads(G);
    for (int g = 0; g < hd / KVD_NVFP4_GROUP; g++)
        for (int j0 = 0; j0 < G; j0 += J) {
            if (J == 8)
                nvfp4_pv_group(vp, rb, nt, hd, e4, g, p, stride, j0, 8, acc, pf);
            else if (J == 4)
                nvfp4_pv_group(vp, rb, nt, hd, e4, g, p, stride, j0, 4, acc, pf);
            else if (J == 2)
                nvfp4_pv_group(vp, rb, nt, hd, e4, g, p, stride, j0, 2, acc, pf);
            else
                nvfp4_pv_group(vp, rb, nt, hd, e4, g, p, stride, j0, 1, acc, pf);
        }
}
#endif

static void scores_block(const kvd_kv_view *kv, const read_path *rp, const uint8_t *kp, int nt,
                         const float *q, int G, const float *zf, float kmul, float *s,
                         size_t stride, const uint8_t *pf, const void *amx, int kv_head) {
#ifdef KVD_VEC
    if (rp->amx) {
        const int hd = kv->head_dim;
        amx_scores(kp, nt, rp->qt + (size_t)kv_head * (hd / 32) * 3 * 512, G, hd,
                   kvd_pool_code_stride(kv->fmt, hd), rp->codes, &rp->T, kmul, s, stride, pf, amx);
        return;
    }
    if (rp->vec && rp->codes == CODES_NVFP4) {
        scores_nvfp4(kp, nt, q, G, kv->head_dim, kmul, s, stride, pf);
        return;
    }
    if (rp->vec) {
        int hd = kv->head_dim, codes = rp->codes;
        const size_t rb = kvd_pool_code_stride(kv->fmt, hd);
#define KVD_SCORES(g) scores_g##g(kp, nt, q, hd, rb, codes, &rp->T, zf, kmul, s, stride, pf)
        KVD_DISPATCH(KVD_SCORES)
#undef KVD_SCORES
    }
#endif
    (void)rp, (void)pf, (void)amx, (void)kv_head;
    scores_portable(kp, nt, q, G, kv->head_dim, kv->fmt, zf, kmul, s, stride);
}

/* (AMX: out is the KV head's split outputs, amx_out_rows(G) rows) */
static void pv_block(const kvd_kv_view *kv, const read_path *rp, const uint8_t *vp, int nt,
                     const float *p, size_t stride, int G, const float *zf, float *out,
                     const uint8_t *pf, const void *amx) {
#ifdef KVD_VEC
    if (rp->amx) {
        const int hd = kv->head_dim;
        amx_pv(vp, nt, p, stride, G, hd, kvd_pool_code_stride(kv->fmt, hd), rp->codes, &rp->T, out,
               pf, amx);
        return;
    }
    if (rp->vec && rp->codes == CODES_NVFP4) {
        pv_nvfp4(vp, nt, p, stride, G, kv->head_dim, out, pf);
        return;
    }
    if (rp->vec) {
        int hd = kv->head_dim, codes = rp->codes;
        const size_t rb = kvd_pool_code_stride(kv->fmt, hd);
#define KVD_PV(g) pv_g##g(vp, nt, p, stride, hd, rb, codes, &rp->T, zf, out, pf)
        KVD_DISPATCH(KVD_PV)
#undef KVD_PV
    }
#endif
    (void)rp, (void)pf, (void)amx;
    pv_portable(vp, nt, p, stride, G, kv->head_dim, kv->fmt, zf, out);
}

#ifdef KVD_VEC
/* exp(x) for x <= 0: 2^n * p(f), degree-6 polynomial on [-0.5, 0.5],
 * relative error below 2e-7; underflows cleanly to 0. */
KVD_VEC_FN static inline __m512 exp16(__m512 x) {
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

/* max_of's and exp_sum's 16s (the count they took in *done) */
KVD_VEC_FN static float max_of16(const float *x, int n, int *done) {
    __m512 v = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) v = _mm512_max_ps(_mm512_loadu_ps(x + i), v);
    *done = i;
    return _mm512_reduce_max_ps(v);
}

KVD_VEC_FN static double exp_sum16(float *x, int n, float m, int *done) {
    const __m512 vm = _mm512_set1_ps(m);
    double sum = 0.0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
        _mm512_storeu_ps(x + i, e);
        __m512d d = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
        sum += _mm512_reduce_add_pd(d);
    }
    *done = i;
    return sum;
}
#endif

/* The largest of n values (a NaN is passed over, as by the scalar loop; it
 * still poisons the sums). */
static float max_of(const float *x, int n) {
    float mx = -INFINITY;
    int i = 0;
#ifdef KVD_VEC
    if (vector_kernels()) mx = max_of16(x, n, &i);
#endif
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* exp(x - m) in place over n values; returns their sum (double). The
 * vector exp is not expf: on a CPU without the AVX-512 kernels, or under
 * KVD_CPU_ATTENTION=portable, the sums are expf's. */
static double exp_sum(float *x, int n, float m) {
    double sum = 0.0;
    int i = 0;
#ifdef KVD_VEC
    if (vector_kernels()) sum = exp_sum16(x, n, m, &i);
#endif
    for (; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    return sum;
}

/* out[j * ostride + t] = p[j * stride + t] * rs[t], the nt rows' own
 * scales (row_words), for G query heads (out may be p). */
static void row_scales(const float *rs, int nt, const float *p, size_t stride, int G, float *out,
                       size_t ostride) {
    for (int j = 0; j < G; j++) { /* a head at a time, its rows side by side: it vectorizes */
        const float *pj = p + (size_t)j * stride;
        float *oj = out + (size_t)j * ostride;
        for (int t = 0; t < nt; t++) oj[t] = pj[t] * rs[t];
    }
}

/* A part's scores: blocks [b0, b1) of the context, all heads, into s
 * [n_heads][n_ctx] (this part's columns), and m the part's maximum per
 * query head. Each block's pass asks for the same head's rows of the block
 * read next: the next block, at the end of the keys the first block's
 * values. */
static void part_scores(const kvd_kv_view *kv, const read_path *rp, const int32_t *blocks,
                        int n_ctx, int b0, int b1, const float *q, int n_heads, float sm_scale,
                        float *s, float *m, void *amx_buf) {
    const int hd = kv->head_dim, bs = kv->block_size, kvh = kv->kv_heads, G = n_heads / kvh;
    const int t_begin = b0 * bs, t_end = b1 * bs < n_ctx ? b1 * bs : n_ctx;
    const int own = kvd_fmt_row_scaled(kv->fmt);
    float rs[own ? bs : 1], zbuf[own ? bs : 1];
    const void *amx = NULL;
#ifdef KVD_VEC
    amx_work aw;
    if (rp->amx) aw = amx_work_at(amx_buf, hd), amx = &aw, kvd_amx_begin();
#else
    (void)amx_buf;
#endif
    for (int b = b0; b < b1; b++) {
        int t0 = b * bs, nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        for (int h = 0; h < kvh; h++) {
            const uint8_t *kp = head_base(kv, kv->k, blocks[b], h);
            float *sh = s + (size_t)h * G * n_ctx + t0;
            /* each key row's own scale, and (I4T) zero point, which the
             * kernels take off its codes, exactly, where the engine's kernel
             * takes Sum(q) z off each dot product of the raw codes: that
             * subtraction's FP32 cancellation would stand between the back
             * ends */
            const float *zf = own ? row_words(kp, kv->fmt, bs, hd, 0, nt, rs, zbuf) : NULL;
            scores_block(kv, rp, kp, nt, q + (size_t)h * G * hd, G, zf, sm_scale * kv->k_scale[h],
                         sh, (size_t)n_ctx,
                         b + 1 < b1 ? head_base(kv, kv->k, blocks[b + 1], h)
                                    : head_base(kv, kv->v, blocks[b0], h),
                         amx, h);
            if (own) row_scales(rs, nt, sh, (size_t)n_ctx, G, sh, (size_t)n_ctx);
        }
    }
#ifdef KVD_VEC
    if (rp->amx) kvd_amx_end();
#endif
    for (int j = 0; j < n_heads; j++)
        m[j] = max_of(s + (size_t)j * n_ctx + t_begin, t_end - t_begin);
}

/* FlashAttention 3's FP8 weights: 2^8 e in E4M3 (saturating), scaled back
 * by 2^-8 (exact). The vector path rounds in place of encoding: from 2^-6
 * (E4M3's least normal) the float's mantissa to 3 bits, to nearest even,
 * by integer arithmetic on its bits; below, to a multiple of 2^-9 (the
 * subnormal step). A NaN stays a NaN. unit_kvcache holds it bit for bit to
 * the codec (a NaN as a NaN). */
#ifdef KVD_VEC
KVD_VEC_FN static inline __m512 fp8_weight16(__m512 e) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 x = _mm512_mul_ps(e, _mm512_set1_ps(256.0f));
    __m512i u = _mm512_castps_si512(x), s = _mm512_and_si512(u, sign);
    __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, u));
    a = _mm512_min_ps(_mm512_set1_ps(448.0f), a); /* a NaN passes (the second operand) */
    __m512i ua = _mm512_castps_si512(a);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(ua, 20), _mm512_set1_epi32(1));
    __m512i rn =
        _mm512_and_si512(_mm512_add_epi32(ua, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), lsb)),
                         _mm512_set1_epi32((int)0xfff00000u));
    __m512 sub = _mm512_mul_ps(_mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                               _mm512_set1_ps(1.0f / 512.0f));
    const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
    __m512 r = _mm512_mask_blend_ps(small, _mm512_castsi512_ps(rn), sub);
    /* a NaN as it is: the rounding's carry could run into the sign */
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
    r = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), s));
    return _mm512_mul_ps(r, _mm512_set1_ps(1.0f / 256.0f));
}
#endif

#ifdef KVD_VEC
KVD_VEC_FN static size_t fp8_weights16(const float *e, size_t n, float *out) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, fp8_weight16(_mm512_loadu_ps(e + i)));
    return i;
}
#endif

void kvd_fp8_weights(const float *e, size_t n, float *out) {
    size_t i = 0;
#ifdef KVD_VEC
    if (vector_kernels()) i = fp8_weights16(e, n, out);
#endif
    for (; i < n; i++)
        out[i] = kvd_e4m3_to_f32(kvd_f32_to_e4m3(256.0f * e[i], 1)) * (1.0f / 256.0f);
}

static void round_weights(const float *p, size_t stride, int G, int nt, float *out) {
    for (int g = 0; g < G; g++) kvd_fp8_weights(p + (size_t)g * stride, (size_t)nt, out + g * nt);
}

/* The same part's weights exp(s - m) in place, l their sum per query head,
 * and out its unnormalised output [n_heads][head_dim] (kernel order). Each
 * block's pass asks for the next block's values, at the end of the values
 * the next part's first keys (the same thread's next part under a static
 * schedule). */
static void part_weigh(const kvd_kv_view *kv, const read_path *rp, const int32_t *blocks, int n_ctx,
                       int b0, int b1, int n_heads, float *s, float *out, const float *m, double *l,
                       void *amx_buf) {
    const int hd = kv->head_dim, bs = kv->block_size, kvh = kv->kv_heads, G = n_heads / kvh;
    const int t_begin = b0 * bs, t_end = b1 * bs < n_ctx ? b1 * bs : n_ctx;
    const int nb_all = (n_ctx + bs - 1) / bs;
    for (int j = 0; j < n_heads; j++)
        l[j] = exp_sum(s + (size_t)j * n_ctx + t_begin, t_end - t_begin, m[j]);
    memset(out, 0, sizeof(float) * (size_t)n_heads * hd);
    /* AMX: the KV heads' split outputs, summed into out at the end */
    const void *amx = NULL;
    float *acc = out;
    size_t acc_head = (size_t)G * hd;
#ifdef KVD_VEC
    amx_work aw;
    if (rp->amx) {
        aw = amx_work_at(amx_buf, hd), amx = &aw, kvd_amx_begin();
        acc = aw.acc, acc_head = (size_t)amx_out_rows(G) * hd;
        memset(acc, 0, sizeof(float) * acc_head * (size_t)kvh);
        memset(aw.p, 0, sizeof(uint16_t) * 4 * 3 * 512); /* the split's unused rows stay zero */
    }
#else
    (void)amx_buf;
#endif
    /* a block's FP8 weights, or its weights times each value row's own
     * scale (E4M3T, I8T, I4T), [G][nt]; the rows' own scales and (I4T)
     * zero points */
    const int rscaled = kvd_fmt_row_scaled(kv->fmt), own = kv->p_fp8 || rscaled;
    float block_w[own ? G * bs : 1], rs[rscaled ? bs : 1], zbuf[rscaled ? bs : 1];
    for (int b = b0; b < b1; b++) {
        int t0 = b * bs, nt = n_ctx - t0 < bs ? n_ctx - t0 : bs;
        for (int h = 0; h < kvh; h++) {
            const uint8_t *vp = head_base(kv, kv->v, blocks[b], h);
            const float *p = s + (size_t)h * G * n_ctx + t0;
            size_t stride = (size_t)n_ctx;
            if (kv->p_fp8) {
                round_weights(p, stride, G, nt, block_w);
                p = block_w, stride = (size_t)nt;
            }
            const float *zf = NULL;
            if (rscaled) {
                zf = row_words(vp, kv->fmt, bs, hd, 0, nt, rs, zbuf);
                row_scales(rs, nt, p, stride, G, block_w, (size_t)nt);
                p = block_w, stride = (size_t)nt;
            }
            pv_block(kv, rp, vp, nt, p, stride, G, zf, acc + (size_t)h * acc_head,
                     b + 1 < b1    ? head_base(kv, kv->v, blocks[b + 1], h)
                     : b1 < nb_all ? head_base(kv, kv->k, blocks[b1], h)
                                   : NULL,
                     amx);
        }
    }
#ifdef KVD_VEC
    if (rp->amx) {
        kvd_amx_end();
        amx_sum_parts(acc, kvh, G, hd, out);
    }
#endif
}

void kvd_fp8_query(const float *q, float *out, int rows, size_t row_stride, int n_heads,
                   int head_dim, const float *q_scale) {
    uint8_t codes[head_dim];
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_heads; h++) {
            const size_t at = (size_t)r * row_stride + (size_t)h * head_dim;
            kvd_quant_e4m3(q + at, codes, (size_t)head_dim, q_scale[h], 1, NULL);
            kvd_dequant_e4m3(codes, out + at, (size_t)head_dim, q_scale[h]);
        }
}

void kvd_absmax_heads(const float *x, int rows, size_t row_stride, size_t head_stride, int n_heads,
                      int head_dim, float *absmax) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < n_heads; h++) {
            const float *v = x + (size_t)r * row_stride + (size_t)h * head_stride;
            for (int k = 0; k < head_dim; k++) {
                const float a = fabsf(v[k]);
                if (a > absmax[h]) absmax[h] = a;
            }
        }
}

/* Work: the parts' sums, maxima and outputs, the query in kernel order, the
 * rotated query (I4T), the scores when the caller does not want them; then for the AMX kernels the
 * query's split (at most 6 head_dim words a query head: amx_query), 64-byte
 * aligned, and each part's buffers. One layout for kvd_attn_work_bytes and
 * kvd_attn_paged: its size, and with w its pointers into base. */
typedef struct {
    double *l;
    float *m, *pout, *qk, *qr, *s;
    uint16_t *qt;
    uint8_t *amx; /* part p's buffers at amx + p * amx_part */
    size_t amx_part;
} attn_work;

static size_t attn_layout(uint8_t *base, int n_heads, int hd, int n_ctx, int n_parts,
                          attn_work *w) {
    const size_t p = (size_t)n_parts, nh = (size_t)n_heads, q = nh * (size_t)hd;
    const size_t at_m = sizeof(double) * p * nh, at_pout = at_m + sizeof(float) * p * nh;
    const size_t at_qk = at_pout + sizeof(float) * p * q, at_qr = at_qk + sizeof(float) * q;
    const size_t at_s = at_qr + sizeof(float) * q;
    const size_t at_amx = at_s + sizeof(float) * nh * (size_t)n_ctx,
                 part = amx_work_bytes(n_heads, hd);
    if (w) {
        w->l = (double *)(void *)base;
        w->m = (float *)(void *)(base + at_m);
        w->pout = (float *)(void *)(base + at_pout);
        w->qk = (float *)(void *)(base + at_qk);
        w->qr = (float *)(void *)(base + at_qr);
        w->s = (float *)(void *)(base + at_s);
        w->qt = (uint16_t *)(void *)align64(base + at_amx);
        w->amx = (uint8_t *)(w->qt + 6 * q);
        w->amx_part = part;
    }
    return at_amx + 64 + sizeof(uint16_t) * 6 * q + p * part + 64;
}

size_t kvd_attn_work_bytes(int n_heads, int head_dim, int n_ctx, int n_parts) {
    return attn_layout(NULL, n_heads, head_dim, n_ctx, n_parts > 0 ? n_parts : 1, NULL);
}

const char *kvd_attn_kernels(void) {
    pthread_once(&attn_env_once, attn_env);
    return amx_on ? "AMX" : vec_on ? "AVX-512" : "portable";
}

void kvd_attn_paged_rotated(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                            int n_heads, float sm_scale, float *out, float *probs, void *work,
                            int n_parts) {
    const int hd = kv->head_dim, bs = kv->block_size, kvh = kv->kv_heads, G = n_heads / kvh;
    const int nb = (n_ctx + bs - 1) / bs;
    read_path rp;
    path_init(&rp, kv, G);
    if (n_parts < 1) n_parts = 1;
    if (n_parts > nb) n_parts = nb;
    attn_work w;
    attn_layout(work, n_heads, hd, n_ctx, n_parts, &w);
    double *l = w.l;
    float *m = w.m, *pout = w.pout, *qk = w.qk, *s = probs ? probs : w.s;
    uint16_t *qt = w.qt;
    uint8_t *amx_parts = w.amx;
    const size_t amx_part = w.amx_part;
    /* the query in the kernels' order of the dimensions, and back for the
     * output (the AMX kernels': natural) */
    int dim[hd];
    for (int k = 0; k < hd; k++) dim[k] = rp.vec && !rp.amx ? slot_dim(rp.codes, k) : k;
    for (int j = 0; j < n_heads; j++)
        for (int k = 0; k < hd; k++) qk[(size_t)j * hd + k] = q[(size_t)j * hd + dim[k]];
    if (kv->q_scale) /* the FP8 query, read back */
        kvd_fp8_query(qk, qk, 1, (size_t)n_heads * hd, n_heads, hd, kv->q_scale);
#ifdef KVD_VEC
    if (rp.amx) amx_query(qk, n_heads, kvh, hd, qt), rp.qt = qt;
#endif
    int per = (nb + n_parts - 1) / n_parts, used = (nb + per - 1) / per;
    if (!kv->p_fp8) { /* each part whole, against its own maximum */
#pragma omp parallel for schedule(static) if (used > 1)
        for (int p = 0; p < used; p++) {
            int b0 = p * per, b1 = b0 + per < nb ? b0 + per : nb;
            part_scores(kv, &rp, blocks, n_ctx, b0, b1, qk, n_heads, sm_scale, s,
                        m + (size_t)p * n_heads, amx_parts + (size_t)p * amx_part);
            part_weigh(kv, &rp, blocks, n_ctx, b0, b1, n_heads, s, pout + (size_t)p * n_heads * hd,
                       m + (size_t)p * n_heads, l + (size_t)p * n_heads,
                       amx_parts + (size_t)p * amx_part);
        }
    } else { /* FP8 weights are rounded against the row's maximum over every
                part: the scores first, then each part weighs against it (and
                the merge below rescales by 1) */
#pragma omp parallel for schedule(static) if (used > 1)
        for (int p = 0; p < used; p++) {
            int b0 = p * per, b1 = b0 + per < nb ? b0 + per : nb;
            part_scores(kv, &rp, blocks, n_ctx, b0, b1, qk, n_heads, sm_scale, s,
                        m + (size_t)p * n_heads, amx_parts + (size_t)p * amx_part);
        }
        for (int j = 0; j < n_heads; j++) {
            float M = -INFINITY;
            for (int p = 0; p < used; p++)
                M = m[(size_t)p * n_heads + j] > M ? m[(size_t)p * n_heads + j] : M;
            for (int p = 0; p < used; p++) m[(size_t)p * n_heads + j] = M;
        }
#pragma omp parallel for schedule(static) if (used > 1)
        for (int p = 0; p < used; p++) {
            int b0 = p * per, b1 = b0 + per < nb ? b0 + per : nb;
            part_weigh(kv, &rp, blocks, n_ctx, b0, b1, n_heads, s, pout + (size_t)p * n_heads * hd,
                       m + (size_t)p * n_heads, l + (size_t)p * n_heads,
                       amx_parts + (size_t)p * amx_part);
        }
    }
    /* merge the parts: rescale each to the global max */
    for (int j = 0; j < n_heads; j++) {
        float M = -INFINITY;
        for (int p = 0; p < used; p++)
            M = m[(size_t)p * n_heads + j] > M ? m[(size_t)p * n_heads + j] : M;
        double L = 0.0;
        float w[used];
        for (int p = 0; p < used; p++) {
            w[p] = expf(m[(size_t)p * n_heads + j] - M);
            L += w[p] * l[(size_t)p * n_heads + j];
        }
        float vmul = kv->v_scale[j / G];
        float *o = out + (size_t)j * hd;
        for (int k = 0; k < hd; k++) {
            double acc = 0.0;
            for (int p = 0; p < used; p++)
                acc += (double)w[p] * pout[((size_t)p * n_heads + j) * hd + k];
            o[dim[k]] = (float)(acc / L) * vmul;
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

void kvd_attn_paged(const kvd_kv_view *kv, const int32_t *blocks, int n_ctx, const float *q,
                    int n_heads, float sm_scale, float *out, float *probs, void *work,
                    int n_parts) {
    if (kv->fmt != KVD_FMT_I4T) {
        kvd_attn_paged_rotated(kv, blocks, n_ctx, q, n_heads, sm_scale, out, probs, work, n_parts);
        return;
    }
    /* the query rotated as the cache's rows are (in BF16), the softmax scale
     * over the rotation's gain; the output rotated back, over it, in BF16,
     * as the engine's */
    const int hd = kv->head_dim;
    attn_work w;
    attn_layout(work, n_heads, hd, n_ctx, n_parts < 1 ? 1 : n_parts, &w);
    kvd_rht_rows(q, w.qr, 1, 0, 0, n_heads, hd, 0);
    kvd_attn_paged_rotated(kv, blocks, n_ctx, w.qr, n_heads, sm_scale / (float)hd, out, probs, work,
                           n_parts);
    kvd_rht_rows(out, out, 1, 0, 0, n_heads, hd, 1);
}
