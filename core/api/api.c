/* api: paths to handlers, the error shape, and the endpoints the gateway answers
 * itself; see api.h. */
#include "admin/control.h"
#include "cluster/idem.h"
#include "cluster/limits.h"
#include "cluster/redis.h"
#include "cluster/samples.h"
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "api/cors.h"
#include "api/models.h"
#include "base/clock.h"
#include "base/crypto.h"
#include "base/json.h"
#include "obs/answer.h"
#include "obs/health_view.h"
#include "obs/otlp.h"
#include "pipeline/responses_store.h"
#include "pipeline/messages_resp.h"
#include "session/http.h"

/* ------------------------------------------------------------------------ */
/* Endpoints answered by the gateway                                         */
/* ------------------------------------------------------------------------ */

/* Ready: config loaded, storage open, at least one provider configured. */
static void handle_ready(mg_api_t *s, mg_http_req_t *req)
{
    int providers = (int)mg_gens_current(s->gens)->cfg->n_providers;
    int ready = s->store && providers > 0 && !s->proc->stopping;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", ready ? "ready" : "not_ready");
    cJSON *checks = cJSON_AddObjectToObject(root, "checks");
    cJSON_AddBoolToObject(checks, "config", 1);
    cJSON_AddBoolToObject(checks, "storage", s->store != NULL);
    cJSON_AddBoolToObject(checks, "providers", providers > 0);
    cJSON_AddBoolToObject(checks, "accepting", !s->proc->stopping);
    mg_answer_tree(s->metrics, req, MG_EP_OTHER, ready ? 200 : 503, root);
}

/* "cluster": this node's id and the state of each shared component (issue 24) */
static void add_cluster_status(mg_api_t *s, const mg_gen_t *g, cJSON *root)
{
    cJSON *cl = cJSON_AddObjectToObject(root, "cluster");
    cJSON_AddStringToObject(cl, "node_id", g->cfg->cluster.node_id);
    cJSON *cp = cJSON_AddObjectToObject(cl, "control");
    if (!s->control) {
        cJSON_AddStringToObject(cp, "state", "off");
    } else {
        mg_control_stats_t cs;
        mg_control_stats(s->control, &cs);
        cJSON_AddStringToObject(cp, "state",
                                !cs.follower_connected ? "disconnected"
                                : cs.stalled_id        ? "stalled"
                                                       : "following");
        if (cs.stalled_id) {
            cJSON_AddNumberToObject(cp, "stalled_id", (double)cs.stalled_id);
            cJSON_AddStringToObject(cp, "stalled_reason", cs.stalled_reason);
        }
        cJSON_AddNumberToObject(cp, "applied_id", (double)cs.applied_id);
        cJSON_AddNumberToObject(cp, "applied", (double)cs.applied_total);
        cJSON_AddNumberToObject(cp, "appended", (double)cs.appended_total);
        cJSON_AddNumberToObject(cp, "refused", (double)cs.refused_total);
        cJSON_AddNumberToObject(cp, "audit_shipped", (double)cs.shipped_total);
    }
    cJSON *rd = cJSON_AddObjectToObject(cl, "redis");
    cJSON_AddStringToObject(rd, "state", mg_redis_state_name(s->redis));
    if (!s->redis) return;
    mg_redis_stats_t st;
    mg_redis_stats(s->redis, &st);
    cJSON_AddNumberToObject(rd, "sent", (double)st.sent);
    cJSON_AddNumberToObject(rd, "answered", (double)st.answered);
    cJSON_AddNumberToObject(rd, "timed_out", (double)st.timed_out);
    cJSON_AddNumberToObject(rd, "unavailable", (double)st.unavailable);
    cJSON_AddNumberToObject(rd, "connects", (double)st.reconnects);
    /* the shared limits: the mode that applies while Redis cannot answer, and what it did */
    cJSON_AddStringToObject(rd, "degraded_mode",
                            mg_cluster_degraded_name(g->cfg->cluster.redis.degraded));
    cJSON_AddStringToObject(rd, "limits",
                            mg_redis_up(s->redis)
                                ? "shared"
                                : mg_cluster_degraded_name(g->cfg->cluster.redis.degraded));
    mg_shared_stats_t ls;
    mg_shared_stats(s->shared, &ls);
    cJSON *l = cJSON_AddObjectToObject(rd, "shared_limits");
    cJSON_AddNumberToObject(l, "reserved", (double)ls.reserved);
    cJSON_AddNumberToObject(l, "refused", (double)ls.refused);
    cJSON_AddNumberToObject(l, "unavailable", (double)ls.unavailable);
    cJSON_AddNumberToObject(l, "noscript", (double)ls.noscript);
    cJSON_AddNumberToObject(l, "released", (double)ls.released);
    cJSON_AddNumberToObject(l, "renewed", (double)ls.renewed);
    cJSON *rc = cJSON_AddObjectToObject(l, "reconciled");
    cJSON_AddNumberToObject(rc, "admissions", (double)ls.reconciled);
    cJSON_AddNumberToObject(rc, "micros", (double)ls.reconciled_micros);
    cJSON_AddNumberToObject(rc, "lost", (double)ls.reconcile_lost);
    cJSON_AddNumberToObject(rc, "dropped", (double)ls.backlog_dropped);
    cJSON *d = cJSON_AddObjectToObject(l, "degraded");
    for (int m = 0; m < 3; m++)
        cJSON_AddNumberToObject(d, mg_cluster_degraded_name((mg_cluster_degraded_t)m),
                                (double)ls.degraded[m]);
    cJSON_AddNumberToObject(l, "rtt_ms_avg", ls.rtt_n ? ls.rtt_ms_sum / (double)ls.rtt_n : 0);
    mg_cidem_stats_t is;
    mg_cidem_stats(s->cidem, &is);
    cJSON *id = cJSON_AddObjectToObject(rd, "idempotency");
    cJSON_AddNumberToObject(id, "claimed", (double)is.claimed);
    cJSON_AddNumberToObject(id, "twins", (double)is.twins);
    cJSON_AddNumberToObject(id, "replayed", (double)is.replayed);
    cJSON_AddNumberToObject(id, "stored", (double)is.stored);
    cJSON_AddNumberToObject(id, "conflicts", (double)is.conflicts);
    cJSON_AddNumberToObject(id, "unavailable", (double)is.unavailable);
    mg_csamples_stats_t hs;
    mg_csamples_stats(s->samples, &hs);
    cJSON *h = cJSON_AddObjectToObject(rd, "health_samples");
    cJSON_AddNumberToObject(h, "added", (double)hs.added);
    cJSON_AddNumberToObject(h, "dropped", (double)hs.dropped);
    cJSON_AddNumberToObject(h, "heard", (double)hs.heard);
    cJSON_AddNumberToObject(h, "replayed", (double)hs.replayed);
}

