/* Unit tests for core/route/health.c: the outcome window, the 429 cooldown (curve
 * inputs, observing, echo 429s, persistence), the circuit breaker (both trip
 * rules at their exact thresholds, open/half-open timing, probe counting) and
 * passive health (every transition at exactly its threshold, window expiry,
 * the router's recent counters). */
#include "route/health.h"
#include "mgtest.h"

#include <stdint.h>

#define T0 1000000u /* a "now" well past 0, like uv_now() after boot */

/* ------------------------------------------------------------------------ */
/* Outcome window                                                             */

static void test_outcome_window_expiry(void)
{
    mg_outcome_window_t w;
    mg_outcome_window_init(&w, 3, 1000);
    mg_outcome_window_add(&w, T0 + 999, 1, 100); /* bucket 1000 */
    mg_outcome_window_add(&w, T0 + 1000, 0, -1); /* bucket 1001 */
    mg_outcome_sum_t s = mg_outcome_window_sum(&w, T0 + 2999);
    CHECK_EQ_INT(s.ok, 1);
    CHECK_EQ_INT(s.fail, 1);
    CHECK_EQ_INT(s.ttft_n, 1);
    CHECK_EQ_INT(s.ttft_sum_ms, 100);
    s = mg_outcome_window_sum(&w, T0 + 3000); /* bucket 1000 is 3 back: out */
    CHECK_EQ_INT(s.ok, 0);
    CHECK_EQ_INT(s.fail, 1);
    mg_outcome_window_add(&w, T0 + 3500, 1, -1); /* reuses bucket 1000's slot */
    s = mg_outcome_window_sum(&w, T0 + 3500);
    CHECK_EQ_INT(s.ok, 1);
    CHECK_EQ_INT(s.fail, 1);
    CHECK_EQ_INT(s.ttft_n, 0);
    s = mg_outcome_window_sum(&w, T0 + 100000);
    CHECK_EQ_INT(s.ok + s.fail, 0);
    mg_outcome_window_init(&w, 500, 0); /* clamped */
    CHECK_EQ_INT(w.n, MG_OUTCOME_BUCKETS_MAX);
    CHECK_EQ_INT(w.width_ms, 1);
}

/* ------------------------------------------------------------------------ */
/* Cooldown                                                                   */

/* The default policy's curve (policies/cooldown.lua), to feed apply(). */
static double backoff(int n)
{
    double s = 30;
    for (int i = 1; i < n && s < 600; i++) s *= 2;
    return s < 600 ? s : 600;
}

static void test_cooldown_basic(void)
{
    mg_cooldown_t c;
    mg_cooldown_init(&c);
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0), 0);
    CHECK_EQ_INT(mg_cooldown_observing(&c, T0), 0);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0), 0);
    CHECK_EQ_INT(mg_cooldown_note_429(&c, T0), 1);
    mg_cooldown_apply(&c, T0, backoff(1));
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0), 1);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0), 30000);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0 + 29999), 1);
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0 + 29999), 1);
    CHECK_EQ_INT(mg_cooldown_observing(&c, T0 + 29999), 0);
    CHECK_EQ_INT(mg_cooldown_update(&c, T0 + 29999), 0);
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0 + 30000), 0);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0 + 30000), 0);
    CHECK_EQ_INT(mg_cooldown_observing(&c, T0 + 30000), 1); /* before update too */
    CHECK_EQ_INT(mg_cooldown_update(&c, T0 + 30000), 1);    /* the transition, once */
    CHECK_EQ_INT(mg_cooldown_update(&c, T0 + 30001), 0);
    CHECK_EQ_INT(c.observing, 1);
    CHECK_EQ_INT(c.consecutive_429, 1);
    /* observing -> success clears */
    CHECK_EQ_INT(mg_cooldown_success(&c, T0 + 31000), 1);
    CHECK_EQ_INT(c.observing, 0);
    CHECK_EQ_INT(c.consecutive_429, 0);
    CHECK_EQ_INT(mg_cooldown_success(&c, T0 + 32000), 0);
    /* next 429 starts again at 1 */
    CHECK_EQ_INT(mg_cooldown_note_429(&c, T0 + 40000), 1);
}

