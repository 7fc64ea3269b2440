/* kvdrift: `forward`, `calibrate` and `export`: the model end to end over a
 * synthetic trace, the scales file, and the checkpoint export. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/calibset.h"
#include "../datasets/tokens.h"
#include "../runners/calibrate.h"
#include "../runners/drift.h"
#include "../runners/export.h"
#include "../runners/checkpoint.h"
#include "../runners/fileio.h"
#include "../runners/model.h"
#ifdef KVD_HAVE_CUDA
#include "../runners/engine.h"
#endif
#include "commands.h"
#include "util.h"

/* ---- shared: calibrated scales from a file or a fresh calibration ---- */

typedef struct {
    const char *scales_path;
    kvd_cal_recipe recipe;
    int per_head;
    int calib_tokens;
    const char *backend;
    kvd_backend be; /* backend's, after use_backend */
    int cal_given;  /* --calibration, --per-head or --calib-tokens named */
} cal_opts;

static int cal_flag(cal_opts *o, kvd_args *a, const char *f) {
    if (!strcmp(f, "--scales")) {
        o->scales_path = kvd_args_value(a, f);
    } else if (!strcmp(f, "--calibration")) {
        const char *v = kvd_args_value(a, f);
        if (kvd_cal_recipe_parse(v, &o->recipe))
            kvd_die(KVD_EXIT_USAGE, a->cmd,
                    "--calibration: expected absmax, modelopt or vllm-dynamic, got '%s'", v);
        o->cal_given = 1;
    } else if (!strcmp(f, "--per-head")) {
        o->per_head = o->cal_given = 1;
    } else if (!strcmp(f, "--calib-tokens")) {
        o->calib_tokens = (int)kvd_args_long(a, f, 1, 1 << 24);
        o->cal_given = 1;
    } else if (!strcmp(f, "--backend")) {
        o->backend = kvd_args_value(a, f);
    } else if (!strcmp(f, "--gpus")) {
        o->be.gpus = (int)kvd_args_long(a, f, 1, KVD_MAX_GPUS);
    } else {
        return 0;
    }
    return 1;
}

static void get_scales(const cal_opts *o, const kvd_weights *w, uint64_t seed, const char *cmd,
                       kvd_kv_scales *sc, kvd_kv_scales *am, int verbose) {
    char err[KVD_ERR_LEN];
    const kvd_config *c = &w->cfg;
    int nf = kvd_config_n_full(c);
    if (o->scales_path) {
        if (kvd_scales_load(o->scales_path, sc, nf, c->num_key_value_heads, c->num_attention_heads,
                            err))
            kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
        am->k = am->v = NULL;
        return;
    }
    kvd_check_positions(cmd, "--calib-tokens", o->calib_tokens, c);
    double t0 = kvd_now();
    if (kvd_calibrate_trace(&o->be, w, seed, o->calib_tokens, o->recipe, o->per_head, sc, am, err))
        kvd_die(1, cmd, "%s", err);
    if (verbose)
        printf("calibration: %s recipe, %s, %d held-out tokens (seed %llu), %.2f s\n",
               kvd_cal_recipe_name(o->recipe), o->per_head ? "per KV head" : "per layer",
               o->calib_tokens, (unsigned long long)(seed + KVD_CALIB_SEED_OFFSET), kvd_now() - t0);
}

/* ---- forward ---- */

typedef struct {
    int T, nf, kvh, hd;
    float *k, *v; /* [nf][T][kvh][hd] as computed, before the cache */
} kv_capture;

static void capture_kv(void *ctx, int al, int seq, int pos, const float *k, const float *v) {
    (void)seq;
    kv_capture *c = ctx;
    size_t row = (size_t)c->kvh * (size_t)c->hd, off = ((size_t)al * c->T + (size_t)pos) * row;
    memcpy(c->k + off, k, row * sizeof(float));
    memcpy(c->v + off, v, row * sizeof(float));
}

