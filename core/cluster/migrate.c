/* migrate: a single node's store into a cluster's PostgreSQL; see migrate.h. */
#include "cluster/migrate.h"

#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "cluster/control_sql.h"
#include "store/pg_schema.h"
#include "store/store.h"

#define NODE "migrate-store" /* the node id of what the tool writes */
#define MAX_COLS 64

typedef struct copy_s {
    const char *table;
    const char *skip;  /* a column not copied (PostgreSQL numbers it), or NULL */
    const char *where; /* a filter on the SQLite rows, or NULL */
} copy_t;

static int pg_ok(PGresult *r)
{
    ExecStatusType st = PQresultStatus(r);
    return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
}

static int pg_cmd(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    int ok = pg_ok(r);
    if (!ok) snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

/* Whether PostgreSQL's table has column col. */
static int pg_has_col(PGconn *c, const char *table, const char *col)
{
    const char *p[2] = {table, col};
    PGresult *r = PQexecParams(c,
                               "SELECT 1 FROM information_schema.columns WHERE table_name = $1"
                               " AND column_name = $2 AND table_schema = current_schema()",
                               2, NULL, p, NULL, NULL, 0);
    int has = pg_ok(r) && PQntuples(r) > 0;
    PQclear(r);
    return has;
}

/* The columns both sides have (and node_id when only PostgreSQL has it) into cols. */
static int common_cols(sqlite3 *db, PGconn *c, const copy_t *cp, char **cols, int *n,
                       int *with_node)
{
    sqlite3_stmt *st = NULL;
    *n = 0;
    *with_node = 0;
    if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?1) ORDER BY cid", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, cp->table, -1, SQLITE_STATIC);
    int local_node = 0;
    while (sqlite3_step(st) == SQLITE_ROW && *n < MAX_COLS) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (strcmp(name, "node_id") == 0) local_node = 1;
        if ((cp->skip && strcmp(name, cp->skip) == 0) || !pg_has_col(c, cp->table, name)) continue;
        if (!(cols[*n] = strdup(name))) break;
        (*n)++;
    }
    sqlite3_finalize(st);
    *with_node = !local_node && pg_has_col(c, cp->table, "node_id");
    return *n > 0 ? 0 : -1;
}

static int add_cols(mg_buf_t *b, char **cols, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++)
        rc |= mg_buf_append_str(b, i ? ", \"" : "\"") | mg_buf_append_str(b, cols[i]) |
              mg_buf_append_str(b, "\"");
    return rc;
}

/* Copy the rows of one table, ON CONFLICT DO NOTHING; the rows inserted into *copied. */
static int copy_rows(sqlite3 *db, PGconn *c, const copy_t *cp, long *copied, char *err,
                     size_t errlen)
{
    char *cols[MAX_COLS];
    int n = 0, node = 0, rc = -1;
    *copied = 0;
    if (common_cols(db, c, cp, cols, &n, &node) != 0) {
        snprintf(err, errlen, "%s: no columns in common", cp->table);
        goto out;
    }
    mg_buf_t sel = {0}, ins = {0};
    int e = mg_buf_append_str(&sel, "SELECT ") | add_cols(&sel, cols, n) |
            mg_buf_append_str(&sel, " FROM main.\"") | mg_buf_append_str(&sel, cp->table) |
            mg_buf_append_str(&sel, "\"");
    if (cp->where) e |= mg_buf_append_str(&sel, " WHERE ") | mg_buf_append_str(&sel, cp->where);
    e |= mg_buf_append_str(&ins, "INSERT INTO \"") | mg_buf_append_str(&ins, cp->table) |
         mg_buf_append_str(&ins, "\"(") | add_cols(&ins, cols, n) |
         mg_buf_append_str(&ins, node ? ", node_id) VALUES (" : ") VALUES (");
    for (int i = 0; i < n + node; i++) {
        char ph[16];
        snprintf(ph, sizeof(ph), "%s$%d", i ? ", " : "", i + 1);
        e |= mg_buf_append_str(&ins, ph);
    }
    e |= mg_buf_append_str(&ins, ") ON CONFLICT DO NOTHING");
    sqlite3_stmt *st = NULL;
    if (e || sqlite3_prepare_v2(db, sel.data, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", cp->table, e ? "out of memory" : sqlite3_errmsg(db));
        goto done;
    }
    rc = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        const char *p[MAX_COLS + 1];
        for (int i = 0; i < n; i++) p[i] = (const char *)sqlite3_column_text(st, i);
        if (node) p[n] = NODE;
        PGresult *r = PQexecParams(c, ins.data, n + node, NULL, p, NULL, NULL, 0);
        if (!pg_ok(r)) {
            snprintf(err, errlen, "%s: PostgreSQL: %s", cp->table, PQerrorMessage(c));
            rc = -1;
        } else {
            *copied += strtol(PQcmdTuples(r), NULL, 10);
        }
        PQclear(r);
    }
    sqlite3_finalize(st);
done:
    mg_buf_free(&sel);
    mg_buf_free(&ins);
out:
    for (int i = 0; i < n; i++) free(cols[i]);
    return rc;
}

