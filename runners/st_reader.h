/* kvdrift: reading safetensors checkpoints, memory-mapped and bounds-checked:
 * offsets inside the file, sizes matching shape x dtype, no overlapping
 * ranges, known dtypes. A truncated or hostile file is refused, never read
 * out of bounds. */
#ifndef KVD_ST_READER_H
#define KVD_ST_READER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KVD_ST_F32,
    KVD_ST_F16,
    KVD_ST_BF16,
    KVD_ST_F64,
    KVD_ST_F8_E4M3,
    KVD_ST_F8_E5M2,
    KVD_ST_I8,
    KVD_ST_U8,
    KVD_ST_I16,
    KVD_ST_I32,
    KVD_ST_I64,
    KVD_ST_BOOL,
    KVD_ST_U16,
    KVD_ST_U32,
    KVD_ST_U64,
    KVD_ST_F8_E8M0, /* a power of two: MX and UE8M0 scales */
    KVD_ST_F4,      /* E2M1, two to a byte (low nibble first) */
    KVD_ST_F6_E2M3,
    KVD_ST_F6_E3M2,
    KVD_ST_C64,
    KVD_ST_N
} kvd_st_dtype;

typedef struct {
    char name[160];
    kvd_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    int64_t numel;
    const uint8_t *data; /* into the mapping */
    size_t nbytes;
    int file; /* index of the file in the checkpoint */
} kvd_st_tensor;

typedef struct {
    char path[4096];
    void *map;
    size_t size;
    size_t header_len; /* the JSON header's bytes; the data start at 8 + header_len */
} kvd_st_file;

typedef struct {
    int n_files, cap_files;
    kvd_st_file *files;
    int n, cap;
    kvd_st_tensor *t; /* sorted by name once kvd_checkpoint_open returns */
} kvd_checkpoint;

const char *kvd_st_dtype_name(kvd_st_dtype d);

/* Sort tensors (of one file) into the order of their bytes in it. */
void kvd_st_by_offset(const kvd_st_tensor **t, size_t n);

/* Open one safetensors file into c (appending its tensors). */
int kvd_st_open(kvd_checkpoint *c, const char *path, char *err);
/* Open a checkpoint directory: model.safetensors.index.json's shards, or
 * every *.safetensors in it, as many as there are. A tensor name found in
 * two files is refused. */
int kvd_checkpoint_open(kvd_checkpoint *c, const char *dir, char *err);
void kvd_checkpoint_close(kvd_checkpoint *c);
/* The tensor of that name (binary search: a 397B MoE checkpoint holds ~10^5). */
const kvd_st_tensor *kvd_checkpoint_find(const kvd_checkpoint *c, const char *name);

/* Copy a tensor into floats (F32, F16, BF16, the FP8 formats as their
 * values; F64 narrowed); -1 with err for a dtype that holds no plain values
 * (integers, packed 4-bit codes, ...). */
int kvd_st_to_f32(const kvd_st_tensor *t, float *out, char *err);
/* The same for values first .. first + n - 1 (row-major order). */
int kvd_st_range_to_f32(const kvd_st_tensor *t, int64_t first, int64_t n, float *out, char *err);

#endif
