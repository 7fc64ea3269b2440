/* kvdrift: checkpoints (see checkpoint.h). */
#include "checkpoint.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../kernels/fp8.h"
#include "fileio.h"
#include "safetensors.h"
#include "st_reader.h"

static void shape_str(char *b, size_t n, int nd, const int64_t *sh) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int d = 0; d < nd && k < n; d++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", d ? ", " : "", (long long)sh[d]);
    if (k < n) snprintf(b + k, n - k, "]");
}

/* A checkpoint tensor under kvdrift's (Qwen3-Next's) name, or under the
 * prefix Qwen3.5's multimodal checkpoints give the language model
 * (model.language_model.layers..., beside model.visual... and mtp...). */
static const kvd_st_tensor *find_named(const kvd_checkpoint *c, const char *name) {
    const kvd_st_tensor *s = kvd_checkpoint_find(c, name);
    if (s || strncmp(name, "model.", 6) != 0) return s;
    char alt[200];
    snprintf(alt, sizeof alt, "model.language_model.%s", name + 6);
    return kvd_checkpoint_find(c, alt);
}

/* A weight under its name, or in compressed-tensors' packed 4-bit form,
 * NAME_packed (NAME.weight_packed beside NAME.weight_scale). */
static const kvd_st_tensor *find_weight(const kvd_checkpoint *c, const char *name) {
    const kvd_st_tensor *s = find_named(c, name);
    const size_t n = strlen(name);
    if (s || n < 7 || strcmp(name + n - 7, ".weight")) return s;
    char alt[200];
    snprintf(alt, sizeof alt, "%s_packed", name);
    return find_named(c, alt);
}

/* Where one of kvdrift's tensors comes from in a checkpoint:
 *  - WHOLE: a tensor of its own name (or prefixed, see find_named);
 *  - EXPERT: expert e's slice of the fused mlp.experts.gate_up_proj
 *    [E, 2I, H] (gate rows, then up rows) or mlp.experts.down_proj [E, H, I],
 *    as transformers 5 holds them;
 *  - QKVZ, BA: Qwen3.5's split Gated DeltaNet projections, in_proj_qkv
 *    (rows q | k | v, each head after head) with in_proj_z, and in_proj_b
 *    with in_proj_a, interleaved per key head into Qwen3-Next's fused
 *    in_proj_qkvz (q_g | k_g | v_g | z_g for key head g, v_g and z_g its
 *    value heads) and in_proj_ba (b_g | a_g): the order Qwen3-Next's
 *    fix_query_key_value_ordering reads; conv1d's channels are q | k | v in
 *    both. */
typedef enum { SRC_WHOLE, SRC_EXPERT, SRC_QKVZ, SRC_BA } src_kind;

typedef struct {
    src_kind kind;
    const kvd_st_tensor *s[2];
    int64_t first; /* SRC_EXPERT: the slice's first value */
    /* quantized parts: the scale tensor and the rows x columns each of its
     * values covers */
    const kvd_st_tensor *scale[2];
    int64_t br[2], bc[2];
    /* packed 4-bit parts (NVFP4, MXFP4): E2M1 codes two to a byte, low
     * nibble first; each scale is multiplied by mul (ModelOpt's
     * weight_scale_2) and divided by div (compressed-tensors'
     * weight_global_scale), both 1 where the format has no second level */
    int fp4[2];
    float mul[2], div[2];
} source;

static int is_fp8(const kvd_st_tensor *s) {
    return s->dtype == KVD_ST_F8_E4M3 || s->dtype == KVD_ST_F8_E5M2;
}

/* U8 (ModelOpt, compressed-tensors, Quark) or F4: packed 4-bit codes */
static int is_packed(const kvd_st_tensor *s) {
    return s->dtype == KVD_ST_U8 || s->dtype == KVD_ST_F4;
}

/* a packed 2-D tensor's columns of values: a U8 byte holds two 4-bit
 * codes, an F4 tensor's shape counts the codes */
static int64_t fp4_cols(const kvd_st_tensor *s) {
    return s->dtype == KVD_ST_U8 ? 2 * s->shape[1] : s->shape[1];
}

/* whether s can hold t's values: the same shape, or (packed 4-bit) the same
 * rows with two codes a byte; *fp4 says which */
static int holds(const kvd_st_tensor *s, int ndim, const int64_t *shape, int *fp4) {
    *fp4 = 0;
    if (s->ndim == ndim && !memcmp(s->shape, shape, sizeof *shape * (size_t)ndim)) {
        *fp4 = s->dtype == KVD_ST_F4 && ndim == 2; /* else refused as a dtype */
        return 1;
    }
    if (s->dtype != KVD_ST_U8 || ndim != 2 || s->ndim != 2 || s->shape[0] != shape[0] ||
        2 * s->shape[1] != shape[1])
        return 0;
    *fp4 = 1;
    return 1;
}

/* A packed 4-bit part's scales. NVFP4 (ModelOpt, compressed-tensors): an
 * F8_E4M3 NAME_scale per 16 values of a row, times a second-level F32,
 * NAME_scale_2 (multiplied, ModelOpt) or NAME_global_scale (divided,
 * compressed-tensors), as vLLM's and FlashInfer's NVFP4 GEMMs read them.
 * MXFP4 (OCP; compressed-tensors, Quark): an E8M0 NAME_scale (U8 or
 * F8_E8M0) per 32 values, nothing more. */
