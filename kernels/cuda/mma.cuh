// kvdrift: warp-level tensor-core and copy primitives for the kernels, each
// with a portable body. On the device (sm_80 and later) they are single PTX
// instructions: mma.sync m16n8k16 (BF16 or FP16 in, FP32 accumulate),
// ldmatrix .trans, cp.async (16 or 4 bytes) with zero fill. Everywhere else (the SIMT
// simulator in tests/simt compiles the .cu files as C++) the same operation
// is spelled out with warp shuffles and plain loads, element for element as
// the PTX ISA defines the fragments, so a kernel's indexing is exercised by
// the tests on any machine; only the instruction itself is taken on trust.
// The simulator runs mma.sync as its own warp operation (kvd_simt::
// mma_m16n8k16: the tile's product once, when the last lane arrives, in
// mma_portable's order, so its bits), as per lane it was most of the time
// the tests spent in the tensor-core kernels.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), lane =
// 4 g + t: A (16 x 16, row-major) a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
// a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; B (16 x 8) b0 = B[2t,
// 2t+1][g], b1 = B[2t+8, 2t+9][g]; C (16 x 8) c0, c1 = C[g][2t, 2t+1], c2, c3
// = C[g+8][2t, 2t+1]. Two 16-bit elements share a register, the lower index
// in the low half.
#ifndef KVD_MMA_CUH
#define KVD_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KVD_PTX_MMA 1
#endif

namespace kvd_mma {

#ifndef KVD_PTX_MMA
// The portable bodies read other lanes' registers through this: a shuffle
// per value, or on the SIMT simulator one gather of every lane's (the same
// values, at one switch point instead of a shuffle's each). All lanes
// construct it together with the same n, and read in step.
struct lane_regs {
#ifdef KVD_SIMT_H
    const unsigned (*tab)[8];
    __device__ lane_regs(const unsigned *mine, int n) : tab(kvd_simt::warp_gather(mine, n)) {}
    __device__ unsigned get(int src, int i) const {
        return tab[src][i];
    }
#else
    const unsigned *mine;
    __device__ lane_regs(const unsigned *m, int) : mine(m) {}
    __device__ unsigned get(int src, int i) const {
        return __shfl_sync(0xffffffffu, mine[i], src);
    }
#endif
};
#endif

// the 16-bit encodings, round to nearest even
__device__ inline unsigned bf16_bits(float x) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    return *reinterpret_cast<const unsigned short *>(&b);
}
__device__ inline unsigned f16_bits(float x) {
    __half h = __float2half_rn(x);
    return *reinterpret_cast<const unsigned short *>(&h);
}
__device__ inline float bf16_val(unsigned bits) {
    return __uint_as_float((bits & 0xffffu) << 16);
}
__device__ inline float f16_val(unsigned bits) {
    __half_raw r;
    r.x = (unsigned short)(bits & 0xffffu);
    return __half2float(__half(r));
}

// x as hi + lo, each a 16-bit float (hi the rounding of x, lo the rounding
// of what is left): 16 significant bits for BF16, 22 for FP16 where x is
// scaled into FP16's range. Returns the two elements' pair registers for
// (x0, x1): hi in *h, lo in *l.
template <bool F16> __device__ inline void split2(float x0, float x1, unsigned *h, unsigned *l) {
    if constexpr (F16) {
        unsigned h0 = f16_bits(x0), h1 = f16_bits(x1);
        *h = h0 | h1 << 16;
        *l = f16_bits(x0 - f16_val(h0)) | f16_bits(x1 - f16_val(h1)) << 16;
    } else {
        unsigned h0 = bf16_bits(x0), h1 = bf16_bits(x1);
        *h = h0 | h1 << 16;
        *l = bf16_bits(x0 - bf16_val(h0)) | bf16_bits(x1 - bf16_val(h1)) << 16;
    }
}

