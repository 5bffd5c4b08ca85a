/* quota: all-or-nothing reservation of request, token and concurrency quota across
 * several limit levels (for example the API key, its project, the provider).
 *
 * Each level has three limits, 0 meaning "no limit":
 *   - rpm_limit: requests in a sliding 60-second window;
 *   - tpm_limit: tokens in the same window. A reservation counts the caller's estimate;
 *     mg_quota_settle() later replaces it with the actual count;
 *   - max_concurrency: leases held at once; mg_quota_release() returns the lease.
 *
 * mg_quota_reserve() takes one request, its token estimate and one lease at every level,
 * or at none: when a level refuses, what the earlier levels took is rolled back, and
 * the result names the refusing level and limit and how long to wait.
 *
 * Window precision. The window is a ring of 60 one-second buckets. A request (and its
 * tokens) is counted in the bucket of the second it was reserved in and stops counting
 * when that bucket leaves the window, at the start of the 60th second after it: it
 * counts for between 59 and 60 seconds (never longer), so any 59-second span holds at
 * most rpm_limit requests; a 60-second span may hold up to rpm_limit plus those of one
 * second. Counts themselves are exact. The memory is fixed per level (776 bytes)
 * whatever the limit, and every operation is O(1) (retry_after is O(60)).
 *
 * Times are milliseconds from any monotonic clock, passed in by the caller; a time
 * earlier than one already seen by a level is treated as that later time. Everything
 * runs on one thread: there are no locks. */
#ifndef MG_QUOTA_H
#define MG_QUOTA_H

#include <stddef.h>
#include <stdint.h>

#define MG_QUOTA_WINDOW_S 60 /* seconds in the sliding window */
#define MG_QUOTA_MAX_LEVELS 6

/* Return codes of mg_quota_reserve() and friends: 0 = ok, negative = not done. */
enum {
    MG_QUOTA_OK = 0,
    MG_QUOTA_REFUSED = -1,   /* a limit is reached now; retry_after_ms says when to retry */
    MG_QUOTA_TOO_LARGE = -2, /* est_tokens exceeds a level's tpm_limit: waiting cannot help */
    MG_QUOTA_EINVAL = -3,    /* bad arguments, or settle/release not allowed (again) */
};

/* Which limit refused. */
typedef enum mg_quota_limit_e {
    MG_QUOTA_NONE = 0,
    MG_QUOTA_RPM,
    MG_QUOTA_TPM,
    MG_QUOTA_CONCURRENCY
} mg_quota_limit_t;

/* One limit level with its window state. Initialise with mg_quota_level_init(); the
 * limit fields may be changed at any time (a config reload), the state stays. */
typedef struct mg_quota_level_s {
    const char *name;         /* borrowed, for reports: "key", "project", ... */
    uint32_t rpm_limit;       /* requests per 60 s; 0 = unlimited */
    uint64_t tpm_limit;       /* tokens per 60 s; 0 = unlimited */
    uint32_t max_concurrency; /* leases at once; 0 = unlimited */
    /* state */
    uint32_t in_flight;              /* leases held */
    uint64_t head_s;                 /* latest second seen; buckets cover the 60 up to it */
    uint32_t win_requests;           /* sum of req[] */
    uint64_t win_tokens;             /* sum of tok[] */
    uint32_t req[MG_QUOTA_WINDOW_S]; /* requests reserved in second s, at [s % 60] */
    uint64_t tok[MG_QUOTA_WINDOW_S]; /* tokens counted in second s */
} mg_quota_level_t;

/* A reservation: filled by mg_quota_reserve(). Do not copy a held reservation: settle
 * and release act on the one they are given. The levels must outlive it. */
typedef struct mg_quota_res_s {
    mg_quota_level_t *levels[MG_QUOTA_MAX_LEVELS]; /* borrowed */
    size_t n;
    uint64_t at_s[MG_QUOTA_MAX_LEVELS]; /* second the request was counted in, per level */
    uint64_t tokens;  /* tokens currently counted for it (estimate, then actual) */
    uint8_t held;     /* 1 after a successful reserve */
    uint8_t settled;  /* 1 after mg_quota_settle() */
    uint8_t released; /* 1 after mg_quota_release() */
    /* on refusal */
    int refused_level;              /* index into the caller's levels[], or -1 */
    mg_quota_limit_t refused_limit; /* which of its limits */
    uint64_t retry_after_ms;        /* earliest time worth retrying, from now; 0 = unknown */
} mg_quota_res_t;

/* Set the limits and clear the state. name is borrowed (may be NULL). */
void mg_quota_level_init(mg_quota_level_t *lv, const char *name, uint32_t rpm_limit,
                         uint64_t tpm_limit, uint32_t max_concurrency);

/* Reserve one request, est_tokens tokens and one concurrency lease at each of the n
 * levels (1 <= n <= MG_QUOTA_MAX_LEVELS) at time now_ms, all or nothing.
 *
 * MG_QUOTA_OK: res holds the reservation; the caller must mg_quota_release() it
 * exactly once, and may mg_quota_settle() it once.
 * MG_QUOTA_REFUSED / MG_QUOTA_TOO_LARGE: no level is changed. res->refused_level and
 * res->refused_limit name the first refusing level (in the order given) and limit (rpm,
 * then tpm, then concurrency); res->retry_after_ms is the wait after which every limit
 * of every level that refuses now would accept, if nothing else happened meanwhile.
 * It is 0 when a concurrency limit refuses (a lease's end cannot be foreseen) or for
 * MG_QUOTA_TOO_LARGE. Nothing needs releasing.
 * MG_QUOTA_EINVAL: bad arguments. */
int mg_quota_reserve(mg_quota_level_t **levels, size_t n, uint64_t now_ms, uint64_t est_tokens,
                     mg_quota_res_t *res);

/* Replace the token estimate with actual_tokens at every level of the reservation. When
 * the reservation's second is still in a level's window the count there is corrected in
 * place; when it has left the window the estimate no longer counts, and only tokens in
 * excess of it are added, to the level's latest second (so an underestimate cannot dodge
 * the limit). Once per reservation, before or after release. Returns 0, or
 * MG_QUOTA_EINVAL when res is not a granted reservation or was settled already. */
int mg_quota_settle(mg_quota_res_t *res, uint64_t actual_tokens);

/* Return the concurrency lease at every level. Requests and tokens stay counted.
 * Returns 0, or MG_QUOTA_EINVAL (and changes nothing) when res is not a granted
 * reservation or was released already: a lease is returned exactly once. */
int mg_quota_release(mg_quota_res_t *res);

/* Requests and tokens a level counts in its window at now_ms (advances its window). */
void mg_quota_level_usage(mg_quota_level_t *lv, uint64_t now_ms, uint32_t *requests,
                          uint64_t *tokens);

/* A short static name for a limit: "none", "rpm", "tpm", "concurrency". */
const char *mg_quota_limit_name(mg_quota_limit_t limit);

#endif
