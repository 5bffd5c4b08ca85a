/* proxy: the request pipeline from a parsed client request to the end of its
 * answer; see proxy.h.
 *
 * Streaming: upstream bytes go through the SSE (or NDJSON) framer. For passthrough
 * adapters an event is forwarded byte for byte unless it is one of the few the
 * gateway annotates (the first chunk gets request metadata, the chunk with
 * finish_reason gets usage and timing, the usage-only chunk is folded in), so the
 * common chunk costs a couple of memchr-class scans and a copy. All events that
 * complete within one upstream read are written to the client as one chunk. */
#include "pipeline/proxy.h"

#include <locale.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "api/api.h"
#include "route/facts.h"
#include "pipeline/idem.h"
#include "tenancy/auth.h"
#include "upstream/chunk.h"
#include "base/json.h"
#include "base/log.h"
#include "upstream/sse.h"
#include "sched/task.h"
#include "tenancy/userrate.h"

#define MAX_RESPONSE_BYTES (64u * 1024u * 1024u)
#define MAX_ERROR_BODY_BYTES (64u * 1024u)

/* Why the last failed attempt failed: decides the final status if all fail. */
typedef enum {
    FAIL_NONE = 0,
    FAIL_CONNECT,
    FAIL_RATE_LIMITED,
    FAIL_SERVER,
    FAIL_AUTH,
    FAIL_GARBAGE,
    FAIL_TIMEOUT,       /* no first byte in time */
    FAIL_TIMEOUT_TOTAL, /* the inference / total deadline passed */
    FAIL_ADAPTER,
} fail_kind_t;

typedef struct call_s {
    struct call_s *prev, *next; /* the server's list of calls */
    mg_server_t *srv;
    mg_http_req_t *req;          /* borrowed; NULL once the client left */
    mg_endpoint_t ep;
    mg_task_t task;              /* the PRD's state machine; every change is logged */
    mg_sched_entry_t entry;      /* the scheduler's view: queued, then a lease */
    int queued;                  /* entry is in the queue */
    const char *priority;        /* "P0".."P4" (static) */
    const mg_app_conf_t *app;    /* metadata.application, when configured */
    char user[128];              /* metadata.user_id or the OpenAI "user" field, or "" */
    /* a model served through a provider's model_prefix rather than a logical model */
    mg_model_conf_t prefixed_model;  /* routes: owned array; name: owned */
    char *prefixed_upstream;         /* owned: the model name as sent, shared by those routes */
    const char *prefix;              /* in gen->cfg: the prefix that matched */
    mg_gen_t *gen;               /* one reference held */
    const mg_model_conf_t *model;/* in gen->cfg */
    cJSON *body;                 /* owned: the sanitized client request; NULL until call_tree()
                                    after the fast path (see fast_body) */
    const mg_json_member_t *body_members; /* the fast path's members of req->body (in its
                                             arena), or NULL: passthrough_body scans */
    size_t n_body_members;
    int stream;
    int client_include_usage;
    long long mapped_max_tokens; /* max_output_tokens turned into max_tokens, or -1 */
    int tokens_capped;           /* the scheduler lowered max_tokens to mapped_max_tokens */
    long long asked_max_tokens;  /* the client's output ceiling, or -1 */
    const mg_route_conf_t *smaller_route; /* memory admission's smaller model, or NULL */
    const mg_route_conf_t *mem_smaller;   /* memory admission chose it: only its routes */
    int output_shortened;        /* memory admission lowered max_tokens to fit: degraded */
    /* the request as Lua sees it; its table (req_ref) is made only when a policy or adapter
       is called for the request: a kept plan and a kept encode answer need none */
    mg_lua_req_t lua_info;       /* strings: static, in gen or call, or the two below */
    char lua_request_id[MG_REQUEST_ID_LEN + 1];
    char lua_pin[160];
    int req_ref, state_ref;      /* Lua registry references in gen (-1: none yet) */
    /* routing: four arrays in routing_buf, one entry per route of the model */
    void *routing_buf;           /* owned; kept with a spare call (see call_alloc) */
    size_t routing_cap;          /* routes routing_buf has room for */
    mg_candidate_t *cands;       /* in routing_buf */
    int *cand_route;             /* in routing_buf: candidate -> route index */
    int n_cands;
    mg_plan_entry_t *plan;       /* in routing_buf: the current plan */
    unsigned char *tried;        /* in routing_buf: per candidate, attempted in this request */
    int plan_n, plan_next;
    int plan_limit;              /* the plan's req.plan_limit (0: none) */
    int route_calls;             /* times routing.route() was asked */
    int attempts;                /* upstream attempts started */
    int limited;                 /* plan entries refused by a rate limit in this pass */
    uint64_t limited_until_ms;   /* loop time the earliest of them frees up */
    uint64_t deadline_ms;        /* loop time after which the request stops waiting */
    int queue_ms;                /* effective timeouts: the request's, capped by the config */
    int first_token_ms;
    int inference_ms;
    uint64_t total_deadline_ms;  /* loop time the whole request must end by */
    uv_timer_t *wait_timer;      /* owned (freed in its close callback) */
    int64_t est_tokens;          /* reserved against TPM limits */
    mg_auth_result_t auth;       /* the caller's identity and key/project reservation */
    mg_limiter_resv_t resv;      /* the current attempt's reservation */
    const char *degraded;        /* static: how the current attempt is degraded, or NULL */
    const char *fail_degraded;   /* static: X-Sidecar-Degraded on an error answer, or NULL */
    uint64_t attempt_start_ms;
    const char *cancel_reason;   /* static: why the task was cancelled, or NULL */
    uint64_t cancel_ns, released_ns; /* when it was cancelled and when its slot came back */
    /* the current attempt */
    mg_xfer_t *xfer;
    const mg_provider_conf_t *provider;
    const mg_route_conf_t *route;   /* the attempt's route, in gen->cfg or prefixed_model */
    const char *upstream_model;
    int adapter, passthrough, ndjson;
    int up_status;
    int unreachable;             /* the connection failed: a fault of the provider, not the route */
    char retry_after[32];
    char *error_headers;         /* owned: an error answer's headers, for the cooldown policy */
    size_t error_headers_len;
    mg_buf_t resp;               /* owned: response body (non-stream) or error body */
    mg_sse_parser_t sse;
    int sse_ready;
    /* stream state */
    int client_started;
    int first_chunk_done;
    cJSON *held_finish;          /* owned: the finish_reason chunk, waiting for usage */
    mg_buf_t held_raw;           /* owned: the same for passthrough streams, as upstream bytes */
    int held_raw_first;          /* the held raw chunk is also the first one (needs metadata) */
    int upstream_done;
    int stop_stream;             /* the stream was ended early by the gateway */
    mg_buf_t out;                /* owned: SSE bytes batched for the client */
    /* accounting */
    int have_usage;
    long long prompt_tokens, completion_tokens;
    long long chunks;
    fail_kind_t last_fail;
    int retry_after_ms;
    uint64_t t_start, t_dispatch, t_first; /* uv_hrtime() ns */
    int status;
    const char *outcome;
    const char *error_code;
} call_t;

static void try_next(call_t *c);
static void plan_and_dispatch(call_t *c);
static void route_and_dispatch(call_t *c, int limit);
static int fill_candidates(call_t *c, uint64_t now);
static cJSON *call_tree(call_t *c);

/* The request's Lua table (req), made on first use. */
static int req_table(call_t *c)
{
    return mg_gen_req_table(c->gen, &c->lua_info, &c->req_ref);
}

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

/* Extensions from the edge PRD: accepted from clients, never sent upstream. */
#define KEY(s) {s, sizeof(s) - 1}
static const struct {
    const char *name;
    size_t len;
} extension_keys[] = {KEY("priority"), KEY("session_id"),     KEY("idempotency_key"),
                      KEY("timeouts"), KEY("routing"),        KEY("context_policy"),
                      KEY("max_output_tokens"), KEY("metadata")};
#define N_EXTENSIONS (sizeof(extension_keys) / sizeof(extension_keys[0]))

static int member_is(const mg_json_member_t *m, const char *key)
{
    size_t n = strlen(key);
    return m->key_len == n && memcmp(m->key, key, n) == 0;
}

static int is_extension(const mg_json_member_t *m)
{
    for (size_t i = 0; i < N_EXTENSIONS; i++)
        if (m->key_len == extension_keys[i].len &&
            memcmp(m->key, extension_keys[i].name, m->key_len) == 0)
            return 1;
    return 0;
}

/* A member the gateway adds to answers: an upstream member of that name is a clash. */
static int is_gateway_member(const mg_json_member_t *m)
{
    static const struct {
        const char *name;
        size_t len;
    } names[] = {KEY("request_id"), KEY("logical_model"),   KEY("actual_model"),
                 KEY("timing"),     KEY("degraded"),        KEY("degraded_reason"),
                 KEY("max_output_tokens")};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (m->key_len == names[i].len && memcmp(m->key, names[i].name, m->key_len) == 0) return 1;
    return 0;
}

static double ms_since(uint64_t from, uint64_t to)
{
    return from && to >= from ? (double)(to - from) / 1e6 : 0;
}

/* [before]"key":value[after] into o, with one bounds check. */
static void append_member(mg_buf_t *o, const mg_json_member_t *m, const char *before,
                          const char *after)
{
    size_t nb = strlen(before), na = strlen(after);
    if (mg_buf_reserve(o, nb + m->key_len + m->value_len + 3 + na) != 0) return;
    char *p = o->data + o->len;
    memcpy(p, before, nb);
    p += nb;
    *p++ = '"';
    memcpy(p, m->key, m->key_len);
    p += m->key_len;
    *p++ = '"';
    *p++ = ':';
    memcpy(p, m->value, m->value_len);
    p += m->value_len;
    memcpy(p, after, na + 1); /* and the NUL mg_buf keeps */
    o->len = (size_t)(p + na - o->data);
}

static cJSON *timing_json(call_t *c, uint64_t now)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "queue_ms", (double)(long long)ms_since(c->t_start, c->t_dispatch));
    cJSON_AddNumberToObject(t, "first_token_ms", (double)(long long)ms_since(c->t_start, c->t_first));
    cJSON_AddNumberToObject(t, "total_ms", (double)(long long)ms_since(c->t_start, now));
    return t;
}

static void set_item(cJSON *obj, const char *key, cJSON *value)
{
    if (cJSON_HasObjectItem(obj, key)) cJSON_ReplaceItemInObject(obj, key, value);
    else cJSON_AddItemToObject(obj, key, value);
}

/* How the answer is degraded, as the client sees it (header, body, log): the route's kind,
 * "shorter_output" when memory admission lowered max_tokens, or both; NULL when neither. */
static const char *degraded_reason(const call_t *c, char *buf, size_t cap)
{
    if (!c->output_shortened) return c->degraded;
    if (!c->degraded) return "shorter_output";
    snprintf(buf, cap, "%s, shorter_output", c->degraded);
    return buf;
}

static void add_metadata(call_t *c, cJSON *obj)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    set_item(obj, "request_id", cJSON_CreateString(c->req ? c->req->request_id : ""));
    set_item(obj, "logical_model", cJSON_CreateString(c->model->name));
    set_item(obj, "actual_model", cJSON_CreateString(c->upstream_model ? c->upstream_model : ""));
    set_item(obj, "degraded", cJSON_CreateBool(reason != NULL));
    if (reason) set_item(obj, "degraded_reason", cJSON_CreateString(reason));
    if (c->output_shortened)
        set_item(obj, "max_output_tokens", cJSON_CreateNumber((double)c->mapped_max_tokens));
}

/* The same members as add_metadata's degraded ones, as bytes: ,"degraded":... */
static void append_degraded_raw(const call_t *c, mg_buf_t *o)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    mg_buf_append_str(o, reason ? ",\"degraded\":true" : ",\"degraded\":false");
    if (reason) {
        mg_buf_append_str(o, ",\"degraded_reason\":");
        mg_json_print_string(reason, strlen(reason), o);
    }
    if (c->output_shortened) {
        mg_buf_append_str(o, ",\"max_output_tokens\":");
        mg_json_print_number((double)c->mapped_max_tokens, o);
    }
}

/* Response headers every answer of this call carries beyond the standard ones. */
static const char *degraded_header(call_t *c, char *buf, size_t cap)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    if (!reason) return NULL;
    snprintf(buf, cap, "X-Sidecar-Degraded: %s\r\n", reason);
    return buf;
}

static void take_usage(call_t *c, const cJSON *usage)
{
    if (!cJSON_IsObject(usage)) return;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
    if (cJSON_IsNumber(pt)) c->prompt_tokens = (long long)pt->valuedouble;
    if (cJSON_IsNumber(ct)) c->completion_tokens = (long long)ct->valuedouble;
    c->have_usage = cJSON_IsNumber(pt) || cJSON_IsNumber(ct);
}

/* The token counts of a usage object's bytes, without building a tree (it is read on
 * every passthrough answer). */
typedef struct {
    long long prompt, completion;
    int found;
} usage_scan_t;

static int usage_member(void *ud, const mg_json_member_t *m)
{
    usage_scan_t *u = ud;
    char num[24];
    if (m->value_len == 0 || m->value_len >= sizeof(num) || m->value[0] < '0' || m->value[0] > '9')
        return 0;
    memcpy(num, m->value, m->value_len);
    num[m->value_len] = '\0';
    if (member_is(m, "prompt_tokens")) {
        u->prompt = strtoll(num, NULL, 10);
        u->found = 1;
    } else if (member_is(m, "completion_tokens")) {
        u->completion = strtoll(num, NULL, 10);
        u->found = 1;
    }
    return 0;
}

