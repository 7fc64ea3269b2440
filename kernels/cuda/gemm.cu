// kvdrift: BF16 GEMMs on the device through cuBLASLt, FP32 accumulation and
// output: y[M,N] = x[M,K] * W[N,K]^T, a Hugging Face Linear. cuBLAS is
// column-major, so this asks for y^T = W * x^T: A = W (stored K x N, used
// transposed), B = x^T (K x M), C = y^T (N x M). Per shape the
// descriptors and the heuristic's first choice are made once and kept (a
// plan), with one workspace per device. With KVD_CUDA_GEMM=tune a shape
// runs instead the fastest of the heuristic's first few algorithms, timed
// once per shape and device on the first call's own operands.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_kernels.h"

namespace {
// one shape's descriptors and the heuristic's first algorithm, made once;
// the tuned algorithm (an entry of the device's table) once it is known
struct plan {
    int M, N, K; // M 0: an empty slot
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t first;
    const cublasLtMatmulAlgo_t *tuned;
};
// a shape's tuned algorithm; entries are never removed, so a shape keeps
// its algorithm for the process even when its plan is remade, and two
// models in one process compute alike
struct tuned_algo {
    int M, N, K; // M 0: an empty slot
    cublasLtMatmulAlgo_t algo;
};
// the candidates tuning times (the heuristic's first), and how: a warm-up,
// then the best of ROUNDS batches of RUNS back to back
constexpr int TUNE_CANDIDATES = 8, TUNE_ROUNDS = 2, TUNE_RUNS = 4;
// the tuned table's slots; past 3/4 full a new shape keeps the first choice
constexpr int TUNED = 4096;
// a hash table of plans: a shape probes PROBE slots from its hash; when all
// are taken the first is remade (MoE experts' row counts make many shapes)
constexpr int PLANS = 256, PROBE = 8;
// cuBLASLt's handle, workspace and plans, and the split product's buffers:
// one set per device (tensor-parallel ranks each have a device of their own)
struct lt_state {
    cublasLtHandle_t handle;
    void *workspace;
    plan plans[PLANS];
    tuned_algo *tuned; // [TUNED], made at the first tuning
    int n_tuned;
    unsigned short *xs; // [3][rows][K] BF16: hi, mid, lo
    size_t xs_cap;
    float *ys; // [3][rows][N] when the three products are stacked
    size_t ys_cap;
};
lt_state states[16];
const size_t workspace_bytes = 32u << 20;
const size_t stacked_max_floats = (size_t)64 << 20; // 256 MB of stacked outputs at most
int tune_setting = -1; // kvd_cuda_gemm_set_tune's; -1: the environment's

} // namespace

// a shape's hash, for the plans' and the tuned algorithms' tables
static unsigned shape_hash(int M, int N, int K) {
    return (unsigned)M * 2654435761u ^ (unsigned)N * 40503u ^ (unsigned)K;
}

static bool tuning() {
    static const bool env = [] {
        const char *e = getenv("KVD_CUDA_GEMM");
        return e && !strcmp(e, "tune");
    }();
    return tune_setting >= 0 ? tune_setting != 0 : env;
}

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

// the shape's slot in the device's tuned table (*known: it holds the
// shape's algorithm; else an empty slot for it), the table made on first
// use; null where it is 3/4 full (or cannot be made) and lacks the shape
static tuned_algo *tuned_find(lt_state *st, int M, int N, int K, bool *known) {
    *known = false;
    if (!st->tuned) st->tuned = static_cast<tuned_algo *>(calloc(TUNED, sizeof(tuned_algo)));
    if (!st->tuned) return nullptr;
    unsigned i = shape_hash(M, N, K) % TUNED;
    for (;; i = (i + 1) % TUNED) {
        tuned_algo *t = &st->tuned[i];
        if (t->M == M && t->N == N && t->K == K) {
            *known = true;
            return t;
        }
        if (!t->M) return st->n_tuned < TUNED / 4 * 3 ? t : nullptr;
    }
}

