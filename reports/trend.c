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
 * (positive: b drifts further): of the per-position difference when the
 * two ran the same traces (*paired set), else of the two means' errors
 * combined. NaN without the figures. */
static double kl_step(const kvd_run *a, const kvd_run *b, const char *mode, long long ctx,
                      int *paired) {
    *paired = 0;
    kvd_paired pd;
    if (kvd_results_paired(&a->r, mode, &b->r, mode, ctx, "all", "kl", -1, &pd) && pd.n > 1) {
        *paired = 1;
        if (pd.se > 0) return pd.mean / pd.se;
        return pd.mean == 0 ? 0 : (pd.mean > 0 ? INFINITY : -INFINITY);
    }
    const kvd_verdict x = kvd_run_verdict(a, mode, ctx), y = kvd_run_verdict(b, mode, ctx);
    const double e = sqrt(x.kl_err * x.kl_err + y.kl_err * y.kl_err);
    if (!isfinite(x.kl) || !isfinite(y.kl)) return NAN;
    if (e > 0) return (y.kl - x.kl) / e;
    return y.kl == x.kl ? 0 : (y.kl > x.kl ? INFINITY : -INFINITY);
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

/* Run i's step for a mode: from the latest earlier run with the mode's
 * figures; NaN for the first. */
static double step_of(const kvd_run *runs, int i, const char *mode, long long ctx, int *paired) {
    int prev = i - 1;
    while (prev >= 0 && !isfinite(kvd_run_verdict(&runs[prev], mode, ctx).kl)) prev--;
    *paired = 0;
    return prev >= 0 ? kl_step(&runs[prev], &runs[i], mode, ctx, paired) : NAN;
}

/* The step as a table shows it, in s; whether it is marked. */
static int step_cell(const kvd_run *runs, int i, const char *mode, long long ctx, char *s,
                     size_t n) {
    int paired;
    const double z = step_of(runs, i, mode, ctx, &paired);
    z_text(s, n, z, paired);
    return !isnan(z) && fabs(z) >= TREND_MOVED_Z;
}

/* The sentence per mode: first and last run, their ratio and distance, and
 * the largest step between consecutive runs. 0 when the mode has fewer
 * than two runs with figures. */
static int mode_sentence(const kvd_run *runs, int n, const char *mode, long long ctx, char *s,
                         size_t len) {
    int first = -1, last = -1;
    for (int i = 0; i < n; i++)
        if (isfinite(kvd_run_verdict(&runs[i], mode, ctx).kl)) {
            if (first < 0) first = i;
            last = i;
        }
    if (first < 0 || last == first) return 0;
    const kvd_verdict a = kvd_run_verdict(&runs[first], mode, ctx),
                      b = kvd_run_verdict(&runs[last], mode, ctx);
    int paired;
    const double z = kl_step(&runs[first], &runs[last], mode, ctx, &paired);
    int k = snprintf(s, len, "%s: mean output KL %.3e in the first run and %.3e in the last", mode,
                     a.kl, b.kl);
    if (a.kl > 0 && k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k, " (%.2fx", b.kl / a.kl);
    else if (k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k, " (");
    if (k > 0 && (size_t)k < len) {
        if (isfinite(z))
            k += snprintf(s + k, len - (size_t)k, "%s%.1f standard errors apart%s%s)",
                          a.kl > 0 ? ", " : "", fabs(tenths(z)), paired ? ", paired" : "",
                          fabs(z) < TREND_MOVED_Z ? ": within the error" : "");
        else
            k += snprintf(s + k, len - (size_t)k, "%s)", a.kl > 0 ? "" : "no error");
    }
    /* the largest step between neighbours with figures */
    double big = NAN;
    int at = -1, big_paired = 0;
    for (int i = first + 1; i <= last; i++) {
        if (!isfinite(kvd_run_verdict(&runs[i], mode, ctx).kl)) continue;
        int p;
        const double zi = step_of(runs, i, mode, ctx, &p);
        if (isfinite(zi) && (!isfinite(big) || fabs(zi) > fabs(big)))
            big = zi, at = i, big_paired = p;
    }
    if (at > 0 && k > 0 && (size_t)k < len)
        k += snprintf(s + k, len - (size_t)k,
                      "; the largest step between consecutive runs is %+.1f standard errors%s, "
                      "into run %d (%s)",
                      tenths(big), big_paired ? " (paired)" : "", at + 1, runs[at].label);
    if (k > 0 && (size_t)k < len) snprintf(s + k, len - (size_t)k, ".");
    return 1;
}

static const char *const trend_css =
    "body{font-family:sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#222}"
    "h1{font-size:24px}h2{font-size:19px;margin-top:34px;border-bottom:1px solid #ccc}"
    "table{border-collapse:collapse;margin:10px 0;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f2f2f2}"
    "td.l,th.l{text-align:left}.moved{color:#d62728;font-weight:bold}"
    ".note{color:#555;font-size:13px}svg.chart{margin:8px 0;display:block}";

enum { TREND_CHARTS = 4 };

/* One chart per figure, x the run's number (oldest 1), a series per mode. */
static void trend_charts(kvd_buf *b, const kvd_run *runs, int n, long long ctx, const char **modes,
                         int nm) {
    static const char *const title[TREND_CHARTS] = {
        "mean next-token KL against bf16 per run, with its 95% band",
        "99th-percentile next-token KL per run", "top-1 agreement with bf16 per run",
        "decode speed against bf16 per run (highest concurrency measured)"};
    static const char *const ylabel[TREND_CHARTS] = {"mean KL (nats, log)", "KL p99 (nats, log)",
                                                     "share of positions", "tokens/s over bf16's"};
    const int nmax = n;
    double *x = calloc((size_t)nmax * KVD_KV_N_MODES, sizeof *x),
           *y = calloc((size_t)nmax * KVD_KV_N_MODES, sizeof *y),
           *lo = calloc((size_t)nmax * KVD_KV_N_MODES, sizeof *lo),
           *hi = calloc((size_t)nmax * KVD_KV_N_MODES, sizeof *hi);
    for (int c = 0; c < TREND_CHARTS; c++) {
        kvd_line_chart ch = {title[c], "run (oldest first)", ylabel[c], 0, c < 2, 0, {{0}}};
        int drawn = 0;
        for (int m = 0; m < nm && m < KVD_SVG_MAX_SERIES; m++) {
            double *sx = x + (size_t)m * nmax, *sy = y + (size_t)m * nmax,
                   *sl = lo + (size_t)m * nmax, *sh = hi + (size_t)m * nmax;
            int k = 0;
            for (int i = 0; i < n; i++) {
                const kvd_verdict v = kvd_run_verdict(&runs[i], modes[m], ctx);
                const double val = c == 0 ? v.kl
                                   : c == 1
                                       ? kvd_run_summary(&runs[i], modes[m], ctx, "all", "kl_p99")
                                   : c == 2 ? v.top1
                                            : v.dec_gain;
                if (!isfinite(val)) continue;
                const double ci = c == 0 && isfinite(v.kl_err) ? 1.959963984540054 * v.kl_err : 0;
                sx[k] = i + 1, sy[k] = val, sl[k] = val - ci, sh[k] = val + ci;
                k++;
            }
            if (!k) continue;
            ch.series[ch.n_series++] = (kvd_series){
                modes[m], k, sx, sy, c == 0 ? sl : NULL, c == 0 ? sh : NULL, k == 1, 0};
            drawn += k;
        }
        if (drawn) kvd_svg_lines(b, &ch); /* drawn: the next chart reuses the storage */
    }
    free(x), free(y), free(lo), free(hi);
}

void kvd_trend_html(kvd_buf *b, const kvd_run *runs, int n, long long ctx) {
    const char *modes[KVD_KV_N_MODES];
    const int nm = trend_modes(runs, n, modes);
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
        if (!mode_sentence(runs, n, modes[m], ctx, s, sizeof s)) continue;
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
    kvd_buf_puts(b, "<h2>Figures per run</h2>\n");
    trend_charts(b, runs, n, ctx, modes, nm);
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
            const kvd_verdict v = kvd_run_verdict(&runs[i], modes[m], ctx);
            if (!isfinite(v.kl)) {
                kvd_buf_puts(b, "<td>-</td><td>-</td><td>-</td>");
                continue;
            }
            char step[48];
            const int moved = step_cell(runs, i, modes[m], ctx, step, sizeof step);
            kvd_buf_printf(b, "<td>%.3e &#177; %.1e</td><td%s>%s</td><td>%.4f</td>", v.kl, v.kl_err,
                           moved ? " class=\"moved\"" : "", step, v.top1);
        }
        kvd_buf_puts(b, "</tr>\n");
    }
    kvd_buf_puts(b, "</table>\n</body></html>\n");
}

