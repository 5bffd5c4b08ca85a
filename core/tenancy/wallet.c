/* wallet: the prepaid ledger's writes and its check; see wallet.h. The arithmetic itself
 * lives in the schema's triggers (store.c, migration 13), so that no path — the request
 * path, the admin API, a hand-written statement — can change a balance without its entry. */
#include "tenancy/wallet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the request path ------------------------------------------------------------------ */

/* The reservation: a hold row (its trigger writes the reserve entry, whose trigger moves the
 * wallet's held figure), inserted only when the wallet's available amount covers it. ?3 is
 * the estimate; a wallet at zero covers nothing, not even a free request. */
#define RESERVE_SQL                                                                                \
    "INSERT INTO ledger_holds(request_id, tenant_id, reserved_micros, state, created_ms)"          \
    " SELECT ?1, CAST(?2 AS INTEGER), CAST(?3 AS INTEGER), 'held', CAST(?4 AS INTEGER)"            \
    " WHERE (SELECT balance_micros - held_micros FROM wallets"                                     \
    "        WHERE tenant_id = CAST(?2 AS INTEGER)) >= MAX(CAST(?3 AS INTEGER), 1)"

#define SETTLE_SQL                                                                                 \
    "UPDATE ledger_holds SET state = 'settled', charged_micros = CAST(?2 AS INTEGER),"             \
    " ended_ms = CAST(?3 AS INTEGER) WHERE request_id = ?1 AND state = 'held'"

#define RELEASE_SQL                                                                                \
    "UPDATE ledger_holds SET state = 'released', ended_ms = CAST(?2 AS INTEGER)"                   \
    " WHERE request_id = ?1 AND state = 'held'"

#define METERING_FAILED_SQL                                                                        \
    "UPDATE ledger_holds SET state = 'metering_failed', failure = 'no upstream usage',"            \
    " ended_ms = CAST(?2 AS INTEGER) WHERE request_id = ?1 AND state = 'held'"

#define RECOVER_SQL                                                                                \
    "UPDATE ledger_holds SET state = 'metering_failed', failure = 'process ended',"                \
    " ended_ms = CAST(?1 AS INTEGER) WHERE state = 'held'"

typedef struct reserve_op_s {
    mg_wallet_reserved_fn cb;
    void *ud;
} reserve_op_t;

/* ---- the same in the cluster's PostgreSQL (store/pg_schema.c, migration 2) -----------------
 * Each is one call of a function that locks the wallet row (SELECT ... FOR UPDATE) and writes
 * the hold, its entry and the wallet's figures in one transaction. The reservation is at
 * most once (the request waits for it: PostgreSQL away means 503 at once); the ends are
 * durable (kept and retried until PostgreSQL is back: the function changes a hold in state
 * `held` only, so a retry changes nothing twice). */

static void on_pg_reserved(void *ud, int rc, const char *value)
{
    reserve_op_t op = *(reserve_op_t *)ud;
    free(ud);
    op.cb(op.ud, rc == 0 ? 0 : -1, rc == 0 && value && value[0] == 't');
}

typedef struct end_op_s {
    mg_store_rows_fn done;
    void *ud;
} end_op_t;

static void on_pg_ended(void *ud, int rc, const char *value)
{
    end_op_t op = *(end_op_t *)ud;
    free(ud);
    op.done(op.ud, rc == 0 ? 0 : MG_STORE_ERROR, rc == 0 && value ? strtoll(value, NULL, 10) : 0);
}

static int pg_end(mg_pg_t *pg, const char *request_id, const char *state, int64_t charged,
                  const char *failure, uint64_t now_ms, mg_store_rows_fn done, void *ud)
{
    char m[24], at[24];
    snprintf(m, sizeof(m), "%lld", (long long)(charged > 0 ? charged : 0));
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[5] = {request_id, state, m, failure, at};
    end_op_t *op = NULL;
    if (done) {
        if (!(op = malloc(sizeof(*op)))) return -1;
        *op = (end_op_t){done, ud};
    }
    if (mg_pg_exec(pg, "SELECT mg_wallet_end($1, $2, $3::bigint, $4, $5::bigint)", 5, p, 1,
                   op ? on_pg_ended : NULL, op) != 0) {
        free(op);
        return -1;
    }
    return 0;
}

static void on_reserved(void *ud, int rc, int64_t rows)
{
    reserve_op_t op = *(reserve_op_t *)ud;
    free(ud);
    op.cb(op.ud, rc, rc == 0 && rows == 1);
}

