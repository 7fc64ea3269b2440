/* kvdrift: safetensors writer. Tensors go out in registry order as BF16;
 * the header is padded with spaces to a multiple of 8 bytes, as the format's
 * reference implementation does. */
#include "safetensors.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fp8.h"
#include "fileio.h"

void kvd_st_header_write(kvd_afile *a, const json_t *h) {
    char *txt = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    const size_t hl = txt ? strlen(txt) : 0, padded = (hl + 7) / 8 * 8;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    kvd_afile_write(a, len8, 8);
    kvd_afile_write(a, txt, hl);
    for (size_t i = hl; i < padded; i++) kvd_afile_write(a, " ", 1);
    free(txt);
}

int kvd_safetensors_write(const char *path, const kvd_weights *w, int f32, char *err) {
    json_t *h = json_object();
    int64_t off = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        const kvd_tensor *t = &w->tensors[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        int64_t nb = t->numel * (f32 ? 4 : 2);
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", f32 ? "F32" : "BF16", "shape",
                                      shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + nb)));
        off += nb;
    }
    json_object_set_new(h, "__metadata__",
                        json_pack("{s:s, s:s}", "format", "pt", "producer", "kvdrift export"));
    kvd_afile a;
    if (kvd_afile_open(&a, path, err)) {
        json_decref(h);
        return -1;
    }
    kvd_st_header_write(&a, h);
    json_decref(h);
    uint16_t buf[4096];
    for (int i = 0; i < w->n_tensors; i++) {
        const kvd_tensor *t = &w->tensors[i];
        if (f32) { /* the values as they are: little-endian, as every host kvdrift builds on */
            kvd_afile_write(&a, t->data, (size_t)t->numel * 4);
            continue;
        }
        for (int64_t j = 0; j < t->numel; j += 4096) {
            size_t n = (size_t)(t->numel - j < 4096 ? t->numel - j : 4096);
            kvd_quant_bf16(t->data + j, buf, n);
            /* safetensors is little-endian, as is every host kvdrift builds on */
            kvd_afile_write(&a, buf, n * 2);
        }
    }
    return kvd_afile_commit(&a, err);
}
