/* kvdrift: baseline against candidate. A thresholds CSV (metric, mode,
 * bucket, max_abs_increase, max_rel_increase) decides a verdict per figure:
 * a figure regressed when it got worse by more than both its absolute and
 * its relative allowance ("worse" is up for drift, down for agreement and
 * speed; an empty allowance is 0). */
#include <csv.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/config.h"
#include "../runners/kvcache.h"
#include "../runners/fileio.h"
#include "report.h"
#include "svg.h"

static const char *const cols[5] = {"metric", "mode", "bucket", "max_abs_increase",
                                    "max_rel_increase"};

typedef struct {
    kvd_threshold *th;
    int n, cap;
    int col[5]; /* column index of each field */
    int field, line, header_done, header_n, failed;
    char cur[8][64];
    const char *path;
    char *err;
} th_ctx;

static void th_field(void *s, size_t n, void *data) {
    th_ctx *c = data;
    if (c->field < 8) {
        size_t m = n < 63 ? n : 63;
        memcpy(c->cur[c->field], s, m);
        c->cur[c->field][m] = 0;
    }
    c->field++;
}

static int parse_num(const char *s, double *v) {
    if (!*s) {
        *v = 0;
        return 0;
    }
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return errno || *end || !(*v >= 0) ? -1 : 0;
}

static void th_row(int term, void *data) {
    (void)term;
    th_ctx *c = data;
    int nf = c->field;
    c->field = 0;
    c->line++;
    if (c->failed) return;
    if (!c->header_done) {
        c->header_done = 1;
        c->header_n = nf;
        for (int k = 0; k < 5; k++) {
            c->col[k] = -1;
            for (int i = 0; i < nf && i < 8; i++)
                if (!strcmp(c->cur[i], cols[k])) c->col[k] = i;
            if (c->col[k] < 0) {
                snprintf(c->err, KVD_ERR_LEN,
                         "%s:1: missing column '%s' (expected metric,mode,bucket,max_abs_increase,"
                         "max_rel_increase)",
                         c->path, cols[k]);
                c->failed = 1;
                return;
            }
        }
        return;
    }
    if (nf == 1 && !c->cur[0][0]) return; /* blank line */
    if (nf > c->header_n) {
        snprintf(c->err, KVD_ERR_LEN, "%s:%d: expected %d fields as in the header, got %d", c->path,
                 c->line, c->header_n, nf);
        c->failed = 1;
        return;
    }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 32;
        c->th = realloc(c->th, sizeof *c->th * (size_t)c->cap);
    }
    kvd_threshold *t = &c->th[c->n];
    memset(t, 0, sizeof *t);
    t->line = c->line;
    for (int k = 0; k < 5; k++)
        if (c->col[k] >= nf) {
            snprintf(c->err, KVD_ERR_LEN, "%s:%d: expected %d columns, got %d", c->path, c->line,
                     c->col[k] + 1, nf);
            c->failed = 1;
            return;
        }
    snprintf(t->metric, sizeof t->metric, "%s", c->cur[c->col[0]]);
    snprintf(t->mode, sizeof t->mode, "%s", c->cur[c->col[1]]);
    snprintf(t->bucket, sizeof t->bucket, "%s", c->cur[c->col[2]]);
    for (int k = 3; k < 5; k++) {
        double v;
        if (parse_num(c->cur[c->col[k]], &v)) {
            snprintf(c->err, KVD_ERR_LEN,
                     "%s:%d: column '%s': expected a non-negative number, got '%s'", c->path,
                     c->line, cols[k], c->cur[c->col[k]]);
            c->failed = 1;
            return;
        }
        if (k == 3)
            t->max_abs = v;
        else
            t->max_rel = v;
    }
    if (!t->metric[0] || !t->mode[0] || !t->bucket[0]) {
        snprintf(c->err, KVD_ERR_LEN, "%s:%d: expected a metric, a mode (or *) and a bucket (or *)",
                 c->path, c->line);
        c->failed = 1;
        return;
    }
    c->n++;
}

int kvd_thresholds_load(const char *path, kvd_threshold **th, int *n, char *err) {
    size_t len;
    char *txt = kvd_read_file(path, &len, err);
    if (!txt) return -1;
    struct csv_parser p;
    th_ctx c;
    memset(&c, 0, sizeof c);
    c.path = path;
    c.err = err;
    csv_init(&p, CSV_STRICT | CSV_APPEND_NULL);
    if (csv_parse(&p, txt, len, th_field, th_row, &c) != len && !c.failed) {
        snprintf(err, KVD_ERR_LEN, "%s:%d: malformed CSV: %s", path, c.line + 1,
                 csv_strerror(csv_error(&p)));
        c.failed = 1;
    }
    if (!c.failed) csv_fini(&p, th_field, th_row, &c);
    csv_free(&p);
    free(txt);
    if (!c.failed && !c.header_done) {
        snprintf(err, KVD_ERR_LEN, "%s: empty; expected a header row and thresholds", path);
        c.failed = 1;
    }
    if (c.failed) {
        free(c.th);
        return -1;
    }
    *th = c.th;
    *n = c.n;
    return 0;
}

