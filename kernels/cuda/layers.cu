// kvdrift: the per-layer building blocks on the device, each the twin of a
// CPU function in kernels/ and held to it by tests/gpu: RMSNorm (kvd_rmsnorm),
// partial RoPE (kvd_rope), SwiGLU (kvd_swiglu), the paged cache write with its
// counters (kvd_kvcache_write), the gated delta rule step (kvd_gdn_step), MoE
// routing (kvd_route) and greedy sampling (kvd_argmax).
//
// Where the CPU rounds each product and sum separately (the host code is
// ISO C: no contraction into fused multiply-adds), the device code says so
// with __fmul_rn / __fadd_rn, so the two agree bit for bit wherever their
// libm calls (expf, cos) agree.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda_kernels.h"
#include "device_math.cuh"
#include "rht.cuh"

namespace {

// ---- RMSNorm: one block per row of n values (rows at strides; in place
// allowed), the sum of squares in double ----
// the row's norm from its sum of squares ss (the block's, in double)
__device__ inline void norm_row(float *o, const float *xr, const float *w, int n, double ss,
                                float eps, int one_plus) {
    float r = (float)(1.0 / sqrt(ss / n + (double)eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float g = one_plus ? __fadd_rn(1.0f, w[i]) : w[i];
        o[i] = __fmul_rn(__fmul_rn(xr[i], r), g);
    }
}
__global__ void rmsnorm_k(float *out, size_t out_stride, const float *x, size_t x_stride,
                          const float *w, int n, float eps, int one_plus) {
    const float *xr = x + (size_t)blockIdx.x * x_stride;
    norm_row(out + (size_t)blockIdx.x * out_stride, xr, w, n, block_sum_sq(xr, n), eps, one_plus);
}

// ---- the residual add with its check and the next RMSNorm, one block per
// row: x += y; the first non-finite value of y (check 0) or of the sum
// (check 1) as a flat index into *first; then, where w is given, out =
// RMSNorm(x) exactly as rmsnorm_k computes it (each thread sums the
// squares of the values it added, in rmsnorm_k's order). Three launches of
// the decode step's every layer, twice, in one. ----
__global__ void add_norm_k(float *x, const float *y, int n, unsigned long long *first, int check,
                           float *out, const float *w, float eps, int one_plus) {
    const size_t row = (size_t)blockIdx.x * n;
    float *xr = x + row;
    const float *yr = y + row;
    double ss = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = yr[i], s = __fadd_rn(xr[i], v);
        if (!isfinite(check ? s : v)) atomicMin(first, (unsigned long long)(row + i));
        xr[i] = s;
        ss += (double)s * s;
    }
    if (w) norm_row(out + row, xr, w, n, block_sum_warps(ss), eps, one_plus);
}

// ---- rotate-half RoPE on the first rot_dim of each head: one block per
// (row, head), the angle in double as on the CPU ----
// one head's rotation at position p, its pairs shared out over the block
__device__ inline void rope_head(float *x, int p, int rot_dim, const float *inv_freq) {
    const int half = rot_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double a = (double)p * inv_freq[i];
        float c = (float)cos(a), s = (float)sin(a);
        float x1 = x[i], x2 = x[i + half];
        x[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
        x[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
}
__global__ void rope_k(float *v, int heads, int stride, const int *pos, int rot_dim,
                       const float *inv_freq) {
    int r = blockIdx.x / heads, h = blockIdx.x % heads;
    rope_head(v + ((size_t)r * heads + h) * stride, pos[r], rot_dim, inv_freq);
}

// ---- the attention layer's query and key heads normed (q_norm, k_norm:
// rmsnorm_k's arithmetic over one head) and rotated (rope_k's), in place,
// one block per head: blocks [0, rows nh) the query heads (row r's head h
// at q + (r nh + h) q_stride), then the key heads (at k + (r kvh + h) hd).
// Four launches in one, bit for bit. ----
struct qk_args {
    float *q, *k;
    const float *q_norm, *k_norm, *inv_freq;
    const int *pos;
    int rows, nh, kvh, hd, q_stride, rot_dim;
    float eps;
};
__global__ void qk_norm_rope_k(qk_args a) {
    const int nq = a.rows * a.nh, is_q = (int)blockIdx.x < nq;
    const int b = is_q ? (int)blockIdx.x : (int)blockIdx.x - nq, r = b / (is_q ? a.nh : a.kvh);
    float *x = is_q ? a.q + (size_t)b * a.q_stride : a.k + (size_t)b * a.hd;
    norm_row(x, x, is_q ? a.q_norm : a.k_norm, a.hd, block_sum_sq(x, a.hd), a.eps, 1);
    __syncthreads(); // the rotation's pairs were normed by other threads
    rope_head(x, a.pos[r], a.rot_dim, a.inv_freq);
}

// ---- SwiGLU in place: g = silu(g) * u ----
__global__ void swiglu_k(float *g, const float *u, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = swiglu_rn(g[i], u[i]);
}

// ---- the paged cache write: one block per (token, KV head), one thread per
// dimension; counters as the CPU's (saturated: |x / scale| beyond the
// format's largest finite value; flushed: x != 0 stored as +-0; subnormal:
// a subnormal code) and the running absmax (non-negative floats order as
// their bit patterns) ----
struct write_args {
    int fmt, saturate, block_size, kv_heads, head_dim;
    const int32_t *slot; // [tokens] physical slot: block * block_size + offset
    const float *x;      // [tokens][kv_heads][head_dim]
    const float *scale;  // [kv_heads]
    unsigned char *pool;
    unsigned long long *stats; // n, saturated, flushed, subnormal
    unsigned int *absmax;      // [kv_heads] float bits
};

// E2M1 encode, the CPU's kvd_f32_to_e2m1 (round to nearest even, beyond 6
// clamped, NaN to +6) in comparisons every architecture has
__device__ inline unsigned e2m1_code(float x) {
    const float a = fabsf(x);
    if (a != a) return 7u;
    const unsigned m = a <= 0.25f   ? 0u
                       : a < 0.75f  ? 1u
                       : a <= 1.25f ? 2u
                       : a < 1.75f  ? 3u
                       : a <= 2.5f  ? 4u
                       : a < 3.5f   ? 5u
                       : a <= 5.0f  ? 6u
                                    : 7u;
    return (__float_as_uint(x) >> 28 & 8u) | m;
}

// one value of an NVFP4 row (fp8.h's rule): the 16 lanes of a group (half a
// warp; head_dim is a multiple of 16) find its largest magnitude, lane 0 of
// the group writes the block scale, even lanes a byte of two codes
__device__ inline void nvfp4_put(unsigned char *row, int hd, int d, float x, float scale,
                                 unsigned *sat, unsigned *ftz, unsigned *sub) {
    const unsigned mask = __activemask();
    float a = fmaxf(0.0f, fabsf(x));
    for (int o = 8; o > 0; o /= 2) a = fmaxf(a, __shfl_xor_sync(mask, a, o));
    const unsigned char sf = __nv_cvt_float_to_fp8(__fdiv_rn(__fdiv_rn(a, KVD_E2M1_MAX), scale),
                                                   __NV_SATFINITE, __NV_E4M3);
    const float dq = __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(sf, __NV_E4M3))), scale);
    const float y = dq > 0.0f ? __fdiv_rn(x, dq) : __fmul_rn(x, 0.0f);
    const unsigned c = e2m1_code(y), hi = __shfl_down_sync(mask, c, 1);
    if ((d & 1) == 0) row[d / 2] = (unsigned char)(c | hi << 4);
    if (d % 16 == 0) row[hd / 2 + d / 16] = sf;
    *sat = fabsf(y) >= 7.0f;
    *ftz = (c & 7u) == 0 && x != 0.0f;
    *sub = (sf & 0x78u) == 0 && sf != 0;
}