/* The provider's 5-minute health window: its own attempts and, with cluster.redis, the other
 * instances' (cluster/samples.h). Rates and means null when there are none. */
static void add_health_window(cJSON *o, const mg_health_t *h, uint64_t now)
{
    mg_health_snapshot_t hs;
    mg_health_snapshot(h, now, &hs);
    cJSON_AddNumberToObject(o, "samples_5m", hs.window_samples);
    if (hs.window_samples) cJSON_AddNumberToObject(o, "success_rate_5m", hs.window_success_rate);
    else cJSON_AddNullToObject(o, "success_rate_5m");
    if (hs.window_ttft_ms >= 0) cJSON_AddNumberToObject(o, "ttft_ms_5m", hs.window_ttft_ms);
    else cJSON_AddNullToObject(o, "ttft_ms_5m");
}

static void handle_status(mg_api_t *s, mg_http_req_t *req)
{
    mg_gen_t *g = mg_gens_current(s->gens);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", s->proc->stopping ? "stopping" : "ok");
    cJSON_AddNumberToObject(root, "generation", g->id);
    add_cluster_status(s, g, root);
    cJSON *rl = cJSON_AddObjectToObject(root, "reload");
    cJSON_AddStringToObject(rl, "result", s->proc->reload_result);
    if (s->proc->reload_error[0]) cJSON_AddStringToObject(rl, "error", s->proc->reload_error);
    else cJSON_AddNullToObject(rl, "error");
    if (s->proc->reload_at) cJSON_AddNumberToObject(rl, "at", (double)s->proc->reload_at);
    cJSON_AddNumberToObject(root, "in_flight", s->pipeline->in_flight);
    cJSON_AddNumberToObject(root, "connections", (double)s->listener->n_conns);
    cJSON_AddNumberToObject(root, "upstream_transfers", (double)mg_upstream_active(s->upstream));
    cJSON_AddNumberToObject(root, "uptime_s", (double)(time(NULL) - s->proc->started_at));
    if (s->store) { /* the disk full: serving goes on, the writes wait in memory */
        mg_store_stats_t st;
        mg_store_stats(s->store, &st);
        cJSON *so = cJSON_AddObjectToObject(root, "store");
        cJSON_AddBoolToObject(so, "disk_full", st.disk_full);
        cJSON_AddNumberToObject(so, "queued", (double)st.queued);
        cJSON_AddNumberToObject(so, "parked", (double)st.parked);
    }
    mg_sched_stats_t ss;
    mg_sched_stats(s->sched, &ss);
    cJSON *sc = cJSON_AddObjectToObject(root, "scheduler");
    cJSON_AddNumberToObject(sc, "running", ss.running);
    cJSON_AddNumberToObject(sc, "queued", ss.queued);
    cJSON *qp = cJSON_AddObjectToObject(sc, "queued_by_priority");
    for (int p = 0; p < MG_PRIO_COUNT; p++)
        cJSON_AddNumberToObject(qp, mg_priority_name((mg_priority_t)p), ss.queued_by_prio[p]);
    cJSON_AddNumberToObject(sc, "load", ss.load);
    cJSON_AddNumberToObject(sc, "backpressure_level", ss.level);
    cJSON *ps = cJSON_AddArrayToObject(root, "providers");
    for (size_t i = 0; i < g->cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &g->cfg->providers[i];
        const mg_provider_state_t *st = mg_pool_get(s->pool, p->id);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", p->id);
        cJSON_AddStringToObject(o, "adapter", p->adapter);
        cJSON_AddStringToObject(o, "pool", p->pool);
        cJSON_AddBoolToObject(o, "local", p->local);
        cJSON_AddBoolToObject(o, "available", mg_pool_available(st, uv_now(s->loop)));
        if (st) mg_health_view(o, &st->health, uv_now(s->loop));
        cJSON_AddNumberToObject(
            o, "cooldown_remaining_ms",
            st ? (double)mg_cooldown_remaining_ms(&st->cooldown, uv_now(s->loop)) : 0);
        cJSON_AddNumberToObject(o, "in_flight", st ? st->in_flight : 0);
        cJSON_AddNumberToObject(o, "requests_total", st ? (double)st->requests_total : 0);
        cJSON_AddNumberToObject(o, "failures_total", st ? (double)st->failures_total : 0);
        cJSON_AddNumberToObject(o, "consecutive_failures", st ? st->consecutive_failures : 0);
        if (st) add_health_window(o, &st->health, uv_now(s->loop));
        cJSON_AddItemToArray(ps, o);
    }
    cJSON *ms = cJSON_AddArrayToObject(root, "models");
    for (size_t i = 0; i < g->cfg->n_models; i++)
        cJSON_AddItemToArray(ms, cJSON_CreateString(g->cfg->models[i].name));
    mg_answer_tree(s->metrics, req, MG_EP_OTHER, 200, root);
}