/* ---- figures the thresholds may name ---- */

static int higher_is_better(const char *m) {
    return !strcmp(m, "same_top_p") || !strcmp(m, "top1_agree") ||
           !strncmp(m, "decode_tok_s", 12) || !strncmp(m, "prefill_tok_s", 13) ||
           !strncmp(m, "decode_vs_bf16", 14);
}

static const char *const summary_metrics[] = {
    "kl_mean",    "kl_max",       "kl_p99_9",    "kl_p99",       "kl_p95",           "kl_p90",
    "kl_median",  "kl_p10",       "kl_p05",      "kl_p01",       "kl_p00_1",         "kl_min",
    "same_top_p", "delta_p_mean", "delta_p_rms", "ln_ppl_ratio", "router_flip_rate", NULL};
static const char *const output_metrics[] = {"kl", "top1_agree", "delta_p", "delta_nll", NULL};

static int in(const char *const *list, const char *s) {
    for (; *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

/* attention KL (propagated unless *_isolated), mean over layers; or the last
 * layer's hidden drift */
static double derived(const kvd_run *r, const char *mode, long long ctx, const char *metric,
                      double *se) {
    if (!strncmp(metric, "attn_kl", 7))
        return kvd_run_attn_kl(r, mode, ctx, strstr(metric, "isolated") ? "isolated" : "propagated",
                               "all", -1, se);
    return kvd_run_layer_mean(r, mode, ctx, kvd_run_layers(r) - 1, "rel_l2", se);
}

/* An output figure of one position bucket (a negative one: every position)
 * over the run's traces, and in *se its standard error (ci95 / 1.96; the
 * traces and the buckets are independent). */
static double output_bucket(const kvd_run *r, const char *mode, long long ctx, const char *metric,
                            int bucket, double *se) {
    const kvd_table *t = &r->r.t[KVD_T_OUTPUT];
    kvd_pool p = {0};
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_output *x = KVD_ROW(t, kvd_row_output, i);
        if (!strcmp(x->mode, mode) && x->context == ctx && (bucket < 0 || x->bucket == bucket) &&
            !strcmp(x->subset, "all") && !strcmp(x->metric, metric))
            kvd_pool_add(&p, x->n, x->mean, x->ci95);
    }
    *se = kvd_pool_ci95(&p) / 1.96;
    return kvd_pool_mean(&p);
}

static double tput_metric(const kvd_run *r, const char *mode, long long ctx, int conc,
                          const char *metric) {
    /* a speed as a ratio to the BF16 cache's in the same run: what the
     * cache format buys, whatever the machine */
    if (!strcmp(metric, "decode_vs_bf16"))
        return tput_metric(r, mode, ctx, conc, "decode_tok_s") /
               tput_metric(r, "bf16", ctx, conc, "decode_tok_s");
    const kvd_table *t = &r->r.t[KVD_T_TPUT];
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_tput *x = KVD_ROW(t, kvd_row_tput, i);
        if (strcmp(x->mode, mode) || x->context != ctx || x->concurrency != conc) continue;
        return !strncmp(metric, "decode", 6) ? x->decode_tok_s : x->prefill_tok_s;
    }
    return NAN;
}

/* The new check, or NULL when the baseline has nothing to hold the
 * candidate to. */
static kvd_check *add_check(kvd_check **out, int *n, int *cap, const kvd_threshold *t,
                            const char *mode, long long ctx, int bucket, double base, double cand,
                            const char *metric) {
    if (!isfinite(base)) return NULL;
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *out = realloc(*out, sizeof **out * (size_t)*cap);
    }
    kvd_check *c = &(*out)[(*n)++];
    memset(c, 0, sizeof *c);
    snprintf(c->metric, sizeof c->metric, "%s", metric);
    snprintf(c->mode, sizeof c->mode, "%s", mode);
    c->context = ctx;
    c->bucket = bucket;
    c->base = base;
    c->cand = cand;
    c->abs_inc = higher_is_better(t->metric) ? base - cand : cand - base;
    c->rel_inc = base != 0 ? c->abs_inc / fabs(base) : (c->abs_inc > 0 ? INFINITY : 0);
    c->max_abs = t->max_abs;
    c->max_rel = t->max_rel;
    c->missing = !isfinite(cand);
    c->breach = c->missing || (c->abs_inc > t->max_abs && c->rel_inc > t->max_rel);
    c->z = NAN;
    return c;
}

