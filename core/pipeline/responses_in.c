/* responses_in: a Responses request as a Chat Completions body; see responses_in.h.
 *
 * Items become chat messages in order: a message item is a message (developer -> system,
 * which every chat engine knows); consecutive function_call items are one assistant message
 * with their tool_calls (joined to an assistant text message right before them, as chat
 * engines write one turn); a function_call_output is a tool message. */
#include "pipeline/responses_in.h"

#include "base/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int refuse(mg_resp_error_t *err, const char *param, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    snprintf(err->param, sizeof(err->param), "%s", param);
    return -1;
}

static int is_absent(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

static const cJSON *get(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = get(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ------------------------------------------------------------------------ */
/* Input items                                                               */
/* ------------------------------------------------------------------------ */

/* One content part of a message item as a chat part; -1 when it cannot be carried. */
static int part_to_chat(const cJSON *p, const char *where, cJSON *parts, mg_resp_error_t *err)
{
    const char *type = str_of(p, "type");
    if (!cJSON_IsObject(p) || !type) return refuse(err, where, "each content part needs a 'type'");
    if (strcmp(type, "input_text") == 0 || strcmp(type, "output_text") == 0 ||
        strcmp(type, "text") == 0) {
        const char *text = str_of(p, "text");
        if (!text) return refuse(err, where, "a %s part needs a 'text' string", type);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "text");
        cJSON_AddStringToObject(o, "text", text);
        cJSON_AddItemToArray(parts, o);
        return 0;
    }
    if (strcmp(type, "refusal") == 0) {
        const char *text = str_of(p, "refusal");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "text");
        cJSON_AddStringToObject(o, "text", text ? text : "");
        cJSON_AddItemToArray(parts, o);
        return 0;
    }
    if (strcmp(type, "input_image") == 0) {
        const char *url = str_of(p, "image_url");
        if (!url)
            return refuse(err, where,
                          "an input_image needs an 'image_url' (a URL or a data: URL); file_id "
                          "inputs cannot be bridged to a chat engine");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "image_url");
        cJSON *iu = cJSON_AddObjectToObject(o, "image_url");
        cJSON_AddStringToObject(iu, "url", url);
        const char *detail = str_of(p, "detail");
        if (detail) cJSON_AddStringToObject(iu, "detail", detail);
        cJSON_AddItemToArray(parts, o);
        return 0;
    }
    return refuse(err, where, "content parts of type '%s' cannot be bridged to a chat engine",
                  type);
}

/* The parts' texts joined (an assistant turn or a tool output as a chat engine takes it),
 * or NULL when one of them is not text. */
static cJSON *parts_as_text(const cJSON *parts)
{
    size_t n = 0;
    for (const cJSON *p = parts->child; p; p = p->next) {
        if (strcmp(str_of(p, "type"), "text") != 0) return NULL;
        n += strlen(str_of(p, "text"));
    }
    char *s = cJSON_malloc(n + 1);
    if (!s) return NULL;
    size_t at = 0;
    for (const cJSON *p = parts->child; p; p = p->next) {
        const char *t = str_of(p, "text");
        size_t l = strlen(t);
        memcpy(s + at, t, l);
        at += l;
    }
    s[at] = '\0';
    cJSON *out = cJSON_CreateString(s);
    cJSON_free(s);
    return out;
}

/* A message item's content (a string, or parts) as chat content. */
static cJSON *content_to_chat(const cJSON *content, const char *role, const char *where,
                              mg_resp_error_t *err)
{
    if (cJSON_IsString(content)) return cJSON_CreateString(content->valuestring);
    if (!cJSON_IsArray(content)) {
        refuse(err, where, "a message's 'content' must be a string or an array of parts");
        return NULL;
    }
    cJSON *parts = cJSON_CreateArray();
    int i = 0;
    for (const cJSON *p = content->child; p; p = p->next, i++) {
        char at[64];
        snprintf(at, sizeof(at), "%s[%d]", where, i);
        if (part_to_chat(p, at, parts, err) != 0) {
            cJSON_Delete(parts);
            return NULL;
        }
    }
    /* system and assistant turns as one string: what every chat template takes */
    if (strcmp(role, "user") != 0) {
        cJSON *text = parts_as_text(parts);
        if (text) {
            cJSON_Delete(parts);
            return text;
        }
    }
    return parts;
}

