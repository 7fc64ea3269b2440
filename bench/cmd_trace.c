/* kvdrift: `trace gen`, `trace stats` and `trace import`. */
#include <csv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../datasets/trace.h"
#include "commands.h"
#include "util.h"

static int trace_gen(int argc, char **argv) {
    const char *cmd = "trace gen", *out = NULL, *f;
    kvd_args a = {argc, argv, 0, cmd};
    kvd_trace_spec sp;
    kvd_trace_spec_defaults(&sp);
    int count = 1, have_len = 0;
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--length")) {
            sp.length = kvd_args_long(&a, f, 1, 1L << 31);
            have_len = 1;
        } else if (!strcmp(f, "--seed")) {
            sp.seed = (uint64_t)kvd_args_long(&a, f, 0, 2147483647L);
        } else if (!strcmp(f, "--kind")) {
            snprintf(sp.kind, sizeof sp.kind, "%s", kvd_args_value(&a, f));
        } else if (!strcmp(f, "--vocab")) {
            sp.vocab_size = kvd_args_long(&a, f, 64, 4294967295L);
        } else if (!strcmp(f, "--reuse-max")) {
            sp.reuse_max = kvd_args_long(&a, f, 16, 1L << 31);
        } else if (!strcmp(f, "--count")) {
            count = (int)kvd_args_long(&a, f, 1, 10000);
        } else if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift trace gen --length N [--seed S] [--kind agentic-coding] "
                   "[--vocab V] [--reuse-max D] [--count K] -o FILE\n"
                   "K traces with seeds S .. S+K-1 go into one file (a trace set).\n");
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        }
    }
    if (!have_len) kvd_die(KVD_EXIT_USAGE, cmd, "expected --length N");
    if (!out) kvd_die(KVD_EXIT_USAGE, cmd, "expected -o FILE");
    if (strcmp(sp.kind, "agentic-coding"))
        kvd_die(KVD_EXIT_USAGE, cmd, "--kind: expected agentic-coding, got '%s'", sp.kind);
    kvd_trace *t = calloc((size_t)count, sizeof *t);
    char err[KVD_ERR_LEN];
    double t0 = kvd_now();
    for (int i = 0; i < count; i++) {
        kvd_trace_spec s = sp;
        s.seed = sp.seed + (uint64_t)i;
        if (kvd_trace_generate(&s, &t[i], err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    }
    double t1 = kvd_now();
    if (kvd_trace_save(out, t, count, err)) kvd_die(1, cmd, "%s", err);
    double t2 = kvd_now();
    int64_t refs = 0;
    for (int i = 0; i < count; i++) refs += t[i].n_refs;
    printf("wrote %s: %d trace(s) of %lld tokens (seed %llu..), %.1f%% copied tokens; "
           "generate %.3f s, write %.3f s\n",
           out, count, (long long)sp.length, (unsigned long long)sp.seed,
           100.0 * refs / ((double)sp.length * count), t1 - t0, t2 - t1);
    for (int i = 0; i < count; i++) kvd_trace_free(&t[i]);
    free(t);
    return 0;
}

static void csv_out(FILE *f, int n, const char *const *fields) {
    for (int i = 0; i < n; i++) {
        if (i) fputc(',', f);
        csv_fwrite(f, fields[i], strlen(fields[i]));
    }
    fputc('\n', f);
}

static int trace_stats(int argc, char **argv) {
    const char *cmd = "trace stats", *path = NULL, *f;
    int csv = 0;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--format")) {
            const char *v = kvd_args_value(&a, f);
            if (strcmp(v, "csv") && strcmp(v, "text"))
                kvd_die(KVD_EXIT_USAGE, cmd, "--format: expected text or csv, got '%s'", v);
            csv = !strcmp(v, "csv");
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift trace stats FILE [--format text|csv]\n"
                   "Per trace: length, segment mix (share of tokens per kind), copied tokens and "
                   "the\nreuse-distance histogram of copies.\n");
            return 0;
        } else if (f[0] == '-') {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        } else {
            path = f;
        }
    }
    if (!path) kvd_die(KVD_EXIT_USAGE, cmd, "expected a trace FILE");
    kvd_trace *ts;
    int n;
    char err[KVD_ERR_LEN];
    if (kvd_trace_load(path, &ts, &n, err)) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    if (csv) {
        const char *h[] = {"trace", "table", "key", "count", "tokens", "share"};
        csv_out(stdout, 6, h);
    }
    for (int i = 0; i < n; i++) {
        kvd_trace *t = &ts[i];
        int64_t segs[KVD_SEG_N] = {0}, toks[KVD_SEG_N] = {0}, hist[64];
        for (int64_t s = 0; s < t->n_segs; s++) {
            int k = t->segs[s].kind >= 0 && t->segs[s].kind < KVD_SEG_N ? t->segs[s].kind : 0;
            segs[k]++;
            toks[k] += t->segs[s].length;
        }
        kvd_trace_reuse_hist(t, hist);
        char c1[32], c2[32], c3[32], key[32];
        if (!csv) {
            printf("trace %s: %lld tokens, vocab %lld, %lld segments, %lld copied tokens "
                   "(%.1f%%)\n",
                   t->name, (long long)t->n, (long long)t->spec.vocab_size, (long long)t->n_segs,
                   (long long)t->n_refs, 100.0 * t->n_refs / (double)t->n);
            printf("  %-10s %9s %10s %7s\n", "segment", "segments", "tokens", "share");
        }
        for (int k = 0; k < KVD_SEG_N; k++) {
            if (!segs[k]) continue;
            if (csv) {
                snprintf(c1, sizeof c1, "%lld", (long long)segs[k]);
                snprintf(c2, sizeof c2, "%lld", (long long)toks[k]);
                snprintf(c3, sizeof c3, "%.6f", toks[k] / (double)t->n);
                const char *row[] = {t->name, "segments", kvd_seg_name((kvd_seg_kind)k),
                                     c1,      c2,         c3};
                csv_out(stdout, 6, row);
            } else {
                printf("  %-10s %9lld %10lld %6.1f%%\n", kvd_seg_name((kvd_seg_kind)k),
                       (long long)segs[k], (long long)toks[k], 100.0 * toks[k] / (double)t->n);
            }
        }
        if (!csv) printf("  reuse distance of copied tokens (log2 buckets):\n");
        for (int b = 0; b < 64; b++) {
            if (!hist[b]) continue;
            if (csv) {
                snprintf(key, sizeof key, "%llu-%llu", 1ull << b, (2ull << b) - 1);
                snprintf(c2, sizeof c2, "%lld", (long long)hist[b]);
                snprintf(c3, sizeof c3, "%.6f", hist[b] / (double)(t->n_refs ? t->n_refs : 1));
                const char *row[] = {t->name, "reuse_distance", key, "", c2, c3};
                csv_out(stdout, 6, row);
            } else {
                printf("  %10llu .. %-10llu %10lld %6.1f%%\n", 1ull << b, (2ull << b) - 1,
                       (long long)hist[b], 100.0 * hist[b] / (double)t->n_refs);
            }
        }
        kvd_trace_free(t);
    }
    free(ts);
    return 0;
}