/* "tenant_id NOT IN (...)": the tenants whose wallet PostgreSQL has already (copied before,
 * or made there): theirs are not copied again. */
static int wallet_filter(PGconn *c, mg_buf_t *w, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, "SELECT tenant_id FROM wallets");
    if (!pg_ok(r)) {
        snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
        PQclear(r);
        return -1;
    }
    int e = mg_buf_append_str(w, "tenant_id NOT IN (-1");
    for (int i = 0; i < PQntuples(r); i++)
        e |= mg_buf_append_str(w, ", ") |
             mg_buf_append_int(w, strtoll(PQgetvalue(r, i, 0), NULL, 10));
    e |= mg_buf_append_str(w, ")");
    PQclear(r);
    return e ? -1 : 0;
}

/* One control_log entry per row of every control table of db, appended on c (inside the
 * caller's PostgreSQL transaction, which holds the lock). 0 and *rows, or -1 with err. */
static int control_export(sqlite3 *db, PGconn *c, const char *node, int64_t *rows, char *err,
                          size_t errlen)
{
    cp_schema_t s;
    *rows = 0;
    if (cp_schema_build(&s, db, err, errlen) != 0) return -1;
    char at[24];
    snprintf(at, sizeof(at), "%lld", (long long)time(NULL) * 1000);
    int rc = 0;
    for (int i = 0; i < CP_NTABLES && rc == 0; i++) {
        const cp_table_t *t = &s.t[i];
        mg_buf_t q = {0};
        int e = mg_buf_append_str(&q, "SELECT \"") | mg_buf_append_str(&q, t->pk) |
                mg_buf_append_str(&q, "\", ") | cp_json_expr(t, "", &q) |
                mg_buf_append_str(&q, " FROM main.\"") | mg_buf_append_str(&q, t->name) |
                mg_buf_append_str(&q, "\" ORDER BY rowid");
        sqlite3_stmt *st = NULL;
        if (e || sqlite3_prepare_v2(db, q.data, -1, &st, NULL) != SQLITE_OK) {
            snprintf(err, errlen, "%s: %s", t->name, e ? "out of memory" : sqlite3_errmsg(db));
            rc = -1;
        }
        mg_buf_free(&q);
        while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
            const char *p[6] = {t->name,
                                (const char *)sqlite3_column_text(st, 0),
                                (t->flags & CT_APPEND) ? "add" : "put",
                                (const char *)sqlite3_column_text(st, 1),
                                node,
                                at};
            PGresult *r = PQexecParams(c,
                                       "INSERT INTO control_log(tbl, pk, op, row, node, at)"
                                       " VALUES ($1, $2, $3, $4, $5, $6)",
                                       6, NULL, p, NULL, NULL, 0);
            if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
                rc = -1;
            } else {
                (*rows)++;
            }
            PQclear(r);
        }
        sqlite3_finalize(st);
    }
    cp_schema_free(&s);
    return rc;
}

