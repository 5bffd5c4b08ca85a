/* store: the SQLite store's connections and its writer thread; see store.h (the schema's
 * migrations are store/schema.c).
 *
 * The write path (store.h says what it promises): jobs wait in a bounded FIFO guarded by
 * mu; the writer thread takes them all as one batch and commits it in one transaction,
 * retrying while the database is locked; jobs with a callback then move to the done list
 * and the uv_async handle wakes the loop, which runs the callbacks and hands over the
 * writes it parked while the FIFO was full. The parked list belongs to the loop thread
 * alone (it is touched only there, under mu for simplicity). The writer keeps its recent
 * statements prepared (a write is usually one of a few fixed texts), and it checkpoints the
 * WAL between batches, once the batch's callbacks are on their way: inside the COMMIT, as
 * SQLite does by default, the checkpoint's copying and fsync would delay every answer
 * waiting for that commit. Being the only writer, its checkpoint completes, so the WAL
 * restarts and stays bounded (a checkpoint on another thread, racing the writer's appends,
 * never catches up and lets the WAL grow without end). */
#include "store/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/log.h"
#include "store/journal.h"
#include "store/rowgroup.h"
#include "store/schema.h"

/* One queued write, in one allocation: the struct, the parameter array, then the SQL and
 * the parameters' text (a typed write: the values, then their text; its SQL is the
 * caller's literal). */
typedef struct write_job_s {
    struct write_job_s *next;
    const char *sql; /* in the job's allocation, or the caller's (vals) */
    int nparams;
    const char **params;        /* in the job's allocation; entries may be NULL */
    const mg_store_val_t *vals; /* instead of params: typed (mg_store_write_vals) */
    mg_store_done_fn done;      /* may be NULL */
    mg_store_rows_fn done_rows; /* instead of done: the outcome and the rows changed */
    void *ud;
    int nowait;   /* fails rather than waits for a full disk (mg_store_write_rows_nowait) */
    int rc;       /* the outcome, set by the writer */
    int64_t rows; /* rows the statement changed (sqlite3_changes), set by the writer */
    const mg_store_agg_t *agg; /* may be NULL: the roll-up that sums this write's row */
} write_job_t;

typedef struct {
    write_job_t *head, *tail;
    uint64_t n;
} job_list_t;

#define STMT_CACHE 8
/* WAL pages (4 KB) after which the writer checkpoints: 4x SQLite's default, since a
 * checkpoint's cost is mostly its two fsyncs, not the pages it copies (bench/README.md) */
#define CHECKPOINT_PAGES 4000

struct mg_store_s {
    mg_pg_t *pg;       /* borrowed: the cluster's PostgreSQL, NULL: none */
    char node_id[129]; /* this instance, in shared rows (MG_NODE_ID_MAX + 1) */
    sqlite3 *db;       /* migrations, then the writer thread's connection */
    struct {
        char *sql;       /* owned */
        const char *key; /* the text it was prepared from (compared as a pointer) */
        sqlite3_stmt *st;
    } stmts[STMT_CACHE];                /* the writer's prepared statements */
    int next_stmt;                      /* the slot replaced next */
    sqlite3_stmt *begin_st, *commit_st; /* the writer's BEGIN IMMEDIATE and COMMIT */
    struct {
        const mg_store_agg_t *agg;
        void *state;
    } aggs[MG_STORE_AGG_MAX];           /* the writer's roll-ups (mg_store_write_agg) */
    int64_t aggs_flush_at_ms;           /* when the pending roll-ups are written (writer thread) */
    const mg_store_agg_t *agg_register; /* mg_store_use_agg's, for the writer (under mu) */
    int agg_register_rc;
    unsigned long agg_sync_req, agg_sync_done; /* roll-up writes asked / done (under mu) */
    int wal_pages; /* the WAL's size after the writer's last commit (writer thread) */
    char *path;    /* owned */
    int version;
    int queue_max;
    int busy_wait_ms;
    pthread_t writer;
    int writer_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;               /* work queued or stopping */
    pthread_cond_t done_cv;          /* a batch committed */
    pthread_cond_t room_cv;          /* the queue has room (writers on other threads wait for it) */
    job_list_t queue;                /* guarded by mu; at most queue_max jobs, but see detach */
    job_list_t done;                 /* guarded by mu: finished jobs whose callbacks are due */
    job_list_t parked;               /* the loop thread's: writes waiting for room, in order */
    job_list_t corked;               /* the loop thread's: writes held by mg_store_cork */
    int corks;                       /* the loop thread's: mg_store_cork depth */
    unsigned long handed, committed; /* jobs handed to the writer / finished by it */
    int stopping;
    /* the loop the callbacks run on */
    uv_loop_t *loop;
    uv_async_t *async; /* the writer wakes the loop with it; owned, freed in its close
                          callback (it may outlive the store by a loop iteration) */
    int attached;      /* async is live (guarded by mu) */
    int loop_known;    /* loop_thread is set (attached once) */
    pthread_t loop_thread;
    mg_store_stats_t stats; /* guarded by mu; queued/parked filled in by mg_store_stats */
    sqlite3 *admin_db;      /* synchronous admin transactions; opened on first use */
    mg_store_txhook_t hook; /* around every admin transaction; begin NULL: none */
    mg_store_tx_t *tx;      /* the open admin transaction, or NULL */
    /* the journal (mg_store_use_journal): its records become writes of journal_sql */
    mg_journal_t *journal;
    const char *journal_sql;
    const mg_store_agg_t *journal_agg;
    int64_t journal_drain_at_ms; /* the writer's next drain (writer thread) */
    _Atomic int journal_woken;   /* the loop signalled the writer: more than half full */
    _Atomic uint64_t journaled_total, journal_fallback_total;
    /* the drain's multi-row INSERT (store/rowgroup.h), writer thread: prepared at the first
     * drain after the start's (journal_replayed); group_off when journal_sql has no such form */
    sqlite3_stmt *journal_group_st;
    mg_rowgroup_t *journal_group;
    int journal_group_off, journal_replayed;
};

struct mg_store_tx_s {
    mg_store_t *s; /* borrowed */
    sqlite3 *db;   /* borrowed: s->admin_db */
};

static void *writer_main(void *arg);
static void agg_turn(mg_store_t *s);
static int on_wal_commit(void *ud, sqlite3 *db, const char *name, int pages);

static int mkdir_parents(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0750) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

int mg_store_open_with(const char *path, const mg_store_opts_t *opts, mg_store_t **out, char *err,
                       size_t errlen)
{
    *out = NULL;
    if (mkdir_parents(path) != 0) {
        snprintf(err, errlen, "%s: cannot create its directory: %s", path, strerror(errno));
        return -1;
    }
    mg_store_t *s = calloc(1, sizeof(*s));
    if (!s) return -1;
    s->queue_max = opts && opts->queue_max > 0 ? opts->queue_max : MG_STORE_QUEUE_MAX_DEFAULT;
    s->busy_wait_ms = opts && opts->busy_wait_ms > 0 ? opts->busy_wait_ms : 250;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    pthread_cond_init(&s->room_cv, NULL);
    if (sqlite3_open_v2(path, &s->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, s->db ? sqlite3_errmsg(s->db) : "cannot open");
        mg_store_close(s);
        return -1;
    }
    /* migrations wait for a lock as long as admin transactions do; the writer thread's
       attempts wait busy_wait_ms each and are retried (writer_begin) */
    sqlite3_busy_timeout(s->db, 5000);
    const char *pragmas =
        opts && opts->synchronous_full
            ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;"
            : "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;";
    if (mg_sqlite_exec(s->db, pragmas, err, errlen) != 0 ||
        (s->version = mg_schema_migrate(s->db, err, errlen)) < 0) {
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s", err);
        snprintf(err, errlen, "%s: %s", path, tmp);
        mg_store_close(s);
        return -1;
    }
    sqlite3_busy_timeout(s->db, s->busy_wait_ms);
    sqlite3_wal_hook(s->db, on_wal_commit, s);
    s->path = strdup(path);
    if (!s->path || pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        snprintf(err, errlen, "%s: cannot start the writer thread", path);
        mg_store_close(s);
        return -1;
    }
    s->writer_running = 1;
    *out = s;
    return 0;
}

