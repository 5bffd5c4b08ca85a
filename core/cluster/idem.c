/* cluster idem: see idem.h. */
#include "cluster/idem.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/log.h"

#define KEY_MAX 240

struct mg_cidem_s {
    mg_redis_t *r; /* borrowed */
    char prefix[80];
    char claim[80]; /* "P\n<node id>": this instance's claim value */
    size_t claim_len;
    mg_cidem_stats_t stats;
};

typedef struct op_s {
    mg_cidem_t *x;
    int peek;
    mg_cidem_cb cb;
    void *ud;
} op_t;

static int64_t wall_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

mg_cidem_t *mg_cidem_new(mg_redis_t *r, const char *prefix, const char *node_id)
{
    if (!r) return NULL;
    mg_cidem_t *x = calloc(1, sizeof(*x));
    if (!x) return NULL;
    x->r = r;
    snprintf(x->prefix, sizeof(x->prefix), "%s", prefix ? prefix : "moongate:");
    int n = snprintf(x->claim, sizeof(x->claim), "P\n%.63s", node_id ? node_id : "");
    x->claim_len = n > 0 ? (size_t)n : 0;
    return x;
}

void mg_cidem_free(mg_cidem_t *x)
{
    free(x);
}

int mg_cidem_up(const mg_cidem_t *x)
{
    return x && mg_redis_up(x->r);
}

/* "P\n<node>" or "D\n<status>\n<stream>\n<expires>\n<body>" */
int mg_cidem_parse(const char *v, size_t len, mg_cidem_answer_t *a)
{
    if (len < 2 || v[1] != '\n') return -1;
    if (v[0] == 'P') {
        size_t n = len - 2 < sizeof(a->node) - 1 ? len - 2 : sizeof(a->node) - 1;
        memcpy(a->node, v + 2, n);
        a->node[n] = '\0';
        a->rc = MG_CIDEM_RUNNING;
        return 0;
    }
    if (v[0] != 'D') return -1;
    const char *p = v + 2, *end = v + len;
    long long f[3];
    for (int i = 0; i < 3; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || nl == p) return -1;
        char num[24];
        if ((size_t)(nl - p) >= sizeof(num)) return -1;
        memcpy(num, p, (size_t)(nl - p));
        num[nl - p] = '\0';
        char *e;
        f[i] = strtoll(num, &e, 10);
        if (*e) return -1;
        p = nl + 1;
    }
    if (f[0] < 100 || f[0] > 599) return -1;
    a->rc = MG_CIDEM_DONE;
    a->status = (int)f[0];
    a->stream = f[1] != 0;
    a->expires_ms = f[2];
    a->body = p;
    a->len = (size_t)(end - p);
    return 0;
}

static void key_of(const mg_cidem_t *x, const char *id, char out[KEY_MAX])
{
    snprintf(out, KEY_MAX, "%sidem:%s", x->prefix, id);
}

static void on_reply(void *ud, redisReply *reply)
{
    op_t *op = ud;
    mg_cidem_t *x = op->x;
    mg_cidem_answer_t a;
    memset(&a, 0, sizeof(a));
    a.rc = MG_CIDEM_UNAVAILABLE;
    if (reply && reply->type == REDIS_REPLY_NIL) {
        a.rc = op->peek ? MG_CIDEM_GONE : MG_CIDEM_OWNED;
    } else if (reply && reply->type == REDIS_REPLY_STRING) {
        if (mg_cidem_parse(reply->str, reply->len, &a) != 0) a.rc = MG_CIDEM_UNAVAILABLE;
    } else if (reply && reply->type == REDIS_REPLY_ERROR) {
        mg_log_msg(MG_LOG_WARN, NULL, "cluster redis: an idempotency claim failed: %.200s",
                   reply->str);
    }
    if (a.rc == MG_CIDEM_OWNED) x->stats.claimed++;
    else if (a.rc == MG_CIDEM_RUNNING && !op->peek) x->stats.twins++;
    else if (a.rc == MG_CIDEM_DONE) x->stats.replayed++;
    else if (a.rc == MG_CIDEM_UNAVAILABLE) x->stats.unavailable++;
    mg_cidem_cb cb = op->cb;
    void *cud = op->ud;
    free(op);
    cb(cud, &a);
}

