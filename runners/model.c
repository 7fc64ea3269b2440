/* kvdrift: the hybrid model's forward pass. Read it top to bottom: embed,
 * then per layer a token mixer (gated attention or Gated DeltaNet) and an MoE
 * feed-forward, both pre-norm with a residual, then the final norm and the
 * LM head. Buffers are sized once; nothing is allocated on the hot path. */
#include "model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../kernels/kernels.h"

/* channels a block of the DeltaNet conv (conv_silu) */
enum { CONV_BLOCK = 64 };

struct kvd_model {
    const kvd_weights *w;
    kvd_config c;
    int max_rows, max_seqs;
    int attn_index[KVD_MAX_LAYERS], lin_index[KVD_MAX_LAYERS];
    int n_full, n_lin;
    float *inv_freq;
    kvd_hooks hooks;
    kvd_kvcache *shadow;
    /* the comparing hooks' reference model and its cache (NULL: none); as
     * a reference, its last step's row count, queries [attn layer][max_rows]
     * [nh][hd], residual streams [layer][max_rows][H] and logits
     * [max_rows][V] (held_logits_rows of them: 0 when it gave no row's) */
    kvd_model *ref;
    const kvd_kvcache *ref_kv;
    float *held, *held_x, *held_logits;
    /* and its K (after norm and RoPE) and V rows, [attn layer][max_rows][kvh][hd]:
     * what a comparing model with a shadow writes into it */
    float *held_k, *held_v;
    /* and its tokens [max_rows] and routed experts [layer][max_rows][k] */
    int32_t *held_tok;
    int *held_topi;
    int held_rows, held_logits_rows;
    /* kvd_model_share_prefix: the layers below the first full-attention
     * layer (prefix of them) taken from the reference's step */
    int share_prefix, prefix;
    kvd_hidden_cmp *hcmp; /* [max_rows] */
    kvd_logit_cmp *lcmp;  /* [max_rows] */
    int *targets;         /* [max_rows] */
    float *all_logits;    /* [max_rows][V]: every row's, when the caller wants the last */
    /* activations, [max_rows][...] */
    float *x, *xn, *mix;
    float *qg, *kb, *vb, *att;
    float *qkvz, *ba, *conv, *z, *beta, *gdec, *gdn_o;
    float *conv_tmp; /* conv_silu's weights and inputs, 2 K a channel */
    float *rlogit, *topw, *gx, *g1, *g2, *sh1, *sh2, *shg;
    int *topi, *rows_of;
    /* routed experts: slots grouped by expert (start [E + 1], at [max_rows K]:
     * where each slot's output is in ey [max_rows K][H]) and a per-thread
     * scratch of an expert's rows and hidden activations */
    int *e_start, *slot_at;
    float *ey, *e_scratch;
    int *pos, *row_seq;
    /* attention scratch (query, probabilities, merge state), one arena per thread */
    void *probs;
    size_t probs_cap;
    int n_threads;
    /* recurrent state per sequence slot and DeltaNet layer */
    float *conv_state; /* [seq][n_lin][conv_dim][K-1] */
    float *ssm;        /* [seq][n_lin][nv][dk][dv] */
};

void kvd_model_set_shadow(kvd_model *m, kvd_kvcache *shadow) {
    m->shadow = shadow;
}
int kvd_model_set_reference(kvd_model *m, kvd_model *ref, const kvd_kvcache *ref_kv, char *err) {
    if (ref) {
        const kvd_config *a = &m->c, *b = &ref->c;
        if (ref == m || a->num_attention_heads != b->num_attention_heads ||
            a->head_dim != b->head_dim || m->n_full != ref->n_full || !ref_kv ||
            a->num_hidden_layers != b->num_hidden_layers || a->hidden_size != b->hidden_size ||
            a->vocab_size != b->vocab_size || a->num_key_value_heads != b->num_key_value_heads ||
            ref_kv->n_layers != ref->n_full || ref->max_rows < m->max_rows) {
            snprintf(err, KVD_ERR_LEN,
                     "reference model: expected another model of the same attention shape, "
                     "with its cache and at least as many rows a step");
            return -1;
        }
        if (!ref->held) {
            size_t R = (size_t)ref->max_rows;
            size_t nq = (size_t)ref->n_full * R * b->num_attention_heads * b->head_dim;
            ref->held = malloc(sizeof(float) * (nq ? nq : 1));
            ref->held_x = malloc(sizeof(float) * (size_t)b->num_hidden_layers * R * b->hidden_size);
            ref->held_logits = malloc(sizeof(float) * R * (size_t)b->vocab_size);
            size_t nkv = (size_t)ref->n_full * R * b->num_key_value_heads * b->head_dim;
            ref->held_k = malloc(sizeof(float) * (nkv ? nkv : 1));
            ref->held_v = malloc(sizeof(float) * (nkv ? nkv : 1));
            ref->held_tok = malloc(sizeof(int32_t) * R);
            const size_t K = b->num_experts > 0 ? (size_t)b->num_experts_per_tok : 1;
            ref->held_topi = malloc(sizeof(int) * (size_t)b->num_hidden_layers * R * K);
            ref->held_rows = ref->held_logits_rows = 0;
            if (!ref->held || !ref->held_x || !ref->held_logits || !ref->held_k || !ref->held_v ||
                !ref->held_tok || !ref->held_topi) {
                snprintf(err, KVD_ERR_LEN,
                         "reference model: out of memory for its queries, K/V rows, residual "
                         "streams and logits");
                return -1;
            }
        }
        if (!m->hcmp) m->hcmp = malloc(sizeof(kvd_hidden_cmp) * (size_t)m->max_rows);
        if (!m->lcmp) m->lcmp = malloc(sizeof(kvd_logit_cmp) * (size_t)m->max_rows);
        if (!m->targets) m->targets = malloc(sizeof(int) * (size_t)m->max_rows);
        if (!m->all_logits)
            m->all_logits = malloc(sizeof(float) * (size_t)m->max_rows * a->vocab_size);
        if (!m->hcmp || !m->lcmp || !m->targets || !m->all_logits) {
            snprintf(err, KVD_ERR_LEN, "reference model: out of memory");
            return -1;
        }
    }
    m->ref = ref;
    m->ref_kv = ref ? ref_kv : NULL;
    return 0;
}
const kvd_config *kvd_model_config(const kvd_model *m) {
    return &m->c;
}
int kvd_model_attn_index(const kvd_model *m, int l) {
    return m->attn_index[l];
}
void kvd_model_set_hooks(kvd_model *m, const kvd_hooks *h) {
    if (h) {
        m->hooks = *h;
    } else {
        memset(&m->hooks, 0, sizeof m->hooks);
    }
}

