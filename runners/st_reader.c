/* kvdrift: safetensors reader (see st_reader.h). */
#include "st_reader.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/fp8.h"
#include "config.h"

/* every dtype the safetensors format names, read or not: a checkpoint is
 * refused for a tensor of an unknown dtype, wherever it sits */
static const struct {
    const char *name;
    int bits;
} dtypes[KVD_ST_N] = {{"F32", 32},    {"F16", 16}, {"BF16", 16},   {"F64", 64},    {"F8_E4M3", 8},
                      {"F8_E5M2", 8}, {"I8", 8},   {"U8", 8},      {"I16", 16},    {"I32", 32},
                      {"I64", 64},    {"BOOL", 8}, {"U16", 16},    {"U32", 32},    {"U64", 64},
                      {"F8_E8M0", 8}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"C64", 64}};

const char *kvd_st_dtype_name(kvd_st_dtype d) {
    return (unsigned)d < KVD_ST_N ? dtypes[d].name : "?";
}

/* the header may not be larger than this: a hostile length would otherwise
 * make us allocate or read gigabytes */
#define MAX_HEADER (100u << 20)

static int cmp_begin(const void *a, const void *b) {
    const kvd_st_tensor *x = *(const kvd_st_tensor *const *)a,
                        *y = *(const kvd_st_tensor *const *)b;
    return (x->data > y->data) - (x->data < y->data);
}

void kvd_st_by_offset(const kvd_st_tensor **t, size_t n) {
    qsort(t, n, sizeof *t, cmp_begin);
}

int kvd_st_open(kvd_checkpoint *c, const char *path, char *err) {
    if (c->n_files == c->cap_files) {
        int cap = c->cap_files ? 2 * c->cap_files : 8;
        kvd_st_file *f = realloc(c->files, sizeof *f * (size_t)cap);
        if (!f) {
            snprintf(err, KVD_ERR_LEN, "%s: out of memory", path);
            return -1;
        }
        c->files = f;
        c->cap_files = cap;
    }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) {
        close(fd);
        snprintf(err, KVD_ERR_LEN, "%s: truncated: expected at least an 8-byte header length",
                 path);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    const uint8_t *p = map;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)p[i] << (8 * i);
    if (hl > MAX_HEADER || hl > size - 8) {
        munmap(map, size);
        snprintf(err, KVD_ERR_LEN,
                 "%s: header length %llu runs past the end of the %zu-byte file (truncated?)", path,
                 (unsigned long long)hl, size);
        return -1;
    }
    json_error_t je;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hl, 0, &je);
    if (!h || !json_is_object(h)) {
        munmap(map, size);
        if (h) json_decref(h);
        snprintf(err, KVD_ERR_LEN, "%s: header: expected a JSON object (%s)", path,
                 h ? "got another JSON value" : je.text);
        return -1;
    }
    int fi = c->n_files;
    const uint8_t *data = p + 8 + hl;
    size_t data_size = size - 8 - (size_t)hl;
    int first = c->n, rc = -1;
    const char *name;
    json_t *v;
    json_object_foreach(h, name, v) {
        if (!strcmp(name, "__metadata__")) continue;
        const char *dt = json_string_value(json_object_get(v, "dtype"));
        json_t *shape = json_object_get(v, "shape"), *off = json_object_get(v, "data_offsets");
        if (strlen(name) >= sizeof c->t[0].name) {
            snprintf(err, KVD_ERR_LEN, "%s: tensor name of %zu characters is too long", path,
                     strlen(name));
            goto out;
        }
        int d = -1;
        for (int k = 0; dt && k < KVD_ST_N; k++)
            if (!strcmp(dt, dtypes[k].name)) d = k;
        if (d < 0) {
            snprintf(err, KVD_ERR_LEN, "%s: tensor %s: unknown dtype %s%s%s", path, name,
                     dt ? "'" : "", dt ? dt : "(missing)", dt ? "'" : "");
            goto out;
        }
        if (!json_is_array(shape) || json_array_size(shape) > 8 || !json_is_array(off) ||
            json_array_size(off) != 2) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: tensor %s: expected a shape (at most 8 dims) and data_offsets [begin, "
                     "end]",
                     path, name);
            goto out;
        }
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 512;
            c->t = realloc(c->t, sizeof *c->t * (size_t)c->cap);
        }
        kvd_st_tensor *t = &c->t[c->n];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->dtype = (kvd_st_dtype)d;
        t->ndim = (int)json_array_size(shape);
        t->numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            json_t *e = json_array_get(shape, (size_t)k);
            json_int_t x = json_integer_value(e);
            if (!json_is_integer(e) || x < 0 || x > ((json_int_t)1 << 40) ||
                (x && t->numel > ((int64_t)1 << 50) / x)) {
                snprintf(err, KVD_ERR_LEN, "%s: tensor %s: shape[%d]: expected a size", path, name,
                         k);
                goto out;
            }
            t->shape[k] = x;
            t->numel *= x;
        }
        json_t *b0 = json_array_get(off, 0), *b1 = json_array_get(off, 1);
        json_int_t o0 = json_integer_value(b0), o1 = json_integer_value(b1);
        if (!json_is_integer(b0) || !json_is_integer(b1) || o0 < 0 || o1 < o0 ||
            (uint64_t)o1 > data_size) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: tensor %s: data_offsets [%lld, %lld] outside the %zu data bytes "
                     "(truncated or corrupt file)",
                     path, name, (long long)o0, (long long)o1, data_size);
            goto out;
        }
        t->nbytes = (size_t)(o1 - o0);
        const uint64_t bits = (uint64_t)t->numel * (uint64_t)dtypes[d].bits;
        if (bits % 8 || bits / 8 != t->nbytes) {
            snprintf(err, KVD_ERR_LEN,
                     "%s: tensor %s: %zu bytes for %lld values of %s, expected %llu%s", path, name,
                     t->nbytes, (long long)t->numel, dtypes[d].name,
                     (unsigned long long)((bits + 7) / 8),
                     bits % 8 ? " (and a whole number of bytes)" : "");
            goto out;
        }
        t->data = data + o0;
        t->file = fi;
        c->n++;
    }
    /* no two tensors may share bytes */
    {
        int n = c->n - first;
        kvd_st_tensor **s = malloc(sizeof *s * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) s[i] = &c->t[first + i];
        qsort(s, (size_t)n, sizeof *s, cmp_begin);
        for (int i = 1; i < n; i++)
            if (s[i]->data < s[i - 1]->data + s[i - 1]->nbytes) {
                snprintf(err, KVD_ERR_LEN, "%s: tensors %s and %s overlap", path, s[i - 1]->name,
                         s[i]->name);
                free(s);
                goto out;
            }
        free(s);
    }
    snprintf(c->files[fi].path, sizeof c->files[fi].path, "%s", path);
    c->files[fi].map = map;
    c->files[fi].size = size;
    c->files[fi].header_len = (size_t)hl;
    c->n_files++;
    rc = 0;