// the largest |x| of the block's threads (a NaN passed over, as fmaxf does
// on the CPU), in every thread; blockDim.x a multiple of 32, every thread
// taking part
__device__ inline float block_absmax(float x) {
    __shared__ float wmax[32];
    float a = fmaxf(0.0f, fabsf(x));
    for (int o = 16; o > 0; o /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if (threadIdx.x % 32 == 0) wmax[threadIdx.x / 32] = a;
    __syncthreads();
    a = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) a = fmaxf(a, wmax[w]);
    return a;
}

__global__ void kv_write_k(write_args a) {
    int t = blockIdx.x / a.kv_heads, h = blockIdx.x % a.kv_heads, d = threadIdx.x;
    const float *xr = a.x + ((size_t)t * a.kv_heads + h) * a.head_dim;
    // E4M3T, I8T: the row's largest magnitude, for its own scale, from every
    // thread of the block (the format is the whole launch's)
    const bool i8 = kvd_fmt_int8(a.fmt), own = kvd_fmt_row_scaled(a.fmt);
    const float rmax = own ? block_absmax(d < a.head_dim ? xr[d] : 0.0f) : 0.0f;
    if (d >= a.head_dim) return;
    int64_t slot = a.slot[t];
    int64_t blk = slot / a.block_size, off = slot % a.block_size;
    const size_t r = (size_t)(blk * a.kv_heads + h) * a.block_size + off;
    size_t idx = r * a.head_dim + d;
    float x = xr[d];
    atomicMax(&a.absmax[h], __float_as_uint(fabsf(x)));
    unsigned sat = 0, ftz = 0, sub = 0;
    if (own) { // fp8.h's rules: x times the reciprocal of the row's own scale
        const size_t seg = (size_t)(blk * a.kv_heads + h);
        unsigned char *row = a.pool + kvd_scaled_codes_at(a.head_dim, a.block_size, seg, (int)off),
                      *rsp = a.pool + kvd_scaled_scale_at(a.head_dim, a.block_size, seg, (int)off);
        const float rs =
            fmaxf(__fdiv_rn(rmax, i8 ? KVD_I8T_MAX : KVD_E4M3_MAX), KVD_E4M3T_MIN_SCALE);
        const float y = __fmul_rn(x, __frcp_rn(rs));
        if (d == 0) // the scale's bytes, little-endian, as the CPU's memcpy leaves them
            for (int i = 0; i < 4; i++) rsp[i] = (unsigned char)(__float_as_uint(rs) >> (8 * i));
        if (i8) { // clamped, then truncated (I8T_RN: rounded to nearest even)
            const float c = y >= 127.0f ? 127.0f : y <= -128.0f ? -128.0f : y == y ? y : 0.0f;
            const int q = a.fmt == KVD_FMT_I8T_RN ? __float2int_rn(c) : __float2int_rz(c);
            row[d] = (unsigned char)(signed char)q;
            sat = fabsf(y) >= 128.0f;
            ftz = q == 0 && x != 0.0f;
        } else { // saturating
            const unsigned char q = __nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3);
            row[d] = q;
            sat = fabsf(y) > 464.0f;
            ftz = (q & 0x7fu) == 0 && x != 0.0f;
            sub = (q & 0x78u) == 0 && (q & 0x7fu) != 0;
        }
    } else if (a.fmt == KVD_FMT_NVFP4) {
        nvfp4_put(a.pool + r * (a.head_dim / 2 + a.head_dim / 16), a.head_dim, d, x, a.scale[h],
                  &sat, &ftz, &sub);
    } else if (a.fmt == KVD_FMT_BF16) {
        __nv_bfloat16 b = __float2bfloat16_rn(x);
        reinterpret_cast<unsigned short *>(a.pool)[idx] = *reinterpret_cast<unsigned short *>(&b);
    } else {
        int e5 = a.fmt == KVD_FMT_E5M2;
        float y = __fdiv_rn(x, a.scale[h]);
        unsigned char q = __nv_cvt_float_to_fp8(y, a.saturate ? __NV_SATFINITE : __NV_NOSAT,
                                                e5 ? __NV_E5M2 : __NV_E4M3);
        a.pool[idx] = q;
        unsigned mag = q & 0x7fu, emask = e5 ? 0x7cu : 0x78u;
        sat = fabsf(y) > (e5 ? KVD_E5M2_MAX : KVD_E4M3_MAX);
        ftz = mag == 0 && x != 0.0f;
        sub = (mag & emask) == 0 && mag != 0;
    }
    // one atomic per warp and counter
    unsigned m = __activemask();
    unsigned ns = __popc(__ballot_sync(m, sat)), nf = __popc(__ballot_sync(m, ftz)),
             nu = __popc(__ballot_sync(m, sub)), nn = __popc(m);
    if ((int)(threadIdx.x & 31) == __ffs((int)m) - 1) {
        atomicAdd(&a.stats[0], (unsigned long long)nn);
        if (ns) atomicAdd(&a.stats[1], (unsigned long long)ns);
        if (nf) atomicAdd(&a.stats[2], (unsigned long long)nf);
        if (nu) atomicAdd(&a.stats[3], (unsigned long long)nu);
    }
}

