/* admit: the steps between a parsed request and its place in the queue: identify (the
 * caller authenticated, before anything else is looked at), idempotency (a keyed request
 * handed to idem.c), admit (the logical model, the application's and the user's permissions
 * and rates, the key's quota reserved) and enqueue (the scheduler's queue, left when a slot
 * is free or the queue deadline passed). */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "base/log.h"
#include "pipeline/idem.h"
#include "sched/setup.h"
#include "token/registry.h"
#include "token/tokenize.h"

/* users.default_requests_per_minute: the user (within its application, PRD 3.2.2) may send
 * that many requests per minute; 1 when refused (the call then ends with 429). */
static int user_rate_refused(call_t *c)
{
    int limit = c->gen->cfg->user_rpm_limit;
    uint64_t wait_ms = 0;
    if (limit <= 0 || !call_user(c)[0]) return 0;
    char key[400];
    int n = snprintf(key, sizeof(key), "%s/%s", c->app ? c->app->name : "", call_user(c));
    int rc = mg_userrate_take(c->pl->userrate, key,
                              (size_t)n < sizeof(key) ? (size_t)n : sizeof(key) - 1,
                              (uint32_t)limit, uv_now(c->pl->loop), &wait_ms);
    if (rc == MG_USERRATE_FULL)
        call_msg(c, MG_LOG_WARN,
                 "per-user rate: too many active users to track; request not counted");
    if (rc != MG_USERRATE_LIMITED) return 0;
    call_error(c, 429, "RATE_LIMITED", "this user's requests per minute are used up", (int)wait_ms);
    return 1;
}

static void on_dispatch(mg_sched_entry_t *e);
static void on_expire(mg_sched_entry_t *e);

/* Hand the call to the scheduler: it runs when a slot is free (at once, through the pump,
 * when one is), else it waits in the priority queue, bounded by timeouts.queue_ms. */
