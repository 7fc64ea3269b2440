/* kvdrift: the GPU tests' checks: counted, the first failures printed, the
 * run goes on (one device run should report everything that is wrong). */
#ifndef KVD_TEST_CHECK_H
#define KVD_TEST_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            if (failures++ < 20) fprintf(stderr, __VA_ARGS__);                                     \
        }                                                                                          \
    } while (0)

/* the larger of worst and e, a NaN winning over everything (a NaN result
 * must fail the check that follows, not vanish from the maximum) */
static inline double worst_of(double worst, double e) {
    return worst != worst || e <= worst ? worst : e;
}

/* ||a - b|| / ||b|| */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        num += e * e, den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