static void test_cooldown_curve_inputs(void)
{
    /* observing -> 429 again, episode after episode: the counts the policy sees */
    mg_cooldown_t c;
    mg_cooldown_init(&c);
    uint64_t now = T0;
    double expect_s[] = {30, 60, 120, 240, 480, 600, 600};
    for (int i = 0; i < 7; i++) {
        int n = mg_cooldown_note_429(&c, now);
        CHECK_EQ_INT(n, i + 1);
        CHECK(backoff(n) == expect_s[i]);
        mg_cooldown_apply(&c, now, backoff(n));
        CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, now), (uint64_t)(expect_s[i] * 1000));
        CHECK_EQ_INT(c.observing, 0);
        now += (uint64_t)(expect_s[i] * 1000); /* cooldown ends: observing */
        CHECK_EQ_INT(mg_cooldown_observing(&c, now), 1);
    }
}

static void test_cooldown_echo_and_extension(void)
{
    mg_cooldown_t c;
    mg_cooldown_init(&c);
    mg_cooldown_apply(&c, T0, backoff(mg_cooldown_note_429(&c, T0)));
    /* in-flight 429s answering requests sent before the cooldown: same episode */
    CHECK_EQ_INT(mg_cooldown_note_429(&c, T0 + 10), 1);
    CHECK_EQ_INT(mg_cooldown_note_429(&c, T0 + 29999), 1);
    /* apply only extends */
    mg_cooldown_apply(&c, T0 + 1000, 5);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0 + 1000), 29000);
    mg_cooldown_apply(&c, T0 + 1000, 100); /* e.g. a long Retry-After */
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0 + 1000), 100000);
    /* a success while cooling changes nothing */
    CHECK_EQ_INT(mg_cooldown_success(&c, T0 + 2000), 0);
    CHECK_EQ_INT(c.consecutive_429, 1);
    /* a zero-second cooldown: observing at once */
    mg_cooldown_init(&c);
    mg_cooldown_note_429(&c, T0);
    mg_cooldown_apply(&c, T0, 0);
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0), 0);
    CHECK_EQ_INT(mg_cooldown_observing(&c, T0), 1);
    CHECK_EQ_INT(mg_cooldown_note_429(&c, T0 + 1), 2);
    /* absurd policy answers stay defined */
    mg_cooldown_apply(&c, T0, -5);
    CHECK_EQ_INT(mg_cooldown_cooling(&c, T0), 0);
    mg_cooldown_apply(&c, T0, 1e300);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&c, T0), 10000000000ull);
}

static void test_cooldown_persistence(void)
{
    mg_cooldown_t c, r;
    uint64_t unix_now = 1700000000000ull;
    mg_cooldown_init(&c);
    mg_cooldown_note_429(&c, T0);
    mg_cooldown_note_429(&c, T0); /* same episode is not yet running: 2 */
    mg_cooldown_apply(&c, T0, 60);
    uint64_t until = mg_cooldown_until_unix_ms(&c, T0 + 10000, unix_now + 10000);
    CHECK_EQ_INT(until, unix_now + 60000);
    /* restart: another monotonic origin */
    mg_cooldown_restore(&r, 5000, unix_now + 20000, until, c.consecutive_429, 0);
    CHECK_EQ_INT(mg_cooldown_remaining_ms(&r, 5000), 40000);
    CHECK_EQ_INT(r.consecutive_429, 2);
    CHECK_EQ_INT(mg_cooldown_observing(&r, 45000), 1);
    /* the cooldown ended while the gateway was down: observing */
    mg_cooldown_restore(&r, 5000, unix_now + 90000, until, 2, 0);
    CHECK_EQ_INT(mg_cooldown_cooling(&r, 5000), 0);
    CHECK_EQ_INT(r.observing, 1);
    CHECK_EQ_INT(mg_cooldown_note_429(&r, 6000), 3);
    mg_cooldown_restore(&r, 5000, unix_now, 0, 0, 0);
    CHECK_EQ_INT(r.observing + r.active + r.consecutive_429, 0);
    CHECK_EQ_INT(mg_cooldown_until_unix_ms(&r, 5000, unix_now), 0);
}

/* ------------------------------------------------------------------------ */
/* Circuit breaker                                                            */

