// kvdrift: decode attention over a paged cache on the device, the CUDA twin
// of kernels/cpu/attention.c: the cache read as BF16 or FP8 blocks
// (dequantized in registers, scales folded into the logits and the output).
// Three decode versions, all held to the CPU kernel by tests/gpu:
//   v1  plain kernels, obviously right: one thread per position for the
//       scores, one block per query head for the softmax (sum in double),
//       one thread per output dimension for the weighted sum;
//   v2  split over the context (flash-decoding), a warp per position on
//       FP32 cores, online softmax, splits merged by a second kernel;
//   v3  split over the context on tensor cores (what the model runs): at
//       GQA 16 and head_dim 256 a query does 8192 multiply-adds per KV
//       position and head, which FP32 cores cannot do at the rate HBM
//       delivers FP8 rows; see the v3 section.
// Then the prefill kernel (tiled, online softmax) and the benchmark.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cuda_kernels.h"
#include "mma.cuh"

struct view {
    int fmt, block_size, kv_heads, head_dim;
    const unsigned char *k, *v;
    const float *k_scale, *v_scale;
};

// an E2M1 code (the low four bits) as a float
__device__ inline float e2m1_val(unsigned c) {
    const unsigned e = (c & 7u) >> 1;
    const float half_m = 0.5f * (float)(c & 1u);
    const float m = e ? (float)(1u << e) * 0.5f * (1.0f + half_m) : half_m;
    return c & 8u ? -m : m;
}

// value d of an NVFP4 row (fp8.h): its code times its group's block scale,
// exactly the CPU's e2m1 * sf
__device__ inline float nvfp4_val(const unsigned char *row, int hd, int d) {
    const unsigned byte = row[d / 2], c = d & 1 ? byte >> 4 : byte & 15u;
    const float sf = __half2float(__half(__nv_cvt_fp8_to_halfraw(row[hd / 2 + d / 16], __NV_E4M3)));
    return e2m1_val(c) * sf;
}

// a row-scaled row's own scale, the float at p, read a byte at a time (a
// pool's scales are 4-aligned only where head_dim is a multiple of 4)
__device__ inline float scale_bytes(const unsigned char *p) {
    return __uint_as_float((unsigned)p[0] | (unsigned)p[1] << 8 | (unsigned)p[2] << 16 |
                           (unsigned)p[3] << 24);
}

// a row-scaled row's scale word (its scale; I4T's with the zero point in
// its four low bits), at (seg, slot) of a pool
__device__ inline float scale_word(const view &kv, const unsigned char *pool, size_t seg,
                                   int slot) {
    return scale_bytes(pool + kvd_scaled_scale_at(kvd_fmt_code_bytes(kv.fmt, kv.head_dim),
                                                  kv.block_size, seg, slot));
}

// the scale of the row at (blk, head, slot) of a pool: its own in an E4M3T,
// I8T or I4T cache (fp8.h: after its block's codes; I4T's zero point's bits
// cleared), 1 in every other (whose scales are per head)
__device__ inline float row_scale(const view &kv, const unsigned char *pool, int blk, int head,
                                  int slot) {
    if (!kvd_fmt_row_scaled(kv.fmt)) return 1.0f;
    const float w = scale_word(kv, pool, (size_t)blk * kv.kv_heads + head, slot);
    return kv.fmt == KVD_FMT_I4T ? __uint_as_float(kvd_i4t_scale_bits(__float_as_uint(w))) : w;
}

// value d of the I4T row at (seg, slot): its code less the row's zero point
// (exact), unscaled
__device__ inline float i4t_val(const view &kv, const unsigned char *pool, size_t seg, int slot,
                                int d) {
    const unsigned byte =
        pool[kvd_scaled_codes_at((size_t)kv.head_dim / 2, kv.block_size, seg, slot) + d / 2];
    const int z = kvd_i4t_zero(__float_as_uint(scale_word(kv, pool, seg, slot)));
    return (float)((int)(d & 1 ? byte >> 4 : byte & 15u) - z);
}

// value d of the row at (blk, head, slot), times its group's block scale
// (NVFP4) but not its row's scale (E4M3T, I8T, I4T: row_scale)
__device__ inline float load_val(const view &kv, const unsigned char *pool, int blk, int head,
                                 int slot, int d) {
    const size_t r = ((size_t)blk * kv.kv_heads + head) * kv.block_size + slot;
    if (kv.fmt == KVD_FMT_NVFP4)
        return nvfp4_val(pool + r * (kv.head_dim / 2 + kv.head_dim / 16), kv.head_dim, d);
    if (kv.fmt == KVD_FMT_I4T) return i4t_val(kv, pool, (size_t)blk * kv.kv_heads + head, slot, d);
    if (kvd_fmt_row_scaled(kv.fmt)) {
        const size_t seg = (size_t)blk * kv.kv_heads + head;
        const unsigned char c =
            pool[kvd_scaled_codes_at(kv.head_dim, kv.block_size, seg, slot) + d];
        return kvd_fmt_int8(kv.fmt) ? (float)(signed char)c
                                    : __half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3)));
    }
    size_t idx = r * kv.head_dim + d;
    if (kv.fmt == KVD_FMT_BF16) {
        unsigned short u = reinterpret_cast<const unsigned short *>(pool)[idx];
        return __uint_as_float((unsigned)u << 16);
    }
    __half_raw h =
        __nv_cvt_fp8_to_halfraw(pool[idx], kv.fmt == KVD_FMT_E5M2 ? __NV_E5M2 : __NV_E4M3);
    return __half2float(__half(h));
}

__global__ void scores_kernel(view kv, const int *blocks, int n_ctx, const float *q, int n_heads,
                              float sm_scale, float *s) {
    int p = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y;
    int g = n_heads / kv.kv_heads;
    if (p >= n_ctx) return;
    int blk = blocks[p / kv.block_size], slot = p % kv.block_size;
    float kmul = sm_scale * kv.k_scale[h];
    for (int j = 0; j < g; j++) {
        const float *qj = q + (size_t)(h * g + j) * kv.head_dim;
        float dot = 0.0f;
        for (int d = 0; d < kv.head_dim; d++) dot += qj[d] * load_val(kv, kv.k, blk, h, slot, d);
        float x = dot * kmul;
        if (kvd_fmt_row_scaled(kv.fmt)) x *= row_scale(kv, kv.k, blk, h, slot);
        s[(size_t)(h * g + j) * n_ctx + p] = x;
    }
}

// 2^8 e in E4M3, times 2^-8: FlashAttention 3's FP8 weight (kvd_kv_view.p_fp8)
__device__ inline float fp8_weight(float e) {
    const __nv_fp8_storage_t c =
        __nv_cvt_float_to_fp8(__fmul_rn(256.0f, e), __NV_SATFINITE, __NV_E4M3);
    return __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))), 1.0f / 256);
}

// x[0, n) in place: exp(x - max) over their sum (in double), by one block of
// 256 threads with its shared red and dred; with fp8 each weight rounded
// (fp8_weight) over the sum of the unrounded ones
__device__ inline void softmax_row(float *x, int n_ctx, float *red, double *dred,
                                   bool fp8 = false) {
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n_ctx; i += blockDim.x) m = fmaxf(m, x[i]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    m = red[0];
    double sum = 0.0;
    for (int i = threadIdx.x; i < n_ctx; i += blockDim.x) {
        float e = expf(x[i] - m);
        x[i] = fp8 ? fp8_weight(e) : e;
        sum += e;
    }
    dred[threadIdx.x] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) dred[threadIdx.x] += dred[threadIdx.x + w];
        __syncthreads();
    }
    float inv = (float)(1.0 / dred[0]);
    for (int i = threadIdx.x; i < n_ctx; i += blockDim.x) x[i] *= inv;
}

__global__ void softmax_kernel(float *s, int n_ctx, bool fp8) {
    __shared__ float red[256];
    __shared__ double dred[256];
    softmax_row(s + (size_t)blockIdx.x * n_ctx, n_ctx, red, dred, fp8);
}

__global__ void pv_kernel(view kv, const int *blocks, int n_ctx, const float *s, int n_heads,
                          float *out) {
    int hq = blockIdx.x, d = threadIdx.x, g = n_heads / kv.kv_heads, h = hq / g;
    if (d >= kv.head_dim) return;
    const float *p = s + (size_t)hq * n_ctx;
    float acc = 0.0f;
    for (int t = 0; t < n_ctx; t++) {
        const int blk = blocks[t / kv.block_size], slot = t % kv.block_size;
        const float w =
            kvd_fmt_row_scaled(kv.fmt) ? p[t] * row_scale(kv, kv.v, blk, h, slot) : p[t];
        acc += w * load_val(kv, kv.v, blk, h, slot, d);
    }
    out[(size_t)hq * kv.head_dim + d] = acc * kv.v_scale[h];
}

// ---- v2: split over the context (flash-decoding) ----
// Grid (splits, kv_heads), 4 warps a CTA. A warp takes one position at a
// time: its 32 lanes read the K row and then the V row coalesced (hd / 32
// values each), reduce the G dot products with shuffles, and carry an
// online softmax (running max, sum, and the lanes' slices of the G outputs).
// The CTA merges its warps; a second kernel merges the splits.
#define V2_WARPS 4
#define V2_MAXG 16

// a lane's PER values of a row, as load_val gives them; returns the row's
// own scale (row_scale)
template <int PER>
__device__ inline float load_row(const view &kv, const unsigned char *pool, int blk, int head,
                                 int slot, int lane, float *x) {
    const size_t r = ((size_t)blk * kv.kv_heads + head) * kv.block_size + slot;
    size_t idx = r * kv.head_dim + lane * PER;
    if (kv.fmt == KVD_FMT_I4T) {
        const size_t seg = (size_t)blk * kv.kv_heads + head;
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = i4t_val(kv, pool, seg, slot, lane * PER + i);
        return row_scale(kv, pool, blk, head, slot);
    }
    if (kvd_fmt_row_scaled(kv.fmt)) {
        const size_t seg = (size_t)blk * kv.kv_heads + head;
        const unsigned char *p =
            pool + kvd_scaled_codes_at(kv.head_dim, kv.block_size, seg, slot) + lane * PER;
        if (kvd_fmt_int8(kv.fmt)) {
#pragma unroll
            for (int i = 0; i < PER; i++) x[i] = (float)(signed char)p[i];
        } else {
#pragma unroll
            for (int i = 0; i < PER; i++)
                x[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(p[i], __NV_E4M3)));
        }
        return scale_bytes(pool + kvd_scaled_scale_at(kv.head_dim, kv.block_size, seg, slot));
    }
    if (kv.fmt == KVD_FMT_NVFP4) {
        const unsigned char *row = pool + r * (kv.head_dim / 2 + kv.head_dim / 16);
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = nvfp4_val(row, kv.head_dim, lane * PER + i);
    } else if (kv.fmt == KVD_FMT_BF16) {
        const unsigned short *p = reinterpret_cast<const unsigned short *>(pool) + idx;
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = __uint_as_float((unsigned)p[i] << 16);
    } else {
        const unsigned char *p = pool + idx;
        __nv_fp8_interpretation_t f = kv.fmt == KVD_FMT_E5M2 ? __NV_E5M2 : __NV_E4M3;
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(p[i], f)));
    }
    return 1.0f;
}

// PER (values per lane) and G (query heads per KV head) are template
// parameters so the per-lane accumulators stay in registers.
template <int PER, int G>
__global__ void decode_v2(view kv, const int *blocks, int n_ctx, int per_split, const float *q,
                          float sm_scale, float *part_acc, float *part_m, float *part_l) {
    const int split = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int hd = kv.head_dim;
    const int t0 = split * per_split, t1 = min(n_ctx, t0 + per_split);
    __shared__ float sq[V2_MAXG * 256];
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) sq[i] = q[(size_t)h * G * hd + i];
    __syncthreads();
    const float kmul = sm_scale * kv.k_scale[h];
    float m[G], l[G], acc[G][PER];
#pragma unroll
    for (int j = 0; j < G; j++) {
        m[j] = -INFINITY, l[j] = 0.f;
#pragma unroll
        for (int i = 0; i < PER; i++) acc[j][i] = 0.f;
    }
    float kx[PER], vx[PER];
    for (int t = t0 + warp; t < t1; t += V2_WARPS) {
        int blk = blocks[t / kv.block_size], slot = t % kv.block_size;
        const float krs = load_row<PER>(kv, kv.k, blk, h, slot, lane, kx);
        const float vrs = load_row<PER>(kv, kv.v, blk, h, slot, lane, vx);
#pragma unroll
        for (int j = 0; j < G; j++) {
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < PER; i++) d += sq[j * hd + lane * PER + i] * kx[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            float s = d * kmul;
            if (kvd_fmt_row_scaled(kv.fmt)) s *= krs;
            const float mn = fmaxf(m[j], s);
            float sc = __expf(m[j] - mn), p = __expf(s - mn);
            l[j] = l[j] * sc + p;
            const float w = kvd_fmt_row_scaled(kv.fmt) ? p * vrs : p;
#pragma unroll
            for (int i = 0; i < PER; i++) acc[j][i] = acc[j][i] * sc + w * vx[i];
            m[j] = mn;
        }
    }
    // merge the warps of the CTA: each in turn adds its outputs, rescaled to
    // the CTA's maximum, into one shared accumulator
    __shared__ float wm[V2_WARPS][V2_MAXG];
    __shared__ float wl[V2_WARPS][V2_MAXG];
    __shared__ float sacc[V2_MAXG * 256];
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) sacc[i] = 0.f;
    if (lane == 0)
#pragma unroll
        for (int j = 0; j < G; j++) wm[warp][j] = m[j], wl[warp][j] = l[j];
    __syncthreads();
    for (int w = 0; w < V2_WARPS; w++) {
        if (warp == w)
#pragma unroll
            for (int j = 0; j < G; j++) {
                float M = -INFINITY;
                for (int u = 0; u < V2_WARPS; u++) M = fmaxf(M, wm[u][j]);
                float f = m[j] == -INFINITY ? 0.f : __expf(m[j] - M);
#pragma unroll
                for (int i = 0; i < PER; i++) sacc[j * hd + lane * PER + i] += acc[j][i] * f;
            }
        __syncthreads();
    }
    if (threadIdx.x < G) {
        int j = threadIdx.x;
        float M = -INFINITY, L = 0.f;
        for (int u = 0; u < V2_WARPS; u++) M = fmaxf(M, wm[u][j]);
        for (int u = 0; u < V2_WARPS; u++)
            if (wm[u][j] != -INFINITY) L += wl[u][j] * __expf(wm[u][j] - M);
        size_t o = ((size_t)split * kv.kv_heads + h) * G + j;
        part_m[o] = M;
        part_l[o] = L;
    }
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x)
        part_acc[((size_t)split * kv.kv_heads + h) * G * hd + i] = sacc[i];
}

// ---- merging a query head's splits ----
// A merge block takes MERGE_DIMS of a head's dims (grid z: hd / MERGE_DIMS
// rounded up) and 64 to 256 threads (merge_threads): lanes of one float4
// each across a split's dims, and as many groups of them as the splits ask
// for, each group summing every groups-th split. A split's row of partial
// results is G (hd + 2) floats (16 KB at G = 16, head_dim 256), so at C = 1
// the merge reads megabytes; one thread a dim, walking the splits in turn
// with an exponential per value, would leave it latency-bound, tens of
// microseconds against the attention's few.
constexpr int MERGE_DIMS = 64, MERGE_MAX_THREADS = 256;

// a block of want threads, a power of two from 64 to MERGE_MAX_THREADS
static unsigned block_of(long long want) {
    int nt = 64;
    while (nt < want && nt < MERGE_MAX_THREADS) nt *= 2;
    return (unsigned)nt;
}
static unsigned merge_threads(int splits, int hd) {
    return block_of((long long)(hd % 4 == 0 ? MERGE_DIMS / 4 : MERGE_DIMS) * splits);
}

static dim3 merge_grid(int n_heads, int entries, int hd) {
    return dim3((unsigned)n_heads, (unsigned)entries,
                (unsigned)((hd + MERGE_DIMS - 1) / MERGE_DIMS));
}

// the largest of query head hq's split maxima (m: [split][n_heads]), in
// every thread of the block (64, 128 or 256 of them)
__device__ inline float splits_max(int splits, int n_heads, int hq, const float *m) {
    __shared__ float red[MERGE_MAX_THREADS];
    float M = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += blockDim.x)
        M = fmaxf(M, m[(size_t)s * n_heads + hq]);
    red[threadIdx.x] = M;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    M = red[0];
    __syncthreads(); // red is free again
    return M;
}