static int check_fp4(const kvd_checkpoint *c, source *src, int k, char *err) {
    const kvd_st_tensor *s = src->s[k];
    const char *path = c->files[s->file].path;
    const size_t n = strlen(s->name);
    const int cut = n > 7 && !strcmp(s->name + n - 7, "_packed") ? (int)(n - 7) : (int)n;
    char name[220];
    snprintf(name, sizeof name, "%.*s_scale", cut, s->name);
    const kvd_st_tensor *sc = kvd_checkpoint_find(c, name);
    const int64_t R = s->shape[0], C = fp4_cols(s);
    if (!sc) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: tensor %s is %s [%lld, %lld] (packed 4-bit) without its scale: NVFP4 and "
                 "MXFP4 weights are read as 2-D matrices with %s beside them",
                 path, s->name, kvd_st_dtype_name(s->dtype), (long long)s->shape[0],
                 (long long)s->shape[1], name);
        return -1;
    }
    const int e8 = sc->dtype == KVD_ST_U8 || sc->dtype == KVD_ST_F8_E8M0;
    const int64_t g =
        sc->ndim == 2 && sc->shape[0] == R && sc->shape[1] > 0 && C % sc->shape[1] == 0
            ? C / sc->shape[1]
            : 0;
    if (!(sc->dtype == KVD_ST_F8_E4M3 && g == 16) && !(e8 && g == 32)) {
        char got[96];
        shape_str(got, sizeof got, sc->ndim, sc->shape);
        snprintf(err, KVD_ERR_LEN,
                 "%s: tensor %s: %s %s, expected F8_E4M3 [%lld, %lld] (NVFP4, one scale per 16 "
                 "values) or U8 / F8_E8M0 [%lld, %lld] (MXFP4, one per 32) for the packed 4-bit %s",
                 c->files[sc->file].path, sc->name, kvd_st_dtype_name(sc->dtype), got, (long long)R,
                 (long long)(C / 16), (long long)R, (long long)(C / 32), s->name);
        return -1;
    }
    src->scale[k] = sc;
    src->br[k] = 1, src->bc[k] = g;
    if (e8) return 0;
    char n2[220], ng[220];
    snprintf(n2, sizeof n2, "%.*s_scale_2", cut, s->name);
    snprintf(ng, sizeof ng, "%.*s_global_scale", cut, s->name);
    const kvd_st_tensor *t2 = kvd_checkpoint_find(c, n2), *tg = kvd_checkpoint_find(c, ng),
                        *t = t2 ? t2 : tg;
    if (!t) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: tensor %s is NVFP4 without its second-level scale: expected %s (ModelOpt) "
                 "or %s (compressed-tensors)",
                 path, s->name, n2, ng);
        return -1;
    }
    float v = 0;
    if (t->numel != 1) {
        snprintf(err, KVD_ERR_LEN, "%s: tensor %s: %lld values, expected 1", c->files[t->file].path,
                 t->name, (long long)t->numel);
        return -1;
    }
    if (kvd_st_to_f32(t, &v, err)) {
        kvd_err_prefix(err, c->files[t->file].path);
        return -1;
    }
    if (!(v > 0) || !isfinite(v)) {
        snprintf(err, KVD_ERR_LEN, "%s: tensor %s: expected a positive finite scale, got %g",
                 c->files[t->file].path, t->name, v);
        return -1;
    }
    *(t2 ? &src->mul[k] : &src->div[k]) = v;
    return 0;
}

/* whether s's dtype converts to FP32 (no value is read); err names it if not */
static int check_dtype(const kvd_checkpoint *c, const kvd_st_tensor *s, char *err) {
    float none;
    if (kvd_st_range_to_f32(s, 0, 0, &none, err) == 0) return 0;
    kvd_err_prefix(err, c->files[s->file].path);
    return -1;
}

/* A part's values must be usable: a float dtype, FP8 with its scale, or
 * packed 4-bit codes with theirs (check_fp4).
 * FP8 weights (Qwen's and DeepSeek's block-quantized checkpoints, ModelOpt,
 * compressed-tensors) are dequantized on load, code * scale in FP32, the
 * scale their companion NAME_scale_inv (block FP8) or NAME_scale: one value
 * (per tensor), one per row (per output channel), or one per block of
 * weight_block rows x columns (128 x 128 unless the config says). */
static int check_part(const kvd_checkpoint *c, const kvd_config *cfg, source *src, int k,
                      char *err) {
    const kvd_st_tensor *s = src->s[k];
    if (src->fp4[k]) return check_fp4(c, src, k, err);
    if (!is_fp8(s)) return check_dtype(c, s, err);
    char name[200];
    const kvd_st_tensor *sc = NULL;
    for (int v = 0; v < 2 && !sc; v++) {
        snprintf(name, sizeof name, "%s%s", s->name, v ? "_scale" : "_scale_inv");
        sc = kvd_checkpoint_find(c, name);
    }
    if (!sc || s->ndim != 2 || src->kind == SRC_EXPERT) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: tensor %s is %s %s: FP8 weights are read as 2-D matrices with a "
                 "%s_scale_inv or %s_scale beside them",
                 c->files[s->file].path, s->name, kvd_st_dtype_name(s->dtype),
                 !sc ? "without its scale" : "and not a 2-D matrix", s->name, s->name);
        return -1;
    }
    const int64_t R = s->shape[0], C = s->shape[1];
    const int64_t b0 = cfg->weight_block[0] > 0 ? cfg->weight_block[0] : 128,
                  b1 = cfg->weight_block[1] > 0 ? cfg->weight_block[1] : 128;
    if (sc->numel == 1) {
        src->br[k] = R, src->bc[k] = C; /* per tensor */
    } else if ((sc->ndim == 1 && sc->shape[0] == R) ||
               (sc->ndim == 2 && sc->shape[0] == R && sc->shape[1] == 1)) {
        src->br[k] = 1, src->bc[k] = C; /* per row */
    } else if (sc->ndim == 2 && sc->shape[0] == (R + b0 - 1) / b0 &&
               sc->shape[1] == (C + b1 - 1) / b1) {
        src->br[k] = b0, src->bc[k] = b1; /* per block */
    } else {
        char got[96];
        shape_str(got, sizeof got, sc->ndim, sc->shape);
        snprintf(err, KVD_ERR_LEN,
                 "%s: tensor %s: shape %s, expected 1 value, %lld (one per row) or [%lld, %lld] "
                 "(one per %lld x %lld block) for the FP8 %s",
                 c->files[sc->file].path, sc->name, got, (long long)R,
                 (long long)((R + b0 - 1) / b0), (long long)((C + b1 - 1) / b1), (long long)b0,
                 (long long)b1, s->name);
        return -1;
    }
    if (check_dtype(c, sc, err)) return -1;
    src->scale[k] = sc;
    return 0;
}

static int bad_shape(const kvd_checkpoint *c, char *err, const kvd_st_tensor *s, const char *want) {
    char got[96];
    shape_str(got, sizeof got, s->ndim, s->shape);
    snprintf(err, KVD_ERR_LEN, "%s: tensor %s: shape %s, expected %s from config.json",
             c->files[s->file].path, s->name, got, want);
    return -1;
}

