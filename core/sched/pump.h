/* pump: runs the scheduler on the loop: dispatches queued entries when a slot is free and
 * expires those whose queue deadline passed, calling each entry back through its own
 * on_dispatch / on_expire (sched.h). It knows nothing of what an entry is.
 *
 * Lifecycle as libuv's: mg_pump_init, then mg_pump_run / mg_pump_kick while serving,
 * mg_pump_stop when the process closes (no entry is called back after it), mg_pump_close
 * to release the timer. Loop thread only. */
#ifndef MG_PUMP_H
#define MG_PUMP_H

#include <uv.h>

#include "sched/sched.h"

typedef struct mg_pump_s {
    uv_loop_t *loop;
    mg_sched_t *sched; /* borrowed */
    uv_timer_t timer;  /* queue deadlines, and the pass after a release */
    int stopped;
} mg_pump_t;

/* 0, or a negative libuv error (then nothing was started). */
int mg_pump_init(mg_pump_t *p, uv_loop_t *loop, mg_sched_t *sched);

/* Now: expire the entries past their deadline, then dispatch what fits, then arm the timer
 * for the next deadline. The entries' callbacks run from here (they may enqueue, release
 * and free entries). */
void mg_pump_run(mg_pump_t *p);

/* A slot was released: when an entry waits, run on the next loop turn (never under the
 * caller, which may be deep in a callback chain). */
void mg_pump_kick(mg_pump_t *p);

/* No more dispatching or expiring from now on. */
void mg_pump_stop(mg_pump_t *p);

/* Stop, and close the timer (its memory is the caller's; it is free after the loop ran). */
void mg_pump_close(mg_pump_t *p);

#endif
