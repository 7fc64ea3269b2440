// kvdrift: the SIMT simulator itself: barriers, shared memory, every warp
// operation against what CUDA defines, divergent warps, the checks it makes
// (launch limits, non-device pointers, copies out of bounds, divergence),
// its FP8 and BF16 conversions against the CPU codecs, its cuBLASLt
// against a plain product, and kernels/cuda/mma.cuh's portable MMA and
// ldmatrix bodies (through its warp gather) against the ISA's layouts. The kernels here are written
// as the translated .cu files read: `kernel % kvd_simt::launch(name, grid, block)(args)`.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "cuda_fp8.h"
#include "cuda_runtime.h"
#include "fp8.h"

#include "../../kernels/cuda/cuda_kernels.h"
#include "../../kernels/cuda/device_math.cuh"
#include "../../kernels/cuda/mma.cuh"
#include "../gpu/check.h"

using kvd_simt::launch;

namespace {

// a block's sum through shared memory and halving barriers
__global__ void block_sum(const int *x, int *out) {
    __shared__ int s[256];
    s[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// each lane's 16 partial sums (x, lane-major): the first R rows' warp sums
// by warp_rows_sum (fold: one per lane, the sum of the row it holds) and
// row by row through a plain xor butterfly (plain: R per warp)
template <int R> __global__ void rows_sum_k(const float *x, float *fold, float *plain) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float acc[16];
    for (int i = 0; i < 16; i++) acc[i] = x[(size_t)threadIdx.x * 16 + i];
    for (int i = 0; i < R; i++) {
        float a = acc[i];
        for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0) plain[warp * 16 + i] = a;
    }
    fold[threadIdx.x] = warp_rows_sum<R>(acc, lane);
}

// splitmix64, and from it values of either sign with 24 significant bits
// and exponents of -e .. e: sums of them change with their order
struct spread_rng {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15u);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        return z ^ (z >> 31);
    }
    float spread(int e) {
        const uint64_t r = next();
        const float m = 1.0f + (float)(r >> 40) / 16777216.0f;
        return std::ldexp(r & 1 ? -m : m, (int)((r >> 8) % (uint64_t)(2 * e + 1)) - e);
    }
};

// every warp operation, one row of results per kind and thread
__global__ void warp_ops(int *out, int n) {
    const int t = threadIdx.x, lane = t % 32;
    int v = 100 + t;
    int x = v;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    out[0 * n + t] = x; // the warp's sum, in every lane
    int d = v;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_down_sync(0xffffffffu, d, o);
    out[1 * n + t] = d; // lane 0 holds the sum
    out[2 * n + t] = __shfl_sync(0xffffffffu, v, 5);
    out[3 * n + t] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    double dv = 0.5 * t;
    out[4 * n + t] = (int)(2 * __shfl_xor_sync(0xffffffffu, dv, 1));
    out[5 * n + t] = __shfl_sync(lane < 16 ? 0x0000ffffu : 0xffff0000u, v, lane + 1, 16);
    if (lane >= 20) return;
    out[6 * n + t] = (int)__activemask();
}

// warps that run different numbers of shuffles before meeting at a barrier
__global__ void divergent(int *out) {
    const int warp = threadIdx.x / 32;
    int acc = 0;
    for (int i = 0; i <= warp * 3; i++) acc += __shfl_xor_sync(0xffffffffu, i + 1, 1);
    __syncthreads();
    __shared__ int first;
    if (threadIdx.x == 0) first = acc;
    __syncthreads();
    out[threadIdx.x] = acc * 1000 + first;
}

// per-thread state kept across many switches
__global__ void keeps_locals(double *out) {
    double a[64];
    for (int i = 0; i < 64; i++) a[i] = threadIdx.x * 64.0 + i;
    for (int r = 0; r < 10; r++) {
        __syncthreads();
        for (int i = 0; i < 64; i++) a[i] = a[i] * 1.5 - 1.0;
    }
    double s = 0;
    for (int i = 0; i < 64; i++) s += a[i];
    out[threadIdx.x] = s;
}

__global__ void geometry(int *out) {
    const int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    const int b = blockIdx.y * gridDim.x + blockIdx.x;
    out[b * 64 + t] = (int)(__ballot_sync(0xffffffffu, threadIdx.y == 1) | (unsigned)b << 24);
}

