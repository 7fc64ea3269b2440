/* kvdrift: every CUDA kernel against its CPU twin on the same inputs: the
 * codecs bit for bit (both saturation modes, with scales), decode attention
 * over a scattered paged cache in every format within a stated tolerance.
 * Skips (77) with the reason when no device is visible. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cuda/cuda_kernels.h"
#include "../../runners/weights.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            if (failures++ < 10) fprintf(stderr, __VA_ARGS__);                                     \
        }                                                                                          \
    } while (0)

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

static void attention(void) {
    const int nh = 8, kvh = 2, hd = 256, bs = 16, n_ctx = 3000;
    int nb = (n_ctx + bs - 1) / bs + 5;
    const kvd_fmt fmts[3] = {KVD_FMT_BF16, KVD_FMT_E4M3, KVD_FMT_E5M2};
    for (int fi = 0; fi < 3; fi++) {
        size_t esz = kvd_fmt_bytes(fmts[fi]), n = (size_t)nb * kvh * bs * hd;
        float *src = malloc(sizeof(float) * n), q[8 * 256], ocpu[8 * 256], ogpu[8 * 256];
        uint8_t *k = malloc(n * esz), *v = malloc(n * esz);
        uint64_t key = kvd_rng_key((uint64_t)fi, "gpu.attn");
        for (size_t i = 0; i < n; i++) src[i] = 2.0f * kvd_rng_normal(key, i);
        float ks[2] = {0.02f, 0.03f}, vs[2] = {0.01f, 0.015f}, one[2] = {1, 1};
        if (fmts[fi] == KVD_FMT_BF16) {
            kvd_quant_bf16(src, (uint16_t *)k, n);
            kvd_quant_bf16(src, (uint16_t *)v, n);
        } else if (fmts[fi] == KVD_FMT_E4M3) {
            kvd_quant_e4m3(src, k, n, 0.02f, 1, NULL);
            kvd_quant_e4m3(src, v, n, 0.01f, 1, NULL);
        } else {
            kvd_quant_e5m2(src, k, n, 1.0f, 1, NULL);
            kvd_quant_e5m2(src, v, n, 1.0f, 1, NULL);
        }
        int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
        for (int i = 0; i < nb; i++) blocks[i] = (int32_t)(((int64_t)i * 37) % nb);
        for (int i = 0; i < nh * hd; i++) q[i] = kvd_rng_normal(key, (uint64_t)i + n);
        int fp8s = fmts[fi] == KVD_FMT_E4M3;
        kvd_kv_view view = {fmts[fi], bs, kvh, hd, k, v, fp8s ? ks : one, fp8s ? vs : one, 0};
        void *work = malloc(kvd_attn_work_bytes(nh, hd, n_ctx, 3));
        float *probs = malloc(sizeof(float) * (size_t)nh * n_ctx);
        kvd_attn_paged(&view, blocks, n_ctx, q, nh, 1.0f / 16.0f, ocpu, probs, work, 3);
        for (int ver = 1; ver <= 2; ver++) {
            CHECK(kvd_cuda_attn_decode_v(&view, nb, blocks, n_ctx, q, nh, 1.0f / 16.0f, ogpu, ver) == 0,
                  "cuda attention v%d failed\n", ver);
            /* both accumulate 3000 fp32 products in different orders: 1e-4
             * relative L2 per head is far below any real discrepancy (a wrong
             * block or scale moves it by O(1)) */
            for (int h = 0; h < nh; h++) {
                double num = 0, den = 0;
                for (int d = 0; d < hd; d++) {
                    double e = (double)ogpu[h * hd + d] - ocpu[h * hd + d];
                    num += e * e;
                    den += (double)ocpu[h * hd + d] * ocpu[h * hd + d];
                }
                CHECK(sqrt(num / den) < 1e-4, "attention v%d fmt %d head %d: rel L2 %g\n", ver, fi,
                      h, sqrt(num / den));
            }
        }
        free(src), free(k), free(v), free(blocks), free(work), free(probs);
    }
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

int main(void) {
    char why[256];
    if (!kvd_cuda_available(why, sizeof why)) {
        printf("SKIP: %s: the CUDA parity tests need a GPU\n", why);
        return 77;
    }
    codecs();
    attention();
    gemm();
    printf("cuda parity: %d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
