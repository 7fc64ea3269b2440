/* kvdrift: HTML, Markdown and CSV reports from result files. The HTML is one
 * file a reviewer opens without network or scripts: tables, and charts drawn
 * here as inline SVG. */
#include "report.h"

#include <csv.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/checkpoint.h"
#include "../runners/config.h"
#include "../runners/kvcache.h"
#include "svg.h"

/* a run's label: the last `parts` components of its path, ".h5" dropped */
static void set_label(kvd_run *r, int parts) {
    const char *p = r->path + strlen(r->path);
    for (int seen = 0; p > r->path; p--)
        if (p[-1] == '/' && ++seen == parts) break;
    snprintf(r->label, sizeof r->label, "%s", p);
    char *dot = strrchr(r->label, '.');
    if (dot && !strcmp(dot, ".h5")) *dot = 0;
}

/* Labels name runs in every table and chart, so no two may be the same:
 * runs whose file names clash (a/run.h5, b/run.h5) take more of their path
 * (a/run, b/run), and one file given twice is numbered. */
static void unique_labels(kvd_run *runs, int n) {
    int *parts = calloc((size_t)n + 1, sizeof *parts),
        *clash = calloc((size_t)n + 1, sizeof *clash);
    for (int i = 0; i < n; i++) parts[i] = 1, set_label(&runs[i], 1);
    for (int round = 0; round < 64; round++) {
        int any = 0;
        for (int i = 0; i < n; i++) {
            clash[i] = 0;
            for (int j = 0; j < n; j++)
                if (j != i && !strcmp(runs[i].label, runs[j].label) &&
                    strcmp(runs[i].path, runs[j].path))
                    clash[i] = 1;
            any |= clash[i];
        }
        if (!any) break;
        for (int i = 0; i < n; i++)
            if (clash[i]) set_label(&runs[i], ++parts[i]);
    }
    for (int i = 1; i < n; i++) {
        int k = 1;
        for (int j = 0; j < i; j++) k += !strcmp(runs[i].path, runs[j].path);
        if (k > 1) {
            size_t len = strlen(runs[i].label);
            snprintf(runs[i].label + len, sizeof runs[i].label - len, " #%d", k);
        }
    }
    free(parts);
    free(clash);
}

int kvd_runs_load(kvd_run *runs, int n, char *const *paths, int positions, char *err) {
    for (int i = 0; i < n; i++) {
        memset(&runs[i], 0, sizeof runs[i]);
        kvd_results_init(&runs[i].r);
        snprintf(runs[i].path, sizeof runs[i].path, "%s", paths[i]);
        if ((positions ? kvd_results_load : kvd_results_load_light)(&runs[i].r, paths[i], err)) {
            kvd_runs_free(runs, i + 1);
            return -1;
        }
    }
    unique_labels(runs, n);
    return 0;
}

void kvd_runs_free(kvd_run *runs, int n) {
    for (int i = 0; i < n; i++) kvd_results_free(&runs[i].r);
}

long long kvd_run_max_context(const kvd_run *r) {
    /* every finished cell, drift or throughput (a run may hold either alone) */
    const kvd_table *t = &r->r.t[KVD_T_CELLS];
    long long m = 0;
    for (int64_t i = 0; i < t->n; i++) {
        long long c = KVD_ROW(t, kvd_row_cell, i)->context;
        m = c > m ? c : m;
    }
    return m;
}

int kvd_run_contexts(const kvd_run *r, long long *out, int cap) {
    const kvd_table *t = &r->r.t[KVD_T_CELLS];
    int n = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const long long c = KVD_ROW(t, kvd_row_cell, i)->context;
        int k = 0;
        while (k < n && out[k] < c) k++;
        if ((k < n && out[k] == c) || k == cap) continue;
        if (n == cap) n--; /* the largest makes room */
        memmove(out + k + 1, out + k, (size_t)(n - k) * sizeof *out);
        out[k] = c, n++;
    }
    return n;
}

void kvd_context_list(char *s, size_t n, const long long *c, int nc) {
    size_t len = 0;
    s[0] = 0;
    for (int i = 0; i < nc && len < n; i++)
        len += (size_t)snprintf(s + len, n - len, "%s%lld",
                                i == 0        ? ""
                                : i + 1 == nc ? " and "
                                              : ", ",
                                c[i]);
}

int kvd_run_modes(const kvd_run *r, const char **modes) {
    int n = 0;
    for (int m = 0; m < KVD_KV_N_MODES; m++) {
        const char *name = kvd_kv_mode_name((kvd_kv_mode)m);
        const kvd_table *t = &r->r.t[KVD_T_CELLS];
        for (int64_t i = 0; i < t->n; i++)
            if (!strcmp(KVD_ROW(t, kvd_row_cell, i)->mode, name)) {
                modes[n++] = name;
                break;
            }
    }
    return n;
}

int kvd_run_failures(const kvd_run *r, char s[KVD_FAIL_MAX][KVD_FAIL_LEN]) {
    const kvd_table *t = &r->r.t[KVD_T_FAIL];
    int n = 0, more = 0;
    /* the row each line started from: a later row of its mode and message joins it */
    int64_t first[KVD_FAIL_MAX];
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_failure *x = KVD_ROW(t, kvd_row_failure, i);
        int l = 0;
        while (l < n && (strcmp(KVD_ROW(t, kvd_row_failure, first[l])->mode, x->mode) ||
                         strcmp(KVD_ROW(t, kvd_row_failure, first[l])->message, x->message)))
            l++;
        if (l == n && n == KVD_FAIL_MAX - 1) { /* the last line counts the rest */
            more++;
            continue;
        }
        char what[160];
        if (!strcmp(x->kind, "drift"))
            snprintf(what, sizeof what, "drift at %lld tokens (trace %d)", (long long)x->context,
                     x->trace);
        else
            snprintf(what, sizeof what, "%s at %lld tokens, concurrency %d", x->kind,
                     (long long)x->context, x->concurrency);
        if (l == n) {
            first[n++] = i;
            snprintf(s[l], KVD_FAIL_LEN, "%s: %s", x->mode, what);
        } else {
            size_t k = strlen(s[l]);
            snprintf(s[l] + k, KVD_FAIL_LEN - k, "; %s", what);
        }
    }
    for (int l = 0; l < n; l++) {
        size_t k = strlen(s[l]);
        snprintf(s[l] + k, KVD_FAIL_LEN - k, ": %s",
                 KVD_ROW(t, kvd_row_failure, first[l])->message);
    }
    if (more) snprintf(s[n++], KVD_FAIL_LEN, "and %d %s more", more, more == 1 ? "cell" : "cells");
    return n;
}

double kvd_run_summary(const kvd_run *r, const char *mode, long long ctx, const char *subset,
                       const char *metric) {
    if (ctx <= 0) ctx = kvd_run_max_context(r);
    return kvd_results_summary(&r->r, mode, ctx, subset, metric);
}

/* Throughput row of (mode, concurrency, context), or NULL. */
static const kvd_row_tput *tput(const kvd_run *r, const char *mode, int c, long long ctx) {
    const kvd_table *t = &r->r.t[KVD_T_TPUT];
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_tput *x = KVD_ROW(t, kvd_row_tput, i);
        if (!strcmp(x->mode, mode) && x->concurrency == c && x->context == ctx) return x;
    }
    return NULL;
}

/* The concurrency levels of a run's throughput rows at context ctx (every
 * context: ctx <= 0), ascending, into out[64]. */
static int concurrencies(const kvd_run *r, long long ctx, int *out) {
    const kvd_table *t = &r->r.t[KVD_T_TPUT];
    int n = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_tput *x = KVD_ROW(t, kvd_row_tput, i);
        if (ctx > 0 && x->context != ctx) continue;
        int seen = 0;
        for (int k = 0; k < n; k++) seen |= out[k] == x->concurrency;
        if (!seen && n < 64) out[n++] = x->concurrency;
    }
    for (int i = 1; i < n; i++) /* sort */
        for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
            int tmp = out[j];
            out[j] = out[j - 1], out[j - 1] = tmp;
        }
    return n;
}

/* a row's share of the standard error of an n-weighted mean of rows, (n
 * ci95 / 1.96)^2; none for a row without an interval (one position) */
static double se_part(double n, double ci95) {
    return isfinite(ci95) ? (n * ci95 / 1.959963984540054) * (n * ci95 / 1.959963984540054) : 0;
}

double kvd_run_layer_mean(const kvd_run *r, const char *mode, long long ctx, int layer,
                          const char *metric, double *se) {
    const kvd_table *t = &r->r.t[KVD_T_LAYER];
    double s = 0, n = 0, v = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_layer *x = KVD_ROW(t, kvd_row_layer, i);
        if (!strcmp(x->mode, mode) && x->context == ctx && x->layer == layer &&
            !strcmp(x->subset, "all") && !strcmp(x->metric, metric))
            s += x->mean * x->n, n += x->n, v += se_part(x->n, x->ci95);
    }
    if (se) *se = n > 0 ? sqrt(v) / n : NAN;
    return n > 0 ? s / n : NAN;
}

int kvd_run_layers(const kvd_run *r) {
    const kvd_table *t = &r->r.t[KVD_T_LAYER];
    int m = -1;
    for (int64_t i = 0; i < t->n; i++)
        m = KVD_ROW(t, kvd_row_layer, i)->layer > m ? KVD_ROW(t, kvd_row_layer, i)->layer : m;
    return m + 1;
}

typedef kvd_verdict verdict;

/* kvd_run_attn_kl over one KV head's rows (head >= 0, --attn-per-head),
 * or every head's together (-1) */
static double attn_kl_head(const kvd_run *r, const char *mode, long long ctx, const char *view,
                           const char *subset, int al, int head, double *se) {
    const kvd_table *t = &r->r.t[KVD_T_ATTN];
    double s = 0, n = 0, v = 0;
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_attn *x = KVD_ROW(t, kvd_row_attn, i);
        if (!strcmp(x->mode, mode) && x->context == ctx && !strcmp(x->view, view) &&
            !strcmp(x->subset, subset) && !strcmp(x->metric, "kl") && x->kv_head == head &&
            (al < 0 || x->attn_layer == al))
            s += x->mean * x->n, n += x->n, v += se_part(x->n, x->ci95);
    }
    if (se) *se = n > 0 ? sqrt(v) / n : NAN;
    return n > 0 ? s / n : NAN;
}

double kvd_run_attn_kl(const kvd_run *r, const char *mode, long long ctx, const char *view,
                       const char *subset, int al, double *se) {
    return attn_kl_head(r, mode, ctx, view, subset, al, -1, se);
}

kvd_verdict kvd_run_verdict(const kvd_run *r, const char *mode, long long ctx) {
    verdict v;
    v.kl = kvd_run_summary(r, mode, ctx, "all", "kl_mean");
    v.kl_err = kvd_run_summary(r, mode, ctx, "all", "kl_mean_err");
    v.top1 = kvd_run_summary(r, mode, ctx, "all", "same_top_p");
    v.ln_ppl = kvd_run_summary(r, mode, ctx, "all", "ln_ppl_ratio");
    v.hid_last = kvd_run_layer_mean(r, mode, ctx, kvd_run_layers(r) - 1, "rel_l2", NULL);
    v.attn_kl = kvd_run_attn_kl(r, mode, ctx, "propagated", "all", -1, NULL);
    kvd_results_kv_shares(&r->r, mode, ctx, &v.k_sat, &v.v_flush);
    int cs[64], nc = concurrencies(r, ctx, cs);
    v.conc = nc ? cs[nc - 1] : 0;
    const kvd_row_tput *a = nc ? tput(r, mode, v.conc, ctx) : NULL,
                       *b = nc ? tput(r, "bf16", v.conc, ctx) : NULL;
    v.dec_gain = a && b ? a->decode_tok_s / b->decode_tok_s : NAN;
    v.cap_gain = a && b ? a->budget_tokens / b->budget_tokens : NAN;
    return v;
}

/* A rule of thumb from llama.cpp's KL-divergence practice: mean KL under
 * 0.001 nats is hard to notice, above 0.01 users notice. */
static const char *verdict_word(double kl) {
    if (!isfinite(kl)) return "n/a";
    if (kl == 0) return "reference";
    return kl < 1e-3 ? "negligible" : kl < 1e-2 ? "noticeable" : "degraded";
}

static void fmt(char *b, size_t n, double v, const char *f) {
    if (isfinite(v)) {
        snprintf(b, n, f, v);
    } else {
        snprintf(b, n, "-");
    }
}

/* The verdict's figures as the tables print them. */
typedef struct {
    char kl[32], kl_err[32], top1[32], ln_ppl[32], attn_kl[32], hid_last[32], dec[32], cap[32];
    char lost[48]; /* "K sat% / V flushed%" */
} verdict_text;

