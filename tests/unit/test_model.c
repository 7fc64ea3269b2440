/* kvdrift: model tests on the tiny preset: synthetic weights are a pure
 * function of (seed, name) whatever the thread count; prefill, token-by-token
 * decode and batched decode agree; NaN is caught with layer and position;
 * the sink and retrieval knobs do what they say; calibration recipes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../datasets/tokens.h"
#include "../../runners/calibrate.h"
#include "../../runners/drift.h"
#include "../../kernels/kernels.h"
#include "../../runners/model.h"

static kvd_weights W;
static kvd_config C;

static int setup(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_synth s;
    kvd_synth_defaults(&s);
    if (kvd_config_preset("tiny", &C, err)) return -1;
    return kvd_weights_synth(&W, &C, &s, err);
}

static int teardown(void **st) {
    (void)st;
    kvd_weights_free(&W);
    return 0;
}

static void weights_pure(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_synth s;
    kvd_synth_defaults(&s);
    kvd_weights a, b;
    omp_set_num_threads(1);
    assert_int_equal(kvd_weights_synth(&a, &C, &s, err), 0);
    omp_set_num_threads(2);
    s.seed = 99;
    assert_int_equal(kvd_weights_synth(&b, &C, &s, err), 0);
    assert_int_equal(a.n_tensors, W.n_tensors);
    int differ = 0;
    for (int i = 0; i < a.n_tensors; i++) {
        const kvd_tensor *t = &a.tensors[i];
        assert_string_equal(t->name, W.tensors[i].name);
        assert_memory_equal(t->data, W.tensors[i].data, (size_t)t->numel * sizeof(float));
        differ += memcmp(t->data, b.tensors[i].data, (size_t)t->numel * sizeof(float)) != 0;
        for (int64_t j = 0; j < t->numel; j++)
            assert_true(t->data[j] == kvd_bf16_to_f32(kvd_f32_to_bf16(t->data[j])));
    }
    assert_true(differ > a.n_tensors / 2); /* another seed, another model */
    assert_non_null(kvd_weights_find(&a, "model.layers.3.self_attn.q_proj.weight"));
    assert_non_null(kvd_weights_find(&a, "model.layers.0.linear_attn.in_proj_qkvz.weight"));
    assert_non_null(kvd_weights_find(&a, "model.layers.7.mlp.experts.7.down_proj.weight"));
    assert_null(kvd_weights_find(&a, "model.layers.0.self_attn.q_proj.weight"));
    kvd_weights_free(&a);
    kvd_weights_free(&b);
}

/* uniform_draws (the throughput benchmarks' quick weights): a bulk tensor
 * drawn uniform within +-sqrt(3) std, of the normal draws' deviation, the
 * same for the same seed on 1 thread and 2; the tensors made by rule (the
 * embedding's sink channels) keep their rule */
