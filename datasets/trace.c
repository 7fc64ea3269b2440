/* kvdrift: the agentic-coding trace generator. A trace is a fixed system
 * prompt, a user task, then cycles of reasoning, a tool call, a tool result
 * and an edit. Long-range structure comes from copies: a span of earlier
 * tokens repeated at a distance drawn log-uniformly from the spec's range
 * (identifiers, paths, re-read files, repeated errors, quoted code), with a
 * few tokens mutated (near-duplicates). Every copied token is labelled with
 * the position it copies. */
#include "trace.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runners/config.h"

static const char *const seg_names[KVD_SEG_N] = {"system", "user",    "reasoning", "tool_call",
                                                 "file",   "search",  "test_log",  "diff",
                                                 "edit",   "imported"};

const char *kvd_seg_name(kvd_seg_kind k) {
    return (unsigned)k < KVD_SEG_N ? seg_names[k] : "?";
}

int kvd_seg_parse(const char *s, kvd_seg_kind *k) {
    for (int i = 0; i < KVD_SEG_N; i++)
        if (!strcmp(s, seg_names[i])) {
            *k = (kvd_seg_kind)i;
            return 0;
        }
    return -1;
}

void kvd_trace_spec_defaults(kvd_trace_spec *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->kind, sizeof s->kind, "agentic-coding");
    s->length = 32768;
    s->seed = 1;
    s->vocab_size = 248320; /* Qwen3.5's vocabulary */
    s->reuse_min = 16;
    s->reuse_max = 262144;
    s->copy_rate = 1.0;
    s->system_tokens = 2048;
}

/* ---- random numbers: splitmix64 sequence ---- */

typedef struct {
    uint64_t s;
} rng;

