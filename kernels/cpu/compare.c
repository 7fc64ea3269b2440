/* kvdrift: the drift figures' comparisons of a reference against a test
 * run, as the models compute them where both sides live (the CPU twins of
 * kernels/cuda/attention.cu's compare kernels). Sums in double, in order, so
 * the figures do not depend on the thread count. */
#include <math.h>
#include <stddef.h>

#include "../kernels.h"

void kvd_attn_compare(const float *p, const float *q, int n_heads, int n_ctx, double *kl,
                      int *top_p, int *top_q) {
    for (int h = 0; h < n_heads; h++) {
        const float *ph = p + (size_t)h * n_ctx, *qh = q + (size_t)h * n_ctx;
        double s = 0;
        int ap = 0, aq = 0;
        for (int t = 0; t < n_ctx; t++) {
            if (ph[t] > 0) s += ph[t] * (log((double)ph[t]) - log(fmax((double)qh[t], 1e-300)));
            if (ph[t] > ph[ap]) ap = t;
            if (qh[t] > qh[aq]) aq = t;
        }
        kl[h] = s;
        top_p[h] = ap;
        top_q[h] = aq;
    }
}

void kvd_hidden_compare(const float *a, const float *x, int rows, int n, kvd_hidden_cmp *out) {
    for (int r = 0; r < rows; r++) {
        const float *ar = a + (size_t)r * n, *xr = x + (size_t)r * n;
        double err2 = 0, ref2 = 0, dot = 0, test2 = 0;
        for (int i = 0; i < n; i++) {
            double e = (double)xr[i] - ar[i];
            err2 += e * e;
            ref2 += (double)ar[i] * ar[i];
            dot += (double)ar[i] * xr[i];
            test2 += (double)xr[i] * xr[i];
        }
        out[r] = (kvd_hidden_cmp){err2, ref2, dot, test2};
    }
}

kvd_logit_cmp kvd_compare_logits(const float *a, const float *x, int V, int target) {
    kvd_logit_cmp r;
    double ma = -INFINITY, mx = -INFINITY;
    int ia = 0, ix = 0;
    for (int i = 0; i < V; i++) {
        if (a[i] > ma) ma = a[i], ia = i;
        if (x[i] > mx) mx = x[i], ix = i;
    }
    double sa = 0, sx = 0;
    for (int i = 0; i < V; i++) sa += exp(a[i] - ma), sx += exp(x[i] - mx);
    r.lse_a = ma + log(sa);
    r.lse_x = mx + log(sx);
    double kl = 0;
    for (int i = 0; i < V; i++) {
        double pa = a[i] - r.lse_a, px = x[i] - r.lse_x;
        kl += exp(pa) * (pa - px);
    }
    r.kl = kl > 0 ? kl : 0; /* rounding can leave -1e-17 */
    r.same_argmax = ia == ix;
    r.a_target = target >= 0 && target < V ? a[target] : NAN;
    r.x_target = target >= 0 && target < V ? x[target] : NAN;
    return r;
}
