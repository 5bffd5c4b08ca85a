/* messages_native: an Anthropic upstream's answer to an Anthropic Messages client, forwarded
 * as the upstream wrote it, the pass-through of the Messages wire. An adapter that declares
 * entry_wire = "anthropic" sends the client's own body (req.entry); its answer then needs no
 * translation either way, so the core neither calls the adapter's decoders nor re-frames the
 * stream: whatever Anthropic adds (citations, server tool results, new block types) reaches
 * the client. The core still reads what it needs: the usage (message_start's input and cache
 * counts, message_delta's output), the end (message_stop), an error event (the attempt's
 * failure: the next route before the first byte, the stream's error end after), and it
 * answers with the client's model name, as on every route. */
#include "pipeline/call.h"

#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "pipeline/messages_resp.h"
#include "pipeline/messages_stream.h"

static long long count_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    long long n = mg_json_ll(v, 0);
    return n > 0 ? n : 0;
}

/* Anthropic's usage as the call counts it: the prompt is input + cache reads + cache
 * writes (what chat's prompt_tokens would say). `input` 0: leave the prompt as it is. */
static void take_usage(call_t *c, const cJSON *u, int input)
{
    if (!cJSON_IsObject(u)) return;
    if (input && cJSON_GetObjectItemCaseSensitive(u, "input_tokens"))
        c->prompt_tokens = count_of(u, "input_tokens") + count_of(u, "cache_read_input_tokens") +
                           count_of(u, "cache_creation_input_tokens");
    if (cJSON_GetObjectItemCaseSensitive(u, "output_tokens")) {
        c->completion_tokens = count_of(u, "output_tokens");
        c->have_usage = 1;
    }
}

static void set_model(call_t *c, cJSON *obj)
{
    if (model_renamed(c) && cJSON_HasObjectItem(obj, "model"))
        set_item(obj, "model", cJSON_CreateString(c->client_model));
}

static void out_anthropic_event(call_t *c, const char *type, size_t type_len, const char *data,
                                size_t n)
{
    mg_buf_append(&c->out, "event: ", 7);
    mg_buf_append(&c->out, type, type_len);
    mg_buf_append(&c->out, "\ndata: ", 7);
    mg_buf_append(&c->out, data, n);
    mg_buf_append(&c->out, "\n\n", 2);
}

/* The event's "type" (a plain string), found while the event is checked as JSON. */
typedef struct {
    const char *type;
    size_t len;
} type_scan_t;

static int type_member(void *ud, const mg_json_member_t *m)
{
    type_scan_t *t = ud;
    if (member_is(m, "type") && m->value_len >= 2 && m->value[0] == '"' &&
        !memchr(m->value, '\\', m->value_len)) {
        t->type = m->value + 1;
        t->len = m->value_len - 2;
    }
    return 0;
}

static int type_is(const type_scan_t *t, const char *name)
{
    size_t n = strlen(name);
    return t->len == n && memcmp(t->type, name, n) == 0;
}

/* The events the core reads (message_start, message_delta, error) as a tree; the rest as
 * they are. */
static int tree_event(call_t *c, const mg_sse_event_t *ev, const type_scan_t *t)
{
    cJSON *d = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!cJSON_IsObject(d)) {
        cJSON_Delete(d);
        return garbage_event(c);
    }
    if (type_is(t, "error")) {
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(d, "error");
        cJSON *e = cJSON_CreateObject();
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(err, "message");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(err, "type");
        mg_buf_t text = {0};
        if (cJSON_IsString(type)) {
            mg_buf_append_str(&text, type->valuestring);
            mg_buf_append_str(&text, ": ");
        }
        mg_buf_append_str(&text, cJSON_IsString(m) ? m->valuestring : "unspecified");
        cJSON_AddStringToObject(e, "message", text.data ? text.data : "");
        mg_buf_free(&text);
        int rc = upstream_error_event(c, e);
        cJSON_Delete(e);
        cJSON_Delete(d);
        return rc;
    }
    if (type_is(t, "message_start")) {
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(d, "message");
        take_usage(c, cJSON_GetObjectItemCaseSensitive(msg, "usage"), 1);
        c->completion_tokens =
            0; /* message_start's output count is provisional: message_delta has the real one */
        c->have_usage = 0;
        set_model(c, msg);
        mg_buf_t text = {0};
        mg_json_print(d, &text);
        out_anthropic_event(c, t->type, t->len, text.data ? text.data : "{}",
                            text.len ? text.len : 2);
        mg_buf_free(&text);
        c->first_chunk_done = 1;
    } else {
        take_usage(c, cJSON_GetObjectItemCaseSensitive(d, "usage"), 1);
        out_anthropic_event(c, t->type, t->len, ev->data, ev->data_len);
    }
    cJSON_Delete(d);
    return 0;
}

int msgs_native_event(call_t *c, const mg_sse_event_t *ev)
{
    type_scan_t t = {NULL, 0};
    if (mg_json_check_members(ev->data, ev->data_len, type_member, &t) != 0 || !t.type) {
        mg_log_msg(MG_LOG_WARN, c->req->request_id,
                   "upstream %s sent a stream event that is not an Anthropic event (%zu bytes)",
                   c->provider->id, ev->data_len);
        return garbage_event(c);
    }
    if (type_is(&t, "message_start") || type_is(&t, "message_delta") || type_is(&t, "error"))
        return tree_event(c, ev, &t);
    if (type_is(&t, "message_stop")) c->upstream_done = 1;
    if (type_is(&t, "content_block_delta")) {
        c->chunks++;
        content_take_anthropic(c, ev->data, ev->data_len); /* full logging's */
    }
    out_anthropic_event(c, t.type, t.len, ev->data, ev->data_len);
    return 0;
}

mg_step_rc_t msgs_native_answer(call_t *c)
{
    cJSON *resp = cJSON_ParseWithLength(c->resp.data ? c->resp.data : "", c->resp.len);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(resp, "type");
    if (!cJSON_IsObject(resp) || !cJSON_IsString(type) ||
        strcmp(type->valuestring, "message") != 0) {
        cJSON_Delete(resp);
        return answer_garbage(c);
    }
    take_usage(c, cJSON_GetObjectItemCaseSensitive(resp, "usage"), 1);
    set_model(c, resp);
    c->answer.len = 0;
    int rc = mg_json_print(resp, &c->answer);
    cJSON_Delete(resp);
    attempt_end(c, ATTEMPT_OK);
    if (rc != 0) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    return MG_STEP_NEXT;
}

void msgs_native_end(call_t *c)
{
    if (!c->error_code) return; /* message_stop went out with the rest */
    const char *msg = c->error_message ? c->error_message : "the stream failed";
    mg_buf_t body = {0};
    mg_msgs_error_body_typed(&body, mg_msgs_stream_error_type(c->error_code, msg), c->error_code,
                             msg, NULL);
    out_anthropic_event(c, "error", 5, body.data ? body.data : "{}", body.len ? body.len : 2);
    mg_buf_free(&body);
}
