/* Unit tests for core/route/limiter.c: the exact RPM sliding log (boundaries, next_ms,
 * emergency cap, limit changes, undo), the bucketed TPM window (reserve, settle,
 * release, 1 s precision bound, next_ms), the all-or-nothing provider limiter,
 * and brute-force checks over random arrival sequences. */
#include "route/limiter.h"
#include "mgtest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define T0 1000000u /* a "now" well past 0, like uv_now() after boot */

/* A small deterministic generator, so failures reproduce. */
static uint64_t rng_state = 88172645463325252ull;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* ------------------------------------------------------------------------ */
/* RPM                                                                        */

static void test_rpm_exact_limit_then_refusal(void)
{
    mg_rpm_window_t w;
    CHECK_EQ_INT(mg_rpm_init(&w, 5), 0);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(mg_rpm_try(&w, T0 + (uint64_t)i), 1);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 4), 5);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 5), 0);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 59999), 0); /* oldest is 59999 ms old */
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 59999), 5);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 60000), 4); /* T0 has left (T0, T0+60000] */
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60000), 1);  /* exactly +60,000 ms */
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60000), 0);  /* T0+1 is still 59999 ms old */
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60001), 1);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 60001), 5);
    mg_rpm_free(&w);
}

static void test_rpm_next_ms(void)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, 3);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0), T0); /* empty: now */
    mg_rpm_try(&w, T0);
    mg_rpm_try(&w, T0 + 10000);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 10000), T0 + 10000); /* one slot left */
    mg_rpm_try(&w, T0 + 20000);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 20000), T0 + 60000);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 59999), T0 + 60000);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 60000), T0 + 60000);
    CHECK_EQ_INT(mg_rpm_try(&w, mg_rpm_next_ms(&w, T0 + 30000)), 1);
    /* now full again with T0+10000 the oldest */
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 60000), T0 + 70000);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 500000), T0 + 500000); /* long idle: now */
    mg_rpm_free(&w);
}

static void test_rpm_unlimited(void)
{
    mg_rpm_window_t w;
    CHECK_EQ_INT(mg_rpm_init(&w, 0), 0);
    for (int i = 0; i < 1000; i++) CHECK_EQ_INT(mg_rpm_try(&w, T0), 1);
    CHECK_EQ_INT(mg_rpm_used(&w, T0), 0);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0), T0);
    CHECK_EQ_INT(mg_rpm_emergency_limit(&w), 0);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0), 1);
    mg_rpm_free(&w);
    CHECK_EQ_INT(mg_rpm_init(&w, -1), -1);
    mg_rpm_free(&w); /* safe after a failed init */
}

static void test_rpm_emergency_cap(void)
{
    mg_rpm_window_t w;
    int limits[] = {1, 5, 9, 10, 15, 19, 20, 100, 600};
    int caps[] = {1, 1, 1, 1, 1, 1, 2, 10, 60};
    for (int k = 0; k < 9; k++) {
        mg_rpm_init(&w, limits[k]);
        CHECK_EQ_INT(mg_rpm_emergency_limit(&w), caps[k]);
        mg_rpm_free(&w);
    }
    /* 100/min: 10 emergency admissions in the window, counted with normal ones */
    mg_rpm_init(&w, 100);
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(mg_rpm_try(&w, T0 + (uint64_t)i * 1000), 1);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 10000), 1);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 10000), 0);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 10000), 10);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 10000), 1); /* the normal limit still has room */
    /* 11 in window: one below the cap needs two to leave: T0 and T0+1000 */
    CHECK_EQ_INT(mg_rpm_emergency_next_ms(&w, T0 + 10000), T0 + 61000);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 60999), 0);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 61000), 1);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 61000), 0);
    mg_rpm_free(&w);
    /* the ratio is configurable (routing.emergency_rpm_ratio) */
    mg_rpm_init(&w, 100);
    mg_rpm_set_emergency_ratio(&w, 0.29);
    CHECK_EQ_INT(mg_rpm_emergency_limit(&w), 29);
    mg_rpm_set_emergency_ratio(&w, 0);
    CHECK_EQ_INT(mg_rpm_emergency_limit(&w), 1);
    mg_rpm_set_emergency_ratio(&w, 7);
    CHECK_EQ_INT(mg_rpm_emergency_limit(&w), 100);
    mg_rpm_set_emergency_ratio(&w, 0.25);
    CHECK_EQ_INT(mg_rpm_set_limit(&w, 20), 0);
    CHECK_EQ_INT(mg_rpm_emergency_limit(&w), 5); /* kept across a limit change */
    mg_rpm_free(&w);
    /* a tiny limit still lets one emergency request per minute through */
    mg_rpm_init(&w, 5);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0), 1);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 59999), 0);
    CHECK_EQ_INT(mg_rpm_emergency_next_ms(&w, T0 + 1), T0 + 60000);
    CHECK_EQ_INT(mg_rpm_try_emergency(&w, T0 + 60000), 1);
    mg_rpm_free(&w);
}

