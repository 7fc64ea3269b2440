/* kvdrift: the hybrid model's configuration, with Hugging Face config.json
 * field names, its presets, and the checks that refuse impossible shapes. */
#ifndef KVD_CONFIG_H
#define KVD_CONFIG_H

#include <stddef.h>

#define KVD_MAX_LAYERS 256
#define KVD_MAX_TOPK 64 /* num_experts_per_tok at most */
#define KVD_ERR_LEN 512

typedef enum { KVD_LAYER_LINEAR = 0, KVD_LAYER_FULL = 1 } kvd_layer_type;

typedef struct {
    char name[64];
    int hidden_size;
    int num_hidden_layers;
    int full_attention_interval;
    kvd_layer_type layer_types[KVD_MAX_LAYERS];
    /* gated full attention */
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    double partial_rotary_factor;
    double rope_theta;
    /* Gated DeltaNet */
    int linear_num_key_heads;
    int linear_num_value_heads;
    int linear_key_head_dim;
    int linear_value_head_dim;
    int linear_conv_kernel_dim;
    /* feed-forward: sparse MoE, or dense SwiGLU when num_experts == 0 */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size;
    int intermediate_size;
    int norm_topk_prob;
    int vocab_size;
    int tie_word_embeddings; /* the output projection is the embedding's */
    double rms_norm_eps;
    int max_position_embeddings;
    /* FP8 weights' scale blocks (quantization_config.weight_block_size;
     * 0: none given, 128 x 128 assumed where block scales are found) */
    int weight_block[2];
    /* how this preset differs from the published model, for the reader */
    char note[256];
} kvd_config;

/* Fill cfg from a preset name ("tiny", "small", "qwen3-next-80b-a3b",
 * "qwen3.5-397b-a17b"). Returns 0, or -1 with err filled. */
int kvd_config_preset(const char *name, kvd_config *cfg, char *err);

/* Names of the presets, NULL-terminated. */
const char *const *kvd_config_preset_names(void);

/* Load a Hugging Face style config.json: Qwen3-Next (model_type qwen3_next,
 * or none), Qwen3.5 MoE or dense (qwen3_5_moe, qwen3_5; the text model's
 * fields in text_config). Unknown fields are ignored, missing ones take the
 * defaults of the family's HF config class. */
int kvd_config_load(const char *path, kvd_config *cfg, char *err);

/* Check the shapes; err names the first bad field and what was expected. */
int kvd_config_validate(const kvd_config *cfg, char *err);

/* Write cfg as a config.json a Hugging Face Qwen3-Next loader accepts. */
char *kvd_config_to_json(const kvd_config *cfg);

/* Parse a JSON file (a json_t *, to be json_decref'd); NULL with err naming
 * the file and, for bad JSON, the line and column. */
void *kvd_json_load(const char *path, char *err);

/* A JSON value (a const json_t *, NULL for none) as a reader should see it
 * in a message: a string without quotes, "none" for NULL or null, anything
 * else compact JSON; cut to n bytes. */
void kvd_json_text(const void *value, char *out, size_t n);

/* A results file's run_settings (JSON text) as a json_t *, NULL for bad
 * JSON: keys older files lack take the value those files ran with
 * ("attn-fp8" false; a cuda run's "cuda-gemm" "first"), so that two files
 * compare key by key. */
void *kvd_settings_parse(const char *text);

/* Put "prefix: " in front of the message in err (KVD_ERR_LEN bytes). */
void kvd_err_prefix(char *err, const char *prefix);

/* Derived sizes. */
int kvd_config_n_full(const kvd_config *cfg);

/* Tensor parallelism over n GPUs (run --gpus, plan --gpus): 0 when the
 * model splits over n (attention heads, DeltaNet key heads, experts and
 * the MLP evenly; KV heads evenly or each replicated on n / kv_heads
 * ranks), else -1 with err naming the first size that does not and the
 * counts up to max_n that work. kvd_config_tp_kv_heads: the KV heads each
 * rank holds (and caches) then. */
int kvd_config_tp_check(const kvd_config *c, int n, int max_n, char *err);
int kvd_config_tp_kv_heads(const kvd_config *c, int n);
/* What one decode step of C sequences at ctx tokens of context must move,
 * at the least, in bytes: every BF16 matrix it reads whole (projections,
 * routers, shared experts, lm_head; and C embedding rows), the routed
 * experts it reads (E (1 - (1 - k / E)^C) of them a layer, the expected
 * count when each row picks k of E uniformly), the C sequences' cache (ctx
 * tokens at kv_bytes_per_token each), and their DeltaNet and conv states
 * (FP32), read and written. The roofline a step's time is held against. */
typedef struct {
    double dense, experts, cache, state;
} kvd_step_bytes;
void kvd_decode_step_bytes(const kvd_config *c, int C, int ctx, double kv_bytes_per_token,
                           kvd_step_bytes *b);
/* Each layer's index among the full-attention layers (attn_index) or the
 * DeltaNet layers (lin_index), -1 in the other; the two counts. */
void kvd_config_layer_indices(const kvd_config *cfg, int *attn_index, int *lin_index, int *n_full,
                              int *n_lin);
static inline int kvd_rot_dim(const kvd_config *c) {
    return (int)(c->head_dim * c->partial_rotary_factor) / 2 * 2;
}
static inline int kvd_key_dim(const kvd_config *c) {
    return c->linear_num_key_heads * c->linear_key_head_dim;
}
static inline int kvd_value_dim(const kvd_config *c) {
    return c->linear_num_value_heads * c->linear_value_head_dim;
}
static inline int kvd_conv_dim(const kvd_config *c) {
    return 2 * kvd_key_dim(c) + kvd_value_dim(c);
}

#endif
