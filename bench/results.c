/* kvdrift: results tables and their HDF5 file (see results.h). */
#include "gitrev.h" /* KVD_GIT_REV, written at build time */
#include "results.h"

#include <hdf5.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../datasets/h5file.h"
#include "../runners/config.h"
#include "../runners/drift.h"

#define S(T, f, n)                                                                                 \
    { #f, KVD_COL_STR, offsetof(T, f), n, 0 }
#define I32(T, f)                                                                                  \
    { #f, KVD_COL_I32, offsetof(T, f), 4, 0 }
#define I64(T, f)                                                                                  \
    { #f, KVD_COL_I64, offsetof(T, f), 8, 0 }
#define F64(T, f)                                                                                  \
    { #f, KVD_COL_F64, offsetof(T, f), 8, 0 }
#define F32(T, f)                                                                                  \
    { #f, KVD_COL_F32, offsetof(T, f), 4, 0 }
#define U8(T, f)                                                                                   \
    { #f, KVD_COL_U8, offsetof(T, f), 1, 0 }
#define U16_SINCE(T, f, v)                                                                         \
    { #f, KVD_COL_U16, offsetof(T, f), 2, v }
#define CELL_KEYS(T) S(T, mode, 16), I32(T, concurrency), I64(T, context)

static const kvd_coldef c_output[] = {CELL_KEYS(kvd_row_output),    I32(kvd_row_output, trace),
                                      S(kvd_row_output, subset, 8), S(kvd_row_output, metric, 16),
                                      I32(kvd_row_output, bucket),  I64(kvd_row_output, pos_lo),
                                      I64(kvd_row_output, pos_hi),  F64(kvd_row_output, n),
                                      F64(kvd_row_output, mean),    F64(kvd_row_output, ci95)};
static const kvd_coldef c_layer[] = {CELL_KEYS(kvd_row_layer),    I32(kvd_row_layer, trace),
                                     I32(kvd_row_layer, layer),   S(kvd_row_layer, layer_type, 20),
                                     S(kvd_row_layer, subset, 8), S(kvd_row_layer, metric, 16),
                                     I32(kvd_row_layer, bucket),  I64(kvd_row_layer, pos_lo),
                                     I64(kvd_row_layer, pos_hi),  F64(kvd_row_layer, n),
                                     F64(kvd_row_layer, mean),    F64(kvd_row_layer, ci95)};
static const kvd_coldef c_attn[] = {
    CELL_KEYS(kvd_row_attn),    I32(kvd_row_attn, trace),    I32(kvd_row_attn, attn_layer),
    I32(kvd_row_attn, layer),   I32(kvd_row_attn, kv_head),  S(kvd_row_attn, view, 12),
    S(kvd_row_attn, subset, 8), S(kvd_row_attn, metric, 16), I32(kvd_row_attn, bucket),
    I64(kvd_row_attn, pos_lo),  I64(kvd_row_attn, pos_hi),   F64(kvd_row_attn, n),
    F64(kvd_row_attn, mean),    F64(kvd_row_attn, ci95)};
static const kvd_coldef c_summary[] = {
    CELL_KEYS(kvd_row_summary),     I32(kvd_row_summary, trace), S(kvd_row_summary, subset, 8),
    S(kvd_row_summary, metric, 24), F64(kvd_row_summary, value), F64(kvd_row_summary, n)};
static const kvd_coldef c_kv[] = {CELL_KEYS(kvd_row_kv),
                                  I32(kvd_row_kv, trace),
                                  I32(kvd_row_kv, attn_layer),
                                  I32(kvd_row_kv, layer),
                                  I32(kvd_row_kv, kv_head),
                                  F64(kvd_row_kv, k_scale),
                                  F64(kvd_row_kv, v_scale),
                                  F64(kvd_row_kv, k_saturated_frac),
                                  F64(kvd_row_kv, k_flushed_frac),
                                  F64(kvd_row_kv, k_subnormal_frac),
                                  F64(kvd_row_kv, v_saturated_frac),
                                  F64(kvd_row_kv, v_flushed_frac),
                                  F64(kvd_row_kv, v_subnormal_frac),
                                  F64(kvd_row_kv, n_values)};
static const kvd_coldef c_gen[] = {CELL_KEYS(kvd_row_gen),
                                   I32(kvd_row_gen, trace),
                                   I64(kvd_row_gen, prefix),
                                   I32(kvd_row_gen, tokens),
                                   I32(kvd_row_gen, first_divergence),
                                   F64(kvd_row_gen, agree_rate)};
static const kvd_coldef c_tokset[] = {CELL_KEYS(kvd_row_tokset), I32(kvd_row_tokset, trace),
                                      I64(kvd_row_tokset, trace_hash), I64(kvd_row_tokset, first),
                                      I64(kvd_row_tokset, n)};
static const kvd_coldef c_token[] = {
    F32(kvd_row_token, kl),
    F32(kvd_row_token, delta_p),
    F32(kvd_row_token, delta_nll),
    F32(kvd_row_token, hidden_last),
    F32(kvd_row_token, attn_isolated),
    F32(kvd_row_token, attn_propagated),
    U8(kvd_row_token, copy),
    U8(kvd_row_token, same_top),
    U16_SINCE(kvd_row_token, router_flips, KVD_SCHEMA_ROUTER_FLIPS)};
static const kvd_coldef c_tput[] = {
    CELL_KEYS(kvd_row_tput),          F64(kvd_row_tput, prefill_tok_s),
    F64(kvd_row_tput, decode_tok_s),  F64(kvd_row_tput, total_tok_s),
    F64(kvd_row_tput, ttft_ms_mean),  F64(kvd_row_tput, ttft_ms_p50),
    F64(kvd_row_tput, ttft_ms_p90),   F64(kvd_row_tput, ttft_ms_p99),
    F64(kvd_row_tput, itl_ms_mean),   F64(kvd_row_tput, itl_ms_p50),
    F64(kvd_row_tput, itl_ms_p90),    F64(kvd_row_tput, itl_ms_p99),
    F64(kvd_row_tput, tpot_ms_mean),  F64(kvd_row_tput, e2e_ms_mean),
    F64(kvd_row_tput, e2e_ms_p50),    F64(kvd_row_tput, e2e_ms_p90),
    F64(kvd_row_tput, e2e_ms_p99),    F64(kvd_row_tput, kv_bytes_per_token),
    F64(kvd_row_tput, peak_kv_bytes), F64(kvd_row_tput, budget_bytes),
    F64(kvd_row_tput, budget_tokens), F64(kvd_row_tput, batch_drift_max_rel),
    I32(kvd_row_tput, output_tokens)};
static const kvd_coldef c_cells[] = {
    S(kvd_row_cell, cell, 64),          S(kvd_row_cell, kind, 12),  S(kvd_row_cell, mode, 16),
    I32(kvd_row_cell, concurrency),     I64(kvd_row_cell, context), I32(kvd_row_cell, trace),
    S(kvd_row_cell, completed_utc, 24), F64(kvd_row_cell, seconds)};
static const kvd_coldef c_fail[] = {
    S(kvd_row_failure, cell, 64),       S(kvd_row_failure, kind, 12),
    S(kvd_row_failure, mode, 16),       I32(kvd_row_failure, concurrency),
    I64(kvd_row_failure, context),      I32(kvd_row_failure, trace),
    S(kvd_row_failure, failed_utc, 24), S(kvd_row_failure, message, 512)};

/* Pooled output KL of a (mode, context, subset), every trace's positions
 * sorted together: kvd_results_summary's percentiles read it. */
struct kvd_kl_cache {
    struct kl_sorted {
        char mode[16], subset[8];
        long long ctx;
        int64_t n;
        float *v;
    } * e;
    int n, cap;
};

static void kl_cache_clear(struct kvd_kl_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->e[i].v);
    free(c->e);
    memset(c, 0, sizeof *c);
}

const kvd_kl_pct kvd_kl_percentiles[] = {
    {"kl_max", 1.0},  {"kl_p99_9", 0.999}, {"kl_p99", 0.99}, {"kl_p95", 0.95},
    {"kl_p90", 0.90}, {"kl_median", 0.5},  {"kl_p10", 0.10}, {"kl_p05", 0.05},
    {"kl_p01", 0.01}, {"kl_p00_1", 0.001}, {"kl_min", 0.0},  {NULL, 0}};

#define TABLE(p, d, T, c)                                                                          \
    { p, d, sizeof(T), c, (int)(sizeof c / sizeof c[0]), NULL, 0, 0, 0 }

void kvd_results_init(kvd_results *r) {
    memset(r, 0, sizeof *r);
    kvd_table t[KVD_T_N] = {
        TABLE("/drift/output", "next-token figures per position bucket and subset", kvd_row_output,
              c_output),
        TABLE("/drift/layers", "hidden-state drift after every layer, per bucket and subset",
              kvd_row_layer, c_layer),
        TABLE("/drift/attention",
              "attention drift per full-attention layer, isolated and propagated views",
              kvd_row_attn, c_attn),
        TABLE("/drift/summary",
              "one figure per cell: KL percentiles, agreement, ln(PPL ratio), "
              "router flips",
              kvd_row_summary, c_summary),
        TABLE("/drift/kv",
              "the candidate cache per layer and KV head: scales, saturation, "
              "flush-to-zero, subnormals (NVFP4 modes: the global scales; values clamped "
              "beyond rounding; values under a subnormal block scale; fp8-token: scales 1.0, "
              "each row's own is in the cache; values clamped beyond rounding)",
              kvd_row_kv, c_kv),
        TABLE("/drift/generation",
              "greedy continuation from a prefix: first divergent token "
              "and agreement",
              kvd_row_gen, c_gen),
        TABLE("/drift/token_sets",
              "one row per drift cell: which rows of /drift/tokens hold its positions, and a "
              "hash of its trace's tokens",
              kvd_row_tokset, c_tokset),
        TABLE("/drift/tokens",
              "every predicted position of every drift cell, in position order (the prediction "
              "at position p is of token p + 1): output KL, delta p and delta -ln p of the true "
              "next token, the last layer's hidden-state relative L2, the attention KL over the "
              "full-attention layers in either view (NaN where attention is not sampled), "
              "whether the next token copies earlier content, whether both argmaxes agree, "
              "at how many MoE layers the router chose another top-k expert set than the "
              "reference's",
              kvd_row_token, c_token),
        TABLE("/throughput", "speed per mode, concurrency and context", kvd_row_tput, c_tput),
        TABLE("/cells",
              "completion marker of every finished cell, with its wall time in seconds (drift "
              "cells that ran together against one reference run: each its own model steps and "
              "an equal share of the reference's)",
              kvd_row_cell, c_cells),
        TABLE("/failures",
              "every cell that did not finish in the run that last tried it, and why (the "
              "message run printed); a cell that finishes on a rerun leaves this table",
              kvd_row_failure, c_fail),
    };
    t[KVD_T_FAIL].since = KVD_SCHEMA_FAILURES;
    memcpy(r->t, t, sizeof t);
    r->kl_cache = calloc(1, sizeof *r->kl_cache);
    r->schema_version = KVD_SCHEMA_VERSION;
}

void kvd_results_free(kvd_results *r) {
    for (int i = 0; i < KVD_T_N; i++) free(r->t[i].rows);
    for (int i = 0; i < r->n_mats; i++) free(r->mats[i].data);
    free(r->mats);
    free(r->model_json);
    free(r->trace_json);
    free(r->command);
    free(r->settings);
    free(r->ckpt_audit);
    free(r->k_scale);
    free(r->q_scale);
    free(r->v_scale);
    kl_cache_clear(r->kl_cache);
    free(r->kl_cache);
    memset(r, 0, sizeof *r);
}

void *kvd_results_add_rows(kvd_results *r, int ti, int64_t n) {
    kvd_table *t = &r->t[ti];
    if (t->n + n > t->cap) {
        while (t->n + n > t->cap) t->cap = t->cap ? 2 * t->cap : 256;
        t->rows = realloc(t->rows, (size_t)t->cap * t->row_size);
    }
    void *row = t->rows + (size_t)t->n * t->row_size;
    t->n += n;
    memset(row, 0, (size_t)n * t->row_size);
    return row;
}

void *kvd_results_add(kvd_results *r, int ti) {
    return kvd_results_add_rows(r, ti, 1);
}

const kvd_row_failure *kvd_results_failure(const kvd_results *r, const char *cell) {
    const kvd_table *t = &r->t[KVD_T_FAIL];
    for (int64_t i = 0; i < t->n; i++)
        if (!strcmp(KVD_ROW(t, kvd_row_failure, i)->cell, cell))
            return KVD_ROW(t, kvd_row_failure, i);
    return NULL;
}

void kvd_results_forget_failure(kvd_results *r, const char *cell) {
    kvd_table *t = &r->t[KVD_T_FAIL];
    int64_t k = 0;
    for (int64_t i = 0; i < t->n; i++) {
        if (!strcmp(KVD_ROW(t, kvd_row_failure, i)->cell, cell)) continue;
        if (k != i)
            memcpy(t->rows + (size_t)k * t->row_size, t->rows + (size_t)i * t->row_size,
                   t->row_size);
        k++;
    }
    t->n = k;
}

int kvd_results_has_cell(const kvd_results *r, const char *cell) {
    const kvd_table *t = &r->t[KVD_T_CELLS];
    for (int64_t i = 0; i < t->n; i++)
        if (!strcmp(((const kvd_row_cell *)(t->rows + (size_t)i * t->row_size))->cell, cell))
            return 1;
    return 0;
}

/* "routed": positions the router sent to another top-k expert set at some
 * MoE layer; "unrouted" the rest (KVD_SCHEMA_ROUTER_FLIPS on) */
static int in_subset(const kvd_row_token *t, const char *subset) {
    if (!strcmp(subset, "routed")) return t->router_flips > 0;
    if (!strcmp(subset, "unrouted")) return t->router_flips == 0;
    return !strcmp(subset, "all") || (!strcmp(subset, "copy") ? t->copy : !t->copy);
}

/* The sorted output KL of a subset over every trace's positions of a mode
 * at context ctx, from the cache or sorted into it; NULL without positions. */
static const struct kl_sorted *kl_sorted(const kvd_results *r, const char *mode, long long ctx,
                                         const char *subset) {
    struct kvd_kl_cache *c = r->kl_cache;
    for (int i = 0; c && i < c->n; i++)
        if (c->e[i].ctx == ctx && !strcmp(c->e[i].mode, mode) && !strcmp(c->e[i].subset, subset))
            return &c->e[i];
    const kvd_table *ts = &r->t[KVD_T_TOKSET], *tt = &r->t[KVD_T_TOKEN];
    int64_t n = 0;
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (!strcmp(x->mode, mode) && x->context == ctx) n += x->n;
    }
    if (n == 0 || !c) return NULL;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return NULL;
    int64_t k = 0;
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (strcmp(x->mode, mode) || x->context != ctx) continue;
        for (int64_t j = x->first; j < x->first + x->n; j++) { /* within: checked on load */
            const kvd_row_token *t = KVD_ROW(tt, kvd_row_token, j);
            if (in_subset(t, subset)) v[k++] = t->kl;
        }
    }
    qsort(v, (size_t)k, sizeof(float), kvd_cmp_float);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->e = realloc(c->e, sizeof *c->e * (size_t)c->cap);
    }
    struct kl_sorted *e = &c->e[c->n++];
    snprintf(e->mode, sizeof e->mode, "%s", mode);
    snprintf(e->subset, sizeof e->subset, "%s", subset);
    e->ctx = ctx, e->n = k, e->v = v;
    return e;
}

int64_t kvd_results_kl_sorted(const kvd_results *r, const char *mode, long long ctx,
                              const char *subset, const float **v) {
    const struct kl_sorted *e = kl_sorted(r, mode, ctx, subset);
    *v = e ? e->v : NULL;
    return e ? e->n : 0;
}

uint64_t kvd_token_hash(const uint32_t *tok, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int64_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) h = (h ^ ((tok[i] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
    return h;
}

void kvd_results_add_tokens(kvd_results *r, const char *mode, long long ctx, int trace,
                            uint64_t trace_hash, const kvd_row_token *tok, int64_t n) {
    kvd_row_tokset *s = kvd_results_add(r, KVD_T_TOKSET);
    snprintf(s->mode, sizeof s->mode, "%s", mode);
    s->concurrency = 1;
    s->context = ctx;
    s->trace = trace;
    s->trace_hash = (int64_t)trace_hash;
    s->first = r->t[KVD_T_TOKEN].n;
    s->n = n;
    memcpy(kvd_results_add_rows(r, KVD_T_TOKEN, n), tok, sizeof *tok * (size_t)n);
    kl_cache_clear(r->kl_cache);
}

static const kvd_row_tokset *tokset(const kvd_results *r, const char *mode, long long ctx,
                                    int trace) {
    const kvd_table *ts = &r->t[KVD_T_TOKSET];
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context == ctx && x->trace == trace && !strcmp(x->mode, mode)) return x;
    }
    return NULL;
}

static const char *const token_metrics[] = {
    "kl",          "top1_agree",    "delta_p",         "delta_nll",   "delta_p_sq",
    "hidden_last", "attn_isolated", "attn_propagated", "router_flips"};
enum { METRIC_ROUTER = 8 }; /* kept from KVD_SCHEMA_ROUTER_FLIPS on */

static double token_value(const kvd_row_token *t, int metric) {
    switch (metric) {
    case 0:
        return t->kl;
    case 1:
        return t->same_top;
    case 2:
        return t->delta_p;
    case 3:
        return t->delta_nll;
    case 4:
        return (double)t->delta_p * t->delta_p;
    case 5:
        return t->hidden_last;
    case 6:
        return t->attn_isolated;
    case 7:
        return t->attn_propagated;
    default:
        return t->router_flips;
    }
}

/* Add one cell's positions in a subset and bucket (negative: all) to the
 * sums: the figure of u, or with v the figure of v minus that of u. */
static void accumulate(const kvd_row_token *u, const kvd_row_token *v, int64_t n, int metric,
                       const char *subset, int bucket, double acc[3]) {
    /* a bucket's positions only: b covers [2^b, 2^(b+1)), 0 also 0 */
    int64_t p0 = 0, p1 = n;
    if (bucket > 0 && bucket < 63) p0 = (int64_t)1 << bucket;
    if (bucket >= 0 && bucket < KVD_NB - 1 && ((int64_t)2 << bucket) < p1)
        p1 = (int64_t)2 << bucket;
    for (int64_t p = p0; p < p1; p++) {
        if ((bucket >= 0 && kvd_bucket(p) != bucket) || !in_subset(&u[p], subset)) continue;
        const double d = v ? token_value(&v[p], metric) - token_value(&u[p], metric)
                           : token_value(&u[p], metric);
        if (isnan(d)) continue; /* attention not sampled here (on either side) */
        acc[0] += 1, acc[1] += d, acc[2] += d * d;
    }
}

/* n, mean and the standard error of the mean from the sums; 0 for none */
static int finish(const double acc[3], kvd_paired *out) {
    const double n = acc[0];
    if (n == 0) return 0;
    out->n = n;
    out->mean = acc[1] / n;
    const double var = n > 1 ? (acc[2] - n * out->mean * out->mean) / (n - 1) : NAN;
    out->se = n > 1 ? sqrt(var > 0 ? var : 0) / sqrt(n) : NAN;
    return 1;
}

/* The index of a per-position figure that r (and b, when given) keep in a
 * subset; -1 for another name, or a figure or subset an older file lacks */
static int token_metric(const char *metric, const char *subset, const kvd_results *r,
                        const kvd_results *b, kvd_paired *out) {
    memset(out, 0, sizeof *out);
    out->mean = out->se = NAN;
    const int old = r->schema_version < KVD_SCHEMA_ROUTER_FLIPS ||
                    (b && b->schema_version < KVD_SCHEMA_ROUTER_FLIPS);
    for (int i = 0; i < (int)(sizeof token_metrics / sizeof *token_metrics); i++)
        if (!strcmp(metric, token_metrics[i]))
            return old && (i == METRIC_ROUTER || strstr(subset, "routed")) ? -1 : i;
    return -1;
}

int kvd_results_pair(const kvd_results *a, const char *mode_a, const kvd_results *b,
                     const char *mode_b, long long ctx) {
    const kvd_table *ts = &a->t[KVD_T_TOKSET];
    int na = 0, nb = 0;
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context != ctx || strcmp(x->mode, mode_a)) continue;
        const kvd_row_tokset *y = tokset(b, mode_b, ctx, x->trace);
        if (!y || y->trace_hash != x->trace_hash || y->n != x->n) return 0;
        na++;
    }
    for (int64_t i = 0; i < b->t[KVD_T_TOKSET].n; i++) {
        const kvd_row_tokset *y = KVD_ROW(&b->t[KVD_T_TOKSET], kvd_row_tokset, i);
        nb += y->context == ctx && !strcmp(y->mode, mode_b);
    }
    return na > 0 && na == nb;
}

int kvd_results_paired(const kvd_results *a, const char *mode_a, const kvd_results *b,
                       const char *mode_b, long long ctx, const char *subset, const char *metric,
                       int bucket, kvd_paired *out) {
    const int m = token_metric(metric, subset, a, b, out);
    if (m < 0 || !kvd_results_pair(a, mode_a, b, mode_b, ctx)) return 0;
    const kvd_table *ts = &a->t[KVD_T_TOKSET];
    double acc[3] = {0};
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context != ctx || strcmp(x->mode, mode_a)) continue;
        const kvd_row_tokset *y = tokset(b, mode_b, ctx, x->trace);
        accumulate(KVD_ROW(&a->t[KVD_T_TOKEN], kvd_row_token, x->first),
                   KVD_ROW(&b->t[KVD_T_TOKEN], kvd_row_token, y->first), x->n, m, subset, bucket,
                   acc);
    }
    return finish(acc, out);
}

