/* kvdrift: presets, config.json loading (jansson) and shape validation. */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvd_err_prefix(char *err, const char *prefix) {
    size_t pl = strlen(prefix) + 2, el = strlen(err);
    if (pl >= KVD_ERR_LEN) return;
    if (el + pl >= KVD_ERR_LEN) el = KVD_ERR_LEN - pl - 1;
    memmove(err + pl, err, el);
    err[pl + el] = 0;
    memcpy(err, prefix, pl - 2);
    err[pl - 2] = ':';
    err[pl - 1] = ' ';
}

static void set_interval_types(kvd_config *c) {
    for (int i = 0; i < c->num_hidden_layers && i < KVD_MAX_LAYERS; i++)
        c->layer_types[i] =
            ((i + 1) % c->full_attention_interval == 0) ? KVD_LAYER_FULL : KVD_LAYER_LINEAR;
}

/* Qwen3NextConfig's own defaults (configuration_qwen3_next.py). */
static void hf_defaults(kvd_config *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "custom");
    c->hidden_size = 2048;
    c->num_hidden_layers = 48;
    c->full_attention_interval = 4;
    c->num_attention_heads = 16;
    c->num_key_value_heads = 2;
    c->head_dim = 256;
    c->partial_rotary_factor = 0.25;
    c->rope_theta = 10000.0;
    c->linear_num_key_heads = 16;
    c->linear_num_value_heads = 32;
    c->linear_key_head_dim = 128;
    c->linear_value_head_dim = 128;
    c->linear_conv_kernel_dim = 4;
    c->num_experts = 512;
    c->num_experts_per_tok = 10;
    c->moe_intermediate_size = 512;
    c->shared_expert_intermediate_size = 512;
    c->intermediate_size = 5632;
    c->norm_topk_prob = 1;
    c->vocab_size = 151936;
    c->rms_norm_eps = 1e-6;
    c->max_position_embeddings = 32768;
}

typedef struct {
    const char *name;
    int hidden, layers, heads, kv_heads, head_dim;
    int lk_heads, lv_heads, dk, dv;
    int experts, topk, moe_inter, shared_inter, vocab, max_pos;
    const char *note;
} preset;

static const preset presets[] = {
    {"tiny", 128, 8, 4, 2, 64, 2, 4, 32, 32, 8, 2, 64, 64, 512, 65536,
     "test-sized: every mechanism of Qwen3-Next at toy widths"},
    {"small", 1024, 8, 8, 2, 256, 4, 8, 128, 128, 16, 4, 256, 256, 16384, 262144,
     "CPU benchmark size: real head_dim 256 and DeltaNet head dims, narrow everywhere else"},
    {"qwen3-next-80b-a3b", 2048, 48, 16, 2, 256, 16, 32, 128, 128, 64, 10, 512, 512, 151936, 262144,
     "Qwen3-Next-80B-A3B shapes; num_experts 64 instead of 512 to fit one GPU"},
    {"qwen3.5-397b-a17b", 4096, 60, 32, 2, 256, 16, 64, 128, 128, 32, 10, 1024, 1024, 248320,
     262144,
     "Qwen3.5-397B-A17B shapes; num_experts 32 instead of 512 to fit one GPU; DeltaNet "
     "projections kept in the fused Qwen3-Next layout (in_proj_qkvz/in_proj_ba)"},
};

static const char *const preset_names[] = {"tiny", "small", "qwen3-next-80b-a3b",
                                           "qwen3.5-397b-a17b", NULL};

const char *const *kvd_config_preset_names(void) {
    return preset_names;
}

int kvd_config_preset(const char *name, kvd_config *c, char *err) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        const preset *p = &presets[i];
        if (strcmp(p->name, name) != 0) continue;
        hf_defaults(c);
        snprintf(c->name, sizeof c->name, "%s", p->name);
        c->hidden_size = p->hidden;
        c->num_hidden_layers = p->layers;
        c->num_attention_heads = p->heads;
        c->num_key_value_heads = p->kv_heads;
        c->head_dim = p->head_dim;
        c->rope_theta = 1e7;
        c->linear_num_key_heads = p->lk_heads;
        c->linear_num_value_heads = p->lv_heads;
        c->linear_key_head_dim = p->dk;
        c->linear_value_head_dim = p->dv;
        c->num_experts = p->experts;
        c->num_experts_per_tok = p->topk;
        c->moe_intermediate_size = p->moe_inter;
        c->shared_expert_intermediate_size = p->shared_inter;
        c->intermediate_size = p->moe_inter * 4;
        c->vocab_size = p->vocab;
        c->max_position_embeddings = p->max_pos;
        snprintf(c->note, sizeof c->note, "%s", p->note);
        set_interval_types(c);
        return 0;
    }
    snprintf(err, KVD_ERR_LEN,
             "unknown model preset '%s': expected one of tiny, small, qwen3-next-80b-a3b, "
             "qwen3.5-397b-a17b",
             name);
    return -1;
}