/* A check's difference in combined standard errors, given the two runs'. */
static void set_z(kvd_check *c, double se_base, double se_cand) {
    if (!c) return;
    const double se = sqrt(se_base * se_base + se_cand * se_cand);
    if (isfinite(se) && se > 0) c->z = c->abs_inc / se;
}

/* The output figure a summary figure is the mean of over every position
 * (NULL for the others). */
static const char *summary_output(const char *metric) {
    return !strcmp(metric, "kl_mean")        ? "kl"
           : !strcmp(metric, "same_top_p")   ? "top1_agree"
           : !strcmp(metric, "ln_ppl_ratio") ? "delta_nll"
           : !strcmp(metric, "delta_p_mean") ? "delta_p"
                                             : NULL;
}

/* The standard error of a summary figure that is the mean of an output
 * figure over every position (summary_output), from that figure's position
 * buckets; NaN for other figures. */
static double se_from_buckets(const kvd_run *r, const char *mode, long long ctx,
                              const char *metric) {
    const char *of = summary_output(metric);
    double se = NAN;
    if (of) output_bucket(r, mode, ctx, of, -1, &se);
    return se;
}

/* A check's z from the standard error of the two runs' per-position
 * difference: marked paired, and none where that error is 0 (the runs the
 * same at every position) */
static void set_paired_se(kvd_check *c, double se) {
    c->paired = 1;
    if (isfinite(se) && se > 0) c->z = c->abs_inc / se;
}

/* ... when both runs keep the positions of the same traces (per-position
 * figure of, a bucket or -1 for all; the check's figure that figure's mean
 * over d); returns whether they did. */
static int set_paired_z(kvd_check *c, const kvd_run *base, const kvd_run *cand, const char *of,
                        int bucket, double d) {
    kvd_paired pd;
    if (!c || !of ||
        !kvd_results_paired(&base->r, c->mode, &cand->r, c->mode, c->context, "all", of, bucket,
                            &pd))
        return 0;
    set_paired_se(c, pd.se / d);
    return 1;
}

/* ... from a per-position figure of whose mean the check's figure follows
 * to first order as mean / d: paired over the same positions (d = dp), else
 * from each run's own positions (db, dc); returns whether the runs keep
 * positions */
static int positions_z(kvd_check *c, const kvd_run *base, const kvd_run *cand, const char *of,
                       double dp, double db, double dc) {
    if (set_paired_z(c, base, cand, of, -1, dp)) return 1;
    kvd_paired pb, pc;
    if (!kvd_results_positions(&base->r, c->mode, c->context, "all", of, -1, &pb) ||
        !kvd_results_positions(&cand->r, c->mode, c->context, "all", of, -1, &pc))
        return 0;
    set_z(c, pb.se / db, pc.se / dc);
    return 1;
}

/* ... for router_flip_rate, the mean over positions of the share of MoE
 * layers whose top-k set differs: from each position's count of such
 * layers (schema version 3) over the nl MoE layers, paired when the runs
 * pair; else from the layers' rows, which take the layers as independent,
 * though a flip at one layer tends to come with flips above it: that z is
 * an upper bound */
static void router_z(kvd_check *c, const kvd_run *base, const kvd_run *cand) {
    int layer[KVD_MAX_LAYERS];
    const int nl = kvd_run_moe_layers(base, c->context, layer);
    if (nl == 0 || nl != kvd_run_moe_layers(cand, c->context, layer) ||
        positions_z(c, base, cand, "router_flips", nl, nl, nl))
        return;
    double vb = 0, vc = 0;
    for (int l = 0; l < nl; l++) {
        double sb, sc;
        kvd_run_layer_mean(base, c->mode, c->context, layer[l], "router_flip", &sb);
        kvd_run_layer_mean(cand, c->mode, c->context, layer[l], "router_flip", &sc);
        vb += sb * sb, vc += sc * sc;
    }
    set_z(c, sqrt(vb) / nl, sqrt(vc) / nl);
    if (isfinite(c->z)) c->z_bound = 1;
}

/* ... for a summary figure, where it has them: paired over the same
 * positions; else the summary's METRIC_err, else its output figure's;
 * for a KL percentile, each run's order-statistic error, less what the two
 * share when they pair */