static void weights_uniform_draws(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    kvd_synth s;
    kvd_synth_defaults(&s);
    s.uniform_draws = 1;
    kvd_weights u[2];
    for (int i = 0; i < 2; i++) {
        omp_set_num_threads(1 + i);
        assert_int_equal(kvd_weights_synth(&u[i], &C, &s, err), 0);
    }
    const char *name = "model.layers.7.mlp.experts.7.down_proj.weight";
    const kvd_tensor *tn = kvd_weights_find(&W, name), *tu = kvd_weights_find(&u[0], name);
    assert_non_null(tn);
    assert_non_null(tu);
    /* fill's deviation for the down projections */
    const double std = 0.7 / sqrt((double)tn->shape[1]);
    double sn = 0, su = 0, mu = 0, top = 0;
    for (int64_t j = 0; j < tu->numel; j++) {
        sn += (double)tn->data[j] * tn->data[j], su += (double)tu->data[j] * tu->data[j];
        mu += tu->data[j], top = fmax(top, fabs(tu->data[j]));
    }
    sn = sqrt(sn / tn->numel), su = sqrt(su / tu->numel), mu /= tu->numel;
    fprintf(stderr, "uniform draws: std %.5f (normal %.5f, asked %.5f), mean %.2e, max %.5f\n", su,
            sn, std, mu, top);
    assert_true(fabs(su / std - 1) < 0.03 && fabs(sn / std - 1) < 0.03);
    assert_true(fabs(mu) < 0.03 * std);
    /* within the uniform's bound (BF16 rounding may pass it by 2^-8), and
     * near it, where normal draws pass it in 8% of the values */
    assert_true(top <= sqrt(3.0) * std * (1 + 1.0 / 256) && top > 0.99 * sqrt(3.0) * std);
    assert_memory_not_equal(tu->data, tn->data, sizeof(float) * (size_t)tu->numel);
    const kvd_tensor *eu = kvd_weights_find(&u[0], "model.embed_tokens.weight"),
                     *en = kvd_weights_find(&W, "model.embed_tokens.weight");
    assert_true(eu->data[0] == en->data[0] && eu->data[1] == en->data[1]);
    for (int i = 0; i < u[0].n_tensors; i++)
        assert_memory_equal(u[0].tensors[i].data, u[1].tensors[i].data,
                            sizeof(float) * (size_t)u[0].tensors[i].numel);
    kvd_weights_free(&u[0]);
    kvd_weights_free(&u[1]);
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef struct {
    kvd_kvcache kv;
    kvd_model *m;
} runner;

static void runner_init(runner *r, kvd_kv_mode mode, int cap, int max_rows, int seqs,
                        const kvd_kv_scales *sc) {
    char err[KVD_ERR_LEN];
    assert_int_equal(kvd_kvcache_init(&r->kv, mode, kvd_config_n_full(&C), C.num_key_value_heads,
                                      C.head_dim, 16, cap, sc, 1, err),
                     0);
    r->m = kvd_model_new(&W, max_rows, seqs, err);
    assert_non_null(r->m);
}

static void runner_free(runner *r) {
    kvd_model_free(r->m);
    kvd_kvcache_free(&r->kv);
}

static void prefill_decode_batch(void **st) {
    (void)st;
    enum { T = 96, V = 512 };
    char err[KVD_ERR_LEN];
    int32_t tok[3][T];
    for (int s = 0; s < 3; s++) kvd_tokens_synth(10 + (uint64_t)s, T, C.vocab_size, tok[s]);
    float *pre = malloc(sizeof(float) * T * V), *dec = malloc(sizeof(float) * T * V);

    /* prefill in one step (and in chunks of 40) against one token at a time */
    runner a, b, c2;
    runner_init(&a, KVD_KV_BF16, T, T, 1, NULL);
    runner_init(&b, KVD_KV_BF16, T, 1, 1, NULL);
    runner_init(&c2, KVD_KV_BF16, T, 40, 1, NULL);
    int sa = kvd_kvcache_add_seq(&a.kv), sb = kvd_kvcache_add_seq(&b.kv),
        sc = kvd_kvcache_add_seq(&c2.kv);
    assert_int_equal(kvd_prefill(a.m, &a.kv, sa, tok[0], T, pre, 1, err), 0);
    assert_int_equal(kvd_prefill(b.m, &b.kv, sb, tok[0], T, dec, 1, err), 0);
    /* sgemm (many rows) and sgemv (one row) sum in different orders; a 1e-7
     * difference can flip a BF16 rounding of K or V in the cache, which the
     * layers above carry: 1e-4 relative bounds that, a real bug is >= 1e-2 */
    assert_true(rel_l2(dec, pre, (size_t)T * V) < 1e-4);
    assert_int_equal(kvd_prefill(c2.m, &c2.kv, sc, tok[0], T, dec, 1, err), 0);
    assert_true(rel_l2(dec, pre, (size_t)T * V) < 1e-4);
    runner_free(&a);
    runner_free(&b);
    runner_free(&c2);

    /* three sequences of different lengths decoding as one batch against
     * each alone: rows of a batch must not see each other */
    float alone[3][V], batched[3 * V];
    int lens[3] = {20, 57, 33};
    runner r;
    runner_init(&r, KVD_KV_BF16, 3 * T, T, 3, NULL);
    for (int s = 0; s < 3; s++) {
        runner one;
        runner_init(&one, KVD_KV_BF16, T, T, 1, NULL);
        int id = kvd_kvcache_add_seq(&one.kv);
        assert_int_equal(kvd_prefill(one.m, &one.kv, id, tok[s], lens[s] + 1, NULL, 0, err), 0);
        int rs = kvd_kvcache_add_seq(&r.kv);
        assert_int_equal(rs, s);
        assert_int_equal(kvd_prefill(r.m, &r.kv, rs, tok[s], lens[s], NULL, 0, err), 0);
        /* the last token alone, through the same decode path */
        runner_free(&one);
        runner_init(&one, KVD_KV_BF16, T, T, 1, NULL);
        id = kvd_kvcache_add_seq(&one.kv);
        assert_int_equal(kvd_prefill(one.m, &one.kv, id, tok[s], lens[s], NULL, 0, err), 0);
        int nt = 1;
        kvd_batch b1 = {1, &id, &nt, &tok[s][lens[s]]};
        assert_int_equal(kvd_forward(one.m, &one.kv, &b1, alone[s], 1, err), 0);
        runner_free(&one);
    }
    int seqs[3] = {0, 1, 2}, nts[3] = {1, 1, 1};
    int32_t last[3] = {tok[0][20], tok[1][57], tok[2][33]};
    kvd_batch bb = {3, seqs, nts, last};
    assert_int_equal(kvd_forward(r.m, &r.kv, &bb, batched, 1, err), 0);
    for (int s = 0; s < 3; s++) assert_true(rel_l2(batched + s * V, alone[s], V) < 1e-4);
    runner_free(&r);
    free(pre);
    free(dec);
}

/* Same bytes on 1 and 2 threads: GEMMs split in fixed chunks and attention
 * in parts set by the context length. 2100 tokens: the last rows and the
 * decode step attend in two merged parts. */
static void thread_count_invariance(void **st) {
    (void)st;
    enum { T = 2100, V = 512 };
    char err[KVD_ERR_LEN];
    int32_t *tok = malloc(sizeof(int32_t) * (T + 1));
    kvd_tokens_synth(5, T + 1, C.vocab_size, tok);
    float *a = malloc(sizeof(float) * T * V), *b = malloc(sizeof(float) * T * V);
    float da[V], db[V];
    for (int i = 0; i < 2; i++) {
        omp_set_num_threads(i ? 2 : 1);
        runner r;
        runner_init(&r, KVD_KV_FP8_UNSCALED, T + 1, 512, 1, NULL);
        int s = kvd_kvcache_add_seq(&r.kv), one = 1;
        assert_int_equal(kvd_prefill(r.m, &r.kv, s, tok, T, i ? b : a, 1, err), 0);
        kvd_batch bt = {1, &s, &one, tok + T};
        assert_int_equal(kvd_forward(r.m, &r.kv, &bt, i ? db : da, 1, err), 0);
        runner_free(&r);
    }
    assert_memory_equal(a, b, sizeof(float) * T * V);
    assert_memory_equal(da, db, sizeof da);
    free(a);
    free(b);
    free(tok);
}

static void nan_is_caught(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    int32_t tok[16];
    runner r;
    int s;
    /* poison one embedding row: the token at position p. The DeltaNet layer
     * carries it to every later position, so the first is the one named,
     * in either half of the rows the threads share (16: the check's
     * parallel path) */
    const kvd_tensor *e = kvd_weights_find(&W, "model.embed_tokens.weight");
    const int poisoned[] = {9, 3};
    for (int i = 0; i < 2; i++) {
        const int p = poisoned[i];
        kvd_tokens_synth(3, 16, C.vocab_size, tok);
        tok[p] = 77;
        for (int j = 0; j < 16; j++)
            if (j != p && tok[j] == 77) tok[j] = 78;
        float saved = e->data[77 * C.hidden_size + 5];
        e->data[77 * C.hidden_size + 5] = NAN;
        runner_init(&r, KVD_KV_BF16, 16, 16, 1, NULL);
        s = kvd_kvcache_add_seq(&r.kv);
        assert_int_equal(kvd_prefill(r.m, &r.kv, s, tok, 16, NULL, 0, err), -1);
        e->data[77 * C.hidden_size + 5] = saved;
        char want[32];
        snprintf(want, sizeof want, "position %d,", p);
        assert_non_null(strstr(err, "non-finite activation"));
        assert_non_null(strstr(err, "layer 0 (linear_attention)"));
        assert_non_null(strstr(err, want));
        runner_free(&r);
    }
    /* a token id outside the vocabulary is refused, not read out of bounds */
    runner_init(&r, KVD_KV_BF16, 16, 16, 1, NULL);
    s = kvd_kvcache_add_seq(&r.kv);
    kvd_tokens_synth(3, 16, C.vocab_size, tok);
    tok[3] = 512;
    assert_int_equal(kvd_prefill(r.m, &r.kv, s, tok, 16, NULL, 0, err), -1);
    assert_non_null(strstr(err, "token id 512 at sequence 0 position 3, expected 0..511"));
    /* one sequence twice in a step would write its cache twice at one position */
    int two[2] = {s, s}, ones[2] = {1, 1};
    kvd_batch dup = {2, two, ones, tok};
    assert_int_equal(kvd_forward(r.m, &r.kv, &dup, NULL, 0, err), -1);
    assert_non_null(strstr(err, "sequence 0 appears twice in one step"));
    runner_free(&r);
}

/* attention statistics from the hook: mass on the sink, and on earlier
 * positions holding the query's own token (retrieval) */
typedef struct {
    const int32_t *tok;
    int heads;
    double sink[16], same[16];
    int n;
} attn_stats;

static void on_attn(void *ctx, int al, int seq, int pos, int n_ctx, const float *p,
                    const float *out, const float *sp, const float *so) {
    (void)seq, (void)out, (void)sp, (void)so;
    attn_stats *a = ctx;
    if (al != 0 || pos < 64) return;
    int have_same = 0;
    for (int t = 1; t < pos; t++) have_same |= a->tok[t] == a->tok[pos];
    if (!have_same) return;
    for (int h = 0; h < a->heads; h++) {
        a->sink[h] += p[h * n_ctx + 0];
        for (int t = 1; t < pos; t++)
            if (a->tok[t] == a->tok[pos]) a->same[h] += p[h * n_ctx + t];
    }
    a->n++;
}

static void sink_and_retrieval(void **st) {
    (void)st;
    enum { T = 256 };
    char err[KVD_ERR_LEN];
    int32_t tok[T];
    kvd_tokens_synth(8, T, C.vocab_size, tok);
    attn_stats a = {tok, C.num_attention_heads, {0}, {0}, 0};
    runner r;
    runner_init(&r, KVD_KV_BF16, T, 64, 1, NULL);
    kvd_hooks h = {.ctx = &a, .attn = on_attn};
    kvd_model_set_hooks(r.m, &h);
    int s = kvd_kvcache_add_seq(&r.kv);
    assert_int_equal(kvd_prefill(r.m, &r.kv, s, tok, T, NULL, 0, err), 0);
    runner_free(&r);
    assert_true(a.n > 20);
    int grp = C.num_attention_heads / C.num_key_value_heads;
    for (int hq = 0; hq < C.num_attention_heads; hq++) {
        double sink = a.sink[hq] / a.n, same = a.same[hq] / a.n;
        /* uniform attention over >= 64 positions would give the sink < 1/64;
         * the retrieval head of each group spends its mass on copies instead */
        if (hq % grp == 0) {
            assert_true(sink > 2.0 / 64);
            assert_true(same > 2.0 * a.same[hq + 1] / a.n);
        } else {
            assert_true(sink > 8.0 / 64);
        }
    }
}

static void calibration(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    enum { T = 200 };
    int32_t tok[T];
    kvd_tokens_synth(4, T, C.vocab_size, tok);
    kvd_kv_scales s[KVD_CAL_N], am[KVD_CAL_N];
    for (int r = 0; r < KVD_CAL_N; r++)
        assert_int_equal(kvd_calibrate(&kvd_backend_cpu, &W, tok, T, (kvd_cal_recipe)r, r == 0,
                                       &s[r], &am[r], err),
                         0);
    int nf = kvd_config_n_full(&C), kvh = C.num_key_value_heads;
    for (int i = 0; i < nf * kvh; i++) {
        /* per-head absmax never exceeds the per-layer one used by the others */
        assert_true(am[0].k[i] <= am[1].k[i] && am[0].v[i] <= am[1].v[i]);
        assert_true(s[0].k[i] == am[0].k[i] / 448.0f);
        assert_true(s[0].v[i] == am[0].v[i] / 448.0f);
        assert_true(s[1].k[i] == fmaxf(am[1].k[i] / 448.0f, 1.0f));
        assert_true(s[1].v[i] == 1.0f); /* V absmax is far below 448 */
        assert_true(s[2].k[i] == am[2].k[i] / 200.0f);
        assert_true(s[2].v[i] == am[2].v[i] / 100.0f);
    }
    /* the query's scales (FP8 attention), per query head, by the K rule */
    const int nh = C.num_attention_heads, G = nh / kvh;
    for (int r = 0; r < KVD_CAL_N; r++) assert_true(s[r].q && am[r].q && s[r].n_heads == nh);
    for (int l = 0; l < nf; l++) {
        float lq = 0.0f;
        for (int h = 0; h < nh; h++) lq = fmaxf(lq, am[0].q[l * nh + h]);
        for (int h = 0; h < nh; h++) {
            const int i = l * nh + h;
            assert_true(am[0].q[i] > 0.0f && am[1].q[i] == lq && am[2].q[i] == lq);
            assert_true(s[0].q[i] == am[0].q[i] / 448.0f);
            assert_true(s[1].q[i] == fmaxf(lq / 448.0f, 1.0f));
            assert_true(s[2].q[i] == lq / 200.0f);
        }
        /* a query head's absmax is no K head's: the heads differ */
        assert_true(am[0].q[l * nh] != am[0].q[l * nh + G] ||
                    am[0].q[l * nh] != am[0].q[l * nh + 1]);
    }
    /* the scales file round-trips every float exactly */
    char path[] = "/tmp/kvd_scales_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(kvd_scales_save(path, &s[0], &am[0], KVD_CAL_ABSMAX, "tiny", T, 4, err), 0);
    kvd_kv_scales back;
    assert_int_equal(kvd_scales_load(path, &back, nf, kvh, W.cfg.num_attention_heads, err), 0);
    assert_memory_equal(back.k, s[0].k, sizeof(float) * (size_t)(nf * kvh));
    assert_memory_equal(back.v, s[0].v, sizeof(float) * (size_t)(nf * kvh));
    assert_true(back.q && back.n_heads == nh);
    assert_memory_equal(back.q, s[0].q, sizeof(float) * (size_t)(nf * nh));
    assert_int_equal(back.per_head, 1);
    kvd_kv_scales_free(&back);
    assert_int_equal(kvd_scales_load(path, &back, nf + 1, kvh, W.cfg.num_attention_heads, err), -1);
    assert_non_null(strstr(err, "expected 3 entries"));
    unlink(path);
    for (int r = 0; r < KVD_CAL_N; r++) {
        kvd_kv_scales_free(&s[r]);
        kvd_kv_scales_free(&am[r]);
    }
}

/* The chunked delta rule (the CUDA prefill's twin) against the token-by-token
 * recurrence over 300 tokens (four full chunks and a partial one), with the
 * model's regime: L2-normalised q (scaled by dk^-0.5) and k, decays from
 * e^-0.01 to e^-2, beta in (0, 1), a state carried in from earlier tokens. */
static void gdn_chunked_matches_recurrence(void **st) {
    (void)st;
    enum { N = 300, DK = 128, DV = 96 };
    uint64_t key = kvd_rng_key(3, "test.gdn");
    float *q = malloc(sizeof(float) * N * DK), *k = malloc(sizeof(float) * N * DK),
          *v = malloc(sizeof(float) * N * DV), *o1 = malloc(sizeof(float) * N * DV),
          *o2 = malloc(sizeof(float) * N * DV), g[N], beta[N];
    float *S1 = malloc(sizeof(float) * DK * DV), *S2 = malloc(sizeof(float) * DK * DV);
    for (int t = 0; t < N; t++) {
        double nq = 0, nk = 0;
        for (int i = 0; i < DK; i++) {
            q[t * DK + i] = kvd_rng_normal(key, (uint64_t)(t * DK + i));
            k[t * DK + i] = kvd_rng_normal(key, (uint64_t)(t * DK + i) + 1000000);
            nq += (double)q[t * DK + i] * q[t * DK + i],
                nk += (double)k[t * DK + i] * k[t * DK + i];
        }
        for (int i = 0; i < DK; i++) {
            q[t * DK + i] *= (float)(1.0 / sqrt(nq) / sqrt((double)DK));
            k[t * DK + i] *= (float)(1.0 / sqrt(nk));
        }
        for (int j = 0; j < DV; j++)
            v[t * DV + j] = kvd_rng_normal(key, (uint64_t)(t * DV + j) + 2000000);
        g[t] = -0.01f - 2.0f * kvd_rng_uniform(key, (uint64_t)t + 3000000);
        beta[t] = kvd_rng_uniform(key, (uint64_t)t + 4000000);
    }
    for (int i = 0; i < DK * DV; i++)
        S1[i] = S2[i] = 0.3f * kvd_rng_normal(key, (uint64_t)i + 5000000);
    for (int t = 0; t < N; t++)
        kvd_gdn_step(S1, q + t * DK, k + t * DK, v + t * DV, g[t], beta[t], o1 + t * DV, DK, DV);
    kvd_gdn_chunked(S2, q, k, v, g, beta, o2, N, DK, DV, DK, DK, DV, DV);
    double on = 0, od = 0, sn = 0, sd = 0;
    for (int i = 0; i < N * DV; i++) {
        double e = (double)o2[i] - o1[i];
        on += e * e, od += (double)o1[i] * o1[i];
    }
    for (int i = 0; i < DK * DV; i++) {
        double e = (double)S2[i] - S1[i];
        sn += e * e, sd += (double)S1[i] * S1[i];
    }
    fprintf(stderr, "gdn chunked: out %g state %g\n", sqrt(on / od), sqrt(sn / sd));
    /* rounding only (~1e-7); a wrong term in the algebra gives O(1e-2) or more */
    assert_true(sqrt(on / od) < 2e-6);
    assert_true(sqrt(sn / sd) < 2e-6);
    free(q), free(k), free(v), free(o1), free(o2), free(S1), free(S2);
}

/* kvd_gdn_steps (the model's: each slice of S through every token) gives
 * the bits of kvd_gdn_step token by token, on the model's strided layout
 * (q, k, v in one row per token, g and beta interleaved over heads), at
 * widths of 64-column slices, 16-column ones and a scalar tail. */
static void gdn_steps_match_step(void **st) {
    (void)st;
    static const int shapes[][2] = {{128, 128}, {128, 96}, {32, 20}, {16, 8}, {64, 200}};
    static const int lens[] = {1, 7, 70};
    enum { NV = 3 }; /* heads interleaved in g and beta */
    uint64_t key = kvd_rng_key(5, "test.gdn_steps");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int dk = shapes[si][0], dv = shapes[si][1], n = lens[li];
            const size_t row = (size_t)(2 * dk + dv + 5), sz = (size_t)dk * dv;
            float *x = malloc(sizeof(float) * row * (size_t)n);
            float *gb = malloc(sizeof(float) * 2 * NV * (size_t)n);
            float *o1 = malloc(sizeof(float) * (size_t)dv * n), *o2 = calloc((size_t)dv * n, 4);
            float *S1 = malloc(sizeof(float) * sz), *S2 = malloc(sizeof(float) * sz);
            for (size_t i = 0; i < row * (size_t)n; i++)
                x[i] = 0.3f * kvd_rng_normal(key, i + 1000000 * si);
            for (int i = 0; i < 2 * NV * n; i++)
                gb[i] = i % 2 ? kvd_rng_uniform(key, (uint64_t)i + 7000000)
                              : -0.01f - 2.0f * kvd_rng_uniform(key, (uint64_t)i + 8000000);
            for (size_t i = 0; i < sz; i++) S1[i] = S2[i] = kvd_rng_normal(key, i + 9000000);
            /* head 1 of NV: g at gb[2 * (t * NV + 1)], beta one float on */
            const float *g = gb + 2, *beta = gb + 3;
            for (int t = 0; t < n; t++) {
                const float *xt = x + (size_t)t * row;
                kvd_gdn_step(S1, xt, xt + dk, xt + 2 * dk, g[(size_t)t * 2 * NV],
                             beta[(size_t)t * 2 * NV], o1 + (size_t)t * dv, dk, dv);
            }
            kvd_gdn_steps(S2, x, x + dk, x + 2 * dk, g, beta, o2, n, dk, dv, row, row, 2 * NV,
                          (size_t)dv);
            assert_memory_equal(o1, o2, sizeof(float) * (size_t)dv * n);
            assert_memory_equal(S1, S2, sizeof(float) * sz);
            double on = 0;
            for (int i = 0; i < dv * n; i++) on += fabs(o1[i]);
            assert_true(on > 0.01 * dv * n); /* a real read-out, not zeros */
            free(x), free(gb), free(o1), free(o2), free(S1), free(S2);
        }
}