// query head hq's output from its splits' partial results (layout [split]
// [n_heads] (x hd), head hq of KV head hq / G), dims MERGE_DIMS blockIdx.z
// on; the sums in double
__device__ inline void merge_splits(int splits, int kv_heads, int G, int hd, int hq,
                                    const float *part_acc, const float *part_m, const float *part_l,
                                    const float *v_scale, float *out) {
    __shared__ double red[MERGE_MAX_THREADS * 4];
    const int n_heads = kv_heads * G, tid = threadIdx.x, nt = blockDim.x;
    const float M = splits_max(splits, n_heads, hq, part_m);
    double L = 0.0;
    for (int s = tid; s < splits; s += nt) {
        const float ms = part_m[(size_t)s * n_heads + hq];
        if (ms != -INFINITY) L += (double)part_l[(size_t)s * n_heads + hq] * expf(ms - M);
    }
    red[tid] = L;
    __syncthreads();
    for (int w = nt / 2; w > 0; w >>= 1) {
        if (tid < w) red[tid] += red[tid + w];
        __syncthreads();
    }
    L = red[0];
    __syncthreads();

    const int d0 = blockIdx.z * MERGE_DIMS;
    const bool v4 = hd % 4 == 0 && ((uintptr_t)part_acc & 15) == 0;
    const int vec = v4 ? 4 : 1, lanes = MERGE_DIMS / vec, groups = nt / lanes;
    const int grp = tid / lanes, d = d0 + (tid % lanes) * vec;
    double a[4] = {0.0, 0.0, 0.0, 0.0};
    if (d < hd)
        for (int s = grp; s < splits; s += groups) {
            const float ms = part_m[(size_t)s * n_heads + hq];
            if (ms == -INFINITY) continue;
            const float w = expf(ms - M);
            const float *p = part_acc + ((size_t)s * n_heads + hq) * hd + d;
            if (v4) {
                const float4 x = *reinterpret_cast<const float4 *>(p);
                a[0] += (double)x.x * w, a[1] += (double)x.y * w;
                a[2] += (double)x.z * w, a[3] += (double)x.w * w;
            } else {
                a[0] += (double)p[0] * w;
            }
        }
    for (int k = 0; k < vec; k++) red[grp * MERGE_DIMS + (tid % lanes) * vec + k] = a[k];
    __syncthreads();
    if (tid < MERGE_DIMS && d0 + tid < hd) {
        double sum = 0.0;
        for (int g = 0; g < groups; g++) sum += red[g * MERGE_DIMS + tid];
        out[(size_t)hq * hd + d0 + tid] = (float)(sum / L) * v_scale[hq / G];
    }
}

__global__ void merge_v2(int splits, int kv_heads, int G, int hd, const float *part_acc,
                         const float *part_m, const float *part_l, const float *v_scale,
                         float *out) {
    merge_splits(splits, kv_heads, G, hd, blockIdx.x, part_acc, part_m, part_l, v_scale, out);
}

template <int PER>
static int launch_v2_per(const view &kv, const int *db, int n_ctx, int per_split, const float *dq,
                         int G, float sm_scale, float *pa, float *pm, float *pl) {
    dim3 grid((unsigned)((n_ctx + per_split - 1) / per_split), (unsigned)kv.kv_heads);
    unsigned th = 32 * V2_WARPS;
    switch (G) {
    case 1:
        decode_v2<PER, 1><<<grid, th>>>(kv, db, n_ctx, per_split, dq, sm_scale, pa, pm, pl);
        return 0;
    case 2:
        decode_v2<PER, 2><<<grid, th>>>(kv, db, n_ctx, per_split, dq, sm_scale, pa, pm, pl);
        return 0;
    case 4:
        decode_v2<PER, 4><<<grid, th>>>(kv, db, n_ctx, per_split, dq, sm_scale, pa, pm, pl);
        return 0;
    case 8:
        decode_v2<PER, 8><<<grid, th>>>(kv, db, n_ctx, per_split, dq, sm_scale, pa, pm, pl);
        return 0;
    case 16:
        decode_v2<PER, 16><<<grid, th>>>(kv, db, n_ctx, per_split, dq, sm_scale, pa, pm, pl);
        return 0;
    default:
        return -1;
    }
}

/* Launch v2 on device buffers; part buffers hold splits * n_heads (* hd). */
static int launch_v2(const view &kv, const int *db, int n_ctx, const float *dq, int n_heads,
                     float sm_scale, float *dout, int splits, float *pa, float *pm, float *pl) {
    int G = n_heads / kv.kv_heads, per = kv.head_dim / 32;
    int per_split = (n_ctx + splits - 1) / splits, rc;
    switch (per) {
    case 2:
        rc = launch_v2_per<2>(kv, db, n_ctx, per_split, dq, G, sm_scale, pa, pm, pl);
        break;
    case 4:
        rc = launch_v2_per<4>(kv, db, n_ctx, per_split, dq, G, sm_scale, pa, pm, pl);
        break;
    case 8:
        rc = launch_v2_per<8>(kv, db, n_ctx, per_split, dq, G, sm_scale, pa, pm, pl);
        break;
    default:
        return -1;
    }
    if (rc) return rc;
    const int splits_run = (n_ctx + per_split - 1) / per_split;
    merge_v2<<<merge_grid(n_heads, 1, kv.head_dim), merge_threads(splits_run, kv.head_dim)>>>(
        splits_run, kv.kv_heads, G, kv.head_dim, pa, pm, pl, kv.v_scale, dout);
    return 0;
}

// ---- v3: tensor cores (mma.sync m16n8k16) ----
// Grid (splits, kv_heads, batch entries), 4 warps a CTA; the G <= 16 query heads of a KV
// head are the 16 rows of every MMA (zero beyond G). The split's positions
// stream through shared memory in stages of 32 (cp.async, nstage buffers,
// zero-filled past the end; small enough that two CTAs share an SM and
// hide each other's start and end). Per stage:
//   - scores: warp w multiplies the query (its fragments kept in registers
//     all along) by the K rows of positions 8w .. 8w+7, all of head_dim;
//   - the 32 x 16 scores go through shared memory to every warp, which
//     takes the stage's row maxima and the probabilities (the same values in
//     every warp, so the running max and sum agree without further talk);
//   - values: warp w multiplies the probabilities of all 32 positions by
//     the V rows' columns of its quarter of head_dim (ldmatrix .trans).
// Precision: the cache's values are exact in the MMA's 16-bit format (BF16
// for a BF16 cache; FP16 for FP8 codes, E4M3 read times 2^-8), and the
// FP32 operands (query, probabilities) enter as hi + lo pairs, two MMAs
// each, so every product is carried to 16 (BF16) or 22 (FP16) significant
// bits and summed in FP32: the CPU's figures to ~1e-5 (BF16) and ~2e-6
// (FP8) relative, as tests/gpu measures. The K dims are
// taken in the order the loads give them (16 contiguous values a thread,
// regrouped per 16-dim chunk); the query's fragments use the same order.
// The online softmax of the tensor-core kernels, on the scores of 16 rows
// held as m16n8 accumulators (lane 4 g + t: rows g and g + 8), in log2
// units. A stage's row maxima mx (the lane's own) become the quad's, the
// running maximum m2 moves up to them, and the running sum l and the NT
// output tiles o are rescaled. A row with every position so far masked
// keeps m2 = -inf, l = 0 and o = 0 (a prefill split before the row's own
// positions).
template <int NT>
__device__ inline void softmax_rescale(float mx[2], float m2[2], float l[2], float (*o)[4]) {
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m2[r], mx[r]);
        alpha[r] = mn == -INFINITY ? 1.0f : exp2f(m2[r] - mn);
        m2[r] = mn;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < NT; i++) {
        o[i][0] *= alpha[0], o[i][1] *= alpha[0];
        o[i][2] *= alpha[1], o[i][3] *= alpha[1];
    }
}
// The probabilities of two score tiles (positions 16 kc .. +15), added to l
// and scaled, as the hi and lo A fragments of the values' MMAs: a0 a1 from
// the first tile, a2 a3 from the second. The lane's column 2t + c of tile
// nt is scaled by pmul[nt][c] (pscale, or pscale times the position's V row
// scale).
template <bool F16>
__device__ inline void prob_frags(const float (*sv)[4], const float m2[2], float l[2],
                                  const float pmul[2][2], unsigned pa[2][4]) {
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            p[nt][e] = exp2f(sv[nt][e] - (m2[e / 2] == -INFINITY ? 0.0f : m2[e / 2]));
            l[e / 2] += p[nt][e];
            p[nt][e] *= pmul[nt][e & 1];
        }
    kvd_mma::split2<F16>(p[0][0], p[0][1], &pa[0][0], &pa[1][0]);
    kvd_mma::split2<F16>(p[0][2], p[0][3], &pa[0][1], &pa[1][1]);
    kvd_mma::split2<F16>(p[1][0], p[1][1], &pa[0][2], &pa[1][2]);
    kvd_mma::split2<F16>(p[1][2], p[1][3], &pa[0][3], &pa[1][3]);
}
// FP8 attention's weights of two score tiles against the row's maximum m2
// over the whole context (fixed, so nothing is rescaled): the unrounded
// weights added to l, each rounded as fp8_weight and scaled by pscale, as
// the A fragment of the values' MMAs. A rounded weight is exact in the
// MMA's 16-bit format (4 significant bits, 2^-17 .. 1 times pscale), so it
// needs no lo half.
template <bool F16>
__device__ inline void prob_frags_fp8(const float (*sv)[4], const float m2[2], float l[2],
                                      float pscale, unsigned pa[4]) {
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float w = exp2f(sv[nt][e] - (m2[e / 2] == -INFINITY ? 0.0f : m2[e / 2]));
            l[e / 2] += w;
            p[nt][e] = fp8_weight(w) * pscale;
        }
    unsigned lo;
    kvd_mma::split2<F16>(p[0][0], p[0][1], &pa[0], &lo);
    kvd_mma::split2<F16>(p[0][2], p[0][3], &pa[1], &lo);
    kvd_mma::split2<F16>(p[1][0], p[1][1], &pa[2], &lo);
    kvd_mma::split2<F16>(p[1][2], p[1][3], &pa[3], &lo);
}

// The tensor-core kernels' passes (template MODE). FP8 attention rounds
// each weight against its row's maximum over the whole context, which a
// split cannot know, so it takes two passes over the cache:
//   - PASS_MAX: the scores only (K rows, no V), each split's row maxima
//     (log2 units), reduced over the splits by a small kernel;
//   - PASS_FP8: that maximum fixed from the start (no rescaling), the
//     weights rounded to E4M3 (prob_frags_fp8), their sum unrounded.
// Both passes compute every score by the same instructions, so the maximum
// is one of the scores the second pass weighs, bit for bit.
enum { PASS_PLAIN = 0, PASS_MAX = 1, PASS_FP8 = 2 };

namespace v3 {
// TPW n8 tiles of positions a warp for the scores; a stage is 8 TPW WARPS
// positions, STAGE / 16 chunks of the values' MMAs
constexpr int WARPS = 4, TPW = 1, NTILE = WARPS * TPW, STAGE = 8 * NTILE, SBUF = NTILE * 32 * 16;
constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

__host__ __device__ constexpr int row_bytes(int hd, bool fp8) {
    return hd * (fp8 ? 1 : 2);
}
// E4M3T and I8T (fp8.h, kvd_fmt_row_scaled): E4M3 or INT8 codes, each row
// with its own float scale (in the pools after its block's codes). A stage
// holds the row's codes as E4M3's
// (INT8's: the same bytes, read as integers) and its scale in the padding
// after them (row_scale_in), which both strides leave (static_assert in the
// kernels); the scores take the K rows' scales after the first MMAs, the
// probabilities the V rows' before the second.
//
// NVFP4 rows (fp8.h) are staged whole, as the pools keep them: HD / 2 bytes
// of E2M1 codes, then the HD / 16 E4M3 block scales. The scores and values
// take each pair of codes into FP16 (e2m1_pair) and multiply it by its
// group's block scale, read as E4M3's times 2^-8 (hmul2): the product, code
// times scale times 2^-8, is exact in FP16 (at most 6 significant bits, a
// multiple of 2^-18 under 11).
//
// A row's bytes in the pools: its codes, the row-scaled formats' scale,
// NVFP4's block scales
__host__ __device__ constexpr int pool_row_bytes(int hd, int fmt) {
    return fmt == KVD_FMT_NVFP4      ? (int)kvd_nvfp4_row_bytes(hd)
           : kvd_fmt_row_scaled(fmt) ? (int)kvd_scaled_row_bytes(hd)
                                     : row_bytes(hd, fmt != KVD_FMT_BF16);
}
// whether a format's B operands read its values times 2^-8 (E4M3's codes,
// under per-head scales or their own, and NVFP4's block scales), which the
// scores and outputs undo
__host__ __device__ constexpr bool codes_2m8(int fmt) {
    return fmt == KVD_FMT_E4M3 || fmt == KVD_FMT_E4M3T || fmt == KVD_FMT_NVFP4;
}
// two 8-bit codes of a word (the bytes sel puts at bytes 1 and 3) as an
// FP16 pair, exactly: E4M3's read times 2^-8, E5M2's and INT8's as they are
template <int FMT> __device__ inline unsigned codes_pair(unsigned w, unsigned sel) {
    if constexpr (kvd_fmt_int8(FMT))
        return kvd_mma::int8_pair(w, sel);
    else
        return kvd_mma::fp8_pair<FMT == KVD_FMT_E5M2>(w, sel);
}
// the scale a stage's row (K or V, at `row`, head_dim hd) carries
__device__ inline float row_scale_in(const unsigned char *row, int hd) {
    return *reinterpret_cast<const float *>(row + hd);
}
// With row scales the values' A operands are probabilities times V row
// scales, which must stay in FP16's range: a stage's probability scale
// pscale is its own power of two, which keeps the products of its largest
// V row scale (vs: the stage's V rows, vstr apart; lane l reads position
// l's, zero past the end) under 2^14. The NT output tiles o move with it,
// exactly (a power of two). Every lane of the warp calls it.
template <int NT>
__device__ inline void stage_pscale(const unsigned char *vs, int vstr, int hd, int lane,
                                    float &pscale, float (*o)[4]) {
    static_assert(STAGE == 32, "a lane a position");
    float vmax = row_scale_in(vs + lane * vstr, hd);
    for (int off = 16; off > 0; off >>= 1)
        vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, off));
    int ex = 0;
    frexpf(vmax, &ex); // vmax < 2^ex
    const float ps = ldexpf(1.0f, 14 - ex);
    if (ps == pscale) return;
    const float r = ps / pscale;
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] *= r, o[i][1] *= r, o[i][2] *= r, o[i][3] *= r;
    pscale = ps;
}
// prob_frags' multipliers for score tiles 2 kc and 2 kc + 1 (the lane's
// columns 2 t and 2 t + 1 of each): pscale, times the position's V row
// scale with RS
template <bool RS>
__device__ inline void prob_muls(const unsigned char *vs, int vstr, int hd, int kc, int t,
                                 float pscale, float pmul[2][2]) {
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            pmul[nt][c] = pscale;
            if constexpr (RS)
                pmul[nt][c] *= row_scale_in(vs + (8 * (2 * kc + nt) + 2 * t + c) * vstr, hd);
        }
}
// row strides in shared memory, conflict-free for the fragment loads: the K
// reads (16 or 32 bytes a thread, two rows a quarter-warp) want rows 64
// (FP8) or 16 (BF16) bytes apart modulo 128; ldmatrix's 8 rows want strides
// of an odd multiple of 16 bytes. Row-scaled rows (rs) keep their scale
// after the codes: a K row of 64 codes then moves 128 bytes further.
__host__ __device__ constexpr int kstride(int hd, bool fp8, bool rs = false) {
    return fp8 ? row_bytes(hd, fp8) + (192 - row_bytes(hd, fp8) % 128) % 128 +
                     (rs && row_bytes(hd, fp8) % 128 == 64 ? 128 : 0)
               : row_bytes(hd, fp8) + 16;
}
__host__ __device__ constexpr int vstride(int hd, bool fp8) {
    return row_bytes(hd, fp8) % 32 == 0 ? row_bytes(hd, fp8) + 16 : row_bytes(hd, fp8);
}
// bytes rounded up to an odd multiple of unit
__host__ __device__ constexpr int odd_multiple(int bytes, int unit) {
    return (bytes + unit - 1) / unit % 2 ? (bytes + unit - 1) / unit * unit
                                         : (bytes + unit - 1) / unit * unit + unit;
}
// the strides for a cache of format fmt: NVFP4's K rows are read 8 bytes a
// thread, four rows a half-warp, which want rows an odd multiple of 32
// bytes apart; its V rows, as the others', an odd multiple of 16
__host__ __device__ constexpr int kstride_of(int hd, int fmt) {
    return fmt == KVD_FMT_NVFP4 ? odd_multiple(pool_row_bytes(hd, fmt), 32)
                                : kstride(hd, fmt != KVD_FMT_BF16, kvd_fmt_row_scaled(fmt));
}
__host__ __device__ constexpr int vstride_of(int hd, int fmt) {
    return fmt == KVD_FMT_NVFP4 ? odd_multiple(pool_row_bytes(hd, fmt), 16)
                                : vstride(hd, fmt != KVD_FMT_BF16);
}
// a stage's bytes for a cache of format fmt
__host__ __device__ constexpr int fmt_stage_bytes(int hd, int fmt) {
    return STAGE * (kstride_of(hd, fmt) + vstride_of(hd, fmt));
}
// the bytes a CTA takes beside its stages: the scores' exchange (SBUF), and
// what the query (up to 16 rows of hd floats, read into the last stage's
// buffer before the loop) needs past that buffer where a stage is smaller
// (NVFP4's, 9.5 KB at head_dim 256)
__host__ __device__ constexpr int query_extra(int hd, int fmt) {
    return 16 * hd * 4 > fmt_stage_bytes(hd, fmt) ? 16 * hd * 4 - fmt_stage_bytes(hd, fmt) : 0;
}
__host__ __device__ constexpr int fixed_bytes(int hd, int fmt) {
    return SBUF + query_extra(hd, fmt);
}
// the bytes load_stage copies at a time: a row's codes 16 (and a row-scaled
// row's scale 4), NVFP4's rows of 72 bytes (head_dim 128) 8, of 36 (64) 4
__host__ __device__ constexpr int copy_bytes(int hd, int fmt) {
    return kvd_fmt_row_scaled(fmt) || pool_row_bytes(hd, fmt) % 16 == 0 ? 16
           : pool_row_bytes(hd, fmt) % 8 == 0                           ? 8
                                                                        : 4;
}

