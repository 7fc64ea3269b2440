/* kvdrift: the device benchmarks (`kvdrift bench cuda`, and kvd_gpu_bench,
 * the lean executable the GPU check carries to a machine without the
 * host's libraries). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/cuda_kernels.h"
#include "../runners/config.h"
#include "../runners/model_cuda.h"
#include "../runners/weights.h"
#include "bench_cuda.h"
#include "clock.h"

/* The whole model on the device at one preset: C sequences of ctx tokens
 * each (prefilled), then greedy decode steps of all C at once, the next
 * tokens taken on the device and copied back (as an engine samples, and as
 * the sweep's throughput cells decode after their first step). ms per step
 * and tokens/s with a BF16 cache, and an FP8 one when with_fp8 (each its
 * own model: the weights are made twice), the model split over `gpus`
 * devices; 0, or -1 when a step failed. The weights' bulk draws are
 * uniform (kvd_synth.uniform_draws): qwen3.5-397b-a17b's 34G values take
 * about 55 s of 16 threads as normals, 8 s as uniforms, and a step's time
 * depends on the values only through the routing, which both laws spread
 * over the experts alike. */
/* n greedy decode steps of the C sequences seqs (one token each, from nxt,
 * which takes the next), the first `warm` untimed: the seconds of the
 * rest, or -1 when a step failed (err says why) */
static double greedy_steps(kvd_cuda_model *m, kvd_kvcache *kv, int C, int *seqs, int *ones,
                           int32_t *nxt, int n, int warm, char *err) {
    double t = 0;
    for (int st = 0; st < n; st++) {
        kvd_batch b = {C, seqs, ones, nxt};
        const double a = kvd_now();
        if (kvd_cuda_forward_greedy(m, kv, &b, nxt, err)) return -1;
        if (st >= warm) t += kvd_now() - a;
    }
    return t;
}

int kvd_bench_model(const char *preset, int ctx, int steps, int with_fp8, int gpus) {
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_synth syn;
    kvd_synth_defaults(&syn);
    syn.uniform_draws = 1;
    if (kvd_config_preset(preset, &cfg, err)) {
        fprintf(stderr, "bench model: %s\n", err);
        return -1;
    }
    const int Cs[3] = {1, 8, 32}, V = cfg.vocab_size, nf = kvd_config_n_full(&cfg);
    const kvd_kv_mode modes[2] = {KVD_KV_BF16, KVD_KV_FP8_UNSCALED};
    double tps[2][3] = {{0}};
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)ctx);
    uint64_t key = kvd_rng_key(21, "bench.model.tokens");
    for (int i = 0; i < ctx; i++) tok[i] = (int32_t)(kvd_rng_uniform(key, (uint64_t)i) * V) % V;
    /* the roofline: what a step must move, against the copy bandwidth */
    const double bw = kvd_cuda_copy_bandwidth((size_t)1 << 30, 5);
    printf("\nthe whole model on %d device%s, %s (weights drawn uniform), %d-token contexts, %d "
           "greedy decode\nsteps (sampled on the device); device copy bandwidth %.1f GB/s:\n",
           gpus, gpus > 1 ? "s" : "", preset, ctx, steps, bw / 1e9);
    int rc = 0;
    const int n_modes = with_fp8 ? 2 : 1;
    for (int mi = 0; mi < n_modes && rc == 0; mi++) {
        kvd_kvcache kv;
        if (kvd_kvcache_init(&kv, modes[mi], nf, cfg.num_key_value_heads, cfg.head_dim, 16,
                             (int64_t)32 * (ctx + 2 * steps + 32), NULL, 1, err)) {
            fprintf(stderr, "bench model: %s\n", err);
            rc = -1;
            break;
        }
        double t0 = kvd_now();
        kvd_cuda_model *m = kvd_cuda_model_new_synth(&cfg, &syn, &kv, 512, 32, gpus, err);
        if (!m) {
            fprintf(stderr, "bench model: %s\n", err);
            kvd_kvcache_free(&kv);
            rc = -1;
            break;
        }
        printf("  %s cache: weights made and uploaded in %.1f s\n", kvd_kv_mode_name(modes[mi]),
               kvd_now() - t0);
        for (int ci = 0; ci < 3 && rc == 0; ci++) {
            int C = Cs[ci], seqs[32], ones[32];
            int32_t nxt[32];
            for (int s = 0; s < C; s++) {
                seqs[s] = kvd_kvcache_add_seq(&kv), ones[s] = 1;
                kvd_cuda_model_reset_seq(m, seqs[s]);
                for (int p = 0; p < ctx && rc == 0; p += 512) {
                    int n = ctx - p < 512 ? ctx - p : 512;
                    kvd_batch b = {1, &seqs[s], &n, tok + p};
                    rc = kvd_cuda_forward(m, &kv, &b, NULL, 0, err);
                }
                nxt[s] = tok[(s * 7) % ctx];
            }
            const double t = rc ? -1 : greedy_steps(m, &kv, C, seqs, ones, nxt, steps + 2, 2, err);
            rc = t < 0 ? -1 : 0;
            if (rc) {
                fprintf(stderr, "bench model: %s\n", err);
                break;
            }
            tps[mi][ci] = C * steps / t;
            printf("  %-13s C %2d: %8.2f ms per step %9.1f tokens/s\n", kvd_kv_mode_name(modes[mi]),
                   C, 1e3 * t / steps, tps[mi][ci]);
            kvd_step_bytes sb;
            kvd_decode_step_bytes(&cfg, C, ctx + steps / 2,
                                  (double)kvd_kvcache_bytes_per_token(
                                      modes[mi], nf, cfg.num_key_value_heads, cfg.head_dim),
                                  &sb);
            const double need = sb.dense + sb.experts + sb.cache + sb.state;
            if (bw > 0)
                printf("  %-13s C %2d: a step moves %.2f GB at least (dense weights %.2f, experts "
                       "%.2f expected, cache %.2f, state %.2f): %.1f GB/s, %.1f%% of the copy "
                       "bandwidth\n",
                       "", C, need / 1e9, sb.dense / 1e9, sb.experts / 1e9, sb.cache / 1e9,
                       sb.state / 1e9, need / (t / steps) / 1e9, 100 * need / (t / steps) / bw);
            /* where the time goes: three more steps, each phase drained */
            double ph[KVD_PHASES], pt = 0;
            kvd_cuda_model_profile(m, 1);
            rc = greedy_steps(m, &kv, C, seqs, ones, nxt, 3, 3, err) < 0 ? -1 : 0;
            kvd_cuda_model_phases(m, ph);
            kvd_cuda_model_profile(m, 0);
            if (rc) fprintf(stderr, "bench model: %s\n", err);
            for (int p = 0; p < KVD_PHASES; p++) pt += ph[p];
            if (rc == 0 && pt > 0) {
                printf("  %-13s C %2d: %8.2f ms a step drained at each phase:", "", C,
                       1e3 * pt / 3);
                for (int p = 0; p < KVD_PHASES; p++)
                    printf(" %s %.1f%%", kvd_cuda_phase_names[p], 100 * ph[p] / pt);
                printf("\n");
            }
            /* at C = 32 the projections run through cuBLASLt: the same
             * steps again with its algorithms tuned (KVD_CUDA_GEMM=tune),
             * tuned in the two warm-up steps */
            if (rc == 0 && mi == 0 && C == 32) {
                kvd_cuda_gemm_set_tune(1);
                const double tt = greedy_steps(m, &kv, C, seqs, ones, nxt, steps + 2, 2, err);
                kvd_cuda_gemm_set_tune(-1);
                rc = tt < 0 ? -1 : 0;
                if (rc)
                    fprintf(stderr, "bench model: %s\n", err);
                else
                    printf("  %-13s C %2d: %8.2f ms per step %9.1f tokens/s with "
                           "KVD_CUDA_GEMM=tune (%d shapes tuned): %.3fx the heuristic's first "
                           "choice\n",
                           "", C, 1e3 * tt / steps, C * steps / tt, kvd_cuda_gemm_tuned(), t / tt);
            }
            for (int s = 0; s < C; s++) kvd_kvcache_release(&kv, seqs[s]);
        }
        kvd_cuda_model_free(m);
        kvd_kvcache_free(&kv);
    }
    if (rc == 0 && with_fp8)
        for (int ci = 0; ci < 3; ci++)
            printf("  C %2d: FP8 cache %.2fx the BF16 cache's tokens/s\n", Cs[ci],
                   tps[1][ci] / tps[0][ci]);
    free(tok);
    return rc;
}

