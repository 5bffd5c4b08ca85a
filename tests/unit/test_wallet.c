/* wallet: the prepaid ledger's arithmetic in the store — reservations against the available
 * amount, settlement and release once each, metering_failed kept held until a release with
 * a reason, immutable entries, idempotent top-ups — and mg_wallet_check() finding a wallet
 * that disagrees with its entries. Real SQLite through the store's writer thread. */
#include "mgtest.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "store/store.h"
#include "tenancy/cost.h"
#include "tenancy/wallet.h"

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

typedef struct wait_s {
    int done, rc, granted;
    int64_t rows;
} wait_t;

static void on_reserved(void *ud, int rc, int granted)
{
    wait_t *w = ud;
    w->done = 1, w->rc = rc, w->granted = granted;
}

static void on_rows(void *ud, int rc, int64_t rows)
{
    wait_t *w = ud;
    w->done = 1, w->rc = rc, w->rows = rows;
}

static uv_loop_t loop;
static mg_store_t *st;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

/* Run the loop until the store's callback came (a ticking timer keeps the loop polling: the
 * store's async handle alone does not keep it alive). */
static void run_until(wait_t *w)
{
    uv_timer_t tick;
    uv_timer_init(&loop, &tick);
    uv_timer_start(&tick, on_tick, 1, 1);
    uint64_t end = uv_hrtime() + 10000000000ull;
    while (!w->done && uv_hrtime() < end) uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* 1 granted, 0 refused, -1 store error. */
static int reserve(int64_t tenant, const char *rid, int64_t micros)
{
    wait_t w = {0};
    if (mg_wallet_reserve(st, tenant, rid, micros, 1000, on_reserved, &w) != 0) return -1;
    run_until(&w);
    return w.rc ? -1 : w.granted;
}

/* Rows changed by one statement (ended hold: 1, nothing held: 0), or the negative rc. */
static int64_t sql(const char *text, int n, const char *const *p)
{
    wait_t w = {0};
    if (mg_store_write_rows(st, text, n, p, on_rows, &w) != 0) return -100;
    run_until(&w);
    return w.rc ? w.rc : w.rows;
}

static int64_t settle(const char *rid, int64_t micros)
{
    wait_t w = {0};
    if (mg_wallet_settle(st, rid, micros, 2000, on_rows, &w) != 0) return -100;
    run_until(&w);
    return w.rc ? w.rc : w.rows;
}

static int64_t release(const char *rid)
{
    wait_t w = {0};
    if (mg_wallet_release(st, rid, 2000, on_rows, &w) != 0) return -100;
    run_until(&w);
    return w.rc ? w.rc : w.rows;
}

static int64_t metering_failed(const char *rid)
{
    wait_t w = {0};
    if (mg_wallet_metering_failed(st, rid, 2000, on_rows, &w) != 0) return -100;
    run_until(&w);
    return w.rc ? w.rc : w.rows;
}

static int64_t topup(const char *event, int64_t tenant, int64_t micros)
{
    char t[24], m[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    snprintf(m, sizeof(m), "%lld", (long long)micros);
    const char *p[3] = {event, t, m};
    return sql("INSERT OR IGNORE INTO topups(event_id, tenant_id, amount_micros, at_ms)"
               " VALUES (?1, CAST(?2 AS INTEGER), CAST(?3 AS INTEGER), 1)",
               3, p);
}

static void on_value(void *ud, int ncols, const char *const *cols)
{
    *(long long *)ud = ncols > 0 && cols[0] ? strtoll(cols[0], NULL, 10) : -1;
}

static long long value(const char *q, const char *arg)
{
    long long v = -999;
    char err[128];
    const char *p[1] = {arg};
    if (mg_store_query(st, q, arg ? 1 : 0, p, on_value, &v, err, sizeof(err)) != 0) return -998;
    return v;
}

static long long balance(int64_t tenant)
{
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    return value("SELECT balance_micros FROM wallets WHERE tenant_id = ?1", t);
}

static long long held(int64_t tenant)
{
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)tenant);
    return value("SELECT held_micros FROM wallets WHERE tenant_id = ?1", t);
}

