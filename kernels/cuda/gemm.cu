// kvdrift: BF16 GEMMs on the device through cuBLASLt, FP32 accumulation and
// output: y[M,N] = x[M,K] * W[N,K]^T, a Hugging Face Linear. cuBLAS is
// column-major, so this asks for y^T = W * x^T: A = W (stored K x N, used
// transposed), B = x^T (K x M), C = y^T (N x M). The heuristic's first
// choice is cached per shape, with one workspace.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_kernels.h"

namespace {
struct cached {
    int M, N, K;
    cublasLtMatmulAlgo_t algo;
};
cublasLtHandle_t handle = nullptr;
void *workspace = nullptr;
const size_t workspace_bytes = 32u << 20;
cached cache[64];
int n_cached = 0;
} // namespace

static int lt_init() {
    if (handle) return 0;
    if (cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) return -1;
    if (cudaMalloc(&workspace, workspace_bytes) != cudaSuccess) return -1;
    return 0;
}

extern "C" int kvd_cuda_linear_bf16_dev(const void *x, const void *w, float *y, int M, int N,
                                        int K) {
    if (lt_init()) return -1;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int rc = -1;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS)
        goto out;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, N) != CUBLAS_STATUS_SUCCESS)
        goto out;
    {
        cublasLtMatmulAlgo_t *algo = nullptr;
        for (int i = 0; i < n_cached; i++)
            if (cache[i].M == M && cache[i].N == N && cache[i].K == K) algo = &cache[i].algo;
        cublasLtMatmulHeuristicResult_t heur;
        if (!algo) {
            cublasLtMatmulPreference_t pref;
            cublasLtMatmulPreferenceCreate(&pref);
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes, sizeof workspace_bytes);
            int found = 0;
            cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 1, &heur, &found);
            cublasLtMatmulPreferenceDestroy(pref);
            if (found < 1) goto out;
            if (n_cached < 64) {
                cache[n_cached] = {M, N, K, heur.algo};
                algo = &cache[n_cached++].algo;
            } else {
                algo = &heur.algo;
            }
        }
        const float alpha = 1.0f, beta = 0.0f;
        if (cublasLtMatmul(handle, op, &alpha, w, a, x, b, &beta, y, c, y, c, algo, workspace,
                           workspace_bytes, 0) == CUBLAS_STATUS_SUCCESS)
            rc = 0;
    }
out:
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

extern "C" int kvd_cuda_linear_bf16(const uint16_t *x, const uint16_t *w, float *y, int M, int N,
                                    int K) {
    void *dx = nullptr, *dw = nullptr;
    float *dy = nullptr;
    int rc = -1;
    if (cudaMalloc(&dx, (size_t)M * K * 2) || cudaMalloc(&dw, (size_t)N * K * 2) ||
        cudaMalloc(&dy, (size_t)M * N * 4))
        goto out;
    cudaMemcpy(dx, x, (size_t)M * K * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w, (size_t)N * K * 2, cudaMemcpyHostToDevice);
    if (kvd_cuda_linear_bf16_dev(dx, dw, dy, M, N, K) == 0 &&
        cudaMemcpy(y, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
out:
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
    return rc;
}

/* Device-to-device copy bandwidth, bytes read + written per second (the
 * same convention as the CPU bench), best of reps. */
extern "C" double kvd_cuda_copy_bandwidth(size_t bytes, int reps) {
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes)) {
        cudaFree(a), cudaFree(b);
        return 0;
    }
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double best = 0;
    for (int r = 0; r <= reps; r++) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        double bw = 2.0 * (double)bytes / (ms * 1e-3);
        if (r && bw > best) best = bw; /* the first is a warm-up */
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return best;
}

/* Every algorithm cuBLASLt's heuristic offers for a shape (up to 32), each
 * timed (best of reps): GFLOP/s of its first choice, the one
 * kvd_cuda_linear_bf16_dev runs, and of the fastest. 0 on success. */
extern "C" int kvd_cuda_bench_gemm_algos(int M, int N, int K, int reps, double *first, double *best,
                                         int *n_algos) {
    *first = *best = 0;
    *n_algos = 0;
    if (lt_init()) return -1;
    void *x = nullptr, *w = nullptr;
    float *y = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t heur[32];
    int found = 0, rc = -1;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (cudaMalloc(&x, (size_t)M * K * 2) || cudaMalloc(&w, (size_t)N * K * 2) ||
        cudaMalloc(&y, (size_t)M * N * 4))
        goto out;
    cudaMemset(x, 0x3c, (size_t)M * K * 2);
    cudaMemset(w, 0x3c, (size_t)N * K * 2);
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, N) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS)
        goto out;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof workspace_bytes);
    if (cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, c, c, pref, 32, heur, &found) !=
            CUBLAS_STATUS_SUCCESS ||
        found < 1)
        goto out;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int i = 0; i < found; i++) {
        double g_best = 0;
        const float alpha = 1.0f, beta = 0.0f;
        for (int r = 0; r <= reps; r++) {
            cudaEventRecord(e0);
            cublasStatus_t st = cublasLtMatmul(handle, op, &alpha, w, a, x, b, &beta, y, c, y, c,
                                               &heur[i].algo, workspace, workspace_bytes, 0);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            double g = 2.0 * M * N * (double)K / (ms * 1e-3) / 1e9;
            if (st != CUBLAS_STATUS_SUCCESS) break;
            if (r && g > g_best) g_best = g; /* the first is a warm-up */
        }
        if (i == 0) *first = g_best;
        if (g_best > *best) *best = g_best;
    }
    *n_algos = found;
    rc = cudaGetLastError() == cudaSuccess ? 0 : -1;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
    cudaFree(x), cudaFree(w), cudaFree(y);
    return rc;
}
