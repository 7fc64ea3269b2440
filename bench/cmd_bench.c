/* kvdrift: `bench kernels`. Every kernel is validated against a plain
 * double-precision reference first, then timed; speeds are reported as ratios
 * to figures measured in the same run (copy bandwidth, BF16, OpenBLAS peak). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../kernels/backend.h"
#include "../kernels/fp8.h"
#include "../kernels/kernels.h"
#include "../datasets/trace.h"
#include "../runners/config.h"
#include "../runners/kvcache.h"
#include "../runners/drift.h"
#include "../runners/model.h"
#include "../runners/weights.h"
#include "bench_cuda.h"
#include "lockstep.h"
#include "commands.h"
#include "util.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* STREAM-style copy: bytes read + bytes written per second, all threads. */
static double copy_bandwidth(size_t bytes, int reps) {
    char *a = malloc(bytes), *b = malloc(bytes);
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = kvd_now();
#pragma omp parallel
        {
#ifdef _OPENMP
            int nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
            int nt = 1, id = 0;
#endif
            size_t chunk = bytes / (size_t)nt, off = chunk * (size_t)id;
            memcpy(b + off, a + off, id == nt - 1 ? bytes - off : chunk);
        }
        double dt = kvd_now() - t0, bw = 2.0 * (double)bytes / dt;
        best = bw > best ? bw : best;
    }
    volatile char sink = b[bytes / 2];
    (void)sink;
    free(a);
    free(b);
    return best;
}

/* The last-level cache's size as the C library reads it (0 where unknown) */
static size_t llc_bytes(void) {
    long b = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    b = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (b <= 0) b = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return b > 0 ? (size_t)b : 0;
}

/* --buffer-mib's size for every buffer below, in bytes; 0: past_llc's */
static size_t buffer_bytes;

/* A buffer that no CPU cache holds: at least `floor`, and twice the
 * last-level cache where that is larger (an EPYC with stacked cache has
 * over 1 GiB of L3, some Xeons 480 MiB), in whole MiB; or --buffer-mib's */
static size_t past_llc(size_t floor) {
    if (buffer_bytes) return buffer_bytes;
    size_t b = 2 * llc_bytes();
    b = b > floor ? b : floor;
    return (b + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
}

/* Read-only streaming: bytes read per second, all threads (an integer sum,
 * so the compiler vectorises it without reassociating floats). */
static double read_bandwidth(size_t bytes, int reps) {
    size_t n = bytes / sizeof(uint64_t);
    uint64_t *a = kvd_alloc_pool(bytes), total = 0;
    for (size_t i = 0; i < n; i++) a[i] = i;
    double best = 0;
    for (int r = 0; r < reps; r++) {
        uint64_t sum = 0;
        double t0 = kvd_now();
        /* four streams a thread, as a kernel reading several rows at once
         * has: one stream a thread read 1.02x-1.28x slower on this machine */
        const size_t q = n / 4;
#pragma omp parallel for reduction(+ : sum) schedule(static)
        for (size_t i = 0; i < q; i++) sum += a[i] + a[q + i] + a[2 * q + i] + a[3 * q + i];
        double bw = (double)(4 * q * sizeof *a) / (kvd_now() - t0);
        best = bw > best ? bw : best;
        total += sum;
    }
    kvd_free_pool(a);
    return total == 0 ? 0 : best;
}

typedef struct {
    kvd_fmt fmt;
    int n_ctx, kvh, hd, nh, bs;
    int p_fp8;         /* FP8 attention's weights (--attn-fp8) */
    int portable;      /* the portable kernels, where vector ones exist */
    size_t pool_bytes; /* of each of k and v */
    uint8_t *k, *v;
    int32_t *blocks;
    float kscale[16], vscale[16];
} bench_cache;

static void cache_fill(bench_cache *c, kvd_fmt fmt, int n_ctx) {
    c->fmt = fmt;
    c->n_ctx = n_ctx;
    int nb = (n_ctx + c->bs - 1) / c->bs;
    c->pool_bytes = (size_t)nb * c->kvh * c->bs * kvd_fmt_row_bytes(fmt, c->hd);
    c->k = kvd_alloc_pool(c->pool_bytes);
    c->v = kvd_alloc_pool(c->pool_bytes);
    c->blocks = malloc(sizeof(int32_t) * (size_t)nb);
    /* blocks scattered through the pool, as after a serving engine's churn */
    for (int i = 0; i < nb; i++) c->blocks[i] = (int32_t)(((int64_t)i * 7919) % nb);
    uint64_t key = kvd_rng_key(7, "bench.kv");
    size_t n = (size_t)nb * c->kvh * c->bs * c->hd;
    float *tmp = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) tmp[i] = kvd_rng_normal(key, i);
    for (int h = 0; h < c->kvh; h++)
        c->kscale[h] = c->vscale[h] = fmt == KVD_FMT_BF16 || kvd_fmt_row_scaled(fmt) ? 1.0f : 0.01f;
    for (size_t r = 0; r < n / (size_t)c->hd; r++) { /* a row's scales, where it has them */
        kvd_pool_quant_row(fmt, c->k, c->bs, c->hd, r, tmp + r * c->hd, 0.01f, 1, NULL);
        kvd_pool_quant_row(fmt, c->v, c->bs, c->hd, r, tmp + r * c->hd, 0.01f, 1, NULL);
    }
    free(tmp);
}

static void cache_free(bench_cache *c) {
    kvd_free_pool(c->k);
    kvd_free_pool(c->v);
    free(c->blocks);
}

