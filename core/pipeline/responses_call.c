/* responses_call: POST /v1/responses as a chat call; see call.h (responses_call.c).
 *
 * parse: the Responses body is read and turned into a chat body (responses_in.h), which the
 * call then runs like any chat request: the same identify, admission, queue, routing,
 * limits, adapters, failover and metering. A previous_response_id is looked up while the
 * call waits (off the loop), before identify; its owner is checked after identify, when
 * the caller's scope is known (another scope's record is not found, 404). The answer, whole
 * or streamed, is turned back by responses_out.h and, with store on (the default), kept. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "pipeline/responses_in.h"
#include "pipeline/responses_out.h"
#include "pipeline/responses_store.h"

typedef enum { PREV_NONE = 0, PREV_WAITING, PREV_FOUND, PREV_MISSING } prev_state_t;

typedef struct resp_call_s {
    cJSON *req;           /* owned: the client's Responses body */
    char id[64];          /* "resp_" + a row key's hex + the request id's (responses_store.h) */
    int64_t created_at;   /* unix seconds */
    int store;            /* store: keep the Response (default true) */
    int had_instructions; /* the chat body's first message is the instructions' */
    char prev_id[96];     /* previous_response_id, or "" */
    prev_state_t prev;
    mg_resp_lookup_t *lookup;         /* in flight while PREV_WAITING */
    char *prev_scope, *prev_messages; /* owned, PREV_FOUND */
    char scope[128];                  /* the caller's (after identify) */
    mg_resp_out_t *out;               /* owned: the answer, made at its first chunk */
    mg_buf_t prompt;                  /* owned: the chat messages printed (responses_prompt) */
    /* what only the model's native routes can serve (responses_unbridged) */
    mg_resp_error_t unbridged; /* message "" when the bridge can translate the request */
} resp_call_t;

void responses_free(call_t *c)
{
    resp_call_t *r = c->responses;
    if (!r) return;
    mg_resp_lookup_cancel(r->lookup);
    cJSON_Delete(r->req);
    free(r->prev_scope);
    free(r->prev_messages);
    mg_resp_out_free(r->out);
    mg_buf_free(&r->prompt);
    free(r);
    c->responses = NULL;
}

/* A 400 that names the parameter at fault. Returns -1. */
static int refuse(call_t *c, int status, const char *code, const char *msg, const char *param)
{
    call_error(c, status, code, msg, 0);
    free(c->error_passed[2]);
    c->error_passed[2] = param && *param ? strdup(param) : NULL;
    return -1;
}

static int messages_empty(const call_t *c)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(c->body, "messages")) == 0;
}

/* ------------------------------------------------------------------------ */
/* Parse: the request, and the previous response looked up                   */
/* ------------------------------------------------------------------------ */

static void prev_found(void *ud, const mg_resp_record_t *rec)
{
    call_t *c = ud;
    resp_call_t *r = c->responses;
    r->lookup = NULL;
    r->prev = PREV_MISSING;
    if (rec) {
        r->prev_scope = strdup(rec->scope);
        r->prev_messages = strdup(rec->messages);
        if (r->prev_scope && r->prev_messages) r->prev = PREV_FOUND;
    }
    call_resume(c, STEP_IDENTIFY);
}

const cJSON *responses_request(const call_t *c)
{
    return c->responses ? c->responses->req : NULL;
}

int responses_route_refused(const call_t *c, int native, const char **msg, const char **param)
{
    const resp_call_t *r = c->responses;
    if (native && r->prev == PREV_FOUND) {
        /* the gateway's own id (a bridged answer it keeps): its upstreams never saw it */
        *msg = "previous_response_id names a response the gateway keeps: only the model's "
               "bridged (chat) routes can continue it";
        *param = "previous_response_id";
        return 1;
    }
    if (native || !r->unbridged.message[0]) return 0;
    *msg = r->unbridged.message;
    *param = r->unbridged.param;
    return 1;
}