// K and V rows of positions p0 .. p0 + STAGE - 1 of KV head h into a
// stage's buffers ks and vs, by cp.async from the THREADS threads of the
// CTA; positions from t1 on are zero-filled. A row's codes (HD values of
// format FMT; NVFP4's with their block scales) copy_bytes at a time; a
// row-scaled format's row also its scale, from after its block's codes in
// the pool (fp8.h), to just after its codes in the stage (row_scale_in).
template <int HD, int FMT, int KSTR, int VSTR, int THREADS, bool WITH_V = true>
__device__ inline void load_stage(const view &kv, const int *blocks, int h, int p0, int t1,
                                  unsigned char *ks, unsigned char *vs) {
    constexpr bool RS = kvd_fmt_row_scaled(FMT);
    constexpr int ROWB = pool_row_bytes(HD, FMT), CODES = RS ? HD : ROWB;
    constexpr int CW = copy_bytes(HD, FMT), CPR = CODES / CW;
    static_assert(CODES % CW == 0, "a row's codes in whole copies");
    const int bs = kv.block_size;
    for (int e = threadIdx.x; e < STAGE * CPR; e += THREADS) {
        const int r = e / CPR, c = e % CPR, p = p0 + r;
        const bool in = p < t1;
        size_t off = 0;
        if (in) {
            const size_t seg = (size_t)blocks[p / bs] * kv.kv_heads + h;
            off = (RS ? kvd_scaled_codes_at(HD, bs, seg, p % bs) : (seg * bs + p % bs) * ROWB) +
                  CW * c;
        }
        kvd_mma::cp_async<CW>(ks + r * KSTR + CW * c, kv.k + off, in ? CW : 0);
        if constexpr (WITH_V)
            kvd_mma::cp_async<CW>(vs + r * VSTR + CW * c, kv.v + off, in ? CW : 0);
    }
    if constexpr (RS) // and each row's scale
        for (int r = threadIdx.x; r < STAGE; r += THREADS) {
            const int p = p0 + r;
            const bool in = p < t1;
            size_t off = 0;
            if (in)
                off = kvd_scaled_scale_at(HD, bs, (size_t)blocks[p / bs] * kv.kv_heads + h, p % bs);
            kvd_mma::cp_async<4>(ks + r * KSTR + HD, kv.k + off, in ? 4 : 0);
            if constexpr (WITH_V) kvd_mma::cp_async<4>(vs + r * VSTR + HD, kv.v + off, in ? 4 : 0);
        }
}

// Where a launch's queries are, entry z of three kinds:
//   - one query (seqs and ctx null): block table btab, n_ctx positions, the
//     query at q, the output at out;
//   - a step's batch entries (seqs set; device arrays): entry z is row
//     row0[z] at position pos[row0[z]] of sequence seqs[z], whose block
//     table is btab + seqs[z] * btab_stride; entries of more than one token
//     are someone else's. Query and output are that row's, qstride apart;
//   - listed rows of one sequence (seqs null, ctx set: the drift figures'
//     sampled rows): entry z is query row row0[z] over ctx[z] positions of
//     btab, its output the z-th, ostride apart.
// A split past its entry's context does nothing; entry z's partial results
// start at split z * max_splits.
struct rows {
    const int *seqs, *row0, *ntok, *pos;
    const int *btab;
    int btab_stride, n_ctx, max_splits, qstride;
    const int *ctx;
    int ostride;
};

// entry z's block table, context, query row and output row; false for an
// entry that is not a one-token decode
__device__ inline bool row_of(const rows &R, int z, const int **blocks, int *n_ctx, int *qrow,
                              int *orow) {
    if (!R.seqs) {
        *blocks = R.btab;
        *n_ctx = R.ctx ? R.ctx[z] : R.n_ctx;
        *qrow = R.ctx ? R.row0[z] : 0;
        *orow = z;
        return true;
    }
    if (R.ntok[z] != 1) return false;
    *qrow = *orow = R.row0[z];
    *n_ctx = R.pos[*qrow] + 1;
    *blocks = R.btab + (size_t)R.seqs[z] * R.btab_stride;
    return true;
}

// MODE (PASS_*): PASS_MAX leaves each split's row maxima in part_m (log2
// units) and nothing else; PASS_FP8 takes entry z's row maxima (log2 units)
// from rowmax + z n_heads
template <int HD, int FMT, int MODE>
__global__ void __launch_bounds__(WARPS * 32, 2)
    decode_v3(view kv, rows R, int per_split, int nstage, int G, const float *q, float sm_scale,
              const float *rowmax, float *part_acc, float *part_m, float *part_l) {
    using namespace kvd_mma;
    constexpr bool F16 = FMT != KVD_FMT_BF16, RS = kvd_fmt_row_scaled(FMT), E4 = codes_2m8(FMT);
    constexpr bool NV = FMT == KVD_FMT_NVFP4;
    constexpr int KSTR = kstride_of(HD, FMT), VSTR = vstride_of(HD, FMT);
    constexpr int NCH = HD / 16, SLICE = HD / WARPS, NT = SLICE / 8;
    constexpr int GROWB = pool_row_bytes(HD, FMT);
    static_assert(KSTR >= GROWB && VSTR >= GROWB, "a stage row holds a pool row");
    static_assert(!(RS || NV) || MODE == PASS_PLAIN, "FP8 attention takes one scale a head");
    static_assert(!NV || SLICE % 32 == 0, "a warp's NVFP4 values in 16-byte rows of codes");
    extern __shared__ uint4 smem_u4[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(smem_u4);
    // stage buffer i (K rows, then V rows); the scores' exchange after the last
    auto buffer = [&](int i) { return smem + (size_t)i * STAGE * (KSTR + VSTR); };
    float *sbuf = reinterpret_cast<float *>(buffer(nstage) + query_extra(HD, FMT));
    // entries vary fastest: the listed rows of one sequence read the same
    // K and V rows at the same time, once from HBM and then from L2
    const int z = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int *blocks;
    int n_ctx, qrow, orow;
    if (!row_of(R, z, &blocks, &n_ctx, &qrow, &orow)) return;
    const int t0 = split * per_split, t1 = min(n_ctx, t0 + per_split);
    if (t0 >= t1) return;
    const int nst = (t1 - t0 + STAGE - 1) / STAGE;
    q += (size_t)qrow * R.qstride;
    const size_t zsplit = (size_t)z * R.max_splits + split;

    // stage st's K and V rows into buffer st % nstage
    auto issue = [&](int st) {
        unsigned char *ks = buffer(st % nstage);
        load_stage<HD, FMT, KSTR, VSTR, WARPS * 32, MODE != PASS_MAX>(
            kv, blocks, h, t0 + st * STAGE, t1, ks, ks + STAGE * KSTR);
    };
    for (int st = 0; st < nstage - 1; st++) {
        if (st < nst) issue(st);
        cp_async_commit();
    }

    // the query's G rows, read from global memory once a CTA into the last
    // stage buffer and past it (query_extra; its first cp.async is issued
    // after the loop's first barrier), with their largest magnitude
    float *qs = reinterpret_cast<float *>(buffer(nstage - 1));
    const float *qh = q + (size_t)h * G * HD;
    float mx = 0.0f;
    for (int i = threadIdx.x; i < G * HD; i += WARPS * 32) {
        const float v = qh[i];
        qs[i] = v;
        mx = fmaxf(mx, fabsf(v));
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) sbuf[warp] = mx;
    __syncthreads();
    mx = fmaxf(fmaxf(sbuf[0], sbuf[1]), fmaxf(sbuf[2], sbuf[3]));
    // its fragments, hi and lo; FP16 takes it scaled by a power of two that
    // puts its largest magnitude just under 2^14
    float qscale = 1.0f;
    if constexpr (F16) {
        int e = 0;
        frexpf(mx, &e);
        if (mx > 0.0f && mx < INFINITY) qscale = ldexpf(1.0f, 14 - e);
    }
    // The K operands of chunk c = 4 i + j are the lane's dims 64 i + 16 t
    // + 4 j .. + 3 (NVFP4: 64 i + 16 t + j, + 4, + 8, + 12, the pairs its
    // group's two words give), for k = 2t, 2t + 1, 2t + 8, 2t + 9
    unsigned qa[NCH][2][4];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        const int d = 64 * (c / 4) + 16 * t + (NV ? c % 4 : 4 * (c % 4));
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int row = g + 8 * rr;
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (row < G && NV) {
                const float *qr = qs + row * HD + d;
                x[0] = qr[0] * qscale, x[1] = qr[4] * qscale, x[2] = qr[8] * qscale,
                x[3] = qr[12] * qscale;
            } else if (row < G) {
                const float4 v = *reinterpret_cast<const float4 *>(qs + row * HD + d);
                x[0] = v.x * qscale, x[1] = v.y * qscale, x[2] = v.z * qscale, x[3] = v.w * qscale;
            }
            split2<F16>(x[0], x[1], &qa[c][0][rr], &qa[c][1][rr]);
            split2<F16>(x[2], x[3], &qa[c][0][2 + rr], &qa[c][1][2 + rr]);
        }
    }
    // scores in log2 units; the B operands' 2^-8 (codes_2m8) and the query's
    // scale undone
    const float kmul2 = sm_scale * kv.k_scale[h] * LOG2E * (E4 ? 256.0f : 1.0f) / qscale;
    // probabilities into FP16's normal range. With row scales (RS) the
    // values' A operands are probabilities times V row scales: pscale is
    // then a stage's own power of two that keeps its largest row scale's
    // products under 2^14, and o moves with it (exactly: powers of two)
    float pscale = F16 ? 16384.0f : 1.0f;

    float o[NT][4], m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    if constexpr (MODE == PASS_FP8)
        for (int r = 0; r < 2; r++)
            if (g + 8 * r < G) m2[r] = rowmax[((size_t)z * kv.kv_heads + h) * G + g + 8 * r];

    for (int st = 0; st < nst; st++) {
        cp_async_wait(nstage - 2);
        __syncthreads(); // stage st is in; every warp is done with stage st - 1
        if (st + nstage - 1 < nst) issue(st + nstage - 1);
        cp_async_commit();
        const unsigned char *ks = buffer(st % nstage), *vs = ks + STAGE * KSTR;
        const int nvalid = min(STAGE, t1 - (t0 + st * STAGE));

        // scores of positions 8 (TPW warp + nt) + g (TPW n8 tiles), hi and lo apart
        float s[TPW][2][4] = {};
        if constexpr (NV) {
#pragma unroll
            for (int i = 0; i < HD / 64; i++) {
                // NVFP4: the lane's 16 codes (one group: 8 bytes) and their
                // block scale, in both halves of an FP16 pair
#pragma unroll
                for (int nt = 0; nt < TPW; nt++) {
                    const unsigned char *krow = ks + (8 * (TPW * warp + nt) + g) * KSTR;
                    const uint2 x = *reinterpret_cast<const uint2 *>(krow + 32 * i + 8 * t);
                    const unsigned sf = fp8_pair<false>(krow[HD / 2 + 4 * i + t], 0x0404u);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const unsigned b[2] = {hmul2(e2m1_pair(x.x << (12 - 4 * j)), sf),
                                               hmul2(e2m1_pair(x.y << (12 - 4 * j)), sf)};
                        mma<true>(s[nt][0], qa[4 * i + j][0], b);
                        mma<true>(s[nt][1], qa[4 * i + j][1], b);
                    }
                }
            }
        } else {
#pragma unroll
            for (int i = 0; i < HD / 64; i++) {
                unsigned w[TPW][F16 ? 4 : 8];
#pragma unroll
                for (int nt = 0; nt < TPW; nt++) {
                    const unsigned char *krow = ks + (8 * (TPW * warp + nt) + g) * KSTR;
                    if constexpr (F16) {
                        uint4 x = *reinterpret_cast<const uint4 *>(krow + 64 * i + 16 * t);
                        w[nt][0] = x.x, w[nt][1] = x.y, w[nt][2] = x.z, w[nt][3] = x.w;
                    } else {
                        uint4 x = *reinterpret_cast<const uint4 *>(krow + 128 * i + 32 * t);
                        uint4 y = *reinterpret_cast<const uint4 *>(krow + 128 * i + 32 * t + 16);
                        w[nt][0] = x.x, w[nt][1] = x.y, w[nt][2] = x.z, w[nt][3] = x.w;
                        w[nt][4] = y.x, w[nt][5] = y.y, w[nt][6] = y.z, w[nt][7] = y.w;
                    }
                }
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int nt = 0; nt < TPW; nt++) {
                        unsigned b[2];
                        if constexpr (F16) {
                            b[0] = codes_pair<FMT>(w[nt][j], 0x1404u);
                            b[1] = codes_pair<FMT>(w[nt][j], 0x3424u);
                        } else {
                            b[0] = w[nt][2 * j], b[1] = w[nt][2 * j + 1];
                        }
                        mma<F16>(s[nt][0], qa[4 * i + j][0], b);
                        mma<F16>(s[nt][1], qa[4 * i + j][1], b);
                    }
            }
        }
        if constexpr (MODE == PASS_MAX) { // the warp's own positions' maxima only
#pragma unroll
            for (int nt = 0; nt < TPW; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int pos = 8 * (TPW * warp + nt) + 2 * t + (e & 1);
                    if (pos < nvalid)
                        m2[e / 2] = fmaxf(m2[e / 2], (s[nt][0][e] + s[nt][1][e]) * kmul2);
                }
        } else {
            // to every warp: [tile][lane][4]
#pragma unroll
            for (int nt = 0; nt < TPW; nt++) {
                float4 v;
                float *vv = &v.x;
                for (int e = 0; e < 4; e++) {
                    const int pos = 8 * (TPW * warp + nt) + 2 * t + (e & 1);
                    float x = (s[nt][0][e] + s[nt][1][e]) * kmul2;
                    if constexpr (RS) x *= row_scale_in(ks + pos * KSTR, HD);
                    vv[e] = pos < nvalid ? x : -INFINITY;
                }
                *reinterpret_cast<float4 *>(sbuf + ((TPW * warp + nt) * 32 + lane) * 4) = v;
            }
            __syncthreads();
            float sv[NTILE][4];
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int tile = 0; tile < NTILE; tile++) {
                float4 v = *reinterpret_cast<const float4 *>(sbuf + (tile * 32 + lane) * 4);
                sv[tile][0] = v.x, sv[tile][1] = v.y, sv[tile][2] = v.z, sv[tile][3] = v.w;
                mx[0] = fmaxf(mx[0], fmaxf(v.x, v.y));
                mx[1] = fmaxf(mx[1], fmaxf(v.z, v.w));
            }
            if constexpr (MODE == PASS_PLAIN) softmax_rescale<NT>(mx, m2, l, o);
            if constexpr (RS) stage_pscale<NT>(vs, VSTR, HD, lane, pscale, o);
