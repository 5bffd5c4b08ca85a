/* idem: idempotency keys; see idem.h.
 *
 * An entry is identified by SHA-256(scope "\n" key), so neither the caller's API key nor
 * the client's idempotency key is kept in clear. Entries live in idem_cache, which keeps
 * at most idempotency.max_entries stored answers per group (the tenant with auth on) and
 * evicts the oldest; the store keeps every answer until its TTL, so an evicted key is read
 * back from there. A pending entry has a run: the requests waiting for it (each with an
 * abort hook that takes it off the list) and what it waits for itself, one of
 *   LOOKUP  the store is read off the loop (only while the group's evicted records may be
 *           live): found, every waiter gets the replay; not found, the key runs;
 *   RUN     the detached request runs through the pipeline (its entry point);
 *   COMMIT  its answer is being written: nobody is answered before that write committed,
 *           so an answer a client saw can always be replayed, also after kill -9.
 * Then every waiter is answered and the entry becomes a stored answer.
 *
 * With cluster.redis (mg_idem_cluster) a key new to this instance is claimed in Redis before
 * it runs (cluster/idem.h), one round trip:
 *   CLAIM   taken: the key runs here (RUN), and its answer goes to Redis as it is committed
 *           here; already answered elsewhere: that answer is replayed; running elsewhere:
 *   REMOTE  the waiters wait for the other instance's answer (Redis read every POLL_MS), as
 *           a local twin waits for its run. The claim gone meanwhile (its instance died, or
 *           kept no answer): claimed again. Redis lost while waiting, or the wait past the
 *           claim's TTL twice: 409 IDEMPOTENCY_IN_PROGRESS (running the key here could make
 *           a second upstream call, which the key exists to prevent).
 * Redis unreachable or late at the claim: the key runs locally, as on a single node (its
 * answer still goes to Redis once Redis is back within the TTL). */
#include "pipeline/idem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/crypto.h"
#include "base/log.h"
#include "cluster/idem.h"
#include "pipeline/idem_cache.h"

#define POLL_MS 20

typedef enum { RUN_LOOKUP = 1, RUN_CLAIM, RUN_REMOTE, RUN_RUNNING, RUN_COMMIT } run_state_t;

typedef struct waiter_s {
    struct waiter_s *next;
    struct run_s *run;
    mg_http_req_t *req; /* borrowed until answered or aborted */
} waiter_t;

typedef struct run_s {
    struct mg_idem_s *m;
    mg_idem_entry_t *e; /* pending, owned by the cache; e->owner is this run */
    run_state_t state;
    waiter_t *waiters; /* owned list */
    mg_endpoint_t ep;
    int stream;
    char id[65];
    char group[64];
    char run_id[MG_REQUEST_ID_LEN + 1]; /* the request id the run answers with */
    /* the answer (RUN_COMMIT and after a found LOOKUP) */
    int status, answer_stream;
    char *body; /* owned until handed to the cache */
    size_t len;
    int64_t expires_ms;
    uv_work_t work; /* RUN_LOOKUP */
    int64_t lookup_now_ms;
    int found;
    int claimed;        /* the Redis claim is this instance's */
    uv_timer_t *poll;   /* RUN_REMOTE: the next read of the twin's answer (owned) */
    int64_t wait_until; /* RUN_REMOTE: 409 after this (wall ms) */
} run_t;

struct mg_idem_s {
    mg_store_t *store; /* borrowed; NULL = answers are kept in memory only */
    uv_loop_t *loop;
    mg_handle_fn run; /* the pipeline's entry point, for the detached run */
    void *run_ud;
    int stopped; /* the process is closing: no new run */
    mg_idem_cache_t cache;
    int ttl_s;
    mg_cidem_t *cluster; /* borrowed; NULL: keys are this instance's alone */
    uint64_t claim_ttl_ms;
};

static int64_t wall_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* ------------------------------------------------------------------------ */
/* Start-up                                                                  */
/* ------------------------------------------------------------------------ */