mg_step_rc_t step_enqueue(call_t *c)
{
    mg_pipeline_t *pl = c->pl;
    const mg_config_t *cfg = c->gen->cfg;
    long long max_tokens = c->max_tokens;
    mg_priority_t prio = MG_PRIO_DEFAULT;
    mg_priority_parse(c->priority, &prio);
    mg_sched_entry_init(&c->entry, prio);
    /* prefix-served names share their provider's gate: client-chosen names must not
     * create scheduler state without bound */
    char gate[200];
    const char *gate_name = gate;
    if (!c->prefixed_model.name && strlen(c->model->name) < sizeof(gate))
        gate_name = c->model->name; /* what the snprintf below makes of it */
    else
        snprintf(gate, sizeof(gate), "%s%s", c->prefixed_model.name ? "prefix:" : "",
                 c->prefixed_model.name ? c->prefix : c->model->name);
    c->entry.gate[MG_GATE_MODEL] = mg_sched_gate(pl->sched, MG_GATE_MODEL, gate_name);
    /* the application's and the user's slots (PRD 3.4.2) */
    if (c->app) {
        char ag[300];
        snprintf(ag, sizeof(ag), "app:%s", c->app->name);
        mg_sched_gate_t *g = mg_sched_gate(pl->sched, MG_GATE_APP, ag);
        if (g)
            mg_sched_gate_limits(pl->sched, g, (uint32_t)c->app->max_running_tasks,
                                 (uint32_t)c->app->max_queued_tasks);
        c->entry.gate[MG_GATE_APP] = g;
    }
    if (call_user(c)[0] && (cfg->user_max_running_tasks || cfg->user_max_queued_tasks)) {
        char ug[400];
        snprintf(ug, sizeof(ug), "user:%s/%s", c->app ? c->app->name : "", call_user(c));
        mg_sched_gate_t *g = mg_sched_gate(pl->sched, MG_GATE_USER, ug);
        if (g)
            mg_sched_gate_limits(pl->sched, g, (uint32_t)cfg->user_max_running_tasks,
                                 (uint32_t)cfg->user_max_queued_tasks);
        c->entry.gate[MG_GATE_USER] = g;
    } else if (c->auth.held && c->auth.max_queued) {
        /* the key's cap on waiting tasks: a user gate per key (running is capped by quota) */
        char kg[40];
        snprintf(kg, sizeof(kg), "key:%lld", (long long)c->auth.key_id);
        mg_sched_gate_t *g = mg_sched_gate(pl->sched, MG_GATE_USER, kg);
        if (g) mg_sched_gate_limits(pl->sched, g, 0, c->auth.max_queued);
        c->entry.gate[MG_GATE_USER] = g;
    }
    c->entry.deadline_ms = uv_now(pl->loop) + (uint64_t)c->queue_ms;
    /* input tokens counted when the model's encoding is loaded, else guessed from the body's
     * bytes with a safety factor (3/4 of the bytes per token: 3 for the default 4) */
    c->entry.input_tokens = (uint32_t)prompt_estimate(c, 0.75);
    c->entry.max_output_tokens = max_tokens > 0 ? (uint32_t)max_tokens : 0;
    /* memory admission degrades before it waits: shorter output, then the smaller model */
    c->entry.min_output_tokens = (uint32_t)cfg->scheduler.min_output_tokens;
    c->entry.smaller = c->smaller_route ? mg_sched_smaller_gate(pl->sched, c->smaller_route) : NULL;
    c->entry.data = c;
    c->entry.on_dispatch = on_dispatch;
    c->entry.on_expire = on_expire;
    task_to(c, MG_TASK_VALIDATING, "received");
    int rc = mg_sched_enqueue(pl->sched, &c->entry, uv_now(pl->loop));
    if (rc == MG_SCHED_EQUEUE_FULL) {
        int status = cfg->scheduler.overflow_status;
        return call_error(c, status, "QUEUE_FULL", "the queue is full; retry later", 2000);
    }
    if (rc == MG_SCHED_EOVERLOAD) {
        return call_error(c, 503, "RESOURCE_EXHAUSTED",
                          "the gateway is overloaded and sheds this priority now; retry later",
                          2000);
    }
    if (rc == MG_SCHED_ETOO_LARGE) {
        return call_error(c, 503, "RESOURCE_EXHAUSTED",
                          "the request needs more device memory than this model can ever have", 0);
    }
    if (rc != MG_SCHED_OK) {
        return call_error(c, 503, "RESOURCE_EXHAUSTED", mg_sched_strerror(rc), 2000);
    }
    c->asked_max_tokens = max_tokens;
    c->queued = 1;
    task_to(c, MG_TASK_QUEUED, "admitted");
    mg_pump_run(pl->pump); /* may dispatch this call at once and run it to its end */
    return MG_STEP_AGAIN;  /* c->step: route, when the slot comes */
}

/* 1 when a decision takes the prompt's size: the key's token quotas, a route's TPM limit, or
 * memory admission (a model or smaller route with a KV cache size). */
static int prompt_decides(const call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    if (cfg->auth_enabled || c->model->kv_cache_per_token_bytes ||
        (c->smaller_route && c->smaller_route->kv_cache_per_token_bytes))
        return 1;
    for (size_t i = 0; i < c->model->n_routes; i++) {
        const mg_provider_conf_t *p = mg_config_route_provider(cfg, &c->model->routes[i]);
        if (p && p->tpm_limit > 0) return 1;
    }
    return 0;
}

/* The loop counts at most this much of a body (a few milliseconds at the tokenizer's rate);
 * past it the count of the first part is scaled to the whole, so a 16 MiB prompt costs the
 * loop what a 256 KiB one does. */
#define PROMPT_COUNT_MAX_BYTES (256u * 1024u)

const char *prompt_bytes(call_t *c, size_t *len)
{
    const char *text = c->req->body;
    *len = c->req->body_len;
    if (c->responses) responses_prompt(c, &text, len);
    return text;
}