/* Two drift runs' figures, bit for bit: every statistic, token figure,
 * generation and the cache's write counts and scales. */
static void same_drift(const kvd_drift *a, const kvd_drift *b) {
    assert_memory_equal(a->out, b->out, sizeof a->out);
    assert_memory_equal(a->hid, b->hid,
                        sizeof(kvd_stat) * (size_t)a->n_layers * KVD_HID_N * KVD_NSUB * KVD_NB);
    assert_memory_equal(a->att, b->att,
                        sizeof(kvd_stat) * (size_t)a->n_attn * KVD_VIEW_N * KVD_ATT_N * KVD_NSUB *
                            KVD_NB);
    assert_memory_equal(a->router, b->router, sizeof(kvd_stat) * (size_t)a->n_layers * KVD_NB);
    assert_memory_equal(a->att_kvh, b->att_kvh,
                        sizeof(kvd_stat) * (size_t)a->n_attn * a->kv_heads * KVD_VIEW_N * KVD_NB);
    assert_int_equal(a->n_tok, b->n_tok);
    assert_memory_equal(a->tok, b->tok, sizeof(kvd_token_fig) * (size_t)a->n_tok);
    assert_int_equal(a->n_gen, b->n_gen);
    assert_memory_equal(a->gen, b->gen, sizeof(kvd_gen_result) * (size_t)a->n_gen);
    assert_memory_equal(a->k_stats, b->k_stats, sizeof(kvd_qstats) * (size_t)a->n_attn);
    assert_memory_equal(a->v_stats, b->v_stats, sizeof(kvd_qstats) * (size_t)a->n_attn);
    assert_memory_equal(a->k_scale, b->k_scale, sizeof(float) * (size_t)a->n_attn * a->kv_heads);
    assert_memory_equal(a->v_scale, b->v_scale, sizeof(float) * (size_t)a->n_attn * a->kv_heads);
}