__global__ void dyn_shared(float *out) {
    float *s = static_cast<float *>(kvd_simt::dynamic_shared());
    s[threadIdx.x] = 2.0f * threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

// two gathers in a row: lane l offers {100 l, 100 l + 1, 100 l + 2}, then
// {7 l}; it keeps what lane (l + 5) % 32 offered
__global__ void gathers(unsigned *out) {
    const unsigned l = threadIdx.x % 32, w = threadIdx.x / 32;
    const unsigned a[3] = {100 * l + 1000 * w, 100 * l + 1000 * w + 1, 100 * l + 1000 * w + 2};
    const unsigned(*t)[8] = kvd_simt::warp_gather(a, 3);
    const unsigned src = (l + 5) % 32;
    out[4 * threadIdx.x] = t[src][0], out[4 * threadIdx.x + 1] = t[src][2];
    const unsigned b = 7 * l;
    t = kvd_simt::warp_gather(&b, 1);
    out[4 * threadIdx.x + 2] = t[src][0], out[4 * threadIdx.x + 3] = t[31 - l][0];
}
__global__ void half_gather(unsigned *out) {
    if (threadIdx.x % 32 >= 16) return;
    const unsigned v = threadIdx.x;
    out[threadIdx.x] = kvd_simt::warp_gather(&v, 1)[0][0];
}

// one m16n8k16 product from fragments built as the PTX ISA lays them out
// (lane 4 g + t): A 16 x 16 row-major, B 16 x 8 (k x n), C 16 x 8; and the
// two 8 x 8 matrices of a 16 x 8 block in shared memory through ldmatrix
// .trans (row i of the block at 16 i bytes; lane i < 16 names row i)
template <bool F16>
__global__ void mma_tile(const unsigned short *A, const unsigned short *B, float *C, unsigned *T) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto pair = [](const unsigned short *p, int i, int j) { return (unsigned)p[i] | p[j] << 16; };
    const unsigned a[4] = {pair(A, g * 16 + 2 * t, g * 16 + 2 * t + 1),
                           pair(A, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1),
                           pair(A, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9),
                           pair(A, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9)};
    const unsigned b[2] = {pair(B, 2 * t * 8 + g, (2 * t + 1) * 8 + g),
                           pair(B, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g)};
    float c[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    kvd_mma::mma<F16>(c, a, b);
    C[g * 8 + 2 * t] = c[0], C[g * 8 + 2 * t + 1] = c[1];
    C[(g + 8) * 8 + 2 * t] = c[2], C[(g + 8) * 8 + 2 * t + 1] = c[3];
    __shared__ unsigned short blk[16 * 8];
    for (int i = lane; i < 128; i += 32) blk[i] = A[i];
    __syncthreads();
    unsigned r[2];
    kvd_mma::ldsm_x2_trans(r, blk + 8 * (lane & 15));
    T[2 * lane] = r[0], T[2 * lane + 1] = r[1];
}

// the simulator's mma.sync (kvd_mma::mma) against mma_portable, the
// per-lane body it stands for, on the same fragments (each lane's registers
// from R: 6 words a lane); C starts at c0 for both
template <bool F16> __global__ void mma_both(const unsigned *R, const float *c0, float *out) {
    const int lane = threadIdx.x;
    const unsigned *r = R + 6 * lane;
    const unsigned a[4] = {r[0], r[1], r[2], r[3]}, b[2] = {r[4], r[5]};
    float c[4], p[4];
    for (int i = 0; i < 4; i++) c[i] = p[i] = c0[4 * lane + i];
    kvd_mma::mma<F16>(c, a, b);
    kvd_mma::mma_portable<F16>(p, a, b);
    for (int i = 0; i < 4; i++) out[8 * lane + i] = c[i], out[8 * lane + 4 + i] = p[i];
}
// mma.sync by the first 16 lanes only: the launch fails
__global__ void half_mma(float *out) {
    const unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    if (threadIdx.x < 16) kvd_mma::mma<true>(c, a, b);
    out[threadIdx.x] = c[0];
}

// shared memory is a block's own: block 0 writes its static and dynamic
// shared memory, every block reads them back (translate.cmake writes a
// __shared__ declaration as the static and the shared_fresh call); the
// declaration is reached twice by each thread, and the second keeps what
// the first pass wrote
__global__ void block_shared(float *out) {
    float *d = static_cast<float *>(kvd_simt::dynamic_shared());
    const unsigned t = threadIdx.x;
    for (int pass = 0; pass < 2; pass++) {
        static float s[64];
        kvd_simt::shared_fresh(&s, sizeof s);
        if (pass == 0 && blockIdx.x == 0) s[t] = 1.0f, d[t] = 2.0f;
        __syncthreads();
        if (pass == 1) out[blockIdx.x * 128 + t] = s[t], out[blockIdx.x * 128 + 64 + t] = d[t];
        __syncthreads();
    }
}

__global__ void copy_of(float *out, const float *in) {
    out[threadIdx.x] = in[threadIdx.x];
}

__global__ void touch(float *p) {
    p[threadIdx.x] = 1.0f;
}

__global__ void exits_early(int *out) {
    if (threadIdx.x % 32 >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void barrier_split(int *out) {
    if (threadIdx.x < 32) {
        out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
        return;
    }
    for (int i = 0; i < 2; i++) __syncthreads();
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 2, 1);
}

// a race: each thread reads its neighbours' shared slots (the next thread's,
// the other warp's) and the next block's global flag, with no barrier
// between the writes and the reads
__global__ void racy(int *out, int *flags) {
    __shared__ int s[64];
    const int t = threadIdx.x, b = blockIdx.x;
    s[t] = 1000 * (b + 1) + t;
    flags[b] = 1;
    out[b * 192 + t] = s[(t + 1) % 64];
    out[b * 192 + 64 + t] = s[(t + 32) % 64];
    out[b * 192 + 128 + t] = flags[(b + 1) % gridDim.x];
}

// cp.async in three groups of one 16-byte copy each (the third of 7 bytes,
// zero-filled), read back after waits that leave 2, 1 and 0 groups pending:
// a copy lands only when its group is waited for, and a wait-less group
// (the fourth, never committed) never lands
__global__ void async_copies(const unsigned char *src, unsigned char *out) {
    __shared__ unsigned char s[4][16];
    const int t = threadIdx.x;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 16; j++) s[i][j] = 0xee;
    for (int g = 0; g < 3; g++) {
        kvd_mma::cp_async<16>(s[g], src + 16 * g, g == 2 ? 7 : 16);
        kvd_mma::cp_async_commit();
    }
    kvd_mma::cp_async<16>(s[3], src + 48, 16);
    for (int w = 2; w >= 0; w--) {
        kvd_mma::cp_async_wait(w);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 16; j++) out[((t * 3 + (2 - w)) * 4 + i) * 16 + j] = s[i][j];
    }
}

// cp.async (16 bytes: which 0 and 1; 4 bytes: 3 and 4) and ldmatrix (2)
// at an offset (0: aligned); a 4-byte copy leaves out the byte after its
// last (0xee, as the kernel set it) above the last it copied (0, src's)
__global__ void misaligned(const unsigned char *src, int which, int off, unsigned *out) {
    __shared__ uint4 s4[4]; // 16-byte aligned
    unsigned char *s = reinterpret_cast<unsigned char *>(s4);
    unsigned r[2] = {0, 0};
    if (which == 3 || which == 4) {
        for (int i = 0; i < 16; i++) s[i] = 0xee;
        kvd_mma::cp_async<4>(s + (which == 3 ? off : 0), src + (which == 4 ? off : 0), 4);
        kvd_mma::cp_async_commit();
        kvd_mma::cp_async_wait(0);
        out[threadIdx.x] = s[3] | (unsigned)s[4] << 8;
        return;
    }
    if (which == 0) {
        kvd_mma::cp_async<16>(s + off, src, 16);
        kvd_mma::cp_async_commit();
        kvd_mma::cp_async_wait(0);
    } else if (which == 1) {
        kvd_mma::cp_async<16>(s, src + off, 16);
        kvd_mma::cp_async_commit();
        kvd_mma::cp_async_wait(0);
    } else {
        const int lane = threadIdx.x % 32;
        kvd_mma::ldsm_x2_trans(r, s + (lane == 3 ? off : 0));
    }
    out[threadIdx.x] = r[0] + s[0];
}

// a kernel with __launch_bounds__(64), as translate.cmake writes it
__global__ void bounded(int *out) {
    kvd_simt::launch_bound(64);
    out[threadIdx.x] = 1;
}

template <class T> T *dev(size_t n) {
    T *p = nullptr;
    cudaMalloc(&p, sizeof(T) * n);
    return p;
}