/* ------------------------------------------------------------------------ */
/* Routing                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum { ROUTE_GET, ROUTE_POST } route_method_t;

typedef struct {
    const char *path;
    route_method_t method;
    mg_endpoint_t ep;
    void (*fn)(mg_api_t *s, mg_http_req_t *req);
} route_t;

static void handle_chat(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_handle(s->pipeline, req, MG_EP_CHAT);
}

static void handle_completions(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_handle(s->pipeline, req, MG_EP_COMPLETIONS);
}

static void handle_embeddings(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_handle(s->pipeline, req, MG_EP_EMBEDDINGS);
}

static void handle_responses(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_handle(s->pipeline, req, MG_EP_RESPONSES);
}

/* The router's own errors under /v1/messages, in Anthropic's shape like the endpoint's. */
static void messages_error(mg_api_t *s, mg_http_req_t *req, int status, const char *code,
                           const char *msg)
{
    mg_buf_t body = {0};
    mg_msgs_request_id_header(req);
    mg_msgs_error_body(&body, status, code, msg, req->request_id);
    mg_answer_json(s->metrics, req, MG_EP_MESSAGES, status, NULL, body.data, body.len);
    mg_buf_free(&body);
}

static void handle_messages(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_handle(s->pipeline, req, MG_EP_MESSAGES);
}

static void handle_count_tokens(mg_api_t *s, mg_http_req_t *req)
{
    mg_pipeline_count_tokens(s->pipeline, req);
}

