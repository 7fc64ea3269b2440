/* kvdrift: dense building blocks on the CPU: GEMM (OpenBLAS, our kernels
 * for a few rows, AMX-BF16 tiles for many), norms, RoPE, softmax, top-k. */
#define _DEFAULT_SOURCE /* syscall (amx.h) */
#include "../kernels.h"
#include "amx.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* One thread pool, ours: OpenBLAS runs single-threaded inside OpenMP regions
 * that split the output features. Two pools spinning on the same cores cost
 * more than either saves. The split is into fixed 256-column chunks whatever
 * the thread count, so every output element comes from the same BLAS call
 * shape, and results are bit-identical on 1 or 64 threads (OpenBLAS picks
 * kernels by shape). */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single(void) {
    openblas_set_num_threads(1);
}

#define KVD_LINEAR_CHUNK 256
/* the 256-column chunks of N columns */
static inline int chunks_of(int N) {
    return (N + KVD_LINEAR_CHUNK - 1) / KVD_LINEAR_CHUNK;
}
/* the end of chunk c's columns (of N) */
static inline int chunk_end(int c, int N) {
    return (c + 1) * KVD_LINEAR_CHUNK < N ? (c + 1) * KVD_LINEAR_CHUNK : N;
}

/* ---- a few rows: decode's GEMMs ----
 * At decode a GEMM has one row per sequence of the batch. OpenBLAS packs
 * the weights for every call, which at a few rows costs more than the
 * products (at 4 rows it reads them at a quarter of the memory bandwidth:
 * bench kernels' decode GEMMs), and sums a row otherwise as the batch
 * grows. Up to KVD_FEW_ROWS rows, the weights stream once instead, a few of
 * their rows at a time against every row of x, and every output is one
 * fixed sequence of operations:
 *   lane l (0..15) accumulates fmaf(w[k], x[k], acc) over k = l, l + 16, ...
 *   (zeros past K); then lanes l and l + 8 are added, then l and l + 4,
 *   then (0 + 2) + (1 + 3).
 * So a row's outputs are the same bits whichever other rows share its batch
 * and however N is split over threads: batched decode equals each sequence
 * decoded alone. kvd_linear_rows_ref below is that sequence written out.
 *
 * Two kernels run it, chosen when the program starts by what the CPU has,
 * not what the build was told: AVX-512 (a lane a float of one zmm) and
 * AVX2 with FMA (lanes 0-7 in one ymm, 8-15 in another). Both are the same
 * operations, so the same bits; a build for generic x86-64 (the GPU
 * bundle's) takes them too. A CPU with neither leaves every GEMM to the
 * BLAS. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVD_FEW_ROWS_X86 1
#include <immintrin.h>
#define KVD_AVX512 __attribute__((target("avx512f,avx512dq")))
/* (in a -march=native build on an AVX-512 CPU the compiler may use AVX-512
 * encodings here too; the generic build's unit_linalg_generic runs the code
 * an AVX2 CPU runs) */
#define KVD_AVX2 __attribute__((target("avx2,fma")))

