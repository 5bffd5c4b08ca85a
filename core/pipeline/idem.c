/* idem: idempotency keys; see idem.h.
 *
 * An entry is identified by SHA-256(scope "\n" key), so neither the caller's API key nor
 * the client's idempotency key is kept in clear. Entries live in a list (the number of
 * live keys is bounded by the TTL and by MAX_ENTRIES); waiters are requests whose
 * connection is still open, each with an abort hook that takes it off the list. */
#include "pipeline/idem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/crypto.h"
#include "base/log.h"

#define MAX_ENTRIES 100000

typedef struct waiter_s {
    struct waiter_s *next;
    struct idem_entry_s *entry;
    mg_http_req_t *req; /* borrowed until answered or aborted */
} waiter_t;

typedef struct idem_entry_s {
    struct idem_entry_s *next;
    char id[65];          /* sha256 hex of scope and key */
    int done;             /* the answer is stored */
    int status, stream;
    char *body;           /* owned */
    size_t len;
    int64_t expires_ms;   /* wall clock; only once done */
    waiter_t *waiters;    /* owned list */
} idem_entry_t;

struct mg_idem_s {
    mg_store_t *store;    /* borrowed; NULL = answers are kept in memory only */
    uv_loop_t *loop;
    mg_handle_fn run;     /* the pipeline's entry point, for the detached run */
    void *run_ud;
    idem_entry_t *head;
    int count;
    int ttl_s;
};

static int64_t wall_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void entry_free(idem_entry_t *e)
{
    while (e->waiters) {
        waiter_t *w = e->waiters;
        e->waiters = w->next;
        free(w);
    }
    free(e->body);
    free(e);
}

/* Unlink and free expired done entries (and the oldest done ones past MAX_ENTRIES). */
static void prune(mg_idem_t *m, int64_t now)
{
    idem_entry_t **pp = &m->head;
    int n = 0;
    while (*pp) {
        idem_entry_t *e = *pp;
        if (e->done && (e->expires_ms <= now || n >= MAX_ENTRIES)) {
            *pp = e->next;
            entry_free(e);
            m->count--;
            continue;
        }
        n++;
        pp = &e->next;
    }
}

static idem_entry_t *find(mg_idem_t *m, const char *id)
{
    for (idem_entry_t *e = m->head; e; e = e->next)
        if (strcmp(e->id, id) == 0) return e;
    return NULL;
}

static void load_row(void *ud, int ncols, const char *const *cols)
{
    mg_idem_t *m = ud;
    if (ncols < 5 || !cols[0] || strlen(cols[0]) != 64 || !cols[3]) return;
    idem_entry_t *e = calloc(1, sizeof(*e));
    if (!e) return;
    memcpy(e->id, cols[0], 65);
    e->done = 1;
    e->status = cols[1] ? atoi(cols[1]) : 200;
    e->stream = cols[2] ? atoi(cols[2]) : 0;
    e->body = strdup(cols[3]);
    e->len = e->body ? strlen(e->body) : 0;
    e->expires_ms = cols[4] ? atoll(cols[4]) : 0;
    e->next = m->head;
    m->head = e;
    m->count++;
}