static void take_usage_bytes(call_t *c, const char *json, size_t n)
{
    usage_scan_t u = {0, 0, 0};
    if (mg_json_members(json, n, usage_member, &u) != 0 || !u.found) return;
    c->prompt_tokens = u.prompt;
    c->completion_tokens = u.completion;
    c->have_usage = 1;
}

static cJSON *usage_json(call_t *c)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)c->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)c->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(c->prompt_tokens + c->completion_tokens));
    return u;
}

/* Without upstream counts: a byte-based guess for the prompt, one token per
 * streamed chunk for the answer (what OpenAI-style servers send). */
static void estimate_tokens(call_t *c)
{
    if (c->have_usage) return;
    c->prompt_tokens = c->req ? (long long)(c->req->body_len / 4) : 0;
    c->completion_tokens = c->chunks;
}

/* ------------------------------------------------------------------------ */
/* Task states                                                               */
/* ------------------------------------------------------------------------ */

/* Log each accepted transition with the PRD's fields. */
static void on_task_transition(const mg_task_t *t, const mg_task_transition_t *tr, void *ud)
{
    call_t *c = ud;
    if (!c->gen->cfg->task_events || !mg_log_enabled(MG_LOG_INFO)) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "task_state_change");
    mg_log_str(&l, "task_id", c->req ? c->req->request_id : NULL);
    mg_log_str(&l, "request_id", c->req ? c->req->request_id : NULL);
    mg_log_str(&l, "from_state", mg_task_state_name(tr->from));
    mg_log_str(&l, "to_state", mg_task_state_name(tr->to));
    mg_log_str(&l, "reason", tr->reason);
    mg_log_str(&l, "logical_model", c->model->name);
    mg_log_str(&l, "priority", c->priority);
    if (c->provider) mg_log_str(&l, "provider", c->provider->id);
    mg_log_end(&l);
}

static void task_to(call_t *c, mg_task_state_t to, const char *reason)
{
    if (c->task.state != to) mg_task_transition_at(&c->task, to, reason, uv_now(c->srv->loop));
}

/* The terminal state that matches how the call ended. */
static void task_finish(call_t *c)
{
    if (mg_task_is_terminal(c->task.state)) return;
    const char *oc = c->outcome ? c->outcome : "error";
    if (c->error_code && strcmp(c->error_code, "REQUEST_CANCELLED") == 0)
        task_to(c, MG_TASK_CANCELLED, "cancelled_by_request");
    else if (strcmp(oc, "ok") == 0) task_to(c, MG_TASK_SUCCEEDED, "completed");
    else if (strcmp(oc, "cancelled") == 0) task_to(c, MG_TASK_CANCELLED, "client_disconnected");
    else if (c->error_code && strstr(c->error_code, "TIMEOUT"))
        task_to(c, MG_TASK_TIMED_OUT, c->error_code);
    else if (c->task.state == MG_TASK_VALIDATING) task_to(c, MG_TASK_REJECTED, c->error_code);
    else task_to(c, MG_TASK_FAILED, c->error_code ? c->error_code : "error");
}

/* ------------------------------------------------------------------------ */
/* Finishing                                                                 */
/* ------------------------------------------------------------------------ */

static void call_log(call_t *c)
{
    if (c->error_code && strcmp(c->error_code, "REQUEST_CANCELLED") == 0) c->outcome = "cancelled";
    task_finish(c);
    mg_http_req_t *req = c->req;
    uint64_t now = uv_hrtime();
    mg_metrics_t *m = &c->srv->metrics;
    mg_metrics_request(m, c->ep, c->status, ms_since(c->t_start, now) / 1000.0);
    if (c->t_first) mg_metrics_ttft(m, ms_since(c->t_start, c->t_first) / 1000.0);
    m->tokens_prompt_total += (uint64_t)c->prompt_tokens;
    m->tokens_completion_total += (uint64_t)c->completion_tokens;
    if (c->degraded && c->status < 400) mg_metrics_degraded(m, c->degraded);
    if (c->output_shortened && c->status < 400) mg_metrics_degraded(m, "shorter_output");
    mg_log_level_t level = c->status >= 500 ? MG_LOG_WARN : MG_LOG_INFO;
    if (!mg_log_enabled(level)) return;
    mg_logline_t l;
    mg_log_begin(&l, level, "request");
    mg_log_str(&l, "request_id", req->request_id);
    mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
    mg_log_str(&l, "path", req->path);
    mg_log_int(&l, "status", c->status);
    mg_log_str(&l, "model", c->model ? c->model->name : NULL);
    mg_log_str(&l, "provider", c->provider ? c->provider->id : NULL);
    mg_log_str(&l, "actual_model", c->upstream_model);
    mg_log_bool(&l, "stream", c->stream);
    mg_log_str(&l, "outcome", c->outcome);
    if (c->cancel_reason) {
        /* the PRD asks for the reason and when the resources came back */
        mg_log_str(&l, "cancel_reason", c->cancel_reason);
        mg_log_double(&l, "released_after_ms", ms_since(c->cancel_ns, c->released_ns));
    }
    mg_log_str(&l, "priority", c->priority);
    mg_log_str(&l, "task_state", mg_task_state_name(c->task.state));
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    if (reason) mg_log_str(&l, "degraded", reason);
    if (c->output_shortened) mg_log_int(&l, "max_output_tokens", c->mapped_max_tokens);
    if (c->error_code) mg_log_str(&l, "error", c->error_code);
    if (c->auth.held) {
        mg_log_int(&l, "key_id", c->auth.key_id);
        mg_log_int(&l, "tenant_id", c->auth.tenant_id);
        if (c->auth.project_id) mg_log_int(&l, "project_id", c->auth.project_id);
    } else if (c->auth.code) {
        mg_log_str(&l, "auth_refused", c->auth.reason); /* the client sees one 401 for all */
    }
    mg_log_int(&l, "attempts", c->attempts);
    mg_log_double(&l, "duration_ms", ms_since(c->t_start, now));
    if (c->t_first) mg_log_double(&l, "first_token_ms", ms_since(c->t_start, c->t_first));
    mg_log_int(&l, "prompt_tokens", c->prompt_tokens);
    mg_log_int(&l, "completion_tokens", c->completion_tokens);
    mg_log_bool(&l, "tokens_estimated", !c->have_usage);
    mg_log_end(&l);
}

static void call_unlink(call_t *c)
{
    if (c->prev) c->prev->next = c->next;
    else if (c->srv->calls == c) c->srv->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static uint64_t unix_now_ms(void);
static void call_fail(call_t *c, int status, const char *code, const char *msg,
                      int retry_after_ms);

/* users.default_requests_per_minute: the user (within its application, PRD 3.2.2) may send
 * that many requests per minute; 1 when refused (answered 429). */
static int user_rate_refused(call_t *c)
{
    int limit = c->gen->cfg->user_rpm_limit;
    uint64_t wait_ms = 0;
    if (limit <= 0 || !c->user[0]) return 0;
    char key[400];
    int n = snprintf(key, sizeof(key), "%s/%s", c->app ? c->app->name : "", c->user);
    int rc = mg_userrate_take(c->srv->userrate, key, (size_t)n < sizeof(key) ? (size_t)n : sizeof(key) - 1,
                              (uint32_t)limit, uv_now(c->srv->loop), &wait_ms);
    if (rc == MG_USERRATE_FULL)
        mg_log_msg(MG_LOG_WARN, c->req ? c->req->request_id : NULL,
                   "per-user rate: too many active users to track; request not counted");
    if (rc != MG_USERRATE_LIMITED) return 0;
    call_fail(c, 429, "RATE_LIMITED", "this user's requests per minute are used up",
              (int)wait_ms);
    return 1;
}

/* What the answer cost, in micros of the currency: tokens x the provider's price per 1,000,
 * rounded up (a priced request never costs nothing), charged to the caller's key and
 * project for their spend limits. */
static void charge_spend(call_t *c)
{
    double price = c->provider ? c->provider->cost_per_1k_tokens : 0;
    long long tokens = c->prompt_tokens + c->completion_tokens;
    if (!c->auth.held || price <= 0 || tokens <= 0) return;
    int64_t micros = (int64_t)ceil((double)tokens * price * 1000.0);
    mg_auth_charge(c->srv->auth, &c->auth, micros, unix_now_ms());
}

/* Finished calls kept for the next requests: a call (1.6 KB) is past glibc's per-thread
 * cache, and each calloc of one made malloc sweep its fast bins. Per thread, though only the
 * loop thread makes calls. A spare keeps its routing arrays (up to SPARE_ROUTES routes) for
 * the same reason: at ten routes they are past that cache too. */
#define CALL_SPARES 32
#define SPARE_ROUTES 64
static _Thread_local call_t *call_spares[CALL_SPARES];
static _Thread_local int n_call_spares;

static call_t *call_alloc(void)
{
    if (!MG_RECYCLE || n_call_spares == 0) return calloc(1, sizeof(call_t));
    call_t *c = call_spares[--n_call_spares];
    void *buf = c->routing_buf;
    size_t cap = c->routing_cap;
    memset(c, 0, sizeof(*c));
    c->routing_buf = buf;
    c->routing_cap = cap;
    return c;
}

static void call_release(call_t *c)
{
    if (c->routing_cap > SPARE_ROUTES || !MG_RECYCLE || n_call_spares == CALL_SPARES) {
        free(c->routing_buf);
        c->routing_buf = NULL;
        c->routing_cap = 0;
    }
    if (MG_RECYCLE && n_call_spares < CALL_SPARES) call_spares[n_call_spares++] = c;
    else free(c);
}

static void call_free(call_t *c)
{
    call_unlink(c);
    if (c->xfer) mg_xfer_cancel(c->xfer);
    if (c->req) {
        c->req->on_abort = NULL;
        c->req->on_drain = NULL;
    }
    c->srv->in_flight--;
    if (c->have_usage) {
        mg_auth_settle(&c->auth, c->prompt_tokens + c->completion_tokens);
        charge_spend(c);
    }
    mg_auth_release(&c->auth);
    if (c->queued) mg_sched_cancel(c->srv->sched, &c->entry);
    if (c->entry.lease.held && mg_sched_release(&c->entry.lease) == 0 && !c->srv->stopping_hard)
        mg_server_sched_kick(c->srv);
    mg_gen_req_release(c->gen, c->req_ref);
    mg_gen_unref_value(c->gen, c->state_ref);
    mg_gen_unref(c->gen);
    cJSON_Delete(c->body);
    cJSON_Delete(c->held_finish);
    mg_buf_free(&c->held_raw);
    if (c->sse_ready) mg_sse_free(&c->sse);
    free(c->prefixed_model.name);
    free(c->prefixed_model.routes);
    free(c->prefixed_upstream);
    if (c->wait_timer) {
        uv_timer_stop(c->wait_timer);
        uv_close((uv_handle_t *)c->wait_timer, (uv_close_cb)free);
    }
    mg_buf_free(&c->resp);
    mg_buf_free(&c->out);
    free(c->error_headers);
    call_release(c);
}

/* The provider's answer status as the cooldown policy sees it; applies the
 * cooldown it asks for (persisted, counted, logged). */
static void apply_cooldown_policy(call_t *c, mg_provider_state_t *ps, uint64_t now)
{
    int status = c->up_status;
    mg_pool_changed(ps);
    int n = status == 429 ? mg_cooldown_note_429(&ps->cooldown, now) : ps->cooldown.consecutive_429;
    double secs = 0;
    char err[512];
    if (mg_gen_cooldown(c->gen, c->provider, status, c->error_headers, c->error_headers_len, n,
                        ps->cooldown.observing, &secs, err, sizeof(err)) != 0) {
        mg_log_msg(MG_LOG_ERROR, c->req ? c->req->request_id : NULL, "cooldown policy: %s", err);
        return;
    }
    if (secs <= 0) return;
    mg_cooldown_apply(&ps->cooldown, now, secs);
    ps->cooldowns_total++;
    mg_server_cooldown_applied(c->srv, ps, n, secs, status);
}

/* The pool's state of provider p (one of this call's generation): looked up at p's index,
 * one comparison rather than a search over every provider, per route and attempt. */
static mg_provider_state_t *provider_state(call_t *c, const mg_provider_conf_t *p)
{
    return mg_pool_get_at(&c->srv->pool, (size_t)(p - c->gen->cfg->providers), p);
}

/* End of an attempt: the provider's counters, breaker, health and cooldown. */
static void attempt_end(call_t *c, int success)
{
    mg_provider_state_t *ps = provider_state(c, c->provider);
    if (!ps) return;
    uint64_t now = uv_now(c->srv->loop);
    mg_pool_changed(ps); /* in_flight, health, cooldown, the TPM window */
    ps->in_flight--;
    mg_pool_record(ps, success);
    ps->status_counts[c->up_status / 100 <= 5 ? c->up_status / 100 : 0]++;
    /* a 4xx other than 429 is the client's doing: neither a breaker nor a health failure */
    int provider_fault = !success && (c->up_status == 0 || c->up_status == 429 ||
                                      c->up_status >= 500 || c->up_status < 400);
    /* a failed connection puts the provider's breaker on the way to open; a failed answer
       only this route's, so that the provider's other models keep serving */
    mg_pool_breakers_record(ps, mg_pool_route_of(&c->srv->pool, c->route),
                            now, !provider_fault  ? MG_ATTEMPT_OK
                                 : c->unreachable ? MG_ATTEMPT_UNREACHABLE
                                                  : MG_ATTEMPT_FAILED);
    /* only a stream has a first token; a whole answer's first byte measures the answer */
    int64_t ttft = c->stream && c->t_first ? (int64_t)ms_since(c->t_start, c->t_first) : -1;
    if (mg_health_record(&ps->health, now, !provider_fault,
                         (int64_t)(now - c->attempt_start_ms), ttft))
        mg_server_health_changed(c->srv, ps);
    if (c->up_status >= 400) apply_cooldown_policy(c, ps, now);
    else if (success) mg_cooldown_success(&ps->cooldown, now);
    /* the TPM window learns what the answer really cost */
    if (c->have_usage) mg_limiter_settle(&ps->limiter, &c->resv, c->prompt_tokens + c->completion_tokens);
}

static void call_fail(call_t *c, int status, const char *code, const char *msg, int retry_after_ms)
{
    char body[1536];
    char esc[1024];
    mg_json_escape(esc, sizeof(esc), msg, strlen(msg));
    int n = snprintf(body, sizeof(body),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\","
                     "\"request_id\":\"%s\"",
                     esc, mg_api_error_type(status), code, c->req->request_id);
    if (retry_after_ms > 0)
        n += snprintf(body + n, sizeof(body) - (size_t)n, ",\"retry_after_ms\":%d", retry_after_ms);
    n += snprintf(body + n, sizeof(body) - (size_t)n, "}}");
    char extra[128] = "";
    if (retry_after_ms > 0)
        snprintf(extra, sizeof(extra), "Retry-After: %d\r\n", (retry_after_ms + 999) / 1000);
    if (c->fail_degraded)
        snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), "X-Sidecar-Degraded: %s\r\n",
                 c->fail_degraded);
    c->status = status;
    c->outcome = "error";
    c->error_code = code;
    estimate_tokens(c);
    call_log(c);
    mg_http_respond(c->req, status, "application/json", extra, body, (size_t)n);
    c->req = NULL;
    call_free(c);
}

