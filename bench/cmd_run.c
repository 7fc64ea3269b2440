/* kvdrift: `run`, the sweep. Cells are (kind, KV mode, concurrency, context,
 * trace): drift cells run the candidate in lock step with the BF16 reference
 * at concurrency 1 (every mode of a trace against one reference run);
 * throughput cells time prefill and batched decode at each
 * concurrency. After every finished cell (or group of drift cells) the
 * results file is rewritten whole (atomically), so a sweep that dies keeps
 * every finished cell and a rerun of the same command resumes. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gitrev.h" /* KVD_GIT_REV: a resumed file must be this build's */
#ifdef KVD_HAVE_CUDA
#include "../kernels/cuda/cuda_kernels.h"
#endif
#include "../datasets/calibset.h"
#include "../datasets/trace.h"
#include "../reports/report.h"
#include "../runners/calibrate.h"
#include "../runners/checkpoint.h"
#include "../runners/drift.h"
#include "../runners/fileio.h"
#include "../runners/model.h"
#include "commands.h"
#include "results.h"
#include "util.h"

#define MAX_LIST 16

typedef struct {
    kvd_model_opts mo;
    int modes[KVD_KV_N_MODES], n_modes;
    int conc[MAX_LIST], n_conc;
    int64_t ctx[MAX_LIST];
    int n_ctx;
    int traces;
    uint64_t seed;
    const char *out, *backend;
    kvd_backend be; /* backend's, with the GPUs */
    kvd_cal_recipe recipe;
    int per_head, calib_tokens;
    int cal_given; /* --calibration, --per-head or --calib-tokens named */
    double kv_budget;
    kvd_drift_opts dopt;
    int decode_tokens;
    int repeats; /* timed decode passes per throughput cell, after a warm-up pass */
    int attn_per_head;
    int cells;               /* 1: drift cells, 2: throughput cells */
    const char *scales_path; /* fp8-cal scales from a file instead of calibrating */
    char *owned[64];         /* strings a spec file provided, freed at the end */
    int n_owned;
} run_opts;

static char *own(run_opts *o, const char *s) {
    char *d = strdup(s);
    if (o->n_owned < 64) {
        o->owned[o->n_owned++] = d;
    }
    return d;
}

/* A comma-separated list into its items (each at most 63 characters);
 * -1 on an empty item ("1,,2", a trailing comma) or more than max. */
static int split_list(const char *s, char item[][64], int max) {
    int n = 0;
    for (const char *p = s;; p++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || len > 63 || n == max) return -1;
        memcpy(item[n], p, len);
        item[n++][len] = 0;
        if (!e) return n;
        p = e;
    }
}

/* the index of the first value listed twice, or -1: a list whose items
 * repeat would run (or skip) the same cell twice */
static int repeated(const int64_t *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++)
            if (v[i] == v[j]) return i;
    return -1;
}

/* A flag's list of numbers: exits naming the flag on a value listed twice */
static void refuse_repeats(const char *cmd, const char *flag, const int64_t *v, int n,
                           const char *val) {
    const int r = repeated(v, n);
    if (r >= 0)
        kvd_die(KVD_EXIT_USAGE, cmd, "%s: %lld is listed twice in '%s'", flag, (long long)v[r],
                val);
}

static int parse_list(const char *s, int64_t *out, int max, int64_t lo, int64_t hi) {
    char item[MAX_LIST][64];
    int n = split_list(s, item, max);
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(item[i], &end, 10);
        if (errno || *end || v < lo || v > hi) return -1;
        out[i] = v;
    }
    return n;
}

static int parse_modes(const char *s, run_opts *o) {
    char item[KVD_KV_N_MODES][64];
    int n = split_list(s, item, KVD_KV_N_MODES);
    for (int i = 0; i < n; i++) {
        kvd_kv_mode m;
        if (kvd_kv_mode_parse(item[i], &m)) return -1;
        o->modes[i] = m;
    }
    o->n_modes = n > 0 ? n : 0;
    return n > 0 ? 0 : -1;
}

/* One of run's settings, the flag f and (where it takes one) its value next
 * in a; the same checks for the command line and a spec file. 0 when f is
 * not one of run's flags. */
static int run_flag(run_opts *o, kvd_args *a, const char *f) {
    const char *cmd = a->cmd;
    int64_t tmp[MAX_LIST];
    int n;
    if (kvd_model_opts_flag(&o->mo, a, f)) return 1;
    if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
        o->out = kvd_args_value(a, f);
    } else if (!strcmp(f, "--traces")) {
        o->traces = (int)kvd_args_long(a, f, 1, 10000);
    } else if (!strcmp(f, "--seed")) {
        o->seed = (uint64_t)kvd_args_long(a, f, 0, 2147483647L);
    } else if (!strcmp(f, "--per-head")) {
        o->per_head = 1;
        o->cal_given = 1;
    } else if (!strcmp(f, "--attn-per-head")) {
        o->attn_per_head = 1;
    } else if (!strcmp(f, "--attn-fp8")) {
        o->dopt.attn_fp8 = 1;
    } else if (!strcmp(f, "--fp8-overflow")) {
        const char *val = kvd_args_value(a, f);
        if (strcmp(val, "sat") && strcmp(val, "nan"))
            kvd_die(KVD_EXIT_USAGE, cmd, "--fp8-overflow: expected sat or nan, got '%s'", val);
        o->dopt.saturate = !strcmp(val, "sat");
    } else if (!strcmp(f, "--scales")) {
        o->scales_path = kvd_args_value(a, f);
    } else if (!strcmp(f, "--calib-tokens")) {
        o->calib_tokens = (int)kvd_args_long(a, f, 1, 1 << 24);
        o->cal_given = 1;
    } else if (!strcmp(f, "--sample-every")) {
        o->dopt.sample_every = (int)kvd_args_long(a, f, 1, 1 << 20);
    } else if (!strcmp(f, "--gen-tokens")) {
        o->dopt.gen_tokens = (int)kvd_args_long(a, f, 0, 1 << 16);
    } else if (!strcmp(f, "--decode-tokens")) {
        o->decode_tokens = (int)kvd_args_long(a, f, 2, 1 << 16);
    } else if (!strcmp(f, "--repeats")) {
        o->repeats = (int)kvd_args_long(a, f, 1, 1000);
    } else if (!strcmp(f, "--threads")) {
        kvd_set_threads((int)kvd_args_long(a, f, 1, 4096));
    } else if (!strcmp(f, "--kv")) {
        const char *val = kvd_args_value(a, f);
        if (parse_modes(val, o)) {
            char names[256];
            kvd_kv_mode_names(names, sizeof names, ", ");
            kvd_die(KVD_EXIT_USAGE, cmd, "--kv: expected a list of %s, got '%s'", names, val);
        }
        for (int i = 0; i < o->n_modes; i++) tmp[i] = o->modes[i];
        const int r = repeated(tmp, o->n_modes);
        if (r >= 0)
            kvd_die(KVD_EXIT_USAGE, cmd, "--kv: %s is listed twice in '%s'",
                    kvd_kv_mode_name((kvd_kv_mode)o->modes[r]), val);
    } else if (!strcmp(f, "--concurrency")) {
        const char *val = kvd_args_value(a, f);
        if ((n = parse_list(val, tmp, MAX_LIST, 1, 1024)) <= 0)
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--concurrency: expected a list of up to %d levels in 1..1024, got '%s'",
                    MAX_LIST, val);
        refuse_repeats(cmd, f, tmp, n, val);
        o->n_conc = n;
        for (int i = 0; i < n; i++) o->conc[i] = (int)tmp[i];
    } else if (!strcmp(f, "--context")) {
        const char *val = kvd_args_value(a, f);
        if ((n = parse_list(val, tmp, MAX_LIST, 16, 1 << 24)) <= 0)
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--context: expected a list of up to %d token counts >= 16, got '%s'", MAX_LIST,
                    val);
        refuse_repeats(cmd, f, tmp, n, val);
        o->n_ctx = n;
        for (int i = 0; i < n; i++) o->ctx[i] = tmp[i];
    } else if (!strcmp(f, "--kv-budget")) {
        o->kv_budget = kvd_kv_budget(cmd, kvd_args_value(a, f));
    } else if (!strcmp(f, "--calibration")) {
        const char *val = kvd_args_value(a, f);
        if (kvd_cal_recipe_parse(val, &o->recipe))
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--calibration: expected absmax, modelopt or vllm-dynamic, got '%s'", val);
        o->cal_given = 1;
    } else if (!strcmp(f, "--cells")) {
        const char *val = kvd_args_value(a, f);
        char item[4][64];
        int k = split_list(val, item, 4);
        o->cells = 0;
        for (int i = 0; i < k; i++)
            o->cells |= !strcmp(item[i], "drift") ? 1 : !strcmp(item[i], "throughput") ? 2 : 4;
        if (k <= 0 || (o->cells & 4))
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--cells: expected a list of drift and throughput, got '%s'", val);
    } else if (!strcmp(f, "--backend")) {
        const char *val = kvd_args_value(a, f);
        if (strcmp(val, "cpu") && strcmp(val, "cuda"))
            kvd_die(KVD_EXIT_USAGE, cmd, "--backend: expected cpu or cuda, got '%s'", val);
        o->backend = val;
    } else if (!strcmp(f, "--gpus")) {
        const char *val = kvd_args_value(a, f);
        char *end;
        long g = strtol(val, &end, 10);
        if (*end || end == val || g < 1 || g > KVD_MAX_GPUS)
            kvd_die(KVD_EXIT_USAGE, cmd, "--gpus: expected 1 to %d, got '%s'", KVD_MAX_GPUS, val);
        o->be.gpus = (int)g;
    } else {
        return 0;
    }
    return 1;
}

