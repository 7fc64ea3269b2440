/* kvdrift: lock-step drift. The trace goes through both models in the same
 * chunks, the reference first. The candidate has the reference set as its
 * reference, so the model itself compares its hidden states after every
 * layer, its logits and its attention at sampled positions with the
 * reference's, where they were computed (on the device, on a GPU); the hooks
 * receive the comparisons' figures, and the routed experts of each side.
 * The chunk's figures are accumulated before the next chunk, so no
 * whole-run state is kept. */
#include "drift.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/clock.h"
#include "model.h"

const char *const kvd_subset_names[KVD_NSUB] = {"all", "copy", "other"};
const char *const kvd_out_names[KVD_OUT_N] = {"kl", "top1_agree", "delta_p", "delta_nll"};
const char *const kvd_hid_names[KVD_HID_N] = {"rel_l2", "cosine"};
const char *const kvd_att_names[KVD_ATT_N] = {"kl", "out_rel_l2", "argmax_agree"};
const char *const kvd_view_names[KVD_VIEW_N] = {"isolated", "propagated"};

double kvd_stat_mean(const kvd_stat *s) {
    return s->n > 0 ? s->sum / s->n : NAN;
}

double kvd_stat_ci95(const kvd_stat *s) {
    if (s->n < 2) return NAN;
    double m = s->sum / s->n, var = (s->sumsq - s->n * m * m) / (s->n - 1);
    return 1.959963984540054 * sqrt(var > 0 ? var : 0) / sqrt(s->n);
}

void kvd_drift_opts_defaults(kvd_drift_opts *o) {
    memset(o, 0, sizeof *o);
    o->sample_every = 16;
    o->gen_tokens = 32;
    o->saturate = 1;
}

int kvd_drift_init(kvd_drift *d, const kvd_config *c, int64_t max_tokens) {
    memset(d, 0, sizeof *d);
    d->n_layers = c->num_hidden_layers;
    d->n_attn = kvd_config_n_full(c);
    d->kv_heads = c->num_key_value_heads;
    d->hid = calloc((size_t)d->n_layers * KVD_HID_N * KVD_NSUB * KVD_NB, sizeof(kvd_stat));
    d->att =
        calloc((size_t)d->n_attn * KVD_VIEW_N * KVD_ATT_N * KVD_NSUB * KVD_NB, sizeof(kvd_stat));
    d->router = calloc((size_t)d->n_layers * KVD_NB, sizeof(kvd_stat));
    d->att_kvh = calloc((size_t)d->n_attn * d->kv_heads * KVD_VIEW_N * KVD_NB, sizeof(kvd_stat));
    d->tok = malloc(sizeof *d->tok * (size_t)(max_tokens > 0 ? max_tokens : 1));
    d->k_stats = calloc((size_t)d->n_attn, sizeof(kvd_qstats));
    d->v_stats = calloc((size_t)d->n_attn, sizeof(kvd_qstats));
    d->k_scale = calloc((size_t)d->n_attn * d->kv_heads, sizeof(float));
    d->v_scale = calloc((size_t)d->n_attn * d->kv_heads, sizeof(float));
    return d->hid && d->att && d->router && d->tok && d->k_stats && d->v_stats && d->k_scale &&
                   d->v_scale
               ? 0
               : -1;
}

void kvd_drift_free(kvd_drift *d) {
    free(d->hid);
    free(d->att);
    free(d->router);
    free(d->att_kvh);
    free(d->tok);
    free(d->k_stats);
    free(d->v_stats);
    free(d->k_scale);
    free(d->v_scale);
    memset(d, 0, sizeof *d);
}

double kvd_percentile_f(float *v, int64_t n, double q) {
    if (n > 0) qsort(v, (size_t)n, sizeof(float), kvd_cmp_float);
    return kvd_percentile_sorted(v, n, q);
}

double kvd_drift_kl_percentile(const kvd_drift *d, kvd_subset s, double q) {
    float *v = malloc(sizeof(float) * (size_t)(d->n_tok ? d->n_tok : 1));
    int64_t n = 0;
    for (int64_t i = 0; i < d->n_tok; i++)
        if (s == KVD_SUB_ALL || (s == KVD_SUB_COPY) == (d->tok[i].copy != 0)) v[n++] = d->tok[i].kl;
    double r = kvd_percentile_f(v, n, q);
    free(v);
    return r;
}

