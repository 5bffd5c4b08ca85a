/* userrate: per-user request rate; see userrate.h. */
#include "tenancy/userrate.h"

#include <stdlib.h>
#include <string.h>
#include <openssl/rand.h>

#define WINDOW_S 60
/* A user is known by a seeded 64-bit hash of its name only: among the few thousand users of
 * one minute a collision (two users sharing a window) has a chance of about 1 in 10^10. */
typedef struct entry_s {
    uint64_t hash;            /* 0 = never used */
    uint64_t last_s;          /* second of the newest request */
    uint32_t total;           /* sum of count[] for the seconds in the window */
    uint16_t count[WINDOW_S]; /* requests per second, ring indexed by second % 60 */
} entry_t;

struct mg_userrate_s {
    entry_t *slots; /* MG_USERRATE_MAX, allocated on first use */
    uint64_t seed;
};

mg_userrate_t *mg_userrate_new(void)
{
    mg_userrate_t *u = calloc(1, sizeof(*u));
    if (u && RAND_bytes((unsigned char *)&u->seed, sizeof(u->seed)) != 1)
        u->seed = 0x9e3779b97f4a7c15ULL;
    return u;
}

void mg_userrate_free(mg_userrate_t *u)
{
    if (!u) return;
    free(u->slots);
    free(u);
}

/* FNV-1a over the seed and the bytes; never 0 (0 marks a free slot). */
static uint64_t hash_of(const mg_userrate_t *u, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL ^ u->seed;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ? h : 1;
}

/* Drop the seconds that left the window (everything when a minute has passed). */
static void advance(entry_t *e, uint64_t now_s)
{
    if (now_s <= e->last_s) return;
    uint64_t gap = now_s - e->last_s;
    if (gap >= WINDOW_S) {
        memset(e->count, 0, sizeof(e->count));
        e->total = 0;
    } else {
        for (uint64_t s = e->last_s + 1; s <= now_s; s++) {
            e->total -= e->count[s % WINDOW_S];
            e->count[s % WINDOW_S] = 0;
        }
    }
    e->last_s = now_s;
}

static int idle(const entry_t *e, uint64_t now_s)
{
    return e->hash == 0 || now_s >= e->last_s + WINDOW_S;
}

/* The entry of key (found or claimed), or NULL when the table is full of active users. */
static entry_t *entry_for(mg_userrate_t *u, const char *key, size_t n, uint64_t now_s)
{
    uint64_t h = hash_of(u, key, n);
    entry_t *reuse = NULL;
    /* linear probing; a bounded probe keeps the cost O(1) */
    for (size_t i = 0; i < 64; i++) {
        entry_t *e = &u->slots[(h + i) & (MG_USERRATE_MAX - 1)];
        if (e->hash == h) return e;
        if (!reuse && idle(e, now_s)) reuse = e;
        if (e->hash == 0) break; /* never used: the key is not further along */
    }
    if (!reuse) return NULL;
    memset(reuse, 0, sizeof(*reuse));
    reuse->hash = h;
    reuse->last_s = now_s;
    return reuse;
}

int mg_userrate_take(mg_userrate_t *u, const char *user, size_t n, uint32_t limit, uint64_t now_ms,
                     uint64_t *retry_after_ms)
{
    uint64_t now_s = now_ms / 1000;
    *retry_after_ms = 0;
    if (!u->slots && !(u->slots = calloc(MG_USERRATE_MAX, sizeof(*u->slots))))
        return MG_USERRATE_FULL;
    entry_t *e = entry_for(u, user, n, now_s);
    if (!e) return MG_USERRATE_FULL;
    advance(e, now_s);
    if (e->total >= limit) {
        /* the oldest second still counted leaves the window first */
        uint64_t s = now_s - (WINDOW_S - 1);
        while (s < now_s && e->count[s % WINDOW_S] == 0) s++;
        *retry_after_ms = (s + WINDOW_S) * 1000 - now_ms;
        return MG_USERRATE_LIMITED;
    }
    if (e->count[now_s % WINDOW_S] == UINT16_MAX) return MG_USERRATE_OK; /* limits are lower */
    e->count[now_s % WINDOW_S]++;
    e->total++;
    return MG_USERRATE_OK;
}

size_t mg_userrate_active(const mg_userrate_t *u, uint64_t now_ms)
{
    size_t n = 0;
    for (size_t i = 0; u->slots && i < MG_USERRATE_MAX; i++)
        n += !idle(&u->slots[i], now_ms / 1000);
    return n;
}