void barriers_and_shared() {
    std::vector<int> x(1024), out(4);
    for (int i = 0; i < 1024; i++) x[i] = i * 3 - 500;
    int *dx = dev<int>(1024), *dout = dev<int>(4);
    cudaMemcpy(dx, x.data(), 4096, cudaMemcpyHostToDevice);
    block_sum % launch("block_sum", 4, 256)(dx, dout);
    CHECK(cudaGetLastError() == cudaSuccess, "block_sum: launch failed\n");
    cudaMemcpy(out.data(), dout, 16, cudaMemcpyDeviceToHost);
    for (int b = 0; b < 4; b++) {
        int want = 0;
        for (int i = 0; i < 256; i++) want += x[b * 256 + i];
        CHECK(out[b] == want, "block_sum %d: %d, expected %d\n", b, out[b], want);
    }
    cudaFree(dx), cudaFree(dout);
}

void warp_operations() {
    const int n = 64;
    std::vector<int> out(7 * n, -7);
    int *d = dev<int>(7 * n);
    cudaMemcpy(d, out.data(), sizeof(int) * 7 * n, cudaMemcpyHostToDevice);
    warp_ops % launch("warp_ops", 1, n)(d, n);
    CHECK(cudaGetLastError() == cudaSuccess, "warp_ops: launch failed\n");
    cudaMemcpy(out.data(), d, sizeof(int) * 7 * n, cudaMemcpyDeviceToHost);
    for (int t = 0; t < n; t++) {
        const int w = t / 32, lane = t % 32;
        int sum = 0;
        for (int l = 0; l < 32; l++) sum += 100 + w * 32 + l;
        CHECK(out[t] == sum, "xor sum t=%d: %d, expected %d\n", t, out[t], sum);
        // shfl_down: lane l sums lanes l .. l + 31 that exist under each
        // halving step; lane 0 holds the warp's sum
        if (lane == 0) CHECK(out[n + t] == sum, "down sum t=%d: %d\n", t, out[n + t]);
        // lane 31's sources are all out of range: it adds its own value, 5 times
        if (lane == 31) CHECK(out[n + t] == 32 * (100 + t), "down lane 31: %d\n", out[n + t]);
        CHECK(out[2 * n + t] == 100 + w * 32 + 5, "idx broadcast t=%d: %d\n", t, out[2 * n + t]);
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++)
            if (l % 3 == 0) ballot |= 1u << l;
        CHECK((unsigned)out[3 * n + t] == ballot, "ballot t=%d: %08x\n", t, out[3 * n + t]);
        CHECK(out[4 * n + t] == (t ^ 1), "double xor t=%d: %d\n", t, out[4 * n + t]);
        // width 16, each half of the warp its own group: the source lane
        // wraps around inside the half
        int want5 = 100 + w * 32 + lane / 16 * 16 + (lane + 1) % 16;
        CHECK(out[5 * n + t] == want5, "width-16 shfl t=%d: %d, expected %d\n", t, out[5 * n + t],
              want5);
        int want6 = lane < 20 ? 0xfffff : -7;
        CHECK(out[6 * n + t] == want6, "activemask t=%d: %08x\n", t, out[6 * n + t]);
    }
    cudaFree(d);
}

// warp_rows_sum (device_math.cuh, the decode GEMVs' reduction) against a
// butterfly row by row, bit for bit, at R = 1 .. 16 rows: partials of
// exponents 2^-20 to 2^20, so that another order of the same additions
// gives other bits (checked: summed lane by lane in order, most rows do)
template <int R> void rows_sum_case(const std::vector<float> &x, int warps) {
    float *dx = dev<float>(x.size()), *dfold = dev<float>(warps * 32),
          *dplain = dev<float>(warps * 16);
    cudaMemcpy(dx, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice);
    rows_sum_k<R> % launch("rows_sum_k", 1, warps * 32)(dx, dfold, dplain);
    CHECK(cudaGetLastError() == cudaSuccess, "rows_sum_k<%d>: launch failed\n", R);
    std::vector<float> fold(warps * 32), plain(warps * 16);
    cudaMemcpy(fold.data(), dfold, sizeof(float) * fold.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(plain.data(), dplain, sizeof(float) * plain.size(), cudaMemcpyDeviceToHost);
    int differ = 0, in_order = 0;
    for (int w = 0; w < warps; w++)
        for (int lane = 0; lane < 32; lane++) {
            const int row = lane / (32 / R);
            const float want = plain[w * 16 + row], got = fold[w * 32 + lane];
            differ += std::memcmp(&want, &got, 4) != 0;
            if (lane % (32 / R)) continue;
            float seq = 0; // the same partials in lane order
            for (int l = 0; l < 32; l++) seq += x[(size_t)(w * 32 + l) * 16 + row];
            in_order += seq != want;
        }
    CHECK(!differ, "warp_rows_sum<%d>: %d lanes' sums not the row-by-row butterfly's bits\n", R,
          differ);
    CHECK(in_order > warps * R / 2,
          "warp_rows_sum<%d>: the partials sum to the same bits in any order (%d of %d rows "
          "differ): the case cannot tell the trees apart\n",
          R, in_order, warps * R);
    cudaFree(dx), cudaFree(dfold), cudaFree(dplain);
}
void warp_rows() {
    const int warps = 8;
    std::vector<float> x((size_t)warps * 32 * 16);
    spread_rng rng{0x9e3779b97f4a7c15u};
    for (float &v : x) v = rng.spread(20);
    rows_sum_case<1>(x, warps);
    rows_sum_case<2>(x, warps);
    rows_sum_case<4>(x, warps);
    rows_sum_case<8>(x, warps);
    rows_sum_case<16>(x, warps);
}

void divergence_and_state() {
    int *d = dev<int>(128);
    divergent % launch("divergent", 1, 128)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "divergent: launch failed\n");
    std::vector<int> out(128);
    cudaMemcpy(out.data(), d, sizeof(int) * 128, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 128; t++) {
        int w = t / 32, acc = 0;
        for (int i = 0; i <= w * 3; i++) acc += (i + 1); // lane pairs hold the same value
        CHECK(out[t] == acc * 1000 + 1, "divergent t=%d: %d\n", t, out[t]);
    }
    cudaFree(d);
    double *dd = dev<double>(256);
    keeps_locals % launch("keeps_locals", 1, 256)(dd);
    std::vector<double> o(256);
    cudaMemcpy(o.data(), dd, sizeof(double) * 256, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 256; t++) {
        double s = 0;
        for (int i = 0; i < 64; i++) {
            double a = t * 64.0 + i;
            for (int r = 0; r < 10; r++) a = a * 1.5 - 1.0;
            s += a;
        }
        CHECK(o[t] == s, "keeps_locals t=%d: %.17g, expected %.17g\n", t, o[t], s);
    }
    cudaFree(dd);
    // threads are numbered x fastest, warps are runs of 32 in that order: in
    // blocks of 8 x 4 x 2, the rows y = 1 are lanes 8 .. 15 of both warps
    int *g = dev<int>(6 * 64);
    geometry % launch("geometry", dim3(3, 2), dim3(8, 4, 2))(g);
    std::vector<int> go(6 * 64);
    cudaMemcpy(go.data(), g, sizeof(int) * go.size(), cudaMemcpyDeviceToHost);
    for (int b = 0; b < 6; b++)
        for (int t = 0; t < 64; t++)
            CHECK((unsigned)go[b * 64 + t] == (0x0000ff00u | (unsigned)b << 24),
                  "geometry b=%d t=%d: %08x\n", b, t, go[b * 64 + t]);
    cudaFree(g);
}

