/* kvdrift: output files that are never left half-written. Writers go to a
 * temporary file beside the target and rename it into place on commit. */
#ifndef KVD_FILEIO_H
#define KVD_FILEIO_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4096];
    int failed;
} kvd_afile;

/* Whether a file (not HDF5) could be written at path, asked before the work
 * that makes it: not a directory, not an HDF5 file (results or traces named
 * by mistake), in a directory that exists and can be written; -1 with err. */
int kvd_output_check(const char *path, char *err);

int kvd_afile_open(kvd_afile *a, const char *path, char *err);
int kvd_afile_write(kvd_afile *a, const void *p, size_t n);
/* Flush, fsync and rename into place; 0 on success, -1 (file removed) on error. */
int kvd_afile_commit(kvd_afile *a, char *err);
void kvd_afile_abort(kvd_afile *a);

/* For writers that open the file themselves (HDF5): the temporary name to
 * write (registered for Ctrl-C), then either rename it into place (ok) or
 * remove it; -1 with err when the write or the rename failed. */
void kvd_atomic_begin(const char *path, char *tmp, size_t n);
int kvd_atomic_end(const char *tmp, const char *path, int ok, char *err);

int kvd_write_file_atomic(const char *path, const void *data, size_t n, char *err);

/* The temporary file a writer is filling right now (NULL: none). Ctrl-C and
 * SIGTERM remove it before the process ends (kvd_tmp_guard installs the
 * handlers), so an interrupted command leaves neither a half-written output
 * nor a stray temporary; the output itself is only ever renamed into place. */
void kvd_tmp_set(const char *tmp_path);
void kvd_tmp_guard(void);
/* Remove OUT.tmp.PID files whose process is gone (a SIGKILL's leftovers). */
void kvd_tmp_sweep(const char *out_path);

/* Whole file into memory (NUL-terminated); NULL with err on failure. */
char *kvd_read_file(const char *path, size_t *n, char *err);

/* mkdir -p */
int kvd_mkdirs(const char *path, char *err);

#endif
