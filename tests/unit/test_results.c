/* kvdrift: how the readers pool a sweep's traces (kvd_results_summary,
 * kvd_pool), checked against the formulas worked by hand: n-weighted means,
 * the pooled mean's standard error, extremes, the pooled rms, a NaN trace,
 * and one trace coming back exactly as it was written. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../../bench/results.h"

/* within tol of the value worked by hand, relative to it */
static void close_to(double got, double want, double tol) {
    if (!(fabs(got - want) <= tol * fabs(want)))
        fprintf(stderr, "got %.17g, want %.17g\n", got, want);
    assert_true(fabs(got - want) <= tol * fabs(want));
}

static void row(kvd_results *r, const char *mode, int trace, const char *metric, double value,
                double n) {
    kvd_row_summary *x = kvd_results_add(r, KVD_T_SUMMARY);
    snprintf(x->mode, sizeof x->mode, "%s", mode);
    x->concurrency = 1;
    x->context = 512;
    x->trace = trace;
    snprintf(x->subset, sizeof x->subset, "all");
    snprintf(x->metric, sizeof x->metric, "%s", metric);
    x->value = value;
    x->n = n;
}

/* two traces of unequal n: 100 and 300 positions */
static void pooled_figures(void **st) {
    (void)st;
    kvd_results r;
    kvd_results_init(&r);
    const double n[2] = {100, 300}, kl[2] = {0.002, 0.006}, err[2] = {4e-4, 2e-4},
                 mx[2] = {0.5, 0.25}, rms[2] = {3e-3, 1e-3};
    for (int t = 0; t < 2; t++) {
        row(&r, "fp8-cal", t, "kl_mean", kl[t], n[t]);
        row(&r, "fp8-cal", t, "kl_mean_err", err[t], n[t]);
        row(&r, "fp8-cal", t, "kl_max", mx[t], n[t]);
        row(&r, "fp8-cal", t, "kl_min", mx[t] / 100, n[t]);
        row(&r, "fp8-cal", t, "delta_p_rms", rms[t], n[t]);
    }
    row(&r, "fp8-cal", 0, "kl_p99", 0.01, 100);
    row(&r, "fp8-cal", 1, "kl_p99", NAN, 300); /* a trace whose figure is NaN */
    /* another mode and context must not leak in */
    row(&r, "fp8-unscaled", 0, "kl_mean", 1.0, 1000);
    const double tol = 1e-15;
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_mean"),
             (100 * 0.002 + 300 * 0.006) / 400, tol);
    /* the pooled mean's error: sqrt((100 * 4e-4)^2 + (300 * 2e-4)^2) / 400 */
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_mean_err"),
             sqrt(0.04 * 0.04 + 0.06 * 0.06) / 400, tol);
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_max"), 0.5, 0);
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_min"), 0.0025, 0);
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "delta_p_rms"),
             sqrt((100 * 9e-6 + 300 * 1e-6) / 400), tol);
    assert_true(isnan(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_p99")));
    assert_true(isnan(kvd_results_summary(&r, "fp8-cal", 512, "all", "same_top_p")));
    assert_true(isnan(kvd_results_summary(&r, "fp8-cal", 1024, "all", "kl_mean")));
    close_to(kvd_results_summary(&r, "fp8-unscaled", 512, "all", "kl_mean"), 1.0, 0);
    kvd_results_free(&r);
}

/* one trace: every figure exactly as written, whatever the rounding of
 * n * x / n would do */
static void one_trace_exact(void **st) {
    (void)st;
    kvd_results r;
    kvd_results_init(&r);
    const double v = 0.1 + 0.2; /* not a short binary fraction */
    const char *metrics[] = {"kl_mean", "kl_mean_err", "delta_p_rms", "kl_p99", "kl_max"};
    for (int i = 0; i < 5; i++) row(&r, "fp8-e5m2", 0, metrics[i], v, 255);
    for (int i = 0; i < 5; i++)
        assert_true(kvd_results_summary(&r, "fp8-e5m2", 512, "all", metrics[i]) == v);
    kvd_results_free(&r);

    kvd_pool p = {0};
    assert_true(isnan(kvd_pool_mean(&p)) && isnan(kvd_pool_ci95(&p)));
    kvd_pool_add(&p, 0, 5.0, 1.0); /* no positions: not a row */
    assert_int_equal(p.rows, 0);
    kvd_pool_add(&p, 255, v, v / 7);
    assert_true(kvd_pool_mean(&p) == v && kvd_pool_ci95(&p) == v / 7);
    kvd_pool_add(&p, 85, 0.5, 0.1);
    close_to(kvd_pool_mean(&p), (255 * v + 85 * 0.5) / 340, 1e-15);
    close_to(kvd_pool_ci95(&p), hypot(255 * v / 7, 85 * 0.1) / 340, 1e-15);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pooled_figures),
        cmocka_unit_test(one_trace_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
