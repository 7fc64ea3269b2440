/* kvdrift: atomic HDF5 files (see h5file.h). */
#include "h5file.h"

#include <stdio.h>

#include "../runners/config.h"
#include "../runners/fileio.h"

hid_t kvd_h5_create(const char *path, char *tmp, size_t tmp_len, char *err) {
    kvd_atomic_begin(path, tmp, tmp_len);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
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
