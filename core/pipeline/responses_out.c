/* responses_out: chat chunks -> Responses events and the Response object; see
 * responses_out.h.
 *
 * The items are kept as text buffers with their ids, and become JSON only when an event or
 * the Response needs them. At most one reasoning item and one message are open at a time:
 * text after tool calls began opens a new message, reasoning after text a new reasoning
 * item, so the output keeps the engine's order. Tool calls stay open until the end: an
 * engine may interleave the argument deltas of several calls (each call is found again by
 * its chat index). */
#include "pipeline/responses_out.h"

#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { IT_REASONING, IT_MESSAGE, IT_CALL } item_kind_t;

typedef struct {
    item_kind_t kind;
    int open;
    int cut;        /* closed by the engine's token limit or filter: status "incomplete" */
    int chat_index; /* a tool call's index in the engine's tool_calls */
    char id[96];
    char *call_id; /* owned: a tool call's id */
    char *name;    /* owned: a tool call's function */
    mg_buf_t text; /* reasoning, content or arguments so far */
} item_t;

struct mg_resp_out_s {
    char id[80];
    const char *suffix; /* in id: what follows "resp_", for the item ids */
    int64_t created_at;
    char *model;     /* owned */
    cJSON *skeleton; /* owned */
    long long seq;   /* the next event's sequence_number */
    int started;     /* response.created went out */
    item_t *items;   /* owned, in output order */
    int n_items, cap_items;
    int reasoning_at, message_at; /* the open one's index in items, or -1 */
    char finish[32];              /* the engine's finish_reason */
    long long in_tok, out_tok, cached_tok, reasoning_tok;
    int have_usage;
    cJSON *final; /* owned: the Response at the end */
};

mg_resp_out_t *mg_resp_out_new(const char *id, int64_t created_at, const char *model,
                               cJSON *skeleton)
{
    mg_resp_out_t *o = calloc(1, sizeof(*o));
    if (!o || !(o->model = strdup(model ? model : ""))) {
        free(o);
        cJSON_Delete(skeleton);
        return NULL;
    }
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->suffix = strncmp(o->id, "resp_", 5) == 0 ? o->id + 5 : o->id;
    o->created_at = created_at;
    o->skeleton = skeleton;
    o->reasoning_at = o->message_at = -1;
    return o;
}

void mg_resp_out_free(mg_resp_out_t *o)
{
    if (!o) return;
    for (int i = 0; i < o->n_items; i++) {
        free(o->items[i].call_id);
        free(o->items[i].name);
        mg_buf_free(&o->items[i].text);
    }
    free(o->items);
    free(o->model);
    cJSON_Delete(o->skeleton);
    cJSON_Delete(o->final);
    free(o);
}

static const char *text_of(const item_t *it)
{
    return it->text.len ? it->text.data : "";
}

/* ------------------------------------------------------------------------ */
/* JSON of items and of the Response                                         */
/* ------------------------------------------------------------------------ */

static cJSON *text_part(const char *type, const char *text)
{
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", type);
    cJSON_AddStringToObject(p, "text", text);
    if (strcmp(type, "output_text") == 0) {
        cJSON_AddArrayToObject(p, "annotations");
        cJSON_AddArrayToObject(p, "logprobs");
    }
    return p;
}

/* The item as the Response lists it; `full`: with its content so far (an added event shows
 * the item before any). */
static cJSON *item_json(const item_t *it, int full)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", it->id);
    const char *status = it->open ? "in_progress" : it->cut ? "incomplete" : "completed";
    switch (it->kind) {
    case IT_REASONING: {
        cJSON_AddStringToObject(j, "type", "reasoning");
        cJSON *summary = cJSON_AddArrayToObject(j, "summary");
        if (full) cJSON_AddItemToArray(summary, text_part("summary_text", text_of(it)));
        break;
    }
    case IT_MESSAGE: {
        cJSON_AddStringToObject(j, "type", "message");
        cJSON_AddStringToObject(j, "status", status);
        cJSON_AddStringToObject(j, "role", "assistant");
        cJSON *content = cJSON_AddArrayToObject(j, "content");
        if (full) cJSON_AddItemToArray(content, text_part("output_text", text_of(it)));
        break;
    }
    case IT_CALL:
        cJSON_AddStringToObject(j, "type", "function_call");
        cJSON_AddStringToObject(j, "status", status);
        cJSON_AddStringToObject(j, "call_id", it->call_id);
        cJSON_AddStringToObject(j, "name", it->name ? it->name : "");
        cJSON_AddStringToObject(j, "arguments", full ? text_of(it) : "");
        break;
    }
    return j;
}