static void call_respond_json(call_t *c, cJSON *resp)
{
    mg_buf_t text = {0};
    if (mg_json_print(resp, &text) != 0) {
        mg_buf_free(&text);
        call_fail(c, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    c->status = 200;
    c->outcome = "ok";
    call_log(c);
    char deg[64];
    mg_http_respond(c->req, 200, "application/json", degraded_header(c, deg, sizeof(deg)), text.data,
                    text.len);
    c->req = NULL;
    mg_buf_free(&text);
    call_free(c);
}

/* Every candidate failed (or none was left): answer with what the last failure says. */
static void fail_exhausted(call_t *c)
{
    /* the degradation chain ended: the caller's own fallback is next (Sidecar ADR 3.7) */
    if (c->last_fail != FAIL_TIMEOUT && c->last_fail != FAIL_TIMEOUT_TOTAL)
        c->fail_degraded = "openclaw_fallback";
    switch (c->last_fail) {
    case FAIL_RATE_LIMITED:
        call_fail(c, 503, "MODEL_UNAVAILABLE", "every provider for this model is rate limited",
                  c->retry_after_ms > 0 ? c->retry_after_ms : 5000);
        break;
    case FAIL_TIMEOUT:
        call_fail(c, 408, "FIRST_TOKEN_TIMEOUT", "no provider answered in time", 0);
        break;
    case FAIL_TIMEOUT_TOTAL:
        call_fail(c, 408, "INFERENCE_TIMEOUT", "the answer did not complete in time", 0);
        break;
    case FAIL_NONE:
        call_fail(c, 503, "MODEL_UNAVAILABLE", "no provider is available for this model", 1000);
        break;
    case FAIL_AUTH:
        call_fail(c, 502, "MODEL_UNAVAILABLE", "the provider rejected the gateway's credentials", 0);
        break;
    case FAIL_GARBAGE:
        call_fail(c, 502, "MODEL_UNAVAILABLE", "the provider sent an invalid response", 0);
        break;
    case FAIL_ADAPTER:
        call_fail(c, 502, "MODEL_UNAVAILABLE", "no provider adapter could encode the request", 0);
        break;
    default:
        call_fail(c, 502, "MODEL_UNAVAILABLE", "no provider could be reached", 0);
        break;
    }
}

/* ------------------------------------------------------------------------ */
/* Streaming to the client                                                   */
/* ------------------------------------------------------------------------ */

static void out_event(call_t *c, const char *json, size_t n)
{
    mg_buf_append(&c->out, "data: ", 6);
    mg_buf_append(&c->out, json, n);
    mg_buf_append(&c->out, "\n\n", 2);
}

static void out_json(call_t *c, const cJSON *chunk)
{
    mg_buf_append(&c->out, "data: ", 6);
    mg_json_print(chunk, &c->out);
    mg_buf_append(&c->out, "\n\n", 2);
}

/* The stream reaches the client now (its head goes with the next send_out); 1 the first
 * time. */
static int stream_start(call_t *c)
{
    if (c->client_started) return 0;
    c->client_started = 1;
    task_to(c, MG_TASK_STREAMING, "first_chunk");
    return 1;
}

/* c->out to the client in one write: after the stream's head when `head`, before the body's
 * end when `end` (the request is finished then). */
static void send_out(call_t *c, int head, int end)
{
    if (head) {
        char extra[160], deg[64];
        const char *d = degraded_header(c, deg, sizeof(deg));
        snprintf(extra, sizeof(extra), "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n%s",
                 d ? d : "");
        mg_http_stream_open(c->req, 200, "text/event-stream", extra, c->out.data, c->out.len, end);
    } else {
        mg_http_stream_send(c->req, c->out.data, c->out.len, end);
    }
    c->out.len = 0;
}

static void flush_out(call_t *c)
{
    if (!c->out.len || !c->req) return;
    send_out(c, stream_start(c), 0);
}

/* The upstream's read is all handled: what it made goes out in one write (the events of one
 * read, and the end of the stream too when the read held it, see stream_end_ok). */
static void on_up_read_end(void *ud)
{
    flush_out(ud);
}

/* ---- passthrough chunks as bytes: members copied, the gateway's appended ---- */

/* The members of a chunk copied into out as runs of the original text: a run grows while
 * members are kept, and a dropped member (the upstream's usage, when ours replaces it) ends
 * it. Most chunks drop nothing and cost one copy. */
typedef struct {
    mg_buf_t *out;
    int skip_usage;  /* drop the upstream's usage member (ours replaces it) */
    int runs;
    int clash;       /* a member the gateway adds is there already */
    const char *from, *upto; /* the run not yet copied: [first member's quote, last's end) */
} raw_copy_t;

static void raw_copy_flush(raw_copy_t *rc)
{
    if (!rc->from) return;
    if (rc->runs++) mg_buf_append(rc->out, ",", 1);
    mg_buf_append(rc->out, rc->from, (size_t)(rc->upto - rc->from));
    rc->from = NULL;
}

static int raw_copy_member(void *ud, const mg_json_member_t *m)
{
    raw_copy_t *rc = ud;
    if (is_gateway_member(m)) {
        rc->clash = 1;
        return 1;
    }
    if (rc->skip_usage && member_is(m, "usage")) {
        raw_copy_flush(rc);
        return 0;
    }
    if (!rc->from) rc->from = m->key - 1; /* its opening quote */
    rc->upto = m->value + m->value_len;
    return 0;
}

static void append_metadata_raw(call_t *c, mg_buf_t *o)
{
    mg_buf_append_str(o, ",\"request_id\":\"");
    mg_buf_append_str(o, c->req ? c->req->request_id : "");
    mg_buf_append_str(o, "\",\"logical_model\":");
    mg_json_print_string(c->model->name, strlen(c->model->name), o);
    mg_buf_append_str(o, ",\"actual_model\":");
    mg_json_print_string(c->upstream_model, strlen(c->upstream_model), o);
    append_degraded_raw(c, o);
}

/* ,"timing":{...} in whole milliseconds (written without printf: it was a tenth of a
 * passthrough answer's instructions). */
static int append_timing_raw(const call_t *c, uint64_t now, mg_buf_t *o)
{
    mg_buf_append_str(o, ",\"timing\":{\"queue_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, c->t_dispatch));
    mg_buf_append_str(o, ",\"first_token_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, c->t_first));
    mg_buf_append_str(o, ",\"total_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, now));
    return mg_buf_append(o, "}", 1);
}

static void append_totals_raw(call_t *c, mg_buf_t *o)
{
    if (c->have_usage) {
        mg_buf_append_str(o, ",\"usage\":{\"prompt_tokens\":");
        mg_buf_append_int(o, c->prompt_tokens);
        mg_buf_append_str(o, ",\"completion_tokens\":");
        mg_buf_append_int(o, c->completion_tokens);
        mg_buf_append_str(o, ",\"total_tokens\":");
        mg_buf_append_int(o, c->prompt_tokens + c->completion_tokens);
        mg_buf_append(o, "}", 1);
    }
    append_timing_raw(c, uv_hrtime(), o);
}

/* One SSE event into c->out: the chunk's members, then metadata and/or totals.
 * Returns 0, or -1 when the bytes are not one JSON object (or clash with our names). */
static int out_raw_chunk(call_t *c, const char *json, size_t n, int metadata, int totals)
{
    size_t mark = c->out.len;
    raw_copy_t rc = {&c->out, totals && c->have_usage, 0, 0, NULL, NULL};
    mg_buf_append(&c->out, "data: {", 7);
    if (mg_json_members(json, n, raw_copy_member, &rc) != 0 || rc.clash) {
        c->out.len = mark;
        return -1;
    }
    raw_copy_flush(&rc);
    if (!rc.runs) { /* "{}": the members added below would open with a comma */
        c->out.len = mark;
        return -1;
    }
    if (metadata) append_metadata_raw(c, &c->out);
    if (totals) append_totals_raw(c, &c->out);
    mg_buf_append(&c->out, "}\n\n", 3);
    return 0;
}

static void emit_held_finish(call_t *c, int with_totals)
{
    if (c->held_raw.len) {
        int first = c->held_raw_first;
        c->held_raw_first = 0;
        if (out_raw_chunk(c, c->held_raw.data, c->held_raw.len, first, with_totals) != 0)
            out_event(c, c->held_raw.data, c->held_raw.len); /* not ours to change: as is */
        c->held_raw.len = 0;
        return;
    }
    if (!c->held_finish) return;
    if (with_totals) {
        if (c->have_usage && !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(c->held_finish, "usage")))
            set_item(c->held_finish, "usage", usage_json(c));
        set_item(c->held_finish, "timing", timing_json(c, uv_hrtime()));
    }
    out_json(c, c->held_finish);
    cJSON_Delete(c->held_finish);
    c->held_finish = NULL;
}

static void stream_end_ok(call_t *c)
{
    emit_held_finish(c, 1);
    out_event(c, "[DONE]", 6);
    int head = stream_start(c);
    c->status = 200;
    c->outcome = "ok";
    estimate_tokens(c);
    call_log(c);
    send_out(c, head, 1); /* the rest of the stream and its end in one write */
    c->req = NULL;
    call_free(c);
}

/* After bytes reached the client the route is locked: end the stream with an
 * error event and [DONE], so a truncated answer never looks complete. */
static void stream_end_error(call_t *c, const char *code, const char *msg)
{
    char esc[512];
    char ev[1024];
    mg_json_escape(esc, sizeof(esc), msg, strlen(msg));
    int n = snprintf(ev, sizeof(ev),
                     "{\"error\":{\"message\":\"%s\",\"type\":\"api_error\",\"param\":null,"
                     "\"code\":\"%s\",\"request_id\":\"%s\"}}",
                     esc, code, c->req->request_id);
    cJSON_Delete(c->held_finish);
    c->held_finish = NULL;
    c->held_raw.len = 0;
    out_event(c, ev, (size_t)n);
    out_event(c, "[DONE]", 6);
    int head = stream_start(c);
    c->status = 200;
    c->outcome = "error";
    c->error_code = code;
    c->srv->metrics.stream_errors_total++;
    estimate_tokens(c);
    call_log(c);
    send_out(c, head, 1);
    c->req = NULL;
    call_free(c);
}

/* One canonical chunk (owned). Annotates the first and the finishing chunk,
 * folds the usage-only chunk in. */
static void handle_chunk(call_t *c, cJSON *chunk)
{
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(chunk, "usage");
    if (cJSON_IsObject(usage)) take_usage(c, usage);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    int n_choices = cJSON_IsArray(choices) ? cJSON_GetArraySize(choices) : 0;
    if (n_choices == 0 && cJSON_IsObject(usage)) {
        /* the usage-only chunk: its numbers go on the finish chunk */
        emit_held_finish(c, 1);
        if (c->client_include_usage) out_json(c, chunk);
        cJSON_Delete(chunk);
        return;
    }
    int finishing = 0;
    for (const cJSON *ch = choices ? choices->child : NULL; ch; ch = ch->next)
        finishing |= cJSON_IsString(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason"));
    if (!c->first_chunk_done) {
        add_metadata(c, chunk);
        c->first_chunk_done = 1;
    }
    c->chunks++;
    if (finishing) {
        emit_held_finish(c, 0);
        c->held_finish = chunk;
        return;
    }
    out_json(c, chunk);
    cJSON_Delete(chunk);
}

/* A stream event the upstream sent as an error object. */
static int upstream_error_event(call_t *c, const cJSON *err)
{
    const cJSON *msg = cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, "message") : err;
    char text[512];
    snprintf(text, sizeof(text), "upstream error: %s",
             cJSON_IsString(msg) ? msg->valuestring : "unspecified");
    c->stop_stream = 1;
    if (c->xfer) mg_xfer_cancel(c->xfer);
    c->xfer = NULL;
    attempt_end(c, 0);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done) {
        c->last_fail = FAIL_SERVER;
        try_next(c);
    } else {
        stream_end_error(c, "UPSTREAM_ERROR", text);
    }
    return 1;
}

static int garbage_event(call_t *c)
{
    c->stop_stream = 1;
    if (c->xfer) mg_xfer_cancel(c->xfer);
    c->xfer = NULL;
    attempt_end(c, 0);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done) {
        c->last_fail = FAIL_GARBAGE;
        try_next(c);
    } else {
        stream_end_error(c, "UPSTREAM_ERROR", "the provider sent an invalid stream event");
    }
    return 1;
}

/* OpenAI-wire event: forwarded verbatim unless it is one we annotate. */
/* Read the usage member of a chunk's bytes into the call's counts. */
static int take_usage_member(void *ud, const mg_json_member_t *m)
{
    call_t *c = ud;
    if (!member_is(m, "usage") || !m->value_len || m->value[0] != '{') return 0;
    take_usage_bytes(c, m->value, m->value_len);
    return 1;
}

/* An event the gateway annotates, handled as bytes (the common annotated ones: the
 * first chunk, the finish chunk, the usage-only chunk). 0 = done, 1 = needs the tree. */
static int passthrough_raw(call_t *c, const mg_sse_event_t *ev, int flags)
{
    if (flags & MG_CHUNK_ERROR) return 1;
    if (flags & MG_CHUNK_USAGE) mg_json_members(ev->data, ev->data_len, take_usage_member, c);
    int usage_only = (flags & MG_CHUNK_USAGE) && !(flags & MG_CHUNK_FINISH) &&
                     (memmem(ev->data, ev->data_len, "\"choices\":[]", 12) ||
                      memmem(ev->data, ev->data_len, "\"choices\": []", 13));
    if (usage_only) {
        emit_held_finish(c, 1);
        if (c->client_include_usage) mg_buf_append(&c->out, ev->raw, ev->raw_len);
        return 0;
    }
    int first = !c->first_chunk_done;
    c->first_chunk_done = 1;
    c->chunks++;
    if (flags & MG_CHUNK_FINISH) {
        emit_held_finish(c, 0);
        mg_buf_append(&c->held_raw, ev->data, ev->data_len);
        c->held_raw_first = first;
        return 0;
    }
    if (out_raw_chunk(c, ev->data, ev->data_len, first, 0) != 0) {
        c->first_chunk_done = !first;
        c->chunks--;
        return 1;
    }
    return 0;
}

/* OpenAI-wire event: forwarded verbatim unless it is one we annotate. */
static int passthrough_event(call_t *c, const mg_sse_event_t *ev)
{
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) {
        c->upstream_done = 1;
        return 0;
    }
    int flags = mg_chunk_keys(ev->data, ev->data_len);
    if (c->first_chunk_done && !flags) {
        c->chunks++;
        mg_buf_append(&c->out, ev->raw, ev->raw_len);
        return 0;
    }
    if (passthrough_raw(c, ev, flags) == 0) return 0;
    cJSON *chunk = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!cJSON_IsObject(chunk)) {
        cJSON_Delete(chunk);
        return garbage_event(c);
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(chunk, "error");
    if (err && !cJSON_IsNull(err)) {
        int rc = upstream_error_event(c, err);
        cJSON_Delete(chunk);
        return rc;
    }
    handle_chunk(c, chunk);
    return 0;
}

/* Translating adapter: each event decoded by Lua into canonical chunks. */
static int translated_event(call_t *c, const mg_sse_event_t *ev)
{
    cJSON *data = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!data) return garbage_event(c);
    cJSON *chunks = NULL;
    int done = 0;
    char err[512];
    if (c->state_ref < 0) c->state_ref = mg_gen_table_new(c->gen); /* only translators keep state */
    int rc = mg_gen_decode_event(c->gen, c->adapter, req_table(c), c->state_ref, data, &chunks,
                                 &done, err, sizeof(err));
    cJSON_Delete(data);
    if (rc != 0) {
        mg_log_msg(MG_LOG_WARN, c->req->request_id, "adapter %s decode_event: %s",
                   c->provider->adapter, err);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "message", err);
        rc = upstream_error_event(c, e);
        cJSON_Delete(e);
        return rc;
    }
    cJSON *ch = chunks->child;
    while (ch) {
        cJSON *next = ch->next;
        cJSON_DetachItemViaPointer(chunks, ch);
        handle_chunk(c, ch);
        ch = next;
    }
    cJSON_Delete(chunks);
    if (done) c->upstream_done = 1;
    return 0;
}