static verdict_text verdict_fmt(const verdict *v) {
    verdict_text t;
    fmt(t.kl, sizeof t.kl, v->kl, "%.3e");
    fmt(t.kl_err, sizeof t.kl_err, v->kl_err, "%.1e");
    fmt(t.top1, sizeof t.top1, v->top1, "%.4f");
    fmt(t.ln_ppl, sizeof t.ln_ppl, v->ln_ppl, "%.2e");
    fmt(t.attn_kl, sizeof t.attn_kl, v->attn_kl, "%.2e");
    fmt(t.hid_last, sizeof t.hid_last, v->hid_last, "%.2e");
    fmt(t.dec, sizeof t.dec, v->dec_gain, "%.2fx");
    fmt(t.cap, sizeof t.cap, v->cap_gain, "%.1fx");
    if (isfinite(v->k_sat) && isfinite(v->v_flush))
        snprintf(t.lost, sizeof t.lost, "%.3f%% / %.3f%%", 100 * v->k_sat, 100 * v->v_flush);
    else
        snprintf(t.lost, sizeof t.lost, "-");
    return t;
}

static const char *css =
    "body{font-family:sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;color:#222}"
    "h1{font-size:24px}h2{font-size:19px;margin-top:34px;border-bottom:1px solid #ccc}"
    "table{border-collapse:collapse;margin:10px 0;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f2f2f2}"
    "td.l,th.l{text-align:left}.negligible{color:#2ca02c}.noticeable{color:#e07b00}"
    ".degraded{color:#d62728;font-weight:bold}.note{color:#555;font-size:13px}"
    ".failed{color:#d62728}"
    "svg.chart{margin:8px 0;display:block}pre{background:#f7f7f7;padding:8px;font-size:12px;"
    "overflow-x:auto}";

static void verdict_table(kvd_buf *b, const kvd_run *runs, int n) {
    kvd_buf_puts(b,
                 "<table class=\"verdict\"><tr><th class=\"l\">run</th><th class=\"l\">KV mode</th>"
                 "<th>output KL (nats)</th><th>top-1 agreement</th><th>ln(PPL ratio)</th>"
                 "<th>attention KL</th><th>last-layer hidden drift</th><th>K saturated / V "
                 "flushed to 0</th><th>decode speed vs bf16</th><th>KV capacity vs bf16</th>"
                 "<th class=\"l\">verdict</th></tr>\n");
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++) {
            verdict v = kvd_run_verdict(&runs[i], modes[m], kvd_run_max_context(&runs[i]));
            verdict_text t = verdict_fmt(&v);
            const char *w = verdict_word(v.kl);
            kvd_buf_puts(b, "<tr><td class=\"l\">");
            kvd_buf_xml(b, runs[i].label);
            kvd_buf_printf(b,
                           "</td><td class=\"l\">%s</td><td>%s &#177; %s</td><td>%s</td><td>%s</td>"
                           "<td>%s</td><td>%s</td><td>%s</td><td>%s (C=%d)</td><td>%s</td>"
                           "<td class=\"l %s\">%s</td></tr>\n",
                           modes[m], t.kl, t.kl_err, t.top1, t.ln_ppl, t.attn_kl, t.hid_last,
                           t.lost, t.dec, v.conc, t.cap, w, w);
        }
    }
    kvd_buf_puts(b, "</table>\n");
}

static const char *series_label(char *buf, size_t n, const kvd_run *runs, int nr, int i,
                                const char *mode) {
    if (nr > 1) {
        snprintf(buf, n, "%s: %s", runs[i].label, mode);
    } else {
        snprintf(buf, n, "%s", mode);
    }
    return buf;
}

/* A chart holds at most `cap` series (bars: groups); the loops that fill
 * one count every series they would draw (`wanted`) and draw the first cap.
 * Where they wanted more, say which are shown: the tables hold every figure. */
static void capped_note(kvd_buf *b, int cap, int wanted) {
    if (wanted > cap)
        kvd_buf_printf(b,
                       "<p class=\"note\">This chart shows the first %d of %d series (runs in "
                       "order, then KV modes); the tables hold every figure.</p>\n",
                       cap, wanted);
}

/* storage for chart series that outlives the call building them */
typedef struct {
    double x[KVD_SVG_MAX_SERIES][64], y[KVD_SVG_MAX_SERIES][64], lo[KVD_SVG_MAX_SERIES][64],
        hi[KVD_SVG_MAX_SERIES][64];
    char label[KVD_SVG_MAX_SERIES][160];
} series_store;

/* at each run's largest context, or at ctx when ctx > 0 */
static void kl_by_position(kvd_buf *b, const kvd_run *runs, int n, const char *subset,
                           const char *title, long long at) {
    static series_store st;
    kvd_line_chart ch = {title,
                         "token position (log scale; bucket midpoint)",
                         "next-token KL vs bf16 (nats, log)",
                         1,
                         1,
                         0,
                         {{0}}};
    int wanted = 0; /* series the runs have for this chart */
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        const long long ctx = at > 0 ? at : kvd_run_max_context(&runs[i]);
        for (int m = 0; m < nm; m++) {
            if (wanted++ >= KVD_SVG_MAX_SERIES) continue;
            int s = ch.n_series, k = 0;
            /* pool traces per bucket */
            kvd_pool pool[64] = {{0}};
            const kvd_table *t = &runs[i].r.t[KVD_T_OUTPUT];
            for (int64_t j = 0; j < t->n; j++) {
                const kvd_row_output *x = KVD_ROW(t, kvd_row_output, j);
                if (strcmp(x->mode, modes[m]) || x->context != ctx || strcmp(x->subset, subset) ||
                    strcmp(x->metric, "kl") || x->bucket < 0 || x->bucket >= 64)
                    continue;
                kvd_pool_add(&pool[x->bucket], x->n, x->mean, x->ci95);
            }
            for (int bk = 0; bk < 64; bk++) {
                if (!pool[bk].rows) continue;
                double lo = bk == 0 ? 1 : exp2(bk), hi = exp2(bk + 1) - 1,
                       ci = kvd_pool_ci95(&pool[bk]);
                st.x[s][k] = sqrt(lo * hi);
                st.y[s][k] = kvd_pool_mean(&pool[bk]);
                st.lo[s][k] = st.y[s][k] - ci;
                st.hi[s][k] = st.y[s][k] + ci;
                k++;
            }
            series_label(st.label[s], sizeof st.label[s], runs, n, i, modes[m]);
            ch.series[s] = (kvd_series){st.label[s], k, st.x[s], st.y[s], st.lo[s], st.hi[s], 0, 0};
            ch.n_series++;
        }
    }
    kvd_svg_lines(b, &ch);
    capped_note(b, KVD_SVG_MAX_SERIES, wanted);
}

/* The share of a mode's positions (every trace's, at the run's largest
 * context) whose next-token KL exceeds x; NaN without positions. */
static double kl_share_above(const kvd_run *r, const char *mode, double x) {
    const float *v;
    const int64_t n = kvd_results_kl_sorted(&r->r, mode, kvd_run_max_context(r), "all", &v);
    int64_t lo = 0, hi = n; /* the first value above x, v sorted */
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((double)v[mid] <= x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return n ? (double)(n - lo) / (double)n : NAN;
}

/* A sentence built in s[n], *len its length so far: appends unless an
 * earlier part was already cut at n (or failed, *len < 0). */
__attribute__((format(printf, 4, 5))) static void sentence_add(char *s, size_t n, int *len,
                                                               const char *fmt, ...) {
    if (*len < 0 || (size_t)*len >= n) return;
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(s + *len, n - (size_t)*len, fmt, ap);
    va_end(ap);
    *len = k < 0 ? -1 : *len + k;
}

/* A sentence as a paragraph of class cls, after "label: " when given */
static void sentence_p(kvd_buf *b, const char *cls, const char *label, const char *s) {
    kvd_buf_printf(b, "<p class=\"%s\">", cls);
    if (label) {
        kvd_buf_xml(b, label);
        kvd_buf_puts(b, ": ");
    }
    kvd_buf_xml(b, s);
    kvd_buf_puts(b, "</p>\n");
}

/* The drift's tail in one sentence: each FP8 mode's share of positions
 * above 0.001 and 0.01 nats; 0 when the run keeps no positions. */
static int tail_sentence(const kvd_run *r, char *s, size_t n) {
    const char *modes[KVD_KV_N_MODES];
    const int nm = kvd_run_modes(r, modes);
    int len = 0, k = 0;
    sentence_add(s, n, &len, "Share of positions whose next-token KL exceeds 0.001 / 0.01 nats:");
    for (int m = 0; m < nm; m++) {
        const double a = kl_share_above(r, modes[m], 1e-3), b = kl_share_above(r, modes[m], 1e-2);
        if (!strcmp(modes[m], "bf16") || !isfinite(a)) continue;
        sentence_add(s, n, &len, "%s %s %.1f%% / %.1f%%", k++ ? "," : "", modes[m], 100 * a,
                     100 * b);
    }
    sentence_add(s, n, &len, ".");
    return k > 0;
}

/* Where the drift lies: the share of positions (every trace's together)
 * whose next-token KL exceeds x, on a log grid of x, per run and FP8 mode.
 * A mean hides whether drift is spread thin or sits in a few positions; a
 * greedy decoder picks another token at those few. Nothing for runs
 * without positions (schema version 1) or without drift. */
static void kl_tail(kvd_buf *b, const kvd_run *runs, int n) {
    static series_store st;
    /* x from 1e-8 to 1e2 nats, 4 points a decade; the chart starts a point
     * before the first where any series falls below 1 */
    enum { PER_DECADE = 4, LO_EXP = -8, HI_EXP = 2, NX = (HI_EXP - LO_EXP) * PER_DECADE + 1 };
    static double share[KVD_SVG_MAX_SERIES][NX];
    kvd_line_chart ch = {"share of positions whose next-token KL exceeds x",
                         "x: next-token KL vs bf16 (nats, log)",
                         "share of positions (log)",
                         1,
                         1,
                         0,
                         {{0}}};
    int wanted = 0, first = NX, color[KVD_SVG_MAX_SERIES];
    for (int i = 0, all = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        const int nm = kvd_run_modes(&runs[i], modes);
        const long long ctx = kvd_run_max_context(&runs[i]);
        for (int m = 0; m < nm; m++, all++) { /* all: the series' index in kl_by_position */
            const float *v;
            const int64_t nv = kvd_results_kl_sorted(&runs[i].r, modes[m], ctx, "all", &v);
            if (nv == 0 || !(v[nv - 1] > 0)) continue; /* no positions, or no drift */
            if (wanted++ >= KVD_SVG_MAX_SERIES) continue;
            const int s = ch.n_series++;
            color[s] = 1 + all; /* each mode in its colour of the chart above */
            for (int e = 0; e < NX; e++) {
                share[s][e] =
                    kl_share_above(&runs[i], modes[m], pow(10, LO_EXP + (double)e / PER_DECADE));
                if (share[s][e] < 1 && e < first) first = e;
            }
            series_label(st.label[s], sizeof st.label[s], runs, n, i, modes[m]);
        }
    }
    if (!ch.n_series) return;
    first = first > 0 ? first - 1 : 0;
    for (int s = 0; s < ch.n_series; s++) {
        int k = 0;
        for (int e = first; e < NX && share[s][e] > 0 && k < 64; e++, k++) {
            st.x[s][k] = pow(10, LO_EXP + (double)e / PER_DECADE);
            st.y[s][k] = share[s][e];
        }
        ch.series[s] = (kvd_series){st.label[s], k, st.x[s], st.y[s], NULL, NULL, 0, color[s]};
    }
    kvd_buf_puts(b, "<h2>How the drift is spread over positions</h2>\n<p class=\"note\">The "
                    "share of predicted positions, over every trace, whose next-token KL against "
                    "BF16 exceeds x. The mean hides whether drift is spread thin or sits in a few "
                    "positions; the few are where a greedy decoder picks another token.</p>\n");
    kvd_svg_lines(b, &ch);
    capped_note(b, KVD_SVG_MAX_SERIES, wanted);
    for (int i = 0; i < n; i++) {
        char s[600];
        if (tail_sentence(&runs[i], s, sizeof s))
            sentence_p(b, "tail", n > 1 ? runs[i].label : NULL, s);
    }
}

/* A mode's hidden-state drift, [layer][64 buckets], each cell over every
 * trace (NaN where the file has none); *maxb: the buckets in use. */
static double *hidden_grid(const kvd_run *r, const char *mode, int L, int *maxb) {
    const long long ctx = kvd_run_max_context(r);
    kvd_pool *pool = calloc((size_t)L * 64, sizeof *pool);
    const kvd_table *t = &r->r.t[KVD_T_LAYER];
    *maxb = 0;
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_layer *x = KVD_ROW(t, kvd_row_layer, j);
        if (strcmp(x->mode, mode) || x->context != ctx || strcmp(x->subset, "all") ||
            strcmp(x->metric, "rel_l2") || x->layer < 0 || x->layer >= L || x->bucket < 0 ||
            x->bucket >= 64)
            continue;
        kvd_pool_add(&pool[(size_t)x->layer * 64 + x->bucket], x->n, x->mean, x->ci95);
        *maxb = x->bucket + 1 > *maxb ? x->bucket + 1 : *maxb;
    }
    double *v = malloc(sizeof(double) * (size_t)L * 64);
    for (int i = 0; i < L * 64; i++) v[i] = kvd_pool_mean(&pool[i]);
    free(pool);
    return v;
}

