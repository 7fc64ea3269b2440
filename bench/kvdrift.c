/* kvdrift: the command line. One binary, one subcommand per job. */
#include <stdio.h>
#include <string.h>

#include "gitrev.h" /* KVD_GIT_REV, written at build time */
#include "../kernels/backend.h"
#include "../kernels/kernels.h"
#include "../runners/fileio.h"
#include "commands.h"
#include "results.h"

static void usage(FILE *f) {
    fprintf(f,
            "kvdrift %s (%s): precision drift of FP8 KV caches in hybrid LLMs\n"
            "\n"
            "usage: kvdrift COMMAND [flags]   (kvdrift COMMAND --help for its flags)\n"
            "\n"
            "  run         the sweep: drift against BF16 and throughput per KV mode,\n"
            "              concurrency and context, to an HDF5 results file\n"
            "  report      HTML / Markdown / CSV report from result files\n"
            "  compare     baseline against candidate with a thresholds CSV (exit 1: regression)\n"
            "  trend       a series of runs of one sweep (nightly results), oldest first: how\n"
            "              each mode's drift moved run by run, and where settings changed\n"
            "  audit       what a checkpoint's quantization config makes an engine do to the\n"
            "              KV cache (--strict: exit 1 for FP8 KV without scales)\n"
            "  plan        KV capacity per mode for a memory budget\n"
            "  forward     run the hybrid model over a synthetic trace in each KV mode and\n"
            "              print what every mode did to the cache and the logits\n"
            "  calibrate   measure K/V absmax on a held-out trace and write a scales file\n"
            "  export      write a model as a Hugging Face checkpoint (config.json,\n"
            "              model.safetensors)\n"
            "  trace       synthetic agentic-coding traces: gen, stats, import\n"
            "  bench       kernel benchmarks (kvdrift bench kernels)\n"
            "  schema      the results file's tables and columns (Markdown)\n"
            "  version     version, revision and back ends\n",
            KVD_VERSION, KVD_GIT_REV);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    kvd_tmp_guard(); /* an interrupted write leaves no temporary behind */
    char err[256];
    /* kernels named that this CPU or build lacks, or a setting misspelt */
    if (kvd_cpu_gemm_env(err, sizeof err) || kvd_attn_env(err, sizeof err) ||
        kvd_cuda_env_check(err, sizeof err)) {
        fprintf(stderr, "kvdrift: %s\n", err);
        return 2;
    }
    if (!strcmp(cmd, "forward")) return kvd_cmd_forward(argc - 2, argv + 2);
    if (!strcmp(cmd, "calibrate")) return kvd_cmd_calibrate(argc - 2, argv + 2);
    if (!strcmp(cmd, "export")) return kvd_cmd_export(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return kvd_cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "trace")) return kvd_cmd_trace(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return kvd_cmd_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "report")) return kvd_cmd_report(argc - 2, argv + 2);
    if (!strcmp(cmd, "compare")) return kvd_cmd_compare(argc - 2, argv + 2);
    if (!strcmp(cmd, "trend")) return kvd_cmd_trend(argc - 2, argv + 2);
    if (!strcmp(cmd, "audit")) return kvd_cmd_audit(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return kvd_cmd_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "schema")) {
        kvd_results_schema_md(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version")) {
        kvd_cuda_info ci;
        kvd_cuda_probe(&ci);
        printf("kvdrift %s (%s)\nback ends: cpu%s\nblas: %s\nattention: %s\ncuda: %s%s\n",
               KVD_VERSION, KVD_GIT_REV, ci.compiled ? ", cuda" : "", kvd_cpu_blas(),
               kvd_attn_kernels(), ci.devices ? "" : "", ci.name);
        return 0;
    }
    fprintf(stderr, "kvdrift: unknown command '%s' (kvdrift --help lists them)\n", cmd);
    return 2;
}