static cJSON *usage_json(const mg_resp_out_t *o)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", (double)o->in_tok);
    cJSON *in = cJSON_AddObjectToObject(u, "input_tokens_details");
    cJSON_AddNumberToObject(in, "cached_tokens", (double)o->cached_tok);
    cJSON_AddNumberToObject(in, "cache_write_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", (double)o->out_tok);
    cJSON *out = cJSON_AddObjectToObject(u, "output_tokens_details");
    cJSON_AddNumberToObject(out, "reasoning_tokens", (double)o->reasoning_tok);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(o->in_tok + o->out_tok));
    return u;
}

/* The Response in its current state. */
static cJSON *response_json(const mg_resp_out_t *o, const char *status, int with_usage)
{
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", o->id);
    cJSON_AddStringToObject(r, "object", "response");
    cJSON_AddNumberToObject(r, "created_at", (double)o->created_at);
    cJSON_AddStringToObject(r, "status", status);
    cJSON_AddNullToObject(r, "error");
    cJSON_AddNullToObject(r, "incomplete_details");
    cJSON_AddStringToObject(r, "model", o->model);
    cJSON *output = cJSON_AddArrayToObject(r, "output");
    for (int i = 0; i < o->n_items; i++) cJSON_AddItemToArray(output, item_json(&o->items[i], 1));
    if (with_usage) cJSON_AddItemToObject(r, "usage", usage_json(o)); /* an object or absent */
    for (const cJSON *m = o->skeleton ? o->skeleton->child : NULL; m; m = m->next)
        cJSON_AddItemToObject(r, m->string, cJSON_Duplicate(m, 1));
    return r;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

/* ev (taken) as one SSE event with its type and the next sequence number. */
static void emit(mg_resp_out_t *o, mg_buf_t *out, const char *type, cJSON *ev)
{
    long long seq = o->seq++;
    if (!out) {
        cJSON_Delete(ev);
        return;
    }
    cJSON_AddNumberToObject(ev, "sequence_number", (double)seq);
    mg_buf_append_str(out, "event: ");
    mg_buf_append_str(out, type);
    mg_buf_append_str(out, "\ndata: ");
    mg_json_print(ev, out);
    mg_buf_append(out, "\n\n", 2);
    cJSON_Delete(ev);
}

static cJSON *event(const char *type)
{
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddStringToObject(ev, "type", type);
    return ev;
}

/* An event about item i: its type, item_id and output_index. */
static cJSON *item_event(const mg_resp_out_t *o, const char *type, int i)
{
    cJSON *ev = event(type);
    cJSON_AddStringToObject(ev, "item_id", o->items[i].id);
    cJSON_AddNumberToObject(ev, "output_index", i);
    return ev;
}

static void emit_response(mg_resp_out_t *o, mg_buf_t *out, const char *type, cJSON *resp)
{
    cJSON *ev = event(type);
    cJSON_AddItemToObject(ev, "response", resp);
    emit(o, out, type, ev);
}

static void start(mg_resp_out_t *o, mg_buf_t *out)
{
    if (o->started) return;
    o->started = 1;
    emit_response(o, out, "response.created", response_json(o, "in_progress", 0));
    emit_response(o, out, "response.in_progress", response_json(o, "in_progress", 0));
}

/* A new open item of kind; its index, or -1 when out of memory. */
static int open_item(mg_resp_out_t *o, item_kind_t kind, mg_buf_t *out)
{
    if (o->n_items == o->cap_items) {
        int cap = o->cap_items ? o->cap_items * 2 : 4;
        item_t *n = realloc(o->items, (size_t)cap * sizeof(*n));
        if (!n) return -1;
        o->items = n;
        o->cap_items = cap;
    }
    int i = o->n_items++;
    item_t *it = &o->items[i];
    memset(it, 0, sizeof(*it));
    it->kind = kind;
    it->open = 1;
    static const char *const prefix[] = {"rs", "msg", "fc"};
    snprintf(it->id, sizeof(it->id), "%s_%s_%d", prefix[kind], o->suffix, i);
    return i;
}

static void announce(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    cJSON *ev = event("response.output_item.added");
    cJSON_AddNumberToObject(ev, "output_index", i);
    cJSON_AddItemToObject(ev, "item", item_json(&o->items[i], 0));
    emit(o, out, "response.output_item.added", ev);
}

static void emit_item_done(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    cJSON *ev = event("response.output_item.done");
    cJSON_AddNumberToObject(ev, "output_index", i);
    cJSON_AddItemToObject(ev, "item", item_json(&o->items[i], 1));
    emit(o, out, "response.output_item.done", ev);
}

static void close_item(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    item_t *it = &o->items[i];
    if (!it->open) return;
    cJSON *ev;
    switch (it->kind) {
    case IT_REASONING:
        ev = item_event(o, "response.reasoning_summary_text.done", i);
        cJSON_AddNumberToObject(ev, "summary_index", 0);
        cJSON_AddStringToObject(ev, "text", text_of(it));
        emit(o, out, "response.reasoning_summary_text.done", ev);
        ev = item_event(o, "response.reasoning_summary_part.done", i);
        cJSON_AddNumberToObject(ev, "summary_index", 0);
        cJSON_AddItemToObject(ev, "part", text_part("summary_text", text_of(it)));
        emit(o, out, "response.reasoning_summary_part.done", ev);
        o->reasoning_at = -1;
        break;
    case IT_MESSAGE:
        ev = item_event(o, "response.output_text.done", i);
        cJSON_AddNumberToObject(ev, "content_index", 0);
        cJSON_AddStringToObject(ev, "text", text_of(it));
        cJSON_AddArrayToObject(ev, "logprobs");
        emit(o, out, "response.output_text.done", ev);
        ev = item_event(o, "response.content_part.done", i);
        cJSON_AddNumberToObject(ev, "content_index", 0);
        cJSON_AddItemToObject(ev, "part", text_part("output_text", text_of(it)));
        emit(o, out, "response.content_part.done", ev);
        o->message_at = -1;
        break;
    case IT_CALL:
        if (!it->text.len) {
            /* a call without arguments: "{}", streamed like any (the deltas add up to .done) */
            mg_buf_append_str(&it->text, "{}");
            ev = item_event(o, "response.function_call_arguments.delta", i);
            cJSON_AddStringToObject(ev, "delta", "{}");
            emit(o, out, "response.function_call_arguments.delta", ev);
        }
        ev = item_event(o, "response.function_call_arguments.done", i);
        cJSON_AddStringToObject(ev, "name", it->name ? it->name : "");
        cJSON_AddStringToObject(ev, "arguments", text_of(it));
        emit(o, out, "response.function_call_arguments.done", ev);
        break;
    }
    it->open = 0;
    emit_item_done(o, i, out);
}

/* ------------------------------------------------------------------------ */
/* Chunks                                                                    */
/* ------------------------------------------------------------------------ */

static void reasoning_delta(mg_resp_out_t *o, const char *text, mg_buf_t *out)
{
    if (o->reasoning_at < 0) {
        if (o->message_at >= 0) close_item(o, o->message_at, out);
        int i = open_item(o, IT_REASONING, out);
        if (i < 0) return;
        o->reasoning_at = i;
        announce(o, i, out);
        cJSON *ev = item_event(o, "response.reasoning_summary_part.added", i);
        cJSON_AddNumberToObject(ev, "summary_index", 0);
        cJSON_AddItemToObject(ev, "part", text_part("summary_text", ""));
        emit(o, out, "response.reasoning_summary_part.added", ev);
    }
    int i = o->reasoning_at;
    mg_buf_append_str(&o->items[i].text, text);
    cJSON *ev = item_event(o, "response.reasoning_summary_text.delta", i);
    cJSON_AddNumberToObject(ev, "summary_index", 0);
    cJSON_AddStringToObject(ev, "delta", text);
    emit(o, out, "response.reasoning_summary_text.delta", ev);
}

static void content_delta(mg_resp_out_t *o, const char *text, mg_buf_t *out)
{
    if (o->message_at < 0) {
        if (o->reasoning_at >= 0) close_item(o, o->reasoning_at, out);
        int i = open_item(o, IT_MESSAGE, out);
        if (i < 0) return;
        o->message_at = i;
        announce(o, i, out);
        cJSON *ev = item_event(o, "response.content_part.added", i);
        cJSON_AddNumberToObject(ev, "content_index", 0);
        cJSON_AddItemToObject(ev, "part", text_part("output_text", ""));
        emit(o, out, "response.content_part.added", ev);
    }
    int i = o->message_at;
    mg_buf_append_str(&o->items[i].text, text);
    cJSON *ev = item_event(o, "response.output_text.delta", i);
    cJSON_AddNumberToObject(ev, "content_index", 0);
    cJSON_AddStringToObject(ev, "delta", text);
    cJSON_AddArrayToObject(ev, "logprobs");
    emit(o, out, "response.output_text.delta", ev);
}

static int find_call(const mg_resp_out_t *o, int chat_index)
{
    for (int i = 0; i < o->n_items; i++)
        if (o->items[i].kind == IT_CALL && o->items[i].open && o->items[i].chat_index == chat_index)
            return i;
    return -1;
}

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int new_call(mg_resp_out_t *o, int chat_index, const char *call_id, mg_buf_t *out)
{
    if (o->reasoning_at >= 0) close_item(o, o->reasoning_at, out);
    if (o->message_at >= 0) close_item(o, o->message_at, out);
    int i = open_item(o, IT_CALL, out);
    if (i < 0) return -1;
    item_t *it = &o->items[i];
    it->chat_index = chat_index;
    char made[128];
    if (!call_id || !*call_id) {
        snprintf(made, sizeof(made), "call_%s_%d", o->suffix, i);
        call_id = made;
    }
    it->call_id = strdup(call_id);
    return i;
}

/* One entry of a chunk's tool_calls: a new call (announced once its name is known: an
 * engine may send the name in a later chunk than the id), or more of an open call's
 * arguments. */
static void tool_call_delta(mg_resp_out_t *o, const cJSON *tc, int position, mg_buf_t *out)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(tc, "index");
    int chat_index = mg_json_int(idx, position);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    const char *name = str_of(fn, "name");
    int i = find_call(o, chat_index);
    if (i < 0) {
        i = new_call(o, chat_index, str_of(tc, "id"), out);
        if (i < 0) return;
        if (name) o->items[i].name = strdup(name);
        announce(o, i, out);
    } else if (name && !o->items[i].name) {
        o->items[i].name = strdup(name);
    }
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    mg_buf_t printed = {0};
    const char *delta = NULL;
    if (cJSON_IsString(args)) delta = args->valuestring;
    else if (cJSON_IsObject(args) && mg_json_print(args, &printed) == 0) delta = printed.data;
    if (delta && *delta) {
        mg_buf_append_str(&o->items[i].text, delta);
        cJSON *ev = item_event(o, "response.function_call_arguments.delta", i);
        cJSON_AddStringToObject(ev, "delta", delta);
        emit(o, out, "response.function_call_arguments.delta", ev);
    }
    mg_buf_free(&printed);
}

