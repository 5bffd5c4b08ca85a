/* redis: see redis.h. */
#include "cluster/redis.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define PROBE_EVERY_MS 1000
#define CONNECT_TIMEOUT_MS 1000

struct mg_redis_s {
    uv_loop_t *loop;
    /* the parsed url: host + port, or a unix socket path */
    char host[256];
    int port;
    char unix_path[256];
    char password[256];
    int db;
    int timeout_ms;
    redisAsyncContext *ac; /* NULL: not connected */
    uint64_t connect_at;   /* loop ms the connection was begun */
    int connected;         /* the connect callback said OK */
    int up;                /* the state shown: connected and answering in time */
    int stopping;
    int backoff_ms;
    uv_timer_t reconnect_timer;
    uv_timer_t probe_timer;
    uv_getaddrinfo_t resolve;
    int resolving;
    int open_handles; /* timers not yet closed: r is freed at 0 after stop */
    void (*on_connect_fn)(void *ud);
    void *on_connect_ud;
    /* a listening client (mg_redis_subscribe): its channel ("" otherwise) and handler */
    char channel[160];
    mg_redis_msg_cb msg_cb;
    void *msg_ud;
    mg_redis_stats_t stats;
};

/* One command in flight. Two owners: hiredis' callback (always called once, with NULL on a
 * disconnect) and the deadline timer (closed when the command ends either way). */
typedef struct cmd_s {
    mg_redis_t *r;
    mg_redis_cb cb;
    void *ud;
    uv_timer_t deadline;
    int refs;
    int done; /* the caller has been told */
} cmd_t;

static void set_state(mg_redis_t *r, int up, const char *reason)
{
    if (r->up == up) return;
    r->up = up;
    mg_logline_t l;
    mg_log_begin(&l, up ? MG_LOG_INFO : MG_LOG_WARN,
                 up ? "cluster redis up" : "cluster redis degraded");
    mg_log_str(&l, "component", r->channel[0] ? "redis-pubsub" : "redis");
    mg_log_str(&l, "reason", reason);
    mg_log_end(&l);
}

/* redis://[:password@]host[:port][/db] or unix:/path. 0 or -1. */
static int parse_url(mg_redis_t *r, const char *url)
{
    r->port = 6379;
    if (strncmp(url, "unix:", 5) == 0) {
        snprintf(r->unix_path, sizeof(r->unix_path), "%s", url + 5);
        return r->unix_path[0] ? 0 : -1;
    }
    if (strncmp(url, "redis://", 8) != 0) return -1;
    const char *p = url + 8;
    const char *at = strrchr(p, '@');
    if (at) {
        const char *pw = memchr(p, ':', (size_t)(at - p));
        pw = pw ? pw + 1 : p;
        if ((size_t)(at - pw) >= sizeof(r->password)) return -1;
        memcpy(r->password, pw, (size_t)(at - pw));
        p = at + 1;
    }
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof(r->host)) return -1;
    memcpy(r->host, p, hl);
    p += hl;
    if (*p == ':') {
        r->port = atoi(p + 1);
        p += 1 + strspn(p + 1, "0123456789");
    }
    if (*p == '/') r->db = atoi(p + 1);
    return r->port > 0 && r->port < 65536 ? 0 : -1;
}

static void on_handle_closed(uv_handle_t *h)
{
    mg_redis_t *r = h->data;
    if (--r->open_handles == 0 && r->stopping) free(r);
}

static void on_reconnect(uv_timer_t *t);

/* the next try after backoff_ms, which doubles up to BACKOFF_MAX_MS */
static void schedule_reconnect(mg_redis_t *r)
{
    if (r->stopping) return;
    uv_timer_start(&r->reconnect_timer, on_reconnect, (uint64_t)r->backoff_ms, 0);
    r->backoff_ms = r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : r->backoff_ms * 2;
}

static void cmd_release(cmd_t *c)
{
    if (--c->refs == 0) free(c);
}

static void on_deadline_closed(uv_handle_t *h)
{
    cmd_release(h->data);
}

