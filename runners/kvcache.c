/* kvdrift: paged KV cache. Blocks come from one fixed pool per layer, handed
 * out from a free list, so sequences of any length share the memory the way a
 * serving engine's cache does. */
#include "kvcache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const mode_names[KVD_KV_N_MODES] = {
    "bf16",           "fp8-cal",    "fp8-unscaled", "fp8-e5m2",   "fp8-ckpt",      "nvfp4-cal",
    "nvfp4-unscaled", "nvfp4-ckpt", "fp8-token",    "int8-token", "int8-token-rn", "int4-token"};

kvd_fmt kvd_kv_mode_fmt(kvd_kv_mode m) {
    switch (m) {
    case KVD_KV_BF16:
        return KVD_FMT_BF16;
    case KVD_KV_FP8_E5M2:
        return KVD_FMT_E5M2;
    case KVD_KV_NVFP4_CAL:
    case KVD_KV_NVFP4_UNSCALED:
    case KVD_KV_NVFP4_CKPT:
        return KVD_FMT_NVFP4;
    case KVD_KV_FP8_TOKEN:
        return KVD_FMT_E4M3T;
    case KVD_KV_INT8_TOKEN:
        return KVD_FMT_I8T;
    case KVD_KV_INT8_TOKEN_RN:
        return KVD_FMT_I8T_RN;
    case KVD_KV_INT4_TOKEN:
        return KVD_FMT_I4T;
    default:
        return KVD_FMT_E4M3;
    }
}

int kvd_kv_mode_scaled(kvd_kv_mode m) {
    return kvd_kv_mode_cal(m) || kvd_kv_mode_ckpt(m);
}

int kvd_kv_mode_ckpt(kvd_kv_mode m) {
    return m == KVD_KV_FP8_CKPT || m == KVD_KV_NVFP4_CKPT;
}

int kvd_kv_mode_cal(kvd_kv_mode m) {
    return m == KVD_KV_FP8_CAL || m == KVD_KV_NVFP4_CAL;
}

const char *kvd_kv_mode_unfit(kvd_kv_mode m, int head_dim) {
    static _Thread_local char why[96];
    const kvd_fmt f = kvd_kv_mode_fmt(m);
    if (f == KVD_FMT_NVFP4 && head_dim % KVD_NVFP4_GROUP != 0)
        snprintf(why, sizeof why, "head_dim %d is not a multiple of NVFP4's %d-value groups",
                 head_dim, KVD_NVFP4_GROUP);
    else if (f == KVD_FMT_I4T &&
             (head_dim < 32 || head_dim > KVD_RHT_MAX || (head_dim & (head_dim - 1))))
        snprintf(why, sizeof why,
                 "head_dim %d is not a power of two from 32 to %d (the Hadamard rotation's)",
                 head_dim, KVD_RHT_MAX);
    else
        return NULL;
    return why;
}

int kvd_kv_mode_fits(kvd_kv_mode m, int head_dim) {
    return kvd_kv_mode_unfit(m, head_dim) == NULL;
}

void kvd_kv_mode_names(char *s, size_t n, const char *last_sep) {
    size_t len = 0;
    s[0] = 0;
    for (int i = 0; i < KVD_KV_N_MODES && len < n; i++)
        len += (size_t)snprintf(s + len, n - len, "%s%s",
                                i == 0                    ? ""
                                : i + 1 == KVD_KV_N_MODES ? last_sep
                                                          : ", ",
                                mode_names[i]);
}

const char *kvd_kv_mode_name(kvd_kv_mode m) {
    return (unsigned)m < KVD_KV_N_MODES ? mode_names[m] : "?";
}

int kvd_kv_mode_parse(const char *s, kvd_kv_mode *m) {
    for (int i = 0; i < KVD_KV_N_MODES; i++)
        if (strcmp(s, mode_names[i]) == 0) {
            *m = (kvd_kv_mode)i;
            return 0;
        }
    return -1;
}

int kvd_kv_scales_init(kvd_kv_scales *s, int n_layers, int kv_heads) {
    s->n_layers = n_layers;
    s->kv_heads = kv_heads;
    s->per_head = 0;
    size_t n = (size_t)n_layers * (size_t)kv_heads;
    s->k = malloc(n * sizeof(float));
    s->v = malloc(n * sizeof(float));
    if (!s->k || !s->v) return -1;
    for (size_t i = 0; i < n; i++) s->k[i] = s->v[i] = 1.0f;
    s->n_heads = 0;
    s->q = NULL;
    return 0;
}

int kvd_kv_scales_init_q(kvd_kv_scales *s, int n_heads) {
    size_t n = (size_t)s->n_layers * (size_t)n_heads;
    free(s->q);
    s->q = malloc(n * sizeof(float));
    s->n_heads = s->q ? n_heads : 0;
    for (size_t i = 0; s->q && i < n; i++) s->q[i] = 1.0f;
    return s->q ? 0 : -1;
}

