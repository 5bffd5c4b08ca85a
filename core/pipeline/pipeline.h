/* pipeline: an inference request (POST /v1/chat/completions, /v1/completions,
 * /v1/embeddings, /v1/responses and Anthropic's /v1/messages through their front ends) from its
 * parsed HTTP request to the end of its answer, through the named steps of call.h: parse → identify
 * → idempotency → admit → enqueue → route → reserve → encode → send → stream → finish. A client
 * that leaves at any point aborts the upstream transfer at once.
 *
 * The pipeline holds what the steps use, borrowed from the composition root (server.c),
 * which fills every field before the first request and keeps them alive until the last
 * call ended; and the calls in flight, which are its own. Loop thread only. */
#ifndef MG_PIPELINE_H
#define MG_PIPELINE_H

#include <uv.h>

#include "cluster/limits.h"
#include "luavm/gens.h"
#include "pipeline/tasks.h"
#include "net/endpoint.h"
#include "net/http.h"
#include "obs/family.h"
#include "obs/metrics.h"
#include "obs/fulllog.h"
#include "obs/otlp.h"
#include "obs/recent.h"
#include "route/facts.h"
#include "route/pool.h"
#include "sched/pump.h"
#include "sched/sched.h"
#include "session/session.h"
#include "store/store.h"
#include "tenancy/auth.h"
#include "tenancy/userrate.h"
#include "token/calib.h"
#include "upstream/upstream.h"

struct mg_idem_s;
struct mg_resp_store_s;

typedef struct mg_pipeline_s {
    /* borrowed */
    uv_loop_t *loop;
    mg_gens_t *gens; /* the generation a new call takes */
    mg_pool_t *pool; /* provider runtime state */
    mg_sched_t *sched;
    mg_pump_t *pump;
    mg_upstream_t *upstream;
    mg_auth_t *auth;
    mg_userrate_t *userrate;
    mg_metrics_t *metrics;
    mg_store_t *store;                 /* cooldowns and health are persisted here; NULL = not */
    struct mg_idem_s *idem;            /* requests with an idempotency key are handed over */
    mg_otlp_t *otlp;                   /* each finished request's span goes here; NULL = not */
    mg_fulllog_t *fulllog;             /* while it is on, prompts and answers are logged */
    mg_recent_t *recent;               /* finished requests go here for the dashboard; NULL = not */
    struct mg_resp_store_s *responses; /* stored Responses (previous_response_id) */
    mg_sessions_t *sessions;           /* requests with a session_id are answered on its history */
    mg_shared_t *shared; /* limits shared through Redis (cluster.redis); NULL: single node */
    struct mg_csamples_s *samples; /* health samples shared through it; NULL: not shared */
    mg_calib_t *calib; /* bytes per token learned per route (pipeline/calib.h); NULL: bytes / 4 */
    /* the pipeline's own */
    struct call_s *calls; /* in flight */
    int in_flight;
    uv_timer_t ping_timer;  /* keep-alives on silent streams (ping.h) */
    uv_timer_t lease_timer; /* the shared leases' renewal (shared.c) */
} mg_pipeline_t;

/* Answer an inference request for endpoint ep (an mg_handle_fn with ud = the pipeline). */
void mg_pipeline_handle(void *pipeline, mg_http_req_t *req, mg_endpoint_t ep);

/* POST /v1/messages/count_tokens: the Anthropic request's input tokens by the model's
 * encoding, answered at once (messages_count.c). */
void mg_pipeline_count_tokens(void *pipeline, mg_http_req_t *req);

/* GET /v1/tasks/{id} for a request in flight: its state and timing; DELETE: cancel it (its
 * client gets 409 REQUEST_CANCELLED, or an error event when streaming). Returns 0 when
 * answered, -1 (nothing answered) when no such request is in flight. */
int mg_pipeline_task(void *pipeline, mg_http_req_t *req, const char *task_id,
                     const mg_task_caller_t *who);

/* A message on the cluster's cooldown channel (an mg_redis_msg_cb with ud = the pipeline):
 * another instance cooled a provider; this one cools it too, for the same seconds (logged
 * and persisted as its own cooldowns are). Its own messages are ignored. */
void mg_pipeline_cooldown_heard(void *pipeline, const char *payload, size_t len);

/* With cluster.redis: the concurrency leases and spend holds the calls in flight keep in
 * Redis are renewed every third of cluster.redis.lease_ttl_ms (read at each tick), so they
 * outlive no instance by more than that and no running request loses them. Stop closes the
 * timer (at shutdown). */
void mg_pipeline_leases_start(mg_pipeline_t *pl);
void mg_pipeline_leases_stop(mg_pipeline_t *pl);
/* Another instance's health sample (an mg_csamples_feed_fn with ud = the pipeline): recorded
 * in the provider's health as this instance's own are, age_ms in the past (stored when the
 * state changes). 0 when the provider is not in this instance's config. */
struct mg_csample_s;
int mg_pipeline_sample_heard(void *pipeline, const struct mg_csample_s *s, uint64_t age_ms);

/* The calls holding a slot now, by application and logical model, into f (cleared first:
 * moongate_active_tasks, set before each scrape). */
void mg_pipeline_active_tasks(const mg_pipeline_t *pl, mg_family_t *f);

#endif