static void add_z(kvd_check *c, const kvd_run *base, const kvd_run *cand, const char *metric) {
    if (!c) return;
    if (!strcmp(metric, "delta_p_rms")) {
        /* from the positions' delta p squared: rms_c - rms_b is (ms_c -
         * ms_b) / (rms_b + rms_c), and one run's error of the rms se(ms) /
         * (2 rms) */
        positions_z(c, base, cand, "delta_p_sq", c->base + c->cand, 2 * c->base, 2 * c->cand);
        return;
    }
    if (!strcmp(metric, "router_flip_rate")) {
        router_z(c, base, cand);
        return;
    }
    if (set_paired_z(c, base, cand, summary_output(metric), -1, 1)) return;
    char e[48];
    snprintf(e, sizeof e, "%s_err", metric);
    double sb = kvd_run_summary(base, c->mode, c->context, "all", e),
           sc = kvd_run_summary(cand, c->mode, c->context, "all", e);
    if (isnan(sb) && isnan(sc)) {
        sb = se_from_buckets(base, c->mode, c->context, metric);
        sc = se_from_buckets(cand, c->mode, c->context, metric);
    }
    for (const kvd_kl_pct *q = kvd_kl_percentiles; q->name && isnan(sb); q++)
        if (!strcmp(q->name, metric)) {
            const double se = kvd_results_percentile_paired_se(&base->r, c->mode, &cand->r, c->mode,
                                                               c->context, "all", q->q);
            if (!isnan(se)) {
                set_paired_se(c, se);
                return;
            }
            sb = kvd_results_percentile_se(&base->r, c->mode, c->context, "all", q->q);
            sc = kvd_results_percentile_se(&cand->r, c->mode, c->context, "all", q->q);
        }
    set_z(c, sb, sc);
}

/* ... for attention KL and the last layer's hidden drift: from each
 * position's figure (attention: its mean over the layers) when the runs keep
 * positions, paired when they pair; else from the buckets' errors (sb, sc),
 * which for attention over several layers take the layers' errors as
 * independent, though an error at one layer carries into the next: that z is
 * an upper bound */
static void derived_z(kvd_check *c, const kvd_run *base, const kvd_run *cand, const char *metric,
                      double sb, double sc) {
    if (!c) return;
    const char *of = !strcmp(metric, "attn_kl")            ? "attn_propagated"
                     : !strcmp(metric, "attn_kl_isolated") ? "attn_isolated"
                                                           : "hidden_last";
    if (positions_z(c, base, cand, of, 1, 1, 1)) return;
    set_z(c, sb, sc);
    if (isfinite(c->z) && strcmp(of, "hidden_last")) c->z_bound = 1;
}

