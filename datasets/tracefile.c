/* kvdrift: trace files (HDF5) and imports of user traces (plain token ids,
 * CSV through libcsv). Layout, documented in docs/trace-format.md:
 *   /                 attrs format = "kvdrift-trace", version = 1
 *   /traces/NAME/tokens      uint32 [n]
 *   /traces/NAME/segments    compound {start int64, length int64, kind int32} [n_segs]
 *   /traces/NAME/references  compound {pos int64, src int64} [n_refs]
 *   /traces/NAME             attrs spec (JSON), segment_kinds (names, comma separated) */
#include <csv.h>
#include <errno.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runners/config.h"
#include "../runners/fileio.h"
#include "h5file.h"
#include "trace.h"

#define TRACE_FORMAT "kvdrift-trace"
#define TRACE_VERSION 1

static hid_t seg_type(void) {
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(kvd_segment));
    H5Tinsert(t, "start", HOFFSET(kvd_segment, start), H5T_NATIVE_INT64);
    H5Tinsert(t, "length", HOFFSET(kvd_segment, length), H5T_NATIVE_INT64);
    H5Tinsert(t, "kind", HOFFSET(kvd_segment, kind), H5T_NATIVE_INT32);
    return t;
}

static hid_t ref_type(void) {
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(kvd_reference));
    H5Tinsert(t, "pos", HOFFSET(kvd_reference, pos), H5T_NATIVE_INT64);
    H5Tinsert(t, "src", HOFFSET(kvd_reference, src), H5T_NATIVE_INT64);
    return t;
}

static int write_1d(hid_t g, const char *name, hid_t type, hsize_t n, const void *data) {
    hsize_t dims[1] = {n}, chunk[1] = {n < 65536 ? (n ? n : 1) : 65536};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t pl = H5Pcreate(H5P_DATASET_CREATE);
    if (n > 0) H5Pset_chunk(pl, 1, chunk);
    hid_t ds = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    herr_t rc = ds < 0 ? -1 : (n ? H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0);
    if (ds >= 0) H5Dclose(ds);
    H5Pclose(pl);
    H5Sclose(sp);
    return rc < 0 ? -1 : 0;
}