/* ---- AVX-512: four rows of x against four rows of w, 16 zmm sums ---- */
KVD_AVX512 static inline float lanes_sum512(__m512 v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/* mb rows of x against nb rows of w (both at most 4; constants where it is
 * inlined, so the 16 accumulators stay in registers) */
KVD_AVX512 static inline __attribute__((always_inline)) void
tile512(const float *x, const float *w, float *y, int N, int K, int mb, int nb) {
    __m512 acc[4][4], wv[4];
    for (int m = 0; m < mb; m++)
        for (int j = 0; j < nb; j++) acc[m][j] = _mm512_setzero_ps();
    for (int k = 0; k < K; k += 16) {
        const __mmask16 t = kvd_lanes16(K - k);
        for (int j = 0; j < nb; j++) wv[j] = _mm512_maskz_loadu_ps(t, w + (size_t)j * K + k);
        for (int m = 0; m < mb; m++) {
            const __m512 xv = _mm512_maskz_loadu_ps(t, x + (size_t)m * K + k);
            for (int j = 0; j < nb; j++) acc[m][j] = _mm512_fmadd_ps(wv[j], xv, acc[m][j]);
        }
    }
    for (int m = 0; m < mb; m++)
        for (int j = 0; j < nb; j++) y[(size_t)m * N + j] = lanes_sum512(acc[m][j]);
}

/* every row of x against nb rows of w, four rows of x at a time */
KVD_AVX512 static inline __attribute__((always_inline)) void
group512(const float *x, const float *w, float *y, int M, int N, int K, int nb) {
    for (int m0 = 0; m0 < M; m0 += 4) {
        const float *xm = x + (size_t)m0 * K;
        float *ym = y + (size_t)m0 * N;
        if (M - m0 >= 4)
            tile512(xm, w, ym, N, K, 4, nb);
        else if (M - m0 == 3)
            tile512(xm, w, ym, N, K, 3, nb);
        else if (M - m0 == 2)
            tile512(xm, w, ym, N, K, 2, nb);
        else
            tile512(xm, w, ym, N, K, 1, nb);
    }
}

KVD_AVX512 static void rows_avx512(const float *x, const float *w, float *y, int M, int N, int K,
                                   int n0, int n1) {
    int n = n0;
    for (; n + 4 <= n1; n += 4) group512(x, w + (size_t)n * K, y + n, M, N, K, 4);
    for (; n < n1; n++) group512(x, w + (size_t)n * K, y + n, M, N, K, 1);
}

/* ---- AVX2: two rows of x against three rows of w, 12 ymm sums (a lane
 * pair each), 15 of the 16 registers with the loads ---- */
KVD_AVX2 static inline float lanes_sum256(__m256 lo, __m256 hi) {
    __m256 a = _mm256_add_ps(lo, hi); /* l + (l + 8) */
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

KVD_AVX2 static inline __attribute__((always_inline)) void
tile256(const float *x, const float *w, float *y, int N, int K, int mb, int nb) {
    __m256 acc[2][3][2], xv[2][2];
    for (int m = 0; m < mb; m++)
        for (int j = 0; j < nb; j++) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int h = 0; h < 2; h++) {
            for (int m = 0; m < mb; m++) xv[m][h] = _mm256_loadu_ps(x + (size_t)m * K + k + 8 * h);
            for (int j = 0; j < nb; j++) {
                const __m256 wv = _mm256_loadu_ps(w + (size_t)j * K + k + 8 * h);
                for (int m = 0; m < mb; m++)
                    acc[m][j][h] = _mm256_fmadd_ps(wv, xv[m][h], acc[m][j][h]);
            }
        }
    if (k < K) { /* the last 1..15 columns, zeros past K */
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        for (int h = 0; h < 2; h++) {
            const __m256i t = _mm256_cmpgt_epi32(_mm256_set1_epi32(K - k - 8 * h), lane);
            for (int m = 0; m < mb; m++)
                xv[m][h] = _mm256_maskload_ps(x + (size_t)m * K + k + 8 * h, t);
            for (int j = 0; j < nb; j++) {
                const __m256 wv = _mm256_maskload_ps(w + (size_t)j * K + k + 8 * h, t);
                for (int m = 0; m < mb; m++)
                    acc[m][j][h] = _mm256_fmadd_ps(wv, xv[m][h], acc[m][j][h]);
            }
        }
    }
    for (int m = 0; m < mb; m++)
        for (int j = 0; j < nb; j++)
            y[(size_t)m * N + j] = lanes_sum256(acc[m][j][0], acc[m][j][1]);
}

KVD_AVX2 static inline __attribute__((always_inline)) void
group256(const float *x, const float *w, float *y, int M, int N, int K, int nb) {
    int m0 = 0;
    for (; m0 + 2 <= M; m0 += 2) tile256(x + (size_t)m0 * K, w, y + (size_t)m0 * N, N, K, 2, nb);
    if (m0 < M) tile256(x + (size_t)m0 * K, w, y + (size_t)m0 * N, N, K, 1, nb);
}

KVD_AVX2 static void rows_avx2(const float *x, const float *w, float *y, int M, int N, int K,
                               int n0, int n1) {
    int n = n0;
    for (; n + 3 <= n1; n += 3) group256(x, w + (size_t)n * K, y + n, M, N, K, 3);
    if (n1 - n == 2) group256(x, w + (size_t)n * K, y + n, M, N, K, 2);
    if (n1 - n == 1) group256(x, w + (size_t)n * K, y + n, M, N, K, 1);
}
#endif

/* ---- BF16 weights: AMX-BF16 ----
 * On a CPU with AMX-BF16 (the "amx" kernels), a GEMM whose weights are BF16
 * values (a BF16 checkpoint's, the synthetic model's) runs on the tiles:
 * at any row count where W was laid out for them once (kvd_wtiles_new: the
 * model's matrices; decode streams them as BF16, half the FP32 bytes), and
 * past KVD_FEW_ROWS rows otherwise, laid out on each call.
 * TDPBF16PS adds products of BF16 pairs into FP32 accumulators; a product
 * of two BF16 is exact in FP32. x is FP32, so each of its values is split
 * into three BF16 (hi, mid, lo: each the rounding of what the ones before
 * left, the float exactly, a denormal rest aside) and the three products
 * go into one accumulator. So the products are sgemm's, exactly; the sums
 * run in another order: each 32-column block of K in turn, its hi, mid and
 * lo parts in turn.
 *   C[16 rows of x][16 columns of W] += A (a part of x's split: 16 rows x
 *   32 of K) times B (W: 16 pairs of K x 16 columns, a pair's two values
 *   side by side in a 32-bit word)
 * Two 16-row groups by two 16-column groups at a time: four accumulators,
 * two A tiles and two B tiles, the eight tiles there are.
 * An output depends on its row of x, its column of W and K only: the same
 * bits in any batch on any thread count (past KVD_FEW_ROWS rows where W is
 * laid out on each call).
 * x's split is laid out once a call; a 256-column chunk of W once
 * (kvd_wtiles_new) or by the thread that takes it, and checked as it is: a
 * value that is not a BF16 (an FP32 checkpoint's) or is a BF16 denormal
 * (the tiles read those as zero) leaves the chunk to the other kernels. */
#ifdef KVD_AMX_X86
enum { AMX_TILE = 512 }; /* BF16 a tile: 16 rows of 32 */

/* x's rows m0..m0+15 (zeros past M), K's 32-column block k0 (zeros past K),
 * as three A tiles side by side: out[part][row][32] */
KVD_AMX_FN static void amx_split_rows(const float *x, int M, int K, int m0, int k0, uint16_t *out) {
    const __mmask16 t0 = kvd_lanes16(K - k0), t1 = kvd_lanes16(K - k0 - 16);
    for (int r = 0; r < 16; r++) {
        __m512 v0 = _mm512_setzero_ps(), v1 = _mm512_setzero_ps();
        if (m0 + r < M) {
            const float *p = x + (size_t)(m0 + r) * K + k0;
            v0 = _mm512_maskz_loadu_ps(t0, p);
            v1 = _mm512_maskz_loadu_ps(t1, p + 16);
        }
        uint16_t *const parts[3] = {out + r * 32, out + AMX_TILE + r * 32,
                                    out + 2 * AMX_TILE + r * 32};
        kvd_split3(v0, v1, parts);
    }
}

/* 16 rows of 16 words, transposed in place: r[i] word j <-> r[j] word i */
KVD_AMX_FN static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* u[4g + j], 128-bit lane L: rows 4g..4g+3, word 4L + j */
    for (int j = 0; j < 4; j++) {
        const __m512i a0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88),
                      a1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd),
                      b0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88),
                      b1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_i32x4(a0, b0, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(a0, b0, 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(a1, b1, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(a1, b1, 0xdd);
    }
}

/* W's rows n0..n1-1 (the output's columns) as B tiles, [n1 - n0 over 16,
 * rounded up][kb][16 pairs of K][16 columns x 2], zeros past n1 and K.
 * 0, or -1 where a value is no BF16 or a BF16 denormal. */
KVD_AMX_FN static int amx_weights(const float *w, int K, int n0, int n1, int kb, uint16_t *out) {
    const __m512i low = _mm512_set1_epi32(0xffff), expo = _mm512_set1_epi32(0x7f800000),
                  mag = _mm512_set1_epi32(0x7fffffff);
    __mmask16 bad = 0;
    for (int g = 0; n0 + 16 * g < n1; g++)
        for (int b = 0; b < kb; b++) {
            const __mmask16 t0 = kvd_lanes16(K - 32 * b), t1 = kvd_lanes16(K - 32 * b - 16);
            __m512i r[16];
            for (int c = 0; c < 16; c++) {
                const int n = n0 + 16 * g + c;
                if (n >= n1) {
                    r[c] = _mm512_setzero_si512();
                    continue;
                }
                const float *p = w + (size_t)n * K + 32 * b;
                const __m512 v0 = _mm512_maskz_loadu_ps(t0, p),
                             v1 = _mm512_maskz_loadu_ps(t1, p + 16);
                const __m512i i0 = _mm512_castps_si512(v0), i1 = _mm512_castps_si512(v1);
                bad |= _mm512_test_epi32_mask(i0, low) | _mm512_test_epi32_mask(i1, low);
                bad |= _mm512_test_epi32_mask(i0, mag) & ~_mm512_test_epi32_mask(i0, expo);
                bad |= _mm512_test_epi32_mask(i1, mag) & ~_mm512_test_epi32_mask(i1, expo);
                /* exact values: the rounding is the truncation */
                r[c] = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
            }
            transpose16(r);
            uint16_t *o = out + ((size_t)g * kb + b) * AMX_TILE;
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(o + p * 32, r[p]);
        }
    return bad ? -1 : 0;
}

/* a 16 x 16 accumulator's copy c to y's rows m0.., columns n0.. (those
 * inside M and n1) */
static void amx_put(const float *c, float *y, int N, int M, int m0, int n0, int n1) {
    for (int r = 0; r < 16 && m0 + r < M; r++)
        for (int j = 0; j < 16 && n0 + j < n1; j++)
            y[(size_t)(m0 + r) * N + n0 + j] = c[r * 16 + j];
}

/* y's columns n0..n1-1 of every row, from x's split xs [row group][kb][3]
 * A tiles and W's tiles wt (amx_weights) */
KVD_AMX_FN static void amx_gemm_cols(const uint16_t *xs, const uint16_t *wt, float *y, int M, int N,
                                     int kb, int n0, int n1) {
    const int mg = (M + 15) / 16, ng = (n1 - n0 + 15) / 16;
    const size_t xg = (size_t)kb * 3 * AMX_TILE, wg = (size_t)kb * AMX_TILE;
    float c[256] __attribute__((aligned(64)));
    const long ys = (long)N * (long)sizeof(float);
    kvd_amx_begin();
    for (int i = 0; i < mg; i += 2)
        for (int j = 0; j < ng; j += 2) {
            const int two_m = i + 1 < mg, two_n = j + 1 < ng;
            const uint16_t *a = xs + (size_t)i * xg, *b = wt + (size_t)j * wg;
            AMX_ZERO(0);
            AMX_ZERO(1);
            AMX_ZERO(2);
            AMX_ZERO(3);
            for (int k = 0; k < kb; k++) {
                const uint16_t *ak = a + (size_t)k * 3 * AMX_TILE, *bk = b + (size_t)k * AMX_TILE;
                AMX_LOAD(6, bk, 64);
                if (two_n) AMX_LOAD(7, bk + wg, 64);
                for (int part = 0; part < 3; part++) {
                    AMX_LOAD(4, ak + part * AMX_TILE, 64);
                    AMX_DP(0, 4, 6);
                    if (two_n) AMX_DP(1, 4, 7);
                    if (two_m) {
                        AMX_LOAD(5, ak + xg + part * AMX_TILE, 64);
                        AMX_DP(2, 5, 6);
                        if (two_n) AMX_DP(3, 5, 7);
                    }
                }
            }
            /* accumulator (r, s) is tile 2r + s: rows 16 (i + r), columns 16 (j + s);
             * straight into y where it lies inside M and n1, else through c */
            const int m0 = 16 * i, c0 = n0 + 16 * j;
#define AMX_PUT(tile, r, s)                                                                        \
    do {                                                                                           \
        const int mr = m0 + 16 * (r), cs = c0 + 16 * (s);                                          \
        if (mr + 16 <= M && cs + 16 <= n1) {                                                       \
            AMX_STORE(tile, y + (size_t)mr * N + cs, ys);                                          \
        } else {                                                                                   \
            AMX_STORE(tile, c, 64);                                                                \
            amx_put(c, y, N, M, mr, cs, n1);                                                       \
        }                                                                                          \
    } while (0)
            AMX_PUT(0, 0, 0);
            if (two_n) AMX_PUT(1, 0, 1);
            if (two_m) AMX_PUT(2, 1, 0);
            if (two_m && two_n) AMX_PUT(3, 1, 1);
#undef AMX_PUT
        }
    kvd_amx_end();
}
#endif

typedef void rows_fn(const float *x, const float *w, float *y, int M, int N, int K, int n0, int n1);
/* The CPU's GEMM kernels, the best first: KVD_CPU_GEMM's word, the BLAS
 * line's words, the kernel for up to KVD_FEW_ROWS rows (none: the BLAS),
 * and whether GEMMs over BF16 weights take the AMX tiles */
static const struct rows_kernel {
    const char *name, *label;
    rows_fn *fn;
    int amx;
} rows_kernels[] = {
#ifdef KVD_FEW_ROWS_X86
#ifdef KVD_AMX_X86
    {"amx", "AVX-512 FMA", rows_avx512, 1},
#endif
    {"avx512", "AVX-512 FMA", rows_avx512, 0},
    {"avx2", "AVX2 FMA", rows_avx2, 0},
#endif
    {"blas", NULL, NULL, 0},
};
enum { N_ROWS_KERNELS = sizeof rows_kernels / sizeof rows_kernels[0] };
static const struct rows_kernel *rows_now; /* set once, before any GEMM */

#ifdef KVD_AMX_X86
/* the AMX kernels' CPU (amx.h), the tiles asked of the OS once, where they
 * would be used */
static int amx_granted;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static void amx_ask(void) {
    unsigned a, b, c = 0, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) c = 0;
    __builtin_cpu_init();
    amx_granted = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi") &&
                  kvd_amx_usable(c);
}
#endif

