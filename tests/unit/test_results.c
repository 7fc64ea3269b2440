/* kvdrift: how the readers pool a sweep's traces (kvd_results_summary,
 * kvd_pool), checked against the formulas worked by hand: n-weighted means,
 * the pooled mean's standard error, extremes, the pooled rms, a NaN trace,
 * and one trace coming back exactly as it was written; percentiles over
 * every trace's positions, paired differences, the trace hash, and the
 * per-position tables through a file and back (schema versions 1 and 2). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../bench/results.h"
#include "../../reports/report.h"
#include "../../runners/config.h"
#include "../../runners/drift.h"

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

/* FNV-1a (64-bit) of the bytes "abcdefgh", the two ids 0x64636261 and
 * 0x68676665 little-endian; worked out by an independent implementation */
static void token_hash(void **st) {
    (void)st;
    const uint32_t t[2] = {0x64636261u, 0x68676665u};
    assert_true(kvd_token_hash(t, 0) == 0xcbf29ce484222325ull);
    assert_true(kvd_token_hash(t, 2) == 0x25da8c1836a8d66dull);
    assert_true(kvd_token_hash(t, 1) != kvd_token_hash(t + 1, 1));
}

/* trace 0: KL 1..5 at positions 0..4 (copies at 1 and 3); trace 1: 12, 10,
 * 11 (a copy at 1); each times scale */
static void two_traces(kvd_results *r, const char *mode, uint64_t h0, double scale) {
    kvd_row_token a[5], b[3];
    memset(a, 0, sizeof a), memset(b, 0, sizeof b);
    for (int i = 0; i < 5; i++) {
        a[i].kl = (float)(scale * (i + 1));
        a[i].copy = i == 1 || i == 3;
        a[i].same_top = i != 2;
        a[i].delta_nll = (float)(scale * (i % 2 ? 0.5 : -0.25));
    }
    const float k1[3] = {12, 10, 11};
    for (int i = 0; i < 3; i++) b[i].kl = (float)scale * k1[i], b[i].same_top = 1;
    b[1].copy = 1;
    kvd_results_add_tokens(r, mode, 512, 0, h0, a, 5);
    kvd_results_add_tokens(r, mode, 512, 1, 77, b, 3);
}

/* Between two ranks far apart the step is taken in double: 33554432 - 3
 * is not a float (the floats there are 4 apart), and a float difference
 * would put the median at 16777217 */
static void percentile_steps_in_double(void **st) {
    (void)st;
    const float v[2] = {3.0f, 33554432.0f};
    assert_true(kvd_percentile_sorted(v, 2, 0.5) == 16777217.5);
    assert_true(kvd_percentile_sorted(v, 2, 0.25) == 3.0 + 0.25 * 33554429.0);
    assert_true(kvd_percentile_sorted(v, 2, 1.0) == 33554432.0);
    assert_true(isnan(kvd_percentile_sorted(v, 0, 0.5)));
}

static void percentiles_over_positions(void **st) {
    (void)st;
    kvd_results r;
    kvd_results_init(&r);
    two_traces(&r, "fp8-cal", 5, 1);
    row(&r, "fp8-cal", 0, "kl_p90", 4.6, 5);
    row(&r, "fp8-cal", 1, "kl_p90", 11.8, 3);
    row(&r, "fp8-cal", 0, "kl_median", 3, 5);
    row(&r, "fp8-cal", 1, "kl_median", 11, 3);
    /* sorted 1 2 3 4 5 10 11 12: rank 0.9 * 7 = 6.3 lies between 11 and 12 */
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_p90"), 11.3, 1e-15);
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "all", "kl_median"), 4.5, 1e-15);
    /* the copy subset: KL 2, 4 and 10; rank 0.9 * 2 = 1.8 */
    row(&r, "fp8-cal", 0, "kl_p90", 3.8, 2);
    row(&r, "fp8-cal", 1, "kl_p90", 10, 1);
    for (int k = 0; k < 2; k++) {
        kvd_row_summary *x =
            (kvd_row_summary *)r.t[KVD_T_SUMMARY].rows + r.t[KVD_T_SUMMARY].n - 1 - k;
        snprintf(x->subset, sizeof x->subset, "copy");
    }
    close_to(kvd_results_summary(&r, "fp8-cal", 512, "copy", "kl_p90"), 4 + 0.8 * 6, 1e-15);
    /* positions that do not add up to the summary's n: the n-weighted mean */
    row(&r, "fp8-e5m2", 0, "kl_p90", 1, 100);
    row(&r, "fp8-e5m2", 1, "kl_p90", 3, 300);
    two_traces(&r, "fp8-e5m2", 5, 1);
    close_to(kvd_results_summary(&r, "fp8-e5m2", 512, "all", "kl_p90"), 2.5, 1e-15);
    kvd_results_free(&r);
}

