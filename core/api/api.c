/* api: paths to handlers, the error shape, and the endpoints the gateway answers
 * itself; see api.h. */
#include "api/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "admin/admin.h"
#include "base/json.h"
#include "base/crypto.h"
#include "base/log.h"
#include "pipeline/proxy.h"
#include "base/secret.h"
#include "pipeline/tasks.h"

const char *mg_api_error_type(int status)
{
    if (status == 429) return "rate_limit_error";
    if (status == 401) return "authentication_error";
    if (status == 403) return "permission_error";
    if (status >= 500) return "api_error";
    return "invalid_request_error";
}

static void log_simple(mg_http_req_t *req, int status, const char *error_code)
{
    mg_log_level_t lv = status >= 500 ? MG_LOG_WARN : MG_LOG_INFO;
    if (!mg_log_enabled(lv)) return;
    mg_logline_t l;
    mg_log_begin(&l, lv, "request");
    mg_log_str(&l, "request_id", req->request_id);
    mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
    mg_log_str(&l, "path", req->path);
    mg_log_int(&l, "status", status);
    if (error_code) mg_log_str(&l, "error", error_code);
    mg_log_end(&l);
}

static void respond_logged(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep, int status,
                           const char *extra, const char *body, size_t len)
{
    double secs = (double)(uv_now(s->loop) - req->start_ms) / 1000.0;
    mg_metrics_request(&s->metrics, ep, status, secs);
    log_simple(req, status, NULL);
    mg_http_respond(req, status, "application/json", extra, body, len);
}

void mg_api_error(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep, int status,
                  const char *code, const char *message, int retry_after_ms)
{
    char esc[1024];
    char body[1536];
    char extra[64] = "";
    mg_json_escape(esc, sizeof(esc), message, strlen(message));
    int n = snprintf(body, sizeof(body),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\","
                     "\"request_id\":\"%s\"",
                     esc, mg_api_error_type(status), code, req->request_id);
    if (retry_after_ms > 0) {
        n += snprintf(body + n, sizeof(body) - (size_t)n, ",\"retry_after_ms\":%d", retry_after_ms);
        snprintf(extra, sizeof(extra), "Retry-After: %d\r\n", (retry_after_ms + 999) / 1000);
    }
    n += snprintf(body + n, sizeof(body) - (size_t)n, "}}");
    double secs = (double)(uv_now(s->loop) - req->start_ms) / 1000.0;
    mg_metrics_request(&s->metrics, ep, status, secs);
    log_simple(req, status, code);
    mg_http_respond(req, status, "application/json", extra, body, (size_t)n);
}