int mg_store_open(const char *path, mg_store_t **out, char *err, size_t errlen)
{
    return mg_store_open_with(path, NULL, out, err, errlen);
}

/* ---- jobs and lists ----------------------------------------------------------------- */

static write_job_t *job_new(const char *sql, int nparams, const char *const *params,
                            mg_store_done_fn done, void *ud)
{
    size_t sl = strlen(sql) + 1, size = sizeof(write_job_t) + (size_t)nparams * sizeof(char *) + sl;
    for (int i = 0; i < nparams; i++)
        if (params[i]) size += strlen(params[i]) + 1;
    write_job_t *j = malloc(size);
    if (!j) return NULL;
    memset(j, 0, sizeof(*j));
    j->params = (const char **)(j + 1);
    char *text = (char *)(j->params + nparams);
    memcpy(text, sql, sl);
    j->sql = text;
    text += sl;
    for (int i = 0; i < nparams; i++) {
        if (!params[i]) {
            j->params[i] = NULL;
            continue;
        }
        size_t n = strlen(params[i]) + 1;
        memcpy(text, params[i], n);
        j->params[i] = text;
        text += n;
    }
    j->nparams = nparams;
    j->done = done;
    j->ud = ud;
    return j;
}

/* A typed write's job: the values and their text are copied, the SQL is not. */
static write_job_t *job_new_vals(const char *sql, int nparams, const mg_store_val_t *vals,
                                 mg_store_done_fn done, void *ud)
{
    size_t size = sizeof(write_job_t) + (size_t)nparams * sizeof(mg_store_val_t);
    size_t len[nparams > 0 ? nparams : 1];
    for (int i = 0; i < nparams; i++) {
        len[i] = vals[i].kind == MG_STORE_TEXT && vals[i].s ? strlen(vals[i].s) + 1 : 0;
        size += len[i];
    }
    write_job_t *j = malloc(size);
    if (!j) return NULL;
    memset(j, 0, sizeof(*j));
    mg_store_val_t *v = (mg_store_val_t *)(j + 1);
    char *text = (char *)(v + nparams);
    for (int i = 0; i < nparams; i++) {
        v[i] = vals[i];
        if (v[i].kind == MG_STORE_TEXT && !v[i].s) v[i].kind = MG_STORE_NULL;
        if (!len[i]) continue;
        memcpy(text, vals[i].s, len[i]);
        v[i].s = text;
        text += len[i];
    }
    j->sql = sql;
    j->vals = v;
    j->nparams = nparams;
    j->done = done;
    j->ud = ud;
    return j;
}

static void list_push(job_list_t *l, write_job_t *j)
{
    j->next = NULL;
    if (l->tail) l->tail->next = j;
    else l->head = j;
    l->tail = j;
    l->n++;
}

static write_job_t *list_pop(job_list_t *l)
{
    write_job_t *j = l->head;
    if (!j) return NULL;
    l->head = j->next;
    if (!l->head) l->tail = NULL;
    l->n--;
    j->next = NULL;
    return j;
}

/* Everything of l, leaving it empty. */
static job_list_t list_take(job_list_t *l)
{
    job_list_t all = *l;
    memset(l, 0, sizeof(*l));
    return all;
}

/* Run the callbacks of a finished list in order and free its jobs. */
static void deliver(job_list_t *l)
{
    write_job_t *j;
    while ((j = list_pop(l))) {
        if (j->done_rows) j->done_rows(j->ud, j->rc, j->rc ? 0 : j->rows);
        else if (j->done) j->done(j->ud, j->rc);
        free(j);
    }
}

/* ---- the writer thread -------------------------------------------------------------- */

static int is_busy(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED;
}

/* The database stayed locked for one more attempt: count it, and say so every 5 s. */
static void note_busy(mg_store_t *s, const char *what, uint64_t since_ns, uint64_t *logged_ns)
{
    uint64_t now = uv_hrtime();
    pthread_mutex_lock(&s->mu);
    s->stats.busy_retries_total++;
    pthread_mutex_unlock(&s->mu);
    if (now - *logged_ns >= 5000000000ull) {
        *logged_ns = now;
        mg_log_msg(MG_LOG_WARN, NULL,
                   "store: the database is locked by another connection (%s waited %llu ms);"
                   " the writes wait, none is dropped",
                   what, (unsigned long long)((now - since_ns) / 1000000));
    }
}

/* Run the prepared BEGIN IMMEDIATE or COMMIT (*st, prepared from sql on first use) until it
 * is not refused for a lock: each attempt waits busy_wait_ms in SQLite's busy handler.
 * Returns the final SQLite code (SQLITE_OK when it ran). */
static int exec_until_unlocked(mg_store_t *s, sqlite3_stmt **st, const char *sql)
{
    if (!*st &&
        sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) != SQLITE_OK)
        return sqlite3_errcode(s->db);
    uint64_t since = uv_hrtime(), logged = 0;
    for (;;) {
        int rc = sqlite3_step(*st);
        sqlite3_reset(*st);
        if (rc == SQLITE_DONE || rc == SQLITE_ROW) return SQLITE_OK;
        if (!is_busy(rc)) return rc;
        note_busy(s, sql, since, &logged);
    }
}

/* ---- roll-ups summed in C (mg_store_write_agg) ---- */

/* The writer's state for agg, created on first use; NULL when out of memory or all slots
 * are taken (the batch then rolls back: its rows would miss their sums). */