static void paired_differences(void **st) {
    (void)st;
    kvd_results a, b;
    kvd_results_init(&a);
    kvd_results_init(&b);
    two_traces(&a, "fp8-cal", 5, 1);
    two_traces(&a, "fp8-unscaled", 5, 3);
    two_traces(&b, "fp8-cal", 5, 2);
    kvd_paired p;
    /* within one run: 3x against 1x, differences 2 * KL: 2 4 6 8 10 24 20 22 */
    assert_int_equal(
        kvd_results_paired(&a, "fp8-cal", &a, "fp8-unscaled", 512, "all", "kl", -1, &p), 1);
    const double d[8] = {2, 4, 6, 8, 10, 24, 20, 22};
    double m = 0, v = 0;
    for (int i = 0; i < 8; i++) m += d[i] / 8;
    for (int i = 0; i < 8; i++) v += (d[i] - m) * (d[i] - m) / 7;
    assert_true(p.n == 8);
    close_to(p.mean, m, 1e-15);
    close_to(p.se, sqrt(v / 8), 1e-14);
    /* across runs, one bucket (positions 2 and 3: trace 0's 3 and 4, trace 1's
     * 11) and the copy subset (2 and 4 of trace 0, 10 of trace 1) */
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 512, "all", "kl", 1, &p), 1);
    assert_true(p.n == 3);
    close_to(p.mean, 6, 1e-15);
    close_to(p.se, sqrt(((3 - 6.) * (3 - 6.) + (4 - 6.) * (4 - 6.) + 25) / 2 / 3), 1e-14);
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 512, "copy", "kl", -1, &p),
                     1);
    assert_true(p.n == 3);
    close_to(p.mean, 16. / 3, 1e-15);
    /* agreement: equal on both sides, so no difference and no error */
    assert_int_equal(
        kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 512, "all", "top1_agree", -1, &p), 1);
    assert_true(p.mean == 0 && p.se == 0);
    assert_int_equal(
        kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 512, "all", "delta_nll", -1, &p), 1);
    close_to(p.mean, (-0.25 + 0.5 - 0.25 + 0.5 - 0.25) / 8, 1e-15);
    /* what does not pair: another trace's tokens, a trace one side lacks,
     * another context, an unknown figure */
    kvd_results c;
    kvd_results_init(&c);
    two_traces(&c, "fp8-cal", 6, 2);
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &c, "fp8-cal", 512, "all", "kl", -1, &p), 0);
    assert_true(p.n == 0 && isnan(p.mean));
    kvd_row_token t[5] = {{0}};
    kvd_results_add_tokens(&c, "fp8-e5m2", 512, 0, 5, t, 5);
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &c, "fp8-e5m2", 512, "all", "kl", -1, &p),
                     0);
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 1024, "all", "kl", -1, &p),
                     0);
    assert_int_equal(kvd_results_paired(&a, "fp8-cal", &b, "fp8-cal", 512, "all", "rel_l2", -1, &p),
                     0);
    kvd_results_free(&a);
    kvd_results_free(&b);
    kvd_results_free(&c);
}

/* The error of the difference of two runs' KL quantiles over the same
 * positions: each side's order-statistic error, less what they share */
