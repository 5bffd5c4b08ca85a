/* responses_native: a Responses API client's request sent as it is to an upstream that
 * speaks Responses itself (an adapter declaring entry_wire = "responses"), and its answer
 * forwarded as the upstream wrote it: the pass-through of the Responses wire, as
 * messages_native.c is the Messages wire's. Nothing is bridged to chat either way, so the
 * upstream's built-in tools, reasoning items, previous_response_id chains and whatever the
 * API adds next reach the client.
 *
 * The body is the client's own (responses_request) with the gateway's extensions taken out,
 * model set to the route's upstream name and, when the scheduler lowered the output ceiling,
 * max_output_tokens set to it. The answer's Response objects (the whole answer; the events
 * response.created / in_progress / queued / completed / incomplete / failed) get the client's
 * model name back; every other event goes out byte for byte.
 *
 * The core reads what it needs: the usage (response.usage: input, output, cached and
 * reasoning tokens), the end (response.completed or response.incomplete), a failure (an
 * `error` event or response.failed). The stream's opening events (created, in_progress,
 * queued) are held until the first event that is the answer's own, so that a failure that
 * comes right after them still moves on to the next route without the client having seen a
 * byte; after that, the upstream's failure event is forwarded and ends the stream. A failure
 * of the gateway's own mid-stream (a broken connection, a stall) ends it with an `error`
 * event in the API's shape, numbered after the upstream's last. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct resp_native_s {
    mg_buf_t held;          /* the opening events, not yet forwarded */
    long long last_seq;     /* the upstream's last sequence_number (-1: none yet) */
    int terminal_forwarded; /* the upstream's own failure event went to the client */
};

/* The gateway's extensions (body.c's, less the two the Responses API itself defines:
 * metadata and max_output_tokens). */
static const char *const own_keys[] = {"priority",  "session_id",     "idempotency_key",
                                       "timeouts",  "routing",        "context_policy",
                                       "retrieval", "identity_notes", "output_constraints"};

int resp_native_adapter(const mg_gen_t *g, const mg_provider_conf_t *p)
{
    int pi = (int)(p - g->cfg->providers);
    return pi >= 0 && (size_t)pi < g->cfg->n_providers &&
           g->adapters[g->provider_adapter[pi]].entry_responses;
}

int resp_native_model(const mg_gen_t *g, const char *name)
{
    const mg_config_t *cfg = g->cfg;
    const mg_model_conf_t *m = name ? mg_config_model(cfg, name) : NULL;
    const char *colon = name && !m ? strrchr(name, ':') : NULL;
    if (colon && colon > name) { /* "model:provider", a pinned route */
        char base[300];
        snprintf(base, sizeof(base), "%.*s", (int)(colon - name), name);
        m = mg_config_model(cfg, base);
    }
    if (m) {
        for (size_t i = 0; i < m->n_routes; i++) {
            const mg_provider_conf_t *p = mg_config_route_provider(cfg, &m->routes[i]);
            if (p && resp_native_adapter(g, p)) return 1;
        }
        return 0;
    }
    for (size_t i = 0; name && i < cfg->n_providers; i++) { /* served by a model_prefix */
        const char *pre = cfg->providers[i].model_prefix;
        if (pre && strncmp(name, pre, strlen(pre)) == 0 &&
            resp_native_adapter(g, &cfg->providers[i]))
            return 1;
    }
    return 0;
}

int resp_native_begin(call_t *c)
{
    if (!c->rnative && !(c->rnative = calloc(1, sizeof(*c->rnative)))) return -1;
    c->rnative->held.len = 0;
    c->rnative->last_seq = -1;
    c->rnative->terminal_forwarded = 0;
    return 0;
}

void resp_native_free(call_t *c)
{
    if (!c->rnative) return;
    mg_buf_free(&c->rnative->held);
    free(c->rnative);
    c->rnative = NULL;
}

