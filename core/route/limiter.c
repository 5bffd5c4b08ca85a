/* limiter: per-provider RPM and TPM limits over a sliding 60 s window.
 *
 * RPM is a sliding log, exact: it keeps the times of the last `limit` admissions,
 * oldest first (mg_limiter_usage drops those that have left the window early, all but
 * the newest: nothing reads them). A new admission at t is allowed iff fewer than
 * `limit` of them lie in (t - 60000, t], that is iff the log is not full or its
 * oldest entry is at least 60000 ms old. Any two admissions `limit` apart are then
 * >= 60000 ms apart, so no half-open window [a, a + 60000) ever holds more than
 * `limit` of them. The log is sorted (times never go backwards: an earlier time
 * is taken as the newest time recorded), so "how many in the window" is a binary
 * search. Admissions in the same millisecond share one entry (a run): memory is 16
 * bytes per millisecond of the last minute that admitted something, at most 1 MiB
 * however high the rate.
 *
 * TPM cannot be a log (a log per token is absurd, and a log of reservations
 * would need settle to find entries), so it is 61 one-second buckets with a
 * running sum. Tokens reserved during second s are counted while the current
 * second is s..s+60, i.e. from 60.001 s up to 61 s after the reservation. Every
 * reservation made in the exact window (t - 60000, t] is therefore still counted
 * at t: the limit holds in every 60 s window, and a refusal can last up to 1 s
 * longer than with an exact log. That is the precision: conservative by < 1 s.
 * Settling corrects the reservation's own bucket; a correction upwards can push
 * the window past the limit, because those tokens were really spent.
 *
 * mg_limiter_t reserves both at once. It checks both before recording either,
 * which is the same as "record, and roll both back if either refuses", minus
 * the rollback. */
#include "route/limiter.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* RPM log                                                                    */

/* The log is a ring of runs: the admissions recorded at one millisecond share a run, so a
 * window holds at most 60,001 runs however many requests it admitted (16 bytes each).
 * The ring doubles from RPM_MIN_RUNS only when it is full of runs still in the window, so
 * it never grows past 65,536 runs (1 MiB). Admissions are numbered in order; run j holds
 * the admissions numbered [start_j, end_j), start_j being the end of the run before it
 * (or `first`, the oldest admission kept, for the oldest run). */
#define RPM_MIN_RUNS 16

/* Run j, 0 = oldest. Assumes j < n_runs. */
static mg_rpm_run_t *rpm_run(const mg_rpm_window_t *w, int j)
{
    int k = w->head + j;
    return &w->runs[k < w->cap ? k : k - w->cap];
}

static uint64_t rpm_start(const mg_rpm_window_t *w, int j)
{
    return j == 0 ? w->first : rpm_run(w, j - 1)->end;
}

static int rpm_count(const mg_rpm_window_t *w)
{
    return (int)(w->next - w->first);
}

/* The time of the i-th recorded admission, 0 = oldest. Assumes i < count: a binary
 * search for the run that holds it. */
static uint64_t rpm_at(const mg_rpm_window_t *w, int i)
{
    uint64_t seq = w->first + (uint64_t)i;
    int lo = 0, hi = w->n_runs - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (rpm_run(w, mid)->end > seq) hi = mid;
        else lo = mid + 1;
    }
    return rpm_run(w, lo)->t;
}

/* now, or the newest recorded time if now is earlier (time never goes back). */
static uint64_t rpm_now(const mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->n_runs == 0) return now_ms;
    uint64_t newest = rpm_run(w, w->n_runs - 1)->t;
    return newest > now_ms ? newest : now_ms;
}

/* Index of the oldest admission still in (now - 60000, now]; count if none. */
static int rpm_first_in_window(const mg_rpm_window_t *w, uint64_t now_ms)
{
    int lo = 0, hi = w->n_runs;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (rpm_run(w, mid)->t + MG_LIMIT_WINDOW_MS > now_ms) hi = mid;
        else lo = mid + 1;
    }
    return lo == w->n_runs ? rpm_count(w) : (int)(rpm_start(w, lo) - w->first);
}