static void test_breaker_defaults(void)
{
    mg_breaker_config_t cfg;
    mg_breaker_config_default(&cfg);
    CHECK_EQ_INT(cfg.consecutive_failures, 3);
    CHECK(cfg.error_rate_threshold == 0.1);
    CHECK_EQ_INT(cfg.min_requests, 10);
    CHECK_EQ_INT(cfg.window_seconds, 60);
    CHECK_EQ_INT(cfg.open_duration_seconds, 30);
    CHECK_EQ_INT(cfg.half_open_max_requests, 1);
    mg_breaker_t b;
    mg_breaker_init(&b, NULL);
    CHECK_EQ_INT(b.window.n, 60);
    CHECK_EQ_INT(b.window.width_ms, 1000);
    CHECK_STR(mg_breaker_state_name(mg_breaker_state(&b, T0)), "closed");
    CHECK_STR(mg_breaker_state_name(MG_BREAKER_HALF_OPEN), "half_open");
    CHECK_EQ_INT(mg_breaker_counts_status(0), 1);
    CHECK_EQ_INT(mg_breaker_counts_status(429), 1);
    CHECK_EQ_INT(mg_breaker_counts_status(502), 1);
    CHECK_EQ_INT(mg_breaker_counts_status(503), 1);
    CHECK_EQ_INT(mg_breaker_counts_status(504), 1);
    CHECK_EQ_INT(mg_breaker_counts_status(500), 0);
    CHECK_EQ_INT(mg_breaker_counts_status(400), 0);
    CHECK_EQ_INT(mg_breaker_counts_status(200), 0);
}

static void test_breaker_consecutive_and_timing(void)
{
    mg_breaker_t b;
    mg_breaker_init(&b, NULL);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 0), 0); /* a success breaks the run */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0);
    CHECK_EQ_INT(mg_breaker_state(&b, T0), MG_BREAKER_CLOSED);
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 5, 1), 1); /* the third in a row */
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 5), MG_BREAKER_OPEN);
    CHECK_EQ_INT(b.trips, 1);
    CHECK_EQ_INT(mg_breaker_would_allow(&b, T0 + 5), 0);
    CHECK_EQ_INT(mg_breaker_retry_ms(&b, T0 + 5), 30000);
    CHECK_EQ_INT(mg_breaker_retry_ms(&b, T0 + 30004), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 30004), 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 30004, 0), 0); /* late answer while open: ignored */
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 30004), MG_BREAKER_OPEN);
    /* exactly open_duration later: half open, one probe */
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 30005), MG_BREAKER_HALF_OPEN);
    CHECK_EQ_INT(mg_breaker_would_allow(&b, T0 + 30005), 1);
    CHECK_EQ_INT(mg_breaker_retry_ms(&b, T0 + 30005), 0);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 30005), 1);
    CHECK_EQ_INT(mg_breaker_would_allow(&b, T0 + 30006), 0);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 30006), 0);
    /* probe fails: open again for 30 s from its answer */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 31000, 1), 1);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 31000), MG_BREAKER_OPEN);
    CHECK_EQ_INT(b.trips, 2);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 60999), 0);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 61000), 1);
    /* probe succeeds: closed, with a clean slate */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 62000, 0), 1);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 62000), MG_BREAKER_CLOSED);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 62000), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, T0 + 62000), 1);
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 62001, 1), 0); /* 1 of 1: under min_requests */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 62002, 1), 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 62003, 1), 1);
}

static void test_breaker_error_rate_threshold(void)
{
    mg_breaker_t b;
    mg_breaker_init(&b, NULL);
    /* 8 ok + 1 failure = 9 outcomes: under min_requests */
    for (int i = 0; i < 8; i++) mg_breaker_record(&b, T0 + (uint64_t)i, 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 8, 1), 0);
    /* a success never trips, even at 10 outcomes */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 9, 0), 0);
    /* 11 outcomes, 2 failures: 0.18 >= 0.1 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 10, 1), 1);

    mg_breaker_init(&b, NULL);
    for (int i = 0; i < 9; i++) mg_breaker_record(&b, T0, 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 1); /* 1/10 = exactly the threshold */

    mg_breaker_config_t cfg;
    mg_breaker_config_default(&cfg);
    cfg.consecutive_failures = 0; /* rate rule only */
    cfg.error_rate_threshold = 0.25;
    mg_breaker_init(&b, &cfg);
    for (int i = 0; i < 8; i++) mg_breaker_record(&b, T0, 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0); /* 1/9 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0); /* 2/10 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 1); /* 3/11 = 0.2727 >= 0.25: trips */
}

