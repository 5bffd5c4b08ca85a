/* utf8: checking, repairing and stepping through UTF-8 for the tokenizer.
 *
 * tiktoken tokenizes text, not bytes: what reaches it has been decoded, and a decoder replaces
 * every ill-formed sequence with U+FFFD (the WHATWG "maximal subpart" rule that JavaScript's
 * TextDecoder, Python's errors="replace" and the npm tiktoken package's string conversion
 * share). The tokenizer does the same, so its ids equal tiktoken's on the decoded text. */
#ifndef MG_UTF8_H
#define MG_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length of the longest prefix of s[0..n) that is well-formed UTF-8 (n when all of it
 * is; overlong forms, surrogates and code points past U+10FFFF are ill-formed). */
size_t mg_utf8_valid_prefix(const uint8_t *s, size_t n);

/* The bytes mg_utf8_repair writes for s[0..n) (at most 3 * n). */
size_t mg_utf8_repaired_len(const uint8_t *s, size_t n);

/* Copy s[0..n) to out with each maximal ill-formed subpart replaced by U+FFFD (EF BF BD);
 * out has room for mg_utf8_repaired_len(s, n) bytes. Returns the bytes written. */
size_t mg_utf8_repair(const uint8_t *s, size_t n, uint8_t *out);

/* Decode the code point at s[0..n) (n >= 1) of well-formed UTF-8 into *cp; returns its
 * length in bytes. Only for text mg_utf8_valid_prefix accepted whole. */
static inline size_t mg_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    uint8_t b = s[0];
    (void)n;
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3Fu);
        return 2;
    }
    if (b < 0xF0) {
        *cp = ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3Fu);
        return 3;
    }
    *cp = ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3Fu);
    return 4;
}

#endif
