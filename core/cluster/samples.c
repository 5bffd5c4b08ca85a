/* cluster samples: see samples.h. */
#include "cluster/samples.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "base/json.h"
#include "base/log.h"

#define TICK_MS 200
#define READ_COUNT 256
#define STREAM_MAXLEN "10000"
#define STREAM_TTL_S "300"

struct mg_csamples_s {
    uv_loop_t *loop;
    mg_redis_t *r;
    char key[96];
    char node[160];
    char run[17];
    mg_csamples_feed_fn feed;
    void *feed_ud;
    uv_timer_t tick;
    mg_csamples_batch_t batch;
    mg_buf_t body;   /* reused by every flush */
    char cursor[64]; /* the last entry id read ("<ms>-<seq>") */
    int replaying;   /* until a read comes back short */
    int reading;     /* an XREAD is in flight */
    int sharing;     /* the state last logged: 1 shared, 0 local only */
    int stopping;
    uint64_t replay_t0; /* loop ms the replay began (for its log line) */
    mg_csamples_stats_t stats;
};

/* ------------------------------------------------------------------------ */
/* The entry's body                                                          */

int mg_csamples_name_ok(const char *s)
{
    return s && !strpbrk(s, "\t\n\r");
}

void mg_csamples_batch_clear(mg_csamples_batch_t *b)
{
    for (int i = 0; i < b->n_routes; i++) {
        free(b->provider[i]);
        free(b->model[i]);
        b->provider[i] = b->model[i] = NULL;
    }
    b->n_routes = 0;
    b->n = 0;
}

/* The index of route (provider, model) in b, added when new; -1 when full or out of memory. */
static int batch_route(mg_csamples_batch_t *b, const char *provider, const char *model)
{
    for (int i = b->n_routes - 1; i >= 0; i--) /* the latest first: runs of one route */
        if (strcmp(b->provider[i], provider) == 0 && strcmp(b->model[i], model) == 0) return i;
    if (b->n_routes >= MG_CSAMPLES_MAX_ROUTES) return -1;
    char *p = strdup(provider), *m = strdup(model);
    if (!p || !m) {
        free(p);
        free(m);
        return -1;
    }
    b->provider[b->n_routes] = p;
    b->model[b->n_routes] = m;
    return b->n_routes++;
}

static int32_t clamp_ms(int32_t v)
{
    return v < 0 ? -1 : v;
}

int mg_csamples_batch_add(mg_csamples_batch_t *b, const mg_csample_t *s)
{
    const char *model = s->model ? s->model : "";
    if (b->n >= MG_CSAMPLES_MAX_BATCH || !s->provider || !s->provider[0] ||
        !mg_csamples_name_ok(s->provider) || !mg_csamples_name_ok(model))
        return -1;
    int r = batch_route(b, s->provider, model);
    if (r < 0) return -1;
    /* times never go backwards in a batch: the body stores them after the first */
    uint64_t at = b->n && s->at_ms < b->s[b->n - 1].at_ms ? b->s[b->n - 1].at_ms : s->at_ms;
    b->s[b->n].route = (uint16_t)r;
    b->s[b->n].ok = s->ok != 0;
    b->s[b->n].ttft_ms = clamp_ms(s->ttft_ms);
    b->s[b->n].latency_ms = clamp_ms(s->latency_ms);
    b->s[b->n].at_ms = at;
    b->n++;
    return 0;
}

int mg_csamples_encode(const mg_csamples_batch_t *b, mg_buf_t *out)
{
    uint64_t base = b->n ? b->s[0].at_ms : 0;
    char line[160];
    int n = snprintf(line, sizeof(line), "h1 %" PRIu64 " %d %d\n", base, b->n_routes, b->n);
    if (mg_buf_append(out, line, (size_t)n) != 0) return -1;
    for (int i = 0; i < b->n_routes; i++)
        if (mg_buf_append_str(out, b->provider[i]) != 0 || mg_buf_append(out, "\t", 1) != 0 ||
            mg_buf_append_str(out, b->model[i]) != 0 || mg_buf_append(out, "\n", 1) != 0)
            return -1;
    for (int i = 0; i < b->n; i++) {
        n = snprintf(line, sizeof(line), "%u %u %" PRId32 " %" PRId32 " %" PRIu64 "\n",
                     (unsigned)b->s[i].route, (unsigned)b->s[i].ok, b->s[i].ttft_ms,
                     b->s[i].latency_ms, b->s[i].at_ms - base);
        if (mg_buf_append(out, line, (size_t)n) != 0) return -1;
    }
    return 0;
}

