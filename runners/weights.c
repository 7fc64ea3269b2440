/* kvdrift: tensor registry and synthetic weights. Every value is a pure
 * function of (seed, tensor name, element index), rounded to BF16, so any
 * back end, thread count or machine builds the same model. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE, madvise */
#include "weights.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../kernels/fp8.h"
#include "../kernels/kernels.h"

/* ---- counter-based generator ---- */

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t kvd_rng_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the name */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed + 0x9e3779b97f4a7c15ull));
}

float kvd_rng_uniform(uint64_t key, uint64_t i) {
    uint64_t r = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    return (float)(((r >> 40) + 0.5) * (1.0 / 16777216.0)); /* (0, 1) */
}

float kvd_rng_normal(uint64_t key, uint64_t i) {
    uint64_t r = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    double u1 = ((double)(r >> 32) + 0.5) * (1.0 / 4294967296.0);
    double u2 = ((double)(r & 0xffffffffu) + 0.5) * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void kvd_synth_defaults(kvd_synth *s) {
    memset(s, 0, sizeof *s);
    s->seed = 1234;
    s->k_outlier_channels = 4;
    s->k_outlier_scale = 320.0f;
    s->k_rms = 1.5f;
    s->v_rms = 0.005f;
    s->layer_spread = 0.7f;
    s->sink_strength = 3.5f;
    s->retrieval_strength = 1.5f;
}

/* ---- registry ---- */

typedef struct {
    kvd_tensor *t;
    int n, cap;
} reg;

static void add(reg *r, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        r->t = realloc(r->t, (size_t)r->cap * sizeof *r->t);
    }
    kvd_tensor *t = &r->t[r->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    t->shape[2] = c;
    t->numel = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);
}

static void plan(reg *r, const kvd_config *c) {
    char nm[96];
    int64_t H = c->hidden_size, hd = c->head_dim;
    add(r, "model.embed_tokens.weight", 2, c->vocab_size, H, 0);
    for (int i = 0; i < c->num_hidden_layers; i++) {
#define L(fmt) (snprintf(nm, sizeof nm, "model.layers.%d." fmt, i), nm)
        add(r, L("input_layernorm.weight"), 1, H, 0, 0);
        add(r, L("post_attention_layernorm.weight"), 1, H, 0, 0);
        if (c->layer_types[i] == KVD_LAYER_FULL) {
            add(r, L("self_attn.q_proj.weight"), 2, c->num_attention_heads * hd * 2, H, 0);
            add(r, L("self_attn.k_proj.weight"), 2, c->num_key_value_heads * hd, H, 0);
            add(r, L("self_attn.v_proj.weight"), 2, c->num_key_value_heads * hd, H, 0);
            add(r, L("self_attn.o_proj.weight"), 2, H, c->num_attention_heads * hd, 0);
            add(r, L("self_attn.q_norm.weight"), 1, hd, 0, 0);
            add(r, L("self_attn.k_norm.weight"), 1, hd, 0, 0);
        } else {
            int64_t kd = kvd_key_dim(c), vd = kvd_value_dim(c), nv = c->linear_num_value_heads;
            add(r, L("linear_attn.in_proj_qkvz.weight"), 2, 2 * kd + 2 * vd, H, 0);
            add(r, L("linear_attn.in_proj_ba.weight"), 2, 2 * nv, H, 0);
            add(r, L("linear_attn.conv1d.weight"), 3, kvd_conv_dim(c), 1,
                c->linear_conv_kernel_dim);
            add(r, L("linear_attn.A_log"), 1, nv, 0, 0);
            add(r, L("linear_attn.dt_bias"), 1, nv, 0, 0);
            add(r, L("linear_attn.norm.weight"), 1, c->linear_value_head_dim, 0, 0);
            add(r, L("linear_attn.out_proj.weight"), 2, H, vd, 0);
        }
        if (c->num_experts > 0) {
            int64_t I = c->moe_intermediate_size, Is = c->shared_expert_intermediate_size;
            add(r, L("mlp.gate.weight"), 2, c->num_experts, H, 0);
            for (int e = 0; e < c->num_experts; e++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e);
                add(r, nm, 2, I, H, 0);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.up_proj.weight", i, e);
                add(r, nm, 2, I, H, 0);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e);
                add(r, nm, 2, H, I, 0);
            }
            if (Is > 0) {
                add(r, L("mlp.shared_expert.gate_proj.weight"), 2, Is, H, 0);
                add(r, L("mlp.shared_expert.up_proj.weight"), 2, Is, H, 0);
                add(r, L("mlp.shared_expert.down_proj.weight"), 2, H, Is, 0);
                add(r, L("mlp.shared_expert_gate.weight"), 2, 1, H, 0);
            }
        } else {
            add(r, L("mlp.gate_proj.weight"), 2, c->intermediate_size, H, 0);
            add(r, L("mlp.up_proj.weight"), 2, c->intermediate_size, H, 0);
            add(r, L("mlp.down_proj.weight"), 2, H, c->intermediate_size, 0);
        }