// the heuristic's first `want` algorithms for the plan's shape (with the
// device's workspace); how many it gave
static int candidates(lt_state *st, const plan *p, cublasLtMatmulHeuristicResult_t *heur,
                      int want) {
    cublasLtMatmulPreference_t pref = nullptr;
    int found = 0;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return 0;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof workspace_bytes);
    if (cublasLtMatmulAlgoGetHeuristic(st->handle, p->op, p->a, p->b, p->c, p->c, pref, want, heur,
                                       &found) != CUBLAS_STATUS_SUCCESS)
        found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    return found;
}

// the shape's plan: found, or made (descriptors, the heuristic's first
// choice, a tuned algorithm the device's table holds) in a free slot or
// over the first of its probe; null where cuBLASLt has nothing for it
static plan *plan_for(lt_state *st, int M, int N, int K) {
    const unsigned h = shape_hash(M, N, K) % PLANS;
    plan *slot = nullptr;
    for (int i = 0; i < PROBE; i++) {
        plan *p = &st->plans[(h + i) % PLANS];
        if (p->M == M && p->N == N && p->K == K) return p;
        if (!p->M && !slot) slot = p;
    }
    if (!slot) slot = &st->plans[h];
    drop(slot);
    plan np{M, N, K, nullptr, nullptr, nullptr, nullptr, {}, nullptr};
    if (describe(M, N, K, &np.op, &np.a, &np.b, &np.c)) return nullptr;
    cublasLtMatmulHeuristicResult_t heur;
    if (candidates(st, &np, &heur, 1) < 1) {
        drop(&np);
        return nullptr;
    }
    np.first = heur.algo;
    bool known = false;
    tuned_algo *t = st->tuned ? tuned_find(st, M, N, K, &known) : nullptr;
    if (known) np.tuned = &t->algo;
    *slot = np;
    return slot;
}

// y = x W^T by the plan's descriptors and `algo`, beta 0, `runs` times back
// to back; true when cuBLASLt ran them all
static bool run_algo(lt_state *st, const plan *p, const cublasLtMatmulAlgo_t *algo, const void *x,
                     const void *w, float *y, int runs) {
    const float alpha = 1.0f, beta = 0.0f;
    for (int i = 0; i < runs; i++)
        if (cublasLtMatmul(st->handle, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                           algo, st->workspace, workspace_bytes, 0) != CUBLAS_STATUS_SUCCESS)
            return false;
    return true;
}

// milliseconds for `runs` products back to back by `algo`, the best of
// `rounds` batches after a warm-up; -1 where cuBLASLt refuses the algorithm
static float time_algo(lt_state *st, const plan *p, const cublasLtMatmulAlgo_t *algo, const void *x,
                       const void *w, float *y, int rounds, int runs, cudaEvent_t e0,
                       cudaEvent_t e1) {
    if (!run_algo(st, p, algo, x, w, y, 1)) return -1;
    float best = -1;
    for (int r = 0; r < rounds; r++) {
        cudaEventRecord(e0);
        const bool ran = run_algo(st, p, algo, x, w, y, runs);
        cudaEventRecord(e1);
        float ms = 0;
        if (!ran || cudaEventSynchronize(e1) != cudaSuccess ||
            cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess)
            return -1;
        if (best < 0 || ms < best) best = ms;
    }
    return best;
}

// The plan's tuned algorithm: the device table's, or found now by timing
// the heuristic's first TUNE_CANDIDATES on the call's operands into y
// (which the call is about to overwrite) and kept there. The first choice
// where the table is full or the timing cannot run.
static const cublasLtMatmulAlgo_t *tune(lt_state *st, plan *p, const void *x, const void *w,
                                        float *y) {
    bool known = false;
    tuned_algo *t = tuned_find(st, p->M, p->N, p->K, &known);
    if (known) return &t->algo;
    if (!t) return &p->first;
    cublasLtMatmulHeuristicResult_t heur[TUNE_CANDIDATES];
    const int found = candidates(st, p, heur, TUNE_CANDIDATES);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    if (found < 1 || cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
        if (e0) cudaEventDestroy(e0);
        return &p->first;
    }
    float ms[TUNE_CANDIDATES];
    for (int i = 0; i < found; i++)
        ms[i] = heur[i].state == CUBLAS_STATUS_SUCCESS
                    ? time_algo(st, p, &heur[i].algo, x, w, y, TUNE_ROUNDS, TUNE_RUNS, e0, e1)
                    : -1;
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    const int k = kvd_cuda_gemm_pick(ms, found);
    if (k < 0) return &p->first;
    *t = tuned_algo{p->M, p->N, p->K, heur[k].algo};
    st->n_tuned++;
    return &t->algo;
}

