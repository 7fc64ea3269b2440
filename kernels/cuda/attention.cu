// kvdrift: decode attention over a paged cache on the device, the CUDA twin
// of kernels/cpu/attention.c: the cache read as BF16 or FP8 blocks
// (dequantized in registers, scales folded into the logits and the output),
// softmax with its sum accumulated in double. This first version favours
// being obviously right over speed: one thread per position for the scores,
// one block per query head for the softmax and one thread per output
// dimension for the weighted sum. tests/gpu holds it to the CPU kernel.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda_kernels.h"

struct view {
    int fmt, block_size, kv_heads, head_dim;
    const unsigned char *k, *v;
    const float *k_scale, *v_scale;
};

__device__ inline float load_val(const view &kv, const unsigned char *pool, int blk, int head,
                                 int slot, int d) {
    size_t idx = (((size_t)blk * kv.kv_heads + head) * kv.block_size + slot) * kv.head_dim + d;
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
        s[(size_t)(h * g + j) * n_ctx + p] = dot * kmul;
    }
}

__global__ void softmax_kernel(float *s, int n_ctx) {
    float *x = s + (size_t)blockIdx.x * n_ctx;
    __shared__ float red[256];
    __shared__ double dred[256];
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
        x[i] = e;
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

__global__ void pv_kernel(view kv, const int *blocks, int n_ctx, const float *s, int n_heads,
                          float *out) {
    int hq = blockIdx.x, d = threadIdx.x, g = n_heads / kv.kv_heads, h = hq / g;
    if (d >= kv.head_dim) return;
    const float *p = s + (size_t)hq * n_ctx;
    float acc = 0.0f;
    for (int t = 0; t < n_ctx; t++)
        acc += p[t] * load_val(kv, kv.v, blocks[t / kv.block_size], h, t % kv.block_size, d);
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

template <int PER>
__device__ inline void load_row(const view &kv, const unsigned char *pool, int blk, int head,
                                int slot, int lane, float *x) {
    size_t idx =
        (((size_t)blk * kv.kv_heads + head) * kv.block_size + slot) * kv.head_dim + lane * PER;
    if (kv.fmt == KVD_FMT_BF16) {
        const unsigned short *p = reinterpret_cast<const unsigned short *>(pool) + idx;
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = __uint_as_float((unsigned)p[i] << 16);
    } else {
        const unsigned char *p = pool + idx;
        __nv_fp8_interpretation_t f = kv.fmt == KVD_FMT_E5M2 ? __NV_E5M2 : __NV_E4M3;
#pragma unroll
        for (int i = 0; i < PER; i++) x[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(p[i], f)));
    }
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
        load_row<PER>(kv, kv.k, blk, h, slot, lane, kx);
        load_row<PER>(kv, kv.v, blk, h, slot, lane, vx);
#pragma unroll
        for (int j = 0; j < G; j++) {
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < PER; i++) d += sq[j * hd + lane * PER + i] * kx[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            float s = d * kmul, mn = fmaxf(m[j], s);
            float sc = __expf(m[j] - mn), p = __expf(s - mn);
            l[j] = l[j] * sc + p;
#pragma unroll
            for (int i = 0; i < PER; i++) acc[j][i] = acc[j][i] * sc + p * vx[i];
            m[j] = mn;
        }
    }
    // merge the warps of the CTA: each in turn adds its outputs, rescaled to
    // the CTA's maximum, into one shared accumulator
    __shared__ float wm[V2_WARPS][V2_MAXG], wl[V2_WARPS][V2_MAXG];
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

__global__ void merge_v2(int splits, int kv_heads, int G, int hd, const float *part_acc,
                         const float *part_m, const float *part_l, const float *v_scale,
                         float *out) {
    int hq = blockIdx.x, h = hq / G, j = hq % G;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, part_m[((size_t)s * kv_heads + h) * G + j]);
    double L = 0.0;
    for (int s = 0; s < splits; s++) {
        float ms = part_m[((size_t)s * kv_heads + h) * G + j];
        if (ms != -INFINITY) L += (double)part_l[((size_t)s * kv_heads + h) * G + j] * expf(ms - M);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        double a = 0.0;
        for (int s = 0; s < splits; s++) {
            float ms = part_m[((size_t)s * kv_heads + h) * G + j];
            if (ms != -INFINITY)
                a += (double)part_acc[(((size_t)s * kv_heads + h) * G + j) * hd + d] * expf(ms - M);
        }
        out[(size_t)hq * hd + d] = (float)(a / L) * v_scale[h];
    }
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
    merge_v2<<<(unsigned)n_heads, 128>>>((n_ctx + per_split - 1) / per_split, kv.kv_heads, G,
                                         kv.head_dim, pa, pm, pl, kv.v_scale, dout);
    return 0;
}

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
        size_t pool = (size_t)n_blocks * hv->kv_heads * hv->block_size * hv->head_dim *
                      kvd_fmt_bytes(hv->fmt),
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

