/* front: the admin API's front door on the loop thread: the admin token checked (its digest
 * kept from start-up, compared in constant time), the live reads of provider state answered
 * at once (GET /api/v2/providers[/{id}], /pools, /cooldowns: they read the pool, which only
 * the loop may), and every other request queued for the worker (admin.c). */
#include "admin/req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "base/secret.h"
#include "obs/answer.h"
#include "obs/health_view.h"
#include "route/persist.h"

mg_admin_t *mg_admin_new(const mg_admin_deps_t *d)
{
    mg_admin_t *a = calloc(1, sizeof(*a));
    if (!a) return NULL;
    a->d = *d;
    a->d.token = NULL; /* only its digest is kept */
    if (d->token && *d->token) mg_sha256_hex(d->token, strlen(d->token), a->token_digest);
    return a;
}

void mg_admin_free(mg_admin_t *a)
{
    free(a);
}

enum { ADMIN_REFUSED = 0, ADMIN_PLATFORM = 1, ADMIN_TENANT = 2 };

/* Bearer <the platform admin token>, compared as SHA-256 digests in constant time:
 * ADMIN_PLATFORM. A token shaped like a tenant admin token ("mgt-...") is ADMIN_TENANT: the
 * admin worker resolves it (scope.c). Otherwise answered 401 and ADMIN_REFUSED; a wrong
 * token is also audited and counted against the client's address (authfail.h), and an
 * address past its failures is answered 429 before its token is looked at. */
static int admin_allowed(mg_admin_t *a, mg_http_req_t *req)
{
    if (!a->token_digest[0]) {
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 401, "AUTH_FAILED",
                        "the admin API is disabled: set MOONGATE_ADMIN_TOKEN", 0);
        return ADMIN_REFUSED;
    }
    char peer[80], addr[64];
    uint64_t now = uv_now(a->d.loop), retry_ms = 0;
    mg_http_peer(req, peer, sizeof(peer));
    mg_authfail_addr(peer, addr, sizeof(addr));
    if (mg_authfail_blocked(&a->fails, addr, now, &retry_ms)) {
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 429, "RATE_LIMITED",
                        "too many failed admin sign-ins from this address", retry_ms);
        return ADMIN_REFUSED;
    }
    const char *auth = mg_http_header(req, "Authorization");
    const char *given = auth && strncasecmp(auth, "Bearer ", 7) == 0 ? auth + 7 : "";
    char given_d[65];
    mg_sha256_hex(given, strlen(given), given_d);
    if (mg_const_time_eq(a->token_digest, 64, given_d, 64)) return ADMIN_PLATFORM;
    if (strncmp(given, "mgt-", 4) == 0 && strlen(given) < 128) return ADMIN_TENANT;
    if (*given) { /* a wrong token is a guess; no token at all is not */
        mg_authfail_count(&a->fails, addr, now);
        mg_admin_audit_auth_failed(a, req);
    }
    mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 401, "AUTH_FAILED", "invalid admin token", 0);
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

static cJSON *provider_json(mg_admin_t *a, const mg_provider_conf_t *p, uint64_t now)
{
    mg_provider_state_t *st = mg_pool_get(a->d.pool, p->id);
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
    mg_health_view(o, &st->health, now);
    /* the provider as a whole: its own breaker, or every one of its routes' */
    cJSON_AddStringToObject(o, "breaker",
                            mg_breaker_state_name(mg_pool_provider_breaker(a->d.pool, st, now)));
    cJSON_AddNumberToObject(o, "current_rpm", mg_limiter_rpm_used(&st->limiter, now));
    cJSON_AddNumberToObject(o, "in_flight", st->in_flight);
    cJSON_AddNumberToObject(o, "success_rate_5m", hs.window_samples ? hs.window_success_rate : 1.0);
    cJSON_AddNumberToObject(o, "consecutive_failures", hs.consecutive_failures);
    cJSON_AddNumberToObject(o, "cooldown_remaining_s",
                            (double)(mg_cooldown_remaining_ms(&st->cooldown, now) / 1000));
    cJSON_AddNumberToObject(o, "consecutive_429", st->cooldown.consecutive_429);
    if (mg_cooldown_cooling(&st->cooldown, now))
        cJSON_AddNumberToObject(
            o, "cooldown_until_ms",
            (double)mg_cooldown_until_unix_ms(&st->cooldown, now, mg_unix_ms()));
    else cJSON_AddNullToObject(o, "cooldown_until_ms");
    cJSON_AddNumberToObject(o, "cooldowns_total", (double)st->cooldowns_total);
    if (hs.window_ttft_ms > 0) cJSON_AddNumberToObject(o, "ttft_ms", hs.window_ttft_ms);
    else cJSON_AddNullToObject(o, "ttft_ms");
    cJSON_AddNumberToObject(o, "requests_total", (double)st->requests_total);
    cJSON_AddNumberToObject(o, "failures_total", (double)st->failures_total);
    add_route_breakers(o, a->d.pool, p->id, now);
    if (st->load.known) {
        cJSON *load = cJSON_AddObjectToObject(o, "load");
        cJSON_AddNumberToObject(load, "running", st->load.running);
        cJSON_AddNumberToObject(load, "waiting", st->load.waiting);
        if (st->load.kv_cache >= 0) cJSON_AddNumberToObject(load, "kv_cache", st->load.kv_cache);
    }
    return o;
}

