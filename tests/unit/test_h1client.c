/* Unit tests for core/h1client.c: mg_h1 transfers against a small scripted HTTP/1.1
 * server running on raw uv_tcp in the same loop. The server counts accepted
 * connections, requests per path and the connections the client closed, so the
 * tests can check keep-alive reuse, the transparent retry, and that a cancelled or
 * timed-out transfer really closes its connection.
 *
 * Each server path plays a script of steps (write bytes after a delay, write them
 * one byte at a time, end the response, close, reset, hold forever); /echo answers
 * with what it received.
 *
 * The loop is driven with UV_RUN_ONCE from the test code plus a 5 ms ticker, so
 * every wait is bounded.
 *
 * With H1_BENCH=N in the environment, main() instead runs N sequential keep-alive
 * transfers (for callgrind: see bench_keepalive). */
#include "upstream/h1client.h"
#include "upstream/headers.h"
#include "mgtest.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uv_loop_t L;
static uv_timer_t ticker;
static mg_h1_t *C;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the scripted server ------------------------------------------------------------------ */

typedef enum { S_WRITE, S_TRICKLE, S_END, S_CLOSE, S_RESET, S_HOLD } step_kind_t;

typedef struct {
    step_kind_t kind;
    int delay_ms; /* S_TRICKLE: between bytes */
    const char *data;
} step_t;

typedef struct {
    const char *path;
    step_t steps[16];
} script_t;

#define HEAD_CHUNKED                                                                               \
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
#define GET_RESPONSE                                                                               \
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"

