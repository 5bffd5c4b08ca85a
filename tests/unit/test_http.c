/* Unit tests for core/net/http.c: a real mg_listener_t on 127.0.0.1:0 inside a libuv loop on
 * the main thread, and a scripted client with plain blocking sockets on a helper thread
 * (every receive bounded by SO_RCVTIMEO, every scenario by a guard timer).
 *
 * The test handler answers according to the path: /echo describes the request back,
 * /async answers from a uv_timer, /hold keeps the request until the client leaves,
 * /stream and /holdstream answer chunked, /stop stops the listener while busy, /big
 * and /flood send large bodies (the latter with write-pending back-pressure).
 *
 * Threads: the loop thread only records what happened (counters read by the client with
 * atomics); CHECKs run on the client thread during a scenario, or on the main thread
 * after the loop has returned. */
#include "base/memtrim.h"
#include "net/http.h"
#include "mgtest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- shared server state ---------------------------------------------------------------- */

typedef struct {
    uv_loop_t loop;
    mg_listener_t l;
    int port;
    uv_async_t done;
    uv_timer_t guard;
    pthread_t th;
    void (*client)(void);
    int finishing;
    int guard_fired;
    int leftover_fd; /* a client socket the main thread closes after the loop */
    /* written by the loop thread, read by the client with atomics */
    int requests;
    int aborts;
    int held;         /* requests currently held by /hold or /holdstream */
    int stopped;      /* /stop called mg_listener_stop */
    int late_use;     /* a job's timer found its request already aborted */
    int drains;       /* on_drain calls seen by /flood */
    int pending_seen; /* mg_http_write_pending() said full at least once */
    int max_conns;    /* highest n_conns seen by the handler */
    int max_busy;     /* highest mg_listener_busy() seen by the handler */
    int last_abort;   /* req->abort + 1 of the last aborted job (0: none) */
} srv_t;

static srv_t S;

static int aload(int *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
static void ainc(int *p)
{
    __atomic_fetch_add(p, 1, __ATOMIC_SEQ_CST);
}
static void aset(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Client side: wait until *p >= v, at most ms. Returns 1 when reached. */
static int wait_for(int *p, int v, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (aload(p) < v) {
        if (now_ms() > end) return 0;
        usleep(1000);
    }
    return 1;
}

/* ---- the test handler ------------------------------------------------------------------- */

#define BIG_BYTES (4u * 1024u * 1024u)
#define FLOOD_BYTES (24u * 1024u * 1024u)
#define FLOOD_CHUNK (64u * 1024u)

typedef enum { JOB_ECHO, JOB_HOLD, JOB_HOLDSTREAM, JOB_FLOOD } job_kind_t;

typedef struct {
    uv_timer_t t;
    mg_http_req_t *req; /* NULL once answered or aborted */
    job_kind_t kind;
    size_t sent; /* /flood */
    char *chunk; /* /flood */
} job_t;

static const char *hdr_or_none(const mg_http_req_t *req, const char *name)
{
    const char *h = mg_http_header(req, name);
    return h ? h : "(none)";
}

static void echo(mg_http_req_t *req)
{
    char head[1024];
    int n = snprintf(head, sizeof(head),
                     "method=%s\npath=%s\nquery=%s\nx-test=%s\nhost=%s\nx-empty=%s\n"
                     "n_headers=%zu\nbody_len=%zu\nbody=",
                     llhttp_method_name((llhttp_method_t)req->method), req->path,
                     req->query ? req->query : "(none)", hdr_or_none(req, "x-test"),
                     hdr_or_none(req, "HOST"), hdr_or_none(req, "X-Empty"), req->n_headers,
                     req->body_len);
    if (n >= (int)sizeof(head)) n = (int)sizeof(head) - 1;
    size_t total = (size_t)n + req->body_len + 1;
    char *out = malloc(total);
    memcpy(out, head, (size_t)n);
    if (req->body_len) memcpy(out + n, req->body, req->body_len);
    out[total - 1] = '\n';
    const char *extra = req->path && strcmp(req->path, "/echo-extra") == 0
                            ? "X-Extra: yes\r\nCache-Control: no-store\r\n"
                            : NULL;
    mg_http_respond(req, 200, "text/plain", extra, out, total);
    free(out);
}

static void job_closed(uv_handle_t *h)
{
    job_t *j = h->data;
    free(j->chunk);
    free(j);
}

static void job_done(job_t *j)
{
    j->req = NULL;
    uv_timer_stop(&j->t);
    uv_close((uv_handle_t *)&j->t, job_closed);
}

static void job_abort(void *data)
{
    job_t *j = data;
    if (j->req) aset(&S.last_abort, (int)j->req->abort + 1);
    ainc(&S.aborts);
    if (j->kind == JOB_HOLD || j->kind == JOB_HOLDSTREAM)
        __atomic_fetch_sub(&S.held, 1, __ATOMIC_SEQ_CST);
    job_done(j);
}

static void flood_pump(job_t *j);

static void flood_drain(void *data)
{
    ainc(&S.drains);
    flood_pump(data);
}

static void flood_pump(job_t *j)
{
    mg_http_req_t *req = j->req;
    while (j->sent < FLOOD_BYTES) {
        if (mg_http_write_pending(req)) {
            aset(&S.pending_seen, 1);
            req->on_drain = flood_drain;
            return;
        }
        memset(j->chunk, 'a' + (int)((j->sent / FLOOD_CHUNK) % 26), FLOOD_CHUNK);
        mg_http_stream_write(req, j->chunk, FLOOD_CHUNK);
        j->sent += FLOOD_CHUNK;
    }
    req->on_drain = NULL;
    req->on_abort = NULL;
    job_done(j);
    mg_http_stream_end(req);
}

static void job_fire(uv_timer_t *t)
{
    job_t *j = t->data;
    mg_http_req_t *req = j->req;
    if (!req) {
        ainc(&S.late_use);
        return;
    }
    req->on_abort = NULL;
    job_done(j);
    if (j->kind == JOB_HOLDSTREAM) {
        mg_http_stream_end(req);
    } else {
        echo(req);
    }
}

static job_t *job_new(mg_http_req_t *req, job_kind_t kind, int ms)
{
    job_t *j = calloc(1, sizeof(*j));
    j->req = req;
    j->kind = kind;
    uv_timer_init(&S.loop, &j->t);
    j->t.data = j;
    req->on_abort = job_abort;
    req->hook_data = j;
    if (ms >= 0) uv_timer_start(&j->t, job_fire, (uint64_t)ms, 0);
    return j;
}

static int query_int(const mg_http_req_t *req, const char *key, int dflt)
{
    if (!req->query) return dflt;
    const char *p = strstr(req->query, key);
    if (!p || p[strlen(key)] != '=') return dflt;
    return atoi(p + strlen(key) + 1);
}

static void handler(void *ud, mg_http_req_t *req)
{
    ainc(&S.requests);
    if ((int)S.l.n_conns > S.max_conns) S.max_conns = (int)S.l.n_conns;
    if ((int)mg_listener_busy(&S.l) > S.max_busy) S.max_busy = (int)mg_listener_busy(&S.l);
    const char *p = req->path;
    if (strcmp(p, "/echo") == 0 || strcmp(p, "/echo-extra") == 0) {
        echo(req);
    } else if (strcmp(p, "/async") == 0) {
        job_new(req, JOB_ECHO, query_int(req, "ms", 50));
    } else if (strcmp(p, "/hold") == 0) {
        ainc(&S.held);
        job_new(req, JOB_HOLD, 3000); /* would answer long after every client gave up */
    } else if (strcmp(p, "/holdstream") == 0) {
        mg_http_stream_begin(req, 200, "text/event-stream", NULL);
        mg_http_stream_write(req, "data: first\n\n", 13);
        ainc(&S.held);
        job_new(req, JOB_HOLDSTREAM, 3000);
    } else if (strcmp(p, "/stream") == 0) {
        static char big[3000];
        memset(big, 'x', sizeof(big));
        mg_http_stream_begin(req, 200, "text/event-stream", "X-Stream: 1\r\n");
        mg_http_stream_write(req, "hello", 5);
        mg_http_stream_write(req, "", 0); /* ignored: a 0 chunk would end the body */
        mg_http_stream_write(req, " ", 1);
        mg_http_stream_write(req, "world", 5);
        mg_http_stream_write(req, big, sizeof(big));
        mg_http_stream_end(req);
    } else if (strcmp(p, "/stream-open") == 0) {
        /* the head with a first chunk, then a chunk with the end: two writes */
        mg_http_stream_open(req, 200, "text/event-stream", NULL, "abc", 3, 0);
        mg_http_stream_send(req, "defg", 4, 1);
    } else if (strcmp(p, "/stream-whole") == 0) {
        mg_http_stream_open(req, 200, "text/event-stream", NULL, "whole", 5, 1); /* one write */
    } else if (strcmp(p, "/stream-empty") == 0) {
        mg_http_stream_open(req, 200, "text/event-stream", NULL, NULL, 0, 0);
        mg_http_stream_send(req, NULL, 0, 0); /* nothing */
        mg_http_stream_send(req, NULL, 0, 1);
    } else if (strcmp(p, "/stop") == 0) {
        mg_listener_stop(&S.l);
        aset(&S.stopped, 1);
        job_new(req, JOB_ECHO, 150);
    } else if (strcmp(p, "/close") == 0) {
        mg_http_set_close(req);
        echo(req);
    } else if (strcmp(p, "/big") == 0) {
        char *b = malloc(BIG_BYTES);
        for (size_t i = 0; i < BIG_BYTES; i++) b[i] = (char)('A' + (i % 23));
        mg_http_respond(req, 200, "application/octet-stream", NULL, b, BIG_BYTES);
        free(b);
    } else if (strcmp(p, "/flood") == 0) {
        job_t *j = job_new(req, JOB_FLOOD, -1);
        j->chunk = malloc(FLOOD_CHUNK);
        mg_http_stream_begin(req, 200, "application/octet-stream", NULL);
        flood_pump(j);
    } else {
        mg_http_respond(req, 404, "application/json", NULL, "{\"error\":\"nf\"}", 14);
    }
}

/* ---- running a scenario ------------------------------------------------------------------ */

static void finish(void)
{
    if (S.finishing) return;
    S.finishing = 1;
    mg_listener_close(&S.l); /* aborts whatever is still held */
    uv_timer_stop(&S.guard);
    uv_close((uv_handle_t *)&S.guard, NULL);
    uv_close((uv_handle_t *)&S.done, NULL);
}

static void on_client_done(uv_async_t *a)
{
    finish();
}

static void on_guard(uv_timer_t *t)
{
    S.guard_fired = 1;
    fprintf(stderr, "  scenario guard timer fired\n");
    finish();
}

static void *client_main(void *arg)
{
    S.client();
    uv_async_send(&S.done);
    return NULL;
}

static void walk_close(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h)) {
        (*(int *)arg)++;
        uv_close(h, NULL);
    }
}