#undef L
    }
    add(r, "model.norm.weight", 1, H, 0, 0);
    if (!c->tie_word_embeddings) add(r, "lm_head.weight", 2, c->vocab_size, H, 0);
}

const kvd_tensor *kvd_weights_find(const kvd_weights *w, const char *name) {
    /* binary search over the name order made with the plan: binding a
     * 512-expert model looks up ~10^5 names */
    int lo = 0, hi = w->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, d = strcmp(w->by_name[mid]->name, name);
        if (!d) return w->by_name[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static const float *need(const kvd_weights *w, const char *name) {
    const kvd_tensor *t = kvd_weights_find(w, name);
    return t ? t->data : NULL;
}

/* ---- the matrices' AMX tiles ----
 * Every 2-D tensor, by address; its tiles made on its first GEMM, under one
 * lock, and read without it once made. Laid out once, W's tiles cost half
 * its FP32 bytes again, save laying out its chunks on every prefill GEMM,
 * and let decode's GEMMs stream BF16 (half the bytes) on the tiles. */
typedef struct {
    const float *p;
    int64_t numel;
    kvd_wtiles *t;
    int made;
} tiles_entry;

struct kvd_weight_tiles {
    pthread_mutex_t lock;
    int n;
    tiles_entry *e; /* in address order */
};

/* (addresses as integers: the tensors are separate allocations, which C's
 * pointer order does not cover) */
static int cmp_entry(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)((const tiles_entry *)a)->p,
                    y = (uintptr_t)((const tiles_entry *)b)->p;
    return x < y ? -1 : x > y;
}

static void tiles_free(struct kvd_weight_tiles *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) kvd_wtiles_free(c->e[i].t);
    pthread_mutex_destroy(&c->lock);
    free(c->e);
    free(c);
}

/* the registry's 2-D tensors (NULL, and no tiles ever, where that fails) */
static struct kvd_weight_tiles *tiles_plan(const kvd_weights *w) {
    struct kvd_weight_tiles *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->e = calloc((size_t)(w->n_tensors ? w->n_tensors : 1), sizeof *c->e);
    if (!c->e || pthread_mutex_init(&c->lock, NULL)) {
        free(c->e), free(c);
        return NULL;
    }
    for (int i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].ndim == 2 && w->tensors[i].data)
            c->e[c->n++] = (tiles_entry){w->tensors[i].data, w->tensors[i].numel, NULL, 0};
    qsort(c->e, (size_t)c->n, sizeof *c->e, cmp_entry);
    return c;
}

