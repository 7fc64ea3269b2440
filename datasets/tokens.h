/* kvdrift: a plain synthetic token stream: token 0 first (the attention sink),
 * Zipf-distributed ids, and spans copied from earlier positions so that
 * retrieval heads have something to find. The full agentic-trace generator
 * builds on this. */
#ifndef KVD_TOKENS_H
#define KVD_TOKENS_H

#include <stdint.h>

/* Fill tok[0..n) deterministically from seed, ids in [0, vocab). */
void kvd_tokens_synth(uint64_t seed, int n, int vocab, int32_t *tok);

#endif
