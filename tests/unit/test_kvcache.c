/* kvdrift: paged KV cache and attention kernel tests: block tables across
 * interleaved sequences, quantize-on-write bytes and counters in every mode,
 * and the paged attention kernel against a double-precision reference. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runners/kvcache.h"
#include "../../runners/weights.h"

enum { L = 2, KVH = 2, HD = 64, BS = 16 };

static void fill(float *x, int n, uint64_t key, float scale) {
    for (int i = 0; i < n; i++) x[i] = scale * kvd_rng_normal(key, (uint64_t)i);
}

static void paging(void **st) {
    (void)st;
    kvd_kvcache c;
    char err[KVD_ERR_LEN];
    assert_int_equal(kvd_kvcache_init(&c, KVD_KV_BF16, L, KVH, HD, BS, 100, NULL, 1, err), 0);
    assert_int_equal(c.n_blocks, 7); /* 100 tokens in blocks of 16 */
    int a = kvd_kvcache_add_seq(&c), b = kvd_kvcache_add_seq(&c);
    assert_int_equal(kvd_kvcache_reserve(&c, a, 40), 0); /* 3 blocks */
    assert_int_equal(kvd_kvcache_reserve(&c, b, 60), 0); /* 4 blocks */
    assert_int_equal(c.n_free, 0);
    assert_int_equal(kvd_kvcache_reserve(&c, a, 49), -1); /* would need a 4th */
    /* interleaved writes land in each sequence's own blocks */
    float k[KVH * HD], v[KVH * HD], row[HD];
    for (int t = 0; t < 40; t++) {
        fill(k, KVH * HD, 100 + (uint64_t)t, 1.0f);
        fill(v, KVH * HD, 200 + (uint64_t)t, 1.0f);
        kvd_kvcache_write(&c, 1, a, t, k, v);
        fill(k, KVH * HD, 300 + (uint64_t)t, 1.0f);
        kvd_kvcache_write(&c, 1, b, t, k, v);
    }
    kvd_kv_view view = kvd_kvcache_view(&c, 1);
    for (int t = 0; t < 40; t++) {
        fill(k, KVH * HD, 100 + (uint64_t)t, 1.0f);
        fill(v, KVH * HD, 200 + (uint64_t)t, 1.0f);
        for (int h = 0; h < KVH; h++) {
            kvd_kv_row(&view, 0, c.seqs[a].blocks, t, h, row);
            for (int i = 0; i < HD; i++)
                assert_true(row[i] == kvd_bf16_to_f32(kvd_f32_to_bf16(k[h * HD + i])));
            kvd_kv_row(&view, 1, c.seqs[a].blocks, t, h, row);
            for (int i = 0; i < HD; i++)
                assert_true(row[i] == kvd_bf16_to_f32(kvd_f32_to_bf16(v[h * HD + i])));
        }
    }
    assert_int_equal(c.seqs[a].len, 40);
    kvd_kvcache_release(&c, a);
    assert_int_equal(c.n_free, 3);
    int d = kvd_kvcache_add_seq(&c);
    assert_int_equal(d, a); /* the slot is reused */
    assert_int_equal(kvd_kvcache_reserve(&c, d, 48), 0);
    kvd_kvcache_free(&c);
}

/* NVFP4 by its definition, written out apart from kvd_quant_nvfp4: each
 * group's block scale, then the nearest E2M1 value by search (ties to the
 * even code); row must read back as that exactly. */
static void nvfp4_reference(const float *x, float s, const float *row) {
    for (int g = 0; g < HD / 16; g++) {
        double a = 0;
        for (int i = 0; i < 16; i++) a = fmax(a, fabs(x[g * 16 + i]));
        const float sf = kvd_e4m3_to_f32(kvd_f32_to_e4m3(((float)a / 6.0f) / s, 1)), d = sf * s;
        for (int i = 0; i < 16; i++) {
            const float y = d > 0 ? x[g * 16 + i] / d : 0.0f;
            int best = 0;
            for (int c = 1; c < 8; c++) {
                const double e = fabs(fabs(y) - kvd_e2m1_to_f32((uint8_t)c)),
                             eb = fabs(fabs(y) - kvd_e2m1_to_f32((uint8_t)best));
                if (e < eb || (e == eb && c % 2 == 0)) best = c;
            }
            const float want = (y < 0 ? -1.0f : 1.0f) * kvd_e2m1_to_f32((uint8_t)best) * sf * s;
            assert_true(row[g * 16 + i] == want || (want == 0 && row[g * 16 + i] == 0));
        }
    }
}

/* fp8-token by its definition (vLLM's fp8_per_token_head): the row's own
 * scale max(absmax / 448, 1e-6), the codes of x times its reciprocal; row
 * must read back as that exactly. Returns the row's subnormal codes. */
static int fp8_token_reference(const float *x, const float *row) {
    float a = 0.0f;
    for (int i = 0; i < HD; i++) a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    const float s = a / 448.0f > 1e-6f ? a / 448.0f : 1e-6f, inv = 1.0f / s;
    int sub = 0;
    for (int i = 0; i < HD; i++) {
        const uint8_t q = kvd_f32_to_e4m3(x[i] * inv, 1);
        assert_true(row[i] == kvd_e4m3_to_f32(q) * s);
        sub += (q & 0x78) == 0 && (q & 7) != 0;
    }
    return sub;
}