int kvd_results_positions(const kvd_results *r, const char *mode, long long ctx, const char *subset,
                          const char *metric, int bucket, kvd_paired *out) {
    const int m = token_metric(metric, subset, r, NULL, out);
    const kvd_table *ts = &r->t[KVD_T_TOKSET];
    double acc[3] = {0};
    for (int64_t i = 0; m >= 0 && i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context == ctx && !strcmp(x->mode, mode))
            accumulate(KVD_ROW(&r->t[KVD_T_TOKEN], kvd_row_token, x->first), NULL, x->n, m, subset,
                       bucket, acc);
    }
    return finish(acc, out);
}

double kvd_results_percentile_se(const kvd_results *r, const char *mode, long long ctx,
                                 const char *subset, double q) {
    const float *v;
    const int64_t n = kvd_results_kl_sorted(r, mode, ctx, subset, &v);
    /* the ranks between which the q-quantile lies with 95% probability */
    const double k = q * (double)n, h = 1.959963984540054 * sqrt((double)n * q * (1 - q));
    const int64_t lo = (int64_t)floor(k - h), hi = (int64_t)ceil(k + h);
    if (n == 0 || !(h > 0) || lo < 0 || hi > n - 1) return NAN;
    return ((double)v[hi] - (double)v[lo]) / (2 * 1.959963984540054);
}

