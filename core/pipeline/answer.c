/* answer: the upstream's answer on its way to the client: the transfer's callbacks, the
 * stream events (forwarded as bytes for passthrough adapters, decoded by Lua for translating
 * ones), and the stream step that checks and completes a whole answer.
 *
 * Streaming: upstream bytes go through the SSE (or NDJSON) framer. For passthrough
 * adapters an event is forwarded byte for byte unless it is one of the few the gateway
 * annotates (the first chunk gets request metadata, the chunk with finish_reason gets usage
 * and timing, the usage-only chunk is folded in), so the common chunk costs a couple of
 * memchr-class scans and a copy. All events that complete within one upstream read are
 * written to the client as one chunk. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "base/log.h"
#include "net/hold.h"
#include "pipeline/responses_out.h"
#include "upstream/chunk.h"

#define MAX_RESPONSE_BYTES (64u * 1024u * 1024u)
#define MAX_ERROR_BODY_BYTES (64u * 1024u)

cJSON *timing_json(call_t *c, uint64_t now)
{
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "queue_ms", (double)(long long)ms_since(c->t_start, c->t_dispatch));
    cJSON_AddNumberToObject(t, "first_token_ms",
                            (double)(long long)ms_since(c->t_start, c->t_first));
    cJSON_AddNumberToObject(t, "total_ms", (double)(long long)ms_since(c->t_start, now));
    return t;
}

/* How the answer is degraded, as the client sees it (header, body, log): the route's kind,
 * "shorter_output" when memory admission lowered max_tokens, or both; NULL when neither. */
const char *degraded_reason(const call_t *c, char *buf, size_t cap)
{
    if (!c->output_shortened) return c->degraded;
    if (!c->degraded) return "shorter_output";
    snprintf(buf, cap, "%s, shorter_output", c->degraded);
    return buf;
}

/* cluster.node_id: which instance answered (every answer says it, as the edge PRD's does). */
static const char *node_id(const call_t *c)
{
    return c->gen->cfg->cluster.node_id;
}

static void append_node_raw(const call_t *c, mg_buf_t *o)
{
    const char *id = node_id(c);
    mg_buf_append_str(o, ",\"node_id\":");
    mg_json_print_string(id, strlen(id), o);
}

static void add_metadata(call_t *c, cJSON *obj)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    set_item(obj, "request_id", cJSON_CreateString(c->req ? c->req->request_id : ""));
    set_item(obj, "logical_model", cJSON_CreateString(c->model->name));
    set_item(obj, "actual_model", cJSON_CreateString(c->upstream_model ? c->upstream_model : ""));
    set_item(obj, "node_id", cJSON_CreateString(node_id(c)));
    set_item(obj, "degraded", cJSON_CreateBool(reason != NULL));
    if (reason) set_item(obj, "degraded_reason", cJSON_CreateString(reason));
    if (c->output_shortened)
        set_item(obj, "max_output_tokens", cJSON_CreateNumber((double)c->mapped_max_tokens));
    context_annotate(c, obj);
}

/* The same members as add_metadata's degraded ones, as bytes: ,"degraded":... */
static void append_degraded_raw(const call_t *c, mg_buf_t *o)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    mg_buf_append_str(o, reason ? ",\"degraded\":true" : ",\"degraded\":false");
    if (reason) {
        mg_buf_append_str(o, ",\"degraded_reason\":");
        mg_json_print_string(reason, strlen(reason), o);
    }
    if (c->output_shortened) {
        mg_buf_append_str(o, ",\"max_output_tokens\":");
        mg_json_print_number((double)c->mapped_max_tokens, o);
    }
}

/* Response headers every answer of this call carries beyond the standard ones. */
const char *degraded_header(const call_t *c, char *buf, size_t cap)
{
    char rb[32]; /* "emergency, shorter_output" at most */
    const char *reason = degraded_reason(c, rb, sizeof(rb));
    if (!reason) return NULL;
    snprintf(buf, cap, "X-Sidecar-Degraded: %s\r\n", reason);
    return buf;
}

/* The token counts of a usage object's bytes, without building a tree (it is read on
 * every passthrough answer): prompt_tokens / completion_tokens (or the Responses and
 * Anthropic input_tokens / output_tokens), the details' cached_tokens and reasoning_tokens
 * (subsets), Anthropic's cache_read_input_tokens and cache_creation_input_tokens (apart). */
typedef struct {
    long long prompt, completion, cached, cache_write, reasoning;
    int found, apart;
} usage_scan_t;

static int usage_detail(void *ud, const mg_json_member_t *m);

static long long member_number(const mg_json_member_t *m, int *ok)
{
    char num[24];
    *ok = 0;
    if (m->value_len == 0 || m->value_len >= sizeof(num) || m->value[0] < '0' || m->value[0] > '9')
        return 0;
    memcpy(num, m->value, m->value_len);
    num[m->value_len] = '\0';
    *ok = 1;
    return strtoll(num, NULL, 10);
}

static int usage_member(void *ud, const mg_json_member_t *m)
{
    usage_scan_t *u = ud;
    if (m->value_len && m->value[0] == '{') {
        if (member_is(m, "prompt_tokens_details") || member_is(m, "completion_tokens_details") ||
            member_is(m, "input_tokens_details") || member_is(m, "output_tokens_details"))
            mg_json_members(m->value, m->value_len, usage_detail, u);
        return 0;
    }
    int ok;
    long long v = member_number(m, &ok);
    if (!ok) return 0;
    if (member_is(m, "prompt_tokens") || member_is(m, "input_tokens")) {
        u->prompt = v;
        u->found = 1;
    } else if (member_is(m, "completion_tokens") || member_is(m, "output_tokens")) {
        u->completion = v;
        u->found = 1;
    } else if (member_is(m, "cache_read_input_tokens")) {
        u->cached = v;
        u->apart = 1;
    } else if (member_is(m, "cache_creation_input_tokens")) {
        u->cache_write = v;
        u->apart = 1;
    }
    return 0;
}