// (int)(v + 0.5) or (int)(v - 0.5) by v's sign in FP32, v first clamped to
// [-1, 16] (a NaN to -1): the CPU's round_away (kvd_quant_i4t)
__device__ inline int i4t_round(float v) {
    v = fminf(fmaxf(v, -1.0f), 16.0f);
    return v >= 0.0f ? (int)__fadd_rn(v, 0.5f) : (int)__fsub_rn(v, 0.5f);
}

// the block's least and largest of v (a NaN passed over, as fminf and
// fmaxf do on the CPU) in every thread; blockDim.x a multiple of 32, every
// thread taking part
__device__ inline void block_minmax(float v, float *lo, float *hi) {
    __shared__ float wlo[32];
    __shared__ float whi[32];
    float a = v, b = v;
    for (int o = 16; o > 0; o /= 2) {
        a = fminf(a, __shfl_xor_sync(0xffffffffu, a, o));
        b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, o));
    }
    if (threadIdx.x % 32 == 0) wlo[threadIdx.x / 32] = a, whi[threadIdx.x / 32] = b;
    __syncthreads();
    a = INFINITY, b = -INFINITY;
    for (int w = 0; w < (int)blockDim.x / 32; w++) a = fminf(a, wlo[w]), b = fmaxf(b, whi[w]);
    *lo = a, *hi = b;
}

