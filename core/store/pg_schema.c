/* pg_schema: the shared PostgreSQL's migrations; see pg_schema.h. */
#include "store/pg_schema.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/pg.h"

/* The advisory lock's key: "moongate" in ASCII, so no other application collides by chance */
#define MIGRATION_LOCK "7021778593650832485"

static const char *const migrations[] = {
    /* 1: usage events (obs/usage.h), one per request id across every instance (the primary
     * key; writers use ON CONFLICT DO NOTHING), and the hourly roll-up kept by a trigger in
     * the event's own transaction, only for rows really inserted (as SQLite's migration 13) */
    "CREATE TABLE usage_events ("
    " request_id TEXT PRIMARY KEY, seq BIGSERIAL, node_id TEXT NOT NULL, at_ms BIGINT NOT NULL,"
    " endpoint TEXT NOT NULL, tenant_id BIGINT, project_id BIGINT, key_id BIGINT,"
    " application TEXT, user_id TEXT, logical_model TEXT, actual_model TEXT, provider_id TEXT,"
    " pool TEXT, attempts INTEGER NOT NULL DEFAULT 0,"
    " status TEXT NOT NULL CHECK(status IN ('succeeded','failed','cancelled','timed_out')),"
    " http_status INTEGER, error_code TEXT, stream INTEGER NOT NULL DEFAULT 0,"
    " input_tokens BIGINT NOT NULL DEFAULT 0, output_tokens BIGINT NOT NULL DEFAULT 0,"
    " cached_read_tokens BIGINT NOT NULL DEFAULT 0, cache_write_tokens BIGINT NOT NULL DEFAULT 0,"
    " reasoning_tokens BIGINT NOT NULL DEFAULT 0, input_estimated INTEGER NOT NULL DEFAULT 0,"
    " output_estimated INTEGER NOT NULL DEFAULT 0, latency_ms BIGINT NOT NULL DEFAULT 0,"
    " ttft_ms BIGINT, queue_ms BIGINT NOT NULL DEFAULT 0,"
    " cost_micros BIGINT NOT NULL DEFAULT 0, price_version TEXT, degraded TEXT,"
    " cancelled INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX idx_usage_events_at ON usage_events(at_ms);"
    "CREATE INDEX idx_usage_events_tenant ON usage_events(tenant_id, seq);"
    "CREATE TABLE usage_hourly ("
    " hour BIGINT NOT NULL, tenant_id BIGINT NOT NULL, project_id BIGINT NOT NULL,"
    " key_id BIGINT NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " requests BIGINT NOT NULL DEFAULT 0, errors BIGINT NOT NULL DEFAULT 0,"
    " cancelled BIGINT NOT NULL DEFAULT 0, input_tokens BIGINT NOT NULL DEFAULT 0,"
    " output_tokens BIGINT NOT NULL DEFAULT 0, cached_read_tokens BIGINT NOT NULL DEFAULT 0,"
    " cache_write_tokens BIGINT NOT NULL DEFAULT 0, reasoning_tokens BIGINT NOT NULL DEFAULT 0,"
    " cost_micros BIGINT NOT NULL DEFAULT 0, latency_ms_sum BIGINT NOT NULL DEFAULT 0,"
    " ttft_ms_sum BIGINT NOT NULL DEFAULT 0, ttft_count BIGINT NOT NULL DEFAULT 0,"
    " PRIMARY KEY (hour, tenant_id, project_id, key_id, provider_id, model));"
    "CREATE FUNCTION mg_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO usage_hourly VALUES ((NEW.at_ms / 3600000) * 3600, COALESCE(NEW.tenant_id, 0),"
    "  COALESCE(NEW.project_id, 0), COALESCE(NEW.key_id, 0), COALESCE(NEW.provider_id, ''),"
    "  COALESCE(NEW.logical_model, ''), 1, (NEW.status IN ('failed','timed_out'))::int,"
    "  (NEW.status = 'cancelled')::int, NEW.input_tokens, NEW.output_tokens,"
    "  NEW.cached_read_tokens, NEW.cache_write_tokens, NEW.reasoning_tokens, NEW.cost_micros,"
    "  NEW.latency_ms, COALESCE(NEW.ttft_ms, 0), (NEW.ttft_ms IS NOT NULL)::int)"
    " ON CONFLICT (hour, tenant_id, project_id, key_id, provider_id, model) DO UPDATE SET"
    "  requests = usage_hourly.requests + 1, errors = usage_hourly.errors + excluded.errors,"
    "  cancelled = usage_hourly.cancelled + excluded.cancelled,"
    "  input_tokens = usage_hourly.input_tokens + excluded.input_tokens,"
    "  output_tokens = usage_hourly.output_tokens + excluded.output_tokens,"
    "  cached_read_tokens = usage_hourly.cached_read_tokens + excluded.cached_read_tokens,"
    "  cache_write_tokens = usage_hourly.cache_write_tokens + excluded.cache_write_tokens,"
    "  reasoning_tokens = usage_hourly.reasoning_tokens + excluded.reasoning_tokens,"
    "  cost_micros = usage_hourly.cost_micros + excluded.cost_micros,"
    "  latency_ms_sum = usage_hourly.latency_ms_sum + excluded.latency_ms_sum,"
    "  ttft_ms_sum = usage_hourly.ttft_ms_sum + excluded.ttft_ms_sum,"
    "  ttft_count = usage_hourly.ttft_count + excluded.ttft_count;"
    " RETURN NULL; END $$;"
    "CREATE TRIGGER usage_events_rollup AFTER INSERT ON usage_events"
    " FOR EACH ROW EXECUTE FUNCTION mg_usage_rollup();",
    /* 2: the prepaid wallet and its ledger (tenancy/wallet.h), as SQLite's migration 13: a
     * wallet row, immutable entries, one hold per request, one top-up per payment event.
     * Every change is one function call (one transaction) that locks the wallet row first
     * (SELECT ... FOR UPDATE), so reservations from several instances serialise on it and
     * the balance and held figures always equal the sums of the entries. A hold remembers
     * the node that made it: only that node's restart marks its holds metering_failed. */
    "CREATE TABLE wallets ("
    " tenant_id BIGINT PRIMARY KEY, balance_micros BIGINT NOT NULL DEFAULT 0,"
    " held_micros BIGINT NOT NULL DEFAULT 0, entries BIGINT NOT NULL DEFAULT 0,"
    " updated_ms BIGINT NOT NULL DEFAULT 0);"
    "CREATE TABLE ledger_entries ("
    " id BIGSERIAL PRIMARY KEY, tenant_id BIGINT NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind IN ('reserve','settle','release','topup','adjustment')),"
    " amount_micros BIGINT NOT NULL, hold_micros BIGINT NOT NULL,"
    " request_id TEXT, source_id TEXT, reason TEXT, actor TEXT, at_ms BIGINT NOT NULL,"
    " CHECK(CASE WHEN kind IN ('reserve','settle','release') THEN request_id IS NOT NULL"
    "       ELSE source_id IS NOT NULL AND hold_micros = 0 END));"
    "CREATE INDEX idx_ledger_tenant ON ledger_entries(tenant_id, id);"
    "CREATE UNIQUE INDEX idx_ledger_one_reserve ON ledger_entries(request_id)"
    " WHERE kind = 'reserve';"
    "CREATE UNIQUE INDEX idx_ledger_one_end ON ledger_entries(request_id)"
    " WHERE kind IN ('settle','release');"
    "CREATE TABLE ledger_holds ("
    " request_id TEXT PRIMARY KEY, tenant_id BIGINT NOT NULL, node_id TEXT NOT NULL,"
    " reserved_micros BIGINT NOT NULL CHECK(reserved_micros >= 0),"
    " state TEXT NOT NULL CHECK(state IN"
    "  ('held','settled','released','metering_failed','released_unmetered')),"
    " charged_micros BIGINT, failure TEXT, reason TEXT, actor TEXT,"
    " created_ms BIGINT NOT NULL, ended_ms BIGINT);"
    "CREATE INDEX idx_ledger_holds_state ON ledger_holds(tenant_id, state);"
    "CREATE TABLE topups ("
    " event_id TEXT PRIMARY KEY, tenant_id BIGINT NOT NULL,"
    " amount_micros BIGINT NOT NULL CHECK(amount_micros > 0), at_ms BIGINT NOT NULL);"
    /* an entry and its wallet's figures, in the caller's transaction (the row locked) */
    "CREATE FUNCTION mg_ledger_entry(p_tenant BIGINT, p_kind TEXT, p_amount BIGINT,"
    " p_hold BIGINT, p_req TEXT, p_source TEXT, p_reason TEXT, p_actor TEXT, p_at BIGINT)"
    " RETURNS void LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, request_id,"
    "  source_id, reason, actor, at_ms)"
    "  VALUES (p_tenant, p_kind, p_amount, p_hold, p_req, p_source, p_reason, p_actor, p_at);"
    " UPDATE wallets SET balance_micros = balance_micros + p_amount,"
    "  held_micros = held_micros + p_hold, entries = entries + 1, updated_ms = p_at"
    "  WHERE tenant_id = p_tenant;"
    " END $$;"
    /* the reservation: true when held, false when the available amount does not cover it
     * (a wallet at zero covers nothing, not even a free request) */
    "CREATE FUNCTION mg_wallet_reserve(p_req TEXT, p_tenant BIGINT, p_micros BIGINT,"
    " p_at BIGINT, p_node TEXT) RETURNS boolean LANGUAGE plpgsql AS $$"
    " DECLARE w wallets%ROWTYPE; BEGIN"
    " INSERT INTO wallets(tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;"
    " SELECT * INTO w FROM wallets WHERE tenant_id = p_tenant FOR UPDATE;"
    " IF w.balance_micros - w.held_micros < GREATEST(p_micros, 1) THEN RETURN false; END IF;"
    " INSERT INTO ledger_holds(request_id, tenant_id, node_id, reserved_micros, state,"
    "  created_ms) VALUES (p_req, p_tenant, p_node, p_micros, 'held', p_at);"
    " PERFORM mg_ledger_entry(p_tenant, 'reserve', 0, p_micros, p_req, NULL, NULL, NULL, p_at);"
    " RETURN true; END $$;"
    /* a hold's end, once: 'settled' (charged), 'released' or 'metering_failed' (stays held,
     * no entry); 1 when it changed the hold, 0 when none was held (idempotent on retry) */
    "CREATE FUNCTION mg_wallet_end(p_req TEXT, p_state TEXT, p_charged BIGINT, p_failure TEXT,"
    " p_at BIGINT) RETURNS integer LANGUAGE plpgsql AS $$"
    " DECLARE h ledger_holds%ROWTYPE; BEGIN"
    " SELECT * INTO h FROM ledger_holds WHERE request_id = p_req;"
    " IF NOT FOUND THEN RETURN 0; END IF;"
    " PERFORM 1 FROM wallets WHERE tenant_id = h.tenant_id FOR UPDATE;"
    " SELECT * INTO h FROM ledger_holds WHERE request_id = p_req FOR UPDATE;"
    " IF h.state <> 'held' THEN RETURN 0; END IF;"
    " UPDATE ledger_holds SET state = p_state, ended_ms = p_at, failure = p_failure,"
    "  charged_micros = CASE WHEN p_state = 'settled' THEN GREATEST(p_charged, 0) END"
    "  WHERE request_id = p_req;"
    " IF p_state IN ('settled','released') THEN"
    "  PERFORM mg_ledger_entry(h.tenant_id, CASE p_state WHEN 'settled' THEN 'settle'"
    "   ELSE 'release' END, CASE WHEN p_state = 'settled' THEN -GREATEST(p_charged, 0)"
    "   ELSE 0 END, -h.reserved_micros, p_req, NULL, NULL, NULL, p_at);"
    " END IF;"
    " RETURN 1; END $$;"
    /* a top-up, once per payment event: true when new */
    "CREATE FUNCTION mg_wallet_topup(p_event TEXT, p_tenant BIGINT, p_micros BIGINT,"
    " p_at BIGINT, p_actor TEXT) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO wallets(tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;"
    " PERFORM 1 FROM wallets WHERE tenant_id = p_tenant FOR UPDATE;"
    " INSERT INTO topups VALUES (p_event, p_tenant, p_micros, p_at) ON CONFLICT DO NOTHING;"
    " IF NOT FOUND THEN RETURN false; END IF;"
    " PERFORM mg_ledger_entry(p_tenant, 'topup', p_micros, 0, NULL, p_event, NULL, p_actor,"
    "  p_at);"
    " RETURN true; END $$;",
    /* 3: the control plane's change log (admin/control.h): one row per changed row of a
     * control table, in commit order (appended only under pg_advisory_xact_lock, so ids
     * increase as transactions commit); row is the whole row as JSON ('put', 'add') or NULL
     * ('del'); node the instance that wrote it, at unix ms */
    "CREATE TABLE control_log ("
    " id BIGSERIAL PRIMARY KEY, tbl TEXT NOT NULL, pk TEXT NOT NULL,"
    " op TEXT NOT NULL CHECK(op IN ('put','del','add')), row TEXT,"
    " node TEXT NOT NULL, at BIGINT NOT NULL);",
    /* 4: an administrator's changes to the books, each one transaction on the locked wallet
     * row as the others: an adjustment entry (true), and the release of a metering_failed
     * hold with its reason ('released', 'missing', or the hold's state when it is not
     * metering_failed), whose release entry carries the reason and the actor */
    "CREATE FUNCTION mg_wallet_adjust(p_tenant BIGINT, p_amount BIGINT, p_source TEXT,"
    " p_reason TEXT, p_actor TEXT, p_at BIGINT) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO wallets(tenant_id) VALUES (p_tenant) ON CONFLICT DO NOTHING;"
    " PERFORM 1 FROM wallets WHERE tenant_id = p_tenant FOR UPDATE;"
    " PERFORM mg_ledger_entry(p_tenant, 'adjustment', p_amount, 0, NULL, p_source, p_reason,"
    "  p_actor, p_at);"
    " RETURN true; END $$;"
    "CREATE FUNCTION mg_wallet_release_unmetered(p_req TEXT, p_tenant BIGINT, p_reason TEXT,"
    " p_actor TEXT, p_at BIGINT) RETURNS text LANGUAGE plpgsql AS $$"
    " DECLARE h ledger_holds%ROWTYPE; BEGIN"
    " PERFORM 1 FROM wallets WHERE tenant_id = p_tenant FOR UPDATE;"
    " SELECT * INTO h FROM ledger_holds WHERE request_id = p_req AND tenant_id = p_tenant"
    "  FOR UPDATE;"
    " IF NOT FOUND THEN RETURN 'missing'; END IF;"
    " IF h.state <> 'metering_failed' THEN RETURN h.state; END IF;"
    " UPDATE ledger_holds SET state = 'released_unmetered', reason = p_reason, actor = p_actor,"
    "  ended_ms = p_at WHERE request_id = p_req;"
    " PERFORM mg_ledger_entry(p_tenant, 'release', 0, -h.reserved_micros, p_req, NULL, p_reason,"
    "  p_actor, p_at);"
    " RETURN 'released'; END $$;",
    /* 5: what the analytics (admin/stats.c) read, as SQLite keeps it: the event's log2 bins
     * of latency and TTFT (written by the insert, obs/usage.c: mg_usage_bin), usage_hourly's
     * cache hits and missing usage, the histograms behind the percentiles (usage_hist), and a
     * seq index for the event list's cursor. The trigger now keeps them all, in the event's
     * own transaction, for rows really inserted only (ON CONFLICT DO NOTHING adds nothing).
     * The stats read the hourly tables alone here (O(hours x groups)): no daily copies.
     * Back-filled from the events (PostgreSQL's are never pruned); the bin expression is
     * mg_usage_bin's: the bit length of ms, at most 24 (0 for ms <= 0). */
    "ALTER TABLE usage_events ADD COLUMN latency_bin INTEGER NOT NULL DEFAULT 0,"
    " ADD COLUMN ttft_bin INTEGER;"
    "UPDATE usage_events SET"
    " latency_bin = CASE WHEN latency_ms <= 0 THEN 0"
    "  ELSE LEAST(24, 65 - position('1' IN latency_ms::bit(64)::text)) END,"
    " ttft_bin = CASE WHEN ttft_ms IS NULL THEN NULL WHEN ttft_ms <= 0 THEN 0"
    "  ELSE LEAST(24, 65 - position('1' IN ttft_ms::bit(64)::text)) END;"
    "CREATE INDEX idx_usage_events_seq ON usage_events(seq);"
    "ALTER TABLE usage_hourly ADD COLUMN cache_hits BIGINT NOT NULL DEFAULT 0,"
    " ADD COLUMN missing_usage BIGINT NOT NULL DEFAULT 0;"
    "UPDATE usage_hourly h SET cache_hits = e.hits, missing_usage = e.miss FROM ("
    " SELECT (at_ms / 3600000) * 3600 AS hour, COALESCE(tenant_id, 0) AS t,"
    "  COALESCE(project_id, 0) AS p, COALESCE(key_id, 0) AS k, COALESCE(provider_id, '') AS v,"
    "  COALESCE(logical_model, '') AS m, count(*) FILTER (WHERE cached_read_tokens > 0) AS hits,"
    "  count(*) FILTER (WHERE status = 'succeeded'"
    "   AND (input_estimated <> 0 OR output_estimated <> 0)) AS miss"
    " FROM usage_events GROUP BY 1, 2, 3, 4, 5, 6) e"
    " WHERE h.hour = e.hour AND h.tenant_id = e.t AND h.project_id = e.p AND h.key_id = e.k"
    "  AND h.provider_id = e.v AND h.model = e.m;"
    "CREATE TABLE usage_hist ("
    " hour BIGINT NOT NULL, tenant_id BIGINT NOT NULL, project_id BIGINT NOT NULL,"
    " key_id BIGINT NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind IN ('latency','ttft')), bin INTEGER NOT NULL,"
    " n BIGINT NOT NULL DEFAULT 0,"
    " PRIMARY KEY (hour, tenant_id, project_id, key_id, provider_id, model, kind, bin));"
    "INSERT INTO usage_hist SELECT (at_ms / 3600000) * 3600, COALESCE(tenant_id, 0),"
    " COALESCE(project_id, 0), COALESCE(key_id, 0), COALESCE(provider_id, ''),"
    " COALESCE(logical_model, ''), 'latency', latency_bin, count(*) FROM usage_events"
    " GROUP BY 1, 2, 3, 4, 5, 6, 8;"
    "INSERT INTO usage_hist SELECT (at_ms / 3600000) * 3600, COALESCE(tenant_id, 0),"
    " COALESCE(project_id, 0), COALESCE(key_id, 0), COALESCE(provider_id, ''),"
    " COALESCE(logical_model, ''), 'ttft', ttft_bin, count(*) FROM usage_events"
    " WHERE ttft_bin IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 8;"
    "CREATE OR REPLACE FUNCTION mg_usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $$"
    " DECLARE h BIGINT := (NEW.at_ms / 3600000) * 3600; t BIGINT := COALESCE(NEW.tenant_id, 0);"
    " p BIGINT := COALESCE(NEW.project_id, 0); k BIGINT := COALESCE(NEW.key_id, 0);"
    " v TEXT := COALESCE(NEW.provider_id, ''); m TEXT := COALESCE(NEW.logical_model, '');"
    " BEGIN"
    " INSERT INTO usage_hourly(hour, tenant_id, project_id, key_id, provider_id, model,"
    "  requests, errors, cancelled, input_tokens, output_tokens, cached_read_tokens,"
    "  cache_write_tokens, reasoning_tokens, cost_micros, latency_ms_sum, ttft_ms_sum,"
    "  ttft_count, cache_hits, missing_usage)"
    "  VALUES (h, t, p, k, v, m, 1, (NEW.status IN ('failed','timed_out'))::int,"
    "  (NEW.status = 'cancelled')::int, NEW.input_tokens, NEW.output_tokens,"
    "  NEW.cached_read_tokens, NEW.cache_write_tokens, NEW.reasoning_tokens, NEW.cost_micros,"
    "  NEW.latency_ms, COALESCE(NEW.ttft_ms, 0), (NEW.ttft_ms IS NOT NULL)::int,"
    "  (NEW.cached_read_tokens > 0)::int, (NEW.status = 'succeeded'"
    "   AND (NEW.input_estimated <> 0 OR NEW.output_estimated <> 0))::int)"
    " ON CONFLICT (hour, tenant_id, project_id, key_id, provider_id, model) DO UPDATE SET"
    "  requests = usage_hourly.requests + 1, errors = usage_hourly.errors + excluded.errors,"
    "  cancelled = usage_hourly.cancelled + excluded.cancelled,"
    "  input_tokens = usage_hourly.input_tokens + excluded.input_tokens,"
    "  output_tokens = usage_hourly.output_tokens + excluded.output_tokens,"
    "  cached_read_tokens = usage_hourly.cached_read_tokens + excluded.cached_read_tokens,"
    "  cache_write_tokens = usage_hourly.cache_write_tokens + excluded.cache_write_tokens,"
    "  reasoning_tokens = usage_hourly.reasoning_tokens + excluded.reasoning_tokens,"
    "  cost_micros = usage_hourly.cost_micros + excluded.cost_micros,"
    "  latency_ms_sum = usage_hourly.latency_ms_sum + excluded.latency_ms_sum,"
    "  ttft_ms_sum = usage_hourly.ttft_ms_sum + excluded.ttft_ms_sum,"
    "  ttft_count = usage_hourly.ttft_count + excluded.ttft_count,"
    "  cache_hits = usage_hourly.cache_hits + excluded.cache_hits,"
    "  missing_usage = usage_hourly.missing_usage + excluded.missing_usage;"
    " INSERT INTO usage_hist VALUES (h, t, p, k, v, m, 'latency', NEW.latency_bin, 1)"
    "  ON CONFLICT (hour, tenant_id, project_id, key_id, provider_id, model, kind, bin)"
    "  DO UPDATE SET n = usage_hist.n + 1;"
    " IF NEW.ttft_bin IS NOT NULL THEN"
    "  INSERT INTO usage_hist VALUES (h, t, p, k, v, m, 'ttft', NEW.ttft_bin, 1)"
    "  ON CONFLICT (hour, tenant_id, project_id, key_id, provider_id, model, kind, bin)"
    "  DO UPDATE SET n = usage_hist.n + 1;"
    " END IF;"
    " RETURN NULL; END $$;",
    /* 6: an instance's own entries by row key (admin/control.c's shipping of the audit records
     * kept locally while PostgreSQL was unreachable looks up whether one is in the log) */
    "CREATE INDEX idx_control_log_node_pk ON control_log(node, tbl, pk);",
};

