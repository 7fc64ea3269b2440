/* kvdrift: kvd_linear tests: every path against sums in double, the GEMMs
 * of a few rows bit for bit against their order written out in scalar C
 * (with each kernel this CPU runs: AMX, AVX-512, AVX2), batch invariance,
 * the same bits on any thread count, a NaN kept to its row, and the AMX
 * kernels' GEMMs of many rows: weights that are no BF16 left to the BLAS
 * chunk by chunk, infinities kept. Built twice:
 * for this machine and for generic x86-64, whose AVX2 kernel is the code an
 * AVX2 CPU runs. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../kernels/kernels.h"
#include "../../runners/weights.h"

/* a value in (-1, 1) from (seed, i), by the weights' counter-based generator */
static float val(uint32_t seed, size_t i) {
    return 2.0f * kvd_rng_uniform(kvd_rng_key(seed, "test.linalg"), i) - 1.0f;
}

static float *filled(size_t n, uint32_t seed) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = val(seed, i);
    return p;
}

/* the same, rounded to BF16: weights as a BF16 checkpoint's (the AMX
 * kernels take those past KVD_FEW_ROWS rows) */
static float *filled_bf16(size_t n, uint32_t seed) {
    float *p = filled(n, seed);
    kvd_round_bf16(p, n);
    return p;
}

/* The fixed-order kernels this CPU runs, each taken in turn by `for (int
 * i = 0; next_kernel(&i);)`; the BLAS once where the CPU has neither.
 * Every test's teardown takes the default again. */
static const char *const kernels[] = {"amx", "avx512", "avx2"};
static char default_kernel[16];
static int next_kernel(int *i) {
    const int n = (int)(sizeof kernels / sizeof *kernels);
    for (; *i < n; ++*i)
        if (kvd_linear_use(kernels[*i]) == 0) {
            ++*i;
            return 1;
        }
    if (*i == n && !strcmp(default_kernel, "blas")) {
        ++*i;
        return 1;
    }
    return 0;
}

static int default_again(void **st) {
    (void)st;
    return kvd_linear_use(default_kernel);
}

/* every output within 2 K rounding errors (2^-24 each) of the sum of |w x| of
 * the exact sum, which double gives to far better than that */
static void near_double(const float *x, const float *w, const float *y, int M, int N, int K,
                        const char *what) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                double p = (double)x[(size_t)m * K + k] * w[(size_t)n * K + k];
                s += p, a += fabs(p);
            }
            const double got = y[(size_t)m * N + n], tol = 2.0 * K * a / 16777216.0 + 1e-30;
            if (!(fabs(got - s) <= tol))
                fail_msg("%s M=%d N=%d K=%d: y[%d][%d] = %.9g, the double sum %.9g (tolerance "
                         "%.3g)",
                         what, M, N, K, m, n, got, s, tol);
        }
}

static const int Ks[] = {1, 7, 15, 16, 17, 100, 256, 1024};
static const int Ns[] = {1, 3, 4, 5, 256, 300, 513};

/* Up to KVD_FEW_ROWS rows, kvd_linear with any kernel is
 * kvd_linear_rows_ref exactly; past them, and on a CPU with none, the BLAS
 * or (AMX, BF16 weights) the tiles. Every one against double, with weights
 * of any float and with BF16 ones. */
static void every_path_against_double(void **st) {
    (void)st;
    const int Ms[] = {1, 2, 3, 4, 5, 8, 16, 17, 32, 33, 40, 49};
    for (int ki = 0; next_kernel(&ki);)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
                    for (int bf16 = 0; bf16 < 2; bf16++) {
                        const int M = Ms[a], N = Ns[b], K = Ks[c];
                        float *x = filled((size_t)M * K, 1),
                              *w = (bf16 ? filled_bf16 : filled)((size_t)N * K, 2);
                        float *y = malloc(sizeof(float) * (size_t)M * N),
                              *r = malloc(sizeof(float) * (size_t)M * N);
                        kvd_linear(x, w, y, M, N, K);
                        near_double(x, w, y, M, N, K, kvd_linear_kernels());
                        kvd_linear_rows_ref(x, w, r, M, N, K);
                        near_double(x, w, r, M, N, K, "kvd_linear_rows_ref");
                        if (M <= kvd_linear_fixed_rows())
                            for (size_t i = 0; i < (size_t)M * N; i++)
                                if (memcmp(&y[i], &r[i], sizeof(float)))
                                    fail_msg("%s, M=%d N=%d K=%d: y[%zu] = %a, the scalar order "
                                             "gives %a",
                                             kvd_linear_kernels(), M, N, K, i, (double)y[i],
                                             (double)r[i]);
                        free(x), free(w), free(y), free(r);
                    }
}