static mg_http_limits_t default_limits(void)
{
    mg_http_limits_t l = {.max_body_bytes = 1024 * 1024,
                          .max_header_bytes = 8192,
                          .header_read_ms = 2000,
                          .keepalive_idle_ms = 2000,
                          .request_read_ms = 10000,
                          .min_body_bytes_per_s = 1024};
    return l;
}

/* Start a listener with `lim`, run `client` on a thread, run the loop until the client
 * is done and everything is closed. Returns 0 when the scenario ran cleanly. */
static int run_scenario(const mg_http_limits_t *lim, void (*client)(void))
{
    memset(&S, 0, sizeof(S));
    S.leftover_fd = -1;
    S.client = client;
    CHECK_EQ_INT(uv_loop_init(&S.loop), 0);
    int rc = mg_listener_start(&S.l, &S.loop, "127.0.0.1:0", lim, handler, NULL);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) return -1;
    const char *colon = strrchr(S.l.bound, ':');
    S.port = colon ? atoi(colon + 1) : 0;
    CHECK(strncmp(S.l.bound, "127.0.0.1:", 10) == 0);
    CHECK(S.port > 0);
    uv_async_init(&S.loop, &S.done, on_client_done);
    uv_timer_init(&S.loop, &S.guard);
    uv_timer_start(&S.guard, on_guard, 8000, 0);
    pthread_create(&S.th, NULL, client_main, NULL);
    uv_run(&S.loop, UV_RUN_DEFAULT);
    pthread_join(S.th, NULL);
    if (S.leftover_fd >= 0) close(S.leftover_fd);
    int open_handles = 0;
    uv_walk(&S.loop, walk_close, &open_handles);
    if (open_handles) {
        fprintf(stderr, "  %d handles still open after the scenario\n", open_handles);
        uv_run(&S.loop, UV_RUN_DEFAULT);
    }
    CHECK_EQ_INT(open_handles, 0);
    CHECK_EQ_INT(uv_loop_close(&S.loop), 0);
    CHECK_EQ_INT(S.guard_fired, 0);
    CHECK_EQ_INT(S.late_use, 0);
    return 0;
}

/* ---- a blocking HTTP client -------------------------------------------------------------- */

typedef struct {
    int fd;
    char *buf;
    size_t len, cap;
} cli_t;

typedef struct {
    int status;
    char head[8192];
    char *body; /* malloc, NUL-terminated */
    size_t body_len;
    int chunked;
    int n_chunks;
    size_t chunk_sizes[64];
} resp_t;

static int cli_connect_port(cli_t *c, int port)
{
    memset(c, 0, sizeof(*c));
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {2, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(c->fd);
        c->fd = -1;
        return -e;
    }
    c->cap = 65536;
    c->buf = malloc(c->cap);
    return 0;
}

static int cli_open(cli_t *c)
{
    int rc = cli_connect_port(c, S.port);
    CHECK_EQ_INT(rc, 0);
    return rc;
}

static void cli_close(cli_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
}

/* Close with RST instead of FIN. */
static void cli_reset(cli_t *c)
{
    struct linger lg = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    cli_close(c);
}

static int cli_send(cli_t *c, const char *s, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(c->fd, s + off, n - off, MSG_NOSIGNAL);
        if (w <= 0) return -1;
        off += (size_t)w;
    }
    return 0;
}

static int cli_sends(cli_t *c, const char *s)
{
    return cli_send(c, s, strlen(s));
}

/* Receive more bytes: >0 got some, 0 EOF, -1 timeout/error (errno kept). */
static int cli_fill(cli_t *c)
{
    if (c->cap - c->len < 65536) {
        c->cap = c->cap * 2 + 65536;
        c->buf = realloc(c->buf, c->cap);
    }
    /* at most 128 KiB a time: consuming memmoves what is left over */
    size_t room = c->cap - c->len - 1;
    ssize_t n = recv(c->fd, c->buf + c->len, room < 131072 ? room : 131072, 0);
    if (n > 0) c->len += (size_t)n;
    c->buf[c->len] = '\0';
    return n > 0 ? 1 : (n == 0 ? 0 : -1);
}

static void cli_consume(cli_t *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Index of "\r\n" at or after `from`, or -1 after EOF / timeout. */
static long cli_line(cli_t *c, size_t from)
{
    for (;;) {
        for (size_t i = from; i + 1 < c->len; i++)
            if (c->buf[i] == '\r' && c->buf[i + 1] == '\n') return (long)i;
        if (cli_fill(c) <= 0) return -1;
    }
}

static int cli_need(cli_t *c, size_t n)
{
    while (c->len < n)
        if (cli_fill(c) <= 0) return -1;
    return 0;
}

static const char *resp_header(const resp_t *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = strstr(r->head, "\r\n");
    while (p && p[2]) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t len = e ? (size_t)(e - v) : strlen(v);
            if (len >= cap) len = cap - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            return out;
        }
        p = strstr(p, "\r\n");
    }
    return NULL;
}