static int on_stream_event(void *ud, const mg_sse_event_t *ev)
{
    call_t *c = ud;
    if (c->stop_stream) return 1;
    return c->passthrough ? passthrough_event(c, ev) : translated_event(c, ev);
}

/* ------------------------------------------------------------------------ */
/* Upstream callbacks                                                        */
/* ------------------------------------------------------------------------ */

static void on_up_headers(void *ud, int status)
{
    call_t *c = ud;
    c->up_status = status;
    const char *ra = mg_xfer_header(c->xfer, "retry-after");
    size_t ral = ra ? strnlen(ra, sizeof(c->retry_after) - 1) : 0;
    if (ral) memcpy(c->retry_after, ra, ral);
    c->retry_after[ral] = '\0';
    free(c->error_headers); /* the last attempt's */
    c->error_headers = status >= 400 ? mg_xfer_take_error_headers(c->xfer, &c->error_headers_len)
                                     : NULL;
    c->resp.len = 0;
    if (status >= 200 && status < 300 && c->stream && !c->sse_ready) {
        mg_sse_init(&c->sse, c->ndjson ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE);
        c->sse_ready = 1;
        mg_buf_reserve(&c->out, 16384); /* a typical read's worth of events, allocated once */
    }
}

static int on_up_data(void *ud, const char *data, size_t len)
{
    call_t *c = ud;
    int ok_status = c->up_status >= 200 && c->up_status < 300;
    if (ok_status && !c->t_first) c->t_first = uv_hrtime();
    if (ok_status && c->stream) {
        int rc = mg_sse_feed(&c->sse, data, len, on_stream_event, c);
        if (rc > 0) return 0; /* an event handler finished the call or moved it on: c may be gone */
        if (rc < 0) {
            if (!c->stop_stream) {
                c->stop_stream = 1;
                mg_xfer_cancel(c->xfer);
                c->xfer = NULL;
                attempt_end(c, 0);
                stream_end_error(c, "UPSTREAM_ERROR", "stream event too large");
            }
            return 0; /* the call is finished (or moved on); the transfer is cancelled */
        }
        /* the events go out in on_up_read_end: one write per upstream read */
        return c->req && mg_http_write_pending(c->req) ? 1 : 0;
    }
    size_t limit = ok_status ? MAX_RESPONSE_BYTES : MAX_ERROR_BODY_BYTES;
    size_t have = c->resp.len;
    if (have + len > limit) len = have < limit ? limit - have : 0;
    if (len) mg_buf_append(&c->resp, data, len);
    return 0;
}

static int parse_retry_after_ms(const char *v)
{
    if (!v || !*v) return 0;
    char *end;
    double secs = strtod(v, &end);
    if (end == v || secs < 0) return 0;
    if (secs > 3600) secs = 3600;
    return (int)(secs * 1000);
}

/* The upstream's own error message, for a 4xx the client should see. */
static void upstream_message(call_t *c, char *out, size_t cap)
{
    cJSON *j = c->resp.len ? cJSON_ParseWithLength(c->resp.data, c->resp.len) : NULL;
    const cJSON *err = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    const cJSON *msg = cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, "message") : err;
    if (cJSON_IsString(msg)) snprintf(out, cap, "upstream rejected the request: %s", msg->valuestring);
    else snprintf(out, cap, "upstream rejected the request (HTTP %d)", c->up_status);
    cJSON_Delete(j);
}

/* Make a gateway-built or decoded answer match the OpenAI schema where upstreams
 * are lax: choices carry logprobs, chat messages carry refusal. */
static void conform_response(call_t *c, cJSON *resp)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    for (cJSON *ch = choices ? choices->child : NULL; ch; ch = ch->next) {
        if (!cJSON_HasObjectItem(ch, "logprobs")) cJSON_AddNullToObject(ch, "logprobs");
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        if (cJSON_IsObject(msg) && !cJSON_HasObjectItem(msg, "refusal"))
            cJSON_AddNullToObject(msg, "refusal");
    }
}

typedef struct {
    call_t *c;
    int members;
    int clash; /* the upstream already uses one of our metadata names */
} resp_scan_t;

static int scan_response_member(void *ud, const mg_json_member_t *m)
{
    resp_scan_t *st = ud;
    st->members++;
    if (member_is(m, "usage") && m->value_len && m->value[0] == '{') {
        take_usage_bytes(st->c, m->value, m->value_len);
    } else if (is_gateway_member(m)) {
        st->clash = 1;
    }
    return 0;
}

/* Passthrough answers are forwarded as the upstream wrote them, with the gateway's
 * metadata appended as extra members: no tree is built. Returns 0 when answered,
 * 1 when the tree path must handle it, -1 when the body is not a JSON object. */
static int finish_passthrough_json(call_t *c)
{
    resp_scan_t st = {c, 0, 0};
    if (mg_json_members(c->resp.data, c->resp.len, scan_response_member, &st) != 0) return -1;
    if (st.clash || st.members == 0) return 1;
    const char *end = c->resp.data + c->resp.len;
    while (end > c->resp.data && end[-1] != '}') end--;
    mg_buf_t out = {0};
    /* the metadata below in one allocation: the names' escaping reserve included, every
       growth was a realloc and a copy */
    size_t names = strlen(c->model->name) + strlen(c->upstream_model);
    mg_buf_reserve(&out, c->resp.len + 6 * names + 330);
    mg_buf_append(&out, c->resp.data, (size_t)(end - 1 - c->resp.data));
    mg_buf_append_str(&out, ",\"request_id\":\"");
    mg_buf_append_str(&out, c->req->request_id);
    mg_buf_append_str(&out, "\",\"logical_model\":");
    mg_json_print_string(c->model->name, strlen(c->model->name), &out);
    mg_buf_append_str(&out, ",\"actual_model\":");
    mg_json_print_string(c->upstream_model, strlen(c->upstream_model), &out);
    append_degraded_raw(c, &out);
    if (append_timing_raw(c, uv_hrtime(), &out) != 0 || mg_buf_append(&out, "}", 1) != 0) {
        mg_buf_free(&out);
        return 1;
    }
    attempt_end(c, 1);
    c->status = 200;
    c->outcome = "ok";
    call_log(c);
    char deg[64];
    mg_http_respond(c->req, 200, "application/json", degraded_header(c, deg, sizeof(deg)), out.data,
                    out.len);
    c->req = NULL;
    mg_buf_free(&out);
    call_free(c);
    return 0;
}

static void finish_non_stream(call_t *c)
{
    if (c->passthrough) {
        int rc = finish_passthrough_json(c);
        if (rc == 0) return;
        if (rc < 0) {
            attempt_end(c, 0);
            c->last_fail = FAIL_GARBAGE;
            try_next(c);
            return;
        }
    }
    cJSON *resp = cJSON_ParseWithLength(c->resp.data ? c->resp.data : "", c->resp.len);
    if (!cJSON_IsObject(resp)) {
        cJSON_Delete(resp);
        attempt_end(c, 0);
        c->last_fail = FAIL_GARBAGE;
        try_next(c);
        return;
    }
    if (!c->passthrough) {
        cJSON *decoded = NULL;
        char err[512];
        if (mg_gen_decode(c->gen, c->adapter, req_table(c), resp, &decoded, err, sizeof(err)) != 0) {
            mg_log_msg(MG_LOG_WARN, c->req->request_id, "adapter %s decode: %s",
                       c->provider->adapter, err);
            cJSON_Delete(resp);
            attempt_end(c, 0);
            c->last_fail = FAIL_GARBAGE;
            try_next(c);
            return;
        }
        cJSON_Delete(resp);
        resp = decoded;
    }
    attempt_end(c, 1);
    take_usage(c, cJSON_GetObjectItemCaseSensitive(resp, "usage"));
    if (c->ep != MG_EP_EMBEDDINGS) conform_response(c, resp);
    add_metadata(c, resp);
    set_item(resp, "timing", timing_json(c, uv_hrtime()));
    call_respond_json(c, resp);
    cJSON_Delete(resp);
}

static void finish_stream(call_t *c)
{
    if (c->sse_ready && mg_sse_pending(&c->sse) > 0 && c->ndjson) {
        /* NDJSON's last line may come without its newline */
        if (mg_sse_feed(&c->sse, "\n", 1, on_stream_event, c) > 0) return; /* c may be gone */
    }
    if (c->upstream_done) {
        attempt_end(c, 1);
        stream_end_ok(c);
        return;
    }
    attempt_end(c, 0);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done) {
        c->last_fail = FAIL_GARBAGE;
        try_next(c);
        return;
    }
    stream_end_error(c, "UPSTREAM_ERROR", "the upstream stream ended before completion");
}