typedef struct {
    double kl_mean, kl_max, top1;
} logit_cmp;

static logit_cmp compare_logits(const float *ref, const float *x, int T, int V) {
    logit_cmp r = {0, 0, 0};
    for (int t = 0; t < T; t++) {
        kvd_logit_cmp c = kvd_compare_logits(ref + (size_t)t * V, x + (size_t)t * V, V, -1);
        r.kl_mean += c.kl / T;
        r.kl_max = c.kl > r.kl_max ? c.kl : r.kl_max;
        r.top1 += c.same_argmax / (double)T;
    }
    return r;
}

static void dump_mode(const char *dir, kvd_kv_mode mode, const kvd_kvcache *kv, int seq,
                      const kv_capture *cap, const float *logits, int V, const char *cmd) {
    char path[4400], err[KVD_ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, kvd_kv_mode_name(mode));
    if (kvd_mkdirs(path, err)) kvd_die(1, cmd, "%s", err);
    int T = cap->T;
    snprintf(path, sizeof path, "%s/%s/logits.f32", dir, kvd_kv_mode_name(mode));
    if (kvd_write_file_atomic(path, logits, sizeof(float) * (size_t)T * V, err))
        kvd_die(1, cmd, "%s", err);
    size_t row = (size_t)cap->kvh * cap->hd, rb = kvd_fmt_row_bytes(kv->fmt, cap->hd);
    uint8_t *codes = malloc((size_t)T * cap->kvh * rb);
    for (int l = 0; l < cap->nf; l++) {
        for (int w = 0; w < 2; w++) {
            const char *nm = w ? "v" : "k";
            snprintf(path, sizeof path, "%s/%s/%s_pre.%d.f32", dir, kvd_kv_mode_name(mode), nm, l);
            const float *src = (w ? cap->v : cap->k) + (size_t)l * T * row;
            if (kvd_write_file_atomic(path, src, sizeof(float) * (size_t)T * row, err))
                kvd_die(1, cmd, "%s", err);
            /* the stored rows in token order, gathered through the block table,
             * each as the codec writes it (a per-token row: codes, then scale) */
            const uint8_t *pool = w ? kv->v[l] : kv->k[l];
            for (int t = 0; t < T; t++)
                for (int h = 0; h < cap->kvh; h++) {
                    size_t blk = (size_t)kv->seqs[seq].blocks[t / kv->block_size];
                    size_t r = (blk * (size_t)kv->kv_heads + (size_t)h) * kv->block_size +
                               (size_t)(t % kv->block_size);
                    kvd_pool_get_row(kv->fmt, pool, kv->block_size, cap->hd, r,
                                     codes + ((size_t)t * cap->kvh + (size_t)h) * rb);
                }
            snprintf(path, sizeof path, "%s/%s/%s_cache.%d.bin", dir, kvd_kv_mode_name(mode), nm,
                     l);
            if (kvd_write_file_atomic(path, codes, (size_t)T * cap->kvh * rb, err))
                kvd_die(1, cmd, "%s", err);
        }
    }
    free(codes);
}

