/* kvdrift: the trend over a series of runs of one sweep (nightly results,
 * say), oldest first: each KV mode's verdict figures run by run, how far
 * each run moved from the one before in standard errors (paired over the
 * positions where the runs ran the same traces), and where the runs'
 * settings changed, so a slow creep that no single nightly comparison
 * flags shows, and so does the run that started it. */
#include "trend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/kvcache.h"
#include "svg.h"

/* a step past this many standard errors is outside the runs' noise (the
 * report's headline words differences the same way) */
#define TREND_MOVED_Z 2.0

static int by_time(const void *a, const void *b) {
    const kvd_run *x = a, *y = b;
    const int c = strcmp(x->r.written_utc, y->r.written_utc);
    return c ? c : strcmp(x->path, y->path);
}

int kvd_trend_prepare(kvd_run *runs, int n, long long *ctx, char *err) {
    if (n < 2) {
        snprintf(err, KVD_ERR_LEN, "expected two or more result files, got %d", n);
        return -1;
    }
    qsort(runs, (size_t)n, sizeof *runs, by_time);
    /* the largest context every run has */
    long long c0[64];
    const int n0 = kvd_run_contexts(&runs[0], c0, 64);
    *ctx = 0;
    for (int k = n0 - 1; k >= 0 && !*ctx; k--) {
        int all = 1;
        for (int i = 1; i < n && all; i++) {
            long long ci[64];
            const int ni = kvd_run_contexts(&runs[i], ci, 64);
            int has = 0;
            for (int j = 0; j < ni; j++) has |= ci[j] == c0[k];
            all = has;
        }
        if (all) *ctx = c0[k];
    }
    if (!*ctx) {
        /* each file's contexts, the first few */
        int len = snprintf(err, KVD_ERR_LEN,
                           "expected a context every run has (a trend follows one sweep):");
        for (int i = 0; i < n && i < 4 && len > 0 && len < KVD_ERR_LEN; i++) {
            long long ci[64];
            const int ni = kvd_run_contexts(&runs[i], ci, 64);
            len += snprintf(err + len, KVD_ERR_LEN - (size_t)len, "%s %s has", i ? ";" : "",
                            runs[i].path);
            for (int j = 0; j < ni && len > 0 && len < KVD_ERR_LEN; j++)
                len +=
                    snprintf(err + len, KVD_ERR_LEN - (size_t)len, "%s %lld", j ? "," : "", ci[j]);
            if (ni == 0 && len > 0 && len < KVD_ERR_LEN)
                len += snprintf(err + len, KVD_ERR_LEN - (size_t)len, " no cells");
        }
        if (n > 4 && len > 0 && len < KVD_ERR_LEN)
            snprintf(err + len, KVD_ERR_LEN - (size_t)len, "; ...");
        return -1;
    }
    return 0;
}

/* The modes any run has, in kvdrift's order; bf16 (the reference, zero
 * drift) left out. */
static int trend_modes(const kvd_run *runs, int n, const char **modes) {
    int k = 0;
    for (int m = 0; m < KVD_KV_N_MODES; m++) {
        const char *name = kvd_kv_mode_name((kvd_kv_mode)m);
        if (!strcmp(name, "bf16")) continue;
        for (int i = 0; i < n; i++) {
            const char *have[KVD_KV_N_MODES];
            const int nh = kvd_run_modes(&runs[i], have);
            int found = 0;
            for (int h = 0; h < nh; h++) found |= !strcmp(have[h], name);
            if (found) {
                modes[k++] = name;
                break;
            }
        }
    }
    return k;
}

/* How many standard errors mode's mean output KL moved from run a to run b
 * (their verdicts va, vb; positive: b drifts further): of the per-position
 * difference when the two ran the same traces (*paired set), else of the
 * two means' errors combined. NaN without the figures. */
static double kl_step(const kvd_run *a, const kvd_run *b, const kvd_verdict *va,
                      const kvd_verdict *vb, const char *mode, long long ctx, int *paired) {
    *paired = 0;
    kvd_paired pd;
    if (kvd_results_paired(&a->r, mode, &b->r, mode, ctx, "all", "kl", -1, &pd) && pd.n > 1) {
        *paired = 1;
        if (pd.se > 0) return pd.mean / pd.se;
        return pd.mean == 0 ? 0 : (pd.mean > 0 ? INFINITY : -INFINITY);
    }
    const double e = sqrt(va->kl_err * va->kl_err + vb->kl_err * vb->kl_err);
    if (!isfinite(va->kl) || !isfinite(vb->kl)) return NAN;
    if (e > 0) return (vb->kl - va->kl) / e;
    return vb->kl == va->kl ? 0 : (vb->kl > va->kl ? INFINITY : -INFINITY);
}

