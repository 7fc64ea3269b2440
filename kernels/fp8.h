/* kvdrift: FP8 (E4M3, E5M2) and BF16 codecs, bit-exact with CUDA 13's
 * __nv_cvt_float_to_fp8 / __nv_cvt_fp8_to_halfraw and __float2bfloat16_rn. */
#ifndef KVD_FP8_H
#define KVD_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_E4M3_MAX 448.0f
#define KVD_E5M2_MAX 57344.0f

/* Scalar codecs. saturate = 1 is __NV_SATFINITE (overflow clamps to the
 * largest finite value), 0 is __NV_NOSAT (E4M3 overflow -> NaN, E5M2 -> Inf). */
uint8_t kvd_f32_to_e4m3(float x, int saturate);
uint8_t kvd_f32_to_e5m2(float x, int saturate);
float kvd_e4m3_to_f32(uint8_t v);
float kvd_e5m2_to_f32(uint8_t v);
uint16_t kvd_f32_to_bf16(float x);
float kvd_bf16_to_f32(uint16_t v);
/* The scale and element formats of 4-bit weight checkpoints (decode only):
 * E8M0 (MX block scales, UE8M0 FP8 scales) is 2^(v - 127), 0xff NaN, as
 * __nv_cvt_e8m0_to_bf16raw; E2M1 (NVFP4, MXFP4 elements) is the low four
 * bits of v, as __nv_cvt_fp4_to_halfraw. */
float kvd_e8m0_to_f32(uint8_t v);
float kvd_e2m1_to_f32(uint8_t v);
/* E2M1 encode, as __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
 * (cvt.rn.satfinite.e2m1x2.f32): round to nearest even on the grid 0, 0.5,
 * 1, 1.5, 2, 3, 4, 6, beyond 6 clamped to 6, NaN to +6; the code in the low
 * four bits. */
uint8_t kvd_f32_to_e2m1(float x);

/* Decode tables, one entry per code (256 floats each). */
const float *kvd_e4m3_table(void);
const float *kvd_e5m2_table(void);

/* What a quantized write did to its input: values clamped to the format's
 * maximum (or turned to NaN/Inf under NOSAT), and non-zero values that came
 * out as zero. */
typedef struct {
    uint64_t n;         /* values written */
    uint64_t saturated; /* |x / scale| beyond the largest finite value */
    uint64_t flushed;   /* x != 0 but encoded as +-0 */
    uint64_t subnormal; /* encoded as a subnormal code */
} kvd_qstats;

typedef enum {
    KVD_FMT_BF16 = 0,
    KVD_FMT_E4M3 = 1,
    KVD_FMT_E5M2 = 2,
    KVD_FMT_NVFP4 = 3,
    KVD_FMT_E4M3T = 4,  /* E4M3 with a scale per row (per token and KV head) */
    KVD_FMT_I8T = 5,    /* INT8 with a scale per row, written truncating */
    KVD_FMT_I8T_RN = 6, /* the same rows, written rounding to nearest */
    KVD_FMT_I4T = 7     /* INT4 with a zero point and a scale per row, rotated (RHT) */
} kvd_fmt;

/* The format predicates and row sizes below are the device kernels' too,
 * and constant expressions there (a kernel's template takes its format). */
#if defined(__CUDACC__)
#define KVD_HOSTDEV __host__ __device__
#else
#define KVD_HOSTDEV
#endif
#if defined(__cplusplus)
#define KVD_FMT_FN static inline constexpr KVD_HOSTDEV
#else
#define KVD_FMT_FN static inline KVD_HOSTDEV
#endif

/* Formats taken as ints, so that a format read as a number (the device
 * code's) needs no cast to test. The formats of whole rows of codes under
 * one scale a head (BF16, E4M3, E5M2). */
KVD_FMT_FN int kvd_fmt_per_head(int f) {
    return f == KVD_FMT_BF16 || f == KVD_FMT_E4M3 || f == KVD_FMT_E5M2;
}
/* The INT8 formats (I8T's rows, however written). */
KVD_FMT_FN int kvd_fmt_int8(int f) {
    return f == KVD_FMT_I8T || f == KVD_FMT_I8T_RN;
}
/* The formats whose rows carry their own scale (a float after the codes;
 * in a paged pool, after its block's codes: kvd_scaled_scale_at). */
KVD_FMT_FN int kvd_fmt_row_scaled(int f) {
    return f == KVD_FMT_E4M3T || kvd_fmt_int8(f) || f == KVD_FMT_I4T;
}
/* The bytes of codes in a row of n values: two INT4 codes a byte, else one
 * code (or BF16 word's worth: see kvd_fmt_row_bytes) a value. */
