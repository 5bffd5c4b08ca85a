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
 * second. Counts themselves are exact. Every operation is O(1) (retry_after is O(60)).
 *
 * Memory. A level is 16 bytes: the concurrency limit and its lease count. The rpm and tpm
 * limits live with what they count, in a window (mg_quota_window_t, 760 bytes) the level
 * has only while rpm or tpm is limited, because a gateway holds one level per customer key
 * and most keys have neither. mg_quota_level_set_limits() gives a level an empty window
 * when rpm or tpm becomes limited (counting starts then), keeps it with its counts while
 * either stays limited, and frees it when both become unlimited. Each window has a serial
 * number unique in the process; a reservation remembers the serial it counted in, so
 * settling it after its window was freed or replaced changes nothing rather than touching
 * memory or counts that are not its own.
 *
 * Times are milliseconds from any monotonic clock, passed in by the caller; a time
 * earlier than one already seen by a level is treated as that later time. A level is used
 * on one thread: there are no locks (only the counter that numbers windows is atomic, so
 * levels on different threads stay independent). */
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

/* The rate limits of a level and the sliding window they are checked against; a level
 * has one only while rpm_limit or tpm_limit is set (see "Memory" above). */
typedef struct mg_quota_window_s {
    uint64_t serial;                 /* unique in the process, never 0 */
    uint64_t tpm_limit;              /* tokens per 60 s; 0 = unlimited */
    uint32_t rpm_limit;              /* requests per 60 s; 0 = unlimited */
    uint32_t requests;               /* sum of req[] */
    uint64_t tokens;                 /* sum of tok[] */
    uint64_t head_s;                 /* latest second seen; buckets cover the 60 up to it */
    uint32_t req[MG_QUOTA_WINDOW_S]; /* requests reserved in second s, at [s % 60] */
    uint64_t tok[MG_QUOTA_WINDOW_S]; /* tokens counted in second s */
} mg_quota_window_t;

/* One limit level. Initialise with mg_quota_level_init(), free its window with
 * mg_quota_level_free(), and change its limits with mg_quota_level_set_limits() (a config
 * reload: the state stays). max_concurrency, and the limits in a window the level has, may
 * also be written directly. */
typedef struct mg_quota_level_s {
    mg_quota_window_t *win;   /* owned; NULL = rpm and tpm unlimited (nothing to count) */
    uint32_t max_concurrency; /* leases at once; 0 = unlimited */
    uint32_t in_flight;       /* leases held (counted with or without a window) */
} mg_quota_level_t;

/* A reservation: filled by mg_quota_reserve(). Do not copy a held reservation: settle
 * and release act on the one they are given. The levels must outlive it. */
typedef struct mg_quota_res_s {
    mg_quota_level_t *levels[MG_QUOTA_MAX_LEVELS]; /* borrowed */
    size_t n;
    uint64_t at_s[MG_QUOTA_MAX_LEVELS];       /* second the request was counted in, per level */
    uint64_t win_serial[MG_QUOTA_MAX_LEVELS]; /* serial of the window counted in; 0 = none */
    uint64_t tokens;  /* tokens currently counted for it (estimate, then actual) */
    uint8_t held;     /* 1 after a successful reserve */
    uint8_t settled;  /* 1 after mg_quota_settle() */
    uint8_t released; /* 1 after mg_quota_release() */
    /* on refusal */
    int refused_level;              /* index into the caller's levels[], or -1 */
    mg_quota_limit_t refused_limit; /* which of its limits */
    uint64_t retry_after_ms;        /* earliest time worth retrying, from now; 0 = unknown */
} mg_quota_res_t;

/* Set the limits and clear the state of a new level (or one mg_quota_level_free() freed):
 * an old window would not be freed. Returns 0, or -1 when the window the limits need
 * cannot be allocated (the level is then all zero: unlimited, nothing to free). */
int mg_quota_level_init(mg_quota_level_t *lv, uint32_t rpm_limit, uint64_t tpm_limit,
                        uint32_t max_concurrency);

/* Change the limits, keeping the state: the leases, and the window with its counts while
 * rpm or tpm stays limited. A window is allocated, empty, when rpm or tpm becomes limited,
 * and freed when both become unlimited (reservations still held stay safe to settle and
 * release). Returns 0, or -1 with nothing changed when the window cannot be allocated; it
 * cannot fail when the level has a window already or the new limits need none. */
int mg_quota_level_set_limits(mg_quota_level_t *lv, uint32_t rpm_limit, uint64_t tpm_limit,
                              uint32_t max_concurrency);

/* Free the level's window (the level itself is the caller's); it is then unlimited for rpm
 * and tpm. NULL is fine. */
void mg_quota_level_free(mg_quota_level_t *lv);

/* 1 when the level holds a window (it has an rpm or tpm limit), else 0. */
int mg_quota_level_has_window(const mg_quota_level_t *lv);

/* Heap bytes the level owns beyond its own struct: its window, if any. */
size_t mg_quota_level_heap_bytes(const mg_quota_level_t *lv);

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
 * the limit). A level whose window was freed or replaced since the reservation (its rpm and
 * tpm limits were lifted) is left alone: what was counted went with that window. Once per
 * reservation, before or after release. Returns 0, or
 * MG_QUOTA_EINVAL when res is not a granted reservation or was settled already. */
int mg_quota_settle(mg_quota_res_t *res, uint64_t actual_tokens);

/* Return the concurrency lease at every level. Requests and tokens stay counted.
 * Returns 0, or MG_QUOTA_EINVAL (and changes nothing) when res is not a granted
 * reservation or was released already: a lease is returned exactly once. */
int mg_quota_release(mg_quota_res_t *res);

/* Requests and tokens a level counts in its window at now_ms (advances its window); 0 and
 * 0 for a level without a window. */
void mg_quota_level_usage(mg_quota_level_t *lv, uint64_t now_ms, uint32_t *requests,
                          uint64_t *tokens);

/* A short static name for a limit: "none", "rpm", "tpm", "concurrency". */
const char *mg_quota_limit_name(mg_quota_limit_t limit);

#endif
