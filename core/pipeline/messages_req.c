/* messages_req: an Anthropic Messages request as a Chat Completions body; see
 * messages_req.h for what maps where. Built as a cJSON tree (the request is parsed once
 * here, and printed once), every refusal a sentence the client can act on. */
#include "pipeline/messages_req.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *err;
    size_t errlen;
    int lossy; /* something was left out: err says what (the first thing) */
} why_t;

/* The request is malformed (a 400 whatever the route): -1. */
static int refuse(why_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, w->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Something the canonical form cannot carry: left out of it, the reason kept (routes that
 * serve the canonical form refuse the request with it; an adapter that sends the client's own
 * body does not need it). 0: go on. */
static int lossy(why_t *w, const char *fmt, ...)
{
    if (w->lossy++) return 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, w->errlen, fmt, ap);
    va_end(ap);
    return 0;
}

static const char *type_of(const cJSON *block)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(block, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The text of a string or of an array of text blocks (joined with "\n"), into out; -1 when
 * a block is not text (what names the place in the message). */
static int plain_text(const cJSON *v, mg_buf_t *out, why_t *w, const char *what)
{
    if (cJSON_IsString(v)) return mg_buf_append_str(out, v->valuestring) ? -2 : 0;
    if (!cJSON_IsArray(v)) return refuse(w, "%s must be a string or an array of text blocks", what);
    int first = 1;
    for (const cJSON *b = v->child; b; b = b->next) {
        const char *t = type_of(b), *text = str_of(b, "text");
        if (!t || strcmp(t, "text") != 0 || !text) {
            lossy(w,
                  "%s: a '%s' block cannot be sent to a Chat Completions route; only text "
                  "blocks can",
                  what, t ? t : "untyped");
            continue;
        }
        if ((!first && mg_buf_append(out, "\n", 1)) || mg_buf_append_str(out, text)) return -2;
        first = 0;
    }
    return 0;
}

static cJSON *text_part(const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "text");
    cJSON_AddStringToObject(p, "text", text);
    return p;
}

/* An image block (source base64 or url) as an image_url part. */
static cJSON *image_part(const cJSON *block, why_t *w)
{
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(block, "source");
    const char *kind = str_of(src, "type");
    mg_buf_t url = {0};
    if (kind && strcmp(kind, "base64") == 0) {
        const char *mt = str_of(src, "media_type"), *data = str_of(src, "data");
        if (!mt || !data) {
            refuse(w, "an image's base64 source needs media_type and data");
            return NULL;
        }
        mg_buf_append_str(&url, "data:");
        mg_buf_append_str(&url, mt);
        mg_buf_append_str(&url, ";base64,");
        mg_buf_append_str(&url, data);
    } else if (kind && strcmp(kind, "url") == 0 && str_of(src, "url")) {
        mg_buf_append_str(&url, str_of(src, "url"));
    } else {
        refuse(w, "an image's source must be {type: base64, media_type, data} or {type: url, url}");
        return NULL;
    }
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "image_url");
    cJSON *iu = cJSON_AddObjectToObject(p, "image_url");
    cJSON_AddStringToObject(iu, "url", url.data ? url.data : "");
    mg_buf_free(&url);
    return p;
}

/* A tool_result block as a tool message. */
static int tool_message(const cJSON *block, cJSON *msgs, why_t *w)
{
    const char *id = str_of(block, "tool_use_id");
    if (!id) return refuse(w, "a tool_result block needs its tool_use_id");
    mg_buf_t text = {0};
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(block, "is_error")))
        mg_buf_append_str(&text, "Error: ");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(block, "content");
    int rc = content && !cJSON_IsNull(content)
                 ? plain_text(content, &text, w, "a tool_result's content")
                 : 0;
    if (rc == 0) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", id);
        cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
        cJSON_AddItemToArray(msgs, m);
    }
    mg_buf_free(&text);
    return rc;
}

/* A user turn: its tool results first (as the tool messages that must follow the assistant's
 * tool calls), then its text and images as one user message. */
