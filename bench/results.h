/* kvdrift: the results file. Everything a sweep measures is a row of a tidy
 * table held in memory; after each finished cell the whole file is written
 * to a temporary name and renamed into place, so the file on disk is always
 * complete (the last finished cell's state), and a rerun reads it back and
 * resumes. Schema: docs/results-schema.md. */
#ifndef KVD_RESULTS_H
#define KVD_RESULTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVD_SCHEMA_VERSION 4
/* the oldest schema a reader takes: version 1 files lack the per-position
 * tables (/drift/token_sets, /drift/tokens) and pool as they did */
#define KVD_SCHEMA_VERSION_MIN 1
/* the version that added each position's router flips */
#define KVD_SCHEMA_ROUTER_FLIPS 3
/* the version that added /failures */
#define KVD_SCHEMA_FAILURES 4
/* the root attribute "format" of a results file */
#define KVD_RESULTS_FORMAT "kvdrift-results"

typedef enum {
    KVD_COL_STR,
    KVD_COL_I32,
    KVD_COL_I64,
    KVD_COL_F64,
    KVD_COL_F32,
    KVD_COL_U8,
    KVD_COL_U16
} kvd_coltype;

typedef struct {
    const char *name;
    kvd_coltype type;
    size_t off;
    size_t len; /* strings: fixed length, NUL-padded */
    int since;  /* the schema version that added it (0: every version with the table) */
} kvd_coldef;

typedef struct {
    const char *path; /* dataset path in the file */
    const char *doc;  /* one line for the schema document */
    size_t row_size;
    const kvd_coldef *cols;
    int ncols;
    char *rows;
    int64_t n, cap;
    int since; /* the schema version that added the table (0: every version); read as empty
                  from an older file */
} kvd_table;

/* Row structs, one per table. */
typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    char subset[8];
    char metric[16];
    int32_t bucket;
    int64_t pos_lo, pos_hi;
    double n, mean, ci95;
} kvd_row_output;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    int32_t layer;
    char layer_type[20];
    char subset[8];
    char metric[16];
    int32_t bucket;
    int64_t pos_lo, pos_hi;
    double n, mean, ci95;
} kvd_row_layer;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    int32_t attn_layer, layer, kv_head; /* kv_head -1: all heads */
    char view[12];
    char subset[8];
    char metric[16];
    int32_t bucket;
    int64_t pos_lo, pos_hi;
    double n, mean, ci95;
} kvd_row_attn;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    char subset[8];
    char metric[24];
    double value, n;
} kvd_row_summary;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    int32_t attn_layer, layer, kv_head;
    double k_scale, v_scale;
    double k_saturated_frac, k_flushed_frac, k_subnormal_frac;
    double v_saturated_frac, v_flushed_frac, v_subnormal_frac;
    double n_values;
} kvd_row_kv;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    int64_t prefix;
    int32_t tokens, first_divergence;
    double agree_rate;
} kvd_row_gen;

/* A drift cell's per-position figures: rows first .. first + n - 1 of
 * /drift/tokens, position p at row first + p. */
typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    int64_t trace_hash; /* FNV-1a (64-bit) of the trace's first `context` token ids, little-endian
                           uint32: two runs pair their positions only over the same tokens */
    int64_t first, n;
} kvd_row_tokset;

/* One predicted position (of token p + 1): as kvd_token_fig in drift.h. */
typedef struct {
    float kl, delta_p, delta_nll, hidden_last, attn_isolated, attn_propagated;
    uint8_t copy, same_top;
    uint16_t router_flips; /* schema version 3; read as 0 from a version 2 file */
} kvd_row_token;

typedef struct {
    char mode[16];
    int32_t concurrency;
    int64_t context;
    double prefill_tok_s, decode_tok_s, total_tok_s;
    double ttft_ms_mean, ttft_ms_p50, ttft_ms_p90, ttft_ms_p99;
    double itl_ms_mean, itl_ms_p50, itl_ms_p90, itl_ms_p99;
    double tpot_ms_mean, e2e_ms_mean, e2e_ms_p50, e2e_ms_p90, e2e_ms_p99;
    double kv_bytes_per_token, peak_kv_bytes, budget_bytes, budget_tokens;
    double batch_drift_max_rel;
    int32_t output_tokens;
} kvd_row_tput;

typedef struct {
    char cell[64];
    char kind[12];
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    char completed_utc[24];
    double seconds;
} kvd_row_cell;

/* A cell that did not finish, and why (schema version 4). */
typedef struct {
    char cell[64];
    char kind[12];
    char mode[16];
    int32_t concurrency;
    int64_t context;
    int32_t trace;
    char failed_utc[24];
    char message[512];
} kvd_row_failure;