static void respond_json(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep, int status,
                         cJSON *obj)
{
    mg_buf_t text = {0};
    int rc = mg_json_print(obj, &text);
    cJSON_Delete(obj);
    if (rc != 0) {
        mg_buf_free(&text);
        mg_api_error(s, req, ep, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    respond_logged(s, req, ep, status, NULL, text.data, text.len);
    mg_buf_free(&text);
}

/* ------------------------------------------------------------------------ */
/* Endpoints answered by the gateway                                         */
/* ------------------------------------------------------------------------ */

static void handle_models(mg_server_t *s, mg_http_req_t *req)
{
    mg_gen_t *g = s->gen;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    /* a stable `created`: when this generation's config was loaded is as honest as any */
    for (size_t i = 0; i < g->cfg->n_models; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "id", g->cfg->models[i].name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", (double)s->started_at);
        cJSON_AddStringToObject(m, "owned_by", "moongate");
        cJSON_AddItemToArray(data, m);
    }
    respond_json(s, req, MG_EP_MODELS, 200, root);
}

/* Ready: config loaded, storage open, at least one provider configured. */
static void handle_ready(mg_server_t *s, mg_http_req_t *req)
{
    int providers = (int)s->gen->cfg->n_providers;
    int ready = s->store && providers > 0 && !s->stopping;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", ready ? "ready" : "not_ready");
    cJSON *checks = cJSON_AddObjectToObject(root, "checks");
    cJSON_AddBoolToObject(checks, "config", 1);
    cJSON_AddBoolToObject(checks, "storage", s->store != NULL);
    cJSON_AddBoolToObject(checks, "providers", providers > 0);
    cJSON_AddBoolToObject(checks, "accepting", !s->stopping);
    respond_json(s, req, MG_EP_OTHER, ready ? 200 : 503, root);
}

static void handle_status(mg_server_t *s, mg_http_req_t *req)
{
    mg_gen_t *g = s->gen;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", s->stopping ? "stopping" : "ok");
    cJSON_AddNumberToObject(root, "generation", g->id);
    cJSON *rl = cJSON_AddObjectToObject(root, "reload");
    cJSON_AddStringToObject(rl, "result", s->reload_result);
    if (s->reload_error[0]) cJSON_AddStringToObject(rl, "error", s->reload_error);
    else cJSON_AddNullToObject(rl, "error");
    if (s->reload_at) cJSON_AddNumberToObject(rl, "at", (double)s->reload_at);
    cJSON_AddNumberToObject(root, "in_flight", s->in_flight);
    cJSON_AddNumberToObject(root, "connections", (double)s->api.n_conns);
    cJSON_AddNumberToObject(root, "upstream_transfers", (double)mg_upstream_active(s->upstream));
    cJSON_AddNumberToObject(root, "uptime_s", (double)(time(NULL) - s->started_at));
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
        const mg_provider_state_t *st = mg_pool_get(&s->pool, p->id);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", p->id);
        cJSON_AddStringToObject(o, "adapter", p->adapter);
        cJSON_AddStringToObject(o, "pool", p->pool);
        cJSON_AddBoolToObject(o, "local", p->local);
        cJSON_AddBoolToObject(o, "available", mg_pool_available(st, uv_now(s->loop)));
        cJSON_AddNumberToObject(o, "in_flight", st ? st->in_flight : 0);
        cJSON_AddNumberToObject(o, "requests_total", st ? (double)st->requests_total : 0);
        cJSON_AddNumberToObject(o, "failures_total", st ? (double)st->failures_total : 0);
        cJSON_AddNumberToObject(o, "consecutive_failures", st ? st->consecutive_failures : 0);
        cJSON_AddItemToArray(ps, o);
    }
    cJSON *ms = cJSON_AddArrayToObject(root, "models");
    for (size_t i = 0; i < g->cfg->n_models; i++)
        cJSON_AddItemToArray(ms, cJSON_CreateString(g->cfg->models[i].name));
    respond_json(s, req, MG_EP_OTHER, 200, root);
}

/* ------------------------------------------------------------------------ */
/* Admin read endpoints under /api/v2                                         */
/* ------------------------------------------------------------------------ */

enum { ADMIN_REFUSED = 0, ADMIN_PLATFORM = 1, ADMIN_TENANT = 2 };

/* Bearer $MOONGATE_ADMIN_TOKEN (or the Sidecar's SIDECAR_ADMIN_TOKEN), compared as SHA-256
 * digests in constant time: ADMIN_PLATFORM. A token shaped like a tenant admin token
 * ("mgt-...") is ADMIN_TENANT: the admin worker resolves it (admin_scope.c). Otherwise
 * answered 401 and ADMIN_REFUSED. */
static int admin_allowed(mg_server_t *s, mg_http_req_t *req)
{
    const char *token = getenv("MOONGATE_ADMIN_TOKEN");
    if (!token || !*token) token = getenv("SIDECAR_ADMIN_TOKEN");
    if (!token || !*token) {
        mg_api_error(s, req, MG_EP_OTHER, 401, "AUTH_FAILED",
                     "the admin API is disabled: set MOONGATE_ADMIN_TOKEN", 0);
        return ADMIN_REFUSED;
    }
    const char *auth = mg_http_header(req, "Authorization");
    const char *given = auth && strncasecmp(auth, "Bearer ", 7) == 0 ? auth + 7 : "";
    char want_d[65], given_d[65];
    mg_sha256_hex(token, strlen(token), want_d);
    mg_sha256_hex(given, strlen(given), given_d);
    if (mg_const_time_eq(want_d, 64, given_d, 64)) return ADMIN_PLATFORM;
    if (strncmp(given, "mgt-", 4) == 0 && strlen(given) < 128) return ADMIN_TENANT;
    mg_api_error(s, req, MG_EP_OTHER, 401, "AUTH_FAILED", "invalid admin token", 0);
    return ADMIN_REFUSED;
}

/* The tenant admin token presented (admin_allowed said ADMIN_TENANT). */
static const char *bearer(const mg_http_req_t *req)
{
    const char *auth = mg_http_header(req, "Authorization");
    return auth && strncasecmp(auth, "Bearer ", 7) == 0 ? auth + 7 : "";
}

static const char *provider_status(const mg_provider_state_t *st, uint64_t now)
{
    if (!st) return "active";
    if (st->disabled) return "disabled";
    if (mg_cooldown_cooling(&st->cooldown, now)) return "cooldown";
    return "active";
}

/* The provider's routes with a breaker of their own: [{ model, breaker }]. */
static void add_route_breakers(cJSON *o, const mg_pool_t *pool, const char *id, uint64_t now)
{
    cJSON *routes = cJSON_AddArrayToObject(o, "routes");
    for (size_t i = 0; i < pool->routes.n; i++) {
        const mg_route_state_t *r = &pool->routes.items[i];
        if (strcmp(r->provider, id) != 0) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "model", r->model);
        cJSON_AddStringToObject(x, "breaker",
                                mg_breaker_state_name(mg_breaker_state(&r->breaker, now)));
        cJSON_AddNumberToObject(x, "consecutive_failures", r->breaker.consecutive_failures);
        cJSON_AddItemToArray(routes, x);
    }
}