static int trace_import(int argc, char **argv) {
    const char *cmd = "trace import", *out = NULL, *text = NULL, *csvp = NULL, *f;
    int64_t vocab = 248320;
    kvd_args a = {argc, argv, 0, cmd};
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--text")) {
            text = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--csv")) {
            csvp = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--vocab")) {
            vocab = kvd_args_long(&a, f, 2, 4294967295L);
        } else if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            out = kvd_args_value(&a, f);
        } else if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            printf("usage: kvdrift trace import --text FILE | --csv FILE [--vocab V] -o FILE\n"
                   "Token ids as a trace file: --text, ids separated by whitespace; --csv, rows "
                   "id[,segment]\n(an optional header id,segment; segment one of the trace "
                   "kinds). Ids below V (default\n248320). docs/trace-format.md has the "
                   "details.\n");
            return 0;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        }
    }
    if (!out || (!text == !csvp))
        kvd_die(KVD_EXIT_USAGE, cmd, "expected --text FILE or --csv FILE, and -o FILE");
    kvd_trace t;
    char err[KVD_ERR_LEN];
    int rc = text ? kvd_trace_import_text(text, vocab, &t, err)
                  : kvd_trace_import_csv(csvp, vocab, &t, err);
    if (rc) kvd_die(KVD_EXIT_USAGE, cmd, "%s", err);
    if (kvd_trace_save(out, &t, 1, err)) kvd_die(1, cmd, "%s", err);
    printf("wrote %s: %lld tokens, %lld segments\n", out, (long long)t.n, (long long)t.n_segs);
    kvd_trace_free(&t);
    return 0;
}

int kvd_cmd_trace(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "gen")) return trace_gen(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "stats")) return trace_stats(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "import")) return trace_import(argc - 1, argv + 1);
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"))) {
        printf("usage: kvdrift trace gen|stats|import ... (kvdrift trace SUBCOMMAND --help)\n"
               "  gen     synthetic agentic-coding traces\n"
               "  stats   length, segment mix, reuse-distance histogram of a trace file\n"
               "  import  token ids from a text or CSV file as a trace\n");
        return 0;
    }
    kvd_die(KVD_EXIT_USAGE, "trace", "expected gen, stats or import");
}