/* Row x rotated as int4-token's write rotates it (kvd_rht, which
 * unit_codecs holds to the Hadamard matrix), in BF16: y. */
static void int4_rotated(const float *x, float *y) {
    memcpy(y, x, sizeof(float) * HD);
    kvd_rht(y, HD, 0);
    kvd_round_bf16(y, HD);
}

/* int4-token by its definition (vLLM's int4_per_token_head) on the rotated
 * row y: the scale (hi - lo) / 15, the zero point round(-lo / s), each code
 * round(y / s + z) (the product and sum exact in double, rounded once to
 * float as a fused multiply-add is), halves away from zero, clamped to
 * 0-15; row (read back and rotated again by the caller) must be (code - z)
 * s', s' the scale with its four low bits cleared, to within the two
 * rotations' rounding. Returns the row's values flushed to zero. */
static int int4_token_reference(const float *x, const float *row) {
    float y[HD], lo = INFINITY, hi = -INFINITY;
    int4_rotated(x, y);
    for (int i = 0; i < HD; i++) lo = y[i] < lo ? y[i] : lo, hi = y[i] > hi ? y[i] : hi;
    const float s = (hi - lo) / 15.0f > 1e-6f ? (hi - lo) / 15.0f : 1e-6f, inv = 1.0f / s;
    const float zf = -lo / s;
    const int z0 = zf >= 0 ? (int)(zf + 0.5f) : (int)(zf - 0.5f), z = z0 < 0    ? 0
                                                                      : z0 > 15 ? 15
                                                                                : z0;
    uint32_t bits;
    memcpy(&bits, &s, 4);
    bits &= ~15u;
    float st;
    memcpy(&st, &bits, 4);
    int ftz = 0;
    for (int i = 0; i < HD; i++) {
        const float v = (float)((double)y[i] * inv + z);
        const int r = v >= 0 ? (int)(v + 0.5f) : (int)(v - 0.5f), q = r < 0 ? 0 : r > 15 ? 15 : r;
        assert_true(fabsf(row[i] - (float)(q - z) * st) <= 1e-5f * (hi - lo));
        ftz += q == z && y[i] != 0;
    }
    return ftz;
}

/* int8-token by its definition (vLLM's int8_per_token_head): the row's own
 * scale max(absmax / 127, 1e-6), x times its reciprocal clamped to [-128,
 * 127] and truncated toward zero (rn: rounded to nearest even); row must
 * read back as that exactly.
 * Returns the row's values flushed to zero. */
static int int8_token_reference(const float *x, const float *row, int rn) {
    float a = 0.0f;
    for (int i = 0; i < HD; i++) a = fabsf(x[i]) > a ? fabsf(x[i]) : a;
    const float s = a / 127.0f > 1e-6f ? a / 127.0f : 1e-6f, inv = 1.0f / s;
    int ftz = 0;
    for (int i = 0; i < HD; i++) {
        const double y = fmin(fmax((double)(x[i] * inv), -128.0), 127.0);
        const double q = rn ? nearbyint(y) : y < 0 ? ceil(y) : floor(y);
        assert_true(row[i] == (float)q * s);
        ftz += q == 0 && x[i] != 0;
    }
    return ftz;
}