/* The order written out by hand for one output: K = 20, so lanes 0..3 take
 * two products and 4..15 one; then the tree. */
static void scalar_order_by_hand(void **st) {
    (void)st;
    enum { K = 20 };
    float x[K], w[K], y;
    for (int k = 0; k < K; k++) x[k] = val(3, (size_t)k), w[k] = val(4, (size_t)k) * 1e3f;
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = fmaf(w[l], x[l], 0.0f);
    for (int l = 0; l < 4; l++) lane[l] = fmaf(w[16 + l], x[16 + l], lane[l]);
    float h[8];
    for (int l = 0; l < 8; l++) h[l] = lane[l] + lane[l + 8];
    float q[4];
    for (int l = 0; l < 4; l++) q[l] = h[l] + h[l + 4];
    const float want = (q[0] + q[2]) + (q[1] + q[3]);
    kvd_linear_rows_ref(x, w, &y, 1, 1, K);
    assert_memory_equal(&y, &want, sizeof y);
    for (int ki = 0; next_kernel(&ki);)
        if (kvd_linear_fixed_rows()) {
            kvd_linear(x, w, &y, 1, 1, K);
            assert_memory_equal(&y, &want, sizeof y);
        }
}

/* A row's outputs do not depend on the rows batched with it: each row of
 * every batch up to KVD_FEW_ROWS, multiplied alone, gives the bits the
 * batch gave it (batched decode equals each sequence decoded alone). */
static void batch_invariance(void **st) {
    (void)st;
    const int N = 300, K = 1024;
    for (int ki = 0; next_kernel(&ki);) {
        const int M = kvd_linear_fixed_rows();
        if (!M) {
            print_message("skipped: this CPU has neither AVX-512 nor AVX2 with FMA; a few rows go "
                          "to the BLAS, whose sums change with the batch\n");
            continue;
        }
        float *x = filled((size_t)M * K, 5), *w = filled((size_t)N * K, 6);
        float *yb = malloc(sizeof(float) * (size_t)M * N), *y1 = malloc(sizeof(float) * N);
        for (int m0 = 1; m0 <= M; m0++) {
            kvd_linear(x, w, yb, m0, N, K);
            for (int m = 0; m < m0; m++) {
                kvd_linear(x + (size_t)m * K, w, y1, 1, N, K);
                if (memcmp(y1, yb + (size_t)m * N, sizeof(float) * N))
                    fail_msg("%s: row %d of a batch of %d differs from the row alone",
                             kvd_linear_kernels(), m, m0);
            }
        }
        free(x), free(w), free(yb), free(y1);
    }
}

/* The kernels' choice: the best this CPU runs by default, named in the
 * BLAS line; "blas" leaves every GEMM to OpenBLAS; a name that is no
 * kernel is refused */