/* The earliest time >= now at which fewer than `cap` admissions are in the
 * window. Assumes a limited window and cap >= 1. */
static uint64_t rpm_next_below(const mg_rpm_window_t *w, uint64_t now_ms, int cap)
{
    uint64_t now = rpm_now(w, now_ms);
    int first = rpm_first_in_window(w, now);
    int used = rpm_count(w) - first;
    if (used < cap) return now;
    /* once the (used - cap + 1) oldest in-window entries have left, used < cap */
    return rpm_at(w, first + (used - cap)) + MG_LIMIT_WINDOW_MS;
}

static void rpm_drop_oldest_run(mg_rpm_window_t *w)
{
    w->first = rpm_run(w, 0)->end;
    w->head = w->head + 1 < w->cap ? w->head + 1 : 0;
    w->n_runs--;
}

/* Drop the runs that have left the window at now_ms, all but the newest (which rpm_now
 * reads), and return how many admissions are in the window: what mg_rpm_used says,
 * without its binary search. Amortised O(1): each run is dropped once. */
static int rpm_expire(mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->n_runs == 0) return 0;
    uint64_t now = rpm_now(w, now_ms);
    while (w->n_runs > 1 && rpm_run(w, 0)->t + MG_LIMIT_WINDOW_MS <= now) rpm_drop_oldest_run(w);
    return rpm_run(w, 0)->t + MG_LIMIT_WINDOW_MS <= now ? 0 : rpm_count(w);
}

/* A ring of `cap` runs holding w's runs in order (oldest at 0); -1 when out of memory. */
static int rpm_resize(mg_rpm_window_t *w, int cap)
{
    mg_rpm_run_t *runs = malloc((size_t)cap * sizeof(*runs));
    if (!runs) return -1;
    for (int j = 0; j < w->n_runs; j++) runs[j] = *rpm_run(w, j);
    free(w->runs);
    w->runs = runs;
    w->cap = cap;
    w->head = 0;
    return 0;
}

/* Room for one more run: runs that left the window go first (there are some once the
 * ring holds more than 60,001), else the ring doubles. -1 when out of memory. */
static int rpm_room(mg_rpm_window_t *w, uint64_t t)
{
    if (w->n_runs < w->cap) return 0;
    while (w->n_runs > 1 && rpm_run(w, 0)->t + MG_LIMIT_WINDOW_MS <= t) rpm_drop_oldest_run(w);
    if (w->n_runs < w->cap) return 0;
    int cap = w->cap ? 2 * w->cap : RPM_MIN_RUNS;
    return rpm_resize(w, cap);
}

/* Record an admission at t (>= every recorded time). A full log (count == limit) gives up
 * its oldest admission, which is outside every window from t on (the callers checked). */
static void rpm_record(mg_rpm_window_t *w, uint64_t t)
{
    if (rpm_count(w) >= w->limit && w->n_runs > 0) {
        w->first++;
        if (w->first == rpm_run(w, 0)->end) rpm_drop_oldest_run(w);
    }
    if (w->n_runs > 0 && rpm_run(w, w->n_runs - 1)->t == t) {
        rpm_run(w, w->n_runs - 1)->end = ++w->next;
        return;
    }
    if (rpm_room(w, t) != 0) return; /* out of memory: this admission goes unrecorded */
    w->n_runs++;
    *rpm_run(w, w->n_runs - 1) = (mg_rpm_run_t){.t = t, .end = ++w->next};
}

int mg_rpm_init(mg_rpm_window_t *w, int limit)
{
    memset(w, 0, sizeof(*w));
    w->emergency_ratio = 0.1;
    if (limit < 0) return -1;
    w->limit = limit;
    return 0;
}