static int cpu_has(const struct rows_kernel *k) {
#ifdef KVD_AMX_X86
    if (k->amx) {
        pthread_once(&amx_once, amx_ask);
        return amx_granted;
    }
#endif
#ifdef KVD_FEW_ROWS_X86
    __builtin_cpu_init();
    if (k->fn == rows_avx512)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    if (k->fn == rows_avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return k->fn == NULL;
}

static char blas_name[128];
static void blas_describe(void) {
    const char *cfg = openblas_get_config();
    int words = 0, n = 0;
    while (cfg[n] && !(cfg[n] == ' ' && ++words == 2)) n++;
    int k = snprintf(blas_name, sizeof blas_name, "%.*s %s", n, cfg, openblas_get_corename());
    if (rows_now->fn && k > 0 && (size_t)k < sizeof blas_name)
        snprintf(blas_name + k, sizeof blas_name - (size_t)k, "; up to %d rows: %s%s", KVD_FEW_ROWS,
                 rows_now->label, rows_now->amx ? "; BF16 weights: AMX-BF16" : "");
}

static int rows_select(const char *name) {
    for (int i = 0; i < N_ROWS_KERNELS; i++)
        if (!strcmp(rows_kernels[i].name, name)) {
            if (!cpu_has(&rows_kernels[i])) return -1;
            rows_now = &rows_kernels[i];
            blas_describe();
            return 0;
        }
    return -2;
}

static const char *env_refused; /* KVD_CPU_GEMM's value where it could not be taken */
static pthread_once_t rows_once = PTHREAD_ONCE_INIT;
static void rows_default(void) {
    const char *e = getenv("KVD_CPU_GEMM");
    if (e && *e && rows_select(e) == 0) return;
    if (e && *e) env_refused = e;
    for (int i = 0; i < N_ROWS_KERNELS; i++)
        if (cpu_has(&rows_kernels[i])) {
            rows_now = &rows_kernels[i];
            break;
        }
    blas_describe();
}

int kvd_linear_use(const char *name) {
    pthread_once(&rows_once, rows_default);
    return rows_select(name);
}

const char *kvd_linear_kernels(void) {
    pthread_once(&rows_once, rows_default);
    return rows_now->name;
}

int kvd_cpu_gemm_env(char *err, size_t len) {
    pthread_once(&rows_once, rows_default);
    if (!env_refused) return 0;
    char have[64] = "";
    for (int i = 0; i < N_ROWS_KERNELS; i++)
        if (cpu_has(&rows_kernels[i])) {
            size_t n = strlen(have);
            snprintf(have + n, sizeof have - n, "%s%s", n ? ", " : "", rows_kernels[i].name);
        }
    snprintf(err, len, "KVD_CPU_GEMM: expected a kernel this CPU runs (%s), got '%s'", have,
             env_refused);
    return -1;
}

int kvd_linear_fixed_rows(void) {
    pthread_once(&rows_once, rows_default);
    return rows_now->fn ? KVD_FEW_ROWS : 0;
}

/* "OpenBLAS 0.3.21 SkylakeX; up to 32 rows: AVX-512 FMA; BF16 weights:
 * AMX-BF16": the library and its version (its configuration's first two
 * words), the core type it dispatched to, then what sums a GEMM of a few
 * rows instead, and whether GEMMs over BF16 weights take the tiles */
const char *kvd_cpu_blas(void) {
    pthread_once(&rows_once, rows_default);
    return blas_name;
}

void kvd_linear_rows_ref(const float *x, const float *w, float *y, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *xr = x + (size_t)m * K, *wr = w + (size_t)n * K;
            float acc[16] = {0};
            for (int k0 = 0; k0 < K; k0 += 16)
                for (int l = 0; l < 16; l++)
                    acc[l] = k0 + l < K ? fmaf(wr[k0 + l], xr[k0 + l], acc[l]) : acc[l] + 0.0f;
            for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
            for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
            y[(size_t)m * N + n] = (acc[0] + acc[2]) + (acc[1] + acc[3]);
        }
}