/* clang-format off */
static const script_t scripts[] = {
    {"/get", {{S_WRITE, 0, GET_RESPONSE}, {S_END, 0, NULL}}},
    {"/pieces", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 30, "5\r\nhello\r\n"},
                 {S_WRITE, 30, "6\r\n world\r\n"}, {S_WRITE, 30, "0\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/chunked-one", {{S_WRITE, 0, HEAD_CHUNKED "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"},
                      {S_END, 0, NULL}}},
    {"/cl-one", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"}, {S_END, 0, NULL}}},
    {"/close-delim", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"},
                      {S_WRITE, 10, "hello "}, {S_WRITE, 10, "world"}, {S_CLOSE, 10, NULL}}},
    {"/trickle", {{S_TRICKLE, 1, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                                 "Retry-After: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "7\r\ndata: a\r\n7\r\ndata: b\r\n0\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/trickle-cl", {{S_TRICKLE, 1, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello, world"},
                     {S_END, 0, NULL}}},
    {"/silent", {{S_HOLD, 0, NULL}}},
    {"/stall", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"}, {S_HOLD, 0, NULL}}},
    {"/slow", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 40, "1\r\na\r\n"}, {S_WRITE, 40, "1\r\nb\r\n"},
               {S_WRITE, 40, "1\r\nc\r\n"}, {S_WRITE, 40, "1\r\nd\r\n"}, {S_WRITE, 40, "1\r\ne\r\n"},
               {S_WRITE, 40, "1\r\nf\r\n"}, {S_WRITE, 40, "0\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/429", {{S_WRITE, 0, "HTTP/1.1 429 Too Many Requests\r\nRetry-After:  3 \r\nX-RateLimit-Reset-Requests:\t6m0s\r\n"
                           "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"},
              {S_END, 0, NULL}}},
    {"/continue", {{S_WRITE, 0, "HTTP/1.1 100 Continue\r\nRetry-After: 99\r\n\r\n"},
                   {S_WRITE, 10, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, {S_END, 0, NULL}}},
    {"/1xx-body", {{S_WRITE, 0, "HTTP/1.1 100 Continue\r\nContent-Length: 2\r\n\r\nxx"
                                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"}, {S_END, 0, NULL}}},
    {"/status-0", {{S_WRITE, 0, "HTTP/1.1 000 Zero\r\nContent-Length: 1\r\n\r\nx"}, {S_END, 0, NULL}}},
    {"/204", {{S_WRITE, 0, "HTTP/1.1 204 No Content\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/head", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/truncated", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"},
                    {S_CLOSE, 10, NULL}}},
    {"/truncated-chunked", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"},
                            {S_CLOSE, 10, NULL}}},
    {"/garbage", {{S_WRITE, 0, "THIS IS NOT HTTP\r\n\r\n"}, {S_CLOSE, 10, NULL}}},
    {"/reset", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"}, {S_RESET, 20, NULL}}},
    {"/close-after", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"},
                      {S_CLOSE, 0, NULL}}},
    {"/extra", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"}, {S_END, 0, NULL}}},
    {"/stale", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, {S_CLOSE, 30, NULL}}},
    {"/drop", {{S_CLOSE, 0, NULL}}},
};
/* clang-format on */
#define N_SCRIPTS (sizeof(scripts) / sizeof(scripts[0]))

typedef struct sconn_s sconn_t;

typedef struct {
    uv_tcp_t tcp, tcp6;
    int port, port6; /* port6 = 0: no IPv6 listener */
    int accepts;
    int requests;
    int eofs;       /* connections the client closed */
    int unanswered; /* connections the server closed with request bytes unread */
    int open_conns;
    int hits[N_SCRIPTS];
    char last_method[16];
    char last_path[256];
    char last_head[4096];
    char *last_body; /* malloc */
    size_t last_body_len;
    sconn_t *conns;
} server_t;

static server_t SV;

struct sconn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    sconn_t *next;
    char *in;
    size_t in_len, in_cap;
    const script_t *script; /* running, or NULL */
    int step;
    size_t trickle_pos;
    int closing;
    int handles;
};

typedef struct {
    uv_write_t w;
    char data[];
} swrite_t;

static void sconn_closed(uv_handle_t *h)
{
    sconn_t *c = h->data;
    if (--c->handles > 0) return;
    free(c->in);
    free(c);
}

static void sconn_close(sconn_t *c, int reset)
{
    if (c->closing) return;
    c->closing = 1;
    SV.open_conns--;
    if (c->in_len > 0) SV.unanswered++;
    for (sconn_t **p = &SV.conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->timer, sconn_closed);
    if (reset) uv_tcp_close_reset(&c->tcp, sconn_closed);
    else uv_close((uv_handle_t *)&c->tcp, sconn_closed);
}

static void on_swrite(uv_write_t *w, int status)
{
    free(w);
}

static void swrite(sconn_t *c, const char *data, size_t len)
{
    swrite_t *w = malloc(sizeof(*w) + len);
    memcpy(w->data, data, len);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
    if (uv_write(&w->w, (uv_stream_t *)&c->tcp, &b, 1, on_swrite) != 0) free(w);
}

static void run_script(sconn_t *c);
static void try_request(sconn_t *c);

static void on_step_timer(uv_timer_t *t)
{
    sconn_t *c = t->data;
    const step_t *s = &c->script->steps[c->step];
    switch (s->kind) {
    case S_WRITE:
        swrite(c, s->data, strlen(s->data));
        c->step++;
        run_script(c);
        break;
    case S_TRICKLE:
        swrite(c, s->data + c->trickle_pos++, 1);
        if (!s->data[c->trickle_pos]) {
            c->trickle_pos = 0;
            c->step++;
        }
        run_script(c);
        break;
    case S_END:
        c->script = NULL;
        try_request(c);
        break;
    case S_CLOSE:
        c->script = NULL;
        sconn_close(c, 0);
        break;
    case S_RESET:
        c->script = NULL;
        sconn_close(c, 1);
        break;
    case S_HOLD: break;
    }
}

/* Schedule the current step (always from a timer, even with delay 0, so scripts never
 * run inside the read callback that started them). */
static void run_script(sconn_t *c)
{
    if (c->closing || !c->script) return;
    uv_timer_start(&c->timer, on_step_timer, (uint64_t)c->script->steps[c->step].delay_ms, 0);
}

static void echo_response(sconn_t *c, const char *x_test)
{
    char head[256];
    size_t blen = strlen(SV.last_method) + 1 + SV.last_body_len + 8 + strlen(x_test);
    char *body = malloc(blen + 1);
    int n = snprintf(body, blen + 1, "%s ", SV.last_method);
    memcpy(body + n, SV.last_body, SV.last_body_len);
    n += (int)SV.last_body_len;
    n += snprintf(body + n, blen + 1 - (size_t)n, " x-test=%s", x_test);
    int hl =
        snprintf(head, sizeof(head),
                 "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", n);
    swrite(c, head, (size_t)hl);
    swrite(c, body, (size_t)n);
    free(body);
}

#define BIG_BYTES (8u << 20)

/* An 8 MiB body in one write: the kernel takes what its buffers hold at once, libuv the rest
 * as the client reads, so the client finds megabytes waiting in its socket. */
static void big_response(sconn_t *c)
{
    char head[128];
    int hl =
        snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Length: %u\r\n\r\n", BIG_BYTES);
    swrite_t *w = malloc(sizeof(*w) + (size_t)hl + BIG_BYTES);
    memcpy(w->data, head, (size_t)hl);
    memset(w->data + hl, 'b', BIG_BYTES);
    uv_buf_t b = uv_buf_init(w->data, (unsigned)hl + BIG_BYTES);
    if (uv_write(&w->w, (uv_stream_t *)&c->tcp, &b, 1, on_swrite) != 0) free(w);
}

static void start_script(sconn_t *c)
{
    for (size_t i = 0; i < N_SCRIPTS; i++)
        if (strcmp(scripts[i].path, SV.last_path) == 0) {
            SV.hits[i]++;
            c->script = &scripts[i];
            c->step = 0;
            run_script(c);
            return;
        }
    const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    swrite(c, nf, strlen(nf));
    try_request(c);
}

/* A complete request in c->in? Record it, consume it and start its script. */
static void try_request(sconn_t *c)
{
    if (c->closing || c->script) return;
    char *end = c->in_len >= 4 ? memmem(c->in, c->in_len, "\r\n\r\n", 4) : NULL;
    if (!end) return;
    size_t head_len = (size_t)(end - c->in) + 4;
    size_t body_len = 0;
    char head[4096];
    size_t hl = head_len < sizeof(head) - 1 ? head_len : sizeof(head) - 1;
    memcpy(head, c->in, hl);
    head[hl] = '\0';
    const char *cl = strcasestr(head, "\r\ncontent-length:");
    if (cl) body_len = strtoul(cl + 17, NULL, 10);
    if (c->in_len < head_len + body_len) return;
    SV.requests++;
    memcpy(SV.last_head, head, hl + 1);
    sscanf(head, "%15s %255s", SV.last_method, SV.last_path);
    free(SV.last_body);
    SV.last_body = malloc(body_len + 1);
    memcpy(SV.last_body, c->in + head_len, body_len);
    SV.last_body[body_len] = '\0';
    SV.last_body_len = body_len;
    memmove(c->in, c->in + head_len + body_len, c->in_len - head_len - body_len);
    c->in_len -= head_len + body_len;

    if (strcmp(SV.last_path, "/big") == 0) {
        big_response(c);
        try_request(c);
        return;
    }
    if (strcmp(SV.last_path, "/echo") == 0) {
        char xt[128] = "(none)";
        const char *h = strcasestr(head, "\r\nx-test:");
        if (h) sscanf(h + 9, " %127[^\r]", xt);
        echo_response(c, xt);
        try_request(c);
        return;
    }
    start_script(c);
}

static void on_salloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    sconn_t *c = h->data;
    if (c->in_cap - c->in_len < 65536) {
        c->in_cap = c->in_cap * 2 + 65536;
        c->in = realloc(c->in, c->in_cap);
    }
    *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void on_sread(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    sconn_t *c = s->data;
    if (n < 0) {
        SV.eofs++;
        sconn_close(c, 0);
        return;
    }
    c->in_len += (size_t)n;
    try_request(c);
}

static void on_sconnection(uv_stream_t *server, int status)
{
    if (status < 0) return;
    sconn_t *c = calloc(1, sizeof(*c));
    uv_tcp_init(&L, &c->tcp);
    uv_timer_init(&L, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles = 2;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->closing = 1;
        uv_close((uv_handle_t *)&c->tcp, sconn_closed);
        uv_close((uv_handle_t *)&c->timer, sconn_closed);
        return;
    }
    SV.accepts++;
    SV.open_conns++;
    c->next = SV.conns;
    SV.conns = c;
    uv_read_start((uv_stream_t *)&c->tcp, on_salloc, on_sread);
}

static int listen_on(uv_tcp_t *t, const struct sockaddr *sa)
{
    uv_tcp_init(&L, t);
    if (uv_tcp_bind(t, sa, 0) != 0 || uv_listen((uv_stream_t *)t, 128, on_sconnection) != 0) {
        uv_close((uv_handle_t *)t, NULL);
        return 0;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    uv_tcp_getsockname(t, (struct sockaddr *)&ss, &len);
    return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void server_start(void)
{
    memset(&SV, 0, sizeof(SV));
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    SV.port = listen_on(&SV.tcp, (struct sockaddr *)&sa);
    struct sockaddr_in6 sa6;
    uv_ip6_addr("::1", 0, &sa6);
    SV.port6 = listen_on(&SV.tcp6, (struct sockaddr *)&sa6);
}

static void server_stop(void)
{
    uv_close((uv_handle_t *)&SV.tcp, NULL);
    if (SV.port6) uv_close((uv_handle_t *)&SV.tcp6, NULL);
    while (SV.conns) sconn_close(SV.conns, 0);
    free(SV.last_body);
    SV.last_body = NULL;
}

static int hits(const char *path)
{
    for (size_t i = 0; i < N_SCRIPTS; i++)
        if (strcmp(scripts[i].path, path) == 0) return SV.hits[i];
    return -1;
}

/* A port nobody listens on: bind, read the port, close. */
static int closed_port(void)
{
    uv_tcp_t t;
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    uv_tcp_init(&L, &t);
    uv_tcp_bind(&t, (struct sockaddr *)&sa, 0);
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    uv_tcp_getsockname(&t, (struct sockaddr *)&ss, &len);
    int port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(&L, UV_RUN_NOWAIT);
    return port;
}

/* ---- loop driving ------------------------------------------------------------------------- */

static void on_tick(uv_timer_t *t) {}

static void setup(void)
{
    CHECK_EQ_INT(uv_loop_init(&L), 0);
    uv_timer_init(&L, &ticker);
    uv_timer_start(&ticker, on_tick, 5, 5);
    server_start();
    C = mg_h1_new(&L);
    CHECK(C != NULL);
}

typedef int (*cond_fn)(void *);

/* Run the loop until cond(arg) holds or ms pass. Returns 1 when the condition held. */
static int run_until(cond_fn cond, void *arg, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (!cond(arg)) {
        if (now_ms() >= end) return 0;
        uv_run(&L, UV_RUN_ONCE);
    }
    return 1;
}

static int never(void *arg)
{
    return 0;
}

static void run_for(int ms)
{
    run_until(never, NULL, ms);
}

static void count_handle(uv_handle_t *h, void *arg)
{
    if (uv_is_closing(h)) return;
    int *n = arg;
    (*n)++;
    fprintf(stderr, "  handle left open: %s\n", uv_handle_type_name(uv_handle_get_type(h)));
    uv_close(h, NULL);
}

/* Close the client and the server; every handle must close by itself. */
static void teardown(void)
{
    if (C) mg_h1_close(C);
    C = NULL;
    server_stop();
    uv_timer_stop(&ticker);
    uv_close((uv_handle_t *)&ticker, NULL);
    uint64_t end = now_ms() + 2000;
    while (uv_loop_alive(&L) && now_ms() < end) {
        uv_run(&L, UV_RUN_NOWAIT);
        usleep(1000);
    }
    int left = 0;
    if (uv_loop_alive(&L)) uv_walk(&L, count_handle, &left);
    CHECK_EQ_INT(left, 0);
    uv_run(&L, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&L), 0);
}

/* ---- transfers ---------------------------------------------------------------------------- */

typedef struct rec_s rec_t;
struct rec_s {
    mg_h1_xfer_t *x;
    int status;
    int headers_calls;
    char data[8192];
    size_t len;
    int data_calls;
    size_t total; /* body bytes delivered in all */
    int done_calls;
    int read_ends;       /* on_read_end calls */
    int data_since_read; /* on_data calls since the last on_read_end */
    int late_read_ends;  /* on_read_end after on_done (must stay 0) */
    mg_xfer_result_t result;
    char detail[256];
    char content_type[96];
    char retry_after[32];
    char error_headers[256]; /* the error answer's headers, "name=value;" each */
    uint64_t t_start, t_headers, t_done;
    /* behaviour */
    int cancel_on_data;    /* cancel inside the first on_data */
    int cancel_on_headers; /* cancel inside on_headers */
    int close_on_data;     /* close the whole client inside the first on_data */
    int pause_first;       /* return 1 from the first on_data */
    int paused;            /* currently paused (set by us) */
    int data_while_paused;
    int in_resume; /* set by the test around mg_h1_resume */
    int data_in_resume, done_in_resume;
    void (*after_done)(rec_t *);
    int chain_left; /* for chained transfers */
    const char *chain_path;
    rec_t *next; /* started by chain_get */
};

static void cb_headers(void *ud, int status)
{
    rec_t *r = ud;
    r->headers_calls++;
    r->status = status;
    r->t_headers = now_ms();
    const char *v = mg_h1_header(r->x, "content-type");
    snprintf(r->content_type, sizeof(r->content_type), "%s", v ? v : "(none)");
    v = mg_h1_header(r->x, "Retry-After");
    snprintf(r->retry_after, sizeof(r->retry_after), "%s", v ? v : "(none)");
    size_t hl, pos = 0, n = 0;
    char *h = mg_h1_take_error_headers(r->x, &hl);
    const char *hn, *hv;
    snprintf(r->error_headers, sizeof(r->error_headers), "(none)");
    while (mg_headers_next(h, hl, &pos, &hn, &hv))
        n += (size_t)snprintf(r->error_headers + n, sizeof(r->error_headers) - n, "%s=%s;", hn, hv);
    free(h);
    if (r->cancel_on_headers) mg_h1_cancel(r->x);
}

static int cb_data(void *ud, const char *data, size_t len)
{
    rec_t *r = ud;
    r->data_calls++;
    r->total += len;
    r->data_since_read++;
    if (r->paused) r->data_while_paused++;
    if (r->in_resume) r->data_in_resume++;
    if (r->len + len < sizeof(r->data)) {
        memcpy(r->data + r->len, data, len);
        r->len += len;
        r->data[r->len] = '\0';
    }
    if (r->cancel_on_data) {
        mg_h1_cancel(r->x);
        mg_h1_cancel(r->x); /* twice: still harmless */
        return 0;
    }
    if (r->close_on_data) {
        mg_h1_close(C);
        C = NULL;
        return 0;
    }
    if (r->pause_first && r->data_calls == 1) {
        r->paused = 1;
        return 1;
    }
    return 0;
}

static void cb_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    rec_t *r = ud;
    r->done_calls++;
    r->result = result;
    r->t_done = now_ms();
    if (r->in_resume) r->done_in_resume++;
    snprintf(r->detail, sizeof(r->detail), "%s", detail ? detail : "");
    mg_h1_cancel(r->x); /* a no-op once ended */
    if (r->after_done) r->after_done(r);
}

static void cb_read_end(void *ud)
{
    rec_t *r = ud;
    r->read_ends++;
    r->data_since_read = 0;
    if (r->done_calls) r->late_read_ends++;
}

static const mg_xfer_cbs_t CBS = {cb_headers, cb_data, cb_done, cb_read_end};

typedef struct {
    const char *method;
    const char *body;
    const char *header;
    int connect_ms, first_byte_ms, idle_ms, total_ms;
} xopt_t;

static int start_url(rec_t *r, const char *url, const xopt_t *o)
{
    mg_xfer_opts_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.method = o && o->method ? o->method : "GET";
    opts.url = url;
    if (o && o->header) opts.headers = curl_slist_append(NULL, o->header);
    if (o && o->body) {
        opts.body = strdup(o->body);
        opts.body_len = strlen(o->body);
    }
    opts.connect_timeout_ms = o && o->connect_ms ? o->connect_ms : 2000;
    opts.first_byte_timeout_ms = o ? o->first_byte_ms : 0;
    opts.idle_timeout_ms = o ? o->idle_ms : 0;
    opts.total_timeout_ms = o && o->total_ms ? o->total_ms : 5000;
    r->t_start = now_ms();
    r->x = NULL;
    int rc = mg_h1_start(C, &opts, &CBS, r, &r->x);
    CHECK_EQ_INT(rc, 0);
    return rc;
}

static int start(rec_t *r, const char *path, const xopt_t *o, int port)
{
    char url[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port ? port : SV.port, path);
    return start_url(r, url, o);
}

static int is_done(void *arg)
{
    return ((rec_t *)arg)->done_calls > 0;
}

static int all_done(void *arg)
{
    rec_t **rs = arg;
    for (int i = 0; rs[i]; i++)
        if (!rs[i]->done_calls) return 0;
    return 1;
}

static int server_saw_eof(void *arg)
{
    return SV.eofs >= *(int *)arg;
}

static int server_open_at_most(void *arg)
{
    return SV.open_conns <= *(int *)arg;
}

static void expect_result(rec_t *r, mg_xfer_result_t want)
{
    if (r->result != want || r->done_calls != 1)
        fprintf(stderr, "  result %d (want %d), done_calls %d, detail: %s\n", (int)r->result,
                (int)want, r->done_calls, r->detail);
    CHECK_EQ_INT(r->done_calls, 1);
    CHECK_EQ_INT(r->result, want);
}

static void rec_init(rec_t *r)
{
    memset(r, 0, sizeof(*r));
}

/* Start one transfer and run it to its end. */
static void run_one(rec_t *r, const char *path, const xopt_t *o)
{
    rec_init(r);
    start(r, path, o, 0);
    CHECK(run_until(is_done, r, 3000));
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_content_length_and_post(void)
{
    setup();
    rec_t g;
    rec_init(&g);
    start(&g, "/get", NULL, 0);
    CHECK_EQ_INT(mg_h1_active(C), 1);
    CHECK(run_until(is_done, &g, 2000));
    expect_result(&g, MG_XFER_OK);
    CHECK_EQ_INT(g.headers_calls, 1);
    CHECK_EQ_INT(g.status, 200);
    CHECK_STR(g.data, "{\"ok\":true}");
    CHECK_STR(g.content_type, "application/json");
    CHECK_STR(g.retry_after, "(none)");
    CHECK_STR(SV.last_method, "GET");
    CHECK_STR(SV.last_path, "/get");
    char host[64];
    snprintf(host, sizeof(host), "\r\nHost: 127.0.0.1:%d\r\n", SV.port);
    CHECK(strstr(SV.last_head, host) != NULL);
    CHECK(strcasestr(SV.last_head, "content-length") == NULL); /* GET: no body */
    CHECK_EQ_INT(mg_h1_active(C), 0);

    /* POST: body, caller headers, curl-style removal ("Expect:") and empty ("X-Empty;") */
    rec_t p;
    rec_init(&p);
    mg_xfer_opts_t o;
    memset(&o, 0, sizeof(o));
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/echo", SV.port);
    o.method = "POST";
    o.url = url;
    o.headers = curl_slist_append(NULL, "Content-Type: application/json");
    o.headers = curl_slist_append(o.headers, "Expect:");
    o.headers = curl_slist_append(o.headers, "X-Empty;");
    o.headers = curl_slist_append(o.headers, "X-Test: yes");
    o.headers = curl_slist_append(o.headers, "X-Bad: a\r\nInjected: 1");
    o.body = strdup("{\"model\":\"m\",\"x\":[1,2]}");
    o.body_len = strlen(o.body);
    o.total_timeout_ms = 5000;
    CHECK_EQ_INT(mg_h1_start(C, &o, &CBS, &p, &p.x), 0);
    CHECK(run_until(is_done, &p, 2000));
    expect_result(&p, MG_XFER_OK);
    CHECK_STR(p.data, "POST {\"model\":\"m\",\"x\":[1,2]} x-test=yes");
    CHECK_STR(SV.last_method, "POST");
    CHECK(strcasestr(SV.last_head, "expect") == NULL);
    CHECK(strstr(SV.last_head, "\r\nX-Empty:\r\n") != NULL);
    CHECK(strstr(SV.last_head, "Injected") == NULL);
    CHECK(strstr(SV.last_head, "\r\nContent-Length: 23\r\n") != NULL);
    CHECK(strcasestr(SV.last_head, "connection:") == NULL);
    /* extra_head lines follow the list's, as they are */
    rec_t xh;
    rec_init(&xh);
    memset(&o, 0, sizeof(o));
    o.method = "POST";
    o.url = url;
    o.headers = curl_slist_append(NULL, "Authorization: Bearer k");
    o.extra_head = "Content-Type: application/json\r\nX-Test: extra\r\nX-Last: 1\r\n";
    o.body = strdup("{}");
    o.body_len = 2;
    o.total_timeout_ms = 5000;
    CHECK_EQ_INT(mg_h1_start(C, &o, &CBS, &xh, &xh.x), 0);
    CHECK(run_until(is_done, &xh, 2000));
    expect_result(&xh, MG_XFER_OK);
    CHECK_STR(xh.data, "POST {} x-test=extra");
    CHECK(strstr(SV.last_head, "\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\n"
                               "X-Test: extra\r\nX-Last: 1\r\nContent-Length: 2\r\n") != NULL);
    /* a POST without a body sends Content-Length: 0 */
    rec_t e;
    xopt_t o2 = {"POST", NULL, NULL, 0, 0, 0, 0};
    run_one(&e, "/echo", &o2);
    expect_result(&e, MG_XFER_OK);
    CHECK_STR(e.data, "POST  x-test=(none)");
    CHECK(strstr(SV.last_head, "\r\nContent-Length: 0\r\n") != NULL);
    /* a caller's Host replaces ours */
    rec_t hh;
    xopt_t o4 = {"GET", NULL, "Host: example.test", 0, 0, 0, 0};
    run_one(&hh, "/get", &o4);
    expect_result(&hh, MG_XFER_OK);
    CHECK(strstr(SV.last_head, "\r\nHost: example.test\r\n") != NULL);
    CHECK(strstr(SV.last_head, host) == NULL);
    /* more header lines than the classification cache holds */
    memset(&o, 0, sizeof(o));
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/echo", SV.port);
    o.method = "GET";
    o.url = url;
    for (int i = 0; i < 40; i++) {
        char line[32];
        if (i % 10 == 9) snprintf(line, sizeof(line), "X-Gone-%d:", i);
        else snprintf(line, sizeof(line), "X-H%d: v%d", i, i);
        o.headers = curl_slist_append(o.headers, line);
    }
    rec_t m;
    rec_init(&m);
    CHECK_EQ_INT(mg_h1_start(C, &o, &CBS, &m, &m.x), 0);
    CHECK(run_until(is_done, &m, 2000));
    expect_result(&m, MG_XFER_OK);
    CHECK(strstr(SV.last_head, "\r\nX-H0: v0\r\nX-H1: v1\r\n") != NULL);
    CHECK(strstr(SV.last_head, "\r\nX-H38: v38\r\n\r\n") != NULL);
    CHECK(strstr(SV.last_head, "X-Gone") == NULL);
    int lines = 0;
    for (const char *q = SV.last_head; (q = strstr(q, "\r\nX-H")) != NULL; q++) lines++;
    CHECK_EQ_INT(lines, 36);
    /* a big body (written in two pieces, head and body) arrives whole */
    size_t n = 300000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    big[n] = '\0';
    rec_t b;
    xopt_t o3 = {"POST", big, NULL, 0, 0, 0, 0};
    run_one(&b, "/echo", &o3);
    expect_result(&b, MG_XFER_OK);
    CHECK_EQ_INT(SV.last_body_len, n);
    CHECK(SV.last_body && memcmp(SV.last_body, big, n) == 0);
    free(big);
    CHECK_EQ_INT(SV.accepts, 1); /* all of it on one keep-alive connection */
    teardown();
}

static void test_chunked_close_delimited_and_pieces(void)
{
    setup();
    rec_t r;
    run_one(&r, "/pieces", NULL);
    expect_result(&r, MG_XFER_OK);
    CHECK_STR(r.data, "hello world");
    CHECK(r.data_calls >= 2); /* delivered as it came */
    CHECK_STR(r.content_type, "text/plain");

    rec_t d;
    run_one(&d, "/close-delim", NULL);
    expect_result(&d, MG_XFER_OK);
    CHECK_STR(d.data, "hello world");
    CHECK_EQ_INT(d.status, 200);

    /* the whole response one byte per read, headers included */
    rec_t t;
    run_one(&t, "/trickle", NULL);
    expect_result(&t, MG_XFER_OK);
    CHECK_STR(t.data, "data: adata: b");
    CHECK_STR(t.content_type, "text/event-stream");
    CHECK_STR(t.retry_after, "7");
    CHECK(t.data_calls >= 3); /* the loop may coalesce some bytes */
    rec_t tc;
    run_one(&tc, "/trickle-cl", NULL);
    expect_result(&tc, MG_XFER_OK);
    CHECK_STR(tc.data, "hello, world");
    CHECK(tc.data_calls >= 3);

    /* 204 and HEAD: no body, and the connection stays usable */
    rec_t n;
    run_one(&n, "/204", NULL);
    expect_result(&n, MG_XFER_OK);
    CHECK_EQ_INT(n.status, 204);
    CHECK_EQ_INT(n.data_calls, 0);
    rec_t h;
    xopt_t oh = {"HEAD", NULL, NULL, 0, 0, 0, 0};
    run_one(&h, "/head", &oh);
    expect_result(&h, MG_XFER_OK);
    CHECK_EQ_INT(h.data_calls, 0);
    CHECK_STR(SV.last_method, "HEAD");
    int accepts = SV.accepts;
    rec_t g;
    run_one(&g, "/get", NULL);
    expect_result(&g, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, accepts);
    teardown();
}

/* Chained: each transfer starts the next from inside its on_done. */
static void chain_next(rec_t *r)
{
    if (r->chain_left-- <= 0) return;
    int left = r->chain_left;
    const char *path = r->chain_path;
    void (*after)(rec_t *) = r->after_done;
    rec_init(r);
    r->chain_left = left;
    r->chain_path = path;
    r->after_done = after;
    start(r, path, NULL, 0);
}

static int chain_finished(void *arg)
{
    rec_t *r = arg;
    return r->done_calls > 0 && r->chain_left <= 0;
}

static void test_keepalive_reuse(void)
{
    setup();
    for (int i = 0; i < 5; i++) {
        rec_t r;
        run_one(&r, i % 2 ? "/pieces" : "/get", NULL);
        expect_result(&r, MG_XFER_OK);
    }
    CHECK_EQ_INT(SV.requests, 5);
    if (SV.accepts != 1)
        fprintf(stderr, "  %d connections for 5 sequential transfers\n", SV.accepts);
    CHECK_EQ_INT(SV.accepts, 1);
    /* five more, each started inside the previous one's on_done */
    rec_t c;
    rec_init(&c);
    c.chain_left = 4;
    c.chain_path = "/get";
    c.after_done = chain_next;
    start(&c, "/get", NULL, 0);
    CHECK(run_until(chain_finished, &c, 3000));
    expect_result(&c, MG_XFER_OK);
    CHECK_STR(c.data, "{\"ok\":true}");
    CHECK_EQ_INT(SV.requests, 10);
    CHECK_EQ_INT(SV.accepts, 1);
    CHECK_EQ_INT(SV.open_conns, 1);
    /* Connection: close is honoured; so is a response followed by stray bytes */
    rec_t d, e, f, g;
    run_one(&d, "/close-after", NULL);
    expect_result(&d, MG_XFER_OK);
    CHECK_STR(d.data, "ok");
    run_one(&e, "/get", NULL);
    expect_result(&e, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 2);
    run_one(&f, "/extra", NULL);
    expect_result(&f, MG_XFER_OK);
    CHECK_STR(f.data, "ok");
    run_one(&g, "/get", NULL);
    expect_result(&g, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 3);
    teardown();
}

static void test_concurrent_use_two_connections(void)
{
    setup();
    rec_t a, b;
    rec_init(&a);
    rec_init(&b);
    start(&a, "/slow", NULL, 0);
    start(&b, "/slow", NULL, 0);
    CHECK_EQ_INT(mg_h1_active(C), 2);
    rec_t *all[] = {&a, &b, NULL};
    CHECK(run_until(all_done, all, 3000));
    expect_result(&a, MG_XFER_OK);
    expect_result(&b, MG_XFER_OK);
    CHECK_STR(a.data, "abcdef");
    CHECK_STR(b.data, "abcdef");
    /* the pieces came in separate reads: each read's data was followed by on_read_end, and
       the read that completed the response ended the transfer instead */
    CHECK(a.read_ends >= 5);
    CHECK_EQ_INT(a.late_read_ends, 0);
    CHECK_EQ_INT(b.late_read_ends, 0);
    CHECK(a.data_since_read <= 1);
    CHECK_EQ_INT(SV.accepts, 2);
    /* both pooled: two more at once reuse them */
    rec_init(&a);
    rec_init(&b);
    start(&a, "/get", NULL, 0);
    start(&b, "/get", NULL, 0);
    CHECK(run_until(all_done, all, 3000));
    expect_result(&a, MG_XFER_OK);
    expect_result(&b, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 2);
    CHECK_EQ_INT(SV.open_conns, 2);
    teardown();
}

static void test_pool_limits(void)
{
    setup();
    /* at most one idle connection per host */
    mg_h1_set_keepalive(C, 60000, 1);
    rec_t a, b;
    rec_init(&a);
    rec_init(&b);
    start(&a, "/get", NULL, 0);
    start(&b, "/get", NULL, 0);
    rec_t *all[] = {&a, &b, NULL};
    CHECK(run_until(all_done, all, 3000));
    expect_result(&a, MG_XFER_OK);
    expect_result(&b, MG_XFER_OK);
    int one = 1;
    CHECK(run_until(server_open_at_most, &one, 1000));
    CHECK_EQ_INT(SV.open_conns, 1);
    /* idle connections expire */
    mg_h1_set_keepalive(C, 50, 256);
    rec_t c;
    run_one(&c, "/get", NULL);
    expect_result(&c, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 2); /* reused the pooled one */
    int zero = 0;
    uint64_t t0 = now_ms();
    CHECK(run_until(server_open_at_most, &zero, 1000));
    CHECK(now_ms() - t0 >= 30);
    /* idle_ms 0: no pooling at all */
    mg_h1_set_keepalive(C, 0, 256);
    rec_t d;
    run_one(&d, "/get", NULL);
    expect_result(&d, MG_XFER_OK);
    CHECK(run_until(server_open_at_most, &zero, 1000));
    teardown();
}

static void chain_get(rec_t *r)
{
    r->after_done = NULL;
    start(r->next, "/get", NULL, 0);
}

static void test_stale_connection_retry(void)
{
    setup();
    /* 1. the server closes a pooled connection and the client notices while idle */
    rec_t a, b;
    run_one(&a, "/stale", NULL);
    expect_result(&a, MG_XFER_OK);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 10) == 0);
    run_for(100); /* the server closes it after 30 ms */
    run_one(&b, "/get", NULL);
    expect_result(&b, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 2);
    CHECK_EQ_INT(SV.unanswered, 0); /* nothing was sent on the dead connection */

    /* 2. the request goes out on the pooled connection just as the server closes it:
     * EOF/reset before any response byte, so it is retried on a fresh connection */
    rec_t s, g;
    rec_init(&s);
    rec_init(&g);
    s.after_done = chain_get;
    s.next = &g;
    int accepts = SV.accepts;
    start(&s, "/stale", NULL, 0);
    CHECK(run_until(is_done, &g, 3000));
    expect_result(&s, MG_XFER_OK);
    expect_result(&g, MG_XFER_OK);
    CHECK_STR(g.data, "{\"ok\":true}");
    CHECK_EQ_INT(g.headers_calls, 1);
    CHECK_EQ_INT(SV.accepts, accepts + 1);
    CHECK_EQ_INT(SV.unanswered, 1); /* the first copy of the request went to the closing one */

    /* 3. only once: a reused connection dropped, and the retry dropped too → error */
    rec_t h, d;
    run_one(&h, "/get", NULL);
    expect_result(&h, MG_XFER_OK);
    accepts = SV.accepts;
    run_one(&d, "/drop", NULL);
    expect_result(&d, MG_XFER_ERROR);
    CHECK_EQ_INT(hits("/drop"), 2);
    CHECK_EQ_INT(SV.accepts, accepts + 1);
    CHECK_EQ_INT(d.headers_calls, 0);

    /* 4. a fresh connection is never retried */
    rec_t f;
    run_one(&f, "/drop", NULL);
    expect_result(&f, MG_XFER_ERROR);
    CHECK_EQ_INT(hits("/drop"), 3);
    teardown();
}

static void test_connect_errors(void)
{
    setup();
    int port = closed_port();
    rec_t r;
    rec_init(&r);
    start(&r, "/get", NULL, port);
    CHECK(run_until(is_done, &r, 3000));
    expect_result(&r, MG_XFER_CONNECT_ERROR);
    CHECK_EQ_INT(r.headers_calls, 0);
    CHECK_EQ_INT(r.data_calls, 0);
    CHECK(r.detail[0] != '\0');
    CHECK_EQ_INT(mg_h1_active(C), 0);

    /* a name that does not resolve */
    rec_t n;
    rec_init(&n);
    xopt_t o = {"GET", NULL, NULL, 1000, 0, 0, 0};
    start_url(&n, "http://nonexistent.invalid/get", &o);
    CHECK(run_until(is_done, &n, 3000));
    expect_result(&n, MG_XFER_CONNECT_ERROR);

    /* a listener whose accept queue is full: the handshake never completes */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ_INT(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    CHECK_EQ_INT(listen(lfd, 0), 0);
    socklen_t sl = sizeof(sa);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    int fill[3];
    for (int i = 0; i < 3; i++) {
        fill[i] = socket(AF_INET, SOCK_STREAM, 0);
        fcntl(fill[i], F_SETFL, O_NONBLOCK);
        connect(fill[i], (struct sockaddr *)&sa, sizeof(sa));
    }
    rec_t t;
    rec_init(&t);
    xopt_t ot = {"GET", NULL, NULL, 200, 0, 0, 0};
    start(&t, "/get", &ot, ntohs(sa.sin_port));
    CHECK(run_until(is_done, &t, 3000));
    expect_result(&t, MG_XFER_CONNECT_ERROR);
    uint64_t dt = t.t_done - t.t_start;
    if (dt < 180 || dt > 1500)
        fprintf(stderr, "  connect timeout after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 180 && dt <= 1500);
    for (int i = 0; i < 3; i++) close(fill[i]);
    close(lfd);
    teardown();
}

static void test_first_byte_timeout(void)
{
    setup();
    rec_t r;
    rec_init(&r);
    xopt_t o = {"POST", "{}", NULL, 0, 150, 0, 0};
    start(&r, "/silent", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_FIRST_BYTE_TIMEOUT);
    uint64_t dt = r.t_done - r.t_start;
    if (dt < 140 || dt > 1000)
        fprintf(stderr, "  first byte timeout after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 140 && dt <= 1000);
    CHECK_EQ_INT(r.headers_calls, 0);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000)); /* the upstream sees the connection go */
    CHECK_EQ_INT(SV.requests, 1);
    teardown();
}

static void test_idle_timeout(void)
{
    setup();
    rec_t r;
    rec_init(&r);
    xopt_t o = {"GET", NULL, NULL, 0, 1000, 150, 0};
    start(&r, "/stall", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_IDLE_TIMEOUT);
    CHECK_EQ_INT(r.headers_calls, 1);
    CHECK_STR(r.data, "hello");
    uint64_t dt = r.t_done - r.t_headers; /* idle 150 ms, well before the 1000 ms first-byte */
    if (dt < 140 || dt > 500)
        fprintf(stderr, "  idle timeout after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 140 && dt <= 500);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000));
    /* the same without any first-byte timeout: the idle deadline alone arms the timer */
    rec_t z;
    xopt_t oz = {"GET", NULL, NULL, 0, 0, 150, 0};
    run_one(&z, "/stall", &oz);
    expect_result(&z, MG_XFER_IDLE_TIMEOUT);
    dt = z.t_done - z.t_headers;
    CHECK(dt >= 140 && dt <= 500);
    /* a steady trickle (every 40 ms) is not idle under a 150 ms idle timeout */
    rec_t s;
    xopt_t o2 = {"GET", NULL, NULL, 0, 1000, 150, 0};
    run_one(&s, "/slow", &o2);
    expect_result(&s, MG_XFER_OK);
    CHECK_STR(s.data, "abcdef");
    teardown();
}

static void test_total_timeout(void)
{
    setup();
    rec_t r;
    rec_init(&r);
    xopt_t o = {"GET", NULL, NULL, 0, 0, 0, 130};
    start(&r, "/slow", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_TOTAL_TIMEOUT);
    CHECK(r.len > 0 && r.len < 6);
    uint64_t dt = r.t_done - r.t_start;
    CHECK(dt >= 120 && dt <= 1000);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000));
    teardown();
}

static void test_cancel_inside_callbacks(void)
{
    setup();
    rec_t r;
    rec_init(&r);
    r.cancel_on_data = 1;
    start(&r, "/slow", NULL, 0);
    CHECK(run_until(is_done, &r, 400) == 0); /* on_done never comes */
    CHECK_EQ_INT(r.data_calls, 1);
    CHECK_EQ_INT(r.done_calls, 0);
    CHECK_EQ_INT(mg_h1_active(C), 0);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000)); /* the upstream saw the client leave */

    rec_t h;
    rec_init(&h);
    h.cancel_on_headers = 1;
    start(&h, "/pieces", NULL, 0);
    int two = 2;
    CHECK(run_until(server_saw_eof, &two, 1000));
    run_for(150);
    CHECK_EQ_INT(h.headers_calls, 1);
    CHECK_EQ_INT(h.data_calls, 0);
    CHECK_EQ_INT(h.done_calls, 0);
    CHECK_EQ_INT(mg_h1_active(C), 0);
    CHECK_EQ_INT(SV.open_conns, 0); /* neither was pooled */

    /* cancelled right after start, fresh and on a pooled connection: no callback */
    rec_t g, a, b;
    run_one(&g, "/get", NULL);
    expect_result(&g, MG_XFER_OK);
    rec_init(&a);
    rec_init(&b);
    start(&a, "/silent", NULL, 0); /* takes the pooled connection */
    start(&b, "/get", NULL, 0);    /* opens a new one */
    mg_h1_cancel(a.x);
    mg_h1_cancel(b.x);
    CHECK_EQ_INT(mg_h1_active(C), 0);
    int three = 3;
    CHECK(run_until(server_saw_eof, &three, 1000));
    run_for(100);
    CHECK_EQ_INT(a.headers_calls + a.data_calls + a.done_calls, 0);
    CHECK_EQ_INT(b.headers_calls + b.data_calls + b.done_calls, 0);
    /* the client still works afterwards */
    rec_t c;
    run_one(&c, "/get", NULL);
    expect_result(&c, MG_XFER_OK);
    teardown();
}

