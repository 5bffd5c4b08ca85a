/* store: the embedded SQLite database (WAL mode) and its numbered migrations.
 *
 * Opened once at start-up, before the loop runs. Writes go through the store's
 * own writer thread (its own connection, batched transactions) so the loop thread
 * never waits on the disk; reads use separate connections (WAL lets them run
 * beside the writer). */
#ifndef MG_STORE_H
#define MG_STORE_H

#include <stddef.h>
#include <stdint.h>

typedef struct mg_store_s mg_store_t;

/* Open (creating the file and its directory when missing) and migrate to the
 * latest schema. Returns 0 and *out, or -1 with the reason in err. */
int mg_store_open(const char *path, mg_store_t **out, char *err, size_t errlen);
/* Schema version after migrations. */
int mg_store_schema_version(const mg_store_t *s);

/* Queue a write for the writer thread: `sql` with ?1..?n parameters bound as text
 * (NULL = SQL NULL). Writes queued together run in one transaction (group commit),
 * in the order queued. Never blocks on the disk; copies everything it is given.
 * Returns 0, or -1 when out of memory or the store is closing (the write is lost
 * and the caller should log it). */
int mg_store_write(mg_store_t *s, const char *sql, int nparams, const char *const *params);

/* Wait until every write queued so far is committed (tests, shutdown). */
void mg_store_flush(mg_store_t *s);

/* Run a read query synchronously on the caller's thread with its own connection
 * (start-up restore, admin reads off the loop). For each row, cb gets the column
 * values as text (NULL for SQL NULL). Returns 0 or -1 with err set. */
int mg_store_query(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                   void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                   char *err, size_t errlen);

/* ---- synchronous admin transactions ----
 * Operator-driven changes (tenants, projects, keys) run synchronously on the caller's
 * thread, on one dedicated read-write connection (foreign keys on) opened on first use:
 * they are rare, small and must be committed before the caller answers and updates its
 * in-memory state. BEGIN IMMEDIATE takes the write lock up front, so a transaction either
 * gets the database or fails at begin; it waits at most 5 s for the writer thread's
 * current batch. One transaction at a time, from one thread. */

typedef struct mg_store_tx_s mg_store_tx_t;

enum {
    MG_STORE_OK = 0,
    MG_STORE_ERROR = -1,       /* SQL or I/O error; err says which */
    MG_STORE_ECONSTRAINT = -2, /* a UNIQUE, CHECK or FOREIGN KEY constraint refused the row */
};

/* Begin a transaction on the admin connection. Returns 0 and *out, or MG_STORE_ERROR with
 * err set (another transaction open, cannot open, busy past the timeout). */
int mg_store_tx_begin(mg_store_t *s, mg_store_tx_t **out, char *err, size_t errlen);

/* Run one statement inside tx with ?1..?n bound as text (NULL = SQL NULL); cb (may be
 * NULL) gets each result row as text. Returns the number of rows changed (>= 0), or
 * MG_STORE_ECONSTRAINT / MG_STORE_ERROR with err set; the transaction stays open either
 * way (the caller decides to roll back). */
int mg_store_tx_exec(mg_store_tx_t *tx, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                     char *err, size_t errlen);

/* Rowid of the last row inserted through tx's connection. */
int64_t mg_store_tx_last_id(const mg_store_tx_t *tx);

/* Commit and free tx. Returns 0, or MG_STORE_ERROR (rolled back, err set). tx is gone
 * either way. */
int mg_store_tx_commit(mg_store_tx_t *tx, char *err, size_t errlen);

/* Roll back and free tx (NULL is fine). */
void mg_store_tx_rollback(mg_store_tx_t *tx);

/* Stop the writer after it committed everything queued, and close. */
void mg_store_close(mg_store_t *s);

#endif
