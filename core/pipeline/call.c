/* call: the runner, a call's life from allocation to its one finish; see call.h. */
#include "pipeline/call.h"

#include <limits.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "base/log.h"
#include "net/error.h"
#include "net/hold.h"
#include "tenancy/cost.h"

/* ------------------------------------------------------------------------ */
/* The runner                                                                */
/* ------------------------------------------------------------------------ */

/* One step (a switch rather than a table of pointers: the steps can be inlined here). */
static mg_step_rc_t run_step(call_t *c, mg_step_t s)
{
    switch (s) {
    case STEP_PARSE: return step_parse(c);
    case STEP_IDENTIFY: return step_identify(c);
    case STEP_IDEMPOTENCY: return step_idempotency(c);
    case STEP_ADMIT: return step_admit(c);
    case STEP_CONTEXT: return step_context(c);
    case STEP_WALLET: return step_wallet(c);
    case STEP_ENQUEUE: return step_enqueue(c);
    case STEP_ROUTE: return step_route(c);
    case STEP_RESERVE: return step_reserve(c);
    case STEP_SHARED: return step_shared(c);
    case STEP_ENCODE: return step_encode(c);
    case STEP_SEND: return step_send(c);
    case STEP_STREAM: return step_stream(c);
    case STEP_FINISH: return step_finish(c);
    case STEP_COUNT: break;
    }
    return step_finish(c); /* not reached: c->step is always a step */
}

void mg_call_run(call_t *c)
{
    for (;;) {
        mg_step_t s = c->step;
        c->step = s + 1; /* the step may send the call elsewhere */
        if (run_step(c, s) != MG_STEP_NEXT) return;
    }
}

void call_resume(call_t *c, mg_step_t step)
{
    c->step = step;
    mg_call_run(c);
}

/* ------------------------------------------------------------------------ */
/* Small shared helpers                                                      */
/* ------------------------------------------------------------------------ */

double ms_since(uint64_t from, uint64_t to)
{
    return from && to >= from ? (double)(to - from) / 1e6 : 0;
}

int req_table(call_t *c)
{
    return mg_gen_req_table(c->gen, &c->lua_info, &c->req_ref);
}

/* The usage of a call whose upstream reported none: the prompt counted with the model's
 * encoding when it is loaded (already counted at admission, or now: this path runs only
 * without upstream usage), else its bytes at the route's calibrated bytes per token
 * (pipeline/calib.h; 4 until learned); the output one token per content chunk, as
 * OpenAI-compatible servers stream them. */
void estimate_tokens(call_t *c)
{
    if (c->have_usage) return;
    int64_t n = prompt_count(c);
    size_t len = 0;
    if (c->req) prompt_bytes(c, &len);
    c->prompt_tokens = n >= 0 ? n : (long long)calib_estimate(calib_route_bpt(c), len);
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
    if (c->req) mg_http_log_ids(&l, c->req);
    else mg_log_str(&l, "request_id", NULL);
    mg_log_str(&l, "from_state", mg_task_state_name(tr->from));
    mg_log_str(&l, "to_state", mg_task_state_name(tr->to));
    mg_log_str(&l, "reason", tr->reason);
    mg_log_str(&l, "logical_model", c->model ? c->model->name : NULL);
    mg_log_str(&l, "priority", c->priority);
    if (c->provider) mg_log_str(&l, "provider", c->provider->id);
    mg_log_end(&l);
}

void task_to(call_t *c, mg_task_state_t to, const char *reason)
{
    if (c->task.state != to) mg_task_transition_at(&c->task, to, reason, uv_now(c->pl->loop));
}

/* The terminal state that matches how the call ended. */
static void task_finish(call_t *c)
{
    if (mg_task_is_terminal(c->task.state)) return;
    const char *oc = c->outcome ? c->outcome : "error";
    if (c->error_code && strcmp(c->error_code, "REQUEST_CANCELLED") == 0)
        task_to(c, MG_TASK_CANCELLED, "cancelled_by_request");
    else if (strcmp(oc, "ok") == 0) task_to(c, MG_TASK_SUCCEEDED, "completed");
    else if (strcmp(oc, "cancelled") == 0)
        task_to(c, MG_TASK_CANCELLED, c->cancel_reason ? c->cancel_reason : "client_disconnected");
    else if (c->error_code && strstr(c->error_code, "TIMEOUT"))
        task_to(c, MG_TASK_TIMED_OUT, c->error_code);
    else if (c->task.state == MG_TASK_VALIDATING) task_to(c, MG_TASK_REJECTED, c->error_code);
    else task_to(c, MG_TASK_FAILED, c->error_code ? c->error_code : "error");
}