double kvd_results_percentile_paired_se(const kvd_results *a, const char *mode_a,
                                        const kvd_results *b, const char *mode_b, long long ctx,
                                        const char *subset, double q) {
    const double se_a = kvd_results_percentile_se(a, mode_a, ctx, subset, q),
                 se_b = kvd_results_percentile_se(b, mode_b, ctx, subset, q);
    if (!isfinite(se_a) || !isfinite(se_b) || !kvd_results_pair(a, mode_a, b, mode_b, ctx))
        return NAN;
    const float *va, *vb;
    const int64_t na = kvd_results_kl_sorted(a, mode_a, ctx, subset, &va),
                  nb = kvd_results_kl_sorted(b, mode_b, ctx, subset, &vb);
    const double xa = kvd_percentile_sorted(va, na, q), xb = kvd_percentile_sorted(vb, nb, q);
    /* Each quantile moves with the share of positions at or below it
     * (Bahadur): q^ - x ~ (q - F_n(x)) / f. So the two estimates correlate
     * as the indicators 1{kl_a <= x_a} and 1{kl_b <= x_b} do over the
     * positions both runs share, and each one's error is its own
     * order-statistic error. */
    double n = 0, ca = 0, cb = 0, cab = 0;
    const kvd_table *ts = &a->t[KVD_T_TOKSET];
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context != ctx || strcmp(x->mode, mode_a)) continue;
        const kvd_row_tokset *y = tokset(b, mode_b, ctx, x->trace);
        const kvd_row_token *u = KVD_ROW(&a->t[KVD_T_TOKEN], kvd_row_token, x->first),
                            *v = KVD_ROW(&b->t[KVD_T_TOKEN], kvd_row_token, y->first);
        for (int64_t p = 0; p < x->n; p++) {
            if (!in_subset(&u[p], subset)) continue;
            const int ia = u[p].kl <= xa, ib = v[p].kl <= xb;
            n += 1, ca += ia, cb += ib, cab += ia && ib;
        }
    }
    if (n != (double)na || n != (double)nb) return NAN; /* the subsets differ across the runs */
    const double pa = ca / n, pb = cb / n, vab = pa * (1 - pa) * pb * (1 - pb);
    const double rho = vab > 0 ? (cab / n - pa * pb) / sqrt(vab) : 0;
    const double var = se_a * se_a + se_b * se_b - 2 * rho * se_a * se_b;
    return sqrt(var > 0 ? var : 0);
}