/* kvd_linear over one of the model's matrices, with its AMX tiles laid out
 * once where the CPU's GEMMs take them (then at any row count: decode
 * streams the BF16 tiles, half the FP32 bytes) */
static void linear(const kvd_model *m, const float *x, const float *w, float *y, int M, int N,
                   int K) {
    kvd_linear_tiled(x, w, kvd_weights_tiles(m->w, w, N, K), y, M, N, K);
}

/* one of several GEMMs over the same x (kvd_linear_many): W [N][K], its
 * tiles, and its output */
static kvd_linear_job job(const kvd_model *m, const float *w, float *y, int N, int K) {
    return (kvd_linear_job){w, kvd_weights_tiles(m->w, w, N, K), y, N};
}

static size_t conv_state_len(const kvd_config *c) {
    return (size_t)kvd_conv_dim(c) * (size_t)(c->linear_conv_kernel_dim - 1);
}
static size_t ssm_len(const kvd_config *c) {
    return (size_t)c->linear_num_value_heads * (size_t)c->linear_key_head_dim *
           (size_t)c->linear_value_head_dim;
}

/* the calling thread's number in its parallel region (0 outside one) */
static int thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

void kvd_model_free(kvd_model *m) {
    if (!m) return;
    float *bufs[] = {m->inv_freq,   m->x,    m->xn,    m->mix,       m->qg,      m->kb,
                     m->vb,         m->att,  m->qkvz,  m->ba,        m->conv,    m->z,
                     m->beta,       m->gdec, m->gdn_o, m->rlogit,    m->topw,    m->gx,
                     m->g1,         m->g2,   m->sh1,   m->sh2,       m->shg,     m->probs,
                     m->conv_state, m->ssm,  m->ey,    m->e_scratch, m->conv_tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->held_tok), free(m->held_topi);
    free(m->held), free(m->held_x), free(m->held_logits), free(m->held_k), free(m->held_v),
        free(m->hcmp), free(m->lcmp);
    free(m->targets), free(m->all_logits);
    free(m->topi);
    free(m->rows_of);
    free(m->e_start), free(m->slot_at);
    free(m->pos);
    free(m->row_seq);
    free(m);
}

kvd_model *kvd_model_new(const kvd_weights *w, int max_rows, int max_seqs, char *err) {
    const kvd_config *c = &w->cfg;
    if (max_rows <= 0 || max_seqs <= 0) {
        snprintf(err, KVD_ERR_LEN, "model: expected positive max_rows and max_seqs");
        return NULL;
    }
    kvd_model *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->w = w;
    m->c = *c;
    m->max_rows = max_rows;
    m->max_seqs = max_seqs;
    kvd_config_layer_indices(c, m->attn_index, m->lin_index, &m->n_full, &m->n_lin);
    while (m->prefix < c->num_hidden_layers && c->layer_types[m->prefix] != KVD_LAYER_FULL)
        m->prefix++;
    int rot = kvd_rot_dim(c);
    m->inv_freq = malloc(sizeof(float) * (size_t)(rot / 2));
    if (!m->inv_freq) goto oom;
    for (int i = 0; i < rot / 2; i++)
        m->inv_freq[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / rot));

    size_t R = (size_t)max_rows, H = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
    size_t nh = (size_t)c->num_attention_heads, kvh = (size_t)c->num_key_value_heads;
    size_t kd = (size_t)kvd_key_dim(c), vd = (size_t)kvd_value_dim(c);
    size_t nv = (size_t)c->linear_num_value_heads;
    size_t E = (size_t)(c->num_experts > 0 ? c->num_experts : 1);
    size_t K = (size_t)(c->num_experts > 0 ? c->num_experts_per_tok : 1);
    size_t I = (size_t)(c->num_experts > 0 ? c->moe_intermediate_size : c->intermediate_size);
    size_t Is =
        (size_t)(c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : 1);
#define ALLOC(p, n)                                                                                \
    do {                                                                                           \
        (p) = malloc(sizeof(*(p)) * (n));                                                          \
        if (!(p)) goto oom;                                                                        \
    } while (0)
    ALLOC(m->x, R * H);
    ALLOC(m->xn, R * H);
    ALLOC(m->mix, R * H);
    ALLOC(m->qg, R * nh * hd * 2);
    ALLOC(m->kb, R * kvh * hd);
    ALLOC(m->vb, R * kvh * hd);
    ALLOC(m->att, R * nh * hd);
    ALLOC(m->qkvz, R * (2 * kd + 2 * vd));
    ALLOC(m->ba, R * 2 * nv);
    ALLOC(m->conv, R * (2 * kd + vd));
    ALLOC(m->conv_tmp, 2 * (size_t)c->linear_conv_kernel_dim *
                           ((2 * kd + vd + CONV_BLOCK - 1) / CONV_BLOCK) * CONV_BLOCK);
    ALLOC(m->z, R * vd);
    ALLOC(m->beta, R * nv);
    ALLOC(m->gdec, R * nv);
    ALLOC(m->gdn_o, R * vd);
    ALLOC(m->rlogit, R * E);
    ALLOC(m->topw, R * K);
    ALLOC(m->topi, R * K);
    ALLOC(m->rows_of, R * K);
    ALLOC(m->gx, R * H);
    ALLOC(m->g1, R * I);
    ALLOC(m->g2, R * I);
    ALLOC(m->e_start, E + 1);
    ALLOC(m->slot_at, R * K);
    ALLOC(m->sh1, R * Is);
    ALLOC(m->sh2, R * Is);
    ALLOC(m->shg, R);
    ALLOC(m->pos, R);
    ALLOC(m->row_seq, R);
    m->conv_state =
        calloc((size_t)max_seqs * (size_t)m->n_lin * conv_state_len(c) + 1, sizeof(float));
    m->ssm = calloc((size_t)max_seqs * (size_t)m->n_lin * ssm_len(c) + 1, sizeof(float));
    if (!m->conv_state || !m->ssm) goto oom;
#ifdef _OPENMP
    m->n_threads = omp_get_max_threads();
#else
    m->n_threads = 1;
#endif
    if (c->num_experts > 0) {
        ALLOC(m->ey, R * K * H);
        ALLOC(m->e_scratch, (size_t)m->n_threads * R * (H + 2 * I));
    }
#undef ALLOC
    return m;
oom:
    snprintf(err, KVD_ERR_LEN, "model: out of memory for %d rows x %d sequences", max_rows,
             max_seqs);
    kvd_model_free(m);
    return NULL;
}