static cJSON *provider_json(mg_server_t *s, const mg_provider_conf_t *p, uint64_t now)
{
    mg_provider_state_t *st = mg_pool_get(&s->pool, p->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", p->id);
    cJSON_AddStringToObject(o, "name", p->name ? p->name : p->id);
    cJSON_AddStringToObject(o, "endpoint_url", p->base_url);
    char masked[32] = "";
    if (p->api_key) mg_secret_mask(p->api_key, masked);
    if (p->api_key) cJSON_AddStringToObject(o, "api_key", masked);
    else cJSON_AddNullToObject(o, "api_key");
    cJSON_AddStringToObject(o, "adapter", p->adapter);
    cJSON_AddStringToObject(o, "pool", p->pool);
    cJSON_AddStringToObject(o, "status", provider_status(st, now));
    cJSON_AddStringToObject(o, "source", p->source ? p->source : "file");
    if (p->model_prefix) cJSON_AddStringToObject(o, "model_prefix", p->model_prefix);
    cJSON_AddNumberToObject(o, "rpm_limit", p->rpm_limit);
    if (p->tpm_limit) cJSON_AddNumberToObject(o, "tpm_limit", p->tpm_limit);
    else cJSON_AddNullToObject(o, "tpm_limit");
    cJSON_AddNumberToObject(o, "weight", p->weight);
    cJSON_AddNumberToObject(o, "cost_per_1k_tokens", p->cost_per_1k_tokens);
    cJSON_AddBoolToObject(o, "local", p->local);
    if (!st) return o;
    mg_health_snapshot_t hs;
    mg_health_snapshot(&st->health, now, &hs);
    cJSON_AddStringToObject(o, "health", mg_health_state_name(hs.state));
    /* the provider as a whole: its own breaker, or every one of its routes' */
    cJSON_AddStringToObject(o, "breaker",
                            mg_breaker_state_name(mg_pool_provider_breaker(&s->pool, st, now)));
    cJSON_AddNumberToObject(o, "current_rpm", mg_limiter_rpm_used(&st->limiter, now));
    cJSON_AddNumberToObject(o, "in_flight", st->in_flight);
    cJSON_AddNumberToObject(o, "success_rate_5m", hs.window_samples ? hs.window_success_rate : 1.0);
    cJSON_AddNumberToObject(o, "consecutive_failures", hs.consecutive_failures);
    cJSON_AddNumberToObject(o, "cooldown_remaining_s",
                            (double)(mg_cooldown_remaining_ms(&st->cooldown, now) / 1000));
    cJSON_AddNumberToObject(o, "consecutive_429", st->cooldown.consecutive_429);
    cJSON_AddNumberToObject(o, "requests_total", (double)st->requests_total);
    add_route_breakers(o, &s->pool, p->id, now);
    if (st->load.known) {
        cJSON *load = cJSON_AddObjectToObject(o, "load");
        cJSON_AddNumberToObject(load, "running", st->load.running);
        cJSON_AddNumberToObject(load, "waiting", st->load.waiting);
        if (st->load.kv_cache >= 0) cJSON_AddNumberToObject(load, "kv_cache", st->load.kv_cache);
    }
    return o;
}

static void handle_admin_providers(mg_server_t *s, mg_http_req_t *req, const char *id)
{
    const mg_config_t *cfg = s->gen->cfg;
    uint64_t now = uv_now(s->loop);
    if (id) {
        const mg_provider_conf_t *p = mg_config_provider(cfg, id);
        if (!p) {
            mg_api_error(s, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such provider", 0);
            return;
        }
        respond_json(s, req, MG_EP_OTHER, 200, provider_json(s, p, now));
        return;
    }
    char pool[16] = "", status[16] = "";
    if (req->query) {
        /* ?pool=main&status=active */
        const char *q = req->query;
        const char *pp = strstr(q, "pool=");
        const char *sp = strstr(q, "status=");
        if (pp) sscanf(pp + 5, "%15[^&]", pool);
        if (sp) sscanf(sp + 7, "%15[^&]", status);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, "providers");
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        if (pool[0] && strcmp(pool, p->pool) != 0) continue;
        if (status[0] && strcmp(status, provider_status(mg_pool_get(&s->pool, p->id), now)) != 0)
            continue;
        cJSON_AddItemToArray(list, provider_json(s, p, now));
    }
    cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
    respond_json(s, req, MG_EP_OTHER, 200, root);
}

static void handle_admin_pools(mg_server_t *s, mg_http_req_t *req)
{
    const mg_config_t *cfg = s->gen->cfg;
    uint64_t now = uv_now(s->loop);
    cJSON *root = cJSON_CreateObject();
    const char *pools[2] = {"main", "fallback"};
    for (int k = 0; k < 2; k++) {
        int total = 0, active = 0, cooling = 0, disabled = 0;
        long long capacity = 0, load = 0;
        for (size_t i = 0; i < cfg->n_providers; i++) {
            const mg_provider_conf_t *p = &cfg->providers[i];
            if (strcmp(p->pool, pools[k]) != 0) continue;
            mg_provider_state_t *st = mg_pool_get(&s->pool, p->id);
            const char *state = provider_status(st, now);
            total++;
            active += strcmp(state, "active") == 0;
            cooling += strcmp(state, "cooldown") == 0;
            disabled += strcmp(state, "disabled") == 0;
            capacity += p->rpm_limit;
            if (st) load += mg_limiter_rpm_used(&st->limiter, now);
        }
        cJSON *o = cJSON_AddObjectToObject(root, pools[k]);
        cJSON_AddNumberToObject(o, "total", total);
        cJSON_AddNumberToObject(o, "active", active);
        cJSON_AddNumberToObject(o, "cooldown", cooling);
        cJSON_AddNumberToObject(o, "disabled", disabled);
        cJSON_AddNumberToObject(o, "total_rpm_capacity", (double)capacity);
        cJSON_AddNumberToObject(o, "current_load_rpm", (double)load);
    }
    respond_json(s, req, MG_EP_OTHER, 200, root);
}

static void handle_admin_cooldowns(mg_server_t *s, mg_http_req_t *req)
{
    const mg_config_t *cfg = s->gen->cfg;
    uint64_t now = uv_now(s->loop);
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    uint64_t now_unix = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, "cooldowns");
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        mg_provider_state_t *st = mg_pool_get(&s->pool, p->id);
        if (!st || !mg_cooldown_cooling(&st->cooldown, now)) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "provider_id", p->id);
        cJSON_AddStringToObject(o, "pool", p->pool);
        cJSON_AddNumberToObject(o, "remaining_seconds",
                                (double)((mg_cooldown_remaining_ms(&st->cooldown, now) + 999) / 1000));
        cJSON_AddNumberToObject(o, "cooldown_until_ms",
                                (double)mg_cooldown_until_unix_ms(&st->cooldown, now, now_unix));
        cJSON_AddNumberToObject(o, "consecutive_429", st->cooldown.consecutive_429);
        cJSON_AddNumberToObject(o, "cooldowns_total", (double)st->cooldowns_total);
        cJSON_AddItemToArray(list, o);
    }
    cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
    respond_json(s, req, MG_EP_OTHER, 200, root);
}