/* A run's figures for one mode, read once for every view of the trend. */
typedef struct {
    kvd_verdict v;
    double p99;
    double step; /* from the latest earlier run with the mode's mean KL (NaN: none) */
    int paired;
} trend_cell;

typedef struct kvd_trend {
    long long ctx;
    const char *modes[KVD_KV_N_MODES];
    int nm;
    trend_cell *cell; /* [run][mode] */
    /* per mode: its first and last run with figures (-1: none), and how far
     * apart they are in standard errors */
    int first[KVD_KV_N_MODES], last[KVD_KV_N_MODES], paired_fl[KVD_KV_N_MODES];
    double z_fl[KVD_KV_N_MODES];
} trend_table;

static const trend_cell *cell_at(const trend_table *t, int i, int m) {
    return &t->cell[(size_t)i * t->nm + m];
}

void kvd_trend_free(kvd_trend *t) {
    if (t) free(t->cell);
    free(t);
}

kvd_trend *kvd_trend_build(kvd_run *runs, int n, long long ctx, char *err) {
    trend_table *t = calloc(1, sizeof *t);
    t->ctx = ctx;
    t->nm = trend_modes(runs, n, t->modes);
    t->cell = calloc((size_t)n * (t->nm ? t->nm : 1), sizeof *t->cell);
    char *loaded = calloc((size_t)n, 1); /* runs whose positions are in memory */
    int *prev = t->last, *first = t->first;
    for (int m = 0; m < t->nm; m++) prev[m] = first[m] = -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        /* the figures that pool positions (a percentile over several traces)
         * are taken with them, as a whole load gives them */
        if (kvd_results_load_positions(&runs[i].r, runs[i].path, ctx, err)) {
            rc = -1;
            break;
        }
        loaded[i] = 1;
        for (int m = 0; m < t->nm; m++) {
            trend_cell *c = &t->cell[(size_t)i * t->nm + m];
            c->v = kvd_run_verdict(&runs[i], t->modes[m], ctx);
            c->p99 = kvd_run_summary(&runs[i], t->modes[m], ctx, "all", "kl_p99");
            c->step = NAN;
            if (!isfinite(c->v.kl)) continue;
            if (prev[m] >= 0)
                c->step = kl_step(&runs[prev[m]], &runs[i], &cell_at(t, prev[m], m)->v, &c->v,
                                  t->modes[m], ctx, &c->paired);
            if (first[m] < 0) first[m] = i;
            prev[m] = i;
        }
        /* positions kept where a later step reads them: each mode's first
         * run (for the first-to-last distance) and its latest */
        for (int j = 0; j <= i; j++) {
            if (!loaded[j]) continue; /* at most 2 x modes + 1 runs are */
            int keep = 0;
            for (int m = 0; m < t->nm; m++) keep |= j == first[m] || j == prev[m];
            if (!keep) kvd_results_drop_positions(&runs[j].r), loaded[j] = 0;
        }
    }
    for (int m = 0; m < t->nm && !rc; m++) {
        t->z_fl[m] = NAN;
        t->paired_fl[m] = 0;
        if (first[m] >= 0 && prev[m] > first[m])
            t->z_fl[m] = kl_step(&runs[first[m]], &runs[prev[m]], &cell_at(t, first[m], m)->v,
                                 &cell_at(t, prev[m], m)->v, t->modes[m], ctx, &t->paired_fl[m]);
    }
    for (int j = 0; j < n; j++)
        if (loaded[j]) kvd_results_drop_positions(&runs[j].r);
    free(loaded);
    if (rc) {
        kvd_trend_free(t);
        return NULL;
    }
    return t;
}

/* z cut to tenths toward zero, as the report words distances: 1.97 is
 * "1.9", under the 2 that marks a step, not "2.0" */
static double tenths(double z) {
    return trunc(10 * z) / 10;
}

/* "+2.4 se", "-0.3 se paired", "-" */
static void z_text(char *s, size_t n, double z, int paired) {
    if (isfinite(z))
        snprintf(s, n, "%+.1f se%s", tenths(z), paired ? " paired" : "");
    else if (isinf(z))
        snprintf(s, n, "%s (no error)", z > 0 ? "up" : "down");
    else
        snprintf(s, n, "-");
}

/* A cell's step as a table shows it, in s; whether it is marked. */
static int step_cell(const trend_cell *c, char *s, size_t n) {
    z_text(s, n, c->step, c->paired);
    return !isnan(c->step) && fabs(c->step) >= TREND_MOVED_Z;
}