#pragma unroll
            for (int kc = 0; kc < STAGE / 16; kc++) { // tiles 2 kc and 2 kc + 1
                unsigned pa[2][4];
                float pmul[2][2];
                prob_muls<RS>(vs, VSTR, HD, kc, t, pscale, pmul);
                if constexpr (MODE == PASS_FP8)
                    prob_frags_fp8<F16>(sv + 2 * kc, m2, l, pscale, pa[0]);
                else
                    prob_frags<F16>(sv + 2 * kc, m2, l, pmul, pa);
                constexpr bool LO = MODE != PASS_FP8; // rounded weights have no lo half
                const unsigned char *vrow = vs + (16 * kc + (lane & 15)) * VSTR;
                if constexpr (NV) {
#pragma unroll
                    for (int i = 0; i < SLICE / 32; i++) { // 32 dims: four tiles, 4 col + q
                        const int ch = warp * SLICE / 32 + i;
                        unsigned r[2];
                        ldsm_x2_trans(r, vrow + ch * 16);
                        // the block scales of the lane's positions 2t, 2t + 1
                        // (r[0]) and 2t + 8, 2t + 9 (r[1]) at its dims' group
                        const unsigned char *sc =
                            vs + (16 * kc + 2 * t) * VSTR + HD / 2 + 2 * ch + g / 4;
                        const unsigned s0 = fp8_pair<false>(sc[0] | sc[VSTR] << 16, 0x2404u);
                        const unsigned s1 =
                            fp8_pair<false>(sc[8 * VSTR] | sc[9 * VSTR] << 16, 0x2404u);
#pragma unroll
                        for (int qd = 0; qd < 4; qd++) {
                            const unsigned b[2] = {hmul2(e2m1_pair(r[0] << (12 - 4 * qd)), s0),
                                                   hmul2(e2m1_pair(r[1] << (12 - 4 * qd)), s1)};
                            mma<true>(o[4 * i + qd], pa[0], b);
                            if constexpr (LO) mma<true>(o[4 * i + qd], pa[1], b);
                        }
                    }
                } else if constexpr (!F16) {
#pragma unroll
                    for (int i = 0; i < NT; i++) { // 8 dims a tile
                        unsigned b[2];
                        ldsm_x2_trans(b, vrow + (warp * SLICE / 8 + i) * 16);
                        mma<false>(o[i], pa[0], b);
                        if constexpr (LO) mma<false>(o[i], pa[1], b);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < NT / 2; i++) { // 16 dims: even and odd ones
                        unsigned r[2];
                        ldsm_x2_trans(r, vrow + (warp * SLICE / 16 + i) * 16);
                        unsigned be[2] = {codes_pair<FMT>(r[0], 0x2404u),
                                          codes_pair<FMT>(r[1], 0x2404u)};
                        unsigned bo[2] = {codes_pair<FMT>(r[0], 0x3414u),
                                          codes_pair<FMT>(r[1], 0x3414u)};
                        mma<true>(o[2 * i], pa[0], be);
                        if constexpr (LO) mma<true>(o[2 * i], pa[1], be);
                        mma<true>(o[2 * i + 1], pa[0], bo);
                        if constexpr (LO) mma<true>(o[2 * i + 1], pa[1], bo);
                    }
                }
            }
        }
    }
    cp_async_wait(0);

    if constexpr (MODE == PASS_MAX) { // the split's row maxima: over the quad, then the warps
        const size_t base = (zsplit * kv.kv_heads + h) * G;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            m2[r] = fmaxf(m2[r], __shfl_xor_sync(0xffffffffu, m2[r], 1));
            m2[r] = fmaxf(m2[r], __shfl_xor_sync(0xffffffffu, m2[r], 2));
            if (t == 0) sbuf[warp * 16 + g + 8 * r] = m2[r];
        }
        __syncthreads();
        if (threadIdx.x < (unsigned)G)
            part_m[base + threadIdx.x] =
                fmaxf(fmaxf(sbuf[threadIdx.x], sbuf[16 + threadIdx.x]),
                      fmaxf(sbuf[32 + threadIdx.x], sbuf[48 + threadIdx.x]));
    } else { // the split's partial results, as decode_v2 leaves them for merge_v2
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const float unscale = (E4 ? 256.0f : 1.0f) / pscale;
        const size_t base = (zsplit * kv.kv_heads + h) * G;
#pragma unroll
        for (int i = 0; i < NT; i++)
            for (int e = 0; e < 4; e++) {
                const int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
                if (row >= G) continue;
                const int dim = NV    ? warp * SLICE + 32 * (i / 4) + 4 * col + i % 4
                                : F16 ? warp * SLICE + 16 * (i / 2) + 2 * col + (i & 1)
                                      : warp * SLICE + 8 * i + col;
                part_acc[(base + row) * HD + dim] = o[i][e] * unscale;
            }
        if (warp == 0 && t == 0)
            for (int r = 0; r < 2; r++)
                if (g + 8 * r < G) {
                    part_m[base + g + 8 * r] = nst ? m2[r] * LN2 : -INFINITY;
                    part_l[base + g + 8 * r] = l[r];
                }
    }
}

// the device's limits, once per device
struct dev_limits {
    int dev, sms, smem_optin, smem_sm;
    size_t l2; // bytes of L2 (0: not reported)
};
static dev_limits limits_of_current() {
    static dev_limits cache[16];
    int dev = 0;
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= 16) dev = 0;
    if (!cache[dev].sms) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, dev) == cudaSuccess)
            cache[dev] = {dev, p.multiProcessorCount > 0 ? p.multiProcessorCount : 1,
                          (int)p.sharedMemPerBlockOptin, (int)p.sharedMemPerMultiprocessor,
                          p.l2CacheSize > 0 ? (size_t)p.l2CacheSize : 0};
        else
            cache[dev] = {dev, 1, 48 * 1024, 48 * 1024, 0};
    }
    return cache[dev];
}

// the benchmark's overrides of stages and split length (0: chosen as below;
// fewer than 2 stages: no v3)
static int bench_nstage = 0, bench_per_split = 0;

// stage buffers of sb bytes a CTA takes beside its fixed bytes, at most 4:
// as many as let two CTAs share an SM (1 KB a CTA is the system's), else
// as many as one CTA may have
static int stages_fitting(int sb, int fixed) {
    const dev_limits d = limits_of_current();
    const int two = (min(d.smem_sm / 2, d.smem_optin) - 1024 - fixed) / sb;
    return min(4, two >= 2 ? two : (d.smem_optin - fixed) / sb);
}

static int stages_for(int hd, int fmt) {
    const int sb = fmt_stage_bytes(hd, fmt), fixed = fixed_bytes(hd, fmt);
    if (bench_nstage) // as asked, or none where that does not fit
        return bench_nstage * sb + fixed <= limits_of_current().smem_optin ? bench_nstage : 0;
    return stages_fitting(sb, fixed);
}

// a kernel's shared-memory opt-in, asked for when it changes (opted: the
// kernel's size per device)
template <class F> static bool opt_in(F *kernel, size_t shm, size_t opted[16]) {
    const int dev = limits_of_current().dev;
    if (opted[dev] == shm) return true;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm) !=
        cudaSuccess)
        return false;
    opted[dev] = shm;
    return true;
}

// CTAs of v3 an SM holds at once: two where their stages leave room (the
// launch bounds' two), else one
static int ctas_per_sm(int hd, int fmt) {
    const int shm = stages_for(hd, fmt) * fmt_stage_bytes(hd, fmt) + fixed_bytes(hd, fmt);
    return limits_of_current().smem_sm >= 2 * (shm + 1024) ? 2 : 1;
}

// positions a split: the fewest (128 times a power of two) whose grid of n
// entries of up to max_ctx positions still runs in one wave, every CTA
// resident from the start, as FlashInfer's decode sizes its KV chunks. A
// split costs more than its cache rows: its G query rows' partial results
// (G (hd + 2) floats, written, then read by the merge) and the query
// itself. At G = 16 and head_dim 256 that is 32 KB beside 64 KB of an FP8
// cache in a 128-position split, 256 KB in a 512-position one; splitting
// finer than the device can run at once buys no parallelism for that
// traffic. Where the entries alone fill a wave, one split each.
static int per_split_for(int max_ctx, int kv_heads, int n, int hd, int fmt) {
    if (bench_per_split) return bench_per_split;
    const long long wave = (long long)ctas_per_sm(hd, fmt) * limits_of_current().sms;
    int ps = 128;
    while (ps < max_ctx && (long long)((max_ctx + ps - 1) / ps) * kv_heads * n > wave) ps *= 2;
    return ps;
}

// one launch's arguments beside the view and the entries: the split
// kernels' partial results, and FP8 attention's row maxima (log2 units,
// n_heads an entry; null: plain attention)
struct split_args {
    int n, per_split, nstage, G;
    const float *dq;
    float sm_scale;
    float *pa, *pm, *pl, *rowmax;
};

template <int HD, int FMT, int MODE>
static int launch_t(const view &kv, const rows &R, const split_args &a) {
    const size_t shm = (size_t)a.nstage * fmt_stage_bytes(HD, FMT) + fixed_bytes(HD, FMT);
    void (*decode_v3_t)(view, rows, int, int, int, const float *, float, const float *, float *,
                        float *, float *) = decode_v3<HD, FMT, MODE>;
    // the shared-memory opt-in, asked for when it changes (per device)
    static size_t opted[16];
    if (!opt_in(decode_v3_t, shm, opted)) return -1;
    if (R.max_splits > 65535) return -1;
    dim3 grid((unsigned)a.n, (unsigned)kv.kv_heads, (unsigned)R.max_splits);
    decode_v3_t<<<grid, WARPS * 32, shm>>>(kv, R, a.per_split, a.nstage, a.G, a.dq, a.sm_scale,
                                           a.rowmax, a.pa, a.pm, a.pl);
    return 0;
}

// entry z's row maxima over its splits' (PASS_MAX's part_m): grid
// (n_heads, entries)
__global__ void rowmax_rows(rows R, int per_split, int n_heads, const float *part_m,
                            float *rowmax) {
    const int *blocks;
    int n_ctx, qrow, orow;
    const int z = blockIdx.y, hq = blockIdx.x;
    if (!row_of(R, z, &blocks, &n_ctx, &qrow, &orow)) return;
    const float m = splits_max((n_ctx + per_split - 1) / per_split, n_heads, hq,
                               part_m + (size_t)z * R.max_splits * n_heads);
    if (threadIdx.x == 0) rowmax[(size_t)z * n_heads + hq] = m;
}

// FP8 attention's two passes (the row maxima between them); E4M3 only
template <int HD, int FMT>
static int launch_fp8(const view &kv, const rows &R, const split_args &a) {
    if constexpr (FMT != KVD_FMT_E4M3) {
        return -1;
    } else {
        if (launch_t<HD, FMT, PASS_MAX>(kv, R, a)) return -1;
        const int n_heads = kv.kv_heads * a.G;
        rowmax_rows<<<dim3((unsigned)n_heads, (unsigned)a.n), block_of(R.max_splits)>>>(
            R, a.per_split, n_heads, a.pm, a.rowmax);
        return launch_t<HD, FMT, PASS_FP8>(kv, R, a);
    }
}

template <int HD, int FMT> static int launch_f(const view &kv, const rows &R, const split_args &a) {
    return a.rowmax ? launch_fp8<HD, FMT>(kv, R, a) : launch_t<HD, FMT, PASS_PLAIN>(kv, R, a);
}

template <int HD> static int launch_hd(const view &kv, const rows &R, const split_args &a) {
    switch (kv.fmt) {
    case KVD_FMT_BF16:
        return launch_f<HD, KVD_FMT_BF16>(kv, R, a);
    case KVD_FMT_E4M3:
        return launch_f<HD, KVD_FMT_E4M3>(kv, R, a);
    case KVD_FMT_E5M2:
        return launch_f<HD, KVD_FMT_E5M2>(kv, R, a);
    // the row-scaled formats: no FP8 attention, which takes one scale a head
    case KVD_FMT_E4M3T:
        return a.rowmax ? -1 : launch_t<HD, KVD_FMT_E4M3T, PASS_PLAIN>(kv, R, a);
    case KVD_FMT_I8T: // I8T_RN's rows read as I8T's (they differ in the writing only)
    case KVD_FMT_I8T_RN:
        return a.rowmax ? -1 : launch_t<HD, KVD_FMT_I8T, PASS_PLAIN>(kv, R, a);
    case KVD_FMT_NVFP4: // from head_dim 128 on (kvd_fmt_decode_tc); no FP8 attention
        if constexpr (kvd_fmt_decode_tc(KVD_FMT_NVFP4, HD))
            return a.rowmax ? -1 : launch_t<HD, KVD_FMT_NVFP4, PASS_PLAIN>(kv, R, a);
        else
            return -1;
    default:
        return -1;
    }
}

// whether load_stage's copies (copy_bytes) find every row's codes aligned
// (in a pool from cudaMalloc): always for whole rows (the per-head formats,
// NVFP4), whose size copy_bytes divides; for the row-scaled ones where a
// segment of bs rows, bs (hd + 4) bytes, is a multiple of 16 (bs a multiple
// of 4: the model's blocks of KVD_KV_BLOCK = 128 are)
static bool rows_aligned(int hd, int fmt, int bs) {
    return !kvd_fmt_row_scaled(fmt) || (size_t)bs * kvd_scaled_row_bytes(hd) % 16 == 0;
}

// whether v3 has a build for the format at the head_dim, and room on the
// device for two stages of it (NVFP4 at head_dim 64 takes v2 and the plain
// kernels: kvd_fmt_decode_tc)
static bool takes(int hd, int fmt) {
    return (hd == 64 || hd == 128 || hd == 256) && kvd_fmt_decode_tc(fmt, hd) &&
           stages_for(hd, fmt) >= 2;
}

static bool ok(const view &kv, int G) {
    return takes(kv.head_dim, kv.fmt) && G >= 1 && G <= 16 &&
           rows_aligned(kv.head_dim, kv.fmt, kv.block_size);
}

// the batch entries' outputs from their splits: grid merge_grid(n_heads,
// entries, hd)
__global__ void merge_rows(rows R, int per_split, int kv_heads, int G, int hd,
                           const float *part_acc, const float *part_m, const float *part_l,
                           const float *v_scale, float *out) {
    const int *blocks;
    int n_ctx, qrow, orow;
    if (!row_of(R, blockIdx.y, &blocks, &n_ctx, &qrow, &orow)) return;
    const size_t z0 = (size_t)blockIdx.y * R.max_splits, np = z0 * kv_heads * G;
    merge_splits((n_ctx + per_split - 1) / per_split, kv_heads, G, hd, blockIdx.x,
                 part_acc + np * hd, part_m + np, part_l + np, v_scale,
                 out + (size_t)orow * R.ostride);
}

/* v3 and the merge on device buffers, n entries of R; part buffers hold
 * n * R.max_splits * n_heads (* hd); rowmax, n * n_heads floats, for FP8
 * attention (null: plain) */
static int launch(const view &kv, const rows &R, int n, const float *dq, int n_heads,
                  float sm_scale, float *dout, int per_split, float *pa, float *pm, float *pl,
                  float *rowmax) {
    const int G = n_heads / kv.kv_heads, hd = kv.head_dim, ns = stages_for(hd, kv.fmt);
    if (ns < 2) return -1;
    const split_args a = {n, per_split, ns, G, dq, sm_scale, pa, pm, pl, rowmax};
    int rc = hd == 64    ? launch_hd<64>(kv, R, a)
             : hd == 128 ? launch_hd<128>(kv, R, a)
                         : launch_hd<256>(kv, R, a);
    if (rc) return rc;
    merge_rows<<<merge_grid(n_heads, n, hd), merge_threads(R.max_splits, hd)>>>(
        R, per_split, kv.kv_heads, G, hd, pa, pm, pl, kv.v_scale, dout);
    return 0;
}
} // namespace v3

static int v2_ok(int head_dim, int G) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) &&
           (G == 1 || G == 2 || G == 4 || G == 8 || G == 16);
}

// the kernels' view of a kvd_kv_view whose pools and scales are on the device
static view dev_view(const kvd_kv_view *dv) {
    return view{(int)dv->fmt,
                dv->block_size,
                dv->kv_heads,
                dv->head_dim,
                (const unsigned char *)dv->k,
                (const unsigned char *)dv->v,
                dv->k_scale,
                dv->v_scale};
}

// a host view's pools, scales and block table copied to the device, for the
// host-memory entry points (the tests'); freed with it
struct dev_cache {
    kvd_kv_view v{};
    void *k = nullptr, *vv = nullptr;
    float *ks = nullptr, *vs = nullptr;
    int32_t *blocks = nullptr;
    ~dev_cache() { cudaFree(k), cudaFree(vv), cudaFree(ks), cudaFree(vs), cudaFree(blocks); }
    bool upload(const kvd_kv_view *hv, int n_blocks, const int32_t *hb, int nb) {
        size_t pool = (size_t)n_blocks * hv->kv_heads * hv->block_size *
                      kvd_fmt_row_bytes(hv->fmt, hv->head_dim),
               sc = sizeof(float) * hv->kv_heads;
        if (cudaMalloc(&k, pool) || cudaMalloc(&vv, pool) || cudaMalloc(&ks, sc) ||
            cudaMalloc(&vs, sc) || cudaMalloc(&blocks, sizeof(int32_t) * nb) ||
            cudaMemcpy(k, hv->k, pool, cudaMemcpyHostToDevice) ||
            cudaMemcpy(vv, hv->v, pool, cudaMemcpyHostToDevice) ||
            cudaMemcpy(ks, hv->k_scale, sc, cudaMemcpyHostToDevice) ||
            cudaMemcpy(vs, hv->v_scale, sc, cudaMemcpyHostToDevice) ||
            cudaMemcpy(blocks, hb, sizeof(int32_t) * nb, cudaMemcpyHostToDevice))
            return false;
        v = *hv;
        v.k = k, v.v = vv, v.k_scale = ks, v.v_scale = vs;
        return true;
    }
};

// splits of 128 positions or more (v3 takes 128 or more, v2 512), and FP8
// attention's row maxima of one query
extern "C" size_t kvd_cuda_attn_scratch_floats(int max_ctx, int n_heads, int head_dim) {
    size_t splits = (size_t)(max_ctx + 127) / 128;
    return splits * (size_t)n_heads * ((size_t)head_dim + 2) + (size_t)n_heads;
}

extern "C" int kvd_cuda_attn_wave(int fmt, int head_dim) {
    if (!v3::takes(head_dim, fmt)) return 0;
    return v3::ctas_per_sm(head_dim, fmt) * v3::limits_of_current().sms;
}

