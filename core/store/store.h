/* store: the embedded SQLite database (WAL mode) and its numbered migrations.
 *
 * Opened once at start-up, before the loop runs. Writes go through the store's
 * own writer thread (its own connection, batched transactions) so the loop thread
 * never waits on the disk; reads use separate connections (WAL lets them run
 * beside the writer).
 *
 * The write queue and what a callback promises:
 * - Group commit: the writer takes everything queued (at most queue_max writes) and runs
 *   it as one transaction, in the order queued; then the next batch.
 * - Bounded: at most queue_max writes wait for the writer. A write from the loop thread
 *   that finds the queue full is parked on the loop side, in order, and handed over as the
 *   writer makes room: nothing is dropped and the loop never waits (its callback, if any,
 *   simply comes later; whoever waits for it waits asynchronously). A write from another
 *   thread waits for room on a condition variable (that thread may block).
 * - A held write lock (a backup, a long admin transaction on another connection) delays
 *   the writer and never loses a batch: BEGIN and COMMIT are retried for as long as the
 *   database is busy (each wait counted in busy_retries, logged every few seconds). Other
 *   errors: a statement that fails on its own (a constraint, bad SQL) fails alone, the
 *   rest of its batch commits; a transaction that cannot commit for another reason (I/O)
 *   is retried three times, then its writes fail (logged, counted); a full disk holds the
 *   writes in memory (mg_store_disk_full).
 * - Durability: a write's callback runs once its transaction COMMIT returned. With
 *   synchronous=normal (the default; WAL mode) the transaction is then in the WAL file in
 *   the OS's page cache: it survives the process being killed (kill -9, a crash, the OOM
 *   killer) but may be rolled back by a power loss or an OS crash (the database is never
 *   corrupted either way). With synchronous=full the WAL is fsynced at every commit and
 *   the transaction also survives power loss; group commit shares one fsync per batch.
 * - Callbacks run on the loop thread (from a uv_async handle), never inside the call
 *   that queued the write, in the order the writes were queued; for writes still pending
 *   when the store closes, inside mg_store_close.
 *
 * Who waits for the commit: records an answer acknowledges. The spend of a metered answer
 * (proxy.c holds the answer's end, net/hold.h) and an idempotent request's stored answer
 * (idem.c answers nobody before it committed); a new record of that kind (usage events)
 * does the same: mg_store_write_cb plus a hold. Fire and forget: state the process rebuilds
 * or that no client relies on: cooldowns and provider state, health (traffic restores them;
 * a kill -9 loses at most the last change), task records (the task's spend is held like any
 * other; a lost last update shows the task as failed by the restart), the audit rows of
 * admin reads (api.c; admin changes audit in their own synchronous transaction),
 * last_used_at, pruning. They share the queue and its order, and park like the others when
 * it is full. Admin changes do not use the queue: they commit synchronously (below). */
#ifndef MG_STORE_H
#define MG_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "store/pg.h"

typedef struct mg_store_s mg_store_t;
struct sqlite3;

typedef struct mg_store_opts_s {
    int queue_max;        /* writes waiting for the writer at most (>= 1); 0: the default */
    int synchronous_full; /* PRAGMA synchronous=FULL rather than NORMAL (see above) */
    int busy_wait_ms;     /* how long one attempt waits for a lock before it is retried
                             (0: the default, 250 ms) */
} mg_store_opts_t;

#define MG_STORE_QUEUE_MAX_DEFAULT 4096

/* Open (creating the file and its directory when missing) and migrate to the
 * latest schema. opts may be NULL (defaults). Returns 0 and *out, or -1 with the
 * reason in err. */
int mg_store_open_with(const char *path, const mg_store_opts_t *opts, mg_store_t **out, char *err,
                       size_t errlen);
/* mg_store_open_with and the default options. */
int mg_store_open(const char *path, mg_store_t **out, char *err, size_t errlen);
/* Schema version after migrations. */
int mg_store_schema_version(const mg_store_t *s);

/* The cluster's shared PostgreSQL (store/pg.h; borrowed, NULL: the embedded default) and
 * this instance's node id: the books (usage events, the prepaid wallet) are kept there too
 * when it is set (obs/usage.h, tenancy/wallet.h). Set once at start-up, before requests. */
void mg_store_set_pg(mg_store_t *s, mg_pg_t *pg, const char *node_id);
mg_pg_t *mg_store_pg(const mg_store_t *s);
const char *mg_store_node_id(const mg_store_t *s);

/* Deliver callbacks and park writes on `loop`, whose thread is the caller's: from now on
 * writes from this thread never wait for room. Returns 0 or a negative libuv error. The
 * store's async handle does not keep the loop alive (uv_unref). */