#define N_MIGRATIONS ((int)(sizeof(migrations) / sizeof(migrations[0])))

int mg_pg_schema_latest(void)
{
    return N_MIGRATIONS;
}

/* Run sql; 0, or -1 with err set from the server's message (never the url). */
static int run(PGconn *c, const char *sql, int n, const char *const *p, int *first_int, char *err,
               size_t errlen)
{
    PGresult *r = PQexecParams(c, sql, n, NULL, p, NULL, NULL, 0);
    ExecStatusType s = PQresultStatus(r);
    int ok = s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
    if (!ok) {
        const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        snprintf(err, errlen, "%s", m ? m : "the server did not answer");
    } else if (first_int && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) {
        *first_int = atoi(PQgetvalue(r, 0, 0));
    }
    PQclear(r);
    return ok ? 0 : -1;
}

static int apply(PGconn *c, int version, char *err, size_t errlen)
{
    char v[16];
    snprintf(v, sizeof(v), "%d", version);
    const char *p[1] = {v};
    if (run(c, "BEGIN", 0, NULL, NULL, err, errlen) != 0) return -1;
    /* a multi-statement string runs through the simple protocol (no parameters) */
    PGresult *r = PQexec(c, migrations[version - 1]);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    if (!ok) {
        const char *m = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
        snprintf(err, errlen, "migration %d: %s", version, m ? m : "failed");
    }
    PQclear(r);
    if (!ok ||
        run(c, "INSERT INTO mg_schema(version) VALUES ($1::int)", 1, p, NULL, err, errlen) != 0 ||
        run(c, "COMMIT", 0, NULL, NULL, err, errlen) != 0) {
        PQclear(PQexec(c, "ROLLBACK"));
        return -1;
    }
    return 0;
}

int mg_pg_migrate(PGconn *c, char *err, size_t errlen)
{
    if (run(c, "SELECT pg_advisory_lock(" MIGRATION_LOCK ")", 0, NULL, NULL, err, errlen) != 0)
        return -1;
    int version = 0, rc = 0;
    if (run(c,
            "CREATE TABLE IF NOT EXISTS mg_schema (version INTEGER PRIMARY KEY,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            0, NULL, NULL, err, errlen) != 0 ||
        run(c, "SELECT COALESCE(MAX(version), 0) FROM mg_schema", 0, NULL, &version, err, errlen) !=
            0)
        rc = -1;
    while (rc == 0 && version < N_MIGRATIONS) {
        if (apply(c, version + 1, err, errlen) != 0) rc = -1;
        else version++;
    }
    char ignored[64];
    run(c, "SELECT pg_advisory_unlock(" MIGRATION_LOCK ")", 0, NULL, NULL, ignored,
        sizeof(ignored));
    return rc == 0 ? version : -1;
}