static void linear_cols(const float *x, const float *w, float *y, int M, int N, int K, int n0,
                        int n1) {
    if (n1 <= n0) return;
    if (M <= KVD_FEW_ROWS && rows_now->fn) {
        rows_now->fn(x, w, y, M, N, K, n0, n1);
        return;
    }
    if (M == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n1 - n0, K, 1.0f, w + (size_t)n0 * K, K, x, 1,
                    0.0f, y + n0, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n1 - n0, K, 1.0f, x, K,
                    w + (size_t)n0 * K, K, 0.0f, y + n0, N);
    }
}

/* W laid out once for the tiles (kvd_wtiles_new): every chunk's tiles, or
 * none where its values are not all BF16 (bad[chunk]) */
struct kvd_wtiles {
    int N, K, chunks;
    size_t chunk_n; /* BF16 a chunk's tiles take */
    uint16_t *data; /* [chunks][chunk_n]; NULL where every chunk is bad */
    unsigned char *bad;
};

#ifdef KVD_AMX_X86
/* kvd_linear on the tiles (above) for one or more matrices over the same
 * x (kvd_linear_many's jobs): x split once, then each W a chunk at a time
 * (its tiles from t where it has them, else laid out by the thread), each
 * chunk on the other kernels (linear_cols) where its values are not all
 * BF16. -1 where the work areas could not be had (the caller multiplies
 * on the other kernels). */
