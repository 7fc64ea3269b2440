/* kvdrift: the paged KV cache of the full-attention layers and its precision
 * modes. Quantize on write, dequantize in the attention kernel; every write
 * counts saturated and flushed-to-zero values per layer, for K and V. */
#ifndef KVD_KVCACHE_H
#define KVD_KVCACHE_H

#include <stdint.h>

#include "../kernels/kernels.h"
#include "config.h"

typedef enum {
    KVD_KV_BF16 = 0,
    KVD_KV_FP8_CAL,        /* E4M3, calibrated scales */
    KVD_KV_FP8_UNSCALED,   /* E4M3, scale 1.0: a checkpoint that asks for FP8 and gives none */
    KVD_KV_FP8_E5M2,       /* E5M2, scale 1.0 */
    KVD_KV_FP8_CKPT,       /* E4M3, the scales the checkpoint carries (1.0 where it has none) */
    KVD_KV_NVFP4_CAL,      /* NVFP4 (E2M1 values, E4M3 scales per 16), calibrated global scales */
    KVD_KV_NVFP4_UNSCALED, /* NVFP4, global scale 1.0: an NVFP4 cache with no scales given */
    KVD_KV_NVFP4_CKPT, /* NVFP4, the checkpoint's k_scale/v_scale as global scales (1.0 where none)
                        */
    KVD_KV_FP8_TOKEN,  /* E4M3, a scale per token and KV head made as the row is written
                          (vLLM's fp8_per_token_head): no calibration, no checkpoint scales */
    KVD_KV_INT8_TOKEN, /* INT8, a scale per token and KV head, truncated as vLLM's
                          int8_per_token_head writes it */
    KVD_KV_INT8_TOKEN_RN, /* the same, rounded to nearest: what truncation costs */
    KVD_KV_INT4_TOKEN,    /* INT4 with a zero point and a scale per token and KV head, after a
                             randomized Hadamard rotation (vLLM's int4_per_token_head) */
    KVD_KV_N_MODES
} kvd_kv_mode;

/* Tokens per cache block on the CPU. GPU engines use 16; on a CPU a head's
 * 16-token block (8 KiB at head_dim 256, BF16) is too short a run for the
 * hardware prefetchers, and decode attention at 32K tokens reads the cache
 * at about half the rate it does with 128-token blocks (bench kernels shows
 * both). */
#define KVD_KV_BLOCK 128

const char *kvd_kv_mode_name(kvd_kv_mode m);
/* The cache format a mode stores; whether it takes calibrated or checkpoint
 * scales (fp8-cal, fp8-ckpt, nvfp4-cal, nvfp4-ckpt); whether the checkpoint's
 * (fp8-ckpt, nvfp4-ckpt). */
kvd_fmt kvd_kv_mode_fmt(kvd_kv_mode m);
int kvd_kv_mode_scaled(kvd_kv_mode m);
int kvd_kv_mode_ckpt(kvd_kv_mode m);
/* The modes whose scales are calibrated (fp8-cal, nvfp4-cal). */
int kvd_kv_mode_cal(kvd_kv_mode m);
/* Whether a mode can cache rows of head_dim values (NVFP4: whole groups;
 * int4-token: a power of two its rotation takes); kvd_kv_mode_unfit: why
 * not ("head_dim 96 is not ..."), NULL where it can. */
int kvd_kv_mode_fits(kvd_kv_mode m, int head_dim);
const char *kvd_kv_mode_unfit(kvd_kv_mode m, int head_dim);
/* Every mode's name, ", " between them and last_sep before the last. */
void kvd_kv_mode_names(char *s, size_t n, const char *last_sep);
/* NVFP4's global scale from a calibrated FP8 scale (absmax / 448 by the
 * plain rule): over E2M1's largest value, so that the largest group's
 * block scale lands on E4M3's 448. nvfp4-cal's scales, and the ones
 * calibrate writes into an NVFP4 checkpoint. */
static inline float kvd_nvfp4_global_scale(float fp8_scale) {
    return fp8_scale / KVD_E2M1_MAX;
}
int kvd_kv_mode_parse(const char *s, kvd_kv_mode *m); /* 0 ok, -1 unknown */

typedef struct {
    int n_layers; /* full-attention layers */
    int kv_heads;
    int per_head; /* 1 when scales differ by KV head */
    float *k;     /* [n_layers][kv_heads] */
    float *v;
    /* the query's scales for FP8 attention (kvd_kvcache_attn_fp8), by query
     * head: [n_layers][n_heads]; NULL (n_heads 0) where none were made */
    int n_heads;
    float *q;
} kvd_kv_scales;