static int is_2d(const kvd_st_tensor *s, int64_t r, int64_t cols, int *fp4) {
    const int64_t shape[2] = {r, cols};
    return holds(s, 2, shape, fp4);
}

/* 0: found; 1: the checkpoint has no such tensor (missing: the message);
 * -1: err says why it cannot be used */
static int find_source(const kvd_checkpoint *c, const kvd_config *cfg, const kvd_tensor *t,
                       source *src, char *err) {
    memset(src, 0, sizeof *src);
    src->mul[0] = src->mul[1] = src->div[0] = src->div[1] = 1.0f;
    if ((src->s[0] = find_weight(c, t->name))) {
        if (holds(src->s[0], t->ndim, t->shape, &src->fp4[0]))
            return check_part(c, cfg, src, 0, err);
        char want[96];
        shape_str(want, sizeof want, t->ndim, t->shape);
        return bad_shape(c, err, src->s[0], want);
    }
    int layer, e;
    char which[32], name[160], want[96];
    if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%31[a-z_].weight", &layer, &e, which) ==
        3) {
        int gate = !strcmp(which, "gate_proj"), up = !strcmp(which, "up_proj");
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", layer,
                 gate || up ? "gate_up_proj" : "down_proj");
        const kvd_st_tensor *s = find_named(c, name);
        if (!s) {
            snprintf(err, KVD_ERR_LEN,
                     "tensor %s is missing, and so is the fused %s (the config asks for them)",
                     t->name, name);
            return 1;
        }
        int64_t rows = t->shape[0], cols = t->shape[1], r1 = gate || up ? 2 * rows : rows;
        if (is_packed(s)) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: tensor %s is %s: packed 4-bit experts are read one expert at a time "
                     "(mlp.experts.E.gate_proj.weight ...), not from a fused tensor",
                     c->files[s->file].path, s->name, kvd_st_dtype_name(s->dtype));
            return -1;
        }
        if (s->ndim != 3 || s->shape[0] != cfg->num_experts || s->shape[1] != r1 ||
            s->shape[2] != cols) {
            snprintf(want, sizeof want, "[%d, %lld, %lld]", cfg->num_experts, (long long)r1,
                     (long long)cols);
            return bad_shape(c, err, s, want);
        }
        src->kind = SRC_EXPERT;
        src->s[0] = s;
        src->first = (int64_t)e * r1 * cols + (up ? rows * cols : 0);
        return check_part(c, cfg, src, 0, err);
    }
    int qkvz = 0, ba = 0, n = 0;
    if (sscanf(t->name, "model.layers.%d.linear_attn.in_proj_%31[a-z].weight%n", &layer, which,
               &n) == 2 &&
        t->name[n] == 0) {
        qkvz = !strcmp(which, "qkvz");
        ba = !strcmp(which, "ba");
    }
    if (!qkvz && !ba) {
        snprintf(err, KVD_ERR_LEN, "tensor %s is missing (the config asks for it)", t->name);
        return 1;
    }
    const int64_t H = cfg->hidden_size, kd = kvd_key_dim(cfg), vd = kvd_value_dim(cfg),
                  nv = cfg->linear_num_value_heads;
    const char *part[2] = {qkvz ? "qkv" : "b", qkvz ? "z" : "a"};
    const int64_t rows[2] = {qkvz ? 2 * kd + vd : nv, qkvz ? vd : nv};
    char names[2][160];
    for (int k = 0; k < 2; k++) {
        snprintf(names[k], sizeof names[k], "model.layers.%d.linear_attn.in_proj_%s.weight", layer,
                 part[k]);
        src->s[k] = find_weight(c, names[k]);
    }
    if (!src->s[0] && !src->s[1]) {
        snprintf(err, KVD_ERR_LEN,
                 "tensor %s is missing, and so is its Qwen3.5 split form in_proj_%s + in_proj_%s "
                 "(the config asks for them)",
                 t->name, part[0], part[1]);
        return 1;
    }
    for (int k = 0; k < 2; k++) {
        if (!src->s[k]) {
            snprintf(err, KVD_ERR_LEN,
                     "tensor %s is missing (the split form of %s has in_proj_%s, not in_proj_%s)",
                     names[k], t->name, part[1 - k], part[k]);
            return 1;
        }
        if (!is_2d(src->s[k], rows[k], H, &src->fp4[k])) {
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows[k], (long long)H);
            return bad_shape(c, err, src->s[k], want);
        }
    }
    src->kind = qkvz ? SRC_QKVZ : SRC_BA;
    for (int k = 0; k < 2; k++)
        if (check_part(c, cfg, src, k, err)) return -1;
    return 0;
}

/* A quantized part's scales as floats (an MXFP4 U8 scale is E8M0), each
 * finite and with the second level applied; NULL with err if not. */
static float *part_scales(const source *src, int k, char *err) {
    const kvd_st_tensor *sc = src->scale[k];
    float *sv = malloc(sizeof(float) * (size_t)(sc->numel ? sc->numel : 1));
    if (!sv) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", sc->name);
        return NULL;
    }
    if (sc->dtype == KVD_ST_U8) {
        for (int64_t i = 0; i < sc->numel; i++) sv[i] = kvd_e8m0_to_f32(sc->data[i]);
    } else if (kvd_st_to_f32(sc, sv, err)) {
        free(sv);
        return NULL;
    }
    for (int64_t i = 0; i < sc->numel; i++) {
        if (!isfinite(sv[i])) {
            snprintf(err, KVD_ERR_LEN, "tensor %s: value %lld is %g, expected a finite scale",
                     sc->name, (long long)i, sv[i]);
            free(sv);
            return NULL;
        }
        sv[i] = sv[i] * src->mul[k] / src->div[k];
    }
    return sv;
}

/* A part ready to be read: its values' columns, and for a quantized part
 * its scales (part_scales) and its codes' values, made once per tensor
 * however many row ranges the layout reads from it. */
typedef struct {
    const kvd_st_tensor *s;
    int64_t C, br, bc;
    int fp4;
    float *sv; /* NULL: a float dtype, read as it is */
    float lut[256];
} part;