// int4-token's write (kvd_quant_i4t): one block a (token, head), one thread
// a value (head_dim a power of two from 32 to 1024): the row rotated in
// shared memory, rounded to BF16, its grid, codes and scale word; the
// counters as kv_write_k keeps them
__global__ void kv_write_i4t_k(write_args a, kvd_rht_bits b) {
    __shared__ float y[1024];
    const int t = blockIdx.x / a.kv_heads, h = blockIdx.x % a.kv_heads, d = threadIdx.x;
    const int hd = a.head_dim;
    const float x = a.x[((size_t)t * a.kv_heads + h) * hd + d];
    atomicMax(&a.absmax[h], __float_as_uint(fabsf(x)));
    y[d] = x;
    __syncthreads();
    block_rht(y, hd, false, b);
    const float v = __bfloat162float(__float2bfloat16_rn(y[d]));
    float lo, hi;
    block_minmax(v, &lo, &hi);
    const float s = fmaxf(__fdiv_rn(__fsub_rn(hi, lo), KVD_I4T_MAX), KVD_E4M3T_MIN_SCALE);
    const float inv = __fdiv_rn(1.0f, s);
    const int z = min(max(i4t_round(__fdiv_rn(-lo, s)), 0), 15);
    const int r = i4t_round(fmaf(v, inv, (float)z)), q = min(max(r, 0), 15);
    const int64_t slot = a.slot[t], blk = slot / a.block_size, off = slot % a.block_size;
    const size_t seg = (size_t)(blk * a.kv_heads + h), nc = (size_t)hd / 2;
    const int hi_q = __shfl_down_sync(0xffffffffu, q, 1);
    if ((d & 1) == 0)
        a.pool[kvd_scaled_codes_at(nc, a.block_size, seg, (int)off) + d / 2] =
            (unsigned char)(q | hi_q << 4);
    if (d == 0) { // the scale word's bytes, little-endian, as the CPU's memcpy leaves them
        unsigned char *rsp = a.pool + kvd_scaled_scale_at(nc, a.block_size, seg, (int)off);
        const unsigned bits = kvd_i4t_word(__float_as_uint(s), z);
        for (int i = 0; i < 4; i++) rsp[i] = (unsigned char)(bits >> (8 * i));
    }
    const unsigned ns = __popc(__ballot_sync(0xffffffffu, r != q)),
                   nf = __popc(__ballot_sync(0xffffffffu, q == z && v != 0.0f));
    if (d % 32 == 0) {
        atomicAdd(&a.stats[0], 32ull);
        if (ns) atomicAdd(&a.stats[1], (unsigned long long)ns);
        if (nf) atomicAdd(&a.stats[2], (unsigned long long)nf);
    }
}

// ---- the gated delta rule, one block per head, one thread per value
// dimension: every sum in the CPU's order (over the key dimension) ----
__global__ void gdn_step_k(float *S, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, float *o, int dk, int dv) {
    int h = blockIdx.x, j = threadIdx.x;
    if (j >= dv) return;
    o[(size_t)h * dv + j] =
        gdn_column(S + (size_t)h * dk * dv, q + (size_t)h * dk, k + (size_t)h * dk,
                   v[(size_t)h * dv + j], g[h], beta[h], dk, dv, j);
}

// ---- the gated delta rule over a run of tokens in chunks (prefill), the
// twin of kvd_gdn_chunked: one block per head, the chunk's phases separated
// by barriers, every element's sum in the CPU's order. X ([U | W], then the
// pseudo-values D in U) lives in global scratch, A and Q K^T in shared
// memory. ----
constexpr int GDN_C = KVD_GDN_CHUNK;

