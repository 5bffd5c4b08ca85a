/* Unit tests for core/sched/sched.c: priority order, weighted shares, aging, P4 idle-only,
 * reserved realtime slots, global/model/app/user caps and the head-of-line rule, leases
 * released exactly once on every path, queue deadlines, backpressure levels, memory
 * admission and its degrade steps (shorter output, smaller model), and a randomized run checked
 * step by step against a brute-force scheduler. */
#include "mgtest.h"
#include "sched/sched.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEC 1000u /* ms */

/* Defaults without per-user limit, so tests opt into the caps they exercise. */
static mg_sched_config_t base_config(void)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c);
    c.user_max_running = 0;
    return c;
}

static mg_sched_t *new_sched(const mg_sched_config_t *c)
{
    mg_sched_t *s = mg_sched_new(c);
    if (!s) fprintf(stderr, "mg_sched_new refused the config\n");
    return s;
}

/* Initialise e with priority p and gates, and queue it at now; returns the result. */
static int put(mg_sched_t *s, mg_sched_entry_t *e, mg_priority_t p, mg_sched_gate_t *model,
               mg_sched_gate_t *app, mg_sched_gate_t *user, uint64_t now)
{
    mg_sched_entry_init(e, p);
    e->gate[MG_GATE_MODEL] = model;
    e->gate[MG_GATE_APP] = app;
    e->gate[MG_GATE_USER] = user;
    return mg_sched_enqueue(s, e, now);
}

static uint32_t running(const mg_sched_t *s)
{
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    return st.running;
}

static uint32_t queued(const mg_sched_t *s)
{
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    return st.queued;
}

/* ---- small pieces ----------------------------------------------------------------- */

static void test_priority_parse(void)
{
    mg_priority_t p;
    CHECK_EQ_INT(mg_priority_from_header("urgent", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P0);
    CHECK_EQ_INT(mg_priority_from_header("High", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P1);
    CHECK_EQ_INT(mg_priority_from_header("normal", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P2);
    CHECK_EQ_INT(mg_priority_from_header("LOW", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P3);
    CHECK_EQ_INT(mg_priority_from_header("idle", &p), -1);
    CHECK_EQ_INT(mg_priority_from_header("", &p), -1);
    CHECK_EQ_INT(mg_priority_parse("P4", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P4);
    CHECK_EQ_INT(mg_priority_parse("p0", &p), 0);
    CHECK_EQ_INT(p, MG_PRIO_P0);
    CHECK_EQ_INT(mg_priority_parse("P5", &p), -1);
    CHECK_EQ_INT(mg_priority_parse("P12", &p), -1);
    CHECK_EQ_INT(mg_priority_parse(NULL, &p), -1);
    CHECK_EQ_INT(MG_PRIO_DEFAULT, MG_PRIO_P2);
    CHECK_STR(mg_priority_name(MG_PRIO_P3), "P3");
    CHECK_STR(mg_sched_strerror(MG_SCHED_EQUEUE_FULL), "QUEUE_FULL");
    CHECK_STR(mg_sched_strerror(MG_SCHED_EOVERLOAD), "RESOURCE_EXHAUSTED");
    CHECK_STR(mg_sched_strerror(MG_SCHED_ETOO_LARGE), "RESOURCE_EXHAUSTED");
}

static void test_config(void)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c);
    CHECK_EQ_INT(c.weight[0], 100);
    CHECK_EQ_INT(c.weight[1], 50);
    CHECK_EQ_INT(c.weight[2], 25);
    CHECK_EQ_INT(c.weight[3], 10);
    CHECK_EQ_INT(c.weight[4], 1);
    CHECK_EQ_INT(c.aging_ms, 30000);
    CHECK_EQ_INT(c.max_running, 8);
    CHECK_EQ_INT(c.max_queued, 500);
    CHECK_EQ_INT(c.reserved_realtime_slots, 2);
    CHECK_EQ_INT(c.user_max_running, 1);
    CHECK(c.level_threshold[0] == 0.70 && c.level_threshold[1] == 0.85);
    CHECK(c.level_threshold[2] == 0.95);
    mg_sched_t *s = mg_sched_new(&c);
    CHECK(s != NULL);
    mg_sched_free(s);
    mg_sched_config_t bad = c;
    bad.reserved_realtime_slots = 8;
    CHECK(mg_sched_new(&bad) == NULL);
    bad = c;
    bad.weight[2] = 0;
    CHECK(mg_sched_new(&bad) == NULL);
    bad = c;
    bad.level_threshold[1] = 0.5;
    CHECK(mg_sched_new(&bad) == NULL);
    bad = c;
    bad.max_queued = 0;
    CHECK(mg_sched_new(&bad) == NULL);
    CHECK(mg_sched_new(NULL) == NULL);
}

/* ---- ordering ---------------------------------------------------------------------- */

static void test_order_by_priority(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t e[4];
    for (int p = 3; p >= 0; p--) CHECK_EQ_INT(put(s, &e[p], p, NULL, NULL, NULL, 1000), 0);
    CHECK(mg_sched_peek(s) == &e[0]);
    CHECK_EQ_INT(mg_sched_queued(s), 4);
    for (int p = 0; p < 4; p++) {
        CHECK(mg_sched_dispatch(s, 1000) == &e[p]);
        CHECK_EQ_INT(mg_sched_queued(s), 3 - p);
    }
    CHECK(mg_sched_dispatch(s, 1000) == NULL);
    for (int p = 0; p < 4; p++) CHECK_EQ_INT(mg_sched_release(&e[p].lease), 0);
    CHECK_EQ_INT(mg_sched_queued(NULL), 0);
    mg_sched_free(s);
}

/* Count dispatches by priority over n dispatches from a queue holding `each` tasks of
 * every priority in prios (enqueued interleaved at the same time). */
static void shares(const mg_sched_config_t *c, const int *prios, int np, int each, int skip, int n,
                   int *count)
{
    mg_sched_t *s = new_sched(c);
    mg_sched_entry_t *e = calloc((size_t)(np * each), sizeof(*e));
    for (int i = 0; i < each; i++)
        for (int k = 0; k < np; k++)
            CHECK_EQ_INT(put(s, &e[i * np + k], prios[k], NULL, NULL, NULL, 5000), 0);
    memset(count, 0, sizeof(int) * MG_PRIO_COUNT);
    for (int i = 0; i < skip + n; i++) {
        mg_sched_entry_t *d = mg_sched_dispatch(s, 5000);
        CHECK(d != NULL);
        if (!d) break;
        if (i >= skip) count[d->priority]++;
        mg_sched_release(&d->lease);
    }
    mg_sched_free(s);
    free(e);
}

static int near(int got, int want, int tol)
{
    if (got < want - tol || got > want + tol) {
        fprintf(stderr, "  got %d, want %d +- %d\n", got, want, tol);
        return 0;
    }
    return 1;
}

/* Backlogged priorities share dispatches in proportion to their weights. */
static void test_proportional_shares(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 1;
    c.reserved_realtime_slots = 0;
    c.max_queued = 100000;
    int count[MG_PRIO_COUNT];

    /* pure WFQ (aging off): exact from the first dispatch */
    c.aging_ms = 0;
    const int p0p2[] = {MG_PRIO_P0, MG_PRIO_P2};
    shares(&c, p0p2, 2, 600, 0, 500, count);
    CHECK(near(count[MG_PRIO_P0], 400, 1) && near(count[MG_PRIO_P2], 100, 1));
    const int p1p3[] = {MG_PRIO_P1, MG_PRIO_P3};
    shares(&c, p1p3, 2, 600, 0, 600, count);
    CHECK(near(count[MG_PRIO_P1], 500, 1) && near(count[MG_PRIO_P3], 100, 1));
    const int p0p1p2p3[] = {MG_PRIO_P0, MG_PRIO_P1, MG_PRIO_P2, MG_PRIO_P3};
    shares(&c, p0p1p2p3, 4, 1000, 0, 1850, count); /* 100:50:25:10 of 185 */
    CHECK(near(count[0], 1000, 2) && near(count[1], 500, 2));
    CHECK(near(count[2], 250, 2) && near(count[3], 100, 2));

    /* with aging on (defaults): P2 starts two aging periods (60 s) behind P0 and a P0
     * costs 5 s of virtual time, so the first 12 dispatches are P0; then 4:1 */
    c.aging_ms = 30000;
    shares(&c, p0p2, 2, 600, 20, 500, count);
    CHECK(near(count[MG_PRIO_P0], 400, 2) && near(count[MG_PRIO_P2], 100, 2));
    shares(&c, p0p2, 2, 600, 0, 13, count);
    CHECK_EQ_INT(count[MG_PRIO_P0], 12);
    CHECK_EQ_INT(count[MG_PRIO_P2], 1);
}

/* A waiting task rises one level per aging period (30 s). */
static void test_aging(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_entry_t old, fresh, fresh2, p0;

    /* an old P3 loses to a P2 that arrives 29 s later ... */
    mg_sched_t *s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P3, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &fresh, MG_PRIO_P2, NULL, NULL, NULL, 29 * SEC), 0);
    CHECK(mg_sched_peek(s) == &fresh);
    mg_sched_free(s);

    /* ... and passes P2s that arrive after 31 s, but not yet a fresh P0 */
    s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P3, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &fresh, MG_PRIO_P2, NULL, NULL, NULL, 31 * SEC), 0);
    CHECK_EQ_INT(put(s, &fresh2, MG_PRIO_P2, NULL, NULL, NULL, 32 * SEC), 0);
    CHECK_EQ_INT(put(s, &p0, MG_PRIO_P0, NULL, NULL, NULL, 33 * SEC), 0);
    CHECK(mg_sched_dispatch(s, 33 * SEC) == &p0);
    CHECK(mg_sched_dispatch(s, 33 * SEC) == &old);
    CHECK(mg_sched_dispatch(s, 33 * SEC) == &fresh);
    CHECK(mg_sched_dispatch(s, 33 * SEC) == &fresh2);
    mg_sched_free(s);

    /* three levels take three periods: the P3 passes a P0 only after 90 s */
    s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P3, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &p0, MG_PRIO_P0, NULL, NULL, NULL, 89 * SEC), 0);
    CHECK(mg_sched_peek(s) == &p0);
    mg_sched_free(s);
    s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P3, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &p0, MG_PRIO_P0, NULL, NULL, NULL, 91 * SEC), 0);
    CHECK(mg_sched_peek(s) == &old);
    mg_sched_free(s);

    /* an old P1 passes a P0 after one period */
    s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &p0, MG_PRIO_P0, NULL, NULL, NULL, 29 * SEC), 0);
    CHECK(mg_sched_peek(s) == &p0);
    mg_sched_free(s);
    s = new_sched(&c);
    CHECK_EQ_INT(put(s, &old, MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &p0, MG_PRIO_P0, NULL, NULL, NULL, 31 * SEC), 0);
    CHECK(mg_sched_peek(s) == &old);
    mg_sched_free(s);
}