static long problems(void)
{
    char err[256];
    return mg_wallet_check(st, NULL, NULL, NULL, err, sizeof(err));
}

static void test_reserve_settle_release(void)
{
    CHECK_EQ_INT(reserve(1, "r0", 10), 0); /* no wallet at all: nothing to reserve from */
    CHECK_EQ_INT(topup("ev1", 1, 1000), 1);
    CHECK_EQ_INT(balance(1), 1000);
    CHECK_EQ_INT(reserve(1, "r1", 600), 1);
    CHECK_EQ_INT(reserve(1, "r2", 500), 0); /* available 400 */
    CHECK_EQ_INT(reserve(1, "r3", 400), 1); /* exactly what is available */
    CHECK_EQ_INT(held(1), 1000);
    CHECK_EQ_INT(reserve(1, "r4", 0), 0); /* available 0: even a free request waits */
    CHECK_EQ_INT(balance(1), 1000);       /* holds do not move the balance */
    /* settled above its estimate: the balance pays what it cost */
    CHECK_EQ_INT(settle("r1", 700), 1);
    CHECK_EQ_INT(balance(1), 300);
    CHECK_EQ_INT(held(1), 400);
    /* no double settlement, no release after it */
    CHECK_EQ_INT(settle("r1", 700), 0);
    CHECK_EQ_INT(release("r1"), 0);
    CHECK_EQ_INT(balance(1), 300);
    CHECK_EQ_INT(release("r3"), 1);
    CHECK_EQ_INT(release("r3"), 0);
    CHECK_EQ_INT(held(1), 0);
    CHECK_EQ_INT(balance(1), 300);
    CHECK_EQ_INT(settle("never-reserved", 5), 0);
    CHECK_EQ_INT(reserve(1, "r1", 1), -1); /* a request id reserves once (constraint) */
    CHECK_EQ_INT(problems(), 0);
}

static void test_metering_failed_held_until_released_with_reason(void)
{
    CHECK_EQ_INT(topup("ev2", 2, 500), 1);
    CHECK_EQ_INT(reserve(2, "m1", 200), 1);
    CHECK_EQ_INT(metering_failed("m1"), 1);
    CHECK_EQ_INT(held(2), 200);        /* still held */
    CHECK_EQ_INT(settle("m1", 10), 0); /* and not settled by the request path */
    CHECK_EQ_INT(release("m1"), 0);
    CHECK_EQ_INT(reserve(2, "m2", 301), 0); /* available 300 */
    const char *none[1] = {"m1"};
    CHECK(sql("UPDATE ledger_holds SET state = 'released_unmetered' WHERE request_id = ?1", 1,
              none) == MG_STORE_ECONSTRAINT); /* without a reason */
    const char *blank[2] = {"m1", "   "};
    CHECK(sql("UPDATE ledger_holds SET state = 'released_unmetered', reason = ?2"
              " WHERE request_id = ?1",
              2, blank) == MG_STORE_ECONSTRAINT);
    const char *why[2] = {"m1", "provider invoice shows no charge"};
    CHECK_EQ_INT(sql("UPDATE ledger_holds SET state = 'released_unmetered', reason = ?2,"
                     " actor = 'admin' WHERE request_id = ?1 AND state = 'metering_failed'",
                     2, why),
                 1);
    CHECK_EQ_INT(held(2), 0);
    CHECK_EQ_INT(balance(2), 500); /* nothing charged, nothing invented */
    CHECK_EQ_INT(value("SELECT amount_micros FROM ledger_entries WHERE request_id = ?1 AND"
                       " kind = 'release' AND reason IS NOT NULL",
                       "m1"),
                 0);
    CHECK(sql("UPDATE ledger_holds SET state = 'held' WHERE request_id = ?1", 1, none) ==
          MG_STORE_ECONSTRAINT);
    CHECK_EQ_INT(problems(), 0);
}