/* kvd_drift_run_modes: candidates that share one reference run (the CPU's
 * models take the isolated view on the candidate's side, from the
 * reference's K/V rows) give each mode the figures of the reference-side
 * view, run one mode at a time (the CPU model with shadow_of_reference
 * off, as the device model runs), bit for bit: every KV format, FP8
 * attention over the E4M3 modes, a copy span and two generations. The
 * group's candidates take the layers below the first full-attention layer
 * from the reference (kvd_model_share_prefix); those run alone compute
 * them, so that sharing is held to computing too: hidden-state figures,
 * router flips and the generations (which run on the shared layers' state). */
static void drift_shared_reference(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    enum { N = 600, K = 7 };
    int32_t tok[N], cal[300];
    uint8_t is_copy[N + 1] = {0}, start[N + 1] = {0};
    kvd_tokens_synth(21, N, C.vocab_size, tok);
    for (int i = 0; i < 64; i++) tok[300 + i] = tok[100 + i], is_copy[300 + i] = 1;
    start[300] = 1;
    kvd_tokens_synth(5, 300, C.vocab_size, cal);
    kvd_kv_scales sc, am;
    assert_int_equal(
        kvd_calibrate(&kvd_backend_cpu, &W, cal, 300, KVD_CAL_ABSMAX, 1, &sc, &am, err), 0);
    const kvd_kv_mode modes[K] = {KVD_KV_BF16,      KVD_KV_FP8_CAL,        KVD_KV_FP8_UNSCALED,
                                  KVD_KV_FP8_E5M2,  KVD_KV_NVFP4_UNSCALED, KVD_KV_FP8_TOKEN,
                                  KVD_KV_INT8_TOKEN};
    const kvd_kv_scales *scales[K];
    for (int j = 0; j < K; j++) scales[j] = kvd_kv_mode_scaled(modes[j]) ? &sc : NULL;
    kvd_engine_ops one_side = kvd_engine_cpu;
    one_side.shadow_of_reference = 0; /* the shadow on the reference */
    one_side.share_prefix = NULL;     /* every layer run by every candidate */
    const kvd_backend apart = {&one_side, 1};
    for (int fp8 = 0; fp8 < 2; fp8++) {
        /* FP8 attention: only the E4M3 modes run it */
        const kvd_kv_mode e4m3[2] = {KVD_KV_FP8_CAL, KVD_KV_FP8_UNSCALED};
        const kvd_kv_mode *m = fp8 ? e4m3 : modes;
        const kvd_kv_scales *const *ms = fp8 ? scales + 1 : scales;
        const int k = fp8 ? 2 : K;
        kvd_drift_opts o;
        kvd_drift_opts_defaults(&o);
        o.gen_tokens = 8;
        o.n_gen = 2;
        o.gen_prefix[0] = 150, o.gen_prefix[1] = 400;
        o.attn_fp8 = fp8;
        kvd_drift group[K], alone;
        for (int j = 0; j < k; j++) assert_int_equal(kvd_drift_init(&group[j], &C, N), 0);
        assert_int_equal(kvd_drift_run_modes(&kvd_backend_cpu, &W, (const uint32_t *)tok, is_copy,
                                             start, N, k, m, ms, &o, group, err),
                         0);
        for (int j = 0; j < k; j++) {
            assert_int_equal(kvd_drift_init(&alone, &C, N), 0);
            assert_int_equal(kvd_drift_run(&apart, &W, (const uint32_t *)tok, is_copy, start, N,
                                           m[j], ms[j], &o, &alone, err),
                             0);
            same_drift(&group[j], &alone);
            /* the figures are not all zeros: BF16 against BF16 is, every
             * other mode moves the isolated view's attention */
            const kvd_stat *iso = kvd_drift_att(&alone, 0, KVD_VIEW_ISOLATED, KVD_ATT_KL,
                                                KVD_SUB_ALL, kvd_bucket(512));
            assert_true(iso->n > 0);
            assert_true(m[j] == KVD_KV_BF16 ? iso->sum == 0 : iso->sum > 0);
            assert_int_equal(alone.n_gen, 2);
            assert_true(group[j].seconds > 0);
            kvd_drift_free(&alone);
        }
        for (int j = 0; j < k; j++) kvd_drift_free(&group[j]);
    }
    kvd_kv_scales_free(&sc), kvd_kv_scales_free(&am);
}

