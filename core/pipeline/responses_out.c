/* responses_out: chat chunks -> Responses events and the Response object; see
 * responses_out.h.
 *
 * The items are kept as text buffers with their ids, and every event and the Response are
 * written as text: no tree is built per event (bench/README.md, "Responses API beside chat
 * completions"). An item's text is kept escaped, as the inside of a JSON string literal: a
 * chunk read from its bytes (mg_resp_chunk_scan) appends its content literal's inside as it
 * came, a chunk read as a tree appends its strings escaped, and the events and the Response
 * copy it between quotes. At most one reasoning item and one message are open at a time:
 * text after tool calls began opens a new message, reasoning after text a new reasoning
 * item, so the output keeps the engine's order. Tool calls stay open until the end: an
 * engine may interleave the argument deltas of several calls (each call is found again by
 * its chat index). */
#include "pipeline/responses_out.h"

#include "base/json.h"
#include "upstream/chunk.h"

#include <limits.h>
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
    char id_lit[200];    /* id as a JSON string literal (every event about the item shows it) */
    char *call_id;       /* owned: a tool call's id */
    char *name;          /* owned: a tool call's function */
    mg_buf_t text;       /* reasoning, content or arguments so far, escaped (a literal's inside) */
    mg_buf_t delta_head; /* owned: its delta events' text before the delta */
} item_t;

struct mg_resp_out_s {
    char id[80];
    const char *suffix; /* in id: what follows "resp_", for the item ids */
    int64_t created_at;
    char *model;   /* owned */
    mg_buf_t skel; /* owned: the skeleton's members as text, each preceded by a comma */
    long long seq; /* the next event's sequence_number */
    int started;   /* response.created went out */
    item_t *items; /* owned, in output order */
    int n_items, cap_items;
    int reasoning_at, message_at; /* the open one's index in items, or -1 */
    char finish[32];              /* the engine's finish_reason */
    long long in_tok, out_tok, cached_tok, reasoning_tok;
    int have_usage;
    int ended;
    mg_buf_t final; /* owned: the Response at the end */
    struct {        /* what the stream's chunk template carries, by its value strings */
        int valid;
        unsigned generation;
        int choices;
        int content, reasoning, finish; /* the template's string index, or -1 */
    } shape;
};

mg_resp_out_t *mg_resp_out_new_printed(const char *id, int64_t created_at, const char *model,
                                       const char *skeleton, size_t len)
{
    mg_resp_out_t *o = calloc(1, sizeof(*o));
    if (!o || !(o->model = strdup(model ? model : ""))) {
        free(o);
        return NULL;
    }
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->suffix = strncmp(o->id, "resp_", 5) == 0 ? o->id + 5 : o->id;
    o->created_at = created_at;
    o->reasoning_at = o->message_at = -1;
    if (skeleton && len > 2) { /* its members, each Response copies them */
        mg_buf_append(&o->skel, ",", 1);
        mg_buf_append(&o->skel, skeleton + 1, len - 2);
    }
    return o;
}

mg_resp_out_t *mg_resp_out_new(const char *id, int64_t created_at, const char *model,
                               cJSON *skeleton)
{
    mg_buf_t text = {0};
    if (skeleton && mg_json_print(skeleton, &text) != 0) text.len = 0;
    cJSON_Delete(skeleton);
    mg_resp_out_t *o = mg_resp_out_new_printed(id, created_at, model, text.data, text.len);
    mg_buf_free(&text);
    return o;
}

void mg_resp_out_free(mg_resp_out_t *o)
{
    if (!o) return;
    for (int i = 0; i < o->n_items; i++) {
        free(o->items[i].call_id);
        free(o->items[i].name);
        mg_buf_free(&o->items[i].text);
        mg_buf_free(&o->items[i].delta_head);
    }
    free(o->items);
    free(o->model);
    mg_buf_free(&o->skel);
    mg_buf_free(&o->final);
    free(o);
}

/* ------------------------------------------------------------------------ */
/* Text                                                                      */
/* ------------------------------------------------------------------------ */

static void put(mg_buf_t *out, const char *s)
{
    mg_buf_append_str(out, s);
}

