/* kvdrift: the hybrid model's forward pass on the device. It follows
 * kvd_forward (model.c) line for line; each operation is a device kernel
 * (kernels/cuda), held to its CPU twin by tests/gpu, and this file only
 * places buffers and launches. Activations stay in FP32, weights are BF16
 * (exact: the synthetic weights are BF16 values), so the device and the CPU
 * differ by the order of their sums alone.
 *
 * Tensor parallelism: a model over n devices is n ranks, each a
 * kvd_cuda_model with its share of the heads, experts and intermediate
 * columns (dev_part) and a local config of that size, so the per-layer code
 * is the same for any n. The output projections (o_proj, out_proj, the
 * experts' and the dense MLP's down projections) give partial sums, summed
 * over the ranks after each mixer and each MoE layer; everything else is
 * replicated. One device is one rank, through the same code. Rank 0 is the
 * handle callers hold, and holds the others. */
#include "model_cuda.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/clock.h"
#include "../kernels/backend.h"
#include "../kernels/cuda/cuda_kernels.h"
#include "engine.h"

/* A rank's share (rank of n): query heads from nh0, KV heads from kv0 (each
 * rank one copy when there are more ranks than KV heads: `primary` is the
 * first copy, whose cache counters count), DeltaNet key and value heads
 * from nk0 and nv0, experts [e0, e1), and the shared expert's and the dense
 * MLP's intermediate columns from is0 and i0. */
typedef struct {
    int rank, n;
    int nh0, kv0, nk0, nv0, e0, e1, is0, i0;
    int primary;
} dev_part;

/* device allocations, freed together */
typedef struct {
    void **p;
    int n, cap;
} dev_allocs;

typedef struct {
    void *q_proj, *k_proj, *v_proj, *o_proj;
    float *q_norm, *k_norm;
    void *in_proj_qkvz, *in_proj_ba, *out_proj;
    float *conv1d, *A_log, *dt_bias, *gdn_norm;
    float *input_norm, *post_norm;
    void *router, **exp_gate, **exp_up, **exp_down;
    void **exp_tab; /* on the device: this rank's experts' gate, up, down ([3][E]) */
    void *sh_gate, *sh_up, *sh_down, *sh_expert_gate;
    void *dense_gate, *dense_up, *dense_down;
} dev_layer;

/* The weights on the device, shared by the models made from one
 * (kvd_cuda_model_new_shared) and freed with the last of them. */
typedef struct {
    dev_layer L[KVD_MAX_LAYERS];
    void *embed, *lm_head;
    float *final_norm, *inv_freq;
    dev_allocs mem;
    int refs;
} dev_weights;

/* A KV cache on the device: K and V pools per full-attention layer in the
 * host cache's layout, its scales, the step's counters (n, saturated,
 * flushed, subnormal for K then V per layer) and absmax bits, the block
 * tables of max_seqs sequences and the step's physical row slots. The
 * model's own cache, and the shadow (set_shadow: the drift figures'
 * isolated view). */
typedef struct {
    kvd_fmt fmt;
    int saturate, block_size, n_blocks;
    size_t pool_bytes;
    void **kpool, **vpool;
    float *kscale, *vscale;
    unsigned long long *stats;
    unsigned int *absmax;
    int32_t *btab, *slot; /* btab: n_blocks entries per sequence */
    int32_t *h_slot;
    /* FP8 attention (the host cache's q_scale): this rank's query heads'
     * scales [layer][head], NULL without; the queries' absmax bits where the
     * host cache notes them (calibration), NULL without */
    float *qscale;
    unsigned int *qabsmax;
} dev_kv;

struct kvd_cuda_model {
    kvd_config c, full; /* c: this rank's share of full */
    dev_part p;
    struct kvd_cuda_model *rk[KVD_MAX_RANKS]; /* rank 0: every rank, itself first */
    kvd_comm *comm;                           /* rank 0 */
    float *mixes[KVD_MAX_RANKS];              /* rank 0: each rank's mix, for the sums */
    int max_rows, max_seqs;
    int attn_index[KVD_MAX_LAYERS], lin_index[KVD_MAX_LAYERS], n_full, n_lin;
    kvd_hooks hooks;
    dev_weights *wt;
    /* activations */
    float *x, *xn, *mix, *qg, *qh, *kb, *vb, *att;
    float *qkvz, *ba, *conv, *z, *beta, *gdec, *gdn_o;
    float *rlogit, *topw, *gx, *g1, *g2, *gy, *sh1, *sh2, *shg, *logits;
    int *topi, *slots_moe, *d_next;
    /* KVD_CUDA_MOE: unset, the experts' lists on the device up to
     * KVD_GROUPED_ROWS rows; "host", always on the host; "loop", on the host
     * and a launch per expert and product */
    enum { MOE_DEVICE, MOE_HOST, MOE_LOOP } moe_mode;
    int32_t *tok;
    int *pos, *seqs, *row0, *ntok;
    /* rank 0: kvd_cuda_model_profile's sums, and the last phase's end */
    int profile;
    double phase_s[KVD_PHASES], phase_end;
    float *attn_scratch;
    size_t attn_scratch_floats;
    float *d_qfp8; /* FP8 attention over the shadow: this model's queries in E4M3 */
    /* int4-token (an I4T cache, the shadow's): the queries rotated as the
     * cache's rows are, [max_rows][heads][head_dim]: this model's own, and
     * the isolated view's over the shadow (NULL where neither is I4T) */
    float *d_qrot, *d_qrot_iso;
    unsigned long long *nonfinite;
    /* the cache, and the shadow cache with its host bookkeeping (NULL: none) */
    int kv_heads, head_dim;
    dev_kv kc, sc;
    kvd_kvcache *shadow;
    /* the comparing hooks' reference model (rank 0; NULL: none); as a
     * reference, each rank's queries of the last step, [attn layer][max_rows]
     * [heads][head_dim], and on rank 0 its residual streams [layer][max_rows]
     * [H], its row count and how many rows' logits it left in `logits` */
    struct kvd_cuda_model *ref;
    float *d_held, *d_hx;
    /* as a reference, each rank's K (after norm and RoPE) and V rows of the
     * last step, [attn layer][max_rows][kv heads][head_dim]: what a comparing
     * model with a shadow writes into it; comparing, the reference's model
     * of this rank (every rank; NULL: none) */
    float *d_held_k, *d_held_v;
    struct kvd_cuda_model *ref_rank;
    int held_rows, held_logits_rows;
    /* rank 0, comparing: the figures on the device and their host copies,
     * the logits' target tokens */
    kvd_hidden_cmp *d_hcmp, *h_hcmp;
    kvd_logit_cmp *d_lcmp, *h_lcmp;
    int *d_target, *h_target;
    /* the attn_cmp hook's sampled rows, each rank's heads: the distributions
     * of a group of rows over their own cache, the shadow and the
     * reference's cache, [ATTN_GROUP][heads][probs_ctx]; for up to max_rows
     * rows (allocated with the first): the outputs before the gate
     * [row][own, shadow, reference][heads][head_dim], the KL [view][row]
     * [heads], the most-attended positions [isolated ref, test, propagated
     * ref, test][row][heads], and each row's index and context */
    float *d_probs, *d_sprobs, *d_rprobs, *d_outs;
    double *d_kl;
    int *d_top, *d_rowidx;
    size_t probs_ctx;
    /* rank 0: the same of every head, a rank's staging, the sampled rows
     * ([2][max_rows]: index, context), and the K/V hook's rows */
    float *h_outs, *h_souts;
    double *h_kl, *h_skl;
    int *h_top, *h_stop, *h_sel;
    float *h_k, *h_v;
    /* recurrent state per sequence slot and DeltaNet layer */
    float *conv_state, *ssm;
    size_t conv_len, ssm_len; /* per sequence slot, all DeltaNet layers */
    /* host staging */
    int *h_pos, *h_row_seq, *h_topi, *h_slots, *h_seqs, *h_row0, *h_ntok, *h_next;
    float *h_x;
    /* the weights being uploaded (lazy ones are made one tensor at a time,
     * just before their upload; what went wrong making one), and a BF16
     * staging buffer */
    const kvd_weights *up_w;
    char up_err[KVD_ERR_LEN];
    uint16_t *stage16;
    size_t stage16_n;
    /* the model's own device allocations */
    dev_allocs mem;
};

static void *dalloc(dev_allocs *a, size_t n) {
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 256;
        void **p = realloc(a->p, sizeof(void *) * (size_t)cap);
        if (!p) return NULL;
        a->p = p;
        a->cap = cap;
    }
    void *p = kvd_cuda_alloc(n);
    if (p) a->p[a->n++] = p;
    return p;
}
static void dev_allocs_free(dev_allocs *a) {
    for (int i = 0; i < a->n; i++) kvd_cuda_free(a->p[i]);
    free(a->p);
    memset(a, 0, sizeof *a);
}

static void dev_weights_release(dev_weights *wt) {
    if (!wt || --wt->refs > 0) return;
    dev_allocs_free(&wt->mem);
    for (int l = 0; l < KVD_MAX_LAYERS; l++) {
        free(wt->L[l].exp_gate);
        free(wt->L[l].exp_up);
        free(wt->L[l].exp_down);
    }
    free(wt);
}

static void rank_free(kvd_cuda_model *m) {
    if (!m) return;
    kvd_cuda_set_device(m->p.rank);
    dev_allocs_free(&m->mem);
    dev_weights_release(m->wt);
    kvd_cuda_free(m->d_probs), kvd_cuda_free(m->d_sprobs), kvd_cuda_free(m->d_rprobs);
    free(m->kc.kpool), free(m->kc.vpool), free(m->kc.h_slot);
    free(m->sc.kpool), free(m->sc.vpool), free(m->sc.h_slot);
    free(m->h_outs), free(m->h_souts), free(m->h_kl), free(m->h_skl), free(m->h_top);
    free(m->h_stop), free(m->h_sel), free(m->h_k), free(m->h_v);
    free(m->h_hcmp), free(m->h_lcmp), free(m->h_target);
    free(m->stage16);
    free(m->h_pos), free(m->h_row_seq), free(m->h_topi), free(m->h_slots), free(m->h_next);
    free(m->h_seqs), free(m->h_row0), free(m->h_ntok), free(m->h_x);
    free(m);
}

void kvd_cuda_model_free(kvd_cuda_model *m) {
    if (!m) return;
    kvd_comm *comm = m->comm;
    int n = m->p.n;
    for (int r = n - 1; r > 0; r--) rank_free(m->rk[r]);
    rank_free(m);
    kvd_cuda_comm_free(comm);
    kvd_cuda_set_device(0);
}

/* Lazy weights: make the tensor that src belongs to before its upload
 * (kvd_weights_make; a failure sets *bad and up_err), and give its pages
 * back after (kvd_weights_unmake). */
static kvd_tensor *lazy_make(kvd_cuda_model *m, const float *src, int *bad) {
    int rc;
    kvd_tensor *t = kvd_weights_make(m->up_w, src, &rc, m->up_err);
    if (rc) *bad = 1;
    return t;
}

/* rows [r0, r0 + nr) and columns [c0, c0 + nc) of a matrix with ld columns,
 * as a BF16 [nr][nc] matrix (converted on all cores); a vector as FP32;
 * NULL source: NULL */
static void *up_slice(kvd_cuda_model *m, dev_allocs *to, const float *src, size_t ld, size_t r0,
                      size_t nr, size_t c0, size_t nc, int *bad) {
    if (!src || *bad) return NULL;
    size_t n = nr * nc;
    void *d = dalloc(to, n * 2);
    if (n > m->stage16_n) {
        free(m->stage16);
        m->stage16 = malloc(n * 2);
        m->stage16_n = m->stage16 ? n : 0;
    }
    if (!d || !m->stage16) {
        *bad = 1;
        return NULL;
    }
    kvd_tensor *made = lazy_make(m, src, bad);
    if (*bad) return NULL;
    if (nc == ld) {
        const size_t chunk = (size_t)1 << 20;
        const float *s0 = src + r0 * ld;
        long nch = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
        for (long ci = 0; ci < nch; ci++) {
            size_t i0 = (size_t)ci * chunk, k = n - i0 < chunk ? n - i0 : chunk;
            kvd_quant_bf16(s0 + i0, m->stage16 + i0, k);
        }
    } else {
#pragma omp parallel for schedule(static)
        for (long r = 0; r < (long)nr; r++)
            kvd_quant_bf16(src + (r0 + (size_t)r) * ld + c0, m->stage16 + (size_t)r * nc, nc);
    }
    if (kvd_cuda_upload(d, m->stage16, n * 2)) *bad = 1;
    kvd_weights_unmake(made);
    return d;
}
static void *up_mat(kvd_cuda_model *m, dev_allocs *to, const float *src, size_t rows, size_t cols,
                    int *bad) {
    return up_slice(m, to, src, cols, 0, rows, 0, cols, bad);
}
/* FP32 rows of `len` values: [r0[i], r0[i] + nr[i]) for each of k ranges,
 * one after another */