/* kvd_drift_run_modes names where it failed: -2 before the first step (a
 * candidate's cache refused, as memory for a group's caches would be: fewer
 * modes at once may fit), -1 in a step (here a token outside the
 * vocabulary), each with its message. */
static void drift_failures(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    enum { N = 64 };
    int32_t tok[N];
    uint8_t none[N + 1] = {0};
    kvd_tokens_synth(9, N, C.vocab_size, tok);
    const int nf = kvd_config_n_full(&C);
    kvd_kv_scales bad;
    assert_int_equal(kvd_kv_scales_init(&bad, nf, C.num_key_value_heads), 0);
    bad.k[1] = NAN;
    const kvd_kv_mode modes[2] = {KVD_KV_FP8_UNSCALED, KVD_KV_FP8_CAL};
    const kvd_kv_scales *scales[2] = {NULL, &bad};
    kvd_drift_opts o;
    kvd_drift_opts_defaults(&o);
    o.gen_tokens = 0;
    kvd_drift d[2];
    for (int j = 0; j < 2; j++) assert_int_equal(kvd_drift_init(&d[j], &C, N), 0);
    assert_int_equal(kvd_drift_run_modes(&kvd_backend_cpu, &W, (const uint32_t *)tok, none, none, N,
                                         2, modes, scales, &o, d, err),
                     -2);
    assert_non_null(strstr(err, "expected positive finite scales"));
    for (int j = 0; j < 2; j++) assert_true(d[j].failed && !strcmp(d[j].error, err));
    /* the reference's failure is every candidate's */
    tok[40] = C.vocab_size; /* one past the last id */
    const kvd_kv_mode two[2] = {KVD_KV_FP8_UNSCALED, KVD_KV_FP8_E5M2};
    const kvd_kv_scales *unscaled[2] = {NULL, NULL};
    assert_int_equal(kvd_drift_run_modes(&kvd_backend_cpu, &W, (const uint32_t *)tok, none, none, N,
                                         2, two, unscaled, &o, d, err),
                     -1);
    assert_non_null(strstr(err, "the bf16 reference: "));
    assert_non_null(strstr(err, "position 40"));
    for (int j = 0; j < 2; j++) assert_true(d[j].failed && !strcmp(d[j].error, err));
    for (int j = 0; j < 2; j++) kvd_drift_free(&d[j]);
    kvd_kv_scales_free(&bad);
}

