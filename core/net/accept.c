/* accept: a listening socket polled by the loop, accept(2) in batches, a pause instead of
 * a spin when accepting fails, and a rate-limited report of failures and refusals; see
 * accept.h.
 *
 * Why our own accept loop: libuv's (uv_listen) meets EMFILE by closing its reserved
 * descriptor, accepting and closing every waiting connection, and telling the callback
 * nothing; when the reserve is gone it calls back with the error in a loop. Here a failure
 * is counted, said, and answered with a short pause, after which the waiting clients are
 * accepted (or refused with an answer) by the owner. */
#include "net/accept.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"

#define ACCEPT_BATCH 64     /* connections taken per wake-up: reads get their turn too */
#define ACCEPT_PAUSE_MS 100 /* after an accept failure, try again this much later */
#define REPORT_MS 5000      /* at most one line per kind of trouble per window */
#define BACKLOG 4096

static int parse_addr(const char *addr, struct sockaddr_storage *ss)
{
    char host[128];
    const char *colon = strrchr(addr, ':');
    if (!colon) return UV_EINVAL;
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof(host)) return UV_EINVAL;
    memcpy(host, addr, hl);
    host[hl] = '\0';
    int port = atoi(colon + 1);
    if (host[0] == '[') {
        size_t n = strlen(host);
        if (n < 2 || host[n - 1] != ']') return UV_EINVAL;
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
        return uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss);
    }
    if (hl == 0 || strcmp(host, "*") == 0) strcpy(host, "0.0.0.0");
    if (strcmp(host, "localhost") == 0) strcpy(host, "127.0.0.1");
    return uv_ip4_addr(host, port, (struct sockaddr_in *)ss);
}

/* A bound, listening, non-blocking socket into *out; 0 or a negative libuv error. */
static int listen_socket(const struct sockaddr_storage *ss, int *out)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return uv_translate_sys_error(errno);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); /* as uv_tcp_bind does */
    socklen_t len =
        ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, BACKLOG) != 0) {
        int err = uv_translate_sys_error(errno);
        close(fd);
        return err;
    }
    *out = fd;
    return 0;
}

static void bound_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    char ip[46] = "";
    out[0] = '\0';
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return;
    if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "[%s]:%d", ip, ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
        snprintf(out, cap, "%s:%d", ip, ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
}

/* ------------------------------------------------------------------------ */
/* Reporting                                                                 */
/* ------------------------------------------------------------------------ */

/* One line per kind of trouble seen since the last report. */
static void report_log(mg_acceptor_t *a)
{
    mg_logline_t l;
    if (a->errors_unlogged) {
        char what[96];
        snprintf(what, sizeof(what), "%s", strerror(a->last_errno));
        mg_log_begin(&l, MG_LOG_ERROR, "accept_failed");
        mg_log_str(&l, "listener", a->name);
        mg_log_str(&l, "error",
                   a->last_errno == EMFILE   ? "EMFILE"
                   : a->last_errno == ENFILE ? "ENFILE"
                                             : "other");
        mg_log_str(&l, "detail", what);
        mg_log_int(&l, "failures", (int64_t)a->errors_unlogged);
        mg_log_int(&l, "paused_ms", ACCEPT_PAUSE_MS);
        mg_log_end(&l);
        a->errors_unlogged = 0;
    }
    if (a->refused_unlogged) {
        mg_log_begin(&l, MG_LOG_WARN, "connections_refused");
        mg_log_str(&l, "listener", a->name);
        mg_log_int(&l, "refused", (int64_t)a->refused_unlogged);
        mg_log_int(&l, "max_connections", (int64_t)a->max_connections);
        mg_log_end(&l);
        a->refused_unlogged = 0;
    }
}

static void on_report(uv_timer_t *t)
{
    mg_acceptor_t *a = t->data;
    if (!a->errors_unlogged && !a->refused_unlogged) return; /* a quiet window ends it */
    report_log(a);
    uv_timer_start(&a->report, on_report, REPORT_MS, 0);
}

/* Something to say: at once when the last window is over, else at its end (with the count). */
static void report_soon(mg_acceptor_t *a)
{
    if (!a->open || uv_is_active((uv_handle_t *)&a->report)) return;
    report_log(a);
    uv_timer_start(&a->report, on_report, REPORT_MS, 0);
}

void mg_acceptor_refused(mg_acceptor_t *a)
{
    if (a->stats) a->stats->refused++;
    a->refused_unlogged++;
    report_soon(a);
}

/* ------------------------------------------------------------------------ */
/* Accepting                                                                 */
/* ------------------------------------------------------------------------ */

static void on_acceptable(uv_poll_t *p, int status, int events);

static void on_resume(uv_timer_t *t)
{
    mg_acceptor_t *a = t->data;
    if (a->open) uv_poll_start(&a->poll, UV_READABLE, on_acceptable);
}

static void accept_failed(mg_acceptor_t *a, int err)
{
    mg_accept_err_t kind = err == EMFILE   ? MG_ACCEPT_EMFILE
                           : err == ENFILE ? MG_ACCEPT_ENFILE
                                           : MG_ACCEPT_OTHER;
    if (a->stats) a->stats->accept_errors[kind]++;
    a->errors_unlogged++;
    a->last_errno = err;
    report_soon(a);
    uv_poll_stop(&a->poll);
    uv_timer_start(&a->resume, on_resume, ACCEPT_PAUSE_MS, 0);
}

static void on_acceptable(uv_poll_t *p, int status, int events)
{
    mg_acceptor_t *a = p->data;
    for (int i = 0; i < ACCEPT_BATCH && a->open; i++) {
        int fd = accept4(a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            a->fn(a->ud, fd); /* may close the acceptor (a->open then says so) */
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) accept_failed(a, errno);
        return;
    }
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

int mg_acceptor_open(mg_acceptor_t *a, uv_loop_t *loop, const char *addr, const char *name,
                     mg_conn_stats_t *stats, mg_accept_fn fn, void *ud)
{
    memset(a, 0, sizeof(*a));
    a->fd = -1;
    a->name = name;
    a->stats = stats;
    a->fn = fn;
    a->ud = ud;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    int rc = parse_addr(addr, &ss);
    if (rc == 0) rc = listen_socket(&ss, &a->fd);
    if (rc == 0) rc = uv_poll_init_socket(loop, &a->poll, a->fd);
    if (rc != 0) {
        if (a->fd >= 0) close(a->fd);
        a->fd = -1;
        return rc;
    }
    uv_timer_init(loop, &a->resume);
    uv_timer_init(loop, &a->report);
    a->poll.data = a->resume.data = a->report.data = a;
    a->open = 1;
    bound_name(a->fd, a->bound, sizeof(a->bound));
    rc = uv_poll_start(&a->poll, UV_READABLE, on_acceptable);
    if (rc != 0) mg_acceptor_close(a);
    return rc;
}

void mg_acceptor_close(mg_acceptor_t *a)
{
    if (!a->open) return;
    a->open = 0;
    if (a->errors_unlogged || a->refused_unlogged) report_log(a);
    uv_close((uv_handle_t *)&a->poll, NULL);
    uv_close((uv_handle_t *)&a->resume, NULL);
    uv_close((uv_handle_t *)&a->report, NULL);
    close(a->fd); /* safe right after uv_close of its poll handle (libuv's uv_poll docs) */
    a->fd = -1;
}