__global__ void gdn_chunked_k(float *S_all, const float *q_all, const float *k_all,
                              const float *v_all, const float *g_all, const float *b_all,
                              float *o_all, float *X_all, int n, int dk, int dv) {
    __shared__ double G[GDN_C];
    __shared__ float A[GDN_C * GDN_C];
    __shared__ float QK[GDN_C * GDN_C];
    const int h = blockIdx.x, w = dv + dk, tid = threadIdx.x, nth = blockDim.x;
    float *S = S_all + (size_t)h * dk * dv, *X = X_all + (size_t)h * GDN_C * w;
    const float *q = q_all + (size_t)h * n * dk, *k = k_all + (size_t)h * n * dk,
                *v = v_all + (size_t)h * n * dv, *g = g_all + (size_t)h * n,
                *beta = b_all + (size_t)h * n;
    float *o = o_all + (size_t)h * n * dv;
    for (int c0 = 0; c0 < n; c0 += GDN_C) {
        const int nc = min(GDN_C, n - c0);
        if (tid == 0) {
            double acc = 0.0;
            for (int t = 0; t < nc; t++) G[t] = acc += g[c0 + t];
        }
        __syncthreads();
        for (int e = tid; e < nc * w; e += nth) {
            int t = e / w, j = e % w;
            float bt = beta[c0 + t];
            X[e] = j < dv ? __fmul_rn(bt, v[(size_t)(c0 + t) * dv + j])
                          : __fmul_rn(__fmul_rn(bt, (float)exp(G[t])),
                                      k[(size_t)(c0 + t) * dk + (j - dv)]);
        }
        for (int e = tid; e < nc * nc; e += nth) {
            int t = e / nc, s = e % nc;
            const float *qt = q + (size_t)(c0 + t) * dk, *kt = k + (size_t)(c0 + t) * dk,
                        *ks = k + (size_t)(c0 + s) * dk;
            float dkk = 0.0f, dqk = 0.0f;
            for (int i = 0; i < dk; i++) {
                if (s < t) dkk = __fadd_rn(dkk, __fmul_rn(kt[i], ks[i]));
                if (s <= t) dqk = __fadd_rn(dqk, __fmul_rn(qt[i], ks[i]));
            }
            A[t * GDN_C + s] =
                s < t ? __fmul_rn(__fmul_rn(beta[c0 + t], (float)exp(G[t] - G[s])), dkk) : 0.0f;
            QK[t * GDN_C + s] = s <= t ? __fmul_rn(dqk, (float)exp(G[t] - G[s])) : 0.0f;
        }
        __syncthreads();
        for (int t = 1; t < nc; t++) { // forward substitution: row t after rows < t
            for (int j = tid; j < w; j += nth) {
                float x = X[(size_t)t * w + j];
                for (int s = 0; s < t; s++)
                    x = __fsub_rn(x, __fmul_rn(A[t * GDN_C + s], X[(size_t)s * w + j]));
                X[(size_t)t * w + j] = x;
            }
            __syncthreads();
        }
        for (int e = tid; e < nc * dv; e += nth) { // D = U - W S0
            int t = e / dv, j = e % dv;
            float x = X[(size_t)t * w + j];
            for (int i = 0; i < dk; i++)
                x = __fsub_rn(x, __fmul_rn(X[(size_t)t * w + dv + i], S[(size_t)i * dv + j]));
            X[(size_t)t * w + j] = x;
        }
        __syncthreads();
        for (int e = tid; e < nc * dv; e += nth) { // outputs, from S0
            int t = e / dv, j = e % dv;
            const float *qt = q + (size_t)(c0 + t) * dk;
            float ef = (float)exp(G[t]), ot = 0.0f;
            for (int i = 0; i < dk; i++)
                ot = __fadd_rn(ot, __fmul_rn(__fmul_rn(qt[i], ef), S[(size_t)i * dv + j]));
            for (int s = 0; s <= t; s++)
                ot = __fadd_rn(ot, __fmul_rn(QK[t * GDN_C + s], X[(size_t)s * w + j]));
            o[(size_t)(c0 + t) * dv + j] = ot;
        }
        __syncthreads();
        const float eC = (float)exp(G[nc - 1]);
        for (int e = tid; e < dk * dv; e += nth) { // the state at the chunk's end
            int i = e / dv, j = e % dv;
            float x = __fmul_rn(S[e], eC);
            for (int s = 0; s < nc; s++) {
                float f = (float)exp(G[nc - 1] - G[s]);
                float ki = __fmul_rn(k[(size_t)(c0 + s) * dk + i], f);
                x = __fadd_rn(x, __fmul_rn(ki, X[(size_t)s * w + j]));
            }
            S[e] = x;
        }
        __syncthreads();
    }
}

// ---- MoE routing: softmax over the experts (sum in double), the top k
// (ties to the lower index), optionally renormalised; one block per row ----
// a block's largest v (ties: the lowest i) into every thread, i -1 where
// nothing was offered; blockDim.x a power of two up to ROUTE_THREADS
constexpr int ROUTE_THREADS = 128, ROUTE_MAX_K = 64; // the config's KVD_MAX_TOPK
__device__ inline void block_best(float *v, int *i) {
    __shared__ float bv[ROUTE_THREADS];
    __shared__ int bi[ROUTE_THREADS];
    bv[threadIdx.x] = *v, bi[threadIdx.x] = *i;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            const float ov = bv[threadIdx.x + w];
            const int oi = bi[threadIdx.x + w], mi = bi[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < mi)))
                bv[threadIdx.x] = ov, bi[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    *v = bv[0], *i = bi[0];
    __syncthreads(); // bv and bi are free again
}

