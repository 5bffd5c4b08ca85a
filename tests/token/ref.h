/* ref: a slow tokenizer that is obviously tiktoken's definition, for differential tests
 * (tests/unit/test_token.c, tests/fuzz/fuzz_token.c).
 *
 * The pre-tokenizer is a backtracking regex matcher over the patterns written out as data
 * (alternatives of items: a class with a greedy {min,max}, the contraction group, the
 * (?!\S) look-ahead), tried in order at each position, exactly as a backtracking engine
 * runs them; the merge is tiktoken's byte_pair_merge, scanning all pairs every round.
 * Exponential and quadratic in places: only for short inputs. Shares with the real one only
 * the Unicode class table (checked against tiktoken itself by tests/token) and the rank
 * table's lookup. Header-only: static functions. */
#ifndef MG_TOKEN_REF_H
#define MG_TOKEN_REF_H

#include <stdlib.h>
#include <string.h>

#include "token/encoding.h"
#include "token/uclass.h"
#include "token/utf8.h"

enum { R_CLASS, R_CONTRACTION, R_NOT_NONSPACE };
/* character sets of the patterns: uclass bits, plus single characters */
#define R_CR (1u << 8)
#define R_LF (1u << 9)
#define R_SLASH (1u << 10)
#define R_SPACE (1u << 11)
#define R_NOT (1u << 15) /* complement */
#define R_L MG_UC_SET_L
#define R_N MG_UC_BIT(MG_UC_N)
#define R_WS MG_UC_SET_WS
#define R_M MG_UC_BIT(MG_UC_M)
#define R_UP (MG_UC_BIT(MG_UC_LU) | MG_UC_BIT(MG_UC_LMO) | R_M)
#define R_LO (MG_UC_BIT(MG_UC_LL) | MG_UC_BIT(MG_UC_LMO) | R_M)

typedef struct {
    int kind;
    unsigned set;
    int min, max; /* max -1: unbounded */
} ref_item_t;

typedef struct {
    ref_item_t items[5];
    int n;
} ref_alt_t;

#define ONE(set)                                                                                   \
    {                                                                                              \
        R_CLASS, set, 1, 1                                                                         \
    }
#define OPT(set)                                                                                   \
    {                                                                                              \
        R_CLASS, set, 0, 1                                                                         \
    }
#define STAR(set)                                                                                  \
    {                                                                                              \
        R_CLASS, set, 0, -1                                                                        \
    }
#define PLUS(set)                                                                                  \
    {                                                                                              \
        R_CLASS, set, 1, -1                                                                        \
    }
#define CONTR(min)                                                                                 \
    {                                                                                              \
        R_CONTRACTION, 0, min, 1                                                                   \
    }