/* The next space- or newline-ended integer at *p within [lo, hi]; 0 or -1. */
static int read_int(char **p, char end, long long lo, long long hi, long long *v)
{
    char *e;
    if (**p == ' ' || **p == '\n' || **p == '\0') return -1;
    long long x = strtoll(*p, &e, 10);
    if (e == *p || *e != end || x < lo || x > hi) return -1;
    *v = x;
    *p = e + 1;
    return 0;
}

/* The routes' lines at *p: on the first pass (cut) each "provider\tmodel\n" is checked and
 * cut into two strings in place; on the second they are read as the strings they now are. */
static int read_routes(char **pp, long long nr, int cut, const char **prov, const char **model)
{
    char *p = *pp;
    for (long long i = 0; i < nr; i++) {
        char *tab, *nl;
        if (cut) {
            tab = strchr(p, '\t');
            nl = tab ? strchr(tab + 1, '\n') : NULL;
            if (!tab || !nl || tab == p || memchr(p, '\n', (size_t)(tab - p))) return -1;
            *tab = *nl = '\0';
        } else {
            tab = p + strlen(p);
            nl = tab + 1 + strlen(tab + 1);
        }
        prov[i] = p;
        model[i] = tab + 1;
        p = nl + 1;
    }
    *pp = p;
    return 0;
}

/* One pass over body (NUL-ended, the names cut into strings on the first pass); fn NULL:
 * check only. The number of samples or -1. */
static int decode_pass(char *body, size_t len, mg_csamples_each_fn fn, void *ud, int cut)
{
    char *p = body, *end = body + len;
    if (strncmp(p, "h1 ", 3) != 0) return -1;
    p += 3;
    long long base, nr, ns;
    if (read_int(&p, ' ', 0, INT64_MAX, &base) ||
        read_int(&p, ' ', 0, MG_CSAMPLES_MAX_ROUTES, &nr) || read_int(&p, '\n', 0, 1 << 20, &ns))
        return -1;
    const char *prov[MG_CSAMPLES_MAX_ROUTES], *model[MG_CSAMPLES_MAX_ROUTES];
    if (read_routes(&p, nr, cut, prov, model) != 0 || p > end) return -1;
    for (long long i = 0; i < ns; i++) {
        long long r, ok, ttft, lat, dt;
        if (read_int(&p, ' ', 0, nr - 1, &r) || read_int(&p, ' ', 0, 1, &ok) ||
            read_int(&p, ' ', -1, INT32_MAX, &ttft) || read_int(&p, ' ', -1, INT32_MAX, &lat) ||
            read_int(&p, '\n', 0, INT64_MAX - base, &dt))
            return -1;
        if (!fn) continue;
        mg_csample_t s = {.provider = prov[r],
                          .model = model[r],
                          .ok = (int)ok,
                          .ttft_ms = (int32_t)ttft,
                          .latency_ms = (int32_t)lat,
                          .at_ms = (uint64_t)(base + dt)};
        fn(ud, &s);
    }
    return p == end ? (int)ns : -1;
}

int mg_csamples_decode(const char *body, size_t len, mg_csamples_each_fn fn, void *ud)
{
    if (len == 0 || memchr(body, '\0', len)) return -1;
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, body, len);
    copy[len] = '\0';
    int n = decode_pass(copy, len, NULL, NULL, 1); /* all checked before anything is fed */
    if (n >= 0 && fn) n = decode_pass(copy, len, fn, ud, 0);
    free(copy);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Sharing                                                                   */

/* One log line at each change: shared, or this instance's samples only. */
static void set_sharing(mg_csamples_t *x, int on, const char *reason)
{
    if (x->sharing == on) return;
    x->sharing = on;
    mg_logline_t l;
    mg_log_begin(&l, on ? MG_LOG_INFO : MG_LOG_WARN,
                 on ? "health samples shared" : "health samples local only");
    mg_log_str(&l, "reason", reason);
    mg_log_end(&l);
}

typedef struct flush_s {
    mg_csamples_t *x;
    int n;
} flush_t;

