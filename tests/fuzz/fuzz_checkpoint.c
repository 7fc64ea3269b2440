/* Fuzz target: a checkpoint directory as the loaders read it
 * (runners/checkpoint.c over runners/st_reader.c): a micro model's
 * config.json ($KVD_FUZZ_CONFIG, tests/fuzz/micro.json), fixed, beside the
 * fuzzed model.safetensors; the eager loader (every tensor found, its
 * shape, dtype and scales checked, FP8 and 4-bit ones dequantized) and
 * audit. Seeds: the micro model exported, and its FP8 and 4-bit forms
 * (scripts/fuzz.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runners/checkpoint.h"
#include "../../runners/config.h"
#include "../../runners/fileio.h"
#include "../../runners/weights.h"

static char dir[64];

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128], err[KVD_ERR_LEN];
    if (!dir[0]) {
        const char *cfg = getenv("KVD_FUZZ_CONFIG");
        size_t n = 0;
        char *txt = cfg ? kvd_read_file(cfg, &n, err) : NULL;
        snprintf(dir, sizeof dir, "/tmp/kvd-fuzz-ckpt-XXXXXX");
        snprintf(path, sizeof path, "%s/config.json", mkdtemp(dir) ? dir : "");
        if (!txt || write_file(path, txt, n)) {
            fprintf(stderr, "fuzz_checkpoint: set KVD_FUZZ_CONFIG to tests/fuzz/micro.json\n");
            abort();
        }
        free(txt);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (write_file(path, data, size)) return 0;
    kvd_weights w;
    if (kvd_weights_load(&w, dir, err) == 0) kvd_weights_free(&w);
    kvd_config cfg;
    kvd_audit a;
    kvd_audit_dir(dir, &cfg, &a, err);
    return 0;
}
