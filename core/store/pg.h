/* pg: the shared PostgreSQL of a cluster (cluster.postgres), through libpq on a thread of its
 * own, so that the loop thread never waits on a round trip.
 *
 * Each of pool_size threads (cluster.postgres.pool_size) connects (blocking libpq calls, on
 * its own thread), runs the numbered migrations (store/pg_schema.h) under pg_advisory_lock
 * (several instances starting at once migrate once, one after the other), then takes the
 * queued statements in order, one autocommit statement each (a statement that must be one
 * transaction is one function call: the wallet's, see tenancy/wallet.h). Statements on
 * different connections may commit in any order, so each stands alone (a hold's end is
 * queued only once its reservation answered). Lost connection: the thread reconnects with
 * backoff (100 ms doubling to 5 s).
 *
 * Two kinds of statement:
 * - durable (usage events, a hold's end): kept in the queue while PostgreSQL is unreachable
 *   and retried after the reconnection, so a PostgreSQL restart loses none of them; they must
 *   therefore be idempotent (ON CONFLICT DO NOTHING, a conditional update). A statement that
 *   fails on a live connection (bad data) fails alone: logged, counted, never retried.
 * - at most once (a reservation, which a request waits for): fails at once (rc -1) while
 *   disconnected, and when the connection drops under it (then whether it committed is
 *   unknown, like a killed process's: see mg_wallet_recover).
 * The queue is bounded (queue_max statements): a statement that finds it full is refused
 * (-1; the caller logs what is lost) rather than growing without end while PostgreSQL is
 * down.
 *
 * Callbacks run on the loop thread (a uv_async handle), in the order the statements ran; for
 * statements still queued at close, inside mg_pg_close (rc -1). The url is a secret: never
 * logged, never in an error. */
#ifndef MG_STORE_PG_H
#define MG_STORE_PG_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct mg_pg_s mg_pg_t;

#define MG_PG_QUEUE_MAX_DEFAULT 100000

/* The outcome of a statement: rc 0 (it ran; value is the first column of its first row, NULL
 * when none or SQL NULL; valid during the call only), or -1 (it did not run or failed). */
typedef void (*mg_pg_done_fn)(void *ud, int rc, const char *value);

/* Start pool_size threads (one connection each; <= 0: one) for url (copied). Returns 0 and
 * *out, or -1 with err set (never the url). The connections are made on the threads: an
 * unreachable server is not an error here. */
int mg_pg_open(const char *url, int pool_size, int queue_max, mg_pg_t **out, char *err,
               size_t errlen);
/* Deliver callbacks on loop (the caller's thread). 0 or a negative libuv error. */
int mg_pg_attach(mg_pg_t *pg, uv_loop_t *loop);
/* Before the loop's last iteration: close the async handle. */
void mg_pg_detach(mg_pg_t *pg);

/* Queue sql with $1..$n bound as text (NULL = SQL NULL); everything is copied. durable as
 * said above. done may be NULL. 0, or -1 (queue full or closing: done is never called). */
int mg_pg_exec(mg_pg_t *pg, const char *sql, int nparams, const char *const *params, int durable,
               mg_pg_done_fn done, void *ud);

/* Run sql synchronously on the caller's thread, on a connection of its own made for the call
 * (blocking: admin workers, the CLI, tools; never the loop thread). cb gets each row's cells
 * as text (NULL: SQL NULL). 0, or -1 with err set (the server's message, never the url). */
int mg_pg_query_sync(mg_pg_t *pg, const char *sql, int nparams, const char *const *params,
                     void (*cb)(void *ud, int ncols, const char *const *cols), void *ud, char *err,
                     size_t errlen);

/* Wait (blocking) until the queue is empty or timeout_ms passed; 0 when empty (tests, tools,
 * shutdown). */
int mg_pg_flush(mg_pg_t *pg, int timeout_ms);

typedef struct mg_pg_stats_s {
    uint64_t queued;        /* statements waiting now */
    uint64_t done_total;    /* statements that ran */
    uint64_t failed_total;  /* statements that failed (bad data, or at-most-once refused) */
    uint64_t refused_total; /* refused by a full queue */
    uint64_t reconnects;    /* connections made after the first */
    int connected;          /* threads holding a live connection */
    int schema_version;     /* after migrations; 0 before the first connection */
} mg_pg_stats_t;
void mg_pg_stats(mg_pg_t *pg, mg_pg_stats_t *out);

/* Stop: give the queue up to 2 s to drain when connected (what stays is logged as lost and
 * its callbacks get -1), join the thread, free. */
void mg_pg_close(mg_pg_t *pg);

/* The number of migrations this build knows (the schema version it migrates to). */
int mg_pg_schema_latest(void);

#endif
