/* Unit tests for core/pipeline/responses_store.c: a record is found before its write
 * committed (memory) and after (the database, read on the thread pool), with its scope; a
 * lookup's callback never runs inside the call that asked, and not at all once cancelled;
 * an unknown or expired id is not found; ids carry a key in time order, and migration 23
 * keeps the rows of before; without a store memory keeps the newest
 * MG_RESP_MEMORY_MAX records; the scope of a caller. Everything lives in a fresh temp
 * directory. */
#include "mgtest.h"
#include "pipeline/responses_store.h"

#include <ftw.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

typedef struct {
    int calls, found;
    char scope[64], response[256], input[256], messages[256];
} seen_t;

static void on_found(void *ud, const mg_resp_record_t *rec)
{
    seen_t *s = ud;
    s->calls++;
    s->found = rec != NULL;
    snprintf(s->scope, sizeof(s->scope), "%s", rec ? rec->scope : "");
    snprintf(s->response, sizeof(s->response), "%s", rec ? rec->response : "");
    snprintf(s->input, sizeof(s->input), "%s", rec ? rec->input : "");
    snprintf(s->messages, sizeof(s->messages), "%s", rec ? rec->messages : "");
}

static int put(mg_resp_store_t *rs, const char *id, const char *scope, const char *response,
               const char *messages)
{
    mg_resp_record_t rec = {scope, response, "[\"in\"]", messages};
    return mg_resp_store_put(rs, id, &rec);
}

/* Look id up and run the loop until the answer came. */
static seen_t lookup(mg_resp_store_t *rs, uv_loop_t *loop, const char *id)
{
    seen_t s = {0};
    mg_resp_lookup_t *l = mg_resp_store_get(rs, id, on_found, &s);
    CHECK(l != NULL);
    CHECK_EQ_INT(s.calls, 0); /* never inside the call */
    for (int i = 0; i < 1000 && s.calls == 0; i++) uv_run(loop, UV_RUN_ONCE);
    CHECK_EQ_INT(s.calls, 1);
    return s;
}