void shared_dynamic() {
    float *d = dev<float>(64);
    dyn_shared % launch("dyn_shared", 1, 64, sizeof(float) * 64)(d);
    std::vector<float> o(64);
    cudaMemcpy(o.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) CHECK(o[t] == 2.0f * (63 - t), "dyn_shared t=%d: %g\n", t, o[t]);
    cudaFree(d);
}

// A table of ptxas's registers and static shared memory, for this file's
// kernels: lines of "ARCH REGISTERS SHARED STACK NAME", the names in
// nvcc's spelling of the anonymous namespace
int ptxas_table(const char *dir, const char *lines) {
    const std::string path = std::string(dir) + "/test.usage";
    FILE *f = std::fopen(path.c_str(), "w");
    if (!f) return -1;
    std::fputs(lines, f);
    std::fclose(f);
    const int rc = kvd_simt::usage_load(dir);
    std::remove(path.c_str());
    return rc;
}
std::string nvcc_name(const void *kernel) {
    const char *sym = kvd_simt::symbol_of(kernel);
    std::string s = sym ? sym : "";
    const size_t at = s.find("12_GLOBAL__N_1");
    if (at != std::string::npos) s.replace(at, 14, "41_GLOBAL__N__7e6123b4_9_layers_cu_1830dcac");
    return s;
}

// Launches a GPU refuses for the registers or shared memory ptxas gave a
// kernel are refused; those that fit run.
void ptxas_resources() {
    CHECK(!kvd_simt::usage_loaded(), "a ptxas table is loaded before the test made one\n");
    const std::string t_name = nvcc_name(reinterpret_cast<const void *>(touch)),
                      s_name = nvcc_name(reinterpret_cast<const void *>(dyn_shared));
    CHECK(t_name.find("5touchEPf") != std::string::npos &&
              s_name.find("10dyn_sharedEPf") != std::string::npos,
          "the kernels' ELF symbols: '%s', '%s'\n", t_name.c_str(), s_name.c_str());
    char dir[] = "/tmp/kvd-simt-ptxas-XXXXXX";
    if (!mkdtemp(dir)) return;
    const char *arch = kvd_simt::device().arch;
    float *d = dev<float>(1024);
    char lines[1024];
    // touch's launch with a block of that many threads: the error it left
    auto touch_at = [&](unsigned threads) {
        touch % launch("touch", 1, threads)(d);
        return cudaGetLastError();
    };
    // 128 registers a thread: 16 warps of 4096 fill a block's 65536
    std::snprintf(lines, sizeof lines, "%s 128 0 0 %s\n", arch, t_name.c_str());
    CHECK(ptxas_table(dir, lines) == 0 && kvd_simt::usage_loaded(), "the table did not load\n");
    CHECK(touch_at(512) == cudaSuccess, "128 registers x 512 threads: refused\n");
    CHECK(touch_at(513) == cudaErrorLaunchOutOfResources,
          "128 registers x 513 threads: not refused\n");
    // 130 registers take 136 (a warp's registers come in 256s): 15 warps fit
    std::snprintf(lines, sizeof lines, "%s 130 0 0 %s\n", arch, t_name.c_str());
    CHECK(ptxas_table(dir, lines) == 0, "the second table did not load\n");
    CHECK(touch_at(480) == cudaSuccess, "130 registers x 480 threads: refused\n");
    CHECK(touch_at(481) == cudaErrorLaunchOutOfResources,
          "130 registers x 481 threads: not refused\n");
    // 40 KB of static shared memory leave 8 KB of dynamic without an opt-in,
    // and the opt-in at most the device's limit less the 40 KB
    std::snprintf(lines, sizeof lines, "%s 20 40960 0 %s\n", arch, s_name.c_str());
    CHECK(ptxas_table(dir, lines) == 0, "the third table did not load\n");
    dyn_shared % launch("dyn_shared", 1, 64, 8192)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "40 KB static + 8 KB dynamic: refused\n");
    dyn_shared % launch("dyn_shared", 1, 64, 8196)(d);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "40 KB static + 8196 bytes: not refused\n");
    const int room = (int)kvd_simt::device().smem_optin - 40960;
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, room + 4) ==
              cudaErrorInvalidValue,
          "an opt-in past the limit less the static shared memory: accepted\n");
    cudaGetLastError();
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, room) ==
              cudaSuccess,
          "an opt-in of the limit less the static shared memory: refused\n");
    dyn_shared % launch("dyn_shared", 1, 64, room)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "the opt-in's dynamic shared memory: refused\n");
    // a kernel the table lacks is refused too (a stale table, or names that
    // do not match, would otherwise check nothing)
    CHECK(touch_at(64) == cudaErrorInvalidConfiguration,
          "a kernel missing from the table: not refused\n");
    std::snprintf(lines, sizeof lines, "%s 20 x 0 %s\n", arch, s_name.c_str());
    CHECK(ptxas_table(dir, lines) == -1 && !kvd_simt::usage_loaded(),
          "a malformed table: accepted\n");
    CHECK(kvd_simt::usage_load(nullptr) == 0 && !kvd_simt::usage_loaded(), "no table: refused\n");
    CHECK(touch_at(1024) == cudaSuccess, "without a table, 1024 threads: refused\n");
    cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 0);
    cudaDeviceReset();
    cudaFree(d);
    rmdir(dir);
}