static kvd_kv_view cache_view(const bench_cache *c) {
    kvd_kv_view v = {c->fmt,    c->bs,     c->kvh,      c->hd, c->k,    c->v,
                     c->kscale, c->vscale, c->portable, NULL,  c->p_fp8};
    return v;
}

/* Out of every level of CPU cache: this machine's L3 can hold a 32K-token
 * layer, a serving engine's decode step (every layer, many sequences) cannot. */
static void evict(const void *p, size_t n) {
#if defined(__CLFLUSHOPT__)
    for (size_t i = 0; i < n; i += 64) _mm_clflushopt((void *)((const char *)p + i));
    _mm_sfence();
#elif defined(__x86_64__)
    for (size_t i = 0; i < n; i += 64) _mm_clflush((const char *)p + i);
    _mm_mfence();
#else
    (void)p, (void)n;
#endif
}

/* One decode query over the whole cache, its context split across the threads. */
static void decode_once(const bench_cache *c, const float *q, float *out, float *probs, void *work,
                        int parts) {
    kvd_kv_view v = cache_view(c);
    kvd_attn_paged(&v, c->blocks, c->n_ctx, q, c->nh, 1.0f / sqrtf((float)c->hd), out, probs, work,
                   parts);
}

/* Reference: every row decoded by the scalar codec, softmax in double; with
 * FP8 weights each rounded by the codec (2^8 exp(s - M) in E4M3) over the
 * sum of the unrounded ones. I4T in its rotated basis, as its attention
 * computes: the query rotated and in BF16, the rows rotated again, the
 * output rotated back (kvd_attn_paged's rounding of it to BF16 left to the
 * tolerance, decode_tol). */
static double decode_check(const bench_cache *c, const float *q, const float *out) {
    kvd_kv_view v = cache_view(c);
    int g = c->nh / c->kvh, hd = c->hd, n = c->n_ctx;
    double *s = malloc(sizeof(double) * (size_t)n), worst = 0;
    float *row = malloc(sizeof(float) * (size_t)hd);
    double *acc = malloc(sizeof(double) * (size_t)hd);
    float *qh = malloc(sizeof(float) * (size_t)hd);
    const int i4 = c->fmt == KVD_FMT_I4T;
    for (int hq = 0; hq < c->nh; hq++) {
        int h = hq / g;
        double m = -INFINITY, sum = 0;
        memcpy(qh, q + (size_t)hq * hd, sizeof(float) * (size_t)hd);
        if (i4) kvd_rht(qh, (size_t)hd, 0), kvd_round_bf16(qh, (size_t)hd);
        for (int t = 0; t < n; t++) {
            kvd_kv_row(&v, 0, c->blocks, t, h, row);
            if (i4) kvd_rht(row, (size_t)hd, 0);
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)qh[i] * row[i];
            s[t] = d / sqrt((double)hd) / (i4 ? hd : 1);
            m = s[t] > m ? s[t] : m;
        }
        for (int t = 0; t < n; t++) sum += (s[t] = exp(s[t] - m));
        memset(acc, 0, sizeof(double) * (size_t)hd);
        for (int t = 0; t < n; t++) {
            kvd_kv_row(&v, 1, c->blocks, t, h, row);
            if (i4) kvd_rht(row, (size_t)hd, 0);
            const double w =
                c->p_fp8 ? kvd_e4m3_to_f32(kvd_f32_to_e4m3((float)(256.0 * s[t]), 1)) / 256.0
                         : s[t];
            for (int i = 0; i < hd; i++) acc[i] += w / sum * row[i];
        }
        if (i4) {
            for (int i = 0; i < hd; i++) row[i] = (float)acc[i];
            kvd_rht(row, (size_t)hd, 1);
            for (int i = 0; i < hd; i++) acc[i] = row[i] / (double)hd;
        }
        double num = 0, den = 0;
        for (int i = 0; i < hd; i++) {
            double e = out[(size_t)hq * hd + i] - acc[i];
            num += e * e;
            den += acc[i] * acc[i];
        }
        double rel = sqrt(num / (den > 0 ? den : 1));
        worst = rel > worst ? rel : worst;
    }
    free(s);
    free(row);
    free(acc);
    free(qh);
    return worst;
}

/* The error a decode case is held to: fp32 accumulation over up to 32K
 * terms against the double reference; I4T's output is rounded to BF16 (half
 * a step: 2^-9 relative). */
static double decode_tol(kvd_fmt f) {
    return f == KVD_FMT_I4T ? 0x1p-8 : 1e-4;
}

/* A decode case's buffers beside its cache: the query (drawn, the same for
 * every case), the output, the distribution (where asked for), the work and
 * the parts it is split in */
typedef struct {
    float *q, *out, *probs;
    void *work;
    int parts;
} decode_bufs;

/* The cache (its shape set) filled in fmt over n_ctx tokens, and its buffers */
static void case_alloc(bench_cache *c, kvd_fmt fmt, int n_ctx, int want_probs, decode_bufs *d) {
    cache_fill(c, fmt, n_ctx);
    const size_t nq = (size_t)c->nh * c->hd;
    d->q = malloc(sizeof(float) * nq);
    d->out = malloc(sizeof(float) * nq);
    d->probs = want_probs ? malloc(sizeof(float) * (size_t)c->nh * c->n_ctx) : NULL;
    uint64_t key = kvd_rng_key(9, "bench.q");
    for (size_t i = 0; i < nq; i++) d->q[i] = kvd_rng_normal(key, (uint64_t)i);
    d->parts = kvd_attn_parts(c->n_ctx, c->bs);
    d->work = malloc(kvd_attn_work_bytes(c->nh, c->hd, c->n_ctx, d->parts));
}

