/* messages_count: POST /v1/messages/count_tokens, answered by the gateway itself with its
 * own tokenizer (no upstream is asked): {"input_tokens": N}.
 *
 * The count is the canonical request's as the model's encoding counts it (models.<name>.
 * tokenizer; o200k_base when the model names none but it is loaded): every message's text,
 * the system prompt, tool calls' arguments and tool definitions, plus the three tokens per
 * message (and three for the reply's start) that chat formats add. An image counts as
 * MSGS_IMAGE_TOKENS, Anthropic's figure for a full-size one (width x height / 750 at 1.15
 * megapixels): its size is not read. Without any loaded encoding, the bytes / 4. The caller
 * is authenticated as for a call (Authorization or x-api-key); errors in Anthropic's shape. */
#include "pipeline/pipeline.h"

#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "obs/answer.h"
#include "pipeline/messages_req.h"
#include "pipeline/messages_resp.h"
#include "token/registry.h"
#include "token/tokenize.h"

#define MSGS_IMAGE_TOKENS 1600
#define MSGS_PER_MESSAGE 3

static void count_error(mg_pipeline_t *pl, mg_http_req_t *req, int status, const char *code,
                        const char *msg)
{
    mg_buf_t body = {0};
    mg_msgs_error_body(&body, status, code, msg, req->request_id);
    mg_answer_json(pl->metrics, req, MG_EP_MESSAGES, status, NULL, body.data, body.len);
    mg_buf_free(&body);
}

static long count_text(const mg_encoding_t *e, const char *s)
{
    size_t n = strlen(s);
    long t = e ? mg_tokenize_count(e, s, n, 0) : -1;
    return t >= 0 ? t : (long)(n / 4);
}

static long count_value(const mg_encoding_t *e, const cJSON *v)
{
    if (cJSON_IsString(v)) return count_text(e, v->valuestring);
    mg_buf_t text = {0};
    mg_json_print(v, &text);
    long n = text.len ? count_text(e, text.data) : 0;
    mg_buf_free(&text);
    return n;
}

/* One canonical message: its content (a string or parts), its tool calls. */
static long count_message(const mg_encoding_t *e, const cJSON *m)
{
    long n = MSGS_PER_MESSAGE;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(content)) n += count_text(e, content->valuestring);
    for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(text)) n += count_text(e, text->valuestring);
        else if (cJSON_GetObjectItemCaseSensitive(p, "image_url")) n += MSGS_IMAGE_TOKENS;
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    for (const cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next)
        n += count_value(e, cJSON_GetObjectItemCaseSensitive(tc, "function"));
    return n;
}

static long count_chat(const mg_encoding_t *e, const cJSON *chat)
{
    long n = MSGS_PER_MESSAGE;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(chat, "messages");
    for (const cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next)
        n += count_message(e, m);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(chat, "tools");
    if (cJSON_IsArray(tools) && tools->child) n += count_value(e, tools);
    return n;
}

static const mg_encoding_t *encoding_of(const mg_model_conf_t *m)
{
    const mg_encoding_t *e = m && m->tokenizer > 0 ? mg_token_registry_get(m->tokenizer - 1) : NULL;
    return e ? e : mg_token_registry_get(MG_ENC_O200K);
}

void mg_pipeline_count_tokens(void *pipeline, mg_http_req_t *req)
{
    mg_pipeline_t *pl = pipeline;
    const mg_config_t *cfg = mg_gens_current(pl->gens)->cfg;
    mg_msgs_request_id_header(req);
    if (cfg->auth_enabled) {
        mg_auth_result_t r;
        if (mg_auth_authenticate(pl->auth, req, mg_unix_ms(), &r) != 0) {
            count_error(pl, req, r.status, r.code, r.message);
            return;
        }
    }
    mg_buf_t chat = {0};
    char err[400];
    int rc = req->body_len ? mg_msgs_request(req->body, req->body_len, 1, &chat, err, sizeof(err))
                           : (snprintf(err, sizeof(err), "request body is empty"), -1);
    if (rc == 1) rc = 0; /* what the canonical form left out is not counted */
    cJSON *tree = rc == 0 ? cJSON_ParseWithLength(chat.data, chat.len) : NULL;
    mg_buf_free(&chat);
    if (!tree) {
        count_error(pl, req, rc == -1 ? 400 : 500, rc == -1 ? "INVALID_REQUEST" : "INTERNAL_ERROR",
                    rc == -1 ? err : "out of memory");
        return;
    }
    const char *model = cJSON_GetObjectItemCaseSensitive(tree, "model")->valuestring;
    const mg_model_conf_t *m = mg_config_model(cfg, model);
    if (!m) {
        char msg[300];
        snprintf(msg, sizeof(msg), "model '%.200s' does not exist", model);
        cJSON_Delete(tree);
        count_error(pl, req, 404, "MODEL_NOT_FOUND", msg);
        return;
    }
    long n = count_chat(encoding_of(m), tree);
    cJSON_Delete(tree);
    char body[64];
    int len = snprintf(body, sizeof(body), "{\"input_tokens\":%ld}", n);
    mg_answer_json(pl->metrics, req, MG_EP_MESSAGES, 200, NULL, body, (size_t)len);
}
