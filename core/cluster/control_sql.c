/* control_sql: the SQLite side of the replicated control plane; see control_sql.h. */
#include "cluster/control_sql.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* The control plane: what an admin write changes (admin/control.h). Per-node state
 * (provider runtime state, usage, caches) is not here. */
static const struct {
    const char *name, *pk;
    int flags;
} TABLES[CP_NTABLES] = {
    {"tenants", "id", CT_AUTH},           {"projects", "id", CT_AUTH},
    {"api_keys", "id", CT_AUTH},          {"admin_tokens", "id", 0},
    {"providers", "id", CT_REBUILD},      {"models", "name", CT_REBUILD},
    {"applications", "name", CT_REBUILD}, {"prices", "id", CT_REBUILD},
    {"system_config", "key", CT_REBUILD}, {"audit_logs", "id", CT_APPEND},
};

static int exec(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK) return 0;
    snprintf(err, errlen, "%s", msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return -1;
}

static int load_cols(cp_table_t *t, sqlite3 *db, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?1) ORDER BY cid", -1, &st,
                           NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(db));
        return -1;
    }
    sqlite3_bind_text(st, 1, t->name, -1, SQLITE_STATIC);
    int rc = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        char **v = realloc(t->cols, (size_t)(t->ncols + 1) * sizeof(*v));
        char *c = strdup((const char *)sqlite3_column_text(st, 0));
        if (!v || !c) {
            free(c);
            if (v) t->cols = v;
            rc = -1;
            break;
        }
        t->cols = v;
        t->cols[t->ncols++] = c;
    }
    sqlite3_finalize(st);
    if (rc == 0 && t->ncols == 0) {
        snprintf(err, errlen, "table %s has no columns", t->name);
        return -1;
    }
    if (rc != 0) snprintf(err, errlen, "out of memory");
    return rc;
}

/* sql: text appended; 0 or -1 (out of memory). */
static int add(mg_buf_t *b, const char *s)
{
    return mg_buf_append_str(b, s);
}

/* ("c1", "c2", ...) and SELECT json_extract(?1, '$."c1"'), ... of the columns (skip: one
 * column left out, or NULL). */
static int cols_and_values(const cp_table_t *t, const char *skip, mg_buf_t *b)
{
    int rc = add(b, "(");
    for (int i = 0, n = 0; i < t->ncols; i++) {
        if (skip && strcmp(t->cols[i], skip) == 0) continue;
        rc |= add(b, n++ ? ", \"" : "\"") | add(b, t->cols[i]) | add(b, "\"");
    }
    rc |= add(b, ") SELECT ");
    for (int i = 0, n = 0; i < t->ncols; i++) {
        if (skip && strcmp(t->cols[i], skip) == 0) continue;
        rc |= add(b, n++ ? ", json_extract(?1, '$.\"" : "json_extract(?1, '$.\"") |
              add(b, t->cols[i]) | add(b, "\"')");
    }
    return rc | add(b, " WHERE true"); /* "WHERE true": SQLite's parser needs it before ON */
}

static char *build_upsert(const cp_table_t *t)
{
    mg_buf_t b = {0};
    int rc = add(&b, "INSERT INTO main.\"") | add(&b, t->name) | add(&b, "\"");
    rc |= cols_and_values(t, NULL, &b);
    rc |= add(&b, " ON CONFLICT(\"") | add(&b, t->pk) | add(&b, "\") DO UPDATE SET ");
    for (int i = 0, n = 0; i < t->ncols; i++) {
        if (strcmp(t->cols[i], t->pk) == 0) continue;
        rc |= add(&b, n++ ? ", \"" : "\"") | add(&b, t->cols[i]) | add(&b, "\" = excluded.\"") |
              add(&b, t->cols[i]) | add(&b, "\"");
    }
    if (rc) mg_buf_free(&b);
    return rc ? NULL : b.data;
}

static char *build_append(const cp_table_t *t)
{
    mg_buf_t b = {0};
    int rc = add(&b, "INSERT INTO main.\"") | add(&b, t->name) | add(&b, "\"");
    rc |= cols_and_values(t, t->pk, &b);
    if (rc) mg_buf_free(&b);
    return rc ? NULL : b.data;
}

static char *build_del(const cp_table_t *t)
{
    mg_buf_t b = {0};
    int rc = add(&b, "DELETE FROM main.\"") | add(&b, t->name) | add(&b, "\" WHERE \"") |
             add(&b, t->pk) | add(&b, "\" = ?1 RETURNING *");
    if (rc) mg_buf_free(&b);
    return rc ? NULL : b.data;
}