static float *up_rows(kvd_cuda_model *m, dev_allocs *to, const float *src, size_t len, int k,
                      const size_t *r0, const size_t *nr, int *bad) {
    if (!src || *bad) return NULL;
    size_t n = 0;
    for (int i = 0; i < k; i++) n += nr[i] * len;
    float *d = dalloc(to, n * sizeof(float) + 4);
    kvd_tensor *made = d ? lazy_make(m, src, bad) : NULL;
    size_t o = 0;
    for (int i = 0; i < k && d && !*bad; i++) {
        if (kvd_cuda_upload(d + o, src + r0[i] * len, nr[i] * len * sizeof(float))) *bad = 1;
        o += nr[i] * len;
    }
    if (!d) *bad = 1;
    kvd_weights_unmake(made);
    return d;
}
static float *up_vec(kvd_cuda_model *m, dev_allocs *to, const float *src, size_t n, int *bad) {
    size_t z = 0;
    return up_rows(m, to, src, 1, 1, &z, &n, bad);
}

/* ---- a cache on the device ---- */

/* this rank's KV heads' scales, [layer][local head], uploaded into d */
static int dev_kv_scales(kvd_cuda_model *m, dev_kv *d, const kvd_kvcache *kv) {
    const int kvh = m->kv_heads, nf = m->n_full;
    float ks[(size_t)nf * kvh + 1], vs[(size_t)nf * kvh + 1];
    for (int a = 0; a < nf; a++)
        for (int h = 0; h < kvh; h++) {
            ks[a * kvh + h] = kv->k_scale[(size_t)a * kv->kv_heads + m->p.kv0 + h];
            vs[a * kvh + h] = kv->v_scale[(size_t)a * kv->kv_heads + m->p.kv0 + h];
        }
    size_t n = sizeof(float) * (size_t)nf * kvh;
    return kvd_cuda_upload(d->kscale, ks, n) || kvd_cuda_upload(d->vscale, vs, n) ? -1 : 0;
}

/* FP8 attention's query scales and calibration's query absmax, this rank's
 * query heads, where the host cache has them (allocated once: a cache set
 * again with them keeps the arrays) */
static int dev_kv_queries(kvd_cuda_model *m, dev_kv *d, const kvd_kvcache *kv) {
    const int nf = m->n_full, nhl = m->c.num_attention_heads, h0 = m->p.nh0;
    const size_t n = (size_t)nf * nhl;
    if ((kv->q_scale || kv->q_absmax) && kv->n_heads != m->full.num_attention_heads) return -1;
    if (kv->q_scale) {
        if (!d->qscale && !(d->qscale = dalloc(&m->mem, sizeof(float) * (n + 1)))) return -1;
        float qs[n + 1];
        for (int a = 0; a < nf; a++)
            for (int h = 0; h < nhl; h++)
                qs[(size_t)a * nhl + h] = kv->q_scale[(size_t)a * kv->n_heads + h0 + h];
        if (kvd_cuda_upload(d->qscale, qs, sizeof(float) * n)) return -1;
    } else {
        d->qscale = NULL;
    }
    if (kv->q_absmax && !d->qabsmax &&
        !(d->qabsmax = dalloc(&m->mem, sizeof(unsigned int) * (n + 1))))
        return -1;
    if (!kv->q_absmax) d->qabsmax = NULL;
    return 0;
}

/* the scratch FP8 attention's plain kernels need over the model's
 * cache: a row's scores, this rank's heads by the longest context (at least have) */
static size_t fp8_scratch(const kvd_cuda_model *m, size_t have) {
    const size_t need =
        (size_t)m->c.num_attention_heads * (size_t)m->kc.n_blocks * m->kc.block_size;
    return need > have ? need : have;
}

/* An NVFP4 cache with a group of query heads decode v2 has no build for
 * (not 1, 2, 4, 8 or 16) decodes on v3 from head_dim 128 on (where the
 * device has the shared memory for its stages), else on the plain kernels,
 * which need fp8_scratch's room: kept for both */
static int plain_only(const kvd_cuda_model *m, kvd_fmt fmt) {
    const int G = m->c.num_attention_heads / m->c.num_key_value_heads;
    return !kvd_fmt_tensor_cores(fmt) && (G > 16 || (G & (G - 1)) != 0);
}

static int dev_kv_init(kvd_cuda_model *m, dev_kv *d, const kvd_kvcache *kv) {
    const size_t kvh = (size_t)m->kv_heads, nf = (size_t)m->n_full;
    d->fmt = kv->fmt;
    d->saturate = kv->saturate;
    d->block_size = kv->block_size;
    d->n_blocks = kv->n_blocks;
    d->pool_bytes = (size_t)kv->n_blocks * kvh * (size_t)kv->block_size *
                    kvd_fmt_row_bytes(kv->fmt, kv->head_dim);
    d->kpool = calloc(nf + 1, sizeof(void *));
    d->vpool = calloc(nf + 1, sizeof(void *));
    d->h_slot = malloc(sizeof(int32_t) * (size_t)m->max_rows);
    if (!d->kpool || !d->vpool || !d->h_slot) return -1;
    for (size_t a = 0; a < nf; a++)
        if (!(d->kpool[a] = dalloc(&m->mem, d->pool_bytes)) ||
            !(d->vpool[a] = dalloc(&m->mem, d->pool_bytes)))
            return -1;
    d->btab = dalloc(&m->mem, sizeof(int32_t) * (size_t)m->max_seqs * (size_t)kv->n_blocks + 16);
    d->slot = dalloc(&m->mem, sizeof(int32_t) * (size_t)m->max_rows + 16);
    d->kscale = dalloc(&m->mem, sizeof(float) * (nf * kvh + 1));
    d->vscale = dalloc(&m->mem, sizeof(float) * (nf * kvh + 1));
    d->stats = dalloc(&m->mem, sizeof(unsigned long long) * (nf * 8 + 8));
    d->absmax = dalloc(&m->mem, sizeof(unsigned int) * (nf * 2 * kvh + 2));
    if (!d->btab || !d->slot || !d->kscale || !d->vscale || !d->stats || !d->absmax) return -1;
    return dev_kv_scales(m, d, kv) || dev_kv_queries(m, d, kv) ? -1 : 0;
}

static kvd_kv_view dev_kv_view(const kvd_cuda_model *m, const dev_kv *d, int al) {
    size_t o = (size_t)al * m->kv_heads;
    kvd_kv_view v = {d->fmt,
                     d->block_size,
                     m->kv_heads,
                     m->head_dim,
                     d->kpool[al],
                     d->vpool[al],
                     d->kscale + o,
                     d->vscale + o,
                     0,
                     d->qscale ? d->qscale + (size_t)al * m->c.num_attention_heads : NULL,
                     d->qscale != NULL};
    return v;
}

/* quantize this step's K and V rows (m->kb, m->vb) into layer al */
static void dev_kv_write(kvd_cuda_model *m, dev_kv *d, int al, int rows, const float *k,
                         const float *v) {
    const int kvh = m->kv_heads, hd = m->head_dim;
    kvd_cudaop_kv_write(d->fmt, d->saturate, d->block_size, kvh, hd, d->kpool[al], rows, d->slot, k,
                        d->kscale + (size_t)al * kvh, d->stats + (size_t)al * 8,
                        d->absmax + (size_t)al * 2 * kvh);
    kvd_cudaop_kv_write(d->fmt, d->saturate, d->block_size, kvh, hd, d->vpool[al], rows, d->slot, v,
                        d->vscale + (size_t)al * kvh, d->stats + (size_t)al * 8 + 4,
                        d->absmax + (size_t)al * 2 * kvh + kvh);
}

/* before a step: the batch's block tables and row slots (rows at m->h_pos of
 * m->h_row_seq), counters from zero, absmax from the host's running values */
static int dev_kv_stage(kvd_cuda_model *m, dev_kv *d, const kvd_kvcache *kv, const kvd_batch *b,
                        int rows) {
    const int bs = kv->block_size, kvh = m->kv_heads;
    int rc = 0;
    for (int s = 0; s < b->n; s++) {
        const kvd_kv_seq *q = &kv->seqs[b->seq[s]];
        rc |= kvd_cuda_stage_upload(d->btab + (size_t)b->seq[s] * d->n_blocks, q->blocks,
                                    sizeof(int32_t) * (size_t)q->n_blocks);
    }
    for (int r = 0; r < rows; r++) {
        const kvd_kv_seq *q = &kv->seqs[m->h_row_seq[r]];
        int p = m->h_pos[r];
        d->h_slot[r] = q->blocks[p / bs] * bs + p % bs;
    }
    rc |= kvd_cuda_stage_upload(d->slot, d->h_slot, sizeof(int32_t) * (size_t)rows);
    rc |= kvd_cuda_zero(d->stats, sizeof(unsigned long long) * (size_t)m->n_full * 8);
    size_t na = (size_t)m->n_full * 2 * kvh;
    unsigned int am[na + 1];
    for (int a = 0; a < m->n_full; a++)
        for (int h = 0; h < kvh; h++) {
            size_t g = (size_t)a * kv->kv_heads + m->p.kv0 + h; /* the cache's head */
            memcpy(&am[((size_t)a * 2) * kvh + h], &kv->k_absmax[g], 4);
            memcpy(&am[((size_t)a * 2 + 1) * kvh + h], &kv->v_absmax[g], 4);
        }
    rc |= kvd_cuda_stage_upload(d->absmax, am, sizeof(unsigned int) * na);
    if (d->qabsmax) { /* the queries' running absmax, this rank's heads */
        const int nhl = m->c.num_attention_heads;
        unsigned int qa[(size_t)m->n_full * nhl + 1];
        for (int a = 0; a < m->n_full; a++)
            memcpy(&qa[(size_t)a * nhl], &kv->q_absmax[(size_t)a * kv->n_heads + m->p.nh0],
                   sizeof(float) * nhl);
        rc |= kvd_cuda_stage_upload(d->qabsmax, qa, sizeof(unsigned int) * m->n_full * nhl);
    }
    return rc;
}

/* after a step (synchronised): counters and absmax into the host cache */
static int dev_kv_settle(kvd_cuda_model *m, dev_kv *d, kvd_kvcache *kv) {
    const int kvh = m->kv_heads;
    size_t na = (size_t)m->n_full * 2 * kvh;
    unsigned long long st[(size_t)m->n_full * 8 + 1];
    unsigned int am[na + 1];
    if (kvd_cuda_download(st, d->stats, sizeof st[0] * (size_t)m->n_full * 8) ||
        kvd_cuda_download(am, d->absmax, sizeof am[0] * na))
        return -1;
    for (int a = 0; a < m->n_full; a++) {
        kvd_qstats *ks = &kv->k_stats[a], *vs = &kv->v_stats[a];
        const unsigned long long *k = st + (size_t)a * 8, *v = k + 4;
        if (m->p.primary) {
            ks->n += k[0], ks->saturated += k[1], ks->flushed += k[2], ks->subnormal += k[3];
            vs->n += v[0], vs->saturated += v[1], vs->flushed += v[2], vs->subnormal += v[3];
        }
        for (int h = 0; h < kvh; h++) {
            size_t g = (size_t)a * kv->kv_heads + m->p.kv0 + h;
            memcpy(&kv->k_absmax[g], &am[((size_t)a * 2) * kvh + h], 4);
            memcpy(&kv->v_absmax[g], &am[((size_t)a * 2 + 1) * kvh + h], 4);
        }
    }
    if (d->qabsmax && kv->q_absmax) {
        const int nhl = m->c.num_attention_heads;
        unsigned int qa[(size_t)m->n_full * nhl + 1];
        if (kvd_cuda_download(qa, d->qabsmax, sizeof(unsigned int) * m->n_full * nhl)) return -1;
        for (int a = 0; a < m->n_full; a++)
            memcpy(&kv->q_absmax[(size_t)a * kv->n_heads + m->p.nh0], &qa[(size_t)a * nhl],
                   sizeof(float) * nhl);
    }
    return 0;
}

/* ---- tensor parallelism: each rank's share ---- */

/* The first of the model's sizes that n ranks cannot split evenly (its
 * value in *val), NULL when they can. KV heads split when n is a multiple
 * of their count as well as a divisor (ranks then share a head). */
static int partition(const kvd_config *c, int n, dev_part *p, char *err) {
    const int nh = c->num_attention_heads, kvh = c->num_key_value_heads;
    const int nk = c->linear_num_key_heads, E = c->num_experts;
    const int Is = c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : 0;
    if (kvd_config_tp_check(c, n, KVD_MAX_RANKS, err)) return -1;
    const int G = nh / kvh, nhl = nh / n, nv = c->linear_num_value_heads;
    for (int r = 0; r < n; r++) {
        dev_part *q = &p[r];
        memset(q, 0, sizeof *q);
        q->rank = r, q->n = n;
        q->nh0 = r * nhl;
        q->kv0 = q->nh0 / G;
        /* more ranks than KV heads: n / kvh ranks share each, the first counts */
        q->primary = kvh % n == 0 || r % (n / kvh) == 0;
        q->nk0 = r * (nk / n), q->nv0 = r * (nv / n);
        q->e0 = r * (E / n), q->e1 = q->e0 + E / n;
        q->is0 = r * (Is / n);
        q->i0 = E ? 0 : r * (c->intermediate_size / n);
    }
    return 0;
}