void kvd_model_share_prefix(kvd_model *m, int on) {
    m->share_prefix = on;
}

/* A step whose layers below the first full-attention layer are the
 * reference's last step's (kvd_model_share_prefix): their residual streams,
 * routed experts and hooks taken from it, and its sequences' recurrent
 * state of those layers copied after; the first layer to run. */
static int shared_prefix(kvd_model *m, const kvd_batch *b, int rows, char *err) {
    const kvd_model *ref = m->ref;
    if (!m->share_prefix || !ref || m->prefix == 0 || m->prefix == m->c.num_hidden_layers) return 0;
    const kvd_config *c = &m->c;
    const size_t H = (size_t)c->hidden_size, R = (size_t)ref->max_rows;
    const int K = c->num_experts > 0 ? c->num_experts_per_tok : 1;
    if (kvd_reference_rows(ref->held_rows, ref->pos, rows, m->pos, err)) return -1;
    for (int r = 0; r < rows; r++)
        if (b->tok[r] != ref->held_tok[r]) {
            snprintf(err, KVD_ERR_LEN,
                     "reference model: row %d (position %d) has token %d, the reference's %d: "
                     "the layers below the first full-attention layer cannot be shared",
                     r, m->pos[r], b->tok[r], ref->held_tok[r]);
            return -1;
        }
    for (int l = 0; l < m->prefix; l++) {
        const float *x = ref->held_x + (size_t)l * R * H;
        if (c->num_experts > 0 && m->hooks.router)
            m->hooks.router(m->hooks.ctx, l, b, ref->held_topi + (size_t)l * R * K);
        if (m->hooks.hidden) m->hooks.hidden(m->hooks.ctx, l, b, m->pos, x);
        if (m->held_x) memcpy(m->held_x + (size_t)l * m->max_rows * H, x, sizeof(float) * rows * H);
        if (m->held_topi)
            memcpy(m->held_topi + (size_t)l * m->max_rows * K, ref->held_topi + (size_t)l * R * K,
                   sizeof(int) * (size_t)rows * K);
        if (m->hooks.hidden_cmp) { /* as the layer's own run would compare it: the same bits */
#pragma omp parallel for schedule(static)
            for (int i = 0; i < rows; i++)
                kvd_hidden_compare(x + (size_t)i * H, x + (size_t)i * H, 1, (int)H, m->hcmp + i);
            m->hooks.hidden_cmp(m->hooks.ctx, l, b, m->pos, m->hcmp);
        }
    }
    memcpy(m->x, ref->held_x + (size_t)(m->prefix - 1) * R * H, sizeof(float) * rows * H);
    /* the prefix's layers are the first prefix DeltaNet layers of a slot's state */
    const size_t cl = conv_state_len(c), sl = ssm_len(c), nl = (size_t)m->n_lin;
    for (int r = 0; r < rows; r++) {
        if (r > 0 && m->row_seq[r] == m->row_seq[r - 1]) continue;
        const size_t to = (size_t)m->row_seq[r], from = (size_t)ref->row_seq[r];
        memcpy(m->conv_state + to * nl * cl, ref->conv_state + from * nl * cl,
               sizeof(float) * cl * (size_t)m->prefix);
        memcpy(m->ssm + to * nl * sl, ref->ssm + from * nl * sl,
               sizeof(float) * sl * (size_t)m->prefix);
    }
    return m->prefix;
}

void kvd_model_reset_seq(kvd_model *m, int seq) {
    size_t cl = conv_state_len(&m->c) * (size_t)m->n_lin, sl = ssm_len(&m->c) * (size_t)m->n_lin;
    memset(m->conv_state + (size_t)seq * cl, 0, cl * sizeof(float));
    memset(m->ssm + (size_t)seq * sl, 0, sl * sizeof(float));
}

void kvd_model_copy_seq(kvd_model *m, int from, int to) {
    size_t cl = conv_state_len(&m->c) * (size_t)m->n_lin, sl = ssm_len(&m->c) * (size_t)m->n_lin;
    memcpy(m->conv_state + (size_t)to * cl, m->conv_state + (size_t)from * cl, cl * sizeof(float));
    memcpy(m->ssm + (size_t)to * sl, m->ssm + (size_t)from * sl, sl * sizeof(float));
}

/* What every row's attention over the cache shares (attention() below). */
typedef struct {
    kvd_model *m;
    kvd_kvcache *kv;
    int al, hook_raw, shadow, cmp;
    size_t qb, pb, sb, rb, fb, per_thread;
    kvd_kv_view view;
    const kvd_model *ref;
} attn_rows;

/* Row r's attention (thread tid's arena): its distribution and output over
 * the cache, and the drift views the hooks want. */
