/* http: HTTP/1.1 server connections on libuv with llhttp.
 *
 * A listener accepts connections (up to max_connections, then a reserve for a few paths,
 * then a 503 refusal; accepting pauses for a moment when the process is out of file
 * descriptors); each connection parses requests one at a time (pipelined requests wait
 * in the connection's buffer and are answered in order), enforces the header and body
 * limits, the read deadlines (headers, whole request, body rate), the keep-alive timeout
 * and the write timeout (a client that stops reading is closed), and hands every complete
 * request to the listener's handler. The handler answers with mg_http_respond() or a
 * chunked stream (mg_http_stream_*), now or later.
 *
 * Ownership: the connection owns its requests. If the client goes away (or stops reading
 * for write_timeout_ms) while a request is still being answered, the request's abort hook
 * runs (req->abort says why; the owner must stop all work on it and never touch it
 * again) and the request is freed. After mg_http_respond() or mg_http_stream_end() the
 * request is gone as well.
 *
 * Callbacks (the handler, on_abort, on_drain) may answer their request, free their own
 * objects and answer or start others, because the connection never frees itself under a
 * caller (a write error closes it from a fresh loop turn, the struct goes in the close
 * callback) and touches a request no more once it has been answered or on_abort returned. */
#ifndef MG_HTTP_H
#define MG_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <llhttp.h>
#include <uv.h>

#include "base/arena.h"
#include "base/crypto.h"
#include "base/log.h"
#include "base/trace.h"
#include "net/accept.h"

typedef struct mg_listener_s mg_listener_t;
typedef struct mg_conn_s mg_conn_t;
typedef struct mg_http_req_s mg_http_req_t;

typedef struct mg_http_header_s {
    char *name;  /* arena */
    char *value; /* arena */
} mg_http_header_t;

typedef void (*mg_http_handler_fn)(void *ud, mg_http_req_t *req);

/* Why a request's on_abort hook ran. */
typedef enum {
    MG_HTTP_ABORT_GONE =
        0,                 /* the client closed or reset the connection (or the server closed it) */
    MG_HTTP_ABORT_STALLED, /* the client took nothing of its answer for write_timeout_ms */
} mg_http_abort_t;

/* Where a detached request's answer goes (see mg_http_req_detached). */
typedef void (*mg_http_done_fn)(void *ud, const mg_http_req_t *req, int status, const char *body,
                                size_t len);

struct mg_http_req_s {
    mg_conn_t *conn;           /* borrowed: the connection this request arrived on */
    mg_arena_t arena;          /* everything below marked arena dies with the request */
    int method;                /* llhttp_method_t */
    char *path;                /* arena; without the query string */
    char *query;               /* arena or NULL */
    mg_http_header_t *headers; /* arena */
    size_t n_headers, cap_headers;
    char *body; /* owned (malloc); NUL-terminated; NULL when empty */
    size_t body_len, body_cap;
    char request_id[MG_REQUEST_ID_LEN + 1];
    mg_trace_t trace;  /* W3C trace context: the client's traceparent or a new trace,
                          and the gateway's span; set when the head is complete (every
                          answer head then carries it back as traceparent) */
    uint64_t start_ms; /* loop time when the request began */
    int keep_alive;
    int http10;       /* HTTP/1.0 request: keep-alive must be said explicitly */
    int headers_sent; /* response status line and headers written */
    int chunked;
    const char *head_lines; /* arena or static, or NULL: "Name: value\r\n" lines every
                               answer head of this request carries (CORS), set by the
                               handler before it answers */
    /* Owner hooks, set by the handler. on_abort: the client left before the response
     * was complete; on_drain: the connection's write queue emptied below the
     * high-water mark after mg_http_write_pending() said it was full. */
    void (*on_abort)(void *data);
    void (*on_drain)(void *data);
    void *hook_data;
    mg_http_abort_t abort; /* set before on_abort runs */
    /* detached requests only (conn == NULL): the answer is collected here */
    mg_http_done_fn done;
    void *done_ud;
    int done_status;
    char *answer; /* owned (malloc) */
    size_t answer_len, answer_cap;
};

struct mg_memtrim_s;

/* Refusals (503, then a lingering close) in flight at once per listener; past them a
 * connection past the cap is closed without an answer. */
#define MG_HTTP_REFUSING_MAX 16

typedef struct mg_http_limits_s {
    size_t max_body_bytes;
    size_t max_header_bytes;
    int header_read_ms; /* the head must arrive within, from the first byte (or connect) */
    int keepalive_idle_ms;
    int request_read_ms;         /* the whole request within, from its first byte (0: no limit;
                                    checked from header_read_ms on, so never less than that) */
    int min_body_bytes_per_s;    /* after a grace of header_read_ms from the end of the head, the
                                    body must keep this average rate (0: no rate check) */
    int write_timeout_ms;        /* a connection whose queued output makes no progress this
                                    long is closed (0: never) */
    size_t max_connections;      /* connections that may ask for anything (0: no cap) */
    size_t reserved_connections; /* more past the cap, for reserve_paths only; past both, a
                                    503 and close */
    const char *const *reserve_paths; /* borrowed, NULL-terminated path prefixes, or NULL */
    const char *name;                 /* static: the listener's name in logs and metrics */
    mg_conn_stats_t *stats;           /* borrowed: where the listener counts, or NULL */
    struct mg_memtrim_s *trim;        /* borrowed: told of freed buffers, connections */
} mg_http_limits_t;