extern "C" int kvd_cuda_attn_split_len(int fmt, int head_dim, int kv_heads, int n, int max_ctx) {
    if (!kvd_cuda_attn_wave(fmt, head_dim) || kv_heads < 1 || n < 1 || max_ctx < 1) return 0;
    return v3::per_split_for(max_ctx, kv_heads, n, head_dim, fmt);
}

// whether the environment sets name to value
static bool env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && !strcmp(e, value);
}

// KVD_CUDA_DECODE=2: decode stays on v2 (a diagnostic), read once
static bool decode_forced_v2() {
    static const bool forced = env_is("KVD_CUDA_DECODE", "2");
    return forced;
}

// the split kernels' partial results in a scratch: accumulators [np][hd],
// then maxima [np] and sums [np]
struct parts {
    float *acc, *m, *l;
};
static parts parts_in(float *scratch, size_t np, int hd) {
    return {scratch, scratch + np * hd, scratch + np * hd + np};
}

// decode on device buffers: v3 (tensor cores) where the shape and the
// device's shared memory allow it, else v2; version 2 or 3 forces one. FP8
// weights (p_fp8) only v3 rounds: -1 where it cannot run.
static int decode_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx, const float *q,
                      int n_heads, float sm_scale, float *out, float *scratch, int version) {
    const int G = n_heads / dv->kv_heads;
    const view kv = dev_view(dv);
    const bool ok3 = version != 2 && v3::ok(kv, G);
    const bool use3 = version == 3 || (version == 0 && ok3);
    if (use3 ? !ok3 : !v2_ok(dv->head_dim, G)) return -1;
    if (dv->p_fp8 && !use3) return -1;
    const int per_split =
        use3 ? v3::per_split_for(n_ctx, dv->kv_heads, 1, dv->head_dim, dv->fmt) : 512;
    const int splits = (n_ctx + per_split - 1) / per_split;
    const parts P = parts_in(scratch, (size_t)splits * n_heads, dv->head_dim);
    if (use3) {
        v3::rows R{};
        R.btab = (const int *)blocks, R.n_ctx = n_ctx, R.max_splits = splits;
        return v3::launch(kv, R, 1, q, n_heads, sm_scale, out, per_split, P.acc, P.m, P.l,
                          dv->p_fp8 ? P.l + (size_t)splits * n_heads : nullptr);
    }
    return launch_v2(kv, (const int *)blocks, n_ctx, q, n_heads, sm_scale, out, splits, P.acc, P.m,
                     P.l);
}

extern "C" int kvd_cuda_attn_decode_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                                        const float *q, int n_heads, float sm_scale, float *out,
                                        float *scratch) {
    return decode_dev(dv, blocks, n_ctx, q, n_heads, sm_scale, out, scratch,
                      decode_forced_v2() ? 2 : 0);
}

// v3's split length for n entries of up to max_ctx positions: the one the
// grid wants, longer where the scratch (n_heads * (hd + 2) floats an entry
// and split) is short; -1 where even one split an entry does not fit
static int split_in(int max_ctx, const kvd_kv_view *dv, int n, int n_heads, size_t scratch_floats) {
    const int hd = dv->head_dim;
    int ps = v3::per_split_for(max_ctx, dv->kv_heads, n, hd, dv->fmt);
    const size_t per_split_floats = (size_t)n * n_heads * ((size_t)hd + 2);
    while ((size_t)((max_ctx + ps - 1) / ps) * per_split_floats > scratch_floats) {
        if (ps >= max_ctx) return -1;
        ps *= 2;
    }
    return ps;
}

// FP8 attention's row maxima (n entries of n_heads floats) from the end of a
// scratch of *floats, which shrinks by as much; rowmax stays null without
// FP8 weights. false where the scratch cannot hold them.
static bool fp8_rowmax(const kvd_kv_view *dv, int n, int n_heads, float *scratch, size_t *floats,
                       float **rowmax) {
    if (!dv->p_fp8) return true;
    const size_t need = (size_t)n * n_heads;
    if (*floats <= need) return false;
    *floats -= need;
    *rowmax = scratch + *floats;
    return true;
}

extern "C" int kvd_cuda_attn_decode_batch_dev(const kvd_kv_view *dv, const int32_t *btab,
                                              int btab_stride, const int *seqs, const int *row0,
                                              const int *ntok, const int *pos, int n, int max_ctx,
                                              const float *q, int n_heads, float sm_scale,
                                              float *out, float *scratch, size_t scratch_floats) {
    const int G = n_heads / dv->kv_heads, hd = dv->head_dim;
    const view kv = dev_view(dv);
    if (n < 1 || max_ctx < 1 || decode_forced_v2() || !v3::ok(kv, G)) return -1;
    float *rowmax = nullptr;
    if (!fp8_rowmax(dv, n, n_heads, scratch, &scratch_floats, &rowmax)) return -1;
    const int ps = split_in(max_ctx, dv, n, n_heads, scratch_floats);
    if (ps < 0) return -1;
    const int splits = (max_ctx + ps - 1) / ps;
    const parts P = parts_in(scratch, (size_t)n * splits * n_heads, hd);
    v3::rows R{};
    R.seqs = seqs, R.row0 = row0, R.ntok = ntok, R.pos = pos;
    R.btab = (const int *)btab, R.btab_stride = btab_stride, R.max_splits = splits;
    R.qstride = R.ostride = n_heads * hd;
    return v3::launch(kv, R, n, q, n_heads, sm_scale, out, ps, P.acc, P.m, P.l, rowmax);
}

// Listed query rows of one sequence (the drift figures' sampled rows of a
// step): entry k is q's row qrow[k] over n_ctx[k] positions of blocks, its
// output at out + k * out_stride; one v3 launch and one merge for all of
// them. The entries of a split run side by side (the grid's fastest
// dimension), so K and V are read from HBM about once for all the rows.
// -1 (nothing queued) where v3 does not take the shape or the scratch is too
// short even for splits as long as max_ctx; callers then decode row by row.
extern "C" int kvd_cuda_attn_decode_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                             const int *qrow, const int *n_ctx, int max_ctx,
                                             const float *q, size_t q_stride, int n_heads,
                                             float sm_scale, float *out, size_t out_stride,
                                             float *scratch, size_t scratch_floats) {
    const int G = n_heads / dv->kv_heads, hd = dv->head_dim;
    const view kv = dev_view(dv);
    if (n < 1 || max_ctx < 1 || q_stride > INT_MAX || out_stride > INT_MAX || decode_forced_v2() ||
        !v3::ok(kv, G))
        return -1;
    float *rowmax = nullptr;
    if (!fp8_rowmax(dv, n, n_heads, scratch, &scratch_floats, &rowmax)) return -1;
    const int ps = split_in(max_ctx, dv, n, n_heads, scratch_floats);
    if (ps < 0) return -1;
    const int splits = (max_ctx + ps - 1) / ps;
    const parts P = parts_in(scratch, (size_t)n * splits * n_heads, hd);
    v3::rows R{};
    R.row0 = qrow, R.ctx = n_ctx, R.btab = (const int *)blocks, R.max_splits = splits;
    R.qstride = (int)q_stride, R.ostride = (int)out_stride;
    return v3::launch(kv, R, n, q, n_heads, sm_scale, out, ps, P.acc, P.m, P.l, rowmax);
}

extern "C" int kvd_cuda_attn_decode_v(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                      int n_ctx, const float *q, int n_heads, float sm_scale,
                                      float *out, int version) {
    const int hd = hv->head_dim, G = n_heads / hv->kv_heads;
    const int nb = (n_ctx + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * n_heads * hd;
    if (version == 0) {
        view probe = dev_view(hv);
        version = v3::ok(probe, G) ? 3 : v2_ok(hd, G) ? 2 : 1;
    }
    const bool split = version == 2 || version == 3;
    dev_cache dc;
    float *dq = nullptr, *dout = nullptr, *work = nullptr;
    int rc = -1;
    size_t wn = split ? kvd_cuda_attn_scratch_floats(n_ctx, n_heads, hd) : (size_t)n_heads * n_ctx;
    if (version < 1 || version > 3 || (version == 2 && !v2_ok(hd, G)) ||
        !dc.upload(hv, n_blocks, blocks, nb) || cudaMalloc(&dq, nq) || cudaMalloc(&dout, nq) ||
        cudaMalloc(&work, sizeof(float) * wn) || cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice))
        goto out;
    if (split) {
        rc = decode_dev(&dc.v, dc.blocks, n_ctx, dq, n_heads, sm_scale, dout, work, version);
    } else { /* the plain kernels: scores, softmax, weighted sum */
        view kv = dev_view(&dc.v);
        const int *db = (const int *)dc.blocks;
        dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)hv->kv_heads);
        scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, sm_scale, work);
        softmax_kernel<<<(unsigned)n_heads, 256>>>(work, n_ctx, hv->p_fp8 != 0);
        pv_kernel<<<(unsigned)n_heads, (unsigned)((hd + 31) / 32 * 32)>>>(kv, db, n_ctx, work,
                                                                          n_heads, dout);
        rc = 0;
    }
    if (rc || cudaMemcpy(out, dout, nq, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaGetLastError() != cudaSuccess)
        rc = -1;
out:
    cudaFree(dq), cudaFree(dout), cudaFree(work);
    return rc;
}

// ---- FP8 attention: FlashAttention 3's rule (kvd_kv_view's q_scale and
// p_fp8), the twin of kvd_attn_paged's. The query is written as E4M3 and read
// back before any kernel sees it (the attention kernels take the query as
// given); the weights are rounded in the plain kernels, whose scores hold the
// whole context, so the row's maximum is known before any weight is rounded.
// Correct rather than fast: a GPU run with --attn-fp8 times these kernels.

// rows of n_heads * hd values, stride floats apart: cvt(q / q_scale[head])
// to E4M3 (saturating) and back, times the scale, as kvd_quant_e4m3 and
// kvd_dequant_e4m3 do on the CPU
__global__ void fp8_query_kernel(const float *q, float *out, int rows, size_t stride, int n_heads,
                                 int hd, const float *q_scale) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)rows * n_heads * hd;
    if (i >= n) return;
    const size_t rh = i / hd, r = rh / n_heads;
    const int h = (int)(rh % n_heads), d = (int)(i % hd);
    const size_t at = r * stride + (size_t)h * hd + d;
    const float s = q_scale[h];
    const __nv_fp8_storage_t c =
        __nv_cvt_float_to_fp8(__fdiv_rn(q[at], s), __NV_SATFINITE, __NV_E4M3);
    out[at] = __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))), s);
}

