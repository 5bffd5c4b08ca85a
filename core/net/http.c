/* http: HTTP/1.1 server connections (see http.h).
 *
 * Reading: while a connection has no unparsed bytes, reads land in the listener's
 * shared buffer and are parsed straight from it; only a leftover (a partial or a
 * pipelined request) is copied into the connection's own buffer. The parser pauses
 * at the end of each request; the request is handed to the handler outside of the
 * parser callbacks, and parsing resumes once its response is finished.
 *
 * Writing: uv_try_write first (the common case costs no allocation); whatever the
 * socket did not take is copied into a write request and queued.
 *
 * Deadlines: one lazy uv timer per connection serves the mode's deadline (the head, the
 * keep-alive idle time) and the write-progress checks. The body's deadline is not kept
 * per read: when the head's timer fires after the head is complete, the body's is worked
 * out from the bytes so far (body_due) and the timer set again.
 *
 * Slots: a new connection under max_connections may ask anything; in the reserve past it,
 * only the reserve paths (others get a 503 once their head is read); past the reserve it
 * gets a 503 at once, or a plain close while MG_HTTP_REFUSING_MAX of those still linger. */
#include "net/http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/sockios.h> /* SIOCOUTQ */
#endif

#include "base/json.h"
#include "base/log.h"
#include "base/memtrim.h"
#include "net/error.h"

#define READ_CHUNK (64 * 1024)
#define WRITE_HIGH_WATER (1024 * 1024)
#define MAX_PENDING_INPUT (1024 * 1024)

typedef enum {
    TIMER_NONE = 0,
    TIMER_HEADERS, /* waiting for a request's headers (or body: see in_body) */
    TIMER_IDLE,    /* keep-alive connection with nothing pending */
    TIMER_CLOSE,   /* a write failed: close on the next loop turn, not under the caller */
} timer_mode_t;

struct mg_conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    mg_listener_t *listener; /* borrowed */
    mg_conn_t *prev, *next;  /* listener's list */
    llhttp_t parser;
    char *in; /* owned: unparsed input carried between reads */
    size_t in_len, in_off, in_cap;
    mg_http_req_t *req;        /* owned: request being parsed or answered */
    size_t header_bytes;       /* bytes of the current request's head */
    int last_header_was_value; /* llhttp header field/value state */
    int busy;                  /* a complete request is with the handler */
    int pumping;               /* inside conn_pump: finish must not re-enter it */
    int reading;
    int closing;
    int close_after;  /* close once the current response is written */
    int handles_open; /* tcp + timer: freed when both closed */
    timer_mode_t timer_mode;
    uint64_t timer_due;      /* loop ms the current mode's deadline falls at (0: none) */
    uint64_t timer_armed;    /* loop ms the uv timer is set for (0: stopped) */
    mg_http_req_t *spare;    /* owned: a finished request kept for the next (see req_new) */
    int got_bytes;           /* bytes of the current request have arrived */
    int limit_status;        /* 413, 431 or 503 when a parser callback hit a limit */
    int linger;              /* read and drop input for a while before closing */
    int reserve;             /* accepted past max_connections: reserve paths only */
    int refusing;            /* accepted past the reserve: answered 503, closing */
    mg_http_abort_t abort;   /* what a request in flight is told when the connection ends */
    int in_body;             /* the head is complete, the body is on its way */
    uint64_t body_start;     /* loop ms the head was complete */
    uint64_t write_due;      /* loop ms of the next write-progress check (0: none queued) */
    uint64_t write_progress; /* loop ms bytes were last seen leaving the write queue */
    uint64_t sent_total;     /* bytes ever handed to the socket (written or queued) */
    uint64_t acked_seen;     /* of those, acknowledged by the client at the last check */
    char last_id[MG_REQUEST_ID_LEN + 1]; /* the last finished request whose answer is queued */
};

#define LINGER_MS 1000

static llhttp_settings_t g_settings; /* read-only after first init */
static int g_settings_ready;

static void conn_close(mg_conn_t *c);
static void conn_end(mg_conn_t *c, int now);
static void close_handles(mg_conn_t *c);
static int write_check(mg_conn_t *c, uint64_t now);
static void conn_pump(mg_conn_t *c);
static void conn_read_start(mg_conn_t *c);
static void req_free(mg_http_req_t *req);
static void req_done(mg_conn_t *c, mg_http_req_t *req);
static void detached_append(mg_http_req_t *req, const char *data, size_t len);
static void detached_finish(mg_http_req_t *req);
static void send_error_and_close(mg_conn_t *c, int status, const char *code, const char *msg,
                                 int retry_after_ms, int log);
static void refuse_request(mg_conn_t *c);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

const char *mg_http_reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Unknown";
    }
}