KVD_FMT_FN size_t kvd_fmt_code_bytes(int f, size_t n) {
    return f == KVD_FMT_I4T ? n / 2 : n;
}
/* The formats the device's tensor-core attention (decode v3 and the
 * tensor-core prefill) reads: the per-head ones, and the row-scaled ones of
 * a byte a code, whose row scales it applies to a stage's scores and
 * probabilities around its MMAs. */
KVD_FMT_FN int kvd_fmt_tensor_cores(int f) {
    return kvd_fmt_per_head(f) || (kvd_fmt_row_scaled(f) && f != KVD_FMT_I4T);
}
/* The formats the tensor-core prefill reads: those, and NVFP4, whose codes
 * it decodes into FP16 under their block scales a stage at a time. */
KVD_FMT_FN int kvd_fmt_prefill_tc(int f) {
    return kvd_fmt_tensor_cores(f) || f == KVD_FMT_NVFP4;
}
/* The formats decode v3 reads at head_dim hd (64, 128 or 256): the tensor-
 * core prefill's, NVFP4 from head_dim 128 on (a warp's quarter of a row of
 * values must fill the 16-byte rows ldmatrix reads: 32 codes). */
KVD_FMT_FN int kvd_fmt_decode_tc(int f, int hd) {
    return kvd_fmt_prefill_tc(f) && (f != KVD_FMT_NVFP4 || hd >= 128);
}

/* NVFP4, as the engines' NVFP4 KV caches store it: each group of 16 values
 * gets an E4M3 block scale and each value an E2M1 code, under a global
 * scale s (the layer's K or V scale; 1.0 where a checkpoint gives none).
 * With a the group's largest |x|:
 *     sf = cvt_e4m3_satfinite((a / 6) / s),  d = sf * s,
 *     code = cvt_e2m1(x / d)   (x * 0 where sf is 0),
 * read back as e2m1(code) * sf * s. Divisions and products are IEEE, rounded
 * to nearest: engines multiply by approximate reciprocals, which moves a
 * code only where x / d lands within an ulp of a rounding boundary. A row
 * of n values (n a multiple of 16) is n / 2 bytes of codes, value 2i in the
 * low nibble of byte i as cvt.rn.satfinite.e2m1x2 packs them, then the
 * n / 16 block scales. */
#define KVD_NVFP4_GROUP 16
#define KVD_E2M1_MAX 6.0f
KVD_FMT_FN size_t kvd_nvfp4_row_bytes(size_t n) {
    return n / 2 + n / KVD_NVFP4_GROUP;
}

/* E4M3 with a scale per row, as vLLM's fp8_per_token_head cache writes it:
 * each row (one token's K or V of one KV head) carries its own scale,
 *     s = max(a / 448, 1e-6),  code = cvt_e4m3_satfinite(x * (1 / s)),
 * read back as e4m3(code) * s, with a the row's largest |x|. The scale is a
 * float32, stored after the row's n codes (little-endian, as the device
 * writes it): n + 4 bytes a row. The reciprocal and the products are IEEE,
 * rounded to nearest, which is the engine's expression (a reciprocal
 * multiply, where the per-tensor modes divide). */
#define KVD_E4M3T_MIN_SCALE 1e-6f
KVD_FMT_FN size_t kvd_scaled_row_bytes(size_t n) {
    return n + 4;
}
/* In a paged pool such rows are split. A pool is segments of bs rows (seg
 * = block * kv_heads + head: one KV head's rows of one block): a segment's
 * bs rows of n codes side by side, then their bs scales, bs (n + 4) bytes
 * in all. A row's codes then start on a 16-byte boundary where n is a
 * multiple of 16 (the device copies them 16 bytes at a time; whole rows of
 * n + 4 bytes would be 4-aligned only). The byte offsets in the pool of
 * row slot of segment seg's codes and of its scale: */
KVD_FMT_FN size_t kvd_scaled_codes_at(size_t n, int bs, size_t seg, int slot) {
    return seg * (size_t)bs * (n + 4) + (size_t)slot * n;
}
KVD_FMT_FN size_t kvd_scaled_scale_at(size_t n, int bs, size_t seg, int slot) {
    return seg * (size_t)bs * (n + 4) + (size_t)bs * n + 4 * (size_t)slot;
}