static void test_entries_immutable_topups_idempotent(void)
{
    CHECK(sql("UPDATE ledger_entries SET amount_micros = 1", 0, NULL) == MG_STORE_ECONSTRAINT);
    CHECK(sql("DELETE FROM ledger_entries", 0, NULL) == MG_STORE_ECONSTRAINT);
    CHECK(sql("DELETE FROM ledger_holds", 0, NULL) == MG_STORE_ECONSTRAINT);
    long long before = balance(1);
    CHECK_EQ_INT(topup("ev1", 1, 1000), 0); /* the same event again: nothing */
    CHECK_EQ_INT(topup("ev1", 2, 5), 0);    /* its id is taken, whatever it says */
    CHECK_EQ_INT(balance(1), before);
    CHECK_EQ_INT(topup("ev-neg", 1, -5), 0); /* the CHECK refuses it (OR IGNORE: quietly) */
    CHECK_EQ_INT(topup("ev-zero", 1, 0), 0);
    CHECK_EQ_INT(balance(1), before);
    /* an adjustment needs its source id; a reserve needs its request id */
    CHECK(sql("INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, at_ms)"
              " VALUES (1, 'adjustment', 5, 0, 1)",
              0, NULL) == MG_STORE_ECONSTRAINT);
    CHECK(sql("INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros, at_ms)"
              " VALUES (1, 'reserve', 0, 5, 1)",
              0, NULL) == MG_STORE_ECONSTRAINT);
    CHECK_EQ_INT(sql("INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros,"
                     " source_id, reason, at_ms) VALUES (1, 'adjustment', -50, 0, 'adj-1',"
                     " 'goodwill reversal', 1)",
                     0, NULL),
                 1);
    CHECK_EQ_INT(balance(1), before - 50);
    CHECK_EQ_INT(problems(), 0);
}

/* A random mix of top-ups, reservations, settlements (above and below the estimate),
 * releases, repeats and metering failures against a model of the wallet kept here. */
static void test_random_mix_matches_model(void)
{
    enum { N = 300 };
    static int state[N]; /* 0 none, 1 held, 2 ended, 3 metering_failed */
    static int64_t est[N];
    int64_t bal = 0, hold = 0;
    unsigned seed = 12345;
    char rid[32], ev[32];
    int topups = 0;
    for (int step = 0; step < 1500; step++) {
        seed = seed * 1103515245u + 12345u;
        int r = (int)((seed >> 8) % (unsigned)N), op = (int)((seed >> 20) % 6);
        snprintf(rid, sizeof(rid), "x%d", r);
        if (op == 0) {
            int64_t amt = 1 + (int64_t)((seed >> 4) % 500);
            snprintf(ev, sizeof(ev), "e%d", topups++ % 40); /* repeats: ignored */
            int64_t rows = topup(ev, 3, amt);
            if (rows == 1) bal += amt;
        } else if (op == 1 && state[r] == 0) {
            int64_t e = (int64_t)((seed >> 6) % 300);
            int g = reserve(3, rid, e);
            int want = bal - hold >= (e > 1 ? e : 1);
            CHECK_EQ_INT(g, want);
            if (g == 1) state[r] = 1, est[r] = e, hold += e;
            else if (g == 0) state[r] = 2; /* refused: never reserved; keep it unused */
        } else if (op == 2) {
            int64_t actual = (int64_t)((seed >> 5) % 400);
            int64_t rows = settle(rid, actual);
            CHECK_EQ_INT(rows, state[r] == 1);
            if (state[r] == 1) bal -= actual, hold -= est[r], state[r] = 2;
        } else if (op == 3) {
            int64_t rows = release(rid);
            CHECK_EQ_INT(rows, state[r] == 1);
            if (state[r] == 1) hold -= est[r], state[r] = 2;
        } else if (op == 4) {
            int64_t rows = metering_failed(rid);
            CHECK_EQ_INT(rows, state[r] == 1);
            if (state[r] == 1) state[r] = 3;
        }
    }
    if (balance(3) != -999) {
        CHECK_EQ_INT(balance(3), bal);
        CHECK_EQ_INT(held(3), hold);
    } else {
        CHECK_EQ_INT(bal, 0);
    }
    CHECK_EQ_INT(problems(), 0);
}

