/* kvdrift: atomic HDF5 files (see h5file.h). */
#include "h5file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/config.h"
#include "../runners/fileio.h"

char *kvd_h5_root_string(hid_t f, const char *name) {
    if (H5Aexists(f, name) <= 0) return NULL;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    if (a < 0) return NULL;
    hid_t t = H5Aget_type(a), sp = H5Aget_space(a), mt = H5Tcopy(H5T_C_S1);
    char *out = NULL;
    if (H5Tget_class(t) == H5T_STRING && H5Sget_simple_extent_npoints(sp) == 1) {
        H5Tset_cset(mt, H5Tget_cset(t));
        if (H5Tis_variable_str(t) > 0) {
            char *v = NULL;
            H5Tset_size(mt, H5T_VARIABLE);
            if (H5Aread(a, mt, &v) >= 0 && v) out = strdup(v);
            if (v) H5free_memory(v);
        } else {
            size_t n = H5Tget_size(t);
            H5Tset_size(mt, n + 1);
            out = calloc(n + 2, 1);
            if (out && H5Aread(a, mt, out) < 0) free(out), out = NULL;
        }
    }
    H5Tclose(mt), H5Sclose(sp), H5Tclose(t), H5Aclose(a);
    return out;
}

int kvd_h5_check_format(hid_t f, const char *path, const char *format, char *err) {
    char *was = kvd_h5_root_string(f, "format");
    int ok = was && !strcmp(was, format);
    if (!ok)
        snprintf(err, KVD_ERR_LEN, "%s: attribute 'format': expected \"%s\", got %s%s%s", path,
                 format, was ? "\"" : "", was ? was : "none", was ? "\"" : "");
    free(was);
    return ok ? 0 : -1;
}

hid_t kvd_h5_create(const char *path, const char *format, char *tmp, size_t tmp_len, char *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* replace a file of the same kind (a rerun), never another HDF5 file: a
     * trace set over a sweep's results is a mistyped -o */
    hid_t old = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (old >= 0) {
        char *was = kvd_h5_root_string(old, "format");
        H5Fclose(old);
        if (!was || strcmp(was, format)) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: an HDF5 file of another kind (format %s%s%s) is there, not a %s file: "
                     "choose another name",
                     path, was ? "\"" : "", was ? was : "none", was ? "\"" : "", format);
            free(was);
            return -1;
        }
        free(was);
    }
    kvd_atomic_begin(path, tmp, tmp_len);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        kvd_atomic_end(tmp, path, 0, err); /* forget the temporary */
        snprintf(err, KVD_ERR_LEN, "%s: cannot create", path);
    }
    return f;
}

int kvd_h5_commit(hid_t f, const char *tmp, const char *path, int ok, char *err) {
    ok &= H5Fclose(f) >= 0;
    return kvd_atomic_end(tmp, path, ok, err);
}