int kvd_compare(const kvd_run *base, const kvd_run *cand, const kvd_threshold *th, int n_th,
                double min_sigma, kvd_check **out, char *err) {
    *out = NULL;
    int n = 0, cap = 0;
    const char *bm[KVD_KV_N_MODES];
    int nb = kvd_run_modes(base, bm);
    /* every context of the baseline's: one the candidate lacks is missing,
     * as a mode is; runs with no context in common measured other things */
    long long bc[64], cc[64];
    const int nbc = kvd_run_contexts(base, bc, 64), ncc = kvd_run_contexts(cand, cc, 64);
    if (nbc && ncc && !kvd_runs_shared_context(base, cand)) {
        char lb[160], lc[160];
        kvd_context_list(lb, sizeof lb, bc, nbc);
        kvd_context_list(lc, sizeof lc, cc, ncc);
        snprintf(err, KVD_ERR_LEN,
                 "%s and %s: expected a context in common (the baseline's %s tokens, the "
                 "candidate's %s)",
                 base->path, cand->path, lb, lc);
        return -1;
    }
    for (int k = 0; k < n_th; k++) {
        const kvd_threshold *t = &th[k];
        int is_sum = in(summary_metrics, t->metric), is_out = in(output_metrics, t->metric);
        int is_der = !strcmp(t->metric, "attn_kl") || !strcmp(t->metric, "attn_kl_isolated") ||
                     !strcmp(t->metric, "hidden_rel_l2_last");
        int is_tp = !strcmp(t->metric, "decode_tok_s") || !strcmp(t->metric, "prefill_tok_s") ||
                    !strcmp(t->metric, "decode_vs_bf16");
        const int is_ratio = !strcmp(t->metric, "decode_vs_bf16");
        if (!is_sum && !is_out && !is_der && !is_tp) {
            snprintf(err, KVD_ERR_LEN,
                     "thresholds line %d: unknown metric '%s' (expected a /drift/summary metric "
                     "such as kl_mean, an output metric kl|top1_agree|delta_p|delta_nll, attn_kl, "
                     "attn_kl_isolated, hidden_rel_l2_last, decode_tok_s, prefill_tok_s or "
                     "decode_vs_bf16)",
                     t->line, t->metric);
            goto refuse;
        }
        kvd_kv_mode km;
        if (strcmp(t->mode, "*") && kvd_kv_mode_parse(t->mode, &km)) {
            char names[256];
            kvd_kv_mode_names(names, sizeof names, ", ");
            snprintf(err, KVD_ERR_LEN,
                     "thresholds line %d: unknown mode '%s' (expected * or one of %s)", t->line,
                     t->mode, names);
            goto refuse;
        }
        int bucket = -1;
        if (strcmp(t->bucket, "*")) {
            char *end;
            bucket = (int)strtol(t->bucket, &end, 10);
            if (*end || bucket < 0 || bucket >= 64 || !is_out) {
                snprintf(err, KVD_ERR_LEN,
                         "thresholds line %d: bucket '%s': expected * or, for an output metric, "
                         "a bucket number 0..63",
                         t->line, t->bucket);
                goto refuse;
            }
        }
        for (int i = 0; i < nb * nbc; i++) {
            /* every mode of the baseline's: one the candidate lacks is missing */
            const long long ctx = bc[i % nbc];
            const char *mode = bm[i / nbc];
            if (strcmp(t->mode, "*") && strcmp(t->mode, mode)) continue;
            if (!strcmp(mode, "bf16") && (!is_tp || is_ratio)) continue;
            if (is_sum) {
                add_z(add_check(out, &n, &cap, t, mode, ctx, -1,
                                kvd_run_summary(base, mode, ctx, "all", t->metric),
                                kvd_run_summary(cand, mode, ctx, "all", t->metric), t->metric),
                      base, cand, t->metric);
            } else if (is_der) {
                double sb, sc;
                const double vb = derived(base, mode, ctx, t->metric, &sb),
                             vc = derived(cand, mode, ctx, t->metric, &sc);
                derived_z(add_check(out, &n, &cap, t, mode, ctx, -1, vb, vc, t->metric), base, cand,
                          t->metric, sb, sc);
            } else if (is_out) {
                for (int bk = 0; bk < 64; bk++) {
                    if (bucket >= 0 && bk != bucket) continue;
                    double sb, sc;
                    const double vb = output_bucket(base, mode, ctx, t->metric, bk, &sb),
                                 vc = output_bucket(cand, mode, ctx, t->metric, bk, &sc);
                    kvd_check *c = add_check(out, &n, &cap, t, mode, ctx, bk, vb, vc, t->metric);
                    if (!set_paired_z(c, base, cand, t->metric, bk, 1)) set_z(c, sb, sc);
                }
            } else {
                for (int cc = 1; cc <= 1024; cc *= 2) {
                    char name[48];
                    snprintf(name, sizeof name, "%s@c%d", t->metric, cc);
                    add_check(out, &n, &cap, t, mode, ctx, -1,
                              tput_metric(base, mode, ctx, cc, t->metric),
                              tput_metric(cand, mode, ctx, cc, t->metric), name);
                }
            }
        }
    }
    if (n == 0) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: none of the figures the thresholds name is in it: nothing was compared",
                 base->path);
        goto refuse;
    }
    /* a breach by fewer standard errors than asked for is within the runs'
     * sampling noise; a figure without a standard error, or one missing in
     * the candidate, stays with the thresholds' verdict */
    for (int i = 0; min_sigma > 0 && i < n; i++) {
        kvd_check *c = &(*out)[i];
        if (c->breach && !c->missing && isfinite(c->z) && c->z < min_sigma)
            c->breach = 0, c->noise = 1;
    }
    return n;
refuse:
    free(*out);
    *out = NULL;
    return -1;
}

static void add_diff(char *out, size_t n, const char *what) {
    size_t len = strlen(out);
    snprintf(out + len, n - len, "%s%s", len ? ", " : "", what);
}

/* Every key of ja that jb lacks or holds otherwise, then every key only jb
 * has: "PREFIXkey (x against y)", or "PREFIXkey" for an object or array;
 * strings quoted when quote ('' is a value there). */
static void json_diffs(char *out, size_t n, json_t *ja, json_t *jb, const char *prefix, int quote) {
    const char *key;
    json_t *v;
    json_object_foreach(ja, key, v) {
        const json_t *w = json_object_get(jb, key);
        if (w && json_equal(v, (json_t *)w)) continue;
        char what[320], x[128], y[128];
        if (json_is_object(v) || json_is_array(v) || json_is_object(w) || json_is_array(w)) {
            snprintf(what, sizeof what, "%s%s", prefix, key);
        } else {
            const json_t *vw[2] = {v, w};
            char *xy[2] = {x, y};
            for (int k = 0; k < 2; k++) {
                if (quote && json_is_string(vw[k]))
                    snprintf(xy[k], sizeof x, "'%s'", json_string_value(vw[k]));
                else
                    kvd_json_text(vw[k], xy[k], sizeof x);
            }
            snprintf(what, sizeof what, "%s%s (%s against %s)", prefix, key, x, y);
        }
        add_diff(out, n, what);
    }
    json_object_foreach(jb, key, v) {
        if (json_object_get(ja, key)) continue;
        char what[320], y[128];
        if (quote && json_is_string(v))
            snprintf(y, sizeof y, "'%s'", json_string_value(v));
        else
            kvd_json_text(v, y, sizeof y);
        snprintf(what, sizeof what, "%s%s (none against %s)", prefix, key, y);
        add_diff(out, n, what);
    }
}