/* ------------------------------------------------------------------------ */
/* Allocation                                                                */
/* ------------------------------------------------------------------------ */

/* Finished calls kept for the next requests (per thread, though only the loop thread makes
 * calls), each with its routing arrays up to SPARE_ROUTES routes: both are past glibc's
 * per-thread cache (see bench/README.md). */
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

call_t *call_new(mg_pipeline_t *pl, mg_http_req_t *req, mg_endpoint_t ep)
{
    call_t *c = call_alloc();
    if (!c) return NULL;
    c->pl = pl;
    c->req = req;
    c->ep = ep == MG_EP_MESSAGES ? MG_EP_CHAT : ep; /* a Messages call runs as chat */
    c->front_messages = ep == MG_EP_MESSAGES;
    c->step = STEP_PARSE;
    c->req_ref = c->state_ref = -1;
    c->max_tokens = c->mapped_max_tokens = c->asked_max_tokens = -1;
    c->prompt_count = -1;
    c->gen = mg_gens_acquire(pl->gens);
    c->next = pl->calls;
    if (c->next) c->next->prev = c;
    pl->calls = c;
    pl->in_flight++;
    mg_task_init(&c->task, req->start_ms, on_task_transition, c);
    c->t_start = uv_hrtime() - (uv_now(pl->loop) - req->start_ms) * 1000000ull;
    return c;
}