extern "C" int kvd_cuda_attn_fp8_query_dev(const float *q, float *out, int rows, size_t stride,
                                           int n_heads, int head_dim, const float *q_scale) {
    const size_t n = (size_t)rows * n_heads * head_dim;
    if (rows < 1) return 0;
    fp8_query_kernel<<<(unsigned)((n + 255) / 256), 256>>>(q, out, rows, stride, n_heads, head_dim,
                                                           q_scale);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_fp8_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                                     const float *q, int n_heads, float sm_scale, float *out,
                                     float *scratch) {
    if (n_ctx < 1) return -1;
    const view kv = dev_view(dv);
    const int *db = (const int *)blocks, hd = dv->head_dim;
    dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)dv->kv_heads);
    scores_kernel<<<g1, 128>>>(kv, db, n_ctx, q, n_heads, sm_scale, scratch);
    softmax_kernel<<<(unsigned)n_heads, 256>>>(scratch, n_ctx, dv->p_fp8 != 0);
    pv_kernel<<<(unsigned)n_heads, (unsigned)((hd + 31) / 32 * 32)>>>(kv, db, n_ctx, scratch,
                                                                      n_heads, out);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_fp8(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                 int n_ctx, const float *q, int n_heads, float sm_scale,
                                 float *out) {
    const int hd = hv->head_dim, nb = (n_ctx + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * n_heads * hd;
    dev_cache dc;
    float *dq = nullptr, *dout = nullptr, *work = nullptr, *dqs = nullptr;
    int rc = -1;
    if (!dc.upload(hv, n_blocks, blocks, nb) || cudaMalloc(&dq, nq) || cudaMalloc(&dout, nq) ||
        cudaMalloc(&work, sizeof(float) * n_heads * n_ctx) ||
        cudaMalloc(&dqs, sizeof(float) * n_heads) ||
        cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice) ||
        (hv->q_scale &&
         cudaMemcpy(dqs, hv->q_scale, sizeof(float) * n_heads, cudaMemcpyHostToDevice)))
        goto out;
    if ((!hv->q_scale ||
         kvd_cuda_attn_fp8_query_dev(dq, dq, 1, (size_t)n_heads * hd, n_heads, hd, dqs) == 0) &&
        kvd_cuda_attn_fp8_dev(&dc.v, dc.blocks, n_ctx, dq, n_heads, sm_scale, dout, work) == 0 &&
        cudaMemcpy(out, dout, nq, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaGetLastError() == cudaSuccess)
        rc = 0;
out:
    cudaFree(dq), cudaFree(dout), cudaFree(work), cudaFree(dqs);
    return rc;
}

// ---- the distributions of several query rows of one sequence (the drift
// figures' sampled rows of a step), each over its own context. A CTA takes
// ROWS_TILE positions of one KV head and decodes their K rows once into
// shared memory, transposed; the group's (row, query head) vectors then
// come through in passes of VEC (128, or 64 or 32 where the group has no
// more, so that a small model's few vectors leave no thread idle).
// A dot product is head_dim multiply-adds on 2 * head_dim loads, so a lane
// a (vector, position) pair would wait on shared memory, not arithmetic.
// Each thread instead holds a 4 x 4 tile of dot products (4 vectors, 4
// positions) and reads, per dimension, one float4 of K and one of Q (Q
// staged in shared memory ROWS_DC dimensions at a time): 16 multiply-adds
// on two loads. Every dot product still sums over the dimensions in
// scores_kernel's order from the same start, so a row's distribution is
// the plain kernels', bit for bit; the K rows are read once for all the
// rows instead of once a row. Then one softmax a (row, head).
#define ROWS_TILE 32 // positions a CTA
#define ROWS_DC 16   // dimensions of Q staged at a time
// shared rows padded by a float4: the K tile's transposing stores (a warp
// over 32 dimensions of one position) hit 4-way instead of 32-way bank
// conflicts, Q's staging 2-way instead of 16-way
#define ROWS_KSTR (ROWS_TILE + 4)

template <int VEC>
__host__ __device__ constexpr int rows_threads() { // 4 positions and 4 vectors a thread
    return ROWS_TILE / 4 * (VEC / 4);
}

template <int VEC>
__global__ void __launch_bounds__(rows_threads<VEC>())
    rows_scores_kernel(view kv, const int *blocks, int n, const int *qrow, const int *n_ctx,
                       int max_ctx, const float *q, size_t q_stride, int n_heads, float sm_scale,
                       float *s, size_t stride) {
    constexpr int ROWS_VEC = VEC, ROWS_THREADS = rows_threads<VEC>(), ROWS_QSTR = VEC + 4;
    extern __shared__ float4 smem4[]; // K: [head_dim][ROWS_KSTR]; then Q: [ROWS_DC][ROWS_QSTR]
    float *kt = reinterpret_cast<float *>(smem4);
    const int h = blockIdx.y, g = n_heads / kv.kv_heads, hd = kv.head_dim, nv = n * g;
    const int p0 = blockIdx.x * ROWS_TILE, t = threadIdx.x;
    const int pg = t % (ROWS_TILE / 4), vl = t / (ROWS_TILE / 4); // 4 positions, 4 vectors
    float *qs = kt + (size_t)hd * ROWS_KSTR;
    for (int i = t; i < ROWS_TILE * hd; i += ROWS_THREADS) {
        const int p = i / hd, d = i % hd, pos = p0 + p;
        kt[d * ROWS_KSTR + p] = pos < max_ctx ? load_val(kv, kv.k, blocks[pos / kv.block_size], h,
                                                         pos % kv.block_size, d)
                                              : 0.0f;
    }
    const float kmul = sm_scale * kv.k_scale[h];
    for (int v0 = 0; v0 < nv; v0 += ROWS_VEC) {
        float acc[4][4] = {};
        for (int d0 = 0; d0 < hd; d0 += ROWS_DC) {
            __syncthreads(); // the K tile written; the last chunk of Q read
            for (int i = t; i < ROWS_DC * ROWS_VEC; i += ROWS_THREADS) {
                const int vi = i / ROWS_DC, dd = i % ROWS_DC, v = v0 + vi;
                float x = 0.0f;
                if (v < nv && d0 + dd < hd)
                    x = q[(size_t)qrow[v / g] * q_stride + (size_t)(h * g + v % g) * hd + d0 + dd];
                qs[dd * ROWS_QSTR + vi] = x;
            }
            __syncthreads();
            const int dn = hd - d0 < ROWS_DC ? hd - d0 : ROWS_DC;
            for (int dd = 0; dd < dn; dd++) {
                const float4 k4 =
                    *reinterpret_cast<const float4 *>(kt + (d0 + dd) * ROWS_KSTR + pg * 4);
                const float4 q4 = *reinterpret_cast<const float4 *>(qs + dd * ROWS_QSTR + vl * 4);
                const float kx[4] = {k4.x, k4.y, k4.z, k4.w}, qx[4] = {q4.x, q4.y, q4.z, q4.w};
                for (int a = 0; a < 4; a++)
                    for (int b = 0; b < 4; b++) acc[a][b] += qx[a] * kx[b];
            }
        }
        for (int a = 0; a < 4; a++) {
            const int v = v0 + vl * 4 + a;
            if (v >= nv) break;
            const int k = v / g, ctx = n_ctx[k];
            float *srow = s + ((size_t)k * n_heads + h * g + v % g) * stride;
            for (int b = 0; b < 4; b++) {
                const int pos = p0 + pg * 4 + b;
                if (pos >= ctx) continue;
                float x = acc[a][b] * kmul; // as scores_kernel: then the row's own scale
                if (kvd_fmt_row_scaled(kv.fmt))
                    x *= row_scale(kv, kv.k, blocks[pos / kv.block_size], h, pos % kv.block_size);
                srow[pos] = x;
            }
        }
    }
}

__global__ void softmax_rows_kernel(float *s, const int *n_ctx, int n_heads, size_t stride) {
    __shared__ float red[256];
    __shared__ double dred[256];
    const int k = blockIdx.y;
    softmax_row(s + ((size_t)k * n_heads + blockIdx.x) * stride, n_ctx[k], red, dred);
}

extern "C" int kvd_cuda_attn_probs_rows_dev(const kvd_kv_view *dv, const int32_t *blocks, int n,
                                            const int *qrow, const int *n_ctx, int max_ctx,
                                            const float *q, size_t q_stride, int n_heads,
                                            float sm_scale, float *probs, size_t stride) {
    if (n < 1 || max_ctx < 1 || stride < (size_t)max_ctx) return -1;
    view kv = dev_view(dv);
    dim3 g1((unsigned)((max_ctx + ROWS_TILE - 1) / ROWS_TILE), (unsigned)dv->kv_heads);
    dim3 g2((unsigned)n_heads, (unsigned)n);
    const int nv = n * (n_heads / dv->kv_heads), vec = nv > 64 ? 128 : nv > 32 ? 64 : 32;
    const size_t smem = sizeof(float) * ((size_t)ROWS_KSTR * dv->head_dim + ROWS_DC * (vec + 4));
    if (smem > 48 * 1024) return -1; /* head_dim up to 320 */
    auto scores = [&](auto kernel, int threads) {
        kernel<<<g1, threads, smem>>>(kv, (const int *)blocks, n, qrow, n_ctx, max_ctx, q, q_stride,
                                      n_heads, sm_scale, probs, stride);
    };
    if (vec == 128)
        scores(rows_scores_kernel<128>, rows_threads<128>());
    else if (vec == 64)
        scores(rows_scores_kernel<64>, rows_threads<64>());
    else
        scores(rows_scores_kernel<32>, rows_threads<32>());
    softmax_rows_kernel<<<g2, 256>>>(probs, n_ctx, n_heads, stride);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_probs_rows(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                        int n, const int *qrow, const int *n_ctx, const float *q,
                                        size_t q_stride, int q_rows, int n_heads, float sm_scale,
                                        float *probs) {
    int max_ctx = 0;
    for (int k = 0; k < n; k++) max_ctx = n_ctx[k] > max_ctx ? n_ctx[k] : max_ctx;
    const size_t nq = sizeof(float) * q_stride * q_rows,
                 np = sizeof(float) * (size_t)n * n_heads * max_ctx;
    dev_cache dc;
    float *dq = nullptr, *dp = nullptr;
    int *di = nullptr, rc = -1;
    if (n >= 1 && dc.upload(hv, n_blocks, blocks, n_blocks) && cudaMalloc(&dq, nq) == cudaSuccess &&
        cudaMalloc(&dp, np) == cudaSuccess && cudaMemset(dp, 0, np) == cudaSuccess &&
        cudaMalloc(&di, sizeof(int) * 2 * n) == cudaSuccess &&
        cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice) == cudaSuccess &&
        cudaMemcpy(di, qrow, sizeof(int) * n, cudaMemcpyHostToDevice) == cudaSuccess &&
        cudaMemcpy(di + n, n_ctx, sizeof(int) * n, cudaMemcpyHostToDevice) == cudaSuccess &&
        kvd_cuda_attn_probs_rows_dev(&dc.v, dc.blocks, n, di, di + n, max_ctx, dq, q_stride,
                                     n_heads, sm_scale, dp, (size_t)max_ctx) == 0 &&
        cudaMemcpy(probs, dp, np, cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
    cudaFree(dq), cudaFree(dp), cudaFree(di);
    return rc;
}

// The attention distribution of one query over positions [0, n_ctx): the
// plain scores and softmax kernels, on device pointers (kvd_attn_paged's
// probs; the drift figures' sampled rows).
extern "C" int kvd_cuda_attn_probs_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                                       const float *q, int n_heads, float sm_scale, float *probs) {
    if (n_ctx < 1) return -1;
    view kv = dev_view(dv);
    dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)dv->kv_heads);
    scores_kernel<<<g1, 128>>>(kv, (const int *)blocks, n_ctx, q, n_heads, sm_scale, probs);
    softmax_kernel<<<(unsigned)n_heads, 256>>>(probs, n_ctx, false);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_probs(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                   int n_ctx, const float *q, int n_heads, float sm_scale,
                                   float *probs) {
    const int nb = (n_ctx + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * n_heads * hv->head_dim,
                 np = sizeof(float) * (size_t)n_heads * n_ctx;
    dev_cache dc;
    float *dq = nullptr, *dp = nullptr;
    int rc = -1;
    if (dc.upload(hv, n_blocks, blocks, nb) && cudaMalloc(&dq, nq) == cudaSuccess &&
        cudaMalloc(&dp, np) == cudaSuccess &&
        cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice) == cudaSuccess &&
        kvd_cuda_attn_probs_dev(&dc.v, dc.blocks, n_ctx, dq, n_heads, sm_scale, dp) == 0 &&
        cudaMemcpy(probs, dp, np, cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
    cudaFree(dq), cudaFree(dp);
    return rc;
}

// ---- prefill: a chunk of query rows, row r at position pos0 + r attending
// to positions 0 .. pos0 + r (causal). One block per (row, KV head), one warp
// per query head of the group; keys and then values in tiles of 16
// positions, dequantized into shared memory once for the whole group; an
// online softmax (running maximum, the running sum in double). A lane pair
// (t, t + 16) computes position t's score over the two halves of head_dim.
constexpr int PF_TILE = 16;

template <int HD>
__global__ void prefill_kernel(view kv, const int *blocks, int pos0, const float *q, int n_heads,
                               float sm_scale, float *out) {
    extern __shared__ float sm[];
    float *tile = sm;                    // [PF_TILE][HD + 1]
    float *qs = sm + PF_TILE * (HD + 1); // [G][HD]
    __shared__ float rs[PF_TILE];        // the tile's rows' own scales (E4M3T, I8T)
    const int r = blockIdx.x, h = blockIdx.y, G = n_heads / kv.kv_heads;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, j = h * G + warp;
    const int n_ctx = pos0 + r + 1, bs = kv.block_size;
    constexpr int PER = HD / 32;
    const float *qj = q + ((size_t)r * n_heads + j) * HD;
    for (int d = lane; d < HD; d += 32) qs[warp * HD + d] = qj[d];
    float acc[PER];
    for (int i = 0; i < PER; i++) acc[i] = 0.0f;
    float m = -INFINITY;
    double l = 0.0;
    const float kmul = sm_scale * kv.k_scale[h];
    const int t_lane = lane % PF_TILE, half = lane / PF_TILE;
    for (int t0 = 0; t0 < n_ctx; t0 += PF_TILE) {
        const int nt = min(PF_TILE, n_ctx - t0);
        __syncthreads(); // the previous tile's values are consumed
        for (int e = threadIdx.x; e < PF_TILE * HD; e += blockDim.x) {
            int t = e / HD, d = e % HD, p = t0 + t;
            tile[t * (HD + 1) + d] =
                t < nt ? load_val(kv, kv.k, blocks[p / bs], h, p % bs, d) : 0.0f;
        }
        if ((int)threadIdx.x < nt)
            rs[threadIdx.x] =
                row_scale(kv, kv.k, blocks[(t0 + threadIdx.x) / bs], h, (t0 + threadIdx.x) % bs);
        __syncthreads();
        float part = 0.0f;
        for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++)
            part += qs[warp * HD + d] * tile[t_lane * (HD + 1) + d];
        float s = (part + __shfl_xor_sync(0xffffffffu, part, 16)) * kmul;
        if (kvd_fmt_row_scaled(kv.fmt) && t_lane < nt) s *= rs[t_lane];
        if (t_lane >= nt) s = -INFINITY;
        float mt = s;
        for (int off = 16; off > 0; off >>= 1)
            mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
        float mn = fmaxf(m, mt), scale = expf(m - mn);
        float p = expf(s - mn);
        double ps = half ? 0.0 : (double)p; // each position once
        for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
        l = l * scale + ps;
        m = mn;
        for (int i = 0; i < PER; i++) acc[i] *= scale;
        __syncthreads(); // every warp has its scores: the tile takes the values
        for (int e = threadIdx.x; e < PF_TILE * HD; e += blockDim.x) {
            int t = e / HD, d = e % HD, pp = t0 + t;
            tile[t * (HD + 1) + d] =
                t < nt ? load_val(kv, kv.v, blocks[pp / bs], h, pp % bs, d) : 0.0f;
        }
        if ((int)threadIdx.x < nt)
            rs[threadIdx.x] =
                row_scale(kv, kv.v, blocks[(t0 + threadIdx.x) / bs], h, (t0 + threadIdx.x) % bs);
        __syncthreads();
        for (int t = 0; t < nt; t++) {
            float pt = __shfl_sync(0xffffffffu, p, t);
            if (kvd_fmt_row_scaled(kv.fmt)) pt *= rs[t];
            for (int i = 0; i < PER; i++) acc[i] += pt * tile[t * (HD + 1) + lane + 32 * i];
        }
    }
    float f = (float)(1.0 / l) * kv.v_scale[h];
    float *o = out + ((size_t)r * n_heads + j) * HD;
    for (int i = 0; i < PER; i++) o[lane + 32 * i] = acc[i] * f;
}

static int prefill_fp32(const kvd_kv_view *dv, const int32_t *blocks, int pos0, int n_q,
                        const float *q, int n_heads, float sm_scale, float *out) {
    const int hd = dv->head_dim, G = n_heads / dv->kv_heads;
    if (!v2_ok(hd, G) || n_q < 1) return -1;
    const view kv = dev_view(dv);
    dim3 grid((unsigned)n_q, (unsigned)dv->kv_heads);
    size_t shm = sizeof(float) * (PF_TILE * (hd + 1) + (size_t)G * hd);
    const int *db = (const int *)blocks;
    if (hd == 64)
        prefill_kernel<64><<<grid, 32 * G, shm>>>(kv, db, pos0, q, n_heads, sm_scale, out);
    else if (hd == 128)
        prefill_kernel<128><<<grid, 32 * G, shm>>>(kv, db, pos0, q, n_heads, sm_scale, out);
    else
        prefill_kernel<256><<<grid, 32 * G, shm>>>(kv, db, pos0, q, n_heads, sm_scale, out);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

// ---- prefill on tensor cores ----
// The query vectors of KV head h are numbered v = r G + j (row r of the
// chunk, head j of the group). Grid (ceil(n_q G / 128), kv_heads, splits),
// 8 warps a CTA; warp w takes vectors 128 blockIdx.x + 16 w .. +15 as its
// MMA rows, so rows and heads alike share every K/V stage the CTA loads.
// The CTA streams positions 0 .. pos0 + (its last row) (or its split's
// share of them) through shared memory in v3's stages (32 positions,
// cp.async, nstage buffers). Per stage each warp:
//   - scores: its 16 x 32 scores, query fragments (hi and lo, split once
//     into shared memory in register order) by the K rows, v3's dim order;
//   - masks positions past each row's own (causal), and carries its own
//     online softmax in registers (the quad of lanes that shares a row);
//   - values: the probabilities, straight from the score registers as A
//     fragments, by all of V (ldmatrix .trans), output 16 x head_dim in
//     registers.
// The query fragments take 16 bytes a lane per 16 dimensions for hi and lo:
// 64 KB a CTA at head_dim 128, 128 KB at 256. Where shared memory cannot
// hold them beside two stages (sm_120's 99 KB a block), QSH is false and
// each warp splits its query again per stage, straight from q (L1/L2): the
// same fragments, so the same bits, for more integer work per MMA.
// An FP8 stage is first widened to FP16 in shared memory by the whole CTA
// (decoding it in every warp's registers, as v3 does for its one query,
// would cost eight times the integer work and the registers head_dim 256
// cannot spare). A warp past its rows' last position skips the stage's
// arithmetic but not its barriers. Precision as v3: the cache's values
// exact in the MMA format, query and probabilities as hi + lo pairs, FP32
// accumulation.
namespace pf3 {
using v3::STAGE;
constexpr int WARPS = 8, QV = 16 * WARPS;

template <int HD> __host__ __device__ constexpr int qfrag_bytes() {
    return WARPS * (HD / 16) * 2 * 32 * 16; // [warp][chunk][hi, lo][lane] uint4
}
// the FP16 copy of an FP8 stage, laid out as a BF16 stage
__host__ __device__ constexpr int wide_bytes(int hd, bool fp8) {
    return fp8 ? v3::fmt_stage_bytes(hd, KVD_FMT_BF16) : 0;
}

// A launch split over the context (grid z): split z takes positions
// [z per_split, (z + 1) per_split) and leaves each of its rows' unscaled
// output, maximum (natural log units) and sum at part index
// (row splits + z) n_heads + head, for merge_prefill. acc null: one split,
// the rows' outputs written directly.
// FP8 attention's passes (MODE, as v3's): PASS_MAX leaves each row's
// maximum over the split (log2 units) at m's part index, splits apart or
// not; PASS_FP8 takes row r's maxima (log2 units) from rowmax + r n_heads.
struct parts_out {
    float *acc, *m, *l;
    int per_split, splits;
    const float *rowmax;
};

template <int HD, int FMT, bool QSH, int MODE>
__global__ void __launch_bounds__(WARPS * 32, 1)
    prefill_tc(view kv, const int *blocks, int pos0, int n_q, const float *q, int n_heads,
               float sm_scale, int nstage, float *out, parts_out P) {
    using namespace kvd_mma;
    constexpr bool F16 = FMT != KVD_FMT_BF16, RS = kvd_fmt_row_scaled(FMT);
    constexpr bool E4 = v3::codes_2m8(FMT);
    constexpr bool NV = FMT == KVD_FMT_NVFP4;
    constexpr int KSTR = v3::kstride_of(HD, FMT), VSTR = v3::vstride_of(HD, FMT);
    constexpr int NCH = HD / 16, NT = HD / 8;
    constexpr int GROWB = v3::pool_row_bytes(HD, FMT);
    static_assert(KSTR >= GROWB && VSTR >= GROWB, "a stage row holds a pool row");
    static_assert(!(RS || NV) || MODE == PASS_PLAIN, "FP8 attention takes one scale a head");
    extern __shared__ uint4 smem_u4[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(smem_u4);
    auto buffer = [&](int i) { return smem + (size_t)i * STAGE * (KSTR + VSTR); };
    const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int G = n_heads / kv.kv_heads, nv = n_q * G, v0 = blockIdx.x * QV, wv0 = v0 + 16 * warp;
    // 16-bit K and V rows: the stage itself (BF16) or its FP16 copy (FP8)
    constexpr int KS16 = v3::kstride(HD, false), VS16 = v3::vstride(HD, false);
    unsigned char *wide = buffer(nstage);
    uint4 *qf =
        QSH ? reinterpret_cast<uint4 *>(wide + wide_bytes(HD, F16)) + (size_t)warp * NCH * 2 * 32
            : nullptr;
    // the CTA's positions [t0, t1) (its rows' and its split's), and the
    // last one any of this warp's rows attends
    const int n_ctx = pos0 + min(nv - 1, v0 + QV - 1) / G + 1;
    const int t0 = P.acc ? blockIdx.z * P.per_split : 0,
              t1 = P.acc ? min(n_ctx, t0 + P.per_split) : n_ctx;
    const int warp_last = wv0 < nv ? pos0 + min(nv - 1, wv0 + 15) / G : -1;
    const int nst = t0 < t1 ? (t1 - t0 + STAGE - 1) / STAGE : 0;

    auto issue = [&](int st) {
        unsigned char *ks = buffer(st % nstage);
        v3::load_stage<HD, FMT, KSTR, VSTR, WARPS * 32, MODE != PASS_MAX>(
            kv, blocks, h, t0 + st * STAGE, t1, ks, ks + STAGE * KSTR);
    };
    for (int st = 0; st < nstage - 1; st++) {
        if (st < nst) issue(st);
        cp_async_commit();
    }

    // rows g and g + 8 of the warp: the query vector, the last position it
    // attends (a vector past the chunk takes the last row's and a zero query)
    const float *qv[2];
    int lim[2];
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        const int vv = wv0 + g + 8 * rr;
        const bool in = vv < nv;
        const int r = in ? vv / G : n_q - 1;
        lim[rr] = pos0 + r;
        qv[rr] = in ? q + ((size_t)r * n_heads + h * G + vv % G) * HD : nullptr;
    }
    // the warp's largest query magnitude (FP16 takes the query scaled by a
    // power of two that puts it just under 2^14), then its fragments
    float mx = 0.0f;
    for (int c = 0; c < NCH; c++) {
        const int d = 64 * (c / 4) + 16 * t + 4 * (c % 4);
        for (int rr = 0; rr < 2; rr++)
            if (qv[rr]) {
                const float4 x = *reinterpret_cast<const float4 *>(qv[rr] + d);
                mx = fmaxf(mx, fmaxf(fmaxf(fabsf(x.x), fabsf(x.y)), fmaxf(fabsf(x.z), fabsf(x.w))));
            }
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float qscale = 1.0f;
    if constexpr (F16) {
        int e = 0;
        frexpf(mx, &e);
        if (mx > 0.0f && mx < INFINITY) qscale = ldexpf(1.0f, 14 - e);
    }
    // chunk c's A fragments, hi and lo (dims 16 c .. 16 c + 15 in v3's order)
    auto frags = [&](int c, unsigned ah[4], unsigned al[4]) {
        const int d = 64 * (c / 4) + 16 * t + 4 * (c % 4);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (qv[rr]) x = *reinterpret_cast<const float4 *>(qv[rr] + d);
            split2<F16>(x.x * qscale, x.y * qscale, &ah[rr], &al[rr]);
            split2<F16>(x.z * qscale, x.w * qscale, &ah[2 + rr], &al[2 + rr]);
        }
    };
    if constexpr (QSH)
        for (int c = 0; c < NCH; c++) {
            unsigned ah[4], al[4];
            frags(c, ah, al);
            qf[(2 * c) * 32 + lane] = make_uint4(ah[0], ah[1], ah[2], ah[3]);
            qf[(2 * c + 1) * 32 + lane] = make_uint4(al[0], al[1], al[2], al[3]);
        } // (each lane reads back only its own fragments)
    const float kmul2 = sm_scale * kv.k_scale[h] * v3::LOG2E * (E4 ? 256.0f : 1.0f) / qscale;
    // the probabilities' scale; with row scales (RS) a stage's own, as v3's
    float pscale = F16 ? 16384.0f : 1.0f;

    float o[NT][4], m2[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    if constexpr (MODE == PASS_FP8)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int vv = wv0 + g + 8 * rr;
            if (vv < nv) m2[rr] = P.rowmax[(size_t)(vv / G) * n_heads + h * G + vv % G];
        }

    for (int st = 0; st < nst; st++) {
        cp_async_wait(nstage - 2);
        __syncthreads(); // stage st is in; every warp is done with stage st - 1
        if (st + nstage - 1 < nst) issue(st + nstage - 1);
        cp_async_commit();
        const unsigned char *ks = buffer(st % nstage), *vs = ks + STAGE * KSTR;
        if constexpr (NV) { // widened by the CTA: 4 codes (2 bytes) a thread at a time,
            // each pair (e2m1_pair) times its group's block scale (hmul2), as v3's
            auto widen4 = [&](const unsigned char *row, int c) {
                const unsigned w = *reinterpret_cast<const unsigned short *>(row + 2 * c);
                const unsigned sf = fp8_pair<false>(row[HD / 2 + c / 4], 0x0404u);
                return make_uint2(hmul2(e2m1_pair(w << 12 | w << 24), sf),
                                  hmul2(e2m1_pair(w << 4 | w << 16), sf));
            };
#pragma unroll 1
            for (int e = threadIdx.x; e < STAGE * HD / 4; e += WARPS * 32) {
                const int r = e / (HD / 4), c = e % (HD / 4);
                *reinterpret_cast<uint2 *>(wide + r * KS16 + 8 * c) = widen4(ks + r * KSTR, c);
                *reinterpret_cast<uint2 *>(wide + STAGE * KS16 + r * VS16 + 8 * c) =
                    widen4(vs + r * VSTR, c);
            }
            __syncthreads();
            ks = wide, vs = wide + STAGE * KS16;
        } else if constexpr (F16) { // widened by the CTA: 4 codes a thread at a time
#pragma unroll 1
            for (int e = threadIdx.x; e < STAGE * HD / 4; e += WARPS * 32) {
                const int r = e / (HD / 4), c = e % (HD / 4);
                const unsigned wk = *reinterpret_cast<const unsigned *>(ks + r * KSTR + 4 * c);
                *reinterpret_cast<uint2 *>(wide + r * KS16 + 8 * c) =
                    make_uint2(v3::codes_pair<FMT>(wk, 0x1404u), v3::codes_pair<FMT>(wk, 0x3424u));
                if constexpr (MODE == PASS_MAX) continue; // no values
                const unsigned wv = *reinterpret_cast<const unsigned *>(vs + r * VSTR + 4 * c);
                *reinterpret_cast<uint2 *>(wide + STAGE * KS16 + r * VS16 + 8 * c) =
                    make_uint2(v3::codes_pair<FMT>(wv, 0x1404u), v3::codes_pair<FMT>(wv, 0x3424u));
            }
            __syncthreads();
            ks = wide, vs = wide + STAGE * KS16;
        }
        const int p0 = t0 + st * STAGE;
        if (p0 > warp_last) continue;

        // scores of positions p0 + 8 nt + 2 t (+1), hi and lo apart (eight
        // independent chains of MMAs)
        float s[4][2][4] = {};
#pragma unroll
        for (int i = 0; i < HD / 64; i++) {
            unsigned w[4][8];
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const unsigned char *krow = ks + (8 * nt + g) * KS16 + 128 * i + 32 * t;
                const uint4 x = *reinterpret_cast<const uint4 *>(krow),
                            y = *reinterpret_cast<const uint4 *>(krow + 16);
                w[nt][0] = x.x, w[nt][1] = x.y, w[nt][2] = x.z, w[nt][3] = x.w;
                w[nt][4] = y.x, w[nt][5] = y.y, w[nt][6] = y.z, w[nt][7] = y.w;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned ah[4], al[4];
                if constexpr (QSH) {
                    const uint4 fh = qf[(2 * (4 * i + j)) * 32 + lane],
                                fl = qf[(2 * (4 * i + j) + 1) * 32 + lane];
                    ah[0] = fh.x, ah[1] = fh.y, ah[2] = fh.z, ah[3] = fh.w;
                    al[0] = fl.x, al[1] = fl.y, al[2] = fl.z, al[3] = fl.w;
                } else {
                    frags(4 * i + j, ah, al);
                }
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const unsigned b[2] = {w[nt][2 * j], w[nt][2 * j + 1]};
                    mma<F16>(s[nt][0], ah, b);
                    mma<F16>(s[nt][1], al, b);
                }
            }
        }
        // causal mask (splits are whole stages, so a position past t1 is
        // past every row's own), the rows' maxima over the quad, the running
        // softmax
        float sv[4][4], smx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int pos = p0 + 8 * nt + 2 * t + (e & 1), rr = e / 2;
                float x = (s[nt][0][e] + s[nt][1][e]) * kmul2;
                if constexpr (RS) // the stage buffer's rows keep their scales
                    x *= v3::row_scale_in(buffer(st % nstage) + (pos - p0) * KSTR, HD);
                sv[nt][e] = pos <= lim[rr] ? x : -INFINITY;
                smx[rr] = fmaxf(smx[rr], sv[nt][e]);
            }
        if constexpr (MODE == PASS_MAX) { // the lane's maxima; the quad's at the end
            m2[0] = fmaxf(m2[0], smx[0]), m2[1] = fmaxf(m2[1], smx[1]);
        } else {
            if constexpr (MODE == PASS_PLAIN) softmax_rescale<NT>(smx, m2, l, o);
            // the V rows' scales, in the stage buffer (which the next issue
            // overwrites only after the loop's next barrier)
            const unsigned char *vst = buffer(st % nstage) + STAGE * KSTR;
            if constexpr (RS) v3::stage_pscale<NT>(vst, VSTR, HD, lane, pscale, o);
#pragma unroll
            for (int kc = 0; kc < STAGE / 16; kc++) { // score tiles 2 kc and 2 kc + 1
                unsigned pa[2][4];
                float pmul[2][2];
                v3::prob_muls<RS>(vst, VSTR, HD, kc, t, pscale, pmul);
                if constexpr (MODE == PASS_FP8)
                    prob_frags_fp8<F16>(sv + 2 * kc, m2, l, pscale, pa[0]);
                else
                    prob_frags<F16>(sv + 2 * kc, m2, l, pmul, pa);
                const unsigned char *vrow = vs + (16 * kc + (lane & 15)) * VS16;
#pragma unroll
                for (int i = 0; i < NT; i++) { // dims 8 i .. 8 i + 7
                    unsigned b[2];
                    ldsm_x2_trans(b, vrow + i * 16);
                    mma<F16>(o[i], pa[0], b);
                    if constexpr (MODE != PASS_FP8) mma<F16>(o[i], pa[1], b);
                }
            }
        }
    }
    cp_async_wait(0);

    if constexpr (MODE == PASS_MAX) {
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            m2[rr] = fmaxf(m2[rr], __shfl_xor_sync(0xffffffffu, m2[rr], 1));
            m2[rr] = fmaxf(m2[rr], __shfl_xor_sync(0xffffffffu, m2[rr], 2));
            const int vv = wv0 + g + 8 * rr;
            if (vv < nv && t == 0)
                P.m[((size_t)(vv / G) * P.splits + blockIdx.z) * n_heads + h * G + vv % G] = m2[rr];
        }
    } else { // the rows' outputs: sums over the quad, the V scale and E4M3's 2^8
        // (a split's: the sums and maxima apart, the V scale left to the merge)
        const float unscale = (E4 ? 256.0f : 1.0f) / pscale;
        float f[2];
        float *orow[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
            l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
            const int vv = wv0 + g + 8 * rr;
            const size_t row = (size_t)(vv / G) * n_heads + h * G + vv % G;
            orow[rr] = nullptr;
            if (vv >= nv) continue;
            if (P.acc) {
                const size_t pi =
                    ((size_t)(vv / G) * P.splits + blockIdx.z) * n_heads + h * G + vv % G;
                orow[rr] = P.acc + pi * HD, f[rr] = unscale;
                if (t == 0) P.m[pi] = m2[rr] * v3::LN2, P.l[pi] = l[rr];
            } else {
                orow[rr] = out + row * HD, f[rr] = unscale * kv.v_scale[h] / l[rr];
            }
        }
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int rr = e / 2, col = 2 * t + (e & 1);
                if (orow[rr]) orow[rr][8 * i + col] = o[i][e] * f[rr];
            }
    }
}