/* One colour range for every heatmap of the report, so that a colour means
 * the same drift in each: the smallest non-zero and the largest cell. */
static void hidden_range(const kvd_run *runs, int n, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes), L = kvd_run_layers(&runs[i]), maxb;
        for (int m = 0; m < nm && L > 0; m++) {
            if (!strcmp(modes[m], "bf16")) continue;
            double *v = hidden_grid(&runs[i], modes[m], L, &maxb);
            for (int k = 0; k < L * 64; k++)
                if (isfinite(v[k]) && v[k] > 0) *lo = fmin(*lo, v[k]), *hi = fmax(*hi, v[k]);
            free(v);
        }
    }
}

static void hidden_heatmaps(kvd_buf *b, const kvd_run *r, const char *run_label, int many,
                            double lo, double hi) {
    const char *modes[KVD_KV_N_MODES];
    int nm = kvd_run_modes(r, modes), L = kvd_run_layers(r);
    if (L <= 0) return;
    int attn_layer[KVD_MAX_LAYERS] = {0};
    const kvd_table *ta = &r->r.t[KVD_T_ATTN];
    for (int64_t j = 0; j < ta->n; j++) {
        int l = KVD_ROW(ta, kvd_row_attn, j)->layer;
        if (l >= 0 && l < KVD_MAX_LAYERS) attn_layer[l] = 1;
    }
    for (int m = 0; m < nm; m++) {
        if (!strcmp(modes[m], "bf16")) continue;
        int maxb;
        double *v = hidden_grid(r, modes[m], L, &maxb);
        double *dense = malloc(sizeof(double) * (size_t)L * (maxb ? maxb : 1));
        char(*rl)[32] = malloc(sizeof(*rl) * (size_t)L),
        (*cl)[32] = malloc(sizeof(*cl) * (size_t)(maxb ? maxb : 1));
        const char **rlp = malloc(sizeof(char *) * (size_t)L),
                   **clp = malloc(sizeof(char *) * (size_t)(maxb ? maxb : 1));
        for (int l = 0; l < L; l++) {
            /* deepest layer on top */
            int src = L - 1 - l;
            for (int bk = 0; bk < maxb; bk++)
                dense[(size_t)l * maxb + bk] = v[(size_t)src * 64 + bk];
            snprintf(rl[l], sizeof rl[l], "layer %d%s", src, attn_layer[src] ? " (attn)" : "");
            rlp[l] = rl[l];
        }
        int marks[KVD_MAX_LAYERS];
        for (int l = 0; l < L && l < KVD_MAX_LAYERS; l++) marks[l] = attn_layer[L - 1 - l];
        for (int bk = 0; bk < maxb; bk++) {
            snprintf(cl[bk], sizeof cl[bk], "%lld", bk == 0 ? 0LL : 1LL << bk);
            clp[bk] = cl[bk];
        }
        char title[256];
        snprintf(title, sizeof title, "%s%s%s: hidden-state drift by layer and position",
                 many ? run_label : "", many ? " " : "", modes[m]);
        kvd_heatmap h = {title,
                         "first token position of the bucket",
                         "layer",
                         "relative L2 vs bf16",
                         L,
                         maxb,
                         dense,
                         rlp,
                         clp,
                         marks,
                         "full-attention layer",
                         lo,
                         hi};
        kvd_svg_heatmap(b, &h);
        free(v), free(dense), free(rl), free(cl), free(rlp), free(clp);
    }
}

static void attention_bars(kvd_buf *b, const kvd_run *r, const char *label, int many) {
    const char *modes[KVD_KV_N_MODES];
    int nm = kvd_run_modes(r, modes);
    long long ctx = kvd_run_max_context(r);
    int nal = 0, layer_of[KVD_MAX_LAYERS];
    const kvd_table *t = &r->r.t[KVD_T_ATTN];
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_attn *x = KVD_ROW(t, kvd_row_attn, j);
        if (x->attn_layer + 1 > nal && x->attn_layer < KVD_MAX_LAYERS) {
            nal = x->attn_layer + 1;
        }
        if (x->attn_layer < KVD_MAX_LAYERS) layer_of[x->attn_layer] = x->layer;
    }
    if (nal == 0) return;
    static char groups[KVD_MAX_LAYERS][48];
    static const char *gp[KVD_MAX_LAYERS];
    for (int a = 0; a < nal; a++) {
        snprintf(groups[a], sizeof groups[a], "layer %d", layer_of[a]);
        gp[a] = groups[a];
    }
    static char labels[16][64];
    static const char *lp[16];
    double *vals = calloc((size_t)16 * nal, sizeof(double));
    int ns = 0;
    for (int m = 0; m < nm && ns < 15; m++) {
        if (!strcmp(modes[m], "bf16")) continue;
        for (int v = 0; v < 2; v++) {
            const char *view = v ? "propagated" : "isolated";
            snprintf(labels[ns], sizeof labels[ns], "%s %s", modes[m], view);
            lp[ns] = labels[ns];
            for (int a = 0; a < nal; a++)
                vals[(size_t)ns * nal + a] =
                    kvd_run_attn_kl(r, modes[m], ctx, view, "all", a, NULL);
            ns++;
        }
    }
    char title[256];
    snprintf(title, sizeof title,
             "%s%sattention KL per full-attention layer: isolated vs propagated", many ? label : "",
             many ? ": " : "");
    kvd_bar_chart c = {title, "attention KL vs bf16 (nats, log)", 1, nal, ns, gp, lp, vals, NULL};
    kvd_svg_bars(b, &c);
    free(vals);
}

/* Per KV head, for a run that recorded heads (--attn-per-head): the
 * isolated attention KL (each head's own codec error, what per-head scales
 * exist to fix) of every full-attention layer and head at the run's
 * largest context, into grid[mode][layer][head]; the layers' model indices
 * into layer_of. Returns the heads (0: none recorded). */
typedef struct {
    int nal, nh, nm;
    int layer_of[KVD_MAX_LAYERS];
    const char *modes[KVD_KV_N_MODES];
    double *grid; /* [nm][nal][nh] */
} head_grid;

static int head_grid_of(const kvd_run *r, head_grid *g) {
    const long long ctx = kvd_run_max_context(r);
    const kvd_table *t = &r->r.t[KVD_T_ATTN];
    g->nal = g->nh = g->nm = 0;
    g->grid = NULL;
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_attn *x = KVD_ROW(t, kvd_row_attn, j);
        if (x->context != ctx || x->kv_head < 0 || x->attn_layer < 0 ||
            x->attn_layer >= KVD_MAX_LAYERS || x->kv_head >= 1024)
            continue;
        if (x->attn_layer + 1 > g->nal) g->nal = x->attn_layer + 1;
        if (x->kv_head + 1 > g->nh) g->nh = x->kv_head + 1;
        g->layer_of[x->attn_layer] = x->layer;
    }
    if (!g->nh) return 0;
    const char *all[KVD_KV_N_MODES];
    const int na = kvd_run_modes(r, all);
    for (int m = 0; m < na; m++)
        if (strcmp(all[m], "bf16")) g->modes[g->nm++] = all[m];
    g->grid = malloc(sizeof(double) * (size_t)(g->nm ? g->nm : 1) * g->nal * g->nh);
    for (int m = 0; m < g->nm; m++)
        for (int a = 0; a < g->nal; a++)
            for (int h = 0; h < g->nh; h++)
                g->grid[((size_t)m * g->nal + a) * g->nh + h] =
                    attn_kl_head(r, g->modes[m], ctx, "isolated", "all", a, h, NULL);
    return g->nh;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One sentence: per FP8 mode, the (layer, KV head) whose isolated attention
 * KL is largest, and how many times the median head's it is. 0 without
 * heads. */
static int head_sentence(const head_grid *g, char *s, size_t n) {
    int len = 0, k = 0;
    s[0] = 0;
    double *v = malloc(sizeof(double) * (size_t)g->nal * g->nh + 1);
    for (int m = 0; m < g->nm; m++) {
        const double *x = g->grid + (size_t)m * g->nal * g->nh;
        int nv = 0, at = -1;
        for (int c = 0; c < g->nal * g->nh; c++)
            if (isfinite(x[c])) {
                v[nv++] = x[c];
                if (at < 0 || x[c] > x[at]) at = c;
            }
        if (at < 0) continue;
        qsort(v, (size_t)nv, sizeof *v, cmp_double);
        const double med = nv % 2 ? v[nv / 2] : 0.5 * (v[nv / 2 - 1] + v[nv / 2]);
        if (k++ == 0)
            sentence_add(s, n, &len,
                         "The KV head whose own cache error moves attention most "
                         "(isolated attention KL), per mode: ");
        else
            sentence_add(s, n, &len, "; ");
        sentence_add(s, n, &len, "%s, layer %d KV head %d (%.3e nats", g->modes[m],
                     g->layer_of[at / g->nh], at % g->nh, x[at]);
        if (med > 0) sentence_add(s, n, &len, ", %.1fx the median head's", x[at] / med);
        sentence_add(s, n, &len, ")");
    }
    free(v);
    if (k) sentence_add(s, n, &len, ".");
    return k > 0 && len > 0;
}

/* The maps: rows the full-attention layers (deepest on top), columns the KV
 * heads, one colour scale for every mode. */
static void head_heatmaps(kvd_buf *b, const kvd_run *r, const char *label, int many) {
    head_grid g;
    if (!head_grid_of(r, &g)) return;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t c = 0; c < (size_t)g.nm * g.nal * g.nh; c++)
        if (isfinite(g.grid[c]) && g.grid[c] > 0)
            lo = fmin(lo, g.grid[c]), hi = fmax(hi, g.grid[c]);
    char(*rl)[32] = malloc(sizeof(*rl) * (size_t)g.nal), (*cl)[16] = malloc(sizeof(*cl) * g.nh);
    const char **rlp = malloc(sizeof(char *) * (size_t)g.nal),
               **clp = malloc(sizeof(char *) * (size_t)g.nh);
    double *dense = malloc(sizeof(double) * (size_t)g.nal * g.nh);
    for (int a = 0; a < g.nal; a++) {
        snprintf(rl[a], sizeof rl[a], "layer %d", g.layer_of[g.nal - 1 - a]);
        rlp[a] = rl[a];
    }
    for (int h = 0; h < g.nh; h++) {
        snprintf(cl[h], sizeof cl[h], "%d", h);
        clp[h] = cl[h];
    }
    for (int m = 0; m < g.nm; m++) {
        for (int a = 0; a < g.nal; a++)
            for (int h = 0; h < g.nh; h++)
                dense[(size_t)a * g.nh + h] =
                    g.grid[((size_t)m * g.nal + (g.nal - 1 - a)) * g.nh + h];
        char title[256];
        snprintf(title, sizeof title, "%s%s%s: isolated attention KL per layer and KV head",
                 many ? label : "", many ? " " : "", g.modes[m]);
        kvd_heatmap h = {title,
                         "KV head",
                         "full-attention layer",
                         "attention KL (nats)",
                         g.nal,
                         g.nh,
                         dense,
                         rlp,
                         clp,
                         NULL,
                         NULL,
                         lo < hi ? lo : 0,
                         lo < hi ? hi : 0};
        kvd_svg_heatmap(b, &h);
    }
    char s[1600];
    if (head_sentence(&g, s, sizeof s)) {
        kvd_buf_puts(b, "<p class=\"heads\">");
        if (many) {
            kvd_buf_xml(b, label);
            kvd_buf_puts(b, ": ");
        }
        kvd_buf_xml(b, s);
        kvd_buf_puts(b, "</p>\n");
    }
    free(rl), free(cl), free(rlp), free(clp), free(dense), free(g.grid);
}

int kvd_run_moe_layers(const kvd_run *r, long long ctx, int *layer) {
    unsigned char moe[KVD_MAX_LAYERS] = {0};
    const kvd_table *t = &r->r.t[KVD_T_LAYER];
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_layer *x = KVD_ROW(t, kvd_row_layer, j);
        if (x->layer >= 0 && x->layer < KVD_MAX_LAYERS && x->context == ctx &&
            !strcmp(x->metric, "router_flip"))
            moe[x->layer] = 1;
    }
    int n = 0;
    for (int l = 0; l < KVD_MAX_LAYERS; l++)
        if (moe[l]) layer[n++] = l;
    return n;
}

/* What the routing figures of a run read, once: its modes, its largest
 * context and the MoE layers there (nl 0: a dense model). */
typedef struct {
    const char *modes[KVD_KV_N_MODES];
    int nm, nl, layer[KVD_MAX_LAYERS];
    long long ctx;
} routing;