/* Everything, in the caller's transaction on c (the lock held). */
static int copy_all(sqlite3 *db, PGconn *c, int force, int64_t *last, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, "SELECT COALESCE(max(id), 0) FROM control_log");
    if (!pg_ok(r)) {
        snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
        PQclear(r);
        return -1;
    }
    int64_t before = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    if (before > 0 && !force) {
        snprintf(err, errlen,
                 "the target's control_log is not empty (%lld entries so far): another"
                 " installation is there; --force appends this one on top",
                 (long long)before);
        return -1;
    }
    int64_t rows = 0;
    if (control_export(db, c, NODE, &rows, err, errlen) != 0) return -1;
    long events = 0, wallets = 0, entries = 0, holds = 0, topups = 0;
    mg_buf_t w = {0};
    copy_t ev = {"usage_events", "seq", NULL};
    int rc = copy_rows(db, c, &ev, &events, err, errlen);
    if (rc == 0) rc = wallet_filter(c, &w, err, errlen);
    copy_t wl = {"wallets", NULL, w.data}, le = {"ledger_entries", "id", w.data},
           lh = {"ledger_holds", NULL, w.data}, tu = {"topups", NULL, w.data};
    if (rc == 0) rc = copy_rows(db, c, &wl, &wallets, err, errlen);
    if (rc == 0) rc = copy_rows(db, c, &le, &entries, err, errlen);
    if (rc == 0) rc = copy_rows(db, c, &lh, &holds, err, errlen);
    if (rc == 0) rc = copy_rows(db, c, &tu, &topups, err, errlen);
    mg_buf_free(&w);
    if (rc != 0) return -1;
    r = PQexec(c, "SELECT COALESCE(max(id), 0) FROM control_log");
    *last = pg_ok(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    printf("migrate-store: %lld control rows, %ld usage events, %ld wallets (%ld entries, %ld"
           " holds, %ld top-ups) copied\n",
           (long long)rows, events, wallets, entries, holds, topups);
    return before > 0 ? 1 : 0; /* 1: appended on top (--force) */
}

static int migrate(const char *path, const char *url, int force)
{
    char err[1024];
    mg_store_t *st = NULL;
    sqlite3 *db = NULL;
    PGconn *c = NULL;
    int rc = 1;
    int64_t last = 0;
    if (mg_store_open(path, &st, err, sizeof(err)) != 0) goto fail; /* the schema current */
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
        snprintf(err, sizeof(err), "%s", db ? sqlite3_errmsg(db) : "cannot open");
        goto fail;
    }
    sqlite3_busy_timeout(db, 5000);
    const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "5", "moongate-migrate-store", NULL};
    c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        snprintf(err, sizeof(err), "cannot connect to PostgreSQL: %s",
                 c ? PQerrorMessage(c) : "out of memory");
        goto fail;
    }
    if (mg_pg_migrate(c, err, sizeof(err)) < 0 || pg_cmd(c, "BEGIN", err, sizeof(err)) != 0 ||
        pg_cmd(c, "SELECT pg_advisory_xact_lock(" MG_CONTROL_LOCK ")", err, sizeof(err)) != 0)
        goto fail;
    int on_top = copy_all(db, c, force, &last, err, sizeof(err));
    if (on_top < 0) goto fail;
    if (pg_cmd(c, "NOTIFY mg_control", err, sizeof(err)) != 0 ||
        pg_cmd(c, "COMMIT", err, sizeof(err)) != 0)
        goto fail;
    /* the store holds exactly the log so far: it may join without applying itself again */
    if (!on_top && (cp_state_ensure(db, err, sizeof(err)) != 0 ||
                    cp_state_set(db, last, err, sizeof(err)) != 0))
        fprintf(stderr, "moongate migrate-store: copied, but the source's control_state: %s\n",
                err);
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "moongate migrate-store: %s\n", err);
out:
    PQfinish(c);
    if (db) sqlite3_close(db);
    if (st) mg_store_close(st);
    return rc;
}

int mg_migrate_store_main(int argc, char **argv)
{
    const char *from = NULL, *to = NULL;
    int force = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--from") == 0 && i + 1 < argc) from = argv[++i];
        else if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) to = argv[++i];
        else if (strcmp(argv[i], "--force") == 0) force = 1;
        else {
            fprintf(stderr, "moongate migrate-store: unknown argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!from || strncmp(from, "sqlite:", 7) != 0 || !from[7] || !to ||
        strncmp(to, "postgres:", 9) != 0 || !to[9]) {
        fprintf(stderr, "usage: moongate migrate-store --from sqlite:PATH --to postgres:URL"
                        " [--force]\n");
        return 2;
    }
    return migrate(from + 7, to + 9, force);
}