static void modes(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, L, KVH);
    for (int i = 0; i < L * KVH; i++) sc.k[i] = 0.5f + (float)i, sc.v[i] = 0.001f * (float)(i + 1);
    float k[KVH * HD], v[KVH * HD], row[HD];
    fill(k, KVH * HD, 1, 30.0f);
    k[5] = 600.0f, k[70] = -900.0f; /* key outliers beyond 448 at scale 1 */
    fill(v, KVH * HD, 2, 0.004f);   /* V mostly below E4M3's smallest normal, 2^-6 */
    for (int mi = 0; mi < KVD_KV_N_MODES; mi++) {
        kvd_kv_mode mode = (kvd_kv_mode)mi;
        kvd_kvcache c;
        assert_int_equal(kvd_kvcache_init(&c, mode, L, KVH, HD, BS, 32, &sc, 1, err), 0);
        int s = kvd_kvcache_add_seq(&c);
        kvd_kvcache_reserve(&c, s, 1);
        kvd_kvcache_write(&c, 0, s, 0, k, v);
        kvd_kv_view view = kvd_kvcache_view(&c, 0);
        uint64_t sat = 0, sub = 0, ksub = 0;
        for (int h = 0; h < KVH; h++) {
            const int nv = kvd_kv_mode_fmt(mode) == KVD_FMT_NVFP4;
            float ks = kvd_kv_mode_scaled(mode) ? sc.k[h] : 1.0f;
            float vs = kvd_kv_mode_scaled(mode) ? sc.v[h] : 1.0f;
            if (mode == KVD_KV_NVFP4_CAL) ks /= 6.0f, vs /= 6.0f; /* FP8's scale over E2M1's 6 */
            kvd_kv_row(&view, 0, c.seqs[s].blocks, 0, h, row);
            if (mode == KVD_KV_INT4_TOKEN) { /* read back in the model's basis: rotated again */
                kvd_rht(row, HD, 0);
                ksub += (uint64_t)int4_token_reference(k + h * HD, row);
                kvd_kv_row(&view, 1, c.seqs[s].blocks, 0, h, row);
                kvd_rht(row, HD, 0);
                sub += (uint64_t)int4_token_reference(v + h * HD, row);
                continue;
            }
            if (mode == KVD_KV_INT8_TOKEN || mode == KVD_KV_INT8_TOKEN_RN) {
                const int rn = mode == KVD_KV_INT8_TOKEN_RN;
                ksub += (uint64_t)int8_token_reference(k + h * HD, row, rn);
                kvd_kv_row(&view, 1, c.seqs[s].blocks, 0, h, row);
                sub += (uint64_t)int8_token_reference(v + h * HD, row, rn);
                continue;
            }
            if (mode == KVD_KV_FP8_TOKEN) {
                ksub += (uint64_t)fp8_token_reference(k + h * HD, row);
                kvd_kv_row(&view, 1, c.seqs[s].blocks, 0, h, row);
                sub += (uint64_t)fp8_token_reference(v + h * HD, row);
                continue;
            }
            if (nv) {
                nvfp4_reference(k + h * HD, ks, row);
                kvd_kv_row(&view, 1, c.seqs[s].blocks, 0, h, row);
                nvfp4_reference(v + h * HD, vs, row);
                continue;
            }
            for (int i = 0; i < HD; i++) {
                float x = k[h * HD + i], want;
                if (mode == KVD_KV_BF16) {
                    want = kvd_bf16_to_f32(kvd_f32_to_bf16(x));
                } else if (mode == KVD_KV_FP8_E5M2) {
                    want = kvd_e5m2_to_f32(kvd_f32_to_e5m2(x, 1));
                } else {
                    want = kvd_e4m3_to_f32(kvd_f32_to_e4m3(x / ks, 1)) * ks;
                    sat += fabsf(x / ks) > 448.0f;
                }
                assert_true(row[i] == want);
            }
            kvd_kv_row(&view, 1, c.seqs[s].blocks, 0, h, row);
            for (int i = 0; i < HD; i++) {
                float x = v[h * HD + i];
                if (mode == KVD_KV_FP8_CAL || mode == KVD_KV_FP8_UNSCALED ||
                    mode == KVD_KV_FP8_CKPT) {
                    uint8_t q = kvd_f32_to_e4m3(x / vs, 1);
                    assert_true(row[i] == kvd_e4m3_to_f32(q) * vs);
                    sub += (q & 0x78) == 0 && (q & 7) != 0;
                }
            }
        }
        if (mode == KVD_KV_FP8_UNSCALED) {
            assert_true(sat > 0);
            assert_int_equal(c.k_stats[0].saturated, sat);
            assert_int_equal(c.v_stats[0].subnormal, sub);
            assert_true(sub > HD / 2); /* the failure the project exists to show */
        }
        if (mode == KVD_KV_FP8_CAL) assert_int_equal(c.k_stats[0].saturated, sat);
        if (mode == KVD_KV_INT8_TOKEN || mode == KVD_KV_INT8_TOKEN_RN) { /* here sub and ksub
                                                                             count flushed values */
            assert_int_equal(c.k_stats[0].saturated, 0);
            assert_int_equal(c.k_stats[0].flushed, ksub);
            assert_int_equal(c.v_stats[0].flushed, sub);
            assert_int_equal(c.k_stats[0].subnormal + c.v_stats[0].subnormal, 0);
            assert_true(ksub > 0); /* the key outliers leave the rest a few steps */
        }
        if (mode == KVD_KV_INT4_TOKEN) { /* sub and ksub count flushed values */
            assert_int_equal(c.k_stats[0].flushed, ksub);
            assert_int_equal(c.v_stats[0].flushed, sub);
            assert_int_equal(c.k_stats[0].subnormal + c.v_stats[0].subnormal, 0);
            /* the rotation spreads the key outliers over the row: its codes
             * use the whole grid, and few values flush */
            assert_true(ksub < KVH * HD / 4);
        }
        if (mode == KVD_KV_FP8_TOKEN) { /* the outliers fit, and V keeps its precision */
            assert_int_equal(c.k_stats[0].saturated, 0);
            assert_int_equal(c.k_stats[0].subnormal, ksub);
            assert_int_equal(c.v_stats[0].subnormal, sub);
            assert_true(sub < HD / 8);
            assert_true(view.k_scale[0] == 1.0f && view.v_scale[1] == 1.0f);
        }
        assert_int_equal(c.k_stats[0].n, KVH * HD);
        kvd_kvcache_free(&c);
    }
    /* fp8-cal without scales is refused */
    kvd_kvcache c;
    assert_int_equal(kvd_kvcache_init(&c, KVD_KV_FP8_CAL, L, KVH, HD, BS, 32, NULL, 1, err), -1);
    assert_non_null(strstr(err, "fp8-cal"));
    sc.v[1] = -1.0f;
    assert_int_equal(kvd_kvcache_init(&c, KVD_KV_FP8_CAL, L, KVH, HD, BS, 32, &sc, 1, err), -1);
    assert_non_null(strstr(err, "expected positive finite scales"));
    kvd_kv_scales_free(&sc);
}

/* The pools' bytes, offsets computed here: a whole row at r * row_bytes
 * (E4M3), and a row-scaled row (E4M3T, I8T) split in its segment, its
 * codes at slot * HD (16-byte aligned) and its scale after the segment's
 * BS rows of codes; kvd_pool_get_row gives the codec's row back. Tokens
 * land in both KV heads of two blocks, taken out of order. */
