/* kvdrift: calibration. The BF16 reference sees the calibration trace; the
 * cache records each layer's (and head's) absmax of K after norm and RoPE
 * and of V as projected; a recipe turns those into scales. */
#include "calibrate.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "fileio.h"

static const char *const recipe_names[KVD_CAL_N] = {"absmax", "modelopt", "vllm-dynamic"};

const char *kvd_cal_recipe_name(kvd_cal_recipe r) {
    return (unsigned)r < KVD_CAL_N ? recipe_names[r] : "?";
}

int kvd_cal_recipe_parse(const char *s, kvd_cal_recipe *r) {
    for (int i = 0; i < KVD_CAL_N; i++)
        if (strcmp(s, recipe_names[i]) == 0) {
            *r = (kvd_cal_recipe)i;
            return 0;
        }
    return -1;
}

float kvd_cal_scale(kvd_cal_recipe r, int is_v, float absmax) {
    /* an all-zero layer would give scale 0 and divide by it: keep it finite */
    float a = absmax > 0.0f ? absmax : 1e-12f;
    switch (r) {
    case KVD_CAL_MODELOPT: {
        float s = a / KVD_E4M3_MAX;
        return s > 1.0f ? s : 1.0f;
    }
    case KVD_CAL_VLLM:
        return is_v ? a / 100.0f : a / 200.0f;
    default:
        return a / KVD_E4M3_MAX;
    }
}

int kvd_calibrate(const kvd_backend *be, const kvd_weights *w, const int32_t *tok, int n,
                  kvd_cal_recipe recipe, int per_head, kvd_kv_scales *scales, kvd_kv_scales *absmax,
                  char *err) {
    const kvd_config *c = &w->cfg;
    int nf = kvd_config_n_full(c), kvh = c->num_key_value_heads;
    if (n <= 0) {
        snprintf(err, KVD_ERR_LEN, "calibration: expected a non-empty calibration trace");
        return -1;
    }
    kvd_kvcache kv;
    if (kvd_kvcache_init(&kv, KVD_KV_BF16, nf, kvh, c->head_dim, KVD_KV_BLOCK, n, NULL, 1, err))
        return -1;
    kvd_engine m;
    int rc = -1;
    const int nh = c->num_attention_heads;
    if (kvd_kvcache_track_queries(&kv, nh)) {
        snprintf(err, KVD_ERR_LEN, "calibration: out of memory");
        goto out;
    }
    if (kvd_engine_open(&m, be, w, &kv, n < 256 ? n : 256, 1, NULL, err)) goto out;
    int seq = kvd_kvcache_add_seq(&kv);
    if (kvd_engine_prefill(&m, &kv, seq, tok, n, NULL, 0, err)) goto out;
    if (kvd_kv_scales_init(scales, nf, kvh) || kvd_kv_scales_init(absmax, nf, kvh)) {
        snprintf(err, KVD_ERR_LEN, "calibration: out of memory");
        goto out;
    }
    scales->per_head = absmax->per_head = per_head;
    for (int l = 0; l < nf; l++) {
        float lk = 0.0f, lv = 0.0f;
        for (int h = 0; h < kvh; h++) {
            lk = fmaxf(lk, kv.k_absmax[l * kvh + h]);
            lv = fmaxf(lv, kv.v_absmax[l * kvh + h]);
        }
        for (int h = 0; h < kvh; h++) {
            float ak = per_head ? kv.k_absmax[l * kvh + h] : lk;
            float av = per_head ? kv.v_absmax[l * kvh + h] : lv;
            absmax->k[l * kvh + h] = ak;
            absmax->v[l * kvh + h] = av;
            scales->k[l * kvh + h] = kvd_cal_scale(recipe, 0, ak);
            scales->v[l * kvh + h] = kvd_cal_scale(recipe, 1, av);
        }
    }
    /* the query's scales for FP8 attention, by the recipe's K rule, where the
     * back end noted the queries (the CPU's does) */
    float qmax = 0.0f;
    for (size_t i = 0; i < (size_t)nf * nh; i++) qmax = fmaxf(qmax, kv.q_absmax[i]);
    if (qmax > 0.0f) {
        if (kvd_kv_scales_init_q(scales, nh) || kvd_kv_scales_init_q(absmax, nh)) {
            snprintf(err, KVD_ERR_LEN, "calibration: out of memory");
            goto out;
        }
        for (int l = 0; l < nf; l++) {
            float lq = 0.0f;
            for (int h = 0; h < nh; h++) lq = fmaxf(lq, kv.q_absmax[l * nh + h]);
            for (int h = 0; h < nh; h++) {
                float aq = per_head ? kv.q_absmax[l * nh + h] : lq;
                absmax->q[l * nh + h] = aq;
                scales->q[l * nh + h] = kvd_cal_scale(recipe, 0, aq);
            }
        }
    }
    rc = 0;
out:
    kvd_engine_close(&m);
    kvd_kvcache_free(&kv);
    return rc;
}

static json_t *farr(const float *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(x[i]));
    return a;
}

