/* sched_bench: cost of the scheduler's queue operations at 100, 10,000 and 100,000 queued
 * tasks, and how soon a P0 runs while 1,000 P3 tasks wait.
 *
 * Build and run (from the repository root):
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Icore bench/sched_bench.c \
 *       core/sched/sched.c -lm -o /tmp/sched_bench && /tmp/sched_bench
 *
 * Steady state at size n: the queue is filled with n tasks, then each round dispatches
 * the best task, releases its lease and queues it again (so the queue stays at n), and
 * separately cancels a random queued task and queues it again (remove by handle). Every
 * task has a queue deadline, so the deadline heap holds n entries too. Two shapes:
 *   few flows  - 4 models x P0..P3, no users: the flow heap is tiny, the deadline heap n;
 *   n flows    - every task has its own user: both heaps hold n items (the worst case).
 * "/log2n" divides the ns per round by log2(n); "moves" is the number of heap elements
 * moved per round (mg_sched_stats().heap_moves), a count that does not depend on the
 * machine: it stays within a small multiple of log2(n), while the ns also grow with cache
 * misses once the entries (~200 bytes each) outgrow the caches.
 * The benchmark calls clock_gettime; the scheduler itself never does. */
#include "sched/sched.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROUNDS = 200000, MODELS = 4 };

typedef struct bench_s {
    mg_sched_t *s;
    mg_sched_entry_t *e; /* owned array */
    mg_sched_gate_t *model[MODELS];
    mg_sched_gate_t **user; /* owned array; NULL in the few-flows shape */
    size_t n;
    uint64_t now;
    unsigned rng;
} bench_t;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static unsigned rnd(bench_t *b)
{
    b->rng = b->rng * 1103515245u + 12345u;
    return b->rng >> 8;
}

static mg_sched_config_t bench_config(size_t n)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c);
    c.max_queued = (uint32_t)n + 16;
    c.max_running = 1u << 30; /* measure the queue, not the slots */
    c.reserved_realtime_slots = 0;
    c.user_max_running = 0;
    c.level_threshold[0] = c.level_threshold[1] = c.level_threshold[2] = 1e9; /* no shedding */
    return c;
}

/* Queue entry i again with a fresh priority and deadline. */
static void requeue(bench_t *b, size_t i)
{
    mg_sched_entry_t *e = &b->e[i];
    mg_sched_entry_init(e, (mg_priority_t)(rnd(b) % 4));
    e->gate[MG_GATE_MODEL] = b->model[i % MODELS];
    if (b->user) e->gate[MG_GATE_USER] = b->user[i];
    e->deadline_ms = b->now + 60000 + rnd(b) % 60000;
    if (mg_sched_enqueue(b->s, e, b->now) != 0) {
        fprintf(stderr, "enqueue failed\n");
        exit(1);
    }
}

static void bench_setup(bench_t *b, size_t n, int many_flows)
{
    mg_sched_config_t c = bench_config(n);
    b->s = mg_sched_new(&c);
    b->e = calloc(n, sizeof(*b->e));
    b->user = many_flows ? calloc(n, sizeof(*b->user)) : NULL;
    b->n = n;
    b->now = 1;
    b->rng = 42;
    if (!b->s || !b->e || (many_flows && !b->user)) exit(1);
    char name[32];
    for (int m = 0; m < MODELS; m++) {
        snprintf(name, sizeof(name), "model-%d", m);
        b->model[m] = mg_sched_gate(b->s, MG_GATE_MODEL, name);
    }
    for (size_t i = 0; many_flows && i < n; i++) {
        snprintf(name, sizeof(name), "user-%zu", i);
        b->user[i] = mg_sched_gate(b->s, MG_GATE_USER, name);
    }
    for (size_t i = 0; i < n; i++) requeue(b, i);
}

static void bench_teardown(bench_t *b)
{
    mg_sched_free(b->s);
    free(b->e);
    free(b->user);
}

static uint64_t heap_moves(const bench_t *b)
{
    mg_sched_stats_t st;
    mg_sched_stats(b->s, &st);
    return st.heap_moves;
}

/* ns per round of dispatch + release + enqueue. */
static double run_dispatch_rounds(bench_t *b)
{
    double t0 = now_ns();
    for (int r = 0; r < ROUNDS; r++) {
        b->now++;
        mg_sched_entry_t *e = mg_sched_dispatch(b->s, b->now);
        if (!e) {
            fprintf(stderr, "nothing to dispatch\n");
            exit(1);
        }
        mg_sched_release(&e->lease);
        requeue(b, (size_t)(e - b->e));
    }
    return (now_ns() - t0) / ROUNDS;
}

/* ns per round of cancel (a random queued entry) + enqueue. */
static double run_cancel_rounds(bench_t *b)
{
    double t0 = now_ns();
    for (int r = 0; r < ROUNDS; r++) {
        b->now++;
        size_t i = rnd(b) % b->n;
        if (mg_sched_cancel(b->s, &b->e[i]) != 0) {
            fprintf(stderr, "cancel failed\n");
            exit(1);
        }
        requeue(b, i);
    }
    return (now_ns() - t0) / ROUNDS;
}

