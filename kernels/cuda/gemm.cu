// kvdrift: BF16 GEMMs on the device through cuBLASLt, FP32 accumulation and
// output: y[M,N] = x[M,K] * W[N,K]^T, a Hugging Face Linear. cuBLAS is
// column-major, so this asks for y^T = W * x^T: A = W (stored K x N, used
// transposed), B = x^T (K x M), C = y^T (N x M). Per shape the
// descriptors and the heuristic's first choice are made once and kept (a
// plan), with one workspace per device.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_kernels.h"

namespace {
// one shape's descriptors and the heuristic's first algorithm, made once
struct plan {
    int M, N, K; // M 0: an empty slot
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};
// a hash table of plans: a shape probes PROBE slots from its hash; when all
// are taken the first is remade (MoE experts' row counts make many shapes)
constexpr int PLANS = 256, PROBE = 8;
// cuBLASLt's handle, workspace and plans, and the split product's buffers:
// one set per device (tensor-parallel ranks each have a device of their own)
struct lt_state {
    cublasLtHandle_t handle;
    void *workspace;
    plan plans[PLANS];
    unsigned short *xs; // [3][rows][K] BF16: hi, mid, lo
    size_t xs_cap;
    float *ys; // [3][rows][N] when the three products are stacked
    size_t ys_cap;
};
lt_state states[16];
const size_t workspace_bytes = 32u << 20;
const size_t stacked_max_floats = (size_t)64 << 20; // 256 MB of stacked outputs at most

} // namespace

// the current device's state, its handle and workspace made on first use;
// null where they cannot be
static lt_state *lt() {
    int dev = 0;
    cudaGetDevice(&dev);
    lt_state *st = &states[dev & 15];
    if (st->handle) return st;
    if (cublasLtCreate(&st->handle) != CUBLAS_STATUS_SUCCESS) return nullptr;
    if (cudaMalloc(&st->workspace, workspace_bytes) != cudaSuccess) {
        cublasLtDestroy(st->handle);
        st->handle = nullptr;
        return nullptr;
    }
    return st;
}

// the descriptors of y^T = W x^T for one shape (W stored K x N, used
// transposed; x^T K x M; y^T N x M, FP32); 0 on success, else nothing made
static int describe(int M, int N, int K, cublasLtMatmulDesc_t *op, cublasLtMatrixLayout_t *a,
                    cublasLtMatrixLayout_t *b, cublasLtMatrixLayout_t *c) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    *op = nullptr, *a = *b = *c = nullptr;
    if (cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, K, N, K) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, K, M, K) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(c, CUDA_R_32F, N, M, N) == CUBLAS_STATUS_SUCCESS)
        return 0;
    if (*a) cublasLtMatrixLayoutDestroy(*a);
    if (*b) cublasLtMatrixLayoutDestroy(*b);
    if (*c) cublasLtMatrixLayoutDestroy(*c);
    if (*op) cublasLtMatmulDescDestroy(*op);
    *op = nullptr, *a = *b = *c = nullptr;
    return -1;
}

static void drop(plan *p) {
    if (!p->M) return;
    cublasLtMatrixLayoutDestroy(p->a), cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->c), cublasLtMatmulDescDestroy(p->op);
    p->M = 0;
}

// the shape's plan: found, or made (descriptors and the heuristic's first
// choice) in a free slot or over the first of its probe; null where
// cuBLASLt has nothing for it
static const plan *plan_for(lt_state *st, int M, int N, int K) {
    const unsigned h = ((unsigned)M * 2654435761u ^ (unsigned)N * 40503u ^ (unsigned)K) % PLANS;
    plan *slot = nullptr;
    for (int i = 0; i < PROBE; i++) {
        plan *p = &st->plans[(h + i) % PLANS];
        if (p->M == M && p->N == N && p->K == K) return p;
        if (!p->M && !slot) slot = p;
    }
    if (!slot) slot = &st->plans[h];
    drop(slot);
    plan np{M, N, K, nullptr, nullptr, nullptr, nullptr, {}};
    if (describe(M, N, K, &np.op, &np.a, &np.b, &np.c)) return nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes, sizeof workspace_bytes);
        if (cublasLtMatmulAlgoGetHeuristic(st->handle, np.op, np.a, np.b, np.c, np.c, pref, 1,
                                           &heur, &found) != CUBLAS_STATUS_SUCCESS)
            found = 0;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    if (found < 1) {
        drop(&np);
        return nullptr;
    }
    np.algo = heur.algo;
    *slot = np;
    return slot;
}