static long long count_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return mg_json_ll(v, 0);
}

static void take_usage(mg_resp_out_t *o, const cJSON *u)
{
    if (!cJSON_IsObject(u)) return;
    o->have_usage = 1;
    o->in_tok = count_of(u, "prompt_tokens");
    o->out_tok = count_of(u, "completion_tokens");
    o->cached_tok =
        count_of(cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens_details"), "cached_tokens");
    o->reasoning_tok = count_of(cJSON_GetObjectItemCaseSensitive(u, "completion_tokens_details"),
                                "reasoning_tokens");
}

/* The first choice's delta (or message) of a chunk (or completion). */
static void take_choice(mg_resp_out_t *o, const cJSON *choice, const char *key, mg_buf_t *out)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(choice, key);
    const char *reasoning = str_of(d, "reasoning_content");
    if (!reasoning) reasoning = str_of(d, "reasoning");
    if (reasoning && *reasoning) reasoning_delta(o, reasoning, out);
    const char *content = str_of(d, "content");
    if (content && *content) content_delta(o, content, out);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
    int pos = 0;
    for (const cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next)
        tool_call_delta(o, tc, pos++, out);
    const char *finish = str_of(choice, "finish_reason");
    if (finish) snprintf(o->finish, sizeof(o->finish), "%s", finish);
}

