/* kvdrift: every CUDA kernel against its CPU twin on the same inputs: the
 * codecs bit for bit (both saturation modes, with scales), decode attention
 * over a scattered paged cache in every format within a stated tolerance,
 * the GEMM against a double product, the layer blocks (RMSNorm, RoPE,
 * SwiGLU, the gated delta rule, routing, sampling), the paged cache write
 * (pool bytes and counters identical) and the drift figures' comparisons
 * (attention distributions, residual streams, logits).
 * Skips (77) with the reason when no device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_kernels.h"
#include "../../runners/kvcache.h"
#include "../../runners/weights.h"

#include "check.h"

static void codecs(void) {
    enum { N = 1 << 20 };
    float *x = malloc(sizeof(float) * N);
    uint8_t *a = malloc(N * 2), *b = malloc(N * 2);
    uint64_t key = kvd_rng_key(5, "gpu.codec");
    for (int i = 0; i < N; i++) {
        /* every exponent from 2^-30 to 2^20, both signs, plus specials */
        float m = kvd_rng_uniform(key, (uint64_t)i) + 0.5f;
        int e = (int)(kvd_rng_uniform(key, (uint64_t)i + N) * 51) - 30;
        x[i] = ldexpf(m, e) * (i & 1 ? -1.0f : 1.0f);
    }
    x[0] = 0.0f, x[1] = -0.0f, x[2] = INFINITY, x[3] = -INFINITY, x[4] = NAN, x[5] = 448.0f;
    x[6] = 464.0f, x[7] = 465.0f, x[8] = 61440.0f, x[9] = 0x1p-10f;
    const float scales[3] = {1.0f, 0.0137f, 3.75f};
    for (int s = 0; s < 3; s++)
        for (int sat = 0; sat <= 1; sat++) {
            kvd_quant_e4m3(x, a, N, scales[s], sat, NULL);
            CHECK(kvd_cuda_quant(KVD_FMT_E4M3, x, b, N, scales[s], sat) == 0,
                  "cuda quant failed\n");
            CHECK(!memcmp(a, b, N), "e4m3 scale %g sat %d: device bytes differ\n", scales[s], sat);
            kvd_quant_e5m2(x, a, N, scales[s], sat, NULL);
            CHECK(kvd_cuda_quant(KVD_FMT_E5M2, x, b, N, scales[s], sat) == 0,
                  "cuda quant failed\n");
            CHECK(!memcmp(a, b, N), "e5m2 scale %g sat %d: device bytes differ\n", scales[s], sat);
        }
    kvd_quant_bf16(x, (uint16_t *)a, N);
    CHECK(kvd_cuda_quant(KVD_FMT_BF16, x, b, N, 1.0f, 1) == 0, "cuda quant failed\n");
    CHECK(!memcmp(a, b, N * 2), "bf16: device bytes differ\n");
    free(x), free(a), free(b);
}

/* K and V pools from the same n values, in fmt: E4M3 and NVFP4 (rows of
 * hd) with the scales ks and vs, E5M2 unscaled, E4M3T and I8T with each
 * row's own. Their V rows run 2^-3, 1 and 2^3 times as large in runs of 37
 * rows, so that a stage's largest V row scale (which sets decode v3's
 * probability scale) rises and falls along a context. */
static void write_pools(kvd_fmt fmt, const float *src, uint8_t *k, uint8_t *v, size_t n, float ks,
                        float vs, int hd, int bs) {
    const int rowsc = kvd_fmt_row_scaled(fmt), e5 = fmt == KVD_FMT_E5M2;
    float *vrow = malloc(sizeof(float) * (size_t)hd);
    for (size_t r = 0; r < n / (size_t)hd; r++) {
        for (int d = 0; d < hd; d++)
            vrow[d] = rowsc ? ldexpf(src[r * hd + d], 3 * (int)(r / 37 % 3) - 3) : src[r * hd + d];
        kvd_pool_quant_row(fmt, k, bs, hd, r, src + r * hd, e5 ? 1.0f : ks, 1, NULL);
        kvd_pool_quant_row(fmt, v, bs, hd, r, vrow, e5 ? 1.0f : vs, 1, NULL);
    }
    free(vrow);
}

/* Several rows at once, as the drift figures' sampled rows of a step run:
 * N (up to 16) queries over contexts of n_ctx, n_ctx - 17, (n_ctx + 1) / 2,
 * then n_ctx - 16 k positions. Each row's distribution must be the single
 * row's bit for bit (the same sums in the same order); the rows'
 * comparison, row by row, kvd_attn_compare's on the same distributions (KL
 * within 1e-12 relative, the most-attended positions exactly). */
static void probs_rows_case(const kvd_kv_view *view, int nb, const int32_t *blocks, int n_ctx,
                            int nh, int hd, uint64_t key, int N) {
    int ctx[16], qrow[16];
    for (int k = 0; k < N; k++) {
        ctx[k] = k == 0 ? n_ctx : k == 1 ? n_ctx - 17 : k == 2 ? (n_ctx + 1) / 2 : n_ctx - 16 * k;
        ctx[k] = ctx[k] < 1 ? 1 : ctx[k];
        qrow[k] = (7 * k + 2) % N; /* not in order: each row reads its own query */
    }
    const size_t nq = (size_t)nh * hd, np = (size_t)N * nh * n_ctx;
    float *q = malloc(sizeof(float) * 2 * N * nq), *p = malloc(sizeof(float) * 2 * np);
    float *one = malloc(sizeof(float) * (size_t)nh * n_ctx);
    for (size_t i = 0; i < 2 * N * nq; i++) q[i] = kvd_rng_normal(key, i + (1ull << 40));
    int ok = 1;
    for (int set = 0; set < 2; set++)
        ok &= kvd_cuda_attn_probs_rows(view, nb, blocks, N, qrow, ctx, q + set * N * nq, nq, N, nh,
                                       1.0f / 16.0f, p + set * np) == 0;
    CHECK(ok, "cuda attention probs over rows failed\n");
    size_t differ = 0;
    for (int k = 0; k < N && ok; k++) {
        ok &= kvd_cuda_attn_probs(view, nb, blocks, ctx[k], q + (size_t)qrow[k] * nq, nh,
                                  1.0f / 16.0f, one) == 0;
        for (int h = 0; h < nh; h++)
            differ += memcmp(p + ((size_t)k * nh + h) * n_ctx, one + (size_t)h * ctx[k],
                             sizeof(float) * ctx[k]) != 0;
    }
    CHECK(ok && differ == 0, "probs over rows: %zu of %d heads differ from the single row's\n",
          differ, N * nh);
    /* the two sets compared, row by row */
    float *dp = kvd_cuda_alloc(sizeof(float) * 2 * np);
    int *dctx = kvd_cuda_alloc(sizeof(int) * N), *dtop = kvd_cuda_alloc(sizeof(int) * 2 * N * nh);
    double *dkl = kvd_cuda_alloc(sizeof(double) * N * nh), kl[16 * 32], klc[32];
    int top[2 * 16 * 32], tpc[32], tqc[32];
    ok = dp && dctx && dtop && dkl && nh <= 32 && N <= 16 &&
         !kvd_cuda_upload(dp, p, sizeof(float) * 2 * np) &&
         !kvd_cuda_upload(dctx, ctx, sizeof(int) * N) &&
         !kvd_cuda_attn_compare_rows_dev(dp, dp + np, nh, N, dctx, (size_t)n_ctx, dkl, dtop,
                                         dtop + N * nh, (size_t)nh) &&
         !kvd_cuda_download(kl, dkl, sizeof(double) * N * nh) &&
         !kvd_cuda_download(top, dtop, sizeof(int) * 2 * N * nh);
    CHECK(ok, "cuda compare over rows failed\n");
    for (int k = 0; k < N && ok; k++) {
        for (int h = 0; h < nh; h++) {
            const size_t off = ((size_t)k * nh + h) * n_ctx;
            kvd_attn_compare(p + off, p + np + off, 1, ctx[k], klc + h, tpc + h, tqc + h);
        }
        for (int h = 0; h < nh; h++)
            CHECK(fabs(kl[k * nh + h] - klc[h]) <= 1e-12 * fabs(klc[h]) &&
                      top[k * nh + h] == tpc[h] && top[N * nh + k * nh + h] == tqc[h],
                  "compare over rows, row %d head %d: KL %.17g / %.17g, tops %d %d / %d %d\n", k, h,
                  kl[k * nh + h], klc[h], top[k * nh + h], top[N * nh + k * nh + h], tpc[h],
                  tqc[h]);
    }
    kvd_cuda_free(dp), kvd_cuda_free(dctx), kvd_cuda_free(dtop), kvd_cuda_free(dkl);
    free(q), free(p), free(one);
}

/* Decode attention of every kernel version against kvd_attn_paged: a
 * scattered block table, every cache format, shapes that cover each GQA
 * group size the model has (1 to 16, powers of two or not), each head_dim,
 * contexts that end inside a 64-position stage and inside a split. */
static void attention_case(int nh, int kvh, int hd, int n_ctx) {
    const int bs = 16, G = nh / kvh, nb = (n_ctx + bs - 1) / bs + 5;
    /* every format the device reads apart: I8T_RN's rows differ from
     * I8T's in the writing only, and every kernel reads them as I8T's */
    const kvd_fmt fmts[6] = {KVD_FMT_BF16,  KVD_FMT_E4M3,  KVD_FMT_E5M2,
                             KVD_FMT_NVFP4, KVD_FMT_E4M3T, KVD_FMT_I8T};
    const int pow2 = (G & (G - 1)) == 0 && G <= 16;
    for (int fi = 0; fi < 6; fi++) {
        const int nv = fmts[fi] == KVD_FMT_NVFP4, rowsc = kvd_fmt_row_scaled(fmts[fi]);
        size_t n = (size_t)nb * kvh * bs * hd, pb = n / hd * kvd_fmt_row_bytes(fmts[fi], hd);
        float *src = malloc(sizeof(float) * n), *q = malloc(sizeof(float) * nh * hd);
        float *ocpu = malloc(sizeof(float) * nh * hd), *ogpu = malloc(sizeof(float) * nh * hd);
        uint8_t *k = malloc(pb), *v = malloc(pb);
        uint64_t key = kvd_rng_key((uint64_t)(fi + 10 * hd + 1000 * nh), "gpu.attn");
        for (size_t i = 0; i < n; i++) /* E4M3T: rows 2^-3 to 2^3 apart in size */
            src[i] =
                2.0f * kvd_rng_normal(key, i) * (rowsc ? ldexpf(1.0f, (int)(i / hd % 7) - 3) : 1);
        float ks[16], vs[16], one[16];
        for (int h = 0; h < kvh; h++)
            ks[h] = 0.02f + 0.01f * h, vs[h] = 0.01f + 0.005f * h, one[h] = 1.0f;
        write_pools(fmts[fi], src, k, v, n, 0.02f, 0.01f, hd, bs);
        int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
        for (int i = 0; i < nb; i++) blocks[i] = (int32_t)(((int64_t)i * 37) % nb);
        for (int i = 0; i < nh * hd; i++) q[i] = kvd_rng_normal(key, (uint64_t)i + n);
        int fp8s = fmts[fi] == KVD_FMT_E4M3 || nv;
        kvd_kv_view view = {fmts[fi],        bs, kvh,  hd, k, v, fp8s ? ks : one,
                            fp8s ? vs : one, 0,  NULL, 0};
        void *work = malloc(kvd_attn_work_bytes(nh, hd, n_ctx, 3));
        float *probs = malloc(sizeof(float) * (size_t)nh * n_ctx);
        kvd_attn_paged(&view, blocks, n_ctx, q, nh, 1.0f / 16.0f, ocpu, probs, work, 3);
        for (int ver = 0; ver <= 3; ver++) {
            if (ver == 3 && !kvd_fmt_decode_tc(fmts[fi], hd)) { /* NVFP4 at head_dim 64
                                                takes v2, and v3 says so */
                CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu,
                                             ver) != 0,
                      "attention v3 accepted a cache of format %d\n", (int)fmts[fi]);
                continue;
            }
            if (ver == 2 && !pow2) { /* v2 takes power-of-two groups only, and says so */
                CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu,
                                             ver) != 0,
                      "attention v2 accepted a group of %d\n", G);
                continue;
            }
            CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu,
                                         ver) == 0,
                  "cuda attention v%d (%d/%d heads x %d, %d tokens) failed\n", ver, nh, kvh, hd,
                  n_ctx);
            /* all sum n_ctx FP32 products in different orders (v3 carries
             * the query and the probabilities as 16-bit hi + lo pairs): 1e-4
             * relative L2 per head is far below any real discrepancy (a
             * wrong block, dim or scale moves it by O(1)) */
            double worst = 0;
            for (int h = 0; h < nh; h++) {
                double num = 0, den = 0;
                for (int d = 0; d < hd; d++) {
                    double e = (double)ogpu[h * hd + d] - ocpu[h * hd + d];
                    num += e * e;
                    den += (double)ocpu[h * hd + d] * ocpu[h * hd + d];
                }
                worst = worst_of(worst, sqrt(num / den));
            }
            CHECK(worst < 1e-4, "attention v%d fmt %d (%d/%d heads x %d, %d tokens): rel L2 %g\n",
                  ver, fi, nh, kvh, hd, n_ctx, worst);
        }
        /* the distribution itself (the drift figures' sampled rows): the CPU
         * merges 3 parts by their maxima, the device takes one softmax. A
         * weight's relative error is its score's absolute one, which grows
         * with the keys: the row-scaled formats' rows run up to 8x larger
         * (their src above), so their bound is 8x wider */
        const double ptol = rowsc ? 8e-5 : 1e-5;
        float *pg = malloc(sizeof(float) * (size_t)nh * n_ctx);
        CHECK(kvd_cuda_attn_probs(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, pg) == 0,
              "cuda attention probs failed\n");
        for (int h = 0; h < nh; h++) {
            double num = 0, den = 0, sum = 0;
            for (int t = 0; t < n_ctx; t++) {
                double e = (double)pg[(size_t)h * n_ctx + t] - probs[(size_t)h * n_ctx + t];
                num += e * e;
                den += (double)probs[(size_t)h * n_ctx + t] * probs[(size_t)h * n_ctx + t];
                sum += pg[(size_t)h * n_ctx + t];
            }
            CHECK(sqrt(num / den) < ptol && fabs(sum - 1) < 1e-5,
                  "attention probs fmt %d head %d: rel L2 %g, sum %.9f\n", fi, h, sqrt(num / den),
                  sum);
        }
        free(pg);
        /* sixteen rows at GQA 16 (256 (row, head) vectors: two passes of
         * 128) and GQA 4 (64 vectors: one pass of 64), else three (9 and 3
         * vectors: passes of 32) */
        probs_rows_case(&view, nb, blocks, n_ctx, nh, hd, key, nh / kvh >= 4 ? 16 : 3);
        free(src), free(q), free(ocpu), free(ogpu), free(k), free(v), free(blocks), free(work),
            free(probs);
    }
}

/* One position: the output is that position's V row, decoded. With a row
 * holding every code (head_dim 256; FP8 under per-head scales or its own,
 * INT8 under its own, E2M1 under block scales), each version must give the
 * CPU's decoding times the scale bit for bit (v3: the probability 1 is
 * exact in both halves, and so is every FP8 value in FP16, and every E2M1
 * value times its block scale), NaN codes as NaN, and E5M2's infinities as
 * non-finite (v3's low half multiplies them by 0). */
static void attention_codes(void) {
    const int hd = 256, bs = 16, nh = 4, kvh = 1;
    const kvd_fmt fmts[5] = {KVD_FMT_E4M3, KVD_FMT_E5M2, KVD_FMT_E4M3T, KVD_FMT_I8T, KVD_FMT_NVFP4};
    /* NVFP4's V block scales: E4M3's smallest subnormal to its largest
     * value, a negative one and NaN */
    static const uint8_t vsf[16] = {0x01, 0x02, 0x07, 0x08, 0x09, 0x17, 0x30, 0x37,
                                    0x38, 0x39, 0x4f, 0x5a, 0x66, 0x7e, 0xb9, 0x7f};
    for (int fi = 0; fi < 5; fi++) {
        /* rows of 260 bytes, room for a row-scaled format's */
        uint8_t k[16 * 260] = {0}, v[16 * 260] = {0};
        for (int d = 0; d < hd; d++) v[d] = (uint8_t)d, k[d] = (uint8_t)(d % 0x38); /* K finite */
        float q[4 * 256], ref[256], out[4 * 256], ks = 0.5f, vs = 0.25f, one = 1.0f;
        const int rowsc = kvd_fmt_row_scaled(fmts[fi]);
        if (rowsc) /* the scales as the rows' own (little-endian, as the cache stores them) */
            memcpy(k + hd, &ks, 4), memcpy(v + hd, &vs, 4);
        if (fmts[fi] == KVD_FMT_NVFP4) /* each group all 16 codes, in another order for each
                                          group; K's codes under block scales of 1 */
            for (int gi = 0; gi < hd / 16; gi++) {
                for (int b = 0; b < 8; b++)
                    v[8 * gi + b] =
                        (uint8_t)(((2 * b + gi) & 15) | ((2 * b + 1 + 3 * gi) & 15) << 4);
                v[hd / 2 + gi] = vsf[gi], k[hd / 2 + gi] = 0x38;
            }
        for (int i = 0; i < nh * hd; i++) q[i] = 0.01f * (float)(i % 13);
        int32_t blocks[1] = {0};
        kvd_kv_view view = {fmts[fi],           bs, kvh,  hd, k, v, rowsc ? &one : &ks,
                            rowsc ? &one : &vs, 0,  NULL, 0};
        kvd_kv_row(&view, 1, blocks, 0, 0, ref);
        for (int ver = 1; ver <= 3; ver++) {
            CHECK(kvd_cuda_attn_decode_v(&view, 1, blocks, 1, q, nh, 0.0625f, out, ver) == 0,
                  "attention codes v%d failed\n", ver);
            int bad = 0, first = -1;
            for (int h = 0; h < nh; h++)
                for (int d = 0; d < hd; d++) {
                    float a = out[h * hd + d], b = ref[d];
                    int same = isnan(b)   ? isnan(a)
                               : isinf(b) ? !isfinite(a)
                                          : a == b; /* -0 sums to +0 */
                    if (!same && first < 0) first = d;
                    bad += !same;
                }
            CHECK(bad == 0, "attention codes v%d fmt %d: %d values differ (first code 0x%02x)\n",
                  ver, fi, bad, first);
        }
    }
}