/* The request body counted with the model's encoding (one pass over its bytes, allocating
 * nothing; the JSON around the messages is counted too, a few tokens a message over what the
 * model sees, the safe side for a reservation), once per call; -1 when the model has no
 * loaded encoding. */
int64_t prompt_count(call_t *c)
{
    if (c->prompt_count >= 0) return c->prompt_count;
    const mg_encoding_t *e = c->model ? mg_token_registry_get(c->model->tokenizer - 1) : NULL;
    if (!e || !c->req) return -1;
    size_t len;
    const char *text = prompt_bytes(c, &len);
    size_t counted = len < PROMPT_COUNT_MAX_BYTES ? len : PROMPT_COUNT_MAX_BYTES;
    long n = mg_tokenize_count(e, text, counted, 0);
    if (n < 0) return -1;
    if (counted < len) n = (long)((double)n * ((double)len / (double)counted)) + 1;
    return c->prompt_count = n;
}

int64_t output_estimate(const call_t *c)
{
    return c->max_tokens > 0 ? c->max_tokens : MG_DEFAULT_OUTPUT_ESTIMATE;
}

/* The prompt's tokens for admission: counted when a decision takes them, otherwise the
 * body's bytes at the calibrated bytes per token (pipeline/calib.h), which costs nothing. */
int64_t prompt_estimate(call_t *c, double margin)
{
    int64_t n = c->prompt_count >= 0 || prompt_decides(c) ? prompt_count(c) : -1;
    if (n >= 0) return n;
    size_t len;
    prompt_bytes(c, &len);
    return calib_estimate(calib_model_bpt(c) * margin, len);
}

/* "model:provider-id" pins a provider when "model" alone is a logical model. */
static const mg_model_conf_t *resolve_model(const mg_config_t *cfg, const char *name,
                                            routing_input_t *in)
{
    const mg_model_conf_t *m = mg_config_model(cfg, name);
    if (m) return m;
    const char *colon = strrchr(name, ':');
    if (!colon || colon == name || !colon[1]) return NULL;
    char base[300];
    snprintf(base, sizeof(base), "%.*s", (int)(colon - name), name);
    m = mg_config_model(cfg, base);
    if (!m || !mg_config_provider(cfg, colon + 1)) return NULL;
    snprintf(in->pin, sizeof(in->pin), "%s", colon + 1);
    in->has_pin = 1;
    return m;
}

/* The provider whose model_prefix is the longest one `name` starts with, or NULL. */
static const mg_provider_conf_t *prefix_provider(const mg_config_t *cfg, const char *name)
{
    const mg_provider_conf_t *best = NULL;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const char *pre = cfg->providers[i].model_prefix;
        if (!pre || strncmp(name, pre, strlen(pre)) != 0) continue;
        if (!best || strlen(pre) > strlen(best->model_prefix)) best = &cfg->providers[i];
    }
    return best;
}

/* A model for a name served by prefix: one route per provider with that same (longest)
 * prefix, so several keys behind one prefix share the load and fall back to each other
 * like the routes of a logical model. 0 or -1 (out of memory). */
static int use_prefixed_model(call_t *c, const mg_provider_conf_t *best, const char *name)
{
    const mg_config_t *cfg = c->gen->cfg;
    size_t n = 0;
    for (size_t i = 0; i < cfg->n_providers; i++)
        n += cfg->providers[i].model_prefix &&
             strcmp(cfg->providers[i].model_prefix, best->model_prefix) == 0;
    mg_route_conf_t *routes = calloc(n, sizeof(*routes));
    c->prefixed_model.routes = routes;
    c->prefixed_upstream = strdup(name);
    c->prefixed_model.name = strdup(name);
    c->prefix = best->model_prefix;
    c->model = &c->prefixed_model;
    if (!routes || !c->prefixed_upstream || !c->prefixed_model.name) return -1;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        if (!p->model_prefix || strcmp(p->model_prefix, best->model_prefix) != 0) continue;
        routes[c->prefixed_model.n_routes].provider = p->id;
        routes[c->prefixed_model.n_routes].provider_hint = (int)i;
        routes[c->prefixed_model.n_routes++].model = c->prefixed_upstream;
    }
    return 0;
}