static void *agg_state(mg_store_t *s, const mg_store_agg_t *agg)
{
    for (int i = 0; i < MG_STORE_AGG_MAX; i++) {
        if (s->aggs[i].agg == agg) return s->aggs[i].state;
        if (s->aggs[i].agg) continue;
        void *state = agg->create();
        if (!state) return NULL;
        s->aggs[i].agg = agg;
        s->aggs[i].state = state;
        return state;
    }
    mg_log_msg(MG_LOG_ERROR, NULL, "store: more than %d roll-ups", MG_STORE_AGG_MAX);
    return NULL;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void aggs_committed(mg_store_t *s)
{
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        s->aggs[i].agg->committed(s->aggs[i].state);
}

static int aggs_dirty(const mg_store_t *s)
{
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        if (s->aggs[i].agg->dirty(s->aggs[i].state)) return 1;
    return 0;
}

/* Write the pending roll-ups in one transaction of their own (writer thread); on failure
 * they stay pending and the next try is a second later. */
static int aggs_write(mg_store_t *s)
{
    s->aggs_flush_at_ms = now_ms() + MG_STORE_AGG_FLUSH_MS;
    if (!aggs_dirty(s)) return 0;
    if (exec_until_unlocked(s, &s->begin_st, "BEGIN IMMEDIATE") != SQLITE_OK) goto fail;
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        if (s->aggs[i].agg->flush(s->aggs[i].state, s->db) != 0) goto fail;
    if (exec_until_unlocked(s, &s->commit_st, "COMMIT") != SQLITE_OK) goto fail;
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        s->aggs[i].agg->flushed(s->aggs[i].state);
    return 0;
fail:
    mg_log_msg(MG_LOG_ERROR, NULL, "store: the roll-ups were not written (%s); retrying",
               sqlite3_errmsg(s->db));
    if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

/* mg_store_use_agg's work on the writer thread: the state, its recovery, its flush. */
static int agg_register(mg_store_t *s, const mg_store_agg_t *agg)
{
    void *state = agg_state(s, agg);
    if (!state) return -1;
    if (agg->recover(state, s->db) != 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: cannot recover a roll-up: %s",
                   sqlite3_errmsg(s->db));
        return -1;
    }
    return aggs_write(s);
}

static void aggs_reset(mg_store_t *s)
{
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        s->aggs[i].agg->reset(s->aggs[i].state);
}

static void aggs_destroy(mg_store_t *s)
{
    for (int i = 0; i < MG_STORE_AGG_MAX && s->aggs[i].agg; i++)
        s->aggs[i].agg->destroy(s->aggs[i].state);
}

/* One write inside the open transaction: 0, MG_STORE_ECONSTRAINT or MG_STORE_ERROR. */
/* The writer's prepared statement for sql (kept in the cache), or NULL. */
static sqlite3_stmt *prepared(mg_store_t *s, const char *sql, int literal)
{
    for (int i = 0; literal && i < STMT_CACHE; i++) /* a typed write's literal: its pointer */
        if (s->stmts[i].key == sql) return s->stmts[i].st;
    for (int i = 0; i < STMT_CACHE; i++)
        if (s->stmts[i].sql && strcmp(s->stmts[i].sql, sql) == 0) return s->stmts[i].st;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: cannot prepare a write: %s", sqlite3_errmsg(s->db));
        return NULL;
    }
    char *copy = strdup(sql);
    if (!copy) return st; /* used once, then finalized by run_job */
    int slot = s->next_stmt;
    s->next_stmt = (slot + 1) % STMT_CACHE;
    sqlite3_finalize(s->stmts[slot].st);
    free(s->stmts[slot].sql);
    s->stmts[slot].sql = copy;
    /* a job's own copy dies with it (its address may come back with other text) */
    s->stmts[slot].key = literal ? sql : NULL;
    s->stmts[slot].st = st;
    return st;
}

static int is_cached(const mg_store_t *s, const sqlite3_stmt *st)
{
    for (int i = 0; i < STMT_CACHE; i++)
        if (s->stmts[i].st == st) return 1;
    return 0;
}

/* The values of one typed write bound to st as its parameters first + 1 to first + n (text as
 * SQLITE_STATIC: valid until the step). */
static void bind_vals_at(sqlite3_stmt *st, int first, int n, const mg_store_val_t *vals)
{
    for (int i = 0; i < n; i++) {
        const mg_store_val_t *v = &vals[i];
        int at = first + i + 1;
        if (v->kind == MG_STORE_INT) sqlite3_bind_int64(st, at, v->i);
        else if (v->kind == MG_STORE_REAL) sqlite3_bind_double(st, at, v->d);
        else if (v->kind == MG_STORE_TEXT && v->s)
            sqlite3_bind_text(st, at, v->s, -1, SQLITE_STATIC);
        else sqlite3_bind_null(st, at);
    }
}

static void bind_vals(sqlite3_stmt *st, int n, const mg_store_val_t *vals)
{
    bind_vals_at(st, 0, n, vals);
}

static int run_job(mg_store_t *s, write_job_t *j)
{
    sqlite3 *db = s->db;
    sqlite3_stmt *st = prepared(s, j->sql, j->vals != NULL);
    if (!st) return MG_STORE_ERROR;
    if (j->vals) bind_vals(st, j->nparams, j->vals);
    for (int i = 0; !j->vals && i < j->nparams; i++) {
        if (j->params[i]) sqlite3_bind_text(st, i + 1, j->params[i], -1, SQLITE_STATIC);
        else sqlite3_bind_null(st, i + 1);
    }
    int step = sqlite3_step(st), rc = 0;
    if (step != SQLITE_DONE && step != SQLITE_ROW) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: write failed: %s", sqlite3_errmsg(db));
        rc = (step & 0xff) == SQLITE_CONSTRAINT ? MG_STORE_ECONSTRAINT : MG_STORE_ERROR;
    }
    j->rows = rc ? 0 : (int64_t)sqlite3_changes(db);
    if (is_cached(s, st)) {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st); /* the parameters die with the job */
    } else {
        sqlite3_finalize(st);
    }
    return rc;
}

/* The writer's last failure was the disk (or its quota) full. */
static int disk_is_full(mg_store_t *s)
{
    int e = sqlite3_extended_errcode(s->db);
    return (e & 0xff) == SQLITE_FULL || e == SQLITE_IOERR_WRITE || e == SQLITE_IOERR_FSYNC ||
           e == SQLITE_IOERR_TRUNCATE;
}

/* One attempt at the batch as one transaction. Returns 0 when committed (each job's rc
 * says whether its statement ran), -1 when nothing of it is in the database, -2 when that is
 * because the disk is full. */
static int try_batch(mg_store_t *s, write_job_t *batch, char *why, size_t whylen)
{
    int rc = exec_until_unlocked(s, &s->begin_st, "BEGIN IMMEDIATE");
    if (rc != SQLITE_OK) {
        snprintf(why, whylen, "BEGIN: %s", sqlite3_errmsg(s->db));
        return disk_is_full(s) ? -2 : -1;
    }
    aggs_reset(s);
    for (write_job_t *j = batch; j; j = j->next) {
        j->rc = run_job(s, j);
        /* an I/O error, a full disk or memory may roll the whole transaction back */
        if (j->rc != 0 && (sqlite3_get_autocommit(s->db) || disk_is_full(s))) {
            snprintf(why, whylen, "the transaction was rolled back: %s", sqlite3_errmsg(s->db));
            int full = disk_is_full(s);
            if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
            return full ? -2 : -1;
        }
        if (j->agg && j->rc == 0 && j->rows > 0) {
            void *state = agg_state(s, j->agg);
            if (!state) {
                snprintf(why, whylen, "no memory for a roll-up");
                goto rollback;
            }
            j->agg->add(state, (int64_t)sqlite3_last_insert_rowid(s->db), j->nparams, j->vals);
        }
    }
    if (exec_until_unlocked(s, &s->commit_st, "COMMIT") == SQLITE_OK) {
        if (!aggs_dirty(s)) s->aggs_flush_at_ms = now_ms() + MG_STORE_AGG_FLUSH_MS;
        aggs_committed(s);
        return 0;
    }
    snprintf(why, whylen, "COMMIT: %s", sqlite3_errmsg(s->db));
rollback:;
    int full = disk_is_full(s); /* SQLITE_FULL from any statement of the batch */
    if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return full ? -2 : -1;
}