static void pool_layout(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, L, KVH);
    for (int i = 0; i < L * KVH; i++) sc.k[i] = sc.v[i] = 0.05f;
    const kvd_kv_mode ms[3] = {KVD_KV_FP8_CAL, KVD_KV_FP8_TOKEN, KVD_KV_INT8_TOKEN};
    for (int mi = 0; mi < 3; mi++) {
        kvd_kvcache c;
        assert_int_equal(kvd_kvcache_init(&c, ms[mi], L, KVH, HD, BS, 64, &sc, 1, err), 0);
        const kvd_fmt fmt = c.fmt;
        const int rs = kvd_fmt_row_scaled(fmt);
        const size_t rb = rs ? HD + 4 : HD;
        int waste = kvd_kvcache_add_seq(&c), s = kvd_kvcache_add_seq(&c);
        kvd_kvcache_reserve(&c, waste, 1); /* s's blocks start past block 0 */
        kvd_kvcache_reserve(&c, s, 2 * BS);
        const int pos[4] = {0, 5, BS + 3, 2 * BS - 1};
        for (int i = 0; i < 4; i++) {
            float k[KVH * HD], v[KVH * HD];
            fill(k, KVH * HD, 40 + (uint64_t)i, 1.0f + (float)i);
            fill(v, KVH * HD, 50 + (uint64_t)i, 0.5f);
            kvd_kvcache_write(&c, 1, s, pos[i], k, v);
            for (int h = 0; h < KVH; h++) {
                uint8_t want[HD + 4], got[HD + 4], back[HD + 4];
                kvd_quant_row(fmt, k + h * HD, want, HD, 0.05f, 1, NULL);
                const size_t seg = (size_t)c.seqs[s].blocks[pos[i] / BS] * KVH + (size_t)h;
                const size_t slot = (size_t)(pos[i] % BS), base = seg * BS * rb;
                const size_t codes = rs ? base + slot * HD : base + slot * rb;
                memcpy(got, c.k[1] + codes, HD);
                if (rs) {
                    assert_int_equal(codes % 16, 0);
                    memcpy(got + HD, c.k[1] + base + (size_t)BS * HD + 4 * slot, 4);
                    float s1, s2;
                    memcpy(&s1, want + HD, 4);
                    s2 = kvd_pool_row_scale(fmt, c.k[1] + base, BS, HD, (int)slot);
                    assert_true(s1 == s2 && s1 > 0.0f);
                }
                assert_memory_equal(got, want, rb);
                kvd_pool_get_row(fmt, c.k[1], BS, HD, seg * BS + slot, back);
                assert_memory_equal(back, want, rb);
            }
        }
        kvd_kvcache_free(&c);
    }
    kvd_kv_scales_free(&sc);
}

/* attention against a straightforward double reference, every format */
static void attention_shape(int NH, int D) {
    enum { KH = 2, T = 300 };
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, 1, KH);
    sc.k[0] = 0.02f, sc.k[1] = 0.03f, sc.v[0] = 0.004f, sc.v[1] = 0.005f;
    float k[KH * 64], v[KH * 64], q[32 * 64], out[32 * 64], probs[32 * T], row[64];
    fill(q, NH * D, 77, 1.0f);
    for (int mi = 0; mi < KVD_KV_N_MODES; mi++) {
        kvd_kvcache c;
        const int i4 = kvd_kv_mode_fmt((kvd_kv_mode)mi) == KVD_FMT_I4T;
        if (kvd_kv_mode_fmt((kvd_kv_mode)mi) == KVD_FMT_NVFP4 && D % 16) { /* refused */
            assert_int_equal(
                kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, D, BS, 2 * T, &sc, 1, err), -1);
            assert_non_null(strstr(err, "not a multiple of NVFP4's 16-value groups"));
            continue;
        }
        if (i4 && (D & (D - 1))) { /* refused: the rotation takes powers of two */
            assert_int_equal(
                kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, D, BS, 2 * T, &sc, 1, err), -1);
            assert_non_null(strstr(err, "int4-token: head_dim 40 is not a power of two"));
            continue;
        }
        assert_int_equal(kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, D, BS, 2 * T, &sc, 1, err),
                         0);
        int pad = kvd_kvcache_add_seq(&c), s = kvd_kvcache_add_seq(&c);
        /* interleave with another sequence so the blocks are not contiguous */
        for (int t = 0; t < T; t++) {
            kvd_kvcache_reserve(&c, pad, t + 1);
            kvd_kvcache_reserve(&c, s, t + 1);
            fill(k, KH * D, 1000 + (uint64_t)t, 2.0f);
            fill(v, KH * D, 5000 + (uint64_t)t, 0.5f);
            kvd_kvcache_write(&c, 0, pad, t, v, k);
            kvd_kvcache_write(&c, 0, s, t, k, v);
        }
        kvd_kv_view view = kvd_kvcache_view(&c, 0);
        float sm = 1.0f / sqrtf((float)D);
        /* whole context in one part, then split in three: the same result */
        static float out3[32 * 64], probs3[32 * T];
        static char work[1 << 20];
        assert_true(kvd_attn_work_bytes(NH, D, T, 3) <= sizeof work);
        kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, out3, probs3, work, 3);
        kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, out, probs, work, 1);
        /* (int4-token's output is rounded to BF16: a sum's last bit may move
         * it a BF16 step) */
        const float rel = i4 ? 0x1p-7f : 1e-5f;
        for (int i = 0; i < NH * D; i++)
            assert_true(fabsf(out3[i] - out[i]) <= 1e-6f + rel * fabsf(out[i]));
        for (int i = 0; i < NH * T; i++)
            assert_true(fabsf(probs3[i] - probs[i]) <= 1e-7f + 1e-5f * probs[i]);
        for (int hq = 0; hq < NH; hq++) {
            int h = hq / (NH / KH);
            double sc_[T], mx = -INFINITY, sum = 0, acc[64] = {0};
            /* int4-token in the rotated basis: the query rotated and rounded
             * to BF16, the rows rotated again, the scale over D */
            float qh[64];
            memcpy(qh, q + hq * D, sizeof(float) * (size_t)D);
            if (i4) kvd_rht(qh, (size_t)D, 0), kvd_round_bf16(qh, (size_t)D);
            for (int t = 0; t < T; t++) {
                kvd_kv_row(&view, 0, c.seqs[s].blocks, t, h, row);
                if (i4) kvd_rht(row, (size_t)D, 0);
                double d = 0;
                for (int i = 0; i < D; i++) d += (double)qh[i] * row[i];
                sc_[t] = d * sm / (i4 ? D : 1);
                mx = sc_[t] > mx ? sc_[t] : mx;
            }
            for (int t = 0; t < T; t++) sum += (sc_[t] = exp(sc_[t] - mx));
            for (int t = 0; t < T; t++) {
                assert_true(fabs(probs[hq * T + t] - sc_[t] / sum) <= 1e-6 + 1e-5 * sc_[t] / sum);
                kvd_kv_row(&view, 1, c.seqs[s].blocks, t, h, row);
                if (i4) kvd_rht(row, (size_t)D, 0);
                for (int i = 0; i < D; i++) acc[i] += sc_[t] / sum * row[i];
            }
            if (i4) { /* rotated back, over D */
                float back[64];
                for (int i = 0; i < D; i++) back[i] = (float)acc[i];
                kvd_rht(back, (size_t)D, 1);
                for (int i = 0; i < D; i++) acc[i] = back[i] / D;
            }
            /* fp32 accumulation over 300 terms: 1e-5 relative is generous */
            for (int i = 0; i < D; i++)
                assert_true(fabs(out[hq * D + i] - acc[i]) <= 1e-6 + rel * fabs(acc[i]) * 10);
        }
        kvd_kvcache_free(&c);
    }
    kvd_kv_scales_free(&sc);
}