/* The sentence per mode: first and last run, their ratio and distance, and
 * the largest step between consecutive runs. 0 when the mode has fewer
 * than two runs with figures. */
static int mode_sentence(const kvd_run *runs, const trend_table *t, int m, char *s, size_t len) {
    const char *mode = t->modes[m];
    const int first = t->first[m], last = t->last[m], paired = t->paired_fl[m];
    if (first < 0 || last == first) return 0;
    const kvd_verdict *a = &cell_at(t, first, m)->v, *b = &cell_at(t, last, m)->v;
    const double z = t->z_fl[m];
    int k = snprintf(s, len, "%s: mean output KL %.3e in the first run and %.3e in the last", mode,
                     a->kl, b->kl);
    if (a->kl > 0 && k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k, " (%.2fx", b->kl / a->kl);
    else if (k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k, " (");
    if (k > 0 && (size_t)k < len) {
        if (isfinite(z))
            k += snprintf(s + k, len - (size_t)k, "%s%.1f standard errors apart%s%s)",
                          a->kl > 0 ? ", " : "", fabs(tenths(z)), paired ? ", paired" : "",
                          fabs(z) < TREND_MOVED_Z ? ": within the error" : "");
        else
            k += snprintf(s + k, len - (size_t)k, "%s)", a->kl > 0 ? "" : "no error");
    }
    /* the largest step between neighbours with figures */
    int at = -1;
    for (int i = first + 1; i <= last; i++) {
        const double zi = cell_at(t, i, m)->step;
        if (isfinite(zi) && (at < 0 || fabs(zi) > fabs(cell_at(t, at, m)->step))) at = i;
    }
    if (at > 0 && k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k,
                      "; the largest step between consecutive runs is %+.1f standard errors%s, "
                      "into run %d (%s)",
                      tenths(cell_at(t, at, m)->step), cell_at(t, at, m)->paired ? " (paired)" : "",
                      at + 1, runs[at].label);
    if (k > 0 && (size_t)k < len) snprintf(s + k, len - (size_t)k, ".");
    return 1;
}

static const char *const trend_css =
    "body{font-family:sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#222}"
    "h1{font-size:24px}h2{font-size:19px;margin-top:34px;border-bottom:1px solid #ccc}"
    "table{border-collapse:collapse;margin:10px 0;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f2f2f2}"
    "td.l,th.l{text-align:left}.moved,.failed{color:#d62728;font-weight:bold}"
    ".note{color:#555;font-size:13px}svg.chart{margin:8px 0;display:block}";

enum { TREND_CHARTS = 4 };

/* One chart per figure, x the run's number (oldest 1), a series per mode. */
static void trend_charts(kvd_buf *b, const trend_table *t, int n) {
    static const char *const title[TREND_CHARTS] = {
        "mean next-token KL against bf16 per run, with its 95% band",
        "99th-percentile next-token KL per run", "top-1 agreement with bf16 per run",
        "decode speed against bf16 per run (highest concurrency measured)"};
    static const char *const ylabel[TREND_CHARTS] = {"mean KL (nats, log)", "KL p99 (nats, log)",
                                                     "share of positions", "tokens/s over bf16's"};
    double *x = calloc((size_t)n * KVD_KV_N_MODES, sizeof *x),
           *y = calloc((size_t)n * KVD_KV_N_MODES, sizeof *y),
           *lo = calloc((size_t)n * KVD_KV_N_MODES, sizeof *lo),
           *hi = calloc((size_t)n * KVD_KV_N_MODES, sizeof *hi);
    for (int c = 0; c < TREND_CHARTS; c++) {
        kvd_line_chart ch = {title[c], "run (oldest first)", ylabel[c], 0, c < 2, 0, {{0}}};
        int drawn = 0;
        for (int m = 0; m < t->nm && m < KVD_SVG_MAX_SERIES; m++) {
            double *sx = x + (size_t)m * n, *sy = y + (size_t)m * n, *sl = lo + (size_t)m * n,
                   *sh = hi + (size_t)m * n;
            int k = 0;
            for (int i = 0; i < n; i++) {
                const trend_cell *e = cell_at(t, i, m);
                const double val = c == 0   ? e->v.kl
                                   : c == 1 ? e->p99
                                   : c == 2 ? e->v.top1
                                            : e->v.dec_gain;
                if (!isfinite(val)) continue;
                const double ci =
                    c == 0 && isfinite(e->v.kl_err) ? 1.959963984540054 * e->v.kl_err : 0;
                sx[k] = i + 1, sy[k] = val, sl[k] = val - ci, sh[k] = val + ci;
                k++;
            }
            if (!k) continue;
            ch.series[ch.n_series++] = (kvd_series){
                t->modes[m], k, sx, sy, c == 0 ? sl : NULL, c == 0 ? sh : NULL, k == 1, 0};
            drawn += k;
        }
        if (drawn) kvd_svg_lines(b, &ch); /* drawn: the next chart reuses the storage */
    }
    free(x), free(y), free(lo), free(hi);
}