void kvd_config_layer_indices(const kvd_config *c, int *attn_index, int *lin_index, int *n_full,
                              int *n_lin) {
    *n_full = *n_lin = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        attn_index[l] = lin_index[l] = -1;
        if (c->layer_types[l] == KVD_LAYER_FULL) {
            attn_index[l] = (*n_full)++;
        } else {
            lin_index[l] = (*n_lin)++;
        }
    }
}

int kvd_config_n_full(const kvd_config *c) {
    int n = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n += c->layer_types[i] == KVD_LAYER_FULL;
    return n;
}

void kvd_decode_step_bytes(const kvd_config *c, int C, int ctx, double kv_bytes_per_token,
                           kvd_step_bytes *b) {
    const double H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    const double kvh = c->num_key_value_heads, kd = kvd_key_dim(c), vd = kvd_value_dim(c);
    const double nv = c->linear_num_value_heads, E = c->num_experts;
    const double k = c->num_experts_per_tok, I = c->moe_intermediate_size;
    const double Is = c->shared_expert_intermediate_size;
    double dense = 0, experts = 0, state = 0; /* elements, then bytes */
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_types[l] == KVD_LAYER_FULL) {
            dense += (2 * nh * hd + 2 * kvh * hd) * H + H * nh * hd; /* q + gate, k, v; o */
        } else {
            dense += (2 * kd + 2 * vd + 2 * nv) * H + H * vd; /* qkvz, ba; out */
            state += nv * c->linear_key_head_dim * c->linear_value_head_dim +
                     (double)kvd_conv_dim(c) * (c->linear_conv_kernel_dim - 1);
        }
        if (E > 0) {
            dense += E * H + (Is > 0 ? 3 * Is * H + H : 0); /* router; shared expert, its gate */
            experts += E * (1 - pow(1 - k / E, C)) * 3 * I * H;
        } else {
            dense += 3 * (double)c->intermediate_size * H;
        }
    }
    dense += (double)c->vocab_size * H + C * H; /* lm_head (or the tied embedding); C rows */
    b->dense = 2 * dense;
    b->experts = 2 * experts;
    b->cache = (double)C * ctx * kv_bytes_per_token;
    b->state = 2.0 * 4 * C * state;
}

/* ---- config.json ---- */

static int get_int(json_t *o, const char *path, const char *key, int *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) {
        snprintf(err, KVD_ERR_LEN, "%s: field '%s': expected an integer", path, key);
        return -1;
    }
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647) {
        snprintf(err, KVD_ERR_LEN, "%s: field '%s': value %lld out of range", path, key,
                 (long long)x);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int get_num(json_t *o, const char *path, const char *key, double *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        snprintf(err, KVD_ERR_LEN, "%s: field '%s': expected a number", path, key);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *path, const char *key, int *out, char *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        snprintf(err, KVD_ERR_LEN, "%s: field '%s': expected true or false", path, key);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

void kvd_json_text(const void *value, char *out, size_t n) {
    const json_t *v = value;
    if (json_is_string(v)) {
        snprintf(out, n, "%s", json_string_value(v));
    } else if (!v || json_is_null(v)) {
        snprintf(out, n, "none");
    } else {
        char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(9));
        snprintf(out, n, "%s", t ? t : "?");
        free(t);
    }
}

void *kvd_settings_parse(const char *text) {
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    if (json_is_object(j) && !json_object_get(j, "attn-fp8"))
        json_object_set_new(j, "attn-fp8", json_false());
    /* a cuda run from before the key had the heuristic's first choice */
    const char *be = json_string_value(json_object_get(j, "backend"));
    if (be && !strcmp(be, "cuda") && !json_object_get(j, "cuda-gemm"))
        json_object_set_new(j, "cuda-gemm", json_string("first"));
    return j;
}

void *kvd_json_load(const char *path, char *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root)
        snprintf(err, KVD_ERR_LEN, "%s: line %d, column %d: %s", path, je.line, je.column, je.text);
    return root;
}