/* seconds of the fastest of reps runs of f (which returns 0 when it ran),
 * the device's queue drained before the clock stops; -1 when one failed */
typedef int (*timed_fn)(void *ctx);
static double fastest(timed_fn f, void *ctx, int reps) {
    char err[KVD_ERR_LEN];
    double best = -1;
    for (int i = 0; i < reps; i++) {
        kvd_cuda_sync(err, sizeof err);
        double t0 = kvd_now();
        if (f(ctx) || kvd_cuda_sync(err, sizeof err)) return -1;
        double t = kvd_now() - t0;
        if (best < 0 || t < best) best = t;
    }
    return best;
}

/* the drift comparisons' operands: a and x on the host (n values each), on
 * the device, and room for the figures */
typedef struct {
    int rows, n, host_rows;
    float *a, *x, *da, *dx, *back;
    void *dout, *hout;
    int which; /* 0 logits, 1 residual stream, 2 attention distributions */
} cmp_case;

static int cmp_device(void *p) {
    cmp_case *c = p;
    if (c->which == 0)
        return kvd_cuda_logits_compare_dev(c->da, c->dx, c->rows, c->n, NULL, c->dout);
    if (c->which == 1) return kvd_cuda_hidden_compare_dev(c->da, c->dx, c->rows, c->n, c->dout);
    double *kl = c->dout;
    int *top = (int *)(kl + c->rows);
    return kvd_cuda_attn_compare_dev(c->da, c->dx, c->rows, c->n, kl, top, top + c->rows);
}
/* what the host did before: both sides copied back, then compared on one thread */
static int cmp_copy(void *p) {
    cmp_case *c = p;
    size_t bytes = sizeof(float) * (size_t)c->rows * c->n;
    return kvd_cuda_download(c->back, c->da, bytes) || kvd_cuda_download(c->back, c->dx, bytes);
}
static int cmp_host(void *p) {
    cmp_case *c = p;
    const size_t n = (size_t)c->n;
    if (c->which == 1) {
        kvd_hidden_compare(c->a, c->x, c->host_rows, c->n, c->hout);
    } else if (c->which == 2) {
        double *kl = c->hout;
        int *top = (int *)(kl + c->rows);
        kvd_attn_compare(c->a, c->x, c->host_rows, c->n, kl, top, top + c->rows);
    } else {
        for (int r = 0; r < c->host_rows; r++)
            ((kvd_logit_cmp *)c->hout)[r] =
                kvd_compare_logits(c->a + r * n, c->x + r * n, c->n, -1);
    }
    return 0;
}

/* The drift run's comparisons at a preset's shapes (qwen3.5-397b-a17b's in
 * the benchmark), for one 256-row chunk (logits; the residual stream of one
 * layer) and one sampled row at ctx tokens (every head's attention
 * distribution; 128K in the benchmark): on the device, where
 * the model now makes them, against copying both sides back and comparing
 * on one host thread (the host times a few rows and scales). 0, or -1. */
