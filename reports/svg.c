/* kvdrift: SVG charts (see svg.h). Plain SVG 1.1, no scripts, fonts from the
 * reader's sans-serif; every value drawn is in the element's data-* attributes. */
#include "svg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

const char *kvd_svg_color(int i) {
    return palette[i % 10];
}

#define W 760
#define H 380
#define ML 78
#define MR 230
#define MT 40
#define MB 56

typedef struct {
    double lo, hi;
    int log;
    double px0, px1; /* pixel range */
} axis;

static double ax_map(const axis *a, double v) {
    double t = a->log ? (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo))
                      : (v - a->lo) / (a->hi - a->lo);
    return a->px0 + t * (a->px1 - a->px0);
}

/* Expand [lo, hi] to nice bounds and fill ticks (at most 12). */
static int ax_ticks(axis *a, double *t) {
    int n = 0;
    if (a->log) {
        double l0 = floor(log10(a->lo)), l1 = ceil(log10(a->hi));
        if (l1 <= l0) l1 = l0 + 1;
        a->lo = pow(10, l0), a->hi = pow(10, l1);
        int step = (int)ceil((l1 - l0) / 10.0);
        for (double e = l0; e <= l1 && n < 12; e += step) t[n++] = pow(10, e);
        return n;
    }
    if (a->hi <= a->lo) {
        double d = fabs(a->lo) > 0 ? fabs(a->lo) * 0.1 : 1;
        a->lo -= d, a->hi += d;
    }
    double raw = (a->hi - a->lo) / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
    a->lo = floor(a->lo / step) * step;
    a->hi = ceil(a->hi / step) * step;
    for (double v = a->lo; v <= a->hi + step * 1e-9 && n < 12; v += step)
        t[n++] = fabs(v) < step * 1e-9 ? 0 : v;
    return n;
}

static void fmt_num(char *buf, size_t n, double v) {
    if (v == 0) {
        snprintf(buf, n, "0");
    } else if (fabs(v) >= 1e5 || fabs(v) < 1e-3) {
        snprintf(buf, n, "%.0e", v);
    } else {
        snprintf(buf, n, "%g", v);
    }
}

static void frame(kvd_buf *b, const char *title, const char *kind) {
    kvd_buf_printf(b,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                   "viewBox=\"0 0 %d %d\" class=\"chart %s\" font-family=\"sans-serif\" "
                   "font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
                   "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"bold\">",
                   W, H, W, H, kind, W, H, ML);
    kvd_buf_xml(b, title);
    kvd_buf_puts(b, "</text>\n");
}

static void axes(kvd_buf *b, axis *x, axis *y, const char *xl, const char *yl, int x_from_data,
                 const char *const *xcat, int ncat) {
    double t[12];
    char num[32];
    int n = ax_ticks(y, t);
    for (int i = 0; i < n; i++) {
        double py = ax_map(y, t[i]);
        fmt_num(num, sizeof num, t[i]);
        kvd_buf_printf(b,
                       "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>"
                       "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" class=\"ytick\">%s</text>\n",
                       ML, py, W - MR, py, ML - 6, py + 4, num);
    }
    if (x_from_data) {
        n = ax_ticks(x, t);
        for (int i = 0; i < n; i++) {
            double px = ax_map(x, t[i]);
            fmt_num(num, sizeof num, t[i]);
            kvd_buf_printf(b,
                           "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e0e0e0\"/>"
                           "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" class=\"xtick\">%s"
                           "</text>\n",
                           px, MT, px, H - MB, px, H - MB + 16, num);
        }
    } else {
        double bw = (double)(W - ML - MR) / (ncat ? ncat : 1);
        for (int i = 0; i < ncat; i++) {
            kvd_buf_printf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" class=\"xtick\">",
                           ML + bw * (i + 0.5), H - MB + 16);
            kvd_buf_xml(b, xcat[i]);
            kvd_buf_puts(b, "</text>\n");
        }
    }
    kvd_buf_printf(b,
                   "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
                   "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
                   ML, H - MB, W - MR, H - MB, ML, MT, ML, H - MB);
    kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (ML + W - MR) / 2, H - 14);
    kvd_buf_xml(b, xl);
    kvd_buf_printf(b,
                   "</text>\n<text transform=\"translate(18 %d) rotate(-90)\" "
                   "text-anchor=\"middle\">",
                   (MT + H - MB) / 2);
    kvd_buf_xml(b, yl);
    kvd_buf_puts(b, "</text>\n");
}