int mg_store_attach(mg_store_t *s, uv_loop_t *loop);
/* Before the loop's last iteration (shutdown): close the async handle, hand the parked
 * writes to the writer. Writes queued afterwards still commit; their callbacks run in
 * mg_store_close. */
void mg_store_detach(mg_store_t *s);

/* The outcome of a write: rc 0 when its transaction committed (durable as said above),
 * MG_STORE_ECONSTRAINT or MG_STORE_ERROR when the statement or its transaction failed
 * (the write is not in the database; the reason was logged). */
typedef void (*mg_store_done_fn)(void *ud, int rc);

/* Queue a write for the writer thread: `sql` with ?1..?n parameters bound as text
 * (NULL = SQL NULL); copies everything it is given. done (may be NULL) is called once
 * with the outcome, as said above. Returns 0, or -1 when out of memory or the store is
 * closing: then the write is lost, done is never called, and the caller should log it. */
int mg_store_write_cb(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                      mg_store_done_fn done, void *ud);
/* The outcome of a write and the rows its statement changed (sqlite3_changes: 0 when the
 * statement's WHERE matched nothing, or an INSERT OR IGNORE ignored its row; 0 on error). */
typedef void (*mg_store_rows_fn)(void *ud, int rc, int64_t rows);
/* mg_store_write_cb whose callback also learns the rows changed: a conditional write (an
 * INSERT ... SELECT ... WHERE, an UPDATE ... WHERE state = ...) tells its caller whether it
 * took effect, inside the writer's transaction, without a read on the caller's thread. The
 * same promises as mg_store_write_cb; done may not be NULL. */
int mg_store_write_rows(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                        mg_store_rows_fn done, void *ud);
/* mg_store_write_rows for a write a request waits for and whose answer depends on it (a
 * prepaid reservation), so it may not wait for a full disk: while the disk is full it is
 * refused (MG_STORE_EFULL returned, done never called), and one still queued when the disk
 * is found full fails (done with rc MG_STORE_EFULL, no rows). Nothing of it is then in the
 * database; the request can fail at once with a clear error. */
int mg_store_write_rows_nowait(mg_store_t *s, const char *sql, int nparams,
                               const char *const *params, mg_store_rows_fn done, void *ud);
/* A roll-up the writer keeps in C instead of a trigger: the writes that name it (below)
 * are summed per batch on the writer thread (`add`, with the row's rowid; only writes whose
 * statement changed a row, so an INSERT OR IGNORE that ignored a replay adds nothing; their
 * parameters are valid during `add` only: a journal drain binds them from the ring's bytes,
 * so `add` copies the text it keeps). When the batch commits, its sums join the pending ones
 * (`committed`); a batch that rolls back adds
 * nothing. The pending sums are written about once a second (MG_STORE_AGG_FLUSH_MS), when
 * mg_store_sync_aggs or mg_store_flush asks, and at close, in a transaction of their own
 * (`flush`, which also stores the watermark: the last rowid summed; then `flushed`). Before
 * serving, mg_store_use_agg sums the rows past the watermark (`recover`), so a crash
 * between two flushes loses nothing. The state is the writer's: destroyed by
 * mg_store_close. */
/* A typed parameter (mg_store_write_vals): bound as an integer or text as it is, without
 * a detour through text on either thread. */
enum { MG_STORE_NULL = 0, MG_STORE_INT, MG_STORE_TEXT, MG_STORE_REAL };
typedef struct mg_store_val_s {
    int kind;      /* MG_STORE_NULL, MG_STORE_INT, MG_STORE_TEXT or MG_STORE_REAL */
    int64_t i;     /* MG_STORE_INT */
    const char *s; /* MG_STORE_TEXT (NULL reads as SQL NULL) */
    double d;      /* MG_STORE_REAL */
} mg_store_val_t;

typedef struct mg_store_agg_s {
    void *(*create)(void);
    void (*destroy)(void *state);
    void (*reset)(void *state); /* a batch, or its retry, begins */
    void (*add)(void *state, int64_t rowid, int nparams, const mg_store_val_t *params);
    void (*committed)(void *state);                  /* the batch committed */
    int (*recover)(void *state, struct sqlite3 *db); /* sum the rows past the watermark */
    int (*flush)(void *state, struct sqlite3 *db);   /* pending sums + watermark; 0 or -1 */
    void (*flushed)(void *state);                    /* the flush committed */
    int (*dirty)(const void *state);                 /* anything pending? */
} mg_store_agg_t;
#define MG_STORE_AGG_FLUSH_MS 1000
/* Register agg and sum into it the rows its last flush did not cover, then flush them: call
 * before serving (it blocks until the writer did it). 0, or -1. */