/* GQA 4:1 at head_dim 64 takes the AVX-512 kernels; 8:1 and 16:1 the AMX
 * ones where the CPU has them; 3:1 at head_dim 40 the portable ones: all
 * are held to the same reference */
static void attention_kernel(void **st) {
    (void)st;
    attention_shape(8, 64);
    attention_shape(16, 64);
    attention_shape(32, 64);
    attention_shape(6, 40);
}

/* FP8 attention (FlashAttention 3's rule) against a double reference: the
 * query through E4M3 with its head's scale, the scores' softmax as the
 * distribution, the weights 2^8 exp(s - M) rounded to E4M3 for the sum of V
 * over the unrounded weights' sum; one part or three, the same. */
static void fp8_attention_shape(int NH, int D, kvd_kv_mode mode) {
    enum { KH = 2, T = 300 };
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, 1, KH);
    sc.k[0] = 0.02f, sc.k[1] = 0.03f, sc.v[0] = 0.004f, sc.v[1] = 0.005f;
    float k[KH * 64], v[KH * 64], q[8 * 64], qs[8], out[8 * 64], out3[8 * 64], plain[8 * 64];
    float probs[8 * T], probs3[8 * T], row[64];
    /* queries of several magnitudes; scales from calibration-like absmax and
     * 1.0 (the scale an engine uses without one) */
    fill(q, NH * D, 78, 3.0f);
    for (int h = 0; h < NH; h++) {
        float am = 0;
        for (int i = 0; i < D; i++) am = fmaxf(am, fabsf(q[h * D + i] *= (float)(h + 1) / 4));
        qs[h] = h % 2 ? am / 448.0f : 1.0f;
    }
    kvd_kvcache c;
    assert_int_equal(kvd_kvcache_init(&c, mode, 1, KH, D, BS, T, &sc, 1, err), 0);
    int s = kvd_kvcache_add_seq(&c);
    kvd_kvcache_reserve(&c, s, T);
    for (int t = 0; t < T; t++) {
        fill(k, KH * D, 1000 + (uint64_t)t, 2.0f);
        fill(v, KH * D, 5000 + (uint64_t)t, 0.5f);
        kvd_kvcache_write(&c, 0, s, t, k, v);
    }
    static char work[1 << 18];
    assert_true(kvd_attn_work_bytes(NH, D, T, 3) <= sizeof work);
    const float sm = 1.0f / sqrtf((float)D);
    kvd_kv_view pv = kvd_kvcache_view(&c, 0);
    kvd_attn_paged(&pv, c.seqs[s].blocks, T, q, NH, sm, plain, probs, work, 1);
    assert_int_equal(kvd_kvcache_attn_fp8(&c, NH, qs, err), 0);
    kvd_kv_view view = kvd_kvcache_view(&c, 0);
    assert_true(view.q_scale && view.p_fp8);
    kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, out, probs, work, 1);
    kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, out3, probs3, work, 3);
    double moved = 0;
    for (int hq = 0; hq < NH; hq++) {
        const int h = hq / (NH / KH);
        double qq[64], sc_[T], mx = -INFINITY, sum = 0, acc[64] = {0};
        for (int i = 0; i < D; i++)
            qq[i] = kvd_e4m3_to_f32(kvd_f32_to_e4m3(q[hq * D + i] / qs[hq], 1)) * (double)qs[hq];
        for (int t = 0; t < T; t++) {
            kvd_kv_row(&view, 0, c.seqs[s].blocks, t, h, row);
            double d = 0;
            for (int i = 0; i < D; i++) d += qq[i] * row[i];
            sc_[t] = d * sm;
            mx = sc_[t] > mx ? sc_[t] : mx;
        }
        for (int t = 0; t < T; t++) sum += (sc_[t] = exp(sc_[t] - mx));
        for (int t = 0; t < T; t++) {
            assert_true(fabs(probs[hq * T + t] - sc_[t] / sum) <= 1e-6 + 1e-5 * sc_[t] / sum);
            assert_true(probs3[hq * T + t] == probs[hq * T + t]);
            const double w = kvd_e4m3_to_f32(kvd_f32_to_e4m3(256.0f * (float)sc_[t], 1)) / 256.0;
            kvd_kv_row(&view, 1, c.seqs[s].blocks, t, h, row);
            for (int i = 0; i < D; i++) acc[i] += w / sum * row[i];
        }
        for (int i = 0; i < D; i++) {
            assert_true(fabs(out[hq * D + i] - acc[i]) <= 1e-6 + 1e-4 * fabs(acc[i]));
            assert_true(fabsf(out3[hq * D + i] - out[hq * D + i]) <=
                        1e-6f + 1e-5f * fabsf(out[hq * D + i]));
            moved = fmax(moved, fabs(out[hq * D + i] - plain[hq * D + i]));
        }
    }
    /* FP8 weights carry 3 significant bits: the output moves */
    assert_true(moved > 1e-4);
    kvd_kvcache_free(&c);
    kvd_kv_scales_free(&sc);
}

