/* Unit tests for core/sched/task.c: the PRD 3.6 state machine. Every one of the 11 x 11
 * (from, to) pairs is tried on a real task driven into `from` by legal moves; the legal
 * ones must be accepted and recorded, the others refused with nothing changed. */
#include "mgtest.h"
#include "sched/task.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { N = MG_TASK_STATE_COUNT };

/* The arrows of the PRD 3.6 diagram, written out independently of task.c's table. */
static const struct {
    mg_task_state_t from, to;
} legal[] = {
    {MG_TASK_RECEIVED, MG_TASK_VALIDATING},   {MG_TASK_VALIDATING, MG_TASK_QUEUED},
    {MG_TASK_VALIDATING, MG_TASK_REJECTED},   {MG_TASK_QUEUED, MG_TASK_DISPATCHING},
    {MG_TASK_QUEUED, MG_TASK_TIMED_OUT},      {MG_TASK_QUEUED, MG_TASK_CANCELLED},
    {MG_TASK_DISPATCHING, MG_TASK_RUNNING},   {MG_TASK_DISPATCHING, MG_TASK_FAILED},
    {MG_TASK_DISPATCHING, MG_TASK_CANCELLED}, {MG_TASK_RUNNING, MG_TASK_STREAMING},
    {MG_TASK_RUNNING, MG_TASK_SUCCEEDED},     {MG_TASK_RUNNING, MG_TASK_FAILED},
    {MG_TASK_RUNNING, MG_TASK_TIMED_OUT},     {MG_TASK_RUNNING, MG_TASK_CANCELLED},
    {MG_TASK_STREAMING, MG_TASK_SUCCEEDED},   {MG_TASK_STREAMING, MG_TASK_FAILED},
    {MG_TASK_STREAMING, MG_TASK_TIMED_OUT},   {MG_TASK_STREAMING, MG_TASK_CANCELLED},
};

/* A legal path from RECEIVED to each state (terminated by -1). */
static const int paths[N][7] = {
    [MG_TASK_RECEIVED] = {-1},
    [MG_TASK_VALIDATING] = {MG_TASK_VALIDATING, -1},
    [MG_TASK_QUEUED] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, -1},
    [MG_TASK_DISPATCHING] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_DISPATCHING, -1},
    [MG_TASK_RUNNING] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_DISPATCHING, MG_TASK_RUNNING,
                         -1},
    [MG_TASK_STREAMING] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_DISPATCHING, MG_TASK_RUNNING,
                           MG_TASK_STREAMING, -1},
    [MG_TASK_SUCCEEDED] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_DISPATCHING, MG_TASK_RUNNING,
                           MG_TASK_SUCCEEDED, -1},
    [MG_TASK_FAILED] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_DISPATCHING, MG_TASK_FAILED,
                        -1},
    [MG_TASK_TIMED_OUT] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_TIMED_OUT, -1},
    [MG_TASK_CANCELLED] = {MG_TASK_VALIDATING, MG_TASK_QUEUED, MG_TASK_CANCELLED, -1},
    [MG_TASK_REJECTED] = {MG_TASK_VALIDATING, MG_TASK_REJECTED, -1},
};

typedef struct hook_log_s {
    int calls;
    mg_task_transition_t last;
    mg_task_state_t state_seen; /* the task's state inside the hook */
} hook_log_t;

static void hook(const mg_task_t *t, const mg_task_transition_t *tr, void *ud)
{
    hook_log_t *log = ud;
    log->calls++;
    log->last = *tr;
    log->state_seen = t->state;
}

static int expected_legal(int from, int to)
{
    for (size_t i = 0; i < sizeof(legal) / sizeof(legal[0]); i++)
        if ((int)legal[i].from == from && (int)legal[i].to == to) return 1;
    return 0;
}

/* Drive t from RECEIVED into state s; returns 0 if every step was accepted. */
static int reach(mg_task_t *t, int s)
{
    for (int i = 0; paths[s][i] >= 0; i++)
        if (mg_task_transition_at(t, (mg_task_state_t)paths[s][i], "setup", 1000 + i) != 0)
            return -1;
    return t->state == (mg_task_state_t)s ? 0 : -1;
}

static void test_names(void)
{
    for (int s = 0; s < N; s++) {
        mg_task_state_t back;
        CHECK_EQ_INT(mg_task_state_parse(mg_task_state_name((mg_task_state_t)s), &back), 0);
        CHECK_EQ_INT(back, s);
    }
    CHECK_STR(mg_task_state_name(MG_TASK_TIMED_OUT), "TIMED_OUT");
    CHECK_STR(mg_task_state_name(MG_TASK_DISPATCHING), "DISPATCHING");
    CHECK_STR(mg_task_state_name((mg_task_state_t)N), "UNKNOWN");
    CHECK_STR(mg_task_state_name((mg_task_state_t)-1), "UNKNOWN");
    mg_task_state_t out;
    CHECK_EQ_INT(mg_task_state_parse("queued", &out), -1);
    CHECK_EQ_INT(mg_task_state_parse(NULL, &out), -1);
}

static void test_terminal(void)
{
    for (int s = 0; s < N; s++) {
        int terminal = s == MG_TASK_SUCCEEDED || s == MG_TASK_FAILED || s == MG_TASK_TIMED_OUT ||
                       s == MG_TASK_CANCELLED || s == MG_TASK_REJECTED;
        CHECK_EQ_INT(mg_task_is_terminal((mg_task_state_t)s), terminal);
        if (!terminal) continue;
        for (int to = 0; to < N; to++)
            CHECK_EQ_INT(mg_task_can_transition((mg_task_state_t)s, (mg_task_state_t)to), 0);
    }
    CHECK_EQ_INT(mg_task_is_terminal((mg_task_state_t)N), 0);
}