/* Each run's cells that did not finish: why a point is missing. */
static void run_failures(kvd_buf *b, const kvd_run *runs, int n, int html) {
    for (int i = 0; i < n; i++) {
        char intro[320];
        snprintf(intro, sizeof intro, "run %d (%s): cells that did not finish:", i + 1,
                 runs[i].label);
        kvd_report_failures(b, &runs[i], intro, html);
    }
}

void kvd_trend_html(kvd_buf *b, const kvd_run *runs, int n, const kvd_trend *tr) {
    const trend_table t = *tr;
    const long long ctx = t.ctx;
    const char *const *modes = t.modes;
    const int nm = t.nm;
    kvd_buf_printf(b,
                   "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
                   "<title>kvdrift trend</title><style>%s</style></head><body>\n"
                   "<h1>kvdrift trend: %d runs at %lld tokens</h1>\n<p class=\"note\">From ",
                   trend_css, n, ctx);
    kvd_buf_xml(b, runs[0].r.written_utc);
    kvd_buf_puts(b, " to ");
    kvd_buf_xml(b, runs[n - 1].r.written_utc);
    kvd_buf_printf(
        b,
        ", oldest first. Each run's figures are over its traces at the largest context every "
        "run has. A step is how far a mode's mean output KL moved from the run before, in "
        "standard errors: of the per-position difference where the two ran the same traces "
        "(paired), else of the two means' errors combined; a step of %.0f or more is marked."
        "</p>\n",
        TREND_MOVED_Z);
    for (int m = 0; m < nm; m++) {
        char s[1024];
        if (!mode_sentence(runs, &t, m, s, sizeof s)) continue;
        kvd_buf_puts(b, "<p class=\"trend\">");
        kvd_buf_xml(b, s);
        kvd_buf_puts(b, "</p>\n");
    }
    /* where the runs' settings changed: figures on either side measure more
     * than the code under test */
    int changes = 0;
    for (int i = 1; i < n; i++) {
        char diff[1024];
        kvd_run_differences(&runs[i - 1], &runs[i], diff, sizeof diff);
        if (!diff[0]) continue;
        if (!changes++) kvd_buf_puts(b, "<h2>Where the runs' settings change</h2>\n<ul>\n");
        kvd_buf_printf(b, "<li class=\"change\">run %d (", i + 1);
        kvd_buf_xml(b, runs[i].label);
        kvd_buf_puts(b, ") against the run before: ");
        kvd_buf_xml(b, diff);
        kvd_buf_puts(b, "</li>\n");
    }
    if (changes) kvd_buf_puts(b, "</ul>\n");
    run_failures(b, runs, n, 1);
    kvd_buf_puts(b, "<h2>Figures per run</h2>\n");
    trend_charts(b, &t, n);
    kvd_buf_puts(b, "<table class=\"trend\"><tr><th>run</th><th class=\"l\">file</th><th "
                    "class=\"l\">written (UTC)</th><th class=\"l\">revision</th>");
    for (int m = 0; m < nm; m++)
        kvd_buf_printf(b, "<th>%s: mean KL</th><th>%s: step</th><th>%s: top-1</th>", modes[m],
                       modes[m], modes[m]);
    kvd_buf_puts(b, "</tr>\n");
    for (int i = 0; i < n; i++) {
        kvd_buf_printf(b, "<tr><td>%d</td><td class=\"l\">", i + 1);
        kvd_buf_xml(b, runs[i].label);
        kvd_buf_puts(b, "</td><td class=\"l\">");
        kvd_buf_xml(b, runs[i].r.written_utc);
        kvd_buf_puts(b, "</td><td class=\"l\">");
        kvd_buf_xml(b, runs[i].r.git_rev);
        kvd_buf_puts(b, "</td>");
        for (int m = 0; m < nm; m++) {
            const trend_cell *c = cell_at(&t, i, m);
            if (!isfinite(c->v.kl)) {
                kvd_buf_puts(b, "<td>-</td><td>-</td><td>-</td>");
                continue;
            }
            char step[48];
            const int moved = step_cell(c, step, sizeof step);
            kvd_buf_printf(b, "<td>%.3e &#177; %.1e</td><td%s>%s</td><td>%.4f</td>", c->v.kl,
                           c->v.kl_err, moved ? " class=\"moved\"" : "", step, c->v.top1);
        }
        kvd_buf_puts(b, "</tr>\n");
    }
    kvd_buf_puts(b, "</table>\n</body></html>\n");
}

