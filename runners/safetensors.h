/* kvdrift: safetensors files: an 8-byte little-endian header length, a JSON
 * header of {name: {dtype, shape, data_offsets}}, then the raw tensor bytes. */
#ifndef KVD_SAFETENSORS_H
#define KVD_SAFETENSORS_H

#include "weights.h"

/* Write every tensor of w as BF16 (their values are BF16 already), atomically. */
int kvd_safetensors_write_bf16(const char *path, const kvd_weights *w, char *err);

#endif
