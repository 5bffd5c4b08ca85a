/* messages_resp: the gateway's canonical answer (a Chat Completions object, whichever route
 * served it) as an Anthropic Message, and the gateway's errors in Anthropic's error shape:
 *
 *   {"type":"error","error":{"type":"not_found_error","message":"MODEL_NOT_FOUND: ..."},
 *    "request_id":"..."}
 *
 * The canonical form carries a few members of its own for what Chat Completions has no
 * field for (adapters/anthropic.lua sets them, the stream's chunks carry the same):
 *   message.thinking_blocks            [{type:"thinking",thinking,signature} |
 *                                       {type:"redacted_thinking",data}], in order, byte for
 *                                      byte (else message.reasoning_content, or .reasoning, as
 *                                      vLLM and DeepSeek send it, is one thinking block)
 *   choice.stop_reason                 the stop sequence that matched (vLLM's member), or an
 *                                      Anthropic stop reason passed through (refusal,
 *                                      pause_turn, model_context_window_exceeded)
 *   usage.cache_creation_input_tokens  Anthropic's cache writes (cache reads are
 *                                      prompt_tokens_details.cached_tokens)
 * Pure; any thread. */
#ifndef MG_MESSAGES_RESP_H
#define MG_MESSAGES_RESP_H

#include <cjson/cJSON.h>

#include "base/json.h"

struct mg_http_req_s;

/* The counts of a canonical usage object as Anthropic counts them: input_tokens without the
 * cache reads and writes. */
typedef struct {
    long long input, output, cache_read, cache_write;
} mg_msgs_usage_t;

/* usage (a Chat Completions usage object) into *u; 1 when it had counts. */
int mg_msgs_usage(const cJSON *usage, mg_msgs_usage_t *u);
/* {"input_tokens":..,"output_tokens":..,"cache_creation_input_tokens":..,
 *  "cache_read_input_tokens":..} appended. */
int mg_msgs_usage_print(const mg_msgs_usage_t *u, mg_buf_t *out);

/* The Anthropic stop reason of a choice's finish_reason (and the choice's stop_reason, see
 * above); *sequence set to the matched stop string, or NULL. */
const char *mg_msgs_stop_reason(const cJSON *choice, const char **sequence);

/* The Message for the canonical answer json[0..n): id, the client's model name, and the
 * call's counts used when the answer carries none. 0, -1 when the answer is not a Chat
 * Completions object, -2 out of memory. */
int mg_msgs_answer(const char *json, size_t n, const char *id, const char *model,
                   const mg_msgs_usage_t *fallback, mg_buf_t *out);

/* Anthropic's error type for a status and the gateway's code (overloaded_error for a
 * provider that is unavailable or a gateway that sheds load). */
const char *mg_msgs_error_type(int status, const char *code);
/* The error body appended: the message prefixed with the gateway's code. 0 or -1. */
int mg_msgs_error_body(mg_buf_t *out, int status, const char *code, const char *message,
                       const char *request_id);

/* The same with Anthropic's error type given. */
int mg_msgs_error_body_typed(mg_buf_t *out, const char *type, const char *code, const char *message,
                             const char *request_id);

/* Every answer head of req carries "request-id: <the request id>", the header Anthropic's
 * SDKs read (X-Request-Id stays too). */
void mg_msgs_request_id_header(struct mg_http_req_s *req);

#endif
