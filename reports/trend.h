/* kvdrift: the trend over a series of runs of one sweep (`kvdrift trend`):
 * HTML (charts and a table), Markdown and CSV. */
#ifndef KVD_TREND_H
#define KVD_TREND_H

#include "report.h"

/* the most result files one trend takes (a year of nightly runs) */
#define KVD_TREND_MAX_RUNS 400

/* Orders the runs oldest first (by the time each file was written) and
 * finds the largest context every run has, in *ctx; -1 with err for fewer
 * than two runs or no such context. */
int kvd_trend_prepare(kvd_run *runs, int n, long long *ctx, char *err);

/* The trend's figures at context ctx, run by run (runs as prepared, loaded
 * light or whole): each run's per-position tables are read from its file in
 * turn and kept only while a later step needs them (each mode's first and
 * latest run with figures), so that memory holds a few runs' positions, not
 * all of them. NULL with err when a file cannot be read again. */
typedef struct kvd_trend kvd_trend;
kvd_trend *kvd_trend_build(kvd_run *runs, int n, long long ctx, char *err);
void kvd_trend_free(kvd_trend *t);

void kvd_trend_html(kvd_buf *b, const kvd_run *runs, int n, const kvd_trend *t);
void kvd_trend_md(kvd_buf *b, const kvd_run *runs, int n, const kvd_trend *t);
void kvd_trend_csv(FILE *f, const kvd_run *runs, int n, const kvd_trend *t);

#endif
