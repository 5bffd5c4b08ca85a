/* control: the cluster's control plane, replicated through PostgreSQL (cluster.postgres).
 *
 * Every instance keeps its control tables (tenants, projects, api_keys, admin_tokens,
 * providers, models, applications, prices, system_config, audit_logs) in its own SQLite, as
 * a single node does; PostgreSQL holds their change log, control_log (store/pg_schema.c,
 * migration 3): one row per changed row, the whole row as JSON ('put'), its deletion ('del')
 * or an appended audit record ('add'), in the order the changes committed. Every audit record
 * is written in an admin transaction (admin.c sends the loop's own through the worker when
 * replicated), so the log carries the whole audit trail.
 *
 * Writing (the admin worker, through the store's transaction hook, store/store.h): an admin
 * transaction first opens a PostgreSQL transaction and takes pg_advisory_xact_lock (one key
 * for the cluster), so admin writes are serialised cluster-wide; then it applies every log
 * entry newer than the instance's last applied one into its SQLite transaction, so ids
 * allocated next (integer primary keys) are the same everywhere. The handler runs; TEMP
 * triggers on the admin connection copy every changed row of the control tables into a
 * TEMP outbox (generic by table: the triggers are built from the tables' columns). Before
 * SQLite's COMMIT, the outbox is appended to control_log and PostgreSQL commits; only then
 * does SQLite commit. PostgreSQL unreachable: the transaction rolls back and the admin API
 * answers 503 CONTROL_PLANE_UNAVAILABLE, with nothing changed anywhere; an audit record is
 * then kept in SQLite, its id in audit_unshipped (admin.c), and the follower appends it to the
 * log once PostgreSQL is back (under the same lock, in its own transaction: its 'add' entries
 * and the removal of their ids; one already in the log is not appended twice). Because the log is
 * only appended under the lock, its ids increase in commit order: a follower that has
 * applied id N never sees a smaller id appear later.
 *
 * Following (a thread of its own): LISTEN mg_control plus a poll every 250 ms; new entries
 * are applied in id order into SQLite on a connection of the thread's (an upsert by primary
 * key or a delete; audit records appended, except the instance's own), with the last
 * applied id (control_state) in the same transaction, so applying is exactly once per
 * instance and a restart resumes where it stopped; an empty SQLite catches up from the
 * whole log. Then memory follows as after a local admin write: keys, projects and tenants
 * into the auth state (records built on this thread, put on the loop thread), and a rebuild
 * of the generation when providers, models, applications, prices or settings changed.
 * The log is the truth: a row whose secondary UNIQUE key a local row of another id holds
 * replaces that row (control_sql.h). An entry this binary cannot apply (an unknown table or
 * column: a newer version's) stalls the follower there: what came before commits, the stats
 * say stalled_id and why (/status, moongate_cluster_control_stalled), one log line per
 * entry, retried with backoff until it applies; admin writes fail meanwhile.
 *
 * Secrets: a provider's api key is replicated as its ciphertext (every instance has the
 * same MOONGATE_SECRET_KEY); a customer key only as its digest and display form. */
#ifndef MG_ADMIN_CONTROL_H
#define MG_ADMIN_CONTROL_H

#include <stdint.h>
#include <uv.h>

#include "admin/admin.h"
#include "store/store.h"
#include "tenancy/auth.h"

typedef struct mg_control_s mg_control_t;

typedef struct mg_control_deps_s {
    uv_loop_t *loop;
    mg_store_t *store;     /* its node id names this instance's entries */
    mg_auth_t *auth;       /* loop-owned: replicated keys, projects and tenants land here */
    mg_rebuild_fn rebuild; /* loop thread: after providers, models, prices or settings changed */
    void *rebuild_ud;
    const char *url; /* cluster.postgres.url (copied; a secret: never logged) */
} mg_control_deps_t;

/* Install the transaction hook on the store and start the follower thread (which connects
 * on its own: an unreachable server is not an error here). Loop thread, before serving.
 * NULL with err set. */
mg_control_t *mg_control_start(const mg_control_deps_t *d, char *err, size_t errlen);
/* Before the loop's last iteration: close the async handle (nothing reaches memory later). */
void mg_control_detach(mg_control_t *c);
/* After the loop ended, before the store closes: stop the thread, remove the hook, free. */
void mg_control_stop(mg_control_t *c);

typedef struct mg_control_stats_s {
    int64_t applied_id;      /* the last log entry in this instance's SQLite */
    uint64_t applied_total;  /* entries applied from the log (others' changes) */
    uint64_t appended_total; /* entries this instance appended */
    uint64_t refused_total;  /* admin transactions refused: PostgreSQL unreachable */
    uint64_t shipped_total;  /* audit records kept here while it was, appended since */
    int follower_connected;
    int64_t stalled_id;       /* the log entry this binary cannot apply (0: not stalled) */
    char stalled_reason[256]; /* why (table, column, constraint names; never values) */
} mg_control_stats_t;
void mg_control_stats(mg_control_t *c, mg_control_stats_t *out);

#endif
