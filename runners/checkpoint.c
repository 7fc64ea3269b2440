/* kvdrift: checkpoints (see checkpoint.h). */
#include "checkpoint.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_reader.h"

static int same_shape(const kvd_tensor *t, const kvd_st_tensor *s) {
    if (t->ndim != s->ndim) return 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != s->shape[d]) return 0;
    return 1;
}

static void shape_str(char *b, size_t n, int nd, const int64_t *sh) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int d = 0; d < nd && k < n; d++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", d ? ", " : "", (long long)sh[d]);
    if (k < n) snprintf(b + k, n - k, "]");
}

/* Newer checkpoints fuse the experts: mlp.experts.gate_up_proj [E, 2I, H]
 * and mlp.experts.down_proj [E, H, I]. Slice expert e's matrix out. */
static int from_fused(const kvd_checkpoint *c, const kvd_tensor *t, char *err, int *done) {
    int layer, e;
    char which[32];
    *done = 0;
    if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%31[a-z_].weight", &layer, &e, which) != 3)
        return 0;
    char name[160];
    int gate = !strcmp(which, "gate_proj"), up = !strcmp(which, "up_proj");
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", layer,
             gate || up ? "gate_up_proj" : "down_proj");
    const kvd_st_tensor *s = kvd_checkpoint_find(c, name);
    if (!s) return 0;
    int64_t rows = t->shape[0], cols = t->shape[1];
    int64_t want1 = gate || up ? 2 * rows : rows;
    if (s->ndim != 3 || s->shape[0] <= e || s->shape[1] != want1 || s->shape[2] != cols) {
        char got[96];
        shape_str(got, sizeof got, s->ndim, s->shape);
        snprintf(err, KVD_ERR_LEN,
                 "%s: shape %s does not match the config (expected [E, %lld, %lld])", name, got,
                 (long long)want1, (long long)cols);
        return -1;
    }
    float *all = malloc(sizeof(float) * (size_t)s->numel);
    if (!all || kvd_st_to_f32(s, all, err)) {
        free(all);
        return -1;
    }
    size_t per = (size_t)(want1 * cols), off = (size_t)e * per + (up ? (size_t)(rows * cols) : 0);
    memcpy(t->data, all + off, sizeof(float) * (size_t)(rows * cols));
    free(all);
    *done = 1;
    return 0;
}

int kvd_weights_load(kvd_weights *w, const char *dir, char *err) {
    char path[4300];
    kvd_config cfg;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (kvd_config_load(path, &cfg, err)) return -1;
    const char *base = strrchr(dir, '/');
    snprintf(cfg.name, sizeof cfg.name, "%s", base && base[1] ? base + 1 : dir);
    if (kvd_weights_plan(w, &cfg, err)) return -1;
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) {
        kvd_weights_free(w);
        return -1;
    }
    int rc = -1;
    for (int i = 0; i < w->n_tensors; i++) {
        kvd_tensor *t = &w->tensors[i];
        t->data = malloc(sizeof(float) * (size_t)t->numel);
        if (!t->data) {
            snprintf(err, KVD_ERR_LEN, "%s: out of memory", t->name);
            goto out;
        }
        const kvd_st_tensor *s = kvd_checkpoint_find(&c, t->name);
        if (!s) {
            int done;
            if (from_fused(&c, t, err, &done)) goto out;
            if (done) continue;
            snprintf(err, KVD_ERR_LEN, "%s: tensor %s: missing (the config asks for it)", dir,
                     t->name);
            goto out;
        }
        if (!same_shape(t, s)) {
            char got[96], want[96];
            shape_str(got, sizeof got, s->ndim, s->shape);
            shape_str(want, sizeof want, t->ndim, t->shape);
            snprintf(err, KVD_ERR_LEN, "%s: tensor %s: shape %s, expected %s from config.json",
                     c.files[s->file].path, t->name, got, want);
            goto out;
        }
        if (kvd_st_to_f32(s, t->data, err)) {
            kvd_err_prefix(err, c.files[s->file].path);
            goto out;
        }
    }
    kvd_weights_bind(w);
    rc = 0;
out:
    kvd_checkpoint_close(&c);
    if (rc) kvd_weights_free(w);
    return rc;
}

/* The scale tensor of a full-attention layer under the names exporters use. */
static const kvd_st_tensor *find_scale(const kvd_checkpoint *c, int layer, int is_v) {
    static const char *const pat[2][2] = {
        {"model.layers.%d.self_attn.k_proj.k_scale", "model.layers.%d.self_attn.k_scale"},
        {"model.layers.%d.self_attn.v_proj.v_scale", "model.layers.%d.self_attn.v_scale"}};
    char name[160];
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, pat[is_v][k], layer);
        const kvd_st_tensor *t = kvd_checkpoint_find(c, name);
        if (t) return t;
    }
    return NULL;
}

