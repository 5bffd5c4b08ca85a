/* ranks: parsing tiktoken's rank format into the hash table that ranks.h looks up.
 *
 * The format, as OpenAI publishes it and the tokenizer's set-up extracts it from the npm
 * tiktoken package: one line per token, "<standard base64 of its bytes> <rank>", ranks
 * ascending. The table is sized to at most half full, so linear probing stays short. */
#include "token/ranks.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/b64.h"

/* Decode standard base64 s[0..n) (with '=' padding) into out; the bytes written, or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out, size_t cap)
{
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    size_t end = n;
    while (end > 0 && s[end - 1] == '=') end--;
    if (n % 4 != 0 || n - end > 2) return -1;
    for (size_t i = 0; i < end; i++) {
        int v = mg_b64_digit((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o >= cap) return -1;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return (long)o;
}

typedef struct {
    const char *b64; /* borrowed from the text */
    size_t b64_len;
    uint32_t rank;
} line_t;

/* Split the text into lines; *lines is malloc'd. Returns the count, or -1 with err. */
static long split_lines(const char *text, size_t len, line_t **lines, uint32_t *max_rank, char *err,
                        size_t errlen)
{
    size_t cap = 1024, n = 0;
    line_t *v = malloc(cap * sizeof(*v));
    if (!v) return -1;
    *max_rank = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        size_t e = j;
        if (e > i && text[e - 1] == '\r') e--;
        if (e > i) {
            const char *sp = memchr(text + i, ' ', e - i);
            char *endp = NULL;
            unsigned long r = sp ? strtoul(sp + 1, &endp, 10) : 0;
            if (!sp || sp == text + i || endp != text + e || r >= MG_RANK_NONE - 1) {
                snprintf(err, errlen, "line %zu: not \"base64 rank\"", n + 1);
                free(v);
                return -1;
            }
            if (n == cap) {
                line_t *nv = realloc(v, (cap *= 2) * sizeof(*v));
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
            }
            v[n++] = (line_t){text + i, (size_t)(sp - (text + i)), (uint32_t)r};
            if (r > *max_rank) *max_rank = (uint32_t)r;
        }
        i = j + 1;
    }
    *lines = v;
    return (long)n;
}

static int insert(mg_ranks_t *t, uint32_t r, char *err, size_t errlen)
{
    size_t n = t->off[r + 1] - t->off[r];
    const uint8_t *s = t->blob + t->off[r];
    if (mg_ranks_find(t, s, n) != MG_RANK_NONE) {
        snprintf(err, errlen, "rank %u: the same bytes as rank %u", r, mg_ranks_find(t, s, n));
        return -1;
    }
    uint64_t h = mg_ranks_hash(s, n);
    uint64_t i = h & t->mask;
    while (t->slots[i]) i = (i + 1) & t->mask;
    t->slots[i] = (h >> 40) << 40 | (uint64_t)n << 32 | (uint64_t)(r + 1);
    if (n == 1) t->byte_rank[s[0]] = r;
    if (n == 2) t->pair[(uint32_t)s[0] << 8 | s[1]] = r;
    return 0;
}

/* Fill blob and off from the lines (ranks may come in any order, each at most once). */
static int fill_blob(mg_ranks_t *t, const line_t *v, long n, char *err, size_t errlen)
{
    uint32_t *len = calloc((size_t)t->n_ranks + 1, sizeof(*len));
    size_t total = 0;
    if (!len) return -1;
    for (long i = 0; i < n; i++) {
        if (len[v[i].rank]) {
            snprintf(err, errlen, "line %ld: rank %u twice", i + 1, v[i].rank);
            free(len);
            return -1;
        }
        len[v[i].rank] = (uint32_t)(v[i].b64_len / 4 * 3);
        total += len[v[i].rank];
    }
    t->blob = malloc(total ? total : 1);
    t->off = malloc(((size_t)t->n_ranks + 1) * sizeof(*t->off));
    if (!t->blob || !t->off) {
        free(len);
        return -1;
    }
    /* room per rank from the base64 length (an upper bound), decode, then close the gaps */
    uint32_t *room = len;
    size_t at = 0;
    for (uint32_t r = 0; r < t->n_ranks; r++) {
        t->off[r] = (uint32_t)at;
        at += room[r];
    }
    t->off[t->n_ranks] = (uint32_t)at;
    for (long i = 0; i < n; i++) {
        uint32_t r = v[i].rank;
        long got = b64_decode(v[i].b64, v[i].b64_len, t->blob + t->off[r], room[r]);
        if (got <= 0 || got > 255) {
            snprintf(err, errlen, "line %ld: bad base64 or a token of %ld bytes", i + 1, got);
            free(len);
            return -1;
        }
        room[r] = (uint32_t)got;
    }
    at = 0;
    for (uint32_t r = 0; r < t->n_ranks; r++) {
        uint32_t from = t->off[r];
        t->off[r] = (uint32_t)at;
        memmove(t->blob + at, t->blob + from, room[r]);
        at += room[r];
        if (room[r] > t->max_len) t->max_len = room[r];
    }
    t->off[t->n_ranks] = (uint32_t)at;
    free(len);
    return 0;
}

int mg_ranks_parse(const char *text, size_t len, mg_ranks_t **out, char *err, size_t errlen)
{
    line_t *v = NULL;
    uint32_t max_rank = 0;
    *out = NULL;
    snprintf(err, errlen, "out of memory");
    long n = split_lines(text, len, &v, &max_rank, err, errlen);
    if (n <= 0) {
        if (n == 0) {
            snprintf(err, errlen, "no ranks");
            free(v);
        }
        return -1;
    }
    mg_ranks_t *t = calloc(1, sizeof(*t));
    uint64_t size = 1024;
    while (size < (uint64_t)n * 2) size <<= 1;
    if (t) {
        t->n_ranks = max_rank + 1;
        t->n_tokens = (uint32_t)n;
        t->mask = size - 1;
        t->slots = calloc(size, sizeof(*t->slots));
        t->pair = malloc(65536 * sizeof(*t->pair));
    }
    if (!t || !t->slots || !t->pair || fill_blob(t, v, n, err, errlen) < 0) goto fail;
    memset(t->pair, 0xFF, 65536 * sizeof(*t->pair));
    memset(t->byte_rank, 0xFF, sizeof(t->byte_rank));
    for (long i = 0; i < n; i++)
        if (insert(t, v[i].rank, err, errlen) < 0) goto fail;
    for (int b = 0; b < 256; b++) {
        if (t->byte_rank[b] == MG_RANK_NONE) {
            snprintf(err, errlen, "byte 0x%02x is no token", b);
            goto fail;
        }
    }
    free(v);
    *out = t;
    return 0;
fail:
    free(v);
    mg_ranks_free(t);
    return -1;
}

void mg_ranks_free(mg_ranks_t *t)
{
    if (!t) return;
    free(t->slots);
    free(t->blob);
    free(t->off);
    free(t->pair);
    free(t);
}

const uint8_t *mg_ranks_bytes(const mg_ranks_t *t, uint32_t r, size_t *len)
{
    if (r >= t->n_ranks || t->off[r + 1] == t->off[r]) return NULL;
    *len = t->off[r + 1] - t->off[r];
    return t->blob + t->off[r];
}