static void test_breaker_rate_just_below_and_at(void)
{
    mg_breaker_config_t cfg;
    mg_breaker_config_default(&cfg);
    cfg.consecutive_failures = 0;
    cfg.error_rate_threshold = 0.25;
    mg_breaker_t b;
    mg_breaker_init(&b, &cfg);
    for (int i = 0; i < 9; i++) mg_breaker_record(&b, T0, 0);
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0); /* 1/10 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0); /* 2/11 = 0.18 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 0), 0); /* 2/12 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 0); /* 3/13 = 0.23 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 0), 0); /* 3/14 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 0), 0); /* 3/15 */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 1); /* 4/16 = exactly 0.25 */
}

static void test_breaker_window_expiry(void)
{
    mg_breaker_config_t cfg;
    mg_breaker_config_default(&cfg);
    cfg.consecutive_failures = 0;
    cfg.error_rate_threshold = 0.5;
    cfg.min_requests = 4;
    mg_breaker_t a, b;
    mg_breaker_init(&a, &cfg);
    for (int i = 0; i < 3; i++) mg_breaker_record(&a, T0, 1); /* bucket 1000 */
    b = a;
    /* counted up to the end of bucket 1059 */
    CHECK_EQ_INT(mg_breaker_record(&a, T0 + 59999, 1), 1);
    /* at 1060 they are gone: 1 outcome, under min_requests */
    CHECK_EQ_INT(mg_breaker_record(&b, T0 + 60000, 1), 0);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 60000), MG_BREAKER_CLOSED);
}

static void test_breaker_probe_slots(void)
{
    mg_breaker_config_t cfg;
    mg_breaker_config_default(&cfg);
    cfg.half_open_max_requests = 2;
    mg_breaker_t b;
    mg_breaker_init(&b, &cfg);
    for (int i = 0; i < 3; i++) mg_breaker_record(&b, T0, 1);
    uint64_t ho = T0 + 30000;
    CHECK_EQ_INT(mg_breaker_allow(&b, ho), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho), 0);
    mg_breaker_release(&b, ho + 1); /* one was never sent */
    CHECK_EQ_INT(mg_breaker_would_allow(&b, ho + 1), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho + 1), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho + 2), 0);
    /* answers never come: the slots free after probe_timeout from the latest probe */
    CHECK_EQ_INT(mg_breaker_retry_ms(&b, ho + 2), 59999);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho + 60000), 0);
    CHECK_EQ_INT(mg_breaker_would_allow(&b, ho + 60001), 1);
    CHECK_EQ_INT(mg_breaker_allow(&b, ho + 60001), 1);
    CHECK_EQ_INT(mg_breaker_state(&b, ho + 60001), MG_BREAKER_HALF_OPEN);
    /* release when closed does nothing */
    mg_breaker_record(&b, ho + 60002, 0);
    mg_breaker_release(&b, ho + 60003);
    CHECK_EQ_INT(mg_breaker_state(&b, ho + 60003), MG_BREAKER_CLOSED);
    CHECK_EQ_INT(b.probes, 0);
}

static void test_breaker_active_probe(void)
{
    mg_breaker_t b;
    mg_breaker_init(&b, NULL);
    /* closed: probe failures count like attempts */
    mg_breaker_probe_result(&b, T0, 0);
    mg_breaker_probe_result(&b, T0, 0);
    CHECK_EQ_INT(mg_breaker_probe_result(&b, T0, 0), 1);
    CHECK_EQ_INT(mg_breaker_state(&b, T0), MG_BREAKER_OPEN);
    /* open: a success waits for the period; a failure restarts it */
    CHECK_EQ_INT(mg_breaker_probe_result(&b, T0 + 10000, 1), 0);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 10000), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_breaker_probe_result(&b, T0 + 20000, 0), 0);
    CHECK_EQ_INT(b.trips, 1);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 49999), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 50000), MG_BREAKER_HALF_OPEN);
    /* half open: a probe success closes without a reserved slot */
    CHECK_EQ_INT(mg_breaker_probe_result(&b, T0 + 50000, 1), 1);
    CHECK_EQ_INT(mg_breaker_state(&b, T0 + 50000), MG_BREAKER_CLOSED);
}