/* INT8 with a scale per row, as vLLM's int8_per_token_head cache writes it
 * (its Triton write, triton_reshape_and_cache_flash_per_token_head_quant):
 *     s = max(a / 127, 1e-6),  code = trunc(clamp(x * (1 / s), -128, 127)),
 * read back as code * s. The float-to-int8 store truncates toward zero, as
 * a float stored to an int8 pointer does in Triton: every value loses up to
 * a whole step, not half of one, and values under s flush to zero. The
 * layout is E4M3T's: the n codes (two's complement), then s. I8T_RN rows
 * are the same but rounded to nearest even (where the clamp leaves them),
 * as the reference in vLLM's own tests of that write computes them. */
#define KVD_I8T_MAX 127.0f

/* INT4 with a zero point and a scale per row, as vLLM's int4_per_token_head
 * cache writes it (reshape_and_cache_int4). The row x (n values, n a power
 * of two) is first rotated by a randomized Hadamard transform,
 *     y = bf16(H (d * x)),
 * H the unnormalized n x n Hadamard matrix (H H = n I), applied by the
 * butterfly in FP32 (kvd_rht), and d the +-1 signs kvd_rht_sign gives; y is
 * rounded to BF16, the model's dtype, as the engine's rotation is. Then,
 * with lo and hi y's least and largest values,
 *     s = max((hi - lo) / 15, 1e-6),  z = clamp(round(-lo / s), 0, 15),
 *     code = clamp(round(fma(y, 1 / s, z)), 0, 15),
 * round() halves away from zero as (int)(v +- 0.5) in FP32 does. Two codes a
 * byte, value 2i in the low nibble of byte i; then s as a float32 whose
 * four low mantissa bits are replaced by z. A read takes s' (s with those
 * bits cleared) and z: y ~ (code - z) * s', exactly in FP32. Attention
 * rotates the query the same way (kvd_rht, rounded to BF16), divides the
 * softmax scale by n (the rotation's gain, squared), and rotates its output
 * back, over n. The engine's Triton write divides with the GPU's
 * approximate division; kvdrift's divisions are IEEE. */
#define KVD_I4T_SEED 0x9E3779B9u
#define KVD_I4T_MAX 15.0f
/* An I4T row's scale word, for both back ends: the float bits of s with
 * the zero point z in their four low bits (kvd_i4t_word), read back as the
 * bits of s' (kvd_i4t_scale_bits) and z (kvd_i4t_zero). */
KVD_FMT_FN uint32_t kvd_i4t_word(uint32_t scale_bits, int z) {
    return (scale_bits & ~15u) | (uint32_t)z;
}
KVD_FMT_FN uint32_t kvd_i4t_scale_bits(uint32_t word) {
    return word & ~15u;
}
KVD_FMT_FN int kvd_i4t_zero(uint32_t word) {
    return (int)(word & 15u);
}
/* The largest row kvd_rht takes (a power of two). */
#define KVD_RHT_MAX 4096

/* Vector codecs. Quantize writes cvt(x[i] / scale), exactly the engines'
 * expression (a reciprocal multiply rounds differently); stats may be NULL. */
void kvd_quant_e4m3(const float *x, uint8_t *out, size_t n, float scale, int saturate,
                    kvd_qstats *stats);
void kvd_quant_e5m2(const float *x, uint8_t *out, size_t n, float scale, int saturate,
                    kvd_qstats *stats);
void kvd_quant_bf16(const float *x, uint16_t *out, size_t n);
/* One NVFP4 row (see above). In the stats, saturated counts values clamped
 * to 6 beyond rounding (|x / d| >= 7, where a grid that went on would reach
 * 8), flushed non-zero values read back as zero (the whole group where sf
 * is 0), subnormal values under a subnormal block scale (sf < 2^-6, whose
 * own rounding is coarse). */
void kvd_quant_nvfp4(const float *x, uint8_t *out, size_t n, float scale, kvd_qstats *stats);
void kvd_dequant_nvfp4(const uint8_t *row, float *out, size_t n, float scale);
/* One E4M3 row with its own scale (see above), under a further scale
 * (1.0 in the cache's mode): the stats count as kvd_quant_e4m3's, except
 * that saturated counts only values beyond rounding (|x / s| > 464, where a
 * grid that went on would reach 480), as the row's largest value may land
 * an ulp above 448. The row's scale alone: kvd_row_scale. */
void kvd_quant_e4m3t(const float *x, uint8_t *out, size_t n, kvd_qstats *stats);
void kvd_dequant_e4m3t(const uint8_t *row, float *out, size_t n, float scale);
/* One INT8 row with its own scale (see above). In the stats, saturated
 * counts values the clamp moved (|x / s| >= 128: never for a row's own
 * scale, which puts its largest value at 127), flushed non-zero values read
 * back as zero (|x / s| < 1 truncating, <= 0.5 rounding); INT8 has no
 * subnormals. */
