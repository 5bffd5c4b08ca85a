/* Unit tests for core/store/store.c: open creates the file (and its directories), applies the
 * migrations once and records them, reopening is idempotent, the journal is WAL, a
 * database from a newer binary is refused. The write path: callbacks on the loop thread after
 * the commit, in order; the queue bound with writes parked on the loop (never blocking it)
 * while another connection holds the write lock; threads other than the loop's waiting for
 * room; a failing statement failing alone; callbacks still due at close; a write whose
 * callback ran surviving SIGKILL. Everything lives in a fresh temp directory. */
#include "mgtest.h"
#include "store/store.h"

#include <ftw.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-store-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(1);
    }
}

static void remove_tmpdir(void)
{
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Run a one-value query on a separate connection; returns the text (static buffer). */
static const char *query1(const char *path, const char *sql)
{
    static char out[256];
    out[0] = '\0';
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return "(open failed)";
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(out, sizeof(out), "(error: %s)", sqlite3_errmsg(db));
    } else if (sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(out, sizeof(out), "%s", t ? (const char *)t : "(null)");
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return out;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_open_creates_and_migrates(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/nested/dir/mg.db", tmpdir);
    mg_store_t *s = (mg_store_t *)1;
    int rc = mg_store_open(path, &s, err, sizeof(err));
    CHECK_EQ_INT(rc, 0);
    if (rc != 0) {
        fprintf(stderr, "  open: %s\n", err);
        return;
    }
    CHECK(s != NULL);
    CHECK(file_exists(path));
    int v = mg_store_schema_version(s);
    CHECK(v >= 1);
    /* while open: WAL mode shows the -wal file next to the database once written */
    char q[64];
    snprintf(q, sizeof(q), "SELECT COUNT(*) FROM schema_migrations");
    char expect[16];
    snprintf(expect, sizeof(expect), "%d", v);
    CHECK_STR(query1(path, q), expect);
    CHECK_STR(query1(path, "SELECT MAX(version) FROM schema_migrations"), expect);
    CHECK_STR(query1(path, "SELECT MIN(version) FROM schema_migrations"), "1");
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM schema_migrations WHERE applied_at IS NULL"), "0");
    CHECK_STR(query1(path, "PRAGMA journal_mode"), "wal");
    /* the schema's tables exist */
    const char *tables[] = {"providers",       "provider_usage_logs", "cooldown_events",
                            "provider_health", "system_config",       "daily_stats"};
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
        char sql[128];
        snprintf(sql, sizeof(sql),
                 "SELECT COUNT(*) FROM sqlite_master WHERE type='table' AND name='%s'", tables[i]);
        const char *got = query1(path, sql);
        if (strcmp(got, "1") != 0) fprintf(stderr, "  table %s missing\n", tables[i]);
        CHECK_STR(got, "1");
    }
    mg_store_close(s);
    /* journal_mode=WAL is persistent: a fresh connection after close still sees it */
    CHECK_STR(query1(path, "PRAGMA journal_mode"), "wal");
}

static void test_reopen_is_idempotent(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/re.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    int v = mg_store_schema_version(s);
    mg_store_close(s);
    const char *first = query1(path, "SELECT group_concat(version || '@' || applied_at) FROM "
                                     "schema_migrations");
    char before[256];
    snprintf(before, sizeof(before), "%s", first);
    for (int i = 0; i < 3; i++) {
        s = NULL;
        CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
        if (!s) {
            fprintf(stderr, "  reopen: %s\n", err);
            return;
        }
        CHECK_EQ_INT(mg_store_schema_version(s), v);
        mg_store_close(s);
    }
    char expect[16];
    snprintf(expect, sizeof(expect), "%d", v);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM schema_migrations"), expect);
    /* the original rows (with their timestamps) are untouched */
    CHECK_STR(query1(path, "SELECT group_concat(version || '@' || applied_at) FROM "
                           "schema_migrations"),
              before);
}

/* Data written between opens survives a reopen (the migrations do not recreate tables). */
static void test_data_survives_reopen(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/data.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    mg_store_close(s);
    sqlite3 *db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_exec(db, "INSERT INTO system_config(key, value) VALUES ('k', 'v')", NULL,
                              NULL, NULL),
                 SQLITE_OK);
    sqlite3_close(db);
    s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    mg_store_close(s);
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key = 'k'"), "v");
}