void kvd_run_differences(const kvd_run *a, const kvd_run *b, char *out, size_t n) {
    out[0] = 0;
    const char *sa = a->r.settings, *sb = b->r.settings;
    if (!sa || !sb) {
        if (sa || sb) add_diff(out, n, "run settings (one file does not record them)");
    } else {
        json_t *ja = kvd_settings_parse(sa), *jb = kvd_settings_parse(sb);
        json_diffs(out, n, ja, jb, "", 0);
        json_decref(ja), json_decref(jb);
    }
    /* what audit found in the checkpoints: the reason a figure moved, often */
    json_t *aa = a->r.ckpt_audit ? json_loads(a->r.ckpt_audit, 0, NULL) : NULL,
           *ab = b->r.ckpt_audit ? json_loads(b->r.ckpt_audit, 0, NULL) : NULL;
    if (!aa != !ab)
        add_diff(out, n, "the checkpoint audit (one run is over synthetic weights)");
    else if (aa)
        json_diffs(out, n, aa, ab, "the checkpoint audit's ", 1);
    json_decref(aa), json_decref(ab);
    const char *ma = a->r.model_json ? a->r.model_json : "",
               *mb = b->r.model_json ? b->r.model_json : "";
    if (strcmp(ma, mb)) add_diff(out, n, "the model config");
    const char *ta = a->r.trace_json ? a->r.trace_json : "",
               *tb = b->r.trace_json ? b->r.trace_json : "";
    if (strcmp(ta, tb)) add_diff(out, n, "the trace spec");
}

long long kvd_runs_shared_context(const kvd_run *a, const kvd_run *b) {
    long long ca[64], cb[64];
    const int na = kvd_run_contexts(a, ca, 64), nb = kvd_run_contexts(b, cb, 64);
    for (int i = na - 1; i >= 0; i--)
        for (int j = 0; j < nb; j++)
            if (ca[i] == cb[j]) return ca[i];
    return 0;
}

int kvd_runs_pair(const kvd_run *a, const kvd_run *b) {
    if (!a->r.t[KVD_T_TOKSET].n || !b->r.t[KVD_T_TOKSET].n) return 0;
    const char *modes[KVD_KV_N_MODES];
    const int nm = kvd_run_modes(a, modes);
    const long long ctx = kvd_runs_shared_context(a, b);
    for (int m = 0; m < nm; m++)
        if (kvd_results_pair(&a->r, modes[m], &b->r, modes[m], ctx)) return 1;
    return -1;
}

const char *kvd_runs_pairing_note(const kvd_run *a, const kvd_run *b) {
    switch (kvd_runs_pair(a, b)) {
    case 1:
        return "the runs ran the same traces, so their figures' standard errors are those of "
               "the per-position differences (paired)";
    case -1:
        return "the runs ran other traces (their tokens differ), so their figures' standard "
               "errors are unpaired";
    default:
        return "a run keeps no per-position figures (a schema version 1 file, or no drift "
               "cells), so the figures' standard errors are unpaired";
    }
}

/* Where the candidate's KL moved: its per-position difference from the
 * baseline's, per position bucket with a 95% band, for each mode whose
 * positions pair (the same traces on both sides). Two runs that differ in
 * the last digits draw on top of each other in the chart above; here their
 * difference is the picture. Nothing when no mode pairs. */
static void paired_kl_chart(kvd_buf *b, const kvd_run *base, const kvd_run *cand) {
    static double x[KVD_KV_N_MODES][64], y[KVD_KV_N_MODES][64], lo[KVD_KV_N_MODES][64],
        hi[KVD_KV_N_MODES][64];
    kvd_line_chart ch = {"candidate minus baseline next-token KL, paired by position",
                         "token position (log scale; bucket midpoint)",
                         "KL difference (nats)",
                         1,
                         0,
                         0,
                         {{0}}};
    const char *modes[KVD_KV_N_MODES];
    const int nm = kvd_run_modes(base, modes);
    const long long ctx = kvd_runs_shared_context(base, cand);
    int moved = 0; /* any difference at all */
    for (int m = 0; m < nm; m++) {
        if (!strcmp(modes[m], "bf16") ||
            !kvd_results_pair(&base->r, modes[m], &cand->r, modes[m], ctx))
            continue;
        kvd_paired pd;
        int k = 0;
        for (int bk = 0; bk < 64; bk++) {
            if (!kvd_results_paired(&base->r, modes[m], &cand->r, modes[m], ctx, "all", "kl", bk,
                                    &pd))
                continue;
            const double l = bk == 0 ? 1 : exp2(bk), h = exp2(bk + 1) - 1,
                         ci = isfinite(pd.se) ? 1.959963984540054 * pd.se : 0;
            x[ch.n_series][k] = sqrt(l * h);
            y[ch.n_series][k] = pd.mean;
            lo[ch.n_series][k] = pd.mean - ci;
            hi[ch.n_series][k] = pd.mean + ci;
            moved |= pd.mean != 0 || ci != 0;
            k++;
        }
        if (!k) continue;
        const int s = ch.n_series++;
        /* the colour of the baseline's series of this mode in the chart above */
        ch.series[s] = (kvd_series){modes[m], k, x[s], y[s], lo[s], hi[s], 0, 1 + m};
    }
    if (!ch.n_series) return;
    if (!moved) {
        kvd_buf_puts(b, "<p class=\"note\">The runs' positions pair (the same traces), and "
                        "every mode's KL is the same at every position.</p>\n");
        return;
    }
    kvd_buf_puts(b, "<p class=\"note\">The runs' positions pair (the same traces): the "
                    "candidate's KL minus the baseline's, position by position, the mean per "
                    "bucket with its 95% band. Above zero the candidate drifts further.</p>\n");
    kvd_svg_lines(b, &ch);
}

