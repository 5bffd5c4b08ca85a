/* Unit tests for core/cluster/control_sql.c, the SQLite side of the replicated control plane:
 * changes made on one store's connection are captured by the TEMP triggers (whole rows as
 * JSON, deletes by key, audit rows as appends), applied to a second store they give the same
 * rows, applying them again changes nothing (upserts), a delete removes the row, a rolled
 * back transaction takes its triggers with it and the next one recreates them, a
 * connection without the triggers (the writer's, the follower's) captures nothing; a put
 * whose secondary UNIQUE key a local row of another id holds wins over that row (a partial
 * index only where its condition holds), and an entry this binary cannot apply (a column it
 * does not know, a constraint it breaks, an unknown op) says so as CP_UNAPPLICABLE; a 'del'
 * reports the row it deleted; the audit records kept while the log was out of reach are listed
 * for shipping and removed once shipped. */
#include "mgtest.h"
#include "store_fixture.h"
#include "cluster/control_sql.h"
#include "base/json.h"
#include "store/store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static sqlite3 *open_store(const char *name, mg_store_t **st)
{
    char path[128], err[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (mg_store_open(path, st, err, sizeof(err)) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return NULL;
    }
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    sqlite3_busy_timeout(db, 5000);
    return db;
}

static int exec(sqlite3 *db, const char *sql)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc != SQLITE_OK) fprintf(stderr, "%s: %s\n", sql, msg ? msg : "?");
    sqlite3_free(msg);
    return rc == SQLITE_OK ? 0 : -1;
}

/* Every row of table ti as JSON text, in key order: what two stores must agree on. */
static char *dump(const cp_schema_t *s, sqlite3 *db, int ti)
{
    mg_buf_t q = {0}, out = {0};
    mg_buf_append_str(&q, "SELECT ");
    cp_json_expr(&s->t[ti], "", &q);
    mg_buf_append_str(&q, " FROM ");
    mg_buf_append_str(&q, s->t[ti].name);
    mg_buf_append_str(&q, " ORDER BY 1");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, q.data, -1, &st, NULL) == SQLITE_OK)
        while (sqlite3_step(st) == SQLITE_ROW) {
            mg_buf_append_str(&out, (const char *)sqlite3_column_text(st, 0));
            mg_buf_append_str(&out, "\n");
        }
    sqlite3_finalize(st);
    mg_buf_free(&q);
    if (!out.data) mg_buf_append_str(&out, "");
    return out.data;
}

/* Apply every outbox row of src to dst in one transaction; the number applied. */
static int replay(const cp_schema_t *s, sqlite3 *src, sqlite3 *dst)
{
    sqlite3_stmt *st = NULL;
    int n = 0;
    char err[256];
    if (sqlite3_prepare_v2(src, "SELECT tbl, pk, op, row FROM temp.mg_outbox ORDER BY rowid", -1,
                           &st, NULL) != SQLITE_OK)
        return -1;
    exec(dst, "BEGIN IMMEDIATE");
    while (sqlite3_step(st) == SQLITE_ROW) {
        int ti = cp_schema_find(s, (const char *)sqlite3_column_text(st, 0));
        if (ti < 0 ||
            cp_apply(s, dst, ti, (const char *)sqlite3_column_text(st, 2),
                     (const char *)sqlite3_column_text(st, 1),
                     (const char *)sqlite3_column_text(st, 3), NULL, NULL, err, sizeof(err)) != 0) {
            fprintf(stderr, "apply: %s\n", err);
            n = -1;
            break;
        }
        n++;
    }
    sqlite3_finalize(st);
    exec(dst, n < 0 ? "ROLLBACK" : "COMMIT");
    return n;
}

static mg_store_t *sa, *sb;
static sqlite3 *a, *b;
static cp_schema_t schema;

