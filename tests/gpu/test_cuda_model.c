/* kvdrift: the whole model on the device against the CPU forward pass, on the
 * tiny and small presets in three cache modes: two sequences prefilled (one
 * step each, 200 and 77 tokens), then 12 decode steps of both batched, the
 * CPU's greedy tokens fed to both. The two differ by the order of their FP32
 * sums alone, so BF16 is held to 1e-4 relative L2 in the logits of every step
 * and in the residual stream after every layer.
 *
 * An FP8 cache turns that into something larger, and it is not a defect: a
 * value whose x / scale lies within an FP32 rounding of a code boundary takes
 * the neighbouring code on one of the two (about 1 value in 10^4). On most
 * channels that moves an output by 1/16 of a small value; on an outlier
 * channel (the one that sets the head's absmax, in the top binades) one such
 * code moves the head's attention output by up to 1% for every later row,
 * and the layers after it see inputs that differ by that much. Measured on
 * small over 2 GPUs: one V code at position 29 (160 against 144 on the
 * outlier channel) took 4 heads' outputs 5e-3 away, the residual 6e-3.
 * So the cache is checked in two parts:
 *   - against the device's own K and V as computed (the kv hook) put
 *     through the CPU's codec with the same scales: codes, counters and
 *     absmax bit for bit, in every mode and split (a wrong scale, head or
 *     row fails here however few values it touches);
 *   - against the CPU's cache: every element written differently is one
 *     code apart, or apart by less than a BF16 step of its row's largest
 *     value (a value near zero after cancellation), in every BF16 layer and
 *     FP8's first attention layer, whose inputs differ by FP32 roundings
 *     only; >= 99% identical (BF16), >= 99.9% (FP8's first attention
 *     layer; 99% INT8's, whose steps are finer near a row's top), >= 95%
 *     (the later layers, which read inputs such codes moved); counters within 0.1% and 2 values (1%
 * in FP8's later layers; fp8-cal puts the absmax value exactly on E4M3's maximum, so its neighbours
 * may saturate either way). FP8 logits are held within 3e-3 and the residual within 2e-2 (a scale
 * read wrong by one head's worth is 10-50% off).
 * Where the residual stream first departs is printed, layer by layer. A
 * branch of one sequence (fork) then decodes a step alone on both. Skips (77)
 * with the reason when no device is visible. */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../bench/clock.h"
#include "../../kernels/cuda/cuda_kernels.h"
#include "../../kernels/kernels.h"
#include "../../runners/checkpoint.h"
#include "../../runners/drift.h"
#include "../../runners/export.h"
#include "../../runners/engine.h"
#include "../../runners/model.h"
#include "../../runners/model_cuda.h"
#include "../../runners/weights.h"

#include "check.h"

enum { MAX_ROWS = 512 }; /* tokens in one step, both models */

/* the CPU's residual stream after each layer of the current step, and the
 * device's departure from it */
typedef struct {
    int H, layers, rows;
    float *cpu; /* [layers][rows][H] */
    double worst[64];
    kvd_kvcache *requant; /* the device's K/V as computed, through the CPU's codec */
    int requant_full;     /* a row the requantized cache had no block for */
} hidden_rec;

static void dev_kv(void *ctx, int al, int seq, int pos, const float *k, const float *v) {
    hidden_rec *r = ctx;
    if (kvd_kvcache_reserve(r->requant, seq, pos + 1)) {
        r->requant_full = 1;
        return;
    }
    kvd_kvcache_write(r->requant, al, seq, pos, k, v);
}

static void cpu_hidden(void *ctx, int layer, const kvd_batch *b, const int *pos, const float *h) {
    hidden_rec *r = ctx;
    (void)pos;
    int rows = 0;
    for (int s = 0; s < b->n; s++) rows += b->n_tok[s];
    r->rows = rows;
    memcpy(r->cpu + (size_t)layer * MAX_ROWS * r->H, h, sizeof(float) * (size_t)rows * r->H);
}

static void dev_hidden(void *ctx, int layer, const kvd_batch *b, const int *pos, const float *h) {
    hidden_rec *r = ctx;
    (void)b, (void)pos;
    double e = rel_l2(h, r->cpu + (size_t)layer * MAX_ROWS * r->H, (size_t)r->rows * r->H);
    r->worst[layer] = worst_of(r->worst[layer], e);
}

/* How many codes apart element i of two rows is: codes ordered by value
 * (sign and magnitude to a line, -0 and +0 one point), so neighbouring
 * values are 1 apart in BF16 and both FP8 formats. */
static long code_distance(kvd_fmt fmt, const unsigned char *a, const unsigned char *b, size_t i) {
    long x, y;
    if (fmt == KVD_FMT_BF16) {
        uint16_t u, v;
        memcpy(&u, a + 2 * i, 2), memcpy(&v, b + 2 * i, 2);
        x = u & 0x8000 ? -(long)(u & 0x7fff) : (long)u;
        y = v & 0x8000 ? -(long)(v & 0x7fff) : (long)v;
    } else {
        x = a[i] & 0x80 ? -(long)(a[i] & 0x7f) : (long)a[i];
        y = b[i] & 0x80 ? -(long)(b[i] & 0x7f) : (long)b[i];
    }
    return labs(x - y);
}

/* the first byte of (seq, position, head)'s codes in a pool laid out by c */
static size_t row_at(const kvd_kvcache *c, int s, int t, int h) {
    return kvd_pool_codes_at(c->fmt, c->head_dim, c->block_size,
                             ((size_t)c->seqs[s].blocks[t / c->block_size] * c->kv_heads + h) *
                                     c->block_size +
                                 t % c->block_size);
}

typedef struct {
    size_t same, total, far;
} cmp_counts;

/* Every row written in sequences 0 and 1 of attention layer `layer`'s K or
 * V: pool a (a copy laid out by ca) against cb's own. `far` counts the
 * elements more than one code apart by more than slack times their row's
 * largest magnitude in cb: a value near zero (after cancellation in RoPE,
 * say) can be many codes off by an FP32 rounding of the row's large ones. */
static cmp_counts compare_rows(const kvd_kvcache *ca, const unsigned char *a, const kvd_kvcache *cb,
                               int layer, int which_v, double slack) {
    cmp_counts n = {0, 0, 0};
    const unsigned char *b = which_v ? cb->v[layer] : cb->k[layer];
    kvd_kv_view va = kvd_kvcache_view(ca, layer), vb = kvd_kvcache_view(cb, layer);
    va.k = va.v = a;
    const int hd = cb->head_dim;
    float xa[hd], xb[hd];
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < cb->seqs[s].len; t++)
            for (int h = 0; h < cb->kv_heads; h++) {
                const unsigned char *ra = a + row_at(ca, s, t, h), *rb = b + row_at(cb, s, t, h);
                long dist[hd];
                int far_codes = 0;
                for (int d = 0; d < hd; d++) {
                    dist[d] = code_distance(cb->fmt, ra, rb, (size_t)d);
                    n.same += dist[d] == 0, far_codes |= dist[d] > 1;
                }
                n.total += (size_t)hd;
                if (!far_codes) continue;
                /* the values only where some code is more than one apart */
                kvd_kv_row(&va, which_v, ca->seqs[s].blocks, t, h, xa);
                kvd_kv_row(&vb, which_v, cb->seqs[s].blocks, t, h, xb);
                float top = 0;
                for (int d = 0; d < hd; d++) top = fmaxf(top, fabsf(xb[d]));
                for (int d = 0; d < hd; d++)
                    n.far += dist[d] > 1 && fabsf(xa[d] - xb[d]) > slack * top;
            }
    return n;
}

static int same_stats(const kvd_qstats *a, const kvd_qstats *b) {
    return a->n == b->n && a->saturated == b->saturated && a->flushed == b->flushed &&
           a->subnormal == b->subnormal;
}

static void tokens(uint64_t seed, int n, int vocab, int32_t *tok) {
    uint64_t key = kvd_rng_key(seed, "test.cuda_model.tokens");
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)(kvd_rng_uniform(key, (uint64_t)i) * vocab) % vocab;
}

/* a preset's synthetic weights (default knobs); -1 after a failed check */
static int preset_weights(const char *preset, kvd_config *cfg, kvd_weights *w) {
    char err[KVD_ERR_LEN];
    kvd_synth syn;
    kvd_synth_defaults(&syn);
    if (kvd_config_preset(preset, cfg, err) || kvd_weights_synth(w, cfg, &syn, err)) {
        CHECK(0, "%s: %s\n", preset, err);
        return -1;
    }
    return 0;
}