static cJSON *message_item(const cJSON *item, const char *where, mg_resp_error_t *err)
{
    const char *role = str_of(item, "role");
    if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 &&
                  strcmp(role, "system") != 0 && strcmp(role, "developer") != 0)) {
        refuse(err, where, "a message's 'role' must be user, assistant, system or developer");
        return NULL;
    }
    if (strcmp(role, "developer") == 0) role = "system";
    char at[64];
    snprintf(at, sizeof(at), "%s.content", where);
    cJSON *content = content_to_chat(get(item, "content"), role, at, err);
    if (!content) return NULL;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddItemToObject(m, "content", content);
    return m;
}

/* The assistant message a function_call joins: the last message when it is the assistant's
 * (a text turn, or earlier calls of the same turn), else a new one. */
static cJSON *assistant_for_call(cJSON *msgs)
{
    cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
    const char *role = last ? str_of(last, "role") : NULL;
    if (role && strcmp(role, "assistant") == 0) return last;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddNullToObject(m, "content");
    cJSON_AddItemToArray(msgs, m);
    return m;
}

static int function_call_item(const cJSON *item, const char *where, cJSON *msgs,
                              mg_resp_error_t *err)
{
    const char *call_id = str_of(item, "call_id"), *name = str_of(item, "name");
    const char *args = str_of(item, "arguments");
    if (!call_id || !name || !args)
        return refuse(err, where,
                      "a function_call needs 'call_id', 'name' and 'arguments' strings");
    cJSON *m = assistant_for_call(msgs);
    cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!calls) calls = cJSON_AddArrayToObject(m, "tool_calls");
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "id", call_id);
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON *fn = cJSON_AddObjectToObject(tc, "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", args);
    cJSON_AddItemToArray(calls, tc);
    return 0;
}

static int function_output_item(const cJSON *item, const char *where, cJSON *msgs,
                                mg_resp_error_t *err)
{
    const char *call_id = str_of(item, "call_id");
    const cJSON *out = get(item, "output");
    if (!call_id || !out)
        return refuse(err, where, "a function_call_output needs 'call_id' and 'output'");
    char at[64];
    snprintf(at, sizeof(at), "%s.output", where);
    cJSON *content = content_to_chat(out, "tool", at, err);
    if (!content) return -1;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "tool");
    cJSON_AddStringToObject(m, "tool_call_id", call_id);
    cJSON_AddItemToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
    return 0;
}

static int input_to_messages(const cJSON *input, cJSON *msgs, mg_resp_error_t *err)
{
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return 0;
    }
    if (!cJSON_IsArray(input))
        return refuse(err, "input", "'input' must be a string or an array of items");
    int i = 0;
    for (const cJSON *item = input->child; item; item = item->next, i++) {
        char where[48];
        snprintf(where, sizeof(where), "input[%d]", i);
        if (!cJSON_IsObject(item)) return refuse(err, where, "each input item must be an object");
        const char *type = str_of(item, "type");
        int rc = 0;
        if (!type || strcmp(type, "message") == 0) {
            cJSON *m = message_item(item, where, err);
            if (!m) return -1;
            cJSON_AddItemToArray(msgs, m);
        } else if (strcmp(type, "function_call") == 0) {
            rc = function_call_item(item, where, msgs, err);
        } else if (strcmp(type, "function_call_output") == 0) {
            rc = function_output_item(item, where, msgs, err);
        } else if (strcmp(type, "reasoning") == 0) {
            continue; /* the model's own reasoning: chat engines take none back */
        } else {
            return refuse(err, where, "input items of type '%s' cannot be bridged to a chat engine",
                          type);
        }
        if (rc != 0) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Tools, tool choice, text format                                           */
/* ------------------------------------------------------------------------ */

static cJSON *dup(const cJSON *v)
{
    return cJSON_Duplicate(v, 1);
}

static int tools_to_chat(const cJSON *tools, cJSON *chat, mg_resp_error_t *err)
{
    if (is_absent(tools)) return 0;
    if (!cJSON_IsArray(tools)) return refuse(err, "tools", "'tools' must be an array");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        char where[48];
        snprintf(where, sizeof(where), "tools[%d]", i);
        const char *type = str_of(t, "type"), *name = str_of(t, "name");
        if (!type || strcmp(type, "function") != 0)
            return refuse(err, where,
                          "only function tools can be bridged to a chat engine (got '%s')",
                          type ? type : "no type");
        if (!name) return refuse(err, where, "a function tool needs a 'name'");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(fn, "name", name);
        static const char *const keep[] = {"description", "parameters", "strict"};
        for (int k = 0; k < 3; k++) {
            const cJSON *v = get(t, keep[k]);
            if (!is_absent(v)) cJSON_AddItemToObject(fn, keep[k], dup(v));
        }
        cJSON_AddItemToArray(out, o);
    }
    return 0;
}