/* A candidate whose step fails drops out of the lock step and the others
 * run on: E4M3 written without saturation (--fp8-overflow nan) stores NaN
 * where the unscaled cache overflows, so fp8-unscaled's activations turn
 * non-finite early; bf16 and fp8-e5m2 (whose range holds every value) get
 * the figures each gets alone, bit for bit, generations included. */
static void drift_drop_out(void **st) {
    (void)st;
    char err[KVD_ERR_LEN];
    enum { N = 400, K = 3 };
    int32_t tok[N];
    uint8_t none[N + 1] = {0};
    kvd_tokens_synth(23, N, C.vocab_size, tok);
    const kvd_kv_mode modes[K] = {KVD_KV_BF16, KVD_KV_FP8_UNSCALED, KVD_KV_FP8_E5M2};
    const kvd_kv_scales *scales[K] = {NULL, NULL, NULL};
    kvd_drift_opts o;
    kvd_drift_opts_defaults(&o);
    o.saturate = 0;
    o.gen_tokens = 6;
    o.n_gen = 2;
    o.gen_prefix[0] = 100, o.gen_prefix[1] = 300;
    kvd_drift group[K], alone;
    for (int j = 0; j < K; j++) assert_int_equal(kvd_drift_init(&group[j], &C, N), 0);
    assert_int_equal(kvd_drift_run_modes(&kvd_backend_cpu, &W, (const uint32_t *)tok, none, none, N,
                                         K, modes, scales, &o, group, err),
                     -1);
    assert_non_null(strstr(err, "fp8-unscaled: non-finite activation"));
    assert_true(group[1].failed);
    assert_non_null(strstr(group[1].error, "non-finite activation"));
    assert_null(strstr(group[1].error, "fp8-unscaled")); /* its own message: the caller names it */
    for (int j = 0; j < K; j += 2) {
        assert_false(group[j].failed);
        assert_int_equal(kvd_drift_init(&alone, &C, N), 0);
        assert_int_equal(kvd_drift_run(&kvd_backend_cpu, &W, (const uint32_t *)tok, none, none, N,
                                       modes[j], NULL, &o, &alone, err),
                         0);
        assert_false(alone.failed);
        same_drift(&group[j], &alone);
        assert_int_equal(alone.n_gen, 2);
        kvd_drift_free(&alone);
    }
    /* alone, the failing mode fails as it did in the group */
    assert_int_equal(kvd_drift_init(&alone, &C, N), 0);
    assert_int_equal(kvd_drift_run(&kvd_backend_cpu, &W, (const uint32_t *)tok, none, none, N,
                                   modes[1], NULL, &o, &alone, err),
                     -1);
    assert_true(alone.failed);
    assert_string_equal(alone.error, group[1].error);
    assert_string_equal(err, group[1].error);
    kvd_drift_free(&alone);
    for (int j = 0; j < K; j++) kvd_drift_free(&group[j]);
}