static int linear_amx(const float *x, const kvd_linear_job *jobs, int n_jobs, int M, int K,
                      int fork) {
    const int mg = (M + 15) / 16, kb = (K + 31) / 32;
    int threads = 1;
#ifdef _OPENMP
    if (fork) threads = omp_get_max_threads();
#endif
    /* the jobs' chunks numbered one after another: job j's from first[j] */
    int first[n_jobs + 1], laid = 1;
    first[0] = 0;
    for (int j = 0; j < n_jobs; j++) {
        first[j + 1] = first[j] + chunks_of(jobs[j].N);
        laid &= jobs[j].t != NULL;
    }
    const int chunks = first[n_jobs];
    const size_t xs_n = (size_t)mg * kb * 3 * AMX_TILE,
                 wt_n = laid ? 0 : (size_t)(KVD_LINEAR_CHUNK / 16) * kb * AMX_TILE;
    uint16_t *xs = aligned_alloc(64, xs_n * sizeof *xs),
             *wt = laid ? NULL : aligned_alloc(64, wt_n * (size_t)threads * sizeof *wt);
    if (!xs || (!laid && !wt)) {
        free(xs), free(wt);
        return -1;
    }
#pragma omp parallel for collapse(2) schedule(static) if (fork) /* decode: one row group */
    for (int g = 0; g < mg; g++)
        for (int b = 0; b < kb; b++)
            amx_split_rows(x, M, K, 16 * g, 32 * b, xs + ((size_t)g * kb + b) * 3 * AMX_TILE);
    /* the work: (chunk, block of rows) pairs. Where every W's tiles are
     * laid out (the model's) and they have fewer chunks than twice the
     * threads, the rows are cut into blocks of row-group pairs too, so that
     * a narrow projection of many rows (the router, DeltaNet's b and a)
     * keeps every thread busy: an output comes from its row and column
     * alone, so no bits change. A chunk left to the BLAS is one item, all
     * of its rows (the BLAS's sums may follow the row count). */
    const int pairs = (mg + 1) / 2;
    int blocks = 1;
    if (fork && laid && chunks < 2 * threads) {
        blocks = (2 * threads + chunks - 1) / chunks;
        blocks = blocks < pairs ? blocks : pairs;
    }
#pragma omp parallel for schedule(static) if (fork)
    for (int it = 0; it < chunks * blocks; it++) {
        const int cg = it % chunks, blk = it / chunks;
        int j = 0;
        while (cg >= first[j + 1]) j++;
        const kvd_linear_job *job = &jobs[j];
        const int c = cg - first[j], N = job->N;
        const int n0 = c * KVD_LINEAR_CHUNK, n1 = chunk_end(c, N);
        const uint16_t *tiles = NULL;
        if (job->t) {
            tiles = job->t->bad[c] ? NULL : job->t->data + job->t->chunk_n * (size_t)c;
        } else {
            int th = 0;
#ifdef _OPENMP
            th = omp_get_thread_num();
#endif
            uint16_t *mine = wt + wt_n * (size_t)th;
            tiles = amx_weights(job->w, K, n0, n1, kb, mine) == 0 ? mine : NULL;
        }
        if (tiles) {
            const int m0 = 32 * (pairs * blk / blocks), m1 = 32 * (pairs * (blk + 1) / blocks);
            amx_gemm_cols(xs + (size_t)(m0 / 16) * kb * 3 * AMX_TILE, tiles,
                          job->y + (size_t)m0 * N, (m1 < M ? m1 : M) - m0, N, kb, n0, n1);
        } else if (blk == 0) {
            linear_cols(x, job->w, job->y, M, N, K, n0, n1);
        }
    }
    free(xs);
    free(wt);
    return 0;
}
#endif