static void test_rpm_set_limit_keeps_history(void)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, 5);
    for (int i = 0; i < 5; i++) mg_rpm_try(&w, T0 + (uint64_t)i * 1000);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 5000), 0);
    CHECK_EQ_INT(mg_rpm_set_limit(&w, 8), 0);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 5000), 5);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(mg_rpm_try(&w, T0 + 5000), 1);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 5000), 0);
    /* shrink to 3: the newest three (all at T0+5000) decide */
    CHECK_EQ_INT(mg_rpm_set_limit(&w, 3), 0);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 5000), 3);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 5000), T0 + 65000);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 64999), 0);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 65000), 1);
    CHECK_EQ_INT(mg_rpm_set_limit(&w, -2), -1);
    CHECK_EQ_INT(mg_rpm_set_limit(&w, 0), 0);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 65000), 1);
    CHECK_EQ_INT(mg_rpm_set_limit(&w, 2), 0); /* from unlimited: starts empty */
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 65000), 0);
    mg_rpm_free(&w);
}

static void test_rpm_undo(void)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, 3);
    mg_rpm_try(&w, T0);
    mg_rpm_try(&w, T0 + 1);
    mg_rpm_try(&w, T0 + 2);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 3), 0);
    mg_rpm_undo(&w, T0 + 1); /* from the middle */
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 3), 2);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 3), 1);
    CHECK_EQ_INT(mg_rpm_next_ms(&w, T0 + 3), T0 + 60000);
    mg_rpm_undo(&w, T0 + 12345); /* not there: no-op */
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 3), 3);
    /* wrap the ring, then undo the newest */
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60000), 1);
    mg_rpm_undo(&w, T0 + 60000);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 60000), 2);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60000), 1);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 60001), 0);
    mg_rpm_free(&w);
}

static void test_rpm_time_never_goes_back(void)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, 2);
    mg_rpm_try(&w, T0 + 100000);
    mg_rpm_try(&w, T0); /* earlier: recorded as T0+100000 */
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 159999), 2);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 159999), 0);
    CHECK_EQ_INT(mg_rpm_try(&w, T0 + 160000), 1);
    mg_rpm_free(&w);
}

/* The log keeps one run per millisecond: a high rate costs no more memory than a
 * millisecond's worth, and a minute of distinct milliseconds at most 65,536 runs. */