/* GET /api/v2/{providers,pools,cooldowns}; write operations come with the admin API proper. */
static void handle_admin(mg_server_t *s, mg_http_req_t *req)
{
    int who = admin_allowed(s, req);
    if (who == ADMIN_REFUSED) return;
    const char *sub = req->path + strlen("/api/v2/");
    if (who == ADMIN_TENANT) {
        mg_admin_handle(s, req, bearer(req)); /* resolved and scoped on the admin worker */
    } else if (req->method != HTTP_GET) {
        mg_admin_handle(s, req, NULL); /* writes */
    } else if (strcmp(sub, "providers") == 0) {
        mg_admin_audit(s, req, "provider.list", NULL, 200);
        handle_admin_providers(s, req, NULL);
    } else if (strncmp(sub, "providers/", 10) == 0 && sub[10] && !strchr(sub + 10, '/')) {
        char target[160];
        snprintf(target, sizeof(target), "provider:%.140s", sub + 10);
        mg_admin_audit(s, req, "provider.get", target,
                       mg_config_provider(s->gen->cfg, sub + 10) ? 200 : 404);
        handle_admin_providers(s, req, sub + 10);
    } else if (strcmp(sub, "pools") == 0) {
        mg_admin_audit(s, req, "pools.read", NULL, 200);
        handle_admin_pools(s, req);
    } else if (strcmp(sub, "cooldowns") == 0) {
        mg_admin_audit(s, req, "cooldowns.read", NULL, 200);
        handle_admin_cooldowns(s, req);
    } else {
        mg_admin_handle(s, req, NULL); /* the other reads (404 for unknown endpoints) */
    }
}

