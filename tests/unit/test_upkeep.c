/* upkeep: online backups that are whole copies taken while the writer writes, the
 * truncating checkpoint, the integrity check, the backup retention, the size figures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include <sqlite3.h>

#include "mgtest.h"
#include "store_fixture.h"
#include "store/store.h"
#include "store/upkeep.h"

static char tmpdir[256];

static int integrity_ok(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int ok = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        ok = strcmp((const char *)sqlite3_column_text(st, 0), "ok") == 0;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return ok;
}

static void write_rows(mg_store_t *s, int from, int n)
{
    char id[32];
    for (int i = from; i < from + n; i++) {
        snprintf(id, sizeof(id), "p%d", i);
        const char *params[] = {id};
        mg_store_write(s, "INSERT INTO upkeep_probe(id) VALUES (?1)", 1, params);
    }
}

/* A backup taken while writes commit is one consistent state: a prefix of the writes, whole. */
static void test_backup_while_writing(void)
{
    char db[512], dest[512], err[256];
    snprintf(db, sizeof(db), "%s/live.db", tmpdir);
    snprintf(dest, sizeof(dest), "%s/copy.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK(mg_store_open(db, &s, err, sizeof(err)) == 0);
    if (!s) return;
    const char *none[] = {NULL};
    mg_store_write(s, "CREATE TABLE upkeep_probe(id TEXT PRIMARY KEY)", 0, none);
    write_rows(s, 0, 2000);
    mg_store_flush(s);
    write_rows(s, 2000, 2000); /* still committing while the copy runs */
    CHECK(mg_store_backup(db, dest, NULL, err, sizeof(err)) == 0);
    mg_store_flush(s);
    long long copied = mgt_db_int(dest, "SELECT COUNT(*) FROM upkeep_probe");
    CHECK(copied >= 2000 && copied <= 4000);
    CHECK(integrity_ok(dest));
    CHECK(mgt_db_int(dest, "SELECT COUNT(*) FROM schema_migrations") > 0);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", dest);
    CHECK(access(tmp, F_OK) != 0); /* renamed into place */
    mg_store_close(s);
}

static void test_backup_failure_leaves_nothing(void)
{
    char err[256] = "", dest[512];
    snprintf(dest, sizeof(dest), "%s/no-such-dir/copy.db", tmpdir);
    CHECK(mg_store_backup("/nonexistent/moongate.db", dest, NULL, err, sizeof(err)) != 0);
    CHECK(err[0] != '\0');
    CHECK(access(dest, F_OK) != 0);
}

static void wait_stats(mg_upkeep_t *u, mg_upkeep_stats_t *st,
                       int (*done)(const mg_upkeep_stats_t *))
{
    for (int i = 0; i < 100; i++) { /* at most 10 s */
        mg_upkeep_stats(u, st);
        if (done(st)) return;
        usleep(100 * 1000);
    }
}

static int first_round_done(const mg_upkeep_stats_t *st)
{
    return st->backups_total >= 1 && st->integrity_ok != -1 && st->db_bytes > 0 &&
           st->checkpoints_total >= 1;
}

/* The thread: a backup and a check at start, a truncating checkpoint each period, old
 * backups of its own pruned and other files left alone. */
static void test_upkeep_thread(void)
{
    char db[512], dir[512], err[256], old[600], other[600];
    snprintf(db, sizeof(db), "%s/served.db", tmpdir);
    snprintf(dir, sizeof(dir), "%s/backups", tmpdir);
    mkdir(dir, 0750);
    snprintf(old, sizeof(old), "%s/moongate-20000101-000000.db", dir);
    snprintf(other, sizeof(other), "%s/notes.db", dir);
    FILE *f = fopen(old, "w");
    if (f) fclose(f);
    f = fopen(other, "w");
    if (f) fclose(f);
    struct utimbuf ancient = {0, 0};
    utime(old, &ancient);
    utime(other, &ancient);
    mg_store_t *s = NULL;
    CHECK(mg_store_open(db, &s, err, sizeof(err)) == 0);
    if (!s) return;
    const char *none[] = {NULL};
    mg_store_write(s, "CREATE TABLE upkeep_probe(id TEXT PRIMARY KEY)", 0, none);
    write_rows(s, 0, 500);
    mg_store_flush(s);
    mg_upkeep_conf_t c = {.checkpoint_s = 1,
                          .integrity_s = 3600,
                          .backup_dir = dir,
                          .backup_every_s = 3600,
                          .backup_keep_s = 86400};
    mg_upkeep_t *u = mg_upkeep_start(db, &c);
    CHECK(u != NULL);
    if (!u) return;
    mg_upkeep_stats_t st;
    wait_stats(u, &st, first_round_done);
    CHECK_EQ_INT(st.backups_total, 1);
    CHECK_EQ_INT(st.backup_failures_total, 0);
    CHECK_EQ_INT(st.integrity_ok, 1);
    CHECK(st.integrity_at > 0 && st.backup_at > 0);
    CHECK(st.db_bytes > 0);
    CHECK(st.checkpoints_total >= 1);
    CHECK(access(old, F_OK) != 0);   /* its own, past keep: gone */
    CHECK(access(other, F_OK) == 0); /* not its own: kept */
    mg_upkeep_stop(u);
    char wal[600];
    snprintf(wal, sizeof(wal), "%s-wal", db);
    struct stat ws;
    CHECK(stat(wal, &ws) != 0 || ws.st_size == 0); /* truncated */
    mg_store_close(s);
}

int main(void)
{
    if (mgt_tmpdir(tmpdir, sizeof(tmpdir), "upkeep") != 0) return 1;
    MG_RUN(test_backup_while_writing);
    MG_RUN(test_backup_failure_leaves_nothing);
    MG_RUN(test_upkeep_thread);
    if (mgt_rmtree(tmpdir) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return mg_test_summary();
}