static void test_rpm_memory_bounded(void)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, 5000000);
    for (int i = 0; i < 200000; i++)
        CHECK(mg_rpm_try(&w, T0 + (uint64_t)(i / 20000))); /* 20,000 per ms for 10 ms */
    CHECK_EQ_INT(w.n_runs, 10);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 9), 200000);
    CHECK(w.cap <= 16);
    for (int i = 0; i < 150000; i++) mg_rpm_try(&w, T0 + 10 + (uint64_t)i); /* 1 per ms */
    CHECK(w.n_runs <= 65536);
    CHECK(w.cap <= 65536);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 10 + 149999), 60000);
    mg_rpm_free(&w);
    /* undo in a run of several, in the middle of the log, then of a whole run */
    mg_rpm_init(&w, 10);
    for (int i = 0; i < 3; i++) mg_rpm_try(&w, T0);
    for (int i = 0; i < 2; i++) mg_rpm_try(&w, T0 + 5);
    mg_rpm_try(&w, T0 + 9);
    mg_rpm_undo(&w, T0 + 5);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 9), 5);
    mg_rpm_undo(&w, T0 + 5);
    CHECK_EQ_INT(w.n_runs, 2);
    CHECK_EQ_INT(mg_rpm_used(&w, T0 + 60004), 1); /* T0's three have left, T0+9 is in */
    mg_rpm_free(&w);
}

/* How many of the n admitted times lie in (t - 60000, t]. */
static int brute_used(const uint64_t *adm, int n, uint64_t t)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        if (adm[i] <= t && adm[i] + MG_LIMIT_WINDOW_MS > t) c++;
    return c;
}

static int rpm_refusals, tpm_refusals; /* proof the random runs reach the limits */

/* One random sequence: every decision, used() and next_ms() against brute force;
 * then the invariant over every window. Returns the number of mismatches. */
static int rpm_random_sequence(int limit, int n_arrivals, int with_emergency)
{
    mg_rpm_window_t w;
    mg_rpm_init(&w, limit);
    uint64_t *adm = calloc((size_t)n_arrivals, sizeof(*adm));
    int n = 0, bad = 0;
    uint64_t t = T0;
    for (int i = 0; i < n_arrivals; i++) {
        uint32_t r = rng() % 10;
        t += r < 3 ? 0 : r < 6 ? rng() % 200 : r < 9 ? rng() % 15000 : 60000 - rng() % 3;
        int used = brute_used(adm, n, t);
        if (mg_rpm_used(&w, t) != used) bad++;
        int emergency = with_emergency && rng() % 4 == 0;
        int cap = emergency ? (limit / 10 ? limit / 10 : 1) : limit;
        int expect = used < cap;
        int got = emergency ? mg_rpm_try_emergency(&w, t) : mg_rpm_try(&w, t);
        if (got != expect) bad++;
        if (got) {
            adm[n++] = t;
            continue;
        }
        rpm_refusals++;
        uint64_t next = emergency ? mg_rpm_emergency_next_ms(&w, t) : mg_rpm_next_ms(&w, t);
        if (next <= t || brute_used(adm, n, next) >= cap || brute_used(adm, n, next - 1) < cap)
            bad++;
    }
    /* no window [a, a + 60000) ever holds more than limit admissions */
    for (int i = 0; i + limit < n; i++)
        if (adm[i + limit] < adm[i] + MG_LIMIT_WINDOW_MS) bad++;
    free(adm);
    mg_rpm_free(&w);
    return bad;
}

static void test_rpm_brute_force_random(void)
{
    int bad = 0;
    for (int k = 0; k < 300; k++)
        bad += rpm_random_sequence(1 + (int)(rng() % 25), 400, k % 3 == 0);
    bad += rpm_random_sequence(600, 3000, 1);
    CHECK_EQ_INT(bad, 0);
    CHECK(rpm_refusals > 10000);
}

/* ------------------------------------------------------------------------ */
/* TPM                                                                        */