/* Under mu: the disk is full, and the writes of l must not keep their requests waiting.
 * A write with a callback (mg_store_done_fn) is held in memory and lands when the disk has
 * room: its callback is due now, rc 0 (durability is waived while full, and said so). A
 * write that may not wait (nowait) leaves l and fails, MG_STORE_EFULL: it never ran. A
 * write whose caller needs its rows still waits. `handed`: l's writes count as handed to
 * the writer (the queue, the batch), so the ones that leave count as finished. */
static void spare_waiters(mg_store_t *s, job_list_t *l, int handed)
{
    job_list_t keep = {0};
    write_job_t *j;
    while ((j = list_pop(l))) {
        if (j->nowait) {
            j->rc = MG_STORE_EFULL;
            j->rows = 0;
            list_push(&s->done, j);
            s->stats.failed_total++;
            if (handed) s->committed++;
            continue;
        }
        write_job_t *early = j->done ? calloc(1, sizeof(*early)) : NULL;
        if (early) { /* without memory it simply waits for the commit */
            early->done = j->done;
            early->ud = j->ud;
            j->done = NULL;
            list_push(&s->done, early);
        }
        list_push(&keep, j);
    }
    *l = keep;
}

/* The writer committed a batch: if the disk was full, it is no longer (said before the flag
 * clears, so whoever sees it clear finds the line). */
static void room_again(mg_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    int was = s->stats.disk_full;
    pthread_mutex_unlock(&s->mu);
    if (!was) return;
    mg_log_msg(MG_LOG_WARN, NULL, "store: the disk has room again; the held writes are committed");
    pthread_mutex_lock(&s->mu);
    s->stats.disk_full = 0;
    pthread_mutex_unlock(&s->mu);
}

/* The disk is full: hold the batch (it stays whole, in order, but for its writes that may
 * not wait; the queue behind it fills and the loop's writes park, within their bounds) and
 * try it again every second until it commits, or the store stops (then its writes are lost,
 * and said so). The requests waiting for these writes, and for the ones queued while full
 * (submit), go on at once (spare_waiters). 0 when committed. */
static int hold_while_full(mg_store_t *s, job_list_t *batch, char *why, size_t whylen)
{
    pthread_mutex_lock(&s->mu);
    s->stats.disk_full = 1;
    s->stats.disk_full_episodes_total++;
    spare_waiters(s, batch, 1);
    spare_waiters(s, &s->queue, 1);
    spare_waiters(s, &s->parked, 0);
    spare_waiters(s, &s->corked, 0);
    pthread_cond_broadcast(&s->done_cv); /* mg_store_flush: the failed writes are finished */
    if (s->attached) uv_async_send(s->async);
    pthread_mutex_unlock(&s->mu);
    mg_log_msg(MG_LOG_ERROR, NULL,
               "store: the disk is full (%s); holding the writes in memory until it has room", why);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        int w = 0; /* cv also wakes for every write queued: wait the whole second */
        while (!s->stopping && w != ETIMEDOUT) w = pthread_cond_timedwait(&s->cv, &s->mu, &until);
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (!batch->head) { /* nothing left to hold: the next batch finds out again */
            pthread_mutex_lock(&s->mu);
            s->stats.disk_full = 0;
            pthread_mutex_unlock(&s->mu);
            return 0;
        }
        int rc = try_batch(s, batch->head, why, whylen);
        if (rc == 0) return 0;
        if (stopping || rc == -1) {
            pthread_mutex_lock(&s->mu);
            s->stats.disk_full = 0;
            pthread_mutex_unlock(&s->mu);
            mg_log_msg(MG_LOG_ERROR, NULL, "store: the held writes are lost (%s)", why);
            return -1;
        }
    }
}

/* Commit the batch, retrying while locked (exec_until_unlocked), while the disk is full
 * (hold_while_full) and three times after any other failure; then its writes fail. */
static void commit_batch(mg_store_t *s, job_list_t *batch)
{
    char why[256] = "";
    for (int attempt = 0; attempt < 4; attempt++) {
        if (attempt) {
            struct timespec pause = {0, 100 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        int rc = try_batch(s, batch->head, why, sizeof(why));
        if (rc == -2) rc = hold_while_full(s, batch, why, sizeof(why)) == 0 ? 0 : -2;
        if (rc == 0) {
            if (batch->head) room_again(s);
            return;
        }
        if (rc == -2) break;
        mg_log_msg(MG_LOG_ERROR, NULL, "store: a batch of writes did not commit (%s)%s", why,
                   attempt < 3 ? "; retrying" : "; its writes are lost");
    }
    for (write_job_t *j = batch->head; j; j = j->next) j->rc = MG_STORE_ERROR;
}

/* A batch is over: count it, pass the jobs with callbacks to the loop, free the rest. */
static void batch_finished(mg_store_t *s, job_list_t *batch)
{
    uint64_t n = batch->n, failed = 0;
    write_job_t *j;
    pthread_mutex_lock(&s->mu);
    while ((j = list_pop(batch))) {
        if (j->rc) failed++;
        if (j->done || j->done_rows) list_push(&s->done, j);
        else free(j);
    }
    s->committed += n;
    s->stats.writes_total += n - failed;
    s->stats.failed_total += failed;
    if (failed < n) s->stats.batches_total++;
    if (n > s->stats.largest_batch) s->stats.largest_batch = n;
    pthread_cond_broadcast(&s->done_cv);
    if (s->attached) uv_async_send(s->async); /* the callbacks, and room for parked writes */
    pthread_mutex_unlock(&s->mu);
}

/* ---- checkpoints, between the writer's batches ---- */

/* After each commit of the writer (SQLite's WAL hook, on the writer thread): note the WAL's
 * size. Replaces SQLite's automatic checkpoint, which would run inside the COMMIT. */
static int on_wal_commit(void *ud, sqlite3 *db, const char *name, int pages)
{
    mg_store_t *s = ud;
    (void)db;
    (void)name;
    s->wal_pages = pages;
    return SQLITE_OK;
}

/* Between batches, past CHECKPOINT_PAGES: copy the WAL into the database (PASSIVE: a reader
 * may keep the last frames; the next checkpoint gets them). */
static void checkpoint_if_due(mg_store_t *s)
{
    if (s->wal_pages < CHECKPOINT_PAGES) return;
    s->wal_pages = 0;
    if (sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL) != SQLITE_OK)
        mg_log_msg(MG_LOG_WARN, NULL, "store: checkpoint: %s", sqlite3_errmsg(s->db));
}

/* Under mu, on the writer: is it the roll-ups' turn before the next batch? */
static int aggs_due(mg_store_t *s)
{
    return s->agg_sync_req != s->agg_sync_done ||
           (aggs_dirty(s) && now_ms() >= s->aggs_flush_at_ms);
}

/* ---- the journal's drain (writer thread) ---- */

/* A drain's commit rewrites the right edge's partial pages and pays its BEGIN/COMMIT and WAL
 * writes once, so at a low rate the period sets their share per event (bench/README.md); a
 * busy gateway drains on half full before it. Readers through the store's API never wait
 * for it (a roll-up turn drains first). */
#define JOURNAL_DRAIN_MS 250
#define JOURNAL_BATCH 4096

static void journal_job(void *ud, int n, const mg_store_val_t *v)
{
    mg_store_t *s = ((void **)ud)[0];
    job_list_t *batch = ((void **)ud)[1];
    write_job_t *j = job_new_vals(s->journal_sql, n, v, NULL, NULL);
    if (!j) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: a journal record could not be read (no memory)");
        return;
    }
    j->agg = s->journal_agg;
    list_push(batch, j);
}

