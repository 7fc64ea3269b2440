// kvdrift: a SIMT simulator for the CUDA back end's kernels, so that every
// kernel in kernels/cuda runs on any machine, held to its CPU twin by the
// same tests that run on a GPU. The .cu files are compiled by the host C++
// compiler against this header (tests/simt/include holds the CUDA header
// names, each including it); tests/simt/translate.cmake first rewrites what
// is not C++ or means more on a GPU: a launch `k<<<grid, block, shmem>>>(args)`
// becomes `k % kvd_simt::launch("k", grid, block, shmem)(args)`,
// `extern __shared__ T name[];` a pointer to the block's dynamic shared
// memory, and a kernel's `__launch_bounds__(MAX, ...)` a check of its block
// size at the start of its body.
//
// Every CUDA thread is a fiber with its own stack; a block's threads run one
// after another until each finishes or waits at __syncthreads or a warp
// operation (shuffles, ballots, __activemask, mma.sync), which complete when
// every thread they name has arrived. The blocks of a grid run one after another,
// so __shared__ (a static here) is per block, refilled with 0xff bytes
// for each block by translate.cmake's shared_fresh call. What the simulator checks on
// top of running the code:
//   - launch configurations (threads per block, grid limits, dynamic shared
//     memory beyond 48 KB without an opt-in): the launch fails, as on a GPU,
//     and cudaGetLastError says so;
//   - pointer arguments of a kernel that are not device memory of the
//     current device, and copies or memsets that run past an allocation;
//   - a barrier or warp operation that cannot complete (divergence, or a
//     lane of the mask that has exited): the launch fails with the threads
//     named;
//   - device memory starts as 0xff bytes (NaN floats, -1 integers), so a
//     read of what was never written shows; so does each block's shared
//     memory, dynamic and static, so a block reads only what it wrote;
//   - a block no larger than the kernel's __launch_bounds__;
//   - cp.async's addresses must be aligned to its size (4, 8 or 16
//     bytes), ldmatrix's rows to 16 bytes;
//   - cp.async copies (kernels/cuda/mma.cuh) land only at the
//     cp.async.wait_group that completes them, so a read of a stage that
//     was not waited for sees the old bytes;
//   - cudaMemcpyAsync from the host lands at once in ascending order, and
//     in reverse order only at the stream's next operation, reading its
//     source then, so a host that rewrites the source too soon shows;
//   - with KVD_SIMT_ORDER=reverse, threads, warps and blocks run in
//     descending order instead of ascending, so a read of another thread's
//     write with no barrier or warp operation between them (a race on a
//     GPU) sees the write in one order and not in the other (the sanitizer
//     build's tests run reversed).
// The device it reports is an H200, or with KVD_SIMT_DEVICE=sm_120 a part
// with sm_120's limits (99 KB of shared memory a block), so the paths the
// kernels choose for either device's limits run in the tests.
// Under AddressSanitizer (the CI's second build) every device buffer is an
// ordinary heap block, so the kernels' out-of-bounds accesses are caught
// like the host's. Arithmetic is IEEE single precision without contraction
// except where the code asks for fmaf; __expf is expf. The FP8 and BF16
// conversions are the CPU codecs, which tests/oracle holds bit for bit to
// CUDA's own. Timings (events) are host wall-clock and mean nothing.
#ifndef KVD_SIMT_H
#define KVD_SIMT_H

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- vector types and launch geometry ----
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) {
    return uint2{x, y};
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}

// ---- the runtime API (the subset the back end uses) ----
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
typedef struct kvd_simt_event *cudaEvent_t;
typedef struct kvd_simt_stream *cudaStream_t;
struct cudaDeviceProp {
    char name[256];
    int major, minor, multiProcessorCount, warpSize, maxThreadsPerBlock;
    int l2CacheSize; // 0: the simulator has no L2
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

cudaError_t cudaMalloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) {
    return cudaMalloc(reinterpret_cast<void **>(p), n);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemset(void *p, int value, size_t n);
// page-locked host memory and the stream's copies: host memory and
// cudaMemcpy here (one queue, run as it is given)
#define cudaHostAllocPortable 1
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetLastError();
cudaError_t cudaDeviceSynchronize();
// clears the errors (a fault included); allocations stay
cudaError_t cudaDeviceReset();
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);

