/* kvdrift: the Qwen3-Next / Qwen3.5-style hybrid decoder on the CPU: gated
 * full attention over the paged KV cache every few layers, Gated DeltaNet
 * in between, sparse MoE feed-forward. */
#ifndef KVD_MODEL_H
#define KVD_MODEL_H

#include <stdint.h>

#include "config.h"
#include "kvcache.h"
#include "weights.h"

/* One forward step: n sequences (KV cache ids seq[i]) each advance by
 * n_tok[i] tokens, taken in order from tok. Prefill is one sequence with many
 * tokens, decode many sequences with one each; any mix works. */
typedef struct {
    int n;
    const int *seq;
    const int *n_tok;
    const int32_t *tok;
} kvd_batch;

/* One view of a sampled row's attention, compared by the model itself
 * (kvd_attn_compare) so that only these figures leave it: per head, the KL
 * divergence KL(P_ref || P_test) of the two distributions over the row's
 * context and the most-attended position of each; and the two outputs
 * before the gate, [heads][head_dim]. */
typedef struct {
    const double *kl;
    const int *top_ref, *top_test;
    const float *out_ref, *out_test;
} kvd_attn_cmp;

/* Observation points for drift measurement and tests; any may be NULL. */
typedef struct {
    void *ctx;
    /* the residual stream after layer `layer`, [rows][hidden] */
    void (*hidden)(void *ctx, int layer, const kvd_batch *b, const int *pos, const float *h);
    /* with a reference model set (kvd_model_set_reference), compared by the
     * model itself so that only the figures leave it: each row's residual
     * stream after `layer` against the reference's row, [rows]; and in steps
     * that give logits (every row's, or with last_only each sequence's last
     * row's: the model computes every row's all the same), each row's logits
     * against the reference's (a the reference; the target is the row's next
     * token in the batch, kvd_batch_targets), [rows] */
    void (*hidden_cmp)(void *ctx, int layer, const kvd_batch *b, const int *pos,
                       const kvd_hidden_cmp *rows);
    void (*logits_cmp)(void *ctx, const kvd_batch *b, const int *pos, const kvd_logit_cmp *rows);
    /* K (after k_norm and RoPE) and V as computed, before the cache stores them */
    void (*kv)(void *ctx, int attn_layer, int seq, int pos, const float *k, const float *v);
    /* attention of a full-attention layer for one row: the distribution
     * [heads][n_ctx] and the output before the gate [heads][head_dim]; with a
     * shadow cache set, the same for the isolated view's query (this row's,
     * or the reference's where one is set) over the shadow cache (else NULL). Called for the rows
     * want_attn accepts (all when NULL). The CPU model's only: whole distributions are what the
     * device model keeps on the device (attn_cmp below). */
    void (*attn)(void *ctx, int attn_layer, int seq, int pos, int n_ctx, const float *probs,
                 const float *out, const float *shadow_probs, const float *shadow_out);
    /* the rows want_attn accepts (all when NULL), compared in one or two
     * views (NULL where a view is off): isolated, with a shadow cache set,
     * the reference side's query over its own cache (ref) against over the
     * shadow (test), that side being the reference model where one is set
     * and this model otherwise (kvd_model_set_shadow); propagated, with a reference model set whose
     * last step had this row at the same position, the reference's query over its cache (ref)
     * against this row's own (test). */
    void (*attn_cmp)(void *ctx, int attn_layer, int seq, int pos, const kvd_attn_cmp *isolated,
                     const kvd_attn_cmp *propagated);
    int (*want_attn)(void *ctx, int attn_layer, int seq, int pos);
    /* top-k experts chosen for each row of an MoE layer, [rows][k] */
    void (*router)(void *ctx, int layer, const kvd_batch *b, const int *experts);
} kvd_hooks;

typedef struct kvd_model kvd_model;

/* A model over weights w (borrowed, must outlive it) with room for max_rows
 * tokens in one step and the recurrent state of max_seqs sequences. */
kvd_model *kvd_model_new(const kvd_weights *w, int max_rows, int max_seqs, char *err);
void kvd_model_free(kvd_model *m);
void kvd_model_set_hooks(kvd_model *m, const kvd_hooks *h);