void kvd_quant_i8t(const float *x, uint8_t *out, size_t n, kvd_qstats *stats);
void kvd_quant_i8t_rn(const float *x, uint8_t *out, size_t n, kvd_qstats *stats);
void kvd_dequant_i8t(const uint8_t *row, float *out, size_t n, float scale);
/* One INT4 row (see above), x unrotated. In the stats, saturated counts
 * rotated values the clamp moved (a code past 15 or under 0: only where
 * the zero point's rounding shifts the grid), flushed non-zero rotated
 * values read back as zero (code = z). dequant gives the rotated values
 * (y's), times scale; kvd_i4t_scale a stored row's s' from its word. */
void kvd_quant_i4t(const float *x, uint8_t *out, size_t n, kvd_qstats *stats);
void kvd_dequant_i4t(const uint8_t *row, float *out, size_t n, float scale);
float kvd_i4t_scale(uint32_t word);
/* The randomized Hadamard transform of n values in place (n a power of two,
 * at most KVD_RHT_MAX): forward x = H (d * x), inverse x = d * (H x), in FP32
 * by the butterfly (at stride h = 1, 2, 4, ...: a + b, a - b), unnormalized:
 * inverse(forward(x)) = n x. kvd_rht_sign: d[i], +-1, the signs vLLM draws
 * for its rotation: bit 23 of output i of MT19937 seeded with
 * KVD_I4T_SEED, as torch.bernoulli(0.5) takes it from torch's CPU generator
 * (set: -1). */
void kvd_rht(float *x, size_t n, int inverse);
float kvd_rht_sign(size_t i);
/* The signs as bits (bit i % 32 of w[i / 32] set: -1): MT19937 (the
 * reference generator's initialisation and tempering) seeded with
 * KVD_I4T_SEED, bit 23 of each output. Here, for the device code's host
 * side too. */
typedef struct {
    uint32_t w[KVD_RHT_MAX / 32];
} kvd_rht_bits;
static inline void kvd_rht_sign_bits(kvd_rht_bits *b) {
    enum { N = 624, M = 397 };
    uint32_t mt[N];
    mt[0] = KVD_I4T_SEED;
    for (uint32_t i = 1; i < N; i++) mt[i] = 1812433253u * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i;
    int at = N;
    for (int k = 0; k < KVD_RHT_MAX; k++) {
        if (k % 32 == 0) b->w[k / 32] = 0;
        if (at == N) {
            for (int i = 0; i < N; i++) {
                const uint32_t y = (mt[i] & 0x80000000u) | (mt[(i + 1) % N] & 0x7fffffffu);
                mt[i] = mt[(i + M) % N] ^ (y >> 1) ^ (y & 1u ? 0x9908b0dfu : 0u);
            }
            at = 0;
        }
        uint32_t y = mt[at++];
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c5680u;
        y ^= (y << 15) & 0xefc60000u;
        y ^= y >> 18;
        b->w[k / 32] |= (y >> 23 & 1u) << (k % 32);
    }
}
/* Attention's rotations of int4-token, on rows of heads vectors of hd
 * values (src and dst rows src_stride and dst_stride floats apart; dst may
 * be src): forward, each vector kvd_rht'd and rounded to BF16 (the query);
 * inverse, kvd_rht's inverse over hd, rounded to BF16 (the output). The
 * CPU twin of kvd_cudaop_rht. */
void kvd_rht_rows(const float *src, float *dst, int rows, size_t src_stride, size_t dst_stride,
                  int heads, int hd, int inverse);

/* One cache row of n values in format fmt (a kvd_fmt), as the caches of
 * both back ends write it: E4M3 and E5M2 as cvt(x / scale), saturating or
 * not; NVFP4 under the global scale; E4M3T, I8T and I4T under their own
 * (scale and saturate unused); BF16 rounded (both unused). The row takes
 * kvd_fmt_row_bytes(fmt, n) bytes. stats may be NULL; BF16 counts its
 * values there and nothing else. */
void kvd_quant_row(int fmt, const float *x, uint8_t *out, size_t n, float scale, int saturate,
                   kvd_qstats *stats);
/* The scale a row of n codes carries (E4M3T, I8T; an I4T row's word, after
 * its n / 2 bytes of codes, reads through kvd_i4t_scale and kvd_i4t_zero). */
float kvd_row_scale(const uint8_t *row, size_t n);
void kvd_dequant_e4m3(const uint8_t *v, float *out, size_t n, float scale);
void kvd_dequant_e5m2(const uint8_t *v, float *out, size_t n, float scale);
void kvd_dequant_bf16(const uint16_t *v, float *out, size_t n);
/* Round every value to the nearest BF16, in place. */
void kvd_round_bf16(float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
