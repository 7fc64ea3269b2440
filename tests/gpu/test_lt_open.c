/* kvdrift: cuBLASLt opened at run time (kernels/cuda/lt_open.c). The
 * binaries no longer name libcublasLt (a test reads their dynamic section);
 * where CUDA is installed the library opens on the first call, and the
 * calls that need no GPU (descriptors, layouts, preferences) reach it and
 * succeed; a handle is made where a GPU is and refused with cuBLASLt's own
 * status where none is. */
#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_kernels.h"

static int failed;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "test_lt_open: %s:%d: %s\n", __FILE__, __LINE__, #c);                  \
            failed = 1;                                                                            \
        }                                                                                          \
    } while (0)

int main(void) {
    const char *why = kvd_cublaslt_missing();
    /* KVD_CUBLASLT at a file that is not there (unit_lt_missing): the
     * loader's reason, and cuBLASLt's own status from every entry point */
    const char *env = getenv("KVD_CUBLASLT");
    if (env && strstr(env, "/nonexistent/")) {
        cublasLtHandle_t h;
        cublasLtMatrixLayout_t a;
        CHECK(why && strstr(why, "cuBLASLt cannot be opened: ") && strstr(why, env));
        CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_NOT_INITIALIZED);
        CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 4, 4) == CUBLAS_STATUS_NOT_INITIALIZED);
        printf("test_lt_open: %s\n", why ? why : "(opened)");
        return failed;
    }
    if (why) {
        /* CUDA's compiler without its libraries: say so, and the status */
        printf("test_lt_open: skipped: %s\n", why);
        cublasLtHandle_t h;
        return cublasLtCreate(&h) == CUBLAS_STATUS_NOT_INITIALIZED ? 77 : 1;
    }
    cublasLtMatrixLayout_t a;
    CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 64, 32, 64) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatrixLayoutDestroy(a) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t t = CUBLAS_OP_T;
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) ==
          CUBLAS_STATUS_SUCCESS);
    /* the library's own checks run: an attribute of the wrong size is refused */
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, 1) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasLtMatmulDescDestroy(op) == CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulPreference_t pref;
    CHECK(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    const size_t ws = 1 << 20;
    CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                               sizeof ws) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasLtMatmulPreferenceDestroy(pref) == CUBLAS_STATUS_SUCCESS);
    char name[256];
    const int devices = kvd_cuda_available(name, (int)sizeof name);
    cublasLtHandle_t h;
    const cublasStatus_t s = cublasLtCreate(&h);
    if (devices) {
        CHECK(s == CUBLAS_STATUS_SUCCESS);
        if (s == CUBLAS_STATUS_SUCCESS) CHECK(cublasLtDestroy(h) == CUBLAS_STATUS_SUCCESS);
    } else {
        CHECK(s == CUBLAS_STATUS_NOT_INITIALIZED); /* no GPU: cuBLASLt's own refusal */
    }
    printf("test_lt_open: cuBLASLt opened at run time; %s\n", devices ? name : "no GPU");
    return failed;
}
