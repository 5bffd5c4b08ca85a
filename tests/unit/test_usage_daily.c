/* Unit tests for the daily and per-tenant roll-ups (store migration 24: usage_daily,
 * usage_hist_daily, usage_tenant_hourly; obs/usage_rollup.h writes them in the hourly ones'
 * flush): over events spread across days and hours, with replays, each daily row is the sum
 * of its day's hourly rows and of its day's raw events, histograms included, and each
 * per-tenant row the sum of its hour's rows and events of the tenant; after a kill -9
 * between two flushes (events committed past the watermark, more in the journal undrained)
 * the next start sums them into all of them, once, and a second start or a replayed
 * journal adds nothing; a database of before migration 24 has the new tables back-filled
 * from the hourly ones. */
#include "mgtest.h"
#include "store_fixture.h"
#include "obs/usage.h"
#include "obs/usage_rollup.h"
#include "store/store.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

static char dir[64], path[160], jpath[200];

static long long q(const char *sql)
{
    return mgt_db_int(path, sql);
}

static void raw_exec(const char *sql)
{
    CHECK(mgt_db_exec(path, sql) == 0);
}

/* journal header offsets (store/journal.c): tail 32 */
static uint64_t journal_tail(void)
{
    uint64_t v = 0;
    int fd = open(jpath, O_RDONLY);
    if (fd >= 0 && pread(fd, &v, 8, 32) != 8) v = 0;
    if (fd >= 0) close(fd);
    return v;
}

static void set_journal_tail(uint64_t v)
{
    int fd = open(jpath, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, &v, 8, 32) == 8);
    if (fd >= 0) close(fd);
}

#define HOUR 3600000LL
#define DAY (24 * HOUR)
static const int64_t T0 = 1767225600000LL; /* 2026-01-01T00:00:00Z */

/* The i-th of a varied set over four days, many of them in the hours around midnight: two
 * tenants and none, keys, projects, models, a provider or none, every outcome, a first token
 * or none, cache hits, estimated usage. */
static mg_usage_event_t varied(int i, char *id, size_t idlen)
{
    static const char *const statuses[] = {"succeeded", "failed",    "cancelled",
                                           "timed_out", "succeeded", "succeeded"};
    snprintf(id, idlen, "d%d", i);
    mg_usage_event_t e;
    memset(&e, 0, sizeof(e));
    e.request_id = id;
    /* days 0..3; the hours 22, 23, 0 and 1 around each midnight, and some midday */
    int64_t day = i % 4, hour = (int64_t[]){-2, -1, 0, 1, 12}[i % 5];
    e.at_ms = T0 + day * DAY + hour * HOUR + (int64_t)(i * 7919 % 3600000);
    e.endpoint = "chat";
    e.tenant_id = i % 7 == 0 ? 0 : 1 + i % 2;
    e.project_id = i % 3;
    e.key_id = i % 11 == 0 ? 0 : 5 + i % 3;
    e.logical_model = i % 3 ? "chat" : "embed";
    e.actual_model = i % 4 ? "up-chat" : NULL;
    e.provider = i % 6 ? (i % 2 ? "p1" : "p2") : NULL;
    e.pool = i % 2 ? "main" : "fallback";
    e.attempts = 1;
    e.status = statuses[i % 6];
    e.http_status = 200;
    e.tokens.input = 10 + i;
    e.tokens.output = i % 4;
    e.tokens.cached_read = i % 5 ? 0 : i;
    e.tokens.cache_write = i % 3;
    e.tokens.reasoning = i % 2;
    e.output_estimated = i % 8 == 0;
    e.latency_ms = 3 + i * 17;
    e.ttft_ms = i % 4 ? i * 3 : -1;
    e.cost_micros = 1000 + i * 7;
    return e;
}

/* The key of a roll-up row from the raw events, per `unit` seconds */
#define EV_KEY(unit)                                                                               \
    "at_ms / (" unit " * 1000) * " unit ", COALESCE(tenant_id, 0), COALESCE(project_id, 0),"       \
    " COALESCE(key_id, 0), COALESCE(provider_id, ''), COALESCE(logical_model, '')"
#define EV_SUMS                                                                                    \
    " COUNT(*), SUM(status = 'failed' OR status = 'timed_out'), SUM(status = 'cancelled'),"        \
    " SUM(input_tokens), SUM(output_tokens), SUM(cached_read_tokens), SUM(cache_write_tokens),"    \
    " SUM(reasoning_tokens), SUM(cached_read_tokens > 0),"                                         \
    " SUM(status = 'succeeded' AND (input_estimated OR output_estimated)), SUM(cost_micros),"      \
    " SUM(latency_ms), SUM(COALESCE(ttft_ms, 0)), SUM(ttft_ms IS NOT NULL)"
