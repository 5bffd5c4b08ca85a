/* Unit tests for core/store/journal.c and the store's journal path (store.h's
 * mg_store_use_journal): records come back in order and intact across the ring's wrap; a full
 * ring refuses the append (the caller falls back); a record whose head was not advanced (a
 * torn append) and a damaged one are not read; after a kill -9 with undrained usage events the
 * next open replays them, each once, with the roll-ups right, and replaying them again adds
 * nothing; a backup holds the undrained events; events written on the loop thread are in the
 * journal until a drain; a ring of the first version (records summed byte by byte) that a kill
 * left with records is read, and summed the new way once drained. */
#include "mgtest.h"
#include "store_fixture.h"
#include "obs/usage.h"
#include "obs/usage_rollup.h"
#include "store/journal.h"
#include "store/rowgroup.h"
#include "store/store.h"
#include "store/upkeep.h"

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

/* header offsets (journal.c): magic 0, version 8, capacity 16, head 24, tail 32 */
static uint64_t header_u64(const char *file, off_t at)
{
    uint64_t v = 0;
    int fd = open(file, O_RDONLY);
    if (fd >= 0 && pread(fd, &v, 8, at) != 8) v = 0;
    if (fd >= 0) close(fd);
    return v;
}

static void set_header_u64(const char *file, off_t at, uint64_t v)
{
    int fd = open(file, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, &v, 8, at) == 8);
    if (fd >= 0) close(fd);
}

typedef struct {
    int n;
    int64_t ids[4096];
    char text[64];
} seen_t;

static void on_rec(void *ud, int n, const mg_store_val_t *v)
{
    seen_t *s = ud;
    if (n == 3 && v[0].kind == MG_STORE_INT && v[2].kind == MG_STORE_NULL && s->n < 4096) {
        s->ids[s->n++] = v[0].i;
        snprintf(s->text, sizeof(s->text), "%s", v[1].s ? v[1].s : "");
    } else {
        s->ids[s->n++ % 4096] = -1;
    }
}

static int append(mg_journal_t *j, int64_t id)
{
    char t[64];
    snprintf(t, sizeof(t), "record-%lld-padding-padding", (long long)id);
    mg_store_val_t v[3] = {{MG_STORE_INT, id, NULL, 0}, {MG_STORE_TEXT, 0, t, 0}, {0}};
    return mg_journal_append(j, 3, v);
}

static void test_ring_wrap_and_full(void)
{
    char f[200], err[256];
    snprintf(f, sizeof(f), "%s/ring", dir);
    mg_journal_t *j = NULL;
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    CHECK_EQ_INT(mg_journal_capacity(j), 16384);
    int64_t next = 0, want = 0;
    for (int round = 0; round < 20; round++) { /* 20 x ~half the ring: wraps several times */
        int added = 0;
        while (mg_journal_used(j) < 8000 && append(j, next) == 0) next++, added++;
        CHECK(added > 0);
        seen_t s = {0};
        uint64_t pos = mg_journal_read(j, 1 << 30, on_rec, &s);
        CHECK_EQ_INT(s.n, added);
        for (int i = 0; i < s.n; i++)
            if (s.ids[i] != want + i) {
                CHECK_EQ_INT(s.ids[i], want + i);
                break;
            }
        want += s.n;
        mg_journal_release(j, pos);
        CHECK_EQ_INT(mg_journal_used(j), 0);
    }
    /* full: refused, nothing lost, and room again after a release */
    int n = 0;
    while (append(j, next + n) == 0) n++;
    CHECK(n > 100);
    CHECK(mg_journal_used(j) <= 16384);
    seen_t s = {0};
    uint64_t pos = mg_journal_read(j, 10, on_rec, &s); /* `max` is honoured */
    CHECK_EQ_INT(s.n, 10);
    CHECK_EQ_INT(s.ids[0], next);
    mg_journal_release(j, pos);
    CHECK(append(j, -5) == 0);
    mg_journal_close(j);
    /* reopened: the same records, the same order */
    CHECK(mg_journal_open(f, 0, &j, err, sizeof(err)) == 0);
    if (!j) return;
    CHECK_EQ_INT(mg_journal_capacity(j), 16384); /* the file's size, not the argument */
    memset(&s, 0, sizeof(s));
    pos = mg_journal_read(j, 1 << 30, on_rec, &s);
    CHECK_EQ_INT(s.n, n - 10 + 1);
    CHECK_EQ_INT(s.ids[0], next + 10);
    CHECK_EQ_INT(s.ids[s.n - 1], -5);
    mg_journal_release(j, pos);
    mg_journal_close(j);
    /* drained, it takes the size asked for (storage.usage_journal_mib changed) */
    CHECK(mg_journal_open(f, 32768, &j, err, sizeof(err)) == 0);
    if (!j) return;
    CHECK_EQ_INT(mg_journal_capacity(j), 32768);
    CHECK_EQ_INT(mg_journal_used(j), 0);
    mg_journal_close(j);
}

