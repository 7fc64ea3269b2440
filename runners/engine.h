/* kvdrift: a model on one of the back ends, as the drift run, calibration
 * and the sweep's throughput cells drive it. The CPU model (model.h) and the
 * device model (model_cuda.h) each fill in the operations; the callers never
 * name a back end. */
#ifndef KVD_ENGINE_H
#define KVD_ENGINE_H

#include "kvcache.h"
#include "model.h"
#include "weights.h"

typedef struct {
    const char *name; /* "cpu", "cuda" */
    /* a model over w for steps of max_rows tokens over max_seqs sequences,
     * writing into caches shaped like kv; with peer (a model of the same
     * back end over the same weights), sharing its weights where the back
     * end holds its own copy */
    void *(*create)(const kvd_weights *w, const kvd_kvcache *kv, int max_rows, int max_seqs,
                    int gpus, void *peer, char *err);
    void (*destroy)(void *m);
    int (*set_hooks)(void *m, const kvd_hooks *h, char *err);
    /* kvd_model_set_shadow. Where shadow_of_reference is set, a model with a
     * reference fills its shadow with the reference's K/V rows and takes the
     * isolated view on its own side, so that one reference serves several
     * candidates in a lock step; elsewhere the shadow goes on the reference */
    int (*set_shadow)(void *m, kvd_kvcache *shadow, char *err);
    int shadow_of_reference;
    /* the propagated view's reference (kvd_model_set_reference): a model of
     * the same back end, and its cache; NULL to stop */
    int (*set_reference)(void *m, void *ref, const kvd_kvcache *ref_kv, char *err);
    /* kvd_model_share_prefix; NULL where a back end runs those layers again */
    void (*share_prefix)(void *m, int on);
    kvd_step_fn forward;
    /* forward with last_only, each sequence's greedy next token (kvd_argmax
     * of its last row's logits) into next instead of the logits, taken
     * where the logits are; NULL: the engine's forward and kvd_argmax */
    int (*greedy)(void *m, kvd_kvcache *kv, const kvd_batch *b, int32_t *next, char *err);
    /* a branch of seq (cache and recurrent state): the new id, or -1 */
    int (*fork)(void *m, kvd_kvcache *kv, int seq);
    /* kv's host pools made to hold the cache's bytes (the device keeps its
     * own; the CPU's are kv's already): 0, or -1 */
    int (*pull_cache)(void *m, kvd_kvcache *kv);
} kvd_engine_ops;

typedef struct {
    const kvd_engine_ops *ops;
    void *m;
    int max_rows, vocab;
} kvd_engine;

extern const kvd_engine_ops kvd_engine_cpu;
/* runners/model_cuda.c, in builds with the CUDA back end */
extern const kvd_engine_ops kvd_engine_cuda;

/* Where models run: a back end, and the GPUs a model is split over (tensor
 * parallelism; 1 for the CPU). */
typedef struct {
    const kvd_engine_ops *ops;
    int gpus;
} kvd_backend;
extern const kvd_backend kvd_backend_cpu;

/* The back end called name ("cpu" or "cuda"); NULL with err set where this
 * build has none by that name. */
const kvd_engine_ops *kvd_engine_find(const char *name, char *err);

int kvd_engine_open(kvd_engine *e, const kvd_backend *be, const kvd_weights *w,
                    const kvd_kvcache *kv, int max_rows, int max_seqs, const kvd_engine *peer,
                    char *err);
void kvd_engine_close(kvd_engine *e);

static inline int kvd_engine_forward(kvd_engine *e, kvd_kvcache *kv, const kvd_batch *b,
                                     float *logits, int last_only, char *err) {
    return e->ops->forward(e->m, kv, b, logits, last_only, err);
}
/* One step and each sequence's greedy next token: on the device where the
 * engine samples there, else from logits (b->n x vocab floats of scratch). */
static inline int kvd_engine_greedy(kvd_engine *e, kvd_kvcache *kv, const kvd_batch *b,
                                    float *logits, int32_t *next, char *err) {
    if (e->ops->greedy) return e->ops->greedy(e->m, kv, b, next, err);
    if (e->ops->forward(e->m, kv, b, logits, 1, err)) return -1;
    for (int s = 0; s < b->n; s++) next[s] = kvd_argmax(logits + (size_t)s * e->vocab, e->vocab);
    return 0;
}
/* kvd_prefill on this engine */
static inline int kvd_engine_prefill(kvd_engine *e, kvd_kvcache *kv, int seq, const int32_t *tok,
                                     int n, float *logits, int all_logits, char *err) {
    return kvd_prefill_steps(e->ops->forward, e->m, e->max_rows, e->vocab, kv, seq, tok, n, logits,
                             all_logits, err);
}
/* kvd_model_share_prefix where the back end has it (else nothing: the
 * layers run again, to the same figures) */
static inline void kvd_engine_share_prefix(kvd_engine *e, int on) {
    if (e->ops->share_prefix) e->ops->share_prefix(e->m, on);
}
static inline int kvd_engine_set_hooks(kvd_engine *e, const kvd_hooks *h, char *err) {
    return e->ops->set_hooks(e->m, h, err);
}
static inline int kvd_engine_set_shadow(kvd_engine *e, kvd_kvcache *shadow, char *err) {
    return e->ops->set_shadow(e->m, shadow, err);
}
/* ref (on the same back end, with its cache ref_kv) as e's reference for
 * the attn_cmp hook's propagated view; NULL to stop */
int kvd_engine_set_reference(kvd_engine *e, const kvd_engine *ref, const kvd_kvcache *ref_kv,
                             char *err);
static inline int kvd_engine_fork(kvd_engine *e, kvd_kvcache *kv, int seq) {
    return e->ops->fork(e->m, kv, seq);
}
static inline int kvd_engine_pull_cache(kvd_engine *e, kvd_kvcache *kv) {
    return e->ops->pull_cache(e->m, kv);
}

#endif
