/* kvdrift: the calibration set: a held-out agentic-coding trace, the same
 * for every command that calibrates. */
#ifndef KVD_CALIBSET_H
#define KVD_CALIBSET_H

#include <stdint.h>

#include "../runners/calibrate.h"

/* Calibrate over the held-out calibration trace every command uses: the
 * agentic-coding generator at seed + KVD_CALIB_SEED_OFFSET, n tokens. So
 * `kvdrift calibrate --seed S` writes exactly what `kvdrift run --seed S`
 * calibrates. */
int kvd_calibrate_trace(const kvd_backend *be, const kvd_weights *w, uint64_t seed, int n,
                        kvd_cal_recipe recipe, int per_head, kvd_kv_scales *scales,
                        kvd_kv_scales *absmax, char *err);

#endif