static void on_added(void *ud, redisReply *reply)
{
    flush_t *f = ud;
    mg_csamples_t *x = f->x;
    if (reply && reply->type == REDIS_REPLY_STRING) { /* the entry's id */
        x->stats.added += (unsigned long long)f->n;
        set_sharing(x, 1, "appended");
    } else {
        x->stats.dropped += (unsigned long long)f->n; /* it may have been appended: not again */
        set_sharing(x, 0, !reply ? "redis unavailable" : "redis refused the entry");
    }
    free(f);
}

static void on_expire(void *ud, redisReply *reply)
{
    (void)ud, (void)reply; /* the next flush sets it again */
}

/* The gathered samples as one entry, and the stream's TTL refreshed: one round trip. */
static void flush(mg_csamples_t *x)
{
    mg_csamples_batch_t *b = &x->batch;
    if (!b->n) return;
    flush_t *f = malloc(sizeof(*f));
    x->body.len = 0;
    if (!f || mg_csamples_encode(b, &x->body) != 0) {
        free(f);
        x->stats.dropped += (unsigned long long)b->n;
        mg_csamples_batch_clear(b);
        return;
    }
    f->x = x;
    f->n = b->n;
    mg_csamples_batch_clear(b);
    const char *argv[] = {"XADD", x->key, "MAXLEN", "~",     STREAM_MAXLEN, "*",
                          "run",  x->run, "node",   x->node, "h",           x->body.data};
    size_t lens[] = {4, strlen(x->key),  6, 1,          strlen(STREAM_MAXLEN), 1, 3, strlen(x->run),
                     4, strlen(x->node), 1, x->body.len};
    if (mg_redis_command(x->r, on_added, f, 12, argv, lens) != 0) {
        x->stats.dropped += (unsigned long long)f->n;
        free(f);
        set_sharing(x, 0, "redis unavailable");
        return;
    }
    const char *ex[] = {"EXPIRE", x->key, STREAM_TTL_S};
    size_t exl[] = {6, strlen(x->key), strlen(STREAM_TTL_S)};
    mg_redis_command(x->r, on_expire, NULL, 3, ex, exl);
}

void mg_csamples_add(mg_csamples_t *x, const mg_csample_t *s)
{
    if (!x) return;
    if (mg_csamples_batch_add(&x->batch, s) != 0) x->stats.dropped++;
}

/* A decoded sample of another instance: fed when still in the TTL. */
typedef struct feed_ctx_s {
    mg_csamples_t *x;
    uint64_t now_unix;
} feed_ctx_t;

static void feed_one(void *ud, const mg_csample_t *s)
{
    feed_ctx_t *fc = ud;
    mg_csamples_t *x = fc->x;
    uint64_t age = fc->now_unix > s->at_ms ? fc->now_unix - s->at_ms : 0;
    if (age > MG_CSAMPLES_TTL_MS || !x->feed(x->feed_ud, s, age)) return;
    if (x->replaying) x->stats.replayed++;
    else x->stats.heard++;
}

/* The value of field name in an entry's [field, value, ...] array, or NULL. */
static const redisReply *field(const redisReply *fv, const char *name)
{
    if (fv->type != REDIS_REPLY_ARRAY) return NULL;
    for (size_t i = 0; i + 1 < fv->elements; i += 2) {
        const redisReply *k = fv->element[i], *v = fv->element[i + 1];
        if (k->type == REDIS_REPLY_STRING && v->type == REDIS_REPLY_STRING &&
            strcmp(k->str, name) == 0)
            return v;
    }
    return NULL;
}

/* One entry [id, [field, value, ...]]: the cursor moves past it; the others' samples fed. */
static void read_entry(mg_csamples_t *x, const redisReply *e, feed_ctx_t *fc)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 ||
        e->element[0]->type != REDIS_REPLY_STRING || e->element[0]->len >= sizeof(x->cursor))
        return;
    memcpy(x->cursor, e->element[0]->str, e->element[0]->len + 1);
    const redisReply *run = field(e->element[1], "run"), *h = field(e->element[1], "h");
    if (!run || !h || strcmp(run->str, x->run) == 0) return; /* ours: counted already */
    mg_csamples_decode(h->str, h->len, feed_one, fc);
}

static void read_next(mg_csamples_t *x);