static const char *date_header(mg_listener_t *l)
{
    uint64_t now = (uint64_t)time(NULL);
    if (now != l->date_sec) {
        struct tm tm;
        time_t t = (time_t)now;
        gmtime_r(&t, &tm);
        strftime(l->date, sizeof(l->date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        l->date_sec = now;
    }
    return l->date;
}

void mg_http_peer(const mg_http_req_t *req, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    int len = (int)sizeof(ss);
    char ip[64];
    out[0] = '\0';
    if (!req->conn || uv_tcp_getpeername(&req->conn->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    if (ss.ss_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "%s:%u", ip, ntohs(((const struct sockaddr_in *)&ss)->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "[%s]:%u", ip, ntohs(((const struct sockaddr_in6 *)&ss)->sin6_port));
    }
}

const char *mg_http_header(const mg_http_req_t *req, const char *name)
{
    /* first bytes folded with | 0x20 (equal whenever strcasecmp says equal) skip most calls:
       a request looks up a handful of headers it does not carry */
    int first = (unsigned char)name[0] | 0x20;
    for (size_t i = 0; i < req->n_headers; i++) {
        const char *h = req->headers[i].name;
        if (((unsigned char)h[0] | 0x20) == first && strcasecmp(h, name) == 0)
            return req->headers[i].value;
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Timers                                                                    */
/* ------------------------------------------------------------------------ */

static void on_timer(uv_timer_t *t);

/* Make the uv timer fire no later than `due`. It may fire earlier (a deadline moved since
 * it was set): on_timer then sets it again. */
static void arm_at(mg_conn_t *c, uint64_t due)
{
    if (c->timer_armed && c->timer_armed <= due) return;
    uint64_t now = uv_now(c->listener->loop);
    uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
    c->timer_armed = due > now ? due : now;
}

/* ... no later than the mode's deadline. */
static void timer_arm(mg_conn_t *c)
{
    arm_at(c, c->timer_due);
}

/* The earliest deadline the connection has: its mode's, and the next write-progress check. */
static uint64_t next_due(const mg_conn_t *c)
{
    uint64_t due = c->timer_mode != TIMER_NONE ? c->timer_due : UINT64_MAX;
    return c->write_due && c->write_due < due ? c->write_due : due;
}

static void count_read_timeout(mg_conn_t *c, mg_read_timeout_t why)
{
    if (c->listener->limits.stats) c->listener->limits.stats->read_timeouts[why]++;
}

/* When the request must be complete: request_read_ms after its first byte (UINT64_MAX: no
 * limit). Computed when the timer fires, from the request's start: no per-request work. */
static uint64_t read_due(const mg_conn_t *c)
{
    int ms = c->listener->limits.request_read_ms;
    return ms > 0 && c->req ? c->req->start_ms + (uint64_t)ms : UINT64_MAX;
}

/* When the body must be complete: a grace of header_read_ms from the end of the head, plus
 * the time its bytes so far were allowed at min_body_bytes_per_s (mod_reqtimeout's rule),
 * and never after the request's deadline. Computed when the timer fires, not per read. */
static uint64_t body_due(const mg_conn_t *c)
{
    const mg_http_limits_t *lim = &c->listener->limits;
    uint64_t due = UINT64_MAX;
    if (lim->min_body_bytes_per_s > 0) {
        size_t got = c->req ? c->req->body_len : 0;
        due = c->body_start + (uint64_t)lim->header_read_ms +
              (uint64_t)got * 1000 / (uint64_t)lim->min_body_bytes_per_s;
    }
    uint64_t total = read_due(c);
    return total < due ? total : due;
}

/* The mode's deadline passed. The head's timer is the body's too: a body that keeps up
 * moves it (the first firing after the head is complete finds the body's own deadline). */
static void mode_expired(mg_conn_t *c, uint64_t now)
{
    if (c->timer_mode == TIMER_CLOSE) {
        conn_close(c);
        return;
    }
    if (c->busy) {
        c->timer_mode = TIMER_NONE; /* (cannot happen) a request is with its handler */
        return;
    }
    if (c->timer_mode != TIMER_HEADERS || !c->got_bytes) {
        conn_close(c); /* idle, or connected and silent */
        return;
    }
    int total = now >= read_due(c);
    if (c->in_body) {
        uint64_t due = body_due(c);
        if (now < due) {
            c->timer_due = due; /* the body kept up: check again then */
            return;
        }
        count_read_timeout(c, total ? MG_READ_TIMEOUT_REQUEST : MG_READ_TIMEOUT_BODY_RATE);
        send_error_and_close(
            c, 408, "REQUEST_TIMEOUT",
            total ? "request not received in time" : "request body arrived too slowly", 0, 1);
        return;
    }
    count_read_timeout(c, total ? MG_READ_TIMEOUT_REQUEST : MG_READ_TIMEOUT_HEADERS);
    send_error_and_close(c, 408, "REQUEST_TIMEOUT", "request not received in time", 0, 1);
}

static void on_timer(uv_timer_t *t)
{
    mg_conn_t *c = t->data;
    uint64_t now = uv_now(t->loop);
    c->timer_armed = 0;
    if (c->write_due && now >= c->write_due && write_check(c, now) != 0) return; /* closed */
    if (c->closing) {
        if (c->write_due) arm_at(c, c->write_due); /* still flushing before its shutdown */
        return;
    }
    if (c->timer_mode != TIMER_NONE && now >= c->timer_due) {
        mode_expired(c, now);
        if (c->closing) return; /* conn_close saw to the timer */
    }
    uint64_t due = next_due(c);
    if (due != UINT64_MAX) arm_at(c, due);
}

/* Deadlines are lazy: a mode change stores its deadline and touches the uv timer only when
 * that comes before the time it is set for. A request otherwise moved the timer four times
 * (headers, body, done, idle), each a heap operation. */
static void timer_set(mg_conn_t *c, timer_mode_t mode)
{
    if (c->timer_mode == TIMER_CLOSE) return; /* a pending close wins */
    c->timer_mode = mode;
    if (mode == TIMER_NONE) return; /* a timer still set finds nothing to do */
    int ms = mode == TIMER_CLOSE  ? 0
             : mode == TIMER_IDLE ? c->listener->limits.keepalive_idle_ms
                                  : c->listener->limits.header_read_ms;
    c->timer_due = uv_now(c->listener->loop) + (uint64_t)ms;
    timer_arm(c);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct {
    uv_write_t w;
    mg_conn_t *conn;
    size_t len;
    char data[];
} write_req_t;

/* Write progress, for write_timeout_ms: the bytes the client acknowledged, that is those
 * handed to the socket minus those still in our write queue or in the kernel's send queue
 * (SIOCOUTQ: unsent and unacknowledged). A slow reader moves that figure even while our
 * queue waits behind a full socket buffer; a client that reads nothing closes its window
 * and it stands still. A check every quarter of the timeout compares it with the last
 * check's; a connection whose figure stood still for the whole timeout is stalled. Only a
 * connection with bytes in our queue is watched: the fast path (the socket took
 * everything) costs one addition. */
#define WRITE_CHECKS 4

static uint64_t write_check_ms(const mg_conn_t *c)
{
    int ms = c->listener->limits.write_timeout_ms / WRITE_CHECKS;
    return ms > 0 ? (uint64_t)ms : 1;
}

static size_t write_queued(const mg_conn_t *c)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

static uint64_t write_acked(const mg_conn_t *c)
{
    uint64_t pending = write_queued(c);
#ifdef SIOCOUTQ
    uv_os_fd_t fd;
    int outq = 0;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, SIOCOUTQ, &outq) == 0 &&
        outq > 0)
        pending += (uint64_t)outq;
#endif
    return pending < c->sent_total ? c->sent_total - pending : 0;
}

/* Bytes went into our write queue: start watching it if nobody does. */
static void write_watch(mg_conn_t *c)
{
    if (c->write_due || c->listener->limits.write_timeout_ms <= 0) return;
    uint64_t now = uv_now(c->listener->loop);
    c->acked_seen = write_acked(c);
    c->write_progress = now;
    c->write_due = now + write_check_ms(c);
    arm_at(c, c->write_due);
}

static void log_stalled(mg_conn_t *c, const char *request_id, size_t unsent)
{
    if (!mg_log_enabled(MG_LOG_INFO)) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "client_stalled");
    mg_log_str(&l, "request_id", request_id && request_id[0] ? request_id : NULL);
    mg_log_str(&l, "listener", c->listener->limits.name);
    mg_log_str(&l, "outcome", "cancelled");
    mg_log_str(&l, "cancel_reason", "client_stalled");
    mg_log_int(&l, "unsent_bytes", (int64_t)unsent);
    mg_log_int(&l, "write_timeout_ms", c->listener->limits.write_timeout_ms);
    mg_log_end(&l);
}

/* The client took nothing for write_timeout_ms: close at once, dropping what is queued (a
 * graceful shutdown would wait for it forever). A request in flight is aborted as stalled
 * and its owner logs it; otherwise (the answer was complete, only undelivered) this does. */
static void write_stalled(mg_conn_t *c, size_t unsent)
{
    mg_listener_t *l = c->listener;
    if (l->limits.stats) l->limits.stats->write_timeouts++;
    c->write_due = 0;
    /* a reset, not a FIN queued behind what the kernel still holds for a client that takes
       nothing: the socket's buffers go at once, and the client learns it was cut */
    uv_os_fd_t fd;
    struct linger lg = {1, 0};
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    mg_http_req_t *req = c->req;
    if (c->closing || !c->busy || !req || !req->on_abort)
        log_stalled(c, req && c->busy ? req->request_id : c->last_id, unsent);
    if (c->closing) {
        close_handles(c); /* its graceful shutdown was waiting for these bytes */
        return;
    }
    c->abort = MG_HTTP_ABORT_STALLED;
    conn_end(c, 1);
}

/* A write-progress check is due. Returns 1 when the connection was closed as stalled. */
static int write_check(mg_conn_t *c, uint64_t now)
{
    size_t queued = write_queued(c);
    if (queued == 0) {
        c->write_due = 0;
        return 0;
    }
    uint64_t acked = write_acked(c);
    if (acked != c->acked_seen) {
        c->acked_seen = acked;
        c->write_progress = now;
    }
    if (now - c->write_progress >= (uint64_t)c->listener->limits.write_timeout_ms) {
        write_stalled(c, queued);
        return 1;
    }
    c->write_due = now + write_check_ms(c);
    return 0;
}

static void on_write(uv_write_t *w, int status)
{
    write_req_t *wr = (write_req_t *)w;
    mg_conn_t *c = wr->conn;
    if (c->listener->limits.trim) mg_memtrim_note(c->listener->limits.trim, wr->len);
    free(wr);
    if (status < 0) {
        if (!c->closing) conn_close(c);
        return;
    }
    size_t queued = write_queued(c);
    if (queued == 0) c->write_due = 0; /* nothing to watch; a timer still set finds that */
    else c->write_progress = uv_now(c->listener->loop);
    if (c->closing) return;
    if (queued == 0 && !c->busy && !c->got_bytes && c->timer_mode != TIMER_IDLE)
        timer_set(c, TIMER_IDLE);
    if (c->req && c->req->on_drain && queued < WRITE_HIGH_WATER / 2)
        c->req->on_drain(c->req->hook_data);
}

/* Close from a fresh loop turn: a write error must not free requests under the
 * caller that is writing (it may be deep inside a callback chain). */
static void conn_close_soon(mg_conn_t *c)
{
    timer_set(c, TIMER_CLOSE);
}

/* Write the buffers in order: as much as the socket takes now, the rest queued. */
static void conn_write(mg_conn_t *c, uv_buf_t *bufs, unsigned nbufs)
{
    if (c->closing || c->timer_mode == TIMER_CLOSE) return;
    size_t total = 0;
    for (unsigned i = 0; i < nbufs; i++) total += bufs[i].len;
    size_t skip = 0;
    if (write_queued(c) == 0) {
        int n = uv_try_write((uv_stream_t *)&c->tcp, bufs, nbufs);
        if (n >= 0) {
            c->sent_total += (uint64_t)n;
            if ((size_t)n == total) return;
            skip = (size_t)n;
        } else if (n != UV_EAGAIN) {
            conn_close_soon(c);
            return;
        }
    }
    size_t rest = total - skip;
    write_req_t *wr = malloc(sizeof(*wr) + rest);
    if (!wr) {
        conn_close_soon(c);
        return;
    }
    wr->conn = c;
    wr->len = rest;
    size_t off = 0;
    for (unsigned i = 0; i < nbufs; i++) {
        size_t len = bufs[i].len;
        const char *p = bufs[i].base;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        p += skip;
        len -= skip;
        skip = 0;
        memcpy(wr->data + off, p, len);
        off += len;
    }
    uv_buf_t b = uv_buf_init(wr->data, (unsigned)rest);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0) {
        free(wr);
        conn_close_soon(c);
        return;
    }
    c->sent_total += rest;
    write_watch(c);
}

int mg_http_write_pending(const mg_http_req_t *req)
{
    if (!req->conn) return 0;
    if (!req->conn || req->conn->closing) return 0;
    return uv_stream_get_write_queue_size((uv_stream_t *)&req->conn->tcp) > WRITE_HIGH_WATER;
}

/* Bytes into a bounded buffer; `over` once something did not fit. */
typedef struct {
    char *p, *end;
    int over;
} head_buf_t;

static void head_put(head_buf_t *h, const char *s, size_t n)
{
    if ((size_t)(h->end - h->p) <= n) {
        h->over = 1;
        return;
    }
    memcpy(h->p, s, n);
    h->p += n;
}

#define HEAD_LIT(h, lit) head_put(h, lit, sizeof(lit) - 1)

static void head_str(head_buf_t *h, const char *s)
{
    head_put(h, s, strlen(s));
}

static void head_num(head_buf_t *h, long long v)
{
    char tmp[MG_INT_DIGITS_MAX];
    size_t n;
    const char *p = mg_int_digits(v, tmp, &n);
    head_put(h, p, n);
}

/* The same head as format_head_printf(), piece by piece, without printf (on every answer's
 * path; bench/README.md). 0 when it does not fit (the caller then lets snprintf cut it). */
static size_t format_head_fast(mg_http_req_t *req, char *buf, size_t cap, int status,
                               const char *content_type, const char *extra,
                               long long content_length, int keep)
{
    head_buf_t h = {buf, buf + cap, 0};
    HEAD_LIT(&h, "HTTP/1.1 ");
    head_num(&h, status);
    HEAD_LIT(&h, " ");
    head_str(&h, mg_http_reason(status));
    HEAD_LIT(&h, "\r\nServer: moongate\r\nDate: ");
    head_str(&h, date_header(req->conn->listener));
    HEAD_LIT(&h, "\r\nContent-Type: ");
    head_str(&h, content_type ? content_type : "application/json");
    if (content_length >= 0) {
        HEAD_LIT(&h, "\r\nContent-Length: ");
        head_num(&h, content_length);
        HEAD_LIT(&h, "\r\n");
    } else {
        HEAD_LIT(&h, "\r\nTransfer-Encoding: chunked\r\n");
    }
    HEAD_LIT(&h, "X-Request-Id: ");
    head_str(&h, req->request_id);
    HEAD_LIT(&h, "\r\n");
    if (req->trace.trace_id[0]) {
        char tp[MG_TRACEPARENT_LEN + 1];
        mg_trace_format(&req->trace, tp);
        HEAD_LIT(&h, "traceparent: ");
        head_str(&h, tp);
        HEAD_LIT(&h, "\r\n");
    }
    head_str(&h,
             keep ? (req->http10 ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n");
    if (extra) head_str(&h, extra);
    if (req->head_lines) head_str(&h, req->head_lines);
    HEAD_LIT(&h, "\r\n");
    return h.over ? 0 : (size_t)(h.p - buf);
}

static size_t format_head(mg_http_req_t *req, char *buf, size_t cap, int status,
                          const char *content_type, const char *extra, long long content_length)
{
    mg_conn_t *c = req->conn;
    int keep = req->keep_alive && !c->close_after && !c->listener->stopping;
    if (!keep) c->close_after = 1;
    size_t fast =
        format_head_fast(req, buf, cap, status, content_type, extra, content_length, keep);
    if (fast) return fast;
    char len_line[64];
    if (content_length >= 0)
        snprintf(len_line, sizeof(len_line), "Content-Length: %lld\r\n", content_length);
    else snprintf(len_line, sizeof(len_line), "Transfer-Encoding: chunked\r\n");
    char tp[MG_TRACEPARENT_LEN + 32] = "";
    if (req->trace.trace_id[0]) {
        memcpy(tp, "traceparent: ", 13);
        mg_trace_format(&req->trace, tp + 13);
        memcpy(tp + 13 + MG_TRACEPARENT_LEN, "\r\n", 3);
    }
    int n =
        snprintf(buf, cap,
                 "HTTP/1.1 %d %s\r\nServer: moongate\r\nDate: %s\r\nContent-Type: %s\r\n%s"
                 "X-Request-Id: %s\r\n%s%s%s%s\r\n",
                 status, mg_http_reason(status), date_header(c->listener),
                 content_type ? content_type : "application/json", len_line, req->request_id, tp,
                 keep ? (req->http10 ? "Connection: keep-alive\r\n" : "") : "Connection: close\r\n",
                 extra ? extra : "", req->head_lines ? req->head_lines : "");
    return n < 0 ? 0 : ((size_t)n >= cap ? cap - 1 : (size_t)n);
}

/* The response is complete: free the request and move on to the next one. */
static void req_finish(mg_http_req_t *req)
{
    mg_conn_t *c = req->conn;
    c->req = NULL;
    c->busy = 0;
    /* an answer still queued is this request's: the write timeout names it when it stalls */
    if (c->write_due) memcpy(c->last_id, req->request_id, sizeof(c->last_id));
    req_done(c, req);
    if (c->closing) return;
    if (c->close_after) {
        /* close once the queued bytes are out: shutdown flushes the write queue first */
        conn_close(c);
        return;
    }
    if (!c->pumping) conn_pump(c);
}

void mg_http_respond(mg_http_req_t *req, int status, const char *content_type,
                     const char *extra_headers, const char *body, size_t body_len)
{
    if (!req->conn) {
        req->done_status = status;
        detached_append(req, body, body_len);
        detached_finish(req);
        return;
    }
    char head[2048];
    size_t hl = format_head(req, head, sizeof(head), status, content_type, extra_headers,
                            (long long)body_len);
    uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hl),
                        uv_buf_init((char *)body, (unsigned)body_len)};
    req->headers_sent = 1;
    /* HEAD: the headers say what GET would send, the body stays home */
    conn_write(req->conn, bufs, body_len && req->method != HTTP_HEAD ? 2 : 1);
    req_finish(req);
}

/* Whatever of a stream's head, one chunk and the body's end the caller has, in one write: a
 * streamed answer that arrived in one upstream read leaves in one syscall, not four. `head`
 * may be NULL (already sent), len 0 (no chunk). The request is finished after `end`. */
static void stream_send(mg_http_req_t *req, const char *head, size_t head_len, const char *data,
                        size_t len, int end)
{
    if (!req->conn) {
        if (len) detached_append(req, data, len);
        if (end) detached_finish(req);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    char size_line[24], *p = size_line + sizeof(size_line) - 2;
    memcpy(p, "\r\n", 2);
    size_t v = len;
    do {
        *--p = hex[v & 15];
        v >>= 4;
    } while (v);
    uv_buf_t bufs[5];
    unsigned n = 0;
    if (head) bufs[n++] = uv_buf_init((char *)head, (unsigned)head_len);
    if (len) {
        bufs[n++] = uv_buf_init(p, (unsigned)(size_line + sizeof(size_line) - p));
        bufs[n++] = uv_buf_init((char *)data, (unsigned)len);
        bufs[n++] = uv_buf_init("\r\n", 2);
    }
    if (end) bufs[n++] = uv_buf_init("0\r\n\r\n", 5);
    if (n) conn_write(req->conn, bufs, n);
    if (end) req_finish(req);
}

void mg_http_stream_open(mg_http_req_t *req, int status, const char *content_type,
                         const char *extra_headers, const char *data, size_t len, int end)
{
    req->headers_sent = 1;
    if (!req->conn) {
        req->done_status = status;
        stream_send(req, NULL, 0, data, len, end);
        return;
    }
    char head[2048];
    size_t hl = format_head(req, head, sizeof(head), status, content_type, extra_headers, -1);
    req->chunked = 1;
    stream_send(req, head, hl, data, len, end);
}

void mg_http_stream_send(mg_http_req_t *req, const char *data, size_t len, int end)
{
    stream_send(req, NULL, 0, data, len, end);
}

void mg_http_stream_begin(mg_http_req_t *req, int status, const char *content_type,
                          const char *extra_headers)
{
    mg_http_stream_open(req, status, content_type, extra_headers, NULL, 0, 0);
}

void mg_http_stream_write(mg_http_req_t *req, const char *data, size_t len)
{
    stream_send(req, NULL, 0, data, len, 0);
}

void mg_http_stream_end(mg_http_req_t *req)
{
    stream_send(req, NULL, 0, NULL, 0, 1);
}

void mg_http_set_close(mg_http_req_t *req)
{
    if (!req->conn) return;
    req->conn->close_after = 1;
}

/* An error the connection answers itself (bad request, limits, timeouts, refusals); then
 * close. With retry_after_ms the answer says when to come back; `log` writes the request
 * line (refusals are counted and reported in batches instead). */
static void send_error_and_close(mg_conn_t *c, int status, const char *code, const char *msg,
                                 int retry_after_ms, int log)
{
    if (c->closing) return;
    mg_http_req_t *req = c->req;
    if (!req || req->headers_sent || c->busy) {
        conn_close(c);
        return;
    }
    c->close_after = 1;
    c->linger = 1;
    c->busy = 1;
    timer_set(c, TIMER_NONE);
    if (log) {
        mg_logline_t l;
        mg_log_begin(&l, MG_LOG_INFO, "request");
        mg_http_log_ids(&l, req);
        mg_log_int(&l, "status", status);
        mg_log_str(&l, "error", code);
        mg_log_end(&l);
    }
    mg_error_respond(req, status, code, msg, retry_after_ms, NULL);
}

void mg_error_respond(mg_http_req_t *req, int status, const char *code, const char *message,
                      int retry_after_ms, const char *extra_headers)
{
    char head[512] = "";
    int n = 0;
    if (retry_after_ms > 0)
        n = snprintf(head, sizeof(head), "Retry-After: %d\r\n", (retry_after_ms + 999) / 1000);
    if (extra_headers) snprintf(head + n, sizeof(head) - (size_t)n, "%s", extra_headers);
    mg_buf_t body = {0};
    if (mg_error_body(&body, status, code, message, req->request_id, retry_after_ms) != 0) {
        mg_buf_free(&body);
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"api_error\","
            "\"param\":null,\"code\":\"INTERNAL_ERROR\"}}";
        mg_http_respond(req, 500, "application/json", NULL, oom, sizeof(oom) - 1);
        return;
    }
    mg_http_respond(req, status, "application/json", head[0] ? head : NULL, body.data, body.len);
    mg_buf_free(&body);
}

/* ------------------------------------------------------------------------ */
/* Requests and parsing                                                      */
/* ------------------------------------------------------------------------ */

/* A connection keeps its last finished request and reuses it, arena block included: no
 * allocation per request for them (bench/README.md). Sanitizer builds free every request
 * (MG_RECYCLE), so a use after the answer still shows. */
static mg_http_req_t *req_new(mg_conn_t *c)
{
    mg_http_req_t *req = c->spare;
    c->spare = NULL;
    if (req) {
        mg_arena_t arena = req->arena; /* emptied by mg_arena_reset, one block kept */
        memset(req, 0, sizeof(*req));
        req->arena = arena;
    } else {
        req = calloc(1, sizeof(*req));
        if (!req) return NULL;
        mg_arena_init(&req->arena, 2048);
    }
    req->conn = c;
    if (mg_request_id(req->request_id) != 0) {
        req_free(req);
        return NULL;
    }
    req->start_ms = uv_now(c->listener->loop);
    return req;
}

/* The request is answered: keep it as the connection's spare, or free it. */
static void req_done(mg_conn_t *c, mg_http_req_t *req)
{
    if (!MG_RECYCLE || c->spare || c->closing || c->close_after) {
        req_free(req);
        return;
    }
    mg_arena_reset(&req->arena);
    free(req->body);
    req->body = NULL;
    c->spare = req;
}

static void req_free(mg_http_req_t *req)
{
    mg_arena_destroy(&req->arena);
    free(req->body);
    free(req);
}

/* Copy another request's headers into req's arena. 0 or -1. */
static int copy_headers(mg_http_req_t *req, const mg_http_req_t *from)
{
    if (!from || from->n_headers == 0) return 0;
    req->headers = mg_arena_alloc(&req->arena, from->n_headers * sizeof(*req->headers));
    if (!req->headers) return -1;
    for (size_t i = 0; i < from->n_headers; i++) {
        req->headers[i].name = mg_arena_strdup(&req->arena, from->headers[i].name);
        req->headers[i].value = mg_arena_strdup(&req->arena, from->headers[i].value);
        if (!req->headers[i].name || !req->headers[i].value) return -1;
    }
    req->n_headers = req->cap_headers = from->n_headers;
    return 0;
}

mg_http_req_t *mg_http_req_detached(int method, const char *path, const char *body, size_t len,
                                    const mg_http_req_t *headers_from, uint64_t now_ms,
                                    mg_http_done_fn done, void *ud)
{
    mg_http_req_t *req = calloc(1, sizeof(*req));
    if (!req) return NULL;
    mg_arena_init(&req->arena, 1024);
    req->method = method;
    req->path = mg_arena_strdup(&req->arena, path);
    req->body = malloc(len + 1);
    if (!req->path || !req->body || mg_request_id(req->request_id) != 0 ||
        copy_headers(req, headers_from) != 0) {
        req_free(req);
        return NULL;
    }
    memcpy(req->body, body, len);
    req->body[len] = '\0';
    req->body_len = req->body_cap = len;
    /* the original request's trace goes on: its span becomes this one's parent */
    if (headers_from && headers_from->trace.trace_id[0]) {
        char tp[MG_TRACEPARENT_LEN + 1];
        mg_trace_format(&headers_from->trace, tp);
        (void)mg_trace_start(&req->trace, tp);
    } else {
        (void)mg_trace_start(&req->trace, mg_http_header(req, "traceparent"));
    }
    req->start_ms = now_ms;
    req->done = done;
    req->done_ud = ud;
    return req;
}

static void detached_append(mg_http_req_t *req, const char *data, size_t len)
{
    if (req->answer_len + len + 1 > req->answer_cap) {
        size_t cap = req->answer_cap ? req->answer_cap : 1024;
        while (cap < req->answer_len + len + 1) cap *= 2;
        char *n = realloc(req->answer, cap);
        if (!n) return; /* the answer is cut short; the task records what arrived */
        req->answer = n;
        req->answer_cap = cap;
    }
    memcpy(req->answer + req->answer_len, data, len);
    req->answer_len += len;
    req->answer[req->answer_len] = '\0';
}

static void detached_finish(mg_http_req_t *req)
{
    req->done(req->done_ud, req, req->done_status, req->answer ? req->answer : "", req->answer_len);
    free(req->answer);
    req_free(req);
}

static mg_conn_t *parser_conn(llhttp_t *p)
{
    return p->data;
}

/* Append bytes to a growing arena string (URL and header pieces may arrive split). */
static int append_piece(mg_http_req_t *req, char **dst, const char *at, size_t len)
{
    size_t old = *dst ? strlen(*dst) : 0;
    char *s = mg_arena_alloc(&req->arena, old + len + 1);
    if (!s) return -1;
    if (old) memcpy(s, *dst, old);
    memcpy(s + old, at, len);
    s[old + len] = '\0';
    *dst = s;
    return 0;
}

static int count_head(mg_conn_t *c, size_t len)
{
    c->header_bytes += len;
    if (c->header_bytes > c->listener->limits.max_header_bytes) {
        c->limit_status = 431;
        return -1;
    }
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    mg_conn_t *c = parser_conn(p);
    if (!c->req) {
        c->req = req_new(c);
        if (!c->req) return HPE_USER;
    }
    c->header_bytes = 0;
    c->last_header_was_value = 1;
    c->got_bytes = 1;
    if (c->timer_mode != TIMER_HEADERS) timer_set(c, TIMER_HEADERS);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    mg_conn_t *c = parser_conn(p);
    if (count_head(c, len)) return HPE_USER;
    return append_piece(c->req, &c->req->path, at, len) ? HPE_USER : 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    mg_conn_t *c = parser_conn(p);
    mg_http_req_t *req = c->req;
    if (count_head(c, len + 4)) return HPE_USER;
    if (c->last_header_was_value) {
        if (req->n_headers == req->cap_headers) {
            size_t cap = req->cap_headers ? req->cap_headers * 2 : 16;
            mg_http_header_t *h = mg_arena_alloc(&req->arena, cap * sizeof(*h));
            if (!h) return HPE_USER;
            if (req->n_headers) memcpy(h, req->headers, req->n_headers * sizeof(*h));
            req->headers = h;
            req->cap_headers = cap;
        }
        req->headers[req->n_headers].name = NULL;
        req->headers[req->n_headers].value = NULL;
        req->n_headers++;
        c->last_header_was_value = 0;
    }
    return append_piece(req, &req->headers[req->n_headers - 1].name, at, len) ? HPE_USER : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    mg_conn_t *c = parser_conn(p);
    mg_http_req_t *req = c->req;
    if (count_head(c, len)) return HPE_USER;
    c->last_header_was_value = 1;
    if (req->n_headers == 0) return HPE_USER;
    return append_piece(req, &req->headers[req->n_headers - 1].value, at, len) ? HPE_USER : 0;
}

/* Whether a reserve connection may ask for `path`: a prefix in the NULL-terminated list. */
static int reserve_path(const char *const *prefixes, const char *path)
{
    for (; prefixes && *prefixes; prefixes++)
        if (strncmp(path, *prefixes, strlen(*prefixes)) == 0) return 1;
    return 0;
}

static int body_reserve(mg_http_req_t *req, size_t need)
{
    if (need + 1 <= req->body_cap) return 0;
    /* the first allocation fits what is known to come (a Content-Length, or a first chunk),
     * rounded to 64: a request's body lives as long as its answer, an open stream's too */
    size_t cap = req->body_cap ? req->body_cap : (need + 1 + 63) & ~(size_t)63;
    while (cap < need + 1) cap *= 2;
    char *b = realloc(req->body, cap);
    if (!b) return -1;
    req->body = b;
    req->body_cap = cap;
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    mg_conn_t *c = parser_conn(p);
    mg_http_req_t *req = c->req;
    req->method = p->method;
    req->keep_alive = llhttp_should_keep_alive(p);
    req->http10 = p->http_major == 1 && p->http_minor == 0;
    p->upgrade = 0; /* no protocol upgrades (h2c, websocket): answer as plain HTTP/1.1 */
    for (size_t i = 0; i < req->n_headers; i++) {
        char *v = req->headers[i].value;
        if (!v) {
            req->headers[i].value = "";
            continue;
        }
        size_t n = strlen(v); /* llhttp keeps trailing whitespace: drop it */
        while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) v[--n] = '\0';
    }
    if (req->path) {
        char *q = strchr(req->path, '?');
        if (q) {
            *q = '\0';
            req->query = q + 1;
        }
    } else {
        req->path = "/";
    }
    if (c->reserve && !reserve_path(c->listener->limits.reserve_paths, req->path)) {
        c->limit_status = 503; /* a reserve connection asks for something else */
        return -1;
    }
    size_t max = c->listener->limits.max_body_bytes;
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > max) {
        c->limit_status = 413;
        return -1;
    }
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0) {
        if (body_reserve(req, (size_t)p->content_length)) return HPE_USER;
    }
    if (((p->flags & F_CONTENT_LENGTH) && p->content_length > 0) || (p->flags & F_CHUNKED)) {
        /* the head's deadline stays armed; when it passes, the body's is worked out */
        c->body_start = uv_now(c->listener->loop);
        c->in_body = 1;
    }
    const char *expect = mg_http_header(req, "Expect");
    if (expect && strcasecmp(expect, "100-continue") == 0) {
        uv_buf_t b = uv_buf_init("HTTP/1.1 100 Continue\r\n\r\n", 25);
        conn_write(c, &b, 1);
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    mg_conn_t *c = parser_conn(p);
    mg_http_req_t *req = c->req;
    if (req->body_len + len > c->listener->limits.max_body_bytes) {
        c->limit_status = 413;
        return -1;
    }
    if (body_reserve(req, req->body_len + len)) return HPE_USER;
    memcpy(req->body + req->body_len, at, len);
    req->body_len += len;
    req->body[req->body_len] = '\0';
    return 0; /* the body's deadline moves with body_len: checked when the timer fires */
}

static int on_message_complete(llhttp_t *p)
{
    mg_conn_t *c = parser_conn(p);
    c->busy = 1;
    c->in_body = 0;
    timer_set(c, TIMER_NONE);
    return HPE_PAUSED;
}

static void settings_init(void)
{
    if (g_settings_ready) return;
    llhttp_settings_init(&g_settings);
    g_settings.on_message_begin = on_message_begin;
    g_settings.on_url = on_url;
    g_settings.on_header_field = on_header_field;
    g_settings.on_header_value = on_header_value;
    g_settings.on_headers_complete = on_headers_complete;
    g_settings.on_body = on_body;
    g_settings.on_message_complete = on_message_complete;
    g_settings_ready = 1;
}

/* Parse [data, data+len). Returns bytes consumed, or -1 when the connection was
 * closed because of a protocol error. Stops after one complete request. */
static long parse_input(mg_conn_t *c, const char *data, size_t len)
{
    llhttp_errno_t err = llhttp_execute(&c->parser, data, len);
    if (err == HPE_OK) return (long)len;
    if (err == HPE_PAUSED) {
        const char *pos = llhttp_get_error_pos(&c->parser);
        llhttp_resume(&c->parser);
        return pos ? (long)(pos - data) : (long)len;
    }
    if (!c->req) c->req = req_new(c);
    if (!c->req) {
        conn_close(c);
        return -1;
    }
    if (c->limit_status == 431)
        send_error_and_close(c, 431, "HEADERS_TOO_LARGE", "request headers too large", 0, 1);
    else if (c->limit_status == 413)
        send_error_and_close(c, 413, "REQUEST_TOO_LARGE", "request body too large", 0, 1);
    else if (c->limit_status == 503) refuse_request(c);
    else send_error_and_close(c, 400, "INVALID_REQUEST", "malformed HTTP request", 0, 1);
    return -1;
}

/* Hand the parsed request to the handler. */
static void dispatch(mg_conn_t *c)
{
    mg_http_req_t *req = c->req;
    c->got_bytes = 0;
    /* no random bytes: the request goes on untraced (its answers carry no traceparent) */
    (void)mg_trace_start(&req->trace, mg_http_header(req, "traceparent"));
    c->listener->handler(c->listener->ud, req);
}

static int input_reserve(mg_conn_t *c, size_t extra)
{
    if (c->in_off > 0 && c->in_off == c->in_len) c->in_off = c->in_len = 0;
    if (c->in_off > 0 && c->in_len + extra > c->in_cap) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_len + extra <= c->in_cap) return 0;
    size_t cap = c->in_cap ? c->in_cap : 4096;
    while (cap < c->in_len + extra) cap *= 2;
    char *n = realloc(c->in, cap);
    if (!n) return -1;
    c->in = n;
    c->in_cap = cap;
    return 0;
}

/* Parse whatever is pending in the connection's buffer, dispatching complete
 * requests one at a time for as long as they are answered synchronously. */
static void conn_pump(mg_conn_t *c)
{
    c->pumping = 1;
    while (!c->closing && !c->busy && c->in_len > c->in_off) {
        long n = parse_input(c, c->in + c->in_off, c->in_len - c->in_off);
        if (n < 0) break;
        c->in_off += (size_t)n;
        if (c->busy) dispatch(c);
    }
    c->pumping = 0;
    if (c->closing) return;
    if (c->in_off == c->in_len) c->in_off = c->in_len = 0;
    /* idle time starts once the response is out, not while the client still reads it */
    if (!c->busy && !c->got_bytes && uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0)
        timer_set(c, TIMER_IDLE);
    if (!c->reading && c->in_len - c->in_off < MAX_PENDING_INPUT) {
        conn_read_start(c);
    }
}

/* ------------------------------------------------------------------------ */
/* Connection lifecycle                                                      */
/* ------------------------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    mg_conn_t *c = h->data;
    mg_listener_t *l = c->listener;
    /* Nothing carried over: read into the listener's shared buffer, also while a request is
     * with the handler (on_read keeps what it cannot parse yet in c->in, sized to what came).
     * A buffer of its own per busy connection would be READ_CHUNK for every open stream. */
    if (c->in_len == c->in_off) {
        c->in_len = c->in_off = 0;
        *buf = uv_buf_init(l->rbuf, (unsigned)l->rbuf_cap);
        return;
    }
    if (input_reserve(c, READ_CHUNK) != 0) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    mg_conn_t *c = s->data;
    if (nread == 0) return;
    if (nread < 0) {
        /* EOF or error: the client is gone; a request in flight is aborted. */
        conn_close(c);
        return;
    }
    mg_listener_t *l = c->listener;
    if (buf->base == l->rbuf) {
        /* Fast path: parse straight from the shared buffer. */
        size_t len = (size_t)nread, off = 0;
        c->pumping = 1;
        while (!c->closing && !c->busy && off < len) {
            long n = parse_input(c, buf->base + off, len - off);
            if (n < 0) break;
            off += (size_t)n;
            if (c->busy) dispatch(c);
        }
        c->pumping = 0;
        if (c->closing) return;
        if (off < len) {
            /* keep the rest (partial or pipelined request) for later */
            if (input_reserve(c, len - off) != 0) {
                conn_close(c);
                return;
            }
            memcpy(c->in + c->in_len, buf->base + off, len - off);
            c->in_len += len - off;
        }
        if (!c->busy) conn_pump(c);
    } else {
        c->in_len += (size_t)nread;
        if (!c->busy) conn_pump(c);
    }
    if (c->closing) return;
    if (c->busy && c->in_len - c->in_off >= MAX_PENDING_INPUT && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void conn_read_start(mg_conn_t *c)
{
    c->reading = 1;
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) conn_close(c);
}

static void on_handle_closed(uv_handle_t *h)
{
    mg_conn_t *c = h->data;
    if (--c->handles_open > 0) return;
    if (c->refusing) c->listener->n_refusals_open--;
    if (c->spare) req_free(c->spare);
    /* a crowd of connections leaving (slow clients timed out, say) frees many small blocks
     * that glibc keeps in the heap: they count towards a trim as large buffers do */
    if (c->listener->limits.trim) mg_memtrim_note(c->listener->limits.trim, sizeof(*c) + c->in_cap);
    free(c->in);
    free(c);
}

static void close_handles(mg_conn_t *c)
{
    if (uv_is_closing((uv_handle_t *)&c->tcp)) return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

/* Lingering close: after an error answer the client may still be sending the
 * request we refused. Closing with unread input makes the kernel send a reset,
 * which can destroy our answer before the client reads it; so drain for a while. */
static void on_linger_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    mg_conn_t *c = h->data;
    c->in_len = c->in_off = 0; /* whatever arrives now is dropped */
    if (input_reserve(c, 4096) != 0) {
        *buf = uv_buf_init(NULL, 0);
        return;
    }
    *buf = uv_buf_init(c->in, (unsigned)c->in_cap);
}

static void on_linger_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    if (nread < 0) close_handles(s->data);
}