static int usage_detail(void *ud, const mg_json_member_t *m)
{
    usage_scan_t *u = ud;
    int ok;
    long long v = member_number(m, &ok);
    if (!ok) return 0;
    if (member_is(m, "cached_tokens")) u->cached = v;
    else if (member_is(m, "reasoning_tokens")) u->reasoning = v;
    return 0;
}

void take_usage_bytes(call_t *c, const char *json, size_t n)
{
    usage_scan_t u = {0};
    if (mg_json_members(json, n, usage_member, &u) != 0 || !u.found) return;
    c->prompt_tokens = u.prompt;
    c->completion_tokens = u.completion;
    c->cached_tokens = u.cached;
    c->cache_write_tokens = u.cache_write;
    c->reasoning_tokens = u.reasoning;
    c->cache_apart = u.apart;
    c->have_usage = 1;
}

/* A usage object of a tree: its text scanned as above (one reading of the fields). */
static void take_usage(call_t *c, const cJSON *usage)
{
    if (!cJSON_IsObject(usage)) return;
    char *text = cJSON_PrintUnformatted(usage);
    if (text) take_usage_bytes(c, text, strlen(text));
    free(text);
}

static cJSON *usage_json(call_t *c)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)c->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)c->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(c->prompt_tokens + c->completion_tokens));
    /* the details the upstream reported, as the whole answer's usage has them (the cache
       reads are part of prompt_tokens, reasoning part of completion_tokens) */
    if (c->cached_tokens > 0)
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"),
                                "cached_tokens", (double)c->cached_tokens);
    if (c->reasoning_tokens > 0)
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "completion_tokens_details"),
                                "reasoning_tokens", (double)c->reasoning_tokens);
    return u;
}

/* ------------------------------------------------------------------------ */
/* Streaming to the client                                                   */
/* ------------------------------------------------------------------------ */

void out_event(call_t *c, const char *json, size_t n)
{
    mg_buf_append(&c->out, "data: ", 6);
    mg_buf_append(&c->out, json, n);
    mg_buf_append(&c->out, "\n\n", 2);
}

static void out_json(call_t *c, const cJSON *chunk)
{
    mg_buf_append(&c->out, "data: ", 6);
    mg_json_print(chunk, &c->out);
    mg_buf_append(&c->out, "\n\n", 2);
}

int model_renamed(const call_t *c)
{
    return c->rename_model;
}

/* The value of the first "model" member in raw[0..n): its quotes' offsets, or 0 when there is
 * none (a key is preceded by { or , and the value is a string). In a chunk the first one is
 * the top level's: nested objects come after it, and a string cannot hold an unescaped
 * quote. */
static int find_model_value(const char *raw, size_t n, size_t *key, size_t *open, size_t *close)
{
    const char *end = raw + n, *k = raw;
    for (;;) { /* memchr for the quotes: glibc's memmem costs more than a chunk's other work */
        k = memchr(k, '"', (size_t)(end - k));
        if (!k || end - k < 8) return 0;
        if (memcmp(k + 1, "model\"", 6) == 0) break;
        k++;
    }
    const char *p = k + 7;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p >= end || *p++ != ':') return 0;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p >= end || *p != '"') return 0;
    const char *q = p + 1;
    while (q < end && *q != '"') q += *q == '\\' ? 2 : 1;
    if (q >= end) return 0;
    *key = (size_t)(k - raw);
    *open = (size_t)(p - raw);
    *close = (size_t)(q - raw);
    return 1;
}

/* The model value where the stream's last chunk had it: a stream's chunks share their
 * leading members, so the key is at the same offset (checked: the key, then a closing quote
 * not escaped; a value ending in an escaped backslash takes find_model_value instead).
 * Offsets count from the JSON's first byte. */
static int model_value_as_before(const call_t *c, const char *json, size_t n, size_t *close)
{
    size_t key = c->model_key_at, open = c->model_value_at;
    if (!open || open >= n || memcmp(json + key, "\"model\"", 7) != 0 || json[open] != '"')
        return 0;
    const char *q = memchr(json + open + 1, '"', n - open - 1);
    if (!q || q[-1] == '\\') return 0;
    *close = (size_t)(q - json);
    return 1;
}

void append_with_client_model(call_t *c, mg_buf_t *out, const char *raw, size_t n, size_t lead)
{
    size_t key, close;
    if (!model_renamed(c) || lead > n) {
        mg_buf_append(out, raw, n);
        return;
    }
    const char *json = raw + lead;
    if (!model_value_as_before(c, json, n - lead, &close)) {
        if (!find_model_value(json, n - lead, &key, &c->model_value_at, &close)) {
            c->model_value_at = 0;
            mg_buf_append(out, raw, n);
            return;
        }
        c->model_key_at = key;
    }
    if (!c->client_model_json.len &&
        mg_json_print_string(c->client_model, strlen(c->client_model), &c->client_model_json) != 0)
        return;
    /* one reserve and three copies: every chunk of a stream comes this way */
    size_t open = lead + c->model_value_at, name = c->client_model_json.len;
    size_t rest = n - lead - close - 1;
    if (mg_buf_reserve(out, open + name + rest) != 0) return;
    char *w = out->data + out->len;
    memcpy(w, raw, open);
    memcpy(w + open, c->client_model_json.data, name);
    memcpy(w + open + name, json + close + 1, rest);
    out->len += open + name + rest;
    out->data[out->len] = '\0';
}

/* The client's name for "model" in a decoded or gateway-built object that has one. */
static void set_client_model(call_t *c, cJSON *obj)
{
    if (model_renamed(c) && cJSON_HasObjectItem(obj, "model"))
        set_item(obj, "model", cJSON_CreateString(c->client_model));
}

/* The stream reaches the client now (its head goes with the next send_out); 1 the first
 * time. */