static const char *model_of(const cJSON *req)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "model");
    return cJSON_IsString(m) ? m->valuestring : NULL;
}

/* The chat body of a request the bridge cannot translate but a native route may serve: what
 * the call's own steps read (model, stream, the gateway's extensions, the output ceiling) and
 * the input as one user message, for counting only (it is never sent). NULL: out of memory. */
static cJSON *stand_in_chat(const cJSON *req)
{
    static const char *const keep[] = {"model",    "stream",          "priority",
                                       "timeouts", "routing",         "session_id",
                                       "metadata", "idempotency_key", "context_policy"};
    cJSON *chat = cJSON_CreateObject();
    for (size_t i = 0; chat && i < sizeof(keep) / sizeof(keep[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, keep[i]);
        if (v) cJSON_AddItemToObject(chat, keep[i], cJSON_Duplicate(v, 1));
    }
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(req, "max_output_tokens");
    if (cJSON_IsNumber(mot)) cJSON_AddNumberToObject(chat, "max_tokens", mot->valuedouble);
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(req, "input");
    char *text = cJSON_IsString(input) ? NULL : cJSON_PrintUnformatted(input);
    cJSON *msg = cJSON_CreateObject();
    cJSON_AddStringToObject(msg, "role", "user");
    cJSON_AddStringToObject(msg, "content",
                            cJSON_IsString(input) ? input->valuestring
                            : text                ? text
                                                  : "");
    free(text);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(chat, "messages"), msg);
    return chat;
}

/* 0: c->body is the chat body; 1: the same, and the previous response is being looked up
 * (resume at identify); -1: the call's error is set. */
int responses_parse(call_t *c)
{
    mg_http_req_t *req = c->req;
    resp_call_t *r = calloc(1, sizeof(*r));
    if (!r) return refuse(c, 500, "INTERNAL_ERROR", "out of memory", NULL);
    c->responses = r;
    mg_resp_store_new_id(c->pl->responses,
                         strncmp(req->request_id, "req-", 4) == 0 ? req->request_id + 4
                                                                  : req->request_id,
                         r->id, sizeof(r->id));
    r->created_at = (int64_t)time(NULL);
    if (!req->body_len) return refuse(c, 400, "INVALID_REQUEST", "request body is empty", NULL);
    r->req = cJSON_ParseWithLength(req->body, req->body_len);
    if (!cJSON_IsObject(r->req))
        return refuse(c, 400, "INVALID_REQUEST", "request body is not a JSON object", NULL);
    mg_resp_error_t err;
    cJSON *chat = NULL;
    if (mg_resp_to_chat(r->req, &chat, &err) != 0) {
        /* what the bridge cannot honour is refused, unless a native route may take it */
        if (!resp_native_model(c->gen, model_of(r->req)))
            return refuse(c, 400, "INVALID_REQUEST", err.message, err.param);
        r->unbridged = err;
        if (!r->unbridged.message[0])
            snprintf(r->unbridged.message, sizeof(r->unbridged.message), "%s",
                     "the request cannot be bridged to a chat engine");
        if (!(chat = stand_in_chat(r->req)))
            return refuse(c, 500, "INTERNAL_ERROR", "out of memory", NULL);
    }
    c->body = chat;
    c->ep = MG_EP_CHAT;       /* the engine's side; metrics and idempotency see MG_EP_RESPONSES */
    c->chunk_memo.places = 1; /* stream chunks are read by their template (responses_scan) */
    r->had_instructions = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r->req, "instructions"));
    r->store = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r->req, "store"));
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(r->req, "previous_response_id");
    if (!cJSON_IsString(prev)) {
        if (messages_empty(c))
            return refuse(c, 400, "INVALID_REQUEST", "'input' must not be empty", "input");
        return 0;
    }
    snprintf(r->prev_id, sizeof(r->prev_id), "%s", prev->valuestring);
    if (!c->pl->responses) {
        r->prev = PREV_MISSING;
        return 0;
    }
    r->lookup = mg_resp_store_get(c->pl->responses, r->prev_id, prev_found, c);
    if (!r->lookup) return refuse(c, 500, "INTERNAL_ERROR", "out of memory", NULL);
    r->prev = PREV_WAITING;
    return 1;
}

