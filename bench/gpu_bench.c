/* kvdrift: kvd_gpu_bench, the device benchmarks alone: what `kvdrift bench
 * cuda` measures, in an executable that needs no HDF5 (the GPU check runs it
 * on a machine without the host's libraries).
 * usage: kvd_gpu_bench [REPS]                       the kernels
 *        kvd_gpu_bench smoke                        the same at a small size, once
 *        (the SIMT simulator's build runs it end to end)
 *        kvd_gpu_bench model [PRESET [CTX [STEPS [fp8|bf16 [GPUS]]]]] the
 *        whole model's decode (default qwen3.5-397b-a17b, 512, 8, bf16, 1; fp8:
 *        an FP8 cache too; GPUS: split over that many, tensor parallel)
 *        kvd_gpu_bench lockstep [PRESET [CTX [GPUS]]] the drift run against the
 *        candidate alone on the device (default small, 16384, 1) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/cuda_kernels.h"
#include "bench_cuda.h"
#include "lockstep.h"

static int lockstep(const char *preset, int ctx, int gpus) {
    char err[KVD_ERR_LEN];
    if (!kvd_cuda_available(err, sizeof err)) {
        printf("kvd_gpu_bench lockstep: %s; nothing to measure\n", err);
        return 1;
    }
    kvd_config cfg;
    kvd_synth syn;
    kvd_weights w;
    kvd_synth_defaults(&syn);
    if (kvd_config_preset(preset, &cfg, err) || kvd_weights_lazy_synth(&w, &cfg, &syn, err)) {
        fprintf(stderr, "kvd_gpu_bench lockstep: %s\n", err);
        return 1;
    }
    const kvd_backend be = {&kvd_engine_cuda, gpus};
    int rc = kvd_bench_lockstep(&be, &w, ctx, 1, err);
    if (rc) fprintf(stderr, "kvd_gpu_bench lockstep: %s\n", err);
    kvd_weights_free(&w);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "lockstep")) {
        int ctx = argc > 3 ? atoi(argv[3]) : 16384, gpus = argc > 4 ? atoi(argv[4]) : 1;
        return lockstep(argc > 2 ? argv[2] : "small", ctx < 16 ? 16 : ctx, gpus < 1 ? 1 : gpus);
    }
    if (argc > 1 && !strcmp(argv[1], "model")) {
        const char *preset = argc > 2 ? argv[2] : "qwen3.5-397b-a17b";
        int ctx = argc > 3 ? atoi(argv[3]) : 512, steps = argc > 4 ? atoi(argv[4]) : 8;
        int fp8 = argc > 5 && !strcmp(argv[5], "fp8"), gpus = argc > 6 ? atoi(argv[6]) : 1;
        return kvd_bench_model(preset, ctx < 1 ? 1 : ctx, steps < 1 ? 1 : steps, fp8,
                               gpus < 1 ? 1 : gpus)
                   ? 1
                   : 0;
    }
    if (argc > 1 && !strcmp(argv[1], "smoke")) return kvd_bench_cuda(1, 1);
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    return kvd_bench_cuda(reps < 1 ? 1 : reps, 0);
}