static int bench_compare(int reps, const char *preset, int ctx) {
    kvd_config q;
    char err[KVD_ERR_LEN];
    if (kvd_config_preset(preset, &q, err)) return -1;
    struct {
        const char *what;
        int rows, n, host_rows, which, per_chunk;
    } cases[3] = {
        {"logits", 256, q.vocab_size, 8, 0, 1},
        {"residual stream, a layer", 256, q.hidden_size, 256, 1, q.num_hidden_layers},
        {"attention, 1 sampled row", q.num_attention_heads, ctx, 4, 2,
         kvd_config_n_full(&q) * 256 / 16},
    };
    printf("\nthe drift figures' comparisons, %s shapes (ms): on the device, against both "
           "sides copied\nback and compared on one host thread (what the drift run did "
           "before); per_chunk: how many a 256-row\nchunk makes (attention: every 16th row of "
           "each full-attention layer, the drift run's default)\n%-27s %10s %10s %10s %9s "
           "%9s\n",
           preset, "comparison", "device", "copy_back", "host", "speedup", "per_chunk");
    int fail = 0;
    double chunk_dev = 0, chunk_before = 0;
    for (int ci = 0; ci < 3; ci++) {
        cmp_case c = {cases[ci].rows, cases[ci].n, cases[ci].host_rows, 0, 0, 0, 0, 0, 0, 0,
                      cases[ci].which};
        const size_t nv = (size_t)c.rows * c.n;
        const size_t fb =
            (sizeof(kvd_logit_cmp) + sizeof(kvd_hidden_cmp) + 2 * sizeof(double)) * c.rows;
        c.a = malloc(sizeof(float) * nv), c.x = malloc(sizeof(float) * nv);
        c.back = malloc(sizeof(float) * nv);
        c.hout = malloc(fb);
        c.da = kvd_cuda_alloc(sizeof(float) * nv), c.dx = kvd_cuda_alloc(sizeof(float) * nv);
        c.dout = kvd_cuda_alloc(fb);
        double td = -1, tc = -1, th = -1;
        if (c.a && c.x && c.back && c.hout && c.da && c.dx && c.dout) {
            /* xorshift values in [-1, 1) (the timings do not depend on their
             * law, and 10^8 normal draws would take seconds); attention's
             * positive, as distributions are */
            uint64_t st = 0x9e3779b97f4a7c15ull + (uint64_t)ci;
            for (size_t i = 0; i < nv; i++) {
                st ^= st << 13, st ^= st >> 7, st ^= st << 17;
                float v = (float)(st >> 40) / (float)(1 << 23) - 1.0f, e = (float)(st & 255) / 128;
                c.a[i] = c.which == 2 ? 1e-5f * (1.5f + v) : 4.0f * v;
                c.x[i] = c.a[i] * (1.0f + 0.01f * (e - 1.0f));
            }
            if (!kvd_cuda_upload(c.da, c.a, sizeof(float) * nv) &&
                !kvd_cuda_upload(c.dx, c.x, sizeof(float) * nv)) {
                td = fastest(cmp_device, &c, reps);
                tc = fastest(cmp_copy, &c, reps > 3 ? 3 : reps);
                th = fastest(cmp_host, &c, 1) * c.rows / c.host_rows;
            }
        }
        fail |= td <= 0 || tc <= 0 || th <= 0;
        chunk_dev += td * cases[ci].per_chunk, chunk_before += (tc + th) * cases[ci].per_chunk;
        if (td > 0 && tc > 0 && th > 0)
            printf("%-27s %10.3f %10.2f %10.1f %8.0fx %9d\n", cases[ci].what, td * 1e3, tc * 1e3,
                   th * 1e3, (tc + th) / td, cases[ci].per_chunk);
        else
            printf("%-27s failed\n", cases[ci].what);
        free(c.a), free(c.x), free(c.back), free(c.hout);
        kvd_cuda_free(c.da), kvd_cuda_free(c.dx), kvd_cuda_free(c.dout);
    }
    if (!fail)
        printf("a 256-row chunk's comparisons: %.1f ms on the device, %.0f ms copied back and "
               "compared on one host thread\n(%.0fx; the attention rows at %d tokens, a "
               "%d-token trace has %d chunks)\n",
               chunk_dev * 1e3, chunk_before * 1e3, chunk_before / chunk_dev, ctx, ctx, ctx / 256);
    /* the distributions the attention views compare, and each view's
     * outputs: a chunk's 16 sampled rows one at a time, against the group
     * launches that read each K (and V) row from HBM once for all of them.
     * The scores are FP32 dot products (the CPU's sums, bit for bit across
     * the device's kernels): their rate in FP32 TFLOP/s beside the K rows'
     * read rate says which of the two bounds the group kernel; decode runs
     * on tensor cores, its rate the K and V rows once over the time */
    double flops = 0;
    for (int k = 0; k < 16; k++)
        flops += 2.0 * q.num_attention_heads * q.head_dim * (double)(ctx - 16 * (15 - k));
    for (int outputs = 0; outputs < 2; outputs++) {
        printf("\nthe %s of a 256-row chunk's 16 sampled rows at %d tokens (ms), %d/%d heads x "
               "%d:\n%6s %12s %10s %8s %11s%s\n",
               outputs ? "outputs" : "distributions", ctx, q.num_attention_heads,
               q.num_key_value_heads, q.head_dim, "cache", "row_by_row", "grouped", "speedup",
               outputs ? "KV_GB_s" : "K_GB_s", outputs ? "" : "   TFLOP_s");
        for (int f = 0; f < 2; f++) {
            const int r = reps > 3 ? 3 : reps;
            double t1 = kvd_cuda_bench_sampled_rows(outputs, f, ctx, q.num_attention_heads,
                                                    q.num_key_value_heads, q.head_dim, 16, r, 0);
            double t2 = kvd_cuda_bench_sampled_rows(outputs, f, ctx, q.num_attention_heads,
                                                    q.num_key_value_heads, q.head_dim, 16, r, 1);
            double kb =
                (double)ctx * q.num_key_value_heads * q.head_dim * (f ? 1 : 2) * (outputs ? 2 : 1);
            fail |= t1 <= 0 || t2 <= 0;
            if (t1 > 0 && t2 > 0 && outputs)
                printf("%6s %12.2f %10.2f %7.1fx %11.1f\n", f ? "e4m3" : "bf16", t1 * 1e3, t2 * 1e3,
                       t1 / t2, kb / t2 / 1e9);
            else if (t1 > 0 && t2 > 0)
                printf("%6s %12.2f %10.2f %7.1fx %11.1f %9.1f\n", f ? "e4m3" : "bf16", t1 * 1e3,
                       t2 * 1e3, t1 / t2, kb / t2 / 1e9, flops / t2 / 1e12);
        }
    }
    return fail ? -1 : 0;
}

