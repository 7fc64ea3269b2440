/* kvdrift: the calibration set (see calibset.h). */
#include "calibset.h"

#include "trace.h"

int kvd_calibrate_trace(const kvd_backend *be, const kvd_weights *w, uint64_t seed, int n,
                        kvd_cal_recipe recipe, int per_head, kvd_kv_scales *scales,
                        kvd_kv_scales *absmax, char *err) {
    kvd_trace_spec sp;
    kvd_trace_spec_defaults(&sp);
    sp.length = n;
    sp.seed = seed + KVD_CALIB_SEED_OFFSET;
    sp.vocab_size = w->cfg.vocab_size;
    kvd_trace t;
    if (kvd_trace_generate(&sp, &t, err)) return -1;
    int rc = kvd_calibrate(be, w, (const int32_t *)t.tokens, (int)t.n, recipe, per_head, scales,
                           absmax, err);
    kvd_trace_free(&t);
    return rc;
}
