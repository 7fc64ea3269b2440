/* kvdrift: safetensors files: an 8-byte little-endian header length, a JSON
 * header of {name: {dtype, shape, data_offsets}}, then the raw tensor bytes. */
#ifndef KVD_SAFETENSORS_H
#define KVD_SAFETENSORS_H

#include <jansson.h>

#include "fileio.h"
#include "weights.h"

/* A header h ({name: {dtype, shape, data_offsets}}, "__metadata__") as the
 * file begins: its length, then the JSON padded with spaces to a multiple
 * of 8 bytes; the tensors' bytes follow. */
void kvd_st_header_write(kvd_afile *a, const json_t *h);

/* Write every tensor of w, atomically: as BF16 (rounded to nearest even;
 * synthetic weights are BF16 values already) or, with f32, as they are. */
int kvd_safetensors_write(const char *path, const kvd_weights *w, int f32, char *err);

#endif