int stream_start(call_t *c)
{
    if (c->client_started) return 0;
    c->client_started = 1;
    task_to(c, MG_TASK_STREAMING, "first_chunk");
    return 1;
}

/* c->out to the client in one write: after the stream's head when `head`, before the body's
 * end when `end` (the request is finished then). The end (the final chunk, [DONE] and the
 * terminating chunk) is held until the call's spend is durable (charge_spend). */
void send_out(call_t *c, int head, int end)
{
    char extra[160] = "";
    if (head) {
        char deg[64];
        const char *d = degraded_header(c, deg, sizeof(deg));
        snprintf(extra, sizeof(extra), "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n%s",
                 d ? d : "");
    }
    if (c->front_messages && !c->native) msgs_reframe(c, end);
    mg_hold_t *h = end ? charge_spend(c) : NULL;
    if (h)
        mg_hold_stream_end(h, c->req, head, 200, "text/event-stream", extra, c->out.data,
                           c->out.len);
    else if (head)
        mg_http_stream_open(c->req, 200, "text/event-stream", extra, c->out.data, c->out.len, end);
    else mg_http_stream_send(c->req, c->out.data, c->out.len, end);
    c->out.len = 0;
    c->last_client_write_ms = uv_now(c->pl->loop);
}

static void flush_out(call_t *c)
{
    if (!c->out.len || !c->req) return;
    send_out(c, stream_start(c), 0);
}

/* The upstream's read is all handled: what it made goes out in one write (the events of one
 * read). */
static void on_up_read_end(void *ud)
{
    flush_out(ud);
}

/* ---- passthrough chunks as bytes: members copied, the gateway's appended ---- */

/* The members of a chunk copied into out as runs of the original text: a run grows while
 * members are kept, and a dropped member (the upstream's usage, when ours replaces it) ends
 * it. Most chunks drop nothing and cost one copy. */
typedef struct {
    mg_buf_t *out;
    int skip_usage; /* drop the upstream's usage member (ours replaces it) */
    int runs;
    int clash;               /* a member the gateway adds is there already */
    const char *from, *upto; /* the run not yet copied: [first member's quote, last's end) */
} raw_copy_t;

static void raw_copy_flush(raw_copy_t *rc)
{
    if (!rc->from) return;
    if (rc->runs++) mg_buf_append(rc->out, ",", 1);
    mg_buf_append(rc->out, rc->from, (size_t)(rc->upto - rc->from));
    rc->from = NULL;
}

static int raw_copy_member(void *ud, const mg_json_member_t *m)
{
    raw_copy_t *rc = ud;
    if (is_gateway_member(m)) {
        rc->clash = 1;
        return 1;
    }
    if (rc->skip_usage && member_is(m, "usage")) {
        raw_copy_flush(rc);
        return 0;
    }
    if (!rc->from) rc->from = m->key - 1; /* its opening quote */
    rc->upto = m->value + m->value_len;
    return 0;
}

static void append_metadata_raw(call_t *c, mg_buf_t *o)
{
    mg_buf_append_str(o, ",\"request_id\":\"");
    mg_buf_append_str(o, c->req ? c->req->request_id : "");
    mg_buf_append_str(o, "\",\"logical_model\":");
    mg_json_print_string(c->model->name, strlen(c->model->name), o);
    mg_buf_append_str(o, ",\"actual_model\":");
    mg_json_print_string(c->upstream_model, strlen(c->upstream_model), o);
    append_node_raw(c, o);
    append_degraded_raw(c, o);
    context_annotate_raw(c, o);
}

