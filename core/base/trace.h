/* trace: W3C Trace Context (https://www.w3.org/TR/trace-context/) for one request.
 *
 * A request's trace is the client's (its `traceparent` header, when valid) or a new one the
 * gateway starts. The gateway is one span of it: span_id, a fresh random id whose parent is
 * the client's span (parent_id). Every upstream attempt is a child span of the gateway's,
 * with an id of its own, sent upstream as `traceparent`. Ids are lowercase hex, NUL
 * terminated; an invalid header is ignored as the spec says (a new trace is started). */
#ifndef MG_TRACECTX_H
#define MG_TRACECTX_H

#define MG_TRACE_ID_HEX 32
#define MG_SPAN_ID_HEX 16
#define MG_TRACEPARENT_LEN 55 /* "00-" trace "-" span "-" flags */

typedef struct mg_trace_s {
    char trace_id[MG_TRACE_ID_HEX + 1]; /* "" until started */
    char parent_id[MG_SPAN_ID_HEX + 1]; /* the client's span, "" when the trace is ours */
    char span_id[MG_SPAN_ID_HEX + 1];   /* the gateway's span */
    char flags[3];                      /* trace-flags as received ("01": sampled), or "01" */
} mg_trace_t;

/* Parse a traceparent header value into t (trace_id, parent_id, flags). 0, or -1 when it is
 * not a valid one (version ff, wrong lengths, upper-case or non-hex digits, all-zero ids,
 * version 00 with anything after the flags). */
int mg_trace_parse(const char *value, mg_trace_t *t);

/* Start the request's trace: the client's header when valid (may be NULL), else a new trace
 * id; a new span id for the gateway either way. 0, or -1 when the random generator failed
 * (t is then empty). */
int mg_trace_start(mg_trace_t *t, const char *traceparent);

/* The gateway's span as a traceparent value into out[MG_TRACEPARENT_LEN + 1]; "" when t is
 * empty. */
void mg_trace_format(const mg_trace_t *t, char *out);

/* A child span of the gateway's (an upstream attempt) as a traceparent value into
 * out[MG_TRACEPARENT_LEN + 1], its span id into span_out[MG_SPAN_ID_HEX + 1] (may be NULL).
 * 0, or -1 (t empty, or no random bytes). */
int mg_trace_child(const mg_trace_t *t, char *out, char *span_out);

#endif