static int part_open(const source *src, int k, part *p, char *err) {
    const kvd_st_tensor *s = src->s[k];
    p->s = s;
    p->fp4 = src->fp4[k];
    p->C = p->fp4 ? fp4_cols(s) : s->shape[0] > 0 ? s->numel / s->shape[0] : 0;
    p->br = src->br[k], p->bc = src->bc[k];
    p->sv = NULL;
    if (!src->scale[k]) return 0;
    if (!(p->sv = part_scales(src, k, err))) return -1;
    for (int v = 0; v < 256; v++)
        p->lut[v] = p->fp4                       ? kvd_e2m1_to_f32((uint8_t)(v & 15))
                    : s->dtype == KVD_ST_F8_E5M2 ? kvd_e5m2_to_f32((uint8_t)v)
                                                 : kvd_e4m3_to_f32((uint8_t)v);
    return 0;
}

/* rows [r0, r0 + n) of a part (a [rows, ...] tensor) into out, quantized
 * ones dequantized: code * scale in FP32 */
static int part_rows(const part *p, int64_t r0, int64_t n, float *out, char *err) {
    const int64_t C = p->C;
    if (!p->sv) return kvd_st_range_to_f32(p->s, r0 * C, n * C, out, err);
    const int64_t br = p->br, bc = p->bc, nbc = (C + bc - 1) / bc;
    /* a scale's values at a time (bc is even for 4-bit codes, so a byte's
     * two never straddle scales) */
    for (int64_t r = r0; r < r0 + n; r++) {
        const float *row_sc = p->sv + (r / br) * nbc;
        float *o = out + (r - r0) * C;
        for (int64_t j0 = 0, b = 0; j0 < C; j0 += bc, b++) {
            const float sc = row_sc[b];
            const int64_t j1 = j0 + bc < C ? j0 + bc : C;
            if (p->fp4) {
                const uint8_t *code = p->s->data + r * (C / 2);
                for (int64_t j = j0; j < j1; j += 2) {
                    o[j] = p->lut[code[j / 2] & 15] * sc;
                    o[j + 1] = p->lut[code[j / 2] >> 4] * sc;
                }
            } else {
                const uint8_t *code = p->s->data + r * C;
                for (int64_t j = j0; j < j1; j++) o[j] = p->lut[code[j]] * sc;
            }
        }
    }
    return 0;
}

/* the layout's row ranges, from its opened parts, into out */
static int fill_rows(const source *src, const kvd_config *cfg, const part *p, float *out,
                     char *err) {
    const int64_t H = cfg->hidden_size, nk = cfg->linear_num_key_heads,
                  dk = cfg->linear_key_head_dim, dv = cfg->linear_value_head_dim,
                  r = cfg->linear_num_value_heads / cfg->linear_num_key_heads;
    switch (src->kind) {
    case SRC_WHOLE:
        return part_rows(&p[0], 0, src->s[0]->ndim ? src->s[0]->shape[0] : 1, out, err);
    case SRC_QKVZ: /* per key head g: q_g, k_g, then its value heads' v and z */
        for (int64_t g = 0; g < nk; g++) {
            if (part_rows(&p[0], g * dk, dk, out, err) ||
                part_rows(&p[0], nk * dk + g * dk, dk, out + dk * H, err) ||
                part_rows(&p[0], 2 * nk * dk + g * r * dv, r * dv, out + 2 * dk * H, err) ||
                part_rows(&p[1], g * r * dv, r * dv, out + (2 * dk + r * dv) * H, err))
                return -1;
            out += (2 * dk + 2 * r * dv) * H;
        }
        return 0;
    case SRC_BA: /* per key head g: its value heads' b, then their a */
        for (int64_t g = 0; g < nk; g++) {
            if (part_rows(&p[0], g * r, r, out, err) ||
                part_rows(&p[1], g * r, r, out + r * H, err))
                return -1;
            out += 2 * r * H;
        }
        return 0;
    case SRC_EXPERT:
        break;
    }
    return -1;
}

static int fill(const source *src, const kvd_config *cfg, const kvd_tensor *t, char *err) {
    if (src->kind == SRC_EXPERT)
        return kvd_st_range_to_f32(src->s[0], src->first, t->numel, t->data, err);
    part p[2] = {{0}, {0}};
    int rc = -1;
    if (part_open(src, 0, &p[0], err) == 0 &&
        (src->kind == SRC_WHOLE || part_open(src, 1, &p[1], err) == 0))
        rc = fill_rows(src, cfg, p, t->data, err);
    free(p[0].sv), free(p[1].sv);
    return rc;
}

/* DIR/config.json, the model named after the directory */
static int ckpt_config(const char *dir, kvd_config *cfg, char *err) {
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (kvd_config_load(path, cfg, err)) return -1;
    const char *base = strrchr(dir, '/');
    snprintf(cfg->name, sizeof cfg->name, "%s", base && base[1] ? base + 1 : dir);
    return 0;
}

int kvd_weights_load(kvd_weights *w, const char *dir, char *err) {
    kvd_config cfg;
    if (ckpt_config(dir, &cfg, err)) return -1;
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
        source src;
        int found = find_source(&c, &cfg, t, &src, err);
        if (found > 0) kvd_err_prefix(err, dir);
        if (found) goto out;
        if (fill(&src, &cfg, t, err)) {
            kvd_err_prefix(err, c.files[src.s[0]->file].path);
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

/* Lazy weights from a checkpoint: the checkpoint stays open (mapped), and
 * each tensor is found (and its dtype and shape checked) up front, made
 * from the mapping when the upload asks for it. */
typedef struct {
    kvd_checkpoint c;
    source *src; /* per planned tensor */
    const kvd_tensor *first;
} lazy_ckpt;

static void lazy_ckpt_free(void *ctx) {
    lazy_ckpt *l = ctx;
    if (!l) return;
    kvd_checkpoint_close(&l->c);
    free(l->src);
    free(l);
}

static int lazy_ckpt_make(void *ctx, const kvd_config *cfg, kvd_tensor *t, char *err) {
    lazy_ckpt *l = ctx;
    const source *src = &l->src[t - l->first];
    if (fill(src, cfg, t, err)) {
        kvd_err_prefix(err, l->c.files[src->s[0]->file].path);
        return -1;
    }
    return 0;
}

int kvd_weights_lazy_load(kvd_weights *w, const char *dir, char *err) {
    kvd_config cfg;
    if (ckpt_config(dir, &cfg, err)) return -1;
    lazy_ckpt *l = calloc(1, sizeof *l);
    if (!l) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", dir);
        return -1;
    }
    if (kvd_checkpoint_open(&l->c, dir, err)) {
        free(l);
        return -1;
    }
    if (kvd_weights_lazy(w, &cfg, lazy_ckpt_make, l, lazy_ckpt_free, err)) return -1;
    l->first = w->tensors;
    l->src = calloc((size_t)w->n_tensors, sizeof *l->src);
    if (!l->src) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", dir);
        kvd_weights_free(w);
        return -1;
    }
    /* every tensor there, of a usable dtype, before any upload starts */
    for (int i = 0; i < w->n_tensors; i++) {
        int found = find_source(&l->c, &cfg, &w->tensors[i], &l->src[i], err);
        if (found) {
            if (found > 0) kvd_err_prefix(err, dir);
            kvd_weights_free(w);
            return -1;
        }
    }
    return 0;
}