/* An attention sink in closed form: position 0 scores 12, the other n - 1
 * score 0, so their weights exp(-12) sit in E4M3's subnormal range once
 * times 2^8: 256 exp(-12) = 1.57e-3 rounds to 2^-9 (0.805 of it), so each
 * weighs 2^-17 against the sum's exp(-12). With V 0 at the sink and 1
 * elsewhere the output is (n - 1) 2^-17 / (1 + (n - 1) exp(-12)); an offset
 * of 2^6 or 2^7 would round those weights to 0. */
static void fp8_attention_sink(void) {
    enum { D = 16, N = 1000 };
    char err[KVD_ERR_LEN];
    kvd_kvcache c;
    assert_int_equal(kvd_kvcache_init(&c, KVD_KV_FP8_UNSCALED, 1, 1, D, BS, N, NULL, 1, err), 0);
    assert_int_equal(kvd_kvcache_attn_fp8(&c, 1, NULL, err), 0);
    int s = kvd_kvcache_add_seq(&c);
    kvd_kvcache_reserve(&c, s, N);
    float k[D] = {12.0f}, v[D] = {0}, q[D] = {1.0f}, out[D];
    kvd_kvcache_write(&c, 0, s, 0, k, v);
    k[0] = 0.0f;
    for (int d = 0; d < D; d++) v[d] = 1.0f;
    for (int t = 1; t < N; t++) kvd_kvcache_write(&c, 0, s, t, k, v);
    static char work[1 << 18];
    assert_true(kvd_attn_work_bytes(1, D, N, 3) <= sizeof work);
    kvd_kv_view view = kvd_kvcache_view(&c, 0);
    const double want = (N - 1) * ldexp(1.0, -17) / (1.0 + (N - 1) * (double)expf(-12.0f));
    for (int parts = 1; parts <= 3; parts += 2) {
        kvd_attn_paged(&view, c.seqs[s].blocks, N, q, 1, 1.0f, out, NULL, work, parts);
        for (int d = 0; d < D; d++) assert_true(fabs(out[d] - want) <= 1e-6 * want);
    }
    kvd_kvcache_free(&c);
}

/* FP8 attention's weight rounding (kvd_fp8_weights, vector and scalar
 * paths) bit for bit against the codec's round trip: a sweep of float bit
 * patterns over [0, 1] and on to NaN, both signs, and every E4M3 value's
 * midpoint to the next, with its neighbours one float either side (the
 * ties go to the even code). NaNs compare as NaNs. */