struct mg_listener_s {
    mg_acceptor_t acceptor; /* the listening socket */
    uv_loop_t *loop;
    mg_http_limits_t limits;
    mg_http_handler_fn handler;
    void *ud;
    mg_conn_t *conns;       /* intrusive list of open connections */
    size_t n_conns;         /* all of them, refusing ones included */
    size_t n_refusing;      /* of n_conns, refusals (503 past the cap) not yet closing */
    size_t n_refusals_open; /* refusals whose socket is not closed yet (they linger) */
    int stopping;           /* no longer accepting; connections close after their response */
    char bound[72];         /* "host:port" actually bound */
    char date[40];          /* cached Date header value */
    uint64_t date_sec;
    char *rbuf; /* shared read buffer for connections with nothing pending */
    size_t rbuf_cap;
};

/* Bind and listen on "host:port" (port 0 = any). Returns 0 or a negative libuv error;
 * on success l->bound holds the real address. `limits` is copied; the pointers in it are
 * borrowed until mg_listener_close's handles are closed. */
int mg_listener_start(mg_listener_t *l, uv_loop_t *loop, const char *addr,
                      const mg_http_limits_t *limits, mg_http_handler_fn handler, void *ud);
/* Stop accepting; idle connections close now, busy ones after their current response. */
void mg_listener_stop(mg_listener_t *l);
/* Close every connection now (aborting requests in flight) and the listening socket. */
void mg_listener_close(mg_listener_t *l);
/* Number of connections with a request being answered. */
size_t mg_listener_busy(const mg_listener_t *l);

/* The client's address as "ip:port" (IPv6 as "[ip]:port") into out; "" when unknown. */
void mg_http_peer(const mg_http_req_t *req, char *out, size_t cap);

/* A request that did not arrive on a connection (an async task, an idempotent run): method,
 * path, a copy of body and of headers_from's headers (may be NULL: none), a fresh request
 * id. Handlers answer it like any other; the answer (a whole body, or a stream's bytes)
 * goes to done(ud, req, status, body, len), after which the request is freed. Returns
 * NULL when out of memory. */
mg_http_req_t *mg_http_req_detached(int method, const char *path, const char *body, size_t len,
                                    const mg_http_req_t *headers_from, uint64_t now_ms,
                                    mg_http_done_fn done, void *ud);

/* Case-insensitive header lookup; NULL when absent. */
const char *mg_http_header(const mg_http_req_t *req, const char *name);

/* A log line's request fields: request_id, and the trace's trace_id and span_id (the
 * gateway's span) when it has one. Every line about a request carries them. */
void mg_http_log_ids(mg_logline_t *l, const mg_http_req_t *req);

/* Send a complete response and finish the request. `extra_headers` is NULL or
 * preformatted "Name: value\r\n" lines. */
void mg_http_respond(mg_http_req_t *req, int status, const char *content_type,
                     const char *extra_headers, const char *body, size_t body_len);
/* Start a chunked response (e.g. text/event-stream). */
void mg_http_stream_begin(mg_http_req_t *req, int status, const char *content_type,
                          const char *extra_headers);
/* Write one chunk (len > 0). */
void mg_http_stream_write(mg_http_req_t *req, const char *data, size_t len);
/* Terminate the chunked body and finish the request. */
void mg_http_stream_end(mg_http_req_t *req);
/* mg_http_stream_begin, a first chunk (len may be 0) and, with `end`, mg_http_stream_end, in
 * one write (one syscall, one packet). */
void mg_http_stream_open(mg_http_req_t *req, int status, const char *content_type,
                         const char *extra_headers, const char *data, size_t len, int end);
/* mg_http_stream_write (len may be 0) and, with `end`, mg_http_stream_end, in one write. */
void mg_http_stream_send(mg_http_req_t *req, const char *data, size_t len, int end);
/* Non-zero when more than the high-water mark is queued for the client; the owner
 * should pause its producer until on_drain fires. */
int mg_http_write_pending(const mg_http_req_t *req);
/* Close the connection after the current response (e.g. the body was not read fully). */
void mg_http_set_close(mg_http_req_t *req);

/* The standard reason phrase for a status code. */
const char *mg_http_reason(int status);

/* Answer req with the error body of net/error.h: Retry-After when retry_after_ms > 0, then
 * extra_headers (NULL or preformatted "Name: value\r\n" lines). The request is gone afterwards.
 * Logs and counts nothing: that is the caller's finish. */
void mg_error_respond(mg_http_req_t *req, int status, const char *code, const char *message,
                      int retry_after_ms, const char *extra_headers);

#endif
