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
 * A chunk is read from its bytes when it carries only what most do (text, reasoning text, a
 * finish reason, usage: mg_resp_chunk_scan), else from its tree; events and the Response are
 * written as text either way.
 *
 * Pure: chunk bytes or cJSON in, bytes out, no I/O, any thread. Not thread-safe per object. */
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
/* The same with the skeleton's text (mg_resp_skeleton_print: one object, compact; borrowed),
 * or NULL. */
mg_resp_out_t *mg_resp_out_new_printed(const char *id, int64_t created_at, const char *model,
                                       const char *skeleton, size_t len);
void mg_resp_out_free(mg_resp_out_t *o);

/* One Chat Completions chunk (choices[0].delta: content, reasoning_content or reasoning,
 * tool_calls; finish_reason; usage), borrowed. The events it makes are appended to out as
 * SSE ("event: T\ndata: {...}\n\n"), the first call's preceded by response.created and
 * response.in_progress; out NULL: none. */
void mg_resp_out_chunk(mg_resp_out_t *o, const cJSON *chunk, mg_buf_t *out);

/* A whole chat completion (choices[0].message, finish_reason, usage), borrowed: the same as
 * one chunk whose delta is the message. */
void mg_resp_out_completion(mg_resp_out_t *o, const cJSON *completion);

/* What a chunk (or completion) carries that the answer takes, read from its bytes: pointers
 * into them. The chunk's first choice's `key` object ("delta" of a stream chunk, "message" of
 * a whole completion) gives content and reasoning (reasoning_content, else reasoning) as JSON
 * string literals, quotes included; tree is set when the chunk holds what only the tree
 * path reads (tool calls, several choices, a choice other than index 0, an escaped key):
 * then nothing else is set and the caller gives mg_resp_out_chunk its tree. */
typedef struct mg_resp_chunk_s {
    const char *content, *reasoning; /* literals, or NULL */
    size_t content_len, reasoning_len;
    const char *finish; /* finish_reason's text between its quotes (no escapes), or NULL */
    size_t finish_len;
    const char *usage; /* the usage object's text, or NULL */
    size_t usage_len;
    int choices; /* elements of choices */
    int tree;
} mg_resp_chunk_t;

/* Scan json[0..n), which must be strict JSON (mg_chunk_scan accepts it: the stream's and the
 * answer's bytes are checked so before they come here), its strings then copied as they are.
 * 0 (see ch->tree), or -1 when it is not an object. */
int mg_resp_chunk_scan(const char *json, size_t n, const char *key, mg_resp_chunk_t *ch);

/* mg_resp_chunk_scan of a stream chunk ("delta") that mg_chunk_scan_memo(memo, json, n) just
 * checked: a chunk that is the memo's template with strings swapped is read by what the
 * scan found in the template, at its strings' places (no walk of its members): the memo's
 * `places` must be set before the stream's first chunk. memo may be NULL (a plain scan). */
struct mg_chunk_memo_s;
int mg_resp_out_scan_chunk(mg_resp_out_t *o, const struct mg_chunk_memo_s *memo, const char *json,
                           size_t n, mg_resp_chunk_t *ch);

/* A scanned chunk (ch->tree 0) into the answer: as mg_resp_out_chunk with its tree (out NULL
 * for a whole completion). */
void mg_resp_out_scanned(mg_resp_out_t *o, const mg_resp_chunk_t *ch, mg_buf_t *out);

/* The answer is complete: open items closed, then response.completed (or .incomplete) into
 * out (NULL: none). Returns the final Response object's text (borrowed from o), written once:
 * the event, the client's answer and the stored record copy it. */
const mg_buf_t *mg_resp_out_end(mg_resp_out_t *o, mg_buf_t *out);

/* The answer broke off: response.failed with the output so far and error {code, message}
 * into out. code is one of the Responses API's error codes ("server_error", ...). */
void mg_resp_out_fail(mg_resp_out_t *o, const char *code, const char *message, mg_buf_t *out);

/* The usage the engine reported (0 counts when none): Chat's prompt/completion tokens. */
void mg_resp_out_usage(const mg_resp_out_t *o, long long *input, long long *output);
/* Set the usage when the engine reported none (the gateway's own count). */
void mg_resp_out_set_usage(mg_resp_out_t *o, long long input, long long output);

/* The answer as one assistant chat message (content, tool_calls), its JSON text appended to
 * out: what a follow-up's history replays. 0 or -1 (out of memory). */
int mg_resp_out_message_print(const mg_resp_out_t *o, mg_buf_t *out);
/* The same as a new tree (NULL when out of memory). */
cJSON *mg_resp_out_message(const mg_resp_out_t *o);

#endif