static void case_free(bench_cache *c, decode_bufs *d) {
    free(d->work);
    free(d->q);
    free(d->out);
    free(d->probs);
    cache_free(c);
}

/* The AMX kernels against the AVX-512 ones at the attention shapes they
 * are taken for (qwen3-next-80b-a3b's 16 query heads and qwen3.5-397b-a17b's
 * 32, 2 KV heads, head_dim 256), 32K tokens, the two timed in turn. Returns
 * 1 where a result strays from the reference. */
static int bench_amx(double bw, int reps) {
    printf("\ndecode attention at 16 and 32 query heads (2 KV heads, head_dim 256: the attention "
           "of qwen3-next-80b-a3b and qwen3.5-397b-a17b), blocks of %d tokens, 32768 tokens, the "
           "cache evicted before each run: the AMX kernels, and the AVX-512 ones timed in turn "
           "(vs_avx512: the AVX-512 kernels' time over AMX's):\n",
           KVD_KV_BLOCK);
    printf("%6s %-6s %10s %10s %10s %10s %8s %10s %10s\n", "heads", "cache", "max_rel_err",
           "time_us", "cache_MB", "read_GB_s", "of_copy", "avx512_us", "vs_avx512");
    const kvd_fmt fmts[3] = {KVD_FMT_BF16, KVD_FMT_E4M3, KVD_FMT_I8T};
    const char *fn[3] = {"bf16", "e4m3", "i8t"};
    int fail = 0;
    for (int nh = 16; nh <= 32; nh *= 2)
        for (int fi = 0; fi < 3; fi++) {
            bench_cache c;
            decode_bufs d;
            memset(&c, 0, sizeof c);
            c.kvh = 2, c.hd = 256, c.nh = nh, c.bs = KVD_KV_BLOCK;
            case_alloc(&c, fmts[fi], 32768, 0, &d);
            decode_once(&c, d.q, d.out, NULL, d.work, d.parts);
            const double rel = decode_check(&c, d.q, d.out);
            if (rel > 1e-4) {
                fprintf(stderr, "decode attention %s at %d heads: relative error %.3g above 1e-4\n",
                        fn[fi], nh, rel);
                fail = 1;
            }
            double *t = malloc(sizeof(double) * 2 * (size_t)reps);
            for (int r = 0; r < reps; r++)
                for (int pass = 0; pass < 2; pass++) {
                    c.portable = pass ? KVD_ATTN_NO_AMX : 0;
                    evict(c.k, c.pool_bytes);
                    evict(c.v, c.pool_bytes);
                    double t0 = kvd_now();
                    decode_once(&c, d.q, d.out, NULL, d.work, d.parts);
                    t[pass * reps + r] = kvd_now() - t0;
                }
            const double ta = median(t, reps), tv = median(t + reps, reps);
            const double bytes = 2.0 * c.n_ctx * c.kvh * (double)kvd_fmt_row_bytes(c.fmt, c.hd);
            printf("%6d %-6s %10.2e %10.1f %10.2f %10.2f %7.1f%% %10.1f %9.2fx\n", nh, fn[fi], rel,
                   ta * 1e6, bytes / 1e6, bytes / ta / 1e9, 100.0 * bytes / ta / bw, tv * 1e6,
                   tv / ta);
            free(t);
            case_free(&c, &d);
        }
    return fail;
}

/* The delta rule in double, one head, token by token: kvd_gdn_step's
 * reference for the table below */
static void gdn_ref(double *S, const float *q, const float *k, const float *v, float g, float beta,
                    double *o, int dk, int dv) {
    const double decay = exp((double)g);
    for (int j = 0; j < dv; j++) {
        double mem = 0.0;
        for (int i = 0; i < dk; i++) mem += S[(size_t)i * dv + j] * k[i];
        const double delta = ((double)v[j] - decay * mem) * beta;
        o[j] = 0.0;
        for (int i = 0; i < dk; i++) {
            double *s = S + (size_t)i * dv + j;
            *s = decay * *s + k[i] * delta;
            o[j] += *s * q[i];
        }
    }
}

/* The Gated DeltaNet recurrence at the presets' head shape (dk = dv = 128):
 * kvd_gdn_steps (the model's) against kvd_gdn_step token by token, in
 * prefill (one head a thread through T tokens, its state in cache) and in
 * decode (one token on each of the states filling `pool`, read and written
 * once, as decode at many sequences and layers has them). Checked first:
 * the same bits as the token-by-token step, and within 1e-5 of double. */