/* the shapes a rank computes */
static void local_config(const kvd_config *c, const dev_part *p, kvd_config *lc) {
    const int n = p->n, kvh = c->num_key_value_heads;
    *lc = *c;
    lc->num_attention_heads = c->num_attention_heads / n;
    lc->num_key_value_heads = kvh % n == 0 ? kvh / n : 1;
    lc->linear_num_key_heads = c->linear_num_key_heads / n;
    lc->linear_num_value_heads = c->linear_num_value_heads / n;
    if (c->shared_expert_intermediate_size > 0) lc->shared_expert_intermediate_size /= n;
    if (c->num_experts == 0) lc->intermediate_size /= n;
}

/* The weights as BF16 matrices and FP32 vectors, this rank's share: the
 * projections into its heads (and columns) by rows, the projections out of
 * them by columns, its experts; the rest whole. */
static int upload_weights(kvd_cuda_model *m, const kvd_weights *w) {
    const kvd_config *c = &m->full, *lc = &m->c;
    const dev_part *p = &m->p;
    dev_weights *wt = m->wt;
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, V = (size_t)c->vocab_size;
    const size_t nh = (size_t)c->num_attention_heads, nhl = (size_t)lc->num_attention_heads;
    const size_t kvhl = (size_t)lc->num_key_value_heads;
    const size_t dk = (size_t)c->linear_key_head_dim, dv = (size_t)c->linear_value_head_dim;
    const size_t nk = (size_t)c->linear_num_key_heads, nv = (size_t)c->linear_num_value_heads;
    const size_t nkl = (size_t)lc->linear_num_key_heads, nvl = (size_t)lc->linear_num_value_heads;
    const size_t rr = nv / nk, kd = nk * dk, vd = nv * dv, Kc = (size_t)c->linear_conv_kernel_dim;
    const size_t E = (size_t)c->num_experts;
    const size_t I = E ? (size_t)c->moe_intermediate_size : (size_t)c->intermediate_size;
    const size_t Il = E ? I : (size_t)lc->intermediate_size;
    const size_t Is =
        (size_t)(c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : 0);
    const size_t Isl = Is / (size_t)p->n;
    int bad = 0;
    dev_allocs *to = &wt->mem;
    wt->embed = up_mat(m, to, w->embed, V, H, &bad);
    wt->lm_head = w->lm_head == w->embed ? wt->embed : up_mat(m, to, w->lm_head, V, H, &bad);
    wt->final_norm = up_vec(m, to, w->final_norm, H, &bad);
    for (int l = 0; l < c->num_hidden_layers && !bad; l++) {
        const kvd_layer_weights *lw = &w->layers[l];
        dev_layer *d = &wt->L[l];
        d->input_norm = up_vec(m, to, lw->input_norm, H, &bad);
        d->post_norm = up_vec(m, to, lw->post_norm, H, &bad);
        if (c->layer_types[l] == KVD_LAYER_FULL) {
            /* q rows are [query | gate] per head */
            d->q_proj = up_slice(m, to, lw->q_proj, H, p->nh0 * 2 * hd, nhl * 2 * hd, 0, H, &bad);
            d->k_proj = up_slice(m, to, lw->k_proj, H, p->kv0 * hd, kvhl * hd, 0, H, &bad);
            d->v_proj = up_slice(m, to, lw->v_proj, H, p->kv0 * hd, kvhl * hd, 0, H, &bad);
            d->o_proj = up_slice(m, to, lw->o_proj, nh * hd, 0, H, p->nh0 * hd, nhl * hd, &bad);
            d->q_norm = up_vec(m, to, lw->q_norm, hd, &bad);
            d->k_norm = up_vec(m, to, lw->k_norm, hd, &bad);
        } else {
            /* the fused projections are grouped per key head: q, k, r v's, r z's; r b's, r a's */
            const size_t g = 2 * dk + 2 * rr * dv;
            d->in_proj_qkvz = up_slice(m, to, lw->in_proj_qkvz, H, p->nk0 * g, nkl * g, 0, H, &bad);
            d->in_proj_ba =
                up_slice(m, to, lw->in_proj_ba, H, p->nk0 * 2 * rr, nkl * 2 * rr, 0, H, &bad);
            d->out_proj = up_slice(m, to, lw->out_proj, vd, 0, H, p->nv0 * dv, nvl * dv, &bad);
            /* conv channels: q, k, v of every head */
            size_t r0[3] = {p->nk0 * dk, kd + p->nk0 * dk, 2 * kd + p->nv0 * dv};
            size_t nr[3] = {nkl * dk, nkl * dk, nvl * dv};
            d->conv1d = up_rows(m, to, lw->conv1d, Kc, 3, r0, nr, &bad);
            d->A_log = up_vec(m, to, lw->A_log ? lw->A_log + p->nv0 : NULL, nvl, &bad);
            d->dt_bias = up_vec(m, to, lw->dt_bias ? lw->dt_bias + p->nv0 : NULL, nvl, &bad);
            d->gdn_norm = up_vec(m, to, lw->gdn_norm, dv, &bad);
        }
        if (E) {
            d->router = up_mat(m, to, lw->router, E, H, &bad);
            d->exp_gate = calloc(E, sizeof(void *));
            d->exp_up = calloc(E, sizeof(void *));
            d->exp_down = calloc(E, sizeof(void *));
            if (!d->exp_gate || !d->exp_up || !d->exp_down) bad = 1;
            for (int e = p->e0; e < p->e1 && !bad; e++) {
                d->exp_gate[e] = up_mat(m, to, lw->exp_gate[e], I, H, &bad);
                d->exp_up[e] = up_mat(m, to, lw->exp_up[e], I, H, &bad);
                d->exp_down[e] = up_mat(m, to, lw->exp_down[e], H, I, &bad);
            }
            if (!bad) { /* the grouped products' table of this rank's experts */
                void *tab[3 * E];
                for (size_t e = 0; e < E; e++) {
                    tab[e] = d->exp_gate[e];
                    tab[E + e] = d->exp_up[e];
                    tab[2 * E + e] = d->exp_down[e];
                }
                d->exp_tab = dalloc(to, sizeof tab);
                if (!d->exp_tab || kvd_cuda_upload(d->exp_tab, tab, sizeof tab)) bad = 1;
            }
            if (Is) {
                d->sh_gate = up_slice(m, to, lw->sh_gate, H, p->is0, Isl, 0, H, &bad);
                d->sh_up = up_slice(m, to, lw->sh_up, H, p->is0, Isl, 0, H, &bad);
                d->sh_down = up_slice(m, to, lw->sh_down, Is, 0, H, p->is0, Isl, &bad);
                d->sh_expert_gate = up_mat(m, to, lw->sh_expert_gate, 1, H, &bad);
            }
        } else {
            d->dense_gate = up_slice(m, to, lw->dense_gate, H, p->i0, Il, 0, H, &bad);
            d->dense_up = up_slice(m, to, lw->dense_up, H, p->i0, Il, 0, H, &bad);
            d->dense_down = up_slice(m, to, lw->dense_down, I, 0, H, p->i0, Il, &bad);
        }
    }
    int rot = kvd_rot_dim(c);
    float *inv = malloc(sizeof(float) * (size_t)(rot / 2 + 1));
    if (!inv) return -1;
    for (int i = 0; i < rot / 2; i++)
        inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / rot));
    wt->inv_freq = up_vec(m, to, inv, (size_t)(rot / 2 + 1), &bad);
    free(inv);
    return bad ? -1 : 0;
}

/* One rank on its device: its share of the weights (or peer's, the same
 * rank of a model over the same weights), its cache pools, state and
 * buffers. */
static kvd_cuda_model *rank_new(const kvd_weights *w, const kvd_cuda_model *peer,
                                const kvd_kvcache *kv, int max_rows, int max_seqs,
                                const kvd_config *full, const dev_part *part, char *err) {
    char why[256];
    if (kvd_cuda_set_device(part->rank)) {
        snprintf(err, KVD_ERR_LEN, "--gpus: device %d cannot be used", part->rank);
        return NULL;
    }
    kvd_cuda_model *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->full = *full;
    m->p = *part;
    /* the device's settings (KVD_CUDA_GEMM is read by the GEMMs themselves,
     * the others by their kernels) checked here too, for the binaries that
     * open the model without kvdrift's own check */
    const char *moe_env = getenv("KVD_CUDA_MOE");
    if (kvd_cuda_env_check(err, KVD_ERR_LEN)) {
        free(m);
        return NULL;
    }
    m->moe_mode = !moe_env || !*moe_env      ? MOE_DEVICE
                  : !strcmp(moe_env, "loop") ? MOE_LOOP
                                             : MOE_HOST;
    local_config(full, part, &m->c);
    const kvd_config *c = &m->c;
    m->max_rows = max_rows;
    m->max_seqs = max_seqs;
    m->up_w = w;
    kvd_config_layer_indices(c, m->attn_index, m->lin_index, &m->n_full, &m->n_lin);
    if (m->n_full > kv->n_layers) {
        snprintf(err, KVD_ERR_LEN, "device model: the KV cache has %d layers, the model %d",
                 kv->n_layers, m->n_full);
        rank_free(m);
        return NULL;
    }
    const size_t H = (size_t)c->hidden_size, hd = (size_t)c->head_dim, V = (size_t)c->vocab_size;
    const size_t nh = (size_t)c->num_attention_heads, kvh = (size_t)c->num_key_value_heads;
    const size_t kd = (size_t)kvd_key_dim(c), vd = (size_t)kvd_value_dim(c);
    const size_t cd = (size_t)kvd_conv_dim(c), nv = (size_t)c->linear_num_value_heads;
    const size_t dk = (size_t)c->linear_key_head_dim, dv = (size_t)c->linear_value_head_dim;
    const size_t Kc = (size_t)c->linear_conv_kernel_dim, pw = 2 * kd + 2 * vd;
    const size_t E = (size_t)c->num_experts, K = E ? (size_t)c->num_experts_per_tok : 1;
    const size_t I = E ? (size_t)c->moe_intermediate_size : (size_t)c->intermediate_size;
    const size_t Is =
        (size_t)(c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : 0);
    const size_t R = (size_t)max_rows;

    /* weights: a peer's, or uploaded */
    if (peer) {
        m->wt = peer->wt;
        m->wt->refs++;
    } else {
        if (!(m->wt = calloc(1, sizeof *m->wt))) goto oom;
        m->wt->refs = 1;
        if (upload_weights(m, w)) goto oom;
    }

    /* activations */
#define DBUF(p, n)                                                                                 \
    do {                                                                                           \
        (p) = dalloc(&m->mem, sizeof(*(p)) * (size_t)(n) + 16);                                    \
        if (!(p)) goto oom;                                                                        \
    } while (0)
    DBUF(m->x, R * H);
    DBUF(m->xn, R * H);
    DBUF(m->mix, R * H);
    DBUF(m->qg, R * nh * hd * 2);
    DBUF(m->qh, R * nh * hd);
    DBUF(m->kb, R * kvh * hd);
    DBUF(m->vb, R * kvh * hd);
    DBUF(m->att, R * nh * hd);
    DBUF(m->qkvz, R * pw);
    DBUF(m->ba, R * 2 * nv);
    DBUF(m->conv, R * cd);
    DBUF(m->z, R * vd);
    DBUF(m->beta, R * nv);
    DBUF(m->gdec, R * nv);
    DBUF(m->gdn_o, R * vd);
    DBUF(m->rlogit, R * (E ? E : 1));
    DBUF(m->topw, R * K);
    DBUF(m->topi, R * K);
    DBUF(m->slots_moe, R * K + 2 * E + 2); /* the slots, then the experts' groups */
    DBUF(m->gx, R * H);
    DBUF(m->g1, R * K * I);
    DBUF(m->g2, R * K * I);
    DBUF(m->gy, R * K * H);
    DBUF(m->sh1, R * (Is ? Is : 1));
    DBUF(m->sh2, R * (Is ? Is : 1));
    DBUF(m->shg, R);
    DBUF(m->logits, R * V);
    DBUF(m->d_next, R);
    DBUF(m->tok, R);
    DBUF(m->pos, R);
    DBUF(m->seqs, max_seqs);
    DBUF(m->row0, max_seqs);
    DBUF(m->ntok, max_seqs);

    /* the cache on the device, shaped like kv */
    m->kv_heads = (int)kvh;
    m->head_dim = (int)hd;
    if (dev_kv_init(m, &m->kc, kv)) goto oom;
    if (kv->fmt == KVD_FMT_I4T) DBUF(m->d_qrot, R * nh * hd);
    DBUF(m->nonfinite, 2 * (size_t)c->num_hidden_layers + 2);
    m->attn_scratch_floats = kvd_cuda_attn_scratch_floats(kv->n_blocks * kv->block_size,
                                                          c->num_attention_heads, c->head_dim);
    if (kv->q_scale || plain_only(m, kv->fmt)) /* the plain kernels: a row's scores */
        m->attn_scratch_floats = fp8_scratch(m, m->attn_scratch_floats);
    DBUF(m->attn_scratch, m->attn_scratch_floats);
    m->conv_len = (size_t)m->n_lin * cd * (Kc - 1);
    m->ssm_len = (size_t)m->n_lin * nv * dk * dv;
    DBUF(m->conv_state, (size_t)max_seqs * m->conv_len + 1);
    DBUF(m->ssm, (size_t)max_seqs * m->ssm_len + 1);
#undef DBUF

    /* host staging */
    m->h_pos = malloc(sizeof(int) * R);
    m->h_row_seq = malloc(sizeof(int) * R);
    m->h_next = malloc(sizeof(int) * R);
    m->h_topi = malloc(sizeof(int) * R * K);
    m->h_slots = malloc(sizeof(int) * (R * K + 2 * E + 2));
    m->h_seqs = malloc(sizeof(int) * (size_t)max_seqs);
    m->h_row0 = malloc(sizeof(int) * (size_t)max_seqs);
    m->h_ntok = malloc(sizeof(int) * (size_t)max_seqs);
    if (!m->h_pos || !m->h_row_seq || !m->h_next || !m->h_topi || !m->h_slots || !m->h_seqs ||
        !m->h_row0 || !m->h_ntok)
        goto oom;
    if (part->rank == 0) { /* the hooks' copies, of every rank's heads */
        const size_t fkvh = (size_t)full->num_key_value_heads;
        m->h_x = malloc(sizeof(float) * R * H);
        m->h_k = malloc(sizeof(float) * R * fkvh * hd);
        m->h_v = malloc(sizeof(float) * R * fkvh * hd);
        if (!m->h_x || !m->h_k || !m->h_v) goto oom;
    }
    if (kvd_cuda_sync(why, sizeof why)) {
        snprintf(err, KVD_ERR_LEN, "device model: %s", why);
        rank_free(m);
        return NULL;
    }
    m->up_w = NULL;
    free(m->stage16);
    m->stage16 = NULL, m->stage16_n = 0;
    return m;
oom:
    if (m && m->up_err[0])
        snprintf(err, KVD_ERR_LEN, "device model: %s", m->up_err);
    else
        snprintf(err, KVD_ERR_LEN,
                 "device model: out of device or host memory for the weights, a %lld-block "
                 "cache and %d rows x %d sequences",
                 (long long)kv->n_blocks, max_rows, max_seqs);
    rank_free(m);
    return NULL;
}