static const char *const forward_help =
    "usage: kvdrift forward [flags]\n"
    "Runs the model over a synthetic trace once per KV mode (BF16 first: the reference)\n"
    "and prints, per mode, prefill speed, cache size, what quantization did to K and V,\n"
    "and how far the next-token distribution moved from BF16.\n"
    "  --kv LIST               modes, comma separated (default "
    "bf16,fp8-cal,fp8-unscaled,fp8-e5m2; also fp8-ckpt, nvfp4-cal, nvfp4-unscaled, nvfp4-ckpt,\n"
    "                          fp8-token, int8-token, int8-token-rn, int4-token)\n"
    "  --tokens N              trace length (default 1024)\n"
    "  --seed N                trace seed (default 1)\n"
    "  --threads N             worker threads (default: every core)\n"
    "  --fp8-overflow sat|nan  E4M3 overflow: saturate to 448 (default) or NaN\n"
    "  --attn-fp8              E4M3 modes compute attention in FP8 as FlashAttention 3 does\n"
    "                          (the query and the softmax weights in E4M3)\n"
    "  --scales FILE           calibrated scales for fp8-cal (default: calibrate now)\n"
    "  --calibration RECIPE    absmax | modelopt | vllm-dynamic (default absmax)\n"
    "  --per-head              calibrate per KV head instead of per layer\n"
    "  --calib-tokens N        length of the held-out calibration trace "
    "(default " KVD_CALIB_TOKENS_TEXT ")\n"
    "  --dump DIR              write tokens, logits, K/V and cache bytes per mode to DIR\n"
    "  --backend cpu|cuda      where the model and calibration run (default cpu)\n"
    "  --gpus N                split the model over N GPUs (tensor parallelism; default 1)\n";