static void on_linger_timeout(uv_timer_t *t)
{
    close_handles(t->data);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    mg_conn_t *c = sr->data;
    free(sr);
    c->write_due = 0; /* flushed (or failed): no more write checks */
    if (c->linger && status == 0 &&
        uv_read_start((uv_stream_t *)&c->tcp, on_linger_alloc, on_linger_read) == 0) {
        c->timer_armed = 0;
        uv_timer_start(&c->timer, on_linger_timeout, LINGER_MS, 0);
        return;
    }
    close_handles(c);
}

static void stats_open(mg_listener_t *l)
{
    if (l->limits.stats) l->limits.stats->open = l->n_conns;
}

/* End the connection: unlink it and abort a request in flight (its owner's hook runs, told
 * why by req->abort). Then a graceful shutdown, which lets queued bytes reach the client
 * first (watched by the write timeout while it waits), or with `now` a close at once that
 * drops them. */
static void conn_end(mg_conn_t *c, int now)
{
    if (c->closing) return;
    c->closing = 1;
    mg_listener_t *l = c->listener;
    if (c->prev) c->prev->next = c->next;
    else l->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    l->n_conns--;
    if (c->refusing) l->n_refusing--;
    stats_open(l);
    if (c->req) {
        mg_http_req_t *req = c->req;
        c->req = NULL;
        req->abort = c->abort;
        if (c->busy && req->on_abort) req->on_abort(req->hook_data);
        req_free(req);
    }
    c->timer_mode = TIMER_NONE;
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (!now) {
        uv_shutdown_t *sr = malloc(sizeof(*sr));
        if (sr) {
            sr->data = c;
            if (uv_shutdown(sr, (uv_stream_t *)&c->tcp, on_shutdown) == 0) {
                if (c->write_due) arm_at(c, c->write_due); /* a stalled client is closed */
                else uv_timer_stop(&c->timer);
                return;
            }
            free(sr);
        }
    }
    close_handles(c);
}