mg_idem_t *mg_idem_open(mg_store_t *st, uv_loop_t *loop, int ttl_s, mg_handle_fn run,
                        void *run_ud)
{
    mg_idem_t *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->store = st;
    m->loop = loop;
    m->run = run;
    m->run_ud = run_ud;
    m->ttl_s = ttl_s;
    if (!st) return m;
    char now[24], err[256];
    snprintf(now, sizeof(now), "%lld", (long long)wall_ms());
    const char *p[1] = {now};
    if (mg_store_query(st,
                       "SELECT id, http_status, stream, body, expires_ms FROM idempotency"
                       " WHERE expires_ms > ?1",
                       1, p, load_row, m, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot read idempotency keys: %s", err);
    mg_store_write(st, "DELETE FROM idempotency WHERE expires_ms <= ?1", 1, p);
    return m;
}

void mg_idem_free(mg_idem_t *m)
{
    if (!m) return;
    while (m->head) {
        idem_entry_t *n = m->head->next;
        entry_free(m->head);
        m->head = n;
    }
    free(m);
}

const char *mg_idem_key(const mg_http_req_t *req, const char *body_key)
{
    if (body_key && *body_key) return body_key;
    const char *h = mg_http_header(req, "Idempotency-Key");
    return h && *h ? h : NULL;
}

/* ------------------------------------------------------------------------ */
/* Answering                                                                 */
/* ------------------------------------------------------------------------ */

/* Answer req with the entry's answer; `stored` marks a replay of an earlier answer (the
 * clients of the run itself get it as their own). */
static void answer(const idem_entry_t *e, mg_http_req_t *req, int stored)
{
    req->on_abort = NULL;
    mg_http_respond(req, e->status, e->stream ? "text/event-stream" : "application/json",
                    stored ? "Idempotent-Replayed: true\r\n" : NULL, e->body ? e->body : "",
                    e->len);
}

static void on_waiter_abort(void *data)
{
    waiter_t *w = data;
    waiter_t **pp = &w->entry->waiters;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    free(w);
}

static int add_waiter(idem_entry_t *e, mg_http_req_t *req)
{
    waiter_t *w = calloc(1, sizeof(*w));
    if (!w) return -1;
    w->entry = e;
    w->req = req;
    w->next = e->waiters;
    e->waiters = w;
    req->on_abort = on_waiter_abort;
    req->on_drain = NULL;
    req->hook_data = w;
    return 0;
}

/* What a run needs when it ends: the entry and the module that stores it. */
typedef struct {
    mg_idem_t *m;
    idem_entry_t *e;
} run_ctx_t;

/* The run is over: store the answer, persist it, answer everyone waiting. */
static void on_run_finished(void *ud, const mg_http_req_t *dreq, int status, const char *body,
                            size_t len)
{
    run_ctx_t *rc = ud;
    mg_idem_t *m = rc->m;
    idem_entry_t *e = rc->e;
    free(rc);
    e->done = 1;
    e->status = status;
    e->body = malloc(len + 1);
    e->len = e->body ? len : 0;
    if (e->body) {
        memcpy(e->body, body, len);
        e->body[len] = '\0';
    }
    e->expires_ms = wall_ms() + (int64_t)m->ttl_s * 1000;
    if (m->store && e->body) {
        char st[16], sm[4], exp[24];
        snprintf(st, sizeof(st), "%d", status);
        snprintf(sm, sizeof(sm), "%d", e->stream);
        snprintf(exp, sizeof(exp), "%lld", (long long)e->expires_ms);
        const char *p[5] = {e->id, st, sm, e->body, exp};
        mg_store_write(m->store,
                       "INSERT OR REPLACE INTO idempotency(id, http_status, stream, body, expires_ms)"
                       " VALUES (?1, ?2, ?3, ?4, ?5)",
                       5, p);
    }
    while (e->waiters) {
        waiter_t *w = e->waiters;
        e->waiters = w->next;
        mg_http_req_t *req = w->req;
        free(w);
        answer(e, req, 0);
    }
}

void mg_idem_handle(mg_idem_t *m, mg_http_req_t *req, mg_endpoint_t ep, const char *scope,
                    const char *key, int stream)
{
    int64_t now = wall_ms();
    prune(m, now);
    size_t sl = strlen(scope), kl = strlen(key);
    char *buf = malloc(sl + kl + 2);
    if (!buf) {
        mg_http_respond(req, 500, "application/json", NULL, "{}", 2);
        return;
    }
    memcpy(buf, scope, sl);
    buf[sl] = '\n';
    memcpy(buf + sl + 1, key, kl + 1);
    char id[65];
    mg_sha256_hex(buf, sl + kl + 1, id);
    free(buf);

    idem_entry_t *e = find(m, id);
    if (e && e->done) {
        answer(e, req, 1);
        return;
    }
    if (e) { /* its twin is running: wait for that answer */
        if (add_waiter(e, req) != 0) mg_http_respond(req, 500, "application/json", NULL, "{}", 2);
        return;
    }
    e = calloc(1, sizeof(*e));
    run_ctx_t *rc = e ? calloc(1, sizeof(*rc)) : NULL;
    mg_http_req_t *dreq = rc ? mg_http_req_detached(HTTP_POST, req->path, req->body, req->body_len,
                                                    req, uv_now(m->loop), on_run_finished, rc)
                             : NULL;
    if (!dreq || add_waiter(e, req) != 0) {
        free(rc);
        if (e) entry_free(e);
        mg_http_respond(req, 500, "application/json", NULL, "{}", 2);
        return;
    }
    memcpy(e->id, id, 65);
    e->stream = stream;
    e->next = m->head;
    m->head = e;
    m->count++;
    rc->m = m;
    rc->e = e;
    m->run(m->run_ud, dreq, ep); /* may answer at once: on_run_finished answers req */
}