/* ---- what the hooks receive: figures (the candidate's side) and the
 * routed experts of each side (0 reference, 1 candidate) ---- */

typedef struct {
    /* this row's figures per view, accumulated after the chunk in row order
     * (the hook runs on whichever thread got the row) */
    int have[KVD_VIEW_N];
    double fig[KVD_VIEW_N][KVD_ATT_N];
    double kvh_kl[KVD_VIEW_N][64]; /* per KV head: its query heads' mean KL */
} att_slot;

typedef struct {
    const kvd_config *c;
    kvd_drift *d;
    const uint8_t *is_copy, *copy_start;
    int sample_every;
    int side;
    int64_t p0; /* first position of the chunk */
    int rows;   /* rows of the chunk */
    int cap;    /* most rows a chunk has */
    /* the candidate's residual stream against the reference's, [layer][rows];
     * its logits against the reference's, [rows] */
    double *hrel, *hcos;
    kvd_logit_cmp *lcmp;
    int *router[2];  /* [layer][rows][k] */
    att_slot *slots; /* [attn layer][rows] */
} lockstep;

/* the candidate side's residual streams, compared by the model: relative L2
 * error and cosine similarity (1 where the two are equal) */
static void on_hidden(void *ctx, int layer, const kvd_batch *b, const int *pos,
                      const kvd_hidden_cmp *rows) {
    (void)b, (void)pos;
    lockstep *L = ctx;
    for (int r = 0; r < L->rows; r++) {
        const kvd_hidden_cmp *h = &rows[r];
        double rel = h->err2 == 0 ? 0 : sqrt(h->err2 / (h->ref2 > 0 ? h->ref2 : 1e-300));
        L->hrel[(size_t)layer * L->cap + r] = rel;
        L->hcos[(size_t)layer * L->cap + r] = rel != 0 ? h->dot / sqrt(h->ref2 * h->test2) : 1.0;
    }
}

static void on_logits(void *ctx, const kvd_batch *b, const int *pos, const kvd_logit_cmp *rows) {
    (void)b, (void)pos;
    lockstep *L = ctx;
    memcpy(L->lcmp, rows, sizeof(kvd_logit_cmp) * (size_t)L->rows);
}

static void on_router(void *ctx, int layer, const kvd_batch *b, const int *experts) {
    (void)b;
    lockstep *L = ctx;
    size_t n = (size_t)L->rows * L->c->num_experts_per_tok;
    memcpy(L->router[L->side] + (size_t)layer * n, experts, n * sizeof(int));
}

static int want_attn(void *ctx, int al, int seq, int pos) {
    (void)al, (void)seq;
    lockstep *L = ctx;
    return pos % L->sample_every == 0 || L->copy_start[pos];
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - b[i];
        num += e * e;
        den += (double)b[i] * b[i];
    }
    return num == 0 ? 0 : sqrt(num / (den > 0 ? den : 1e-300));
}

/* A view's figures from the model's per-head comparison: KL(P_ref || P_test)
 * averaged over heads (each clamped at 0, rounding can make it a hair
 * negative) and per KV head over its query heads, the fraction of heads
 * whose most-attended positions agree, the outputs' relative L2 error. */
static void att_figures(const kvd_config *c, const kvd_attn_cmp *v, double *kl, double *rel,
                        double *agree, double *kl_kvh) {
    int nh = c->num_attention_heads, hd = c->head_dim, grp = nh / c->num_key_value_heads;
    double k = 0, a = 0;
    for (int h = 0; h < c->num_key_value_heads; h++) kl_kvh[h] = 0;
    for (int h = 0; h < nh; h++) {
        double s = v->kl[h] > 0 ? v->kl[h] : 0;
        k += s;
        kl_kvh[h / grp] += s / grp;
        a += v->top_ref[h] == v->top_test[h];
    }
    *kl = k / nh;
    *agree = a / nh;
    *rel = rel_l2(v->out_test, v->out_ref, (size_t)nh * hd);
}

static void accumulate_att(lockstep *L, int al, int view, int64_t pos, double kl, double rel,
                           double agree) {
    int b = kvd_bucket(pos), sub = L->is_copy[pos] ? KVD_SUB_COPY : KVD_SUB_OTHER;
    double v[KVD_ATT_N] = {kl, rel, agree};
    for (int m = 0; m < KVD_ATT_N; m++) {
        kvd_stat_add(kvd_drift_att(L->d, al, view, m, KVD_SUB_ALL, b), v[m]);
        kvd_stat_add(kvd_drift_att(L->d, al, view, m, sub, b), v[m]);
    }
}

