/* idem_cache: entries by id in a chained hash table, groups by name in another; each group
 * keeps its done entries in a list, oldest first, so the cap evicts from its head; all done
 * entries also sit in one list in completion order, whose head expires first (the TTL is
 * the same for all; an entry read back with a longer one is caught by find's expiry check).
 * Both tables double when their load passes 1. See idem_cache.h. */
#include "pipeline/idem_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crypto.h"
#include "base/siphash.h"

struct mg_idem_group_s {
    mg_idem_group_t *hnext;
    mg_idem_entry_t *oldest, *newest; /* done entries */
    size_t n_done;
    int64_t stored_until_ms; /* records not in memory may be live until then */
    char name[];
};

static uint64_t hash_of(const mg_idem_cache_t *c, const char *s)
{
    uint64_t t[2];
    mg_siphash128(s, strlen(s), c->key, t);
    return t[0];
}

/* Double a table of chains (next pointer at offset `link`) once its load passes 1. */
static int grow(void ***buckets, size_t *n, size_t count, const mg_idem_cache_t *c,
                const char *(*name_of)(void *), void **(*link)(void *))
{
    if (count < *n) return 0;
    size_t nn = *n * 2;
    void **nb = calloc(nn, sizeof(void *));
    if (!nb) return -1;
    for (size_t i = 0; i < *n; i++) {
        void *e = (*buckets)[i];
        while (e) {
            void *next = *link(e);
            size_t b = hash_of(c, name_of(e)) & (nn - 1);
            *link(e) = nb[b];
            nb[b] = e;
            e = next;
        }
    }
    free(*buckets);
    *buckets = nb;
    *n = nn;
    return 0;
}

static const char *entry_name(void *e)
{
    return ((mg_idem_entry_t *)e)->id;
}
static void **entry_link(void *e)
{
    return (void **)&((mg_idem_entry_t *)e)->hnext;
}
static const char *group_name(void *g)
{
    return ((mg_idem_group_t *)g)->name;
}
static void **group_link(void *g)
{
    return (void **)&((mg_idem_group_t *)g)->hnext;
}

int mg_idem_cache_init(mg_idem_cache_t *c, int max_per_group)
{
    memset(c, 0, sizeof(*c));
    c->max_per_group = max_per_group > 0 ? max_per_group : 1;
    c->n_buckets = 64;
    c->n_gbuckets = 8;
    c->buckets = calloc(c->n_buckets, sizeof(*c->buckets));
    c->gbuckets = calloc(c->n_gbuckets, sizeof(*c->gbuckets));
    if (!c->buckets || !c->gbuckets || mg_random_bytes(c->key, sizeof(c->key)) != 0) {
        mg_idem_cache_free(c);
        return -1;
    }
    return 0;
}

void mg_idem_cache_free(mg_idem_cache_t *c)
{
    for (size_t i = 0; c->buckets && i < c->n_buckets; i++) {
        while (c->buckets[i]) {
            mg_idem_entry_t *e = c->buckets[i];
            c->buckets[i] = e->hnext;
            free(e->body);
            free(e);
        }
    }
    for (size_t i = 0; c->gbuckets && i < c->n_gbuckets; i++) {
        while (c->gbuckets[i]) {
            mg_idem_group_t *g = c->gbuckets[i];
            c->gbuckets[i] = g->hnext;
            free(g);
        }
    }
    free(c->buckets);
    free(c->gbuckets);
    memset(c, 0, sizeof(*c));
}

static mg_idem_group_t *group_find(const mg_idem_cache_t *c, const char *name)
{
    mg_idem_group_t *g = c->gbuckets[hash_of(c, name) & (c->n_gbuckets - 1)];
    while (g && strcmp(g->name, name) != 0) g = g->hnext;
    return g;
}

static mg_idem_group_t *group_get(mg_idem_cache_t *c, const char *name)
{
    mg_idem_group_t *g = group_find(c, name);
    if (g) return g;
    if (grow((void ***)&c->gbuckets, &c->n_gbuckets, c->n_groups, c, group_name, group_link) != 0)
        return NULL;
    size_t n = strlen(name) + 1;
    g = calloc(1, sizeof(*g) + n);
    if (!g) return NULL;
    memcpy(g->name, name, n);
    size_t b = hash_of(c, name) & (c->n_gbuckets - 1);
    g->hnext = c->gbuckets[b];
    c->gbuckets[b] = g;
    c->n_groups++;
    return g;
}