static void routing_of(const kvd_run *r, routing *rt) {
    rt->nm = kvd_run_modes(r, rt->modes);
    rt->ctx = kvd_run_max_context(r);
    rt->nl = kvd_run_moe_layers(r, rt->ctx, rt->layer);
}

/* "Share of (position, MoE layer) pairs whose top-k expert set differs
 * from BF16's: fp8-cal 1.5% (3.7% at layer 7), ..." over every trace; 0
 * for a dense model or a run without FP8 modes */
static int router_sentence(const kvd_run *r, const routing *rt, char *s, size_t n) {
    int len = 0, k = 0;
    sentence_add(s, n, &len,
                 "Share of (position, MoE layer) pairs whose top-k expert set differs from "
                 "BF16's:");
    for (int m = 0; m < rt->nm && rt->nl > 0; m++) {
        const int last = rt->layer[rt->nl - 1];
        const double v = kvd_run_summary(r, rt->modes[m], rt->ctx, "all", "router_flip_rate");
        if (!strcmp(rt->modes[m], "bf16") || !isfinite(v)) continue;
        sentence_add(
            s, n, &len, "%s %s %.2f%% (%.2f%% at layer %d)", k++ ? "," : "", rt->modes[m], 100 * v,
            100 * kvd_run_layer_mean(r, rt->modes[m], rt->ctx, last, "router_flip", NULL), last);
    }
    sentence_add(s, n, &len, ".");
    return k > 0;
}

/* Where the output drift sits against the routing: the share of positions
 * routed to another expert set at some MoE layer, the share of the output
 * KL they carry and their mean KL over the other positions', per FP8 mode,
 * over every trace; 0 without router flips per position (a dense model, a
 * file of schema version 2 or older) */
static int routed_sentence(const kvd_run *r, const routing *rt, char *s, size_t n) {
    int len = 0, k = 0;
    sentence_add(s, n, &len, "Positions routed to another expert set at some MoE layer:");
    for (int m = 0; m < rt->nm && rt->nl > 0; m++) {
        const char *mode = rt->modes[m];
        kvd_paired all, in, out;
        if (!strcmp(mode, "bf16") ||
            !kvd_results_positions(&r->r, mode, rt->ctx, "all", "kl", -1, &all) || !(all.mean > 0))
            continue;
        const int any = kvd_results_positions(&r->r, mode, rt->ctx, "routed", "kl", -1, &in),
                  rest = kvd_results_positions(&r->r, mode, rt->ctx, "unrouted", "kl", -1, &out);
        if (!any && !rest) continue; /* no router flips kept */
        sentence_add(s, n, &len, "%s %s %.1f%% of positions", k++ ? ";" : "", mode,
                     any ? 100 * in.n / all.n : 0.0);
        if (any)
            sentence_add(s, n, &len, " with %.0f%% of the output KL",
                         100 * in.n * in.mean / (all.n * all.mean));
        if (any && rest && out.mean > 0)
            sentence_add(s, n, &len, " (their mean KL %.1fx the rest's)", in.mean / out.mean);
    }
    sentence_add(s, n, &len, ".");
    return k > 0;
}

/* Per MoE layer, the share of positions whose top-k expert set differs
 * from BF16's, per FP8 mode in its colour of the KL chart (color0: the
 * KL chart's series index of the run's first mode). */
static void router_bars(kvd_buf *b, const kvd_run *r, const char *label, int many, int color0) {
    routing rt;
    routing_of(r, &rt);
    const int nl = rt.nl;
    char s[1200];
    if (nl == 0 || !router_sentence(r, &rt, s, sizeof s)) return;
    static char groups[KVD_MAX_LAYERS][16];
    static const char *gp[KVD_MAX_LAYERS];
    for (int g = 0; g < nl; g++) {
        snprintf(groups[g], sizeof groups[g], nl > 16 ? "%d" : "layer %d", rt.layer[g]);
        gp[g] = groups[g];
    }
    const char *lp[KVD_KV_N_MODES];
    int colors[KVD_KV_N_MODES], ns = 0;
    double *vals = calloc((size_t)KVD_KV_N_MODES * nl, sizeof(double));
    for (int m = 0; m < rt.nm && vals; m++) {
        if (!strcmp(rt.modes[m], "bf16")) continue;
        lp[ns] = rt.modes[m];
        colors[ns] = 1 + color0 + m;
        for (int g = 0; g < nl; g++)
            vals[(size_t)ns * nl + g] =
                kvd_run_layer_mean(r, rt.modes[m], rt.ctx, rt.layer[g], "router_flip", NULL);
        ns++;
    }
    char title[256];
    snprintf(title, sizeof title, "%s%sshare of positions routed to another expert set, by layer",
             many ? label : "", many ? ": " : "");
    kvd_bar_chart c = {title, "share of positions (top-k set differs)", 0, nl, ns, gp, lp, vals,
                       colors};
    if (ns) kvd_svg_bars(b, &c);
    sentence_p(b, "routing", NULL, s);
    if (routed_sentence(r, &rt, s, sizeof s)) sentence_p(b, "routed", NULL, s);
    free(vals);
}

static void copy_bars(kvd_buf *b, const kvd_run *runs, int n) {
    static char groups[32][160];
    static const char *gp[32];
    double vals[2 * 32];
    int ng = 0;
    int wanted = 0; /* series the runs have for this chart */
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++) {
            if (!strcmp(modes[m], "bf16") || wanted++ >= 32) continue;
            series_label(groups[ng], sizeof groups[ng], runs, n, i, modes[m]);
            gp[ng] = groups[ng];
            vals[ng] = kvd_run_summary(&runs[i], modes[m], 0, "copy", "kl_mean");
            vals[32 + ng] = kvd_run_summary(&runs[i], modes[m], 0, "other", "kl_mean");
            ng++;
        }
    }
    double v2[2 * 32];
    for (int g = 0; g < ng; g++) v2[g] = vals[g], v2[ng + g] = vals[32 + g];
    static const char *lp[2] = {"tokens that copy earlier content", "other tokens"};
    kvd_bar_chart c = {"output KL on copy positions vs the rest",
                       "next-token KL vs bf16 (nats)",
                       0,
                       ng,
                       2,
                       gp,
                       lp,
                       v2,
                       NULL};
    kvd_svg_bars(b, &c);
    capped_note(b, 32, wanted);
}

static void throughput_charts(kvd_buf *b, const kvd_run *runs, int n) {
    static series_store st, st2;
    kvd_line_chart a = {"decode throughput against concurrency",
                        "concurrency (requests in the batch, log)",
                        "output tokens/s (all requests)",
                        1,
                        0,
                        0,
                        {{0}}};
    kvd_line_chart c = {"inter-token latency against concurrency",
                        "concurrency (requests in the batch, log)",
                        "ITL p50 (ms)",
                        1,
                        0,
                        0,
                        {{0}}};
    int wanted = 0; /* series the runs have for this chart */
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        long long ctx = kvd_run_max_context(&runs[i]);
        int cs[64], nc = concurrencies(&runs[i], ctx, cs);
        for (int m = 0; m < nm; m++) {
            if (wanted++ >= KVD_SVG_MAX_SERIES) continue;
            int s = a.n_series, k = 0;
            for (int j = 0; j < nc && k < 64; j++) {
                const kvd_row_tput *x = tput(&runs[i], modes[m], cs[j], ctx);
                if (!x) continue;
                st.x[s][k] = cs[j], st.y[s][k] = x->decode_tok_s;
                st2.x[s][k] = cs[j], st2.y[s][k] = x->itl_ms_p50;
                k++;
            }
            series_label(st.label[s], sizeof st.label[s], runs, n, i, modes[m]);
            a.series[s] = (kvd_series){st.label[s], k, st.x[s], st.y[s], NULL, NULL, 0, 0};
            c.series[s] = (kvd_series){st.label[s], k, st2.x[s], st2.y[s], NULL, NULL, 0, 0};
            a.n_series++, c.n_series++;
        }
    }
    kvd_svg_lines(b, &a);
    kvd_svg_lines(b, &c);
    capped_note(b, KVD_SVG_MAX_SERIES, wanted);
}

/* Decode tokens/s per context and concurrency, for a run whose throughput
 * cells span several contexts (the charts above are at its largest): each
 * with its ratio to bf16's at the same context and concurrency. */
static void throughput_contexts(kvd_buf *b, const kvd_run *r, const char *label, int named) {
    long long ctx[64];
    int nctx = 0;
    long long all[64];
    const int na = kvd_run_contexts(r, all, 64);
    for (int k = 0; k < na; k++) {
        int cs[64];
        if (concurrencies(r, all[k], cs) > 0) ctx[nctx++] = all[k];
    }
    if (nctx < 2) return;
    int cs[64];
    const int nc = concurrencies(r, 0, cs); /* every level at any of the contexts */
    kvd_buf_puts(b, "<p class=\"note\">Decode tokens/s per context");
    if (named) {
        kvd_buf_puts(b, " (");
        kvd_buf_xml(b, label);
        kvd_buf_puts(b, ")");
    }
    kvd_buf_puts(b, ", in parentheses against bf16 at the same context and concurrency:</p>\n"
                    "<table class=\"tput-contexts\"><tr><th class=\"l\">KV mode</th>"
                    "<th>context</th>");
    for (int j = 0; j < nc; j++) kvd_buf_printf(b, "<th>C=%d</th>", cs[j]);
    kvd_buf_puts(b, "</tr>\n");
    const char *modes[KVD_KV_N_MODES];
    const int nm = kvd_run_modes(r, modes);
    for (int m = 0; m < nm; m++)
        for (int k = 0; k < nctx; k++) {
            kvd_buf_printf(b, "<tr><td class=\"l\">%s</td><td>%lld</td>", modes[m], ctx[k]);
            for (int j = 0; j < nc; j++) {
                const kvd_row_tput *x = tput(r, modes[m], cs[j], ctx[k]),
                                   *y = tput(r, "bf16", cs[j], ctx[k]);
                if (!x)
                    kvd_buf_puts(b, "<td>-</td>");
                else if (y && y->decode_tok_s > 0 && strcmp(modes[m], "bf16"))
                    kvd_buf_printf(b, "<td>%.1f (%.2fx)</td>", x->decode_tok_s,
                                   x->decode_tok_s / y->decode_tok_s);
                else
                    kvd_buf_printf(b, "<td>%.1f</td>", x->decode_tok_s);
            }
            kvd_buf_puts(b, "</tr>\n");
        }
    kvd_buf_puts(b, "</table>\n");
}

static void tradeoff_chart(kvd_buf *b, const kvd_run *runs, int n) {
    static series_store st;
    kvd_line_chart ch = {"accuracy against capacity",
                         "tokens of KV cache per GiB (log)",
                         "next-token KL vs bf16 (nats)",
                         1,
                         0,
                         0,
                         {{0}}};
    int wanted = 0; /* series the runs have for this chart */
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        long long ctx = kvd_run_max_context(&runs[i]);
        int cs[64], nc = concurrencies(&runs[i], ctx, cs);
        for (int m = 0; m < nm; m++) {
            const kvd_row_tput *x = nc ? tput(&runs[i], modes[m], cs[0], ctx) : NULL;
            if (!x || wanted++ >= KVD_SVG_MAX_SERIES) continue;
            int s = ch.n_series;
            st.x[s][0] = 1073741824.0 / x->kv_bytes_per_token;
            st.y[s][0] = kvd_run_summary(&runs[i], modes[m], ctx, "all", "kl_mean");
            series_label(st.label[s], sizeof st.label[s], runs, n, i, modes[m]);
            ch.series[s] = (kvd_series){st.label[s], 1, st.x[s], st.y[s], NULL, NULL, 1, 0};
            ch.n_series++;
        }
    }
    kvd_svg_lines(b, &ch);
    capped_note(b, KVD_SVG_MAX_SERIES, wanted);
}