/* The smaller route memory admission may move a task to when the model does not fit: the
 * one with the smallest KV cache per token among the smaller routes with their own figures
 * that this request could use (its pinned provider, local ones under local_only). NULL if
 * none. Routing then sees only the routes of that upstream model. */
static const mg_route_conf_t *memory_smaller_route(const mg_config_t *cfg, const mg_model_conf_t *m,
                                                   const routing_input_t *in)
{
    const mg_route_conf_t *best = NULL;
    for (size_t i = 0; i < m->n_routes; i++) {
        const mg_route_conf_t *r = &m->routes[i];
        const mg_provider_conf_t *p = mg_config_route_provider(cfg, r);
        if (!r->smaller || r->kv_cache_per_token_bytes <= 0 || !p) continue;
        if ((in->has_pin && strcmp(r->provider, in->pin) != 0) || (in->local_only && !p->local))
            continue;
        if (!best || r->kv_cache_per_token_bytes < best->kv_cache_per_token_bytes) best = r;
    }
    return best;
}

/* Whose idempotency keys these are: with auth on, the caller's tenant and project (the
 * identify step found them); otherwise metadata.application and a digest of the credential
 * presented, if any, so open-mode callers that identify themselves stay apart. group: whose
 * memory cap the key counts against (the tenant; "" in open mode). */
static void idem_scope(const call_t *c, char *out, size_t cap, char *group, size_t group_cap)
{
    group[0] = '\0'; /* open mode: one memory cap for all (idem.h) */
    if (c->gen->cfg->auth_enabled) {
        long long project = c->auth.rec ? (long long)c->auth.rec->project_id : 0;
        snprintf(out, cap, "tenant:%lld/project:%lld", (long long)c->auth.tenant_id, project);
        snprintf(group, group_cap, "tenant:%lld", (long long)c->auth.tenant_id);
        return;
    }
    const cJSON *app = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c->body, "metadata"), "application");
    const char *auth = mg_http_header(c->req, "Authorization");
    if (!auth) auth = mg_http_header(c->req, "x-api-key");
    char digest[65] = "-";
    if (auth) mg_sha256_hex(auth, strlen(auth), digest);
    snprintf(out, cap, "app:%.200s/cred:%s", cJSON_IsString(app) ? app->valuestring : "", digest);
}

/* What the scheduler did to let the task run: a lower output ceiling (backpressure level 2
 * at enqueue, memory admission at dispatch) that the upstream must see, or the smaller
 * model memory admission reserved for. */
static void take_admission(call_t *c)
{
    long long ceiling = c->entry.max_output_tokens;
    long long asked = c->asked_max_tokens;
    if (ceiling > 0 && (asked <= 0 || ceiling < asked) && c->ep != MG_EP_EMBEDDINGS) {
        c->mapped_max_tokens = ceiling;
        c->tokens_capped = 1;
        if (c->body) cap_tree_tokens(c);
    }
    c->output_shortened = c->tokens_capped && (c->entry.degraded & MG_SCHED_SHORTER);
    if (c->entry.degraded & MG_SCHED_SMALLER) c->mem_smaller = c->smaller_route;
}

static void on_dispatch(mg_sched_entry_t *e)
{
    call_t *c = e->data;
    c->queued = 0;
    take_admission(c);
    mg_metrics_queue_time_of(c->pl->metrics, c->app ? c->app->name : NULL,
                             c->model ? c->model->name : NULL,
                             ms_since(c->t_start, uv_hrtime()) / 1000.0);
    task_to(c, MG_TASK_DISPATCHING, "slot_available");
    mg_call_run(c); /* at c->step: route */
}