static void test_tpm_reserve_and_settle(void)
{
    mg_tpm_window_t w;
    mg_tpm_resv_t a, b, c, d;
    mg_tpm_init(&w, 1000);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0, 600, &a), 1);
    CHECK_EQ_INT(a.tokens, 600);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 10, 500, &b), 0); /* 1100 > 1000 */
    CHECK_EQ_INT(b.active, 0);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 10, 400, &b), 1); /* exactly 1000 */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 10), 1000);
    CHECK_EQ_INT(mg_tpm_can(&w, T0 + 10, 1), 0);
    CHECK_EQ_INT(mg_tpm_can(&w, T0 + 10, 0), 1);
    mg_tpm_settle(&w, &a, 250); /* the estimate was high: 350 back */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 20), 650);
    CHECK_EQ_INT(a.active, 0);
    mg_tpm_settle(&w, &a, 0); /* twice: no effect */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 20), 650);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 20, 350, &c), 1);
    mg_tpm_settle(&w, &c, 500); /* low estimate: the window goes past the limit */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 20), 1150);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 20, 0, &d), 0);
    mg_tpm_release(&w, &b);
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 20), 750);
    CHECK_EQ_INT(w.requests, 2); /* a and c; b released */
    mg_tpm_settle(&w, &d, 10);   /* inactive (refused) reservation: no effect */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 20), 750);
}

static void test_tpm_window_expiry_precision(void)
{
    mg_tpm_window_t w;
    mg_tpm_resv_t a, b;
    mg_tpm_init(&w, 100);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 500, 100, &a), 1); /* second 1000 */
    /* counted for the 60 s after, and up to 1 s more (the end of its second + 60) */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 500 + 60000), 100);
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 60999), 100);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 60999, 1), T0 + 61000);
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 61000), 0);
    CHECK_EQ_INT(mg_tpm_reserve(&w, T0 + 61000, 100, &b), 1);
    mg_tpm_settle(&w, &a, 5000); /* a's second has left the window: dropped */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 61000), 100);
    /* a long idle gap clears everything */
    CHECK_EQ_INT(mg_tpm_used(&w, T0 + 10000000), 0);
    CHECK_EQ_INT(w.requests, 0);
}

static void test_tpm_next_ms(void)
{
    mg_tpm_window_t w;
    mg_tpm_resv_t r;
    mg_tpm_init(&w, 1000);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0, 1000), T0);
    CHECK(mg_tpm_next_ms(&w, T0, 1001) == MG_LIMIT_NEVER);
    mg_tpm_reserve(&w, T0, 300, &r);         /* second 1000 */
    mg_tpm_reserve(&w, T0 + 5000, 300, &r);  /* second 1005 */
    mg_tpm_reserve(&w, T0 + 20500, 300, &r); /* second 1020 */
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 30000, 100), T0 + 30000);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 30000, 200), T0 + 61000);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 30000, 400), T0 + 61000);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 30000, 500), T0 + 66000);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0 + 30000, 1000), T0 + 81000);
    /* and the predicted instants are right: just before fails, at succeeds */
    mg_tpm_window_t copy = w;
    CHECK_EQ_INT(mg_tpm_reserve(&copy, T0 + 65999, 500, &r), 0);
    CHECK_EQ_INT(mg_tpm_reserve(&copy, T0 + 66000, 500, &r), 1);
    mg_tpm_init(&w, 0); /* unlimited: always now, still counted */
    mg_tpm_reserve(&w, T0, 1000000, &r);
    CHECK_EQ_INT(mg_tpm_next_ms(&w, T0, 5000000), T0);
    CHECK_EQ_INT(mg_tpm_used(&w, T0), 1000000);
}

/* Brute force: the limit holds in every exact 60 s window, a refusal is never
 * more than 1 s stricter than an exact log, and next_ms is exact for the buckets.
 * Some reservations are settled lower on the way (as if they had been smaller). */
