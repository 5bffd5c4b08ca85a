/* control_sql: the SQLite side of the replicated control plane (admin/control.h): the
 * control tables, the statements built from their columns (capture triggers, upsert,
 * append, delete), applying one log entry, and the per-node bookkeeping table. No
 * PostgreSQL here; every function runs on the caller's thread with the caller's
 * connection. */
#ifndef MG_CLUSTER_CONTROL_SQL_H
#define MG_CLUSTER_CONTROL_SQL_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CT_AUTH = 1,    /* mirrored into the auth state (keys, projects, tenants) */
    CT_REBUILD = 2, /* a change rebuilds the generation */
    CT_APPEND = 4,  /* append-only (audit): applied as a new local row, not by id */
};

typedef struct cp_table_s {
    const char *name;
    const char *pk;
    int flags;
    char **cols; /* the table's columns here, in order */
    int ncols;
    char *upsert; /* ?1 = the row as JSON */
    char *append; /* ?1 = the row as JSON; every column but the key */
    char *del;    /* ?1 = the key */
    char *evict;  /* ?1 = the row as JSON: delete the other rows holding one of its secondary
                     UNIQUE keys (NULL: the table has none) */
} cp_table_t;

#define CP_NTABLES 10

typedef struct cp_schema_s {
    cp_table_t t[CP_NTABLES];
    char *unshipped; /* ?1 = a row count: the oldest audit_unshipped ids, each with the record's
                        id (NULL: it is gone) and the record as JSON, as a capture has it */
} cp_schema_t;

/* Build the statements from db's columns. 0, or -1 with err set. */
int cp_schema_build(cp_schema_t *s, sqlite3 *db, char *err, size_t errlen);
void cp_schema_free(cp_schema_t *s);
/* The table named name, or -1. */
int cp_schema_find(const cp_schema_t *s, const char *name);

/* control_state (the last log id applied here) exists: 0 or -1. */
int cp_state_ensure(sqlite3 *db, char *err, size_t errlen);
int64_t cp_state_applied(sqlite3 *db);
int cp_state_set(sqlite3 *db, int64_t id, char *err, size_t errlen);

/* The TEMP outbox and its capture triggers on db (the admin connection), created when
 * missing (inside the open transaction: a rollback undoes them, so they are checked each
 * time). 0 or -1. */
int cp_capture_ensure(const cp_schema_t *s, sqlite3 *db, char *err, size_t errlen);
int cp_outbox_clear(sqlite3 *db);

/* json_object('c1', <prefix>"c1", ...) over table ti's columns, into b (prefix "NEW.", or
 * "" for a plain SELECT). 0 or -1. */
struct mg_buf_s;
int cp_json_expr(const cp_table_t *t, const char *prefix, struct mg_buf_s *b);

/* Apply one entry (op "put", "del" or "add") of table ti. The log is the truth: a put whose
 * secondary UNIQUE key (a tenant's name, a key's digest) is held here by a row of another
 * primary key deletes that local row first, in the caller's transaction. (A put that changes
 * a row's own secondary key is not looked at: no admin write changes a key's digest, a
 * rotation makes a new row.) 0; CP_TRANSIENT
 * (the database busy, out of memory: try again); CP_UNAPPLICABLE (a column this binary does
 * not know, a constraint the entry breaks even so: it cannot be applied until the binary or
 * the data changes). err says why (names, never values).
 * evicted, when not NULL, sees each local row so deleted or deleted by a 'del' (its columns in
 * row, as SELECT * has them), so that what mirrors the table elsewhere (the auth state) can
 * forget it too. */
enum { CP_TRANSIENT = -1, CP_UNAPPLICABLE = 1 };
typedef void (*cp_evicted_fn)(void *ud, int ti, sqlite3_stmt *row);
int cp_apply(const cp_schema_t *s, sqlite3 *db, int ti, const char *op, const char *pk,
             const char *row, cp_evicted_fn evicted, void *ud, char *err, size_t errlen);

/* The audit records kept here while the log was out of reach (store migration 25, shipped by
 * admin/control.c with cp_schema_t.unshipped): any waiting (1 or 0), and those up to id
 * removed once shipped (0 or -1). */
int cp_unshipped_any(sqlite3 *db);
int cp_unshipped_clear(sqlite3 *db, int64_t upto, char *err, size_t errlen);

/* The advisory lock's key that serialises writers of PostgreSQL's control_log (the admin
 * writes of admin/control.h and migrate-store). */
#define MG_CONTROL_LOCK "7021778593650832486"

#endif