static void paired_percentile_errors(void **st) {
    (void)st;
    const double z2 = 3.919927969080108; /* 2 x 1.96 */
    kvd_results a, b, d, c;
    kvd_results_init(&a);
    kvd_results_init(&b);
    kvd_results_init(&d);
    kvd_results_init(&c);
    two_traces(&a, "fp8-cal", 5, 1); /* sorted 1 2 3 4 5 10 11 12: median rank 1..7, 2..12 */
    two_traces(&b, "fp8-cal", 5, 2); /* twice each: the same order, 4..24 */
    /* the same order at every position: the shares below each median move
     * together (correlation 1), and the error is the errors' difference */
    close_to(kvd_results_percentile_paired_se(&a, "fp8-cal", &b, "fp8-cal", 512, "all", 0.5),
             (24. - 4 - (12 - 2)) / z2, 1e-14);
    /* another order: KL 4 1 2 30 3 | 12 10 11, sorted 1 2 3 4 10 11 12 30,
     * median 7. At or below the medians: positions 0-3 (a), 0 1 2 4 (d);
     * both 0-2: correlation (3/8 - 1/4) / (1/4) = 1/2 */
    two_traces(&d, "fp8-cal", 5, 1);
    const float kd[8] = {4, 1, 2, 30, 3, 12, 10, 11};
    kvd_row_token *t = (kvd_row_token *)d.t[KVD_T_TOKEN].rows;
    for (int i = 0; i < 8; i++) t[i].kl = kd[i];
    const double sa = 10 / z2, sd = 28 / z2;
    close_to(kvd_results_percentile_paired_se(&a, "fp8-cal", &d, "fp8-cal", 512, "all", 0.5),
             sqrt(sa * sa + sd * sd - sa * sd), 1e-14);
    close_to(kvd_results_percentile_paired_se(&d, "fp8-cal", &a, "fp8-cal", 512, "all", 0.5),
             sqrt(sa * sa + sd * sd - sa * sd), 1e-14);
    /* the same run against itself: no error */
    assert_true(kvd_results_percentile_paired_se(&a, "fp8-cal", &a, "fp8-cal", 512, "all", 0.5) ==
                0);
    /* none where a side has no order-statistic error, or the runs do not pair */
    assert_true(
        isnan(kvd_results_percentile_paired_se(&a, "fp8-cal", &b, "fp8-cal", 512, "all", 0.9)));
    two_traces(&c, "fp8-cal", 6, 2);
    assert_true(
        isnan(kvd_results_percentile_paired_se(&a, "fp8-cal", &c, "fp8-cal", 512, "all", 0.5)));
    assert_true(
        isnan(kvd_results_percentile_paired_se(&a, "fp8-cal", &b, "fp8-cal", 1024, "all", 0.5)));
    kvd_results_free(&a);
    kvd_results_free(&b);
    kvd_results_free(&d);
    kvd_results_free(&c);
}

/* one run's own positions: the mean and its error; a percentile's error
 * from the order statistics around it */