/* usage_daily as the raw events make it, and as the hourly rows summed per day make it */
#define DAILY_FROM_EVENTS                                                                          \
    "SELECT " EV_KEY("86400") "," EV_SUMS " FROM usage_events GROUP BY 1, 2, 3, 4, 5, 6"
#define DAILY_FROM_HOURLY                                                                          \
    "SELECT hour - hour % 86400, tenant_id, project_id, key_id, provider_id, model,"               \
    " SUM(requests), SUM(errors), SUM(cancelled), SUM(input_tokens), SUM(output_tokens),"          \
    " SUM(cached_read_tokens), SUM(cache_write_tokens), SUM(reasoning_tokens), SUM(cache_hits),"   \
    " SUM(missing_usage), SUM(cost_micros), SUM(latency_ms_sum), SUM(ttft_ms_sum),"                \
    " SUM(ttft_count) FROM usage_hourly GROUP BY 1, 2, 3, 4, 5, 6"
#define HIST_DAILY_FROM_EVENTS                                                                     \
    "SELECT " EV_KEY(                                                                              \
        "86400") ", 'latency', latency_bin, COUNT(*) FROM usage_events"                            \
                 " GROUP BY 1, 2, 3, 4, 5, 6, 8 UNION ALL SELECT " EV_KEY(                         \
                     "86400") ", 'ttft', ttft_bin,"                                                \
                              " COUNT(*) FROM usage_events WHERE ttft_bin IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 8"
#define HIST_DAILY_FROM_HOURLY                                                                     \
    "SELECT hour - hour % 86400, tenant_id, project_id, key_id, provider_id, model, kind, bin,"    \
    " SUM(n) FROM usage_hist GROUP BY 1, 2, 3, 4, 5, 6, 7, 8"

#define TOTALS_FROM_EVENTS                                                                         \
    "SELECT at_ms / 3600000 * 3600, COALESCE(tenant_id, 0)," EV_SUMS                               \
    " FROM usage_events GROUP BY 1, 2"
#define TOTALS_FROM_HOURLY                                                                         \
    "SELECT hour, tenant_id, SUM(requests), SUM(errors), SUM(cancelled), SUM(input_tokens),"       \
    " SUM(output_tokens), SUM(cached_read_tokens), SUM(cache_write_tokens),"                       \
    " SUM(reasoning_tokens), SUM(cache_hits), SUM(missing_usage), SUM(cost_micros),"               \
    " SUM(latency_ms_sum), SUM(ttft_ms_sum), SUM(ttft_count) FROM usage_hourly GROUP BY 1, 2"

/* Rows in one of a and b and not in the other (0: the same set of rows) */
static long long differ(const char *a, const char *b)
{
    char sql[4096];
    snprintf(sql, sizeof(sql),
             "SELECT (SELECT COUNT(*) FROM (SELECT * FROM (%s) EXCEPT SELECT * FROM (%s)))"
             " + (SELECT COUNT(*) FROM (SELECT * FROM (%s) EXCEPT SELECT * FROM (%s)))",
             a, b, b, a);
    return q(sql);
}

/* Every daily row equals its day's events and its day's hourly rows, every per-tenant row
 * its hour's of the tenant, and none is missing. */
static void check_daily_is_exact(const char *what)
{
    fprintf(stderr, "  checking %s\n", what);
    CHECK(q("SELECT COUNT(*) FROM usage_daily") > 4);
    CHECK(q("SELECT COUNT(*) FROM usage_hist_daily") > 4);
    CHECK_EQ_INT(differ("SELECT * FROM usage_daily", DAILY_FROM_EVENTS), 0);
    CHECK_EQ_INT(differ("SELECT * FROM usage_daily", DAILY_FROM_HOURLY), 0);
    CHECK_EQ_INT(differ("SELECT * FROM usage_hist_daily", HIST_DAILY_FROM_EVENTS), 0);
    CHECK_EQ_INT(differ("SELECT * FROM usage_hist_daily", HIST_DAILY_FROM_HOURLY), 0);
    CHECK(q("SELECT COUNT(*) FROM usage_tenant_hourly") > 4);
    CHECK_EQ_INT(differ("SELECT * FROM usage_tenant_hourly", TOTALS_FROM_EVENTS), 0);
    CHECK_EQ_INT(differ("SELECT * FROM usage_tenant_hourly", TOTALS_FROM_HOURLY), 0);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_daily"),
                 q("SELECT COUNT(*) FROM usage_events"));
}

#define N_EVENTS 240

/* Written through the writer in a few batches, one replayed: the daily tables are exact and
 * span the four days. */