double kvd_results_summary(const kvd_results *r, const char *mode, long long ctx,
                           const char *subset, const char *metric) {
    const kvd_table *t = &r->t[KVD_T_SUMMARY];
    const size_t len = strlen(metric);
    const int is_err = len > 4 && !strcmp(metric + len - 4, "_err"),
              is_max = !strcmp(metric, "kl_max"), is_min = !strcmp(metric, "kl_min"),
              is_rms = !strcmp(metric, "delta_p_rms");
    kvd_pool p = {0};
    double ext = NAN;
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_summary *x = (const kvd_row_summary *)(t->rows + (size_t)i * t->row_size);
        if (strcmp(x->mode, mode) || x->context != ctx || strcmp(x->subset, subset) ||
            strcmp(x->metric, metric) || !(x->n > 0))
            continue;
        /* a standard error pools as a ci95 does; an rms as the mean of squares */
        kvd_pool_add(&p, x->n, is_err ? 0 : is_rms ? x->value * x->value : x->value, x->value);
        /* a NaN trace makes the extreme NaN (fmax and fmin would pass it over) */
        if (p.rows == 1 || isnan(x->value))
            ext = x->value;
        else if (!isnan(ext))
            ext = is_max ? fmax(ext, x->value) : fmin(ext, x->value);
    }
    if (!p.rows) return NAN;
    if (p.rows == 1 || is_max || is_min) return ext;
    if (is_err) return kvd_pool_ci95(&p);
    if (is_rms) return sqrt(kvd_pool_mean(&p));
    for (const kvd_kl_pct *q = kvd_kl_percentiles; q->name; q++) {
        if (strcmp(q->name, metric)) continue;
        /* every trace's positions together, when the file holds them all */
        const struct kl_sorted *e = kl_sorted(r, mode, ctx, subset);
        if (e && (double)e->n == p.n) return kvd_percentile_sorted(e->v, e->n, q->q);
    }
    return kvd_pool_mean(&p);
}