void kvd_kv_scales_free(kvd_kv_scales *s) {
    free(s->k);
    free(s->v);
    free(s->q);
    s->k = s->v = s->q = NULL;
    s->n_heads = 0;
}

int64_t kvd_kvcache_bytes_per_token(kvd_kv_mode mode, int n_layers, int kv_heads, int head_dim) {
    return 2 * (int64_t)n_layers * kv_heads *
           (int64_t)kvd_fmt_row_bytes(kvd_kv_mode_fmt(mode), head_dim);
}

int kvd_kvcache_init(kvd_kvcache *c, kvd_kv_mode mode, int n_layers, int kv_heads, int head_dim,
                     int block_size, int64_t capacity_tokens, const kvd_kv_scales *scales,
                     int saturate, char *err) {
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || kv_heads <= 0 || head_dim <= 0 || block_size <= 0 ||
        capacity_tokens <= 0) {
        snprintf(err, KVD_ERR_LEN,
                 "KV cache: expected positive layers, heads, head_dim, block size and capacity");
        return -1;
    }
    if (kvd_kv_mode_scaled(mode) && !scales) {
        snprintf(err, KVD_ERR_LEN, "KV cache mode %s: expected scales (%s)", kvd_kv_mode_name(mode),
                 kvd_kv_mode_ckpt(mode) ? "from the checkpoint given by --model-dir"
                                        : "run `kvdrift calibrate` or pass --scales FILE");
        return -1;
    }
    if (!kvd_kv_mode_fits(mode, head_dim)) {
        snprintf(err, KVD_ERR_LEN, "KV cache mode %s: %s", kvd_kv_mode_name(mode),
                 kvd_kv_mode_unfit(mode, head_dim));
        return -1;
    }
    if (scales && (scales->n_layers != n_layers || scales->kv_heads != kv_heads)) {
        snprintf(err, KVD_ERR_LEN,
                 "KV scales: expected %d full-attention layers x %d KV heads, got %d x %d",
                 n_layers, kv_heads, scales->n_layers, scales->kv_heads);
        return -1;
    }
    c->mode = mode;
    c->fmt = kvd_kv_mode_fmt(mode);
    c->saturate = saturate;
    c->n_layers = n_layers;
    c->kv_heads = kv_heads;
    c->head_dim = head_dim;
    c->block_size = block_size;
    int64_t nb = (capacity_tokens + block_size - 1) / block_size;
    if (nb > INT32_MAX) nb = INT32_MAX;
    c->n_blocks = (int)nb;
    size_t lk = (size_t)n_layers * (size_t)kv_heads;
    size_t pool =
        (size_t)nb * (size_t)kv_heads * (size_t)block_size * kvd_fmt_row_bytes(c->fmt, head_dim);
    c->k = calloc((size_t)n_layers, sizeof *c->k);
    c->v = calloc((size_t)n_layers, sizeof *c->v);
    c->k_scale = malloc(lk * sizeof(float));
    c->v_scale = malloc(lk * sizeof(float));
    c->k_absmax = calloc(lk, sizeof(float));
    c->v_absmax = calloc(lk, sizeof(float));
    c->k_stats = calloc((size_t)n_layers, sizeof *c->k_stats);
    c->v_stats = calloc((size_t)n_layers, sizeof *c->v_stats);
    c->free_list = malloc((size_t)nb * sizeof(int32_t));
    int ok = c->k && c->v && c->k_scale && c->v_scale && c->k_absmax && c->v_absmax && c->k_stats &&
             c->v_stats && c->free_list;
    for (int l = 0; ok && l < n_layers; l++) {
        c->k[l] = kvd_alloc_pool(pool);
        c->v[l] = kvd_alloc_pool(pool);
        ok = c->k[l] && c->v[l];
    }
    if (!ok) {
        snprintf(err, KVD_ERR_LEN, "KV cache: out of memory for %lld tokens (%zu bytes a layer)",
                 (long long)capacity_tokens, 2 * pool);
        kvd_kvcache_free(c);
        return -1;
    }
    for (size_t i = 0; i < lk; i++) {
        /* bf16 and the unscaled modes ignore any scales they are given:
         * that is what those modes mean */
        int use = scales && kvd_kv_mode_scaled(mode);
        /* calibrated scales are FP8's; a checkpoint's are used as they
         * are, as engines do */
        const int nv = mode == KVD_KV_NVFP4_CAL;
        c->k_scale[i] = !use ? 1.0f : nv ? kvd_nvfp4_global_scale(scales->k[i]) : scales->k[i];
        c->v_scale[i] = !use ? 1.0f : nv ? kvd_nvfp4_global_scale(scales->v[i]) : scales->v[i];
        if (!(c->k_scale[i] > 0.0f) || !(c->v_scale[i] > 0.0f) || !isfinite(c->k_scale[i]) ||
            !isfinite(c->v_scale[i])) {
            snprintf(err, KVD_ERR_LEN,
                     "KV scales: layer %zu head %zu: expected positive finite scales, got k=%g "
                     "v=%g",
                     i / (size_t)kv_heads, i % (size_t)kv_heads, c->k_scale[i], c->v_scale[i]);
            kvd_kvcache_free(c);
            return -1;
        }
    }
    /* lowest block ids come out first: the same run gives the same tables */
    for (int i = 0; i < c->n_blocks; i++) c->free_list[i] = c->n_blocks - 1 - i;
    c->n_free = c->n_blocks;
    return 0;
}