/* The names engines read a full-attention layer's KV scales under (vLLM's
 * and SGLang's loaders map each onto the layer's k_scale / v_scale):
 * ModelOpt's k_proj.k_scale, compressed-tensors' self_attn.k_scale, the
 * engines' own attn.k_scale, Quark's (and older compressed-tensors')
 * k_proj.output_scale, and the deprecated single kv_scale, which engines
 * use for K and V alike. */
static const char *const kv_scale_names[2][5] = {
    {"self_attn.k_proj.k_scale", "self_attn.k_scale", "self_attn.attn.k_scale",
     "self_attn.k_proj.output_scale", "self_attn.kv_scale"},
    {"self_attn.v_proj.v_scale", "self_attn.v_scale", "self_attn.attn.v_scale",
     "self_attn.v_proj.output_scale", "self_attn.kv_scale"}};

/* The scale tensor of a full-attention layer under any of those names. */
static const kvd_st_tensor *find_scale(const kvd_checkpoint *c, int layer, int is_v) {
    char name[160];
    for (int k = 0; k < 5; k++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, kv_scale_names[is_v][k]);
        const kvd_st_tensor *t = find_named(c, name);
        if (t) return t;
    }
    return NULL;
}

/* The names engines read a layer's query scale under (FP8 attention's
 * q_scale; vLLM's and SGLang's loaders map each onto the layer's attention
 * q_scale): Quark's and compressed-tensors' q_proj.output_scale, the
 * engines' own attn.q_scale, and llm-compressor's self_attn.q_scale. */
static const char *const q_scale_names[3] = {"self_attn.q_proj.output_scale",
                                             "self_attn.attn.q_scale", "self_attn.q_scale"};

static const kvd_st_tensor *find_q_scale(const kvd_checkpoint *c, int layer) {
    char name[160];
    for (int k = 0; k < 3; k++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", layer, q_scale_names[k]);
        const kvd_st_tensor *t = find_named(c, name);
        if (t) return t;
    }
    return NULL;
}

/* whether a tensor name ends in ".X", X one of the n names */
static int ends_in_one_of(const char *name, const char *const *names, int n_names) {
    const size_t n = strlen(name);
    for (int k = 0; k < n_names; k++) {
        const size_t m = strlen(names[k]);
        if (n > m && name[n - m - 1] == '.' && !strcmp(name + n - m, names[k])) return 1;
    }
    return 0;
}

/* whether a tensor name is a KV scale's, under any of those names */
static int is_kv_scale_name(const char *name) {
    return ends_in_one_of(name, kv_scale_names[0], 5) || ends_in_one_of(name, kv_scale_names[1], 5);
}

/* A scale tensor's n values (1, or `heads` spread over them) into out
 * [heads]: positive and finite, else -1 with err naming the file and the
 * tensor. */
static int scale_heads(const kvd_checkpoint *c, const kvd_st_tensor *t, int heads, const char *per,
                       float *out, char *err) {
    if (t->numel != 1 && t->numel != heads) {
        snprintf(err, KVD_ERR_LEN, "%s: %s: %lld values, expected 1 or %d (per %s)",
                 c->files[t->file].path, t->name, (long long)t->numel, heads, per);
        return -1;
    }
    float buf[256];
    if (heads > 256) {
        snprintf(err, KVD_ERR_LEN, "%s: %s: %d heads, at most 256 supported",
                 c->files[t->file].path, t->name, heads);
        return -1;
    }
    if (kvd_st_to_f32(t, buf, err)) return -1;
    for (int h = 0; h < heads; h++) {
        const float x = buf[t->numel > 1 ? h : 0];
        if (!(x > 0) || !isfinite(x)) {
            snprintf(err, KVD_ERR_LEN, "%s: %s: expected positive finite scales, got %g",
                     c->files[t->file].path, t->name, x);
            return -1;
        }
        out[h] = x;
    }
    return 0;
}

/* The full-attention layers' query scales (s->q, 1.0 where a layer has
 * none, as an engine defaults them; left NULL where no layer has one) */
static int query_scales(const kvd_checkpoint *c, const kvd_config *cfg, kvd_kv_scales *s,
                        char *err) {
    const int nh = cfg->num_attention_heads;
    for (int l = 0, al = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        const kvd_st_tensor *t = find_q_scale(c, l);
        if (t && !s->q && kvd_kv_scales_init_q(s, nh)) {
            snprintf(err, KVD_ERR_LEN, "out of memory for the query scales");
            return -1;
        }
        if (t && scale_heads(c, t, nh, "query head", s->q + (size_t)al * nh, err)) return -1;
        al++;
    }
    return 0;
}

