/* Unit tests for core/obs/loopstat.c: on a real libuv loop, an iteration that keeps the loop busy
 * is recorded with its length, and the time the loop spends waiting is not counted as busy. */
#include "obs/loopstat.h"
#include "obs/metrics.h"
#include "mgtest.h"

#include <string.h>
#include <uv.h>

static void spin_ms(uint64_t ms)
{
    uint64_t until = uv_hrtime() + ms * 1000000;
    while (uv_hrtime() < until) {
    }
}

typedef struct {
    uv_timer_t timer;
    int fired;
    mg_loopstat_t *ls;
} ticker_t;

/* Fires three times, 20 ms apart (waits, not busy), and spins 8 ms on the second firing. */
static void on_tick(uv_timer_t *t)
{
    ticker_t *k = t->data;
    k->fired++;
    if (k->fired == 2) spin_ms(8);
    if (k->fired == 3) {
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, NULL);
        mg_loopstat_stop(k->ls);
    }
}

static void test_busy_iteration_recorded_waits_not(void)
{
    uv_loop_t loop;
    CHECK_EQ_INT(uv_loop_init(&loop), 0);
    mg_metrics_t m;
    memset(&m, 0, sizeof(m));
    mg_loopstat_t ls;
    CHECK_EQ_INT(mg_loopstat_start(&ls, &loop, &m), 0);
    ticker_t k = {.fired = 0, .ls = &ls};
    uv_timer_init(&loop, &k.timer);
    k.timer.data = &k;
    uv_timer_start(&k.timer, on_tick, 20, 20);
    uint64_t t0 = uv_hrtime();
    uv_run(&loop, UV_RUN_DEFAULT);
    uint64_t elapsed = uv_hrtime() - t0;
    CHECK_EQ_INT(k.fired, 3);
    CHECK(m.loop_busy_count >= 2);
    /* the spin is one busy stretch of at least 8 ms: recorded as the maximum, and outside
     * the buckets up to 5 ms */
    CHECK(m.loop_busy_max_ns >= 8000000);
    CHECK(m.loop_busy_max_ns < elapsed);
    CHECK(m.loop_busy_buckets[6] < m.loop_busy_count); /* le 0.005 */
    /* the 60 ms spent mostly waiting for the timer are not busy time */
    CHECK(m.loop_busy_sum >= 0.008);
    CHECK(m.loop_busy_sum * 1e9 < (double)elapsed - 30e6);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* Stopping a loopstat that never started is harmless (server shut-down after a failed start). */
static void test_stop_unstarted(void)
{
    mg_loopstat_t ls;
    memset(&ls, 0, sizeof(ls));
    mg_loopstat_stop(&ls);
    CHECK(ls.metrics == NULL);
}

int main(void)
{
    MG_RUN(test_busy_iteration_recorded_waits_not);
    MG_RUN(test_stop_unstarted);
    return mg_test_summary();
}