/* A database migrated by a newer binary (higher version recorded) is refused with a
 * message naming the file. */
/* The books' CHECKs, partial indexes and trigger conditions carry no IN list (SQLite 3.40
 * builds an ephemeral index for one on every row: migrations 20 and 22), and still refuse
 * what they refused. */
static void test_checks_without_in_lists(void)
{
    char path[300], err[256];
    snprintf(path, sizeof(path), "%s/inlist.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK(mg_store_open(path, &s, err, sizeof(err)) == 0);
    if (!s) return;
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM sqlite_master WHERE tbl_name IN ('spend',"
                           " 'ledger_entries', 'ledger_holds', 'usage_events', 'topups')"
                           " AND instr(replace(upper(sql), ' ', ''), 'IN(') > 0"),
              "0");
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND"
                           " tbl_name IN ('ledger_entries', 'ledger_holds', 'topups')"),
              "9");
    mg_store_tx_t *tx = NULL;
    CHECK(mg_store_tx_begin(s, &tx, err, sizeof(err)) == 0);
    if (tx) {
        const char *ok[] = {"tenant"}, *bad[] = {"bogus"};
        const char *sql = "INSERT INTO spend(scope, id, period, micros) VALUES (?1, 1, 'd:x', 1)";
        CHECK_EQ_INT(mg_store_tx_exec(tx, sql, 1, ok, NULL, NULL, err, sizeof(err)), 1);
        CHECK_EQ_INT(mg_store_tx_exec(tx, sql, 1, bad, NULL, NULL, err, sizeof(err)),
                     MG_STORE_ECONSTRAINT);
        const char *hold = "INSERT INTO ledger_holds(request_id, tenant_id, reserved_micros,"
                           " state, created_ms) VALUES ('r1', 1, 100, ?1, 1)";
        const char *held[] = {"held"}, *odd[] = {"odd"};
        CHECK_EQ_INT(mg_store_tx_exec(tx, hold, 1, odd, NULL, NULL, err, sizeof(err)),
                     MG_STORE_ECONSTRAINT);
        CHECK_EQ_INT(mg_store_tx_exec(tx, hold, 1, held, NULL, NULL, err, sizeof(err)), 1);
        CHECK(mg_store_tx_exec(tx,
                               "UPDATE ledger_holds SET state = 'settled', charged_micros = 40,"
                               " ended_ms = 2 WHERE request_id = 'r1'",
                               0, NULL, NULL, NULL, err, sizeof(err)) == 1);
        CHECK(mg_store_tx_exec(tx, "UPDATE ledger_holds SET state = 'held' WHERE request_id = 'r1'",
                               0, NULL, NULL, NULL, err, sizeof(err)) < 0);
        CHECK(mg_store_tx_exec(tx,
                               "INSERT INTO ledger_entries(tenant_id, kind, amount_micros,"
                               " hold_micros, at_ms) VALUES (1, 'settle', 0, 0, 1)",
                               0, NULL, NULL, NULL, err, sizeof(err)) == MG_STORE_ECONSTRAINT);
        CHECK(mg_store_tx_commit(tx, err, sizeof(err)) == 0);
    }
    CHECK_STR(query1(path, "SELECT balance_micros || ',' || held_micros || ',' || entries"
                           " FROM wallets WHERE tenant_id = 1"),
              "-40,0,2");
    mg_store_close(s);
}

