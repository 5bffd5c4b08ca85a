/* pg: the PostgreSQL thread and its queue; see pg.h. */
#include "store/pg.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "store/pg_schema.h"

typedef struct job_s {
    struct job_s *next;
    char *sql;
    int nparams;
    char **params;
    int durable;
    mg_pg_done_fn done;
    void *ud;
    int rc;
    char *value; /* the first cell, once it ran */
} job_t;

typedef struct job_list_s {
    job_t *head, *tail;
    size_t n;
} job_list_t;

struct mg_pg_s {
    char *url;
    size_t queue_max;
    pthread_t *threads; /* one connection each, sharing the queue */
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work queued, stopping, or the queue drained */
    job_list_t queue;  /* guarded by mu */
    job_list_t done;   /* ran, callback due (guarded by mu) */
    int stopping;
    int busy; /* threads running a job taken from the queue */
    uv_async_t *async;
    int attached;
    mg_pg_stats_t st; /* guarded by mu */
};

static void list_push(job_list_t *l, job_t *j)
{
    j->next = NULL;
    if (l->tail) l->tail->next = j;
    else l->head = j;
    l->tail = j;
    l->n++;
}

static job_t *list_pop(job_list_t *l)
{
    job_t *j = l->head;
    if (!j) return NULL;
    l->head = j->next;
    if (!l->head) l->tail = NULL;
    l->n--;
    return j;
}

static void job_free(job_t *j)
{
    for (int i = 0; i < j->nparams; i++) free(j->params[i]);
    free(j->params);
    free(j->sql);
    free(j->value);
    free(j);
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

static job_t *job_new(const char *sql, int n, const char *const *params, int durable,
                      mg_pg_done_fn done, void *ud)
{
    job_t *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->sql = strdup(sql);
    j->params = n > 0 ? calloc((size_t)n, sizeof(char *)) : NULL;
    j->nparams = n;
    int ok = j->sql && (n == 0 || j->params);
    for (int i = 0; ok && i < n; i++) {
        j->params[i] = dup_or_null(params[i]);
        if (params[i] && !j->params[i]) ok = 0;
    }
    if (!ok) {
        if (!j->params) j->nparams = 0;
        job_free(j);
        return NULL;
    }
    j->durable = durable;
    j->done = done;
    j->ud = ud;
    return j;
}

/* ---- the thread ---------------------------------------------------------------------------- */

/* A job's end (mu held): its callback is due on the loop, or it is simply freed. */
static void finish_locked(mg_pg_t *pg, job_t *j, int rc)
{
    j->rc = rc;
    if (rc == 0) pg->st.done_total++;
    else pg->st.failed_total++;
    if (!j->done) {
        job_free(j);
        return;
    }
    list_push(&pg->done, j);
    if (pg->attached) uv_async_send(pg->async);
}

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Fail the at-most-once jobs waiting (mu held): nobody should wait for a connection. */
static void fail_at_most_once_locked(mg_pg_t *pg)
{
    job_list_t keep = {0};
    job_t *j;
    while ((j = list_pop(&pg->queue))) {
        if (j->durable) list_push(&keep, j);
        else finish_locked(pg, j, -1);
    }
    pg->queue = keep;
    pthread_cond_broadcast(&pg->cv);
}

/* A connection to url; NULL when it cannot be made. */
static PGconn *connect_to(const char *url)
{
    /* the url may be a URI or key=value; a dead host must not hold the thread for minutes */
    const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "3", "moongate", NULL};
    return PQconnectdbParams(keys, vals, 1);
}

static PGconn *connect_and_migrate(mg_pg_t *pg, int *version)
{
    PGconn *c = connect_to(pg->url);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        PQfinish(c);
        return NULL;
    }
    char err[256];
    int v = mg_pg_migrate(c, err, sizeof(err));
    if (v < 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "postgres: migrations failed: %s", err);
        PQfinish(c);
        return NULL;
    }
    *version = v;
    return c;
}