static void test_capture_and_apply(void)
{
    char err[256];
    CHECK_EQ_INT(exec(a, "BEGIN IMMEDIATE"), 0);
    CHECK_EQ_INT(cp_capture_ensure(&schema, a, err, sizeof(err)), 0);
    CHECK_EQ_INT(
        exec(a,
             "INSERT INTO tenants(name, created_at) VALUES ('acme', 1);"
             "INSERT INTO projects(tenant_id, name, rpm_limit, created_at) VALUES (1, 'web', 9, 2);"
             "INSERT INTO api_keys(tenant_id, project_id, name, digest, display, created_at)"
             " VALUES (1, 1, 'k', '" /* a digest, never a key */
             "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', 'mg-…cdef', 3);"
             "INSERT INTO providers(id, name, api_key, endpoint_url, weight)"
             " VALUES ('p_1', 'up', 'enc:v1:ciphertext', 'http://127.0.0.1:1/v1', 0.5);"
             "INSERT INTO system_config(key, value) VALUES ('a', '1'), ('b', '[\"x\"]');"
             "UPDATE projects SET rpm_limit = 10 WHERE id = 1;"
             "DELETE FROM system_config WHERE key = 'a';"
             "INSERT INTO audit_logs(at, actor, action, status) VALUES (5, 'admin', 't', 201);"),
        0);
    CHECK_EQ_INT(mgt_sql_int(a, "SELECT COUNT(*) FROM temp.mg_outbox"), 9);
    CHECK_EQ_INT(
        mgt_sql_int(a, "SELECT COUNT(*) FROM temp.mg_outbox WHERE op = 'del' AND pk = 'a'"), 1);
    CHECK_EQ_INT(mgt_sql_int(a, "SELECT COUNT(*) FROM temp.mg_outbox WHERE op = 'add'"), 1);
    CHECK_EQ_INT(replay(&schema, a, b), 9);
    CHECK_EQ_INT(exec(a, "COMMIT"), 0);
    const char *tables[] = {"tenants", "projects", "api_keys", "providers", "system_config"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(*tables); i++) {
        int ti = cp_schema_find(&schema, tables[i]);
        char *x = dump(&schema, a, ti), *y = dump(&schema, b, ti);
        CHECK(strlen(x) > 0);
        CHECK_STR(y, x);
        free(x);
        free(y);
    }
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT rpm_limit FROM projects WHERE id = 1"), 10);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM system_config WHERE key = 'a'"), 0);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM audit_logs WHERE action = 't'"), 1);
    /* the next id is the same on both sides */
    exec(a, "INSERT INTO tenants(name, created_at) VALUES ('next', 1)");
    exec(b, "INSERT INTO tenants(name, created_at) VALUES ('next', 1)");
    CHECK_EQ_INT(mgt_sql_int(a, "SELECT id FROM tenants WHERE name = 'next'"),
                 mgt_sql_int(b, "SELECT id FROM tenants WHERE name = 'next'"));
}

static void test_apply_again_is_harmless(void)
{
    char err[256];
    int ti = cp_schema_find(&schema, "projects");
    char *before = dump(&schema, b, ti);
    const char *row = "{\"id\":1,\"tenant_id\":1,\"name\":\"web\",\"rpm_limit\":10,\"tpm_limit\":0,"
                      "\"max_concurrency\":0,\"monthly_limit_micros\":0,\"created_at\":2,"
                      "\"daily_limit_micros\":0}";
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(cp_apply(&schema, b, ti, "put", "1", row, NULL, NULL, err, sizeof(err)), 0);
    char *after = dump(&schema, b, ti);
    CHECK_STR(after, before);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM projects"), 1);
    free(before);
    free(after);
    CHECK_EQ_INT(cp_apply(&schema, b, cp_schema_find(&schema, "system_config"), "del", "b", NULL,
                          NULL, NULL, err, sizeof(err)),
                 0);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM system_config WHERE key = 'b'"), 0);
    CHECK(cp_apply(&schema, b, ti, "put", "1", NULL, NULL, NULL, err, sizeof(err)) !=
          0); /* no row */
}