static void attend_row(const attn_rows *J, int r, int tid) {
    kvd_model *m = J->m;
    kvd_kvcache *kv = J->kv;
    const int al = J->al, hook_raw = J->hook_raw, shadow = J->shadow, cmp = J->cmp;
    const int nh = m->c.num_attention_heads, hd = m->c.head_dim;
    const float sm_scale = 1.0f / sqrtf((float)hd);
    const size_t qb = J->qb, pb = J->pb, sb = J->sb, rb = J->rb, fb = J->fb,
                 per_thread = J->per_thread;
    const kvd_model *ref = J->ref;
    const kvd_kv_view view = J->view;
    char *arena = (char *)m->probs + (size_t)tid * per_thread;
    float *qh = (float *)arena, *pr = (float *)(arena + qb);
    float *sp = (float *)(arena + qb + pb), *so = (float *)(arena + qb + 2 * pb);
    float *rp = (float *)(arena + qb + pb + sb), *ro = (float *)(arena + qb + 2 * pb + sb);
    double *kl = (double *)(arena + qb + pb + sb + rb);
    int *top = (int *)(kl + 2 * nh);
    void *work = arena + qb + pb + sb + rb + fb;
    const float *q = m->qg + (size_t)r * nh * 2 * hd;
    for (int h = 0; h < nh; h++)
        memcpy(qh + (size_t)h * hd, q + (size_t)h * 2 * hd, sizeof(float) * (size_t)hd);
    if (m->held) memcpy(m->held + ((size_t)al * m->max_rows + r) * nh * hd, qh, qb);
    int n_ctx = m->pos[r] + 1, parts = kvd_attn_parts(n_ctx, kv->block_size);
    float *out = m->att + (size_t)r * nh * hd;
    kvd_attn_paged(&view, kv->seqs[m->row_seq[r]].blocks, n_ctx, qh, nh, sm_scale, out, pr, work,
                   parts);
    if ((!hook_raw && !cmp) ||
        (m->hooks.want_attn && !m->hooks.want_attn(m->hooks.ctx, al, m->row_seq[r], m->pos[r])))
        return;
    /* the isolated view's two sides: the reference side's query over its
     * own cache, and over the shadow (the same K/V in the shadow's codec).
     * With a reference model, that side is the reference's (its query and
     * cache, recomputed here as the propagated view needs them anyway; the
     * shadow holds its K/V rows), else this model's own. */
    const float *iso_q = ref ? ref->held + ((size_t)al * ref->max_rows + r) * nh * hd : qh;
    kvd_attn_cmp views[2], *iso = NULL, *prop = NULL;
    /* the reference's row at the same position, over its own cache */
    if (cmp && ref) {
        kvd_kv_view rv = kvd_kvcache_view(m->ref_kv, al);
        kvd_attn_paged(&rv, m->ref_kv->seqs[ref->row_seq[r]].blocks, n_ctx, iso_q, nh, sm_scale, ro,
                       rp, work, parts);
        kvd_attn_compare(rp, pr, nh, n_ctx, kl + nh, top + 2 * nh, top + 3 * nh);
        views[1] = (kvd_attn_cmp){kl + nh, top + 2 * nh, top + 3 * nh, ro, out};
        prop = &views[1];
    }
    if (shadow) {
        kvd_kv_view sv = kvd_kvcache_view(m->shadow, al);
        kvd_attn_paged(&sv, m->shadow->seqs[m->row_seq[r]].blocks, n_ctx, iso_q, nh, sm_scale, so,
                       sp, work, parts);
    }
    if (cmp && shadow) {
        kvd_attn_compare(ref ? rp : pr, sp, nh, n_ctx, kl, top, top + nh);
        views[0] = (kvd_attn_cmp){kl, top, top + nh, ref ? ro : out, so};
        iso = &views[0];
    }
#pragma omp critical(kvd_attn_hook)
    {
        if (hook_raw)
            m->hooks.attn(m->hooks.ctx, al, m->row_seq[r], m->pos[r], n_ctx, pr, out,
                          shadow ? sp : NULL, shadow ? so : NULL);
        if (iso || prop) m->hooks.attn_cmp(m->hooks.ctx, al, m->row_seq[r], m->pos[r], iso, prop);
    }
}

/* ---- gated full attention ---- */

static int attention(kvd_model *m, int layer, kvd_kvcache *kv, int rows, char *err) {
    const kvd_config *c = &m->c;
    const kvd_layer_weights *lw = &m->w->layers[layer];
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    const int kvh = c->num_key_value_heads, rot = kvd_rot_dim(c);
    const int al = m->attn_index[layer];
    const float eps = (float)c->rms_norm_eps;

    /* projections: q carries [query | gate] per head */
    const kvd_linear_job qkv[] = {job(m, lw->q_proj, m->qg, nh * hd * 2, H),
                                  job(m, lw->k_proj, m->kb, kvh * hd, H),
                                  job(m, lw->v_proj, m->vb, kvh * hd, H)};
    kvd_linear_many(m->xn, qkv, 3, rows, H);

    /* per-head q/k RMSNorm, then RoPE on the first rot dims */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < nh; h++) {
            float *q = m->qg + ((size_t)r * nh + h) * 2 * hd;
            kvd_rmsnorm(q, q, lw->q_norm, hd, eps, 1);
            kvd_rope(q, m->pos[r], rot, m->inv_freq);
        }
        for (int h = 0; h < kvh; h++) {
            float *k = m->kb + ((size_t)r * kvh + h) * hd;
            kvd_rmsnorm(k, k, lw->k_norm, hd, eps, 1);
            kvd_rope(k, m->pos[r], rot, m->inv_freq);
        }
    }

    /* the cache stores K after norm and RoPE, V as projected; a reference
     * holds its rows for the models comparing with it, and the shadow takes
     * the reference side's rows (the reference's, where there is one) */
    const size_t kvn = (size_t)kvh * hd;
    for (int r = 0; r < rows; r++) {
        const float *k = m->kb + (size_t)r * kvn, *v = m->vb + (size_t)r * kvn;
        if (m->hooks.kv) m->hooks.kv(m->hooks.ctx, al, m->row_seq[r], m->pos[r], k, v);
        kvd_kvcache_write(kv, al, m->row_seq[r], m->pos[r], k, v);
        if (m->held_k) {
            memcpy(m->held_k + ((size_t)al * m->max_rows + r) * kvn, k, sizeof(float) * kvn);
            memcpy(m->held_v + ((size_t)al * m->max_rows + r) * kvn, v, sizeof(float) * kvn);
        }
        if (m->shadow) {
            if (kvd_kvcache_reserve(m->shadow, m->row_seq[r], m->pos[r] + 1)) {
                snprintf(err, KVD_ERR_LEN, "attention: shadow KV cache out of blocks");
                return -1;
            }
            const float *sk = k, *sv = v;
            if (m->ref) {
                const size_t at = ((size_t)al * m->ref->max_rows + r) * kvn;
                sk = m->ref->held_k + at, sv = m->ref->held_v + at;
            }
            kvd_kvcache_write(m->shadow, al, m->row_seq[r], m->pos[r], sk, sv);
        }
    }

    /* attention over the cache: each row sees positions 0 .. its own. Many
     * rows: one row per thread. Few rows over long contexts (decode): each
     * row's context split across the threads. */
    int max_ctx = 0;
    for (int r = 0; r < rows; r++) max_ctx = m->pos[r] + 1 > max_ctx ? m->pos[r] + 1 : max_ctx;
    /* the number of parts depends on the context only (so results do not
     * depend on the thread count); threads take rows, or a row's parts */
    int split = kvd_attn_parts(max_ctx, kv->block_size);
    int by_rows = rows >= m->n_threads || split == 1;
    const int hook_raw = m->hooks.attn != NULL,
              shadow = m->shadow && (hook_raw || m->hooks.attn_cmp);
    const int cmp = m->hooks.attn_cmp && (m->shadow || m->ref);
    /* each thread's arena: the query, its distribution; with a shadow, the
     * distribution and output over it; with a reference, the reference's;
     * the compared figures (two views); the kernel's work */
    size_t qb = sizeof(float) * (size_t)nh * hd, pb = sizeof(float) * (size_t)nh * max_ctx;
    size_t wb = kvd_attn_work_bytes(nh, hd, max_ctx, split);
    size_t sb = shadow ? pb + qb : 0, rb = cmp && m->ref ? pb + qb : 0;
    size_t fb = cmp ? (sizeof(double) + 2 * sizeof(int)) * 2 * (size_t)nh : 0;
    size_t per_thread = (qb + pb + sb + rb + fb + wb + 63) / 64 * 64;
    size_t need = per_thread * (size_t)m->n_threads;
    if (need > m->probs_cap) {
        void *p = realloc(m->probs, need);
        if (!p) {
            snprintf(err, KVD_ERR_LEN, "attention: out of memory for %d-token context", max_ctx);
            return -1;
        }
        m->probs = p;
        m->probs_cap = need;
    }
    kvd_kv_view view = kvd_kvcache_view(kv, al);
    /* calibration: the queries as attention sees them (after norm and RoPE) */
    kvd_kvcache_note_queries(kv, al, m->qg, rows, (size_t)nh * 2 * hd, (size_t)2 * hd);
    const attn_rows J = {.m = m,
                         .kv = kv,
                         .al = al,
                         .hook_raw = hook_raw,
                         .shadow = shadow,
                         .cmp = cmp,
                         .qb = qb,
                         .pb = pb,
                         .sb = sb,
                         .rb = rb,
                         .fb = fb,
                         .per_thread = per_thread,
                         .view = view,
                         .ref = m->ref};
    if (by_rows) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int r = 0; r < rows; r++) attend_row(&J, r, thread_num());
    } else {
        /* outside any parallel region, so that each row's parts take the
         * threads as the top-level team: inside even an inactive region
         * they would be a nested team, new threads contending with the
         * top-level team's spinning ones (milliseconds a call on 2 cores,
         * against 0.15 ms) */
        for (int r = 0; r < rows; r++) attend_row(&J, r, 0);
    }

    /* output gate, then o_proj */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < nh; h++) {
            float *o = m->att + ((size_t)r * nh + h) * hd;
            const float *g = m->qg + ((size_t)r * nh + h) * 2 * hd + hd;
            for (int d = 0; d < hd; d++) o[d] *= kvd_sigmoidf(g[d]);
        }
    linear(m, m->att, lw->o_proj, m->mix, rows, H, nh * hd);
    return 0;
}