int kvd_checkpoint_kv_scales(const char *dir, const kvd_config *cfg, kvd_kv_scales *s, int *found,
                             char *err) {
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    int nf = kvd_config_n_full(cfg), kvh = cfg->num_key_value_heads, al = 0, have = 0;
    kvd_kv_scales_init(s, nf, kvh);
    if (query_scales(&c, cfg, s, err)) {
        kvd_checkpoint_close(&c);
        kvd_kv_scales_free(s);
        return -1;
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        const kvd_st_tensor *t[2] = {find_scale(&c, l, 0), find_scale(&c, l, 1)};
        int ok = t[0] && t[1];
        for (int v = 0; ok && v < 2; v++) {
            if (scale_heads(&c, t[v], kvh, "KV head", (v ? s->v : s->k) + al * kvh, err)) {
                kvd_checkpoint_close(&c);
                kvd_kv_scales_free(s);
                return -1;
            }
            if (t[v]->numel > 1) s->per_head = 1;
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

/* one K (w 0) or V (w 1) scale tensor's values into the audit's range and
 * counts */
static void scale_values(const kvd_st_tensor *t, kvd_audit *a, int w) {
    float buf[256], *lo = w ? &a->v_min : &a->k_min, *hi = w ? &a->v_max : &a->k_max;
    char e[KVD_ERR_LEN];
    if (t->numel < 1 || t->numel > 256 || kvd_st_to_f32(t, buf, e)) {
        if (!a->bad_scale[0])
            snprintf(a->bad_scale, sizeof a->bad_scale, "%s: %lld values of %s", t->name,
                     (long long)t->numel, kvd_st_dtype_name(t->dtype));
        return;
    }
    int unit = 1;
    for (int64_t i = 0; i < t->numel; i++) {
        const float x = buf[i];
        if (!(x > 0) || !isfinite(x)) {
            if (!a->bad_scale[0])
                snprintf(a->bad_scale, sizeof a->bad_scale, "%s = %g", t->name, x);
            unit = 0;
            continue;
        }
        unit &= x == 1.0f;
        *lo = fminf(*lo, x);
        *hi = fmaxf(*hi, x);
    }
    if (unit) ++*(w ? &a->n_unit_v : &a->n_unit_k);
}

/* The quantization the checkpoint asks for: hf_quant_config.json (ModelOpt),
 * else config.json's quantization_config (compressed-tensors, fp8,
 * modelopt). Fills source, producer, weight_algo and kv_algo. */
static int read_quant_config(const char *dir, kvd_audit *a, char *err) {
    char path[4300];
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
        return 0;
    }
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
            /* compressed-tensors: {"num_bits": 8, "type": "float"} is FP8 */
            int bits = (int)json_integer_value(json_object_get(ks, "num_bits"));
            const char *ty = json_string_value(json_object_get(ks, "type"));
            if (bits == 8 && ty && !strcmp(ty, "float"))
                snprintf(a->kv_algo, sizeof a->kv_algo, "FP8");
            else if (ty && (!strcmp(ty, "float") || !strcmp(ty, "int")) && bits > 0)
                snprintf(a->kv_algo, sizeof a->kv_algo, "%s%d", ty[0] == 'f' ? "FP" : "INT", bits);
            else
                snprintf(a->kv_algo, sizeof a->kv_algo, "other");
        }
    }
    json_decref(root);
    return 0;
}

int kvd_checkpoint_kv_algo(const char *dir, char *algo, size_t n, char *err) {
    kvd_audit a;
    memset(&a, 0, sizeof a);
    if (read_quant_config(dir, &a, err)) return -1;
    snprintf(algo, n, "%s", a.kv_algo);
    return 0;
}

int kvd_audit_dir(const char *dir, kvd_config *cfg, kvd_audit *a, char *err) {
    memset(a, 0, sizeof *a);
    a->k_min = a->v_min = INFINITY; /* no scale seen yet */
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (kvd_config_load(path, cfg, err)) return -1;
    if (read_quant_config(dir, a, err)) return -1;
    /* scales and weight dtypes from the safetensors headers */
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    a->weights_loadable = 1;
    for (int i = 0; i < c.n; i++) {
        const kvd_st_tensor *t = &c.t[i];
        const size_t nl = strlen(t->name);
        const int is_weight = (nl > 7 && !strcmp(t->name + nl - 7, ".weight")) ||
                              (nl > 14 && !strcmp(t->name + nl - 14, ".weight_packed"));
        /* FP8 and packed 4-bit weights are dequantized on load when their
         * scales are there (the check over the plan below says whether they
         * are, and whether a U8 tensor is packed codes at all) */
        if (is_weight && (is_fp8(t) || is_packed(t))) {
            ++*(is_fp8(t) ? &a->fp8_weights : &a->fp4_weights);
            continue;
        }
        if (is_weight && t->dtype != KVD_ST_BF16 && t->dtype != KVD_ST_F16 &&
            t->dtype != KVD_ST_F32) {
            if (a->weights_loadable)
                snprintf(a->unloadable, sizeof a->unloadable, "%s (%s)", t->name,
                         kvd_st_dtype_name(t->dtype));
            a->weights_loadable = 0;
        }
    }
    /* unquantized: every tensor the config asks for, under any name and in
     * any layout the loader reads (quantized weights have other shapes) */
    kvd_weights w;
    if (a->weights_loadable && kvd_weights_plan(&w, cfg, err) == 0) {
        for (int i = 0; i < w.n_tensors && !a->load_problem[0]; i++) {
            source src;
            find_source(&c, cfg, &w.tensors[i], &src, a->load_problem);
        }
        a->weights_loadable = !a->load_problem[0];
        kvd_weights_free(&w);
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        a->n_attn++;
        const kvd_st_tensor *k = find_scale(&c, l, 0), *v = find_scale(&c, l, 1);
        a->n_with_q_scales += find_q_scale(&c, l) != NULL;
        if (k && v) {
            a->n_with_scales++;
            if (k->numel > 1 || v->numel > 1) a->scales_per_head = 1;
            for (int w = 0; w < 2; w++) scale_values(w ? v : k, a, w);
        } else {
            a->missing_layers[a->n_missing++] = l;
        }
    }
    kvd_checkpoint_close(&c);
    return 0;
}

int kvd_kv_algo_kind(const char *algo) {
    if (!algo[0] || !strcasecmp(algo, "none")) return KVD_KV_ALGO_NONE;
    return !strcasecmp(algo, "FP8")     ? KVD_KV_ALGO_FP8
           : !strcasecmp(algo, "NVFP4") ? KVD_KV_ALGO_NVFP4
                                        : KVD_KV_ALGO_OTHER;
}

const char *kvd_kv_algo_ckpt_mode(int kind) {
    return kind == KVD_KV_ALGO_NVFP4 ? "nvfp4-ckpt" : "fp8-ckpt";
}