/* ,"timing":{...} in whole milliseconds, written without printf (every answer pays it). */
static int append_timing_raw(const call_t *c, uint64_t now, mg_buf_t *o)
{
    mg_buf_append_str(o, ",\"timing\":{\"queue_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, c->t_dispatch));
    mg_buf_append_str(o, ",\"first_token_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, c->t_first));
    mg_buf_append_str(o, ",\"total_ms\":");
    mg_buf_append_int(o, (long long)ms_since(c->t_start, now));
    return mg_buf_append(o, "}", 1);
}

/* Usage goes on the finish chunk only when the client did not ask for the usage chunk:
 * a client sees it once, where it asked for it. */
static int usage_on_finish(const call_t *c)
{
    return c->have_usage && !c->client_include_usage;
}

static void append_totals_raw(call_t *c, mg_buf_t *o)
{
    if (usage_on_finish(c)) {
        mg_buf_append_str(o, ",\"usage\":{\"prompt_tokens\":");
        mg_buf_append_int(o, c->prompt_tokens);
        mg_buf_append_str(o, ",\"completion_tokens\":");
        mg_buf_append_int(o, c->completion_tokens);
        mg_buf_append_str(o, ",\"total_tokens\":");
        mg_buf_append_int(o, c->prompt_tokens + c->completion_tokens);
        mg_buf_append(o, "}", 1);
    }
    append_timing_raw(c, uv_hrtime(), o);
}

static int out_raw_chunk_as_is(call_t *c, const char *json, size_t n, int metadata, int totals)
{
    size_t mark = c->out.len;
    raw_copy_t rc = {&c->out, totals && usage_on_finish(c), 0, 0, NULL, NULL};
    mg_buf_append(&c->out, "data: {", 7);
    if (mg_json_members(json, n, raw_copy_member, &rc) != 0 || rc.clash) {
        c->out.len = mark;
        return -1;
    }
    raw_copy_flush(&rc);
    if (!rc.runs) { /* "{}": the members added below would open with a comma */
        c->out.len = mark;
        return -1;
    }
    if (metadata) append_metadata_raw(c, &c->out);
    if (totals) append_totals_raw(c, &c->out);
    mg_buf_append(&c->out, "}\n\n", 3);
    return 0;
}

/* One SSE event into c->out: the chunk's members (its "model" the client's), then metadata
 * and/or totals. Returns 0, or -1 when the bytes are not one JSON object (or clash with our
 * names). */
static int out_raw_chunk(call_t *c, const char *json, size_t n, int metadata, int totals)
{
    mg_buf_t renamed = {0}; /* the few annotated chunks pay a copy for the client's name */
    if (model_renamed(c)) {
        append_with_client_model(c, &renamed, json, n, 0);
        json = renamed.data;
        n = renamed.len;
    }
    int rc = out_raw_chunk_as_is(c, json, n, metadata, totals);
    mg_buf_free(&renamed);
    return rc;
}

/* The usage-only chunk a client that asked for one (stream_options.include_usage) gets when
 * the upstream sent none: our counts (estimate_tokens), in the shape OpenAI streams it. */
void emit_own_usage_chunk(call_t *c)
{
    if (!c->client_include_usage || c->usage_chunk_sent) return;
    estimate_tokens(c);
    cJSON *chunk = cJSON_CreateObject();
    char id[96];
    snprintf(id, sizeof(id), "%s-%s", c->ep == MG_EP_COMPLETIONS ? "cmpl" : "chatcmpl",
             c->req->request_id);
    cJSON_AddStringToObject(chunk, "id", id);
    cJSON_AddStringToObject(
        chunk, "object", c->ep == MG_EP_COMPLETIONS ? "text_completion" : "chat.completion.chunk");
    cJSON_AddNumberToObject(chunk, "created", (double)time(NULL));
    cJSON_AddStringToObject(chunk, "model", c->client_model ? c->client_model : "");
    cJSON_AddItemToObject(chunk, "choices", cJSON_CreateArray());
    cJSON_AddItemToObject(chunk, "usage", usage_json(c));
    out_json(c, chunk);
    cJSON_Delete(chunk);
    c->usage_chunk_sent = 1;
}

void emit_held_finish(call_t *c, int with_totals)
{
    if (c->held_raw.len) {
        int first = c->held_raw_first;
        c->held_raw_first = 0;
        if (out_raw_chunk(c, c->held_raw.data, c->held_raw.len, first, with_totals) != 0)
            out_event(c, c->held_raw.data, c->held_raw.len); /* not ours to change: as is */
        c->held_raw.len = 0;
        return;
    }
    if (!c->held_finish) return;
    /* a client that asked for the usage chunk gets usage there only (an adapter's finish
       chunk carries it: lua/README) */
    if (c->client_include_usage) cJSON_DeleteItemFromObjectCaseSensitive(c->held_finish, "usage");
    if (with_totals) {
        if (usage_on_finish(c) &&
            !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(c->held_finish, "usage")))
            set_item(c->held_finish, "usage", usage_json(c));
        set_item(c->held_finish, "timing", timing_json(c, uv_hrtime()));
    }
    out_json(c, c->held_finish);
    cJSON_Delete(c->held_finish);
    c->held_finish = NULL;
}

/* One canonical chunk (owned) of a Responses call: counted as any, its events made by the
 * front end (responses_call.c). */
static void responses_chunk_of(call_t *c, cJSON *chunk)
{
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(chunk, "usage");
    if (cJSON_IsObject(usage)) take_usage(c, usage);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    if (cJSON_GetArraySize(choices) > 0) {
        c->first_chunk_done = 1;
        c->chunks++;
    }
    for (const cJSON *ch = choices ? choices->child : NULL; ch; ch = ch->next)
        c->finishes += cJSON_IsString(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason"));
    responses_chunk(c, chunk);
    cJSON_Delete(chunk);
}

/* One canonical chunk (owned). Annotates the first and the finishing chunk,
 * folds the usage-only chunk in. */
static void handle_chunk(call_t *c, cJSON *chunk)
{
    if (c->responses) {
        responses_chunk_of(c, chunk);
        return;
    }
    set_client_model(c, chunk);
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(chunk, "usage");
    if (cJSON_IsObject(usage)) take_usage(c, usage);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    int n_choices = cJSON_IsArray(choices) ? cJSON_GetArraySize(choices) : 0;
    if (n_choices == 0 && cJSON_IsObject(usage)) {
        /* the usage-only chunk: its numbers go on the finish chunk */
        emit_held_finish(c, 1);
        if (c->client_include_usage) out_json(c, chunk);
        c->usage_chunk_sent = 1;
        cJSON_Delete(chunk);
        return;
    }
    int finishing = 0;
    for (const cJSON *ch = choices ? choices->child : NULL; ch; ch = ch->next)
        finishing += cJSON_IsString(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason"));
    if (!c->first_chunk_done) {
        add_metadata(c, chunk);
        c->first_chunk_done = 1;
    }
    c->chunks++;
    emit_held_finish(c, 0); /* an earlier choice's finish goes before this chunk: upstream order */
    if (finishing) {
        c->finishes += finishing;
        c->held_finish = chunk;
        return;
    }
    out_json(c, chunk);
    cJSON_Delete(chunk);
}

/* A stream event the upstream sent as an error object. */
int upstream_error_event(call_t *c, const cJSON *err)
{
    const cJSON *msg = cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, "message") : err;
    char text[512];
    snprintf(text, sizeof(text), "upstream error: %s",
             cJSON_IsString(msg) ? msg->valuestring : "unspecified");
    c->stop_stream = 1;
    if (c->xfer) mg_xfer_cancel(c->xfer);
    c->xfer = NULL;
    attempt_end(c, ATTEMPT_FAILED);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done)
        attempt_failed(c, FAIL_ERROR_EVENT);
    else stream_fail(c, "UPSTREAM_ERROR", text);
    return 1;
}

int garbage_event(call_t *c)
{
    c->stop_stream = 1;
    if (c->xfer) mg_xfer_cancel(c->xfer);
    c->xfer = NULL;
    attempt_end(c, ATTEMPT_FAILED);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done)
        attempt_failed(c, FAIL_GARBAGE);
    else stream_fail(c, "UPSTREAM_ERROR", "the provider sent an invalid stream event");
    return 1;
}

