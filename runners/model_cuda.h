/* kvdrift: the hybrid model on the device (CUDA back end). The same forward
 * pass as model.h's, step for step and in FP32 activations over BF16
 * weights, with weights, the KV cache's bytes, the recurrent state and the
 * activations resident on the device; the host keeps the cache's
 * bookkeeping (block tables, lengths, counters) in an ordinary kvd_kvcache,
 * whose own pools stay unused. Only in builds with the CUDA back end. */
#ifndef KVD_MODEL_CUDA_H
#define KVD_MODEL_CUDA_H

#include <stddef.h>

#include "model.h"

typedef struct kvd_cuda_model kvd_cuda_model;

/* A device model over weights w (uploaded: matrices as BF16, vectors as
 * FP32) for steps of up to max_rows tokens over max_seqs sequences, with
 * device cache pools shaped like kv's (its mode, scales, blocks). */
kvd_cuda_model *kvd_cuda_model_new(const kvd_weights *w, const kvd_kvcache *kv, int max_rows,
                                   int max_seqs, char *err);
/* The same split over n_gpus devices (tensor parallelism, NCCL): attention
 * heads, DeltaNet heads, experts and the intermediate columns of the shared
 * expert or dense MLP shared out, the output projections' partial sums
 * added over the GPUs; KV heads split, or each held by n_gpus / kv_heads
 * GPUs when there are fewer. n_gpus = 1 is the plain model. Refused (NULL,
 * err) when a count does not divide. */
kvd_cuda_model *kvd_cuda_model_new_tp(const kvd_weights *w, const kvd_kvcache *kv, int max_rows,
                                      int max_seqs, int n_gpus, char *err);
/* Another model over the same device weights as peer (uploaded once,
 * freed with the last model that uses them), with its own cache, shaped like
 * kv, and buffers. */
kvd_cuda_model *kvd_cuda_model_new_shared(const kvd_cuda_model *peer, const kvd_kvcache *kv,
                                          int max_rows, int max_seqs, char *err);
/* The same over synthetic weights made one tensor at a time on the host,
 * just before its upload: presets whose FP32 weights outgrow host memory
 * (qwen3.5-397b-a17b: 120 GB) need only the largest tensor's. */
kvd_cuda_model *kvd_cuda_model_new_synth(const kvd_config *cfg, const kvd_synth *s,
                                         const kvd_kvcache *kv, int max_rows, int max_seqs,
                                         int n_gpus, char *err);
void kvd_cuda_model_free(kvd_cuda_model *m);

/* Where a step's time goes: with profiling on, every rank's queue is
 * drained at the end of each phase of a step and the wall time since the
 * last end added to that phase's sum, so a profiled step runs slower than
 * an unprofiled one (the benchmark reports both). The phases: staging the
 * batch and the embedding; the full-attention layers' mixers (norm,
 * projections, cache write, attention, output projection, all-reduce); the
 * DeltaNet layers' mixers; the MoE blocks (norm, router, experts, shared
 * expert, all-reduce, residual adds); the final norm, lm_head and greedy
 * sampling; settling the cache's bookkeeping and copying results back.
 * kvd_cuda_model_profile(m, 1) zeroes the sums and starts; 0 stops;
 * kvd_cuda_model_phases gives the sums in seconds. */
enum {
    KVD_PHASE_STAGE,
    KVD_PHASE_ATTENTION,
    KVD_PHASE_DELTANET,
    KVD_PHASE_MOE,
    KVD_PHASE_HEAD,
    KVD_PHASE_SETTLE,
    KVD_PHASES
};
extern const char *const kvd_cuda_phase_names[KVD_PHASES];
void kvd_cuda_model_profile(kvd_cuda_model *m, int on);
void kvd_cuda_model_phases(const kvd_cuda_model *m, double secs[KVD_PHASES]);

/* Hooks, called as on the CPU with host copies of what the device computed:
 * the residual stream, the router's choices, K and V before the cache, and
 * for the rows want_attn accepts the attn_cmp views, compared on the device
 * (a probabilities kernel and decode over each cache). The attn hook's
 * whole distributions are refused. 0, or -1 with err set. */
int kvd_cuda_model_set_hooks(kvd_cuda_model *m, const kvd_hooks *h, char *err);

/* kvd_model_set_shadow on the device: every K/V row (this model's, or with a
 * reference set, the reference's of its last step) is also written into a
 * device copy of the shadow cache (kept for the model's life; a later
 * shadow must have the same mode and size), whose host bookkeeping is
 * shadow's. NULL to stop. 0, or -1 with err set. */
int kvd_cuda_model_set_shadow(kvd_cuda_model *m, kvd_kvcache *shadow, char *err);

/* kvd_model_set_reference on the device: ref (over as many GPUs, the same
 * shapes) keeps its last step's queries (each rank's heads), residual
 * streams and logits (rank 0) on the device, and this model's comparing
 * hooks compare against them there: the attention of each sampled row over
 * the reference's own device cache, the residual stream after every layer,
 * the logits. NULL to stop. 0, or -1 with err set. */
int kvd_cuda_model_set_reference(kvd_cuda_model *m, kvd_cuda_model *ref, char *err);

/* Clear one sequence slot's recurrent state (conv and DeltaNet), or copy
 * one slot's into another. */
void kvd_cuda_model_reset_seq(kvd_cuda_model *m, int seq);
void kvd_cuda_model_copy_seq(kvd_cuda_model *m, int from, int to);
/* A branch of seq (kvd_kvcache_fork with the device's cache bytes and
 * recurrent state): the new sequence id, or -1 when out of blocks or slots. */
int kvd_cuda_model_fork(kvd_cuda_model *m, kvd_kvcache *kv, int seq);

/* kvd_forward on the device: kv is the host bookkeeping of this model's
 * device cache. */
int kvd_cuda_forward(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, float *logits,
                     int last_only, char *err);

/* kvd_cuda_forward's step without the logits: each sequence's greedy next
 * token (the argmax of its last row's logits, the lowest index of a tie, as
 * kvd_argmax) taken on the device, b->n of them copied back to next, as a
 * serving engine samples. */
int kvd_cuda_forward_greedy(kvd_cuda_model *m, kvd_kvcache *kv, const kvd_batch *b, int32_t *next,
                            char *err);

/* kvd_prefill on the device: one sequence in steps of at most max_rows. */
int kvd_cuda_prefill(kvd_cuda_model *m, kvd_kvcache *kv, int seq, const int32_t *tok, int n,
                     float *logits, int all_logits, char *err);

/* A copy of the device cache's K (which_v 0) or V pool of one full-attention
 * layer, in kv's layout, into host memory of `bytes`. */
int kvd_cuda_model_pool(const kvd_cuda_model *m, int attn_layer, int which_v, void *host,
                        size_t bytes);

#endif