void shared_per_block() {
    float *d = dev<float>(2 * 128);
    block_shared % launch("block_shared", 2, 64, sizeof(float) * 64)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "block_shared: launch failed\n");
    std::vector<float> o(2 * 128);
    cudaMemcpy(o.data(), d, sizeof(float) * o.size(), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) {
        CHECK(o[t] == 1.0f && o[64 + t] == 2.0f, "block 0 t=%d: %g %g, expected 1 2\n", t, o[t],
              o[64 + t]);
        CHECK(std::isnan(o[128 + t]) && std::isnan(o[192 + t]),
              "block 1 t=%d reads %g %g: block 0's shared memory\n", t, o[128 + t], o[192 + t]);
    }
    cudaFree(d);
}

// cudaMemcpyAsync from the host: in ascending order the copy lands at
// once, in reverse order at the stream's next operation, reading its
// source then; after a synchronisation the host may reuse the source
void async_upload() {
    float *h = nullptr, *d = dev<float>(64), *o = dev<float>(64);
    CHECK(cudaHostAlloc(reinterpret_cast<void **>(&h), sizeof(float) * 64, 0) == cudaSuccess,
          "no page-locked memory\n");
    const bool late = kvd_simt::reverse_order();
    std::vector<float> r(64);
    for (int i = 0; i < 64; i++) h[i] = 1.0f;
    CHECK(cudaMemcpyAsync(d, h, sizeof(float) * 64, cudaMemcpyHostToDevice, nullptr) == cudaSuccess,
          "cudaMemcpyAsync refused\n");
    for (int i = 0; i < 64; i++) h[i] = 2.0f; // too soon: the copy may not have run
    copy_of % launch("copy_of", 1, 64)(o, d);
    cudaMemcpy(r.data(), o, sizeof(float) * 64, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        CHECK(r[i] == (late ? 2.0f : 1.0f), "async copy, %s: the kernel read %g\n",
              late ? "late" : "at once", r[i]);
    for (int i = 0; i < 64; i++) h[i] = 3.0f;
    cudaMemcpyAsync(d, h, sizeof(float) * 64, cudaMemcpyHostToDevice, nullptr);
    CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess, "synchronize failed\n");
    for (int i = 0; i < 64; i++) h[i] = 4.0f; // after the synchronisation: fine
    cudaMemcpy(r.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 64; i++)
        CHECK(r[i] == 3.0f, "async copy, synchronised: the device holds %g\n", r[i]);
    CHECK(cudaMemcpyAsync(d + 1, h, sizeof(float) * 64, cudaMemcpyHostToDevice, nullptr) ==
              cudaErrorInvalidValue,
          "an async copy past the allocation: not refused\n");
    cudaGetLastError();
    cudaFreeHost(h);
    cudaFree(d), cudaFree(o);
}

void simulator_checks() {
    float *d = dev<float>(64);
    std::vector<float> h(64);
    cudaMemcpy(h.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost);
    CHECK(std::isnan(h[0]) && std::isnan(h[63]), "fresh device memory reads %g, not NaN\n", h[0]);
    CHECK(cudaGetLastError() == cudaSuccess, "an earlier error is pending\n");

    touch % launch("touch", 1, 2048)(d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads: not refused\n");
    cudaMemcpy(h.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost);
    CHECK(std::isnan(h[0]), "a refused launch ran\n");
    dyn_shared % launch("dyn_shared", 1, 64, 49 * 1024)(d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "49 KB shared: not refused\n");
    CHECK(cudaGetLastError() == cudaSuccess, "a refused launch left the context broken\n");
    // the simulated device (KVD_SIMT_DEVICE) as the kernels read it
    const kvd_simt::simt_device &sd = kvd_simt::device();
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess, "no device properties\n");
    CHECK(prop.major == sd.major && prop.multiProcessorCount == sd.sms &&
              prop.sharedMemPerBlockOptin == sd.smem_optin &&
              prop.sharedMemPerMultiprocessor == sd.smem_sm,
          "%s: the properties are not the device's\n", sd.arch);
    CHECK(sd.smem_optin == (std::strcmp(sd.arch, "sm_120") ? 227u : 99u) * 1024,
          "%s: a %zu-byte opt-in limit\n", sd.arch, sd.smem_optin);
    // the opt-in, per kernel: up to it the launch runs, past it (or past
    // the device's 227 KB, or sm_120's 99 KB) it is refused
    const int optin = (int)sd.smem_optin - 1024;
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) ==
              cudaSuccess,
          "a %d-byte opt-in refused\n", optin);
    dyn_shared % launch("dyn_shared", 1, 64, optin)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "shared memory up to the opt-in: refused\n");
    dyn_shared % launch("dyn_shared", 1, 64, optin + 16)(d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "past the opt-in: not refused\n");
    touch % launch("touch", 1, 64, 49 * 1024)(d);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration,
          "another kernel took dyn_shared's opt-in\n");
    CHECK(cudaFuncSetAttribute(dyn_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)sd.smem_optin + 1) == cudaErrorInvalidValue,
          "an opt-in past the device's limit accepted\n");
    CHECK(cudaGetLastError() == cudaErrorInvalidValue, "the refused opt-in left no error\n");

    CHECK(cudaMemcpy(d, h.data(), sizeof(float) * 65, cudaMemcpyHostToDevice) ==
              cudaErrorInvalidValue,
          "a copy past the allocation: not refused\n");
    CHECK(cudaMemset(d + 1, 0, sizeof(float) * 64) == cudaErrorInvalidValue,
          "a memset past the allocation: not refused\n");
    cudaGetLastError();

    touch % launch("touch", 1, 64)(h.data());
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "host pointer argument: not refused\n");
    CHECK(cudaDeviceSynchronize() == cudaErrorIllegalAddress, "the fault is not sticky\n");
    cudaDeviceReset();

    int *o = dev<int>(64);
    exits_early % launch("exits_early", 1, 64)(o);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "a mask naming exited lanes: not caught\n");
    cudaDeviceReset();
    barrier_split % launch("barrier_split", 1, 64)(o);
    CHECK(cudaGetLastError() == cudaSuccess, "warps apart at barriers and shuffles: failed\n");
    cudaFree(d), cudaFree(o);

    // a second device's memory is not the first's
    cudaSetDevice(1);
    float *d1 = dev<float>(64);
    cudaSetDevice(0);
    touch % launch("touch", 1, 64)(d1);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress, "another device's memory: not refused\n");
    cudaDeviceReset();
    cudaFree(d1);
}