/* A JSON spec holds the same settings as the flags, by the flags' names
 * ("gen_tokens" or "gen-tokens"), checked as the flags are; a message about
 * one names the file. */
static void load_spec(run_opts *o, const char *path) {
    char err[KVD_ERR_LEN];
    /* kvd_die's "kvdrift CMD: ": the spec's messages name it */
    static char cmd[KVD_ERR_LEN];
    snprintf(cmd, sizeof cmd, "run: %s", path);
    json_t *j = kvd_json_load(path, err);
    if (!j) kvd_die(KVD_EXIT_USAGE, "run", "%s", err);
    if (!json_is_object(j)) kvd_die(KVD_EXIT_USAGE, "run", "%s: expected a JSON object", path);
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v) {
        char flag[64], val[512];
        snprintf(flag, sizeof flag, "--%s", key);
        for (char *p = flag; *p; p++)
            if (*p == '_') *p = '-';
        if (json_is_string(v)) {
            snprintf(val, sizeof val, "%s", json_string_value(v));
        } else if (json_is_integer(v)) {
            snprintf(val, sizeof val, "%lld", (long long)json_integer_value(v));
        } else if (json_is_real(v)) {
            snprintf(val, sizeof val, "%.17g", json_real_value(v));
        } else if (json_is_array(v)) {
            val[0] = 0;
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                char one[64];
                if (json_is_string(e))
                    snprintf(one, sizeof one, "%s", json_string_value(e));
                else if (json_is_integer(e))
                    snprintf(one, sizeof one, "%lld", (long long)json_integer_value(e));
                else
                    kvd_die(KVD_EXIT_USAGE, cmd, "field '%s': expected strings or integers", key);
                if (i) strncat(val, ",", sizeof val - strlen(val) - 1);
                strncat(val, one, sizeof val - strlen(val) - 1);
            }
        } else if (json_is_boolean(v)) {
            snprintf(val, sizeof val, "%s", json_is_true(v) ? "1" : "0");
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "field '%s': unsupported value", key);
        }
        /* switches: true or false (1 or 0) */
        int *sw = !strcmp(flag, "--per-head")        ? &o->per_head
                  : !strcmp(flag, "--attn-per-head") ? &o->attn_per_head
                  : !strcmp(flag, "--attn-fp8")      ? &o->dopt.attn_fp8
                                                     : NULL;
        if (sw) {
            if (strcmp(val, "0") && strcmp(val, "1"))
                kvd_die(KVD_EXIT_USAGE, cmd, "field '%s': expected true or false, got '%s'", key,
                        val);
            *sw = val[0] == '1';
            o->cal_given |= sw == &o->per_head && *sw;
            continue;
        }
        /* values outlive this loop (a preset name, a path): keep a copy */
        char *argv2[2] = {flag, own(o, val)};
        kvd_args a = {2, argv2, 1, cmd};
        if (!strcmp(flag, "--spec") || !run_flag(o, &a, flag))
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown field '%s' (the fields are run's flags)", key);
    }
    json_decref(j);
}

/* The traces' spec for the results file: the generator's, with the length
 * as the rule every context's traces follow. */
static char *trace_spec_json(const kvd_trace_spec *sp) {
    char *txt = kvd_trace_spec_json(sp);
    json_t *j = json_loads(txt, 0, NULL);
    free(txt);
    json_object_del(j, "length");
    json_object_set_new(j, "length_per_context", json_string("context + gen_tokens + 1"));
    txt = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return txt;
}

/* ---- resuming ---- */

/* What decides a cell's figures besides the model (model_config) and the
 * traces (trace_spec), as JSON keyed by run's flags. Not in it: which cells
 * (--kv, --context, --concurrency, --cells), where they go, thread counts. */
static char *run_settings(const run_opts *o, const kvd_config *c, const char *device,
                          const char *cmd) {
    json_t *wj = kvd_model_opts_weights_json(&o->mo, c);
    if (!wj)
        kvd_die(KVD_EXIT_USAGE, cmd, "%s: no longer readable",
                o->mo.model_dir ? o->mo.model_dir : o->mo.profile);
    json_t *j = json_object();
    json_object_set_new(j, "backend", json_string(o->backend));
    json_object_set_new(j, "gpus", json_integer(o->be.gpus));
    /* a GPU's throughput (and its last bits) are that GPU's; the CPU's
     * description is its thread count, which a rerun may change */
    if (strcmp(o->backend, "cpu")) json_object_set_new(j, "device", json_string(device));
    /* the CPU's last bits are its BLAS kernels' (OpenBLAS picks them by
     * core type): cells of two kinds of CPU must not share a file */
    /* and its attention kernels' (AVX-512 VBMI, or the portable ones) */
    if (!strcmp(o->backend, "cpu")) {
        json_object_set_new(j, "blas", json_string(kvd_cpu_blas()));
        json_object_set_new(j, "cpu-attention", json_string(kvd_attn_kernels()));
    }
#ifdef KVD_HAVE_CUDA
    /* tuned GEMMs (KVD_CUDA_GEMM=tune) sum in another order than the
     * heuristic's first choice: cells of the two must not share a file */
    if (!strcmp(o->backend, "cuda"))
        json_object_set_new(j, "cuda-gemm", json_string(kvd_cuda_gemm_tuning() ? "tune" : "first"));
#endif
    json_object_set_new(j, "weights", wj);
    json_object_set_new(j, "traces", json_integer(o->traces));
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "gen-tokens", json_integer(o->dopt.gen_tokens));
    json_object_set_new(j, "sample-every", json_integer(o->dopt.sample_every));
    json_object_set_new(j, "fp8-saturate", json_boolean(o->dopt.saturate));
    json_object_set_new(j, "calibration", json_string(kvd_cal_recipe_name(o->recipe)));
    json_object_set_new(j, "per-head", json_boolean(o->per_head));
    json_object_set_new(j, "calib-tokens", json_integer(o->calib_tokens));
    json_object_set_new(j, "scales", o->scales_path ? json_string(o->scales_path) : json_null());
    json_object_set_new(j, "attn-per-head", json_boolean(o->attn_per_head));
    /* only when set: files from before the flag resume as they were */
    if (o->dopt.attn_fp8) json_object_set_new(j, "attn-fp8", json_true());
    json_object_set_new(j, "decode-tokens", json_integer(o->decode_tokens));
    json_object_set_new(j, "repeats", json_integer(o->repeats));
    json_object_set_new(j, "kv-budget", json_integer((json_int_t)llround(o->kv_budget)));
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return txt;
}

/* A file's finished cells ran under its settings, model and traces; a run
 * that differs in any of them must not add its cells beside them (the file
 * would describe one sweep and hold two). Names the first difference. */