/* Read the usage member of a chunk's bytes into the call's counts. */
static int take_usage_member(void *ud, const mg_json_member_t *m)
{
    call_t *c = ud;
    if (!member_is(m, "usage") || !m->value_len || m->value[0] != '{') return 0;
    take_usage_bytes(c, m->value, m->value_len);
    return 1;
}

/* Where an event's JSON starts in its raw bytes (after "data: "), or 0 when its data is not
 * a part of them (data: lines joined). */
static size_t event_lead(const mg_sse_event_t *ev)
{
    int inside = ev->data >= ev->raw && ev->data + ev->data_len <= ev->raw + ev->raw_len;
    return inside ? (size_t)(ev->data - ev->raw) : 0;
}

/* A Responses call's chunk read from its bytes (the common ones: text, the finish, usage),
 * counted as responses_chunk_of counts a tree. 0 = done, 1 = needs the tree. */
static int responses_bytes(call_t *c, const char *json, size_t n)
{
    mg_resp_chunk_t ch;
    if (responses_scan(c, json, n, &ch) != 0 || ch.tree) return 1;
    if (ch.usage) take_usage_bytes(c, ch.usage, ch.usage_len);
    if (ch.choices > 0) {
        c->first_chunk_done = 1;
        c->chunks++;
    }
    c->finishes += ch.finish != NULL;
    responses_scanned(c, &ch);
    return 0;
}

/* An event the gateway annotates, handled as bytes (the common annotated ones: the
 * first chunk, the finish chunk, the usage-only chunk). 0 = done, 1 = needs the tree. */
static int passthrough_raw(call_t *c, const mg_sse_event_t *ev, int flags)
{
    if (flags & MG_CHUNK_ERROR) return 1;
    if (flags & MG_CHUNK_USAGE) mg_json_members(ev->data, ev->data_len, take_usage_member, c);
    int usage_only = (flags & MG_CHUNK_USAGE) && !(flags & MG_CHUNK_FINISH) &&
                     (memmem(ev->data, ev->data_len, "\"choices\":[]", 12) ||
                      memmem(ev->data, ev->data_len, "\"choices\": []", 13));
    if (usage_only) {
        emit_held_finish(c, 1);
        if (c->client_include_usage)
            append_with_client_model(c, &c->out, ev->raw, ev->raw_len, event_lead(ev));
        c->usage_chunk_sent = 1;
        return 0;
    }
    int first = !c->first_chunk_done;
    c->first_chunk_done = 1;
    c->chunks++;
    emit_held_finish(c, 0); /* an earlier choice's finish goes before this chunk: upstream order */
    if (flags & MG_CHUNK_FINISH) {
        c->finishes++;
        mg_buf_append(&c->held_raw, ev->data, ev->data_len);
        c->held_raw_first = first;
        return 0;
    }
    if (out_raw_chunk(c, ev->data, ev->data_len, first, 0) != 0) {
        c->first_chunk_done = !first;
        c->chunks--;
        return 1;
    }
    return 0;
}

/* OpenAI-wire event: forwarded verbatim unless it is one we annotate. Every event but the
 * [DONE] terminator must be a JSON object the client's SDK can parse: the scan that finds the
 * keys we act on checks that too, and a broken event is the provider's garbage (a failover
 * before the first byte, the stream's error end after it), never forwarded. */
static int passthrough_event(call_t *c, const mg_sse_event_t *ev)
{
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) {
        c->upstream_done = 1;
        return 0;
    }
    int flags = mg_chunk_scan_memo(&c->chunk_memo, ev->data, ev->data_len);
    if (flags >= 0) context_take_event(c, ev->data, ev->data_len); /* a session's answer */
    if (flags >= 0) content_take_event(c, ev->data, ev->data_len); /* full logging's */
    if (flags < 0) {
        call_msg(c, MG_LOG_WARN, "upstream %s sent a stream event that is not JSON (%zu bytes)",
                 c->provider->id, ev->data_len);
        return garbage_event(c);
    }
    if (c->responses) {
        if (!(flags & MG_CHUNK_ERROR) && responses_bytes(c, ev->data, ev->data_len) == 0) return 0;
        flags = MG_CHUNK_ERROR; /* what the byte scan leaves is read as a tree */
    }
    if (c->first_chunk_done && !flags) {
        c->chunks++;
        if (c->held_raw.len) emit_held_finish(c, 0); /* n > 1: keep the upstream's order */
        append_with_client_model(c, &c->out, ev->raw, ev->raw_len, event_lead(ev));
        return 0;
    }
    if (passthrough_raw(c, ev, flags) == 0) return 0;
    cJSON *chunk = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!cJSON_IsObject(chunk)) {
        cJSON_Delete(chunk);
        return garbage_event(c);
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(chunk, "error");
    if (err && !cJSON_IsNull(err)) {
        int rc = upstream_error_event(c, err);
        cJSON_Delete(chunk);
        return rc;
    }
    handle_chunk(c, chunk);
    return 0;
}

/* Translating adapter: one event (owned `data`, JSON null for a stream_eof adapter's clean
 * end) decoded by Lua into canonical chunks. */
static int translated_data(call_t *c, cJSON *data)
{
    cJSON *chunks = NULL;
    int done = 0;
    char err[512];
    if (c->state_ref < 0) c->state_ref = mg_gen_table_new(c->gen); /* only translators keep state */
    int rc = mg_gen_decode_event(c->gen, c->adapter, req_table(c), c->state_ref, data, &chunks,
                                 &done, err, sizeof(err));
    cJSON_Delete(data);
    if (rc != 0) {
        call_msg(c, MG_LOG_WARN, "adapter %s decode_event: %s", c->provider->adapter, err);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "message", err);
        rc = upstream_error_event(c, e);
        cJSON_Delete(e);
        return rc;
    }
    cJSON *ch = chunks->child;
    while (ch) {
        cJSON *next = ch->next;
        cJSON_DetachItemViaPointer(chunks, ch);
        context_take_chunk(c, ch);
        content_take_chunk(c, ch);
        handle_chunk(c, ch);
        ch = next;
    }
    cJSON_Delete(chunks);
    if (done) c->upstream_done = 1;
    return 0;
}