void conversions() {
    for (int v = 0; v < 256; v++) {
        float a = __half2float(__half(__nv_cvt_fp8_to_halfraw((unsigned char)v, __NV_E4M3)));
        float b = kvd_e4m3_to_f32((uint8_t)v);
        CHECK((std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)),
              "e4m3 0x%02x: %g, expected %g\n", v, a, b);
        a = __half2float(__half(__nv_cvt_fp8_to_halfraw((unsigned char)v, __NV_E5M2)));
        b = kvd_e5m2_to_f32((uint8_t)v);
        CHECK((std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)),
              "e5m2 0x%02x: %g, expected %g\n", v, a, b);
    }
    // FP16 rounding: every finite half back to itself, and the edges
    for (unsigned u = 0; u < 65536; u++) {
        __half_raw r;
        r.x = (unsigned short)u;
        float f = __half2float(__half(r));
        _Float16 ref; // the compiler's own widening, an independent reference
        std::memcpy(&ref, &u, 2);
        CHECK(
            std::isnan(f) == std::isnan((float)ref) &&
                (std::isnan(f) || (f == (float)ref && std::signbit(f) == std::signbit((float)ref))),
            "half 0x%04x: %g, expected %g\n", u, f, (float)ref);
        if (std::isnan(f)) continue;
        CHECK(__float2half_rn(f).__x == u, "half 0x%04x: round trip 0x%04x\n", u,
              __float2half_rn(f).__x);
    }
    const struct {
        float x;
        unsigned short h;
    } halves[] = {{1.0f, 0x3c00},      {65504.0f, 0x7bff},    {65519.0f, 0x7bff},
                  {65520.0f, 0x7c00},  {0x1p-24f, 0x0001},    {0x1p-25f, 0x0000},
                  {0x3p-25f, 0x0002},  {1.0f / 3.0f, 0x3555}, {-0x1.002p0f, 0xbc00},
                  {0x1.006p0f, 0x3c02}};
    for (const auto &c : halves)
        CHECK(__float2half_rn(c.x).__x == c.h, "float2half(%a): 0x%04x, expected 0x%04x\n",
              (double)c.x, __float2half_rn(c.x).__x, c.h);
    // __byte_perm: byte n of the result is byte (s >> 4n) & 7 of y:x
    const unsigned px = 0x33221100u, py = 0x77665544u;
    CHECK(__byte_perm(px, py, 0x3210u) == px && __byte_perm(px, py, 0x7654u) == py,
          "byte_perm identity\n");
    CHECK(__byte_perm(px, py, 0x1404u) == 0x11440044u, "byte_perm 0x1404: %08x\n",
          __byte_perm(px, py, 0x1404u));
    CHECK(__byte_perm(px, 0u, 0x3414u) == 0x33001100u, "byte_perm 0x3414: %08x\n",
          __byte_perm(px, 0u, 0x3414u));
    for (float x : {0.0f, -1.5f, 3.14159f, 1e-30f, 448.0f, 500.0f}) {
        CHECK(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) == kvd_f32_to_e4m3(x, 1),
              "e4m3 encode %g\n", x);
        CHECK(__float2bfloat16_rn(x).__x == kvd_f32_to_bf16(x), "bf16 encode %g\n", x);
    }
}

// y^T = W x^T in cuBLASLt's column-major terms, as gemm.cu asks for it
void lt_matmul() {
    const int M = 5, N = 7, K = 9;
    std::vector<uint16_t> x(M * K), w(N * K);
    for (int i = 0; i < M * K; i++) x[i] = kvd_f32_to_bf16(0.25f * (i % 7) - 0.5f);
    for (int i = 0; i < N * K; i++) w[i] = kvd_f32_to_bf16(0.125f * (i % 5) - 0.25f);
    uint16_t *dx = dev<uint16_t>(M * K), *dw = dev<uint16_t>(N * K);
    float *dy = dev<float>(M * N);
    cudaMemcpy(dx, x.data(), 2 * M * K, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), 2 * N * K, cudaMemcpyHostToDevice);
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtCreate(&h);
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = CUBLAS_OP_T;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, N, M, N);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, nullptr, 1, &heur, &found);
    CHECK(found == 1, "heuristic found %d\n", found);
    const float one = 1, zero = 0;
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx, b, &zero, dy, c, dy, c, &heur.algo, nullptr, 0,
                         nullptr) == CUBLAS_STATUS_SUCCESS,
          "matmul failed\n");
    std::vector<float> y(M * N);
    cudaMemcpy(y.data(), dy, 4 * M * N, cudaMemcpyDeviceToHost);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)kvd_bf16_to_f32(x[m * K + k]) * kvd_bf16_to_f32(w[n * K + k]);
            CHECK(std::fabs(y[m * N + n] - s) < 1e-5, "y[%d][%d] = %g, expected %g\n", m, n,
                  y[m * N + n], s);
        }
    // a wrong shape is refused
    cublasLtMatrixLayout_t bad;
    cublasLtMatrixLayoutCreate(&bad, CUDA_R_16BF, K + 1, M, K + 1);
    CHECK(cublasLtMatmul(h, op, &one, dw, a, dx, bad, &zero, dy, c, dy, c, &heur.algo, nullptr, 0,
                         nullptr) != CUBLAS_STATUS_SUCCESS,
          "mismatched shapes: not refused\n");
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(bad);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(h);
    cudaFree(dx), cudaFree(dw), cudaFree(dy);
}

} // namespace

