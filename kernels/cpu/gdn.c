/* kvdrift: the gated delta rule recurrence on the CPU, one head, one token.
 * The state never leaves fp32: FP8 KV drift reaches DeltaNet layers only
 * through their inputs. */
#include "../kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvd_gdn_step(float *S, const float *q, const float *k, const float *v, float g, float beta,
                  float *o, int dk, int dv) {
    float decay = expf(g);
    float mem[dv], delta[dv];
    /* first pass: S^T k of the decayed state */
    memset(mem, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        const float *row = S + (size_t)i * dv;
        float ki = k[i];
        for (int j = 0; j < dv; j++) mem[j] += row[j] * ki;
    }
    for (int j = 0; j < dv; j++) delta[j] = (v[j] - decay * mem[j]) * beta;
    /* second pass: decay, rank-one update and read-out in one sweep */
    memset(o, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        float *row = S + (size_t)i * dv;
        float ki = k[i], qi = q[i];
        for (int j = 0; j < dv; j++) {
            float s = decay * row[j] + ki * delta[j];
            row[j] = s;
            o[j] += s * qi;
        }
    }
}

/* A slice of NV x 16 columns through n tokens, in vectors of 16: the same
 * multiplies and adds as kvd_gdn_step (none fused), so its bits. Each
 * column's sums run in order, so the NV vectors are what overlaps. */
typedef float gdn_v16 __attribute__((vector_size(64)));
/* (loads through memcpy, unaligned; no function takes or returns a vector:
 * in a build for generic x86-64 that would change the ABI) */
#define GDN_LOAD(v, p) memcpy(&(v), (p), sizeof(gdn_v16))

#define GDN_SLICE(NV)                                                                              \
    static void gdn_slice_##NV(float *S, const float *q, const float *k, const float *v,           \
                               const float *g, const float *beta, float *o, int n, int dk, int dv, \
                               size_t qk_stride, size_t v_stride, size_t gb_stride,                \
                               size_t o_stride) {                                                  \
        for (int t = 0; t < n; t++) {                                                              \
            const float *qt = q + (size_t)t * qk_stride, *kt = k + (size_t)t * qk_stride;          \
            float decay = expf(g[(size_t)t * gb_stride]), b = beta[(size_t)t * gb_stride];         \
            gdn_v16 mem[NV], acc[NV], delta[NV];                                                   \
            for (int u = 0; u < NV; u++) mem[u] = acc[u] = (gdn_v16){0};                           \
            for (int i = 0; i < dk; i++) {                                                         \
                const float *row = S + (size_t)i * dv;                                             \
                for (int u = 0; u < NV; u++) {                                                     \
                    gdn_v16 r;                                                                     \
                    GDN_LOAD(r, row + 16 * u);                                                     \
                    mem[u] += r * kt[i];                                                           \
                }                                                                                  \
            }                                                                                      \
            for (int u = 0; u < NV; u++) {                                                         \
                gdn_v16 vt;                                                                        \
                GDN_LOAD(vt, v + (size_t)t * v_stride + 16 * u);                                   \
                delta[u] = (vt - decay * mem[u]) * b;                                              \
            }                                                                                      \
            for (int i = 0; i < dk; i++) {                                                         \
                float *row = S + (size_t)i * dv;                                                   \
                for (int u = 0; u < NV; u++) {                                                     \
                    gdn_v16 s;                                                                     \
                    GDN_LOAD(s, row + 16 * u);                                                     \
                    s = decay * s + kt[i] * delta[u];                                              \
                    memcpy(row + 16 * u, &s, sizeof s);                                            \
                    acc[u] += s * qt[i];                                                           \
                }                                                                                  \
            }                                                                                      \
            memcpy(o + (size_t)t * o_stride, acc, sizeof acc);                                     \
        }                                                                                          \
    }
GDN_SLICE(4)
GDN_SLICE(1)

/* The last w < 16 columns, one at a time in the same order. */
static void gdn_slice(float *S, const float *q, const float *k, const float *v, const float *g,
                      const float *beta, float *o, int n, int dk, int dv, int w, size_t qk_stride,
                      size_t v_stride, size_t gb_stride, size_t o_stride) {
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * qk_stride, *kt = k + (size_t)t * qk_stride;
        float decay = expf(g[(size_t)t * gb_stride]), b = beta[(size_t)t * gb_stride];
        for (int j = 0; j < w; j++) {
            float mem = 0.0f, acc = 0.0f;
            for (int i = 0; i < dk; i++) mem += S[(size_t)i * dv + j] * kt[i];
            float delta = (v[(size_t)t * v_stride + j] - decay * mem) * b;
            for (int i = 0; i < dk; i++) {
                float s = decay * S[(size_t)i * dv + j] + kt[i] * delta;
                S[(size_t)i * dv + j] = s;
                acc += s * qt[i];
            }
            o[(size_t)t * o_stride + j] = acc;
        }
    }
}