kvd_audit_finding kvd_audit_find(const kvd_audit *a) {
    kvd_audit_finding f = {0, 0, 0, 0, 0, 0};
    const int kind = kvd_kv_algo_kind(a->kv_algo);
    f.fp8_kv = kind == KVD_KV_ALGO_FP8;
    f.nvfp4_kv = kind == KVD_KV_ALGO_NVFP4;
    f.unmodelled = kind == KVD_KV_ALGO_OTHER;
    const int q = f.fp8_kv || f.nvfp4_kv;
    f.silent = q && a->n_missing > 0;
    f.bad = q && !f.silent && a->bad_scale[0];
    if (q && !f.silent && !f.bad && a->n_with_scales > 0)
        f.ones = (a->n_unit_k == a->n_with_scales) | (a->n_unit_v == a->n_with_scales) << 1;
    return f;
}

const char *kvd_audit_sides(int ones) {
    static const char *const name[4] = {"", "K", "V", "K and V"};
    return name[ones & 3];
}

json_t *kvd_audit_json(const kvd_audit *a) {
    const kvd_audit_finding f = kvd_audit_find(a);
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:s, s:b, s:s, s:s, s:i, s:i, s:i, s:i, s:b, s:b}", "quant_config_source",
        a->source, "producer", a->producer, "weight_quantization", a->weight_algo,
        "kv_cache_quantization", a->kv_algo, "weights_loadable", a->weights_loadable,
        "unloadable_tensor", a->unloadable, "load_problem", a->load_problem, "fp8_weight_tensors",
        a->fp8_weights, "fp4_weight_tensors", a->fp4_weights, "full_attention_layers", a->n_attn,
        "layers_with_kv_scales", a->n_with_scales, "kv_scales_per_head", a->scales_per_head,
        "fp8_kv_without_scales", f.silent && f.fp8_kv);
    json_object_set_new(o, "nvfp4_kv_without_scales", json_boolean(f.silent && f.nvfp4_kv));
    json_object_set_new(o, "layers_with_q_scales", json_integer(a->n_with_q_scales));
    json_object_set_new(o, "kv_cache_not_modelled", json_boolean(f.unmodelled));
    json_t *ml = json_array();
    for (int i = 0; i < a->n_missing; i++)
        json_array_append_new(ml, json_integer(a->missing_layers[i]));
    json_object_set_new(o, "layers_missing_kv_scales", ml);
    json_object_set_new(o, "kv_scale_range",
                        a->n_with_scales && !a->bad_scale[0]
                            ? json_pack("{s:[f,f], s:[f,f]}", "k", (double)a->k_min,
                                        (double)a->k_max, "v", (double)a->v_min, (double)a->v_max)
                            : json_null());
    json_object_set_new(o, "kv_scales_exactly_one",
                        json_pack("{s:i, s:i}", "k", a->n_unit_k, "v", a->n_unit_v));
    /* named for FP8, which came first; NVFP4's placeholder scales too */
    json_object_set_new(o, "fp8_kv_scales_all_one",
                        json_string(f.ones == 3   ? "kv"
                                    : f.ones == 2 ? "v"
                                    : f.ones      ? "k"
                                                  : ""));
    json_object_set_new(o, "bad_kv_scale", json_string(a->bad_scale));
    return o;
}

/* FNV-1a, 64-bit */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int kvd_checkpoint_fingerprint(const char *dir, char *out, size_t n, char *err) {
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *cfg = kvd_read_file(path, &len, err);
    if (!cfg) return -1;
    uint64_t h = fnv(0xcbf29ce484222325ull, cfg, len);
    free(cfg);
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    for (int f = 0; f < c.n_files; f++) {
        /* the file's name (not its directory), size and header: names,
         * dtypes, shapes, offsets */
        const char *base = strrchr(c.files[f].path, '/');
        base = base ? base + 1 : c.files[f].path;
        const unsigned char *m = c.files[f].map;
        const size_t data = 8 + c.files[f].header_len;
        h = fnv(h, base, strlen(base) + 1);
        h = fnv(h, &c.files[f].size, sizeof c.files[f].size);
        h = fnv(h, m, data);
        /* samples of the values: windows spread evenly over the data */
        const size_t len = c.files[f].size - data, win = 4096, nw = 16;
        if (len <= win * nw) {
            h = fnv(h, m + data, len);
        } else {
            for (size_t w = 0; w < nw; w++)
                h = fnv(h, m + data + w * ((len - win) / (nw - 1)), win);
        }
    }
    /* and the values of the KV scales, which a re-calibration changes
     * without changing any header */
    for (int i = 0; i < c.n; i++)
        if (is_kv_scale_name(c.t[i].name) || ends_in_one_of(c.t[i].name, q_scale_names, 3))
            h = fnv(h, c.t[i].data, c.t[i].nbytes);
    kvd_checkpoint_close(&c);
    snprintf(out, n, "fnv1a64:%016llx", (unsigned long long)h);
    return 0;
}

/* ---- writing KV scales into a checkpoint ---- */

/* Rewrite file f of c without its KV scale tensors (atomically; removed
 * when nothing else is left in it): the other tensors' bytes, dtypes,
 * shapes and order, and the header's __metadata__, as they were. */
static int drop_kv_scales(const kvd_checkpoint *c, int f, char *err) {
    const kvd_st_file *file = &c->files[f];
    json_error_t je;
    json_t *old = json_loadb((const char *)file->map + 8, file->header_len, 0, &je);
    const kvd_st_tensor **keep = malloc(sizeof *keep * (size_t)(c->n ? c->n : 1));
    if (!old || !keep) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot read its header back", file->path);
        json_decref(old);
        free(keep);
        return -1;
    }
    int nk = 0;
    for (int i = 0; i < c->n; i++)
        if (c->t[i].file == f && !is_kv_scale_name(c->t[i].name)) keep[nk++] = &c->t[i];
    kvd_st_by_offset(keep, (size_t)nk); /* in the file's own order */
    int rc = -1;
    if (nk == 0) {
        rc = unlink(file->path) ? -1 : 0;
        if (rc) snprintf(err, KVD_ERR_LEN, "%s: cannot remove: %s", file->path, strerror(errno));
        goto out;
    }
    json_t *h = json_object();
    json_t *meta = json_object_get(old, "__metadata__");
    if (meta) json_object_set(h, "__metadata__", meta);
    int64_t off = 0;
    for (int i = 0; i < nk; i++) {
        json_t *e = json_deep_copy(json_object_get(old, keep[i]->name));
        json_object_set_new(
            e, "data_offsets",
            json_pack("[I,I]", (json_int_t)off, (json_int_t)(off + keep[i]->nbytes)));
        json_object_set_new(h, keep[i]->name, e);
        off += (int64_t)keep[i]->nbytes;
    }
    kvd_afile a;
    if (kvd_afile_open(&a, file->path, err) == 0) {
        kvd_st_header_write(&a, h);
        for (int i = 0; i < nk; i++) kvd_afile_write(&a, keep[i]->data, keep[i]->nbytes);
        rc = kvd_afile_commit(&a, err);
    }
    json_decref(h);
