/* kvdrift: the gated delta rule recurrence on the CPU, one head, one token.
 * The state never leaves fp32: FP8 KV drift reaches DeltaNet layers only
 * through their inputs. */
#include "../kernels.h"

#include <math.h>
#include <string.h>

void kvd_gdn_step(float *S, const float *q, const float *k, const float *v, float g, float beta,
                  float *o, int dk, int dv) {
    float decay = expf(g);
    float mem[dv], delta[dv];
    /* first pass: S^T k of the decayed state */
    memset(mem, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        const float *row = S + (size_t)i * dv;
        float ki = k[i];
        for (int j = 0; j < dv; j++) mem[j] += row[j] * ki;
    }
    for (int j = 0; j < dv; j++) delta[j] = (v[j] - decay * mem[j]) * beta;
    /* second pass: decay, rank-one update and read-out in one sweep */
    memset(o, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv;
        float ki = k[i], qi = q[i];
        for (int j = 0; j < dv; j++) {
            float s = decay * row[j] + ki * delta[j];
            row[j] = s;
            o[j] += s * qi;
        }
    }
}
