/* kvdrift: `report` (HTML / Markdown / CSV from one or more result files) and
 * `compare` (baseline against candidate with a thresholds CSV; exit 0 pass,
 * 1 regression, 2 usage or input error). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reports/report.h"
#include "../reports/trend.h"
#include "../runners/config.h"
#include "../runners/fileio.h"
#include "commands.h"
#include "util.h"

static void emit(const char *cmd, const char *out, const kvd_buf *b) {
    char err[KVD_ERR_LEN];
    if (!out) {
        fwrite(b->s, 1, b->n, stdout);
        return;
    }
    if (kvd_write_file_atomic(out, b->s, b->n, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
}

/* The output's format: --format, else the output file's extension (.md,
 * .csv; accepted: a NULL-terminated list), else html. */
static const char *format_of(const char *format, const char *out, const char *const *accepted) {
    if (format) return format;
    const char *dot = out ? strrchr(out, '.') : NULL;
    for (int i = 0; dot && accepted[i]; i++)
        if (!strcmp(dot + 1, accepted[i])) return accepted[i];
    return "html";
}

/* A CSV writer's output (it writes to a FILE) appended to b. */
typedef struct {
    char *mem;
    size_t len;
    FILE *f;
} memout;

static FILE *memout_open(memout *m) {
    m->mem = NULL, m->len = 0;
    return m->f = open_memstream(&m->mem, &m->len);
}

static void memout_close(memout *m, kvd_buf *b) {
    fclose(m->f);
    kvd_buf_puts(b, m->mem ? m->mem : "");
    free(m->mem);
}

/* What report and trend take: result files (min to max of them), -o FILE
 * and --format html|md|csv (by default the output's extension, else html,
 * which needs -o); --help prints help and exits 0. The runs come back
 * loaded. */
typedef struct {
    const char *out, *format;
    kvd_run *runs;
    int n;
} runs_args;

static runs_args runs_args_parse(const char *cmd, int argc, char **argv, int min, int max,
                                 int positions, const char *help) {
    runs_args ra = {NULL, NULL, NULL, 0};
    char **files = calloc((size_t)max, sizeof *files);
    const char *f;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            ra.out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--format")) {
            ra.format = kvd_args_value(&a, f);
            if (strcmp(ra.format, "html") && strcmp(ra.format, "md") && strcmp(ra.format, "csv"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--format: expected html, md or csv, got '%s'",
                        ra.format);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fputs(help, stdout);
            exit(0);
        } else if (f[0] == '-') {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        } else if (ra.n < max) {
            files[ra.n++] = (char *)f;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "expected at most %d result files", max);
        }
    }
    if (ra.n < min)
        kvd_die(KVD_EXIT_USAGE, cmd, "expected %s result files, got %d",
                min == 1 ? "one or more" : "two or more", ra.n);
    static const char *const kinds[] = {"md", "csv", NULL};
    ra.format = format_of(ra.format, ra.out, kinds);
    if (!strcmp(ra.format, "html") && !ra.out)
        kvd_die(KVD_EXIT_USAGE, cmd, "--format html: expected -o FILE");
    char err[KVD_ERR_LEN];
    if (ra.out && kvd_output_check(ra.out, err)) kvd_die(KVD_EXIT_USAGE, cmd, "-o: %s", err);
    ra.runs = calloc((size_t)ra.n, sizeof *ra.runs);
    if (kvd_runs_load(ra.runs, ra.n, files, positions, err))
        kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    free(files);
    return ra;
}

/* The rendered output to -o (or stdout), and the runs freed. */
static void runs_args_finish(const char *cmd, runs_args *ra, kvd_buf *b) {
    emit(cmd, ra->out, b);
    if (ra->out) fprintf(stderr, "kvdrift %s: wrote %s (%zu bytes)\n", cmd, ra->out, b->n);
    kvd_buf_free(b);
    kvd_runs_free(ra->runs, ra->n);
    free(ra->runs);
}

