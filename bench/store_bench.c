/* store_bench: the round trip of a durable write, from mg_store_write_cb on the loop thread
 * to its commit callback there, what an answer held for its spend waits (store.h, hold.h).
 *
 * Closed loop with `depth` writes outstanding (1: one at a time, the unloaded round trip;
 * 32: as many answers waiting at once as 32 busy connections hold), each write the spend
 * upsert a metered request makes, on a fresh database in a temp directory. Prints p50 /
 * p99 / max of the round trip in microseconds, writes per second, writes per commit and the
 * WAL's size at the end (checkpoints keep it bounded).
 *
 * usage: store_bench [writes [depth [full]]]   (full: synchronous=full) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "store/store.h"

#define SPEND_UPSERT                                                                               \
    "INSERT INTO spend(scope, id, period, micros) VALUES (?4, ?5, ?2, ?1), (?4, ?5, ?3, ?1)"       \
    " ON CONFLICT(scope, id, period) DO UPDATE SET micros = micros + excluded.micros"

typedef struct {
    mg_store_t *s;
    uv_loop_t *loop;
    int total, sent, done;
    uint64_t *start_ns; /* per write */
    double *lat_us;
} bench_t;

typedef struct {
    bench_t *b;
    int i;
} arg_t;

static void submit(bench_t *b);

static void on_commit(void *ud, int rc)
{
    arg_t *a = ud;
    bench_t *b = a->b;
    if (rc != 0) fprintf(stderr, "write %d failed\n", a->i);
    b->lat_us[b->done++] = (double)(uv_hrtime() - b->start_ns[a->i]) / 1000.0;
    free(a);
    if (b->sent < b->total) submit(b);
    if (b->done == b->total) uv_stop(b->loop);
}

static void submit(bench_t *b)
{
    arg_t *a = malloc(sizeof(*a));
    a->b = b;
    a->i = b->sent++;
    char id[16];
    snprintf(id, sizeof(id), "%d", a->i % 50);
    const char *p[5] = {"2000", "d:2026-01-01", "m:2026-01", "key", id};
    b->start_ns[a->i] = uv_hrtime();
    if (mg_store_write_cb(b->s, SPEND_UPSERT, 5, p, on_commit, a) != 0) {
        fprintf(stderr, "cannot queue\n");
        exit(1);
    }
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void keep_alive(uv_timer_t *t)
{
    (void)t;
}

int main(int argc, char **argv)
{
    int total = argc > 1 ? atoi(argv[1]) : 20000;
    int depth = argc > 2 ? atoi(argv[2]) : 1;
    int full = argc > 3 && strcmp(argv[3], "full") == 0;
    char dir[] = "/tmp/mg-store-bench-XXXXXX", path[128], err[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof(path), "%s/bench.db", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_store_opts_t o = {.synchronous_full = full};
    bench_t b = {.loop = &loop, .total = total};
    if (mg_store_open_with(path, &o, &b.s, err, sizeof(err)) != 0 ||
        mg_store_attach(b.s, &loop) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    b.start_ns = calloc((size_t)total, sizeof(uint64_t));
    b.lat_us = calloc((size_t)total, sizeof(double));
    uv_timer_t t; /* the store's async handle does not keep the loop alive */
    uv_timer_init(&loop, &t);
    uv_timer_start(&t, keep_alive, 1000, 1000);
    uint64_t t0 = uv_hrtime();
    for (int i = 0; i < depth && b.sent < total; i++) submit(&b);
    uv_run(&loop, UV_RUN_DEFAULT);
    double secs = (double)(uv_hrtime() - t0) / 1e9;
    mg_store_stats_t st;
    mg_store_stats(b.s, &st);
    qsort(b.lat_us, (size_t)total, sizeof(double), cmp);
    char wal[160];
    struct stat ws;
    snprintf(wal, sizeof(wal), "%s-wal", path);
    long long wal_bytes = stat(wal, &ws) == 0 ? (long long)ws.st_size : -1;
    printf("{\"writes\":%d,\"depth\":%d,\"synchronous\":\"%s\",\"p50_us\":%.1f,\"p99_us\":%.1f,"
           "\"max_us\":%.1f,\"writes_per_s\":%.0f,\"writes_per_commit\":%.2f,\"wal_bytes\":%lld}\n",
           total, depth, full ? "full" : "normal", b.lat_us[total / 2], b.lat_us[total * 99 / 100],
           b.lat_us[total - 1], total / secs,
           st.batches_total ? (double)st.writes_total / (double)st.batches_total : 0.0, wal_bytes);
    uv_timer_stop(&t);
    uv_close((uv_handle_t *)&t, NULL);
    mg_store_close(b.s);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) return 1;
    free(b.start_ns);
    free(b.lat_us);
    return 0;
}
