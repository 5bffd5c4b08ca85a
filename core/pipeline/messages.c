/* messages: the Anthropic Messages front end on the call's path (POST /v1/messages). The
 * call runs as a chat request in the canonical form, so that every step, route, adapter,
 * limit and meter applies unchanged; this file is where it turns: the body at parse
 * (messages_req.c), the answer, the error and every stream write at the end
 * (messages_resp.c, messages_stream.c). The gateway's metadata stays in the headers
 * (X-Request-Id, X-Sidecar-Degraded): Anthropic clients see only Anthropic fields. */
#include "pipeline/call.h"

#include <stdlib.h>
#include <string.h>

#include "pipeline/messages_req.h"
#include "pipeline/messages_resp.h"
#include "pipeline/messages_stream.h"

/* The client's body replaced by its canonical translation; the original kept for an adapter
 * that speaks Anthropic upstream (req.entry). 0, or a step that answers the 400. */
int msgs_parse(call_t *c)
{
    mg_http_req_t *req = c->req;
    mg_buf_t chat = {0};
    char err[400];
    int rc = mg_msgs_request(req->body, req->body_len, 0, &chat, err, sizeof(err));
    if (rc == 1) {
        c->msgs_lossy = strdup(err);
        rc = 0;
    }
    if (rc != 0) {
        mg_buf_free(&chat);
        call_error(c, rc == -2 ? 500 : 400, rc == -2 ? "INTERNAL_ERROR" : "INVALID_REQUEST",
                   rc == -2 ? "out of memory" : err, 0);
        return -1;
    }
    c->entry_body = req->body; /* moved: the request frees the body it holds */
    c->entry_len = req->body_len;
    c->entry_cap = req->body_cap;
    req->body = chat.data;
    req->body_len = chat.len;
    req->body_cap = chat.cap;
    return 0;
}

void msgs_restore_body(call_t *c)
{
    mg_http_req_t *req = c->req;
    if (!c->entry_body || !req) return;
    free(req->body);
    req->body = c->entry_body;
    req->body_len = c->entry_len;
    req->body_cap = c->entry_cap;
    c->entry_body = NULL;
}

void msgs_message_id(const call_t *c, char *id, size_t cap)
{
    snprintf(id, cap, "msg_%s", c->req ? c->req->request_id : "");
}

static mg_msgs_usage_t call_usage(const call_t *c)
{
    mg_msgs_usage_t u = {c->prompt_tokens, c->completion_tokens, 0, 0};
    return u;
}

/* The whole answer (c->answer, canonical) as a Message. 0, or -1 when it cannot be (the
 * caller answers an error). */
int msgs_answer(call_t *c)
{
    char id[96];
    msgs_message_id(c, id, sizeof(id));
    mg_msgs_usage_t fallback = call_usage(c);
    mg_buf_t msg = {0};
    if (mg_msgs_answer(c->answer.data, c->answer.len, id, c->client_model ? c->client_model : "",
                       &fallback, &msg) != 0) {
        mg_buf_free(&msg);
        return -1;
    }
    mg_buf_free(&c->answer);
    c->answer = msg;
    return 0;
}

/* An upstream's error type that is one of Anthropic's (an Anthropic upstream's own, or an
 * OpenAI one of the same name), or NULL. */
static const char *anthropic_type(const char *t)
{
    static const char *const names[] = {
        "invalid_request_error", "authentication_error", "permission_error", "not_found_error",
        "request_too_large",     "rate_limit_error",     "api_error",        "overloaded_error",
        "billing_error",         "timeout_error"};
    for (size_t i = 0; t && i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(t, names[i]) == 0) return names[i];
    return NULL;
}

void msgs_error_body(call_t *c, mg_buf_t *body)
{
    const char *msg = c->error_message ? c->error_message : "out of memory";
    const char *passed = anthropic_type(c->error_passed[1]);
    if (passed) mg_msgs_error_body_typed(body, passed, c->error_code, msg, c->req->request_id);
    else mg_msgs_error_body(body, c->status, c->error_code, msg, c->req->request_id);
}

/* c->out (canonical SSE) re-framed as Anthropic events, in place. With `end` the call's
 * counts stand in for usage the upstream did not report. */
void msgs_reframe(call_t *c, int end)
{
    if (!c->msgs) {
        c->msgs = calloc(1, sizeof(*c->msgs));
        char id[96];
        msgs_message_id(c, id, sizeof(id));
        if (!c->msgs ||
            mg_msgs_stream_init(c->msgs, id, c->client_model, c->entry.input_tokens) != 0) {
            free(c->msgs);
            c->msgs = NULL;
            c->out.len = 0;
            return;
        }
    }
    if (end) c->msgs->fallback = call_usage(c);
    mg_buf_t framed = {0};
    mg_msgs_stream_feed(c->msgs, c->out.data, c->out.len, &framed);
    mg_buf_free(&c->out);
    c->out = framed;
}

void msgs_free(call_t *c)
{
    free(c->msgs_lossy);
    c->msgs_lossy = NULL;
    free(c->entry_body);
    c->entry_body = NULL;
    if (c->msgs) {
        mg_msgs_stream_free(c->msgs);
        free(c->msgs);
        c->msgs = NULL;
    }
}