enum {
    KVD_T_OUTPUT = 0,
    KVD_T_LAYER,
    KVD_T_ATTN,
    KVD_T_SUMMARY,
    KVD_T_KV,
    KVD_T_GEN,
    KVD_T_TOKSET,
    KVD_T_TOKEN,
    KVD_T_TPUT,
    KVD_T_CELLS,
    KVD_T_FAIL,
    KVD_T_N
};

typedef struct {
    kvd_table t[KVD_T_N];
    /* provenance, root attributes */
    char *model_json, *trace_json, *command;
    /* what decides a cell's figures beyond the model and the traces (JSON,
     * keys named like run's flags): a resumed sweep must match it */
    char *settings;
    /* a checkpoint's audit (kvd_audit_json) when the weights are one; NULL
     * for synthetic weights */
    char *ckpt_audit;
    /* read back from a file (written ones come from the build and the clock) */
    int schema_version;
    char version[32], git_rev[32], written_utc[32], host[128];
    char backend[16], device[128];
    uint64_t seed, weight_seed;
    /* calibration scales, when a mode used them: [attn layers][kv heads] */
    int cal_layers, cal_heads;
    float *k_scale, *v_scale;
    /* the query's, when fp8-cal ran FP8 attention: [attn layers][heads] */
    int cal_q_heads;
    float *q_scale;
    /* dense per-cell matrices: name -> [rows][buckets] */
    int n_mats, cap_mats;
    struct kvd_matrix {
        char name[96], row_label[16];
        int rows, cols;
        double *data;
    } * mats;
    /* readers' cache of pooled, sorted output KL (see kvd_results_summary);
     * allocated by kvd_results_init, emptied when positions are added */
    struct kvd_kl_cache *kl_cache;
} kvd_results;

/* Row i of table t as a row struct T. */
#define KVD_ROW(t, T, i) ((const T *)((t)->rows + (size_t)(i) * (t)->row_size))

void kvd_results_init(kvd_results *r);
void kvd_results_free(kvd_results *r);
void *kvd_results_add(kvd_results *r, int table);                 /* a zeroed new row */
void *kvd_results_add_rows(kvd_results *r, int table, int64_t n); /* n of them, the first */
int kvd_results_has_cell(const kvd_results *r, const char *cell);
/* The /failures row of a cell, or NULL. */
const kvd_row_failure *kvd_results_failure(const kvd_results *r, const char *cell);
/* Drop a cell's /failures row (it finished, or failed again). */
void kvd_results_forget_failure(kvd_results *r, const char *cell);
/* A /drift/summary figure of a mode at context ctx over every trace the
 * file has, each weighted by its n: a mean or a rate the n-weighted mean;
 * a standard error (METRIC_err) that of the pooled mean, sqrt(sum (n_i
 * e_i)^2) / sum n_i; kl_max and kl_min the largest and smallest;
 * delta_p_rms the pooled root mean square; a percentile that of every
 * trace's positions together when the file holds them (/drift/tokens),
 * else the n-weighted mean of the traces' (schema version 1). One trace
 * alone comes back as written. NaN when no trace has it. */
double kvd_results_summary(const kvd_results *r, const char *mode, long long ctx,
                           const char *subset, const char *metric);
/* The same pooling of rows of (n, mean, ci95) over traces: the n-weighted
 * mean, and the ci95 of that mean, sqrt(sum (n_i ci95_i)^2) / sum n_i. One
 * row alone comes back exactly as it is. Start from {0}; NaN when no row
 * with n > 0 was added. */
typedef struct {
    double n, sum, var, mean1, ci1;
    int rows;
} kvd_pool;
void kvd_pool_add(kvd_pool *p, double n, double mean, double ci95);
double kvd_pool_mean(const kvd_pool *p);
double kvd_pool_ci95(const kvd_pool *p);
/* The shares of a mode's cache writes at context ctx (/drift/kv) that K
 * saturated, K flushed to zero, K subnormal, then the same three of V, in
 * frac[0..5], over every trace and over one layer and KV head (or, for a
 * negative one, all), weighted by the values written; NaN without rows.
 * Returns the values written. */
double kvd_results_kv_fracs(const kvd_results *r, const char *mode, long long ctx, int layer,
                            int kv_head, double frac[6]);
/* The shares of K values saturated and of V values flushed to zero by a
 * mode's cache writes at context ctx, over every layer, head and trace
 * (/drift/kv, weighted by the values written): the two ways a wrong scale
 * loses the cache. NaN for bf16 and for a mode without such rows. */
void kvd_results_kv_shares(const kvd_results *r, const char *mode, long long ctx, double *k_sat,
                           double *v_flush);
/* The output-KL percentiles of /drift/summary and their q (0..1), from
 * kl_max (1) down to kl_min (0); NULL-terminated. */