static void test_torn_and_damaged(void)
{
    char f[200], err[256];
    snprintf(f, sizeof(f), "%s/torn", dir);
    mg_journal_t *j = NULL;
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    CHECK(append(j, 1) == 0);
    uint64_t one = header_u64(f, 24);
    CHECK(append(j, 2) == 0);
    mg_journal_close(j);
    /* the second append's bytes are there but its head store never happened */
    set_header_u64(f, 24, one);
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    seen_t s = {0};
    uint64_t pos = mg_journal_read(j, 100, on_rec, &s);
    CHECK_EQ_INT(s.n, 1);
    CHECK_EQ_INT(s.ids[0], 1);
    CHECK_EQ_INT(pos, one);
    CHECK(append(j, 3) == 0); /* overwrites the torn one */
    mg_journal_close(j);
    /* a damaged byte inside a record below the head: the checksum refuses it */
    int fd = open(f, O_RDWR);
    unsigned char x = 0;
    CHECK(fd >= 0 && pread(fd, &x, 1, 4096 + one + 20) == 1);
    x ^= 0x55;
    CHECK(fd >= 0 && pwrite(fd, &x, 1, 4096 + one + 20) == 1);
    if (fd >= 0) close(fd);
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    memset(&s, 0, sizeof(s));
    pos = mg_journal_read(j, 100, on_rec, &s);
    CHECK_EQ_INT(s.n, 1); /* record 1 only; 3 is damaged and skipped */
    mg_journal_release(j, pos);
    CHECK_EQ_INT(mg_journal_used(j), 0);
    mg_journal_close(j);
}

/* A record of the first version, as journal.c wrote it: u32 length, u32 FNV-1a of the
 * payload, then u32 count and (kind, value) pairs. */
static size_t v1_record(unsigned char *r, int64_t id, const char *text)
{
    unsigned char *p = r + 8;
    uint32_t n = 3, len = (uint32_t)strlen(text);
    unsigned char k_int = MG_STORE_INT, k_text = MG_STORE_TEXT, k_null = MG_STORE_NULL;
    memcpy(p, &n, 4), p += 4;
    *p++ = k_int;
    memcpy(p, &id, 8), p += 8;
    *p++ = k_text;
    memcpy(p, &len, 4), p += 4;
    memcpy(p, text, len), p += len;
    *p++ = k_null;
    uint32_t payload = (uint32_t)(p - (r + 8)), sum = 2166136261u;
    for (uint32_t i = 0; i < payload; i++) sum = (sum ^ r[8 + i]) * 16777619u;
    memcpy(r, &payload, 4);
    memcpy(r + 4, &sum, 4);
    return (8 + payload + 7) / 8 * 8;
}