static void run(const char *preset, kvd_kv_mode mode, const kvd_kv_scales *scales,
                kvd_kv_scales *calibrated, int gpus) {
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    const int H = cfg.hidden_size, V = cfg.vocab_size, L = cfg.num_hidden_layers;
    int n_full = 0;
    for (int l = 0; l < L; l++) n_full += cfg.layer_types[l] == KVD_LAYER_FULL;
    kvd_kvcache kc, kd, kq;
    kvd_model *mc = kvd_model_new(&w, MAX_ROWS, 4, err);
    if (!mc ||
        kvd_kvcache_init(&kc, mode, n_full, cfg.num_key_value_heads, cfg.head_dim, 128, 4096,
                         scales, 1, err) ||
        kvd_kvcache_init(&kd, mode, n_full, cfg.num_key_value_heads, cfg.head_dim, 128, 4096,
                         scales, 1, err) ||
        kvd_kvcache_init(&kq, mode, n_full, cfg.num_key_value_heads, cfg.head_dim, 128, 4096,
                         scales, 1, err)) {
        CHECK(0, "%s: %s\n", preset, err);
        return;
    }
    /* a BF16 run also notes its queries (calibration's query scales), on
     * both sides */
    if (mode == KVD_KV_BF16 && calibrated)
        CHECK(!kvd_kvcache_track_queries(&kc, cfg.num_attention_heads) &&
                  !kvd_kvcache_track_queries(&kd, cfg.num_attention_heads),
              "%s: tracking queries failed\n", preset);
    kvd_cuda_model *md = kvd_cuda_model_new_tp(&w, &kd, MAX_ROWS, 4, gpus, err);
    if (!md) {
        if (strstr(err, "CUDA devices visible")) {
            printf("SKIP: %s %s on %d GPUs: %s\n", preset, kvd_kv_mode_name(mode), gpus, err);
        } else {
            CHECK(0, "%s: %s\n", preset, err);
        }
        kvd_model_free(mc), kvd_kvcache_free(&kc), kvd_kvcache_free(&kd);
        kvd_kvcache_free(&kq), kvd_weights_free(&w);
        return;
    }
    hidden_rec rec = {H, L, 0, malloc(sizeof(float) * (size_t)L * MAX_ROWS * H), {0}, &kq, 0};
    kvd_hooks hc = {.ctx = &rec, .hidden = cpu_hidden};
    kvd_hooks hd = {.ctx = &rec, .hidden = dev_hidden, .kv = dev_kv};
    kvd_model_set_hooks(mc, &hc);
    CHECK(kvd_cuda_model_set_hooks(md, &hd, err) == 0, "%s: %s\n", preset, err);
    int sa = kvd_kvcache_add_seq(&kc), sb = kvd_kvcache_add_seq(&kc);
    kvd_kvcache_add_seq(&kd), kvd_kvcache_add_seq(&kd);
    kvd_kvcache_add_seq(&kq), kvd_kvcache_add_seq(&kq);
    float *lc = malloc(sizeof(float) * 2 * V), *ld = malloc(sizeof(float) * 2 * V);
    int32_t ta[200], tb[77];
    tokens(11, 200, V, ta);
    tokens(12, 77, V, tb);
    double worst_logits = 0;
    /* prefill: one sequence per step, so each device step takes its own
     * hidden states from the CPU step just before it */
    const int32_t *pt[2] = {ta, tb};
    int32_t nxt[2];
    int pn[2] = {200, 77}, ps[2] = {sa, sb};
    for (int i = 0; i < 2; i++) {
        kvd_batch b = {1, &ps[i], &pn[i], pt[i]};
        int okc = kvd_forward(mc, &kc, &b, lc, 1, err) == 0;
        CHECK(okc, "%s cpu prefill: %s\n", preset, err);
        int okd = kvd_cuda_forward(md, &kd, &b, ld, 1, err) == 0;
        CHECK(okd, "%s device prefill: %s\n", preset, err);
        if (!okc || !okd) goto out;
        double e = rel_l2(ld, lc, (size_t)V);
        worst_logits = worst_of(worst_logits, e);
        nxt[i] = kvd_argmax(lc, V);
    }
    /* decode: both sequences per step, the CPU's greedy choices for both */
    for (int step = 0; step < 12; step++) {
        int seqs[2] = {sa, sb}, ones[2] = {1, 1};
        kvd_batch b = {2, seqs, ones, nxt};
        int okc = kvd_forward(mc, &kc, &b, lc, 1, err) == 0;
        CHECK(okc, "%s cpu decode: %s\n", preset, err);
        int okd = kvd_cuda_forward(md, &kd, &b, ld, 1, err) == 0;
        CHECK(okd, "%s device decode: %s\n", preset, err);
        if (!okc || !okd) goto out;
        double e = rel_l2(ld, lc, (size_t)2 * V);
        worst_logits = worst_of(worst_logits, e);
        nxt[0] = kvd_argmax(lc, V), nxt[1] = kvd_argmax(lc + V, V);
    }
    /* FP8: what one neighbouring code on an outlier channel allows (above).
     * INT4 (int4-token): the first attention layer reads the same cache
     * bytes from inputs FP32 roundings apart, and its output, rounded to
     * BF16 on both back ends, moves by the BF16 steps those roundings cross
     * (1e-3 holds it); after it, the K/V those steps move take the
     * neighbouring INT4 code (a 15th of the row's range) now and then, and
     * everything downstream follows (the simulator: 0.06% of the codes,
     * logits 3.9e-2 apart): 0.1, where the mode moves tiny's logits 0.3
     * from BF16's. The kernels themselves are held closely by the parity
     * test (the cache's bytes, the rotations' bits, attention) */
    const int fp8 = mode != KVD_KV_BF16, i4 = kvd_kv_mode_fmt(mode) == KVD_FMT_I4T;
    const double tol_logits = i4    ? 0.1
                              : fp8 ? 3e-3
                                    : 1e-4,
                 tol_hidden = i4    ? 0.1
                              : fp8 ? 2e-2
                                    : 1e-4;
    int first_full = 0;
    while (first_full < L && cfg.layer_types[first_full] != KVD_LAYER_FULL) first_full++;
    /* a branch of sequence A decoding one step alone, on both */
    {
        int fc = kvd_kvcache_fork(&kc, sa), fd = fc >= 0 ? kvd_cuda_model_fork(md, &kd, sa) : -1;
        int fq = kvd_kvcache_fork(&kq, sa);
        CHECK(fc >= 0 && fd == fc && fq == fc, "%s: fork failed (%d, %d, %d)\n", preset, fc, fd,
              fq);
        if (fc >= 0 && fd == fc) {
            kvd_model_copy_seq(mc, sa, fc);
            int one = 1;
            kvd_batch b = {1, &fc, &one, &nxt[0]};
            int ok = kvd_forward(mc, &kc, &b, lc, 1, err) == 0;
            ok = ok && kvd_cuda_forward(md, &kd, &b, ld, 1, err) == 0;
            CHECK(ok, "%s fork step: %s\n", preset, err);
            double e = ok ? rel_l2(ld, lc, (size_t)V) : 1;
            worst_logits = worst_of(worst_logits, e);
            kvd_kvcache_release(&kc, fc);
            kvd_kvcache_release(&kd, fc);
            kvd_kvcache_release(&kq, fc);
        }
    }
    CHECK(worst_logits < tol_logits, "%s %s: logits rel L2 %g\n", preset, kvd_kv_mode_name(mode),
          worst_logits);
    double worst_hidden = 0;
    int first_bad = -1;
    for (int l = 0; l < L; l++) {
        worst_hidden = worst_of(worst_hidden, rec.worst[l]);
        const double tol = i4 && l <= first_full ? 1e-3 : tol_hidden;
        if (first_bad < 0 && !(rec.worst[l] < tol)) first_bad = l;
    }
    if (first_bad >= 0)
        for (int l = 0; l < L; l++)
            fprintf(stderr, "  %s %s layer %d (%s): residual rel L2 %g\n", preset,
                    kvd_kv_mode_name(mode), l,
                    cfg.layer_types[l] == KVD_LAYER_FULL ? "attention" : "deltanet", rec.worst[l]);
    CHECK(first_bad < 0, "%s %s: the residual stream departs at layer %d\n", preset,
          kvd_kv_mode_name(mode), first_bad);
    /* the cache, first against the device's own K/V through the CPU's codec
     * (the kv hook): the same floats and scales give the same codes, counters
     * and absmax, bit for bit */
    const size_t pool =
        (size_t)kc.n_blocks * kc.kv_heads * kc.block_size * kvd_fmt_row_bytes(kc.fmt, kc.head_dim);
    size_t same_all = 0, total_all = 0;
    unsigned char *buf = malloc(pool);
    CHECK(!rec.requant_full, "%s: the requantized cache ran out of blocks\n", preset);
    for (int s = 0; s < 2; s++)
        CHECK(kd.seqs[s].len == kc.seqs[s].len && kq.seqs[s].len == kc.seqs[s].len,
              "%s: sequence lengths differ\n", preset);
    for (int a = 0; a < n_full; a++)
        for (int which = 0; which < 2; which++) {
            CHECK(kvd_cuda_model_pool(md, a, which, buf, pool) == 0, "pool copy failed\n");
            cmp_counts own = compare_rows(&kd, buf, &kq, a, which, 0);
            CHECK(own.total > 0 && own.same == own.total,
                  "%s %s attention layer %d %c: %zu of %zu cache values are not the device's "
                  "K/V through the CPU's codec\n",
                  preset, kvd_kv_mode_name(mode), a, which ? 'V' : 'K', own.total - own.same,
                  own.total);
            /* then against the CPU's: what neighbouring codes explain. The
             * first attention layer's inputs differ by FP32 roundings only;
             * FP8's later layers read inputs such codes moved (above) */
            cmp_counts cpu = compare_rows(&kd, buf, &kc, a, which, 1.0 / 256);
            /* INT8's step is 1/127 of its row's largest value, E4M3's 1/16
             * to 1/8 of the value itself: near the top of a row, where most
             * of a key's outlier-dominated codes sit, an FP32 rounding
             * crosses an INT8 step about ten times as often */
            const double need = !fp8 ? 0.99 : a > 0 ? 0.95 : kvd_fmt_int8(kc.fmt) ? 0.99 : 0.999;
            CHECK((fp8 && a > 0) || cpu.far == 0,
                  "%s %s attention layer %d %c: %zu cache values more than one code from the "
                  "CPU's\n",
                  preset, kvd_kv_mode_name(mode), a, which ? 'V' : 'K', cpu.far);
            CHECK(cpu.total > 0 && (double)cpu.same / cpu.total >= need,
                  "%s %s attention layer %d %c: cache %.5f%% the CPU's, expected >= %g%%\n", preset,
                  kvd_kv_mode_name(mode), a, which ? 'V' : 'K', 100.0 * cpu.same / cpu.total,
                  100 * need);
            same_all += cpu.same, total_all += cpu.total;
        }
    free(buf);
    for (int a = 0; a < n_full; a++) {
        CHECK(same_stats(&kq.k_stats[a], &kd.k_stats[a]) &&
                  same_stats(&kq.v_stats[a], &kd.v_stats[a]),
              "%s %s layer %d: the device's counters are not its values'\n", preset,
              kvd_kv_mode_name(mode), a);
        for (int h = 0; h < kc.kv_heads; h++) {
            size_t i = (size_t)a * kc.kv_heads + h;
            CHECK(kq.k_absmax[i] == kd.k_absmax[i] && kq.v_absmax[i] == kd.v_absmax[i],
                  "%s %s layer %d head %d: absmax %g/%g, the device's values give %g/%g\n", preset,
                  kvd_kv_mode_name(mode), a, h, kd.k_absmax[i], kd.v_absmax[i], kq.k_absmax[i],
                  kq.v_absmax[i]);
        }
        const kvd_qstats *c1[2] = {&kc.k_stats[a], &kc.v_stats[a]},
                         *c2[2] = {&kd.k_stats[a], &kd.v_stats[a]};
        /* past the first layer the inputs differ by more than FP32 roundings
         * (codes moved); INT8's flush count moves most: the CPU's GEMMs in
         * the AVX-512 kernel's sum order against the AMX tiles' moved tiny
         * int8-token's second layer by 9 of 623 (1e-2 allowed 8) */
        const double rel = a == 0 ? 1e-3 : kvd_fmt_int8(kc.fmt) ? 3e-2 : fp8 ? 1e-2 : 1e-3;
        for (int i = 0; i < 2; i++) {
            CHECK(c1[i]->n == c2[i]->n, "%s: counted values differ\n", preset);
            double ds = fabs((double)c1[i]->saturated - c2[i]->saturated),
                   df = fabs((double)c1[i]->flushed - c2[i]->flushed),
                   du = fabs((double)c1[i]->subnormal - c2[i]->subnormal);
            CHECK(ds <= 2 + rel * c1[i]->saturated && df <= 2 + rel * c1[i]->flushed &&
                      du <= 2 + rel * c1[i]->subnormal,
                  "%s %s layer %d: counters differ (sat %llu/%llu ftz %llu/%llu sub %llu/%llu)\n",
                  preset, kvd_kv_mode_name(mode), a, (unsigned long long)c1[i]->saturated,
                  (unsigned long long)c2[i]->saturated, (unsigned long long)c1[i]->flushed,
                  (unsigned long long)c2[i]->flushed, (unsigned long long)c1[i]->subnormal,
                  (unsigned long long)c2[i]->subnormal);
        }
    }
    printf("%-6s %-13s %d GPU%s logits rel L2 %.2e, residual %.2e, cache values %.4f%% identical\n",
           preset, kvd_kv_mode_name(mode), gpus, gpus > 1 ? "s" : " ", worst_logits, worst_hidden,
           100.0 * same_all / total_all);
    if (calibrated) { /* absmax / 448 from this (BF16) run: the fp8-cal scales */
        kvd_kv_scales_init(calibrated, n_full, cfg.num_key_value_heads);
        for (int i = 0; i < n_full * cfg.num_key_value_heads; i++) {
            calibrated->k[i] = kc.k_absmax[i] / 448.0f;
            calibrated->v[i] = kc.v_absmax[i] / 448.0f;
        }
        /* and the query's: the device notes the same queries (the same
         * projections, norms and RoPE: within an FP32 rounding or two) */
        const int nq = n_full * cfg.num_attention_heads;
        double qerr = 0;
        for (int i = 0; i < nq && kc.q_absmax && kd.q_absmax; i++)
            qerr = fmax(qerr, fabs((double)kd.q_absmax[i] - kc.q_absmax[i]) / kc.q_absmax[i]);
        CHECK(kc.q_absmax && kd.q_absmax && kd.q_absmax[0] > 0 && qerr < 1e-5,
              "%s: query absmax on the device %.3g relative from the CPU's\n", preset, qerr);
        if (kc.q_absmax && !kvd_kv_scales_init_q(calibrated, cfg.num_attention_heads))
            for (int i = 0; i < nq; i++) calibrated->q[i] = kc.q_absmax[i] / 448.0f;
    }
out:
    free(lc), free(ld), free(rec.cpu);
    kvd_cuda_model_free(md);
    kvd_model_free(mc);
    kvd_kvcache_free(&kc);
    kvd_kvcache_free(&kd);
    kvd_kvcache_free(&kq);
    kvd_weights_free(&w);
}

