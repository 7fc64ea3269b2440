// kvdrift: int4-token's randomized Hadamard rotation on the device, the
// twin of kvd_rht (fp8.h): the same butterfly, each sum and difference the
// CPU's, the signs (kvd_rht_bits) passed by value to the kernels.
#pragma once
#include "../fp8.h"

// sign i of the rotation, +-1
__device__ inline float rht_sign(const kvd_rht_bits &b, int i) {
    return (b.w[i >> 5] >> (i & 31)) & 1u ? -1.0f : 1.0f;
}

// y[0, n) in shared memory (written before the call, the block
// synchronized), rotated in place by the block's threads: forward
// H (d * y), inverse d * (H y), as kvd_rht. Every thread of the block
// calls it; it returns with the block synchronized.
__device__ inline void block_rht(float *y, int n, bool inverse, const kvd_rht_bits &b) {
    const int tid = threadIdx.x, nth = blockDim.x;
    if (!inverse) {
        for (int i = tid; i < n; i += nth) y[i] *= rht_sign(b, i);
        __syncthreads();
    }
    for (int h = 1; h < n; h *= 2) {
        for (int p = tid; p < n / 2; p += nth) {
            const int i = p / h * 2 * h + p % h;
            const float a = y[i], c = y[i + h];
            y[i] = __fadd_rn(a, c);
            y[i + h] = __fsub_rn(a, c);
        }
        __syncthreads();
    }
    if (inverse) {
        for (int i = tid; i < n; i += nth) y[i] *= rht_sign(b, i);
        __syncthreads();
    }
}

// the signs, computed once on the host (kvd_rht_sign_bits)
static inline const kvd_rht_bits &rht_bits() {
    static const kvd_rht_bits b = [] {
        kvd_rht_bits x;
        kvd_rht_sign_bits(&x);
        return x;
    }();
    return b;
}