static void call_unlink(call_t *c)
{
    if (c->prev) c->prev->next = c->next;
    else if (c->pl->calls == c) c->pl->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* What the answer cost, in micros of the currency (call_cost_micros: the versioned price in
 * force, else cost_per_1k_tokens), charged once to the caller's key, project and tenant for
 * their spend limits: on the upstream's usage, or when it reported none on the gateway's
 * count (meter.c's estimate, the event flagged estimated; as wallets settle), so an
 * upstream that omits usage never makes requests free. Called before the
 * answer's end is sent: the hold it returns (NULL: nothing to wait for) releases that end
 * once the charge is durable (net/hold.h), so a client that saw its whole answer never
 * loses its spend record. Without a client (cancelled) the charge is fire and forget. */
mg_hold_t *charge_spend(call_t *c)
{
    mg_hold_t *event_hold = c->end_hold; /* the usage event's (meter.c): one hold for both */
    c->end_hold = NULL;
    if (c->charged || !c->auth.held) return event_hold;
    int64_t micros = call_cost_micros(c, NULL); /* the price version in force (obs/price.h) */
    if (micros <= 0) return event_hold;
    c->charged = 1;
    c->charged_micros = micros;
    mg_hold_t *h = event_hold ? event_hold : c->req ? mg_hold_new() : NULL;
    if (h) mg_hold_expect(h);
    if (mg_auth_charge(c->pl->auth, &c->auth, micros, mg_unix_ms(), h ? mg_hold_committed : NULL,
                       h) != 1 &&
        h)
        mg_hold_unexpect(h); /* nothing to wait for: the hold sends the end at once */
    return h;
}

/* A whole answer, held until the call's spend is durable (charge_spend). */
static void respond_end(call_t *c, int status, const char *extra, const char *body, size_t len)
{
    mg_hold_t *h = charge_spend(c);
    if (h) mg_hold_respond(h, c->req, status, "application/json", extra, body, len);
    else mg_http_respond(c->req, status, "application/json", extra, body, len);
}

static void call_free(call_t *c)
{
    mg_pipeline_t *pl = c->pl;
    call_unlink(c);
    if (c->xfer) mg_xfer_cancel(c->xfer);
    if (c->req) {
        c->req->on_abort = NULL;
        c->req->on_drain = NULL;
    }
    pl->in_flight--;
    if (c->have_usage) mg_auth_settle(&c->auth, c->prompt_tokens + c->completion_tokens);
    charge_spend(c); /* when no end was sent (the client left): nothing is held */
    wallet_finish(c);
    shared_finish(c);
    mg_auth_release(&c->auth);
    if (c->queued) mg_sched_cancel(pl->sched, &c->entry);
    if (c->entry.lease.held && mg_sched_release(&c->entry.lease) == 0) mg_pump_kick(pl->pump);
    context_end(c); /* before the generation goes: it reads the config */
    mg_gen_req_release(c->gen, c->req_ref);
    mg_gen_unref_value(c->gen, c->state_ref);
    mg_gen_unref(c->gen);
    cJSON_Delete(c->body);
    responses_free(c);
    resp_native_free(c);
    cJSON_Delete(c->held_finish);
    mg_buf_free(&c->held_raw);
    if (c->sse_ready) mg_sse_free(&c->sse);
    mg_chunk_memo_free(&c->chunk_memo);
    free(c->prefixed_model.name);
    free(c->prefixed_model.routes);
    free(c->prefixed_upstream);
    free(c->client_model_owned);
    mg_buf_free(&c->client_model_json);
    if (c->wait_timer) {
        uv_timer_stop(c->wait_timer);
        uv_close((uv_handle_t *)c->wait_timer, (uv_close_cb)free);
    }
    mg_buf_free(&c->resp);
    free(c->error_headers);
    mg_buf_free(&c->out);
    mg_buf_free(&c->answer);
    mg_buf_free(&c->full_answer);
    msgs_free(c);
    free(c->error_message);
    free(c->refusal_message);
    free(c->refusal_param);
    free(c->user);
    for (int i = 0; i < 3; i++) free(c->error_passed[i]);
    call_release(c);
}

/* ------------------------------------------------------------------------ */
/* How a call ends                                                           */
/* ------------------------------------------------------------------------ */

/* The message of the call's error (a later error replaces an earlier one). */
static void set_error_message(call_t *c, const char *msg)
{
    free(c->error_message);
    c->error_message = strdup(msg);
}

/* What the error answer says when even its message could not be kept. */
static const char *error_message(const call_t *c)
{
    return c->error_message ? c->error_message : "out of memory";
}

mg_step_rc_t call_error(call_t *c, int status, const char *code, const char *msg,
                        int retry_after_ms)
{
    c->answer_kind = ANSWER_ERROR;
    c->status = status;
    c->outcome = "error";
    c->error_code = code;
    c->error_retry_ms = retry_after_ms;
    set_error_message(c, msg);
    c->step = STEP_FINISH;
    return MG_STEP_NEXT;
}

mg_step_rc_t stream_error(call_t *c, const char *code, const char *msg)
{
    c->answer_kind = ANSWER_STREAM;
    c->status = 200;
    c->outcome = "error";
    c->error_code = code;
    set_error_message(c, msg);
    c->step = STEP_FINISH;
    return MG_STEP_NEXT;
}

void call_fail(call_t *c, int status, const char *code, const char *msg, int retry_after_ms)
{
    call_error(c, status, code, msg, retry_after_ms);
    mg_call_run(c);
}

void call_fail_upstream(call_t *c, int status, const char *code, const char *type,
                        const char *param, const char *msg)
{
    const char *given[3] = {code, type, param};
    for (int i = 0; i < 3; i++) c->error_passed[i] = given[i] ? strdup(given[i]) : NULL;
    call_error(c, status, c->error_passed[0] ? c->error_passed[0] : "INVALID_REQUEST", msg, 0);
    mg_call_run(c);
}

void stream_fail(call_t *c, const char *code, const char *msg)
{
    stream_error(c, code, msg);
    mg_call_run(c);
}

void release_on_cancel(call_t *c, const char *reason)
{
    mg_pipeline_t *pl = c->pl;
    c->cancel_reason = reason;
    c->cancel_ns = uv_hrtime();
    if (c->queued) {
        mg_sched_cancel(pl->sched, &c->entry);
        c->queued = 0;
    }
    if (c->entry.lease.held && mg_sched_release(&c->entry.lease) == 0) mg_pump_kick(pl->pump);
    c->released_ns = uv_hrtime();
}

/* A bounded copy without printf's parsing (this runs once per request). */
static void copy_field(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    if (src)
        for (; n + 1 < cap && src[n]; n++) dst[n] = src[n];
    dst[n] = '\0';
}

/* The dashboard's request tail (obs/recent.h): a copy of a few fields, no allocation. */
static void recent_push(call_t *c, uint64_t now)
{
    mg_recent_entry_t e;
    e.at_ms = (int64_t)mg_unix_ms();
    copy_field(e.request_id, sizeof(e.request_id), c->req ? c->req->request_id : NULL);
    copy_field(e.path, sizeof(e.path), c->req ? c->req->path : NULL);
    copy_field(e.model, sizeof(e.model), c->model ? c->model->name : NULL);
    copy_field(e.provider, sizeof(e.provider), c->provider ? c->provider->id : NULL);
    copy_field(e.outcome, sizeof(e.outcome), c->outcome);
    copy_field(e.error, sizeof(e.error), c->error_code);
    e.status = c->status;
    e.stream = c->stream;
    e.duration_ms = ms_since(c->t_start, now);
    e.ttft_ms = c->t_first ? ms_since(c->t_start, c->t_first) : 0;
    e.prompt_tokens = c->prompt_tokens;
    e.completion_tokens = c->completion_tokens;
    e.tenant_id = c->auth.held ? c->auth.tenant_id : 0;
    e.key_id = c->auth.held ? c->auth.key_id : 0;
    mg_recent_push(c->pl->recent, &e);
}

/* The GenAI convention's operation of an endpoint. */
static const char *operation_name(mg_endpoint_t ep)
{
    switch (ep) {
    case MG_EP_EMBEDDINGS: return "embeddings";
    case MG_EP_COMPLETIONS: return "text_completion";
    default: return "chat";
    }
}

/* The call's span for the OTLP exporter (obs/otlp.h): a copy of a few fields, queued. */
static void span_push(call_t *c, uint64_t now)
{
    mg_http_req_t *req = c->req;
    if (!req || !req->trace.trace_id[0]) return;
    mg_otlp_span_t s;
    memset(&s, 0, sizeof(s));
    copy_field(s.trace_id, sizeof(s.trace_id), req->trace.trace_id);
    copy_field(s.span_id, sizeof(s.span_id), req->trace.span_id);
    copy_field(s.parent_id, sizeof(s.parent_id), req->trace.parent_id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    s.end_unix_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    s.start_unix_ns =
        s.end_unix_ns - (int64_t)(c->t_start && now > c->t_start ? now - c->t_start : 0);
    s.operation = operation_name(c->ep);
    copy_field(s.system, sizeof(s.system), c->provider ? c->provider->adapter : NULL);
    copy_field(s.provider, sizeof(s.provider), c->provider ? c->provider->id : NULL);
    copy_field(s.request_model, sizeof(s.request_model),
               c->client_model ? c->client_model
               : c->model      ? c->model->name
                               : NULL);
    copy_field(s.response_model, sizeof(s.response_model), c->upstream_model);
    copy_field(s.request_id, sizeof(s.request_id), req->request_id);
    copy_field(s.error_type, sizeof(s.error_type), c->error_code);
    copy_field(s.path, sizeof(s.path), req->path);
    s.status = c->status;
    s.stream = c->stream;
    s.attempts = c->attempts;
    s.input_tokens = c->prompt_tokens;
    s.output_tokens = c->completion_tokens;
    s.tenant_id = c->auth.held ? c->auth.tenant_id : 0;
    s.ttft_s = c->t_first ? ms_since(c->t_start, c->t_first) / 1000.0 : -1;
    mg_otlp_push(c->pl->otlp, &s);
}

/* The labelled families' view of the call (obs/metrics.h). */
static void call_observe(call_t *c, double seconds)
{
    int blocked = c->attempts == 0 && (c->status == 401 || c->status == 403 || c->status == 429);
    mg_call_obs_t o = {
        .ep = c->ep,
        .application = c->app ? c->app->name : NULL,
        .model = c->model ? c->model->name : NULL,
        .priority = c->priority,
        .provider_kind = c->provider ? c->provider->adapter : NULL,
        .upstream_model = c->upstream_model,
        .degraded = c->degraded,
        .cancel_reason = c->outcome && strcmp(c->outcome, "cancelled") == 0
                             ? (c->cancel_reason ? c->cancel_reason : "client_disconnected")
                             : NULL,
        .blocked_reason = blocked ? c->error_code : NULL,
        .status = c->status,
        .stream = c->stream,
        .attempts = c->attempts,
        .duration_s = seconds,
        .first_token_s = c->stream && c->t_first ? ms_since(c->t_start, c->t_first) / 1000.0 : -1,
        .prompt_tokens = c->prompt_tokens,
        .completion_tokens = c->completion_tokens,
        .cost = c->provider ? (double)(c->prompt_tokens + c->completion_tokens) / 1000.0 *
                                  c->provider->cost_per_1k_tokens
                            : 0,
    };
    mg_metrics_call(c->pl->metrics, &o);
}

/* Bodies up to this size get a prompt_hash in the request log (SHA-256 of 64 KiB: tens of
 * microseconds). */
#define PROMPT_HASH_MAX (64 * 1024)

static void call_log(call_t *c)
{
    if (c->error_code && strcmp(c->error_code, "REQUEST_CANCELLED") == 0) c->outcome = "cancelled";
    task_finish(c);
    mg_http_req_t *req = c->req;
    uint64_t now = uv_hrtime();
    mg_metrics_t *m = c->pl->metrics;
    mg_metrics_request(m, call_client_ep(c), c->status, ms_since(c->t_start, now) / 1000.0);
    if (c->t_first) mg_metrics_ttft(m, ms_since(c->t_start, c->t_first) / 1000.0);
    m->tokens_prompt_total += (uint64_t)c->prompt_tokens;
    m->tokens_completion_total += (uint64_t)c->completion_tokens;
    if (c->degraded && c->status < 400) mg_metrics_degraded(m, c->degraded);
    if (c->output_shortened && c->status < 400) mg_metrics_degraded(m, "shorter_output");
    if (c->pl->recent) recent_push(c, now);

    call_observe(c, (double)ms_since(c->t_start, now) / 1000.0);
    if (c->pl->otlp) span_push(c, now);
    mg_log_level_t level = c->status >= 500 ? MG_LOG_WARN : MG_LOG_INFO;
    if (!mg_log_enabled(level)) return;
    mg_logline_t l;
    mg_log_begin(&l, level, "request");
    mg_http_log_ids(&l, req);
    if (req->trace.parent_id[0]) mg_log_str(&l, "parent_span_id", req->trace.parent_id);
    if (c->attempts && c->up_span[0]) mg_log_str(&l, "upstream_span_id", c->up_span);
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
    if (c->app) mg_log_str(&l, "application", c->app->name);
    if (call_user(c)[0]) mg_log_str(&l, "user_id", call_user(c));
    /* the prompt as the client sent it, hashed, never its text; bounded so that a huge body
       does not hold the loop (PROMPT_HASH_MAX) */
    if (req->body && req->body_len <= PROMPT_HASH_MAX) {
        char hash[7 + 65] = "sha256:";
        mg_sha256_hex(req->body, req->body_len, hash + 7);
        mg_log_str(&l, "prompt_hash", hash);
    }
    mg_log_str(&l, "task_state", mg_task_state_name(c->task.state));
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    if (reason) mg_log_str(&l, "degraded", reason);
    if (c->output_shortened) mg_log_int(&l, "max_output_tokens", c->mapped_max_tokens);
    if (c->error_code) mg_log_str(&l, "error", c->error_code);
    if (c->status >= 400 || (c->outcome && strcmp(c->outcome, "ok") != 0))
        mg_log_str(&l, "ended_by", c->ended_by ? c->ended_by : "gateway");
    if (c->auth.held) {
        mg_log_int(&l, "key_id", c->auth.key_id);
        mg_log_int(&l, "tenant_id", c->auth.tenant_id);
        if (c->auth.project_id) mg_log_int(&l, "project_id", c->auth.project_id);
    } else if (c->auth.code) {
        mg_log_str(&l, "auth_refused", c->auth.reason); /* the client sees one 401 for all */
    }
    mg_log_int(&l, "attempts", c->attempts);
    /* the last failed attempt: why, and what the provider answered (if it did) */
    if (c->last_fail != FAIL_NONE) mg_log_str(&l, "fail_reason", fail_reason_name(c->last_fail));
    if (c->up_status && (c->last_fail != FAIL_NONE || c->status >= 400))
        mg_log_int(&l, "upstream_status", c->up_status);
    mg_log_double(&l, "duration_ms", ms_since(c->t_start, now));
    if (c->t_first) mg_log_double(&l, "first_token_ms", ms_since(c->t_start, c->t_first));
    mg_log_int(&l, "prompt_tokens", c->prompt_tokens);
    mg_log_int(&l, "completion_tokens", c->completion_tokens);
    mg_log_bool(&l, "tokens_estimated", !c->have_usage);
    context_log(c, &l);
    content_log_end(c, &l);
}

/* The error answer: the shape of net/error.h, with Retry-After and X-Sidecar-Degraded. */
static void respond_error(call_t *c)
{
    char extra[160] = "";
    int n = 0;
    if (c->error_retry_ms > 0)
        n = snprintf(extra, sizeof(extra), "Retry-After: %lld\r\n",
                     (c->error_retry_ms + 999) / 1000);
    if (c->fail_degraded)
        snprintf(extra + n, sizeof(extra) - (size_t)n, "X-Sidecar-Degraded: %s\r\n",
                 c->fail_degraded);
    mg_buf_t body = {0};
    if (c->front_messages) msgs_error_body(c, &body);
    else if (mg_error_body_as(&body, c->status, c->error_passed[1], c->error_code, error_message(c),
                              c->error_passed[2], c->req->request_id,
                              c->error_retry_ms < INT_MAX ? (int)c->error_retry_ms : INT_MAX) !=
             0) {
        mg_buf_free(&body);
        mg_error_respond(c->req, 500, "INTERNAL_ERROR", "out of memory", 0, NULL);
        return;
    }
    respond_end(c, c->status, extra[0] ? extra : NULL, body.data, body.len);
    mg_buf_free(&body);
}

/* The stream's end: the held finish chunk with the totals and [DONE], or, when the call
 * failed, the error event (the held chunk dropped) and [DONE]; then everything pending. */
static void end_stream(call_t *c)
{
    if (c->native_resp) { /* the upstream's events, its end among them */
        if (c->error_code) c->pl->metrics->stream_errors_total++;
        resp_native_end(c);
        return;
    }
    if (c->responses) { /* the Responses API's own end: no [DONE] */
        if (c->error_code) c->pl->metrics->stream_errors_total++;
        responses_stream_end(c, c->error_code ? error_message(c) : NULL);
        return;
    }
    if (c->native) {
        if (c->error_code) c->pl->metrics->stream_errors_total++;
        msgs_native_end(c);
        return;
    }
    if (c->error_code) {
        cJSON_Delete(c->held_finish);
        c->held_finish = NULL;
        c->held_raw.len = 0;
        mg_buf_t ev = {0};
        mg_error_body(&ev, 500, c->error_code, error_message(c), c->req->request_id, 0);
        out_event(c, ev.data ? ev.data : "{}", ev.len ? ev.len : 2);
        mg_buf_free(&ev);
        c->pl->metrics->stream_errors_total++;
    } else {
        emit_held_finish(c, 1);
        emit_own_usage_chunk(c);
    }
    out_event(c, "[DONE]", 6);
}

mg_step_rc_t step_finish(call_t *c)
{
    int head = 0;
    /* the call's writes (a stored Response, the usage event, the spend) in one commit */
    mg_store_cork(c->pl->store);
    if (c->req && c->answer_kind == ANSWER_STREAM) {
        end_stream(c);
        head = stream_start(c);
    }
    if (c->req && c->answer_kind == ANSWER_JSON && c->front_messages && !c->native &&
        msgs_answer(c) != 0)
        call_error(c, 502, "MODEL_UNAVAILABLE", "the provider's answer holds no message", 0);
    calib_learn(c); /* before the estimates: only an answer with usage teaches */
    if (c->responses && !c->native_resp && c->answer_kind == ANSWER_JSON && !c->error_code)
        responses_keep(c); /* a native route's upstream keeps its own */
    if (c->answer_kind != ANSWER_JSON) estimate_tokens(c);
    call_log(c);
    /* a cancelled call's answer acknowledges the cancellation, not a usage: not held (a
       DELETE /v1/tasks/{id} sees the task end at once) */
    meter_finish(c, c->req && c->answer_kind != ANSWER_NONE && !c->cancel_reason);
    mg_store_uncork(c->pl->store);
    if (c->req) {
        char deg[64];
        switch (c->answer_kind) {
        case ANSWER_NONE: break;
        case ANSWER_ERROR: respond_error(c); break;
        case ANSWER_JSON:
            respond_end(c, c->status, degraded_header(c, deg, sizeof(deg)), c->answer.data,
                        c->answer.len);
            break;
        case ANSWER_STREAM:
            send_out(c, head, 1); /* the rest of the stream and its end in one write */
            break;
        }
        c->req = NULL;
    }
    call_free(c);
    return MG_STEP_DONE;
}

void call_handed_over(call_t *c)
{
    call_free(c); /* clears the request's hooks: the request is the new owner's */
}

void call_cancelled(call_t *c, const char *reason)
{
    mg_metrics_t *m = c->pl->metrics;
    m->cancelled_total++;
    if (c->xfer) {
        mg_xfer_cancel(c->xfer);
        c->xfer = NULL;
        attempt_end(c, ATTEMPT_CLIENT);
    }
    c->outcome = "cancelled";
    c->ended_by = "client";
    release_on_cancel(c, reason);
}