int kvd_kv_scales_init(kvd_kv_scales *s, int n_layers, int kv_heads); /* all 1.0, no q */
/* q scales for n_heads query heads, all 1.0 (0 ok, -1 out of memory) */
int kvd_kv_scales_init_q(kvd_kv_scales *s, int n_heads);
void kvd_kv_scales_free(kvd_kv_scales *s);

typedef struct {
    int len;      /* tokens written */
    int n_blocks; /* blocks held */
    int cap;      /* capacity of blocks[] */
    int32_t *blocks;
    int live;
} kvd_kv_seq;

typedef struct {
    kvd_kv_mode mode;
    kvd_fmt fmt;
    int saturate; /* SATFINITE (1) or NOSAT (0) */
    int n_layers, kv_heads, head_dim, block_size;
    int n_blocks, n_free;
    int32_t *free_list;
    uint8_t **k, **v;              /* per layer pools, [block][kv_head][slot][head_dim] */
    float *k_scale, *v_scale;      /* [n_layers][kv_heads] */
    kvd_qstats *k_stats, *v_stats; /* [n_layers] */
    float *k_absmax, *v_absmax;    /* pre-quantization, [n_layers][kv_heads] */
    int n_seqs, seq_cap;
    kvd_kv_seq *seqs;
    /* FP8 attention (kvd_kvcache_attn_fp8): the query's scales, [n_layers]
     * [n_heads], NULL without; the queries' absmax when tracked (the CPU
     * back end notes every query it attends with, for calibration) */
    int n_heads;
    float *q_scale, *q_absmax;
} kvd_kvcache;

/* A cache for capacity_tokens tokens (rounded up to whole blocks) over
 * n_layers full-attention layers. scales may be NULL (all 1.0); fp8-cal
 * needs them. */
int kvd_kvcache_init(kvd_kvcache *c, kvd_kv_mode mode, int n_layers, int kv_heads, int head_dim,
                     int block_size, int64_t capacity_tokens, const kvd_kv_scales *scales,
                     int saturate, char *err);
void kvd_kvcache_free(kvd_kvcache *c);

/* Sequences: add returns an id >= 0 (or -1 when full); reserve makes room for
 * len tokens (0 ok, -1 when the pool is out of blocks); release returns the
 * sequence's blocks to the pool. */
int kvd_kvcache_add_seq(kvd_kvcache *c);
int kvd_kvcache_reserve(kvd_kvcache *c, int seq, int len);
void kvd_kvcache_release(kvd_kvcache *c, int seq);
/* A new sequence holding a copy of seq's cache (for branching generation). */
int kvd_kvcache_fork(kvd_kvcache *c, int seq);

/* Quantize and store one token's K and V ([kv_heads][head_dim] each) at pos. */
void kvd_kvcache_write(kvd_kvcache *c, int layer, int seq, int pos, const float *k, const float *v);

/* FP8 attention over this E4M3 cache, as FlashAttention 3 computes it when
 * an engine runs an FP8 cache: the query written as E4M3 with q_scale
 * ([n_layers][n_heads]; NULL: 1.0, what an engine uses without one) and the
 * softmax weights rounded to E4M3 (kvd_kv_view). 0 ok; -1 (err) for a cache
 * that is not E4M3, or a scale that is not positive and finite. */
int kvd_kvcache_attn_fp8(kvd_kvcache *c, int n_heads, const float *q_scale, char *err);
/* The same for a sweep's cache of any mode: FP8 attention where the cache
 * is E4M3, a no-op elsewhere (BF16, E5M2: FlashAttention 3 has no such
 * path); the query's scales those of scales (scales->q) for the modes that
 * take scales (fp8-cal, fp8-ckpt) where it has them, else 1.0. */
int kvd_kvcache_fp8_attention(kvd_kvcache *c, const kvd_kv_scales *scales, int n_heads, char *err);
/* Keep the absmax of every query attended with, per layer and query head
 * (n_heads of them) in q_absmax: calibration's query scales. 0 ok. */
int kvd_kvcache_track_queries(kvd_kvcache *c, int n_heads);
/* Note rows queries ([rows][n_heads][head_dim], rows row_stride floats
 * apart, head_stride floats between heads) of layer. */
void kvd_kvcache_note_queries(kvd_kvcache *c, int layer, const float *q, int rows,
                              size_t row_stride, size_t head_stride);

/* The attention kernel's view of a layer. */
kvd_kv_view kvd_kvcache_view(const kvd_kvcache *c, int layer);

/* Bytes of cache per token (all layers, K and V) and in the pool in all. */
int64_t kvd_kvcache_bytes_per_token(kvd_kv_mode mode, int n_layers, int kv_heads, int head_dim);

#endif