/* The providers of `pool` (NULL: every pool) in `status` ("": any), as a list. */
static void answer_provider_list(mg_admin_t *a, mg_http_req_t *req, const char *pool,
                                 const char *status)
{
    const mg_config_t *cfg = mg_gens_current(a->d.gens)->cfg;
    uint64_t now = uv_now(a->d.loop);
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, "providers");
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        if (pool && strcmp(pool, p->pool) != 0) continue;
        if (status[0] && strcmp(status, provider_status(mg_pool_get(a->d.pool, p->id), now)) != 0)
            continue;
        cJSON_AddItemToArray(list, provider_json(a, p, now));
    }
    cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
    mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, root);
}

static void handle_admin_providers(mg_admin_t *a, mg_http_req_t *req, const char *id)
{
    const mg_config_t *cfg = mg_gens_current(a->d.gens)->cfg;
    if (id) {
        const mg_provider_conf_t *p = mg_config_provider(cfg, id);
        if (!p) {
            mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such provider",
                            0);
            return;
        }
        mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, provider_json(a, p, uv_now(a->d.loop)));
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
    answer_provider_list(a, req, pool[0] ? pool : NULL, status);
}

/* GET /api/v2/pools/{pool}/providers (the Sidecar's path): the pool's providers. */
static void handle_admin_pool_providers(mg_admin_t *a, mg_http_req_t *req, const char *pool)
{
    if (strcmp(pool, "main") != 0 && strcmp(pool, "fallback") != 0) {
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 404, "NOT_FOUND",
                        "no such pool (main or fallback)", 0);
        return;
    }
    answer_provider_list(a, req, pool, "");
}

cJSON *mg_admin_providers_view(mg_admin_t *a)
{
    const mg_config_t *cfg = mg_gens_current(a->d.gens)->cfg;
    uint64_t now = uv_now(a->d.loop);
    cJSON *list = cJSON_CreateArray();
    for (size_t i = 0; list && i < cfg->n_providers; i++)
        cJSON_AddItemToArray(list, provider_json(a, &cfg->providers[i], now));
    return list;
}

cJSON *mg_admin_pools_view(mg_admin_t *a)
{
    const mg_config_t *cfg = mg_gens_current(a->d.gens)->cfg;
    uint64_t now = uv_now(a->d.loop);
    cJSON *root = cJSON_CreateObject();
    const char *pools[2] = {"main", "fallback"};
    for (int k = 0; k < 2; k++) {
        int total = 0, active = 0, cooling = 0, disabled = 0;
        long long capacity = 0, load = 0;
        for (size_t i = 0; i < cfg->n_providers; i++) {
            const mg_provider_conf_t *p = &cfg->providers[i];
            if (strcmp(p->pool, pools[k]) != 0) continue;
            mg_provider_state_t *st = mg_pool_get(a->d.pool, p->id);
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
    return root;
}

static void handle_admin_pools(mg_admin_t *a, mg_http_req_t *req)
{
    mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, mg_admin_pools_view(a));
}

static void handle_admin_cooldowns(mg_admin_t *a, mg_http_req_t *req)
{
    const mg_config_t *cfg = mg_gens_current(a->d.gens)->cfg;
    uint64_t now = uv_now(a->d.loop);
    uint64_t now_unix = mg_unix_ms();
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, "cooldowns");
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        mg_provider_state_t *st = mg_pool_get(a->d.pool, p->id);
        if (!st || !mg_cooldown_cooling(&st->cooldown, now)) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "provider_id", p->id);
        cJSON_AddStringToObject(o, "pool", p->pool);
        cJSON_AddNumberToObject(
            o, "remaining_seconds",
            (double)((mg_cooldown_remaining_ms(&st->cooldown, now) + 999) / 1000));
        cJSON_AddNumberToObject(o, "cooldown_until_ms",
                                (double)mg_cooldown_until_unix_ms(&st->cooldown, now, now_unix));
        cJSON_AddNumberToObject(o, "consecutive_429", st->cooldown.consecutive_429);
        cJSON_AddNumberToObject(o, "cooldowns_total", (double)st->cooldowns_total);
        cJSON_AddItemToArray(list, o);
    }
    cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
    mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, root);
}