static void test_newer_schema_refused(void)
{
    char path[512], err[512] = "";
    snprintf(path, sizeof(path), "%s/newer.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    if (!s) return;
    int v = mg_store_schema_version(s);
    mg_store_close(s);
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    char sql[128];
    snprintf(sql, sizeof(sql), "INSERT INTO schema_migrations(version) VALUES (%d)", v + 1);
    CHECK_EQ_INT(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    s = (mg_store_t *)1;
    err[0] = '\0';
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, path) != NULL);
    CHECK(strstr(err, "newer") != NULL);
}

/* Unusable paths fail with a message, not a crash. */
static void test_open_errors(void)
{
    char path[512], err[512] = "";
    /* a regular file where a directory should be */
    char blocker[512];
    snprintf(blocker, sizeof(blocker), "%s/blocker", tmpdir);
    FILE *f = fopen(blocker, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    snprintf(path, sizeof(path), "%s/blocker/sub/x.db", tmpdir);
    mg_store_t *s = (mg_store_t *)1;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, path) != NULL);
    /* not a database */
    char junk[512];
    snprintf(junk, sizeof(junk), "%s/junk.db", tmpdir);
    f = fopen(junk, "w");
    if (f) {
        for (int i = 0; i < 200; i++) fputs("this is not an SQLite database file\n", f);
        fclose(f);
    }
    s = (mg_store_t *)1;
    err[0] = '\0';
    CHECK_EQ_INT(mg_store_open(junk, &s, err, sizeof(err)), -1);
    CHECK(s == NULL);
    CHECK(strstr(err, junk) != NULL);
    mg_store_close(NULL); /* tolerated */
}

static void count_rows(void *ud, int ncols, const char *const *cols)
{
    int *n = ud;
    (*n)++;
    (void)ncols;
    (void)cols;
}

/* Writes queued from the caller's thread are committed by the writer thread, in
 * order, and visible to mg_store_query after a flush; NULL parameters bind NULL. */
static void test_writer_thread(void)
{
    make_tmpdir();
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/w.db", tmpdir);
    mg_store_t *s = NULL;
    CHECK_EQ_INT(mg_store_open(path, &s, err, sizeof(err)), 0);
    for (int i = 0; i < 500; i++) {
        char key[32], val[32];
        snprintf(key, sizeof(key), "k%03d", i);
        snprintf(val, sizeof(val), "%d", i);
        const char *p[3] = {key, val, i % 2 ? NULL : "even"};
        CHECK_EQ_INT(mg_store_write(s,
                                    "INSERT INTO system_config(key, value, description) "
                                    "VALUES (?1, ?2, COALESCE(?3, 'odd'))",
                                    3, p),
                     0);
    }
    /* a later write to the same key wins: order is kept */
    const char *upd[2] = {"k000", "changed"};
    CHECK_EQ_INT(mg_store_write(s, "UPDATE system_config SET value = ?2 WHERE key = ?1", 2, upd),
                 0);
    mg_store_flush(s);
    int rows = 0;
    CHECK_EQ_INT(mg_store_query(s, "SELECT key FROM system_config", 0, NULL, count_rows, &rows, err,
                                sizeof(err)),
                 0);
    CHECK_EQ_INT(rows, 500);
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key='k000'"), "changed");
    CHECK_STR(query1(path, "SELECT description FROM system_config WHERE key='k001'"), "odd");
    /* a bad statement is reported, not fatal, and later writes still land */
    CHECK_EQ_INT(mg_store_write(s, "INSERT INTO no_such_table VALUES (1)", 0, NULL), 0);
    const char *p2[2] = {"after", "1"};
    CHECK_EQ_INT(mg_store_write(s, "INSERT INTO system_config(key, value) VALUES (?1, ?2)", 2, p2),
                 0);
    mg_store_close(s); /* close commits what is queued */
    CHECK_STR(query1(path, "SELECT value FROM system_config WHERE key='after'"), "1");
    remove_tmpdir();
}