void kvd_pool_add(kvd_pool *p, double n, double mean, double ci95) {
    if (!(n > 0)) return;
    if (!p->rows++) p->mean1 = mean, p->ci1 = ci95;
    p->n += n, p->sum += n * mean, p->var += n * ci95 * n * ci95;
}

double kvd_pool_mean(const kvd_pool *p) {
    return p->rows == 1 ? p->mean1 : p->rows ? p->sum / p->n : NAN;
}

double kvd_pool_ci95(const kvd_pool *p) {
    return p->rows == 1 ? p->ci1 : p->rows ? sqrt(p->var) / p->n : NAN;
}

double kvd_results_kv_fracs(const kvd_results *r, const char *mode, long long ctx, int layer,
                            int kv_head, double frac[6]) {
    const kvd_table *t = &r->t[KVD_T_KV];
    double n = 0, s[6] = {0};
    for (int64_t i = 0; i < t->n; i++) {
        const kvd_row_kv *x = (const kvd_row_kv *)(t->rows + (size_t)i * t->row_size);
        if (strcmp(x->mode, mode) || x->context != ctx || (layer >= 0 && x->layer != layer) ||
            (kv_head >= 0 && x->kv_head != kv_head))
            continue;
        const double v[6] = {x->k_saturated_frac, x->k_flushed_frac, x->k_subnormal_frac,
                             x->v_saturated_frac, x->v_flushed_frac, x->v_subnormal_frac};
        n += x->n_values;
        for (int k = 0; k < 6; k++) s[k] += v[k] * x->n_values;
    }
    for (int k = 0; k < 6; k++) frac[k] = n > 0 ? s[k] / n : NAN;
    return n;
}

void kvd_results_kv_shares(const kvd_results *r, const char *mode, long long ctx, double *k_sat,
                           double *v_flush) {
    double f[6];
    const int fp8 = kvd_results_kv_fracs(r, mode, ctx, -1, -1, f) > 0 && strcmp(mode, "bf16");
    *k_sat = fp8 ? f[0] : NAN;
    *v_flush = fp8 ? f[4] : NAN;
}

void kvd_results_add_matrix(kvd_results *r, const char *name, const char *row_label, int rows,
                            int cols, const double *data) {
    if (r->n_mats == r->cap_mats) {
        r->cap_mats = r->cap_mats ? 2 * r->cap_mats : 16;
        r->mats = realloc(r->mats, (size_t)r->cap_mats * sizeof *r->mats);
    }
    struct kvd_matrix *m = &r->mats[r->n_mats++];
    snprintf(m->name, sizeof m->name, "%s", name);
    snprintf(m->row_label, sizeof m->row_label, "%s", row_label);
    m->rows = rows;
    m->cols = cols;
    m->data = malloc(sizeof(double) * (size_t)rows * cols);
    memcpy(m->data, data, sizeof(double) * (size_t)rows * cols);
}