out:
    json_decref(h);
    if (rc) {
        c->n = first;
        munmap(map, size);
    }
    return rc;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const kvd_st_tensor *)a)->name, ((const kvd_st_tensor *)b)->name);
}

/* add a shard's file name once */
static int add_name(char ***names, int *n, int *cap, const char *f) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*names)[i], f)) return 0;
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        char **nn = realloc(*names, sizeof *nn * (size_t)*cap);
        if (!nn) return -1;
        *names = nn;
    }
    return ((*names)[(*n)++] = strdup(f)) ? 0 : -1;
}

int kvd_checkpoint_open(kvd_checkpoint *c, const char *dir, char *err) {
    memset(c, 0, sizeof *c);
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char **names = NULL;
    int n = 0, cap = 0, rc = -1;
    if (access(path, F_OK) == 0) {
        json_t *ix = kvd_json_load(path, err);
        if (!ix) return -1;
        json_t *wm = json_object_get(ix, "weight_map");
        if (!json_is_object(wm)) {
            json_decref(ix);
            snprintf(err, KVD_ERR_LEN, "%s: field 'weight_map': expected an object", path);
            return -1;
        }
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v) {
            const char *f = json_string_value(v);
            if (!f || strchr(f, '/')) {
                snprintf(err, KVD_ERR_LEN, "%s: weight_map[%s]: expected a file name in %s", path,
                         k, dir);
                json_decref(ix);
                goto out;
            }
            if (add_name(&names, &n, &cap, f)) {
                snprintf(err, KVD_ERR_LEN, "%s: out of memory", path);
                json_decref(ix);
                goto out;
            }
        }
        json_decref(ix);
    } else {
        DIR *d = opendir(dir);
        if (!d) {
            snprintf(err, KVD_ERR_LEN, "%s: cannot open directory: %s", dir, strerror(errno));
            return -1;
        }
        struct dirent *e;
        int oom = 0;
        while (!oom && (e = readdir(d)))
            if (ends_with(e->d_name, ".safetensors")) oom = add_name(&names, &n, &cap, e->d_name);
        closedir(d);
        if (oom) {
            snprintf(err, KVD_ERR_LEN, "%s: out of memory", dir);
            goto out;
        }
    }
    if (n == 0) {
        snprintf(err, KVD_ERR_LEN, "%s: no *.safetensors files", dir);
        goto out;
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (kvd_st_open(c, path, err)) goto out;
    }
    if (c->n) qsort(c->t, (size_t)c->n, sizeof *c->t, cmp_name);
    for (int i = 1; i < c->n; i++)
        if (!strcmp(c->t[i].name, c->t[i - 1].name)) {
            snprintf(err, KVD_ERR_LEN, "%s: tensor %s is in both %s and %s", dir, c->t[i].name,
                     c->files[c->t[i - 1].file].path, c->files[c->t[i].file].path);
            goto out;
        }
    rc = 0;