static void test_version_1_ring(void)
{
    char f[200], err[256];
    snprintf(f, sizeof(f), "%s/v1", dir);
    mg_journal_t *j = NULL;
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    mg_journal_close(j);
    CHECK_EQ_INT(header_u64(f, 8) & 0xffffffffu, 2);
    unsigned char r[128] = {0};
    size_t rec = v1_record(r, 7, "written by the first version");
    int fd = open(f, O_RDWR);
    CHECK(fd >= 0 && pwrite(fd, r, rec, 4096) == (ssize_t)rec);
    if (fd >= 0) close(fd);
    set_header_u64(f, 8, 1);
    set_header_u64(f, 24, rec);
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0);
    if (!j) return;
    CHECK(append(j, 8) == 0); /* written on with the ring's own sum until it is drained */
    seen_t s = {0};
    uint64_t pos = mg_journal_read(j, 100, on_rec, &s);
    CHECK_EQ_INT(s.n, 2);
    CHECK_EQ_INT(s.ids[0], 7);
    CHECK_EQ_INT(s.ids[1], 8);
    mg_journal_release(j, pos);
    mg_journal_close(j);
    CHECK_EQ_INT(header_u64(f, 8) & 0xffffffffu, 1);
    CHECK(mg_journal_open(f, 16384, &j, err, sizeof(err)) == 0); /* drained: the new sum */
    if (!j) return;
    CHECK_EQ_INT(header_u64(f, 8) & 0xffffffffu, 2);
    CHECK(append(j, 9) == 0);
    memset(&s, 0, sizeof(s));
    mg_journal_read(j, 100, on_rec, &s);
    CHECK_EQ_INT(s.n, 1);
    CHECK_EQ_INT(s.ids[0], 9);
    mg_journal_close(j);
}

static long long q(const char *sql)
{
    return mgt_db_int(path, sql);
}

static mg_usage_event_t ev(const char *id, int64_t in)
{
    mg_usage_event_t e;
    memset(&e, 0, sizeof(e));
    e.request_id = id;
    e.at_ms = 1767225600000LL + 10;
    e.endpoint = "chat";
    e.tenant_id = 1;
    e.logical_model = "chat";
    e.actual_model = "up-chat";
    e.provider = "p1";
    e.pool = "main";
    e.attempts = 1;
    e.status = "succeeded";
    e.http_status = 200;
    e.tokens.input = in;
    e.tokens.output = 1;
    e.latency_ms = 100;
    e.ttft_ms = -1;
    return e;
}

static mg_store_t *open_store(void)
{
    mg_store_t *s = NULL;
    char err[256];
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return NULL;
    CHECK(mg_store_use_agg(s, &mg_usage_rollup) == 0);
    CHECK(mg_usage_journal_open(s, 262144) == 0);
    return s;
}

static int done_calls, done_rc = -7;
static void on_done(void *ud, int rc)
{
    (void)ud;
    done_calls++;
    done_rc = rc;
}

#define EVENTS 300

/* The child: events written on the loop thread (journaled), then kill -9 before a drain. */
static void child_writes_and_dies(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_store_t *s = NULL;
    char err[256];
    if (mg_store_open(path, &s, err, sizeof(err)) != 0 || mg_store_attach(s, &loop) != 0 ||
        mg_store_use_agg(s, &mg_usage_rollup) != 0 || mg_usage_journal_open(s, 262144) != 0)
        _exit(2);
    for (int i = 0; i < EVENTS; i++) {
        char id[32];
        snprintf(id, sizeof(id), "req-%d", i);
        mg_usage_event_t e = ev(id, i);
        done_calls = 0;
        if (mg_usage_write(s, &e, on_done, NULL) != 0 || done_calls != 1 || done_rc != 0) _exit(3);
    }
    mg_store_stats_t st;
    mg_store_stats(s, &st);
    if (st.journaled_total != EVENTS) _exit(4);
    raise(SIGKILL);
}

