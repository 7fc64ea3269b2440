/* kvdrift: `plan`: what a memory budget holds in each KV mode, for this
 * model: KV bytes per token, tokens of cache, and how many sequences of a
 * given context fit once each sequence's Gated DeltaNet state (fp32,
 * constant in the context) is paid for too. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../runners/kvcache.h"
#include "commands.h"
#include "util.h"

int kvd_cmd_plan(int argc, char **argv) {
    const char *cmd = "plan", *f, *budget_s = "40GiB";
    kvd_model_opts mo;
    kvd_model_opts_init(&mo);
    long ctx = 131072;
    int gpus = 1;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--kv-budget")) {
            budget_s = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--context")) {
            ctx = kvd_args_long(&a, f, 1, 1L << 30);
        } else if (!strcmp(f, "--gpus")) {
            gpus = (int)kvd_args_long(&a, f, 1, KVD_MAX_GPUS);
        } else if (!strcmp(f, "--model")) {
            mo.preset = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--config")) {
            mo.config_path = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--model-dir")) {
            mo.model_dir = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift plan [--model PRESET | --config FILE | --model-dir DIR] "
                   "[--kv-budget 40GiB] [--context 131072]\n"
                   "                    [--gpus N]\n"
                   "What a KV budget holds in each mode: bytes per token, tokens, and sequences "
                   "of the\ncontext once each one's Gated DeltaNet state is paid for. With "
                   "--gpus N the budget is\neach GPU's under tensor parallelism (as run --gpus "
                   "splits the model): a GPU caches\nits share of the KV heads (one each, "
                   "replicated, when there are fewer heads than GPUs)\nand of the state.\n");
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        }
    }
    const double budget = kvd_kv_budget(cmd, budget_s);
    /* the shapes only: no weights are built */
    kvd_config c;
    char err[KVD_ERR_LEN], path[4200];
    int rc;
    if (mo.model_dir) {
        snprintf(path, sizeof path, "%s/config.json", mo.model_dir);
        rc = kvd_config_load(path, &c, err);
    } else if (mo.config_path) {
        rc = kvd_config_load(mo.config_path, &c, err);
    } else {
        rc = kvd_config_preset(mo.preset, &c, err);
    }
    if (rc) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    if (kvd_config_tp_check(&c, gpus, KVD_MAX_GPUS, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    const int kvh = kvd_config_tp_kv_heads(&c, gpus);
    int nf = kvd_config_n_full(&c), nl = c.num_hidden_layers - nf;
    double state =
        (double)nl *
        ((double)c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim +
         (double)kvd_conv_dim(&c) * (c.linear_conv_kernel_dim - 1)) *
        4.0 / gpus; /* each GPU holds its share of the DeltaNet heads' state */
    char desc[512];
    printf("model %s\n", kvd_describe_model(&c, desc, sizeof desc));
    if (gpus > 1) {
        printf("budget %s (%.0f bytes) on each of %d GPUs; each caches %d of %d KV heads", budget_s,
               budget, gpus, kvh, c.num_key_value_heads);
        if (gpus > c.num_key_value_heads)
            printf(" (each head on %d GPUs)", gpus / c.num_key_value_heads);
        printf(" and %.1f MiB of Gated DeltaNet state per sequence (fp32, any context)\n\n",
               state / 1048576.0);
    } else {
        printf("budget %s (%.0f bytes); Gated DeltaNet state %.1f MiB per sequence (fp32, any "
               "context)\n\n",
               budget_s, budget, state / 1048576.0);
    }
    printf("%-13s %14s %16s %18s %16s\n", "kv_mode", "kv_B_per_token", "tokens_in_budget",
           "seqs_at_context", "vs_bf16");
    double bf16_seqs = 0;
    for (int m = 0; m < KVD_KV_N_MODES; m++) {
        if (kvd_kv_mode_ckpt((kvd_kv_mode)m)) continue; /* the same bytes as the -cal modes */
        if (!kvd_kv_mode_fits((kvd_kv_mode)m, c.head_dim)) {
            printf("%-13s %14s  (%s)\n", kvd_kv_mode_name((kvd_kv_mode)m), "-",
                   kvd_kv_mode_unfit((kvd_kv_mode)m, c.head_dim));
            continue;
        }
        int64_t bpt =
            kvd_kvcache_bytes_per_token((kvd_kv_mode)m, nf, kvh, c.head_dim); /* a GPU's */
        double seqs = budget / ((double)bpt * ctx + state);
        if (m == KVD_KV_BF16) bf16_seqs = seqs;
        printf("%-13s %14lld %16.0f %18.1f %15.2fx\n", kvd_kv_mode_name((kvd_kv_mode)m),
               (long long)bpt, floor(budget / (double)bpt), seqs,
               bf16_seqs > 0 ? seqs / bf16_seqs : 1.0);
    }
    printf("\nseqs_at_context: sequences of %ld tokens that fit, KV cache and recurrent state "
           "together%s\n",
           ctx, gpus > 1 ? " (every GPU holds its share of each sequence)" : "");
    return 0;
}