static int tool_choice_to_chat(const cJSON *tc, cJSON *chat, mg_resp_error_t *err)
{
    if (is_absent(tc)) return 0;
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (strcmp(s, "auto") != 0 && strcmp(s, "none") != 0 && strcmp(s, "required") != 0)
            return refuse(err, "tool_choice", "'tool_choice' must be auto, none or required");
        cJSON_AddStringToObject(chat, "tool_choice", s);
        return 0;
    }
    const char *type = str_of(tc, "type"), *name = str_of(tc, "name");
    if (!type || strcmp(type, "function") != 0 || !name)
        return refuse(err, "tool_choice",
                      "only a function tool_choice ({\"type\":\"function\",\"name\":...}) can be "
                      "bridged to a chat engine");
    cJSON *o = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(o, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "function"), "name", name);
    return 0;
}

static int text_to_chat(const cJSON *text, cJSON *chat, mg_resp_error_t *err)
{
    if (is_absent(text)) return 0;
    if (!cJSON_IsObject(text)) return refuse(err, "text", "'text' must be an object");
    const cJSON *verbosity = get(text, "verbosity");
    if (!is_absent(verbosity)) cJSON_AddItemToObject(chat, "verbosity", dup(verbosity));
    const cJSON *f = get(text, "format");
    if (is_absent(f)) return 0;
    const char *type = str_of(f, "type");
    if (!type) return refuse(err, "text.format", "'text.format' needs a 'type'");
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) {
        cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "response_format"), "type",
                                "json_object");
        return 0;
    }
    if (strcmp(type, "json_schema") != 0)
        return refuse(err, "text.format.type",
                      "'text.format.type' must be text, json_object or json_schema");
    const cJSON *schema = get(f, "schema");
    if (!str_of(f, "name") || !cJSON_IsObject(schema))
        return refuse(err, "text.format",
                      "a json_schema format needs a 'name' and a 'schema' object");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    static const char *const keep[] = {"name", "description", "schema", "strict"};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = get(f, keep[k]);
        if (!is_absent(v)) cJSON_AddItemToObject(js, keep[k], dup(v));
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Top-level parameters                                                      */
/* ------------------------------------------------------------------------ */

/* Copied to the chat body as they are: the same parameter in both APIs, or the gateway's
 * extensions (the parse step takes those out as for every request). */
static const char *const same_keys[] = {
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "stream",
    "metadata",
    "priority",
    "session_id",
    "idempotency_key",
    "timeouts",
    "routing",
    "context_policy",
};

/* Read here, and not sent on (the gateway's own or the echo's). */
static const char *const own_keys[] = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "max_output_tokens",
    "reasoning",
    "store",
    "previous_response_id",
    "stream_options",
    "max_tool_calls",
};

static int in_list(const char *k, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return 1;
    return 0;
}
#define IN(k, list) in_list(k, list, sizeof(list) / sizeof(list[0]))