void kvd_kvcache_free(kvd_kvcache *c) {
    for (int l = 0; c->k && l < c->n_layers; l++) kvd_free_pool(c->k[l]);
    for (int l = 0; c->v && l < c->n_layers; l++) kvd_free_pool(c->v[l]);
    for (int s = 0; s < c->n_seqs; s++) free(c->seqs[s].blocks);
    free(c->k);
    free(c->v);
    free(c->k_scale);
    free(c->v_scale);
    free(c->k_absmax);
    free(c->v_absmax);
    free(c->q_scale);
    free(c->q_absmax);
    free(c->k_stats);
    free(c->v_stats);
    free(c->free_list);
    free(c->seqs);
    memset(c, 0, sizeof *c);
}

int kvd_kvcache_add_seq(kvd_kvcache *c) {
    for (int s = 0; s < c->n_seqs; s++)
        if (!c->seqs[s].live) {
            c->seqs[s].live = 1;
            c->seqs[s].len = 0;
            return s;
        }
    if (c->n_seqs == c->seq_cap) {
        int cap = c->seq_cap ? 2 * c->seq_cap : 16;
        kvd_kv_seq *n = realloc(c->seqs, (size_t)cap * sizeof *n);
        if (!n) return -1;
        c->seqs = n;
        c->seq_cap = cap;
    }
    kvd_kv_seq *q = &c->seqs[c->n_seqs];
    memset(q, 0, sizeof *q);
    q->live = 1;
    return c->n_seqs++;
}

int kvd_kvcache_reserve(kvd_kvcache *c, int seq, int len) {
    kvd_kv_seq *q = &c->seqs[seq];
    int need = (len + c->block_size - 1) / c->block_size;
    if (need - q->n_blocks > c->n_free) return -1;
    if (need > q->cap) {
        int cap = q->cap ? q->cap : 16;
        while (cap < need) cap *= 2;
        int32_t *b = realloc(q->blocks, (size_t)cap * sizeof(int32_t));
        if (!b) return -1;
        q->blocks = b;
        q->cap = cap;
    }
    while (q->n_blocks < need) q->blocks[q->n_blocks++] = c->free_list[--c->n_free];
    return 0;
}

void kvd_kvcache_release(kvd_kvcache *c, int seq) {
    kvd_kv_seq *q = &c->seqs[seq];
    while (q->n_blocks > 0) c->free_list[c->n_free++] = q->blocks[--q->n_blocks];
    q->len = 0;
    q->live = 0;
}

void kvd_kvcache_write(kvd_kvcache *c, int layer, int seq, int pos, const float *k,
                       const float *v) {
    kvd_kv_seq *q = &c->seqs[seq];
    int bs = c->block_size;
    size_t hd = (size_t)c->head_dim, blk = (size_t)q->blocks[pos / bs];
    for (int h = 0; h < c->kv_heads; h++) {
        size_t r = (blk * (size_t)c->kv_heads + (size_t)h) * (size_t)bs + (size_t)(pos % bs);
        size_t li = (size_t)layer * (size_t)c->kv_heads + (size_t)h;
        const float *kh = k + (size_t)h * hd, *vh = v + (size_t)h * hd;
        for (size_t i = 0; i < hd; i++) {
            float ak = fabsf(kh[i]), av = fabsf(vh[i]);
            if (ak > c->k_absmax[li]) c->k_absmax[li] = ak;
            if (av > c->v_absmax[li]) c->v_absmax[li] = av;
        }
        kvd_pool_quant_row(c->fmt, c->k[layer], bs, c->head_dim, r, kh, c->k_scale[li], c->saturate,
                           &c->k_stats[layer]);
        kvd_pool_quant_row(c->fmt, c->v[layer], bs, c->head_dim, r, vh, c->v_scale[li], c->saturate,
                           &c->v_stats[layer]);
    }
    if (pos + 1 > q->len) q->len = pos + 1;
}

