/* Fuzz target: safetensors headers and data ranges (runners/st_reader.c). */
#include "fuzz_common.h"

#include "../../runners/config.h"
#include "../../runners/st_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64], err[KVD_ERR_LEN];
    int fd = fuzz_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    kvd_checkpoint c = {0};
    if (kvd_st_open(&c, path, err) == 0) {
        /* every accepted tensor must be readable end to end */
        float buf[256];
        for (int i = 0; i < c.n; i++)
            if (c.t[i].numel <= 256) kvd_st_to_f32(&c.t[i], buf, err);
    }
    kvd_checkpoint_close(&c);
    close(fd);
    return 0;
}