static void kv_table(kvd_buf *b, const kvd_run *r) {
    long long ctx = kvd_run_max_context(r);
    kvd_buf_puts(
        b, "<table class=\"kv\"><tr><th class=\"l\">KV mode</th><th>layer</th><th>KV head</th>"
           "<th>k_scale</th><th>v_scale</th><th>K saturated</th><th>K flushed to 0</th>"
           "<th>K subnormal</th><th>V saturated</th><th>V flushed to 0</th>"
           "<th>V subnormal</th></tr>\n");
    const kvd_table *t = &r->r.t[KVD_T_KV];
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_kv *x = KVD_ROW(t, kvd_row_kv, j);
        if (x->context != ctx || !strcmp(x->mode, "bf16")) continue;
        /* one row per layer and head, its shares over every trace (weighted
         * by the values written): at the key's first row, the rest skipped */
        int seen = 0;
        for (int64_t i = 0; i < j && !seen; i++) {
            const kvd_row_kv *y = KVD_ROW(t, kvd_row_kv, i);
            seen = y->context == ctx && y->layer == x->layer && y->kv_head == x->kv_head &&
                   !strcmp(y->mode, x->mode);
        }
        if (seen) continue;
        double f[6];
        kvd_results_kv_fracs(&r->r, x->mode, ctx, x->layer, x->kv_head, f);
        for (int k = 0; k < 6; k++) f[k] *= 100;
        kvd_buf_printf(b,
                       "<tr><td class=\"l\">%s</td><td>%d</td><td>%d</td><td>%.4g</td><td>%.4g</td>"
                       "<td>%.3f%%</td><td>%.3f%%</td><td>%.3f%%</td><td>%.3f%%</td><td>%.3f%%</td>"
                       "<td>%.3f%%</td></tr>\n",
                       x->mode, x->layer, x->kv_head, x->k_scale, x->v_scale, f[0], f[1], f[2],
                       f[3], f[4], f[5]);
    }
    kvd_buf_puts(b, "</table>\n");
}

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_ll(const void *a, const void *b) {
    const long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Greedy continuation against BF16's, per prefix of the context: how many
 * generated tokens agree before the first that differs (the median over
 * traces; all of them when none differs) and the share of positions that
 * agree (the mean), under a heading. Nothing when the run generated nothing. */
static void generation_table(kvd_buf *b, const kvd_run *r) {
    const kvd_table *t = &r->r.t[KVD_T_GEN];
    const long long ctx = kvd_run_max_context(r);
    long long prefix[8];
    int np = 0;
    for (int64_t j = 0; j < t->n; j++) {
        const kvd_row_gen *x = KVD_ROW(t, kvd_row_gen, j);
        if (x->context != ctx || x->tokens <= 0) continue;
        int k = 0;
        while (k < np && prefix[k] != x->prefix) k++;
        if (k == np && np < 8) prefix[np++] = x->prefix;
    }
    if (!np) return;
    kvd_buf_puts(b, "<h2>Greedy continuation against BF16: ");
    kvd_buf_xml(b, r->label);
    kvd_buf_puts(b, "</h2>\n");
    qsort(prefix, (size_t)np, sizeof prefix[0], cmp_ll);
    kvd_buf_puts(b, "<table class=\"gen\"><tr><th class=\"l\">KV mode</th>");
    for (int k = 0; k < np; k++)
        kvd_buf_printf(b, "<th>from %lld of %lld tokens</th>", prefix[k], ctx);
    kvd_buf_puts(b, "</tr>\n");
    const char *modes[KVD_KV_N_MODES];
    int nm = kvd_run_modes(r, modes), traces = 0; /* the most traces a cell pools */
    for (int m = 0; m < nm; m++) {
        if (!strcmp(modes[m], "bf16")) continue;
        kvd_buf_printf(b, "<tr><td class=\"l\">%s</td>", modes[m]);
        for (int k = 0; k < np; k++) {
            int nt = 0, tokens = 0, *fd = malloc(sizeof(int) * (size_t)t->n);
            double agree = 0;
            for (int64_t j = 0; j < t->n; j++) {
                const kvd_row_gen *x = KVD_ROW(t, kvd_row_gen, j);
                if (x->context != ctx || x->prefix != prefix[k] || strcmp(x->mode, modes[m]) ||
                    x->tokens <= 0)
                    continue;
                fd[nt++] = x->first_divergence, tokens = x->tokens, agree += x->agree_rate;
            }
            if (!nt) {
                kvd_buf_puts(b, "<td>-</td>");
                free(fd);
                continue;
            }
            traces = nt > traces ? nt : traces;
            qsort(fd, (size_t)nt, sizeof fd[0], cmp_int);
            const double med = nt % 2 ? fd[nt / 2] : 0.5 * (fd[nt / 2 - 1] + fd[nt / 2]);
            char first[48];
            if (med >= tokens)
                snprintf(first, sizeof first, "all %d", tokens);
            else
                snprintf(first, sizeof first, "%g of %d", med, tokens);
            kvd_buf_printf(b, "<td>%s, %.0f%% agree</td>", first, 100 * agree / nt);
            free(fd);
        }
        kvd_buf_puts(b, "</tr>\n");
    }
    kvd_buf_printf(b,
                   "</table>\n<p class=\"note\">Each mode and BF16 continue greedily from the same "
                   "prefix of the trace, each on its own tokens: the tokens that agree before the "
                   "first that differs%s, and the share of positions where the two agree%s.</p>\n",
                   traces > 1 ? " (the median over traces)" : "", traces > 1 ? " (the mean)" : "");
}

/* What a checkpoint run's audit (checkpoint_audit) says of the KV cache
 * the checkpoint asks for, in one sentence for the verdict table; 0 when
 * the run is not over a checkpoint. */
static int ckpt_sentence(const kvd_run *r, char *out, size_t n) {
    json_t *a = r->r.ckpt_audit ? json_loads(r->r.ckpt_audit, 0, NULL) : NULL;
    if (!a) return 0;
    const char *kv = json_string_value(json_object_get(a, "kv_cache_quantization"));
    const char *src = json_string_value(json_object_get(a, "quant_config_source"));
    const char *ones = json_string_value(json_object_get(a, "fp8_kv_scales_all_one"));
    const char *bad = json_string_value(json_object_get(a, "bad_kv_scale"));
    json_t *miss = json_object_get(a, "layers_missing_kv_scales"),
           *rg = json_object_get(a, "kv_scale_range");
    char ask[200], fmt_kv[48];
    const int kind = kvd_kv_algo_kind(kv ? kv : "none");
    const char *ckm = kvd_kv_algo_ckpt_mode(kind); /* the mode that runs its cache */
    snprintf(fmt_kv, sizeof fmt_kv, "a%s %s", kv && strchr("AEFHILMNORSX", kv[0]) ? "n" : "",
             kv ? kv : "");
    snprintf(ask, sizeof ask, "%s: the checkpoint asks for %s KV cache (%s)", r->label,
             kind == KVD_KV_ALGO_FP8     ? "an FP8"
             : kind == KVD_KV_ALGO_NVFP4 ? "an NVFP4"
             : kind == KVD_KV_ALGO_OTHER ? fmt_kv
                                         : "no quantized",
             !src || !strcmp(src, "none") ? "no quantization config" : src);
    if (kind == KVD_KV_ALGO_OTHER) {
        snprintf(out, n,
                 "%s, a format kvdrift does not model: fp8-ckpt is an FP8 cache with the "
                 "checkpoint's k_scale/v_scale, not the cache an engine would run.",
                 ask);
    } else if (kind == KVD_KV_ALGO_NONE) {
        snprintf(out, n, "%s; fp8-ckpt uses its k_scale/v_scale where it has them, 1.0 elsewhere.",
                 ask);
    } else if (json_array_size(miss)) {
        size_t k = (size_t)snprintf(out, n, "%s without k_scale/v_scale in layers", ask);
        for (size_t i = 0; i < json_array_size(miss) && k < n; i++)
            k += (size_t)snprintf(out + k, n - k, "%s %lld", i ? "," : "",
                                  (long long)json_integer_value(json_array_get(miss, i)));
        if (k < n)
            snprintf(out + k, n - k, ": an engine uses 1.0 there, as %s does (the silent failure).",
                     ckm);
    } else if (bad && bad[0]) {
        snprintf(out, n, "%s with an unusable scale (%s).", ask, bad);
    } else if (ones && ones[0]) { /* "k", "v" or "kv" */
        const char *side =
            kvd_audit_sides((strchr(ones, 'k') != NULL) | (strchr(ones, 'v') != NULL) << 1);
        snprintf(out, n,
                 "%s; every %s scale it carries is 1.0 (ModelOpt clamps KV scales to at least "
                 "1.0): %s, what an engine runs, writes %s as without scales.",
                 ask, side, ckm, side);
    } else {
        json_t *k = json_object_get(rg, "k"), *v = json_object_get(rg, "v");
        snprintf(out, n, "%s with its own scales (K %.4g to %.4g, V %.4g to %.4g): %s uses them.",
                 ask, json_real_value(json_array_get(k, 0)), json_real_value(json_array_get(k, 1)),
                 json_real_value(json_array_get(v, 0)), json_real_value(json_array_get(v, 1)), ckm);
    }
    json_decref(a);
    return 1;
}

enum { HEADLINE_MAX = KVD_HEADLINE_MAX, HEADLINE_LEN = KVD_HEADLINE_LEN };

/* How far apart two figures are, in standard errors of their difference
 * (z >= 0, finite): "0.6 standard errors apart: within the error". */
static void apart_words(char *s, size_t n, int *len, double z) {
    if (z < 2) /* 1.97 is not "2.0": under 2 */
        sentence_add(s, n, len, "%.1f standard errors apart: within the error", floor(10 * z) / 10);
    else
        sentence_add(s, n, len, "%.0f standard errors apart", z);
}

/* The same as a parenthesis after the figures; nothing without an error to
 * weigh by. */
static void apart(char *s, size_t n, int *len, double z) {
    if (!isfinite(z)) return;
    sentence_add(s, n, len, " (");
    apart_words(s, n, len, z);
    sentence_add(s, n, len, ")");
}

int kvd_report_headline(const kvd_run *r, char s[KVD_HEADLINE_MAX][KVD_HEADLINE_LEN]) {
    static const char *const others[HEADLINE_MAX] = {
        "fp8-unscaled", "fp8-ckpt",   "fp8-e5m2",      "nvfp4-cal", "nvfp4-unscaled",
        "fp8-token",    "int8-token", "int8-token-rn", "int4-token"};
    int k = 0, moe[KVD_MAX_LAYERS];
    const long long ctx = kvd_run_max_context(r);
    const int nl = kvd_run_moe_layers(r, ctx, moe);
    /* a mode the run lacks has no mean KL (NaN) */
    const verdict c = kvd_run_verdict(r, "fp8-cal", ctx);
    if (!(c.kl > 0)) return 0;
    const double c99 = kvd_run_summary(r, "fp8-cal", ctx, "all", "kl_p99"),
                 crt = kvd_run_summary(r, "fp8-cal", ctx, "all", "router_flip_rate");
    const verdict nc = kvd_run_verdict(r, "nvfp4-cal", ctx); /* nvfp4-unscaled's second base */
    for (int o = 0; o < HEADLINE_MAX; o++) {
        const verdict v = kvd_run_verdict(r, others[o], ctx);
        if (!isfinite(v.kl)) continue;
        /* paired over the same positions when the file keeps them: what
         * the two modes share (the same tokens, the same hard predictions)
         * is no error of their difference */
        kvd_paired pd;
        const int paired =
            kvd_results_paired(&r->r, "fp8-cal", &r->r, others[o], ctx, "all", "kl", -1, &pd);
        const double se = paired ? pd.se : sqrt(v.kl_err * v.kl_err + c.kl_err * c.kl_err),
                     z = se > 0 ? fabs(v.kl - c.kl) / se : NAN, ratio = v.kl / c.kl;
        char *h = s[k];
        int len = 0;
        sentence_add(h, HEADLINE_LEN, &len, "%s ", others[o]);
        if (paired && pd.mean == 0 && pd.se == 0) /* e.g. a checkpoint's scales that are
                                                     fp8-cal's own */
            sentence_add(h, HEADLINE_LEN, &len,
                         "drifts exactly as fp8-cal does: the same KL at every position (mean "
                         "output KL %.3e)",
                         v.kl);
        else if (isfinite(z) && z < 2)
            sentence_add(h, HEADLINE_LEN, &len,
                         "drifts as far as fp8-cal within the error (mean output KL %.3e against "
                         "%.3e, %.1f standard errors apart)",
                         v.kl, c.kl, floor(10 * z) / 10);
        else if (isfinite(z))
            sentence_add(h, HEADLINE_LEN, &len,
                         "drifts %.2gx as far as fp8-cal (mean output KL %.3e against %.3e, %.0f "
                         "standard errors apart)",
                         ratio, v.kl, c.kl, z);
        else /* no error to weigh the difference by */
            sentence_add(h, HEADLINE_LEN, &len,
                         "drifts %.2gx as far as fp8-cal (mean output KL %.3e against %.3e)", ratio,
                         v.kl, c.kl);
        /* the tail: a mean can hide drift that sits in a few positions */
        const double v99 = kvd_run_summary(r, others[o], ctx, "all", "kl_p99");
        if (isfinite(v99) && isfinite(c99)) {
            sentence_add(h, HEADLINE_LEN, &len, "; 99th-percentile KL %.3e against %.3e", v99, c99);
            const double se99 = kvd_results_percentile_paired_se(&r->r, "fp8-cal", &r->r, others[o],
                                                                 ctx, "all", 0.99);
            apart(h, HEADLINE_LEN, &len, se99 > 0 ? fabs(v99 - c99) / se99 : NAN);
        }
        sentence_add(h, HEADLINE_LEN, &len, "; top-1 agreement %.4f against %.4f", v.top1, c.top1);
        /* an NVFP4 cache without scales against NVFP4's calibrated one */
        if (!strcmp(others[o], "nvfp4-unscaled") && nc.kl > 0) {
            kvd_paired np;
            const int pn =
                kvd_results_paired(&r->r, "nvfp4-cal", &r->r, others[o], ctx, "all", "kl", -1, &np);
            const double nse = pn ? np.se : sqrt(v.kl_err * v.kl_err + nc.kl_err * nc.kl_err);
            sentence_add(h, HEADLINE_LEN, &len, "; against nvfp4-cal %.2gx (mean output KL %.3e",
                         v.kl / nc.kl, nc.kl);
            if (nse > 0) {
                sentence_add(h, HEADLINE_LEN, &len, ", ");
                apart_words(h, HEADLINE_LEN, &len, fabs(v.kl - nc.kl) / nse);
            }
            sentence_add(h, HEADLINE_LEN, &len, ")");
        }
        /* routing: a different expert set is a different computation from
         * there on */
        const double vrt = kvd_run_summary(r, others[o], ctx, "all", "router_flip_rate");
        if (nl > 0 && isfinite(vrt) && isfinite(crt)) {
            sentence_add(h, HEADLINE_LEN, &len,
                         "; experts rerouted at %.2f%% of (position, MoE layer) pairs against "
                         "%.2f%%",
                         100 * vrt, 100 * crt);
            kvd_paired rp;
            if (kvd_results_paired(&r->r, "fp8-cal", &r->r, others[o], ctx, "all", "router_flips",
                                   -1, &rp))
                apart(h, HEADLINE_LEN, &len, rp.se > 0 ? fabs(vrt - crt) / (rp.se / nl) : NAN);
        }
        if (isfinite(v.k_sat) && isfinite(c.k_sat))
            sentence_add(h, HEADLINE_LEN, &len,
                         "; K saturated %.3f%% against %.3f%%, V flushed to zero %.3f%% against "
                         "%.3f%%",
                         100 * v.k_sat, 100 * c.k_sat, 100 * v.v_flush, 100 * c.v_flush);
        sentence_add(h, HEADLINE_LEN, &len, ".");
        k++;
    }
    return k;
}

int kvd_run_attn_fp8(const kvd_run *r) {
    json_t *j = kvd_settings_parse(r->r.settings);
    const int on = json_is_true(json_object_get(j, "attn-fp8"));
    json_decref(j);
    return on;
}
const char *const kvd_attn_fp8_text =
    "the E4M3 modes computed attention in FP8, as FlashAttention 3 does over an FP8 cache "
    "(--attn-fp8): the query in E4M3 with q scales (fp8-cal's calibrated, fp8-ckpt's the "
    "checkpoint's where it carries them, else 1.0) and the softmax weights rounded to E4M3; "
    "bf16, fp8-e5m2, the per-token modes (scales per token, which FlashAttention 3 does not "
    "take) and the nvfp4 modes compute as without.";

int kvd_run_fp8_nan(const kvd_run *r) {
    json_t *j = kvd_settings_parse(r->r.settings);
    const json_t *v = json_object_get(j, "fp8-saturate");
    const int on = json_is_false(v);
    json_decref(j);
    return on;
}
const char *const kvd_fp8_nan_text =
    "the FP8 caches were written as a cast without a clamp writes them (--fp8-overflow nan): "
    "an E4M3 value past 464 was stored as NaN, an E5M2 one past 61440 as infinity, where the "
    "engines' write kernels saturate; a cell whose activations turned non-finite has no "
    "figures.";

/* ---- drift against context length ----
 * The rest of the report is at each run's largest context; a sweep over
 * several (--context 4096,32768,131072) asks how the drift grows with it.
 * Traces of other lengths are other tokens, so the means at two contexts
 * have independent errors. */

enum { MAX_CONTEXTS = 64 };

/* The contexts at which a run has a mode's mean output KL, ascending. */
static int drift_contexts(const kvd_run *r, const char *mode, long long *ctx) {
    long long all[MAX_CONTEXTS];
    const int na = kvd_run_contexts(r, all, MAX_CONTEXTS);
    int n = 0;
    for (int k = 0; k < na; k++)
        if (isfinite(kvd_run_summary(r, mode, all[k], "all", "kl_mean"))) ctx[n++] = all[k];
    return n;
}

/* Whether some run measured some mode's drift at more than one context. */
static int several_contexts(const kvd_run *runs, int n) {
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        long long ctx[MAX_CONTEXTS];
        const int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++)
            if (drift_contexts(&runs[i], modes[m], ctx) > 1) return 1;
    }
    return 0;
}