kvd_wtiles *kvd_wtiles_new(const float *w, int N, int K) {
    pthread_once(&rows_once, rows_default);
    if (!rows_now->amx || N <= 0 || K <= 0) return NULL;
#ifdef KVD_AMX_X86
    kvd_wtiles *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    const int kb = (K + 31) / 32;
    t->N = N, t->K = K, t->chunks = chunks_of(N);
    t->chunk_n = (size_t)(KVD_LINEAR_CHUNK / 16) * kb * AMX_TILE;
    t->data = aligned_alloc(64, t->chunk_n * (size_t)t->chunks * sizeof *t->data);
    t->bad = calloc((size_t)t->chunks, 1);
    if (!t->data || !t->bad) {
        kvd_wtiles_free(t);
        return NULL;
    }
    int good = 0;
#ifdef _OPENMP
    const int fork = !omp_in_parallel() && omp_get_max_threads() > 1 && t->chunks > 1;
#else
    const int fork = 0;
#endif
#pragma omp parallel for schedule(static) if (fork) reduction(+ : good)
    for (int c = 0; c < t->chunks; c++) {
        const int n0 = c * KVD_LINEAR_CHUNK, n1 = chunk_end(c, N);
        t->bad[c] = amx_weights(w, K, n0, n1, kb, t->data + t->chunk_n * (size_t)c) != 0;
        good += !t->bad[c];
    }
    if (!good) free(t->data), t->data = NULL;
    return t;
#else
    (void)w;
    return NULL;
#endif
}