/* Take a done entry out of both done lists. */
static void unlink_done(mg_idem_cache_t *c, mg_idem_entry_t *e)
{
    mg_idem_group_t *g = e->group;
    if (e->prev) e->prev->next = e->next;
    else g->oldest = e->next;
    if (e->next) e->next->prev = e->prev;
    else g->newest = e->prev;
    g->n_done--;
    if (e->eprev) e->eprev->enext = e->enext;
    else c->oldest = e->enext;
    if (e->enext) e->enext->eprev = e->eprev;
    else c->newest = e->eprev;
    e->prev = e->next = e->eprev = e->enext = NULL;
}

void mg_idem_cache_remove(mg_idem_cache_t *c, mg_idem_entry_t *e)
{
    mg_idem_entry_t **pp = &c->buckets[hash_of(c, e->id) & (c->n_buckets - 1)];
    while (*pp && *pp != e) pp = &(*pp)->hnext;
    if (*pp) *pp = e->hnext;
    c->n_entries--;
    if (e->done) unlink_done(c, e);
    free(e->body);
    free(e);
}

mg_idem_entry_t *mg_idem_cache_find(mg_idem_cache_t *c, const char *id, int64_t now_ms)
{
    mg_idem_entry_t *e = c->buckets[hash_of(c, id) & (c->n_buckets - 1)];
    while (e && strcmp(e->id, id) != 0) e = e->hnext;
    if (e && e->done && e->expires_ms <= now_ms) {
        mg_idem_cache_remove(c, e);
        return NULL;
    }
    return e;
}

mg_idem_entry_t *mg_idem_cache_add(mg_idem_cache_t *c, const char *id, const char *group)
{
    mg_idem_group_t *g = group_get(c, group);
    if (!g ||
        grow((void ***)&c->buckets, &c->n_buckets, c->n_entries, c, entry_name, entry_link) != 0)
        return NULL;
    mg_idem_entry_t *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->group = g;
    size_t b = hash_of(c, e->id) & (c->n_buckets - 1);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    c->n_entries++;
    return e;
}

int mg_idem_cache_complete(mg_idem_cache_t *c, mg_idem_entry_t *e, int status, int stream,
                           char *body, size_t len, int64_t expires_ms)
{
    mg_idem_group_t *g = e->group;
    e->done = 1;
    e->owner = NULL;
    e->status = status;
    e->stream = stream;
    e->body = body;
    e->len = len;
    e->expires_ms = expires_ms;
    e->prev = g->newest;
    if (g->newest) g->newest->next = e;
    else g->oldest = e;
    g->newest = e;
    g->n_done++;
    e->eprev = c->newest;
    if (c->newest) c->newest->enext = e;
    else c->oldest = e;
    c->newest = e;
    int evicted = 0;
    while (g->n_done > (size_t)c->max_per_group) {
        mg_idem_entry_t *old = g->oldest;
        if (old->expires_ms > g->stored_until_ms) g->stored_until_ms = old->expires_ms;
        mg_idem_cache_remove(c, old);
        evicted++;
    }
    c->evicted_total += (uint64_t)evicted;
    return evicted;
}

void mg_idem_cache_prune(mg_idem_cache_t *c, int64_t now_ms)
{
    while (c->oldest && c->oldest->expires_ms <= now_ms) mg_idem_cache_remove(c, c->oldest);
}

int mg_idem_cache_may_be_stored(const mg_idem_cache_t *c, const char *group, int64_t now_ms)
{
    const mg_idem_group_t *g = group_find(c, group);
    return g && g->stored_until_ms > now_ms;
}

int mg_idem_cache_note_stored(mg_idem_cache_t *c, const char *group, int64_t expires_ms)
{
    mg_idem_group_t *g = group_get(c, group);
    if (!g) return -1;
    if (expires_ms > g->stored_until_ms) g->stored_until_ms = expires_ms;
    return 0;
}

size_t mg_idem_cache_group_count(const mg_idem_cache_t *c, const char *group)
{
    const mg_idem_group_t *g = group_find(c, group);
    return g ? g->n_done : 0;
}
