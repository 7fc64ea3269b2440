/* Fuzz target: the CSV readers: trace import (datasets/tracefile.c) and
 * compare's thresholds (reports/compare.c). */
#include <stdlib.h>

#include "fuzz_common.h"

#include "../../datasets/trace.h"
#include "../../reports/report.h"
#include "../../runners/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[KVD_ERR_LEN];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    kvd_trace t;
    if (kvd_trace_import_csv(path, 1000, &t, err) == 0) kvd_trace_free(&t);
    if (kvd_trace_import_text(path, 1000, &t, err) == 0) kvd_trace_free(&t);
    kvd_threshold *th;
    int n;
    if (kvd_thresholds_load(path, &th, &n, err) == 0) free(th);
    close(fd);
    return 0;
}