static void test_daily_equals_hourly_and_events(void)
{
    char err[256], id[16];
    mg_store_t *s = NULL;
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    for (int i = 0; i < N_EVENTS; i++) {
        mg_usage_event_t e = varied(i, id, sizeof(id));
        CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
        if (i % 50 == 49) mg_store_flush(s);
    }
    mg_usage_event_t replay = varied(17, id, sizeof(id)); /* ignored: adds nothing */
    CHECK(mg_usage_write(s, &replay, NULL, NULL) == 0);
    mg_store_flush(s);
    mg_store_close(s);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), N_EVENTS);
    CHECK_EQ_INT(q("SELECT COUNT(DISTINCT day) FROM usage_daily"), 5); /* the 22:00 of day -1 */
    CHECK_EQ_INT(q("SELECT MIN(day) FROM usage_daily"), T0 / 1000 - 86400);
    check_daily_is_exact("after the writer's flushes");
}

#define ROUND 60

/* The child: events journaled on the loop thread, drained (committed) by the writer, and a
 * kill -9 before the roll-ups' next flush (a second after the last), with a few more events
 * still in the journal. A round whose flush came first is followed by another. */
static void child_dies_between_flushes(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_store_t *s = NULL;
    char err[256], id[16];
    sqlite3 *db = NULL;
    if (mg_store_open(path, &s, err, sizeof(err)) != 0 || mg_store_attach(s, &loop) != 0 ||
        mg_store_use_agg(s, &mg_usage_rollup) != 0 || mg_usage_journal_open(s, 262144) != 0 ||
        sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
        _exit(2);
    int n = N_EVENTS; /* after the first test's events */
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < ROUND; i++, n++) {
            mg_usage_event_t e = varied(n, id, sizeof(id));
            if (mg_usage_write(s, &e, NULL, NULL) != 0) _exit(3);
        }
        for (int w = 0; w < 400 && mgt_sql_int(db, "SELECT COUNT(*) FROM usage_events") < n; w++)
            usleep(5000);
        if (mgt_sql_int(db, "SELECT seq FROM usage_rollup_mark") <
            mgt_sql_int(db, "SELECT MAX(seq) FROM usage_events")) {
            for (int i = 0; i < 7; i++, n++) {
                mg_usage_event_t e = varied(n, id, sizeof(id));
                if (mg_usage_write(s, &e, NULL, NULL) != 0) _exit(3);
            }
            raise(SIGKILL);
        }
    }
    _exit(5);
}

static void test_daily_after_kill(void)
{
    long long before = q("SELECT COUNT(*) FROM usage_events");
    pid_t pid = fork();
    if (pid == 0) child_dies_between_flushes();
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (WIFEXITED(status)) fprintf(stderr, "child exited %d\n", WEXITSTATUS(status));
    /* the kill's leftovers: committed events the roll-ups do not have yet */
    long long committed = q("SELECT COUNT(*) FROM usage_events");
    CHECK(committed >= before + ROUND);
    CHECK(q("SELECT seq FROM usage_rollup_mark") < q("SELECT MAX(seq) FROM usage_events"));
    CHECK(q("SELECT SUM(requests) FROM usage_daily") < committed);
    uint64_t tail = journal_tail();
    char err[256];
    mg_store_t *s = NULL;
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    CHECK(mg_usage_journal_open(s, 262144) == 0);
    mg_store_close(s);
    long long all = q("SELECT COUNT(*) FROM usage_events");
    /* every event the child wrote, once: its rounds and the journal's last seven */
    CHECK(all > before + ROUND && (all - before - 7) % ROUND == 0);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_daily"), all);
    check_daily_is_exact("after the restart that followed the kill");
    /* a second start, and the journal's drained records read again: nothing more */
    set_journal_tail(tail);
    s = NULL;
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    CHECK(mg_usage_journal_open(s, 262144) == 0);
    mg_store_close(s);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), all);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_daily"), all);
    check_daily_is_exact("after a second start and a replayed journal");
}

/* A database of before migration 24 (its daily tables and the versions from 24 on taken away;
 * the later migrations make nothing twice): the next open makes them again, from the hourly
 * rows. */
static void test_migration_backfills(void)
{
    raw_exec("DROP TABLE usage_daily; DROP TABLE usage_hist_daily; DROP TABLE usage_tenant_hourly;"
             " DELETE FROM schema_migrations WHERE version >= 24");
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM sqlite_master WHERE name = 'usage_daily'"), 0);
    char err[256];
    mg_store_t *s = NULL;
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    mg_store_close(s);
    CHECK(q("SELECT MAX(version) FROM schema_migrations") >= 24);
    check_daily_is_exact("after migration 24's back-fill");
}

int main(void)
{
    if (mgt_tmpdir(dir, sizeof(dir), "daily") != 0) return 1;
    snprintf(path, sizeof(path), "%s/m.db", dir);
    snprintf(jpath, sizeof(jpath), "%s.usage-journal", path);
    MG_RUN(test_daily_equals_hourly_and_events);
    MG_RUN(test_daily_after_kill);
    MG_RUN(test_migration_backfills);
    if (mgt_rmtree(dir) != 0) return 1;
    return mg_test_summary();
}