int kvd_trace_save(const char *path, const kvd_trace *traces, int n, char *err) {
    char tmp[4200];
    hid_t f = kvd_h5_create(path, TRACE_FORMAT, tmp, sizeof tmp, err);
    if (f < 0) return -1;
    int rc = 0;
    rc |= H5LTset_attribute_string(f, "/", "format", TRACE_FORMAT) < 0;
    int ver = TRACE_VERSION;
    rc |= H5LTset_attribute_int(f, "/", "version", &ver, 1) < 0;
    hid_t root = H5Gcreate2(f, "traces", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hid_t st = seg_type(), rt = ref_type();
    char kinds[512] = "";
    for (int k = 0; k < KVD_SEG_N; k++) {
        strcat(kinds, kvd_seg_name((kvd_seg_kind)k));
        if (k + 1 < KVD_SEG_N) strcat(kinds, ",");
    }
    for (int i = 0; !rc && i < n; i++) {
        const kvd_trace *t = &traces[i];
        char name[80];
        snprintf(name, sizeof name, "%04d-%s", i, t->name);
        hid_t g = H5Gcreate2(root, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc |= g < 0;
        rc |= write_1d(g, "tokens", H5T_NATIVE_UINT32, (hsize_t)t->n, t->tokens);
        rc |= write_1d(g, "segments", st, (hsize_t)t->n_segs, t->segs);
        rc |= write_1d(g, "references", rt, (hsize_t)t->n_refs, t->refs);
        char *spec = kvd_trace_spec_json(&t->spec);
        rc |= H5LTset_attribute_string(root, name, "spec", spec) < 0;
        rc |= H5LTset_attribute_string(root, name, "segment_kinds", kinds) < 0;
        free(spec);
        if (g >= 0) H5Gclose(g);
    }
    H5Tclose(st);
    H5Tclose(rt);
    H5Gclose(root);
    return kvd_h5_commit(f, tmp, path, !rc, err);
}

typedef struct {
    kvd_trace *t;
    int cap, n;
    const char *path;
    char *err;
    int failed;
} load_ctx;

static int read_1d(hid_t g, const char *name, hid_t type, size_t elem, void **out, int64_t *n) {
    hid_t ds = H5Dopen2(g, name, H5P_DEFAULT);
    if (ds < 0) return -1;
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[1] = {0};
    int ok = H5Sget_simple_extent_ndims(sp) == 1 && H5Sget_simple_extent_dims(sp, dims, NULL) == 1;
    *n = (int64_t)dims[0];
    *out = malloc(elem * (dims[0] ? dims[0] : 1));
    if (ok && dims[0] && H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, *out) < 0) ok = 0;
    H5Sclose(sp);
    H5Dclose(ds);
    return ok ? 0 : -1;
}

static herr_t load_one(hid_t root, const char *name, const H5L_info_t *info, void *data) {
    (void)info;
    load_ctx *c = data;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 4;
        c->t = realloc(c->t, (size_t)c->cap * sizeof *c->t);
    }
    kvd_trace *t = &c->t[c->n];
    memset(t, 0, sizeof *t);
    const char *dash = strchr(name, '-');
    snprintf(t->name, sizeof t->name, "%s", dash ? dash + 1 : name);
    hid_t g = H5Gopen2(root, name, H5P_DEFAULT);
    hid_t st = seg_type(), rt = ref_type();
    void *tok = NULL, *seg = NULL, *ref = NULL;
    int bad = g < 0 || read_1d(g, "tokens", H5T_NATIVE_UINT32, 4, &tok, &t->n) ||
              read_1d(g, "segments", st, sizeof(kvd_segment), &seg, &t->n_segs) ||
              read_1d(g, "references", rt, sizeof(kvd_reference), &ref, &t->n_refs);
    t->tokens = tok;
    t->segs = seg;
    t->refs = ref;
    H5Tclose(st);
    H5Tclose(rt);
    char spec[4096] = "";
    hsize_t dims;
    H5T_class_t cls;
    size_t sz = 0;
    if (!bad && H5LTget_attribute_info(root, name, "spec", &dims, &cls, &sz) >= 0 &&
        sz < sizeof spec && H5LTget_attribute_string(root, name, "spec", spec) >= 0) {
        char e2[KVD_ERR_LEN];
        bad = kvd_trace_spec_from_json(spec, &t->spec, e2) != 0;
    } else {
        bad = 1;
    }
    if (g >= 0) H5Gclose(g);
    c->n++;
    if (bad) {
        snprintf(c->err, KVD_ERR_LEN,
                 "%s: trace '%s': expected tokens, segments, references and "
                 "a spec attribute (truncated or not a kvdrift trace file?)",
                 c->path, name);
        c->failed = 1;
        return 1;
    }
    /* the labels must describe this token stream */
    for (int64_t i = 0; i < t->n_refs; i++) {
        const kvd_reference *r = &t->refs[i];
        if (r->pos < 0 || r->pos >= t->n || r->src < 0 || r->src >= r->pos ||
            t->tokens[r->pos] != t->tokens[r->src]) {
            snprintf(c->err, KVD_ERR_LEN,
                     "%s: trace '%s': references[%lld] (pos %lld, src %lld): expected an earlier "
                     "position holding the same token",
                     c->path, name, (long long)i, (long long)r->pos, (long long)r->src);
            c->failed = 1;
            return 1;
        }
    }
    for (int64_t i = 0; i < t->n; i++)
        if (t->tokens[i] >= (uint64_t)t->spec.vocab_size) {
            snprintf(c->err, KVD_ERR_LEN,
                     "%s: trace '%s': tokens[%lld] = %u, expected < vocab_size %lld", c->path, name,
                     (long long)i, t->tokens[i], (long long)t->spec.vocab_size);
            c->failed = 1;
            return 1;
        }
    return 0;
}

