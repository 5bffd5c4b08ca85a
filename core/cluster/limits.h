/* limits: rate limits and concurrency leases shared by every instance through Redis (issue 24).
 *
 * One request reserves at all its levels (the key, its project, the provider of the attempt)
 * in ONE server-side Lua script, all or nothing: the script checks every level first and
 * writes only when all accept, so a refusal at any level leaves the others as they were (the
 * single-node mg_quota_reserve's rule). One round trip: EVALSHA of the script loaded with
 * SCRIPT LOAD on each connection, EVAL when Redis answers NOSCRIPT (a restarted or flushed
 * server), never more than one retry.
 *
 * What Redis holds, under cluster.redis.key_prefix (default "moongate:"), per level "NAME"
 * ("k:12" a key, "p:3" a project, "v:openai" a provider):
 *   NAME:r  sorted set, one member per admission scored by its time (ms): the exact sliding
 *           60 s log of the RPM limit (an admission at t counts in (t, t + 60000]);
 *   NAME:t  hash second -> tokens reserved in that second (then corrected at release): TPM
 *           over the 60 one-second buckets up to now, as the single node counts it;
 *   NAME:c  sorted set, one member per concurrency lease scored by its expiry (ms): a lease
 *           not released by then (its instance died) stops counting by itself.
 * and per spend level "NAME" ("k:12" a key, "p:3" a project, "t:1" a tenant), prefixed "s:":
 *   s:NAME:h  hash lease -> micros held by a request in flight, and "_sum" their total;
 *   s:NAME:z  sorted set lease -> expiry (ms) of each hold: a dead instance's holds return;
 *   s:NAME:d:<YYYY-MM-DD>, s:NAME:m:<YYYY-MM>  the micros spent in the UTC day and month.
 * A spend level is refused when spent >= limit or spent + held + the estimate > limit (the
 * single node's rule, tenancy/auth.h), across instances. The spent figure read is the larger
 * of Redis' and the instance's own (so a Redis that lost its data counts at least what this
 * instance charged; the larger is written back). The release takes the hold out and adds the
 * actual cost to both periods.
 * Every key carries a TTL past the longest time it matters, so idle levels leave Redis.
 * Time is Redis' own (TIME inside the script): the instances' clocks never disagree.
 *
 * Nothing here waits: the answer comes through a callback, "unavailable" when Redis did not
 * answer within cluster.redis.timeout_ms (cluster/redis.h); the caller applies its degraded
 * mode (cluster.redis.degraded). Loop thread only. */
#ifndef MG_CLUSTER_LIMITS_H
#define MG_CLUSTER_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/redis.h"

#define MG_SHARED_MAX_LEVELS 3
#define MG_SHARED_NAME_MAX 96
#define MG_SHARED_LEASE_MAX 64

#define MG_SHARED_MAX_SPEND 3

/* One spend level: a key, project or tenant with a daily or monthly spend limit. */
typedef struct mg_shared_spend_level_s {
    char name[MG_SHARED_NAME_MAX];  /* "k:12", "p:3", "t:1" */
    int64_t daily, monthly;         /* limits, 0 = none */
    int64_t local_day, local_month; /* this instance's figures: the floor of Redis' */
} mg_shared_spend_level_t;

/* The spend levels of one request (key, project, tenant), all or nothing with the rest. */
typedef struct mg_shared_spend_s {
    size_t n;                /* 0: none */
    int64_t micros;          /* reserve: the estimate held; release: the actual cost charged */
    char day[16], month[16]; /* the periods: "2026-12-02", "2026-12" */
    mg_shared_spend_level_t lv[MG_SHARED_MAX_SPEND];
} mg_shared_spend_t;

/* One level and its limits (0 = none). */
typedef struct mg_shared_level_s {
    char name[MG_SHARED_NAME_MAX]; /* "k:12", "p:3", "v:<provider id>" */
    uint32_t rpm;
    uint64_t tpm;
    uint32_t conc;
} mg_shared_level_t;

/* What the script answered. */
typedef enum {
    MG_SHARED_OK = 0,          /* reserved at every level */
    MG_SHARED_REFUSED = -1,    /* a level's limit is reached: nothing was reserved */
    MG_SHARED_TOO_LARGE = -2,  /* the tokens exceed a level's tpm: waiting cannot help */
    MG_SHARED_UNAVAILABLE = -3 /* Redis unreachable, late or erroring: nothing is known */
} mg_shared_rc_t;