static float codec_weight(float e) {
    return kvd_e4m3_to_f32(kvd_f32_to_e4m3(256.0f * e, 1)) * (1.0f / 256.0f);
}
static size_t weights_differ(const float *e, size_t n) {
    float *got = malloc(sizeof(float) * n);
    kvd_fp8_weights(e, n, got);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float want = codec_weight(e[i]);
        if (isnan(want) ? !isnan(got[i]) : memcmp(&want, &got[i], sizeof want) != 0) {
            if (bad++ < 5) fprintf(stderr, "weight %a: got %a, want %a\n", e[i], got[i], want);
        }
    }
    free(got);
    return bad;
}
static void fp8_weights(void **st) {
    (void)st;
    enum { N = 1 << 16 };
    float *e = malloc(sizeof(float) * N);
    size_t n = 0, bad = 0;
    for (uint64_t u = 0; u <= 0x7fc00000u; u += 61) { /* 0 .. NaN, 35M values */
        uint32_t b = (uint32_t)u | (u % 2 ? 0x80000000u : 0);
        memcpy(&e[n++], &b, sizeof b);
        if (n == N) bad += weights_differ(e, n), n = 0;
    }
    for (int c = 0; c < 0x7e; c++) { /* E4M3's codes to 448, midpoints to the next */
        const float lo = kvd_e4m3_to_f32((uint8_t)c), hi = kvd_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2 / 256;
        const float pts[5] = {mid, nextafterf(mid, 0), nextafterf(mid, 1), lo / 256, -mid};
        for (int i = 0; i < 5; i++) e[n++] = pts[i];
    }
    const float special[6] = {INFINITY, -INFINITY, NAN, 1.75f, 464.0f / 256, 0x1p-40f};
    for (int i = 0; i < 6; i++) e[n++] = special[i];
    bad += weights_differ(e, n);
    assert_int_equal(bad, 0);
    free(e);
}

static void fp8_attention(void **st) {
    (void)st;
    fp8_attention_shape(8, 64, KVD_KV_FP8_CAL);
    fp8_attention_shape(6, 40, KVD_KV_FP8_UNSCALED);
    fp8_attention_sink();
    /* E4M3 only; a scale that is no scale is refused */
    char err[KVD_ERR_LEN];
    kvd_kvcache c;
    const kvd_kv_mode other[2] = {KVD_KV_BF16, KVD_KV_FP8_E5M2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(kvd_kvcache_init(&c, other[i], 1, 2, 16, BS, 16, NULL, 1, err), 0);
        assert_int_equal(kvd_kvcache_attn_fp8(&c, 4, NULL, err), -1);
        assert_non_null(strstr(err, "expected an E4M3 cache"));
        kvd_kvcache_free(&c);
    }
    assert_int_equal(kvd_kvcache_init(&c, KVD_KV_FP8_UNSCALED, 2, 2, 16, BS, 16, NULL, 1, err), 0);
    float qs[8] = {1, 1, 1, 1, 1, 0, 1, 1};
    assert_int_equal(kvd_kvcache_attn_fp8(&c, 4, qs, err), -1);
    assert_non_null(strstr(err, "layer 1 query head 1: expected a positive finite q scale"));
    assert_int_equal(kvd_kvcache_attn_fp8(&c, 3, NULL, err), -1);
    assert_int_equal(kvd_kvcache_attn_fp8(&c, 4, NULL, err), 0);
    kvd_kv_view view = kvd_kvcache_view(&c, 1);
    assert_true(view.q_scale && view.q_scale[3] == 1.0f && view.p_fp8);
    kvd_kvcache_free(&c);
}

/* Under --fp8-overflow nan an overflowing value is stored as E4M3's NaN code;
 * the attention kernel must read it as NaN, not as 480. */
static void nosat_nan(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    for (int D = 16; D <= 64; D += 48) /* the portable kernels, then the vector ones */
        for (int portable = 0; portable < 2; portable++) {
            kvd_kvcache c;
            assert_int_equal(
                kvd_kvcache_init(&c, KVD_KV_FP8_UNSCALED, 1, 1, D, BS, 16, NULL, 0, err), 0);
            int s = kvd_kvcache_add_seq(&c);
            kvd_kvcache_reserve(&c, s, 1);
            float k[64] = {0}, v[64] = {0}, q[64], out[64], p[1];
            k[3] = 1000.0f;
            for (int i = 0; i < D; i++) q[i] = 1.0f;
            kvd_kvcache_write(&c, 0, s, 0, k, v);
            assert_int_equal(c.k_stats[0].saturated, 1);
            kvd_kv_view view = kvd_kvcache_view(&c, 0);
            view.portable = portable;
            static char work[1 << 16];
            assert_true(kvd_attn_work_bytes(1, D, 1, 1) <= sizeof work);
            kvd_attn_paged(&view, c.seqs[s].blocks, 1, q, 1, 0.25f, out, p, work, 1);
            assert_true(isnan(out[0]));
            kvd_kvcache_free(&c);
        }
}

/* Two kernels' outputs and distributions of one query: the same but for the
 * order of the sums (~1e-6 here; a misplaced dimension or row gives O(1)) */
static int paths_agree(const float *o1, const float *o2, const float *p1, const float *p2, int NH,
                       int D, int T, double out_tol) {
    double num = 0, den = 0;
    for (int i = 0; i < NH * D; i++) {
        num += (double)(o1[i] - o2[i]) * (o1[i] - o2[i]);
        den += (double)o2[i] * o2[i];
    }
    double worst = 0;
    for (int i = 0; i < NH * T; i++) {
        double r = fabs(p1[i] - p2[i]) / (1e-6 + p2[i]);
        worst = r > worst ? r : worst;
    }
    return den > 0 && sqrt(num / den) < out_tol && worst < 2e-5;
}

/* The vector kernels (their own order of the dimensions, sixteen dot
 * products summed together, FP8 decoded through BF16 tables) against the
 * portable ones, in every mode, for each group size they are built for, with
 * a partial last block (300 = 2 x 128 + 44) and several parts; and
 * where the CPU takes the AMX kernels (8 and 16 heads a KV head), those
 * against the AVX-512 ones. */