static hid_t col_type(const kvd_coldef *c) {
    switch (c->type) {
    case KVD_COL_STR: {
        hid_t s = H5Tcopy(H5T_C_S1);
        H5Tset_size(s, c->len);
        H5Tset_strpad(s, H5T_STR_NULLPAD);
        return s;
    }
    case KVD_COL_I32:
        return H5Tcopy(H5T_NATIVE_INT32);
    case KVD_COL_I64:
        return H5Tcopy(H5T_NATIVE_INT64);
    case KVD_COL_F32:
        return H5Tcopy(H5T_NATIVE_FLOAT);
    case KVD_COL_U8:
        return H5Tcopy(H5T_NATIVE_UINT8);
    case KVD_COL_U16:
        return H5Tcopy(H5T_NATIVE_UINT16);
    default:
        return H5Tcopy(H5T_NATIVE_DOUBLE);
    }
}

static hid_t table_type(const kvd_table *t) {
    hid_t ct = H5Tcreate(H5T_COMPOUND, t->row_size);
    for (int i = 0; i < t->ncols; i++) {
        hid_t c = col_type(&t->cols[i]);
        H5Tinsert(ct, t->cols[i].name, t->cols[i].off, c);
        H5Tclose(c);
    }
    return ct;
}

/* Intermediate groups of a path like /drift/output. */
static void make_groups(hid_t f, const char *path) {
    char buf[256];
    for (const char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
        snprintf(buf, sizeof buf, "%.*s", (int)(p - path), path);
        if (H5Lexists(f, buf, H5P_DEFAULT) <= 0) {
            hid_t g = H5Gcreate2(f, buf, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (g >= 0) H5Gclose(g);
        }
    }
}

static int write_table(hid_t f, const kvd_table *t) {
    make_groups(f, t->path);
    hid_t ct = table_type(t);
    hsize_t dims[1] = {(hsize_t)t->n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t ds = H5Dcreate2(f, t->path, ct, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = ds < 0 || (t->n && H5Dwrite(ds, ct, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->rows) < 0);
    if (ds >= 0) {
        rc |= H5LTset_attribute_string(f, t->path, "description", t->doc) < 0;
        H5Dclose(ds);
    }
    H5Sclose(sp);
    H5Tclose(ct);
    return rc ? -1 : 0;
}

static int write_2d(hid_t f, const char *path, hsize_t r, hsize_t c, hid_t type, const void *d) {
    make_groups(f, path);
    hsize_t dims[2] = {r, c};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t ds = H5Dcreate2(f, path, type, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = ds < 0 || H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, d) < 0;
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    return rc ? -1 : 0;
}

int kvd_results_save(const kvd_results *r, const char *path, char *err) {
    char tmp[4200];
    hid_t f = kvd_h5_create(path, KVD_RESULTS_FORMAT, tmp, sizeof tmp, err);
    if (f < 0) return -1;
    int rc = 0, ver = KVD_SCHEMA_VERSION;
    rc |= H5LTset_attribute_string(f, "/", "format", KVD_RESULTS_FORMAT) < 0;
    rc |= H5LTset_attribute_int(f, "/", "schema_version", &ver, 1) < 0;
    rc |= H5LTset_attribute_string(f, "/", "kvdrift_version", KVD_VERSION) < 0;
    rc |= H5LTset_attribute_string(f, "/", "git_revision", KVD_GIT_REV) < 0;
    char when[32], host[256] = "";
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    gethostname(host, sizeof host - 1);
    rc |= H5LTset_attribute_string(f, "/", "written_utc", when) < 0;
    rc |= H5LTset_attribute_string(f, "/", "host", host) < 0;
    rc |= H5LTset_attribute_string(f, "/", "backend", r->backend) < 0;
    rc |= H5LTset_attribute_string(f, "/", "device", r->device) < 0;
    rc |=
        H5LTset_attribute_string(f, "/", "model_config", r->model_json ? r->model_json : "{}") < 0;
    rc |= H5LTset_attribute_string(f, "/", "trace_spec", r->trace_json ? r->trace_json : "{}") < 0;
    rc |= H5LTset_attribute_string(f, "/", "command", r->command ? r->command : "") < 0;
    if (r->settings) rc |= H5LTset_attribute_string(f, "/", "run_settings", r->settings) < 0;
    if (r->ckpt_audit)
        rc |= H5LTset_attribute_string(f, "/", "checkpoint_audit", r->ckpt_audit) < 0;
    unsigned long long seeds[2] = {r->seed, r->weight_seed};
    rc |= H5LTset_attribute_ulong(f, "/", "seeds", (unsigned long *)seeds, 2) < 0;
    for (int i = 0; i < KVD_T_N; i++) rc |= write_table(f, &r->t[i]);
    if (r->k_scale) {
        rc |= write_2d(f, "/calibration/k_scale", (hsize_t)r->cal_layers, (hsize_t)r->cal_heads,
                       H5T_NATIVE_FLOAT, r->k_scale);
        rc |= write_2d(f, "/calibration/v_scale", (hsize_t)r->cal_layers, (hsize_t)r->cal_heads,
                       H5T_NATIVE_FLOAT, r->v_scale);
        if (r->q_scale)
            rc |= write_2d(f, "/calibration/q_scale", (hsize_t)r->cal_layers,
                           (hsize_t)r->cal_q_heads, H5T_NATIVE_FLOAT, r->q_scale);
    }
    /* dense matrices with dimension scales: rows (layers) x position buckets */
    for (int i = 0; i < r->n_mats; i++) {
        const struct kvd_matrix *m = &r->mats[i];
        char p[160], ps[200];
        snprintf(p, sizeof p, "/matrices/%s", m->name);
        rc |= write_2d(f, p, (hsize_t)m->rows, (hsize_t)m->cols, H5T_NATIVE_DOUBLE, m->data);
        hid_t ds = H5Dopen2(f, p, H5P_DEFAULT);
        int32_t idx[KVD_MAX_LAYERS];
        int64_t lo[64];
        for (int j = 0; j < m->rows && j < KVD_MAX_LAYERS; j++) idx[j] = j;
        for (int j = 0; j < m->cols && j < 64; j++) lo[j] = j == 0 ? 0 : (int64_t)1 << j;
        const char *slash = strrchr(m->name, '/');
        int dlen = slash ? (int)(slash - m->name) : 0;
        snprintf(ps, sizeof ps, "/matrices/%.*s/%s", dlen, m->name, m->row_label);
        if (H5Lexists(f, ps, H5P_DEFAULT) <= 0) {
            hsize_t n = (hsize_t)m->rows;
            H5LTmake_dataset(f, ps, 1, &n, H5T_NATIVE_INT32, idx);
            hid_t s = H5Dopen2(f, ps, H5P_DEFAULT);
            H5DSset_scale(s, m->row_label);
            H5Dclose(s);
        }
        char bs[200];
        snprintf(bs, sizeof bs, "/matrices/%.*s/bucket_lo", dlen, m->name);
        if (H5Lexists(f, bs, H5P_DEFAULT) <= 0) {
            hsize_t n = (hsize_t)m->cols;
            H5LTmake_dataset(f, bs, 1, &n, H5T_NATIVE_INT64, lo);
            hid_t s = H5Dopen2(f, bs, H5P_DEFAULT);
            H5DSset_scale(s, "bucket_lo");
            H5Dclose(s);
        }
        char rsp[200];
        snprintf(rsp, sizeof rsp, "/matrices/%.*s/%s", dlen, m->name, m->row_label);
        hid_t s0 = H5Dopen2(f, rsp, H5P_DEFAULT), s1 = H5Dopen2(f, bs, H5P_DEFAULT);
        rc |= H5DSattach_scale(ds, s0, 0) < 0;
        rc |= H5DSattach_scale(ds, s1, 1) < 0;
        H5Dclose(s0);
        H5Dclose(s1);
        H5Dclose(ds);
    }
    return kvd_h5_commit(f, tmp, path, !rc, err);
}

static int read_table(hid_t f, kvd_table *t, const char *path, char *err, int ver) {
    hid_t ds = H5Dopen2(f, t->path, H5P_DEFAULT);
    if (ds < 0) {
        snprintf(err, KVD_ERR_LEN, "%s: dataset %s: missing (expected in schema version %d)", path,
                 t->path, ver);
        return -1;
    }
    /* HDF5 would read a column the file lacks as zeros: name it instead,
     * unless the file's version predates it */
    hid_t ft = H5Dget_type(ds);
    const int compound = H5Tget_class(ft) == H5T_COMPOUND;
    for (int c = 0; c < t->ncols; c++)
        if (!compound ||
            (H5Tget_member_index(ft, t->cols[c].name) < 0 && t->cols[c].since <= ver)) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: dataset %s: no column '%s' (expected in schema version %d)", path,
                     t->path, t->cols[c].name, ver);
            H5Tclose(ft);
            H5Dclose(ds);
            return -1;
        }
    H5Tclose(ft);
    hid_t sp = H5Dget_space(ds), ct = table_type(t);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(sp, &n, NULL);
    free(t->rows);
    t->cap = (int64_t)(n ? n : 1);
    t->rows = calloc((size_t)t->cap, t->row_size);
    t->n = (int64_t)n;
    int rc = n && H5Dread(ds, ct, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->rows) < 0;
    H5Tclose(ct);
    H5Sclose(sp);
    H5Dclose(ds);
    if (rc) snprintf(err, KVD_ERR_LEN, "%s: dataset %s: unreadable", path, t->path);
    return rc ? -1 : 0;
}

static int read_2d_float(hid_t f, const char *p, int *rows, int *cols, float **out) {
    if (H5Lexists(f, "/calibration", H5P_DEFAULT) <= 0 || H5Lexists(f, p, H5P_DEFAULT) <= 0)
        return 0;
    hsize_t d[2];
    if (H5LTget_dataset_info(f, p, d, NULL, NULL) < 0) return -1;
    *rows = (int)d[0];
    *cols = (int)d[1];
    *out = malloc(sizeof(float) * d[0] * d[1]);
    return H5LTread_dataset_float(f, p, *out) < 0 ? -1 : 0;
}

/* Every token set's positions inside /drift/tokens. */
static int check_token_sets(const kvd_results *r, const char *path, char *err) {
    const kvd_table *ts = &r->t[KVD_T_TOKSET];
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        const int64_t nt = r->t[KVD_T_TOKEN].n; /* no sum that can overflow */
        if (x->first < 0 || x->n < 0 || x->first > nt || x->n > nt - x->first) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: dataset /drift/token_sets row %lld: first %lld and n %lld, expected "
                     "rows within the %lld of /drift/tokens",
                     path, (long long)i, (long long)x->first, (long long)x->n, (long long)nt);
            return -1;
        }
    }
    return 0;
}