static void legend(kvd_buf *b, int i, const char *label, const char *color, int dashed) {
    int y = MT + 8 + 18 * i;
    kvd_buf_printf(b,
                   "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"3\"%s/><text x=\"%d\" y=\"%d\" class=\"legend\">",
                   W - MR + 12, y, W - MR + 32, y, color, dashed ? " stroke-dasharray=\"4 3\"" : "",
                   W - MR + 38, y + 4);
    kvd_buf_xml(b, label);
    kvd_buf_puts(b, "</text>\n");
}

static int usable(double v, int log) {
    return isfinite(v) && (!log || v > 0);
}

void kvd_svg_lines(kvd_buf *b, const kvd_line_chart *c) {
    axis x = {INFINITY, -INFINITY, c->log_x, ML, W - MR},
         y = {INFINITY, -INFINITY, c->log_y, H - MB, MT};
    int skipped = 0;
    for (int s = 0; s < c->n_series; s++)
        for (int i = 0; i < c->series[s].n; i++) {
            const kvd_series *se = &c->series[s];
            if (!usable(se->x[i], x.log)) continue;
            double v[3] = {se->y[i], se->lo ? se->lo[i] : NAN, se->hi ? se->hi[i] : NAN};
            for (int k = 0; k < 3; k++) {
                if (!usable(v[k], y.log)) {
                    skipped += k == 0 && isfinite(v[0]);
                    continue;
                }
                y.lo = fmin(y.lo, v[k]), y.hi = fmax(y.hi, v[k]);
            }
            x.lo = fmin(x.lo, se->x[i]), x.hi = fmax(x.hi, se->x[i]);
        }
    frame(b, c->title, "lines");
    if (!(x.lo <= x.hi) || !(y.lo <= y.hi)) {
        kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\">no data to plot</text>\n</svg>\n", ML, H / 2);
        return;
    }
    if (!c->log_y && y.lo > 0 && y.lo < 0.5 * y.hi) y.lo = 0;
    axes(b, &x, &y, c->xlabel, c->ylabel, 1, NULL, 0);
    for (int s = 0; s < c->n_series; s++) {
        const kvd_series *se = &c->series[s];
        const char *col = kvd_svg_color(se->color > 0 ? se->color - 1 : s);
        if (se->lo && se->hi) { /* the 95% band */
            kvd_buf_printf(b, "<polygon class=\"band\" fill=\"%s\" fill-opacity=\"0.15\" points=\"",
                           col);
            for (int i = 0; i < se->n; i++)
                if (usable(se->x[i], x.log) && usable(se->hi[i], y.log))
                    kvd_buf_printf(b, "%.1f,%.1f ", ax_map(&x, se->x[i]), ax_map(&y, se->hi[i]));
            for (int i = se->n - 1; i >= 0; i--)
                if (usable(se->x[i], x.log) && usable(se->lo[i], y.log))
                    kvd_buf_printf(b, "%.1f,%.1f ", ax_map(&x, se->x[i]), ax_map(&y, se->lo[i]));
            kvd_buf_puts(b, "\"/>\n");
        }
        if (!se->points_only) {
            kvd_buf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                           col);
            for (int i = 0; i < se->n; i++)
                if (usable(se->x[i], x.log) && usable(se->y[i], y.log))
                    kvd_buf_printf(b, "%.1f,%.1f ", ax_map(&x, se->x[i]), ax_map(&y, se->y[i]));
            kvd_buf_puts(b, "\"/>\n");
        }
        for (int i = 0; i < se->n; i++) {
            if (!usable(se->x[i], x.log) || !usable(se->y[i], y.log)) continue;
            kvd_buf_printf(b,
                           "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"%s\" fill=\"%s\" "
                           "data-series=\"",
                           ax_map(&x, se->x[i]), ax_map(&y, se->y[i]), se->points_only ? "5" : "3",
                           col);
            kvd_buf_xml(b, se->label);
            kvd_buf_printf(b, "\" data-x=\"%.17g\" data-y=\"%.17g\"", se->x[i], se->y[i]);
            if (se->lo && se->hi) /* the band's edges at this point */
                kvd_buf_printf(b, " data-lo=\"%.17g\" data-hi=\"%.17g\"", se->lo[i], se->hi[i]);
            kvd_buf_puts(b, "><title>");
            kvd_buf_xml(b, se->label);
            kvd_buf_printf(b, ": %g, %g</title></circle>\n", se->x[i], se->y[i]);
        }
        legend(b, s, se->label, col, 0);
    }
    if (skipped)
        kvd_buf_printf(b,
                       "<text x=\"%d\" y=\"%d\" font-size=\"11\" fill=\"#555\">%d zero or "
                       "negative values not shown on the log axis</text>\n",
                       ML + 6, MT + 14, skipped);
    kvd_buf_puts(b, "</svg>\n");
}

