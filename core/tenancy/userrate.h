/* userrate: requests per minute per user of an application (edge PRD 3.2.2: "User (within
 * Application): requests_per_minute").
 *
 * Users are named by clients (metadata.user_id or the OpenAI "user" field), so their state
 * must stay bounded: one 140-byte entry per user with a request in the last minute (a ring
 * of 60 one-second counters, as quota.h counts), in an open-addressing table keyed by a
 * seeded hash of the name (the table is allocated on first use).
 * An entry whose window has emptied is reused; when every slot holds a user active in the
 * last minute (MG_USERRATE_MAX of them), new users are let through uncounted (and the
 * caller is told, to log it) rather than refused for someone else's traffic.
 *
 * Loop thread only; O(1) per request apart from the probe sequence. */
#ifndef MG_USERRATE_H
#define MG_USERRATE_H

#include <stddef.h>
#include <stdint.h>

#define MG_USERRATE_MAX 65536 /* users tracked at once */

typedef struct mg_userrate_s mg_userrate_t;

mg_userrate_t *mg_userrate_new(void);
void mg_userrate_free(mg_userrate_t *u);

enum {
    MG_USERRATE_OK = 0,      /* counted */
    MG_USERRATE_LIMITED = 1, /* limit reached: *retry_after_ms says when one is free */
    MG_USERRATE_FULL = 2,    /* no room to track this user: let through uncounted */
};

/* Count one request of `user` (any bytes up to n) at now_ms against limit per 60 s. */
int mg_userrate_take(mg_userrate_t *u, const char *user, size_t n, uint32_t limit, uint64_t now_ms,
                     uint64_t *retry_after_ms);

/* Users with a request in the last minute (tests, metrics). */
size_t mg_userrate_active(const mg_userrate_t *u, uint64_t now_ms);

#endif