/* A parameter the bridge cannot honour, unless it has its do-nothing value. */
static int refused_param(const cJSON *v, mg_resp_error_t *err)
{
    const char *k = v->string;
    if (is_absent(v)) return 0;
    if (strcmp(k, "background") == 0 && cJSON_IsFalse(v)) return 0;
    if (strcmp(k, "truncation") == 0 && cJSON_IsString(v) &&
        strcmp(v->valuestring, "disabled") == 0)
        return 0;
    if (strcmp(k, "include") == 0 && cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) return 0;
    if (strcmp(k, "top_logprobs") == 0 && cJSON_IsNumber(v) && v->valuedouble == 0) return 0;
    static const char *const known[] = {"background",   "truncation",   "include",
                                        "top_logprobs", "conversation", "prompt"};
    if (IN(k, known))
        return refuse(err, k, "'%s' cannot be honoured when the route is a chat engine", k);
    return refuse(err, k, "unknown parameter: '%s'", k);
}

static int check_types(const cJSON *req, mg_resp_error_t *err)
{
    const cJSON *model = get(req, "model");
    if (!cJSON_IsString(model) || !model->valuestring[0])
        return refuse(err, "model", "'model' must be a non-empty string");
    if (is_absent(get(req, "input"))) return refuse(err, "input", "'input' is required");
    const cJSON *ins = get(req, "instructions");
    if (!is_absent(ins) && !cJSON_IsString(ins))
        return refuse(err, "instructions", "'instructions' must be a string");
    const cJSON *mot = get(req, "max_output_tokens");
    if (!is_absent(mot) && (!cJSON_IsNumber(mot) || mot->valuedouble < 1))
        return refuse(err, "max_output_tokens", "'max_output_tokens' must be a positive integer");
    const cJSON *store = get(req, "store"), *stream = get(req, "stream");
    if (!is_absent(store) && !cJSON_IsBool(store))
        return refuse(err, "store", "'store' must be a boolean");
    if (!is_absent(stream) && !cJSON_IsBool(stream))
        return refuse(err, "stream", "'stream' must be a boolean");
    const cJSON *prev = get(req, "previous_response_id");
    if (!is_absent(prev) && !cJSON_IsString(prev))
        return refuse(err, "previous_response_id", "'previous_response_id' must be a string");
    const cJSON *r = get(req, "reasoning");
    if (!is_absent(r) && !cJSON_IsObject(r))
        return refuse(err, "reasoning", "'reasoning' must be an object");
    const cJSON *meta = get(req, "metadata");
    if (!is_absent(meta) && !cJSON_IsObject(meta))
        return refuse(err, "metadata", "'metadata' must be an object");
    return 0;
}

static int params_to_chat(const cJSON *req, cJSON *chat, mg_resp_error_t *err)
{
    for (const cJSON *v = req->child; v; v = v->next) {
        if (!v->string) continue;
        if (IN(v->string, same_keys)) {
            if (!is_absent(v)) cJSON_AddItemToObject(chat, v->string, dup(v));
        } else if (!IN(v->string, own_keys) && refused_param(v, err) != 0) {
            return -1;
        }
    }
    const cJSON *mot = get(req, "max_output_tokens");
    if (cJSON_IsNumber(mot)) cJSON_AddNumberToObject(chat, "max_tokens", mot->valuedouble);
    const char *effort = str_of(get(req, "reasoning"), "effort");
    if (effort) cJSON_AddStringToObject(chat, "reasoning_effort", effort);
    return 0;
}

int mg_resp_to_chat(const cJSON *req, cJSON **chat, mg_resp_error_t *err)
{
    *chat = NULL;
    err->message[0] = err->param[0] = '\0';
    if (!cJSON_IsObject(req)) return refuse(err, "", "the request body must be a JSON object");
    if (check_types(req, err) != 0) return -1;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "model", str_of(req, "model"));
    cJSON *msgs = cJSON_AddArrayToObject(c, "messages");
    const char *ins = str_of(req, "instructions");
    if (ins) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins);
        cJSON_AddItemToArray(msgs, m);
    }
    /* tool_choice "none" as every chat engine honours it: it is shown no tools */
    const char *choice = str_of(req, "tool_choice");
    int no_tools = choice && strcmp(choice, "none") == 0;
    if (input_to_messages(get(req, "input"), msgs, err) != 0 ||
        tools_to_chat(get(req, "tools"), c, err) != 0 ||
        tool_choice_to_chat(get(req, "tool_choice"), c, err) != 0 ||
        text_to_chat(get(req, "text"), c, err) != 0 || params_to_chat(req, c, err) != 0) {
        cJSON_Delete(c);
        return -1;
    }
    if (no_tools) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, "tools");
        cJSON_DeleteItemFromObjectCaseSensitive(c, "tool_choice");
    }
    *chat = c;
    return 0;
}