/* Weights made one tensor at a time just before their upload (the path for
 * presets too large for host memory, and for every model on the device back
 * end): synthetic, and read from a checkpoint (the same weights exported),
 * the same logits as uploaded whole. A CPU engine refuses lazy weights. */
static void lazy_weights(void) {
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_synth syn;
    kvd_weights w;
    kvd_synth_defaults(&syn);
    if (kvd_config_preset("tiny", &cfg, err) || kvd_weights_synth(&w, &cfg, &syn, err)) {
        CHECK(0, "tiny: %s\n", err);
        return;
    }
    const int V = cfg.vocab_size, nf = kvd_config_n_full(&cfg);
    kvd_kvcache k1, k2;
    kvd_kvcache_init(&k1, KVD_KV_BF16, nf, cfg.num_key_value_heads, cfg.head_dim, 128, 1024, NULL,
                     1, err);
    kvd_kvcache_init(&k2, KVD_KV_BF16, nf, cfg.num_key_value_heads, cfg.head_dim, 128, 1024, NULL,
                     1, err);
    kvd_kvcache k3;
    kvd_kvcache_init(&k3, KVD_KV_BF16, nf, cfg.num_key_value_heads, cfg.head_dim, 128, 1024, NULL,
                     1, err);
    char dir[] = "/tmp/kvd-lazy-XXXXXX";
    kvd_weights lw = {0};
    int have_dir = mkdtemp(dir) != NULL;
    CHECK(have_dir && kvd_export(&w, dir, 0, err) == 0 && kvd_weights_lazy_load(&lw, dir, err) == 0,
          "lazy checkpoint weights: %s\n", have_dir ? err : "no temporary directory");
    CHECK(lw.make && kvd_engine_cpu.create(&lw, &k3, 64, 1, 1, NULL, err) == NULL &&
              strstr(err, "lazy"),
          "a CPU engine over lazy weights: expected a refusal, got '%s'\n", err);
    kvd_cuda_model *a = kvd_cuda_model_new(&w, &k1, 64, 1, err);
    kvd_cuda_model *b = a ? kvd_cuda_model_new_synth(&cfg, &syn, &k2, 64, 1, 1, err) : NULL;
    kvd_cuda_model *c = b && lw.make ? kvd_cuda_model_new(&lw, &k3, 64, 1, err) : NULL;
    CHECK(a && b && c, "lazy weights: %s\n", err);
    if (a && b && c) {
        int32_t tok[50];
        tokens(13, 50, V, tok);
        int s1 = kvd_kvcache_add_seq(&k1), s2 = kvd_kvcache_add_seq(&k2),
            s3 = kvd_kvcache_add_seq(&k3), n = 50;
        float *l1 = malloc(sizeof(float) * V), *l2 = malloc(sizeof(float) * V),
              *l3 = malloc(sizeof(float) * V);
        kvd_batch b1 = {1, &s1, &n, tok}, b2 = {1, &s2, &n, tok}, b3 = {1, &s3, &n, tok};
        CHECK(kvd_cuda_forward(a, &k1, &b1, l1, 1, err) == 0 &&
                  kvd_cuda_forward(b, &k2, &b2, l2, 1, err) == 0 &&
                  kvd_cuda_forward(c, &k3, &b3, l3, 1, err) == 0,
              "lazy weights forward: %s\n", err);
        CHECK(!memcmp(l1, l2, sizeof(float) * V), "lazy synthetic weights: logits differ\n");
        CHECK(!memcmp(l1, l3, sizeof(float) * V), "lazy checkpoint weights: logits differ\n");
        free(l1), free(l2), free(l3);
    }
    kvd_cuda_model_free(a), kvd_cuda_model_free(b), kvd_cuda_model_free(c);
    kvd_kvcache_free(&k1), kvd_kvcache_free(&k2), kvd_kvcache_free(&k3);
    kvd_weights_free(&w), kvd_weights_free(&lw);
    if (have_dir) {
        char p[64];
        snprintf(p, sizeof p, "%s/config.json", dir), remove(p);
        snprintf(p, sizeof p, "%s/model.safetensors", dir), remove(p);
        rmdir(dir);
    }
}

/* ---- drift figures: kvd_drift_run on the device against the CPU ----
 * One trace of 600 tokens (three chunks; positions 300-363 copy 100-163),
 * greedy generation from two prefixes. Every figure's count must match and
 * its mean agree within rtol * |mean| + atol: on a GPU, or split over
 * several, rtol 5% (the FP8 candidate's cache differs in values at rounding
 * boundaries, which moves the attention figures a little), atol 1e-6 for
 * the divergences, 0.02 for the agreement fractions and 3e-4 for delta_nll
 * (a difference of two NLLs of about log(vocab) nats each, from logits that
 * agree within 1e-4: the simulated kernels, with the CPU's arithmetic in
 * another order, moved it by 1.1e-4 on a mean of 1.4e-3); in the emulation
 * of one GPU (every device operation its CPU twin, the same sums in the same
 * order) 1e-6 and 1e-12. */
static double drift_rtol, drift_atol, frac_atol, nll_atol, drift_se, worst_fig;

/* the standard error of a figure's mean */
static double stat_se(const kvd_stat *s) {
    if (s->n < 2) return 0;
    const double m = s->sum / s->n, var = (s->sumsq - s->n * m * m) / (s->n - 1);
    return var > 0 ? sqrt(var / s->n) : 0;
}