static void handle_health(mg_api_t *s, mg_http_req_t *req)
{
    static const char body[] = "{\"status\":\"ok\"}";
    mg_answer_json(s->metrics, req, MG_EP_OTHER, 200, NULL, body, sizeof(body) - 1);
}

static const route_t routes[] = {
    {"/v1/chat/completions", ROUTE_POST, MG_EP_CHAT, handle_chat},
    {"/v1/completions", ROUTE_POST, MG_EP_COMPLETIONS, handle_completions},
    {"/v1/embeddings", ROUTE_POST, MG_EP_EMBEDDINGS, handle_embeddings},
    {"/v1/responses", ROUTE_POST, MG_EP_RESPONSES, handle_responses},
    {"/v1/messages", ROUTE_POST, MG_EP_MESSAGES, handle_messages},
    {"/v1/messages/count_tokens", ROUTE_POST, MG_EP_MESSAGES, handle_count_tokens},
    {"/v1/models", ROUTE_GET, MG_EP_MODELS, mg_api_models},
    {"/health", ROUTE_GET, MG_EP_OTHER, handle_health},
    {"/ready", ROUTE_GET, MG_EP_OTHER, handle_ready},
    {"/health/ready", ROUTE_GET, MG_EP_OTHER, handle_ready},
    {"/status", ROUTE_GET, MG_EP_OTHER, handle_status},
};

/* Whose tasks the caller may see: all of them in open mode, with the platform admin
 * token or a platform admin's dashboard session, else its key's own (0 with *who, or -1 after
 * answering 401). */
static int task_caller(mg_api_t *s, mg_http_req_t *req, mg_task_caller_t *who)
{
    who->all = 1;
    who->key_id = 0;
    if (!mg_gens_current(s->gens)->cfg->auth_enabled || mg_admin_is_platform(s->admin, req))
        return 0;
    int dash = s->dashboard ? mg_dashboard_platform(s->dashboard, req) : 0; /* the WebUI */
    if (dash != 0) return dash > 0 ? 0 : -1;
    mg_auth_result_t r;
    if (mg_auth_authenticate(s->auth, req, mg_unix_ms(), &r) != 0) {
        mg_answer_error(s->metrics, req, MG_EP_OTHER, r.status, r.code, r.message, 0);
        return -1;
    }
    who->all = 0;
    who->key_id = r.key_id;
    return 0;
}

/* /v1/tasks (GET lists, POST submits) and /v1/tasks/{id} (GET, DELETE): a key holder's own,
 * the operator's all; another key's task is 404, as if it did not exist. */
static void handle_tasks(mg_api_t *s, mg_http_req_t *req, const char *id)
{
    mg_task_caller_t who;
    int ok = id ? req->method == HTTP_GET || req->method == HTTP_DELETE
                : req->method == HTTP_GET || req->method == HTTP_POST;
    if (!ok) {
        mg_answer_error(s->metrics, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED",
                        id ? "use GET or DELETE" : "use GET or POST", 0);
        return;
    }
    if (task_caller(s, req, &who) != 0) return;
    if (id) mg_tasks_handle(s->tasks, req, id, &who);
    else if (req->method == HTTP_GET) mg_tasks_list(s->tasks, req, &who);
    else mg_tasks_submit(s->tasks, req, who.key_id); /* its run checks the key like any */
}

/* Whose sessions the caller may see: all in open mode or with the platform admin token, else
 * its key's tenant and project's (0 with *who, or -1 after answering 401). */
static int session_owner(mg_api_t *s, mg_http_req_t *req, mg_session_owner_t *who)
{
    *who = (mg_session_owner_t){.all = 1};
    if (!mg_gens_current(s->gens)->cfg->auth_enabled || mg_admin_is_platform(s->admin, req))
        return 0;
    mg_auth_result_t r;
    if (mg_auth_authenticate(s->auth, req, mg_unix_ms(), &r) != 0) {
        mg_answer_error(s->metrics, req, MG_EP_OTHER, r.status, r.code, r.message, 0);
        return -1;
    }
    /* the key's project as the pipeline sees it (its record, before admission) */
    *who = (mg_session_owner_t){
        .all = 0, .tenant_id = r.tenant_id, .project_id = r.rec ? r.rec->project_id : 0};
    return 0;
}

/* /v1/sessions and /v1/sessions/{id}[/messages] (session/http.h). */
static void handle_sessions(mg_api_t *s, mg_http_req_t *req, const char *rest)
{
    mg_session_owner_t who;
    if (session_owner(s, req, &who) != 0) return;
    mg_sessions_http(s->sessions, s->metrics, mg_gens_current(s->gens)->cfg, req, rest, &who);
}