static void on_expire(mg_sched_entry_t *e)
{
    call_t *c = e->data;
    c->queued = 0;
    c->pl->metrics->timeouts_by[MG_TIMEOUT_QUEUE]++;
    mg_sched_stats_t st;
    mg_sched_stats(c->pl->sched, &st);
    char msg[160];
    snprintf(msg, sizeof(msg),
             "the request waited in the queue past its deadline; queue length: %u", st.queued);
    c->fail_degraded = NULL;
    call_fail(c, 408, "QUEUE_TIMEOUT", msg, 3000);
}

/* ------------------------------------------------------------------------ */
/* The steps                                                                 */
/* ------------------------------------------------------------------------ */

/* With auth on, the caller's key before anything else: an unknown caller learns nothing
 * (not which models exist), spends no one's rate and stores no idempotency record. */
mg_step_rc_t step_identify(call_t *c)
{
    if (c->gen->cfg->auth_enabled &&
        mg_auth_authenticate(c->pl->auth, c->req, mg_unix_ms(), &c->auth) != 0)
        return call_error(c, c->auth.status, c->auth.code, c->auth.message,
                          (int)c->auth.retry_after_ms);
    return c->responses ? responses_identified(c) : MG_STEP_NEXT;
}

/* A request with an idempotency key runs once, detached from its connection (that run
 * comes back through the pipeline with no connection and is not looked up again): the
 * request goes to idem.c, and this call ends without a word. */
mg_step_rc_t step_idempotency(call_t *c)
{
    mg_http_req_t *req = c->req;
    if (!req->conn) return MG_STEP_NEXT;
    const cJSON *ik = c->body ? cJSON_GetObjectItemCaseSensitive(c->body, "idempotency_key") : NULL;
    const char *ikey = mg_idem_key(req, cJSON_IsString(ik) ? ik->valuestring : NULL);
    if (!ikey) return MG_STEP_NEXT;
    int stream =
        c->body ? cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c->body, "stream")) : c->fb.stream;
    char key[256], scope[400], group[64];
    snprintf(key, sizeof(key), "%s", ikey);
    idem_scope(c, scope, sizeof(scope), group, sizeof(group));
    mg_idem_t *idem = c->pl->idem;
    mg_endpoint_t ep = call_client_ep(c);        /* the run parses what the client sent */
    if (c->front_messages) msgs_restore_body(c); /* the run translates it again */
    call_handed_over(c); /* before idem answers req (a replay answers at once) */
    mg_idem_handle(idem, req, ep, scope, group, key, stream);
    return MG_STEP_DONE;
}

static const char *endpoint_name(mg_endpoint_t ep)
{
    return ep == MG_EP_CHAT ? "chat" : ep == MG_EP_COMPLETIONS ? "completions" : "embeddings";
}

/* A limit as the request asks for it: the configured one when it does not ask, else what it
 * asks up to the configured maximum (0: the limit itself). */
static int limit_of(int asked, int configured, int max)
{
    if (asked <= 0) return configured;
    int top = max > 0 ? max : configured;
    return asked < top ? asked : top;
}

/* The request's deadlines: the client's timeouts, each bounded by its configured maximum. */
static void set_deadlines(call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    const mg_timeouts_conf_t *tc = &cfg->timeouts;
    uint64_t now = uv_now(c->pl->loop);
    c->deadline_ms = now + (uint64_t)cfg->routing.queue_timeout_ms;
    c->queue_ms = limit_of(c->in.queue_ms, tc->queue_ms, tc->max_queue_ms);
    c->first_token_ms = limit_of(c->in.first_token_ms, tc->first_byte_ms, tc->max_first_byte_ms);
    c->inference_ms = limit_of(c->in.inference_ms, tc->total_ms, tc->max_total_ms);
    int total_ms = limit_of(c->in.total_ms, tc->total_ms, tc->max_total_ms);
    c->total_deadline_ms = c->req->start_ms + (uint64_t)total_ms;
    /* a deadline the client shortened is its own when it passes (attempt_end) */
    c->own_first_token = c->first_token_ms < tc->first_byte_ms;
    c->own_total = c->inference_ms < tc->total_ms || total_ms < tc->total_ms;
}