int kvd_scales_save(const char *path, const kvd_kv_scales *s, const kvd_kv_scales *absmax,
                    kvd_cal_recipe recipe, const char *model, int calib_tokens, uint64_t seed,
                    char *err) {
    json_t *o = json_object();
    json_object_set_new(o, "format", json_string("kvdrift-kv-scales"));
    json_object_set_new(o, "version", json_integer(1));
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "recipe", json_string(kvd_cal_recipe_name(recipe)));
    json_object_set_new(o, "granularity", json_string(s->per_head ? "per-head" : "per-layer"));
    json_object_set_new(o, "calibration_tokens", json_integer(calib_tokens));
    json_object_set_new(o, "calibration_seed", json_integer((json_int_t)seed));
    json_object_set_new(o, "kv_heads", json_integer(s->kv_heads));
    if (s->q) json_object_set_new(o, "heads", json_integer(s->n_heads));
    json_t *layers = json_array();
    for (int l = 0; l < s->n_layers; l++) {
        json_t *e = json_object();
        json_object_set_new(e, "attention_layer", json_integer(l));
        json_object_set_new(e, "k_scale", farr(s->k + l * s->kv_heads, s->kv_heads));
        json_object_set_new(e, "v_scale", farr(s->v + l * s->kv_heads, s->kv_heads));
        if (absmax) {
            json_object_set_new(e, "k_absmax", farr(absmax->k + l * s->kv_heads, s->kv_heads));
            json_object_set_new(e, "v_absmax", farr(absmax->v + l * s->kv_heads, s->kv_heads));
        }
        /* the query's, for FP8 attention (kvdrift run --attn-fp8) */
        if (s->q) json_object_set_new(e, "q_scale", farr(s->q + l * s->n_heads, s->n_heads));
        if (s->q && absmax && absmax->q)
            json_object_set_new(e, "q_absmax", farr(absmax->q + l * s->n_heads, s->n_heads));
        json_array_append_new(layers, e);
    }
    json_object_set_new(o, "layers", layers);
    /* %.9g round-trips every float exactly */
    json_object_set_new(o, "note",
                        json_string("scale = dequantization multiplier: the cache "
                                    "stores cvt(x / scale) and reads fp8 * scale"));
    char *txt = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(o);
    int rc = kvd_write_file_atomic(path, txt, strlen(txt), err);
    free(txt);
    return rc;
}

static int read_farr(json_t *a, const char *path, int l, const char *key, float *out, int n,
                     char *err) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) {
        snprintf(err, KVD_ERR_LEN, "%s: layers[%d].%s: expected an array of %d numbers", path, l,
                 key, n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        double x = json_number_value(v);
        if (!json_is_number(v) || !(x > 0.0) || !isfinite(x)) {
            snprintf(err, KVD_ERR_LEN, "%s: layers[%d].%s[%d]: expected a positive finite number",
                     path, l, key, i);
            return -1;
        }
        out[i] = (float)x;
    }
    return 0;
}

int kvd_scales_load(const char *path, kvd_kv_scales *s, int n_layers, int kv_heads, int n_heads,
                    char *err) {
    json_t *o = kvd_json_load(path, err);
    if (!o) return -1;
    int rc = -1;
    json_t *layers = json_object_get(o, "layers");
    const char *fmt = json_string_value(json_object_get(o, "format"));
    if (!fmt || strcmp(fmt, "kvdrift-kv-scales") != 0) {
        snprintf(err, KVD_ERR_LEN, "%s: field 'format': expected \"kvdrift-kv-scales\"", path);
        goto out;
    }
    if (!json_is_array(layers) || (int)json_array_size(layers) != n_layers) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: field 'layers': expected %d entries (one per full-attention layer), got %d",
                 path, n_layers, json_is_array(layers) ? (int)json_array_size(layers) : 0);
        goto out;
    }
    if (kvd_kv_scales_init(s, n_layers, kv_heads)) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", path);
        goto out;
    }
    const char *gran = json_string_value(json_object_get(o, "granularity"));
    s->per_head = gran && strcmp(gran, "per-head") == 0;
    for (int l = 0; l < n_layers; l++) {
        json_t *e = json_array_get(layers, (size_t)l);
        if (read_farr(json_object_get(e, "k_scale"), path, l, "k_scale", s->k + l * kv_heads,
                      kv_heads, err) ||
            read_farr(json_object_get(e, "v_scale"), path, l, "v_scale", s->v + l * kv_heads,
                      kv_heads, err)) {
            kvd_kv_scales_free(s);
            goto out;
        }
    }
    /* query scales: in every layer or in none */
    int with_q = 0;
    for (int l = 0; l < n_layers; l++)
        with_q += json_object_get(json_array_get(layers, (size_t)l), "q_scale") != NULL;
    if (with_q && with_q != n_layers) {
        snprintf(err, KVD_ERR_LEN, "%s: field 'q_scale': expected it in every layer or in none",
                 path);
        kvd_kv_scales_free(s);
        goto out;
    }
    if (with_q && kvd_kv_scales_init_q(s, n_heads)) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", path);
        kvd_kv_scales_free(s);
        goto out;
    }
    for (int l = 0; with_q && l < n_layers; l++)
        if (read_farr(json_object_get(json_array_get(layers, (size_t)l), "q_scale"), path, l,
                      "q_scale", s->q + l * n_heads, n_heads, err)) {
            kvd_kv_scales_free(s);
            goto out;
        }
    rc = 0;
out:
    json_decref(o);
    return rc;
}