void mg_rpm_free(mg_rpm_window_t *w)
{
    free(w->runs);
    w->runs = NULL;
    w->limit = w->cap = w->head = w->n_runs = 0;
    w->first = w->next = 0;
}

int mg_rpm_set_limit(mg_rpm_window_t *w, int limit)
{
    if (limit < 0) return -1;
    if (limit == w->limit) return 0;
    if (limit == 0 || w->limit == 0) { /* to or from unlimited: no history */
        double ratio = w->emergency_ratio;
        mg_rpm_free(w);
        w->emergency_ratio = ratio;
        w->limit = limit;
        return 0;
    }
    /* keep the newest min(count, limit) admissions */
    if (rpm_count(w) > limit) {
        w->first = w->next - (uint64_t)limit;
        while (w->n_runs > 0 && rpm_run(w, 0)->end <= w->first) {
            w->head = w->head + 1 < w->cap ? w->head + 1 : 0;
            w->n_runs--;
        }
    }
    w->limit = limit;
    return 0;
}

/* Room in the ring for an admission at about now_ms, before deciding: an admission that
 * could not be recorded must not be made. -1 when out of memory. */
static int rpm_make_room(mg_rpm_window_t *w, uint64_t now_ms)
{
    return w->limit > 0 ? rpm_room(w, rpm_now(w, now_ms)) : 0;
}

int mg_rpm_can(const mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->limit == 0 || rpm_count(w) < w->limit) return 1;
    return rpm_run(w, 0)->t + MG_LIMIT_WINDOW_MS <= rpm_now(w, now_ms);
}

int mg_rpm_try(mg_rpm_window_t *w, uint64_t now_ms)
{
    if (!mg_rpm_can(w, now_ms) || rpm_make_room(w, now_ms) != 0) return 0;
    if (w->limit > 0) rpm_record(w, rpm_now(w, now_ms));
    return 1;
}

uint64_t mg_rpm_next_ms(const mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->limit == 0) return now_ms;
    uint64_t t = rpm_next_below(w, now_ms, w->limit);
    return t > now_ms ? t : now_ms;
}

int mg_rpm_used(const mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->limit == 0) return 0;
    return rpm_count(w) - rpm_first_in_window(w, rpm_now(w, now_ms));
}

int mg_rpm_emergency_limit(const mg_rpm_window_t *w)
{
    if (w->limit == 0) return 0;
    /* the epsilon keeps e.g. 100 * 0.29 = 28.999999999999996 from flooring to 28 */
    int cap = (int)((double)w->limit * w->emergency_ratio + 1e-9);
    return cap >= 1 ? cap : 1;
}

void mg_rpm_set_emergency_ratio(mg_rpm_window_t *w, double ratio)
{
    w->emergency_ratio = ratio > 0 ? (ratio < 1 ? ratio : 1) : 0; /* NaN -> 0 */
}

int mg_rpm_try_emergency(mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->limit == 0) return 1;
    if (mg_rpm_used(w, now_ms) >= mg_rpm_emergency_limit(w)) return 0;
    if (rpm_make_room(w, now_ms) != 0) return 0;
    /* used < cap <= limit, so a full log's oldest admission is out of the window */
    rpm_record(w, rpm_now(w, now_ms));
    return 1;
}

uint64_t mg_rpm_emergency_next_ms(const mg_rpm_window_t *w, uint64_t now_ms)
{
    if (w->limit == 0) return now_ms;
    uint64_t t = rpm_next_below(w, now_ms, mg_rpm_emergency_limit(w));
    return t > now_ms ? t : now_ms;
}