// the rows' outputs from their splits: grid merge_grid(n_heads, n_q, hd)
__global__ void merge_prefill(int splits, int kv_heads, int G, int hd, int n_heads, const float *pa,
                              const float *pm, const float *pl, const float *v_scale, float *out) {
    const size_t np = (size_t)blockIdx.y * splits * n_heads;
    merge_splits(splits, kv_heads, G, hd, blockIdx.x, pa + np * hd, pm + np, pl + np, v_scale,
                 out + (size_t)blockIdx.y * n_heads * hd);
}

// A launch's shared memory: its stage buffers (2 to 4, as v3's) and
// whether the query fragments are among them. They are where two stages
// still fit beside them (an H100's or H200's 227 KB a block), else each
// warp splits its query per stage (qsh false). nstage 0: no layout fits.
struct layout {
    int nstage;
    bool qsh;
};
static size_t qfrag_for(int hd) {
    return hd == 64 ? qfrag_bytes<64>() : hd == 128 ? qfrag_bytes<128>() : qfrag_bytes<256>();
}
static layout layout_for(int hd, int fmt, bool force_split_query) {
    const bool fp8 = fmt != KVD_FMT_BF16;
    const int sb = v3::fmt_stage_bytes(hd, fmt), wb = wide_bytes(hd, fp8);
    int n = force_split_query ? 0 : v3::stages_fitting(sb, wb + (int)qfrag_for(hd));
    if (n >= 2) return {n, true};
    n = v3::stages_fitting(sb, wb);
    return {n >= 2 ? n : 0, false};
}

static bool ok(int hd, int fmt, int bs) {
    return kvd_fmt_prefill_tc(fmt) && (hd == 64 || hd == 128 || hd == 256) &&
           v3::rows_aligned(hd, fmt, bs) && layout_for(hd, fmt, false).nstage >= 2;
}

// one launch's arguments
struct args {
    view kv;
    const int *blocks;
    int pos0, n_q;
    const float *q;
    int n_heads;
    float sm_scale;
    float *out;
    parts_out P;
};

template <int HD, int FMT, bool QSH, int MODE>
static int launch_t(const args &a, const parts_out &P, int nstage) {
    constexpr bool F16 = FMT != KVD_FMT_BF16;
    const size_t shm = (size_t)nstage * v3::fmt_stage_bytes(HD, FMT) + wide_bytes(HD, F16) +
                       (QSH ? qfrag_bytes<HD>() : 0);
    void (*prefill_t)(view, const int *, int, int, const float *, int, float, int, float *,
                      parts_out) = prefill_tc<HD, FMT, QSH, MODE>;
    static size_t opted[16];
    if (!v3::opt_in(prefill_t, shm, opted)) return -1;
    const int G = a.n_heads / a.kv.kv_heads;
    dim3 grid((unsigned)(((size_t)a.n_q * G + QV - 1) / QV), (unsigned)a.kv.kv_heads,
              (unsigned)(P.acc ? P.splits : 1));
    prefill_t<<<grid, WARPS * 32, shm>>>(a.kv, a.blocks, a.pos0, a.n_q, a.q, a.n_heads, a.sm_scale,
                                         nstage, a.out, P);
    return 0;
}

// the rows' maxima over their splits' (PASS_MAX's): grid (n_heads, n_q)
__global__ void rowmax_prefill(int splits, int n_heads, const float *pm, float *rowmax) {
    const size_t r = blockIdx.y;
    const float m = splits_max(splits, n_heads, blockIdx.x, pm + r * splits * n_heads);
    if (threadIdx.x == 0) rowmax[r * n_heads + blockIdx.x] = m;
}

// FP8 attention's two passes (E4M3 only): the maxima straight into rowmax
// where the launch is not split, else per split and then reduced
template <int HD, int FMT, bool QSH> static int launch_fp8(const args &a, int nstage) {
    if constexpr (FMT != KVD_FMT_E4M3) {
        return -1;
    } else {
        float *rowmax = const_cast<float *>(a.P.rowmax);
        parts_out pmax = a.P;
        if (!a.P.acc) pmax.m = rowmax, pmax.splits = 1;
        if (launch_t<HD, FMT, QSH, PASS_MAX>(a, pmax, nstage)) return -1;
        if (a.P.acc)
            rowmax_prefill<<<dim3((unsigned)a.n_heads, (unsigned)a.n_q), block_of(a.P.splits)>>>(
                a.P.splits, a.n_heads, a.P.m, rowmax);
        return launch_t<HD, FMT, QSH, PASS_FP8>(a, a.P, nstage);
    }
}

template <int HD, int FMT, bool QSH> static int launch_m(const args &a, int nstage) {
    return a.P.rowmax ? launch_fp8<HD, FMT, QSH>(a, nstage)
                      : launch_t<HD, FMT, QSH, PASS_PLAIN>(a, a.P, nstage);
}

template <int HD, int FMT> static int launch_f(const args &a, layout L) {
    return L.qsh ? launch_m<HD, FMT, true>(a, L.nstage) : launch_m<HD, FMT, false>(a, L.nstage);
}

template <int HD> static int launch_hd(const args &a, layout L) {
    switch (a.kv.fmt) {
    case KVD_FMT_BF16:
        return launch_f<HD, KVD_FMT_BF16>(a, L);
    case KVD_FMT_E4M3:
        return launch_f<HD, KVD_FMT_E4M3>(a, L);
    case KVD_FMT_E5M2:
        return launch_f<HD, KVD_FMT_E5M2>(a, L);
    case KVD_FMT_E4M3T: // the row-scaled formats: no FP8 attention (launch_fp8 refuses)
        return launch_f<HD, KVD_FMT_E4M3T>(a, L);
    case KVD_FMT_I8T: // I8T_RN's rows read as I8T's
    case KVD_FMT_I8T_RN:
        return launch_f<HD, KVD_FMT_I8T>(a, L);
    case KVD_FMT_NVFP4: // no FP8 attention either (launch_fp8 refuses)
        return launch_f<HD, KVD_FMT_NVFP4>(a, L);
    default:
        return -1;
    }
}