/* XREAD's reply: nil (nothing new) or [[key, [entry, ...]]]. */
static void on_read(void *ud, redisReply *reply)
{
    mg_csamples_t *x = ud;
    x->reading = 0;
    if (x->stopping) return;
    if (!reply || reply->type == REDIS_REPLY_ERROR) {
        set_sharing(x, 0, !reply ? "redis unavailable" : "redis refused the read");
        return;
    }
    set_sharing(x, 1, "answered");
    size_t n = 0;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 1 &&
        reply->element[0]->type == REDIS_REPLY_ARRAY && reply->element[0]->elements == 2 &&
        reply->element[0]->element[1]->type == REDIS_REPLY_ARRAY) {
        const redisReply *list = reply->element[0]->element[1];
        feed_ctx_t fc = {x, mg_unix_ms()};
        n = list->elements;
        for (size_t i = 0; i < n; i++) read_entry(x, list->element[i], &fc);
    }
    if (n >= READ_COUNT) { /* more waiting: at once, not a tick later */
        read_next(x);
        return;
    }
    if (!x->replaying) return;
    x->replaying = 0;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "health samples replayed");
    mg_log_int(&l, "samples", (int64_t)x->stats.replayed);
    mg_log_int(&l, "ms", (int64_t)(uv_now(x->loop) - x->replay_t0));
    mg_log_end(&l);
}

static void read_next(mg_csamples_t *x)
{
    if (x->reading || !mg_redis_up(x->r)) return; /* no command while Redis is away */
    const char *argv[] = {"XREAD", "COUNT", "256", "STREAMS", x->key, x->cursor};
    size_t lens[] = {5, 5, 3, 7, strlen(x->key), strlen(x->cursor)};
    if (mg_redis_command(x->r, on_read, x, 6, argv, lens) == 0) x->reading = 1;
}

static void on_tick(uv_timer_t *t)
{
    mg_csamples_t *x = t->data;
    if (mg_redis_up(x->r)) flush(x);
    else if (x->batch.n) { /* Redis away: this instance's own samples only */
        x->stats.dropped += (unsigned long long)x->batch.n;
        mg_csamples_batch_clear(&x->batch);
        set_sharing(x, 0, "redis unavailable");
    }
    read_next(x);
}

mg_csamples_t *mg_csamples_new(uv_loop_t *loop, mg_redis_t *r, const char *prefix,
                               const char *node_id, mg_csamples_feed_fn feed, void *ud)
{
    if (!r || !feed) return NULL;
    mg_csamples_t *x = calloc(1, sizeof(*x));
    if (!x) return NULL;
    unsigned char rnd[8];
    if (mg_random_bytes(rnd, sizeof(rnd)) != 0) {
        free(x);
        return NULL;
    }
    for (int i = 0; i < 8; i++) snprintf(x->run + 2 * i, 3, "%02x", rnd[i]);
    x->loop = loop;
    x->r = r;
    x->feed = feed;
    x->feed_ud = ud;
    snprintf(x->key, sizeof(x->key), "%shealth", prefix ? prefix : "moongate:");
    snprintf(x->node, sizeof(x->node), "%s", node_id ? node_id : "");
    /* the replay: entries of the last TTL (the stream's ids are Redis' ms clock) */
    uint64_t now = mg_unix_ms();
    snprintf(x->cursor, sizeof(x->cursor), "%" PRIu64 "-0",
             now > MG_CSAMPLES_TTL_MS ? now - MG_CSAMPLES_TTL_MS : 0);
    x->replaying = 1;
    x->sharing = 1; /* the first failure is the change worth a line */
    x->replay_t0 = uv_now(loop);
    uv_timer_init(loop, &x->tick);
    x->tick.data = x;
    uv_timer_start(&x->tick, on_tick, TICK_MS, TICK_MS);
    return x;
}

static void on_closed(uv_handle_t *h)
{
    mg_csamples_t *x = h->data;
    mg_csamples_batch_clear(&x->batch);
    mg_buf_free(&x->body);
    free(x);
}

void mg_csamples_stop(mg_csamples_t *x)
{
    if (!x) return;
    x->stopping = 1;
    uv_timer_stop(&x->tick);
    uv_close((uv_handle_t *)&x->tick, on_closed);
}

void mg_csamples_stats(const mg_csamples_t *x, mg_csamples_stats_t *out)
{
    if (x) *out = x->stats;
    else memset(out, 0, sizeof(*out));
}

const char *mg_csamples_run_id(const mg_csamples_t *x)
{
    return x ? x->run : "";
}