/* A decode step's Gated DeltaNet recurrences at a preset's shape (in the
 * benchmark qwen3.5-397b-a17b's 45 DeltaNet layers, each with its own
 * states, so the L2 holds none of the next layer's) at C = 1, 8, 32: the
 * columns held in registers (what the model runs) against stepped in
 * memory. state_GB_s counts each state read once and written once. 0, or
 * -1. */
typedef struct {
    int C, L, nk, nv, dk, dv, regs;
    size_t sl;
    float *conv, *g, *b, *out, *ssm;
    int *seqs, *row0, *ntok;
} gdn_case;
static int gdn_layers(void *p) {
    gdn_case *c = p;
    for (int l = 0; l < c->L; l++) {
        float *S = c->ssm + (size_t)l * c->C * c->sl;
        if (c->regs)
            kvd_cudaop_gdn(c->conv, c->g, c->b, c->out, S, c->sl, c->C, c->seqs, c->row0, c->ntok,
                           c->nk, c->nv, c->dk, c->dv);
        else
            kvd_cudaop_gdn_columns(c->conv, c->g, c->b, c->out, S, c->sl, c->C, c->seqs, c->row0,
                                   c->ntok, c->nk, c->nv, c->dk, c->dv);
    }
    return 0;
}
static int bench_gdn(const char *preset, int reps, double bw) {
    kvd_config q;
    char err[KVD_ERR_LEN];
    if (kvd_config_preset(preset, &q, err)) return -1;
    gdn_case c = {.nk = q.linear_num_key_heads,
                  .nv = q.linear_num_value_heads,
                  .dk = q.linear_key_head_dim,
                  .dv = q.linear_value_head_dim};
    for (int l = 0; l < q.num_hidden_layers; l++) c.L += q.layer_types[l] == KVD_LAYER_LINEAR;
    c.sl = (size_t)c.nv * c.dk * c.dv;
    printf("\nGated DeltaNet decode step, %d layers of %d/%d heads x %d x %d (us a layer):\n"
           "%4s %10s %11s %8s %12s %8s\n",
           c.L, c.nk, c.nv, c.dk, c.dv, "C", "registers", "state_GB_s", "of_copy", "in_memory",
           "speedup");
    const int Cs[3] = {1, 8, 32};
    int fail = 0;
    for (int ci = 0; ci < 3 && !fail; ci++) {
        const int C = c.C = Cs[ci], cd = 2 * c.nk * c.dk + c.nv * c.dv;
        int *h = malloc(sizeof(int) * 3 * C);
        float *hc = malloc(sizeof(float) * (size_t)C * cd);
        for (int i = 0; i < C; i++) h[i] = i, h[C + i] = i, h[2 * C + i] = 1;
        for (size_t i = 0; i < (size_t)C * cd; i++) hc[i] = 0.01f * (float)(i % 17);
        const size_t ns = (size_t)c.L * C * c.sl;
        c.conv = kvd_cuda_alloc(sizeof(float) * C * cd);
        c.g = kvd_cuda_alloc(sizeof(float) * C * c.nv);
        c.b = kvd_cuda_alloc(sizeof(float) * C * c.nv);
        c.out = kvd_cuda_alloc(sizeof(float) * C * c.nv * c.dv);
        c.ssm = kvd_cuda_alloc(sizeof(float) * ns);
        c.seqs = kvd_cuda_alloc(sizeof(int) * 3 * C);
        c.row0 = c.seqs ? c.seqs + C : NULL, c.ntok = c.seqs ? c.seqs + 2 * C : NULL;
        fail = !h || !hc || !c.conv || !c.g || !c.b || !c.out || !c.ssm || !c.seqs ||
               kvd_cuda_upload(c.conv, hc, sizeof(float) * C * cd) ||
               kvd_cuda_zero(c.g, sizeof(float) * C * c.nv) ||
               kvd_cuda_zero(c.b, sizeof(float) * C * c.nv) ||
               kvd_cuda_zero(c.ssm, sizeof(float) * ns) ||
               kvd_cuda_upload(c.seqs, h, sizeof(int) * 3 * C);
        double t[2] = {-1, -1};
        for (int r = 0; r < 2 && !fail; r++) {
            c.regs = !r;
            t[r] = fastest(gdn_layers, &c, reps) / c.L;
            fail = t[r] <= 0;
        }
        if (fail) {
            printf("%4d failed\n", C);
        } else {
            const double bytes = 2.0 * sizeof(float) * C * c.sl;
            printf("%4d %10.1f %11.1f %7.1f%% %12.1f %7.2fx\n", C, t[0] * 1e6, bytes / t[0] / 1e9,
                   100 * bytes / t[0] / bw, t[1] * 1e6, t[1] / t[0]);
        }
        kvd_cuda_free(c.conv), kvd_cuda_free(c.g), kvd_cuda_free(c.b), kvd_cuda_free(c.out);
        kvd_cuda_free(c.ssm), kvd_cuda_free(c.seqs);
        free(h), free(hc);
    }
    return fail ? -1 : 0;
}