static int translated_event(call_t *c, const mg_sse_event_t *ev)
{
    cJSON *data = cJSON_ParseWithLength(ev->data, ev->data_len);
    if (!data) return garbage_event(c);
    return translated_data(c, data);
}

/* An upstream wire without an end marker (M.stream_eof): its adapter is told of the clean
 * end, so it can close the answer. 1 = the call went on (an error end). */
static int translated_eof(call_t *c)
{
    if (c->passthrough || c->native || c->native_resp || c->upstream_done || c->stop_stream)
        return 0;
    if (!c->gen->adapters[c->adapter].stream_eof) return 0;
    cJSON *null = cJSON_CreateNull();
    if (!null) return 0;
    return translated_data(c, null);
}

static int on_stream_event(void *ud, const mg_sse_event_t *ev)
{
    call_t *c = ud;
    if (c->stop_stream) return 1;
    if (c->native) return msgs_native_event(c, ev);
    if (c->native_resp) return resp_native_event(c, ev);
    return c->passthrough ? passthrough_event(c, ev) : translated_event(c, ev);
}

/* ------------------------------------------------------------------------ */
/* Upstream callbacks                                                        */
/* ------------------------------------------------------------------------ */

static void on_up_headers(void *ud, int status)
{
    call_t *c = ud;
    c->up_status = status;
    const char *ra = mg_xfer_header(c->xfer, "retry-after");
    size_t ral = ra ? strnlen(ra, sizeof(c->retry_after) - 1) : 0;
    if (ral) memcpy(c->retry_after, ra, ral);
    c->retry_after[ral] = '\0';
    free(c->error_headers); /* the last attempt's */
    c->error_headers =
        status >= 400 ? mg_xfer_take_error_headers(c->xfer, &c->error_headers_len) : NULL;
    c->resp.len = 0;
    if (status >= 200 && status < 300 && c->stream) {
        /* each attempt's stream is framed afresh, in its adapter's mode: an attempt that
           failed before the first byte may have left an event half read or the stop flag
           set, and the next provider may speak the other wire */
        if (c->sse_ready) mg_sse_free(&c->sse);
        mg_sse_init(&c->sse, c->ndjson ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE);
        c->sse_ready = 1;
        c->stop_stream = 0;
        /* no reserve: c->out grows (doubling) to what the events of one read need; an idle
           open stream then holds a few hundred bytes here, not a read's worth
           (bench/trials.mjs memory, idle SSE streams) */
    }
}

static int on_up_data(void *ud, const char *data, size_t len)
{
    call_t *c = ud;
    int ok_status = c->up_status >= 200 && c->up_status < 300;
    if (ok_status && !c->t_first) c->t_first = uv_hrtime();
    if (ok_status && c->stream) {
        int rc = mg_sse_feed(&c->sse, data, len, on_stream_event, c);
        if (rc > 0) return 0; /* an event handler finished the call or moved it on: c may be gone */
        if (rc < 0) {
            if (!c->stop_stream) {
                c->stop_stream = 1;
                mg_xfer_cancel(c->xfer);
                c->xfer = NULL;
                attempt_end(c, ATTEMPT_FAILED);
                stream_fail(c, "UPSTREAM_ERROR", "stream event too large");
            }
            return 0; /* the call is finished (or moved on); the transfer is cancelled */
        }
        /* the events go out in on_up_read_end: one write per upstream read; a client that
           has not taken what was written pauses the upstream (on_client_drain resumes it) */
        if (!c->req || !mg_http_write_pending(c->req)) return 0;
        c->paused_by_client = 1;
        return 1;
    }
    size_t limit = ok_status ? MAX_RESPONSE_BYTES : MAX_ERROR_BODY_BYTES;
    size_t have = c->resp.len;
    if (have + len > limit) len = have < limit ? limit - have : 0;
    if (len) mg_buf_append(&c->resp, data, len);
    return 0;
}

static int parse_retry_after_ms(const char *v)
{
    if (!v || !*v) return 0;
    char *end;
    double secs = strtod(v, &end);
    if (end == v || secs < 0) return 0;
    if (secs > 3600) secs = 3600;
    return (int)(secs * 1000);
}

/* A string member of an upstream error (a number, as some servers send codes, as text). */
static const char *error_member(const cJSON *err, const char *key, char *buf, size_t cap)
{
    const cJSON *v = cJSON_IsObject(err) ? cJSON_GetObjectItemCaseSensitive(err, key) : NULL;
    if (cJSON_IsString(v) && v->valuestring[0]) return v->valuestring;
    if (cJSON_IsNumber(v)) {
        snprintf(buf, cap, "%lld", mg_json_ll(v, 0));
        return buf;
    }
    return NULL;
}

/* A 4xx the client caused (the provider works): the client gets the upstream's error as it
 * was, its status, code, type, param and message (OpenAI's {"error":{...}}, or the
 * {"error":"text"} of Ollama and others), with the gateway's request_id added. */
static void upstream_rejected(call_t *c)
{
    cJSON *j = c->resp.len ? cJSON_ParseWithLength(c->resp.data, c->resp.len) : NULL;
    const cJSON *err = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    char codebuf[32], msgbuf[96];
    const char *msg =
        cJSON_IsString(err) ? err->valuestring : error_member(err, "message", NULL, 0);
    if (!msg) {
        snprintf(msgbuf, sizeof(msgbuf), "the provider rejected the request (HTTP %d)",
                 c->up_status);
        msg = msgbuf;
    }
    call_fail_upstream(c, c->up_status, error_member(err, "code", codebuf, sizeof(codebuf)),
                       error_member(err, "type", NULL, 0), error_member(err, "param", NULL, 0),
                       msg);
    cJSON_Delete(j);
}

/* Make a gateway-built or decoded answer match the OpenAI schema where upstreams
 * are lax: choices carry logprobs, chat messages carry refusal. */