static void on_up_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    call_t *c = ud;
    c->xfer = NULL;
    c->unreachable = result == MG_XFER_CONNECT_ERROR;
    int status = c->up_status;
    mg_metrics_t *m = &c->srv->metrics;
    if (result == MG_XFER_FIRST_BYTE_TIMEOUT) m->timeouts_by[MG_TIMEOUT_FIRST_TOKEN]++;
    else if (result == MG_XFER_TOTAL_TIMEOUT) m->timeouts_by[MG_TIMEOUT_INFERENCE]++;
    else if (result == MG_XFER_IDLE_TIMEOUT) m->timeouts_by[MG_TIMEOUT_IDLE]++;
    if (result != MG_XFER_OK) {
        if (c->stream && (c->client_started || c->out.len > 0 || c->first_chunk_done)) {
            attempt_end(c, 0);
            int timeout = result == MG_XFER_IDLE_TIMEOUT || result == MG_XFER_TOTAL_TIMEOUT;
            stream_end_error(c, timeout ? "UPSTREAM_TIMEOUT" : "UPSTREAM_ERROR",
                             timeout ? "the upstream stalled mid-stream"
                                     : "the upstream connection failed mid-stream");
            return;
        }
        attempt_end(c, 0);
        if (result == MG_XFER_CONNECT_ERROR) c->last_fail = FAIL_CONNECT;
        else if (result == MG_XFER_FIRST_BYTE_TIMEOUT)
            c->last_fail = FAIL_TIMEOUT;
        else if (result == MG_XFER_TOTAL_TIMEOUT)
            c->last_fail = FAIL_TIMEOUT_TOTAL;
        else c->last_fail = FAIL_SERVER;
        mg_log_msg(MG_LOG_INFO, c->req->request_id, "upstream %s attempt failed: %s",
                   c->provider->id, detail ? detail : "error");
        try_next(c);
        return;
    }
    if (status == 429 || status >= 500 || status == 401 || status == 403) {
        attempt_end(c, 0);
        if (status == 429) {
            c->last_fail = FAIL_RATE_LIMITED;
            int ra = parse_retry_after_ms(c->retry_after);
            if (ra > c->retry_after_ms) c->retry_after_ms = ra;
        } else {
            c->last_fail = status >= 500 ? FAIL_SERVER : FAIL_AUTH;
        }
        mg_log_msg(MG_LOG_INFO, c->req->request_id, "upstream %s answered %d", c->provider->id,
                   status);
        try_next(c);
        return;
    }
    if (status < 200 || status >= 300) {
        attempt_end(c, 1); /* the provider works; the request was wrong */
        char msg[700];
        upstream_message(c, msg, sizeof(msg));
        call_fail(c, 400, "INVALID_REQUEST", msg, 0);
        return;
    }
    if (c->stream) finish_stream(c);
    else finish_non_stream(c);
}

static const mg_xfer_cbs_t xfer_cbs = {on_up_headers, on_up_data, on_up_done, on_up_read_end};

/* ------------------------------------------------------------------------ */
/* Attempts                                                                  */
/* ------------------------------------------------------------------------ */

static const char *endpoint_name(mg_endpoint_t ep)
{
    return ep == MG_EP_CHAT ? "chat" : ep == MG_EP_COMPLETIONS ? "completions" : "embeddings";
}

/* The gateway's own request headers, after the adapter's: the transfer's extra_head, sent
 * as they are (a list node per header cost two mallocs and two frees each, and checking
 * lines built here was wasted). */
#define BASE_HEAD_MAX 192
static const char *base_head(const call_t *c, char *buf)
{
    static const char json[] = "Content-Type: application/json\r\nAccept: application/json\r\n"
                               "User-Agent: moongate/0.1\r\nX-Request-Id: ";
    static const char sse[] = "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                              "User-Agent: moongate/0.1\r\nX-Request-Id: ";
    _Static_assert(sizeof(sse) + MG_REQUEST_ID_LEN + 2 <= BASE_HEAD_MAX, "BASE_HEAD_MAX");
    const char *head = c->stream ? sse : json;
    size_t n = c->stream ? sizeof(sse) - 1 : sizeof(json) - 1;
    size_t id = strlen(c->req->request_id);
    memcpy(buf, head, n);
    memcpy(buf + n, c->req->request_id, id);
    memcpy(buf + n + id, "\r\n", 3);
    return buf;
}

typedef struct {
    call_t *c;
    mg_buf_t *out;
} splice_t;

static int splice_member(void *ud, const mg_json_member_t *m)
{
    splice_t *sp = ud;
    if (is_extension(m) || member_is(m, "model") || (sp->c->stream && member_is(m, "stream_options")))
        return 0;
    if (sp->c->tokens_capped && (member_is(m, "max_tokens") || member_is(m, "max_completion_tokens")))
        return 0;
    append_member(sp->out, m, "", ",");
    return 0;
}

/* The upstream body for a passthrough adapter, spliced from the client's bytes:
 * the same members minus the extensions, with the route's model and the gateway's
 * stream_options. Equivalent to printing the sanitized tree, at a fraction of the cost. */
static int passthrough_body(call_t *c, const char *model, mg_buf_t *out)
{
    splice_t sp = {c, out};
    /* room for all of it up front: the members, the model (escaping reserve included), the
       options; growth would copy the body once more per doubling */
    mg_buf_reserve(out, c->req->body_len + 6 * strlen(model) + 96);
    mg_buf_append(out, "{", 1);
    if (c->body_members) {
        for (size_t i = 0; i < c->n_body_members; i++) splice_member(&sp, &c->body_members[i]);
    } else if (mg_json_members(c->req->body, c->req->body_len, splice_member, &sp) != 0) {
        return -1;
    }
    mg_buf_append(out, "\"model\":", 8);
    mg_json_print_string(model, strlen(model), out);
    if (c->stream) mg_buf_append_str(out, ",\"stream_options\":{\"include_usage\":true}");
    if (c->mapped_max_tokens >= 0) {
        mg_buf_append_str(out, ",\"max_tokens\":");
        mg_json_print_number((double)c->mapped_max_tokens, out);
    }
    return mg_buf_append(out, "}", 1);
}

/* How long this attempt may take: the inference budget, cut to what is left of the
 * request's total deadline (at least 1 ms: an expired budget fails at once). */
static int attempt_budget_ms(const call_t *c, uint64_t now)
{
    long long left = (long long)c->total_deadline_ms - (long long)now;
    long long ms = c->inference_ms;
    if (left < ms) ms = left;
    return ms < 1 ? 1 : (int)ms;
}

/* Data leaving the machine is audited (edge PRD 3.7.3): which request, which application,
 * which cloud provider. */
static void audit_cloud(call_t *c)
{
    if (!mg_log_enabled(MG_LOG_INFO)) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "audit");
    mg_log_str(&l, "event", "cloud_egress");
    mg_log_str(&l, "request_id", c->req ? c->req->request_id : NULL);
    mg_log_str(&l, "provider", c->provider->id);
    mg_log_str(&l, "application", c->app ? c->app->name : NULL);
    mg_log_str(&l, "degraded", c->degraded);
    mg_log_end(&l);
}

/* Reserve the provider's capacity for one attempt: the probe slots of the provider's and
 * the route's breakers, then RPM/TPM (at the emergency share when the plan says so).
 * 0 = reserved, -1 = a breaker refused, -2 = a rate limit refused (limited_until_ms
 * updated). */
static int reserve_provider(call_t *c, mg_provider_state_t *ps, mg_route_state_t *rs,
                            const mg_plan_entry_t *e)
{
    uint64_t now = uv_now(c->srv->loop);
    if (!mg_pool_breakers_allow(ps, rs, now)) return -1;
    mg_pool_changed(ps); /* the rate windows */
    int rc = e->emergency
                 ? mg_limiter_reserve_emergency(&ps->limiter, now, c->est_tokens, &c->resv)
                 : mg_limiter_reserve(&ps->limiter, now, c->est_tokens, &c->resv);
    if (rc == MG_LIMIT_OK) return 0;
    mg_pool_breakers_release(ps, rs, now);
    uint64_t next = mg_limiter_next_ms(&ps->limiter, now, c->est_tokens);
    if (e->emergency) next = mg_rpm_next_ms(&ps->limiter.emergency, now);
    if (!c->limited || next < c->limited_until_ms) c->limited_until_ms = next;
    c->limited++;
    return -2;
}

/* Encode and send to one plan entry. 0 when the transfer started, -2 when a rate
 * limit refused it, -1 otherwise. */
static int start_attempt(call_t *c, const mg_plan_entry_t *e)
{
    const mg_config_t *cfg = c->gen->cfg;
    const mg_candidate_t *cand = &c->cands[e->index];
    const mg_route_conf_t *r = cand->route;
    int pi = (int)(cand->provider - cfg->providers);
    mg_provider_state_t *ps = provider_state(c, cand->provider);
    if (!ps) return -1;
    int translating = !c->gen->adapters[c->gen->provider_adapter[pi]].passthrough;
    if (translating && !call_tree(c)) return -1; /* out of memory */
    mg_route_state_t *rs = mg_pool_route_of(&c->srv->pool, r);
    int rc = reserve_provider(c, ps, rs, e);
    if (rc != 0) return rc;
    c->provider = cand->provider;
    c->route = r;
    c->upstream_model = r->model;
    c->degraded = e->degraded;
    c->adapter = c->gen->provider_adapter[pi];
    c->passthrough = c->gen->adapters[c->adapter].passthrough;
    if (!c->passthrough) {
        set_item(c->body, "model", cJSON_CreateString(r->model));
        mg_gen_req_set_body(c->gen, req_table(c), c->body);
    }

    mg_encoded_t enc;
    char err[512];
    uint64_t now = uv_now(c->srv->loop);
    if (mg_gen_encode(c->gen, c->adapter, &c->lua_info, &c->req_ref, c->provider, r->model, &enc,
                      err, sizeof(err)) != 0) {
        mg_log_msg(MG_LOG_WARN, c->req->request_id, "adapter %s encode for provider %s: %s",
                   c->provider->adapter, c->provider->id, err);
        mg_limiter_cancel(&ps->limiter, &c->resv); /* (the release says it changed) */
        mg_pool_breakers_release(ps, rs, now);
        c->last_fail = FAIL_ADAPTER;
        return -1;
    }
    c->ndjson = enc.ndjson;
    mg_buf_t body = {0};
    size_t base_len = strlen(c->provider->base_url), path_len = strlen(enc.path);
    char url_buf[512];
    char *url = base_len + path_len < sizeof(url_buf) ? url_buf : malloc(base_len + path_len + 1);
    rc = enc.body ? mg_json_print(enc.body, &body)
         : c->passthrough ? passthrough_body(c, r->model, &body)
                          : mg_json_print(c->body, &body);
    if (rc != 0 || !url) {
        mg_buf_free(&body);
        if (url != url_buf) free(url);
        mg_encoded_free(&enc);
        mg_limiter_cancel(&ps->limiter, &c->resv); /* (the release says it changed) */
        mg_pool_breakers_release(ps, rs, now);
        return -1;
    }
    memcpy(url, c->provider->base_url, base_len);
    memcpy(url + base_len, enc.path, path_len + 1);
    char head[BASE_HEAD_MAX];
    mg_xfer_opts_t o = {
        .method = enc.method,
        .url = url,
        .headers = enc.headers,
        .extra_head = base_head(c, head),
        .body = body.data, /* moved into the transfer */
        .body_len = body.len,
        .connect_timeout_ms = cfg->timeouts.connect_ms,
        .first_byte_timeout_ms = c->first_token_ms,
        .idle_timeout_ms = cfg->timeouts.idle_ms,
        .total_timeout_ms = attempt_budget_ms(c, now),
    };
    enc.headers = NULL; /* moved into the transfer */
    c->up_status = 0;
    c->unreachable = 0;
    c->resp.len = 0;
    c->t_first = 0;
    c->attempts++;
    c->attempt_start_ms = now;
    task_to(c, MG_TASK_RUNNING, "upstream_request_sent");
    if (!c->provider->local) audit_cloud(c);
    mg_pool_changed(ps);
    ps->in_flight++;
    ps->requests_total++;
    if (e->emergency) {
        ps->emergency_total++;
        c->srv->metrics.emergency_total++;
    }
    rc = mg_xfer_start(c->srv->upstream, &o, &xfer_cbs, c, &c->xfer);
    if (url != url_buf) free(url);
    mg_encoded_free(&enc);
    if (rc != 0) {
        c->last_fail = FAIL_CONNECT;
        c->unreachable = 1;
        attempt_end(c, 0);
        return -1;
    }
    return 0;
}

static void on_wait_timer(uv_timer_t *t)
{
    plan_and_dispatch(t->data);
}

/* Ask routing again after `ms` (bounded by the request's deadline). 0 = waiting. */
static int wait_then_replan(call_t *c, uint64_t ms)
{
    uint64_t now = uv_now(c->srv->loop);
    if (now + ms > c->deadline_ms) return -1;
    if (!c->wait_timer) {
        c->wait_timer = malloc(sizeof(*c->wait_timer));
        if (!c->wait_timer) return -1;
        uv_timer_init(c->srv->loop, c->wait_timer);
        c->wait_timer->data = c;
    }
    uv_timer_start(c->wait_timer, on_wait_timer, ms ? ms : 1, 0);
    return 0;
}

/* Every entry of the plan was tried or refused. A plan cut at req.plan_limit is asked for
 * again when the limit is now higher: after a failed attempt (its route is now passed over),
 * or when entries were passed over that it did not count (an adapter that could not encode
 * the request, a provider that reached its rate limit during an attempt). Tried routes count
 * towards the limit, so it only grows, up to every candidate: this ends. */
static void plan_exhausted(call_t *c)
{
    int max = c->gen->cfg->max_retries;
    int limit = -1; /* -1: the candidates are not described afresh yet */
    if (c->plan_limit != 0 && c->attempts < max) {
        limit = fill_candidates(c, uv_now(c->srv->loop));
        if (limit == 0 || limit > c->plan_limit) {
            route_and_dispatch(c, limit);
            return;
        }
    }
    if (c->limited && c->attempts == 0) {
        /* every candidate is at its rate limit: wait for the earliest token */
        uint64_t now = uv_now(c->srv->loop);
        uint64_t wait = c->limited_until_ms > now ? c->limited_until_ms - now : 1;
        if (wait_then_replan(c, wait) == 0) return;
        c->fail_degraded = "openclaw_fallback";
        call_fail(c, 503, "MODEL_UNAVAILABLE",
                  "every provider for this model is at its rate limit", (int)wait);
        return;
    }
    /* a failed attempt may have changed the picture (a provider now cooling): ask again */
    if (c->attempts > 0 && c->attempts < max && c->route_calls <= max) {
        route_and_dispatch(c, limit >= 0 ? limit : fill_candidates(c, uv_now(c->srv->loop)));
        return;
    }
    fail_exhausted(c);
}

