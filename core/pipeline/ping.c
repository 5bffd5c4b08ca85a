/* ping: keep-alives on silent client streams; see ping.h. */
#include "pipeline/ping.h"

#include <string.h>

#include "pipeline/call.h"

#define PING_TICK_MIN_MS 50
#define PING_TICK_MAX_MS 1000
#define PING_IDLE_TICK_MS 1000 /* pings off: look again for a reload that turns them on */

static const char openai_ping[] = ": ping\n\n";
static const char anthropic_ping[] = "event: ping\ndata: {\"type\": \"ping\"}\n\n";

/* A call whose client would wait for the upstream now: its stream is open, the upstream is
 * still in flight and nothing of ours is waiting to go out. */
static int silent_stream(const call_t *c)
{
    return c->req && c->stream && c->client_started && c->xfer && !c->stop_stream && !c->out.len &&
           !c->paused_by_client;
}

static int ping_interval(const mg_pipeline_t *pl)
{
    return mg_gens_current(pl->gens)->cfg->protocols.ping_interval_ms;
}

static void on_ping_tick(uv_timer_t *t)
{
    mg_pipeline_t *pl = t->data;
    int every = ping_interval(pl);
    if (every <= 0) {
        uv_timer_start(t, on_ping_tick, PING_IDLE_TICK_MS, 0);
        return;
    }
    uint64_t now = uv_now(pl->loop);
    for (call_t *c = pl->calls; c; c = c->next) {
        if (!silent_stream(c) || now - c->last_client_write_ms < (uint64_t)every) continue;
        const char *p = c->front_messages ? anthropic_ping : openai_ping;
        size_t n = c->front_messages ? sizeof(anthropic_ping) - 1 : sizeof(openai_ping) - 1;
        mg_http_stream_send(c->req, p, n, 0);
        c->last_client_write_ms = now;
        c->pings++;
    }
    /* a quarter of the interval: a ping is late by at most that much */
    int tick = every / 4;
    if (tick < PING_TICK_MIN_MS) tick = PING_TICK_MIN_MS;
    if (tick > PING_TICK_MAX_MS) tick = PING_TICK_MAX_MS;
    uv_timer_start(t, on_ping_tick, (uint64_t)tick, 0);
}

void mg_ping_start(mg_pipeline_t *pl)
{
    uv_timer_init(pl->loop, &pl->ping_timer);
    pl->ping_timer.data = pl;
    uv_timer_start(&pl->ping_timer, on_ping_tick, PING_TICK_MIN_MS, 0);
}

void mg_ping_stop(mg_pipeline_t *pl)
{
    uv_timer_stop(&pl->ping_timer);
    uv_close((uv_handle_t *)&pl->ping_timer, NULL);
}