// y[M,N] = x[M,K] W[N,K]^T + beta y, BF16 x and W, FP32 y, by the shape's plan
static int lt_matmul(lt_state *st, const void *x, const void *w, float *y, int M, int N, int K,
                     float beta) {
    const plan *p = plan_for(st, M, N, K);
    const float alpha = 1.0f;
    return p && cublasLtMatmul(st->handle, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                               &p->algo, st->workspace, workspace_bytes, 0) == CUBLAS_STATUS_SUCCESS
               ? 0
               : -1;
}

extern "C" int kvd_cuda_linear_bf16_dev(const void *x, const void *w, float *y, int M, int N,
                                        int K) {
    lt_state *st = lt();
    return st ? lt_matmul(st, x, w, y, M, N, K, 0.0f) : -1;
}

// ---- FP32 activations on BF16 tensor cores, exactly ----
// x = hi + mid + lo, each a BF16 (8 significant bits apiece cover FP32's
// 24; each remainder is exact in FP32), so x W^T is three BF16 products
// whose FP32 sums carry the error of one FP32 product.
__global__ void split3_k(const float *x, unsigned short *xs, size_t n, size_t plane) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    const float r = v - __bfloat162float(h);
    const __nv_bfloat16 m = __float2bfloat16_rn(r);
    const __nv_bfloat16 l = __float2bfloat16_rn(r - __bfloat162float(m));
    xs[i] = *reinterpret_cast<const unsigned short *>(&h);
    xs[plane + i] = *reinterpret_cast<const unsigned short *>(&m);
    xs[2 * plane + i] = *reinterpret_cast<const unsigned short *>(&l);
}
// y = hi + (mid + lo), the three stacked products
__global__ void sum3_k(const float *ys, float *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = ys[i] + (ys[n + i] + ys[2 * n + i]);
}

static bool grow(void **p, size_t *cap, size_t want) {
    if (*cap >= want) return true;
    cudaFree(*p);
    *p = nullptr, *cap = 0;
    if (cudaMalloc(p, want) != cudaSuccess) {
        *p = nullptr;
        return false;
    }
    *cap = want;
    return true;
}

extern "C" int kvd_cuda_linear_split_dev(const float *x, const void *w, float *y, int M, int N,
                                         int K, int mode) {
    lt_state *st = M > 0 && N > 0 && K > 0 ? lt() : nullptr;
    if (!st) return -1;
    const size_t nx = (size_t)M * K, ny = (size_t)M * N;
    const bool stack = mode != 2 && (mode == 1 || 3 * ny <= stacked_max_floats);
    // the parts one after another (stacked: one matrix of 3M rows); apart,
    // each starts 16-byte aligned, as cuBLASLt's fast algorithms want
    const size_t plane = stack ? nx : (nx + 7) / 8 * 8;
    if (!grow(reinterpret_cast<void **>(&st->xs), &st->xs_cap, 3 * plane * 2)) return -1;
    split3_k<<<(unsigned)((nx + 255) / 256), 256>>>(x, st->xs, nx, plane);
    // decode: one product of 3M rows, so the weights are read once; else
    // three accumulated into y (the stacked outputs would be too large)
    if (stack && grow(reinterpret_cast<void **>(&st->ys), &st->ys_cap, 3 * ny * 4)) {
        if (lt_matmul(st, st->xs, w, st->ys, 3 * M, N, K, 0.0f)) return -1;
        sum3_k<<<(unsigned)((ny + 255) / 256), 256>>>(st->ys, y, ny);
        return cudaGetLastError() == cudaSuccess ? 0 : -1;
    }
    if (stack) return -1; // no room for the stacked outputs
    if (lt_matmul(st, st->xs, w, y, M, N, K, 0.0f) ||
        lt_matmul(st, st->xs + plane, w, y, M, N, K, 1.0f) ||
        lt_matmul(st, st->xs + 2 * plane, w, y, M, N, K, 1.0f))
        return -1;
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
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
    const lt_state *st = lt();
    if (!st) return -1;
    const cublasLtHandle_t handle = st->handle;
    void *const workspace = st->workspace;
    void *x = nullptr, *w = nullptr;
    float *y = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t heur[32];
    int found = 0, rc = -1;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (cudaMalloc(&x, (size_t)M * K * 2) || cudaMalloc(&w, (size_t)N * K * 2) ||
        cudaMalloc(&y, (size_t)M * N * 4))
        goto out;
    cudaMemset(x, 0x3c, (size_t)M * K * 2);
    cudaMemset(w, 0x3c, (size_t)N * K * 2);
    if (describe(M, N, K, &op, &a, &b, &c) ||
        cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS)
        goto out;
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
