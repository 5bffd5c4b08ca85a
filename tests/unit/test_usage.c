/* Unit tests for core/obs/usage.c and core/obs/price.c with the store's usage schema
 * (store.c migration 13): an event written through the writer thread lands once (a retried
 * write of the same request id changes nothing, buckets included); the hourly buckets, the
 * histograms, the provider buckets and the daily roll-up sum the events across hours and
 * days, and summed per batch they equal the per-event sums; pruning deletes old events in batches
 * and leaves the buckets; the histogram bins; the price in force and the cost arithmetic (ceil,
 * versions, the cost_per_1k shorthand). */
#include "mgtest.h"
#include "store_fixture.h"
#include "obs/price.h"
#include "obs/usage.h"
#include "obs/usage_rollup.h"
#include "store/store.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64], path[160];

static long long q(const char *sql)
{
    return mgt_db_int(path, sql);
}

static mg_usage_event_t ev(const char *id, int64_t at_ms, const char *status, int64_t in,
                           int64_t out)
{
    mg_usage_event_t e;
    memset(&e, 0, sizeof(e));
    e.request_id = id;
    e.at_ms = at_ms;
    e.endpoint = "chat";
    e.tenant_id = 1;
    e.key_id = 7;
    e.logical_model = "chat";
    e.actual_model = "up-chat";
    e.provider = "p1";
    e.pool = "main";
    e.attempts = 1;
    e.status = status;
    e.http_status = 200;
    e.tokens.input = in;
    e.tokens.output = out;
    e.tokens.cached_read = 3;
    e.latency_ms = 100;
    e.ttft_ms = 10;
    e.cost_micros = in + out;
    return e;
}

#define HOUR 3600000LL
#define DAY (24 * HOUR)
static const int64_t T0 = 1767225600000LL; /* 2026-01-01T00:00:00Z */