static void conform_response(call_t *c, cJSON *resp)
{
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    for (cJSON *ch = choices ? choices->child : NULL; ch; ch = ch->next) {
        if (!cJSON_HasObjectItem(ch, "logprobs")) cJSON_AddNullToObject(ch, "logprobs");
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        if (cJSON_IsObject(msg) && !cJSON_HasObjectItem(msg, "refusal"))
            cJSON_AddNullToObject(msg, "refusal");
    }
}

typedef struct {
    call_t *c;
    int members;
    int clash; /* the upstream already uses one of our metadata names */
} resp_scan_t;

static int scan_response_member(void *ud, const mg_json_member_t *m)
{
    resp_scan_t *st = ud;
    st->members++;
    if (member_is(m, "usage") && m->value_len && m->value[0] == '{') {
        take_usage_bytes(st->c, m->value, m->value_len);
    } else if (is_gateway_member(m)) {
        st->clash = 1;
    }
    return 0;
}

/* Passthrough answers are forwarded as the upstream wrote them, with the gateway's
 * metadata appended as extra members: no tree is built. Returns 0 when c->answer holds the
 * answer, 1 when the tree path must handle it, -1 when the body is not a JSON object. */
static int passthrough_answer(call_t *c)
{
    resp_scan_t st = {c, 0, 0};
    if (mg_json_members(c->resp.data, c->resp.len, scan_response_member, &st) != 0) return -1;
    if (st.clash || st.members == 0) return 1;
    const char *end = c->resp.data + c->resp.len;
    while (end > c->resp.data && end[-1] != '}') end--;
    mg_buf_t *out = &c->answer;
    out->len = 0;
    /* the metadata below in one allocation: the names' escaping reserve included, so the
       buffer never grows (a realloc and a copy each) */
    size_t names = strlen(c->model->name) + strlen(c->upstream_model) + strlen(node_id(c));
    mg_buf_reserve(out, c->resp.len + 6 * names + 330);
    append_with_client_model(c, out, c->resp.data, (size_t)(end - 1 - c->resp.data), 0);
    mg_buf_append_str(out, ",\"request_id\":\"");
    mg_buf_append_str(out, c->req->request_id);
    mg_buf_append_str(out, "\",\"logical_model\":");
    mg_json_print_string(c->model->name, strlen(c->model->name), out);
    mg_buf_append_str(out, ",\"actual_model\":");
    mg_json_print_string(c->upstream_model, strlen(c->upstream_model), out);
    append_node_raw(c, out);
    append_degraded_raw(c, out);
    context_annotate_raw(c, out);
    if (append_timing_raw(c, uv_hrtime(), out) != 0 || mg_buf_append(out, "}", 1) != 0) {
        out->len = 0;
        return 1;
    }
    return 0;
}

/* The answer is not one the gateway can pass on: the next entry. */
mg_step_rc_t answer_garbage(call_t *c)
{
    attempt_end(c, ATTEMPT_FAILED);
    c->last_fail = FAIL_GARBAGE;
    c->step = STEP_RESERVE;
    return MG_STEP_NEXT;
}

/* A whole answer, upstream's tree decoded (translating adapters) and made to conform. */
static mg_step_rc_t tree_answer(call_t *c)
{
    cJSON *resp = cJSON_ParseWithLength(c->resp.data ? c->resp.data : "", c->resp.len);
    if (!cJSON_IsObject(resp)) {
        cJSON_Delete(resp);
        return answer_garbage(c);
    }
    if (!c->passthrough) {
        cJSON *decoded = NULL;
        char err[512];
        int rc = mg_gen_decode(c->gen, c->adapter, req_table(c), resp, &decoded, err, sizeof(err));
        cJSON_Delete(resp);
        if (rc != 0) {
            call_msg(c, MG_LOG_WARN, "adapter %s decode: %s", c->provider->adapter, err);
            return answer_garbage(c);
        }
        resp = decoded;
    }
    take_usage(c, cJSON_GetObjectItemCaseSensitive(resp, "usage"));
    if (c->responses) return responses_answer(c, resp);
    if (c->ep != MG_EP_EMBEDDINGS) conform_response(c, resp);
    set_client_model(c, resp);
    add_metadata(c, resp);
    set_item(resp, "timing", timing_json(c, uv_hrtime()));
    c->answer.len = 0;
    int rc = mg_json_print(resp, &c->answer);
    cJSON_Delete(resp);
    attempt_end(c, ATTEMPT_OK);
    if (rc != 0) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    return MG_STEP_NEXT;
}

/* The end of a stream the upstream finished. */
static mg_step_rc_t stream_end(call_t *c)
{
    if (c->sse_ready && mg_sse_pending(&c->sse) > 0 && c->ndjson) {
        /* NDJSON's last line may come without its newline */
        if (mg_sse_feed(&c->sse, "\n", 1, on_stream_event, c) > 0) return MG_STEP_DONE;
    }
    if (translated_eof(c) > 0) return MG_STEP_DONE;
    /* [DONE] (or the adapter's done), or a finish_reason for every choice: an upstream that
       then closes without [DONE] gave a complete answer */
    if (c->upstream_done || c->finishes >= c->n_choices) {
        attempt_end(c, ATTEMPT_OK);
        c->answer_kind = ANSWER_STREAM;
        c->status = 200;
        c->outcome = "ok";
        return MG_STEP_NEXT;
    }
    attempt_end(c, ATTEMPT_FAILED);
    if (!c->client_started && c->out.len == 0 && !c->first_chunk_done) {
        c->last_fail = FAIL_GARBAGE;
        c->step = STEP_RESERVE;
        return MG_STEP_NEXT;
    }
    return stream_error(c, "UPSTREAM_ERROR", "the upstream stream ended before completion");
}