int kvd_checkpoint_kv_scales(const char *dir, const kvd_config *cfg, kvd_kv_scales *s, int *found,
                             char *err) {
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    int nf = kvd_config_n_full(cfg), kvh = cfg->num_key_value_heads, al = 0, have = 0;
    kvd_kv_scales_init(s, nf, kvh);
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        const kvd_st_tensor *t[2] = {find_scale(&c, l, 0), find_scale(&c, l, 1)};
        int ok = t[0] && t[1];
        for (int v = 0; ok && v < 2; v++) {
            if (t[v]->numel != 1 && t[v]->numel != kvh) {
                snprintf(err, KVD_ERR_LEN, "%s: %s: %lld values, expected 1 or %d (per KV head)",
                         c.files[t[v]->file].path, t[v]->name, (long long)t[v]->numel, kvh);
                kvd_checkpoint_close(&c);
                kvd_kv_scales_free(s);
                return -1;
            }
            float buf[64];
            if (kvd_st_to_f32(t[v], buf, err)) {
                kvd_checkpoint_close(&c);
                kvd_kv_scales_free(s);
                return -1;
            }
            if (t[v]->numel > 1) s->per_head = 1;
            for (int h = 0; h < kvh; h++) {
                float x = buf[t[v]->numel > 1 ? h : 0];
                if (!(x > 0) || !isfinite(x)) {
                    snprintf(err, KVD_ERR_LEN, "%s: %s: expected positive finite scales, got %g",
                             c.files[t[v]->file].path, t[v]->name, x);
                    kvd_checkpoint_close(&c);
                    kvd_kv_scales_free(s);
                    return -1;
                }
                (v ? s->v : s->k)[al * kvh + h] = x;
            }
        }
        if (found) found[al] = ok;
        have += ok;
        al++;
    }
    kvd_checkpoint_close(&c);
    return have;
}

static void copy_str(char *dst, size_t n, json_t *v) {
    const char *s = json_string_value(v);
    snprintf(dst, n, "%s", s ? s : "");
}

int kvd_audit_dir(const char *dir, kvd_config *cfg, kvd_audit *a, char *err) {
    memset(a, 0, sizeof *a);
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (kvd_config_load(path, cfg, err)) return -1;
    snprintf(a->source, sizeof a->source, "none");
    snprintf(a->weight_algo, sizeof a->weight_algo, "none");
    snprintf(a->kv_algo, sizeof a->kv_algo, "none");
    /* ModelOpt: hf_quant_config.json {"producer": {...}, "quantization": {quant_algo,
     * kv_cache_quant_algo}} */
    snprintf(path, sizeof path, "%s/hf_quant_config.json", dir);
    if (access(path, F_OK) == 0) {
        json_t *q = kvd_json_load(path, err);
        if (!q) return -1;
        json_t *qq = json_object_get(q, "quantization");
        if (!json_is_object(qq)) {
            json_decref(q);
            snprintf(err, KVD_ERR_LEN, "%s: field 'quantization': expected an object", path);
            return -1;
        }
        snprintf(a->source, sizeof a->source, "hf_quant_config.json");
        copy_str(a->producer, sizeof a->producer,
                 json_object_get(json_object_get(q, "producer"), "name"));
        if (json_is_string(json_object_get(qq, "quant_algo")))
            copy_str(a->weight_algo, sizeof a->weight_algo, json_object_get(qq, "quant_algo"));
        if (json_is_string(json_object_get(qq, "kv_cache_quant_algo")))
            copy_str(a->kv_algo, sizeof a->kv_algo, json_object_get(qq, "kv_cache_quant_algo"));
        json_decref(q);
    } else {
        /* config.json's quantization_config (compressed-tensors, fp8, modelopt) */
        snprintf(path, sizeof path, "%s/config.json", dir);
        json_t *root = kvd_json_load(path, err);
        if (!root) return -1;
        json_t *qc = json_object_get(root, "quantization_config");
        if (json_is_object(qc)) {
            snprintf(a->source, sizeof a->source, "config.json:quantization_config");
            copy_str(a->producer, sizeof a->producer, json_object_get(qc, "quant_method"));
            json_t *wa = json_object_get(qc, "quant_algo");
            if (json_is_string(wa))
                copy_str(a->weight_algo, sizeof a->weight_algo, wa);
            else if (a->producer[0])
                snprintf(a->weight_algo, sizeof a->weight_algo, "%s", a->producer);
            json_t *ka = json_object_get(qc, "kv_cache_quant_algo");
            json_t *ks = json_object_get(qc, "kv_cache_scheme");
            if (json_is_string(ka)) {
                copy_str(a->kv_algo, sizeof a->kv_algo, ka);
            } else if (json_is_object(ks)) {
                int bits = (int)json_integer_value(json_object_get(ks, "num_bits"));
                const char *ty = json_string_value(json_object_get(ks, "type"));
                snprintf(a->kv_algo, sizeof a->kv_algo, "%s",
                         bits == 8 && ty && !strcmp(ty, "float") ? "FP8" : "other");
            }
        }
        json_decref(root);
    }
    /* scales and weight dtypes from the safetensors headers */
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    a->weights_loadable = 1;
    for (int i = 0; i < c.n; i++) {
        const kvd_st_tensor *t = &c.t[i];
        int is_weight = strstr(t->name, ".weight") != NULL;
        if (is_weight && t->dtype != KVD_ST_BF16 && t->dtype != KVD_ST_F16 &&
            t->dtype != KVD_ST_F32) {
            if (a->weights_loadable)
                snprintf(a->unloadable, sizeof a->unloadable, "%s (%s)", t->name,
                         kvd_st_dtype_name(t->dtype));
            a->weights_loadable = 0;
        }
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        a->n_attn++;
        const kvd_st_tensor *k = find_scale(&c, l, 0), *v = find_scale(&c, l, 1);
        if (k && v) {
            a->n_with_scales++;
            if (k->numel > 1 || v->numel > 1) a->scales_per_head = 1;
        } else {
            a->missing_layers[a->n_missing++] = l;
        }
    }
    kvd_checkpoint_close(&c);
    return 0;
}
