/* limiter: per-provider rate limits (requests per minute, tokens per minute).
 *
 * Every function takes the current time as uint64_t milliseconds from the caller
 * (the loop's monotonic clock, uv_now()); nothing in here reads a clock, so the
 * behaviour is a pure function of the calls made and tests are exact. Times passed
 * to one window must not go backwards: an earlier time than one already seen is
 * treated as the latest time seen.
 *
 * RPM is an exact sliding log: never more than rpm_limit admissions in any 60 s
 * window [t, t + 60000). TPM is a bucketed sliding window (61 one-second buckets):
 * it never lets reservations exceed tpm_limit in any 60 s window either, but may
 * keep refusing up to 1 s longer than an exact log would (see limiter.c).
 *
 * The three layers: mg_rpm_window_t, mg_tpm_window_t, and mg_limiter_t that
 * reserves both together, all or nothing. None of them is thread-safe: a window
 * belongs to the loop thread. */
#ifndef MG_LIMITER_H
#define MG_LIMITER_H

#include <stdint.h>

#define MG_LIMIT_WINDOW_MS 60000u /* every limit here is "per 60 s" */
#define MG_LIMIT_NEVER UINT64_MAX /* next_ms when waiting can never help */

/* Return codes of mg_limiter_reserve*(). */
#define MG_LIMIT_OK 0
#define MG_LIMIT_RPM (-1) /* the request budget of the window is used up */
#define MG_LIMIT_TPM (-2) /* the token budget of the window is used up */

/* ------------------------------------------------------------------------ */
/* RPM: exact sliding log                                                     */

/* The admissions recorded at one millisecond. */
typedef struct mg_rpm_run_s {
    uint64_t t;   /* ms */
    uint64_t end; /* number of the admission after this run's last (numbers only grow) */
} mg_rpm_run_t;

typedef struct mg_rpm_window_s {
    mg_rpm_run_t *runs; /* owned ring of cap runs, oldest at head; grows as needed */
    int cap, head, n_runs;
    uint64_t first;         /* number of the oldest admission kept */
    uint64_t next;          /* number the next admission gets: next - first are kept, <= limit */
    int limit;              /* admissions allowed per 60 s; 0 = unlimited (no log) */
    double emergency_ratio; /* share of limit for emergency admissions (default 0.1) */
} mg_rpm_window_t;

/* Initialise w for `limit` requests per 60 s (0 = unlimited). The log grows with the
 * traffic (16 bytes per millisecond that admitted something in the last minute, at most
 * 1 MiB) and is freed by mg_rpm_free(). Returns 0, or -1 (limit < 0; w is then
 * empty and unlimited and mg_rpm_free() is still safe). An admission the log has no
 * memory to record is refused. */
int mg_rpm_init(mg_rpm_window_t *w, int limit);

/* Release the ring. w may be re-initialised afterwards. Safe on a zeroed w. */
void mg_rpm_free(mg_rpm_window_t *w);

/* Change the limit, keeping history: the most recent min(count, new limit)
 * admissions are kept, which is all an exact decision at the new limit needs.
 * Going to 0 (unlimited) drops the history; going from 0 starts empty.
 * Returns 0, or -1 (limit < 0; w unchanged). */
int mg_rpm_set_limit(mg_rpm_window_t *w, int limit);

/* Whether an admission at now_ms would be allowed (no change to w). Always 1
 * when unlimited. */
int mg_rpm_can(const mg_rpm_window_t *w, uint64_t now_ms);

/* Admit and record a request at now_ms if the limit allows it: returns 1
 * (recorded) or 0 (refused, w unchanged). Admission means fewer than `limit`
 * admissions in (now_ms - 60000, now_ms]. */
int mg_rpm_try(mg_rpm_window_t *w, uint64_t now_ms);

/* The earliest time >= now_ms at which mg_rpm_try() would succeed if nothing else
 * were admitted meanwhile: now_ms when it would succeed now. */
uint64_t mg_rpm_next_ms(const mg_rpm_window_t *w, uint64_t now_ms);

/* Admissions in (now_ms - 60000, now_ms]. Exact (0 when unlimited: no log is
 * kept; mg_limiter_rpm_used() gives an approximate count then). */
int mg_rpm_used(const mg_rpm_window_t *w, uint64_t now_ms);

