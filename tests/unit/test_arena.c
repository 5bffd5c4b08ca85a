/* Unit tests for core/base/arena.c: alignment, block chaining, big one-off allocations and
 * cleanup handlers (newest first, exactly once). ASan / valgrind catch overlaps and leaks. */
#include "base/arena.h"
#include "mgtest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* Many small allocations of odd sizes: every one 16-byte aligned and none overlapping
 * (each is filled with its own byte and checked after all are made). */
static void test_alignment_and_no_overlap(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 256);
    enum { N = 500 };
    unsigned char *ptrs[N];
    size_t sizes[N];
    int misaligned = 0;
    for (int i = 0; i < N; i++) {
        sizes[i] = (size_t)(i % 37) + 1;
        ptrs[i] = mg_arena_alloc(&a, sizes[i]);
        CHECK(ptrs[i] != NULL);
        if (!ptrs[i]) return;
        if (!aligned16(ptrs[i])) misaligned++;
        memset(ptrs[i], i & 0xff, sizes[i]);
    }
    CHECK_EQ_INT(misaligned, 0);
    int corrupted = 0;
    for (int i = 0; i < N; i++)
        for (size_t k = 0; k < sizes[i]; k++)
            if (ptrs[i][k] != (unsigned char)(i & 0xff)) corrupted++;
    CHECK_EQ_INT(corrupted, 0);
    mg_arena_destroy(&a);
}

/* Zero-size allocations are legal and aligned; a size exactly the block size fits. */
static void test_edge_sizes(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 128);
    void *z = mg_arena_alloc(&a, 0);
    CHECK(z != NULL);
    CHECK(aligned16(z));
    unsigned char *exact = mg_arena_alloc(&a, 128);
    CHECK(exact != NULL);
    CHECK(aligned16(exact));
    if (exact) memset(exact, 0xab, 128);
    unsigned char *odd = mg_arena_alloc(&a, 113); /* rounds up to 128 */
    CHECK(odd != NULL);
    CHECK(aligned16(odd));
    if (odd) memset(odd, 0xcd, 113);
    if (exact) CHECK(exact[127] == 0xab);
    mg_arena_destroy(&a);
}

/* block_size 0 means the default; allocations still work. */
static void test_default_block_size(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 0);
    CHECK(a.block_size > 0);
    char *p = mg_arena_alloc(&a, 100);
    CHECK(p != NULL);
    if (p) memset(p, 1, 100);
    mg_arena_destroy(&a);
}

/* A big allocation (larger than a block) is usable in full and does not cost the
 * current block its room: small allocations before and after it stay intact. */
static void test_big_allocations(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 512);
    char *small1 = mg_arena_strdup(&a, "before");
    size_t big_n = 1 << 20;
    unsigned char *big = mg_arena_alloc(&a, big_n);
    CHECK(big != NULL);
    CHECK(aligned16(big));
    if (big) {
        memset(big, 0x5a, big_n);
        CHECK(big[0] == 0x5a && big[big_n - 1] == 0x5a);
    }
    char *small2 = mg_arena_strdup(&a, "after");
    /* a second big one, then many small ones forcing new blocks */
    unsigned char *big2 = mg_arena_alloc(&a, 100000);
    CHECK(big2 != NULL);
    if (big2) memset(big2, 0x11, 100000);
    for (int i = 0; i < 200; i++) {
        char *s = mg_arena_alloc(&a, 40);
        CHECK(s != NULL);
        if (s) memset(s, 'x', 40);
    }
    CHECK_STR(small1, "before");
    CHECK_STR(small2, "after");
    if (big) CHECK(big[big_n / 2] == 0x5a);
    if (big2) CHECK(big2[99999] == 0x11);
    /* the arena keeps working after a big allocation when the head was the big block's
     * only predecessor: first allocation of a fresh arena is big */
    mg_arena_destroy(&a);
    mg_arena_init(&a, 64);
    unsigned char *first_big = mg_arena_alloc(&a, 10000);
    CHECK(first_big != NULL);
    if (first_big) memset(first_big, 7, 10000);
    char *s = mg_arena_strdup(&a, "small after big first");
    CHECK_STR(s, "small after big first");
    if (first_big) CHECK(first_big[9999] == 7);
    mg_arena_destroy(&a);
}

static void test_calloc_and_strings(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 256);
    /* dirty the arena first so calloc has to clear reused-looking memory */
    unsigned char *dirty = mg_arena_alloc(&a, 64);
    if (dirty) memset(dirty, 0xff, 64);
    unsigned char *z = mg_arena_calloc(&a, 200);
    CHECK(z != NULL);
    int nonzero = 0;
    for (int i = 0; z && i < 200; i++) nonzero += z[i] != 0;
    CHECK_EQ_INT(nonzero, 0);
    char *s = mg_arena_strndup(&a, "hello world", 5);
    CHECK_STR(s, "hello");
    char *e = mg_arena_strdup(&a, "");
    CHECK_STR(e, "");
    const char with_nul[] = {'a', 0, 'b'};
    char *n = mg_arena_strndup(&a, with_nul, 3);
    CHECK(n && n[0] == 'a' && n[1] == 0 && n[2] == 'b' && n[3] == 0);
    mg_arena_destroy(&a);
}

