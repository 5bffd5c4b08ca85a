/* schema: the embedded store's migrations; see schema.h. */
#include "store/schema.h"

#include <stdio.h>

static const char *const migrations[] = {
    /* 1: the pool gateway schema (Sidecar ADR section 7.2) */
    "CREATE TABLE providers ("
    " id TEXT PRIMARY KEY, name TEXT NOT NULL, api_key TEXT NOT NULL, endpoint_url TEXT NOT NULL,"
    " model_prefix TEXT DEFAULT '',"
    " pool TEXT NOT NULL DEFAULT 'main' CHECK(pool IN ('main','fallback')),"
    " status TEXT NOT NULL DEFAULT 'active' CHECK(status IN ('active','disabled','cooldown')),"
    " source TEXT NOT NULL DEFAULT 'db' CHECK(source IN ('env','db','file')),"
    " rpm_limit INTEGER NOT NULL DEFAULT 60, tpm_limit INTEGER DEFAULT NULL,"
    " weight REAL DEFAULT 1.0, cost_per_1k_tokens REAL DEFAULT 0.0, cooldown_until TEXT,"
    " metadata JSON DEFAULT '{}',"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE provider_usage_logs ("
    " id TEXT PRIMARY KEY, provider_id TEXT NOT NULL, model TEXT DEFAULT 'unknown',"
    " prompt_tokens INTEGER DEFAULT 0, completion_tokens INTEGER DEFAULT 0,"
    " total_tokens INTEGER DEFAULT 0, cost REAL DEFAULT 0.0, request_count INTEGER DEFAULT 0,"
    " error_count INTEGER DEFAULT 0, avg_latency_ms INTEGER DEFAULT 0, hour_bucket TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE UNIQUE INDEX idx_usage_provider_hour ON provider_usage_logs(provider_id, hour_bucket);"
    "CREATE TABLE cooldown_events ("
    " id TEXT PRIMARY KEY, provider_id TEXT NOT NULL, consecutive_count INTEGER NOT NULL DEFAULT 1,"
    " cooldown_seconds INTEGER NOT NULL, response_summary TEXT DEFAULT '',"
    " started_at TEXT NOT NULL DEFAULT (datetime('now')), ended_at TEXT);"
    "CREATE INDEX idx_cooldown_provider_time ON cooldown_events(provider_id, started_at);"
    "CREATE TABLE provider_health ("
    " provider_id TEXT PRIMARY KEY,"
    " state TEXT NOT NULL DEFAULT 'healthy' CHECK(state IN ('healthy','degraded','down')),"
    " last_latency_ms INTEGER DEFAULT 0, last_status_code INTEGER DEFAULT 200,"
    " success_rate_5m REAL DEFAULT 1.0, consecutive_failures INTEGER DEFAULT 0,"
    " last_check_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE system_config ("
    " key TEXT PRIMARY KEY, value TEXT NOT NULL, description TEXT DEFAULT '',"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE TABLE daily_stats ("
    " id TEXT PRIMARY KEY, date TEXT NOT NULL, pool TEXT NOT NULL CHECK(pool IN ('main','fallback')),"
    " total_requests INTEGER DEFAULT 0, total_errors INTEGER DEFAULT 0, total_tokens INTEGER DEFAULT 0,"
    " total_cost REAL DEFAULT 0.0, unique_providers INTEGER DEFAULT 0,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')));"
    "CREATE UNIQUE INDEX idx_daily_date_pool ON daily_stats(date, pool);",
    /* 2: runtime state of every provider (config or admin), restored at start */
    "CREATE TABLE provider_state ("
    " provider_id TEXT PRIMARY KEY, cooldown_until_ms INTEGER NOT NULL DEFAULT 0,"
    " consecutive_429 INTEGER NOT NULL DEFAULT 0, observing INTEGER NOT NULL DEFAULT 0,"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
    /* 3: tenancy. Times are unix seconds (audit_logs.at: unix milliseconds); limits are 0
     * for "no limit"; a key is stored only as the hex SHA-256 of the clear key plus its
     * display form. JSON arrays/objects are kept as text. A key's project must belong to
     * the key's tenant (composite foreign key). Key names are unique among a tenant's
     * unrevoked keys, so a rotation (revoke old, insert new) may keep the name. */
    "CREATE TABLE tenants ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL);"
    "CREATE TABLE projects ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " name TEXT NOT NULL, rpm_limit INTEGER NOT NULL DEFAULT 0,"
    " tpm_limit INTEGER NOT NULL DEFAULT 0, max_concurrency INTEGER NOT NULL DEFAULT 0,"
    " monthly_limit_micros INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,"
    " UNIQUE(tenant_id, name), UNIQUE(id, tenant_id));"
    "CREATE TABLE api_keys ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " project_id INTEGER, name TEXT, digest TEXT NOT NULL UNIQUE, display TEXT NOT NULL,"
    " scopes TEXT NOT NULL DEFAULT '[\"inference\"]', models TEXT NOT NULL DEFAULT '[]',"
    " priorities TEXT NOT NULL DEFAULT '[\"P0\",\"P1\",\"P2\",\"P3\",\"P4\"]',"
    " rpm_limit INTEGER NOT NULL DEFAULT 0, tpm_limit INTEGER NOT NULL DEFAULT 0,"
    " max_concurrency INTEGER NOT NULL DEFAULT 0, max_queued INTEGER NOT NULL DEFAULT 0,"
    " daily_limit_micros INTEGER NOT NULL DEFAULT 0,"
    " monthly_limit_micros INTEGER NOT NULL DEFAULT 0, expires_at INTEGER,"
    " labels TEXT NOT NULL DEFAULT '{}',"
    " enabled INTEGER NOT NULL DEFAULT 1 CHECK(enabled IN (0, 1)),"
    " revoked_at INTEGER, replaced_by INTEGER, last_used_at INTEGER,"
    " created_at INTEGER NOT NULL,"
    " FOREIGN KEY (project_id, tenant_id) REFERENCES projects(id, tenant_id));"
    "CREATE UNIQUE INDEX idx_api_keys_tenant_name ON api_keys(tenant_id, name)"
    " WHERE name IS NOT NULL AND revoked_at IS NULL;"
    "CREATE INDEX idx_api_keys_project ON api_keys(project_id);"
    "CREATE TABLE audit_logs ("
    " id INTEGER PRIMARY KEY, at INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,"
    " target TEXT, status INTEGER NOT NULL, request_id TEXT, client_addr TEXT);"
    "CREATE INDEX idx_audit_logs_at ON audit_logs(at);",
    /* 4: async tasks (POST /v1/tasks): state and result, kept for tasks.retention_seconds */
    "CREATE TABLE tasks ("
    " id TEXT PRIMARY KEY, model TEXT NOT NULL, state TEXT NOT NULL, reason TEXT,"
    " http_status INTEGER, result TEXT, created_ms INTEGER NOT NULL, finished_ms INTEGER);"
    "CREATE INDEX idx_tasks_created ON tasks(created_ms);",
    /* 5: idempotency: the stored answer of a request per (caller scope, key) */
    "CREATE TABLE idempotency ("
    " id TEXT PRIMARY KEY, http_status INTEGER NOT NULL, stream INTEGER NOT NULL,"
    " body TEXT NOT NULL, expires_ms INTEGER NOT NULL);",
    /* 6: spend metering: micros charged per key or project and period ("d:YYYY-MM-DD",
     * "m:YYYY-MM"), for the daily and monthly spend limits */
    "CREATE TABLE spend ("
    " scope TEXT NOT NULL CHECK(scope IN ('key','project')), id INTEGER NOT NULL,"
    " period TEXT NOT NULL, micros INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (scope, id, period));",
    /* 7: tenant admin tokens (admin_scope.c): digest only, bound to one tenant */
    "CREATE TABLE admin_tokens ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL REFERENCES tenants(id),"
    " name TEXT, digest TEXT NOT NULL UNIQUE, display TEXT NOT NULL,"
    " created_at INTEGER NOT NULL, revoked_at INTEGER);",
    /* 8: logical models added through the admin API (models.h): the definition as JSON */
    "CREATE TABLE models ("
    " name TEXT PRIMARY KEY, definition TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
    /* 9: applications added through the admin API (apps.h): the definition as JSON */
    "CREATE TABLE applications ("
    " name TEXT PRIMARY KEY, definition TEXT NOT NULL,"
    " created_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " updated_at TEXT NOT NULL DEFAULT (datetime('now')));",
    /* 10: idempotency records carry the group their memory cap counts against (idem.h) */
    "ALTER TABLE idempotency ADD COLUMN grp TEXT NOT NULL DEFAULT '';"
    "CREATE INDEX idx_idempotency_grp ON idempotency(grp, expires_ms);",
    /* 11: a key belongs to an application: its caps, models and data policy apply */
    "ALTER TABLE api_keys ADD COLUMN application TEXT;",
    /* 12: a task is its submitter's: a key holder sees and cancels its own */
    "ALTER TABLE tasks ADD COLUMN key_id INTEGER;",
    /* 13: usage metering (obs/usage.h). One event per request that reached routing, keyed by
     * request_id (INSERT OR IGNORE: a retried write never doubles it); seq orders them for
     * the newest-first cursor. Token columns are mutually exclusive billing buckets: input
     * is the uncached input (OpenAI's cached_tokens already taken out of prompt_tokens),
     * cached_read and cache_write apart. Times are unix ms, hours and days UTC. A trigger
     * (until migration 17; now obs/usage_rollup.c) keeps the roll-ups in the event's own
     * transaction, only for rows really inserted: usage_hourly (per tenant, project, key, provider
     * and logical model: what analytics read), usage_hist (latency and TTFT histograms, log2 bins
     * of ms, for percentiles), the ADR's provider_usage_logs (per provider and actual model, now
     * unique per model too) and daily_stats (per pool). Pruning raw events never touches them. */
    "CREATE TABLE usage_events ("
    " seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, at_ms INTEGER NOT NULL,"
    " endpoint TEXT NOT NULL, tenant_id INTEGER, project_id INTEGER, key_id INTEGER,"
    " application TEXT, user_id TEXT, logical_model TEXT, actual_model TEXT, provider_id TEXT,"
    " pool TEXT, attempts INTEGER NOT NULL DEFAULT 0,"
    " status TEXT NOT NULL CHECK(status IN ('succeeded','failed','cancelled','timed_out')),"
    " http_status INTEGER, error_code TEXT, stream INTEGER NOT NULL DEFAULT 0,"
    " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,"
    " cached_read_tokens INTEGER NOT NULL DEFAULT 0, cache_write_tokens INTEGER NOT NULL DEFAULT 0,"
    " reasoning_tokens INTEGER NOT NULL DEFAULT 0, input_estimated INTEGER NOT NULL DEFAULT 0,"
    " output_estimated INTEGER NOT NULL DEFAULT 0, latency_ms INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms INTEGER, queue_ms INTEGER NOT NULL DEFAULT 0,"
    " cost_micros INTEGER NOT NULL DEFAULT 0, price_version TEXT, degraded TEXT,"
    " cancelled INTEGER NOT NULL DEFAULT 0, latency_bin INTEGER NOT NULL DEFAULT 0,"
    " ttft_bin INTEGER);"
    "CREATE INDEX idx_usage_events_at ON usage_events(at_ms);"
    "CREATE INDEX idx_usage_events_tenant ON usage_events(tenant_id, seq);"
    "CREATE TABLE usage_hourly ("
    " hour INTEGER NOT NULL, tenant_id INTEGER NOT NULL, project_id INTEGER NOT NULL,"
    " key_id INTEGER NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,"
    " cancelled INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,"
    " output_tokens INTEGER NOT NULL DEFAULT 0, cached_read_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_write_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_hits INTEGER NOT NULL DEFAULT 0, missing_usage INTEGER NOT NULL DEFAULT 0,"
    " cost_micros INTEGER NOT NULL DEFAULT 0, latency_ms_sum INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms_sum INTEGER NOT NULL DEFAULT 0, ttft_count INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (hour, tenant_id, project_id, key_id, provider_id, model));"
    "CREATE TABLE usage_hist ("
    " hour INTEGER NOT NULL, tenant_id INTEGER NOT NULL, project_id INTEGER NOT NULL,"
    " key_id INTEGER NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind IN ('latency','ttft')), bin INTEGER NOT NULL,"
    " n INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (hour, tenant_id, project_id, key_id, provider_id, model, kind, bin));"
    "DROP INDEX idx_usage_provider_hour;"
    "ALTER TABLE provider_usage_logs ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE provider_usage_logs ADD COLUMN cached_read_tokens INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE provider_usage_logs ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE provider_usage_logs ADD COLUMN latency_ms_sum INTEGER NOT NULL DEFAULT 0;"
    "CREATE UNIQUE INDEX idx_usage_provider_model_hour"
    " ON provider_usage_logs(provider_id, model, hour_bucket);"
    "ALTER TABLE daily_stats ADD COLUMN total_cost_micros INTEGER NOT NULL DEFAULT 0;"
    "CREATE TRIGGER usage_events_rollup AFTER INSERT ON usage_events BEGIN"
    " INSERT INTO usage_hourly VALUES ((NEW.at_ms / 3600000) * 3600, COALESCE(NEW.tenant_id, 0),"
    "  COALESCE(NEW.project_id, 0), COALESCE(NEW.key_id, 0), COALESCE(NEW.provider_id, ''),"
    "  COALESCE(NEW.logical_model, ''), 1, NEW.status IN ('failed','timed_out'),"
    "  NEW.status = 'cancelled', NEW.input_tokens, NEW.output_tokens, NEW.cached_read_tokens,"
    "  NEW.cache_write_tokens, NEW.reasoning_tokens, NEW.cached_read_tokens > 0,"
    "  NEW.status = 'succeeded' AND (NEW.input_estimated OR NEW.output_estimated),"
    "  NEW.cost_micros, NEW.latency_ms, COALESCE(NEW.ttft_ms, 0), NEW.ttft_ms IS NOT NULL)"
    "  ON CONFLICT DO UPDATE SET requests = requests + 1, errors = errors + excluded.errors,"
    "  cancelled = cancelled + excluded.cancelled,"
    "  input_tokens = input_tokens + excluded.input_tokens,"
    "  output_tokens = output_tokens + excluded.output_tokens,"
    "  cached_read_tokens = cached_read_tokens + excluded.cached_read_tokens,"
    "  cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,"
    "  reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,"
    "  cache_hits = cache_hits + excluded.cache_hits,"
    "  missing_usage = missing_usage + excluded.missing_usage,"
    "  cost_micros = cost_micros + excluded.cost_micros,"
    "  latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,"
    "  ttft_ms_sum = ttft_ms_sum + excluded.ttft_ms_sum,"
    "  ttft_count = ttft_count + excluded.ttft_count;"
    " INSERT INTO usage_hist SELECT (NEW.at_ms / 3600000) * 3600, COALESCE(NEW.tenant_id, 0),"
    "  COALESCE(NEW.project_id, 0), COALESCE(NEW.key_id, 0), COALESCE(NEW.provider_id, ''),"
    "  COALESCE(NEW.logical_model, ''), 'latency', NEW.latency_bin, 1 WHERE true"
    "  ON CONFLICT DO UPDATE SET n = n + 1;"
    " INSERT INTO usage_hist SELECT (NEW.at_ms / 3600000) * 3600, COALESCE(NEW.tenant_id, 0),"
    "  COALESCE(NEW.project_id, 0), COALESCE(NEW.key_id, 0), COALESCE(NEW.provider_id, ''),"
    "  COALESCE(NEW.logical_model, ''), 'ttft', NEW.ttft_bin, 1 WHERE NEW.ttft_bin IS NOT NULL"
    "  ON CONFLICT DO UPDATE SET n = n + 1;"
    " INSERT INTO provider_usage_logs(id, provider_id, model, prompt_tokens, completion_tokens,"
    "  total_tokens, cost, request_count, error_count, avg_latency_ms, hour_bucket, cost_micros,"
    "  cached_read_tokens, cache_write_tokens, latency_ms_sum)"
    "  SELECT NEW.provider_id || '|' || COALESCE(NEW.actual_model, 'unknown') || '|' ||"
    "  strftime('%Y-%m-%dT%H:00:00Z', NEW.at_ms / 1000, 'unixepoch'), NEW.provider_id,"
    "  COALESCE(NEW.actual_model, 'unknown'),"
    "  NEW.input_tokens + NEW.cached_read_tokens + NEW.cache_write_tokens, NEW.output_tokens,"
    "  NEW.input_tokens + NEW.cached_read_tokens + NEW.cache_write_tokens + NEW.output_tokens,"
    "  NEW.cost_micros / 1e6, 1, NEW.status IN ('failed','timed_out'), NEW.latency_ms,"
    "  strftime('%Y-%m-%dT%H:00:00Z', NEW.at_ms / 1000, 'unixepoch'), NEW.cost_micros,"
    "  NEW.cached_read_tokens, NEW.cache_write_tokens, NEW.latency_ms"
    "  WHERE NEW.provider_id IS NOT NULL"
    "  ON CONFLICT(provider_id, model, hour_bucket) DO UPDATE SET"
    "  prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    "  completion_tokens = completion_tokens + excluded.completion_tokens,"
    "  total_tokens = total_tokens + excluded.total_tokens,"
    "  cost_micros = cost_micros + excluded.cost_micros,"
    "  cost = (cost_micros + excluded.cost_micros) / 1e6, request_count = request_count + 1,"
    "  error_count = error_count + excluded.error_count,"
    "  cached_read_tokens = cached_read_tokens + excluded.cached_read_tokens,"
    "  cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,"
    "  latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,"
    "  avg_latency_ms = (latency_ms_sum + excluded.latency_ms_sum) / (request_count + 1);"
    " INSERT INTO daily_stats(id, date, pool, total_requests, total_errors, total_tokens,"
    "  total_cost, total_cost_micros)"
    "  SELECT date(NEW.at_ms / 1000, 'unixepoch') || '|' || NEW.pool,"
    "  date(NEW.at_ms / 1000, 'unixepoch'), NEW.pool, 1, NEW.status IN ('failed','timed_out'),"
    "  NEW.input_tokens + NEW.cached_read_tokens + NEW.cache_write_tokens + NEW.output_tokens,"
    "  NEW.cost_micros / 1e6, NEW.cost_micros WHERE NEW.pool IN ('main','fallback')"
    "  ON CONFLICT(date, pool) DO UPDATE SET total_requests = total_requests + 1,"
    "  total_errors = total_errors + excluded.total_errors,"
    "  total_tokens = total_tokens + excluded.total_tokens,"
    "  total_cost_micros = total_cost_micros + excluded.total_cost_micros,"
    "  total_cost = (total_cost_micros + excluded.total_cost_micros) / 1e6;"
    "END;"
    /* versioned prices (obs/price.h): a row is never updated, a new version is a new row */
    "CREATE TABLE prices ("
    " id INTEGER PRIMARY KEY, provider_id TEXT NOT NULL, model TEXT NOT NULL DEFAULT '*',"
    " input_micros INTEGER NOT NULL, output_micros INTEGER NOT NULL,"
    " cached_input_micros INTEGER NOT NULL, cache_write_micros INTEGER NOT NULL,"
    " effective_at INTEGER NOT NULL, created_at INTEGER NOT NULL);",
    /* 14: spend limits for tenants and daily ones for projects (the spend table gains the
     * tenant scope: SQLite cannot change a CHECK, so it is rebuilt), a tenant's billing mode,
     * and the prepaid ledger (tenancy/wallet.h). Ledger entries are immutable (triggers refuse
     * UPDATE and DELETE); a wallet row is only ever changed by the trigger that applies an
     * entry, so its balance and held figures are always the sums of its entries. A hold is
     * one request's reservation: inserting it writes the reserve entry, ending it (settled,
     * released, released_unmetered) writes the settle or release entry, once (a guard trigger
     * allows only held -> settled | released | metering_failed and metering_failed ->
     * released_unmetered with a reason). A top-up row writes its topup entry; its event id is
     * its primary key, so a replayed webhook adds nothing. */
    "CREATE TABLE spend_v13 ("
    " scope TEXT NOT NULL CHECK(scope IN ('key','project','tenant')), id INTEGER NOT NULL,"
    " period TEXT NOT NULL, micros INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (scope, id, period));"
    "INSERT INTO spend_v13(scope, id, period, micros) SELECT scope, id, period, micros FROM spend;"
    "DROP TABLE spend;"
    "ALTER TABLE spend_v13 RENAME TO spend;"
    "ALTER TABLE projects ADD COLUMN daily_limit_micros INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN daily_limit_micros INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN monthly_limit_micros INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE tenants ADD COLUMN billing_mode TEXT NOT NULL DEFAULT 'postpaid'"
    " CHECK(billing_mode IN ('postpaid','prepaid'));"
    "ALTER TABLE tenants ADD COLUMN require_upstream_usage INTEGER NOT NULL DEFAULT 0"
    " CHECK(require_upstream_usage IN (0, 1));"
    "CREATE TABLE wallets ("
    " tenant_id INTEGER PRIMARY KEY, balance_micros INTEGER NOT NULL DEFAULT 0,"
    " held_micros INTEGER NOT NULL DEFAULT 0, entries INTEGER NOT NULL DEFAULT 0,"
    " updated_ms INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE ledger_entries ("
    " id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind IN ('reserve','settle','release','topup','adjustment')),"
    " amount_micros INTEGER NOT NULL, hold_micros INTEGER NOT NULL,"
    " request_id TEXT, source_id TEXT, reason TEXT, actor TEXT, at_ms INTEGER NOT NULL,"
    " CHECK(CASE WHEN kind IN ('reserve','settle','release') THEN request_id IS NOT NULL"
    "       ELSE source_id IS NOT NULL AND hold_micros = 0 END));"
    "CREATE INDEX idx_ledger_tenant ON ledger_entries(tenant_id, id);"
    "CREATE UNIQUE INDEX idx_ledger_one_reserve ON ledger_entries(request_id)"
    " WHERE kind = 'reserve';"
    "CREATE UNIQUE INDEX idx_ledger_one_end ON ledger_entries(request_id)"
    " WHERE kind IN ('settle','release');"
    "CREATE TRIGGER ledger_entries_immutable_u BEFORE UPDATE ON ledger_entries"
    " BEGIN SELECT RAISE(ABORT, 'ledger entries are immutable'); END;"
    "CREATE TRIGGER ledger_entries_immutable_d BEFORE DELETE ON ledger_entries"
    " BEGIN SELECT RAISE(ABORT, 'ledger entries are immutable'); END;"
    "CREATE TRIGGER ledger_entries_apply AFTER INSERT ON ledger_entries BEGIN"
    " INSERT OR IGNORE INTO wallets(tenant_id) VALUES (NEW.tenant_id);"
    " UPDATE wallets SET balance_micros = balance_micros + NEW.amount_micros,"
    "  held_micros = held_micros + NEW.hold_micros, entries = entries + 1,"
    "  updated_ms = NEW.at_ms WHERE tenant_id = NEW.tenant_id;"
    " END;"
    "CREATE TABLE ledger_holds ("
    " request_id TEXT PRIMARY KEY, tenant_id INTEGER NOT NULL,"
    " reserved_micros INTEGER NOT NULL CHECK(reserved_micros >= 0),"
    " state TEXT NOT NULL CHECK(state IN"
    "  ('held','settled','released','metering_failed','released_unmetered')),"
    " charged_micros INTEGER, failure TEXT, reason TEXT, actor TEXT,"
    " created_ms INTEGER NOT NULL, ended_ms INTEGER);"
    "CREATE INDEX idx_ledger_holds_state ON ledger_holds(tenant_id, state);"
    "CREATE TRIGGER ledger_holds_reserve AFTER INSERT ON ledger_holds BEGIN"
    " SELECT RAISE(ABORT, 'a hold starts held') WHERE NEW.state <> 'held';"
    " INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, request_id, at_ms)"
    "  VALUES (NEW.tenant_id, 'reserve', 0, NEW.reserved_micros, NEW.request_id, NEW.created_ms);"
    " END;"
    "CREATE TRIGGER ledger_holds_guard BEFORE UPDATE ON ledger_holds"
    " WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.reserved_micros IS NOT OLD.reserved_micros"
    "  OR NEW.request_id IS NOT OLD.request_id OR NOT ("
    "  (OLD.state = 'held' AND NEW.state IN ('settled','released','metering_failed'))"
    "  OR (OLD.state = 'metering_failed' AND NEW.state = 'released_unmetered'"
    "      AND OLD.reason IS NULL AND length(trim(COALESCE(NEW.reason, ''))) > 0))"
    " BEGIN SELECT RAISE(ABORT, 'a hold ends once, as its states allow'); END;"
    "CREATE TRIGGER ledger_holds_no_delete BEFORE DELETE ON ledger_holds"
    " BEGIN SELECT RAISE(ABORT, 'holds are kept'); END;"
    "CREATE TRIGGER ledger_holds_end AFTER UPDATE OF state ON ledger_holds"
    " WHEN NEW.state IN ('settled','released','released_unmetered') BEGIN"
    " INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, request_id,"
    "  reason, actor, at_ms)"
    "  VALUES (NEW.tenant_id, CASE NEW.state WHEN 'settled' THEN 'settle' ELSE 'release' END,"
    "   CASE NEW.state WHEN 'settled' THEN -COALESCE(NEW.charged_micros, 0) ELSE 0 END,"
    "   -OLD.reserved_micros, NEW.request_id, NEW.reason, NEW.actor, NEW.ended_ms);"
    " END;"
    "CREATE TABLE topups ("
    " event_id TEXT PRIMARY KEY, tenant_id INTEGER NOT NULL,"
    " amount_micros INTEGER NOT NULL CHECK(amount_micros > 0), at_ms INTEGER NOT NULL);"
    "CREATE TRIGGER topups_immutable BEFORE UPDATE ON topups"
    " BEGIN SELECT RAISE(ABORT, 'top-ups are immutable'); END;"
    "CREATE TRIGGER topups_apply AFTER INSERT ON topups BEGIN"
    " INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, source_id, actor,"
    "  at_ms) VALUES (NEW.tenant_id, 'topup', NEW.amount_micros, 0, NEW.event_id, 'webhook',"
    "  NEW.at_ms);"
    " END;",
    /* 15: Responses kept for GET /v1/responses/{id}, its input_items and
     * previous_response_id (pipeline/responses_store.h): the Response, its input items, the
     * conversation through it as chat messages, the owner's scope, unix seconds */
    "CREATE TABLE responses ("
    " id TEXT PRIMARY KEY, scope TEXT NOT NULL, response TEXT NOT NULL, input TEXT NOT NULL,"
    " messages TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL);"
    "CREATE INDEX idx_responses_expiry ON responses(expires_at);",
    /* 16: sessions (session/session.h): settings and times, and their messages in order */
    "CREATE TABLE sessions ("
    " id TEXT PRIMARY KEY, tenant_id INTEGER NOT NULL, project_id INTEGER NOT NULL,"
    " settings TEXT NOT NULL, summary TEXT, created_ms INTEGER NOT NULL,"
    " last_active_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL);"
    "CREATE INDEX idx_sessions_expires ON sessions(expires_ms);"
    "CREATE TABLE session_messages ("
    " session_id TEXT NOT NULL, seq INTEGER NOT NULL, created_ms INTEGER NOT NULL,"
    " tokens INTEGER NOT NULL, message TEXT NOT NULL, PRIMARY KEY (session_id, seq));",
    /* 17: the usage roll-ups are summed in C per batch by the writer (obs/usage_rollup.h:
     * one UPSERT per touched bucket instead of four per event, same numbers), and the
     * events' tenant index goes: the events listing walks seq newest first (its filters are
     * optional, so no index fits them), the pruner uses idx_usage_events_at */
    "DROP TRIGGER usage_events_rollup;"
    "DROP INDEX idx_usage_events_tenant;",
    /* 18: the roll-ups are written about once a second, not per batch (store.h); the
     * watermark is the last usage event summed into them (all of them so far) */
    "CREATE TABLE usage_rollup_mark (id INTEGER PRIMARY KEY CHECK (id = 1),"
    " seq INTEGER NOT NULL);"
    "INSERT INTO usage_rollup_mark SELECT 1, coalesce(max(seq), 0) FROM usage_events;",
    /* 19: open circuit breakers, so that a restart (kill -9 too) does not close them: the
     * provider's own (model '') and its routes', each until its open period ends (unix ms) */
    "CREATE TABLE breaker_state (provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " open_until_ms INTEGER NOT NULL, updated_at TEXT NOT NULL DEFAULT (datetime('now')),"
    " PRIMARY KEY (provider_id, model));",
    /* 20: usage_events rebuilt, the same columns and rows (seq kept, so the roll-ups'
     * watermark still holds), two things cheaper per event (bench/README.md): the status
     * CHECK compares with OR (an IN list of four made SQLite build an ephemeral index on
     * every INSERT), and idx_usage_events_at goes (one index page less per commit; the
     * pruner walks the oldest events by seq, obs/usage.c). O(events) once, at start-up. */
    "CREATE TABLE usage_events_v20 ("
    " seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, at_ms INTEGER NOT NULL,"
    " endpoint TEXT NOT NULL, tenant_id INTEGER, project_id INTEGER, key_id INTEGER,"
    " application TEXT, user_id TEXT, logical_model TEXT, actual_model TEXT, provider_id TEXT,"
    " pool TEXT, attempts INTEGER NOT NULL DEFAULT 0,"
    " status TEXT NOT NULL CHECK(status = 'succeeded' OR status = 'failed'"
    " OR status = 'cancelled' OR status = 'timed_out'),"
    " http_status INTEGER, error_code TEXT, stream INTEGER NOT NULL DEFAULT 0,"
    " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,"
    " cached_read_tokens INTEGER NOT NULL DEFAULT 0, cache_write_tokens INTEGER NOT NULL DEFAULT 0,"
    " reasoning_tokens INTEGER NOT NULL DEFAULT 0, input_estimated INTEGER NOT NULL DEFAULT 0,"
    " output_estimated INTEGER NOT NULL DEFAULT 0, latency_ms INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms INTEGER, queue_ms INTEGER NOT NULL DEFAULT 0,"
    " cost_micros INTEGER NOT NULL DEFAULT 0, price_version TEXT, degraded TEXT,"
    " cancelled INTEGER NOT NULL DEFAULT 0, latency_bin INTEGER NOT NULL DEFAULT 0,"
    " ttft_bin INTEGER);"
    "INSERT INTO usage_events_v20 SELECT seq, request_id, at_ms, endpoint, tenant_id,"
    " project_id, key_id, application, user_id, logical_model, actual_model, provider_id, pool,"
    " attempts, status, http_status, error_code, stream, input_tokens, output_tokens,"
    " cached_read_tokens, cache_write_tokens, reasoning_tokens, input_estimated,"
    " output_estimated, latency_ms, ttft_ms, queue_ms, cost_micros, price_version, degraded,"
    " cancelled, latency_bin, ttft_bin FROM usage_events;"
    "DROP TABLE usage_events;"
    "ALTER TABLE usage_events_v20 RENAME TO usage_events;",
    /* 21: bytes per prompt token learned per route for models without a known tokenizer
     * (token/calib.h, pipeline/calib.c), reloaded at start-up */
    "CREATE TABLE token_calibration ("
    " provider_id TEXT NOT NULL, model TEXT NOT NULL, bytes_per_token REAL NOT NULL,"
    " samples INTEGER NOT NULL, updated_ms INTEGER NOT NULL, PRIMARY KEY (provider_id, model));",
    /* 22: spend, ledger_entries and ledger_holds rebuilt, the same columns and rows (ids kept,
     * so the wallets' sums still hold), with their IN-list CHECKs, partial index and trigger
     * conditions written with OR: SQLite 3.40 builds an ephemeral index for an IN list on
     * every row it checks (a spend upsert of four rows 31 -> 15 us, a prepaid hold and its
     * settle 120 -> 66 us; bench/README.md, as migration 20 did for usage_events). The
     * triggers that write ledger entries from other tables are dropped first (a rename
     * checks every trigger's tables) and made again with the others. O(rows) once. */
    "DROP TRIGGER ledger_holds_reserve;"
    "DROP TRIGGER ledger_holds_end;"
    "DROP TRIGGER topups_apply;"
    "CREATE TABLE spend_v22 ( scope TEXT NOT NULL CHECK((scope = 'key' OR scope = 'project'"
    " OR scope = 'tenant')), id INTEGER NOT NULL, period TEXT NOT NULL, micros INTEGER NOT"
    " NULL DEFAULT 0, PRIMARY KEY (scope, id, period));"
    "INSERT INTO spend_v22(scope, id, period, micros) SELECT scope, id, period, micros FROM"
    " spend;"
    "DROP TABLE spend;"
    "ALTER TABLE spend_v22 RENAME TO spend;"
    "CREATE TABLE ledger_entries_v22 ( id INTEGER PRIMARY KEY, tenant_id INTEGER NOT NULL,"
    " kind TEXT NOT NULL CHECK((kind = 'reserve' OR kind = 'settle' OR kind = 'release' OR"
    " kind = 'topup' OR kind = 'adjustment')), amount_micros INTEGER NOT NULL, hold_micros"
    " INTEGER NOT NULL, request_id TEXT, source_id TEXT, reason TEXT, actor TEXT, at_ms"
    " INTEGER NOT NULL, CHECK(CASE WHEN (kind = 'reserve' OR kind = 'settle' OR kind ="
    " 'release') THEN request_id IS NOT NULL ELSE source_id IS NOT NULL AND hold_micros = 0"
    " END));"
    "INSERT INTO ledger_entries_v22(id, tenant_id, kind, amount_micros, hold_micros,"
    " request_id, source_id, reason, actor, at_ms) SELECT id, tenant_id, kind, amount_micros,"
    " hold_micros, request_id, source_id, reason, actor, at_ms FROM ledger_entries;"
    "DROP TABLE ledger_entries;"
    "ALTER TABLE ledger_entries_v22 RENAME TO ledger_entries;"
    "CREATE TABLE ledger_holds_v22 ( request_id TEXT PRIMARY KEY, tenant_id INTEGER NOT NULL,"
    " reserved_micros INTEGER NOT NULL CHECK(reserved_micros >= 0), state TEXT NOT NULL"
    " CHECK((state = 'held' OR state = 'settled' OR state = 'released' OR state ="
    " 'metering_failed' OR state = 'released_unmetered')), charged_micros INTEGER, failure"
    " TEXT, reason TEXT, actor TEXT, created_ms INTEGER NOT NULL, ended_ms INTEGER);"
    "INSERT INTO ledger_holds_v22(request_id, tenant_id, reserved_micros, state,"
    " charged_micros, failure, reason, actor, created_ms, ended_ms) SELECT request_id,"
    " tenant_id, reserved_micros, state, charged_micros, failure, reason, actor, created_ms,"
    " ended_ms FROM ledger_holds;"
    "DROP TABLE ledger_holds;"
    "ALTER TABLE ledger_holds_v22 RENAME TO ledger_holds;"
    "CREATE INDEX idx_ledger_tenant ON ledger_entries(tenant_id, id);"
    "CREATE UNIQUE INDEX idx_ledger_one_reserve ON ledger_entries(request_id) WHERE kind ="
    " 'reserve';"
    "CREATE UNIQUE INDEX idx_ledger_one_end ON ledger_entries(request_id) WHERE (kind ="
    " 'settle' OR kind = 'release');"
    "CREATE TRIGGER ledger_entries_immutable_u BEFORE UPDATE ON ledger_entries BEGIN SELECT"
    " RAISE(ABORT, 'ledger entries are immutable'); END;"
    "CREATE TRIGGER ledger_entries_immutable_d BEFORE DELETE ON ledger_entries BEGIN SELECT"
    " RAISE(ABORT, 'ledger entries are immutable'); END;"
    "CREATE TRIGGER ledger_entries_apply AFTER INSERT ON ledger_entries BEGIN INSERT OR"
    " IGNORE INTO wallets(tenant_id) VALUES (NEW.tenant_id); UPDATE wallets SET"
    " balance_micros = balance_micros + NEW.amount_micros, held_micros = held_micros +"
    " NEW.hold_micros, entries = entries + 1, updated_ms = NEW.at_ms WHERE tenant_id ="
    " NEW.tenant_id; END;"
    "CREATE INDEX idx_ledger_holds_state ON ledger_holds(tenant_id, state);"
    "CREATE TRIGGER ledger_holds_reserve AFTER INSERT ON ledger_holds BEGIN SELECT"
    " RAISE(ABORT, 'a hold starts held') WHERE NEW.state <> 'held'; INSERT INTO"
    " ledger_entries(tenant_id, kind, amount_micros, hold_micros, request_id, at_ms) VALUES"
    " (NEW.tenant_id, 'reserve', 0, NEW.reserved_micros, NEW.request_id, NEW.created_ms);"
    " END;"
    "CREATE TRIGGER ledger_holds_guard BEFORE UPDATE ON ledger_holds WHEN NEW.tenant_id IS"
    " NOT OLD.tenant_id OR NEW.reserved_micros IS NOT OLD.reserved_micros OR NEW.request_id"
    " IS NOT OLD.request_id OR NOT ( (OLD.state = 'held' AND (NEW.state = 'settled' OR"
    " NEW.state = 'released' OR NEW.state = 'metering_failed')) OR (OLD.state ="
    " 'metering_failed' AND NEW.state = 'released_unmetered' AND OLD.reason IS NULL AND"
    " length(trim(COALESCE(NEW.reason, ''))) > 0)) BEGIN SELECT RAISE(ABORT, 'a hold ends"
    " once, as its states allow'); END;"
    "CREATE TRIGGER ledger_holds_no_delete BEFORE DELETE ON ledger_holds BEGIN SELECT"
    " RAISE(ABORT, 'holds are kept'); END;"
    "CREATE TRIGGER ledger_holds_end AFTER UPDATE OF state ON ledger_holds WHEN (NEW.state ="
    " 'settled' OR NEW.state = 'released' OR NEW.state = 'released_unmetered') BEGIN INSERT"
    " INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, request_id, reason,"
    " actor, at_ms) VALUES (NEW.tenant_id, CASE NEW.state WHEN 'settled' THEN 'settle' ELSE"
    " 'release' END, CASE NEW.state WHEN 'settled' THEN -COALESCE(NEW.charged_micros, 0) ELSE"
    " 0 END, -OLD.reserved_micros, NEW.request_id, NEW.reason, NEW.actor, NEW.ended_ms); END;"
    "CREATE TRIGGER topups_apply AFTER INSERT ON topups BEGIN INSERT INTO"
    " ledger_entries(tenant_id, kind, amount_micros, hold_micros, source_id, actor, at_ms)"
    " VALUES (NEW.tenant_id, 'topup', NEW.amount_micros, 0, NEW.event_id, 'webhook',"
    " NEW.at_ms); END;",
    /* 23: responses rebuilt as one B-tree appended in time order (bench/README.md): the row
     * key is the time-ordered number the gateway's ids now carry ("resp_" + its 16 hex
     * digits + 24 random hex, pipeline/responses_store.h), so a stored Response is one
     * append, no entry in an id index and none in an expiry index (the start-up prune
     * walks the oldest keys). The same rows and columns; the rows of before keep their
     * order under keys 1..n, below 2^56, found by their id through a partial index that
     * later rows (keys from unix ms << 16, above 2^56) never enter. The expiry columns
     * come first, so the prune reads no overflow page. O(responses) once. */
    "CREATE TABLE responses_v23 ("
    " rid INTEGER PRIMARY KEY, expires_at INTEGER NOT NULL, created_at INTEGER NOT NULL,"
    " id TEXT NOT NULL, scope TEXT NOT NULL, response TEXT NOT NULL, input TEXT NOT NULL,"
    " messages TEXT NOT NULL);"
    "INSERT INTO responses_v23(expires_at, created_at, id, scope, response, input, messages)"
    " SELECT expires_at, created_at, id, scope, response, input, messages FROM responses"
    " ORDER BY rowid;"
    "DROP TABLE responses;"
    "ALTER TABLE responses_v23 RENAME TO responses;"
    "CREATE UNIQUE INDEX idx_responses_legacy ON responses(id) WHERE rid < 72057594037927936;",
    /* 24: daily roll-ups beside the hourly ones, the same key with the UTC day (unix seconds
     * of its midnight) for the hour and the same sums (obs/usage_rollup.h writes them in one
     * flush): a stats range reads its whole days here and only its partial days' hours from
     * usage_hourly / usage_hist (admin/stats.c), 24 times fewer rows for a month
     * (bench/README.md); and usage_tenant_hourly, the same sums per hour and tenant only,
     * what the series by hour and by day read. WITHOUT ROWID: the range scan reads the rows
     * in key order from one B-tree, no rowid lookup per row. Back-filled from the hourly
     * tables (O(their rows), once); the events past the roll-ups' watermark are summed into
     * all of them at start-up. */
    "CREATE TABLE usage_daily ("
    " day INTEGER NOT NULL, tenant_id INTEGER NOT NULL, project_id INTEGER NOT NULL,"
    " key_id INTEGER NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,"
    " cancelled INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,"
    " output_tokens INTEGER NOT NULL DEFAULT 0, cached_read_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_write_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_hits INTEGER NOT NULL DEFAULT 0, missing_usage INTEGER NOT NULL DEFAULT 0,"
    " cost_micros INTEGER NOT NULL DEFAULT 0, latency_ms_sum INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms_sum INTEGER NOT NULL DEFAULT 0, ttft_count INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (day, tenant_id, project_id, key_id, provider_id, model)) WITHOUT ROWID;"
    "CREATE TABLE usage_hist_daily ("
    " day INTEGER NOT NULL, tenant_id INTEGER NOT NULL, project_id INTEGER NOT NULL,"
    " key_id INTEGER NOT NULL, provider_id TEXT NOT NULL, model TEXT NOT NULL,"
    " kind TEXT NOT NULL CHECK(kind = 'latency' OR kind = 'ttft'), bin INTEGER NOT NULL,"
    " n INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (day, tenant_id, project_id, key_id, provider_id, model, kind, bin))"
    " WITHOUT ROWID;"
    "INSERT INTO usage_daily SELECT hour - hour % 86400, tenant_id, project_id, key_id,"
    " provider_id, model, SUM(requests), SUM(errors), SUM(cancelled), SUM(input_tokens),"
    " SUM(output_tokens), SUM(cached_read_tokens), SUM(cache_write_tokens),"
    " SUM(reasoning_tokens), SUM(cache_hits), SUM(missing_usage), SUM(cost_micros),"
    " SUM(latency_ms_sum), SUM(ttft_ms_sum), SUM(ttft_count) FROM usage_hourly"
    " GROUP BY 1, 2, 3, 4, 5, 6;"
    "INSERT INTO usage_hist_daily SELECT hour - hour % 86400, tenant_id, project_id, key_id,"
    " provider_id, model, kind, bin, SUM(n) FROM usage_hist GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;"
    "CREATE TABLE usage_tenant_hourly ("
    " hour INTEGER NOT NULL, tenant_id INTEGER NOT NULL,"
    " requests INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,"
    " cancelled INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,"
    " output_tokens INTEGER NOT NULL DEFAULT 0, cached_read_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_write_tokens INTEGER NOT NULL DEFAULT 0, reasoning_tokens INTEGER NOT NULL DEFAULT 0,"
    " cache_hits INTEGER NOT NULL DEFAULT 0, missing_usage INTEGER NOT NULL DEFAULT 0,"
    " cost_micros INTEGER NOT NULL DEFAULT 0, latency_ms_sum INTEGER NOT NULL DEFAULT 0,"
    " ttft_ms_sum INTEGER NOT NULL DEFAULT 0, ttft_count INTEGER NOT NULL DEFAULT 0,"
    " PRIMARY KEY (hour, tenant_id)) WITHOUT ROWID;"
    "INSERT INTO usage_tenant_hourly SELECT hour, tenant_id, SUM(requests), SUM(errors),"
    " SUM(cancelled), SUM(input_tokens), SUM(output_tokens), SUM(cached_read_tokens),"
    " SUM(cache_write_tokens), SUM(reasoning_tokens), SUM(cache_hits), SUM(missing_usage),"
    " SUM(cost_micros), SUM(latency_ms_sum), SUM(ttft_ms_sum), SUM(ttft_count)"
    " FROM usage_hourly GROUP BY 1, 2;",
    /* 25: the audit records of this instance that the cluster's control log does not carry
     * yet (written while PostgreSQL was unreachable: admin/control.h), by id; the control
     * follower ships them when it is back and removes them here. Per node, not a control
     * table. audit_unshipped_new writes a record and its id in one statement (the store's
     * writer runs one statement per write): an insert into the view is one into each table.
     * IF NOT EXISTS: run again over itself, it makes nothing twice (unit/test_usage_daily). */
    "CREATE TABLE IF NOT EXISTS audit_unshipped (id INTEGER PRIMARY KEY);"
    "CREATE VIEW IF NOT EXISTS audit_unshipped_new AS SELECT at, actor, action, target,"
    " status, request_id, client_addr FROM audit_logs WHERE 0;"
    "CREATE TRIGGER IF NOT EXISTS audit_unshipped_new_insert"
    " INSTEAD OF INSERT ON audit_unshipped_new BEGIN"
    " INSERT INTO audit_logs(at, actor, action, target, status, request_id, client_addr)"
    "  VALUES (NEW.at, NEW.actor, NEW.action, NEW.target, NEW.status, NEW.request_id,"
    "  NEW.client_addr);"
    " INSERT INTO audit_unshipped(id) SELECT MAX(id) FROM audit_logs; END;",
};

int mg_sqlite_exec(sqlite3 *db, const char *sql, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, errlen, "%s", msg ? msg : "sqlite error");
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

static int current_version(sqlite3 *db)
{
    sqlite3_stmt *st;
    int v = 0;
    if (sqlite3_prepare_v2(db, "SELECT COALESCE(MAX(version),0) FROM schema_migrations", -1, &st,
                           NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

int mg_schema_migrate(sqlite3 *db, char *err, size_t errlen)
{
    if (mg_sqlite_exec(db,
                       "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY,"
                       " applied_at TEXT NOT NULL DEFAULT (datetime('now')))",
                       err, errlen) != 0)
        return -1;
    int v = current_version(db);
    int n = (int)(sizeof(migrations) / sizeof(migrations[0]));
    if (v < 0) {
        snprintf(err, errlen, "cannot read schema version");
        return -1;
    }
    if (v > n) {
        snprintf(err, errlen, "database schema %d is newer than this binary knows (%d)", v, n);
        return -1;
    }
    for (int i = v; i < n; i++) {
        char rec[128];
        snprintf(rec, sizeof(rec), "INSERT INTO schema_migrations(version) VALUES (%d);", i + 1);
        if (mg_sqlite_exec(db, "BEGIN IMMEDIATE", err, errlen) != 0) return -1;
        if (mg_sqlite_exec(db, migrations[i], err, errlen) != 0 ||
            mg_sqlite_exec(db, rec, err, errlen) != 0) {
            char ignore[64];
            mg_sqlite_exec(db, "ROLLBACK", ignore, sizeof(ignore));
            return -1;
        }
        if (mg_sqlite_exec(db, "COMMIT", err, errlen) != 0) return -1;
    }
    return n;
}