/* The emergency cap: floor(limit * emergency_ratio), at least 1 (0 when
 * unlimited). With the default ratio, 10% of the limit. */
int mg_rpm_emergency_limit(const mg_rpm_window_t *w);

/* Set the emergency share (config routing.emergency_rpm_ratio), clamped to
 * 0..1; init sets 0.1. Kept by mg_rpm_set_limit(). */
void mg_rpm_set_emergency_ratio(mg_rpm_window_t *w, double ratio);

/* Emergency admission (the degradation chain's last resort, ADR 3.5): admit and
 * record at now_ms only if fewer than mg_rpm_emergency_limit() admissions are in
 * the window, counting normal and emergency admissions alike. Returns 1 or 0.
 * An unlimited window admits (there is no limit to take 10% of). */
int mg_rpm_try_emergency(mg_rpm_window_t *w, uint64_t now_ms);

/* The earliest time >= now_ms at which mg_rpm_try_emergency() would succeed. */
uint64_t mg_rpm_emergency_next_ms(const mg_rpm_window_t *w, uint64_t now_ms);

/* Take back an admission recorded at at_ms (a request admitted but then not
 * sent). Removes the newest entry equal to at_ms; no-op if none is left (it has
 * already been pushed out of the ring, which only happens to entries outside
 * every window that still matters). */
void mg_rpm_undo(mg_rpm_window_t *w, uint64_t at_ms);

/* ------------------------------------------------------------------------ */
/* TPM: bucketed sliding window                                               */

#define MG_TPM_BUCKETS 61 /* one-second buckets: the current second plus 60 whole ones */

typedef struct mg_tpm_bucket_s {
    uint64_t sec;     /* which second (now_ms / 1000) this slot holds */
    int64_t tokens;   /* tokens reserved (then settled) in that second */
    int32_t requests; /* reservations made in that second */
} mg_tpm_bucket_t;

typedef struct mg_tpm_window_s {
    mg_tpm_bucket_t b[MG_TPM_BUCKETS];
    int64_t limit;    /* tokens per 60 s; 0 = unlimited (still counted) */
    uint64_t cur_sec; /* latest second seen */
    int64_t tokens;   /* sum of tokens over the buckets in the window */
    int32_t requests; /* sum of requests over the buckets in the window */
} mg_tpm_window_t;

/* A reservation: what settle/release needs to correct the window. A plain value
 * kept by the caller (no allocation). */
typedef struct mg_tpm_resv_s {
    uint64_t sec;   /* bucket second the tokens went into */
    int64_t tokens; /* tokens currently counted for it */
    int active;     /* 1 until settled or released */
} mg_tpm_resv_t;

/* Initialise for `limit` tokens per 60 s (0 = unlimited; < 0 is taken as 0). */
void mg_tpm_init(mg_tpm_window_t *w, int64_t limit);

/* Change the limit; the counted history is kept. */
void mg_tpm_set_limit(mg_tpm_window_t *w, int64_t limit);

/* Tokens counted in the window at now_ms (advances the window). */
int64_t mg_tpm_used(mg_tpm_window_t *w, uint64_t now_ms);

/* Whether reserving `tokens` at now_ms would be allowed: used + tokens <= limit
 * (always when unlimited). Advances the window. tokens < 0 is taken as 0. */
int mg_tpm_can(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens);

/* Reserve `tokens` (an estimate) at now_ms. Returns 1 and fills *r, or 0
 * (refused; w unchanged except for advancing, *r inactive). */
int mg_tpm_reserve(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens, mg_tpm_resv_t *r);

/* Replace the estimate with the actual count. The correction goes into the
 * reservation's own bucket if that second is still in the window; otherwise it
 * no longer matters and is dropped. A bucket never goes below 0. The window may
 * exceed the limit after a correction upwards (the tokens were spent). r becomes
 * inactive; settling an inactive reservation does nothing. */
void mg_tpm_settle(mg_tpm_window_t *w, mg_tpm_resv_t *r, int64_t actual_tokens);

/* Take the reservation back entirely (the request was never sent): the
 * tokens and the request count are removed. r becomes inactive. */
void mg_tpm_release(mg_tpm_window_t *w, mg_tpm_resv_t *r);

/* The earliest time >= now_ms at which reserving `tokens` would succeed if
 * nothing else were reserved meanwhile; MG_LIMIT_NEVER when tokens > limit
 * (such a request can never fit). Advances the window. */