static void test_rollback_takes_the_triggers(void)
{
    char err[256];
    sqlite3 *c = NULL;
    char path[128];
    snprintf(path, sizeof(path), "%s/a.db", dir);
    sqlite3_open(path, &c);
    sqlite3_busy_timeout(c, 5000);
    CHECK_EQ_INT(exec(c, "BEGIN IMMEDIATE"), 0);
    CHECK_EQ_INT(cp_capture_ensure(&schema, c, err, sizeof(err)), 0);
    CHECK_EQ_INT(exec(c, "ROLLBACK"), 0);
    CHECK_EQ_INT(mgt_sql_int(c, "SELECT COUNT(*) FROM sqlite_temp_master"), 0);
    CHECK_EQ_INT(exec(c, "BEGIN IMMEDIATE"), 0);
    CHECK_EQ_INT(cp_capture_ensure(&schema, c, err, sizeof(err)), 0);
    exec(c, "INSERT INTO tenants(name, created_at) VALUES ('again', 1)");
    CHECK_EQ_INT(mgt_sql_int(c, "SELECT COUNT(*) FROM temp.mg_outbox WHERE tbl = 'tenants'"), 1);
    CHECK_EQ_INT(exec(c, "COMMIT"), 0);
    /* another connection has no triggers: its writes are not captured */
    exec(b, "INSERT INTO tenants(name, created_at) VALUES ('local', 1)");
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM sqlite_temp_master"), 0);
    sqlite3_close(c);
}

static void test_state(void)
{
    char err[256];
    CHECK_EQ_INT(cp_state_ensure(b, err, sizeof(err)), 0);
    CHECK_EQ_INT(cp_state_ensure(b, err, sizeof(err)), 0);
    CHECK_EQ_INT(cp_state_applied(b), 0);
    CHECK_EQ_INT(cp_state_set(b, 42, err, sizeof(err)), 0);
    CHECK_EQ_INT(cp_state_applied(b), 42);
    CHECK_EQ_INT(cp_schema_find(&schema, "usage_events"), -1); /* per node: not replicated */
}

/* A row of table ti as the log would carry it: the row of db selected by where, with sets
 * (json_set's arguments) applied. */
static char *row_like(int ti, sqlite3 *db, const char *where, const char *sets)
{
    mg_buf_t q = {0};
    mg_buf_append_str(&q, "SELECT json_set(");
    cp_json_expr(&schema.t[ti], "", &q);
    mg_buf_append_str(&q, ", ");
    mg_buf_append_str(&q, sets);
    mg_buf_append_str(&q, ") FROM ");
    mg_buf_append_str(&q, schema.t[ti].name);
    mg_buf_append_str(&q, " WHERE ");
    mg_buf_append_str(&q, where);
    sqlite3_stmt *st = NULL;
    char *out = NULL;
    if (sqlite3_prepare_v2(db, q.data, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        out = strdup((const char *)sqlite3_column_text(st, 0));
    else fprintf(stderr, "row_like: %s\n", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    mg_buf_free(&q);
    return out;
}

/* What cp_apply evicted: "<table>:<id>:<digest>" of each deleted row, space-separated. */
typedef struct {
    char seen[256];
} evicted_t;

static void on_evicted(void *ud, int ti, sqlite3_stmt *row)
{
    evicted_t *e = ud;
    const char *id = NULL, *digest = "-";
    for (int i = 0; i < sqlite3_column_count(row); i++) {
        const char *name = sqlite3_column_name(row, i);
        const char *v = (const char *)sqlite3_column_text(row, i);
        if (strcmp(name, "id") == 0) id = v;
        else if (strcmp(name, "digest") == 0 && v) digest = v;
    }
    size_t n = strlen(e->seen);
    snprintf(e->seen + n, sizeof(e->seen) - n, "%s%s:%s:%s", n ? " " : "", schema.t[ti].name,
             id ? id : "?", digest);
}

static void test_the_log_wins_a_unique_conflict(void)
{
    evicted_t ev = {""};
    char err[256];
    int tt = cp_schema_find(&schema, "tenants"), kt = cp_schema_find(&schema, "api_keys");
    CHECK(schema.t[tt].evict != NULL);
    CHECK(schema.t[cp_schema_find(&schema, "system_config")].evict == NULL); /* none */
    /* a tenant named 'taken' here with id 50; the log's 'taken' is id 60 */
    CHECK_EQ_INT(exec(b, "INSERT INTO tenants(id, name, created_at) VALUES (50, 'taken', 1)"), 0);
    char *t60 = row_like(tt, b, "id = 50", "'$.id', 60, '$.created_at', 7");
    CHECK_EQ_INT(exec(b, "BEGIN IMMEDIATE"), 0);
    CHECK_EQ_INT(cp_apply(&schema, b, tt, "put", "60", t60, NULL, NULL, err, sizeof(err)), 0);
    CHECK_EQ_INT(exec(b, "COMMIT"), 0);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM tenants WHERE id = 50"), 0);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT created_at FROM tenants WHERE id = 60 AND name = 'taken'"),
                 7);
    /* a key's name is unique per tenant among the unrevoked: a live local 'dup' goes, a
     * revoked local 'old' stays (outside the partial index) */
    CHECK_EQ_INT(exec(b, "INSERT INTO api_keys(id, tenant_id, name, digest, display, created_at)"
                         " VALUES (70, 1, 'dup', 'd70', 'mg-…d70', 1),"
                         " (72, 1, 'old', 'd72', 'mg-…d72', 1);"
                         "UPDATE api_keys SET revoked_at = 5 WHERE id = 72"),
                 0);
    char *k71 = row_like(kt, b, "id = 70", "'$.id', 71, '$.digest', 'd71'");
    char *k73 = row_like(kt, b, "id = 70", "'$.id', 73, '$.digest', 'd73', '$.name', 'old'");
    CHECK_EQ_INT(cp_apply(&schema, b, kt, "put", "71", k71, on_evicted, &ev, err, sizeof(err)), 0);
    CHECK_EQ_INT(cp_apply(&schema, b, kt, "put", "73", k73, on_evicted, &ev, err, sizeof(err)), 0);
    CHECK_STR(ev.seen, "api_keys:70:d70"); /* the evicted row, for memory to forget */
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM api_keys WHERE id IN (71, 72, 73)"), 3);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM api_keys WHERE id = 70"), 0);
    /* the same digest under another id: the log's row wins too */
    char *k74 = row_like(kt, b, "id = 71", "'$.id', 74, '$.name', 'other'");
    ev.seen[0] = '\0';
    CHECK_EQ_INT(cp_apply(&schema, b, kt, "put", "74", k74, on_evicted, &ev, err, sizeof(err)), 0);
    CHECK_STR(ev.seen, "api_keys:71:d71");
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT id FROM api_keys WHERE digest = 'd71'"), 74);
    free(t60);
    free(k71);
    free(k73);
    free(k74);
}

