/* memtrim: malloc_trim once a burst of large frees is over; see memtrim.h.
 *
 * The trim runs on a libuv worker: it walks the heap and madvises free pages away, a few
 * milliseconds for a few hundred MB (bench/README.md), which the loop should not wait for.
 * It takes each arena's lock in turn, so a loop-thread malloc meanwhile may wait for one
 * arena; that is why it runs only after a quiet second, not during the burst. */
#include "base/memtrim.h"

#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define QUIET_MS 1000

static void on_quiet(uv_timer_t *h);

static void arm(mg_memtrim_t *t)
{
    t->armed = 1;
    t->freed_at_arm = t->freed;
    uv_timer_start(&t->timer, on_quiet, QUIET_MS, 0);
}

static void trim_work(uv_work_t *w)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

static void trim_done(uv_work_t *w, int status)
{
    mg_memtrim_t *t = w->data;
    t->working = 0;
    t->trims++;
    if (t->open && !t->armed && t->freed >= MG_MEMTRIM_MIN_BYTES) arm(t); /* freed meanwhile */
}

static void on_quiet(uv_timer_t *h)
{
    mg_memtrim_t *t = h->data;
    t->armed = 0;
    if (t->freed != t->freed_at_arm) { /* still freeing: the burst goes on */
        arm(t);
        return;
    }
    t->freed = 0;
    t->working = 1;
    t->work.data = t;
    if (uv_queue_work(t->loop, &t->work, trim_work, trim_done) != 0) t->working = 0;
}

int mg_memtrim_init(mg_memtrim_t *t, uv_loop_t *loop)
{
    memset(t, 0, sizeof(*t));
    t->loop = loop;
    int rc = uv_timer_init(loop, &t->timer);
    if (rc != 0) return rc;
    t->timer.data = t;
    t->open = 1;
    return 0;
}

void mg_memtrim_note(mg_memtrim_t *t, size_t bytes)
{
    t->freed += bytes;
    if (t->open && !t->armed && !t->working && t->freed >= MG_MEMTRIM_MIN_BYTES) arm(t);
}

void mg_memtrim_close(mg_memtrim_t *t)
{
    if (!t->open) return;
    t->open = 0;
    t->armed = 0;
    uv_close((uv_handle_t *)&t->timer, NULL);
}
