/* sse: an incremental parser for text/event-stream and newline-delimited JSON.
 *
 * Upstream bytes arrive in arbitrary pieces; the parser frames them into whole
 * events and reports each one as soon as its terminating blank line (SSE) or
 * newline (NDJSON) has arrived. It keeps at most one partial event buffered.
 * The parser never allocates per event: the callback gets pointers into its own
 * buffer (or straight into the input) that are valid only during the call. */
#ifndef MG_SSE_H
#define MG_SSE_H

#include <stddef.h>

typedef enum { MG_SSE_MODE_SSE = 0, MG_SSE_MODE_NDJSON = 1 } mg_sse_mode_t;

/* One framed event.
 *  SSE: `data` is the concatenation of the event's data: lines joined with '\n'
 *       (the field's single leading space removed), `event` the event: field or NULL,
 *       `raw`/`raw_len` the exact bytes of the event including its terminating blank line.
 *  NDJSON: `data` is the line without its '\n' (and without a trailing '\r'), `event` NULL,
 *       `raw` the line including '\n'. Blank lines are skipped. */
typedef struct mg_sse_event_s {
    const char *data;
    size_t data_len;
    const char *event;
    size_t event_len;
    const char *raw;
    size_t raw_len;
} mg_sse_event_t;

/* Called for each event; returns 0 to go on, non-zero (best positive: -1 is the parser's own
 * error) to stop. The contract: a callback that returns 0 must neither feed nor free the
 * parser, and one that stops may do anything, freeing the parser or what embeds it included,
 * because mg_sse_feed then returns its value at once and never touches the parser again (a
 * parser that lives on holds nothing then: mg_sse_pending() is 0). */
typedef int (*mg_sse_event_cb)(void *ud, const mg_sse_event_t *ev);

typedef struct mg_sse_parser_s {
    mg_sse_mode_t mode;
    char *buf; /* owned; partial event carried between feeds */
    size_t len, cap;
    size_t max_event; /* an event larger than this is an error (default 4 MiB) */
} mg_sse_parser_t;

void mg_sse_init(mg_sse_parser_t *p, mg_sse_mode_t mode);
/* Feed bytes; calls cb for every complete event. Returns 0, the callback's non-zero
 * value (see mg_sse_event_cb), or -1 when an event exceeds max_event or memory runs out
 * (what was held is dropped). Handles \n, \r\n and \r line ends. Not re-entrant: never
 * from inside one of its own callbacks. */
int mg_sse_feed(mg_sse_parser_t *p, const char *data, size_t len, mg_sse_event_cb cb, void *ud);
/* Bytes held back as an incomplete event (non-zero at end of stream = truncated). */
size_t mg_sse_pending(const mg_sse_parser_t *p);
void mg_sse_free(mg_sse_parser_t *p);

#endif