static void cmd_finish(cmd_t *c, redisReply *reply)
{
    if (c->done) return;
    c->done = 1;
    uv_timer_stop(&c->deadline);
    uv_close((uv_handle_t *)&c->deadline, on_deadline_closed);
    c->cb(c->ud, reply);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    cmd_t *c = priv;
    mg_redis_t *r = c->r;
    if (reply && !c->done) {
        r->stats.answered++;
        set_state(r, 1, "answered");
    }
    if (!reply && !c->done) r->stats.unavailable++;
    cmd_finish(c, reply);
    cmd_release(c);
}

static void on_deadline(uv_timer_t *t)
{
    cmd_t *c = t->data;
    c->r->stats.timed_out++;
    set_state(c->r, 0, "timeout");
    cmd_finish(c, NULL);
}

int mg_redis_command(mg_redis_t *r, mg_redis_cb cb, void *ud, int argc, const char **argv,
                     const size_t *lens)
{
    if (!r || !r->ac || !r->connected) {
        if (r) r->stats.unavailable++;
        return -1;
    }
    cmd_t *c = calloc(1, sizeof(*c));
    if (!c) return -1;
    c->r = r;
    c->cb = cb;
    c->ud = ud;
    c->refs = 2;
    if (redisAsyncCommandArgv(r->ac, on_reply, c, argc, argv, lens) != REDIS_OK) {
        free(c);
        r->stats.unavailable++;
        return -1;
    }
    r->stats.sent++;
    uv_timer_init(r->loop, &c->deadline);
    c->deadline.data = c;
    uv_timer_start(&c->deadline, on_deadline, (uint64_t)r->timeout_ms, 0);
    return 0;
}

/* the probe: a PING each second while connected */
static void on_probe_reply(void *ud, redisReply *reply)
{
    (void)ud, (void)reply;
}

/* A connection not made within CONNECT_TIMEOUT_MS (a host that drops the SYN would keep it
 * for minutes) is given up (freed: no callback runs) and tried anew. */
static void connect_overdue(mg_redis_t *r)
{
    if (!r->ac || r->connected || uv_now(r->loop) - r->connect_at < CONNECT_TIMEOUT_MS) return;
    redisAsyncContext *ac = r->ac;
    r->ac = NULL;
    redisAsyncFree(ac);
    set_state(r, 0, "cannot connect");
    schedule_reconnect(r);
}

static void on_probe(uv_timer_t *t)
{
    mg_redis_t *r = t->data;
    connect_overdue(r);
    if (r->channel[0]) return; /* a subscribed connection takes no PING of ours */
    const char *argv[] = {"PING"};
    size_t lens[] = {4};
    mg_redis_command(r, on_probe_reply, NULL, 1, argv, lens);
}

static void on_setup_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)ac, (void)priv; /* the log line has the node id (base/log) */
    redisReply *rep = reply;
    if (rep && rep->type == REDIS_REPLY_ERROR) {
        mg_logline_t l;
        mg_log_begin(&l, MG_LOG_WARN, "cluster redis refused the connection's setup");
        mg_log_end(&l);
    }
}

/* Each reply on the subscribed connection: the subscription's confirmation, then one
 * ["message", channel, payload] per message; NULL when the connection goes. */
static void on_sub_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)ac;
    mg_redis_t *r = priv;
    redisReply *rep = reply;
    if (!rep || r->stopping || rep->type != REDIS_REPLY_ARRAY || rep->elements < 3) return;
    const redisReply *kind = rep->element[0];
    if (kind->type != REDIS_REPLY_STRING) return;
    if (strcmp(kind->str, "subscribe") == 0) set_state(r, 1, "subscribed");
    else if (strcmp(kind->str, "message") == 0 && rep->element[2]->type == REDIS_REPLY_STRING)
        r->msg_cb(r->msg_ud, rep->element[2]->str, rep->element[2]->len);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    mg_redis_t *r = ac->data;
    if (status != REDIS_OK) { /* hiredis frees ac after this */
        r->ac = NULL;
        r->connected = 0;
        set_state(r, 0, "cannot connect");
        schedule_reconnect(r);
        return;
    }
    r->connected = 1;
    r->backoff_ms = BACKOFF_MIN_MS;
    redisAsyncContext *w = r->ac;
    if (r->password[0]) redisAsyncCommand(w, on_setup_reply, NULL, "AUTH %s", r->password);
    if (r->db) redisAsyncCommand(w, on_setup_reply, NULL, "SELECT %d", r->db);
    if (r->on_connect_fn) r->on_connect_fn(r->on_connect_ud);
    if (r->channel[0]) {
        redisAsyncCommand(w, on_sub_reply, r, "SUBSCRIBE %b", r->channel, strlen(r->channel));
        return;
    }
    on_probe(&r->probe_timer); /* up once it answers */
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    mg_redis_t *r = ac->data;
    r->ac = NULL;
    r->connected = 0;
    set_state(r, 0, "disconnected");
    schedule_reconnect(r);
}