/* "{pool}/providers" with a pool name of at most 15 characters */
static int pool_providers_path(const char *rest)
{
    const char *slash = strchr(rest, '/');
    return slash && slash > rest && slash - rest < 16 && strcmp(slash, "/providers") == 0;
}

/* DELETE /api/v2/cooldowns/{provider_id}: the provider serves again now, its 429 count back
 * to 0 (memory first: it is the loop's; the store's row follows through the writer). */
static void handle_clear_cooldown(mg_admin_t *a, mg_http_req_t *req, const char *id)
{
    char target[160];
    snprintf(target, sizeof(target), "provider:%.140s", id);
    const mg_provider_conf_t *p = mg_config_provider(mg_gens_current(a->d.gens)->cfg, id);
    mg_provider_state_t *st = p ? mg_pool_get(a->d.pool, p->id) : NULL;
    if (!st) {
        mg_admin_audit(a, req, "cooldown.clear", target, 404);
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such provider", 0);
        return;
    }
    int was = mg_cooldown_cooling(&st->cooldown, uv_now(a->d.loop));
    mg_cooldown_init(&st->cooldown);
    mg_pool_changed(st);
    mg_persist_cooldown_cleared(a->d.store, st);
    mg_admin_audit(a, req, "cooldown.clear", target, 200);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "provider_id", p->id);
    cJSON_AddBoolToObject(o, "was_cooling", was);
    cJSON_AddStringToObject(o, "status", provider_status(st, uv_now(a->d.loop)));
    mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, o);
}

/* ---- the full-mode logging window (obs/fulllog.h) ----------------------------------------- */

/* {duration_seconds: 1..MG_FULLLOG_MAX_S, reason: "..."} into *seconds and reason; 0, or -1
 * with the 400's message in err. */
static int full_body(const mg_http_req_t *req, int *seconds, char *reason, size_t cap, char *err,
                     size_t errlen)
{
    cJSON *in = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    int rc = -1;
    if (!cJSON_IsObject(in)) {
        snprintf(err, errlen, "the body must be a JSON object {duration_seconds, reason}");
        goto out;
    }
    for (const cJSON *m = in->child; m; m = m->next)
        if (strcmp(m->string, "duration_seconds") != 0 && strcmp(m->string, "reason") != 0) {
            snprintf(err, errlen, "field '%.40s': unknown field", m->string);
            goto out;
        }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(in, "duration_seconds");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(in, "reason");
    if (!cJSON_IsNumber(d) || d->valuedouble != (double)(long long)d->valuedouble ||
        d->valuedouble < 1 || d->valuedouble > MG_FULLLOG_MAX_S) {
        snprintf(err, errlen, "field 'duration_seconds': an integer from 1 to %d",
                 MG_FULLLOG_MAX_S);
        goto out;
    }
    if (!cJSON_IsString(r) || !r->valuestring[0] || strlen(r->valuestring) >= cap) {
        snprintf(err, errlen, "field 'reason': a non-empty string of at most %zu bytes", cap - 1);
        goto out;
    }
    *seconds = (int)d->valuedouble;
    snprintf(reason, cap, "%s", r->valuestring);
    rc = 0;
out:
    cJSON_Delete(in);
    return rc;
}

/* POST|GET|DELETE /api/v2/logging/full: platform admin only (the log is the process's, not a
 * tenant's; a tenant admin token is refused by the worker's scope check). The window is the
 * loop's, so it is switched here; every call is audited, the opening one with its duration
 * and reason. */