mg_step_rc_t responses_identified(call_t *c)
{
    resp_call_t *r = c->responses;
    mg_resp_scope(c->gen->cfg->auth_enabled ? &c->auth : NULL, c->req, r->scope, sizeof(r->scope));
    if (!r->prev_id[0]) return MG_STEP_NEXT;
    if (r->prev != PREV_FOUND && resp_native_model(c->gen, model_of(r->req))) {
        /* an id the gateway never made: a native route's upstream owns the chain */
        if (!r->unbridged.message[0]) {
            snprintf(r->unbridged.message, sizeof(r->unbridged.message),
                     "Previous response with id '%.96s' not found.", r->prev_id);
            snprintf(r->unbridged.param, sizeof(r->unbridged.param), "previous_response_id");
        }
        return MG_STEP_NEXT;
    }
    if (r->prev != PREV_FOUND || strcmp(r->prev_scope, r->scope) != 0) {
        char msg[200];
        snprintf(msg, sizeof(msg), "Previous response with id '%.96s' not found.", r->prev_id);
        refuse(c, 404, "NOT_FOUND", msg, "previous_response_id");
        return MG_STEP_NEXT;
    }
    cJSON *history = cJSON_Parse(r->prev_messages);
    int rc = mg_resp_prepend_history(c->body, history);
    cJSON_Delete(history);
    if (rc != 0) {
        refuse(c, 500, "INTERNAL_ERROR", "out of memory", NULL);
        return MG_STEP_NEXT;
    }
    if (messages_empty(c)) refuse(c, 400, "INVALID_REQUEST", "'input' must not be empty", "input");
    return MG_STEP_NEXT;
}

void responses_prompt(call_t *c, const char **text, size_t *len)
{
    resp_call_t *r = c->responses;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c->body, "messages");
    if (!r->prompt.len && (!msgs || mg_json_print(msgs, &r->prompt) != 0)) return;
    *text = r->prompt.data;
    *len = r->prompt.len;
}

/* ------------------------------------------------------------------------ */
/* The answer                                                                */
/* ------------------------------------------------------------------------ */

static mg_resp_out_t *answer_of(call_t *c)
{
    resp_call_t *r = c->responses;
    if (r->out) return r->out;
    mg_buf_t skel = {0};
    if (mg_resp_skeleton_print(r->req, &skel) == 0)
        r->out =
            mg_resp_out_new_printed(r->id, r->created_at, c->client_model, skel.data, skel.len);
    mg_buf_free(&skel);
    return r->out;
}

/* The Response kept for GET, its input items and previous_response_id: with the
 * conversation through it (this call's messages, history included, without the
 * instructions, and the answer). `final` is the Response's text, written once. */
static void keep(call_t *c, const mg_buf_t *final)
{
    resp_call_t *r = c->responses;
    if (!r->store || !c->pl->responses || !c->req) return;
    mg_buf_t msgs_text = {0}, input_text = {0};
    int ok = mg_buf_append(&msgs_text, "[", 1) == 0;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c->body, "messages");
    int i = 0;
    for (const cJSON *m = msgs ? msgs->child : NULL; ok && m; m = m->next, i++) {
        if (i == 0 && r->had_instructions) continue;
        ok = mg_json_print(m, &msgs_text) == 0 && mg_buf_append(&msgs_text, ",", 1) == 0;
    }
    ok = ok && mg_resp_out_message_print(r->out, &msgs_text) == 0 &&
         mg_buf_append(&msgs_text, "]", 1) == 0;
    ok = ok && mg_resp_input_items_print(r->req, r->id + 5, &input_text) == 0 && final->len;
    mg_resp_record_t rec = {r->scope, final->data, input_text.data, msgs_text.data};
    if (!ok || mg_resp_store_put(c->pl->responses, r->id, &rec) != 0)
        mg_log_msg(MG_LOG_WARN, c->req->request_id, "responses: %s was not kept", r->id);
    mg_buf_free(&msgs_text);
    mg_buf_free(&input_text);
}