/* Closing the whole client from inside a transfer's callback. */
static void test_close_inside_callback(void)
{
    setup();
    rec_t r, s;
    rec_init(&r);
    rec_init(&s);
    r.close_on_data = 1;
    start(&r, "/pieces", NULL, 0);
    start(&s, "/silent", NULL, 0);
    run_for(300);
    CHECK(C == NULL);
    CHECK_EQ_INT(r.data_calls, 1);
    CHECK_EQ_INT(r.done_calls + s.done_calls + s.headers_calls, 0);
    teardown();
}

static rec_t *paused_rec;
static void resume_later(uv_timer_t *t)
{
    rec_t *r = paused_rec;
    r->paused = 0;
    r->in_resume = 1;
    mg_h1_resume(r->x);
    r->in_resume = 0;
}

/* Pause on the first piece, resume from a timer 250 ms later. */
static void paused_run(rec_t *r, const char *path, const xopt_t *o)
{
    rec_init(r);
    r->pause_first = 1;
    start(r, path, o, 0);
    run_for(250); /* every piece has been sent meanwhile */
    CHECK_EQ_INT(r->data_calls, 1);
    CHECK_EQ_INT(r->done_calls, 0);
    uv_timer_t t;
    uv_timer_init(&L, &t);
    paused_rec = r;
    uv_timer_start(&t, resume_later, 10, 0);
    CHECK(run_until(is_done, r, 2000));
    uv_close((uv_handle_t *)&t, NULL);
    run_for(20); /* t lives on this stack: let it close */
    CHECK_EQ_INT(r->data_while_paused, 0);
}