static void test_replay_after_kill(void)
{
    pid_t pid = fork();
    if (pid == 0) child_writes_and_dies();
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (WIFEXITED(status)) fprintf(stderr, "child exited %d\n", WEXITSTATUS(status));
    uint64_t head = header_u64(jpath, 24), tail = header_u64(jpath, 32);
    CHECK(head > tail); /* undrained records were left (the kill came within the drain period) */
    /* the next start replays them before serving: every event once, the roll-ups right */
    mg_store_t *s = open_store();
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), EVENTS);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), EVENTS);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly"), EVENTS * (EVENTS - 1) / 2);
    CHECK_EQ_INT(header_u64(jpath, 24), header_u64(jpath, 32)); /* drained */
    mg_store_close(s);
    /* a crash after the drain's commit, before its tail moved: the same records again */
    set_header_u64(jpath, 32, tail);
    s = open_store();
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events"), EVENTS);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly"), EVENTS);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly"), EVENTS * (EVENTS - 1) / 2);
    mg_store_close(s);
}

/* A backup taken while events sit undrained in the journal holds them (store/upkeep.h's
 * mg_store_backup with the usage replay); without the replay it would not. The live files
 * are left as they were: the next start still replays the journal. */
static void test_backup_holds_the_journal(void)
{
    char live[160], with[200], without[200], leftover[240];
    snprintf(live, sizeof(live), "%s", path);
    snprintf(path, sizeof(path), "%s/b.db", dir);
    snprintf(jpath, sizeof(jpath), "%s.usage-journal", path);
    pid_t pid = fork();
    if (pid == 0) child_writes_and_dies();
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    uint64_t head = header_u64(jpath, 24), tail = header_u64(jpath, 32);
    CHECK(head > tail);
    snprintf(with, sizeof(with), "%s/with.db", dir);
    snprintf(without, sizeof(without), "%s/without.db", dir);
    char err[256];
    CHECK(mg_store_backup(path, without, NULL, err, sizeof(err)) == 0);
    CHECK(mg_store_backup(path, with, mg_usage_journal_replay, err, sizeof(err)) == 0);
    CHECK_EQ_INT(mgt_db_int(without, "SELECT COUNT(*) FROM usage_events"), 0);
    CHECK_EQ_INT(mgt_db_int(with, "SELECT COUNT(*) FROM usage_events"), EVENTS);
    CHECK_EQ_INT(mgt_db_int(with, "SELECT SUM(requests) FROM usage_hourly"), EVENTS);
    CHECK_EQ_INT(mgt_db_int(with, "SELECT SUM(input_tokens) FROM usage_hourly"),
                 EVENTS * (EVENTS - 1) / 2);
    CHECK_EQ_INT(header_u64(jpath, 24), head); /* the live journal untouched */
    CHECK_EQ_INT(header_u64(jpath, 32), tail);
    snprintf(leftover, sizeof(leftover), "%s.tmp.usage-journal", with);
    CHECK(access(leftover, F_OK) != 0);
    snprintf(leftover, sizeof(leftover), "%s.usage-journal", with);
    CHECK(access(leftover, F_OK) != 0);
    snprintf(path, sizeof(path), "%s", live);
    snprintf(jpath, sizeof(jpath), "%s.usage-journal", path);
}

/* Off the loop thread (no loop attached here) the event takes the queue, counted. */
static void test_fallback_off_loop(void)
{
    mg_store_t *s = open_store();
    if (!s) return;
    mg_usage_event_t e = ev("other-thread", 5);
    CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
    mg_store_flush(s);
    mg_store_stats_t st;
    mg_store_stats(s, &st);
    CHECK_EQ_INT(st.journaled_total, 0);
    CHECK_EQ_INT(st.journal_fallback_total, 1);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events WHERE request_id = 'other-thread'"), 1);
    mg_store_close(s);
}

/* The store opened and attached to a loop of its own (events are journaled on its thread). */
static mg_store_t *open_attached(uv_loop_t *loop)
{
    uv_loop_init(loop);
    mg_store_t *s = open_store();
    if (s) CHECK(mg_store_attach(s, loop) == 0);
    return s;
}