// ---- device code ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

namespace kvd_simt {

struct thread_ctx {
    uint3 tid, bid;
    dim3 bdim, gdim;
};
extern thread_ctx *self; // the thread running now

struct config {
    const char *name;
    dim3 grid, block;
    size_t shmem;
    size_t shmem_optin; // what cudaFuncSetAttribute allowed the kernel (0: 48 KB)
    const void *kernel; // the kernel's function
};

// cudaFuncAttributeMaxDynamicSharedMemorySize per kernel, per device
cudaError_t func_set_shmem(const void *kernel, int bytes);
size_t func_shmem(const void *kernel);

// What ptxas gave each kernel (registers a thread, static shared memory),
// read from the .usage files the CUDA build writes beside its objects
// (scripts/nvcc-usage.sh) into the folder KVD_SIMT_PTXAS names, for the
// simulated device's architecture. The kernels here are the same functions
// compiled for the host; their ELF symbols name them as nvcc's do (the
// anonymous namespace aside). With a table loaded, a launch the GPU would
// refuse for its registers or shared memory fails the same way, and so
// does the launch of a kernel the table lacks.
struct kernel_usage {
    int regs;
    size_t smem; // static shared memory
};
// the kernel's entry, or nullptr (no table, or not in it)
const kernel_usage *usage_of(const void *kernel);
// whether a table is loaded
bool usage_loaded();
// why the launch c would be refused for its resources (written into msg),
// and the error, or nullptr when it fits or no table is loaded
const char *refused_resources(const config &c, char *msg, size_t n, cudaError_t *code);
// (tests) the table from the .usage files in dir instead of KVD_SIMT_PTXAS's;
// nullptr: none. 0, or -1 (said on stderr) when dir has none or one is malformed
int usage_load(const char *dir);
// the mangled name of a function of this executable, or nullptr
const char *symbol_of(const void *fn);

// runs body once per thread of the grid; a failed launch sets the error
// cudaGetLastError returns
void run(const config &c, const std::function<void()> &body);
// the current device's memory (null counts as such)
bool device_ptr(const void *p);
void bad_pointer(const config &c, int arg, const void *p);
void *dynamic_shared();
// the host-to-device copies cudaMemcpyAsync queued on device dev (every
// device's: -1) land, as they have by the stream's next operation
void land_copies(int dev);
// a static __shared__ variable's declaration reached by a thread
// (translate.cmake puts the call after it): the block's first thread to
// reach it fills it with 0xff bytes, as each block's dynamic shared memory
// is filled, so a block reads only what it wrote, not the last block's
void shared_fresh(void *p, size_t n);

enum warp_kind { W_SHFL_IDX, W_SHFL_XOR, W_SHFL_DOWN, W_BALLOT, W_ACTIVEMASK, W_GATHER, W_MMA };
uint64_t warp_op(warp_kind k, unsigned mask, uint64_t value, int arg, int width);
// Every lane's n (<= 8) words in one warp operation of the whole warp, as
// table[lane][word]; the table stays until the warp's next gather. What 32
// shuffles a lane would do for kernels/cuda/mma.cuh's fragments, at one
// switch point instead of 32.
const unsigned (*warp_gather(const unsigned *words, int n))[8];
// mma.sync.m16n8k16 (FP32 accumulate, BF16 or FP16 in) as the instruction:
// one operation of the whole warp, whose product is computed once when the
// last lane arrives, each output's sum over k in kvd_mma::mma_portable's
// order (2s, 2s + 1, 2s + 8, 2s + 9 for s = 0 .. 3), so the same bits as
// that per-lane body (unit_simt holds the two together). Fragments as
// kernels/cuda/mma.cuh lays them out.
void mma_m16n8k16(float c[4], const unsigned a[4], const unsigned b[2], bool f16);
void syncthreads();
// cp.async as a GPU may run it, late: the running thread's copy of size
// bytes (4, 8 or 16, both addresses aligned to it; zeros past src_bytes) takes its source now and
// lands in shared memory only when async_wait lets its group complete (or never, if the thread ends
// first). async_commit closes the thread's open group; async_wait(n) completes all its committed
// groups but the newest n. A kernel that reads a stage before waiting for it reads what was there
// before.
void async_copy(void *dst, const void *src, int size, int src_bytes);
// p is a multiple of align bytes, as `what` (an instruction) needs, else
// the launch fails with the thread named (a misaligned address on a GPU)
void need_aligned(const void *p, unsigned align, const char *what);
// whether threads run in descending order (KVD_SIMT_ORDER=reverse)
bool reverse_order();
// the simulated device's figures (KVD_SIMT_DEVICE: sm_90, the default, or sm_120)
struct simt_device {
    const char *arch;
    int major, minor, sms;
    size_t smem_optin, smem_sm; // shared memory: a block's opt-in, a multiprocessor's
};
const simt_device &device();
// a kernel's __launch_bounds__ maximum (translate.cmake puts the call at
// the start of its body): a block of more threads fails the launch, as
// the GPU refuses it
void launch_bound(long long max_threads);
void async_commit();
void async_wait(int n);

template <class... A> struct pending {
    config c;
    std::tuple<A...> args;
};
struct launcher {
    config c;
    template <class... A> pending<std::decay_t<A>...> operator()(A &&...a) const {
        return {c, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
    }
};
inline launcher launch(const char *name, dim3 grid, dim3 block, size_t shmem = 0,
                       cudaStream_t stream = nullptr) {
    (void)stream;
    return {{name, grid, block, shmem, 0, nullptr}};
}

template <size_t I, class T> bool check_args(const config &c, const T &args) {
    if constexpr (I == std::tuple_size<T>::value) {
        return true;
    } else {
        using E = std::tuple_element_t<I, T>;
        if constexpr (std::is_pointer<E>::value) {
            const void *p = static_cast<const void *>(std::get<I>(args));
            if (!device_ptr(p)) {
                bad_pointer(c, (int)I, p);
                return false;
            }
        }
        return check_args<I + 1>(c, args);
    }
}

// the launch: kernel % launch(...)(args); each thread calls the kernel with
// its own copies of the arguments, converted as a call would convert them
template <class... P, class... A> void operator%(void (*k)(P...), pending<A...> &&p) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong argument count");
    std::tuple<P...> args =
        std::apply([](auto &...a) { return std::tuple<P...>(static_cast<P>(a)...); }, p.args);
    if (!check_args<0>(p.c, args)) return;
    p.c.kernel = reinterpret_cast<const void *>(k);
    p.c.shmem_optin = func_shmem(p.c.kernel);
    run(p.c, [&] { std::apply(k, args); });
}

template <class T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8, "warp operations move at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
}
template <class T> inline T of_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

} // namespace kvd_simt