static void test_pause_resume(void)
{
    setup();
    /* pieces arriving while paused: delivered once each after the resume */
    rec_t r;
    xopt_t o = {"GET", NULL, NULL, 0, 1000, 100, 0}; /* idle 100 ms: a pause is not idleness */
    paused_run(&r, "/pieces", &o);
    expect_result(&r, MG_XFER_OK);
    CHECK_STR(r.data, "hello world");

    /* the rest of the response already read: resume delivers it and ends, synchronously */
    rec_t a;
    paused_run(&a, "/chunked-one", NULL);
    expect_result(&a, MG_XFER_OK);
    CHECK_STR(a.data, "hello world");
    CHECK_EQ_INT(a.data_in_resume, 1);
    CHECK_EQ_INT(a.done_in_resume, 1);

    /* paused on the very last body byte: the end comes from inside the resume */
    rec_t b;
    paused_run(&b, "/cl-one", NULL);
    expect_result(&b, MG_XFER_OK);
    CHECK_STR(b.data, "abc");
    CHECK_EQ_INT(b.done_in_resume, 1);
    CHECK_EQ_INT(SV.accepts, 1); /* and the connection went back to the pool each time */

    /* resume on a transfer that is not paused is harmless */
    rec_t s;
    rec_init(&s);
    start(&s, "/slow", NULL, 0);
    mg_h1_resume(s.x);
    CHECK(run_until(is_done, &s, 2000));
    expect_result(&s, MG_XFER_OK);
    CHECK_STR(s.data, "abcdef");
    teardown();
}

