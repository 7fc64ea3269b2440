/* kvdrift: HDF5 files written whole or not at all: created as a temporary
 * beside the destination, renamed over it only when every write succeeded
 * (runners/fileio's atomic writes, for HDF5). */
#ifndef KVD_H5FILE_H
#define KVD_H5FILE_H

#include <hdf5.h>
#include <stddef.h>

/* A string attribute of f's root group, fixed-length (as kvdrift writes
 * them) or variable-length (as h5py does); malloc'd, NULL when absent or not
 * one string. */
char *kvd_h5_root_string(hid_t f, const char *name);
/* 0 when f's root attribute "format" is `format`; else -1 with err naming
 * path and what the attribute holds. */
int kvd_h5_check_format(hid_t f, const char *path, const char *format, char *err);

/* Create the temporary for path (its name into tmp, tmp_len bytes) with
 * HDF5's own error printing off; < 0 with err set when it cannot be made, or
 * when path is an HDF5 file whose root "format" is not `format` (the file
 * about to be written: another kind is never replaced). */
hid_t kvd_h5_create(const char *path, const char *format, char *tmp, size_t tmp_len, char *err);
/* Close f; rename the temporary over path when ok and the close succeeded,
 * else remove it. 0 when path now holds the file. */
int kvd_h5_commit(hid_t f, const char *tmp, const char *path, int ok, char *err);

#endif
