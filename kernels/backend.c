/* kvdrift: back-end discovery. Without the CUDA back end compiled in, it says
 * so; with it, it asks the runtime how many devices are visible. */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#ifdef KVD_HAVE_CUDA
int kvd_cuda_device_count(char *name, int len);
#endif

void kvd_cuda_probe(kvd_cuda_info *info) {
    memset(info, 0, sizeof *info);
#ifdef KVD_HAVE_CUDA
    info->compiled = 1;
    info->devices = kvd_cuda_device_count(info->name, (int)sizeof info->name);
#else
    snprintf(info->name, sizeof info->name, "CUDA back end not compiled in (nvcc was not found)");
#endif
}