static void resp_free(resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

/* Read one response (a 1xx too: status set, no body). 0 or -1. */
static int cli_response(cli_t *c, resp_t *r)
{
    memset(r, 0, sizeof(*r));
    /* the head ends at the first empty line */
    size_t from = 0;
    long end;
    for (;;) {
        end = cli_line(c, from);
        if (end < 0) return -1;
        if ((size_t)end == from && from > 0) break;
        from = (size_t)end + 2;
    }
    size_t head_len = (size_t)end + 2;
    if (head_len >= sizeof(r->head)) return -1;
    memcpy(r->head, c->buf, head_len);
    r->head[head_len] = '\0';
    cli_consume(c, head_len);
    if (sscanf(r->head, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    r->body = calloc(1, 1);
    if (r->status < 200 || r->status == 204) return 0;
    char v[64];
    if (resp_header(r, "Transfer-Encoding", v, sizeof(v)) && strcasecmp(v, "chunked") == 0) {
        r->chunked = 1;
        size_t body_cap = 1;
        for (;;) {
            long le = cli_line(c, 0);
            if (le < 0) return -1;
            size_t size = strtoul(c->buf, NULL, 16);
            cli_consume(c, (size_t)le + 2);
            if (size == 0) {
                if (cli_line(c, 0) != 0) return -1; /* no trailers: just CRLF */
                cli_consume(c, 2);
                return 0;
            }
            if (r->n_chunks < 64) r->chunk_sizes[r->n_chunks] = size;
            r->n_chunks++;
            if (cli_need(c, size + 2) != 0) return -1;
            if (c->buf[size] != '\r' || c->buf[size + 1] != '\n') return -1;
            if (r->body_len + size + 1 > body_cap) { /* geometric: ASan's realloc always copies */
                while (r->body_len + size + 1 > body_cap) body_cap = body_cap * 2 + 4096;
                r->body = realloc(r->body, body_cap);
            }
            memcpy(r->body + r->body_len, c->buf, size);
            r->body_len += size;
            r->body[r->body_len] = '\0';
            cli_consume(c, size + 2);
        }
    }
    if (resp_header(r, "Content-Length", v, sizeof(v))) {
        size_t n = strtoul(v, NULL, 10);
        if (cli_need(c, n) != 0) return -1;
        r->body = realloc(r->body, n + 1);
        memcpy(r->body, c->buf, n);
        r->body[n] = '\0';
        r->body_len = n;
        cli_consume(c, n);
        return 0;
    }
    return -1; /* the server always frames its bodies */
}

/* 1 when the server closes (EOF or reset) with nothing more to read, 0 when bytes
 * arrive instead, -1 on timeout. */
static int cli_eof(cli_t *c)
{
    if (c->len > 0) return 0;
    int rc = cli_fill(c);
    if (rc > 0) return 0;
    if (rc == 0) return 1;
    return errno == ECONNRESET ? 1 : -1;
}

/* Value of "key=" in an /echo body ("(missing)" when absent); static buffer. */
static const char *ev(const resp_t *r, const char *key)
{
    static char out[4096];
    char k[64];
    snprintf(k, sizeof(k), "%s=", key);
    const char *p = r->body;
    while (p) {
        if (strncmp(p, k, strlen(k)) == 0) {
            p += strlen(k);
            const char *e = strcmp(key, "body") == 0 ? p + strlen(p) - 1 : strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            if (n >= sizeof(out)) n = sizeof(out) - 1;
            memcpy(out, p, n);
            out[n] = '\0';
            return out;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return "(missing)";
}

static int valid_request_id(const char *id)
{
    if (strlen(id) != MG_REQUEST_ID_LEN || strncmp(id, "req-", 4) != 0) return 0;
    for (int i = 4; i < MG_REQUEST_ID_LEN; i++)
        if (!strchr("0123456789abcdef", id[i])) return 0;
    return 1;
}

/* Send `req`, read one response, expect `status`. The response is left in *r. */
static int roundtrip(cli_t *c, const char *req, resp_t *r, int status)
{
    if (cli_sends(c, req) != 0) {
        CHECK(!"send failed");
        return -1;
    }
    int rc = cli_response(c, r);
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) return -1;
    if (r->status != status) fprintf(stderr, "  got %d for %.40s\n", r->status, req);
    CHECK_EQ_INT(r->status, status);
    return 0;
}

static int has_conn_close(const resp_t *r)
{
    char v[64];
    return resp_header(r, "Connection", v, sizeof(v)) && strcasecmp(v, "close") == 0;
}

/* ---- scenarios --------------------------------------------------------------------------- */

static void sc_keepalive(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r1, r2;
    char id1[64] = "", id2[64] = "", v[128];
    if (roundtrip(&c, "GET /echo?n=1 HTTP/1.1\r\nHost: t\r\n\r\n", &r1, 200) == 0) {
        CHECK(!has_conn_close(&r1));
        CHECK_STR(ev(&r1, "query"), "n=1");
        CHECK(resp_header(&r1, "X-Request-Id", id1, sizeof(id1)) != NULL);
        CHECK(valid_request_id(id1));
        CHECK_STR(resp_header(&r1, "Content-Type", v, sizeof(v)), "text/plain");
        CHECK(resp_header(&r1, "Date", v, sizeof(v)) != NULL);
        CHECK(strncmp(r1.head, "HTTP/1.1 200 OK\r\n", 17) == 0);
    }
    if (roundtrip(&c, "GET /echo?n=2 HTTP/1.1\r\nHost: t\r\n\r\n", &r2, 200) == 0) {
        CHECK_STR(ev(&r2, "query"), "n=2");
        resp_header(&r2, "X-Request-Id", id2, sizeof(id2));
        CHECK(valid_request_id(id2));
        CHECK(strcmp(id1, id2) != 0);
    }
    resp_free(&r1);
    resp_free(&r2);
    resp_t r3;
    /* extra headers from the handler, an unknown path */
    if (roundtrip(&c, "GET /echo-extra HTTP/1.1\r\nHost: t\r\n\r\n", &r3, 200) == 0) {
        CHECK_STR(resp_header(&r3, "X-Extra", v, sizeof(v)), "yes");
        CHECK_STR(resp_header(&r3, "Cache-Control", v, sizeof(v)), "no-store");
    }
    resp_free(&r3);
    if (roundtrip(&c, "GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n", &r3, 404) == 0)
        CHECK(strncmp(r3.head, "HTTP/1.1 404 Not Found\r\n", 24) == 0);
    resp_free(&r3);
    cli_close(&c);
}

static void test_keepalive(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_keepalive);
    CHECK_EQ_INT(S.requests, 4);
    CHECK_EQ_INT(S.max_conns, 1);
    CHECK_EQ_INT(S.aborts, 0);
}

static void sc_pipelining(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    /* one write, three requests; the middle one is answered later from a timer */
    const char *three = "GET /echo?n=1 HTTP/1.1\r\nHost: t\r\n\r\n"
                        "GET /async?ms=80&n=2 HTTP/1.1\r\nHost: t\r\n\r\n"
                        "POST /echo?n=3 HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc";
    CHECK_EQ_INT(cli_sends(&c, three), 0);
    const char *want[] = {"n=1", "ms=80&n=2", "n=3"};
    char ids[3][64];
    for (int i = 0; i < 3; i++) {
        resp_t r;
        CHECK_EQ_INT(cli_response(&c, &r), 0);
        CHECK_EQ_INT(r.status, 200);
        CHECK_STR(ev(&r, "query"), want[i]);
        resp_header(&r, "X-Request-Id", ids[i], sizeof(ids[i]));
        if (i == 2) CHECK_STR(ev(&r, "body"), "abc");
        resp_free(&r);
    }
    CHECK(strcmp(ids[0], ids[1]) != 0 && strcmp(ids[1], ids[2]) != 0);
    /* all asynchronous, shortest last: still answered in request order */
    const char *async3 = "GET /async?ms=90&n=a HTTP/1.1\r\nHost: t\r\n\r\n"
                         "GET /async?ms=40&n=b HTTP/1.1\r\nHost: t\r\n\r\n"
                         "GET /async?ms=1&n=c HTTP/1.1\r\nHost: t\r\n\r\n";
    CHECK_EQ_INT(cli_sends(&c, async3), 0);
    const char *want2[] = {"ms=90&n=a", "ms=40&n=b", "ms=1&n=c"};
    for (int i = 0; i < 3; i++) {
        resp_t r;
        CHECK_EQ_INT(cli_response(&c, &r), 0);
        CHECK_STR(ev(&r, "query"), want2[i]);
        resp_free(&r);
    }
    cli_close(&c);
}

static void test_pipelining(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_pipelining);
    CHECK_EQ_INT(S.requests, 6);
    CHECK_EQ_INT(S.max_busy, 1); /* one request at a time per connection */
    CHECK_EQ_INT(S.aborts, 0);
}

static void sc_split(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    const char *two = "POST /echo?q=split HTTP/1.1\r\nHost: byte\r\nX-Test: one-by-one\r\n"
                      "Content-Length: 11\r\n\r\nhello world"
                      "GET /echo?second=1 HTTP/1.1\r\nHost: byte2\r\n\r\n";
    for (const char *p = two; *p; p++) {
        if (cli_send(&c, p, 1) != 0) break;
        usleep(300);
    }
    resp_t r;
    if (cli_response(&c, &r) == 0) {
        CHECK_EQ_INT(r.status, 200);
        CHECK_STR(ev(&r, "method"), "POST");
        CHECK_STR(ev(&r, "path"), "/echo");
        CHECK_STR(ev(&r, "query"), "q=split");
        CHECK_STR(ev(&r, "host"), "byte");
        CHECK_STR(ev(&r, "x-test"), "one-by-one");
        CHECK_STR(ev(&r, "n_headers"), "3");
        CHECK_STR(ev(&r, "body_len"), "11");
        CHECK_STR(ev(&r, "body"), "hello world");
    } else {
        CHECK(!"first response");
    }
    resp_free(&r);
    if (cli_response(&c, &r) == 0) {
        CHECK_STR(ev(&r, "method"), "GET");
        CHECK_STR(ev(&r, "query"), "second=1");
        CHECK_STR(ev(&r, "host"), "byte2");
        CHECK_STR(ev(&r, "body_len"), "0");
    } else {
        CHECK(!"second response");
    }
    resp_free(&r);
    cli_close(&c);
}

static void test_split_byte_by_byte(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_split);
    CHECK_EQ_INT(S.requests, 2);
}

static void sc_bodies(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    /* chunked request body, with a chunk extension, then keep-alive goes on */
    if (roundtrip(&c,
                  "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n",
                  &r, 200) == 0) {
        CHECK_STR(ev(&r, "body_len"), "11");
        CHECK_STR(ev(&r, "body"), "hello world");
    }
    resp_free(&r);
    /* chunked, sent in pieces split inside the size line and the data */
    CHECK_EQ_INT(
        cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1"), 0);
    usleep(20000);
    CHECK_EQ_INT(cli_sends(&c, "0\r\n0123456789"), 0);
    usleep(20000);
    CHECK_EQ_INT(cli_sends(&c, "abcdef\r\n0\r\n\r\n"), 0);
    if (cli_response(&c, &r) == 0) {
        CHECK_STR(ev(&r, "body_len"), "16");
        CHECK_STR(ev(&r, "body"), "0123456789abcdef");
    }
    resp_free(&r);
    /* Content-Length bodies: empty, and 100 KB arriving in pieces */
    if (roundtrip(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n", &r, 200) ==
        0) {
        CHECK_STR(ev(&r, "body_len"), "0");
        CHECK_STR(ev(&r, "body"), "");
    }
    resp_free(&r);
    size_t n = 100000;
    char *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    char head[128];
    snprintf(head, sizeof(head), "PUT /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n", n);
    CHECK_EQ_INT(cli_sends(&c, head), 0);
    CHECK_EQ_INT(cli_send(&c, big, n / 2), 0);
    usleep(10000);
    CHECK_EQ_INT(cli_send(&c, big + n / 2, n - n / 2), 0);
    if (cli_response(&c, &r) == 0) {
        CHECK_STR(ev(&r, "method"), "PUT");
        CHECK_STR(ev(&r, "body_len"), "100000");
        const char *b = strstr(r.body, "\nbody=");
        CHECK(b && r.body_len >= (size_t)(b - r.body) + 6 + n && memcmp(b + 6, big, n) == 0);
    }
    resp_free(&r);
    free(big);
    cli_close(&c);
}

static void test_request_bodies(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_bodies);
    CHECK_EQ_INT(S.requests, 4);
    CHECK_EQ_INT(S.max_conns, 1);
}

/* The server answers an error itself: expect the status, the JSON code, Connection:
 * close and then the end of the connection. */
static void expect_error_and_close(cli_t *c, int status, const char *code)
{
    resp_t r;
    int rc = cli_response(c, &r);
    CHECK_EQ_INT(rc, 0);
    if (rc == 0) {
        CHECK_EQ_INT(r.status, status);
        char want[64];
        snprintf(want, sizeof(want), "\"code\":\"%s\"", code);
        if (!strstr(r.body, want)) fprintf(stderr, "  body: %s\n", r.body);
        CHECK(strstr(r.body, want) != NULL);
        CHECK(strstr(r.body, "\"request_id\":\"req-") != NULL);
        CHECK(has_conn_close(&r));
        char id[64];
        CHECK(resp_header(&r, "X-Request-Id", id, sizeof(id)) && valid_request_id(id));
    }
    resp_free(&r);
    CHECK_EQ_INT(cli_eof(c), 1);
}

static void sc_body_limits(void)
{
    cli_t c;
    resp_t r;
    /* exactly at the limit: fine */
    if (cli_open(&c) == 0) {
        char req[512];
        char body[101];
        memset(body, 'b', 100);
        body[100] = '\0';
        snprintf(req, sizeof(req),
                 "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n%s", body);
        if (roundtrip(&c, req, &r, 200) == 0) CHECK_STR(ev(&r, "body_len"), "100");
        resp_free(&r);
        cli_close(&c);
    }
    /* Content-Length over the limit: refused from the headers alone */
    if (cli_open(&c) == 0) {
        CHECK_EQ_INT(cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n"),
                     0);
        expect_error_and_close(&c, 413, "REQUEST_TOO_LARGE");
        cli_close(&c);
    }
    /* a huge Content-Length: no attempt to reserve it */
    if (cli_open(&c) == 0) {
        CHECK_EQ_INT(cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\n"
                                   "Content-Length: 99999999999999\r\n\r\n"),
                     0);
        expect_error_and_close(&c, 413, "REQUEST_TOO_LARGE");
        cli_close(&c);
    }
    /* a chunked body growing past the limit */
    if (cli_open(&c) == 0) {
        char req[512], chunk[61];
        memset(chunk, 'c', 60);
        chunk[60] = '\0';
        snprintf(req, sizeof(req),
                 "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "3c\r\n%s\r\n3c\r\n%s\r\n0\r\n\r\n",
                 chunk, chunk);
        CHECK_EQ_INT(cli_sends(&c, req), 0);
        expect_error_and_close(&c, 413, "REQUEST_TOO_LARGE");
        cli_close(&c);
    }
    /* 100-continue with a body over the limit: 413 at once, no 100 */
    if (cli_open(&c) == 0) {
        CHECK_EQ_INT(cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                                   "Content-Length: 5000\r\n\r\n"),
                     0);
        expect_error_and_close(&c, 413, "REQUEST_TOO_LARGE");
        cli_close(&c);
    }
}