static void test_check_finds_tampering(void)
{
    CHECK_EQ_INT(problems(), 0);
    CHECK_EQ_INT(
        sql("UPDATE wallets SET balance_micros = balance_micros + 1 WHERE tenant_id = 1", 0, NULL),
        1);
    CHECK(problems() >= 1);
    CHECK_EQ_INT(sql("UPDATE wallets SET balance_micros = balance_micros - 1,"
                     " held_micros = held_micros + 7 WHERE tenant_id = 1",
                     0, NULL),
                 1);
    CHECK(problems() >= 2); /* held differs from the entries and from the open holds */
    CHECK_EQ_INT(
        sql("UPDATE wallets SET held_micros = held_micros - 7 WHERE tenant_id = 1", 0, NULL), 1);
    CHECK_EQ_INT(problems(), 0);
}

static void test_recover_marks_open_holds(void)
{
    CHECK_EQ_INT(topup("ev-rec", 4, 100), 1);
    CHECK_EQ_INT(reserve(4, "open1", 30), 1);
    CHECK_EQ_INT(mg_wallet_recover(st, 5000), 0);
    mg_store_flush(st);
    CHECK_EQ_INT(value("SELECT COUNT(*) FROM ledger_holds WHERE request_id = ?1 AND"
                       " state = 'metering_failed'",
                       "open1"),
                 1);
    CHECK_EQ_INT(held(4), 30);
    CHECK_EQ_INT(problems(), 0);
}

static void test_cost_rounding(void)
{
    mg_provider_conf_t p;
    memset(&p, 0, sizeof(p));
    p.cost_per_1k_tokens = 0.002;
    mg_cost_rate_t r = mg_cost_rate_of(&p);
    CHECK_EQ_INT(mg_cost_micros(r, 1000, 0), 2000);
    CHECK_EQ_INT(mg_cost_micros(r, 600, 400), 2000);
    CHECK_EQ_INT(mg_cost_micros(r, 1, 0), 2); /* 1.999.. rounds up */
    p.cost_per_1k_tokens = 0.0001;            /* 0.1 micro a token */
    r = mg_cost_rate_of(&p);
    CHECK_EQ_INT(mg_cost_micros(r, 1, 0), 1); /* a priced request never costs nothing */
    CHECK_EQ_INT(mg_cost_micros(r, 0, 0), 0);
    CHECK_EQ_INT(mg_cost_micros(r, -5, -5), 0);
    CHECK_EQ_INT(mg_cost_micros(mg_cost_rate_of(NULL), 1000, 1000), 0);
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-wallet-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/w.db", tmpdir);
    uv_loop_init(&loop);
    if (mg_store_open(path, &st, err, sizeof(err)) != 0 || mg_store_attach(st, &loop) != 0) {
        fprintf(stderr, "store: %s\n", err);
        return 1;
    }
    MG_RUN(test_cost_rounding);
    MG_RUN(test_reserve_settle_release);
    MG_RUN(test_metering_failed_held_until_released_with_reason);
    MG_RUN(test_entries_immutable_topups_idempotent);
    MG_RUN(test_random_mix_matches_model);
    MG_RUN(test_check_finds_tampering);
    MG_RUN(test_recover_marks_open_holds);
    mg_store_close(st);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return mg_test_summary();
}