static void position_errors(void **st) {
    (void)st;
    kvd_results r;
    kvd_results_init(&r);
    two_traces(&r, "fp8-cal", 5, 1);
    kvd_paired p;
    const double v[8] = {1, 2, 3, 4, 5, 12, 10, 11};
    double m = 0, var = 0;
    for (int i = 0; i < 8; i++) m += v[i] / 8;
    for (int i = 0; i < 8; i++) var += (v[i] - m) * (v[i] - m) / 7;
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "kl", -1, &p), 1);
    assert_true(p.n == 8);
    close_to(p.mean, m, 1e-15);
    close_to(p.se, sqrt(var / 8), 1e-14);
    /* delta p squared: every delta p here is 0 */
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "delta_p_sq", -1, &p), 1);
    assert_true(p.mean == 0 && p.se == 0);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "copy", "kl", 1, &p), 1);
    assert_true(p.n == 1 && p.mean == 4 && isnan(p.se)); /* position 3 of trace 0 */
    assert_int_equal(kvd_results_positions(&r, "fp8-e5m2", 512, "all", "kl", -1, &p), 0);
    /* attention, sampled at some positions only (NaN elsewhere): those count */
    kvd_row_token *t = (kvd_row_token *)r.t[KVD_T_TOKEN].rows;
    for (int i = 0; i < 8; i++) t[i].attn_propagated = i % 4 ? NAN : (float)(i + 1);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "attn_propagated", -1, &p),
                     1);
    assert_true(p.n == 2 && p.mean == 3); /* rows 0 and 4: 1 and 5 */
    close_to(p.se, sqrt(8. / 2), 1e-15);
    /* router flips: positions routed at some layer (KL 2 and 11) and the
     * rest; a version 2 file keeps none */
    t[1].router_flips = 3, t[7].router_flips = 1;
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "routed", "kl", -1, &p), 1);
    assert_true(p.n == 2 && p.mean == 6.5);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "unrouted", "kl", -1, &p), 1);
    assert_true(p.n == 6 && p.mean == (1 + 3 + 4 + 5 + 12 + 10) / 6.);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "router_flips", -1, &p), 1);
    assert_true(p.n == 8 && p.mean == 0.5);
    r.schema_version = 2;
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "routed", "kl", -1, &p), 0);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "router_flips", -1, &p), 0);
    assert_int_equal(kvd_results_positions(&r, "fp8-cal", 512, "all", "kl", -1, &p), 1);
    r.schema_version = KVD_SCHEMA_VERSION;
    /* sorted 1 2 3 4 5 10 11 12; the median: ranks 4 -/+ 1.96 sqrt(2), 1 and 7 */
    close_to(kvd_results_percentile_se(&r, "fp8-cal", 512, "all", 0.5),
             (12. - 2) / 3.919927969080108, 1e-15);
    /* the 90th: rank 7.2 + 1.66 runs past the largest */
    assert_true(isnan(kvd_results_percentile_se(&r, "fp8-cal", 512, "all", 0.9)));
    assert_true(isnan(kvd_results_percentile_se(&r, "fp8-cal", 512, "all", 1.0)));
    assert_true(isnan(kvd_results_percentile_se(&r, "fp8-e5m2", 512, "all", 0.5)));
    kvd_results_free(&r);
}

/* The positions through a file and back; a version 1 file (no positions)
 * reads with none; a version 5 one, or positions past the table, do not */
/* a fresh empty file at path (a mkstemp template) */
static void temp_file(char *path) {
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

static void positions_on_file(void **st) {
    (void)st;
    char path[] = "/tmp/kvd_test_results_XXXXXX";
    temp_file(path);
    char err[KVD_ERR_LEN];
    kvd_results r, back;
    kvd_results_init(&r);
    two_traces(&r, "fp8-cal", 5, 1);
    row(&r, "fp8-cal", 0, "kl_p90", 4.6, 5);
    row(&r, "fp8-cal", 1, "kl_p90", 11.8, 3);
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), 0);
    assert_int_equal(back.schema_version, KVD_SCHEMA_VERSION);
    assert_true(back.t[KVD_T_TOKEN].n == 8 && back.t[KVD_T_TOKSET].n == 2);
    assert_memory_equal(back.t[KVD_T_TOKEN].rows, r.t[KVD_T_TOKEN].rows, 8 * sizeof(kvd_row_token));
    assert_memory_equal(back.t[KVD_T_TOKSET].rows, r.t[KVD_T_TOKSET].rows,
                        2 * sizeof(kvd_row_tokset));
    close_to(kvd_results_summary(&back, "fp8-cal", 512, "all", "kl_p90"), 11.3, 1e-15);
    kvd_results_free(&back);

    /* version 1: the tables gone, the attribute 1 */
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(f >= 0);
    H5Ldelete(f, "/drift/token_sets", H5P_DEFAULT);
    H5Ldelete(f, "/drift/tokens", H5P_DEFAULT);
    int one = 1;
    H5LTset_attribute_int(f, "/", "schema_version", &one, 1);
    H5Fclose(f);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), 0);
    assert_int_equal(back.schema_version, 1);
    assert_true(back.t[KVD_T_TOKEN].n == 0 && back.t[KVD_T_TOKSET].n == 0);
    close_to(kvd_results_summary(&back, "fp8-cal", 512, "all", "kl_p90"), (5 * 4.6 + 3 * 11.8) / 8,
             1e-15);
    kvd_results_free(&back);
    /* version 2 without its tables, and a newer version: refused, named */
    const struct {
        int version;
        const char *msg;
    } bad[] = {{2, "dataset /drift/token_sets: missing (expected in schema version 2)"},
               {KVD_SCHEMA_VERSION + 1, "attribute schema_version: expected 1 to 4, got 5"}};
    for (int i = 0; i < 2; i++) {
        f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        H5LTset_attribute_int(f, "/", "schema_version", &bad[i].version, 1);
        H5Fclose(f);
        kvd_results_init(&back);
        assert_int_equal(kvd_results_load(&back, path, err), -1);
        assert_non_null(strstr(err, bad[i].msg));
        kvd_results_free(&back);
    }
    /* a cell whose positions run past /drift/tokens */
    kvd_row_tokset *x = (kvd_row_tokset *)r.t[KVD_T_TOKSET].rows;
    x[1].n = 4;
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), -1);
    assert_non_null(strstr(err, "dataset /drift/token_sets row 1: first 5 and n 4, expected rows "
                                "within the 8 of /drift/tokens"));
    kvd_results_free(&back);
    /* ... or one whose end would overflow */
    x[1].first = INT64_MAX - 2;
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), -1);
    assert_non_null(
        strstr(err, "dataset /drift/token_sets row 1: first 9223372036854775805 and n 4"));
    kvd_results_free(&back);
    kvd_results_free(&r);
    unlink(path);
}