/* A drain's direct pass: its statements, its roll-up's state, what it did. */
typedef struct {
    mg_store_t *s;
    sqlite3_stmt *st;
    sqlite3_stmt *group_st; /* the multi-row statement and its rows, or NULL: row by row */
    mg_rowgroup_t *group;
    void *state; /* journal_agg's, or NULL when there is none */
    uint64_t n, grouped;
    int failed;      /* a statement failed: the pass rolls back and the job path takes over */
    const char *why; /* the failure when it is not SQLite's error */
} drain_pass_t;

/* One record, bound from its values (the ring's bytes, valid during the read's call, or
 * the group's copy) and run at once; a row the INSERT OR IGNORE really inserted is summed,
 * a replayed one is not. */
static void insert_one(drain_pass_t *d, int n, const mg_store_val_t *v)
{
    bind_vals(d->st, n, v);
    int step = sqlite3_step(d->st);
    int inserted = sqlite3_changes(d->s->db) > 0;
    int64_t rowid = (int64_t)sqlite3_last_insert_rowid(d->s->db);
    sqlite3_reset(d->st);
    /* the ring's bytes are not ours past this call: a record that binds every parameter
     * leaves none of the last one's; the pass clears what is left at its end */
    if (n != sqlite3_bind_parameter_count(d->st)) sqlite3_clear_bindings(d->st);
    if (step != SQLITE_DONE && step != SQLITE_ROW) {
        d->failed = 1;
        return;
    }
    if (d->state && inserted) d->s->journal_agg->add(d->state, rowid, n, v);
    d->n++;
}

/* A full group's rows in one statement. Each must be new: which row of a multi-row INSERT
 * OR IGNORE was the ignored one is not told, so a repeated row fails the pass and the
 * records go by the job path, which sums only the rows really inserted (only a start's
 * replay repeats rows, and that drain goes row by row). */
static void insert_group(drain_pass_t *d)
{
    mg_rowgroup_t *g = d->group;
    for (int r = 0; r < g->rows; r++)
        bind_vals_at(d->group_st, r * g->nparams, g->nparams, g->vals[r]);
    int step = sqlite3_step(d->group_st);
    int inserted = sqlite3_changes(d->s->db);
    int64_t rowid = (int64_t)sqlite3_last_insert_rowid(d->s->db);
    sqlite3_reset(d->group_st);
    if ((step != SQLITE_DONE && step != SQLITE_ROW) || inserted != g->rows) {
        d->failed = 1;
        if (step == SQLITE_DONE) d->why = "a row of a group is already stored";
        return;
    }
    /* the roll-ups keep the last rowid summed as their watermark: the group's last serves */
    for (int r = 0; d->state && r < g->rows; r++)
        d->s->journal_agg->add(d->state, rowid, g->nparams, g->vals[r]);
    d->n += (uint64_t)g->rows;
    d->grouped += (uint64_t)g->rows;
    mg_rowgroup_clear(g);
}

/* The rows held, fewer than a group: one by one. */
static void insert_held(drain_pass_t *d)
{
    mg_rowgroup_t *g = d->group;
    for (int r = 0; r < g->rows && !d->failed; r++) insert_one(d, g->nparams, g->vals[r]);
    mg_rowgroup_clear(g);
}

/* One record of the drain: gathered into the group (inserted once it is full), or alone. */
static void journal_row(void *ud, int n, const mg_store_val_t *v)
{
    drain_pass_t *d = ud;
    if (d->failed) return;
    if (!d->group) {
        insert_one(d, n, v);
        return;
    }
    if (!mg_rowgroup_add(d->group, n, v)) {
        /* the rows held go first (the table keeps the journal's order), then this one: into
         * the emptied group, or alone when it never fits one */
        insert_held(d);
        if (d->failed) return;
        if (!mg_rowgroup_add(d->group, n, v)) {
            insert_one(d, n, v);
            return;
        }
    }
    if (d->group->rows == MG_ROWGROUP_ROWS) insert_group(d);
}

/* The drain's multi-row statement for `one`'s SQL, prepared once, or NULL (row by row):
 * not before the start's replay is done (a replay repeats rows, which a group cannot
 * insert), nor when the SQL has no multi-row form. */
static sqlite3_stmt *group_statement(mg_store_t *s, sqlite3_stmt *one)
{
    if (s->journal_group_st || s->journal_group_off || !s->journal_replayed)
        return s->journal_group_st;
    int nparams = sqlite3_bind_parameter_count(one);
    char *sql = mg_rowgroup_sql(s->journal_sql, nparams, MG_ROWGROUP_ROWS);
    s->journal_group = sql ? malloc(sizeof(*s->journal_group)) : NULL;
    if (!s->journal_group || sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                                                &s->journal_group_st, NULL) != SQLITE_OK) {
        mg_log_msg(MG_LOG_INFO, NULL, "store: the journal's drain inserts row by row (%s)",
                   sql ? sqlite3_errmsg(s->db) : "its INSERT has no multi-row form");
        sqlite3_finalize(s->journal_group_st);
        s->journal_group_st = NULL;
        free(s->journal_group);
        s->journal_group = NULL;
        s->journal_group_off = 1;
    } else {
        mg_rowgroup_init(s->journal_group, nparams);
    }
    free(sql);
    return s->journal_group_st;
}

/* The common case of a drain: up to JOURNAL_BATCH records bound straight from the ring in
 * one transaction (no job, no copy per record). 0 and *pos (release it: committed), or -1
 * and nothing of it in the database (the roll-ups' adds discarded): the caller reads the
 * same records again as jobs, whose path keeps each failure's own handling (a constraint,
 * a lock, a full disk). */
static int drain_direct(mg_store_t *s, uint64_t *pos)
{
    drain_pass_t d = {s, prepared(s, s->journal_sql, 1), NULL, NULL, NULL, 0, 0, 0, NULL};
    if (!d.st || !is_cached(s, d.st)) {
        if (d.st) sqlite3_finalize(d.st);
        return -1;
    }
    if ((d.group_st = group_statement(s, d.st))) d.group = s->journal_group;
    if (s->journal_agg && !(d.state = agg_state(s, s->journal_agg))) return -1;
    if (exec_until_unlocked(s, &s->begin_st, "BEGIN IMMEDIATE") != SQLITE_OK) goto fail;
    aggs_reset(s);
    *pos = mg_journal_read(s->journal, JOURNAL_BATCH, journal_row, &d);
    if (d.group && !d.failed) insert_held(&d);
    sqlite3_clear_bindings(d.st);
    if (d.group_st) sqlite3_clear_bindings(d.group_st);
    if (d.failed || exec_until_unlocked(s, &s->commit_st, "COMMIT") != SQLITE_OK) goto fail;
    if (!aggs_dirty(s)) s->aggs_flush_at_ms = now_ms() + MG_STORE_AGG_FLUSH_MS;
    aggs_committed(s);
    pthread_mutex_lock(&s->mu);
    /* counted as batch_finished counts a batch; no callback is due, no queue room freed:
     * the loop is not woken */
    s->handed += d.n;
    s->committed += d.n;
    s->stats.writes_total += d.n;
    s->stats.journal_grouped_total += d.grouped;
    if (d.n) s->stats.batches_total++;
    if (d.n > s->stats.largest_batch) s->stats.largest_batch = d.n;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
fail:
    mg_log_msg(MG_LOG_WARN, NULL, "store: a journal drain is retried record by record (%s)",
               d.why ? d.why : sqlite3_errmsg(s->db));
    if (!sqlite3_get_autocommit(s->db)) sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    aggs_reset(s);
    if (d.group) mg_rowgroup_clear(d.group);
    return -1;
}