out:
    json_decref(old);
    free(keep);
    return rc;
}

int kvd_checkpoint_add_kv_scales(const char *dir, const kvd_config *cfg, const kvd_kv_scales *sc,
                                 int per_head, int replace, int *n_replaced, char *err) {
    char shard[4300], index[4300];
    snprintf(shard, sizeof shard, "%s/kv_scales.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    kvd_checkpoint c;
    if (kvd_checkpoint_open(&c, dir, err)) return -1;
    /* refused when any layer has scales already (two sets would disagree),
     * unless they are to be replaced */
    const int kvh = cfg->num_key_value_heads, nf = kvd_config_n_full(cfg);
    for (int l = 0; l < cfg->num_hidden_layers && !replace; l++)
        if (cfg->layer_types[l] == KVD_LAYER_FULL &&
            (find_scale(&c, l, 0) || find_scale(&c, l, 1))) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: layer %d already carries k_scale/v_scale; kvdrift adds scales only to a "
                     "checkpoint without any (--replace removes those and writes the new ones)",
                     dir, l);
            kvd_checkpoint_close(&c);
            return -1;
        }
    /* which files hold KV scales, and whether kv_scales.safetensors holds
     * anything else */
    int old = 0, other_in_shard = 0;
    char *holds_scales = calloc((size_t)c.n_files + 1, 1);
    if (!holds_scales) {
        snprintf(err, KVD_ERR_LEN, "%s: out of memory", dir);
        kvd_checkpoint_close(&c);
        return -1;
    }
    for (int i = 0; i < c.n; i++) {
        const int scale = is_kv_scale_name(c.t[i].name);
        old += scale;
        holds_scales[c.t[i].file] |= (char)scale;
        if (!scale && !strcmp(c.files[c.t[i].file].path, shard)) other_in_shard = 1;
    }
    if (access(shard, F_OK) == 0 && (!replace || other_in_shard)) {
        snprintf(err, KVD_ERR_LEN, "%s: already there%s; remove it to write new scales", shard,
                 other_in_shard ? " and holds other tensors than KV scales" : "");
        goto refuse;
    }
    if (!sc) { /* the checks alone, before the calibration's work */
        free(holds_scales);
        kvd_checkpoint_close(&c);
        return 0;
    }
    if (sc->n_layers != nf || sc->kv_heads != kvh) {
        snprintf(err, KVD_ERR_LEN, "%s: scales for %d layers x %d KV heads, the model has %d x %d",
                 dir, sc->n_layers, sc->kv_heads, nf, kvh);
        goto refuse;
    }
    /* the names ModelOpt exports (vLLM and SGLang read them), under the
     * language model's prefix */
    const char *pre = find_named(&c, "model.embed_tokens.weight") &&
                              !kvd_checkpoint_find(&c, "model.embed_tokens.weight")
                          ? "model.language_model."
                          : "model.";
    /* the old scales out of their files first: should this stop half way,
     * the checkpoint holds fewer scales, never two sets (kv_scales.safetensors
     * itself is replaced whole below) */
    for (int f = 0; f < c.n_files; f++)
        if (holds_scales[f] && strcmp(c.files[f].path, shard) && drop_kv_scales(&c, f, err))
            goto refuse;
    if (n_replaced) *n_replaced = old;
    free(holds_scales);
    kvd_checkpoint_close(&c);
    const int nv = per_head ? kvh : 1;
    json_t *h = json_object();
    int64_t off = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        if (cfg->layer_types[l] != KVD_LAYER_FULL) continue;
        for (int v = 0; v < 2; v++) {
            char name[160];
            snprintf(name, sizeof name, "%slayers.%d.self_attn.%s", pre, l,
                     v ? "v_proj.v_scale" : "k_proj.k_scale");
            json_t *shape = per_head ? json_pack("[i]", kvh) : json_array();
            json_object_set_new(h, name,
                                json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                          "data_offsets", (json_int_t)off,
                                          (json_int_t)(off + 4 * nv)));
            off += 4 * nv;
        }
    }
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "producer", "kvdrift calibrate"));
    kvd_afile a;
    int rc = kvd_afile_open(&a, shard, err);
    if (rc == 0) {
        kvd_st_header_write(&a, h);
        for (int al = 0; al < nf; al++) /* F32, little-endian as the host */
            for (int v = 0; v < 2; v++)
                kvd_afile_write(&a, (v ? sc->v : sc->k) + al * kvh, 4 * (size_t)nv);
        rc = kvd_afile_commit(&a, err);
    }
    /* a checkpoint with an index lists its files there */
    if (rc == 0 && access(index, F_OK) == 0) {
        json_t *ix = kvd_json_load(index, err);
        json_t *wm = ix ? json_object_get(ix, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            if (ix) snprintf(err, KVD_ERR_LEN, "%s: field 'weight_map': expected an object", index);
            rc = -1;
        } else {
            const char *k;
            json_t *v;
            void *tmp;
            json_object_foreach_safe(wm, tmp, k, v) {
                if (is_kv_scale_name(k)) json_object_del(wm, k);
            }
            json_object_foreach(h, k, v) {
                if (strcmp(k, "__metadata__"))
                    json_object_set_new(wm, k, json_string("kv_scales.safetensors"));
            }
            char *it = json_dumps(ix, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            rc = it ? kvd_write_file_atomic(index, it, strlen(it), err) : -1;
            free(it);
        }
        if (ix) json_decref(ix);
        if (rc) unlink(shard); /* without the index entry, the shard would be half an edit */
    }
    json_decref(h);
    return rc;
refuse:
    free(holds_scales);
    kvd_checkpoint_close(&c);
    return -1;
}