/* limiter_bench: what the provider-state checks cost per request.
 *
 * Build and run by hand (not part of the CMake build):
 *
 *   gcc -O2 -Icore bench/limiter_bench.c core/route/limiter.c core/route/health.c -o
 * /tmp/limiter_bench /tmp/limiter_bench
 *
 * For 1, 10, 100 and 1000 providers it mimics the router's reservation step: scan
 * the providers in order, skip those whose breaker refuses or that are cooling,
 * and take the first whose limiter reserves one request and its tokens
 * (mg_limiter_reserve, RPM + TPM, all or nothing).
 *
 *   best   the first provider has room: one check per request
 *   worst  every provider but the last is at its RPM limit: N checks per request
 *   fields building every candidate's router fields (rpm_used, tpm_used, headroom,
 *          cooldown, breaker state, health snapshot), per provider
 *
 * Simulated time spreads a run over 59 s, so the TPM buckets roll while the
 * saturated providers stay saturated; the provider with room has an RPM limit
 * above the run's request count (its ring is written on every admission).
 * Figures are ns per request (per provider for "fields"), best of 3 runs. */
#include "route/health.h"
#include "route/limiter.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define T0 1000000u

typedef struct bench_provider_s {
    mg_limiter_t lim;
    mg_cooldown_t cd;
    mg_breaker_t br;
    mg_health_t health;
} bench_provider_t;

static volatile uint64_t sink; /* keeps the optimiser honest */

/* Request i of iters happens at this simulated time: the run spans 59 s. */
static uint64_t sim_time(long i, long iters)
{
    return T0 + (uint64_t)((double)i * 59000.0 / (double)iters);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* n providers; with `saturate`, all but the last are at their RPM limit.
 * The others allow room_rpm requests per minute. */
static bench_provider_t *make_providers(int n, int saturate, int room_rpm)
{
    bench_provider_t *p = calloc((size_t)n, sizeof(*p));
    if (!p) exit(1);
    for (int i = 0; i < n; i++) {
        int last = i == n - 1;
        int rpm = saturate && !last ? 10 : room_rpm;
        if (mg_limiter_init(&p[i].lim, rpm, 1000000000000ll) != 0) exit(1);
        mg_cooldown_init(&p[i].cd);
        mg_breaker_init(&p[i].br, NULL);
        mg_health_init(&p[i].health, NULL);
        for (int k = 0; k < 150; k++)
            mg_health_record(&p[i].health, T0 - 1000 + (uint64_t)k, k % 7 != 0, 300, 120);
        if (saturate && !last) {
            mg_limiter_resv_t r;
            for (int k = 0; k < 10; k++) mg_limiter_reserve(&p[i].lim, T0, 500, &r);
        }
    }
    return p;
}

static void free_providers(bench_provider_t *p, int n)
{
    for (int i = 0; i < n; i++) mg_limiter_free(&p[i].lim);
    free(p);
}

/* The router's step: the first provider that is allowed and reserves. */
static int reserve_first(bench_provider_t *p, int n, uint64_t now)
{
    mg_limiter_resv_t r;
    for (int i = 0; i < n; i++) {
        if (!mg_breaker_would_allow(&p[i].br, now) || mg_cooldown_cooling(&p[i].cd, now)) continue;
        if (mg_limiter_reserve(&p[i].lim, now, 500, &r) == MG_LIMIT_OK) return i;
    }
    return -1;
}

static double run_reserve(int n, int saturate, long iters)
{
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        bench_provider_t *p = make_providers(n, saturate, (int)iters + 1);
        uint64_t acc = 0;
        double t0 = now_ns();
        for (long i = 0; i < iters; i++) acc += (uint64_t)reserve_first(p, n, sim_time(i, iters));
        double dt = (now_ns() - t0) / (double)iters;
        sink += acc;
        if (dt < best) best = dt;
        free_providers(p, n);
    }
    return best;
}

/* Everything a candidate table needs, for one provider. */
static uint64_t candidate_fields(bench_provider_t *p, uint64_t now)
{
    mg_health_snapshot_t s;
    uint64_t acc = (uint64_t)mg_limiter_rpm_used(&p->lim, now);
    acc += (uint64_t)mg_limiter_tpm_used(&p->lim, now);
    acc += (uint64_t)(mg_limiter_headroom(&p->lim, now) * 1000);
    acc += mg_cooldown_remaining_ms(&p->cd, now) + (uint64_t)mg_cooldown_observing(&p->cd, now);
    acc += (uint64_t)mg_breaker_state(&p->br, now);
    mg_health_snapshot(&p->health, now, &s);
    acc += (uint64_t)s.avail_samples + (uint64_t)s.ttft_samples + (uint64_t)(s.success_rate * 100);
    return acc;
}

static double run_fields(int n, long iters)
{
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        bench_provider_t *p = make_providers(n, 1, 1000);
        uint64_t acc = 0;
        double t0 = now_ns();
        for (long i = 0; i < iters; i++)
            for (int k = 0; k < n; k++) acc += candidate_fields(&p[k], sim_time(i, iters));
        double dt = (now_ns() - t0) / (double)iters / (double)n;
        sink += acc;
        if (dt < best) best = dt;
        free_providers(p, n);
    }
    return best;
}

int main(void)
{
    int sizes[] = {1, 10, 100, 1000};
    printf("%-10s %14s %14s %14s %16s\n", "providers", "best ns/req", "worst ns/req",
           "worst ns/check", "fields ns/cand");
    for (int k = 0; k < 4; k++) {
        int n = sizes[k];
        long iters = 4000000L / n;
        if (iters < 20000) iters = 20000;
        double best = run_reserve(n, 0, iters);
        double worst = run_reserve(n, 1, iters);
        double fields = run_fields(n, iters / 10 > 2000 ? iters / 10 : 2000);
        printf("%-10d %14.1f %14.1f %14.1f %16.1f\n", n, best, worst, worst / n, fields);
    }
    return (int)(sink & 0);
}
