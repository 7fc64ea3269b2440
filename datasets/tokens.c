/* kvdrift: synthetic token stream (see tokens.h). */
#include "tokens.h"

#include <math.h>

#include "../runners/weights.h"

/* Zipf(s = 1.1) over [1, vocab) by inverting a continuous approximation of
 * the rank CDF: cheap, deterministic, heavy-tailed like real token counts. */
static int32_t zipf(uint64_t key, uint64_t i, int vocab) {
    double u = kvd_rng_uniform(key, i), s = 1.1, nmax = (double)(vocab - 1);
    double a = 1.0 - s, hmax = (pow(nmax, a) - 1.0) / a;
    double r = pow(1.0 + a * u * hmax, 1.0 / a);
    int32_t id = (int32_t)r;
    if (id < 1) id = 1;
    if (id > vocab - 1) id = vocab - 1;
    /* scatter ranks over the vocabulary so frequent ids are not all small */
    return (int32_t)(1 + ((int64_t)(id - 1) * 2654435761LL) % (vocab - 1));
}

void kvd_tokens_synth(uint64_t seed, int n, int vocab, int32_t *tok) {
    uint64_t key = kvd_rng_key(seed, "kvdrift.tokens");
    uint64_t ctr = 0;
    int i = 0;
    if (n <= 0) return;
    tok[i++] = 0;
    while (i < n) {
        float u = kvd_rng_uniform(key, ctr++);
        if (u < 0.3f && i > 32) {
            /* copy a span from a log-uniformly distant earlier position */
            double dmax = log((double)i);
            int dist = (int)exp(kvd_rng_uniform(key, ctr++) * dmax) + 1;
            if (dist > i) dist = i;
            int len = 4 + (int)(kvd_rng_uniform(key, ctr++) * 28);
            int src = i - dist;
            for (int j = 0; j < len && i < n; j++) tok[i++] = tok[src + j];
        } else {
            int len = 1 + (int)(kvd_rng_uniform(key, ctr++) * 16);
            for (int j = 0; j < len && i < n; j++) tok[i++] = zipf(key, ctr++, vocab);
        }
    }
}