/* Run one job on c. 0 ran, 1 failed on a live connection, 2 failed for a reason that passes
 * (SQLSTATE class 40: a deadlock, a serialization failure: run it again), -1 the connection
 * is gone. */
static int run_job(PGconn *c, job_t *j)
{
    PGresult *r =
        PQexecParams(c, j->sql, j->nparams, NULL, (const char *const *)j->params, NULL, NULL, 0);
    ExecStatusType s = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    int rc;
    if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
        if (PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0))
            j->value = strdup(PQgetvalue(r, 0, 0));
        rc = 0;
    } else if (PQstatus(c) != CONNECTION_OK) {
        rc = -1;
    } else {
        const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
        const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
        rc = state && strncmp(state, "40", 2) == 0 ? 2 : 1;
        if (rc == 1)
            mg_log_msg(MG_LOG_ERROR, NULL, "postgres: a statement failed (%s): %s",
                       state ? state : "?", msg ? msg : "?");
    }
    PQclear(r);
    return rc;
}

/* Durable statements queued together share one transaction (group commit: one commit, and
 * one fsync, for many events), at most this many. */
#define BATCH_MAX 64

static int exec_simple(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok ? 0 : PQstatus(c) != CONNECTION_OK ? -1 : 1;
}

/* Run the batch on c; each job's outcome in its rc (0 ran, 1 failed, -1 the connection went
 * before it was known). One transaction when it holds several; when one of them fails on a
 * live connection the transaction is rolled back and each runs alone, so it fails alone. */
static void run_batch(PGconn *c, job_t *b)
{
    if (!b->next) {
        b->rc = run_job(c, b);
        return;
    }
    int rc = exec_simple(c, "BEGIN");
    for (job_t *j = b; rc == 0 && j; j = j->next) rc = run_job(c, j);
    if (rc == 0) rc = exec_simple(c, "COMMIT");
    else if (rc >= 1) rc = exec_simple(c, "ROLLBACK") == 0 ? rc : -1;
    if (rc == 1) { /* one by one: the failing one fails alone */
        for (job_t *j = b; j; j = j->next)
            j->rc = PQstatus(c) == CONNECTION_OK ? run_job(c, j) : -1;
        return;
    }
    for (job_t *j = b; j; j = j->next) j->rc = rc;
}

/* Take the next batch (mu held): one job, or up to BATCH_MAX durable ones of the same
 * statement (usage events): statements of different kinds lock rows in different orders
 * (a wallet, then an hourly bucket; a bucket, then a wallet) and would deadlock together. */
static job_t *take_batch(mg_pg_t *pg)
{
    job_t *b = list_pop(&pg->queue), *tail = b;
    for (int n = 1; b && b->durable && n < BATCH_MAX && pg->queue.head && pg->queue.head->durable &&
                    strcmp(pg->queue.head->sql, b->sql) == 0;
         n++)
        tail = tail->next = list_pop(&pg->queue);
    if (tail) tail->next = NULL;
    return b;
}

