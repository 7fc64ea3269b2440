/* kvdrift: lock-step drift measurement. The BF16 reference and a candidate KV
 * mode run the same weights over the same trace side by side; every figure
 * of DESIGN.md's "Drift figures" is accumulated per log2 position bucket and
 * per subset (all tokens, tokens that copy earlier content, the rest), with
 * n, mean and a 95% interval. */
#ifndef KVD_DRIFT_H
#define KVD_DRIFT_H

#include <math.h>
#include <stdint.h>

#include "engine.h"
#include "kvcache.h"
#include "weights.h"

#define KVD_NB 32  /* position buckets: b covers [2^b, 2^(b+1)), b = 0 also position 0 */
#define KVD_NSUB 3 /* subsets */
#define KVD_MAX_GEN 8

typedef enum { KVD_SUB_ALL = 0, KVD_SUB_COPY, KVD_SUB_OTHER } kvd_subset;
extern const char *const kvd_subset_names[KVD_NSUB];

typedef enum { KVD_OUT_KL = 0, KVD_OUT_TOP1, KVD_OUT_DP, KVD_OUT_DNLL, KVD_OUT_N } kvd_out_metric;
extern const char *const kvd_out_names[KVD_OUT_N];
typedef enum { KVD_HID_REL_L2 = 0, KVD_HID_COS, KVD_HID_N } kvd_hid_metric;
extern const char *const kvd_hid_names[KVD_HID_N];
typedef enum { KVD_ATT_KL = 0, KVD_ATT_REL_L2, KVD_ATT_ARGMAX, KVD_ATT_N } kvd_att_metric;
extern const char *const kvd_att_names[KVD_ATT_N];
typedef enum { KVD_VIEW_ISOLATED = 0, KVD_VIEW_PROPAGATED, KVD_VIEW_N } kvd_att_view;
extern const char *const kvd_view_names[KVD_VIEW_N];

typedef struct {
    double n, sum, sumsq;
} kvd_stat;

static inline void kvd_stat_add(kvd_stat *s, double x) {
    s->n += 1;
    s->sum += x;
    s->sumsq += x * x;
}
double kvd_stat_mean(const kvd_stat *s);
double kvd_stat_ci95(const kvd_stat *s); /* half-width, normal approximation */

static inline int kvd_bucket(int64_t pos) {
    int b = pos < 2 ? 0 : 63 - __builtin_clzll((unsigned long long)pos);
    return b < KVD_NB ? b : KVD_NB - 1;
}

typedef struct {
    int sample_every; /* attention figures at every k-th position and each copy start */
    int gen_tokens;   /* greedy tokens per prefix (0: no generation figures) */
    int n_gen;        /* prefixes */
    int64_t gen_prefix[KVD_MAX_GEN];
    int saturate; /* E4M3 SATFINITE (1) or NOSAT (0) */
    int attn_fp8; /* FP8 attention over an E4M3 cache (kvd_kvcache_fp8_attention) */
} kvd_drift_opts;

void kvd_drift_opts_defaults(kvd_drift_opts *o);

typedef struct {
    int64_t prefix;
    int tokens;
    int first_divergence; /* index of the first differing greedy token, tokens if none */
    int agree;            /* positions where both chose the same token */
} kvd_gen_result;

/* The figures of one predicted position (the prediction at position p is
 * of token p + 1): KL(reference || candidate), the candidate's minus the
 * reference's probability of the true next token and their difference in
 * -ln p; the last layer's hidden-state relative L2 at p; the attention KL at
 * p, the mean over the full-attention layers, in either view (NaN where
 * attention is not sampled); whether the next token copies earlier content
 * and whether both argmaxes agree; at how many MoE layers the router chose
 * another top-k expert set at p than the reference's. */
typedef struct {
    float kl, delta_p, delta_nll, hidden_last, attn_isolated, attn_propagated;
    uint8_t copy, same_top;
    uint16_t router_flips;
} kvd_token_fig;

