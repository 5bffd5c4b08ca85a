/* utf8: well-formedness after the Unicode Standard's table 3-7, and repair by the maximal
 * subpart rule: an ill-formed sequence is replaced by one U+FFFD for the longest prefix of
 * it that could have begun a well-formed sequence (at least one byte), and decoding resumes
 * at the byte that broke it. */
#include "token/utf8.h"

#include <string.h>

/* How many bytes from s[i] form a well-formed sequence (1..4), or 0 when ill-formed; *sub
 * gets the length of the maximal subpart to replace in that case (>= 1). */
static size_t seq_len(const uint8_t *s, size_t n, size_t i, size_t *sub)
{
    uint8_t b = s[i];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *sub = 1;
        return 0;
    }
    for (size_t k = 1; k <= need; k++) {
        if (i + k >= n || s[i + k] < lo || s[i + k] > hi) {
            *sub = k;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* 1 when the 8 bytes at p are all ASCII. */
static int ascii8(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return (w & 0x8080808080808080ull) == 0;
}

size_t mg_utf8_valid_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0, sub;
    while (i < n) {
        if (i + 8 <= n && ascii8(s + i)) {
            i += 8;
            continue;
        }
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = seq_len(s, n, i, &sub);
        if (!len) return i;
        i += len;
    }
    return n;
}

size_t mg_utf8_repaired_len(const uint8_t *s, size_t n)
{
    size_t i = 0, out = 0, sub;
    while (i < n) {
        size_t len = seq_len(s, n, i, &sub);
        if (len) {
            i += len;
            out += len;
        } else {
            i += sub;
            out += 3;
        }
    }
    return out;
}

size_t mg_utf8_repair(const uint8_t *s, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0, sub;
    while (i < n) {
        size_t len = seq_len(s, n, i, &sub);
        if (len) {
            memcpy(out + o, s + i, len);
            i += len;
            o += len;
        } else {
            out[o++] = 0xEF;
            out[o++] = 0xBF;
            out[o++] = 0xBD;
            i += sub;
        }
    }
    return o;
}
