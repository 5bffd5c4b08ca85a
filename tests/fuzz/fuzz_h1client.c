/* fuzz_h1client: core/upstream/h1client.c's response path (llhttp callbacks with our limits,
 * header capture, chunked and close-delimited bodies, pause/resume, keep-alive decisions)
 * against an upstream that answers any bytes. An upstream is not trusted.
 *
 * One loop and one listening socket on 127.0.0.1 live for the whole run. For each input the
 * driver starts a transfer; the in-process server reads the request head, writes the answer
 * (the input from its second byte) in pieces and closes. The first byte chooses the mode:
 *   bits 0-1: 0 plain, 1 cancel in on_headers, 2 cancel in the Nth on_data, 3 close the
 *             whole client in the Nth on_data (the stop-and-free cases: the client must
 *             touch neither the transfer nor `ud` after the callback, ASan sees it if it does)
 *   bits 2-4: N (the data callback that stops, or pauses)
 *   bit 5:    pause in the Nth on_data and resume from a zero timer
 *   bits 6-7: the server's piece size (1, 7, 64 or all at once)
 * Checks: on_headers fires at most once and before any on_data; on_done fires exactly once
 * unless the transfer was cancelled, and never after a cancel; the loop drains (no handle
 * left behind: the client is closed and its handles walked away by the end of each input). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "upstream/h1client.h"

static uv_loop_t L;
static uv_tcp_t server;
static int port;

typedef struct {
    const uint8_t *data;
    size_t len, off, piece;
} answer_t;
static answer_t answer;

typedef struct {
    uv_tcp_t tcp;
    char seen[4]; /* the last bytes read, to find the end of the request head */
    int answered;
    uv_write_t wr;
} peer_t;

typedef struct {
    mg_h1_t *client;
    mg_h1_xfer_t *x;
    int mode, n, pause;
    int headers, datas, done, stopped;
    uv_timer_t resume;
    int resume_armed;
} run_t;
static run_t run;

static void peer_closed(uv_handle_t *h)
{
    free(h);
}

static void peer_write_next(peer_t *p);
static void peer_wrote(uv_write_t *w, int status)
{
    peer_t *p = w->data;
    if (status < 0 || answer.off >= answer.len) {
        uv_close((uv_handle_t *)&p->tcp, peer_closed);
        return;
    }
    peer_write_next(p);
}

static void peer_write_next(peer_t *p)
{
    size_t n = answer.len - answer.off;
    if (n > answer.piece) n = answer.piece;
    uv_buf_t b = uv_buf_init((char *)answer.data + answer.off, (unsigned)n);
    answer.off += n;
    p->wr.data = p;
    if (uv_write(&p->wr, (uv_stream_t *)&p->tcp, &b, 1, peer_wrote) != 0)
        uv_close((uv_handle_t *)&p->tcp, peer_closed);
}

static void peer_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    (void)h;
    (void)hint;
    static char scratch[4096];
    *buf = uv_buf_init(scratch, sizeof(scratch));
}

static void peer_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    peer_t *p = (peer_t *)s;
    if (n < 0) {
        if (!uv_is_closing((uv_handle_t *)s)) uv_close((uv_handle_t *)s, peer_closed);
        return;
    }
    for (ssize_t i = 0; i < n && !p->answered; i++) {
        memmove(p->seen, p->seen + 1, 3);
        p->seen[3] = buf->base[i];
        if (memcmp(p->seen, "\r\n\r\n", 4) == 0) p->answered = 1;
    }
    if (!p->answered) return;
    uv_read_stop(s);
    if (answer.len == 0) {
        uv_close((uv_handle_t *)s, peer_closed);
        return;
    }
    peer_write_next(p);
}

static void on_conn(uv_stream_t *srv, int status)
{
    if (status < 0) return;
    peer_t *p = calloc(1, sizeof(*p));
    if (!p) abort();
    uv_tcp_init(&L, &p->tcp);
    if (uv_accept(srv, (uv_stream_t *)&p->tcp) != 0) {
        uv_close((uv_handle_t *)&p->tcp, peer_closed);
        return;
    }
    uv_read_start((uv_stream_t *)&p->tcp, peer_alloc, peer_read);
}