void kvd_wtiles_free(kvd_wtiles *t) {
    if (!t) return;
    free(t->data);
    free(t->bad);
    free(t);
}

size_t kvd_wtiles_bytes(const kvd_wtiles *t) {
    return t && t->data ? t->chunk_n * (size_t)t->chunks * sizeof *t->data : 0;
}

/* Whether a GEMM of `chunks` 256-column chunks and M rows forks: below
 * ~0.2 MFLOP (a 256 KiB matrix-vector product) a fork costs more than it
 * saves; one chunk forks only where laid-out tiles let linear_amx cut its
 * rows; never inside a parallel region (an expert's GEMMs). */
static int forks(int chunks, int laid, int M, double flops) {
    int fork = (chunks > 1 || (laid && M > 32)) && flops >= 2e5;
#ifdef _OPENMP
    fork = fork && !omp_in_parallel() && omp_get_max_threads() > 1;
#endif
    return fork;
}

void kvd_linear_tiled(const float *x, const float *w, const kvd_wtiles *t, float *y, int M, int N,
                      int K) {
    if (M <= 0 || N <= 0) return;
    pthread_once(&blas_once, blas_single);
    pthread_once(&rows_once, rows_default);
    const int chunks = chunks_of(N);
#ifdef KVD_AMX_X86
    if (t && (t->N != N || t->K != K)) t = NULL;
#endif
    const int fork = forks(chunks, t != NULL, M, (double)M * N * K);
#ifdef KVD_AMX_X86
    const kvd_linear_job job = {w, t, y, N};
    if ((M > KVD_FEW_ROWS || t) && rows_now->amx && linear_amx(x, &job, 1, M, K, fork) == 0) return;
#else
    (void)t;
#endif
#pragma omp parallel for schedule(static) if (fork)
    for (int c = 0; c < chunks; c++) {
        const int n0 = c * KVD_LINEAR_CHUNK, n1 = chunk_end(c, N);
        linear_cols(x, w, y, M, N, K, n0, n1);
    }
}

