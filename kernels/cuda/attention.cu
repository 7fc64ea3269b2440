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
    __half_raw h = __nv_cvt_fp8_to_halfraw(pool[idx], kv.fmt == KVD_FMT_E5M2 ? __NV_E5M2 : __NV_E4M3);
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

extern "C" int kvd_cuda_attn_decode(const kvd_kv_view *hv, int n_blocks, const int32_t *blocks,
                                    int n_ctx, const float *q, int n_heads, float sm_scale,
                                    float *out) {
    size_t esz = kvd_fmt_bytes(hv->fmt);
    size_t pool = (size_t)n_blocks * hv->kv_heads * hv->block_size * hv->head_dim * esz;
    int nb = (n_ctx + hv->block_size - 1) / hv->block_size;
    unsigned char *dk = nullptr, *dv = nullptr;
    int *db = nullptr;
    float *dq = nullptr, *ds = nullptr, *dout = nullptr, *dks = nullptr, *dvs = nullptr;
    int rc = -1;
    if (cudaMalloc(&dk, pool) || cudaMalloc(&dv, pool) || cudaMalloc(&db, sizeof(int) * nb) ||
        cudaMalloc(&dq, sizeof(float) * n_heads * hv->head_dim) ||
        cudaMalloc(&ds, sizeof(float) * (size_t)n_heads * n_ctx) ||
        cudaMalloc(&dout, sizeof(float) * n_heads * hv->head_dim) ||
        cudaMalloc(&dks, sizeof(float) * hv->kv_heads) || cudaMalloc(&dvs, sizeof(float) * hv->kv_heads))
        goto out;
    cudaMemcpy(dk, hv->k, pool, cudaMemcpyHostToDevice);
    cudaMemcpy(dv, hv->v, pool, cudaMemcpyHostToDevice);
    cudaMemcpy(db, blocks, sizeof(int) * nb, cudaMemcpyHostToDevice);
    cudaMemcpy(dq, q, sizeof(float) * n_heads * hv->head_dim, cudaMemcpyHostToDevice);
    cudaMemcpy(dks, hv->k_scale, sizeof(float) * hv->kv_heads, cudaMemcpyHostToDevice);
    cudaMemcpy(dvs, hv->v_scale, sizeof(float) * hv->kv_heads, cudaMemcpyHostToDevice);
    {
        view kv = {(int)hv->fmt, hv->block_size, hv->kv_heads, hv->head_dim, dk, dv, dks, dvs};
        dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)hv->kv_heads);
        scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, sm_scale, ds);
        softmax_kernel<<<(unsigned)n_heads, 256>>>(ds, n_ctx);
        pv_kernel<<<(unsigned)n_heads, (unsigned)((hv->head_dim + 31) / 32 * 32)>>>(kv, db, n_ctx, ds,
                                                                                  n_heads, dout);
        if (cudaMemcpy(out, dout, sizeof(float) * n_heads * hv->head_dim, cudaMemcpyDeviceToHost) ==
                cudaSuccess &&
            cudaGetLastError() == cudaSuccess)
            rc = 0;
    }
out:
    cudaFree(dk), cudaFree(dv), cudaFree(db), cudaFree(dq), cudaFree(ds), cudaFree(dout);
    cudaFree(dks), cudaFree(dvs);
    return rc;
}

/* Seconds per decode query (median-free best of reps) with the cache already
 * on the device: random codes in a scattered block table. */
extern "C" double kvd_cuda_bench_attn(int fmt, int n_ctx, int n_heads, int kv_heads, int head_dim,
                                      int reps) {
    const int bs = 16, nb = (n_ctx + bs - 1) / bs;
    size_t esz = fmt == KVD_FMT_BF16 ? 2 : 1, pool = (size_t)nb * kv_heads * bs * head_dim * esz;
    unsigned char *dk = nullptr, *dv = nullptr;
    int *db = nullptr;
    float *dq = nullptr, *ds = nullptr, *dout = nullptr, *dsc = nullptr;
    double best = 0;
    if (cudaMalloc(&dk, pool) || cudaMalloc(&dv, pool) || cudaMalloc(&db, sizeof(int) * nb) ||
        cudaMalloc(&dq, sizeof(float) * n_heads * head_dim) ||
        cudaMalloc(&ds, sizeof(float) * (size_t)n_heads * n_ctx) ||
        cudaMalloc(&dout, sizeof(float) * n_heads * head_dim) || cudaMalloc(&dsc, sizeof(float) * kv_heads))
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
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        best = 1e30;
        for (int r = 0; r <= reps; r++) {
            cudaEventRecord(e0);
            dim3 g1((unsigned)((n_ctx + 127) / 128), (unsigned)kv_heads);
            scores_kernel<<<g1, 128>>>(kv, db, n_ctx, dq, n_heads, 0.0625f, ds);
            softmax_kernel<<<(unsigned)n_heads, 256>>>(ds, n_ctx);
            pv_kernel<<<(unsigned)n_heads, (unsigned)((head_dim + 31) / 32 * 32)>>>(kv, db, n_ctx, ds,
                                                                                  n_heads, dout);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (r && ms * 1e-3 < best) best = ms * 1e-3;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        if (cudaGetLastError() != cudaSuccess) best = 0;
    }
out:
    cudaFree(dk), cudaFree(dv), cudaFree(db), cudaFree(dq), cudaFree(ds), cudaFree(dout), cudaFree(dsc);
    return best;
}
