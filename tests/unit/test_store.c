/* Unit tests for core/store/store.c: open creates the file (and its directories), applies the
 * migrations once and records them, reopening is idempotent, the journal is WAL, a
 * database from a newer binary is refused. Everything lives in a fresh temp directory. */
#include "mgtest.h"
#include "store/store.h"

#include <ftw.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-store-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(1);
    }
}

static void remove_tmpdir(void)
{
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Run a one-value query on a separate connection; returns the text (static buffer). */
static const char *query1(const char *path, const char *sql)
{
    static char out[256];
    out[0] = '\0';
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return "(open failed)";
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(out, sizeof(out), "(error: %s)", sqlite3_errmsg(db));
    } else if (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(out, sizeof(out), "%s", t ? (const char *)t : "(null)");
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_open_creates_and_migrates(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/nested/dir/mg.db", tmpdir);
    mg_store_t *s = (mg_store_t *)1;
    int rc = mg_store_open(path, &s, err, sizeof(err));
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) {
        fprintf(stderr, "  open: %s\n", err);
        return;
    }
    CHECK(s != NULL);
    CHECK(file_exists(path));
    int v = mg_store_schema_version(s);
    CHECK(v >= 1);
    /* while open: WAL mode shows the -wal file next to the database once written */
    char q[64];
    snprintf(q, sizeof(q), "SELECT COUNT(*) FROM schema_migrations");
    char expect[16];
    snprintf(expect, sizeof(expect), "%d", v);
    CHECK_STR(query1(path, q), expect);
    CHECK_STR(query1(path, "SELECT MAX(version) FROM schema_migrations"), expect);
    CHECK_STR(query1(path, "SELECT MIN(version) FROM schema_migrations"), "1");
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM schema_migrations WHERE applied_at IS NULL"), "0");
    CHECK_STR(query1(path, "PRAGMA journal_mode"), "wal");
    /* the schema's tables exist */
    const char *tables[] = {"providers",       "provider_usage_logs", "cooldown_events",
                            "provider_health", "system_config",       "daily_stats"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char sql[128];
        snprintf(sql, sizeof(sql),
                 "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='%s'", tables[i]);
        const char *got = query1(path, sql);
        if (strcmp(got, "1") != 0) fprintf(stderr, "  table %s missing\n", tables[i]);
        CHECK_STR(got, "1");
    }
    mg_store_close(s);
    /* journal_mode=WAL is persistent: a fresh connection after close still sees it */
    CHECK_STR(query1(path, "PRAGMA journal_mode"), "wal");
}

static void test_reopen_is_idempotent(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/re.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    int v = mg_store_schema_version(s);
    mg_store_close(s);
    const char *first = query1(path, "SELECT group_concat(version || '@' || applied_at) FROM "
                                     "schema_migrations");
    char before[256];
    snprintf(before, sizeof(before), "%s", first);
    for (int i = 0; i < 3; i++) {
        s = NULL;
        CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
        if (!s) {
            fprintf(stderr, "  reopen: %s\n", err);
            return;
        }
        CHECK_EQ_INT(mg_store_schema_version(s), v);
        mg_store_close(s);
    }
    char expect[16];
    snprintf(expect, sizeof(expect), "%d", v);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM schema_migrations"), expect);
    /* the original rows (with their timestamps) are untouched */
    CHECK_STR(query1(path, "SELECT group_concat(version || '@' || applied_at) FROM "
                           "schema_migrations"),
              before);
}

/* Data written between opens survives a reopen (the migrations do not recreate tables). */
static void test_data_survives_reopen(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/data.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    mg_store_close(s);
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "INSERT INTO system_config(key, value) VALUES ('k', 'v')", NULL,
                              NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(db);
    s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    mg_store_close(s);
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key = 'k'"), "v");
}

/* A database migrated by a newer binary (higher version recorded) is refused with a
 * message naming the file. */
static void test_newer_schema_refused(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/newer.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    int v = mg_store_schema_version(s);
    mg_store_close(s);
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    char sql[128];
    snprintf(sql, sizeof(sql), "INSERT INTO schema_migrations(version) VALUES (%d)", v + 1);
    CHECK_EQ_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    s = (mg_store_t *)1;
    err[0] = '\0';
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, path) != NULL);
    CHECK(strstr(err, "newer") != NULL);
}