/* isolated (the reference side: its query over the candidate-coded
 * reference K/V, this layer's own error) and propagated (the candidate side:
 * its own query over its own cache against the reference's row) */
static void on_attn(void *ctx, int al, int seq, int pos, const kvd_attn_cmp *iso,
                    const kvd_attn_cmp *prop) {
    (void)seq;
    lockstep *L = ctx;
    att_slot *s = &L->slots[(size_t)al * L->cap + (size_t)(pos - L->p0)];
    const kvd_attn_cmp *views[KVD_VIEW_N];
    views[KVD_VIEW_ISOLATED] = iso;
    views[KVD_VIEW_PROPAGATED] = prop;
    for (int v = 0; v < KVD_VIEW_N; v++) {
        if (!views[v]) continue;
        att_figures(L->c, views[v], &s->fig[v][KVD_ATT_KL], &s->fig[v][KVD_ATT_REL_L2],
                    &s->fig[v][KVD_ATT_ARGMAX], s->kvh_kl[v]);
        s->have[v] = 1;
    }
}

/* ---- per-chunk comparisons ---- */

static void compare_chunk(lockstep *L, const float *lr, const float *lc, const uint32_t *tok,
                          int64_t n) {
    const kvd_config *c = L->c;
    kvd_drift *d = L->d;
    const int K = c->num_experts_per_tok;
    for (int r = 0; r < L->rows; r++) {
        int64_t pos = L->p0 + r;
        int b = kvd_bucket(pos), sub = L->is_copy[pos] ? KVD_SUB_COPY : KVD_SUB_OTHER;
        int flips = 0;
        for (int l = 0; l < c->num_hidden_layers; l++) {
            double rel = L->hrel[(size_t)l * L->cap + r], cs = L->hcos[(size_t)l * L->cap + r];
            kvd_stat_add(kvd_drift_hid(d, l, KVD_HID_REL_L2, KVD_SUB_ALL, b), rel);
            kvd_stat_add(kvd_drift_hid(d, l, KVD_HID_REL_L2, sub, b), rel);
            kvd_stat_add(kvd_drift_hid(d, l, KVD_HID_COS, KVD_SUB_ALL, b), cs);
            kvd_stat_add(kvd_drift_hid(d, l, KVD_HID_COS, sub, b), cs);
            if (c->num_experts > 0) {
                const int *ea = L->router[0] + ((size_t)l * L->rows + r) * K;
                const int *ex = L->router[1] + ((size_t)l * L->rows + r) * K;
                int same = 1;
                for (int i = 0; i < K && same; i++) {
                    int found = 0;
                    for (int j = 0; j < K; j++) found |= ea[i] == ex[j];
                    same = found;
                }
                kvd_stat_add(&d->router[(size_t)l * KVD_NB + b], !same);
                flips += !same;
            }
        }
        /* output: the prediction at pos is of token pos + 1 */
        if (pos + 1 >= n) continue;
        /* the next token's logits: the model's, within the chunk; the last
         * row's, from the logits the step gave back */
        const kvd_logit_cmp lc1 = L->lcmp[r];
        double kl = lc1.kl;
        uint32_t next = tok[pos + 1];
        double a_next = r + 1 < L->rows ? lc1.a_target : lr[next];
        double x_next = r + 1 < L->rows ? lc1.x_target : lc[next];
        double nll_a = lc1.lse_a - a_next, nll_x = lc1.lse_x - x_next;
        double v[KVD_OUT_N] = {kl, lc1.same_argmax, exp(-nll_x) - exp(-nll_a), nll_x - nll_a};
        int osub = L->is_copy[pos + 1] ? KVD_SUB_COPY : KVD_SUB_OTHER;
        int ob = kvd_bucket(pos);
        for (int m = 0; m < KVD_OUT_N; m++) {
            kvd_stat_add(&d->out[m][KVD_SUB_ALL][ob], v[m]);
            kvd_stat_add(&d->out[m][osub][ob], v[m]);
        }
        d->tok[d->n_tok++] =
            (kvd_token_fig){(float)kl,
                            (float)v[KVD_OUT_DP],
                            (float)v[KVD_OUT_DNLL],
                            (float)L->hrel[(size_t)(c->num_hidden_layers - 1) * L->cap + r],
                            NAN, /* attention: set once the chunk's sampled positions are in */
                            NAN,
                            osub == KVD_SUB_COPY,
                            lc1.same_argmax != 0,
                            (uint16_t)flips};
    }
}

