/* health: the state machines that say whether a provider (or one provider+model
 * route) should get traffic: 429 cooldown, circuit breaker, passive health.
 *
 * Every structure is a plain value (no allocation, nothing to free), kept per
 * provider or per route by the caller. Every function takes the current time as
 * uint64_t milliseconds from the caller's monotonic clock (uv_now()); nothing in
 * here reads a clock. Times passed to one structure should not go backwards.
 *
 *   cooldown  ADR 3.5: a 429 puts the provider in cooldown for the seconds the
 *             cooldown policy (Lua) computed; when it ends the provider is
 *             "observing" until its first answer: success clears the count, a
 *             429 cools it down again with the count one higher.
 *   breaker   PRD 3.8.2 / multi-tenant hot path step 7: closed -> open after N
 *             consecutive failures or an error rate over a window; open -> half
 *             open after open_duration; half open lets a few probes through;
 *             probe success closes, failure re-opens.
 *   health    ADR 4.1: passive statistics over a 5-minute window plus active
 *             probe results drive healthy -> degraded -> down -> healthy. It also
 *             keeps the recent counters the adaptive router scores with. */
#ifndef MG_HEALTH_H
#define MG_HEALTH_H

#include <stdint.h>

/* ------------------------------------------------------------------------ */
/* Outcome window: success/failure/TTFT counts in time buckets               */

#define MG_OUTCOME_BUCKETS_MAX 60

typedef struct mg_outcome_bucket_s {
    uint64_t idx;         /* which bucket of time (now_ms / width_ms) the slot holds */
    uint32_t ok;          /* successes */
    uint32_t fail;        /* failures */
    uint32_t ttft_n;      /* samples with a time to first token */
    uint64_t ttft_sum_ms; /* their sum */
} mg_outcome_bucket_t;

/* n buckets of width_ms. A sample is counted while its bucket is the current
 * one or one of the n - 1 before it: between (n-1)*width_ms and n*width_ms. */
typedef struct mg_outcome_window_s {
    mg_outcome_bucket_t b[MG_OUTCOME_BUCKETS_MAX];
    int n;
    uint64_t width_ms;
} mg_outcome_window_t;

/* Sums over the buckets in the window. */
typedef struct mg_outcome_sum_s {
    uint64_t ok, fail, ttft_n, ttft_sum_ms;
} mg_outcome_sum_t;

/* n is clamped to 1..MG_OUTCOME_BUCKETS_MAX, width_ms to >= 1. Starts empty. */
void mg_outcome_window_init(mg_outcome_window_t *w, int n, uint64_t width_ms);
/* Forget every sample (same shape). */
void mg_outcome_window_clear(mg_outcome_window_t *w);
/* Count one outcome at now_ms; ttft_ms < 0 means none. */
void mg_outcome_window_add(mg_outcome_window_t *w, uint64_t now_ms, int ok, int64_t ttft_ms);
/* Sum the buckets still in the window at now_ms. */
mg_outcome_sum_t mg_outcome_window_sum(const mg_outcome_window_t *w, uint64_t now_ms);

/* ------------------------------------------------------------------------ */
/* 429 cooldown                                                               */

/* Save/restore: cooldown_until is on the caller's monotonic clock; convert
 * with mg_cooldown_until_unix_ms() / mg_cooldown_restore(). */
typedef struct mg_cooldown_s {
    uint64_t until_ms;   /* end of the cooldown; meaningful while active */
    int active;          /* a cooldown was applied and has not turned into observing yet */
    int consecutive_429; /* 429 episodes in a row (what the backoff doubles on) */
    int observing;       /* cooldown over, first answer not seen yet */
} mg_cooldown_t;

/* Not cooling, not observing, count 0. */
void mg_cooldown_init(mg_cooldown_t *c);

/* A 429 answer arrived at now_ms. Returns the consecutive count to give the
 * cooldown policy (including this 429). While a cooldown is running the count
 * does not grow: such a 429 answers a request sent before the cooldown began,
 * so it is the same episode (this keeps a burst of in-flight 429s from jumping
 * straight to the maximum backoff). Otherwise (not cooling, or observing) the
 * count grows by one. */
int mg_cooldown_note_429(mg_cooldown_t *c, uint64_t now_ms);

/* Cool down for `seconds` from now_ms (as computed by the policy; <= 0 means
 * no wait). A running cooldown is only ever extended: until = max(until, now +
 * seconds). Ends observing. */
