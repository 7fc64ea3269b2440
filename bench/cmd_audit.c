/* kvdrift: `audit DIR`: read a checkpoint's config.json, its quantization
 * config (hf_quant_config.json or config.json's quantization_config) and
 * its safetensors headers, and say what an engine that honours them will do
 * to the KV cache, before anyone deploys it. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/checkpoint.h"
#include "commands.h"
#include "util.h"

int kvd_cmd_audit(int argc, char **argv) {
    const char *cmd = "audit", *dir = NULL, *f, *budget_s = "40GiB";
    int strict = 0, json = 0;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--strict")) {
            strict = 1;
        } else if (!strcmp(f, "--kv-budget")) {
            budget_s = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--format")) {
            const char *v = kvd_args_value(&a, f);
            if (strcmp(v, "json") && strcmp(v, "text"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--format: expected text or json, got '%s'", v);
            json = !strcmp(v, "json");
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift audit CHECKPOINT_DIR [--kv-budget 40GiB] [--strict] [--format "
                   "text|json]\n"
                   "Says what an engine that honours the checkpoint's quantization config does to\n"
                   "the KV cache. --strict: exit 1 when FP8 KV would be enabled without scales,\n"
                   "with every K or every V scale 1.0 (the same cache), or with a scale that is\n"
                   "not a positive finite number (the same for an NVFP4 KV cache's global\n"
                   "scales); and when the checkpoint asks for a KV cache format kvdrift does not\n"
                   "model (INT8, ...), which it cannot check.\n");
            return 0;
        } else if (f[0] == '-') {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        } else {
            dir = f;
        }
    }
    if (!dir) kvd_die(KVD_EXIT_USAGE, cmd, "expected a checkpoint directory");
    const double budget = kvd_kv_budget(cmd, budget_s);
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_audit au;
    if (kvd_audit_dir(dir, &cfg, &au, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    /* scales missing, unusable, or all 1.0 for K or for V: that side's
     * cache is the cache of no scales */
    const kvd_audit_finding fd = kvd_audit_find(&au);
    const int fp8_kv = fd.fp8_kv, nv = fd.nvfp4_kv, silent = fd.silent, bad = fd.bad,
              ones = fd.ones, unit = ones != 0, other = fd.unmodelled;
    char which[32];
    snprintf(which, sizeof which, "every %s scale", kvd_audit_sides(ones));
    char engine_unit[600];
    snprintf(engine_unit, sizeof engine_unit,
             "switches the KV cache to FP8 E4M3 and loads the checkpoint's k_scale/v_scale, "
             "but %s is 1.0: it writes that part of the cache as with no scales at all "
             "(ModelOpt's export clamps FP8 KV scales to at least 1.0, so K and V whose "
             "absmax is under 448 get exactly 1.0)",
             which);
    int nf = au.n_attn, kvh = cfg.num_key_value_heads, hd = cfg.head_dim;
    int64_t bpt16 = kvd_kvcache_bytes_per_token(KVD_KV_BF16, nf, kvh, hd);
    int64_t bpt8 = kvd_kvcache_bytes_per_token(KVD_KV_FP8_CAL, nf, kvh, hd);
    /* NVFP4 needs head_dim in whole groups of 16 */
    int64_t bpt4 = kvd_kv_mode_fits(KVD_KV_NVFP4_CAL, hd)
                       ? kvd_kvcache_bytes_per_token(KVD_KV_NVFP4_CAL, nf, kvh, hd)
                       : 0;
    char missing[1024] = "";
    for (int i = 0; i < au.n_missing; i++) {
        char one[16];
        snprintf(one, sizeof one, "%s%d", i ? ", " : "", au.missing_layers[i]);
        strncat(missing, one, sizeof missing - strlen(missing) - 1);
    }
    const char *engine, *advice;
    char engine_other[400];
    snprintf(engine_other, sizeof engine_other,
             "quantizes the KV cache as %s, a format kvdrift does not "
             "model: its fp8-* and nvfp4-* modes measure FP8 and NVFP4 caches, and neither "
             "fp8-ckpt nor nvfp4-ckpt is the cache this engine would run",
             au.kv_algo);
    char nv_unit[600];
    snprintf(nv_unit, sizeof nv_unit,
             "switches the KV cache to NVFP4 and takes the checkpoint's k_scale/v_scale as its "
             "global scales, but %s is 1.0: it writes that part of the cache as with no scales "
             "at all",
             which);
    if (nv) { /* the NVFP4 cache: the same findings, its own words */
        engine = silent ? "switches the KV cache to NVFP4 because kv_cache_quant_algo is NVFP4, "
                          "finds no k_scale/v_scale for the layers listed, and uses a global "
                          "scale of 1.0 for K and V there (vLLM's and SGLang's NVFP4 caches "
                          "default them to 1.0): each group's E4M3 block scale is then its largest "
                          "value over 6, and groups whose largest value is under 0.006 are "
                          "stored as zeros"
                 : bad  ? "switches the KV cache to NVFP4 with a global scale that is not a "
                          "positive finite number: what it writes into the cache is undefined "
                          "(kvdrift's nvfp4-ckpt refuses such scales)"
                 : unit ? nv_unit
                        : "switches the KV cache to NVFP4 and takes the checkpoint's "
                          "k_scale/v_scale as each full-attention layer's global scales";
        advice = silent ? "do not deploy as is: add k_scale/v_scale to every full-attention "
                          "layer (kvdrift calibrate --model-dir DIR --into-checkpoint writes "
                          "NVFP4 global scales), or serve with an FP8 or BF16 KV cache; measure "
                          "the cost first with kvdrift run --model-dir DIR --kv "
                          "bf16,fp8-cal,nvfp4-ckpt,nvfp4-cal"
                 : bad  ? "do not deploy as is: replace the scales, or serve with an FP8 or BF16 "
                          "KV cache"
                 : unit ? "the scales are placeholders: measure what they cost with kvdrift run "
                          "--model-dir DIR --kv bf16,nvfp4-ckpt,nvfp4-cal (nvfp4-cal: absmax / "
                          "2688), then replace them or serve with an FP8 or BF16 KV cache"
                        : "the checkpoint carries its scales; check what they cost against "
                          "calibrated ones and against FP8 with kvdrift run --model-dir DIR --kv "
                          "bf16,fp8-cal,nvfp4-ckpt,nvfp4-cal";
    } else if (other) {
        engine = engine_other;
        advice = "kvdrift cannot vouch for this KV cache: measure it in the engine that serves it, "
                 "or serve with an FP8 KV cache (measure it with kvdrift run --model-dir DIR --kv "
                 "bf16,fp8-cal) or a BF16 one";
    } else if (silent) {
        engine =
            "switches the KV cache to FP8 E4M3 because kv_cache_quant_algo is FP8, finds no "
            "k_scale/v_scale for the layers listed, and uses 1.0 for K and V there (SGLang "
            "warns \"Using FP8 KV cache but no scaling factors provided. Defaulting to scaling "
            "factors of 1.0.\"; vLLM does the same)";
        advice = "do not deploy as is: add k_scale/v_scale to every full-attention layer "
                 "(kvdrift calibrate --model-dir DIR --into-checkpoint writes them, or your "
                 "quantizer's KV calibration), serve with per-token scales, which need none "
                 "(vLLM's --kv-cache-dtype fp8_per_token_head), or with an explicit BF16 KV "
                 "cache; measure the cost first with kvdrift run --model-dir DIR --kv "
                 "bf16,fp8-ckpt,fp8-cal,fp8-token";
    } else if (bad) {
        engine = "switches the KV cache to FP8 E4M3 with a scale that is not a positive finite "
                 "number: what it writes into the cache is undefined (kvdrift's fp8-ckpt refuses "
                 "such scales)";
        advice = "do not deploy as is: replace the scales (kvdrift calibrate --model-dir DIR "
                 "--into-checkpoint --replace), or serve with an explicit BF16 KV cache";
    } else if (unit) {
        engine = engine_unit;
        advice = "the scales are placeholders: measure what they cost with kvdrift run "
                 "--model-dir DIR --kv bf16,fp8-ckpt,fp8-cal (fp8-cal: absmax / 448, unclamped), "
                 "then replace them with calibrated ones (kvdrift calibrate --model-dir DIR "
                 "--into-checkpoint --replace) or serve with an explicit BF16 KV cache";
    } else if (fp8_kv) {
        engine = "switches the KV cache to FP8 E4M3 and loads the checkpoint's k_scale/v_scale for "
                 "every full-attention layer";
        advice = "the checkpoint carries its scales; check what they cost against calibrated ones "
                 "with kvdrift run --model-dir DIR --kv bf16,fp8-ckpt,fp8-cal";
    } else {
        engine = "keeps the KV cache in the model's dtype (BF16): the checkpoint asks for no KV "
                 "quantization";
        advice = "an FP8 KV cache would hold 2x the tokens; measure what it costs with kvdrift run "
                 "--model-dir DIR --kv bf16,fp8-cal before turning it on";
    }
    /* an FP8 cache on FlashAttention 3 computes attention in FP8 too, with
     * the query scales the checkpoint carries (vLLM warns "Using
     * uncalibrated q_scale 1.0" where it has none) */
    char qs_have[160], fp8_attn_text[600];
    if (au.n_with_q_scales == 0)
        snprintf(qs_have, sizeof qs_have, "with q_scale 1.0 (the checkpoint carries none)");
    else if (au.n_with_q_scales == au.n_attn)
        snprintf(qs_have, sizeof qs_have,
                 "with the checkpoint's q_scale (every full-attention layer has one)");
    else
        snprintf(qs_have, sizeof qs_have,
                 "with the checkpoint's q_scale in %d of %d full-attention layers and 1.0 in "
                 "the others",
                 au.n_with_q_scales, au.n_attn);
    snprintf(fp8_attn_text, sizeof fp8_attn_text,
             "on FlashAttention 3 (vLLM's choice on Hopper) an engine with this FP8 cache also "
             "writes the query as E4M3, %s, and rounds the softmax weights to E4M3: kvdrift run "
             "--model-dir DIR --kv fp8-ckpt --attn-fp8 measures that too",
             qs_have);
    const char *fp8_attn = fp8_kv && !other ? fp8_attn_text : NULL;
    if (json) {
        /* the facts, and what follows from them here */
        json_t *o = kvd_audit_json(&au);
        json_object_set_new(o, "checkpoint", json_string(dir));
        json_object_set_new(o, "engine_behaviour", json_string(engine));
        json_object_set_new(o, "recommendation", json_string(advice));
        json_object_set_new(o, "fp8_attention", fp8_attn ? json_string(fp8_attn) : json_null());
        json_object_set_new(o, "kv_bytes_per_token",
                            json_pack("{s:I, s:I, s:I}", "bf16", (json_int_t)bpt16, "fp8",
                                      (json_int_t)bpt8, "nvfp4", (json_int_t)bpt4));
        json_object_set_new(o, "tokens_in_budget",
                            json_pack("{s:f, s:I, s:I}", "budget_bytes", budget, "bf16",
                                      (json_int_t)floor(budget / (double)bpt16), "fp8",
                                      (json_int_t)floor(budget / (double)bpt8)));
        char *txt = json_dumps(o, JSON_INDENT(2));
        printf("%s\n", txt);
        free(txt);
        json_decref(o);
    } else {
        printf("checkpoint %s: %d layers, %d full attention (KV heads %d x head_dim %d)\n", dir,
               cfg.num_hidden_layers, nf, kvh, hd);
        if (au.weights_loadable && (au.fp8_weights || au.fp4_weights)) {
            char what[96];
            if (au.fp8_weights && au.fp4_weights)
                snprintf(what, sizeof what, "%d FP8 and %d packed 4-bit (NVFP4/MXFP4)",
                         au.fp8_weights, au.fp4_weights);
            else if (au.fp8_weights)
                snprintf(what, sizeof what, "%d FP8", au.fp8_weights);
            else
                snprintf(what, sizeof what, "%d packed 4-bit (NVFP4/MXFP4)", au.fp4_weights);
            printf("weights: %s tensors with their scales (dequantized to FP32 on load), "
                   "the rest BF16/F16/F32: loadable with --model-dir\n",
                   what);
        } else if (au.weights_loadable)
            printf("weights: BF16/F16/F32, loadable with --model-dir\n");
        else if (au.unloadable[0])
            printf("weights: quantized; not loadable for compute: first such tensor\n  %s\n",
                   au.unloadable);
        else
            printf("weights: not loadable with --model-dir: %s\n", au.load_problem);
        printf("quantization config: %s%s%s%s: weights %s, KV cache %s\n", au.source,
               au.producer[0] ? " (" : "", au.producer, au.producer[0] ? ")" : "", au.weight_algo,
               au.kv_algo);
        printf("KV scales: %d of %d full-attention layers have k_scale and v_scale%s%s%s%s\n",
               au.n_with_scales, nf, au.scales_per_head ? " (per KV head)" : "",
               au.n_missing ? "; missing in layers " : "", missing, "");
        if (au.bad_scale[0])
            printf("KV scale values: unusable: %s (expected positive finite numbers)\n",
                   au.bad_scale);
        else if (au.n_with_scales)
            printf("KV scale values: K %g to %g, V %g to %g; %d of %d K and %d of %d V scales are "
                   "exactly 1.0\n",
                   au.k_min, au.k_max, au.v_min, au.v_max, au.n_unit_k, au.n_with_scales,
                   au.n_unit_v, au.n_with_scales);
        printf("an engine that honours this checkpoint %s\n", engine);
        printf("KV cache: bf16 %lld bytes/token, %.0f tokens in %s; fp8 %lld bytes/token, %.0f "
               "tokens",
               (long long)bpt16, floor(budget / (double)bpt16), budget_s, (long long)bpt8,
               floor(budget / (double)bpt8));
        if (bpt4)
            printf("; nvfp4 %lld bytes/token, %.0f tokens", (long long)bpt4,
                   floor(budget / (double)bpt4));
        printf("\n");
        printf("recommendation: %s\n", advice);
        if (fp8_attn) printf("FP8 attention: %s\n", fp8_attn);
        const char *kvf = nv ? "NVFP4" : "FP8";
        if (silent) printf("VERDICT: %s KV cache without scales (silent scale 1.0)\n", kvf);
        if (bad) printf("VERDICT: %s KV cache with an unusable scale (%s)\n", kvf, au.bad_scale);
        if (unit)
            printf("VERDICT: %s KV cache with %s 1.0 (the same as without scales)\n", kvf, which);
        if (other)
            printf("VERDICT: %s KV cache, which kvdrift does not model (not checked)\n",
                   au.kv_algo);
    }
    /* --strict passes only what it checked: a KV format it cannot model fails too */
    return strict && (silent || bad || unit || other) ? 1 : 0;
}