/* One candidate of a lock step: its cache, its shadow (the isolated view's
 * reference K/V in its codec), its model, and its comparisons. */
typedef struct {
    kvd_kvcache kc, ks;
    kvd_engine mc;
    lockstep L;
    float *lc; /* its last step's last row's logits */
} candidate;

/* the candidates still in the lock step: those whose figures have not failed */
static int alive_count(const kvd_drift *d, int k) {
    int alive = 0;
    for (int i = 0; i < k; i++) alive += !d[i].failed;
    return alive;
}

/* Candidate j's step failed with the message in err: it drops out, and
 * its figures say why. The number of candidates still running. */
static int drop_out(kvd_drift *d, int k, int j, const char *err) {
    d[j].failed = 1;
    snprintf(d[j].error, sizeof d[j].error, "%s", err);
    return alive_count(d, k);
}

/* Greedy continuation of the reference and each candidate from the same
 * prefix: each branches its own sequence (cache and recurrent state) and
 * feeds back its own tokens; the reference's tokens do not depend on the
 * candidates, so one reference run serves them all. */
static int generate(kvd_engine *mr, kvd_kvcache *kr, candidate *cd, int k, int64_t prefix, int ntok,
                    const float *last_r, int V, kvd_drift *d, char *err) {
    int sr = kvd_engine_fork(mr, kr, 0), *sc = malloc(sizeof(int) * (size_t)k);
    int32_t *tc = malloc(sizeof(int32_t) * (size_t)k);
    float *lr = malloc(sizeof(float) * (size_t)V);
    int i = 0, rc = -1;
    if (!sc || !tc || !lr) {
        snprintf(err, KVD_ERR_LEN, "generation: out of memory");
        goto out;
    }
    for (int j = 0; j < k; j++) sc[j] = -1;
    for (i = 0; i < k && sr >= 0; i++)
        if (!d[i].failed && (sc[i] = kvd_engine_fork(&cd[i].mc, &cd[i].kc, 0)) < 0) break;
    if (sr < 0 || i < k) {
        snprintf(err, KVD_ERR_LEN, "generation: KV cache has no room to branch at %lld tokens",
                 (long long)prefix);
        goto out;
    }
    int32_t tr = kvd_argmax(last_r, V);
    int alive = alive_count(d, k);
    for (int j = 0; j < k; j++) {
        kvd_gen_result *g = &d[j].gen[d[j].n_gen];
        tc[j] = kvd_argmax(cd[j].lc, V);
        *g = (kvd_gen_result){prefix, ntok, ntok, 0};
    }
    int one = 1;
    for (int t = 0; t < ntok; t++) {
        for (int j = 0; j < k; j++) {
            kvd_gen_result *g = &d[j].gen[d[j].n_gen];
            if (tr == tc[j]) {
                g->agree++;
            } else if (g->first_divergence == ntok) {
                g->first_divergence = t;
            }
        }
        if (t + 1 == ntok) break;
        kvd_batch br = {1, &sr, &one, &tr};
        double t0 = kvd_now();
        if (kvd_engine_forward(mr, kr, &br, lr, 1, err)) {
            kvd_err_prefix(err, "the bf16 reference");
            goto out;
        }
        double share = (kvd_now() - t0) / alive;
        for (int j = 0; j < k; j++) {
            if (d[j].failed) continue;
            kvd_batch bc = {1, &sc[j], &one, &tc[j]};
            t0 = kvd_now();
            if (kvd_engine_forward(&cd[j].mc, &cd[j].kc, &bc, cd[j].lc, 1, err)) {
                if (!(alive = drop_out(d, k, j, err))) break;
                continue;
            }
            tc[j] = kvd_argmax(cd[j].lc, V);
            d[j].seconds += kvd_now() - t0 + share;
        }
        if (!alive) break;
        tr = kvd_argmax(lr, V);
    }
    for (int j = 0; j < k; j++) d[j].n_gen += !d[j].failed;
    rc = 0;
out:
    if (sr >= 0) kvd_kvcache_release(kr, sr);
    for (int j = 0; j < k && sc; j++)
        if (sc[j] >= 0) kvd_kvcache_release(&cd[j].kc, sc[j]);
    free(sc), free(tc), free(lr);
    return rc;
}