/* /failures through a file and back; a cell's row forgotten (it finished,
 * or failed again) leaves the others in order; a version 3 file (before
 * the table) reads with none, a version 4 one without it is refused. */
static void failures_on_file(void **st) {
    (void)st;
    char path[] = "/tmp/kvd_test_results_XXXXXX";
    temp_file(path);
    char err[KVD_ERR_LEN];
    kvd_results r, back;
    kvd_results_init(&r);
    const char *cells[3] = {"drift_fp8-unscaled_c1_ctx256_t0", "tput_fp8-unscaled_c1_ctx256",
                            "tput_fp8-unscaled_c2_ctx256"};
    for (int i = 0; i < 3; i++) {
        kvd_row_failure *x = kvd_results_add(&r, KVD_T_FAIL);
        snprintf(x->cell, sizeof x->cell, "%s", cells[i]);
        snprintf(x->kind, sizeof x->kind, "%s", i ? "throughput" : "drift");
        snprintf(x->mode, sizeof x->mode, "fp8-unscaled");
        x->concurrency = i ? i : 1;
        x->context = 256;
        x->trace = i ? -1 : 0;
        snprintf(x->failed_utc, sizeof x->failed_utc, "2026-12-07T06:00:0%dZ", i);
        memset(x->message, 'm', sizeof x->message - 1); /* the longest message */
        x->message[0] = (char)('a' + i);
    }
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), 0);
    assert_int_equal(back.t[KVD_T_FAIL].n, 3);
    assert_memory_equal(back.t[KVD_T_FAIL].rows, r.t[KVD_T_FAIL].rows, 3 * sizeof(kvd_row_failure));
    assert_null(kvd_results_failure(&back, "drift_bf16_c1_ctx256_t0"));
    kvd_results_forget_failure(&back, cells[1]);
    assert_int_equal(back.t[KVD_T_FAIL].n, 2);
    assert_null(kvd_results_failure(&back, cells[1]));
    assert_int_equal(kvd_results_failure(&back, cells[0])->message[0], 'a');
    assert_int_equal(kvd_results_failure(&back, cells[2])->message[0], 'c');
    assert_ptr_equal(kvd_results_failure(&back, cells[2]),
                     (const kvd_row_failure *)back.t[KVD_T_FAIL].rows + 1);
    kvd_results_free(&back);
    /* version 4 without the table: refused, named; version 3: none */
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(f >= 0);
    H5Ldelete(f, "/failures", H5P_DEFAULT);
    H5Fclose(f);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), -1);
    assert_non_null(strstr(err, "dataset /failures: missing (expected in schema version 4)"));
    kvd_results_free(&back);
    f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    int three = 3;
    H5LTset_attribute_int(f, "/", "schema_version", &three, 1);
    H5Fclose(f);
    kvd_results_init(&back);
    assert_int_equal(kvd_results_load(&back, path, err), 0);
    assert_int_equal(back.schema_version, 3);
    assert_int_equal(back.t[KVD_T_FAIL].n, 0);
    kvd_results_free(&back);
    kvd_results_free(&r);
    unlink(path);
}

