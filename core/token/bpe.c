/* bpe: the two merge strategies of bpe.h, which produce the same parts.
 *
 * Both keep, for each part, the rank of the pair it starts (itself joined with the next
 * part). The small one holds the parts in an array and scans for the lowest rank, then
 * removes the merged part (tiktoken's byte_pair_merge). The large one links the parts in a
 * list and keeps the pairs in a binary heap ordered by (rank, start): popping the least is
 * the same choice as the scan's leftmost lowest, and a merge changes only the ranks of the
 * merged part and of the part before it, each re-placed in the heap in O(log n). */
#include "token/bpe.h"

#include <stdlib.h>

/* The rank of s[a..b), with the two-byte table for pairs of bytes. */
static inline uint32_t rank_of(const mg_ranks_t *t, const uint8_t *s, size_t a, size_t b)
{
    if (b - a == 2) return mg_ranks_pair(t, s + a);
    return mg_ranks_find(t, s + a, b - a);
}

/* --- pieces up to MG_BPE_SMALL bytes: scans over an array ----------------------------- */

/* Merge s[0..n) (2 <= n <= MG_BPE_SMALL); start[0..m] receives the parts' starts (start[m]
 * = n). Returns m, the number of parts. */
static size_t merge_small(const mg_ranks_t *t, const uint8_t *s, size_t n, uint16_t *start)
{
    uint32_t rank[MG_BPE_SMALL + 1];
    size_t m = n;
    for (size_t i = 0; i + 1 < n; i++) {
        start[i] = (uint16_t)i;
        rank[i] = mg_ranks_pair(t, s + i);
    }
    start[n - 1] = (uint16_t)(n - 1);
    rank[n - 1] = MG_RANK_NONE;
    rank[n] = MG_RANK_NONE;
    start[n] = (uint16_t)n;
    for (;;) {
        uint32_t best = MG_RANK_NONE;
        size_t at = 0;
        for (size_t i = 0; i + 1 < m; i++) {
            if (rank[i] < best) {
                best = rank[i];
                at = i;
            }
        }
        if (best == MG_RANK_NONE) break;
        /* parts at and at + 1 become one; then the pairs it starts and ends are re-ranked */
        for (size_t i = at + 1; i < m; i++) {
            start[i] = start[i + 1];
            rank[i] = rank[i + 1];
        }
        m--;
        start[m] = (uint16_t)n;
        rank[at] = at + 1 < m ? rank_of(t, s, start[at], start[at + 2]) : MG_RANK_NONE;
        if (at > 0) rank[at - 1] = rank_of(t, s, start[at - 1], start[at + 1]);
    }
    return m;
}

/* --- longer pieces: a linked list and a heap ------------------------------------------ */

typedef struct {
    uint32_t *next;  /* next part's start (n: none) */
    uint32_t *prev;  /* previous part's start (UINT32_MAX: none) */
    uint32_t *rank;  /* the rank of the pair this part starts, MG_RANK_NONE: none */
    uint32_t *heap;  /* part starts, a min-heap by (rank, start) */
    uint32_t *where; /* a part's index in heap, UINT32_MAX when not in it */
    size_t size;     /* parts in heap */
} big_t;

static inline int less(const big_t *b, uint32_t x, uint32_t y)
{
    return b->rank[x] < b->rank[y] || (b->rank[x] == b->rank[y] && x < y);
}

static inline void put(big_t *b, size_t i, uint32_t x)
{
    b->heap[i] = x;
    b->where[x] = (uint32_t)i;
}

static void sift_up(big_t *b, size_t i)
{
    uint32_t x = b->heap[i];
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!less(b, x, b->heap[up])) break;
        put(b, i, b->heap[up]);
        i = up;
    }
    put(b, i, x);
}

static void sift_down(big_t *b, size_t i)
{
    uint32_t x = b->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= b->size) break;
        if (c + 1 < b->size && less(b, b->heap[c + 1], b->heap[c])) c++;
        if (!less(b, b->heap[c], x)) break;
        put(b, i, b->heap[c]);
        i = c;
    }
    put(b, i, x);
}

static void heap_remove(big_t *b, uint32_t x)
{
    size_t i = b->where[x];
    if (i == UINT32_MAX) return;
    b->where[x] = UINT32_MAX;
    uint32_t last = b->heap[--b->size];
    if (i == b->size) return;
    put(b, i, last);
    sift_down(b, i);
    sift_up(b, b->where[last]);
}

