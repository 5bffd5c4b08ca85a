/* fuzz_http: core/net/http.c's request path (llhttp callbacks with our limits: header and
 * body sizes, pipelining, keep-alive, chunked bodies, Expect, the request's arena and its
 * owner hooks) against a client that sends any bytes.
 *
 * One loop and one listener on 127.0.0.1 live for the whole run, with small limits (2 KiB of
 * head, 4 KiB of body). For each input an in-loop client connects, writes the input from its
 * second byte, half-closes and reads until the server closes. The first byte chooses how the
 * handler answers each complete request (bits 0-1, the stop-and-free cases):
 *   0 at once with mg_http_respond (the body's length),
 *   1 a chunked stream (begin, write, end),
 *   2 later, from a timer: the client may leave first, and then on_abort frees the pending
 *     answer (the server must not call back after that, ASan sees it if it does),
 *   3 never: on_abort frees the request's state when the client leaves;
 * bit 2: ask the connection to close after the answer (mg_http_set_close).
 * Checks on every request: path set and NUL-terminated, body_len within the limit and the
 * body NUL-terminated, every header with a name and a value; on_abort at most once per
 * request and only for one not answered; after each input every connection is closed. */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "net/http.h"

#define MAX_BODY 4096

static uv_loop_t L;
static mg_listener_t server;
static int port;
static int answer_mode, close_after;

typedef struct {
    const uint8_t *data;
    size_t len;
    uv_tcp_t tcp;
    uv_connect_t connect;
    uv_write_t wr;
    uv_shutdown_t sh;
    int closed;
} client_t;
static client_t client;

typedef struct {
    mg_http_req_t *req;
    uv_timer_t timer;
    int aborted, answered;
} pending_t;
static size_t pending_open; /* pending_t not yet freed */

static void check_request(const mg_http_req_t *req)
{
    if (!req->path || req->path[strlen(req->path)] != '\0') __builtin_trap();
    if (req->body_len > MAX_BODY) __builtin_trap();
    if (req->body_len && (!req->body || req->body[req->body_len] != '\0')) __builtin_trap();
    if (!req->body_len && req->body && req->body[0] != '\0') __builtin_trap();
    for (size_t i = 0; i < req->n_headers; i++)
        if (!req->headers[i].name || !req->headers[i].value) __builtin_trap();
    (void)mg_http_header(req, "content-type");
}

static void answer_now(mg_http_req_t *req)
{
    char body[32];
    int n = snprintf(body, sizeof(body), "%zu", req->body_len);
    if (close_after) mg_http_set_close(req);
    if (answer_mode == 1) {
        mg_http_stream_begin(req, 200, "text/event-stream", NULL);
        mg_http_stream_write(req, body, (size_t)n);
        mg_http_stream_end(req);
        return;
    }
    mg_http_respond(req, 200, "text/plain", NULL, body, (size_t)n);
}

static void pending_closed(uv_handle_t *h)
{
    free(h->data);
    pending_open--;
}

static void pending_fire(uv_timer_t *t)
{
    pending_t *p = t->data;
    if (p->aborted || p->answered) __builtin_trap();
    p->answered = 1;
    answer_now(p->req);
    uv_close((uv_handle_t *)&p->timer, pending_closed);
}

static void pending_abort(void *data)
{
    pending_t *p = data;
    if (p->aborted++ || p->answered) __builtin_trap();
    if (answer_mode == 2) {
        uv_timer_stop(&p->timer);
        uv_close((uv_handle_t *)&p->timer, pending_closed);
    } else {
        free(p);
        pending_open--;
    }
}

static void handler(void *ud, mg_http_req_t *req)
{
    (void)ud;
    check_request(req);
    if (answer_mode < 2) {
        answer_now(req);
        return;
    }
    pending_t *p = calloc(1, sizeof(*p));
    if (!p) abort();
    pending_open++;
    p->req = req;
    req->on_abort = pending_abort;
    req->hook_data = p;
    if (answer_mode == 2) {
        uv_timer_init(&L, &p->timer);
        p->timer.data = p;
        uv_timer_start(&p->timer, pending_fire, 1, 0);
    }
}

static void client_closed(uv_handle_t *h)
{
    (void)h;
    client.closed = 1;
}

static void client_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    (void)hint;
    static char scratch[65536];
    *buf = uv_buf_init(scratch, sizeof(scratch));
}

static void client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    if (n < 0 && !uv_is_closing((uv_handle_t *)s)) uv_close((uv_handle_t *)s, client_closed);
}

static void client_shut(uv_shutdown_t *sh, int status)
{
    (void)sh, (void)status;
}

static void client_wrote(uv_write_t *w, int status)
{
    (void)w;
    if (status == 0) uv_shutdown(&client.sh, (uv_stream_t *)&client.tcp, client_shut);
}

static void client_connected(uv_connect_t *c, int status)
{
    (void)c;
    if (status < 0) abort();
    uv_read_start((uv_stream_t *)&client.tcp, client_alloc, client_read);
    uv_buf_t b = uv_buf_init((char *)client.data, (unsigned)client.len);
    if (uv_write(&client.wr, (uv_stream_t *)&client.tcp, &b, 1, client_wrote) != 0)
        uv_close((uv_handle_t *)&client.tcp, client_closed);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN);                  /* as the gateway */
    int devnull = open("/dev/null", O_WRONLY); /* the access log: libFuzzer reports on stderr */
    if (devnull < 0 || mg_log_redirect(devnull) != 0) abort();
    uv_loop_init(&L);
    static const mg_http_limits_t lim = {.max_body_bytes = MAX_BODY,
                                         .max_header_bytes = 2048,
                                         .header_read_ms = 2000,
                                         .keepalive_idle_ms = 2000,
                                         .request_read_ms = 4000,
                                         .write_timeout_ms = 2000,
                                         .max_connections = 8,
                                         .name = "fuzz"};
    if (mg_listener_start(&server, &L, "127.0.0.1:0", &lim, handler, NULL) != 0) abort();
    const char *colon = strrchr(server.bound, ':');
    port = atoi(colon + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) setup(), ready = 1;
    if (size < 2) return 0;
    answer_mode = data[0] & 3;
    close_after = (data[0] >> 2) & 1;
    memset(&client, 0, sizeof(client));
    client.data = data + 1;
    client.len = size - 1;
    uv_tcp_init(&L, &client.tcp);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    if (uv_tcp_connect(&client.connect, &client.tcp, (const struct sockaddr *)&a,
                       client_connected) != 0)
        abort();
    /* the server closes after a half-closed client's last answer, or by its read deadlines */
    while (!client.closed || server.n_conns > 0 || pending_open > 0) uv_run(&L, UV_RUN_ONCE);
    return 0;
}
