/* kvdrift: FP8/BF16 codec unit tests: decode tables against an independent
 * formula, fixed points of each format, rounding at ties and edges, vector
 * codecs against the scalar ones, and the saturation/flush counters. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "fp8.h"

/* value of an fp8 code from its fields, in double, written independently of
 * the library: (-1)^s * 2^(e - bias) * (1 + m / 2^mb), subnormal when e == 0 */
static double ref_decode(unsigned c, int eb, int mb) {
    int bias = (1 << (eb - 1)) - 1;
    unsigned s = c >> 7, e = (c >> mb) & ((1u << eb) - 1), m = c & ((1u << mb) - 1);
    double v = e == 0 ? ldexp((double)m / (1 << mb), 1 - bias)
                      : ldexp(1.0 + (double)m / (1 << mb), (int)e - bias);
    return s ? -v : v;
}

static void decode_tables(void **st) {
    (void)st;
    for (unsigned c = 0; c < 256; c++) {
        float a = kvd_e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(a));
        } else {
            assert_true(a == (float)ref_decode(c, 4, 3));
        }
        float b = kvd_e5m2_to_f32((uint8_t)c);
        unsigned e = (c >> 2) & 31, m = c & 3;
        if (e == 31 && m) {
            assert_true(isnan(b));
        } else if (e == 31) {
            assert_true(isinf(b) && (b < 0) == (c >> 7));
        } else {
            assert_true(b == (float)ref_decode(c, 5, 2));
        }
    }
    assert_true(kvd_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(kvd_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(kvd_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(kvd_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(kvd_e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(kvd_e5m2_to_f32(0x01) == 0x1p-16f);
    assert_true(kvd_e5m2_to_f32(0x04) == 0x1p-14f);
    assert_true(kvd_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(kvd_bf16_to_f32(0xc000) == -2.0f);
}

/* bits of x; a NaN as one pattern (any NaN is the decode of a NaN code) */
static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return isnan(x) ? 0x7fc00000u : u;
}

/* The row decodes (arithmetic, vectorized) against the tables, bit for bit:
 * every code in one call (the vector loop), each code alone (the scalar
 * tail), and times scales that round (a product of the table's value);
 * NVFP4's against kvd_e2m1_to_f32 times the E4M3 block scale. */
static void row_decodes(void **st) {
    (void)st;
    uint8_t codes[256 + 3];
    float out[256 + 3];
    const float scales[] = {1.0f, 0.37f, 3e-3f, -2.5f, 1e30f};
    for (int i = 0; i < 256 + 3; i++) codes[i] = (uint8_t)(i * 7 + 3); /* every code, shuffled */
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        const float sc = scales[si];
        for (int n = 1; n <= 256 + 3; n += 255) {
            kvd_dequant_e4m3(codes, out, (size_t)n, sc);
            for (int i = 0; i < n; i++)
                assert_int_equal(bits_of(out[i]), bits_of(kvd_e4m3_to_f32(codes[i]) * sc));
            kvd_dequant_e5m2(codes, out, (size_t)n, sc);
            for (int i = 0; i < n; i++)
                assert_int_equal(bits_of(out[i]), bits_of(kvd_e5m2_to_f32(codes[i]) * sc));
        }
        for (int c = 0; c < 256; c++) {
            const uint8_t one = (uint8_t)c;
            kvd_dequant_e4m3(&one, out, 1, sc);
            assert_int_equal(bits_of(out[0]), bits_of(kvd_e4m3_to_f32(one) * sc));
            kvd_dequant_e5m2(&one, out, 1, sc);
            assert_int_equal(bits_of(out[0]), bits_of(kvd_e5m2_to_f32(one) * sc));
        }
    }
    /* NVFP4: every code in both nibbles of a byte, under every block scale
     * (NaN and zero among them), 16 groups a row */
    enum { HD = 256 };
    uint8_t row[HD / 2 + HD / 16];
    float back[HD];
    for (int base = 0; base < 256; base += HD / 16) {
        for (int k = 0; k < HD / 2; k++) row[k] = (uint8_t)(k * 37 + base); /* every byte */
        for (int g = 0; g < HD / 16; g++) row[HD / 2 + g] = (uint8_t)(base + g);
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            kvd_dequant_nvfp4(row, back, HD, scales[si]);
            for (int i = 0; i < HD; i++) {
                const uint8_t c = (uint8_t)(i & 1 ? row[i / 2] >> 4 : row[i / 2] & 15u);
                const float sf = kvd_e4m3_to_f32(row[HD / 2 + i / 16]);
                assert_int_equal(bits_of(back[i]), bits_of(kvd_e2m1_to_f32(c) * sf * scales[si]));
            }
        }
    }
    /* signed zeros and the specials, spelled out */
    const uint8_t sp[6] = {0x00, 0x80, 0x7f, 0xff, 0x7c, 0xfc};
    kvd_dequant_e4m3(sp, out, 4, 1.0f);
    assert_true(out[0] == 0.0f && !signbit(out[0]) && out[1] == 0.0f && signbit(out[1]));
    assert_true(isnan(out[2]) && isnan(out[3]));
    kvd_dequant_e5m2(sp, out, 6, 1.0f);
    assert_true(isnan(out[2]) && isnan(out[3]));
    assert_true(out[4] == INFINITY && out[5] == -INFINITY);
}

static void round_trips(void **st) {
    (void)st;
    for (unsigned c = 0; c < 256; c++) {
        float a = kvd_e4m3_to_f32((uint8_t)c), b = kvd_e5m2_to_f32((uint8_t)c);
        if (!isnan(a)) assert_int_equal(kvd_f32_to_e4m3(a, 1), c);
        if (!isnan(b)) assert_int_equal(kvd_f32_to_e5m2(b, 0), c);
    }
    for (unsigned c = 0; c < 65536; c++) {
        float a = kvd_bf16_to_f32((uint16_t)c);
        if (!isnan(a)) assert_int_equal(kvd_f32_to_bf16(a), c);
    }
}

static void edges(void **st) {
    (void)st;
    /* E4M3: 448 + half an ulp (464) ties to the even 448; above it overflows */
    assert_int_equal(kvd_f32_to_e4m3(464.0f, 1), 0x7e);
    assert_int_equal(kvd_f32_to_e4m3(464.0f, 0), 0x7e);
    assert_int_equal(kvd_f32_to_e4m3(464.001f, 1), 0x7e);
    assert_int_equal(kvd_f32_to_e4m3(464.001f, 0), 0x7f);
    assert_int_equal(kvd_f32_to_e4m3(-1e9f, 1), 0xfe);
    assert_int_equal(kvd_f32_to_e4m3(-1e9f, 0), 0xff);
    assert_int_equal(kvd_f32_to_e4m3(INFINITY, 1), 0x7e);
    assert_int_equal(kvd_f32_to_e4m3(NAN, 1), 0x7f);
    assert_int_equal(kvd_f32_to_e4m3(-NAN, 0), 0x7f);
    /* subnormals: 2^-10 is half the smallest subnormal and ties to zero */
    assert_int_equal(kvd_f32_to_e4m3(0x1p-10f, 1), 0x00);
    assert_int_equal(kvd_f32_to_e4m3(-0x1p-10f, 1), 0x80);
    assert_int_equal(kvd_f32_to_e4m3(0x1.000002p-10f, 1), 0x01);
    assert_int_equal(kvd_f32_to_e4m3(0x1.8p-9f, 1), 0x02); /* 1.5 ulps ties to even 2 */
    assert_int_equal(kvd_f32_to_e4m3(0x1.4p-9f, 1), 0x01);
    assert_int_equal(kvd_f32_to_e4m3(0x1.fp-7f, 1), 0x08); /* rounds up into the normals */
    /* normal ties: 1 + 1/16 lies between 1 and 1.125 and ties to even (1.0) */
    assert_int_equal(kvd_f32_to_e4m3(1.0625f, 1), 0x38);
    assert_int_equal(kvd_f32_to_e4m3(1.1875f, 1), 0x3a);
    /* E5M2: 57344 + half an ulp = 61440 overflows (ties away into Inf) */
    assert_int_equal(kvd_f32_to_e5m2(61439.0f, 0), 0x7b);
    assert_int_equal(kvd_f32_to_e5m2(61440.0f, 0), 0x7c);
    assert_int_equal(kvd_f32_to_e5m2(61440.0f, 1), 0x7b);
    assert_int_equal(kvd_f32_to_e5m2(-INFINITY, 0), 0xfc);
    assert_int_equal(kvd_f32_to_e5m2(-INFINITY, 1), 0xfb);
    assert_int_equal(kvd_f32_to_e5m2(NAN, 1), 0x7f);
    assert_int_equal(kvd_f32_to_e5m2(0x1p-17f, 1), 0x00);
    assert_int_equal(kvd_f32_to_e5m2(0x1.8p-16f, 1), 0x02);
    /* BF16: round to nearest even on the dropped 16 bits, NaN canonical */
    assert_int_equal(kvd_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(kvd_f32_to_bf16(0x1.01p0f), 0x3f80);   /* tie, even stays */
    assert_int_equal(kvd_f32_to_bf16(0x1.03p0f), 0x3f82);   /* tie, odd rounds up */
    assert_int_equal(kvd_f32_to_bf16(0x1.0101p0f), 0x3f81); /* above the tie */
    assert_int_equal(kvd_f32_to_bf16(NAN), 0x7fff);
    assert_int_equal(kvd_f32_to_bf16(3.4028235e38f), 0x7f80); /* rounds to Inf */
}

static void vectors_and_stats(void **st) {
    (void)st;
    enum { N = 1000 };
    float x[N];
    uint8_t q[N];
    uint16_t h[N];
    float back[N];
    /* known content: 10 above E4M3's range, 20 that flush to zero, 30 subnormal */
    for (int i = 0; i < N; i++) x[i] = (float)(1 + i % 97) * 0.37f * (i % 2 ? -1.0f : 1.0f);
    for (int i = 0; i < 10; i++) x[i] = 500.0f + i;
    for (int i = 10; i < 30; i++) x[i] = 1e-4f;
    for (int i = 30; i < 60; i++) x[i] = 0x1p-8f;
    x[60] = 0.0f;
    kvd_qstats s = {0};
    kvd_quant_e4m3(x, q, N, 1.0f, 1, &s);
    assert_int_equal(s.n, N);
    assert_int_equal(s.saturated, 10);
    assert_int_equal(s.flushed, 20);
    assert_int_equal(s.subnormal, 30);
    for (int i = 0; i < N; i++) assert_int_equal(q[i], kvd_f32_to_e4m3(x[i], 1));
    /* scaled: stored cvt(x / scale), read back code * scale */
    kvd_qstats s2 = {0};
    kvd_quant_e4m3(x, q, N, 2.0f, 1, &s2);
    assert_int_equal(s2.saturated, 0);
    kvd_dequant_e4m3(q, back, N, 2.0f);
    for (int i = 0; i < N; i++) {
        assert_int_equal(q[i], kvd_f32_to_e4m3(x[i] / 2.0f, 1));
        assert_true(back[i] == kvd_e4m3_to_f32(q[i]) * 2.0f);
    }
    kvd_quant_e5m2(x, q, N, 0.5f, 0, NULL);
    for (int i = 0; i < N; i++) assert_int_equal(q[i], kvd_f32_to_e5m2(x[i] / 0.5f, 0));
    kvd_quant_bf16(x, h, N);
    kvd_dequant_bf16(h, back, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(h[i], kvd_f32_to_bf16(x[i]));
        assert_true(fabsf(back[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    }
    memcpy(back, x, sizeof x);
    kvd_round_bf16(back, N);
    for (int i = 0; i < N; i++) assert_true(back[i] == kvd_bf16_to_f32(kvd_f32_to_bf16(x[i])));
}

/* NVFP4 rows worked by hand (fp8.h's rule, global scale 1): codes, block
 * scales and what the counters say. */
static void nvfp4_by_hand(void **st) {
    (void)st;
    float x[64] = {6, 3,     1.25f, 0.75f, 0.3f,  0.25f, -2.5f, -5,
                   0, 0.01f, 7,     -7,    1.75f, 3.5f,  0.5f,  1};
    x[16] = 30000.0f; /* past 448 * 6: the block scale saturates, this value clamps */
    for (int i = 17; i < 32; i++) x[i] = 3000.0f;
    for (int i = 32; i < 48; i++) x[i] = 0.03f;  /* block scale 3 * 2^-9, an E4M3 subnormal */
    for (int i = 48; i < 64; i++) x[i] = 0.001f; /* block scale 0: the group flushes */
    uint8_t row[36];
    assert_int_equal(kvd_nvfp4_row_bytes(64), 36);
    kvd_qstats s = {0};
    kvd_quant_nvfp4(x, row, 64, 1.0f, &s);
    /* group 0: a = 7, sf = e4m3(7 / 6) = 1.125 (0x39); x / 1.125 rounds to
     * 6 3 1 0.5 0.5 0 -2 -4 0 0 6 -6 1.5 3 0.5 1 */
    const uint8_t want[36] = {0x57, 0x12, 0x01, 0xec, 0x00, 0xf7, 0x53, 0x21, 0x77,
                              0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77,
                              0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0,    0,    0,
                              0,    0,    0,    0,    0,    0x39, 0x7e, 0x03, 0x00};
    assert_memory_equal(row, want, 36);
    assert_int_equal(s.n, 64);
    assert_int_equal(s.saturated, 1);    /* 30000 / 448 = 67 */
    assert_int_equal(s.flushed, 2 + 16); /* 0.25 / 1.125 and 0.01; all of group 3 */
    assert_int_equal(s.subnormal, 16);   /* group 2 */
    float back[64];
    kvd_dequant_nvfp4(row, back, 64, 1.0f);
    assert_true(back[0] == 6.75f && back[6] == -2.25f && back[10] == 6.75f);
    assert_true(back[16] == 2688.0f && back[17] == 2688.0f);
    assert_true(back[32] == 6.0f * 3.0f * 0x1p-9f && back[48] == 0.0f);
    /* a global scale divides the block scale: the same codes at s = 2 for x * 2 */
    float x2[64];
    for (int i = 0; i < 16; i++) x2[i] = 2.0f * x[i];
    uint8_t row2[36];
    kvd_quant_nvfp4(x2, row2, 16, 2.0f, NULL);
    assert_memory_equal(row2, want, 8);
    assert_int_equal(row2[8], 0x39);
    kvd_dequant_nvfp4(row2, back, 16, 2.0f);
    assert_true(back[0] == 13.5f);
    /* E2M1 ties go to the even code; beyond 6 clamps; NaN is +6 */
    const float t[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 1e9f, -0.1f, NAN};
    const uint8_t tc[] = {0, 2, 2, 4, 4, 6, 6, 7, 8, 7};
    for (int i = 0; i < 10; i++) assert_int_equal(kvd_f32_to_e2m1(t[i]), tc[i]);
}

/* fp8-token rows (vLLM's fp8_per_token_head), worked by hand */
static void e4m3t_by_hand(void **st) {
    (void)st;
    /* absmax 3: s = 3 / 448, and x / s lands on 448 x / 3 */
    const float x[8] = {-3, 1.5f, 0.75f, 0.01f, 0, 1e-5f, 3, 2.9f};
    uint8_t row[12];
    assert_int_equal(kvd_scaled_row_bytes(8), 12);
    kvd_qstats q = {0};
    kvd_quant_e4m3t(x, row, 8, &q);
    /* -448, 224, 112, 1.493 -> 1.5, 0, 0.00149 -> 2^-9 (a subnormal), 448, 433 -> 448 */
    const uint8_t want[8] = {0xfe, 0x76, 0x6e, 0x3c, 0x00, 0x01, 0x7e, 0x7e};
    assert_memory_equal(row, want, 8);
    const float s = 3.0f / 448.0f;
    assert_memory_equal(row + 8, &s, 4); /* the scale, as a float after the codes */
    assert_true(kvd_row_scale(row, 8) == s);
    assert_int_equal(q.n, 8);
    assert_int_equal(q.saturated, 0);
    assert_int_equal(q.flushed, 0);
    assert_int_equal(q.subnormal, 1);
    float back[8];
    kvd_dequant_e4m3t(row, back, 8, 1.0f);
    assert_true(back[0] == -448.0f * s && back[3] == 1.5f * s && back[5] == 0x1p-9f * s);
    kvd_dequant_e4m3t(row, back, 8, 2.0f); /* a further scale multiplies */
    assert_true(back[1] == 224.0f * s * 2.0f);
    /* a row under 448e-6 takes the floor, 1e-6: 100 and 50 tie to 96 and 48 */
    const float tiny[8] = {1e-4f, -5e-5f, 0, 0, 0, 0, 0, 0};
    kvd_quant_e4m3t(tiny, row, 8, NULL);
    const uint8_t want_tiny[8] = {0x6c, 0xe4, 0, 0, 0, 0, 0, 0};
    assert_memory_equal(row, want_tiny, 8);
    assert_true(kvd_row_scale(row, 8) == 1e-6f);
    /* a zero row: the floor too, every code 0, nothing flushed */
    const float zero[8] = {0};
    kvd_qstats z = {0};
    kvd_quant_e4m3t(zero, row, 8, &z);
    assert_true(kvd_row_scale(row, 8) == 1e-6f && row[0] == 0 && row[7] == 0);
    assert_int_equal(z.flushed, 0);
}

/* int8-token rows (vLLM's int8_per_token_head), worked by hand: the
 * float-to-int8 store truncates toward zero */
static void i8t_by_hand(void **st) {
    (void)st;
    /* absmax 2.54: s = 0.02, and x / s lands on 50 x */
    const float x[8] = {-2.54f, 1.0f, 0.999f, -0.019f, 0.021f, 0, 2.54f, -1.27f};
    uint8_t row[12];
    kvd_qstats q = {0};
    kvd_quant_i8t(x, row, 8, &q);
    const float s = 2.54f / 127.0f, inv = 1.0f / s;
    /* -127; 1 / s = 50 (49.99..., truncated to 49 if below); 49.95 -> 49; -0.95 -> 0;
     * 1.05 -> 1; 0; 127; -63.5 -> -63 */
    const int8_t want[8] = {-127, (int8_t)(1.0f * inv), 49, 0, 1, 0, 127, -63};
    for (int i = 0; i < 8; i++) assert_int_equal((int8_t)row[i], want[i]);
    assert_true(want[1] == 49 || want[1] == 50);
    assert_memory_equal(row + 8, &s, 4);
    assert_int_equal(q.n, 8);
    assert_int_equal(q.saturated, 0);
    assert_int_equal(q.flushed, 1); /* -0.019: under one step */
    assert_int_equal(q.subnormal, 0);
    float back[8];
    kvd_dequant_i8t(row, back, 8, 1.0f);
    assert_true(back[0] == -127.0f * s && back[2] == 49.0f * s && back[7] == -63.0f * s);
    /* rounding would give 50 and -64 where truncation gives 49 and -63 */
    assert_true(back[2] < x[2] && back[7] > x[7]);
    /* rounding to nearest (int8-token-rn): 49.95 -> 50, -0.95 -> -1 (not
     * flushed), 1.05 -> 1, -63.5 -> -64 (the even one) */
    kvd_qstats r = {0};
    kvd_quant_i8t_rn(x, row, 8, &r);
    const int8_t want_rn[8] = {-127, 50, 50, -1, 1, 0, 127, -64};
    for (int i = 0; i < 8; i++) assert_int_equal((int8_t)row[i], want_rn[i]);
    assert_memory_equal(row + 8, &s, 4);
    assert_int_equal(r.flushed, 0);
    /* a tiny row takes the floor 1e-6: 1e-4 -> 100, -5.5e-5 -> -55 */
    const float tiny[8] = {1e-4f, -5.5e-5f, 0, 0, 0, 0, 0, 0};
    kvd_quant_i8t(tiny, row, 8, NULL);
    assert_true(kvd_row_scale(row, 8) == 1e-6f);
    assert_int_equal((int8_t)row[0], (int8_t)(1e-4f * 1e6f));
    assert_int_equal((int8_t)row[1], (int8_t)(-5.5e-5f * 1e6f));
    assert_true((int8_t)row[0] >= 99 && (int8_t)row[1] <= -54);
}

/* The rotation's signs, written out from the generator vLLM draws them
 * from (torch's CPU generator, MT19937, seeded 0x9E3779B9, through
 * torch.bernoulli(0.5)): the first 64 and the last 64 of the 4096 kvdrift
 * keeps, and how many are +1 ('+'). */
static void rht_signs(void **st) {
    (void)st;
    static const char first[] = "+-++----+--++-+-++--+++-+-+--++-+---++-++-+-++---------+-------+",
                      last[] = "+-++++---+++-+++-+-+-++-+-------++-+++-++++-+----++--++--+--++--";
    int plus = 0;
    for (int i = 0; i < KVD_RHT_MAX; i++) plus += kvd_rht_sign((size_t)i) > 0;
    assert_int_equal(plus, 1996);
    for (int i = 0; i < 64; i++) {
        assert_true(kvd_rht_sign((size_t)i) == (first[i] == '+' ? 1.0f : -1.0f));
        assert_true(kvd_rht_sign((size_t)(KVD_RHT_MAX - 64 + i)) ==
                    (last[i] == '+' ? 1.0f : -1.0f));
    }
}

/* The rotation against the Hadamard matrix written out (Sylvester's: entry
 * (i, j) is -1 to the number of bits i and j share), in double; integers
 * come through exactly, and the inverse of the forward is n times the row. */
static void rht_matrix(void **st) {
    (void)st;
    for (int n = 32; n <= 256; n *= 2) {
        float x[256], y[256], z[256];
        for (int i = 0; i < n; i++) x[i] = (float)((i * 37 % 23) - 11) * 0.37f + 0.01f * (float)i;
        memcpy(y, x, sizeof(float) * (size_t)n);
        kvd_rht(y, (size_t)n, 0);
        double norm = 0;
        for (int i = 0; i < n; i++) norm += (double)x[i] * x[i];
        for (int i = 0; i < n; i++) {
            double want = 0;
            for (int j = 0; j < n; j++)
                want += (__builtin_popcount((unsigned)(i & j)) % 2 ? -1.0 : 1.0) *
                        kvd_rht_sign((size_t)j) * x[j];
            assert_true(fabs(y[i] - want) <= 1e-6 * sqrt(norm * n));
        }
        memcpy(z, y, sizeof(float) * (size_t)n);
        kvd_rht(z, (size_t)n, 1);
        for (int i = 0; i < n; i++) assert_true(fabsf(z[i] / (float)n - x[i]) <= 1e-5f);
        for (int i = 0; i < n; i++) x[i] = (float)(i % 7) - 3.0f; /* integers: exact */
        memcpy(y, x, sizeof(float) * (size_t)n);
        kvd_rht(y, (size_t)n, 0);
        kvd_rht(y, (size_t)n, 1);
        for (int i = 0; i < n; i++) assert_true(y[i] == (float)n * x[i]);
    }
}

/* int4-token rows (vLLM's int4_per_token_head), worked by hand. x is made
 * as the rotation's inverse of a chosen y, over n (exact: small integers
 * and halves), so that the write's rotation gives y back exactly. */
static void i4t_row(const float *y, float *x, int n) {
    memcpy(x, y, sizeof(float) * (size_t)n);
    kvd_rht(x, (size_t)n, 1);
    for (int i = 0; i < n; i++) x[i] /= (float)n;
}

static void i4t_by_hand(void **st) {
    (void)st;
    enum { N = 64 };
    float y[N], x[N], back[N];
    uint8_t row[N / 2 + 4];
    kvd_qstats qs = {0};
    /* y from -8 to 7 by ones: s = 15 / 15 = 1, z = 8, code = y + 8; and
     * two halves, which round away from zero as (int)(v + 0.5) does: 0.5
     * -> 8.5 -> 9, -7.5 -> 0.5 -> 1 (to nearest even: 8 and 0); 0.25 reads
     * back as zero (code 8: flushed) */
    for (int i = 0; i < N; i++) y[i] = (float)(i % 16) - 8.0f;
    y[20] = 0.5f, y[33] = -7.5f, y[5] = 0.25f;
    i4t_row(y, x, N);
    kvd_quant_i4t(x, row, N, &qs);
    for (int i = 0; i < N; i++) {
        const int want = i == 20   ? 9
                         : i == 33 ? 1
                         : i == 5  ? 8
                                   : i % 16,
                  got = i % 2 ? row[i / 2] >> 4 : row[i / 2] & 15;
        assert_int_equal(got, want);
    }
    uint32_t bits;
    memcpy(&bits, row + N / 2, 4);
    assert_int_equal(bits, 0x3f800008u); /* 1.0f, zero point 8 in the low bits */
    assert_true(kvd_i4t_scale(bits) == 1.0f && kvd_i4t_zero(bits) == 8);
    assert_true(qs.n == N && qs.saturated == 0 && qs.flushed == 1);
    kvd_dequant_i4t(row, back, N, 1.0f);
    for (int i = 0; i < N; i++)
        assert_true(back[i] == (i == 20 ? 1.0f : i == 33 ? -7.0f : i == 5 ? 0.0f : y[i]));
    /* all above zero, from 2 to 17: s = 1, z = round(-2) clamped to 0, the
     * codes of 16 and 17 clamped to 15 (saturated) */
    for (int i = 0; i < N; i++) y[i] = (float)(2 + i % 16);
    i4t_row(y, x, N);
    memset(&qs, 0, sizeof qs);
    kvd_quant_i4t(x, row, N, &qs);
    assert_true(qs.saturated == 2 * N / 16 && qs.flushed == 0);
    memcpy(&bits, row + N / 2, 4);
    assert_int_equal(bits, 0x3f800000u);
    assert_int_equal(row[7] >> 4, 15); /* y[15] = 17 */
    /* a flat row: s is the 1e-6 floor, its low bits cleared */
    for (int i = 0; i < N; i++) x[i] = 0.0f;
    memset(&qs, 0, sizeof qs);
    kvd_quant_i4t(x, row, N, &qs);
    memcpy(&bits, row + N / 2, 4);
    float floor_ = 1e-6f;
    uint32_t fb;
    memcpy(&fb, &floor_, 4);
    assert_int_equal(bits, fb & ~15u);
    assert_true(qs.flushed == 0 && row[0] == 0);
    /* the generic row write takes the format */
    uint8_t row2[N / 2 + 4];
    i4t_row(y, x, N);
    kvd_quant_i4t(x, row, N, NULL);
    kvd_quant_row(KVD_FMT_I4T, x, row2, N, 0.0f, 1, NULL);
    assert_memory_equal(row, row2, sizeof row);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nvfp4_by_hand),     cmocka_unit_test(e4m3t_by_hand),
        cmocka_unit_test(i8t_by_hand),       cmocka_unit_test(i4t_by_hand),
        cmocka_unit_test(rht_signs),         cmocka_unit_test(rht_matrix),
        cmocka_unit_test(decode_tables),     cmocka_unit_test(row_decodes),
        cmocka_unit_test(round_trips),       cmocka_unit_test(edges),
        cmocka_unit_test(vectors_and_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
