/* store: SQLite open + migrations; see store.h.
 *
 * The schema follows the Sidecar ADR's DDL (providers, usage buckets, cooldowns,
 * health, system config, daily stats). Each migration runs in its own transaction
 * and records itself in schema_migrations, so a crash mid-way never leaves a
 * half-applied version behind. */
#include "store.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct mg_store_s {
    sqlite3 *db;
    int version;
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
};

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
    *out = s;
    return 0;
}

int mg_store_schema_version(const mg_store_t *s)
{
    return s->version;
}

void mg_store_close(mg_store_t *s)
{
    if (!s) return;
    if (s->db) sqlite3_close(s->db);
    free(s);
}