uint64_t mg_tpm_next_ms(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens);

/* ------------------------------------------------------------------------ */
/* Provider limiter: RPM and TPM together                                    */

typedef struct mg_limiter_s {
    mg_rpm_window_t rpm;       /* owned */
    mg_rpm_window_t emergency; /* owned: emergency admissions only, limit = the emergency cap.
                                  Counted apart: a provider that answered 429 usually filled
                                  much of its window, and the channel must still open. */
    mg_tpm_window_t tpm; /* also counts requests approximately (for rpm_used when unlimited) */
} mg_limiter_t;

/* One admission through mg_limiter_reserve*(): keep it with the request. */
typedef struct mg_limiter_resv_s {
    uint64_t at_ms;    /* admission time (for mg_rpm_undo) */
    int rpm_recorded;  /* 1 if an RPM log entry was written */
    mg_tpm_resv_t tpm; /* the token reservation */
} mg_limiter_resv_t;

/* Initialise for rpm_limit / tpm_limit per 60 s (0 = unlimited).
 * Returns 0 or -1 (negative rpm_limit, out of memory); mg_limiter_free() is
 * safe either way. */
int mg_limiter_init(mg_limiter_t *l, int rpm_limit, int64_t tpm_limit);

/* Release what init allocated. */
void mg_limiter_free(mg_limiter_t *l);

/* Change both limits keeping history (a config reload). Returns 0 or -1 (then
 * nothing changed). */
int mg_limiter_set_limits(mg_limiter_t *l, int rpm_limit, int64_t tpm_limit);

/* Reserve one request and `tokens` estimated tokens at now_ms, all or nothing:
 * returns MG_LIMIT_OK and fills *r, or MG_LIMIT_RPM / MG_LIMIT_TPM (nothing is
 * recorded; RPM is reported first when both refuse). */
int mg_limiter_reserve(mg_limiter_t *l, uint64_t now_ms, int64_t tokens, mg_limiter_resv_t *r);

/* Same, but the request side uses the emergency cap (10% of rpm_limit by
 * default, at least 1, counted in the same window; see
 * mg_rpm_set_emergency_ratio() on l->rpm). TPM is checked at its normal limit. */
int mg_limiter_reserve_emergency(mg_limiter_t *l, uint64_t now_ms, int64_t tokens,
                                 mg_limiter_resv_t *r);

/* Replace the token estimate with the actual count (see mg_tpm_settle). The
 * request stays counted. */
void mg_limiter_settle(mg_limiter_t *l, mg_limiter_resv_t *r, int64_t actual_tokens);

/* Take the whole admission back (request and tokens): the request was never
 * sent. Does nothing to an already settled/cancelled reservation's tokens. */
void mg_limiter_cancel(mg_limiter_t *l, mg_limiter_resv_t *r);

/* The earliest time >= now_ms at which mg_limiter_reserve(tokens) would
 * succeed (the later of the RPM and TPM times); MG_LIMIT_NEVER if never. */
uint64_t mg_limiter_next_ms(mg_limiter_t *l, uint64_t now_ms, int64_t tokens);

/* Requests in the last 60 s: exact when rpm_limit > 0, from the one-second
 * buckets (60-61 s) when unlimited. Advances the token window. */
int mg_limiter_rpm_used(mg_limiter_t *l, uint64_t now_ms);

/* Tokens in the window (see mg_tpm_used). */
int64_t mg_limiter_tpm_used(mg_limiter_t *l, uint64_t now_ms);

/* (rpm_limit - rpm_used) / rpm_limit clamped to 0..1, rounded down to a multiple of
 * 1/MG_HEADROOM_STEPS but at least one step while any request is left; 1 when unlimited. */
#define MG_HEADROOM_STEPS 1000
double mg_limiter_headroom(mg_limiter_t *l, uint64_t now_ms);

/* The three above at once, as the routing decision reads them for every route of a
 * request: one look at the RPM log instead of one per figure, and that one amortised
 * O(1) (it drops the admissions that have left the window). */
typedef struct mg_limiter_usage_s {
    int rpm_used;
    int64_t tpm_used;
    double headroom;
} mg_limiter_usage_t;
void mg_limiter_usage(mg_limiter_t *l, uint64_t now_ms, mg_limiter_usage_t *out);

#endif
