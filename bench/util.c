/* kvdrift: command-line plumbing (see util.h). */
#include "util.h"

#include "../kernels/backend.h"
#include "../runners/checkpoint.h"
#include "../runners/fileio.h"

#include <csv.h>
#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

_Noreturn void kvd_die(int code, const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvdrift %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

const char *kvd_args_next(kvd_args *a) {
    if (a->i >= a->argc) return NULL;
    return a->argv[a->i++];
}

const char *kvd_args_value(kvd_args *a, const char *flag) {
    if (a->i >= a->argc) kvd_die(KVD_EXIT_USAGE, a->cmd, "%s: expected a value", flag);
    return a->argv[a->i++];
}

long kvd_args_long(kvd_args *a, const char *flag, long lo, long hi) {
    const char *v = kvd_args_value(a, flag);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        kvd_die(KVD_EXIT_USAGE, a->cmd, "%s: expected an integer in %ld..%ld, got '%s'", flag, lo,
                hi, v);
    return x;
}

double kvd_args_double(kvd_args *a, const char *flag, double lo, double hi) {
    const char *v = kvd_args_value(a, flag);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        kvd_die(KVD_EXIT_USAGE, a->cmd, "%s: expected a number in [%g, %g], got '%s'", flag, lo, hi,
                v);
    return x;
}

const char *const kvd_model_opts_help =
    "  --model PRESET          tiny | small | qwen3-next-80b-a3b | qwen3.5-397b-a17b (default "
    "small)\n"
    "  --config FILE           a Hugging Face config.json instead of a preset\n"
    "  --model-dir DIR         real weights: a Hugging Face Qwen3-Next checkpoint directory\n"
    "  --activation-profile F  CSV layer,k_outlier_scale,v_rms: per-layer K/V magnitudes\n"
    "  --weight-seed N         seed of the synthetic weights (default 1234)\n"
    "  --k-outlier-scale X     |K| of the key outlier channels (default 320)\n"
    "  --k-outlier-channels N  key outlier channels per layer (default 4)\n"
    "  --v-rms X               rms of V entries (default 0.005)\n"
    "  --sink X                attention-sink strength (default 3.5)\n"
    "  --retrieval X           same-token retrieval strength (default 1.5)\n";

void kvd_model_opts_init(kvd_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = "small";
    kvd_synth_defaults(&o->synth);
}

int kvd_model_opts_flag(kvd_model_opts *o, kvd_args *a, const char *f) {
    if (!strcmp(f, "--model")) {
        o->preset = kvd_args_value(a, f);
    } else if (!strcmp(f, "--config")) {
        o->config_path = kvd_args_value(a, f);
    } else if (!strcmp(f, "--model-dir")) {
        o->model_dir = kvd_args_value(a, f);
    } else if (!strcmp(f, "--activation-profile")) {
        o->profile = kvd_args_value(a, f);
    } else if (!strcmp(f, "--weight-seed")) {
        o->synth.seed = (uint64_t)kvd_args_long(a, f, 0, 2147483647L);
    } else if (!strcmp(f, "--k-outlier-scale")) {
        o->synth.k_outlier_scale = (float)kvd_args_double(a, f, 1.0, 1e5);
    } else if (!strcmp(f, "--k-outlier-channels")) {
        o->synth.k_outlier_channels = (int)kvd_args_long(a, f, 0, 1024);
    } else if (!strcmp(f, "--v-rms")) {
        o->synth.v_rms = (float)kvd_args_double(a, f, 1e-6, 1e4);
    } else if (!strcmp(f, "--sink")) {
        o->synth.sink_strength = (float)kvd_args_double(a, f, 0.0, 100.0);
    } else if (!strcmp(f, "--retrieval")) {
        o->synth.retrieval_strength = (float)kvd_args_double(a, f, 0.0, 100.0);
    } else {
        return 0;
    }
    return 1;
}

/* ---- activation profile: layer,k_outlier_scale,v_rms (libcsv) ---- */

typedef struct {
    kvd_synth *s;
    const kvd_config *cfg;
    const char *path;
    char *err;
    int line, field, failed, col[3];
    char cur[3][64];
} profile_ctx;

static const char *const prof_cols[3] = {"layer", "k_outlier_scale", "v_rms"};

static void prof_field(void *data, size_t n, void *ctx) {
    profile_ctx *p = ctx;
    if (p->line == 0) {
        for (int k = 0; k < 3; k++)
            if (n == strlen(prof_cols[k]) && !memcmp(data, prof_cols[k], n)) p->col[k] = p->field;
    } else {
        for (int k = 0; k < 3; k++)
            if (p->col[k] == p->field)
                snprintf(p->cur[k], sizeof p->cur[k], "%.*s", (int)(n < 63 ? n : 63),
                         (const char *)data);
    }
    p->field++;
}

static void prof_row(int c, void *ctx) {
    (void)c;
    profile_ctx *p = ctx;
    int line = ++p->line;
    p->field = 0;
    if (p->failed) return;
    if (line == 1) {
        if (p->col[0] < 0 || (p->col[1] < 0 && p->col[2] < 0)) {
            snprintf(p->err, KVD_ERR_LEN,
                     "%s:1: expected a header with 'layer' and 'k_outlier_scale' and/or 'v_rms'",
                     p->path);
            p->failed = 1;
        }
        return;
    }
    char *end;
    long layer = strtol(p->cur[0], &end, 10);
    if (!p->cur[0][0] || *end || layer < 0 || layer >= p->cfg->num_hidden_layers) {
        snprintf(p->err, KVD_ERR_LEN, "%s:%d: column 'layer': expected 0..%d, got '%s'", p->path,
                 line, p->cfg->num_hidden_layers - 1, p->cur[0]);
        p->failed = 1;
        return;
    }
    for (int k = 1; k < 3; k++) {
        if (p->col[k] < 0 || !p->cur[k][0]) continue;
        double v = strtod(p->cur[k], &end);
        if (*end || !(v > 0) || v > 1e6) {
            snprintf(p->err, KVD_ERR_LEN,
                     "%s:%d: column '%s': expected a positive number, got '%s'", p->path, line,
                     prof_cols[k], p->cur[k]);
            p->failed = 1;
            return;
        }
        (k == 1 ? p->s->layer_k_scale : p->s->layer_v_rms)[layer] = (float)v;
    }
    memset(p->cur, 0, sizeof p->cur);
}

static int load_profile(const char *path, const kvd_config *cfg, kvd_synth *s, char *err) {
    size_t n;
    char *txt = kvd_read_file(path, &n, err);
    if (!txt) return -1;
    profile_ctx p = {s, cfg, path, err, 0, 0, 0, {-1, -1, -1}, {{0}}};
    struct csv_parser cp;
    csv_init(&cp, CSV_STRICT | CSV_APPEND_NULL);
    if (csv_parse(&cp, txt, n, prof_field, prof_row, &p) != n && !p.failed) {
        snprintf(err, KVD_ERR_LEN, "%s:%d: malformed CSV: %s", path, p.line + 1,
                 csv_strerror(csv_error(&cp)));
        p.failed = 1;
    }
    if (!p.failed) csv_fini(&cp, prof_field, prof_row, &p);
    csv_free(&cp);
    free(txt);
    return p.failed ? -1 : 0;
}

void kvd_model_opts_build(const kvd_model_opts *o, const char *cmd, const kvd_backend *be,
                          kvd_weights *w) {
    kvd_config cfg;
    char err[KVD_ERR_LEN];
    /* the device back end uploads the weights once, as BF16: made one tensor
     * at a time, they need host memory for the largest tensor only (a
     * 397B-shaped model's are 120 GB in FP32) */
    int lazy = be && be->ops && be->ops != &kvd_engine_cpu;
    if (o->model_dir) {
        if (o->profile)
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--activation-profile shapes synthetic weights, not --model-dir ones");
        if ((lazy ? kvd_weights_lazy_load : kvd_weights_load)(w, o->model_dir, err))
            kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
        return;
    }
    int rc = o->config_path ? kvd_config_load(o->config_path, &cfg, err)
                            : kvd_config_preset(o->preset, &cfg, err);
    if (rc) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    kvd_synth s = o->synth;
    if (o->profile && load_profile(o->profile, &cfg, &s, err))
        kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    if ((lazy ? kvd_weights_lazy_synth : kvd_weights_synth)(w, &cfg, &s, err))
        kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
}

void kvd_check_positions(const char *cmd, const char *flag, int64_t n, const kvd_config *c) {
    if (n > c->max_position_embeddings)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s: %lld tokens is beyond the model's max_position_embeddings %d", flag,
                (long long)n, c->max_position_embeddings);
}