static void test_a_del_reports_the_deleted_key(void)
{
    evicted_t ev = {""};
    char err[256];
    int kt = cp_schema_find(&schema, "api_keys");
    CHECK_EQ_INT(cp_apply(&schema, b, kt, "del", "73", NULL, on_evicted, &ev, err, sizeof(err)), 0);
    CHECK_STR(ev.seen, "api_keys:73:d73"); /* memory forgets it by its digest */
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM api_keys WHERE id = 73"), 0);
    ev.seen[0] = '\0';
    CHECK_EQ_INT(cp_apply(&schema, b, kt, "del", "73", NULL, on_evicted, &ev, err, sizeof(err)), 0);
    CHECK_STR(ev.seen, ""); /* gone already: nothing to forget */
}

/* Audit records kept while the log was out of reach: written through the view (one statement:
 * the record and its id), listed oldest first with the row a capture would have made, a
 * record gone meanwhile listed with a NULL id, and removed up to an id once shipped. */
static void test_unshipped_audit_records(void)
{
    char err[256];
    CHECK_EQ_INT(cp_unshipped_any(b), 0);
    CHECK_EQ_INT(exec(b, "INSERT INTO audit_unshipped_new(at, actor, action, target, status)"
                         " VALUES (5, 'admin', 'tenant.create', NULL, 503);"
                         "INSERT INTO audit_logs(at, actor, action, status)"
                         " VALUES (6, 'admin', 'shipped.already', 200);"
                         "INSERT INTO audit_unshipped_new(at, actor, action, target, status)"
                         " VALUES (7, 'system', 'config.reload', 'x', 200);"),
                 0);
    CHECK_EQ_INT(cp_unshipped_any(b), 1);
    long long first = mgt_sql_int(b, "SELECT id FROM audit_logs WHERE action = 'tenant.create'");
    long long second = mgt_sql_int(b, "SELECT id FROM audit_logs WHERE action = 'config.reload'");
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM audit_unshipped"), 2);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT MIN(id) FROM audit_unshipped"), first);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT MAX(id) FROM audit_unshipped"), second);
    CHECK_EQ_INT(exec(b, "DELETE FROM audit_logs WHERE action = 'config.reload'"), 0);
    sqlite3_stmt *st = NULL;
    CHECK_EQ_INT(sqlite3_prepare_v2(b, schema.unshipped, -1, &st, NULL), SQLITE_OK);
    sqlite3_bind_int(st, 1, 10);
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_ROW);
    CHECK_EQ_INT(sqlite3_column_int64(st, 1), first);
    const char *row = (const char *)sqlite3_column_text(st, 2);
    CHECK(row && strstr(row, "\"action\":\"tenant.create\"") && strstr(row, "\"status\":503"));
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_ROW);
    CHECK_EQ_INT(sqlite3_column_int64(st, 0), second);
    CHECK_EQ_INT(sqlite3_column_type(st, 1), SQLITE_NULL); /* the record is gone */
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    CHECK_EQ_INT(cp_unshipped_clear(b, first, err, sizeof(err)), 0);
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM audit_unshipped"), 1);
    CHECK_EQ_INT(cp_unshipped_clear(b, second, err, sizeof(err)), 0);
    CHECK_EQ_INT(cp_unshipped_any(b), 0);
}