static void put_str(mg_buf_t *out, const char *s)
{
    mg_json_print_string(s, strlen(s), out);
}

/* An item's escaped text between quotes. */
static void put_text(mg_buf_t *out, const mg_buf_t *text)
{
    mg_buf_append(out, "\"", 1);
    mg_buf_append(out, text->data ? text->data : "", text->len);
    mg_buf_append(out, "\"", 1);
}

static void put_int(mg_buf_t *out, const char *key, long long v)
{
    mg_buf_append_str(out, key);
    mg_buf_append_int(out, v);
}

/* {"type":T,"text":"..."} (output_text with its empty annotations and logprobs) */
static void text_part(mg_buf_t *out, const char *type, const mg_buf_t *text)
{
    put(out, "{\"type\":\"");
    put(out, type);
    put(out, "\",\"text\":");
    put_text(out, text);
    if (strcmp(type, "output_text") == 0) put(out, ",\"annotations\":[],\"logprobs\":[]");
    mg_buf_append(out, "}", 1);
}

static const mg_buf_t no_text = {NULL, 0, 0};

/* The item as the Response lists it; `full`: with its content so far (an added event shows
 * the item before any). */
static void item_text(const item_t *it, int full, mg_buf_t *out)
{
    const char *status = it->open ? "in_progress" : it->cut ? "incomplete" : "completed";
    put(out, "{\"id\":");
    put(out, it->id_lit);
    switch (it->kind) {
    case IT_REASONING:
        put(out, ",\"type\":\"reasoning\",\"summary\":[");
        if (full) text_part(out, "summary_text", &it->text);
        put(out, "]}");
        break;
    case IT_MESSAGE:
        put(out, ",\"type\":\"message\",\"status\":\"");
        put(out, status);
        put(out, "\",\"role\":\"assistant\",\"content\":[");
        if (full) text_part(out, "output_text", &it->text);
        put(out, "]}");
        break;
    case IT_CALL:
        put(out, ",\"type\":\"function_call\",\"status\":\"");
        put(out, status);
        put(out, "\",\"call_id\":");
        put_str(out, it->call_id ? it->call_id : "");
        put(out, ",\"name\":");
        put_str(out, it->name ? it->name : "");
        put(out, ",\"arguments\":");
        put_text(out, full ? &it->text : &no_text);
        mg_buf_append(out, "}", 1);
        break;
    }
}

static void usage_text(const mg_resp_out_t *o, mg_buf_t *out)
{
    put_int(out, ",\"usage\":{\"input_tokens\":", o->in_tok);
    put_int(out, ",\"input_tokens_details\":{\"cached_tokens\":", o->cached_tok);
    put_int(out, ",\"cache_write_tokens\":", 0);
    put_int(out, "},\"output_tokens\":", o->out_tok);
    put_int(out, ",\"output_tokens_details\":{\"reasoning_tokens\":", o->reasoning_tok);
    long long total; /* an upstream's counts are clamped, not trusted: their sum saturates */
    if (__builtin_add_overflow(o->in_tok, o->out_tok, &total))
        total = o->out_tok > 0 ? LLONG_MAX : LLONG_MIN;
    put_int(out, "},\"total_tokens\":", total);
    mg_buf_append(out, "}", 1);
}

typedef struct {
    const char *status;
    int with_usage;
    const char *incomplete;                 /* incomplete_details.reason, or NULL */
    const char *error_code, *error_message; /* error, or NULL */
    long long completed_at;                 /* 0: none */
} resp_view_t;

