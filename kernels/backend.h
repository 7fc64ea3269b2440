/* kvdrift: which numeric back ends this build has and what devices they see.
 * The one place the host learns about CUDA; runners never include its headers. */
#ifndef KVD_BACKEND_H
#define KVD_BACKEND_H

typedef struct {
    int compiled;   /* the CUDA back end is in this build */
    int devices;    /* visible GPUs (0 when none or no driver) */
    char name[128]; /* first device's name, or why there is none */
} kvd_cuda_info;

void kvd_cuda_probe(kvd_cuda_info *info);

#endif
