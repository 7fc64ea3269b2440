/* kvdrift: reports from result files: one self-contained HTML file with
 * inline SVG charts, a Markdown summary, CSV tables; and the baseline versus
 * candidate comparison behind `kvdrift compare`. */
#ifndef KVD_REPORT_H
#define KVD_REPORT_H

#include <stdio.h>

#include "../bench/results.h"
#include "buf.h"

typedef struct {
    char path[1024], label[128];
    kvd_results r;
} kvd_run;

/* the most result files one report takes */
#define KVD_REPORT_MAX_RUNS 64

/* Load result files (positions: with their per-position tables, else
 * light, kvd_results_load_light); -1 with err naming the file on failure.
 * Each gets a label of its own: its file name, or as much of its path as
 * tells it from the others. */
int kvd_runs_load(kvd_run *runs, int n, char *const *paths, int positions, char *err);
void kvd_runs_free(kvd_run *runs, int n);

void kvd_report_html(kvd_buf *b, const kvd_run *runs, int n);
/* The KL-against-position chart alone (for the comparison page), at
 * context ctx (0: each run's largest). */
void kvd_report_html_kl(kvd_buf *b, const kvd_run *runs, int n, long long ctx);
void kvd_report_md(kvd_buf *b, const kvd_run *runs, int n);
void kvd_report_csv(FILE *f, const kvd_run *runs, int n);
/* One CSV row of n fields, each quoted by libcsv. */
void kvd_csv_row(FILE *f, int n, const char *const *v);

/* A summary figure of a run over its traces (kvd_results_summary), at the
 * largest context unless ctx > 0; NAN when absent. */
double kvd_run_summary(const kvd_run *r, const char *mode, long long ctx, const char *subset,
                       const char *metric);

/* A /drift/layers figure ("rel_l2", "cosine", "router_flip") of one layer
 * over every position bucket and trace (n-weighted), subset "all"; NaN when
 * absent. In *se (unless NULL) its standard error, the rows taken as
 * independent samples. kvd_run_layers: the layers the run has figures for. */
double kvd_run_layer_mean(const kvd_run *r, const char *mode, long long ctx, int layer,
                          const char *metric, double *se);
int kvd_run_layers(const kvd_run *r);
/* The MoE layers with router-flip rows at context ctx, in the model's
 * order, into layer[KVD_MAX_LAYERS]; their count (0 for a dense model). */
int kvd_run_moe_layers(const kvd_run *r, long long ctx, int *layer);
/* Whether the run's E4M3 modes computed attention in FP8 (run --attn-fp8,
 * its run_settings), and that said in one sentence. */
int kvd_run_attn_fp8(const kvd_run *r);
extern const char *const kvd_attn_fp8_text;
/* Whether a run wrote its FP8 caches without saturation (--fp8-overflow
 * nan), and the sentence that says so. */
int kvd_run_fp8_nan(const kvd_run *r);
extern const char *const kvd_fp8_nan_text;
/* Attention KL (/drift/attention, every KV head together) in a view
 * ("isolated", "propagated") and subset, over every position bucket and
 * trace and over one full-attention layer al, or every one (al < 0),
 * n-weighted; NaN when absent. *se as above: over several layers, whose
 * errors at a position move together, a lower bound of the error. */
double kvd_run_attn_kl(const kvd_run *r, const char *mode, long long ctx, const char *view,
                       const char *subset, int al, double *se);

/* A mode's verdict figures at context ctx, over every trace: mean output KL
 * and its standard error, top-1 agreement, ln(PPL ratio), the last layer's
 * hidden drift, attention KL (propagated, every layer), the shares of K
 * saturated and V flushed (NaN: no FP8 rows), and at the highest
 * concurrency measured there (conc, 0: none) decode speed and KV capacity
 * against bf16's; NaN where the run has no figure. */
typedef struct {
    double kl, kl_err, top1, hid_last, dec_gain, cap_gain, ln_ppl, attn_kl;
    double k_sat, v_flush;
    int conc;
} kvd_verdict;
kvd_verdict kvd_run_verdict(const kvd_run *r, const char *mode, long long ctx);

/* Modes present in a run, in the order kvdrift knows them. */
int kvd_run_modes(const kvd_run *r, const char **modes);
long long kvd_run_max_context(const kvd_run *r);
/* The contexts of a run's finished cells (drift or throughput), ascending,
 * into out[cap] (the smallest cap of them); their count. */
int kvd_run_contexts(const kvd_run *r, long long *out, int cap);
/* Contexts as a reader's list: "64", "64 and 128", "64, 128 and 256". */
void kvd_context_list(char *s, size_t n, const long long *c, int nc);

/* The comparison the tool exists for, one sentence per other FP8 mode
 * (fp8-unscaled, fp8-ckpt, fp8-e5m2) against the calibrated cache (fp8-cal)
 * of the same run, at its largest context: how many times fp8-cal's mean
 * output KL, how many standard errors apart (of the paired per-position
 * difference when the file keeps positions, else the two means' combined
 * errors); the 99th-percentile KL (with the paired order-statistic error
 * where there is one); top-1 agreement; the share of (position, MoE layer)
 * pairs routed to another expert set (paired over positions from schema
 * version 3; no clause for a dense model); and the shares of K saturated
 * and V flushed. Returns how many sentences (0 without fp8-cal or another
 * FP8 mode); s[i] holds each. The NVFP4 modes come after the FP8 ones,
 * against fp8-cal too; nvfp4-unscaled's sentence adds how far it is from
 * nvfp4-cal, paired where the file keeps positions. */