/* The batched decode (one launch for a step's one-token entries) against
 * kvd_attn_paged row by row: five sequences of different lengths in one
 * pool, their block tables interleaved, entries in another order than the
 * sequences, one entry of two tokens (a prefill: its rows must be left as
 * they were), and a scratch so short that the splits must grow. */
static void attention_batch(void) {
    enum { NSEQ = 5, NH = 16, KVH = 2, HD = 128, BS = 16, NBS = 40 /* blocks a seq */ };
    const int lens[NSEQ] = {1, 700, 33, 333, 1000}; /* context of each sequence's row */
    const int order[NSEQ] = {3, 0, 4, 1, 2};        /* entry z holds sequence order[z] */
    const kvd_fmt fmts[5] = {KVD_FMT_BF16, KVD_FMT_E4M3, KVD_FMT_E4M3T, KVD_FMT_I8T, KVD_FMT_NVFP4};
    const int nb = NSEQ * NBS;
    for (int fi = 0; fi < 5; fi++) {
        /* esz: a value's bytes, or (row-scaled) a row's over head_dim's */
        const size_t n = (size_t)nb * KVH * BS * HD;
        const double esz = (double)kvd_fmt_row_bytes(fmts[fi], HD) / HD;
        const size_t pool = (size_t)(n * esz);
        float *src = malloc(sizeof(float) * n);
        uint8_t *k = malloc(pool), *v = malloc(pool);
        uint64_t key = kvd_rng_key((uint64_t)fi, "gpu.attn.batch");
        for (size_t i = 0; i < n; i++) src[i] = 1.5f * kvd_rng_normal(key, i);
        float ks[KVH] = {0.015f, 0.02f}, vs[KVH] = {0.01f, 0.012f}, one[KVH] = {1, 1};
        write_pools(fmts[fi], src, k, v, n, 0.015f, 0.01f, HD, BS);
        /* sequence s owns blocks s, s + NSEQ, s + 2 NSEQ, ... */
        int32_t btab[NSEQ * NBS];
        for (int sq = 0; sq < NSEQ; sq++)
            for (int i = 0; i < NBS; i++) btab[sq * NBS + i] = i * NSEQ + sq;
        /* rows: entry z has one row, except entry 2 (two rows: left alone) */
        int seqs[NSEQ], row0[NSEQ], ntok[NSEQ], pos[NSEQ + 1], rows = 0;
        for (int z = 0; z < NSEQ; z++) {
            seqs[z] = order[z], row0[z] = rows, ntok[z] = z == 2 ? 2 : 1;
            for (int r = 0; r < ntok[z]; r++) pos[rows + r] = lens[order[z]] - ntok[z] + r;
            rows += ntok[z];
        }
        const size_t qn = (size_t)rows * NH * HD;
        float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn);
        float *ref = malloc(sizeof(float) * NH * HD);
        for (size_t i = 0; i < qn; i++) q[i] = kvd_rng_normal(key, i + n);
        int fp8s = fmts[fi] == KVD_FMT_E4M3 || fmts[fi] == KVD_FMT_NVFP4;
        kvd_kv_view view = {fmts[fi],        BS, KVH,  HD, k, v, fp8s ? ks : one,
                            fp8s ? vs : one, 0,  NULL, 0};
        /* scratch for one split a row: the splits must grow to 1024 positions */
        const size_t scratch_floats = (size_t)NSEQ * NH * (HD + 2);
        void *dk = kvd_cuda_alloc(pool), *dv = kvd_cuda_alloc(pool);
        float *dks = kvd_cuda_alloc(sizeof ks), *dvs = kvd_cuda_alloc(sizeof vs);
        int32_t *dbt = kvd_cuda_alloc(sizeof btab);
        int *dseq = kvd_cuda_alloc(sizeof seqs), *drow0 = kvd_cuda_alloc(sizeof row0);
        int *dntok = kvd_cuda_alloc(sizeof ntok), *dpos = kvd_cuda_alloc(sizeof pos);
        float *dq = kvd_cuda_alloc(sizeof(float) * qn), *dout = kvd_cuda_alloc(sizeof(float) * qn);
        float *dscr = kvd_cuda_alloc(sizeof(float) * scratch_floats);
        int up =
            kvd_cuda_upload(dk, k, pool) | kvd_cuda_upload(dv, v, pool) |
            kvd_cuda_upload(dks, view.k_scale, sizeof ks) |
            kvd_cuda_upload(dvs, view.v_scale, sizeof vs) |
            kvd_cuda_upload(dbt, btab, sizeof btab) | kvd_cuda_upload(dseq, seqs, sizeof seqs) |
            kvd_cuda_upload(drow0, row0, sizeof row0) | kvd_cuda_upload(dntok, ntok, sizeof ntok) |
            kvd_cuda_upload(dpos, pos, sizeof pos) | kvd_cuda_upload(dq, q, sizeof(float) * qn);
        for (size_t i = 0; i < qn; i++) out[i] = 7.0f; /* the prefill rows keep this */
        up |= kvd_cuda_upload(dout, out, sizeof(float) * qn);
        kvd_kv_view dview = {fmts[fi], BS, KVH, HD, dk, dv, dks, dvs, 0, NULL, 0};
        char err[256];
        int rc = kvd_cuda_attn_decode_batch_dev(&dview, dbt, NBS, dseq, drow0, dntok, dpos, NSEQ,
                                                1000, dq, NH, 0.09f, dout, dscr, scratch_floats);
        CHECK(up == 0 && rc == 0 && kvd_cuda_sync(err, sizeof err) == 0 &&
                  kvd_cuda_download(out, dout, sizeof(float) * qn) == 0,
              "batched decode fmt %d failed (%d)\n", fi, rc);
        void *work = malloc(kvd_attn_work_bytes(NH, HD, 1000, 3));
        for (int z = 0; z < NSEQ; z++)
            for (int r = row0[z]; r < row0[z] + ntok[z]; r++) {
                const float *o = out + (size_t)r * NH * HD;
                if (ntok[z] != 1) {
                    int kept = 1;
                    for (int i = 0; i < NH * HD; i++) kept &= o[i] == 7.0f;
                    CHECK(kept, "batched decode fmt %d wrote entry %d's prefill row %d\n", fi, z,
                          r);
                    continue;
                }
                kvd_attn_paged(&view, btab + seqs[z] * NBS, pos[r] + 1, q + (size_t)r * NH * HD, NH,
                               0.09f, ref, NULL, work, 3);
                double e = rel_l2(o, ref, NH * HD);
                CHECK(e < 1e-4, "batched decode fmt %d entry %d (%d tokens): rel L2 %g\n", fi, z,
                      pos[r] + 1, e);
            }
        free(work);
        kvd_cuda_free(dk), kvd_cuda_free(dv), kvd_cuda_free(dks), kvd_cuda_free(dvs);
        kvd_cuda_free(dbt), kvd_cuda_free(dseq), kvd_cuda_free(drow0), kvd_cuda_free(dntok);
        kvd_cuda_free(dpos), kvd_cuda_free(dq), kvd_cuda_free(dout), kvd_cuda_free(dscr);
        free(src), free(k), free(v), free(q), free(out), free(ref);
    }
}

/* Decode for listed rows of one sequence (the drift figures' sampled rows,
 * one launch for a group) against kvd_attn_paged row by row: rows out of
 * order, contexts from 1 to 1000, outputs into every third slot (the other
 * slots must keep what they held), G 3 and 16, and a scratch so short that
 * the splits must grow. A scratch too short for even one split an entry
 * is refused with nothing written (the caller then decodes row by row). */
static void attention_rows(void) {
    enum { N = 6, KVH = 2, HD = 128, BS = 16, NB = 70 };
    const int ctx[N] = {1000, 17, 1, 640, 999, 333}, qrow[N] = {4, 0, 5, 2, 1, 3};
    const int heads[2] = {6, 32};
    const kvd_fmt fmts[3] = {KVD_FMT_BF16, KVD_FMT_E4M3, KVD_FMT_E4M3T};
    for (int c = 0; c < 6; c++) {
        const int fi = c % 3, NH = heads[c / 3];
        const kvd_fmt fmt = fmts[fi];
        const size_t n = (size_t)NB * KVH * BS * HD, pool = n / HD * kvd_fmt_row_bytes(fmt, HD);
        const size_t no = (size_t)NH * HD, qn = N * no, on = 3 * N * no;
        float *src = malloc(sizeof(float) * n), *q = malloc(sizeof(float) * qn);
        float *out = malloc(sizeof(float) * on), *ref = malloc(sizeof(float) * no);
        uint8_t *k = malloc(pool), *v = malloc(pool);
        uint64_t key = kvd_rng_key((uint64_t)c, "gpu.attn.rows");
        for (size_t i = 0; i < n; i++) src[i] = 1.5f * kvd_rng_normal(key, i);
        for (size_t i = 0; i < qn; i++) q[i] = kvd_rng_normal(key, i + n);
        for (size_t i = 0; i < on; i++) out[i] = 7.0f;
        float ks[KVH] = {0.015f, 0.02f}, vs[KVH] = {0.01f, 0.012f}, one[KVH] = {1, 1};
        write_pools(fmt, src, k, v, n, 0.015f, 0.01f, HD, BS);
        int32_t blocks[NB];
        for (int i = 0; i < NB; i++) blocks[i] = (int32_t)((i * 37) % NB);
        const int fp8s = fmt == KVD_FMT_E4M3;
        kvd_kv_view view = {fmt, BS, KVH, HD, k, v, fp8s ? ks : one, fp8s ? vs : one, 0, NULL, 0};
        /* four splits a row fit: 256-position splits (the grid would take 128) */
        const size_t split_floats = (size_t)N * NH * (HD + 2), scratch_floats = 4 * split_floats;
        void *dk = kvd_cuda_alloc(pool), *dv = kvd_cuda_alloc(pool);
        float *dks = kvd_cuda_alloc(sizeof ks), *dvs = kvd_cuda_alloc(sizeof vs);
        int32_t *dbt = kvd_cuda_alloc(sizeof blocks);
        int *didx = kvd_cuda_alloc(sizeof(int) * 2 * N);
        float *dq = kvd_cuda_alloc(sizeof(float) * qn), *dout = kvd_cuda_alloc(sizeof(float) * on);
        float *dscr = kvd_cuda_alloc(sizeof(float) * scratch_floats);
        int up = kvd_cuda_upload(dk, k, pool) | kvd_cuda_upload(dv, v, pool) |
                 kvd_cuda_upload(dks, view.k_scale, sizeof ks) |
                 kvd_cuda_upload(dvs, view.v_scale, sizeof vs) |
                 kvd_cuda_upload(dbt, blocks, sizeof blocks) |
                 kvd_cuda_upload(didx, qrow, sizeof qrow) |
                 kvd_cuda_upload(didx + N, ctx, sizeof ctx) |
                 kvd_cuda_upload(dq, q, sizeof(float) * qn) |
                 kvd_cuda_upload(dout, out, sizeof(float) * on);
        kvd_kv_view dview = {fmt, BS, KVH, HD, dk, dv, dks, dvs, 0, NULL, 0};
        char err[256];
        /* slot 1 of three a row */
        int rc = kvd_cuda_attn_decode_rows_dev(&dview, dbt, N, didx, didx + N, 1000, dq, no, NH,
                                               0.09f, dout + no, 3 * no, dscr, scratch_floats);
        int short_rc =
            kvd_cuda_attn_decode_rows_dev(&dview, dbt, N, didx, didx + N, 1000, dq, no, NH, 0.09f,
                                          dout, 3 * no, dscr, split_floats - 1);
        CHECK(up == 0 && rc == 0 && kvd_cuda_sync(err, sizeof err) == 0 &&
                  kvd_cuda_download(out, dout, sizeof(float) * on) == 0,
              "decode over listed rows (%d heads, fmt %d) failed (%d)\n", NH, fi, rc);
        CHECK(short_rc != 0, "decode over listed rows took a scratch of no whole split\n");
        void *work = malloc(kvd_attn_work_bytes(NH, HD, 1000, 3));
        for (int r = 0; r < N; r++) {
            int kept = 1;
            for (size_t i = 0; i < no; i++)
                kept &= out[3 * r * no + i] == 7.0f && out[(3 * r + 2) * no + i] == 7.0f;
            CHECK(kept, "decode over listed rows (%d heads, fmt %d) wrote outside row %d's slot\n",
                  NH, fi, r);
            kvd_attn_paged(&view, blocks, ctx[r], q + (size_t)qrow[r] * no, NH, 0.09f, ref, NULL,
                           work, 3);
            double e = rel_l2(out + (3 * r + 1) * no, ref, no);
            CHECK(e < 1e-4,
                  "decode over listed rows (%d heads, fmt %d) row %d (%d tokens): rel L2 %g\n", NH,
                  fi, r, ctx[r], e);
        }
        free(work);
        kvd_cuda_free(dk), kvd_cuda_free(dv), kvd_cuda_free(dks), kvd_cuda_free(dvs);
        kvd_cuda_free(dbt), kvd_cuda_free(didx), kvd_cuda_free(dq), kvd_cuda_free(dout);
        kvd_cuda_free(dscr);
        free(src), free(q), free(out), free(ref), free(k), free(v);
    }
}

/* v3 decode's split length: for every format it reads and head_dim, at the model's
 * shapes and contexts from one block to 256K, the fewest positions (128
 * times a power of two) whose grid fits one wave, and the grid of half
 * that would not; on a device of 132 SMs with room for two CTAs each (an
 * H100's or H200's, and the simulator's), the qwen3.5 shape's splits at
 * C = 1: 256 positions at 32K, 1024 at 128K. */
static void split_rule(void) {
    static const int hds[3] = {64, 128, 256}, kvs[3] = {1, 2, 8}, ns[4] = {1, 3, 8, 32};
    static const int ctxs[6] = {16, 128, 1100, 32768, 131072, 262144};
    for (int fmt = 0; fmt < KVD_FMT_I8T_RN + 1; fmt++)
        for (int hi = 0; hi < 3; hi++) {
            const int wave = kvd_cuda_attn_wave(fmt, hds[hi]);
            if (!kvd_fmt_decode_tc(fmt, hds[hi])) { /* v3 does not read it: no wave, no split */
                CHECK(wave == 0 && kvd_cuda_attn_split_len(fmt, hds[hi], 2, 1, 4096) == 0,
                      "split rule: format %d, head_dim %d (no v3) has a wave of %d\n", fmt, hds[hi],
                      wave);
                continue;
            }
            CHECK(wave > 0, "split rule: no wave for format %d, head_dim %d\n", fmt, hds[hi]);
            if (wave <= 0) continue;
            for (int ki = 0; ki < 3; ki++)
                for (int ni = 0; ni < 4; ni++)
                    for (int ci = 0; ci < 6; ci++) {
                        const int kv = kvs[ki], n = ns[ni], ctx = ctxs[ci];
                        const int ps = kvd_cuda_attn_split_len(fmt, hds[hi], kv, n, ctx);
                        const long long grid = (long long)n * kv * ((ctx + ps - 1) / ps),
                                        half = (long long)n * kv * ((ctx + ps / 2 - 1) / (ps / 2));
                        const int pow2 =
                            ps >= 128 && ps % 128 == 0 && !((ps / 128) & (ps / 128 - 1));
                        CHECK(pow2 && (grid <= wave || ps >= ctx) && (ps == 128 || half > wave),
                              "split rule: format %d, head_dim %d, %d KV heads, %d entries of %d "
                              "positions: %d a split (grid %lld, wave %d)\n",
                              fmt, hds[hi], kv, n, ctx, ps, grid, wave);
                    }
        }
    if (kvd_cuda_attn_wave(0, 256) == 264) {
        CHECK(kvd_cuda_attn_split_len(0, 256, 2, 1, 32768) == 256 &&
                  kvd_cuda_attn_split_len(1, 256, 2, 1, 32768) == 256 &&
                  kvd_cuda_attn_split_len(0, 256, 2, 1, 131072) == 1024 &&
                  kvd_cuda_attn_split_len(0, 256, 2, 32, 32768) == 8192,
              "split rule, 264 CTAs a wave: %d and %d at 32K, %d at 128K, %d at C = 32\n",
              kvd_cuda_attn_split_len(0, 256, 2, 1, 32768),
              kvd_cuda_attn_split_len(1, 256, 2, 1, 32768),
              kvd_cuda_attn_split_len(0, 256, 2, 1, 131072),
              kvd_cuda_attn_split_len(0, 256, 2, 32, 32768));
    }
}

/* Per-token caches in blocks of 6 rows: a block's segment of 6 (hd + 4)
 * bytes leaves the next head's codes 8-aligned, too little for the stages'
 * 16-byte copies. Decode v3 and the tensor-core prefill refuse such pools
 * when forced, and left to choose, decode takes v2 (the CPU's output within
 * 1e-4 relative L2 per head) and prefill the FP32 tiles (version 1's bytes). */