/* The same records as the jobs the queue would have had (drain_direct failed): one
 * transaction through commit_batch, with its retries and its hold while the disk is full. */
static uint64_t drain_jobs(mg_store_t *s)
{
    job_list_t batch = {0};
    void *ud[2] = {s, &batch};
    uint64_t pos = mg_journal_read(s->journal, JOURNAL_BATCH, journal_job, ud);
    if (batch.n) {
        pthread_mutex_lock(&s->mu);
        s->handed += batch.n;
        pthread_mutex_unlock(&s->mu);
        commit_batch(s, &batch);
        batch_finished(s, &batch);
    }
    return pos;
}

/* The journal's records become rows, one transaction per JOURNAL_BATCH records, released
 * from the ring once committed (a record read twice after a crash is a replay: INSERT OR
 * IGNORE and the roll-ups skip it). */
static void journal_drain(mg_store_t *s)
{
    if (!s->journal) return;
    atomic_store(&s->journal_woken, 0);
    s->journal_drain_at_ms = now_ms() + JOURNAL_DRAIN_MS;
    while (mg_journal_used(s->journal) > 0) {
        uint64_t pos;
        if (drain_direct(s, &pos) != 0) pos = drain_jobs(s);
        checkpoint_if_due(s);
        mg_journal_release(s->journal, pos);
    }
    s->journal_replayed = 1; /* the first drain was the start's: what a kill left is in */
}

/* Under mu, on the writer: is it the journal's turn (its period passed with records in it,
 * or the loop found it more than half full)? */
static int journal_due(mg_store_t *s)
{
    if (!s->journal || !mg_journal_used(s->journal)) return 0;
    return atomic_load(&s->journal_woken) || now_ms() >= s->journal_drain_at_ms;
}

/* Under mu: wait for work, the roll-ups' second or the journal's period. */
static void writer_wait(mg_store_t *s)
{
    int64_t at_ms = aggs_dirty(s) ? s->aggs_flush_at_ms : INT64_MAX;
    if (s->journal) {
        if (s->journal_drain_at_ms <= now_ms())
            s->journal_drain_at_ms = now_ms() + JOURNAL_DRAIN_MS; /* it was empty */
        if (s->journal_drain_at_ms < at_ms) at_ms = s->journal_drain_at_ms;
    }
    if (at_ms == INT64_MAX) {
        pthread_cond_wait(&s->cv, &s->mu);
        return;
    }
    struct timespec at = {at_ms / 1000, at_ms % 1000 * 1000000};
    pthread_cond_timedwait(&s->cv, &s->mu, &at);
}

/* The writer: take everything queued, commit it as one transaction, repeat; when stopping,
 * only once the queue is empty. */