static void test_events_and_rollups(void)
{
    mg_store_t *s = NULL;
    char err[256];
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    mg_usage_event_t a = ev("r1", T0 + 10, "succeeded", 10, 5);
    mg_usage_event_t b = ev("r2", T0 + 20, "failed", 1, 0);
    mg_usage_event_t c = ev("r3", T0 + HOUR + 5, "succeeded", 100, 50);
    mg_usage_event_t d = ev("r4", T0 + DAY, "timed_out", 2, 0);
    d.pool = "fallback";
    d.ttft_ms = -1;
    mg_usage_event_t none = ev("r5", T0 + 30, "failed", 0, 0);
    none.provider = none.pool = none.actual_model = NULL;
    CHECK(mg_usage_write(s, &a, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &b, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &c, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &d, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &none, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &a, NULL, NULL) == 0); /* a retried write of r1 */
    mg_store_flush(s);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), 5);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 5);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_hourly"), 4); /* hours 0 (p1, ''), 1, 24 */
    CHECK_EQ_INT(
        q("SELECT requests FROM usage_hourly WHERE hour = 1767225600 AND provider_id = 'p1'"), 2);
    CHECK_EQ_INT(
        q("SELECT errors FROM usage_hourly WHERE hour = 1767225600 AND provider_id = 'p1'"), 1);
    CHECK_EQ_INT(
        q("SELECT input_tokens FROM usage_hourly WHERE hour = 1767225600 AND provider_id = 'p1'"),
        11);
    CHECK_EQ_INT(
        q("SELECT cached_read_tokens FROM usage_hourly WHERE hour = 1767225600 AND provider_id = 'p1'"),
        6);
    CHECK_EQ_INT(
        q("SELECT cache_hits FROM usage_hourly WHERE hour = 1767225600 AND provider_id = 'p1'"), 2);
    CHECK_EQ_INT(q("SELECT SUM(cost_micros) FROM usage_hourly"), 15 + 1 + 150 + 2 + 0);
    CHECK_EQ_INT(q("SELECT SUM(n) FROM usage_hist WHERE kind = 'latency'"), 5);
    CHECK_EQ_INT(q("SELECT SUM(n) FROM usage_hist WHERE kind = 'ttft'"), 4); /* d had none */
    CHECK_EQ_INT(q("SELECT bin FROM usage_hist WHERE kind = 'latency' LIMIT 1"), mg_usage_bin(100));
    /* the ADR's tables: only events with a provider (pool) */
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM provider_usage_logs"), 3);
    CHECK_EQ_INT(
        q("SELECT request_count FROM provider_usage_logs WHERE hour_bucket = '2026-01-01T00:00:00Z'"),
        2);
    CHECK_EQ_INT(
        q("SELECT prompt_tokens FROM provider_usage_logs WHERE hour_bucket = '2026-01-01T00:00:00Z'"),
        11 + 6);
    CHECK_EQ_INT(
        q("SELECT avg_latency_ms FROM provider_usage_logs WHERE hour_bucket = '2026-01-01T00:00:00Z'"),
        100);
    CHECK_EQ_INT(
        q("SELECT total_requests FROM daily_stats WHERE date = '2026-01-01' AND pool = 'main'"), 3);
    CHECK_EQ_INT(
        q("SELECT total_errors FROM daily_stats WHERE date = '2026-01-01' AND pool = 'main'"), 1);
    CHECK_EQ_INT(q("SELECT total_cost_micros FROM daily_stats WHERE date = '2026-01-01'"), 166);
    CHECK_EQ_INT(
        q("SELECT total_requests FROM daily_stats WHERE date = '2026-01-02' AND pool = 'fallback'"),
        1);
    /* pruning: events before the cut go in batches of prune_batch; buckets stay */
    mg_usage_conf_t u = {
        .enabled = true, .retention_days = 1, .prune_batch = 2, .prune_interval_s = 1};
    char cut[24], batch[16];
    mg_usage_prune_params(&u, T0 + DAY + HOUR, cut, batch); /* cut = T0 + 1 h */
    const char *p[2] = {cut, batch};
    CHECK(mg_store_write(s, MG_USAGE_PRUNE_SQL, 2, p) == 0);
    mg_store_flush(s);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), 3); /* r1 and r2 of the old ones */
    CHECK(mg_store_write(s, MG_USAGE_PRUNE_SQL, 2, p) == 0);
    mg_store_flush(s);
    /* r3 (T0 + 1 h + 5), r4, and r5: old, but the newest event (seq), which is kept */
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), 3);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 5);
    /* an event pruned and written again would count twice: the writer never rewrites one
       (the request id's only writer is its call's finish) */
    /* one batch per event: each adds its own */
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof(id), "b%d", i);
        mg_usage_event_t e = ev(id, T0 + 2 * DAY + i, "succeeded", 1, 1);
        CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
        mg_store_flush(s);
        CHECK_EQ_INT(q("SELECT requests FROM usage_hourly WHERE hour = 1767398400"), i + 1);
    }
    mg_store_close(s);
}

static void test_bins(void)
{
    CHECK_EQ_INT(mg_usage_bin(0), 0);
    CHECK_EQ_INT(mg_usage_bin(1), 1);
    CHECK_EQ_INT(mg_usage_bin(2), 2);
    CHECK_EQ_INT(mg_usage_bin(3), 2);
    CHECK_EQ_INT(mg_usage_bin(1000), 10);
    CHECK_EQ_INT(mg_usage_bin(1024), 11);
    CHECK_EQ_INT(mg_usage_bin_upper_ms(10), 1024);
    CHECK(mg_usage_bin(1000) <= 24 && mg_usage_bin(1LL << 40) == 24);
}