static int per_position(int table) {
    return table == KVD_T_TOKSET || table == KVD_T_TOKEN;
}

/* The file at path, read-only, HDF5's own error printing off; < 0 with err. */
static hid_t open_read(const char *path, char *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        snprintf(err, KVD_ERR_LEN, "%s: not a readable HDF5 file (truncated or corrupt?)", path);
    return f;
}

static int load(kvd_results *r, const char *path, int positions, char *err) {
    hid_t f = open_read(path, err);
    if (f < 0) return -1;
    int ver = 0, rc = 0;
    /* another kvdrift file (a trace set) or some other HDF5 file: say which */
    if (kvd_h5_check_format(f, path, KVD_RESULTS_FORMAT, err)) {
        H5Fclose(f);
        return -1;
    }
    if (H5LTget_attribute_int(f, "/", "schema_version", &ver) < 0 || ver < KVD_SCHEMA_VERSION_MIN ||
        ver > KVD_SCHEMA_VERSION) {
        snprintf(err, KVD_ERR_LEN, "%s: attribute schema_version: expected %d to %d, got %d", path,
                 KVD_SCHEMA_VERSION_MIN, KVD_SCHEMA_VERSION, ver);
        H5Fclose(f);
        return -1;
    }
    r->schema_version = ver;
    for (int i = 0; i < KVD_T_N && !rc; i++) /* version 1 has no per-position tables */
        if ((!per_position(i) || (ver > 1 && positions)) && r->t[i].since <= ver)
            rc = read_table(f, &r->t[i], path, err, ver);
    kl_cache_clear(r->kl_cache);
    if (!rc) rc = check_token_sets(r, path, err);
    /* provenance strings */
    struct {
        const char *name;
        char *fixed;
        size_t len;
        char **dyn;
    } at[] = {{"kvdrift_version", r->version, sizeof r->version, NULL},
              {"git_revision", r->git_rev, sizeof r->git_rev, NULL},
              {"written_utc", r->written_utc, sizeof r->written_utc, NULL},
              {"host", r->host, sizeof r->host, NULL},
              {"backend", r->backend, sizeof r->backend, NULL},
              {"device", r->device, sizeof r->device, NULL},
              {"model_config", NULL, 0, &r->model_json},
              {"trace_spec", NULL, 0, &r->trace_json},
              {"command", NULL, 0, &r->command},
              {"run_settings", NULL, 0, &r->settings},
              {"checkpoint_audit", NULL, 0, &r->ckpt_audit}};
    for (size_t i = 0; !rc && i < sizeof at / sizeof at[0]; i++) {
        char *v = kvd_h5_root_string(f, at[i].name);
        if (!v) continue;
        if (at[i].dyn) {
            free(*at[i].dyn);
            *at[i].dyn = v;
        } else {
            snprintf(at[i].fixed, at[i].len, "%s", v);
            free(v);
        }
    }
    unsigned long seeds[2] = {0, 0};
    if (!rc && H5LTget_attribute_ulong(f, "/", "seeds", seeds) >= 0)
        r->seed = seeds[0], r->weight_seed = seeds[1];
    int hr = 0, hc = 0;
    if (!rc && read_2d_float(f, "/calibration/k_scale", &r->cal_layers, &r->cal_heads, &r->k_scale))
        rc = -1;
    if (!rc && read_2d_float(f, "/calibration/v_scale", &hr, &hc, &r->v_scale)) rc = -1;
    if (!rc && read_2d_float(f, "/calibration/q_scale", &hr, &r->cal_q_heads, &r->q_scale)) rc = -1;
    /* matrices are rebuilt from the layer tables by whoever resumes */
    H5Fclose(f);
    return rc;
}