/* The Response in its current state. */
static void response_text(const mg_resp_out_t *o, const resp_view_t *v, mg_buf_t *out)
{
    put(out, "{\"id\":");
    put_str(out, o->id);
    put_int(out, ",\"object\":\"response\",\"created_at\":", o->created_at);
    put(out, ",\"status\":\"");
    put(out, v->status);
    put(out, "\",\"error\":");
    if (v->error_code) {
        put(out, "{\"code\":");
        put_str(out, v->error_code);
        put(out, ",\"message\":");
        put_str(out, v->error_message ? v->error_message : "");
        mg_buf_append(out, "}", 1);
    } else {
        put(out, "null");
    }
    put(out, ",\"incomplete_details\":");
    if (v->incomplete) {
        put(out, "{\"reason\":\"");
        put(out, v->incomplete);
        put(out, "\"}");
    } else {
        put(out, "null");
    }
    put(out, ",\"model\":");
    put_str(out, o->model);
    put(out, ",\"output\":[");
    for (int i = 0; i < o->n_items; i++) {
        if (i) mg_buf_append(out, ",", 1);
        item_text(&o->items[i], 1, out);
    }
    mg_buf_append(out, "]", 1);
    if (v->with_usage) usage_text(o, out); /* an object or absent */
    mg_buf_append(out, o->skel.data ? o->skel.data : "", o->skel.len);
    if (v->completed_at) put_int(out, ",\"completed_at\":", v->completed_at);
    mg_buf_append(out, "}", 1);
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */
/* ------------------------------------------------------------------------ */

/* An event's start: "event: T\ndata: {"type":"T"". Every event is written between this and
 * event_end; with out NULL nothing is written, but the sequence numbers still count. */
static void event_head(mg_buf_t *out, const char *type)
{
    put(out, "event: ");
    put(out, type);
    put(out, "\ndata: {\"type\":\"");
    put(out, type);
    mg_buf_append(out, "\"", 1);
}

static void event_end(mg_resp_out_t *o, mg_buf_t *out)
{
    put_int(out, ",\"sequence_number\":", o->seq++);
    mg_buf_append(out, "}\n\n", 3);
}

/* The head of an event about item i: its item_id and output_index. */
static void item_event(const mg_resp_out_t *o, mg_buf_t *out, const char *type, int i)
{
    event_head(out, type);
    put(out, ",\"item_id\":");
    put(out, o->items[i].id_lit);
    put_int(out, ",\"output_index\":", i);
}

static void emit_response(mg_resp_out_t *o, mg_buf_t *out, const char *type, const resp_view_t *v)
{
    if (!out) {
        o->seq++;
        return;
    }
    event_head(out, type);
    put(out, ",\"response\":");
    response_text(o, v, out);
    event_end(o, out);
}

static void start(mg_resp_out_t *o, mg_buf_t *out)
{
    if (o->started) return;
    o->started = 1;
    if (!out) {
        o->seq += 2;
        return;
    }
    /* the two events show the same Response: it is written once and copied */
    resp_view_t v = {"in_progress", 0, NULL, NULL, NULL, 0};
    event_head(out, "response.created");
    put(out, ",\"response\":");
    size_t at = out->len;
    response_text(o, &v, out);
    size_t len = out->len - at;
    event_end(o, out);
    event_head(out, "response.in_progress");
    put(out, ",\"response\":");
    if (mg_buf_reserve(out, len) == 0) mg_buf_append(out, out->data + at, len);
    event_end(o, out);
}

/* A new open item of kind; its index, or -1 when out of memory. */
static int open_item(mg_resp_out_t *o, item_kind_t kind)
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
    mg_buf_t lit = {0};
    mg_json_print_string(it->id, strlen(it->id), &lit);
    snprintf(it->id_lit, sizeof(it->id_lit), "%s",
             lit.len < sizeof(it->id_lit) ? lit.data : "\"\"");
    mg_buf_free(&lit);
    return i;
}

static void announce(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    if (!out) {
        o->seq++;
        return;
    }
    event_head(out, "response.output_item.added");
    put_int(out, ",\"output_index\":", i);
    put(out, ",\"item\":");
    item_text(&o->items[i], 0, out);
    event_end(o, out);
}

static void emit_item_done(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    if (!out) {
        o->seq++;
        return;
    }
    event_head(out, "response.output_item.done");
    put_int(out, ",\"output_index\":", i);
    put(out, ",\"item\":");
    item_text(&o->items[i], 1, out);
    event_end(o, out);
}

/* An event about item i whose last member is `key` with the item's whole text, and
 * after it `tail` (NULL: none). */
static void text_event(mg_resp_out_t *o, mg_buf_t *out, const char *type, int i,
                       const char *index_key, const char *key, const char *tail)
{
    if (!out) {
        o->seq++;
        return;
    }
    item_event(o, out, type, i);
    if (index_key) put_int(out, index_key, 0);
    put(out, key);
    put_text(out, &o->items[i].text);
    if (tail) put(out, tail);
    event_end(o, out);
}

