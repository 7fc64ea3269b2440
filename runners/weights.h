/* kvdrift: the model's tensors, by their Hugging Face Qwen3-Next names, and
 * the synthetic generator that fills them as a pure function of (seed, name). */
#ifndef KVD_WEIGHTS_H
#define KVD_WEIGHTS_H

#include <stdint.h>

#include "config.h"

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[3];
    int64_t numel;
    float *data; /* BF16 values held as fp32 (exact) */
} kvd_tensor;

/* The activation statistics that decide how much FP8 loses. See
 * docs/synthetic-weights.md for the defaults and why they are what they are. */
typedef struct {
    uint64_t seed;
    int k_outlier_channels;   /* per layer, among the non-rotary dims of each head */
    float k_outlier_scale;    /* |K| gain of those channels (k_norm's 1 + w) */
    float k_rms;              /* gain of the ordinary key channels */
    float v_rms;              /* rms of V entries */
    float layer_spread;       /* per-layer K and V magnitudes vary by exp(+-spread) */
    float sink_strength;      /* how strongly every query attends to token 0 */
    float retrieval_strength; /* one head per KV group prefers earlier copies of its token */
    /* optional per-layer overrides (index: layer), 0 = use the knobs above */
    float layer_k_scale[KVD_MAX_LAYERS];
    float layer_v_rms[KVD_MAX_LAYERS];
    /* throughput benchmarks only: the bulk draws (every tensor drawn whole
     * from one law) are uniform with the same mean and deviation, about 10x
     * quicker to make than the normals; the values are then not the
     * standard synthetic model's (0: normal, the default) */
    int uniform_draws;
} kvd_synth;

void kvd_synth_defaults(kvd_synth *s);

typedef struct {
    /* gated full attention */
    const float *q_proj, *k_proj, *v_proj, *o_proj, *q_norm, *k_norm;
    /* Gated DeltaNet */
    const float *in_proj_qkvz, *in_proj_ba, *conv1d, *A_log, *dt_bias, *gdn_norm, *out_proj;
    /* feed-forward */
    const float *input_norm, *post_norm;
    const float *router;
    const float **exp_gate, **exp_up, **exp_down; /* [num_experts] */
    const float *sh_gate, *sh_up, *sh_down, *sh_expert_gate;
    const float *dense_gate, *dense_up, *dense_down;
} kvd_layer_weights;

typedef struct {
    kvd_config cfg;
    int n_tensors;
    kvd_tensor *tensors;
    kvd_tensor **by_name; /* the tensors in name order, for kvd_weights_find */
    const float *embed, *final_norm, *lm_head;
    kvd_layer_weights layers[KVD_MAX_LAYERS];
    const float **expert_ptrs; /* backing store of the per-layer expert arrays */
    /* lazy weights (kvd_weights_lazy): every tensor's data is reserved
     * address space with no memory behind it until make fills it, just
     * before a device upload reads it (kvd_weights_make); the upload gives
     * the pages back after (kvd_weights_unmake). A model too large for host
     * memory in FP32 needs only its largest tensor's. Only the device back
     * end takes them. */
    int (*make)(void *ctx, const kvd_config *cfg, kvd_tensor *t, char *err);
    void *make_ctx;
    void (*make_ctx_free)(void *ctx);
    void *lazy_base;
    size_t lazy_len;
    /* the matrices' AMX tiles, each made on its first use (kvd_weights_tiles) */
    struct kvd_weight_tiles *tiles;
} kvd_weights;

/* Allocate every tensor of cfg and fill it synthetically. */
int kvd_weights_synth(kvd_weights *w, const kvd_config *cfg, const kvd_synth *s, char *err);
void kvd_weights_free(kvd_weights *w);
/* The registry of cfg's tensors, names and shapes only (data NULL); after the
 * data is filled, bind points the per-layer pointers at it. */
int kvd_weights_plan(kvd_weights *w, const kvd_config *cfg, char *err);
void kvd_weights_bind(kvd_weights *w);
/* Fill one planned tensor (its data allocated) as kvd_weights_synth does. */
void kvd_weights_fill(kvd_tensor *t, const kvd_config *cfg, const kvd_synth *s);
const kvd_tensor *kvd_weights_find(const kvd_weights *w, const char *name);
/* The AMX tiles of the matrix [N][K] whose data starts at p (a tensor of
 * w's), made on the first call and kept until kvd_weights_free: what
 * kvd_linear_tiled takes. NULL where the CPU's GEMM kernels are not "amx",
 * p starts no tensor of N x K values, or w's data is lazy. Thread-safe. */
const struct kvd_wtiles *kvd_weights_tiles(const kvd_weights *w, const float *p, int N, int K);

/* Lazy weights of cfg made by make(ctx, ...) (ctx freed with ctx_free by
 * kvd_weights_free); the synthetic ones as kvd_weights_synth makes them. */
int kvd_weights_lazy(kvd_weights *w, const kvd_config *cfg,
                     int (*make)(void *ctx, const kvd_config *cfg, kvd_tensor *t, char *err),
                     void *ctx, void (*ctx_free)(void *ctx), char *err);
int kvd_weights_lazy_synth(kvd_weights *w, const kvd_config *cfg, const kvd_synth *s, char *err);
/* For lazy weights: the tensor whose data holds p, made (NULL: not lazy,
 * or p in no tensor; -1 in *rc with err when making it failed); and its
 * pages given back. */
kvd_tensor *kvd_weights_make(const kvd_weights *w, const void *p, int *rc, char *err);
void kvd_weights_unmake(kvd_tensor *t);

/* Deterministic standard normal for (key, index): the counter-based generator. */
float kvd_rng_normal(uint64_t key, uint64_t i);
float kvd_rng_uniform(uint64_t key, uint64_t i);
uint64_t kvd_rng_key(uint64_t seed, const char *name);

#endif