static void test_prices(void)
{
    mg_provider_conf_t provs[2] = {{.id = "p1"}, {.id = "short", .cost_per_1k_tokens = 0.002}};
    mg_price_t prices[3] = {
        {.provider = "p1",
         .model = "m",
         .input_micros = 1000000,
         .output_micros = 2000000,
         .cached_input_micros = 100000,
         .cache_write_micros = 1250000,
         .effective_at = 0,
         .version = "v1"},
        {.provider = "p1",
         .model = "m",
         .input_micros = 3000000,
         .output_micros = 3000000,
         .cached_input_micros = 3,
         .cache_write_micros = 3,
         .effective_at = 1000,
         .version = "v2"},
        {.provider = "p1",
         .model = "*",
         .input_micros = 7,
         .output_micros = 7,
         .cached_input_micros = 7,
         .cache_write_micros = 7,
         .effective_at = 0,
         .version = "any"},
    };
    mg_config_t cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.providers = provs;
    cfg.n_providers = 2;
    cfg.prices = prices;
    cfg.n_prices = 3;
    mg_usage_tokens_t t = {.input = 1000, .output = 500, .cached_read = 2000, .cache_write = 10};
    const char *v = NULL;
    /* before v2: v1; 1000 + 1000 + 200 + 12.5 -> ceil 2213 */
    CHECK_EQ_INT(mg_price_cost(&cfg, "p1", "m", &t, 999, &v), 2213);
    CHECK_STR(v, "v1");
    CHECK_EQ_INT(mg_price_cost(&cfg, "p1", "m", &t, 1000, &v),
                 4501); /* 3000 + 1500 + ceil(0.006 + 0.00003) */
    CHECK_STR(v, "v2");
    CHECK_EQ_INT(mg_price_cost(&cfg, "p1", "other", &t, 5000, &v),
                 1); /* 3510 x 7 / 1e6 -> ceil 1 */
    CHECK_STR(v, "any");
    /* the shorthand: 0.002 per 1k tokens = 2 micros a token, every kind alike */
    CHECK_EQ_INT(mg_price_cost(&cfg, "short", "x", &t, 0, &v), (1000 + 500 + 2000 + 10) * 2);
    CHECK_STR(v, "cost_per_1k");
    CHECK_EQ_INT(mg_price_cost(&cfg, "nobody", "x", &t, 0, &v), 0);
    CHECK(v == NULL);
    mg_usage_tokens_t zero = {0};
    CHECK_EQ_INT(mg_price_cost(&cfg, "p1", "m", &zero, 0, NULL), 0);
    /* a huge count stays finite and positive */
    mg_usage_tokens_t huge = {.input = 1LL << 40, .output = 1LL << 40};
    CHECK(mg_price_apply(&prices[0], &huge) > 0);
}

/* ---- the roll-ups summed per batch (obs/usage_rollup.h) ---- */

#define N_EVENTS 120

/* The i-th of a varied set: two tenants, keys and models, a provider or none, every pool,
 * every outcome, with and without a first token, over three days. */
static mg_usage_event_t varied(int i, char *id, size_t idlen)
{
    static const char *const statuses[] = {"succeeded", "failed", "cancelled", "timed_out",
                                           "succeeded"};
    static const char *const pools[] = {"main", "fallback", NULL};
    snprintf(id, idlen, "v%d", i);
    mg_usage_event_t e =
        ev(id, T0 + (int64_t)(i % 7) * 11 * HOUR + i, statuses[i % 5], 10 + i, i % 4);
    e.tenant_id = 1 + i % 2;
    e.project_id = i % 3;
    e.key_id = 5 + i % 2;
    e.logical_model = i % 3 ? "chat" : "embed";
    e.actual_model = i % 4 ? "up-chat" : NULL;
    e.provider = i % 6 ? (i % 2 ? "p1" : "p2") : NULL;
    e.pool = pools[i % 3];
    e.tokens.cached_read = i % 5 ? 0 : i;
    e.tokens.cache_write = i % 3;
    e.tokens.reasoning = i % 2;
    e.output_estimated = i % 8 == 0;
    e.latency_ms = 3 + i * 17;
    e.ttft_ms = i % 4 ? i * 3 : -1;
    e.cost_micros = 1000 + i * 7;
    return e;
}