void kvd_trend_md(kvd_buf *b, const kvd_run *runs, int n, long long ctx) {
    const char *modes[KVD_KV_N_MODES];
    const int nm = trend_modes(runs, n, modes);
    kvd_buf_printf(b, "## kvdrift trend: %d runs at %lld tokens, %s to %s\n\n", n, ctx,
                   runs[0].r.written_utc, runs[n - 1].r.written_utc);
    for (int m = 0; m < nm; m++) {
        char s[1024];
        if (mode_sentence(runs, n, modes[m], ctx, s, sizeof s)) kvd_buf_printf(b, "- %s\n", s);
    }
    for (int i = 1; i < n; i++) {
        char diff[1024];
        kvd_run_differences(&runs[i - 1], &runs[i], diff, sizeof diff);
        if (diff[0])
            kvd_buf_printf(b, "- run %d (%s) differs from the run before in: %s\n", i + 1,
                           runs[i].label, diff);
    }
    kvd_buf_puts(b, "\n| run | file | written (UTC) | revision |");
    for (int m = 0; m < nm; m++) kvd_buf_printf(b, " %s: mean KL | %s: step |", modes[m], modes[m]);
    kvd_buf_puts(b, "\n| ---: | --- | --- | --- |");
    for (int m = 0; m < nm; m++) kvd_buf_puts(b, " ---: | ---: |");
    kvd_buf_puts(b, "\n");
    for (int i = 0; i < n; i++) {
        kvd_buf_printf(b, "| %d | %s | %s | %s |", i + 1, runs[i].label, runs[i].r.written_utc,
                       runs[i].r.git_rev);
        for (int m = 0; m < nm; m++) {
            const kvd_verdict v = kvd_run_verdict(&runs[i], modes[m], ctx);
            if (!isfinite(v.kl)) {
                kvd_buf_puts(b, " - | - |");
                continue;
            }
            char step[48];
            const int moved = step_cell(runs, i, modes[m], ctx, step, sizeof step);
            kvd_buf_printf(b, " %.3e ± %.1e | %s%s%s |", v.kl, v.kl_err, moved ? "**" : "", step,
                           moved ? "**" : "");
        }
        kvd_buf_puts(b, "\n");
    }
    kvd_buf_printf(b,
                   "\nStep: how far the mean output KL moved from the run before, in standard "
                   "errors (paired over the positions where the runs ran the same traces); "
                   "bold at %.0f or more.\n",
                   TREND_MOVED_Z);
}