/* A second cache, in its own mode, for the isolated view of a candidate
 * mode: the reference's own query over the reference's K/V passed through
 * the candidate's codec, against over the reference's cache. Without a
 * reference model the shadow receives every K/V row this model writes, and
 * the view (the attn and attn_cmp hooks) is of this model's own query. With
 * one (kvd_model_set_reference), the shadow receives the reference's K/V
 * rows of its last step instead, and the view is of the reference's query:
 * so that one reference step serves any number of candidates, each with its
 * own shadow. NULL to stop. */
void kvd_model_set_shadow(kvd_model *m, kvd_kvcache *shadow);

/* The reference of the comparing hooks (attn_cmp's propagated view,
 * hidden_cmp, logits_cmp): a model over the same config whose step runs
 * just before each of this model's over the same rows at the same
 * positions (the drift run's lock step; a step of other rows fails while a
 * comparing hook is set), with ref_kv its cache. From now on ref keeps its
 * last step's queries, residual streams and logits; a sampled row's
 * reference attention is recomputed over ref_kv. NULL to stop. Both must
 * outlive the setting. 0, or -1 with err set. */
int kvd_model_set_reference(kvd_model *m, kvd_model *ref, const kvd_kvcache *ref_kv, char *err);

/* While on, each step's rows are the reference's last step's (the same
 * tokens at the same positions) over sequences whose history is the
 * reference's (a drift run's lock step, not its generations): the layers
 * below the first full-attention layer, which read no cache, then give the
 * reference's results, so they are taken from it rather than run again
 * (residual streams, routed experts, the hooks' figures and the sequences'
 * recurrent state of those layers), bit for bit what running them gives. */
void kvd_model_share_prefix(kvd_model *m, int on);

/* Clear the recurrent state (conv and DeltaNet) of one sequence slot, or
 * copy one slot's into another (with kvd_kvcache_fork: a branch). */
void kvd_model_reset_seq(kvd_model *m, int seq);
void kvd_model_copy_seq(kvd_model *m, int from, int to);

/* Run one step. logits, when not NULL, receives [rows][vocab] for every row
 * (last_only = 0) or [n][vocab] for each sequence's last token (last_only = 1).
 * Returns 0, or -1 with err set (cache full, non-finite activation, ...). */
int kvd_forward(kvd_model *m, kvd_kvcache *kv, const kvd_batch *b, float *logits, int last_only,
                char *err);

/* Prefill one sequence in steps of at most max_rows tokens. logits as in
 * kvd_forward with last_only = 0 when all_logits, else the last token's only. */
int kvd_prefill(kvd_model *m, kvd_kvcache *kv, int seq, const int32_t *tok, int n, float *logits,
                int all_logits, char *err);

/* One forward step of some model (the CPU's kvd_forward, the device's), and
 * the prefill loop over it that both back ends share: steps of at most
 * max_rows tokens, logits as in kvd_prefill. */
typedef int (*kvd_step_fn)(void *model, kvd_kvcache *kv, const kvd_batch *b, float *logits,
                           int last_only, char *err);
int kvd_prefill_steps(kvd_step_fn step, void *model, int max_rows, int vocab, kvd_kvcache *kv,
                      int seq, const int32_t *tok, int n, float *logits, int all_logits, char *err);

const kvd_config *kvd_model_config(const kvd_model *m);

/* The rows of one step: checks the batch (each sequence live and once, room
 * in the cache, which it reserves, positions and token ids in range), fills
 * each row's position and sequence; returns the row count, or -1 with err
 * set. Shared by the CPU and device forward passes. */
int kvd_batch_rows(const kvd_config *c, kvd_kvcache *kv, const kvd_batch *b, int max_rows,
                   int max_seqs, int *pos, int *row_seq, char *err);

/* 0 when a reference's last step (ref_rows rows at positions ref_pos) had
 * this step's rows at the same positions, else -1 with err set naming the
 * first that differs. Shared by the CPU and device forward passes. */
int kvd_reference_rows(int ref_rows, const int *ref_pos, int rows, const int *pos, char *err);

/* Each row's next token within the batch (the token of the sequence's next
 * row), or -1 for a sequence's last row: the targets of logits_cmp. */
void kvd_batch_targets(const kvd_batch *b, int *target);

/* The index among full-attention layers of layer l, or -1. */
int kvd_model_attn_index(const kvd_model *m, int layer);

#endif
