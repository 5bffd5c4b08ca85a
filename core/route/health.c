/* health: cooldown, circuit breaker and passive health of a provider or route.
 *
 * Three small state machines over one shared tool, the outcome window: a ring
 * of time buckets counting successes, failures and TTFTs. A bucket is reused
 * when its slot comes round again, so the window needs no timer and no
 * allocation; a sample stays counted while its bucket is one of the last n
 * (between (n-1) and n bucket widths).
 *
 * The cooldown reacts to 429 only; the breaker to every failure that says "this
 * upstream cannot take traffic now" (no answer, 429, 502-504); passive health
 * to every outcome, over the longer 5-minute view. They are independent on
 * purpose: the router sees each (cooling, breaker, health) and the policy
 * decides. None of them looks at a clock: the caller passes now_ms. */
#include "route/health.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Outcome window                                                             */

#define NO_IDX UINT64_MAX

void mg_outcome_window_clear(mg_outcome_window_t *w)
{
    for (int i = 0; i < MG_OUTCOME_BUCKETS_MAX; i++) w->b[i] = (mg_outcome_bucket_t){.idx = NO_IDX};
}

void mg_outcome_window_init(mg_outcome_window_t *w, int n, uint64_t width_ms)
{
    w->n = n < 1 ? 1 : n > MG_OUTCOME_BUCKETS_MAX ? MG_OUTCOME_BUCKETS_MAX : n;
    w->width_ms = width_ms ? width_ms : 1;
    mg_outcome_window_clear(w);
}

/* Whether bucket index idx is in the window whose current bucket is cur. */
static int window_holds(const mg_outcome_window_t *w, uint64_t idx, uint64_t cur)
{
    return idx != NO_IDX && idx <= cur && idx + (uint64_t)w->n > cur;
}

void mg_outcome_window_add(mg_outcome_window_t *w, uint64_t now_ms, int ok, int64_t ttft_ms)
{
    uint64_t idx = now_ms / w->width_ms;
    mg_outcome_bucket_t *b = &w->b[idx % (uint64_t)w->n];
    if (b->idx != idx) *b = (mg_outcome_bucket_t){.idx = idx};
    if (ok) b->ok++;
    else b->fail++;
    if (ttft_ms >= 0) {
        b->ttft_n++;
        b->ttft_sum_ms += (uint64_t)ttft_ms;
    }
}

mg_outcome_sum_t mg_outcome_window_sum(const mg_outcome_window_t *w, uint64_t now_ms)
{
    mg_outcome_sum_t s = {0, 0, 0, 0};
    uint64_t cur = now_ms / w->width_ms;
    for (int i = 0; i < w->n; i++) {
        const mg_outcome_bucket_t *b = &w->b[i];
        if (!window_holds(w, b->idx, cur)) continue;
        s.ok += b->ok;
        s.fail += b->fail;
        s.ttft_n += b->ttft_n;
        s.ttft_sum_ms += b->ttft_sum_ms;
    }
    return s;
}

/* ------------------------------------------------------------------------ */
/* Cooldown                                                                   */

void mg_cooldown_init(mg_cooldown_t *c)
{
    memset(c, 0, sizeof(*c));
}

int mg_cooldown_cooling(const mg_cooldown_t *c, uint64_t now_ms)
{
    return c->active && now_ms < c->until_ms;
}

uint64_t mg_cooldown_remaining_ms(const mg_cooldown_t *c, uint64_t now_ms)
{
    return mg_cooldown_cooling(c, now_ms) ? c->until_ms - now_ms : 0;
}

int mg_cooldown_observing(const mg_cooldown_t *c, uint64_t now_ms)
{
    return c->observing || (c->active && now_ms >= c->until_ms);
}

int mg_cooldown_update(mg_cooldown_t *c, uint64_t now_ms)
{
    if (!c->active || now_ms < c->until_ms) return 0;
    c->active = 0;
    c->observing = 1;
    return 1;
}

int mg_cooldown_note_429(mg_cooldown_t *c, uint64_t now_ms)
{
    mg_cooldown_update(c, now_ms);
    if (!mg_cooldown_cooling(c, now_ms)) c->consecutive_429++;
    return c->consecutive_429;
}

void mg_cooldown_apply(mg_cooldown_t *c, uint64_t now_ms, double seconds)
{
    if (!(seconds > 0)) seconds = 0;  /* also NaN */
    if (seconds > 1e7) seconds = 1e7; /* ~115 days: keeps the conversion defined */
    uint64_t ms = (uint64_t)(seconds * 1000.0 + 0.5);
    uint64_t until = now_ms + ms;
    if (!c->active || until > c->until_ms) c->until_ms = until;
    c->active = 1;
    c->observing = 0;
}