int resp_native_body(call_t *c, const char *model, mg_buf_t *out)
{
    cJSON *b = cJSON_Duplicate(responses_request(c), 1);
    if (!b) return -1;
    for (size_t i = 0; i < sizeof(own_keys) / sizeof(own_keys[0]); i++)
        cJSON_DeleteItemFromObjectCaseSensitive(b, own_keys[i]);
    set_item(b, "model", cJSON_CreateString(model));
    if (c->tokens_capped && c->mapped_max_tokens > 0)
        set_item(b, "max_output_tokens", cJSON_CreateNumber((double)c->mapped_max_tokens));
    int rc = c->req ? mg_json_keep_big_ints(b, c->req->body, c->req->body_len) : 0;
    if (rc == 0) rc = mg_json_print(b, out);
    cJSON_Delete(b);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The stream                                                                */
/* ------------------------------------------------------------------------ */

/* What the core reads of an event's top level: its type and sequence number. */
typedef struct {
    const char *type;
    size_t len;
    long long seq;
} event_scan_t;

static int event_member(void *ud, const mg_json_member_t *m)
{
    event_scan_t *t = ud;
    if (member_is(m, "type") && m->value_len >= 2 && m->value[0] == '"' &&
        !memchr(m->value, '\\', m->value_len)) {
        t->type = m->value + 1;
        t->len = m->value_len - 2;
    } else if (member_is(m, "sequence_number") && m->value_len && m->value[0] >= '0' &&
               m->value[0] <= '9') {
        t->seq = strtoll(m->value, NULL, 10);
    }
    return 0;
}

static int type_is(const event_scan_t *t, const char *name)
{
    size_t n = strlen(name);
    return t->len == n && memcmp(t->type, name, n) == 0;
}

/* The events whose "response" is a Response object (the model in it is renamed). */
static int carries_response(const event_scan_t *t)
{
    static const char *const names[] = {"response.created",    "response.in_progress",
                                        "response.queued",     "response.completed",
                                        "response.incomplete", "response.failed"};
    if (t->len < 14 || memcmp(t->type, "response.", 9) != 0) return 0;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (type_is(t, names[i])) return 1;
    return 0;
}

/* Whether the client has seen anything of this attempt (else a failure is a failover). */
static int started(const call_t *c)
{
    return c->client_started || c->out.len > 0 || c->first_chunk_done;
}

static void out_event_typed(mg_buf_t *out, const char *type, size_t type_len, const char *data,
                            size_t n)
{
    mg_buf_append(out, "event: ", 7);
    mg_buf_append(out, type, type_len);
    mg_buf_append(out, "\ndata: ", 7);
    mg_buf_append(out, data, n);
    mg_buf_append(out, "\n\n", 2);
}

/* The held opening events go out: the answer has begun. */
static void begin_answer(call_t *c)
{
    struct resp_native_s *rn = c->rnative;
    if (c->first_chunk_done) return;
    c->first_chunk_done = 1;
    mg_buf_append(&c->out, rn->held.data ? rn->held.data : "", rn->held.len);
    rn->held.len = 0;
}

/* The upstream's failure: the next route before the client saw a byte, else the event
 * (`shown`: its text as the client gets it) forwarded and the stream's error end.
 * `code`/`message` from the event. */
static int upstream_failed(call_t *c, const mg_buf_t *shown, const cJSON *code,
                           const cJSON *message)
{
    mg_buf_t text = {0};
    if (cJSON_IsString(code)) {
        mg_buf_append_str(&text, code->valuestring);
        mg_buf_append_str(&text, ": ");
    }
    mg_buf_append_str(&text, cJSON_IsString(message) ? message->valuestring : "unspecified");
    if (started(c)) {
        mg_buf_append(&c->out, shown->data, shown->len);
        c->rnative->terminal_forwarded = 1;
    }
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "message", text.data ? text.data : "unspecified");
    mg_buf_free(&text);
    int rc = upstream_error_event(c, e);
    cJSON_Delete(e);
    return rc;
}

/* The event as the client gets it into `shown`: its bytes, or, when it carries a Response
 * whose model is renamed, the event printed again with the client's name. */
static void shown_event(call_t *c, const mg_sse_event_t *ev, const event_scan_t *t, cJSON *d,
                        mg_buf_t *shown)
{
    cJSON *resp = cJSON_GetObjectItemCaseSensitive(d, "response");
    if (!model_renamed(c) || !cJSON_HasObjectItem(resp, "model")) {
        mg_buf_append(shown, ev->raw, ev->raw_len);
        return;
    }
    set_item(resp, "model", cJSON_CreateString(c->client_model));
    mg_buf_t text = {0};
    mg_json_print(d, &text);
    out_event_typed(shown, t->type, t->len, text.data ? text.data : "{}", text.len ? text.len : 2);
    mg_buf_free(&text);
}