static void test_an_entry_this_binary_cannot_apply(void)
{
    char err[256] = "";
    int tt = cp_schema_find(&schema, "tenants");
    char *future = row_like(tt, b, "id = 60", "'$.id', 61, '$.name', 'f', '$.region', 'eu'");
    CHECK_EQ_INT(cp_apply(&schema, b, tt, "put", "61", future, NULL, NULL, err, sizeof(err)),
                 CP_UNAPPLICABLE);
    CHECK(strstr(err, "region") != NULL);
    CHECK(strstr(err, "eu") == NULL); /* names, never values */
    CHECK_EQ_INT(mgt_sql_int(b, "SELECT COUNT(*) FROM tenants WHERE id = 61"), 0);
    char *noname = row_like(tt, b, "id = 60", "'$.id', 62, '$.name', NULL");
    CHECK_EQ_INT(cp_apply(&schema, b, tt, "put", "62", noname, NULL, NULL, err, sizeof(err)),
                 CP_UNAPPLICABLE);
    CHECK(strstr(err, "NOT NULL") != NULL);
    CHECK_EQ_INT(cp_apply(&schema, b, tt, "merge", "60", noname, NULL, NULL, err, sizeof(err)),
                 CP_UNAPPLICABLE);
    CHECK_EQ_INT(cp_apply(&schema, b, tt, "put", "60", "[1,2]", NULL, NULL, err, sizeof(err)),
                 CP_UNAPPLICABLE);
    free(future);
    free(noname);
}

int main(void)
{
    if (mgt_tmpdir(dir, sizeof(dir), "control-sql") != 0) return 1;
    char err[256];
    a = open_store("a.db", &sa);
    b = open_store("b.db", &sb);
    if (!a || !b || cp_schema_build(&schema, a, err, sizeof(err)) != 0) {
        fprintf(stderr, "setup: %s\n", err);
        return 1;
    }
    MG_RUN(test_capture_and_apply);
    MG_RUN(test_apply_again_is_harmless);
    MG_RUN(test_rollback_takes_the_triggers);
    MG_RUN(test_state);
    MG_RUN(test_the_log_wins_a_unique_conflict);
    MG_RUN(test_a_del_reports_the_deleted_key);
    MG_RUN(test_unshipped_audit_records);
    MG_RUN(test_an_entry_this_binary_cannot_apply);
    cp_schema_free(&schema);
    sqlite3_close(a);
    sqlite3_close(b);
    mg_store_close(sa);
    mg_store_close(sb);
    if (mgt_rmtree(dir) != 0) fprintf(stderr, "cannot remove %s\n", dir);
    return mg_test_summary();
}