int kvd_trace_load(const char *path, kvd_trace **traces, int *n, char *err) {
    *traces = NULL;
    *n = 0;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (access(path, R_OK) != 0) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        snprintf(err, KVD_ERR_LEN, "%s: not a readable HDF5 file (truncated or corrupt?)", path);
        return -1;
    }
    if (kvd_h5_check_format(f, path, TRACE_FORMAT, err)) {
        H5Fclose(f);
        return -1;
    }
    load_ctx c = {NULL, 0, 0, path, err, 0};
    hid_t root = H5Gopen2(f, "traces", H5P_DEFAULT);
    herr_t it = root < 0 ? -1 : H5Literate(root, H5_INDEX_NAME, H5_ITER_INC, NULL, load_one, &c);
    if (root >= 0) H5Gclose(root);
    H5Fclose(f);
    if (it < 0 || c.failed || c.n == 0) {
        if (!c.failed)
            snprintf(err, KVD_ERR_LEN, "%s: group /traces: expected one or more traces", path);
        for (int i = 0; i < c.n; i++) kvd_trace_free(&c.t[i]);
        free(c.t);
        return -1;
    }
    *traces = c.t;
    *n = c.n;
    return 0;
}

/* ---- imports ---- */

typedef struct {
    kvd_trace *t;
    int64_t cap, cap_segs, vocab;
    const char *path;
    char *err;
    int failed;
    long line;
    int col;
    char id[64], kind[64];
    int header_checked;
} import_ctx;

static void push(import_ctx *c, const char *idtxt, const char *kindtxt) {
    if (c->failed) return;
    char *end;
    errno = 0;
    long long v = strtoll(idtxt, &end, 10);
    if (errno || end == idtxt || *end || v < 0) {
        /* a text import has no columns: whitespace-separated ids */
        snprintf(c->err, KVD_ERR_LEN,
                 "%s:%ld: %sexpected a non-negative integer token id, got '%s'", c->path, c->line,
                 kindtxt ? "column 'id': " : "", idtxt);
        c->failed = 1;
        return;
    }
    if (v >= c->vocab) {
        snprintf(c->err, KVD_ERR_LEN, "%s:%ld: token id %lld: expected < vocab size %lld", c->path,
                 c->line, v, (long long)c->vocab);
        c->failed = 1;
        return;
    }
    kvd_seg_kind k = KVD_SEG_IMPORTED;
    if (kindtxt && *kindtxt && kvd_seg_parse(kindtxt, &k)) {
        snprintf(c->err, KVD_ERR_LEN,
                 "%s:%ld: column 'segment': unknown segment kind '%s' (expected system, user, "
                 "reasoning, tool_call, file, search, test_log, diff, edit)",
                 c->path, c->line, kindtxt);
        c->failed = 1;
        return;
    }
    kvd_trace *t = c->t;
    if (t->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 65536;
        t->tokens = realloc(t->tokens, sizeof(uint32_t) * (size_t)c->cap);
    }
    t->tokens[t->n++] = (uint32_t)v;
    /* consecutive tokens of one kind form a segment */
    if (t->n_segs && t->segs[t->n_segs - 1].kind == (int32_t)k) {
        t->segs[t->n_segs - 1].length++;
        return;
    }
    if (t->n_segs == c->cap_segs) {
        c->cap_segs = c->cap_segs ? 2 * c->cap_segs : 64;
        t->segs = realloc(t->segs, sizeof(kvd_segment) * (size_t)c->cap_segs);
    }
    t->segs[t->n_segs++] = (kvd_segment){t->n - 1, 1, (int32_t)k};
}