/* The model over n ranks (devices 0 .. n-1); with peer, over its weights. */
static kvd_cuda_model *model_new(const kvd_weights *w, const kvd_cuda_model *peer,
                                 const kvd_kvcache *kv, int max_rows, int max_seqs, int n,
                                 char *err) {
    const kvd_config *c = peer ? &peer->full : &w->cfg;
    char why[256];
    if (!kvd_cuda_available(why, sizeof why)) {
        snprintf(err, KVD_ERR_LEN, "--backend cuda: %s", why);
        return NULL;
    }
    if (max_rows <= 0 || max_seqs <= 0) {
        snprintf(err, KVD_ERR_LEN, "device model: expected positive max_rows and max_seqs");
        return NULL;
    }
    if (peer) n = peer->p.n;
    if (n < 1 || n > KVD_MAX_RANKS) {
        snprintf(err, KVD_ERR_LEN, "--gpus: expected 1 to %d, got %d", KVD_MAX_RANKS, n);
        return NULL;
    }
    dev_part parts[KVD_MAX_RANKS];
    if (partition(c, n, parts, err)) return NULL;
    kvd_comm *comm = kvd_cuda_comm_new(n, err, KVD_ERR_LEN);
    if (!comm) return NULL;
    kvd_cuda_model *m0 = NULL;
    for (int r = 0; r < n; r++) {
        kvd_cuda_model *m =
            rank_new(w, peer ? peer->rk[r] : NULL, kv, max_rows, max_seqs, c, &parts[r], err);
        if (!m) {
            if (m0) {
                m0->p.n = r; /* the ranks made so far */
                kvd_cuda_model_free(m0);
            } else {
                kvd_cuda_comm_free(comm);
            }
            kvd_cuda_set_device(0);
            return NULL;
        }
        if (r == 0) m0 = m, m0->comm = comm;
        m0->rk[r] = m;
        m0->mixes[r] = m->mix;
    }
    kvd_cuda_set_device(0);
    return m0;
}

kvd_cuda_model *kvd_cuda_model_new(const kvd_weights *w, const kvd_kvcache *kv, int max_rows,
                                   int max_seqs, char *err) {
    return model_new(w, NULL, kv, max_rows, max_seqs, 1, err);
}

kvd_cuda_model *kvd_cuda_model_new_tp(const kvd_weights *w, const kvd_kvcache *kv, int max_rows,
                                      int max_seqs, int n_gpus, char *err) {
    return model_new(w, NULL, kv, max_rows, max_seqs, n_gpus, err);
}

kvd_cuda_model *kvd_cuda_model_new_shared(const kvd_cuda_model *peer, const kvd_kvcache *kv,
                                          int max_rows, int max_seqs, char *err) {
    return model_new(NULL, peer, kv, max_rows, max_seqs, 1, err);
}

kvd_cuda_model *kvd_cuda_model_new_synth(const kvd_config *cfg, const kvd_synth *s,
                                         const kvd_kvcache *kv, int max_rows, int max_seqs,
                                         int n_gpus, char *err) {
    kvd_weights w;
    if (kvd_weights_lazy_synth(&w, cfg, s, err)) return NULL;
    kvd_cuda_model *m = model_new(&w, NULL, kv, max_rows, max_seqs, n_gpus, err);
    kvd_weights_free(&w);
    return m;
}

int kvd_cuda_model_set_hooks(kvd_cuda_model *m, const kvd_hooks *h, char *err) {
    if (h && h->attn) {
        snprintf(err, KVD_ERR_LEN,
                 "device model: attention is observed through the attn_cmp hook (figures "
                 "compared on the device), not as whole distributions");
        return -1;
    }
    if (h) {
        m->hooks = *h;
    } else {
        memset(&m->hooks, 0, sizeof m->hooks);
    }
    return 0;
}

static int rank_shadow(kvd_cuda_model *m, kvd_kvcache *shadow, char *err) {
    kvd_cuda_set_device(m->p.rank);
    if (m->sc.kpool) {
        /* its pools stay for the model's life: the same shape again, or refused */
        if (m->sc.fmt != shadow->fmt || m->sc.n_blocks != shadow->n_blocks) {
            snprintf(err, KVD_ERR_LEN,
                     "device model: a shadow cache was set before with another mode or size");
            return -1;
        }
        if (dev_kv_scales(m, &m->sc, shadow) || dev_kv_queries(m, &m->sc, shadow)) {
            if (!kvd_cuda_sync(err, KVD_ERR_LEN))
                snprintf(err, KVD_ERR_LEN, "device model: uploading the shadow's scales failed");
            return -1;
        }
    } else if (dev_kv_init(m, &m->sc, shadow) ||
               (shadow->fmt == KVD_FMT_I4T &&
                !(m->d_qrot_iso = dalloc(&m->mem, sizeof(float) * (size_t)m->max_rows *
                                                      m->c.num_attention_heads * m->head_dim)))) {
        snprintf(err, KVD_ERR_LEN,
                 "device model: out of device memory for a %lld-block shadow cache",
                 (long long)shadow->n_blocks);
        return -1;
    }
    /* FP8 attention over the shadow: this model's queries in E4M3 (its own
     * are not, over its own cache), and scratch for the plain kernels over
     * this model's longest context */
    const size_t need = m->sc.qscale || plain_only(m, shadow->fmt) ? fp8_scratch(m, 0) : 0;
    if (m->sc.qscale && !m->d_qfp8 &&
        !(m->d_qfp8 = dalloc(&m->mem, sizeof(float) * (size_t)m->max_rows *
                                          m->c.num_attention_heads * m->head_dim))) {
        snprintf(err, KVD_ERR_LEN, "device model: out of device memory for FP8 queries");
        return -1;
    }
    if (need > m->attn_scratch_floats) {
        float *sc = dalloc(&m->mem, sizeof(float) * need);
        if (!sc) {
            snprintf(err, KVD_ERR_LEN, "device model: out of device memory for FP8 attention");
            return -1;
        }
        m->attn_scratch = sc, m->attn_scratch_floats = need;
    }
    m->sc.fmt = shadow->fmt;
    m->sc.saturate = shadow->saturate;
    m->shadow = shadow;
    return 0;
}

int kvd_cuda_model_set_shadow(kvd_cuda_model *m, kvd_kvcache *shadow, char *err) {
    if (!shadow) {
        for (int r = 0; r < m->p.n; r++) m->rk[r]->shadow = NULL;
        return 0;
    }
    if (shadow->n_layers < m->n_full || shadow->kv_heads != m->full.num_key_value_heads ||
        shadow->head_dim != m->head_dim || shadow->block_size != m->kc.block_size) {
        snprintf(err, KVD_ERR_LEN,
                 "device model: a shadow cache must have the model's %d layers, %d KV heads of "
                 "%d dims and %d-token blocks",
                 m->n_full, m->full.num_key_value_heads, m->head_dim, m->kc.block_size);
        return -1;
    }
    int rc = 0;
    for (int r = 0; r < m->p.n && !rc; r++) rc = rank_shadow(m->rk[r], shadow, err);
    kvd_cuda_set_device(0);
    return rc;
}

int kvd_cuda_model_set_reference(kvd_cuda_model *m, kvd_cuda_model *ref, char *err) {
    if (ref && (ref == m || ref->p.n != m->p.n || ref->n_full != m->n_full ||
                ref->head_dim != m->head_dim || ref->max_rows < m->max_rows ||
                ref->full.num_attention_heads != m->full.num_attention_heads ||
                ref->full.num_hidden_layers != m->full.num_hidden_layers ||
                ref->full.hidden_size != m->full.hidden_size ||
                ref->full.vocab_size != m->full.vocab_size)) {
        snprintf(err, KVD_ERR_LEN,
                 "device model: a reference must be another model of the same attention shape "
                 "over as many GPUs, with at least as many rows a step");
        return -1;
    }
    const size_t R = (size_t)(ref ? ref->max_rows : 0);
    int ok = 1;
    for (int r = 0; ref && r < ref->p.n; r++) {
        kvd_cuda_model *q = ref->rk[r];
        if (q->d_held) continue;
        kvd_cuda_set_device(r);
        q->d_held = dalloc(&q->mem, sizeof(float) * (size_t)q->n_full * R *
                                        q->c.num_attention_heads * q->head_dim);
        const size_t nkv = sizeof(float) * (size_t)q->n_full * R * q->kv_heads * q->head_dim;
        q->d_held_k = dalloc(&q->mem, nkv);
        q->d_held_v = dalloc(&q->mem, nkv);
        if (r == 0)
            q->d_hx = dalloc(&q->mem, sizeof(float) * (size_t)q->full.num_hidden_layers * R *
                                          q->full.hidden_size);
        ok &= q->d_held && q->d_held_k && q->d_held_v && (r || q->d_hx);
    }
    kvd_cuda_set_device(0);
    if (ref && !m->d_hcmp) {
        const size_t mr = (size_t)m->max_rows;
        m->d_hcmp = dalloc(&m->mem, sizeof(kvd_hidden_cmp) * mr);
        m->d_lcmp = dalloc(&m->mem, sizeof(kvd_logit_cmp) * mr);
        m->d_target = dalloc(&m->mem, sizeof(int) * mr);
        m->h_hcmp = malloc(sizeof(kvd_hidden_cmp) * mr);
        m->h_lcmp = malloc(sizeof(kvd_logit_cmp) * mr);
        m->h_target = malloc(sizeof(int) * mr);
        ok &= m->d_hcmp && m->d_lcmp && m->d_target && m->h_hcmp && m->h_lcmp && m->h_target;
    }
    if (!ok) {
        snprintf(err, KVD_ERR_LEN,
                 "device model: out of memory for the reference's queries, K/V rows, "
                 "residual streams and the figures");
        return -1;
    }
    m->ref = ref;
    for (int r = 0; r < m->p.n; r++) m->rk[r]->ref_rank = ref ? ref->rk[r] : NULL;
    return 0;
}

void kvd_cuda_model_reset_seq(kvd_cuda_model *m0, int seq) {
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        kvd_cuda_set_device(r);
        kvd_cuda_zero(m->conv_state + (size_t)seq * m->conv_len, sizeof(float) * m->conv_len);
        kvd_cuda_zero(m->ssm + (size_t)seq * m->ssm_len, sizeof(float) * m->ssm_len);
    }
    kvd_cuda_set_device(0);
}

void kvd_cuda_model_copy_seq(kvd_cuda_model *m0, int from, int to) {
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        kvd_cuda_set_device(r);
        kvd_cuda_copy(m->conv_state + (size_t)to * m->conv_len,
                      m->conv_state + (size_t)from * m->conv_len, sizeof(float) * m->conv_len);
        kvd_cuda_copy(m->ssm + (size_t)to * m->ssm_len, m->ssm + (size_t)from * m->ssm_len,
                      sizeof(float) * m->ssm_len);
    }
    kvd_cuda_set_device(0);
}

