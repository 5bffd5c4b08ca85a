/* messages_stream: the canonical stream as Anthropic's Messages stream; see
 * messages_stream.h. Events are written as text (no tree per event out); each canonical
 * chunk is parsed once. */
#include "pipeline/messages_stream.h"

#include "base/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mg_msgs_stream_init(mg_msgs_stream_t *s, const char *id, const char *model,
                        long long input_estimate)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->model = strdup(model ? model : "");
    s->open_tool = -1;
    s->usage.input = input_estimate > 0 ? input_estimate : 0;
    for (int i = 0; i < MG_MSGS_TOOLS_MAX; i++) s->tool_block[i] = -1;
    return s->model ? 0 : -1;
}

static void pending_clear(mg_msgs_stream_t *s)
{
    for (int i = 0; i < s->npending; i++) {
        free(s->pending[i].id);
        free(s->pending[i].name);
        mg_buf_free(&s->pending[i].arg);
    }
    s->npending = 0;
}

void mg_msgs_stream_free(mg_msgs_stream_t *s)
{
    pending_clear(s);
    mg_buf_free(&s->open_args);
    free(s->pending);
    s->pending = NULL;
    free(s->model);
    free(s->stop_sequence);
    mg_buf_free(&s->line);
    mg_buf_free(&s->data);
    s->model = s->stop_sequence = NULL;
}

/* ---- writing events ---------------------------------------------------------------- */

static void event_head(mg_buf_t *out, const char *type)
{
    mg_buf_append_str(out, "event: ");
    mg_buf_append_str(out, type);
    mg_buf_append_str(out, "\ndata: {\"type\":\"");
    mg_buf_append_str(out, type);
    mg_buf_append(out, "\"", 1);
}

static void event_end(mg_buf_t *out)
{
    mg_buf_append(out, "}\n\n", 3);
}

static void put_str(mg_buf_t *out, const char *s)
{
    mg_json_print_string(s, strlen(s), out);
}

static void put_index(mg_buf_t *out, int index)
{
    mg_buf_append_str(out, ",\"index\":");
    mg_buf_append_int(out, index);
}

