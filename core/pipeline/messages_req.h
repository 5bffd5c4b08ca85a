/* messages_req: an Anthropic Messages request (POST /v1/messages, and the body of
 * /v1/messages/count_tokens) turned into the gateway's canonical request, a Chat Completions
 * body, so that every route serves it: passthrough OpenAI-wire providers get it spliced as
 * any chat request, translating adapters get it as req.body, and adapters/anthropic.lua also
 * gets the original (req.entry) to send Anthropic upstreams what the client wrote.
 *
 * What maps where:
 *   system (string or text blocks)        → a leading system message
 *   text / image blocks (base64 and url)  → content parts (text, image_url; base64 as a data:
 *                                           URL)
 *   assistant tool_use blocks             → tool_calls (input as a JSON string)
 *   user tool_result blocks               → tool messages, before the rest of the user turn
 *                                           (is_error: the content prefixed "Error: ")
 *   thinking / redacted_thinking blocks   → left out: a Chat Completions engine has no field
 *                                           for them (an Anthropic upstream gets them through
 *                                           req.entry, byte for byte)
 *   tools, tool_choice                    → function tools, "auto" / "required" / "none" /
 *                                           a named function; disable_parallel_tool_use →
 *                                           parallel_tool_calls: false
 *   stop_sequences → stop; max_tokens, temperature, top_p, top_k, stream, metadata and the
 *   gateway's own extensions (priority, routing, timeouts, ...) as they are.
 * What it cannot carry (a document block, a tool_result holding an image, a server tool,
 * mcp_servers, ...) is left out of the canonical body and named: a route that serves the
 * canonical form refuses the request with that reason (a 400, never a silent drop), an
 * adapter that sends the client's own body (adapters/anthropic.lua) serves it. A malformed
 * request is refused outright. Pure; any thread. */
#ifndef MG_MESSAGES_REQ_H
#define MG_MESSAGES_REQ_H

#include <stddef.h>

#include "base/json.h"

/* The Chat Completions body for the Messages body in[0..n), appended to out. 0; 1 when it
 * left something out (out holds the rest, err says what); -1 when the request is malformed,
 * with the reason (for the client) in err; -2 out of memory. `count_only`: max_tokens is not
 * required (count_tokens has none). */
int mg_msgs_request(const char *in, size_t n, int count_only, mg_buf_t *out, char *err,
                    size_t errlen);

#endif