static void bench_queue_ops(void)
{
    static const size_t sizes[] = {100, 10000, 100000};
    printf("queue operations: dispatch round = dispatch + release + enqueue, cancel round = "
           "cancel + enqueue;\nns per round, that divided by log2(n), and heap element moves "
           "per round\n");
    printf("%-10s %7s | %9s %8s %6s | %9s %8s %6s\n", "shape", "queued", "dispatch", "/log2n",
           "moves", "cancel", "/log2n", "moves");
    for (int many = 0; many < 2; many++) {
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            bench_t b;
            bench_setup(&b, sizes[k], many);
            run_dispatch_rounds(&b); /* warm up */
            uint64_t m0 = heap_moves(&b);
            double d = run_dispatch_rounds(&b);
            uint64_t m1 = heap_moves(&b);
            double c = run_cancel_rounds(&b);
            uint64_t m2 = heap_moves(&b);
            double lg = log2((double)sizes[k]);
            printf("%-10s %7zu | %9.1f %8.2f %6.1f | %9.1f %8.2f %6.1f\n",
                   many ? "n flows" : "few flows", sizes[k], d, d / lg, (double)(m1 - m0) / ROUNDS,
                   c, c / lg, (double)(m2 - m1) / ROUNDS);
            bench_teardown(&b);
        }
    }
}

/* ---- P0 time to dispatch while 1,000 P3 wait ------------------------------------------ */

enum { P3_WAITING = 1000, P3_RUNNING = 6, P0_REPS = 2000 };

typedef struct p0_rig_s {
    mg_sched_t *s;
    mg_sched_entry_t p3[P3_WAITING + P3_RUNNING];
    mg_sched_entry_t blocker[2]; /* P0s holding the reserved slots (case b) */
    mg_sched_entry_t p0;
} p0_rig_t;

/* Default config (8 slots, 2 reserved for P0): 1006 P3 queued at t0, 6 of them running
 * (all the non-P0 slots), 1000 waiting; with slots_full, 2 P0s take the reserved slots. */
static void p0_setup(p0_rig_t *r, uint64_t t0, uint64_t t, int slots_full)
{
    mg_sched_config_t c;
    mg_sched_config_defaults(&c);
    c.max_queued = 2000;
    c.user_max_running = 0;
    r->s = mg_sched_new(&c);
    if (!r->s) exit(1);
    for (int i = 0; i < P3_WAITING + P3_RUNNING; i++) {
        mg_sched_entry_init(&r->p3[i], MG_PRIO_P3);
        mg_sched_enqueue(r->s, &r->p3[i], t0);
    }
    for (int i = 0; i < P3_RUNNING; i++) mg_sched_dispatch(r->s, t0);
    for (int i = 0; slots_full && i < 2; i++) {
        mg_sched_entry_init(&r->blocker[i], MG_PRIO_P0);
        mg_sched_enqueue(r->s, &r->blocker[i], t);
        mg_sched_dispatch(r->s, t);
    }
}

/* Queue a P0 at t and dispatch until something runs; with every slot busy a running P3
 * ends after the first (empty) dispatch. Returns the dispatch calls it took, or -1 when
 * the first task dispatched was not the P0. */
static int p0_round(p0_rig_t *r, uint64_t t)
{
    mg_sched_entry_init(&r->p0, MG_PRIO_P0);
    if (mg_sched_enqueue(r->s, &r->p0, t) != 0) return -1;
    for (int calls = 1;; calls++) {
        mg_sched_entry_t *d = mg_sched_dispatch(r->s, t);
        if (d) return d == &r->p0 ? calls : -1;
        mg_sched_release(&r->p3[0].lease); /* p3[0] was the first to run */
    }
}

static void p0_case(const char *title, uint64_t p3_age_ms, int slots_full)
{
    static p0_rig_t r;
    long calls_total = 0, next = 0;
    double ns_total = 0;
    mg_sched_stats_t st = {0};
    for (int k = 0; k < P0_REPS; k++) {
        p0_setup(&r, 1000, 1000 + p3_age_ms, slots_full);
        mg_sched_stats(r.s, &st);
        double t0 = now_ns();
        int calls = p0_round(&r, 1000 + p3_age_ms);
        ns_total += now_ns() - t0;
        if (calls > 0) {
            next++;
            calls_total += calls;
        }
        mg_sched_free(r.s);
    }
    printf("%-50s P0 first in %ld/%d, dispatch calls %.0f, %.0f ns (P3 queued %u, "
           "running %u)\n",
           title, next, P0_REPS, next ? (double)calls_total / next : 0.0, ns_total / P0_REPS,
           st.queued_by_prio[MG_PRIO_P3], st.running);
}

int main(void)
{
    bench_queue_ops();
    printf("\nP0 time to dispatch while 1,000 P3 wait (max_running 8, 2 reserved for P0)\n");
    p0_case("(a) 6 P3 run (non-P0 slots full), P0 arrives:", 0, 0);
    p0_case("(b) all 8 slots busy, P0 arrives, a P3 ends:", 0, 1);
    p0_case("(c) as (b), the P3s have waited 60 s (2 levels):", 60000, 1);
    return 0;
}