/* A mode's mean output KL at one context against its shortest context's:
 * the ratio and how many standard errors apart ("-" at the shortest). */
static void vs_shortest(char *s, size_t n, const verdict *v, const verdict *v0, long long ctx,
                        long long ctx0) {
    if (ctx == ctx0 || !(v0->kl > 0) || !isfinite(v->kl)) {
        snprintf(s, n, "-");
        return;
    }
    const double e = sqrt(v->kl_err * v->kl_err + v0->kl_err * v0->kl_err),
                 z = e > 0 ? fabs(v->kl - v0->kl) / e : NAN;
    if (isfinite(z))
        snprintf(s, n, "%.2fx (%.1f se)", v->kl / v0->kl, floor(10 * z) / 10);
    else
        snprintf(s, n, "%.2fx", v->kl / v0->kl);
}

/* One sentence per run: each FP8 mode's mean output KL from the shortest
 * context to the longest, the ratio, and whether the change is outside
 * the error. 0 when the run has one context. */
static int context_sentence(const kvd_run *r, char *s, size_t n) {
    const char *modes[KVD_KV_N_MODES];
    const int nm = kvd_run_modes(r, modes);
    int len = 0, k = 0;
    s[0] = 0;
    for (int m = 0; m < nm; m++) {
        long long ctx[MAX_CONTEXTS];
        const int nc = drift_contexts(r, modes[m], ctx);
        if (!strcmp(modes[m], "bf16") || nc < 2) continue;
        const verdict a = kvd_run_verdict(r, modes[m], ctx[0]),
                      z = kvd_run_verdict(r, modes[m], ctx[nc - 1]);
        if (k++ == 0)
            sentence_add(s, n, &len, "From %lld to %lld tokens the mean output KL goes from",
                         ctx[0], ctx[nc - 1]);
        else
            sentence_add(s, n, &len, "; from");
        sentence_add(s, n, &len, " %.3e to %.3e for %s", a.kl, z.kl, modes[m]);
        const double e = sqrt(a.kl_err * a.kl_err + z.kl_err * z.kl_err),
                     d = e > 0 ? fabs(z.kl - a.kl) / e : NAN;
        if (a.kl > 0) {
            sentence_add(s, n, &len, " (%.2fx", z.kl / a.kl);
            if (isfinite(d)) {
                sentence_add(s, n, &len, ", ");
                apart_words(s, n, &len, d);
            }
            sentence_add(s, n, &len, ")");
        }
    }
    if (k) sentence_add(s, n, &len, ".");
    return k > 0 && len > 0;
}

static void context_chart(kvd_buf *b, const kvd_run *runs, int n) {
    static series_store st;
    kvd_line_chart ch = {"mean next-token KL against context length, with its 95% band",
                         "context (tokens, log scale)",
                         "mean next-token KL vs bf16 (nats, log)",
                         1,
                         1,
                         0,
                         {{0}}};
    int wanted = 0, color = 0; /* colour: the mode's in the charts by position */
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        const int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++, color++) {
            long long ctx[MAX_CONTEXTS];
            const int nc = drift_contexts(&runs[i], modes[m], ctx);
            if (!strcmp(modes[m], "bf16") || nc == 0 || wanted++ >= KVD_SVG_MAX_SERIES) continue;
            const int s = ch.n_series;
            int k = 0;
            for (int c = 0; c < nc && k < 64; c++) {
                const verdict v = kvd_run_verdict(&runs[i], modes[m], ctx[c]);
                const double ci = isfinite(v.kl_err) ? 1.959963984540054 * v.kl_err : 0;
                st.x[s][k] = (double)ctx[c], st.y[s][k] = v.kl;
                st.lo[s][k] = v.kl - ci, st.hi[s][k] = v.kl + ci;
                k++;
            }
            series_label(st.label[s], sizeof st.label[s], runs, n, i, modes[m]);
            ch.series[s] = (kvd_series){st.label[s], k,        st.x[s], st.y[s],
                                        st.lo[s],    st.hi[s], nc == 1, 1 + color};
            ch.n_series++;
        }
    }
    kvd_svg_lines(b, &ch);
    capped_note(b, KVD_SVG_MAX_SERIES, wanted);
}

/* Every FP8 mode's verdict figures at every context it has, HTML or
 * Markdown (md). */
static void context_table(kvd_buf *b, const kvd_run *runs, int n, int md) {
    if (md)
        kvd_buf_puts(b, "| run | KV mode | context | output KL (nats) | against the shortest "
                        "context | 99th-percentile KL | top-1 agreement | ln(PPL ratio) | "
                        "attention KL | K saturated / V flushed to 0 | decode vs bf16 | verdict "
                        "|\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                        "| ---: | --- |\n");
    else
        kvd_buf_puts(b, "<table class=\"contexts\"><tr><th class=\"l\">run</th><th "
                        "class=\"l\">KV mode</th><th>context</th><th>output KL (nats)</th>"
                        "<th>against the shortest context</th><th>99th-percentile KL</th>"
                        "<th>top-1 agreement</th><th>ln(PPL ratio)</th><th>attention KL</th>"
                        "<th>K saturated / V flushed to 0</th><th>decode speed vs bf16</th>"
                        "<th class=\"l\">verdict</th></tr>\n");
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        const int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++) {
            long long ctx[MAX_CONTEXTS];
            const int nc = drift_contexts(&runs[i], modes[m], ctx);
            if (!strcmp(modes[m], "bf16") || nc == 0) continue;
            const verdict v0 = kvd_run_verdict(&runs[i], modes[m], ctx[0]);
            for (int c = 0; c < nc; c++) {
                const verdict v = kvd_run_verdict(&runs[i], modes[m], ctx[c]);
                const verdict_text t = verdict_fmt(&v);
                char rel[48], p99[32], dec[48];
                vs_shortest(rel, sizeof rel, &v, &v0, ctx[c], ctx[0]);
                fmt(p99, sizeof p99, kvd_run_summary(&runs[i], modes[m], ctx[c], "all", "kl_p99"),
                    "%.3e");
                if (v.conc)
                    snprintf(dec, sizeof dec, "%s (C=%d)", t.dec, v.conc);
                else
                    snprintf(dec, sizeof dec, "-");
                const char *w = verdict_word(v.kl);
                if (md) {
                    kvd_buf_printf(b,
                                   "| %s | %s | %lld | %s ± %s | %s | %s | %s | %s | %s | %s | %s "
                                   "| %s |\n",
                                   runs[i].label, modes[m], ctx[c], t.kl, t.kl_err, rel, p99,
                                   t.top1, t.ln_ppl, t.attn_kl, t.lost, dec, w);
                    continue;
                }
                kvd_buf_puts(b, "<tr><td class=\"l\">");
                kvd_buf_xml(b, runs[i].label);
                kvd_buf_printf(b,
                               "</td><td class=\"l\">%s</td><td>%lld</td><td>%s &#177; %s</td>"
                               "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                               "<td>%s</td><td class=\"l %s\">%s</td></tr>\n",
                               modes[m], ctx[c], t.kl, t.kl_err, rel, p99, t.top1, t.ln_ppl,
                               t.attn_kl, t.lost, dec, w, w);
            }
        }
    }
    if (!md) kvd_buf_puts(b, "</table>\n");
}

static const char *const context_note =
    "Each context's figures are over its own traces (a trace's tokens depend on its length), "
    "so the standard errors of two contexts' means combine as independent ones. bf16 is the "
    "reference: zero at every context.";

/* The section, when some run measured drift at more than one context. */
static void context_section_html(kvd_buf *b, const kvd_run *runs, int n) {
    if (!several_contexts(runs, n)) return;
    kvd_buf_puts(b, "<h2>Drift against context length</h2>\n");
    context_chart(b, runs, n);
    context_table(b, runs, n, 0);
    kvd_buf_printf(b,
                   "<p class=\"note\">%s The sections below are at each run's largest "
                   "context.</p>\n",
                   context_note);
    for (int i = 0; i < n; i++) {
        char s[1600];
        if (!context_sentence(&runs[i], s, sizeof s)) continue;
        kvd_buf_puts(b, "<p>");
        if (n > 1) {
            kvd_buf_xml(b, runs[i].label);
            kvd_buf_puts(b, ": ");
        }
        kvd_buf_xml(b, s);
        kvd_buf_puts(b, "</p>\n");
    }
}