static int bench_gdn(double bw, int reps, int threads) {
    enum { DK = 128, DV = 128, T = 2048 };
    const size_t sz = (size_t)DK * DV, row = 2 * DK + DV;
    const size_t pool = past_llc((size_t)256 << 20);
    const int nstate = (int)(pool / (sizeof(float) * sz));
    float *x = malloc(sizeof(float) * row * T), *gb = malloc(sizeof(float) * 2 * T);
    float *o = malloc(sizeof(float) * (size_t)DV * T * (size_t)threads);
    float *S = kvd_alloc_pool(sizeof(float) * sz * (size_t)(nstate > threads ? nstate : threads));
    float *S0 = malloc(sizeof(float) * sz); /* every state starts as this one */
    float *S2 = malloc(sizeof(float) * sz), *o2 = malloc(sizeof(float) * DV * T);
    double *Sd = malloc(sizeof(double) * sz), *od = malloc(sizeof(double) * DV);
    double *ts = malloc(sizeof(double) * (size_t)reps * 2);
    int fail = !x || !gb || !o || !S || !S0 || !S2 || !o2 || !Sd || !od || !ts;
    if (fail) {
        fprintf(stderr, "bench kernels: out of memory for the DeltaNet recurrence\n");
        goto done;
    }
    /* the model's regime: L2-normalised q (over sqrt(dk)) and k, decays
     * e^-0.01..e^-2, beta in (0, 1) */
    uint64_t key = kvd_rng_key(11, "bench.gdn");
    for (int t = 0; t < T; t++) {
        float *r = x + (size_t)t * row;
        for (size_t i = 0; i < row; i++) r[i] = kvd_rng_normal(key, (size_t)t * row + i);
        for (int h = 0; h < 2; h++) {
            double n = 0;
            for (int i = 0; i < DK; i++) n += (double)r[h * DK + i] * r[h * DK + i];
            const double f = 1.0 / sqrt(n) / (h ? 1.0 : sqrt((double)DK));
            for (int i = 0; i < DK; i++) r[h * DK + i] *= (float)f;
        }
        gb[2 * t] = -0.01f - 2.0f * kvd_rng_uniform(key, (uint64_t)t + 50000000);
        gb[2 * t + 1] = kvd_rng_uniform(key, (uint64_t)t + 60000000);
    }
    for (size_t i = 0; i < sz; i++) S0[i] = S[i] = 0.3f * kvd_rng_normal(key, i + 7);
    /* checked: 256 tokens from state 0, against the step and double */
    enum { TC = 256 };
    memcpy(S2, S, sizeof(float) * sz);
    for (size_t i = 0; i < sz; i++) Sd[i] = S[i];
    double err = 0, ref = 0;
    for (int t = 0; t < TC; t++) {
        const float *r = x + (size_t)t * row;
        kvd_gdn_step(S2, r, r + DK, r + 2 * DK, gb[2 * t], gb[2 * t + 1], o2 + (size_t)t * DV, DK,
                     DV);
        gdn_ref(Sd, r, r + DK, r + 2 * DK, gb[2 * t], gb[2 * t + 1], od, DK, DV);
        for (int j = 0; j < DV; j++) {
            const double e = o2[(size_t)t * DV + j] - od[j];
            err += e * e, ref += od[j] * od[j];
        }
    }
    kvd_gdn_steps(S, x, x + DK, x + 2 * DK, gb, gb + 1, o, TC, DK, DV, row, row, 2, DV);
    const double rel = sqrt(err / ref);
    const int same = !memcmp(o, o2, sizeof(float) * DV * TC) && !memcmp(S, S2, sizeof(float) * sz);
    if (rel > 1e-5 || !same) {
        fprintf(stderr,
                "bench kernels: the DeltaNet recurrence failed its check (relative error %.2e "
                "against double; the slices' bits %s the step's)\n",
                rel, same ? "match" : "differ from");
        fail = 1;
    }
    printf("\nGated DeltaNet recurrence (fp32 state, dk = dv = %d: every preset's heads):\n"
           "kvd_gdn_steps (each 64-column slice of the state through every token; the model's)\n"
           "against kvd_gdn_step token by token (the same bits; relative error against double\n"
           "%.1e). prefill: %d tokens of one head a thread, the state in cache; decode: one\n"
           "token on each of %d states (%zu MiB, read and written once):\n",
           DK, rel, T, nstate, (sz * sizeof(float) * (size_t)nstate) >> 20);
    printf("  %-8s %8s %14s %14s %9s %8s\n", "case", "heads", "steps_ns_tok", "step_ns_tok",
           "vs_step", "of_copy");
    for (int dec = 0; dec < 2; dec++) {
        const int heads = dec ? nstate : threads, n = dec ? 1 : T;
#pragma omp parallel for schedule(static)
        for (int h = 0; h < heads; h++) memcpy(S + sz * (size_t)h, S0, sizeof(float) * sz);
        for (int who = 0; who < 2; who++)
            for (int r = 0; r <= reps; r++) {
                const double t0 = kvd_now();
#pragma omp parallel for schedule(static)
                for (int h = 0; h < heads; h++) {
                    int th = 0; /* each thread's own outputs */
#ifdef _OPENMP
                    th = omp_get_thread_num();
#endif
                    float *Sh = S + sz * (size_t)h, *oh = o + (size_t)DV * T * (size_t)th;
                    const float *xh = x + row * (size_t)(dec ? h % T : 0);
                    const float *gh = gb + 2 * (size_t)(dec ? h % T : 0);
                    if (who == 0)
                        kvd_gdn_steps(Sh, xh, xh + DK, xh + 2 * DK, gh, gh + 1, oh, n, DK, DV, row,
                                      row, 2, DV);
                    else
                        for (int t = 0; t < n; t++)
                            kvd_gdn_step(Sh, xh + row * (size_t)t, xh + row * (size_t)t + DK,
                                         xh + row * (size_t)t + 2 * DK, gh[2 * t], gh[2 * t + 1],
                                         oh + (size_t)DV * t, DK, DV);
                }
                if (r) ts[who * reps + r - 1] = kvd_now() - t0; /* 0: warm-up */
            }
        const double tk = median(ts, reps), tp = median(ts + reps, reps),
                     tokens = (double)heads * n;
        printf("  %-8s %8d %14.1f %14.1f %8.2fx", dec ? "decode" : "prefill", heads,
               1e9 * tk / tokens, 1e9 * tp / tokens, tp / tk);
        if (dec)
            printf(" %7.1f%%\n", 100.0 * 2.0 * sizeof(float) * (double)sz * heads / tk / bw);
        else
            printf(" %8s\n", "-");
    }
done:
    free(x), free(gb), free(o), kvd_free_pool(S), free(S0), free(S2), free(o2), free(Sd), free(od),
        free(ts);
    return fail;
}