/* An event that carries a Response (or is an error): read as a tree. */
static int tree_event(call_t *c, const mg_sse_event_t *ev, const event_scan_t *t)
{
    cJSON *d = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!cJSON_IsObject(d)) {
        cJSON_Delete(d);
        return garbage_event(c);
    }
    const cJSON *resp = cJSON_GetObjectItemCaseSensitive(d, "response");
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(resp, "usage");
    if (cJSON_IsObject(usage)) {
        char *u = cJSON_PrintUnformatted(usage);
        if (u) take_usage_bytes(c, u, strlen(u));
        free(u);
    }
    mg_buf_t shown = {0};
    shown_event(c, ev, t, d, &shown);
    int rc = 0;
    if (type_is(t, "error") || type_is(t, "response.failed")) {
        /* error: {type, code, message, param, sequence_number}; failed: response.error */
        const cJSON *err =
            type_is(t, "error") ? d : cJSON_GetObjectItemCaseSensitive(resp, "error");
        rc = upstream_failed(c, &shown, cJSON_GetObjectItemCaseSensitive(err, "code"),
                             cJSON_GetObjectItemCaseSensitive(err, "message"));
    } else {
        int opening = type_is(t, "response.created") || type_is(t, "response.in_progress") ||
                      type_is(t, "response.queued");
        if (!opening) begin_answer(c);
        if (type_is(t, "response.completed") || type_is(t, "response.incomplete"))
            c->upstream_done = 1;
        mg_buf_append(opening && !c->first_chunk_done ? &c->rnative->held : &c->out, shown.data,
                      shown.len);
    }
    mg_buf_free(&shown);
    cJSON_Delete(d);
    return rc;
}

int resp_native_event(call_t *c, const mg_sse_event_t *ev)
{
    event_scan_t t = {NULL, 0, -1};
    if (mg_json_check_members(ev->data, ev->data_len, event_member, &t) != 0 || !t.type) {
        mg_log_msg(MG_LOG_WARN, c->req ? c->req->request_id : NULL,
                   "upstream %s sent a stream event that is not a Responses event (%zu bytes)",
                   c->provider->id, ev->data_len);
        return garbage_event(c);
    }
    if (t.seq >= 0) c->rnative->last_seq = t.seq;
    if (type_is(&t, "error") || carries_response(&t)) return tree_event(c, ev, &t);
    begin_answer(c);
    if (t.len > 6 && memcmp(t.type + t.len - 6, ".delta", 6) == 0) c->chunks++;
    if (type_is(&t, "response.output_text.delta"))
        content_take_responses(c, ev->data, ev->data_len); /* full logging's */
    mg_buf_append(&c->out, ev->raw, ev->raw_len);
    return 0;
}

void resp_native_end(call_t *c)
{
    struct resp_native_s *rn = c->rnative;
    if (!c->error_code || (rn && rn->terminal_forwarded)) return;
    /* the gateway's own failure after the first byte: the API's error event */
    char msg[600];
    snprintf(msg, sizeof(msg), "%s: %s", c->error_code,
             c->error_message ? c->error_message : "the stream failed");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "type", "error");
    cJSON_AddStringToObject(e, "code", "server_error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddNullToObject(e, "param");
    cJSON_AddNumberToObject(e, "sequence_number", rn ? (double)(rn->last_seq + 1) : 0);
    mg_buf_t text = {0};
    mg_json_print(e, &text);
    cJSON_Delete(e);
    out_event_typed(&c->out, "error", 5, text.data ? text.data : "{}", text.len ? text.len : 2);
    mg_buf_free(&text);
}

/* ------------------------------------------------------------------------ */
/* The whole answer                                                          */
/* ------------------------------------------------------------------------ */

mg_step_rc_t resp_native_answer(call_t *c)
{
    cJSON *resp = cJSON_ParseWithLength(c->resp.data ? c->resp.data : "", c->resp.len);
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(resp, "object");
    if (!cJSON_IsObject(resp) || !cJSON_IsString(obj) ||
        strcmp(obj->valuestring, "response") != 0) {
        cJSON_Delete(resp);
        return answer_garbage(c);
    }
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(resp, "status");
    if (cJSON_IsString(status) && strcmp(status->valuestring, "failed") == 0) {
        /* a failed Response the client has not seen: the next route, as a failed stream */
        cJSON_Delete(resp);
        attempt_end(c, ATTEMPT_FAILED);
        c->last_fail = FAIL_ERROR_EVENT;
        c->step = STEP_RESERVE;
        return MG_STEP_NEXT;
    }
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(resp, "usage");
    if (cJSON_IsObject(usage)) {
        char *u = cJSON_PrintUnformatted(usage);
        if (u) take_usage_bytes(c, u, strlen(u));
        free(u);
    }
    estimate_tokens(c);
    int rc = 0;
    if (model_renamed(c) && cJSON_HasObjectItem(resp, "model")) {
        set_item(resp, "model", cJSON_CreateString(c->client_model));
        c->answer.len = 0;
        rc = mg_json_print(resp, &c->answer);
    } else {
        c->answer.len = 0;
        rc = mg_buf_append(&c->answer, c->resp.data, c->resp.len);
    }
    cJSON_Delete(resp);
    attempt_end(c, ATTEMPT_OK);
    if (rc != 0) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    return MG_STEP_NEXT;
}