static void kernel_choice(void **st) {
    (void)st;
    const char *best = kvd_linear_kernels();
    char line[160];
    snprintf(line, sizeof line, "%s", kvd_cpu_blas());
    if (!getenv("KVD_CPU_GEMM")) {
        if (kvd_linear_use("amx") == 0)
            assert_string_equal(best, "amx");
        else if (kvd_linear_use("avx512") == 0)
            assert_string_equal(best, "avx512");
        else if (kvd_linear_use("avx2") == 0)
            assert_string_equal(best, "avx2");
        else
            assert_string_equal(best, "blas");
    }
#ifdef __x86_64__
    assert_int_equal(kvd_linear_use("avx2") == 0,
                     __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
    assert_int_equal(kvd_linear_use("avx512") == 0,
                     __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"));
    if (kvd_linear_use("amx") == 0) assert_true(__builtin_cpu_supports("avx512bw"));
#endif
    if (kvd_linear_use("amx") == 0) {
        assert_int_equal(kvd_linear_fixed_rows(), KVD_FEW_ROWS);
        assert_non_null(
            strstr(kvd_cpu_blas(), "; up to 32 rows: AVX-512 FMA; BF16 weights: AMX-BF16"));
    }
    if (kvd_linear_use("avx512") == 0) assert_null(strstr(kvd_cpu_blas(), "AMX"));
    if (kvd_linear_use("avx2") == 0) {
        assert_int_equal(kvd_linear_fixed_rows(), KVD_FEW_ROWS);
        assert_non_null(strstr(kvd_cpu_blas(), "; up to 32 rows: AVX2 FMA"));
    }
    assert_int_equal(kvd_linear_use("blas"), 0);
    assert_int_equal(kvd_linear_fixed_rows(), 0);
    assert_null(strstr(kvd_cpu_blas(), "rows:"));
    assert_int_equal(strncmp(kvd_cpu_blas(), "OpenBLAS ", 9), 0);
    assert_int_equal(kvd_linear_use("avx-512"), -2);
    assert_string_equal(kvd_linear_kernels(), "blas");
    assert_int_equal(kvd_linear_use(best), 0);
    assert_string_equal(kvd_cpu_blas(), line);
}

/* One thread or two: the same bits, at a few rows and at many (the BLAS
 * path splits N into fixed chunks) */
static void threads_give_the_same_bits(void **st) {
    (void)st;
#ifdef _OPENMP
    const int Ms[] = {1, 4, 16, 64, 64}, N = 1000, K = 512, t0 = omp_get_max_threads();
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        const int M = Ms[a];
        /* the last with BF16 weights: the AMX kernels' where they run */
        float *x = filled((size_t)M * K, 7),
              *w = (a + 1 == sizeof Ms / sizeof *Ms ? filled_bf16 : filled)((size_t)N * K, 8);
        float *y1 = malloc(sizeof(float) * (size_t)M * N),
              *y2 = malloc(sizeof(float) * (size_t)M * N);
        omp_set_num_threads(1);
        kvd_linear(x, w, y1, M, N, K);
        omp_set_num_threads(2);
        kvd_linear(x, w, y2, M, N, K);
        assert_memory_equal(y1, y2, sizeof(float) * (size_t)M * N);
        free(x), free(w), free(y1), free(y2);
    }
    omp_set_num_threads(t0);
#else
    print_message("skipped: built without OpenMP\n");
#endif
}

/* A NaN in one row's activations turns that row's outputs NaN and no
 * other's (the model's NaN check names the position it came from) */
static void nan_stays_in_its_row(void **st) {
    (void)st;
    const int Ms[] = {4, 40}, N = 260, K = 96;
    for (int ki = 0; next_kernel(&ki);)
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
            const int M = Ms[a];
            float *x = filled((size_t)M * K, 9), *w = filled_bf16((size_t)N * K, 10);
            float *y = malloc(sizeof(float) * (size_t)M * N);
            x[(size_t)2 * K + 50] = NAN;
            kvd_linear(x, w, y, M, N, K);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    if (isnan(y[(size_t)m * N + n]) != (m == 2))
                        fail_msg("M=%d: y[%d][%d] = %g", M, m, n, (double)y[(size_t)m * N + n]);
            free(x), free(w), free(y);
        }
}

/* The AMX kernels' GEMMs of more than KVD_FEW_ROWS rows. */
static int amx_or_skip(void) {
    if (kvd_linear_use("amx") == 0) return 1;
    print_message("skipped: this CPU has no AMX-BF16 the process may use\n");
    return 0;
}

static int same_bits(const float *a, const float *b) {
    return !memcmp(a, b, sizeof(float));
}

/* A row's outputs are the same bits in any batch past KVD_FEW_ROWS rows,
 * with x's values spread over 2^-20..2^20 (every part of the split counts) */