int kvd_cuda_model_fork(kvd_cuda_model *m0, kvd_kvcache *kv, int seq) {
    int to = kvd_kvcache_fork(kv, seq); /* the bookkeeping (its host bytes are unused) */
    if (to < 0) return -1;
    if (to >= m0->max_seqs) {
        kvd_kvcache_release(kv, to);
        return -1;
    }
    const kvd_kv_seq *s = &kv->seqs[seq], *d = &kv->seqs[to];
    int rc = 0;
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        size_t bb = m->kc.pool_bytes / (size_t)kv->n_blocks;
        kvd_cuda_set_device(r);
        for (int a = 0; a < m->n_full; a++)
            for (int b = 0; b < s->n_blocks && b < d->n_blocks; b++) {
                rc |= kvd_cuda_copy((char *)m->kc.kpool[a] + (size_t)d->blocks[b] * bb,
                                    (char *)m->kc.kpool[a] + (size_t)s->blocks[b] * bb, bb);
                rc |= kvd_cuda_copy((char *)m->kc.vpool[a] + (size_t)d->blocks[b] * bb,
                                    (char *)m->kc.vpool[a] + (size_t)s->blocks[b] * bb, bb);
            }
    }
    kvd_cuda_model_copy_seq(m0, seq, to);
    if (rc) {
        kvd_kvcache_release(kv, to);
        return -1;
    }
    return to;
}

int kvd_cuda_model_pool(const kvd_cuda_model *m0, int attn_layer, int which_v, void *host,
                        size_t bytes) {
    const int kvh = m0->full.num_key_value_heads, n = m0->p.n;
    const size_t full = m0->kc.pool_bytes / (size_t)m0->kv_heads * (size_t)kvh;
    if (attn_layer < 0 || attn_layer >= m0->n_full || bytes < full) return -1;
    if (n == 1)
        return kvd_cuda_download(
            host, which_v ? m0->kc.vpool[attn_layer] : m0->kc.kpool[attn_layer], m0->kc.pool_bytes);
    /* [block][kv head][slot][dim]: each rank's heads into their places */
    for (int r = 0; r < n; r++) {
        const kvd_cuda_model *m = m0->rk[r];
        if (!m->p.primary) continue;
        const size_t hb = m->kc.pool_bytes / (size_t)m->kc.n_blocks / (size_t)m->kv_heads;
        unsigned char *tmp = malloc(m->kc.pool_bytes);
        if (!tmp ||
            kvd_cuda_download(tmp, which_v ? m->kc.vpool[attn_layer] : m->kc.kpool[attn_layer],
                              m->kc.pool_bytes)) {
            free(tmp);
            return -1;
        }
        for (int b = 0; b < m->kc.n_blocks; b++)
            memcpy((unsigned char *)host + ((size_t)b * kvh + (size_t)m->p.kv0) * hb,
                   tmp + (size_t)b * m->kv_heads * hb, (size_t)m->kv_heads * hb);
        free(tmp);
    }
    return 0;
}

/* ---- the token mixers and the feed-forward ---- */

/* The kv hook: this step's K and V rows as computed, before the cache,
 * gathered from the ranks that hold each KV head first. */
static int kv_hook(kvd_cuda_model *m0, int al, int rows) {
    const int kvh = m0->full.num_key_value_heads, hd = m0->head_dim;
    const size_t n = (size_t)kvh * hd;
    for (int r = 0; r < m0->p.n; r++) {
        const kvd_cuda_model *m = m0->rk[r];
        if (!m->p.primary) continue;
        const size_t nl = (size_t)m->kv_heads * hd;
        float *k = malloc(sizeof(float) * nl * (size_t)rows * 2), *v = k + nl * (size_t)rows;
        if (!k || kvd_cuda_download(k, m->kb, sizeof(float) * nl * (size_t)rows) ||
            kvd_cuda_download(v, m->vb, sizeof(float) * nl * (size_t)rows)) {
            free(k);
            return -1;
        }
        for (int i = 0; i < rows; i++) {
            memcpy(m0->h_k + (size_t)i * n + (size_t)m->p.kv0 * hd, k + (size_t)i * nl,
                   sizeof(float) * nl);
            memcpy(m0->h_v + (size_t)i * n + (size_t)m->p.kv0 * hd, v + (size_t)i * nl,
                   sizeof(float) * nl);
        }
        free(k);
    }
    for (int i = 0; i < rows; i++)
        m0->hooks.kv(m0->hooks.ctx, al, m0->h_row_seq[i], m0->h_pos[i], m0->h_k + (size_t)i * n,
                     m0->h_v + (size_t)i * n);
    return 0;
}

/* room for the attn_cmp hook's distributions of a group (ATTN_GROUP rows)
 * over n_ctx positions, each rank's heads on its device */
#define ATTN_GROUP 16
static int probs_room(kvd_cuda_model *m0, size_t n_ctx) {
    if (n_ctx <= m0->probs_ctx) return 0;
    int ok = 1;
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        const size_t nb = sizeof(float) * ATTN_GROUP * (size_t)m->c.num_attention_heads * n_ctx;
        kvd_cuda_set_device(r);
        kvd_cuda_free(m->d_probs), kvd_cuda_free(m->d_sprobs), kvd_cuda_free(m->d_rprobs);
        m->d_probs = kvd_cuda_alloc(nb);
        m->d_sprobs = kvd_cuda_alloc(nb);
        m->d_rprobs = kvd_cuda_alloc(nb);
        ok &= m->d_probs && m->d_sprobs && m->d_rprobs;
    }
    kvd_cuda_set_device(0);
    m0->probs_ctx = ok ? n_ctx : 0;
    return ok ? 0 : -1;
}

/* each rank's room for max_rows sampled rows' figures; rank 0's copies */
static int views_room(kvd_cuda_model *m0) {
    if (m0->h_sel) return 0;
    const size_t hd = (size_t)m0->head_dim, nh = (size_t)m0->full.num_attention_heads,
                 R = (size_t)m0->max_rows;
    int ok = 1;
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        const size_t nhl = (size_t)m->c.num_attention_heads;
        kvd_cuda_set_device(r);
        m->d_outs = dalloc(&m->mem, sizeof(float) * R * 3 * nhl * hd);
        m->d_kl = dalloc(&m->mem, sizeof(double) * 2 * R * nhl);
        m->d_top = dalloc(&m->mem, sizeof(int) * 4 * R * nhl);
        m->d_rowidx = dalloc(&m->mem, sizeof(int) * 2 * R);
        ok &= m->d_outs && m->d_kl && m->d_top && m->d_rowidx;
    }
    kvd_cuda_set_device(0);
    float **f[2] = {&m0->h_outs, &m0->h_souts};
    double **d[2] = {&m0->h_kl, &m0->h_skl};
    int **t[2] = {&m0->h_top, &m0->h_stop};
    for (int i = 0; i < 2; i++) {
        *f[i] = malloc(sizeof(float) * R * 3 * nh * hd);
        *d[i] = malloc(sizeof(double) * 2 * R * nh);
        *t[i] = malloc(sizeof(int) * 4 * R * nh);
        ok &= *f[i] && *d[i] && *t[i];
    }
    m0->h_sel = ok ? malloc(sizeof(int) * 2 * R) : NULL;
    return m0->h_sel ? 0 : -1;
}

/* One query row's attention: the decode kernels, or the plain kernels
 * (whose scratch fp8_scratch sized) with FP8 weights where the decode
 * kernels cannot round them (a shape or a device the tensor-core kernels do
 * not take, KVD_CUDA_DECODE=2) and over an NVFP4 cache whose group v2 has
 * no build for (plain_only). */
static int decode_row(const kvd_kv_view *view, const int32_t *tab, int n_ctx, const float *q,
                      int nh, float sm_scale, float *out, float *scratch) {
    const int rc = kvd_cuda_attn_decode_dev(view, tab, n_ctx, q, nh, sm_scale, out, scratch);
    if (!rc || (!view->p_fp8 && kvd_fmt_tensor_cores(view->fmt))) return rc;
    return kvd_cuda_attn_fp8_dev(view, tab, n_ctx, q, nh, sm_scale, out, scratch);
}

/* A group of sampled rows (n, from index s0 of the step's selection, of one
 * sequence) over one cache kc of model m (the current device's rank: the
 * model's own, its shadow, or the reference's), their queries q's rows:
 * the distributions into probs ([n][heads][max_ctx]) and each row's output
 * into slot `slot` of the comparing model om's outputs (om's row indices
 * and decode scratch too). The probabilities kernels and decode (the
 * group's rows in one launch where it takes them, else row by row), so
 * that both sides of a view run the same kernels and equal inputs compare
 * equal: the three calls of a group have the same rows, contexts and
 * scratch, so they take the same path and the same splits. */
static int group_attention(kvd_cuda_model *m, kvd_cuda_model *om, dev_kv *kc, int al, int seq,
                           int s0, int n, int max_ctx, const float *q, const int *h_sel,
                           float *probs, int slot) {
    /* the row indices and contexts are om's, [2][om's max_rows] (a reference
     * may hold more rows than the model comparing with it) */
    const int nhl = m->c.num_attention_heads, hd = m->head_dim, R = om->max_rows;
    const int i4 = kc->fmt == KVD_FMT_I4T; /* q rotated by the caller (i4t_query) */
    const float sm_scale = 1.0f / sqrtf((float)hd) / (i4 ? (float)hd : 1.0f);
    const size_t no = (size_t)nhl * hd;
    float *outs = om->d_outs + ((size_t)s0 * 3 + slot) * no;
    kvd_kv_view view = dev_kv_view(m, kc, al);
    const int32_t *tab = kc->btab + (size_t)seq * kc->n_blocks;
    int rc = kvd_cuda_attn_probs_rows_dev(&view, tab, n, om->d_rowidx + s0, om->d_rowidx + R + s0,
                                          max_ctx, q, no, nhl, sm_scale, probs, (size_t)max_ctx);
    if (kvd_cuda_attn_decode_rows_dev(&view, tab, n, om->d_rowidx + s0, om->d_rowidx + R + s0,
                                      max_ctx, q, no, nhl, sm_scale, outs, 3 * no, om->attn_scratch,
                                      om->attn_scratch_floats))
        for (int k = 0; k < n; k++) { /* where the rows' launch cannot take them */
            const int i = h_sel[s0 + k], n_ctx = h_sel[R + s0 + k];
            rc |= decode_row(&view, tab, n_ctx, q + (size_t)i * no, nhl, sm_scale,
                             outs + (size_t)k * 3 * no, om->attn_scratch);
        }
    if (i4) kvd_cudaop_rht(outs, outs, n, 3 * no, 3 * no, nhl, hd, 1);
    return rc;
}

/* The query rows int4-token's attention reads over a cache of format fmt:
 * q itself, or over an I4T cache q's rows rotated into buf (kvd_rht_rows'
 * forward, in BF16) */
static const float *i4t_query(kvd_fmt fmt, const float *q, float *buf, int rows, int nh, int hd) {
    if (fmt != KVD_FMT_I4T) return q;
    const size_t no = (size_t)nh * hd;
    kvd_cudaop_rht(q, buf, rows, no, no, nh, hd, 0);
    return buf;
}

/* The attn_cmp hook, for the rows want_attn accepts: each view's two
 * distributions compared on the device, so only per-head figures and the
 * outputs cross to the host (a distribution at 128K tokens and 32 heads is
 * 16 MB; its figures are 512 bytes). The isolated view: the reference
 * side's query over its own cache and over the shadow (that side being the
 * reference where one is set, whose K/V rows the shadow holds, else this
 * model); the propagated view: the reference's
 * query of the same row (its last step) over the reference's cache, against
 * this row's over its own. Each rank takes the step's sampled rows in
 * groups of up to ATTN_GROUP rows of one sequence, whose distributions read
 * each K row once for the group, queues every launch back to back, and
 * copies the figures of all rows back at once; the hook sees every head,
 * in model.c's layout. */