static void test_with_store(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-resp-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
    char path[300], err[256];
    snprintf(path, sizeof(path), "%s/db.sqlite", tmpdir);
    mg_store_t *st = NULL;
    CHECK_EQ_INT(mg_store_open(path, &st, err, sizeof(err)), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    CHECK_EQ_INT(mg_store_attach(st, &loop), 0);
    mg_resp_store_deps_t d = {st, &loop, NULL, NULL, NULL, 3600};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    CHECK(rs != NULL);

    char id1[64], id2[64], old[64];
    CHECK_EQ_INT(mg_resp_store_new_id(rs, "0123456789abcdef01234567", id1, sizeof(id1)), 0);
    CHECK_EQ_INT(put(rs, "resp_1", "cred:a", "{}", "[1]"), -1); /* not an id it gave out */
    CHECK_EQ_INT(put(rs, id1, "cred:a", "{\"id\":\"resp_1\"}", "[1]"), 0);
    seen_t s = lookup(rs, &loop, id1); /* before the commit: from memory */
    CHECK_EQ_INT(s.found, 1);
    CHECK_STR(s.scope, "cred:a");
    CHECK_STR(s.response, "{\"id\":\"resp_1\"}");
    CHECK_STR(s.messages, "[1]");
    CHECK_STR(s.input, "[\"in\"]");
    mg_store_flush(st);
    for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT); /* the commit's callback */
    s = lookup(rs, &loop, id1);                                /* from the database */
    CHECK_EQ_INT(s.found, 1);
    CHECK_STR(s.scope, "cred:a");
    CHECK_STR(s.messages, "[1]");
    s = lookup(rs, &loop, "resp_nope");
    CHECK_EQ_INT(s.found, 0);

    /* the same key with another id (a guessed one) is not found */
    CHECK_EQ_INT(mg_resp_store_new_id(rs, "ffffffffffffffffffffffff", id2, sizeof(id2)), 0);
    memcpy(id2 + 5, id1 + 5, 16);
    CHECK_EQ_INT(lookup(rs, &loop, id2).found, 0);

    /* an expired row is not found */
    CHECK_EQ_INT(mg_resp_store_new_id(rs, "aaaaaaaaaaaaaaaaaaaaaaaa", old, sizeof(old)), 0);
    char old_key[24];
    snprintf(old_key, sizeof(old_key), "%lld", (long long)mg_resp_store_key(old));
    const char *p[2] = {old_key, old};
    mg_store_write(
        st,
        "INSERT INTO responses(rid, id, scope, response, input, messages, created_at,"
        " expires_at) VALUES (CAST(?1 AS INTEGER), ?2, 'cred:a', '{}', '[]', '[]', 1, 2)",
        2, p);
    mg_store_flush(st);
    s = lookup(rs, &loop, old);
    CHECK_EQ_INT(s.found, 0);

    /* a cancelled lookup never calls back */
    seen_t never = {0};
    mg_resp_lookup_t *l = mg_resp_store_get(rs, id1, on_found, &never);
    mg_resp_lookup_cancel(l);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(never.calls, 0);

    mg_store_detach(st);
    uv_run(&loop, UV_RUN_DEFAULT);
    mg_store_close(st);
    mg_resp_store_free(rs);
    uv_loop_close(&loop);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void test_memory_only(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_resp_store_deps_t d = {NULL, &loop, NULL, NULL, NULL, 0};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    char id[32];
    for (int i = 0; i < MG_RESP_MEMORY_MAX + 5; i++) {
        snprintf(id, sizeof(id), "resp_%d", i);
        CHECK_EQ_INT(put(rs, id, "s", "{}", "[]"), 0);
    }
    CHECK_EQ_INT(lookup(rs, &loop, "resp_0").found, 0);
    CHECK_EQ_INT(lookup(rs, &loop, "resp_4").found, 0);
    CHECK_EQ_INT(lookup(rs, &loop, "resp_5").found, 1);
    snprintf(id, sizeof(id), "resp_%d", MG_RESP_MEMORY_MAX + 4);
    CHECK_EQ_INT(lookup(rs, &loop, id).found, 1);
    mg_resp_store_free(rs);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
}

/* Ids: "resp_" + a key in time order + the random digits; the key read back from it. */
static void test_ids(void)
{
    char a[64], b[64];
    CHECK_EQ_INT(mg_resp_store_new_id(NULL, "0123456789abcdef01234567", a, sizeof(a)), 0);
    CHECK_EQ_INT((int)strlen(a), 5 + 16 + 24);
    CHECK(strncmp(a, "resp_", 5) == 0 && strcmp(a + 21, "0123456789abcdef01234567") == 0);
    CHECK(mg_resp_store_key(a) >= 72057594037927936ll); /* above every key of before */
    CHECK_EQ_INT(mg_resp_store_new_id(NULL, "0123456789abcdef01234567", b, 10), -1);
    mg_resp_store_deps_t d = {NULL, NULL, NULL, NULL, NULL, 0};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    int64_t last = 0;
    for (int i = 0; i < 1000; i++) { /* many within a millisecond: still growing */
        CHECK_EQ_INT(mg_resp_store_new_id(rs, "0123456789abcdef01234567", b, sizeof(b)), 0);
        CHECK(mg_resp_store_key(b) > last);
        last = mg_resp_store_key(b);
    }
    mg_resp_store_free(rs);
    CHECK(mg_resp_store_key("resp_0123456789abcdef01234567") == -1); /* an id of before */
    CHECK(mg_resp_store_key("resp_00000000000000ff0123456789abcdef01234567") == -1);
    CHECK(mg_resp_store_key("resp_0123456789abcdeX0123456789abcdef01234567") == -1);
    CHECK(mg_resp_store_key("resp_1") == -1);
}

static int exec_sql(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static int count_of(const char *path, const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int n = -1;
    if (sqlite3_open(path, &db) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* Migration 23 keeps the rows of the table it rebuilds: a database written at version 22
 * (its responses table as migration 15 made it, the usage roll-ups empty) opened by this binary
 * still answers its Responses by id (expired ones excepted) and deletes them; new ones are keyed
 * above them; the start-up prune removes the expired rows older than the oldest live one. */
static void test_migration_keeps_rows(void)
{
    char dir[64], path[128], err[256];
    snprintf(dir, sizeof(dir), "/tmp/mg-resp-mig-XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/db.sqlite", dir);
    sqlite3 *db = NULL;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    CHECK_EQ_INT(exec_sql(db,
                          "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY,"
                          " applied_at TEXT NOT NULL DEFAULT (datetime('now')));"
                          "WITH RECURSIVE v(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM v"
                          " WHERE n < 22) INSERT INTO schema_migrations(version) SELECT n FROM v;"
                          "CREATE TABLE responses (id TEXT PRIMARY KEY, scope TEXT NOT NULL,"
                          " response TEXT NOT NULL, input TEXT NOT NULL, messages TEXT NOT NULL,"
                          " created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);"
                          "CREATE INDEX idx_responses_expiry ON responses(expires_at);"
                          /* the hourly roll-ups a version-22 database has (migration 13),
                           * empty: migration 24 back-fills the daily ones from them */
                          "CREATE TABLE usage_hourly (hour, tenant_id, project_id, key_id,"
                          " provider_id, model, requests, errors, cancelled, input_tokens,"
                          " output_tokens, cached_read_tokens, cache_write_tokens,"
                          " reasoning_tokens, cache_hits, missing_usage, cost_micros,"
                          " latency_ms_sum, ttft_ms_sum, ttft_count);"
                          "CREATE TABLE usage_hist (hour, tenant_id, project_id, key_id,"
                          " provider_id, model, kind, bin, n);"
                          "INSERT INTO responses VALUES ('resp_000000000000000000000001',"
                          " 'cred:a', '{}', '[]', '[]', 1, 2);"
                          "INSERT INTO responses VALUES ('resp_9a3f00c1d2e4b5a6c7d8e9f0',"
                          " 'cred:a', '{\"id\":\"kept\"}', '[\"in\"]', '[2]', 1, 9999999999);"
                          "INSERT INTO responses VALUES ('resp_0123456789abcdef01234567',"
                          " 'cred:a', '{}', '[]', '[]', 1, 2);"
                          "INSERT INTO responses VALUES ('resp_ffffffffffffffffffffffff',"
                          " 'cred:b', '{}', '[]', '[]', 1, 9999999999);"),
                 0);
    sqlite3_close(db);

    mg_store_t *st = NULL;
    CHECK_EQ_INT(mg_store_open(path, &st, err, sizeof(err)), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    CHECK_EQ_INT(mg_store_attach(st, &loop), 0);
    mg_resp_store_deps_t d = {st, &loop, NULL, NULL, NULL, 3600};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    seen_t s = lookup(rs, &loop, "resp_9a3f00c1d2e4b5a6c7d8e9f0");
    CHECK_EQ_INT(s.found, 1);
    CHECK_STR(s.response, "{\"id\":\"kept\"}");
    CHECK_STR(s.messages, "[2]");
    CHECK_STR(s.input, "[\"in\"]");
    CHECK_EQ_INT(lookup(rs, &loop, "resp_0123456789abcdef01234567").found, 0); /* expired */
    mg_store_flush(st);
    /* the prune took the expired row before the oldest live one, not the one after it */
    CHECK_EQ_INT(count_of(path, "SELECT count(*) FROM responses"), 3);
    CHECK_EQ_INT(
        count_of(path, "SELECT count(*) FROM responses WHERE id = 'resp_000000000000000000000001'"),
        0);
    CHECK_EQ_INT(count_of(path, "SELECT max(rid) FROM responses"), 4); /* order and rows kept */

    char id[64];
    CHECK_EQ_INT(mg_resp_store_new_id(rs, "0123456789abcdef01234567", id, sizeof(id)), 0);
    CHECK_EQ_INT(put(rs, id, "cred:a", "{}", "[]"), 0);
    mg_store_flush(st);
    for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT);
    CHECK_EQ_INT(lookup(rs, &loop, id).found, 1);
    CHECK_EQ_INT(count_of(path, "SELECT count(*) FROM responses WHERE rid >= 72057594037927936"),
                 1);

    mg_store_detach(st);
    uv_run(&loop, UV_RUN_DEFAULT);
    mg_store_close(st);
    mg_resp_store_free(rs);
    uv_loop_close(&loop);
    nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static void test_scope(void)
{
    mg_auth_result_t r;
    memset(&r, 0, sizeof(r));
    r.tenant_id = 3;
    r.project_id = 4;
    char out[128];
    mg_resp_scope(&r, NULL, out, sizeof(out));
    CHECK_STR(out, "tenant:3/project:4");
    mg_http_req_t req;
    memset(&req, 0, sizeof(req));
    mg_resp_scope(NULL, &req, out, sizeof(out));
    CHECK_STR(out, "cred:-");
    mg_http_header_t h[1] = {{"Authorization", "Bearer sk-1"}};
    req.headers = h;
    req.n_headers = 1;
    mg_resp_scope(NULL, &req, out, sizeof(out));
    CHECK(strncmp(out, "cred:", 5) == 0 && strlen(out) == 5 + 64);
    CHECK(strstr(out, "sk-1") == NULL); /* the credential's digest, never itself */
}

int main(void)
{
    MG_RUN(test_with_store);
    MG_RUN(test_memory_only);
    MG_RUN(test_scope);
    MG_RUN(test_ids);
    MG_RUN(test_migration_keeps_rows);
    return mg_test_summary();
}