extern "C" size_t kvd_cuda_attn_scratch_floats(int max_ctx, int n_heads, int head_dim) {
    size_t splits = (size_t)(max_ctx + 511) / 512;
    return splits * (size_t)n_heads * ((size_t)head_dim + 2);
}

extern "C" int kvd_cuda_attn_decode_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                                        const float *q, int n_heads, float sm_scale, float *out,
                                        float *scratch) {
    int G = n_heads / dv->kv_heads;
    if (!v2_ok(dv->head_dim, G)) return -1;
    int splits = (n_ctx + 511) / 512;
    size_t np = (size_t)splits * n_heads;
    float *pa = scratch, *pm = pa + np * dv->head_dim, *pl = pm + np;
    return launch_v2(dev_view(dv), (const int *)blocks, n_ctx, q, n_heads, sm_scale, out, splits,
                     pa, pm, pl);
}

extern "C" int kvd_cuda_attn_decode_v(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                      int n_ctx, const float *q, int n_heads, float sm_scale,
                                      float *out, int version) {
    const int hd = hv->head_dim, G = n_heads / hv->kv_heads;
    const int nb = (n_ctx + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * n_heads * hd;
    const bool v2 = version == 2 && v2_ok(hd, G);
    dev_cache dc;
    float *dq = nullptr, *dout = nullptr, *work = nullptr;
    int rc = -1;
    size_t wn = v2 ? kvd_cuda_attn_scratch_floats(n_ctx, n_heads, hd) : (size_t)n_heads * n_ctx;
    if (!dc.upload(hv, n_blocks, blocks, nb) || cudaMalloc(&dq, nq) || cudaMalloc(&dout, nq) ||
        cudaMalloc(&work, sizeof(float) * wn) || cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice))
        goto out;
    if (v2) {
        rc = kvd_cuda_attn_decode_dev(&dc.v, dc.blocks, n_ctx, dq, n_heads, sm_scale, dout, work);
    } else { /* the plain kernels: scores, softmax, weighted sum */
        view kv = dev_view(&dc.v);
        const int *db = (const int *)dc.blocks;
        dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)hv->kv_heads);
        scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, sm_scale, work);
        softmax_kernel<<<(unsigned)n_heads, 256>>>(work, n_ctx);
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

// The attention distribution of one query over positions [0, n_ctx): the
// plain scores and softmax kernels, on device pointers (kvd_attn_paged's
// probs; the drift figures' sampled rows).
extern "C" int kvd_cuda_attn_probs_dev(const kvd_kv_view *dv, const int32_t *blocks, int n_ctx,
                                       const float *q, int n_heads, float sm_scale, float *probs) {
    if (n_ctx < 1) return -1;
    view kv = dev_view(dv);
    dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)dv->kv_heads);
    scores_kernel<<<g1, 128>>>(kv, (const int *)blocks, n_ctx, q, n_heads, sm_scale, probs);
    softmax_kernel<<<(unsigned)n_heads, 256>>>(probs, n_ctx);
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
        __syncthreads();
        float part = 0.0f;
        for (int d = half * HD / 2; d < (half + 1) * HD / 2; d++)
            part += qs[warp * HD + d] * tile[t_lane * (HD + 1) + d];
        float s = (part + __shfl_xor_sync(0xffffffffu, part, 16)) * kmul;
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
        __syncthreads();
        for (int t = 0; t < nt; t++) {
            float pt = __shfl_sync(0xffffffffu, p, t);
            for (int i = 0; i < PER; i++) acc[i] += pt * tile[t * (HD + 1) + lane + 32 * i];
        }
    }
    float f = (float)(1.0 / l) * kv.v_scale[h];
    float *o = out + ((size_t)r * n_heads + j) * HD;
    for (int i = 0; i < PER; i++) o[lane + 32 * i] = acc[i] * f;
}