/* The common end of an import: refuse an empty or failed one, else label it. */
static int finish_import(kvd_trace *t, int64_t vocab, const char *path, int failed,
                         const char *what, char *err) {
    if (!failed && t->n == 0) {
        snprintf(err, KVD_ERR_LEN, "%s: expected at least one %s", path, what);
        failed = 1;
    }
    if (failed) {
        kvd_trace_free(t);
        return -1;
    }
    kvd_trace_spec_defaults(&t->spec);
    snprintf(t->spec.kind, sizeof t->spec.kind, "imported");
    t->spec.length = t->n;
    t->spec.vocab_size = vocab;
    t->spec.seed = 0;
    const char *base = strrchr(path, '/');
    snprintf(t->name, sizeof t->name, "%s", base ? base + 1 : path);
    for (char *p = t->name; *p; p++)
        if (*p == '/' || *p == '.') *p = '_';
    return 0;
}

int kvd_trace_import_text(const char *path, int64_t vocab, kvd_trace *t, char *err) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, KVD_ERR_LEN, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    import_ctx c = {t, 0, 0, vocab, path, err, 0, 1, 0, "", "", 0};
    char word[64];
    int len = 0, ch;
    while (!c.failed && (ch = fgetc(f)) != EOF) {
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            if (len) word[len] = 0, push(&c, word, NULL), len = 0;
            if (ch == '\n') c.line++;
        } else if (len < (int)sizeof word - 1) {
            word[len++] = (char)ch;
        } else {
            snprintf(err, KVD_ERR_LEN, "%s:%ld: expected a token id, got a %d+ character word",
                     path, c.line, (int)sizeof word);
            c.failed = 1;
        }
    }
    if (!c.failed && len) word[len] = 0, push(&c, word, NULL);
    fclose(f);
    return finish_import(t, vocab, path, c.failed, "token id", err);
}

static void csv_field(void *s, size_t n, void *data) {
    import_ctx *c = data;
    char buf[64];
    size_t m = n < sizeof buf - 1 ? n : sizeof buf - 1;
    memcpy(buf, s, m);
    buf[m] = 0;
    if (c->col == 0) snprintf(c->id, sizeof c->id, "%s", buf);
    if (c->col == 1) snprintf(c->kind, sizeof c->kind, "%s", buf);
    if (c->col >= 2 && !c->failed) {
        snprintf(c->err, KVD_ERR_LEN, "%s:%ld: expected 1 or 2 columns (id[,segment]), got more",
                 c->path, c->line);
        c->failed = 1;
    }
    c->col++;
}

static void csv_row(int term, void *data) {
    (void)term;
    import_ctx *c = data;
    /* an optional header row: id[,segment] */
    if (!c->header_checked) {
        c->header_checked = 1;
        if (!strcmp(c->id, "id") && (c->col == 1 || !strcmp(c->kind, "segment"))) goto next;
    }
    push(c, c->id, c->col > 1 ? c->kind : ""); /* "": no segment column */
next:
    c->col = 0;
    c->id[0] = c->kind[0] = 0;
    c->line++;
}

int kvd_trace_import_csv(const char *path, int64_t vocab, kvd_trace *t, char *err) {
    memset(t, 0, sizeof *t);
    size_t n;
    char *txt = kvd_read_file(path, &n, err);
    if (!txt) return -1;
    struct csv_parser p;
    import_ctx c = {t, 0, 0, vocab, path, err, 0, 1, 0, "", "", 0};
    csv_init(&p, CSV_STRICT | CSV_APPEND_NULL | CSV_STRICT_FINI);
    if (csv_parse(&p, txt, n, csv_field, csv_row, &c) != n && !c.failed) {
        snprintf(err, KVD_ERR_LEN, "%s:%ld: malformed CSV: %s", path, c.line,
                 csv_strerror(csv_error(&p)));
        c.failed = 1;
    }
    if (!c.failed && csv_fini(&p, csv_field, csv_row, &c) != 0 && !c.failed) {
        snprintf(err, KVD_ERR_LEN, "%s:%ld: malformed CSV: %s", path, c.line,
                 csv_strerror(csv_error(&p)));
        c.failed = 1;
    }
    csv_free(&p);
    free(txt);
    return finish_import(t, vocab, path, c.failed, "token row", err);
}
