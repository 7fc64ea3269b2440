// kvdrift: device memory and the model's operations on device pointers, for
// the device forward pass (runners/model_cuda.c). Every operation is
// launched on the default stream and returns at once; kvd_cuda_sync reports
// the first error. The per-layer blocks reuse the kernels of layers.cu (the
// ones tests/gpu holds to their CPU twins); the rest is glue that moves or
// combines values the way runners/model.c does on the CPU, in its order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda_kernels.h"
#include "device_math.cuh"
#include "rht.cuh"

// ---- memory ----
extern "C" void *kvd_cuda_alloc(size_t n) {
    void *p = nullptr;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return nullptr;
    if (cudaMemset(p, 0, n ? n : 1) != cudaSuccess) {
        cudaFree(p);
        return nullptr;
    }
    return p;
}
extern "C" void kvd_cuda_free(void *p) {
    if (p) cudaFree(p);
}
extern "C" int kvd_cuda_mem_in_use(size_t *bytes) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *bytes = total - free_bytes;
    return 0;
}
extern "C" int kvd_cuda_upload(void *dst, const void *src, size_t n) {
    return cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}
extern "C" int kvd_cuda_download(void *dst, const void *src, size_t n) {
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
extern "C" int kvd_cuda_copy(void *dst, const void *src, size_t n) {
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice) == cudaSuccess ? 0 : -1;
}
extern "C" int kvd_cuda_zero(void *p, size_t n) {
    return cudaMemset(p, 0, n) == cudaSuccess ? 0 : -1;
}
// a step's staged uploads: a page-locked arena per device, whose copies
// queue behind the kernels instead of waiting for them (a plain cudaMemcpy
// from pageable memory first drains the queue)
namespace {
struct stage_arena {
    char *p;
    size_t used;
    bool tried;
};
stage_arena arenas[16];
constexpr size_t stage_bytes = (size_t)8 << 20;
stage_arena *arena() {
    int dev = 0;
    cudaGetDevice(&dev);
    return &arenas[dev & 15];
}
} // namespace
extern "C" int kvd_cuda_stage_begin(void) {
    stage_arena *a = arena();
    if (cudaStreamSynchronize(nullptr) != cudaSuccess) return -1; // the last step's copies are done
    if (!a->tried) {
        a->tried = true;
        if (cudaHostAlloc(reinterpret_cast<void **>(&a->p), stage_bytes, cudaHostAllocPortable) !=
            cudaSuccess) {
            a->p = nullptr;
            cudaGetLastError(); // no arena: the uploads wait instead
        }
    }
    a->used = 0;
    return 0;
}
extern "C" int kvd_cuda_stage_upload(void *dst, const void *src, size_t n) {
    stage_arena *a = arena();
    const size_t off = (a->used + 15) / 16 * 16;
    if (!a->p || off + n > stage_bytes) return kvd_cuda_upload(dst, src, n);
    std::memcpy(a->p + off, src, n);
    a->used = off + n;
    return cudaMemcpyAsync(dst, a->p + off, n, cudaMemcpyHostToDevice, nullptr) == cudaSuccess ? 0
                                                                                               : -1;
}
extern "C" int kvd_cuda_sync(char *err, int len) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
        std::snprintf(err, (size_t)len, "cuda: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

namespace {

inline unsigned blocks_for(size_t n, unsigned th) {
    return (unsigned)((n + th - 1) / th);
}

// y[M,N] = x[M,K] W[N,K]^T: FP32 activations, BF16 weights, FP32 sums. One
// warp per output column and tile of TR rows (1, 2, 4, 8 or 16: the fewest
// that hold the launch's rows, so that C = 1 keeps one accumulator a lane
// rather than sixteen and the SM room for more warps), each lane 8 weights
// (16 bytes) at a time: decode reads every weight once per step. A lane
// issues the loads of lin_ahead(TR) such slices before it uses the first,
// so a warp has that many times 512 bytes of weights in flight rather than
// 512 (a decode step streams every weight once, at whatever bandwidth the
// loads in flight allow): 4 up to 4 rows, 2 at 8, 1 at 16, where more
// would cost the SM warps (ptxas for sm_90: 37 registers a thread at one
// row, 64 at 8, 80 at 16; 107 with 16 rows two slices ahead, and the
// grouped kernel's 16 row pointers 168). A row's sums take the slices in
// the same order whatever TR and the look-ahead, so every tile gives the
// same bits.
constexpr int LIN_ROWS = 16;
__host__ __device__ constexpr int lin_ahead(int TR) {
    return TR <= 4 ? 4 : TR <= 8 ? 2 : 1;
}
inline int lin_tile(int rows) {
    return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : rows <= 8 ? 8 : LIN_ROWS;
}
// launch(tile) with lin_tile(rows) as a compile-time constant (tile::value)
template <int TR> using tile_c = std::integral_constant<int, TR>;
template <class F> inline void with_tile(int rows, F launch) {
    switch (lin_tile(rows)) {
    case 1:
        launch(tile_c<1>{});
        break;
    case 2:
        launch(tile_c<2>{});
        break;
    case 4:
        launch(tile_c<4>{});
        break;
    case 8:
        launch(tile_c<8>{});
        break;
    default:
        launch(tile_c<LIN_ROWS>{});
    }
}

enum class col_out { STORE, GATED, GLU, SWIGLU };

// A column's sums of its rows (1 <= rows <= R) into y, row i at y[i *
// y_stride], by OUT (see w16_column), each row's by the first lane of the
// group holding it. R is the least power of two that holds the rows (a
// tile's last rows, an expert's few), so a short tile takes no more
// shuffles than its rows need; rows is the same for the whole warp.
template <int R, col_out OUT, int TR>
__device__ inline void put_rows(float (&acc)[TR], float *y, size_t y_stride, int rows, int lane,
                                const float *gate) {
    if constexpr (R > 1) {
        if (rows <= R / 2) return put_rows<R / 2, OUT>(acc, y, y_stride, rows, lane, gate);
    }
    const float a = warp_rows_sum<R>(acc, lane);
    const int i = lane / (32 / R);
    if (lane % (32 / R) != 0 || i >= rows) return;
    float *out = y + (size_t)i * y_stride;
    if constexpr (OUT == col_out::GLU)
        *out = swiglu_rn(*out, a);
    else if constexpr (OUT == col_out::GATED)
        *out = gated_add_rn(*out, gate[i], a);
    else
        *out = a;
}

// one warp's output column: y[i * y_stride] = xrow(i) . wr for i < rows
// (<= TR), wr the column's K weights; xrow(i) gives row i's activations.
// rows is the same for the whole warp, so the shuffles stay converged.
// What the column's sum a does to y (OUT): STORE y = a; GATED y +=
// sigmoid(gate[i]) * a (gated_add_rn, as add_gated_k; row i's gate at
// gate[i]); GLU, where y holds the gate projection's column, y = silu(y) *
// a (swiglu_rn, as swiglu_k). SWIGLU is no column's: linear_grouped_k's
// gate column (STORE) then its up column (GLU) into the same y.
template <int TR, col_out OUT = col_out::STORE, class XRow>
__device__ inline void w16_column(XRow xrow, const __nv_bfloat16 *wr, float *y, size_t y_stride,
                                  int rows, int K, int lane, const float *gate = nullptr) {
    constexpr int AHEAD = lin_ahead(TR);
    float acc[TR];
#pragma unroll
    for (int i = 0; i < TR; i++) acc[i] = 0.0f;
    if (K % 8 == 0) {
        for (int k0 = lane * 8; k0 < K; k0 += 256 * AHEAD) {
            uint4 raw[AHEAD];
#pragma unroll
            for (int u = 0; u < AHEAD; u++)
                if (k0 + 256 * u < K) raw[u] = *reinterpret_cast<const uint4 *>(wr + k0 + 256 * u);
#pragma unroll
            for (int u = 0; u < AHEAD; u++) {
                const int k = k0 + 256 * u;
                if (k >= K) break;
                const __nv_bfloat16 *wb = reinterpret_cast<const __nv_bfloat16 *>(&raw[u]);
                float wv[8];
#pragma unroll
                for (int e = 0; e < 8; e++) wv[e] = __bfloat162float(wb[e]);
#pragma unroll
                for (int i = 0; i < TR; i++)
                    if (i < rows) {
                        const float *xr = xrow(i) + k;
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[i] += wv[e] * xr[e];
                    }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            float wv = __bfloat162float(wr[k]);
#pragma unroll
            for (int i = 0; i < TR; i++)
                if (i < rows) acc[i] += wv * xrow(i)[k];
        }
    }
    put_rows<TR, OUT>(acc, y, y_stride, rows, lane, gate);
}

// y[M,N] = x W^T, or with GATED y += sigmoid(gate[m]) * (x W^T)[m, n] (the
// shared expert's down projection and its gated add into the MoE's output)
template <int TR, col_out OUT>
__global__ void linear_w16_k(const float *x, const __nv_bfloat16 *w, float *y, const float *gate,
                             int M, int N, int K) {
    const int n = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const int m0 = blockIdx.y * TR;
    if (n >= N) return;
    w16_column<TR, OUT>([&](int i) { return x + (size_t)(m0 + i) * K; }, w + (size_t)n * K,
                        y + (size_t)m0 * N + n, (size_t)N, min(TR, M - m0), K, lane,
                        OUT == col_out::GATED ? gate + m0 : nullptr);
}

// several projections of one x, by linear_w16_k's arithmetic: warp c of the
// grid is column c of the outputs' columns laid end to end (ends[j] the
// first column past output j)
struct multi_args {
    const float *x;
    const __nv_bfloat16 *w[KVD_LINEAR_OUTS];
    float *y[KVD_LINEAR_OUTS];
    int ends[KVD_LINEAR_OUTS];
    int n, M, K;
};
template <int TR> __global__ void linear_multi_k(multi_args a) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const int m0 = blockIdx.y * TR;
    // the output holding column c, by constant indices only (a runtime
    // index into the parameters would copy them to local memory)
    const __nv_bfloat16 *w = nullptr;
    float *y = nullptr;
    int c0 = 0, end = 0;
#pragma unroll
    for (int k = 0; k < KVD_LINEAR_OUTS; k++) {
        if (k >= a.n || w) continue;
        if (c < a.ends[k])
            w = a.w[k], y = a.y[k], end = a.ends[k];
        else
            c0 = a.ends[k];
    }
    if (!w) return;
    const int N = end - c0, n = c - c0;
    w16_column<TR>([&](int i) { return a.x + (size_t)(m0 + i) * a.K; }, w + (size_t)n * a.K,
                   y + (size_t)m0 * N + n, (size_t)N, min(TR, a.M - m0), a.K, lane);
}

// MoE experts' products in one launch, by linear_w16_k's arithmetic, over
// the expert groups G (G[0] = ng, G[1 ..] the experts, then their items'
// ng + 1 offsets): block row g < ng (grid y) is expert G[1 + g], its rows
// the items G[1 + ng + g] .. G[2 + ng + g] - 1; item i's activations are
// x's row slots[i] / slot_div (slots null: row i), its output y's row i;
// the expert's weights w_tab[G[1 + g]]. Rows past TR take further tiles.
// SWIGLU: each warp's gate column (w_tab) then its up column (w_tab2) of
// the tile, bit for bit the two launches (STORE, then GLU) one after the
// other: the up column's lane 0 reads the gate product its own store left.
struct grouped_args {
    const float *x;
    const int *slots;
    int slot_div;
    const void *const *w_tab;
    const int *G;
    float *y;
    int N, K;
    const void *const *w_tab2;
};
template <int TR, col_out OUT> __global__ void linear_grouped_k(grouped_args a) {
    const int n = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    const int ng = a.G[0], g = blockIdx.y;
    if (n >= a.N || g >= ng) return;
    const int i0 = a.G[1 + ng + g], i1 = a.G[2 + ng + g];
    const __nv_bfloat16 *wr = (const __nv_bfloat16 *)a.w_tab[a.G[1 + g]] + (size_t)n * a.K;
    for (int t0 = i0; t0 < i1; t0 += TR) {
        // the tile's rows' activations, looked up once (registers: the
        // column's loops index them by constants)
        const int rows = min(TR, i1 - t0);
        const float *xr[TR];
#pragma unroll
        for (int i = 0; i < TR; i++) {
            const int item = t0 + (i < rows ? i : 0);
            xr[i] = a.x + (a.slots ? (size_t)(a.slots[item] / a.slot_div) : (size_t)item) * a.K;
        }
        float *y = a.y + (size_t)t0 * a.N + n;
        if constexpr (OUT == col_out::SWIGLU) {
            const __nv_bfloat16 *wu = (const __nv_bfloat16 *)a.w_tab2[a.G[1 + g]] + (size_t)n * a.K;
            w16_column<TR, col_out::STORE>([&](int i) { return xr[i]; }, wr, y, (size_t)a.N, rows,
                                           a.K, lane);
            w16_column<TR, col_out::GLU>([&](int i) { return xr[i]; }, wu, y, (size_t)a.N, rows,
                                         a.K, lane);
        } else {
            w16_column<TR, OUT>([&](int i) { return xr[i]; }, wr, y, (size_t)a.N, rows, a.K, lane);
        }
    }
}

// The same product for many rows (prefill): 64 x 64 output tiles, 256
// threads of 4 x 4 outputs each, K in slices of 32 staged in shared memory
// (the weights decoded to FP32 once per tile), so a weight is read once per
// 64 rows instead of once per 16. Each output sums its K products in order.
constexpr int GT_M = 64, GT_N = 64, GT_K = 32;
__global__ void linear_tiled_k(const float *x, const __nv_bfloat16 *w, float *y, int M, int N,
                               int K) {
    __shared__ float xs[GT_K][GT_M + 4];
    __shared__ float ws[GT_K][GT_N + 4];
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int m0 = blockIdx.y * GT_M, n0 = blockIdx.x * GT_N;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += GT_K) {
#pragma unroll
        for (int i = 0; i < GT_M * GT_K / 256; i++) {
            int e = tid + 256 * i, r = e / GT_K, k = e % GT_K;
            int gm = m0 + r, gn = n0 + r, gk = k0 + k;
            xs[k][r] = gm < M && gk < K ? x[(size_t)gm * K + gk] : 0.0f;
            ws[k][r] = gn < N && gk < K ? __bfloat162float(w[(size_t)gn * K + gk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < GT_K; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[k][ty * 4 + i], b[i] = ws[k][tx * 4 + i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int gm = m0 + ty * 4 + i, gn = n0 + tx * 4 + j;
            if (gm < M && gn < N) y[(size_t)gm * N + gn] = acc[i][j];
        }
}

__global__ void embed_k(const __nv_bfloat16 *E, const int32_t *tok, float *x, int H) {
    const int r = blockIdx.x;
    const __nv_bfloat16 *e = E + (size_t)tok[r] * H;
    for (int d = threadIdx.x; d < H; d += blockDim.x) x[(size_t)r * H + d] = __bfloat162float(e[d]);
}

// the query part of [query | gate] rows, compact: qh[r][h][:] = qg[r][h][0:hd]
__global__ void split_query_k(const float *qg, float *qh, int nh, int hd, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t rh = i / hd, d = i % hd;
    qh[i] = qg[rh * 2 * hd + d];
    (void)nh;
}

// att *= sigmoid(gate), the gate the second half of each [query | gate] head
__global__ void output_gate_k(float *att, const float *qg, int hd, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t rh = i / hd, d = i % hd;
    att[i] = __fmul_rn(att[i], sigmoid_rn(qg[(rh * 2 + 1) * hd + d]));
}

// DeltaNet: the fused projections un-grouped per key head into [q | k | v],
// z, beta and the log decay g (softplus with torch's threshold of 20)
struct ungroup_args {
    const float *qkvz, *ba, *A_log, *dt_bias;
    float *conv, *z, *beta, *gdec;
    int nk, nv, dk, dv, r_, kd, vd, cd, pw;
};
__global__ void ungroup_k(ungroup_args a) {
    const int r = blockIdx.x;
    const float *p = a.qkvz + (size_t)r * a.pw, *pba = a.ba + (size_t)r * 2 * a.nv;
    float *mixd = a.conv + (size_t)r * a.cd, *z = a.z + (size_t)r * a.vd;
    const int per = 2 * a.dk + 2 * a.r_ * a.dv;
    for (int e = threadIdx.x; e < a.nk * per; e += blockDim.x) {
        int h = e / per, o = e % per;
        float v = p[e];
        if (o < a.dk)
            mixd[h * a.dk + o] = v;
        else if (o < 2 * a.dk)
            mixd[a.kd + h * a.dk + (o - a.dk)] = v;
        else if (o < 2 * a.dk + a.r_ * a.dv)
            mixd[2 * a.kd + h * a.r_ * a.dv + (o - 2 * a.dk)] = v;
        else
            z[h * a.r_ * a.dv + (o - 2 * a.dk - a.r_ * a.dv)] = v;
    }
    for (int vh = threadIdx.x; vh < a.nv; vh += blockDim.x) {
        int h = vh / a.r_, j = vh % a.r_;
        float bb = pba[h * 2 * a.r_ + j], aa = pba[h * 2 * a.r_ + a.r_ + j];
        float sp = __fadd_rn(aa, a.dt_bias[vh]);
        sp = sp > 20.0f ? sp : log1pf(expf(sp));
        a.beta[(size_t)r * a.nv + vh] = sigmoid_rn(bb);
        a.gdec[(size_t)r * a.nv + vh] = __fmul_rn(-expf(a.A_log[vh]), sp);
    }
}

// the causal depthwise conv1d + SiLU, one thread per channel, each batch
// sequence's tokens in order, carried by its conv state (oldest first)
__global__ void conv_k(float *conv, int cd, const float *w, int K, float *state_base,
                       size_t state_seq_stride, const int *seqs, const int *row0, const int *ntok) {
    const int s = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= cd) return;
    float *hist = state_base + (size_t)seqs[s] * state_seq_stride + (size_t)ch * (K - 1);
    const float *wc = w + (size_t)ch * K;
    for (int t = 0; t < ntok[s]; t++) {
        float *x = conv + (size_t)(row0[s] + t) * cd + ch;
        float in = *x, acc = __fmul_rn(wc[K - 1], in);
        for (int j = 0; j < K - 1; j++) acc = __fadd_rn(acc, __fmul_rn(wc[j], hist[j]));
        for (int j = 0; j < K - 2; j++) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = in;
        *x = silu_rn(acc);
    }
}

// L2 norm of each q and k head (q also scaled by dk^-0.5), one block per (row, head)
__global__ void l2norm_k(float *conv, int cd, int nk, int dk, float qscale) {
    const int r = blockIdx.x / (2 * nk), h = blockIdx.x % (2 * nk);
    float *v = conv + (size_t)r * cd + (size_t)h * dk;
    float inv = (float)(1.0 / sqrt(block_sum_sq(v, dk) + 1e-6));
    if (h < nk) inv = __fmul_rn(inv, qscale);
    for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] = __fmul_rn(v[i], inv);
}

// the recurrence for every (batch sequence, value head), its tokens in
// order: kvd_gdn_step's arithmetic, one thread per value dimension
struct gdn_rows_args {
    const float *conv, *gdec, *beta;
    float *out, *ssm;
    const int *seqs, *row0, *ntok;
    int cd, kd, vd, nv, r_, dk, dv;
    size_t ssm_seq_stride; // floats per sequence slot (this layer's heads at offset 0)
};
__global__ void gdn_rows_k(gdn_rows_args a) {
    const int s = blockIdx.x / a.nv, vh = blockIdx.x % a.nv, kh = vh / a.r_, j = threadIdx.x;
    if (j >= a.dv) return;
    float *S = a.ssm + (size_t)a.seqs[s] * a.ssm_seq_stride + (size_t)vh * a.dk * a.dv;
    for (int t = 0; t < a.ntok[s]; t++) {
        const size_t r = (size_t)(a.row0[s] + t);
        const float *x = a.conv + r * a.cd;
        a.out[r * a.vd + vh * a.dv + j] =
            gdn_column(S, x + kh * a.dk, x + a.kd + kh * a.dk, x[2 * a.kd + vh * a.dv + j],
                       a.gdec[r * a.nv + vh], a.beta[r * a.nv + vh], a.dk, a.dv, j);
    }
}

// the same with the columns in registers (gdn_regs): one warp a block,
// 32 / P columns of one head, so a decode step at C = 1 spreads its heads
// over every SM
template <int DK, int P> __global__ void __launch_bounds__(32) gdn_rows_regs_k(gdn_rows_args a) {
    __shared__ float qk[2 * DK]; // this token's q and k head, read by every column
    using regs = gdn_regs<DK, P>;
    const int s = blockIdx.x / a.nv, vh = blockIdx.x % a.nv, kh = vh / a.r_;
    const int part = threadIdx.x / regs::W, j = blockIdx.y * regs::W + threadIdx.x % regs::W;
    const bool mine = j < a.dv;
    float *col = a.ssm + (size_t)a.seqs[s] * a.ssm_seq_stride + (size_t)vh * DK * a.dv + j;
    regs S;
    if (mine)
        S.load(col, a.dv, part);
    else
        for (int i = 0; i < regs::R; i++) S.s[i] = 0.0f;
    for (int t = 0; t < a.ntok[s]; t++) {
        const size_t r = (size_t)(a.row0[s] + t);
        const float *x = a.conv + r * a.cd;
        __syncthreads(); // the last token's q and k are read
        for (int i = threadIdx.x; i < DK; i += blockDim.x)
            qk[i] = x[kh * DK + i], qk[DK + i] = x[a.kd + kh * DK + i];
        __syncthreads();
        const float vj = mine ? x[2 * a.kd + vh * a.dv + j] : 0.0f;
        const float o = S.step(qk, qk + DK, vj, a.gdec[r * a.nv + vh], a.beta[r * a.nv + vh]);
        if (mine && part == P - 1) a.out[r * a.vd + vh * a.dv + j] = o;
    }
    if (mine) S.store(col, a.dv, part);
}

// gated RMSNorm per value head: rmsnorm(o) * w * silu(z)
__global__ void gated_norm_k(float *o, const float *z, const float *w, int nv, int dv, float eps) {
    const int r = blockIdx.x / nv, vh = blockIdx.x % nv;
    float *x = o + ((size_t)r * nv + vh) * dv;
    const float *zz = z + ((size_t)r * nv + vh) * dv;
    float rr = (float)(1.0 / sqrt(block_sum_sq(x, dv) / dv + (double)eps));
    for (int i = threadIdx.x; i < dv; i += blockDim.x)
        x[i] = __fmul_rn(__fmul_rn(__fmul_rn(x[i], rr), w[i]), silu_rn(zz[i]));
}

// MoE: rows routed to one expert gathered, and its weighted output added back
__global__ void gather_rows_k(const float *xn, const int *slots, int K, float *gx, int H) {
    const int i = blockIdx.x;
    const float *src = xn + (size_t)(slots[i] / K) * H;
    for (int d = threadIdx.x; d < H; d += blockDim.x) gx[(size_t)i * H + d] = src[d];
}
__global__ void scatter_rows_k(float *mix, const float *gy, const int *slots, const float *topw,
                               int K, int H) {
    const int i = blockIdx.x, r = slots[i] / K;
    const float wgt = topw[slots[i]];
    for (int d = threadIdx.x; d < H; d += blockDim.x)
        mix[(size_t)r * H + d] =
            __fadd_rn(mix[(size_t)r * H + d], __fmul_rn(wgt, gy[(size_t)i * H + d]));
}
// the groups' (G, as linear_grouped_k's) weighted outputs added to their
// rows in the items' order, which is the experts': bit for bit what
// scatter_rows_k does expert after expert. Block (r, c): row r's values c *
// 256 .. c * 256 + 255, one a thread, its sum kept in a register (a row's
// 4096 values at C = 1 are 16 blocks, and each item's loads are issued
// without waiting on the last item's store)
__global__ void scatter_grouped_k(float *mix, const float *gy, const int *slots, const float *topw,
                                  int K, const int *G, int H) {
    const int r = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    const int ng = G[0], lo = G[1 + ng], hi = G[1 + 2 * ng];
    if (d >= H) return;
    float acc = mix[(size_t)r * H + d];
    for (int i = lo; i < hi; i++) {
        const int s = slots[i];
        if (s / K == r) acc = __fadd_rn(acc, __fmul_rn(topw[s], gy[(size_t)i * H + d]));
    }
    mix[(size_t)r * H + d] = acc;
}
// The routing's item lists, as the host makes them, in one block: expert
// e's items are the slots r K + j (row r's j-th choice) with topi == e, in
// (r, j) order, experts one after another; G (as linear_grouped_k's) the
// experts e0 .. e1 - 1 with items. count: E ints of shared memory.
__global__ void expert_lists_k(const int *topi, int rows, int K, int E, int e0, int e1, int *slots,
                               int *G) {
    extern __shared__ int count[];
    const int n = rows * K;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int i = 0; i < n; i++) c += topi[i] == e;
        count[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) { // the offsets, and the groups of e0 .. e1 - 1
        int o = 0, ng = 0;
        for (int e = 0; e < E; e++) {
            const int c = count[e];
            count[e] = o;
            if (e >= e0 && e < e1 && c > 0) G[1 + ng++] = e;
            o += c;
        }
        G[0] = ng;
        for (int g = 0; g < ng; g++) G[1 + ng + g] = count[G[1 + g]];
        G[1 + 2 * ng] = e1 < E ? count[e1] : o;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int o = count[e];
        for (int i = 0; i < n; i++)
            if (topi[i] == e) slots[o++] = i;
    }
}
__global__ void add_gated_k(float *mix, const float *y, const float *gate, int H, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    mix[i] = gated_add_rn(mix[i], gate[i / H], y[i]);
}

// the per-column kernels' grid: a warp per column (8 a block), a block row
// per tile of lin_tile(M) rows
inline dim3 w16_grid(int M, int cols) {
    const int tr = lin_tile(M);
    return dim3(blocks_for((size_t)cols, 8), (unsigned)((M + tr - 1) / tr));
}
template <col_out OUT>
void w16_launch(const float *x, const void *w, float *y, const float *gate, int M, int N, int K) {
    const __nv_bfloat16 *wb = (const __nv_bfloat16 *)w;
    with_tile(M, [&](auto t) {
        linear_w16_k<decltype(t)::value, OUT><<<w16_grid(M, N), 256>>>(x, wb, y, gate, M, N, K);
    });
}
template <col_out OUT> void grouped_launch(const grouped_args &a, int max_groups, int max_rows) {
    if (max_groups <= 0 || a.N <= 0) return;
    const dim3 grid(blocks_for((size_t)a.N, 8), (unsigned)max_groups);
    with_tile(max_rows,
              [&](auto t) { linear_grouped_k<decltype(t)::value, OUT><<<grid, 256>>>(a); });
}

} // namespace

// ---- entry points (device pointers; asynchronous) ----
extern "C" void kvd_cudaop_linear(const float *x, const void *w, float *y, int M, int N, int K) {
    static const bool fp32 = [] {
        const char *e = getenv("KVD_CUDA_LINEAR");
        return e && !strcmp(e, "fp32");
    }();
    // up to 16 rows (decode at low concurrency, most experts' rows) one
    // FP32 launch reads the weights once at the memory's rate; the split's
    // three launches would only add their overhead
    if (!fp32 && M > LIN_ROWS && kvd_cuda_linear_split_dev(x, w, y, M, N, K, 0) == 0) return;
    kvd_cudaop_linear_fp32(x, w, y, M, N, K);
}
extern "C" void kvd_cudaop_linear_fp32(const float *x, const void *w, float *y, int M, int N,
                                       int K) {
    if (M <= 0 || N <= 0) return;
    if (M >= KVD_LINEAR_TILED_ROWS) { // prefill: tiles share each weight over 64 rows
        dim3 grid((unsigned)((N + GT_N - 1) / GT_N), (unsigned)((M + GT_M - 1) / GT_M));
        linear_tiled_k<<<grid, 256>>>(x, (const __nv_bfloat16 *)w, y, M, N, K);
        return;
    }
    w16_launch<col_out::STORE>(x, w, y, nullptr, M, N, K);
}
extern "C" void kvd_cudaop_linear_add_gated(const float *x, const void *w, float *y, float *mix,
                                            const float *gate, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    if (M > LIN_ROWS) {
        kvd_cudaop_linear(x, w, y, M, N, K);
        kvd_cudaop_add_gated(mix, y, gate, M, N);
        return;
    }
    w16_launch<col_out::GATED>(x, w, mix, gate, M, N, K);
}
extern "C" void kvd_cudaop_linear_multi(const float *x, int M, int K, const kvd_lin_out *outs,
                                        int n) {
    if (M <= 0 || n <= 0) return;
    // past 8 rows the outputs launch one by one: with 16 rows a lane the
    // outputs' pointers cost 16 registers (96, ptxas for sm_90, against
    // linear_w16_k's 80), two blocks an SM rather than three
    if (M > 8 || n > KVD_LINEAR_OUTS) {
        for (int j = 0; j < n; j++) kvd_cudaop_linear(x, outs[j].w, outs[j].y, M, outs[j].N, K);
        return;
    }
    multi_args a{};
    a.x = x, a.n = n, a.M = M, a.K = K;
    int cols = 0;
    for (int j = 0; j < n; j++) {
        a.w[j] = (const __nv_bfloat16 *)outs[j].w, a.y[j] = outs[j].y;
        a.ends[j] = cols += outs[j].N > 0 ? outs[j].N : 0;
    }
    if (cols == 0) return;
    with_tile(M,
              [&](auto t) { linear_multi_k<decltype(t)::value><<<w16_grid(M, cols), 256>>>(a); });
}
extern "C" void kvd_cudaop_embed(const void *E, const int32_t *tok, float *x, int rows, int H) {
    embed_k<<<rows, 256>>>((const __nv_bfloat16 *)E, tok, x, H);
}
extern "C" void kvd_cudaop_split_query(const float *qg, float *qh, int rows, int nh, int hd) {
    size_t n = (size_t)rows * nh * hd;
    split_query_k<<<blocks_for(n, 256), 256>>>(qg, qh, nh, hd, n);
}
// one block a (row, head) vector, rotated in shared memory as
// kvd_rht_rows does on the CPU: forward, rounded to BF16; inverse, over hd,
// rounded to BF16 (src may be dst: the vector is read whole first)
__global__ void rht_rows_k(const float *src, float *dst, int heads, int hd, size_t ss, size_t ds,
                           int inverse, kvd_rht_bits b) {
    extern __shared__ float y[];
    const int r = blockIdx.x / heads, h = blockIdx.x % heads;
    const float *x = src + (size_t)r * ss + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) y[i] = x[i];
    __syncthreads();
    block_rht(y, hd, inverse != 0, b);
    float *o = dst + (size_t)r * ds + (size_t)h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x)
        o[i] = __bfloat162float(__float2bfloat16_rn(inverse ? __fdiv_rn(y[i], (float)hd) : y[i]));
}
extern "C" void kvd_cudaop_rht(const float *src, float *dst, int rows, size_t src_stride,
                               size_t dst_stride, int heads, int hd, int inverse) {
    if (rows <= 0) return;
    rht_rows_k<<<(unsigned)(rows * heads), 128, sizeof(float) * (size_t)hd>>>(
        src, dst, heads, hd, src_stride, dst_stride, inverse, rht_bits());
}
extern "C" void kvd_cudaop_output_gate(float *att, const float *qg, int rows, int nh, int hd) {
    size_t n = (size_t)rows * nh * hd;
    output_gate_k<<<blocks_for(n, 256), 256>>>(att, qg, hd, n);
}
extern "C" void kvd_cudaop_ungroup(const float *qkvz, const float *ba, const float *A_log,
                                   const float *dt_bias, float *conv, float *z, float *beta,
                                   float *gdec, int rows, int nk, int nv, int dk, int dv) {
    int r_ = nv / nk, kd = nk * dk, vd = nv * dv;
    ungroup_args a = {qkvz, ba, A_log, dt_bias, conv, z,  beta,        gdec,           nk,
                      nv,   dk, dv,    r_,      kd,   vd, 2 * kd + vd, 2 * kd + 2 * vd};
    if (rows > 0) ungroup_k<<<rows, 256>>>(a);
}
extern "C" void kvd_cudaop_conv(float *conv, int cd, const float *w, int K, float *state_base,
                                size_t state_seq_stride, int n_seqs, const int *seqs,
                                const int *row0, const int *ntok) {
    dim3 grid(blocks_for((size_t)cd, 128), (unsigned)n_seqs);
    conv_k<<<grid, 128>>>(conv, cd, w, K, state_base, state_seq_stride, seqs, row0, ntok);
}
extern "C" void kvd_cudaop_l2norm(float *conv, int rows, int cd, int nk, int dk, float qscale) {
    if (rows > 0) l2norm_k<<<rows * 2 * nk, 128>>>(conv, cd, nk, dk, qscale);
}
// the recurrence over a batch, the columns in registers (regs, for the dk
// kvd_cuda_gdn_regs accepts) or in memory
static void gdn_launch(bool regs, const float *conv, const float *gdec, const float *beta,
                       float *out, float *ssm, size_t ssm_seq_stride, int n_seqs, const int *seqs,
                       const int *row0, const int *ntok, int nk, int nv, int dk, int dv) {
    gdn_rows_args a = {
        conv,    gdec,    beta, out,     ssm, seqs, row0,          ntok, 2 * nk * dk + nv * dv,
        nk * dk, nv * dv, nv,   nv / nk, dk,  dv,   ssm_seq_stride};
    if (n_seqs <= 0) return;
    const unsigned heads = (unsigned)(n_seqs * nv);
    switch (regs ? dk : 0) {
    case 32:
        gdn_rows_regs_k<32, 1><<<dim3(heads, (dv + 31) / 32), 32>>>(a);
        break;
    case 64:
        gdn_rows_regs_k<64, 2><<<dim3(heads, (dv + 15) / 16), 32>>>(a);
        break;
    case 128:
        gdn_rows_regs_k<128, 2><<<dim3(heads, (dv + 15) / 16), 32>>>(a);
        break;
    default:
        gdn_rows_k<<<heads, (dv + 31) / 32 * 32>>>(a);
    }
}
extern "C" void kvd_cudaop_gdn(const float *conv, const float *gdec, const float *beta, float *out,
                               float *ssm, size_t ssm_seq_stride, int n_seqs, const int *seqs,
                               const int *row0, const int *ntok, int nk, int nv, int dk, int dv) {
    gdn_launch(kvd_cuda_gdn_regs(dk), conv, gdec, beta, out, ssm, ssm_seq_stride, n_seqs, seqs,
               row0, ntok, nk, nv, dk, dv);
}
extern "C" void kvd_cudaop_gdn_columns(const float *conv, const float *gdec, const float *beta,
                                       float *out, float *ssm, size_t ssm_seq_stride, int n_seqs,
                                       const int *seqs, const int *row0, const int *ntok, int nk,
                                       int nv, int dk, int dv) {
    gdn_launch(false, conv, gdec, beta, out, ssm, ssm_seq_stride, n_seqs, seqs, row0, ntok, nk, nv,
               dk, dv);
}
extern "C" int kvd_cuda_gdn_regs(int dk) {
    return dk == 32 || dk == 64 || dk == 128;
}
extern "C" void kvd_cudaop_gated_norm(float *o, const float *z, const float *w, int rows, int nv,
                                      int dv, float eps) {
    if (rows > 0) gated_norm_k<<<rows * nv, 128>>>(o, z, w, nv, dv, eps);
}
extern "C" void kvd_cudaop_gather(const float *xn, const int *slots, int n, int K, float *gx,
                                  int H) {
    if (n > 0) gather_rows_k<<<n, 256>>>(xn, slots, K, gx, H);
}
extern "C" void kvd_cudaop_scatter(float *mix, const float *gy, const int *slots, const float *topw,
                                   int n, int K, int H) {
    if (n > 0) scatter_rows_k<<<n, 256>>>(mix, gy, slots, topw, K, H);
}
extern "C" void kvd_cudaop_linear_grouped(const float *x, const int *slots, int slot_div,
                                          const void *const *w_tab, const int *G, int max_groups,
                                          int max_rows, float *y, int N, int K) {
    grouped_launch<col_out::STORE>({x, slots, slot_div, w_tab, G, y, N, K, nullptr}, max_groups,
                                   max_rows);
}
extern "C" void kvd_cudaop_linear_grouped_swiglu(const float *x, const int *slots, int slot_div,
                                                 const void *const *gate_tab,
                                                 const void *const *up_tab, const int *G,
                                                 int max_groups, int max_rows, float *g, int N,
                                                 int K) {
    grouped_launch<col_out::SWIGLU>({x, slots, slot_div, gate_tab, G, g, N, K, up_tab}, max_groups,
                                    max_rows);
}
extern "C" void kvd_cudaop_scatter_grouped(float *mix, const float *gy, const int *slots,
                                           const float *topw, int K, const int *G, int rows,
                                           int H) {
    if (rows > 0 && H > 0)
        scatter_grouped_k<<<dim3((unsigned)rows, blocks_for((size_t)H, 256)), 256>>>(mix, gy, slots,
                                                                                     topw, K, G, H);
}
extern "C" void kvd_cudaop_expert_lists(const int *topi, int rows, int K, int E, int e0, int e1,
                                        int *slots, int *G) {
    if (rows > 0 && E > 0)
        expert_lists_k<<<1, 256, sizeof(int) * (size_t)E>>>(topi, rows, K, E, e0, e1, slots, G);
}
extern "C" void kvd_cudaop_add_gated(float *mix, const float *y, const float *gate, int rows,
                                     int H) {
    size_t n = (size_t)rows * H;
    add_gated_k<<<blocks_for(n, 256), 256>>>(mix, y, gate, H, n);
}