static void context_section_md(kvd_buf *b, const kvd_run *runs, int n) {
    if (!several_contexts(runs, n)) return;
    kvd_buf_puts(b, "\n### Drift against context length\n\n");
    context_table(b, runs, n, 1);
    kvd_buf_printf(b, "\n%s\n", context_note);
    for (int i = 0; i < n; i++) {
        char s[1600];
        if (context_sentence(&runs[i], s, sizeof s))
            kvd_buf_printf(b, "\n%s%s%s\n", n > 1 ? runs[i].label : "", n > 1 ? ": " : "", s);
    }
}

/* Speeds a CPU run measures, for what they are, between lead and tail:
 * nothing when no CPU run has them; when a GPU run measured some too, which
 * runs the note is about. */
static int timed_on(const kvd_run *r, const char *backend) {
    return r->r.t[KVD_T_TPUT].n > 0 && !strcmp(r->r.backend, backend);
}
static int cpu_speeds(const kvd_run *r) {
    return timed_on(r, "cpu");
}
/* Whether any of the runs (those timed on the device only, with cuda) has
 * a mode whose cache format fmt_is holds. */
static int is_nvfp4(int f) {
    return f == KVD_FMT_NVFP4;
}
static int is_int4(int f) {
    return f == KVD_FMT_I4T;
}
static int runs_have(const kvd_run *runs, int n, int (*fmt_is)(int), int cuda) {
    for (int i = 0; i < n; i++) {
        if (cuda && !timed_on(&runs[i], "cuda")) continue;
        const char *modes[KVD_KV_N_MODES];
        const int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++) {
            kvd_kv_mode mode;
            if (!kvd_kv_mode_parse(modes[m], &mode) && fmt_is(kvd_kv_mode_fmt(mode))) return 1;
        }
    }
    return 0;
}
/* The model's head_dim as its run recorded it (the model's config.json;
 * Qwen3-Next's 256 where it says none). */
static int run_head_dim(const kvd_run *r) {
    json_t *c = r->r.model_json ? json_loads(r->r.model_json, 0, NULL) : NULL;
    const json_t *hd = c ? json_object_get(c, "head_dim") : NULL;
    const int v = json_is_integer(hd) ? (int)json_integer_value(hd) : 256;
    json_decref(c);
    return v;
}
/* Whether a run timed on the device decoded an NVFP4 mode on the FP32
 * cores: the tensor-core decode reads NVFP4 from head_dim 128 on only
 * (kvd_fmt_decode_tc). */
static int nvfp4_decode_fp32(const kvd_run *runs, int n) {
    for (int i = 0; i < n; i++)
        if (runs_have(&runs[i], 1, is_nvfp4, 1) &&
            !kvd_fmt_decode_tc(KVD_FMT_NVFP4, run_head_dim(&runs[i])))
            return 1;
    return 0;
}

/* What the verdict's shares and the KV table's scales mean in the modes
 * that are not per-tensor FP8, where a run has them: an NVFP4 mode's V
 * flushed to zero (for FP8 a large share is the sign of a missing scale,
 * for NVFP4 it is the format), the per-token modes' scales, and, for runs
 * timed on the device at a head_dim under 128, that the NVFP4 modes
 * decode on the FP32 cores.
 * Between lead and tail; nothing without such a mode. */
static void mode_notes(kvd_buf *b, const kvd_run *runs, int n, const char *lead, const char *tail) {
    if (runs_have(runs, n, is_nvfp4, 0)) {
        kvd_buf_puts(b, lead);
        kvd_buf_puts(b, "The nvfp4 modes are NVFP4 caches: E2M1 values under an E4M3 scale per "
                        "16. E2M1 holds nothing under a 24th of its group's largest value, so "
                        "several percent of their values flush to zero at any scale: there, "
                        "unlike FP8's, the share is the format's, not the sign of a missing "
                        "scale.");
        kvd_buf_puts(b, tail);
    }
    if (runs_have(runs, n, kvd_fmt_row_scaled, 0)) {
        kvd_buf_puts(b, lead);
        kvd_buf_puts(b, "The -token modes give each row (a token's K or V of one KV head) its own "
                        "scale as it is written, as vLLM's fp8_per_token_head and "
                        "int8_per_token_head caches do: they need neither calibration nor a "
                        "checkpoint's scales, and their scales in the KV table are 1.0 (each "
                        "row's own is in the cache). int8-token truncates toward zero as vLLM's "
                        "write does; int8-token-rn rounds.");
        kvd_buf_puts(b, tail);
    }
    if (runs_have(runs, n, is_int4, 0)) {
        kvd_buf_puts(b, lead);
        kvd_buf_puts(b, "int4-token rotates each row by a randomized Hadamard transform before it "
                        "stores it as INT4 codes with a zero point and a scale of its own, as "
                        "vLLM's int4_per_token_head cache does: attention rotates the query the "
                        "same way and its output back, each rounded to BF16. The rotation "
                        "spreads the key outlier channels over every dimension.");
        if (runs_have(runs, n, is_int4, 1))
            kvd_buf_puts(b, " On the device it decodes and prefills on kvdrift's FP32-core "
                            "attention kernels: its speeds there are kvdrift's, not an engine's.");
        kvd_buf_puts(b, tail);
    }
    if (nvfp4_decode_fp32(runs, n)) {
        kvd_buf_puts(b, lead);
        kvd_buf_puts(b, "On the device the nvfp4 modes decode on kvdrift's FP32-core attention "
                        "kernels at this model's head_dim (its tensor-core decode reads NVFP4 "
                        "from head_dim 128 on, as its prefill does at every head_dim): their "
                        "decode speeds there are kvdrift's, not an engine's.");
        kvd_buf_puts(b, tail);
    }
}

static void cpu_speed_note(kvd_buf *b, const kvd_run *runs, int n, int html, const char *lead,
                           const char *tail) {
    int cpu = 0, other = 0;
    for (int i = 0; i < n; i++) {
        cpu += cpu_speeds(&runs[i]);
        other += runs[i].r.t[KVD_T_TPUT].n > 0 && !cpu_speeds(&runs[i]);
    }
    if (!cpu) return;
    kvd_buf_puts(b, lead);
    if (!other) {
        kvd_buf_puts(b, "Speeds are the CPU back end's");
    } else {
        kvd_buf_puts(b, "The speeds of ");
        for (int i = 0, k = 0; i < n; i++) {
            if (!cpu_speeds(&runs[i])) continue;
            kvd_buf_puts(b, k == 0 ? "" : k + 1 == cpu ? " and " : ", ");
            if (html)
                kvd_buf_xml(b, runs[i].label);
            else
                kvd_buf_puts(b, runs[i].label);
            k++;
        }
        kvd_buf_puts(b, " are the CPU back end's");
    }
    kvd_buf_puts(b, ": an FP8 cache is half the bytes of a BF16 one, but the CPU back end "
                    "converts it in software, so FP8 need not decode faster than BF16 there; the "
                    "decode speed-up FP8 brings is a GPU's (--backend cuda). The capacity gain "
                    "holds on either.");
    kvd_buf_puts(b, tail);
}

/* A JSON attribute, one key a line, under its label (nothing when absent). */
static void json_pre(kvd_buf *b, const char *label, const char *js) {
    if (!js) return;
    json_t *j = json_loads(js, 0, NULL);
    char *txt = j ? json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;
    kvd_buf_printf(b, "<p class=\"note\">%s:</p><pre>", label);
    kvd_buf_xml(b, txt ? txt : js);
    kvd_buf_puts(b, "</pre>\n");
    free(txt);
    json_decref(j);
}

static void provenance(kvd_buf *b, const kvd_run *r) {
    kvd_buf_puts(b, "<table class=\"prov\">");
    const char *k[] = {"file", "kvdrift",  "revision", "written (UTC)",
                       "host", "back end", "device",   "command"};
    char seeds[64];
    snprintf(seeds, sizeof seeds, "trace %llu, weights %llu", (unsigned long long)r->r.seed,
             (unsigned long long)r->r.weight_seed);
    const char *v[] = {r->path,   r->r.version, r->r.git_rev, r->r.written_utc,
                       r->r.host, r->r.backend, r->r.device,  r->r.command ? r->r.command : ""};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        kvd_buf_printf(b, "<tr><th class=\"l\">%s</th><td class=\"l\">", k[i]);
        kvd_buf_xml(b, v[i]);
        kvd_buf_puts(b, "</td></tr>\n");
    }
    kvd_buf_printf(b, "<tr><th class=\"l\">seeds</th><td class=\"l\">%s</td></tr></table>\n",
                   seeds);
    kvd_buf_puts(b, "<p class=\"note\">model config.json:</p><pre>");
    kvd_buf_xml(b, r->r.model_json ? r->r.model_json : "");
    kvd_buf_puts(b, "</pre><p class=\"note\">trace spec:</p><pre>");
    kvd_buf_xml(b, r->r.trace_json ? r->r.trace_json : "");
    kvd_buf_puts(b, "</pre>\n");
    json_pre(b, "run settings", r->r.settings);
    json_pre(b, "checkpoint audit", r->r.ckpt_audit);
}

void kvd_report_html_kl(kvd_buf *b, const kvd_run *runs, int n, long long ctx) {
    kl_by_position(b, runs, n, "all", "next-token KL against position, with its 95% band", ctx);
}

/* A long page's contents: every <h2> from byte `from` of b on gets an id
 * (s1, s2, ...), and a line of links to them goes in at `from`. The titles
 * are the page's own text, escaped where it was written. */
static void add_contents(kvd_buf *b, size_t from) {
    char *tail = strdup(b->s + from);
    b->n = from, b->s[from] = 0;
    kvd_buf_puts(b, "<p class=\"toc\">Contents:");
    int k = 0;
    for (const char *p = tail; (p = strstr(p, "<h2>"));) {
        const char *t = p + 4, *e = strstr(t, "</h2>");
        if (!e) break;
        kvd_buf_printf(b, "%s <a href=\"#s%d\">%.*s</a>", k ? " &#183;" : "", k + 1, (int)(e - t),
                       t);
        k++, p = e;
    }
    kvd_buf_puts(b, "</p>\n");
    k = 0;
    const char *p = tail;
    for (const char *h; (h = strstr(p, "<h2>"));) {
        kvd_buf_printf(b, "%.*s<h2 id=\"s%d\">", (int)(h - p), p, ++k);
        p = h + 4;
    }
    kvd_buf_puts(b, p);
    free(tail);
}

void kvd_report_failures(kvd_buf *b, const kvd_run *r, const char *intro, int html) {
    char(*fl)[KVD_FAIL_LEN] = malloc(sizeof(char[KVD_FAIL_MAX][KVD_FAIL_LEN]));
    const int nf = fl ? kvd_run_failures(r, fl) : 0;
    if (nf) {
        kvd_buf_puts(b, html ? "<p class=\"failed\">" : "\n");
        if (html)
            kvd_buf_xml(b, intro);
        else
            kvd_buf_puts(b, intro);
        kvd_buf_puts(b, html ? "</p>\n<ul class=\"failed\">\n" : "\n\n");
    }
    for (int l = 0; l < nf; l++) {
        kvd_buf_puts(b, html ? "<li>" : "- ");
        if (html)
            kvd_buf_xml(b, fl[l]);
        else
            kvd_buf_puts(b, fl[l]);
        kvd_buf_puts(b, html ? "</li>\n" : "\n");
    }
    if (nf && html) kvd_buf_puts(b, "</ul>\n");
    free(fl);
}

void kvd_print_failures(FILE *f, const kvd_run *r, const char *header, const char *lead) {
    char(*fl)[KVD_FAIL_LEN] = malloc(sizeof(char[KVD_FAIL_MAX][KVD_FAIL_LEN]));
    const int nf = fl ? kvd_run_failures(r, fl) : 0;
    if (nf && header) fprintf(f, "%s\n", header);
    for (int l = 0; l < nf; l++) fprintf(f, "%s%s\n", lead, fl[l]);
    free(fl);
}

/* Each run's cells that did not finish, under the verdict table */
static void failures_block(kvd_buf *b, const kvd_run *runs, int n, int html) {
    for (int i = 0; i < n; i++) {
        char intro[400];
        snprintf(intro, sizeof intro, "%s%sells that did not finish, so have no figures above:",
                 n > 1 ? runs[i].label : "", n > 1 ? ": c" : "C");
        kvd_report_failures(b, &runs[i], intro, html);
    }
}