/* Rows past which the layer loop's own row-wise work (norms, residual
 * adds, SwiGLU, the finiteness check) is shared among the threads; each
 * row's operations are the same either way. Decode's few rows stay on one
 * thread, where a parallel region would cost more than the work. */
enum { PAR_ROWS = 16 };

static void norm_rows(float *out, const float *x, const float *w, int rows, int H, float eps) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int r = 0; r < rows; r++)
        kvd_rmsnorm(out + (size_t)r * H, x + (size_t)r * H, w, H, eps, 1);
}

/* x += y over rows of H */
static void add_rows(float *x, const float *y, int rows, int H) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < H; d++) x[(size_t)r * H + d] += y[(size_t)r * H + d];
}

/* kvd_swiglu over rows of n values */
static void swiglu_rows(float *g, const float *u, int rows, int n) {
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
    for (int r = 0; r < rows; r++) kvd_swiglu(g + (size_t)r * n, u + (size_t)r * n, (size_t)n);
}

/* ---- Gated DeltaNet ---- */

/* The causal depthwise conv1d (kernel K, weights [cd][K]) and SiLU over a
 * step's rows of m->conv (row stride cd, each sequence's rows in turn), in
 * place, carried across steps by each sequence's state st ([cd][K - 1],
 * oldest input first) of linear layer li. Channels go in blocks of
 * CONV_BLOCK, a row's block in vectors, with the block's weights (laid out
 * once a step, for every sequence) and a sequence's last K - 1 inputs in
 * m->conv_tmp (2 K values a channel); each output is still
 * w[K-1] in + w[0] h[0] + ... + w[K-2] h[K-2], summed in that order. */
static void conv_silu(kvd_model *m, const kvd_batch *b, int li, const float *w) {
    const int cd = kvd_conv_dim(&m->c), K = m->c.linear_conv_kernel_dim;
    const int nb = (cd + CONV_BLOCK - 1) / CONV_BLOCK;
    const size_t sl = conv_state_len(&m->c);
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nb; blk++) {
        const int c0 = blk * CONV_BLOCK, n = cd - c0 < CONV_BLOCK ? cd - c0 : CONV_BLOCK;
        float *wt = m->conv_tmp + (size_t)blk * 2 * K * CONV_BLOCK; /* [K][block] */
        float *h = wt + (size_t)K * CONV_BLOCK;                     /* [K - 1][block] */
        for (int c = 0; c < n; c++)
            for (int j = 0; j < K; j++) wt[j * CONV_BLOCK + c] = w[(size_t)(c0 + c) * K + j];
        float acc[CONV_BLOCK];
        for (int s = 0, row0 = 0; s < b->n; row0 += b->n_tok[s++]) {
            float *st = m->conv_state + ((size_t)b->seq[s] * (size_t)m->n_lin + (size_t)li) * sl +
                        (size_t)c0 * (K - 1);
            for (int c = 0; c < n; c++)
                for (int j = 0; j < K - 1; j++) h[j * CONV_BLOCK + c] = st[(size_t)c * (K - 1) + j];
            for (int t = 0; t < b->n_tok[s]; t++) {
                float *xr = m->conv + (size_t)(row0 + t) * cd + c0;
                for (int c = 0; c < n; c++) acc[c] = wt[(K - 1) * CONV_BLOCK + c] * xr[c];
                for (int j = 0; j < K - 1; j++)
                    for (int c = 0; c < n; c++)
                        acc[c] += wt[j * CONV_BLOCK + c] * h[j * CONV_BLOCK + c];
                if (K > 1) {
                    memmove(h, h + CONV_BLOCK, sizeof(float) * (size_t)(K - 2) * CONV_BLOCK);
                    memcpy(h + (size_t)(K - 2) * CONV_BLOCK, xr, sizeof(float) * (size_t)n);
                }
                for (int c = 0; c < n; c++) xr[c] = kvd_siluf(acc[c]);
            }
            for (int c = 0; c < n; c++)
                for (int j = 0; j < K - 1; j++) st[(size_t)c * (K - 1) + j] = h[j * CONV_BLOCK + c];
        }
    }
}

