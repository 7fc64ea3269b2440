/* kvdrift: the lock-step drift run against the candidate alone, on the CPU
 * (`kvdrift bench lockstep`) or the device (`kvd_gpu_bench lockstep`). */
#include "lockstep.h"

#include <stdio.h>
#include <stdlib.h>

#include "../datasets/trace.h"
#include "../runners/drift.h"
#include "clock.h"

/* the candidate alone over tok[0, ctx): its model opened, 256-token steps,
 * closed; seconds, or -1 */
static double alone(const kvd_backend *be, const kvd_weights *w, const int32_t *tok, int64_t ctx,
                    int last_only, float *logits, char *err) {
    const kvd_config *c = &w->cfg;
    kvd_kvcache kv;
    kvd_engine e;
    double t0 = kvd_now();
    if (kvd_kvcache_init(&kv, KVD_KV_FP8_UNSCALED, kvd_config_n_full(c), c->num_key_value_heads,
                         c->head_dim, KVD_KV_BLOCK, ctx + 16, NULL, 1, err))
        return -1;
    int rc = kvd_engine_open(&e, be, w, &kv, 256, 1, NULL, err);
    if (rc == 0) {
        int s = kvd_kvcache_add_seq(&kv);
        for (int64_t p = 0; p < ctx && rc == 0; p += 256) {
            int n = (int)(ctx - p < 256 ? ctx - p : 256);
            kvd_batch b = {1, &s, &n, tok + p};
            rc = kvd_engine_forward(&e, &kv, &b, logits, last_only, err);
        }
        kvd_engine_close(&e);
    }
    kvd_kvcache_free(&kv);
    return rc ? -1 : kvd_now() - t0;
}

int kvd_bench_lockstep(const kvd_backend *be, const kvd_weights *w, int64_t ctx, int reps,
                       char *err) {
    const kvd_config *c = &w->cfg;
    kvd_trace t;
    kvd_trace_spec sp;
    kvd_trace_spec_defaults(&sp);
    sp.length = ctx + 1;
    sp.vocab_size = c->vocab_size;
    if (kvd_trace_generate(&sp, &t, err)) return -1;
    uint8_t *copy = calloc((size_t)ctx + 1, 1), *start = calloc((size_t)ctx + 1, 1);
    float *logits = malloc(sizeof(float) * 256 * (size_t)c->vocab_size);
    int rc = copy && start && logits ? 0 : -1;
    if (rc) snprintf(err, KVD_ERR_LEN, "bench lockstep: out of memory");
    if (rc == 0) kvd_trace_copy_marks(&t, ctx, copy, start); /* as run marks them */
    /* alone (all logits), alone (last row), lock step, lock step sampling
     * attention at copy starts only, four modes in lock step with one
     * reference run */
    double best[5] = {1e30, 1e30, 1e30, 1e30, 1e30};
    enum { G = 4 };
    const kvd_kv_mode group[G] = {KVD_KV_FP8_UNSCALED, KVD_KV_FP8_E5M2, KVD_KV_NVFP4_UNSCALED,
                                  KVD_KV_FP8_TOKEN};
    const kvd_kv_scales *none[G] = {NULL, NULL, NULL, NULL};
    const int nvfp4 = c->head_dim % 16 == 0; /* else the group leaves NVFP4 out */
    for (int r = 0; r < reps && rc == 0; r++) {
        for (int last = 0; last < 2 && rc == 0; last++) {
            double s = alone(be, w, (const int32_t *)t.tokens, ctx, last, logits, err);
            rc = s < 0 ? -1 : 0;
            if (s >= 0 && s < best[last]) best[last] = s;
        }
        for (int few = 0; few < 2 && rc == 0; few++) {
            kvd_drift d;
            kvd_drift_init(&d, c, ctx);
            kvd_drift_opts o;
            kvd_drift_opts_defaults(&o);
            o.gen_tokens = 0;
            if (few) o.sample_every = 1 << 30;
            double t0 = kvd_now();
            rc = kvd_drift_run(be, w, t.tokens, copy, start, ctx, KVD_KV_FP8_UNSCALED, NULL, &o, &d,
                               err);
            double s = kvd_now() - t0;
            kvd_drift_free(&d);
            if (rc == 0 && s < best[2 + few]) best[2 + few] = s;
        }
        if (rc == 0) {
            kvd_drift d[G];
            kvd_kv_mode m[G];
            int k = 0;
            for (int j = 0; j < G; j++)
                if (nvfp4 || group[j] != KVD_KV_NVFP4_UNSCALED) m[k++] = group[j];
            for (int j = 0; j < k; j++) kvd_drift_init(&d[j], c, ctx);
            kvd_drift_opts o;
            kvd_drift_opts_defaults(&o);
            o.gen_tokens = 0;
            double t0 = kvd_now();
            rc = kvd_drift_run_modes(be, w, t.tokens, copy, start, ctx, k, m, none, &o, d, err);
            double s = (kvd_now() - t0) / k;
            for (int j = 0; j < k; j++) kvd_drift_free(&d[j]);
            if (rc == 0 && s < best[4]) best[4] = s;
        }
    }
    if (rc == 0)
        printf("lock-step drift run vs the candidate alone, %s on %s%s, %lld tokens, fp8-unscaled "
               "(best of %d):\n"
               "  candidate alone, every row's logits: %8.3f s  (%.1f tok/s)\n"
               "  candidate alone, last row's logits:  %8.3f s  (%.1f tok/s)\n"
               "  lock step with BF16 + figures:       %8.3f s\n"
               "  ratio: %.2fx to every row's logits (goal <= 2.5x), %.2fx to the last row's\n"
               "  lock step, attention sampled at copy starts only: %.3f s (the sampled rows: "
               "%.0f%% of the lock step)\n"
               "  %d modes in lock step with one reference run: %.3f s a mode, %.2fx the lock "
               "step of one%s\n",
               c->name, be->ops->name, be->gpus > 1 ? " (tensor parallel)" : "", (long long)ctx,
               reps, best[0], ctx / best[0], best[1], ctx / best[1], best[2], best[2] / best[0],
               best[2] / best[1], best[3], 100.0 * (best[2] - best[3]) / best[2], nvfp4 ? G : G - 1,
               best[4], best[4] / best[2],
               be->ops->shadow_of_reference ? "" : " (this back end runs them one by one)");
    free(logits), free(copy), free(start);
    kvd_trace_free(&t);
    return rc;
}