static int attn_hook(kvd_cuda_model *m0, int al, int rows, char *err) {
    const int hd = m0->head_dim, nh = m0->full.num_attention_heads, R = m0->max_rows;
    const kvd_cuda_model *ref0 = m0->ref;
    const int iso = m0->shadow != NULL;
    const int prop = ref0 != NULL; /* the same rows: checked at the step's start */
    if (!iso && !prop) return 0;
    if (views_room(m0)) {
        snprintf(err, KVD_ERR_LEN, "attention: out of memory for the sampled rows' figures");
        return -1;
    }
    int n = 0, max_ctx = 0, rc = 0;
    int *sel = m0->h_sel, *ctx = sel + R;
    for (int i = 0; i < rows; i++) {
        int seq = m0->h_row_seq[i], pos = m0->h_pos[i];
        if (m0->hooks.want_attn && !m0->hooks.want_attn(m0->hooks.ctx, al, seq, pos)) continue;
        sel[n] = i, ctx[n++] = pos + 1;
        max_ctx = pos + 1 > max_ctx ? pos + 1 : max_ctx;
    }
    if (!n) return 0;
    if (probs_room(m0, (size_t)max_ctx)) {
        snprintf(err, KVD_ERR_LEN, "attention: out of memory for %d-token distributions", max_ctx);
        return -1;
    }
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_model *m = m0->rk[r];
        const int nhl = m->c.num_attention_heads, h0 = m->p.nh0;
        /* the figures' device layout: [view or kind][this step's n rows][heads],
         * so that only the n sampled rows' figures come back */
        const size_t no = (size_t)nhl * hd, ro = (size_t)n * nhl;
        kvd_cuda_set_device(r);
        rc |= kvd_cuda_upload(m->d_rowidx, sel, sizeof(int) * 2 * R); /* sel, then ctx */
        /* the isolated view's query: the reference's where there is one (the
         * shadow holds its K/V rows), else this model's own; over an
         * FP8-attention shadow, in E4M3 (the query as the reference side's
         * own attention took it is not) */
        kvd_cuda_model *rm = prop ? ref0->rk[r] : NULL;
        const float *qiso = prop ? rm->d_held + (size_t)al * rm->max_rows * no : m->qh;
        if (iso && m->sc.qscale) {
            rc |= kvd_cuda_attn_fp8_query_dev(qiso, m->d_qfp8, rows, no, nhl, hd,
                                              m->sc.qscale + (size_t)al * nhl);
            qiso = m->d_qfp8;
        }
        /* over I4T caches, the queries rotated (this model's own were, for
         * its attention: attention_in; the isolated view without a
         * reference reads those same rows) */
        const float *qown = m->kc.fmt == KVD_FMT_I4T ? m->d_qrot : m->qh;
        if (iso && qiso == m->qh && m->sc.fmt == m->kc.fmt)
            qiso = qown;
        else if (iso)
            qiso = i4t_query(m->sc.fmt, qiso, m->d_qrot_iso, rows, nhl, hd);
        const float *qref = prop
                                ? i4t_query(rm->kc.fmt, rm->d_held + (size_t)al * rm->max_rows * no,
                                            rm->d_qrot, rows, nhl, hd)
                                : NULL;
        for (int s0 = 0, s1; s0 < n && !rc; s0 = s1) {
            /* a group: consecutive sampled rows of one sequence (and one of the
             * reference's) */
            const int seq = m0->h_row_seq[sel[s0]];
            const int rseq = prop ? ref0->h_row_seq[sel[s0]] : 0;
            for (s1 = s0 + 1; s1 < n && s1 - s0 < ATTN_GROUP && m0->h_row_seq[sel[s1]] == seq &&
                              (!prop || ref0->h_row_seq[sel[s1]] == rseq);
                 s1++)
                ;
            const int gn = s1 - s0;
            int gmax = 0;
            for (int k = s0; k < s1; k++) gmax = ctx[k] > gmax ? ctx[k] : gmax;
            const size_t st = (size_t)gmax;
            rc |= group_attention(m, m, &m->kc, al, seq, s0, gn, gmax, qown, sel, m->d_probs, 0);
            if (prop) {
                rc |= group_attention(rm, m, &rm->kc, al, rseq, s0, gn, gmax, qref, sel,
                                      m->d_rprobs, 2);
                rc |= kvd_cuda_attn_compare_rows_dev(
                    m->d_rprobs, m->d_probs, nhl, gn, m->d_rowidx + R + s0, st,
                    m->d_kl + ro + (size_t)s0 * nhl, m->d_top + 2 * ro + (size_t)s0 * nhl,
                    m->d_top + 3 * ro + (size_t)s0 * nhl, (size_t)nhl);
            }
            if (iso) { /* against the reference side's own: the reference's, or this one's */
                rc |=
                    group_attention(m, m, &m->sc, al, seq, s0, gn, gmax, qiso, sel, m->d_sprobs, 1);
                rc |= kvd_cuda_attn_compare_rows_dev(
                    prop ? m->d_rprobs : m->d_probs, m->d_sprobs, nhl, gn, m->d_rowidx + R + s0, st,
                    m->d_kl + (size_t)s0 * nhl, m->d_top + (size_t)s0 * nhl,
                    m->d_top + ro + (size_t)s0 * nhl, (size_t)nhl);
            }
        }
        /* the sampled rows' figures back at once, then into their heads' places */
        rc |= kvd_cuda_download(m0->h_souts, m->d_outs, sizeof(float) * n * 3 * no) ||
              kvd_cuda_download(m0->h_skl, m->d_kl, sizeof(double) * 2 * ro) ||
              kvd_cuda_download(m0->h_stop, m->d_top, sizeof(int) * 4 * ro);
        for (int k = 0; k < n && !rc; k++) {
            for (int t = 0; t < 3; t++)
                memcpy(m0->h_outs + (((size_t)k * 3 + t) * nh + h0) * hd,
                       m0->h_souts + ((size_t)k * 3 + t) * no, sizeof(float) * no);
            for (int t = 0; t < 2; t++)
                memcpy(m0->h_kl + ((size_t)t * R + k) * nh + h0,
                       m0->h_skl + t * ro + (size_t)k * nhl, sizeof(double) * nhl);
            for (int t = 0; t < 4; t++)
                memcpy(m0->h_top + ((size_t)t * R + k) * nh + h0,
                       m0->h_stop + t * ro + (size_t)k * nhl, sizeof(int) * nhl);
        }
    }
    kvd_cuda_set_device(0);
    if (rc) {
        if (!kvd_cuda_sync(err, KVD_ERR_LEN))
            snprintf(err, KVD_ERR_LEN, "attention: the sampled rows' comparison failed");
        return -1;
    }
    for (int k = 0; k < n; k++) {
        const int i = sel[k];
        const float *o = m0->h_outs + (size_t)k * 3 * nh * hd, *so = o + (size_t)nh * hd,
                    *rout = so + (size_t)nh * hd;
        const double *kl = m0->h_kl + (size_t)k * nh;
        const int *t = m0->h_top + (size_t)k * nh;
        const size_t rn = (size_t)R * nh;
        kvd_attn_cmp vi = {kl, t, t + rn, prop ? rout : o, so};
        kvd_attn_cmp vp = {kl + rn, t + 2 * rn, t + 3 * rn, rout, o};
        m0->hooks.attn_cmp(m0->hooks.ctx, al, m0->h_row_seq[i], m0->h_pos[i], iso ? &vi : NULL,
                           prop ? &vp : NULL);
    }
    return 0;
}

/* gated attention up to its output before the gate (m->att), this rank's
 * heads; K and V into the cache (and the shadow) */
static void attention_in(kvd_cuda_model *m, int l, const kvd_batch *b, int rows) {
    const kvd_config *c = &m->c;
    const dev_layer *d = &m->wt->L[l];
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    const int kvh = c->num_key_value_heads, rot = kvd_rot_dim(c), al = m->attn_index[l];
    const float eps = (float)c->rms_norm_eps;
    float sm_scale = 1.0f / sqrtf((float)hd);
    const kvd_lin_out qkv[3] = {{d->q_proj, m->qg, nh * hd * 2},
                                {d->k_proj, m->kb, kvh * hd},
                                {d->v_proj, m->vb, kvh * hd}};
    kvd_cudaop_linear_multi(m->xn, rows, H, qkv, 3);
    /* q and k heads normed and rotated (the query's gate half untouched) */
    kvd_cudaop_qk_norm_rope(m->qg, 2 * hd, m->kb, d->q_norm, d->k_norm, rows, nh, kvh, hd, eps,
                            m->pos, rot, m->wt->inv_freq);
    /* the cache stores K after norm and RoPE, V as projected; a reference
     * holds its rows for the models comparing with it, and the shadow takes
     * the reference side's rows (the reference's, where there is one) */
    dev_kv_write(m, &m->kc, al, rows, m->kb, m->vb);
    const size_t kvn = (size_t)kvh * hd;
    if (m->d_held_k) {
        kvd_cuda_copy(m->d_held_k + (size_t)al * m->max_rows * kvn, m->kb,
                      sizeof(float) * rows * kvn);
        kvd_cuda_copy(m->d_held_v + (size_t)al * m->max_rows * kvn, m->vb,
                      sizeof(float) * rows * kvn);
    }
    if (m->shadow) {
        const kvd_cuda_model *rr = m->ref_rank;
        const size_t at = rr ? (size_t)al * rr->max_rows * kvn : 0;
        dev_kv_write(m, &m->sc, al, rows, rr ? rr->d_held_k + at : m->kb,
                     rr ? rr->d_held_v + at : m->vb);
    }
    kvd_cudaop_split_query(m->qg, m->qh, rows, nh, hd);
    if (m->kc.qabsmax) /* calibration: the queries as attention sees them */
        kvd_cudaop_absmax_heads(m->qh, rows, nh, hd, m->kc.qabsmax + (size_t)al * nh);
    if (m->d_held) /* a reference keeps its queries for the propagated view */
        kvd_cuda_copy(m->d_held + (size_t)al * m->max_rows * nh * hd, m->qh,
                      sizeof(float) * (size_t)rows * nh * hd);
    kvd_kv_view view = dev_kv_view(m, &m->kc, al);
    if (view.q_scale) /* FP8 attention: the query in E4M3 for every kernel below */
        kvd_cuda_attn_fp8_query_dev(m->qh, m->qh, rows, (size_t)nh * hd, nh, hd, view.q_scale);
    /* int4-token: the query rotated as the cache's rows are, the softmax
     * scale over the rotation's gain (the output is rotated back below) */
    const int i4 = view.fmt == KVD_FMT_I4T;
    const float *qh = i4t_query(view.fmt, m->qh, m->d_qrot, rows, nh, hd);
    if (i4) sm_scale /= (float)hd;
    /* the one-token entries in one launch where the kernel allows it (the
     * rest one by one); prefill entries one by one */
    int max_ctx = 0;
    for (int s = 0; s < b->n; s++)
        if (b->n_tok[s] == 1 && m->h_pos[m->h_row0[s]] + 1 > max_ctx)
            max_ctx = m->h_pos[m->h_row0[s]] + 1;
    const int batched = max_ctx > 0 && kvd_cuda_attn_decode_batch_dev(
                                           &view, m->kc.btab, m->kc.n_blocks, m->seqs, m->row0,
                                           m->ntok, m->pos, b->n, max_ctx, qh, nh, sm_scale, m->att,
                                           m->attn_scratch, m->attn_scratch_floats) == 0;
    for (int s = 0; s < b->n; s++) {
        int r0 = m->h_row0[s], nt = b->n_tok[s], seq = b->seq[s];
        const int32_t *tab = m->kc.btab + (size_t)seq * m->kc.n_blocks;
        if (nt == 1 && !batched) {
            decode_row(&view, tab, m->h_pos[r0] + 1, qh + (size_t)r0 * nh * hd, nh, sm_scale,
                       m->att + (size_t)r0 * nh * hd, m->attn_scratch);
        } else if (nt > 1 && kvd_cuda_attn_prefill_dev(&view, tab, m->h_pos[r0], nt,
                                                       qh + (size_t)r0 * nh * hd, nh, sm_scale,
                                                       m->att + (size_t)r0 * nh * hd,
                                                       m->attn_scratch, m->attn_scratch_floats)) {
            /* what no prefill kernel takes, row by row: FP8 weights the
             * tensor-core kernels could not round, or an NVFP4 or per-token
             * cache with a group of query heads the FP32 tiles have no build
             * for */
            for (int r = r0; r < r0 + nt; r++) {
                const float *q = qh + (size_t)r * nh * hd;
                float *o = m->att + (size_t)r * nh * hd;
                if (view.p_fp8)
                    kvd_cuda_attn_fp8_dev(&view, tab, m->h_pos[r] + 1, q, nh, sm_scale, o,
                                          m->attn_scratch);
                else
                    decode_row(&view, tab, m->h_pos[r] + 1, q, nh, sm_scale, o, m->attn_scratch);
            }
        }
    }
    if (i4) /* back from the rotated basis, over head_dim, in BF16 */
        kvd_cudaop_rht(m->att, m->att, rows, (size_t)nh * hd, (size_t)nh * hd, nh, hd, 1);
}

/* the output gate and o_proj: this rank's part of the sum */
static void attention_out(kvd_cuda_model *m, int l, int rows) {
    const kvd_config *c = &m->c;
    const int hd = c->head_dim, nh = c->num_attention_heads;
    kvd_cudaop_output_gate(m->att, m->qg, rows, nh, hd);
    kvd_cudaop_linear(m->att, m->wt->L[l].o_proj, m->mix, rows, c->hidden_size, nh * hd);
}

static void deltanet(kvd_cuda_model *m, int l, const kvd_batch *b, int rows) {
    const kvd_config *c = &m->c;
    const dev_layer *d = &m->wt->L[l];
    const int H = c->hidden_size, nk = c->linear_num_key_heads, nv = c->linear_num_value_heads;
    const int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    const int kd = kvd_key_dim(c), vd = kvd_value_dim(c), cd = kvd_conv_dim(c);
    const int Kc = c->linear_conv_kernel_dim, li = m->lin_index[l];
    const float eps = (float)c->rms_norm_eps, qscale = 1.0f / sqrtf((float)dk);
    const kvd_lin_out in[2] = {{d->in_proj_qkvz, m->qkvz, 2 * kd + 2 * vd},
                               {d->in_proj_ba, m->ba, 2 * nv}};
    kvd_cudaop_linear_multi(m->xn, rows, H, in, 2);
    kvd_cudaop_ungroup(m->qkvz, m->ba, d->A_log, d->dt_bias, m->conv, m->z, m->beta, m->gdec, rows,
                       nk, nv, dk, dv);
    size_t csl = (size_t)cd * (size_t)(Kc - 1);
    kvd_cudaop_conv(m->conv, cd, d->conv1d, Kc, m->conv_state + (size_t)li * csl, m->conv_len, b->n,
                    m->seqs, m->row0, m->ntok);
    kvd_cudaop_l2norm(m->conv, rows, cd, nk, dk, qscale);
    size_t sl = (size_t)nv * dk * dv;
    kvd_cudaop_gdn(m->conv, m->gdec, m->beta, m->gdn_o, m->ssm + (size_t)li * sl, m->ssm_len, b->n,
                   m->seqs, m->row0, m->ntok, nk, nv, dk, dv);
    kvd_cudaop_gated_norm(m->gdn_o, m->z, d->gdn_norm, rows, nv, dv, eps);
    kvd_cudaop_linear(m->gdn_o, d->out_proj, m->mix, rows, H, vd);
}