#ifndef KVD_PTX_MMA
// mma's portable body: c += A B, each lane its four elements of C
template <bool F16>
__device__ inline void mma_portable(float c[4], const unsigned a[4], const unsigned b[2]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    auto val = [](unsigned r, int hi) {
        unsigned bits = hi ? r >> 16 : r & 0xffffu;
        return F16 ? f16_val(bits) : bf16_val(bits);
    };
    // thread s of a group holds k = 2s, 2s+1 (a0/a1, b0) and 2s+8, 2s+9 (a2/a3, b1)
    const unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const lane_regs L(mine, 6);
    for (int s = 0; s < 4; s++) {
        // thread s's elements, each decoded once: A's rows g, g + 8 and B's
        // columns 2t, 2t + 1, at k = 2s + 8 kh + e
        float av[2][2][2], bv[2][2][2];
        for (int r = 0; r < 2; r++)
            for (int kh = 0; kh < 2; kh++) {
                const unsigned reg = L.get(4 * g + s, r + 2 * kh);
                for (int e = 0; e < 2; e++) av[r][kh][e] = val(reg, e);
            }
        for (int n = 0; n < 2; n++)
            for (int kh = 0; kh < 2; kh++) {
                const unsigned reg = L.get(4 * (2 * t + n) + s, 4 + kh);
                for (int e = 0; e < 2; e++) bv[n][kh][e] = val(reg, e);
            }
        for (int r = 0; r < 2; r++)     // rows g, g + 8
            for (int n = 0; n < 2; n++) // columns 2t, 2t + 1
                for (int kh = 0; kh < 2; kh++)
                    for (int e = 0; e < 2; e++) c[2 * r + n] += av[r][kh][e] * bv[n][kh][e];
    }
}
#endif

// c += A B for one m16n8k16 tile, FP32 accumulation
template <bool F16>
__device__ inline void mma(float c[4], const unsigned a[4], const unsigned b[2]) {
#ifdef KVD_PTX_MMA
    if constexpr (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(KVD_SIMT_H) // the simulator's instruction: mma_portable's bits, once a warp
    kvd_simt::mma_m16n8k16(c, a, b, F16);
#else
    mma_portable<F16>(c, a, b);
#endif
}

// Two 8 x 8 matrices of 16-bit elements from shared memory, transposed:
// lanes 0-7 give the 16-byte rows of matrix 0, lanes 8-15 those of matrix 1;
// lane (g, t) receives in r[m] elements (2t, g) and (2t+1, g) of matrix m.
// Every lane passes a row pointer (lanes 16-31 are not read).
__device__ inline void ldsm_x2_trans(unsigned r[2], const void *row) {
#ifdef KVD_PTX_MMA
    unsigned addr = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
#else
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#ifdef KVD_SIMT_H
    if (lane < 16) kvd_simt::need_aligned(row, 16, "ldmatrix's row");
#endif
    const unsigned long long me = (unsigned long long)(uintptr_t)row;
    const unsigned mine[2] = {(unsigned)me, (unsigned)(me >> 32)};
    const lane_regs L(mine, 2);
    auto row_of = [&](int src) {
        return reinterpret_cast<const unsigned short *>(
            (uintptr_t)((unsigned long long)L.get(src, 1) << 32 | L.get(src, 0)));
    };
    for (int m = 0; m < 2; m++) {
        const unsigned short *p0 = row_of(8 * m + 2 * t), *p1 = row_of(8 * m + 2 * t + 1);
        r[m] = (unsigned)p0[g] | (unsigned)p1[g] << 16;
    }
#endif
}

// W (16, 8 or 4) bytes global -> shared, asynchronously, both addresses
// W-aligned; src_bytes 0 writes zeros. 4-byte copies serve the row-scaled
// formats' scales, 8-byte ones NVFP4's rows at head_dim 128 (72 bytes).
template <int W> __device__ inline void cp_async(void *dst, const void *src, int src_bytes) {
    static_assert(W == 16 || W == 8 || W == 4, "cp.async copies 16 bytes (.cg), 8 or 4 (.ca)");
#ifdef KVD_PTX_MMA
    unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    if constexpr (W == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src),
                     "r"(src_bytes));
    else if constexpr (W == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(addr), "l"(src),
                     "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(src),
                     "r"(src_bytes));
#elif defined(KVD_SIMT_H) // landing at the wait that completes it
    kvd_simt::async_copy(dst, src, W, src_bytes);
#else
    unsigned char *d = static_cast<unsigned char *>(dst);
    const unsigned char *s = static_cast<const unsigned char *>(src);
    for (int i = 0; i < W; i++) d[i] = i < src_bytes ? s[i] : 0;
#endif
}
__device__ inline void cp_async_commit() {
#ifdef KVD_PTX_MMA
    asm volatile("cp.async.commit_group;\n" ::);
#elif defined(KVD_SIMT_H)
    kvd_simt::async_commit();
#endif
}
// wait until at most n (0 to 3) of this thread's committed groups are pending
__device__ inline void cp_async_wait(int n) {
#ifdef KVD_PTX_MMA
    switch (n) {
    case 0:
        asm volatile("cp.async.wait_group 0;\n" ::);
        break;
    case 1:
        asm volatile("cp.async.wait_group 1;\n" ::);
        break;
    case 2:
        asm volatile("cp.async.wait_group 2;\n" ::);
        break;
    default:
        asm volatile("cp.async.wait_group 3;\n" ::);
        break;
    }
#elif defined(KVD_SIMT_H)
    kvd_simt::async_wait(n);
#else
    (void)n;
#endif
}