// y[M,N] = x[M,K] W[N,K]^T + beta y, BF16 x and W, FP32 y, by the shape's
// plan: its first choice, or its tuned algorithm when tuning (found at a
// call with beta 0, whose y may be written while timing)
static int lt_matmul(lt_state *st, const void *x, const void *w, float *y, int M, int N, int K,
                     float beta) {
    plan *p = plan_for(st, M, N, K);
    if (!p) return -1;
    const cublasLtMatmulAlgo_t *algo = &p->first;
    if (tuning()) {
        if (!p->tuned && beta == 0.0f) p->tuned = tune(st, p, x, w, y);
        if (p->tuned) algo = p->tuned;
    }
    const float alpha = 1.0f;
    return cublasLtMatmul(st->handle, p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c,
                          algo, st->workspace, workspace_bytes, 0) == CUBLAS_STATUS_SUCCESS
               ? 0
               : -1;
}

extern "C" int kvd_cuda_gemm_pick(const float *ms, int n) {
    int k = -1;
    for (int i = 0; i < n; i++)
        if (ms[i] > 0 && (k < 0 || ms[i] < 0.95f * ms[k])) k = i;
    return k;
}

extern "C" void kvd_cuda_gemm_set_tune(int on) {
    tune_setting = on < 0 ? -1 : on != 0;
}

extern "C" int kvd_cuda_gemm_tuning(void) {
    return tuning() ? 1 : 0;
}

extern "C" int kvd_cuda_gemm_tuned(void) {
    int dev = 0;
    cudaGetDevice(&dev);
    return states[dev & 15].n_tuned;
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
 * timed (best of reps): GFLOP/s of its first choice (what the back end
 * runs), of the one tuning picks (KVD_CUDA_GEMM=tune, tuned here on these
 * operands as the back end would) and of the fastest. 0 on success. */
extern "C" int kvd_cuda_bench_gemm_algos(int M, int N, int K, int reps, double *first, double *best,
                                         double *tuned, int *n_algos) {
    *first = *best = *tuned = 0;
    *n_algos = 0;
    lt_state *st = M > 0 && N > 0 && K > 0 ? lt() : nullptr;
    plan *p = st ? plan_for(st, M, N, K) : nullptr;
    if (!p) return -1;
    void *x = nullptr, *w = nullptr;
    float *y = nullptr;
    cublasLtMatmulHeuristicResult_t heur[32];
    int found = 0, rc = -1;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    const double flop = 2.0 * M * N * (double)K;
    const cublasLtMatmulAlgo_t *pick = nullptr;
    if (cudaMalloc(&x, (size_t)M * K * 2) || cudaMalloc(&w, (size_t)N * K * 2) ||
        cudaMalloc(&y, (size_t)M * N * 4) || cudaEventCreate(&e0) != cudaSuccess ||
        cudaEventCreate(&e1) != cudaSuccess)
        goto out;
    cudaMemset(x, 0x3c, (size_t)M * K * 2);
    cudaMemset(w, 0x3c, (size_t)N * K * 2);
    if ((found = candidates(st, p, heur, 32)) < 1) goto out;
    pick = tune(st, p, x, w, y);
    for (int i = 0; i < found; i++) {
        const float ms = time_algo(st, p, &heur[i].algo, x, w, y, reps, 1, e0, e1);
        const double g = ms > 0 ? flop / (ms * 1e-3) / 1e9 : 0;
        if (i == 0) *first = g;
        if (!memcmp(pick, &heur[i].algo, sizeof *pick)) *tuned = g;
        if (g > *best) *best = g;
    }
    if (*tuned == 0) { // not among the 32 (the heuristic's order moved): timed alone
        const float ms = time_algo(st, p, pick, x, w, y, reps, 1, e0, e1);
        *tuned = ms > 0 ? flop / (ms * 1e-3) / 1e9 : 0;
    }
    *n_algos = found;
    rc = cudaGetLastError() == cudaSuccess ? 0 : -1;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(x), cudaFree(w), cudaFree(y);
    return rc;
}