int kvd_cmd_report(int argc, char **argv) {
    const char *cmd = "report";
    runs_args ra = runs_args_parse(
        cmd, argc, argv, 1, KVD_REPORT_MAX_RUNS, 1,
        "usage: kvdrift report RUN.h5 [MORE.h5 ...] [--format html|md|csv] [-o FILE]\n"
        "One self-contained HTML file (inline SVG charts, no scripts), a Markdown\n"
        "summary for a CI log or pull request, or the figures as CSV. Several files\n"
        "render side by side. Without -o the output goes to stdout (html needs -o).\n");
    kvd_buf b = {0};
    if (!strcmp(ra.format, "html")) {
        kvd_report_html(&b, ra.runs, ra.n);
    } else if (!strcmp(ra.format, "md")) {
        kvd_report_md(&b, ra.runs, ra.n);
    } else {
        memout m;
        kvd_report_csv(memout_open(&m), ra.runs, ra.n);
        memout_close(&m, &b);
    }
    runs_args_finish(cmd, &ra, &b);
    return 0;
}

int kvd_cmd_trend(int argc, char **argv) {
    const char *cmd = "trend";
    char help[1024];
    snprintf(help, sizeof help,
             "usage: kvdrift trend RUN.h5 RUN.h5 [MORE.h5 ...] [--format html|md|csv] [-o FILE]\n"
             "A series of runs of one sweep (nightly results), oldest first by the time each "
             "file was\nwritten: each FP8 mode's mean output KL, 99th percentile, top-1 "
             "agreement and decode\nspeed against bf16 run by run, how many standard errors "
             "each run moved from the one\nbefore (paired where they ran the same traces), and "
             "where the runs' settings change.\nAt the largest context every run has; up to %d "
             "files.\n",
             KVD_TREND_MAX_RUNS);
    /* light: each run's positions are read in turn as the trend is built,
     * so that a year of nightly files need not fit in memory at once */
    runs_args ra = runs_args_parse(cmd, argc, argv, 2, KVD_TREND_MAX_RUNS, 0, help);
    char err[KVD_ERR_LEN];
    long long ctx;
    if (kvd_trend_prepare(ra.runs, ra.n, &ctx, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    kvd_trend *t = kvd_trend_build(ra.runs, ra.n, ctx, err);
    if (!t) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    kvd_buf b = {0};
    if (!strcmp(ra.format, "html"))
        kvd_trend_html(&b, ra.runs, ra.n, t);
    else if (!strcmp(ra.format, "md"))
        kvd_trend_md(&b, ra.runs, ra.n, t);
    else {
        memout m;
        kvd_trend_csv(memout_open(&m), ra.runs, ra.n, t);
        memout_close(&m, &b);
    }
    kvd_trend_free(t);
    runs_args_finish(cmd, &ra, &b);
    return 0;
}

int kvd_cmd_compare(int argc, char **argv) {
    const char *cmd = "compare", *out = NULL, *format = NULL,
               *thr = KVD_SOURCE_DIR "/reports/thresholds.csv", *f;
    char *files[2];
    int nf = 0;
    double min_sigma = 0;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--thresholds")) {
            thr = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--min-sigma")) {
            min_sigma = kvd_args_double(&a, f, 0, 1e6);
        } else if (!strcmp(f, "--format")) {
            format = kvd_args_value(&a, f);
            if (strcmp(format, "html") && strcmp(format, "md"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--format: expected html or md, got '%s'", format);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf(
                "usage: kvdrift compare BASE.h5 CAND.h5 [--thresholds FILE.csv] [--min-sigma Z]\n"
                "                       [-o diff.html | -o diff.md] [--format html|md]\n"
                "The page: -o FILE, HTML, or Markdown for a pull request or CI log (by the\n"
                "file's extension .md, or --format md).\n"
                "Thresholds CSV columns: metric,mode,bucket,max_abs_increase,max_rel_increase\n"
                "(mode and bucket may be *). A figure regressed when it got worse by more than\n"
                "both allowances. Exit 0: no regression; 1: regression; 2: bad input.\n"
                "Default thresholds: %s\n"
                "  --min-sigma Z  a figure with a standard error (the drift figures but\n"
                "                 kl_max, kl_min, router_flip_rate; paired by position when\n"
                "                 both ran the same traces) regressed only when it also got\n"
                "                 worse by at least Z standard errors; less is noise,\n"
                "                 listed but passed. For runs over other traces, seeds or\n"
                "                 devices; default 0: the thresholds alone\n",
                KVD_SOURCE_DIR "/reports/thresholds.csv");
            return 0;
        } else if (f[0] == '-') {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        } else if (nf < 2) {
            files[nf++] = (char *)f;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "expected exactly two result files (baseline, candidate)");
        }
    }
    if (nf != 2) kvd_die(KVD_EXIT_USAGE, cmd, "expected two result files: BASE.h5 CAND.h5");
    if (format && !out) kvd_die(KVD_EXIT_USAGE, cmd, "--format %s: expected -o FILE", format);
    static const char *const kinds[] = {"md", NULL};
    format = format_of(format, out, kinds);
    char err[KVD_ERR_LEN];
    /* before the verdict is printed: a gate that says "pass" and then exits 2
     * because its page cannot be written reads as two answers */
    if (out && kvd_output_check(out, err)) kvd_die(KVD_EXIT_USAGE, cmd, "-o: %s", err);
    kvd_threshold *th;
    int nth;
    if (kvd_thresholds_load(thr, &th, &nth, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    kvd_run runs[2];
    if (kvd_runs_load(runs, 2, files, 1, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    kvd_check *checks;
    int n = kvd_compare(&runs[0], &runs[1], th, nth, min_sigma, &checks, err);
    if (n < 0) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    char diff[1024];
    kvd_run_differences(&runs[0], &runs[1], diff, sizeof diff);
    if (diff[0]) printf("note: the runs differ in %s\n", diff);
    printf("note: %s\n", kvd_runs_pairing_note(&runs[0], &runs[1]));
    kvd_print_failures(stdout, &runs[1], NULL, "note: cells the candidate did not finish: ");
    int breaches = 0, missing = 0, noise = 0;
    for (int i = 0; i < n; i++) {
        const kvd_check *c = &checks[i];
        if (!c->breach && !c->noise) continue;
        breaches += c->breach, noise += c->noise;
        char bk[24] = "";
        if (c->bucket >= 0) snprintf(bk, sizeof bk, " bucket %d", c->bucket);
        if (c->missing) {
            missing++;
            printf("REGRESSION %s %s context %lld%s: baseline %.6g, candidate %s\n", c->metric,
                   c->mode, c->context, bk, c->base,
                   isnan(c->cand) ? "none (absent, or NaN)" : "not finite");
            continue;
        }
        char z[96] = "";
        const char *pz = c->paired ? " (paired)" : "", *bz = c->z_bound ? "at most " : "";
        if (c->noise)
            snprintf(z, sizeof z, ", %s%.1f standard errors%s, under --min-sigma %g", bz, c->z, pz,
                     min_sigma);
        else if (isfinite(c->z))
            snprintf(z, sizeof z, ", %s%.1f standard errors%s", bz, c->z, pz);
        printf("%s %s %s context %lld%s: baseline %.6g, candidate %.6g (worse by %.3g, "
               "%.1f%%%s; allowed %.3g and %.0f%%)\n",
               c->noise ? "NOISE" : "REGRESSION", c->metric, c->mode, c->context, bk, c->base,
               c->cand, c->abs_inc, isfinite(c->rel_inc) ? 100 * c->rel_inc : INFINITY, z,
               c->max_abs, 100 * c->max_rel);
    }
    char miss[48] = "", nz[48] = "";
    if (missing) snprintf(miss, sizeof miss, " (%d missing in the candidate)", missing);
    if (noise) snprintf(nz, sizeof nz, ", %d within noise", noise);
    printf("compare: %d checks, %d regressions%s%s: %s\n", n, breaches, miss, nz,
           breaches ? "REGRESSION" : "pass");
    if (out) {
        kvd_buf b = {0};
        if (!strcmp(format, "md"))
            kvd_compare_md(&b, &runs[0], &runs[1], checks, n, min_sigma);
        else
            kvd_compare_html(&b, &runs[0], &runs[1], checks, n, min_sigma);
        emit(cmd, out, &b);
        kvd_buf_free(&b);
    }
    free(checks);
    free(th);
    kvd_runs_free(runs, 2);
    return breaches ? 1 : 0;
}