static void cmp_stat(const char *what, int i, const kvd_stat *a, const kvd_stat *b, double atol) {
    CHECK(a->n == b->n, "drift %s[%d]: n %g on the CPU, %g on the device\n", what, i, a->n, b->n);
    if (a->n == 0) return;
    double ma = kvd_stat_mean(a), mb = kvd_stat_mean(b), e = fabs(ma - mb);
    double lim = drift_rtol * fmax(fabs(ma), fabs(mb)) + atol + drift_se * stat_se(a);
    if (e / lim > worst_fig) worst_fig = e / lim;
    CHECK(e <= lim, "drift %s[%d]: mean %.9g on the CPU, %.9g on the device\n", what, i, ma, mb);
}

static void drift_figures(const char *preset, kvd_kv_mode mode, const kvd_kv_scales *scales,
                          int gpus, int attn_fp8, int apart) {
#ifdef KVD_DEVICE_EMULATED
    const int exact = gpus == 1;
#else
    const int exact = 0;
#endif
    drift_rtol = exact ? 1e-6 : 0.05;
    drift_atol = exact ? 1e-12 : 1e-6;
    /* FP8 attention rounds each weight to E4M3: a score an FP32 rounding
     * away (another summation order, another split over GPUs) can take a
     * weight one E4M3 step (1/16) the other way, and the step carries on
     * through the layers. The back ends then differ as two draws of that
     * rounding noise do: held within one standard error of the figure on
     * top (over two emulated GPUs, delta_nll of positions 128-255 moved by
     * 1.05e-3, 2x the 5% and 3e-4 it has without) */
    drift_se = exact || !attn_fp8 ? 0 : 1;
    /* INT8 rows with their own scales: the same, a code one whole step the
     * other way (truncation moves every code by up to a step, so the two
     * back ends' roundings cross more of them) carries on through the
     * layers; held within one standard error too */
    if (!exact && kvd_fmt_int8(kvd_kv_mode_fmt(mode))) drift_se = 1;
    /* INT4 the same: a code a whole step (a 15th of the row's range) the
     * other way, where the first attention layer's output is rounded to
     * BF16 a step apart on the two back ends (run(), above) */
    if (!exact && kvd_kv_mode_fmt(mode) == KVD_FMT_I4T) drift_se = 1;
    frac_atol = exact ? 1e-12 : 0.02;
    nll_atol = exact ? 1e-12 : 3e-4;
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    enum { N = 600 };
    uint32_t *tok = malloc(sizeof(uint32_t) * N);
    uint8_t is_copy[N + 1] = {0}, start[N + 1] = {0};
    tokens(21, N, cfg.vocab_size, (int32_t *)tok);
    for (int i = 0; i < 64; i++) tok[300 + i] = tok[100 + i], is_copy[300 + i] = 1;
    start[300] = 1;
    kvd_drift_opts o;
    kvd_drift_opts_defaults(&o);
    o.gen_tokens = 8;
    o.n_gen = 2;
    o.gen_prefix[0] = 150, o.gen_prefix[1] = 400;
    o.attn_fp8 = attn_fp8;
    kvd_drift dc, dd;
    kvd_drift_init(&dc, &cfg, N);
    kvd_drift_init(&dd, &cfg, N);
    int okc = kvd_drift_run(&kvd_backend_cpu, &w, tok, is_copy, start, N, mode, scales, &o, &dc,
                            err) == 0;
    CHECK(okc, "%s drift on the cpu: %s\n", preset, err);
    /* apart: the device model with the shadow on the reference (its own
     * query and K/V) rather than on the candidate (the reference's) */
    kvd_engine_ops ops = kvd_engine_cuda;
    ops.shadow_of_reference = !apart;
    const kvd_backend dev = {&ops, gpus};
    int okd = kvd_drift_run(&dev, &w, tok, is_copy, start, N, mode, scales, &o, &dd, err) == 0;
    if (!okd && strstr(err, "CUDA devices visible")) {
        printf("SKIP: %s drift on %d GPUs: %s\n", preset, gpus, err);
        okd = -1;
    } else {
        CHECK(okd, "%s drift on the device: %s\n", preset, err);
    }
    worst_fig = 0;
    if (okc && okd == 1) {
        const double ta[KVD_OUT_N] = {drift_atol, frac_atol, frac_atol, nll_atol};
        for (int m = 0; m < KVD_OUT_N; m++)
            for (int i = 0; i < KVD_NSUB * KVD_NB; i++)
                cmp_stat(kvd_out_names[m], i, &dc.out[m][0][0] + i, &dd.out[m][0][0] + i, ta[m]);
        size_t nh = (size_t)dc.n_layers * KVD_HID_N * KVD_NSUB * KVD_NB;
        for (size_t i = 0; i < nh; i++)
            cmp_stat("hidden", (int)i, &dc.hid[i], &dd.hid[i], drift_atol);
        size_t na = (size_t)dc.n_attn * KVD_VIEW_N * KVD_ATT_N * KVD_NSUB * KVD_NB;
        for (size_t i = 0; i < na; i++) {
            int metric = (int)(i / (KVD_NSUB * KVD_NB) % KVD_ATT_N);
            cmp_stat("attention", (int)i, &dc.att[i], &dd.att[i],
                     metric == KVD_ATT_ARGMAX ? frac_atol : drift_atol);
        }
        for (size_t i = 0; i < (size_t)dc.n_attn * dc.kv_heads * KVD_VIEW_N * KVD_NB; i++)
            cmp_stat("attention per KV head", (int)i, &dc.att_kvh[i], &dd.att_kvh[i], drift_atol);
        for (size_t i = 0; i < (size_t)dc.n_layers * KVD_NB; i++)
            cmp_stat("router", (int)i, &dc.router[i], &dd.router[i], frac_atol);
        CHECK(dc.n_tok == dd.n_tok && dc.n_gen == dd.n_gen && dc.n_gen == 2,
              "drift: %lld/%lld output KLs, %d/%d generations\n", (long long)dc.n_tok,
              (long long)dd.n_tok, dc.n_gen, dd.n_gen);
        /* position by position, as the results file keeps them: the same
         * subsets; the KL apart by no more on average than the means may be;
         * top-1 agreement flipped at no more positions than its share allows */
        if (dc.n_tok == dd.n_tok && dc.n_tok > 0) {
            double l1 = 0, klc = 0, flips = 0, routed = 0;
            int64_t copies = 0;
            for (int64_t i = 0; i < dc.n_tok; i++) {
                const kvd_token_fig *a = &dc.tok[i], *b = &dd.tok[i];
                copies +=
                    a->copy != b->copy || isnan(a->attn_propagated) != isnan(b->attn_propagated);
                l1 += fabs((double)a->kl - (double)b->kl), klc += a->kl;
                flips += a->same_top != b->same_top;
                routed += abs((int)a->router_flips - (int)b->router_flips);
            }
            const double n = (double)dc.n_tok;
            CHECK(copies == 0,
                  "drift positions: %lld positions in another subset or sampled on one side only\n",
                  (long long)copies);
            CHECK(l1 / n <= drift_rtol * klc / n + drift_atol,
                  "drift positions: mean |KL cpu - device| %.3g against a mean KL of %.3g\n",
                  l1 / n, klc / n);
            CHECK(flips / n <= frac_atol,
                  "drift positions: top-1 agreement differs at %.0f of %.0f positions\n", flips, n);
            CHECK(routed / (n * dc.n_layers) <= frac_atol,
                  "drift positions: the router flips differ by %.0f over %.0f positions and %d "
                  "layers\n",
                  routed, n, dc.n_layers);
        }
        /* greedy generation: past its first divergence a candidate runs on
         * from other tokens than the reference's, and a near tie that the
         * two back ends' sums broke apart (an NVFP4 code a step apart, say)
         * parts their paths, so the agreement after the earlier of the two
         * first divergences is left to chance: allowed to differ by the
         * tokens after it, at least one (exact: not at all) */
        for (int g = 0; g < dc.n_gen && g < dd.n_gen; g++) {
            const kvd_gen_result *a = &dc.gen[g], *b = &dd.gen[g];
            const int first = a->first_divergence < b->first_divergence ? a->first_divergence
                                                                        : b->first_divergence;
            const int slack =
                frac_atol > 0.01 ? (a->tokens - first > 1 ? a->tokens - first : 1) : 0;
            CHECK(a->tokens == b->tokens && abs(a->agree - b->agree) <= slack,
                  "drift generation %d: %d agreeing tokens on the CPU (first divergence %d), %d "
                  "on the device (%d), of %d\n",
                  g, a->agree, a->first_divergence, b->agree, b->first_divergence, a->tokens);
        }
        for (int l = 0; l < dc.n_attn; l++) {
            const kvd_qstats *a = &dc.k_stats[l], *b = &dd.k_stats[l];
            const kvd_qstats *av = &dc.v_stats[l], *bv = &dd.v_stats[l];
            CHECK(a->n == b->n && av->n == bv->n &&
                      fabs((double)a->saturated - (double)b->saturated) <= 1e-3 * (double)a->n &&
                      fabs((double)av->flushed - (double)bv->flushed) <= 1e-3 * (double)av->n,
                  "drift layer %d: the candidate cache's counters differ\n", l);
        }
        /* a BF16 candidate is the reference: each comparison then sees equal
         * inputs computed by the same kernels on both sides, so every
         * attention, hidden-state and output figure is exactly that of no
         * drift, as on the CPU */
        for (size_t i = 0; mode == KVD_KV_BF16 && i < na; i++) {
            int metric = (int)(i / (KVD_NSUB * KVD_NB) % KVD_ATT_N);
            double want = metric == KVD_ATT_ARGMAX ? 1.0 : 0.0;
            CHECK(dd.att[i].n == 0 || kvd_stat_mean(&dd.att[i]) == want,
                  "drift bf16: attention figure %d is %.9g on the device, want exactly %g\n",
                  (int)i, kvd_stat_mean(&dd.att[i]), want);
        }
        for (size_t i = 0; mode == KVD_KV_BF16 && i < nh; i++) {
            double want = (i / (KVD_NSUB * KVD_NB) % KVD_HID_N) == KVD_HID_COS ? 1.0 : 0.0;
            CHECK(dd.hid[i].n == 0 || kvd_stat_mean(&dd.hid[i]) == want,
                  "drift bf16: hidden figure %d is %.17g on the device, want exactly %g\n", (int)i,
                  kvd_stat_mean(&dd.hid[i]), want);
        }
        for (int i = 0; mode == KVD_KV_BF16 && i < KVD_NSUB * KVD_NB; i++) {
            const kvd_stat *kl = &dd.out[KVD_OUT_KL][0][0] + i;
            CHECK(kl->n == 0 || kvd_stat_mean(kl) == 0,
                  "drift bf16: output KL %.9g on the device, want exactly 0\n", kvd_stat_mean(kl));
        }
        /* the figures are not trivially equal: the candidate drifted */
        CHECK(mode == KVD_KV_BF16 || kvd_stat_mean(&dc.out[KVD_OUT_KL][0][8]) > 0,
              "drift: no output KL at all in mode %s\n", kvd_kv_mode_name(mode));
        printf("%-6s %-13s %d GPU%s drift figures%s%s: worst |cpu - device| %.3g of the "
               "tolerance\n",
               preset, kvd_kv_mode_name(mode), gpus, gpus > 1 ? "s" : " ",
               attn_fp8 ? " (FP8 attention)" : "", apart ? " (shadow on the reference)" : "",
               worst_fig);
    }
    kvd_drift_free(&dc), kvd_drift_free(&dd);
    free(tok);
    kvd_weights_free(&w);
}