static void *writer_main(void *arg)
{
    mg_store_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->queue.head && !s->stopping && !aggs_due(s) && !journal_due(s)) writer_wait(s);
        if (journal_due(s) && !s->stopping) {
            pthread_mutex_unlock(&s->mu);
            journal_drain(s);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        if (aggs_due(s) || !s->queue.head) {
            /* the roll-ups' turn: registration, sync, the second's flush, or the close */
            const mg_store_agg_t *reg = s->agg_register;
            unsigned long req = s->agg_sync_req;
            s->agg_register = NULL;
            pthread_mutex_unlock(&s->mu);
            journal_drain(s); /* a sync, a flush, the close and the start see its records */
            int rc = reg ? agg_register(s, reg) : aggs_write(s);
            pthread_mutex_lock(&s->mu);
            if (reg) s->agg_register_rc = rc;
            s->agg_sync_done = req;
            pthread_cond_broadcast(&s->done_cv);
            if (!s->queue.head && s->stopping) break;
            continue;
        }
        job_list_t batch = list_take(&s->queue);
        pthread_cond_broadcast(&s->room_cv);
        pthread_mutex_unlock(&s->mu);
        commit_batch(s, &batch);
        batch_finished(s, &batch); /* its callbacks are on their way */
        checkpoint_if_due(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- queueing ----------------------------------------------------------------------- */

/* Under mu: the job goes to the writer; the caller signals cv (after unlocking mu, when it
 * can: a writer woken under the lock would wake only to wait for it, two switches instead
 * of one, the second on the loop's unlock). */
static void queue_job(mg_store_t *s, write_job_t *j)
{
    list_push(&s->queue, j);
    s->handed++;
}

static void hand_over(mg_store_t *s, write_job_t *j)
{
    queue_job(s, j);
    pthread_cond_signal(&s->cv);
}

/* Under mu, on the loop thread: parked writes move to the queue while it has room (all of
 * them when `all`). */
static void unpark(mg_store_t *s, int all)
{
    while (s->parked.head && (all || s->queue.n < (uint64_t)s->queue_max))
        hand_over(s, list_pop(&s->parked));
}

/* While the disk is full, writes park on the loop up to this many, then are refused. */
#define PARKED_MAX_WHILE_FULL 65536

static int on_loop_thread(const mg_store_t *s)
{
    return s->loop_known && pthread_equal(pthread_self(), s->loop_thread);
}

static int submit(mg_store_t *s, write_job_t *j)
{
    pthread_mutex_lock(&s->mu);
    if (s->stopping || !s->writer_running) {
        pthread_mutex_unlock(&s->mu);
        free(j);
        return -1;
    }
    if (s->stats.disk_full && j->nowait) { /* it may not wait for the disk */
        s->stats.refused_while_full_total++;
        pthread_mutex_unlock(&s->mu);
        free(j);
        return MG_STORE_EFULL;
    }
    if (s->stats.disk_full && (!on_loop_thread(s) || s->parked.n >= PARKED_MAX_WHILE_FULL)) {
        s->stats.refused_while_full_total++; /* bounded memory: refused, not queued */
        pthread_mutex_unlock(&s->mu);
        free(j);
        return -1;
    }
    if (s->stats.disk_full && j->done) { /* held in memory: its request goes on now */
        job_list_t one = {0};
        list_push(&one, j);
        spare_waiters(s, &one, 0);
        if (s->attached) uv_async_send(s->async);
    }
    if (on_loop_thread(s) && s->corks) {
        list_push(&s->corked, j); /* handed over with the others at mg_store_uncork */
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    if (on_loop_thread(s)) {
        int queued = 0;
        if (s->attached && (s->parked.head || s->queue.n >= (uint64_t)s->queue_max))
            list_push(&s->parked, j); /* after the others: the order is kept */
        else
            queued = 1,
            queue_job(s, j); /* detached (shutdown): no more parking, the bound is waived */
        pthread_mutex_unlock(&s->mu);
        if (queued) pthread_cond_signal(&s->cv); /* the store outlives its loop's calls */
        return 0;
    }
    /* any other thread may wait for room */
    while (s->queue.n >= (uint64_t)s->queue_max && !s->stopping)
        pthread_cond_wait(&s->room_cv, &s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        free(j);
        return -1;
    }
    hand_over(s, j);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void mg_store_cork(mg_store_t *s)
{
    if (s && on_loop_thread(s)) s->corks++;
}

void mg_store_uncork(mg_store_t *s)
{
    if (!s || !on_loop_thread(s) || !s->corks || --s->corks) return;
    pthread_mutex_lock(&s->mu);
    write_job_t *j;
    int any = 0;
    while ((j = list_pop(&s->corked))) { /* in order, under one lock: the writer takes them all */
        if (s->attached && (s->parked.head || s->queue.n >= (uint64_t)s->queue_max)) {
            list_push(&s->parked, j);
        } else {
            queue_job(s, j);
            any = 1;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (any) pthread_cond_signal(&s->cv);
}

int mg_store_write_cb(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                      mg_store_done_fn done, void *ud)
{
    write_job_t *j = job_new(sql, nparams, params, done, ud);
    return j ? submit(s, j) : -1;
}

int mg_store_write_rows(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                        mg_store_rows_fn done, void *ud)
{
    write_job_t *j = job_new(sql, nparams, params, NULL, ud);
    if (!j) return -1;
    j->done_rows = done;
    return submit(s, j);
}

int mg_store_write_rows_nowait(mg_store_t *s, const char *sql, int nparams,
                               const char *const *params, mg_store_rows_fn done, void *ud)
{
    write_job_t *j = job_new(sql, nparams, params, NULL, ud);
    if (!j) return -1;
    j->done_rows = done;
    j->nowait = 1;
    return submit(s, j);
}

int mg_store_write_vals(mg_store_t *s, const char *sql, int nparams, const mg_store_val_t *params,
                        const mg_store_agg_t *agg, mg_store_done_fn done, void *ud)
{
    write_job_t *j = job_new_vals(sql, nparams, params, done, ud);
    if (!j) return -1;
    j->agg = agg;
    return submit(s, j);
}

int mg_store_use_journal(mg_store_t *s, const char *sql, const mg_store_agg_t *agg, size_t bytes)
{
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s.usage-journal", s->path);
    mg_journal_t *j;
    if (mg_journal_open(path, bytes ? bytes : MG_JOURNAL_BYTES_DEFAULT, &j, err, sizeof(err)) !=
        0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: the usage journal is off (%s)", err);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    s->journal_sql = sql;
    s->journal_agg = agg;
    s->journal = j;
    agg_turn(s); /* the writer replays what a killed run left in it */
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int mg_store_journal_write(mg_store_t *s, const char *sql, int nparams,
                           const mg_store_val_t *params, const mg_store_agg_t *agg,
                           mg_store_done_fn done, void *ud)
{
    int mine = s->journal && s->journal_sql == sql && s->journal_agg == agg;
    if (mine && on_loop_thread(s) && mg_journal_append(s->journal, nparams, params) == 0) {
        atomic_fetch_add_explicit(&s->journaled_total, 1, memory_order_relaxed);
        if (mg_journal_used(s->journal) > mg_journal_capacity(s->journal) / 2 &&
            !atomic_exchange(&s->journal_woken, 1))
            pthread_cond_signal(&s->cv); /* once per drain */
        if (done) done(ud, 0);           /* in the page cache: durable against kill -9 */
        return 0;
    }
    if (mine) atomic_fetch_add_explicit(&s->journal_fallback_total, 1, memory_order_relaxed);
    return mg_store_write_vals(s, sql, nparams, params, agg, done, ud);
}

int mg_store_write(mg_store_t *s, const char *sql, int nparams, const char *const *params)
{
    return mg_store_write_cb(s, sql, nparams, params, NULL, NULL);
}

/* ---- the loop side ------------------------------------------------------------------ */

static void on_async(uv_async_t *h)
{
    mg_store_t *s = h->data;
    pthread_mutex_lock(&s->mu);
    unpark(s, 0);
    job_list_t due = list_take(&s->done);
    pthread_mutex_unlock(&s->mu);
    deliver(&due); /* callbacks may queue writes: mu is not held */
}

int mg_store_attach(mg_store_t *s, uv_loop_t *loop)
{
    if (s->loop_known) return UV_EALREADY; /* once per store */
    uv_async_t *a = malloc(sizeof(*a));
    if (!a) return UV_ENOMEM;
    int rc = uv_async_init(loop, a, on_async);
    if (rc != 0) {
        free(a);
        return rc;
    }
    a->data = s;
    uv_unref((uv_handle_t *)a);
    s->async = a;
    pthread_mutex_lock(&s->mu);
    s->loop = loop;
    s->loop_thread = pthread_self();
    s->loop_known = 1;
    s->attached = 1;
    if (s->done.head) uv_async_send(a); /* writes finished before the loop was there */
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void mg_store_detach(mg_store_t *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    if (!s->attached) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->attached = 0;
    unpark(s, 1);
    pthread_mutex_unlock(&s->mu);
    uv_close((uv_handle_t *)s->async, (uv_close_cb)free);
    s->async = NULL;
}

void mg_store_flush(mg_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    unsigned long target = s->handed;
    while (s->writer_running && s->committed < target) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    mg_store_sync_aggs(s);
}

/* Under mu: ask the writer for a roll-up turn and wait for it. */
static void agg_turn(mg_store_t *s)
{
    unsigned long req = ++s->agg_sync_req;
    pthread_cond_signal(&s->cv);
    while (s->writer_running && !s->stopping && (long)(s->agg_sync_done - req) < 0)
        pthread_cond_wait(&s->done_cv, &s->mu);
}

void mg_store_sync_aggs(mg_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    agg_turn(s);
    pthread_mutex_unlock(&s->mu);
}

int mg_store_use_agg(mg_store_t *s, const mg_store_agg_t *agg)
{
    pthread_mutex_lock(&s->mu);
    s->agg_register = agg;
    s->agg_register_rc = -1;
    agg_turn(s);
    int rc = s->agg_register ? -1 : s->agg_register_rc; /* still set: the writer is gone */
    s->agg_register = NULL;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int mg_store_disk_full(mg_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    int full = s->stats.disk_full;
    pthread_mutex_unlock(&s->mu);
    return full;
}

void mg_store_stats(mg_store_t *s, mg_store_stats_t *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->queued = s->queue.n;
    out->parked = s->parked.n;
    pthread_mutex_unlock(&s->mu);
    out->journaled_total = atomic_load(&s->journaled_total);
    out->journal_fallback_total = atomic_load(&s->journal_fallback_total);
    out->journal_used_bytes = s->journal ? mg_journal_used(s->journal) : 0;
}

/* A read connection of one caller (sqlite3 is opaque to the callers). */
struct mg_store_read_s {
    sqlite3 *db;
};

mg_store_read_t *mg_store_read_open(mg_store_t *s, char *err, size_t errlen)
{
    mg_store_read_t *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (sqlite3_open_v2(s->path, &r->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "%s", r->db ? sqlite3_errmsg(r->db) : "cannot open");
        mg_store_read_close(r);
        return NULL;
    }
    sqlite3_busy_timeout(r->db, 5000);
    return r;
}

void mg_store_read_close(mg_store_read_t *r)
{
    if (!r) return;
    sqlite3_close(r->db);
    free(r);
}

int mg_store_read_query(mg_store_read_t *r, const char *sql, int nparams, const char *const *params,
                        void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                        char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_prepare_v2(r->db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(r->db));
        goto out;
    }
    for (int i = 0; i < nparams; i++) {
        if (params[i]) sqlite3_bind_text(st, i + 1, params[i], -1, SQLITE_STATIC);
        else sqlite3_bind_null(st, i + 1);
    }
    int ncols = sqlite3_column_count(st);
    const char *cols[64];
    if (ncols > 64) ncols = 64;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < ncols; i++) cols[i] = (const char *)sqlite3_column_text(st, i);
        cb(ud, ncols, cols);
    }
    if (step != SQLITE_DONE) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(r->db));
        goto out;
    }
    rc = 0;
out:
    sqlite3_finalize(st);
    return rc;
}

int mg_store_query(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                   void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                   size_t errlen)
{
    mg_store_read_t *r = mg_store_read_open(s, err, errlen);
    if (!r) return -1;
    int rc = mg_store_read_query(r, sql, nparams, params, cb, ud, err, errlen);
    mg_store_read_close(r);
    return rc;
}

/* ---- synchronous admin transactions ------------------------------------------------- */

/* Open the admin connection once: read-write, foreign keys on (a per-connection setting). */
static int admin_db_open(mg_store_t *s, char *err, size_t errlen)
{
    if (s->admin_db) return 0;
    if (sqlite3_open_v2(s->path, &s->admin_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "%s", s->admin_db ? sqlite3_errmsg(s->admin_db) : "cannot open");
        sqlite3_close(s->admin_db);
        s->admin_db = NULL;
        return MG_STORE_ERROR;
    }
    sqlite3_busy_timeout(s->admin_db, 5000);
    if (mg_sqlite_exec(s->admin_db, "PRAGMA foreign_keys=ON;", err, errlen) != 0) {
        sqlite3_close(s->admin_db);
        s->admin_db = NULL;
        return MG_STORE_ERROR;
    }
    return 0;
}

int mg_store_tx_begin(mg_store_t *s, mg_store_tx_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (s->tx) {
        snprintf(err, errlen, "an admin transaction is already open");
        return MG_STORE_ERROR;
    }
    if (admin_db_open(s, err, errlen) != 0) return MG_STORE_ERROR;
    mg_store_tx_t *tx = calloc(1, sizeof(*tx));
    if (!tx) {
        snprintf(err, errlen, "out of memory");
        return MG_STORE_ERROR;
    }
    if (s->hook.begin && s->hook.lock(s->hook.ud, err, errlen) != 0) {
        s->hook.end(s->hook.ud, 0);
        free(tx);
        return MG_STORE_EUNAVAIL;
    }
    if (mg_sqlite_exec(s->admin_db, "BEGIN IMMEDIATE", err, errlen) != 0) {
        if (s->hook.begin) s->hook.end(s->hook.ud, 0);
        free(tx);
        return MG_STORE_ERROR;
    }
    if (s->hook.begin && s->hook.begin(s->hook.ud, s->admin_db, err, errlen) != 0) {
        char ignore[64];
        mg_sqlite_exec(s->admin_db, "ROLLBACK", ignore, sizeof(ignore));
        s->hook.end(s->hook.ud, 0);
        free(tx);
        return MG_STORE_EUNAVAIL;
    }
    tx->s = s;
    tx->db = s->admin_db;
    s->tx = tx;
    *out = tx;
    return 0;
}

int mg_store_tx_exec(mg_store_tx_t *tx, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                     size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(tx->db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(tx->db));
        return MG_STORE_ERROR;
    }
    for (int i = 0; i < nparams; i++) {
        if (params[i]) sqlite3_bind_text(st, i + 1, params[i], -1, SQLITE_STATIC);
        else sqlite3_bind_null(st, i + 1);
    }
    int ncols = sqlite3_column_count(st), step;
    const char *cols[64];
    if (ncols > 64) ncols = 64;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < ncols; i++) cols[i] = (const char *)sqlite3_column_text(st, i);
        if (cb) cb(ud, ncols, cols);
    }
    int rc = sqlite3_changes(tx->db);
    if (step != SQLITE_DONE) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(tx->db));
        rc = (step & 0xff) == SQLITE_CONSTRAINT ? MG_STORE_ECONSTRAINT : MG_STORE_ERROR;
    }
    sqlite3_finalize(st);
    return rc;
}