static void handle_full_logging(mg_admin_t *a, mg_http_req_t *req)
{
    mg_fulllog_t *f = a->d.fulllog;
    if (req->method == HTTP_GET) {
        mg_admin_audit(a, req, "logging.full.read", NULL, 200);
        mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, mg_fulllog_view(f));
        return;
    }
    if (req->method == HTTP_DELETE) {
        int was = mg_fulllog_on(f);
        mg_fulllog_disable(f, "disabled");
        mg_admin_audit(a, req, "logging.full.disable", was ? "was:full" : "was:metadata_only", 200);
        mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, mg_fulllog_view(f));
        return;
    }
    if (req->method != HTTP_POST) {
        mg_admin_audit(a, req, "logging.full", NULL, 405);
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED",
                        "use GET, POST or DELETE", 0);
        return;
    }
    int seconds = 0;
    char reason[sizeof(f->reason)], err[160], target[224];
    if (full_body(req, &seconds, reason, sizeof(reason), err, sizeof(err)) != 0) {
        mg_admin_audit(a, req, "logging.full.enable", NULL, 400);
        mg_answer_error(a->d.metrics, req, MG_EP_OTHER, 400, "INVALID_REQUEST", err, 0);
        return;
    }
    mg_fulllog_enable(f, seconds, reason, "admin");
    snprintf(target, sizeof(target), "duration_seconds=%d reason=%s", seconds, reason);
    mg_admin_audit(a, req, "logging.full.enable", target, 200);
    mg_answer_tree(a->d.metrics, req, MG_EP_OTHER, 200, mg_fulllog_view(f));
}

/* /api/v2/...: GET providers, pools and cooldowns answered here, the rest on the worker. */
static void dispatch(mg_admin_t *a, mg_http_req_t *req, const char *tenant_token)
{
    const char *sub = req->path + strlen("/api/v2/");
    if (tenant_token) {
        adm_enqueue(a, req, tenant_token); /* resolved and scoped on the admin worker */
    } else if (strcmp(sub, "logging/full") == 0 && a->d.fulllog) {
        handle_full_logging(a, req); /* loop-owned state */
    } else if (req->method == HTTP_DELETE && strncmp(sub, "cooldowns/", 10) == 0 && sub[10] &&
               !strchr(sub + 10, '/')) {
        handle_clear_cooldown(a, req, sub + 10); /* loop-owned state */
    } else if (req->method != HTTP_GET) {
        adm_enqueue(a, req, NULL); /* writes */
    } else if (strcmp(sub, "providers") == 0) {
        mg_admin_audit(a, req, "provider.list", NULL, 200);
        handle_admin_providers(a, req, NULL);
    } else if (strncmp(sub, "providers/", 10) == 0 && sub[10] && !strchr(sub + 10, '/')) {
        char target[160];
        snprintf(target, sizeof(target), "provider:%.140s", sub + 10);
        mg_admin_audit(a, req, "provider.get", target,
                       mg_config_provider(mg_gens_current(a->d.gens)->cfg, sub + 10) ? 200 : 404);
        handle_admin_providers(a, req, sub + 10);
    } else if (strcmp(sub, "pools") == 0) {
        mg_admin_audit(a, req, "pools.read", NULL, 200);
        handle_admin_pools(a, req);
    } else if (strncmp(sub, "pools/", 6) == 0 && pool_providers_path(sub + 6)) {
        char pool[16];
        snprintf(pool, sizeof(pool), "%.*s", (int)(strchr(sub + 6, '/') - (sub + 6)), sub + 6);
        mg_admin_audit(a, req, "pools.providers", NULL, 200);
        handle_admin_pool_providers(a, req, pool);
    } else if (strcmp(sub, "cooldowns") == 0) {
        mg_admin_audit(a, req, "cooldowns.read", NULL, 200);
        handle_admin_cooldowns(a, req);
    } else {
        adm_enqueue(a, req, NULL); /* the other reads (404 for unknown endpoints) */
    }
}

void mg_admin_handle(mg_admin_t *a, mg_http_req_t *req)
{
    if (strncmp(req->path, "/api/v2/webhooks/", 17) == 0) {
        adm_enqueue(a, req, NULL); /* signed, not token-bearing: billing.c checks it */
        return;
    }
    int who = admin_allowed(a, req);
    if (who == ADMIN_REFUSED) return;
    dispatch(a, req, who == ADMIN_TENANT ? bearer(req) : NULL);
}

void mg_admin_handle_as(mg_admin_t *a, mg_http_req_t *req, const char *tenant_token)
{
    dispatch(a, req, tenant_token);
}

mg_authfail_t *mg_admin_fails(mg_admin_t *a)
{
    return &a->fails;
}

int mg_admin_is_platform(const mg_admin_t *a, const mg_http_req_t *req)
{
    if (!a->token_digest[0]) return 0;
    const char *auth = mg_http_header(req, "Authorization");
    if (!auth || strncasecmp(auth, "Bearer ", 7) != 0) return 0;
    char given_d[65];
    mg_sha256_hex(auth + 7, strlen(auth + 7), given_d);
    return mg_const_time_eq(a->token_digest, 64, given_d, 64);
}