static void attention_unaligned_blocks(void) {
    enum { NH = 8, KVH = 2, HD = 128, BS = 6, CTX = 300, NQ = 5 };
    const int nb = (CTX + BS - 1) / BS + 3;
    const kvd_fmt fmts[2] = {KVD_FMT_E4M3T, KVD_FMT_I8T};
    for (int fi = 0; fi < 2; fi++) {
        const size_t n = (size_t)nb * KVH * BS * HD, pb = n / HD * kvd_fmt_row_bytes(fmts[fi], HD);
        float *src = malloc(sizeof(float) * n), q[NQ * NH * HD], ocpu[NH * HD], ogpu[NH * HD];
        float p1[NQ * NH * HD], p0[NQ * NH * HD], one[KVH] = {1.0f, 1.0f};
        uint8_t *k = malloc(pb), *v = malloc(pb);
        uint64_t key = kvd_rng_key((uint64_t)fi, "gpu.attn.unaligned");
        for (size_t i = 0; i < n; i++) src[i] = 2.0f * kvd_rng_normal(key, i);
        for (int i = 0; i < NQ * NH * HD; i++) q[i] = kvd_rng_normal(key, n + (uint64_t)i);
        write_pools(fmts[fi], src, k, v, n, 1.0f, 1.0f, HD, BS);
        int32_t blocks[(CTX + BS - 1) / BS + 3];
        for (int i = 0; i < nb; i++) blocks[i] = (int32_t)((i * 7) % nb);
        kvd_kv_view view = {fmts[fi], BS, KVH, HD, k, v, one, one, 0, NULL, 0};
        void *work = malloc(kvd_attn_work_bytes(NH, HD, CTX, 3));
        kvd_attn_paged(&view, blocks, CTX, q, NH, 1.0f / 16.0f, ocpu, NULL, work, 3);
        CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, CTX, q, NH, 1.0f / 16.0f, ogpu, 3) != 0,
              "attention v3 accepted format %d in blocks of %d rows\n", (int)fmts[fi], BS);
        CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, CTX, q, NH, 1.0f / 16.0f, ogpu, 0) == 0,
              "attention, format %d in blocks of %d rows, failed\n", (int)fmts[fi], BS);
        double worst = 0;
        for (int h = 0; h < NH; h++) {
            double num = 0, den = 0;
            for (int d = 0; d < HD; d++) {
                const double e = (double)ogpu[h * HD + d] - ocpu[h * HD + d];
                num += e * e, den += (double)ocpu[h * HD + d] * ocpu[h * HD + d];
            }
            worst = worst_of(worst, sqrt(num / den));
        }
        CHECK(worst < 1e-4, "attention, format %d in blocks of %d rows: rel L2 %g\n", (int)fmts[fi],
              BS, worst);
        CHECK(kvd_cuda_attn_prefill_v(&view, nb, blocks, CTX - NQ, NQ, q, NH, 1.0f / 16.0f, p1,
                                      2) != 0,
              "tensor-core prefill accepted format %d in blocks of %d rows\n", (int)fmts[fi], BS);
        CHECK(kvd_cuda_attn_prefill_v(&view, nb, blocks, CTX - NQ, NQ, q, NH, 1.0f / 16.0f, p1,
                                      1) == 0 &&
                  kvd_cuda_attn_prefill_v(&view, nb, blocks, CTX - NQ, NQ, q, NH, 1.0f / 16.0f, p0,
                                          0) == 0 &&
                  memcmp(p0, p1, sizeof p0) == 0,
              "prefill, format %d in blocks of %d rows: not version 1's output\n", (int)fmts[fi],
              BS);
        free(src), free(k), free(v), free(work);
    }
}

static void attention(void) {
    split_rule();
    attention_case(8, 2, 256, 3000);  /* G 4 */
    attention_case(32, 2, 256, 1100); /* the qwen3.5 shape, G 16 */
    attention_case(12, 4, 128, 777);  /* G 3 (v3 only) */
    attention_case(4, 4, 64, 130);    /* G 1 */
    attention_codes();
    attention_unaligned_blocks();
    attention_batch();
    attention_rows();
}

/* FP8 attention's output against the CPU's (cpu; plain: the CPU's without
 * the weights rounded), over n values: within a twentieth of what rounding
 * the weights moves it by, and 1e-4 relative L2 where that is less. The
 * device's scores and exponentials and the CPU's differ in the last bits, so
 * a weight that close to an E4M3 rounding boundary may land one code apart
 * (about 1 in 10^5 on the tensor cores, 1 in 10^6 on the plain kernels). */
static void check_fp8_out(const float *got, const float *cpu, const float *plain, size_t n,
                          const char *what, int nh, int kvh, int hd, int n_ctx) {
    double num = 0, den = 0, mv = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)got[i] - cpu[i], m = (double)plain[i] - cpu[i];
        num += e * e, mv += m * m, den += (double)cpu[i] * cpu[i];
    }
    const double worst = sqrt(num / den), moved = sqrt(mv / den);
    CHECK(moved > 1e-4 && worst < fmax(1e-4, moved / 20),
          "fp8 attention, %s (%d/%d heads x %d, %d tokens): rel L2 %g, the weights' rounding "
          "moves it %g\n",
          what, nh, kvh, hd, n_ctx, worst, moved);
}

/* FP8 attention (FlashAttention 3's rule) against kvd_attn_paged's: the
 * query's E4M3 round trip bit for bit (rows at a stride, per-head scales,
 * values past 448 times the scale saturating), then whole attention with
 * the query and the weights in E4M3 over an E4M3 cache (check_fp8_out):
 * the plain kernels, decode v3's two passes, and prefill v2's (a chunk of
 * rows; one launch and split over the context; the query's fragments in
 * shared memory and split per stage). v2 and prefill v1 do not round the
 * weights, and say so. */
static void fp8_attention_case(int nh, int kvh, int hd, int n_ctx) {
    const int bs = 16, nb = (n_ctx + bs - 1) / bs + 3, rows = 3;
    const size_t n = (size_t)nb * kvh * bs * hd, stride = (size_t)nh * hd + 8;
    float *src = malloc(sizeof(float) * n), *q = malloc(sizeof(float) * rows * stride);
    float *qc = malloc(sizeof(float) * rows * stride), *qg = malloc(sizeof(float) * rows * stride);
    float *ocpu = malloc(sizeof(float) * nh * hd), *ogpu = malloc(sizeof(float) * nh * hd);
    float *oplain = malloc(sizeof(float) * nh * hd), qs[64], ks[16], vs[16];
    uint8_t *k = malloc(n), *v = malloc(n);
    uint64_t key = kvd_rng_key((uint64_t)(nh * 1000 + hd), "gpu.fp8attn");
    for (size_t i = 0; i < n; i++) src[i] = 2.0f * kvd_rng_normal(key, i);
    write_pools(KVD_FMT_E4M3, src, k, v, n, 0.02f, 0.01f, hd, bs);
    for (int h = 0; h < kvh; h++) ks[h] = 0.02f, vs[h] = 0.01f;
    for (int h = 0; h < nh; h++) qs[h] = h % 3 == 0 ? 1.0f : 0.004f * (float)(h + 1);
    for (size_t i = 0; i < rows * stride; i++)
        q[i] = (float)(i % 97 == 0 ? 40.0 : 1.0) * kvd_rng_normal(key, n + i);
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < nb; i++) blocks[i] = (int32_t)(((int64_t)i * 37) % nb);
    /* the query's round trip: the CPU's codec, row by row and head by head */
    memcpy(qc, q, sizeof(float) * rows * stride);
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < nh; h++) {
            uint8_t codes[512];
            float *x = qc + r * stride + (size_t)h * hd;
            kvd_quant_e4m3(x, codes, (size_t)hd, qs[h], 1, NULL);
            kvd_dequant_e4m3(codes, x, (size_t)hd, qs[h]);
        }
    float *dq = kvd_cuda_alloc(sizeof(float) * rows * stride), *dqs = kvd_cuda_alloc(sizeof qs);
    CHECK(dq && dqs && !kvd_cuda_upload(dq, q, sizeof(float) * rows * stride) &&
              !kvd_cuda_upload(dqs, qs, sizeof qs) &&
              !kvd_cuda_attn_fp8_query_dev(dq, dq, rows, stride, nh, hd, dqs) &&
              !kvd_cuda_download(qg, dq, sizeof(float) * rows * stride),
          "fp8 query (%d heads x %d) failed\n", nh, hd);
    size_t differ = 0;
    for (int r = 0; r < rows; r++)
        for (size_t i = 0; i < (size_t)nh * hd; i++)
            differ += memcmp(&qg[r * stride + i], &qc[r * stride + i], 4) != 0;
    CHECK(differ == 0, "fp8 query (%d heads x %d): %zu of %zu values differ from the CPU's\n", nh,
          hd, differ, (size_t)rows * nh * hd);
    kvd_cuda_free(dq), kvd_cuda_free(dqs);
    /* whole attention, FP8 query and weights, against the CPU's (3 parts) */
    kvd_kv_view view = {KVD_FMT_E4M3, bs, kvh, hd, k, v, ks, vs, 0, qs, 1};
    kvd_kv_view plain = view;
    plain.p_fp8 = 0;
    void *work = malloc(kvd_attn_work_bytes(nh, hd, n_ctx, 3));
    kvd_attn_paged(&view, blocks, n_ctx, q, nh, 1.0f / 16.0f, ocpu, NULL, work, 3);
    kvd_attn_paged(&plain, blocks, n_ctx, q, nh, 1.0f / 16.0f, oplain, NULL, work, 3);
    CHECK(kvd_cuda_attn_fp8(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu) == 0,
          "cuda fp8 attention (%d/%d heads x %d, %d tokens) failed\n", nh, kvh, hd, n_ctx);
    check_fp8_out(ogpu, ocpu, oplain, (size_t)nh * hd, "plain kernels", nh, kvh, hd, n_ctx);
    /* the tensor-core kernels take the query as given: the CPU's rounding */
    const int v3 = (hd == 64 || hd == 128 || hd == 256) && nh / kvh <= 16;
    memset(ogpu, 0, sizeof(float) * nh * hd);
    CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, qc, nh, 1.0f / 16.0f, ogpu, 3) ==
              (v3 ? 0 : -1),
          "cuda fp8 attention, decode v3 (%d/%d heads x %d): %s\n", nh, kvh, hd,
          v3 ? "failed" : "ran a shape it does not take");
    if (v3) check_fp8_out(ogpu, ocpu, oplain, (size_t)nh * hd, "decode v3", nh, kvh, hd, n_ctx);
    CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, qc, nh, 1.0f / 16.0f, ogpu, 2) == -1,
          "cuda fp8 attention: decode v2 ran, but it does not round the weights\n");
    /* prefill: a chunk of 3 rows ending at n_ctx - 1, contiguous */
    enum { NQ = 3 };
    const size_t no = (size_t)nh * hd;
    float *pq = malloc(sizeof(float) * NQ * no), *pcpu = malloc(sizeof(float) * NQ * no);
    float *pplain = malloc(sizeof(float) * NQ * no), *pgpu = malloc(sizeof(float) * NQ * no);
    for (int r = 0; r < NQ; r++) {
        const int n_r = n_ctx - NQ + 1 + r;
        memcpy(pq + r * no, qc + r * stride, sizeof(float) * no);
        kvd_attn_paged(&view, blocks, n_r, q + r * stride, nh, 1.0f / 16.0f, pcpu + r * no, NULL,
                       work, 3);
        kvd_attn_paged(&plain, blocks, n_r, q + r * stride, nh, 1.0f / 16.0f, pplain + r * no, NULL,
                       work, 3);
    }
    for (int ver = 2; ver <= 5; ver++) {
        const int rc = kvd_cuda_attn_prefill_v(&view, nb, blocks, n_ctx - NQ, NQ, pq, nh,
                                               1.0f / 16.0f, pgpu, ver);
        CHECK(rc == (v3 ? 0 : -1), "cuda fp8 attention, prefill version %d (%d/%d x %d): %s\n", ver,
              nh, kvh, hd, v3 ? "failed" : "ran a shape it does not take");
        if (rc) continue;
        char what[32];
        snprintf(what, sizeof what, "prefill version %d", ver);
        check_fp8_out(pgpu, pcpu, pplain, NQ * no, what, nh, kvh, hd, n_ctx);
    }
    CHECK(kvd_cuda_attn_prefill_v(&view, nb, blocks, n_ctx - NQ, NQ, pq, nh, 1.0f / 16.0f, pgpu,
                                  1) == -1,
          "cuda fp8 attention: prefill v1 ran, but it does not round the weights\n");
    free(pq), free(pcpu), free(pplain), free(pgpu);
    /* the query alone (no weights rounded): the plain kernels */
    CHECK(kvd_cuda_attn_fp8(&plain, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu) == 0,
          "cuda fp8-query attention failed\n");
    double w2 = 0;
    for (int h = 0; h < nh; h++) {
        double num = 0, den = 0;
        for (int d = 0; d < hd; d++) {
            double e = (double)ogpu[h * hd + d] - oplain[h * hd + d];
            num += e * e, den += (double)oplain[h * hd + d] * oplain[h * hd + d];
        }
        w2 = worst_of(w2, sqrt(num / den));
    }
    CHECK(w2 < 1e-4, "fp8-query attention (%d/%d heads x %d): rel L2 %g\n", nh, kvh, hd, w2);
    free(src), free(q), free(qc), free(qg), free(ocpu), free(ogpu), free(oplain), free(k), free(v),
        free(blocks), free(work);
}

/* the attention sink of unit_kvcache's fp8_attention_sink, in closed form:
 * the weights of the positions 12 nats below the sink land in E4M3's
 * subnormal range, where the offset 2^8 decides what they keep (2^7 would
 * round them to zero). The plain kernels at head_dim 16, within 1e-5; decode
 * v3 and prefill v2 (a chunk of NQ rows, each over its own context; versions
 * 2 to 5) at 64, within 1e-4: their running sums are FP32, and 1 + 999
 * weights of 6e-6 gather rounding errors of up to 2^-24 each. */
static double sink_want(int n) {
    return (n - 1) * ldexp(1.0, -17) / (1.0 + (n - 1) * (double)expf(-12.0f));
}
static void fp8_attention_sink(int D) {
    enum { N = 1000, BS = 16, NB = (N + BS - 1) / BS, NQ = 4 };
    uint8_t *k = calloc((size_t)NB * BS * D, 1), *v = calloc((size_t)NB * BS * D, 1);
    int32_t blocks[NB];
    for (int i = 0; i < NB; i++) blocks[i] = i;
    k[0] = kvd_f32_to_e4m3(12.0f, 1);
    for (int t = 1; t < N; t++)
        for (int d = 0; d < D; d++) v[(size_t)t * D + d] = kvd_f32_to_e4m3(1.0f, 1);
    float one = 1.0f, q[NQ][64] = {{1.0f}, {1.0f}, {1.0f}, {1.0f}}, out[NQ][64];
    kvd_kv_view view = {KVD_FMT_E4M3, BS, 1, D, k, v, &one, &one, 0, &one, 1};
    const double want = sink_want(N), tol = D == 64 ? 1e-4 : 1e-5;
    if (D != 64) {
        CHECK(kvd_cuda_attn_fp8(&view, NB, blocks, N, q[0], 1, 1.0f, out[0]) == 0,
              "cuda fp8 attention (sink) failed\n");
    } else {
        CHECK(kvd_cuda_attn_decode_v(&view, NB, blocks, N, q[0], 1, 1.0f, out[0], 3) == 0,
              "cuda fp8 attention (sink, decode v3) failed\n");
    }
    for (int d = 0; d < D; d++)
        CHECK(fabs(out[0][d] - want) <= tol * want,
              "fp8 attention sink (head_dim %d): dim %d %.9g, want %.9g\n", D, d, out[0][d], want);
    for (int ver = 2; ver <= 5 && D == 64; ver++) {
        CHECK(kvd_cuda_attn_prefill_v(&view, NB, blocks, N - NQ, NQ, q[0], 1, 1.0f, out[0], ver) ==
                  0,
              "cuda fp8 attention (sink, prefill version %d) failed\n", ver);
        for (int r = 0; r < NQ; r++) {
            const double w = sink_want(N - NQ + 1 + r);
            for (int d = 0; d < D; d++)
                CHECK(fabs(out[r][d] - w) <= tol * w,
                      "fp8 attention sink, prefill version %d: row %d dim %d %.9g, want %.9g\n",
                      ver, r, d, out[r][d], w);
        }
    }
    free(k), free(v);
}

static void fp8_attention(void) {
    fp8_attention_sink(16);
    fp8_attention_sink(64);
    fp8_attention_case(8, 2, 64, 300);
    fp8_attention_case(32, 2, 256, 1100); /* the qwen3.5 shape */
    fp8_attention_case(6, 2, 40, 77);
}

/* cuBLASLt BF16 GEMM against a double-precision product of the same BF16
 * values: FP32 accumulation over K = 1024 terms stays within 1e-5 relative. */
