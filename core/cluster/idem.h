/* cluster idem: idempotency keys shared by every instance through Redis (issue 24).
 *
 * One Redis string per key, PREFIX "idem:" + the key's id (the hex SHA-256 idem.c makes of
 * its scope and key, so neither is kept in clear):
 *   "P\n<node id>"                                  the key runs on that instance (a claim);
 *   "D\n<status>\n<stream>\n<expires ms>\n<body>"   its answer, replayable until it expires.
 * A claim is one SET NX GET (one round trip): either it is taken (the key runs here) or the
 * value already there comes back (the twin runs elsewhere, or its answer). A claim expires by
 * itself (claim TTL), so an instance that died while running a key frees it for the others.
 * The answer replaces the claim with the idempotency TTL.
 *
 * Nothing here waits: replies come through callbacks; "unavailable" when Redis did not answer
 * within cluster.redis.timeout_ms (cluster/redis.h). Loop thread only. */
#ifndef MG_CLUSTER_IDEM_H
#define MG_CLUSTER_IDEM_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/redis.h"

typedef enum {
    MG_CIDEM_OWNED = 0,   /* claimed: run the key here */
    MG_CIDEM_RUNNING,     /* another instance runs it (node says which) */
    MG_CIDEM_DONE,        /* its answer (status, stream, body, expires_ms) */
    MG_CIDEM_GONE,        /* peek only: no claim and no answer (the claim expired) */
    MG_CIDEM_UNAVAILABLE, /* Redis unreachable, late or erroring: nothing is known */
} mg_cidem_rc_t;

typedef struct mg_cidem_answer_s {
    mg_cidem_rc_t rc;
    int status, stream;
    const char *body; /* DONE: valid during the callback only */
    size_t len;
    int64_t expires_ms;
    char node[64]; /* RUNNING: the claiming instance's node id (cut to fit) */
} mg_cidem_answer_t;

typedef void (*mg_cidem_cb)(void *ud, const mg_cidem_answer_t *a);

typedef struct mg_cidem_stats_s {
    unsigned long long claimed, twins, replayed, unavailable, stored, conflicts;
} mg_cidem_stats_t;

typedef struct mg_cidem_s mg_cidem_t;

/* Over r (borrowed, outlives it), keys under prefix, claims naming node_id. NULL when r is
 * NULL or out of memory. */
mg_cidem_t *mg_cidem_new(mg_redis_t *r, const char *prefix, const char *node_id);
void mg_cidem_free(mg_cidem_t *x);
int mg_cidem_up(const mg_cidem_t *x);

/* Claim id for claim_ttl_ms: OWNED, RUNNING or DONE (or UNAVAILABLE). cb exactly once, later.
 * -1 (cb never called): unavailable now. */
int mg_cidem_claim(mg_cidem_t *x, const char *id, uint64_t claim_ttl_ms, mg_cidem_cb cb, void *ud);
/* What id holds now: RUNNING, DONE or GONE (or UNAVAILABLE). Same contract. */
int mg_cidem_peek(mg_cidem_t *x, const char *id, mg_cidem_cb cb, void *ud);
/* id's answer, kept until expires_ms (wall clock), replacing the claim (fire and forget). */
void mg_cidem_put(mg_cidem_t *x, const char *id, int status, int stream, const char *body,
                  size_t len, int64_t expires_ms);
/* The run kept no answer: its claim goes (only while it is still this instance's). */
void mg_cidem_drop(mg_cidem_t *x, const char *id);
/* A twin gave up waiting for another instance (409): counted. */
void mg_cidem_note_conflict(mg_cidem_t *x);
void mg_cidem_stats(const mg_cidem_t *x, mg_cidem_stats_t *out);

/* The value's parts (exposed for the unit test): 0, or -1 when v is not one of ours. */
int mg_cidem_parse(const char *v, size_t len, mg_cidem_answer_t *a);

#endif