static void deltanet(kvd_model *m, int layer, const kvd_batch *b, int rows) {
    const kvd_config *c = &m->c;
    const kvd_layer_weights *lw = &m->w->layers[layer];
    const int H = c->hidden_size, nk = c->linear_num_key_heads, nv = c->linear_num_value_heads;
    const int dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, r_ = nv / nk;
    const int kd = kvd_key_dim(c), vd = kvd_value_dim(c), cd = kvd_conv_dim(c);
    const int li = m->lin_index[layer];
    const float eps = (float)c->rms_norm_eps, qscale = 1.0f / sqrtf((float)dk);
    const int pw = 2 * kd + 2 * vd;

    const kvd_linear_job in[] = {job(m, lw->in_proj_qkvz, m->qkvz, pw, H),
                                 job(m, lw->in_proj_ba, m->ba, 2 * nv, H)};
    kvd_linear_many(m->xn, in, 2, rows, H);

    /* un-group the fused projections (per key head: q, k, r v's, r z's; and
     * r b's, r a's) into plain [q | k | v], z, beta and the log decay g */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *p = m->qkvz + (size_t)r * pw, *pba = m->ba + (size_t)r * 2 * nv;
        float *mixd = m->conv + (size_t)r * cd, *z = m->z + (size_t)r * vd;
        for (int h = 0; h < nk; h++) {
            const float *g = p + (size_t)h * (2 * dk + 2 * r_ * dv);
            memcpy(mixd + h * dk, g, sizeof(float) * (size_t)dk);
            memcpy(mixd + kd + h * dk, g + dk, sizeof(float) * (size_t)dk);
            memcpy(mixd + 2 * kd + h * r_ * dv, g + 2 * dk, sizeof(float) * (size_t)(r_ * dv));
            memcpy(z + h * r_ * dv, g + 2 * dk + r_ * dv, sizeof(float) * (size_t)(r_ * dv));
            for (int j = 0; j < r_; j++) {
                int vh = h * r_ + j;
                float bb = pba[h * 2 * r_ + j], aa = pba[h * 2 * r_ + r_ + j];
                float sp = aa + lw->dt_bias[vh];
                sp = sp > 20.0f ? sp : log1pf(expf(sp)); /* softplus, torch's threshold */
                m->beta[(size_t)r * nv + vh] = kvd_sigmoidf(bb);
                m->gdec[(size_t)r * nv + vh] = -expf(lw->A_log[vh]) * sp;
            }
        }
    }

    /* causal depthwise conv1d + SiLU, carried across steps by the conv state;
     * then L2-normalised q, k per key head (q also scaled by dk^-0.5) */
    conv_silu(m, b, li, lw->conv1d);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        float *x = m->conv + (size_t)r * cd;
        for (int h = 0; h < 2 * nk; h++) {
            float *v = x + (size_t)h * dk;
            double ss = 0.0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            float inv = (float)(1.0 / sqrt(ss + 1e-6));
            if (h < nk) inv *= qscale;
            for (int i = 0; i < dk; i++) v[i] *= inv;
        }
    }

    /* the recurrence: independent per (sequence, value head), serial in time */
    int npairs = b->n * nv;
    int starts[b->n], row0 = 0;
    for (int s = 0; s < b->n; s++) {
        starts[s] = row0;
        row0 += b->n_tok[s];
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < npairs; i++) {
        int s = i / nv, vh = i % nv, kh = vh / r_;
        float *S = m->ssm + (((size_t)b->seq[s] * (size_t)m->n_lin + (size_t)li) * nv + vh) *
                                (size_t)dk * dv;
        size_t r = (size_t)starts[s];
        const float *x = m->conv + r * cd;
        kvd_gdn_steps(S, x + kh * dk, x + kd + kh * dk, x + 2 * kd + vh * dv, m->gdec + r * nv + vh,
                      m->beta + r * nv + vh, m->gdn_o + r * vd + vh * dv, b->n_tok[s], dk, dv, cd,
                      cd, (size_t)nv, vd);
    }

    /* gated RMSNorm per value head: rmsnorm(o) * w * silu(z) */
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++)
        for (int vh = 0; vh < nv; vh++) {
            float *o = m->gdn_o + (size_t)r * vd + vh * dv;
            const float *z = m->z + (size_t)r * vd + vh * dv;
            kvd_rmsnorm(o, o, lw->gdn_norm, dv, eps, 0);
            for (int d = 0; d < dv; d++) o[d] *= kvd_siluf(z[d]);
        }
    linear(m, m->gdn_o, lw->out_proj, m->mix, rows, H, vd);
}

/* ---- feed-forward ---- */

static void moe(kvd_model *m, int layer, const kvd_batch *b, int rows) {
    const kvd_config *c = &m->c;
    const kvd_layer_weights *lw = &m->w->layers[layer];
    const int H = c->hidden_size;
    if (c->num_experts == 0) {
        const int I = c->intermediate_size;
        const kvd_linear_job gu[] = {job(m, lw->dense_gate, m->g1, I, H),
                                     job(m, lw->dense_up, m->g2, I, H)};
        kvd_linear_many(m->xn, gu, 2, rows, H);
        swiglu_rows(m->g1, m->g2, rows, I);
        linear(m, m->g1, lw->dense_down, m->mix, rows, H, I);
        return;
    }
    const int E = c->num_experts, K = c->num_experts_per_tok, I = c->moe_intermediate_size;

    /* router: softmax over all experts in fp32, top-k, optional renormalise;
     * the shared expert's projections of the same x beside it */
    const int Is = c->shared_expert_intermediate_size;
    const kvd_linear_job rs[] = {job(m, lw->router, m->rlogit, E, H),
                                 Is > 0 ? job(m, lw->sh_gate, m->sh1, Is, H) : (kvd_linear_job){0},
                                 Is > 0 ? job(m, lw->sh_up, m->sh2, Is, H) : (kvd_linear_job){0},
                                 Is > 0 ? job(m, lw->sh_expert_gate, m->shg, 1, H)
                                        : (kvd_linear_job){0}};
    kvd_linear_many(m->xn, rs, Is > 0 ? 4 : 1, rows, H);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        kvd_route(m->rlogit + (size_t)r * E, E, K, c->norm_topk_prob, m->topi + (size_t)r * K,
                  m->topw + (size_t)r * K);
    }
    if (m->hooks.router) m->hooks.router(m->hooks.ctx, layer, b, m->topi);
    if (m->held_topi)
        memcpy(m->held_topi + (size_t)layer * m->max_rows * K, m->topi,
               sizeof(int) * (size_t)rows * K);

    /* routed experts: each expert's rows gathered and its SwiGLU run as
     * GEMMs, the experts side by side (a thread an expert at a time, its
     * GEMMs single-threaded: at the experts' widths one GEMM is too narrow
     * to split), each output kept per slot; then every row adds its slots
     * weighted in ascending expert order, so the sums are the same bits on
     * any thread count */
    const int slots = rows * K;
    for (int e = 0; e <= E; e++) m->e_start[e] = 0;
    for (int i = 0; i < slots; i++) m->e_start[m->topi[i] + 1]++;
    for (int e = 0; e < E; e++) m->e_start[e + 1] += m->e_start[e];
    for (int i = 0; i < slots; i++) { /* rows ascending within an expert */
        const int at = m->e_start[m->topi[i]]++;
        m->rows_of[at] = i, m->slot_at[i] = at;
    }
    for (int e = E; e > 0; e--) m->e_start[e] = m->e_start[e - 1]; /* each back to its start */
    m->e_start[0] = 0;
    const size_t scratch = (size_t)m->max_rows * (size_t)(H + 2 * I);
