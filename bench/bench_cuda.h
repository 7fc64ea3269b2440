/* kvdrift: the device benchmarks. */
#ifndef KVD_BENCH_CUDA_H
#define KVD_BENCH_CUDA_H

/* Copy bandwidth, decode attention, GEMMs on the first device; 0, or
 * non-zero when a measurement failed. Prints why when no device is visible.
 * smoke: every part at a small size (tiny's shapes, 1K tokens), which the
 * SIMT simulator runs end to end in minutes; its figures mean nothing. */
int kvd_bench_cuda(int reps, int smoke);

/* The whole model on the device at a preset: decode tokens/s at
 * concurrency 1, 8 and 32 over ctx-token contexts, a BF16 cache (and an
 * FP8 one when with_fp8). */
int kvd_bench_model(const char *preset, int ctx, int steps, int with_fp8, int gpus);

#endif