/* The stream step: the upstream's answer is complete (on_up_done resumes the call here). */
mg_step_rc_t step_stream(call_t *c)
{
    if (c->stream) return stream_end(c);
    c->answer_kind = ANSWER_JSON;
    c->status = 200;
    c->outcome = "ok";
    if (c->native) return msgs_native_answer(c);
    if (c->native_resp) return resp_native_answer(c);
    if (c->passthrough && c->responses) {
        /* read from its bytes when strict JSON with only what most answers carry */
        mg_resp_chunk_t ch;
        if (c->resp.len && mg_chunk_scan(c->resp.data, c->resp.len) >= 0 &&
            mg_resp_chunk_scan(c->resp.data, c->resp.len, "message", &ch) == 0 && !ch.tree) {
            if (ch.usage) take_usage_bytes(c, ch.usage, ch.usage_len);
            return responses_answer_scanned(c, &ch);
        }
    }
    if (c->passthrough && !c->responses) {
        int rc = passthrough_answer(c);
        if (rc < 0) return answer_garbage(c);
        if (rc == 0) {
            attempt_end(c, ATTEMPT_OK);
            return MG_STEP_NEXT;
        }
    }
    return tree_answer(c);
}

/* Whether a deadline that passed is the client side's doing rather than the provider's:
 * the client read the stream slower than the upstream sent it (the upstream was paused
 * waiting for it), or the deadline was one the client set below the configured one. */
static int client_deadline(const call_t *c, mg_xfer_result_t r)
{
    if (r == MG_XFER_FIRST_BYTE_TIMEOUT) return c->own_first_token;
    if (r == MG_XFER_TOTAL_TIMEOUT) return c->paused_by_client || c->own_total;
    if (r == MG_XFER_IDLE_TIMEOUT) return c->paused_by_client;
    return 0;
}

/* A deadline the client side caused passed: the request ends as a timeout (after the first
 * byte, the stream's error end), and the provider learns nothing from it. */
static void client_timed_out(call_t *c, mg_xfer_result_t r)
{
    attempt_end(c, ATTEMPT_CLIENT);
    c->ended_by = "client";
    const char *why = c->paused_by_client
                          ? "the answer did not complete in time: the client read it slower than "
                            "the provider sent it"
                          : "the answer did not complete within the time the request allowed";
    if (c->stream && (c->client_started || c->out.len > 0 || c->first_chunk_done)) {
        stream_fail(c, "INFERENCE_TIMEOUT", why);
        return;
    }
    c->fail_degraded = NULL;
    call_fail(c, 408, r == MG_XFER_FIRST_BYTE_TIMEOUT ? "FIRST_TOKEN_TIMEOUT" : "INFERENCE_TIMEOUT",
              why, 0);
}

static void on_up_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    call_t *c = ud;
    c->xfer = NULL;
    c->unreachable = result == MG_XFER_CONNECT_ERROR;
    int status = c->up_status;
    mg_metrics_t *m = c->pl->metrics;
    if (result == MG_XFER_FIRST_BYTE_TIMEOUT) m->timeouts_by[MG_TIMEOUT_FIRST_TOKEN]++;
    else if (result == MG_XFER_TOTAL_TIMEOUT) m->timeouts_by[MG_TIMEOUT_INFERENCE]++;
    else if (result == MG_XFER_IDLE_TIMEOUT) m->timeouts_by[MG_TIMEOUT_IDLE]++;
    if (result != MG_XFER_OK && client_deadline(c, result)) {
        client_timed_out(c, result);
        return;
    }
    if (result != MG_XFER_OK) {
        attempt_end(c, ATTEMPT_FAILED);
        c->ended_by = "upstream";
        if (c->stream && (c->client_started || c->out.len > 0 || c->first_chunk_done)) {
            int timeout = result == MG_XFER_IDLE_TIMEOUT || result == MG_XFER_TOTAL_TIMEOUT;
            c->last_fail = timeout ? FAIL_STALLED : FAIL_BROKEN;
            stream_fail(c, timeout ? "UPSTREAM_TIMEOUT" : "UPSTREAM_ERROR",
                        timeout ? "the upstream stalled mid-stream"
                                : "the upstream connection failed mid-stream");
            return;
        }
        fail_kind_t why = result == MG_XFER_CONNECT_ERROR        ? FAIL_CONNECT
                          : result == MG_XFER_FIRST_BYTE_TIMEOUT ? FAIL_TIMEOUT
                          : result == MG_XFER_TOTAL_TIMEOUT      ? FAIL_TIMEOUT_TOTAL
                          : result == MG_XFER_IDLE_TIMEOUT       ? FAIL_STALLED
                                                                 : FAIL_BROKEN;
        call_msg(c, MG_LOG_INFO, "upstream %s attempt failed: %s", c->provider->id,
                 detail ? detail : "error");
        attempt_failed(c, why);
        return;
    }
    if (status == 429 || status >= 500 || status == 401 || status == 403) {
        attempt_end(c, ATTEMPT_FAILED);
        if (status == 429) {
            int ra = parse_retry_after_ms(c->retry_after);
            if (ra > c->retry_after_ms) c->retry_after_ms = ra;
        }
        call_msg(c, MG_LOG_INFO, "upstream %s answered %d", c->provider->id, status);
        attempt_failed(c, status == 429   ? FAIL_RATE_LIMITED
                          : status >= 500 ? FAIL_SERVER
                                          : FAIL_AUTH);
        return;
    }
    if (status >= 400 && status < 500) {
        attempt_end(c, ATTEMPT_OK); /* the provider works; the request was wrong */
        c->ended_by = "upstream";
        upstream_rejected(c);
        return;
    }
    if (status < 200 || status >= 300) { /* not an answer: a redirect, an interim status */
        attempt_end(c, ATTEMPT_FAILED);
        attempt_failed(c, FAIL_GARBAGE);
        return;
    }
    call_resume(c, STEP_STREAM);
}

const mg_xfer_cbs_t mg_call_xfer_cbs = {on_up_headers, on_up_data, on_up_done, on_up_read_end};