/* The text after an index's last " WHERE " (a partial index's condition), or NULL. */
static const char *partial_where(const char *sql)
{
    const char *w = NULL;
    for (const char *p = sql; p && (p = strstr(p, " WHERE ")); p++) w = p + 7;
    return w;
}

/* One UNIQUE index's term of the eviction, "(c1 = json_extract(..) AND ..)", onto b; 0, 1
 * (skipped: an expression index) or -1. */
static int evict_term(sqlite3 *db, const char *index, const char *sql, mg_buf_t *b, int first)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_index_info(?1) ORDER BY seqno", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, index, -1, SQLITE_TRANSIENT);
    mg_buf_t t = {0};
    int rc = add(&t, first ? "(" : " OR ("), n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *c = (const char *)sqlite3_column_text(st, 0);
        if (!c) { /* an expression: not matched here (a conflict on it stalls instead) */
            n = -1;
            break;
        }
        rc |= add(&t, n++ ? " AND \"" : "\"") | add(&t, c) |
              add(&t, "\" = json_extract(?1, '$.\"") | add(&t, c) | add(&t, "\"')");
    }
    sqlite3_finalize(st);
    const char *w = sql ? partial_where(sql) : NULL;
    if (w) rc |= add(&t, " AND (") | add(&t, w) | add(&t, ")");
    rc |= add(&t, ")");
    if (rc == 0 && n > 0) rc = add(b, t.data);
    mg_buf_free(&t);
    return rc ? -1 : (n > 0 ? 0 : 1);
}

/* DELETE the rows of other keys that hold one of the row's secondary UNIQUE keys; *out NULL
 * when the table has none. 0 or -1. */
static int build_evict(const cp_table_t *t, sqlite3 *db, char **out)
{
    *out = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT l.name, m.sql FROM pragma_index_list(?1) l"
                           " LEFT JOIN sqlite_master m ON m.type = 'index' AND m.name = l.name"
                           " WHERE l.\"unique\" AND l.origin <> 'pk'",
                           -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, t->name, -1, SQLITE_STATIC);
    mg_buf_t b = {0};
    int rc = add(&b, "DELETE FROM main.\"") | add(&b, t->name) | add(&b, "\" WHERE \"") |
             add(&b, t->pk) | add(&b, "\" IS NOT json_extract(?1, '$.\"") | add(&b, t->pk) |
             add(&b, "\"') AND (");
    int terms = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        int e = evict_term(db, (const char *)sqlite3_column_text(st, 0),
                           (const char *)sqlite3_column_text(st, 1), &b, terms == 0);
        if (e < 0) rc = -1;
        else if (e == 0) terms++;
    }
    sqlite3_finalize(st);
    rc |= add(&b, ") RETURNING *");
    if (rc == 0 && terms > 0) *out = b.data;
    else mg_buf_free(&b);
    return rc;
}

int cp_json_expr(const cp_table_t *t, const char *prefix, mg_buf_t *b)
{
    int rc = add(b, "json_object(");
    for (int i = 0; i < t->ncols; i++)
        rc |= add(b, i ? ", '" : "'") | add(b, t->cols[i]) | add(b, "', ") | add(b, prefix) |
              add(b, "\"") | add(b, t->cols[i]) | add(b, "\"");
    return rc | add(b, ")");
}

/* The unshipped audit records, oldest first: their id, the record's id (NULL: gone) and the
 * record as the capture trigger has it (?1: at most so many). */
static char *build_unshipped(const cp_table_t *audit)
{
    mg_buf_t b = {0};
    int rc = add(&b, "SELECT u.id, a.id, ") | cp_json_expr(audit, "a.", &b) |
             add(&b, " FROM main.audit_unshipped u LEFT JOIN main.audit_logs a ON a.id = u.id"
                     " ORDER BY u.id LIMIT ?1");
    if (rc) mg_buf_free(&b);
    return rc ? NULL : b.data;
}

int cp_schema_build(cp_schema_t *s, sqlite3 *db, char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < CP_NTABLES; i++) {
        cp_table_t *t = &s->t[i];
        t->name = TABLES[i].name;
        t->pk = TABLES[i].pk;
        t->flags = TABLES[i].flags;
        if (load_cols(t, db, err, errlen) != 0) goto fail;
        t->upsert = build_upsert(t);
        t->append = build_append(t);
        t->del = build_del(t);
        if (!t->upsert || !t->append || !t->del || build_evict(t, db, &t->evict) != 0) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
    }
    if (!(s->unshipped = build_unshipped(&s->t[cp_schema_find(s, "audit_logs")]))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    return 0;
fail:
    cp_schema_free(s);
    return -1;
}