static void conn_close(mg_conn_t *c)
{
    conn_end(c, 0);
}

/* Past the reserve: answer 503 at once, without reading the request, and close. */
static void conn_refuse(mg_conn_t *c)
{
    c->refusing = 1;
    c->listener->n_refusing++;
    c->listener->n_refusals_open++;
    c->req = req_new(c);
    if (!c->req) {
        conn_close(c);
        return;
    }
    refuse_request(c);
}

static void refuse_request(mg_conn_t *c)
{
    mg_acceptor_refused(&c->listener->acceptor);
    send_error_and_close(c, 503, "RESOURCE_EXHAUSTED", "too many connections; retry later", 1000,
                         0);
}

/* Whether a new connection fits: 0 under max_connections, 1 in the reserve (reserve paths
 * only), 2 past both (refused). */
static int conn_slot(const mg_listener_t *l)
{
    const mg_http_limits_t *lim = &l->limits;
    size_t serving = l->n_conns - l->n_refusing;
    if (!lim->max_connections || serving < lim->max_connections) return 0;
    size_t reserve = lim->reserve_paths ? lim->reserved_connections : 0;
    return serving < lim->max_connections + reserve ? 1 : 2;
}

static void on_accepted(void *ud, int fd)
{
    mg_listener_t *l = ud;
    int slot = conn_slot(l);
    /* 503s still lingering are bounded too: past that, a refusal is a plain close */
    if (l->stopping || (slot == 2 && l->n_refusals_open >= MG_HTTP_REFUSING_MAX)) {
        if (!l->stopping) mg_acceptor_refused(&l->acceptor);
        close(fd);
        return;
    }
    mg_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return;
    }
    c->listener = l;
    uv_tcp_init(l->loop, &c->tcp);
    uv_timer_init(l->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
        uv_close((uv_handle_t *)&c->timer, on_handle_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    llhttp_init(&c->parser, HTTP_REQUEST, &g_settings);
    c->parser.data = c;
    c->next = l->conns;
    if (l->conns) l->conns->prev = c;
    l->conns = c;
    l->n_conns++;
    stats_open(l);
    if (slot == 2) {
        conn_refuse(c);
        return;
    }
    c->reserve = slot == 1;
    /* the first request gets header_read_ms from the moment of connecting */
    timer_set(c, TIMER_HEADERS);
    conn_read_start(c);
}

/* ------------------------------------------------------------------------ */
/* Listener                                                                  */
/* ------------------------------------------------------------------------ */

int mg_listener_start(mg_listener_t *l, uv_loop_t *loop, const char *addr,
                      const mg_http_limits_t *limits, mg_http_handler_fn handler, void *ud)
{
    settings_init();
    memset(l, 0, sizeof(*l));
    l->loop = loop;
    l->limits = *limits;
    l->handler = handler;
    l->ud = ud;
    l->rbuf_cap = READ_CHUNK;
    l->rbuf = malloc(l->rbuf_cap);
    if (!l->rbuf) return UV_ENOMEM;
    int rc =
        mg_acceptor_open(&l->acceptor, loop, addr, limits->name, limits->stats, on_accepted, l);
    if (rc != 0) {
        free(l->rbuf);
        l->rbuf = NULL;
        return rc;
    }
    l->acceptor.max_connections = limits->max_connections;
    if (limits->stats) limits->stats->max_connections = limits->max_connections;
    snprintf(l->bound, sizeof(l->bound), "%s", l->acceptor.bound);
    return 0;
}

void mg_listener_stop(mg_listener_t *l)
{
    if (l->stopping) return;
    l->stopping = 1;
    mg_acceptor_close(&l->acceptor);
    mg_conn_t *c = l->conns;
    while (c) {
        mg_conn_t *next = c->next;
        if (!c->busy) conn_close(c);
        else c->close_after = 1;
        c = next;
    }
}

void mg_listener_close(mg_listener_t *l)
{
    l->stopping = 1;
    mg_acceptor_close(&l->acceptor);
    while (l->conns) conn_close(l->conns);
    free(l->rbuf);
    l->rbuf = NULL;
}

size_t mg_listener_busy(const mg_listener_t *l)
{
    size_t n = 0;
    for (const mg_conn_t *c = l->conns; c; c = c->next)
        if (c->busy) n++;
    return n;
}

void mg_http_log_ids(mg_logline_t *l, const mg_http_req_t *req)
{
    mg_log_str(l, "request_id", req->request_id);
    if (!req->trace.trace_id[0]) return;
    mg_log_strn(l, "trace_id", req->trace.trace_id, MG_TRACE_ID_HEX);
    mg_log_strn(l, "span_id", req->trace.span_id, MG_SPAN_ID_HEX);
}