/* The client's answer: the Response's text with the gateway's members added (the stream's
 * events carry only the API's). */
static int shown_answer(call_t *c, const mg_buf_t *final)
{
    mg_buf_t *out = &c->answer;
    out->len = 0;
    if (final->len < 2) return -1;
    const char *model = c->model->name, *actual = c->upstream_model ? c->upstream_model : "";
    mg_buf_reserve(out, final->len + 6 * (strlen(model) + strlen(actual)) + 128);
    mg_buf_append(out, final->data, final->len - 1);
    mg_buf_append_str(out, ",\"request_id\":");
    const char *id = c->req ? c->req->request_id : "";
    mg_json_print_string(id, strlen(id), out);
    mg_buf_append_str(out, ",\"logical_model\":");
    mg_json_print_string(model, strlen(model), out);
    mg_buf_append_str(out, ",\"actual_model\":");
    mg_json_print_string(actual, strlen(actual), out);
    return mg_buf_append(out, "}", 1);
}

/* Without the engine's counts, the gateway's (estimate_tokens), as for every call. */
static void usage_for(call_t *c, mg_resp_out_t *o)
{
    estimate_tokens(c);
    mg_resp_out_set_usage(o, c->prompt_tokens, c->completion_tokens);
}

void responses_chunk(call_t *c, const cJSON *chunk)
{
    mg_resp_out_t *o = answer_of(c);
    if (o) mg_resp_out_chunk(o, chunk, &c->out);
}

int responses_scan(call_t *c, const char *json, size_t n, mg_resp_chunk_t *ch)
{
    mg_resp_out_t *o = answer_of(c);
    return o ? mg_resp_out_scan_chunk(o, &c->chunk_memo, json, n, ch)
             : mg_resp_chunk_scan(json, n, "delta", ch);
}

void responses_scanned(call_t *c, const mg_resp_chunk_t *ch)
{
    mg_resp_out_t *o = answer_of(c);
    if (o) mg_resp_out_scanned(o, ch, &c->out);
}

/* A whole answer taken in: the Response written, kept, and shown with our members. */
static mg_step_rc_t answered(call_t *c, mg_resp_out_t *o)
{
    attempt_end(c, ATTEMPT_OK);
    if (!o) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    usage_for(c, o);
    const mg_buf_t *final = mg_resp_out_end(o, NULL);
    if (shown_answer(c, final) != 0)
        return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    return MG_STEP_NEXT;
}

void responses_keep(call_t *c)
{
    resp_call_t *r = c->responses;
    if (r->out) keep(c, mg_resp_out_end(r->out, NULL));
}

mg_step_rc_t responses_answer(call_t *c, cJSON *completion)
{
    mg_resp_out_t *o = answer_of(c);
    if (o) mg_resp_out_completion(o, completion);
    cJSON_Delete(completion);
    return answered(c, o);
}

mg_step_rc_t responses_answer_scanned(call_t *c, const mg_resp_chunk_t *ch)
{
    mg_resp_out_t *o = answer_of(c);
    if (o) mg_resp_out_scanned(o, ch, NULL);
    return answered(c, o);
}

void responses_stream_end(call_t *c, const char *error_message)
{
    mg_resp_out_t *o = answer_of(c);
    if (!o) return;
    if (error_message) {
        /* the Responses API's code for a failure of the service; ours is in the message */
        char msg[600];
        snprintf(msg, sizeof(msg), "%s: %s", c->error_code ? c->error_code : "ERROR",
                 error_message);
        mg_resp_out_fail(o, "server_error", msg, &c->out);
        return;
    }
    usage_for(c, o);
    keep(c, mg_resp_out_end(o, &c->out));
}