/* A group's candidates against each mode alone, on the device: bit for bit
 * in the emulation of one GPU (1), else within drift_figures' tolerances
 * (0, the tolerances set). */
static int group_tolerances(int gpus) {
#ifdef KVD_DEVICE_EMULATED
    const int exact = gpus == 1;
#else
    const int exact = 0;
    (void)gpus;
#endif
    drift_rtol = exact ? 0 : 0.05;
    drift_atol = exact ? 0 : 1e-6;
    drift_se = exact ? 0 : 1;
    return exact;
}

/* a candidate of a group of K against the same mode run alone: bit for
 * bit where exact, else within drift_figures' tolerances */
static void same_as_alone(const char *preset, kvd_kv_mode mode, int K, const kvd_drift *dg,
                          const kvd_drift *d1, int exact) {
    if (exact) {
        CHECK(
            !memcmp(dg->att, d1->att,
                    sizeof(kvd_stat) * (size_t)d1->n_attn * KVD_VIEW_N * KVD_ATT_N * KVD_NSUB *
                        KVD_NB) &&
                !memcmp(dg->out, d1->out, sizeof d1->out) &&
                !memcmp(dg->hid, d1->hid,
                        sizeof(kvd_stat) * (size_t)d1->n_layers * KVD_HID_N * KVD_NSUB * KVD_NB) &&
                dg->n_tok == d1->n_tok &&
                !memcmp(dg->tok, d1->tok, sizeof(kvd_token_fig) * (size_t)d1->n_tok) &&
                !memcmp(dg->gen, d1->gen, sizeof d1->gen),
            "%s drift of %s: in a group of %d, not bit for bit as alone\n", preset,
            kvd_kv_mode_name(mode), K);
    } else {
        for (int m = 0; m < KVD_OUT_N; m++)
            for (int i = 0; i < KVD_NSUB * KVD_NB; i++)
                cmp_stat(kvd_out_names[m], i, &d1->out[m][0][0] + i, &dg->out[m][0][0] + i,
                         m == KVD_OUT_KL ? drift_atol : 0.02);
        size_t na = (size_t)d1->n_attn * KVD_VIEW_N * KVD_ATT_N * KVD_NSUB * KVD_NB;
        for (size_t i = 0; i < na; i++)
            cmp_stat("attention", (int)i, &d1->att[i], &dg->att[i],
                     (int)(i / (KVD_NSUB * KVD_NB) % KVD_ATT_N) == KVD_ATT_ARGMAX ? 0.02
                                                                                  : drift_atol);
    }
}

/* ---- drift: several candidates against one reference run on the device ----
 * kvd_drift_run_modes on the device (every candidate's isolated view from
 * the reference's query and K/V rows of one reference step) against each
 * mode alone: bit for bit in the emulation of one GPU (the same operations
 * on the same inputs); on a GPU, within drift_figures' tolerances. */
static void drift_group(const char *preset, const kvd_kv_scales *cal, int gpus) {
    const int exact = group_tolerances(gpus);
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    enum { N = 400, K = 3 };
    uint32_t *tok = malloc(sizeof(uint32_t) * N);
    uint8_t is_copy[N + 1] = {0}, start[N + 1] = {0};
    tokens(23, N, cfg.vocab_size, (int32_t *)tok);
    for (int i = 0; i < 48; i++) tok[260 + i] = tok[60 + i], is_copy[260 + i] = 1;
    start[260] = 1;
    kvd_drift_opts o;
    kvd_drift_opts_defaults(&o);
    o.gen_tokens = 6;
    o.n_gen = 1;
    o.gen_prefix[0] = 200;
    const kvd_kv_mode modes[K] = {KVD_KV_FP8_CAL, KVD_KV_FP8_UNSCALED, KVD_KV_FP8_TOKEN};
    const kvd_kv_scales *scales[K] = {cal, NULL, NULL};
    const kvd_backend dev = {&kvd_engine_cuda, gpus};
    kvd_drift dg[K], d1;
    for (int j = 0; j < K; j++) kvd_drift_init(&dg[j], &cfg, N);
    int ok = kvd_drift_run_modes(&dev, &w, tok, is_copy, start, N, K, modes, scales, &o, dg, err);
    if (ok && strstr(err, "CUDA devices visible")) {
        printf("SKIP: %s drift of %d modes on %d GPUs: %s\n", preset, K, gpus, err);
    } else {
        CHECK(ok == 0, "%s drift of %d modes on the device: %s\n", preset, K, err);
    }
    worst_fig = 0;
    for (int j = 0; j < K && ok == 0; j++) {
        kvd_drift_init(&d1, &cfg, N);
        int ok1 =
            kvd_drift_run(&dev, &w, tok, is_copy, start, N, modes[j], scales[j], &o, &d1, err) == 0;
        CHECK(ok1, "%s drift of %s alone on the device: %s\n", preset, kvd_kv_mode_name(modes[j]),
              err);
        if (ok1) same_as_alone(preset, modes[j], K, &dg[j], &d1, exact);
        /* the isolated view moved: a candidate's codec, not the reference's */
        CHECK(!ok1 ||
                  kvd_drift_att(&d1, 0, KVD_VIEW_ISOLATED, KVD_ATT_KL, KVD_SUB_ALL, kvd_bucket(300))
                          ->sum > 0,
              "%s drift of %s: no isolated attention KL\n", preset, kvd_kv_mode_name(modes[j]));
        kvd_drift_free(&d1);
    }
    if (ok == 0)
        printf("%-6s %d modes, %d GPU%s drift in one lock step against each alone%s\n", preset, K,
               gpus, gpus > 1 ? "s" : " ", exact ? ": bit for bit" : "");
    for (int j = 0; j < K; j++) kvd_drift_free(&dg[j]);
    free(tok);
    kvd_weights_free(&w);
}

/* A candidate whose step fails on the device drops out of the group and
 * the others run on: E4M3 written without saturation stores NaN where the
 * unscaled cache overflows, so fp8-unscaled fails, named; fp8-e5m2 and
 * fp8-token get the figures each gets alone. */
#ifndef KVD_DEVICE_SIMT /* host logic: the simulator's kernels add nothing here */
static void drift_drop_out(const char *preset, int gpus) {
    const int exact = group_tolerances(gpus);
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    enum { N = 300, K = 3 };
    uint32_t *tok = malloc(sizeof(uint32_t) * N);
    uint8_t none[N + 1] = {0};
    tokens(29, N, cfg.vocab_size, (int32_t *)tok);
    kvd_drift_opts o;
    kvd_drift_opts_defaults(&o);
    o.saturate = 0;
    o.gen_tokens = 4;
    o.n_gen = 1;
    o.gen_prefix[0] = 200;
    const kvd_kv_mode modes[K] = {KVD_KV_FP8_E5M2, KVD_KV_FP8_UNSCALED, KVD_KV_FP8_TOKEN};
    const kvd_kv_scales *scales[K] = {NULL, NULL, NULL};
    const kvd_backend dev = {&kvd_engine_cuda, gpus};
    kvd_drift dg[K], d1;
    for (int j = 0; j < K; j++) kvd_drift_init(&dg[j], &cfg, N);
    int rc = kvd_drift_run_modes(&dev, &w, tok, none, none, N, K, modes, scales, &o, dg, err);
    if (rc && strstr(err, "CUDA devices visible")) {
        printf("SKIP: %s drift with a mode that fails, on %d GPUs: %s\n", preset, gpus, err);
    } else {
        CHECK(rc == -1 && strstr(err, "fp8-unscaled: non-finite activation") && dg[1].failed &&
                  !dg[0].failed && !dg[2].failed,
              "%s drift with fp8-unscaled failing on the device: expected it alone to fail, "
              "named, got %d '%s'\n",
              preset, rc, err);
        for (int j = 0; j < K; j += 2) {
            kvd_drift_init(&d1, &cfg, N);
            int ok1 =
                kvd_drift_run(&dev, &w, tok, none, none, N, modes[j], NULL, &o, &d1, err) == 0;
            CHECK(ok1, "%s drift of %s alone on the device: %s\n", preset,
                  kvd_kv_mode_name(modes[j]), err);
            if (ok1 && !dg[j].failed) same_as_alone(preset, modes[j], K, &dg[j], &d1, exact);
            kvd_drift_free(&d1);
        }
        printf("%-6s %d GPU%s a mode that fails drops out; the others as alone%s\n", preset, gpus,
               gpus > 1 ? "s" : " ", exact ? ": bit for bit" : "");
    }
    for (int j = 0; j < K; j++) kvd_drift_free(&dg[j]);
    free(tok);
    kvd_weights_free(&w);
}
#endif