/* the MoE experts' products (gate and up with SwiGLU in one launch, then
 * down) and weighted scatter in three launches over the groups G (at most
 * max_groups of them, each of at most max_rows items) */
static void experts_grouped(kvd_cuda_model *m, const dev_layer *d, int rows, const int *G,
                            int max_groups, int max_rows) {
    const int H = m->c.hidden_size, E = m->c.num_experts, K = m->c.num_experts_per_tok;
    const int I = m->c.moe_intermediate_size;
    const void *const *tab = (const void *const *)d->exp_tab;
    kvd_cudaop_linear_grouped_swiglu(m->xn, m->slots_moe, K, tab, tab + E, G, max_groups, max_rows,
                                     m->g1, I, H);
    kvd_cudaop_linear_grouped(m->g1, NULL, 1, tab + 2 * E, G, max_groups, max_rows, m->gy, H, I);
    kvd_cudaop_scatter_grouped(m->mix, m->gy, m->slots_moe, m->topw, K, G, rows, H);
}

/* The experts' item lists made on the host from the routing (one wait a
 * layer), in the CPU's order, then the products: grouped where every
 * expert has at most KVD_GROUPED_ROWS rows (up to 16, kvd_cudaop_linear
 * would run each on the same one-warp-a-column arithmetic), else a launch
 * per expert and product (prefill: cuBLASLt). */
static int moe_host_lists(kvd_cuda_model *m, int l, const kvd_batch *b, int rows, int *G,
                          char *err) {
    const dev_layer *d = &m->wt->L[l];
    const int H = m->c.hidden_size, E = m->c.num_experts, K = m->c.num_experts_per_tok;
    const int I = m->c.moe_intermediate_size;
    if (kvd_cuda_download(m->h_topi, m->topi, sizeof(int) * (size_t)rows * K)) {
        kvd_cuda_sync(err, KVD_ERR_LEN);
        return -1;
    }
    if (m->hooks.router) m->hooks.router(m->hooks.ctx, l, b, m->h_topi);
    kvd_cuda_zero(m->mix, sizeof(float) * (size_t)rows * H);
    int off[E + 1];
    int n = 0;
    for (int e = 0; e < E; e++) {
        off[e] = n;
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < K; j++)
                if (m->h_topi[(size_t)r * K + j] == e) m->h_slots[n++] = r * K + j;
    }
    off[E] = n;
    /* this rank's experts with items, as G after the slots: their count,
     * indices and offsets (contiguous: an expert without rows has none) */
    int ng = 0, most_rows = 0, *hg = m->h_slots + n;
    for (int e = m->p.e0; e < m->p.e1; e++)
        if (off[e + 1] > off[e]) {
            hg[1 + ng++] = e;
            if (off[e + 1] - off[e] > most_rows) most_rows = off[e + 1] - off[e];
        }
    hg[0] = ng;
    for (int g = 0; g < ng; g++) hg[1 + ng + g] = off[hg[1 + g]];
    hg[1 + 2 * ng] = off[m->p.e1];
    if (kvd_cuda_upload(m->slots_moe, m->h_slots, sizeof(int) * (size_t)n) ||
        kvd_cuda_upload(G, hg, sizeof(int) * (size_t)(2 * ng + 2))) {
        kvd_cuda_sync(err, KVD_ERR_LEN);
        return -1;
    }
    if (m->moe_mode != MOE_LOOP && ng > 0 && most_rows <= KVD_GROUPED_ROWS) {
        experts_grouped(m, d, rows, G, ng, most_rows);
        return 0;
    }
    for (int e = m->p.e0; e < m->p.e1; e++) {
        int ne = off[e + 1] - off[e];
        if (ne == 0) continue;
        const int *sl = m->slots_moe + off[e];
        kvd_cudaop_gather(m->xn, sl, ne, K, m->gx, H);
        kvd_cudaop_linear(m->gx, d->exp_gate[e], m->g1, ne, I, H);
        kvd_cudaop_linear(m->gx, d->exp_up[e], m->g2, ne, I, H);
        kvd_cudaop_swiglu(m->g1, m->g2, (size_t)ne * I);
        kvd_cudaop_linear(m->g1, d->exp_down[e], m->gy, ne, H, I);
        kvd_cudaop_scatter(m->mix, m->gy, sl, m->topw, ne, K, H);
    }
    return 0;
}

static int moe(kvd_cuda_model *m, int l, const kvd_batch *b, int rows, char *err) {
    const kvd_config *c = &m->c;
    const dev_layer *d = &m->wt->L[l];
    const int H = c->hidden_size, E = c->num_experts;
    if (E == 0) {
        const int I = c->intermediate_size;
        const kvd_lin_out gu[2] = {{d->dense_gate, m->g1, I}, {d->dense_up, m->g2, I}};
        kvd_cudaop_linear_multi(m->xn, rows, H, gu, 2);
        kvd_cudaop_swiglu(m->g1, m->g2, (size_t)rows * I);
        kvd_cudaop_linear(m->g1, d->dense_down, m->mix, rows, H, I);
        return 0;
    }
    const int K = c->num_experts_per_tok, Is = c->shared_expert_intermediate_size;
    /* every projection of xn at once: the router's, and the shared
     * expert's gate, up and sigmoid gate (its swiglu and down after the
     * routed experts) */
    const kvd_lin_out in[4] = {{d->router, m->rlogit, E},
                               {d->sh_gate, m->sh1, Is},
                               {d->sh_up, m->sh2, Is},
                               {d->sh_expert_gate, m->shg, 1}};
    kvd_cudaop_linear_multi(m->xn, rows, H, in, Is > 0 ? 4 : 1);
    kvd_cudaop_route(m->rlogit, rows, E, K, c->norm_topk_prob, m->topi, m->topw);
    /* the experts' groups (kvd_cudaop_linear_grouped's G) after the slots */
    int *G = m->slots_moe + (size_t)m->max_rows * K;
    /* up to KVD_GROUPED_ROWS rows no expert has more: the item lists are
     * made on the device, and nothing waits for the routing unless a hook
     * reads it */
    if (m->moe_mode == MOE_DEVICE && rows <= KVD_GROUPED_ROWS) {
        if (m->hooks.router) {
            if (kvd_cuda_download(m->h_topi, m->topi, sizeof(int) * (size_t)rows * K)) {
                kvd_cuda_sync(err, KVD_ERR_LEN);
                return -1;
            }
            m->hooks.router(m->hooks.ctx, l, b, m->h_topi);
        }
        kvd_cuda_zero(m->mix, sizeof(float) * (size_t)rows * H);
        kvd_cudaop_expert_lists(m->topi, rows, K, E, m->p.e0, m->p.e1, m->slots_moe, G);
        const int max_groups = m->p.e1 - m->p.e0 < rows * K ? m->p.e1 - m->p.e0 : rows * K;
        experts_grouped(m, d, rows, G, max_groups, rows);
    } else if (moe_host_lists(m, l, b, rows, G, err)) {
        return -1;
    }
    if (Is > 0) {
        kvd_cudaop_swiglu(m->sh1, m->sh2, (size_t)rows * Is);
        kvd_cudaop_linear_add_gated(m->sh1, d->sh_down, m->gx, m->mix, m->shg, rows, H, Is);
    }
    return 0;
}

/* ---- one step ---- */

static int stage(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, int rows, char *err) {
    int rc = kvd_cuda_stage_begin();
    rc |= kvd_cuda_stage_upload(m->tok, b->tok, sizeof(int32_t) * (size_t)rows);
    rc |= kvd_cuda_stage_upload(m->pos, m->h_pos, sizeof(int) * (size_t)rows);
    int r0 = 0;
    for (int s = 0; s < b->n; s++) {
        m->h_seqs[s] = b->seq[s];
        m->h_row0[s] = r0;
        m->h_ntok[s] = b->n_tok[s];
        r0 += b->n_tok[s];
    }
    rc |= kvd_cuda_stage_upload(m->seqs, m->h_seqs, sizeof(int) * (size_t)b->n);
    rc |= kvd_cuda_stage_upload(m->row0, m->h_row0, sizeof(int) * (size_t)b->n);
    rc |= kvd_cuda_stage_upload(m->ntok, m->h_ntok, sizeof(int) * (size_t)b->n);
    rc |= dev_kv_stage(m, &m->kc, kv, b, rows);
    if (m->shadow) rc |= dev_kv_stage(m, &m->sc, m->shadow, b, rows);
    size_t nl = 2 * (size_t)m->c.num_hidden_layers;
    unsigned long long none[nl + 1];
    for (size_t i = 0; i < nl; i++) none[i] = ~0ull;
    rc |= kvd_cuda_stage_upload(m->nonfinite, none, sizeof none[0] * nl);
    if (rc) kvd_cuda_sync(err, KVD_ERR_LEN);
    return rc;
}

/* after the step: the caches' counters and lengths on the host, and the
 * first non-finite value, as the CPU reports it */
static int settle(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, int rows, char *err) {
    const int first = m->p.rank == 0; /* the lengths, once */
    const int H = m->c.hidden_size;
    size_t nl = 2 * (size_t)m->c.num_hidden_layers;
    unsigned long long nf[nl + 1];
    if (kvd_cuda_sync(err, KVD_ERR_LEN)) return -1;
    if (kvd_cuda_download(nf, m->nonfinite, sizeof nf[0] * nl) || dev_kv_settle(m, &m->kc, kv) ||
        (m->shadow && dev_kv_settle(m, &m->sc, m->shadow))) {
        snprintf(err, KVD_ERR_LEN, "device model: copying the step's counters back failed");
        return -1;
    }
    for (int s = 0; s < b->n && first; s++) {
        kvd_kv_seq *q = &kv->seqs[b->seq[s]];
        q->len += b->n_tok[s];
    }
    if (m->shadow && first)
        for (int r = 0; r < rows; r++) {
            kvd_kv_seq *q = &m->shadow->seqs[m->h_row_seq[r]];
            if (m->h_pos[r] + 1 > q->len) q->len = m->h_pos[r] + 1;
        }
    for (size_t i = 0; i < nl; i++)
        if (nf[i] != ~0ull) {
            int l = (int)(i / 2), r = (int)(nf[i] / (unsigned long long)H),
                d = (int)(nf[i] % (unsigned long long)H);
            snprintf(err, KVD_ERR_LEN,
                     "non-finite activation in %s of layer %d (%s) at sequence %d, position %d, "
                     "hidden dim %d (device)",
                     i % 2 ? "the residual stream" : "the token mixer output", l,
                     m->c.layer_types[l] == KVD_LAYER_FULL ? "full_attention" : "linear_attention",
                     m->h_row_seq[r], m->h_pos[r], d);
            return -1;
        }
    return 0;
}

/* the ranks' partial sums in mix, summed on every rank */
static int reduce_mix(kvd_cuda_model *m0, int rows, char *err) {
    if (m0->p.n == 1) return 0;
    if (kvd_cuda_allreduce_sum(m0->comm, m0->mixes, (size_t)rows * m0->full.hidden_size) == 0)
        return 0;
    snprintf(err, KVD_ERR_LEN, "tensor parallelism: the sum over %d GPUs failed", m0->p.n);
    return -1;
}

/* kvd_cuda_forward, and with next set (logits null, last_only) the
 * sequences' greedy next tokens from the device's argmax instead of their
 * logits */
const char *const kvd_cuda_phase_names[KVD_PHASES] = {"stage", "attention", "deltanet",
                                                      "moe",   "lm_head",   "settle"};

void kvd_cuda_model_profile(kvd_cuda_model *m, int on) {
    m->profile = on;
    if (on) memset(m->phase_s, 0, sizeof m->phase_s);
}

void kvd_cuda_model_phases(const kvd_cuda_model *m, double secs[KVD_PHASES]) {
    memcpy(secs, m->phase_s, sizeof m->phase_s);
}

/* profiling: every rank's queue drained, the time since the last phase's
 * end added to `phase` (phase < 0: only the mark, at a step's start) */
static void phase_done(kvd_cuda_model *m0, int phase) {
    if (!m0->profile) return;
    char e[KVD_ERR_LEN];
    for (int r = 0; r < m0->p.n; r++) {
        kvd_cuda_set_device(r);
        kvd_cuda_sync(e, sizeof e); /* a failure shows at the step's own sync */
    }
    kvd_cuda_set_device(0);
    const double t = kvd_now();
    if (phase >= 0) m0->phase_s[phase] += t - m0->phase_end;
    m0->phase_end = t;
}