static void test_status_and_headers(void)
{
    setup();
    rec_t r;
    run_one(&r, "/429", NULL);
    expect_result(&r, MG_XFER_OK); /* an HTTP error status is still a completed exchange */
    CHECK_EQ_INT(r.status, 429);
    CHECK_STR(r.retry_after, "3");
    /* every header of an error answer, for the cooldown policy: names lower-cased */
    CHECK_STR(r.error_headers, "retry-after=3;x-ratelimit-reset-requests=6m0s;"
                               "content-type=application/json;content-length=2;");
    CHECK_STR(r.content_type, "application/json");
    CHECK_STR(r.data, "{}");
    /* a 1xx before the real status: on_headers once, with the final status and headers */
    rec_t c;
    run_one(&c, "/continue", NULL);
    expect_result(&c, MG_XFER_OK);
    CHECK_EQ_INT(c.headers_calls, 1);
    CHECK_EQ_INT(c.status, 200);
    CHECK_STR(c.retry_after, "(none)");
    CHECK_STR(c.error_headers, "(none)"); /* a success's headers are not copied */
    CHECK_STR(c.data, "ok");
    rec_t n;
    run_one(&n, "/nope", NULL);
    expect_result(&n, MG_XFER_OK);
    CHECK_EQ_INT(n.status, 404);
    teardown();
}