static void gemm(void) {
    const int shapes[3][3] = {{1, 512, 1024}, {64, 4096, 1024}, {257, 3072, 1024}};
    for (int si = 0; si < 3; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        uint16_t *x = malloc(2 * (size_t)M * K), *w = malloc(2 * (size_t)N * K);
        float *y = malloc(4 * (size_t)M * N);
        uint64_t key = kvd_rng_key((uint64_t)si, "gpu.gemm");
        for (int i = 0; i < M * K; i++) x[i] = kvd_f32_to_bf16(kvd_rng_normal(key, (uint64_t)i));
        for (int i = 0; i < N * K; i++)
            w[i] = kvd_f32_to_bf16(kvd_rng_normal(key, (uint64_t)i + (1ull << 30)));
        CHECK(kvd_cuda_linear_bf16(x, w, y, M, N, K) == 0, "cuBLASLt GEMM %dx%dx%d failed\n", M, N,
              K);
        double num = 0, den = 0;
        for (int m = 0; m < M; m += (M > 8 ? M / 8 : 1))
            for (int n = 0; n < N; n += 7) {
                double acc = 0;
                for (int k = 0; k < K; k++)
                    acc += (double)kvd_bf16_to_f32(x[(size_t)m * K + k]) *
                           kvd_bf16_to_f32(w[(size_t)n * K + k]);
                double e = y[(size_t)m * N + n] - acc;
                num += e * e, den += acc * acc;
            }
        CHECK(sqrt(num / den) < 1e-5, "GEMM %dx%dx%d: rel L2 %g\n", M, N, K, sqrt(num / den));
        free(x), free(w), free(y);
    }
}

static void fill(float *x, size_t n, const char *name, float scale) {
    uint64_t key = kvd_rng_key(11, name);
    for (size_t i = 0; i < n; i++) x[i] = scale * kvd_rng_normal(key, i);
}

/* the simulator's count of cuBLASLt products by algorithm id 1-3 (absent on
 * a GPU): id 1 is the heuristic's first, id 2 the one tuning must pick */
extern unsigned long long kvd_simt_lt_calls(int id) __attribute__((weak));
static void lt_calls(unsigned long long n[4]) {
    for (int id = 1; id < 4; id++) n[id] = kvd_simt_lt_calls ? kvd_simt_lt_calls(id) : 0;
}

/* KVD_CUDA_GEMM=tune (kvd_cuda_gemm_set_tune): the choice rule on made-up
 * timings; the exact split's products, stacked and accumulated, tuned at
 * their first use and to the CPU's tolerance, a tuned shape's second
 * product bit for bit its first; a full table tunes no new shape. In the
 * simulator, whose algorithms compute alike and differ in the time the
 * events see, the tuned products are the untuned ones bit for bit, every
 * candidate is timed as often as the others (a warm-up and two batches of
 * four) and every product after goes to the fastest. */
/* the product of shape i of the tuned table's filler, up to SM x SM x SK:
 * M = 1 + i % SM, N = 1 + i / SM % SM, K = 8 + i / SM^2 (x [SM][SK] and y
 * [SM][SM] hold every one) */
enum { SM = 16, SK = 32 };
static int small_product(const void *x, const void *w, void *y, int i) {
    return kvd_cuda_linear_bf16_dev(x, w, y, 1 + i % SM, 1 + i / SM % SM, 8 + i / (SM * SM));
}

static void gemm_tuning(void) {
    static const struct {
        int n;
        float ms[4];
        int want;
    } picks[] = {
        {3, {10, 9.6f, 9.2f}, 2}, /* 9.6 is within 5% of 10, 9.2 is not */
        {2, {10, 9.6f}, 0},       /* a near-tie keeps the heuristic's order */
        {3, {-1, 5, 4.9f}, 1},    /* the first failed */
        {3, {10, 5, 4.8f}, 1},    /* measured against the one kept, not the first */
        {3, {0, NAN, 8}, 2},      /* 0 and NaN are no timings */
        {4, {-1, -1, 0, -1}, -1}, /* none ran */
        {0, {0}, -1},
    };
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        const int got = kvd_cuda_gemm_pick(picks[i].ms, picks[i].n);
        CHECK(got == picks[i].want, "gemm tuning: pick case %zu chose %d, expected %d\n", i, got,
              picks[i].want);
    }
    const int simt = kvd_simt_lt_calls != NULL;
    /* a shape of its own (no other section uses it): the split stacked
     * (144 rows) and accumulated (48) */
    const int M = 48, N = 200, K = 1000, FILL = 4096 / 4 * 3;
    float *x = malloc(sizeof(float) * M * K), *wf = malloc(sizeof(float) * N * K);
    float *yc = malloc(sizeof(float) * M * N), *y[3];
    uint16_t *w = malloc(2 * (size_t)N * K);
    for (int i = 0; i < 3; i++) y[i] = malloc(sizeof(float) * M * N);
    fill(x, (size_t)M * K, "gpu.tune.x", 1.0f);
    fill(wf, (size_t)N * K, "gpu.tune.w", 0.05f);
    kvd_quant_bf16(wf, w, (size_t)N * K);
    kvd_dequant_bf16(w, wf, (size_t)N * K);
    kvd_linear(x, wf, yc, M, N, K);
    float *dx = kvd_cuda_alloc(sizeof(float) * M * K), *dy = kvd_cuda_alloc(sizeof(float) * M * N);
    void *dw = kvd_cuda_alloc(2 * (size_t)N * K);
    char err[256] = "";
    int ok = dx && dy && dw && !kvd_cuda_upload(dx, x, sizeof(float) * M * K) &&
             !kvd_cuda_upload(dw, w, 2 * (size_t)N * K);
    CHECK(ok, "gemm tuning: no room for a %dx%dx%d product\n", M, N, K);
    for (int mode = 1; ok && mode <= 2; mode++) {
        const char *how = mode == 1 ? "stacked" : "accumulated";
        const int products = mode == 1 ? 1 : 3;
        unsigned long long before[4], tuned[4], again[4];
        const int tuned0 = kvd_cuda_gemm_tuned();
        /* untuned, tuned at first use, tuned again */
        for (int r = 0; ok && r < 3; r++) {
            kvd_cuda_gemm_set_tune(r > 0);
            if (r == 1) lt_calls(before);
            ok = !kvd_cuda_linear_split_dev(dx, dw, dy, M, N, K, mode) &&
                 !kvd_cuda_sync(err, sizeof err) &&
                 !kvd_cuda_download(y[r], dy, sizeof(float) * M * N);
            CHECK(ok, "gemm tuning (%s, run %d): %s\n", how, r, err);
            lt_calls(r == 1 ? tuned : again);
        }
        kvd_cuda_gemm_set_tune(-1);
        if (!ok) break;
        const double e = rel_l2(y[1], yc, (size_t)M * N);
        CHECK(e < 1.5e-6, "gemm tuning (%s): tuned product rel L2 %g from the CPU's\n", how, e);
        CHECK(!memcmp(y[2], y[1], sizeof(float) * M * N),
              "gemm tuning (%s): a tuned shape's second product differs from its first\n", how);
        CHECK(kvd_cuda_gemm_tuned() == tuned0 + 1,
              "gemm tuning (%s): %d shapes tuned, expected %d\n", how, kvd_cuda_gemm_tuned(),
              tuned0 + 1);
        if (!simt) continue;
        CHECK(!memcmp(y[1], y[0], sizeof(float) * M * N),
              "gemm tuning (%s): the simulator's algorithms gave different products\n", how);
        /* the first tuned run: 9 timed products of each candidate, then the
         * call's own by the fastest; the second: the fastest only */
        CHECK(tuned[1] - before[1] == 9 && tuned[3] - before[3] == 9 &&
                  tuned[2] - before[2] == 9u + products,
              "gemm tuning (%s): products by algorithm 1/2/3 while tuning: %llu/%llu/%llu, "
              "expected 9/%d/9\n",
              how, tuned[1] - before[1], tuned[2] - before[2], tuned[3] - before[3], 9 + products);
        CHECK(again[1] == tuned[1] && again[3] == tuned[3] &&
                  again[2] - tuned[2] == (unsigned)products,
              "gemm tuning (%s): the tuned shape's second call ran algorithms 1/2/3 "
              "%llu/%llu/%llu times, expected 0/%d/0\n",
              how, again[1] - tuned[1], again[2] - tuned[2], again[3] - tuned[3], products);
    }
    /* fill the table to its 3/4 with small shapes (small_product), then a
     * new shape keeps the heuristic's first choice untimed */
    uint16_t *xs = calloc((size_t)SM * SK, 2);
    void *dxs = kvd_cuda_alloc((size_t)SM * SK * 2), *dys = kvd_cuda_alloc(sizeof(float) * SM * SM);
    kvd_cuda_gemm_set_tune(1);
    ok = xs && dxs && dys && !kvd_cuda_upload(dxs, xs, (size_t)SM * SK * 2);
    int shape = 0;
    for (; ok && kvd_cuda_gemm_tuned() < FILL && shape < FILL; shape++)
        ok = !small_product(dxs, dw, dys, shape);
    CHECK(ok && kvd_cuda_gemm_tuned() == FILL, "gemm tuning: %d shapes tuned filling the table\n",
          kvd_cuda_gemm_tuned());
    unsigned long long c0[4], c1[4];
    lt_calls(c0);
    ok = ok && !small_product(dxs, dw, dys, shape) && !kvd_cuda_sync(err, sizeof err);
    lt_calls(c1);
    CHECK(ok && kvd_cuda_gemm_tuned() == FILL, "gemm tuning: a full table took a shape (%d) %s\n",
          kvd_cuda_gemm_tuned(), err);
    if (simt)
        CHECK(c1[1] - c0[1] == 1 && c1[2] == c0[2] && c1[3] == c0[3],
              "gemm tuning: a shape past the full table ran algorithms 1/2/3 %llu/%llu/%llu "
              "times, expected 1/0/0\n",
              c1[1] - c0[1], c1[2] - c0[2], c1[3] - c0[3]);
    /* the accumulated split again, after 3000 other shapes have passed
     * through the 256 plans (its own remade): its tuned algorithm, not
     * timed again */
    lt_calls(c0);
    ok = ok && !kvd_cuda_linear_split_dev(dx, dw, dy, M, N, K, 2) &&
         !kvd_cuda_sync(err, sizeof err) && !kvd_cuda_download(y[0], dy, sizeof(float) * M * N);
    lt_calls(c1);
    CHECK(ok && !memcmp(y[0], y[1], sizeof(float) * M * N),
          "gemm tuning: a tuned shape's product changed after its plan was remade %s\n", err);
    if (simt)
        CHECK(c1[1] == c0[1] && c1[2] - c0[2] == 3 && c1[3] == c0[3],
              "gemm tuning: a tuned shape, its plan remade, ran algorithms 1/2/3 %llu/%llu/%llu "
              "times, expected 0/3/0\n",
              c1[1] - c0[1], c1[2] - c0[2], c1[3] - c0[3]);
    kvd_cuda_gemm_set_tune(-1);
    kvd_cuda_free(dxs), kvd_cuda_free(dys), free(xs);
    kvd_cuda_free(dx), kvd_cuda_free(dy), kvd_cuda_free(dw);
    free(x), free(wf), free(yc), free(w);
    for (int i = 0; i < 3; i++) free(y[i]);
}

/* The model's own projection (kvd_cudaop_linear: FP32 activations, BF16
 * weights, FP32 sums) against kvd_linear over the same weights, on both of
 * its paths (warp per column below KVD_LINEAR_TILED_ROWS rows, 64 x 64
 * tiles from there), with edges that fill no tile: the two differ only in
 * the order of 1000-term FP32 sums, 1e-5 relative. */
static void linear_multi(void);
static void linear_add_gated(void);
static void linear_w16(void) {
    const int shapes[8][3] = {{1, 512, 1024},  {3, 200, 1000},  {6, 130, 2048},  {16, 300, 1000},
                              {63, 129, 1000}, {67, 512, 1023}, {200, 77, 1000}, {513, 1031, 1032}};
    for (int si = 0; si < 8; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *x = malloc(sizeof(float) * (size_t)M * K),
              *wf = malloc(sizeof(float) * (size_t)N * K);
        float *yc = malloc(sizeof(float) * (size_t)M * N),
              *yg = malloc(sizeof(float) * (size_t)M * N);
        uint16_t *w = malloc(2 * (size_t)N * K);
        fill(x, (size_t)M * K, "gpu.linear.x", 1.0f);
        fill(wf, (size_t)N * K, "gpu.linear.w", 0.05f);
        kvd_quant_bf16(wf, w, (size_t)N * K);
        kvd_dequant_bf16(w, wf, (size_t)N * K);
        kvd_linear(x, wf, yc, M, N, K);
        float *dx = kvd_cuda_alloc(sizeof(float) * (size_t)M * K),
              *dy = kvd_cuda_alloc(sizeof(float) * (size_t)M * N);
        void *dw = kvd_cuda_alloc(2 * (size_t)N * K);
        char err[256] = "";
        int ok = dx && dy && dw && !kvd_cuda_upload(dx, x, sizeof(float) * (size_t)M * K) &&
                 !kvd_cuda_upload(dw, w, 2 * (size_t)N * K);
        /* the tensor-core path (x split into three BF16 parts) and the FP32
         * kernels, each to the CPU's FP32 product. Measured in the
         * simulator: 3e-7 to 4e-7 (three parts), 2.4e-7 to 5.9e-7 (FP32
         * kernels); with two parts only, 2.3e-6 to 2.5e-6: the split is held
         * to 1.5e-6, the FP32 kernels to 1e-5 (their sums run in another
         * order, and nvcc fuses them) */
        for (int path = 0; path < 2; path++) {
            int ok2 = ok && !kvd_cuda_zero(dy, sizeof(float) * (size_t)M * N);
            /* the split stacked (as decode runs it) or accumulated, by turns */
            if (ok2 && path == 0) ok2 = !kvd_cuda_linear_split_dev(dx, dw, dy, M, N, K, 1 + si % 2);
            if (ok2 && path == 1) kvd_cudaop_linear_fp32(dx, dw, dy, M, N, K);
            ok2 = ok2 && !kvd_cuda_sync(err, sizeof err) &&
                  !kvd_cuda_download(yg, dy, sizeof(float) * (size_t)M * N);
            CHECK(ok2, "linear %dx%dx%d failed: %s\n", M, N, K, err);
            double e = ok2 ? rel_l2(yg, yc, (size_t)M * N) : 1;
            CHECK(e < (path == 0 ? 1.5e-6 : 1e-5), "linear %dx%dx%d (%s): rel L2 %g\n", M, N, K,
                  path == 0
                      ? (si % 2 ? "three BF16 parts, accumulated" : "three BF16 parts, stacked")
                  : M >= KVD_LINEAR_TILED_ROWS ? "FP32 tiled"
                                               : "FP32 per column",
                  e);
        }
        /* per column, the rows' tile (1, 2, 4, 8 or 16 rows) leaves each
         * row's sums as they are: the product row by row, bit for bit */
        for (int r = 0; ok && M < KVD_LINEAR_TILED_ROWS && r < M; r++)
            kvd_cudaop_linear_fp32(dx + (size_t)r * K, dw, dy + (size_t)r * N, 1, N, K);
        if (ok && M < KVD_LINEAR_TILED_ROWS) {
            float *y1 = malloc(sizeof(float) * (size_t)M * N);
            int ok2 = !kvd_cuda_sync(err, sizeof err) &&
                      !kvd_cuda_download(y1, dy, sizeof(float) * (size_t)M * N);
            CHECK(ok2 && !memcmp(y1, yg, sizeof(float) * (size_t)M * N),
                  "linear %dx%dx%d (FP32 per column): rows one at a time differ from the "
                  "tile's\n",
                  M, N, K);
            free(y1);
        }
        kvd_cuda_free(dx), kvd_cuda_free(dy), kvd_cuda_free(dw);
        free(x), free(wf), free(yc), free(yg), free(w);
    }
    linear_multi();
    linear_add_gated();
}

/* Several projections of one input in a launch (kvd_cudaop_linear_multi):
 * each output bit for bit what its own kvd_cudaop_linear gives, at 1, 3
 * and 8 rows (one launch), 16 and 17 (each through kvd_cudaop_linear), K a
 * multiple of 8 or not, outputs of 300, 0, 77 and 1 columns (the model's
 * shared-expert gate has one), and a single output. */