/* Every roll-up row of the database at p as one text (without the created_at stamps). */
static char *dump_rollups(const char *p)
{
    static const char *const sql[] = {
        "SELECT * FROM usage_hourly ORDER BY 1, 2, 3, 4, 5, 6",
        "SELECT * FROM usage_hist ORDER BY 1, 2, 3, 4, 5, 6, 7, 8",
        "SELECT id, provider_id, model, prompt_tokens, completion_tokens, total_tokens, cost,"
        " request_count, error_count, avg_latency_ms, hour_bucket, cost_micros, cached_read_tokens,"
        " cache_write_tokens, latency_ms_sum FROM provider_usage_logs ORDER BY id",
        "SELECT id, date, pool, total_requests, total_errors, total_tokens, total_cost,"
        " total_cost_micros FROM daily_stats ORDER BY id",
    };
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap);
    sqlite3 *db = NULL;
    if (!out || sqlite3_open_v2(p, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) return out;
    for (size_t t = 0; t < sizeof(sql) / sizeof(sql[0]); t++) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, sql[t], -1, &st, NULL) != SQLITE_OK) continue;
        while (sqlite3_step(st) == SQLITE_ROW) {
            for (int c = 0; c < sqlite3_column_count(st); c++) {
                const char *v = (const char *)sqlite3_column_text(st, c);
                size_t n = strlen(v ? v : "NULL") + 2;
                if (len + n + 1 > cap) {
                    char *bigger = realloc(out, cap *= 2);
                    if (!bigger) break;
                    out = bigger;
                }
                len += (size_t)snprintf(out + len, cap - len, "%s%c", v ? v : "NULL",
                                        c + 1 < sqlite3_column_count(st) ? '|' : '\n');
            }
        }
        sqlite3_finalize(st);
        len += (size_t)snprintf(out + len, cap - len, "--\n");
    }
    sqlite3_close(db);
    return out;
}

/* The same N events, once one per transaction (what the per-event trigger summed), once
 * in one batch (queued while another connection held the write lock): equal roll-ups,
 * and those equal the sums of the raw events. */
static void test_batch_rollups_equal_per_event(void)
{
    char one_path[160], batch_path[160], err[256], id[16];
    snprintf(one_path, sizeof(one_path), "%s/one.db", dir);
    snprintf(batch_path, sizeof(batch_path), "%s/batch.db", dir);
    mg_store_t *one = NULL, *batch = NULL;
    CHECK(mg_store_open(one_path, &one, err, sizeof(err)) == 0);
    CHECK(mg_store_open(batch_path, &batch, err, sizeof(err)) == 0);
    if (!one || !batch) return;
    for (int i = 0; i < N_EVENTS; i++) {
        mg_usage_event_t e = varied(i, id, sizeof(id));
        CHECK(mg_usage_write(one, &e, NULL, NULL) == 0);
        mg_store_flush(one);
    }
    sqlite3 *lock = NULL;
    CHECK(sqlite3_open(batch_path, &lock) == SQLITE_OK);
    CHECK(sqlite3_exec(lock, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK);
    /* a first write the writer takes alone and waits with on the lock: every event queued
       after it is seen busy goes into the next batch, whole */
    CHECK(mg_store_write(batch, "DELETE FROM usage_hourly WHERE 0", 0, NULL) == 0);
    mg_store_stats_t bs;
    for (int i = 0; i < 500; i++) {
        mg_store_stats(batch, &bs);
        if (bs.busy_retries_total > 0) break;
        usleep(10000);
    }
    CHECK(bs.busy_retries_total > 0);
    for (int i = 0; i < N_EVENTS; i++) {
        mg_usage_event_t e = varied(i, id, sizeof(id));
        CHECK(mg_usage_write(batch, &e, NULL, NULL) == 0);
    }
    mg_usage_event_t replay = varied(3, id, sizeof(id)); /* ignored: adds nothing */
    CHECK(mg_usage_write(batch, &replay, NULL, NULL) == 0);
    sqlite3_exec(lock, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(lock);
    mg_store_flush(batch);
    mg_store_stats(batch, &bs);
    CHECK(bs.largest_batch == N_EVENTS + 1); /* all of them and the replay, in one batch */
    mg_store_close(one);
    mg_store_close(batch);
    char *a = dump_rollups(one_path), *b = dump_rollups(batch_path);
    CHECK(a && b && strlen(a) > 1000);
    CHECK(a && b && strcmp(a, b) == 0);
    free(a);
    free(b);
    /* and the batch's buckets are the raw events' sums */
    snprintf(path, sizeof(path), "%s", batch_path);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), N_EVENTS);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), N_EVENTS);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM (SELECT at_ms / 3600000 * 3600 AS h,"
                   " COALESCE(tenant_id, 0) AS t, COALESCE(project_id, 0) AS pr,"
                   " COALESCE(key_id, 0) AS k, COALESCE(provider_id, '') AS pv,"
                   " COALESCE(logical_model, '') AS m, COUNT(*) AS n, SUM(input_tokens) AS i,"
                   " SUM(output_tokens) AS o, SUM(cost_micros) AS c, SUM(latency_ms) AS l,"
                   " SUM(status IN ('failed','timed_out')) AS e, SUM(ttft_ms IS NOT NULL) AS tc"
                   " FROM usage_events GROUP BY 1, 2, 3, 4, 5, 6) x JOIN usage_hourly u"
                   " ON u.hour = x.h AND u.tenant_id = x.t AND u.project_id = x.pr"
                   " AND u.key_id = x.k AND u.provider_id = x.pv AND u.model = x.m"
                   " WHERE u.requests = x.n AND u.input_tokens = x.i AND u.output_tokens = x.o"
                   " AND u.cost_micros = x.c AND u.latency_ms_sum = x.l AND u.errors = x.e"
                   " AND u.ttft_count = x.tc"),
                 q("SELECT COUNT(*) FROM usage_hourly"));
    CHECK_EQ_INT(q("SELECT SUM(request_count) FROM provider_usage_logs"),
                 q("SELECT COUNT(*) FROM usage_events WHERE provider_id IS NOT NULL"));
    CHECK_EQ_INT(q("SELECT SUM(total_cost_micros) FROM daily_stats"),
                 q("SELECT SUM(cost_micros) FROM usage_events WHERE pool IS NOT NULL"));
    CHECK_EQ_INT(q("SELECT SUM(n) FROM usage_hist WHERE kind = 'ttft'"),
                 q("SELECT COUNT(*) FROM usage_events WHERE ttft_ms IS NOT NULL"));
    snprintf(path, sizeof(path), "%s/m.db", dir);
}