int mg_cooldown_success(mg_cooldown_t *c, uint64_t now_ms)
{
    mg_cooldown_update(c, now_ms);
    if (mg_cooldown_cooling(c, now_ms)) return 0;
    int changed = c->observing || c->consecutive_429 != 0;
    c->observing = 0;
    c->consecutive_429 = 0;
    return changed;
}

uint64_t mg_cooldown_until_unix_ms(const mg_cooldown_t *c, uint64_t now_ms, uint64_t now_unix_ms)
{
    uint64_t left = mg_cooldown_remaining_ms(c, now_ms);
    return left ? now_unix_ms + left : 0;
}

void mg_cooldown_restore(mg_cooldown_t *c, uint64_t now_ms, uint64_t now_unix_ms,
                         uint64_t until_unix_ms, int consecutive_429, int observing)
{
    mg_cooldown_init(c);
    c->consecutive_429 = consecutive_429 > 0 ? consecutive_429 : 0;
    if (until_unix_ms > now_unix_ms) {
        c->active = 1;
        c->until_ms = now_ms + (until_unix_ms - now_unix_ms);
    } else if (c->consecutive_429 > 0 || observing) {
        c->observing = 1;
    }
}

/* ------------------------------------------------------------------------ */
/* Circuit breaker                                                            */

void mg_breaker_config_default(mg_breaker_config_t *cfg)
{
    cfg->consecutive_failures = 3;
    cfg->error_rate_threshold = 0.1;
    cfg->min_requests = 10;
    cfg->window_seconds = 60;
    cfg->open_duration_seconds = 30;
    cfg->half_open_max_requests = 1;
    cfg->probe_timeout_seconds = 60;
}

/* The error-rate window for a config: 1 s buckets up to 60 of them, wider beyond. */
static void breaker_window_shape(const mg_breaker_config_t *cfg, int *n, uint64_t *width_ms)
{
    int secs = cfg->window_seconds > 0 ? cfg->window_seconds : 1;
    *n = secs < MG_OUTCOME_BUCKETS_MAX ? secs : MG_OUTCOME_BUCKETS_MAX;
    *width_ms = (uint64_t)secs * 1000 / (uint64_t)*n;
}

void mg_breaker_init(mg_breaker_t *b, const mg_breaker_config_t *cfg)
{
    memset(b, 0, sizeof(*b));
    if (cfg) b->cfg = *cfg;
    else mg_breaker_config_default(&b->cfg);
    int n;
    uint64_t width;
    breaker_window_shape(&b->cfg, &n, &width);
    mg_outcome_window_init(&b->window, n, width);
}

void mg_breaker_set_config(mg_breaker_t *b, const mg_breaker_config_t *cfg)
{
    b->cfg = *cfg;
    int n;
    uint64_t width;
    breaker_window_shape(cfg, &n, &width);
    if (n != b->window.n || width != b->window.width_ms)
        mg_outcome_window_init(&b->window, n, width);
}

static int breaker_max_probes(const mg_breaker_t *b)
{
    return b->cfg.half_open_max_requests > 0 ? b->cfg.half_open_max_requests : 1;
}

static uint64_t breaker_probe_timeout_ms(const mg_breaker_t *b)
{
    return (uint64_t)(b->cfg.probe_timeout_seconds > 0 ? b->cfg.probe_timeout_seconds : 60) * 1000;
}

/* Whether the probes out at now_ms are stale (their answers will not come). */
static int breaker_probes_stale(const mg_breaker_t *b, uint64_t now_ms)
{
    return b->probes > 0 && now_ms >= b->probe_at_ms + breaker_probe_timeout_ms(b);
}

mg_breaker_state_t mg_breaker_state(const mg_breaker_t *b, uint64_t now_ms)
{
    if (b->state == MG_BREAKER_OPEN && now_ms >= b->open_until_ms) return MG_BREAKER_HALF_OPEN;
    return b->state;
}

const char *mg_breaker_state_name(mg_breaker_state_t s)
{
    switch (s) {
    case MG_BREAKER_CLOSED: return "closed";
    case MG_BREAKER_OPEN: return "open";
    case MG_BREAKER_HALF_OPEN: return "half_open";
    }
    return "unknown";
}