static void take(mg_resp_out_t *o, const cJSON *chunk, const char *key, mg_buf_t *out)
{
    start(o, out);
    take_usage(o, cJSON_GetObjectItemCaseSensitive(chunk, "usage"));
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    for (const cJSON *ch = cJSON_IsArray(choices) ? choices->child : NULL; ch; ch = ch->next) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(ch, "index");
        if (cJSON_IsNumber(idx) && idx->valuedouble != 0) continue; /* a Response has one */
        take_choice(o, ch, key, out);
    }
}

void mg_resp_out_chunk(mg_resp_out_t *o, const cJSON *chunk, mg_buf_t *out)
{
    take(o, chunk, "delta", out);
}

void mg_resp_out_completion(mg_resp_out_t *o, const cJSON *completion)
{
    take(o, completion, "message", NULL);
}

/* ------------------------------------------------------------------------ */
/* The end                                                                   */
/* ------------------------------------------------------------------------ */

const cJSON *mg_resp_out_end(mg_resp_out_t *o, mg_buf_t *out)
{
    if (o->final) return o->final;
    start(o, out);
    const char *incomplete = strcmp(o->finish, "length") == 0           ? "max_output_tokens"
                             : strcmp(o->finish, "content_filter") == 0 ? "content_filter"
                                                                        : NULL;
    for (int i = 0; i < o->n_items; i++) {
        o->items[i].cut = incomplete && o->items[i].open; /* what the stop cut short */
        close_item(o, i, out);
    }
    cJSON *r = response_json(o, incomplete ? "incomplete" : "completed", 1);
    if (incomplete) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", incomplete);
        cJSON_ReplaceItemInObjectCaseSensitive(r, "incomplete_details", d);
    } else {
        cJSON_AddNumberToObject(r, "completed_at", (double)time(NULL));
    }
    o->final = r;
    emit_response(o, out, incomplete ? "response.incomplete" : "response.completed",
                  cJSON_Duplicate(r, 1));
    return o->final;
}