void cp_schema_free(cp_schema_t *s)
{
    for (int i = 0; i < CP_NTABLES; i++) {
        cp_table_t *t = &s->t[i];
        for (int j = 0; j < t->ncols; j++) free(t->cols[j]);
        free(t->cols);
        free(t->upsert);
        free(t->append);
        free(t->del);
        free(t->evict);
    }
    free(s->unshipped);
    memset(s, 0, sizeof(*s));
}

int cp_schema_find(const cp_schema_t *s, const char *name)
{
    for (int i = 0; i < CP_NTABLES; i++)
        if (s->t[i].name && strcmp(s->t[i].name, name) == 0) return i;
    return -1;
}

int cp_state_ensure(sqlite3 *db, char *err, size_t errlen)
{
    return exec(db,
                "CREATE TABLE IF NOT EXISTS main.control_state (id INTEGER PRIMARY KEY"
                " CHECK (id = 1), applied INTEGER NOT NULL);"
                "INSERT OR IGNORE INTO main.control_state VALUES (1, 0);",
                err, errlen);
}

/* The first column of sql's first row, or none (no row, or it failed). */
static int64_t first_int(sqlite3 *db, const char *sql, int64_t none)
{
    sqlite3_stmt *st = NULL;
    int64_t v = none;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) return none;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* sql_fmt with its one %lld: id. 0 or -1 with err set. */
static int exec_with_id(sqlite3 *db, const char *sql_fmt, int64_t id, char *err, size_t errlen)
{
    char sql[128];
    snprintf(sql, sizeof(sql), sql_fmt, (long long)id);
    return exec(db, sql, err, errlen);
}

int64_t cp_state_applied(sqlite3 *db)
{
    return first_int(db, "SELECT applied FROM main.control_state WHERE id = 1", -1);
}

int cp_state_set(sqlite3 *db, int64_t id, char *err, size_t errlen)
{
    return exec_with_id(db, "UPDATE main.control_state SET applied = %lld WHERE id = 1", id, err,
                        errlen);
}

/* The three triggers of one table: AFTER INSERT and UPDATE capture the new row, AFTER
 * DELETE the key. TEMP: they live on the admin connection only, so the writer thread's
 * own updates (last_used_at) and the follower's applies are never captured. */
static int capture_table(const cp_table_t *t, sqlite3 *db, char *err, size_t errlen)
{
    static const char *const ev[2] = {"INSERT", "UPDATE"};
    const char *op = (t->flags & CT_APPEND) ? "add" : "put";
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        mg_buf_t b = {0};
        int e = add(&b, "CREATE TEMP TRIGGER \"mg_cap_") | add(&b, t->name) | add(&b, "_") |
                add(&b, ev[k]) | add(&b, "\" AFTER ") | add(&b, ev[k]) | add(&b, " ON main.\"") |
                add(&b, t->name) | add(&b, "\" BEGIN INSERT INTO mg_outbox VALUES ('") |
                add(&b, t->name) | add(&b, "', NEW.\"") | add(&b, t->pk) | add(&b, "\", '") |
                add(&b, op) | add(&b, "', ");
        e |= cp_json_expr(t, "NEW.", &b) | add(&b, "); END;");
        rc = e ? -1 : exec(db, b.data, err, errlen);
        mg_buf_free(&b);
    }
    if (rc != 0 || (t->flags & CT_APPEND)) return rc;
    mg_buf_t b = {0};
    int e = add(&b, "CREATE TEMP TRIGGER \"mg_cap_") | add(&b, t->name) |
            add(&b, "_DELETE\" AFTER DELETE ON main.\"") | add(&b, t->name) |
            add(&b, "\" BEGIN INSERT INTO mg_outbox VALUES ('") | add(&b, t->name) |
            add(&b, "', OLD.\"") | add(&b, t->pk) | add(&b, "\", 'del', NULL); END;");
    rc = e ? -1 : exec(db, b.data, err, errlen);
    mg_buf_free(&b);
    return rc;
}

int cp_capture_ensure(const cp_schema_t *s, sqlite3 *db, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int have = 0;
    if (sqlite3_prepare_v2(db,
                           "SELECT 1 FROM sqlite_temp_master WHERE type = 'table'"
                           " AND name = 'mg_outbox'",
                           -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(db));
        return -1;
    }
    have = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    if (have) return 0;
    if (exec(db, "CREATE TEMP TABLE mg_outbox (tbl TEXT, pk TEXT, op TEXT, row TEXT)", err,
             errlen) != 0)
        return -1;
    for (int i = 0; i < CP_NTABLES; i++)
        if (capture_table(&s->t[i], db, err, errlen) != 0) return -1;
    return 0;
}