void kvd_linear_many(const float *x, const kvd_linear_job *jobs, int n_jobs, int M, int K) {
    if (M <= 0 || n_jobs <= 0) return;
    pthread_once(&blas_once, blas_single);
    pthread_once(&rows_once, rows_default);
#ifdef KVD_AMX_X86
    /* every W's tiles laid out for it: one split of x, one fork */
    int shared = n_jobs > 1 && rows_now->amx, chunks = 0;
    double flops = 0;
    for (int j = 0; j < n_jobs && shared; j++) {
        const kvd_wtiles *t = jobs[j].t;
        shared = jobs[j].N > 0 && t && t->N == jobs[j].N && t->K == K;
        chunks += chunks_of(jobs[j].N);
        flops += (double)M * jobs[j].N * K;
    }
    if (shared && linear_amx(x, jobs, n_jobs, M, K, forks(chunks, 1, M, flops)) == 0) return;
#endif
    for (int j = 0; j < n_jobs; j++)
        kvd_linear_tiled(x, jobs[j].w, jobs[j].t, jobs[j].y, M, jobs[j].N, K);
}

void kvd_linear(const float *x, const float *w, float *y, int M, int N, int K) {
    kvd_linear_tiled(x, w, NULL, y, M, N, K);
}

void kvd_rmsnorm(float *out, const float *x, const float *w, int n, float eps, int one_plus) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    if (one_plus) {
        for (int i = 0; i < n; i++) out[i] = x[i] * r * (1.0f + w[i]);
    } else {
        for (int i = 0; i < n; i++) out[i] = x[i] * r * w[i];
    }
}

void kvd_rope(float *v, int pos, int rot_dim, const float *inv_freq) {
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        /* angle in double: at 256K positions a float angle loses ~5 bits */
        double a = (double)pos * inv_freq[i];
        float c = (float)cos(a), s = (float)sin(a);
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
    }
}

void kvd_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

void kvd_topk(const float *x, int n, int k, int *idx) {
    /* k is small (<= 16 in every preset): insertion into a sorted prefix */
    int have = 0;
    for (int i = 0; i < n; i++) {
        if (have == k && !(x[i] > x[idx[k - 1]])) continue;
        int j = have < k ? have++ : k - 1;
        while (j > 0 && x[i] > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = i;
    }
}

void kvd_route(float *logits, int E, int K, int norm, int *topi, float *topw) {
    kvd_softmax(logits, E);
    kvd_topk(logits, E, K, topi);
    double sum = 0.0;
    for (int j = 0; j < K; j++) sum += logits[topi[j]];
    for (int j = 0; j < K; j++) topw[j] = norm ? (float)(logits[topi[j]] / sum) : logits[topi[j]];
}

int kvd_argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

void kvd_swiglu(float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = kvd_siluf(g[i]) * u[i];
}
