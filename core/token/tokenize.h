/* tokenize: text to tokens with a loaded encoding, equal to tiktoken's encode.
 *
 * Special tokens ("<|endoftext|>" and the encoding's others) are recognised only when the
 * caller passes MG_TOKENIZE_SPECIAL (tiktoken's allowed_special="all"); otherwise they are
 * plain text (tiktoken's encode_ordinary, or encode with disallowed_special=()). Text that
 * is not well-formed UTF-8 is tokenized as its repair (utf8.h: each ill-formed part becomes
 * U+FFFD), which is what tiktoken receives when the bytes are decoded for it. Linear in the
 * text but for the merge of pieces longer than MG_BPE_SMALL bytes (O(n log n)). Safe from
 * any thread; the encoding is only read. */
#ifndef MG_TOKENIZE_H
#define MG_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "token/encoding.h"

#define MG_TOKENIZE_SPECIAL 1u /* recognise the encoding's special tokens */

/* The number of tokens of text[0..len), or -1 when memory ran out. Allocates nothing per
 * token: nothing at all for well-formed text whose pieces are at most MG_BPE_SMALL bytes,
 * else one buffer for the call (the repaired copy, the long pieces' merge). */
long mg_tokenize_count(const mg_encoding_t *e, const void *text, size_t len, unsigned flags);

/* Token ids, grown as needed. Zero-initialise; free with mg_token_ids_free. */
typedef struct {
    uint32_t *ids; /* owned */
    size_t n;
    size_t cap;
} mg_token_ids_t;

/* Append the tokens of text[0..len) to out. Returns 0, or -1 when memory ran out (out then
 * holds a prefix of them). */
int mg_tokenize_encode(const mg_encoding_t *e, const void *text, size_t len, unsigned flags,
                       mg_token_ids_t *out);

void mg_token_ids_free(mg_token_ids_t *ids);

#endif