/* The admin API (/api/v2/) and the dashboard: 1 when req was theirs (answered or taken). */
static int admin_route(mg_api_t *s, mg_http_req_t *req)
{
    if (strncmp(req->path, "/api/v2/", 8) == 0) {
        if (s->dashboard) mg_dashboard_admin(s->dashboard, req); /* Bearer or session cookie */
        else mg_admin_handle(s->admin, req);
        return 1;
    }
    return s->dashboard && mg_dashboard_handle(s->dashboard, req);
}

void mg_api_handle_admin(void *api, mg_http_req_t *req)
{
    mg_api_t *s = api;
    size_t path_len = strlen(req->path);
    while (path_len > 1 && req->path[path_len - 1] == '/') req->path[--path_len] = '\0';
    if (admin_route(s, req)) return;
    if (strcmp(req->path, "/health") == 0) { /* a health check of the admin port itself */
        mg_http_respond(req, 200, "application/json", NULL, "{\"status\":\"ok\"}", 15);
        return;
    }
    mg_answer_error(s->metrics, req, MG_EP_OTHER, 404, "NOT_FOUND",
                    "no such endpoint (this is the admin listener, server.admin_listen)", 0);
}

void mg_api_handle(void *api, mg_http_req_t *req)
{
    mg_api_t *s = api;
    if (mg_cors_handle(&mg_gens_current(s->gens)->cfg->cors, req, s->metrics)) return;
    size_t path_len = strlen(req->path);
    while (path_len > 1 && req->path[path_len - 1] == '/') req->path[--path_len] = '\0';
    if (strncmp(req->path, "/v1/tasks/", 10) == 0 && req->path[10] &&
        !strchr(req->path + 10, '/')) {
        handle_tasks(s, req, req->path + 10);
        return;
    }
    if (strncmp(req->path, "/v1/sessions", 12) == 0 && (!req->path[12] || req->path[12] == '/')) {
        handle_sessions(s, req, req->path + 12);
        return;
    }
    if (strcmp(req->path, "/v1/tasks") == 0) {
        handle_tasks(s, req, NULL);
        return;
    }
    if (strncmp(req->path, "/v1/models/", 11) == 0 && req->path[11]) {
        if (req->method != HTTP_GET)
            mg_answer_error(s->metrics, req, MG_EP_MODELS, 405, "METHOD_NOT_ALLOWED", "use GET", 0);
        else mg_api_model(s, req, req->path + 11);
        return;
    }
    if (strncmp(req->path, "/v1/responses/", 14) == 0 && req->path[14]) {
        char *id = req->path + 14, *rest = strchr(id, '/');
        mg_resp_path_t what = !rest                               ? MG_RESP_ITSELF
                              : strcmp(rest, "/input_items") == 0 ? MG_RESP_INPUT_ITEMS
                              : strcmp(rest, "/cancel") == 0      ? MG_RESP_CANCEL
                                                                  : (mg_resp_path_t)-1;
        if (what != (mg_resp_path_t)-1) {
            char idbuf[128]; /* the path stays whole for the log line */
            size_t n = rest ? (size_t)(rest - id) : strlen(id);
            snprintf(idbuf, sizeof(idbuf), "%.*s", (int)(n < sizeof(idbuf) ? n : sizeof(idbuf) - 1),
                     id);
            mg_resp_store_handle(s->responses, req, idbuf, what);
            return;
        }
    }
    if (!s->admin_apart && admin_route(s, req)) return;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(routes[i].path, req->path) != 0) continue;
        int want = routes[i].method == ROUTE_POST ? HTTP_POST : HTTP_GET;
        if (req->method != want && routes[i].ep == MG_EP_MESSAGES) {
            messages_error(s, req, 405, "METHOD_NOT_ALLOWED", "use POST");
            return;
        }
        if (req->method != want) {
            mg_answer_error(s->metrics, req, routes[i].ep, 405, "METHOD_NOT_ALLOWED",
                            routes[i].method == ROUTE_POST ? "use POST" : "use GET", 0);
            return;
        }
        routes[i].fn(s, req);
        return;
    }
    if (strncmp(req->path, "/v1/messages/", 13) == 0) {
        messages_error(s, req, 404, "NOT_FOUND", "no such endpoint");
        return;
    }
    mg_answer_error(s->metrics, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such endpoint", 0);
}