static int bench_kernels(int reps, int portable) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("kvdrift bench kernels: %d threads\n\n", threads);
    const size_t big = past_llc((size_t)512 << 20);
    double bw = copy_bandwidth(big, reps < 5 ? 5 : reps);
    double rbw = read_bandwidth(big, reps < 5 ? 5 : reps);
    printf("memory copy bandwidth (bytes read + written, %zu MiB): %.2f GB/s\n", big >> 20,
           bw / 1e9);
    printf("memory read bandwidth (read-only sum, %zu MiB):       %.2f GB/s\n", big >> 20,
           rbw / 1e9);
    printf("(last-level cache: %zu MiB; the buffers are %s)\n\n", llc_bytes() >> 20,
           buffer_bytes ? "--buffer-mib's" : "at least twice it");

    kvd_config cfg;
    char err[KVD_ERR_LEN];
    kvd_config_preset("small", &cfg, err);
    printf("decode attention, one query over the cache of one layer, shape of 'small' (%d query "
           "heads, %d KV heads, head_dim %d), blocks of %d tokens (the cache's) and of 16 (GPU "
           "engines'); the cache evicted from every CPU cache before each run; fp8att: the e4m3 "
           "cache with FP8 attention's weights (--attn-fp8); nvfp4: E2M1 codes with E4M3 block "
           "scales; e4m3t, i8t: E4M3 and INT8 with a scale per row (fp8-token, int8-token); i4t: "
           "INT4 with a zero point and a scale per row, rotated (int4-token); "
           "kernels: %s%s:\n",
           cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, KVD_KV_BLOCK,
           portable ? "portable" : kvd_attn_kernels(), portable ? " (--portable)" : "");
    /* --portable on a CPU with vector kernels: those timed in turn too */
    const int both = portable && strcmp(kvd_attn_kernels(), "portable") != 0;
    printf("%6s %8s %-6s %10s %10s %10s %10s %8s %8s %8s%s\n", "block", "context", "cache",
           "max_rel_err", "time_us", "cache_MB", "read_GB_s", "of_copy", "of_read", "vs_bf16",
           both ? "   of_vec" : "");
    int ctxs[2] = {4096, 32768}, blocks[2] = {KVD_KV_BLOCK, 16};
    enum { NF = 8 };
    kvd_fmt fmts[NF] = {KVD_FMT_BF16,  KVD_FMT_E4M3,  KVD_FMT_E5M2, KVD_FMT_E4M3,
                        KVD_FMT_NVFP4, KVD_FMT_E4M3T, KVD_FMT_I8T,  KVD_FMT_I4T};
    const char *fn[NF] = {"bf16", "e4m3", "e5m2", "fp8att", "nvfp4", "e4m3t", "i8t", "i4t"};
    int fail = 0;
    /* the three formats are timed in turn, rep by rep, so that a slow spell
     * of this (shared) machine falls on all of them alike */
    for (int bi = 0; bi < 2; bi++)
        for (int ci = 0; ci < 2; ci++) {
            bench_cache c[NF];
            decode_bufs d[NF];
            for (int fi = 0; fi < NF; fi++) {
                memset(&c[fi], 0, sizeof c[fi]);
                c[fi].p_fp8 = fi == 3;
                c[fi].portable = portable;
                c[fi].kvh = cfg.num_key_value_heads;
                c[fi].hd = cfg.head_dim;
                c[fi].nh = cfg.num_attention_heads;
                c[fi].bs = blocks[bi];
                case_alloc(&c[fi], fmts[fi], ctxs[ci], 1, &d[fi]);
            }
            double rel[NF];
            for (int fi = 0; fi < NF; fi++) {
                decode_once(&c[fi], d[fi].q, d[fi].out, d[fi].probs, d[fi].work, d[fi].parts);
                rel[fi] = decode_check(&c[fi], d[fi].q, d[fi].out);
                if (rel[fi] > decode_tol(fmts[fi])) {
                    fprintf(stderr, "decode attention %s at %d: relative error %.3g above %.3g\n",
                            fn[fi], ctxs[ci], rel[fi], decode_tol(fmts[fi]));
                    fail = 1;
                }
            }
            int n = reps * (ctxs[ci] <= 4096 ? 4 : 1);
            double *ts = malloc(sizeof(double) * 2 * NF * (size_t)n), *tv = ts + NF * (size_t)n;
            for (int r = 0; r < n; r++)
                for (int fi = 0; fi < NF; fi++)
                    for (int pass = 0; pass < 1 + both; pass++) {
                        c[fi].portable = pass ? 0 : portable; /* pass 1: the vector kernels */
                        evict(c[fi].k, c[fi].pool_bytes);
                        evict(c[fi].v, c[fi].pool_bytes);
                        double t0 = kvd_now();
                        decode_once(&c[fi], d[fi].q, d[fi].out, d[fi].probs, d[fi].work,
                                    d[fi].parts);
                        (pass ? tv : ts)[fi * n + r] = kvd_now() - t0;
                    }
            double t_bf16 = 0;
            for (int fi = 0; fi < NF; fi++) {
                double t = median(ts + fi * n, n);
                double bytes =
                    2.0 * c[fi].n_ctx * c[fi].kvh * (double)kvd_fmt_row_bytes(c[fi].fmt, c[fi].hd);
                if (fi == 0) t_bf16 = t;
                printf("%6d %8d %-6s %10.2e %10.1f %10.2f %10.2f %7.1f%% %7.1f%% %7.2fx", c[fi].bs,
                       c[fi].n_ctx, fn[fi], rel[fi], t * 1e6, bytes / 1e6, bytes / t / 1e9,
                       100.0 * bytes / t / bw, 100.0 * bytes / t / rbw, t_bf16 / t);
                if (both) printf(" %7.2fx", median(tv + fi * n, n) / t);
                printf("\n");
            }
            free(ts);
            for (int fi = 0; fi < NF; fi++) case_free(&c[fi], &d[fi]);
        }
    if (!portable && !strcmp(kvd_attn_kernels(), "AMX")) fail |= bench_amx(bw, reps);

    /* GEMM: the model's projections through kvd_linear against OpenBLAS's
     * own sgemm at a large square shape (its practical peak here) */
    /* on a CPU with AMX, kvd_linear's GEMMs of many rows run on the tiles;
     * the BLAS under the same split (the avx512 kernels) timed beside them */
    const int amx_too = !strcmp(kvd_linear_kernels(), "amx");
    printf("\nGEMM (fp32 activations, BF16-valued weights as the model's): kvd_linear (%s)\n"
           "at the 'small' model's shapes against OpenBLAS's own threaded sgemm/sgemv at the\n"
           "same shape, and against its sgemm at 2048^3 (peak)%s:\n",
           kvd_cpu_blas(),
           amx_too
               ? "; vs_split: against OpenBLAS under kvd_linear's split (KVD_CPU_GEMM=avx512);\n"
                 "once: with W's tiles laid out once (as the model's are) over every call"
               : "");
    int N0 = 2048;
    float *A = malloc(sizeof(float) * (size_t)N0 * N0),
          *B = malloc(sizeof(float) * (size_t)N0 * N0),
          *C = malloc(sizeof(float) * (size_t)N0 * N0);
    uint64_t key = kvd_rng_key(3, "bench.gemm");
    for (size_t i = 0; i < (size_t)N0 * N0; i++) {
        A[i] = kvd_rng_normal(key, i);
        B[i] = kvd_rng_normal(key, i + 99999999u);
    }
    double peak = 0;
    openblas_set_num_threads(threads);
    for (int r = 0; r < 6; r++) { /* the first is a warm-up */
        double t0 = kvd_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N0, N0, N0, 1.0f, A, N0, B, N0, 0.0f,
                    C, N0);
        double g = 2.0 * N0 * N0 * (double)N0 / (kvd_now() - t0) / 1e9;
        peak = g > peak ? g : peak;
    }
    printf("  sgemm 2048 x 2048 x 2048: %.1f GFLOP/s\n", peak);
    struct {
        const char *what;
        int N, K;
    } shapes[] = {
        {"q_proj (query + gate)", 2 * cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size},
        {"k_proj / v_proj", cfg.num_key_value_heads * cfg.head_dim, cfg.hidden_size},
        {"o_proj", cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim},
        {"in_proj_qkvz", 2 * kvd_key_dim(&cfg) + 2 * kvd_value_dim(&cfg), cfg.hidden_size},
        {"expert gate/up", cfg.moe_intermediate_size, cfg.hidden_size},
        {"lm_head", cfg.vocab_size, cfg.hidden_size},
    };
    printf("  %-24s %6s %6s %6s %12s %12s %9s %10s%s\n", "shape", "M", "N", "K", "kvd_GFLOP_s",
           "blas_GFLOP_s", "vs_blas", "of_peak", amx_too ? "  vs_split     once" : "");
    int Ms[3] = {512, 64, 1};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int mi = 0; mi < 3; mi++) {
            int M = Ms[mi], N = shapes[si].N, K = shapes[si].K;
            float *x = malloc(sizeof(float) * (size_t)M * K),
                  *wt = malloc(sizeof(float) * (size_t)N * K),
                  *y = malloc(sizeof(float) * (size_t)M * N);
            for (size_t i = 0; i < (size_t)M * K; i++) x[i] = kvd_rng_normal(key, i);
            for (size_t i = 0; i < (size_t)N * K; i++) wt[i] = kvd_rng_normal(key, i + 7);
            kvd_round_bf16(wt, (size_t)N * K);
            int n = M == 1 ? 20 * reps : reps;
            double *ts = malloc(sizeof(double) * (size_t)n);
            /* OpenBLAS's own sgemm/sgemv, its own threads */
            openblas_set_num_threads(threads);
            for (int r = 0; r <= n; r++) {
                double t0 = kvd_now();
                if (M == 1) {
                    cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, wt, K, x, 1, 0.0f, y, 1);
                } else {
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, wt, K,
                                0.0f, y, N);
                }
                if (r) ts[r - 1] = kvd_now() - t0; /* the first is a warm-up */
            }
            double g_blas = 2.0 * M * N * (double)K / median(ts, n) / 1e9;
            /* kvdrift's kvd_linear: OpenBLAS single-threaded under our OpenMP split */
            openblas_set_num_threads(1);
            kvd_linear(x, wt, y, M, N, K);
            for (int r = 0; r < n; r++) {
                double t0 = kvd_now();
                kvd_linear(x, wt, y, M, N, K);
                ts[r] = kvd_now() - t0;
            }
            double g = 2.0 * M * N * (double)K / median(ts, n) / 1e9;
            printf("  %-24s %6d %6d %6d %12.1f %12.1f %8.2fx %9.1f%%", shapes[si].what, M, N, K, g,
                   g_blas, g / g_blas, 100.0 * g / peak);
            if (amx_too && M > KVD_FEW_ROWS) {
                const double t_amx = median(ts, n);
                kvd_linear_use("avx512");
                kvd_linear(x, wt, y, M, N, K);
                for (int r = 0; r < n; r++) {
                    double t0 = kvd_now();
                    kvd_linear(x, wt, y, M, N, K);
                    ts[r] = kvd_now() - t0;
                }
                kvd_linear_use("amx");
                const double t_split = median(ts, n);
                kvd_wtiles *tl = kvd_wtiles_new(wt, N, K);
                for (int r = 0; r < n; r++) {
                    double t0 = kvd_now();
                    kvd_linear_tiled(x, wt, tl, y, M, N, K);
                    ts[r] = kvd_now() - t0;
                }
                kvd_wtiles_free(tl);
                printf(" %8.2fx %7.2fx", t_split / t_amx, t_amx / median(ts, n));
            }
            printf("\n");
            free(ts);
            free(x);
            free(wt);
            free(y);
        }
    free(A);
    free(B);
    free(C);

    /* Decode's GEMMs: a few rows against weights that no CPU cache holds, as
     * in a model whose layers together are far larger than the last-level
     * cache. Each shape's weights are laid out in as many copies as make
     * 256 MiB or twice the last-level cache, and one pass multiplies the rows by each copy in turn;
     * the figure is the weights' bytes per second against the read bandwidth. */
    /* on a CPU with AVX-512, the AVX2 kernel (the same bits) timed beside it */
    const char *gemm_kernels = kvd_linear_kernels(); /* taken again after the AVX2 one */
    const int avx2_too = (!strcmp(gemm_kernels, "avx512") || amx_too) &&
                         kvd_linear_use("avx2") == 0 && kvd_linear_use(gemm_kernels) == 0;
    const size_t pool = past_llc((size_t)256 << 20);
    printf("\nDecode GEMMs (fp32): M rows against weights streamed from memory (copies of the\n"
           "matrix filling %zu MiB, one after another), kvd_linear (%s)\n"
           "against OpenBLAS's own threaded sgemm/sgemv on the same copies; an expert's 256\n"
           "columns are one thread's (the model runs its experts side by side, a thread each)%s:\n",
           pool >> 20, kvd_cpu_blas(),
           avx2_too ? "; avx2: the AVX2 kernel's speed over the AVX-512 one's" : "");
    if (amx_too)
        printf(
            "tiles: the AMX tiles' speed (each copy laid out once, BF16: half the bytes, as the\n"
            "model's matrices) over kvd_linear's kernel of a few rows\n");
    printf("  %-24s %6s %6s %6s %12s %12s %9s %8s%s%s\n", "shape", "M", "N", "K", "kvd_W_GB_s",
           "blas_W_GB_s", "vs_blas", "of_read", avx2_too ? "     avx2" : "",
           amx_too ? "    tiles" : "");
    const int Md[] = {1, 2, 4, 8, 16, 32}, mmax = 32;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int N = shapes[si].N, K = shapes[si].K;
        const size_t wn = (size_t)N * K;
        const int copies = (int)((pool / sizeof(float) + wn - 1) / wn);
        float *wt = malloc(sizeof(float) * wn * (size_t)copies);
        float *x = malloc(sizeof(float) * (size_t)mmax * K),
              *y = malloc(sizeof(float) * (size_t)mmax * N);
        if (!wt || !x || !y) {
            fprintf(stderr, "bench kernels: out of memory for the decode GEMMs\n");
            free(wt), free(x), free(y);
            return 1;
        }
        /* the matrix drawn once, then copied: a draw costs a log and a cosine */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < wn; i++) wt[i] = kvd_rng_normal(key, i + 7);
        kvd_round_bf16(wt, wn); /* the model's weights are BF16 values */
        for (int c = 1; c < copies; c++) memcpy(wt + wn * (size_t)c, wt, sizeof(float) * wn);
        for (size_t i = 0; i < (size_t)mmax * K; i++) x[i] = kvd_rng_normal(key, i);
        double *ts = malloc(sizeof(double) * (size_t)reps * 4);
        kvd_wtiles **tl = amx_too ? calloc((size_t)copies, sizeof *tl) : NULL;
        for (int c = 0; tl && c < copies; c++) tl[c] = kvd_wtiles_new(wt + wn * (size_t)c, N, K);
        for (size_t mi = 0; mi < sizeof Md / sizeof Md[0]; mi++) {
            const int M = Md[mi];
            /* OpenBLAS, kvd_linear, the AVX2 kernel, the tiles */
            for (int who = 0; who < 4; who++) {
                if ((who == 2 && !avx2_too) || (who == 3 && !tl)) continue;
                openblas_set_num_threads(who ? 1 : threads);
                if (who == 2) kvd_linear_use("avx2");
                for (int r = 0; r <= reps; r++) {
                    double t0 = kvd_now();
                    for (int c = 0; c < copies; c++) {
                        const float *w = wt + wn * (size_t)c;
                        if (who == 3)
                            kvd_linear_tiled(x, w, tl[c], y, M, N, K);
                        else if (who)
                            kvd_linear(x, w, y, M, N, K);
                        else if (M == 1)
                            cblas_sgemv(CblasRowMajor, CblasNoTrans, N, K, 1.0f, w, K, x, 1, 0.0f,
                                        y, 1);
                        else
                            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x,
                                        K, w, K, 0.0f, y, N);
                    }
                    if (r) ts[who * reps + r - 1] = (kvd_now() - t0) / copies; /* 0: warm-up */
                }
                if (who == 2) kvd_linear_use(gemm_kernels);
            }
            const double bytes = sizeof(float) * (double)wn, t_blas = median(ts, reps),
                         t_kvd = median(ts + reps, reps);
            printf("  %-24s %6d %6d %6d %12.2f %12.2f %8.2fx %7.1f%%", shapes[si].what, M, N, K,
                   bytes / t_kvd / 1e9, bytes / t_blas / 1e9, t_blas / t_kvd,
                   100.0 * bytes / t_kvd / rbw);
            if (avx2_too) printf(" %7.2fx", t_kvd / median(ts + 2 * reps, reps));
            if (tl) printf(" %7.2fx", t_kvd / median(ts + 3 * reps, reps));
            printf("\n");
        }
        for (int c = 0; tl && c < copies; c++) kvd_wtiles_free(tl[c]);
        free(tl);
        free(ts);
        free(wt);
        free(x);
        free(y);
    }
    fail |= bench_gdn(bw, reps, threads);
    printf("\nof_copy / of_read: cache bytes read per second over the copy / read bandwidth "
           "above;\nW_GB_s: the weights' bytes read per second; vs_bf16: speed-up over the BF16 "
           "cache at the same context, the formats timed "
           "in turn.\n%sTimes are medians.\n",
           both ? "of_vec: the portable kernels' speed over the AVX-512 kernels', timed in turn.\n"
                : "");
    return fail;
}

