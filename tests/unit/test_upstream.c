/* Unit tests for core/upstream/upstream.c: mg_xfer against a small scripted HTTP/1.1 server that
 * runs on raw uv_tcp in the same loop. The server counts accepted connections and
 * requests and notices when the client closes its side, so the tests can check
 * connection reuse and that a cancelled or timed-out transfer really leaves.
 *
 * Each server path plays a script of steps (write bytes after a delay, end the
 * response, close, reset, hold forever); /echo answers with what it received.
 *
 * The loop is driven with UV_RUN_ONCE from the test code and a 5 ms ticker, so every
 * wait is bounded. The file includes upstream.c itself, to reach curl_start: http:// URLs go
 * to h1client through mg_xfer_start, and curl's callbacks are tested over http:// too. */
#include "mgtest.h"
#include "upstream/upstream.c"
#include "upstream/headers.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static uv_loop_t L;
static uv_timer_t ticker;
static mg_upstream_t *UP;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the scripted server ------------------------------------------------------------------ */

typedef enum { S_WRITE, S_END, S_CLOSE, S_RESET, S_HOLD } step_kind_t;

typedef struct {
    step_kind_t kind;
    int delay_ms;
    const char *data;
} step_t;

typedef struct {
    const char *path;
    step_t steps[16];
} script_t;

#define HEAD_CHUNKED                                                                               \
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"

/* clang-format off */
static const script_t scripts[] = {
    {"/get", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                           "Content-Length: 11\r\n\r\n{\"ok\":true}"}, {S_END, 0, NULL}}},
    {"/pieces", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 30, "5\r\nhello\r\n"},
                 {S_WRITE, 30, "6\r\n world\r\n"}, {S_WRITE, 30, "0\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/silent", {{S_HOLD, 0, NULL}}},
    {"/stall", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"}, {S_HOLD, 0, NULL}}},
    {"/slow", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 40, "1\r\na\r\n"}, {S_WRITE, 40, "1\r\nb\r\n"},
               {S_WRITE, 40, "1\r\nc\r\n"}, {S_WRITE, 40, "1\r\nd\r\n"}, {S_WRITE, 40, "1\r\ne\r\n"},
               {S_WRITE, 40, "1\r\nf\r\n"}, {S_WRITE, 40, "0\r\n\r\n"}, {S_END, 0, NULL}}},
    {"/429", {{S_WRITE, 0, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nX-RateLimit-Reset-Requests:\t6m0s\r\n"
                           "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"},
              {S_END, 0, NULL}}},
    {"/continue", {{S_WRITE, 0, "HTTP/1.1 100 Continue\r\nRetry-After: 99\r\n\r\n"},
                   {S_WRITE, 10, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, {S_END, 0, NULL}}},
    {"/truncated", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"},
                    {S_CLOSE, 10, NULL}}},
    {"/truncated-chunked", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"},
                            {S_CLOSE, 10, NULL}}},
    {"/garbage", {{S_WRITE, 0, "THIS IS NOT HTTP\r\n\r\n"}, {S_CLOSE, 10, NULL}}},
    {"/reset", {{S_WRITE, 0, HEAD_CHUNKED}, {S_WRITE, 0, "5\r\nhello\r\n"}, {S_RESET, 20, NULL}}},
    {"/close-after", {{S_WRITE, 0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"},
                      {S_CLOSE, 0, NULL}}},
};
/* clang-format on */

typedef struct sconn_s sconn_t;