void mg_rpm_undo(mg_rpm_window_t *w, uint64_t at_ms)
{
    int j = w->n_runs - 1;
    while (j >= 0 && rpm_run(w, j)->t > at_ms) j--;
    if (j < 0 || rpm_run(w, j)->t != at_ms) return;
    for (int k = j; k < w->n_runs; k++) /* one admission fewer from run j on */
        rpm_run(w, k)->end--;
    w->next--;
    if (rpm_run(w, j)->end > rpm_start(w, j)) return;
    for (int k = j; k < w->n_runs - 1; k++) /* run j is empty: close the gap */
        *rpm_run(w, k) = *rpm_run(w, k + 1);
    w->n_runs--;
}

/* ------------------------------------------------------------------------ */
/* TPM buckets                                                                */

#define TPM_NO_SEC UINT64_MAX /* a slot that holds no second */

/* Bring the window to now: buckets of seconds that have left it are emptied and
 * subtracted from the running sums. Amortised O(1): each slot is cleared once
 * per second that passes, and a jump of >= 61 s clears everything at once. */
static void tpm_advance(mg_tpm_window_t *w, uint64_t now_ms)
{
    uint64_t sec = now_ms / 1000;
    if (sec <= w->cur_sec) return;
    if (sec - w->cur_sec >= MG_TPM_BUCKETS) {
        for (int i = 0; i < MG_TPM_BUCKETS; i++)
            w->b[i] = (mg_tpm_bucket_t){.sec = TPM_NO_SEC, .tokens = 0, .requests = 0};
        w->b[sec % MG_TPM_BUCKETS].sec = sec;
        w->tokens = 0;
        w->requests = 0;
    } else {
        for (uint64_t s = w->cur_sec + 1; s <= sec; s++) {
            mg_tpm_bucket_t *b = &w->b[s % MG_TPM_BUCKETS];
            w->tokens -= b->tokens;
            w->requests -= b->requests;
            *b = (mg_tpm_bucket_t){.sec = s, .tokens = 0, .requests = 0};
        }
    }
    w->cur_sec = sec;
}

/* The slot holding second `sec` if it is still in the window, else NULL. */
static mg_tpm_bucket_t *tpm_bucket_of(mg_tpm_window_t *w, uint64_t sec)
{
    if (sec + (MG_TPM_BUCKETS - 1) < w->cur_sec || sec > w->cur_sec) return NULL;
    mg_tpm_bucket_t *b = &w->b[sec % MG_TPM_BUCKETS];
    return b->sec == sec ? b : NULL;
}

void mg_tpm_init(mg_tpm_window_t *w, int64_t limit)
{
    memset(w, 0, sizeof(*w));
    for (int i = 0; i < MG_TPM_BUCKETS; i++) w->b[i].sec = TPM_NO_SEC;
    w->b[0].sec = 0; /* cur_sec starts at 0 and slot 0 holds it */
    w->limit = limit > 0 ? limit : 0;
}

void mg_tpm_set_limit(mg_tpm_window_t *w, int64_t limit)
{
    w->limit = limit > 0 ? limit : 0;
}

int64_t mg_tpm_used(mg_tpm_window_t *w, uint64_t now_ms)
{
    tpm_advance(w, now_ms);
    return w->tokens;
}

int mg_tpm_can(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens)
{
    tpm_advance(w, now_ms);
    if (w->limit == 0) return 1;
    if (tokens < 0) tokens = 0;
    return tokens <= w->limit - w->tokens;
}

int mg_tpm_reserve(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens, mg_tpm_resv_t *r)
{
    if (tokens < 0) tokens = 0;
    *r = (mg_tpm_resv_t){.sec = 0, .tokens = 0, .active = 0};
    if (!mg_tpm_can(w, now_ms, tokens)) return 0;
    mg_tpm_bucket_t *b = &w->b[w->cur_sec % MG_TPM_BUCKETS];
    b->tokens += tokens;
    b->requests++;
    w->tokens += tokens;
    w->requests++;
    *r = (mg_tpm_resv_t){.sec = w->cur_sec, .tokens = tokens, .active = 1};
    return 1;
}

