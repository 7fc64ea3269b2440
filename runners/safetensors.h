/* kvdrift: safetensors files: an 8-byte little-endian header length, a JSON
 * header of {name: {dtype, shape, data_offsets}}, then the raw tensor bytes. */
#ifndef KVD_SAFETENSORS_H
#define KVD_SAFETENSORS_H

#include "weights.h"

/* Write every tensor of w, atomically: as BF16 (rounded to nearest even;
 * synthetic weights are BF16 values already) or, with f32, as they are. */
int kvd_safetensors_write(const char *path, const kvd_weights *w, int f32, char *err);

#endif