void kvd_trend_md(kvd_buf *b, const kvd_run *runs, int n, const kvd_trend *tr) {
    const trend_table t = *tr;
    const long long ctx = t.ctx;
    const char *const *modes = t.modes;
    const int nm = t.nm;
    kvd_buf_printf(b, "## kvdrift trend: %d runs at %lld tokens, %s to %s\n\n", n, ctx,
                   runs[0].r.written_utc, runs[n - 1].r.written_utc);
    for (int m = 0; m < nm; m++) {
        char s[1024];
        if (mode_sentence(runs, &t, m, s, sizeof s)) kvd_buf_printf(b, "- %s\n", s);
    }
    for (int i = 1; i < n; i++) {
        char diff[1024];
        kvd_run_differences(&runs[i - 1], &runs[i], diff, sizeof diff);
        if (diff[0])
            kvd_buf_printf(b, "- run %d (%s) differs from the run before in: %s\n", i + 1,
                           runs[i].label, diff);
    }
    run_failures(b, runs, n, 0);
    kvd_buf_puts(b, "\n| run | file | written (UTC) | revision |");
    for (int m = 0; m < nm; m++) kvd_buf_printf(b, " %s: mean KL | %s: step |", modes[m], modes[m]);
    kvd_buf_puts(b, "\n| ---: | --- | --- | --- |");
    for (int m = 0; m < nm; m++) kvd_buf_puts(b, " ---: | ---: |");
    kvd_buf_puts(b, "\n");
    for (int i = 0; i < n; i++) {
        kvd_buf_printf(b, "| %d | %s | %s | %s |", i + 1, runs[i].label, runs[i].r.written_utc,
                       runs[i].r.git_rev);
        for (int m = 0; m < nm; m++) {
            const trend_cell *c = cell_at(&t, i, m);
            if (!isfinite(c->v.kl)) {
                kvd_buf_puts(b, " - | - |");
                continue;
            }
            char step[48];
            const int moved = step_cell(c, step, sizeof step);
            kvd_buf_printf(b, " %.3e ± %.1e | %s%s%s |", c->v.kl, c->v.kl_err, moved ? "**" : "",
                           step, moved ? "**" : "");
        }
        kvd_buf_puts(b, "\n");
    }
    kvd_buf_printf(b,
                   "\nStep: how far the mean output KL moved from the run before, in standard "
                   "errors (paired over the positions where the runs ran the same traces); "
                   "bold at %.0f or more.\n",
                   TREND_MOVED_Z);
}

void kvd_trend_csv(FILE *f, const kvd_run *runs, int n, const kvd_trend *tr) {
    const trend_table t = *tr;
    const long long ctx = t.ctx;
    const char *h[] = {"run",  "file",    "written_utc", "revision",
                       "mode", "context", "metric",      "value"};
    kvd_csv_row(f, 8, h);
    for (int i = 0; i < n; i++)
        for (int m = 0; m < t.nm; m++) {
            /* every figure the run has (a run of throughput cells alone: its speeds) */
            const trend_cell *c = cell_at(&t, i, m);
            const struct {
                const char *name;
                double v;
            } fig[] = {{"kl_mean", c->v.kl},
                       {"kl_mean_err", c->v.kl_err},
                       {"kl_p99", c->p99},
                       {"same_top_p", c->v.top1},
                       {"ln_ppl_ratio", c->v.ln_ppl},
                       {"attn_kl", c->v.attn_kl},
                       {"k_saturated", c->v.k_sat},
                       {"v_flushed", c->v.v_flush},
                       {"decode_vs_bf16", c->v.dec_gain},
                       {c->paired ? "kl_step_z_paired" : "kl_step_z", c->step}};
            char run[16], ctxs[32], val[40];
            snprintf(run, sizeof run, "%d", i + 1);
            snprintf(ctxs, sizeof ctxs, "%lld", ctx);
            for (size_t k = 0; k < sizeof fig / sizeof fig[0]; k++) {
                if (!isfinite(fig[k].v)) continue;
                snprintf(val, sizeof val, "%.9g", fig[k].v);
                const char *v[] = {
                    run,        runs[i].label, runs[i].r.written_utc, runs[i].r.git_rev,
                    t.modes[m], ctxs,          fig[k].name,           val};
                kvd_csv_row(f, 8, v);
            }
        }
}