/* Unusable paths fail with a message, not a crash. */
static void test_open_errors(void)
{
    char path[512], err[512] = "";
    /* a regular file where a directory should be */
    char blocker[512];
    snprintf(blocker, sizeof(blocker), "%s/blocker", tmpdir);
    FILE *f = fopen(blocker, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(path, sizeof(path), "%s/blocker/sub/x.db", tmpdir);
    mg_store_t *s = (mg_store_t *)1;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, path) != NULL);
    /* not a database */
    char junk[512];
    snprintf(junk, sizeof(junk), "%s/junk.db", tmpdir);
    f = fopen(junk, "w");
    if (f) {
        for (int i = 0; i < 200; i++)
            fputs("this is not an SQLite database file\n", f);
        fclose(f);
    }
    s = (mg_store_t *)1;
    err[0] = '\0';
    CHECK_EQ_INT(mg_store_open(junk, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, junk) != NULL);
    mg_store_close(NULL); /* tolerated */
}

static void count_rows(void *ud, int ncols, const char *const *cols)
{
    int *n = ud;
    (*n)++;
    (void)ncols;
    (void)cols;
}

/* Writes queued from the caller's thread are committed by the writer thread, in
 * order, and visible to mg_store_query after a flush; NULL parameters bind NULL. */
static void test_writer_thread(void)
{
    make_tmpdir();
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/w.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    for (int i = 0; i < 500; i++) {
        char key[32], val[32];
        snprintf(key, sizeof(key), "k%03d", i);
        snprintf(val, sizeof(val), "%d", i);
        const char *p[3] = {key, val, i % 2 ? NULL : "even"};
        CHECK_EQ_INT(mg_store_write(s, "INSERT INTO system_config(key, value, description) "
                                       "VALUES (?1, ?2, COALESCE(?3, 'odd'))",
                                    3, p),
                     0);
    }
    /* a later write to the same key wins: order is kept */
    const char *upd[2] = {"k000", "changed"};
    CHECK_EQ_INT(mg_store_write(s, "UPDATE system_config SET value = ?2 WHERE key = ?1", 2, upd), 0);
    mg_store_flush(s);
    int rows = 0;
    CHECK_EQ_INT(mg_store_query(s, "SELECT key FROM system_config", 0, NULL, count_rows, &rows, err,
                                sizeof(err)),
                 0);
    CHECK_EQ_INT(rows, 500);
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key='k000'"), "changed");
    CHECK_STR(query1(path, "SELECT description FROM system_config WHERE key='k001'"), "odd");
    /* a bad statement is reported, not fatal, and later writes still land */
    CHECK_EQ_INT(mg_store_write(s, "INSERT INTO no_such_table VALUES (1)", 0, NULL), 0);
    const char *p2[2] = {"after", "1"};
    CHECK_EQ_INT(mg_store_write(s, "INSERT INTO system_config(key, value) VALUES (?1, ?2)", 2, p2), 0);
    mg_store_close(s); /* close commits what is queued */
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key='after'"), "1");
    remove_tmpdir();
}

int main(void)
{
    make_tmpdir();
    MG_RUN(test_open_creates_and_migrates);
    MG_RUN(test_reopen_is_idempotent);
    MG_RUN(test_data_survives_reopen);
    MG_RUN(test_newer_schema_refused);
    MG_RUN(test_open_errors);
    MG_RUN(test_writer_thread);
    remove_tmpdir();
    return mg_test_summary();
}