static void test_broken_responses(void)
{
    setup();
    const char *paths[] = {"/truncated", "/truncated-chunked", "/garbage", "/reset"};
    rec_t r[4];
    rec_t *all[5] = {&r[0], &r[1], &r[2], &r[3], NULL};
    for (int i = 0; i < 4; i++) {
        rec_init(&r[i]);
        start(&r[i], paths[i], NULL, 0);
    }
    CHECK(run_until(all_done, all, 3000));
    for (int i = 0; i < 4; i++) {
        if (r[i].result != MG_XFER_ERROR) fprintf(stderr, "  %s:\n", paths[i]);
        expect_result(&r[i], MG_XFER_ERROR);
        CHECK(r[i].detail[0] != '\0');
    }
    CHECK_STR(r[0].data, "short");
    CHECK_STR(r[1].data, "hello");
    CHECK_EQ_INT(r[2].headers_calls, 0);
    teardown();
}

static void test_names_and_literals(void)
{
    setup();
    /* two transfers to a name at once: one lookup, both connect */
    rec_t a, b;
    rec_init(&a);
    rec_init(&b);
    char url[128];
    snprintf(url, sizeof(url), "http://localhost:%d/get", SV.port);
    start_url(&a, url, NULL);
    start_url(&b, url, NULL);
    rec_t *all[] = {&a, &b, NULL};
    CHECK(run_until(all_done, all, 3000));
    expect_result(&a, MG_XFER_OK);
    expect_result(&b, MG_XFER_OK);
    CHECK_STR(a.data, "{\"ok\":true}");
    char host[64];
    snprintf(host, sizeof(host), "\r\nHost: localhost:%d\r\n", SV.port);
    CHECK(strstr(SV.last_head, host) != NULL);
    /* cancelled while its lookup is in flight: no callback, and the name still works */
    rec_t c, d;
    rec_init(&c);
    snprintf(url, sizeof(url), "http://LOCALHOST:%d/get", SV.port);
    start_url(&c, url, NULL);
    mg_h1_cancel(c.x);
    run_for(50);
    CHECK_EQ_INT(c.done_calls, 0);
    rec_init(&d);
    start_url(&d, url, NULL);
    CHECK(run_until(is_done, &d, 3000));
    expect_result(&d, MG_XFER_OK);
    /* an IPv6 literal */
    if (SV.port6) {
        rec_t v;
        rec_init(&v);
        snprintf(url, sizeof(url), "http://[::1]:%d/get?x=1", SV.port6);
        start_url(&v, url, NULL);
        CHECK(run_until(is_done, &v, 3000));
        expect_result(&v, MG_XFER_OK);
        snprintf(host, sizeof(host), "\r\nHost: [::1]:%d\r\n", SV.port6);
        CHECK(strstr(SV.last_head, host) != NULL);
        CHECK_STR(SV.last_path, "/get?x=1");
    }
    teardown();
}

