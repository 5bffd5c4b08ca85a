/* content: a call's prompt and answer in the request log while the full logging window is
 * open (obs/fulllog.h), secrets masked (base/redact.h); outside it, nothing of either.
 *
 * The prompt is the request body as the client sent it (what prompt_hash hashes); the
 * answer is the JSON answer as sent, or a stream's content deltas put together (an
 * Anthropic pass-through stream's text deltas: messages_native.c; captured
 * only while the window is open: a closed window costs a stream one branch per event).
 * Each is logged up to MG_FULLLOG_FIELD_MAX bytes, the rest cut and said so. */
#include "pipeline/call.h"

#include <stdlib.h>
#include <string.h>

#include "base/redact.h"

static int window_open(const call_t *c)
{
    return mg_fulllog_on(c->pl->fulllog);
}

void content_take_chunk(call_t *c, const cJSON *chunk)
{
    if (!window_open(c) || c->full_answer.len >= MG_FULLLOG_FIELD_MAX) return;
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    const cJSON *ch = cJSON_IsArray(choices) ? choices->child : NULL;
    const cJSON *delta = ch ? cJSON_GetObjectItemCaseSensitive(ch, "delta") : NULL;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(delta, "content");
    if (!cJSON_IsString(text)) return;
    size_t n = strlen(text->valuestring), room = MG_FULLLOG_FIELD_MAX - c->full_answer.len;
    mg_buf_append(&c->full_answer, text->valuestring, n < room ? n : room);
}

void content_take_event(call_t *c, const char *json, size_t n)
{
    if (!window_open(c)) return;
    cJSON *chunk = cJSON_ParseWithLength(json, n);
    if (chunk) content_take_chunk(c, chunk);
    cJSON_Delete(chunk);
}

/* The event's text at delta (inner NULL: delta is the text itself) kept, within the cap. */
static void take_delta_text(call_t *c, const char *json, size_t n, const char *inner)
{
    if (!window_open(c) || c->full_answer.len >= MG_FULLLOG_FIELD_MAX) return;
    cJSON *ev = cJSON_ParseWithLength(json, n);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(ev, "delta");
    if (inner) text = cJSON_GetObjectItemCaseSensitive(text, inner);
    if (cJSON_IsString(text)) {
        size_t len = strlen(text->valuestring), room = MG_FULLLOG_FIELD_MAX - c->full_answer.len;
        mg_buf_append(&c->full_answer, text->valuestring, len < room ? len : room);
    }
    cJSON_Delete(ev);
}

void content_take_anthropic(call_t *c, const char *json, size_t n)
{
    take_delta_text(c, json, n, "text"); /* a text_delta's */
}

void content_take_responses(call_t *c, const char *json, size_t n)
{
    take_delta_text(c, json, n, NULL);
}

void content_log_end(call_t *c, mg_logline_t *l)
{
    if (!c->req || !window_open(c)) {
        mg_log_end(l);
        return;
    }
    size_t plen = 0, alen = 0, n[2] = {0, 0};
    const char *prompt = prompt_bytes(c, &plen);
    const char *answer = c->answer_kind == ANSWER_JSON ? c->answer.data : c->full_answer.data;
    alen = c->answer_kind == ANSWER_JSON ? c->answer.len : c->full_answer.len;
    int cut = plen > MG_FULLLOG_FIELD_MAX || alen > MG_FULLLOG_FIELD_MAX, m[2] = {0, 0};
    char *red[2] = {
        mg_redact(prompt ? prompt : "", plen < MG_FULLLOG_FIELD_MAX ? plen : MG_FULLLOG_FIELD_MAX,
                  &n[0], &m[0]),
        mg_redact(answer ? answer : "", alen < MG_FULLLOG_FIELD_MAX ? alen : MG_FULLLOG_FIELD_MAX,
                  &n[1], &m[1]),
    };
    mg_log_str(l, "log_mode", "full");
    mg_log_int(l, "secrets_masked", m[0] + m[1]);
    if (cut) mg_log_bool(l, "content_cut", 1);
    if (!red[0] || !red[1]) {
        mg_log_bool(l, "content_dropped", 1); /* out of memory: never the unmasked text */
        mg_log_end(l);
    } else {
        const char *keys[2] = {"prompt", "answer"};
        const char *vals[2] = {red[0], red[1]};
        mg_log_end_long(l, 2, keys, vals, n);
    }
    free(red[0]);
    free(red[1]);
}