static void test_breaker_set_config(void)
{
    mg_breaker_t b;
    mg_breaker_init(&b, NULL);
    mg_breaker_record(&b, T0, 1);
    mg_breaker_config_t cfg = b.cfg;
    cfg.consecutive_failures = 2;
    mg_breaker_set_config(&b, &cfg);               /* same window: counts kept */
    CHECK_EQ_INT(mg_breaker_record(&b, T0, 1), 1); /* the second in a row now trips */
    cfg.window_seconds = 120;
    mg_breaker_set_config(&b, &cfg);
    CHECK_EQ_INT(b.window.n, 60);
    CHECK_EQ_INT(b.window.width_ms, 2000);
    CHECK_EQ_INT(mg_breaker_state(&b, T0), MG_BREAKER_OPEN); /* state kept */
}

/* ------------------------------------------------------------------------ */
/* Passive health                                                             */

static void fail_n(mg_health_t *h, uint64_t t, int n, int *changes)
{
    for (int i = 0; i < n; i++) *changes += mg_health_record(h, t, 0, 5, -1);
}

static void ok_n(mg_health_t *h, uint64_t t, int n, int *changes)
{
    for (int i = 0; i < n; i++) *changes += mg_health_record(h, t, 1, 50, 20);
}

static void test_health_consecutive_thresholds(void)
{
    mg_health_t h;
    int ch = 0;
    mg_health_init(&h, NULL);
    fail_n(&h, T0, 4, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY); /* 4 of 4 failed, but under rate_min_samples */
    CHECK_EQ_INT(mg_health_record(&h, T0, 0, -1, -1), 1); /* the 5th */
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(h.changed_at_ms, T0);
    fail_n(&h, T0, 4, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(ch, 0);
    CHECK_EQ_INT(mg_health_record(&h, T0 + 1, 0, -1, -1), 1); /* the 10th */
    CHECK_EQ_INT(h.state, MG_HEALTH_DOWN);
    CHECK_STR(h.down_reason, "consecutive_failures");
    /* down and answered well: degraded, the window that took it down forgotten */
    CHECK_EQ_INT(mg_health_record(&h, T0 + 2, 1, 50, -1), 1);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK(h.down_reason == NULL);
    mg_health_snapshot_t s;
    mg_health_snapshot(&h, T0 + 2, &s);
    CHECK_EQ_INT(s.window_samples, 1);
    /* then 3 in a row AND > 80% over the window: healthy */
    ok_n(&h, T0 + 2, 1, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(mg_health_record(&h, T0 + 3, 1, 50, -1), 1);
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY);
    CHECK_STR(mg_health_state_name(h.state), "healthy");
}

/* The way back without probes: one trial request every retry_down_ms while down. */
static void test_health_down_trials(void)
{
    mg_health_t h;
    int ch = 0;
    mg_health_init(&h, NULL);
    CHECK(mg_health_would_allow(&h, T0));
    CHECK_EQ_INT(mg_health_take_trial(&h, T0), 1); /* not down: always */
    CHECK_EQ_INT(mg_health_trial_in_ms(&h, T0), 0);
    fail_n(&h, T0, 10, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DOWN);
    CHECK(!mg_health_would_allow(&h, T0 + 29999));
    CHECK_EQ_INT(mg_health_trial_in_ms(&h, T0 + 20000), 10000);
    CHECK_EQ_INT(mg_health_take_trial(&h, T0 + 29999), 0);
    CHECK(mg_health_would_allow(&h, T0 + 30000));
    CHECK_EQ_INT(mg_health_take_trial(&h, T0 + 30000), 1);
    /* one per period, whatever became of it */
    CHECK(!mg_health_would_allow(&h, T0 + 30001));
    CHECK_EQ_INT(mg_health_take_trial(&h, T0 + 30001), 0);
    CHECK_EQ_INT(mg_health_trial_in_ms(&h, T0 + 30000), 30000);
    mg_health_record(&h, T0 + 31000, 0, 5, -1); /* the trial failed: still down */
    CHECK_EQ_INT(h.state, MG_HEALTH_DOWN);
    CHECK(mg_health_would_allow(&h, T0 + 60000));
    CHECK_EQ_INT(mg_health_take_trial(&h, T0 + 60000), 1);
    CHECK_EQ_INT(mg_health_record(&h, T0 + 61000, 1, 5, -1), 1); /* it answered */
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK(mg_health_would_allow(&h, T0 + 61001));
    /* retry_down_ms 0: no trials, only probes */
    mg_health_config_t cfg;
    mg_health_config_default(&cfg);
    CHECK_EQ_INT(cfg.retry_down_ms, 30000);
    cfg.retry_down_ms = 0;
    mg_health_t p;
    mg_health_init(&p, &cfg);
    fail_n(&p, T0, 10, &ch);
    CHECK(!mg_health_would_allow(&p, T0 + 3600000));
    CHECK_EQ_INT(mg_health_trial_in_ms(&p, T0), -1);
    /* a restored down state starts its trial clock at the restart */
    mg_health_t r;
    mg_health_init(&r, NULL);
    mg_health_restore(&r, MG_HEALTH_DOWN, T0 + 5);
    CHECK_STR(r.down_reason, "restored");
    CHECK(!mg_health_would_allow(&r, T0 + 5));
    CHECK(mg_health_would_allow(&r, T0 + 30005));
}

static void test_health_rate_thresholds(void)
{
    mg_health_t h;
    int ch = 0;
    mg_health_init(&h, NULL);
    /* alternate: never 5 in a row; 10 samples at exactly 50% */
    for (int i = 0; i < 5; i++) {
        ok_n(&h, T0, 1, &ch);
        fail_n(&h, T0, 1, &ch);
    }
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY);
    fail_n(&h, T0, 1, &ch); /* 5/11 < 0.5 */
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);

    /* down by rate: 2 ok + 8 failed = exactly 20%: still degraded (by 5 in a row) */
    mg_health_init(&h, NULL);
    ok_n(&h, T0, 2, &ch);
    fail_n(&h, T0, 8, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(mg_health_record(&h, T0, 0, -1, -1), 1); /* 2/11 < 0.2, only 9 in a row */
    CHECK_EQ_INT(h.state, MG_HEALTH_DOWN);
    CHECK_EQ_INT(h.consecutive_failures, 9);

    /* degraded -> healthy: 3 in a row and > 80% */
    mg_health_init(&h, NULL);
    fail_n(&h, T0, 5, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    ok_n(&h, T0, 20, &ch); /* 20/25 = 0.8 */
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    ok_n(&h, T0, 1, &ch); /* 21/26 */
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY);

    /* a high rate without 3 in a row does not recover */
    mg_health_init(&h, NULL);
    fail_n(&h, T0, 5, &ch);
    ok_n(&h, T0, 30, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY);
    fail_n(&h, T0, 5, &ch); /* 30/40 = 0.75, 5 in a row */
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    ok_n(&h, T0, 2, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED); /* 2 in a row */
    fail_n(&h, T0, 1, &ch);
    ok_n(&h, T0, 2, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
}

static void test_health_window_expiry(void)
{
    mg_health_t a, b;
    int ch = 0;
    mg_health_init(&a, NULL);
    fail_n(&a, T0, 5, &ch); /* bucket 100 of 10 s; counted while now < 1,300,000 */
    CHECK_EQ_INT(a.state, MG_HEALTH_DEGRADED);
    b = a;
    ok_n(&a, T0 + 299999, 3, &ch); /* 3/8 */
    CHECK_EQ_INT(a.state, MG_HEALTH_DEGRADED);
    ok_n(&b, T0 + 300000, 2, &ch);
    CHECK_EQ_INT(b.state, MG_HEALTH_DEGRADED); /* 100% but only 2 in a row */
    CHECK_EQ_INT(mg_health_record(&b, T0 + 300000, 1, -1, -1), 1);
    CHECK_EQ_INT(b.state, MG_HEALTH_HEALTHY);
    mg_health_snapshot_t s;
    mg_health_snapshot(&b, T0 + 300000, &s);
    CHECK_EQ_INT(s.window_samples, 3);
    CHECK(s.window_success_rate == 1.0);
    CHECK_EQ_INT(s.avail_samples, 3); /* the old failures left the recent view too */
}

static void test_health_probe_results(void)
{
    mg_health_t h;
    int ch = 0;
    mg_health_init(&h, NULL);
    for (int i = 0; i < 10; i++) ch += mg_health_probe_result(&h, T0 + (uint64_t)i * 60000, 0);
    CHECK_EQ_INT(ch, 2); /* degraded at 5, down at 10 */
    CHECK_EQ_INT(h.state, MG_HEALTH_DOWN);
    CHECK_EQ_INT(h.last_latency_ms, -1);
    /* a provider with no traffic comes back on probes: the first that passes makes it
       degraded (serving), three in a row healthy */
    uint64_t t = T0 + 10 * 60000;
    CHECK_EQ_INT(mg_health_probe_result(&h, t, 1), 1);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    mg_health_probe_result(&h, t + 60000, 1);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    mg_health_probe_result(&h, t + 120000, 1);
    CHECK_EQ_INT(h.state, MG_HEALTH_HEALTHY);
}

static void test_health_snapshot_and_recent(void)
{
    mg_health_t h;
    mg_health_snapshot_t s;
    mg_health_config_t cfg;
    mg_health_config_default(&cfg);
    cfg.down_consecutive = 1000; /* never down: the counts below stay in the window */
    cfg.down_rate = 0;
    mg_health_init(&h, &cfg);
    mg_health_snapshot(&h, T0, &s);
    CHECK_EQ_INT(s.window_samples, 0);
    CHECK(s.window_success_rate == -1);
    CHECK(s.success_rate == -1);
    CHECK(s.ttft_ms == -1);
    CHECK_EQ_INT(s.avail_samples, 0);
    CHECK_EQ_INT(s.last_latency_ms, -1);
    /* 50 failures then 100 successes with TTFT 10..: recent sees the last 100 */
    for (int i = 0; i < 50; i++) mg_health_record(&h, T0 + (uint64_t)i, 0, 7, -1);
    for (int i = 0; i < 100; i++)
        mg_health_record(&h, T0 + 100 + (uint64_t)i, 1, 300 + i, i % 2 ? 100 : 200);
    mg_health_snapshot(&h, T0 + 1000, &s);
    CHECK_EQ_INT(s.window_samples, 150);
    CHECK(s.window_success_rate == 100.0 / 150.0);
    CHECK(s.window_ttft_ms == 150.0);
    CHECK_EQ_INT(s.avail_samples, 100);
    CHECK(s.success_rate == 1.0);
    CHECK_EQ_INT(s.ttft_samples, 100);
    CHECK(s.ttft_ms == 150.0);
    CHECK_EQ_INT(s.last_latency_ms, 399);
    CHECK_EQ_INT(s.last_ttft_ms, 100);
    CHECK_EQ_INT(s.consecutive_successes, 100);
    /* one failure: 99 ok of the last 100 */
    mg_health_record(&h, T0 + 2000, 0, 9, -1);
    mg_health_snapshot(&h, T0 + 2000, &s);
    CHECK(s.success_rate == 0.99);
    CHECK_EQ_INT(s.ttft_samples, 99);
    CHECK_EQ_INT(s.last_latency_ms, 9);
    CHECK_EQ_INT(s.last_ttft_ms, 100); /* a failure has no TTFT: last one kept */
    /* the recent view expires with the window */
    mg_health_record(&h, T0 + 250000, 1, 1, 40);
    mg_health_snapshot(&h, T0 + 300000, &s); /* bucket 130: bucket 100 has left */
    CHECK_EQ_INT(s.avail_samples, 1);
    CHECK_EQ_INT(s.ttft_samples, 1);
    CHECK(s.ttft_ms == 40.0);
    mg_health_snapshot(&h, T0 + 600000, &s);
    CHECK_EQ_INT(s.avail_samples, 0);
    CHECK_EQ_INT(s.window_samples, 0);
}

/* Random outcomes and gaps: the recent counters against a naive recount of the
 * last 100 records whose 10 s bucket is one of the last 30. */
static void test_health_recent_brute_force(void)
{
    enum { N = 3000 };
    static uint64_t at[N];
    static int ok[N];
    static int64_t ttft[N];
    uint64_t x = 12345, t = T0;
    int bad = 0;
    mg_health_t h;
    mg_health_init(&h, NULL);
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(x >> 33);
        t += r % 5 == 0 ? r % 200000 : r % 3000;
        at[i] = t;
        ok[i] = r % 3 != 0;
        ttft[i] = ok[i] && r % 2 ? (int64_t)(r % 900) : -1;
        mg_health_record(&h, t, ok[i], 10, ttft[i]);
        uint64_t now = t + (r % 4 == 0 ? r % 100000 : 0);
        int n = 0, n_ok = 0, n_ttft = 0;
        int64_t sum = 0;
        for (int k = i; k >= 0 && k > i - 100; k--) {
            if (at[k] / 10000 + 30 <= now / 10000) continue;
            n++;
            n_ok += ok[k];
            if (ttft[k] >= 0) {
                n_ttft++;
                sum += ttft[k];
            }
        }
        mg_health_snapshot_t s, rec;
        mg_health_snapshot(&h, now, &s);
        mg_health_recent(&h, now, &rec); /* the router's view: the same figures */
        if (rec.state != s.state || rec.avail_samples != s.avail_samples ||
            rec.ttft_samples != s.ttft_samples || rec.success_rate != s.success_rate ||
            rec.ttft_ms != s.ttft_ms)
            bad++;
        if (s.avail_samples != n || s.ttft_samples != n_ttft) bad++;
        if (n && s.success_rate != (double)n_ok / n) bad++;
        if (n_ttft && s.ttft_ms != (double)sum / n_ttft) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_health_config_and_names(void)
{
    mg_health_config_t cfg;
    mg_health_config_default(&cfg);
    CHECK_EQ_INT(cfg.degrade_consecutive, 5);
    CHECK_EQ_INT(cfg.down_consecutive, 10);
    CHECK_EQ_INT(cfg.recover_consecutive, 3);
    CHECK(cfg.degrade_rate == 0.5 && cfg.down_rate == 0.2 && cfg.recover_rate == 0.8);
    CHECK_EQ_INT(cfg.window_buckets * cfg.bucket_seconds, 300);
    mg_health_t h;
    mg_health_init(&h, &cfg);
    int ch = 0;
    fail_n(&h, T0, 2, &ch);
    cfg.degrade_consecutive = 3;
    mg_health_set_config(&h, &cfg); /* counters kept */
    fail_n(&h, T0, 1, &ch);
    CHECK_EQ_INT(h.state, MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(mg_health_state_from_name("down"), MG_HEALTH_DOWN);
    CHECK_EQ_INT(mg_health_state_from_name("degraded"), MG_HEALTH_DEGRADED);
    CHECK_EQ_INT(mg_health_state_from_name("healthy"), MG_HEALTH_HEALTHY);
    CHECK_EQ_INT(mg_health_state_from_name("sick"), -1);
    CHECK_EQ_INT(mg_health_state_from_name(NULL), -1);
    h.state = (mg_health_state_t)mg_health_state_from_name("down"); /* restore */
    CHECK_STR(mg_health_state_name(h.state), "down");
}

int main(void)
{
    MG_RUN(test_outcome_window_expiry);
    MG_RUN(test_cooldown_basic);
    MG_RUN(test_cooldown_curve_inputs);
    MG_RUN(test_cooldown_echo_and_extension);
    MG_RUN(test_cooldown_persistence);
    MG_RUN(test_breaker_defaults);
    MG_RUN(test_breaker_consecutive_and_timing);
    MG_RUN(test_breaker_error_rate_threshold);
    MG_RUN(test_breaker_rate_just_below_and_at);
    MG_RUN(test_breaker_window_expiry);
    MG_RUN(test_breaker_probe_slots);
    MG_RUN(test_breaker_active_probe);
    MG_RUN(test_breaker_set_config);
    MG_RUN(test_health_consecutive_thresholds);
    MG_RUN(test_health_down_trials);
    MG_RUN(test_health_rate_thresholds);
    MG_RUN(test_health_window_expiry);
    MG_RUN(test_health_probe_results);
    MG_RUN(test_health_snapshot_and_recent);
    MG_RUN(test_health_recent_brute_force);
    MG_RUN(test_health_config_and_names);
    return mg_test_summary();
}
