/* store_fixture: what the store tests share: a temp directory for their databases, and reads
 * and writes of a database file behind the store's back (what a test checks, or a crash's
 * leftovers). A header of static functions: each test file that includes it is one program. */
#ifndef MG_STORE_FIXTURE_H
#define MG_STORE_FIXTURE_H

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a test may use only some of them */
#define MGT_UNUSED __attribute__((unused))

/* A new directory /tmp/mg-<tag>-XXXXXX (mkdtemp's template) into dir; 0, or -1. */
MGT_UNUSED static int mgt_tmpdir(char *dir, size_t cap, const char *tag)
{
    snprintf(dir, cap, "/tmp/mg-%s-XXXXXX", tag);
    if (mkdtemp(dir)) return 0;
    perror("mkdtemp");
    return -1;
}

/* Remove the directory and what is in it; 0, or -1. */
MGT_UNUSED static int mgt_rmtree(const char *dir)
{
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The first column of sql's first row on an open connection; -1 when it fails. */
MGT_UNUSED static long long mgt_sql_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    long long v = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* The same on a database file, read-only; -1 (and a line on stderr) when it fails. */
MGT_UNUSED static long long mgt_db_int(const char *db_path, const char *sql)
{
    sqlite3 *db = NULL;
    long long v = -1;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK)
        v = mgt_sql_int(db, sql);
    if (v == -1) fprintf(stderr, "query failed or -1: %s: %s\n", sql, sqlite3_errmsg(db));
    sqlite3_close(db);
    return v;
}

/* Run sql (one or more statements) on the file; 0, or -1 with the message on stderr. */
MGT_UNUSED static int mgt_db_exec(const char *db_path, const char *sql)
{
    sqlite3 *db = NULL;
    char *msg = NULL;
    int rc = sqlite3_open(db_path, &db) == SQLITE_OK ? sqlite3_exec(db, sql, NULL, NULL, &msg)
                                                     : SQLITE_CANTOPEN;
    if (rc != SQLITE_OK) fprintf(stderr, "%s: %s\n", sql, msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

#endif