typedef struct {
    uv_tcp_t tcp;
    int port;
    int accepts;
    int requests;
    int eofs; /* connections the client closed */
    int open_conns;
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

static void sconn_unlink(sconn_t *c)
{
    for (sconn_t **p = &SV.conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
}

static void sconn_close(sconn_t *c, int reset)
{
    if (c->closing) return;
    c->closing = 1;
    SV.open_conns--;
    sconn_unlink(c);
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
    case S_END:
        c->script = NULL;
        try_request(c);
        break;
    case S_CLOSE: {
        c->script = NULL;
        sconn_close(c, 0);
        break;
    }
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

/* A complete request in c->in? Record it, consume it and start its script. */
static void try_request(sconn_t *c)
{
    if (c->closing || c->script) return;
    char *end = NULL;
    for (size_t i = 0; i + 3 < c->in_len; i++)
        if (memcmp(c->in + i, "\r\n\r\n", 4) == 0) {
            end = c->in + i;
            break;
        }
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

    if (strcmp(SV.last_path, "/echo") == 0) {
        char xt[128] = "(none)";
        const char *h = strcasestr(head, "\r\nx-test:");
        if (h) sscanf(h + 9, " %127[^\r]", xt);
        echo_response(c, xt);
        try_request(c);
        return;
    }
    for (size_t i = 0; i < sizeof(scripts) / sizeof(scripts[0]); i++)
        if (strcmp(scripts[i].path, SV.last_path) == 0) {
            c->script = &scripts[i];
            c->step = 0;
            run_script(c);
            return;
        }
    const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    swrite(c, nf, strlen(nf));
    try_request(c);
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

static void server_start(void)
{
    memset(&SV, 0, sizeof(SV));
    uv_tcp_init(&L, &SV.tcp);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
    uv_tcp_bind(&SV.tcp, (struct sockaddr *)&sa, 0);
    uv_listen((uv_stream_t *)&SV.tcp, 128, on_sconnection);
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    uv_tcp_getsockname(&SV.tcp, (struct sockaddr *)&ss, &len);
    SV.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void server_stop(void)
{
    uv_close((uv_handle_t *)&SV.tcp, NULL);
    while (SV.conns) sconn_close(SV.conns, 0);
    free(SV.last_body);
    SV.last_body = NULL;
}

/* A port nobody listens on: bind, read the port, close. */
static int closed_port(void)
{
    uv_tcp_t t;
    uv_tcp_init(&L, &t);
    struct sockaddr_in sa;
    uv_ip4_addr("127.0.0.1", 0, &sa);
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
    UP = mg_upstream_new(&L);
    CHECK(UP != NULL);
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
    if (UP) mg_upstream_close(UP);
    UP = NULL;
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
    mg_xfer_t *x;
    int status;
    int headers_calls;
    char data[8192];
    size_t len;
    int data_calls;
    int done_calls;
    mg_xfer_result_t result;
    char detail[256];
    char content_type[96];
    char retry_after[96];
    char error_headers[256]; /* the error answer's headers, "name=value;" each */
    uint64_t t_start, t_headers, t_done;
    /* behaviour */
    int cancel_on_data;    /* cancel inside the first on_data */
    int cancel_on_headers; /* cancel inside on_headers */
    int pause_first;       /* return 1 from the first on_data */
    int paused;            /* currently paused (set by us) */
    int data_while_paused;
    void (*after_done)(rec_t *);
    rec_t *next; /* chained transfer */
};

static void cb_headers(void *ud, int status)
{
    rec_t *r = ud;
    r->headers_calls++;
    r->status = status;
    r->t_headers = now_ms();
    const char *v = mg_xfer_header(r->x, "content-type");
    snprintf(r->content_type, sizeof(r->content_type), "%s", v ? v : "(none)");
    v = mg_xfer_header(r->x, "Retry-After");
    snprintf(r->retry_after, sizeof(r->retry_after), "%s", v ? v : "(none)");
    size_t hl, pos = 0, n = 0;
    char *h = mg_xfer_take_error_headers(r->x, &hl);
    const char *hn, *hv;
    snprintf(r->error_headers, sizeof(r->error_headers), "(none)");
    while (mg_headers_next(h, hl, &pos, &hn, &hv))
        n += (size_t)snprintf(r->error_headers + n, sizeof(r->error_headers) - n, "%s=%s;", hn, hv);
    free(h);
    if (r->cancel_on_headers) mg_xfer_cancel(r->x);
}

static int cb_data(void *ud, const char *data, size_t len)
{
    rec_t *r = ud;
    r->data_calls++;
    if (r->paused) r->data_while_paused++;
    if (r->len + len < sizeof(r->data)) {
        memcpy(r->data + r->len, data, len);
        r->len += len;
        r->data[r->len] = '\0';
    }
    if (r->cancel_on_data) {
        mg_xfer_cancel(r->x);
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
    snprintf(r->detail, sizeof(r->detail), "%s", detail ? detail : "");
    if (r->after_done) r->after_done(r);
}

static const mg_xfer_cbs_t CBS = {cb_headers, cb_data, cb_done, NULL};

typedef struct {
    const char *method;
    const char *body;
    const char *header;
    int connect_ms, first_byte_ms, idle_ms, total_ms;
} xopt_t;

static int start(rec_t *r, const char *path, const xopt_t *o, int port)
{
    char url[256];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port ? port : SV.port, path);
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
    int rc = mg_xfer_start(UP, &opts, &CBS, r, &r->x);
    CHECK_EQ_INT(rc, 0);
    return rc;
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

static void expect_result(rec_t *r, mg_xfer_result_t want)
{
    if (r->result != want || r->done_calls != 1)
        fprintf(stderr, "  result %d (want %d), done_calls %d, detail: %s\n", (int)r->result,
                (int)want, r->done_calls, r->detail);
    CHECK_EQ_INT(r->done_calls, 1);
    CHECK_EQ_INT(r->result, want);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_get_and_post(void)
{
    setup();
    rec_t g;
    memset(&g, 0, sizeof(g));
    start(&g, "/get", NULL, 0);
    CHECK_EQ_INT(mg_upstream_active(UP), 1);
    CHECK(run_until(is_done, &g, 2000));
    expect_result(&g, MG_XFER_OK);
    CHECK_EQ_INT(g.headers_calls, 1);
    CHECK_EQ_INT(g.status, 200);
    CHECK_STR(g.data, "{\"ok\":true}");
    CHECK_STR(g.content_type, "application/json");
    CHECK_STR(g.retry_after, "(none)");
    CHECK(g.t_headers <= g.t_done);
    CHECK_STR(SV.last_method, "GET");
    CHECK_STR(SV.last_path, "/get");
    CHECK_EQ_INT(mg_upstream_active(UP), 0);

    rec_t p;
    memset(&p, 0, sizeof(p));
    xopt_t o = {"POST", "{\"model\":\"m\",\"x\":[1,2]}", "X-Test: yes", 0, 0, 0, 0};
    start(&p, "/echo", &o, 0);
    CHECK(run_until(is_done, &p, 2000));
    expect_result(&p, MG_XFER_OK);
    CHECK_EQ_INT(p.status, 200);
    CHECK_STR(p.data, "POST {\"model\":\"m\",\"x\":[1,2]} x-test=yes");
    CHECK_STR(SV.last_method, "POST");
    CHECK_EQ_INT(SV.last_body_len, strlen(o.body));
    /* curl must not add Expect: 100-continue (it would stall small bodies) */
    CHECK(strcasestr(SV.last_head, "expect:") == NULL);
    /* a POST without a body sends Content-Length: 0 */
    rec_t e;
    memset(&e, 0, sizeof(e));
    xopt_t o2 = {"POST", NULL, NULL, 0, 0, 0, 0};
    start(&e, "/echo", &o2, 0);
    CHECK(run_until(is_done, &e, 2000));
    expect_result(&e, MG_XFER_OK);
    CHECK_STR(e.data, "POST  x-test=(none)");
    CHECK(strcasestr(SV.last_head, "content-length: 0") != NULL);
    /* a big body arrives whole */
    size_t n = 300000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    big[n] = '\0';
    rec_t b;
    memset(&b, 0, sizeof(b));
    xopt_t o3 = {"POST", big, NULL, 0, 0, 0, 0};
    start(&b, "/echo", &o3, 0);
    CHECK(run_until(is_done, &b, 3000));
    expect_result(&b, MG_XFER_OK);
    CHECK_EQ_INT(SV.last_body_len, n);
    CHECK(SV.last_body && memcmp(SV.last_body, big, n) == 0);
    free(big);
    teardown();
}

static void test_streamed_in_pieces(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    start(&r, "/pieces", NULL, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_OK);
    CHECK_STR(r.data, "hello world");
    CHECK(r.data_calls >= 2); /* delivered as it came, not buffered to the end */
    CHECK_STR(r.content_type, "text/plain");
    /* the first piece arrived well before the end */
    teardown();
}

static void test_connect_error(void)
{
    setup();
    int port = closed_port();
    rec_t r;
    memset(&r, 0, sizeof(r));
    start(&r, "/get", NULL, port);
    CHECK(run_until(is_done, &r, 3000));
    expect_result(&r, MG_XFER_CONNECT_ERROR);
    CHECK_EQ_INT(r.headers_calls, 0);
    CHECK_EQ_INT(r.data_calls, 0);
    CHECK(r.detail[0] != '\0');
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    teardown();
}

static void test_first_byte_timeout(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    xopt_t o = {"POST", "{}", NULL, 0, 150, 0, 0};
    start(&r, "/silent", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_FIRST_BYTE_TIMEOUT);
    uint64_t dt = r.t_done - r.t_start;
    if (dt < 140 || dt > 1000)
        fprintf(stderr, "  first byte timeout after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 140 && dt <= 1000);
    CHECK_EQ_INT(r.headers_calls, 0);
    /* the upstream sees the connection go */
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000));
    CHECK_EQ_INT(SV.requests, 1);
    teardown();
}

static void test_idle_timeout(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    xopt_t o = {"GET", NULL, NULL, 0, 1000, 150, 0};
    start(&r, "/stall", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_IDLE_TIMEOUT);
    CHECK_EQ_INT(r.headers_calls, 1);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR(r.data, "hello");
    uint64_t dt = r.t_done - r.t_headers;
    CHECK(dt >= 140 && dt <= 1000);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000));
    /* a steady trickle (every 40 ms) is not idle under a 150 ms idle timeout */
    rec_t s;
    memset(&s, 0, sizeof(s));
    xopt_t o2 = {"GET", NULL, NULL, 0, 1000, 150, 0};
    start(&s, "/slow", &o2, 0);
    CHECK(run_until(is_done, &s, 2000));
    expect_result(&s, MG_XFER_OK);
    CHECK_STR(s.data, "abcdef");
    teardown();
}

static void test_total_timeout(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    xopt_t o = {"GET", NULL, NULL, 0, 0, 0, 130};
    start(&r, "/slow", &o, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_TOTAL_TIMEOUT);
    CHECK(r.len > 0 && r.len < 6);
    teardown();
}

static void test_cancel_inside_on_data(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    r.cancel_on_data = 1;
    start(&r, "/slow", NULL, 0);
    CHECK(run_until(is_done, &r, 400) == 0); /* on_done never comes */
    CHECK_EQ_INT(r.data_calls, 1);
    CHECK_EQ_INT(r.done_calls, 0);
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    int one = 1;
    CHECK(run_until(server_saw_eof, &one, 1000)); /* the upstream saw the client leave */
    run_for(100);
    CHECK_EQ_INT(r.data_calls, 1);
    CHECK_EQ_INT(r.done_calls, 0);
    teardown();
}

static void test_cancel_inside_on_headers(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    r.cancel_on_headers = 1;
    start(&r, "/pieces", NULL, 0);
    run_for(250);
    CHECK_EQ_INT(r.headers_calls, 1);
    CHECK_EQ_INT(r.data_calls, 0);
    CHECK_EQ_INT(r.done_calls, 0);
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    teardown();
}

/* Cancelled right after start, before the loop ran: no callback at all. Also cancelling
 * a transfer that is waiting for its first byte. */
static void test_cancel_pending(void)
{
    setup();
    rec_t a, b;
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    start(&a, "/get", NULL, 0);
    mg_xfer_cancel(a.x);
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    start(&b, "/silent", NULL, 0);
    int one = 1;
    run_until(server_saw_eof, &one, 100); /* let it connect and send */
    CHECK_EQ_INT(SV.requests >= 1, 1);
    mg_xfer_cancel(b.x);
    CHECK(run_until(server_saw_eof, &one, 1000));
    run_for(100);
    CHECK_EQ_INT(a.headers_calls + a.data_calls + a.done_calls, 0);
    CHECK_EQ_INT(b.headers_calls + b.data_calls + b.done_calls, 0);
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    /* the client still works afterwards */
    rec_t c;
    memset(&c, 0, sizeof(c));
    start(&c, "/get", NULL, 0);
    CHECK(run_until(is_done, &c, 2000));
    expect_result(&c, MG_XFER_OK);
    teardown();
}

/* Sequential transfers to one server share one TCP connection, including one started
 * from inside the previous transfer's on_done. */
static rec_t chain2;
static void start_next(rec_t *r)
{
    start(r->next, "/get", NULL, 0);
}

static void test_connection_reuse(void)
{
    setup();
    rec_t a, c;
    memset(&a, 0, sizeof(a));
    memset(&chain2, 0, sizeof(chain2));
    memset(&c, 0, sizeof(c));
    a.after_done = start_next;
    a.next = &chain2;
    start(&a, "/get", NULL, 0);
    CHECK(run_until(is_done, &chain2, 2000));
    expect_result(&a, MG_XFER_OK);
    expect_result(&chain2, MG_XFER_OK);
    run_for(20);
    start(&c, "/pieces", NULL, 0);
    CHECK(run_until(is_done, &c, 2000));
    expect_result(&c, MG_XFER_OK);
    CHECK_EQ_INT(SV.requests, 3);
    if (SV.accepts != 1)
        fprintf(stderr, "  %d connections for 3 sequential transfers\n", SV.accepts);
    CHECK_EQ_INT(SV.accepts, 1);
    /* a response marked Connection: close is not reused */
    rec_t d, e;
    memset(&d, 0, sizeof(d));
    memset(&e, 0, sizeof(e));
    start(&d, "/close-after", NULL, 0);
    CHECK(run_until(is_done, &d, 2000));
    expect_result(&d, MG_XFER_OK);
    start(&e, "/get", NULL, 0);
    CHECK(run_until(is_done, &e, 2000));
    expect_result(&e, MG_XFER_OK);
    CHECK_EQ_INT(SV.accepts, 2);
    teardown();
}

static rec_t *paused_rec;
static void resume_later(uv_timer_t *t)
{
    paused_rec->paused = 0;
    mg_xfer_resume(paused_rec->x);
}

static void test_pause_resume(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    r.pause_first = 1;
    xopt_t o = {"GET", NULL, NULL, 0, 1000, 100, 0}; /* idle 100 ms: a pause is not idleness */
    start(&r, "/pieces", &o, 0);
    run_for(250); /* every piece has been sent meanwhile */
    CHECK_EQ_INT(r.data_calls, 1);
    CHECK_EQ_INT(r.data_while_paused, 0);
    CHECK_EQ_INT(r.done_calls, 0);
    CHECK_STR(r.data, "hello");
    uv_timer_t t;
    uv_timer_init(&L, &t);
    paused_rec = &r;
    uv_timer_start(&t, resume_later, 10, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_OK);
    /* Regression: pausing once made curl deliver the consumed bytes a second time. */
    if (strcmp(r.data, "hello world") != 0)
        fprintf(stderr, "  regression: after pause/resume the data reads \"%s\"\n", r.data);
    CHECK_STR(r.data, "hello world");
    CHECK(r.len >= 11 && strcmp(r.data + r.len - 11, "hello world") == 0);
    CHECK_EQ_INT(r.data_while_paused, 0);
    uv_close((uv_handle_t *)&t, NULL);
    /* resume on a transfer that is not paused is harmless */
    rec_t s;
    memset(&s, 0, sizeof(s));
    start(&s, "/slow", NULL, 0);
    mg_xfer_resume(s.x);
    CHECK(run_until(is_done, &s, 2000));
    expect_result(&s, MG_XFER_OK);
    CHECK_STR(s.data, "abcdef");
    teardown();
}

static void test_status_and_headers(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    start(&r, "/429", NULL, 0);
    CHECK(run_until(is_done, &r, 2000));
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
    memset(&c, 0, sizeof(c));
    start(&c, "/continue", NULL, 0);
    CHECK(run_until(is_done, &c, 2000));
    expect_result(&c, MG_XFER_OK);
    CHECK_EQ_INT(c.headers_calls, 1);
    CHECK_EQ_INT(c.status, 200);
    CHECK_STR(c.retry_after, "(none)");
    CHECK_STR(c.error_headers, "(none)"); /* a success's headers are not copied */
    CHECK_STR(c.data, "ok");
    /* unknown path: 404 */
    rec_t n;
    memset(&n, 0, sizeof(n));
    start(&n, "/nope", NULL, 0);
    CHECK(run_until(is_done, &n, 2000));
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
        memset(&r[i], 0, sizeof(r[i]));
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

/* Many transfers at once, all complete; then closing the client with transfers in
 * flight: no callback afterwards and every handle closes. */
static void test_concurrent_and_close(void)
{
    setup();
    enum { N = 16 };
    rec_t r[N];
    rec_t *all[N + 1];
    for (int i = 0; i < N; i++) {
        memset(&r[i], 0, sizeof(r[i]));
        start(&r[i], i % 2 ? "/pieces" : "/get", NULL, 0);
        all[i] = &r[i];
    }
    all[N] = NULL;
    CHECK_EQ_INT(mg_upstream_active(UP), N);
    CHECK(run_until(all_done, all, 3000));
    for (int i = 0; i < N; i++) {
        expect_result(&r[i], MG_XFER_OK);
        CHECK_STR(r[i].data, i % 2 ? "hello world" : "{\"ok\":true}");
    }
    CHECK_EQ_INT(mg_upstream_active(UP), 0);
    rec_t s[3];
    const char *paths[] = {"/silent", "/stall", "/slow"};
    for (int i = 0; i < 3; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        start(&s[i], paths[i], NULL, 0);
    }
    run_for(60);
    mg_upstream_close(UP);
    UP = NULL;
    run_for(150);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(s[i].done_calls, 0);
    teardown();
}

/* An idle upstream client with a cached keep-alive connection closes cleanly. */
static void test_close_with_cached_connection(void)
{
    setup();
    rec_t r;
    memset(&r, 0, sizeof(r));
    start(&r, "/get", NULL, 0);
    CHECK(run_until(is_done, &r, 2000));
    expect_result(&r, MG_XFER_OK);
    CHECK_EQ_INT(SV.open_conns, 1); /* kept alive */
    teardown();
}

/* ---- callbacks that free what their transfer reports to ----------------------------------- */

/* A transfer's owner on the heap, as proxy.c's call is: the callback named by free_on cancels
 * the transfer (unless it ended) and frees the owner. A callback after that reads freed memory,
 * which the sanitizer build reports; the counters outlive the owners for the other builds. */
typedef struct {
    mg_xfer_t *x;
    int use_curl;
    int free_on; /* 1: on_headers, 2: the first on_data, 3: on_done */
    int chain;   /* on_done starts this many more, one after the other */
    int *events, *freed;
} owner_t;

static void owner_start(const char *path, int use_curl, int free_on, int chain, int *events,
                        int *freed);

static void owner_free(owner_t *o, int cancel)
{
    if (cancel) mg_xfer_cancel(o->x);
    (*o->freed)++;
    free(o);
}

static void ow_headers(void *ud, int status)
{
    owner_t *o = ud;
    (*o->events)++;
    if (o->free_on == 1) owner_free(o, 1);
}

static int ow_data(void *ud, const char *data, size_t len)
{
    owner_t *o = ud;
    (*o->events)++;
    if (o->free_on == 2) owner_free(o, 1);
    return 0;
}

static void ow_read_end(void *ud)
{
    owner_t *o = ud;
    (*o->events)++;
}

static void ow_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    owner_t *o = ud;
    (*o->events)++;
    int chain = o->chain, use_curl = o->use_curl, *events = o->events, *freed = o->freed;
    owner_free(o, 0);
    /* the next transfer from inside on_done: h1 hands it the connection just pooled */
    if (chain > 0) owner_start("/get", use_curl, 3, chain - 1, events, freed);
}

static const mg_xfer_cbs_t OWNER_CBS = {ow_headers, ow_data, ow_done, ow_read_end};

static void owner_start(const char *path, int use_curl, int free_on, int chain, int *events,
                        int *freed)
{
    owner_t *o = calloc(1, sizeof(*o));
    *o = (owner_t){NULL, use_curl, free_on, chain, events, freed};
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", SV.port, path);
    mg_xfer_opts_t opts = {
        .method = "GET", .url = url, .connect_timeout_ms = 2000, .total_timeout_ms = 5000};
    int rc = use_curl ? curl_start(UP, &opts, &OWNER_CBS, o, &o->x)
                      : mg_xfer_start(UP, &opts, &OWNER_CBS, o, &o->x);
    CHECK_EQ_INT(rc, 0);
}

static int freed_six(void *arg)
{
    return *(int *)arg >= 6;
}

static void test_callbacks_free_their_owner(void)
{
    for (int use_curl = 0; use_curl < 2; use_curl++) {
        setup();
        int events = 0, freed = 0;
        owner_start("/pieces", use_curl, 2, 0, &events, &freed); /* freed in its first on_data */
        owner_start("/pieces", use_curl, 1, 0, &events, &freed); /* in on_headers */
        owner_start("/get", use_curl, 3, 3, &events, &freed);    /* in on_done, three times over */
        CHECK(run_until(freed_six, &freed, 3000));
        int seen = events;
        run_for(200); /* the rest of /pieces arrives: nobody is told */
        CHECK_EQ_INT(freed, 6);
        CHECK_EQ_INT(events, seen);
        CHECK_EQ_INT(mg_upstream_active(UP), 0);
        if (!use_curl) CHECK_EQ_INT(SV.accepts, 3); /* the chain went over the pooled connection */
        teardown();
    }
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    MG_RUN(test_get_and_post);
    MG_RUN(test_streamed_in_pieces);
    MG_RUN(test_connect_error);
    MG_RUN(test_first_byte_timeout);
    MG_RUN(test_idle_timeout);
    MG_RUN(test_total_timeout);
    MG_RUN(test_cancel_inside_on_data);
    MG_RUN(test_cancel_inside_on_headers);
    MG_RUN(test_cancel_pending);
    MG_RUN(test_connection_reuse);
    MG_RUN(test_pause_resume);
    MG_RUN(test_status_and_headers);
    MG_RUN(test_broken_responses);
    MG_RUN(test_concurrent_and_close);
    MG_RUN(test_close_with_cached_connection);
    MG_RUN(test_callbacks_free_their_owner);
    curl_global_cleanup();
    return mg_test_summary();
}