int mg_wallet_reserve(mg_store_t *st, int64_t tenant_id, const char *request_id, int64_t micros,
                      uint64_t now_ms, mg_wallet_reserved_fn cb, void *ud)
{
    char t[24], m[24], at[24];
    if (!st || !request_id || !cb || micros < 0) return -1;
    reserve_op_t *op = malloc(sizeof(*op));
    if (!op) return -1;
    *op = (reserve_op_t){cb, ud};
    snprintf(t, sizeof(t), "%lld", (long long)tenant_id);
    snprintf(m, sizeof(m), "%lld", (long long)micros);
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[5] = {request_id, t, m, at, mg_store_node_id(st)};
    mg_pg_t *pg = mg_store_pg(st);
    if (pg) {
        if (mg_pg_exec(pg, "SELECT mg_wallet_reserve($1, $2::bigint, $3::bigint, $4::bigint, $5)",
                       5, p, 0, on_pg_reserved, op) != 0) {
            free(op);
            return -1;
        }
        return 0;
    }
    int rc = mg_store_write_rows_nowait(st, RESERVE_SQL, 4, p, on_reserved, op);
    if (rc != 0) { /* the disk full: the request is refused at once rather than held */
        free(op);
        return rc == MG_STORE_EFULL ? MG_STORE_EFULL : -1;
    }
    return 0;
}

/* A hold's end: done may be NULL (then fire and forget). */
static int end_hold(mg_store_t *st, const char *sql, int n, const char *const *p,
                    mg_store_rows_fn done, void *ud)
{
    if (!st) return -1;
    if (done) return mg_store_write_rows(st, sql, n, p, done, ud);
    return mg_store_write(st, sql, n, p);
}

int mg_wallet_settle(mg_store_t *st, const char *request_id, int64_t charged_micros,
                     uint64_t now_ms, mg_store_rows_fn done, void *ud)
{
    char m[24], at[24];
    snprintf(m, sizeof(m), "%lld", (long long)(charged_micros > 0 ? charged_micros : 0));
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[3] = {request_id, m, at};
    if (mg_store_pg(st))
        return pg_end(mg_store_pg(st), request_id, "settled", charged_micros, NULL, now_ms, done,
                      ud);
    return end_hold(st, SETTLE_SQL, 3, p, done, ud);
}

int mg_wallet_release(mg_store_t *st, const char *request_id, uint64_t now_ms,
                      mg_store_rows_fn done, void *ud)
{
    char at[24];
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[2] = {request_id, at};
    if (mg_store_pg(st))
        return pg_end(mg_store_pg(st), request_id, "released", 0, NULL, now_ms, done, ud);
    return end_hold(st, RELEASE_SQL, 2, p, done, ud);
}

int mg_wallet_metering_failed(mg_store_t *st, const char *request_id, uint64_t now_ms,
                              mg_store_rows_fn done, void *ud)
{
    char at[24];
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[2] = {request_id, at};
    if (mg_store_pg(st))
        return pg_end(mg_store_pg(st), request_id, "metering_failed", 0, "no upstream usage",
                      now_ms, done, ud);
    return end_hold(st, METERING_FAILED_SQL, 2, p, done, ud);
}

int mg_wallet_recover(mg_store_t *st, uint64_t now_ms)
{
    char at[24];
    snprintf(at, sizeof(at), "%llu", (unsigned long long)now_ms);
    const char *p[1] = {at};
    mg_pg_t *pg = mg_store_pg(st);
    if (pg) { /* this node's holds from before now only: the other instances' are live, and
                 this one's new reservations may commit first on another connection */
        const char *q[2] = {at, mg_store_node_id(st)};
        return mg_pg_exec(pg,
                          "UPDATE ledger_holds SET state = 'metering_failed', failure = 'process"
                          " ended', ended_ms = $1::bigint WHERE state = 'held' AND node_id = $2"
                          " AND created_ms < $1::bigint",
                          2, q, 1, NULL, NULL);
    }
    return mg_store_write(st, RECOVER_SQL, 1, p);
}

/* ---- the check --------------------------------------------------------------------------- */

/* Each query lists the rows that break one rule, as one line of text each; written in the SQL
 * SQLite and PostgreSQL share, so the cluster's books are checked by the same rules. */