static int tpm_random_sequence(int64_t limit, int n_arrivals)
{
    mg_tpm_window_t w;
    mg_tpm_init(&w, limit);
    uint64_t *at = calloc((size_t)n_arrivals, sizeof(*at));
    int64_t *tok = calloc((size_t)n_arrivals, sizeof(*tok));
    mg_tpm_resv_t *rv = calloc((size_t)n_arrivals, sizeof(*rv));
    int n = 0, bad = 0;
    uint64_t t = T0 + rng() % 1000;
    for (int i = 0; i < n_arrivals; i++) {
        t += rng() % 4 ? rng() % 3000 : 0;
        if (n > 0 && rng() % 3 == 0) {
            int k = (int)(rng() % (uint32_t)n);
            int64_t actual = rv[k].active ? (int64_t)(rng() % (uint32_t)(tok[k] + 1)) : 0;
            if (rv[k].active && (at[k] / 1000) + 60 >= t / 1000) tok[k] = actual;
            mg_tpm_settle(&w, &rv[k], actual); /* out of the window: dropped */
        }
        int64_t want = (int64_t)(rng() % (uint32_t)(limit / 3 + 1));
        int64_t exact60 = 0, exact61 = 0;
        for (int k = 0; k < n; k++) {
            if (at[k] + 60000 > t) exact60 += tok[k];
            if (at[k] + 61000 > t) exact61 += tok[k];
        }
        int64_t used = mg_tpm_used(&w, t);
        if (used < exact60 || used > exact61) bad++;
        if (mg_tpm_reserve(&w, t, want, &rv[n])) {
            at[n] = t;
            tok[n++] = want;
            if (exact60 + want > limit) bad++; /* let through past the exact limit */
            continue;
        }
        tpm_refusals++;
        if (exact61 + want <= limit) bad++; /* refused beyond the 1 s slack */
        uint64_t next = mg_tpm_next_ms(&w, t, want);
        mg_tpm_window_t c1 = w, c2 = w;
        mg_tpm_resv_t r1, r2;
        if (next <= t || !mg_tpm_reserve(&c1, next, want, &r1) ||
            mg_tpm_reserve(&c2, next - 1, want, &r2))
            bad++;
    }
    free(at);
    free(tok);
    free(rv);
    return bad;
}

static void test_tpm_brute_force_random(void)
{
    int bad = 0;
    for (int k = 0; k < 200; k++) bad += tpm_random_sequence(100 + (int64_t)(rng() % 5000), 300);
    CHECK_EQ_INT(bad, 0);
    CHECK(tpm_refusals > 5000);
}

/* ------------------------------------------------------------------------ */
/* Provider limiter                                                           */

static void test_limiter_all_or_nothing(void)
{
    mg_limiter_t l;
    mg_limiter_resv_t a, b, c;
    CHECK_EQ_INT(mg_limiter_init(&l, 2, 1000), 0);
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0, 600, &a), MG_LIMIT_OK);
    /* TPM refuses: the RPM side must not have counted it */
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 1, 600, &b), MG_LIMIT_TPM);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 1), 1);
    CHECK_EQ_INT(mg_limiter_tpm_used(&l, T0 + 1), 600);
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 2, 100, &b), MG_LIMIT_OK);
    /* RPM refuses: the TPM side must not have counted it */
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 3, 10, &c), MG_LIMIT_RPM);
    CHECK_EQ_INT(mg_limiter_tpm_used(&l, T0 + 3), 700);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 3), 2);
    /* both would refuse: RPM is reported */
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 3, 900, &c), MG_LIMIT_RPM);
    CHECK_EQ_INT(mg_limiter_next_ms(&l, T0 + 3, 10), T0 + 60000);
    CHECK_EQ_INT(mg_limiter_next_ms(&l, T0 + 3, 900), T0 + 61000); /* TPM is the later */
    /* cancel gives back both halves */
    mg_limiter_cancel(&l, &b);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 3), 1);
    CHECK_EQ_INT(mg_limiter_tpm_used(&l, T0 + 3), 600);
    mg_limiter_cancel(&l, &b); /* twice: no-op */
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 3), 1);
    /* settle keeps the request, corrects the tokens */
    mg_limiter_settle(&l, &a, 100);
    CHECK_EQ_INT(mg_limiter_tpm_used(&l, T0 + 4), 100);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 4), 1);
    CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 4, 900, &c), MG_LIMIT_OK);
    CHECK(mg_limiter_headroom(&l, T0 + 4) == 0.0);
    mg_limiter_free(&l);
}