// kvd_route for row blockIdx.x, ROUTE_THREADS threads: the maximum, the
// exponentials and the normalisation element-wise across the threads; the
// softmax's sum in double in the CPU's order (one thread); the top K as K
// rounds of the largest probability not yet taken, the lowest expert of a
// tie first, which is the order of kvd_topk's insertion
__global__ void route_k(const float *logits, int E, int K, int norm, int *topi, float *topw) {
    extern __shared__ float p[];
    __shared__ float inv;
    __shared__ float chosen[ROUTE_MAX_K];
    const float *x = logits + (size_t)blockIdx.x * E;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        p[e] = x[e];
        m = p[e] > m ? p[e] : m;
    }
    int any = (int)threadIdx.x; // every thread's maximum takes part
    block_best(&m, &any);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = expf(__fsub_rn(p[e], m));
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += p[e];
        inv = (float)(1.0 / sum);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = __fmul_rn(p[e], inv);
    __syncthreads();
    int *idx = topi + (size_t)blockIdx.x * K;
    for (int j = 0; j < K; j++) {
        // probabilities are >= 0; a taken one is -1. A NaN (from a NaN
        // logit: the step reports it at its end) is offered too, so that
        // every round takes an expert in range, as kvd_topk does
        float bv = -1.0f;
        int bi = -1;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (!(p[e] < 0.0f) && (bi < 0 || p[e] > bv)) bv = p[e], bi = e;
        block_best(&bv, &bi);
        if (threadIdx.x == 0) {
            idx[j] = bi, chosen[j] = bv;
            p[bi] = -1.0f;
        }
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    double s = 0.0;
    for (int j = 0; j < K; j++) s += chosen[j];
    for (int j = 0; j < K; j++)
        topw[(size_t)blockIdx.x * K + j] = norm ? (float)(chosen[j] / s) : chosen[j];
}

// ---- greedy sampling: the first largest logit of each row (rows free of
// NaN: the model stops on a NaN activation before sampling) ----
__global__ void argmax_k(const float *x, int n, int *out) {
    const float *r = x + (size_t)blockIdx.x * n;
    float best = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (bi < 0 || r[i] > best) best = r[i], bi = i;
    __shared__ float sv[1024];
    __shared__ int si[1024];
    sv[threadIdx.x] = best, si[threadIdx.x] = bi;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            float ov = sv[threadIdx.x + w];
            int oi = si[threadIdx.x + w];
            int mine = si[threadIdx.x];
            if (oi >= 0 &&
                (mine < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mine))) {
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] < 0 ? 0 : si[0];
}

// ---- host plumbing: device buffers that free themselves ----
struct dbuf {
    void *p = nullptr;
    ~dbuf() { cudaFree(p); }
    bool alloc(size_t n) { return cudaMalloc(&p, n ? n : 1) == cudaSuccess; }
    bool put(const void *h, size_t n) {
        return alloc(n) && cudaMemcpy(p, h, n, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    bool get(void *h, size_t n) const {
        return cudaMemcpy(h, p, n, cudaMemcpyDeviceToHost) == cudaSuccess;
    }
    template <class T> T *as() const { return static_cast<T *>(p); }
};

int finish(bool ok) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) std::fprintf(stderr, "kvdrift cuda: %s\n", cudaGetErrorString(e));
    return ok && e == cudaSuccess ? 0 : -1;
}

} // namespace

extern "C" int kvd_cuda_rmsnorm(float *out, const float *x, const float *w, int rows, int n,
                                float eps, int one_plus) {
    dbuf dx, dw, dout;
    size_t nb = sizeof(float) * (size_t)rows * n;
    if (!dx.put(x, nb) || !dw.put(w, sizeof(float) * n) || !dout.alloc(nb)) return -1;
    kvd_cudaop_rmsnorm(dout.as<float>(), (size_t)n, dx.as<float>(), (size_t)n, dw.as<float>(), rows,
                       n, eps, one_plus);
    return finish(dout.get(out, nb));
}

extern "C" int kvd_cuda_rope(float *v, int rows, int heads, int stride, const int *pos, int rot_dim,
                             const float *inv_freq) {
    dbuf dv, dp, df;
    size_t nb = sizeof(float) * (size_t)rows * heads * stride;
    if (!dv.put(v, nb) || !dp.put(pos, sizeof(int) * rows) ||
        !df.put(inv_freq, sizeof(float) * (rot_dim / 2)))
        return -1;
    kvd_cudaop_rope(dv.as<float>(), rows, heads, stride, dp.as<int>(), rot_dim, df.as<float>());
    return finish(dv.get(v, nb));
}

extern "C" int kvd_cuda_swiglu(float *g, const float *u, size_t n) {
    dbuf dg, du;
    if (!dg.put(g, sizeof(float) * n) || !du.put(u, sizeof(float) * n)) return -1;
    kvd_cudaop_swiglu(dg.as<float>(), du.as<float>(), n);
    return finish(dg.get(g, sizeof(float) * n));
}

