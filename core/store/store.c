/* store: SQLite open + migrations; see store.h.
 *
 * The schema follows the Sidecar ADR's DDL (providers, usage buckets, cooldowns,
 * health, system config, daily stats). Each migration runs in its own transaction
 * and records itself in schema_migrations, so a crash mid-way never leaves a
 * half-applied version behind. */
#include "store/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"

typedef struct write_job_s {
    struct write_job_s *next;
    char *sql;       /* owned */
    int nparams;
    char **params;   /* owned, entries may be NULL */
} write_job_t;

struct mg_store_s {
    sqlite3 *db;         /* migrations, then the writer thread's connection */
    char *path;          /* owned */
    int version;
    pthread_t writer;
    int writer_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work queued or stopping */
    pthread_cond_t done_cv;  /* a batch committed */
    write_job_t *head, *tail;/* queue, guarded by mu */
    unsigned long queued, committed;
    int stopping;
    sqlite3 *admin_db;   /* synchronous admin transactions; opened on first use */
    mg_store_tx_t *tx;   /* the open admin transaction, or NULL */
};

struct mg_store_tx_s {
    mg_store_t *s; /* borrowed */
    sqlite3 *db;   /* borrowed: s->admin_db */
};

static const char *const migrations[] = {
    /* 1: the pool gateway schema (Sidecar ADR section 7.2) */
    "CREATE TABLE providers ("
    " id TEXT PRIMARY KEY, name TEXT NOT NULL, api_key TEXT NOT NULL, endpoint_url TEXT NOT NULL,"
    " model_prefix TEXT DEFAULT '',"
    " pool TEXT NOT NULL DEFAULT 'main' CHECK(pool IN ('main','fallback')),"
    " status TEXT NOT NULL DEFAULT 'active' CHECK(status IN ('active','disabled','cooldown')),"
    " source TEXT NOT NULL DEFAULT 'db' CHECK(source IN ('env','db','file')),"
    " rpm_limit INTEGER NOT NULL DEFAULT 60, tpm_limit INTEGER DEFAULT NULL,"
    " weight REAL DEFAULT 1.0, cost_per_1k_tokens REAL DEFAULT 0.0, cooldown_until TEXT,"
    " metadata JSON DEFAULT '{}',"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE provider_usage_logs ("
    " id TEXT PRIMARY KEY, provider_id TEXT NOT NULL, model TEXT DEFAULT 'unknown',"
    " prompt_tokens INTEGER DEFAULT 0, completion_tokens INTEGER DEFAULT 0,"
    " total_tokens INTEGER DEFAULT 0, cost REAL DEFAULT 0.0, request_count INTEGER DEFAULT 0,"
    " error_count INTEGER DEFAULT 0, avg_latency_ms INTEGER DEFAULT 0, hour_bucket TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE UNIQUE INDEX idx_usage_provider_hour ON provider_usage_logs(provider_id, hour_bucket);"
    "CREATE TABLE cooldown_events ("
    " id TEXT PRIMARY KEY, provider_id TEXT NOT NULL, consecutive_count INTEGER NOT NULL DEFAULT 1,"
    " cooldown_seconds INTEGER NOT NULL, response_summary TEXT DEFAULT '',"
    " started_at TEXT NOT NULL DEFAULT (datetime('now')), ended_at TEXT);"
    "CREATE INDEX idx_cooldown_provider_time ON cooldown_events(provider_id, started_at);"
    "CREATE TABLE provider_health ("
    " provider_id TEXT PRIMARY KEY,"
    " state TEXT NOT NULL DEFAULT 'healthy' CHECK(state IN ('healthy','degraded','down')),"
    " last_latency_ms INTEGER DEFAULT 0, last_status_code INTEGER DEFAULT 200,"
    " success_rate_5m REAL DEFAULT 1.0, consecutive_failures INTEGER DEFAULT 0,"
    " last_check_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE system_config ("
    " key TEXT PRIMARY KEY, value TEXT NOT NULL, description TEXT DEFAULT '',"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE daily_stats ("
    " id TEXT PRIMARY KEY, date TEXT NOT NULL, pool TEXT NOT NULL CHECK(pool IN ('main','fallback')),"
    " total_requests INTEGER DEFAULT 0, total_errors INTEGER DEFAULT 0, total_tokens INTEGER DEFAULT 0,"
    " total_cost REAL DEFAULT 0.0, unique_providers INTEGER DEFAULT 0,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE UNIQUE INDEX idx_daily_date_pool ON daily_stats(date, pool);",
    /* 2: runtime state of every provider (config or admin), restored at start */
    "CREATE TABLE provider_state ("
    " provider_id TEXT PRIMARY KEY, cooldown_until_ms INTEGER NOT NULL DEFAULT 0,"
    " consecutive_429 INTEGER NOT NULL DEFAULT 0, observing INTEGER NOT NULL DEFAULT 0,"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
    /* 3: tenancy. Times are unix seconds (audit_logs.at: unix milliseconds); limits are 0
     * for "no limit"; a key is stored only as the hex SHA-256 of the clear key plus its
     * display form. JSON arrays/objects are kept as text. A key's project must belong to
     * the key's tenant (composite foreign key). Key names are unique among a tenant's
     * unrevoked keys, so a rotation (revoke old, insert new) may keep the name. */
    "CREATE TABLE tenants ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL);"
    "CREATE TABLE projects ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " name TEXT NOT NULL, rpm_limit INTEGER NOT NULL DEFAULT 0,"
    " tpm_limit INTEGER NOT NULL DEFAULT 0, max_concurrency INTEGER NOT NULL DEFAULT 0,"
    " monthly_limit_micros INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,"
    " UNIQUE(tenant_id, name), UNIQUE(id, tenant_id));"
    "CREATE TABLE api_keys ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " project_id INTEGER, name TEXT, digest TEXT NOT NULL UNIQUE, display TEXT NOT NULL,"
    " scopes TEXT NOT NULL DEFAULT '[\"inference\"]', models TEXT NOT NULL DEFAULT '[]',"
    " priorities TEXT NOT NULL DEFAULT '[\"P0\",\"P1\",\"P2\",\"P3\",\"P4\"]',"
    " rpm_limit INTEGER NOT NULL DEFAULT 0, tpm_limit INTEGER NOT NULL DEFAULT 0,"
    " max_concurrency INTEGER NOT NULL DEFAULT 0, max_queued INTEGER NOT NULL DEFAULT 0,"
    " daily_limit_micros INTEGER NOT NULL DEFAULT 0,"
    " monthly_limit_micros INTEGER NOT NULL DEFAULT 0, expires_at INTEGER,"
    " labels TEXT NOT NULL DEFAULT '{}',"
    " enabled INTEGER NOT NULL DEFAULT 1 CHECK(enabled IN (0, 1)),"
    " revoked_at INTEGER, replaced_by INTEGER, last_used_at INTEGER,"
    " created_at INTEGER NOT NULL,"
    " FOREIGN KEY (project_id, tenant_id) REFERENCES projects(id, tenant_id));"
    "CREATE UNIQUE INDEX idx_api_keys_tenant_name ON api_keys(tenant_id, name)"
    " WHERE name IS NOT NULL AND revoked_at IS NULL;"
    "CREATE INDEX idx_api_keys_project ON api_keys(project_id);"
    "CREATE TABLE audit_logs ("
    " id INTEGER PRIMARY KEY, at INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,"
    " target TEXT, status INTEGER NOT NULL, request_id TEXT, client_addr TEXT);"
    "CREATE INDEX idx_audit_logs_at ON audit_logs(at);",
    /* 4: async tasks (POST /v1/tasks): state and result, kept for tasks.retention_seconds */
    "CREATE TABLE tasks ("
    " id TEXT PRIMARY KEY, model TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,"
    " http_status INTEGER, result TEXT, created_ms INTEGER NOT NULL, finished_ms INTEGER);"
    "CREATE INDEX idx_tasks_created ON tasks(created_ms);",
    /* 5: idempotency: the stored answer of a request per (caller scope, key) */
    "CREATE TABLE idempotency ("
    " id TEXT PRIMARY KEY, http_status INTEGER NOT NULL, stream INTEGER NOT NULL,"
    " body TEXT NOT NULL, expires_ms INTEGER NOT NULL);",
    /* 6: spend metering: micros charged per key or project and period ("d:YYYY-MM-DD",
     * "m:YYYY-MM"), for the daily and monthly spend limits */
    "CREATE TABLE spend ("
    " scope TEXT NOT NULL CHECK(scope IN ('key','project')), id INTEGER NOT NULL,"
    " period TEXT NOT NULL, micros INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (scope, id, period));",
    /* 7: tenant admin tokens (admin_scope.c): digest only, bound to one tenant */
    "CREATE TABLE admin_tokens ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " name TEXT, digest TEXT NOT NULL UNIQUE, display TEXT NOT NULL,"
    " created_at INTEGER NOT NULL, revoked_at INTEGER);",
    /* 8: logical models added through the admin API (models.h): the definition as JSON */
    "CREATE TABLE models ("
    " name TEXT PRIMARY KEY, definition TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
    /* 9: applications added through the admin API (apps.h): the definition as JSON */
    "CREATE TABLE applications ("
    " name TEXT PRIMARY KEY, definition TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
};

static void *writer_main(void *arg);

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

static int exec(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s", msg ? msg : "sqlite error");
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int current_version(sqlite3 *db)
{
    sqlite3_stmt *st;
    int v = 0;
    if (sqlite3_prepare_v2(db, "SELECT COALESCE(MAX(version),0) FROM schema_migrations", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int migrate(mg_store_t *s, char *err, size_t errlen)
{
    if (exec(s->db,
             "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
             " applied_at TEXT NOT NULL DEFAULT (datetime('now')))",
             err, errlen) != 0)
        return -1;
    int v = current_version(s->db);
    int n = (int)(sizeof(migrations) / sizeof(migrations[0]));
    if (v < 0) {
        snprintf(err, errlen, "cannot read schema version");
        return -1;
    }
    if (v > n) {
        snprintf(err, errlen, "database schema %d is newer than this binary knows (%d)", v, n);
        return -1;
    }
    for (int i = v; i < n; i++) {
        char rec[128];
        snprintf(rec, sizeof(rec), "INSERT INTO schema_migrations(version) VALUES (%d);", i + 1);
        if (exec(s->db, "BEGIN IMMEDIATE", err, errlen) != 0) return -1;
        if (exec(s->db, migrations[i], err, errlen) != 0 || exec(s->db, rec, err, errlen) != 0) {
            char ignore[64];
            exec(s->db, "ROLLBACK", ignore, sizeof(ignore));
            return -1;
        }
        if (exec(s->db, "COMMIT", err, errlen) != 0) return -1;
    }
    s->version = n;
    return 0;
}

int mg_store_open(const char *path, mg_store_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (mkdir_parents(path) != 0) {
        snprintf(err, errlen, "%s: cannot create its directory: %s", path, strerror(errno));
        return -1;
    }
    mg_store_t *s = calloc(1, sizeof(*s));
    if (!s) return -1;
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", path, s->db ? sqlite3_errmsg(s->db) : "cannot open");
        mg_store_close(s);
        return -1;
    }
    sqlite3_busy_timeout(s->db, 5000);
    if (exec(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
             err, errlen) != 0 ||
        migrate(s, err, errlen) != 0) {
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s", err);
        snprintf(err, errlen, "%s: %s", path, tmp);
        mg_store_close(s);
        return -1;
    }
    s->path = strdup(path);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    if (!s->path || pthread_create(&s->writer, NULL, writer_main, s) != 0) {
        snprintf(err, errlen, "%s: cannot start the writer thread", path);
        mg_store_close(s);
        return -1;
    }
    s->writer_running = 1;
    *out = s;
    return 0;
}

static void job_free(write_job_t *j)
{
    for (int i = 0; i < j->nparams; i++) free(j->params[i]);
    free(j->params);
    free(j->sql);
    free(j);
}

static void run_job(sqlite3 *db, write_job_t *j)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, j->sql, -1, &st, NULL) != SQLITE_OK) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store: cannot prepare a write: %s", sqlite3_errmsg(db));
        return;
    }
    for (int i = 0; i < j->nparams; i++) {
        if (j->params[i]) sqlite3_bind_text(st, i + 1, j->params[i], -1, SQLITE_STATIC);
        else sqlite3_bind_null(st, i + 1);
    }
    if (sqlite3_step(st) != SQLITE_DONE)
        mg_log_msg(MG_LOG_ERROR, NULL, "store: write failed: %s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
}

/* The writer: take everything queued, commit it as one transaction, repeat. */
static void *writer_main(void *arg)
{
    mg_store_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head && s->stopping) break;
        write_job_t *batch = s->head;
        unsigned long n = 0;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        char err[256];
        exec(s->db, "BEGIN IMMEDIATE", err, sizeof(err));
        for (write_job_t *j = batch; j; j = j->next, n++) run_job(s->db, j);
        if (exec(s->db, "COMMIT", err, sizeof(err)) != 0)
            mg_log_msg(MG_LOG_ERROR, NULL, "store: commit failed: %s", err);
        while (batch) {
            write_job_t *next = batch->next;
            job_free(batch);
            batch = next;
        }
        pthread_mutex_lock(&s->mu);
        s->committed += n;
        pthread_cond_broadcast(&s->done_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int mg_store_write(mg_store_t *s, const char *sql, int nparams, const char *const *params)
{
    write_job_t *j = calloc(1, sizeof(*j));
    if (!j) return -1;
    j->sql = strdup(sql);
    j->nparams = nparams;
    j->params = calloc((size_t)(nparams > 0 ? nparams : 1), sizeof(char *));
    int oom = !j->sql || !j->params;
    for (int i = 0; !oom && i < nparams; i++)
        if (params[i] && !(j->params[i] = strdup(params[i]))) oom = 1;
    if (oom) {
        job_free(j);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping || !s->writer_running) {
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return -1;
    }
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->queued++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void mg_store_flush(mg_store_t *s)
{
    pthread_mutex_lock(&s->mu);
    unsigned long target = s->queued;
    while (s->writer_running && s->committed < target) pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

int mg_store_query(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                   void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                   char *err, size_t errlen)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_open_v2(s->path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", db ? sqlite3_errmsg(db) : "cannot open");
        goto out;
    }
    sqlite3_busy_timeout(db, 5000);
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
        snprintf(err, errlen, "%s", sqlite3_errmsg(db));
        goto out;
    }
    rc = 0;
out:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* ---- synchronous admin transactions ------------------------------------------------- */

/* Open the admin connection once: read-write, foreign keys on (a per-connection setting). */
static int admin_db_open(mg_store_t *s, char *err, size_t errlen)
{
    if (s->admin_db) return 0;
    if (sqlite3_open_v2(s->path, &s->admin_db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", s->admin_db ? sqlite3_errmsg(s->admin_db) : "cannot open");
        sqlite3_close(s->admin_db);
        s->admin_db = NULL;
        return MG_STORE_ERROR;
    }
    sqlite3_busy_timeout(s->admin_db, 5000);
    if (exec(s->admin_db, "PRAGMA foreign_keys=ON;", err, errlen) != 0) {
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
    if (exec(s->admin_db, "BEGIN IMMEDIATE", err, errlen) != 0) {
        free(tx);
        return MG_STORE_ERROR;
    }
    tx->s = s;
    tx->db = s->admin_db;
    s->tx = tx;
    *out = tx;
    return 0;
}

int mg_store_tx_exec(mg_store_tx_t *tx, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                     char *err, size_t errlen)
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

int mg_store_tx_commit(mg_store_tx_t *tx, char *err, size_t errlen)
{
    if (exec(tx->db, "COMMIT", err, errlen) != 0) {
        char ignore[64];
        exec(tx->db, "ROLLBACK", ignore, sizeof(ignore));
        tx_end(tx);
        return MG_STORE_ERROR;
    }
    tx_end(tx);
    return 0;
}

void mg_store_tx_rollback(mg_store_tx_t *tx)
{
    if (!tx) return;
    char ignore[64];
    exec(tx->db, "ROLLBACK", ignore, sizeof(ignore));
    tx_end(tx);
}

int mg_store_schema_version(const mg_store_t *s)
{
    return s->version;
}

void mg_store_close(mg_store_t *s)
{
    if (!s) return;
    if (s->writer_running) {
        pthread_mutex_lock(&s->mu);
        s->stopping = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->writer, NULL);
        s->writer_running = 0;
    }
    if (s->path) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        pthread_cond_destroy(&s->done_cv);
    }
    if (s->tx) mg_store_tx_rollback(s->tx);
    if (s->admin_db) sqlite3_close(s->admin_db);
    if (s->db) sqlite3_close(s->db);
    free(s->path);
    free(s);
}