/* The projections of a decode step of a preset (qwen3.5-397b-a17b in the
 * benchmark; N outputs of K inputs), timed by the projection and GEMM
 * benchmarks below; 6 of them, or 0 when the preset is missing */
typedef struct {
    const char *what;
    int N, K;
} proj_shape;
enum { N_PROJ = 6 };
static int projections(const char *preset, proj_shape out[N_PROJ]) {
    kvd_config q;
    char err[KVD_ERR_LEN];
    if (kvd_config_preset(preset, &q, err)) return 0;
    const proj_shape s[N_PROJ] = {
        {"q_proj (query + gate)", 2 * q.num_attention_heads * q.head_dim, q.hidden_size},
        {"in_proj_qkvz", 2 * kvd_key_dim(&q) + 2 * kvd_value_dim(&q), q.hidden_size},
        {"out_proj", q.hidden_size, kvd_value_dim(&q)},
        {"expert gate/up", q.moe_intermediate_size, q.hidden_size},
        {"expert down", q.hidden_size, q.moe_intermediate_size},
        {"lm_head", q.vocab_size, q.hidden_size},
    };
    memcpy(out, s, sizeof s);
    return N_PROJ;
}

/* The decode projections at a preset's shapes, M = 1, 8 and 16
 * rows: the FP32 per-column kernel kvd_cudaop_linear runs up to 16 rows
 * against the cuBLASLt path (x split in three BF16 parts) it runs beyond.
 * Each rep runs over enough copies of the weights (256 MB at least) that
 * the L2 holds none of the next; weights_GB_s counts each weight once. 0,
 * or -1. */
typedef struct {
    int M, N, K, copies, split;
    float *x, *y;
    char *w;
} lin_case;
static int lin_copies(void *p) {
    lin_case *c = p;
    const size_t wb = 2 * (size_t)c->N * c->K;
    for (int i = 0; i < c->copies; i++) {
        if (c->split) {
            if (kvd_cuda_linear_split_dev(c->x, c->w + i * wb, c->y, c->M, c->N, c->K, 0))
                return -1;
        } else {
            kvd_cudaop_linear_fp32(c->x, c->w + i * wb, c->y, c->M, c->N, c->K);
        }
    }
    return 0;
}
static int bench_linear(const char *preset, size_t copy_bytes, int reps, double bw) {
    proj_shape shapes[N_PROJ];
    const int n_shapes = projections(preset, shapes);
    if (!n_shapes) return -1;
    printf("\ndecode projections, shapes of %s (us; weights_GB_s and of_copy for the FP32\n"
           "per-column kernel, which runs up to 16 rows; vs_split: its speed over cuBLASLt's on "
           "the same shape):\n  %-24s %3s %6s %6s %10s %11s %8s %10s %8s\n",
           preset, "shape", "M", "N", "K", "per_column", "weights_GB_s", "of_copy", "cublaslt",
           "vs_split");
    int fail = 0;
    const int Ms[3] = {1, 8, 16};
    for (int si = 0; si < n_shapes && !fail; si++) {
        lin_case c = {.N = shapes[si].N, .K = shapes[si].K};
        const size_t wb = 2 * (size_t)c.N * c.K;
        c.copies = (int)(copy_bytes / wb) + 1;
        c.w = kvd_cuda_alloc(wb * c.copies);
        c.x = kvd_cuda_alloc(sizeof(float) * 16 * c.K);
        c.y = kvd_cuda_alloc(sizeof(float) * 16 * c.N);
        fail = !c.w || !c.x || !c.y || kvd_cuda_zero(c.w, wb * c.copies) ||
               kvd_cuda_zero(c.x, sizeof(float) * 16 * c.K);
        for (int mi = 0; mi < 3 && !fail; mi++) {
            double t[2];
            c.M = Ms[mi];
            for (int p = 0; p < 2; p++) {
                c.split = p;
                t[p] = fastest(lin_copies, &c, reps) / c.copies;
            }
            fail = t[0] <= 0;
            if (fail) break;
            printf("  %-24s %3d %6d %6d %10.1f %11.1f %7.1f%% ", shapes[si].what, c.M, c.N, c.K,
                   t[0] * 1e6, wb / t[0] / 1e9, 100 * wb / t[0] / bw);
            if (t[1] > 0)
                printf("%10.1f %7.2fx\n", t[1] * 1e6, t[1] / t[0]);
            else
                printf("%10s %8s\n", "failed", "-");
        }
        kvd_cuda_free(c.w), kvd_cuda_free(c.x), kvd_cuda_free(c.y);
    }
    return fail ? -1 : 0;
}

/* the bytes a decode step's attention reads from the cache (K and V) at
 * the benchmark's 2 KV heads x 256, ctx positions, in format f */
static double cache_bytes(int ctx, int f) {
    return 2.0 * ctx * 2 * (double)kvd_fmt_row_bytes((kvd_fmt)f, 256);
}

/* The benchmark's sizes: the GPU's, and a small one that runs every part
 * of it in minutes on the SIMT simulator (whose figures mean nothing). The
 * sampled rows' grouped decode needs 16 rows x 128 positions of context to
 * fit the model's one-row scratch (else the model decodes row by row), so
 * the small size's longer context is 2048. */