template <class F> cudaError_t cudaFuncSetAttribute(F *kernel, cudaFuncAttribute a, int value) {
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
    return kvd_simt::func_set_shmem(reinterpret_cast<const void *>(kernel), value);
}

#define threadIdx (kvd_simt::self->tid)
#define blockIdx (kvd_simt::self->bid)
#define blockDim (kvd_simt::self->bdim)
#define gridDim (kvd_simt::self->gdim)

inline void __syncthreads() {
    kvd_simt::syncthreads();
}
inline unsigned __activemask() {
    return (unsigned)kvd_simt::warp_op(kvd_simt::W_ACTIVEMASK, 0, 0, 0, 32);
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)kvd_simt::warp_op(kvd_simt::W_BALLOT, mask, pred != 0, 0, 32);
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return kvd_simt::of_bits<T>(
        kvd_simt::warp_op(kvd_simt::W_SHFL_IDX, mask, kvd_simt::bits_of(v), src, width));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return kvd_simt::of_bits<T>(
        kvd_simt::warp_op(kvd_simt::W_SHFL_XOR, mask, kvd_simt::bits_of(v), lane_mask, width));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return kvd_simt::of_bits<T>(
        kvd_simt::warp_op(kvd_simt::W_SHFL_DOWN, mask, kvd_simt::bits_of(v), (int)delta, width));
}

