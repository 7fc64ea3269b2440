/* kvdrift: which numeric back ends this build has and what devices they see.
 * The one place the host learns about CUDA; runners never include its headers. */
#ifndef KVD_BACKEND_H
#define KVD_BACKEND_H

#include <stddef.h>

typedef struct {
    int compiled;   /* the CUDA back end is in this build */
    int devices;    /* visible GPUs (0 when none or no driver) */
    char name[128]; /* first device's name, or why there is none */
} kvd_cuda_info;

void kvd_cuda_probe(kvd_cuda_info *info);

/* The device back end's settings from the environment (KVD_CUDA_GEMM,
 * KVD_CUDA_MOE, KVD_CUDA_LINEAR, KVD_CUDA_DECODE, KVD_CUDA_PREFILL), each
 * one word: -1, with "NAME=value: expected ... (or unset)" in err, for any
 * other value, which would otherwise be taken for unset; else 0. kvdrift
 * asks before a command runs, the device model when it opens. */
int kvd_cuda_env_check(char *err, size_t len);

#endif