/* The store's write path (store.h): queue, parked writes, commits, lock waits, failures. */
/* The OTLP exporter's counters (obs/otlp.h). */
static void append_otlp_metrics(mg_buf_t *b, mg_otlp_t *o)
{
    mg_otlp_stats_t st;
    mg_otlp_stats(o, &st);
    char t[1024];
    snprintf(
        t, sizeof(t),
        "# HELP moongate_otlp_spans_exported_total Spans the OTLP collector accepted.\n"
        "# TYPE moongate_otlp_spans_exported_total counter\n"
        "moongate_otlp_spans_exported_total %llu\n"
        "# HELP moongate_otlp_spans_dropped_total Spans not exported, by reason.\n"
        "# TYPE moongate_otlp_spans_dropped_total counter\n"
        "moongate_otlp_spans_dropped_total{reason=\"queue_full\"} %llu\n"
        "moongate_otlp_spans_dropped_total{reason=\"export_failed\"} %llu\n"
        "# HELP moongate_otlp_export_failures_total Failed OTLP export attempts (each retry).\n"
        "# TYPE moongate_otlp_export_failures_total counter\n"
        "moongate_otlp_export_failures_total %llu\n"
        "# HELP moongate_otlp_queue_spans Spans waiting for export.\n"
        "# TYPE moongate_otlp_queue_spans gauge\n"
        "moongate_otlp_queue_spans %llu\n",
        (unsigned long long)st.exported_total, (unsigned long long)st.dropped_full,
        (unsigned long long)st.dropped_failed, (unsigned long long)st.export_failures,
        (unsigned long long)st.queued);
    mg_buf_append_str(b, t);
}

static void store_metrics(mg_api_t *s, mg_buf_t *b)
{
    if (!s->store) return;
    mg_store_stats_t st;
    mg_store_stats(s->store, &st);
    char text[1400];
    snprintf(
        text, sizeof(text),
        "# HELP moongate_store_queued Writes waiting for the store's writer thread.\n"
        "# TYPE moongate_store_queued gauge\nmoongate_store_queued %llu\n"
        "# HELP moongate_store_parked Writes parked on the loop while the write queue is full.\n"
        "# TYPE moongate_store_parked gauge\nmoongate_store_parked %llu\n"
        "# HELP moongate_store_writes_total Writes committed.\n"
        "# TYPE moongate_store_writes_total counter\nmoongate_store_writes_total %llu\n"
        "# HELP moongate_store_failed_writes_total Writes that could not be stored.\n"
        "# TYPE moongate_store_failed_writes_total counter\nmoongate_store_failed_writes_total %llu\n"
        "# HELP moongate_store_commits_total Transactions committed (group commits).\n"
        "# TYPE moongate_store_commits_total counter\nmoongate_store_commits_total %llu\n"
        "# HELP moongate_store_busy_retries_total Writer attempts that found the database locked.\n"
        "# TYPE moongate_store_busy_retries_total counter\nmoongate_store_busy_retries_total %llu\n",
        (unsigned long long)st.queued, (unsigned long long)st.parked,
        (unsigned long long)st.writes_total, (unsigned long long)st.failed_total,
        (unsigned long long)st.batches_total, (unsigned long long)st.busy_retries_total);
    mg_buf_append_str(b, text);
    snprintf(text, sizeof(text),
             "# HELP moongate_store_disk_full 1 while the disk is full and the writer holds its "
             "writes in memory.\n"
             "# TYPE moongate_store_disk_full gauge\nmoongate_store_disk_full %d\n"
             "# HELP moongate_store_disk_full_total Times the store found the disk full.\n"
             "# TYPE moongate_store_disk_full_total counter\nmoongate_store_disk_full_total %llu\n"
             "# HELP moongate_store_refused_writes_total Writes refused while the disk was full "
             "(past the bound of held writes).\n"
             "# TYPE moongate_store_refused_writes_total counter\n"
             "moongate_store_refused_writes_total %llu\n",
             st.disk_full, (unsigned long long)st.disk_full_episodes_total,
             (unsigned long long)st.refused_while_full_total);
    mg_buf_append_str(b, text);
    snprintf(text, sizeof(text),
             "# HELP moongate_store_journal_bytes Usage journal bytes not yet drained into the "
             "database.\n"
             "# TYPE moongate_store_journal_bytes gauge\nmoongate_store_journal_bytes %llu\n"
             "# HELP moongate_store_journaled_total Usage events appended to the journal.\n"
             "# TYPE moongate_store_journaled_total counter\nmoongate_store_journaled_total %llu\n"
             "# HELP moongate_store_journal_fallback_total Usage events queued to the writer "
             "instead (the journal full or off the loop thread).\n"
             "# TYPE moongate_store_journal_fallback_total counter\n"
             "moongate_store_journal_fallback_total %llu\n",
             (unsigned long long)st.journal_used_bytes, (unsigned long long)st.journaled_total,
             (unsigned long long)st.journal_fallback_total);
    mg_buf_append_str(b, text);
    if (!s->upkeep) return;
    mg_upkeep_stats_t u;
    mg_upkeep_stats(s->upkeep, &u);
    snprintf(
        text, sizeof(text),
        "# HELP sidecar_db_size_bytes The SQLite database file's size.\n"
        "# TYPE sidecar_db_size_bytes gauge\nsidecar_db_size_bytes %lld\n"
        "# HELP sidecar_db_wal_size_bytes The SQLite WAL file's size.\n"
        "# TYPE sidecar_db_wal_size_bytes gauge\nsidecar_db_wal_size_bytes %lld\n"
        "# HELP sidecar_db_integrity_ok The last PRAGMA integrity_check: 1 ok, 0 problems, -1 not run yet.\n"
        "# TYPE sidecar_db_integrity_ok gauge\nsidecar_db_integrity_ok %d\n"
        "# HELP moongate_db_checkpoints_total WAL checkpoints that truncated the WAL file.\n"
        "# TYPE moongate_db_checkpoints_total counter\nmoongate_db_checkpoints_total %llu\n"
        "# HELP moongate_db_backups_total Online backups by result.\n"
        "# TYPE moongate_db_backups_total counter\n"
        "moongate_db_backups_total{result=\"ok\"} %llu\n"
        "moongate_db_backups_total{result=\"failed\"} %llu\n"
        "# HELP moongate_db_last_backup_timestamp_seconds When the last backup was written (0: none).\n"
        "# TYPE moongate_db_last_backup_timestamp_seconds gauge\n"
        "moongate_db_last_backup_timestamp_seconds %lld\n",
        (long long)u.db_bytes, (long long)u.wal_bytes, u.integrity_ok,
        (unsigned long long)u.checkpoints_total, (unsigned long long)u.backups_total,
        (unsigned long long)u.backup_failures_total, (long long)u.backup_at);
    mg_buf_append_str(b, text);
}