/* ---- cleanups ------------------------------------------------------------------------ */

typedef struct {
    int order[64];
    int n;
    int calls[64];
} trace_t;

typedef struct {
    trace_t *t;
    int id;
} cl_arg_t;

static void record_cleanup(void *data)
{
    cl_arg_t *c = data;
    c->t->order[c->t->n++] = c->id;
    c->t->calls[c->id]++;
}

static void test_cleanups_newest_first_once(void)
{
    trace_t t;
    memset(&t, 0, sizeof(t));
    cl_arg_t args[10];
    mg_arena_t a;
    mg_arena_init(&a, 128); /* small blocks: cleanup records spread over several blocks */
    for (int i = 0; i < 10; i++) {
        args[i].t = &t;
        args[i].id = i;
        CHECK_EQ_INT(mg_arena_on_destroy(&a, record_cleanup, &args[i]), 0);
        /* interleave allocations, including a big one, between registrations */
        mg_arena_alloc(&a, i == 5 ? 5000 : 48);
    }
    CHECK_EQ_INT(t.n, 0); /* nothing runs before destroy */
    mg_arena_destroy(&a);
    CHECK_EQ_INT(t.n, 10);
    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(t.order[i], 9 - i);
        CHECK_EQ_INT(t.calls[i], 1);
    }
    /* destroying again (already empty) runs nothing more */
    mg_arena_destroy(&a);
    CHECK_EQ_INT(t.n, 10);
    /* the arena can be initialised and used again */
    mg_arena_init(&a, 128);
    args[0].id = 0;
    CHECK_EQ_INT(mg_arena_on_destroy(&a, record_cleanup, &args[0]), 0);
    mg_arena_destroy(&a);
    CHECK_EQ_INT(t.n, 11);
    CHECK_EQ_INT(t.calls[0], 2);
}

/* A cleanup may read memory of the same arena (it still exists when cleanups run). */
static char seen[32];
static void read_arena_string(void *data)
{
    snprintf(seen, sizeof(seen), "%s", (const char *)data);
}

static void test_cleanup_sees_arena_memory(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 64);
    char *s = mg_arena_strdup(&a, "still here");
    CHECK_EQ_INT(mg_arena_on_destroy(&a, read_arena_string, s), 0);
    for (int i = 0; i < 20; i++) mg_arena_alloc(&a, 60); /* push it out of the head block */
    seen[0] = '\0';
    mg_arena_destroy(&a);
    CHECK_STR(seen, "still here");
}

/* A cleanup that frees malloc'd memory: leak checkers see nothing left behind. */
static void test_cleanup_frees_heap(void)
{
    mg_arena_t a;
    mg_arena_init(&a, 256);
    for (int i = 0; i < 50; i++) {
        void *p = malloc(100);
        CHECK_EQ_INT(mg_arena_on_destroy(&a, free, p), 0);
    }
    mg_arena_destroy(&a);
}

static void count_call(void *data)
{
    ++*(int *)data;
}

/* Reset runs the cleanups once, keeps one block of the block size (the rest, big one-offs
 * included, are freed: ASan / valgrind see leaks) and serves new allocations. */
static void test_reset_reuses(void)
{
    mg_arena_t a;
    int calls = 0;
    mg_arena_init(&a, 256);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 20; i++) {
            char *p = mg_arena_alloc(&a, 100);
            CHECK(p != NULL);
            if (p) memset(p, i, 100);
        }
        char *big = mg_arena_alloc(&a, 5000);
        CHECK(big != NULL);
        if (big) memset(big, 7, 5000);
        CHECK_EQ_INT(mg_arena_on_destroy(&a, count_call, &calls), 0);
        mg_arena_reset(&a);
        CHECK_EQ_INT(calls, round + 1);
        CHECK(a.head != NULL);
    }
    char *s = mg_arena_strdup(&a, "after reset");
    CHECK_STR(s, "after reset");
    mg_arena_destroy(&a);
    CHECK_EQ_INT(calls, 3);
    /* an arena that never allocated stays empty */
    mg_arena_init(&a, 256);
    mg_arena_reset(&a);
    CHECK(a.head == NULL);
    mg_arena_destroy(&a);
}

int main(void)
{
    MG_RUN(test_alignment_and_no_overlap);
    MG_RUN(test_edge_sizes);
    MG_RUN(test_default_block_size);
    MG_RUN(test_big_allocations);
    MG_RUN(test_calloc_and_strings);
    MG_RUN(test_cleanups_newest_first_once);
    MG_RUN(test_cleanup_sees_arena_memory);
    MG_RUN(test_cleanup_frees_heap);
    MG_RUN(test_reset_reuses);
    return mg_test_summary();
}