void kvd_check_scales_flags(const char *cmd, const char *scales_path, int cal_given) {
    if (scales_path && cal_given)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "--scales gives fp8-cal's scales, and --calibration, --per-head and "
                "--calib-tokens make them: expected one or the other");
}

void kvd_check_query_scales(const char *cmd, const kvd_kv_scales *sc, const char *scales_path) {
    if (!sc->q)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "--attn-fp8: %s has no q_scale: fp8-cal's FP8 attention needs the query's "
                "scales (kvdrift calibrate writes them)",
                scales_path ? scales_path : "the calibration");
}

json_t *kvd_model_opts_weights_json(const kvd_model_opts *o, const kvd_config *cfg) {
    if (o->model_dir) {
        char fp[40], err[KVD_ERR_LEN];
        if (kvd_checkpoint_fingerprint(o->model_dir, fp, sizeof fp, err)) return NULL;
        return json_pack("{s:s, s:s}", "checkpoint", o->model_dir, "contents", fp);
    }
    kvd_synth s = o->synth;
    char err[KVD_ERR_LEN];
    json_t *j =
        json_pack("{s:I, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "seed", (json_int_t)s.seed,
                  "k_outlier_channels", s.k_outlier_channels, "k_outlier_scale",
                  (double)s.k_outlier_scale, "k_rms", (double)s.k_rms, "v_rms", (double)s.v_rms,
                  "layer_spread", (double)s.layer_spread, "sink_strength", (double)s.sink_strength,
                  "retrieval_strength", (double)s.retrieval_strength);
    if (o->profile) { /* the profile's values, not its name: the file may change */
        if (load_profile(o->profile, cfg, &s, err)) {
            json_decref(j);
            return NULL;
        }
        json_t *k = json_array(), *v = json_array();
        for (int l = 0; l < cfg->num_hidden_layers; l++) {
            json_array_append_new(k, json_real(s.layer_k_scale[l]));
            json_array_append_new(v, json_real(s.layer_v_rms[l]));
        }
        json_object_set_new(j, "layer_k_outlier_scale", k);
        json_object_set_new(j, "layer_v_rms", v);
    }
    return j;
}