// warp_gather (the MMA bodies' way to read other lanes' registers), and
// the MMA and ldmatrix bodies against the fragment layouts of the ISA:
// small integers, exact in BF16 and FP16 and in FP32 sums
void gathers_and_fragments() {
    unsigned *d = dev<unsigned>(4 * 64);
    gathers % launch("gathers", 1, 64)(d);
    CHECK(cudaGetLastError() == cudaSuccess, "gathers: launch failed\n");
    std::vector<unsigned> h(4 * 64);
    cudaMemcpy(h.data(), d, sizeof(unsigned) * 4 * 64, cudaMemcpyDeviceToHost);
    for (unsigned i = 0; i < 64; i++) {
        const unsigned l = i % 32, w = i / 32, src = (l + 5) % 32;
        CHECK(h[4 * i] == 100 * src + 1000 * w && h[4 * i + 1] == 100 * src + 1000 * w + 2,
              "gather thread %u: %u %u\n", i, h[4 * i], h[4 * i + 1]);
        CHECK(h[4 * i + 2] == 7 * src && h[4 * i + 3] == 7 * (31 - l),
              "second gather thread %u: %u %u\n", i, h[4 * i + 2], h[4 * i + 3]);
    }
    half_gather % launch("half_gather", 1, 32)(d);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "a gather of half a warp: not caught\n");
    cudaDeviceReset();
    half_mma % launch("half_mma", 1, 32)(reinterpret_cast<float *>(d));
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "an mma.sync of half a warp: not caught\n");
    cudaDeviceReset();
    cudaFree(d);

    for (int f16 = 0; f16 < 2; f16++) {
        unsigned short a[256], b[128];
        float va[256], vb[128];
        for (int i = 0; i < 256; i++) {
            va[i] = (float)((i * 7) % 13 - 6);
            a[i] = f16 ? (unsigned short)kvd_mma::f16_bits(va[i])
                       : (unsigned short)kvd_mma::bf16_bits(va[i]);
        }
        for (int i = 0; i < 128; i++) {
            vb[i] = (float)((i * 5) % 11 - 5);
            b[i] = f16 ? (unsigned short)kvd_mma::f16_bits(vb[i])
                       : (unsigned short)kvd_mma::bf16_bits(vb[i]);
        }
        unsigned short *dA = dev<unsigned short>(256), *dB = dev<unsigned short>(128);
        float *dC = dev<float>(128);
        unsigned *dT = dev<unsigned>(64);
        cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, b, sizeof b, cudaMemcpyHostToDevice);
        if (f16)
            mma_tile<true> % launch("mma_tile", 1, 32)(dA, dB, dC, dT);
        else
            mma_tile<false> % launch("mma_tile", 1, 32)(dA, dB, dC, dT);
        CHECK(cudaGetLastError() == cudaSuccess, "mma_tile: launch failed\n");
        float c[128];
        unsigned tr[64];
        cudaMemcpy(c, dC, sizeof c, cudaMemcpyDeviceToHost);
        cudaMemcpy(tr, dT, sizeof tr, cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                float want = 0.5f;
                for (int k = 0; k < 16; k++) want += va[m * 16 + k] * vb[k * 8 + n];
                bad += c[m * 8 + n] != want;
            }
        CHECK(!bad, "mma %s: %d of 128 outputs differ from the product\n", f16 ? "f16" : "bf16",
              bad);
        // ldmatrix .trans: lane (g, t) holds elements (2t, g), (2t+1, g) of
        // matrix m (rows 8m .. 8m + 7 of the block) in register m
        bad = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int m = 0; m < 2; m++) {
                const int g = lane / 4, t = lane % 4, r0 = 8 * m + 2 * t;
                const unsigned want = (unsigned)a[r0 * 8 + g] | (unsigned)a[(r0 + 1) * 8 + g] << 16;
                bad += tr[2 * lane + m] != want;
            }
        CHECK(!bad, "ldmatrix.trans: %d of 64 registers differ\n", bad);
        cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dT);

        // the simulator's instruction gives mma_portable's bits, on values
        // of 2^-12 to 2^12 (16-bit codes of finite values, each side's own
        // rounding) where another order of the sums gives other bits
        std::vector<unsigned> regs(6 * 32);
        std::vector<float> c0(4 * 32), both(8 * 32);
        spread_rng rng{0x2545f4914f6cdd1du + (uint64_t)f16};
        auto code = [&]() -> unsigned {
            const float v = rng.spread(12);
            return f16 ? kvd_mma::f16_bits(v) : kvd_mma::bf16_bits(v);
        };
        for (unsigned &w : regs) w = code() | code() << 16;
        for (float &v : c0) v = rng.spread(4);
        unsigned *dR = dev<unsigned>(regs.size());
        float *dc0 = dev<float>(c0.size()), *dout = dev<float>(both.size());
        cudaMemcpy(dR, regs.data(), sizeof(unsigned) * regs.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(dc0, c0.data(), sizeof(float) * c0.size(), cudaMemcpyHostToDevice);
        if (f16)
            mma_both<true> % launch("mma_both", 1, 32)(dR, dc0, dout);
        else
            mma_both<false> % launch("mma_both", 1, 32)(dR, dc0, dout);
        CHECK(cudaGetLastError() == cudaSuccess, "mma_both: launch failed\n");
        cudaMemcpy(both.data(), dout, sizeof(float) * both.size(), cudaMemcpyDeviceToHost);
        bad = 0;
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++)
                bad += std::memcmp(&both[8 * lane + i], &both[8 * lane + 4 + i], 4) != 0;
        CHECK(!bad,
              "mma %s: %d of 128 outputs of the simulator's instruction not mma_portable's bits\n",
              f16 ? "f16" : "bf16", bad);
        // mma_portable's sums differ from the same products summed over k in
        // ascending order in most outputs (so the case tells the orders apart)
        int reorder = 0;
        auto value = [&](unsigned w, int hi) {
            const unsigned bits = hi ? w >> 16 : w & 0xffffu;
            return f16 ? kvd_mma::f16_val(bits) : kvd_mma::bf16_val(bits);
        };
        for (int lane = 0; lane < 32; lane++)
            for (int i = 0; i < 4; i++) {
                const int g = lane / 4, t = lane % 4, m = g + 8 * (i / 2), n = 2 * t + i % 2;
                float sum = c0[4 * lane + i];
                for (int k = 0; k < 16; k++) {
                    // A[m][k] from lane 4 m' + k' / 2 % 4, B[k][n] from lane 4 n + k / 2 % 4
                    const int la = 4 * (m % 8) + (k % 8) / 2, ra = m / 8 + 2 * (k / 8);
                    const int lb = 4 * n + (k % 8) / 2, rb = 4 + k / 8;
                    sum += value(regs[6 * la + ra], k % 2) * value(regs[6 * lb + rb], k % 2);
                }
                reorder += std::memcmp(&sum, &both[8 * lane + 4 + i], 4) != 0;
            }
        CHECK(reorder > 32,
              "mma %s: only %d of 128 outputs change with the order of k: the case "
              "cannot tell the orders apart\n",
              f16 ? "f16" : "bf16", reorder);
        cudaFree(dR), cudaFree(dc0), cudaFree(dout);
    }
}