/* Part x's pair rank changed: place it in the heap (or take it out for none). */
static void heap_update(big_t *b, uint32_t x)
{
    if (b->rank[x] == MG_RANK_NONE) {
        heap_remove(b, x);
    } else if (b->where[x] == UINT32_MAX) {
        put(b, b->size++, x);
        sift_up(b, b->size - 1);
    } else {
        sift_up(b, b->where[x]);
        sift_down(b, b->where[x]);
    }
}

static int big_setup(big_t *b, size_t n, mg_bpe_scratch_t *sc)
{
    size_t need = 5 * n * sizeof(uint32_t);
    if (sc->cap < need) {
        void *mem = realloc(sc->mem, need);
        if (!mem) return -1;
        sc->mem = mem;
        sc->cap = need;
    }
    uint32_t *m = sc->mem;
    b->next = m;
    b->prev = m + n;
    b->rank = m + 2 * n;
    b->heap = m + 3 * n;
    b->where = m + 4 * n;
    b->size = 0;
    return 0;
}

/* Merge s[0..n) (n > 1); the parts are then 0, next[0], next[next[0]], ... up to n.
 * Returns the number of parts. */
static size_t merge_big(const mg_ranks_t *t, const uint8_t *s, size_t n, big_t *b)
{
    size_t parts = n;
    for (size_t i = 0; i < n; i++) {
        b->next[i] = (uint32_t)(i + 1);
        b->prev[i] = i ? (uint32_t)(i - 1) : UINT32_MAX;
        b->rank[i] = i + 1 < n ? mg_ranks_pair(t, s + i) : MG_RANK_NONE;
        b->where[i] = UINT32_MAX;
        if (b->rank[i] != MG_RANK_NONE) put(b, b->size++, (uint32_t)i);
    }
    for (size_t i = b->size / 2; i-- > 0;) sift_down(b, i);
    while (b->size) {
        uint32_t x = b->heap[0];
        uint32_t y = b->next[x];
        uint32_t z = b->next[y];
        heap_remove(b, y);
        b->next[x] = z;
        if (z < n) b->prev[z] = x;
        parts--;
        b->rank[x] = z < n ? rank_of(t, s, x, b->next[z]) : MG_RANK_NONE;
        heap_update(b, x);
        uint32_t w = b->prev[x];
        if (w != UINT32_MAX) {
            b->rank[w] = rank_of(t, s, w, z);
            heap_update(b, w);
        }
    }
    return parts;
}

/* --- the entry points ----------------------------------------------------------------- */

long mg_bpe_count(const mg_ranks_t *t, const uint8_t *s, size_t n, mg_bpe_scratch_t *sc)
{
    if (n == 1 || mg_ranks_find(t, s, n) != MG_RANK_NONE) return 1;
    if (n <= MG_BPE_SMALL) {
        uint16_t start[MG_BPE_SMALL + 1];
        return (long)merge_small(t, s, n, start);
    }
    big_t b;
    if (big_setup(&b, n, sc) < 0) return -1;
    return (long)merge_big(t, s, n, &b);
}

long mg_bpe_encode(const mg_ranks_t *t, const uint8_t *s, size_t n, uint32_t *out,
                   mg_bpe_scratch_t *sc)
{
    if (n == 1) {
        out[0] = t->byte_rank[s[0]];
        return 1;
    }
    uint32_t whole = mg_ranks_find(t, s, n);
    if (whole != MG_RANK_NONE) {
        out[0] = whole;
        return 1;
    }
    if (n <= MG_BPE_SMALL) {
        uint16_t start[MG_BPE_SMALL + 1];
        size_t m = merge_small(t, s, n, start);
        for (size_t i = 0; i < m; i++) {
            size_t len = (size_t)(start[i + 1] - start[i]);
            out[i] = len == 1 ? t->byte_rank[s[start[i]]] : rank_of(t, s, start[i], start[i + 1]);
        }
        return (long)m;
    }
    big_t b;
    if (big_setup(&b, n, sc) < 0) return -1;
    size_t m = merge_big(t, s, n, &b), k = 0;
    for (uint32_t i = 0; i < n; i = b.next[i]) {
        size_t len = b.next[i] - i;
        out[k++] = len == 1 ? t->byte_rank[s[i]] : rank_of(t, s, i, b.next[i]);
    }
    return (long)m;
}

void mg_bpe_scratch_free(mg_bpe_scratch_t *sc)
{
    free(sc->mem);
    sc->mem = NULL;
    sc->cap = 0;
}