static void add_failure(kvd_results *r, const char *cell, const char *kind, const char *mode, int c,
                        int trace, const char *msg) {
    kvd_row_failure *x = kvd_results_add(r, KVD_T_FAIL);
    snprintf(x->cell, sizeof x->cell, "%s", cell);
    snprintf(x->kind, sizeof x->kind, "%s", kind);
    snprintf(x->mode, sizeof x->mode, "%s", mode);
    x->concurrency = c, x->context = 256, x->trace = trace;
    snprintf(x->message, sizeof x->message, "%s", msg);
}

/* The lines report, compare and trend give of /failures: one a mode and
 * message, its cells in the table's order; past KVD_FAIL_MAX - 1 lines,
 * the last counts the cells left. */
static void failure_lines(void **st) {
    (void)st;
    kvd_run run;
    memset(&run, 0, sizeof run);
    kvd_results_init(&run.r);
    add_failure(&run.r, "drift_fp8-unscaled_c1_ctx256_t0", "drift", "fp8-unscaled", 1, 0, "NaN A");
    add_failure(&run.r, "drift_fp8-cal_c1_ctx256_t0", "drift", "fp8-cal", 1, 0, "NaN B");
    add_failure(&run.r, "tput_fp8-unscaled_c2_ctx256", "throughput", "fp8-unscaled", 2, -1,
                "NaN A");
    add_failure(&run.r, "tput_fp8-unscaled_c4_ctx256", "throughput", "fp8-unscaled", 4, -1,
                "NaN C");
    char(*s)[KVD_FAIL_LEN] = malloc(sizeof(char[KVD_FAIL_MAX][KVD_FAIL_LEN]));
    assert_int_equal(kvd_run_failures(&run, s), 3);
    assert_string_equal(s[0], "fp8-unscaled: drift at 256 tokens (trace 0); throughput at 256 "
                              "tokens, concurrency 2: NaN A");
    assert_string_equal(s[1], "fp8-cal: drift at 256 tokens (trace 0): NaN B");
    assert_string_equal(s[2], "fp8-unscaled: throughput at 256 tokens, concurrency 4: NaN C");
    /* as many more messages as make the lines overflow, and one more cell
     * of a line there already */
    for (int i = 0; i < KVD_FAIL_MAX; i++) {
        char msg[32];
        snprintf(msg, sizeof msg, "message %d", i);
        add_failure(&run.r, "drift_int8-token_c1_ctx256_t0", "drift", "int8-token", 1, i, msg);
    }
    add_failure(&run.r, "drift_fp8-cal_c1_ctx256_t9", "drift", "fp8-cal", 1, 9, "NaN B");
    assert_int_equal(kvd_run_failures(&run, s), KVD_FAIL_MAX);
    assert_string_equal(s[1], "fp8-cal: drift at 256 tokens (trace 0); drift at 256 tokens "
                              "(trace 9): NaN B");
    assert_string_equal(s[KVD_FAIL_MAX - 2],
                        "int8-token: drift at 256 tokens (trace 7): message 7");
    assert_string_equal(s[KVD_FAIL_MAX - 1], "and 4 cells more");
    free(s);
    kvd_results_free(&run.r);
}

/* A file read light, then its positions one context at a time (as `trend`
 * reads a series): the sets of another context left out, the kept ones'
 * positions moved together in order, the pooled percentile and the pairing
 * as a whole load gives them; dropped, neither; a bad set still refused. */