/* The full 11 x 11 table, on live tasks. */
static void test_exhaustive_table(void)
{
    int accepted = 0, refused = 0;
    for (int from = 0; from < N; from++) {
        for (int to = 0; to < N; to++) {
            hook_log_t log = {0};
            mg_task_t t;
            mg_task_init(&t, 1000, hook, &log);
            CHECK_EQ_INT(reach(&t, from), 0);
            int calls = log.calls;
            unsigned n = t.transitions;
            mg_task_transition_t before = t.last;
            int want = expected_legal(from, to);
            CHECK_EQ_INT(mg_task_can_transition((mg_task_state_t)from, (mg_task_state_t)to), want);
            int rc = mg_task_transition_at(&t, (mg_task_state_t)to, "probe", 5000);
            if (want) {
                accepted++;
                CHECK_EQ_INT(rc, 0);
                CHECK_EQ_INT(t.state, to);
                CHECK_EQ_INT(t.transitions, n + 1);
                CHECK_EQ_INT(log.calls, calls + 1);
                CHECK_EQ_INT(log.last.from, from);
                CHECK_EQ_INT(log.last.to, to);
                CHECK_EQ_INT(log.last.at_ms, 5000);
                CHECK_STR(log.last.reason, "probe");
            } else {
                refused++;
                CHECK_EQ_INT(rc, -1);
                CHECK_EQ_INT(t.state, from);
                CHECK_EQ_INT(t.transitions, n);
                CHECK_EQ_INT(log.calls, calls);
                CHECK(memcmp(&t.last, &before, sizeof(before)) == 0);
            }
        }
    }
    CHECK_EQ_INT(accepted, 18);
    CHECK_EQ_INT(refused, N * N - 18);
}

static void test_out_of_range(void)
{
    mg_task_t t;
    mg_task_init(&t, 0, NULL, NULL);
    CHECK_EQ_INT(mg_task_transition_at(&t, (mg_task_state_t)N, "x", 1), -1);
    CHECK_EQ_INT(mg_task_transition_at(&t, (mg_task_state_t)-1, "x", 1), -1);
    CHECK_EQ_INT(mg_task_transition_at(NULL, MG_TASK_VALIDATING, "x", 1), -1);
    CHECK_EQ_INT(mg_task_can_transition((mg_task_state_t)N, MG_TASK_VALIDATING), 0);
    CHECK_EQ_INT(t.state, MG_TASK_RECEIVED);
}

/* A streaming request's whole life, as the hook records it. */
static void test_record_and_hook(void)
{
    hook_log_t log = {0};
    mg_task_t t;
    mg_task_init(&t, 42, hook, &log);
    CHECK_EQ_INT(t.state, MG_TASK_RECEIVED);
    CHECK_EQ_INT(t.created_ms, 42);
    CHECK_EQ_INT(t.last.from, MG_TASK_RECEIVED);
    CHECK_EQ_INT(t.last.to, MG_TASK_RECEIVED);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_VALIDATING, "received", 43), 0);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_QUEUED, "admitted", 44), 0);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_DISPATCHING, "resource_available", 50), 0);
    CHECK_EQ_INT(log.last.from, MG_TASK_QUEUED);
    CHECK_EQ_INT(log.last.to, MG_TASK_DISPATCHING);
    CHECK_STR(log.last.reason, "resource_available");
    CHECK_EQ_INT(log.last.at_ms, 50);
    CHECK_EQ_INT(log.state_seen, MG_TASK_DISPATCHING);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_RUNNING, "upstream_connected", 51), 0);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_STREAMING, "first_token", 60), 0);
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_SUCCEEDED, "done", 70), 0);
    CHECK_EQ_INT(log.calls, 6);
    CHECK_EQ_INT(t.transitions, 6);
    /* a late cancel (client went away as the stream finished) is refused */
    CHECK_EQ_INT(mg_task_transition_at(&t, MG_TASK_CANCELLED, "client_closed", 71), -1);
    CHECK_EQ_INT(t.state, MG_TASK_SUCCEEDED);
    CHECK_EQ_INT(log.calls, 6);
    /* a NULL reason is recorded as "" */
    mg_task_t u;
    mg_task_init(&u, 0, NULL, NULL);
    CHECK_EQ_INT(mg_task_transition_at(&u, MG_TASK_VALIDATING, NULL, 1), 0);
    CHECK_STR(u.last.reason, "");
}

/* The wall-clock variant stamps a plausible epoch time. */
static void test_wall_clock(void)
{
    mg_task_t t;
    mg_task_init(&t, 0, NULL, NULL);
    CHECK_EQ_INT(mg_task_transition(&t, MG_TASK_VALIDATING, "now"), 0);
    CHECK(t.last.at_ms > UINT64_C(1600000000000)); /* after 2020 */
    CHECK_EQ_INT(mg_task_transition(&t, MG_TASK_RUNNING, "skip"), -1);
}

int main(void)
{
    MG_RUN(test_names);
    MG_RUN(test_terminal);
    MG_RUN(test_exhaustive_table);
    MG_RUN(test_out_of_range);
    MG_RUN(test_record_and_hook);
    MG_RUN(test_wall_clock);
    return mg_test_summary();
}
