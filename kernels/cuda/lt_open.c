/* kvdrift: cuBLASLt opened at run time, on its first call. Linked at build
 * time, libcublasLt (540 MB) was mapped and relocated at every start of
 * kvdrift, 80 ms and 210 MB of memory for commands that never touch a GPU,
 * and a machine without it could not start kvdrift at all. These are the
 * twelve entry points the back end calls, with cublasLt.h's own signatures;
 * each forwards to the library's, found by soname (the loader's paths, as
 * NCCL's in comm.cu) or else where the build found it, or at the path
 * KVD_CUBLASLT gives. */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"

#define LT_FUNCS(X)                                                                                \
    X(cublasLtCreate)                                                                              \
    X(cublasLtDestroy)                                                                             \
    X(cublasLtMatmul)                                                                              \
    X(cublasLtMatrixLayoutCreate)                                                                  \
    X(cublasLtMatrixLayoutDestroy)                                                                 \
    X(cublasLtMatmulDescCreate)                                                                    \
    X(cublasLtMatmulDescDestroy)                                                                   \
    X(cublasLtMatmulDescSetAttribute)                                                              \
    X(cublasLtMatmulPreferenceCreate)                                                              \
    X(cublasLtMatmulPreferenceDestroy)                                                             \
    X(cublasLtMatmulPreferenceSetAttribute)                                                        \
    X(cublasLtMatmulAlgoGetHeuristic)

static struct {
#define LT_POINTER(f) __typeof__(&f) f;
    LT_FUNCS(LT_POINTER)
#undef LT_POINTER
} lt;
static char lt_missing[512]; /* why the library is not there; empty when it is */
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void lt_load(void) {
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so",
#ifdef KVD_CUBLASLT_PATH
                           KVD_CUBLASLT_PATH
#endif
    };
    size_t n = sizeof names / sizeof names[0];
    /* KVD_CUBLASLT names the library (a Python wheel's, say): that one alone */
    const char *env = getenv("KVD_CUBLASLT");
    if (env && *env) names[0] = env, n = 1;
    void *lib = NULL;
    for (size_t i = 0; i < n && !lib; i++)
        if (!(lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) && i == 0) {
            const char *e = dlerror(); /* the soname's reason: the one a user can act on */
            snprintf(lt_missing, sizeof lt_missing, "cuBLASLt cannot be opened: %s",
                     e ? e : "not found");
        }
    if (!lib) return;
    lt_missing[0] = 0;
    int all = 1;
#define LT_FIND(f)                                                                                 \
    {                                                                                              \
        void *p = dlsym(lib, #f);                                                                  \
        memcpy(&lt.f, &p, sizeof p);                                                               \
        if (!p) {                                                                                  \
            snprintf(lt_missing, sizeof lt_missing, "cuBLASLt lacks %s (expected CUDA 13's)", #f); \
            all = 0;                                                                               \
        }                                                                                          \
    }
    LT_FUNCS(LT_FIND)
#undef LT_FIND
    if (!all) {
        dlclose(lib);
        memset(&lt, 0, sizeof lt);
    }
}

const char *kvd_cublaslt_missing(void) {
    pthread_once(&lt_once, lt_load);
    return lt_missing[0] ? lt_missing : NULL;
}

/* f's arguments passed on to the library's f; without the library, the
 * status cuBLASLt gives before it is initialized */
#define LT_CALL(f, ...) (kvd_cublaslt_missing() ? CUBLAS_STATUS_NOT_INITIALIZED : lt.f(__VA_ARGS__))

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *h) {
    return LT_CALL(cublasLtCreate, h);
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t h) {
    return LT_CALL(cublasLtDestroy, h);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                           const void *alpha, const void *A,
                                           cublasLtMatrixLayout_t Adesc, const void *B,
                                           cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t *algo, void *workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
    return LT_CALL(cublasLtMatmul, h, op, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                   workspace, workspace_bytes, stream);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    return LT_CALL(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    return LT_CALL(cublasLtMatrixLayoutDestroy, layout);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                                     cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
    return LT_CALL(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    return LT_CALL(cublasLtMatmulDescDestroy, desc);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void *buf, size_t bytes) {
    return LT_CALL(cublasLtMatmulDescSetAttribute, desc, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    return LT_CALL(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return LT_CALL(cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t bytes) {
    return LT_CALL(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, bytes);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int *returned) {
    return LT_CALL(cublasLtMatmulAlgoGetHeuristic, h, op, Adesc, Bdesc, Cdesc, Ddesc, pref,
                   requested, results, returned);
}