static const char *const bench_usage =
    "usage: kvdrift bench kernels [--reps N] [--threads N] [--portable] [--buffer-mib N]\n"
    "       kvdrift bench lockstep [--model PRESET | --config FILE | --model-dir DIR] "
    "[--context N] [--reps N]\n"
    "                              [--threads N] [--backend cpu|cuda] [--gpus N]\n"
    "       kvdrift bench cuda\n"
    "kernels: copy and read bandwidth, decode attention per cache format, GEMM (CPU);\n"
    "         --portable: the attention kernels a CPU without AVX-512 VBMI takes;\n"
    "         --buffer-mib: the bandwidth buffers' and the decode GEMMs' weights' size\n"
    "         (default: 512 and 256 MiB, or twice the last-level cache where larger).\n"
    "lockstep: what the lock-step measurement costs against the model's own decode.\n"
    "cuda: device copy bandwidth, decode attention, cuBLASLt GEMMs (every algorithm).\n";

static int help_asked(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

int kvd_cmd_bench(int argc, char **argv) {
    const char *cmd = "bench";
    if (help_asked(argc, argv)) {
        fputs(bench_usage, stdout);
        return 0;
    }
    if (argc >= 1 && !strcmp(argv[0], "cuda")) {
        if (argc > 1)
            kvd_die(KVD_EXIT_USAGE, cmd,
                    "cuda: unexpected argument '%s' (usage: kvdrift bench cuda)", argv[1]);
        /* asked for by name, so no device is an error (as for --backend cuda) */
        kvd_cuda_info ci;
        kvd_cuda_probe(&ci);
        if (ci.devices < 1) kvd_die(1, cmd, "cuda: %s", ci.name);
#ifdef KVD_HAVE_CUDA
        return kvd_bench_cuda(10, 0) ? 1 : 0;
#endif
    }
    if (argc >= 1 && !strcmp(argv[0], "lockstep")) {
        kvd_args a = {argc - 1, argv + 1, 0, cmd};
        kvd_model_opts mo;
        kvd_model_opts_init(&mo);
        int64_t ctx = 2048;
        int reps = 2;
        const char *f, *backend = "cpu";
        kvd_backend be = {NULL, 1};
        while ((f = kvd_args_next(&a))) {
            if (kvd_model_opts_flag(&mo, &a, f)) continue;
            if (!strcmp(f, "--context"))
                ctx = kvd_args_long(&a, f, 16, 1 << 24);
            else if (!strcmp(f, "--reps"))
                reps = (int)kvd_args_long(&a, f, 1, 100);
            else if (!strcmp(f, "--threads"))
                kvd_set_threads((int)kvd_args_long(&a, f, 1, 4096));
            else if (!strcmp(f, "--backend"))
                backend = kvd_args_value(&a, f);
            else if (!strcmp(f, "--gpus"))
                be.gpus = (int)kvd_args_long(&a, f, 1, KVD_MAX_GPUS);
            else
                kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        }
        kvd_use_backend(&be, backend, cmd, NULL, 0);
        kvd_weights w;
        char err[KVD_ERR_LEN];
        kvd_model_opts_build(&mo, cmd, &be, &w);
        kvd_check_positions(cmd, "--context", ctx, &w.cfg);
        int rc = kvd_bench_lockstep(&be, &w, ctx, reps, err);
        kvd_weights_free(&w);
        if (rc) kvd_die(1, cmd, "%s", err);
        return 0;
    }
    if (argc < 1 || strcmp(argv[0], "kernels") != 0)
        kvd_die(
            KVD_EXIT_USAGE, cmd,
            "expected 'kernels', 'lockstep' or 'cuda' (usage: kvdrift bench kernels [--reps "
            "N] [--threads N] [--portable]; kvdrift bench lockstep [--model PRESET] [--context N] "
            "[--backend cpu|cuda] [--gpus N]; kvdrift bench cuda)");
    kvd_args a = {argc - 1, argv + 1, 0, cmd};
    int reps = 10, portable = 0;
    const char *f;
    while ((f = kvd_args_next(&a))) {
        if (!strcmp(f, "--reps")) {
            reps = (int)kvd_args_long(&a, f, 1, 1000);
        } else if (!strcmp(f, "--threads")) {
            kvd_set_threads((int)kvd_args_long(&a, f, 1, 4096));
        } else if (!strcmp(f, "--portable")) {
            portable = 1;
        } else if (!strcmp(f, "--buffer-mib")) {
            buffer_bytes = (size_t)kvd_args_long(&a, f, 16, 1 << 20) << 20;
        } else {
            kvd_die(KVD_EXIT_USAGE, cmd, "unknown flag '%s'", f);
        }
    }
    return bench_kernels(reps, portable) ? 1 : 0;
}