void mg_cooldown_apply(mg_cooldown_t *c, uint64_t now_ms, double seconds);

/* Whether the provider is cooling at now_ms (now < until). */
int mg_cooldown_cooling(const mg_cooldown_t *c, uint64_t now_ms);

/* Milliseconds until the cooldown ends; 0 when not cooling. */
uint64_t mg_cooldown_remaining_ms(const mg_cooldown_t *c, uint64_t now_ms);

/* Whether the provider is observing at now_ms: its cooldown has ended (even if
 * mg_cooldown_update() has not run yet) and no answer has been seen since. */
int mg_cooldown_observing(const mg_cooldown_t *c, uint64_t now_ms);

/* Apply the "cooldown ended -> observing" transition if it is due at now_ms.
 * Returns 1 when it happened now (the caller may log/persist), else 0. */
int mg_cooldown_update(mg_cooldown_t *c, uint64_t now_ms);

/* A non-429 success at now_ms. While cooling it changes nothing (the request
 * was sent before the cooldown). Otherwise observing ends and the 429 count
 * returns to 0. Returns 1 if the count or the observing flag changed. */
int mg_cooldown_success(mg_cooldown_t *c, uint64_t now_ms);

/* The end of the running cooldown as unix ms (for persisting), given the
 * same instant on both clocks; 0 when not cooling. */
uint64_t mg_cooldown_until_unix_ms(const mg_cooldown_t *c, uint64_t now_ms, uint64_t now_unix_ms);

/* Rebuild from persisted fields: until_unix_ms in the future -> cooling for the
 * remaining time; in the past with a count > 0 (or observing) -> observing;
 * otherwise clear. */
void mg_cooldown_restore(mg_cooldown_t *c, uint64_t now_ms, uint64_t now_unix_ms,
                         uint64_t until_unix_ms, int consecutive_429, int observing);

/* ------------------------------------------------------------------------ */
/* Circuit breaker                                                            */

typedef enum {
    MG_BREAKER_CLOSED = 0, /* normal routing */
    MG_BREAKER_OPEN,       /* no traffic until open_until */
    MG_BREAKER_HALF_OPEN,  /* a few probes may go through */
} mg_breaker_state_t;

/* The PRD's circuit_breaker block plus the consecutive rule of the
 * multi-tenant design and a probe time-out. */
typedef struct mg_breaker_config_s {
    int consecutive_failures;    /* 3; open after this many failures in a row; <= 0 disables */
    double error_rate_threshold; /* 0.1; open when failures/total >= this ...; <= 0 disables */
    int min_requests;            /* 10; ... over at least this many outcomes ... */
    int window_seconds;          /* 60; ... in this window (buckets of >= 1 s, at most 60) */
    int open_duration_seconds;   /* 30; open -> half open after this */
    int half_open_max_requests;  /* 1; probes allowed at once in half open (>= 1) */
    int probe_timeout_seconds;   /* 60; a probe with no outcome after this frees its slot */
} mg_breaker_config_t;

typedef struct mg_breaker_s {
    mg_breaker_config_t cfg;
    mg_breaker_state_t state;   /* as stored: OPEN past open_until reads as HALF_OPEN */
    int consecutive_failures;   /* while closed */
    uint64_t open_until_ms;     /* while open */
    int probes;                 /* half-open probes out and not answered */
    uint64_t probe_at_ms;       /* when the latest probe was let through */
    uint64_t trips;             /* times it opened (metrics) */
    mg_outcome_window_t window; /* error-rate window while closed */
} mg_breaker_t;

/* Fill cfg with the defaults above. */
void mg_breaker_config_default(mg_breaker_config_t *cfg);

/* Closed, empty window. cfg NULL = defaults; the config is copied. */
void mg_breaker_init(mg_breaker_t *b, const mg_breaker_config_t *cfg);

/* Replace the config (a reload), keeping the state; the error-rate window is
 * emptied if its shape changes. */
void mg_breaker_set_config(mg_breaker_t *b, const mg_breaker_config_t *cfg);

/* The state at now_ms (open whose duration is over reads as half open). */
mg_breaker_state_t mg_breaker_state(const mg_breaker_t *b, uint64_t now_ms);

/* A stored open breaker taken up again at now_ms (start-up): open for remain_ms more; 0 is
 * half open at once (its next request a probe). */
void mg_breaker_restore_open(mg_breaker_t *b, uint64_t now_ms, uint64_t remain_ms);