/* ---- hiredis on libuv -------------------------------------------------------------------
 * Our own binding rather than hiredis' adapters/libuv.h: that one (0.14, Debian's) drops an
 * event whose poll reports an error, and libuv reports one, and stops polling, for a reset
 * connection or a refused connect; hiredis then never learns the connection is gone: every
 * command times out and no reconnect is ever made. Here an error is handed to hiredis as the
 * events it waits for: its read or write meets the error and ends the connection. */
typedef struct poller_s {
    redisAsyncContext *ac; /* NULL once hiredis let go (the handle is closing) */
    uv_poll_t poll;
    int events;
} poller_t;

static void on_poll(uv_poll_t *h, int status, int events)
{
    poller_t *p = h->data;
    if (status < 0) events = p->events;
    if (p->ac && (events & UV_READABLE)) redisAsyncHandleRead(p->ac);
    if (p->ac && (events & UV_WRITABLE)) redisAsyncHandleWrite(p->ac); /* may have ended it */
}

static void poll_set(poller_t *p, int events)
{
    p->events = events;
    if (events) uv_poll_start(&p->poll, events, on_poll);
    else uv_poll_stop(&p->poll);
}

static void ev_add_read(void *d)
{
    poller_t *p = d;
    poll_set(p, p->events | UV_READABLE);
}

static void ev_del_read(void *d)
{
    poller_t *p = d;
    poll_set(p, p->events & ~UV_READABLE);
}

static void ev_add_write(void *d)
{
    poller_t *p = d;
    poll_set(p, p->events | UV_WRITABLE);
}

static void ev_del_write(void *d)
{
    poller_t *p = d;
    poll_set(p, p->events & ~UV_WRITABLE);
}

static void on_poll_closed(uv_handle_t *h)
{
    free(h->data);
}

static void ev_cleanup(void *d)
{
    poller_t *p = d;
    p->ac = NULL;
    uv_close((uv_handle_t *)&p->poll, on_poll_closed);
}

/* 0, or -1 (out of memory, or the socket cannot be polled). */
static int attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    poller_t *p = calloc(1, sizeof(*p));
    if (!p) return -1;
    if (uv_poll_init(loop, &p->poll, ac->c.fd) != 0) {
        free(p);
        return -1;
    }
    p->ac = ac;
    p->poll.data = p;
    ac->ev.data = p;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    return 0;
}

static void connect_to(mg_redis_t *r, const char *ip)
{
    redisAsyncContext *ac =
        r->unix_path[0] ? redisAsyncConnectUnix(r->unix_path) : redisAsyncConnect(ip, r->port);
    if (!ac || ac->err) {
        if (ac) redisAsyncFree(ac);
        set_state(r, 0, "cannot connect");
        schedule_reconnect(r);
        return;
    }
    if (attach(ac, r->loop) != 0) {
        redisAsyncFree(ac);
        set_state(r, 0, "cannot connect");
        schedule_reconnect(r);
        return;
    }
    ac->data = r;
    r->ac = ac;
    r->connect_at = uv_now(r->loop);
    r->stats.reconnects++;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
}