static void linear_multi(void) {
    enum { NO = 4 };
    const int Ns[NO] = {300, 0, 77, 1}, Ms[5] = {1, 3, 8, 16, 17}, Ks[2] = {1000, 1003};
    for (int ki = 0; ki < 2; ki++)
        for (int mi = 0; mi < 5; mi++)
            for (int n = 1; n <= NO; n += NO - 1) {
                const int M = Ms[mi], K = Ks[ki];
                float *x = malloc(sizeof(float) * (size_t)M * K), *dx = NULL;
                int ok = x != NULL;
                fill(x, (size_t)M * K, "gpu.multi.x", 1.0f);
                dx = kvd_cuda_alloc(sizeof(float) * (size_t)M * K);
                ok = ok && dx && !kvd_cuda_upload(dx, x, sizeof(float) * (size_t)M * K);
                kvd_lin_out outs[NO];
                float *dref[NO], *h1[NO], *h2[NO];
                for (int j = 0; j < n; j++) {
                    const size_t nw = (size_t)Ns[j] * K, ny = (size_t)M * Ns[j];
                    float *wf = malloc(sizeof(float) * (nw ? nw : 1));
                    uint16_t *w = malloc(2 * (nw ? nw : 1));
                    char name[32];
                    snprintf(name, sizeof name, "gpu.multi.w%d", j);
                    fill(wf, nw, name, 0.05f);
                    kvd_quant_bf16(wf, w, nw);
                    void *dw = kvd_cuda_alloc(2 * (nw ? nw : 1));
                    outs[j] =
                        (kvd_lin_out){dw, kvd_cuda_alloc(sizeof(float) * (ny ? ny : 1)), Ns[j]};
                    dref[j] = kvd_cuda_alloc(sizeof(float) * (ny ? ny : 1));
                    h1[j] = malloc(sizeof(float) * (ny ? ny : 1));
                    h2[j] = malloc(sizeof(float) * (ny ? ny : 1));
                    ok = ok && dw && outs[j].y && dref[j] && !kvd_cuda_upload(dw, w, 2 * nw) &&
                         !kvd_cuda_zero(outs[j].y, sizeof(float) * ny) &&
                         !kvd_cuda_zero(dref[j], sizeof(float) * ny);
                    free(wf), free(w);
                }
                for (int j = 0; ok && j < n; j++)
                    kvd_cudaop_linear(dx, outs[j].w, dref[j], M, Ns[j], K);
                if (ok) kvd_cudaop_linear_multi(dx, M, K, outs, n);
                char err[256] = "";
                ok = ok && !kvd_cuda_sync(err, sizeof err);
                size_t differ = 0;
                for (int j = 0; ok && j < n; j++) {
                    const size_t ny = (size_t)M * Ns[j];
                    ok = !kvd_cuda_download(h1[j], outs[j].y, sizeof(float) * ny) &&
                         !kvd_cuda_download(h2[j], dref[j], sizeof(float) * ny);
                    for (size_t i = 0; ok && i < ny; i++)
                        differ += memcmp(&h1[j][i], &h2[j][i], 4) != 0;
                }
                CHECK(ok && !differ,
                      "linear_multi M %d K %d, %d outputs: %zu values differ from their own "
                      "projections (%s)\n",
                      M, K, n, differ, err);
                for (int j = 0; j < n; j++) {
                    kvd_cuda_free((void *)outs[j].w), kvd_cuda_free(outs[j].y);
                    kvd_cuda_free(dref[j]), free(h1[j]), free(h2[j]);
                }
                kvd_cuda_free(dx), free(x);
            }
}

/* The shared expert's down projection with its gated add in one launch
 * (kvd_cudaop_linear_add_gated): mix bit for bit what kvd_cudaop_linear
 * then kvd_cudaop_add_gated give, at 1, 5 and 16 rows (one launch) and 17
 * (those two), K a multiple of 8 or not. */
static void linear_add_gated(void) {
    enum { N = 300 };
    const int Ms[4] = {1, 5, 16, 17}, Ks[2] = {1000, 1003};
    for (int ki = 0; ki < 2; ki++)
        for (int mi = 0; mi < 4; mi++) {
            const int M = Ms[mi], K = Ks[ki];
            const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
            float *x = malloc(sizeof(float) * nx), *wf = malloc(sizeof(float) * nw),
                  *mix = malloc(sizeof(float) * ny), *gate = malloc(sizeof(float) * M),
                  *m1 = malloc(sizeof(float) * ny), *m2 = malloc(sizeof(float) * ny);
            uint16_t *w = malloc(2 * nw);
            fill(x, nx, "gpu.gated.x", 1.0f);
            fill(wf, nw, "gpu.gated.w", 0.05f);
            fill(mix, ny, "gpu.gated.mix", 1.0f);
            fill(gate, (size_t)M, "gpu.gated.gate", 4.0f);
            kvd_quant_bf16(wf, w, nw);
            float *dx = kvd_cuda_alloc(sizeof(float) * nx),
                  *dy = kvd_cuda_alloc(sizeof(float) * ny),
                  *dm1 = kvd_cuda_alloc(sizeof(float) * ny),
                  *dm2 = kvd_cuda_alloc(sizeof(float) * ny),
                  *dg = kvd_cuda_alloc(sizeof(float) * M);
            void *dw = kvd_cuda_alloc(2 * nw);
            char err[256] = "";
            int ok =
                dx && dy && dm1 && dm2 && dg && dw && !kvd_cuda_upload(dx, x, sizeof(float) * nx) &&
                !kvd_cuda_upload(dw, w, 2 * nw) && !kvd_cuda_upload(dm1, mix, sizeof(float) * ny) &&
                !kvd_cuda_upload(dm2, mix, sizeof(float) * ny) &&
                !kvd_cuda_upload(dg, gate, sizeof(float) * M);
            if (ok) {
                kvd_cudaop_linear(dx, dw, dy, M, N, K);
                kvd_cudaop_add_gated(dm1, dy, dg, M, N);
                kvd_cudaop_linear_add_gated(dx, dw, dy, dm2, dg, M, N, K);
            }
            ok = ok && !kvd_cuda_sync(err, sizeof err) &&
                 !kvd_cuda_download(m1, dm1, sizeof(float) * ny) &&
                 !kvd_cuda_download(m2, dm2, sizeof(float) * ny);
            CHECK(ok && !memcmp(m1, m2, sizeof(float) * ny),
                  "linear_add_gated M %d K %d: the sums differ from the projection and the "
                  "gated add's (%s)\n",
                  M, K, err);
            kvd_cuda_free(dx), kvd_cuda_free(dy), kvd_cuda_free(dm1), kvd_cuda_free(dm2);
            kvd_cuda_free(dg), kvd_cuda_free(dw);
            free(x), free(wf), free(mix), free(gate), free(m1), free(m2), free(w);
        }
}

/* the experts' groups of e0 .. e1 - 1 (kvd_cudaop_linear_grouped's G)
 * from the item offsets off (E + 1), as the model makes them on the host */
static int host_groups(const int *off, int e0, int e1, int *G) {
    int ng = 0;
    for (int e = e0; e < e1; e++)
        if (off[e + 1] > off[e]) G[1 + ng++] = e;
    G[0] = ng;
    for (int g = 0; g < ng; g++) G[1 + ng + g] = off[G[1 + g]];
    G[1 + 2 * ng] = off[e1];
    return 2 * ng + 2;
}

/* MoE experts in grouped launches (kvd_cudaop_linear_grouped and
 * kvd_cudaop_scatter_grouped) against the per-expert launches they replace
 * (gather, kvd_cudaop_linear_fp32, kvd_cudaop_scatter expert by expert),
 * bit for bit, and against kvd_linear: 24 rows, 2 experts a row, in the
 * model's slot order; expert 0 takes every row's first choice (24 rows:
 * two tiles of 16), expert 4 none; K a multiple of 8 and not. The device's
 * item lists (kvd_cudaop_expert_lists) against the host's, for the first
 * 16 and all 24 rows and for every range of experts a rank may hold. */
static void moe_grouped(void) {
    enum { R = 24, TOPK = 2, E = 5, N = 300 };
    static const int Ks[2] = {1024, 1000};
    for (int ki = 0; ki < 2; ki++) {
        const int K = Ks[ki];
        int topi[R * TOPK], slots[R * TOPK], G[2 * E + 2], off[E + 1], n = 0;
        for (int r = 0; r < R; r++) topi[r * TOPK] = 0, topi[r * TOPK + 1] = 1 + (r * 7) % 4 % 3;
        for (int e = 0; e < E; e++) { /* as the model lists them */
            off[e] = n;
            for (int r = 0; r < R; r++)
                for (int j = 0; j < TOPK; j++)
                    if (topi[r * TOPK + j] == e) slots[n++] = r * TOPK + j;
        }
        off[E] = n;
        host_groups(off, 0, E, G);
        const int ng = G[0];
        float *x = malloc(sizeof(float) * R * K), *wf = malloc(sizeof(float) * E * N * K),
              *topw = malloc(sizeof(float) * R * TOPK), *mix0 = malloc(sizeof(float) * R * N);
        float *yl = malloc(sizeof(float) * n * N), *yg = malloc(sizeof(float) * n * N),
              *yc = malloc(sizeof(float) * n * N), *ml = malloc(sizeof(float) * R * N),
              *mg = malloc(sizeof(float) * R * N), *xe = malloc(sizeof(float) * R * K);
        uint16_t *w = malloc(2 * (size_t)E * N * K);
        fill(x, (size_t)R * K, "gpu.moe.x", 1.0f);
        fill(wf, (size_t)E * N * K, "gpu.moe.w", 0.05f);
        fill(topw, R * TOPK, "gpu.moe.topw", 0.5f);
        fill(mix0, (size_t)R * N, "gpu.moe.mix", 1.0f);
        kvd_quant_bf16(wf, w, (size_t)E * N * K);
        kvd_dequant_bf16(w, wf, (size_t)E * N * K);
        for (int e = 0; e < E; e++) { /* the CPU's product of each expert's rows */
            const int ne = off[e + 1] - off[e];
            for (int i = 0; i < ne; i++)
                memcpy(xe + (size_t)i * K, x + (size_t)(slots[off[e] + i] / TOPK) * K,
                       sizeof(float) * K);
            if (ne) kvd_linear(xe, wf + (size_t)e * N * K, yc + (size_t)off[e] * N, ne, N, K);
        }
        float *dx = kvd_cuda_alloc(sizeof(float) * R * K),
              *dgx = kvd_cuda_alloc(sizeof(float) * R * K);
        float *dy = kvd_cuda_alloc(sizeof(float) * n * N),
              *dtw = kvd_cuda_alloc(sizeof(float) * R * TOPK);
        float *dmix = kvd_cuda_alloc(sizeof(float) * R * N);
        int *dslots = kvd_cuda_alloc(sizeof slots), *dG = kvd_cuda_alloc(sizeof G);
        void *dw = kvd_cuda_alloc(2 * (size_t)E * N * K), *tab[E];
        const void **dtab = kvd_cuda_alloc(sizeof tab);
        for (int e = 0; e < E; e++) tab[e] = dw ? (char *)dw + 2 * (size_t)e * N * K : NULL;
        char err[256] = "";
        int ok = dx && dgx && dy && dtw && dmix && dslots && dG && dw && dtab &&
                 !kvd_cuda_upload(dx, x, sizeof(float) * R * K) &&
                 !kvd_cuda_upload(dw, w, 2 * (size_t)E * N * K) &&
                 !kvd_cuda_upload(dslots, slots, sizeof slots) &&
                 !kvd_cuda_upload(dG, G, sizeof G) &&
                 !kvd_cuda_upload(dtw, topw, sizeof(float) * R * TOPK) &&
                 !kvd_cuda_upload(dtab, tab, sizeof tab) &&
                 !kvd_cuda_upload(dmix, mix0, sizeof(float) * R * N);
        /* per expert: gathered rows, the product, the scatter */
        for (int e = 0; ok && e < E; e++) {
            const int ne = off[e + 1] - off[e];
            if (!ne) continue;
            kvd_cudaop_gather(dx, dslots + off[e], ne, TOPK, dgx, K);
            kvd_cudaop_linear_fp32(dgx, tab[e], dy + (size_t)off[e] * N, ne, N, K);
            kvd_cudaop_scatter(dmix, dy + (size_t)off[e] * N, dslots + off[e], dtw, ne, TOPK, N);
        }
        ok = ok && !kvd_cuda_sync(err, sizeof err) &&
             !kvd_cuda_download(yl, dy, sizeof(float) * n * N) &&
             !kvd_cuda_download(ml, dmix, sizeof(float) * R * N);
        /* grouped, the tile sized for at most 1, 2, 4, 8, 16 and 24 rows
         * (every size takes the same sums: the larger groups take more tiles) */
        static const int tiles[6] = {1, 2, 4, 8, 16, R};
        for (int ti = 0; ok && ti < 6; ti++) {
            ok = !kvd_cuda_zero(dy, sizeof(float) * n * N) &&
                 !kvd_cuda_upload(dmix, mix0, sizeof(float) * R * N);
            if (ok) {
                kvd_cudaop_linear_grouped(dx, dslots, TOPK, dtab, dG, ng + ki, tiles[ti], dy, N, K);
                kvd_cudaop_scatter_grouped(dmix, dy, dslots, dtw, TOPK, dG, R, N);
            }
            ok = ok && !kvd_cuda_sync(err, sizeof err) &&
                 !kvd_cuda_download(yg, dy, sizeof(float) * n * N) &&
                 !kvd_cuda_download(mg, dmix, sizeof(float) * R * N);
            CHECK(ok, "moe grouped (K %d) failed: %s\n", K, err);
            if (ok) {
                CHECK(!memcmp(yl, yg, sizeof(float) * n * N),
                      "moe grouped (K %d, tiles for %d rows): products differ from the "
                      "per-expert launches'\n",
                      K, tiles[ti]);
                CHECK(!memcmp(ml, mg, sizeof(float) * R * N),
                      "moe grouped (K %d): scatter differs from the per-expert launches'\n", K);
                const double e = rel_l2(yg, yc, (size_t)n * N);
                CHECK(e < 1e-5, "moe grouped (K %d): rel L2 %g to the CPU's\n", K, e);
            }
            /* the gate and up products with SwiGLU in one launch, against
             * the gate products (dy, above), the up products then
             * kvd_cudaop_swiglu (the up weights: each item's expert's, two
             * experts on); its output starts as NaNs, which it must
             * overwrite */
            const void *tab2[E];
            for (int e = 0; e < E; e++) tab2[e] = tab[(e + 2) % E];
            float *dg = kvd_cuda_alloc(sizeof(float) * n * N),
                  *du = kvd_cuda_alloc(sizeof(float) * n * N);
            const void **dtab2 = kvd_cuda_alloc(sizeof tab2);
            float *s1 = malloc(sizeof(float) * n * N), *s2 = malloc(sizeof(float) * n * N);
            for (int i = 0; i < n * N; i++) s2[i] = NAN;
            int ok3 = ok && dg && du && dtab2 && !kvd_cuda_upload(dtab2, tab2, sizeof tab2) &&
                      !kvd_cuda_upload(dg, s2, sizeof(float) * n * N);
            if (ok3) {
                kvd_cudaop_linear_grouped(dx, dslots, TOPK, dtab2, dG, ng + ki, tiles[ti], du, N,
                                          K);
                kvd_cudaop_swiglu(dy, du, (size_t)n * N);
                kvd_cudaop_linear_grouped_swiglu(dx, dslots, TOPK, dtab, dtab2, dG, ng + ki,
                                                 tiles[ti], dg, N, K);
            }
            ok3 = ok3 && !kvd_cuda_sync(err, sizeof err) &&
                  !kvd_cuda_download(s1, dy, sizeof(float) * n * N) &&
                  !kvd_cuda_download(s2, dg, sizeof(float) * n * N);
            CHECK(ok3 && !memcmp(s1, s2, sizeof(float) * n * N),
                  "moe grouped (K %d, tiles for %d rows): gate and up with SwiGLU in one launch "
                  "differ from gate, up, then SwiGLU (%s)\n",
                  K, tiles[ti], err);
            kvd_cuda_free(dg), kvd_cuda_free(du), kvd_cuda_free((void *)dtab2), free(s1), free(s2);
        }
        /* the item lists on the device */
        int *dtopi = kvd_cuda_alloc(sizeof topi);
        ok = ok && dtopi && !kvd_cuda_upload(dtopi, topi, sizeof topi);
        for (int rows = 16; ok && rows <= R; rows += R - 16) {
            int hs[R * TOPK], hoff[E + 1], m = 0, gs[R * TOPK], gG[2 * E + 2], hG[2 * E + 2];
            for (int e = 0; e < E; e++) {
                hoff[e] = m;
                for (int i = 0; i < rows * TOPK; i++)
                    if (topi[i] == e) hs[m++] = i;
            }
            hoff[E] = m;
            for (int e0 = 0; e0 < E; e0++)
                for (int e1 = e0 + 1; e1 <= E; e1++) {
                    const int ng2 = host_groups(hoff, e0, e1, hG);
                    kvd_cudaop_expert_lists(dtopi, rows, TOPK, E, e0, e1, dslots, dG);
                    ok = !kvd_cuda_sync(err, sizeof err) &&
                         !kvd_cuda_download(gs, dslots, sizeof(int) * m) &&
                         !kvd_cuda_download(gG, dG, sizeof(int) * ng2);
                    CHECK(ok && !memcmp(gs, hs, sizeof(int) * m) &&
                              !memcmp(gG, hG, sizeof(int) * ng2),
                          "moe expert lists on the device (%d rows, experts %d .. %d): not the "
                          "host's: %s\n",
                          rows, e0, e1 - 1, err);
                }
        }
        kvd_cuda_free(dtopi), kvd_cuda_free(dG);
        kvd_cuda_free(dx), kvd_cuda_free(dgx), kvd_cuda_free(dy), kvd_cuda_free(dtw);
        kvd_cuda_free(dmix), kvd_cuda_free(dslots), kvd_cuda_free(dw), kvd_cuda_free((void *)dtab);
        free(x), free(wf), free(topw), free(mix0), free(yl), free(yg), free(yc), free(ml);
        free(mg), free(xe), free(w);
    }
}

/* The residual add with its non-finite check and the next RMSNorm in one
 * launch (kvd_cudaop_add_norm), against the CPU's add, scan and kvd_rmsnorm:
 * the sums bit for bit, the first non-finite index exactly (a NaN in y, a
 * sum that overflows, each seen by its check only), the norm as RMSNorm's
 * test holds it; without a norm weight the output is left alone. Rows of
 * 4096 and of 1000 (not a multiple of the block). */