static const char *bar_color(const kvd_bar_chart *c, int s) {
    return kvd_svg_color(c->colors && c->colors[s] > 0 ? c->colors[s] - 1 : s);
}

void kvd_svg_bars(kvd_buf *b, const kvd_bar_chart *c) {
    axis x = {0, 1, 0, ML, W - MR}, y = {c->log_y ? INFINITY : 0, -INFINITY, c->log_y, H - MB, MT};
    for (int i = 0; i < c->n_series * c->n_groups; i++)
        if (usable(c->values[i], y.log))
            y.lo = fmin(y.lo, c->values[i]), y.hi = fmax(y.hi, c->values[i]);
    frame(b, c->title, "bars");
    if (!(y.lo <= y.hi)) {
        kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\">no data to plot</text>\n</svg>\n", ML, H / 2);
        return;
    }
    if (y.hi == y.lo && !y.log) y.hi = y.lo + 1;
    axes(b, &x, &y, "", c->ylabel, 0, c->groups, c->n_groups);
    double gw = (double)(W - ML - MR) / c->n_groups, bw = gw * 0.8 / c->n_series;
    double base = y.log ? y.lo : 0;
    for (int s = 0; s < c->n_series; s++) {
        for (int g = 0; g < c->n_groups; g++) {
            double v = c->values[(size_t)s * c->n_groups + g];
            if (!usable(v, y.log)) continue;
            double x0 = ML + gw * g + gw * 0.1 + bw * s, y0 = ax_map(&y, v), yb = ax_map(&y, base);
            kvd_buf_printf(
                b,
                "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                "fill=\"%s\" data-series=\"",
                x0, fmin(y0, yb), bw * 0.95, fabs(yb - y0), bar_color(c, s));
            kvd_buf_xml(b, c->labels[s]);
            kvd_buf_puts(b, "\" data-group=\"");
            kvd_buf_xml(b, c->groups[g]);
            kvd_buf_printf(b, "\" data-y=\"%.17g\"><title>", v);
            kvd_buf_xml(b, c->labels[s]);
            kvd_buf_printf(b, ": %g</title></rect>\n", v);
        }
        legend(b, s, c->labels[s], bar_color(c, s), 0);
    }
    kvd_buf_puts(b, "</svg>\n");
}