/* Run one statement on the database behind the store's back (a crash's leftovers). */
static void raw_exec(const char *db_path, const char *sql)
{
    CHECK(mgt_db_exec(db_path, sql) == 0);
}

/* The roll-ups are written with the watermark; events committed after the last flush (a
 * kill -9 before it: here written behind the store's back) are summed at the next start by
 * mg_store_use_agg, once; the pruner never deletes the newest event (seq keeps growing). */
static void test_watermark_recovery(void)
{
    char p2[160], err[256];
    snprintf(p2, sizeof(p2), "%s/mark.db", dir);
    char *saved = strdup(path);
    snprintf(path, sizeof(path), "%s", p2);
    mg_store_t *s = NULL;
    CHECK(mg_store_open(p2, &s, err, sizeof(err)) == 0);
    if (!s) goto out;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    for (int i = 0; i < 4; i++) {
        char id[16];
        snprintf(id, sizeof(id), "w%d", i);
        mg_usage_event_t e = ev(id, T0 + i, "succeeded", 10, 2);
        CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
    }
    mg_store_flush(s); /* the rows, then the pending sums */
    CHECK_EQ_INT(q("SELECT seq FROM usage_rollup_mark"), 4);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 4);
    mg_store_close(s);
    /* committed events whose sums never were written */
    raw_exec(p2, "INSERT INTO usage_events(request_id, at_ms, endpoint, status, provider_id,"
                 " actual_model, pool, input_tokens, output_tokens, cost_micros, latency_ms,"
                 " latency_bin) VALUES ('x1', 1767225600000, 'chat', 'succeeded', 'p1', 'up-chat',"
                 " 'main', 7, 1, 8, 5, 3), ('x2', 1767225600001, 'chat', 'failed', 'p1',"
                 " 'up-chat', 'main', 1, 0, 1, 5, 3)");
    s = NULL;
    CHECK(mg_store_open(p2, &s, err, sizeof(err)) == 0);
    if (!s) goto out;
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 4); /* not yet */
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    CHECK_EQ_INT(q("SELECT seq FROM usage_rollup_mark"), 6);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 6);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly"), 4 * 10 + 7 + 1);
    CHECK_EQ_INT(q("SELECT SUM(errors) FROM usage_hourly"), 1);
    CHECK_EQ_INT(q("SELECT SUM(n) FROM usage_hist WHERE kind = 'latency'"), 6);
    CHECK_EQ_INT(q("SELECT SUM(request_count) FROM provider_usage_logs"), 6);
    CHECK_EQ_INT(q("SELECT SUM(total_requests) FROM daily_stats"), 6);
    mg_store_close(s);
    /* a second start sums nothing again */
    s = NULL;
    CHECK(mg_store_open(p2, &s, err, sizeof(err)) == 0);
    if (!s) goto out;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), 6);
    /* pruning everything old keeps the newest event */
    const char *pp[2] = {"9999999999999", "100"};
    CHECK(mg_store_write(s, MG_USAGE_PRUNE_SQL, 2, pp) == 0);
    mg_store_flush(s);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), 1);
    CHECK_EQ_INT(q("SELECT seq FROM usage_events"), 6);
    mg_store_close(s);