int mg_resp_prepend_history(cJSON *chat, const cJSON *history)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    if (!cJSON_IsArray(msgs) || !cJSON_IsArray(history)) return 0;
    /* after the instructions' system message (the first one, when there is one): the
       messages are moved into a new array in their new order */
    cJSON *order = cJSON_CreateArray();
    if (!order) return -1;
    const cJSON *first = msgs->child;
    if (first && strcmp(str_of(first, "role"), "system") == 0)
        cJSON_AddItemToArray(order, cJSON_DetachItemFromArray(msgs, 0));
    for (const cJSON *m = history->child; m; m = m->next) {
        cJSON *copy = dup(m);
        if (!copy || !cJSON_AddItemToArray(order, copy)) {
            cJSON_Delete(copy);
            cJSON_Delete(order);
            return -1;
        }
    }
    while (msgs->child) cJSON_AddItemToArray(order, cJSON_DetachItemFromArray(msgs, 0));
    cJSON_ReplaceItemInObjectCaseSensitive(chat, "messages", order);
    return 0;
}

cJSON *mg_resp_turn_messages(const cJSON *chat, int had_instructions)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    cJSON *out = cJSON_CreateArray();
    if (!out) return NULL;
    int i = 0;
    for (const cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        if (i == 0 && had_instructions) continue;
        cJSON_AddItemToArray(out, dup(m));
    }
    return out;
}

/* ------------------------------------------------------------------------ */
/* The input as items                                                        */
/* ------------------------------------------------------------------------ */

/* The members the API shows on a part that a client may leave out. */
static void complete_part(cJSON *p)
{
    const char *type = str_of(p, "type");
    if (!type) return;
    if (strcmp(type, "output_text") == 0) {
        if (!get(p, "annotations")) cJSON_AddArrayToObject(p, "annotations");
        if (!get(p, "logprobs")) cJSON_AddArrayToObject(p, "logprobs");
    } else if (strcmp(type, "input_image") == 0 && !get(p, "detail")) {
        cJSON_AddStringToObject(p, "detail", "auto");
    }
}

/* A message's content as parts: a string is one text part of the role's kind. */
static cJSON *content_parts(const cJSON *content, const char *role)
{
    cJSON *parts;
    if (cJSON_IsString(content)) {
        parts = cJSON_CreateArray();
        cJSON *p = cJSON_CreateObject();
        cJSON_AddStringToObject(p, "type",
                                strcmp(role, "assistant") == 0 ? "output_text" : "input_text");
        cJSON_AddStringToObject(p, "text", content->valuestring);
        cJSON_AddItemToArray(parts, p);
    } else {
        parts = content ? dup(content) : cJSON_CreateArray();
    }
    for (cJSON *p = parts ? parts->child : NULL; p; p = p->next) complete_part(p);
    return parts;
}

static cJSON *message_as_item(const char *role, const cJSON *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddItemToObject(m, "content", content_parts(content, role));
    cJSON_AddStringToObject(m, "status", "completed");
    return m;
}

cJSON *mg_resp_input_items(const cJSON *req, const char *suffix)
{
    const cJSON *input = get(req, "input");
    cJSON *items = cJSON_CreateArray();
    if (!items) return NULL;
    if (cJSON_IsString(input)) cJSON_AddItemToArray(items, message_as_item("user", input));
    for (const cJSON *it = cJSON_IsArray(input) ? input->child : NULL; it; it = it->next) {
        const char *type = str_of(it, "type");
        cJSON *copy;
        if (!type || strcmp(type, "message") == 0) {
            const char *role = str_of(it, "role");
            copy = message_as_item(role ? role : "user", get(it, "content"));
            const cJSON *id = get(it, "id");
            if (cJSON_IsString(id)) cJSON_AddStringToObject(copy, "id", id->valuestring);
        } else {
            copy = dup(it);
        }
        cJSON_AddItemToArray(items, copy);
    }
    int n = 0;
    for (cJSON *it = items->child; it; it = it->next, n++) {
        if (cJSON_IsString(get(it, "id"))) continue;
        const char *type = str_of(it, "type");
        const char *kind = !type || strcmp(type, "message") == 0       ? "msg"
                           : strcmp(type, "function_call") == 0        ? "fc"
                           : strcmp(type, "function_call_output") == 0 ? "fco"
                                                                       : "item";
        char id[128];
        snprintf(id, sizeof(id), "%s_%s_in%d", kind, suffix, n);
        cJSON_AddStringToObject(it, "id", id);
    }
    return items;
}