static void test_body_limits(void)
{
    mg_http_limits_t lim = default_limits();
    lim.max_body_bytes = 100;
    run_scenario(&lim, sc_body_limits);
    CHECK_EQ_INT(S.requests, 1); /* only the one within the limit reached the handler */
}

static void sc_header_limits(void)
{
    cli_t c;
    resp_t r;
    char pad[1200];
    /* well under the limit */
    if (cli_open(&c) == 0) {
        memset(pad, 'p', 300);
        pad[300] = '\0';
        char req[1400];
        snprintf(req, sizeof(req), "GET /echo HTTP/1.1\r\nHost: t\r\nX-Pad: %s\r\n\r\n", pad);
        roundtrip(&c, req, &r, 200);
        resp_free(&r);
        cli_close(&c);
    }
    /* one big header value */
    if (cli_open(&c) == 0) {
        memset(pad, 'h', 1000);
        pad[1000] = '\0';
        char req[1400];
        snprintf(req, sizeof(req), "GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: %s\r\n\r\n", pad);
        CHECK_EQ_INT(cli_sends(&c, req), 0);
        expect_error_and_close(&c, 431, "HEADERS_TOO_LARGE");
        cli_close(&c);
    }
    /* a long URL */
    if (cli_open(&c) == 0) {
        memset(pad, 'u', 700);
        pad[700] = '\0';
        char req[1400];
        snprintf(req, sizeof(req), "GET /echo?%s HTTP/1.1\r\nHost: t\r\n\r\n", pad);
        CHECK_EQ_INT(cli_sends(&c, req), 0);
        expect_error_and_close(&c, 431, "HEADERS_TOO_LARGE");
        cli_close(&c);
    }
    /* many small headers, sent one by one */
    if (cli_open(&c) == 0) {
        CHECK_EQ_INT(cli_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n"), 0);
        for (int i = 0; i < 60; i++) {
            char h[64];
            snprintf(h, sizeof(h), "X-H%02d: vvvvvvvv\r\n", i);
            if (cli_sends(&c, h) != 0) break;
        }
        cli_sends(&c, "\r\n");
        expect_error_and_close(&c, 431, "HEADERS_TOO_LARGE");
        cli_close(&c);
    }
    /* the limit applies per request: a keep-alive connection does not accumulate */
    if (cli_open(&c) == 0) {
        memset(pad, 'k', 300);
        pad[300] = '\0';
        char req[1400];
        snprintf(req, sizeof(req), "GET /echo HTTP/1.1\r\nHost: t\r\nX-Pad: %s\r\n\r\n", pad);
        for (int i = 0; i < 3; i++) {
            roundtrip(&c, req, &r, 200);
            resp_free(&r);
        }
        cli_close(&c);
    }
}

static void test_header_limits(void)
{
    mg_http_limits_t lim = default_limits();
    lim.max_header_bytes = 512;
    run_scenario(&lim, sc_header_limits);
    CHECK_EQ_INT(S.requests, 4);
}

static void sc_malformed(void)
{
    const char *bad[] = {
        "HELLO WORLD\r\n\r\n",
        "GET / HTTX/1.1\r\n\r\n",
        "GET /echo HTTP/1.1\r\nBad Header Line\r\n\r\n",
        "GET /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cli_t c;
        if (cli_open(&c) != 0) return;
        CHECK_EQ_INT(cli_sends(&c, bad[i]), 0);
        expect_error_and_close(&c, 400, "INVALID_REQUEST");
        cli_close(&c);
    }
    /* a good request, then garbage on the same connection */
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    CHECK_EQ_INT(cli_sends(&c, "\x01\x02garbage\r\n\r\n"), 0);
    expect_error_and_close(&c, 400, "INVALID_REQUEST");
    cli_close(&c);
}

static void test_malformed(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_malformed);
    CHECK_EQ_INT(S.requests, 1);
}