kvd_kv_view kvd_kvcache_view(const kvd_kvcache *c, int layer) {
    kvd_kv_view v;
    v.fmt = c->fmt;
    v.block_size = c->block_size;
    v.kv_heads = c->kv_heads;
    v.head_dim = c->head_dim;
    v.k = c->k[layer];
    v.v = c->v[layer];
    v.k_scale = c->k_scale + (size_t)layer * (size_t)c->kv_heads;
    v.v_scale = c->v_scale + (size_t)layer * (size_t)c->kv_heads;
    v.portable = 0;
    v.q_scale = c->q_scale ? c->q_scale + (size_t)layer * (size_t)c->n_heads : NULL;
    v.p_fp8 = c->q_scale != NULL;
    return v;
}

int kvd_kvcache_attn_fp8(kvd_kvcache *c, int n_heads, const float *q_scale, char *err) {
    if (c->fmt != KVD_FMT_E4M3) {
        snprintf(err, KVD_ERR_LEN,
                 kvd_fmt_row_scaled(c->fmt)
                     ? "FP8 attention: expected an E4M3 cache with per-tensor scales, not %s "
                       "(FlashAttention 3 takes one scale a head; per-token scales are "
                       "dequantized first)"
                     : "FP8 attention: expected an E4M3 cache, not %s (FlashAttention 3 computes "
                       "in E4M3 only)",
                 kvd_kv_mode_name(c->mode));
        return -1;
    }
    if (n_heads <= 0 || n_heads % c->kv_heads) {
        snprintf(err, KVD_ERR_LEN, "FP8 attention: %d query heads over %d KV heads", n_heads,
                 c->kv_heads);
        return -1;
    }
    size_t n = (size_t)c->n_layers * (size_t)n_heads;
    float *qs = malloc(n * sizeof(float));
    if (!qs) {
        snprintf(err, KVD_ERR_LEN, "FP8 attention: out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        qs[i] = q_scale ? q_scale[i] : 1.0f;
        if (!(qs[i] > 0.0f) || !isfinite(qs[i])) {
            snprintf(err, KVD_ERR_LEN,
                     "FP8 attention: layer %zu query head %zu: expected a positive finite q "
                     "scale, got %g",
                     i / (size_t)n_heads, i % (size_t)n_heads, qs[i]);
            free(qs);
            return -1;
        }
    }
    free(c->q_scale);
    c->q_scale = qs;
    c->n_heads = n_heads;
    return 0;
}

int kvd_kvcache_fp8_attention(kvd_kvcache *c, const kvd_kv_scales *scales, int n_heads, char *err) {
    if (c->fmt != KVD_FMT_E4M3) return 0;
    const int scaled = kvd_kv_mode_scaled(c->mode);
    if (scaled && scales && scales->q && scales->n_heads != n_heads) {
        snprintf(err, KVD_ERR_LEN, "FP8 attention: %d query scales a layer, expected %d",
                 scales->n_heads, n_heads);
        return -1;
    }
    return kvd_kvcache_attn_fp8(c, n_heads, scaled && scales ? scales->q : NULL, err);
}

int kvd_kvcache_track_queries(kvd_kvcache *c, int n_heads) {
    if (c->q_scale && n_heads != c->n_heads) return -1;
    free(c->q_absmax);
    c->q_absmax = calloc((size_t)c->n_layers * (size_t)n_heads, sizeof(float));
    if (!c->q_absmax) return -1;
    c->n_heads = n_heads;
    return 0;
}

void kvd_kvcache_note_queries(kvd_kvcache *c, int layer, const float *q, int rows,
                              size_t row_stride, size_t head_stride) {
    if (c->q_absmax)
        kvd_absmax_heads(q, rows, row_stride, head_stride, c->n_heads, c->head_dim,
                         c->q_absmax + (size_t)layer * (size_t)c->n_heads);
}

int kvd_kvcache_fork(kvd_kvcache *c, int seq) {
    int len = c->seqs[seq].len;
    int to = kvd_kvcache_add_seq(c);
    if (to < 0) return -1;
    if (kvd_kvcache_reserve(c, to, len)) {
        kvd_kvcache_release(c, to);
        return -1;
    }
    size_t bb =
        (size_t)c->kv_heads * (size_t)c->block_size * kvd_fmt_row_bytes(c->fmt, c->head_dim);
    const kvd_kv_seq *s = &c->seqs[seq];
    kvd_kv_seq *d = &c->seqs[to];
    for (int l = 0; l < c->n_layers; l++)
        for (int b = 0; b < s->n_blocks && b < d->n_blocks; b++) {
            memcpy(c->k[l] + (size_t)d->blocks[b] * bb, c->k[l] + (size_t)s->blocks[b] * bb, bb);
            memcpy(c->v[l] + (size_t)d->blocks[b] * bb, c->v[l] + (size_t)s->blocks[b] * bb, bb);
        }
    d->len = len;
    return to;
}
