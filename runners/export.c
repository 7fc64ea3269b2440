/* kvdrift: checkpoint export: config.json with the HF field names and one
 * model.safetensors, both written atomically. */
#include "export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "safetensors.h"

int kvd_export(const kvd_weights *w, const char *dir, int f32, char *err) {
    char path[4200];
    if (kvd_mkdirs(dir, err)) return -1;
    char *cfg = kvd_config_to_json(&w->cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = kvd_write_file_atomic(path, cfg, strlen(cfg), err);
    free(cfg);
    if (rc) return -1;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return kvd_safetensors_write(path, w, f32, err);
}