static inline uint64_t next64(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double unif(rng *r) {
    return ((next64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static inline int64_t range(rng *r, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(unif(r) * (double)(hi - lo + 1));
}

/* ---- token spaces ---- */

enum {
    T_BOS = 0,
    T_LBRACE,
    T_RBRACE,
    T_QUOTE,
    T_COLON,
    T_COMMA,
    T_LBRACK,
    T_RBRACK,
    T_NL,
    T_INDENT,
    T_SLASH,
    T_DOT,
    T_LPAREN,
    T_RPAREN,
    T_EQ,
    T_PLUS,
    T_MINUS,
    T_HUNK,
    T_TRACEBACK,
    T_FILE,
    T_LINE,
    T_ERROR,
    N_STRUCT = 32
};

typedef struct {
    int64_t vocab, span;
    double zipf_s[KVD_SEG_N];
    uint64_t mul[KVD_SEG_N], add[KVD_SEG_N];
} lexicon;

static uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void lexicon_init(lexicon *lx, int64_t vocab) {
    lx->vocab = vocab;
    lx->span = vocab - N_STRUCT;
    /* each segment kind has its own rank-to-id permutation and skew: code,
     * prose and logs do not share their most frequent tokens */
    static const double s[KVD_SEG_N] = {1.2, 1.05, 1.05, 1.3, 1.15, 1.2, 1.25, 1.15, 1.1, 1.1};
    rng r = {0x6b76647269667421ull};
    for (int k = 0; k < KVD_SEG_N; k++) {
        lx->zipf_s[k] = s[k];
        uint64_t m = (next64(&r) | 1) % (uint64_t)lx->span;
        while (m == 0 || gcd(m, (uint64_t)lx->span) != 1) m = (m + 1) % (uint64_t)lx->span;
        lx->mul[k] = m;
        lx->add[k] = next64(&r) % (uint64_t)lx->span;
    }
}

/* A fresh content token of segment kind k: Zipf rank, permuted per kind. */
static uint32_t fresh(const lexicon *lx, rng *r, int k) {
    double sx = lx->zipf_s[k], a = 1.0 - sx, n = (double)lx->span;
    double h = (pow(n, a) - 1.0) / a;
    int64_t rank = (int64_t)pow(1.0 + a * unif(r) * h, 1.0 / a) - 1;
    if (rank < 0) rank = 0;
    if (rank >= lx->span) rank = lx->span - 1;
    uint64_t id = ((uint64_t)rank * lx->mul[k] + lx->add[k]) % (uint64_t)lx->span;
    return (uint32_t)(N_STRUCT + id);
}

/* ---- the writer: tokens, segments and references as they are produced ---- */

typedef struct {
    kvd_trace *t;
    int64_t cap_refs, cap_segs;
    const kvd_trace_spec *sp;
    const lexicon *lx;
    rng *r;
} writer;

static int64_t room(const writer *w) {
    return w->t->spec.length - w->t->n;
}

static void put(writer *w, uint32_t tok) {
    if (room(w) > 0) w->t->tokens[w->t->n++] = tok;
}

static void add_ref(writer *w, int64_t pos, int64_t src) {
    kvd_trace *t = w->t;
    if (t->n_refs == w->cap_refs) {
        w->cap_refs = w->cap_refs ? 2 * w->cap_refs : 4096;
        t->refs = realloc(t->refs, (size_t)w->cap_refs * sizeof *t->refs);
    }
    t->refs[t->n_refs++] = (kvd_reference){pos, src};
}

/* Copy up to len tokens from distance d back (src < pos always; a span may
 * overlap itself, as a repeated pattern does), mutating a few. */
static void copy_span(writer *w, int64_t d, int64_t len, double mutate, int kind) {
    for (int64_t j = 0; j < len && room(w) > 0; j++) {
        int64_t pos = w->t->n, src = pos - d;
        if (unif(w->r) < mutate) {
            put(w, fresh(w->lx, w->r, kind));
        } else {
            put(w, w->t->tokens[src]);
            add_ref(w, pos, src);
        }
    }
}

/* Distance log-uniform in [reuse_min, min(reuse_max, pos)]; 0 if none fits. */
static int64_t pick_distance(writer *w) {
    int64_t pos = w->t->n, hi = w->sp->reuse_max < pos ? w->sp->reuse_max : pos;
    if (hi < w->sp->reuse_min) return 0;
    double l0 = log((double)w->sp->reuse_min), l1 = log((double)hi + 1.0);
    int64_t d = (int64_t)exp(l0 + unif(w->r) * (l1 - l0));
    return d < w->sp->reuse_min ? w->sp->reuse_min : d > hi ? hi : d;
}

/* Per segment kind: probability that a content unit is a copy, copy span
 * lengths, and the share of copied tokens mutated. */
typedef struct {
    double copy;
    int span_lo, span_hi;
    double mutate;
} copy_style;

static const copy_style styles[KVD_SEG_N] = {
    [KVD_SEG_SYSTEM] = {0.0, 0, 0, 0},         [KVD_SEG_USER] = {0.05, 4, 12, 0.0},
    [KVD_SEG_REASONING] = {0.12, 3, 16, 0.02}, [KVD_SEG_TOOL_CALL] = {0.35, 4, 14, 0.0},
    [KVD_SEG_FILE] = {0.25, 8, 48, 0.03},      [KVD_SEG_SEARCH] = {0.45, 6, 24, 0.0},
    [KVD_SEG_TEST_LOG] = {0.5, 10, 40, 0.02},  [KVD_SEG_DIFF] = {0.55, 8, 32, 0.05},
    [KVD_SEG_EDIT] = {0.65, 8, 40, 0.04},
};

/* Fresh content with the segment's own surface structure. */
static void fresh_unit(writer *w, int kind) {
    rng *r = w->r;
    const lexicon *lx = w->lx;
    switch (kind) {
    case KVD_SEG_TOOL_CALL: /* {"name": "tool", "path": "a/b/c.ext"} */
        put(w, T_LBRACE), put(w, T_QUOTE), put(w, fresh(lx, r, kind)), put(w, T_QUOTE);
        put(w, T_COLON), put(w, T_QUOTE), put(w, fresh(lx, r, kind)), put(w, T_QUOTE);
        put(w, T_COMMA);
        for (int i = (int)range(r, 2, 4); i > 0; i--) put(w, fresh(lx, r, kind)), put(w, T_SLASH);
        put(w, fresh(lx, r, kind)), put(w, T_DOT), put(w, fresh(lx, r, kind)), put(w, T_RBRACE);
        break;
    case KVD_SEG_FILE: /* a code line: indentation, tokens, newline */
        for (int i = (int)range(r, 0, 3); i > 0; i--) put(w, T_INDENT);
        for (int i = (int)range(r, 3, 12); i > 0; i--) {
            put(w, fresh(lx, r, kind));
            if (unif(r) < 0.15) put(w, unif(r) < 0.5 ? T_LPAREN : T_RPAREN);
        }
        put(w, T_NL);
        break;
    case KVD_SEG_TEST_LOG: /* Traceback / File path, line N / Error message */
        put(w, T_FILE), put(w, fresh(lx, r, kind)), put(w, T_SLASH), put(w, fresh(lx, r, kind));
        put(w, T_COMMA), put(w, T_LINE), put(w, fresh(lx, r, kind)), put(w, T_NL);
        if (unif(r) < 0.2) put(w, T_ERROR), put(w, fresh(lx, r, kind)), put(w, T_NL);
        break;
    case KVD_SEG_DIFF:
        if (unif(r) < 0.1) put(w, T_HUNK);
        put(w, unif(r) < 0.5 ? T_PLUS : T_MINUS);
        for (int i = (int)range(r, 3, 10); i > 0; i--) put(w, fresh(lx, r, kind));
        put(w, T_NL);
        break;
    case KVD_SEG_SEARCH: /* path:line: snippet */
        put(w, fresh(lx, r, kind)), put(w, T_SLASH), put(w, fresh(lx, r, kind)), put(w, T_COLON);
        put(w, fresh(lx, r, kind)), put(w, T_COLON);
        for (int i = (int)range(r, 3, 8); i > 0; i--) put(w, fresh(lx, r, kind));
        put(w, T_NL);
        break;
    default: /* prose */
        for (int i = (int)range(r, 1, 8); i > 0; i--) put(w, fresh(lx, r, kind));
        break;
    }
}

static void segment(writer *w, int kind, int64_t len) {
    kvd_trace *t = w->t;
    int64_t start = t->n, end = start + len;
    if (end > t->spec.length) end = t->spec.length;
    if (end <= start) return;
    const copy_style *st = &styles[kind];
    while (t->n < end) {
        int64_t d;
        if (unif(w->r) < st->copy * w->sp->copy_rate && (d = pick_distance(w)) > 0) {
            int64_t l = range(w->r, st->span_lo, st->span_hi);
            if (l > end - t->n) l = end - t->n;
            copy_span(w, d, l, st->mutate, kind);
        } else {
            /* a unit may run past the segment end: cut it there */
            int64_t save = t->spec.length;
            t->spec.length = end;
            fresh_unit(w, kind);
            t->spec.length = save;
        }
    }
    if (t->n_segs == w->cap_segs) {
        w->cap_segs = w->cap_segs ? 2 * w->cap_segs : 256;
        t->segs = realloc(t->segs, (size_t)w->cap_segs * sizeof *t->segs);
    }
    t->segs[t->n_segs++] = (kvd_segment){start, t->n - start, kind};
}

/* The system prompt is the same for every trace of a vocabulary (it is
 * "fixed"): its own generator, independent of the trace seed. */
static void system_prompt(writer *w, int64_t len) {
    rng sys = {0x53595354454d2121ull}, *saved = w->r;
    kvd_trace *t = w->t;
    int64_t end = len < t->spec.length ? len : t->spec.length;
    put(w, T_BOS);
    w->r = &sys;
    while (t->n < end) {
        /* tool schemas: {"name": ..., "parameters": {"k": "type", ...}} */
        int64_t save = t->spec.length;
        t->spec.length = end;
        put(w, T_LBRACE), put(w, T_QUOTE), put(w, fresh(w->lx, &sys, KVD_SEG_SYSTEM));
        put(w, T_QUOTE), put(w, T_COLON);
        for (int i = (int)range(&sys, 2, 6); i > 0; i--) {
            put(w, T_QUOTE), put(w, fresh(w->lx, &sys, KVD_SEG_SYSTEM)), put(w, T_QUOTE);
            put(w, T_COLON), put(w, fresh(w->lx, &sys, KVD_SEG_SYSTEM)), put(w, T_COMMA);
        }
        put(w, T_RBRACE), put(w, T_NL);
        for (int i = (int)range(&sys, 4, 20); i > 0; i--) put(w, fresh(w->lx, &sys, KVD_SEG_USER));
        t->spec.length = save;
    }
    w->r = saved;
    if (t->n_segs == w->cap_segs) {
        w->cap_segs = w->cap_segs ? 2 * w->cap_segs : 256;
        t->segs = realloc(t->segs, (size_t)w->cap_segs * sizeof *t->segs);
    }
    t->segs[t->n_segs++] = (kvd_segment){0, t->n, KVD_SEG_SYSTEM};
}

int kvd_trace_generate(const kvd_trace_spec *spec, kvd_trace *t, char *err) {
    memset(t, 0, sizeof *t);
    if (strcmp(spec->kind, "agentic-coding") != 0) {
        snprintf(err, KVD_ERR_LEN, "trace kind '%s': expected agentic-coding", spec->kind);
        return -1;
    }
    if (spec->length <= 0 || spec->length > ((int64_t)1 << 31)) {
        snprintf(err, KVD_ERR_LEN, "trace length: expected 1..%lld tokens, got %lld",
                 (long long)1 << 31, (long long)spec->length);
        return -1;
    }
    if (spec->vocab_size <= N_STRUCT + 16 || spec->vocab_size > UINT32_MAX) {
        snprintf(err, KVD_ERR_LEN, "trace vocab_size: expected %d..%u, got %lld", N_STRUCT + 17,
                 UINT32_MAX, (long long)spec->vocab_size);
        return -1;
    }
    if (spec->reuse_min < 1 || spec->reuse_max < spec->reuse_min || !(spec->copy_rate >= 0)) {
        snprintf(err, KVD_ERR_LEN,
                 "trace reuse distances: expected 1 <= reuse_min <= reuse_max and copy_rate >= "
                 "0, got %lld, %lld, %g",
                 (long long)spec->reuse_min, (long long)spec->reuse_max, spec->copy_rate);
        return -1;
    }
    t->spec = *spec;
    t->tokens = malloc(sizeof(uint32_t) * (size_t)spec->length);
    if (!t->tokens) {
        snprintf(err, KVD_ERR_LEN, "trace: out of memory for %lld tokens", (long long)spec->length);
        return -1;
    }
    snprintf(t->name, sizeof t->name, "seed-%llu", (unsigned long long)spec->seed);
    lexicon lx;
    lexicon_init(&lx, spec->vocab_size);
    rng r = {spec->seed * 0x2545f4914f6cdd1dull + 0x1234567ull};
    writer w = {t, 0, 0, spec, &lx, &r};
    int64_t sys = spec->system_tokens < spec->length / 8 ? spec->system_tokens : spec->length / 8;
    system_prompt(&w, sys > 1 ? sys : 1);
    segment(&w, KVD_SEG_USER, range(&r, 64, 512));
    static const int results[4] = {KVD_SEG_FILE, KVD_SEG_SEARCH, KVD_SEG_TEST_LOG, KVD_SEG_DIFF};
    static const double result_p[4] = {0.5, 0.2, 0.2, 0.1};
    while (t->n < spec->length) {
        segment(&w, KVD_SEG_REASONING, range(&r, 32, 400));
        segment(&w, KVD_SEG_TOOL_CALL, range(&r, 16, 64));
        double u = unif(&r), acc = 0;
        int k = 0;
        while (k < 3 && u > (acc += result_p[k])) k++;
        segment(&w, results[k],
                results[k] == KVD_SEG_FILE ? range(&r, 256, 4096) : range(&r, 64, 1024));
        if (unif(&r) < 0.5) segment(&w, KVD_SEG_EDIT, range(&r, 48, 600));
    }
    return 0;
}

void kvd_trace_free(kvd_trace *t) {
    free(t->tokens);
    free(t->segs);
    free(t->refs);
    memset(t, 0, sizeof *t);
}

void kvd_trace_copy_marks(const kvd_trace *t, int64_t n, uint8_t *is_copy, uint8_t *copy_start) {
    for (int64_t r = 0; r < t->n_refs && t->refs[r].pos <= n; r++) {
        const int64_t p = t->refs[r].pos;
        const int cont =
            r > 0 && t->refs[r - 1].pos == p - 1 && t->refs[r - 1].src == t->refs[r].src - 1;
        is_copy[p] = 1;
        copy_start[p] = !cont;
    }
}

void kvd_trace_reuse_hist(const kvd_trace *t, int64_t hist[64]) {
    memset(hist, 0, 64 * sizeof hist[0]);
    for (int64_t i = 0; i < t->n_refs; i++) {
        uint64_t d = (uint64_t)(t->refs[i].pos - t->refs[i].src);
        int b = 63 - __builtin_clzll(d);
        hist[b]++;
    }
}

char *kvd_trace_spec_json(const kvd_trace_spec *s) {
    json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:I}", "kind", s->kind, "length",
                          (json_int_t)s->length, "seed", (json_int_t)s->seed, "vocab_size",
                          (json_int_t)s->vocab_size, "reuse_min", (json_int_t)s->reuse_min,
                          "reuse_max", (json_int_t)s->reuse_max, "copy_rate", s->copy_rate,
                          "system_tokens", (json_int_t)s->system_tokens);
    char *txt = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return txt;
}

int kvd_trace_spec_from_json(const char *txt, kvd_trace_spec *s, char *err) {
    json_error_t je;
    json_t *o = json_loads(txt, 0, &je);
    kvd_trace_spec_defaults(s);
    if (!o) {
        snprintf(err, KVD_ERR_LEN, "trace spec: %s", je.text);
        return -1;
    }
    const char *kind = json_string_value(json_object_get(o, "kind"));
    if (kind) snprintf(s->kind, sizeof s->kind, "%s", kind);
    struct {
        const char *k;
        int64_t *v;
    } f[] = {{"length", &s->length},
             {"vocab_size", &s->vocab_size},
             {"reuse_min", &s->reuse_min},
             {"reuse_max", &s->reuse_max},
             {"system_tokens", &s->system_tokens}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        json_t *v = json_object_get(o, f[i].k);
        if (json_is_integer(v)) *f[i].v = json_integer_value(v);
    }
    json_t *sd = json_object_get(o, "seed");
    if (json_is_integer(sd)) s->seed = (uint64_t)json_integer_value(sd);
    json_t *cr = json_object_get(o, "copy_rate");
    if (json_is_number(cr)) s->copy_rate = json_number_value(cr);
    json_decref(o);
    return 0;
}