/* A P3 under a never-ending stream of P0s still runs. */
static void test_no_starvation(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 1;
    c.reserved_realtime_slots = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t low, p0[200];
    CHECK_EQ_INT(put(s, &low, MG_PRIO_P3, NULL, NULL, NULL, 0), 0);
    int low_at = -1;
    for (int i = 0; i < 200 && low_at < 0; i++) {
        uint64_t now = (uint64_t)i * 100; /* a P0 every 100 ms, one dispatch each */
        CHECK_EQ_INT(put(s, &p0[i], MG_PRIO_P0, NULL, NULL, NULL, now), 0);
        mg_sched_entry_t *d = mg_sched_dispatch(s, now);
        CHECK(d != NULL);
        if (d == &low) low_at = i;
        if (d) mg_sched_release(&d->lease);
    }
    CHECK(low_at > 0 && low_at < 30);
    mg_sched_free(s); /* detaches the P0s still queued */
}

/* P4 runs only when no P0-P3 task is queued, however old it is. */
static void test_p4_idle_only(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *busy = mg_sched_gate(s, MG_GATE_MODEL, "busy");
    mg_sched_gate_t *idle = mg_sched_gate(s, MG_GATE_MODEL, "idle");
    mg_sched_gate_limits(s, busy, 1, 0);
    mg_sched_entry_t p4, p3, run, wait;
    CHECK_EQ_INT(put(s, &p4, MG_PRIO_P4, idle, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &p3, MG_PRIO_P3, NULL, NULL, NULL, 1000 * SEC), 0);
    CHECK(mg_sched_dispatch(s, 1000 * SEC) == &p3);
    /* a P2 that waits for its busy model still keeps P4 out */
    CHECK_EQ_INT(put(s, &run, MG_PRIO_P2, busy, NULL, NULL, 1000 * SEC), 0);
    CHECK_EQ_INT(put(s, &wait, MG_PRIO_P2, busy, NULL, NULL, 1000 * SEC), 0);
    CHECK(mg_sched_dispatch(s, 1000 * SEC) == &run);
    CHECK(mg_sched_dispatch(s, 1000 * SEC) == NULL);
    CHECK(mg_sched_peek(s) == NULL);
    CHECK_EQ_INT(mg_sched_cancel(s, &wait), 0);
    CHECK(mg_sched_dispatch(s, 1000 * SEC) == &p4);
    mg_sched_release(&p3.lease);
    mg_sched_release(&run.lease);
    mg_sched_release(&p4.lease);
    CHECK_EQ_INT(running(s), 0);
    mg_sched_free(s);
}

/* ---- slots and gates ------------------------------------------------------------- */

/* Of 8 slots, 2 are for P0 only; P0 may use all 8. */
static void test_reserved_slots(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t low[10], rt[3];
    for (int i = 0; i < 10; i++)
        CHECK_EQ_INT(put(s, &low[i], i < 7 ? MG_PRIO_P1 : MG_PRIO_P4, NULL, NULL, NULL, 0), 0);
    /* P4 waits behind the P1s; non-P0 stop at 6 */
    for (int i = 0; i < 6; i++) {
        mg_sched_entry_t *d = mg_sched_dispatch(s, 0);
        CHECK(d != NULL && d->priority == MG_PRIO_P1);
    }
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(put(s, &rt[i], MG_PRIO_P0, NULL, NULL, NULL, 1), 0);
    CHECK(mg_sched_dispatch(s, 1) == &rt[0]);
    CHECK(mg_sched_dispatch(s, 1) == &rt[1]);
    CHECK(mg_sched_dispatch(s, 1) == NULL); /* 8 of 8 */
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.running, 8);
    CHECK_EQ_INT(st.running_realtime, 2);
    /* a freed general slot goes to the waiting P0 ... */
    mg_sched_entry_t *p1 = NULL;
    for (int i = 0; i < 10; i++)
        if (low[i].lease.held) p1 = &low[i];
    CHECK_EQ_INT(mg_sched_release(&p1->lease), 0);
    CHECK(mg_sched_dispatch(s, 2) == &rt[2]);
    CHECK(mg_sched_dispatch(s, 2) == NULL);
    /* ... a freed slot goes to the last P1 while fewer than 6 non-P0 run ... */
    CHECK_EQ_INT(mg_sched_release(&rt[0].lease), 0);
    mg_sched_entry_t *d = mg_sched_dispatch(s, 3); /* 5 non-P0 running: one may go */
    CHECK(d == &low[6]);
    CHECK(mg_sched_dispatch(s, 3) == NULL);
    /* ... but not beyond: 6 non-P0 + 1 P0 run, the free slot is P0's; the P4s wait */
    CHECK_EQ_INT(mg_sched_release(&rt[1].lease), 0);
    CHECK(mg_sched_dispatch(s, 3) == NULL);
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.running, 7);
    CHECK_EQ_INT(st.queued_by_prio[MG_PRIO_P4], 3);
    for (int i = 0; i < 10; i++) mg_sched_release(&low[i].lease);
    for (int i = 0; i < 3; i++) mg_sched_release(&rt[i].lease);
    CHECK_EQ_INT(running(s), 0);
    mg_sched_free(s);
}

