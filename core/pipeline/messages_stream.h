/* messages_stream: the gateway's canonical stream (Chat Completions chunks as SSE, whichever
 * route served it) re-framed as Anthropic's Messages stream, one explicit content-block state
 * machine:
 *
 *   message_start, ping
 *   per block, never overlapping, indices from 0 in order:
 *     content_block_start (thinking | text | tool_use | redacted_thinking)
 *     content_block_delta (thinking_delta, signature_delta | text_delta | input_json_delta)
 *     content_block_stop
 *   message_delta (stop_reason, stop_sequence, usage)
 *   message_stop
 *
 * delta.reasoning_content (or .reasoning) opens a thinking block, delta.reasoning_signature
 * (adapters/anthropic.lua) is its signature_delta, delta.redacted_thinking a redacted block;
 * delta.content a text block; each tool call (by its index: every one of them, not only the
 * first) a tool_use block whose input_json_delta events are the upstream's argument deltas as
 * they arrive (an empty tool_calls list, or an empty argument delta, makes no event). Blocks
 * never overlap, so a call that starts while another's block is open waits (its fragments
 * kept): its own argument fragment, with none of the open call's in between and the open
 * call's arguments whole JSON by then, closes the open block and opens its own (calls sent
 * one after another stream live); a fragment of the
 * open call after another call started (an engine that interleaves its calls' arguments)
 * keeps every waiting call until the end of the message, where each gets its block in turn,
 * its arguments in the pieces they came in. A chunk
 * whose "error" is set ends the stream with Anthropic's error event (no message_stop: a
 * failed stream never looks complete); [DONE] ends it properly.
 *
 * The state is the caller's (one per streamed call); feed it the canonical SSE bytes as they
 * go out, in any cut. The canonical stream's chunks are strict JSON (the pipeline checks each
 * upstream chunk with mg_chunk_scan, and prints what adapters make): a text piece is copied
 * from its bytes, so a chunk the scan would refuse is not this module's input. Pure; any
 * thread. */
#ifndef MG_MESSAGES_STREAM_H
#define MG_MESSAGES_STREAM_H

#include "base/json.h"
#include "pipeline/messages_resp.h"

#define MG_MSGS_TOOLS_MAX 64 /* tool calls of one answer with a block of their own */

typedef enum {
    MG_MSGS_NONE,
    MG_MSGS_TEXT,
    MG_MSGS_THINKING,
    MG_MSGS_TOOL,
    MG_MSGS_REDACTED
} mg_msgs_block_t;

/* A tool call that started while another call's block was open: its block not yet sent. */
typedef struct {
    int tool;     /* its canonical index */
    char *id;     /* owned */
    char *name;   /* owned */
    mg_buf_t arg; /* owned: its argument fragments, each a JSON string literal, \n-separated */
} mg_msgs_pending_t;

typedef struct mg_msgs_stream_s {
    char id[96];           /* "msg_<request id>" */
    char *model;           /* owned: the client's model name */
    mg_msgs_usage_t usage; /* the upstream's counts, else fallback's */
    int have_usage;
    mg_msgs_usage_t fallback;            /* set by the caller before the end: the call's counts */
    int started, ended;                  /* message_start sent; message_stop or error sent */
    mg_msgs_block_t open;                /* the open block's kind */
    int open_index;                      /* its index */
    int open_tool;                       /* the canonical index of the open tool call */
    int next_index;                      /* the next block's index */
    short tool_block[MG_MSGS_TOOLS_MAX]; /* canonical tool index -> block index, -1: none yet,
                                            -2: waiting in pending */
    mg_msgs_pending_t *pending;          /* owned (MG_MSGS_TOOLS_MAX, lazily): waiting calls */
    int npending;                        /* in start order */
    int interleaved;                     /* the engine interleaves: waiting calls wait to the end */
    mg_buf_t open_args;                  /* owned: the open tool call's arguments so far (text):
                                            its block closes for a waiting call only once they
                                            are whole JSON, so an engine that goes back to it
                                            never lands on a closed block */
    const char *stop_reason;             /* static, NULL until a finish_reason came */
    char *stop_sequence;                 /* owned, or NULL */
    mg_buf_t line;                       /* owned: an unfinished line of the input */
    mg_buf_t data;                       /* owned: the current event's data */
} mg_msgs_stream_t;

/* A new stream for message `id`, answering as `model`; input_estimate is message_start's
 * input_tokens (the final count comes in message_delta). 0 or -1 (out of memory). */
int mg_msgs_stream_init(mg_msgs_stream_t *s, const char *id, const char *model,
                        long long input_estimate);
void mg_msgs_stream_free(mg_msgs_stream_t *s);

/* Canonical SSE bytes in[0..n) in, Anthropic SSE appended to out. 0 or -1 (out of memory). */
int mg_msgs_stream_feed(mg_msgs_stream_t *s, const char *in, size_t n, mg_buf_t *out);

/* One canonical chunk's JSON (or "[DONE]") in, its Anthropic events appended to out. */
int mg_msgs_stream_event(mg_msgs_stream_t *s, const char *json, size_t n, mg_buf_t *out);

/* Anthropic's type for a failed stream's error event: the upstream's own (overloaded_error,
 * rate_limit_error) when the message names it, timeout_error for a gateway code with
 * TIMEOUT, else api_error. */
const char *mg_msgs_stream_error_type(const char *code, const char *msg);

#endif
