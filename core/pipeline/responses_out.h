/* responses_out: a chat engine's answer (Chat Completions chunks, or a whole completion) as
 * a Responses API answer: the Response object and its stream of events.
 *
 * One state machine serves both: a stream feeds it each chunk as it arrives and sends the
 * events it writes; a whole completion is fed as one chunk with no events written. Output
 * items, in the order the engine produces them: a reasoning item (summary_text from the
 * engine's reasoning_content), a message (output_text), one function_call per tool call
 * (each its own output index, arguments streamed as the engine's deltas arrive and given
 * whole in .done). Every event carries sequence_number from 0; the Response of
 * response.created, response.in_progress and response.completed has the same id.
 *
 * The event order: response.created, response.in_progress, then per item
 * response.output_item.added, (content_part.added | reasoning_summary_part.added), the
 * deltas, their .done events, response.output_item.done; response.completed (or
 * response.incomplete when the engine stopped at its token limit or a content filter, or
 * response.failed when the stream broke) with the output and usage.
 *
 * Pure: cJSON in, bytes out, no I/O, any thread. Not thread-safe per object. */
#ifndef MG_RESPONSES_OUT_H
#define MG_RESPONSES_OUT_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "base/json.h"

typedef struct mg_resp_out_s mg_resp_out_t;

/* A new answer for Response id `id` ("resp_..."; item ids are made from it), created at
 * created_at (unix seconds), for the client's model name; skeleton (taken: see
 * mg_resp_skeleton) holds the members that echo the request. NULL when out of memory. */
mg_resp_out_t *mg_resp_out_new(const char *id, int64_t created_at, const char *model,
                               cJSON *skeleton);
void mg_resp_out_free(mg_resp_out_t *o);

/* One Chat Completions chunk (choices[0].delta: content, reasoning_content or reasoning,
 * tool_calls; finish_reason; usage), borrowed. The events it makes are appended to out as
 * SSE ("event: T\ndata: {...}\n\n"), the first call's preceded by response.created and
 * response.in_progress; out NULL: none. */
void mg_resp_out_chunk(mg_resp_out_t *o, const cJSON *chunk, mg_buf_t *out);

/* A whole chat completion (choices[0].message, finish_reason, usage), borrowed: the same as
 * one chunk whose delta is the message. */
void mg_resp_out_completion(mg_resp_out_t *o, const cJSON *completion);

/* The answer is complete: open items closed, then response.completed (or .incomplete) into
 * out (NULL: none). Returns the final Response object (borrowed from o). */
const cJSON *mg_resp_out_end(mg_resp_out_t *o, mg_buf_t *out);

/* The answer broke off: response.failed with the output so far and error {code, message}
 * into out. code is one of the Responses API's error codes ("server_error", ...). */
void mg_resp_out_fail(mg_resp_out_t *o, const char *code, const char *message, mg_buf_t *out);

/* The usage the engine reported (0 counts when none): Chat's prompt/completion tokens. */
void mg_resp_out_usage(const mg_resp_out_t *o, long long *input, long long *output);
/* Set the usage when the engine reported none (the gateway's own count). */
void mg_resp_out_set_usage(mg_resp_out_t *o, long long input, long long output);

/* The answer as one assistant chat message (content, tool_calls), a new tree: what a
 * follow-up's history replays. NULL when out of memory. */
cJSON *mg_resp_out_message(const mg_resp_out_t *o);

#endif