typedef struct {
    const char *name;
    double q;
} kvd_kl_pct;
extern const kvd_kl_pct kvd_kl_percentiles[];

/* FNV-1a (64-bit) of n token ids, each as four little-endian bytes. */
uint64_t kvd_token_hash(const uint32_t *tok, int64_t n);
/* Add a drift cell's n per-position figures (positions 0 .. n-1) of a
 * trace whose tokens hash to trace_hash. */
void kvd_results_add_tokens(kvd_results *r, const char *mode, long long ctx, int trace,
                            uint64_t trace_hash, const kvd_row_token *tok, int64_t n);

/* The output KL of every trace's positions of a mode at context ctx in a
 * subset ("all", "copy", "other"), sorted ascending, in *v; returns the
 * count (0 without positions). The array is r's: valid until positions are
 * added or r is freed. */
int64_t kvd_results_kl_sorted(const kvd_results *r, const char *mode, long long ctx,
                              const char *subset, const float **v);

/* A paired difference: the candidate's output figure minus the baseline's,
 * position by position over the same traces' tokens, its mean and the
 * standard error of that mean. */
typedef struct {
    double n, mean, se;
} kvd_paired;
/* Whether mode_b of run b and mode_a of run a hold per-position figures
 * for the same traces at context ctx, with the same tokens (trace index,
 * length and hash): whether they pair. */
int kvd_results_pair(const kvd_results *a, const char *mode_a, const kvd_results *b,
                     const char *mode_b, long long ctx);
/* Pair mode_b of run b with mode_a of run a (which may be the same run) at
 * context ctx, over a subset ("all", "copy", "other") and a position
 * bucket (negative: every position), for a per-position figure "kl",
 * "top1_agree", "delta_p", "delta_nll" or "delta_p_sq" (delta p squared).
 * They pair only when both hold per-position figures for the same traces
 * with the same tokens (trace index, length and hash); returns 1 then, else
 * 0 with out->n = 0. */
int kvd_results_paired(const kvd_results *a, const char *mode_a, const kvd_results *b,
                       const char *mode_b, long long ctx, const char *subset, const char *metric,
                       int bucket, kvd_paired *out);
/* The same of one run's figure itself, over every trace's positions: its
 * mean and the standard error of that mean; 0 without positions. Here the
 * subset may also be "routed" (positions the router sent to another top-k
 * expert set at some MoE layer) or "unrouted" (schema version 3 on). */
int kvd_results_positions(const kvd_results *r, const char *mode, long long ctx, const char *subset,
                          const char *metric, int bucket, kvd_paired *out);
/* The standard error of the output KL's q-quantile over every trace's
 * positions, distribution-free: the 95% interval between the order
 * statistics of ranks n q -/+ 1.96 sqrt(n q (1 - q)), over 2 x 1.96. NaN
 * without positions, or where the interval runs past the smallest or the
 * largest (at n = 511: the 99th percentile). */
double kvd_results_percentile_se(const kvd_results *r, const char *mode, long long ctx,
                                 const char *subset, double q);
/* The standard error of the difference of two q-quantiles of the output KL,
 * mode_b of run b against mode_a of run a over the same traces' positions
 * (as kvd_results_pair decides): each side's order-statistic error, less
 * what the two share. The quantiles' estimates move with the share of
 * positions at or below each, so they correlate as those indicators do
 * position by position. NaN when the runs do not pair or either side has no
 * order-statistic error. */
double kvd_results_percentile_paired_se(const kvd_results *a, const char *mode_a,
                                        const kvd_results *b, const char *mode_b, long long ctx,
                                        const char *subset, double q);
void kvd_results_add_matrix(kvd_results *r, const char *name, const char *row_label, int rows,
                            int cols, const double *data);

/* Write the whole file atomically; read one back (for resume). */
int kvd_results_save(const kvd_results *r, const char *path, char *err);
int kvd_results_load(kvd_results *r, const char *path, char *err);
/* kvd_results_load without the per-position tables (/drift/token_sets and
 * /drift/tokens, most of a file), for a reader of many files that takes
 * their positions one file at a time: until kvd_results_load_positions,
 * nothing pairs and a KL percentile over several traces is their rows'
 * mean. */
int kvd_results_load_light(kvd_results *r, const char *path, char *err);
/* Into r (loaded light, or whole): the per-position tables of the file at
 * path, of the token sets at context ctx alone; none from a version 1 file.
 * The tables are checked as kvd_results_load checks them. */
int kvd_results_load_positions(kvd_results *r, const char *path, long long ctx, char *err);
/* r's per-position tables emptied. */
void kvd_results_drop_positions(kvd_results *r);

/* The schema as Markdown (docs/results-schema.md is this, checked by a test). */
void kvd_results_schema_md(FILE *f);

#endif