static void raw_attn(void *ctx, int al, int seq, int pos, int n_ctx, const float *p,
                     const float *out, const float *sp, const float *so) {
    (void)ctx, (void)al, (void)seq, (void)pos, (void)n_ctx, (void)p, (void)out, (void)sp, (void)so;
}

/* what the device model refuses, naming it: a split that does not divide;
 * whole attention distributions (it compares them on the device); a
 * reference of another shape */
static void refusals(void) {
    char err[KVD_ERR_LEN] = "";
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights("tiny", &cfg, &w)) return;
    kvd_kvcache kv;
    kvd_kvcache_init(&kv, KVD_KV_BF16, kvd_config_n_full(&cfg), cfg.num_key_value_heads,
                     cfg.head_dim, 128, 1024, NULL, 1, err);
    kvd_cuda_model *m = kvd_cuda_model_new_tp(&w, &kv, 64, 1, 4, err);
    CHECK(!m && strstr(err, "linear_num_key_heads 2 does not split into 4"),
          "tiny over 4 GPUs: expected a refusal naming linear_num_key_heads, got '%s'\n", err);
    kvd_cuda_model_free(m);
    /* a GEMM setting the back end does not know is refused, not taken for
     * unset */
    setenv("KVD_CUDA_GEMM", "fastest", 1);
    m = kvd_cuda_model_new_tp(&w, &kv, 64, 1, 1, err);
    unsetenv("KVD_CUDA_GEMM");
    CHECK(!m && strstr(err, "KVD_CUDA_GEMM=fastest: expected 'tune' or 'first'"),
          "KVD_CUDA_GEMM=fastest: expected a refusal naming it, got '%s'\n", m ? "accepted" : err);
    kvd_cuda_model_free(m);
    kvd_cuda_model *a = kvd_cuda_model_new_tp(&w, &kv, 64, 1, 1, err);
    kvd_cuda_model *b = a ? kvd_cuda_model_new_shared(a, &kv, 128, 1, err) : NULL;
    CHECK(a && b, "tiny on 1 GPU: %s\n", err);
    if (a && b) {
        kvd_hooks h = {.attn = raw_attn};
        CHECK(kvd_cuda_model_set_hooks(a, &h, err) == -1 && strstr(err, "attn_cmp"),
              "the attn hook: expected a refusal naming attn_cmp, got '%s'\n", err);
        CHECK(kvd_cuda_model_set_reference(b, a, err) == -1 && strstr(err, "rows a step"),
              "a reference of fewer rows: expected a refusal, got '%s'\n", err);
        CHECK(kvd_cuda_model_set_reference(a, b, err) == 0, "a reference: %s\n", err);
    }
    kvd_cuda_model_free(b), kvd_cuda_model_free(a);
    kvd_kvcache_free(&kv);
    kvd_weights_free(&w);
}

/* A NaN in an activation is reported with its layer, what held it and its
 * position, on one GPU and split over two: a poisoned embedding row (the
 * token at position 9) shows first in layer 0's token mixer output; a
 * poisoned norm weight after layer 2's mixer, in layer 2's residual stream
 * (the MoE's output added), from the first position on. */
static void nonfinite_caught(void) {
    static const struct {
        const char *tensor, *want[3];
        size_t at; /* flat index into the tensor */
    } cases[] = {
        {"model.embed_tokens.weight",
         {"the token mixer output of layer 0 (linear_attention)", "position 9,", NULL},
         77 * 128 + 5},
        {"model.layers.2.post_attention_layernorm.weight",
         {"the residual stream of layer 2 (linear_attention)", "position 0,", NULL},
         5},
    };
    for (int ci = 0; ci < 2; ci++)
        for (int gpus = 1; gpus <= 2; gpus++) {
            char err[KVD_ERR_LEN] = "";
            kvd_config cfg;
            kvd_weights w;
            if (preset_weights("tiny", &cfg, &w)) return;
            CHECK(cfg.hidden_size == 128, "tiny's hidden size changed: the case's index\n");
            const kvd_tensor *t = kvd_weights_find(&w, cases[ci].tensor);
            CHECK(t != NULL, "no tensor %s\n", cases[ci].tensor);
            if (!t) {
                kvd_weights_free(&w);
                return;
            }
            t->data[cases[ci].at] = NAN;
            kvd_kvcache kv;
            kvd_kvcache_init(&kv, KVD_KV_BF16, kvd_config_n_full(&cfg), cfg.num_key_value_heads,
                             cfg.head_dim, 16, 64, NULL, 1, err);
            kvd_cuda_model *md = kvd_cuda_model_new_tp(&w, &kv, 16, 1, gpus, err);
            if (!md) {
                CHECK(strstr(err, "CUDA devices visible") != NULL, "tiny, %d GPUs: %s\n", gpus,
                      err);
                kvd_kvcache_free(&kv), kvd_weights_free(&w);
                continue;
            }
            int32_t tok[16];
            tokens(5, 16, cfg.vocab_size, tok);
            for (int i = 0; i < 16; i++)
                if (tok[i] == 77) tok[i] = 78;
            tok[9] = 77;
            int seq = kvd_kvcache_add_seq(&kv), n = 16;
            kvd_batch b = {1, &seq, &n, tok};
            float *lg = malloc(sizeof(float) * cfg.vocab_size);
            const int rc = kvd_cuda_forward(md, &kv, &b, lg, 1, err);
            int found = rc == -1 && strstr(err, "non-finite activation") != NULL;
            for (int k = 0; k < 3 && cases[ci].want[k]; k++)
                found = found && strstr(err, cases[ci].want[k]) != NULL;
            CHECK(found, "NaN in %s, %d GPU(s): expected a report naming '%s', got rc %d: '%s'\n",
                  cases[ci].tensor, gpus, cases[ci].want[0], rc, err);
            free(lg);
            kvd_cuda_model_free(md);
            kvd_kvcache_free(&kv);
            kvd_weights_free(&w);
        }
}

/* A model made, run and freed gives back every byte of device memory it
 * took: of two rounds, the second (the first makes the back end's state
 * for each device: cuBLASLt's workspace, the split products' buffers)
 * leaves each device's memory in use as it found it; on one GPU and split
 * over two. A GPU's figure may move by a little the model did not take. */
static void memory_returned(void) {
#if defined(KVD_DEVICE_EMULATED) || defined(KVD_DEVICE_SIMT)
    const size_t slack = 0;
#else
    const size_t slack = (size_t)4 << 20;
#endif
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights("tiny", &cfg, &w)) return;
    for (int gpus = 1; gpus <= 2; gpus++) {
        size_t before[2] = {0, 0}, after[2] = {0, 0};
        int known = 1;
        for (int round = 0; round < 2; round++) {
            char err[KVD_ERR_LEN] = "";
            for (int r = 0; r < gpus && round == 1; r++)
                known &= kvd_cuda_set_device(r) == 0 && kvd_cuda_mem_in_use(&before[r]) == 0;
            kvd_cuda_set_device(0);
            kvd_kvcache kv;
            kvd_kvcache_init(&kv, KVD_KV_FP8_UNSCALED, kvd_config_n_full(&cfg),
                             cfg.num_key_value_heads, cfg.head_dim, 16, 64, NULL, 1, err);
            kvd_cuda_model *md = kvd_cuda_model_new_tp(&w, &kv, 16, 1, gpus, err);
            if (!md) {
                CHECK(strstr(err, "CUDA devices visible") != NULL, "tiny, %d GPUs: %s\n", gpus,
                      err);
                kvd_kvcache_free(&kv);
                known = 0;
                break;
            }
            int32_t tok[16];
            tokens(7, 16, cfg.vocab_size, tok);
            int seq = kvd_kvcache_add_seq(&kv), n = 16;
            kvd_batch b = {1, &seq, &n, tok};
            float *lg = malloc(sizeof(float) * cfg.vocab_size);
            CHECK(kvd_cuda_forward(md, &kv, &b, lg, 1, err) == 0, "tiny, %d GPUs: %s\n", gpus, err);
            free(lg);
            kvd_cuda_model_free(md);
            kvd_kvcache_free(&kv);
            for (int r = 0; r < gpus && round == 1; r++)
                known &= kvd_cuda_set_device(r) == 0 && kvd_cuda_mem_in_use(&after[r]) == 0;
            kvd_cuda_set_device(0);
        }
        for (int r = 0; r < gpus && known; r++)
            CHECK(after[r] <= before[r] + slack,
                  "%d GPU(s): device %d holds %zu bytes more after a model's round\n", gpus, r,
                  after[r] - before[r]);
    }
    kvd_weights_free(&w);
}

/* the simulator's count of kernel launches (absent on a GPU) */
extern unsigned long long kvd_simt_launches(void) __attribute__((weak));

/* the router hook's record: the most rows any expert had in a step */
typedef struct {
    int E, K, most;
} moe_rows;
static void note_rows(void *ctx, int layer, const kvd_batch *b, const int *experts) {
    moe_rows *r = ctx;
    (void)layer;
    int rows = 0, *count = calloc((size_t)r->E, sizeof(int));
    for (int s = 0; s < b->n; s++) rows += b->n_tok[s];
    for (int i = 0; count && i < rows * r->K; i++)
        if (experts[i] >= 0 && experts[i] < r->E && ++count[experts[i]] > r->most)
            r->most = count[experts[i]];
    free(count);
}

