/* rollup_bench: the writer's once-a-second roll-up flush (obs/usage_rollup.h), timed alone.
 *
 * A fresh migrated database; each round inserts `buckets` new usage events, one per
 * (tenant, project, key, provider, model) combination, all in the same hour (a second of
 * traffic touching that many buckets), sums them as the writer does (the `recover` path:
 * the events past the watermark) and then times the flush: BEGIN IMMEDIATE, the roll-up's
 * UPSERTs and the watermark, COMMIT (synchronous=normal, WAL, as the store). The first round
 * inserts the buckets' rows, the later ones update them, as in steady traffic. Prints the
 * p50 / p90 / max of the flush in microseconds over the rounds.
 *
 * usage: rollup_bench [buckets [rounds]]   (300 and 200: bench/dashboard_1m.mjs's combos) */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "obs/usage_rollup.h"
#include "store/schema.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int exec(sqlite3 *db, const char *sql)
{
    char err[256];
    if (mg_sqlite_exec(db, sql, err, sizeof(err)) == 0) return 0;
    fprintf(stderr, "%s: %s\n", sql, err);
    return -1;
}

int main(int argc, char **argv)
{
    int buckets = argc > 1 ? atoi(argv[1]) : 300, rounds = argc > 2 ? atoi(argv[2]) : 200;
    if (buckets < 1 || rounds < 1) return 2;
    char dir[] = "/tmp/rollup-bench-XXXXXX", path[64], err[256], sql[1024];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof(path), "%s/b.db", dir);
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK || exec(db, "PRAGMA journal_mode=WAL") != 0 ||
        exec(db, "PRAGMA synchronous=NORMAL") != 0 || mg_schema_migrate(db, err, sizeof(err)) < 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    void *st = mg_usage_rollup.create();
    double *us = calloc((size_t)rounds, sizeof(double));
    if (!st || !us) return 1;
    int64_t hour_ms = (int64_t)time(NULL) / 3600 * 3600000;
    for (int r = 0; r < rounds; r++) {
        snprintf(sql, sizeof(sql),
                 "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < %d)"
                 " INSERT INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id,"
                 " key_id, logical_model, actual_model, provider_id, pool, attempts, status,"
                 " input_tokens, output_tokens, latency_ms, ttft_ms, cost_micros, latency_bin,"
                 " ttft_bin) SELECT printf('r%d-%%d', i), %lld + i, 'chat', 1 + i %% 2,"
                 " 100 + i %% 5, 1 + i, 'model-' || (i %% 4), 'up', 'prov-' || (i %% 3),"
                 " 'main', 1, 'succeeded', 100, 50, 200, 50, 10, 8, 6 FROM n",
                 buckets - 1, r, (long long)hour_ms);
        if (exec(db, sql) != 0 || mg_usage_rollup.recover(st, db) != 0) return 1;
        double t0 = now_us();
        if (exec(db, "BEGIN IMMEDIATE") != 0 || mg_usage_rollup.flush(st, db) != 0 ||
            exec(db, "COMMIT") != 0)
            return 1;
        us[r] = now_us() - t0;
        mg_usage_rollup.flushed(st);
    }
    qsort(us, (size_t)rounds, sizeof(double), cmp);
    printf("roll-up flush, %d buckets, %d rounds: p50 %.0f us, p90 %.0f us, max %.0f us"
           " (%.2f us per bucket at p50)\n",
           buckets, rounds, us[rounds / 2], us[rounds * 9 / 10], us[rounds - 1],
           us[rounds / 2] / buckets);
    mg_usage_rollup.destroy(st);
    sqlite3_close(db);
    free(us);
    snprintf(sql, sizeof(sql), "rm -rf %s", dir);
    return system(sql) == 0 ? 0 : 1;
}