static int send_op(mg_cidem_t *x, int peek, int argc, const char **argv, const size_t *lens,
                   mg_cidem_cb cb, void *ud)
{
    op_t *op = calloc(1, sizeof(*op));
    if (!op) return -1;
    op->x = x;
    op->peek = peek;
    op->cb = cb;
    op->ud = ud;
    if (mg_redis_command(x->r, on_reply, op, argc, argv, lens) != 0) {
        free(op);
        x->stats.unavailable++;
        return -1;
    }
    return 0;
}

int mg_cidem_claim(mg_cidem_t *x, const char *id, uint64_t claim_ttl_ms, mg_cidem_cb cb, void *ud)
{
    if (!x) return -1;
    char key[KEY_MAX], ttl[24];
    key_of(x, id, key);
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)(claim_ttl_ms ? claim_ttl_ms : 1));
    /* NX with GET (Redis 7): set when absent, else the value there comes back unchanged */
    const char *argv[7] = {"SET", key, x->claim, "NX", "PX", ttl, "GET"};
    size_t lens[7] = {3, strlen(key), x->claim_len, 2, 2, strlen(ttl), 3};
    return send_op(x, 0, 7, argv, lens, cb, ud);
}

int mg_cidem_peek(mg_cidem_t *x, const char *id, mg_cidem_cb cb, void *ud)
{
    if (!x) return -1;
    char key[KEY_MAX];
    key_of(x, id, key);
    const char *argv[2] = {"GET", key};
    size_t lens[2] = {3, strlen(key)};
    return send_op(x, 1, 2, argv, lens, cb, ud);
}

static void on_put(void *ud, redisReply *reply)
{
    mg_cidem_t *x = ud;
    if (reply && reply->type == REDIS_REPLY_STATUS) x->stats.stored++;
}

void mg_cidem_put(mg_cidem_t *x, const char *id, int status, int stream, const char *body,
                  size_t len, int64_t expires_ms)
{
    int64_t ttl = expires_ms - wall_ms();
    if (!x || ttl <= 0) return;
    char head[80];
    int hn = snprintf(head, sizeof(head), "D\n%d\n%d\n%lld\n", status, stream ? 1 : 0,
                      (long long)expires_ms);
    char *v = malloc((size_t)hn + len);
    if (!v) return;
    memcpy(v, head, (size_t)hn);
    if (len) memcpy(v + hn, body, len);
    char key[KEY_MAX], px[24];
    key_of(x, id, key);
    snprintf(px, sizeof(px), "%lld", (long long)ttl);
    const char *argv[5] = {"SET", key, v, "PX", px};
    size_t lens[5] = {3, strlen(key), (size_t)hn + len, 2, strlen(px)};
    mg_redis_command(x->r, on_put, x, 5, argv, lens); /* hiredis copied the command */
    free(v);
}

static void no_answer(void *ud, redisReply *reply)
{
    (void)ud, (void)reply;
}

void mg_cidem_drop(mg_cidem_t *x, const char *id)
{
    static const char DROP_LUA[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                   "return redis.call('DEL', KEYS[1]) end return 0";
    if (!x) return;
    char key[KEY_MAX];
    key_of(x, id, key);
    const char *argv[5] = {"EVAL", DROP_LUA, "1", key, x->claim};
    size_t lens[5] = {4, sizeof(DROP_LUA) - 1, 1, strlen(key), x->claim_len};
    mg_redis_command(x->r, no_answer, NULL, 5, argv, lens);
}

void mg_cidem_note_conflict(mg_cidem_t *x)
{
    if (x) x->stats.conflicts++;
}

void mg_cidem_stats(const mg_cidem_t *x, mg_cidem_stats_t *out)
{
    if (x) *out = x->stats;
    else memset(out, 0, sizeof(*out));
}
