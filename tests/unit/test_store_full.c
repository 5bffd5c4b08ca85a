/* Unit tests for core/store/store.c with the disk full (issue 23): the store lives on a small
 * tmpfs mounted for the test, a filler file takes its room. A write whose request waits for
 * its commit (a callback) is not held by the full disk: its callback comes at once, rc 0,
 * whether it was in the batch that found the disk full or queued afterwards; a write that
 * may not wait (mg_store_write_rows_nowait, a prepaid reservation) fails at once,
 * MG_STORE_EFULL, and is never written; once the filler is gone every held write lands and
 * the database passes integrity_check. Needs root (mount); skipped otherwise. */
#include "mgtest.h"
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

static char dir[64];

typedef struct {
    int calls;
    int rcs[64];
    int64_t rows[64];
} seen_t;

typedef struct {
    seen_t *seen;
    int i;
} arg_t;

static void on_done(void *ud, int rc)
{
    arg_t *a = ud;
    a->seen->rcs[a->i] = rc;
    a->seen->calls++;
}

static void on_rows(void *ud, int rc, int64_t rows)
{
    arg_t *a = ud;
    a->seen->rcs[a->i] = rc;
    a->seen->rows[a->i] = rows;
    a->seen->calls++;
}

static uint64_t now_ms(void)
{
    return uv_hrtime() / 1000000;
}

/* Run the loop until *count reaches target or ms passed (the store's async handle does not
 * keep a loop alive, a timer does). Returns *count. */
static void on_tick(uv_timer_t *t)
{
    int *const *p = t->data;
    if (*p[0] >= *p[1]) uv_stop(t->loop);
}

static int run_until(uv_loop_t *loop, int *count, int target, int ms)
{
    uv_timer_t tick;
    int *args[2] = {count, &target};
    uv_timer_init(loop, &tick);
    tick.data = args;
    uv_timer_start(&tick, on_tick, 1, 1);
    uint64_t end = now_ms() + (uint64_t)ms;
    while (*count < target && now_ms() < end) uv_run(loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *count;
}

static int wait_full(mg_store_t *s, int want, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    while (mg_store_disk_full(s) != want && now_ms() < end) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    return mg_store_disk_full(s);
}

/* Fill the file system with a filler file (ENOSPC ends it). */
static void fill(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return;
    static char block[64 * 1024];
    memset(block, 1, sizeof(block));
    for (int i = 0; i < 4096; i++)
        if (write(fd, block, sizeof(block)) < (ssize_t)sizeof(block)) break;
    close(fd);
}

static const char *query1(const char *path, const char *sql)
{
    static char out[256];
    snprintf(out, sizeof(out), "(none)");
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        snprintf(out, sizeof(out), "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

#define INSERT "INSERT INTO system_config(key, value) VALUES (?1, ?2)"

static void test_waiting_writes_go_on_while_full(void)
{
    char path[128], filler[128], err[256];
    snprintf(path, sizeof(path), "%s/full.db", dir);
    snprintf(filler, sizeof(filler), "%s/filler", dir);
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    CHECK_EQ_INT(mg_store_attach(s, &loop), 0);
    seen_t seen = {0};
    static arg_t args[64];
    for (int i = 0; i < 64; i++) args[i] = (arg_t){&seen, i};
    static char big[48 * 1024];
    memset(big, 'x', sizeof(big) - 1);

    /* a first write lands normally */
    const char *p0[2] = {"before", "1"};
    CHECK_EQ_INT(mg_store_write_cb(s, INSERT, 2, p0, on_done, &args[0]), 0);
    CHECK_EQ_INT(run_until(&loop, &seen.calls, 1, 5000), 1);
    CHECK_EQ_INT(seen.rcs[0], 0);

    /* the disk fills; one batch (corked) holds big writes with callbacks and a reservation */
    fill(filler);
    mg_store_cork(s);
    char keys[8][16];
    for (int i = 1; i <= 6; i++) {
        snprintf(keys[i], sizeof(keys[i]), "big%d", i);
        const char *p[2] = {keys[i], big};
        CHECK_EQ_INT(mg_store_write_cb(s, INSERT, 2, p, on_done, &args[i]), 0);
    }
    const char *pr[2] = {"reserved-before", "1"};
    CHECK_EQ_INT(mg_store_write_rows_nowait(s, INSERT, 2, pr, on_rows, &args[7]), 0);
    uint64_t t0 = now_ms();
    mg_store_uncork(s);
    /* every callback comes without the disk: the writes' rc 0, the reservation's EFULL */
    CHECK_EQ_INT(run_until(&loop, &seen.calls, 8, 10000), 8);
    uint64_t waited = now_ms() - t0;
    CHECK_EQ_INT(wait_full(s, 1, 5000), 1);
    for (int i = 1; i <= 6; i++) CHECK_EQ_INT(seen.rcs[i], 0);
    CHECK_EQ_INT(seen.rcs[7], MG_STORE_EFULL);
    CHECK_EQ_INT(seen.rows[7], 0);
    fprintf(stderr, "  the callbacks of the batch that found the disk full: %llu ms\n",
            (unsigned long long)waited);

    /* while full: a write with a callback goes on at once, a reservation is refused */
    const char *p8[2] = {"during", "1"};
    CHECK_EQ_INT(mg_store_write_cb(s, INSERT, 2, p8, on_done, &args[8]), 0);
    CHECK_EQ_INT(run_until(&loop, &seen.calls, 9, 5000), 9);
    CHECK_EQ_INT(seen.rcs[8], 0);
    const char *pr2[2] = {"reserved-during", "1"};
    CHECK_EQ_INT(mg_store_write_rows_nowait(s, INSERT, 2, pr2, on_rows, &args[9]), MG_STORE_EFULL);
    CHECK_EQ_INT(mg_store_disk_full(s), 1);
    mg_store_stats_t st;
    mg_store_stats(s, &st);
    CHECK(st.disk_full_episodes_total >= 1);
    CHECK(st.refused_while_full_total >= 1);

    /* the room comes back: the held writes land, the reservations never do */
    unlink(filler);
    CHECK_EQ_INT(wait_full(s, 0, 15000), 0);
    mg_store_flush(s);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config WHERE key LIKE 'big%'"), "6");
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config WHERE key IN ('before', 'during')"),
              "2");
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config WHERE key LIKE 'reserved%'"), "0");
    CHECK_STR(query1(path, "PRAGMA integrity_check"), "ok");
    /* and writing goes on */
    const char *pr3[2] = {"reserved-after", "1"};
    CHECK_EQ_INT(mg_store_write_rows_nowait(s, INSERT, 2, pr3, on_rows, &args[10]), 0);
    CHECK_EQ_INT(run_until(&loop, &seen.calls, 10, 5000), 10);
    CHECK_EQ_INT(seen.rcs[10], 0);
    CHECK_EQ_INT(seen.rows[10], 1);
    CHECK_EQ_INT(seen.calls, 10); /* the refused reservation never called back */
    mg_store_detach(s);
    mg_store_close(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/mg-store-full-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    if (mount("tmpfs", dir, "tmpfs", 0, "size=2m") != 0) {
        fprintf(stderr, "skipped: mounting a small tmpfs needs root (%s)\n", strerror(errno));
        rmdir(dir);
        return 0;
    }
    MG_RUN(test_waiting_writes_go_on_while_full);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    return mg_test_summary();
}