/* A chunk's sampled attention figures into each layer's buckets, and their
 * mean over the layers into each position's own figures. */
static void chunk_attention(lockstep *L, int64_t n) {
    const kvd_config *c = L->c;
    const int nf = kvd_config_n_full(c), kvh = c->num_key_value_heads;
    kvd_drift *d = L->d;
    for (int r = 0; r < L->rows; r++) {
        const int64_t p = L->p0 + r;
        double sum[KVD_VIEW_N] = {0};
        int k[KVD_VIEW_N] = {0};
        for (int al = 0; al < nf; al++) {
            att_slot *s = &L->slots[(size_t)al * L->cap + r];
            for (int v = 0; v < KVD_VIEW_N; v++) {
                if (!s->have[v]) continue;
                accumulate_att(L, al, v, p, s->fig[v][0], s->fig[v][1], s->fig[v][2]);
                for (int h = 0; h < kvh && h < 64; h++)
                    kvd_stat_add(kvd_drift_att_kvh(d, al, h, v, kvd_bucket(p)), s->kvh_kl[v][h]);
                sum[v] += s->fig[v][KVD_ATT_KL], k[v]++;
            }
            s->have[0] = s->have[1] = 0;
        }
        if (p + 1 >= n) continue; /* the last position predicts nothing */
        kvd_token_fig *t = &d->tok[p];
        if (k[KVD_VIEW_ISOLATED])
            t->attn_isolated = (float)(sum[KVD_VIEW_ISOLATED] / k[KVD_VIEW_ISOLATED]);
        if (k[KVD_VIEW_PROPAGATED])
            t->attn_propagated = (float)(sum[KVD_VIEW_PROPAGATED] / k[KVD_VIEW_PROPAGATED]);
    }
}

/* The hooks and shadows of a lock step on (on = 1) or off (generation),
 * and the candidates' sharing of the reference's layers below the first
 * full-attention layer (kvd_model_share_prefix) with them.
 * With the view on the candidates' side each candidate holds its own
 * shadow; else the one candidate's shadow is on the reference, whose
 * attn_cmp then gives the isolated view into the candidate's figures. */
static int lockstep_hooks(kvd_engine *mr, candidate *cd, int k, int cand_side, int on, char *err) {
    for (int j = 0; j < k; j++) {
        kvd_hooks hk = {.ctx = &cd[j].L,
                        .hidden_cmp = on_hidden,
                        .logits_cmp = on_logits,
                        .attn_cmp = on_attn,
                        .want_attn = want_attn,
                        .router = on_router};
        if ((j == 0 && kvd_engine_set_hooks(mr, on ? &hk : NULL, err)) ||
            kvd_engine_set_hooks(&cd[j].mc, on ? &hk : NULL, err) ||
            kvd_engine_set_shadow(cand_side ? &cd[j].mc : mr, on ? &cd[j].ks : NULL, err))
            return -1;
        /* the trace's chunks: each candidate steps over the reference's rows */
        kvd_engine_share_prefix(&cd[j].mc, on);
    }
    return 0;
}

int kvd_drift_run(const kvd_backend *be, const kvd_weights *w, const uint32_t *tok,
                  const uint8_t *is_copy, const uint8_t *copy_start, int64_t n, kvd_kv_mode mode,
                  const kvd_kv_scales *scales, const kvd_drift_opts *o, kvd_drift *d, char *err) {
    return kvd_drift_run_modes(be, w, tok, is_copy, copy_start, n, 1, &mode, &scales, o, d, err);
}