void kvd_gdn_steps(float *S, const float *q, const float *k, const float *v, const float *g,
                   const float *beta, float *o, int n, int dk, int dv, size_t qk_stride,
                   size_t v_stride, size_t gb_stride, size_t o_stride) {
    int j0 = 0;
    for (; j0 + 64 <= dv; j0 += 64)
        gdn_slice_4(S + j0, q, k, v + j0, g, beta, o + j0, n, dk, dv, qk_stride, v_stride,
                    gb_stride, o_stride);
    for (; j0 + 16 <= dv; j0 += 16)
        gdn_slice_1(S + j0, q, k, v + j0, g, beta, o + j0, n, dk, dv, qk_stride, v_stride,
                    gb_stride, o_stride);
    if (j0 < dv)
        gdn_slice(S + j0, q, k, v + j0, g, beta, o + j0, n, dk, dv, dv - j0, qk_stride, v_stride,
                  gb_stride, o_stride);
}

/* The same recurrence over a run of tokens in chunks of KVD_GDN_CHUNK, the
 * form a GPU runs in parallel (and the CPU twin of the CUDA kernel). Within
 * a chunk from state S0, with G_t the cumulative log decay,
 *   S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t - G_s} k_s d_s^T,
 *   d_t = b_t v_t - b_t e^{G_t} S0^T k_t - sum_{s<t} b_t e^{G_t - G_s} (k_t.k_s) d_s,
 * so the pseudo-values D = U - W S0, where [U | W] solves the unit lower
 * triangular system (I + A) X = [diag(b) V | diag(b e^G) K] by forward
 * substitution; then O = diag(e^G) Q S0 + mask(e^{G_t - G_s} Q K^T) D and
 * the state moves on to e^{G_C} S0 + K^T diag(e^{G_C - G}) D. */
void kvd_gdn_chunked(float *S, const float *q, const float *k, const float *v, const float *g,
                     const float *beta, float *o, int n, int dk, int dv, size_t q_stride,
                     size_t k_stride, size_t v_stride, size_t o_stride) {
    enum { C = KVD_GDN_CHUNK };
    const int w = dv + dk;
    float *X = malloc(sizeof(float) * (size_t)C * (size_t)w); /* [U | W], then D in U */
    float *kk = malloc(sizeof(float) * C * C);
    double G[C];
    for (int c0 = 0; c0 < n; c0 += C) {
        const int nc = n - c0 < C ? n - c0 : C;
        double acc = 0.0;
        for (int t = 0; t < nc; t++) G[t] = acc += g[c0 + t];
        for (int t = 0; t < nc; t++) {
            const float *kt = k + (size_t)(c0 + t) * k_stride,
                        *vt = v + (size_t)(c0 + t) * v_stride;
            float bt = beta[c0 + t], be = bt * (float)exp(G[t]);
            float *x = X + (size_t)t * w;
            for (int j = 0; j < dv; j++) x[j] = bt * vt[j];
            for (int i = 0; i < dk; i++) x[dv + i] = be * kt[i];
            for (int s = 0; s < t; s++) {
                const float *ks = k + (size_t)(c0 + s) * k_stride;
                float dot = 0.0f;
                for (int i = 0; i < dk; i++) dot += kt[i] * ks[i];
                kk[t * C + s] = dot;
            }
        }
        /* forward substitution, row by row */
        for (int t = 1; t < nc; t++) {
            float *xt = X + (size_t)t * w;
            for (int s = 0; s < t; s++) {
                float a = beta[c0 + t] * (float)exp(G[t] - G[s]) * kk[t * C + s];
                const float *xs = X + (size_t)s * w;
                for (int j = 0; j < w; j++) xt[j] -= a * xs[j];
            }
        }
        /* D = U - W S0, in place of U */
        for (int t = 0; t < nc; t++) {
            float *xt = X + (size_t)t * w;
            for (int i = 0; i < dk; i++) {
                float wi = xt[dv + i];
                const float *row = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) xt[j] -= wi * row[j];
            }
        }
        /* outputs from S0 and the chunk's own pseudo-values */
        for (int t = 0; t < nc; t++) {
            const float *qt = q + (size_t)(c0 + t) * q_stride;
            float *ot = o + (size_t)(c0 + t) * o_stride, e = (float)exp(G[t]);
            for (int j = 0; j < dv; j++) ot[j] = 0.0f;
            for (int i = 0; i < dk; i++) {
                float qi = qt[i] * e;
                const float *row = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) ot[j] += qi * row[j];
            }
            for (int s = 0; s <= t; s++) {
                const float *ks = k + (size_t)(c0 + s) * k_stride;
                float dot = 0.0f;
                for (int i = 0; i < dk; i++) dot += qt[i] * ks[i];
                float m = dot * (float)exp(G[t] - G[s]);
                const float *ds = X + (size_t)s * w;
                for (int j = 0; j < dv; j++) ot[j] += m * ds[j];
            }
        }
        /* the state at the chunk's end */
        float eC = (float)exp(G[nc - 1]);
        for (int i = 0; i < dk; i++) {
            float *row = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) row[j] *= eC;
        }
        for (int s = 0; s < nc; s++) {
            const float *ks = k + (size_t)(c0 + s) * k_stride, *ds = X + (size_t)s * w;
            float f = (float)exp(G[nc - 1] - G[s]);
            for (int i = 0; i < dk; i++) {
                float ki = ks[i] * f;
                float *row = S + (size_t)i * dv;
                for (int j = 0; j < dv; j++) row[j] += ki * ds[j];
            }
        }
    }
    free(X);
    free(kk);
}