/* Store the time-driven transitions due at now_ms: open -> half open, stale probes. */
static void breaker_advance(mg_breaker_t *b, uint64_t now_ms)
{
    if (b->state == MG_BREAKER_OPEN && now_ms >= b->open_until_ms) {
        b->state = MG_BREAKER_HALF_OPEN;
        b->probes = 0;
    }
    if (b->state == MG_BREAKER_HALF_OPEN && breaker_probes_stale(b, now_ms)) b->probes = 0;
}

/* Start (or restart) the open period at now_ms; the caller counts trips. */
static void breaker_open(mg_breaker_t *b, uint64_t now_ms)
{
    b->state = MG_BREAKER_OPEN;
    b->open_until_ms =
        now_ms +
        (uint64_t)(b->cfg.open_duration_seconds > 0 ? b->cfg.open_duration_seconds : 0) * 1000;
    b->probes = 0;
    b->consecutive_failures = 0;
}

/* Back to normal after a good probe. */
static void breaker_close(mg_breaker_t *b)
{
    b->state = MG_BREAKER_CLOSED;
    b->probes = 0;
    b->consecutive_failures = 0;
    mg_outcome_window_clear(&b->window); /* the failures that opened it are history */
}

void mg_breaker_close(mg_breaker_t *b)
{
    breaker_close(b);
}

void mg_breaker_restore_open(mg_breaker_t *b, uint64_t now_ms, uint64_t remain_ms)
{
    b->state = MG_BREAKER_OPEN;
    b->open_until_ms = now_ms + remain_ms;
    b->probes = 0;
    b->consecutive_failures = 0;
}

int mg_breaker_would_allow(const mg_breaker_t *b, uint64_t now_ms)
{
    switch (mg_breaker_state(b, now_ms)) {
    case MG_BREAKER_CLOSED: return 1;
    case MG_BREAKER_OPEN: return 0;
    case MG_BREAKER_HALF_OPEN: break;
    }
    if (b->state == MG_BREAKER_OPEN) return 1; /* just turned half open: no probe out */
    return b->probes < breaker_max_probes(b) || breaker_probes_stale(b, now_ms);
}

int mg_breaker_allow(mg_breaker_t *b, uint64_t now_ms)
{
    breaker_advance(b, now_ms);
    if (b->state == MG_BREAKER_CLOSED) return 1;
    if (b->state == MG_BREAKER_OPEN) return 0;
    if (b->probes >= breaker_max_probes(b)) return 0;
    b->probes++;
    b->probe_at_ms = now_ms;
    return 1;
}

void mg_breaker_release(mg_breaker_t *b, uint64_t now_ms)
{
    breaker_advance(b, now_ms);
    if (b->state == MG_BREAKER_HALF_OPEN && b->probes > 0) b->probes--;
}

/* Whether the closed breaker's counts call for opening (after a failure). */
static int breaker_should_trip(const mg_breaker_t *b, uint64_t now_ms)
{
    const mg_breaker_config_t *cfg = &b->cfg;
    if (cfg->consecutive_failures > 0 && b->consecutive_failures >= cfg->consecutive_failures)
        return 1;
    if (cfg->error_rate_threshold <= 0) return 0;
    mg_outcome_sum_t s = mg_outcome_window_sum(&b->window, now_ms);
    uint64_t total = s.ok + s.fail;
    uint64_t min = cfg->min_requests > 0 ? (uint64_t)cfg->min_requests : 1;
    return total >= min && (double)s.fail / (double)total >= cfg->error_rate_threshold;
}

/* An outcome while closed. */
static int breaker_record_closed(mg_breaker_t *b, uint64_t now_ms, int failure)
{
    mg_outcome_window_add(&b->window, now_ms, !failure, -1);
    if (!failure) {
        b->consecutive_failures = 0;
        return 0;
    }
    b->consecutive_failures++;
    if (!breaker_should_trip(b, now_ms)) return 0;
    breaker_open(b, now_ms);
    b->trips++;
    return 1;
}

int mg_breaker_record(mg_breaker_t *b, uint64_t now_ms, int failure)
{
    breaker_advance(b, now_ms);
    switch (b->state) {
    case MG_BREAKER_CLOSED: return breaker_record_closed(b, now_ms, failure);
    case MG_BREAKER_OPEN: return 0;
    case MG_BREAKER_HALF_OPEN: break;
    }
    if (failure) {
        breaker_open(b, now_ms);
        b->trips++;
    } else {
        breaker_close(b);
    }
    return 1;
}

