/* Unit tests for core/net/accept.c and core/net/fdlimit.c: a real acceptor on 127.0.0.1:0.
 *
 * Out of descriptors: clients connect first (the kernel completes their handshakes into the
 * backlog), then the soft RLIMIT_NOFILE is lowered to what is open, so that accept(2) fails
 * with EMFILE. The failure must be counted, accepting must pause (a handful of failures over
 * a third of a second, not a spinning loop), and once the limit is back every waiting
 * client must be accepted. */
#include "net/accept.h"
#include "net/fdlimit.h"
#include "mgtest.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define N_CLIENTS 5

typedef struct {
    uv_loop_t loop;
    mg_acceptor_t a;
    mg_conn_stats_t stats;
    uv_timer_t restore, guard;
    struct rlimit saved;
    int accepted;
    int clients[N_CLIENTS];
} env_t;

static env_t E;

static void on_fd(void *ud, int fd)
{
    E.accepted++;
    close(fd);
    if (E.accepted == N_CLIENTS) {
        mg_acceptor_close(&E.a);
        uv_close((uv_handle_t *)&E.guard, NULL);
    }
}

static void on_restore(uv_timer_t *t)
{
    setrlimit(RLIMIT_NOFILE, &E.saved);
    uv_close((uv_handle_t *)t, NULL);
}

static void on_guard(uv_timer_t *t)
{
    mg_acceptor_close(&E.a);
    uv_close((uv_handle_t *)t, NULL);
}

/* The lowest free descriptor number: the next one the process would get. */
static int lowest_free_fd(void)
{
    int fd = dup(0);
    if (fd >= 0) close(fd);
    return fd;
}

static void test_emfile_pauses_then_accepts(void)
{
    memset(&E, 0, sizeof(E));
    CHECK_EQ_INT(uv_loop_init(&E.loop), 0);
    CHECK_EQ_INT(mg_acceptor_open(&E.a, &E.loop, "127.0.0.1:0", "test", &E.stats, on_fd, NULL), 0);
    int port = atoi(strrchr(E.a.bound, ':') + 1);
    CHECK(port > 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < N_CLIENTS; i++) {
        E.clients[i] = socket(AF_INET, SOCK_STREAM, 0);
        CHECK_EQ_INT(connect(E.clients[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
    }
    uv_timer_init(&E.loop, &E.restore);
    uv_timer_init(&E.loop, &E.guard);
    uv_timer_start(&E.restore, on_restore, 350, 0);
    uv_timer_start(&E.guard, on_guard, 5000, 0);
    /* from here on no new descriptor can be had: accept fails with EMFILE */
    getrlimit(RLIMIT_NOFILE, &E.saved);
    struct rlimit low = E.saved;
    low.rlim_cur = (rlim_t)lowest_free_fd();
    CHECK_EQ_INT(setrlimit(RLIMIT_NOFILE, &low), 0);
    uv_run(&E.loop, UV_RUN_DEFAULT);
    setrlimit(RLIMIT_NOFILE, &E.saved);
    CHECK_EQ_INT(E.accepted, N_CLIENTS);
    uint64_t fails = E.stats.accept_errors[MG_ACCEPT_EMFILE];
    if (fails < 1 || fails > 10)
        fprintf(stderr, "  EMFILE failures: %llu\n", (unsigned long long)fails);
    CHECK(fails >= 1);
    CHECK(fails <= 10); /* a pause of 100 ms per failure over 350 ms; a spin counts thousands */
    CHECK_EQ_INT(E.stats.accept_errors[MG_ACCEPT_OTHER], 0);
    for (int i = 0; i < N_CLIENTS; i++) close(E.clients[i]);
    CHECK_EQ_INT(uv_loop_close(&E.loop), 0);
}

static void test_refusals_counted(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_acceptor_t a;
    mg_conn_stats_t st;
    memset(&st, 0, sizeof(st));
    CHECK_EQ_INT(mg_acceptor_open(&a, &loop, "127.0.0.1:0", "test", &st, on_fd, NULL), 0);
    mg_acceptor_refused(&a);
    mg_acceptor_refused(&a);
    CHECK_EQ_INT(st.refused, 2);
    CHECK_EQ_INT(a.refused_unlogged, 1); /* the first was said at once, the second waits */
    mg_acceptor_close(&a);
    mg_acceptor_close(&a); /* idempotent */
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
    /* bad addresses fail without leaving anything open */
    CHECK(mg_acceptor_open(&a, &loop, "no-port", "test", NULL, on_fd, NULL) < 0);
    CHECK(mg_acceptor_open(&a, &loop, "[::1:80", "test", NULL, on_fd, NULL) < 0);
}

static void test_fit(void)
{
    /* 128 descriptors, 17 open, reserve 16 (twice), 16 refusals, margin 32: (128-97)/2 */
    CHECK_EQ_INT(mg_fdlimit_fit(128, 17, 16, 16), 15);
    CHECK_EQ_INT(mg_fdlimit_fit(64, 17, 16, 16), 1); /* nothing left: still one */
    CHECK_EQ_INT(mg_fdlimit_fit(1048576, 20, 16, 16), (1048576 - 20 - 32 - 32 - 16) / 2);
}

int main(void)
{
    MG_RUN(test_fit);
    MG_RUN(test_refusals_counted);
    MG_RUN(test_emfile_pauses_then_accepts);
    return mg_test_summary();
}
