// kvdrift: the drift figures' comparisons on the device, where both runs'
// values already are (the CPU twins: kernels/cpu/compare.c). Each block
// takes one row (or head): its threads sum in double over a strided share
// of the values, and a tree in shared memory combines them, so only the
// figures go back to the host.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda_kernels.h"

#define CMP_THREADS 256

// the sum of every thread's v, in thread 0 (and the tree's order)
__device__ inline double block_sum(double v, double *sh) {
    const int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int w = CMP_THREADS / 2; w > 0; w /= 2) {
        if (t < w) sh[t] += sh[t + w];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

// ---- attention: two distributions of a query, head by head (the sampled
// rows). One block a (head, row): each thread sums p (log p - log q) over
// its positions and keeps the first largest p and q it saw; the tree
// combines the sums, and the maxima by value, then by the earlier position.
// Row k's distributions start at k * n_heads * stride, its context is
// n_ctx_rows[k] (or n_ctx for all), its figures at k * out_stride.

__device__ inline void take_top(float &v, int &i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) v = v2, i = i2;
}

__global__ void attn_kernel(const float *p, const float *q, int n_heads, const int *n_ctx_rows,
                            int n_ctx, size_t stride, double *kl, int *top_p, int *top_q,
                            size_t out_stride) {
    const int row = blockIdx.y;
    const size_t off = ((size_t)row * n_heads + blockIdx.x) * stride;
    const size_t o = (size_t)row * out_stride + blockIdx.x;
    if (n_ctx_rows) n_ctx = n_ctx_rows[row];
    const float *ph = p + off, *qh = q + off;
    __shared__ double sum[CMP_THREADS];
    __shared__ float pv[CMP_THREADS];
    __shared__ float qv[CMP_THREADS];
    __shared__ int pi[CMP_THREADS];
    __shared__ int qi[CMP_THREADS];
    const int t0 = threadIdx.x;
    double s = 0.0;
    float bp = -INFINITY, bq = -INFINITY;
    int ip = n_ctx, iq = n_ctx;
    for (int t = t0; t < n_ctx; t += CMP_THREADS) {
        float a = ph[t], b = qh[t];
        if (a > 0.0f) s += (double)a * (log((double)a) - log(fmax((double)b, 1e-300)));
        take_top(bp, ip, a, t);
        take_top(bq, iq, b, t);
    }
    sum[t0] = s, pv[t0] = bp, qv[t0] = bq, pi[t0] = ip, qi[t0] = iq;
    __syncthreads();
    for (int w = CMP_THREADS / 2; w > 0; w /= 2) {
        if (t0 < w) {
            sum[t0] += sum[t0 + w];
            take_top(pv[t0], pi[t0], pv[t0 + w], pi[t0 + w]);
            take_top(qv[t0], qi[t0], qv[t0 + w], qi[t0 + w]);
        }
        __syncthreads();
    }
    if (t0 == 0) kl[o] = sum[0], top_p[o] = pi[0], top_q[o] = qi[0];
}