static void test_global_cap(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 3;
    c.reserved_realtime_slots = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t e[5];
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(put(s, &e[i], MG_PRIO_P0, NULL, NULL, NULL, 0), 0);
    for (int i = 0; i < 3; i++) CHECK(mg_sched_dispatch(s, 0) == &e[i]);
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    CHECK_EQ_INT(mg_sched_release(&e[1].lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e[3]);
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    for (int i = 0; i < 5; i++) mg_sched_release(&e[i].lease);
    CHECK(mg_sched_dispatch(s, 0) == &e[4]);
    mg_sched_release(&e[4].lease);
    mg_sched_free(s);
}

/* A model at max_concurrency does not hold back another model's task (head-of-line). */
static void test_model_cap_head_of_line(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *a = mg_sched_gate(s, MG_GATE_MODEL, "general-chat");
    mg_sched_gate_t *b = mg_sched_gate(s, MG_GATE_MODEL, "fast-chat");
    CHECK(a != NULL && b != NULL && a != b);
    CHECK(mg_sched_gate(s, MG_GATE_MODEL, "general-chat") == a);
    CHECK(mg_sched_gate(s, MG_GATE_APP, "general-chat") != a);
    mg_sched_gate_limits(s, a, 1, 0);
    mg_sched_gate_limits(s, b, 1, 0);
    mg_sched_entry_t a1, a2, a3, b1, b2;
    CHECK_EQ_INT(put(s, &a1, MG_PRIO_P0, a, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &a2, MG_PRIO_P0, a, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &a3, MG_PRIO_P1, a, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &b1, MG_PRIO_P3, b, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &b2, MG_PRIO_P3, b, NULL, NULL, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &a1);
    CHECK(mg_sched_peek(s) == &b1); /* a2, a3 wait for model a; b1 goes */
    CHECK(mg_sched_dispatch(s, 0) == &b1);
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    CHECK_EQ_INT(mg_sched_gate_running(a), 1);
    CHECK_EQ_INT(mg_sched_gate_queued(a), 2);
    CHECK_EQ_INT(mg_sched_release(&a1.lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &a2); /* best of a, not a3 */
    CHECK_EQ_INT(mg_sched_release(&b1.lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &b2);
    /* raising the cap lets a3 go without any release */
    mg_sched_gate_limits(s, a, 2, 0);
    CHECK(mg_sched_dispatch(s, 0) == &a3);
    CHECK_EQ_INT(mg_sched_gate_running(a), 2);
    mg_sched_release(&a2.lease);
    mg_sched_release(&a3.lease);
    mg_sched_release(&b2.lease);
    CHECK_EQ_INT(mg_sched_gate_running(a), 0);
    CHECK_EQ_INT(mg_sched_gate_running(b), 0);
    mg_sched_free(s);
}

/* Application caps: running and queued. */
static void test_app_caps(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *office = mg_sched_gate(s, MG_GATE_APP, "office_assistant");
    mg_sched_gate_t *doc = mg_sched_gate(s, MG_GATE_APP, "doc_analyzer");
    mg_sched_gate_limits(s, office, 2, 3);
    mg_sched_gate_limits(s, doc, 1, 30);
    mg_sched_entry_t o[4], d1;
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(put(s, &o[i], MG_PRIO_P2, NULL, office, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &o[3], MG_PRIO_P2, NULL, office, NULL, 0), MG_SCHED_EQUEUE_FULL);
    CHECK_EQ_INT(o[3].queued_, 0);
    CHECK_EQ_INT(put(s, &d1, MG_PRIO_P3, NULL, doc, NULL, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &o[0]);
    CHECK(mg_sched_dispatch(s, 0) == &o[1]);
    CHECK(mg_sched_dispatch(s, 0) == &d1); /* office at 2 running: the P3 of doc goes */
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    /* dispatching freed queue room: office may queue again */
    CHECK_EQ_INT(put(s, &o[3], MG_PRIO_P2, NULL, office, NULL, 0), 0);
    CHECK_EQ_INT(mg_sched_release(&o[0].lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &o[2]);
    CHECK_EQ_INT(mg_sched_gate_running(office), 2);
    CHECK_EQ_INT(mg_sched_gate_queued(office), 1);
    CHECK_EQ_INT(mg_sched_cancel(s, &o[3]), 0);
    CHECK_EQ_INT(mg_sched_gate_queued(office), 0);
    mg_sched_release(&o[1].lease);
    mg_sched_release(&o[2].lease);
    mg_sched_release(&d1.lease);
    CHECK_EQ_INT(running(s), 0);
    mg_sched_free(s);
}

/* User caps: default max_running 1 from the config, queued cap set per user. */
static void test_user_caps(void)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c); /* user_max_running = 1 */
    c.user_max_queued = 2;
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *u1 = mg_sched_gate(s, MG_GATE_USER, "alice");
    mg_sched_gate_t *u2 = mg_sched_gate(s, MG_GATE_USER, "bob");
    mg_sched_entry_t a[3], b1;
    CHECK_EQ_INT(put(s, &a[0], MG_PRIO_P1, NULL, NULL, u1, 0), 0);
    CHECK_EQ_INT(put(s, &a[1], MG_PRIO_P1, NULL, NULL, u1, 0), 0);
    CHECK_EQ_INT(put(s, &a[2], MG_PRIO_P1, NULL, NULL, u1, 0), MG_SCHED_EQUEUE_FULL);
    CHECK_EQ_INT(put(s, &b1, MG_PRIO_P3, NULL, NULL, u2, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &a[0]);
    CHECK(mg_sched_dispatch(s, 0) == &b1); /* alice has her one running task */
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    CHECK_EQ_INT(mg_sched_release(&a[0].lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &a[1]);
    mg_sched_release(&a[1].lease);
    mg_sched_release(&b1.lease);
    mg_sched_free(s);
}

static void test_queue_full(void)
{
    mg_sched_config_t c = base_config();
    c.max_queued = 4;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t e[6];
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(put(s, &e[i], MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    /* full: QUEUE_FULL for every priority (not the level-3 rejection) */
    CHECK_EQ_INT(put(s, &e[4], MG_PRIO_P0, NULL, NULL, NULL, 0), MG_SCHED_EQUEUE_FULL);
    CHECK_EQ_INT(put(s, &e[4], MG_PRIO_P3, NULL, NULL, NULL, 0), MG_SCHED_EQUEUE_FULL);
    CHECK_EQ_INT(queued(s), 4);
    CHECK(mg_sched_dispatch(s, 0) == &e[0]);
    CHECK_EQ_INT(put(s, &e[4], MG_PRIO_P0, NULL, NULL, NULL, 0), 0);
    /* an entry cannot be queued twice, nor while it holds a lease */
    CHECK_EQ_INT(mg_sched_enqueue(s, &e[4], 0), MG_SCHED_ESTATE);
    CHECK_EQ_INT(mg_sched_enqueue(s, &e[0], 0), MG_SCHED_ESTATE);
    e[5].priority = (mg_priority_t)7;
    CHECK_EQ_INT(mg_sched_enqueue(s, &e[5], 0), MG_SCHED_EINVAL);
    mg_sched_release(&e[0].lease);
    mg_sched_free(s);
}

/* ---- leases: exactly once on every path --------------------------------------------- */

static void test_lease_dispatch_finish(void)
{
    mg_sched_config_t c = base_config();
    c.vram_bytes = 10000;
    c.safety_margin_ratio = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_gate_t *app = mg_sched_gate(s, MG_GATE_APP, "a");
    mg_sched_gate_t *user = mg_sched_gate(s, MG_GATE_USER, "u");
    mg_sched_model_memory(s, m, 1000, 2);
    mg_sched_entry_t e;
    mg_sched_entry_init(&e, MG_PRIO_P2);
    e.gate[MG_GATE_MODEL] = m;
    e.gate[MG_GATE_APP] = app;
    e.gate[MG_GATE_USER] = user;
    e.input_tokens = 100;
    e.max_output_tokens = 150;
    CHECK_EQ_INT(mg_sched_enqueue(s, &e, 0), 0);
    CHECK_EQ_INT(e.lease.held, 0);
    CHECK(mg_sched_dispatch(s, 0) == &e);
    CHECK_EQ_INT(e.lease.held, 1);
    CHECK_EQ_INT(e.lease.mem_bytes, 500);
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.running, 1);
    CHECK_EQ_INT(st.queued, 0);
    CHECK_EQ_INT(st.mem_reserved_bytes, 500);
    CHECK_EQ_INT(
        mg_sched_gate_running(m) + mg_sched_gate_running(app) + mg_sched_gate_running(user), 3);
    CHECK_EQ_INT(mg_sched_release(&e.lease), 0);
    CHECK_EQ_INT(mg_sched_release(&e.lease), 1); /* second call: no-op */
    CHECK_EQ_INT(mg_sched_release(&e.lease), 1);
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.mem_reserved_bytes, 0);
    CHECK_EQ_INT(mg_sched_gate_running(m), 0);
    CHECK_EQ_INT(mg_sched_gate_running(app), 0);
    CHECK_EQ_INT(mg_sched_gate_running(user), 0);
    CHECK_EQ_INT(mg_sched_release(NULL), 1);
    /* the entry can be queued again (a retry) once its lease is back */
    CHECK_EQ_INT(mg_sched_enqueue(s, &e, 1), 0);
    CHECK(mg_sched_dispatch(s, 1) == &e);
    CHECK_EQ_INT(mg_sched_release(&e.lease), 0);
    mg_sched_free(s);
}

static void test_lease_cancel_while_queued(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_gate_t *user = mg_sched_gate(s, MG_GATE_USER, "u");
    mg_sched_entry_t e1, e2;
    CHECK_EQ_INT(put(s, &e1, MG_PRIO_P2, m, NULL, user, 0), 0);
    CHECK_EQ_INT(put(s, &e2, MG_PRIO_P2, m, NULL, user, 0), 0);
    CHECK_EQ_INT(mg_sched_cancel(s, &e1), 0); /* the head of its flow */
    CHECK_EQ_INT(mg_sched_cancel(s, &e1), MG_SCHED_ESTATE);
    CHECK_EQ_INT(e1.lease.held, 0);
    CHECK_EQ_INT(mg_sched_release(&e1.lease), 1); /* nothing was held */
    CHECK_EQ_INT(mg_sched_gate_queued(m), 1);
    CHECK_EQ_INT(mg_sched_gate_queued(user), 1);
    CHECK_EQ_INT(running(s), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e2);
    CHECK_EQ_INT(mg_sched_cancel(s, &e2), MG_SCHED_ESTATE); /* running: not the queue's */
    CHECK_EQ_INT(mg_sched_release(&e2.lease), 0);
    CHECK_EQ_INT(mg_sched_release(&e2.lease), 1);
    CHECK_EQ_INT(mg_sched_gate_running(m), 0);
    CHECK_EQ_INT(queued(s), 0);
    mg_sched_free(s);
}

static void test_lease_timeout_while_queued(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_gate_limits(s, m, 1, 0);
    mg_sched_entry_t busy, late;
    CHECK_EQ_INT(put(s, &busy, MG_PRIO_P2, m, NULL, NULL, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &busy);
    mg_sched_entry_init(&late, MG_PRIO_P2);
    late.gate[MG_GATE_MODEL] = m;
    late.deadline_ms = 5000;
    CHECK_EQ_INT(mg_sched_enqueue(s, &late, 0), 0);
    CHECK(mg_sched_dispatch(s, 100) == NULL); /* the model's one slot is taken */
    CHECK(mg_sched_expire(s, 4999) == NULL);
    CHECK(mg_sched_expire(s, 5000) == &late);
    CHECK_EQ_INT(late.lease.held, 0);
    CHECK_EQ_INT(mg_sched_release(&late.lease), 1);
    CHECK_EQ_INT(mg_sched_gate_queued(m), 0);
    CHECK_EQ_INT(mg_sched_gate_running(m), 1);
    CHECK_EQ_INT(mg_sched_release(&busy.lease), 0);
    CHECK(mg_sched_dispatch(s, 5001) == NULL); /* the expired task is gone */
    CHECK_EQ_INT(running(s), 0);
    mg_sched_free(s);
}

/* ---- deadlines --------------------------------------------------------------------- */

static void test_expire(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 1;
    c.reserved_realtime_slots = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t e[5];
    const uint64_t deadlines[5] = {500, 300, 0, 400, 300};
    for (int i = 0; i < 5; i++) {
        mg_sched_entry_init(&e[i], MG_PRIO_P2);
        e[i].deadline_ms = deadlines[i];
        CHECK_EQ_INT(mg_sched_enqueue(s, &e[i], 10), 0);
    }
    uint64_t next = 0;
    CHECK_EQ_INT(mg_sched_next_deadline(s, &next), 0);
    CHECK_EQ_INT(next, 300);
    CHECK(mg_sched_expire(s, 299) == NULL);
    /* equal deadlines leave in enqueue order; the flow's head and middle both go */
    CHECK(mg_sched_expire(s, 450) == &e[1]);
    CHECK(mg_sched_expire(s, 450) == &e[4]);
    CHECK(mg_sched_expire(s, 450) == &e[3]);
    CHECK(mg_sched_expire(s, 450) == NULL);
    CHECK_EQ_INT(mg_sched_next_deadline(s, &next), 0);
    CHECK_EQ_INT(next, 500);
    CHECK_EQ_INT(queued(s), 2);
    CHECK(mg_sched_dispatch(s, 460) == &e[0]); /* leaves the deadline heap too */
    CHECK_EQ_INT(mg_sched_next_deadline(s, &next), MG_SCHED_ESTATE);
    CHECK(mg_sched_expire(s, 100000) == NULL); /* e[2] has no deadline */
    CHECK_EQ_INT(mg_sched_release(&e[0].lease), 0);
    CHECK(mg_sched_dispatch(s, 100000) == &e[2]);
    mg_sched_release(&e[2].lease);
    mg_sched_free(s);
}

/* ---- backpressure ------------------------------------------------------------------ */

static void test_levels(void)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.0), 0);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.69), 0);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.70), 1);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.84), 1);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.85), 2);
    CHECK_EQ_INT(mg_sched_level_for(&c, 0.95), 3);
    CHECK_EQ_INT(mg_sched_level_for(&c, 1.5), 3);
    /* which priorities each level admits */
    static const int admits[4][MG_PRIO_COUNT] = {
        {1, 1, 1, 1, 1}, {1, 1, 1, 1, 0}, {1, 1, 1, 0, 0}, {1, 1, 0, 0, 0}};
    for (int l = 0; l < 4; l++)
        for (int p = 0; p < MG_PRIO_COUNT; p++)
            CHECK_EQ_INT(mg_sched_level_admits(l, (mg_priority_t)p), admits[l][p]);
}

