/* tokenize: the walk over a text, tiktoken's order: the text is cut at the special tokens
 * that are allowed; each ordinary stretch between them is split into pieces by the
 * encoding's pattern as a text of its own (so \s+(?!\S) sees the stretch end as the text
 * end, as in tiktoken), and each piece is merged by BPE. Counting and encoding share the
 * walk; only what they do with a piece differs. */
#include "token/tokenize.h"

#include <stdlib.h>
#include <string.h>

#include "token/bpe.h"
#include "token/utf8.h"

typedef struct {
    const mg_encoding_t *e;
    mg_bpe_scratch_t scratch;
    mg_token_ids_t *out; /* NULL: count only */
    long count;
} walk_t;

/* The first allowed special token at or after s[p] (before n): its start in *at, or NULL. */
static const mg_special_t *next_special(const mg_encoding_t *e, const uint8_t *s, size_t p,
                                        size_t n, size_t *at)
{
    while (p + 1 < n) {
        const uint8_t *hit = memmem(s + p, n - p, "<|", 2);
        if (!hit) return NULL;
        size_t i = (size_t)(hit - s);
        for (size_t k = 0; k < e->n_special; k++) {
            const mg_special_t *sp = &e->special[k];
            if (n - i >= sp->len && memcmp(s + i, sp->text, sp->len) == 0) {
                *at = i;
                return sp;
            }
        }
        p = i + 1;
    }
    return NULL;
}

static int reserve(mg_token_ids_t *out, size_t more)
{
    if (out->cap - out->n >= more) return 0;
    size_t cap = out->cap ? out->cap : 64;
    while (cap - out->n < more) cap *= 2;
    uint32_t *ids = realloc(out->ids, cap * sizeof(*ids));
    if (!ids) return -1;
    out->ids = ids;
    out->cap = cap;
    return 0;
}

static int piece(walk_t *w, const uint8_t *s, size_t n)
{
    long got;
    if (!w->out) {
        got = mg_bpe_count(w->e->ranks, s, n, &w->scratch);
    } else {
        if (reserve(w->out, n) < 0) return -1;
        got = mg_bpe_encode(w->e->ranks, s, n, w->out->ids + w->out->n, &w->scratch);
        if (got > 0) w->out->n += (size_t)got;
    }
    if (got < 0) return -1;
    w->count += got;
    return 0;
}

static int ordinary(walk_t *w, const uint8_t *s, size_t n)
{
    for (size_t p = 0; p < n;) {
        size_t end = mg_pretok_next(w->e->pattern, s, n, p);
        if (piece(w, s + p, end - p) < 0) return -1;
        p = end;
    }
    return 0;
}

static int special(walk_t *w, const mg_special_t *sp)
{
    if (w->out) {
        if (reserve(w->out, 1) < 0) return -1;
        w->out->ids[w->out->n++] = sp->id;
    }
    w->count++;
    return 0;
}

static int walk(walk_t *w, const uint8_t *s, size_t n, unsigned flags)
{
    size_t p = 0;
    while (p < n) {
        size_t at = n;
        const mg_special_t *sp =
            (flags & MG_TOKENIZE_SPECIAL) ? next_special(w->e, s, p, n, &at) : NULL;
        if (ordinary(w, s + p, at - p) < 0) return -1;
        if (!sp) break;
        if (special(w, sp) < 0) return -1;
        p = at + sp->len;
    }
    return 0;
}

/* Run the walk over text, repaired first when it is not well-formed UTF-8. */
static int run(walk_t *w, const void *text, size_t len, unsigned flags)
{
    const uint8_t *s = text;
    size_t valid = mg_utf8_valid_prefix(s, len);
    int rc;
    if (valid == len) {
        rc = walk(w, s, len, flags);
    } else {
        size_t tail = mg_utf8_repaired_len(s + valid, len - valid);
        uint8_t *fixed = malloc(valid + tail);
        if (!fixed) return -1;
        memcpy(fixed, s, valid);
        mg_utf8_repair(s + valid, len - valid, fixed + valid);
        rc = walk(w, fixed, valid + tail, flags);
        free(fixed);
    }
    mg_bpe_scratch_free(&w->scratch);
    return rc;
}

long mg_tokenize_count(const mg_encoding_t *e, const void *text, size_t len, unsigned flags)
{
    walk_t w = {.e = e};
    return run(&w, text, len, flags) < 0 ? -1 : w.count;
}

int mg_tokenize_encode(const mg_encoding_t *e, const void *text, size_t len, unsigned flags,
                       mg_token_ids_t *out)
{
    walk_t w = {.e = e, .out = out};
    return run(&w, text, len, flags);
}

void mg_token_ids_free(mg_token_ids_t *ids)
{
    free(ids->ids);
    ids->ids = NULL;
    ids->n = ids->cap = 0;
}