int mg_store_use_agg(mg_store_t *s, const mg_store_agg_t *agg);
/* Have the writer write every pending roll-up now, and wait for it (worker threads, tools,
 * tests; it blocks): reads of the roll-ups after it see every committed row. */
void mg_store_sync_aggs(mg_store_t *s);
/* mg_store_write_cb with typed parameters (the text ones are copied) and a `sql` that is
 * not copied: it must outlive the write (a string literal). agg (may be NULL; a static
 * table, at most MG_STORE_AGG_MAX different ones per store) also sums the row. The writer
 * finds its prepared statement by the pointer. */
#define MG_STORE_AGG_MAX 4
int mg_store_write_vals(mg_store_t *s, const char *sql, int nparams, const mg_store_val_t *params,
                        const mg_store_agg_t *agg, mg_store_done_fn done, void *ud);
/* The journal (store/journal.h): a ring file beside the database (`<path>.usage-journal`,
 * `bytes` of it, 0: MG_JOURNAL_BYTES_DEFAULT) whose records are writes of `sql` (a literal)
 * summed into agg. mg_store_journal_write on the loop thread appends the write's typed
 * values to the mapped ring (memory only: no syscall, no wake) and calls done at once, rc 0,
 * inside the call: the record is in the OS page cache, durable against kill -9 as a WAL
 * commit with synchronous=normal is (not against power loss, even with synchronous=full).
 * The writer drains the ring every JOURNAL_DRAIN_MS (250 ms), at once when it is more than
 * half full, and before a roll-up turn (mg_store_sync_aggs, mg_store_flush, mg_store_use_agg,
 * the close), one transaction per drain, as the queue's writes (roll-ups, INSERT OR IGNORE,
 * the full disk all alike; when sql's last clause is its VALUES list, ?1 to ?N in order, a
 * drain inserts its records MG_ROWGROUP_ROWS a statement, store/rowgroup.h): readers of those rows
 * see them within about 250 ms, or after mg_store_flush. Call once, before serving, after
 * mg_store_use_agg(agg): records a killed run left are replayed before it returns (they must be
 * idempotent: INSERT OR IGNORE on a unique key). 0, or -1 (logged; the writes then take the queue).
 */
int mg_store_use_journal(mg_store_t *s, const char *sql, const mg_store_agg_t *agg, size_t bytes);
/* A write of the journal's sql and agg: journaled when on the loop thread and the ring has
 * room, else (another thread, full, no journal) mg_store_write_vals (counted in
 * journal_fallback_total). 0 or as mg_store_write_vals. */
int mg_store_journal_write(mg_store_t *s, const char *sql, int nparams,
                           const mg_store_val_t *params, const mg_store_agg_t *agg,
                           mg_store_done_fn done, void *ud);
/* mg_store_write_cb without a callback (fire and forget). */
int mg_store_write(mg_store_t *s, const char *sql, int nparams, const char *const *params);
/* Loop thread (elsewhere, and with s NULL, nothing): the writes queued from the loop between
 * mg_store_cork and the matching mg_store_uncork reach the writer together, in their order,
 * so they commit in one transaction (a call's stored Response and its usage event: one
 * commit instead of two). Nests; the uncork belongs in the same loop turn. */
void mg_store_cork(mg_store_t *s);
void mg_store_uncork(mg_store_t *s);

/* Wait until every write handed to the writer so far is committed (tests, tools; it
 * blocks). Writes parked on the loop side move on only while the loop runs. */
void mg_store_flush(mg_store_t *s);

/* Counters of the write path (a consistent snapshot). */
typedef struct mg_store_stats_s {
    uint64_t queued;                   /* writes waiting for the writer now */
    uint64_t parked;                   /* writes parked on the loop side now (the queue was full) */
    uint64_t writes_total;             /* writes committed */
    uint64_t failed_total;             /* writes that failed (not in the database) */
    uint64_t batches_total;            /* transactions committed */
    uint64_t busy_retries_total;       /* BEGIN or COMMIT attempts that found the database locked */
    uint64_t largest_batch;            /* most writes in one transaction */
    int disk_full;                     /* the writer holds a batch until the disk has room */
    uint64_t disk_full_episodes_total; /* times the disk was found full */
    uint64_t refused_while_full_total; /* writes refused while full (the parked bound, a write
                                          from another thread, or a nowait write: it fails at
                                          once) */
    uint64_t journaled_total;          /* writes appended to the journal (mg_store_use_journal) */
    uint64_t journal_fallback_total;   /* journal writes queued instead (ring full, not the loop) */
    uint64_t journal_grouped_total; /* journal rows a drain inserted MG_ROWGROUP_ROWS at a time */
    uint64_t journal_used_bytes;    /* the journal's bytes not yet drained */
} mg_store_stats_t;
void mg_store_stats(mg_store_t *s, mg_store_stats_t *out);
/* The writer found the disk full and holds its writes in memory (until it has room): a write's
 * callback (mg_store_done_fn) then runs once it is held, rc 0, not once it is durable, and
 * that holds for the writes queued while the disk is full too, so no request waits for the
 * disk (spend, idempotency records, usage events); a nowait write fails, MG_STORE_EFULL. */
