/* kvdrift: dense building blocks on the CPU: GEMM through OpenBLAS, norms,
 * RoPE, softmax, top-k. */
#include "../kernels.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
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

static char blas_name[96];
static pthread_once_t blas_name_once = PTHREAD_ONCE_INIT;
static void blas_describe(void) {
    const char *cfg = openblas_get_config();
    int words = 0, n = 0;
    while (cfg[n] && !(cfg[n] == ' ' && ++words == 2)) n++;
    snprintf(blas_name, sizeof blas_name, "%.*s %s", n, cfg, openblas_get_corename());
}

/* "OpenBLAS 0.3.21 SkylakeX": the library and its version (its
 * configuration's first two words), then the core type it dispatched to */
const char *kvd_cpu_blas(void) {
    pthread_once(&blas_name_once, blas_describe);
    return blas_name;
}

static void linear_cols(const float *x, const float *w, float *y, int M, int N, int K, int n0,
                        int n1) {
    if (n1 <= n0) return;
    if (M == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, n1 - n0, K, 1.0f, w + (size_t)n0 * K, K, x, 1,
                    0.0f, y + n0, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n1 - n0, K, 1.0f, x, K,
                    w + (size_t)n0 * K, K, 0.0f, y + n0, N);
    }
}

void kvd_linear(const float *x, const float *w, float *y, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    pthread_once(&blas_once, blas_single);
    int chunks = (N + KVD_LINEAR_CHUNK - 1) / KVD_LINEAR_CHUNK;
    /* below ~0.2 MFLOP (a 256 KiB matrix-vector product) a fork costs more
     * than it saves */
    int fork = chunks > 1 && (double)M * N * K >= 2e5;
#ifdef _OPENMP
    fork = fork && !omp_in_parallel() && omp_get_max_threads() > 1;
#endif
#pragma omp parallel for schedule(static) if (fork)
    for (int c = 0; c < chunks; c++) {
        int n0 = c * KVD_LINEAR_CHUNK, n1 = n0 + KVD_LINEAR_CHUNK < N ? n0 + KVD_LINEAR_CHUNK : N;
        linear_cols(x, w, y, M, N, K, n0, n1);
    }
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