out:
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) kvd_checkpoint_close(c);
    return rc;
}

void kvd_checkpoint_close(kvd_checkpoint *c) {
    for (int i = 0; i < c->n_files; i++) munmap(c->files[i].map, c->files[i].size);
    free(c->files);
    free(c->t);
    memset(c, 0, sizeof *c);
}

const kvd_st_tensor *kvd_checkpoint_find(const kvd_checkpoint *c, const char *name) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, d = strcmp(c->t[mid].name, name);
        if (!d) return &c->t[mid];
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

static float f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, u;
    if (e == 0) {
        if (m == 0) {
            u = s;
        } else { /* subnormal: normalise */
            int sh = 0;
            while (!(m & 1024)) m <<= 1, sh++;
            u = s | ((uint32_t)(113 - sh) << 23) | ((m & 1023) << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int kvd_st_to_f32(const kvd_st_tensor *t, float *out, char *err) {
    return kvd_st_range_to_f32(t, 0, t->numel, out, err);
}

int kvd_st_range_to_f32(const kvd_st_tensor *t, int64_t first, int64_t n, float *out, char *err) {
    if (first < 0 || n < 0 || first > t->numel - n) {
        snprintf(err, KVD_ERR_LEN, "tensor %s: values %lld..%lld of %lld", t->name,
                 (long long)first, (long long)(first + n), (long long)t->numel);
        return -1;
    }
    switch (t->dtype) {
    case KVD_ST_F32:
        memcpy(out, t->data + 4 * first, (size_t)n * 4);
        return 0;
    case KVD_ST_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, t->data + 8 * (first + i), 8);
            out[i] = (float)d;
        }
        return 0;
    case KVD_ST_BF16: {
        const uint8_t *p = t->data + 2 * first;
        for (int64_t i = 0; i < n; i++)
            out[i] = kvd_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    }
    case KVD_ST_F16: {
        const uint8_t *p = t->data + 2 * first;
        for (int64_t i = 0; i < n; i++)
            out[i] = f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        return 0;
    }
    case KVD_ST_F8_E4M3:
    case KVD_ST_F8_E5M2: {
        const uint8_t *p = t->data + first;
        for (int64_t i = 0; i < n; i++)
            out[i] = t->dtype == KVD_ST_F8_E4M3 ? kvd_e4m3_to_f32(p[i]) : kvd_e5m2_to_f32(p[i]);
        return 0;
    }
    case KVD_ST_F8_E8M0: /* 2^(code - 127); 0xff is NaN */
        for (int64_t i = 0; i < n; i++) out[i] = kvd_e8m0_to_f32(t->data[first + i]);
        return 0;
    default:
        snprintf(err, KVD_ERR_LEN,
                 "tensor %s is %s: integer or packed 4-bit values are not loaded as weights "
                 "without their scales; kvdrift reads BF16, F16, F32, FP8 with scales, or packed "
                 "NVFP4 / MXFP4 with scales",
                 t->name, kvd_st_dtype_name(t->dtype));
        return -1;
    }
}