enum { KVD_HEADLINE_MAX = 9, KVD_HEADLINE_LEN = 900 };
int kvd_report_headline(const kvd_run *r, char s[KVD_HEADLINE_MAX][KVD_HEADLINE_LEN]);

/* The cells of a run that did not finish (/failures), one line per mode
 * and message: "fp8-unscaled: drift at 256 tokens (trace 0); throughput at
 * 256 tokens, concurrency 1 and 2: MESSAGE". Returns how many lines (at
 * most KVD_FAIL_MAX; the last then says how many cells more failed). */
enum { KVD_FAIL_MAX = 12, KVD_FAIL_LEN = 1400 };
int kvd_run_failures(const kvd_run *r, char s[KVD_FAIL_MAX][KVD_FAIL_LEN]);
/* Those lines as a list after the paragraph intro, in HTML or Markdown;
 * nothing when every cell finished. */
void kvd_report_failures(kvd_buf *b, const kvd_run *r, const char *intro, int html);
/* The same lines on f for a terminal or a log: header (when not NULL) on a
 * line of its own first, then each line after lead; nothing when every
 * cell finished. */
void kvd_print_failures(FILE *f, const kvd_run *r, const char *header, const char *lead);

/* ---- compare ---- */

typedef struct {
    char metric[32], mode[16], bucket[16];
    double max_abs, max_rel;
    int line;
} kvd_threshold;

int kvd_thresholds_load(const char *path, kvd_threshold **th, int *n, char *err);

typedef struct {
    char metric[32], mode[16];
    long long context;
    int bucket; /* -1: the whole run */
    double base, cand, abs_inc, rel_inc, max_abs, max_rel;
    /* for a figure with a standard error (kl_mean, same_top_p, ln_ppl_ratio,
     * delta_p_mean, delta_p_rms, the KL percentiles but the extremes,
     * hidden_rel_l2_last, attn_kl*; the output figures per position
     * bucket): how many standard errors it got worse by (negative: better);
     * NaN otherwise. When both runs keep the positions of the same traces
     * (paired), the error is that of the mean per-position difference;
     * else the runs' combined sampling errors sqrt(se_base^2 + se_cand^2),
     * as if their inputs were independent */
    double z;
    int paired;
    int z_bound; /* z is an upper bound: attention KL over layers, whose errors at a
                    position move together, taken as independent (so a breach under
                    min_sigma by it is under it by the true z too) */
    int breach;
    int noise;   /* past the thresholds, but by fewer standard errors than the
                    comparison's min_sigma: not a regression */
    int missing; /* the baseline has the figure, the candidate none (absent or not finite):
                    a regression, for a gate that passed what it could not see would pass a
                    sweep that died or produced NaN */
} kvd_check;

/* Apply every threshold to the figures the baseline has; returns the number
 * of checks (malloc'd in *out), or -1 with err when a threshold names
 * something no run can have, or when nothing at all was compared. With
 * min_sigma > 0, a figure with a standard error regresses only when it also
 * got worse by at least that many combined standard errors (else: noise). */
int kvd_compare(const kvd_run *base, const kvd_run *cand, const kvd_threshold *th, int n_th,
                double min_sigma, kvd_check **out, char *err);
/* What two runs differ in besides their cells, for the reader of a
 * comparison: run settings (back end, seed, weights, ...), the model, the
 * traces, what audit found in their checkpoints; "" when nothing. Figures of runs that differ in
 * more than the change under test measure more than that change. */
void kvd_run_differences(const kvd_run *a, const kvd_run *b, char *out, size_t n);
/* The largest context both runs have cells at; 0 when none. */
long long kvd_runs_shared_context(const kvd_run *a, const kvd_run *b);
/* Whether two runs' figures compare position by position: 1 when a mode of
 * a's pairs with b's at their largest shared context (the same traces, tokens
 * hashed alike), 0 when one of them keeps no positions (a schema version 1
 * file, or one without drift cells), -1 when both do but over other traces. kvd_runs_pairing_note:
 * the same as one sentence for the reader. */
int kvd_runs_pair(const kvd_run *a, const kvd_run *b);
const char *kvd_runs_pairing_note(const kvd_run *a, const kvd_run *b);
void kvd_compare_html(kvd_buf *b, const kvd_run *base, const kvd_run *cand, const kvd_check *c,
                      int n, double min_sigma);
/* The comparison for a pull request or a CI log: the verdict, what the runs
 * differ in, each FP8 mode's mean KL, 99th percentile and top-1 agreement
 * baseline against candidate (passing or not), then the regressions and
 * the noise. */
void kvd_compare_md(kvd_buf *b, const kvd_run *base, const kvd_run *cand, const kvd_check *c, int n,
                    double min_sigma);

#endif