#define RESERVES "SUM(CASE WHEN kind = 'reserve' THEN 1 ELSE 0 END)"
#define ENDS "SUM(CASE WHEN kind <> 'reserve' THEN 1 ELSE 0 END)"
static const struct {
    const char *rule;
    const char *sql;
} checks[] = {
    {"wallet balance/held differ from the sums of its entries",
     "SELECT 'tenant ' || w.tenant_id || ': balance ' || w.balance_micros || ' held '"
     " || w.held_micros || ', entries sum to ' || COALESCE(e.a, 0) || ' and ' || COALESCE(e.h, 0)"
     " || ' (' || w.entries || ' counted, ' || COALESCE(e.n, 0) || ' present)'"
     " FROM wallets w LEFT JOIN (SELECT tenant_id, SUM(amount_micros) a, SUM(hold_micros) h,"
     "  COUNT(*) n FROM ledger_entries GROUP BY tenant_id) e ON e.tenant_id = w.tenant_id"
     " WHERE w.balance_micros <> COALESCE(e.a, 0) OR w.held_micros <> COALESCE(e.h, 0)"
     "  OR w.entries <> COALESCE(e.n, 0)"},
    {"entries without a wallet",
     "SELECT 'tenant ' || tenant_id || ': ' || COUNT(*) || ' entries and no wallet'"
     " FROM ledger_entries WHERE tenant_id NOT IN (SELECT tenant_id FROM wallets)"
     " GROUP BY tenant_id"},
    {"held differs from the open holds",
     "SELECT 'tenant ' || w.tenant_id || ': held ' || w.held_micros || ', open holds sum to '"
     " || COALESCE(h.s, 0) FROM wallets w LEFT JOIN (SELECT tenant_id, SUM(reserved_micros) s"
     "  FROM ledger_holds WHERE state IN ('held','metering_failed') GROUP BY tenant_id) h"
     "  ON h.tenant_id = w.tenant_id WHERE w.held_micros <> COALESCE(h.s, 0)"},
    {"a request's entries do not pair",
     "SELECT 'request ' || request_id || ': ' || " RESERVES " || ' reserve, ' || " ENDS
     " || ' settle/release, holds sum to ' || SUM(hold_micros)"
     " FROM ledger_entries WHERE request_id IS NOT NULL GROUP BY request_id"
     " HAVING " RESERVES " <> 1 OR " ENDS " > 1 OR (" ENDS " = 1 AND SUM(hold_micros) <> 0)"},
    {"a hold's state disagrees with its entries",
     "SELECT 'request ' || h.request_id || ': state ' || h.state || ' with '"
     " || (SELECT COUNT(*) FROM ledger_entries e WHERE e.request_id = h.request_id"
     "     AND e.kind <> 'reserve') || ' end entries'"
     " FROM ledger_holds h WHERE (SELECT COUNT(*) FROM ledger_entries e"
     "  WHERE e.request_id = h.request_id AND e.kind <> 'reserve')"
     "  <> CASE WHEN h.state IN ('settled','released','released_unmetered') THEN 1 ELSE 0 END"
     "  OR (SELECT COUNT(*) FROM ledger_entries e WHERE e.request_id = h.request_id"
     "      AND e.kind = 'reserve' AND e.hold_micros = h.reserved_micros) <> 1"
     "  OR (h.state = 'settled' AND (SELECT -amount_micros FROM ledger_entries e"
     "      WHERE e.request_id = h.request_id AND e.kind = 'settle')"
     "      IS DISTINCT FROM h.charged_micros)"},
    {"a top-up without its one entry",
     "SELECT 'top-up ' || t.event_id || ': ' || (SELECT COUNT(*) FROM ledger_entries e"
     "  WHERE e.kind = 'topup' AND e.source_id = t.event_id) || ' entries'"
     " FROM topups t WHERE (SELECT COUNT(*) FROM ledger_entries e WHERE e.kind = 'topup'"
     "  AND e.source_id = t.event_id AND e.amount_micros = t.amount_micros"
     "  AND e.tenant_id = t.tenant_id) <> 1"},
};

typedef struct check_s {
    FILE *out;
    const char *rule;
    long problems;
    long count;
} check_t;

static void on_problem(void *ud, int ncols, const char *const *cols)
{
    check_t *c = ud;
    c->problems++;
    if (c->out) fprintf(c->out, "ledger: %s: %s\n", c->rule, ncols > 0 && cols[0] ? cols[0] : "?");
}

static void on_count(void *ud, int ncols, const char *const *cols)
{
    check_t *c = ud;
    c->count = ncols > 0 && cols[0] ? strtol(cols[0], NULL, 10) : 0;
}

/* One check's query, on the store or on PostgreSQL. */
typedef int (*check_query_fn)(void *db, const char *sql, check_t *c, char *err, size_t errlen);

static int store_query(void *db, const char *sql, check_t *c, char *err, size_t errlen)
{
    return mg_store_query(db, sql, 0, NULL, c->rule ? on_problem : on_count, c, err, errlen);
}

static int pg_query(void *db, const char *sql, check_t *c, char *err, size_t errlen)
{
    return mg_pg_query_sync(db, sql, 0, NULL, c->rule ? on_problem : on_count, c, err, errlen);
}

static long check_with(check_query_fn q, void *db, FILE *out, long *wallets, long *entries,
                       char *err, size_t errlen)
{
    check_t c = {out, NULL, 0, 0};
    for (size_t i = 0; i < sizeof(checks) / sizeof(checks[0]); i++) {
        c.rule = checks[i].rule;
        if (q(db, checks[i].sql, &c, err, errlen) != 0) return -1;
    }
    c.rule = NULL; /* the counts */
    if (wallets) {
        if (q(db, "SELECT COUNT(*) FROM wallets", &c, err, errlen) != 0) return -1;
        *wallets = c.count;
    }
    if (entries) {
        if (q(db, "SELECT COUNT(*) FROM ledger_entries", &c, err, errlen) != 0) return -1;
        *entries = c.count;
    }
    return c.problems;
}

long mg_wallet_check(mg_store_t *st, FILE *out, long *wallets, long *entries, char *err,
                     size_t errlen)
{
    return check_with(store_query, st, out, wallets, entries, err, errlen);
}

long mg_wallet_check_pg(mg_pg_t *pg, FILE *out, long *wallets, long *entries, char *err,
                        size_t errlen)
{
    return check_with(pg_query, pg, out, wallets, entries, err, errlen);
}
