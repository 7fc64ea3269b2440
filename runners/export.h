/* kvdrift: export a model as a Hugging Face Qwen3-Next checkpoint directory. */
#ifndef KVD_EXPORT_H
#define KVD_EXPORT_H

#include "weights.h"

/* Writes DIR/config.json and DIR/model.safetensors (BF16, HF tensor names). */
int kvd_export(const kvd_weights *w, const char *dir, char *err);

#endif