typedef struct {
    const char *preset;   /* the projections, GEMMs, DeltaNet and comparisons */
    int ctx[2];           /* decode attention's contexts */
    int pf_ctx[2];        /* prefill attention's: the small size's longer one splits the
                             context (at least 512 positions a split), its shorter one not */
    int chunk[2];         /* prefill's rows: a chunk, and a short one */
    int gemm_M[4];        /* the GEMMs' rows */
    size_t copy_bytes;    /* the copy bandwidth's buffer */
    size_t weights_bytes; /* the decode projections' weights a rep, at least */
} bench_size;
static const bench_size gpu_size = {
    .preset = "qwen3.5-397b-a17b",
    .ctx = {32768, 131072},
    .pf_ctx = {32768, 131072},
    .chunk = {512, 64},
    .gemm_M = {8, 32, 96, 1536},
    .copy_bytes = (size_t)1 << 30,
    .weights_bytes = (size_t)256 << 20,
};
static const bench_size smoke_size = {
    .preset = "tiny",
    .ctx = {1024, 2048},
    .pf_ctx = {512, 1024},
    .chunk = {32, 16},
    .gemm_M = {8, 32, 96, 192},
    .copy_bytes = (size_t)16 << 20,
    .weights_bytes = (size_t)1 << 20,
};

/* The device side: copy bandwidth, decode attention at the qwen3.5 shape
 * (32 query heads, 2 KV heads, head_dim 256) at 32K and 128K tokens (or
 * the small size's), prefill attention, the BF16 GEMMs and decode
 * projections at the preset's shapes, the DeltaNet recurrence and the
 * drift comparisons, then one line per speed target. */