int mg_breaker_probe_result(mg_breaker_t *b, uint64_t now_ms, int ok)
{
    breaker_advance(b, now_ms);
    if (b->state == MG_BREAKER_OPEN) {
        if (!ok) breaker_open(b, now_ms); /* the same trip, extended */
        return 0;
    }
    return mg_breaker_record(b, now_ms, !ok);
}

uint64_t mg_breaker_retry_ms(const mg_breaker_t *b, uint64_t now_ms)
{
    if (mg_breaker_would_allow(b, now_ms)) return 0;
    if (b->state == MG_BREAKER_OPEN && now_ms < b->open_until_ms) return b->open_until_ms - now_ms;
    return b->probe_at_ms + breaker_probe_timeout_ms(b) - now_ms; /* half open, probes out */
}

int mg_breaker_counts_status(int http_status)
{
    return http_status == 0 || http_status == 429 || http_status == 502 || http_status == 503 ||
           http_status == 504;
}

/* ------------------------------------------------------------------------ */
/* Passive health                                                             */

void mg_health_config_default(mg_health_config_t *cfg)
{
    cfg->degrade_consecutive = 5;
    cfg->degrade_rate = 0.5;
    cfg->down_consecutive = 10;
    cfg->down_rate = 0.2;
    cfg->recover_consecutive = 3;
    cfg->recover_rate = 0.8;
    cfg->rate_min_samples = 10;
    cfg->window_buckets = 30;
    cfg->bucket_seconds = 10;
    cfg->recent_max = MG_HEALTH_RECENT_MAX;
    cfg->retry_down_ms = 30000;
}

static void health_shape(const mg_health_config_t *cfg, int *n, uint64_t *width_ms)
{
    *n = cfg->window_buckets;
    *width_ms = (uint64_t)(cfg->bucket_seconds > 0 ? cfg->bucket_seconds : 1) * 1000;
}

static int health_recent_cap(const mg_health_t *h)
{
    int n = h->cfg.recent_max;
    return n < 1 ? 1 : n > MG_HEALTH_RECENT_MAX ? MG_HEALTH_RECENT_MAX : n;
}

void mg_health_init(mg_health_t *h, const mg_health_config_t *cfg)
{
    memset(h, 0, sizeof(*h));
    if (cfg) h->cfg = *cfg;
    else mg_health_config_default(&h->cfg);
    h->state = MG_HEALTH_HEALTHY;
    h->last_latency_ms = -1;
    h->last_ttft_ms = -1;
    int n;
    uint64_t width;
    health_shape(&h->cfg, &n, &width);
    mg_outcome_window_init(&h->window, n, width);
}

static void health_recent_clear(mg_health_t *h)
{
    h->recent_head = h->recent_count = 0;
    h->recent_ok = h->recent_ttft_n = 0;
    h->recent_ttft_sum_ms = 0;
}

void mg_health_set_config(mg_health_t *h, const mg_health_config_t *cfg)
{
    int old_cap = health_recent_cap(h);
    h->cfg = *cfg;
    int n;
    uint64_t width;
    health_shape(cfg, &n, &width);
    mg_outcome_window_t probe;
    mg_outcome_window_init(&probe, n, width); /* normalises n the same way */
    if (probe.n != h->window.n || probe.width_ms != h->window.width_ms) h->window = probe;
    if (health_recent_cap(h) != old_cap) health_recent_clear(h);
}

/* Add s to (sign 1) or take it from (sign -1) the ring's running sums. */
static void health_recent_sum(mg_health_t *h, const mg_health_sample_t *s, int sign)
{
    h->recent_ok += sign * (s->ok != 0);
    if (s->ttft_ms >= 0) {
        h->recent_ttft_n += sign;
        h->recent_ttft_sum_ms += sign * (int64_t)s->ttft_ms;
    }
}

/* A TTFT as stored in a sample: -1 for none, at most INT32_MAX ms. */
static int32_t clamp_ttft(int64_t ttft_ms)
{
    if (ttft_ms < 0) return -1;
    return ttft_ms > INT32_MAX ? INT32_MAX : (int32_t)ttft_ms;
}

static void health_push_recent(mg_health_t *h, uint64_t now_ms, int ok, int64_t ttft_ms)
{
    int cap = health_recent_cap(h);
    mg_health_sample_t s = {.at_ms = now_ms, .ttft_ms = clamp_ttft(ttft_ms), .ok = ok};
    if (h->recent_count < cap) {
        h->recent[(h->recent_head + h->recent_count) % cap] = s;
        h->recent_count++;
    } else {
        health_recent_sum(h, &h->recent[h->recent_head], -1);
        h->recent[h->recent_head] = s;
        h->recent_head = (h->recent_head + 1) % cap;
    }
    health_recent_sum(h, &s, 1);
}