static void test_limiter_emergency(void)
{
    mg_limiter_t l;
    mg_limiter_resv_t r;
    mg_limiter_init(&l, 30, 0);  /* emergency cap 3, counted apart from normal traffic */
    for (int i = 0; i < 20; i++) /* a busy window (the provider then answered 429) */
        CHECK_EQ_INT(mg_limiter_reserve(&l, T0, 1, &r), MG_LIMIT_OK);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(mg_limiter_reserve_emergency(&l, T0 + 1 + i, 1, &r), MG_LIMIT_OK);
    CHECK_EQ_INT(mg_limiter_reserve_emergency(&l, T0 + 5, 1, &r), MG_LIMIT_RPM);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 5), 23); /* emergency requests still count */
    CHECK_EQ_INT(mg_limiter_reserve_emergency(&l, T0 + 1 + 60000, 1, &r), MG_LIMIT_OK);
    mg_limiter_free(&l);
    mg_limiter_init(&l, 30, 100); /* TPM checked at its normal limit */
    CHECK_EQ_INT(mg_limiter_reserve_emergency(&l, T0, 101, &r), MG_LIMIT_TPM);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0), 0);
    mg_limiter_free(&l);
}

static void test_limiter_unlimited_and_headroom(void)
{
    mg_limiter_t l;
    mg_limiter_resv_t r;
    mg_limiter_init(&l, 0, 0);
    for (int i = 0; i < 50; i++) CHECK_EQ_INT(mg_limiter_reserve(&l, T0 + 500, 10, &r), 0);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 500), 50); /* counted by the buckets */
    CHECK(mg_limiter_headroom(&l, T0 + 500) == 1.0);
    mg_limiter_cancel(&l, &r);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 500), 49);
    CHECK_EQ_INT(mg_limiter_rpm_used(&l, T0 + 61000), 0);
    /* reload to a limit */
    CHECK_EQ_INT(mg_limiter_set_limits(&l, 4, 0), 0);
    mg_limiter_reserve(&l, T0 + 61000, 1, &r);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.75);
    /* steps of 1/1000, rounded down: a large limit moves it once in many requests */
    CHECK_EQ_INT(mg_limiter_set_limits(&l, 6000, 0), 0);
    for (int i = 0; i < 5; i++) mg_limiter_reserve(&l, T0 + 61000, 1, &r);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.999); /* 5994 / 6000 */
    for (int i = 0; i < 6; i++) mg_limiter_reserve(&l, T0 + 61000, 1, &r);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.998); /* 5988 / 6000 */
    CHECK_EQ_INT(mg_limiter_set_limits(&l, 2011, 0), 0);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.994); /* 1999 / 2011 = 0.99403 */
    /* while any request is left it stays above 0, so the route keeps a weight */
    CHECK_EQ_INT(mg_limiter_set_limits(&l, 2000, 0), 0);
    for (int i = 0; i < 3000 && mg_limiter_rpm_used(&l, T0 + 61000) < 1999; i++)
        mg_limiter_reserve(&l, T0 + 61000, 1, &r);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.001); /* 1 / 2000 */
    CHECK_EQ_INT(mg_limiter_set_limits(&l, 1999, 0), 0);
    CHECK(mg_limiter_headroom(&l, T0 + 61000) == 0.0);
    CHECK_EQ_INT(mg_limiter_set_limits(&l, -1, 0), -1);
    CHECK_EQ_INT(l.rpm.limit, 1999);
    mg_limiter_free(&l);
}