extern "C" int kvd_cuda_attn_prefill_dev(const kvd_kv_view *dv, const int32_t *blocks, int pos0,
                                         int n_q, const float *q, int n_heads, float sm_scale,
                                         float *out) {
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

extern "C" int kvd_cuda_attn_prefill(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                     int pos0, int n_q, const float *q, int n_heads, float sm_scale,
                                     float *out) {
    const int nb = (pos0 + n_q + hv->block_size - 1) / hv->block_size;
    const size_t nq = sizeof(float) * (size_t)n_q * n_heads * hv->head_dim;
    dev_cache dc;
    float *dq = nullptr, *dout = nullptr;
    int rc = -1;
    if (dc.upload(hv, n_blocks, blocks, nb) && cudaMalloc(&dq, nq) == cudaSuccess &&
        cudaMalloc(&dout, nq) == cudaSuccess &&
        cudaMemcpy(dq, q, nq, cudaMemcpyHostToDevice) == cudaSuccess &&
        kvd_cuda_attn_prefill_dev(&dc.v, dc.blocks, pos0, n_q, dq, n_heads, sm_scale, dout) == 0 &&
        cudaMemcpy(out, dout, nq, cudaMemcpyDeviceToHost) == cudaSuccess)
        rc = 0;
    cudaFree(dq), cudaFree(dout);
    return rc;
}

// ---- the same kernels on device memory, for the device model: the view's
// pools and scales and the block table are device pointers ----

extern "C" int kvd_cuda_attn_decode(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                    int n_ctx, const float *q, int n_heads, float sm_scale,
                                    float *out) {
    return kvd_cuda_attn_decode_v(hv, n_blocks, blocks, n_ctx, q, n_heads, sm_scale, out, 2);
}

/* Seconds per decode query (median-free best of reps) with the cache already
 * on the device: random codes in a scattered block table. */
extern "C" double kvd_cuda_bench_attn(int fmt, int n_ctx, int n_heads, int kv_heads, int head_dim,
                                      int reps, int version) {
    const int bs = 16, nb = (n_ctx + bs - 1) / bs;
    size_t esz = fmt == KVD_FMT_BF16 ? 2 : 1, pool = (size_t)nb * kv_heads * bs * head_dim * esz;
    unsigned char *dk = nullptr, *dv = nullptr;
    int *db = nullptr;
    float *dq = nullptr, *ds = nullptr, *dout = nullptr, *dsc = nullptr;
    double best = 0;
    if (cudaMalloc(&dk, pool) || cudaMalloc(&dv, pool) || cudaMalloc(&db, sizeof(int) * nb) ||
        cudaMalloc(&dq, sizeof(float) * n_heads * head_dim) ||
        cudaMalloc(&ds, sizeof(float) * (size_t)n_heads * n_ctx) ||
        cudaMalloc(&dout, sizeof(float) * n_heads * head_dim) ||
        cudaMalloc(&dsc, sizeof(float) * kv_heads))
        goto out;
    {
        /* codes 0x00..0x3f: finite values in every format */
        cudaMemset(dk, 0x31, pool);
        cudaMemset(dv, 0x2a, pool);
        cudaMemset(dq, 0, sizeof(float) * n_heads * head_dim);
        int *hb = (int *)malloc(sizeof(int) * nb);
        for (int i = 0; i < nb; i++) hb[i] = (int)(((long long)i * 7919) % nb);
        cudaMemcpy(db, hb, sizeof(int) * nb, cudaMemcpyHostToDevice);
        free(hb);
        float one[64];
        for (int i = 0; i < 64; i++) one[i] = 1.0f;
        cudaMemcpy(dsc, one, sizeof(float) * kv_heads, cudaMemcpyHostToDevice);
        view kv = {fmt, bs, kv_heads, head_dim, dk, dv, dsc, dsc};
        int splits = (n_ctx + 511) / 512;
        size_t np = (size_t)splits * n_heads;
        float *pa = nullptr, *pm = nullptr, *pl = nullptr;
        if (version == 2 &&
            (cudaMalloc(&pa, sizeof(float) * np * head_dim) ||
             cudaMalloc(&pm, sizeof(float) * np) || cudaMalloc(&pl, sizeof(float) * np)))
            version = 1;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        best = 1e30;
        for (int r = 0; r <= reps; r++) {
            cudaEventRecord(e0);
            if (version == 2) {
                launch_v2(kv, db, n_ctx, dq, n_heads, 0.0625f, dout, splits, pa, pm, pl);
            } else {
                dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)kv_heads);
                scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, 0.0625f, ds);
                softmax_kernel<<<(unsigned)n_heads, 256>>>(ds, n_ctx);
                pv_kernel<<<(unsigned)n_heads, (unsigned)((head_dim + 31) / 32 * 32)>>>(
                    kv, db, n_ctx, ds, n_heads, dout);
            }
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r && ms * 1e-3 < best) best = ms * 1e-3;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        cudaFree(pa), cudaFree(pm), cudaFree(pl);
        if (cudaGetLastError() != cudaSuccess) best = 0;
    }
out:
    cudaFree(dk), cudaFree(dv), cudaFree(db), cudaFree(dq), cudaFree(ds), cudaFree(dout),
        cudaFree(dsc);
    return best;
}