/* The matrices' AMX tiles (kvd_weights_tiles): made once for a tensor's
 * start and its shape, the same object after; none for a pointer inside a
 * tensor, another shape, or where the GEMMs do not take AMX */
static void weights_tiles(void **st) {
    (void)st;
    const kvd_tensor *q = kvd_weights_find(&W, "model.layers.3.self_attn.q_proj.weight");
    assert_non_null(q);
    const int N = (int)q->shape[0], K = (int)q->shape[1];
    const struct kvd_wtiles *t = kvd_weights_tiles(&W, q->data, N, K);
    if (strcmp(kvd_linear_kernels(), "amx")) {
        assert_null(t);
        print_message("skipped: this CPU's GEMMs take no AMX tiles (%s)\n", kvd_linear_kernels());
        return;
    }
    assert_non_null(t);
    assert_int_equal(kvd_wtiles_bytes(t), (size_t)((N + 255) / 256) * 16 * ((K + 31) / 32) * 1024);
    assert_ptr_equal(kvd_weights_tiles(&W, q->data, N, K), t);
    assert_null(kvd_weights_tiles(&W, q->data, N, K - 1));
    assert_null(kvd_weights_tiles(&W, q->data + K, N - 1, K));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(weights_pure),
        cmocka_unit_test(weights_uniform_draws),
        cmocka_unit_test(weights_tiles),
        cmocka_unit_test(gdn_chunked_matches_recurrence),
        cmocka_unit_test(gdn_steps_match_step),
        cmocka_unit_test(prefill_decode_batch),
        cmocka_unit_test(thread_count_invariance),
        cmocka_unit_test(nan_is_caught),
        cmocka_unit_test(sink_and_retrieval),
        cmocka_unit_test(calibration),
        cmocka_unit_test(drift_shared_reference),
        cmocka_unit_test(drift_failures),
        cmocka_unit_test(drift_drop_out),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