int kvd_cmd_forward(int argc, char **argv) {
    const char *cmd = "forward";
    kvd_args a = {argc, argv, 0, cmd};
    kvd_model_opts mo;
    kvd_model_opts_init(&mo);
    cal_opts co = {NULL, KVD_CAL_ABSMAX, 0, KVD_CALIB_TOKENS, "cpu", {NULL, 1}, 0};
    const char *kv_list = "bf16,fp8-cal,fp8-unscaled,fp8-e5m2", *dump = NULL;
    int T = 1024, saturate = 1, attn_fp8 = 0;
    uint64_t seed = 1;
    const char *f;
    while ((f = kvd_args_next(&a))) {
        if (kvd_model_opts_flag(&mo, &a, f) || cal_flag(&co, &a, f)) continue;
        if (!strcmp(f, "--kv")) {
            kv_list = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--tokens")) {
            T = (int)kvd_args_long(&a, f, 1, 1 << 24);
        } else if (!strcmp(f, "--seed")) {
            seed = (uint64_t)kvd_args_long(&a, f, 0, 2147483647L);
        } else if (!strcmp(f, "--threads")) {
            kvd_set_threads((int)kvd_args_long(&a, f, 1, 4096));
        } else if (!strcmp(f, "--fp8-overflow")) {
            const char *v = kvd_args_value(&a, f);
            if (strcmp(v, "sat") && strcmp(v, "nan"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--fp8-overflow: expected sat or nan, got '%s'", v);
            saturate = !strcmp(v, "sat");
        } else if (!strcmp(f, "--attn-fp8")) {
            attn_fp8 = 1;
        } else if (!strcmp(f, "--dump")) {
            dump = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("%s%s", forward_help, kvd_model_opts_help);
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s' (see kvdrift forward --help)", f);
        }
    }
    char err[KVD_ERR_LEN];
    kvd_use_backend(&co.be, co.backend, cmd, NULL, 0);
    /* modes: bf16 always runs first, as the reference */
    int want[KVD_KV_N_MODES] = {0};
    char list[256];
    snprintf(list, sizeof list, "%s", kv_list);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        kvd_kv_mode m;
        if (kvd_kv_mode_parse(tok, &m)) {
            char names[256];
            kvd_kv_mode_names(names, sizeof names, " or ");
            kvd_die(KVD_EXIT_USAGE, cmd, "--kv: unknown mode '%s', expected %s", tok, names);
        }
        want[m] = 1;
    }
    want[KVD_KV_BF16] = 1;
    kvd_check_scales_flags(cmd, co.scales_path, co.cal_given); /* before any work */

    kvd_weights w;
    double t0 = kvd_now();
    kvd_model_opts_build(&mo, cmd, &co.be, &w);
    const kvd_config *c = &w.cfg;
    kvd_check_positions(cmd, "--tokens", T, c);
    char desc[512];
    printf("model %s\n", kvd_describe_model(c, desc, sizeof desc));
    if (mo.model_dir)
        printf("weights: checkpoint %s (%d tensors, loaded in %.2f s)\n", mo.model_dir, w.n_tensors,
               kvd_now() - t0);
    else
        printf("weights: synthetic, seed %llu, BF16 (%d tensors, built in %.2f s)\n",
               (unsigned long long)mo.synth.seed, w.n_tensors, kvd_now() - t0);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    kvd_tokens_synth(seed, T, c->vocab_size, tok);
    printf("trace: %d synthetic tokens, seed %llu\n", T, (unsigned long long)seed);

    int nf = kvd_config_n_full(c), kvh = c->num_key_value_heads, V = c->vocab_size;
    kvd_kv_mode_require_fit(cmd, want, c->head_dim);
    kvd_kv_scales sc = {0}, am = {0}, ck = {0};
    kvd_model_opts_ckpt_scales(&mo, cmd, c, &ck, want);
    int need_cal = 0;
    for (int mi = 0; mi < KVD_KV_N_MODES; mi++)
        need_cal |= want[mi] && kvd_kv_mode_cal((kvd_kv_mode)mi);
    if (need_cal) {
        get_scales(&co, &w, seed, cmd, &sc, &am, 1);
        if (attn_fp8) kvd_check_query_scales(cmd, &sc, co.scales_path);
        for (int l = 0; l < nf; l++)
            for (int h = 0; h < (sc.per_head ? kvh : 1); h++)
                printf("  attention layer %d%s: k_scale %.6g  v_scale %.6g\n", l,
                       sc.per_head ? (h ? " (head 1+)" : " (head 0)") : "", sc.k[l * kvh + h],
                       sc.v[l * kvh + h]);
    }
    if (dump) {
        if (kvd_mkdirs(dump, err)) kvd_die(1, cmd, "%s", err);
        char path[4200];
        snprintf(path, sizeof path, "%s/tokens.i32", dump);
        if (kvd_write_file_atomic(path, tok, sizeof(int32_t) * (size_t)T, err))
            kvd_die(1, cmd, "%s", err);
        if (need_cal) {
            snprintf(path, sizeof path, "%s/scales.json", dump);
            if (kvd_scales_save(path, &sc, am.k ? &am : NULL, co.recipe, c->name, co.calib_tokens,
                                seed + KVD_CALIB_SEED_OFFSET, err))
                kvd_die(1, cmd, "%s", err);
        }
    }

    float *ref = malloc(sizeof(float) * (size_t)T * V), *lg = malloc(sizeof(float) * (size_t)T * V);
    kv_capture cap = {T, nf, kvh, c->head_dim, NULL, NULL};
    if (dump) {
        cap.k = malloc(sizeof(float) * (size_t)nf * T * kvh * c->head_dim);
        cap.v = malloc(sizeof(float) * (size_t)nf * T * kvh * c->head_dim);
    }
    if (!ref || !lg || (dump && (!cap.k || !cap.v)))
        kvd_die(1, cmd, "out of memory for %d x %d logits", T, V);
    printf("\n%-13s %12s %10s %8s %8s %8s %8s %9s %11s %10s\n", "kv_mode", "prefill_tok_s",
           "kv_B_tok", "k_sat_%", "k_ftz_%", "v_sat_%", "v_ftz_%", "v_subn_%", "kl_mean",
           "top1_agree");
    int rc = 0;
    for (int mi = 0; mi < KVD_KV_N_MODES; mi++) {
        if (!want[mi]) continue;
        kvd_kv_mode mode = (kvd_kv_mode)mi;
        kvd_kvcache kv;
        const kvd_kv_scales *msc = kvd_kv_mode_ckpt(mode)     ? &ck
                                   : kvd_kv_mode_scaled(mode) ? &sc
                                                              : NULL;
        if (kvd_kvcache_init(&kv, mode, nf, kvh, c->head_dim, KVD_KV_BLOCK, T, msc, saturate,
                             err) ||
            (attn_fp8 && kvd_kvcache_fp8_attention(&kv, msc, c->num_attention_heads, err)))
            kvd_die(1, cmd, "%s", err);
        int seq = kvd_kvcache_add_seq(&kv), failed;
        float *out = mode == KVD_KV_BF16 ? ref : lg;
        double ts = 0, dt = 0;
        kvd_engine m;
        if (kvd_engine_open(&m, &co.be, &w, &kv, T < 512 ? T : 512, 1, NULL, err))
            kvd_die(1, cmd, "%s", err);
        kvd_hooks hk = {.ctx = &cap, .kv = capture_kv};
        if (dump && kvd_engine_set_hooks(&m, &hk, err)) kvd_die(1, cmd, "%s", err);
        ts = kvd_now();
        failed = kvd_engine_prefill(&m, &kv, seq, tok, T, out, 1, err);
        dt = kvd_now() - ts;
        if (!failed && dump && kvd_engine_pull_cache(&m, &kv)) {
            snprintf(err, KVD_ERR_LEN, "copying the cache's bytes back failed");
            failed = 1;
        }
        kvd_engine_close(&m);
        if (failed) {
            fprintf(stderr, "kvdrift forward: kv mode %s: %s\n", kvd_kv_mode_name(mode), err);
            rc = 1;
            kvd_kvcache_free(&kv);
            continue;
        }
        uint64_t ks = 0, kf = 0, vs = 0, vf = 0, vsub = 0, kn = 0, vn = 0;
        for (int l = 0; l < nf; l++) {
            ks += kv.k_stats[l].saturated, kf += kv.k_stats[l].flushed, kn += kv.k_stats[l].n;
            vs += kv.v_stats[l].saturated, vf += kv.v_stats[l].flushed, vn += kv.v_stats[l].n;
            vsub += kv.v_stats[l].subnormal;
        }
        logit_cmp lc = compare_logits(ref, out, T, V);
        printf("%-13s %12.1f %10lld %8.3f %8.3f %8.3f %8.3f %9.3f %11.3e %10.4f\n",
               kvd_kv_mode_name(mode), T / dt,
               (long long)kvd_kvcache_bytes_per_token(mode, nf, kvh, c->head_dim), 100.0 * ks / kn,
               100.0 * kf / kn, 100.0 * vs / vn, 100.0 * vf / vn, 100.0 * vsub / vn, lc.kl_mean,
               lc.top1);
        if (dump) dump_mode(dump, mode, &kv, seq, &cap, out, V, cmd);
        kvd_kvcache_free(&kv);
    }
    printf("\nkl_mean: mean over positions of KL(P_bf16 || P_mode) of the next-token "
           "distribution (nats);\ntop1_agree: fraction of positions whose argmax matches BF16; "
           "sat/ftz/subn: share of\nK or V values that saturated, flushed to zero, or landed "
           "on a subnormal code.\n");
    free(ref);
    free(lg);
    free(cap.k);
    free(cap.v);
    free(tok);
    kvd_kv_scales_free(&sc);
    kvd_kv_scales_free(&am);
    kvd_kv_scales_free(&ck);
    kvd_weights_free(&w);
    return rc;
}

/* ---- calibrate ---- */

int kvd_cmd_calibrate(int argc, char **argv) {
    const char *cmd = "calibrate";
    kvd_args a = {argc, argv, 0, cmd};
    kvd_model_opts mo;
    kvd_model_opts_init(&mo);
    cal_opts co = {NULL, KVD_CAL_ABSMAX, 0, KVD_CALIB_TOKENS, "cpu", {NULL, 1}, 0};
    const char *out = NULL, *f;
    uint64_t seed = 1;
    int into = 0, replace = 0;
    while ((f = kvd_args_next(&a))) {
        if (kvd_model_opts_flag(&mo, &a, f) || cal_flag(&co, &a, f)) continue;
        if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--into-checkpoint")) {
            into = 1;
        } else if (!strcmp(f, "--replace")) {
            replace = 1;
        } else if (!strcmp(f, "--seed")) {
            seed = (uint64_t)kvd_args_long(&a, f, 0, 2147483647L);
        } else if (!strcmp(f, "--threads")) {
            kvd_set_threads((int)kvd_args_long(&a, f, 1, 4096));
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf(
                "usage: kvdrift calibrate [flags] -o scales.json\n"
                "       kvdrift calibrate --model-dir CKPT [flags] --into-checkpoint [-o FILE]\n"
                "  --into-checkpoint     write the scales into CKPT as engines read them\n"
                "                        (kv_scales.safetensors, ModelOpt's k_proj.k_scale and\n"
                "                        v_proj.v_scale names, the index updated); refused when\n"
                "                        it has scales already\n"
                "  --replace             with --into-checkpoint: remove the scales CKPT has\n"
                "                        (under any name engines read; e.g. ModelOpt's 1.0\n"
                "                        placeholders) from their files, then write the new ones\n"
                "  --calibration RECIPE  absmax | modelopt | vllm-dynamic (default absmax)\n"
                "  --per-head            one scale per KV head instead of per layer\n"
                "  --calib-tokens N      calibration trace length (default " KVD_CALIB_TOKENS_TEXT
                ", as run's)\n"
                "  --backend cpu|cuda    where the model runs (default cpu)\n"
                "  --gpus N              split it over N GPUs (default 1)\n"
                "  --seed N              seed; the calibration trace uses seed + %u\n%s",
                KVD_CALIB_SEED_OFFSET, kvd_model_opts_help);
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s' (see kvdrift calibrate --help)", f);
        }
    }
    if (!out && !into)
        kvd_die(KVD_EXIT_USAGE, cmd, "expected -o FILE for the scales, or --into-checkpoint");
    if (replace && !into) kvd_die(KVD_EXIT_USAGE, cmd, "--replace: expected --into-checkpoint");
    if (into && !mo.model_dir)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "--into-checkpoint: expected --model-dir CKPT (the checkpoint)");
    char oerr[KVD_ERR_LEN];
    if (out && kvd_output_check(out, oerr)) kvd_die(KVD_EXIT_USAGE, cmd, "-o: %s", oerr);
    if (co.scales_path) kvd_die(KVD_EXIT_USAGE, cmd, "--scales is an input of other commands");
    kvd_use_backend(&co.be, co.backend, cmd, NULL, 0);
    kvd_weights w;
    kvd_model_opts_build(&mo, cmd, &co.be, &w);
    char err[KVD_ERR_LEN];
    if (into && kvd_checkpoint_add_kv_scales(mo.model_dir, &w.cfg, NULL, 0, replace, NULL, err))
        kvd_die(KVD_EXIT_USAGE, cmd, "--into-checkpoint: %s", err);
    kvd_kv_scales sc, am;
    get_scales(&co, &w, seed, cmd, &sc, &am, 1);
    if (out && kvd_scales_save(out, &sc, &am, co.recipe, w.cfg.name, co.calib_tokens,
                               seed + KVD_CALIB_SEED_OFFSET, err))
        kvd_die(1, cmd, "%s", err);
    /* an NVFP4 KV cache takes the scales as its global scales: written as
     * nvfp4-cal computes them (the FP8 scales over E2M1's 6), so that
     * nvfp4-ckpt then is nvfp4-cal */
    int nv4 = 0;
    if (into) {
        char algo[32];
        if (kvd_checkpoint_kv_algo(mo.model_dir, algo, sizeof algo, err))
            kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
        nv4 = kvd_kv_algo_kind(algo) == KVD_KV_ALGO_NVFP4;
    }
    kvd_kv_scales ws = {0};
    if (nv4) {
        if (kvd_kv_scales_init(&ws, sc.n_layers, sc.kv_heads))
            kvd_die(1, cmd, "out of memory for the scales");
        ws.per_head = sc.per_head;
        for (int i = 0; i < sc.n_layers * sc.kv_heads; i++)
            ws.k[i] = kvd_nvfp4_global_scale(sc.k[i]), ws.v[i] = kvd_nvfp4_global_scale(sc.v[i]);
    }
    int replaced = 0;
    if (into && kvd_checkpoint_add_kv_scales(mo.model_dir, &w.cfg, nv4 ? &ws : &sc, co.per_head,
                                             replace, &replaced, err))
        kvd_die(1, cmd, "%s", err);
    int kvh = w.cfg.num_key_value_heads;
    for (int l = 0; l < sc.n_layers; l++)
        printf("attention layer %d: k_absmax %.6g -> k_scale %.6g, v_absmax %.6g -> v_scale %.6g\n",
               l, am.k[l * kvh], sc.k[l * kvh], am.v[l * kvh], sc.v[l * kvh]);
    if (out) printf("wrote %s\n", out);
    if (into && replaced)
        printf("removed the %d KV scale tensors %s had, and wrote the new scales into it "
               "(kv_scales.safetensors)\n",
               replaced, mo.model_dir);
    else if (into)
        printf("wrote the scales into %s (kv_scales.safetensors)\n", mo.model_dir);
    if (nv4)
        printf("the checkpoint asks for an NVFP4 KV cache: it got them as NVFP4 global scales, "
               "over 6 (absmax / 2688 by the absmax recipe; layer 0: k_scale %.6g, v_scale %.6g), "
               "as nvfp4-cal computes them\n",
               ws.k[0], ws.v[0]);
    kvd_kv_scales_free(&ws);
    kvd_kv_scales_free(&sc);
    kvd_kv_scales_free(&am);
    kvd_weights_free(&w);
    return 0;
}