/* Closed now, its window emptied (another instance saw the upstream answer again). */
void mg_breaker_close(mg_breaker_t *b);

/* "closed" | "open" | "half_open". */
const char *mg_breaker_state_name(mg_breaker_state_t s);

/* Whether mg_breaker_allow() would let a request through now (no change):
 * the "available" bit the router sees. */
int mg_breaker_would_allow(const mg_breaker_t *b, uint64_t now_ms);

/* Let one request through, or not: 1 = send it, 0 = do not. Closed always
 * lets through; open never; half open lets through while fewer than
 * half_open_max_requests probes are out (this reserves a probe slot; its answer
 * goes to mg_breaker_record(), or mg_breaker_release() if it is never sent). */
int mg_breaker_allow(mg_breaker_t *b, uint64_t now_ms);

/* Give back a probe slot reserved by mg_breaker_allow() for a request that
 * was not sent after all (or was cancelled before any answer). */
void mg_breaker_release(mg_breaker_t *b, uint64_t now_ms);

/* An attempt's outcome: failure = 1 for the kinds that count
 * (mg_breaker_counts_status()), 0 for success. Closed: counted; opens on the
 * consecutive rule or the error-rate rule (checked on failures). Half open:
 * the answer of a probe: success closes (window emptied), failure re-opens for
 * open_duration from now_ms. Open: ignored (answers to requests sent before
 * it opened). Returns 1 if the state changed. */
int mg_breaker_record(mg_breaker_t *b, uint64_t now_ms, int failure);

/* An active probe's result (multi-tenant step 7: the prober writes into the
 * same breaker). Closed: like mg_breaker_record(). Open: a failure restarts
 * open_duration, a success changes nothing (the open period runs out). Half
 * open: success closes, failure re-opens, no probe slot needed. Returns 1 if
 * the state changed. */
int mg_breaker_probe_result(mg_breaker_t *b, uint64_t now_ms, int ok);

/* Milliseconds until mg_breaker_would_allow() becomes true if nothing else
 * happens (0 when it is true now): for Retry-After and wait_ms. */
uint64_t mg_breaker_retry_ms(const mg_breaker_t *b, uint64_t now_ms);

/* Whether an upstream answer counts as a breaker failure: http_status 0 (no
 * answer: connect error, reset, time-out), 429, 502, 503, 504. */
int mg_breaker_counts_status(int http_status);

/* ------------------------------------------------------------------------ */
/* Passive health                                                             */

typedef enum {
    MG_HEALTH_HEALTHY = 0,
    MG_HEALTH_DEGRADED, /* still serves */
    MG_HEALTH_DOWN,     /* out of routing but for a trial request every retry_down_ms (and
                           the panic rule, routing.panic_threshold); a trial's or a probe's
                           success brings it back to degraded */
} mg_health_state_t;

#define MG_HEALTH_RECENT_MAX 100

/* ADR 4.1 thresholds. Rates are success rates over the window. */
typedef struct mg_health_config_s {
    int degrade_consecutive; /* 5: failures in a row -> degraded */
    double degrade_rate;     /* 0.5: success rate < this -> degraded */
    int down_consecutive;    /* 10: failures in a row -> down */
    double down_rate;        /* 0.2: success rate < this -> down */
    int recover_consecutive; /* 3: successes in a row ... */
    double recover_rate;     /* 0.8: ... and success rate > this -> healthy */
    int rate_min_samples;    /* 10: the "rate <" rules need this many outcomes in the window */
    int window_buckets;      /* 30 ... */
    int bucket_seconds;      /* ... x 10 s = the 5-minute window */
    int recent_max;          /* 100: attempts the router's recent counters look at */
    int retry_down_ms;       /* 30000: a down provider gets one real request this often (half
                                open, as the breaker does); <= 0: none, only probes */
} mg_health_config_t;

/* One recent attempt (router counters). */
typedef struct mg_health_sample_s {
    uint64_t at_ms;
    int32_t ttft_ms; /* -1 = none */
    int32_t ok;
} mg_health_sample_t;