void kvd_trend_csv(kvd_buf *b, const kvd_run *runs, int n, long long ctx) {
    const char *modes[KVD_KV_N_MODES];
    const int nm = trend_modes(runs, n, modes);
    kvd_buf_puts(b, "run,file,written_utc,revision,mode,context,metric,value\n");
    for (int i = 0; i < n; i++)
        for (int m = 0; m < nm; m++) {
            const kvd_verdict v = kvd_run_verdict(&runs[i], modes[m], ctx);
            /* every figure the run has (a run of throughput cells alone: its speeds) */
            int paired;
            const double z = step_of(runs, i, modes[m], ctx, &paired);
            const struct {
                const char *name;
                double v;
            } f[] = {{"kl_mean", v.kl},
                     {"kl_mean_err", v.kl_err},
                     {"kl_p99", kvd_run_summary(&runs[i], modes[m], ctx, "all", "kl_p99")},
                     {"same_top_p", v.top1},
                     {"ln_ppl_ratio", v.ln_ppl},
                     {"attn_kl", v.attn_kl},
                     {"k_saturated", v.k_sat},
                     {"v_flushed", v.v_flush},
                     {"decode_vs_bf16", v.dec_gain},
                     {paired ? "kl_step_z_paired" : "kl_step_z", z}};
            for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
                if (!isfinite(f[k].v)) continue;
                /* a file name with a comma or quote is quoted, CSV's way */
                kvd_buf_printf(b, "%d,", i + 1);
                const char *l = runs[i].label;
                if (strpbrk(l, ",\"\n")) {
                    kvd_buf_puts(b, "\"");
                    for (const char *p = l; *p; p++) {
                        const char c[3] = {*p, *p == '"' ? '"' : 0, 0};
                        kvd_buf_puts(b, c);
                    }
                    kvd_buf_puts(b, "\"");
                } else {
                    kvd_buf_puts(b, l);
                }
                kvd_buf_printf(b, ",%s,%s,%s,%lld,%s,%.9g\n", runs[i].r.written_utc,
                               runs[i].r.git_rev, modes[m], ctx, f[k].name, f[k].v);
            }
        }
}
