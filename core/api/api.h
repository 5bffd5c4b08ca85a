/* api: the client-facing HTTP surface: paths routed to their handlers (inference to the
 * pipeline, /v1/tasks to tasks, /v1/sessions to sessions, /api/v2 to the admin API), and the small
 * endpoints the gateway answers itself (health, readiness, status, models, metrics).
 *
 * The api holds borrowed pointers to what those endpoints read; the composition root
 * (server.c) fills them before the listeners start. Loop thread only. */
#ifndef MG_API_H
#define MG_API_H

#include <stdint.h>
#include <uv.h>

#include "admin/admin.h"
#include "api/dashboard.h"
#include "luavm/gens.h"
#include "net/http.h"
#include "obs/metrics.h"
#include "pipeline/pipeline.h"
#include "pipeline/tasks.h"
#include "route/pool.h"
#include "sched/sched.h"
#include "session/session.h"
#include "store/store.h"
#include "store/upkeep.h"
#include "tenancy/auth.h"
#include "upstream/upstream.h"

/* The process as /status and /ready tell it (the composition root keeps it current). */
typedef struct mg_proc_status_s {
    int64_t started_at;      /* unix seconds */
    int stopping;            /* draining: not ready */
    char reload_result[16];  /* "ok" | "failed" */
    char reload_error[1024]; /* the last failed reload's "FILE:LINE: reason", or "" */
    int64_t reload_at;       /* unix seconds of the last reload's end */
} mg_proc_status_t;

typedef struct mg_api_s {
    uv_loop_t *loop;
    mg_gens_t *gens;
    mg_metrics_t *metrics;
    mg_pool_t *pool;
    mg_sched_t *sched;
    mg_upstream_t *upstream;
    mg_store_t *store;   /* NULL: not ready */
    mg_upkeep_t *upkeep; /* NULL: no housekeeping thread (its metrics are left out) */
    mg_pipeline_t *pipeline;
    mg_tasks_t *tasks;
    mg_sessions_t *sessions;
    mg_admin_t *admin;
    mg_dashboard_t *dashboard;         /* the WebUI, its sign-in and stream; NULL = none */
    mg_auth_t *auth;                   /* who owns a task */
    struct mg_resp_store_s *responses; /* GET and DELETE /v1/responses/{id} */
    int admin_apart; /* server.admin_listen is set: admin API and dashboard only there */
    const mg_listener_t *listener; /* server.listen: its connections */
    const mg_proc_status_t *proc;
    const struct mg_redis_s *redis; /* NULL: no cluster.redis */
    struct mg_shared_s *shared;     /* the limits shared through it; NULL: none */
    struct mg_cidem_s *cidem;       /* idempotency keys shared through it; NULL: none */
    struct mg_csamples_s *samples;  /* health samples shared through it; NULL: none */
    struct mg_otlp_s *otlp;         /* NULL: no observability.otlp */
    struct mg_upmodels_s *upmodels; /* the providers' model lists (GET /v1/models); NULL: none */
    struct mg_control_s *control;   /* the control plane through PostgreSQL; NULL: none */
} mg_api_t;

/* The listener handler for server.listen (ud = the mg_api_t). */
void mg_api_handle(void *api, mg_http_req_t *req);
/* The listener handler for server.admin_listen: the admin API and the dashboard only (with
 * admin_apart set, server.listen answers them 404). */
void mg_api_handle_admin(void *api, mg_http_req_t *req);
/* The listener handler for server.metrics_listen. */
void mg_api_handle_metrics(void *api, mg_http_req_t *req);

#endif