/* An event about item i with a part: {"type": part_type, "text": the item's text or ""}. */
static void part_event(mg_resp_out_t *o, mg_buf_t *out, const char *type, int i,
                       const char *index_key, const char *part_type, int with_text)
{
    if (!out) {
        o->seq++;
        return;
    }
    item_event(o, out, type, i);
    put_int(out, index_key, 0);
    put(out, ",\"part\":");
    text_part(out, part_type, with_text ? &o->items[i].text : &no_text);
    event_end(o, out);
}

/* A delta event about item i: `key` with the literal lit[0..n) (quotes included). */
static void delta_event(mg_resp_out_t *o, mg_buf_t *out, const char *type, int i,
                        const char *index_key, const char *lit, size_t n, const char *tail)
{
    if (!out) {
        o->seq++;
        return;
    }
    /* an item's deltas differ in their text and number only: the rest is written once */
    mg_buf_t *head = &o->items[i].delta_head;
    if (!head->len) {
        item_event(o, head, type, i);
        if (index_key) put_int(head, index_key, 0);
        put(head, ",\"delta\":");
        if (!head->len) return;
    }
    if (mg_buf_reserve(out, head->len + n + 64) != 0) return;
    mg_buf_append(out, head->data, head->len);
    mg_buf_append(out, lit, n);
    if (tail) put(out, tail);
    event_end(o, out);
}

static void close_item(mg_resp_out_t *o, int i, mg_buf_t *out)
{
    item_t *it = &o->items[i];
    if (!it->open) return;
    switch (it->kind) {
    case IT_REASONING:
        text_event(o, out, "response.reasoning_summary_text.done", i,
                   ",\"summary_index\":", ",\"text\":", NULL);
        part_event(o, out, "response.reasoning_summary_part.done", i,
                   ",\"summary_index\":", "summary_text", 1);
        o->reasoning_at = -1;
        break;
    case IT_MESSAGE:
        text_event(o, out, "response.output_text.done", i,
                   ",\"content_index\":", ",\"text\":", ",\"logprobs\":[]");
        part_event(o, out, "response.content_part.done", i, ",\"content_index\":", "output_text",
                   1);
        o->message_at = -1;
        break;
    case IT_CALL:
        if (!it->text.len) {
            /* a call without arguments: "{}", streamed like any (the deltas add up to .done) */
            mg_buf_append_str(&it->text, "{}");
            delta_event(o, out, "response.function_call_arguments.delta", i, NULL, "\"{}\"", 4,
                        NULL);
        }
        if (out) {
            item_event(o, out, "response.function_call_arguments.done", i);
            put(out, ",\"name\":");
            put_str(out, it->name ? it->name : "");
            put(out, ",\"arguments\":");
            put_text(out, &it->text);
            event_end(o, out);
        } else {
            o->seq++;
        }
        break;
    }
    it->open = 0;
    emit_item_done(o, i, out);
}

/* ------------------------------------------------------------------------ */
/* Chunks                                                                    */
/* ------------------------------------------------------------------------ */

/* More reasoning: lit[0..n) is its JSON string literal (quotes included). */
static void reasoning_delta(mg_resp_out_t *o, const char *lit, size_t n, mg_buf_t *out)
{
    if (o->reasoning_at < 0) {
        if (o->message_at >= 0) close_item(o, o->message_at, out);
        int i = open_item(o, IT_REASONING);
        if (i < 0) return;
        o->reasoning_at = i;
        announce(o, i, out);
        part_event(o, out, "response.reasoning_summary_part.added", i,
                   ",\"summary_index\":", "summary_text", 0);
    }
    int i = o->reasoning_at;
    mg_buf_append(&o->items[i].text, lit + 1, n - 2);
    delta_event(o, out, "response.reasoning_summary_text.delta", i, ",\"summary_index\":", lit, n,
                NULL);
}