/* C sequences prefilled with P tokens each (one sequence a step), then
 * `steps` decode steps of all C, on a model made with KVD_CUDA_MOE=env (NULL:
 * unset); the decode steps' logits into lg, C V a step; the kernel launches
 * of the decode steps (the simulator's count; 0 on a GPU) into *launched
 * and, with rows, the most rows an expert had in them. 0, or -1 after a
 * failed check (-2: no devices). */
static int moe_run(const char *preset, const kvd_weights *w, int gpus, const char *env, int C,
                   int P, int steps, float *lg, unsigned long long *launched, moe_rows *rows) {
    char err[KVD_ERR_LEN];
    const kvd_config *cfg = &w->cfg;
    const int V = cfg->vocab_size;
    kvd_kvcache kv;
    if (kvd_kvcache_init(&kv, KVD_KV_BF16, kvd_config_n_full(cfg), cfg->num_key_value_heads,
                         cfg->head_dim, 16, 4096, NULL, 1, err)) {
        CHECK(0, "%s: %s\n", preset, err);
        return -1;
    }
    if (env) setenv("KVD_CUDA_MOE", env, 1);
    kvd_cuda_model *md = kvd_cuda_model_new_tp(w, &kv, MAX_ROWS, C, gpus, err);
    unsetenv("KVD_CUDA_MOE");
    if (!md) {
        const int none = strstr(err, "CUDA devices visible") != NULL;
        if (!none) CHECK(0, "%s: %s\n", preset, err);
        kvd_kvcache_free(&kv);
        return none ? -2 : -1;
    }
    int *seqs = malloc(sizeof(int) * C), *ones = malloc(sizeof(int) * C);
    int32_t *tok = malloc(sizeof(int32_t) * P), *nxt = malloc(sizeof(int32_t) * C);
    int ok = 1;
    for (int s = 0; s < C && ok; s++) {
        seqs[s] = kvd_kvcache_add_seq(&kv), ones[s] = 1;
        tokens(40 + s, P, V, tok);
        kvd_batch b = {1, &seqs[s], &P, tok};
        ok = kvd_cuda_forward(md, &kv, &b, lg, 1, err) == 0;
        nxt[s] = tok[s % P];
    }
    kvd_hooks h = {.ctx = rows, .router = note_rows};
    if (ok && rows) ok = kvd_cuda_model_set_hooks(md, &h, err) == 0;
    const unsigned long long l0 = kvd_simt_launches ? kvd_simt_launches() : 0;
    for (int step = 0; step < steps && ok; step++) {
        kvd_batch b = {C, seqs, ones, nxt};
        float *out = lg + (size_t)step * C * V;
        ok = kvd_cuda_forward(md, &kv, &b, out, 1, err) == 0;
        for (int s = 0; s < C && ok; s++) nxt[s] = kvd_argmax(out + (size_t)s * V, V);
    }
    *launched = kvd_simt_launches ? kvd_simt_launches() - l0 : 0;
    CHECK(ok, "%s moe paths (%d GPUs, KVD_CUDA_MOE=%s, C %d): %s\n", preset, gpus, env ? env : "",
          C, err);
    kvd_cuda_model_free(md);
    kvd_kvcache_free(&kv);
    free(seqs), free(ones), free(tok), free(nxt);
    return ok ? 0 : -1;
}

/* The MoE experts' paths on one GPU (from gpus0) and split over two, bit
 * for bit. Four sequences of 16 tokens, then decode steps of all four:
 * the grouped launches (their lists made on the device) against a launch
 * per expert and product (KVD_CUDA_MOE=loop; up to 16 rows an expert, the
 * same arithmetic). Decode steps of 32 sequences, up to KVD_GROUPED_ROWS
 * rows an expert in two tiles of 16: the device's lists against the
 * host's (KVD_CUDA_MOE=host). */
static void moe_paths(const char *preset, int gpus0) {
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    const int V = cfg.vocab_size;
    static const struct {
        int C, P, steps;
        const char *env;
    } cases[2] = {{4, 16, 6, "loop"}, {32, 6, 2, "host"}};
    /* a value the model does not know is refused, not taken for unset */
    char err[KVD_ERR_LEN];
    kvd_kvcache kv;
    if (kvd_kvcache_init(&kv, KVD_KV_BF16, kvd_config_n_full(&cfg), cfg.num_key_value_heads,
                         cfg.head_dim, 16, 64, NULL, 1, err) == 0) {
        setenv("KVD_CUDA_MOE", "grouped", 1);
        kvd_cuda_model *md = kvd_cuda_model_new_tp(&w, &kv, 16, 1, gpus0, err);
        unsetenv("KVD_CUDA_MOE");
        CHECK(!md && strstr(err, "KVD_CUDA_MOE=grouped: expected 'host' or 'loop'"),
              "%s: KVD_CUDA_MOE=grouped %s (%s)\n", preset, md ? "accepted" : "refused", err);
        kvd_cuda_model_free(md);
        kvd_kvcache_free(&kv);
    }
    for (int gpus = gpus0; gpus <= 2; gpus++)
        for (int ci = 0; ci < 2; ci++) {
            const int C = cases[ci].C, n = C * cases[ci].steps;
            float *lg[2] = {malloc(sizeof(float) * n * V), malloc(sizeof(float) * n * V)};
            unsigned long long launched[2] = {0, 0};
            moe_rows rows = {cfg.num_experts, cfg.num_experts_per_tok, 0};
            int rc = moe_run(preset, &w, gpus, NULL, C, cases[ci].P, cases[ci].steps, lg[0],
                             &launched[0], ci ? &rows : NULL);
            if (!rc)
                rc = moe_run(preset, &w, gpus, cases[ci].env, C, cases[ci].P, cases[ci].steps,
                             lg[1], &launched[1], NULL);
            if (!rc) {
                const int same = !memcmp(lg[0], lg[1], sizeof(float) * n * V);
                CHECK(same,
                      "%s, %d GPU(s), C %d: the experts' decode logits differ with "
                      "KVD_CUDA_MOE=%s\n",
                      preset, gpus, C, cases[ci].env);
                if (ci)
                    CHECK(rows.most > 0 && rows.most <= C, "%s: an expert had %d rows\n", preset,
                          rows.most);
                if (same) {
                    printf("%-6s %d GPU%s, C %2d: decode logits identical with KVD_CUDA_MOE unset "
                           "and %s",
                           preset, gpus, gpus > 1 ? "s" : " ", C, cases[ci].env);
                    if (ci) printf(" (the most rows an expert had: %d)", rows.most);
                    printf("\n");
                }
                if (launched[1] && !ci)
                    printf("%-6s %d GPU%s, C %2d: kernel launches a decode step: %.0f, %.0f "
                           "with KVD_CUDA_MOE=%s (%.2fx)\n",
                           preset, gpus, gpus > 1 ? "s" : " ", C,
                           launched[0] / (double)cases[ci].steps,
                           launched[1] / (double)cases[ci].steps, cases[ci].env,
                           (double)launched[1] / launched[0]);
            }
            free(lg[0]), free(lg[1]);
            if (rc == -2) break;
        }
    kvd_weights_free(&w);
}

/* the simulator's count of cuBLASLt products by algorithm id (absent on a
 * GPU); id 2 is the one tuning picks there */
extern unsigned long long kvd_simt_lt_calls(int id) __attribute__((weak));

/* The model with cuBLASLt's algorithms tuned (KVD_CUDA_GEMM=tune): decode
 * steps of 20 sequences (60 rows a projection, through cuBLASLt) give the
 * untuned logits within the tolerance the CPU's are held to (bit for bit
 * in the simulator, whose algorithms compute alike), and a second tuned
 * model in the process tunes nothing more and gives the first's logits bit
 * for bit, so the drift run's two models compute alike. On one GPU and
 * over two. */
static void gemm_tuned(const char *preset, int gpus0) {
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    const int V = cfg.vocab_size, C = 20, P = 4, steps = 2, n = C * steps;
    float *lg[3];
    for (int i = 0; i < 3; i++) lg[i] = malloc(sizeof(float) * n * V);
    for (int gpus = gpus0; gpus <= 2; gpus++) {
        unsigned long long launched, id2 = kvd_simt_lt_calls ? kvd_simt_lt_calls(2) : 0;
        int rc = 0, tuned[3] = {0, 0, 0};
        for (int i = 0; i < 3 && !rc; i++) {
            kvd_cuda_gemm_set_tune(i > 0);
            rc = moe_run(preset, &w, gpus, NULL, C, P, steps, lg[i], &launched, NULL);
            for (int r = 0; r < gpus && !rc; r++) {
                kvd_cuda_set_device(r);
                tuned[i] += kvd_cuda_gemm_tuned();
            }
            kvd_cuda_set_device(0);
        }
        kvd_cuda_gemm_set_tune(-1);
        if (rc == -2) break;
        if (rc) continue;
#if defined(KVD_DEVICE_EMULATED)
        const int tunes = 0; /* the emulation's products are the CPU's */
#else
        const int tunes = 1;
        CHECK(tuned[1] > tuned[0], "%s, %d GPU(s): the tuned model tuned no shape\n", preset, gpus);
#endif
        CHECK(tuned[2] == tuned[1], "%s, %d GPU(s): a second tuned model tuned %d more shapes\n",
              preset, gpus, tuned[2] - tuned[1]);
        CHECK(!memcmp(lg[2], lg[1], sizeof(float) * n * V),
              "%s, %d GPU(s): two tuned models' decode logits differ\n", preset, gpus);
        /* on a GPU only the first step: a greedy token may flip after it */
        const size_t cmp = kvd_simt_lt_calls ? (size_t)n * V : (size_t)C * V;
        const double e = rel_l2(lg[1], lg[0], cmp);
        if (kvd_simt_lt_calls) {
            CHECK(e == 0, "%s, %d GPU(s): tuned logits differ in the simulator (rel L2 %g)\n",
                  preset, gpus, e);
            CHECK(kvd_simt_lt_calls(2) > id2,
                  "%s, %d GPU(s): no product ran the simulator's fastest algorithm\n", preset,
                  gpus);
        } else
            CHECK(e < 1e-4, "%s, %d GPU(s): tuned logits rel L2 %g from the untuned\n", preset,
                  gpus, e);
        printf("%-6s %d GPU%s, C %2d: KVD_CUDA_GEMM=tune, %d shapes tuned: decode logits rel L2 "
               "%.1e from the heuristic's first choice; a second tuned model the same bit for "
               "bit%s\n",
               preset, gpus, gpus > 1 ? "s" : " ", C, tunes ? tuned[1] - tuned[0] : 0, e,
               tunes ? "" : " (emulated: nothing to tune)");
    }
    for (int i = 0; i < 3; i++) free(lg[i]);
    kvd_weights_free(&w);
}

