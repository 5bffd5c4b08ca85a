/* redis: the cluster's one Redis connection, hiredis' async API on the libuv loop (issue 24).
 * Nothing here waits: a command is sent and its reply comes back through a callback, or, when
 * Redis has not answered within cluster.redis.timeout_ms, the callback is told "unavailable"
 * and the caller goes on per its degraded mode. The connection comes back by itself (backoff
 * 100 ms doubling to 5 s); a PING each second keeps the state (up / degraded) honest while no
 * request runs. Each change of state is logged once; the url is never logged (it may hold a
 * password). */
#ifndef MG_CLUSTER_REDIS_H
#define MG_CLUSTER_REDIS_H

#include <stddef.h>
#include <uv.h>

#include "conf/cluster.h"

typedef struct mg_redis_s mg_redis_t;
struct redisReply;

/* reply: the reply (owned by hiredis, valid during the call), or NULL: unavailable (not
 * connected, timed out, or disconnected before answering). */
typedef void (*mg_redis_cb)(void *ud, struct redisReply *reply);

/* A client for c (NULL when c has no Redis url). It starts connecting at once. */
mg_redis_t *mg_redis_start(uv_loop_t *loop, const mg_cluster_conf_t *c);
/* A client that only listens (its own connection: a subscribed one runs no commands): on
 * every connection it subscribes to `channel`, and each message's payload (valid during the
 * call) goes to cb. It reconnects like the other; it sends no probes and takes no commands.
 * NULL when c has no Redis url. Stopped with mg_redis_stop. */
typedef void (*mg_redis_msg_cb)(void *ud, const char *payload, size_t len);
mg_redis_t *mg_redis_subscribe(uv_loop_t *loop, const mg_cluster_conf_t *c, const char *channel,
                               mg_redis_msg_cb cb, void *ud);
/* Closes the connection; pending callbacks are told "unavailable". NULL is fine. */
void mg_redis_stop(mg_redis_t *r);
/* 1 when connected and the last command or probe was answered in time. */
int mg_redis_up(const mg_redis_t *r);
/* "off" (r NULL), "up" or "degraded". */
const char *mg_redis_state_name(const mg_redis_t *r);
/* Sends argv; cb is called exactly once, later (never from inside this call).
 * -1 (cb never called): unavailable now (not connected). */
int mg_redis_command(mg_redis_t *r, mg_redis_cb cb, void *ud, int argc, const char **argv,
                     const size_t *lens);
/* fn(ud) runs each time a connection is made, after its AUTH / SELECT and before anything
 * else is sent on it (the shared limits load their scripts there). One hook. */
void mg_redis_on_connect(mg_redis_t *r, void (*fn)(void *ud), void *ud);
/* Counters for /status and bench. */
typedef struct mg_redis_stats_s {
    unsigned long long sent, answered, timed_out, unavailable, reconnects;
} mg_redis_stats_t;
void mg_redis_stats(const mg_redis_t *r, mg_redis_stats_t *out);

#endif
