/* stream: GET /api/dashboard/stream, the dashboard's live view over SSE.
 *
 * One timer (dashboard.stream_interval_ms, 1 s by default) runs while a stream is open and
 * builds the snapshot from in-memory state only: provider state and health, cooldowns with
 * their end (unix ms, so the page counts down itself), pools, the scheduler's queue by
 * priority and running tasks, backpressure, in-flight requests, the last reload; a tenant
 * admin's stream carries no provider or pool state (that is the platform's), only its
 * tenant's requests. Nothing is done per proxied request but the copy into obs/recent.h, so
 * the stream costs the proxy nothing measurable however many dashboards watch.
 *
 * Events (text/event-stream; `retry: 3000` first):
 *   event: request   id: <seq>   data: one finished request (obs/recent.h, no prompt, no key)
 *   event: gap       data: {"missed": N}   requests that left the ring before being sent
 *   event: snapshot  id: <seq>   data: the snapshot, sent when it changed (with
 *                                server_time_ms), else a ": keepalive" comment every 15 s
 *   event: signed_out            the session ended; the stream ends
 * A reconnect with Last-Event-ID: <seq> (or ?last_event_id=<seq>) gets the requests after seq
 * still in the ring; a new stream gets the last 50. Request events are filtered on the
 * server by ?model=, ?provider= (exact names) and ?errors=1 (status >= 400 only).
 *
 * Bounded: dashboard.max_streams at once (503 past them); nothing is written to a client
 * whose connection still has output queued above the high-water mark, and one that stays
 * so for 10 s is dropped (the proxy never waits for a dashboard). Loop thread only. */
#ifndef MG_API_STREAM_H
#define MG_API_STREAM_H

#include <stdint.h>
#include <uv.h>

#include "admin/admin.h"
#include "api/websession.h"
#include "luavm/gens.h"
#include "net/http.h"
#include "obs/metrics.h"
#include "obs/recent.h"
#include "pipeline/pipeline.h"
#include "sched/sched.h"

struct mg_proc_status_s;

/* What the snapshot reads, borrowed. */
typedef struct mg_stream_deps_s {
    mg_sched_t *sched;
    mg_pipeline_t *pipeline; /* in flight */
    mg_recent_t *recent;
    const mg_listener_t *listener;       /* connections */
    const struct mg_proc_status_s *proc; /* the last reload */
} mg_stream_deps_t;

typedef struct mg_stream_client_s mg_stream_client_t;

typedef struct mg_streams_s {
    mg_stream_deps_t d;
    uv_loop_t *loop;
    mg_gens_t *gens;
    mg_metrics_t *metrics;
    mg_admin_t *admin; /* the provider and pool views */
    mg_websessions_t *sessions;
    uv_timer_t timer;
    int timer_on, stopping;
    mg_stream_client_t *clients; /* owned list */
    int n;
    uint64_t dropped_total; /* slow clients dropped */
} mg_streams_t;

int mg_streams_init(mg_streams_t *s, uv_loop_t *loop, mg_gens_t *gens, mg_metrics_t *metrics,
                    mg_admin_t *admin, mg_websessions_t *sessions, const mg_stream_deps_t *d);
/* Open a stream for req in session se (answers 503 when max_streams are open or stopping). */
void mg_streams_open(mg_streams_t *s, mg_http_req_t *req, const mg_websession_t *se);
/* End the streams of the session with this serial (sign-out). */
void mg_streams_end_session(mg_streams_t *s, uint64_t serial);
/* End every stream and refuse new ones. */
void mg_streams_stop(mg_streams_t *s);
/* Close the timer handle. */
void mg_streams_close(mg_streams_t *s);

#endif