/* mg_limiter_usage gives what the three separate calls give, limited or not, while
 * the windows fill and drain (the ring wrapping around). */
static void test_limiter_usage_matches(void)
{
    const int limits[] = {0, 7, 50};
    for (size_t k = 0; k < sizeof(limits) / sizeof(limits[0]); k++) {
        mg_limiter_t l;
        mg_limiter_resv_t r;
        mg_limiter_init(&l, limits[k], 1000);
        uint64_t t = T0;
        int bad = 0;
        for (int i = 0; i < 3000; i++) {
            t += rng() % 100 == 0 ? 30000 : rng() % 300;
            if (rng() % 3) mg_limiter_reserve(&l, t, (int64_t)(rng() % 40), &r);
            mg_limiter_usage_t u;
            mg_limiter_usage(&l, t, &u);
            bad += u.rpm_used != mg_limiter_rpm_used(&l, t);
            bad += u.tpm_used != mg_limiter_tpm_used(&l, t);
            bad += u.headroom != mg_limiter_headroom(&l, t);
        }
        CHECK_EQ_INT(bad, 0);
        mg_limiter_free(&l);
    }
}

/* mg_limiter_usage drops the admissions that have left the window: against a plain log
 * of admissions, with reservations, usage reads and cancellations mixed at random, every
 * decision and every count stays exact. */
static void test_limiter_usage_drops_only_expired(void)
{
    enum { N = 6000 };
    static uint64_t adm[N];
    static mg_limiter_resv_t resv[N];
    const int limits[] = {1, 7, 50};
    for (size_t k = 0; k < sizeof(limits) / sizeof(limits[0]); k++) {
        mg_limiter_t l;
        mg_limiter_init(&l, limits[k], 0);
        int n = 0, bad = 0;
        uint64_t t = T0;
        for (int i = 0; i < N; i++) {
            uint32_t r = rng() % 100;
            t += r < 2 ? 30000 + rng() % 40000 : rng() % 400;
            int used = brute_used(adm, n, t);
            mg_limiter_usage_t u;
            if (r % 3 == 0) {
                mg_limiter_usage(&l, t, &u);
                bad += u.rpm_used != used;
            }
            bad += mg_limiter_rpm_used(&l, t) != used;
            if (r % 5 == 0 && n > 0) { /* take a recent reservation back */
                int j = n - 1 - (int)(rng() % (n < 3 ? (uint32_t)n : 3));
                mg_limiter_cancel(&l, &resv[j]);
                adm[j] = 0; /* never in a window again */
                continue;
            }
            int ok = mg_limiter_reserve(&l, t, 1, &resv[n]) == MG_LIMIT_OK;
            bad += ok != (used < limits[k]);
            if (ok) adm[n++] = t;
        }
        CHECK_EQ_INT(bad, 0);
        mg_limiter_free(&l);
    }
}

int main(void)
{
    MG_RUN(test_rpm_exact_limit_then_refusal);
    MG_RUN(test_rpm_next_ms);
    MG_RUN(test_rpm_unlimited);
    MG_RUN(test_rpm_emergency_cap);
    MG_RUN(test_rpm_set_limit_keeps_history);
    MG_RUN(test_rpm_undo);
    MG_RUN(test_rpm_time_never_goes_back);
    MG_RUN(test_rpm_memory_bounded);
    MG_RUN(test_rpm_brute_force_random);
    MG_RUN(test_tpm_reserve_and_settle);
    MG_RUN(test_tpm_window_expiry_precision);
    MG_RUN(test_tpm_next_ms);
    MG_RUN(test_tpm_brute_force_random);
    MG_RUN(test_limiter_all_or_nothing);
    MG_RUN(test_limiter_emergency);
    MG_RUN(test_limiter_unlimited_and_headroom);
    MG_RUN(test_limiter_usage_matches);
    MG_RUN(test_limiter_usage_drops_only_expired);
    return mg_test_summary();
}