/* the host name is resolved off the loop (uv_getaddrinfo): hiredis' own would block */
static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    mg_redis_t *r = req->data;
    r->resolving = 0;
    r->open_handles--; /* the request no longer holds r (it did not let go before: never freed) */
    char ip[64] = "";
    if (status == 0 && res) {
        if (res->ai_family == AF_INET6)
            uv_ip6_name((struct sockaddr_in6 *)res->ai_addr, ip, sizeof(ip));
        else uv_ip4_name((struct sockaddr_in *)res->ai_addr, ip, sizeof(ip));
    }
    if (res) uv_freeaddrinfo(res);
    if (r->stopping) {
        if (r->open_handles == 0) free(r);
        return;
    }
    if (!ip[0]) {
        set_state(r, 0, "cannot resolve the host");
        schedule_reconnect(r);
        return;
    }
    connect_to(r, ip);
}

static void start_connect(mg_redis_t *r)
{
    if (r->stopping || r->ac || r->resolving) return;
    if (r->unix_path[0]) {
        connect_to(r, NULL);
        return;
    }
    struct addrinfo hints = {0};
    hints.ai_socktype = SOCK_STREAM;
    r->resolve.data = r;
    r->resolving = 1;
    r->open_handles++; /* the request holds r */
    char port[16];
    snprintf(port, sizeof(port), "%d", r->port);
    if (uv_getaddrinfo(r->loop, &r->resolve, on_resolved, r->host, port, &hints) != 0) {
        r->resolving = 0;
        r->open_handles--;
        schedule_reconnect(r);
    }
}

static void on_reconnect(uv_timer_t *t)
{
    start_connect(t->data);
}

mg_redis_t *mg_redis_start(uv_loop_t *loop, const mg_cluster_conf_t *c)
{
    if (!c->redis.url) return NULL;
    mg_redis_t *r = calloc(1, sizeof(*r));
    if (!r) return NULL;
    r->loop = loop;
    r->timeout_ms = c->redis.timeout_ms > 0 ? c->redis.timeout_ms : 50;
    r->backoff_ms = BACKOFF_MIN_MS;
    if (parse_url(r, c->redis.url) != 0) { /* the loader checked it; never print it */
        free(r);
        return NULL;
    }
    uv_timer_init(loop, &r->reconnect_timer);
    uv_timer_init(loop, &r->probe_timer);
    r->reconnect_timer.data = r->probe_timer.data = r;
    r->open_handles = 2;
    uv_timer_start(&r->probe_timer, on_probe, PROBE_EVERY_MS, PROBE_EVERY_MS);
    start_connect(r);
    return r;
}

mg_redis_t *mg_redis_subscribe(uv_loop_t *loop, const mg_cluster_conf_t *c, const char *channel,
                               mg_redis_msg_cb cb, void *ud)
{
    if (!c->redis.url || !channel || !channel[0] || strlen(channel) >= 160) return NULL;
    mg_redis_t *r = mg_redis_start(loop, c);
    if (!r) return NULL;
    /* set before the connection is made: mg_redis_start only began resolving */
    snprintf(r->channel, sizeof(r->channel), "%s", channel);
    r->msg_cb = cb;
    r->msg_ud = ud;
    return r;
}

void mg_redis_stop(mg_redis_t *r)
{
    if (!r) return;
    r->stopping = 1;
    if (r->ac) redisAsyncFree(r->ac); /* callbacks get NULL: "unavailable" */
    r->ac = NULL;
    if (r->resolving) uv_cancel((uv_req_t *)&r->resolve);
    uv_timer_stop(&r->reconnect_timer);
    uv_timer_stop(&r->probe_timer);
    uv_close((uv_handle_t *)&r->reconnect_timer, on_handle_closed);
    uv_close((uv_handle_t *)&r->probe_timer, on_handle_closed);
}

void mg_redis_on_connect(mg_redis_t *r, void (*fn)(void *ud), void *ud)
{
    if (!r) return;
    r->on_connect_fn = fn;
    r->on_connect_ud = ud;
}

int mg_redis_up(const mg_redis_t *r)
{
    return r && r->up;
}

const char *mg_redis_state_name(const mg_redis_t *r)
{
    return !r ? "off" : r->up ? "up" : "degraded";
}

void mg_redis_stats(const mg_redis_t *r, mg_redis_stats_t *out)
{
    if (r) *out = r->stats;
    else memset(out, 0, sizeof(*out));
}
