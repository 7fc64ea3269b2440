/* kvdrift: the benchmarks' clock, for the CLI and for kvd_gpu_bench alike
 * (which links neither bench/util.c nor its libraries), and for the device
 * model's step profile. */
#ifndef KVD_CLOCK_H
#define KVD_CLOCK_H

#include <time.h>

/* seconds on the monotonic clock */
static inline double kvd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