static void *pg_main(void *arg)
{
    mg_pg_t *pg = arg;
    PGconn *c = NULL;
    int backoff = 100, first = 1, logged_down = 0;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        if (!c) {
            if (pg->stopping) break;
            pthread_mutex_unlock(&pg->mu);
            int version = 0;
            c = connect_and_migrate(pg, &version);
            pthread_mutex_lock(&pg->mu);
            if (!c) {
                if (pg->st.connected == 0) fail_at_most_once_locked(pg);
                if (!logged_down)
                    mg_log_msg(MG_LOG_WARN, NULL,
                               "postgres: unreachable; %zu statements kept, retrying with backoff",
                               pg->queue.n);
                logged_down = 1;
                struct timespec until; /* the backoff, cut short by mg_pg_close */
                deadline_in(&until, backoff);
                int w = 0;
                while (!pg->stopping && w == 0)
                    w = pthread_cond_timedwait(&pg->cv, &pg->mu, &until);
                backoff = backoff * 2 > 5000 ? 5000 : backoff * 2;
                continue;
            }
            if (!first) pg->st.reconnects++;
            if (pg->st.connected == 0) /* the first of the pool: say it once */
                mg_log_msg(MG_LOG_INFO, NULL, "postgres: connected (schema version %d, %zu queued)",
                           version, pg->queue.n);
            first = 0;
            logged_down = 0;
            backoff = 100;
            pg->st.connected++;
            pg->st.schema_version = version;
        }
        while (!pg->queue.head && !pg->stopping) pthread_cond_wait(&pg->cv, &pg->mu);
        job_t *b = take_batch(pg);
        if (!b) break; /* stopping, queue empty */
        pg->busy++;
        pthread_mutex_unlock(&pg->mu);
        run_batch(c, b);
        pthread_mutex_lock(&pg->mu);
        pg->busy--;
        job_list_t again = {0}; /* durable jobs the lost connection left unknown, in order */
        int lost = 0;
        while (b) {
            job_t *j = b;
            b = b->next;
            if (j->rc == -1) lost = 1;
            if ((j->rc == -1 || j->rc == 2) && j->durable)
                list_push(&again, j); /* idempotent: run again */
            else finish_locked(pg, j, j->rc == 0 ? 0 : -1);
        }
        if (again.head) {
            again.tail->next = pg->queue.head;
            pg->queue.head = again.head;
            if (!pg->queue.tail) pg->queue.tail = again.tail;
            pg->queue.n += again.n;
        }
        if (lost) {
            PQfinish(c);
            c = NULL;
            if (--pg->st.connected == 0)
                mg_log_msg(MG_LOG_WARN, NULL, "postgres: connection lost; reconnecting");
        }
        pthread_cond_broadcast(&pg->cv);
    }
    if (c) pg->st.connected--;
    pthread_mutex_unlock(&pg->mu);
    PQfinish(c);
    return NULL;
}

/* ---- the loop side -------------------------------------------------------------------------
 */

static void deliver(mg_pg_t *pg)
{
    pthread_mutex_lock(&pg->mu);
    job_list_t due = pg->done;
    pg->done = (job_list_t){0};
    pthread_mutex_unlock(&pg->mu);
    job_t *j;
    while ((j = list_pop(&due))) {
        j->done(j->ud, j->rc, j->rc == 0 ? j->value : NULL);
        job_free(j);
    }
}

static void on_async(uv_async_t *a)
{
    deliver(a->data);
}

int mg_pg_open(const char *url, int pool_size, int queue_max, mg_pg_t **out, char *err,
               size_t errlen)
{
    *out = NULL;
    if (!url || !*url) {
        snprintf(err, errlen, "postgres: no url");
        return -1;
    }
    mg_pg_t *pg = calloc(1, sizeof(*pg));
    if (!pg || !(pg->url = strdup(url))) {
        free(pg);
        snprintf(err, errlen, "postgres: out of memory");
        return -1;
    }
    pg->queue_max = queue_max > 0 ? (size_t)queue_max : MG_PG_QUEUE_MAX_DEFAULT;
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    int want = pool_size > 0 ? pool_size : 1;
    pg->threads = calloc((size_t)want, sizeof(pthread_t));
    while (pg->threads && pg->nthreads < want &&
           pthread_create(&pg->threads[pg->nthreads], NULL, pg_main, pg) == 0)
        pg->nthreads++;
    if (pg->nthreads == 0) {
        pthread_cond_destroy(&pg->cv);
        pthread_mutex_destroy(&pg->mu);
        free(pg->threads);
        free(pg->url);
        free(pg);
        snprintf(err, errlen, "postgres: cannot start its threads");
        return -1;
    }
    *out = pg;
    return 0;
}

static void on_async_closed(uv_handle_t *h)
{
    free(h);
}

int mg_pg_attach(mg_pg_t *pg, uv_loop_t *loop)
{
    uv_async_t *a = malloc(sizeof(*a));
    if (!a) return UV_ENOMEM;
    int rc = uv_async_init(loop, a, on_async);
    if (rc != 0) {
        free(a);
        return rc;
    }
    a->data = pg;
    uv_unref((uv_handle_t *)a);
    pthread_mutex_lock(&pg->mu);
    pg->async = a;
    pg->attached = 1;
    if (pg->done.head) uv_async_send(a);
    pthread_mutex_unlock(&pg->mu);
    return 0;
}

