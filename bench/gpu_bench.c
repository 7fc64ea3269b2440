/* kvdrift: kvd_gpu_bench, the device benchmarks alone: what `kvdrift bench
 * cuda` measures, in an executable that needs no HDF5 (the GPU check runs it
 * on a machine without the host's libraries). usage: kvd_gpu_bench [REPS] */
#include <stdlib.h>

#include "bench_cuda.h"

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 10;
    return kvd_bench_cuda(reps < 1 ? 1 : reps);
}