/* A check's cells as the HTML and Markdown tables print them (html: the
 * bound's sign as an entity). */
typedef struct {
    char bucket[16], base[24], cand[24], worse[24], rel[24], z[32], allowed[40];
    const char *verdict;
} check_text;

static void check_fmt(const kvd_check *c, int html, check_text *t) {
    if (c->bucket < 0)
        snprintf(t->bucket, sizeof t->bucket, "*");
    else
        snprintf(t->bucket, sizeof t->bucket, "%d", c->bucket);
    snprintf(t->base, sizeof t->base, "%.4g", c->base);
    snprintf(t->cand, sizeof t->cand, "%.4g", c->cand);
    snprintf(t->worse, sizeof t->worse, "%.3g", c->abs_inc);
    snprintf(t->rel, sizeof t->rel, "%.1f%%", 100 * c->rel_inc);
    snprintf(t->z, sizeof t->z, "-");
    if (isfinite(c->z))
        snprintf(t->z, sizeof t->z, "%s%.1f%s", c->z_bound ? (html ? "&#8804;" : "<= ") : "", c->z,
                 c->paired ? " paired" : "");
    snprintf(t->allowed, sizeof t->allowed, "%.3g, %.0f%%", c->max_abs, 100 * c->max_rel);
    t->verdict = c->missing  ? "missing in the candidate"
                 : c->breach ? "regressed"
                 : c->noise  ? "within noise"
                             : "ok";
}

void kvd_compare_html(kvd_buf *b, const kvd_run *base, const kvd_run *cand, const kvd_check *c,
                      int n, double min_sigma) {
    int breaches = 0, noise = 0;
    for (int i = 0; i < n; i++) breaches += c[i].breach, noise += c[i].noise;
    kvd_buf_puts(
        b, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>kvdrift "
           "compare</title><style>body{font-family:sans-serif;max-width:1100px;margin:24px "
           "auto;padding:0 16px}table{border-collapse:collapse;font-size:13px}th,td{border:"
           "1px solid #ccc;padding:4px 8px;text-align:right}td.l,th.l{text-align:left}"
           ".bad,.failed{color:#d62728;font-weight:bold}.ok{color:#2ca02c}.noise{color:#b8860b}</"
           "style></head><body>\n");
    kvd_buf_puts(b, "<h1>kvdrift compare: ");
    kvd_buf_xml(b, base->label);
    kvd_buf_puts(b, " (baseline) against ");
    kvd_buf_xml(b, cand->label);
    char nz[96] = "";
    if (noise)
        snprintf(nz, sizeof nz, ", %d within noise (under %.3g standard errors)", noise, min_sigma);
    kvd_buf_printf(b, " (candidate)</h1>\n<p class=\"%s\">%d checks, %d regressions%s: %s</p>\n",
                   breaches ? "bad" : "ok", n, breaches, nz, breaches ? "REGRESSION" : "pass");
    char diff[1024];
    kvd_run_differences(base, cand, diff, sizeof diff);
    if (diff[0]) {
        kvd_buf_puts(b, "<p class=\"note\">The runs differ in: ");
        kvd_buf_xml(b, diff);
        kvd_buf_puts(b, ".</p>\n");
    }
    kvd_buf_printf(b, "<p class=\"note\">Standard errors: %s.</p>\n",
                   kvd_runs_pairing_note(base, cand));
    kvd_report_failures(b, cand, "The candidate's cells that did not finish:", 1);
    kvd_run pair[2] = {*base, *cand};
    /* KL against position for both, modes as series, at the largest
     * context both have */
    const long long ctx = kvd_runs_shared_context(base, cand);
    kvd_buf_printf(b, "<h2>Output drift, baseline and candidate, at %lld tokens</h2>\n", ctx);
    kvd_report_html_kl(b, pair, 2, ctx);
    paired_kl_chart(b, base, cand);
    kvd_buf_puts(b,
                 "<h2>Every check</h2>\n<table><tr><th class=\"l\">metric</th><th class=\"l\">mode"
                 "</th><th>context</th><th>bucket</th><th>baseline</th><th>candidate</th><th>worse "
                 "by</th><th>"
                 "relative</th><th>in standard errors</th><th>allowed</th><th class=\"l\">verdict"
                 "</th></tr>\n");
    for (int i = 0; i < n; i++) {
        check_text t;
        check_fmt(&c[i], 1, &t);
        kvd_buf_printf(b,
                       "<tr><td class=\"l\">%s</td><td class=\"l\">%s</td><td>%lld</td>"
                       "<td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
                       "<td>%s</td><td class=\"l %s\">%s</td></tr>\n",
                       c[i].metric, c[i].mode, c[i].context, t.bucket, t.base, t.cand, t.worse,
                       t.rel, t.z, t.allowed, c[i].breach ? "bad" : (c[i].noise ? "noise" : "ok"),
                       t.verdict);
    }
    kvd_buf_puts(b, "</table>\n</body></html>\n");
}