extern "C" int kvd_cuda_kv_write(kvd_fmt fmt, int saturate, int block_size, int kv_heads,
                                 int head_dim, void *pool, size_t pool_bytes, int n_tok,
                                 const int32_t *slot, const float *x, const float *scale,
                                 kvd_qstats *st, float *absmax) {
    if (head_dim > 1024) return -1;
    dbuf dpool, dslot, dx, dsc, dst, dabs;
    unsigned long long s0[4] = {0, 0, 0, 0};
    unsigned int a0[64];
    if (kv_heads > 64) return -1;
    for (int h = 0; h < kv_heads; h++) {
        float m = absmax[h];
        memcpy(&a0[h], &m, sizeof m);
    }
    size_t nx = sizeof(float) * (size_t)n_tok * kv_heads * head_dim;
    if (!dpool.put(pool, pool_bytes) || !dslot.put(slot, sizeof(int32_t) * n_tok) ||
        !dx.put(x, nx) || !dsc.put(scale, sizeof(float) * kv_heads) || !dst.put(s0, sizeof s0) ||
        !dabs.put(a0, sizeof(unsigned) * kv_heads))
        return -1;
    kvd_cudaop_kv_write(fmt, saturate, block_size, kv_heads, head_dim, dpool.p, n_tok,
                        dslot.as<int32_t>(), dx.as<float>(), dsc.as<float>(),
                        dst.as<unsigned long long>(), dabs.as<unsigned int>());
    bool ok = dpool.get(pool, pool_bytes) && dst.get(s0, sizeof s0) &&
              dabs.get(a0, sizeof(unsigned) * kv_heads);
    st->n += s0[0], st->saturated += s0[1], st->flushed += s0[2], st->subnormal += s0[3];
    for (int h = 0; h < kv_heads; h++) memcpy(&absmax[h], &a0[h], sizeof(float));
    return finish(ok);
}

extern "C" int kvd_cuda_gdn_step(float *S, const float *q, const float *k, const float *v,
                                 const float *g, const float *beta, float *o, int heads, int dk,
                                 int dv) {
    if (dv > 1024) return -1;
    dbuf dS, dq, dk_, dv_, dg, db, dout;
    size_t ns = sizeof(float) * (size_t)heads * dk * dv;
    if (!dS.put(S, ns) || !dq.put(q, sizeof(float) * heads * dk) ||
        !dk_.put(k, sizeof(float) * heads * dk) || !dv_.put(v, sizeof(float) * heads * dv) ||
        !dg.put(g, sizeof(float) * heads) || !db.put(beta, sizeof(float) * heads) ||
        !dout.alloc(sizeof(float) * heads * dv))
        return -1;
    gdn_step_k<<<heads, (dv + 31) / 32 * 32>>>(dS.as<float>(), dq.as<float>(), dk_.as<float>(),
                                               dv_.as<float>(), dg.as<float>(), db.as<float>(),
                                               dout.as<float>(), dk, dv);
    bool ok = dS.get(S, ns) && dout.get(o, sizeof(float) * heads * dv);
    return finish(ok);
}

extern "C" int kvd_cuda_gdn_chunked(float *S, const float *q, const float *k, const float *v,
                                    const float *g, const float *beta, float *o, int heads, int n,
                                    int dk, int dv) {
    dbuf dS, dq, dk_, dv_, dg, db, dout, dX;
    size_t ns = sizeof(float) * (size_t)heads * dk * dv, nq = sizeof(float) * (size_t)heads * n;
    if (!dS.put(S, ns) || !dq.put(q, nq * dk) || !dk_.put(k, nq * dk) || !dv_.put(v, nq * dv) ||
        !dg.put(g, nq) || !db.put(beta, nq) || !dout.alloc(nq * dv) ||
        !dX.alloc(sizeof(float) * (size_t)heads * GDN_C * (dk + dv)))
        return -1;
    gdn_chunked_k<<<heads, 256>>>(dS.as<float>(), dq.as<float>(), dk_.as<float>(), dv_.as<float>(),
                                  dg.as<float>(), db.as<float>(), dout.as<float>(), dX.as<float>(),
                                  n, dk, dv);
    bool ok = dS.get(S, ns) && dout.get(o, nq * dv);
    return finish(ok);
}

extern "C" int kvd_cuda_route(const float *logits, int rows, int E, int K, int norm, int *topi,
                              float *topw) {
    dbuf dl, di, dw;
    if (K > ROUTE_MAX_K || !dl.put(logits, sizeof(float) * (size_t)rows * E) ||
        !di.alloc(sizeof(int) * (size_t)rows * K) || !dw.alloc(sizeof(float) * (size_t)rows * K))
        return -1;
    kvd_cudaop_route(dl.as<float>(), rows, E, K, norm, di.as<int>(), dw.as<float>());
    bool ok = di.get(topi, sizeof(int) * (size_t)rows * K) &&
              dw.get(topw, sizeof(float) * (size_t)rows * K);
    return finish(ok);
}