/* Move the reservation's bucket by delta tokens and dreq requests, never below 0. */
static void tpm_correct(mg_tpm_window_t *w, const mg_tpm_resv_t *r, int64_t delta, int dreq)
{
    mg_tpm_bucket_t *b = tpm_bucket_of(w, r->sec);
    if (!b) return; /* out of the window: nothing left to correct */
    if (delta < -b->tokens) delta = -b->tokens;
    if (dreq < -b->requests) dreq = -b->requests;
    b->tokens += delta;
    w->tokens += delta;
    b->requests += dreq;
    w->requests += dreq;
}

void mg_tpm_settle(mg_tpm_window_t *w, mg_tpm_resv_t *r, int64_t actual_tokens)
{
    if (!r->active) return;
    if (actual_tokens < 0) actual_tokens = 0;
    tpm_correct(w, r, actual_tokens - r->tokens, 0);
    r->tokens = actual_tokens;
    r->active = 0;
}

void mg_tpm_release(mg_tpm_window_t *w, mg_tpm_resv_t *r)
{
    if (!r->active) return;
    tpm_correct(w, r, -r->tokens, -1);
    r->tokens = 0;
    r->active = 0;
}

uint64_t mg_tpm_next_ms(mg_tpm_window_t *w, uint64_t now_ms, int64_t tokens)
{
    if (!mg_tpm_can(w, now_ms, tokens)) {
        if (tokens > w->limit) return MG_LIMIT_NEVER;
        int64_t need = w->tokens + tokens - w->limit, freed = 0;
        uint64_t s = w->cur_sec >= MG_TPM_BUCKETS - 1 ? w->cur_sec - (MG_TPM_BUCKETS - 1) : 0;
        for (; s <= w->cur_sec; s++) {
            mg_tpm_bucket_t *b = tpm_bucket_of(w, s);
            if (b) freed += b->tokens;
            /* second s leaves the window when the current second becomes s + 61 */
            if (freed >= need) return (s + MG_TPM_BUCKETS) * 1000;
        }
        return MG_LIMIT_NEVER; /* unreachable: freeing everything frees >= need */
    }
    return now_ms;
}

/* ------------------------------------------------------------------------ */
/* Provider limiter                                                           */

int mg_limiter_init(mg_limiter_t *l, int rpm_limit, int64_t tpm_limit)
{
    mg_tpm_init(&l->tpm, tpm_limit);
    mg_rpm_init(&l->emergency, 0);
    return mg_rpm_init(&l->rpm, rpm_limit);
}

void mg_limiter_free(mg_limiter_t *l)
{
    mg_rpm_free(&l->rpm);
    mg_rpm_free(&l->emergency);
}

int mg_limiter_set_limits(mg_limiter_t *l, int rpm_limit, int64_t tpm_limit)
{
    if (mg_rpm_set_limit(&l->rpm, rpm_limit) != 0) return -1;
    mg_tpm_set_limit(&l->tpm, tpm_limit);
    return 0;
}

/* Record an admission already checked on both sides. */
static void limiter_commit(mg_limiter_t *l, uint64_t now_ms, int64_t tokens, mg_limiter_resv_t *r)
{
    r->at_ms = rpm_now(&l->rpm, now_ms);
    r->rpm_recorded = l->rpm.limit > 0;
    if (r->rpm_recorded) rpm_record(&l->rpm, r->at_ms);
    mg_tpm_reserve(&l->tpm, now_ms, tokens, &r->tpm); /* cannot refuse: checked */
}

int mg_limiter_reserve(mg_limiter_t *l, uint64_t now_ms, int64_t tokens, mg_limiter_resv_t *r)
{
    memset(r, 0, sizeof(*r));
    if (!mg_rpm_can(&l->rpm, now_ms)) return MG_LIMIT_RPM;
    if (!mg_tpm_can(&l->tpm, now_ms, tokens)) return MG_LIMIT_TPM;
    if (rpm_make_room(&l->rpm, now_ms) != 0) return MG_LIMIT_RPM; /* out of memory */
    limiter_commit(l, now_ms, tokens, r);
    return MG_LIMIT_OK;
}