/* ---- export ---- */

int kvd_cmd_export(int argc, char **argv) {
    const char *cmd = "export";
    kvd_args a = {argc, argv, 0, cmd};
    kvd_model_opts mo;
    kvd_model_opts_init(&mo);
    const char *out = NULL, *f;
    int f32 = 0;
    while ((f = kvd_args_next(&a))) {
        if (kvd_model_opts_flag(&mo, &a, f)) continue;
        if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--dtype")) {
            const char *v = kvd_args_value(&a, f);
            if (strcmp(v, "bf16") && strcmp(v, "f32"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--dtype: expected bf16 or f32, got '%s'", v);
            f32 = !strcmp(v, "f32");
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift export [flags] [--dtype bf16|f32] -o DIR\n"
                   "Writes DIR/config.json and DIR/model.safetensors (Hugging Face Qwen3-Next\n"
                   "tensor names) in BF16, or with --dtype f32 the weights' FP32 values\n"
                   "exactly (a checkpoint's FP8 or 4-bit weights as kvdrift dequantizes them).\n%s",
                   kvd_model_opts_help);
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s' (see kvdrift export --help)", f);
        }
    }
    if (!out) kvd_die(KVD_EXIT_USAGE, cmd, "expected -o DIR");
    kvd_weights w;
    kvd_model_opts_build(&mo, cmd, NULL, &w);
    char err[KVD_ERR_LEN];
    if (kvd_export(&w, out, f32, err)) kvd_die(1, cmd, "%s", err);
    int64_t n = 0;
    for (int i = 0; i < w.n_tensors; i++) n += w.tensors[i].numel;
    printf("wrote %s/config.json and %s/model.safetensors: %d tensors, %lld parameters (%s)\n", out,
           out, w.n_tensors, (long long)n, f32 ? "F32" : "BF16");
    kvd_weights_free(&w);
    return 0;
}
