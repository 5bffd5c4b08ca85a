/* h1client: a plain-HTTP/1.1 upstream client on the libuv loop, for local engines.
 *
 * The same transfer contract as upstream.h (mg_xfer_opts_t, mg_xfer_cbs_t,
 * mg_xfer_result_t), without libcurl: http:// URLs only, one request per
 * connection at a time, keep-alive connections pooled per host:port, host names
 * resolved off the loop thread (uv_getaddrinfo) and cached for 30 s.
 *
 * Callback rules, as for mg_xfer:
 *   - on_headers(status) fires once, when the final (non-1xx) response head is in;
 *   - on_data(bytes) fires for each piece of the decoded body; returning 1 pauses
 *     the transfer (the socket is no longer read) until mg_h1_resume();
 *   - on_done(result, detail) is always the last callback, and fires exactly once
 *     unless the transfer is cancelled; the transfer is freed right after it
 *     returns. `detail` is a static string (NULL on success).
 *   - mg_h1_cancel() is safe anywhere, including inside the transfer's own
 *     callbacks; no callback fires after it.
 *   - In one sentence: a callback may cancel or end its transfer, start others (which may
 *     take the connection just pooled), close the client and free what `ud` points to,
 *     because the client marks a transfer that ends under one of its own frames dead and
 *     frees it when the last frame leaves, and touches no connection or `ud` after that.
 * A transfer that is cancelled, times out or fails closes its connection (never
 * pooled), which is how the upstream engine learns that the client has left. */
#ifndef MG_H1CLIENT_H
#define MG_H1CLIENT_H

#include <stddef.h>
#include <uv.h>

#include "upstream/upstream.h"

typedef struct mg_h1_s mg_h1_t;
typedef struct mg_h1_xfer_s mg_h1_xfer_t;

/* Create a client on `loop` (one per loop; it owns the idle connection pools and a
 * shared 64 KiB read buffer). Returns NULL when out of memory. */
mg_h1_t *mg_h1_new(uv_loop_t *loop);

/* Cancel every transfer (no callback fires), close every connection and free the
 * client once its handles have closed and pending DNS lookups have returned (so
 * keep running the loop). Safe from inside a transfer callback. The client must
 * not be used after this call. */
void mg_h1_close(mg_h1_t *c);

/* Tune the keep-alive pool: idle connections are closed after `idle_ms` (default
 * 60000; 0 disables pooling) and at most `max_idle_per_host` (default 256) are
 * kept per host:port. Applies to connections pooled from now on. */
void mg_h1_set_keepalive(mg_h1_t *c, int idle_ms, size_t max_idle_per_host);

/* Start a transfer of opts->method (NULL means POST) to opts->url, which must be
 * "http://host[:port][/path][?query]" with host a name, an IPv4 literal or a
 * bracketed IPv6 literal; the port defaults to 80.
 *
 * Ownership, as for mg_xfer_start: opts->headers (curl_slist; freed here, it is
 * copied into the request at once) and opts->body (malloc; freed here or when the
 * transfer ends) move to the client whether or not the call succeeds. opts->url
 * is not kept. Header lines follow curl's conventions: "Name:" with an empty value
 * removes the header (so "Expect:" sends nothing, "Host:" drops our Host line),
 * "Name;" sends an empty header, lines containing CR or LF are dropped. Every
 * method but GET and HEAD sends the body with Content-Length (0 when NULL); GET
 * and HEAD send no body.
 *
 * Timeouts (opts, milliseconds, 0 = none): connect_timeout_ms covers name
 * resolution and the TCP handshake of each new connection; first_byte_timeout_ms
 * runs from the start until the response head is complete, then idle_timeout_ms
 * bounds every gap between body pieces (both stop while paused);
 * total_timeout_ms bounds the whole transfer.
 *
 * No callback fires before this returns. Returns 0 and sets *out, or a negative
 * value (malformed URL or method, out of memory, client closing): then no
 * callback will ever fire. Failures to resolve or connect are reported through
 * on_done(MG_XFER_CONNECT_ERROR). A request sent on a pooled connection that the
 * server had already closed (EOF or reset before any response byte) is retried
 * once on a fresh connection without the caller noticing. */
int mg_h1_start(mg_h1_t *c, const mg_xfer_opts_t *opts, const mg_xfer_cbs_t *cbs, void *ud,
                mg_h1_xfer_t **out);

/* Abort the transfer and close its connection. Safe from inside any of its own
 * callbacks (the struct then lives until the callback has unwound) and a no-op
 * once the transfer has ended. No callback fires afterwards; `x` must not be used
 * after this call. */
void mg_h1_cancel(mg_h1_xfer_t *x);

/* Resume a transfer paused by on_data returning 1 (otherwise a no-op). Body bytes
 * that had already been read are delivered synchronously, from inside this call,
 * and so may be the final on_done: the caller must expect on_data and on_done to
 * run before mg_h1_resume returns (and `x` to be gone afterwards if on_done ran). */
void mg_h1_resume(mg_h1_xfer_t *x);

/* A captured response header of the final response, "retry-after" or
 * "content-type" (name case-insensitive), or NULL when absent or not captured.
 * The string belongs to the transfer: valid until on_done returns. */
const char *mg_h1_header(const mg_h1_xfer_t *x, const char *name);
/* The headers of the final response when its status is 400 or more, as headers.h's block
 * (caller frees; NULL and *len = 0 when there were none); see mg_xfer_take_error_headers. */
char *mg_h1_take_error_headers(mg_h1_xfer_t *x, size_t *len);

/* Transfers started and not yet ended (done or cancelled). */
size_t mg_h1_active(const mg_h1_t *c);
/* Reads put off to the next loop turn because the turn's read budget was spent (h1client.c). */
uint64_t mg_h1_deferrals(const mg_h1_t *c);

#endif