int kvd_drift_run_modes(const kvd_backend *be, const kvd_weights *w, const uint32_t *tok,
                        const uint8_t *is_copy, const uint8_t *copy_start, int64_t n, int n_modes,
                        const kvd_kv_mode *modes, const kvd_kv_scales *const *scales,
                        const kvd_drift_opts *o, kvd_drift *d, char *err) {
    const int cand_side = be->ops->shadow_of_reference;
    if (n_modes > 1 && !cand_side) { /* the reference holds the one shadow */
        int rc = 0;
        char one[KVD_ERR_LEN];
        for (int j = 0; j < n_modes; j++) {
            /* d[j].failed is set by any failure (alone, fewer at once cannot help) */
            int r = kvd_drift_run_modes(be, w, tok, is_copy, copy_start, n, 1, modes + j,
                                        scales + j, o, d + j, one);
            if (r && !rc) snprintf(err, KVD_ERR_LEN, "%s: %s", kvd_kv_mode_name(modes[j]), one);
            rc |= r;
        }
        return rc ? -1 : 0;
    }
    const kvd_config *c = &w->cfg;
    const int R = 256, V = c->vocab_size, k = n_modes;
    const int nf = kvd_config_n_full(c), kvh = c->num_key_value_heads;
    for (int j = 0; j < k; j++) d[j].failed = 0, d[j].error[0] = 0;
    /* in whole blocks: the trace's, and a branch's (a copy of up to n
     * tokens, growing by gen_tokens); counted in tokens, two sequences'
     * partial blocks could leave the branch a block short */
    const int64_t B = KVD_KV_BLOCK;
    int64_t cap = B * ((n + B - 1) / B + (o->n_gen > 0 ? (n + o->gen_tokens + B - 1) / B : 0));
    kvd_kvcache kr;
    /* whole: a failure now is the whole run's (before the steps, or the
     * reference's), so every candidate's */
    int rc = -1, stepping = 0, alive = k, whole = 1;
    memset(&kr, 0, sizeof kr);
    kvd_engine mr = {0};
    candidate *cd = calloc((size_t)k, sizeof *cd);
    /* the reference's routed experts, [layer][rows][k], every candidate's side 0 */
    size_t hn = (size_t)c->num_hidden_layers * R;
    size_t rn = hn * (c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
    int *ref_router = calloc(rn, sizeof(int));
    /* each chunk's last row's logits (the models compare every row's) */
    float *lr = malloc(sizeof(float) * (size_t)V);
    if (!cd || !ref_router || !lr) {
        snprintf(err, KVD_ERR_LEN, "drift: out of memory");
        goto out;
    }
    if (kvd_kvcache_init(&kr, KVD_KV_BF16, nf, kvh, c->head_dim, KVD_KV_BLOCK, cap, NULL, 1, err) ||
        kvd_engine_open(&mr, be, w, &kr, R, 4, NULL, err))
        goto out;
    for (int j = 0; j < k; j++) {
        candidate *e = &cd[j];
        d[j].seconds = 0;
        if (kvd_kvcache_init(&e->kc, modes[j], nf, kvh, c->head_dim, KVD_KV_BLOCK, cap, scales[j],
                             o->saturate, err) ||
            kvd_kvcache_init(&e->ks, modes[j], nf, kvh, c->head_dim, KVD_KV_BLOCK, n + KVD_KV_BLOCK,
                             scales[j], o->saturate, err))
            goto out;
        /* the candidate computes attention as its engine would: over its
         * cache and over the shadow (the isolated view) alike */
        if (o->attn_fp8 &&
            (kvd_kvcache_fp8_attention(&e->kc, scales[j], c->num_attention_heads, err) ||
             kvd_kvcache_fp8_attention(&e->ks, scales[j], c->num_attention_heads, err)))
            goto out;
        if (kvd_engine_open(&e->mc, be, w, &e->kc, R, 4, &mr, err)) goto out;
        lockstep *L = &e->L;
        L->c = c;
        L->cap = R;
        L->d = &d[j];
        L->is_copy = is_copy;
        L->copy_start = copy_start;
        L->sample_every = o->sample_every > 0 ? o->sample_every : 16;
        L->hrel = malloc(hn * sizeof(double)), L->hcos = malloc(hn * sizeof(double));
        L->lcmp = malloc((size_t)R * sizeof(kvd_logit_cmp));
        L->router[0] = ref_router, L->router[1] = calloc(rn, sizeof(int));
        L->slots = calloc((size_t)nf * R, sizeof(att_slot));
        e->lc = malloc(sizeof(float) * (size_t)V);
        if (!L->hrel || !L->hcos || !L->lcmp || !L->router[1] || !L->slots || !e->lc) {
            snprintf(err, KVD_ERR_LEN, "drift: out of memory");
            goto out;
        }
        if (kvd_engine_set_reference(&e->mc, &mr, &kr, err)) goto out;
        kvd_kvcache_add_seq(&e->kc), kvd_kvcache_add_seq(&e->ks);
    }
    if (lockstep_hooks(&mr, cd, k, cand_side, 1, err)) goto out;
    stepping = 1;                              /* a failure from here on is a step's */
    int sr = kvd_kvcache_add_seq(&kr), sc = 0; /* every candidate's first sequence */
    int gi = 0;
    for (int64_t p0 = 0; p0 < n;) {
        /* chunks end at each generation prefix, so the branch starts there */
        int64_t end = p0 + R < n ? p0 + R : n;
        while (gi < o->n_gen && o->gen_prefix[gi] <= p0) gi++;
        if (gi < o->n_gen && o->gen_prefix[gi] < end) end = o->gen_prefix[gi];
        int rows = (int)(end - p0);
        int32_t *chunk = (int32_t *)(tok + p0);
        kvd_batch br = {1, &sr, &rows, chunk}, bc = {1, &sc, &rows, chunk};
        for (int j = 0; j < k; j++) cd[j].L.p0 = p0, cd[j].L.rows = rows, cd[j].L.side = 1;
        cd[0].L.side = 0; /* the reference's routed experts into side 0 */
        double t0 = kvd_now();
        if (kvd_engine_forward(&mr, &kr, &br, lr, 1, err)) {
            kvd_err_prefix(err, "the bf16 reference");
            goto out;
        }
        double share = (kvd_now() - t0) / alive;
        cd[0].L.side = 1;
        for (int j = 0; j < k; j++) {
            if (d[j].failed) continue;
            t0 = kvd_now();
            if (kvd_engine_forward(&cd[j].mc, &cd[j].kc, &bc, cd[j].lc, 1, err)) {
                alive = drop_out(d, k, j, err);
                continue;
            }
            compare_chunk(&cd[j].L, lr, cd[j].lc, tok, n);
            chunk_attention(&cd[j].L, n);
            d[j].seconds += kvd_now() - t0 + share;
        }
        p0 = end;
        if (!alive) break;
        if (gi < o->n_gen && o->gen_prefix[gi] == end && o->gen_tokens > 0) {
            if (lockstep_hooks(&mr, cd, k, cand_side, 0, err) ||
                generate(&mr, &kr, cd, k, end, o->gen_tokens, lr, V, d, err) ||
                lockstep_hooks(&mr, cd, k, cand_side, 1, err))
                goto out;
            if (!(alive = alive_count(d, k))) break;
            gi++;
        }
    }
    for (int j = 0; j < k; j++)
        for (int l = 0; l < nf; l++) {
            d[j].k_stats[l] = cd[j].kc.k_stats[l];
            d[j].v_stats[l] = cd[j].kc.v_stats[l];
            for (int h = 0; h < kvh; h++) {
                d[j].k_scale[l * kvh + h] = cd[j].kc.k_scale[l * kvh + h];
                d[j].v_scale[l * kvh + h] = cd[j].kc.v_scale[l * kvh + h];
            }
        }
    rc = alive < k ? -1 : 0, whole = 0;
    /* the run's message: a failed candidate's, named where there are several */
    for (int j = 0; j < k && rc; j++)
        if (d[j].failed) {
            snprintf(err, KVD_ERR_LEN, "%s", d[j].error);
            if (k > 1) kvd_err_prefix(err, kvd_kv_mode_name(modes[j]));
            break;
        }
out:
    /* a failure of the whole run (before the steps, or the reference's) is every candidate's */
    for (int j = 0; j < k && rc && whole; j++)
        if (!d[j].failed) d[j].failed = 1, snprintf(d[j].error, sizeof d[j].error, "%s", err);
    for (int j = 0; cd && j < k; j++) {
        candidate *e = &cd[j];
        free(e->L.slots), free(e->L.hrel), free(e->L.hcos), free(e->L.lcmp), free(e->L.router[1]);
        free(e->lc);
        kvd_engine_close(&e->mc);
        kvd_kvcache_free(&e->kc), kvd_kvcache_free(&e->ks);
    }
    free(cd), free(ref_router), free(lr);
    kvd_engine_close(&mr);
    kvd_kvcache_free(&kr);
    return rc && !stepping ? -2 : rc;
}