out:
    snprintf(path, sizeof(path), "%s", saved);
    free(saved);
}

static void on_done(void *ud, int rc)
{
    *(int *)ud = rc;
}

/* Migration 20's table: the status CHECK still keeps an unknown status out (written with OR:
 * no ephemeral index per INSERT), the typed parameters land as integers, NULLs as NULL, and
 * the INSERT builds no ephemeral table. */
static void test_event_row(void)
{
    char p2[160], err[256];
    snprintf(p2, sizeof(p2), "%s/row.db", dir);
    char *saved = strdup(path);
    snprintf(path, sizeof(path), "%s", p2);
    mg_store_t *s = NULL;
    CHECK(mg_store_open(p2, &s, err, sizeof(err)) == 0);
    if (!s) goto out;
    int rc_bad = 1, rc_ok = 1;
    mg_usage_event_t bad = ev("bad", T0, "bogus", 1, 1), ok = ev("ok", T0 + 1, "cancelled", 3, 4);
    ok.ttft_ms = -1;
    CHECK(mg_usage_write(s, &bad, on_done, &rc_bad) == 0);
    CHECK(mg_usage_write(s, &ok, on_done, &rc_ok) == 0);
    mg_store_flush(s);
    mg_store_close(s);       /* delivers the callbacks */
    CHECK_EQ_INT(rc_bad, 0); /* INSERT OR IGNORE: the CHECK drops the row, as before */
    CHECK_EQ_INT(rc_ok, 0);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), 1);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events WHERE request_id = 'bad'"), 0);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events WHERE typeof(at_ms) = 'integer' AND"
                   " typeof(input_tokens) = 'integer' AND typeof(tenant_id) = 'integer' AND"
                   " project_id IS NULL AND ttft_ms IS NULL AND ttft_bin IS NULL AND"
                   " output_tokens = 4 AND cancelled = 0"),
                 1);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM sqlite_schema WHERE name = 'idx_usage_events_at'"), 0);
    {
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;
        int ephemeral = -1;
        if (sqlite3_open(p2, &db) == SQLITE_OK &&
            sqlite3_prepare_v2(db,
                               "EXPLAIN INSERT INTO usage_events(request_id, at_ms, endpoint,"
                               " status) VALUES ('e', 1, 'chat', 'failed')",
                               -1, &st, NULL) == SQLITE_OK) {
            ephemeral = 0;
            while (sqlite3_step(st) == SQLITE_ROW)
                if (strcmp((const char *)sqlite3_column_text(st, 1), "OpenEphemeral") == 0)
                    ephemeral++;
        }
        sqlite3_finalize(st);
        sqlite3_close(db);
        CHECK_EQ_INT(ephemeral, 0);
    }
out:
    snprintf(path, sizeof(path), "%s", saved);
    free(saved);
}

int main(void)
{
    if (mgt_tmpdir(dir, sizeof(dir), "usage") != 0) return 1;
    snprintf(path, sizeof(path), "%s/m.db", dir);
    MG_RUN(test_events_and_rollups);
    MG_RUN(test_batch_rollups_equal_per_event);
    MG_RUN(test_bins);
    MG_RUN(test_prices);
    MG_RUN(test_watermark_recovery);
    MG_RUN(test_event_row);
    if (mgt_rmtree(dir) != 0) return 1;
    return mg_test_summary();
}