int mg_store_disk_full(mg_store_t *s);

/* Run a read query synchronously on the caller's thread with its own connection
 * (start-up restore, admin reads off the loop). For each row, cb gets the column
 * values as text (NULL for SQL NULL). Returns 0 or -1 with err set. */
int mg_store_query(mg_store_t *s, const char *sql, int nparams, const char *const *params,
                   void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                   size_t errlen);
/* The same, several queries on one read connection: opened once (the schema read once, the
 * pages read by one query cached for the next), for a caller that runs many small ones (the
 * events listing's binary search over seq). Open: NULL with err set. */
typedef struct mg_store_read_s mg_store_read_t;
mg_store_read_t *mg_store_read_open(mg_store_t *s, char *err, size_t errlen);
int mg_store_read_query(mg_store_read_t *r, const char *sql, int nparams, const char *const *params,
                        void (*cb)(void *ud, int ncols, const char *const *cols), void *ud,
                        char *err, size_t errlen);
void mg_store_read_close(mg_store_read_t *r);

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
    MG_STORE_EFULL = -3,       /* the disk is full (mg_store_write_rows_nowait) */
    MG_STORE_EUNAVAIL = -4,    /* the transaction hook (the cluster's control plane) refused:
                                  nothing was changed */
};

/* A hook around every admin transaction (admin/control.h installs it when the control
 * plane is shared): lock runs before BEGIN IMMEDIATE (so a wait for a cluster-wide lock never
 * holds the database's write lock), begin inside the open transaction right after it,
 * commit just before COMMIT (a failure of any of them rolls the transaction back and the call
 * returns MG_STORE_EUNAVAIL), end after the transaction ended or failed to begin (committed 1
 * when the SQLite COMMIT succeeded). All run on the thread of the transaction, begin and
 * commit with the admin connection. Set once at start-up, before any transaction; NULL
 * removes it. */
typedef struct mg_store_txhook_s {
    int (*lock)(void *ud, char *err, size_t errlen);
    int (*begin)(void *ud, struct sqlite3 *db, char *err, size_t errlen);
    int (*commit)(void *ud, struct sqlite3 *db, char *err, size_t errlen);
    void (*end)(void *ud, int committed);
    void *ud;
} mg_store_txhook_t;
void mg_store_set_txhook(mg_store_t *s, const mg_store_txhook_t *hook);
/* The database file's path (borrowed), for a component that opens a connection of its own. */
const char *mg_store_path(const mg_store_t *s);

/* Begin a transaction on the admin connection. Returns 0 and *out, or MG_STORE_ERROR with
 * err set (another transaction open, cannot open, busy past the timeout). */
int mg_store_tx_begin(mg_store_t *s, mg_store_tx_t **out, char *err, size_t errlen);

/* Run one statement inside tx with ?1..?n bound as text (NULL = SQL NULL); cb (may be
 * NULL) gets each result row as text. Returns the number of rows changed (>= 0), or
 * MG_STORE_ECONSTRAINT / MG_STORE_ERROR with err set; the transaction stays open either
 * way (the caller decides to roll back). */
int mg_store_tx_exec(mg_store_tx_t *tx, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                     size_t errlen);

/* Rowid of the last row inserted through tx's connection. */
int64_t mg_store_tx_last_id(const mg_store_tx_t *tx);

/* Commit and free tx. Returns 0, or MG_STORE_ERROR (rolled back, err set). tx is gone
 * either way. */
int mg_store_tx_commit(mg_store_tx_t *tx, char *err, size_t errlen);

/* Roll back and free tx (NULL is fine). */
void mg_store_tx_rollback(mg_store_tx_t *tx);

/* Stop the writer after it committed everything queued, deliver the callbacks still due
 * (on the caller's thread: the loop's, after it stopped), and close. Detaches first when
 * still attached. */
void mg_store_close(mg_store_t *s);

#endif