// blocks run one at a time and threads between switch points, so the
// atomics are plain read-modify-writes; they return the old value
template <class T> inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <class T> inline T atomicMax(T *p, T v) {
    T o = *p;
    if (v > o) *p = v;
    return o;
}
template <class T> inline T atomicMin(T *p, T v) {
    T o = *p;
    if (v < o) *p = v;
    return o;
}

template <class A, class B> inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B> inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)b : (C)a;
}

inline float __fadd_rn(float a, float b) {
    return a + b;
}
inline float __fsub_rn(float a, float b) {
    return a - b;
}
inline float __fmul_rn(float a, float b) {
    return a * b;
}
inline float __fdiv_rn(float a, float b) {
    return a / b;
}
inline float __frcp_rn(float a) {
    return 1.0f / a;
}
inline int __float2int_rn(float a) { // to nearest even; NaN to 0, beyond the range clamped
    return a != a                ? 0
           : a >= 2147483648.0f  ? 2147483647
           : a <= -2147483648.0f ? (-2147483647 - 1)
                                 : (int)rintf(a);
}
inline int __float2int_rz(float a) { // NaN to 0, beyond the range clamped, as cvt.rzi.s32.f32
    return a != a                ? 0
           : a >= 2147483648.0f  ? 2147483647
           : a <= -2147483648.0f ? (-2147483647 - 1)
                                 : (int)a;
}
inline float __expf(float x) {
    return expf(x);
}
inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __ffs(int x) {
    return __builtin_ffs(x);
}
// byte n of the result: byte (s >> 4n) & 7 of the pair (y:x), x the low word
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int n = 0; n < 4; n++)
        r |= (unsigned)(v >> (8 * ((s >> (4 * n)) & 7u)) & 0xffu) << (8 * n);
    return r;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

// ---- BF16, FP16 and FP8 (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h) ----
struct __nv_bfloat16 {
    unsigned short __x;
};
struct __half_raw {
    unsigned short x;
};
struct __half {
    unsigned short __x;
    __half() = default;
    __half(__half_raw r) : __x(r.x) {}
};
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };
typedef unsigned char __nv_fp8_storage_t;

float __bfloat162float(__nv_bfloat16 b);
__nv_bfloat16 __float2bfloat16_rn(float x);
namespace kvd_simt {
float half_rare(__half h); // zeros, subnormals, infinities and NaN
}
// the normal numbers inline (the tensor-core bodies convert every element)
inline float __half2float(__half h) {
    const unsigned e = (h.__x >> 10) & 31u;
    if (e - 1u >= 30u) return kvd_simt::half_rare(h);
    // exponent and mantissa shift into place; the bias goes from 15 to 127
    const uint32_t u = ((h.__x & 0x8000u) << 16 | (h.__x & 0x7fffu) << 13) + (112u << 23);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
__half __float2half_rn(float x);
__half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t v, __nv_fp8_interpretation_t f);
__nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t s, __nv_fp8_interpretation_t f);

// ---- cuBLASLt (cublasLt.h): the matmul the back end asks for, computed on
// the host in FP32 from the layouts given (column-major, op(A) op(B)) ----
enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasLtMatmulDescAttributes_t {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB
};
enum cublasLtMatmulPreferenceAttributes_t { CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 };
typedef struct kvd_simt_lt *cublasLtHandle_t;
typedef struct kvd_simt_lt_desc *cublasLtMatmulDesc_t;
typedef struct kvd_simt_lt_layout *cublasLtMatrixLayout_t;
typedef struct kvd_simt_lt_pref *cublasLtMatmulPreference_t;
struct cublasLtMatmulAlgo_t {
    uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                        cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *v,
                                              size_t n);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *v, size_t n);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int want,
                                              cublasLtMatmulHeuristicResult_t *out, int *found);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t a, const void *B,
                              cublasLtMatrixLayout_t b, const void *beta, const void *C,
                              cublasLtMatrixLayout_t c, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t s);

#endif
