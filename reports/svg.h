/* kvdrift: charts drawn as inline SVG: line charts with bands (linear or
 * log axes), grouped bars, heatmaps. Every plotted point carries its value
 * in data-x / data-y attributes, so a test can hold the picture to the file. */
#ifndef KVD_SVG_H
#define KVD_SVG_H

#include "buf.h"

#define KVD_SVG_MAX_SERIES 24

typedef struct {
    const char *label;
    int n;
    const double *x, *y;
    const double *lo, *hi; /* optional band (NULL: none) */
    int points_only;       /* a scatter: markers, no line */
    int color;             /* 1 + a palette index, to keep a mode's colour from chart to
                              chart; 0: the series' own index */
} kvd_series;

typedef struct {
    const char *title, *xlabel, *ylabel;
    int log_x, log_y;
    int n_series;
    kvd_series series[KVD_SVG_MAX_SERIES];
} kvd_line_chart;

void kvd_svg_lines(kvd_buf *b, const kvd_line_chart *c);

typedef struct {
    const char *title, *ylabel;
    int log_y;
    int n_groups, n_series;
    const char *const *groups; /* [n_groups] */
    const char *const *labels; /* [n_series] */
    const double *values;      /* [n_series][n_groups], NAN = missing */
    const int *colors;         /* [n_series]: 1 + a palette index (NULL, or 0: by series) */
} kvd_bar_chart;

void kvd_svg_bars(kvd_buf *b, const kvd_bar_chart *c);

typedef struct {
    const char *title, *xlabel, *ylabel, *unit;
    int rows, cols;
    const double *v;               /* [rows][cols], NAN = no data */
    const char *const *row_labels; /* [rows] */
    const char *const *col_labels; /* [cols] */
    const int *row_mark;           /* [rows]: 1 draws a marker beside the row (NULL: none) */
    const char *mark_label;
    double lo, hi; /* the colour scale's ends, to share one over several maps (lo < hi);
                      else the map's own smallest non-zero and largest values */
} kvd_heatmap;

void kvd_svg_heatmap(kvd_buf *b, const kvd_heatmap *h);

/* A colour of the palette, by series index. */
const char *kvd_svg_color(int i);

#endif