/* The model families this reads, by model_type (the text model's, else the
 * top level's): Qwen3-Next and Qwen3.5 (MoE and dense). A field config.json
 * leaves out takes the default of that family's Hugging Face config class;
 * hf_defaults holds Qwen3-Next's, and these the Qwen3.5 classes' where they
 * differ (configuration_qwen3_5_moe.py, configuration_qwen3_5.py). A file
 * without model_type (a --config of one's own) reads as Qwen3-Next. */
static int family_defaults(json_t *root, json_t *o, const char *path, kvd_config *c, char *err) {
    const char *mt = json_string_value(json_object_get(o, "model_type"));
    if (!mt) mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt || !strcmp(mt, "qwen3_next")) return 0;
    if (!strcmp(mt, "qwen3_5_moe") || !strcmp(mt, "qwen3_5_moe_text")) {
        c->vocab_size = 248320;
        c->num_hidden_layers = 40;
        c->num_experts = 256;
        c->num_experts_per_tok = 8;
        return 0;
    }
    if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_text")) {
        c->vocab_size = 248320;
        c->hidden_size = 4096;
        c->intermediate_size = 12288;
        c->num_hidden_layers = 32;
        c->num_key_value_heads = 4;
        c->num_experts = 0; /* no such field: the feed-forward is dense */
        return 0;
    }
    snprintf(err, KVD_ERR_LEN,
             "%s: field 'model_type': expected qwen3_next, qwen3_5_moe or qwen3_5 (a hybrid "
             "Gated DeltaNet model), got \"%s\"",
             path, mt);
    return -1;
}

/* What kvdrift's model does not compute: refused by name rather than run as
 * something else. */
static int check_unsupported(json_t *o, const char *path, char *err) {
    json_t *v = json_object_get(o, "attention_bias");
    if (json_is_true(v)) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: field 'attention_bias': true is not supported (the attention projections "
                 "have no bias here)",
                 path);
        return -1;
    }
    const char *act = json_string_value(json_object_get(o, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) {
        snprintf(err, KVD_ERR_LEN, "%s: field 'hidden_act': expected \"silu\", got \"%s\"", path,
                 act);
        return -1;
    }
    json_t *rp = json_object_get(o, "rope_parameters");
    if (!json_is_object(rp)) rp = json_object_get(o, "rope_scaling");
    const char *rt = json_string_value(json_object_get(rp, "rope_type"));
    if (!rt) rt = json_string_value(json_object_get(rp, "type"));
    if (rt && strcmp(rt, "default") != 0) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: field 'rope_parameters.rope_type': \"%s\" is not supported (expected "
                 "\"default\": RoPE without scaling)",
                 path, rt);
        return -1;
    }
    return 0;
}

/* Qwen3-Next's mlp_only_layers and decoder_sparse_step choose dense layers in
 * a MoE model: none (kvdrift's default) or all (a dense model) are what the
 * model computes; a mix is refused. */
static int mlp_only_layers(json_t *o, const char *path, kvd_config *c, char *err) {
    int step = 1;
    if (get_int(o, path, "decoder_sparse_step", &step, err)) return -1;
    json_t *ml = json_object_get(o, "mlp_only_layers");
    size_t n = json_is_array(ml) ? json_array_size(ml) : 0;
    if (ml && !json_is_null(ml) && !json_is_array(ml)) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: field 'mlp_only_layers': expected an array of layer indices", path);
        return -1;
    }
    if (c->num_experts == 0 || (n == 0 && step == 1)) return 0;
    if (n == (size_t)c->num_hidden_layers) {
        c->num_experts = 0; /* every layer dense */
        return 0;
    }
    snprintf(err, KVD_ERR_LEN,
             "%s: fields 'mlp_only_layers' and 'decoder_sparse_step': dense layers among MoE "
             "ones are not supported (expected no dense layer or all of them)",
             path);
    return -1;
}