/* Success-rate rules. rate < 0 means no samples. */
static int health_rate_below(const mg_health_t *h, uint64_t total, double rate, double limit)
{
    uint64_t min = h->cfg.rate_min_samples > 0 ? (uint64_t)h->cfg.rate_min_samples : 1;
    return total >= min && rate < limit;
}

/* The state the counts call for, from the current one (ADR 4.1). */
static mg_health_state_t health_next(const mg_health_t *h, uint64_t now_ms)
{
    const mg_health_config_t *cfg = &h->cfg;
    mg_outcome_sum_t s = mg_outcome_window_sum(&h->window, now_ms);
    uint64_t total = s.ok + s.fail;
    double rate = total ? (double)s.ok / (double)total : -1;
    int down = h->consecutive_failures >= cfg->down_consecutive ||
               health_rate_below(h, total, rate, cfg->down_rate);
    int degrade = h->consecutive_failures >= cfg->degrade_consecutive ||
                  health_rate_below(h, total, rate, cfg->degrade_rate);
    int recover = h->consecutive_successes >= cfg->recover_consecutive && total > 0 &&
                  rate > cfg->recover_rate;
    switch (h->state) {
    case MG_HEALTH_HEALTHY: return down ? MG_HEALTH_DOWN : degrade ? MG_HEALTH_DEGRADED : h->state;
    case MG_HEALTH_DEGRADED: return down ? MG_HEALTH_DOWN : recover ? MG_HEALTH_HEALTHY : h->state;
    case MG_HEALTH_DOWN: return recover ? MG_HEALTH_HEALTHY : h->state;
    }
    return h->state;
}

/* Down and answered well (a trial or a probe): degraded, serving again, with the window that
 * took it down forgotten (its failures would take it straight back down); the successes in a
 * row then bring it to healthy. */
static int health_back_from_down(mg_health_t *h, uint64_t now_ms, int64_t ttft_ms)
{
    mg_outcome_window_clear(&h->window);
    health_recent_clear(h);
    h->consecutive_failures = 0;
    h->consecutive_successes = 1;
    mg_outcome_window_add(&h->window, now_ms, 1, ttft_ms);
    health_push_recent(h, now_ms, 1, ttft_ms);
    h->state = MG_HEALTH_DEGRADED;
    h->down_reason = NULL;
    h->changed_at_ms = now_ms;
    return 1;
}

/* Count one outcome everywhere and run the state machine. */
static int health_outcome(mg_health_t *h, uint64_t now_ms, int ok, int64_t ttft_ms)
{
    if (now_ms > h->last_at_ms) h->last_at_ms = now_ms;
    if (ok && h->state == MG_HEALTH_DOWN) return health_back_from_down(h, now_ms, ttft_ms);
    if (ok) {
        h->consecutive_successes++;
        h->consecutive_failures = 0;
    } else {
        h->consecutive_failures++;
        h->consecutive_successes = 0;
    }
    mg_outcome_window_add(&h->window, now_ms, ok, ttft_ms);
    health_push_recent(h, now_ms, ok, ttft_ms);
    mg_health_state_t next = health_next(h, now_ms);
    if (next == h->state) return 0;
    h->state = next;
    h->changed_at_ms = now_ms;
    if (next == MG_HEALTH_DOWN) {
        h->down_reason = h->consecutive_failures >= h->cfg.down_consecutive ? "consecutive_failures"
                                                                            : "success_rate";
        h->trial_at_ms = now_ms;
    }
    return 1;
}

int mg_health_would_allow(const mg_health_t *h, uint64_t now_ms)
{
    return h->state != MG_HEALTH_DOWN || mg_health_trial_in_ms(h, now_ms) == 0;
}

int mg_health_take_trial(mg_health_t *h, uint64_t now_ms)
{
    if (h->state != MG_HEALTH_DOWN) return 1;
    if (mg_health_trial_in_ms(h, now_ms) != 0) return 0;
    h->trial_at_ms = now_ms;
    return 1;
}

