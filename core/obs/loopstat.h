/* loopstat: how long the event loop stays busy between two waits for I/O.
 *
 * A request that arrives while the loop is busy waits for the rest of that busy stretch, so
 * the long stretches (a slow callback, a large Lua collection, a burst of work) are what the
 * tail of the latency distribution is made of. Measured once per loop iteration, with
 * libuv's idle-time metric: the time since the previous iteration minus the time spent
 * waiting in the poll. Recorded into mg_metrics_t (moongate_loop_busy_seconds). */
#ifndef MG_LOOPSTAT_H
#define MG_LOOPSTAT_H

#include <stdint.h>
#include <uv.h>

#include "obs/metrics.h"

typedef struct {
    uv_prepare_t prepare; /* runs once per iteration, just before the loop waits again */
    mg_metrics_t *metrics;
    uint64_t last_ns, last_idle_ns;
} mg_loopstat_t;

/* Start measuring `loop` into `m` (turns on libuv's idle-time metric). 0 or a libuv error. */
int mg_loopstat_start(mg_loopstat_t *ls, uv_loop_t *loop, mg_metrics_t *m);

/* Stop measuring; the prepare handle is closed with uv_close (no callback needed: it is
 * embedded in `ls`, which must outlive the loop's next iteration). */
void mg_loopstat_stop(mg_loopstat_t *ls);

#endif
