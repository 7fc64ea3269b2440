/* kvdrift: command-line plumbing shared by the subcommands: flag parsing,
 * model set-up from --model/--config and the synthetic-weight knobs, timing. */
#ifndef KVD_UTIL_H
#define KVD_UTIL_H

#include <stdint.h>

#include "../runners/config.h"
#include "../runners/engine.h"
#include "../runners/kvcache.h"
#include "../runners/weights.h"
#include "clock.h"

/* Exit codes: 0 ok, 1 failure of the measured thing (regression, --strict), 2 usage or input. */
#define KVD_EXIT_USAGE 2

typedef struct {
    int argc;
    char **argv;
    int i;
    const char *cmd;
} kvd_args;

/* Iterate flags: returns the flag name (without value) or NULL at the end. */
const char *kvd_args_next(kvd_args *a);
/* The value of the current flag; exits with a usage error when missing. */
const char *kvd_args_value(kvd_args *a, const char *flag);
long kvd_args_long(kvd_args *a, const char *flag, long lo, long hi);
double kvd_args_double(kvd_args *a, const char *flag, double lo, double hi);

/* Print "kvdrift CMD: msg" to stderr and exit with code. */
_Noreturn void kvd_die(int code, const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Model selection shared by every subcommand that builds a model. */
typedef struct {
    const char *preset;
    const char *config_path;
    const char *model_dir; /* a Hugging Face checkpoint directory: real weights */
    const char *profile;   /* activation-profile CSV: per-layer K outlier scale and V rms */
    kvd_synth synth;
} kvd_model_opts;

/* The checkpoint modes' scales (fp8-ckpt, nvfp4-ckpt), where run (one flag
 * a mode, KVD_KV_N_MODES of them) asks for one: read once from
 * --model-dir's checkpoint into s (zeroed before; untouched without a
 * checkpoint mode). Layers without them get 1.0 with the warning an engine
 * prints, and a mode that is not the cache the checkpoint asks for is
 * named, each mode run in its own words. Exits on bad input. */
void kvd_model_opts_ckpt_scales(const kvd_model_opts *o, const char *cmd, const kvd_config *cfg,
                                kvd_kv_scales *s, const int *run);
/* Exit 2 naming the first mode run (flags as above) that cannot cache rows
 * of head_dim values (NVFP4 without whole groups of 16, int4-token without
 * a power of two). */
void kvd_kv_mode_require_fit(const char *cmd, const int *run, int head_dim);

void kvd_model_opts_init(kvd_model_opts *o);
/* Consume a model flag if `flag` is one; returns 1 when consumed. */
int kvd_model_opts_flag(kvd_model_opts *o, kvd_args *a, const char *flag);
/* Resolve config and build the weights (a checkpoint's, or synthetic) for
 * back end be (lazy for the device one; NULL: in memory, for the host's own
 * use); exits with a clear message on error. */
void kvd_model_opts_build(const kvd_model_opts *o, const char *cmd, const kvd_backend *be,
                          kvd_weights *w);
/* Exits with a usage error naming flag when a sequence of n tokens would
 * run past the model's max_position_embeddings. */
void kvd_check_positions(const char *cmd, const char *flag, int64_t n, const kvd_config *c);
/* --scales gives fp8-cal's scales; the calibration flags (cal_given: any of
 * --calibration, --per-head, --calib-tokens) make them: exits when both. */
void kvd_check_scales_flags(const char *cmd, const char *scales_path, int cal_given);
/* --attn-fp8 with fp8-cal: its scales (from scales_path, else the
 * calibration) must hold the query's; one clear line and exit 2 if not */
void kvd_check_query_scales(const char *cmd, const kvd_kv_scales *sc, const char *scales_path);
/* Where the weights kvd_model_opts_build made come from, as JSON: a
 * checkpoint's directory and the fingerprint of its contents, or every knob
 * of the synthetic ones (a profile's per-layer values included); NULL when
 * the checkpoint or profile no longer reads. */
struct json_t;
struct json_t *kvd_model_opts_weights_json(const kvd_model_opts *o, const kvd_config *cfg);
extern const char *const kvd_model_opts_help;

/* "40GiB", "512MiB", "1.5TiB", "80GB", "4096B": bytes (binary units KiB to
 * TiB, decimal kB/KB to TB, B); 0 when not a positive finite size. */
double kvd_parse_bytes(const char *s);
/* --kv-budget's value in bytes, or cmd exits 2 saying what a size is. */
double kvd_kv_budget(const char *cmd, const char *s);

void kvd_set_threads(int n);
int kvd_threads(void);
const char *kvd_describe_model(const kvd_config *c, char *buf, int len);

/* --backend NAME with be->gpus already set by --gpus: the back end, with
 * enough devices visible, or exit with the reason; desc (when not NULL)
 * names where it runs. */
#define KVD_MAX_GPUS 16
void kvd_use_backend(kvd_backend *be, const char *name, const char *cmd, char *desc, int len);

#endif
