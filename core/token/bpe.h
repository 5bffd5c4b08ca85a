/* bpe: byte-pair merging of one piece into tokens, tiktoken's rule exactly.
 *
 * The piece starts as one part per byte; the adjacent pair whose joined bytes have the
 * lowest rank is merged (the leftmost of equal ranks), until no adjacent pair is a token.
 * A piece that is a token of its own is that token (tiktoken's shortcut, which the rule
 * gives anyway). Pieces up to MG_BPE_SMALL bytes merge in arrays on the stack by repeated
 * scans, as tiktoken does (quadratic, fastest for the short pieces text is made of); longer
 * ones through a heap of the pairs, O(n log n), where tiktoken's scans make a piece of a
 * million letters take minutes (its issue #195). */
#ifndef MG_BPE_H
#define MG_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "token/ranks.h"

#define MG_BPE_SMALL 128

/* Working memory for long pieces, grown on demand and reused: one per caller (a call of the
 * tokenizer), zero-initialised, released with mg_bpe_scratch_free. */
typedef struct {
    void *mem;  /* owned */
    size_t cap; /* bytes */
} mg_bpe_scratch_t;

/* The number of tokens piece s[0..n) (n >= 1) merges into; -1 when scratch memory could not
 * be had (only for pieces longer than MG_BPE_SMALL). Allocates nothing otherwise. */
long mg_bpe_count(const mg_ranks_t *t, const uint8_t *s, size_t n, mg_bpe_scratch_t *sc);

/* The tokens of piece s[0..n) (n >= 1) into out[0..], which has room for n ids; returns how
 * many, or -1 as mg_bpe_count. */
long mg_bpe_encode(const mg_ranks_t *t, const uint8_t *s, size_t n, uint32_t *out,
                   mg_bpe_scratch_t *sc);

void mg_bpe_scratch_free(mg_bpe_scratch_t *sc);

#endif
