/* kvdrift: synthetic long-context agentic coding traces, their labels
 * (segment kinds, copy references), trace files (HDF5) and imports. */
#ifndef KVD_TRACE_H
#define KVD_TRACE_H

#include <stdint.h>

typedef enum {
    KVD_SEG_SYSTEM = 0, /* fixed system prompt with tool schemas */
    KVD_SEG_USER,       /* the user's task */
    KVD_SEG_REASONING,  /* assistant reasoning */
    KVD_SEG_TOOL_CALL,  /* structured call: braces, keys, paths */
    KVD_SEG_FILE,       /* tool result: file contents */
    KVD_SEG_SEARCH,     /* tool result: search hits */
    KVD_SEG_TEST_LOG,   /* tool result: test log with stack traces */
    KVD_SEG_DIFF,       /* tool result: a diff */
    KVD_SEG_EDIT,       /* assistant edit quoting earlier code */
    KVD_SEG_IMPORTED,   /* a user trace without segment labels */
    KVD_SEG_N
} kvd_seg_kind;

const char *kvd_seg_name(kvd_seg_kind k);
int kvd_seg_parse(const char *s, kvd_seg_kind *k);

typedef struct {
    int64_t start, length;
    int32_t kind;
} kvd_segment;

/* Token pos copies the content at src (< pos, same token id). */
typedef struct {
    int64_t pos, src;
} kvd_reference;

typedef struct {
    char kind[32];  /* "agentic-coding" */
    int64_t length; /* exact number of tokens */
    uint64_t seed;
    int64_t vocab_size; /* ids in [0, vocab_size) */
    int64_t reuse_min;  /* copy distances are log-uniform in [reuse_min, reuse_max] */
    int64_t reuse_max;  /* (capped by the position) */
    double copy_rate;   /* scale on every segment kind's copy probability */
    int64_t system_tokens;
} kvd_trace_spec;

void kvd_trace_spec_defaults(kvd_trace_spec *s);

typedef struct {
    kvd_trace_spec spec;
    int64_t n;
    uint32_t *tokens;
    int64_t n_segs, n_refs;
    kvd_segment *segs;
    kvd_reference *refs;
    char name[64];
} kvd_trace;

/* Generate; -1 with err for an impossible spec (zero length, ...). */
int kvd_trace_generate(const kvd_trace_spec *spec, kvd_trace *t, char *err);
void kvd_trace_free(kvd_trace *t);
char *kvd_trace_spec_json(const kvd_trace_spec *s); /* malloc'd */
int kvd_trace_spec_from_json(const char *json, kvd_trace_spec *s, char *err);

/* The copy marks of the first n + 1 positions (0 .. n), into is_copy and
 * copy_start (n + 1 bytes each, zeroed by the caller): is_copy[p] when
 * token p copies earlier content, copy_start[p] when it starts a copy,
 * that is, it does not continue the copy at p - 1 from the token after
 * that one's source. */
void kvd_trace_copy_marks(const kvd_trace *t, int64_t n, uint8_t *is_copy, uint8_t *copy_start);

/* Reuse distances of the references, in log2 buckets: hist[b] counts
 * distances d with 2^b <= d < 2^(b+1), b < 64. */
void kvd_trace_reuse_hist(const kvd_trace *t, int64_t hist[64]);

/* Trace files: one or more traces in one HDF5 file, written atomically. */
int kvd_trace_save(const char *path, const kvd_trace *traces, int n, char *err);
/* Reads every trace of the file; *n receives their count. */
int kvd_trace_load(const char *path, kvd_trace **traces, int *n, char *err);

/* Imports: whitespace-separated ids, or CSV rows "id[,segment kind]". */
int kvd_trace_import_text(const char *path, int64_t vocab, kvd_trace *t, char *err);
int kvd_trace_import_csv(const char *path, int64_t vocab, kvd_trace *t, char *err);

#endif
