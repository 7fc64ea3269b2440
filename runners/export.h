/* kvdrift: export a model as a Hugging Face Qwen3-Next checkpoint directory. */
#ifndef KVD_EXPORT_H
#define KVD_EXPORT_H

#include "weights.h"

/* Writes DIR/config.json and DIR/model.safetensors (HF tensor names): BF16,
 * or (f32) the FP32 values exactly, e.g. a quantized checkpoint's weights as
 * kvdrift dequantized them. */
int kvd_export(const kvd_weights *w, const char *dir, int f32, char *err);

#endif
