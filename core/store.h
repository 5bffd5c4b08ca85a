/* store: the embedded SQLite database (WAL mode) and its numbered migrations.
 *
 * Opened once at start-up, before the loop runs. Writes go through the store's
 * own writer thread (its own connection, batched transactions) so the loop thread
 * never waits on the disk; reads use separate connections (WAL lets them run
 * beside the writer). */
#ifndef MG_STORE_H
#define MG_STORE_H

#include <stddef.h>

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

/* Stop the writer after it committed everything queued, and close. */
void mg_store_close(mg_store_t *s);

#endif
