/* messages_resp: canonical answers as Anthropic Messages, errors in Anthropic's shape; see
 * messages_resp.h. */
#include "pipeline/messages_resp.h"

#include "base/json.h"

#include "net/http.h"

#include <stdio.h>
#include <string.h>

static long long num_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return mg_json_ll(v, -1);
}

int mg_msgs_usage(const cJSON *usage, mg_msgs_usage_t *u)
{
    long long prompt = num_of(usage, "prompt_tokens"), out = num_of(usage, "completion_tokens");
    if (prompt < 0 && out < 0) return 0;
    const cJSON *details = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
    long long read = num_of(details, "cached_tokens"),
              write = num_of(usage, "cache_creation_input_tokens");
    u->cache_read = read > 0 ? read : 0;
    u->cache_write = write > 0 ? write : 0;
    u->input = prompt > 0 ? prompt - u->cache_read - u->cache_write : 0;
    if (u->input < 0) u->input = 0;
    u->output = out > 0 ? out : 0;
    return 1;
}

int mg_msgs_usage_print(const mg_msgs_usage_t *u, mg_buf_t *out)
{
    mg_buf_append_str(out, "{\"input_tokens\":");
    mg_buf_append_int(out, u->input);
    mg_buf_append_str(out, ",\"output_tokens\":");
    mg_buf_append_int(out, u->output);
    mg_buf_append_str(out, ",\"cache_creation_input_tokens\":");
    mg_buf_append_int(out, u->cache_write);
    mg_buf_append_str(out, ",\"cache_read_input_tokens\":");
    mg_buf_append_int(out, u->cache_read);
    return mg_buf_append(out, "}", 1);
}

/* Anthropic's stop reasons a canonical choice may carry as they are: the static name, or
 * NULL. */
static const char *anthropic_reason(const char *s)
{
    static const char *const names[] = {"end_turn",
                                        "max_tokens",
                                        "stop_sequence",
                                        "tool_use",
                                        "refusal",
                                        "pause_turn",
                                        "model_context_window_exceeded"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i]) == 0) return names[i];
    return NULL;
}

const char *mg_msgs_stop_reason(const cJSON *choice, const char **sequence)
{
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    const cJSON *sr = cJSON_GetObjectItemCaseSensitive(choice, "stop_reason");
    const char *f = cJSON_IsString(fr) ? fr->valuestring : "stop";
    *sequence = NULL;
    const char *passed = cJSON_IsString(sr) ? anthropic_reason(sr->valuestring) : NULL;
    if (passed) return passed;
    if (strcmp(f, "length") == 0) return "max_tokens";
    if (strcmp(f, "tool_calls") == 0 || strcmp(f, "function_call") == 0) return "tool_use";
    if (strcmp(f, "content_filter") == 0) return "refusal";
    if (cJSON_IsString(sr) && sr->valuestring[0]) { /* vLLM: the stop string that matched */
        *sequence = sr->valuestring;
        return "stop_sequence";
    }
    return "end_turn";
}

static void add_text_block(cJSON *content, const char *type, const char *key, const char *text)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", type);
    cJSON_AddStringToObject(b, key, text);
    if (strcmp(type, "thinking") == 0) cJSON_AddStringToObject(b, "signature", "");
    cJSON_AddItemToArray(content, b);
}

/* Thinking first (Anthropic's order): the adapter's blocks as they are, else the engine's
 * reasoning text as one block. */
static void thinking_blocks(const cJSON *msg, cJSON *content)
{
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(msg, "thinking_blocks");
    if (cJSON_IsArray(blocks) && blocks->child) {
        for (const cJSON *b = blocks->child; b; b = b->next)
            if (cJSON_IsObject(b)) cJSON_AddItemToArray(content, cJSON_Duplicate(b, 1));
        return;
    }
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (!cJSON_IsString(r)) r = cJSON_GetObjectItemCaseSensitive(msg, "reasoning");
    if (cJSON_IsString(r) && r->valuestring[0])
        add_text_block(content, "thinking", "thinking", r->valuestring);
}

static void text_blocks(const cJSON *msg, cJSON *content)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (cJSON_IsString(c) && c->valuestring[0])
        add_text_block(content, "text", "text", c->valuestring);
    for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(t) && t->valuestring[0])
            add_text_block(content, "text", "text", t->valuestring);
    }
}

/* tool_calls as tool_use blocks; arguments that are not a JSON object are kept as a string
 * under "arguments" rather than lost. */