int kvd_results_load(kvd_results *r, const char *path, char *err) {
    return load(r, path, 1, err);
}

int kvd_results_load_light(kvd_results *r, const char *path, char *err) {
    return load(r, path, 0, err);
}

void kvd_results_drop_positions(kvd_results *r) {
    for (int i = 0; i < KVD_T_N; i++)
        if (per_position(i)) {
            free(r->t[i].rows);
            r->t[i].rows = NULL;
            r->t[i].n = r->t[i].cap = 0;
        }
    kl_cache_clear(r->kl_cache);
}

int kvd_results_load_positions(kvd_results *r, const char *path, long long ctx, char *err) {
    kvd_results_drop_positions(r);
    if (r->schema_version < 2) return 0;
    hid_t f = open_read(path, err);
    if (f < 0) return -1;
    int rc = 0;
    for (int i = 0; i < KVD_T_N && !rc; i++)
        if (per_position(i)) rc = read_table(f, &r->t[i], path, err, r->schema_version);
    H5Fclose(f);
    if (!rc) rc = check_token_sets(r, path, err);
    if (rc) {
        kvd_results_drop_positions(r);
        return -1;
    }
    /* the sets at ctx, their positions copied out in order (a set of another
     * context may lie between, or after, them) */
    kvd_table *ts = &r->t[KVD_T_TOKSET], *tt = &r->t[KVD_T_TOKEN];
    int64_t sets = 0, rows = 0;
    for (int64_t i = 0; i < ts->n; i++) {
        const kvd_row_tokset *x = KVD_ROW(ts, kvd_row_tokset, i);
        if (x->context == ctx) rows += x->n;
    }
    char *kept = calloc((size_t)(rows ? rows : 1), tt->row_size);
    rows = 0;
    for (int64_t i = 0; i < ts->n; i++) {
        kvd_row_tokset x;
        memcpy(&x, ts->rows + (size_t)i * ts->row_size, sizeof x);
        if (x.context != ctx) continue;
        memcpy(kept + (size_t)rows * tt->row_size, tt->rows + (size_t)x.first * tt->row_size,
               (size_t)x.n * tt->row_size);
        x.first = rows, rows += x.n;
        memcpy(ts->rows + (size_t)sets++ * ts->row_size, &x, sizeof x);
    }
    free(tt->rows);
    tt->rows = kept, tt->n = rows, tt->cap = rows ? rows : 1;
    ts->n = sets;
    return 0;
}

static const char *type_name(const kvd_coldef *c) {
    static char buf[16];
    switch (c->type) {
    case KVD_COL_STR:
        snprintf(buf, sizeof buf, "S%zu", c->len);
        return buf;
    case KVD_COL_I32:
        return "int32";
    case KVD_COL_I64:
        return "int64";
    case KVD_COL_F32:
        return "float32";
    case KVD_COL_U8:
        return "uint8";
    case KVD_COL_U16:
        return "uint16";
    default:
        return "float64";
    }
}

void kvd_results_schema_md(FILE *f) {
    kvd_results r;
    kvd_results_init(&r);
    fprintf(f, "## Tables (schema version %d)\n\n", KVD_SCHEMA_VERSION);
    for (int i = 0; i < KVD_T_N; i++) {
        const kvd_table *t = &r.t[i];
        fprintf(f, "### `%s`\n\n%s", t->path, t->doc);
        if (t->since) fprintf(f, " (schema version %d on)", t->since);
        fprintf(f, ".\n\n| column | type |\n| --- | --- |\n");
        for (int c = 0; c < t->ncols; c++) {
            fprintf(f, "| `%s` | %s", t->cols[c].name, type_name(&t->cols[c]));
            if (t->cols[c].since) fprintf(f, " (schema version %d on)", t->cols[c].since);
            fprintf(f, " |\n");
        }
        fprintf(f, "\n");
    }
    kvd_results_free(&r);
}
