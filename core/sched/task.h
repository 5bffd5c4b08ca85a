/* task: the lifecycle of one request as a closed state machine (PRD 3.6).
 *
 *   RECEIVED -> VALIDATING -> QUEUED -> DISPATCHING -> RUNNING -> STREAMING
 *
 * and exactly one terminal state: SUCCEEDED, FAILED, TIMED_OUT, CANCELLED or REJECTED.
 * The state changes only through mg_task_transition(), which consults one fixed table
 * and refuses every move the diagram does not draw; an illegal transition can be
 * attempted, never performed. Each accepted move is recorded (from, to, reason, time)
 * in the task and handed to an optional hook, so the caller decides how to log it:
 * this module never logs and never allocates. */
#ifndef MG_TASK_H
#define MG_TASK_H

#include <stdint.h>

typedef enum mg_task_state_e {
    MG_TASK_RECEIVED = 0,
    MG_TASK_VALIDATING,
    MG_TASK_QUEUED,
    MG_TASK_DISPATCHING,
    MG_TASK_RUNNING,
    MG_TASK_STREAMING,
    MG_TASK_SUCCEEDED, /* terminal */
    MG_TASK_FAILED,    /* terminal */
    MG_TASK_TIMED_OUT, /* terminal */
    MG_TASK_CANCELLED, /* terminal */
    MG_TASK_REJECTED,  /* terminal */
    MG_TASK_STATE_COUNT
} mg_task_state_t;

/* One accepted state change, as PRD 3.6 wants it logged (the caller adds task id,
 * node and operator). */
typedef struct mg_task_transition_s {
    mg_task_state_t from;
    mg_task_state_t to;
    const char *reason; /* borrowed: must outlive the record (use string literals) */
    uint64_t at_ms;     /* milliseconds since the Unix epoch */
} mg_task_transition_t;

typedef struct mg_task_s mg_task_t;

/* Called after every accepted transition, with the task already in tr->to. It must not
 * call mg_task_transition on the same task. */
typedef void (*mg_task_hook_fn)(const mg_task_t *task, const mg_task_transition_t *tr, void *ud);

struct mg_task_s {
    mg_task_state_t state;     /* read-only: written only by mg_task_transition_at */
    mg_task_transition_t last; /* last accepted transition; from == to == RECEIVED at init */
    uint64_t created_ms;       /* the time given to mg_task_init */
    unsigned transitions;      /* accepted transitions so far */
    mg_task_hook_fn hook;      /* optional */
    void *hook_ud;             /* borrowed, passed to hook */
};

/* Start t in RECEIVED at now_ms. hook may be NULL; ud is passed to it untouched. */
void mg_task_init(mg_task_t *t, uint64_t now_ms, mg_task_hook_fn hook, void *ud);

/* Move t to `to`, stamping the record with the wall clock (CLOCK_REALTIME).
 * Returns 0, or -1 when the move is illegal (or t is NULL): then the state, the record
 * and the counter are unchanged and the hook is not called. reason is borrowed. */
int mg_task_transition(mg_task_t *t, mg_task_state_t to, const char *reason);

/* As mg_task_transition, with the caller's time (for tests and for callers that
 * already hold the loop's time). */
int mg_task_transition_at(mg_task_t *t, mg_task_state_t to, const char *reason, uint64_t now_ms);

/* 1 when the diagram has an arrow from -> to, else 0 (also for out-of-range values). */
int mg_task_can_transition(mg_task_state_t from, mg_task_state_t to);

/* 1 for SUCCEEDED, FAILED, TIMED_OUT, CANCELLED and REJECTED, else 0. */
int mg_task_is_terminal(mg_task_state_t s);

/* The state's upper-case name ("TIMED_OUT"), or "UNKNOWN" when out of range. Static. */
const char *mg_task_state_name(mg_task_state_t s);

/* Parse an upper-case state name. Returns 0 and sets *out, or -1. */
int mg_task_state_parse(const char *name, mg_task_state_t *out);

#endif