static void tool_blocks(const cJSON *msg, cJSON *content)
{
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    int i = 0;
    for (const cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next, i++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "tool_use");
        if (cJSON_IsString(id)) {
            cJSON_AddStringToObject(b, "id", id->valuestring);
        } else {
            char gen[32];
            snprintf(gen, sizeof(gen), "toolu_%d", i);
            cJSON_AddStringToObject(b, "id", gen);
        }
        cJSON_AddStringToObject(b, "name", cJSON_IsString(name) ? name->valuestring : "");
        cJSON *input = NULL;
        if (cJSON_IsString(args))
            input = args->valuestring[0] ? cJSON_Parse(args->valuestring) : cJSON_CreateObject();
        else if (cJSON_IsObject(args)) input = cJSON_Duplicate(args, 1);
        if (!cJSON_IsObject(input)) {
            cJSON_Delete(input);
            input = cJSON_CreateObject();
            if (cJSON_IsString(args))
                cJSON_AddStringToObject(input, "arguments", args->valuestring);
        }
        cJSON_AddItemToObject(b, "input", input);
        cJSON_AddItemToArray(content, b);
    }
}

int mg_msgs_answer(const char *json, size_t n, const char *id, const char *model,
                   const mg_msgs_usage_t *fallback, mg_buf_t *out)
{
    cJSON *chat = cJSON_ParseWithLength(json, n);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chat, "choices");
    const cJSON *choice = cJSON_IsArray(choices) ? choices->child : NULL;
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(choice, "message");
    if (!cJSON_IsObject(msg)) {
        cJSON_Delete(chat);
        return -1;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", model);
    cJSON *content = cJSON_AddArrayToObject(m, "content");
    thinking_blocks(msg, content);
    text_blocks(msg, content);
    tool_blocks(msg, content);
    const char *seq;
    cJSON_AddStringToObject(m, "stop_reason", mg_msgs_stop_reason(choice, &seq));
    if (seq) cJSON_AddStringToObject(m, "stop_sequence", seq);
    else cJSON_AddNullToObject(m, "stop_sequence");
    mg_msgs_usage_t u = *fallback;
    mg_msgs_usage(cJSON_GetObjectItemCaseSensitive(chat, "usage"), &u);
    mg_buf_t usage = {0};
    mg_msgs_usage_print(&u, &usage);
    cJSON_AddItemToObject(m, "usage", cJSON_Parse(usage.data ? usage.data : "{}"));
    mg_buf_free(&usage);
    int rc = mg_json_print(m, out) == 0 ? 0 : -2;
    cJSON_Delete(m);
    cJSON_Delete(chat);
    return rc;
}

const char *mg_msgs_error_type(int status, const char *code)
{
    if (code && (strcmp(code, "MODEL_UNAVAILABLE") == 0 ||
                 strcmp(code, "RESOURCE_EXHAUSTED") == 0 || strcmp(code, "QUEUE_FULL") == 0))
        return "overloaded_error";
    switch (status) {
    case 400:
    case 405:
    case 409:
    case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 402: return "billing_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 408:
    case 504: return "timeout_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
    }
}

int mg_msgs_error_body(mg_buf_t *out, int status, const char *code, const char *message,
                       const char *request_id)
{
    return mg_msgs_error_body_typed(out, mg_msgs_error_type(status, code), code, message,
                                    request_id);
}

int mg_msgs_error_body_typed(mg_buf_t *out, const char *type, const char *code, const char *message,
                             const char *request_id)
{
    mg_buf_t msg = {0};
    if (code) {
        mg_buf_append_str(&msg, code);
        mg_buf_append_str(&msg, ": ");
    }
    mg_buf_append_str(&msg, message ? message : "error");
    mg_buf_append_str(out, "{\"type\":\"error\",\"error\":{\"type\":\"");
    mg_buf_append_str(out, type);
    mg_buf_append_str(out, "\",\"message\":");
    mg_json_print_string(msg.data ? msg.data : "", msg.len, out);
    mg_buf_append_str(out, "}");
    if (request_id) {
        mg_buf_append_str(out, ",\"request_id\":");
        mg_json_print_string(request_id, strlen(request_id), out);
    }
    mg_buf_free(&msg);
    return mg_buf_append(out, "}", 1);
}

void mg_msgs_request_id_header(mg_http_req_t *req)
{
    const char *before = req->head_lines ? req->head_lines : "";
    size_t n = strlen(before) + strlen(req->request_id) + 16;
    char *lines = mg_arena_alloc(&req->arena, n);
    if (!lines) return;
    snprintf(lines, n, "%srequest-id: %s\r\n", before, req->request_id);
    req->head_lines = lines;
}
