/* pump: the scheduler driven by the loop; see pump.h. */
#include "sched/pump.h"

static void on_timer(uv_timer_t *t)
{
    mg_pump_run(t->data);
}

int mg_pump_init(mg_pump_t *p, uv_loop_t *loop, mg_sched_t *sched)
{
    p->loop = loop;
    p->sched = sched;
    p->stopped = 0;
    int rc = uv_timer_init(loop, &p->timer);
    if (rc == 0) p->timer.data = p;
    return rc;
}

void mg_pump_run(mg_pump_t *p)
{
    if (p->stopped) return;
    uint64_t now = uv_now(p->loop);
    mg_sched_entry_t *e;
    while ((e = mg_sched_expire(p->sched, now))) e->on_expire(e);
    while (!p->stopped && (e = mg_sched_dispatch(p->sched, now))) e->on_dispatch(e);
    uint64_t deadline;
    if (!p->stopped && mg_sched_next_deadline(p->sched, &deadline) == 0 && deadline > 0)
        uv_timer_start(&p->timer, on_timer, deadline > now ? deadline - now : 0, 0);
    else uv_timer_stop(&p->timer);
}

void mg_pump_kick(mg_pump_t *p)
{
    /* a freed slot matters only to a task that waits for one: most releases find none */
    if (p->stopped || mg_sched_queued(p->sched) == 0) return;
    uv_timer_start(&p->timer, on_timer, 0, 0);
}

void mg_pump_stop(mg_pump_t *p)
{
    p->stopped = 1;
    uv_timer_stop(&p->timer);
}

void mg_pump_close(mg_pump_t *p)
{
    mg_pump_stop(p);
    uv_close((uv_handle_t *)&p->timer, NULL);
}