/* light yellow -> orange -> dark red */
static void heat_color(double t, char *out, size_t n) {
    static const double stops[4][3] = {
        {255, 255, 204}, {253, 174, 97}, {215, 48, 39}, {103, 0, 13}};
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double p = t * 3;
    int i = p >= 3 ? 2 : (int)p;
    double f = p - i;
    snprintf(out, n, "#%02x%02x%02x", (int)(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
             (int)(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
             (int)(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
}

void kvd_svg_heatmap(kvd_buf *b, const kvd_heatmap *h) {
    double lo = h->lo, hi = h->hi;
    if (!(lo < hi)) {
        lo = INFINITY, hi = -INFINITY;
        for (int i = 0; i < h->rows * h->cols; i++)
            if (isfinite(h->v[i]) && h->v[i] > 0) lo = fmin(lo, h->v[i]), hi = fmax(hi, h->v[i]);
    }
    const int HL = 130; /* room for "layer 59 (attn)" */
    int cw = (W - HL - MR) / (h->cols ? h->cols : 1), rh = (H - MT - MB) / (h->rows ? h->rows : 1);
    if (cw > 48) cw = 48;
    if (rh > 28) rh = 28;
    int hh = MT + rh * h->rows + MB;
    kvd_buf_printf(b,
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                   "viewBox=\"0 0 %d %d\" class=\"chart heatmap\" font-family=\"sans-serif\" "
                   "font-size=\"12\" data-lo=\"%.17g\" data-hi=\"%.17g\">\n<rect width=\"%d\" "
                   "height=\"%d\" fill=\"white\"/>\n<text x=\"%d\" y=\"22\" font-size=\"15\" "
                   "font-weight=\"bold\">",
                   W, hh, W, hh, lo, hi, W, hh, HL - 60);
    kvd_buf_xml(b, h->title);
    kvd_buf_puts(b, "</text>\n");
    int logscale = lo < hi && hi / lo > 20;
    char col[16];
    for (int r = 0; r < h->rows; r++) {
        int y = MT + r * rh;
        kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" class=\"ytick\">", HL - 16,
                       y + rh / 2 + 4);
        kvd_buf_xml(b, h->row_labels[r]);
        kvd_buf_puts(b, "</text>\n");
        if (h->row_mark && h->row_mark[r])
            kvd_buf_printf(b,
                           "<rect x=\"%d\" y=\"%d\" width=\"8\" height=\"%d\" fill=\"#1f77b4\" "
                           "class=\"mark\"/>\n",
                           HL - 12, y + 2, rh - 4);
        for (int cix = 0; cix < h->cols; cix++) {
            double v = h->v[(size_t)r * h->cols + cix];
            int x = HL + cix * cw;
            if (!isfinite(v)) {
                snprintf(col, sizeof col, "#eeeeee");
            } else if (v == 0) {
                snprintf(col, sizeof col, "#ffffff"); /* exactly no drift */
            } else {
                double t = !(lo < hi) ? (v > 0 ? 1 : 0)
                           : logscale
                               ? (v > 0 ? (log10(v) - log10(lo)) / (log10(hi) - log10(lo)) : 0)
                               : (v - lo) / (hi - lo);
                heat_color(t, col, sizeof col);
            }
            kvd_buf_printf(b,
                           "<rect class=\"cell\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                           "fill=\"%s\" stroke=\"white\" data-row=\"%d\" data-col=\"%d\" "
                           "data-v=\"%.17g\"><title>",
                           x, y, cw, rh, col, r, cix, v);
            kvd_buf_xml(b, h->row_labels[r]);
            kvd_buf_puts(b, ", ");
            kvd_buf_xml(b, h->col_labels[cix]);
            kvd_buf_printf(b, ": %g</title></rect>\n", v);
        }
    }
    for (int cix = 0; cix < h->cols; cix++) {
        if (h->cols > 12 && cix % 2) continue;
        kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" class=\"xtick\">",
                       HL + cix * cw + cw / 2, MT + rh * h->rows + 16);
        kvd_buf_xml(b, h->col_labels[cix]);
        kvd_buf_puts(b, "</text>\n");
    }
    kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", HL + cw * h->cols / 2,
                   hh - 12);
    kvd_buf_xml(b, h->xlabel);
    kvd_buf_puts(b, "</text>\n");
    /* colour scale */
    int lx = HL + cw * h->cols + 30;
    for (int i = 0; i < 10; i++) {
        heat_color(1.0 - i / 9.0, col, sizeof col);
        kvd_buf_printf(b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", lx,
                       MT + i * 14, col);
    }
    char a[32], z[32];
    fmt_num(a, sizeof a, isfinite(hi) ? hi : 0);
    fmt_num(z, sizeof z, isfinite(lo) ? lo : 0);
    kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\">%s</text><text x=\"%d\" y=\"%d\">%s</text>\n",
                   lx + 20, MT + 11, a, lx + 20, MT + 9 * 14 + 11, z);
    kvd_buf_printf(b, "<text x=\"%d\" y=\"%d\" font-size=\"11\">", lx, MT + 10 * 14 + 16);
    kvd_buf_xml(b, h->unit);
    kvd_buf_printf(b, "%s</text>\n", logscale ? " (log scale)" : "");
    if (h->mark_label) {
        kvd_buf_printf(b,
                       "<rect x=\"%d\" y=\"%d\" width=\"8\" height=\"14\" fill=\"#1f77b4\"/>"
                       "<text x=\"%d\" y=\"%d\" font-size=\"11\">",
                       lx, MT + 10 * 14 + 28, lx + 12, MT + 10 * 14 + 39);
        kvd_buf_xml(b, h->mark_label);
        kvd_buf_puts(b, "</text>\n");
    }
    kvd_buf_puts(b, "</svg>\n");
}