/* More text: lit[0..n) is its JSON string literal. */
static void content_delta(mg_resp_out_t *o, const char *lit, size_t n, mg_buf_t *out)
{
    if (o->message_at < 0) {
        if (o->reasoning_at >= 0) close_item(o, o->reasoning_at, out);
        int i = open_item(o, IT_MESSAGE);
        if (i < 0) return;
        o->message_at = i;
        announce(o, i, out);
        part_event(o, out, "response.content_part.added", i, ",\"content_index\":", "output_text",
                   0);
    }
    int i = o->message_at;
    mg_buf_append(&o->items[i].text, lit + 1, n - 2);
    delta_event(o, out, "response.output_text.delta", i, ",\"content_index\":", lit, n,
                ",\"logprobs\":[]");
}

/* A C string's delta: as its literal. */
static void string_delta(mg_resp_out_t *o, const char *s, mg_buf_t *out,
                         void (*delta)(mg_resp_out_t *, const char *, size_t, mg_buf_t *))
{
    mg_buf_t lit = {0};
    if (mg_json_print_string(s, strlen(s), &lit) == 0) delta(o, lit.data, lit.len, out);
    mg_buf_free(&lit);
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
    int i = open_item(o, IT_CALL);
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
        mg_buf_t lit = {0};
        if (mg_json_print_string(delta, strlen(delta), &lit) == 0) {
            mg_buf_append(&o->items[i].text, lit.data + 1, lit.len - 2);
            delta_event(o, out, "response.function_call_arguments.delta", i, NULL, lit.data,
                        lit.len, NULL);
        }
        mg_buf_free(&lit);
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
    if (reasoning && *reasoning) string_delta(o, reasoning, out, reasoning_delta);
    const char *content = str_of(d, "content");
    if (content && *content) string_delta(o, content, out, content_delta);
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
/* Chunks read from their bytes                                              */
/* ------------------------------------------------------------------------ */

static int key_is(const mg_json_member_t *m, const char *k, size_t n)
{
    return m->key_len == n && memcmp(m->key, k, n) == 0;
}
#define KEY_IS(m, lit) key_is((m), lit, sizeof(lit) - 1)

/* A key with an escape may name one of ours once decoded: only the tree reads it right. */
static int escaped_key(const mg_json_member_t *m)
{
    return memchr(m->key, '\\', m->key_len) != NULL;
}

typedef struct {
    mg_resp_chunk_t *ch;
    const char *key; /* "delta" or "message" */
    size_t key_len;
    const char *choice;
    size_t choice_len;
    int seen_choices, seen_usage, seen_delta, seen_finish, seen_index;
    int seen_content, seen_rc, seen_r, seen_calls;
    const char *rc, *r; /* reasoning_content's and reasoning's literals */
    size_t rc_len, r_len;
} scan_t;

static int lit_value(const mg_json_member_t *m)
{
    return m->value_len >= 2 && m->value[0] == '"';
}

static int delta_member(void *ud, const mg_json_member_t *m)
{
    scan_t *s = ud;
    if (escaped_key(m)) return s->ch->tree = 1;
    if (KEY_IS(m, "content")) {
        if (!s->seen_content++ && lit_value(m)) {
            s->ch->content = m->value;
            s->ch->content_len = m->value_len;
        }
    } else if (KEY_IS(m, "reasoning_content")) {
        if (!s->seen_rc++ && lit_value(m)) {
            s->rc = m->value;
            s->rc_len = m->value_len;
        }
    } else if (KEY_IS(m, "reasoning")) {
        if (!s->seen_r++ && lit_value(m)) {
            s->r = m->value;
            s->r_len = m->value_len;
        }
    } else if (KEY_IS(m, "tool_calls")) {
        /* an empty list (vLLM sends one) says nothing; calls are the tree's */
        if (!s->seen_calls++ && m->value[0] == '[') {
            size_t i = 1;
            while (i < m->value_len && (m->value[i] == ' ' || m->value[i] == '\t' ||
                                        m->value[i] == '\r' || m->value[i] == '\n'))
                i++;
            if (i < m->value_len && m->value[i] != ']') return s->ch->tree = 1;
        }
    }
    return 0;
}

static int choice_member(void *ud, const mg_json_member_t *m)
{
    scan_t *s = ud;
    if (escaped_key(m)) return s->ch->tree = 1;
    if (key_is(m, s->key, s->key_len)) {
        if (!s->seen_delta++ && m->value[0] == '{' &&
            mg_json_members(m->value, m->value_len, delta_member, s) != 0)
            return s->ch->tree = 1;
    } else if (KEY_IS(m, "finish_reason")) {
        if (!s->seen_finish++ && lit_value(m)) {
            /* kept decoded: an escape is the tree's */
            if (memchr(m->value, '\\', m->value_len)) return s->ch->tree = 1;
            s->ch->finish = m->value + 1;
            s->ch->finish_len = m->value_len - 2;
        }
    } else if (KEY_IS(m, "index")) {
        /* a choice other than the first is not a Response's: the tree skips it */
        if (!s->seen_index++ && !(m->value_len == 1 && m->value[0] == '0') &&
            (m->value[0] == '-' || (m->value[0] >= '0' && m->value[0] <= '9')))
            return s->ch->tree = 1;
    }
    return 0;
}

static int choice_element(void *ud, const char *v, size_t n)
{
    scan_t *s = ud;
    if (s->ch->choices++ || v[0] != '{') return s->ch->tree = 1; /* several, or not one */
    s->choice = v;
    s->choice_len = n;
    return 0;
}

static int top_member(void *ud, const mg_json_member_t *m)
{
    scan_t *s = ud;
    if (escaped_key(m)) return s->ch->tree = 1;
    if (KEY_IS(m, "choices")) {
        if (!s->seen_choices++ && m->value[0] == '[' &&
            mg_json_elements(m->value, m->value_len, choice_element, s) != 0)
            return s->ch->tree = 1;
    } else if (KEY_IS(m, "usage")) {
        if (!s->seen_usage++ && m->value[0] == '{') {
            s->ch->usage = m->value;
            s->ch->usage_len = m->value_len;
        }
    } else if (KEY_IS(m, "error") && !(m->value_len == 4 && !memcmp(m->value, "null", 4))) {
        return s->ch->tree = 1; /* the stream's error end reads it */
    }
    return 0;
}

int mg_resp_chunk_scan(const char *json, size_t n, const char *key, mg_resp_chunk_t *ch)
{
    memset(ch, 0, sizeof(*ch));
    scan_t s = {0};
    s.ch = ch;
    s.key = key;
    s.key_len = strlen(key);
    int rc = mg_json_members(json, n, top_member, &s);
    if (ch->tree) return 0;
    if (rc != 0) return -1;
    if (s.choice && mg_json_members(s.choice, s.choice_len, choice_member, &s) != 0) {
        if (ch->tree) return 0;
        return -1;
    }
    if (ch->tree) return 0;
    /* reasoning_content when it is a string, else reasoning (as the tree path reads them) */
    ch->reasoning = s.rc ? s.rc : s.r;
    ch->reasoning_len = s.rc ? s.rc_len : s.r_len;
    return 0;
}

/* ---- a stream's chunks by their template ----
 * A stream's chunks mostly differ from each other in string values only (the text, an id):
 * the chunk memo (upstream/chunk.h) finds that out while it checks them, and says where
 * each value string is. What the scan found in the template it then finds in such a chunk
 * at the same string's place: no member walk per chunk. */

static int string_index(const mg_chunk_memo_t *cm, size_t at)
{
    for (int j = 0; j < cm->n_strings; j++)
        if (cm->at_open[j] == at) return j;
    return -1;
}

static void learn_shape(mg_resp_out_t *o, const mg_chunk_memo_t *cm, const char *json,
                        const mg_resp_chunk_t *ch)
{
    o->shape.valid = 0;
    if (ch->tree || ch->usage) return; /* rare, and read in full */
    int c = ch->content ? string_index(cm, (size_t)(ch->content - json)) : -1;
    int r = ch->reasoning ? string_index(cm, (size_t)(ch->reasoning - json)) : -1;
    int f = ch->finish ? string_index(cm, (size_t)(ch->finish - 1 - json)) : -1;
    if ((ch->content && c < 0) || (ch->reasoning && r < 0) || (ch->finish && f < 0)) return;
    o->shape.content = c;
    o->shape.reasoning = r;
    o->shape.finish = f;
    o->shape.choices = ch->choices;
    o->shape.generation = cm->generation;
    o->shape.valid = 1;
}

/* The literal of the chunk's string j, quotes included; 0 when it is not in json[0..n). */
static int string_at(const mg_chunk_memo_t *cm, int j, const char *json, size_t n, const char **lit,
                     size_t *len)
{
    if (j < 0) return 1;
    size_t a = cm->at_open[j], b = cm->at_close[j];
    if (b >= n || a >= b) return 0;
    *lit = json + a;
    *len = b - a + 1;
    return 1;
}

/* 1 when the chunk was read by the template's shape. */
static int by_shape(const mg_resp_out_t *o, const mg_chunk_memo_t *cm, const char *json, size_t n,
                    mg_resp_chunk_t *ch)
{
    memset(ch, 0, sizeof(*ch));
    ch->choices = o->shape.choices;
    const char *f = NULL;
    size_t fl = 0;
    if (!string_at(cm, o->shape.content, json, n, &ch->content, &ch->content_len) ||
        !string_at(cm, o->shape.reasoning, json, n, &ch->reasoning, &ch->reasoning_len) ||
        !string_at(cm, o->shape.finish, json, n, &f, &fl))
        return 0;
    if (f) {
        if (memchr(f, '\\', fl)) return 0; /* an escaped finish reason: the scan decides */
        ch->finish = f + 1;
        ch->finish_len = fl - 2;
    }
    return 1;
}

int mg_resp_out_scan_chunk(mg_resp_out_t *o, const mg_chunk_memo_t *memo, const char *json,
                           size_t n, mg_resp_chunk_t *ch)
{
    int known = memo && memo->places && memo->matched;
    if (known && o->shape.valid && o->shape.generation == memo->generation &&
        by_shape(o, memo, json, n, ch))
        return 0;
    int rc = mg_resp_chunk_scan(json, n, "delta", ch);
    if (rc == 0 && known) learn_shape(o, memo, json, ch);
    else o->shape.valid = 0;
    return rc;
}

/* A count in a usage object's bytes: what mg_json_ll makes of the number (0 when not one). */
static long long count_text(const mg_json_member_t *m)
{
    char num[64];
    if (!m->value_len || m->value_len >= sizeof(num) ||
        !(m->value[0] == '-' || (m->value[0] >= '0' && m->value[0] <= '9')))
        return 0;
    memcpy(num, m->value, m->value_len);
    num[m->value_len] = '\0';
    cJSON v = {0};
    v.type = cJSON_Number;
    v.valuedouble = strtod(num, NULL);
    return mg_json_ll(&v, 0);
}

typedef struct {
    mg_resp_out_t *o;
    int seen_in, seen_out, seen_pd, seen_cd;
    int seen_cached, seen_reasoning;
} usage_scan_t;

static int usage_detail(void *ud, const mg_json_member_t *m)
{
    usage_scan_t *u = ud;
    if (KEY_IS(m, "cached_tokens") && !u->seen_cached++) u->o->cached_tok = count_text(m);
    else if (KEY_IS(m, "reasoning_tokens") && !u->seen_reasoning++)
        u->o->reasoning_tok = count_text(m);
    return 0;
}

static int usage_member(void *ud, const mg_json_member_t *m)
{
    usage_scan_t *u = ud;
    if (KEY_IS(m, "prompt_tokens")) {
        if (!u->seen_in++) u->o->in_tok = count_text(m);
    } else if (KEY_IS(m, "completion_tokens")) {
        if (!u->seen_out++) u->o->out_tok = count_text(m);
    } else if (KEY_IS(m, "prompt_tokens_details")) {
        if (!u->seen_pd++ && m->value[0] == '{') {
            usage_scan_t d = {u->o, 0, 0, 0, 0, 0, 1};
            mg_json_members(m->value, m->value_len, usage_detail, &d);
        }
    } else if (KEY_IS(m, "completion_tokens_details")) {
        if (!u->seen_cd++ && m->value[0] == '{') {
            usage_scan_t d = {u->o, 0, 0, 0, 0, 1, 0};
            mg_json_members(m->value, m->value_len, usage_detail, &d);
        }
    }
    return 0;
}

void mg_resp_out_scanned(mg_resp_out_t *o, const mg_resp_chunk_t *ch, mg_buf_t *out)
{
    start(o, out);
    if (ch->usage) {
        o->have_usage = 1;
        o->in_tok = o->out_tok = o->cached_tok = o->reasoning_tok = 0;
        usage_scan_t u = {o, 0, 0, 0, 0, 0, 0};
        mg_json_members(ch->usage, ch->usage_len, usage_member, &u);
    }
    if (ch->reasoning && ch->reasoning_len > 2)
        reasoning_delta(o, ch->reasoning, ch->reasoning_len, out);
    if (ch->content && ch->content_len > 2) content_delta(o, ch->content, ch->content_len, out);
    if (ch->finish && ch->finish_len < sizeof(o->finish)) {
        memcpy(o->finish, ch->finish, ch->finish_len);
        o->finish[ch->finish_len] = '\0';
    } else if (ch->finish) {
        memcpy(o->finish, ch->finish, sizeof(o->finish) - 1);
        o->finish[sizeof(o->finish) - 1] = '\0';
    }
}

/* ------------------------------------------------------------------------ */
/* The end                                                                   */
/* ------------------------------------------------------------------------ */

const mg_buf_t *mg_resp_out_end(mg_resp_out_t *o, mg_buf_t *out)
{
    if (o->ended) return &o->final;
    o->ended = 1;
    start(o, out);
    const char *incomplete = strcmp(o->finish, "length") == 0           ? "max_output_tokens"
                             : strcmp(o->finish, "content_filter") == 0 ? "content_filter"
                                                                        : NULL;
    for (int i = 0; i < o->n_items; i++) {
        o->items[i].cut = incomplete && o->items[i].open; /* what the stop cut short */
        close_item(o, i, out);
    }
    resp_view_t v = {incomplete ? "incomplete" : "completed", 1, incomplete, NULL, NULL,
                     incomplete ? 0 : (long long)time(NULL)};
    response_text(o, &v, &o->final);
    const char *type = incomplete ? "response.incomplete" : "response.completed";
    if (out) {
        event_head(out, type);
        put(out, ",\"response\":");
        mg_buf_append(out, o->final.data, o->final.len);
        event_end(o, out);
    } else {
        o->seq++;
    }
    return &o->final;
}

void mg_resp_out_fail(mg_resp_out_t *o, const char *code, const char *message, mg_buf_t *out)
{
    start(o, out);
    resp_view_t v = {"failed", o->have_usage, NULL, code, message, 0};
    emit_response(o, out, "response.failed", &v);
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

int mg_resp_out_message_print(const mg_resp_out_t *o, mg_buf_t *out)
{
    size_t mark = out->len;
    put(out, "{\"role\":\"assistant\",\"content\":");
    int text = 0, calls = 0;
    for (int i = 0; i < o->n_items; i++) { /* the messages' texts as one */
        const item_t *it = &o->items[i];
        if (it->kind != IT_MESSAGE || !it->text.len) continue;
        if (!text++) mg_buf_append(out, "\"", 1);
        mg_buf_append(out, it->text.data, it->text.len);
    }
    put(out, text ? "\"" : "null");
    for (int i = 0; i < o->n_items; i++) {
        const item_t *it = &o->items[i];
        if (it->kind != IT_CALL) continue;
        put(out, calls++ ? "," : ",\"tool_calls\":[");
        put(out, "{\"id\":");
        put_str(out, it->call_id ? it->call_id : "");
        put(out, ",\"type\":\"function\",\"function\":{\"name\":");
        put_str(out, it->name ? it->name : "");
        put(out, ",\"arguments\":");
        if (it->text.len) put_text(out, &it->text);
        else put(out, "\"{}\"");
        put(out, "}}");
    }
    if (calls) mg_buf_append(out, "]", 1);
    if (mg_buf_append(out, "}", 1) != 0) {
        out->len = mark;
        return -1;
    }
    return 0;
}

cJSON *mg_resp_out_message(const mg_resp_out_t *o)
{
    mg_buf_t text = {0};
    cJSON *m = mg_resp_out_message_print(o, &text) == 0 ? cJSON_Parse(text.data) : NULL;
    mg_buf_free(&text);
    return m;
}