static void load_row(void *ud, int ncols, const char *const *cols)
{
    mg_idem_t *m = ud;
    if (ncols < 6 || !cols[0] || strlen(cols[0]) != 64 || !cols[3]) return;
    mg_idem_entry_t *e = mg_idem_cache_add(&m->cache, cols[0], cols[5] ? cols[5] : "");
    char *body = e ? strdup(cols[3]) : NULL;
    if (!body) {
        if (e) mg_idem_cache_remove(&m->cache, e);
        return;
    }
    mg_idem_cache_complete(&m->cache, e, cols[1] ? atoi(cols[1]) : 200, cols[2] ? atoi(cols[2]) : 0,
                           body, strlen(body), cols[4] ? atoll(cols[4]) : 0);
}

/* A group with more live records than its cap: the older ones are read on demand. */
static void over_cap_row(void *ud, int ncols, const char *const *cols)
{
    mg_idem_t *m = ud;
    if (ncols < 2 || !cols[1]) return;
    if (mg_idem_cache_note_stored(&m->cache, cols[0] ? cols[0] : "", atoll(cols[1])) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "idempotency: out of memory reading the stored keys");
}

/* The newest max_entries live answers of each group into memory, oldest first. */
static void load_stored(mg_idem_t *m, int max_entries)
{
    char now[24], cap[16], err[256];
    snprintf(now, sizeof(now), "%lld", (long long)wall_ms());
    snprintf(cap, sizeof(cap), "%d", max_entries);
    const char *p[2] = {now, cap};
    mg_store_t *st = m->store;
    if (mg_store_query(st,
                       "SELECT id, http_status, stream, body, expires_ms, grp FROM"
                       " (SELECT *, ROW_NUMBER() OVER (PARTITION BY grp ORDER BY expires_ms DESC)"
                       " AS rn FROM idempotency WHERE expires_ms > ?1)"
                       " WHERE rn <= CAST(?2 AS INTEGER) ORDER BY expires_ms",
                       2, p, load_row, m, err, sizeof(err)) != 0 ||
        mg_store_query(st,
                       "SELECT grp, MAX(expires_ms) FROM idempotency WHERE expires_ms > ?1"
                       " GROUP BY grp HAVING COUNT(*) > CAST(?2 AS INTEGER)",
                       2, p, over_cap_row, m, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot read idempotency keys: %s", err);
    mg_store_write(st, "DELETE FROM idempotency WHERE expires_ms <= ?1", 1, p);
}

mg_idem_t *mg_idem_open(const mg_idem_deps_t *d, int ttl_s, int max_entries)
{
    mg_idem_t *m = calloc(1, sizeof(*m));
    if (!m || mg_idem_cache_init(&m->cache, max_entries) != 0) {
        free(m);
        return NULL;
    }
    m->store = d->store;
    m->loop = d->loop;
    m->run = d->run;
    m->run_ud = d->run_ud;
    m->ttl_s = ttl_s;
    if (m->store) load_stored(m, max_entries);
    return m;
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void stop_poll(run_t *r)
{
    if (!r->poll) return;
    uv_close((uv_handle_t *)r->poll, free_handle);
    r->poll = NULL;
}

static void run_free(run_t *r)
{
    stop_poll(r);
    while (r->waiters) {
        waiter_t *w = r->waiters;
        r->waiters = w->next;
        w->req->on_abort = NULL;
        free(w);
    }
    free(r->body);
    free(r);
}

void mg_idem_stop(mg_idem_t *m)
{
    if (!m) return;
    m->stopped = 1;
    /* the loop must be free to end: no timer of ours left running */
    for (size_t i = 0; i < m->cache.n_buckets; i++)
        for (mg_idem_entry_t *e = m->cache.buckets[i]; e; e = e->hnext)
            if (!e->done && e->owner) stop_poll(e->owner);
}

void mg_idem_cluster(mg_idem_t *m, mg_cidem_t *x, uint64_t claim_ttl_ms)
{
    if (!m) return;
    m->cluster = x;
    m->claim_ttl_ms = claim_ttl_ms;
}

void mg_idem_free(mg_idem_t *m)
{
    if (!m) return;
    /* pending entries' runs (none once the loop and the store stopped; kept safe anyway) */
    for (size_t i = 0; i < m->cache.n_buckets; i++)
        for (mg_idem_entry_t *e = m->cache.buckets[i]; e; e = e->hnext)
            if (!e->done && e->owner) run_free(e->owner);
    mg_idem_cache_free(&m->cache);
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

/* One key, one request id: every client of a key's answer (its run's, a twin that waited, a
 * later replay) sees the run's request id in X-Request-Id, as the answer's body and the log
 * say it (the id the gateway wrote first into the answer: "request_id":"req-..."). */
static void take_answer_id(mg_http_req_t *req, const char *body, size_t len)
{
    static const char key[] = "\"request_id\":\"";
    const char *p = body ? memmem(body, len, key, sizeof(key) - 1) : NULL;
    if (!p) return;
    p += sizeof(key) - 1;
    size_t left = len - (size_t)(p - body);
    if (left <= MG_REQUEST_ID_LEN || p[MG_REQUEST_ID_LEN] != '"') return;
    memcpy(req->request_id, p, MG_REQUEST_ID_LEN);
    req->request_id[MG_REQUEST_ID_LEN] = '\0';
}

/* Answer req; `stored` marks a replay of an earlier answer (the clients of the run itself
 * get it as their own), `logged`: the run's own log line covers it (its first client).
 * Every other answer gets a request log line of its own. */
static void answer(mg_http_req_t *req, int status, int stream, const char *body, size_t len,
                   int stored, int logged)
{
    req->on_abort = NULL;
    take_answer_id(req, body, len);
    if (!logged && mg_log_enabled(MG_LOG_INFO)) {
        mg_logline_t l;
        mg_log_begin(&l, MG_LOG_INFO, "request");
        mg_http_log_ids(&l, req);
        mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
        mg_log_str(&l, "path", req->path);
        mg_log_int(&l, "status", status);
        mg_log_str(&l, "outcome", stored ? "idempotent_replay" : "idempotent_twin");
        mg_log_end(&l);
    }
    mg_http_respond(req, status, stream ? "text/event-stream" : "application/json",
                    stored ? "Idempotent-Replayed: true\r\n" : NULL, body ? body : "", len);
}

static void on_waiter_abort(void *data)
{
    waiter_t *w = data;
    waiter_t **pp = &w->run->waiters;
    while (*pp && *pp != w) pp = &(*pp)->next;
    if (*pp) *pp = w->next;
    free(w);
}

static int add_waiter(run_t *r, mg_http_req_t *req)
{
    waiter_t *w = calloc(1, sizeof(*w));
    if (!w) return -1;
    w->run = r;
    w->req = req;
    w->next = r->waiters;
    r->waiters = w;
    req->on_abort = on_waiter_abort;
    req->on_drain = NULL;
    req->hook_data = w;
    return 0;
}

/* Answer every waiter with the run's answer, newcomers too: answering a request may start
 * the next one pipelined on its connection, which may ask for this key again. */
static void answer_waiters(run_t *r, int stored)
{
    waiter_t *w;
    while ((w = r->waiters)) {
        r->waiters = w->next;
        mg_http_req_t *req = w->req;
        free(w);
        int logged = !stored && strcmp(req->request_id, r->run_id) == 0;
        answer(req, r->status, r->answer_stream, r->body, r->len, stored, logged);
    }
}

/* The run is over: answer its waiters, then the entry keeps the answer (or goes, when there
 * is none). `stored`: the answer is a replay read from the store. */
static void run_end(run_t *r, int stored)
{
    mg_idem_t *m = r->m;
    answer_waiters(r, stored);
    if (r->body) {
        mg_idem_cache_complete(&m->cache, r->e, r->status, r->answer_stream, r->body, r->len,
                               r->expires_ms);
        r->body = NULL;
    } else {
        mg_idem_cache_remove(&m->cache, r->e);
    }
    r->e = NULL;
    run_free(r);
}

/* Every waiter gets 500 and the key is forgotten (out of memory). */
static void run_abandon(run_t *r)
{
    if (r->claimed) mg_cidem_drop(r->m->cluster, r->id); /* the others may run it */
    r->claimed = 0;
    free(r->body);
    r->body = NULL;
    r->status = 500;
    r->answer_stream = 0;
    static const char empty[] = "{}";
    waiter_t *w;
    while ((w = r->waiters)) {
        r->waiters = w->next;
        mg_http_req_t *req = w->req;
        free(w);
        answer(req, 500, 0, empty, 2, 0, 0);
    }
    run_end(r, 0);
}

/* ------------------------------------------------------------------------ */
/* The run: detached request, then its durable record                        */
/* ------------------------------------------------------------------------ */

static void on_committed(void *ud, int rc)
{
    run_t *r = ud;
    if (rc != 0)
        mg_log_msg(MG_LOG_ERROR, NULL,
                   "idempotency: a record was not stored; its key's replay after a restart"
                   " cannot be promised");
    run_end(r, 0);
}

/* The detached request is answered: store the answer durably, then answer everyone. */
static void on_run_finished(void *ud, const mg_http_req_t *dreq, int status, const char *body,
                            size_t len)
{
    run_t *r = ud;
    mg_idem_t *m = r->m;
    (void)dreq;
    r->status = status;
    r->answer_stream = r->stream;
    r->body = malloc(len + 1);
    r->len = r->body ? len : 0;
    if (r->body) {
        memcpy(r->body, body, len);
        r->body[len] = '\0';
    }
    r->expires_ms = wall_ms() + (int64_t)m->ttl_s * 1000;
    /* the other instances' twins read it there; sent before the local commit, which takes
       longer, so it is in Redis before any client here has the answer, in practice */
    if (m->cluster && r->body)
        mg_cidem_put(m->cluster, r->id, status, r->stream, r->body, r->len, r->expires_ms);
    if (m->store && r->body) {
        char st[16], sm[4], exp[24];
        snprintf(st, sizeof(st), "%d", status);
        snprintf(sm, sizeof(sm), "%d", r->stream);
        snprintf(exp, sizeof(exp), "%lld", (long long)r->expires_ms);
        const char *p[6] = {r->id, st, sm, r->body, exp, r->group};
        r->state = RUN_COMMIT;
        if (mg_store_write_cb(m->store,
                              "INSERT OR REPLACE INTO idempotency(id, http_status, stream, body,"
                              " expires_ms, grp) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                              6, p, on_committed, r) == 0)
            return;
        mg_log_msg(MG_LOG_ERROR, NULL,
                   "idempotency: the store is not writable; replay after a"
                   " restart cannot be promised");
    }
    if (!r->body) {
        run_abandon(r);
        return;
    }
    run_end(r, 0);
}

/* Run the key once, detached, with the request of one of its waiters. */
static void start_run(run_t *r)
{
    mg_idem_t *m = r->m;
    mg_http_req_t *req = r->waiters->req;
    mg_http_req_t *dreq = mg_http_req_detached(HTTP_POST, req->path, req->body, req->body_len, req,
                                               uv_now(m->loop), on_run_finished, r);
    if (!dreq) {
        run_abandon(r);
        return;
    }
    /* the run is the request that started it: its id, header, body and log line agree */
    memcpy(dreq->request_id, req->request_id, sizeof(dreq->request_id));
    memcpy(r->run_id, req->request_id, sizeof(r->run_id));
    r->state = RUN_RUNNING;
    m->run(m->run_ud, dreq, r->ep); /* may answer at once: on_run_finished answers */
}

/* ---- the key across instances (cluster.redis) ---- */

static void claim_or_run(run_t *r);

/* Every waiter gets 409: the key runs on another instance and its answer cannot be had. */
static void run_conflict(run_t *r, const char *why)
{
    mg_cidem_note_conflict(r->m->cluster);
    waiter_t *w;
    while ((w = r->waiters)) {
        r->waiters = w->next;
        mg_http_req_t *req = w->req;
        free(w);
        req->on_abort = NULL;
        if (mg_log_enabled(MG_LOG_INFO)) {
            mg_logline_t l;
            mg_log_begin(&l, MG_LOG_INFO, "request");
            mg_http_log_ids(&l, req);
            mg_log_str(&l, "path", req->path);
            mg_log_int(&l, "status", 409);
            mg_log_str(&l, "outcome", "idempotent_conflict");
            mg_log_end(&l);
        }
        mg_error_respond(req, 409, "IDEMPOTENCY_IN_PROGRESS", why, 1000, NULL);
    }
    run_end(r, 0); /* no answer: the key is forgotten here */
}

/* The answer another instance stored: every waiter gets it (`stored`: a replay, else a twin
 * that waited), and it is kept here as a run's answer is, in memory and in the store. */
static void remote_answer(run_t *r, const mg_cidem_answer_t *a, int stored)
{
    mg_idem_t *m = r->m;
    r->body = malloc(a->len + 1);
    if (!r->body) {
        run_abandon(r);
        return;
    }
    memcpy(r->body, a->body, a->len);
    r->body[a->len] = '\0';
    r->len = a->len;
    r->status = a->status;
    r->answer_stream = a->stream;
    r->expires_ms = a->expires_ms;
    if (m->store) {
        char st[16], sm[4], exp[24];
        snprintf(st, sizeof(st), "%d", r->status);
        snprintf(sm, sizeof(sm), "%d", r->answer_stream);
        snprintf(exp, sizeof(exp), "%lld", (long long)r->expires_ms);
        const char *p[6] = {r->id, st, sm, r->body, exp, r->group};
        mg_store_write(m->store,
                       "INSERT OR REPLACE INTO idempotency(id, http_status, stream, body,"
                       " expires_ms, grp) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                       6, p); /* Redis has it meanwhile: no wait for this commit */
    }
    run_end(r, stored);
}

static void on_peek(void *ud, const mg_cidem_answer_t *a);

static void on_poll(uv_timer_t *t)
{
    run_t *r = t->data;
    if (r->m->stopped) return;
    if (mg_cidem_peek(r->m->cluster, r->id, on_peek, r) != 0)
        run_conflict(r, "this key's request runs on another instance and the cluster state"
                        " (Redis) cannot be read now; retry later");
}

/* Read the twin's answer again in POLL_MS. */
static void wait_remote(run_t *r)
{
    r->state = RUN_REMOTE;
    if (!r->poll) {
        r->poll = malloc(sizeof(*r->poll));
        if (!r->poll) {
            run_abandon(r);
            return;
        }
        uv_timer_init(r->m->loop, r->poll);
        r->poll->data = r;
    }
    uv_timer_start(r->poll, on_poll, POLL_MS, 0);
}

static void on_peek(void *ud, const mg_cidem_answer_t *a)
{
    run_t *r = ud;
    if (r->m->stopped) return; /* left to mg_idem_free */
    if (a->rc == MG_CIDEM_DONE) {
        remote_answer(r, a, 0);
    } else if (!r->waiters) {
        run_end(r, 0); /* nobody waits any more: forget the key here */
    } else if (a->rc == MG_CIDEM_GONE) {
        claim_or_run(r); /* its instance died or kept no answer */
    } else if (a->rc == MG_CIDEM_UNAVAILABLE) {
        run_conflict(r, "this key's request runs on another instance and the cluster state"
                        " (Redis) cannot be read now; retry later");
    } else if (wall_ms() > r->wait_until) {
        run_conflict(r, "this key's request is still running on another instance; retry later");
    } else {
        wait_remote(r);
    }
}

static void on_claimed(void *ud, const mg_cidem_answer_t *a)
{
    run_t *r = ud;
    mg_idem_t *m = r->m;
    if (m->stopped) return; /* left to mg_idem_free */
    if (a->rc == MG_CIDEM_DONE) {
        remote_answer(r, a, 1);
        return;
    }
    if (a->rc == MG_CIDEM_OWNED) r->claimed = 1;
    if (!r->waiters) { /* nobody to run it for */
        if (r->claimed) mg_cidem_drop(m->cluster, r->id);
        r->claimed = 0;
        run_end(r, 0);
        return;
    }
    if (a->rc == MG_CIDEM_RUNNING) {
        r->wait_until = wall_ms() + 2 * (int64_t)m->claim_ttl_ms;
        wait_remote(r);
        return;
    }
    start_run(r); /* ours, or Redis did not answer: local, as a single node */
}

/* The key is new here: claimed across instances first when Redis is up, else run. */
static void claim_or_run(run_t *r)
{
    mg_idem_t *m = r->m;
    r->state = RUN_CLAIM;
    if (!mg_cidem_up(m->cluster) ||
        mg_cidem_claim(m->cluster, r->id, m->claim_ttl_ms, on_claimed, r) != 0)
        start_run(r);
}

/* ---- reading an evicted record back (off the loop) ---- */

static void lookup_row(void *ud, int ncols, const char *const *cols)
{
    run_t *r = ud;
    if (ncols < 4 || !cols[2] || r->found) return;
    r->body = strdup(cols[2]);
    if (!r->body) return;
    r->len = strlen(r->body);
    r->status = cols[0] ? atoi(cols[0]) : 200;
    r->answer_stream = cols[1] ? atoi(cols[1]) : 0;
    r->expires_ms = cols[3] ? atoll(cols[3]) : 0;
    r->found = 1;
}

/* Thread pool: the record of r->id, if it is still live. */
static void lookup_work(uv_work_t *w)
{
    run_t *r = w->data;
    char now[24], err[256];
    snprintf(now, sizeof(now), "%lld", (long long)r->lookup_now_ms);
    const char *p[2] = {r->id, now};
    if (mg_store_query(r->m->store,
                       "SELECT http_status, stream, body, expires_ms FROM idempotency"
                       " WHERE id = ?1 AND expires_ms > CAST(?2 AS INTEGER)",
                       2, p, lookup_row, r, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "idempotency: cannot read a stored key: %s", err);
}

static void lookup_done(uv_work_t *w, int status)
{
    run_t *r = w->data;
    (void)status;
    if (r->found) {
        run_end(r, 1); /* a replay: the record was acknowledged before */
        return;
    }
    if (!r->waiters || r->m->stopped) {
        run_end(r, 0); /* nobody to run it for: forget the key */
        return;
    }
    claim_or_run(r);
}

static void start_lookup(run_t *r)
{
    r->state = RUN_LOOKUP;
    r->work.data = r;
    r->lookup_now_ms = wall_ms();
    if (uv_queue_work(r->m->loop, &r->work, lookup_work, lookup_done) != 0) claim_or_run(r);
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                               */
/* ------------------------------------------------------------------------ */

void mg_idem_handle(mg_idem_t *m, mg_http_req_t *req, mg_endpoint_t ep, const char *scope,
                    const char *group, const char *key, int stream)
{
    int64_t now = wall_ms();
    mg_idem_cache_prune(&m->cache, now);
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

    mg_idem_entry_t *e = mg_idem_cache_find(&m->cache, id, now);
    if (e && e->done) {
        answer(req, e->status, e->stream, e->body, e->len, 1, 0);
        return;
    }
    if (e) { /* its twin is running (or committing): wait for that answer */
        if (add_waiter(e->owner, req) != 0)
            mg_http_respond(req, 500, "application/json", NULL, "{}", 2);
        return;
    }
    e = mg_idem_cache_add(&m->cache, id, group);
    run_t *r = e ? calloc(1, sizeof(*r)) : NULL;
    if (!r || add_waiter(r, req) != 0) {
        free(r);
        if (e) mg_idem_cache_remove(&m->cache, e);
        mg_http_respond(req, 500, "application/json", NULL, "{}", 2);
        return;
    }
    r->m = m;
    r->e = e;
    r->ep = ep;
    r->stream = stream;
    memcpy(r->id, id, sizeof(r->id));
    snprintf(r->group, sizeof(r->group), "%s", group);
    e->owner = r;
    if (m->store && mg_idem_cache_may_be_stored(&m->cache, group, now)) start_lookup(r);
    else claim_or_run(r);
}