static void message_start(mg_msgs_stream_t *s, mg_buf_t *out)
{
    s->started = 1;
    event_head(out, "message_start");
    mg_buf_append_str(out, ",\"message\":{\"id\":");
    put_str(out, s->id);
    mg_buf_append_str(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    put_str(out, s->model);
    mg_buf_append_str(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
                           "\"usage\":{\"input_tokens\":");
    mg_buf_append_int(out, s->usage.input);
    /* the cache counts are not known before the upstream's usage (message_delta has them):
       null, as the SDK's Usage allows, rather than a 0 that would be a claim */
    mg_buf_append_str(out, ",\"output_tokens\":0,\"cache_creation_input_tokens\":null,"
                           "\"cache_read_input_tokens\":null}}");
    event_end(out);
    event_head(out, "ping"); /* as Anthropic's own streams: clients know the stream is live */
    event_end(out);
}

static void close_block(mg_msgs_stream_t *s, mg_buf_t *out)
{
    if (s->open == MG_MSGS_NONE) return;
    event_head(out, "content_block_stop");
    put_index(out, s->open_index);
    event_end(out);
    s->open = MG_MSGS_NONE;
    s->open_tool = -1;
}

/* A new block of `kind`: the open one closed first. `block` is its content_block's members
 * after "type" (text already JSON). */
static void flush_pending(mg_msgs_stream_t *s, mg_buf_t *out);

static int open_block(mg_msgs_stream_t *s, mg_msgs_block_t kind, const char *type,
                      const char *members, mg_buf_t *out)
{
    if (kind != MG_MSGS_TOOL) flush_pending(s, out); /* waiting calls come first */
    close_block(s, out);
    int index = s->next_index++;
    event_head(out, "content_block_start");
    put_index(out, index);
    mg_buf_append_str(out, ",\"content_block\":{\"type\":\"");
    mg_buf_append_str(out, type);
    mg_buf_append_str(out, "\"");
    mg_buf_append_str(out, members);
    mg_buf_append(out, "}", 1);
    event_end(out);
    s->open = kind;
    s->open_index = index;
    return index;
}

/* content_block_delta {type: delta_type, key: <json>} on block `index`; json is a JSON string
 * literal (quotes and escapes included). */
static void block_delta_json(mg_buf_t *out, int index, const char *delta_type, const char *key,
                             const char *json, size_t n)
{
    event_head(out, "content_block_delta");
    put_index(out, index);
    mg_buf_append_str(out, ",\"delta\":{\"type\":\"");
    mg_buf_append_str(out, delta_type);
    mg_buf_append_str(out, "\",\"");
    mg_buf_append_str(out, key);
    mg_buf_append_str(out, "\":");
    mg_buf_append(out, json, n);
    mg_buf_append(out, "}", 1);
    event_end(out);
}

/* The same with the text as a C string. */
static void block_delta(mg_buf_t *out, int index, const char *delta_type, const char *key,
                        const char *text)
{
    mg_buf_t lit = {0};
    mg_json_print_string(text, strlen(text), &lit);
    block_delta_json(out, index, delta_type, key, lit.data ? lit.data : "\"\"",
                     lit.data ? lit.len : 2);
    mg_buf_free(&lit);
}

/* ---- reading chunks ---------------------------------------------------------------- */

static const char *nonempty(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

static void thinking(mg_msgs_stream_t *s, const cJSON *delta, mg_buf_t *out)
{
    const char *text = nonempty(delta, "reasoning_content");
    if (!text) text = nonempty(delta, "reasoning");
    const char *sig = nonempty(delta, "reasoning_signature");
    if ((text || sig) && s->open != MG_MSGS_THINKING)
        open_block(s, MG_MSGS_THINKING, "thinking", ",\"thinking\":\"\",\"signature\":\"\"", out);
    if (text) block_delta(out, s->open_index, "thinking_delta", "thinking", text);
    if (sig) block_delta(out, s->open_index, "signature_delta", "signature", sig);
    const char *redacted = nonempty(delta, "redacted_thinking");
    if (redacted) {
        mg_buf_t m = {0};
        mg_buf_append_str(&m, ",\"data\":");
        put_str(&m, redacted);
        open_block(s, MG_MSGS_REDACTED, "redacted_thinking", m.data ? m.data : "", out);
        close_block(s, out); /* all of it is in its start */
        mg_buf_free(&m);
    }
}

static void text(mg_msgs_stream_t *s, const cJSON *delta, mg_buf_t *out)
{
    const char *t = nonempty(delta, "content");
    if (!t) return;
    if (s->open != MG_MSGS_TEXT) open_block(s, MG_MSGS_TEXT, "text", ",\"text\":\"\"", out);
    block_delta(out, s->open_index, "text_delta", "text", t);
}

/* A tool_use block's start for call `ti`: closes the open block. */
static void open_tool_block(mg_msgs_stream_t *s, int ti, const char *id, const char *name,
                            mg_buf_t *out)
{
    char gen[160];
    if (!id) {
        snprintf(gen, sizeof(gen), "toolu_%s_%d", s->id, ti);
        id = gen;
    }
    mg_buf_t m = {0};
    mg_buf_append_str(&m, ",\"id\":");
    put_str(&m, id);
    mg_buf_append_str(&m, ",\"name\":");
    put_str(&m, name ? name : "");
    mg_buf_append_str(&m, ",\"input\":{}");
    s->tool_block[ti] = (short)open_block(s, MG_MSGS_TOOL, "tool_use", m.data ? m.data : "", out);
    s->open_tool = ti;
    s->open_args.len = 0;
    mg_buf_free(&m);
}

/* Every waiting call gets its block in start order, its kept fragments as they came; the last
 * one stays open (its later fragments stream live). */
static void flush_pending(mg_msgs_stream_t *s, mg_buf_t *out)
{
    for (int i = 0; i < s->npending; i++) {
        mg_msgs_pending_t *p = &s->pending[i];
        open_tool_block(s, p->tool, p->id, p->name, out);
        for (size_t at = 0; at < p->arg.len;) {
            const char *nl = memchr(p->arg.data + at, '\n', p->arg.len - at);
            size_t len = nl ? (size_t)(nl - (p->arg.data + at)) : p->arg.len - at;
            block_delta_json(out, s->open_index, "input_json_delta", "partial_json",
                             p->arg.data + at, len);
            cJSON *piece = cJSON_ParseWithLength(p->arg.data + at, len); /* the literal's text */
            if (cJSON_IsString(piece)) mg_buf_append_str(&s->open_args, piece->valuestring);
            cJSON_Delete(piece);
            at += len + 1;
        }
    }
    pending_clear(s);
}

/* A call's argument fragment as a JSON string literal (a string, or an object printed), or
 * 0 when it has none. */
static int arg_literal(const cJSON *args, mg_buf_t *lit)
{
    if (cJSON_IsString(args) && args->valuestring[0]) {
        mg_json_print_string(args->valuestring, strlen(args->valuestring), lit);
        return 1;
    }
    if (!cJSON_IsObject(args)) return 0; /* an engine that sends the arguments as an object */
    mg_buf_t a = {0};
    mg_json_print(args, &a);
    int some = a.len > 2;
    if (some) mg_json_print_string(a.data, a.len, lit);
    mg_buf_free(&a);
    return some;
}

/* The open tool call's arguments are whole JSON: the engine is done with it (a fragment it
 * sent it later could only break them). */
static int open_args_whole(const mg_msgs_stream_t *s)
{
    cJSON *v = s->open_args.len ? cJSON_ParseWithLength(s->open_args.data, s->open_args.len) : NULL;
    cJSON_Delete(v);
    return v != NULL;
}

/* A fragment of the open call: its text kept for open_args_whole. */
static void keep_open_args(mg_msgs_stream_t *s, const cJSON *args)
{
    if (cJSON_IsString(args)) mg_buf_append_str(&s->open_args, args->valuestring);
    else if (cJSON_IsObject(args)) mg_json_print(args, &s->open_args); /* whole by itself */
}

static mg_msgs_pending_t *pending_of(mg_msgs_stream_t *s, int ti)
{
    for (int i = 0; i < s->npending; i++)
        if (s->pending[i].tool == ti) return &s->pending[i];
    return NULL;
}

/* A call starting while another call's block is open: it waits. 0, or -1 out of memory (it
 * then opens at once: overlap is better than a lost call). */
static int wait_call(mg_msgs_stream_t *s, int ti, const char *id, const char *name)
{
    if (!s->pending && !(s->pending = calloc(MG_MSGS_TOOLS_MAX, sizeof(*s->pending)))) return -1;
    mg_msgs_pending_t *p = &s->pending[s->npending];
    memset(p, 0, sizeof(*p));
    p->tool = ti;
    p->id = id ? strdup(id) : NULL;
    p->name = strdup(name ? name : "");
    if ((id && !p->id) || !p->name) {
        free(p->id);
        free(p->name);
        return -1;
    }
    s->npending++;
    s->tool_block[ti] = -2;
    return 0;
}

/* One tool call fragment: its first fragment (id, name) opens its block (or makes it wait,
 * see the header); its argument fragments are input_json_delta events on that block. */
static void tool_fragment(mg_msgs_stream_t *s, const cJSON *tc, int position, mg_buf_t *out)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(tc, "index");
    int ti = mg_json_int(idx, position);
    if (ti < 0 || ti >= MG_MSGS_TOOLS_MAX) ti = MG_MSGS_TOOLS_MAX - 1;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    if (s->tool_block[ti] == -1) {
        const char *id = nonempty(tc, "id"), *name = nonempty(fn, "name");
        if (s->open != MG_MSGS_TOOL || wait_call(s, ti, id, name) != 0)
            open_tool_block(s, ti, id, name, out);
    }
    mg_buf_t lit = {0};
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    int some = arg_literal(args, &lit);
    if (s->tool_block[ti] == -2) {
        mg_msgs_pending_t *p = pending_of(s, ti);
        if (some) {
            if (p->arg.len) mg_buf_append(&p->arg, "\n", 1); /* a literal holds no raw \n */
            mg_buf_append(&p->arg, lit.data, lit.len);
        }
        /* its own arguments with none of the open call's since it started, and the open
           call's whole: the open call is done (calls one after another) */
        if (some && !s->interleaved && open_args_whole(s)) flush_pending(s, out);
    } else if (some) {
        if (ti == s->open_tool && s->npending) s->interleaved = 1;
        if (ti == s->open_tool) keep_open_args(s, args);
        /* only a call whose block was closed by a wrong guess above lands on a closed block */
        block_delta_json(out, s->tool_block[ti], "input_json_delta", "partial_json", lit.data,
                         lit.len);
    }
    mg_buf_free(&lit);
}

static void finish(mg_msgs_stream_t *s, const cJSON *choice)
{
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    if (!cJSON_IsString(fr)) return;
    const char *seq;
    s->stop_reason = mg_msgs_stop_reason(choice, &seq);
    free(s->stop_sequence);
    s->stop_sequence = seq ? strdup(seq) : NULL;
}

static void take_usage(mg_msgs_stream_t *s, const cJSON *chunk)
{
    mg_msgs_usage_t u;
    if (mg_msgs_usage(cJSON_GetObjectItemCaseSensitive(chunk, "usage"), &u)) {
        s->usage = u;
        s->have_usage = 1;
    }
}

/* Anthropic's type for a stream's error event: an Anthropic upstream's own (overloaded,
 * rate limited) when its message names it, a timeout's, else api_error. */
const char *mg_msgs_stream_error_type(const char *code, const char *msg)
{
    static const char *const passed[] = {"overloaded_error", "rate_limit_error"};
    for (size_t i = 0; i < sizeof(passed) / sizeof(passed[0]); i++)
        if (msg && strstr(msg, passed[i])) return passed[i];
    if (code && strstr(code, "TIMEOUT")) return "timeout_error";
    return "api_error";
}

static void error_event(mg_msgs_stream_t *s, const cJSON *err, mg_buf_t *out)
{
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    const char *c = cJSON_IsString(code) ? code->valuestring : NULL;
    const char *m = cJSON_IsString(msg) ? msg->valuestring : "the stream failed";
    mg_buf_t body = {0};
    mg_msgs_error_body_typed(&body, mg_msgs_stream_error_type(c, m), c, m, NULL);
    mg_buf_append_str(out, "event: error\ndata: ");
    mg_buf_append(out, body.data, body.len);
    mg_buf_append_str(out, "\n\n");
    mg_buf_free(&body);
    s->ended = 1;
}

static void stream_end(mg_msgs_stream_t *s, mg_buf_t *out)
{
    if (!s->started) message_start(s, out);
    flush_pending(s, out);
    close_block(s, out);
    const mg_msgs_usage_t *u = s->have_usage ? &s->usage : &s->fallback;
    event_head(out, "message_delta");
    mg_buf_append_str(out, ",\"delta\":{\"stop_reason\":");
    put_str(out, s->stop_reason ? s->stop_reason : "end_turn");
    mg_buf_append_str(out, ",\"stop_sequence\":");
    if (s->stop_sequence) put_str(out, s->stop_sequence);
    else mg_buf_append_str(out, "null");
    mg_buf_append_str(out, "},\"usage\":");
    mg_msgs_usage_print(u, out);
    event_end(out);
    event_head(out, "message_stop");
    event_end(out);
    s->ended = 1;
}

/* ---- the common chunk, read from its bytes ---------------------------------------------
 * Most events of a stream carry a piece of text and nothing else. Those are re-framed from
 * their bytes: the text's JSON string literal is already what the text_delta needs, so no
 * tree is built and nothing is unescaped. A chunk with anything more (a finish reason, usage,
 * an error, tool calls, reasoning, several choices) takes the tree path below. */

typedef struct {
    const char *val; /* the member's value */
    size_t len;
    int other; /* a member this path does not handle */
} pick_t;

/* A value that says nothing: null, "", [] or {}. */
static int is_empty_value(const mg_json_member_t *m)
{
    return (m->value_len == 4 && memcmp(m->value, "null", 4) == 0) ||
           (m->value_len == 2 &&
            (memcmp(m->value, "\"\"", 2) == 0 || memcmp(m->value, "[]", 2) == 0 ||
             memcmp(m->value, "{}", 2) == 0));
}

static int key_is(const mg_json_member_t *m, const char *k)
{
    size_t n = strlen(k);
    return m->key_len == n && memcmp(m->key, k, n) == 0;
}

/* top level: choices kept; usage or error (set) send the chunk to the tree path */
static int top_member(void *ud, const mg_json_member_t *m)
{
    pick_t *p = ud;
    if (key_is(m, "choices")) {
        p->val = m->value;
        p->len = m->value_len;
    } else if ((key_is(m, "usage") || key_is(m, "error")) && !is_empty_value(m)) {
        p->other = 1;
        return 1;
    }
    return 0;
}

static int first_element(void *ud, const char *v, size_t n)
{
    pick_t *p = ud;
    if (p->val) { /* a second choice */
        p->other = 1;
        return 1;
    }
    p->val = v;
    p->len = n;
    return 0;
}

/* the choice: its delta kept; a finish reason goes to the tree path */
static int choice_member(void *ud, const mg_json_member_t *m)
{
    pick_t *p = ud;
    if (key_is(m, "delta")) {
        p->val = m->value;
        p->len = m->value_len;
    } else if ((key_is(m, "finish_reason") || key_is(m, "stop_reason")) && !is_empty_value(m)) {
        p->other = 1;
        return 1;
    }
    return 0;
}

/* the delta: its content kept; role and empty members ignored; anything else is the tree's */
static int delta_member(void *ud, const mg_json_member_t *m)
{
    pick_t *p = ud;
    if (key_is(m, "content") && m->value[0] == '"') {
        p->val = m->value;
        p->len = m->value_len;
    } else if (!key_is(m, "role") && !is_empty_value(m)) {
        p->other = 1;
        return 1;
    }
    return 0;
}

/* 1 when the chunk was handled from its bytes, 0 when it needs the tree. */
static int text_chunk(mg_msgs_stream_t *s, const char *json, size_t n, mg_buf_t *out)
{
    pick_t top = {0}, choice = {0}, delta = {0}, text = {0};
    if (mg_json_members(json, n, top_member, &top) != 0 || top.other || !top.val ||
        top.val[0] != '[')
        return 0;
    if (mg_json_elements(top.val, top.len, first_element, &choice) != 0 || choice.other ||
        !choice.val || choice.val[0] != '{')
        return 0;
    if (mg_json_members(choice.val, choice.len, choice_member, &delta) != 0 || delta.other ||
        !delta.val || delta.val[0] != '{')
        return 0;
    if (mg_json_members(delta.val, delta.len, delta_member, &text) != 0 || text.other) return 0;
    if (!s->started) message_start(s, out);
    if (!text.val || text.len <= 2) return 1; /* the role chunk, an empty piece */
    if (s->open != MG_MSGS_TEXT) open_block(s, MG_MSGS_TEXT, "text", ",\"text\":\"\"", out);
    block_delta_json(out, s->open_index, "text_delta", "text", text.val, text.len);
    return 1;
}

int mg_msgs_stream_event(mg_msgs_stream_t *s, const char *json, size_t n, mg_buf_t *out)
{
    if (s->ended) return 0;
    if (n == 6 && memcmp(json, "[DONE]", 6) == 0) {
        stream_end(s, out);
        return 0;
    }
    if (text_chunk(s, json, n, out)) return 0;
    cJSON *chunk = cJSON_ParseWithLength(json, n);
    if (!chunk) return 0; /* the pipeline never sends one: nothing to say about it */
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(chunk, "error");
    if (err && !cJSON_IsNull(err)) {
        error_event(s, err, out);
        cJSON_Delete(chunk);
        return 0;
    }
    if (!s->started) message_start(s, out);
    take_usage(s, chunk);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    const cJSON *choice = cJSON_IsArray(choices) ? choices->child : NULL; /* n = 1 */
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(choice, "delta");
    if (cJSON_IsObject(delta)) {
        thinking(s, delta, out);
        text(s, delta, out);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls");
        int pos = 0;
        for (const cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next)
            tool_fragment(s, tc, pos++, out);
    }
    if (choice) finish(s, choice);
    cJSON_Delete(chunk);
    return 0;
}

/* ---- SSE framing --------------------------------------------------------------------- */

/* One input line (without its newline): data lines gather, a blank line ends the event. */
static void feed_line(mg_msgs_stream_t *s, const char *l, size_t n, mg_buf_t *out)
{
    if (n && l[n - 1] == '\r') n--;
    if (n == 0) {
        if (s->data.len) mg_msgs_stream_event(s, s->data.data, s->data.len, out);
        s->data.len = 0;
        return;
    }
    if (n < 5 || memcmp(l, "data:", 5) != 0) return; /* event:, id:, comments */
    l += 5;
    n -= 5;
    if (n && *l == ' ') l++, n--;
    if (s->data.len) mg_buf_append(&s->data, "\n", 1);
    mg_buf_append(&s->data, l, n);
}

int mg_msgs_stream_feed(mg_msgs_stream_t *s, const char *in, size_t n, mg_buf_t *out)
{
    size_t at = 0;
    while (at < n) {
        const char *nl = memchr(in + at, '\n', n - at);
        if (!nl) {
            mg_buf_append(&s->line, in + at, n - at);
            break;
        }
        size_t len = (size_t)(nl - (in + at));
        if (s->line.len) {
            mg_buf_append(&s->line, in + at, len);
            feed_line(s, s->line.data, s->line.len, out);
            s->line.len = 0;
        } else {
            feed_line(s, in + at, len, out);
        }
        at += len + 1;
    }
    return 0;
}
