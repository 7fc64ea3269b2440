/* kvdrift: the device benchmarks. */
#ifndef KVD_BENCH_CUDA_H
#define KVD_BENCH_CUDA_H

/* Copy bandwidth, decode attention, GEMMs on the first device; 0, or
 * non-zero when a measurement failed. Prints why when no device is visible. */
int kvd_bench_cuda(int reps);

#endif
