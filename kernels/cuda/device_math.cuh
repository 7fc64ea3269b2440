// kvdrift: device helpers shared by the kernels: a block's sum of squares
// in double, a warp's sums of several rows at once, the logistic functions
// rounded as the CPU's (ISO C, no fused multiply-adds), and one column of
// the gated delta rule step (in memory, or held in registers).
#ifndef KVD_DEVICE_MATH_CUH
#define KVD_DEVICE_MATH_CUH

#include <cuda_runtime.h>

// every thread's ss summed by the whole block (blockDim a multiple of 32,
// at most 1024): each warp's by shuffles, then the warps' in order;
// returned to every thread
__device__ inline double block_sum_warps(double ss) {
    __shared__ double part[32];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_down_sync(0xffffffffu, ss, off);
    __syncthreads(); // part may still be read by an earlier call
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int i = 0; i < (int)(blockDim.x + 31) / 32; i++) t += part[i];
        part[0] = t;
    }
    __syncthreads();
    return part[0];
}

// sum of x[i]^2 over i < n by the whole block, each thread taking
// i = threadIdx.x, + blockDim.x, ... in order
__device__ inline double block_sum_sq(const float *x, int n) {
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * x[i];
    return block_sum_warps(ss);
}

// The warp's sums of R rows (R a power of two), lane by lane partials in
// acc[0 .. R-1]: row lane / (32 / R)'s sum, in each lane of that group of
// 32 / R. While a lane holds several rows, each step halves them: the
// lanes with bit o of their index set keep the upper half, the others the
// lower, and each adds its partner's (lane ^ o) partials of the rows it
// keeps, for o = 16, 8, .. 32 / R; with one row left the steps go on as a
// plain butterfly down to o = 1. Each row is so summed by the same tree as
// `a += __shfl_xor_sync(.., a, o)` for o = 16 .. 1 row by row (each step
// adds the same two operands, and a + b is b + a bit for bit), so the bits
// are the same, from R + 4 - log2(R) shuffles in place of 5 R (16 for 80 at
// sixteen rows).
template <int R, int HALF, int TR> __device__ inline void fold_rows(float (&acc)[TR], int lane) {
    constexpr int o = 32 * HALF / R; // 16 at the first step (HALF = R / 2)
    const bool upper = lane & o;
#pragma unroll
    for (int j = 0; j < HALF; j++) {
        const float keep = upper ? acc[j + HALF] : acc[j];
        const float give = upper ? acc[j] : acc[j + HALF];
        acc[j] = keep + __shfl_xor_sync(0xffffffffu, give, o);
    }
    if constexpr (HALF > 1) fold_rows<R, HALF / 2>(acc, lane);
}
template <int R, int TR> __device__ inline float warp_rows_sum(float (&acc)[TR], int lane) {
    static_assert(R >= 1 && R <= TR && R <= 32 && (R & (R - 1)) == 0, "R: a power of two");
    if constexpr (R > 1) fold_rows<R, R / 2>(acc, lane);
    float a = acc[0];
#pragma unroll
    for (int o = 16 / R; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    return a;
}

__device__ inline float sigmoid_rn(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}
__device__ inline float silu_rn(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}
// SwiGLU's silu(g) * u, and the shared expert's gated add mix +
// sigmoid(gate) * y, each rounded as the CPU rounds it: one definition for
// the kernels that do them alone and those that fuse them into a product
__device__ inline float swiglu_rn(float g, float u) {
    return __fmul_rn(silu_rn(g), u);
}
__device__ inline float gated_add_rn(float mix, float gate, float y) {
    return __fadd_rn(mix, __fmul_rn(sigmoid_rn(gate), y));
}

// kvd_gdn_step for value dimension j of one head (S [dk][dv], column j
// only: the columns are independent): returns o[j]. Every sum runs in the
// CPU's order, one key dimension after another; the loads are issued
// GDN_LOADS at a time before any of them is used, so a thread waits for
// memory dk / GDN_LOADS times a pass rather than once a row (the compiler
// may not move a load of S or k past the store into S before it).
constexpr int GDN_LOADS = 16;
__device__ inline float gdn_column(float *S, const float *q, const float *k, float vj, float g,
                                   float beta, int dk, int dv, int j) {
    float decay = expf(g), mem = 0.0f;
    float *col = S + j;
    for (int i0 = 0; i0 < dk; i0 += GDN_LOADS) {
        float sv[GDN_LOADS], kv[GDN_LOADS];
        const int n = dk - i0 < GDN_LOADS ? dk - i0 : GDN_LOADS;
#pragma unroll
        for (int u = 0; u < GDN_LOADS; u++)
            sv[u] = u < n ? col[(size_t)(i0 + u) * dv] : 0.0f, kv[u] = u < n ? k[i0 + u] : 0.0f;
#pragma unroll
        for (int u = 0; u < GDN_LOADS; u++)
            if (u < n) mem = __fadd_rn(mem, __fmul_rn(sv[u], kv[u]));
    }
    float delta = __fmul_rn(__fsub_rn(vj, __fmul_rn(decay, mem)), beta);
    float acc = 0.0f;
    for (int i0 = 0; i0 < dk; i0 += GDN_LOADS) {
        float sv[GDN_LOADS], kv[GDN_LOADS], qv[GDN_LOADS];
        const int n = dk - i0 < GDN_LOADS ? dk - i0 : GDN_LOADS;
#pragma unroll
        for (int u = 0; u < GDN_LOADS; u++)
            if (u < n) {
                sv[u] = col[(size_t)(i0 + u) * dv], kv[u] = k[i0 + u], qv[u] = q[i0 + u];
            } else {
                sv[u] = kv[u] = qv[u] = 0.0f;
            }
#pragma unroll
        for (int u = 0; u < GDN_LOADS; u++)
            if (u < n) {
                float s = __fadd_rn(__fmul_rn(decay, sv[u]), __fmul_rn(kv[u], delta));
                col[(size_t)(i0 + u) * dv] = s;
                acc = __fadd_rn(acc, __fmul_rn(s, qv[u]));
            }
    }
    return acc;
}

// The same step with the column in registers: a launch reads its state
// once and writes it once however many tokens it steps, and all of a
// thread's loads of it are in flight at once. P threads of a warp share a
// column, DK / P rows each (at DK = 128 one thread's 128 floats and the
// step's temporaries would pass 255 registers and spill): each sum runs
// through the parts in order, part p taking part p - 1's running value by
// a shuffle, so every sum keeps gdn_column's order and the two agree bit
// for bit. The warp's 32 / P columns are its lanes modulo 32 / P; all 32
// lanes must call step (the shuffles), a lane past the last column with
// its state zero.
template <int DK, int P> struct gdn_regs {
    static constexpr int R = DK / P, W = 32 / P;
    float s[R];
    __device__ void load(const float *col, int dv, int part) {
#pragma unroll
        for (int i = 0; i < R; i++) s[i] = col[(size_t)(part * R + i) * dv];
    }
    __device__ void store(float *col, int dv, int part) const {
#pragma unroll
        for (int i = 0; i < R; i++) col[(size_t)(part * R + i) * dv] = s[i];
    }
    // q and k: the whole head's DK values; returns o[j] to every part
    __device__ float step(const float *q, const float *k, float vj, float g, float beta) {
        const int lane = threadIdx.x & 31, c = lane % W, part = lane / W;
        const float *kp = k + part * R, *qp = q + part * R;
        float decay = expf(g), mem = 0.0f;
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (p == part)
#pragma unroll
                for (int i = 0; i < R; i++) mem = __fadd_rn(mem, __fmul_rn(s[i], kp[i]));
            if (P > 1) mem = __shfl_sync(0xffffffffu, mem, p * W + c);
        }
        float delta = __fmul_rn(__fsub_rn(vj, __fmul_rn(decay, mem)), beta);
        float acc = 0.0f;
#pragma unroll
        for (int p = 0; p < P; p++) {
            if (p == part)
#pragma unroll
                for (int i = 0; i < R; i++) {
                    s[i] = __fadd_rn(__fmul_rn(decay, s[i]), __fmul_rn(kp[i], delta));
                    acc = __fadd_rn(acc, __fmul_rn(s[i], qp[i]));
                }
            if (P > 1) acc = __shfl_sync(0xffffffffu, acc, p * W + c);
        }
        return acc;
    }
};

#endif