static int user_turn(const cJSON *content, cJSON *msgs, why_t *w)
{
    cJSON *parts = cJSON_CreateArray();
    int rc = 0, only_text = 1;
    for (const cJSON *b = content->child; b && rc == 0; b = b->next) {
        const char *t = type_of(b);
        if (t && strcmp(t, "text") == 0 && str_of(b, "text")) {
            cJSON_AddItemToArray(parts, text_part(str_of(b, "text")));
        } else if (t && strcmp(t, "image") == 0) {
            cJSON *p = image_part(b, w);
            if (!p) rc = -1;
            else cJSON_AddItemToArray(parts, p);
            only_text = 0;
        } else if (t && strcmp(t, "tool_result") == 0) {
            rc = tool_message(b, msgs, w);
        } else {
            lossy(w,
                  "a '%s' block in a user message cannot be sent to a Chat Completions route "
                  "(text, image and tool_result can)",
                  t ? t : "untyped");
        }
    }
    int n = cJSON_GetArraySize(parts);
    if (rc == 0 && n > 0) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        if (only_text && n == 1) {
            cJSON_AddStringToObject(m, "content", str_of(parts->child, "text"));
            cJSON_Delete(parts);
        } else {
            cJSON_AddItemToObject(m, "content", parts);
        }
        parts = NULL;
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_Delete(parts);
    return rc;
}

/* A tool_use block as a tool call. */
static cJSON *tool_call(const cJSON *b, why_t *w)
{
    const char *id = str_of(b, "id"), *name = str_of(b, "name");
    if (!id || !name) {
        refuse(w, "a tool_use block needs its id and name");
        return NULL;
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
    mg_buf_t args = {0};
    if (input) mg_json_print(input, &args);
    else mg_buf_append_str(&args, "{}");
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "id", id);
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(tc, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", args.data ? args.data : "{}");
    mg_buf_free(&args);
    return tc;
}

/* An assistant turn: its text joined, its tool_use blocks as tool_calls; thinking left out
 * (see the header). */
static int assistant_turn(const cJSON *content, cJSON *msgs, why_t *w)
{
    mg_buf_t text = {0};
    cJSON *calls = cJSON_CreateArray();
    int rc = 0;
    for (const cJSON *b = content->child; b && rc == 0; b = b->next) {
        const char *t = type_of(b);
        if (t && strcmp(t, "text") == 0 && str_of(b, "text")) {
            mg_buf_append_str(&text, str_of(b, "text"));
        } else if (t && strcmp(t, "tool_use") == 0) {
            cJSON *tc = tool_call(b, w);
            if (!tc) rc = -1;
            else cJSON_AddItemToArray(calls, tc);
        } else if (!t || (strcmp(t, "thinking") != 0 && strcmp(t, "redacted_thinking") != 0)) {
            lossy(w,
                  "a '%s' block in an assistant message cannot be sent to a Chat Completions "
                  "route (text, tool_use and thinking can)",
                  t ? t : "untyped");
        }
    }
    if (rc == 0) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        if (text.len) cJSON_AddStringToObject(m, "content", text.data);
        else cJSON_AddNullToObject(m, "content");
        if (cJSON_GetArraySize(calls) > 0) {
            cJSON_AddItemToObject(m, "tool_calls", calls);
            calls = NULL;
        }
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_Delete(calls);
    mg_buf_free(&text);
    return rc;
}

static int messages(const cJSON *in, cJSON *msgs, why_t *w)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(in, "messages");
    if (!cJSON_IsArray(list) || !list->child)
        return refuse(w, "messages: must be a non-empty array");
    for (const cJSON *m = list->child; m; m = m->next) {
        const char *role = str_of(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        int user = role && strcmp(role, "user") == 0;
        if (!role || (!user && strcmp(role, "assistant") != 0))
            return refuse(w, "messages: each role must be 'user' or 'assistant'");
        if (cJSON_IsString(content)) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "role", role);
            cJSON_AddStringToObject(o, "content", content->valuestring);
            cJSON_AddItemToArray(msgs, o);
            continue;
        }
        if (!cJSON_IsArray(content))
            return refuse(w, "messages: each content must be a string or an array of blocks");
        int rc = user ? user_turn(content, msgs, w) : assistant_turn(content, msgs, w);
        if (rc != 0) return rc;
    }
    return 0;
}

static int system_prompt(const cJSON *in, cJSON *msgs, why_t *w)
{
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(in, "system");
    if (!sys || cJSON_IsNull(sys)) return 0;
    mg_buf_t text = {0};
    for (const cJSON *b = cJSON_IsArray(sys) ? sys->child : NULL; b; b = b->next)
        if (!type_of(b) || strcmp(type_of(b), "text") != 0 || !str_of(b, "text"))
            return refuse(w, "system: only text blocks are allowed");
    int rc = plain_text(sys, &text, w, "system");
    if (rc == 0) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
        cJSON_AddItemToArray(msgs, m);
    }
    mg_buf_free(&text);
    return rc;
}

