/* kvdrift: atomic HDF5 files (see h5file.h). */
#include "h5file.h"

#include <stdio.h>
#include <string.h>

#include "../runners/config.h"
#include "../runners/fileio.h"

/* The root attribute "format" of an existing HDF5 file into fmt ("" when
 * it has none); -1 when path is not an HDF5 file. */
static int h5_format(const char *path, char *fmt, size_t n) {
    fmt[0] = 0;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) return -1;
    if (H5Aexists(f, "format") > 0) {
        hid_t a = H5Aopen(f, "format", H5P_DEFAULT), t = H5Aget_type(a), mt = H5Tcopy(H5T_C_S1);
        if (H5Tget_class(t) == H5T_STRING) {
            if (H5Tis_variable_str(t) > 0) {
                char *v = NULL;
                H5Tset_size(mt, H5T_VARIABLE);
                if (H5Aread(a, mt, &v) >= 0 && v) snprintf(fmt, n, "%s", v);
                if (v) H5free_memory(v);
            } else if (H5Tget_size(t) < n) {
                H5Tset_size(mt, n);
                if (H5Aread(a, mt, fmt) < 0) fmt[0] = 0;
            }
        }
        H5Tclose(mt), H5Tclose(t), H5Aclose(a);
    }
    H5Fclose(f);
    return 0;
}

hid_t kvd_h5_create(const char *path, const char *format, char *tmp, size_t tmp_len, char *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* replace a file of the same kind (a rerun), never another HDF5 file: a
     * trace set over a sweep's results is a mistyped -o */
    char was[64];
    if (h5_format(path, was, sizeof was) == 0 && strcmp(was, format)) {
        snprintf(err, KVD_ERR_LEN,
                 "%s: an HDF5 file of another kind (format %s%s%s) is there, not a %s file: "
                 "choose another name",
                 path, was[0] ? "\"" : "", was[0] ? was : "none", was[0] ? "\"" : "", format);
        return -1;
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