/* Greedy decoding on the device (kvd_cuda_forward_greedy) against the
 * argmax of the logits kvd_cuda_forward copies back, step for step, on
 * two models of the same weights: a prefill of three sequences in one step
 * (each one's last row), then decode steps of all three, on one GPU (from
 * gpus0) and split over two. */
static void greedy_steps(const char *preset, int gpus0) {
    char err[KVD_ERR_LEN];
    kvd_config cfg;
    kvd_weights w;
    if (preset_weights(preset, &cfg, &w)) return;
    const int V = cfg.vocab_size, nf = kvd_config_n_full(&cfg);
    for (int gpus = gpus0; gpus <= 2; gpus++) {
        kvd_kvcache kv[2];
        memset(kv, 0, sizeof kv);
        kvd_cuda_model *md[2] = {NULL, NULL};
        int ok = 1;
        for (int i = 0; i < 2; i++) {
            if (kvd_kvcache_init(&kv[i], KVD_KV_FP8_UNSCALED, nf, cfg.num_key_value_heads,
                                 cfg.head_dim, 16, 4096, NULL, 1, err)) {
                CHECK(0, "%s: %s\n", preset, err);
                ok = 0;
                continue;
            }
            md[i] = kvd_cuda_model_new_tp(&w, &kv[i], MAX_ROWS, 4, gpus, err);
            if (!md[i] && !strstr(err, "CUDA devices visible")) CHECK(0, "%s: %s\n", preset, err);
            ok = ok && md[i];
        }
        float *lg = malloc(sizeof(float) * 3 * V);
        int seqs[3], lens[3] = {30, 1, 17}, ones[3] = {1, 1, 1}, agree = 0, steps = 0;
        int32_t tok[48], want[3], got[3];
        tokens(77, 48, V, tok);
        for (int i = 0; ok && i < 2; i++)
            for (int s = 0; s < 3; s++) seqs[s] = kvd_kvcache_add_seq(&kv[i]);
        /* the greedy model's steps profiled, which must not change them */
        double wall = 0, ph[KVD_PHASES], sum = 0;
        if (ok) kvd_cuda_model_profile(md[1], 1);
        for (int step = 0; ok && step < 7; step++) {
            kvd_batch b = {3, seqs, step ? ones : lens, step ? want : tok};
            ok = kvd_cuda_forward(md[0], &kv[0], &b, lg, 1, err) == 0;
            const double t0 = kvd_now();
            ok = ok && kvd_cuda_forward_greedy(md[1], &kv[1], &b, got, err) == 0;
            wall += kvd_now() - t0;
            CHECK(ok, "%s greedy (%d GPUs): %s\n", preset, gpus, err);
            for (int s = 0; ok && s < 3; s++) {
                want[s] = kvd_argmax(lg + (size_t)s * V, V);
                agree += got[s] == want[s];
                steps++;
            }
        }
        if (ok) {
            CHECK(agree == steps,
                  "%s, %d GPU(s): greedy tokens on the device: %d of %d the logits' argmax\n",
                  preset, gpus, agree, steps);
            printf("%-6s %d GPU%s: greedy tokens on the device, %d of %d the logits' argmax\n",
                   preset, gpus, gpus > 1 ? "s" : " ", agree, steps);
            /* every phase ran, and together they are the steps' time */
            kvd_cuda_model_phases(md[1], ph);
            kvd_cuda_model_profile(md[1], 0);
            for (int p = 0; p < KVD_PHASES; p++) {
                sum += ph[p];
                CHECK(ph[p] >= 0 && (p == KVD_PHASE_STAGE || p == KVD_PHASE_SETTLE || ph[p] > 0),
                      "%s, %d GPU(s): profiled phase %s took %g s\n", preset, gpus,
                      kvd_cuda_phase_names[p], ph[p]);
            }
            CHECK(sum <= wall && sum >= 0.5 * wall,
                  "%s, %d GPU(s): the phases add up to %g s of the steps' %g s\n", preset, gpus,
                  sum, wall);
            printf("%-6s %d GPU%s: 7 profiled steps, %.0f%% of their time in phases:", preset, gpus,
                   gpus > 1 ? "s" : " ", 100 * sum / wall);
            for (int p = 0; p < KVD_PHASES; p++)
                printf(" %s %.0f%%", kvd_cuda_phase_names[p], 100 * ph[p] / sum);
            printf("\n");
        }
        free(lg);
        for (int i = 0; i < 2; i++) {
            kvd_cuda_model_free(md[i]);
            kvd_kvcache_free(&kv[i]);
        }
    }
    kvd_weights_free(&w);
}

int main(void) {
    char why[256];
    if (!kvd_cuda_available(why, sizeof why)) {
        printf("SKIP: %s: the device model test needs a GPU\n", why);
        return 77;
    }
    /* KVD_TEST_PRESETS=tiny limits the run (the emulated and simulated
     * builds in CI); KVD_TEST_CASES=quick to one GPU and a split over two
     * (the simulator under the sanitizers) */
    const char *only = getenv("KVD_TEST_PRESETS"), *cases = getenv("KVD_TEST_CASES");
    const int quick = cases && !strcmp(cases, "quick");
    const char *presets[2] = {"tiny", "small"};
    for (int p = 0; p < 2; p++) {
        if (only && !strstr(only, presets[p])) continue;
        kvd_kv_scales cal = {0};
        /* quick: the split over two GPUs alone, which runs every path one
         * GPU does */
        moe_paths(presets[p], quick ? 2 : 1);
        gemm_tuned(presets[p], quick ? 2 : 1);
        greedy_steps(presets[p], quick ? 2 : 1);
        run(presets[p], KVD_KV_BF16, NULL, &cal, 1);
        if (quick) {
            run(presets[p], KVD_KV_FP8_CAL, &cal, NULL, 2);
            kvd_kv_scales_free(&cal);
            continue;
        }
        run(presets[p], KVD_KV_FP8_CAL, &cal, NULL, 1);
        run(presets[p], KVD_KV_FP8_UNSCALED, NULL, NULL, 1);
        /* NVFP4: the same cache bytes through the whole model, then split */
        run(presets[p], KVD_KV_NVFP4_CAL, &cal, NULL, 1);
        run(presets[p], KVD_KV_NVFP4_UNSCALED, NULL, NULL, 2);
        /* fp8-token: each row's own scale, made on the device as on the CPU */
        run(presets[p], KVD_KV_FP8_TOKEN, NULL, NULL, 1);
        run(presets[p], KVD_KV_FP8_TOKEN, NULL, NULL, 2);
        run(presets[p], KVD_KV_INT8_TOKEN, NULL, NULL, 1);
        run(presets[p], KVD_KV_INT8_TOKEN_RN, NULL, NULL, 2);
        /* int4-token: rotated rows, the query and output rotated around
         * the FP32-core kernels */
        run(presets[p], KVD_KV_INT4_TOKEN, NULL, NULL, 1);
        run(presets[p], KVD_KV_INT4_TOKEN, NULL, NULL, 2);
        /* tensor parallel: every head count splits in 2; small's 2 KV heads
         * over 4 GPUs are each held twice */
        run(presets[p], KVD_KV_BF16, NULL, NULL, 2);
        run(presets[p], KVD_KV_FP8_CAL, &cal, NULL, 2);
        if (p == 1) run(presets[p], KVD_KV_FP8_CAL, &cal, NULL, 4);
        drift_figures(presets[p], KVD_KV_BF16, NULL, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_FP8_CAL, &cal, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_FP8_UNSCALED, NULL, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_FP8_UNSCALED, NULL, 2, 0, 0);
        drift_figures(presets[p], KVD_KV_NVFP4_CAL, &cal, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_FP8_TOKEN, NULL, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_INT8_TOKEN, NULL, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_INT4_TOKEN, NULL, 1, 0, 0);
        drift_figures(presets[p], KVD_KV_INT4_TOKEN, NULL, 2, 0, 1);
        /* FP8 attention (FlashAttention 3's rule): calibrated query scales,
         * then 1.0 split over two GPUs */
        drift_figures(presets[p], KVD_KV_FP8_CAL, &cal, 1, 1, 0);
        drift_figures(presets[p], KVD_KV_FP8_UNSCALED, NULL, 2, 1, 0);
        /* the isolated view taken on the reference's side, as one mode at a
         * time has it, against the CPU's candidate-side view; then several
         * modes against one reference run */
        drift_figures(presets[p], KVD_KV_FP8_UNSCALED, NULL, 2, 1, 1);
        drift_group(presets[p], &cal, 2);
#ifndef KVD_DEVICE_SIMT /* the simulator's kernels: the split over two runs every path */
        drift_figures(presets[p], KVD_KV_FP8_CAL, &cal, 1, 0, 1);
        drift_group(presets[p], &cal, 1);
        drift_drop_out(presets[p], 1);
#endif
        kvd_kv_scales_free(&cal);
    }
    lazy_weights();
    refusals();
    nonfinite_caught();
    memory_returned();
    printf("cuda model: %d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