static void add_norm(void) {
    enum { R = 19 };
    const int widths[2] = {4096, 1000};
    for (int wi = 0; wi < 2; wi++)
        for (int check = 0; check <= 1; check++)
            for (int with_w = 0; with_w <= 1; with_w++) {
                const int N = widths[wi];
                const size_t n = (size_t)R * N;
                float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n),
                      *w = malloc(sizeof(float) * N), *xs = malloc(sizeof(float) * n),
                      *xn = malloc(sizeof(float) * n), *gx = malloc(sizeof(float) * n),
                      *gn = malloc(sizeof(float) * n);
                fill(x, n, "gpu.addnorm.x", 3.0f);
                fill(y, n, "gpu.addnorm.y", 1.0f);
                fill(w, N, "gpu.addnorm.w", 0.1f);
                /* row R-4 overflows in the sum, row R-3 has a NaN in y */
                const size_t over = (size_t)(R - 4) * N + 11, nan_at = (size_t)(R - 3) * N + 77;
                x[over] = 3e38f, y[over] = 3e38f, y[nan_at] = NAN;
                y[(size_t)(R - 1) * N + 5] = INFINITY;
                unsigned long long want = ~0ull;
                for (size_t i = 0; i < n; i++) {
                    xs[i] = x[i] + y[i];
                    if (!isfinite(check ? xs[i] : y[i]) && i < want) want = i;
                }
                CHECK(want == (check ? over : nan_at), "add_norm: the test's own first index\n");
                for (int r = 0; r < R; r++)
                    kvd_rmsnorm(xn + (size_t)r * N, xs + (size_t)r * N, w, N, 1e-6f, 1);
                for (size_t i = 0; i < n; i++) gn[i] = -7.0f; /* untouched without w */
                float *dx = kvd_cuda_alloc(sizeof(float) * n),
                      *dy = kvd_cuda_alloc(sizeof(float) * n),
                      *dw = kvd_cuda_alloc(sizeof(float) * N),
                      *dn = kvd_cuda_alloc(sizeof(float) * n);
                unsigned long long *df = kvd_cuda_alloc(sizeof *df), first = ~0ull;
                int ok = dx && dy && dw && dn && df && !kvd_cuda_upload(dx, x, sizeof(float) * n) &&
                         !kvd_cuda_upload(dy, y, sizeof(float) * n) &&
                         !kvd_cuda_upload(dw, w, sizeof(float) * N) &&
                         !kvd_cuda_upload(dn, gn, sizeof(float) * n) &&
                         !kvd_cuda_upload(df, &first, sizeof first);
                if (ok) {
                    kvd_cudaop_add_norm(dx, dy, R, N, df, check, dn, with_w ? dw : NULL, 1e-6f, 1);
                    ok = !kvd_cuda_download(gx, dx, sizeof(float) * n) &&
                         !kvd_cuda_download(gn, dn, sizeof(float) * n) &&
                         !kvd_cuda_download(&first, df, sizeof first);
                }
                CHECK(ok, "cuda add_norm failed\n");
                size_t bad = 0;
                for (size_t i = 0; i < n && ok; i++) /* NaN payloads may differ */
                    bad += !(isnan(gx[i]) ? isnan(xs[i]) : !memcmp(&gx[i], &xs[i], 4));
                CHECK(ok && !bad, "add_norm N %d check %d: %zu sums differ from the CPU's\n", N,
                      check, bad);
                CHECK(first == want,
                      "add_norm N %d check %d: first non-finite %llu, expected %llu\n", N, check,
                      first, want);
                if (with_w) { /* the rows before the non-finite ones */
                    const size_t m = (size_t)(R - 4) * N;
                    CHECK(rel_l2(gn, xn, m) < 1e-7, "add_norm N %d: norm rel L2 %g\n", N,
                          rel_l2(gn, xn, m));
                } else {
                    size_t moved = 0;
                    for (size_t i = 0; i < n; i++) moved += gn[i] != -7.0f;
                    CHECK(!moved, "add_norm N %d without w: %zu outputs written\n", N, moved);
                }
                kvd_cuda_free(dx), kvd_cuda_free(dy), kvd_cuda_free(dw), kvd_cuda_free(dn);
                kvd_cuda_free(df);
                free(x), free(y), free(w), free(xs), free(xn), free(gx), free(gn);
            }
}

/* RMSNorm, RoPE and SwiGLU at the model's widths. Each product and sum is
 * rounded as on the CPU; what may differ is the double sum of squares (in a
 * tree) and libm's cos, sin and expf in their last place. */
/* The attention layer's q and k heads normed and rotated in one launch
 * (kvd_cudaop_qk_norm_rope) against the four launches it replaces
 * (kvd_cudaop_rmsnorm, then kvd_cudaop_rope, on each), bit for bit, in
 * place: query heads strided as the model's query + gate rows (whose gate
 * halves must stay as they were), at head_dim 64, 128 and 256, rotating a
 * quarter, all or none of each head, 1 and 37 rows, GQA 8 and 3. */
static void qk_norm_rope(void) {
    enum { R = 37, HDMAX = 256 };
    static const struct {
        int rows, nh, kvh, hd, rot;
    } cases[] = {{R, 16, 2, 256, 64},
                 {1, 16, 2, 256, 64},
                 {R, 3, 1, 128, 128},
                 {R, 3, 1, 64, 16},
                 {R, 8, 1, 128, 0}};
    int pos[R];
    for (int r = 0; r < R; r++) pos[r] = r * 7001 + 3;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int rows = cases[ci].rows, nh = cases[ci].nh, kvh = cases[ci].kvh;
        const int hd = cases[ci].hd, rot = cases[ci].rot;
        const size_t nq = (size_t)rows * nh * 2 * hd, nk = (size_t)rows * kvh * hd;
        float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk);
        float *out[2][2] = {{malloc(sizeof(float) * nq), malloc(sizeof(float) * nk)},
                            {malloc(sizeof(float) * nq), malloc(sizeof(float) * nk)}};
        float wq[HDMAX], wk[HDMAX], inv[HDMAX / 2];
        fill(q, nq, "gpu.qk.q", 2.0f);
        fill(k, nk, "gpu.qk.k", 30.0f);
        fill(wq, HDMAX, "gpu.qk.wq", 0.1f);
        fill(wk, HDMAX, "gpu.qk.wk", 0.3f);
        for (int i = 0; i < HDMAX / 2; i++) inv[i] = powf(1e7f, -(float)(2 * i) / (rot ? rot : 2));
        float *dq = kvd_cuda_alloc(sizeof(float) * nq), *dk = kvd_cuda_alloc(sizeof(float) * nk);
        float *dwq = kvd_cuda_alloc(sizeof wq), *dwk = kvd_cuda_alloc(sizeof wk);
        float *dinv = kvd_cuda_alloc(sizeof inv);
        int *dpos = kvd_cuda_alloc(sizeof pos);
        char err[256] = "";
        int ok = dq && dk && dwq && dwk && dinv && dpos && !kvd_cuda_upload(dwq, wq, sizeof wq) &&
                 !kvd_cuda_upload(dwk, wk, sizeof wk) && !kvd_cuda_upload(dinv, inv, sizeof inv) &&
                 !kvd_cuda_upload(dpos, pos, sizeof pos);
        for (int fused = 0; ok && fused < 2; fused++) {
            ok = !kvd_cuda_upload(dq, q, sizeof(float) * nq) &&
                 !kvd_cuda_upload(dk, k, sizeof(float) * nk);
            if (ok && fused) {
                kvd_cudaop_qk_norm_rope(dq, 2 * hd, dk, dwq, dwk, rows, nh, kvh, hd, 1e-6f, dpos,
                                        rot, dinv);
            } else if (ok) {
                kvd_cudaop_rmsnorm(dq, 2 * (size_t)hd, dq, 2 * (size_t)hd, dwq, rows * nh, hd,
                                   1e-6f, 1);
                kvd_cudaop_rope(dq, rows, nh, 2 * hd, dpos, rot, dinv);
                kvd_cudaop_rmsnorm(dk, (size_t)hd, dk, (size_t)hd, dwk, rows * kvh, hd, 1e-6f, 1);
                kvd_cudaop_rope(dk, rows, kvh, hd, dpos, rot, dinv);
            }
            ok = ok && !kvd_cuda_sync(err, sizeof err) &&
                 !kvd_cuda_download(out[fused][0], dq, sizeof(float) * nq) &&
                 !kvd_cuda_download(out[fused][1], dk, sizeof(float) * nk);
        }
        CHECK(ok, "qk norm + rope (case %zu) failed: %s\n", ci, err);
        if (ok) {
            CHECK(!memcmp(out[0][0], out[1][0], sizeof(float) * nq) &&
                      !memcmp(out[0][1], out[1][1], sizeof(float) * nk),
                  "qk norm + rope (%d rows, %d/%d heads x %d, rotating %d): one launch differs "
                  "from the four\n",
                  rows, nh, kvh, hd, rot);
            int gates_kept = 1, normed = 0;
            for (size_t h = 0; h < (size_t)rows * nh; h++)
                for (int d = 0; d < hd; d++) {
                    gates_kept &= out[1][0][(2 * h + 1) * hd + d] == q[(2 * h + 1) * hd + d];
                    normed += out[1][0][2 * h * hd + d] != q[2 * h * hd + d];
                }
            CHECK(gates_kept && normed > rows * nh * hd / 2,
                  "qk norm + rope (case %zu): the gate halves %s, %d query values changed\n", ci,
                  gates_kept ? "kept" : "changed", normed);
        }
        kvd_cuda_free(dq), kvd_cuda_free(dk), kvd_cuda_free(dwq), kvd_cuda_free(dwk);
        kvd_cuda_free(dinv), kvd_cuda_free(dpos);
        free(q), free(k);
        for (int i = 0; i < 4; i++) free(out[i / 2][i % 2]);
    }
}

static void dense(void) {
    enum { R = 37, N = 4096, HD = 256, NH = 16 };
    float *x = malloc(sizeof(float) * R * N), *w = malloc(sizeof(float) * N),
          *a = malloc(sizeof(float) * R * N), *b = malloc(sizeof(float) * R * N);
    fill(x, (size_t)R * N, "gpu.norm.x", 3.0f);
    fill(w, N, "gpu.norm.w", 0.1f);
    for (int one_plus = 0; one_plus <= 1; one_plus++) {
        for (int r = 0; r < R; r++)
            kvd_rmsnorm(a + (size_t)r * N, x + (size_t)r * N, w, N, 1e-6f, one_plus);
        CHECK(kvd_cuda_rmsnorm(b, x, w, R, N, 1e-6f, one_plus) == 0, "cuda rmsnorm failed\n");
        CHECK(rel_l2(b, a, (size_t)R * N) < 1e-7, "rmsnorm (1+w %d): rel L2 %g\n", one_plus,
              rel_l2(b, a, (size_t)R * N));
    }
    /* partial RoPE (a quarter of head_dim) at positions up to 256K, heads
     * strided as the model's query + gate rows */
    int pos[R];
    float inv[HD / 8];
    for (int r = 0; r < R; r++) pos[r] = r * 7001;
    for (int i = 0; i < HD / 8; i++) inv[i] = powf(1e7f, -(float)(2 * i) / (HD / 4));
    size_t nv = (size_t)R * NH * 2 * HD;
    float *v = malloc(sizeof(float) * nv), *vc = malloc(sizeof(float) * nv);
    fill(v, nv, "gpu.rope", 1.0f);
    memcpy(vc, v, sizeof(float) * nv);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH; h++)
            kvd_rope(vc + ((size_t)r * NH + h) * 2 * HD, pos[r], HD / 4, inv);
    CHECK(kvd_cuda_rope(v, R, NH, 2 * HD, pos, HD / 4, inv) == 0, "cuda rope failed\n");
    CHECK(rel_l2(v, vc, nv) < 1e-7, "rope: rel L2 %g\n", rel_l2(v, vc, nv));
    /* SwiGLU */
    memcpy(a, x, sizeof(float) * R * N);
    memcpy(b, x, sizeof(float) * R * N);
    fill(w, N, "gpu.swiglu.u", 1.0f);
    for (int r = 0; r < R; r++) kvd_swiglu(a + (size_t)r * N, w, N);
    int ok = 1;
    for (int r = 0; r < R && ok; r++) ok = kvd_cuda_swiglu(b + (size_t)r * N, w, N) == 0;
    CHECK(ok, "cuda swiglu failed\n");
    CHECK(rel_l2(b, a, (size_t)R * N) < 1e-6, "swiglu: rel L2 %g\n", rel_l2(b, a, (size_t)R * N));
    free(x), free(w), free(a), free(b), free(v), free(vc);
    add_norm();
    qk_norm_rope();
}

/* The paged cache write in every mode: the device's pool bytes equal the
 * CPU cache's, and so do the saturation, flush and subnormal counters and
 * the absmax. Tokens of two interleaved sequences land in scattered blocks. */
static void kv_write(void) {
    enum { KH = 2, HD = 256, BS = 128, T = 300 };
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, 1, KH);
    sc.k[0] = 0.02f, sc.k[1] = 0.05f, sc.v[0] = 0.004f, sc.v[1] = 0.001f;
    float *k = malloc(sizeof(float) * T * KH * HD), *v = malloc(sizeof(float) * T * KH * HD);
    fill(k, (size_t)T * KH * HD, "gpu.kv.k", 4.0f);
    fill(v, (size_t)T * KH * HD, "gpu.kv.v", 0.05f);
    k[5] = 1e4f, v[7] = 0.0f, k[9] = 1e-30f; /* saturates, a true zero, flushes */
    for (int mi = 0; mi < KVD_KV_N_MODES; mi++)
        for (int sat = 0; sat <= 1; sat++) {
            kvd_kvcache c;
            if (kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, HD, BS, 4 * T, &sc, sat, err)) {
                CHECK(0, "cache init: %s\n", err);
                continue;
            }
            int other = kvd_kvcache_add_seq(&c), s = kvd_kvcache_add_seq(&c);
            int32_t slot[T];
            for (int t = 0; t < T; t++) {
                if ((t % BS == 0 && kvd_kvcache_reserve(&c, other, t + 1)) ||
                    kvd_kvcache_reserve(&c, s, t + 1)) {
                    CHECK(0, "cache reserve failed at %d\n", t);
                    break;
                }
                kvd_kvcache_write(&c, 0, s, t, k + (size_t)t * KH * HD, v + (size_t)t * KH * HD);
                slot[t] = c.seqs[s].blocks[t / BS] * BS + t % BS;
            }
            size_t pool = (size_t)c.n_blocks * KH * BS * kvd_fmt_row_bytes(c.fmt, HD);
            uint8_t *dk = calloc(1, pool), *dv = calloc(1, pool);
            /* the CPU pools hold only this sequence's writes: start both from zero */
            kvd_qstats ks = {0}, vs = {0};
            float ka[KH] = {0}, va[KH] = {0};
            CHECK(kvd_cuda_kv_write(c.fmt, c.saturate, BS, KH, HD, dk, pool, T, slot, k, c.k_scale,
                                    &ks, ka) == 0 &&
                      kvd_cuda_kv_write(c.fmt, c.saturate, BS, KH, HD, dv, pool, T, slot, v,
                                        c.v_scale, &vs, va) == 0,
                  "cuda kv write failed\n");
            CHECK(!memcmp(dk, c.k[0], pool) && !memcmp(dv, c.v[0], pool),
                  "kv write mode %d sat %d: pool bytes differ\n", mi, sat);
            CHECK(!memcmp(&ks, &c.k_stats[0], sizeof ks) && !memcmp(&vs, &c.v_stats[0], sizeof vs),
                  "kv write mode %d sat %d: counters differ (K sat %llu vs %llu)\n", mi, sat,
                  (unsigned long long)ks.saturated, (unsigned long long)c.k_stats[0].saturated);
            for (int h = 0; h < KH; h++)
                CHECK(ka[h] == c.k_absmax[h] && va[h] == c.v_absmax[h],
                      "kv write mode %d: absmax head %d differs\n", mi, h);
            free(dk), free(dv);
            kvd_kvcache_free(&c);
        }
    kvd_kv_scales_free(&sc);
    free(k), free(v);
}

/* int4-token's rotations (kvd_cudaop_rht) against kvd_rht_rows, bit for
 * bit: the query's (forward, rows at a stride into a packed copy) and the
 * output's (inverse, in place), at head_dim 64, 128 and 256; every sum is
 * the butterfly's in the CPU's order. */
static void rht_rows(void) {
    static const int hds[3] = {64, 128, 256};
    enum { R = 5, NH = 6 };
    for (int hi = 0; hi < 3; hi++) {
        const int hd = hds[hi];
        const size_t no = (size_t)NH * hd, ss = no + 8, n = (size_t)R * ss;
        float *x = malloc(sizeof(float) * n), *cf = malloc(sizeof(float) * R * no),
              *gf = malloc(sizeof(float) * R * no), *ci = malloc(sizeof(float) * n),
              *gi = malloc(sizeof(float) * n);
        uint64_t key = kvd_rng_key((uint64_t)hd, "gpu.rht");
        for (size_t i = 0; i < n; i++) x[i] = 3.0f * kvd_rng_normal(key, i);
        kvd_rht_rows(x, cf, R, ss, no, NH, hd, 0);
        memcpy(ci, x, sizeof(float) * n);
        kvd_rht_rows(ci, ci, R, ss, ss, NH, hd, 1);
        float *dx = kvd_cuda_alloc(sizeof(float) * n), *dq = kvd_cuda_alloc(sizeof(float) * R * no);
        CHECK(dx && dq && !kvd_cuda_upload(dx, x, sizeof(float) * n), "rht: upload failed\n");
        kvd_cudaop_rht(dx, dq, R, ss, no, NH, hd, 0);
        kvd_cudaop_rht(dx, dx, R, ss, ss, NH, hd, 1);
        CHECK(!kvd_cuda_download(gf, dq, sizeof(float) * R * no) &&
                  !kvd_cuda_download(gi, dx, sizeof(float) * n),
              "rht: download failed\n");
        size_t df = 0, di = 0;
        for (size_t i = 0; i < (size_t)R * no; i++) df += memcmp(&gf[i], &cf[i], 4) != 0;
        for (size_t i = 0; i < n; i++) di += memcmp(&gi[i], &ci[i], 4) != 0;
        CHECK(df == 0 && di == 0,
              "rht at head_dim %d: %zu forward and %zu inverse values differ from the CPU's\n", hd,
              df, di);
        kvd_cuda_free(dx), kvd_cuda_free(dq);
        free(x), free(cf), free(gf), free(ci), free(gi);
    }
}