static int tools(const cJSON *in, cJSON *out, why_t *w)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(in, "tools");
    if (!list || cJSON_IsNull(list)) return 0;
    if (!cJSON_IsArray(list)) return refuse(w, "tools: must be an array");
    cJSON *fns = cJSON_AddArrayToObject(out, "tools");
    for (const cJSON *t = list->child; t; t = t->next) {
        const char *type = type_of(t), *name = str_of(t, "name");
        if (type && strcmp(type, "custom") != 0) {
            lossy(w,
                  "tools: the server tool '%s' cannot be run by a Chat Completions route; only "
                  "client tools (name, description, input_schema) can",
                  type);
            continue;
        }
        if (!name) return refuse(w, "tools: each tool needs a name");
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(f, "function");
        cJSON_AddStringToObject(fn, "name", name);
        if (str_of(t, "description"))
            cJSON_AddStringToObject(fn, "description", str_of(t, "description"));
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
        if (schema) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, 1));
        cJSON_AddItemToArray(fns, f);
    }
    return 0;
}

static int tool_choice(const cJSON *in, cJSON *out, why_t *w)
{
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (!tc || cJSON_IsNull(tc)) return 0;
    const char *type = type_of(tc);
    if (!type) return refuse(w, "tool_choice: must be an object with a type");
    if (strcmp(type, "auto") == 0) cJSON_AddStringToObject(out, "tool_choice", "auto");
    else if (strcmp(type, "any") == 0) cJSON_AddStringToObject(out, "tool_choice", "required");
    else if (strcmp(type, "none") == 0) cJSON_AddStringToObject(out, "tool_choice", "none");
    else if (strcmp(type, "tool") == 0 && str_of(tc, "name")) {
        cJSON *o = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", str_of(tc, "name"));
    } else {
        return refuse(w, "tool_choice: type must be auto, any, none, or tool with a name");
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tc, "disable_parallel_tool_use")))
        cJSON_AddFalseToObject(out, "parallel_tool_calls");
    return 0;
}

/* Members carried over as they are: sampling, streaming, and the gateway's extensions
 * (which the parse step then reads and strips like on any chat request). */
static const char *const same_members[] = {
    "model",    "max_tokens", "stream",         "temperature", "top_p",
    "top_k",    "metadata",   "priority",       "session_id",  "idempotency_key",
    "timeouts", "routing",    "context_policy",
};

static int translate(const cJSON *in, int count_only, cJSON *out, why_t *w)
{
    const char *model = str_of(in, "model");
    if (!model || !model[0]) return refuse(w, "model: must be a non-empty string");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(in, "max_tokens");
    if (!count_only && (!cJSON_IsNumber(mt) || mt->valuedouble < 1))
        return refuse(w, "max_tokens: a positive integer is required");
    for (size_t i = 0; i < sizeof(same_members) / sizeof(same_members[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, same_members[i]);
        if (v) cJSON_AddItemToObject(out, same_members[i], cJSON_Duplicate(v, 1));
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(in, "stop_sequences");
    if (cJSON_IsArray(stop) && stop->child)
        cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(stop, 1));
    static const char *const server_side[] = {"mcp_servers", "container"};
    for (size_t i = 0; i < sizeof(server_side) / sizeof(server_side[0]); i++)
        if (cJSON_GetObjectItemCaseSensitive(in, server_side[i]))
            lossy(w, "'%s' cannot be served by a Chat Completions route", server_side[i]);
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    int rc = system_prompt(in, msgs, w);
    if (rc == 0) rc = messages(in, msgs, w);
    if (rc == 0) rc = tools(in, out, w);
    if (rc == 0) rc = tool_choice(in, out, w);
    return rc;
}

int mg_msgs_request(const char *in, size_t n, int count_only, mg_buf_t *out, char *err,
                    size_t errlen)
{
    why_t w = {err, errlen, 0};
    cJSON *body = cJSON_ParseWithLength(in, n);
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        return refuse(&w, "the request body is not a JSON object");
    }
    cJSON *chat = cJSON_CreateObject();
    int rc = chat ? translate(body, count_only, chat, &w) : -2;
    if (rc == 0 && mg_json_print(chat, out) != 0) rc = -2;
    if (rc == 0 && w.lossy) rc = 1;
    cJSON_Delete(chat);
    cJSON_Delete(body);
    return rc;
}
