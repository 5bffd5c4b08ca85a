/* upstream: HTTP requests to model back-ends. Plain http:// goes through our own
 * HTTP/1.1 client (h1client: libuv TCP, llhttp, a keep-alive pool: local engines are
 * the hot path, and it costs a fraction of curl's per request: bench/README.md);
 * https:// goes through libcurl multi, driven by the libuv loop (curl's socket and
 * timer callbacks mapped onto uv_poll_t / uv_timer_t), for TLS and HTTP/2.
 *
 * A transfer streams its response through callbacks as bytes arrive. Connections
 * to upstreams are kept alive and reused by curl's connection cache. Timeouts:
 * connect (curl), first byte and idle gap (a timer per transfer), total (curl).
 * mg_xfer_cancel() removes a transfer at once: curl closes its connection, so the
 * upstream sees the client leave, and no callback fires afterwards. */
#ifndef MG_UPSTREAM_H
#define MG_UPSTREAM_H

#include <stddef.h>
#include <curl/curl.h>
#include <uv.h>

typedef struct mg_upstream_s mg_upstream_t;
typedef struct mg_xfer_s mg_xfer_t;

/* Which client carries a transfer: the first member of both transfer structs. */
#define MG_XFER_KIND_CURL 1
#define MG_XFER_KIND_H1 2

typedef enum {
    MG_XFER_OK = 0,
    MG_XFER_CONNECT_ERROR,      /* could not connect (refused, DNS, TLS handshake) */
    MG_XFER_FIRST_BYTE_TIMEOUT, /* connected, but no response within first_byte_ms */
    MG_XFER_IDLE_TIMEOUT,       /* response stalled longer than idle_ms */
    MG_XFER_TOTAL_TIMEOUT,      /* the whole exchange took longer than total_ms */
    MG_XFER_ERROR,              /* reset, truncated or malformed response */
} mg_xfer_result_t;

typedef struct mg_xfer_opts_s {
    const char *method;         /* "POST" or "GET" */
    const char *url;            /* copied by curl */
    struct curl_slist *headers; /* ownership moves to the transfer */
    const char *extra_head;     /* NULL, or the caller's own header lines, sent after
                                   `headers` as they are: each ends in CRLF, none is Host or
                                   Content-Length or has an empty value (the caller built
                                   them; they are not checked). Borrowed: the per-request
                                   ones cost no list nodes and no scan. */
    char *body;                 /* ownership moves to the transfer (malloc); may be NULL */
    size_t body_len;
    int connect_timeout_ms;
    int first_byte_timeout_ms;
    int idle_timeout_ms;
    int total_timeout_ms;
} mg_xfer_opts_t;

/* The lifetime contract, in one sentence: a callback may cancel its own transfer, start or
 * cancel others and free whatever `ud` points to, because after a callback that ended or
 * cancelled the transfer the client neither touches `ud` nor calls back again, and it frees
 * the transfer itself only once its own frames have unwound (both clients: curl's and h1). */
typedef struct mg_xfer_cbs_s {
    /* Status line and headers complete. */
    void (*on_headers)(void *ud, int status);
    /* Response body bytes. Return 0 to go on, 1 to pause until mg_xfer_resume(). */
    int (*on_data)(void *ud, const char *data, size_t len);
    /* The transfer ended; the xfer is freed right after this returns. */
    void (*on_done)(void *ud, mg_xfer_result_t result, const char *detail);
    /* Optional: every byte of one read from the upstream went to on_data (the moment to pass
     * on what they made, in one write); not called once the transfer ended. */
    void (*on_read_end)(void *ud);
} mg_xfer_cbs_t;

/* Create the upstream client on a loop. Returns NULL when out of memory. */
mg_upstream_t *mg_upstream_new(uv_loop_t *loop);
/* Cancel every transfer and free the client once its handles are closed. */
void mg_upstream_close(mg_upstream_t *up);
/* Transfers in progress. */
size_t mg_upstream_active(const mg_upstream_t *up);

/* Start a transfer. Returns 0 and sets *out, or a negative value (then no callback
 * will ever fire and opts' owned members have been freed). */
int mg_xfer_start(mg_upstream_t *up, const mg_xfer_opts_t *opts, const mg_xfer_cbs_t *cbs, void *ud,
                  mg_xfer_t **out);
/* Abort the transfer; safe from inside its own callbacks. No callback fires after. */
void mg_xfer_cancel(mg_xfer_t *x);
/* Resume a transfer paused by on_data returning 1. */
void mg_xfer_resume(mg_xfer_t *x);
/* A response header captured by the transfer ("retry-after" and "content-type"), or NULL. */
const char *mg_xfer_header(const mg_xfer_t *x, const char *name);
/* The response headers of an answer whose status is 400 or more, for the cooldown policy:
 * a block of "name\0value\0" pairs, names lower-cased (headers.h). Valid from on_headers on;
 * the caller owns and frees the result; NULL (*len = 0) when there were none or they were
 * taken already. A successful answer's headers are not copied. */
char *mg_xfer_take_error_headers(mg_xfer_t *x, size_t *len);

#endif