void kvd_compare_md(kvd_buf *b, const kvd_run *base, const kvd_run *cand, const kvd_check *c, int n,
                    double min_sigma) {
    int breaches = 0, noise = 0, missing = 0;
    for (int i = 0; i < n; i++)
        breaches += c[i].breach, noise += c[i].noise, missing += c[i].missing;
    kvd_buf_printf(b, "## kvdrift compare: %s (baseline) against %s (candidate): %s\n\n",
                   base->label, cand->label, breaches ? "REGRESSION" : "pass");
    kvd_buf_printf(b, "%d checks, %d regressions", n, breaches);
    if (missing) kvd_buf_printf(b, " (%d missing in the candidate)", missing);
    if (noise)
        kvd_buf_printf(b, ", %d within noise (under %.3g standard errors)", noise, min_sigma);
    kvd_buf_puts(b, ".\n");
    char diff[1024];
    kvd_run_differences(base, cand, diff, sizeof diff);
    if (diff[0]) kvd_buf_printf(b, "\nThe runs differ in: %s.\n", diff);
    kvd_buf_printf(b, "\nStandard errors: %s.\n", kvd_runs_pairing_note(base, cand));
    kvd_report_failures(b, cand, "The candidate's cells that did not finish:", 0);
    /* the figures a reader looks for first, passing or not: each FP8 mode's
     * mean KL, its 99th percentile and top-1 agreement, baseline against
     * candidate, at every context the baseline has */
    static const kvd_threshold main_figs[] = {{"kl_mean", "*", "*", INFINITY, INFINITY, 0},
                                              {"kl_p99", "*", "*", INFINITY, INFINITY, 0},
                                              {"same_top_p", "*", "*", INFINITY, INFINITY, 0}};
    kvd_check *m = NULL;
    char err[KVD_ERR_LEN];
    const int nm = kvd_compare(base, cand, main_figs, 3, 0, &m, err);
    if (nm > 0) {
        kvd_buf_puts(b, "\n| figure | mode | context | baseline | candidate | worse by | in "
                        "standard errors |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
        for (int i = 0; i < nm; i++) {
            check_text t;
            check_fmt(&m[i], 0, &t);
            kvd_buf_printf(b, "| %s | %s | %lld | %s | %s | %s | %s |\n", m[i].metric, m[i].mode,
                           m[i].context, t.base, m[i].missing ? "none" : t.cand,
                           m[i].missing ? "-" : t.worse, t.z);
        }
    }
    free(m);
    if (!breaches && !noise) {
        kvd_buf_puts(b, "\nEvery check is within its thresholds.\n");
        return;
    }
    kvd_buf_puts(b, "\n| metric | mode | context | bucket | baseline | candidate | worse by | "
                    "relative | in standard errors | allowed | verdict |\n| --- | --- | ---: | "
                    "---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    for (int i = 0; i < n; i++) {
        if (!c[i].breach && !c[i].noise) continue;
        check_text t;
        check_fmt(&c[i], 0, &t);
        kvd_buf_printf(b, "| %s | %s | %lld | %s | %s | %s | %s | %s | %s | %s | %s%s%s |\n",
                       c[i].metric, c[i].mode, c[i].context, t.bucket, t.base,
                       c[i].missing ? "none" : t.cand, c[i].missing ? "-" : t.worse,
                       c[i].missing ? "-" : t.rel, t.z, t.allowed, c[i].breach ? "**" : "",
                       t.verdict, c[i].breach ? "**" : "");
    }
}