void kvd_report_html(kvd_buf *b, const kvd_run *runs, int n) {
    kvd_buf_printf(b,
                   "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
                   "<title>kvdrift report</title><style>%s</style></head><body>\n",
                   css);
    kvd_buf_puts(b, "<h1>kvdrift: KV cache precision drift</h1>\n<p class=\"note\">");
    for (int i = 0; i < n; i++) {
        kvd_buf_xml(b, runs[i].label);
        long long ctx[MAX_CONTEXTS];
        const int nc = kvd_run_contexts(&runs[i], ctx, MAX_CONTEXTS);
        if (nc > 1) {
            char list[MAX_CONTEXTS * 24];
            kvd_context_list(list, sizeof list, ctx, nc);
            kvd_buf_printf(b,
                           ": contexts %s tokens (figures at %lld unless a table names the "
                           "context)",
                           list, ctx[nc - 1]);
        } else {
            kvd_buf_printf(b, ": context %lld tokens", nc ? ctx[0] : 0);
        }
        kvd_buf_printf(b, ", written %s. ", runs[i].r.written_utc);
    }
    kvd_buf_puts(b, "Every figure compares a KV cache mode with the BF16 cache over the same "
                    "weights and trace; bf16 itself is the reference and shows zero.</p>\n");
    const size_t sections = b->n;
    kvd_buf_puts(b, "<h2>Verdict per KV mode</h2>\n");
    verdict_table(b, runs, n);
    kvd_buf_puts(b, "<p class=\"note\">Output KL: mean over positions of KL(P<sub>bf16</sub> || "
                    "P<sub>mode</sub>) of the next token, &#177; its standard error. Verdict by "
                    "mean KL: negligible &lt; 0.001 nats &lt; noticeable &lt; 0.01 &lt; degraded. "
                    "Speed and capacity at the highest concurrency measured.");
    cpu_speed_note(b, runs, n, 1, " ", "");
    mode_notes(b, runs, n, " ", "");
    kvd_buf_puts(b, "</p>\n");
    failures_block(b, runs, n, 1);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (k ? kvd_run_fp8_nan(&runs[i]) : kvd_run_attn_fp8(&runs[i])) {
                kvd_buf_printf(b, "<p class=\"note %s\">", k ? "fp8-nan" : "attn-fp8");
                kvd_buf_xml(b, runs[i].label);
                kvd_buf_printf(b, ": %s</p>\n", k ? kvd_fp8_nan_text : kvd_attn_fp8_text);
            }
    for (int i = 0; i < n; i++) {
        char s[1200];
        if (ckpt_sentence(&runs[i], s, sizeof s)) {
            kvd_buf_puts(b, "<p class=\"note\">");
            kvd_buf_xml(b, s);
            kvd_buf_puts(b, "</p>\n");
        }
        char hl[HEADLINE_MAX][HEADLINE_LEN];
        int nh = kvd_report_headline(&runs[i], hl);
        if (nh) {
            kvd_buf_puts(b, "<p>");
            if (n > 1) {
                kvd_buf_xml(b, runs[i].label);
                kvd_buf_puts(b, ": a");
            } else {
                kvd_buf_puts(b, "A");
            }
            kvd_buf_puts(b, "gainst the calibrated FP8 cache, same weights and trace:</p>\n"
                            "<ul class=\"headline\">\n");
            for (int h = 0; h < nh; h++) {
                kvd_buf_puts(b, "<li>");
                kvd_buf_xml(b, hl[h]);
                kvd_buf_puts(b, "</li>\n");
            }
            kvd_buf_puts(b, "</ul>\n");
        }
    }
    context_section_html(b, runs, n);
    kvd_buf_puts(b, "<h2>Output drift against context position</h2>\n");
    kl_by_position(b, runs, n, "all", "next-token KL against position, with its 95% band", 0);
    kl_tail(b, runs, n);
    kvd_buf_puts(b, "<h2>Hidden-state drift by layer and position</h2>\n");
    double hlo, hhi;
    hidden_range(runs, n, &hlo, &hhi);
    kvd_buf_puts(b, "<p class=\"note\">Relative L2 of each layer's output hidden state against "
                    "BF16's, the mean over the positions of each bucket; one colour scale for "
                    "every chart. White: exactly no drift, as in the layers below the first "
                    "full-attention layer, which read no cache.</p>\n");
    for (int i = 0; i < n; i++) hidden_heatmaps(b, &runs[i], runs[i].label, n > 1, hlo, hhi);
    kvd_buf_puts(b,
                 "<h2>Attention drift per full-attention layer</h2>\n<p class=\"note\">Isolated: "
                 "the reference query over the reference K/V passed through the mode's codec (the "
                 "layer's own error). Propagated: the mode's own run (error carried in from "
                 "below).</p>\n");
    for (int i = 0; i < n; i++) attention_bars(b, &runs[i], runs[i].label, n > 1);
    for (int i = 0; i < n; i++) head_heatmaps(b, &runs[i], runs[i].label, n > 1);
    int moe = 0;
    for (int i = 0; i < n; i++) {
        char s[1200];
        routing rt;
        routing_of(&runs[i], &rt);
        moe |= router_sentence(&runs[i], &rt, s, sizeof s);
    }
    if (moe) {
        kvd_buf_puts(b, "<h2>Expert routing against BF16</h2>\n<p class=\"note\">The share of "
                        "positions whose router picks another top-k expert set than BF16's at "
                        "that layer. Layers below the first full-attention layer read no cache "
                        "and route as BF16 does.</p>\n");
        for (int i = 0, color0 = 0; i < n; i++) {
            const char *modes[KVD_KV_N_MODES];
            router_bars(b, &runs[i], runs[i].label, n > 1, color0);
            color0 += kvd_run_modes(&runs[i], modes);
        }
    }
    kvd_buf_puts(b, "<h2>Copy positions against the rest</h2>\n");
    copy_bars(b, runs, n);
    for (int i = 0; i < n; i++) generation_table(b, &runs[i]);
    kvd_buf_puts(b, "<h2>Throughput and latency against concurrency</h2>\n");
    throughput_charts(b, runs, n);
    for (int i = 0; i < n; i++) throughput_contexts(b, &runs[i], runs[i].label, n > 1);
    kvd_buf_puts(b, "<h2>Accuracy against capacity</h2>\n");
    tradeoff_chart(b, runs, n);
    for (int i = 0; i < n; i++) {
        kvd_buf_puts(b, "<h2>FP8 saturation, flush-to-zero and scales: ");
        kvd_buf_xml(b, runs[i].label);
        kvd_buf_puts(b, "</h2>\n");
        kv_table(b, &runs[i]);
    }
    for (int i = 0; i < n; i++) {
        kvd_buf_puts(b, "<h2>Provenance: ");
        kvd_buf_xml(b, runs[i].label);
        kvd_buf_puts(b, "</h2>\n");
        provenance(b, &runs[i]);
    }
    add_contents(b, sections);
    kvd_buf_puts(b, "</body></html>\n");
}

void kvd_report_md(kvd_buf *b, const kvd_run *runs, int n) {
    kvd_buf_puts(b, "## kvdrift: KV cache precision drift\n\n");
    kvd_buf_puts(b, "| run | KV mode | output KL (nats) | top-1 agreement | ln(PPL ratio) | "
                    "attention KL | K saturated / V flushed to 0 | decode vs bf16 | "
                    "KV capacity vs bf16 | verdict |\n"
                    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for (int i = 0; i < n; i++) {
        const char *modes[KVD_KV_N_MODES];
        int nm = kvd_run_modes(&runs[i], modes);
        for (int m = 0; m < nm; m++) {
            verdict v = kvd_run_verdict(&runs[i], modes[m], kvd_run_max_context(&runs[i]));
            verdict_text t = verdict_fmt(&v);
            kvd_buf_printf(b, "| %s | %s | %s ± %s | %s | %s | %s | %s | %s | %s | %s |\n",
                           runs[i].label, modes[m], t.kl, t.kl_err, t.top1, t.ln_ppl, t.attn_kl,
                           t.lost, t.dec, t.cap, verdict_word(v.kl));
        }
    }
    /* each run's figures are at its largest context: one figure when they agree */
    int same = 1;
    for (int i = 1; i < n; i++)
        same &= kvd_run_max_context(&runs[i]) == kvd_run_max_context(&runs[0]);
    if (same) {
        kvd_buf_printf(b, "\nContext %lld tokens", n ? kvd_run_max_context(&runs[0]) : 0);
    } else {
        kvd_buf_puts(b, "\nContext:");
        for (int i = 0; i < n; i++)
            kvd_buf_printf(b, "%s %s %lld tokens", i ? "," : "", runs[i].label,
                           kvd_run_max_context(&runs[i]));
    }
    if (several_contexts(runs, n))
        kvd_buf_puts(b, " (a run's largest; every context in the table below)");
    kvd_buf_puts(b, "; verdict by mean output KL: negligible < 0.001 nats < noticeable < 0.01 < "
                    "degraded.\n");
    cpu_speed_note(b, runs, n, 0, "", "\n");
    mode_notes(b, runs, n, "\n", "\n");
    failures_block(b, runs, n, 0);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++)
            if (k ? kvd_run_fp8_nan(&runs[i]) : kvd_run_attn_fp8(&runs[i]))
                kvd_buf_printf(b, "\n%s: %s\n", runs[i].label,
                               k ? kvd_fp8_nan_text : kvd_attn_fp8_text);
    for (int i = 0; i < n; i++) {
        char s[1200];
        if (ckpt_sentence(&runs[i], s, sizeof s)) kvd_buf_printf(b, "\n%s\n", s);
        char hl[HEADLINE_MAX][HEADLINE_LEN];
        int nh = kvd_report_headline(&runs[i], hl);
        if (nh)
            kvd_buf_printf(b, "\n%s%sgainst the calibrated FP8 cache, same weights and trace:\n\n",
                           n > 1 ? runs[i].label : "", n > 1 ? ": a" : "A");
        for (int h = 0; h < nh; h++) kvd_buf_printf(b, "- %s\n", hl[h]);
        /* the sentences under the charts, each a paragraph after the run's label */
        const char *pre = n > 1 ? runs[i].label : "", *sep = n > 1 ? ": " : "";
        routing rt;
        routing_of(&runs[i], &rt);
        if (tail_sentence(&runs[i], s, sizeof s)) kvd_buf_printf(b, "\n%s%s%s\n", pre, sep, s);
        if (router_sentence(&runs[i], &rt, s, sizeof s))
            kvd_buf_printf(b, "\n%s%s%s\n", pre, sep, s);
        if (routed_sentence(&runs[i], &rt, s, sizeof s))
            kvd_buf_printf(b, "\n%s%s%s\n", pre, sep, s);
        head_grid g;
        if (head_grid_of(&runs[i], &g) && head_sentence(&g, s, sizeof s))
            kvd_buf_printf(b, "\n%s%s%s\n", pre, sep, s);
        free(g.grid);
    }
    context_section_md(b, runs, n);
}

void kvd_csv_row(FILE *f, int n, const char *const *v) {
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        csv_fwrite(f, v[i], strlen(v[i]));
    }
    fputc('\n', f);
}

void kvd_report_csv(FILE *f, const kvd_run *runs, int n) {
    const char *h[] = {"run", "mode", "context", "subset", "metric", "value"};
    kvd_csv_row(f, 6, h);
    for (int i = 0; i < n; i++) {
        const kvd_table *t = &runs[i].r.t[KVD_T_SUMMARY];
        for (int64_t j = 0; j < t->n; j++) {
            const kvd_row_summary *x = KVD_ROW(t, kvd_row_summary, j);
            /* each figure once, over every trace, as the report shows it */
            int seen = 0;
            for (int64_t k = 0; k < j && !seen; k++) {
                const kvd_row_summary *y = KVD_ROW(t, kvd_row_summary, k);
                seen = y->context == x->context && !strcmp(y->metric, x->metric) &&
                       !strcmp(y->subset, x->subset) && !strcmp(y->mode, x->mode);
            }
            if (seen) continue;
            char ctx[32], val[40];
            snprintf(ctx, sizeof ctx, "%lld", (long long)x->context);
            snprintf(val, sizeof val, "%.9g",
                     kvd_results_summary(&runs[i].r, x->mode, x->context, x->subset, x->metric));
            const char *v[] = {runs[i].label, x->mode, ctx, x->subset, x->metric, val};
            kvd_csv_row(f, 6, v);
        }
        const kvd_table *tp = &runs[i].r.t[KVD_T_TPUT];
        for (int64_t j = 0; j < tp->n; j++) {
            const kvd_row_tput *x = KVD_ROW(tp, kvd_row_tput, j);
            char ctx[32], val[40], met[48];
            snprintf(ctx, sizeof ctx, "%lld", (long long)x->context);
            const struct {
                const char *name;
                double v;
            } m[] = {
                {"decode_tok_s", x->decode_tok_s},  {"prefill_tok_s", x->prefill_tok_s},
                {"ttft_ms_p50", x->ttft_ms_p50},    {"itl_ms_p50", x->itl_ms_p50},
                {"itl_ms_p99", x->itl_ms_p99},      {"kv_bytes_per_token", x->kv_bytes_per_token},
                {"budget_tokens", x->budget_tokens}};
            for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
                snprintf(met, sizeof met, "%s_c%d", m[k].name, x->concurrency);
                snprintf(val, sizeof val, "%.9g", m[k].v);
                const char *v[] = {runs[i].label, x->mode, ctx, "all", met, val};
                kvd_csv_row(f, 6, v);
            }
        }
    }
}