/* ------------------------------------------------------------------------ */
/* Routing                                                                   */
/* ------------------------------------------------------------------------ */

typedef enum { ROUTE_GET, ROUTE_POST } route_method_t;

typedef struct {
    const char *path;
    route_method_t method;
    mg_endpoint_t ep;
    void (*fn)(mg_server_t *s, mg_http_req_t *req);
} route_t;

static void handle_chat(mg_server_t *s, mg_http_req_t *req)
{
    mg_proxy_handle(s, req, MG_EP_CHAT);
}

static void handle_completions(mg_server_t *s, mg_http_req_t *req)
{
    mg_proxy_handle(s, req, MG_EP_COMPLETIONS);
}

static void handle_embeddings(mg_server_t *s, mg_http_req_t *req)
{
    mg_proxy_handle(s, req, MG_EP_EMBEDDINGS);
}

static void handle_health(mg_server_t *s, mg_http_req_t *req)
{
    static const char body[] = "{\"status\":\"ok\"}";
    respond_logged(s, req, MG_EP_OTHER, 200, NULL, body, sizeof(body) - 1);
}

static const route_t routes[] = {
    {"/v1/chat/completions", ROUTE_POST, MG_EP_CHAT, handle_chat},
    {"/v1/completions", ROUTE_POST, MG_EP_COMPLETIONS, handle_completions},
    {"/v1/embeddings", ROUTE_POST, MG_EP_EMBEDDINGS, handle_embeddings},
    {"/v1/models", ROUTE_GET, MG_EP_MODELS, handle_models},
    {"/health", ROUTE_GET, MG_EP_OTHER, handle_health},
    {"/ready", ROUTE_GET, MG_EP_OTHER, handle_ready},
    {"/health/ready", ROUTE_GET, MG_EP_OTHER, handle_ready},
    {"/status", ROUTE_GET, MG_EP_OTHER, handle_status},
};