static void try_next(call_t *c)
{
    int max = c->gen->cfg->max_retries;
    while (c->plan_next < c->plan_n && c->attempts < max) {
        const mg_plan_entry_t *e = &c->plan[c->plan_next++];
        /* one attempt per route and request: a re-plan must not hammer what just failed */
        int route = c->cand_route[e->index];
        if (c->tried[route]) continue;
        int rc = start_attempt(c, e);
        if (rc == 0) {
            c->tried[route] = 1;
            return;
        }
        if (rc == -1) c->tried[route] = 1;
    }
    if (c->attempts >= max) {
        fail_exhausted(c);
        return;
    }
    plan_exhausted(c);
}

/* ------------------------------------------------------------------------ */
/* Request validation                                                        */
/* ------------------------------------------------------------------------ */

/* stream_options as the gateway sends it upstream: the last chunk's usage meters the answer. */
static cJSON *usage_options(void)
{
    cJSON *opts = cJSON_CreateObject();
    cJSON_AddTrueToObject(opts, "include_usage");
    return opts;
}

/* Check the body's shape for the endpoint; NULL when fine, else the problem. */
static const char *validate(mg_endpoint_t ep, const cJSON *body)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!cJSON_IsString(model) || !model->valuestring[0]) return "'model' must be a non-empty string";
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream)) return "'stream' must be a boolean";
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(body, "max_output_tokens");
    if (mot && !cJSON_IsNull(mot) && (!cJSON_IsNumber(mot) || mot->valuedouble < 1))
        return "'max_output_tokens' must be a positive integer";
    if (ep == MG_EP_CHAT) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            return "'messages' must be a non-empty array";
        for (const cJSON *m = msgs->child; m; m = m->next)
            if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
                return "each message must be an object with a 'role'";
    } else if (ep == MG_EP_COMPLETIONS) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(p) && !cJSON_IsArray(p)) return "'prompt' must be a string or an array";
    } else if (ep == MG_EP_EMBEDDINGS) {
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "input");
        if (!cJSON_IsString(in) && !cJSON_IsArray(in)) return "'input' must be a string or an array";
    }
    return NULL;
}

/* Strip the extensions, map max_output_tokens, ask streams for usage. */
static void sanitize(call_t *c)
{
    cJSON *b = c->body;
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(b, "max_output_tokens");
    c->mapped_max_tokens = -1;
    if (cJSON_IsNumber(mot) && c->ep != MG_EP_EMBEDDINGS &&
        !cJSON_HasObjectItem(b, "max_tokens") && !cJSON_HasObjectItem(b, "max_completion_tokens")) {
        c->mapped_max_tokens = (long long)mot->valuedouble;
        cJSON_AddNumberToObject(b, "max_tokens", (double)c->mapped_max_tokens);
    }
    for (size_t i = 0; i < N_EXTENSIONS; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(b, extension_keys[i].name);
    c->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "stream")) && c->ep != MG_EP_EMBEDDINGS;
    if (c->stream) {
        const cJSON *so = cJSON_GetObjectItemCaseSensitive(b, "stream_options");
        c->client_include_usage =
            cJSON_IsObject(so) && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
        set_item(b, "stream_options", usage_options());
    }
}

/* ---- the fast path: the body read as bytes, no tree -------------------------------------
 * Most requests carry no extension, so sanitize() would not change their tree, and the
 * passthrough adapters send the client's bytes (spliced, see passthrough_body) rather than a
 * printed tree: for them the tree was built only to read a few members and then freed. The
 * fast path reads those members from the bytes instead, for a body that gives exactly what
 * the tree would: cJSON would accept it (mg_json_check_members), it is one object with only plain
 * whitespace, no extension, no escaped key (that could name anything once decoded), and its
 * model, stream and messages pass validate(). Anything else, every error included, takes the
 * tree path as before. A translating adapter gets its tree later (call_tree). */

typedef struct {
    const char *model;    /* in the request's arena */
    int stream;           /* "stream": true */
    int include_usage;    /* stream_options.include_usage: true */
    long long max_tokens; /* max_tokens, else max_completion_tokens; -1 if neither is a number */
    const char *user;     /* the "user" string's bytes (no escapes in them), or NULL */
    size_t user_len;
    const mg_json_member_t *members; /* every member, in order (the request's arena), so
                                        that the upstream body is spliced without a second
                                        scan; NULL when there were more than FAST_MEMBERS */
    size_t n_members;
} fast_body_t;

#define FAST_MEMBERS 32

/* The members it reads, first occurrence (what cJSON's lookups find). */
enum { F_MODEL, F_STREAM, F_SHAPE, F_MAX_TOKENS, F_MAX_COMPLETION, F_STREAM_OPTIONS, F_USER, F_N };

typedef struct {
    const char *keys[F_N];
    size_t key_len[F_N];
    mg_json_member_t m[F_N];
    unsigned char seen[F_N];
    mg_json_member_t *all; /* room for FAST_MEMBERS, or NULL */
    size_t n_all;          /* members seen: more than FAST_MEMBERS means not all kept */
} fast_scan_t;

static int has_escape(const char *s, size_t n)
{
    return memchr(s, '\\', n) != NULL;
}

static int fast_member(void *ud, const mg_json_member_t *m)
{
    fast_scan_t *f = ud;
    if (has_escape(m->key, m->key_len) || is_extension(m)) return 1;
    if (f->all && f->n_all < FAST_MEMBERS) f->all[f->n_all] = *m;
    f->n_all++;
    for (int k = 0; k < F_N; k++) {
        if (m->key_len != f->key_len[k] || !f->keys[k] || memcmp(m->key, f->keys[k], m->key_len))
            continue;
        if (!f->seen[k]) f->m[k] = *m;
        f->seen[k] = 1;
        break;
    }
    return 0;
}

/* A string value whose bytes are its text: no escape, no control byte. */
static int plain_string(const mg_json_member_t *m)
{
    if (m->value_len < 2 || m->value[0] != '"') return 0;
    for (size_t i = 1; i + 1 < m->value_len; i++)
        if ((unsigned char)m->value[i] < 0x20 || m->value[i] == '\\') return 0;
    return 1;
}

static int is_literal(const mg_json_member_t *m, const char *lit)
{
    size_t n = strlen(lit);
    return m->value_len == n && memcmp(m->value, lit, n) == 0;
}

/* A number value as cJSON reads it (the checked text makes the value exactly the number):
 * 1 and *out, 0 when not a number, -1 when too long to bother (the tree path reads it). */
static int number_value(const mg_json_member_t *m, long long *out)
{
    char num[64];
    if (m->value[0] != '-' && (m->value[0] < '0' || m->value[0] > '9')) return 0;
    if (m->value_len >= sizeof(num)) return -1;
    if (m->value_len <= 15 && m->value[0] != '-') { /* digits only: exact in a double */
        long long v = 0;
        size_t i = 0;
        while (i < m->value_len && m->value[i] >= '0' && m->value[i] <= '9')
            v = v * 10 + (m->value[i++] - '0');
        if (i == m->value_len) {
            *out = v;
            return 1;
        }
    }
    const char *dp = localeconv()->decimal_point; /* as cJSON, which hands '.' to strtod so */
    for (size_t i = 0; i < m->value_len; i++) num[i] = m->value[i] == '.' ? dp[0] : m->value[i];
    num[m->value_len] = '\0';
    *out = (long long)strtod(num, NULL);
    return 1;
}

/* stream_options.include_usage: 1 true, 0 anything else, -1 an escaped key. */
static int usage_flag(void *ud, const mg_json_member_t *m)
{
    int *flag = ud;
    if (has_escape(m->key, m->key_len)) *flag = -1;
    else if (member_is(m, "include_usage")) *flag = is_literal(m, "true");
    else return 0;
    return 1;
}

/* validate()'s rule for one chat message: an object whose first "role" is a string. */
static int role_member(void *ud, const mg_json_member_t *m)
{
    int *role = ud;
    if (has_escape(m->key, m->key_len)) *role = -1;
    else if (member_is(m, "role")) *role = m->value[0] == '"';
    else return 0;
    return 1;
}

static int message_ok(void *ud, const char *v, size_t n)
{
    int role = 0;
    if (v[0] != '{' || mg_json_members(v, n, role_member, &role) < 0 || role != 1) return 1;
    ++*(int *)ud;
    return 0;
}

/* validate()'s rule for the endpoint's main member, on the bytes. */
static int shape_ok(mg_endpoint_t ep, const fast_scan_t *f)
{
    const mg_json_member_t *m = &f->m[F_SHAPE];
    if (!f->keys[F_SHAPE]) return 1;
    if (!f->seen[F_SHAPE]) return 0;
    if (ep != MG_EP_CHAT) return m->value[0] == '"' || m->value[0] == '[';
    int n = 0;
    return m->value[0] == '[' && mg_json_elements(m->value, m->value_len, message_ok, &n) == 0 &&
           n > 0;
}

/* The output ceiling the client asked for, as mg_proxy_handle reads it from the tree. */
static int fast_max_tokens(const fast_scan_t *f, long long *out)
{
    *out = -1;
    int rc = f->seen[F_MAX_TOKENS] ? number_value(&f->m[F_MAX_TOKENS], out) : 0;
    if (rc == 0 && f->seen[F_MAX_COMPLETION]) rc = number_value(&f->m[F_MAX_COMPLETION], out);
    return rc < 0 ? -1 : 0;
}

static int fast_stream(const fast_scan_t *f, fast_body_t *fb)
{
    const mg_json_member_t *st = &f->m[F_STREAM];
    if (f->seen[F_STREAM] && !is_literal(st, "true") && !is_literal(st, "false") &&
        !is_literal(st, "null"))
        return -1;
    fb->stream = f->seen[F_STREAM] && is_literal(st, "true");
    fb->include_usage = 0;
    const mg_json_member_t *so = &f->m[F_STREAM_OPTIONS];
    if (!f->seen[F_STREAM_OPTIONS] || so->value[0] != '{') return 0;
    int flag = 0;
    if (mg_json_members(so->value, so->value_len, usage_flag, &flag) < 0 || flag < 0) return -1;
    fb->include_usage = flag;
    return 0;
}

/* 0 = read (fb filled, the model copied into the request's arena); -1 = the tree path. */
static int fast_body(mg_http_req_t *req, mg_endpoint_t ep, fast_body_t *fb)
{
    fast_scan_t f = {.keys = {"model", "stream", NULL, "max_tokens", "max_completion_tokens",
                              "stream_options", "user"}};
    f.keys[F_SHAPE] = ep == MG_EP_CHAT          ? "messages"
                      : ep == MG_EP_COMPLETIONS ? "prompt"
                      : ep == MG_EP_EMBEDDINGS  ? "input"
                                                : NULL;
    for (int k = 0; k < F_N; k++) f.key_len[k] = f.keys[k] ? strlen(f.keys[k]) : 0;
    f.all = mg_arena_alloc(&req->arena, FAST_MEMBERS * sizeof(*f.all));
    if (mg_json_check_members(req->body, req->body_len, fast_member, &f) != 0) return -1;
    fb->members = f.all && f.n_all <= FAST_MEMBERS ? f.all : NULL;
    fb->n_members = f.n_all;
    const mg_json_member_t *model = &f.m[F_MODEL];
    if (!f.seen[F_MODEL] || !plain_string(model) || model->value_len == 2) return -1;
    if (fast_stream(&f, fb) != 0 || !shape_ok(ep, &f) || fast_max_tokens(&f, &fb->max_tokens) != 0)
        return -1;
    fb->user = NULL;
    fb->user_len = 0;
    if (f.seen[F_USER] && f.m[F_USER].value[0] == '"') {
        if (!plain_string(&f.m[F_USER])) return -1;
        fb->user = f.m[F_USER].value + 1;
        fb->user_len = f.m[F_USER].value_len - 2;
    }
    fb->model = mg_arena_strndup(&req->arena, model->value + 1, model->value_len - 2);
    return fb->model ? 0 : -1;
}

/* sanitize() and the caller's identity on the tree path: metadata (an extension, so read
 * before sanitize() strips it) names the application and the user. */
static void sanitize_tree(call_t *c)
{
    cJSON *req_meta = cJSON_DetachItemFromObjectCaseSensitive(c->body, "metadata");
    sanitize(c);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(req_meta, "application");
    c->app = cJSON_IsString(meta) ? mg_config_app(c->gen->cfg, meta->valuestring) : NULL;
    const cJSON *uid = cJSON_GetObjectItemCaseSensitive(req_meta, "user_id");
    if (!cJSON_IsString(uid)) uid = cJSON_GetObjectItemCaseSensitive(c->body, "user");
    if (cJSON_IsString(uid)) snprintf(c->user, sizeof(c->user), "%s", uid->valuestring);
    cJSON_Delete(req_meta);
}

/* The same from the fast path's view: no extension, so nothing is mapped or stripped and
 * there is no metadata. */
static void sanitize_fast(call_t *c, const fast_body_t *fb)
{
    c->body_members = fb->members;
    c->n_body_members = fb->n_members;
    c->mapped_max_tokens = -1;
    c->stream = fb->stream && c->ep != MG_EP_EMBEDDINGS;
    c->client_include_usage = c->stream && fb->include_usage;
    c->app = NULL;
    size_t n = fb->user_len < sizeof(c->user) - 1 ? fb->user_len : sizeof(c->user) - 1;
    if (fb->user) memcpy(c->user, fb->user, n);
    c->user[fb->user ? n : 0] = '\0';
}

