/* kvdrift: kvd_gpu_bench, the device benchmarks alone: what `kvdrift bench
 * cuda` measures, in an executable that needs no HDF5 (the GPU check runs it
 * on a machine without the host's libraries).
 * usage: kvd_gpu_bench [REPS]                       the kernels
 *        kvd_gpu_bench model [PRESET [CTX [STEPS [fp8|bf16 [GPUS]]]]] the
 *        whole model's decode (default qwen3.5-397b-a17b, 512, 8, bf16, 1; fp8:
 *        an FP8 cache too; GPUS: split over that many, tensor parallel) */
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "model")) {
        const char *preset = argc > 2 ? argv[2] : "qwen3.5-397b-a17b";
        int ctx = argc > 3 ? atoi(argv[3]) : 512, steps = argc > 4 ? atoi(argv[4]) : 8;
        int fp8 = argc > 5 && !strcmp(argv[5], "fp8"), gpus = argc > 6 ? atoi(argv[6]) : 1;
        return kvd_bench_model(preset, ctx < 1 ? 1 : ctx, steps < 1 ? 1 : steps, fp8,
                               gpus < 1 ? 1 : gpus)
                   ? 1
                   : 0;
    }
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    return kvd_bench_cuda(reps < 1 ? 1 : reps);
}