const kvd_wtiles *kvd_weights_tiles(const kvd_weights *w, const float *p, int N, int K) {
    struct kvd_weight_tiles *c = w ? w->tiles : NULL;
    if (!c) return NULL;
    int lo = 0, hi = c->n - 1;
    tiles_entry *e = NULL;
    while (lo <= hi && !e) {
        const int mid = lo + (hi - lo) / 2;
        if (c->e[mid].p == p)
            e = &c->e[mid];
        else if ((uintptr_t)c->e[mid].p < (uintptr_t)p)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    if (!e || e->numel != (int64_t)N * K) return NULL;
    if (__atomic_load_n(&e->made, __ATOMIC_ACQUIRE)) return e->t;
    pthread_mutex_lock(&c->lock);
    if (!e->made) {
        e->t = kvd_wtiles_new(p, N, K);
        __atomic_store_n(&e->made, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&c->lock);
    return e->t;
}

void kvd_weights_bind(kvd_weights *w) {
    const kvd_config *c = &w->cfg;
    char nm[128];
    int E = c->num_experts > 0 ? c->num_experts : 0;
    w->expert_ptrs =
        calloc((size_t)c->num_hidden_layers * 3 * (size_t)(E ? E : 1), sizeof(float *));
    tiles_free(w->tiles);
    w->tiles = w->lazy_base ? NULL : tiles_plan(w);
    w->embed = need(w, "model.embed_tokens.weight");
    w->final_norm = need(w, "model.norm.weight");
    w->lm_head = c->tie_word_embeddings ? w->embed : need(w, "lm_head.weight");
    for (int i = 0; i < c->num_hidden_layers; i++) {
        kvd_layer_weights *l = &w->layers[i];
        memset(l, 0, sizeof *l);
#define G(fmt) (snprintf(nm, sizeof nm, "model.layers.%d." fmt, i), need(w, nm))
        l->input_norm = G("input_layernorm.weight");
        l->post_norm = G("post_attention_layernorm.weight");
        l->q_proj = G("self_attn.q_proj.weight");
        l->k_proj = G("self_attn.k_proj.weight");
        l->v_proj = G("self_attn.v_proj.weight");
        l->o_proj = G("self_attn.o_proj.weight");
        l->q_norm = G("self_attn.q_norm.weight");
        l->k_norm = G("self_attn.k_norm.weight");
        l->in_proj_qkvz = G("linear_attn.in_proj_qkvz.weight");
        l->in_proj_ba = G("linear_attn.in_proj_ba.weight");
        l->conv1d = G("linear_attn.conv1d.weight");
        l->A_log = G("linear_attn.A_log");
        l->dt_bias = G("linear_attn.dt_bias");
        l->gdn_norm = G("linear_attn.norm.weight");
        l->out_proj = G("linear_attn.out_proj.weight");
        l->router = G("mlp.gate.weight");
        l->sh_gate = G("mlp.shared_expert.gate_proj.weight");
        l->sh_up = G("mlp.shared_expert.up_proj.weight");
        l->sh_down = G("mlp.shared_expert.down_proj.weight");
        l->sh_expert_gate = G("mlp.shared_expert_gate.weight");
        l->dense_gate = G("mlp.gate_proj.weight");
        l->dense_up = G("mlp.up_proj.weight");
        l->dense_down = G("mlp.down_proj.weight");
#undef G
        if (E) {
            const float **base = w->expert_ptrs + (size_t)i * 3 * (size_t)E;
            l->exp_gate = base;
            l->exp_up = base + E;
            l->exp_down = base + 2 * E;
            for (int e = 0; e < E; e++) {
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.gate_proj.weight", i, e);
                l->exp_gate[e] = need(w, nm);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.up_proj.weight", i, e);
                l->exp_up[e] = need(w, nm);
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.down_proj.weight", i, e);
                l->exp_down[e] = need(w, nm);
            }
        }
    }
}

/* ---- synthetic fill ---- */

/* Per-layer multiplier exp(spread * u), u uniform in [-1, 1] from the layer. */
static float layer_factor(const kvd_synth *s, const char *what, int layer) {
    char nm[64];
    snprintf(nm, sizeof nm, "kvdrift.layer.%s", what);
    float u = 2.0f * kvd_rng_uniform(kvd_rng_key(s->seed, nm), (uint64_t)layer) - 1.0f;
    return expf(s->layer_spread * u);
}

/* Is dim d of a head one of this layer's key outlier channels? Outliers sit in
 * the non-rotary dims, never the last one (the sink channel). */
static int is_outlier(const kvd_config *c, const kvd_synth *s, int layer, int d) {
    int rot = kvd_rot_dim(c), hd = c->head_dim, span = hd - 1 - rot;
    if (d < rot || d >= hd - 1 || span <= 0) return 0;
    uint64_t key = kvd_rng_key(s->seed + (uint64_t)layer, "kvdrift.k_outliers");
    int n = s->k_outlier_channels < span ? s->k_outlier_channels : span;
    for (int j = 0; j < n; j++) {
        /* distinct channels: step a stride co-prime with span from a random start */
        int start = (int)(kvd_rng_uniform(key, 0) * span);
        if (rot + (start + j * 7) % span == d) return 1;
    }
    return 0;
}

/* the tensor drawn whole from N(0, std^2), or (s->uniform_draws) from the
 * uniform law of the same deviation, +-sqrt(3) std */
static void fill_normal(kvd_tensor *t, const kvd_synth *s, uint64_t key, float std) {
    float *x = t->data;
    if (s->uniform_draws) {
        const float half = 1.7320508f * std;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < t->numel; i++)
            x[i] = half * (2.0f * (float)kvd_rng_uniform(key, (uint64_t)i) - 1.0f);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < t->numel; i++) x[i] = std * kvd_rng_normal(key, (uint64_t)i);
}

static void fill(kvd_tensor *t, const kvd_config *c, const kvd_synth *s) {
    uint64_t key = kvd_rng_key(s->seed, t->name);
    const char *nm = t->name;
    int layer = -1;
    sscanf(nm, "model.layers.%d.", &layer);
    float H = (float)c->hidden_size;
    int hd = c->head_dim, rot = kvd_rot_dim(c);
    float *x = t->data;
    float kmag = layer >= 0 ? (s->layer_k_scale[layer] > 0
                                   ? s->layer_k_scale[layer]
                                   : s->k_outlier_scale * layer_factor(s, "k", layer))
                            : 0;
    float vrms = layer >= 0 ? (s->layer_v_rms[layer] > 0 ? s->layer_v_rms[layer]
                                                         : s->v_rms * layer_factor(s, "v", layer))
                            : 0;

#define ENDS(suf) (strlen(nm) >= strlen(suf) && strcmp(nm + strlen(nm) - strlen(suf), suf) == 0)
    if (strcmp(nm, "model.embed_tokens.weight") == 0) {
        fill_normal(t, s, key, 1.0f);
        /* channel 0: a constant direction every token carries (the query side
         * of the sink); channel 1: present only in token 0 (the sink's key) */
        float c0 = 0.5f * sqrtf(H), c1 = 2.0f * sqrtf(H);
        for (int64_t v = 0; v < t->shape[0]; v++) {
            x[v * t->shape[1] + 0] = c0;
            x[v * t->shape[1] + 1] = v == 0 ? c1 : 0.0f;
        }
    } else if (ENDS("layernorm.weight") || strcmp(nm, "model.norm.weight") == 0) {
        fill_normal(t, s, key, 0.05f); /* zero-centred: the norm applies 1 + w */
    } else if (ENDS("q_norm.weight")) {
        fill_normal(t, s, key, 0.1f);
        /* queries read the outlier channels at a gain of 12 / |K|: each such
         * channel moves a logit by about one unit (std), so what saturation
         * does to those keys reaches the attention distribution */
        for (int d = 0; d < hd; d++)
            if (is_outlier(c, s, layer, d)) x[d] = 12.0f / kmag - 1.0f;
    } else if (ENDS("k_norm.weight")) {
        float g = s->k_rms * layer_factor(s, "kg", layer);
        for (int d = 0; d < hd; d++) {
            x[d] = g * (1.0f + 0.1f * kvd_rng_normal(key, (uint64_t)d)) - 1.0f;
            if (is_outlier(c, s, layer, d))
                x[d] = kmag * (0.6f + 0.4f * kvd_rng_uniform(key, 1000u + (uint64_t)d)) - 1.0f;
        }
    } else if (ENDS("q_proj.weight") || ENDS("k_proj.weight")) {
        int is_q = ENDS("q_proj.weight");
        fill_normal(t, s, key, 1.0f / sqrtf(H));
        int kvh = c->num_key_value_heads, grp = c->num_attention_heads / kvh;
        int64_t Hn = t->shape[1];
        for (int h = 0; h < kvh; h++) {
            /* retrieval: the first query head of each group and its KV head
             * share a token-identity projection in the non-rotary dims */
            char rn[96];
            snprintf(rn, sizeof rn, "kvdrift.retrieval.%d.%d", layer, h);
            uint64_t rk = kvd_rng_key(s->seed, rn);
            int64_t row0 = is_q ? (int64_t)(h * grp) * 2 * hd : (int64_t)h * hd;
            for (int d = rot; d < hd - 1; d++)
                for (int64_t j = 2; j < Hn; j++)
                    x[(row0 + d) * Hn + j] += s->retrieval_strength / sqrtf(H) *
                                              kvd_rng_normal(rk, (uint64_t)(d * Hn + j));
            /* sink: every query reads the constant channel, token 0's key the
             * sink channel, both in the last (non-rotary) dim */
            if (is_q) {
                for (int j = 0; j < grp; j++)
                    x[((int64_t)(h * grp + j) * 2 * hd + hd - 1) * Hn + 0] +=
                        s->sink_strength * 0.8f;
            } else {
                x[(row0 + hd - 1) * Hn + 1] += s->sink_strength * 0.8f;
            }
        }
    } else if (ENDS("v_proj.weight")) {
        for (int h = 0; h < c->num_key_value_heads; h++) {
            float hs = expf(0.4f * (2.0f * kvd_rng_uniform(key, 1ull << 40 | (uint64_t)h) - 1.0f));
            int64_t n = (int64_t)hd * t->shape[1], off = (int64_t)h * n;
            for (int64_t i = 0; i < n; i++)
                x[off + i] = vrms * hs / sqrtf(H) * kvd_rng_normal(key, (uint64_t)(off + i));
        }
    } else if (ENDS("o_proj.weight")) {
        /* undo V's small magnitude so attention matters to the residual */
        fill_normal(t, s, key, 0.5f / (vrms * sqrtf((float)t->shape[1])));
    } else if (ENDS("conv1d.weight")) {
        int K = c->linear_conv_kernel_dim;
        fill_normal(t, s, key, 0.3f);
        for (int64_t ch = 0; ch < t->shape[0]; ch++) x[ch * K + K - 1] += 1.0f;
    } else if (ENDS("A_log")) {
        /* decay exp(g) per token mostly in 0.9 .. 0.999: memory of 10 to 1000 tokens */
        for (int64_t i = 0; i < t->numel; i++)
            x[i] = logf(0.002f + 0.15f * kvd_rng_uniform(key, (uint64_t)i));
    } else if (ENDS("dt_bias")) {
        fill_normal(t, s, key, 0.5f);
    } else if (ENDS("linear_attn.norm.weight")) {
        fill_normal(t, s, key, 0.1f);
        for (int64_t i = 0; i < t->numel; i++) x[i] += 1.0f; /* plain weight, ones-centred */
    } else if (ENDS("out_proj.weight") || ENDS("down_proj.weight")) {
        fill_normal(t, s, key, 0.7f / sqrtf((float)t->shape[1]));
    } else if (ENDS("mlp.gate.weight")) {
        fill_normal(t, s, key, 2.0f / sqrtf(H));
    } else if (strcmp(nm, "lm_head.weight") == 0) {
        fill_normal(t, s, key, 3.0f / sqrtf(H));
    } else {
        fill_normal(t, s, key, 1.0f / sqrtf((float)t->shape[t->ndim - 1]));
    }
#undef ENDS
    kvd_round_bf16(x, (size_t)t->numel);
}

void kvd_weights_fill(kvd_tensor *t, const kvd_config *cfg, const kvd_synth *s) {
    fill(t, cfg, s);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp((*(kvd_tensor *const *)a)->name, (*(kvd_tensor *const *)b)->name);
}

int kvd_weights_plan(kvd_weights *w, const kvd_config *cfg, char *err) {
    memset(w, 0, sizeof *w);
    if (kvd_config_validate(cfg, err)) return -1;
    w->cfg = *cfg;
    reg r = {0};
    plan(&r, cfg);
    w->tensors = r.t;
    w->n_tensors = r.n;
    w->by_name = malloc(sizeof *w->by_name * (size_t)(r.n ? r.n : 1));
    if (!w->by_name) {
        snprintf(err, KVD_ERR_LEN, "weights: out of memory");
        kvd_weights_free(w);
        return -1;
    }
    for (int i = 0; i < r.n; i++) w->by_name[i] = &w->tensors[i];
    qsort(w->by_name, (size_t)r.n, sizeof *w->by_name, cmp_name);
    return 0;
}

int kvd_weights_synth(kvd_weights *w, const kvd_config *cfg, const kvd_synth *s, char *err) {
    if (kvd_weights_plan(w, cfg, err)) return -1;
    for (int i = 0; i < w->n_tensors; i++) {
        kvd_tensor *t = &w->tensors[i];
        t->data = malloc((size_t)t->numel * sizeof(float));
        if (!t->data) {
            snprintf(err, KVD_ERR_LEN, "out of memory allocating %s (%lld values)", t->name,
                     (long long)t->numel);
            kvd_weights_free(w);
            return -1;
        }
        fill(t, cfg, s);
    }
    kvd_weights_bind(w);
    return 0;
}

void kvd_weights_free(kvd_weights *w) {
    if (w->lazy_base) {
        munmap(w->lazy_base, w->lazy_len);
        for (int i = 0; i < w->n_tensors; i++) w->tensors[i].data = NULL;
    }
    if (w->make_ctx_free) w->make_ctx_free(w->make_ctx);
    for (int i = 0; i < w->n_tensors; i++) free(w->tensors[i].data);
    free(w->tensors);
    free(w->by_name);
    free(w->expert_ptrs);
    tiles_free(w->tiles);
    memset(w, 0, sizeof *w);
}

/* ---- lazy weights ---- */

int kvd_weights_lazy(kvd_weights *w, const kvd_config *cfg,
                     int (*make)(void *ctx, const kvd_config *cfg, kvd_tensor *t, char *err),
                     void *ctx, void (*ctx_free)(void *ctx), char *err) {
    if (kvd_weights_plan(w, cfg, err)) {
        if (ctx_free) ctx_free(ctx);
        return -1;
    }
    w->make = make, w->make_ctx = ctx, w->make_ctx_free = ctx_free;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), total = 0;
    for (int i = 0; i < w->n_tensors; i++)
        total += ((size_t)w->tensors[i].numel * sizeof(float) + pg - 1) / pg * pg;
    total = total ? total : pg;
    /* address space for every tensor, memory only for the ones being made */
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        snprintf(err, KVD_ERR_LEN, "weights: cannot reserve %zu bytes of address space", total);
        kvd_weights_free(w);
        return -1;
    }
    w->lazy_base = base, w->lazy_len = total;
    size_t off = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        w->tensors[i].data = (float *)((char *)base + off);
        off += ((size_t)w->tensors[i].numel * sizeof(float) + pg - 1) / pg * pg;
    }
    kvd_weights_bind(w);
    return 0;
}