static void test_bad_input(void)
{
    setup();
    const char *bad[] = {"https://127.0.0.1/x",
                         "http://",
                         "http://127.0.0.1:99999/",
                         "http://a b/",
                         "ftp://x/",
                         "http://[::1/",
                         "http://u@host/",
                         "http://h/a b",
                         "http://[nothex]/",
                         "http://bad%name/",
                         NULL};
    for (int i = 0; bad[i]; i++) {
        mg_xfer_opts_t o;
        memset(&o, 0, sizeof(o));
        o.method = "POST";
        o.url = bad[i];
        o.headers = curl_slist_append(NULL, "X-A: b");
        o.body = strdup("{}"); /* freed by mg_h1_start even on failure (ASan checks) */
        o.body_len = 2;
        mg_h1_xfer_t *x = NULL;
        rec_t r;
        rec_init(&r);
        int rc = mg_h1_start(C, &o, &CBS, &r, &x);
        if (rc >= 0) fprintf(stderr, "  accepted: %s\n", bad[i]);
        CHECK(rc < 0);
    }
    mg_xfer_opts_t o;
    memset(&o, 0, sizeof(o));
    o.method = "GE T";
    o.url = "http://127.0.0.1/";
    mg_h1_xfer_t *x = NULL;
    CHECK(mg_h1_start(C, &o, &CBS, NULL, &x) < 0);
    CHECK_EQ_INT(mg_h1_active(C), 0);
    teardown();
}

/* Many transfers at once, all complete; then closing the client with transfers in
 * flight (one still resolving): no callback afterwards and every handle closes. */