static int forward(kvd_cuda_model *m0, kvd_kvcache *kv, const kvd_batch *b, float *logits,
                   int last_only, int32_t *next, char *err) {
    const kvd_config *c = &m0->full;
    const int H = c->hidden_size, V = c->vocab_size, n_ranks = m0->p.n;
    const int want = logits || next; /* the final norm and the lm_head run */
    const float eps = (float)c->rms_norm_eps;
    kvd_cuda_model *const *rk = m0->rk;
    if (b->n > m0->max_seqs) {
        snprintf(err, KVD_ERR_LEN, "forward: %d sequences in one step, expected at most %d", b->n,
                 m0->max_seqs);
        return -1;
    }
    phase_done(m0, -1);
    int rows = kvd_batch_rows(c, kv, b, m0->max_rows, m0->max_seqs, m0->h_pos, m0->h_row_seq, err);
    if (rows < 0) return -1;
    if (m0->shadow) /* the shadow receives every row the cache does, at the same positions */
        for (int r = 0; r < rows; r++)
            if (kvd_kvcache_reserve(m0->shadow, m0->h_row_seq[r], m0->h_pos[r] + 1)) {
                snprintf(err, KVD_ERR_LEN, "attention: shadow KV cache out of blocks");
                return -1;
            }
    size_t n = (size_t)rows * H;
    int rc = 0;
    const kvd_cuda_model *ref0 = m0->ref;
    const kvd_hooks *hk = &m0->hooks;
    if (ref0 && (hk->attn_cmp || hk->hidden_cmp || hk->logits_cmp || m0->shadow) &&
        kvd_reference_rows(ref0->held_rows, ref0->h_pos, rows, m0->h_pos, err))
        return -1;
    m0->held_rows = m0->d_held ? rows : 0;
    m0->held_logits_rows = 0;
    for (int r = 0; r < n_ranks && !rc; r++) {
        kvd_cuda_model *m = rk[r];
        if (r) {
            memcpy(m->h_pos, m0->h_pos, sizeof(int) * (size_t)rows);
            memcpy(m->h_row_seq, m0->h_row_seq, sizeof(int) * (size_t)rows);
        }
        kvd_cuda_set_device(r);
        if (!(rc = stage(m, kv, b, rows, err)))
            kvd_cudaop_embed(m->wt->embed, m->tok, m->x, rows, H);
    }
    phase_done(m0, KVD_PHASE_STAGE);
    for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
        const int full_attn = c->layer_types[l] == KVD_LAYER_FULL;
        for (int r = 0; r < n_ranks; r++) {
            kvd_cuda_model *m = rk[r];
            kvd_cuda_set_device(r);
            /* after the first layer, the last one's tail normed x already */
            if (l == 0)
                kvd_cudaop_rmsnorm(m->xn, H, m->x, H, m->wt->L[l].input_norm, rows, H, eps, 1);
            if (full_attn) {
                attention_in(m, l, b, rows);
            } else {
                deltanet(m, l, b, rows);
            }
        }
        if (full_attn) {
            int al = m0->attn_index[l];
            if (m0->hooks.kv && kv_hook(m0, al, rows)) {
                kvd_cuda_sync(err, KVD_ERR_LEN);
                rc = -1;
                break;
            }
            if (m0->hooks.attn_cmp && attn_hook(m0, al, rows, err)) {
                rc = -1;
                break;
            }
            for (int r = 0; r < n_ranks; r++) {
                kvd_cuda_set_device(r);
                attention_out(rk[r], l, rows);
            }
        }
        rc = reduce_mix(m0, rows, err);
        phase_done(m0, full_attn ? KVD_PHASE_ATTENTION : KVD_PHASE_DELTANET);
        for (int r = 0; r < n_ranks && !rc; r++) {
            kvd_cuda_model *m = rk[r];
            kvd_cuda_set_device(r);
            kvd_cudaop_add_norm(m->x, m->mix, rows, H, m->nonfinite + 2 * l, 0, m->xn,
                                m->wt->L[l].post_norm, eps, 1);
            rc = moe(m, l, b, rows, err);
        }
        if (!rc) rc = reduce_mix(m0, rows, err);
        /* the residual add, and the norm the next layer's mixer reads (the
         * final norm's where logits are wanted after the last layer) */
        const int last = l + 1 == c->num_hidden_layers, norm = !last || want;
        for (int r = 0; r < n_ranks && !rc; r++) {
            kvd_cuda_model *m = rk[r];
            kvd_cuda_set_device(r);
            const float *w = !norm ? NULL : !last ? m->wt->L[l + 1].input_norm : m->wt->final_norm;
            kvd_cudaop_add_norm(m->x, m->mix, rows, H, m->nonfinite + 2 * l + 1, 1, m->xn, w, eps,
                                1);
        }
        phase_done(m0, KVD_PHASE_MOE);
        kvd_cuda_set_device(0);
        if (!rc && m0->hooks.hidden) {
            if (kvd_cuda_download(m0->h_x, m0->x, sizeof(float) * n)) {
                kvd_cuda_sync(err, KVD_ERR_LEN);
                rc = -1;
                break;
            }
            m0->hooks.hidden(m0->hooks.ctx, l, b, m0->h_pos, m0->h_x);
        }
        if (!rc && m0->d_hx)
            rc = kvd_cuda_copy(m0->d_hx + (size_t)l * m0->max_rows * H, m0->x, sizeof(float) * n);
        if (!rc && ref0 && hk->hidden_cmp) {
            rc = kvd_cuda_hidden_compare_dev(ref0->d_hx + (size_t)l * ref0->max_rows * H, m0->x,
                                             rows, H, m0->d_hcmp) ||
                 kvd_cuda_download(m0->h_hcmp, m0->d_hcmp, sizeof(kvd_hidden_cmp) * rows);
            if (rc) {
                if (!kvd_cuda_sync(err, KVD_ERR_LEN))
                    snprintf(err, KVD_ERR_LEN,
                             "device model: comparing the residual streams "
                             "failed");
                break;
            }
            hk->hidden_cmp(hk->ctx, l, b, m0->h_pos, m0->h_hcmp);
        }
    }
    kvd_cuda_set_device(0);
    if (rc) return -1;
    /* the logits from rank 0 (every rank holds the same residual stream):
     * every row's where the caller, a reference's keeping or a comparison
     * wants them (with last_only, each sequence's last row then goes back),
     * else the last rows' alone */
    kvd_cuda_model *m = m0;
    const int cmp = ref0 && hk->logits_cmp, all = want && (!last_only || cmp || m0->d_held);
    /* xn holds the final norm of x (the last layer's add_norm) */
    if (all) {
        kvd_cudaop_linear(m->xn, m->wt->lm_head, m->logits, rows, V, H);
        m0->held_logits_rows = m0->d_held ? rows : 0; /* they stay in logits */
        if (cmp) {
            if (ref0->held_logits_rows != rows) {
                snprintf(err, KVD_ERR_LEN,
                         "reference model: its last step gave no logits for these %d rows", rows);
                return -1;
            }
            kvd_batch_targets(b, m0->h_target);
            if (kvd_cuda_upload(m0->d_target, m0->h_target, sizeof(int) * rows) ||
                kvd_cuda_logits_compare_dev(ref0->logits, m->logits, rows, V, m0->d_target,
                                            m0->d_lcmp) ||
                kvd_cuda_download(m0->h_lcmp, m0->d_lcmp, sizeof(kvd_logit_cmp) * rows)) {
                if (!kvd_cuda_sync(err, KVD_ERR_LEN))
                    snprintf(err, KVD_ERR_LEN, "device model: comparing the logits failed");
                return -1;
            }
            hk->logits_cmp(hk->ctx, b, m0->h_pos, m0->h_lcmp);
        }
    } else if (want) {
        int last = -1;
        for (int s = 0; s < b->n; s++) {
            last += b->n_tok[s];
            kvd_cuda_copy(m->gx + (size_t)s * H, m->xn + (size_t)last * H, sizeof(float) * H);
        }
        kvd_cudaop_linear(m->gx, m->wt->lm_head, m->logits, b->n, V, H);
    }
    /* greedy: the argmax of every row's logits (all) or of the last rows'
     * (the rest), the sequences' last rows' copied back */
    if (next) kvd_cudaop_argmax(m->logits, all ? rows : b->n, V, m->d_next);
    phase_done(m0, KVD_PHASE_HEAD);
    for (int r = 0; r < n_ranks && !rc; r++) {
        kvd_cuda_set_device(r);
        rc = settle(rk[r], kv, b, rows, err);
    }
    kvd_cuda_set_device(0);
    if (rc) return -1;
    if (logits) {
        /* every row's; or each sequence's last row, from every row's or from
         * the last rows' alone */
        const size_t vb = sizeof(float) * V;
        if (!last_only)
            rc = kvd_cuda_download(logits, m->logits, vb * rows);
        else if (!all)
            rc = kvd_cuda_download(logits, m->logits, vb * b->n);
        for (int s = 0, last = -1; last_only && all && s < b->n && !rc; s++) {
            last += b->n_tok[s];
            rc = kvd_cuda_download(logits + (size_t)s * V, m->logits + (size_t)last * V, vb);
        }
        if (rc) {
            snprintf(err, KVD_ERR_LEN, "device model: copying the logits back failed");
            return -1;
        }
    }
    if (next) {
        rc = kvd_cuda_download(m->h_next, m->d_next, sizeof(int) * (size_t)(all ? rows : b->n));
        for (int s = 0, last = -1; s < b->n && !rc; s++) {
            last += b->n_tok[s];
            next[s] = m->h_next[all ? last : s];
        }
        if (rc) {
            snprintf(err, KVD_ERR_LEN, "device model: copying the next tokens back failed");
            return -1;
        }
    }
    phase_done(m0, KVD_PHASE_SETTLE);
    return 0;
}

int kvd_cuda_forward(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, float *logits,
                     int last_only, char *err) {
    return forward(m, kv, b, logits, last_only, NULL, err);
}

int kvd_cuda_forward_greedy(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, int32_t *next,
                            char *err) {
    return forward(m, kv, b, NULL, 1, next, err);
}

static int dev_step(void *m, kvd_kvcache *kv, const kvd_batch *b, float *logits, int last_only,
                    char *err) {
    return kvd_cuda_forward(m, kv, b, logits, last_only, err);
}
static int dev_greedy(void *m, kvd_kvcache *kv, const kvd_batch *b, int32_t *next, char *err) {
    return kvd_cuda_forward_greedy(m, kv, b, next, err);
}

int kvd_cuda_prefill(kvd_cuda_model *m, kvd_kvcache *kv, int seq, const int32_t *tok, int n,
                     float *logits, int all_logits, char *err) {
    return kvd_prefill_steps(dev_step, m, m->max_rows, m->c.vocab_size, kv, seq, tok, n, logits,
                             all_logits, err);
}

/* ---- as an engine (engine.h) ---- */

static void *eng_create(const kvd_weights *w, const kvd_kvcache *kv, int max_rows, int max_seqs,
                        int gpus, void *peer, char *err) {
    return peer ? kvd_cuda_model_new_shared(peer, kv, max_rows, max_seqs, err)
                : kvd_cuda_model_new_tp(w, kv, max_rows, max_seqs, gpus, err);
}
static void eng_destroy(void *m) {
    kvd_cuda_model_free(m);
}
static int eng_set_hooks(void *m, const kvd_hooks *h, char *err) {
    return kvd_cuda_model_set_hooks(m, h, err);
}
static int eng_set_shadow(void *m, kvd_kvcache *shadow, char *err) {
    return kvd_cuda_model_set_shadow(m, shadow, err);
}
static int eng_set_reference(void *m, void *ref, const kvd_kvcache *ref_kv, char *err) {
    (void)ref_kv; /* the reference's device cache is its own */
    return kvd_cuda_model_set_reference(m, ref, err);
}
static int eng_fork(void *m, kvd_kvcache *kv, int seq) {
    return kvd_cuda_model_fork(m, kv, seq);
}

static int eng_pull_cache(void *m_, kvd_kvcache *kv) {
    kvd_cuda_model *m = m_;
    size_t bytes = (size_t)kv->n_blocks * kv->kv_heads * (size_t)kv->block_size *
                   kvd_fmt_row_bytes(kv->fmt, kv->head_dim);
    for (int a = 0; a < m->n_full; a++)
        if (kvd_cuda_model_pool(m, a, 0, kv->k[a], bytes) ||
            kvd_cuda_model_pool(m, a, 1, kv->v[a], bytes))
            return -1;
    return 0;
}

const kvd_engine_ops kvd_engine_cuda = {.name = "cuda",
                                        .create = eng_create,
                                        .destroy = eng_destroy,
                                        .set_hooks = eng_set_hooks,
                                        .set_shadow = eng_set_shadow,
                                        .shadow_of_reference = 1,
                                        .set_reference = eng_set_reference,
                                        .forward = dev_step,
                                        .greedy = dev_greedy,
                                        .fork = eng_fork,
                                        .pull_cache = eng_pull_cache};