#pragma omp parallel for schedule(dynamic) num_threads(m->n_threads) if (m->n_threads > 1)
    for (int e = 0; e < E; e++) {
        const int a = m->e_start[e], n = m->e_start[e + 1] - a;
        if (n == 0) continue;
        float *gx = m->e_scratch + (size_t)thread_num() * scratch;
        float *g1 = gx + (size_t)m->max_rows * H, *g2 = g1 + (size_t)m->max_rows * I;
        for (int i = 0; i < n; i++)
            memcpy(gx + (size_t)i * H, m->xn + (size_t)(m->rows_of[a + i] / K) * H,
                   sizeof(float) * (size_t)H);
        const kvd_linear_job gu[] = {job(m, lw->exp_gate[e], g1, I, H),
                                     job(m, lw->exp_up[e], g2, I, H)};
        kvd_linear_many(gx, gu, 2, n, H);
        kvd_swiglu(g1, g2, (size_t)n * I);
        linear(m, g1, lw->exp_down[e], m->ey + (size_t)a * H, n, H, I);
    }
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        int js[KVD_MAX_TOPK]; /* the row's slots, ascending expert */
        for (int j = 0; j < K; j++) {
            int k = j;
            for (; k > 0 && m->topi[r * K + js[k - 1]] > m->topi[r * K + j]; k--) js[k] = js[k - 1];
            js[k] = j;
        }
        float *dst = m->mix + (size_t)r * H;
        for (int d = 0; d < H; d++) dst[d] = 0.0f;
        for (int jj = 0; jj < K; jj++) {
            const int i = r * K + js[jj];
            const float wgt = m->topw[i], *y = m->ey + (size_t)m->slot_at[i] * H;
            for (int d = 0; d < H; d++) dst[d] += wgt * y[d];
        }
    }

    /* shared expert behind a sigmoid gate (its gate, up and gate logit
     * made beside the router) */
    if (Is > 0) {
        swiglu_rows(m->sh1, m->sh2, rows, Is);
        linear(m, m->sh1, lw->sh_down, m->gx, rows, H, Is);
#pragma omp parallel for schedule(static) if (rows >= PAR_ROWS)
        for (int r = 0; r < rows; r++) {
            float g = kvd_sigmoidf(m->shg[r]);
            for (int d = 0; d < H; d++) m->mix[(size_t)r * H + d] += g * m->gx[(size_t)r * H + d];
        }
    }
}

/* ---- the layer loop ---- */

static int check_finite(const kvd_model *m, const float *x, int rows, int layer, const char *where,
                        char *err) {
    const int H = m->c.hidden_size;
    size_t first = SIZE_MAX; /* the first non-finite value's index */
#pragma omp parallel for schedule(static) reduction(min : first) if (rows >= PAR_ROWS)
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < H; d++)
            if (!isfinite(x[(size_t)r * H + d])) {
                first = first < (size_t)r * H + d ? first : (size_t)r * H + d;
                break;
            }
    if (first == SIZE_MAX) return 0;
    const int r = (int)(first / (size_t)H), d = (int)(first % (size_t)H);
    snprintf(err, KVD_ERR_LEN,
             "non-finite activation (%g) in %s of layer %d (%s) at sequence %d, "
             "position %d, hidden dim %d",
             x[first], where, layer,
             m->c.layer_types[layer] == KVD_LAYER_FULL ? "full_attention" : "linear_attention",
             m->row_seq[r], m->pos[r], d);
    return -1;
}

int kvd_batch_rows(const kvd_config *c, kvd_kvcache *kv, const kvd_batch *b, int max_rows,
                   int max_seqs, int *pos, int *row_seq, char *err) {
    const int V = c->vocab_size;
    int rows = 0;
    for (int s = 0; s < b->n; s++) rows += b->n_tok[s];
    if (rows > max_rows) {
        snprintf(err, KVD_ERR_LEN, "forward: %d tokens in one step, expected at most %d", rows,
                 max_rows);
        return -1;
    }
    /* positions continue each sequence; make room in the cache first */
    int r = 0;
    for (int s = 0; s < b->n; s++) {
        int seq = b->seq[s];
        for (int t = 0; t < s; t++)
            if (b->seq[t] == seq) {
                snprintf(err, KVD_ERR_LEN, "forward: sequence %d appears twice in one step", seq);
                return -1;
            }
        if (seq < 0 || seq >= max_seqs || seq >= kv->n_seqs || !kv->seqs[seq].live) {
            snprintf(err, KVD_ERR_LEN, "forward: sequence %d is not live in the KV cache", seq);
            return -1;
        }
        int start = kv->seqs[seq].len;
        if (start + b->n_tok[s] > c->max_position_embeddings) {
            snprintf(err, KVD_ERR_LEN,
                     "forward: sequence %d would reach position %d, beyond "
                     "max_position_embeddings %d",
                     seq, start + b->n_tok[s], c->max_position_embeddings);
            return -1;
        }
        if (kvd_kvcache_reserve(kv, seq, start + b->n_tok[s])) {
            snprintf(err, KVD_ERR_LEN,
                     "forward: KV cache out of blocks for sequence %d at %d tokens (pool of %d "
                     "blocks x %d tokens)",
                     seq, start + b->n_tok[s], kv->n_blocks, kv->block_size);
            return -1;
        }
        for (int t = 0; t < b->n_tok[s]; t++, r++) {
            pos[r] = start + t;
            row_seq[r] = seq;
            int32_t tok = b->tok[r];
            if (tok < 0 || tok >= V) {
                snprintf(err, KVD_ERR_LEN,
                         "forward: token id %d at sequence %d position %d, expected 0..%d", tok,
                         seq, start + t, V - 1);
                return -1;
            }
        }
    }
    return rows;
}

int kvd_reference_rows(int ref_rows, const int *ref_pos, int rows, const int *pos, char *err) {
    int bad = ref_rows == rows ? -1 : 0;
    for (int r = 0; r < rows && r < ref_rows && bad < 0; r++)
        if (ref_pos[r] != pos[r]) bad = r;
    if (bad < 0) return 0;
    snprintf(err, KVD_ERR_LEN,
             "reference model: its last step had %d rows, this one %d (row %d at position %d, "
             "expected the same rows at the same positions)",
             ref_rows, rows, bad, bad < ref_rows ? ref_pos[bad] : -1);
    return -1;
}

