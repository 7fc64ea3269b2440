/* kvdrift: trace tests: determinism, exact lengths, labels that hold,
 * reuse distances that follow the spec, file round trips, and refusals of
 * bad input (zero length, truncated files, bad CSV ids). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../datasets/trace.h"
#include "../../runners/config.h"

static void gen(kvd_trace *t, int64_t n, uint64_t seed) {
    kvd_trace_spec s;
    char err[KVD_ERR_LEN];
    kvd_trace_spec_defaults(&s);
    s.length = n;
    s.seed = seed;
    assert_int_equal(kvd_trace_generate(&s, t, err), 0);
}

static void determinism_and_lengths(void **st) {
    (void)st;
    int64_t lens[] = {1024, 5000, 65537, 300001};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        kvd_trace a, b, c;
        gen(&a, lens[i], 7);
        gen(&b, lens[i], 7);
        gen(&c, lens[i], 8);
        assert_int_equal(a.n, lens[i]);
        assert_memory_equal(a.tokens, b.tokens, sizeof(uint32_t) * (size_t)a.n);
        assert_int_equal(a.n_refs, b.n_refs);
        /* another seed, another trace after the shared (fixed) system prompt */
        int64_t sys = lens[i] / 8 < 2048 ? lens[i] / 8 : 2048;
        assert_memory_equal(a.tokens, c.tokens, sizeof(uint32_t) * (size_t)sys);
        assert_true(memcmp(a.tokens + sys, c.tokens + sys, sizeof(uint32_t) * (size_t)(a.n - sys)));
        /* segments tile the trace exactly */
        int64_t at = 0;
        for (int64_t s = 0; s < a.n_segs; s++) {
            assert_int_equal(a.segs[s].start, at);
            assert_true(a.segs[s].length > 0);
            at += a.segs[s].length;
        }
        assert_int_equal(at, a.n);
        /* every reference points back to the same token, in order */
        for (int64_t r = 0; r < a.n_refs; r++) {
            assert_true(a.refs[r].src >= 0 && a.refs[r].src < a.refs[r].pos);
            assert_int_equal(a.tokens[a.refs[r].src], a.tokens[a.refs[r].pos]);
            if (r) assert_true(a.refs[r].pos > a.refs[r - 1].pos);
        }
        for (int64_t j = 0; j < a.n; j++) assert_true(a.tokens[j] < 248320u);
        assert_int_equal(a.tokens[0], 0); /* the sink token opens every trace */
        kvd_trace_free(&a);
        kvd_trace_free(&b);
        kvd_trace_free(&c);
    }
}

/* The spec: each copy's distance is log-uniform on [reuse_min, min(reuse_max,
 * pos)]. Rebuild the copies from the references (runs of equal distance) and
 * compare the observed log2-bucket histogram with the one the spec predicts
 * for those same copies. */
static void reuse_follows_spec(void **st) {
    (void)st;
    kvd_trace t;
    gen(&t, 1 << 20, 11);
    double expect[64] = {0};
    int64_t hist[64];
    kvd_trace_reuse_hist(&t, hist);
    double lo = log(16.0);
    for (int64_t r = 0; r < t.n_refs;) {
        int64_t d = t.refs[r].pos - t.refs[r].src, s = r;
        while (r < t.n_refs && t.refs[r].pos - t.refs[r].src == d &&
               t.refs[r].pos == t.refs[s].pos + (r - s))
            r++;
        double cap = (double)(t.refs[s].pos < 262144 ? t.refs[s].pos : 262144);
        double hi = log(cap + 1.0), len = (double)(r - s);
        for (int b = 4; b < 19; b++) {
            double a = fmax(log(exp2(b)), lo), z = fmin(log(exp2(b + 1)), hi);
            if (z > a) expect[b] += len * (z - a) / (hi - lo);
        }
    }
    double total = (double)t.n_refs;
    for (int b = 4; b < 18; b++) {
        double e = expect[b] / total, o = hist[b] / total;
        /* runs of one copy share a distance, so counts are clumped: 10%
         * relative per bucket is ~5 sigma at 1M tokens */
        assert_true(fabs(o - e) <= 0.1 * e);
    }
    assert_true(hist[17] > 0); /* distances beyond 131072 occur */
    assert_int_equal(hist[0] + hist[1] + hist[2] + hist[3], 0);
    kvd_trace_free(&t);
}