int64_t mg_health_trial_in_ms(const mg_health_t *h, uint64_t now_ms)
{
    if (h->state != MG_HEALTH_DOWN) return 0;
    if (h->cfg.retry_down_ms <= 0) return -1;
    uint64_t due = h->trial_at_ms + (uint64_t)h->cfg.retry_down_ms;
    return now_ms >= due ? 0 : (int64_t)(due - now_ms);
}

void mg_health_restore(mg_health_t *h, mg_health_state_t state, uint64_t now_ms)
{
    h->state = state;
    h->changed_at_ms = now_ms;
    h->down_reason = state == MG_HEALTH_DOWN ? "restored" : NULL;
    h->trial_at_ms = now_ms;
}

int mg_health_record(mg_health_t *h, uint64_t now_ms, int success, int64_t latency_ms,
                     int64_t ttft_ms)
{
    if (latency_ms >= 0) h->last_latency_ms = latency_ms;
    if (ttft_ms >= 0) h->last_ttft_ms = ttft_ms;
    return health_outcome(h, now_ms, success != 0, ttft_ms);
}

uint64_t mg_health_sample_at(const mg_health_t *h, uint64_t now_ms, uint64_t age_ms)
{
    uint64_t at = now_ms > age_ms ? now_ms - age_ms : 0;
    if (at < h->last_at_ms) at = h->last_at_ms;
    return at < now_ms ? at : now_ms;
}

int mg_health_probe_result(mg_health_t *h, uint64_t now_ms, int ok)
{
    return health_outcome(h, now_ms, ok != 0, -1);
}

/* The router's recent counters: the last recent_max attempts still in the
 * window. The running sums cover the whole ring; samples that have aged out of
 * the window (the oldest ones: the ring is in time order) are taken off a copy,
 * so a busy provider costs O(1) and an idle one at most one pass. */
static void health_recent_counts(const mg_health_t *h, uint64_t now_ms, mg_health_snapshot_t *o)
{
    int cap = health_recent_cap(h);
    const mg_outcome_window_t *w = &h->window;
    uint64_t cur = now_ms / w->width_ms;
    uint64_t start_ms =
        (cur >= (uint64_t)(w->n - 1) ? cur - (uint64_t)(w->n - 1) : 0) * w->width_ms;
    int n = h->recent_count, ok = h->recent_ok, ttft_n = h->recent_ttft_n;
    int64_t ttft_sum = h->recent_ttft_sum_ms;
    for (int i = h->recent_head; n > 0 && h->recent[i].at_ms < start_ms; i = (i + 1) % cap) {
        const mg_health_sample_t *s = &h->recent[i];
        n--;
        ok -= s->ok != 0;
        if (s->ttft_ms >= 0) {
            ttft_n--;
            ttft_sum -= s->ttft_ms;
        }
    }
    o->avail_samples = n;
    o->success_rate = n ? (double)ok / n : -1;
    o->ttft_samples = ttft_n;
    o->ttft_ms = ttft_n ? (double)ttft_sum / ttft_n : -1;
}

void mg_health_snapshot(const mg_health_t *h, uint64_t now_ms, mg_health_snapshot_t *out)
{
    mg_outcome_sum_t s = mg_outcome_window_sum(&h->window, now_ms);
    uint64_t total = s.ok + s.fail;
    out->state = h->state;
    out->consecutive_failures = h->consecutive_failures;
    out->consecutive_successes = h->consecutive_successes;
    out->last_latency_ms = h->last_latency_ms;
    out->last_ttft_ms = h->last_ttft_ms;
    out->window_samples = (int)total;
    out->window_success_rate = total ? (double)s.ok / (double)total : -1;
    out->window_ttft_ms = s.ttft_n ? (double)s.ttft_sum_ms / (double)s.ttft_n : -1;
    health_recent_counts(h, now_ms, out);
}

void mg_health_recent(const mg_health_t *h, uint64_t now_ms, mg_health_snapshot_t *out)
{
    *out = (mg_health_snapshot_t){.state = h->state};
    health_recent_counts(h, now_ms, out);
}

const char *mg_health_state_name(mg_health_state_t s)
{
    switch (s) {
    case MG_HEALTH_HEALTHY: return "healthy";
    case MG_HEALTH_DEGRADED: return "degraded";
    case MG_HEALTH_DOWN: return "down";
    }
    return "unknown";
}

int mg_health_state_from_name(const char *name)
{
    if (!name) return -1;
    for (int s = MG_HEALTH_HEALTHY; s <= MG_HEALTH_DOWN; s++)
        if (strcmp(name, mg_health_state_name((mg_health_state_t)s)) == 0) return s;
    return -1;
}