static void test_concurrent_and_close(void)
{
    setup();
    enum { N = 16 };
    rec_t r[N];
    rec_t *all[N + 1];
    for (int i = 0; i < N; i++) {
        rec_init(&r[i]);
        start(&r[i], i % 2 ? "/pieces" : "/get", NULL, 0);
        all[i] = &r[i];
    }
    all[N] = NULL;
    CHECK_EQ_INT(mg_h1_active(C), N);
    CHECK(run_until(all_done, all, 3000));
    for (int i = 0; i < N; i++) {
        expect_result(&r[i], MG_XFER_OK);
        CHECK_STR(r[i].data, i % 2 ? "hello world" : "{\"ok\":true}");
    }
    CHECK_EQ_INT(mg_h1_active(C), 0);
    rec_t s[4];
    const char *paths[] = {"/silent", "/stall", "/slow"};
    for (int i = 0; i < 3; i++) {
        rec_init(&s[i]);
        start(&s[i], paths[i], NULL, 0);
    }
    run_for(60);
    rec_init(&s[3]);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.2.nip.invalid:%d/get", SV.port);
    start_url(&s[3], url, NULL);
    mg_h1_close(C);
    C = NULL;
    run_for(150);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(s[i].done_calls, 0);
    teardown();
}

/* ---- callgrind bench ---------------------------------------------------------------------- */

static int bench_done;
static void bench_headers(void *ud, int status) {}
static int bench_data(void *ud, const char *data, size_t len)
{
    return 0;
}
static void bench_on_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    bench_done = result == MG_XFER_OK ? 1 : -1;
}
static const mg_xfer_cbs_t BENCH_CBS = {bench_headers, bench_data, bench_on_done, NULL};

static int bench_finished(void *arg)
{
    return bench_done != 0;
}

/* N sequential keep-alive POSTs shaped like the proxy's (6 header lines, a small JSON
 * body, a JSON response): run under callgrind and divide the inclusive cost of the
 * client's entry points (mg_h1_start, conn_on_read) by N. */
static int bench_keepalive(int n)
{
    setup();
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/get", SV.port);
    const char *body =
        "{\"model\":\"qwen3-8b\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
        "\"max_tokens\":16}";
    uint64_t t0 = now_ms();
    for (int i = 0; i < n; i++) {
        mg_xfer_opts_t o;
        memset(&o, 0, sizeof(o));
        o.method = "POST";
        o.url = url;
        o.headers = curl_slist_append(NULL, "Content-Type: application/json");
        o.headers = curl_slist_append(o.headers, "Accept: application/json");
        o.headers = curl_slist_append(o.headers, "Expect:");
        o.headers = curl_slist_append(o.headers, "User-Agent: moongate/0.1");
        o.headers = curl_slist_append(o.headers, "X-Request-Id: 0123456789abcdef");
        o.headers = curl_slist_append(o.headers, "Authorization: Bearer sk-local-test");
        o.body = strdup(body);
        o.body_len = strlen(body);
        o.connect_timeout_ms = 5000;
        o.first_byte_timeout_ms = 60000;
        o.idle_timeout_ms = 30000;
        o.total_timeout_ms = 600000;
        mg_h1_xfer_t *x;
        bench_done = 0;
        if (mg_h1_start(C, &o, &BENCH_CBS, NULL, &x) != 0 ||
            !run_until(bench_finished, NULL, 2000) || bench_done != 1) {
            fprintf(stderr, "bench: transfer %d failed\n", i);
            return 1;
        }
    }
    uint64_t dt = now_ms() - t0;
    fprintf(stderr, "bench: %d transfers, %d connection(s), %.1f us each\n", n, SV.accepts,
            n ? (double)dt * 1000.0 / n : 0.0);
    teardown();
    return mg_test_summary();
}

/* The bytes delivered to the transfers of turn_recs between two loop turns (a uv_prepare runs
 * before each poll). */
static rec_t **turn_recs;
static size_t turn_last, turn_max;

static size_t delivered(void)
{
    size_t n = 0;
    for (int i = 0; turn_recs[i]; i++) n += turn_recs[i]->total;
    return n;
}

static void on_turn_start(uv_prepare_t *h)
{
    size_t now = delivered();
    if (now - turn_last > turn_max) turn_max = now - turn_last;
    turn_last = now;
}

/* 8 MiB answers on `n` transfers at once, each loop turn's reading measured: all arrive whole,
 * and no turn took more than the budget and one buffer (h1client.c: 256 + 64 KiB). */
static void big_answers_in_turns(rec_t **recs, int n)
{
    uv_prepare_t prep;
    uv_prepare_init(&L, &prep);
    turn_recs = recs;
    for (int i = 0; i < n; i++) rec_init(recs[i]);
    turn_last = turn_max = 0;
    uv_prepare_start(&prep, on_turn_start);
    for (int i = 0; i < n; i++) start(recs[i], "/big", NULL, 0);
    CHECK(run_until(all_done, recs, 5000));
    for (int i = 0; i < n; i++) {
        expect_result(recs[i], MG_XFER_OK);
        CHECK_EQ_INT(recs[i]->total, BIG_BYTES);
    }
    if (turn_max > (256 + 64) * 1024) fprintf(stderr, "  %zu bytes in one turn\n", turn_max);
    CHECK(turn_max <= (256 + 64) * 1024);
    uv_close((uv_handle_t *)&prep, NULL);
    run_for(10); /* prep lives on this stack: let it close */
}

/* One loop turn reads at most the turn's budget and one buffer more from all the upstreams
 * together, however much waits in their sockets: other connections' events are not held
 * behind big answers, whose reading is put off to the next turn again and again. */
static void test_turn_read_budget(void)
{
    setup();
    rec_t a, b, c;
    rec_t *one[] = {&a, NULL}, *three[] = {&a, &b, &c, NULL};
    big_answers_in_turns(one, 1);
    uint64_t deferrals = mg_h1_deferrals(C);
    CHECK(deferrals >= BIG_BYTES / ((256 + 64) * 1024)); /* each turn's tail was put off */
    big_answers_in_turns(three, 3);
    CHECK(mg_h1_deferrals(C) > deferrals);
    teardown();
}

/* Found by fuzz_h1client: an interim answer's body bytes reached on_data before on_headers,
 * as if they were the final answer's; and a status below 100 was taken for an interim one. */
static void test_interim_body_and_status_zero(void)
{
    setup();
    rec_t a, z;
    run_one(&a, "/1xx-body", NULL);
    expect_result(&a, MG_XFER_ERROR);
    CHECK_EQ_INT(a.headers_calls, 0);
    CHECK_EQ_INT(a.data_calls, 0);
    run_one(&z, "/status-0", NULL);
    expect_result(&z, MG_XFER_ERROR);
    CHECK_EQ_INT(z.headers_calls, 0);
    CHECK_EQ_INT(z.data_calls, 0);
    teardown();
}

int main(void)
{
    const char *bench = getenv("H1_BENCH");
    if (bench) return bench_keepalive(atoi(bench));
    MG_RUN(test_content_length_and_post);
    MG_RUN(test_chunked_close_delimited_and_pieces);
    MG_RUN(test_keepalive_reuse);
    MG_RUN(test_concurrent_use_two_connections);
    MG_RUN(test_pool_limits);
    MG_RUN(test_stale_connection_retry);
    MG_RUN(test_interim_body_and_status_zero);
    MG_RUN(test_connect_errors);
    MG_RUN(test_first_byte_timeout);
    MG_RUN(test_idle_timeout);
    MG_RUN(test_total_timeout);
    MG_RUN(test_cancel_inside_callbacks);
    MG_RUN(test_close_inside_callback);
    MG_RUN(test_pause_resume);
    MG_RUN(test_turn_read_budget);
    MG_RUN(test_status_and_headers);
    MG_RUN(test_broken_responses);
    MG_RUN(test_names_and_literals);
    MG_RUN(test_bad_input);
    MG_RUN(test_concurrent_and_close);
    return mg_test_summary();
}