/* Busy slots alone are not overload: every slot running with nothing waiting is
 * level 0, and new work of every priority queues instead of being shed. */
static void test_backpressure_running(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 10;
    c.reserved_realtime_slots = 0;
    c.max_queued = 100;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t r[10], x[5];
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(put(s, &r[i], MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    for (int i = 0; i < 10; i++) CHECK(mg_sched_dispatch(s, 0) == &r[i]);
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.running, 10);
    CHECK_EQ_INT(mg_sched_level(s), 0);
    for (int p = 0; p < MG_PRIO_COUNT; p++)
        CHECK_EQ_INT(put(s, &x[p], (mg_priority_t)p, NULL, NULL, NULL, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == NULL); /* they wait for a slot */
    for (int p = 0; p < MG_PRIO_COUNT; p++) CHECK_EQ_INT(mg_sched_cancel(s, &x[p]), 0);
    for (int i = 0; i < 10; i++) mg_sched_release(&r[i].lease);
    mg_sched_free(s);
}

/* Queue fill and reserved memory count as load too. */
static void test_backpressure_queue_and_memory(void)
{
    mg_sched_config_t c = base_config();
    c.max_queued = 20;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t q[20], x;
    for (int i = 0; i < 14; i++) CHECK_EQ_INT(put(s, &q[i], MG_PRIO_P0, NULL, NULL, NULL, 0), 0);
    /* nothing dispatched: 14/20 queued = 0.70 */
    CHECK_EQ_INT(mg_sched_level(s), 1);
    CHECK_EQ_INT(put(s, &x, MG_PRIO_P4, NULL, NULL, NULL, 0), MG_SCHED_EOVERLOAD);
    for (int i = 14; i < 19; i++) CHECK_EQ_INT(put(s, &q[i], MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(mg_sched_level(s), 3); /* 19/20 */
    CHECK_EQ_INT(put(s, &x, MG_PRIO_P2, NULL, NULL, NULL, 0), MG_SCHED_EOVERLOAD);
    mg_sched_free(s);

    c = base_config();
    c.vram_bytes = 1000;
    c.safety_margin_ratio = 0;
    s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_model_memory(s, m, 0, 1);
    mg_sched_entry_init(&x, MG_PRIO_P1);
    x.gate[MG_GATE_MODEL] = m;
    x.input_tokens = 860;
    CHECK_EQ_INT(mg_sched_enqueue(s, &x, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &x);
    CHECK_EQ_INT(mg_sched_level(s), 2); /* 860/1000 reserved */
    CHECK_EQ_INT(put(s, &q[0], MG_PRIO_P3, NULL, NULL, NULL, 0), MG_SCHED_EOVERLOAD);
    mg_sched_release(&x.lease);
    CHECK_EQ_INT(mg_sched_level(s), 0);
    mg_sched_free(s);
}

/* ---- memory ----------------------------------------------------------------------- */

static void test_mem_budget(void)
{
    mg_sched_mem_t m;
    mg_sched_mem_init(&m, 1000, 0.10); /* 900 usable */
    CHECK_EQ_INT(mg_sched_mem_budget(&m), 900);
    CHECK_EQ_INT(mg_sched_mem_load(&m, 300), 0);
    CHECK_EQ_INT(mg_sched_mem_budget(&m), 600);
    CHECK_EQ_INT(mg_sched_mem_reserve(&m, 500), 0);
    CHECK_EQ_INT(mg_sched_mem_free(&m), 100);
    CHECK_EQ_INT(mg_sched_mem_reserve(&m, 101), MG_SCHED_ETOO_LARGE);
    CHECK_EQ_INT(m.reserved_bytes, 500);
    CHECK_EQ_INT(mg_sched_mem_reserve(&m, 100), 0);
    CHECK(mg_sched_mem_fraction(&m) == 1.0);
    CHECK_EQ_INT(mg_sched_mem_load(&m, 1), MG_SCHED_ETOO_LARGE); /* would squeeze the KV */
    mg_sched_mem_release(&m, 600);
    CHECK_EQ_INT(mg_sched_mem_free(&m), 600);
    CHECK_EQ_INT(mg_sched_mem_load(&m, 601), MG_SCHED_ETOO_LARGE); /* weights > usable */
    CHECK_EQ_INT(mg_sched_mem_load(&m, 600), 0);
    CHECK_EQ_INT(mg_sched_mem_budget(&m), 0);
    CHECK(mg_sched_mem_fraction(&m) == 1.0);
    mg_sched_mem_unload(&m, 900);
    CHECK_EQ_INT(mg_sched_mem_budget(&m), 900);
    mg_sched_mem_release(&m, 5); /* clamps */
    CHECK_EQ_INT(m.reserved_bytes, 0);
    mg_sched_mem_init(&m, 0, 0.08); /* admission off */
    CHECK(mg_sched_mem_free(&m) == UINT64_MAX);
    CHECK_EQ_INT(mg_sched_mem_reserve(&m, UINT64_C(1) << 40), 0);
    CHECK(mg_sched_mem_fraction(&m) == 0.0);
}

/* Dispatch reserves kv_per_token * (input + max_output); a task that does not fit waits
 * without holding back one that does. */
static void test_memory_admission(void)
{
    mg_sched_config_t c = base_config();
    c.vram_bytes = 1000;
    c.safety_margin_ratio = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_gate_t *u[3];
    u[0] = mg_sched_gate(s, MG_GATE_USER, "u0");
    u[1] = mg_sched_gate(s, MG_GATE_USER, "u1");
    u[2] = mg_sched_gate(s, MG_GATE_USER, "u2");
    mg_sched_model_memory(s, m, 200, 1);
    CHECK_EQ_INT(mg_sched_model_load(s, m, 1), 0); /* budget 800 */
    CHECK_EQ_INT(mg_sched_model_load(s, m, 1), 0); /* idempotent */
    CHECK_EQ_INT(mg_sched_model_load(s, u[0], 1), MG_SCHED_EINVAL);
    mg_sched_entry_t a, b, small, huge;
    const struct {
        mg_sched_entry_t *e;
        uint32_t in, out;
        int user;
    } t[] = {{&a, 300, 200, 0}, {&b, 300, 100, 1}, {&small, 50, 50, 2}};
    for (int i = 0; i < 3; i++) {
        mg_sched_entry_init(t[i].e, MG_PRIO_P2);
        t[i].e->gate[MG_GATE_MODEL] = m;
        t[i].e->gate[MG_GATE_USER] = u[t[i].user];
        t[i].e->input_tokens = t[i].in;
        t[i].e->max_output_tokens = t[i].out;
        CHECK_EQ_INT(mg_sched_enqueue(s, t[i].e, 0), 0);
    }
    mg_sched_entry_init(&huge, MG_PRIO_P0);
    huge.gate[MG_GATE_MODEL] = m;
    huge.input_tokens = 801;
    CHECK_EQ_INT(mg_sched_enqueue(s, &huge, 0), MG_SCHED_ETOO_LARGE);
    CHECK(mg_sched_dispatch(s, 0) == &a);     /* 500 of 800 */
    CHECK(mg_sched_dispatch(s, 0) == &small); /* b (400) does not fit; small (100) does */
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.mem_reserved_bytes, 600);
    CHECK_EQ_INT(st.mem_budget_bytes, 800);
    /* loading another model's weights would squeeze running reservations */
    mg_sched_gate_t *m2 = mg_sched_gate(s, MG_GATE_MODEL, "m2");
    mg_sched_model_memory(s, m2, 300, 1);
    CHECK_EQ_INT(mg_sched_model_load(s, m2, 1), MG_SCHED_ETOO_LARGE);
    CHECK_EQ_INT(mg_sched_release(&small.lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == NULL); /* 300 free < 400 */
    CHECK_EQ_INT(mg_sched_release(&a.lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &b);
    CHECK_EQ_INT(mg_sched_release(&a.lease), 1);
    CHECK_EQ_INT(mg_sched_release(&b.lease), 0);
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.mem_reserved_bytes, 0);
    /* unloading frees budget */
    CHECK_EQ_INT(mg_sched_model_load(s, m, 0), 0);
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.mem_budget_bytes, 1000);
    mg_sched_free(s);
}

/* Cancelling a memory-blocked head lets the next task of that flow be considered. */
static void test_memory_head_cancel(void)
{
    mg_sched_config_t c = base_config();
    c.vram_bytes = 1000;
    c.safety_margin_ratio = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_model_memory(s, m, 0, 1);
    mg_sched_entry_t hog, big, fits;
    mg_sched_entry_t *es[3] = {&hog, &big, &fits};
    const uint32_t sizes[3] = {600, 500, 100};
    for (int i = 0; i < 3; i++) {
        mg_sched_entry_init(es[i], MG_PRIO_P2);
        es[i]->gate[MG_GATE_MODEL] = m;
        es[i]->input_tokens = sizes[i];
        CHECK_EQ_INT(mg_sched_enqueue(s, es[i], 0), 0);
    }
    CHECK(mg_sched_dispatch(s, 0) == &hog);
    CHECK(mg_sched_dispatch(s, 0) == NULL); /* big (500) blocks its flow (FIFO) */
    CHECK_EQ_INT(mg_sched_cancel(s, &big), 0);
    CHECK(mg_sched_dispatch(s, 0) == &fits);
    mg_sched_release(&fits.lease);
    mg_sched_release(&hog.lease);
    mg_sched_free(s);
}

/* The fit computation: the largest output ceiling whose reservation fits, never below
 * the floor; floor 0 turns shortening off. */
static void test_fit_output(void)
{
    uint32_t out = 12345;
    /* as asked: 2 x (100 + 300) = 800 <= 1000 */
    CHECK_EQ_INT(mg_sched_fit_output(1000, 2, 100, 300, 256, &out), 0);
    CHECK_EQ_INT(out, 300);
    /* shorter: 500 tokens fit, 100 are input, so 400 (2 x 500 = 1000: exactly full) */
    CHECK_EQ_INT(mg_sched_fit_output(1000, 2, 100, 1000, 256, &out), 0);
    CHECK_EQ_INT(out, 400);
    CHECK_EQ_INT(mg_sched_fit_output(999, 2, 100, 1000, 256, &out),
                 0); /* 499 tokens: rounds down */
    CHECK_EQ_INT(out, 399);
    /* the floor: 256 fit exactly, 255 do not */
    CHECK_EQ_INT(mg_sched_fit_output(1000, 2, 244, 1000, 256, &out), 0);
    CHECK_EQ_INT(out, 256);
    out = 7;
    CHECK_EQ_INT(mg_sched_fit_output(1000, 2, 245, 1000, 256, &out), MG_SCHED_ETOO_LARGE);
    CHECK_EQ_INT(out, 7); /* untouched on refusal */
    /* floor 0: shortening off */
    CHECK_EQ_INT(mg_sched_fit_output(1000, 2, 100, 1000, 0, &out), MG_SCHED_ETOO_LARGE);
    /* asked at or below the floor is never shortened */
    CHECK_EQ_INT(mg_sched_fit_output(100, 1, 0, 200, 200, &out), MG_SCHED_ETOO_LARGE);
    CHECK_EQ_INT(mg_sched_fit_output(100, 1, 0, 150, 200, &out), MG_SCHED_ETOO_LARGE);
    /* no ceiling (0): only the input is reserved, and there is nothing to shorten */
    CHECK_EQ_INT(mg_sched_fit_output(100, 1, 100, 0, 1, &out), 0);
    CHECK_EQ_INT(out, 0);
    CHECK_EQ_INT(mg_sched_fit_output(100, 1, 101, 0, 1, &out), MG_SCHED_ETOO_LARGE);
    /* no KV figure: fits anything; admission off (UINT64_MAX free): fits as asked */
    CHECK_EQ_INT(mg_sched_fit_output(0, 0, 100, 4000, 256, &out), 0);
    CHECK_EQ_INT(out, 4000);
    CHECK_EQ_INT(mg_sched_fit_output(UINT64_MAX, 8, 1000, 4000, 256, &out), 0);
    CHECK_EQ_INT(out, 4000);
    /* big figures do not overflow */
    CHECK_EQ_INT(
        mg_sched_fit_output(UINT64_C(1) << 40, UINT64_C(1) << 32, UINT32_MAX, UINT32_MAX, 1, &out),
        MG_SCHED_ETOO_LARGE);
}

/* Dispatch degrades before it waits: shorter output, then the smaller model (as asked,
 * then shorter), then the queue; enqueue refuses only what no step can ever fit. */
static void test_memory_degrade(void)
{
    mg_sched_config_t c = base_config();
    c.vram_bytes = 1000;
    c.safety_margin_ratio = 0;
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *m = mg_sched_gate(s, MG_GATE_MODEL, "m");
    mg_sched_gate_t *sm = mg_sched_gate(s, MG_GATE_MODEL, "m-small");
    mg_sched_model_memory(s, m, 0, 2);
    mg_sched_model_memory(s, sm, 0, 1);
    mg_sched_entry_t hog, e;
    mg_sched_entry_init(&hog, MG_PRIO_P2);
    hog.gate[MG_GATE_MODEL] = m;
    hog.input_tokens = 100;
    hog.max_output_tokens = 200;
    CHECK_EQ_INT(mg_sched_enqueue(s, &hog, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &hog); /* 600 reserved, 400 free */
    CHECK_EQ_INT(hog.degraded, 0);
    const struct {
        uint32_t in, out, min;
        int smaller;
        unsigned degraded;
        uint32_t got;
        uint64_t bytes;
    } t[] = {
        {50, 100, 0, 0, 0, 100, 300},                   /* fits as asked */
        {50, 300, 100, 0, MG_SCHED_SHORTER, 150, 400},  /* 200 tokens fit on m */
        {100, 300, 150, 1, MG_SCHED_SMALLER, 300, 400}, /* m: 100 < 150; sm as asked */
        {100, 400, 150, 1, MG_SCHED_SMALLER | MG_SCHED_SHORTER, 300, 400}, /* sm, shorter */
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        mg_sched_entry_init(&e, MG_PRIO_P2);
        e.gate[MG_GATE_MODEL] = m;
        e.input_tokens = t[i].in;
        e.max_output_tokens = t[i].out;
        e.min_output_tokens = t[i].min;
        e.smaller = t[i].smaller ? sm : NULL;
        CHECK_EQ_INT(mg_sched_enqueue(s, &e, 0), 0);
        CHECK(mg_sched_dispatch(s, 0) == &e);
        CHECK_EQ_INT(e.degraded, t[i].degraded);
        CHECK_EQ_INT(e.max_output_tokens, t[i].got);
        CHECK_EQ_INT(e.lease.mem_bytes, t[i].bytes);
        CHECK_EQ_INT(mg_sched_release(&e.lease), 0);
    }
    /* nothing fits now, not even the smaller model at the floor: it waits ... */
    mg_sched_entry_init(&e, MG_PRIO_P2);
    e.gate[MG_GATE_MODEL] = m;
    e.input_tokens = 300;
    e.max_output_tokens = 300;
    e.min_output_tokens = 150;
    e.smaller = sm;
    CHECK_EQ_INT(mg_sched_enqueue(s, &e, 0), 0);
    CHECK(mg_sched_peek(s) == NULL);
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    CHECK_EQ_INT(e.max_output_tokens, 300); /* peek and a failed dispatch change nothing */
    /* ... until memory frees: the first step that fits then wins (m, shorter: 500 - 300) */
    CHECK_EQ_INT(mg_sched_release(&hog.lease), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e);
    CHECK_EQ_INT(e.degraded, MG_SCHED_SHORTER);
    CHECK_EQ_INT(e.max_output_tokens, 200);
    CHECK_EQ_INT(mg_sched_release(&e.lease), 0);
    /* enqueue refuses only what no step can ever fit */
    mg_sched_entry_init(&e, MG_PRIO_P2);
    e.gate[MG_GATE_MODEL] = m;
    e.input_tokens = 600; /* m holds 500 tokens at most */
    e.max_output_tokens = 10;
    e.min_output_tokens = 1;
    CHECK_EQ_INT(mg_sched_enqueue(s, &e, 0), MG_SCHED_ETOO_LARGE);
    e.smaller = sm; /* sm holds 1000 */
    CHECK_EQ_INT(mg_sched_enqueue(s, &e, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e);
    CHECK_EQ_INT(e.degraded, MG_SCHED_SMALLER);
    CHECK_EQ_INT(mg_sched_release(&e.lease), 0);
    mg_sched_stats_t st;
    mg_sched_stats(s, &st);
    CHECK_EQ_INT(st.mem_reserved_bytes, 0);
    mg_sched_free(s);
}

/* Reload: new slot counts apply at once, queued tasks keep their places. */
static void test_reconfigure(void)
{
    mg_sched_config_t c = base_config();
    c.max_running = 2;
    c.reserved_realtime_slots = 1;
    mg_sched_t *s = new_sched(&c);
    mg_sched_entry_t e[3];
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(put(s, &e[i], MG_PRIO_P2, NULL, NULL, NULL, 0), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e[0]);
    CHECK(mg_sched_dispatch(s, 0) == NULL);
    c.max_running = 4;
    c.reserved_realtime_slots = 1;
    CHECK_EQ_INT(mg_sched_reconfigure(s, &c), 0);
    CHECK(mg_sched_dispatch(s, 0) == &e[1]);
    CHECK(mg_sched_dispatch(s, 0) == &e[2]);
    c.reserved_realtime_slots = 4;
    CHECK_EQ_INT(mg_sched_reconfigure(s, &c), MG_SCHED_EINVAL);
    for (int i = 0; i < 3; i++) mg_sched_release(&e[i].lease);
    mg_sched_free(s);
}

/* Freeing the scheduler detaches entries still queued. */
static void test_free_detaches(void)
{
    mg_sched_config_t c = base_config();
    mg_sched_t *s = new_sched(&c);
    mg_sched_gate_t *u = mg_sched_gate(s, MG_GATE_USER, "u");
    mg_sched_entry_t e[3];
    CHECK_EQ_INT(put(s, &e[0], MG_PRIO_P1, NULL, NULL, u, 0), 0);
    CHECK_EQ_INT(put(s, &e[1], MG_PRIO_P1, NULL, NULL, NULL, 0), 0);
    CHECK_EQ_INT(put(s, &e[2], MG_PRIO_P4, NULL, NULL, u, 0), 0);
    mg_sched_free(s);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(e[i].queued_, 0);
}

/* ---- randomized run against a brute-force scheduler ------------------------------- */

enum { R_ENTRIES = 400, R_MODELS = 3, R_APPS = 2, R_USERS = 5, R_STEPS = 60000 };

typedef struct rig_s {
    mg_sched_t *s;
    mg_sched_config_t cfg;
    mg_sched_gate_t *model[R_MODELS], *app[R_APPS], *user[R_USERS];
    mg_sched_entry_t e[R_ENTRIES];
    uint64_t now;
    unsigned rng;
    long dispatched, cancelled, expired, released, refused;
} rig_t;

static unsigned rnd(rig_t *r, unsigned n)
{
    r->rng = r->rng * 1103515245u + 12345u;
    return (r->rng >> 8) % n;
}

/* Index of g in gates[0..n) plus 1, or 0 for NULL (and for a gate not in the list). */
static int gate_index(mg_sched_gate_t *const *gates, int n, const mg_sched_gate_t *g)
{
    for (int k = 0; k < n; k++)
        if (gates[k] == g) return k + 1;
    return 0;
}

/* The brute force's own notion of a flow: priority and the three gates, as one number. */
static int group_of(const rig_t *r, const mg_sched_entry_t *e)
{
    int m = gate_index(r->model, R_MODELS, e->gate[MG_GATE_MODEL]);
    int a = gate_index(r->app, R_APPS, e->gate[MG_GATE_APP]);
    int u = gate_index(r->user, R_USERS, e->gate[MG_GATE_USER]);
    return (((int)e->priority * (R_MODELS + 1) + m) * (R_APPS + 1) + a) * (R_USERS + 1) + u;
}

enum { R_GROUPS = MG_PRIO_COUNT * (R_MODELS + 1) * (R_APPS + 1) * (R_USERS + 1) };

/* Leases held, per gate, recounted from the entries. */
typedef struct held_s {
    uint32_t run, nonrt, model[R_MODELS + 1], app[R_APPS + 1], user[R_USERS + 1];
    uint64_t mem;
} held_t;

static void count_held(const rig_t *r, held_t *h)
{
    memset(h, 0, sizeof(*h));
    for (int i = 0; i < R_ENTRIES; i++) {
        const mg_sched_lease_t *l = &r->e[i].lease;
        if (!l->held) continue;
        h->run++;
        h->nonrt += !l->realtime;
        h->mem += l->mem_bytes;
        h->model[gate_index(r->model, R_MODELS, l->gate[MG_GATE_MODEL])]++;
        h->app[gate_index(r->app, R_APPS, l->gate[MG_GATE_APP])]++;
        h->user[gate_index(r->user, R_USERS, l->gate[MG_GATE_USER])]++;
    }
}

static int may_run(const rig_t *r, const held_t *h, const mg_sched_entry_t *e,
                   const uint32_t *caps_m, const uint32_t *caps_a)
{
    int m = gate_index(r->model, R_MODELS, e->gate[MG_GATE_MODEL]);
    int a = gate_index(r->app, R_APPS, e->gate[MG_GATE_APP]);
    int u = gate_index(r->user, R_USERS, e->gate[MG_GATE_USER]);
    if (e->priority != MG_PRIO_P0 &&
        h->nonrt >= r->cfg.max_running - r->cfg.reserved_realtime_slots)
        return 0;
    if (m && caps_m[m - 1] && h->model[m] >= caps_m[m - 1]) return 0;
    if (a && caps_a[a - 1] && h->app[a] >= caps_a[a - 1]) return 0;
    if (u && h->user[u] >= 1) return 0; /* users.default_max_running_tasks */
    return h->mem + e->mem_bytes_ <= r->cfg.vram_bytes;
}

/* What dispatch must return: the smallest (key, seq) among the heads of the groups (the
 * oldest queued entry of each) that may run now. */
static mg_sched_entry_t *brute_next(rig_t *r, const uint32_t *caps_m, const uint32_t *caps_a)
{
    static mg_sched_entry_t *head[R_GROUPS];
    memset(head, 0, sizeof(head));
    held_t h;
    count_held(r, &h);
    if (h.run >= r->cfg.max_running) return NULL;
    int main_queued = 0;
    for (int i = 0; i < R_ENTRIES; i++) {
        mg_sched_entry_t *e = &r->e[i];
        if (!e->queued_) continue;
        main_queued += e->priority != MG_PRIO_P4;
        int g = group_of(r, e);
        if (!head[g] || e->seq_ < head[g]->seq_) head[g] = e;
    }
    mg_sched_entry_t *best = NULL;
    for (int g = 0; g < R_GROUPS; g++) {
        mg_sched_entry_t *e = head[g];
        if (!e || (e->priority == MG_PRIO_P4 && main_queued)) continue;
        if (!may_run(r, &h, e, caps_m, caps_a)) continue;
        if (!best || e->key_ < best->key_ || (e->key_ == best->key_ && e->seq_ < best->seq_))
            best = e;
    }
    return best;
}

static void rig_enqueue(rig_t *r)
{
    mg_sched_entry_t *e = &r->e[rnd(r, R_ENTRIES)];
    if (e->queued_ || e->lease.held) return;
    mg_sched_entry_init(e, (mg_priority_t)rnd(r, MG_PRIO_COUNT));
    if (rnd(r, 4)) e->gate[MG_GATE_MODEL] = r->model[rnd(r, R_MODELS)];
    if (rnd(r, 3)) e->gate[MG_GATE_APP] = r->app[rnd(r, R_APPS)];
    if (rnd(r, 2)) e->gate[MG_GATE_USER] = r->user[rnd(r, R_USERS)];
    e->input_tokens = rnd(r, 300);
    e->max_output_tokens = rnd(r, 300);
    if (rnd(r, 2)) e->deadline_ms = r->now + 1 + rnd(r, 20000);
    int rc = mg_sched_enqueue(r->s, e, r->now);
    if (rc != 0) r->refused++;
    CHECK(rc == 0 || rc == MG_SCHED_EQUEUE_FULL || rc == MG_SCHED_EOVERLOAD ||
          rc == MG_SCHED_ETOO_LARGE);
}

static void show(const char *what, const mg_sched_entry_t *x)
{
    if (!x) {
        fprintf(stderr, "  %s: none\n", what);
        return;
    }
    fprintf(stderr, "  %s: %s key %llu seq %llu model %p app %p user %p mem %llu\n", what,
            mg_priority_name(x->priority), (unsigned long long)x->key_, (unsigned long long)x->seq_,
            (void *)x->gate[0], (void *)x->gate[1], (void *)x->gate[2],
            (unsigned long long)x->mem_bytes_);
}

static void rig_dispatch(rig_t *r, const uint32_t *caps_m, const uint32_t *caps_a)
{
    mg_sched_entry_t *want = brute_next(r, caps_m, caps_a);
    mg_sched_entry_t *peek = mg_sched_peek(r->s);
    mg_sched_entry_t *got = mg_sched_dispatch(r->s, r->now);
    CHECK(peek == want);
    CHECK(got == want);
    if (got != want) {
        show("want", want);
        show("got", got);
    }
    if (got) r->dispatched++;
}

/* Mostly a lease that is held (the next one from a random place), sometimes any. */
static void rig_release(rig_t *r)
{
    unsigned at = rnd(r, R_ENTRIES);
    mg_sched_entry_t *e = &r->e[at];
    if (rnd(r, 8))
        for (unsigned k = 0; k < R_ENTRIES && !e->lease.held; k++) e = &r->e[(at + k) % R_ENTRIES];
    int held = e->lease.held;
    int rc = mg_sched_release(&e->lease);
    CHECK_EQ_INT(rc, held ? 0 : 1);
    if (held) {
        r->released++;
        CHECK_EQ_INT(mg_sched_release(&e->lease), 1);
    }
}

static void rig_cancel(rig_t *r)
{
    mg_sched_entry_t *e = &r->e[rnd(r, R_ENTRIES)];
    int was = e->queued_;
    CHECK_EQ_INT(mg_sched_cancel(r->s, e), was ? 0 : MG_SCHED_ESTATE);
    if (was) r->cancelled++;
}

static void rig_expire(rig_t *r)
{
    mg_sched_entry_t *e;
    uint64_t last = 0;
    while ((e = mg_sched_expire(r->s, r->now)) != NULL) {
        CHECK(e->deadline_ms <= r->now && e->deadline_ms >= last);
        CHECK_EQ_INT(e->queued_, 0);
        CHECK_EQ_INT(e->lease.held, 0);
        last = e->deadline_ms;
        r->expired++;
    }
    uint64_t next;
    if (mg_sched_next_deadline(r->s, &next) == 0) CHECK(next > r->now);
}

/* Counts kept by the scheduler agree with the entries. */
static void rig_check_counts(rig_t *r)
{
    uint32_t q = 0, run = 0;
    for (int i = 0; i < R_ENTRIES; i++) {
        q += r->e[i].queued_ != 0;
        run += r->e[i].lease.held != 0;
    }
    mg_sched_stats_t st;
    mg_sched_stats(r->s, &st);
    CHECK_EQ_INT(st.queued, q);
    CHECK_EQ_INT(st.running, run);
    held_t h;
    count_held(r, &h);
    for (int k = 0; k < R_MODELS; k++)
        CHECK_EQ_INT(mg_sched_gate_running(r->model[k]), h.model[k + 1]);
    for (int k = 0; k < R_APPS; k++) CHECK_EQ_INT(mg_sched_gate_running(r->app[k]), h.app[k + 1]);
    for (int k = 0; k < R_USERS; k++)
        CHECK_EQ_INT(mg_sched_gate_running(r->user[k]), h.user[k + 1]);
    CHECK_EQ_INT(st.mem_reserved_bytes, h.mem);
}

static void run_rig(unsigned seed, uint64_t aging_ms)
{
    static rig_t r;
    memset(&r, 0, sizeof(r));
    r.rng = seed;
    mg_sched_config_defaults(&r.cfg);
    r.cfg.aging_ms = aging_ms;
    r.cfg.max_queued = 300;
    r.cfg.vram_bytes = 3000;
    r.cfg.safety_margin_ratio = 0;
    r.s = new_sched(&r.cfg);
    const uint32_t caps_m[R_MODELS] = {2, 3, 0}, caps_a[R_APPS] = {3, 0};
    char name[16];
    for (int k = 0; k < R_MODELS; k++) {
        snprintf(name, sizeof(name), "m%d", k);
        r.model[k] = mg_sched_gate(r.s, MG_GATE_MODEL, name);
        mg_sched_gate_limits(r.s, r.model[k], caps_m[k], 0);
        mg_sched_model_memory(r.s, r.model[k], 0, (uint64_t)k + 1);
    }
    for (int k = 0; k < R_APPS; k++) {
        snprintf(name, sizeof(name), "a%d", k);
        r.app[k] = mg_sched_gate(r.s, MG_GATE_APP, name);
        mg_sched_gate_limits(r.s, r.app[k], caps_a[k], 0);
    }
    for (int k = 0; k < R_USERS; k++) {
        snprintf(name, sizeof(name), "u%d", k);
        r.user[k] = mg_sched_gate(r.s, MG_GATE_USER, name); /* max_running 1 */
    }
    int failures_before = mg_test_failures_;
    for (int step = 0; step < R_STEPS && mg_test_failures_ == failures_before; step++) {
        r.now += rnd(&r, 50);
        unsigned op = rnd(&r, 100);
        if (op < 40) rig_enqueue(&r);
        else if (op < 65) rig_dispatch(&r, caps_m, caps_a);
        else if (op < 87) rig_release(&r);
        else if (op < 95) rig_cancel(&r);
        else rig_expire(&r);
        if (step % 97 == 0) rig_check_counts(&r);
    }
    rig_check_counts(&r);
    fprintf(stderr,
            "  seed %u: %ld dispatched, %ld released, %ld cancelled, %ld expired, "
            "%ld refused\n",
            seed, r.dispatched, r.released, r.cancelled, r.expired, r.refused);
    CHECK(r.dispatched > 1000 && r.cancelled > 100 && r.expired > 100);
    for (int i = 0; i < R_ENTRIES; i++) mg_sched_release(&r.e[i].lease);
    CHECK_EQ_INT(running(r.s), 0);
    mg_sched_free(r.s);
}

static void test_randomized_against_brute_force(void)
{
    run_rig(1, 30000);
    run_rig(7, 30000);
    run_rig(12345, 0);
    run_rig(99, 500);
}

int main(void)
{
    MG_RUN(test_priority_parse);
    MG_RUN(test_config);
    MG_RUN(test_order_by_priority);
    MG_RUN(test_proportional_shares);
    MG_RUN(test_aging);
    MG_RUN(test_no_starvation);
    MG_RUN(test_p4_idle_only);
    MG_RUN(test_reserved_slots);
    MG_RUN(test_global_cap);
    MG_RUN(test_model_cap_head_of_line);
    MG_RUN(test_app_caps);
    MG_RUN(test_user_caps);
    MG_RUN(test_queue_full);
    MG_RUN(test_lease_dispatch_finish);
    MG_RUN(test_lease_cancel_while_queued);
    MG_RUN(test_lease_timeout_while_queued);
    MG_RUN(test_expire);
    MG_RUN(test_levels);
    MG_RUN(test_backpressure_running);
    MG_RUN(test_backpressure_queue_and_memory);
    MG_RUN(test_mem_budget);
    MG_RUN(test_memory_admission);
    MG_RUN(test_memory_head_cancel);
    MG_RUN(test_fit_output);
    MG_RUN(test_memory_degrade);
    MG_RUN(test_reconfigure);
    MG_RUN(test_free_detaches);
    MG_RUN(test_randomized_against_brute_force);
    return mg_test_summary();
}
