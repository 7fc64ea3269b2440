/* kvdrift: the CPU model as an engine, and finding a back end by name. */
#include "engine.h"

#include <stdio.h>
#include <string.h>

static void *cpu_create(const kvd_weights *w, const kvd_kvcache *kv, int max_rows, int max_seqs,
                        int gpus, void *peer, char *err) {
    (void)kv, (void)peer, (void)gpus; /* the CPU model borrows w and takes any cache */
    if (w->make) {
        snprintf(err, KVD_ERR_LEN,
                 "cpu back end: the weights are lazy (made only as a device upload reads "
                 "them); the CPU model needs them all in memory");
        return NULL;
    }
    return kvd_model_new(w, max_rows, max_seqs, err);
}
static void cpu_destroy(void *m) {
    kvd_model_free(m);
}
static int cpu_set_hooks(void *m, const kvd_hooks *h, char *err) {
    (void)err;
    kvd_model_set_hooks(m, h);
    return 0;
}
static int cpu_set_shadow(void *m, kvd_kvcache *shadow, char *err) {
    (void)err;
    kvd_model_set_shadow(m, shadow);
    return 0;
}
static int cpu_set_reference(void *m, void *ref, const kvd_kvcache *ref_kv, char *err) {
    return kvd_model_set_reference(m, ref, ref_kv, err);
}
static void cpu_share_prefix(void *m, int on) {
    kvd_model_share_prefix(m, on);
}
static int cpu_forward(void *m, kvd_kvcache *kv, const kvd_batch *b, float *logits, int last_only,
                       char *err) {
    return kvd_forward(m, kv, b, logits, last_only, err);
}
static int cpu_fork(void *m, kvd_kvcache *kv, int seq) {
    int to = kvd_kvcache_fork(kv, seq);
    if (to >= 0) kvd_model_copy_seq(m, seq, to);
    return to;
}

static int cpu_pull_cache(void *m, kvd_kvcache *kv) {
    (void)m, (void)kv;
    return 0;
}

const kvd_engine_ops kvd_engine_cpu = {.name = "cpu",
                                       .create = cpu_create,
                                       .destroy = cpu_destroy,
                                       .set_hooks = cpu_set_hooks,
                                       .set_shadow = cpu_set_shadow,
                                       .shadow_of_reference = 1,
                                       .set_reference = cpu_set_reference,
                                       .share_prefix = cpu_share_prefix,
                                       .forward = cpu_forward,
                                       .fork = cpu_fork,
                                       .pull_cache = cpu_pull_cache};

const kvd_backend kvd_backend_cpu = {&kvd_engine_cpu, 1};

const kvd_engine_ops *kvd_engine_find(const char *name, char *err) {
    if (!strcmp(name, "cpu")) return &kvd_engine_cpu;
    if (!strcmp(name, "cuda")) {
#ifdef KVD_HAVE_CUDA
        return &kvd_engine_cuda;
#else
        snprintf(err, KVD_ERR_LEN, "--backend cuda: this build has no CUDA back end (no nvcc)");
        return NULL;
#endif
    }
    snprintf(err, KVD_ERR_LEN, "--backend: expected cpu or cuda, got '%s'", name);
    return NULL;
}

int kvd_engine_open(kvd_engine *e, const kvd_backend *be, const kvd_weights *w,
                    const kvd_kvcache *kv, int max_rows, int max_seqs, const kvd_engine *peer,
                    char *err) {
    const kvd_engine_ops *ops = be->ops;
    memset(e, 0, sizeof *e);
    e->ops = ops;
    e->max_rows = max_rows;
    e->vocab = w->cfg.vocab_size;
    e->m = ops->create(w, kv, max_rows, max_seqs, be->gpus,
                       peer && peer->ops == ops ? peer->m : NULL, err);
    return e->m ? 0 : -1;
}

int kvd_engine_set_reference(kvd_engine *e, const kvd_engine *ref, const kvd_kvcache *ref_kv,
                             char *err) {
    if (ref && ref->ops != e->ops) {
        snprintf(err, KVD_ERR_LEN, "reference model: expected one on the %s back end, got %s",
                 e->ops->name, ref->ops->name);
        return -1;
    }
    return e->ops->set_reference(e->m, ref ? ref->m : NULL, ref_kv, err);
}

void kvd_engine_close(kvd_engine *e) {
    if (e->m) e->ops->destroy(e->m);
    e->m = NULL;
}
