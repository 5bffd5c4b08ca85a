/* task: the request lifecycle state machine; see task.h.
 *
 * The legal moves are one table of bit sets, one row per source state, transcribed from
 * the PRD 3.6 diagram; terminal states have empty rows, so nothing leaves them. Every
 * state change goes through mg_task_transition_at(), the only writer of t->state. */
#include "sched/task.h"

#include <stddef.h>
#include <string.h>
#include <time.h>

#define BIT(s) (1u << (s))

static const unsigned allowed[MG_TASK_STATE_COUNT] = {
    [MG_TASK_RECEIVED] = BIT(MG_TASK_VALIDATING),
    [MG_TASK_VALIDATING] = BIT(MG_TASK_QUEUED) | BIT(MG_TASK_REJECTED),
    [MG_TASK_QUEUED] = BIT(MG_TASK_DISPATCHING) | BIT(MG_TASK_TIMED_OUT) | BIT(MG_TASK_CANCELLED),
    [MG_TASK_DISPATCHING] = BIT(MG_TASK_RUNNING) | BIT(MG_TASK_FAILED) | BIT(MG_TASK_CANCELLED),
    [MG_TASK_RUNNING] = BIT(MG_TASK_STREAMING) | BIT(MG_TASK_SUCCEEDED) | BIT(MG_TASK_FAILED) |
                        BIT(MG_TASK_TIMED_OUT) | BIT(MG_TASK_CANCELLED),
    [MG_TASK_STREAMING] = BIT(MG_TASK_SUCCEEDED) | BIT(MG_TASK_FAILED) | BIT(MG_TASK_TIMED_OUT) |
                          BIT(MG_TASK_CANCELLED),
    /* SUCCEEDED, FAILED, TIMED_OUT, CANCELLED, REJECTED: terminal, no way out */
};

static const char *const state_names[MG_TASK_STATE_COUNT] = {
    "RECEIVED",  "VALIDATING", "QUEUED",    "DISPATCHING", "RUNNING",  "STREAMING",
    "SUCCEEDED", "FAILED",     "TIMED_OUT", "CANCELLED",   "REJECTED",
};

static int state_valid(mg_task_state_t s)
{
    return (unsigned)s < MG_TASK_STATE_COUNT;
}

void mg_task_init(mg_task_t *t, uint64_t now_ms, mg_task_hook_fn hook, void *ud)
{
    t->state = MG_TASK_RECEIVED;
    t->last.from = MG_TASK_RECEIVED;
    t->last.to = MG_TASK_RECEIVED;
    t->last.reason = "received";
    t->last.at_ms = now_ms;
    t->created_ms = now_ms;
    t->transitions = 0;
    t->hook = hook;
    t->hook_ud = ud;
}

int mg_task_can_transition(mg_task_state_t from, mg_task_state_t to)
{
    if (!state_valid(from) || !state_valid(to)) return 0;
    return (allowed[from] & BIT(to)) != 0;
}

int mg_task_is_terminal(mg_task_state_t s)
{
    return state_valid(s) && s >= MG_TASK_SUCCEEDED;
}

int mg_task_transition_at(mg_task_t *t, mg_task_state_t to, const char *reason, uint64_t now_ms)
{
    if (!t || !mg_task_can_transition(t->state, to)) return -1;
    t->last.from = t->state;
    t->last.to = to;
    t->last.reason = reason ? reason : "";
    t->last.at_ms = now_ms;
    t->state = to;
    t->transitions++;
    if (t->hook) t->hook(t, &t->last, t->hook_ud);
    return 0;
}

int mg_task_transition(mg_task_t *t, mg_task_state_t to, const char *reason)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    return mg_task_transition_at(t, to, reason, now_ms);
}

const char *mg_task_state_name(mg_task_state_t s)
{
    return state_valid(s) ? state_names[s] : "UNKNOWN";
}

int mg_task_state_parse(const char *name, mg_task_state_t *out)
{
    if (!name) return -1;
    for (int i = 0; i < MG_TASK_STATE_COUNT; i++) {
        if (strcmp(name, state_names[i]) == 0) {
            *out = (mg_task_state_t)i;
            return 0;
        }
    }
    return -1;
}