typedef struct mg_shared_answer_s {
    mg_shared_rc_t rc;
    int level;               /* refusing level's index, -1 when none; n + j: spend level j */
    int limit;               /* 1 rpm, 2 tpm, 3 concurrency, 4 daily spend, 5 monthly, 0 none */
    int64_t held_micros;     /* a spend refusal: what requests in flight hold there */
    uint64_t retry_after_ms; /* when it may accept (0: unknown, a lease's end) */
    uint64_t at_s;           /* OK: the Redis second the tokens were counted in */
} mg_shared_answer_t;

typedef void (*mg_shared_cb)(void *ud, const mg_shared_answer_t *a);

typedef struct mg_shared_stats_s {
    unsigned long long reserved, refused, unavailable, noscript, released;
    unsigned long long renewed;           /* leases and spend holds renewed (mg_shared_renew) */
    unsigned long long reconciled;        /* admissions made without Redis, given back to it */
    unsigned long long reconciled_micros; /* spend charged without Redis, given back */
    unsigned long long reconcile_lost;    /* admissions whose giving back was not answered */
    unsigned long long backlog_dropped;   /* admissions or charges the backlog had no room for */
    unsigned long long degraded[3]; /* requests that went on per mode (mg_cluster_degraded_t) */
    double rtt_ms_sum;              /* reserve round trips answered, their total time */
    unsigned long long rtt_n;
} mg_shared_stats_t;

typedef struct mg_shared_s mg_shared_t;

/* The shared limits over r (borrowed, outlives them) with keys under prefix. NULL: r is
 * NULL or out of memory. The scripts are loaded on every connection of r from now on. */
mg_shared_t *mg_shared_new(mg_redis_t *r, const char *prefix);
/* Free it (after mg_redis_stop(r): the callbacks still pending have been told). NULL fine. */
void mg_shared_free(mg_shared_t *s);
mg_redis_t *mg_shared_redis(const mg_shared_t *s);

/* Reserve one request, `tokens` tokens and one lease (expiring after lease_ttl_ms) at each
 * of the n levels (1..MG_SHARED_MAX_LEVELS), all or nothing; lease names the request in the
 * sets (unique per reservation). cb is called exactly once, later. -1 (cb never called):
 * Redis is not connected now, the caller is degraded at once. */
int mg_shared_reserve(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                      uint64_t tokens, uint64_t lease_ttl_ms, const mg_shared_spend_t *spend,
                      mg_shared_cb cb, void *ud);

/* The request's end (fire and forget): the leases returned; the tokens counted at at_s
 * corrected by token_delta (actual - estimate); with undo (the request was never sent) its
 * admission taken out of the RPM logs and its tokens out of the windows too. spend (NULL:
 * none): the holds go and spend->micros is charged to the levels' periods. */
void mg_shared_release(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                       uint64_t at_s, int64_t token_delta, int undo,
                       const mg_shared_spend_t *spend);

/* A request still running (fire and forget): its concurrency leases and spend holds at the n
 * levels (and spend's; NULL: none) live lease_ttl_ms from now. One still in its set only: a
 * lease that expired meanwhile (Redis unreachable that long) is not brought back. */
void mg_shared_renew(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, const char *lease,
                     uint64_t lease_ttl_ms, const mg_shared_spend_t *spend);

/* The scripts' text (0 reserve, 1 release, 2 renew), for the test that runs them against a
 * real redis-server. */
const char *mg_shared_script(int which);

/* Reconciliation (cluster/backlog.h): a request admitted without Redis (the local or
 * fail_open mode) at the n levels, with its estimated tokens; a cost charged without Redis.
 * Both are kept (bounded, the last minute) and given back by mg_shared_reconcile: one script
 * run per 64 buckets, which puts the admissions still inside the window into the RPM logs at
 * their age and the tokens into their second, and adds the micros to the spend periods.
 * mg_shared_reserve calls it first (so Redis counts them before the reservation), the lease
 * tick when no request comes. Nothing is sent twice: a run Redis did not answer is counted as
 * lost (it may have been applied). */
void mg_shared_note_local(mg_shared_t *s, const mg_shared_level_t *lv, size_t n, uint64_t tokens);
void mg_shared_note_local_spend(mg_shared_t *s, const mg_shared_spend_t *spend);
void mg_shared_reconcile(mg_shared_t *s);
const char *mg_shared_reconcile_script(void); /* its text, for the script test */

/* A request went on without Redis in `mode` (counted for /status and the metrics). */
void mg_shared_note_degraded(mg_shared_t *s, int mode);
void mg_shared_stats(const mg_shared_t *s, mg_shared_stats_t *out);

#endif