int kvd_config_load(const char *path, kvd_config *c, char *err) {
    json_t *root = kvd_json_load(path, err);
    if (!root) return -1;
    int rc = -1;
    json_t *o = root;
    if (!json_is_object(root)) {
        snprintf(err, KVD_ERR_LEN, "%s: expected a JSON object at the top level", path);
        goto out;
    }
    /* Qwen3.5 checkpoints nest the language model's fields in text_config */
    json_t *tc = json_object_get(root, "text_config");
    if (json_is_object(tc)) o = tc;

    hf_defaults(c);
    if (family_defaults(root, o, path, c, err)) goto out;
    if (check_unsupported(o, path, err)) goto out;
    const char *base = strrchr(path, '/');
    snprintf(c->name, sizeof c->name, "%s", base ? base + 1 : path);
    struct {
        const char *key;
        int *dst;
    } ints[] = {
        {"hidden_size", &c->hidden_size},
        {"num_hidden_layers", &c->num_hidden_layers},
        {"full_attention_interval", &c->full_attention_interval},
        {"num_attention_heads", &c->num_attention_heads},
        {"num_key_value_heads", &c->num_key_value_heads},
        {"head_dim", &c->head_dim},
        {"linear_num_key_heads", &c->linear_num_key_heads},
        {"linear_num_value_heads", &c->linear_num_value_heads},
        {"linear_key_head_dim", &c->linear_key_head_dim},
        {"linear_value_head_dim", &c->linear_value_head_dim},
        {"linear_conv_kernel_dim", &c->linear_conv_kernel_dim},
        {"num_experts", &c->num_experts},
        {"num_experts_per_tok", &c->num_experts_per_tok},
        {"moe_intermediate_size", &c->moe_intermediate_size},
        {"shared_expert_intermediate_size", &c->shared_expert_intermediate_size},
        {"intermediate_size", &c->intermediate_size},
        {"vocab_size", &c->vocab_size},
        {"max_position_embeddings", &c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (get_int(o, path, ints[i].key, ints[i].dst, err)) goto out;
    if (get_num(o, path, "rope_theta", &c->rope_theta, err)) goto out;
    if (get_num(o, path, "partial_rotary_factor", &c->partial_rotary_factor, err)) goto out;
    if (get_num(o, path, "rms_norm_eps", &c->rms_norm_eps, err)) goto out;
    if (get_bool(o, path, "norm_topk_prob", &c->norm_topk_prob, err)) goto out;
    /* a multimodal checkpoint says it at the top, a text-only one in place */
    if (get_bool(root, path, "tie_word_embeddings", &c->tie_word_embeddings, err)) goto out;
    if (o != root && get_bool(o, path, "tie_word_embeddings", &c->tie_word_embeddings, err))
        goto out;
    if (mlp_only_layers(o, path, c, err)) goto out;
    /* block-quantized FP8 weights (Qwen's and DeepSeek's FP8 checkpoints) */
    json_t *qc = json_object_get(root, "quantization_config");
    if (!json_is_object(qc) && o != root) qc = json_object_get(o, "quantization_config");
    json_t *wb = json_object_get(qc, "weight_block_size");
    if (wb && !json_is_null(wb)) {
        json_int_t b0 = json_integer_value(json_array_get(wb, 0)),
                   b1 = json_integer_value(json_array_get(wb, 1));
        if (!json_is_array(wb) || json_array_size(wb) != 2 || b0 <= 0 || b1 <= 0 || b0 > 65536 ||
            b1 > 65536) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: field 'quantization_config.weight_block_size': expected [rows, "
                     "columns], two positive integers",
                     path);
            goto out;
        }
        c->weight_block[0] = (int)b0, c->weight_block[1] = (int)b1;
    }
    /* newer transformers keep RoPE settings in rope_parameters */
    json_t *rp = json_object_get(o, "rope_parameters");
    if (json_is_object(rp)) {
        if (get_num(rp, path, "rope_theta", &c->rope_theta, err)) goto out;
        if (get_num(rp, path, "partial_rotary_factor", &c->partial_rotary_factor, err)) goto out;
    }
    if (c->num_hidden_layers > KVD_MAX_LAYERS || c->num_hidden_layers <= 0) {
        snprintf(err, KVD_ERR_LEN, "%s: field 'num_hidden_layers': expected 1..%d, got %d", path,
                 KVD_MAX_LAYERS, c->num_hidden_layers);
        goto out;
    }
    json_t *lt = json_object_get(o, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->num_hidden_layers) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: field 'layer_types': expected an array of %d strings (one per layer)",
                     path, c->num_hidden_layers);
            goto out;
        }
        for (int i = 0; i < c->num_hidden_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && strcmp(s, "linear_attention") == 0) {
                c->layer_types[i] = KVD_LAYER_LINEAR;
            } else if (s && strcmp(s, "full_attention") == 0) {
                c->layer_types[i] = KVD_LAYER_FULL;
            } else {
                snprintf(err, KVD_ERR_LEN,
                         "%s: field 'layer_types[%d]': expected \"linear_attention\" or "
                         "\"full_attention\", got %s%s%s",
                         path, i, s ? "\"" : "", s ? s : "a non-string", s ? "\"" : "");
                goto out;
            }
        }
    } else {
        if (c->full_attention_interval <= 0) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: field 'full_attention_interval': expected a positive integer, got %d",
                     path, c->full_attention_interval);
            goto out;
        }
        set_interval_types(c);
    }
    if (kvd_config_validate(c, err)) {
        kvd_err_prefix(err, path);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int kvd_config_validate(const kvd_config *c, char *err) {
    struct {
        const char *key;
        int v;
    } pos[] = {
        {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads},
        {"head_dim", c->head_dim},
        {"linear_num_key_heads", c->linear_num_key_heads},
        {"linear_num_value_heads", c->linear_num_value_heads},
        {"linear_key_head_dim", c->linear_key_head_dim},
        {"linear_value_head_dim", c->linear_value_head_dim},
        {"linear_conv_kernel_dim", c->linear_conv_kernel_dim},
        {"vocab_size", c->vocab_size},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        if (pos[i].v <= 0) {
            snprintf(err, KVD_ERR_LEN, "field '%s': expected a positive integer, got %d",
                     pos[i].key, pos[i].v);
            return -1;
        }
    }
    if (c->num_hidden_layers > KVD_MAX_LAYERS) {
        snprintf(err, KVD_ERR_LEN, "field 'num_hidden_layers': expected at most %d, got %d",
                 KVD_MAX_LAYERS, c->num_hidden_layers);
        return -1;
    }
    if (c->num_attention_heads % c->num_key_value_heads != 0) {
        snprintf(err, KVD_ERR_LEN,
                 "field 'num_key_value_heads': expected a divisor of num_attention_heads (%d), "
                 "got %d",
                 c->num_attention_heads, c->num_key_value_heads);
        return -1;
    }
    if (c->linear_num_value_heads % c->linear_num_key_heads != 0) {
        snprintf(err, KVD_ERR_LEN,
                 "field 'linear_num_key_heads': expected a divisor of linear_num_value_heads "
                 "(%d), got %d",
                 c->linear_num_value_heads, c->linear_num_key_heads);
        return -1;
    }
    if (!(c->partial_rotary_factor > 0.0 && c->partial_rotary_factor <= 1.0) ||
        kvd_rot_dim(c) < 2) {
        snprintf(err, KVD_ERR_LEN,
                 "field 'partial_rotary_factor': expected a value in (0, 1] giving at least 2 "
                 "rotary dims of head_dim %d, got %g",
                 c->head_dim, c->partial_rotary_factor);
        return -1;
    }
    if (!(c->rope_theta > 1.0)) {
        snprintf(err, KVD_ERR_LEN, "field 'rope_theta': expected a number above 1, got %g",
                 c->rope_theta);
        return -1;
    }
    if (!(c->rms_norm_eps > 0.0 && c->rms_norm_eps < 1.0)) {
        snprintf(err, KVD_ERR_LEN, "field 'rms_norm_eps': expected a value in (0, 1), got %g",
                 c->rms_norm_eps);
        return -1;
    }
    if (c->num_experts < 0) {
        snprintf(err, KVD_ERR_LEN, "field 'num_experts': expected 0 (dense) or more, got %d",
                 c->num_experts);
        return -1;
    }
    if (c->num_experts > 0) {
        if (c->num_experts_per_tok <= 0 || c->num_experts_per_tok > c->num_experts ||
            c->num_experts_per_tok > KVD_MAX_TOPK) {
            snprintf(err, KVD_ERR_LEN,
                     "field 'num_experts_per_tok': expected 1..min(num_experts=%d, %d), got %d",
                     c->num_experts, KVD_MAX_TOPK, c->num_experts_per_tok);
            return -1;
        }
        if (c->moe_intermediate_size <= 0) {
            snprintf(err, KVD_ERR_LEN,
                     "field 'moe_intermediate_size': expected a positive integer, got %d",
                     c->moe_intermediate_size);
            return -1;
        }
        if (c->shared_expert_intermediate_size < 0) {
            snprintf(err, KVD_ERR_LEN,
                     "field 'shared_expert_intermediate_size': expected 0 or more, got %d",
                     c->shared_expert_intermediate_size);
            return -1;
        }
    } else if (c->intermediate_size <= 0) {
        snprintf(err, KVD_ERR_LEN,
                 "field 'intermediate_size': expected a positive integer for a dense model, got "
                 "%d",
                 c->intermediate_size);
        return -1;
    }
    if (kvd_config_n_full(c) == 0) {
        snprintf(err, KVD_ERR_LEN,
                 "field 'layer_types': expected at least one full_attention layer (kvdrift "
                 "measures the KV cache, which only those layers have)");
        return -1;
    }
    return 0;
}

char *kvd_config_to_json(const kvd_config *c) {
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", "Qwen3NextForCausalLM"));
    json_object_set_new(o, "model_type", json_string("qwen3_next"));
    json_object_set_new(o, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(o, "attention_bias", json_false());
    json_object_set_new(o, "decoder_sparse_step", json_integer(1));
    json_t *mlp_only = json_array();
    if (c->num_experts == 0)
        for (int i = 0; i < c->num_hidden_layers; i++)
            json_array_append_new(mlp_only, json_integer(i));
    json_object_set_new(o, "mlp_only_layers", mlp_only);
    struct {
        const char *k;
        int v;
    } ints[] = {
        {"hidden_size", c->hidden_size},
        {"num_hidden_layers", c->num_hidden_layers},
        {"full_attention_interval", c->full_attention_interval},
        {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads},
        {"head_dim", c->head_dim},
        {"linear_num_key_heads", c->linear_num_key_heads},
        {"linear_num_value_heads", c->linear_num_value_heads},
        {"linear_key_head_dim", c->linear_key_head_dim},
        {"linear_value_head_dim", c->linear_value_head_dim},
        {"linear_conv_kernel_dim", c->linear_conv_kernel_dim},
        {"num_experts", c->num_experts},
        {"num_experts_per_tok", c->num_experts_per_tok},
        {"moe_intermediate_size", c->moe_intermediate_size},
        {"shared_expert_intermediate_size", c->shared_expert_intermediate_size},
        {"intermediate_size", c->intermediate_size},
        {"vocab_size", c->vocab_size},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        json_object_set_new(o, ints[i].k, json_integer(ints[i].v));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "partial_rotary_factor", json_real(c->partial_rotary_factor));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
    json_t *lt = json_array();
    for (int i = 0; i < c->num_hidden_layers; i++)
        json_array_append_new(lt, json_string(c->layer_types[i] == KVD_LAYER_FULL
                                                  ? "full_attention"
                                                  : "linear_attention"));
    json_object_set_new(o, "layer_types", lt);
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    return s;
}

/* The first size that n ranks cannot share (its name, its value in *val),
 * or NULL: attention heads, DeltaNet key heads, experts and the MLP's
 * columns must split evenly; KV heads split, or each is replicated on
 * n / kv_heads ranks. */
static const char *unsplit(const kvd_config *c, int n, int *val) {
    const int nh = c->num_attention_heads, kvh = c->num_key_value_heads;
    const int nk = c->linear_num_key_heads, E = c->num_experts;
    const int Is = c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : 0;
    if (nh % n) return *val = nh, "num_attention_heads";
    if (kvh % n && n % kvh) return *val = kvh, "num_key_value_heads";
    if (nk % n) return *val = nk, "linear_num_key_heads";
    if (E % n) return *val = E, "num_experts";
    if (Is % n) return *val = Is, "shared_expert_intermediate_size";
    if (E == 0 && c->intermediate_size % n) return *val = c->intermediate_size, "intermediate_size";
    return NULL;
}

int kvd_config_tp_check(const kvd_config *c, int n, int max_n, char *err) {
    int val = 0;
    const char *what = unsplit(c, n, &val);
    if (!what) return 0;
    char fits[64] = "";
    size_t len = 0;
    for (int k = 1; k <= max_n && len < sizeof fits - 4; k++) {
        int v;
        if (!unsplit(c, k, &v))
            len += (size_t)snprintf(fits + len, sizeof fits - len, "%s%d", len ? ", " : "", k);
    }
    snprintf(err, KVD_ERR_LEN,
             "--gpus %d: %s %d does not split into %d equal parts%s (this model splits over %s)", n,
             what, val, n,
             strcmp(what, "num_key_value_heads") ? "" : ", nor is it a divisor of the GPUs", fits);
    return -1;
}

int kvd_config_tp_kv_heads(const kvd_config *c, int n) {
    const int kvh = c->num_key_value_heads;
    return kvh % n == 0 ? kvh / n : 1;
}