static void setup(void)
{
    signal(SIGPIPE, SIG_IGN); /* as the gateway: a peer gone mid-write is an error, not a kill */
    uv_loop_init(&L);
    uv_tcp_init(&L, &server);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    if (uv_tcp_bind(&server, (const struct sockaddr *)&a, 0) != 0) abort();
    if (uv_listen((uv_stream_t *)&server, 128, on_conn) != 0) abort();
    struct sockaddr_storage got;
    int len = sizeof(got);
    uv_tcp_getsockname(&server, (struct sockaddr *)&got, &len);
    port = ntohs(((struct sockaddr_in *)&got)->sin_port);
}

static void stop_client(void)
{
    run.stopped = 1;
    if (run.client) mg_h1_close(run.client);
    run.client = NULL;
}

static void on_headers(void *ud, int status)
{
    if (ud != &run || run.stopped) __builtin_trap();
    if (run.headers++ || run.datas || status < 100 || status > 999) __builtin_trap();
    if (run.mode == 1) {
        run.stopped = 1;
        mg_h1_cancel(run.x);
    }
}

static void resume_now(uv_timer_t *t)
{
    (void)t;
    if (!run.stopped && !run.done) mg_h1_resume(run.x);
}

static int on_data(void *ud, const char *data, size_t len)
{
    if (ud != &run || run.stopped || run.done) __builtin_trap();
    if (!run.headers || (len && !data)) __builtin_trap();
    if (len) (void)((volatile const char *)data)[len - 1]; /* the bytes are readable */
    int nth = run.datas++ == run.n;
    if (nth && run.mode == 2) {
        run.stopped = 1;
        mg_h1_cancel(run.x);
        return 0;
    }
    if (nth && run.mode == 3) {
        stop_client();
        return 0;
    }
    if (nth && run.pause) {
        uv_timer_start(&run.resume, resume_now, 0, 0);
        return 1;
    }
    return 0;
}

static void on_done(void *ud, mg_xfer_result_t res, const char *detail)
{
    (void)detail;
    if (ud != &run || run.stopped || run.done++) __builtin_trap();
    if (res == MG_XFER_OK && !run.headers) __builtin_trap(); /* success needs an answer */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) setup(), ready = 1;
    if (size < 1) return 0;
    static const size_t pieces[] = {1, 7, 64, (size_t)-1};
    answer = (answer_t){.data = data + 1, .len = size - 1, .piece = pieces[data[0] >> 6]};
    memset(&run, 0, sizeof(run));
    run.mode = data[0] & 3;
    run.n = (data[0] >> 2) & 7;
    run.pause = (data[0] >> 5) & 1;
    uv_timer_init(&L, &run.resume);
    run.client = mg_h1_new(&L);
    if (!run.client) abort();
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/x", port);
    char *body = strdup("{}");
    mg_xfer_opts_t o = {.method = "POST",
                        .url = url,
                        .body = body,
                        .body_len = 2,
                        .first_byte_timeout_ms = 2000,
                        .idle_timeout_ms = 2000,
                        .total_timeout_ms = 5000};
    static const mg_xfer_cbs_t cbs = {on_headers, on_data, on_done, NULL};
    if (mg_h1_start(run.client, &o, &cbs, &run, &run.x) != 0) __builtin_trap();
    while (!run.done && !run.stopped) uv_run(&L, UV_RUN_ONCE);
    if (run.client) stop_client();
    uv_close((uv_handle_t *)&run.resume, NULL);
    /* the client frees itself once its handles closed and peers close after their writes or
     * at EOF: with the listener unreferenced the loop must drain (a hang is a leaked handle) */
    uv_unref((uv_handle_t *)&server);
    uv_run(&L, UV_RUN_DEFAULT);
    uv_ref((uv_handle_t *)&server);
    return 0;
}
