/* seed_keys: put N customer keys into a moongate database, as bench/run's auth variant needs.
 *
 *   seed_keys DB N [--print-first]
 *
 * DB must already have moongate's schema (start moongate on it once). Every key is made the
 * way the admin API makes one (mg_key_generate: "mg-" + 40 base62 characters from the
 * CSPRNG; the row keeps the lowercase hex SHA-256 of the clear key and its display form
 * "mg-…a1b2c3"), with the column defaults of POST /api/v2/keys: scopes ["inference"], every
 * model, every priority, no limits, no expiry, enabled, no project, no name. The keys belong
 * to tenant 1 ("bench", created when missing). All rows go in one transaction.
 * --print-first writes the clear text of the first key to stdout (the one wrk presents);
 * the others are thrown away. A summary goes to stderr. Exit status 0 or 1. */
#include "tenancy/keys.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK) return 0;
    fprintf(stderr, "seed_keys: %s: %s\n", sql, err ? err : "?");
    sqlite3_free(err);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (argc == 4 && strcmp(argv[3], "--print-first") != 0) || argc > 4) {
        fprintf(stderr, "usage: seed_keys DB N [--print-first]\n");
        return 1;
    }
    long n = strtol(argv[2], NULL, 10);
    int print_first = argc == 4;
    if (n < 1 || n > 100000000) {
        fprintf(stderr, "seed_keys: N must be 1 .. 100000000\n");
        return 1;
    }
    double t0 = now_s();
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(argv[1], &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        fprintf(stderr, "seed_keys: %s: %s\n", argv[1], db ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return 1;
    }
    sqlite3_busy_timeout(db, 5000);
    char sql[256];
    long long at = (long long)time(NULL);
    snprintf(sql, sizeof(sql),
             "INSERT OR IGNORE INTO tenants(id, name, created_at) VALUES (1, 'bench', %lld)", at);
    sqlite3_stmt *st = NULL;
    if (exec(db, "BEGIN") != 0 || exec(db, sql) != 0 ||
        sqlite3_prepare_v2(db,
                           "INSERT INTO api_keys(tenant_id, digest, display, created_at)"
                           " VALUES (1, ?1, ?2, ?3)",
                           -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "seed_keys: %s (is the schema there? start moongate on %s once)\n",
                sqlite3_errmsg(db), argv[1]);
        sqlite3_close(db);
        return 1;
    }
    static const char hexdig[] = "0123456789abcdef";
    for (long i = 0; i < n; i++) {
        char key[MG_KEY_LEN + 1], display[MG_KEY_DISPLAY_MAX], hex[2 * MG_KEY_DIGEST_LEN + 1];
        unsigned char digest[MG_KEY_DIGEST_LEN];
        if (mg_key_generate(key) != 0 || mg_key_digest(key, MG_KEY_LEN, digest) != 0 ||
            mg_key_display(key, display) != 0) {
            fprintf(stderr, "seed_keys: cannot generate a key\n");
            sqlite3_finalize(st);
            sqlite3_close(db);
            return 1;
        }
        for (int j = 0; j < MG_KEY_DIGEST_LEN; j++) {
            hex[2 * j] = hexdig[digest[j] >> 4];
            hex[2 * j + 1] = hexdig[digest[j] & 15];
        }
        hex[2 * MG_KEY_DIGEST_LEN] = '\0';
        sqlite3_bind_text(st, 1, hex, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, display, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, at);
        if (sqlite3_step(st) != SQLITE_DONE) {
            fprintf(stderr, "seed_keys: insert: %s\n", sqlite3_errmsg(db));
            sqlite3_finalize(st);
            sqlite3_close(db);
            return 1;
        }
        sqlite3_reset(st);
        if (i == 0 && print_first) printf("%s\n", key);
    }
    sqlite3_finalize(st);
    if (exec(db, "COMMIT") != 0) {
        sqlite3_close(db);
        return 1;
    }
    sqlite3_stmt *cnt = NULL;
    long long total = -1;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM api_keys WHERE revoked_at IS NULL", -1, &cnt,
                           NULL) == SQLITE_OK &&
        sqlite3_step(cnt) == SQLITE_ROW)
        total = sqlite3_column_int64(cnt, 0);
    sqlite3_finalize(cnt);
    sqlite3_close(db);
    fprintf(stderr, "seed_keys: %ld keys added in %.2f s, %lld in the database\n", n, now_s() - t0,
            total);
    return 0;
}