typedef struct mg_health_s {
    mg_health_config_t cfg;
    mg_health_state_t state; /* persist this */
    int consecutive_failures;
    int consecutive_successes;
    int64_t last_latency_ms; /* -1 = none yet */
    int64_t last_ttft_ms;    /* -1 = none yet */
    uint64_t changed_at_ms;  /* when state last changed (0 = never) */
    const char *down_reason; /* static: which rule took it down ("consecutive_failures",
                                "success_rate", "restored"), NULL while not down */
    uint64_t trial_at_ms;    /* while down: when the last trial went (or it went down) */
    uint64_t last_at_ms;     /* the latest outcome's time: samples never go back past it */
    mg_outcome_window_t window;
    mg_health_sample_t recent[MG_HEALTH_RECENT_MAX]; /* ring, oldest at recent_head */
    int recent_head, recent_count;
    int recent_ok, recent_ttft_n; /* running sums over the whole ring */
    int64_t recent_ttft_sum_ms;
} mg_health_t;

/* What the router and /status read. Rates and means are -1 when there are no
 * samples. */
typedef struct mg_health_snapshot_s {
    mg_health_state_t state;
    int consecutive_failures, consecutive_successes;
    int64_t last_latency_ms, last_ttft_ms;
    int window_samples;         /* outcomes in the 5-minute window */
    double window_success_rate; /* over the window */
    double window_ttft_ms;      /* mean TTFT over the window */
    int avail_samples;          /* recent: last recent_max attempts still in the window */
    double success_rate;        /* recent */
    int ttft_samples;           /* recent attempts with a TTFT */
    double ttft_ms;             /* recent mean TTFT */
} mg_health_snapshot_t;

/* Fill cfg with the defaults above. */
void mg_health_config_default(mg_health_config_t *cfg);

/* Healthy, no samples. cfg NULL = defaults; the config is copied. */
void mg_health_init(mg_health_t *h, const mg_health_config_t *cfg);

/* Replace the config keeping state and counters; the window and the recent
 * ring are emptied if their shape changes. */
void mg_health_set_config(mg_health_t *h, const mg_health_config_t *cfg);

/* Record one attempt's outcome at now_ms: success, its latency (ms, < 0 =
 * unknown) and its TTFT (ms, < 0 = none: failures, non-stream, embeddings) and
 * run the state machine. State changes only on records and probe results (time
 * passing alone does not change it). Returns 1 if the state changed. */
int mg_health_record(mg_health_t *h, uint64_t now_ms, int success, int64_t latency_ms,
                     int64_t ttft_ms);

/* When to record a sample taken age_ms before now_ms (another instance's, shared through the
 * cluster: cluster/samples.h): now_ms - age_ms, but never before the latest outcome recorded
 * (the window and the recent ring hold samples in time order). */
uint64_t mg_health_sample_at(const mg_health_t *h, uint64_t now_ms, uint64_t age_ms);

/* An active probe's result: an outcome like any other (no latency/TTFT), so a
 * provider that is down and gets no traffic can come back. Returns 1 if the
 * state changed. */
int mg_health_probe_result(mg_health_t *h, uint64_t now_ms, int ok);

/* Whether a request may go to the provider now as far as health says: not down, or down
 * with a trial due (retry_down_ms since the last one). No change. */
int mg_health_would_allow(const mg_health_t *h, uint64_t now_ms);

/* Let one request through: 1 when not down; when down, 1 and the trial taken when one is
 * due (the next is due retry_down_ms later, whatever this one's fate), else 0. */
int mg_health_take_trial(mg_health_t *h, uint64_t now_ms);

/* Milliseconds until a down provider's next trial (0: due now, or not down; -1: down with
 * no trials, retry_down_ms <= 0). */
int64_t mg_health_trial_in_ms(const mg_health_t *h, uint64_t now_ms);

/* A persisted state taken up again at now_ms (start-up): down restarts its trial clock. */
void mg_health_restore(mg_health_t *h, mg_health_state_t state, uint64_t now_ms);

/* Everything readable at now_ms. */
void mg_health_snapshot(const mg_health_t *h, uint64_t now_ms, mg_health_snapshot_t *out);

/* What routing reads, for every route of every request: the state and the recent
 * counters (avail_samples, success_rate, ttft_samples, ttft_ms) as mg_health_snapshot
 * gives them, without summing the 5-minute window (its fields, and the others, read 0). */
void mg_health_recent(const mg_health_t *h, uint64_t now_ms, mg_health_snapshot_t *out);

/* "healthy" | "degraded" | "down". */
const char *mg_health_state_name(mg_health_state_t s);

/* The state named (for restoring a persisted state); -1 if unknown. */
int mg_health_state_from_name(const char *name);

#endif
