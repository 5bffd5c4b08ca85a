/* ranks: an encoding's rank table, byte string -> rank (the token id and merge priority).
 *
 * Parsed from tiktoken's text format (one "base64-of-the-bytes rank" per line), held as one
 * blob of all tokens' bytes, an offset per rank, and an open-addressing hash table of ranks.
 * A slot keeps 24 bits of the hash and the token's length beside the rank, so a miss rarely
 * touches the blob. Read-only after parsing: any number of threads may look up at once. */
#ifndef MG_RANKS_H
#define MG_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MG_RANK_NONE UINT32_MAX

/* The fields are read by the inline lookups below; nothing outside ranks.c writes them. */
typedef struct mg_ranks {
    uint64_t *slots; /* owned; mask + 1 entries: (tag24 << 40 | len8 << 32 | rank + 1), 0 empty */
    uint64_t mask;
    uint8_t *blob;     /* owned; the bytes of every token, by rank */
    uint32_t *off;     /* owned; token r is blob[off[r] .. off[r + 1]) (empty: no such rank) */
    uint32_t *pair;    /* owned; 65536 entries: the rank of the two bytes (a << 8 | b), or NONE */
    uint32_t n_ranks;  /* highest rank + 1 */
    uint32_t n_tokens; /* ranks present */
    uint32_t max_len;  /* the longest token, bytes (at most 255) */
    uint32_t byte_rank[256];
} mg_ranks_t;

/* Parse a rank file's text[0..len) into a new table (*out, freed with mg_ranks_free).
 * Every byte value must be a token of its own, no token longer than 255 bytes, no bytes or
 * rank twice. Returns 0, or -1 with the reason (line number) in err. */
int mg_ranks_parse(const char *text, size_t len, mg_ranks_t **out, char *err, size_t errlen);

/* Free a table (NULL is fine). */
void mg_ranks_free(mg_ranks_t *t);

/* The bytes of token rank r (*len bytes, borrowed from t), or NULL when r is no rank. */
const uint8_t *mg_ranks_bytes(const mg_ranks_t *t, uint32_t r, size_t *len);

/* The hash the table is keyed by (exposed for the inline lookup). */
static inline uint64_t mg_ranks_hash(const uint8_t *s, size_t n)
{
    uint64_t a, b;
    if (n >= 8) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ull;
        size_t i = 0;
        for (; i + 8 < n; i += 8) {
            memcpy(&a, s + i, 8);
            h = (h ^ a) * 0xFF51AFD7ED558CCDull;
            h ^= h >> 31;
        }
        memcpy(&a, s + n - 8, 8);
        h = (h ^ a) * 0xC4CEB9FE1A85EC53ull;
        return h ^ (h >> 29);
    }
    if (n >= 4) {
        uint32_t x, y;
        memcpy(&x, s, 4);
        memcpy(&y, s + n - 4, 4);
        a = x;
        b = y;
    } else if (n > 0) {
        a = (uint64_t)s[0] << 16 | (uint64_t)s[n >> 1] << 8 | s[n - 1];
        b = 0;
    } else {
        a = b = 0;
    }
    uint64_t h = ((a << 32 | b) ^ ((uint64_t)n * 0x9E3779B97F4A7C15ull)) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    h *= 0xC4CEB9FE1A85EC53ull;
    return h ^ (h >> 29);
}

/* The rank of the byte string s[0..n), or MG_RANK_NONE when it is no token. */
static inline uint32_t mg_ranks_find(const mg_ranks_t *t, const uint8_t *s, size_t n)
{
    if (n == 0 || n > t->max_len) return MG_RANK_NONE;
    uint64_t h = mg_ranks_hash(s, n);
    uint64_t want = (h >> 40) << 40 | (uint64_t)n << 32;
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        uint64_t e = t->slots[i];
        if (!e) return MG_RANK_NONE;
        if ((e & 0xFFFFFFFF00000000ull) == want) {
            uint32_t r = (uint32_t)e - 1;
            if (memcmp(t->blob + t->off[r], s, n) == 0) return r;
        }
    }
}

/* The rank of the two bytes s[0], s[1] (MG_RANK_NONE when they are no token). */
static inline uint32_t mg_ranks_pair(const mg_ranks_t *t, const uint8_t *s)
{
    return t->pair[(uint32_t)s[0] << 8 | s[1]];
}

#endif