static void check_resume(const char *cmd, const char *path, const char *was_rev,
                         const char *was_settings, const char *was_model, const char *was_trace,
                         const char *settings, const char *model, const char *trace) {
    const char *fix = "write to another file (-o), or remove it to start over";
    /* the file names one build; another's figures may differ in the last
     * bits, or more where the build fixed something */
    if (strcmp(was_rev, KVD_GIT_REV))
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s holds cells of kvdrift %s, this is %s (the figures of two builds may "
                "differ): %s",
                path, was_rev[0] ? was_rev : "of an unknown revision", KVD_GIT_REV, fix);
    if (!was_settings)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s: its cells cannot be resumed: it records no run settings (an older "
                "kvdrift wrote it); %s",
                path, fix);
    json_t *a = kvd_settings_parse(was_settings), *b = kvd_settings_parse(settings);
    if (!a) kvd_die(KVD_EXIT_USAGE, cmd, "%s: attribute run_settings: expected JSON", path);
    const char *key;
    json_t *v;
    char why[1200] = "";
    json_object_foreach(b, key, v) {
        const json_t *w = json_object_get(a, key);
        if (w && json_equal((json_t *)w, v)) continue;
        char x[256], y[256];
        if (!strcmp(key, "weights") && json_is_object(w)) {
            /* the first knob (or source) that differs */
            const char *wk;
            json_t *wv;
            json_object_foreach(v, wk, wv) {
                const json_t *ww = json_object_get(w, wk);
                if (ww && json_equal((json_t *)ww, wv)) continue;
                kvd_json_text(ww, x, sizeof x), kvd_json_text(wv, y, sizeof y);
                snprintf(why, sizeof why,
                         "%s holds cells of other weights (their %s %s, this run's %s)", path, wk,
                         x, y);
                break;
            }
            if (why[0]) break;
        }
        kvd_json_text(w, x, sizeof x), kvd_json_text(v, y, sizeof y);
        /* four settings are no flag's: the device, the GEMMs' choice, the
         * CPU's BLAS and its attention kernels */
        if (!strcmp(key, "device"))
            snprintf(why, sizeof why, "%s holds cells run on %s, this run is on %s", path, x, y);
        else if (!strcmp(key, "blas"))
            snprintf(why, sizeof why,
                     "%s holds cells run with %s, this run has %s (another CPU's BLAS kernels "
                     "round the sums otherwise)",
                     path, x, y);
        else if (!strcmp(key, "cpu-attention"))
            snprintf(why, sizeof why,
                     "%s holds cells run with the %s attention kernels, this run has the %s "
                     "ones (they round the sums otherwise)",
                     path, x, y);
        else if (!strcmp(key, "fp8-saturate"))
            snprintf(why, sizeof why,
                     "%s holds cells run with --fp8-overflow %s, this run has "
                     "--fp8-overflow %s",
                     path, json_is_true(w) ? "sat" : "nan", json_is_true(v) ? "sat" : "nan");
        else if (!strcmp(key, "cuda-gemm"))
            snprintf(why, sizeof why,
                     "%s holds cells run with KVD_CUDA_GEMM=%s, this run has KVD_CUDA_GEMM=%s "
                     "(the two sum the products in another order)",
                     path, x, y);
        else
            snprintf(why, sizeof why, "%s holds cells run with --%s %s, this run has --%s %s", path,
                     key, x, key, y);
        break;
    }
    /* freed before exiting: nothing the run parsed is left behind */
    json_decref(a), json_decref(b);
    if (why[0]) kvd_die(KVD_EXIT_USAGE, cmd, "%s: %s", why, fix);
    if (!was_model || strcmp(was_model, model))
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s holds cells of another model (its model_config differs from this run's): %s",
                path, fix);
    if (!was_trace || strcmp(was_trace, trace))
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s holds cells over other traces (its trace_spec %s, this run's %s): %s", path,
                was_trace ? was_trace : "none", trace, fix);
}

/* ---- progress ---- */

typedef struct {
    int total, done;
    double t0;
    int tty;
} progress;

static void progress_show(progress *p, const char *what) {
    if (!p->tty) return;
    double el = kvd_now() - p->t0;
    double eta = p->done ? el / p->done * (p->total - p->done) : 0;
    fprintf(stderr, "\r\033[K[%d/%d] %s  elapsed %.0fs  ETA %.0fs", p->done, p->total, what, el,
            eta);
    fflush(stderr);
}

/* ---- cells ---- */

static void utc_now(char *buf, size_t n) {
    time_t t = time(NULL);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
}

/* The fields that name a cell, which /cells and /failures rows share, and
 * the time, into row (of either table). */
#define NAME_CELL(row, utc, cell_, kind_, m, c, ctx, trace_)                                       \
    do {                                                                                           \
        snprintf((row)->cell, sizeof(row)->cell, "%s", cell_);                                     \
        snprintf((row)->kind, sizeof(row)->kind, "%s", kind_);                                     \
        snprintf((row)->mode, sizeof(row)->mode, "%s", kvd_kv_mode_name(m));                       \
        (row)->concurrency = (c), (row)->context = (ctx), (row)->trace = (trace_);                 \
        utc_now((row)->utc, sizeof(row)->utc);                                                     \
    } while (0)

static void mark_cell(kvd_results *r, const char *cell, const char *kind, kvd_kv_mode m, int c,
                      int64_t ctx, int trace, double secs) {
    kvd_row_cell *row = kvd_results_add(r, KVD_T_CELLS);
    NAME_CELL(row, completed_utc, cell, kind, m, c, ctx, trace);
    row->seconds = secs;
    kvd_results_forget_failure(r, cell);
}

/* A cell that failed: named on stderr with why, and kept in /failures
 * (its last try's), so that a report says why its figures are missing. */
static void fail_cell(kvd_results *r, const run_opts *o, const char *cell, const char *kind,
                      kvd_kv_mode m, int c, int64_t ctx, int trace, const char *why) {
    const char *hint = o->dopt.saturate ? ""
                                        : " (under --fp8-overflow nan, an FP8 write past the "
                                          "format's range stores NaN or infinity)";
    fprintf(stderr, "\nkvdrift run: cell %s: %s%s\n", cell, why, hint);
    kvd_results_forget_failure(r, cell);
    kvd_row_failure *row = kvd_results_add(r, KVD_T_FAIL);
    NAME_CELL(row, failed_utc, cell, kind, m, c, ctx, trace);
    snprintf(row->message, sizeof row->message, "%s%s", why, hint);
}

static void bucket_range(int b, int64_t *lo, int64_t *hi) {
    *lo = b == 0 ? 0 : (int64_t)1 << b;
    *hi = ((int64_t)1 << (b + 1)) - 1;
}

#define KEYS(row, mode, ctx, tr)                                                                   \
    do {                                                                                           \
        snprintf((row)->mode, sizeof(row)->mode, "%s", kvd_kv_mode_name(mode));                    \
        (row)->concurrency = 1;                                                                    \
        (row)->context = (ctx);                                                                    \
        (row)->trace = (tr);                                                                       \
    } while (0)

static void summary(kvd_results *r, kvd_kv_mode mode, int64_t ctx, int tr, int sub,
                    const char *metric, double value, double n) {
    kvd_row_summary *s = kvd_results_add(r, KVD_T_SUMMARY);
    KEYS(s, mode, ctx, tr);
    snprintf(s->subset, sizeof s->subset, "%s", kvd_subset_names[sub]);
    snprintf(s->metric, sizeof s->metric, "%s", metric);
    s->value = value;
    s->n = n;
}

/* the results file keeps the drift's per-position figures as they are */
_Static_assert(sizeof(kvd_row_token) == sizeof(kvd_token_fig) &&
                   offsetof(kvd_row_token, delta_p) == offsetof(kvd_token_fig, delta_p) &&
                   offsetof(kvd_row_token, delta_nll) == offsetof(kvd_token_fig, delta_nll) &&
                   offsetof(kvd_row_token, hidden_last) == offsetof(kvd_token_fig, hidden_last) &&
                   offsetof(kvd_row_token, attn_isolated) ==
                       offsetof(kvd_token_fig, attn_isolated) &&
                   offsetof(kvd_row_token, attn_propagated) ==
                       offsetof(kvd_token_fig, attn_propagated) &&
                   offsetof(kvd_row_token, copy) == offsetof(kvd_token_fig, copy) &&
                   offsetof(kvd_row_token, same_top) == offsetof(kvd_token_fig, same_top) &&
                   offsetof(kvd_row_token, router_flips) == offsetof(kvd_token_fig, router_flips),
               "kvd_row_token and kvd_token_fig differ");

