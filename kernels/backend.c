/* kvdrift: back-end discovery. Without the CUDA back end compiled in, it says
 * so; with it, it asks the runtime how many devices are visible. */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
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

int kvd_cuda_env_check(char *err, size_t len) {
    static const struct {
        const char *name, *values[3];
    } vars[] = {
        {"KVD_CUDA_GEMM", {"tune", "first"}}, {"KVD_CUDA_MOE", {"host", "loop"}},
        {"KVD_CUDA_LINEAR", {"fp32"}},        {"KVD_CUDA_DECODE", {"2"}},
        {"KVD_CUDA_PREFILL", {"1"}},
    };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i].name);
        if (!v || !*v) continue;
        char want[64] = "";
        int ok = 0;
        for (int j = 0; vars[i].values[j]; j++) { /* at most two, then NULL */
            ok |= !strcmp(v, vars[i].values[j]);
            size_t n = strlen(want);
            snprintf(want + n, sizeof want - n, "%s'%s'", j ? " or " : "", vars[i].values[j]);
        }
        if (!ok) {
            snprintf(err, len, "%s=%.64s: expected %s (or unset)", vars[i].name, v, want);
            return -1;
        }
    }
    return 0;
}