/* The gated delta rule over 64 steps of 16 heads at the real head dims;
 * sums run in the CPU's order, so only expf(g) may differ (last place). */
static void gdn(void) {
    enum { H = 16, DK = 128, DV = 128, STEPS = 64 };
    size_t ns = (size_t)H * DK * DV;
    float *S1 = calloc(ns, sizeof(float)), *S2 = calloc(ns, sizeof(float));
    float q[H * DK], k[H * DK], v[H * DV], g[H], beta[H], o1[H * DV], o2[H * DV];
    double worst = 0;
    for (int t = 0; t < STEPS; t++) {
        char name[32];
        snprintf(name, sizeof name, "gpu.gdn.%d", t);
        fill(q, H * DK, name, 0.09f); /* q and k as after the L2 norm */
        fill(k, H * DK, name + 1, 0.09f);
        fill(v, H * DV, name + 2, 1.0f);
        for (int h = 0; h < H; h++) g[h] = -0.05f * (1 + h % 4), beta[h] = 0.3f + 0.04f * h;
        for (int h = 0; h < H; h++)
            kvd_gdn_step(S1 + (size_t)h * DK * DV, q + h * DK, k + h * DK, v + h * DV, g[h],
                         beta[h], o1 + h * DV, DK, DV);
        CHECK(kvd_cuda_gdn_step(S2, q, k, v, g, beta, o2, H, DK, DV) == 0, "cuda gdn failed\n");
        double r = rel_l2(o2, o1, H * DV);
        worst = worst_of(worst, r);
    }
    CHECK(worst < 1e-5, "gdn: output rel L2 %g\n", worst);
    CHECK(rel_l2(S2, S1, ns) < 1e-5, "gdn: state rel L2 %g\n", rel_l2(S2, S1, ns));
    free(S1), free(S2);
}

/* The model's recurrence op over a batch as a step lays it out: sequences
 * in slots out of order, 1, 4 and 0 tokens, one slot left alone. Where the
 * columns sit in registers (dk 32, 64, 128; dv not a multiple of the 16
 * columns a warp takes among them) the state and outputs must be the
 * in-memory kernel's bit for bit, and both the CPU's within expf's last
 * place (bit for bit in the simulator); other dk take the in-memory path. */
static void gdn_rows(void) {
    static const int shapes[][4] = {/* nk, nv, dk, dv */
                                    {2, 4, 32, 32},
                                    {1, 2, 64, 128},
                                    {2, 4, 128, 128},
                                    {1, 2, 128, 40},
                                    {1, 1, 48, 32}};
    enum { NS = 3, SLOTS = 4, ROWS = 5 };
    const int seqs[NS] = {2, 0, 3}, ntok[NS] = {1, 4, 0}, row0[NS] = {0, 1, 5};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int nk = shapes[c][0], nv = shapes[c][1], dk = shapes[c][2], dv = shapes[c][3];
        const int kd = nk * dk, vd = nv * dv, cd = 2 * kd + vd;
        const size_t sl = (size_t)nv * dk * dv, ns = SLOTS * sl;
        float *conv = malloc(sizeof(float) * ROWS * cd), *gdec = malloc(sizeof(float) * ROWS * nv);
        float *beta = malloc(sizeof(float) * ROWS * nv), *S0 = malloc(sizeof(float) * ns);
        float *S1 = malloc(sizeof(float) * ns), *Sr = malloc(sizeof(float) * ns),
              *Sc = malloc(sizeof(float) * ns);
        float *o1 = calloc((size_t)ROWS * vd, sizeof(float)),
              *orr = malloc(sizeof(float) * ROWS * vd), *oc = malloc(sizeof(float) * ROWS * vd);
        fill(conv, (size_t)ROWS * cd, "gpu.gdnr.conv", 0.09f); /* q, k as after the L2 norm */
        for (int r = 0; r < ROWS; r++)                         /* v at unit scale */
            for (int i = 0; i < vd; i++) conv[(size_t)r * cd + 2 * kd + i] *= 11.0f;
        for (int i = 0; i < ROWS * nv; i++)
            gdec[i] = -0.05f * (1 + i % 4), beta[i] = 0.3f + 0.04f * (i % 9);
        fill(S0, ns, "gpu.gdnr.S", 0.3f);
        memcpy(S1, S0, sizeof(float) * ns);
        for (int q = 0; q < NS; q++)
            for (int t = 0; t < ntok[q]; t++) {
                const int r = row0[q] + t;
                const float *x = conv + (size_t)r * cd;
                for (int vh = 0; vh < nv; vh++) {
                    const int kh = vh / (nv / nk);
                    kvd_gdn_step(S1 + seqs[q] * sl + (size_t)vh * dk * dv, x + kh * dk,
                                 x + kd + kh * dk, x + 2 * kd + vh * dv, gdec[r * nv + vh],
                                 beta[r * nv + vh], o1 + (size_t)r * vd + vh * dv, dk, dv);
                }
            }
        float *dconv = kvd_cuda_alloc(sizeof(float) * ROWS * cd),
              *dg = kvd_cuda_alloc(sizeof(float) * ROWS * nv),
              *db = kvd_cuda_alloc(sizeof(float) * ROWS * nv),
              *dout = kvd_cuda_alloc(sizeof(float) * ROWS * vd),
              *dS = kvd_cuda_alloc(sizeof(float) * ns);
        int *dseqs = kvd_cuda_alloc(sizeof seqs), *dntok = kvd_cuda_alloc(sizeof ntok),
            *drow0 = kvd_cuda_alloc(sizeof row0);
        char err[256] = "";
        int ok = dconv && dg && db && dout && dS && dseqs && dntok && drow0 &&
                 !kvd_cuda_upload(dconv, conv, sizeof(float) * ROWS * cd) &&
                 !kvd_cuda_upload(dg, gdec, sizeof(float) * ROWS * nv) &&
                 !kvd_cuda_upload(db, beta, sizeof(float) * ROWS * nv) &&
                 !kvd_cuda_upload(dseqs, seqs, sizeof seqs) &&
                 !kvd_cuda_upload(dntok, ntok, sizeof ntok) &&
                 !kvd_cuda_upload(drow0, row0, sizeof row0);
        for (int path = 0; path < 2 && ok; path++) {
            ok = !kvd_cuda_upload(dS, S0, sizeof(float) * ns) &&
                 !kvd_cuda_zero(dout, sizeof(float) * ROWS * vd);
            if (ok && path == 0)
                kvd_cudaop_gdn(dconv, dg, db, dout, dS, sl, NS, dseqs, drow0, dntok, nk, nv, dk,
                               dv);
            else if (ok)
                kvd_cudaop_gdn_columns(dconv, dg, db, dout, dS, sl, NS, dseqs, drow0, dntok, nk, nv,
                                       dk, dv);
            ok = ok && !kvd_cuda_sync(err, sizeof err) &&
                 !kvd_cuda_download(path ? Sc : Sr, dS, sizeof(float) * ns) &&
                 !kvd_cuda_download(path ? oc : orr, dout, sizeof(float) * ROWS * vd);
        }
        CHECK(ok, "gdn rows (dk %d dv %d) failed: %s\n", dk, dv, err);
        if (ok) {
            CHECK(kvd_cuda_gdn_regs(dk) == (dk != 48), "gdn rows: dk %d %s registers\n", dk,
                  dk == 48 ? "in" : "not in");
            CHECK(!memcmp(Sr, Sc, sizeof(float) * ns) &&
                      !memcmp(orr, oc, sizeof(float) * ROWS * vd),
                  "gdn rows (dk %d dv %d): state or outputs differ from the in-memory path's\n", dk,
                  dv);
            CHECK(!memcmp(Sr + sl, S0 + sl, sizeof(float) * sl),
                  "gdn rows (dk %d dv %d): the unused slot changed\n", dk, dv);
            const double eo = rel_l2(orr, o1, (size_t)ROWS * vd), es = rel_l2(Sr, S1, ns);
            CHECK(eo < 1e-5 && es < 1e-5, "gdn rows (dk %d dv %d): output rel L2 %g, state %g\n",
                  dk, dv, eo, es);
        }
        kvd_cuda_free(dconv), kvd_cuda_free(dg), kvd_cuda_free(db), kvd_cuda_free(dout);
        kvd_cuda_free(dS), kvd_cuda_free(dseqs), kvd_cuda_free(dntok), kvd_cuda_free(drow0);
        free(conv), free(gdec), free(beta), free(S0), free(S1), free(Sr), free(Sc);
        free(o1), free(orr), free(oc);
    }
}

/* Routing and greedy sampling: the same experts in the same order, weights
 * within the last place; the same token. */
static void route_and_sample(void) {
    enum { R = 64, E = 512, K = 10, V = 248320 };
    float *x = malloc(sizeof(float) * R * E), *xc = malloc(sizeof(float) * R * E);
    int ti1[R * K], ti2[R * K];
    float tw1[R * K], tw2[R * K];
    fill(x, (size_t)R * E, "gpu.route", 2.0f);
    /* ties: row 5's two largest logits equal, row 6's all equal (the
     * lowest experts first, as kvd_topk keeps them) */
    x[5 * E + 300] = x[5 * E + 7] = 9.0f;
    for (int e = 0; e < E; e++) x[6 * E + e] = 0.25f;
    /* row 7: a maximum of 100 among logits of -50 (an exponential against
     * any other maximum overflows) */
    for (int e = 0; e < E; e++) x[7 * E + e] = e == 333 ? 100.0f : -50.0f;
    /* the last two rows: NaN logits, all of them and every third (a step
     * that reports a NaN activation at its end routes them first): any K
     * distinct experts in range, none read or written out of bounds */
    for (int e = 0; e < E; e++) {
        x[(size_t)(R - 2) * E + e] = NAN;
        if (e % 3 == 0) x[(size_t)(R - 1) * E + e] = NAN;
    }
    const int RF = R - 2; /* the rows of finite logits */
    for (int norm = 0; norm <= 1; norm++) {
        memcpy(xc, x, sizeof(float) * R * E);
        for (int r = 0; r < R; r++)
            kvd_route(xc + (size_t)r * E, E, K, norm, ti1 + r * K, tw1 + r * K);
        CHECK(kvd_cuda_route(x, R, E, K, norm, ti2, tw2) == 0, "cuda route failed\n");
        CHECK(!memcmp(ti1, ti2, sizeof ti1[0] * RF * K) && ti2[5 * K] == 7 &&
                  ti2[5 * K + 1] == 300 && ti2[6 * K] == 0 && ti2[6 * K + K - 1] == K - 1,
              "route (norm %d): experts differ\n", norm);
        CHECK(rel_l2(tw2, tw1, RF * K) < 1e-6, "route (norm %d): weights rel L2 %g\n", norm,
              rel_l2(tw2, tw1, RF * K));
        for (int r = RF; r < R; r++) {
            int ok = 1;
            for (int j = 0; j < K; j++) {
                const int e = ti2[r * K + j];
                ok = ok && e >= 0 && e < E;
                for (int i = 0; i < j; i++) ok = ok && ti2[r * K + i] != e;
            }
            CHECK(ok, "route (norm %d): NaN row %d: experts out of range or repeated\n", norm, r);
        }
    }
    enum { RS = 8 };
    float *lg = malloc(sizeof(float) * RS * V);
    fill(lg, (size_t)RS * V, "gpu.argmax", 3.0f);
    lg[(size_t)3 * V + 100] = lg[(size_t)3 * V + 200] = 50.0f; /* a tie: the first wins */
    int a1[RS], a2[RS];
    for (int r = 0; r < RS; r++) a1[r] = kvd_argmax(lg + (size_t)r * V, V);
    CHECK(kvd_cuda_argmax(lg, RS, V, a2) == 0, "cuda argmax failed\n");
    CHECK(!memcmp(a1, a2, sizeof a1) && a2[3] == 100, "argmax differs\n");
    free(x), free(xc), free(lg);
}

/* Prefill attention, both versions (and v2 split over the context every
 * 128 positions, merged; and both of those with the query split per stage,
 * which must give their bits exactly): chunks of query rows (100 rows at
 * positions 600..699 of a 700-token cache in scattered blocks, and a first
 * chunk of 40 at 0..39), each row against kvd_attn_paged over its own
 * prefix, every cache format and scaling (the checkpoint mode is the
 * calibrated one here), at group sizes 1 to 16 and head_dim 64 to 256 (the
 * last shape qwen3.5's). Version 1 must refuse a group of 3. Online and
 * two-pass softmax sum in different orders: 1e-4 relative L2 per row is far
 * below a wrong position, mask or scale (O(1)). */
static void prefill(void) {
    enum { KH = 2, T = 700, BS = 128 };
    static const int shapes[][2] = {{8, 64}, {6, 128}, {2, 128}, {32, 256}};
    static const int chunks[][2] = {{600, 100}, {0, 40}}; /* pos0, rows */
    char err[KVD_ERR_LEN];
    kvd_kv_scales sc;
    kvd_kv_scales_init(&sc, 1, KH);
    sc.k[0] = 0.02f, sc.k[1] = 0.03f, sc.v[0] = 0.004f, sc.v[1] = 0.005f;
    /* KVD_TEST_CASES=quick (the simulator under the sanitizers, which look
     * for bad accesses, not numbers): every shape, the BF16 and one FP8
     * cache only */
    const char *cases = getenv("KVD_TEST_CASES");
    const int quick = cases && !strcmp(cases, "quick");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int NH = shapes[si][0], D = shapes[si][1], G = NH / KH, NQ = 100;
        const int v1_ok = G == 1 || G == 2 || G == 4 || G == 8 || G == 16;
        float *k = malloc(sizeof(float) * KH * D), *v = malloc(sizeof(float) * KH * D);
        float *q = malloc(sizeof(float) * NQ * NH * D), *oc = malloc(sizeof(float) * NQ * NH * D),
              *og = malloc(sizeof(float) * NQ * NH * D);
        float *o2 = malloc(sizeof(float) * NQ * NH * D), *o3 = malloc(sizeof(float) * NQ * NH * D);
        void *work = malloc(kvd_attn_work_bytes(NH, D, T, 1));
        fill(q, (size_t)NQ * NH * D, "gpu.prefill.q", 1.0f);
        for (int mi = 0; mi < KVD_KV_N_MODES; mi++) {
            kvd_kvcache c;
            if (kvd_kv_mode_ckpt((kvd_kv_mode)mi) ||
                (quick && mi != KVD_KV_BF16 && mi != KVD_KV_FP8_CAL))
                continue;
            if (kvd_kvcache_init(&c, (kvd_kv_mode)mi, 1, KH, D, BS, 4 * T, &sc, 1, err)) {
                CHECK(0, "cache init: %s\n", err);
                continue;
            }
            int other = kvd_kvcache_add_seq(&c), s = kvd_kvcache_add_seq(&c);
            for (int t = 0; t < T; t++) {
                if ((t % BS == 0 && kvd_kvcache_reserve(&c, other, t + 1)) ||
                    kvd_kvcache_reserve(&c, s, t + 1)) {
                    CHECK(0, "cache reserve failed at %d\n", t);
                    break;
                }
                char name[32];
                snprintf(name, sizeof name, "gpu.prefill.%d", t);
                fill(k, (size_t)KH * D, name, 2.0f);
                fill(v, (size_t)KH * D, name + 1, 0.5f);
                if (kvd_fmt_row_scaled(c.fmt)) /* V rows 2^-3, 1 and 2^3 as large in runs
                                                  of 37: the stages' probability scales move */
                    for (int i = 0; i < KH * D; i++) v[i] = ldexpf(v[i], 3 * (t / 37 % 3) - 3);
                kvd_kvcache_write(&c, 0, s, t, k, v);
            }
            kvd_kv_view view = kvd_kvcache_view(&c, 0);
            float sm = 1.0f / sqrtf((float)D);
            /* int4-token: the device's kernels take the query rotated (by
             * kvd_rht_rows, kvd_cudaop_rht's twin) and the scale over D, and
             * give the output in the rotated basis, rotated back here */
            const int i4 = c.fmt == KVD_FMT_I4T;
            float *qk = q;
            if (i4) {
                qk = malloc(sizeof(float) * NQ * NH * D);
                kvd_rht_rows(q, qk, NQ, (size_t)NH * D, (size_t)NH * D, NH, D, 0);
            }
            for (int ci = 0; ci < 2; ci++) {
                const int p0 = chunks[ci][0], nq = chunks[ci][1];
                for (int r = 0; r < nq; r++)
                    kvd_attn_paged(&view, c.seqs[s].blocks, p0 + r + 1, q + (size_t)r * NH * D, NH,
                                   sm, oc + (size_t)r * NH * D, NULL, work, 1);
                /* v3 on the deep chunk only: the first one's 40 positions are one
                 * split; v4 there too, on a BF16, an FP8, a per-token FP8 and an
                 * NVFP4 cache (their four ways of reading stages), and v5; quick
                 * cases (the sanitizers, which look for bad accesses: the same
                 * code at every head_dim) take v4 below head_dim 256 only.
                 * int8-token-rn's rows take int8-token's tensor-core kernels:
                 * v1 only */
                for (int ver = 1; ver <= 5; ver++) {
                    if ((!p0 && ver >= 3) || (ver >= 2 && mi == KVD_KV_INT8_TOKEN_RN) ||
                        (ver >= 4 && mi != KVD_KV_BF16 && mi != KVD_KV_FP8_CAL &&
                         mi != KVD_KV_FP8_TOKEN && mi != KVD_KV_NVFP4_CAL) ||
                        (quick && (ver == 5 || (ver == 4 && D == 256))))
                        continue;
                    for (size_t i = 0; i < (size_t)NQ * NH * D; i++) og[i] = 7.0f;
                    int rc = kvd_cuda_attn_prefill_v(&view, c.n_blocks, c.seqs[s].blocks, p0, nq,
                                                     qk, NH, i4 ? sm / (float)D : sm, og, ver);
                    if (i4 && rc == 0)
                        kvd_rht_rows(og, og, nq, (size_t)NH * D, (size_t)NH * D, NH, D, 1);
                    if (ver == 1 && !v1_ok) {
                        CHECK(rc == -1, "prefill v1 took a group of %d\n", G);
                        continue;
                    }
                    if (ver >= 2 && !kvd_fmt_prefill_tc(c.fmt)) { /* no tensor-core
                                                                    prefill for it */
                        CHECK(rc == -1, "prefill v%d took a cache of format %d\n", ver, (int)c.fmt);
                        continue;
                    }
                    CHECK(rc == 0, "cuda prefill v%d failed (heads %d dim %d)\n", ver, NH, D);
                    double worst = 0;
                    for (int r = 0; r < nq; r++) {
                        double e = rel_l2(og + (size_t)r * NH * D, oc + (size_t)r * NH * D,
                                          (size_t)NH * D);
                        worst = worst_of(worst, e);
                    }
                    /* (int4-token's output is rounded to BF16 on both sides:
                     * a last bit of the sums moves a value a BF16 step) */
                    CHECK(worst < (i4 ? 4e-3 : 1e-4),
                          "prefill v%d mode %d heads %d dim %d pos0 %d: worst row rel L2 %g\n", ver,
                          mi, NH, D, p0, worst);
                    if (getenv("KVD_TEST_VERBOSE"))
                        printf("prefill v%d mode %d heads %d dim %d pos0 %d: worst %.3g\n", ver, mi,
                               NH, D, p0, worst);
                    /* rows past the chunk are not written */
                    size_t past = 0;
                    for (size_t i = (size_t)nq * NH * D; i < (size_t)NQ * NH * D; i++)
                        past += og[i] != 7.0f;
                    CHECK(!past, "prefill v%d wrote %zu values past its %d rows\n", ver, past, nq);
                    /* the query split per stage (v4, v5) gives v2's and v3's bits */
                    const size_t nout = (size_t)nq * NH * D;
                    if (ver == 2 || ver == 3)
                        memcpy(ver == 2 ? o2 : o3, og, sizeof(float) * nout);
                    else if (ver >= 4)
                        CHECK(!memcmp(og, ver == 4 ? o2 : o3, sizeof(float) * nout),
                              "prefill v%d mode %d heads %d dim %d pos0 %d: not v%d's bits\n", ver,
                              mi, NH, D, p0, ver - 2);
                }
            }
            if (mi == KVD_KV_BF16) { /* no version 6: refused, nothing written */
                for (size_t i = 0; i < (size_t)NQ * NH * D; i++) og[i] = 7.0f;
                int rc = kvd_cuda_attn_prefill_v(&view, c.n_blocks, c.seqs[s].blocks, 0, 40, q, NH,
                                                 1.0f / sqrtf((float)D), og, 6);
                size_t touched = 0;
                for (size_t i = 0; i < (size_t)NQ * NH * D; i++) touched += og[i] != 7.0f;
                CHECK(rc == -1 && !touched, "prefill took version 6 (rc %d, %zu written)\n", rc,
                      touched);
            }
            if (i4) free(qk);
            kvd_kvcache_free(&c);
        }
        free(k), free(v), free(q), free(oc), free(og), free(o2), free(o3), free(work);
    }
    kvd_kv_scales_free(&sc);
}

