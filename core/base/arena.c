/* arena: bump allocation in chained blocks; see arena.h. */
#include "base/arena.h"

#include <stdlib.h>
#include <string.h>
#include <stdint.h>

struct mg_arena_block_s {
    mg_arena_block_t *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

struct mg_arena_cleanup_s {
    mg_arena_cleanup_t *next;
    void (*fn)(void *);
    void *data;
};

void mg_arena_init(mg_arena_t *a, size_t block_size)
{
    a->head = NULL;
    a->cleanups = NULL;
    a->block_size = block_size ? block_size : 4096;
}

void *mg_arena_alloc(mg_arena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    mg_arena_block_t *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t size = n > a->block_size ? n : a->block_size;
        b = malloc(sizeof(*b) + size);
        if (!b) return NULL;
        b->used = 0;
        b->size = size;
        /* A big one-off allocation goes behind the head so the head keeps its room. */
        if (a->head && n > a->block_size) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

void *mg_arena_calloc(mg_arena_t *a, size_t n)
{
    void *p = mg_arena_alloc(a, n);
    if (p) memset(p, 0, n);
    return p;
}

char *mg_arena_strndup(mg_arena_t *a, const char *s, size_t n)
{
    char *p = mg_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *mg_arena_strdup(mg_arena_t *a, const char *s)
{
    return mg_arena_strndup(a, s, strlen(s));
}

int mg_arena_on_destroy(mg_arena_t *a, void (*fn)(void *), void *data)
{
    mg_arena_cleanup_t *c = mg_arena_alloc(a, sizeof(*c));
    if (!c) return -1;
    c->fn = fn;
    c->data = data;
    c->next = a->cleanups;
    a->cleanups = c;
    return 0;
}

void mg_arena_reset(mg_arena_t *a)
{
    for (mg_arena_cleanup_t *c = a->cleanups; c; c = c->next) c->fn(c->data);
    a->cleanups = NULL;
    mg_arena_block_t *keep = NULL, *b = a->head;
    while (b) {
        mg_arena_block_t *next = b->next;
        if (!keep && b->size == a->block_size) keep = b;
        else free(b);
        b = next;
    }
    if (keep) {
        keep->used = 0;
        keep->next = NULL;
    }
    a->head = keep;
}

void mg_arena_destroy(mg_arena_t *a)
{
    /* cleanups live inside the blocks: run them all before freeing any block */
    for (mg_arena_cleanup_t *c = a->cleanups; c; c = c->next) c->fn(c->data);
    a->cleanups = NULL;
    mg_arena_block_t *b = a->head;
    while (b) {
        mg_arena_block_t *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}