int mg_resp_input_items_print(const cJSON *req, const char *suffix, mg_buf_t *out)
{
    const cJSON *input = get(req, "input");
    if (cJSON_IsString(input)) { /* the common case, written as text: no tree */
        size_t mark = out->len;
        int bad = mg_buf_append_str(out, "[{\"type\":\"message\",\"role\":\"user\",\"content\":"
                                         "[{\"type\":\"input_text\",\"text\":") != 0 ||
                  mg_json_print_string(input->valuestring, strlen(input->valuestring), out) != 0 ||
                  mg_buf_append_str(out, "}],\"status\":\"completed\",\"id\":\"msg_") != 0 ||
                  mg_buf_append_str(out, suffix) != 0 || mg_buf_append_str(out, "_in0\"}]") != 0;
        if (bad) out->len = mark;
        return bad ? -1 : 0;
    }
    cJSON *items = mg_resp_input_items(req, suffix);
    int rc = items ? mg_json_print(items, out) : -1;
    cJSON_Delete(items);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The echo                                                                  */
/* ------------------------------------------------------------------------ */

/* "key": the request's value, or the default's text (when absent or null); after a comma
 * unless it is its object's first member. */
static void echo(mg_buf_t *out, const cJSON *req, const char *key, const char *fallback, int first)
{
    const cJSON *v = get(req, key);
    mg_buf_append_str(out, first ? "\"" : ",\"");
    mg_buf_append_str(out, key);
    mg_buf_append_str(out, "\":");
    if (is_absent(v)) mg_buf_append_str(out, fallback);
    else mg_json_print(v, out);
}

int mg_resp_skeleton_print(const cJSON *req, mg_buf_t *out)
{
    size_t mark = out->len;
    mg_buf_append(out, "{", 1);
    echo(out, req, "instructions", "null", 1);
    echo(out, req, "max_output_tokens", "null", 0);
    echo(out, req, "parallel_tool_calls", "true", 0);
    echo(out, req, "previous_response_id", "null", 0);
    const cJSON *r = get(req, "reasoning");
    mg_buf_append_str(out, ",\"reasoning\":{");
    echo(out, r, "effort", "null", 1);
    echo(out, r, "summary", "null", 0);
    mg_buf_append(out, "}", 1);
    echo(out, req, "store", "true", 0);
    echo(out, req, "temperature", "1", 0);
    const cJSON *t = get(req, "text");
    mg_buf_append_str(out, ",\"text\":{");
    echo(out, t, "format", "{\"type\":\"text\"}", 1);
    echo(out, t, "verbosity", "\"medium\"", 0);
    mg_buf_append(out, "}", 1);
    echo(out, req, "tool_choice", "\"auto\"", 0);
    echo(out, req, "tools", "[]", 0);
    echo(out, req, "top_p", "1", 0);
    mg_buf_append_str(out, ",\"truncation\":\"disabled\"");
    const cJSON *user = get(req, "user"); /* a string when there is one, else absent */
    if (cJSON_IsString(user)) echo(out, req, "user", "null", 0);
    echo(out, req, "metadata", "{}", 0);
    if (mg_buf_append_str(out, ",\"background\":false}") != 0) {
        out->len = mark;
        return -1;
    }
    return 0;
}

cJSON *mg_resp_skeleton(const cJSON *req)
{
    mg_buf_t text = {0};
    cJSON *o = mg_resp_skeleton_print(req, &text) == 0 ? cJSON_Parse(text.data) : NULL;
    mg_buf_free(&text);
    return o;
}