typedef struct {
    int n_layers, n_attn, kv_heads;
    kvd_stat out[KVD_OUT_N][KVD_NSUB][KVD_NB];
    kvd_stat *hid;     /* [layer][KVD_HID_N][KVD_NSUB][KVD_NB] */
    kvd_stat *att;     /* [attn layer][KVD_VIEW_N][KVD_ATT_N][KVD_NSUB][KVD_NB] */
    kvd_stat *router;  /* [layer][KVD_NB]: top-k set differs */
    kvd_stat *att_kvh; /* [attn layer][kv head][KVD_VIEW_N][KVD_NB]: attention KL per KV head */
    /* every predicted position's output figures, in position order: for
     * percentiles, and kept in the results file for exact pooling and
     * paired comparisons */
    kvd_token_fig *tok;
    int64_t n_tok;
    kvd_qstats *k_stats, *v_stats; /* the candidate cache's writes, [attn layer] */
    float *k_scale, *v_scale;      /* [attn layer][kv head] */
    int n_gen;
    kvd_gen_result gen[KVD_MAX_GEN];
    double seconds; /* wall time this candidate cost (kvd_drift_run_modes) */
    /* set by kvd_drift_run_modes when this candidate's run failed (its
     * figures are then partial): why, as err would give it */
    int failed;
    char error[KVD_ERR_LEN];
} kvd_drift;

int kvd_drift_init(kvd_drift *d, const kvd_config *c, int64_t max_tokens);
void kvd_drift_free(kvd_drift *d);
static inline kvd_stat *kvd_drift_hid(kvd_drift *d, int l, int m, int s, int b) {
    return &d->hid[(((size_t)l * KVD_HID_N + m) * KVD_NSUB + s) * KVD_NB + b];
}
static inline kvd_stat *kvd_drift_att(kvd_drift *d, int al, int v, int m, int s, int b) {
    return &d->att[((((size_t)al * KVD_VIEW_N + v) * KVD_ATT_N + m) * KVD_NSUB + s) * KVD_NB + b];
}

static inline kvd_stat *kvd_drift_att_kvh(kvd_drift *d, int al, int h, int v, int b) {
    return &d->att_kvh[(((size_t)al * d->kv_heads + h) * KVD_VIEW_N + v) * KVD_NB + b];
}

/* kvd_compare_logits and kvd_logit_cmp: kernels/kernels.h */

/* Run the BF16 reference and candidate `mode` over the first n tokens of
 * tok (is_copy[i]: token i copies earlier content; copy_start[i]: it starts
 * a copy) on back end be, and accumulate into d. 0, or
 * kvd_drift_run_modes' failure codes with err set. */
int kvd_drift_run(const kvd_backend *be, const kvd_weights *w, const uint32_t *tok,
                  const uint8_t *is_copy, const uint8_t *copy_start, int64_t n, kvd_kv_mode mode,
                  const kvd_kv_scales *scales, const kvd_drift_opts *o, kvd_drift *d, char *err);

/* kvd_drift_run for n_modes candidates (modes[i] with scales[i], into d[i])
 * against one reference run: on a back end whose models take the isolated
 * view on the candidate's side (shadow_of_reference), every candidate steps
 * after the same reference step, so k candidates cost k + 1 model runs, not
 * 2k; elsewhere one candidate after another. Each d[i] gets the figures a
 * kvd_drift_run of its mode alone gives, bit for bit, and in d[i].seconds
 * its own steps' time and an equal share, with the candidates still
 * running, of the reference's. Every candidate's cache, and its shadow, is
 * held at once. A candidate whose step fails (a non-finite activation,
 * say) drops out with d[i].failed and d[i].error set; the others run on,
 * their figures unchanged. 0 when every candidate ran through; -2 with err
 * set when it failed before the first step (memory for the caches and
 * models: fewer modes at once may fit); -1 with err set when a step failed
 * (the first failure, named by its mode when there are several; a
 * failure of the reference's fails every candidate). */
int kvd_drift_run_modes(const kvd_backend *be, const kvd_weights *w, const uint32_t *tok,
                        const uint8_t *is_copy, const uint8_t *copy_start, int64_t n, int n_modes,
                        const kvd_kv_mode *modes, const kvd_kv_scales *const *scales,
                        const kvd_drift_opts *o, kvd_drift *d, char *err);

/* qsort's order of floats, ascending. */
static inline int kvd_cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Percentile q (0..1) of sorted v[0..n): linear interpolation between the
 * closest ranks; NaN for n = 0. The results file's readers pool traces with
 * it, so it is here, whole. */
static inline double kvd_percentile_sorted(const float *v, int64_t n, double q) {
    if (n <= 0) return NAN;
    double x = q * (double)(n - 1);
    int64_t i = (int64_t)x;
    return i + 1 < n ? v[i] + (x - (double)i) * ((double)v[i + 1] - v[i]) : v[n - 1];
}
/* The same of unsorted v, which it sorts. */
double kvd_percentile_f(float *v, int64_t n, double q);

/* Percentile q (0..1) of the output KL over a subset. */
double kvd_drift_kl_percentile(const kvd_drift *d, kvd_subset s, double q);

#endif