/* Two distributions compared head by head (the drift figures' sampled rows)
 * against kvd_attn_compare: KL within 1e-12 relative (the device sums in
 * another order), the most-attended positions exact. The distributions have
 * zeros where P is (no term) and where Q is (the 1e-300 floor: a term of
 * p * 690), and tied maxima (the first must win); contexts from one
 * position to more than the kernel's threads cover many times. One case is
 * known in closed form. */
static void compare(void) {
    const int shapes[5][2] = {{1, 1}, {1, 2}, {3, 255}, {6, 1000}, {2, 70001}};
    for (int si = 0; si < 5; si++) {
        const int nh = shapes[si][0], n = shapes[si][1];
        const size_t np = (size_t)nh * n;
        float *p = malloc(sizeof(float) * np), *q = malloc(sizeof(float) * np);
        double kc[6], kg[6];
        int pc[6], qc[6], pg[6], qg[6];
        uint64_t key = kvd_rng_key((uint64_t)si, "gpu.compare");
        for (int h = 0; h < nh; h++) {
            float *ph = p + (size_t)h * n, *qh = q + (size_t)h * n;
            double sp = 0, sq = 0;
            for (int t = 0; t < n; t++) {
                size_t i = (size_t)h * n + t;
                ph[t] = t % 7 == 3 ? 0.0f : expf(2.0f * kvd_rng_normal(key, i));
                qh[t] = t % 11 == 5 ? 0.0f : ph[t] * expf(0.3f * kvd_rng_normal(key, i + np));
            }
            if (n > 2) { /* tied maxima, the later one found first by some thread */
                int a = (h * 37) % (n / 2), b = n - 1 - (h * 11) % (n / 2);
                ph[a] = ph[b] = 1e4f;
                qh[b - 1] = qh[b] = 1e4f;
            }
            for (int t = 0; t < n; t++) sp += ph[t], sq += qh[t];
            for (int t = 0; t < n; t++) ph[t] = (float)(ph[t] / sp), qh[t] = (float)(qh[t] / sq);
        }
        if (n == 2) p[0] = p[1] = 0.5f, q[0] = 0.25f, q[1] = 0.75f;
        kvd_attn_compare(p, q, nh, n, kc, pc, qc);
        CHECK(kvd_cuda_attn_compare(p, q, nh, n, kg, pg, qg) == 0, "cuda compare failed\n");
        for (int h = 0; h < nh; h++) {
            CHECK(fabs(kg[h] - kc[h]) <= 1e-12 * fabs(kc[h]) + 1e-300,
                  "compare %d x %d head %d: KL %.17g on the device, %.17g on the CPU\n", nh, n, h,
                  kg[h], kc[h]);
            CHECK(pg[h] == pc[h] && qg[h] == qc[h],
                  "compare %d x %d head %d: tops %d/%d on the device, %d/%d on the CPU\n", nh, n, h,
                  pg[h], qg[h], pc[h], qc[h]);
        }
        if (n == 2) { /* 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75); the first of equal maxima */
            double want = 0.5 * log(2.0) + 0.5 * log(2.0 / 3.0);
            CHECK(fabs(kc[0] - want) < 1e-15 && pc[0] == 0 && qc[0] == 1,
                  "compare: KL %.17g (want %.17g), tops %d/%d (want 0/1)\n", kc[0], want, pc[0],
                  qc[0]);
        }
        if (n > 2) {
            int a = 0, b = n - 1;
            CHECK(pc[0] == a && qc[0] == b - 1,
                  "compare: tops %d/%d, want the first maxima %d/%d\n", pc[0], qc[0], a, b - 1);
        }
        free(p), free(q);
    }
}

/* The residual streams' and the logits' comparisons against their twins,
 * with cases known in closed form: the four sums within 1e-12 relative;
 * the log-sum-exps within 1e-12, the KL within 1e-10 relative and 1e-12
 * (rounding noise where the two distributions nearly agree),
 * whether the argmaxes agree exactly (tied maxima included). */
static void compare_rows(void) {
    enum { ROWS = 5 };
    const int widths[3] = {2, 700, 50000};
    for (int wi = 0; wi < 3; wi++) {
        const int n = widths[wi];
        const size_t nn = (size_t)ROWS * n;
        float *a = malloc(sizeof(float) * nn), *x = malloc(sizeof(float) * nn);
        uint64_t key = kvd_rng_key((uint64_t)wi, "gpu.compare.rows");
        for (size_t i = 0; i < nn; i++) {
            a[i] = 3.0f * kvd_rng_normal(key, i);
            x[i] = a[i] + 0.05f * kvd_rng_normal(key, i + nn);
        }
        memcpy(x + n, a + n, sizeof(float) * n); /* row 1: equal */
        if (n > 2) {                             /* row 2: tied maxima, on both sides */
            a[2 * n + 5] = a[2 * n + n - 3] = 40.0f;
            x[2 * n + 5] = x[2 * n + n - 3] = 40.0f;
        }
        if (n == 2) { /* row 0 in closed form */
            a[0] = 3, a[1] = 4, x[0] = 3, x[1] = 5;
            a[2 * n] = 0, a[2 * n + 1] = logf(3.0f), x[2 * n] = 0, x[2 * n + 1] = 0;
        }
        kvd_hidden_cmp hc[ROWS], hg[ROWS];
        kvd_logit_cmp lc[ROWS], lg[ROWS];
        kvd_hidden_compare(a, x, ROWS, n, hc);
        const int target[ROWS] = {0, n - 1, -1, n / 2, 1};
        for (int r = 0; r < ROWS; r++)
            lc[r] = kvd_compare_logits(a + (size_t)r * n, x + (size_t)r * n, n, target[r]);
        CHECK(kvd_cuda_hidden_compare(a, x, ROWS, n, hg) == 0, "cuda hidden compare failed\n");
        CHECK(kvd_cuda_logits_compare(a, x, ROWS, n, target, lg) == 0,
              "cuda logits compare failed\n");
        for (int r = 0; r < ROWS; r++) {
            /* the target's logits as given, NaN for none, on both */
            const float *ar = a + (size_t)r * n, *xr = x + (size_t)r * n;
            const int t = target[r];
            for (int side = 0; side < 2; side++) {
                const kvd_logit_cmp *c = side ? &lg[r] : &lc[r];
                CHECK(t < 0 ? isnan(c->a_target) && isnan(c->x_target)
                            : c->a_target == ar[t] && c->x_target == xr[t],
                      "logits compare width %d row %d: target %d's logits %g %g (%s)\n", n, r, t,
                      c->a_target, c->x_target, side ? "device" : "CPU");
            }
        }
        for (int r = 0; r < ROWS; r++) {
            const double c4[4] = {hc[r].err2, hc[r].ref2, hc[r].dot, hc[r].test2};
            const double g4[4] = {hg[r].err2, hg[r].ref2, hg[r].dot, hg[r].test2};
            for (int k = 0; k < 4; k++)
                CHECK(fabs(g4[k] - c4[k]) <= 1e-12 * fabs(c4[k]),
                      "hidden compare width %d row %d sum %d: %.17g on the device, %.17g on the "
                      "CPU\n",
                      n, r, k, g4[k], c4[k]);
            CHECK(fabs(lg[r].lse_a - lc[r].lse_a) <= 1e-12 * fabs(lc[r].lse_a) &&
                      fabs(lg[r].lse_x - lc[r].lse_x) <= 1e-12 * fabs(lc[r].lse_x) &&
                      fabs(lg[r].kl - lc[r].kl) <= 1e-10 * lc[r].kl + 1e-12 &&
                      lg[r].same_argmax == lc[r].same_argmax,
                  "logits compare width %d row %d: kl %.17g/%.17g lse %.17g/%.17g same %d/%d "
                  "(device/CPU)\n",
                  n, r, lg[r].kl, lc[r].kl, lg[r].lse_a, lc[r].lse_a, lg[r].same_argmax,
                  lc[r].same_argmax);
        }
        CHECK(hc[1].err2 == 0 && lc[1].kl == 0 && lc[1].same_argmax == 1,
              "width %d: equal rows compare as unequal\n", n);
        if (n > 2)
            CHECK(lc[2].same_argmax == 1 && lg[2].same_argmax == 1,
                  "width %d: tied maxima on both sides must agree\n", n);
        if (n == 2) {
            /* a = (3, 4), x = (3, 5); logits (0, ln 3) against (0, 0): P = (1/4, 3/4),
             * Q = (1/2, 1/2), KL = 1/4 ln(1/2) + 3/4 ln(3/2) */
            double kl = 0.25 * log(0.5) + 0.75 * log(1.5);
            CHECK(hc[0].err2 == 1 && hc[0].ref2 == 25 && hc[0].dot == 29 && hc[0].test2 == 34,
                  "hidden compare: sums %g %g %g %g, want 1 25 29 34\n", hc[0].err2, hc[0].ref2,
                  hc[0].dot, hc[0].test2);
            CHECK(fabs(lc[2].kl - kl) < 1e-7 && fabs(lc[2].lse_a - log(4.0)) < 1e-7 &&
                      fabs(lc[2].lse_x - log(2.0)) < 1e-15 && lc[2].same_argmax == 0,
                  "logits compare: kl %.17g (want %.17g), lse %.17g %.17g\n", lc[2].kl, kl,
                  lc[2].lse_a, lc[2].lse_x);
        }
        free(a), free(x);
    }
}

/* The chunked delta rule (prefill) against its CPU twin: four heads of 300
 * tokens (four chunks and a partial one) at the real head dims from a
 * non-zero state. Both run each sum in the same order; exp() in double may
 * differ in its last place, hence a tolerance rather than equality. */
static void gdn_chunked(void) {
    enum { H = 4, N = 300, DK = 128, DV = 128 };
    size_t nq = (size_t)H * N;
    float *q = malloc(sizeof(float) * nq * DK), *k = malloc(sizeof(float) * nq * DK),
          *v = malloc(sizeof(float) * nq * DV), *g = malloc(sizeof(float) * nq),
          *b = malloc(sizeof(float) * nq), *o1 = malloc(sizeof(float) * nq * DV),
          *o2 = malloc(sizeof(float) * nq * DV), *S1 = malloc(sizeof(float) * H * DK * DV),
          *S2 = malloc(sizeof(float) * H * DK * DV);
    fill(q, nq * DK, "gpu.gdnc.q", 0.088f); /* about unit norm after dk^-0.5 */
    fill(k, nq * DK, "gpu.gdnc.k", 0.088f);
    fill(v, nq * DV, "gpu.gdnc.v", 1.0f);
    fill(S1, (size_t)H * DK * DV, "gpu.gdnc.S", 0.3f);
    memcpy(S2, S1, sizeof(float) * H * DK * DV);
    for (size_t i = 0; i < nq; i++)
        g[i] = -0.01f - 0.5f * (float)(i % 7), b[i] = 0.1f + 0.1f * (float)(i % 9);
    for (int h = 0; h < H; h++)
        kvd_gdn_chunked(S1 + (size_t)h * DK * DV, q + (size_t)h * N * DK, k + (size_t)h * N * DK,
                        v + (size_t)h * N * DV, g + (size_t)h * N, b + (size_t)h * N,
                        o1 + (size_t)h * N * DV, N, DK, DV, DK, DK, DV, DV);
    CHECK(kvd_cuda_gdn_chunked(S2, q, k, v, g, b, o2, H, N, DK, DV) == 0,
          "cuda gdn chunked failed\n");
    CHECK(rel_l2(o2, o1, nq * DV) < 1e-6, "gdn chunked: output rel L2 %g\n",
          rel_l2(o2, o1, nq * DV));
    CHECK(rel_l2(S2, S1, (size_t)H * DK * DV) < 1e-6, "gdn chunked: state rel L2 %g\n",
          rel_l2(S2, S1, (size_t)H * DK * DV));
    free(q), free(k), free(v), free(g), free(b), free(o1), free(o2), free(S1), free(S2);
}

/* whether name is one of the comma-separated list's entries */
static int listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return 1;
        p += len + (e != NULL);
    }
    return 0;
}

/* how many entries a comma-separated list has */
static int entries(const char *list) {
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    return n;
}

int main(void) {
    char why[256];
    if (!kvd_cuda_available(why, sizeof why)) {
        printf("SKIP: %s: the CUDA parity tests need a GPU\n", why);
        return 77;
    }
    /* KVD_TEST_ONLY=attention,prefill: those sections alone */
    static const struct {
        const char *name;
        void (*run)(void);
    } sections[] = {{"codecs", codecs},
                    {"attention", attention},
                    {"fp8_attention", fp8_attention},
                    {"gemm", gemm},
                    {"gemm_tuning", gemm_tuning},
                    {"linear_w16", linear_w16},
                    {"moe_grouped", moe_grouped},
                    {"dense", dense},
                    {"kv_write", kv_write},
                    {"rht_rows", rht_rows},
                    {"prefill", prefill},
                    {"compare", compare},
                    {"compare_rows", compare_rows},
                    {"gdn", gdn},
                    {"gdn_rows", gdn_rows},
                    {"gdn_chunked", gdn_chunked},
                    {"route_and_sample", route_and_sample}};
    const size_t n_sections = sizeof sections / sizeof sections[0];
    const char *only = getenv("KVD_TEST_ONLY");
    int named = 0;
    for (size_t i = 0; only && i < n_sections; i++) named += listed(only, sections[i].name);
    if (only && named != entries(only)) {
        fprintf(stderr, "KVD_TEST_ONLY=%s: expected section names (codecs, attention, ...)\n",
                only);
        return 2;
    }
    for (size_t i = 0; i < n_sections; i++)
        if (!only || listed(only, sections[i].name)) sections[i].run();
    printf("cuda parity: %d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
