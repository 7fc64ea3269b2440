// kvdrift: CUDA runtime entry points of the GPU back end: device discovery and
// a cuBLASLt handle check.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_kernels.h"

extern "C" int kvd_cuda_device_count(char *name, int len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        std::snprintf(name, (size_t)len, "no CUDA device visible (%s)",
                      e == cudaSuccess ? "none found" : cudaGetErrorString(e));
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
        std::snprintf(name, (size_t)len, "%s (sm_%d%d)", p.name, p.major, p.minor);
    }
    // the GEMMs need cuBLASLt, opened only now: without it no device is usable
    if (const char *why = kvd_cublaslt_missing()) {
        std::snprintf(name, (size_t)len, "%d CUDA device(s) visible, but %s", n, why);
        return 0;
    }
    cublasLtHandle_t h;
    if (cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS) cublasLtDestroy(h);
    return n;
}
