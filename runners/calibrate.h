/* kvdrift: KV scale calibration (the recipes real tools use) and the scales
 * file that carries the result. */
#ifndef KVD_CALIBRATE_H
#define KVD_CALIBRATE_H

#include <stdint.h>

#include "engine.h"
#include "kvcache.h"
#include "weights.h"

/* The calibration trace's seed is the evaluation seed plus this: held out. */
#define KVD_CALIB_SEED_OFFSET 1000003u
/* The calibration trace's default length, the same for run, forward and
 * calibrate: scales calibrate writes into a checkpoint are then, by default,
 * exactly the ones run's fp8-cal uses, and fp8-ckpt reproduces fp8-cal. */
#define KVD_CALIB_TOKENS 2048
#define KVD_CALIB_TEXT_(n) #n
#define KVD_CALIB_TEXT(n) KVD_CALIB_TEXT_(n)
#define KVD_CALIB_TOKENS_TEXT KVD_CALIB_TEXT(KVD_CALIB_TOKENS) /* for help texts */

typedef enum {
    KVD_CAL_ABSMAX = 0, /* absmax / 448 */
    KVD_CAL_MODELOPT,   /* max(absmax / 448, 1.0): ModelOpt's export clamp */
    KVD_CAL_VLLM,       /* K absmax / 200, V absmax / 100: vLLM's calculate_kv_scales */
    KVD_CAL_N
} kvd_cal_recipe;

const char *kvd_cal_recipe_name(kvd_cal_recipe r);
int kvd_cal_recipe_parse(const char *s, kvd_cal_recipe *r);

/* Turn measured absmax values into scales with a recipe. */
float kvd_cal_scale(kvd_cal_recipe r, int is_v, float absmax);

/* Run the BF16 model (on back end be) over a held-out calibration trace
 * and fill scales (per KV head when per_head, else one per layer) and the
 * absmax measured; the query's too (per query head when per_head, by the
 * recipe's K rule) where the back end notes queries (the CPU's). */
int kvd_calibrate(const kvd_backend *be, const kvd_weights *w, const int32_t *tok, int n,
                  kvd_cal_recipe recipe, int per_head, kvd_kv_scales *scales, kvd_kv_scales *absmax,
                  char *err);

/* Scales file (JSON): written atomically, read back with full checks. */
int kvd_scales_save(const char *path, const kvd_kv_scales *s, const kvd_kv_scales *absmax,
                    kvd_cal_recipe recipe, const char *model, int calib_tokens, uint64_t seed,
                    char *err);
/* A file's q_scale entries (one per query head, n_heads a layer) are
 * optional: in every layer or in none. */
int kvd_scales_load(const char *path, kvd_kv_scales *s, int n_layers, int kv_heads, int n_heads,
                    char *err);

#endif