// The split over the context: none where the chunk's CTAs fill the device,
// else as many as fill it, with splits of 512 positions or more and as
// many as the scratch holds (force_ps > 0: splits of that many positions,
// for the tests). The chunk's CTAs all start at position 0, so a short
// chunk deep in a long context would otherwise leave most SMs idle.
// split_query: the query split per stage even where shared memory would
// hold its fragments (the tests' and the benchmark's).
// fp8: FP8 attention's weights, whose row maxima (n_q n_heads floats) take
// the end of the scratch (-1 where there is none)
static int launch(args a, float *scratch, size_t scratch_floats, int force_ps, bool split_query,
                  bool fp8) {
    const int hd = a.kv.head_dim;
    const layout L = layout_for(hd, a.kv.fmt, split_query);
    if (L.nstage < 2) return -1;
    float *rowmax = nullptr;
    if (fp8) {
        const size_t need = (size_t)a.n_q * a.n_heads;
        if (!scratch || scratch_floats <= need) return -1;
        scratch_floats -= need;
        rowmax = scratch + scratch_floats;
    }
    const int n_ctx = a.pos0 + a.n_q, G = a.n_heads / a.kv.kv_heads;
    const int sms = v3::limits_of_current().sms;
    const long long ctas = (((long long)a.n_q * G + QV - 1) / QV) * a.kv.kv_heads;
    const size_t per = (size_t)a.n_q * a.n_heads * ((size_t)hd + 2); // floats a split
    const size_t room = scratch ? scratch_floats / per : 0;
    int splits = 1;
    if (force_ps > 0)
        splits = (n_ctx + force_ps - 1) / force_ps;
    else if (ctas < sms)
        splits = (int)min((sms + ctas - 1) / ctas, (long long)max(1, n_ctx / 512));
    if (splits > 1 && (size_t)splits > room) {
        if (force_ps > 0) return -1;
        splits = (int)room;
    }
    a.P = parts_out{nullptr, nullptr, nullptr, 0, 1, rowmax};
    if (splits > 1) {
        const int ps =
            force_ps > 0 ? force_ps : ((n_ctx + splits - 1) / splits + STAGE - 1) / STAGE * STAGE;
        const int ns2 = (n_ctx + ps - 1) / ps;
        const parts pp = parts_in(scratch, (size_t)a.n_q * ns2 * a.n_heads, hd);
        a.P = parts_out{pp.acc, pp.m, pp.l, ps, ns2, rowmax};
    }
    const int rc = hd == 64    ? launch_hd<64>(a, L)
                   : hd == 128 ? launch_hd<128>(a, L)
                               : launch_hd<256>(a, L);
    if (rc || !a.P.acc) return rc;
    merge_prefill<<<merge_grid(a.n_heads, a.n_q, hd), merge_threads(a.P.splits, hd)>>>(
        a.P.splits, a.kv.kv_heads, G, hd, a.n_heads, a.P.acc, a.P.m, a.P.l, a.kv.v_scale, a.out);
    return 0;
}
} // namespace pf3

// KVD_CUDA_PREFILL=1: prefill stays on the FP32 kernel (a diagnostic), read once
static bool prefill_forced_fp32() {
    static const bool forced = env_is("KVD_CUDA_PREFILL", "1");
    return forced;
}

// prefill on device buffers: version 2 (tensor cores) where the shape and
// the device's shared memory allow it, else 1 (FP32); 1 or 2 forces one,
// 3 is 2 split over the context every 128 positions (the tests'); 4 and 5
// are 2 and 3 with the query split per stage (sm_120's layout at head_dim
// 256, on any device)
static int prefill_dev(const kvd_kv_view *dv, const int32_t *blocks, int pos0, int n_q,
                       const float *q, int n_heads, float sm_scale, float *out, float *scratch,
                       size_t scratch_floats, int version) {
    if (n_q < 1 || n_heads % dv->kv_heads || version < 0 || version > 5) return -1;
    const bool ok2 = version != 1 && pf3::ok(dv->head_dim, (int)dv->fmt, dv->block_size);
    if ((version >= 2 || dv->p_fp8) && !ok2) return -1; // only version 2 rounds FP8 weights
    if (!ok2) return prefill_fp32(dv, blocks, pos0, n_q, q, n_heads, sm_scale, out);
    const pf3::args a = {dev_view(dv),
                         (const int *)blocks,
                         pos0,
                         n_q,
                         q,
                         n_heads,
                         sm_scale,
                         out,
                         {nullptr, nullptr, nullptr, 0, 1, nullptr}};
    if (pf3::launch(a, scratch, scratch_floats, version == 3 || version == 5 ? 128 : 0,
                    version >= 4, dv->p_fp8 != 0))
        return -1;
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

extern "C" int kvd_cuda_attn_prefill_dev(const kvd_kv_view *dv, const int32_t *blocks, int pos0,
                                         int n_q, const float *q, int n_heads, float sm_scale,
                                         float *out, float *scratch, size_t scratch_floats) {
    return prefill_dev(dv, blocks, pos0, n_q, q, n_heads, sm_scale, out, scratch, scratch_floats,
                       prefill_forced_fp32() ? 1 : 0);
}

extern "C" int kvd_cuda_attn_prefill_v(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                       int pos0, int n_q, const float *q, int n_heads,
                                       float sm_scale, float *out, int version) {
    const int nb = (pos0 + n_q + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * (size_t)n_q * n_heads * hv->head_dim;
    // room for splits of 128 positions, and FP8 attention's row maxima
    const size_t ns = (size_t)n_q * ((pos0 + n_q + 127) / 128) * n_heads * (hv->head_dim + 2) +
                      (size_t)n_q * n_heads;
    dev_cache dc;
    float *dq = nullptr, *dout = nullptr, *scratch = nullptr;
    int rc = -1;
    if (dc.upload(hv, n_blocks, blocks, nb) && cudaMalloc(&dq, nq) == cudaSuccess &&
        cudaMalloc(&dout, nq) == cudaSuccess &&
        cudaMalloc(&scratch, sizeof(float) * ns) == cudaSuccess &&
        cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice) == cudaSuccess &&
        prefill_dev(&dc.v, dc.blocks, pos0, n_q, dq, n_heads, sm_scale, dout, scratch, ns,
                    version) == 0 &&
        cudaMemcpy(out, dout, nq, cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
    cudaFree(dq), cudaFree(dout), cudaFree(scratch);
    return rc;
}

extern "C" int kvd_cuda_attn_prefill(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                     int pos0, int n_q, const float *q, int n_heads, float sm_scale,
                                     float *out) {
    return kvd_cuda_attn_prefill_v(hv, n_blocks, blocks, pos0, n_q, q, n_heads, sm_scale, out, 0);
}

// ---- the same kernels on device memory, for the device model: the view's
// pools and scales and the block table are device pointers ----

extern "C" int kvd_cuda_attn_decode(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                    int n_ctx, const float *q, int n_heads, float sm_scale,
                                    float *out) {
    return kvd_cuda_attn_decode_v(hv, n_blocks, blocks, n_ctx, q, n_heads, sm_scale, out, 0);
}

/* Seconds per decode query (the best of reps) with the cache already on the
 * device: fixed codes in a scattered block table; version 1, 2 or 3, or 0
 * for what kvd_cuda_attn_decode_dev picks. Before each timed rep a buffer of
 * four times the L2 the device reports is written (at least 16 MiB; a
 * Hopper part's 50-60 MB L2 would hold a 32K-token FP8 cache), so no rep
 * finds the cache there. 0 when it could not run. */
// a synthetic cache on the device for the benchmarks: n_ctx positions of
// kv_heads heads in scattered 16-token blocks, codes 0x31 (K) and 0x2a (V),
// finite in every format, scales 1
struct bench_cache {
    unsigned char *k = nullptr, *v = nullptr;
    int *blocks = nullptr;
    float *scale = nullptr;
    kvd_kv_view view{};
    ~bench_cache() { cudaFree(k), cudaFree(v), cudaFree(blocks), cudaFree(scale); }
    bool make(int fmt, int n_ctx, int kv_heads, int head_dim) {
        const int bs = 16, nb = (n_ctx + bs - 1) / bs;
        const size_t pool = (size_t)nb * kv_heads * bs * kvd_fmt_row_bytes((kvd_fmt)fmt, head_dim);
        if (kv_heads > 64 || cudaMalloc(&k, pool) || cudaMalloc(&v, pool) ||
            cudaMalloc(&blocks, sizeof(int) * nb) || cudaMalloc(&scale, sizeof(float) * kv_heads))
            return false;
        cudaMemset(k, 0x31, pool);
        cudaMemset(v, 0x2a, pool);
        int *hb = (int *)malloc(sizeof(int) * nb);
        for (int i = 0; i < nb; i++) hb[i] = (int)(((long long)i * 7919) % nb);
        cudaMemcpy(blocks, hb, sizeof(int) * nb, cudaMemcpyHostToDevice);
        free(hb);
        float one[64];
        for (int i = 0; i < 64; i++) one[i] = 1.0f;
        cudaMemcpy(scale, one, sizeof(float) * kv_heads, cudaMemcpyHostToDevice);
        view = {(kvd_fmt)fmt, bs, kv_heads, head_dim, k, v, scale, scale, 0, NULL, 0};
        return true;
    }
};

// seconds of body() (true: it ran), the best of reps after a warm-up, prep()
// untimed before each; 0 when a body failed or the device reports an error
template <class P, class B> static double best_of(int reps, P prep, B body) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double best = 1e30;
    for (int r = 0; r <= reps && best > 0; r++) {
        prep();
        cudaEventRecord(e0);
        const bool ran = body();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (!ran)
            best = 0;
        else if (r && ms * 1e-3 < best)
            best = ms * 1e-3;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return cudaGetLastError() == cudaSuccess ? best : 0;
}

// `rows` sampled rows of one sequence, their contexts ending every 16
// positions up to n_ctx (a 256-row chunk's sampled rows): their
// distributions (outputs 0) or their outputs (1), batched 0, one row at a
// time (kvd_cuda_attn_probs_dev, kvd_cuda_attn_decode_dev); 1, the group
// launches (kvd_cuda_attn_probs_rows_dev, kvd_cuda_attn_decode_rows_dev),
// decode's scratch the model's (splits of 128 positions for one row).
// Seconds, the best of reps.
extern "C" double kvd_cuda_bench_sampled_rows(int outputs, int fmt, int n_ctx, int n_heads,
                                              int kv_heads, int head_dim, int rows, int reps,
                                              int batched) {
    const size_t nq = (size_t)n_heads * head_dim,
                 sf = kvd_cuda_attn_scratch_floats(n_ctx, n_heads, head_dim);
    bench_cache bc;
    float *dq = nullptr, *dp = nullptr, *ds = nullptr;
    int *di = nullptr;
    double best = 0;
    int *hi = (int *)malloc(sizeof(int) * 2 * rows);
    for (int k = 0; k < rows; k++) hi[k] = k, hi[rows + k] = n_ctx - 16 * (rows - 1 - k);
    if (rows >= 1 && hi[rows] >= 1 && bc.make(fmt, n_ctx, kv_heads, head_dim) &&
        !cudaMalloc(&dq, sizeof(float) * nq * rows) &&
        !cudaMalloc(&dp, sizeof(float) * rows * (outputs ? nq : (size_t)n_heads * n_ctx)) &&
        !cudaMalloc(&ds, sizeof(float) * sf) && !cudaMalloc(&di, sizeof(int) * 2 * rows) &&
        !cudaMemcpy(di, hi, sizeof(int) * 2 * rows, cudaMemcpyHostToDevice)) {
        cudaMemset(dq, 0, sizeof(float) * nq * rows);
        best = best_of(
            reps, [] {},
            [&] {
                if (batched && outputs)
                    return kvd_cuda_attn_decode_rows_dev(&bc.view, bc.blocks, rows, di, di + rows,
                                                         n_ctx, dq, nq, n_heads, 0.0625f, dp, nq,
                                                         ds, sf) == 0;
                if (batched)
                    return kvd_cuda_attn_probs_rows_dev(&bc.view, bc.blocks, rows, di, di + rows,
                                                        n_ctx, dq, nq, n_heads, 0.0625f, dp,
                                                        (size_t)n_ctx) == 0;
                for (int k = 0; k < rows; k++)
                    if (outputs ? kvd_cuda_attn_decode_dev(&bc.view, bc.blocks, hi[rows + k],
                                                           dq + (size_t)k * nq, n_heads, 0.0625f,
                                                           dp + (size_t)k * nq, ds)
                                : kvd_cuda_attn_probs_dev(&bc.view, bc.blocks, hi[rows + k],
                                                          dq + (size_t)k * nq, n_heads, 0.0625f,
                                                          dp + (size_t)k * n_heads * n_ctx))
                        return false;
                return true;
            });
    }
    free(hi);
    cudaFree(dq), cudaFree(dp), cudaFree(ds), cudaFree(di);
    return best;
}

extern "C" double kvd_cuda_bench_attn(int fmt, int n_ctx, int n_heads, int kv_heads, int head_dim,
                                      int reps, int version, int attn_fp8) {
    const size_t l2x4 = 4 * v3::limits_of_current().l2,
                 flush_bytes = l2x4 > (16 << 20) ? l2x4 : 16 << 20;
    const size_t nq = (size_t)n_heads * head_dim;
    const size_t work = version == 1 ? (size_t)n_heads * n_ctx
                                     : kvd_cuda_attn_scratch_floats(n_ctx, n_heads, head_dim);
    bench_cache bc;
    unsigned char *flush = nullptr;
    float *dq = nullptr, *ds = nullptr, *dout = nullptr;
    double best = 0;
    if (bc.make(fmt, n_ctx, kv_heads, head_dim) && !cudaMalloc(&dq, sizeof(float) * nq) &&
        !cudaMalloc(&ds, sizeof(float) * work) && !cudaMalloc(&dout, sizeof(float) * nq) &&
        !cudaMalloc(&flush, flush_bytes)) {
        cudaMemset(dq, 0, sizeof(float) * nq);
        bc.view.p_fp8 = attn_fp8;
        const view kv = dev_view(&bc.view);
        const int *db = bc.blocks;
        int r = 0;
        best = best_of(
            reps, [&] { cudaMemset(flush, r++ & 0xff, flush_bytes); },
            [&] {
                if (version != 1)
                    return decode_dev(&bc.view, (const int32_t *)db, n_ctx, dq, n_heads, 0.0625f,
                                      dout, ds, version) == 0;
                dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)kv_heads);
                scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, 0.0625f, ds);
                softmax_kernel<<<(unsigned)n_heads, 256>>>(ds, n_ctx, attn_fp8 != 0);
                pv_kernel<<<(unsigned)n_heads, (unsigned)((head_dim + 31) / 32 * 32)>>>(
                    kv, db, n_ctx, ds, n_heads, dout);
                return true;
            });
    }
    cudaFree(dq), cudaFree(ds), cudaFree(dout), cudaFree(flush);
    return best;
}

/* v3 with its split length and stage count given (0: as chosen), for the
 * benchmark's sweep; seconds per query as kvd_cuda_bench_attn */
extern "C" double kvd_cuda_bench_attn_v3(int fmt, int n_ctx, int n_heads, int kv_heads,
                                         int head_dim, int reps, int per_split, int nstage) {
    v3::bench_per_split = per_split, v3::bench_nstage = nstage;
    double t = kvd_cuda_bench_attn(fmt, n_ctx, n_heads, kv_heads, head_dim, reps, 3, 0);
    v3::bench_per_split = 0, v3::bench_nstage = 0;
    return t;
}

/* Seconds per prefill chunk: n_q rows at positions pos0 .. pos0 + n_q - 1
 * of one sequence (version as kvd_cuda_attn_prefill_v), the cache on the
 * device in scattered 16-token blocks; 0 when it could not run. */
extern "C" double kvd_cuda_bench_prefill(int fmt, int pos0, int n_q, int n_heads, int kv_heads,
                                         int head_dim, int reps, int version, int attn_fp8) {
    const int n_ctx = pos0 + n_q;
    const size_t nq = (size_t)n_q * n_heads * head_dim;
    // the scratch the model would have for a 32-sequence cache of this context
    const size_t ns = kvd_cuda_attn_scratch_floats(32 * n_ctx, n_heads, head_dim);
    bench_cache bc;
    float *dq = nullptr, *dout = nullptr, *ds = nullptr;
    double best = 0;
    if (bc.make(fmt, n_ctx, kv_heads, head_dim) && !cudaMalloc(&dq, sizeof(float) * nq) &&
        !cudaMalloc(&dout, sizeof(float) * nq) && !cudaMalloc(&ds, sizeof(float) * ns)) {
        cudaMemset(dq, 0x3c, sizeof(float) * nq); /* 0.0115 */
        bc.view.p_fp8 = attn_fp8;
        const size_t no = (size_t)n_heads * head_dim;
        best = best_of(
            reps, [] {},
            [&] {
                if (!attn_fp8 || version != 1)
                    return prefill_dev(&bc.view, (const int32_t *)bc.blocks, pos0, n_q, dq, n_heads,
                                       0.0625f, dout, ds, ns, version) == 0;
                for (int r = 0; r < n_q; r++) // FP8 weights before the tensor-core passes
                    if (kvd_cuda_attn_fp8_dev(&bc.view, bc.blocks, pos0 + r + 1, dq + r * no,
                                              n_heads, 0.0625f, dout + r * no, ds))
                        return false;
                return true;
            });
    }
    cudaFree(dq), cudaFree(dout), cudaFree(ds);
    return best;
}