static void attention_paths(void **st) {
    (void)st;
    enum { KH = 2, T = 300, BSV = 128 };
    static const int shapes[][2] = {{2, 64}, {4, 64}, {6, 64}, {8, 256}, {16, 256}, {32, 256}};
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, 1, KH);
    sc.k[0] = 0.02f, sc.k[1] = 0.03f, sc.v[0] = 0.004f, sc.v[1] = 0.005f;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int NH = shapes[si][0], D = shapes[si][1];
        float *k = malloc(sizeof(float) * KH * D), *v = malloc(sizeof(float) * KH * D);
        float *q = malloc(sizeof(float) * NH * D), *o1 = malloc(sizeof(float) * NH * D),
              *o2 = malloc(sizeof(float) * NH * D), *p1 = malloc(sizeof(float) * NH * T),
              *p2 = malloc(sizeof(float) * NH * T);
        size_t wb = kvd_attn_work_bytes(NH, D, T, 2);
        void *work = malloc(wb);
        fill(q, NH * D, 78 + si, 1.0f);
        for (int mi = 0; mi < KVD_KV_N_MODES; mi++) {
            kvd_kvcache c;
            assert_int_equal(
                kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, D, BSV, 4 * T, &sc, 1, err), 0);
            int pad = kvd_kvcache_add_seq(&c), s = kvd_kvcache_add_seq(&c);
            for (int t = 0; t < T; t++) {
                assert_int_equal(kvd_kvcache_reserve(&c, s, t + 1), 0);
                if (t % BSV == 0) assert_int_equal(kvd_kvcache_reserve(&c, pad, t + 1), 0);
                fill(k, KH * D, 2000 + (uint64_t)t, 2.0f);
                fill(v, KH * D, 6000 + (uint64_t)t, 0.5f);
                kvd_kvcache_write(&c, 0, s, t, k, v);
            }
            kvd_kv_view view = kvd_kvcache_view(&c, 0);
            float sm = 1.0f / sqrtf((float)D);
            /* int4-token's output is rounded to BF16: where the sums' last
             * bits differ, a value moves a BF16 step */
            const double tol = c.fmt == KVD_FMT_I4T ? 2e-3 : 1e-5;
            view.portable = KVD_ATTN_NO_AMX; /* the AVX-512 kernels, where AMX is taken */
            kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, o2, p2, work, 2);
            view.portable = 0;
            kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, o1, p1, work, 2);
            /* the CPU's kernels (AMX at 8 and 16 heads a KV head) against the AVX-512 ones */
            assert_true(paths_agree(o1, o2, p1, p2, NH, D, T, tol));
            view.portable = 1;
            kvd_attn_paged(&view, c.seqs[s].blocks, T, q, NH, sm, o2, p2, work, 2);
            assert_true(paths_agree(o1, o2, p1, p2, NH, D, T, tol));
            kvd_kvcache_free(&c);
        }
        free(k), free(v), free(q), free(o1), free(o2), free(p1), free(p2), free(work);
    }
    kvd_kv_scales_free(&sc);
}

/* Every FP8 code as the cache reader decodes it (on x86 with AVX2 and
 * F16C, through FP16 in 16s, the rest one by one) against the scalar
 * decoder, bit for bit: NaN codes, subnormals, signed zeros, and rows whose
 * length leaves a tail. */
static void fp8_decode_exact(void **st) {
    (void)st;
    enum { N = 296 };
    uint8_t codes[N];
    float got[N], want[N];
    const float scale[1] = {0.75f};
    const int32_t block0[1] = {0};
    const kvd_fmt fmts[] = {KVD_FMT_E4M3, KVD_FMT_E5M2};
    for (int f = 0; f < 2; f++)
        for (int hd = 8; hd <= N; hd += 36) { /* 8, 44, ..., 296: 16s and a tail */
            for (int off = 0; off < 256; off += hd) {
                for (int i = 0; i < hd; i++) codes[i] = (uint8_t)(off + i * 167);
                kvd_kv_view v = {.fmt = fmts[f],
                                 .block_size = 1,
                                 .kv_heads = 1,
                                 .head_dim = hd,
                                 .k = codes,
                                 .v = codes,
                                 .k_scale = scale,
                                 .v_scale = scale};
                kvd_kv_row(&v, f, block0, 0, 0, got);
                if (fmts[f] == KVD_FMT_E4M3)
                    kvd_dequant_e4m3(codes, want, (size_t)hd, 1.0f);
                else
                    kvd_dequant_e5m2(codes, want, (size_t)hd, 1.0f);
                for (int i = 0; i < hd; i++) want[i] *= scale[0];
                for (int i = 0; i < hd; i++) {
                    uint32_t a, b;
                    memcpy(&a, &got[i], 4), memcpy(&b, &want[i], 4);
                    if (a != b)
                        fail_msg("%s code 0x%02x (head_dim %d, value %d): 0x%08x, expected 0x%08x",
                                 f ? "E5M2" : "E4M3", codes[i], hd, i, a, b);
                }
            }
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paging),           cmocka_unit_test(modes),
        cmocka_unit_test(pool_layout),      cmocka_unit_test(attention_kernel),
        cmocka_unit_test(attention_paths),  cmocka_unit_test(nosat_nan),
        cmocka_unit_test(fp8_attention),    cmocka_unit_test(fp8_weights),
        cmocka_unit_test(fp8_decode_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
