/* Fuzz target: config.json (runners/config.c). */
#include "fuzz_common.h"

#include "../../runners/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[KVD_ERR_LEN];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    kvd_config c;
    kvd_config_load(path, &c, err);
    close(fd);
    return 0;
}