static void sc_header_timeout(void)
{
    cli_t c;
    /* partial headers, then silence: 408 after header_read_ms, then close */
    if (cli_open(&c) == 0) {
        uint64_t t0 = now_ms();
        CHECK_EQ_INT(cli_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n"), 0);
        expect_error_and_close(&c, 408, "REQUEST_TIMEOUT");
        uint64_t dt = now_ms() - t0;
        if (dt < 150 || dt > 1500) fprintf(stderr, "  408 after %llu ms\n", (unsigned long long)dt);
        CHECK(dt >= 150 && dt <= 1500);
        cli_close(&c);
    }
    /* connected, nothing sent: closed without a response */
    if (cli_open(&c) == 0) {
        uint64_t t0 = now_ms();
        CHECK_EQ_INT(cli_eof(&c), 1);
        uint64_t dt = now_ms() - t0;
        CHECK(dt >= 150 && dt <= 1500);
        cli_close(&c);
    }
    /* slowloris: a header byte every 40 ms does not extend the deadline */
    if (cli_open(&c) == 0) {
        uint64_t t0 = now_ms(), answered = 0;
        cli_sends(&c, "GET /echo HTTP/1.1\r\n");
        for (int i = 0; i < 25 && !answered; i++) {
            struct pollfd pf = {c.fd, POLLIN, 0};
            if (poll(&pf, 1, 40) > 0) answered = now_ms();
            else if (cli_sends(&c, "X") != 0) break;
        }
        expect_error_and_close(&c, 408, "REQUEST_TIMEOUT");
        uint64_t dt = (answered ? answered : now_ms()) - t0;
        if (dt > 600)
            fprintf(stderr, "  slowloris answered after %llu ms\n", (unsigned long long)dt);
        CHECK(answered != 0);
        CHECK(dt <= 600);
        cli_close(&c);
    }
    /* a body that stalls: 408 as well */
    if (cli_open(&c) == 0) {
        CHECK_EQ_INT(
            cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"), 0);
        expect_error_and_close(&c, 408, "REQUEST_TIMEOUT");
        cli_close(&c);
    }
}

static void test_header_timeout(void)
{
    mg_http_limits_t lim = default_limits();
    lim.header_read_ms = 200;
    run_scenario(&lim, sc_header_timeout);
    CHECK_EQ_INT(S.requests, 0);
}

static void sc_keepalive_idle(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    uint64_t t0 = now_ms();
    CHECK_EQ_INT(cli_eof(&c), 1);
    uint64_t dt = now_ms() - t0;
    if (dt < 150 || dt > 1500)
        fprintf(stderr, "  idle close after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 150 && dt <= 1500);
    cli_close(&c);
    /* activity before the deadline keeps it open: three requests 120 ms apart */
    if (cli_open(&c) != 0) return;
    for (int i = 0; i < 3; i++) {
        roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
        resp_free(&r);
        usleep(120000);
    }
    cli_close(&c);
}

static void test_keepalive_idle(void)
{
    mg_http_limits_t lim = default_limits();
    lim.keepalive_idle_ms = 200;
    run_scenario(&lim, sc_keepalive_idle);
    CHECK_EQ_INT(S.requests, 4);
}

static void sc_disconnect(void)
{
    cli_t c;
    /* FIN while the handler holds the request */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(wait_for(&S.requests, 1, 2000));
        cli_close(&c);
        CHECK(wait_for(&S.aborts, 1, 2000));
    }
    /* RST while held, with a pipelined request behind it (never dispatched) */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\nGET /echo HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(wait_for(&S.requests, 2, 2000));
        usleep(20000);
        cli_reset(&c);
        CHECK(wait_for(&S.aborts, 2, 2000));
    }
    /* mid-stream: headers and a first chunk went out, then the client leaves */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /holdstream HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(cli_line(&c, 0) >= 0);
        while (!strstr(c.buf, "data: first")) /* the first chunk arrived */
            if (cli_fill(&c) <= 0) break;
        cli_close(&c);
        CHECK(wait_for(&S.aborts, 3, 2000));
    }
    /* give any wrongly kept timer a chance to fire on a freed request */
    usleep(50000);
    CHECK_EQ_INT(aload(&S.held), 0);
    /* last one: the client stays, the listener is closed under it (teardown) */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /hold HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(wait_for(&S.held, 1, 2000));
        S.leftover_fd = c.fd;
        c.fd = -1;
        cli_close(&c);
    }
}

static void test_client_disconnect(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_disconnect);
    CHECK_EQ_INT(S.requests, 4); /* the pipelined /echo never reached the handler */
    CHECK_EQ_INT(S.aborts, 4);   /* exactly once each, the last from mg_listener_close */
    CHECK_EQ_INT(S.held, 0);
}

static void sc_connection_close(void)
{
    cli_t c;
    resp_t r;
    /* HTTP/1.0 without keep-alive */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c, "GET /echo HTTP/1.0\r\n\r\n", &r, 200) == 0) {
            CHECK(has_conn_close(&r));
            CHECK_STR(ev(&r, "host"), "(none)");
        }
        resp_free(&r);
        CHECK_EQ_INT(cli_eof(&c), 1);
        cli_close(&c);
    }
    /* HTTP/1.1 asking for close */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", &r, 200) ==
            0)
            CHECK(has_conn_close(&r));
        resp_free(&r);
        CHECK_EQ_INT(cli_eof(&c), 1);
        cli_close(&c);
    }
    /* the handler asking for close */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c, "GET /close HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0)
            CHECK(has_conn_close(&r));
        resp_free(&r);
        CHECK_EQ_INT(cli_eof(&c), 1);
        cli_close(&c);
    }
    /* HTTP/1.0 with keep-alive: an HTTP/1.0 client only keeps the connection when the
     * response says "Connection: keep-alive" (RFC 7230 section 6.3 / A.1.2) */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c, "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r, 200) == 0) {
            char v[64];
            const char *conn = resp_header(&r, "Connection", v, sizeof(v));
            CHECK(conn && strcasecmp(conn, "keep-alive") == 0);
            if (!has_conn_close(&r)) { /* then the connection must really stay usable */
                resp_free(&r);
                roundtrip(&c, "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r, 200);
            }
        }
        resp_free(&r);
        cli_close(&c);
    }
}

static void test_connection_close(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_connection_close);
    CHECK(S.requests >= 4);
}

/* Connections that send half a request head and leave: nothing is answered or written. */
static void sc_open_and_leave(void)
{
    for (int i = 0; i < 8; i++) {
        cli_t c;
        if (cli_open(&c) != 0) return;
        CHECK_EQ_INT(cli_sends(&c, "GET /echo HT"), 0);
        cli_close(&c);
    }
}

/* A crowd of connections leaving frees many small blocks: each closed connection counts
 * towards the memory trim (base/memtrim.h), not only the large output buffers. The trim
 * here is on no loop, so its notes only add up. */
static void test_closed_connections_noted_for_trim(void)
{
    mg_memtrim_t trim;
    memset(&trim, 0, sizeof(trim));
    mg_http_limits_t lim = default_limits();
    lim.trim = &trim;
    run_scenario(&lim, sc_open_and_leave);
    CHECK_EQ_INT(S.requests, 0);
    CHECK(trim.freed >= 8 * sizeof(llhttp_t)); /* a connection holds its parser, at least */
}

