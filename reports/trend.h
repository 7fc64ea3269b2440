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
void kvd_trend_html(kvd_buf *b, const kvd_run *runs, int n, long long ctx);
void kvd_trend_md(kvd_buf *b, const kvd_run *runs, int n, long long ctx);
void kvd_trend_csv(FILE *f, const kvd_run *runs, int n, long long ctx);

#endif