/* The client's output ceiling on the tree path (after sanitize(), which may have mapped
 * max_output_tokens to max_tokens); -1 when it sets none. */
static long long tree_max_tokens(const cJSON *body)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (!cJSON_IsNumber(mt)) mt = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens");
    return cJSON_IsNumber(mt) ? (long long)mt->valuedouble : -1;
}

/* The tree's side of a lowered output ceiling (see take_admission). */
static void cap_tree_tokens(call_t *c)
{
    cJSON_DeleteItemFromObjectCaseSensitive(c->body, "max_completion_tokens");
    set_item(c->body, "max_tokens", cJSON_CreateNumber((double)c->mapped_max_tokens));
}

/* The sanitized tree of the client's body, for an adapter that encodes from it. After the
 * fast path it is parsed on the first such attempt, with the edits sanitize() and
 * take_admission() would have made (for a body without extensions: stream_options and the
 * lowered ceiling). NULL when out of memory. */
static cJSON *call_tree(call_t *c)
{
    if (c->body || !c->req) return c->body;
    c->body = cJSON_ParseWithLength(c->req->body, c->req->body_len);
    if (!c->body) return NULL;
    if (c->stream) set_item(c->body, "stream_options", usage_options());
    if (c->tokens_capped) cap_tree_tokens(c);
    return c->body;
}

/* Give the task's slot (and its queue place) back now, at cancellation, and note when. */
static void release_on_cancel(call_t *c, const char *reason)
{
    c->cancel_reason = reason;
    c->cancel_ns = uv_hrtime();
    if (c->queued) {
        mg_sched_cancel(c->srv->sched, &c->entry);
        c->queued = 0;
    }
    if (c->entry.lease.held && mg_sched_release(&c->entry.lease) == 0 && !c->srv->stopping_hard)
        mg_server_sched_kick(c->srv);
    c->released_ns = uv_hrtime();
}

static void on_client_abort(void *data)
{
    call_t *c = data;
    c->srv->metrics.cancelled_total++;
    c->srv->metrics.cancelled_by[c->queued ? MG_CANCEL_QUEUED : MG_CANCEL_CLIENT]++;
    if (c->xfer) {
        mg_xfer_cancel(c->xfer);
        c->xfer = NULL;
        attempt_end(c, 1);
    }
    c->status = c->client_started ? 200 : 499;
    c->outcome = "cancelled";
    release_on_cancel(c, "client_disconnected");
    estimate_tokens(c);
    call_log(c);
    c->req = NULL; /* the connection frees it after this hook */
    call_free(c);
}

static void on_client_drain(void *data)
{
    call_t *c = data;
    if (c->xfer) mg_xfer_resume(c->xfer);
}

/* The routing arrays for the model's routes, in one block (reused when the call's is big
 * enough), each entry's alignment kept by the order: 8-byte structs, then ints, then bytes.
 * Only `tried` needs zeros: the others are written before they are read. */
static int alloc_routing(call_t *c)
{
    _Static_assert(sizeof(mg_candidate_t) % _Alignof(mg_plan_entry_t) == 0 &&
                       sizeof(mg_plan_entry_t) % _Alignof(int) == 0,
                   "routing block layout");
    size_t n = c->model->n_routes ? c->model->n_routes : 1;
    if (n > c->routing_cap) {
        free(c->routing_buf);
        c->routing_buf = malloc(n * (sizeof(*c->cands) + sizeof(*c->plan) + sizeof(int) + 1));
        c->routing_cap = c->routing_buf ? n : 0;
        if (!c->routing_buf) return -1;
    }
    char *p = c->routing_buf;
    c->cands = (mg_candidate_t *)(void *)p;
    p += n * sizeof(*c->cands);
    c->plan = (mg_plan_entry_t *)(void *)p;
    p += n * sizeof(*c->plan);
    c->cand_route = (int *)(void *)p;
    p += n * sizeof(int);
    c->tried = (unsigned char *)p;
    memset(c->tried, 0, n);
    return 0;
}

/* Whether try_next would pass over the candidate without an attempt: its route was tried
 * in this request already, or its provider's rate limit refuses this request now (the
 * candidate's limits are the limiter's, so this is what mg_limiter_reserve decides). */
static int passed_over(const call_t *c, const mg_candidate_t *cd, int route)
{
    if (c->tried[route]) return 1;
    if (cd->rpm_limit > 0 && cd->rpm_used >= cd->rpm_limit) return 1;
    int64_t tokens = c->est_tokens > 0 ? c->est_tokens : 0;
    return cd->tpm_limit > 0 && tokens > cd->tpm_limit - cd->tpm_used;
}

/* The facts of every route of the model, for the routing policy (fresh, or kept from an
 * earlier request of the same millisecond: facts.h). A route's provider and its state are
 * found by index (the route's provider_hint), not by searching. Returns the plan entries
 * try_next needs before it asks route() again: one for the next attempt (should it fail,
 * route() decides the next one on what the failure changed: plan_exhausted), and one
 * more for each candidate it would pass over (0: as many as there are candidates). */
static int fill_candidates(call_t *c, uint64_t now)
{
    const mg_config_t *cfg = c->gen->cfg;
    int usable = c->attempts < cfg->max_retries ? 1 : 0;
    c->n_cands = 0;
    for (int i = 0; i < (int)c->model->n_routes; i++) {
        const mg_route_conf_t *r = &c->model->routes[i];
        /* memory was reserved for the smaller model: no other route may serve */
        if (c->mem_smaller && (!r->smaller || strcmp(r->model, c->mem_smaller->model) != 0))
            continue;
        const mg_provider_conf_t *p = mg_config_route_provider(cfg, r);
        mg_provider_state_t *ps = p ? provider_state(c, p) : NULL;
        if (!ps) continue;
        mg_route_state_t *rs = mg_pool_route_of(&c->srv->pool, r);
        mg_candidate_t *cd = &c->cands[c->n_cands];
        c->cand_route[c->n_cands++] = i;
        mg_facts_describe(c->gen->keep, &c->srv->pool, p, r, ps, rs, now, cd);
        usable += passed_over(c, cd, i);
    }
    return usable > 0 && usable < c->n_cands ? usable : 0;
}

/* The shortest time until a cooling candidate recovers, for Retry-After. */
static int shortest_cooldown_ms(call_t *c)
{
    long long best = 0;
    uint64_t now = uv_now(c->srv->loop);
    for (int i = 0; i < c->n_cands; i++) {
        const mg_candidate_t *cd = &c->cands[i];
        long long r = cd->cooldown_remaining_ms;
        mg_provider_state_t *ps = provider_state(c, cd->provider);
        mg_route_state_t *rs = mg_pool_route_of(&c->srv->pool, cd->route);
        long long b = ps ? (long long)mg_pool_breakers_retry_ms(ps, rs, now) : 0;
        if (b > r) r = b;
        if (r > 0 && (best == 0 || r < best)) best = r;
    }
    return best > 0 ? (int)(best > 3600000 ? 3600000 : best) : 1000;
}

/* Ask routing.route() for a plan and start on it. */
static void plan_and_dispatch(call_t *c)
{
    route_and_dispatch(c, fill_candidates(c, uv_now(c->srv->loop)));
}

/* The same on the candidates fill_candidates described, which said limit. */
static void route_and_dispatch(call_t *c, int limit)
{
    char err[512];
    mg_plan_t plan = {.entries = c->plan, .limit = limit};
    c->route_calls++;
    if (mg_gen_route(c->gen, &c->lua_info, &c->req_ref, c->route_calls, c->cands, c->n_cands,
                     &plan, err, sizeof(err)) != 0) {
        mg_log_msg(MG_LOG_ERROR, c->req->request_id, "routing policy: %s", err);
        call_fail(c, 500, "INTERNAL_ERROR", "the routing policy failed; see the gateway log", 0);
        return;
    }
    c->srv->metrics.routing_plans[plan.kept]++;
    c->plan_n = plan.n;
    c->plan_limit = plan.limit;
    c->plan_next = 0;
    c->limited = 0;
    if (plan.n > 0) {
        if (!c->t_dispatch) c->t_dispatch = uv_hrtime();
        try_next(c);
        return;
    }
    if (plan.wait_ms > 0 && wait_then_replan(c, (uint64_t)plan.wait_ms) == 0) return;
    c->fail_degraded = "openclaw_fallback"; /* the chain is at its end: the caller's fallback now */
    if (c->attempts > 0) {
        fail_exhausted(c);
        return;
    }
    call_fail(c, 503, "MODEL_UNAVAILABLE", "no provider can serve this model now",
              shortest_cooldown_ms(c));
}

/* Hand the call to the scheduler: it runs now if a slot is free, else it waits in
 * the priority queue (bounded by timeouts.queue_ms). The call may be finished when
 * this returns. */
static void enqueue(call_t *c, long long max_tokens)
{
    mg_server_t *s = c->srv;
    const mg_config_t *cfg = c->gen->cfg;
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
    c->entry.gate[MG_GATE_MODEL] = mg_sched_gate(s->sched, MG_GATE_MODEL, gate_name);
    /* the application's and the user's slots (PRD 3.4.2) */
    if (c->app) {
        char ag[300];
        snprintf(ag, sizeof(ag), "app:%s", c->app->name);
        mg_sched_gate_t *g = mg_sched_gate(s->sched, MG_GATE_APP, ag);
        if (g)
            mg_sched_gate_limits(s->sched, g, (uint32_t)c->app->max_running_tasks,
                                 (uint32_t)c->app->max_queued_tasks);
        c->entry.gate[MG_GATE_APP] = g;
    }
    if (c->user[0] && (cfg->user_max_running_tasks || cfg->user_max_queued_tasks)) {
        char ug[400];
        snprintf(ug, sizeof(ug), "user:%s/%s", c->app ? c->app->name : "", c->user);
        mg_sched_gate_t *g = mg_sched_gate(s->sched, MG_GATE_USER, ug);
        if (g)
            mg_sched_gate_limits(s->sched, g, (uint32_t)cfg->user_max_running_tasks,
                                 (uint32_t)cfg->user_max_queued_tasks);
        c->entry.gate[MG_GATE_USER] = g;
    } else if (c->auth.held && c->auth.max_queued) {
        /* the key's cap on waiting tasks: a user gate per key (running is capped by quota) */
        char kg[40];
        snprintf(kg, sizeof(kg), "key:%lld", (long long)c->auth.key_id);
        mg_sched_gate_t *g = mg_sched_gate(s->sched, MG_GATE_USER, kg);
        if (g) mg_sched_gate_limits(s->sched, g, 0, c->auth.max_queued);
        c->entry.gate[MG_GATE_USER] = g;
    }
    c->entry.deadline_ms = uv_now(s->loop) + (uint64_t)c->queue_ms;
    /* input tokens guessed from the body's bytes with a safety factor (3 bytes a token is
     * on the generous side for English and JSON) until the tokenizer arrives */
    c->entry.input_tokens = (uint32_t)(c->req->body_len / 3);
    c->entry.max_output_tokens = max_tokens > 0 ? (uint32_t)max_tokens : 0;
    /* memory admission degrades before it waits: shorter output, then the smaller model */
    c->entry.min_output_tokens = (uint32_t)cfg->scheduler.min_output_tokens;
    c->entry.smaller = c->smaller_route ? mg_server_smaller_gate(s, c->smaller_route) : NULL;
    c->entry.data = c;
    task_to(c, MG_TASK_VALIDATING, "received");
    int rc = mg_sched_enqueue(s->sched, &c->entry, uv_now(s->loop));
    if (rc == MG_SCHED_EQUEUE_FULL) {
        int status = cfg->scheduler.overflow_status;
        call_fail(c, status, "QUEUE_FULL", "the queue is full; retry later", 2000);
        return;
    }
    if (rc == MG_SCHED_EOVERLOAD) {
        call_fail(c, 503, "RESOURCE_EXHAUSTED",
                  "the gateway is overloaded and sheds this priority now; retry later", 2000);
        return;
    }
    if (rc == MG_SCHED_ETOO_LARGE) {
        call_fail(c, 503, "RESOURCE_EXHAUSTED",
                  "the request needs more device memory than this model can ever have", 0);
        return;
    }
    if (rc != MG_SCHED_OK) {
        call_fail(c, 503, "RESOURCE_EXHAUSTED", mg_sched_strerror(rc), 2000);
        return;
    }
    c->asked_max_tokens = max_tokens;
    c->queued = 1;
    task_to(c, MG_TASK_QUEUED, "admitted");
    mg_server_sched_run(s);
}

/* What the client asked of routing: priority, pool, pinning, local/smaller/cloud flags. */
typedef struct {
    const char *priority;
    const char *pool;
    char pin[160];
    int has_pin;
    int local_only;
    int allow_smaller_model; /* -1: the request does not say (routing.allow_smaller_model) */
    int queue_ms, first_token_ms, inference_ms, total_ms; /* from the body's timeouts, 0 = default */
} routing_input_t;

/* The body's "timeouts": {queue_ms, first_token_ms, inference_ms, total_ms}, positive integers;
 * each is capped later by the configured value (a client may ask for less, never more). */
static const char *timeout_inputs(const cJSON *body, routing_input_t *in)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "timeouts");
    if (!t || cJSON_IsNull(t)) return NULL;
    if (!cJSON_IsObject(t)) return "'timeouts' must be an object";
    static const char *const keys[] = {"queue_ms", "first_token_ms", "inference_ms", "total_ms"};
    int *dst[] = {&in->queue_ms, &in->first_token_ms, &in->inference_ms, &in->total_ms};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 86400000)
            return "'timeouts' values must be positive integers of milliseconds";
        *dst[i] = (int)v->valuedouble;
    }
    return NULL;
}