static void close_attached(mg_store_t *s, uv_loop_t *loop)
{
    mg_store_detach(s);
    uv_run(loop, UV_RUN_DEFAULT);
    mg_store_close(s);
    uv_loop_close(loop);
}

/* The events' rows and the roll-ups' sums, to compare before and after a test's writes. */
typedef struct {
    long long rows, requests, input;
} totals_t;

static totals_t totals(void)
{
    return (totals_t){q("SELECT COUNT(*) FROM usage_events"),
                      q("SELECT COALESCE(SUM(requests), 0) FROM usage_hourly"),
                      q("SELECT COALESCE(SUM(input_tokens), 0) FROM usage_hourly")};
}

/* A drain binds its records straight from the ring in one transaction; a record its INSERT
 * refuses (here a trigger's ABORT) rolls that pass back, and the same records go record by record:
 * the good ones land once, the refused one alone fails, a replayed one adds nothing, and the
 * roll-ups sum exactly the rows inserted. */
static void test_drain_falls_back_per_record(void)
{
    /* OR IGNORE skips a CHECK's refusal silently; a trigger's ABORT still fails the INSERT */
    CHECK(mgt_db_exec(
              path,
              "CREATE TRIGGER refuse_one BEFORE INSERT ON usage_events"
              " WHEN NEW.request_id = 'fallback-bad' BEGIN SELECT RAISE(ABORT, 'refused'); END") ==
          0);
    uv_loop_t loop;
    mg_store_t *s = open_attached(&loop);
    if (!s) return;
    totals_t t0 = totals();
    mg_store_stats_t before, after;
    mg_store_stats(s, &before);
    mg_usage_event_t good1 = ev("fallback-1", 1000), bad = ev("fallback-bad", 5000),
                     good2 = ev("fallback-2", 20000);
    CHECK(mg_usage_write(s, &good1, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &bad, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &good2, NULL, NULL) == 0);
    CHECK(mg_usage_write(s, &good1, NULL, NULL) == 0); /* a replay of the first */
    mg_store_flush(s);
    mg_store_stats(s, &after);
    CHECK_EQ_INT(after.journaled_total - before.journaled_total, 4);
    CHECK_EQ_INT(after.failed_total - before.failed_total, 1);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events") - t0.rows, 2);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events WHERE request_id LIKE 'fallback-%'"), 2);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly") - t0.requests, 2);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly") - t0.input, 21000);
    /* the next drain takes the direct pass again: one more event, one more row and sum */
    mg_usage_event_t good3 = ev("fallback-3", 300000);
    CHECK(mg_usage_write(s, &good3, NULL, NULL) == 0);
    mg_store_flush(s);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly") - t0.input, 321000);
    CHECK_EQ_INT(header_u64(jpath, 24), header_u64(jpath, 32)); /* drained */
    close_attached(s, &loop);
    CHECK(mgt_db_exec(path, "DROP TRIGGER refuse_one") == 0);
}

/* Events on the loop thread, then one drain. */
static void write_events(mg_store_t *s, const char *prefix, int from, int to, int64_t in)
{
    for (int i = from; i < to; i++) {
        char id[48];
        snprintf(id, sizeof(id), "%s-%d", prefix, i);
        mg_usage_event_t e = ev(id, in);
        CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
    }
    mg_store_flush(s);
}

/* After the start's drain, a drain inserts its records MG_ROWGROUP_ROWS a statement and the
 * rest one by one, each once, the roll-ups exact; a group holding a row already in the table
 * (a repeated request id) goes record by record instead: the new rows land, the repeated
 * one is not summed twice, and nothing is counted as failed. */