static void sc_expect_continue(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    CHECK_EQ_INT(cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                               "Content-Length: 5\r\n\r\n"),
                 0);
    resp_t r;
    CHECK_EQ_INT(cli_response(&c, &r), 0);
    CHECK_EQ_INT(r.status, 100);
    CHECK(strcmp(r.head, "HTTP/1.1 100 Continue\r\n\r\n") == 0);
    resp_free(&r);
    CHECK_EQ_INT(cli_sends(&c, "hello"), 0);
    CHECK_EQ_INT(cli_response(&c, &r), 0);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(ev(&r, "body"), "hello");
    resp_free(&r);
    /* case-insensitive expectation value */
    CHECK_EQ_INT(cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nexpect: 100-Continue\r\n"
                               "Content-Length: 2\r\n\r\n"),
                 0);
    CHECK_EQ_INT(cli_response(&c, &r), 0);
    CHECK_EQ_INT(r.status, 100);
    resp_free(&r);
    cli_sends(&c, "ok");
    CHECK_EQ_INT(cli_response(&c, &r), 0);
    CHECK_STR(ev(&r, "body"), "ok");
    resp_free(&r);
    /* no Expect: no 100 */
    if (roundtrip(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nno", &r, 200) ==
        0)
        CHECK_STR(ev(&r, "body"), "no");
    resp_free(&r);
    cli_close(&c);
}

static void test_expect_continue(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_expect_continue);
    CHECK_EQ_INT(S.requests, 3);
}

static void sc_headers_and_query(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    if (roundtrip(
            &c, "GET /echo?a=1&b=two HTTP/1.1\r\nhOsT: MiXeD\r\nX-TEST: Value1\r\nX-Empty:\r\n\r\n",
            &r, 200) == 0) {
        CHECK_STR(ev(&r, "path"), "/echo");
        CHECK_STR(ev(&r, "query"), "a=1&b=two");
        CHECK_STR(ev(&r, "host"), "MiXeD");
        CHECK_STR(ev(&r, "x-test"), "Value1");
        CHECK_STR(ev(&r, "x-empty"), ""); /* present and empty, not absent */
        CHECK_STR(ev(&r, "n_headers"), "3");
    }
    resp_free(&r);
    struct {
        const char *target, *path, *query;
    } cases[] = {
        {"/echo", "/echo", "(none)"},
        {"/echo?", "/echo", ""},
        {"/echo?x=1?y=2", "/echo", "x=1?y=2"},
        {"/echo?%20sp=%2F", "/echo", "%20sp=%2F"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char req[256];
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", cases[i].target);
        if (roundtrip(&c, req, &r, 200) == 0) {
            CHECK_STR(ev(&r, "path"), cases[i].path);
            CHECK_STR(ev(&r, "query"), cases[i].query);
            CHECK_STR(ev(&r, "x-test"), "(none)");
        }
        resp_free(&r);
    }
    /* header lookup also works on a folded-case, split-across-reads header */
    cli_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\nx-te");
    usleep(20000);
    cli_sends(&c, "st: spl");
    usleep(20000);
    cli_sends(&c, "it\r\n\r\n");
    if (cli_response(&c, &r) == 0) CHECK_STR(ev(&r, "x-test"), "split");
    resp_free(&r);
    cli_close(&c);
}

static void test_headers_and_query(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_headers_and_query);
    CHECK_EQ_INT(S.requests, 6);
}

static void sc_chunked_response(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    if (roundtrip(&c, "GET /stream HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0) {
        char v[64];
        CHECK(r.chunked);
        CHECK(resp_header(&r, "Content-Length", v, sizeof(v)) == NULL);
        CHECK_STR(resp_header(&r, "Content-Type", v, sizeof(v)), "text/event-stream");
        CHECK_STR(resp_header(&r, "X-Stream", v, sizeof(v)), "1");
        CHECK_EQ_INT(r.n_chunks, 4);
        CHECK_EQ_INT(r.chunk_sizes[0], 5);
        CHECK_EQ_INT(r.chunk_sizes[1], 1);
        CHECK_EQ_INT(r.chunk_sizes[2], 5);
        CHECK_EQ_INT(r.chunk_sizes[3], 3000);
        CHECK_EQ_INT(r.body_len, 3011);
        CHECK(strncmp(r.body, "hello world", 11) == 0);
        CHECK(r.body[3010] == 'x');
    }
    resp_free(&r);
    /* the same made with mg_http_stream_open / mg_http_stream_send */
    if (roundtrip(&c, "GET /stream-open HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0) {
        CHECK(r.chunked);
        CHECK_EQ_INT(r.n_chunks, 2);
        CHECK_EQ_INT(r.chunk_sizes[0], 3);
        CHECK_EQ_INT(r.chunk_sizes[1], 4);
        CHECK(r.body_len == 7 && memcmp(r.body, "abcdefg", 7) == 0);
    }
    resp_free(&r);
    if (roundtrip(&c, "GET /stream-whole HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0) {
        CHECK_EQ_INT(r.n_chunks, 1);
        CHECK(r.body_len == 5 && memcmp(r.body, "whole", 5) == 0);
    }
    resp_free(&r);
    if (roundtrip(&c, "GET /stream-empty HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0) {
        CHECK(r.chunked);
        CHECK_EQ_INT(r.n_chunks, 0);
        CHECK_EQ_INT(r.body_len, 0);
    }
    resp_free(&r);
    /* the connection goes on after the terminating chunk */
    roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    /* a big Content-Length response (written partly by uv_try_write, partly queued) */
    if (roundtrip(&c, "GET /big HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0) {
        CHECK_EQ_INT(r.body_len, BIG_BYTES);
        int bad = 0;
        for (size_t i = 0; i < r.body_len; i++) bad += r.body[i] != (char)('A' + (i % 23));
        CHECK_EQ_INT(bad, 0);
    }
    resp_free(&r);
    /* back-pressure: the client does not read for a while, the handler sees
     * mg_http_write_pending() and continues from on_drain */
    cli_sends(&c, "GET /flood HTTP/1.1\r\nHost: t\r\n\r\n");
    usleep(300000);
    if (cli_response(&c, &r) == 0) {
        CHECK_EQ_INT(r.status, 200);
        CHECK_EQ_INT(r.body_len, FLOOD_BYTES);
        int bad = 0;
        for (size_t i = 0; i < r.body_len; i += 4096)
            bad += r.body[i] != 'a' + (int)((i / FLOOD_CHUNK) % 26);
        CHECK_EQ_INT(bad, 0);
    } else {
        CHECK(!"flood response");
    }
    resp_free(&r);
    roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    cli_close(&c);
}

static void test_chunked_response(void)
{
    mg_http_limits_t lim = default_limits();
    lim.keepalive_idle_ms = 10000; /* see test_idle_timer_while_writing */
    run_scenario(&lim, sc_chunked_response);
    CHECK_EQ_INT(S.requests, 8);
    CHECK_EQ_INT(S.pending_seen, 1);
    CHECK(S.drains >= 1);
    CHECK_EQ_INT(S.aborts, 0);
}

/* The keep-alive idle clock must start when the response has left, not when it was
 * queued: a client still reading a large response is not idle. */
static void sc_idle_while_writing(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    cli_sends(&c, "GET /big HTTP/1.1\r\nHost: t\r\n\r\n");
    usleep(500000); /* most of the 4 MiB waits in the server's write queue meanwhile */
    if (cli_response(&c, &r) == 0) CHECK_EQ_INT(r.body_len, BIG_BYTES);
    else CHECK(!"big response");
    resp_free(&r);
    /* the client read everything just now: the connection must still take a request */
    int ok = cli_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n") == 0 &&
             cli_response(&c, &r) == 0 && r.status == 200;
    if (!ok)
        fprintf(stderr, "  regression: keep-alive connection closed while its response was "
                        "still being written (idle timer started at queue time)\n");
    CHECK(ok);
    resp_free(&r);
    cli_close(&c);
}

static void test_idle_timer_while_writing(void)
{
    mg_http_limits_t lim = default_limits();
    lim.keepalive_idle_ms = 200;
    run_scenario(&lim, sc_idle_while_writing);
}

/* Protocol corners a real client can hit. */
static void sc_protocol_corners(void)
{
    cli_t c;
    resp_t r;
    char v[128];
    /* header values: leading and trailing whitespace is not part of the value (RFC 9110
     * section 5.5); llhttp strips only the leading part */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\nX-Test:   padded \t \r\n\r\n", &r,
                      200) == 0) {
            const char *got = ev(&r, "x-test");
            if (strcmp(got, "padded") != 0)
                fprintf(stderr, "  regression: header value keeps trailing whitespace: [%s]\n",
                        got);
            CHECK_STR(got, "padded");
            CHECK(strncmp(got, "padded", 6) == 0);
        }
        resp_free(&r);
        cli_close(&c);
    }
    /* chunked request with trailer fields: accepted, body intact */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c,
                      "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
                      &r, 200) == 0)
            CHECK_STR(ev(&r, "body"), "abc");
        resp_free(&r);
        /* and the connection goes on */
        roundtrip(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
        resp_free(&r);
        cli_close(&c);
    }
    /* request smuggling shape: both Content-Length and Transfer-Encoding -> 400 */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /echo HTTP/1.1\r\n\r\n");
        expect_error_and_close(&c, 400, "INVALID_REQUEST");
        cli_close(&c);
    }
    /* HEAD: the response carries no body (RFC 9110 section 9.3.2), or the next response on
     * the connection is read from the middle of it */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "HEAD /echo HTTP/1.1\r\nHost: t\r\n\r\n");
        long end = cli_line(&c, 0);
        size_t from = 0;
        while (end >= 0 && (size_t)end != from) { /* skip to the empty line */
            from = (size_t)end + 2;
            end = cli_line(&c, from);
        }
        CHECK(end >= 0);
        if (end >= 0) {
            CHECK(strncmp(c.buf, "HTTP/1.1 200", 12) == 0);
            cli_consume(&c, (size_t)end + 2);
            struct pollfd pf = {c.fd, POLLIN, 0};
            if (c.len == 0 && poll(&pf, 1, 50) > 0) cli_fill(&c);
            if (c.len != 0)
                fprintf(stderr, "  regression: %zu body bytes after a HEAD response\n", c.len);
            CHECK_EQ_INT(c.len, 0);
        }
        cli_close(&c);
    }
    /* An h2c upgrade offer (what `curl --http2 http://...` sends) is ignored: the request is
     * answered over HTTP/1.1 and the connection stays usable. */
    if (cli_open(&c) == 0) {
        if (roundtrip(&c,
                      "GET /echo?u=1 HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                      "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
                      &r, 200) == 0)
            CHECK_STR(ev(&r, "query"), "u=1");
        resp_free(&r);
        int ok = cli_sends(&c, "GET /echo?u=2 HTTP/1.1\r\nHost: t\r\n\r\n") == 0 &&
                 cli_response(&c, &r) == 0 && r.status == 200;
        if (!ok)
            fprintf(stderr, "  regression: request after an Upgrade offer answered %d (%s)\n",
                    r.status, resp_header(&r, "Connection", v, sizeof(v)) ? v : "");
        CHECK(ok);
        resp_free(&r);
        cli_close(&c);
    }
}