static void amx_batch_invariance(void **st) {
    (void)st;
    if (!amx_or_skip()) return;
    const int M = 100, N = 300, K = 1000;
    float *x = filled((size_t)M * K, 11), *w = filled_bf16((size_t)N * K, 12);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = ldexpf(x[i], (int)(i % 41) - 20);
    float *yb = malloc(sizeof(float) * (size_t)M * N), *ys = malloc(sizeof(float) * (size_t)M * N);
    kvd_linear(x, w, yb, M, N, K);
    near_double(x, w, yb, M, N, K, "amx");
    const int parts[][2] = {{0, 33}, {33, 47}, {5, 64}, {60, 40}};
    for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
        const int m0 = parts[p][0], n = parts[p][1];
        kvd_linear(x + (size_t)m0 * K, w, ys, n, N, K);
        for (int m = 0; m < n; m++)
            for (int j = 0; j < N; j++)
                if (!same_bits(&ys[(size_t)m * N + j], &yb[(size_t)(m0 + m) * N + j]))
                    fail_msg("amx: row %d, column %d of a batch of %d rows from row %d differs "
                             "from the batch of %d",
                             m0 + m, j, n, m0, M);
    }
    free(x), free(w), free(yb), free(ys);
}

/* A 256-column chunk of W with a value that is no BF16 (an FP32
 * checkpoint's), or a BF16 denormal (the tiles would read it as 0), goes to
 * the BLAS, and only that chunk: its columns are the BLAS's bits, the
 * others the tiles'. */
static void amx_chunks_not_bf16(void **st) {
    (void)st;
    if (!amx_or_skip()) return;
    const int M = 40, N = 700, K = 200;
    float *x = filled((size_t)M * K, 13), *w = filled_bf16((size_t)N * K, 14);
    float *bad = malloc(sizeof(float) * (size_t)N * K);
    memcpy(bad, w, sizeof(float) * (size_t)N * K);
    bad[(size_t)300 * K + 5] = nextafterf(bad[(size_t)300 * K + 5], 1.0f); /* chunk 1 */
    bad[(size_t)600 * K + 3] = ldexpf(1.0f, -130);                         /* chunk 2 */
    float *ya = malloc(sizeof(float) * (size_t)M * N), *yw = malloc(sizeof(float) * (size_t)M * N),
          *yb = malloc(sizeof(float) * (size_t)M * N);
    kvd_linear(x, w, ya, M, N, K);
    kvd_linear(x, bad, yw, M, N, K);
    /* laid out once, as the model's: the rows cut into blocks for the
     * threads where the tiles run, the BLAS's chunks whole; the same bits */
    kvd_wtiles *tb = kvd_wtiles_new(bad, N, K);
    float *yt = malloc(sizeof(float) * (size_t)M * N);
    kvd_linear_tiled(x, bad, tb, yt, M, N, K);
    assert_memory_equal(yt, yw, sizeof(float) * (size_t)M * N);
    kvd_wtiles_free(tb);
    free(yt);
    assert_int_equal(kvd_linear_use("avx512"), 0);
    kvd_linear(x, bad, yb, M, N, K);
    near_double(x, bad, yw, M, N, K, "amx, some chunks to the BLAS");
    int tiles_differ = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)m * N + n;
            const int blas = n >= 256;
            if (!same_bits(&yw[i], blas ? &yb[i] : &ya[i]))
                fail_msg("y[%d][%d] = %a: expected the %s's %a", m, n, (double)yw[i],
                         blas ? "BLAS" : "tiles", (double)(blas ? yb[i] : ya[i]));
            tiles_differ += n < 256 && !same_bits(&yw[i], &yb[i]);
        }
    /* the tiles sum in another order than the BLAS: some last bits differ */
    assert_true(tiles_differ > 0);
    free(x), free(w), free(bad), free(ya), free(yw), free(yb);
}

/* An infinity in x gives what the BLAS gives: +-inf by the sign of its
 * weight (NaN where that weight is 0), not inf - inf in the split's rest */