static void test_drain_in_groups(void)
{
    uv_loop_t loop;
    mg_store_t *s = open_attached(&loop);
    if (!s) return;
    totals_t t0 = totals();
    mg_store_stats_t before, after;
    mg_store_stats(s, &before);
    write_events(s, "group", 0, 2 * MG_ROWGROUP_ROWS + 5, 3);
    mg_store_stats(s, &after);
    CHECK_EQ_INT(after.journal_grouped_total - before.journal_grouped_total, 2 * MG_ROWGROUP_ROWS);
    CHECK_EQ_INT(after.writes_total - before.writes_total, 2 * MG_ROWGROUP_ROWS + 5);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events") - t0.rows, 2 * MG_ROWGROUP_ROWS + 5);
    CHECK_EQ_INT(q("SELECT COUNT(DISTINCT request_id) FROM usage_events"
                   " WHERE request_id LIKE 'group-%'"),
                 2 * MG_ROWGROUP_ROWS + 5);
    CHECK_EQ_INT(q("SELECT SUM(requests) FROM usage_hourly") - t0.requests,
                 2 * MG_ROWGROUP_ROWS + 5);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly") - t0.input,
                 3 * (2 * MG_ROWGROUP_ROWS + 5));
    /* the journal's order is the table's: seq follows the request ids' numbers */
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events a JOIN usage_events b"
                   " ON a.request_id LIKE 'group-%' AND b.request_id LIKE 'group-%'"
                   " AND CAST(substr(a.request_id, 7) AS INTEGER)"
                   " < CAST(substr(b.request_id, 7) AS INTEGER) AND a.seq > b.seq"),
                 0);
    /* a full group, one of its rows already stored ("group-3" again) */
    totals_t t1 = totals();
    mg_store_stats(s, &before);
    for (int i = 0; i < MG_ROWGROUP_ROWS; i++) {
        char id[48];
        snprintf(id, sizeof(id), i == 5 ? "group-3" : "again-%d", i);
        mg_usage_event_t e = ev(id, 1000);
        CHECK(mg_usage_write(s, &e, NULL, NULL) == 0);
    }
    mg_store_flush(s);
    mg_store_stats(s, &after);
    CHECK_EQ_INT(after.journal_grouped_total - before.journal_grouped_total, 0);
    CHECK_EQ_INT(after.failed_total - before.failed_total, 0);
    CHECK_EQ_INT(q("SELECT COUNT(*) FROM usage_events") - t1.rows, MG_ROWGROUP_ROWS - 1);
    CHECK_EQ_INT(q("SELECT input_tokens FROM usage_events WHERE request_id = 'group-3'"), 3);
    CHECK_EQ_INT(q("SELECT SUM(input_tokens) FROM usage_hourly") - t1.input,
                 1000 * (MG_ROWGROUP_ROWS - 1));
    /* and the next drain goes in groups again */
    mg_store_stats(s, &before);
    write_events(s, "later", 0, MG_ROWGROUP_ROWS, 1);
    mg_store_stats(s, &after);
    CHECK_EQ_INT(after.journal_grouped_total - before.journal_grouped_total, MG_ROWGROUP_ROWS);
    CHECK_EQ_INT(header_u64(jpath, 24), header_u64(jpath, 32)); /* drained */
    close_attached(s, &loop);
}

int main(void)
{
    if (mgt_tmpdir(dir, sizeof(dir), "journal") != 0) return 1;
    snprintf(path, sizeof(path), "%s/m.db", dir);
    snprintf(jpath, sizeof(jpath), "%s.usage-journal", path);
    MG_RUN(test_ring_wrap_and_full);
    MG_RUN(test_torn_and_damaged);
    MG_RUN(test_version_1_ring);
    MG_RUN(test_replay_after_kill);
    MG_RUN(test_backup_holds_the_journal);
    MG_RUN(test_fallback_off_loop);
    MG_RUN(test_drain_falls_back_per_record);
    MG_RUN(test_drain_in_groups);
    if (mgt_rmtree(dir) != 0) return 1;
    return mg_test_summary();
}