static void positions_by_context(void **st) {
    (void)st;
    char path[] = "/tmp/kvd_test_results_XXXXXX";
    temp_file(path);
    char err[KVD_ERR_LEN];
    kvd_results r, whole, light;
    kvd_results_init(&r);
    /* context 256 between and after the 512 ones, so that keeping 512
     * moves rows */
    kvd_row_token other[4];
    memset(other, 0, sizeof other);
    for (int i = 0; i < 4; i++) other[i].kl = 100.0f + (float)i;
    kvd_results_add_tokens(&r, "fp8-cal", 256, 0, 9, other, 4);
    two_traces(&r, "fp8-cal", 5, 1);
    kvd_results_add_tokens(&r, "fp8-cal", 256, 1, 10, other, 2);
    row(&r, "fp8-cal", 0, "kl_p90", 4.6, 5);
    row(&r, "fp8-cal", 1, "kl_p90", 11.8, 3);
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    kvd_results_init(&whole);
    kvd_results_init(&light);
    assert_int_equal(kvd_results_load(&whole, path, err), 0);
    assert_int_equal(kvd_results_load_light(&light, path, err), 0);
    assert_true(light.t[KVD_T_TOKEN].n == 0 && light.t[KVD_T_TOKSET].n == 0);
    assert_true(light.t[KVD_T_SUMMARY].n == whole.t[KVD_T_SUMMARY].n);
    assert_false(kvd_results_pair(&light, "fp8-cal", &whole, "fp8-cal", 512));
    close_to(kvd_results_summary(&light, "fp8-cal", 512, "all", "kl_p90"), (5 * 4.6 + 3 * 11.8) / 8,
             1e-15);
    assert_int_equal(kvd_results_load_positions(&light, path, 512, err), 0);
    assert_true(light.t[KVD_T_TOKEN].n == 8 && light.t[KVD_T_TOKSET].n == 2);
    const kvd_row_tokset *ts = (const kvd_row_tokset *)light.t[KVD_T_TOKSET].rows;
    assert_true(ts[0].context == 512 && ts[0].first == 0 && ts[0].n == 5);
    assert_true(ts[1].context == 512 && ts[1].first == 5 && ts[1].n == 3);
    const kvd_row_token *tk = (const kvd_row_token *)light.t[KVD_T_TOKEN].rows;
    const float want[8] = {1, 2, 3, 4, 5, 12, 10, 11};
    for (int i = 0; i < 8; i++) assert_true(tk[i].kl == want[i]);
    close_to(kvd_results_summary(&light, "fp8-cal", 512, "all", "kl_p90"), 11.3, 1e-15);
    assert_true(kvd_results_pair(&light, "fp8-cal", &whole, "fp8-cal", 512));
    kvd_paired pd;
    assert_int_equal(
        kvd_results_paired(&light, "fp8-cal", &whole, "fp8-cal", 512, "all", "kl", -1, &pd), 1);
    assert_true(pd.n == 8 && pd.mean == 0);
    /* the other context alone: its two sets, six positions */
    assert_int_equal(kvd_results_load_positions(&light, path, 256, err), 0);
    assert_true(light.t[KVD_T_TOKEN].n == 6 && light.t[KVD_T_TOKSET].n == 2);
    assert_false(kvd_results_pair(&light, "fp8-cal", &whole, "fp8-cal", 512));
    kvd_results_drop_positions(&light);
    assert_true(light.t[KVD_T_TOKEN].n == 0 && light.t[KVD_T_TOKSET].n == 0);
    close_to(kvd_results_summary(&light, "fp8-cal", 512, "all", "kl_p90"), (5 * 4.6 + 3 * 11.8) / 8,
             1e-15);
    /* a set running past /drift/tokens: refused as a whole load refuses it */
    kvd_row_tokset *x = (kvd_row_tokset *)r.t[KVD_T_TOKSET].rows;
    x[2].n = 9;
    assert_int_equal(kvd_results_save(&r, path, err), 0);
    assert_int_equal(kvd_results_load_positions(&light, path, 512, err), -1);
    assert_non_null(strstr(err, "dataset /drift/token_sets row 2: first 9 and n 9"));
    assert_true(light.t[KVD_T_TOKEN].n == 0 && light.t[KVD_T_TOKSET].n == 0);
    kvd_results_free(&light);
    kvd_results_free(&whole);
    kvd_results_free(&r);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(positions_by_context),
        cmocka_unit_test(pooled_figures),
        cmocka_unit_test(one_trace_exact),
        cmocka_unit_test(token_hash),
        cmocka_unit_test(percentile_steps_in_double),
        cmocka_unit_test(percentiles_over_positions),
        cmocka_unit_test(paired_differences),
        cmocka_unit_test(paired_percentile_errors),
        cmocka_unit_test(position_errors),
        cmocka_unit_test(positions_on_file),
        cmocka_unit_test(failures_on_file),
        cmocka_unit_test(failure_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