// kernels/cuda/gemm.cu's plans (descriptors and algorithm per shape): 700
// shapes, past the table's slots, so plans are remade over others; every
// product against the host's (small integers: exact), then the first 40
// shapes again
void gemm_plans() {
    int bad = 0, failed = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int sh = 0; sh < (pass ? 40 : 700); sh++) {
            // distinct shapes, each M, N and K shared by many
            const int M = 1 + sh % 61, N = 1 + sh / 61 % 5, K = 2 + sh / 305;
            std::vector<uint16_t> x((size_t)M * K), w((size_t)N * K);
            std::vector<float> xv(x.size()), wv(w.size()), y((size_t)M * N);
            for (size_t i = 0; i < x.size(); i++) {
                xv[i] = (float)((int)((i * 7 + sh) % 9) - 4);
                x[i] = (uint16_t)kvd_mma::bf16_bits(xv[i]);
            }
            for (size_t i = 0; i < w.size(); i++) {
                wv[i] = (float)((int)((i * 5 + pass) % 7) - 3);
                w[i] = (uint16_t)kvd_mma::bf16_bits(wv[i]);
            }
            if (kvd_cuda_linear_bf16(x.data(), w.data(), y.data(), M, N, K)) {
                failed++;
                continue;
            }
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    float want = 0.0f;
                    for (int k = 0; k < K; k++)
                        want += xv[(size_t)m * K + k] * wv[(size_t)n * K + k];
                    bad += y[(size_t)m * N + n] != want;
                }
        }
    CHECK(!failed && !bad, "gemm plans: %d products failed, %d outputs wrong\n", failed, bad);
}

// The run order between synchronisations, ascending or (KVD_SIMT_ORDER=
// reverse) descending: a racy read sees the other thread's (block's) write
// in one order and not in the other. Threads run in the order of their
// index, warp by warp, and so do blocks.
void run_order() {
    const bool rev = kvd_simt::reverse_order();
    const char *order = rev ? "reverse" : "ascending";
    int *o = dev<int>(2 * 192), *f = dev<int>(2);
    cudaMemset(f, 0, sizeof(int) * 2);
    racy % launch("racy", 2, 64)(o, f);
    CHECK(cudaGetLastError() == cudaSuccess, "racy: launch failed\n");
    std::vector<int> h(2 * 192);
    cudaMemcpy(h.data(), o, sizeof(int) * 2 * 192, cudaMemcpyDeviceToHost);
    auto before = [rev](int a, int b) { return rev ? a > b : a < b; }; // a ran before b
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 64; t++) {
            const int *r = h.data() + b * 192, nl = (t + 1) % 64, nw = (t + 32) % 64;
            CHECK((r[t] == 1000 * (b + 1) + nl) == before(nl, t),
                  "%s order, block %d thread %d: read %d of thread %d\n", order, b, t, r[t], nl);
            CHECK((r[64 + t] == 1000 * (b + 1) + nw) == before(nw, t),
                  "%s order, block %d thread %d: read %d of thread %d\n", order, b, t, r[64 + t],
                  nw);
            CHECK(r[128 + t] == (int)before((b + 1) % 2, b),
                  "%s order, block %d: the other block %s\n", order, b,
                  r[128 + t] ? "ran" : "did not run");
        }
    cudaFree(o), cudaFree(f);
}

// cp.async lands at the wait that completes its group, not before
void async_copy() {
    std::vector<unsigned char> src(64), out(3 * 64);
    for (int i = 0; i < 64; i++) src[i] = (unsigned char)(i + 1);
    unsigned char *ds = dev<unsigned char>(64), *dout = dev<unsigned char>(3 * 64);
    cudaMemcpy(ds, src.data(), 64, cudaMemcpyHostToDevice);
    async_copies % launch("async_copies", 1, 1)(ds, dout);
    CHECK(cudaGetLastError() == cudaSuccess, "async_copies: launch failed\n");
    cudaMemcpy(out.data(), dout, 3 * 64, cudaMemcpyDeviceToHost);
    for (int k = 0; k < 3; k++)     // after waiting with 2 - k groups pending
        for (int i = 0; i < 4; i++) // buffer i: group i's copy
            for (int j = 0; j < 16; j++) {
                const int got = out[(k * 4 + i) * 16 + j];
                const int want = i > k ? 0xee : i == 2 && j >= 7 ? 0 : 16 * i + j + 1;
                CHECK(got == want, "cp.async after wait_group %d, buffer %d byte %d: %d, not %d\n",
                      2 - k, i, j, got, want);
            }
    cudaFree(ds), cudaFree(dout);
}

// cp.async's addresses and ldmatrix's rows off 16-byte boundaries fail the
// launch, as they fault on a GPU; aligned, they run. So does a block larger
// than the kernel's __launch_bounds__.
void alignment() {
    unsigned char *src = dev<unsigned char>(64);
    unsigned *out = dev<unsigned>(32);
    cudaMemset(src, 0, 64);
    const char *what[5] = {"cp.async destination", "cp.async source", "ldmatrix row",
                           "4-byte cp.async destination", "4-byte cp.async source"};
    for (int which = 0; which < 5; which++) {
        for (int off : {0, 2, 4, 8}) {
            const int align = which >= 3 ? 4 : 16;
            misaligned % launch("misaligned", 1, 32)(src, which, off, out);
            const cudaError_t e = cudaGetLastError();
            CHECK(off % align ? e == cudaErrorLaunchFailure : e == cudaSuccess,
                  "%s at offset %d: launch %s\n", what[which], off,
                  e == cudaSuccess ? "ran" : "failed");
            if (which >= 3 && off == 0 && e == cudaSuccess) {
                unsigned h = 0;
                cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost);
                CHECK(h == 0xee00u, "%s: bytes 3 and 4 read %04x, expected ee00\n", what[which], h);
            }
            cudaDeviceReset();
        }
    }
    cudaFree(src), cudaFree(out);
    // a block over the kernel's launch bound fails; at the bound it runs
    int *o = dev<int>(128);
    bounded % launch("bounded", 2, 64)(o);
    CHECK(cudaGetLastError() == cudaSuccess, "64 threads within a bound of 64: refused\n");
    bounded % launch("bounded", 1, 128)(o);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure, "128 threads over a bound of 64: ran\n");
    cudaDeviceReset();
    cudaFree(o);
}

int main() {
    run_order();
    async_copy();
    alignment();
    barriers_and_shared();
    gathers_and_fragments();
    gemm_plans();
    warp_operations();
    warp_rows();
    divergence_and_state();
    shared_dynamic();
    shared_per_block();
    async_upload();
    ptxas_resources();
    simulator_checks();
    conversions();
    lt_matmul();
    std::printf("simt: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