void mg_api_handle_metrics(void *api, mg_http_req_t *req)
{
    mg_api_t *s = api;
    if (strcmp(req->path, "/metrics") != 0) {
        mg_http_respond(req, 404, "text/plain", NULL, "not found\n", 10);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    mg_sched_stats_t pre;
    mg_sched_stats(s->sched, &pre);
    s->metrics->memory_reserved_bytes = pre.mem_reserved_bytes;
    mg_pipeline_active_tasks(s->pipeline, mg_metrics_family(s->metrics, MG_FAM_ACTIVE_TASKS));
    if (mg_metrics_render(s->metrics, s->pool, s->pipeline->in_flight, mg_gens_current(s->gens)->id,
                          uv_now(s->loop), &text, &len) != 0) {
        mg_http_respond(req, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    /* the scheduler's gauges */
    mg_sched_stats_t ss;
    mg_sched_stats(s->sched, &ss);
    mg_buf_t b = {text, len, len + 1};
    char line[512];
    snprintf(line, sizeof(line),
             "# HELP moongate_node_info This instance's cluster node id.\n"
             "# TYPE moongate_node_info gauge\nmoongate_node_info{node_id=\"%s\"} 1\n",
             mg_gens_current(s->gens)->cfg->cluster.node_id);
    mg_buf_append_str(&b, line);
    if (s->control) {
        mg_control_stats_t cs;
        mg_control_stats(s->control, &cs);
        snprintf(line, sizeof(line),
                 "# HELP moongate_cluster_control_stalled 1 while the control log's follower is"
                 " stopped at an entry this binary cannot apply (/status cluster.control).\n"
                 "# TYPE moongate_cluster_control_stalled gauge\n"
                 "moongate_cluster_control_stalled %d\n",
                 cs.stalled_id != 0);
        mg_buf_append_str(&b, line);
    }
    if (s->redis) {
        snprintf(line, sizeof(line),
                 "# HELP moongate_cluster_degraded 1 while a shared component is unreachable.\n"
                 "# TYPE moongate_cluster_degraded gauge\n"
                 "moongate_cluster_degraded{component=\"redis\"} %d\n",
                 !mg_redis_up(s->redis));
        mg_buf_append_str(&b, line);
        mg_shared_stats_t ls;
        mg_shared_stats(s->shared, &ls);
        mg_buf_append_str(&b, "# HELP moongate_cluster_limits_degraded_total Requests admitted "
                              "or refused without Redis, by the degraded mode in force.\n"
                              "# TYPE moongate_cluster_limits_degraded_total counter\n");
        for (int m = 0; m < 3; m++) {
            snprintf(line, sizeof(line),
                     "moongate_cluster_limits_degraded_total{mode=\"%s\"} %llu\n",
                     mg_cluster_degraded_name((mg_cluster_degraded_t)m), ls.degraded[m]);
            mg_buf_append_str(&b, line);
        }
        snprintf(line, sizeof(line),
                 "# HELP moongate_cluster_limits_total Shared limit reservations, by result.\n"
                 "# TYPE moongate_cluster_limits_total counter\n"
                 "moongate_cluster_limits_total{result=\"reserved\"} %llu\n"
                 "moongate_cluster_limits_total{result=\"refused\"} %llu\n"
                 "moongate_cluster_limits_total{result=\"unavailable\"} %llu\n"
                 "# HELP moongate_cluster_limits_reconciled_total Admissions made without "
                 "Redis and given back to it when it answered again.\n"
                 "# TYPE moongate_cluster_limits_reconciled_total counter\n"
                 "moongate_cluster_limits_reconciled_total %llu\n",
                 ls.reserved, ls.refused, ls.unavailable, ls.reconciled);
        mg_buf_append_str(&b, line);
    }
    if (s->otlp) append_otlp_metrics(&b, s->otlp);
    mg_buf_append_str(&b, "# HELP moongate_queue_length Tasks waiting, by priority.\n"
                          "# TYPE moongate_queue_length gauge\n");
    for (int p = 0; p < MG_PRIO_COUNT; p++) {
        snprintf(line, sizeof(line), "moongate_queue_length{priority=\"%s\"} %u\n",
                 mg_priority_name((mg_priority_t)p), ss.queued_by_prio[p]);
        mg_buf_append_str(&b, line);
    }
    unsigned depth = 0;
    for (int p = 0; p < MG_PRIO_COUNT; p++) depth += ss.queued_by_prio[p];
    snprintf(line, sizeof(line),
             "# HELP sidecar_queue_depth Tasks waiting for a slot.\n"
             "# TYPE sidecar_queue_depth gauge\nsidecar_queue_depth %u\n",
             depth);
    mg_buf_append_str(&b, line);
    const mg_config_t *cfg = mg_gens_current(s->gens)->cfg;
    snprintf(
        line, sizeof(line),
        "# HELP moongate_queue_capacity Tasks the queue holds (scheduler.max_queued_tasks).\n"
        "# TYPE moongate_queue_capacity gauge\nmoongate_queue_capacity %d\n"
        "# HELP moongate_running_capacity Tasks that run at once (scheduler.max_running_tasks).\n"
        "# TYPE moongate_running_capacity gauge\nmoongate_running_capacity %d\n",
        cfg->scheduler.max_queued_tasks, cfg->scheduler.max_running_tasks);
    mg_buf_append_str(&b, line);
    snprintf(
        line, sizeof(line),
        "# HELP moongate_running_tasks Tasks holding a slot.\n# TYPE moongate_running_tasks gauge\n"
        "moongate_running_tasks %u\n",
        ss.running);
    mg_buf_append_str(&b, line);
    snprintf(line, sizeof(line),
             "# HELP moongate_backpressure_level 0 normal, 1..3 shedding.\n"
             "# TYPE moongate_backpressure_level gauge\nmoongate_backpressure_level %d\n",
             ss.level);
    mg_buf_append_str(&b, line);
    store_metrics(s, &b);
    if (s->sessions) mg_sessions_metrics(s->sessions, &b);
    snprintf(line, sizeof(line),
             "# HELP moongate_lua_bytes Memory of the current generation's Lua state.\n"
             "# TYPE moongate_lua_bytes gauge\nmoongate_lua_bytes %zu\n",
             mg_gen_lua_bytes(mg_gens_current(s->gens)));
    mg_buf_append_str(&b, line);
    mg_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.data, b.len);
    mg_buf_free(&b);
}
