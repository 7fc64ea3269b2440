/* kvdrift: what the lock-step drift measurement costs, on either back end. */
#ifndef KVD_LOCKSTEP_H
#define KVD_LOCKSTEP_H

#include <stdint.h>

#include "../runners/engine.h"

/* The drift run (fp8-unscaled in lock step with its BF16 reference, every
 * figure, no generation) over a ctx-token synthetic trace, against the
 * candidate alone over the same tokens in the same 256-token steps, once
 * with every row's logits and once with each step's last row's (what a
 * throughput run asks for); and the drift run again with attention figures
 * at copy starts only, for what the sampled rows cost. Each timed from its
 * models' opening to their closing (weights uploaded, on a device), the
 * best of reps; prints the times and their ratios. 0, or -1 with err set. */
int kvd_bench_lockstep(const kvd_backend *be, const kvd_weights *w, int64_t ctx, int reps,
                       char *err);

#endif