static int make_synth(void *ctx, const kvd_config *cfg, kvd_tensor *t, char *err) {
    (void)err;
    kvd_weights_fill(t, cfg, ctx);
    return 0;
}

int kvd_weights_lazy_synth(kvd_weights *w, const kvd_config *cfg, const kvd_synth *s, char *err) {
    kvd_synth *copy = malloc(sizeof *copy);
    if (!copy) {
        snprintf(err, KVD_ERR_LEN, "weights: out of memory");
        return -1;
    }
    *copy = *s;
    return kvd_weights_lazy(w, cfg, make_synth, copy, free, err);
}

kvd_tensor *kvd_weights_make(const kvd_weights *w, const void *p, int *rc, char *err) {
    *rc = 0;
    if (!w || !w->lazy_base) return NULL;
    /* the tensors lie in address order: the last one starting at or below p */
    int lo = 0, hi = w->n_tensors - 1, at = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if ((const void *)w->tensors[mid].data <= p)
            at = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    kvd_tensor *t = at >= 0 ? &w->tensors[at] : NULL;
    if (!t || (const float *)p >= t->data + t->numel) return NULL;
    if (w->make(w->make_ctx, &w->cfg, t, err)) {
        *rc = -1;
        kvd_weights_unmake(t);
        return NULL;
    }
    return t;
}

void kvd_weights_unmake(kvd_tensor *t) {
    if (!t) return;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), a = (size_t)(uintptr_t)t->data;
    size_t b = a + (size_t)t->numel * sizeof(float);
    a = (a + pg - 1) / pg * pg, b = (b + pg - 1) / pg * pg;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}