int64_t mg_store_tx_last_id(const mg_store_tx_t *tx)
{
    return (int64_t)sqlite3_last_insert_rowid(tx->db);
}

/* End tx (already committed or rolled back) and forget it. */
static void tx_end(mg_store_tx_t *tx)
{
    tx->s->tx = NULL;
    free(tx);
}

/* The hook's end, then tx_end. */
static void tx_finish(mg_store_tx_t *tx, int committed)
{
    mg_store_t *s = tx->s;
    tx_end(tx);
    if (s->hook.begin) s->hook.end(s->hook.ud, committed);
}

int mg_store_tx_commit(mg_store_tx_t *tx, char *err, size_t errlen)
{
    mg_store_t *s = tx->s;
    char ignore[64];
    if (s->hook.begin && s->hook.commit(s->hook.ud, tx->db, err, errlen) != 0) {
        mg_sqlite_exec(tx->db, "ROLLBACK", ignore, sizeof(ignore));
        tx_finish(tx, 0);
        return MG_STORE_EUNAVAIL;
    }
    if (mg_sqlite_exec(tx->db, "COMMIT", err, errlen) != 0) {
        mg_sqlite_exec(tx->db, "ROLLBACK", ignore, sizeof(ignore));
        tx_finish(tx, 0);
        return MG_STORE_ERROR;
    }
    tx_finish(tx, 1);
    return 0;
}

void mg_store_tx_rollback(mg_store_tx_t *tx)
{
    if (!tx) return;
    char ignore[64];
    mg_sqlite_exec(tx->db, "ROLLBACK", ignore, sizeof(ignore));
    tx_finish(tx, 0);
}

void mg_store_set_txhook(mg_store_t *s, const mg_store_txhook_t *hook)
{
    if (hook) s->hook = *hook;
    else memset(&s->hook, 0, sizeof(s->hook));
}

const char *mg_store_path(const mg_store_t *s)
{
    return s->path;
}

int mg_store_schema_version(const mg_store_t *s)
{
    return s->version;
}

void mg_store_set_pg(mg_store_t *s, mg_pg_t *pg, const char *node_id)
{
    s->pg = pg;
    snprintf(s->node_id, sizeof(s->node_id), "%s", node_id ? node_id : "");
}

mg_pg_t *mg_store_pg(const mg_store_t *s)
{
    return s ? s->pg : NULL;
}

const char *mg_store_node_id(const mg_store_t *s)
{
    return s->node_id;
}

void mg_store_close(mg_store_t *s)
{
    if (!s) return;
    mg_store_detach(s);
    if (s->writer_running) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_signal(&s->cv);
        pthread_cond_broadcast(&s->room_cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
        s->writer_running = 0;
    }
    for (int i = 0; i < STMT_CACHE; i++) {
        sqlite3_finalize(s->stmts[i].st);
        free(s->stmts[i].sql);
    }
    sqlite3_finalize(s->begin_st);
    sqlite3_finalize(s->commit_st);
    sqlite3_finalize(s->journal_group_st);
    free(s->journal_group);
    aggs_destroy(s);
    mg_journal_close(s->journal); /* what is left in it (appended after the last drain) is
                                     replayed by the next start */
    deliver(&s->done);            /* the writer is gone: no lock needed */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->room_cv);
    if (s->tx) mg_store_tx_rollback(s->tx);
    if (s->admin_db) sqlite3_close(s->admin_db);
    if (s->db) sqlite3_close(s->db);
    free(s->path);
    free(s);
}