static void amx_infinity(void **st) {
    (void)st;
    if (!amx_or_skip()) return;
    const int M = 36, N = 40, K = 64;
    float *x = filled((size_t)M * K, 15), *w = filled_bf16((size_t)N * K, 16);
    x[(size_t)3 * K + 7] = INFINITY;
    x[(size_t)20 * K + 9] = -INFINITY;
    w[(size_t)5 * K + 7] = 0.0f;
    float *ya = malloc(sizeof(float) * (size_t)M * N), *yb = malloc(sizeof(float) * (size_t)M * N);
    kvd_linear(x, w, ya, M, N, K);
    assert_int_equal(kvd_linear_use("avx512"), 0);
    kvd_linear(x, w, yb, M, N, K);
    int infs = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) {
        if (isnan(ya[i]) != isnan(yb[i]) || isinf(ya[i]) != isinf(yb[i]) ||
            (isinf(ya[i]) && signbit(ya[i]) != signbit(yb[i])))
            fail_msg("y[%zu]: the tiles give %g, the BLAS %g", i, (double)ya[i], (double)yb[i]);
        infs += isinf(ya[i]) != 0;
    }
    assert_int_equal(infs, 2 * N - 1);
    assert_true(isnan(ya[(size_t)3 * N + 5]));
    free(x), free(w), free(ya), free(yb);
}

/* W's tiles laid out once (kvd_wtiles_new) give kvd_linear's bits past
 * KVD_FEW_ROWS rows: every chunk from the tiles, a chunk that is no BF16
 * from the BLAS; under other kernels there are none, and tiles made for
 * another shape are not taken */
static void amx_tiles_laid_out_once(void **st) {
    (void)st;
    const int N = 700, K = 200, Ms[] = {33, 64, 100};
    float *w = filled_bf16((size_t)N * K, 17);
    assert_int_equal(kvd_linear_use("avx512"), 0);
    assert_null(kvd_wtiles_new(w, N, K));
    if (!amx_or_skip()) {
        free(w);
        return;
    }
    w[(size_t)400 * K + 9] = nextafterf(w[(size_t)400 * K + 9], 2.0f); /* chunk 1: the BLAS */
    kvd_wtiles *t = kvd_wtiles_new(w, N, K), *other = kvd_wtiles_new(w, N - 1, K);
    assert_non_null(t);
    assert_int_equal(kvd_wtiles_bytes(t), (size_t)3 * 16 * 7 * 512 * 2); /* 3 chunks, 7 of K */
    for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++) {
        const int M = Ms[a];
        float *x = filled((size_t)M * K, 18);
        float *y = malloc(sizeof(float) * (size_t)M * N),
              *yt = malloc(sizeof(float) * (size_t)M * N),
              *yo = malloc(sizeof(float) * (size_t)M * N);
        kvd_linear(x, w, y, M, N, K);
        kvd_linear_tiled(x, w, t, yt, M, N, K);
        kvd_linear_tiled(x, w, other, yo, M, N, K);
        assert_memory_equal(y, yt, sizeof(float) * (size_t)M * N);
        assert_memory_equal(y, yo, sizeof(float) * (size_t)M * N);
        near_double(x, w, yt, M, N, K, "amx, tiles laid out once");
        free(x), free(y), free(yt), free(yo);
    }
    kvd_wtiles_free(t);
    kvd_wtiles_free(other);
    /* no chunk of BF16 values: no tiles kept */
    for (size_t i = 0; i < (size_t)N * K; i += 997) w[i] = nextafterf(w[i], 2.0f);
    t = kvd_wtiles_new(w, N, K);
    assert_int_equal(kvd_wtiles_bytes(t), 0);
    kvd_wtiles_free(t);
    free(w);
}

/* With W laid out once, the tiles take every row count: a row of any batch
 * from 1 to 100 rows gets the bits it gets in the batch of 100 (a decode
 * step, alone or batched, as a prefill chunk), each within double's sum */