static void drift_rows(kvd_results *r, kvd_drift *d, const kvd_config *c, kvd_kv_mode mode,
                       int64_t ctx, int tr, uint64_t trace_hash, const char *cell,
                       int per_head_attn) {
    kvd_results_add_tokens(r, kvd_kv_mode_name(mode), ctx, tr, trace_hash,
                           (const kvd_row_token *)d->tok, d->n_tok);
    for (int m = 0; m < KVD_OUT_N; m++)
        for (int s = 0; s < KVD_NSUB; s++)
            for (int b = 0; b < KVD_NB; b++) {
                const kvd_stat *st = &d->out[m][s][b];
                if (st->n == 0) continue;
                kvd_row_output *row = kvd_results_add(r, KVD_T_OUTPUT);
                KEYS(row, mode, ctx, tr);
                snprintf(row->subset, sizeof row->subset, "%s", kvd_subset_names[s]);
                snprintf(row->metric, sizeof row->metric, "%s", kvd_out_names[m]);
                row->bucket = b;
                bucket_range(b, &row->pos_lo, &row->pos_hi);
                row->n = st->n, row->mean = kvd_stat_mean(st), row->ci95 = kvd_stat_ci95(st);
            }
    double *mat = calloc((size_t)c->num_hidden_layers * KVD_NB, sizeof(double));
    int nb_used = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int m = 0; m < KVD_HID_N; m++)
            for (int s = 0; s < KVD_NSUB; s++)
                for (int b = 0; b < KVD_NB; b++) {
                    const kvd_stat *st = kvd_drift_hid(d, l, m, s, b);
                    if (st->n == 0) continue;
                    kvd_row_layer *row = kvd_results_add(r, KVD_T_LAYER);
                    KEYS(row, mode, ctx, tr);
                    row->layer = l;
                    snprintf(row->layer_type, sizeof row->layer_type, "%s",
                             c->layer_types[l] == KVD_LAYER_FULL ? "full_attention"
                                                                 : "linear_attention");
                    snprintf(row->subset, sizeof row->subset, "%s", kvd_subset_names[s]);
                    snprintf(row->metric, sizeof row->metric, "%s", kvd_hid_names[m]);
                    row->bucket = b;
                    bucket_range(b, &row->pos_lo, &row->pos_hi);
                    row->n = st->n, row->mean = kvd_stat_mean(st), row->ci95 = kvd_stat_ci95(st);
                    if (m == KVD_HID_REL_L2 && s == KVD_SUB_ALL) {
                        mat[(size_t)l * KVD_NB + b] = row->mean;
                        nb_used = b + 1 > nb_used ? b + 1 : nb_used;
                    }
                }
    /* dense layer x bucket matrix of the hidden-state drift */
    double *dense = malloc(sizeof(double) * (size_t)c->num_hidden_layers * (nb_used ? nb_used : 1));
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int b = 0; b < nb_used; b++)
            dense[(size_t)l * nb_used + b] = mat[(size_t)l * KVD_NB + b];
    char name[128];
    snprintf(name, sizeof name, "%s/hidden_rel_l2", cell);
    for (char *p = name; *p; p++)
        if (*p == '.') *p = '_';
    if (nb_used) kvd_results_add_matrix(r, name, "layer", c->num_hidden_layers, nb_used, dense);
    free(dense);
    free(mat);
    int al = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (c->layer_types[l] != KVD_LAYER_FULL) continue;
        for (int v = 0; v < KVD_VIEW_N; v++)
            for (int m = 0; m < KVD_ATT_N; m++)
                for (int s = 0; s < KVD_NSUB; s++)
                    for (int b = 0; b < KVD_NB; b++) {
                        const kvd_stat *st = kvd_drift_att(d, al, v, m, s, b);
                        if (st->n == 0) continue;
                        kvd_row_attn *row = kvd_results_add(r, KVD_T_ATTN);
                        KEYS(row, mode, ctx, tr);
                        row->attn_layer = al, row->layer = l, row->kv_head = -1;
                        snprintf(row->view, sizeof row->view, "%s", kvd_view_names[v]);
                        snprintf(row->subset, sizeof row->subset, "%s", kvd_subset_names[s]);
                        snprintf(row->metric, sizeof row->metric, "%s", kvd_att_names[m]);
                        row->bucket = b;
                        bucket_range(b, &row->pos_lo, &row->pos_hi);
                        row->n = st->n, row->mean = kvd_stat_mean(st),
                        row->ci95 = kvd_stat_ci95(st);
                    }
        /* attention KL per KV head (the mean over its query heads), on request */
        for (int h = 0; per_head_attn && h < d->kv_heads; h++)
            for (int v = 0; v < KVD_VIEW_N; v++)
                for (int b = 0; b < KVD_NB; b++) {
                    const kvd_stat *st = kvd_drift_att_kvh(d, al, h, v, b);
                    if (st->n == 0) continue;
                    kvd_row_attn *row = kvd_results_add(r, KVD_T_ATTN);
                    KEYS(row, mode, ctx, tr);
                    row->attn_layer = al, row->layer = l, row->kv_head = h;
                    snprintf(row->view, sizeof row->view, "%s", kvd_view_names[v]);
                    snprintf(row->subset, sizeof row->subset, "all");
                    snprintf(row->metric, sizeof row->metric, "kl");
                    row->bucket = b;
                    bucket_range(b, &row->pos_lo, &row->pos_hi);
                    row->n = st->n, row->mean = kvd_stat_mean(st), row->ci95 = kvd_stat_ci95(st);
                }
        for (int h = 0; h < d->kv_heads; h++) {
            kvd_row_kv *row = kvd_results_add(r, KVD_T_KV);
            KEYS(row, mode, ctx, tr);
            row->attn_layer = al, row->layer = l, row->kv_head = h;
            row->k_scale = d->k_scale[al * d->kv_heads + h];
            row->v_scale = d->v_scale[al * d->kv_heads + h];
            const kvd_qstats *ks = &d->k_stats[al], *vs = &d->v_stats[al];
            double nk = ks->n ? (double)ks->n : 1, nv = vs->n ? (double)vs->n : 1;
            row->k_saturated_frac = ks->saturated / nk, row->k_flushed_frac = ks->flushed / nk;
            row->k_subnormal_frac = ks->subnormal / nk;
            row->v_saturated_frac = vs->saturated / nv, row->v_flushed_frac = vs->flushed / nv;
            row->v_subnormal_frac = vs->subnormal / nv;
            row->n_values = (double)ks->n;
        }
        al++;
    }
    /* one figure per cell: llama.cpp's --kl-divergence set, and the rest */
    for (int s = 0; s < KVD_NSUB; s++) {
        kvd_stat tot[KVD_OUT_N];
        memset(tot, 0, sizeof tot);
        double dp2 = 0;
        for (int m = 0; m < KVD_OUT_N; m++)
            for (int b = 0; b < KVD_NB; b++) {
                const kvd_stat *st = &d->out[m][s][b];
                tot[m].n += st->n, tot[m].sum += st->sum, tot[m].sumsq += st->sumsq;
            }
        double n = tot[KVD_OUT_KL].n;
        if (n == 0) continue;
        dp2 = tot[KVD_OUT_DP].sumsq;
        summary(r, mode, ctx, tr, s, "kl_mean", kvd_stat_mean(&tot[KVD_OUT_KL]), n);
        summary(r, mode, ctx, tr, s, "kl_mean_err", kvd_stat_ci95(&tot[KVD_OUT_KL]) / 1.96, n);
        for (const kvd_kl_pct *q = kvd_kl_percentiles; q->name; q++)
            summary(r, mode, ctx, tr, s, q->name, kvd_drift_kl_percentile(d, s, q->q), n);
        double p = kvd_stat_mean(&tot[KVD_OUT_TOP1]);
        summary(r, mode, ctx, tr, s, "same_top_p", p, n);
        summary(r, mode, ctx, tr, s, "same_top_p_err", n > 1 ? sqrt(p * (1 - p) / (n - 1)) : NAN,
                n);
        summary(r, mode, ctx, tr, s, "delta_p_mean", kvd_stat_mean(&tot[KVD_OUT_DP]), n);
        summary(r, mode, ctx, tr, s, "delta_p_rms", sqrt(dp2 / n), n);
        summary(r, mode, ctx, tr, s, "ln_ppl_ratio", kvd_stat_mean(&tot[KVD_OUT_DNLL]), n);
    }
    /* router flips per MoE layer and bucket, beside the hidden-state rows */
    for (int l = 0; l < c->num_hidden_layers && c->num_experts > 0; l++)
        for (int b = 0; b < KVD_NB; b++) {
            const kvd_stat *st = &d->router[(size_t)l * KVD_NB + b];
            if (st->n == 0) continue;
            kvd_row_layer *row = kvd_results_add(r, KVD_T_LAYER);
            KEYS(row, mode, ctx, tr);
            row->layer = l;
            snprintf(row->layer_type, sizeof row->layer_type, "%s",
                     c->layer_types[l] == KVD_LAYER_FULL ? "full_attention" : "linear_attention");
            snprintf(row->subset, sizeof row->subset, "all");
            snprintf(row->metric, sizeof row->metric, "router_flip");
            row->bucket = b;
            bucket_range(b, &row->pos_lo, &row->pos_hi);
            row->n = st->n, row->mean = kvd_stat_mean(st), row->ci95 = kvd_stat_ci95(st);
        }
    kvd_stat rf = {0, 0, 0};
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int b = 0; b < KVD_NB; b++) {
            const kvd_stat *st = &d->router[(size_t)l * KVD_NB + b];
            rf.n += st->n, rf.sum += st->sum, rf.sumsq += st->sumsq;
        }
    if (rf.n > 0)
        summary(r, mode, ctx, tr, KVD_SUB_ALL, "router_flip_rate", kvd_stat_mean(&rf), rf.n);
    for (int g = 0; g < d->n_gen; g++) {
        kvd_row_gen *row = kvd_results_add(r, KVD_T_GEN);
        KEYS(row, mode, ctx, tr);
        row->prefix = d->gen[g].prefix;
        row->tokens = d->gen[g].tokens;
        row->first_divergence = d->gen[g].first_divergence;
        row->agree_rate = d->gen[g].tokens ? (double)d->gen[g].agree / d->gen[g].tokens : NAN;
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pctl(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* Throughput at concurrency C: C requests with their own traces and lengths
 * arrive together, are prefilled one after another, then decode as one batch
 * for decode_tokens steps: once untimed (a warm-up: the first decode of a
 * process or a model pays for what later ones find ready), then o->repeats
 * times, every pass from the prefilled state, of which the median counts.
 * The first steps are replayed one sequence at a time to measure what
 * batching did to the logits. */
static int throughput_cell(const kvd_weights *w, kvd_trace *traces, int n_traces, kvd_kv_mode mode,
                           const kvd_kv_scales *sc, int C, int64_t ctx, const run_opts *o,
                           kvd_row_tput *row, char *err) {
    const kvd_config *c = &w->cfg;
    int nf = kvd_config_n_full(c), kvh = c->num_key_value_heads, V = c->vocab_size;
    int steps = o->decode_tokens;
    int64_t *len = malloc(sizeof(int64_t) * (size_t)C), total = 0;
    for (int i = 0; i < C; i++) {
        /* lengths spread over the upper half of the context */
        len[i] = ctx - (C > 1 ? (int64_t)i * (ctx / 2) / (C - 1) : 0);
        total += len[i] + steps;
    }
    kvd_kvcache kv;
    /* room for every request and a branch of each (the batch-invariance replay) */
    if (kvd_kvcache_init(&kv, mode, nf, kvh, c->head_dim, KVD_KV_BLOCK,
                         2 * (total + KVD_KV_BLOCK * C), sc, o->dopt.saturate, err)) {
        free(len);
        return -1;
    }
    if (o->dopt.attn_fp8 && kvd_kvcache_fp8_attention(&kv, sc, c->num_attention_heads, err)) {
        kvd_kvcache_free(&kv);
        free(len);
        return -1;
    }
    kvd_engine m;
    if (kvd_engine_open(&m, &o->be, w, &kv, 256 > C ? 256 : C, 2 * C, NULL, err)) {
        kvd_kvcache_free(&kv);
        free(len);
        return -1;
    }
    int *seqs = malloc(sizeof(int) * (size_t)C), *ones = malloc(sizeof(int) * (size_t)C);
    int *run = malloc(sizeof(int) * (size_t)C);
    int32_t *next = malloc(sizeof(int32_t) * (size_t)C),
            *first = malloc(sizeof(int32_t) * (size_t)C);
    float *logits = malloc(sizeof(float) * (size_t)C * V), *lg1 = malloc(sizeof(float) * (size_t)V);
    float *first_logits = malloc(sizeof(float) * (size_t)C * V);
    double *ttft = malloc(sizeof(double) * (size_t)C),
           *itl = malloc(sizeof(double) * (size_t)o->repeats * (size_t)(steps - 1)),
           *pass_s = malloc(sizeof(double) * (size_t)o->repeats);
    double t_start = kvd_now(), prefill_s = 0;
    int rc = -1;
    int64_t prefill_tokens = 0;
    for (int i = 0; i < C; i++) {
        seqs[i] = kvd_kvcache_add_seq(&kv);
        ones[i] = 1;
        const kvd_trace *t = &traces[i % n_traces];
        double t0 = kvd_now();
        if (kvd_engine_prefill(&m, &kv, seqs[i], (const int32_t *)t->tokens, (int)len[i],
                               logits + (size_t)i * V, 0, err))
            goto out;
        prefill_s += kvd_now() - t0;
        prefill_tokens += len[i];
        ttft[i] = (kvd_now() - t_start) * 1e3;
    }
    double prefill_wall = kvd_now() - t_start;
    for (int i = 0; i < C; i++) first[i] = kvd_argmax(logits + (size_t)i * V, V);
    /* decoding: an untimed warm-up pass, then R timed ones, each over a
     * branch of every sequence as the prefill left it (the copies are not
     * timed; the branches are released after the pass). The first step's
     * logits come back (the replay below compares them); then greedy
     * decoding as an engine runs it, on the device where there is one: the
     * next tokens, not the logits, come back */
    const int R = o->repeats, nstep = steps - 1;
    for (int p = 0; p <= R; p++) {
        int forked = 0;
        for (; forked < C; forked++)
            if ((run[forked] = kvd_engine_fork(&m, &kv, seqs[forked])) < 0) break;
        if (forked < C) {
            snprintf(err, KVD_ERR_LEN, "throughput: no room to branch sequence %d", forked);
            for (int i = 0; i < forked; i++) kvd_kvcache_release(&kv, run[i]);
            goto out;
        }
        memcpy(next, first, sizeof(int32_t) * (size_t)C);
        double td = kvd_now();
        int bad = 0;
        for (int s = 0; s < nstep && !bad; s++) {
            kvd_batch b = {C, run, ones, next};
            double t0 = kvd_now();
            if (s == 0) {
                bad = kvd_engine_forward(&m, &kv, &b, logits, 1, err);
                for (int i = 0; i < C && !bad; i++) next[i] = kvd_argmax(logits + (size_t)i * V, V);
            } else {
                bad = kvd_engine_greedy(&m, &kv, &b, logits, next, err);
            }
            if (p > 0) itl[(size_t)(p - 1) * nstep + s] = (kvd_now() - t0) * 1e3;
            if (p == 0 && s == 0) memcpy(first_logits, logits, sizeof(float) * (size_t)C * V);
        }
        if (p > 0) pass_s[p - 1] = kvd_now() - td;
        for (int i = 0; i < C; i++) kvd_kvcache_release(&kv, run[i]);
        if (bad) goto out;
    }
    /* batch invariance: each sequence's first step replayed alone, against
     * its row of the batched first step */
    double batch_drift = 0;
    for (int i = 0; i < C && C > 1; i++) {
        int one = 1, alone = kvd_engine_fork(&m, &kv, seqs[i]);
        if (alone < 0) {
            snprintf(err, KVD_ERR_LEN, "throughput: no room to branch sequence %d", i);
            goto out;
        }
        kvd_batch b1 = {1, &alone, &one, &first[i]};
        int bad = kvd_engine_forward(&m, &kv, &b1, lg1, 1, err);
        kvd_kvcache_release(&kv, alone);
        if (bad) goto out;
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) {
            double e = (double)lg1[v] - first_logits[(size_t)i * V + v];
            num += e * e;
            den += (double)lg1[v] * lg1[v];
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        batch_drift = rel > batch_drift ? rel : batch_drift;
    }
    /* a request's end to end: the prefills, then a decode pass of the
     * median's length; every request finishes with the last step */
    const double decode_s = pctl(pass_s, R, 0.5), e2e_end = (prefill_wall + decode_s) * 1e3;
    row->prefill_tok_s = prefill_tokens / prefill_s;
    row->decode_tok_s = (double)C * nstep / decode_s;
    row->total_tok_s = (prefill_tokens + (double)C * steps) / (e2e_end / 1e3);
    double sum = 0;
    for (int i = 0; i < C; i++) sum += ttft[i];
    row->ttft_ms_mean = sum / C;
    sum = 0;
    for (int i = 0; i < C; i++) sum += (e2e_end - ttft[i]) / nstep;
    row->tpot_ms_mean = sum / C;
    row->e2e_ms_mean = e2e_end;
    const int ni = R * nstep;
    sum = 0;
    for (int s = 0; s < ni; s++) sum += itl[s];
    row->itl_ms_mean = sum / ni;
    row->itl_ms_p50 = pctl(itl, ni, 0.5);
    row->itl_ms_p90 = pctl(itl, ni, 0.9);
    row->itl_ms_p99 = pctl(itl, ni, 0.99);
    row->ttft_ms_p50 = pctl(ttft, C, 0.5);
    row->ttft_ms_p90 = pctl(ttft, C, 0.9);
    row->ttft_ms_p99 = pctl(ttft, C, 0.99);
    row->e2e_ms_p50 = row->e2e_ms_p90 = row->e2e_ms_p99 = e2e_end;
    row->kv_bytes_per_token = (double)kvd_kvcache_bytes_per_token(mode, nf, kvh, c->head_dim);
    row->peak_kv_bytes = row->kv_bytes_per_token * (double)total;
    row->budget_bytes = o->kv_budget;
    row->budget_tokens = floor(o->kv_budget / row->kv_bytes_per_token);
    row->batch_drift_max_rel = batch_drift;
    row->output_tokens = steps;
    rc = 0;
out:
    kvd_engine_close(&m);
    kvd_kvcache_free(&kv);
    free(len), free(seqs), free(ones), free(run), free(next), free(first), free(logits), free(lg1);
    free(first_logits), free(ttft), free(itl), free(pass_s);
    return rc;
}

/* The drift cells of one trace at one context, every mode's that the file
 * does not hold yet. Where the back end can (shadow_of_reference), modes
 * run in groups against one reference run, as many at once as a quarter
 * of this machine's memory holds caches for; each group's cells are
 * written when it ends. A group that does not fit (its caches or models,
 * on the device say) tries again half as large; a mode that fails in a
 * step (NaN in its activations) drops out of its group, which runs on, and
 * is tried once more alone, so that a failure costs only its own cell.
 * 1 when a cell failed. */
static int drift_cells(kvd_results *res, const run_opts *o, const kvd_weights *w,
                       const kvd_trace *tr, int64_t ctx, int t, const kvd_kv_scales *const *msc,
                       progress *pr) {
    const char *cmd = "run";
    const kvd_config *c = &w->cfg;
    /* the modes to run, then (from np on) those tried again alone */
    char err[KVD_ERR_LEN], cell[2 * KVD_KV_N_MODES][64];
    kvd_kv_mode modes[2 * KVD_KV_N_MODES];
    const kvd_kv_scales *scales[2 * KVD_KV_N_MODES];
    int np = 0, failed = 0;
    for (int mi = 0; mi < o->n_modes; mi++) {
        snprintf(cell[np], sizeof cell[np], "drift_%s_c1_ctx%lld_t%d",
                 kvd_kv_mode_name((kvd_kv_mode)o->modes[mi]), (long long)ctx, t);
        if (kvd_results_has_cell(res, cell[np])) {
            pr->done++;
            continue;
        }
        modes[np] = (kvd_kv_mode)o->modes[mi];
        scales[np++] = msc[mi];
    }
    if (!np) return 0;
    uint8_t *is_copy = calloc((size_t)ctx + 1, 1), *start = calloc((size_t)ctx + 1, 1);
    if (!is_copy || !start) kvd_die(1, cmd, "out of memory");
    kvd_trace_copy_marks(tr, ctx, is_copy, start);
    kvd_drift_opts dop = o->dopt;
    dop.n_gen = 0;
    if (dop.gen_tokens > 0) {
        int64_t pre[3] = {ctx / 4, ctx / 2, ctx};
        for (int g = 0; g < 3; g++)
            if (pre[g] >= 16 && (dop.n_gen == 0 || pre[g] > dop.gen_prefix[dop.n_gen - 1]))
                dop.gen_prefix[dop.n_gen++] = pre[g];
    }
    /* what a candidate holds: its cache (the trace, and a branch for the
     * generations), its shadow, and a step's logits twice (its own rows',
     * and the comparison's) */
    int group = 1;
    if (o->be.ops->shadow_of_reference) {
        const int nf = kvd_config_n_full(c);
        double tokens = 3.0 * (double)(ctx + dop.gen_tokens + 2 * KVD_KV_BLOCK), most = 0;
        for (int j = 0; j < np; j++) {
            double b = (double)kvd_kvcache_bytes_per_token(modes[j], nf, c->num_key_value_heads,
                                                           c->head_dim);
            most = b > most ? b : most;
        }
        double each = most * tokens + 2.0 * 256 * c->vocab_size * sizeof(float);
        double room = 0.25 * (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        double fit = room / each;
        group = fit >= np ? np : fit < 1 ? 1 : (int)fit;
    }
    for (int g0 = 0, n, nw = np; g0 < nw; g0 += n) {
        n = g0 >= np ? 1 : np - g0 < group ? np - g0 : group;
        kvd_drift d[KVD_KV_N_MODES];
        for (int j = 0; j < n; j++)
            if (kvd_drift_init(&d[j], c, ctx)) kvd_die(1, cmd, "out of memory");
        char what[96];
        if (n > 1) {
            snprintf(what, sizeof what, "drift of %d modes at once, ctx%lld, trace %d", n,
                     (long long)ctx, t);
        } else {
            snprintf(what, sizeof what, "%s", cell[g0]);
        }
        progress_show(pr, what);
        int rc = kvd_drift_run_modes(&o->be, w, tr->tokens, is_copy, start, ctx, n, modes + g0,
                                     scales + g0, &dop, d, err);
        if (rc == -2 && n > 1) { /* this group again, half as large */
            for (int j = 0; j < n; j++) kvd_drift_free(&d[j]);
            group = (n + 1) / 2;
            fprintf(stderr, "\nkvdrift run: %d modes at once at %lld tokens: %s; trying %d\n", n,
                    (long long)ctx, err, group);
            n = 0;
            continue;
        }
        /* a mode whose step failed dropped out; the others ran through. One
         * that failed among several is tried once more alone: its failure may
         * have come of their number (device memory for their steps) */
        int again = 0;
        for (int j = 0; j < n; j++) {
            if (d[j].failed && n > 1) {
                fprintf(stderr,
                        "\nkvdrift run: cell %s failed among %d modes at once; trying it "
                        "alone\n",
                        cell[g0 + j], n);
                modes[nw] = modes[g0 + j], scales[nw] = scales[g0 + j];
                memcpy(cell[nw++], cell[g0 + j], sizeof cell[0]);
                again++;
            } else if (d[j].failed) {
                fail_cell(res, o, cell[g0 + j], "drift", modes[g0 + j], 1, ctx, t, d[j].error);
                failed = 1;
            } else {
                drift_rows(res, &d[j], c, modes[g0 + j], ctx, t, kvd_token_hash(tr->tokens, ctx),
                           cell[g0 + j], o->attn_per_head);
                mark_cell(res, cell[g0 + j], "drift", modes[g0 + j], 1, ctx, t, d[j].seconds);
            }
            kvd_drift_free(&d[j]);
        }
        if (kvd_results_save(res, o->out, err)) kvd_die(1, cmd, "%s", err);
        pr->done += n - again;
    }
    free(is_copy), free(start);
    return failed;
}

/* What a reader wants at the end of a run: per mode and context, the output
 * drift, the attention drift and the decode speed at each concurrency. */
static void print_summary(const kvd_results *r, const run_opts *o) {
    const kvd_table *at = &r->t[KVD_T_ATTN], *tp = &r->t[KVD_T_TPUT];
    /* the columns of the cells this run measured */
    const int drift = o->cells & 1, nc = o->cells & 2 ? o->n_conc : 0;
    printf("\n%-13s %8s", "kv_mode", "context");
    if (drift)
        printf(" %11s %11s %10s %11s %11s %8s %9s %9s", "kl_mean", "kl_p99", "same_top",
               "ln_ppl_rat", "attn_kl", "router%", "k_sat%", "v_flush%");
    for (int k = 0; k < nc; k++) printf("  dec_tok_s@%-3d", o->conc[k]);
    printf("\n");
    for (int ci = 0; ci < o->n_ctx; ci++)
        for (int mi = 0; mi < o->n_modes; mi++) {
            const char *mode = kvd_kv_mode_name((kvd_kv_mode)o->modes[mi]);
            double v[5]; /* over every trace, as the report gives them */
            const char *names[5] = {"kl_mean", "kl_p99", "same_top_p", "ln_ppl_ratio",
                                    "router_flip_rate"};
            for (int j = 0; j < 5; j++)
                v[j] = kvd_results_summary(r, mode, o->ctx[ci], "all", names[j]);
            double num = 0, den = 0;
            for (int64_t i = 0; i < at->n; i++) {
                const kvd_row_attn *x = (const kvd_row_attn *)(at->rows + (size_t)i * at->row_size);
                if (!strcmp(x->mode, mode) && x->context == o->ctx[ci] &&
                    !strcmp(x->view, "propagated") && !strcmp(x->subset, "all") &&
                    !strcmp(x->metric, "kl"))
                    num += x->mean * x->n, den += x->n;
            }
            double ks, vf; /* the shares of K saturated and V flushed */
            kvd_results_kv_shares(r, mode, o->ctx[ci], &ks, &vf);
            printf("%-13s %8lld", mode, (long long)o->ctx[ci]);
            if (drift && isnan(v[0])) { /* no trace's cell finished */
                printf(" %11s %11s %10s %11s %11s %8s %9s %9s", "failed", "-", "-", "-", "-", "-",
                       "-", "-");
            } else if (drift) {
                printf(" %11.3e %11.3e %10.4f %11.3e %11.3e", v[0], v[1], v[2], v[3],
                       den > 0 ? num / den : NAN);
                if (isfinite(v[4]))
                    printf(" %8.3f", 100 * v[4]);
                else
                    printf(" %8s", "-"); /* a dense model: no router */
                if (isfinite(ks))
                    printf(" %9.3f %9.3f", 100 * ks, 100 * vf);
                else
                    printf(" %9s %9s", "-", "-");
            }
            for (int k = 0; k < nc; k++) {
                double d = NAN;
                for (int64_t i = 0; i < tp->n; i++) {
                    const kvd_row_tput *x =
                        (const kvd_row_tput *)(tp->rows + (size_t)i * tp->row_size);
                    if (!strcmp(x->mode, mode) && x->context == o->ctx[ci] &&
                        x->concurrency == o->conc[k])
                        d = x->decode_tok_s;
                }
                if (isnan(d))
                    printf("  %14s", "failed");
                else
                    printf("  %14.1f", d);
            }
            printf("\n");
        }
    if (drift)
        printf("\nkl: KL(P_bf16 || P_mode) of the next token, nats; same_top: share of positions "
               "with the BF16 argmax;\nln_ppl_rat: ln(PPL_mode / PPL_bf16); attn_kl: attention "
               "KL, propagated view, mean over layers;\nrouter%%: the share of (position, MoE "
               "layer) pairs routed to another top-k expert set than BF16's;\nk_sat%%, "
               "v_flush%%: the shares of K values saturated and of V values flushed to zero by "
               "the cache's writes.\n");
}

static const char *const run_help =
    "usage: kvdrift run [flags] -o run.h5        (or: kvdrift run --spec sweep.json)\n"
    "Runs each KV mode in lock step with the BF16 reference over synthetic agentic-coding\n"
    "traces and records drift per layer and position bucket, and throughput per concurrency,\n"
    "to an HDF5 results file (docs/results-schema.md). Rerunning the same command resumes\n"
    "(other modes, contexts and concurrency levels may be added; other settings are refused).\n"
    "A cell that fails (a NaN in its activations, say) is named, kept with why in the file's\n"
    "/failures (report, compare and trend list it), and the others run on; the exit is then 1.\n"
    "  --kv LIST            modes (default bf16,fp8-cal,fp8-unscaled,fp8-e5m2; also fp8-ckpt,\n"
    "                       nvfp4-cal, nvfp4-unscaled, nvfp4-ckpt, fp8-token, int8-token,\n"
    "                       int8-token-rn, int4-token)\n"
    "  --concurrency LIST   throughput concurrency levels (default 1,2,4,8,16,32)\n"
    "  --context LIST       context lengths in tokens (default 4096)\n"
    "  --traces N           evaluation traces per context (default 1)\n"
    "  --seed S             trace seed; traces use S .. S+N-1 (default 1)\n"
    "  --calibration R      absmax | modelopt | vllm-dynamic (default absmax)\n"
    "  --per-head           calibrate per KV head\n"
    "  --scales FILE        fp8-cal scales from a file (kvdrift calibrate) instead of calibrating\n"
    "  --attn-per-head      attention KL also per KV head (rows with kv_head >= 0)\n"
    "  --attn-fp8           E4M3 modes compute attention in FP8 as FlashAttention 3 does: the\n"
    "                       query in E4M3 (fp8-cal: calibrated q scales; others 1.0), the\n"
    "                       softmax weights rounded to E4M3\n"
    "  --fp8-overflow sat|nan  an FP8 write past the format's largest value: saturates, as\n"
    "                       the engines' kernels write (default sat), or becomes NaN (E4M3)\n"
    "                       or infinity (E5M2), as a plain cast does; a cell whose\n"
    "                       activations then turn non-finite fails and is named, the others\n"
    "                       are kept\n"
    "  --calib-tokens N     held-out calibration trace length (default " KVD_CALIB_TOKENS_TEXT ")\n"
    "  --sample-every K     attention figures every K positions and at copy starts (default 16)\n"
    "  --gen-tokens N       greedy tokens from prefixes of 1/4, 1/2 and all of the context "
    "(default 32)\n"
    "  --decode-tokens N    output tokens per request in throughput cells (default 16)\n"
    "  --repeats N          timed decode passes per throughput cell, after an untimed warm-up\n"
    "                       pass, each from the prefilled state: decode tokens/s is their\n"
    "                       median, the ITL percentiles are over all their steps (default 3)\n"
    "  --kv-budget SIZE     memory for the KV cache, e.g. 40GiB, 1.5TiB, 80GB (default 40GiB)\n"
    "  --threads N          worker threads (default: every core)\n"
    "  --cells LIST         drift, throughput or both (default drift,throughput)\n"
    "  --backend cpu|cuda   where the model runs: every cell and the calibration (default cpu)\n"
    "  --gpus N             split the model over N GPUs (tensor parallelism; default 1)\n"
    "  --spec FILE          the same settings as JSON, keys named like the flags\n";

int kvd_cmd_run(int argc, char **argv) {
    const char *cmd = "run";
    run_opts o;
    memset(&o, 0, sizeof o);
    kvd_model_opts_init(&o.mo);
    parse_modes("bf16,fp8-cal,fp8-unscaled,fp8-e5m2", &o);
    int defc[] = {1, 2, 4, 8, 16, 32};
    o.n_conc = 6;
    memcpy(o.conc, defc, sizeof defc);
    o.ctx[0] = 4096;
    o.n_ctx = 1;
    o.traces = 1;
    o.seed = 1;
    o.backend = "cpu";
    o.cells = 3;
    o.recipe = KVD_CAL_ABSMAX;
    o.calib_tokens = KVD_CALIB_TOKENS;
    o.kv_budget = 40.0 * 1073741824.0;
    o.decode_tokens = 16;
    o.repeats = 3;
    kvd_drift_opts_defaults(&o.dopt);
    kvd_args a = {argc, argv, 0, cmd};
    const char *f;
    while ((f = kvd_args_next(&a))) {
        if (run_flag(&o, &a, f)) continue;
        if (!strcmp(f, "--spec")) {
            load_spec(&o, kvd_args_value(&a, f));
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("%s%s", run_help, kvd_model_opts_help);
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s' (see kvdrift run --help)", f);
        }
    }
    if (!o.out) kvd_die(KVD_EXIT_USAGE, cmd, "expected -o FILE (or \"output\" in the spec)");
    kvd_check_scales_flags(cmd, o.scales_path, o.cal_given);
    if (o.dopt.attn_fp8) {
        int e4m3 = 0;
        for (int i = 0; i < o.n_modes; i++)
            e4m3 |= o.modes[i] == KVD_KV_FP8_CAL || o.modes[i] == KVD_KV_FP8_UNSCALED ||
                    o.modes[i] == KVD_KV_FP8_CKPT;
        if (!e4m3)
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "--attn-fp8: expected an E4M3 mode in --kv (fp8-cal, fp8-unscaled, fp8-ckpt): "
                    "FP8 attention changes no other mode");
    }
    char err[KVD_ERR_LEN], device[128];
    kvd_use_backend(&o.be, o.backend, cmd, device, (int)sizeof device);
    kvd_weights w;
    kvd_model_opts_build(&o.mo, cmd, &o.be, &w);
    const kvd_config *c = &w.cfg;
    int64_t max_ctx = 0;
    for (int i = 0; i < o.n_ctx; i++) max_ctx = o.ctx[i] > max_ctx ? o.ctx[i] : max_ctx;
    /* the tokens generated after the largest context run on past it: drift
     * cells' greedy continuation, throughput cells' decode */
    int after = o.cells & 1 ? o.dopt.gen_tokens : 0;
    if ((o.cells & 2) && o.decode_tokens > after) after = o.decode_tokens;
    if (max_ctx + after > c->max_position_embeddings)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "--context: %lld and the %d tokens generated after it (--gen-tokens, "
                "--decode-tokens) run past the model's max_position_embeddings %d",
                (long long)max_ctx, after, c->max_position_embeddings);
    kvd_check_positions(cmd, "--calib-tokens", o.calib_tokens, c);

    kvd_results res;
    kvd_results_init(&res);
    kvd_tmp_sweep(o.out); /* what a killed run left */
    struct stat st;
    if (stat(o.out, &st) == 0 && S_ISDIR(st.st_mode))
        kvd_die(KVD_EXIT_USAGE, cmd, "-o %s: a directory; expected a results file", o.out);
    /* an existing file is resumed: one that is not a results file is named
     * as such, not suggested for removal alone (it may be a trace set) */
    if (access(o.out, F_OK) == 0 && kvd_results_load(&res, o.out, err))
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s; a run resumes the file it writes, and cannot resume this one: write to "
                "another file (-o), or remove it to start over",
                err);
    const int resuming = res.t[KVD_T_CELLS].n > 0;
    /* a file without finished cells starts over: its failures were another sweep's */
    if (!resuming) res.t[KVD_T_FAIL].n = 0;
    /* an older file's cells lack figures this version keeps: finishing it
     * would write them as zeros under the newer version */
    if (resuming && res.schema_version != KVD_SCHEMA_VERSION)
        kvd_die(KVD_EXIT_USAGE, cmd,
                "%s: results schema version %d, and this kvdrift writes version %d: a run cannot "
                "resume it; write to another file (-o), or remove it to start over",
                o.out, res.schema_version, KVD_SCHEMA_VERSION);
    /* what the file says it holds, checked below against this run */
    char *was_model = res.model_json, *was_trace = res.trace_json, *was_settings = res.settings;
    res.settings = run_settings(&o, c, device, cmd);
    res.model_json = kvd_config_to_json(c);
    /* what the checkpoint asks of an engine's KV cache, beside what it costs */
    free(res.ckpt_audit);
    res.ckpt_audit = NULL;
    if (o.mo.model_dir) {
        kvd_config ac;
        kvd_audit au;
        if (kvd_audit_dir(o.mo.model_dir, &ac, &au, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
        json_t *aj = kvd_audit_json(&au);
        res.ckpt_audit = json_dumps(aj, JSON_COMPACT);
        json_decref(aj);
    }
    snprintf(res.backend, sizeof res.backend, "%s", o.backend);
    snprintf(res.device, sizeof res.device, "%s", device);
    res.seed = o.seed;
    res.weight_seed = o.mo.synth.seed;
    char cmdline[2048] = "kvdrift run";
    for (int i = 0; i < argc; i++) {
        strncat(cmdline, " ", sizeof cmdline - strlen(cmdline) - 1);
        strncat(cmdline, argv[i], sizeof cmdline - strlen(cmdline) - 1);
    }
    free(res.command);
    res.command = strdup(cmdline);

    /* the evaluation traces: each context its own, trace i with seed + i, as
     * long as the context and the tokens generated after it. A trace's tokens
     * depend on its length (its system prompt is at most an eighth of it), so
     * cutting one long trace for every context would make a short context's
     * figures depend on the sweep's longest (at 2048 of 32K tokens, nothing
     * but the system prompt). The calibration trace is held out apart. */
    kvd_trace *tr = calloc((size_t)o.n_ctx * o.traces, sizeof *tr);
    kvd_trace_spec sp;
    kvd_trace_spec_defaults(&sp);
    sp.vocab_size = c->vocab_size;
    for (int ci = 0; ci < o.n_ctx; ci++)
        for (int i = 0; i < o.traces; i++) {
            sp.length = o.ctx[ci] + o.dopt.gen_tokens + 1;
            sp.seed = o.seed + (uint64_t)i;
            if (kvd_trace_generate(&sp, &tr[(size_t)ci * o.traces + i], err))
                kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
        }
    sp.seed = o.seed;
    res.trace_json = trace_spec_json(&sp);
    if (resuming)
        check_resume(cmd, o.out, res.git_rev, was_settings, was_model, was_trace, res.settings,
                     res.model_json, res.trace_json);
    free(was_model), free(was_trace), free(was_settings);

    int run_mode[KVD_KV_N_MODES] = {0}, need_cal = 0;
    for (int i = 0; i < o.n_modes; i++) {
        run_mode[o.modes[i]] = 1;
        need_cal |= kvd_kv_mode_cal((kvd_kv_mode)o.modes[i]);
    }
    kvd_kv_mode_require_fit(cmd, run_mode, c->head_dim); /* before any cell runs */
    kvd_kv_scales sc = {0}, am = {0};
    kvd_kv_scales ck = {0};
    kvd_model_opts_ckpt_scales(&o.mo, cmd, c, &ck, run_mode);
    /* a --scales file is read (and checked) whether or not fp8-cal runs */
    if (o.scales_path) {
        int nf = kvd_config_n_full(c);
        if (kvd_scales_load(o.scales_path, &sc, nf, c->num_key_value_heads, c->num_attention_heads,
                            err))
            kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    }
    if (need_cal) {
        if (!o.scales_path && kvd_calibrate_trace(&o.be, &w, o.seed, o.calib_tokens, o.recipe,
                                                  o.per_head, &sc, &am, err))
            kvd_die(1, cmd, "%s", err);
        if (o.dopt.attn_fp8) kvd_check_query_scales(cmd, &sc, o.scales_path);
        if (!o.dopt.attn_fp8) { /* the query's scales are FP8 attention's alone */
            free(sc.q);
            sc.q = NULL, sc.n_heads = 0;
        }
        /* the file's fp8-cal cells ran with its scales (a --scales file may
         * have changed since) */
        const size_t ns = (size_t)sc.n_layers * sc.kv_heads, nq = (size_t)sc.n_layers * sc.n_heads;
        if (resuming && res.k_scale &&
            (res.cal_layers != sc.n_layers || res.cal_heads != sc.kv_heads ||
             memcmp(res.k_scale, sc.k, sizeof(float) * ns) ||
             memcmp(res.v_scale, sc.v, sizeof(float) * ns) || !res.q_scale != !sc.q ||
             (sc.q &&
              (res.cal_q_heads != sc.n_heads || memcmp(res.q_scale, sc.q, sizeof(float) * nq)))))
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "%s holds calibrated cells (fp8-cal, nvfp4-cal) run with other scales (its "
                    "/calibration) than this "
                    "run's%s%s: write to another file (-o), or remove it to start over",
                    o.out, o.scales_path ? " from " : "", o.scales_path ? o.scales_path : "");
        free(res.k_scale), free(res.v_scale);
        res.cal_layers = sc.n_layers, res.cal_heads = sc.kv_heads;
        res.k_scale = malloc(sizeof(float) * ns);
        res.v_scale = malloc(sizeof(float) * ns);
        memcpy(res.k_scale, sc.k, sizeof(float) * ns);
        memcpy(res.v_scale, sc.v, sizeof(float) * ns);
        free(res.q_scale);
        res.q_scale = NULL, res.cal_q_heads = 0;
        if (sc.q) {
            res.cal_q_heads = sc.n_heads;
            res.q_scale = malloc(sizeof(float) * nq);
            memcpy(res.q_scale, sc.q, sizeof(float) * nq);
        }
    }
    if (resuming)
        fprintf(stderr, "kvdrift run: resuming %s: %lld cells already finished\n", o.out,
                (long long)res.t[KVD_T_CELLS].n);

    progress pr = {o.n_ctx * o.n_modes *
                       ((o.cells & 1 ? o.traces : 0) + (o.cells & 2 ? o.n_conc : 0)),
                   0, kvd_now(), isatty(2)};
    int failed = 0;
    const kvd_kv_scales *mode_scales[KVD_KV_N_MODES];
    for (int mi = 0; mi < o.n_modes; mi++) {
        kvd_kv_mode mode = (kvd_kv_mode)o.modes[mi];
        mode_scales[mi] = kvd_kv_mode_ckpt(mode) ? &ck : kvd_kv_mode_scaled(mode) ? &sc : NULL;
    }
    for (int ci = 0; ci < o.n_ctx; ci++) {
        int64_t ctx = o.ctx[ci];
        kvd_trace *ctr = tr + (size_t)ci * o.traces; /* this context's traces */
        for (int t = 0; t < o.traces && (o.cells & 1); t++)
            failed |= drift_cells(&res, &o, &w, &ctr[t], ctx, t, mode_scales, &pr);
        for (int mi = 0; mi < o.n_modes; mi++) {
            kvd_kv_mode mode = (kvd_kv_mode)o.modes[mi];
            const kvd_kv_scales *msc = mode_scales[mi];
            for (int k = 0; k < o.n_conc && (o.cells & 2); k++) {
                char cell[64];
                snprintf(cell, sizeof cell, "tput_%s_c%d_ctx%lld", kvd_kv_mode_name(mode),
                         o.conc[k], (long long)ctx);
                progress_show(&pr, cell);
                if (kvd_results_has_cell(&res, cell)) {
                    pr.done++;
                    continue;
                }
                double t0 = kvd_now();
                kvd_row_tput row;
                memset(&row, 0, sizeof row);
                if (throughput_cell(&w, ctr, o.traces, mode, msc, o.conc[k], ctx, &o, &row, err)) {
                    fail_cell(&res, &o, cell, "throughput", mode, o.conc[k], ctx, -1, err);
                    if (kvd_results_save(&res, o.out, err)) kvd_die(1, cmd, "%s", err);
                    failed = 1;
                } else {
                    snprintf(row.mode, sizeof row.mode, "%s", kvd_kv_mode_name(mode));
                    row.concurrency = o.conc[k];
                    row.context = ctx;
                    *(kvd_row_tput *)kvd_results_add(&res, KVD_T_TPUT) = row;
                    mark_cell(&res, cell, "throughput", mode, o.conc[k], ctx, -1, kvd_now() - t0);
                    if (kvd_results_save(&res, o.out, err)) kvd_die(1, cmd, "%s", err);
                }
                pr.done++;
            }
        }
    }
    if (pr.tty) fprintf(stderr, "\n");
    /* an empty sweep (everything resumed) still leaves a complete file */
    if (kvd_results_save(&res, o.out, err)) kvd_die(1, cmd, "%s", err);
    print_summary(&res, &o);
    if (o.dopt.attn_fp8) printf("\nIn this run, %s\n", kvd_attn_fp8_text);
    if (!o.dopt.saturate) printf("\nIn this run, %s\n", kvd_fp8_nan_text);
    /* the headline the report leads with, for a log that only keeps stdout */
    kvd_run view;
    memset(&view, 0, sizeof view);
    view.r = res; /* borrowed: not freed through view */
    char hl[KVD_HEADLINE_MAX][KVD_HEADLINE_LEN];
    int nh = o.cells & 1 ? kvd_report_headline(&view, hl) : 0;
    if (nh) printf("\nagainst fp8-cal at %lld tokens:\n", kvd_run_max_context(&view));
    for (int h = 0; h < nh; h++) printf("  %s\n", hl[h]);
    printf("\nwrote %s: %lld cells (%lld drift rows, %lld throughput rows)\n", o.out,
           (long long)res.t[KVD_T_CELLS].n, (long long)res.t[KVD_T_OUTPUT].n,
           (long long)res.t[KVD_T_TPUT].n);
    /* and what did not finish, as the report lists it */
    char head[KVD_ERR_LEN];
    snprintf(head, sizeof head,
             "\n%lld %s not finish (%s keeps why in /failures):", (long long)res.t[KVD_T_FAIL].n,
             res.t[KVD_T_FAIL].n == 1 ? "cell did" : "cells did", o.out);
    kvd_print_failures(stdout, &view, head, "  ");
    for (int i = 0; i < o.n_ctx * o.traces; i++) kvd_trace_free(&tr[i]);
    free(tr);
    kvd_kv_scales_free(&sc), kvd_kv_scales_free(&am), kvd_kv_scales_free(&ck);
    kvd_results_free(&res);
    kvd_weights_free(&w);
    for (int i = 0; i < o.n_owned; i++) free(o.owned[i]);
    return failed;
}