static void tasks_as_admin(mg_server_t *s, mg_http_req_t *req)
{
    int who = admin_allowed(s, req);
    if (who == ADMIN_PLATFORM)
        mg_tasks_handle(s, req, req->path + 10);
    else if (who == ADMIN_TENANT)
        mg_api_error(s, req, MG_EP_OTHER, 403, "PERMISSION_DENIED",
                     "tasks in flight need the platform admin token", 0);
}

void mg_api_handle(void *server, mg_http_req_t *req)
{
    mg_server_t *s = server;
    size_t path_len = strlen(req->path);
    while (path_len > 1 && req->path[path_len - 1] == '/') req->path[--path_len] = '\0';
    if (strncmp(req->path, "/v1/tasks/", 10) == 0 && req->path[10] && !strchr(req->path + 10, '/')) {
        if (req->method != HTTP_GET && req->method != HTTP_DELETE)
            mg_api_error(s, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED", "use GET or DELETE", 0);
        /* with auth on, other people's tasks are the platform operator's business only */
        else if (!s->gen->cfg->auth_enabled)
            mg_tasks_handle(s, req, req->path + 10);
        else
            tasks_as_admin(s, req);
        return;
    }
    if (strcmp(req->path, "/v1/tasks") == 0) {
        /* the task's own request checks the caller's key like any inference request */
        if (req->method != HTTP_POST)
            mg_api_error(s, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED", "use POST", 0);
        else
            mg_tasks_submit(s, req);
        return;
    }
    if (strncmp(req->path, "/api/v2/", 8) == 0) {
        handle_admin(s, req);
        return;
    }
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(routes[i].path, req->path) != 0) continue;
        int want = routes[i].method == ROUTE_POST ? HTTP_POST : HTTP_GET;
        if (req->method != want) {
            mg_api_error(s, req, routes[i].ep, 405, "METHOD_NOT_ALLOWED",
                         routes[i].method == ROUTE_POST ? "use POST" : "use GET", 0);
            return;
        }
        routes[i].fn(s, req);
        return;
    }
    mg_api_error(s, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such endpoint", 0);
}

/* The store's write path (store.h): queue, parked writes, commits, lock waits, failures. */
static void store_metrics(mg_server_t *s, mg_buf_t *b)
{
    if (!s->store) return;
    mg_store_stats_t st;
    mg_store_stats(s->store, &st);
    char text[1400];
    snprintf(text, sizeof(text),
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
}

void mg_api_handle_metrics(void *server, mg_http_req_t *req)
{
    mg_server_t *s = server;
    if (strcmp(req->path, "/metrics") != 0) {
        mg_http_respond(req, 404, "text/plain", NULL, "not found\n", 10);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    mg_sched_stats_t pre;
    mg_sched_stats(s->sched, &pre);
    s->metrics.memory_reserved_bytes = pre.mem_reserved_bytes;
    if (mg_metrics_render(&s->metrics, &s->pool, s->in_flight, s->gen->id, uv_now(s->loop), &text,
                          &len) != 0) {
        mg_http_respond(req, 500, "text/plain", NULL, "out of memory\n", 14);
        return;
    }
    /* the scheduler's gauges */
    mg_sched_stats_t ss;
    mg_sched_stats(s->sched, &ss);
    mg_buf_t b = {text, len, len + 1};
    char line[160];
    mg_buf_append_str(&b, "# HELP moongate_queue_length Tasks waiting, by priority.\n"
                          "# TYPE moongate_queue_length gauge\n");
    for (int p = 0; p < MG_PRIO_COUNT; p++) {
        snprintf(line, sizeof(line), "moongate_queue_length{priority=\"%s\"} %u\n",
                 mg_priority_name((mg_priority_t)p), ss.queued_by_prio[p]);
        mg_buf_append_str(&b, line);
    }
    snprintf(line, sizeof(line),
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
    snprintf(line, sizeof(line),
             "# HELP moongate_lua_bytes Memory of the current generation's Lua state.\n"
             "# TYPE moongate_lua_bytes gauge\nmoongate_lua_bytes %zu\n",
             mg_gen_lua_bytes(s->gen));
    mg_buf_append_str(&b, line);
    mg_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.data, b.len);
    mg_buf_free(&b);
}