void mg_pg_detach(mg_pg_t *pg)
{
    if (!pg) return;
    pthread_mutex_lock(&pg->mu);
    int was = pg->attached;
    pg->attached = 0;
    pthread_mutex_unlock(&pg->mu);
    if (!was) return;
    uv_close((uv_handle_t *)pg->async, on_async_closed);
    pg->async = NULL;
}

int mg_pg_exec(mg_pg_t *pg, const char *sql, int nparams, const char *const *params, int durable,
               mg_pg_done_fn done, void *ud)
{
    if (!pg || !sql) return -1;
    job_t *j = job_new(sql, nparams, params, durable, done, ud);
    if (!j) return -1;
    pthread_mutex_lock(&pg->mu);
    if (pg->stopping || pg->queue.n >= pg->queue_max) {
        pg->st.refused_total++;
        pthread_mutex_unlock(&pg->mu);
        job_free(j);
        return -1;
    }
    if (!durable && !pg->st.connected) finish_locked(pg, j, -1); /* nobody waits for it */
    else list_push(&pg->queue, j);
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    return 0;
}

int mg_pg_query_sync(mg_pg_t *pg, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                     size_t errlen)
{
    PGconn *c = connect_to(pg->url);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, errlen, "PostgreSQL is unreachable");
        PQfinish(c);
        return -1;
    }
    PGresult *r = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
    ExecStatusType s = PQresultStatus(r);
    int rc = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK ? 0 : -1;
    if (rc != 0) {
        const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        snprintf(err, errlen, "PostgreSQL: %s", m ? m : "the statement failed");
    }
    int ncols = PQnfields(r);
    const char *cols[32];
    if (ncols > 32) ncols = 32;
    for (int i = 0; rc == 0 && cb && i < PQntuples(r); i++) {
        for (int k = 0; k < ncols; k++) cols[k] = PQgetisnull(r, i, k) ? NULL : PQgetvalue(r, i, k);
        cb(ud, ncols, cols);
    }
    PQclear(r);
    PQfinish(c);
    return rc;
}

int mg_pg_flush(mg_pg_t *pg, int timeout_ms)
{
    struct timespec until;
    deadline_in(&until, timeout_ms);
    pthread_mutex_lock(&pg->mu);
    int rc = 0;
    while ((pg->queue.head || pg->busy) && rc == 0)
        rc = pthread_cond_timedwait(&pg->cv, &pg->mu, &until);
    int empty = !pg->queue.head && !pg->busy;
    pthread_mutex_unlock(&pg->mu);
    return empty ? 0 : -1;
}

void mg_pg_stats(mg_pg_t *pg, mg_pg_stats_t *out)
{
    pthread_mutex_lock(&pg->mu);
    *out = pg->st;
    out->queued = pg->queue.n;
    pthread_mutex_unlock(&pg->mu);
}

void mg_pg_close(mg_pg_t *pg)
{
    if (!pg) return;
    pthread_mutex_lock(&pg->mu);
    int connected = pg->st.connected;
    pthread_mutex_unlock(&pg->mu);
    if (connected) mg_pg_flush(pg, 2000);
    mg_pg_detach(pg);
    pthread_mutex_lock(&pg->mu);
    pg->stopping = 1;
    size_t lost = pg->queue.n;
    job_t *j;
    while ((j = list_pop(&pg->queue))) finish_locked(pg, j, -1);
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    if (lost) mg_log_msg(MG_LOG_ERROR, NULL, "postgres: %zu statements not written (lost)", lost);
    for (int i = 0; i < pg->nthreads; i++) pthread_join(pg->threads[i], NULL);
    free(pg->threads);
    deliver(pg);
    pthread_cond_destroy(&pg->cv);
    pthread_mutex_destroy(&pg->mu);
    free(pg->url);
    free(pg);
}