/* What the application may ask: its priorities and models (PRD 3.2.2). */
static int app_refused(call_t *c)
{
    if (!c->app) return 0;
    mg_priority_t p = MG_PRIO_DEFAULT;
    mg_priority_parse(c->priority, &p);
    if (!(c->app->allowed_priorities & (1u << p))) {
        call_error(c, 403, "PERMISSION_DENIED", "this application may not use that priority", 0);
        return 1;
    }
    if (!mg_app_allows_model(c->app, c->model->name)) {
        call_error(c, 403, "PERMISSION_DENIED", "this application may not use that model", 0);
        return 1;
    }
    return 0;
}

/* The request as policies and adapters see it (luavm.h). */
static void set_lua_info(call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    const routing_input_t *in = &c->in;
    memcpy(c->lua_request_id, c->req->request_id, sizeof(c->lua_request_id));
    c->lua_info = (mg_lua_req_t){
        .request_id = c->lua_request_id,
        .endpoint = endpoint_name(c->ep),
        .model = c->model->name,
        .stream = c->stream,
        .max_tokens = c->max_tokens,
        .created = (long long)time(NULL),
        .priority = in->priority,
        .pool = in->pool ? (strcmp(in->pool, "main") == 0 ? "main" : "fallback") : NULL,
        .pin = in->has_pin ? in->pin : NULL, /* resolve_model set it, nothing changes it */
        .local_only = in->local_only,
        .allow_smaller_model = in->allow_smaller_model,
        /* an application with a data policy reaches the cloud only if the policy allows */
        .allow_cloud = !c->app || !c->app->has_data_policy || c->app->allow_cloud,
        .local_first = cfg->routing.local_first,
        .random = mg_request_id_draw(c->req->request_id),
    };
}

mg_step_rc_t step_admit(call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    routing_input_t *in = &c->in;
    const char *name =
        c->fast ? c->fb.model : cJSON_GetObjectItemCaseSensitive(c->body, "model")->valuestring;
    c->model = resolve_model(cfg, name, in);
    const mg_provider_conf_t *by_prefix = c->model ? NULL : prefix_provider(cfg, name);
    if (!c->model && !by_prefix) {
        char msg[300];
        snprintf(msg, sizeof(msg), "model '%.200s' does not exist", name);
        return call_error(c, 404, "MODEL_NOT_FOUND", msg, 0);
    }
    if (by_prefix && use_prefixed_model(c, by_prefix, name) != 0)
        return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    /* the name outlives the request's body (a task's answer is built without its client) */
    c->client_model =
        strcmp(name, c->model->name) == 0 ? c->model->name : (c->client_model_owned = strdup(name));
    if (!c->client_model) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    set_deadlines(c);
    body_sanitize(c); /* who is asking: the application and user of the PRD's permission model */
    if (app_refused(c) || user_rate_refused(c)) return MG_STEP_NEXT; /* to finish */
    if (in->allow_smaller_model < 0) in->allow_smaller_model = cfg->routing.allow_smaller_model;
    if (in->allow_smaller_model) c->smaller_route = memory_smaller_route(cfg, c->model, in);
    /* TPM reservation: the prompt (counted, or guessed from its bytes) plus the answer's
     * ceiling */
    c->est_tokens = prompt_estimate(c, 1) + output_estimate(c);
    set_lua_info(c);
    if (alloc_routing(c) != 0) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    if (cfg->auth_enabled) c->est_cost_micros = call_estimated_cost(c);
    if (cfg->auth_enabled && c->pl->shared) shared_defer_quota(c);
    if (cfg->auth_enabled && mg_auth_admit(c->pl->auth, &c->auth, c->model->name, in->priority,
                                           mg_unix_ms(), c->est_tokens, c->est_cost_micros) != 0) {
        call_error(c, c->auth.status, c->auth.code, c->auth.message, 0);
        c->error_retry_ms =
            (long long)c->auth.retry_after_ms; /* a month's wait passes INT_MAX ms */
        return MG_STEP_NEXT;
    }
    return MG_STEP_NEXT;
}