int cp_outbox_clear(sqlite3 *db)
{
    return sqlite3_exec(db, "DELETE FROM temp.mg_outbox", NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

/* A key of the row's JSON object that is not a column here (a newer binary's): 0 none, 1
 * (named in err), -1 not an object. */
static int unknown_column(const cp_table_t *t, sqlite3 *db, const char *row, char *err,
                          size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT key FROM json_each(?1) WHERE json_valid(?1)", -1, &st,
                           NULL) != SQLITE_OK) {
        snprintf(err, errlen, "log entry of %s: its row is not JSON", t->name);
        return -1;
    }
    sqlite3_bind_text(st, 1, row, -1, SQLITE_STATIC);
    int found = 0, rows = 0;
    while (!found && sqlite3_step(st) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 0);
        rows++;
        found = 1;
        for (int i = 0; k && i < t->ncols && found; i++)
            if (strcmp(t->cols[i], k) == 0) found = 0;
        if (found) snprintf(err, errlen, "%s has no column %.64s here", t->name, k ? k : "?");
    }
    sqlite3_finalize(st);
    if (!found && rows == 0) {
        snprintf(err, errlen, "log entry of %s: its row is not a JSON object", t->name);
        return -1;
    }
    return found;
}

/* One statement with ?1 = arg: SQLite's result code. */
static int run1(sqlite3 *db, const char *sql, const char *arg)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    rc = sqlite3_step(st);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) rc = sqlite3_extended_errcode(db);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

static int classify(int rc)
{
    rc &= 0xff;
    return rc == SQLITE_BUSY || rc == SQLITE_LOCKED || rc == SQLITE_NOMEM || rc == SQLITE_IOERR ||
                   rc == SQLITE_FULL
               ? CP_TRANSIENT
               : CP_UNAPPLICABLE;
}

/* Run a DELETE ... RETURNING * with ?1 = arg; each deleted row to evicted (when not NULL). An
 * SQLite code. */
static int delete_rows(const char *sql, int ti, sqlite3 *db, const char *arg, cp_evicted_fn evicted,
                       void *ud)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) return rc;
    sqlite3_bind_text(st, 1, arg, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        if (evicted) evicted(ud, ti, st);
    if (rc != SQLITE_DONE) rc = sqlite3_extended_errcode(db);
    sqlite3_finalize(st);
    return rc;
}

int cp_apply(const cp_schema_t *s, sqlite3 *db, int ti, const char *op, const char *pk,
             const char *row, cp_evicted_fn evicted, void *ud, char *err, size_t errlen)
{
    const cp_table_t *t = &s->t[ti];
    const char *sql, *arg;
    if (strcmp(op, "del") == 0) sql = t->del, arg = pk;
    else if (strcmp(op, "add") == 0) sql = t->append, arg = row;
    else if (strcmp(op, "put") == 0) sql = t->upsert, arg = row;
    else {
        snprintf(err, errlen, "log entry of %s with an unknown op %.16s", t->name, op);
        return CP_UNAPPLICABLE;
    }
    if (!arg) {
        snprintf(err, errlen, "log entry of %s without its row", t->name);
        return CP_UNAPPLICABLE;
    }
    if (arg == row && unknown_column(t, db, row, err, errlen) != 0) return CP_UNAPPLICABLE;
    int rc = sql == t->del ? delete_rows(sql, ti, db, pk, evicted, ud) : run1(db, sql, arg);
    if (rc == SQLITE_CONSTRAINT_UNIQUE && arg == row && t->evict && strcmp(op, "put") == 0) {
        /* a secondary key held here by another row: the log's row wins */
        rc = delete_rows(t->evict, ti, db, row, evicted, ud);
        if (rc == SQLITE_DONE) rc = run1(db, sql, arg);
    }
    if (rc == SQLITE_DONE) return 0;
    snprintf(err, errlen, "%s %s %s: %s", op, t->name, pk, sqlite3_errmsg(db));
    return classify(rc);
}

int cp_unshipped_any(sqlite3 *db)
{
    return first_int(db, "SELECT 1 FROM main.audit_unshipped LIMIT 1", 0) == 1;
}

int cp_unshipped_clear(sqlite3 *db, int64_t upto, char *err, size_t errlen)
{
    return exec_with_id(db, "DELETE FROM main.audit_unshipped WHERE id <= %lld", upto, err, errlen);
}