static void file_round_trip_and_truncation(void **st) {
    (void)st;
    kvd_trace set[2];
    gen(&set[0], 4096, 1);
    gen(&set[1], 9000, 2);
    char path[] = "/tmp/kvd_trace_XXXXXX", err[KVD_ERR_LEN];
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(kvd_trace_save(path, set, 2, err), 0);
    kvd_trace *back;
    int n;
    assert_int_equal(kvd_trace_load(path, &back, &n, err), 0);
    assert_int_equal(n, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(back[i].n, set[i].n);
        assert_memory_equal(back[i].tokens, set[i].tokens, sizeof(uint32_t) * (size_t)set[i].n);
        assert_int_equal(back[i].n_segs, set[i].n_segs);
        assert_memory_equal(back[i].segs, set[i].segs, sizeof(kvd_segment) * (size_t)set[i].n_segs);
        assert_int_equal(back[i].n_refs, set[i].n_refs);
        assert_memory_equal(back[i].refs, set[i].refs,
                            sizeof(kvd_reference) * (size_t)set[i].n_refs);
        assert_int_equal(back[i].spec.seed, set[i].spec.seed);
        assert_int_equal(back[i].spec.length, set[i].spec.length);
        assert_int_equal(back[i].spec.reuse_max, set[i].spec.reuse_max);
        kvd_trace_free(&back[i]);
        kvd_trace_free(&set[i]);
    }
    free(back);
    /* a truncated file is refused with its name */
    FILE *f = fopen(path, "r+b");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fclose(f);
    assert_int_equal(truncate(path, sz / 2), 0);
    assert_int_equal(kvd_trace_load(path, &back, &n, err), -1);
    assert_non_null(strstr(err, path));
    unlink(path);
    assert_int_equal(kvd_trace_load("/nonexistent.h5", &back, &n, err), -1);
    assert_non_null(strstr(err, "/nonexistent.h5: cannot open"));
}

static char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvd_imp_XXXXXX");
    int fd = mkstemp(path);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void imports(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_trace t;
    char *p = write_tmp("0 5 17\n  99\t3\n");
    assert_int_equal(kvd_trace_import_text(p, 100, &t, err), 0);
    assert_int_equal(t.n, 5);
    assert_int_equal(t.tokens[3], 99);
    kvd_trace_free(&t);
    assert_int_equal(kvd_trace_import_text(p, 50, &t, err), -1);
    assert_non_null(strstr(err, ":2: token id 99: expected < vocab size 50"));
    unlink(p);
    p = write_tmp("3 4\n5 five 6\n"); /* text has no columns to name */
    assert_int_equal(kvd_trace_import_text(p, 100, &t, err), -1);
    assert_non_null(strstr(err, ":2: expected a non-negative integer token id, got 'five'"));
    unlink(p);
    p = write_tmp("id,segment\n0,system\n4,system\n7,user\n8,file\n9,file\n");
    assert_int_equal(kvd_trace_import_csv(p, 100, &t, err), 0);
    assert_int_equal(t.n, 5);
    assert_int_equal(t.n_segs, 3);
    assert_int_equal(t.segs[2].kind, KVD_SEG_FILE);
    assert_int_equal(t.segs[2].length, 2);
    kvd_trace_free(&t);
    unlink(p);
    p = write_tmp("1\n2\nx7\n");
    assert_int_equal(kvd_trace_import_csv(p, 100, &t, err), -1);
    assert_non_null(
        strstr(err, ":3: column 'id': expected a non-negative integer token id, got 'x7'"));
    unlink(p);
    p = write_tmp("1,user\n2000,user\n");
    assert_int_equal(kvd_trace_import_csv(p, 1000, &t, err), -1);
    assert_non_null(strstr(err, ":2: token id 2000: expected < vocab size 1000"));
    unlink(p);
    p = write_tmp("1,user\n2,sofa\n");
    assert_int_equal(kvd_trace_import_csv(p, 1000, &t, err), -1);
    assert_non_null(strstr(err, ":2: column 'segment': unknown segment kind 'sofa'"));
    unlink(p);
}

/* Copy marks by hand: a copy continues only where both the position and
 * the source step by one; positions past n are left alone. */
static void copy_marks(void **st) {
    (void)st;
    kvd_reference refs[] = {{10, 3}, {11, 4}, {12, 9}, {13, 10}, {15, 11}, {16, 12}, {30, 1}};
    kvd_trace t;
    memset(&t, 0, sizeof t);
    t.refs = refs;
    t.n_refs = sizeof refs / sizeof refs[0];
    uint8_t copy[21] = {0}, start[21] = {0};
    kvd_trace_copy_marks(&t, 20, copy, start);
    for (int p = 0; p <= 20; p++) {
        const int is = p >= 10 && p <= 16 && p != 14;
        assert_int_equal(copy[p], is);
        /* 10 starts; 11 continues; 12 jumps source; 13 continues; 15 follows a gap */
        assert_int_equal(start[p], p == 10 || p == 12 || p == 15);
    }
}

static void refusals(void **st) {
    (void)st;
    kvd_trace_spec s;
    kvd_trace t;
    char err[KVD_ERR_LEN];
    kvd_trace_spec_defaults(&s);
    s.length = 0;
    assert_int_equal(kvd_trace_generate(&s, &t, err), -1);
    assert_non_null(strstr(err, "trace length: expected 1.."));
    s.length = -5;
    assert_int_equal(kvd_trace_generate(&s, &t, err), -1);
    assert_non_null(strstr(err, "got -5"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(determinism_and_lengths),
        cmocka_unit_test(reuse_follows_spec),
        cmocka_unit_test(file_round_trip_and_truncation),
        cmocka_unit_test(imports),
        cmocka_unit_test(copy_marks),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