void kvd_model_opts_ckpt_scales(const kvd_model_opts *o, const char *cmd, const kvd_config *cfg,
                                kvd_kv_scales *s, const int *run) {
    int first = -1;
    for (int m = 0; m < KVD_KV_N_MODES && first < 0; m++)
        if (run[m] && kvd_kv_mode_ckpt((kvd_kv_mode)m)) first = m;
    if (first < 0) return;
    char err[KVD_ERR_LEN];
    if (!o->model_dir)
        kvd_die(KVD_EXIT_USAGE, cmd, "--kv %s: expected --model-dir DIR (the checkpoint's scales)",
                kvd_kv_mode_name((kvd_kv_mode)first));
    int nf = kvd_config_n_full(cfg);
    int have = kvd_checkpoint_kv_scales(o->model_dir, cfg, s, NULL, err);
    if (have < 0) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    char algo[32];
    if (kvd_checkpoint_kv_algo(o->model_dir, algo, sizeof algo, err))
        kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    const int kind = kvd_kv_algo_kind(algo);
    /* scales that are there but 1.0 on a side are the same cache */
    int one[2] = {have == nf && nf > 0, have == nf && nf > 0};
    for (int i = 0; i < nf * s->kv_heads; i++) one[0] &= s->k[i] == 1.0f, one[1] &= s->v[i] == 1.0f;
    const char *side = kvd_audit_sides(one[0] | one[1] << 1);
    /* read once; each checkpoint mode run warns in its own name */
    for (int m = first; m < KVD_KV_N_MODES; m++) {
        if (!run[m] || !kvd_kv_mode_ckpt((kvd_kv_mode)m)) continue;
        const char *mn = kvd_kv_mode_name((kvd_kv_mode)m);
        if (kind == KVD_KV_ALGO_OTHER)
            fprintf(stderr,
                    "kvdrift %s: %s: the checkpoint asks for the KV cache format %s, which kvdrift "
                    "does not model: %s is %s cache with its k_scale/v_scale, not the cache an "
                    "engine would run\n",
                    cmd, o->model_dir, algo, mn,
                    kvd_kv_mode_fmt((kvd_kv_mode)m) == KVD_FMT_NVFP4 ? "an NVFP4" : "an FP8");
        else if (kind != KVD_KV_ALGO_NONE && strcmp(kvd_kv_algo_ckpt_mode(kind), mn))
            fprintf(stderr,
                    "kvdrift %s: %s: the checkpoint asks for an %s KV cache: %s is the cache an "
                    "engine would run, %s another format with the same scales\n",
                    cmd, o->model_dir, algo, kvd_kv_algo_ckpt_mode(kind), mn);
        if (have < nf)
            fprintf(stderr,
                    "kvdrift %s: %s: %d of %d full-attention layers have no k_scale/v_scale; %s "
                    "uses 1.0 there, as an engine does (\"Using FP8 KV cache but no scaling "
                    "factors provided. Defaulting to scaling factors of 1.0.\")\n",
                    cmd, o->model_dir, nf - have, nf, mn);
        if (side[0])
            fprintf(stderr,
                    "kvdrift %s: %s: every %s scale the checkpoint carries is 1.0 (ModelOpt clamps "
                    "KV scales to at least 1.0): %s writes %s as without scales, as an engine "
                    "does\n",
                    cmd, o->model_dir, side, mn, side);
    }
}

