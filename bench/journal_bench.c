/* journal_bench: the store writer's cost per usage event, from the journal to its row
 * (store.h's mg_store_use_journal, obs/usage.h): `batch` events appended on the loop thread,
 * then one drain (mg_store_flush: the writer drains the ring into usage_events in one
 * transaction, sums the roll-ups and writes them), timed; `rounds` times on a fresh database
 * in a temp directory, the table growing as in a real run. Prints the writer's CPU per event
 * (the process's CPU time over the flush: the calling thread only waits) at the median round
 * and the best.
 *
 * A drain of ~50 events is what ~1,000 req/s gives in its 50 ms, ~2,500 what 50 busy
 * connections give; bench/README.md has the figures.
 *
 * usage: journal_bench [batch [rounds]]   (defaults 500, 40) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "obs/usage.h"
#include "obs/usage_rollup.h"
#include "store/store.h"

/* CPU of every thread: during the flush only the writer works (the caller waits) */
static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* An event as a plain proxied request writes it; ids grow with time as the gateway's do. */
static mg_usage_event_t event(char *id, size_t idlen, long n)
{
    snprintf(id, idlen, "%011lx%013lx", 0x19000000000L + n, (n * 2654435761L) & 0xfffffffffffffL);
    mg_usage_event_t e;
    memset(&e, 0, sizeof(e));
    e.request_id = id;
    e.at_ms = 1767225600000LL + n;
    e.endpoint = "chat";
    e.logical_model = "chat";
    e.actual_model = "up-chat";
    e.provider = "mock";
    e.pool = "main";
    e.attempts = 1;
    e.status = "succeeded";
    e.http_status = 200;
    e.tokens.input = 12;
    e.tokens.output = 9;
    e.latency_ms = 1;
    e.ttft_ms = -1;
    return e;
}

int main(int argc, char **argv)
{
    int batch = argc > 1 ? atoi(argv[1]) : 500, rounds = argc > 2 ? atoi(argv[2]) : 40;
    if (batch <= 0 || rounds <= 0) return 2;
    char dir[] = "/tmp/journal_bench.XXXXXX", path[256], err[256];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof(path), "%s/b.db", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_store_t *s = NULL;
    if (mg_store_open(path, &s, err, sizeof(err)) != 0 || mg_store_attach(s, &loop) != 0 ||
        mg_store_use_agg(s, &mg_usage_rollup) != 0 || mg_usage_journal_open(s, 64u << 20) != 0) {
        fprintf(stderr, "journal_bench: cannot open the store: %s\n", err);
        return 1;
    }
    double *per = calloc((size_t)rounds, sizeof(double));
    long n = 0;
    for (int r = 0; per && r < rounds; r++) {
        for (int i = 0; i < batch; i++) {
            char id[40];
            mg_usage_event_t e = event(id, sizeof(id), n++);
            if (mg_usage_write(s, &e, NULL, NULL) != 0) return 1;
        }
        double t0 = cpu_us();
        mg_store_flush(s);
        per[r] = (cpu_us() - t0) / batch;
    }
    mg_store_stats_t st;
    mg_store_stats(s, &st);
    mg_store_detach(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    mg_store_close(s);
    uv_loop_close(&loop);
    if (!per) return 1;
    qsort(per, (size_t)rounds, sizeof(double), cmp_double);
    printf("batch %d, %d rounds: writer %.2f us per event (median), %.2f (best); %llu rows, "
           "%llu journaled\n",
           batch, rounds, per[rounds / 2], per[0], (unsigned long long)st.writes_total,
           (unsigned long long)st.journaled_total);
    free(per);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}