/* cl100k: (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *         \s*[\r\n]+|\s+(?!\S)|\s+ */
static const ref_alt_t ref_cl100k[] = {
    {{CONTR(1)}, 1},
    {{OPT(R_NOT | R_CR | R_LF | R_L | R_N), PLUS(R_L)}, 2},
    {{{R_CLASS, R_N, 1, 3}}, 1},
    {{OPT(R_SPACE), PLUS(R_NOT | R_WS | R_L | R_N), STAR(R_CR | R_LF)}, 3},
    {{STAR(R_WS), PLUS(R_CR | R_LF)}, 2},
    {{PLUS(R_WS), {R_NOT_NONSPACE, 0, 0, 0}}, 2},
    {{PLUS(R_WS)}, 1},
};
/* o200k: [^\r\n\p{L}\p{N}]?[UP]*[LO]+(?i:...)?|[^\r\n\p{L}\p{N}]?[UP]+[LO]*(?i:...)?|
 *        \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static const ref_alt_t ref_o200k[] = {
    {{OPT(R_NOT | R_CR | R_LF | R_L | R_N), STAR(R_UP), PLUS(R_LO), CONTR(0)}, 4},
    {{OPT(R_NOT | R_CR | R_LF | R_L | R_N), PLUS(R_UP), STAR(R_LO), CONTR(0)}, 4},
    {{{R_CLASS, R_N, 1, 3}}, 1},
    {{OPT(R_SPACE), PLUS(R_NOT | R_WS | R_L | R_N), STAR(R_CR | R_LF | R_SLASH)}, 3},
    {{STAR(R_WS), PLUS(R_CR | R_LF)}, 2},
    {{PLUS(R_WS), {R_NOT_NONSPACE, 0, 0, 0}}, 2},
    {{PLUS(R_WS)}, 1},
};

static int ref_in(unsigned set, const uint8_t *s, size_t n, size_t i, size_t *len)
{
    uint32_t cp;
    *len = mg_utf8_decode(s + i, n - i, &cp);
    unsigned bits = MG_UC_BIT(mg_uclass(cp));
    if (cp == '\r') bits |= R_CR;
    if (cp == '\n') bits |= R_LF;
    if (cp == '/') bits |= R_SLASH;
    if (cp == ' ') bits |= R_SPACE;
    int hit = (bits & set & ~R_NOT) != 0;
    return (set & R_NOT) ? !hit : hit;
}

/* The contraction group at s[i]: its end, or -1. 's is also 'S and 'ſ (U+017F folds to s). */
static long ref_contraction(const uint8_t *s, size_t n, size_t i)
{
    static const char *const forms[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (i >= n || s[i] != '\'') return -1;
    for (int f = 0; f < 7; f++) {
        size_t k = 0, at = i + 1;
        for (; forms[f][k]; k++, at++) {
            if (at >= n) break;
            if ((s[at] | 0x20) == forms[f][k] &&
                ((s[at] >= 'a' && s[at] <= 'z') || (s[at] >= 'A' && s[at] <= 'Z')))
                continue;
            if (forms[f][k] == 's' && at + 1 < n && s[at] == 0xC5 && s[at + 1] == 0xBF) {
                at++;
                continue;
            }
            break;
        }
        if (!forms[f][k]) return (long)at;
    }
    return -1;
}

static long ref_seq(const ref_alt_t *a, int k, const uint8_t *s, size_t n, size_t pos)
{
    if (k == a->n) return (long)pos;
    const ref_item_t *it = &a->items[k];
    if (it->kind == R_NOT_NONSPACE) {
        size_t len;
        if (pos < n && !ref_in(R_WS, s, n, pos, &len)) return -1;
        return ref_seq(a, k + 1, s, n, pos);
    }
    if (it->kind == R_CONTRACTION) {
        long e = ref_contraction(s, n, pos);
        if (e >= 0) {
            long r = ref_seq(a, k + 1, s, n, (size_t)e);
            if (r >= 0) return r;
        }
        return it->min ? -1 : ref_seq(a, k + 1, s, n, pos);
    }
    /* greedy: take as many as allowed, then give back one at a time */
    size_t *ends = malloc((n - pos + 2) * sizeof(*ends));
    int m = 0;
    size_t at = pos, len;
    ends[0] = pos;
    while (at < n && (it->max < 0 || m < it->max) && ref_in(it->set, s, n, at, &len)) {
        at += len;
        ends[++m] = at;
    }
    long r = -1;
    for (int j = m; j >= it->min && r < 0; j--) r = ref_seq(a, k + 1, s, n, ends[j]);
    free(ends);
    return r;
}

/* The end of the piece at s[p] (well-formed UTF-8). */
static size_t ref_next(mg_pretok_t pattern, const uint8_t *s, size_t n, size_t p)
{
    const ref_alt_t *alts = pattern == MG_PRETOK_O200K ? ref_o200k : ref_cl100k;
    for (int i = 0; i < 7; i++) {
        long e = ref_seq(&alts[i], 0, s, n, p);
        if (e > (long)p) return (size_t)e;
    }
    return n; /* unreachable: every character matches some alternative */
}

/* tiktoken's byte_pair_merge on s[0..n), the ids appended to out; returns how many. */
static size_t ref_bpe(const mg_ranks_t *t, const uint8_t *s, size_t n, uint32_t *out)
{
    size_t *start = malloc((n + 1) * sizeof(*start)), m = n + 1;
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (;;) {
        uint32_t best = MG_RANK_NONE;
        size_t at = 0;
        for (size_t i = 0; i + 2 < m; i++) {
            uint32_t r = mg_ranks_find(t, s + start[i], start[i + 2] - start[i]);
            if (r < best) best = r, at = i;
        }
        if (best == MG_RANK_NONE) break;
        memmove(start + at + 1, start + at + 2, (m - at - 2) * sizeof(*start));
        m--;
    }
    for (size_t i = 0; i + 1 < m; i++)
        out[i] = mg_ranks_find(t, s + start[i], start[i + 1] - start[i]);
    free(start);
    return m - 1;
}

/* The whole tokenizer, slowly: repair, cut at allowed specials, split, merge. out has room
 * for 3 * len + 1 ids. Returns how many. */
static size_t ref_tokenize(const mg_encoding_t *e, const uint8_t *text, size_t len, int special,
                           uint32_t *out)
{
    uint8_t *s = malloc(mg_utf8_repaired_len(text, len) + 1);
    size_t n = mg_utf8_repair(text, len, s), k = 0, p = 0;
    while (p < n) {
        size_t stop = n, sp_len = 0;
        uint32_t sp_id = 0;
        for (size_t i = p; special && i < n && stop == n; i++) {
            for (size_t j = 0; j < e->n_special; j++) {
                if (n - i >= e->special[j].len &&
                    !memcmp(s + i, e->special[j].text, e->special[j].len)) {
                    stop = i, sp_len = e->special[j].len, sp_id = e->special[j].id;
                    break;
                }
            }
        }
        for (size_t q = p; q < stop;) {
            size_t end = ref_next(e->pattern, s + p, stop - p, q - p) + p;
            k += ref_bpe(e->ranks, s + q, end - q, out + k);
            q = end;
        }
        if (!sp_len) break;
        out[k++] = sp_id;
        p = stop + sp_len;
    }
    free(s);
    return k;
}

#endif