void mg_resp_out_fail(mg_resp_out_t *o, const char *code, const char *message, mg_buf_t *out)
{
    start(o, out);
    cJSON *r = response_json(o, "failed", o->have_usage);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", message);
    cJSON_ReplaceItemInObjectCaseSensitive(r, "error", e);
    emit_response(o, out, "response.failed", r);
}

void mg_resp_out_usage(const mg_resp_out_t *o, long long *input, long long *output)
{
    *input = o->have_usage ? o->in_tok : 0;
    *output = o->have_usage ? o->out_tok : 0;
}

void mg_resp_out_set_usage(mg_resp_out_t *o, long long input, long long output)
{
    if (o->have_usage) return;
    o->have_usage = 1;
    o->in_tok = input;
    o->out_tok = output;
}

cJSON *mg_resp_out_message(const mg_resp_out_t *o)
{
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "role", "assistant");
    mg_buf_t text = {0};
    cJSON *calls = NULL;
    for (int i = 0; i < o->n_items; i++) {
        const item_t *it = &o->items[i];
        if (it->kind == IT_MESSAGE) {
            mg_buf_append(&text, text_of(it), it->text.len);
        } else if (it->kind == IT_CALL) {
            if (!calls) calls = cJSON_CreateArray();
            cJSON *tc = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", it->call_id);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(tc, "function");
            cJSON_AddStringToObject(fn, "name", it->name ? it->name : "");
            cJSON_AddStringToObject(fn, "arguments", it->text.len ? text_of(it) : "{}");
            cJSON_AddItemToArray(calls, tc);
        }
    }
    if (text.len) cJSON_AddStringToObject(m, "content", text.data);
    else cJSON_AddNullToObject(m, "content");
    mg_buf_free(&text);
    if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
    return m;
}