int kvd_bench_cuda(int reps, int smoke) {
    char why[256];
    if (!kvd_cuda_available(why, sizeof why)) {
        printf("kvdrift bench cuda: %s; nothing to measure\n", why);
        return 1; /* a benchmark that measured nothing did not pass */
    }
    const bench_size *sz = smoke ? &smoke_size : &gpu_size;
    if (smoke)
        printf("smoke size (the program run end to end, not a measurement): %s's projections, "
               "%d and %d tokens (prefill %d and %d)\n\n",
               sz->preset, sz->ctx[0], sz->ctx[1], sz->pf_ctx[0], sz->pf_ctx[1]);
    int fail = 0;
    double bw = kvd_cuda_copy_bandwidth(sz->copy_bytes, reps);
    fail |= bw <= 0;
    printf("device copy bandwidth (read + write, %zu MiB): %.1f GB/s\n\n", sz->copy_bytes >> 20,
           bw / 1e9);
    printf("decode attention, 32/2 heads x 256, L2 flushed before each rep (v1: plain kernels; "
           "v2: split over the context,\nFP32 cores; v3: tensor cores, what the model runs; "
           "nvfp4: E2M1 codes under E4M3 block\nscales, decoded into FP16 by v3; e4m3t and i8t: "
           "fp8-token's and int8-token's rows, a scale each;\ni4t: int4-token's, v2 "
           "only):\n"
           "%8s %-6s %4s %10s %10s %8s %8s\n",
           "context", "cache", "ver", "time_us", "read_GB_s", "of_copy", "vs_bf16");
    const int *ctxs = sz->ctx;
    const char *fn[8] = {"bf16", "e4m3", "e5m2", "nvfp4", "e4m3t", "i8t", "i8t-rn", "i4t"};
    /* v3's time by context and format: FP8 attention's table, the targets
     * and the per-token rows' speed beside E4M3's; v2's too, for INT4 (no
     * tensor cores) beside E4M3 on the same FP32 cores */
    double v3[2][8] = {{0}}, v2[2][8] = {{0}};
    for (int ver = 1; ver <= 3; ver++)
        for (int ci = 0; ci < 2; ci++) {
            double tb = 0;
            for (int f = 0; f < 8; f++) {
                if (f == KVD_FMT_I8T_RN) continue; /* I8T's rows, written otherwise */
                if (ver == 3 && !kvd_fmt_decode_tc(f, 256)) continue;
                if (ver == 1 && f == KVD_FMT_I4T) continue; /* v2 is what reads it */
                double t = kvd_cuda_bench_attn(f, ctxs[ci], 32, 2, 256, reps, ver, 0);
                fail |= t <= 0;
                const double bytes = cache_bytes(ctxs[ci], f);
                if (f == 0) tb = t;
                if (ver == 3) v3[ci][f] = t;
                if (ver == 2) v2[ci][f] = t;
                printf("%8d %-6s %4d %10.1f %10.1f %7.1f%% %7.2fx\n", ctxs[ci], fn[f], ver, t * 1e6,
                       bytes / t / 1e9, 100 * bytes / t / bw, tb / t);
            }
        }
    /* FP8 attention (--attn-fp8) over an E4M3 cache: v3's two passes (the
     * row maxima from K alone, then the rounded weights) against v3 without
     * rounding on the same cache (timed above), and against the plain kernels, which ran
     * it before the two passes. read_GB_s counts the cache once (K and V),
     * so of_copy says how near the one pass a fused kernel would reach. */
    printf("\nFP8 attention (--attn-fp8: E4M3 query and weights), E4M3 cache, 32/2 heads x 256:\n"
           "%8s %-13s %10s %10s %8s %8s\n",
           "context", "kernels", "time_us", "read_GB_s", "of_copy", "vs_v3");
    for (int ci = 0; ci < 2; ci++) {
        const double bytes = cache_bytes(ctxs[ci], KVD_FMT_E4M3);
        const double t3 = v3[ci][KVD_FMT_E4M3];
        const char *what[2] = {"v3, 2 passes", "plain"};
        for (int k = 0; k < 2; k++) {
            double t = kvd_cuda_bench_attn(KVD_FMT_E4M3, ctxs[ci], 32, 2, 256, reps, k ? 1 : 3, 1);
            fail |= t <= 0 || t3 <= 0;
            printf("%8d %-13s %10.1f %10.1f %7.1f%% %7.2fx\n", ctxs[ci], what[k], t * 1e6,
                   bytes / t / 1e9, 100 * bytes / t / bw, t3 / t);
        }
    }
    /* v3's split length and stage count at 32K and 128K, the split v3
     * chooses marked: what the next tuning of per_split_for and stages_for
     * starts from. Each split adds G (hd + 2) floats of partial results,
     * written and read again by the merge, to its cache rows. */
    printf("\nv3 by split length and stages (us; '-' where the stages do not fit; '*' the split "
           "v3 chooses,\n%d CTAs a wave):\n%6s %8s %7s %9s %9s %9s\n",
           kvd_cuda_attn_wave(KVD_FMT_BF16, 256), "cache", "context", "split", "2 stages",
           "3 stages", "4 stages");
    const int splits[5] = {128, 256, 512, 1024, 2048};
    for (int f = 0; f < 2; f++)
        for (int ci = 0; ci < 2; ci++) {
            const int chosen = kvd_cuda_attn_split_len(f, 256, 2, 1, ctxs[ci]);
            for (int si = 0; si < 5; si++) {
                printf("%6s %8d %6d%c", fn[f], ctxs[ci], splits[si],
                       splits[si] == chosen ? '*' : ' ');
                for (int ns = 2; ns <= 4; ns++) {
                    double t =
                        kvd_cuda_bench_attn_v3(f, ctxs[ci], 32, 2, 256, reps, splits[si], ns);
                    if (t > 0)
                        printf(" %9.1f", t * 1e6);
                    else
                        printf(" %9s", "-");
                }
                printf("\n");
            }
        }
    /* prefill attention: a 512-row chunk at the end of a 32K and a 128K
     * prompt; its multiply-adds (2 n_q heads hd per position attended,
     * scores and values) against the fastest BF16 GEMM the table below
     * finds, which is the tensor cores' rate as cuBLASLt reaches it */
    const int *pfc = sz->pf_ctx;
    printf("\nprefill attention, 32/2 heads x 256, a chunk ending the context (v1: FP32 cores, "
           "a block per row;\nv2: tensor cores, rows sharing each K/V stage, what the model "
           "runs; v4: v2 splitting its query\nagain every stage, as it does where shared memory "
           "is short (sm_120); the 64-row chunk's\ncontext is split; e4m3t, fp8-token's rows, "
           "and nvfp4, its codes widened into FP16 a stage at a time,\nv2 only):\n"
           "%8s %5s %-6s %4s %10s %9s %8s\n",
           "context", "rows", "cache", "ver", "time_ms", "TFLOP_s", "vs_v1");
    double pf_best = 0, v2_e4m3[4] = {0, 0, 0, 0}; /* by chunk, for FP8 attention's table */
    for (int ci = 0; ci < 4; ci++)
        for (int fi = 0; fi < 4; fi++) {
            static const int pf_fmts[4] = {KVD_FMT_BF16, KVD_FMT_E4M3, KVD_FMT_E4M3T,
                                           KVD_FMT_NVFP4};
            const int f = pf_fmts[fi];
            const int nq = sz->chunk[ci / 2], p0 = pfc[ci % 2] - nq;
            const double flop = 2.0 * 2 * nq * 32 * 256 * (p0 + (nq + 1) / 2.0);
            double t1 = 0;
            static const int vers[3] = {1, 2, 4};
            for (int vi = 0; vi < 3; vi++) {
                const int ver = vers[vi];
                if ((f == KVD_FMT_E4M3T || f == KVD_FMT_NVFP4) && ver != 2) continue;
                double t =
                    kvd_cuda_bench_prefill(f, p0, nq, 32, 2, 256, reps > 3 ? 3 : reps, ver, 0);
                fail |= t <= 0;
                if (ver == 1) t1 = t;
                if (ver == 2 && (f == KVD_FMT_BF16 || f == KVD_FMT_E4M3) && flop / t > pf_best)
                    pf_best = flop / t;
                if (ver == 2 && f == KVD_FMT_E4M3) v2_e4m3[ci] = t;
                printf("%8d %5d %-6s %4d %10.2f %9.1f", pfc[ci % 2], nq, fn[f], ver, t * 1e3,
                       flop / t / 1e12);
                if (t1 > 0)
                    printf(" %7.2fx\n", t1 / t);
                else
                    printf(" %8s\n", "-");
            }
        }
    /* FP8 attention's prefill: v2's two passes against v2 without rounding
     * (512-row chunks), and against the plain kernels row by row (a 64-row
     * chunk at 32K; at 128K they would take most of the check's time) */
    printf("\nFP8 attention prefill, E4M3 cache, 32/2 heads x 256, a chunk ending the context:\n"
           "%8s %5s %-13s %10s %9s %8s\n",
           "context", "rows", "kernels", "time_ms", "TFLOP_s", "vs_v2");
    for (int ci = 0; ci < 3; ci++) {
        const int nq = sz->chunk[ci / 2], p0 = pfc[ci % 2] - nq, r3 = reps > 3 ? 3 : reps;
        const double flop = 2.0 * 2 * nq * 32 * 256 * (p0 + (nq + 1) / 2.0);
        const double t2 = v2_e4m3[ci]; /* the same chunk in the table above */
        for (int k = 0; k < (ci == 2 ? 2 : 1); k++) {
            double t = kvd_cuda_bench_prefill(KVD_FMT_E4M3, p0, nq, 32, 2, 256, r3, k ? 1 : 2, 1);
            fail |= t <= 0 || t2 <= 0;
            printf("%8d %5d %-13s %10.2f %9.1f %7.2fx\n", pfc[ci % 2], nq,
                   k ? "plain, rows" : "v2, 2 passes", t * 1e3, flop / t / 1e12, t2 / t);
        }
    }
    /* the preset's projections as the model runs them through cuBLASLt:
     * the exact split's stacked 3M rows at concurrency 32 (96) and for a
     * 512-row prefill chunk (1536), beside plain 8 and 32;
     * the back end runs the heuristic's first choice, or with
     * KVD_CUDA_GEMM=tune the fastest of its first eight as it times them */
    proj_shape shapes[N_PROJ];
    const int n_shapes = projections(sz->preset, shapes);
    fail |= !n_shapes;
    printf("\nBF16 GEMM through cuBLASLt (FP32 accumulation), shapes of %s: the heuristic's "
           "first\nchoice (what the back end runs) and the one KVD_CUDA_GEMM=tune picks, against "
           "the fastest of the\nalgorithms it offers; M = %d and %d are the 3M rows of the "
           "model's exact split at C = 32 and\nfor a %d-row prefill chunk:\n",
           sz->preset, sz->gemm_M[2], sz->gemm_M[3], sz->gemm_M[3] / 3);
    printf("  %-24s %5s %6s %6s %13s %8s %13s %8s %12s %6s\n", "shape", "M", "N", "K",
           "first_GFLOP_s", "of_best", "tuned_GFLOP_s", "of_best", "best_GFLOP_s", "algos");
    const int *Ms = sz->gemm_M;
    double gemm_best = 0, gemm_worst[2] = {2, 2};
    const char *worst_what[2] = {"", ""};
    int worst_M[2] = {0, 0};
    for (int si = 0; si < n_shapes; si++)
        for (int mi = 0; mi < 4; mi++) {
            double g[2] = {0, 0}, best = 0; /* first, tuned */
            int n = 0;
            int M = Ms[mi], N = shapes[si].N, K = shapes[si].K;
            if (kvd_cuda_bench_gemm_algos(M, N, K, reps, &g[0], &best, &g[1], &n)) {
                fail = 1;
                printf("  %-24s %5d %6d %6d: cuBLASLt offered no algorithm\n", shapes[si].what, M,
                       N, K);
                continue;
            }
            printf("  %-24s %5d %6d %6d %13.1f %7.1f%% %13.1f %7.1f%% %12.1f %6d\n",
                   shapes[si].what, M, N, K, g[0], 100.0 * g[0] / best, g[1], 100.0 * g[1] / best,
                   best, n);
            if (best > gemm_best) gemm_best = best;
            for (int t = 0; t < 2; t++)
                if (best > 0 && g[t] / best < gemm_worst[t])
                    gemm_worst[t] = g[t] / best, worst_what[t] = shapes[si].what, worst_M[t] = M;
        }
    if (gemm_best > 0 && pf_best > 0)
        printf("\nprefill attention v2 at its best above: %.2f of the fastest BF16 GEMM (%.1f "
               "TFLOP/s; v2 does each product twice, hi and lo, so 0.5 is the tensor cores' "
               "rate)\n",
               pf_best / (gemm_best * 1e9), gemm_best / 1e3);
    fail |= bench_linear(sz->preset, sz->weights_bytes, reps, bw) != 0;
    fail |= bench_gdn(sz->preset, reps, bw) != 0;
    fail |= bench_compare(reps, sz->preset, ctxs[1]) != 0;
    /* the back end's speed targets (docs/cuda-backend.md), from the tables
     * above; the whole model's tokens/s comes from `kvd_gpu_bench model` */
    printf("\nthe targets, from this run's figures above:\n");
    for (int ci = 0; ci < 2; ci++)
        for (int f = 0; f < 2; f++) {
            const double of_copy =
                v3[ci][f] > 0 && bw > 0 ? cache_bytes(ctxs[ci], f) / v3[ci][f] / bw : 0;
            printf("  decode attention v3, %3dK, %s cache: %5.1f%% of the copy bandwidth "
                   "(target >= 75%%): %s\n",
                   ctxs[ci] / 1024, fn[f], 100 * of_copy, of_copy >= 0.75 ? "met" : "NOT met");
        }
    if (v3[1][KVD_FMT_BF16] > 0 && v3[1][KVD_FMT_E4M3] > 0) {
        const double speed = v3[1][KVD_FMT_BF16] / v3[1][KVD_FMT_E4M3];
        printf("  decode attention v3, %3dK: the E4M3 cache %.2fx the BF16 cache's speed (target "
               ">= 1.7x): %s\n",
               ctxs[1] / 1024, speed, speed >= 1.7 ? "met" : "NOT met");
    }
    for (int t = 0; t < 2; t++)
        if (gemm_worst[t] < 2) /* some shape was measured */
            printf("  BF16 GEMMs, %s: at worst %.1f%% of the fastest algorithm (%s, M = %d; "
                   "target >= 85%%): %s\n",
                   t ? "KVD_CUDA_GEMM=tune" : "the heuristic's first choice (the default)",
                   100 * gemm_worst[t], worst_what[t], worst_M[t],
                   gemm_worst[t] >= 0.85 ? "met" : "NOT met");
    /* no target: what a scale a row costs v3 (the scales on scores and
     * probabilities), and what NVFP4's 4.5 bits a value buy it (its rows
     * 0.56x E4M3's bytes) beside the decoding into FP16 */
    for (int f = KVD_FMT_NVFP4; f <= KVD_FMT_I8T; f++)
        if (v3[1][KVD_FMT_E4M3] > 0 && v3[1][f] > 0)
            printf("  (no target) decode attention v3, %3dK: the %s cache %.2fx the E4M3 cache's "
                   "speed\n",
                   ctxs[1] / 1024, fn[f], v3[1][KVD_FMT_E4M3] / v3[1][f]);
    if (v2[1][KVD_FMT_E4M3] > 0 && v2[1][KVD_FMT_I4T] > 0)
        printf("  (no target) decode attention v2, %3dK: the i4t cache %.2fx the E4M3 cache's "
               "speed, both on the FP32 cores\n",
               ctxs[1] / 1024, v2[1][KVD_FMT_E4M3] / v2[1][KVD_FMT_I4T]);
    return fail;
}