static void amx_tiles_any_rows(void **st) {
    (void)st;
    if (!amx_or_skip()) return;
    /* 300 columns: two chunks; 16 (a router's): one, whose rows the
     * threads share in blocks */
    const int M = 100, Ns[] = {300, 16}, K = 1000;
    for (int ni = 0; ni < 2; ni++) {
        const int N = Ns[ni];
        float *x = filled((size_t)M * K, 19), *w = filled_bf16((size_t)N * K, 20);
        kvd_wtiles *t = kvd_wtiles_new(w, N, K);
        assert_non_null(t);
        float *yb = malloc(sizeof(float) * (size_t)M * N),
              *ys = malloc(sizeof(float) * (size_t)M * N);
        kvd_linear_tiled(x, w, t, yb, M, N, K);
        near_double(x, w, yb, M, N, K, "amx, tiles laid out once, the batch");
        for (int n = 1; n <= 40; n += n < 4 ? 1 : 7) {
            const int m0 = (n * 13) % (M - n + 1);
            kvd_linear_tiled(x + (size_t)m0 * K, w, t, ys, n, N, K);
            near_double(x + (size_t)m0 * K, w, ys, n, N, K, "amx, tiles laid out once");
            if (memcmp(ys, yb + (size_t)m0 * N, sizeof(float) * (size_t)n * N))
                fail_msg("amx: %d rows from row %d of %d columns laid out once differ from the "
                         "batch of %d",
                         n, m0, N, M);
        }
        kvd_wtiles_free(t);
        free(x), free(w), free(yb), free(ys);
    }
}

/* kvd_linear_many: one split of x and one fork for several matrices over
 * it, the bits of one kvd_linear_tiled call each. Four matrices as the
 * model's router and shared expert (16, 300, 300 and 1 columns; one chunk
 * of the second not BF16, so the BLAS takes it), and the same with one
 * matrix without tiles (one call a job), at 1 to 100 rows, under the
 * CPU's default kernels (the tiles where it has AMX). */
static void linear_many_is_one_call_each(void **st) {
    (void)st;
    enum { J = 4, K = 200 };
    const int Ns[J] = {16, 300, 300, 1}, Ms[] = {1, 5, 33, 100};
    float *w[J], *y1[J], *y2[J];
    kvd_wtiles *t[J];
    float *x = filled((size_t)100 * K, 21);
    for (int j = 0; j < J; j++) {
        w[j] = filled_bf16((size_t)Ns[j] * K, 22 + j);
        y1[j] = malloc(sizeof(float) * 100 * (size_t)Ns[j]);
        y2[j] = malloc(sizeof(float) * 100 * (size_t)Ns[j]);
    }
    w[1][(size_t)280 * K + 7] = nextafterf(w[1][(size_t)280 * K + 7], 2.0f); /* chunk 1 */
    for (int j = 0; j < J; j++) t[j] = kvd_wtiles_new(w[j], Ns[j], K);
    for (int untiled = 0; untiled < 2; untiled++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            kvd_linear_job jobs[J];
            for (int j = 0; j < J; j++) {
                jobs[j] = (kvd_linear_job){w[j], untiled && j == 2 ? NULL : t[j], y2[j], Ns[j]};
                kvd_linear_tiled(x, w[j], jobs[j].t, y1[j], M, Ns[j], K);
                memset(y2[j], 0xff, sizeof(float) * (size_t)M * Ns[j]);
            }
            kvd_linear_many(x, jobs, J, M, K);
            for (int j = 0; j < J; j++) {
                near_double(x, w[j], y2[j], M, Ns[j], K, "kvd_linear_many");
                if (memcmp(y1[j], y2[j], sizeof(float) * (size_t)M * Ns[j]))
                    fail_msg("kvd_linear_many (%s): matrix %d of %d columns at %d rows differs "
                             "from its own call",
                             kvd_linear_kernels(), j, Ns[j], M);
            }
        }
    for (int j = 0; j < J; j++) kvd_wtiles_free(t[j]), free(w[j]), free(y1[j]), free(y2[j]);
    free(x);
}

int main(void) {
    snprintf(default_kernel, sizeof default_kernel, "%s", kvd_linear_kernels());
    print_message("the default GEMM kernels: %s\n", default_kernel);
#define T(f) cmocka_unit_test_teardown(f, default_again)
    const struct CMUnitTest tests[] = {
        T(every_path_against_double),  T(scalar_order_by_hand), T(batch_invariance),
        T(threads_give_the_same_bits), T(nan_stays_in_its_row), T(kernel_choice),
        T(amx_batch_invariance),       T(amx_chunks_not_bf16),  T(amx_infinity),
        T(amx_tiles_laid_out_once),    T(amx_tiles_any_rows),   T(linear_many_is_one_call_each),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