static void test_protocol_corners(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_protocol_corners);
}

/* Pipelined input piling up behind a slow request: reading pauses past the pending-input
 * cap and resumes when the request is answered; nothing is lost. */
static void sc_pipelined_backlog(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    size_t n = 1500000;
    char head[256];
    snprintf(head, sizeof(head),
             "GET /async?ms=150 HTTP/1.1\r\nHost: t\r\n\r\n"
             "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %zu\r\n\r\n",
             n);
    char *body = malloc(n);
    for (size_t i = 0; i < n; i++) body[i] = (char)('0' + i % 10);
    CHECK_EQ_INT(cli_sends(&c, head), 0);
    CHECK_EQ_INT(cli_send(&c, body, n), 0);
    resp_t r;
    if (roundtrip(&c, "GET /echo?last=1 HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200) == 0)
        CHECK_STR(ev(&r, "query"), "ms=150");
    resp_free(&r);
    if (cli_response(&c, &r) == 0) {
        CHECK_STR(ev(&r, "body_len"), "1500000");
        const char *b = strstr(r.body, "\nbody=");
        CHECK(b && memcmp(b + 6, body, n) == 0);
    } else {
        CHECK(!"big pipelined response");
    }
    resp_free(&r);
    if (cli_response(&c, &r) == 0) CHECK_STR(ev(&r, "query"), "last=1");
    else CHECK(!"last pipelined response");
    resp_free(&r);
    free(body);
    cli_close(&c);
}

static void test_pipelined_backlog(void)
{
    mg_http_limits_t lim = default_limits();
    lim.max_body_bytes = 4 * 1024 * 1024;
    run_scenario(&lim, sc_pipelined_backlog);
    CHECK_EQ_INT(S.requests, 3);
}

static void sc_stop(void)
{
    cli_t idle, busy, late;
    resp_t r;
    if (cli_open(&idle) != 0) return;
    roundtrip(&idle, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    if (cli_open(&busy) != 0) return;
    /* /stop answers 150 ms later; a pipelined request behind it must not be served */
    cli_sends(&busy, "GET /stop HTTP/1.1\r\nHost: t\r\n\r\nGET /echo HTTP/1.1\r\nHost: t\r\n\r\n");
    CHECK(wait_for(&S.stopped, 1, 2000));
    /* the idle connection is closed at once */
    uint64_t t0 = now_ms();
    CHECK_EQ_INT(cli_eof(&idle), 1);
    CHECK(now_ms() - t0 < 140);
    cli_close(&idle);
    /* nobody listens any more */
    int rc = cli_connect_port(&late, S.port);
    CHECK_EQ_INT(rc, -ECONNREFUSED);
    if (rc == 0) cli_close(&late);
    /* the busy one gets its full response, marked close, then the end */
    if (cli_response(&busy, &r) == 0) {
        CHECK_EQ_INT(r.status, 200);
        CHECK_STR(ev(&r, "path"), "/stop");
        CHECK(has_conn_close(&r));
    } else {
        CHECK(!"response after stop");
    }
    resp_free(&r);
    CHECK_EQ_INT(cli_eof(&busy), 1);
    cli_close(&busy);
}

static void test_listener_stop_busy(void)
{
    mg_http_limits_t lim = default_limits();
    run_scenario(&lim, sc_stop);
    CHECK_EQ_INT(S.requests, 2);
    CHECK_EQ_INT(S.aborts, 0);
    CHECK_EQ_INT(S.l.n_conns, 0);
}

/* ---- slow clients: read deadlines, the write timeout, the connection cap ----------------- */

static mg_conn_stats_t ST; /* the listener's counters in these scenarios (lim.stats) */

static uint64_t stat_load(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

/* Send `piece` every `gap_ms` until the server answers (or `max` pieces went). 1 when it did. */
static int trickle_until_answer(cli_t *c, const char *piece, int gap_ms, int max)
{
    for (int i = 0; i < max; i++) {
        struct pollfd pf = {c->fd, POLLIN, 0};
        if (poll(&pf, 1, gap_ms) > 0) return 1;
        if (cli_sends(c, piece) != 0) return 0;
    }
    return 0;
}

static void sc_slow_body(void)
{
    cli_t c;
    const char *head = "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n";
    /* a byte every 50 ms used to re-arm the header timer forever; now the body falls behind
       min_body_bytes_per_s once the grace is over */
    if (cli_open(&c) == 0) {
        cli_sends(&c, head);
        CHECK(trickle_until_answer(&c, "x", 50, 60));
        expect_error_and_close(&c, 408, "REQUEST_TIMEOUT");
        cli_close(&c);
    }
    /* fast enough for the rate, but never complete: cut at request_read_ms */
    if (cli_open(&c) == 0) {
        char piece[101];
        memset(piece, 'y', 100);
        piece[100] = '\0';
        cli_sends(&c, head);
        CHECK(trickle_until_answer(&c, piece, 20, 150));
        expect_error_and_close(&c, 408, "REQUEST_TIMEOUT");
        cli_close(&c);
    }
    /* a steady body above the rate completes */
    if (cli_open(&c) == 0) {
        char piece[101];
        memset(piece, 'z', 100);
        piece[100] = '\0';
        cli_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n");
        for (int i = 0; i < 20; i++) {
            usleep(20000);
            cli_sends(&c, piece);
        }
        resp_t r;
        if (cli_response(&c, &r) == 0) {
            CHECK_EQ_INT(r.status, 200);
            CHECK_STR(ev(&r, "body_len"), "2000");
        } else {
            CHECK(!"an answer to the steady body");
        }
        resp_free(&r);
        cli_close(&c);
    }
}

static void test_slow_body(void)
{
    memset(&ST, 0, sizeof(ST));
    mg_http_limits_t lim = default_limits();
    lim.header_read_ms = 200; /* also the body's grace */
    lim.min_body_bytes_per_s = 1000;
    lim.request_read_ms = 1500;
    lim.stats = &ST;
    run_scenario(&lim, sc_slow_body);
    CHECK_EQ_INT(S.requests, 1);
    CHECK_EQ_INT((int)ST.read_timeouts[MG_READ_TIMEOUT_BODY_RATE], 1);
    CHECK_EQ_INT((int)ST.read_timeouts[MG_READ_TIMEOUT_REQUEST], 1);
    CHECK_EQ_INT((int)ST.read_timeouts[MG_READ_TIMEOUT_HEADERS], 0);
}

/* Wait (client side) until the listener has counted `n` write timeouts; bounded. */
static int wait_write_timeouts(uint64_t n, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (stat_load(&ST.write_timeouts) < n) {
        if (now_ms() > end) return 0;
        usleep(2000);
    }
    return 1;
}

/* Read until EOF or reset; the bytes received. */
static size_t drain_all(cli_t *c)
{
    size_t total = 0;
    for (;;) {
        c->len = 0;
        int rc = cli_fill(c);
        if (rc <= 0) return total;
        total += c->len;
    }
}

static void sc_write_timeout(void)
{
    cli_t c;
    /* a whole answer the client never reads: the connection is cut, what was queued dropped */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /big HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(wait_write_timeouts(1, 4000));
        size_t got = drain_all(&c);
        if (got >= BIG_BYTES) fprintf(stderr, "  the stalled client got all %zu bytes\n", got);
        CHECK(got < BIG_BYTES);
        cli_close(&c);
    }
    /* a stream the client never reads: its request is aborted as stalled */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /flood HTTP/1.1\r\nHost: t\r\n\r\n");
        CHECK(wait_for(&S.aborts, 1, 4000));
        CHECK_EQ_INT(aload(&S.last_abort), MG_HTTP_ABORT_STALLED + 1);
        CHECK(wait_write_timeouts(2, 1000));
        CHECK(drain_all(&c) < FLOOD_BYTES);
        cli_close(&c);
    }
    /* a slow but steady reader makes progress: never cut */
    if (cli_open(&c) == 0) {
        cli_sends(&c, "GET /big HTTP/1.1\r\nHost: t\r\n\r\n");
        size_t total = 0;
        while (total < BIG_BYTES) {
            c.len = 0;
            if (cli_fill(&c) <= 0) break;
            total += c.len;
            usleep(20000); /* at most 128 KiB per 20 ms */
        }
        CHECK(total >= BIG_BYTES); /* (the head came too) */
        cli_close(&c);
    }
}

static void test_write_timeout(void)
{
    memset(&ST, 0, sizeof(ST));
    mg_http_limits_t lim = default_limits();
    lim.write_timeout_ms = 300;
    lim.stats = &ST;
    run_scenario(&lim, sc_write_timeout);
    CHECK_EQ_INT((int)ST.write_timeouts, 2);
    CHECK_EQ_INT(S.aborts, 1);
}

static const char *const test_reserve[] = {"/echo-extra", NULL};

/* Open a connection and read one response without sending anything (a refusal). */
static void expect_refused_at_accept(void)
{
    cli_t c;
    if (cli_open(&c) != 0) return;
    resp_t r;
    if (cli_response(&c, &r) == 0) {
        CHECK_EQ_INT(r.status, 503);
        CHECK(strstr(r.body, "\"code\":\"RESOURCE_EXHAUSTED\"") != NULL);
        CHECK(strstr(r.body, "\"retry_after_ms\":1000") != NULL);
        CHECK(has_conn_close(&r));
        char v[16];
        CHECK_STR(resp_header(&r, "Retry-After", v, sizeof(v)), "1");
    } else {
        CHECK(!"a 503 past the reserve");
    }
    resp_free(&r);
    CHECK_EQ_INT(cli_eof(&c), 1);
    cli_close(&c);
}

static void sc_max_connections(void)
{
    cli_t a, b, rsv;
    resp_t r;
    if (cli_open(&a) != 0 || cli_open(&b) != 0) return;
    roundtrip(&a, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    roundtrip(&b, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    /* the cap is reached: a third connection lands in the reserve, which serves only its
       paths: anything else is refused with a 503 */
    if (cli_open(&rsv) == 0) {
        cli_sends(&rsv, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n");
        expect_error_and_close(&rsv, 503, "RESOURCE_EXHAUSTED");
        cli_close(&rsv);
    }
    if (cli_open(&rsv) != 0) return;
    roundtrip(&rsv, "GET /echo-extra HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    /* past the reserve: refused at once, before the request is read */
    expect_refused_at_accept();
    /* room again: served (the server may see the closes a moment later) */
    cli_close(&a);
    cli_close(&rsv);
    int served = 0;
    for (int i = 0; i < 50 && !served; i++) {
        cli_t c;
        if (cli_open(&c) != 0) break;
        if (cli_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n") == 0 &&
            cli_response(&c, &r) == 0)
            served = r.status == 200;
        resp_free(&r);
        cli_close(&c);
        if (!served) usleep(10000);
    }
    CHECK(served);
    cli_close(&b);
}

static void test_max_connections(void)
{
    memset(&ST, 0, sizeof(ST));
    mg_http_limits_t lim = default_limits();
    lim.max_connections = 2;
    lim.reserved_connections = 1;
    lim.reserve_paths = test_reserve;
    lim.stats = &ST;
    run_scenario(&lim, sc_max_connections);
    CHECK(ST.refused >= 2);
    CHECK_EQ_INT((int)ST.max_connections, 2);
    CHECK_EQ_INT((int)ST.open, 0);
}

/* Refusals in flight are bounded: past MG_HTTP_REFUSING_MAX lingering 503s, a connection past
 * the cap is closed without an answer (each refused connection costs a descriptor). */
static void sc_refusal_bound(void)
{
    cli_t held, c[MG_HTTP_REFUSING_MAX + 4];
    if (cli_open(&held) != 0) return;
    resp_t r;
    roundtrip(&held, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n", &r, 200);
    resp_free(&r);
    int answered = 0, closed = 0;
    for (int i = 0; i < MG_HTTP_REFUSING_MAX + 4; i++) {
        if (cli_open(&c[i]) != 0) return;
        if (cli_response(&c[i], &r) == 0 && r.status == 503) answered++;
        else if (cli_eof(&c[i]) == 1 || c[i].len == 0) closed++;
        resp_free(&r);
    }
    CHECK_EQ_INT(answered, MG_HTTP_REFUSING_MAX);
    CHECK_EQ_INT(closed, 4);
    for (int i = 0; i < MG_HTTP_REFUSING_MAX + 4; i++) cli_close(&c[i]);
    cli_close(&held);
}

static void test_refusal_bound(void)
{
    memset(&ST, 0, sizeof(ST));
    mg_http_limits_t lim = default_limits();
    lim.max_connections = 1;
    lim.stats = &ST;
    run_scenario(&lim, sc_refusal_bound);
    CHECK_EQ_INT((int)ST.refused, MG_HTTP_REFUSING_MAX + 4);
}

static void test_reason_and_bind(void)
{
    CHECK_STR(mg_http_reason(200), "OK");
    CHECK_STR(mg_http_reason(413), "Content Too Large");
    CHECK_STR(mg_http_reason(431), "Request Header Fields Too Large");
    CHECK_STR(mg_http_reason(503), "Service Unavailable");
    CHECK_STR(mg_http_reason(799), "Unknown");
    /* bad addresses are refused without leaking */
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_listener_t l;
    mg_http_limits_t lim = default_limits();
    CHECK(mg_listener_start(&l, &loop, "no-port", &lim, handler, NULL) < 0);
    CHECK(mg_listener_start(&l, &loop, "999.1.1.1:80", &lim, handler, NULL) < 0);
    /* a port in use */
    mg_listener_t a, b;
    CHECK_EQ_INT(mg_listener_start(&a, &loop, "127.0.0.1:0", &lim, handler, NULL), 0);
    CHECK(mg_listener_start(&b, &loop, a.bound, &lim, handler, NULL) < 0);
    mg_listener_close(&a);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* MG_RUN plus the time each test took (the whole file must stay fast). */
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        uint64_t t0_ = now_ms();                                                                   \
        MG_RUN(fn);                                                                                \
        fprintf(stderr, "     (%llu ms)\n", (unsigned long long)(now_ms() - t0_));                 \
    } while (0)

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(test_reason_and_bind);
    RUN(test_keepalive);
    RUN(test_pipelining);
    RUN(test_split_byte_by_byte);
    RUN(test_request_bodies);
    RUN(test_body_limits);
    RUN(test_header_limits);
    RUN(test_malformed);
    RUN(test_header_timeout);
    RUN(test_keepalive_idle);
    RUN(test_client_disconnect);
    RUN(test_connection_close);
    RUN(test_closed_connections_noted_for_trim);
    RUN(test_expect_continue);
    RUN(test_headers_and_query);
    RUN(test_chunked_response);
    RUN(test_listener_stop_busy);
    RUN(test_idle_timer_while_writing);
    RUN(test_protocol_corners);
    RUN(test_pipelined_backlog);
    RUN(test_slow_body);
    RUN(test_write_timeout);
    RUN(test_max_connections);
    RUN(test_refusal_bound);
    return mg_test_summary();
}