void kvd_kv_mode_require_fit(const char *cmd, const int *run, int head_dim) {
    for (int m = 0; m < KVD_KV_N_MODES; m++)
        if (run[m] && !kvd_kv_mode_fits((kvd_kv_mode)m, head_dim))
            kvd_die(KVD_EXIT_USAGE, cmd, "--kv %s: the model's %s",
                    kvd_kv_mode_name((kvd_kv_mode)m), kvd_kv_mode_unfit((kvd_kv_mode)m, head_dim));
}

void kvd_set_threads(int n) {
    if (n <= 0) return;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
}

double kvd_parse_bytes(const char *s) {
    static const struct {
        const char *unit;
        double mul;
    } units[] = {{"B", 1},
                 {"KiB", 1024.0},
                 {"MiB", 1048576.0},
                 {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0},
                 {"kB", 1e3},
                 {"KB", 1e3},
                 {"MB", 1e6},
                 {"GB", 1e9},
                 {"TB", 1e12}};
    char *end;
    const double v = strtod(s, &end);
    if (end == s || !isfinite(v) || !(v > 0)) return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit)) return isfinite(v * units[i].mul) ? v * units[i].mul : 0;
    return 0;
}

double kvd_kv_budget(const char *cmd, const char *s) {
    const double v = kvd_parse_bytes(s);
    if (v <= 0)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "--kv-budget: expected a size like 40GiB, 512MiB or 1.5TiB (B, KiB, MiB, GiB, "
                "TiB, kB, MB, GB, TB), got '%s'",
                s);
    return v;
}

int kvd_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

const char *kvd_describe_model(const kvd_config *c, char *buf, int len) {
    int nf = kvd_config_n_full(c);
    if (c->num_experts > 0) {
        snprintf(buf, (size_t)len,
                 "%s: hidden %d, %d layers (%d gated attention, %d Gated DeltaNet), "
                 "attention %d/%d heads x %d, MoE %d experts top-%d, vocab %d",
                 c->name, c->hidden_size, c->num_hidden_layers, nf, c->num_hidden_layers - nf,
                 c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->num_experts,
                 c->num_experts_per_tok, c->vocab_size);
    } else {
        snprintf(buf, (size_t)len,
                 "%s: hidden %d, %d layers (%d gated attention, %d Gated DeltaNet), "
                 "attention %d/%d heads x %d, dense SwiGLU %d, vocab %d",
                 c->name, c->hidden_size, c->num_hidden_layers, nf, c->num_hidden_layers - nf,
                 c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->intermediate_size,
                 c->vocab_size);
    }
    return buf;
}

void kvd_use_backend(kvd_backend *be, const char *name, const char *cmd, char *desc, int len) {
    char err[KVD_ERR_LEN];
    if (be->gpus < 1) be->gpus = 1;
    if (!(be->ops = kvd_engine_find(name, err))) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    if (be->ops == &kvd_engine_cpu) {
        if (be->gpus > 1) kvd_die(KVD_EXIT_USAGE, cmd, "--gpus %d: needs --backend cuda", be->gpus);
        if (desc) snprintf(desc, (size_t)len, "cpu (%d threads)", kvd_threads());
        return;
    }
    kvd_cuda_info ci;
    kvd_cuda_probe(&ci);
    if (ci.devices < 1) kvd_die(1, cmd, "--backend %s: %s", name, ci.name);
    if (ci.devices < be->gpus)
        kvd_die(1, cmd, "--gpus %d: only %d CUDA devices visible", be->gpus, ci.devices);
    if (desc) snprintf(desc, (size_t)len, be->gpus > 1 ? "%s x%d" : "%s", ci.name, be->gpus);
}
