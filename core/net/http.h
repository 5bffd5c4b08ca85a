/* http: HTTP/1.1 server connections on libuv with llhttp.
 *
 * A listener accepts connections; each connection parses requests one at a time
 * (pipelined requests wait in the connection's buffer and are answered in order),
 * enforces the header and body limits and the header-read / keep-alive timeouts,
 * and hands every complete request to the listener's handler. The handler answers
 * with mg_http_respond() or a chunked stream (mg_http_stream_*), now or later.
 *
 * Ownership: the connection owns its requests. If the client goes away while a
 * request is still being answered, the request's abort hook runs (the owner must
 * stop all work on it and never touch it again) and the request is freed. After
 * mg_http_respond() or mg_http_stream_end() the request is gone as well.
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

typedef struct mg_listener_s mg_listener_t;
typedef struct mg_conn_s mg_conn_t;
typedef struct mg_http_req_s mg_http_req_t;

typedef struct mg_http_header_s {
    char *name;  /* arena */
    char *value; /* arena */
} mg_http_header_t;

typedef void (*mg_http_handler_fn)(void *ud, mg_http_req_t *req);

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
    char *body;                /* owned (malloc); NUL-terminated; NULL when empty */
    size_t body_len, body_cap;
    char request_id[MG_REQUEST_ID_LEN + 1];
    uint64_t start_ms;         /* loop time when the request began */
    int keep_alive;
    int http10;                /* HTTP/1.0 request: keep-alive must be said explicitly */
    int headers_sent;          /* response status line and headers written */
    int chunked;
    /* Owner hooks, set by the handler. on_abort: the client left before the response
     * was complete; on_drain: the connection's write queue emptied below the
     * high-water mark after mg_http_write_pending() said it was full. */
    void (*on_abort)(void *data);
    void (*on_drain)(void *data);
    void *hook_data;
    /* detached requests only (conn == NULL): the answer is collected here */
    mg_http_done_fn done;
    void *done_ud;
    int done_status;
    char *answer;              /* owned (malloc) */
    size_t answer_len, answer_cap;
};

typedef struct mg_http_limits_s {
    size_t max_body_bytes;
    size_t max_header_bytes;
    int header_read_ms;
    int keepalive_idle_ms;
} mg_http_limits_t;

struct mg_listener_s {
    uv_tcp_t tcp;
    uv_loop_t *loop;
    mg_http_limits_t limits;
    mg_http_handler_fn handler;
    void *ud;
    mg_conn_t *conns;      /* intrusive list of open connections */
    size_t n_conns;
    int stopping;          /* no longer accepting; connections close after their response */
    int tcp_open;
    char bound[72];        /* "host:port" actually bound */
    char date[40];         /* cached Date header value */
    uint64_t date_sec;
    char *rbuf;            /* shared read buffer for connections with nothing pending */
    size_t rbuf_cap;
};

/* Bind and listen on "host:port" (port 0 = any). Returns 0 or a negative libuv error;
 * on success l->bound holds the real address. */
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

#endif