int kvd_forward(kvd_model *m, kvd_kvcache *kv, const kvd_batch *b, float *logits, int last_only,
                char *err) {
    const kvd_config *c = &m->c;
    const int H = c->hidden_size, V = c->vocab_size;
    int rows = kvd_batch_rows(c, kv, b, m->max_rows, m->max_seqs, m->pos, m->row_seq, err), r;
    if (rows < 0) return -1;
    const size_t n = (size_t)rows * H;
    if (m->ref && (m->hooks.attn_cmp || m->hooks.hidden_cmp || m->hooks.logits_cmp || m->shadow) &&
        kvd_reference_rows(m->ref->held_rows, m->ref->pos, rows, m->pos, err))
        return -1;
    if (m->held) {
        m->held_rows = rows, m->held_logits_rows = 0;
        memcpy(m->held_tok, b->tok, sizeof(int32_t) * (size_t)rows);
    }

    /* embed, or the reference's residual stream past the shared layers */
    const int l0 = shared_prefix(m, b, rows, err);
    if (l0 < 0) return -1;
    for (r = 0; r < rows && !l0; r++)
        memcpy(m->x + (size_t)r * H, m->w->embed + (size_t)b->tok[r] * H, sizeof(float) * H);

    for (int l = l0; l < c->num_hidden_layers; l++) {
        const kvd_layer_weights *lw = &m->w->layers[l];
        /* token mixer: h = x + mixer(input_layernorm(x)) */
        norm_rows(m->xn, m->x, lw->input_norm, rows, H, (float)c->rms_norm_eps);
        if (c->layer_types[l] == KVD_LAYER_FULL) {
            if (attention(m, l, kv, rows, err)) return -1;
        } else {
            deltanet(m, l, b, rows);
        }
        if (check_finite(m, m->mix, rows, l, "the token mixer output", err)) return -1;
        add_rows(m->x, m->mix, rows, H);

        /* feed-forward: out = h + moe(post_attention_layernorm(h)) */
        norm_rows(m->xn, m->x, lw->post_norm, rows, H, (float)c->rms_norm_eps);
        moe(m, l, b, rows);
        add_rows(m->x, m->mix, rows, H);
        if (check_finite(m, m->x, rows, l, "the residual stream", err)) return -1;
        if (m->hooks.hidden) m->hooks.hidden(m->hooks.ctx, l, b, m->pos, m->x);
        if (m->held_x) memcpy(m->held_x + (size_t)l * m->max_rows * H, m->x, sizeof(float) * n);
        if (m->ref && m->hooks.hidden_cmp) {
            const float *a = m->ref->held_x + (size_t)l * m->ref->max_rows * H;
#pragma omp parallel for schedule(static)
            for (int i = 0; i < rows; i++)
                kvd_hidden_compare(a + (size_t)i * H, m->x + (size_t)i * H, 1, H, m->hcmp + i);
            m->hooks.hidden_cmp(m->hooks.ctx, l, b, m->pos, m->hcmp);
        }
    }

    if (!logits) return 0;
    norm_rows(m->xn, m->x, m->w->final_norm, rows, H, (float)c->rms_norm_eps);
    /* every row's logits where the caller, a reference's keeping or a
     * comparison wants them; with last_only, each sequence's last row's then
     * goes back */
    const int cmp = m->ref && m->hooks.logits_cmp;
    if (!last_only || cmp || m->held_logits) {
        float *all = !last_only ? logits : m->held_logits ? m->held_logits : m->all_logits;
        linear(m, m->xn, m->w->lm_head, all, rows, V, H);
        if (m->held_logits) {
            if (all != m->held_logits)
                memcpy(m->held_logits, all, sizeof(float) * (size_t)rows * V);
            m->held_logits_rows = rows;
        }
        if (cmp) {
            if (m->ref->held_logits_rows != rows) {
                snprintf(err, KVD_ERR_LEN,
                         "reference model: its last step gave no logits for these %d rows", rows);
                return -1;
            }
            kvd_batch_targets(b, m->targets);
#pragma omp parallel for schedule(dynamic, 8)
            for (int i = 0; i < rows; i++)
                m->lcmp[i] = kvd_compare_logits(m->ref->held_logits + (size_t)i * V,
                                                all + (size_t)i * V, V, m->targets[i]);
            m->hooks.logits_cmp(m->hooks.ctx, b, m->pos, m->lcmp);
        }
        for (int s = 0, last = -1; last_only && s < b->n; s++) {
            last += b->n_tok[s];
            memcpy(logits + (size_t)s * V, all + (size_t)last * V, sizeof(float) * V);
        }
    } else {
        int last = -1;
        for (int s = 0; s < b->n; s++) {
            last += b->n_tok[s];
            linear(m, m->xn + (size_t)last * H, m->w->lm_head, logits + (size_t)s * V, 1, V, H);
        }
    }
    return 0;
}

void kvd_batch_targets(const kvd_batch *b, int *target) {
    for (int s = 0, r = 0; s < b->n; s++)
        for (int t = 0; t < b->n_tok[s]; t++, r++)
            target[r] = t + 1 < b->n_tok[s] ? b->tok[r + 1] : -1;
}

int kvd_prefill_steps(kvd_step_fn step, void *model, int max_rows, int vocab, kvd_kvcache *kv,
                      int seq, const int32_t *tok, int n, float *logits, int all_logits,
                      char *err) {
    for (int i = 0; i < n; i += max_rows) {
        int nt = n - i < max_rows ? n - i : max_rows;
        kvd_batch b = {1, &seq, &nt, tok + i};
        float *lg = NULL;
        int last_only = 0;
        if (logits && all_logits) {
            lg = logits + (size_t)i * vocab;
        } else if (logits && i + nt == n) {
            lg = logits;
            last_only = 1;
        }
        if (step(model, kv, &b, lg, last_only, err)) return -1;
    }
    return 0;
}

static int cpu_step(void *m, kvd_kvcache *kv, const kvd_batch *b, float *logits, int last_only,
                    char *err) {
    return kvd_forward(m, kv, b, logits, last_only, err);
}

int kvd_prefill(kvd_model *m, kvd_kvcache *kv, int seq, const int32_t *tok, int n, float *logits,
                int all_logits, char *err) {
    return kvd_prefill_steps(cpu_step, m, m->max_rows, m->c.vocab_size, kv, seq, tok, n, logits,
                             all_logits, err);
}