static int capped(int asked, int configured)
{
    return asked > 0 && asked < configured ? asked : configured;
}

static const char *priority_of(const cJSON *body, const mg_http_req_t *req, const char **problem)
{
    static const char *const levels[] = {"P0", "P1", "P2", "P3", "P4"};
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "priority");
    if (p && !cJSON_IsNull(p)) {
        for (int i = 0; i < 5; i++)
            if (cJSON_IsString(p) && strcmp(p->valuestring, levels[i]) == 0) return levels[i];
        *problem = "'priority' must be one of P0, P1, P2, P3, P4";
        return NULL;
    }
    /* the Sidecar header: urgent/high/normal/low = P0..P3 */
    static const char *const words[] = {"urgent", "high", "normal", "low"};
    const char *h = mg_http_header(req, "X-Priority");
    for (int i = 0; h && i < 4; i++)
        if (strcasecmp(h, words[i]) == 0) return levels[i];
    return "P2";
}

static const char *routing_inputs(const cJSON *body, const mg_http_req_t *req, routing_input_t *in)
{
    const char *problem = NULL;
    memset(in, 0, sizeof(*in));
    in->allow_smaller_model = -1;
    in->priority = priority_of(body, req, &problem);
    if (problem) return problem;
    const char *pool = mg_http_header(req, "X-Sidecar-Pool");
    if (pool && *pool) {
        if (strcmp(pool, "main") != 0 && strcmp(pool, "fallback") != 0)
            return "X-Sidecar-Pool must be main or fallback";
        in->pool = pool;
    }
    const char *pin = mg_http_header(req, "X-Sidecar-Provider");
    if (pin && *pin) {
        snprintf(in->pin, sizeof(in->pin), "%s", pin);
        in->has_pin = 1;
    }
    const cJSON *routing = cJSON_GetObjectItemCaseSensitive(body, "routing");
    if (routing && !cJSON_IsNull(routing)) {
        if (!cJSON_IsObject(routing)) return "'routing' must be an object";
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(routing, "local_only");
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(routing, "allow_smaller_model");
        if ((lo && !cJSON_IsBool(lo)) || (sm && !cJSON_IsBool(sm)))
            return "'routing.local_only' and 'routing.allow_smaller_model' must be booleans";
        in->local_only = cJSON_IsTrue(lo);
        if (sm) in->allow_smaller_model = cJSON_IsTrue(sm);
    }
    return timeout_inputs(body, in);
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

/* Wall clock in unix milliseconds: key expiry is a date. */
static uint64_t unix_now_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* The smaller route memory admission may move a task to when the model does not fit: the
 * one with the smallest KV cache per token among the smaller routes with their own figures
 * that this request could use (its pinned provider, local ones under local_only). NULL if
 * none. Routing then sees only the routes of that upstream model. */
static const mg_route_conf_t *memory_smaller_route(const mg_config_t *cfg,
                                                   const mg_model_conf_t *m,
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

/* Whose idempotency keys these are (the issue: per tenant/application). With auth on, the
 * presented key's tenant and project; otherwise metadata.application and a digest of the
 * credential presented, if any, so open-mode callers that identify themselves stay apart. */
static void idem_scope(mg_server_t *s, const mg_http_req_t *req, const cJSON *body, char *out,
                       size_t cap)
{
    int64_t tenant, project;
    if (s->gen->cfg->auth_enabled &&
        mg_auth_identify(s->auth, req, unix_now_ms(), &tenant, &project) == 0) {
        snprintf(out, cap, "tenant:%lld/project:%lld", (long long)tenant, (long long)project);
        return;
    }
    const cJSON *app = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(body, "metadata"), "application");
    const char *auth = mg_http_header(req, "Authorization");
    if (!auth) auth = mg_http_header(req, "x-api-key");
    char digest[65] = "-";
    if (auth) mg_sha256_hex(auth, strlen(auth), digest);
    snprintf(out, cap, "app:%.200s/cred:%s", cJSON_IsString(app) ? app->valuestring : "",
             digest);
}

void mg_proxy_handle(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep)
{
    if (!req->body_len) {
        mg_api_error(s, req, ep, 400, "INVALID_REQUEST", "request body is empty", 0);
        return;
    }
    fast_body_t fb;
    cJSON *body = NULL; /* stays NULL on the fast path */
    routing_input_t in;
    const char *problem;
    if (fast_body(req, ep, &fb) == 0) {
        problem = routing_inputs(NULL, req, &in); /* no extension: only the headers count */
    } else {
        body = cJSON_ParseWithLength(req->body, req->body_len);
        if (!cJSON_IsObject(body)) {
            cJSON_Delete(body);
            mg_api_error(s, req, ep, 400, "INVALID_REQUEST", "request body is not a JSON object",
                         0);
            return;
        }
        problem = validate(ep, body);
        if (!problem) problem = routing_inputs(body, req, &in);
    }
    if (problem) {
        cJSON_Delete(body);
        mg_api_error(s, req, ep, 400, "INVALID_REQUEST", problem, 0);
        return;
    }
    /* an idempotency key: the request runs once, detached (that run comes back here with
     * no connection and is not looked up again) */
    const cJSON *ik = body ? cJSON_GetObjectItemCaseSensitive(body, "idempotency_key") : NULL;
    const char *ikey = req->conn ? mg_idem_key(req, cJSON_IsString(ik) ? ik->valuestring : NULL) : NULL;
    if (ikey) {
        int stream =
            body ? cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream")) : fb.stream;
        char key[256], scope[400];
        snprintf(key, sizeof(key), "%s", ikey);
        idem_scope(s, req, body, scope, sizeof(scope)); /* body NULL: no metadata */
        cJSON_Delete(body);
        mg_idem_handle(s, req, ep, scope, key, stream);
        return;
    }
    mg_gen_t *gen = mg_server_gen_acquire(s);
    const char *name =
        body ? cJSON_GetObjectItemCaseSensitive(body, "model")->valuestring : fb.model;
    const mg_model_conf_t *model = resolve_model(gen->cfg, name, &in);
    const mg_provider_conf_t *by_prefix = model ? NULL : prefix_provider(gen->cfg, name);
    if (!model && !by_prefix) {
        char msg[300];
        snprintf(msg, sizeof(msg), "model '%.200s' does not exist", name);
        mg_gen_unref(gen);
        cJSON_Delete(body);
        mg_api_error(s, req, ep, 404, "MODEL_NOT_FOUND", msg, 0);
        return;
    }
    call_t *c = call_alloc();
    if (!c) {
        mg_gen_unref(gen);
        cJSON_Delete(body);
        mg_api_error(s, req, ep, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    s->in_flight++;
    c->srv = s;
    c->next = s->calls;
    if (c->next) c->next->prev = c;
    s->calls = c;
    c->req = req;
    c->ep = ep;
    c->gen = gen;
    c->model = model;
    c->body = body;
    if (by_prefix && use_prefixed_model(c, by_prefix, name) != 0) {
        call_fail(c, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    c->req_ref = c->state_ref = -1;
    c->priority = in.priority;
    mg_task_init(&c->task, req->start_ms, on_task_transition, c);
    c->t_start = uv_hrtime() - (uv_now(s->loop) - req->start_ms) * 1000000ull;
    c->deadline_ms = uv_now(s->loop) + (uint64_t)gen->cfg->routing.queue_timeout_ms;
    const mg_timeouts_conf_t *tc = &gen->cfg->timeouts;
    c->queue_ms = capped(in.queue_ms, tc->queue_ms);
    c->first_token_ms = capped(in.first_token_ms, tc->first_byte_ms);
    c->inference_ms = capped(in.inference_ms, tc->total_ms);
    c->total_deadline_ms = req->start_ms + (uint64_t)capped(in.total_ms, tc->total_ms);
    req->on_abort = on_client_abort;
    req->on_drain = on_client_drain;
    req->hook_data = c;
    /* who is asking: the application and user of the PRD's permission model */
    if (body) sanitize_tree(c);
    else sanitize_fast(c, &fb);
    if (c->app) {
        mg_priority_t p = MG_PRIO_DEFAULT;
        mg_priority_parse(c->priority, &p);
        if (!(c->app->allowed_priorities & (1u << p))) {
            call_fail(c, 403, "PERMISSION_DENIED",
                      "this application may not use that priority", 0);
            return;
        }
        if (!mg_app_allows_model(c->app, c->model->name)) {
            call_fail(c, 403, "PERMISSION_DENIED", "this application may not use that model", 0);
            return;
        }
    }
    if (user_rate_refused(c)) return;

    long long max_tokens = body ? tree_max_tokens(body) : fb.max_tokens;
    if (in.allow_smaller_model < 0) in.allow_smaller_model = gen->cfg->routing.allow_smaller_model;
    if (in.allow_smaller_model) c->smaller_route = memory_smaller_route(gen->cfg, c->model, &in);
    /* TPM reservation: the prompt guessed from its bytes plus the answer's ceiling */
    c->est_tokens = (int64_t)(req->body_len / 4) + (max_tokens > 0 ? max_tokens : 256);
    memcpy(c->lua_request_id, req->request_id, sizeof(c->lua_request_id));
    if (in.has_pin) memcpy(c->lua_pin, in.pin, sizeof(c->lua_pin));
    c->lua_info = (mg_lua_req_t){
        .request_id = c->lua_request_id,
        .endpoint = endpoint_name(ep),
        .model = c->model->name,
        .stream = c->stream,
        .max_tokens = max_tokens,
        .created = (long long)time(NULL),
        .priority = in.priority,
        .pool = in.pool ? (strcmp(in.pool, "main") == 0 ? "main" : "fallback") : NULL,
        .pin = in.has_pin ? c->lua_pin : NULL,
        .local_only = in.local_only,
        .allow_smaller_model = in.allow_smaller_model,
        /* an application with a data policy reaches the cloud only if the policy allows */
        .allow_cloud = !c->app || !c->app->has_data_policy || c->app->allow_cloud,
        .local_first = gen->cfg->routing.local_first,
        .random = mg_request_id_draw(req->request_id),
    };
    if (alloc_routing(c) != 0) {
        call_fail(c, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    if (gen->cfg->auth_enabled && mg_auth_check(s->auth, req, c->model->name, in.priority,
                                                unix_now_ms(), c->est_tokens, &c->auth) != 0) {
        call_fail(c, c->auth.status, c->auth.code, c->auth.message, (int)c->auth.retry_after_ms);
        return;
    }
    enqueue(c, max_tokens);
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

void mg_proxy_dispatched(void *data)
{
    call_t *c = data;
    c->queued = 0;
    take_admission(c);
    mg_metrics_queue_time(&c->srv->metrics, ms_since(c->t_start, uv_hrtime()) / 1000.0);
    task_to(c, MG_TASK_DISPATCHING, "slot_available");
    plan_and_dispatch(c);
}

void mg_proxy_queue_timeout(void *data)
{
    call_t *c = data;
    c->queued = 0;
    c->srv->metrics.timeouts_by[MG_TIMEOUT_QUEUE]++;
    mg_sched_stats_t st;
    mg_sched_stats(c->srv->sched, &st);
    char msg[160];
    snprintf(msg, sizeof(msg), "the request waited in the queue past its deadline; queue length: %u",
             st.queued);
    c->fail_degraded = NULL;
    call_fail(c, 408, "QUEUE_TIMEOUT", msg, 3000);
}

/* ------------------------------------------------------------------------ */
/* /v1/tasks/{id}                                                            */
/* ------------------------------------------------------------------------ */

static call_t *find_call(mg_server_t *s, const char *task_id)
{
    for (call_t *c = s->calls; c; c = c->next)
        if (c->req && strcmp(c->req->request_id, task_id) == 0) return c;
    return NULL;
}

/* Cancel on request of DELETE /v1/tasks/{id}: queued → leaves the queue; running →
 * the upstream transfer is closed; the task's own client is told. */
static void cancel_call(call_t *c)
{
    c->srv->metrics.cancelled_total++;
    c->srv->metrics.cancelled_by[MG_CANCEL_REQUEST]++;
    if (c->xfer) {
        mg_xfer_cancel(c->xfer);
        c->xfer = NULL;
        attempt_end(c, 1);
    }
    c->outcome = "cancelled";
    release_on_cancel(c, "request");
    if (c->client_started) {
        stream_end_error(c, "REQUEST_CANCELLED", "the task was cancelled");
        return;
    }
    c->fail_degraded = NULL;
    call_fail(c, 409, "REQUEST_CANCELLED", "the task was cancelled", 0);
}

int mg_proxy_task(mg_server_t *s, mg_http_req_t *req, const char *task_id)
{
    call_t *c = find_call(s, task_id);
    if (!c) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task_id", task_id);
    cJSON_AddStringToObject(o, "object", "task");
    cJSON_AddStringToObject(o, "model", c->model->name);
    cJSON_AddStringToObject(o, "priority", c->priority);
    if (req->method == HTTP_DELETE) {
        cancel_call(c); /* c is gone after this */
        cJSON_AddStringToObject(o, "status", "CANCELLED");
    } else {
        cJSON_AddStringToObject(o, "status", mg_task_state_name(c->task.state));
        cJSON_AddItemToObject(o, "timing", timing_json(c, uv_hrtime()));
    }
    mg_buf_t text = {0};
    mg_json_print(o, &text);
    cJSON_Delete(o);
    mg_http_respond(req, 200, "application/json", NULL, text.data, text.len);
    mg_buf_free(&text);
    return 0;
}
