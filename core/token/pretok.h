/* pretok: the pre-tokenizer, tiktoken's split of text into pieces before BPE.
 *
 * Each encoding names a regular expression; this is a hand-written matcher for exactly the
 * two this tokenizer knows, with the regex engine's semantics (alternatives tried in order,
 * greedy quantifiers that give back characters, \s+(?!\S)), in one forward pass that never
 * looks back further than the current run: linear in the text, where a backtracking engine
 * is quadratic on long runs of whitespace (tiktoken issue #195).
 *
 *   cl100k_base  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *   o200k_base   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
 *                (?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+
 *                [\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|
 *                 ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
#ifndef MG_PRETOK_H
#define MG_PRETOK_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    MG_PRETOK_CL100K = 0,
    MG_PRETOK_O200K = 1,
} mg_pretok_t;

/* The end of the piece that starts at s[p] (p < n) of well-formed UTF-8 s[0..n): the piece
 * is s[p..end), end > p. Every position starts a piece, so calling again at end walks the
 * text. */
size_t mg_pretok_next(mg_pretok_t pattern, const uint8_t *s, size_t n, size_t p);

#endif
