/* kvdrift: real checkpoints. Load a Hugging Face Qwen3-Next-layout directory
 * (config.json + safetensors) as the model's weights, read the FP8 KV scales
 * a checkpoint carries, and audit what its quantization config makes an
 * engine do. */
#ifndef KVD_CHECKPOINT_H
#define KVD_CHECKPOINT_H

#include "kvcache.h"
#include "weights.h"

/* Weights from DIR; -1 with err naming the tensor or file on any problem. */
int kvd_weights_load(kvd_weights *w, const char *dir, char *err);
/* The same as lazy weights (see kvd_weights): every tensor found and
 * checked now, each made from the mapped file when an upload reads it. */
int kvd_weights_lazy_load(kvd_weights *w, const char *dir, char *err);

/* KV scales from the checkpoint's k_scale / v_scale tensors (ModelOpt's
 * self_attn.k_proj.k_scale or llm-compressor's self_attn.k_scale), a scalar
 * or one per KV head. found[l] (may be NULL) says whether layer l had both;
 * missing ones are 1.0, as an engine defaults them. Where any layer has a
 * query scale (FP8 attention's q_scale: q_proj.output_scale, attn.q_scale
 * or self_attn.q_scale; a scalar or one per query head), s->q holds them,
 * 1.0 in the layers without. Returns how many full-attention layers had
 * both KV scales. */
int kvd_checkpoint_kv_scales(const char *dir, const kvd_config *cfg, kvd_kv_scales *s, int *found,
                             char *err);

/* What the checkpoint's quantization config says. */
typedef struct {
    char source[64];      /* hf_quant_config.json, config.json:quantization_config, or none */
    char weight_algo[32]; /* FP8, NVFP4, ..., or none */
    char kv_algo[32];     /* FP8, none, or another KV cache format (NVFP4, INT8, ...) */
    char producer[64];    /* modelopt, compressed-tensors, fp8, ... */
    int n_attn, n_with_scales, n_with_q_scales;
    int scales_per_head;
    /* the values of the scales there are: their range for K and for V, how
     * many scale tensors hold 1.0 and nothing else (ModelOpt's export clamps
     * FP8 KV scales to at least 1.0: on K and V of ordinary magnitude that
     * is the cache an engine writes without scales), and the first scale
     * that is not a positive finite number or has too many values */
    float k_min, k_max, v_min, v_max;
    int n_unit_k, n_unit_v;
    char bad_scale[200];
    int missing_layers[KVD_MAX_LAYERS]; /* indices (model layer numbers) without scales */
    int n_missing;
    /* every tensor the config asks for is there, in BF16/F16/F32, or in FP8
     * or packed 4-bit (NVFP4, MXFP4) with its scales */
    int weights_loadable;
    int fp8_weights;      /* weight tensors stored in FP8 */
    int fp4_weights;      /* weight tensors stored as packed 4-bit codes */
    char unloadable[160]; /* the first weight tensor of a dtype not read at all (int8, ...) */
    char load_problem[KVD_ERR_LEN]; /* else why --model-dir cannot load it (a tensor the
                                       config asks for is missing, or of another shape) */
} kvd_audit;

/* Write KV scales into checkpoint DIR, as engines read them: a shard
 * kv_scales.safetensors with ModelOpt's names (model.layers.N.self_attn.
 * k_proj.k_scale / v_proj.v_scale, under the checkpoint's prefix), F32, one
 * value per layer or (per_head) one per KV head, and its entries in
 * model.safetensors.index.json when the checkpoint has one. Refused when the
 * checkpoint has scales already or the shard exists, unless replace: then
 * every KV scale tensor (under any name engines read) is first removed from
 * the file that holds it, each file rewritten whole and atomically with the
 * rest of its tensors as they were (*n_replaced: how many). -1 with err.
 * With sc NULL, only the checks. */
int kvd_checkpoint_add_kv_scales(const char *dir, const kvd_config *cfg, const kvd_kv_scales *sc,
                                 int per_head, int replace, int *n_replaced, char *err);

/* What identifies a checkpoint's contents for a resumed sweep, cheaply:
 * config.json, every safetensors file's name, size and header, the KV
 * scales' values, and 16 windows of 4 KiB spread evenly over each file's
 * data, hashed ("fnv1a64:<16 hex digits>"). A checkpoint copied elsewhere
 * keeps it; one rewritten with other shapes, dtypes, tensors, config or
 * scales does not, nor one whose weights were rewritten in place with the
 * same layout (a fine-tune saved over its base changes nearly every byte,
 * so every window; reading every byte of a 400 GB checkpoint per run would
 * take minutes). */
int kvd_checkpoint_fingerprint(const char *dir, char *out, size_t n, char *err);

int kvd_audit_dir(const char *dir, kvd_config *cfg, kvd_audit *a, char *err);
/* Only the KV cache quantization the checkpoint's quantization config asks
 * for (kvd_audit.kv_algo), without opening its weights. */
int kvd_checkpoint_kv_algo(const char *dir, char *algo, size_t n, char *err);
/* 0: no KV quantization asked for; 1: FP8; 3: NVFP4 (ModelOpt's
 * kv_cache_quant_algo "NVFP4"); 2: another format (INT8, compressed-tensors'
 * 4-bit float scheme, ...) that kvdrift's modes do not model. */
enum { KVD_KV_ALGO_NONE = 0, KVD_KV_ALGO_FP8 = 1, KVD_KV_ALGO_OTHER = 2, KVD_KV_ALGO_NVFP4 = 3 };
int kvd_kv_algo_kind(const char *algo);
/* The checkpoint-scale mode that runs a kind's cache (fp8-ckpt for FP8 and
 * formats not modelled, nvfp4-ckpt for NVFP4). */
const char *kvd_kv_algo_ckpt_mode(int kind);

/* What an audit finds about an FP8 or NVFP4 KV cache the checkpoint asks
 * for (all 0 when it asks for none): silent, layers without scales (the
 * engine uses 1.0 there); bad, a scale that is no positive finite number;
 * ones, the sides whose every scale is 1.0 (1 K, 2 V, 3 both: the cache of
 * no scales). At most one of the three is set. unmodelled: the checkpoint
 * asks for a KV cache format kvdrift does not model, which it cannot check. */
typedef struct {
    int fp8_kv, nvfp4_kv, silent, bad, ones, unmodelled;
} kvd_audit_finding;
kvd_audit_finding kvd_audit_find(const kvd_audit *a);
/* The sides a finding's ones names: "K and V" (3), "V" (2), "K" (1), "". */
const char *kvd_audit_sides(int ones);

/* The audit's facts as JSON (what `audit --format json` and a results
 * file's checkpoint_audit hold): quantization config, weights, the KV
 * scales there are, their values, and the finding. A new reference. */
struct json_t;
struct json_t *kvd_audit_json(const kvd_audit *a);

#endif