// Two FP8 codes of the word w (the bytes the __byte_perm selector sel puts
// at bytes 1 and 3) as an FP16 pair, exactly. E5M2 is FP16's top byte;
// E4M3 moves its 7 magnitude bits under FP16's exponent, which reads the
// value times 2^-8 (subnormals included) and leaves the caller to fold 2^8
// into its scale; E4M3's NaN codes (0x7f, 0xff) stay NaN.
template <bool E5M2> __device__ inline unsigned fp8_pair(unsigned w, unsigned sel) {
    unsigned a = __byte_perm(w, 0u, sel);
    if constexpr (E5M2) {
        return a;
    } else {
        unsigned nan = __byte_perm(((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u, 0u, sel);
        return (a & 0x80008000u) | ((a >> 1) & 0x3f803f80u) | (nan >> 1) | (nan >> 2);
    }
}

// Two INT8 codes of the word w (the bytes the __byte_perm selector sel puts
// at bytes 1 and 3, as fp8_pair's) as an FP16 pair, exactly: each byte,
// its sign bit flipped, under the exponent bits 0x64 reads 1024 + 128 + q;
// one packed FP16 subtraction of 1152 leaves q (every integer to 2048 is
// exact in FP16).
__device__ inline unsigned int8_pair(unsigned w, unsigned sel) {
    const unsigned sel8 = ((sel >> 4) & 0xfu) | 0x40u | ((sel >> 12) & 0xfu) << 8 | 0x4000u;
    const unsigned a = __byte_perm(w ^ 0x80808080u, 0x64646464u, sel8);
#ifdef KVD_PTX_MMA
    unsigned r;
    asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(0x64806480u));
    return r;
#else
    return f16_bits(f16_val(a) - 1152.0f) | f16_bits(f16_val(a >> 16) - 1152.0f) << 16;
#endif
}

// Two E2M1 codes (NVFP4's elements) as an FP16 pair, exactly: the codes at
// bits 12-15 and 28-31 of x, whatever its other bits. Their three
// magnitude bits index a table of FP16's top bytes for 0, 0.5, 1, 1.5, 2,
// 3, 4 and 6 (one byte permute; each value's low byte is 0, as is the
// table's first entry, which fills the pair's low bytes), and their sign
// bits are already FP16's. A word of eight codes gives its pairs (i, i + 4)
// shifted left by 12 - 4 i.
__device__ inline unsigned e2m1_pair(unsigned x) {
    const unsigned sel = ((x >> 8) & 0x70u) | ((x >> 16) & 0x7000u);
    return __byte_perm(0x3e3c3800u, 0x46444240u, sel) | (x & 0x80008000u);
}

// the FP16 pairs a and b multiplied, element by element, rounded to nearest
// even (exact where the products fit FP16's significand and range)
__device__ inline unsigned hmul2(unsigned a, unsigned b) {
#ifdef KVD_PTX_MMA
    unsigned r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else // the product of two FP16 values is exact in FP32: one rounding
    return f16_bits(f16_val(a) * f16_val(b)) | f16_bits(f16_val(a >> 16) * f16_val(b >> 16)) << 16;
#endif
}

} // namespace kvd_mma

#endif