// ---- the residual stream: per row, the four sums of kvd_hidden_compare ----
__global__ void hidden_kernel(const float *a, const float *x, int n, kvd_hidden_cmp *out) {
    const float *ar = a + (size_t)blockIdx.x * n, *xr = x + (size_t)blockIdx.x * n;
    __shared__ double sh[CMP_THREADS];
    double err2 = 0.0, ref2 = 0.0, dot = 0.0, test2 = 0.0;
    for (int i = threadIdx.x; i < n; i += CMP_THREADS) {
        double av = ar[i], xv = xr[i], e = xv - av;
        err2 += e * e, ref2 += av * av, dot += av * xv, test2 += xv * xv;
    }
    err2 = block_sum(err2, sh), ref2 = block_sum(ref2, sh);
    dot = block_sum(dot, sh), test2 = block_sum(test2, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = kvd_hidden_cmp{err2, ref2, dot, test2};
}

// ---- the logits: per row, kvd_compare_logits (the largest logit and its
// first position on each side, the log-sum-exps, then the KL) ----
__global__ void logits_kernel(const float *a, const float *x, int V, const int *target,
                              kvd_logit_cmp *out) {
    const float *ar = a + (size_t)blockIdx.x * V, *xr = x + (size_t)blockIdx.x * V;
    __shared__ double sh[CMP_THREADS];
    __shared__ float av[CMP_THREADS];
    __shared__ float xv[CMP_THREADS];
    __shared__ int ai[CMP_THREADS];
    __shared__ int xi[CMP_THREADS];
    const int t0 = threadIdx.x;
    float ba = -INFINITY, bx = -INFINITY;
    int ia = V, ix = V;
    for (int i = t0; i < V; i += CMP_THREADS)
        take_top(ba, ia, ar[i], i), take_top(bx, ix, xr[i], i);
    av[t0] = ba, xv[t0] = bx, ai[t0] = ia, xi[t0] = ix;
    __syncthreads();
    for (int w = CMP_THREADS / 2; w > 0; w /= 2) {
        if (t0 < w) {
            take_top(av[t0], ai[t0], av[t0 + w], ai[t0 + w]);
            take_top(xv[t0], xi[t0], xv[t0 + w], xi[t0 + w]);
        }
        __syncthreads();
    }
    const double ma = av[0], mx = xv[0];
    const int same = ai[0] == xi[0];
    double sa = 0.0, sx = 0.0;
    for (int i = t0; i < V; i += CMP_THREADS) sa += exp(ar[i] - ma), sx += exp(xr[i] - mx);
    sa = block_sum(sa, sh), sx = block_sum(sx, sh);
    const double lse_a = ma + log(sa), lse_x = mx + log(sx);
    double kl = 0.0;
    for (int i = t0; i < V; i += CMP_THREADS) {
        double pa = ar[i] - lse_a, px = xr[i] - lse_x;
        kl += exp(pa) * (pa - px);
    }
    kl = block_sum(kl, sh);
    if (t0 == 0) {
        kvd_logit_cmp r;
        r.kl = kl > 0.0 ? kl : 0.0;
        r.lse_a = lse_a, r.lse_x = lse_x, r.same_argmax = same;
        const int t = target ? target[blockIdx.x] : -1;
        r.a_target = t >= 0 && t < V ? (double)ar[t] : (double)NAN;
        r.x_target = t >= 0 && t < V ? (double)xr[t] : (double)NAN;
        out[blockIdx.x] = r;
    }
}

extern "C" int kvd_cuda_attn_compare_dev(const float *p, const float *q, int n_heads, int n_ctx,
                                         double *kl, int *top_p, int *top_q) {
    if (n_heads < 1 || n_ctx < 1) return -1;
    attn_kernel<<<(unsigned)n_heads, CMP_THREADS>>>(p, q, n_heads, nullptr, n_ctx, (size_t)n_ctx,
                                                    kl, top_p, top_q, 0);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_compare_rows_dev(const float *p, const float *q, int n_heads, int n,
                                              const int *n_ctx, size_t stride, double *kl,
                                              int *top_p, int *top_q, size_t out_stride) {
    if (n_heads < 1 || n < 1) return -1;
    dim3 grid((unsigned)n_heads, (unsigned)n);
    attn_kernel<<<grid, CMP_THREADS>>>(p, q, n_heads, n_ctx, 0, stride, kl, top_p, top_q,
                                       out_stride);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_hidden_compare_dev(const float *a, const float *x, int rows, int n,
                                           kvd_hidden_cmp *out) {
    if (rows < 1 || n < 1) return -1;
    hidden_kernel<<<(unsigned)rows, CMP_THREADS>>>(a, x, n, out);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_logits_compare_dev(const float *a, const float *x, int rows, int V,
                                           const int *target, kvd_logit_cmp *out) {
    if (rows < 1 || V < 1) return -1;
    logits_kernel<<<(unsigned)rows, CMP_THREADS>>>(a, x, V, target, out);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

// ---- the same with host memory in and out, for the parity tests ----

// two inputs of n floats each to the device, and room for the outputs
struct cmp_io {
    float *a = nullptr, *x = nullptr;
    void *out = nullptr;
    bool up(const float *ha, const float *hx, size_t n, size_t out_bytes) {
        return cudaMalloc(&a, sizeof(float) * n) == cudaSuccess &&
               cudaMalloc(&x, sizeof(float) * n) == cudaSuccess &&
               cudaMalloc(&out, out_bytes) == cudaSuccess &&
               cudaMemcpy(a, ha, sizeof(float) * n, cudaMemcpyHostToDevice) == cudaSuccess &&
               cudaMemcpy(x, hx, sizeof(float) * n, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    bool down(void *dst, size_t off, size_t bytes) const {
        return cudaMemcpy(dst, (const char *)out + off, bytes, cudaMemcpyDeviceToHost) ==
               cudaSuccess;
    }
    ~cmp_io() { cudaFree(a), cudaFree(x), cudaFree(out); }
};

extern "C" int kvd_cuda_attn_compare(const float *p, const float *q, int n_heads, int n_ctx,
                                     double *kl, int *top_p, int *top_q) {
    if (n_heads < 1 || n_ctx < 1) return -1;
    const size_t nk = sizeof(double) * n_heads, nt = sizeof(int) * n_heads;
    cmp_io io;
    if (!io.up(p, q, (size_t)n_heads * n_ctx, nk + 2 * nt)) return -1;
    int *dt = (int *)((char *)io.out + nk);
    return kvd_cuda_attn_compare_dev(io.a, io.x, n_heads, n_ctx, (double *)io.out, dt,
                                     dt + n_heads) == 0 &&
                   io.down(kl, 0, nk) && io.down(top_p, nk, nt) && io.down(top_q, nk + nt, nt)
               ? 0
               : -1;
}

extern "C" int kvd_cuda_hidden_compare(const float *a, const float *x, int rows, int n,
                                       kvd_hidden_cmp *out) {
    if (rows < 1 || n < 1) return -1;
    const size_t ob = sizeof(kvd_hidden_cmp) * rows;
    cmp_io io;
    return io.up(a, x, (size_t)rows * n, ob) &&
                   kvd_cuda_hidden_compare_dev(io.a, io.x, rows, n, (kvd_hidden_cmp *)io.out) ==
                       0 &&
                   io.down(out, 0, ob)
               ? 0
               : -1;
}

extern "C" int kvd_cuda_logits_compare(const float *a, const float *x, int rows, int V,
                                       const int *target, kvd_logit_cmp *out) {
    if (rows < 1 || V < 1) return -1;
    const size_t ob = sizeof(kvd_logit_cmp) * rows, tb = sizeof(int) * rows;
    cmp_io io;
    int *dt = nullptr;
    const bool ok =
        io.up(a, x, (size_t)rows * V, ob) &&
        (!target || (cudaMalloc(&dt, tb) == cudaSuccess &&
                     cudaMemcpy(dt, target, tb, cudaMemcpyHostToDevice) == cudaSuccess)) &&
        kvd_cuda_logits_compare_dev(io.a, io.x, rows, V, dt, (kvd_logit_cmp *)io.out) == 0 &&
        io.down(out, 0, ob);
    cudaFree(dt);
    return ok ? 0 : -1;
}