/* ---- the write path ------------------------------------------------------------------ */

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Run the loop until *count reaches target or timeout_ms pass (the store's async handle does
 * not keep a loop alive, a timer does). Returns *count. */
static void on_tick(uv_timer_t *t)
{
    int *const *p = t->data;
    if (*p[0] >= *p[1]) uv_stop(t->loop);
}

static int run_until(uv_loop_t *loop, int *count, int target, int timeout_ms)
{
    uv_timer_t tick;
    int *args[2] = {count, &target};
    uv_timer_init(loop, &tick);
    tick.data = args;
    uv_timer_start(&tick, on_tick, 1, 1);
    uint64_t end = uv_hrtime() + (uint64_t)timeout_ms * 1000000u;
    while (*count < target && uv_hrtime() < end) uv_run(loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return *count;
}

typedef struct {
    const char *path;
    int calls;
    int inside_write;  /* set while mg_store_write_cb runs */
    int called_inside; /* a callback ran inside mg_store_write_cb */
    int order_ok;
    int seen_missing; /* a callback whose row another connection could not read */
    int rcs[64];
} cb_state_t;

typedef struct {
    cb_state_t *st;
    int index;
    char key[32];
} cb_arg_t;

static void on_done(void *ud, int rc)
{
    cb_arg_t *a = ud;
    cb_state_t *st = a->st;
    if (st->inside_write) st->called_inside = 1;
    if (a->index != st->calls) st->order_ok = 0;
    if (a->index < 64) st->rcs[a->index] = rc;
    st->calls++;
    if (rc == 0 && st->path) {
        char sql[96];
        snprintf(sql, sizeof(sql), "SELECT COUNT(*) FROM system_config WHERE key = '%s'", a->key);
        if (strcmp(query1(st->path, sql), "1") != 0) st->seen_missing = 1;
    }
}

static int write_cb(mg_store_t *s, cb_state_t *st, cb_arg_t *a, int index, const char *key)
{
    a->st = st;
    a->index = index;
    snprintf(a->key, sizeof(a->key), "%s", key);
    const char *p[2] = {a->key, "v"};
    st->inside_write = 1;
    int rc = mg_store_write_cb(s, "INSERT INTO system_config(key, value) VALUES (?1, ?2)", 2, p,
                               on_done, a);
    st->inside_write = 0;
    return rc;
}

static mg_store_t *open_attached(const char *name, uv_loop_t *loop, int queue_max, char *path,
                                 size_t cap)
{
    char err[256];
    snprintf(path, cap, "%s/%s", tmpdir, name);
    mg_store_opts_t o = {.queue_max = queue_max, .busy_wait_ms = 20};
    mg_store_t *s = NULL;
    if (mg_store_open_with(path, &o, &s, err, sizeof(err)) != 0) {
        fprintf(stderr, "  open: %s\n", err);
        return NULL;
    }
    if (loop && mg_store_attach(s, loop) != 0) {
        mg_store_close(s);
        return NULL;
    }
    return s;
}

/* The write lock held by another connection, as a backup or a long admin transaction would. */
static sqlite3 *take_write_lock(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

static void release_write_lock(sqlite3 *db)
{
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
}

/* Poll the store's counters until pred holds (bounded); returns whether it did. */
static int wait_stats(mg_store_t *s, int (*pred)(const mg_store_stats_t *), int timeout_ms)
{
    mg_store_stats_t st;
    for (int waited = 0; waited < timeout_ms; waited += 2) {
        mg_store_stats(s, &st);
        if (pred(&st)) return 1;
        sleep_ms(2);
    }
    return 0;
}

static int writer_blocked(const mg_store_stats_t *st)
{
    return st->queued == 0 && st->busy_retries_total > 0;
}

/* Callbacks come on the loop thread after the commit (another connection sees the row),
 * in the order queued, never inside the call that queued the write. */
static void test_callbacks_after_commit(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char path[512];
    mg_store_t *s = open_attached("cb.db", &loop, 0, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    cb_state_t st = {.path = path, .order_ok = 1};
    static cb_arg_t args[50];
    for (int i = 0; i < 50; i++) {
        char key[32];
        snprintf(key, sizeof(key), "cb%02d", i);
        CHECK_EQ_INT(write_cb(s, &st, &args[i], i, key), 0);
    }
    CHECK_EQ_INT(run_until(&loop, &st.calls, 50, 10000), 50);
    CHECK_EQ_INT(st.called_inside, 0);
    CHECK_EQ_INT(st.order_ok, 1);
    CHECK_EQ_INT(st.seen_missing, 0);
    for (int i = 0; i < 50; i++) CHECK_EQ_INT(st.rcs[i], 0);
    mg_store_stats_t ss;
    mg_store_stats(s, &ss);
    CHECK_EQ_INT(ss.writes_total, 50);
    CHECK(ss.batches_total >= 1 && ss.batches_total <= 50);
    mg_store_detach(s);
    mg_store_close(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* Writes queued between mg_store_cork and mg_store_uncork commit in one transaction, even
 * with the writer idle and the loop pausing between them; corks nest, and nothing reaches
 * the writer before the last uncork. */
static void test_cork_one_commit(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char path[512];
    mg_store_t *s = open_attached("cork.db", &loop, 0, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    cb_state_t st = {.path = path, .order_ok = 1};
    static cb_arg_t args[30];
    mg_store_stats_t before, after;
    mg_store_stats(s, &before);
    for (int round = 0; round < 10; round++) {
        mg_store_cork(s);
        for (int i = 0; i < 3; i++) {
            char key[32];
            snprintf(key, sizeof(key), "cork%02d", round * 3 + i);
            CHECK_EQ_INT(write_cb(s, &st, &args[round * 3 + i], round * 3 + i, key), 0);
            sleep_ms(2); /* an uncorked writer would have taken the first by now */
        }
        mg_store_uncork(s);
        CHECK_EQ_INT(run_until(&loop, &st.calls, 3 * (round + 1), 10000), 3 * (round + 1));
    }
    mg_store_stats(s, &after);
    CHECK_EQ_INT((int)(after.batches_total - before.batches_total), 10);
    CHECK_EQ_INT(st.order_ok, 1);
    /* nested: held until the outer uncork */
    mg_store_cork(s);
    mg_store_cork(s);
    static cb_arg_t last;
    CHECK_EQ_INT(write_cb(s, &st, &last, 30, "cork30"), 0);
    mg_store_uncork(s);
    sleep_ms(20);
    mg_store_stats(s, &after);
    CHECK_EQ_INT((int)(after.writes_total - before.writes_total), 30);
    mg_store_uncork(s);
    CHECK_EQ_INT(run_until(&loop, &st.calls, 31, 10000), 31);
    for (int i = 0; i <= 30; i++) CHECK_EQ_INT(st.rcs[i], 0);
    mg_store_detach(s);
    mg_store_close(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* queue_max 4 while another connection holds the write lock: writes from the loop thread
 * return at once and park beyond the bound, nothing commits or calls back; once the lock
 * goes, every write commits in order, in transactions of at most 4. */
static void test_bound_and_parking(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char path[512];
    mg_store_t *s = open_attached("bound.db", &loop, 4, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    sqlite3 *lock = take_write_lock(path);
    CHECK(lock != NULL);
    cb_state_t st = {.path = NULL, .order_ok = 1};
    static cb_arg_t args[41];
    CHECK_EQ_INT(write_cb(s, &st, &args[0], 0, "first"), 0);
    CHECK(wait_stats(s, writer_blocked, 5000)); /* the writer took it and waits for the lock */
    for (int i = 1; i < 41; i++) {
        char key[32];
        snprintf(key, sizeof(key), "b%02d", i);
        CHECK_EQ_INT(write_cb(s, &st, &args[i], i, key), 0);
    }
    mg_store_stats_t ss;
    mg_store_stats(s, &ss);
    CHECK_EQ_INT(ss.queued, 4);
    CHECK_EQ_INT(ss.parked, 36);
    for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT);
    CHECK_EQ_INT(st.calls, 0); /* nothing committed: nothing acknowledged */
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config"), "0");
    release_write_lock(lock);
    CHECK_EQ_INT(run_until(&loop, &st.calls, 41, 10000), 41);
    CHECK_EQ_INT(st.order_ok, 1);
    for (int i = 0; i < 41; i++) CHECK_EQ_INT(st.rcs[i], 0);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config"), "41");
    mg_store_stats(s, &ss);
    CHECK_EQ_INT(ss.queued, 0);
    CHECK_EQ_INT(ss.parked, 0);
    CHECK_EQ_INT(ss.writes_total, 41);
    CHECK(ss.largest_batch <= 4);
    CHECK(ss.busy_retries_total > 0);
    mg_store_close(s); /* still attached: close detaches */
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

typedef struct {
    mg_store_t *s;
    int submitted;
    pthread_mutex_t mu;
} producer_t;

static void *producer_main(void *arg)
{
    producer_t *p = arg;
    for (int i = 0; i < 10; i++) {
        char key[16];
        snprintf(key, sizeof(key), "t%d", i);
        const char *params[2] = {key, "v"};
        mg_store_write(p->s, "INSERT INTO system_config(key, value) VALUES (?1, ?2)", 2, params);
        pthread_mutex_lock(&p->mu);
        p->submitted++;
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

static int queue_full_2(const mg_store_stats_t *st)
{
    return st->queued == 2;
}

/* A thread other than the loop's waits for room (back-pressure by blocking there). */
static void test_other_thread_waits_for_room(void)
{
    char path[512];
    mg_store_t *s = open_attached("room.db", NULL, 2, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    sqlite3 *lock = take_write_lock(path);
    producer_t p = {s, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th;
    pthread_create(&th, NULL, producer_main, &p);
    CHECK(wait_stats(s, queue_full_2, 5000));
    sleep_ms(50);
    pthread_mutex_lock(&p.mu);
    int during = p.submitted;
    pthread_mutex_unlock(&p.mu);
    /* one batch taken by the writer, two queued, the next one waits */
    CHECK(during >= 2 && during <= 4);
    release_write_lock(lock);
    pthread_join(th, NULL);
    CHECK_EQ_INT(p.submitted, 10);
    mg_store_flush(s);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config"), "10");
    mg_store_close(s);
}

/* In one batch, a statement that fails (a duplicate key) fails alone. */
static void test_failed_statement_alone(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char path[512];
    mg_store_t *s = open_attached("fail.db", &loop, 0, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    sqlite3 *lock = take_write_lock(path);
    cb_state_t st = {.path = NULL, .order_ok = 1};
    static cb_arg_t args[4];
    CHECK_EQ_INT(write_cb(s, &st, &args[0], 0, "warmup"), 0);
    CHECK(wait_stats(s, writer_blocked, 5000));
    CHECK_EQ_INT(write_cb(s, &st, &args[1], 1, "dup"), 0);
    CHECK_EQ_INT(write_cb(s, &st, &args[2], 2, "dup"), 0); /* same primary key */
    CHECK_EQ_INT(write_cb(s, &st, &args[3], 3, "after"), 0);
    release_write_lock(lock);
    CHECK_EQ_INT(run_until(&loop, &st.calls, 4, 10000), 4);
    CHECK_EQ_INT(st.rcs[0], 0);
    CHECK_EQ_INT(st.rcs[1], 0);
    CHECK_EQ_INT(st.rcs[2], MG_STORE_ECONSTRAINT);
    CHECK_EQ_INT(st.rcs[3], 0);
    CHECK_STR(
        query1(path, "SELECT group_concat(key) FROM (SELECT key FROM system_config ORDER BY key)"),
        "after,dup,warmup");
    mg_store_stats_t ss;
    mg_store_stats(s, &ss);
    CHECK_EQ_INT(ss.failed_total, 1);
    mg_store_close(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* After detach (shutdown), writes still commit and their callbacks run inside close. */
static void test_close_delivers(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    char path[512];
    mg_store_t *s = open_attached("close.db", &loop, 0, path, sizeof(path));
    CHECK(s != NULL);
    if (!s) return;
    mg_store_detach(s);
    uv_run(&loop, UV_RUN_DEFAULT); /* the async handle closes */
    cb_state_t st = {.path = NULL, .order_ok = 1};
    static cb_arg_t args[2];
    CHECK_EQ_INT(write_cb(s, &st, &args[0], 0, "late0"), 0);
    CHECK_EQ_INT(write_cb(s, &st, &args[1], 1, "late1"), 0);
    mg_store_close(s);
    CHECK_EQ_INT(st.calls, 2);
    CHECK_EQ_INT(st.rcs[0], 0);
    CHECK_EQ_INT(st.rcs[1], 0);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config"), "2");
    CHECK_EQ_INT(uv_loop_close(&loop), 0);
}

/* A child process writes, and SIGKILLs itself inside the callback of its 20th write: every
 * write whose callback ran is in the database afterwards (synchronous=normal, WAL). */
static int kill_at;
static void on_done_kill(void *ud, int rc)
{
    int *calls = ud;
    (*calls)++;
    if (rc == 0 && *calls == kill_at) raise(SIGKILL);
}

static void test_callback_survives_sigkill(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/kill.db", tmpdir);
    kill_at = 20;
    pid_t pid = fork();
    if (pid == 0) {
        uv_loop_t loop;
        uv_loop_init(&loop);
        char err[256];
        mg_store_t *s = NULL;
        if (mg_store_open(path, &s, err, sizeof(err)) != 0 || mg_store_attach(s, &loop) != 0)
            _exit(3);
        int calls = 0;
        for (int i = 0; i < 200; i++) {
            char key[16];
            snprintf(key, sizeof(key), "k%03d", i);
            const char *p[2] = {key, "v"};
            mg_store_write_cb(s, "INSERT INTO system_config(key, value) VALUES (?1, ?2)", 2, p,
                              on_done_kill, &calls);
            if (i % 5 == 4) run_until(&loop, &calls, i + 1, 5000); /* several batches */
        }
        run_until(&loop, &calls, 200, 5000);
        _exit(4); /* not reached: killed in a callback */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* at least the 20 acknowledged writes, and the first 20 keys among them */
    int n = atoi(query1(path, "SELECT COUNT(*) FROM system_config"));
    CHECK(n >= 20);
    CHECK_STR(query1(path, "SELECT COUNT(*) FROM system_config WHERE key < 'k020'"), "20");
}

int main(void)
{
    make_tmpdir();
    MG_RUN(test_open_creates_and_migrates);
    MG_RUN(test_reopen_is_idempotent);
    MG_RUN(test_data_survives_reopen);
    MG_RUN(test_checks_without_in_lists);
    MG_RUN(test_newer_schema_refused);
    MG_RUN(test_open_errors);
    MG_RUN(test_writer_thread);
    make_tmpdir();
    MG_RUN(test_callbacks_after_commit);
    MG_RUN(test_cork_one_commit);
    MG_RUN(test_bound_and_parking);
    MG_RUN(test_other_thread_waits_for_room);
    MG_RUN(test_failed_statement_alone);
    MG_RUN(test_close_delivers);
    MG_RUN(test_callback_survives_sigkill);
    remove_tmpdir();
    return mg_test_summary();
}