int mg_limiter_reserve_emergency(mg_limiter_t *l, uint64_t now_ms, int64_t tokens,
                                 mg_limiter_resv_t *r)
{
    memset(r, 0, sizeof(*r));
    if (l->rpm.limit > 0) {
        int cap = mg_rpm_emergency_limit(&l->rpm);
        if (l->emergency.limit != cap && mg_rpm_set_limit(&l->emergency, cap) != 0)
            return MG_LIMIT_RPM;
        if (!mg_rpm_can(&l->emergency, now_ms)) return MG_LIMIT_RPM;
    }
    if (!mg_tpm_can(&l->tpm, now_ms, tokens)) return MG_LIMIT_TPM;
    if (rpm_make_room(&l->rpm, now_ms) != 0) return MG_LIMIT_RPM; /* out of memory */
    if (l->rpm.limit > 0 && !mg_rpm_try(&l->emergency, now_ms)) return MG_LIMIT_RPM;
    limiter_commit(l, now_ms, tokens, r);
    return MG_LIMIT_OK;
}

void mg_limiter_settle(mg_limiter_t *l, mg_limiter_resv_t *r, int64_t actual_tokens)
{
    mg_tpm_settle(&l->tpm, &r->tpm, actual_tokens);
}

void mg_limiter_cancel(mg_limiter_t *l, mg_limiter_resv_t *r)
{
    if (r->rpm_recorded) mg_rpm_undo(&l->rpm, r->at_ms);
    r->rpm_recorded = 0;
    mg_tpm_release(&l->tpm, &r->tpm);
}

uint64_t mg_limiter_next_ms(mg_limiter_t *l, uint64_t now_ms, int64_t tokens)
{
    uint64_t a = mg_rpm_next_ms(&l->rpm, now_ms);
    uint64_t b = mg_tpm_next_ms(&l->tpm, now_ms, tokens);
    return a > b ? a : b;
}

int mg_limiter_rpm_used(mg_limiter_t *l, uint64_t now_ms)
{
    tpm_advance(&l->tpm, now_ms);
    if (l->rpm.limit > 0) return mg_rpm_used(&l->rpm, now_ms);
    return l->tpm.requests;
}

int64_t mg_limiter_tpm_used(mg_limiter_t *l, uint64_t now_ms)
{
    return mg_tpm_used(&l->tpm, now_ms);
}

/* (limit - used) / limit clamped to 0..1, rounded down to a step of 1/MG_HEADROOM_STEPS but
 * never to 0 while there is room; 1 when unlimited. The steps keep a large limit from changing
 * it (and rerunning the policy's share()) on every request. */
static double headroom_of(int limit, int used)
{
    if (limit == 0 || used <= 0) return 1.0;
    if (used >= limit) return 0.0;
    long long steps = (long long)(limit - used) * MG_HEADROOM_STEPS / limit;
    return steps > 0 ? (double)steps / MG_HEADROOM_STEPS : 1.0 / MG_HEADROOM_STEPS;
}

double mg_limiter_headroom(mg_limiter_t *l, uint64_t now_ms)
{
    return headroom_of(l->rpm.limit, l->rpm.limit ? mg_rpm_used(&l->rpm, now_ms) : 0);
}

void mg_limiter_usage(mg_limiter_t *l, uint64_t now_ms, mg_limiter_usage_t *out)
{
    tpm_advance(&l->tpm, now_ms);
    out->rpm_used = l->rpm.limit > 0 ? rpm_expire(&l->rpm, now_ms) : l->tpm.requests;
    out->tpm_used = l->tpm.tokens;
    out->headroom = headroom_of(l->rpm.limit, out->rpm_used);
}
