/* responses_in: a Responses API request (POST /v1/responses) as a Chat Completions body, so
 * that any chat engine behind the adapters can answer it.
 *
 * What is translated: `input` (a string, or items: messages with text and image parts,
 * function_call, function_call_output; reasoning items are the model's own and are not sent
 * back), `instructions` (the first system message), function `tools` and `tool_choice`,
 * `text.format` (json_schema / json_object -> response_format), `max_output_tokens`,
 * `temperature`, `top_p`, `parallel_tool_calls`, `reasoning.effort`, `user`, and the gateway's
 * own extensions (priority, timeouts, routing, ...), which the parse step then takes out as
 * for any request. What the bridge cannot honour (built-in tools, background, a conversation,
 * prompt templates, truncation "auto", file inputs, item references, an unknown parameter) is
 * refused with the parameter it concerns: never dropped.
 *
 * Pure functions of cJSON trees: no I/O, any thread. */
#ifndef MG_RESPONSES_IN_H
#define MG_RESPONSES_IN_H

#include <cjson/cJSON.h>

#include "base/json.h"

/* Why a request cannot be bridged: a 400 with this message and param. */
typedef struct mg_resp_error_s {
    char message[256];
    char param[64]; /* the request's parameter at fault ("tools[1].type"), or "" */
} mg_resp_error_t;

/* The chat body for the Responses request `req` (an object): a new tree (the caller's) in
 * *chat with model, messages ([system from instructions] + the input), stream and the mapped
 * parameters. Returns 0, or -1 with *err filled (and *chat NULL). */
int mg_resp_to_chat(const cJSON *req, cJSON **chat, mg_resp_error_t *err);

/* The messages a previous response's conversation left (history: an array of chat
 * messages, borrowed) put before this turn's input, after the instructions' system message
 * (a previous response's instructions are not carried over, as OpenAI defines it). 0 or -1
 * (out of memory). */
int mg_resp_prepend_history(cJSON *chat, const cJSON *history);

/* This turn's messages of a chat body made by mg_resp_to_chat, without the instructions'
 * system message: a new array (the conversation a stored response keeps, with the answer
 * appended). `had_instructions`: the request had instructions. NULL when out of memory. */
cJSON *mg_resp_turn_messages(const cJSON *chat, int had_instructions);

/* The request's input as the items GET /v1/responses/{id}/input_items lists: a string is
 * one user message; items keep their members, messages get the input_text parts and the
 * status the API shows, items without an id get "<kind>_<suffix>_<n>". A new array, or NULL
 * when out of memory. */
cJSON *mg_resp_input_items(const cJSON *req, const char *suffix);
/* The same items appended to out as JSON text (a string input written directly, without a
 * tree). 0, or -1 when out of memory (out as it was). */
int mg_resp_input_items_print(const cJSON *req, const char *suffix, mg_buf_t *out);

/* The members of a Response object that echo the request (instructions, tools in the
 * Responses shape, tool_choice, text, temperature, top_p, max_output_tokens, metadata,
 * previous_response_id, store, parallel_tool_calls, reasoning, truncation, user), with their
 * defaults: the skeleton every Response of this request starts from, as one object's JSON
 * text appended to out (printed from the request, no tree copied). 0 or -1 (out of memory). */
int mg_resp_skeleton_print(const cJSON *req, mg_buf_t *out);
/* The same as a new tree (NULL when out of memory). */
cJSON *mg_resp_skeleton(const cJSON *req);

#endif