extern "C" int kvd_cuda_argmax(const float *x, int rows, int n, int *out) {
    dbuf dx, dout;
    if (!dx.put(x, sizeof(float) * (size_t)rows * n) || !dout.alloc(sizeof(int) * rows)) return -1;
    argmax_k<<<rows, 1024>>>(dx.as<float>(), n, dout.as<int>());
    return finish(dout.get(out, sizeof(int) * rows));
}

// ---- the same on device memory (asynchronous): the device model's
// kvd_cudaop_* for these blocks ----
extern "C" void kvd_cudaop_kv_write(kvd_fmt fmt, int saturate, int block_size, int kv_heads,
                                    int head_dim, void *pool, int n_tok, const int32_t *slot,
                                    const float *x, const float *scale, unsigned long long *stats,
                                    unsigned int *absmax) {
    if (n_tok <= 0) return;
    write_args a = {
        fmt,   saturate, block_size, kv_heads, head_dim, slot, x, scale, (unsigned char *)pool,
        stats, absmax};
    if (fmt == KVD_FMT_I4T) // (head_dim a power of two: kvd_kv_mode_fits; at most 1024)
        kv_write_i4t_k<<<n_tok * kv_heads, head_dim>>>(a, rht_bits());
    else
        kv_write_k<<<n_tok * kv_heads, (head_dim + 31) / 32 * 32>>>(a);
}

// one block a (row, head), the absmax of its head_dim values into the head's
__global__ void absmax_heads_k(const float *x, int heads, int head_dim, unsigned int *absmax) {
    const int h = blockIdx.x % heads;
    const float *r = x + (size_t)blockIdx.x * head_dim;
    unsigned m = 0;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const float a = fabsf(r[d]);
        if (a == a) m = max(m, __float_as_uint(a)); // a NaN is passed over, as on the CPU
    }
    for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(&absmax[h], m);
}

extern "C" void kvd_cudaop_absmax_heads(const float *x, int rows, int heads, int head_dim,
                                        unsigned int *absmax) {
    if (rows <= 0) return;
    absmax_heads_k<<<rows * heads, 32>>>(x, heads, head_dim, absmax);
}

extern "C" void kvd_cudaop_argmax(const float *x, int rows, int n, int *out) {
    if (rows > 0) argmax_k<<<rows, 1024>>>(x, n, out);
}
extern "C" void kvd_cudaop_route(const float *logits, int rows, int E, int K, int norm, int *topi,
                                 float *topw) {
    if (rows > 0 && K <= ROUTE_MAX_K)
        route_k<<<rows, ROUTE_THREADS, sizeof(float) * E>>>(logits, E, K, norm, topi, topw);
}

extern "C" void kvd_cudaop_rmsnorm(float *out, size_t out_stride, const float *x, size_t x_stride,
                                   const float *w, int rows, int n, float eps, int one_plus) {
    if (rows > 0) rmsnorm_k<<<rows, 256>>>(out, out_stride, x, x_stride, w, n, eps, one_plus);
}

extern "C" void kvd_cudaop_add_norm(float *x, const float *y, int rows, int n,
                                    unsigned long long *first, int check_sum, float *out,
                                    const float *w, float eps, int one_plus) {
    if (rows > 0) add_norm_k<<<rows, 256>>>(x, y, n, first, check_sum, out, w, eps, one_plus);
}

extern "C" void kvd_cudaop_rope(float *v, int rows, int heads, int stride, const int *pos,
                                int rot_dim, const float *inv_freq) {
    if (rows > 0 && rot_dim > 0)
        rope_k<<<rows * heads, 64>>>(v, heads, stride, pos, rot_dim, inv_freq);
}

extern "C" void kvd_cudaop_qk_norm_rope(float *q, int q_stride, float *k, const float *q_norm,
                                        const float *k_norm, int rows, int nh, int kvh, int hd,
                                        float eps, const int *pos, int rot_dim,
                                        const float *inv_freq) {
    if (rows <= 0) return;
    const qk_args a{q, k, q_norm, k_norm, inv_freq, pos, rows, nh, kvh, hd, q_stride, rot_dim, eps};
    qk_norm_rope_k<<<rows *(nh + kvh), 256>>>(a);
}

extern "C" void kvd_cudaop_swiglu(float *g, const float *u, size_t n) {
    if (n > 0) swiglu_k<<<(unsigned)((n + 255) / 256), 256>>>(g, u, n);
}
