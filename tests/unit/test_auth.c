/* Unit tests for core/tenancy/auth.c against a real store in a temp directory: keys are written
 * with SQL (as the admin API does) and loaded with mg_auth_load. The matrix: no key,
 * unknown, expired, disabled, revoked -> 401; scope, model, priority -> 403; key RPM, TPM
 * and project limits -> 429 with a retry; a project refusal rolls back the key level;
 * release exactly once; spend limits metered, persisted and reset per period; rotation and reloads
 * keep exactly one of the two keys valid and carry the rate-limit window; last_used_at is written
 * through the writer thread; keys come from Authorization: Bearer or x-api-key. Memory: a key or
 * project without rpm/tpm limits holds no rate window; a policy update that sets the first limit
 * starts enforcing it, changing a limit keeps the window's counts, lifting the limits frees the
 * window even while a granted result holds the level. */
#include "tenancy/auth.h"
#include "mgtest.h"
#include "store/store.h"

#include <ftw.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];
static char dbpath[300];
static mg_store_t *st;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void setup(void)
{
    char err[256];
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-auth-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(dbpath, sizeof(dbpath), "%s/moongate.db", tmpdir);
    if (mg_store_open(dbpath, &st, err, sizeof(err)) != 0) {
        fprintf(stderr, "store: %s\n", err);
        exit(1);
    }
}

static void teardown(void)
{
    mg_store_close(st);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Run one statement in its own admin transaction; returns the last insert id (or -1). */
static int64_t sql(const char *q, int n, const char *const *p)
{
    char err[256];
    mg_store_tx_t *tx;
    if (mg_store_tx_begin(st, &tx, err, sizeof(err)) != 0) return -1;
    if (mg_store_tx_exec(tx, q, n, p, NULL, NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "sql: %s: %s\n", q, err);
        mg_store_tx_rollback(tx);
        return -1;
    }
    int64_t id = mg_store_tx_last_id(tx);
    return mg_store_tx_commit(tx, err, sizeof(err)) == 0 ? id : -1;
}

static uint64_t now_ms(void)
{
    return (uint64_t)time(NULL) * 1000;
}

static int64_t tenant_id, project_id;

static void base_rows(void)
{
    const char *t[1] = {"acme"};
    tenant_id = sql("INSERT INTO tenants(name, created_at) VALUES (?1, 1)", 1, t);
    char tid[24];
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant_id);
    const char *p[1] = {tid};
    project_id =
        sql("INSERT INTO projects(tenant_id, name, created_at) VALUES (?1, 'web', 1)", 1, p);
}

/* Options of a test key; NULL / 0 = the column's default. */
typedef struct {
    int project; /* 1 = in the test project */
    const char *scopes, *models, *priorities;
    const char *rpm, *tpm, *conc, *daily;
    const char *expires_at;
    const char *enabled;
    const char *revoked_at;
} kopt_t;

/* Create a key row; its clear key goes to out[MG_KEY_LEN + 1]. Returns its id. */
static int64_t add_key(const kopt_t *o, char *out)
{
    unsigned char d[MG_KEY_DIGEST_LEN];
    char hex[65], disp[MG_KEY_DISPLAY_MAX], tid[24], pid[24];
    mg_key_generate(out);
    mg_key_digest(out, MG_KEY_LEN, d);
    mg_auth_digest_hex(d, hex);
    mg_key_display(out, disp);
    snprintf(tid, sizeof(tid), "%lld", (long long)tenant_id);
    snprintf(pid, sizeof(pid), "%lld", (long long)project_id);
    const char *p[14] = {tid,
                         o->project ? pid : NULL,
                         hex,
                         disp,
                         o->scopes ? o->scopes : "[\"inference\"]",
                         o->models ? o->models : "[]",
                         o->priorities ? o->priorities : "[\"P0\",\"P1\",\"P2\",\"P3\",\"P4\"]",
                         o->rpm ? o->rpm : "0",
                         o->tpm ? o->tpm : "0",
                         o->conc ? o->conc : "0",
                         o->daily ? o->daily : "0",
                         o->expires_at,
                         o->enabled ? o->enabled : "1",
                         o->revoked_at};
    return sql("INSERT INTO api_keys(tenant_id, project_id, digest, display, scopes, models,"
               " priorities, rpm_limit, tpm_limit, max_concurrency, daily_limit_micros,"
               " expires_at, enabled, revoked_at, created_at)"
               " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 1)",
               14, p);
}

static mg_auth_t *load(void)
{
    char err[256];
    mg_auth_t *a = mg_auth_new();
    if (!a || mg_auth_load(a, st, err, sizeof(err)) != 0) {
        fprintf(stderr, "load: %s\n", err);
        exit(1);
    }
    return a;
}

static void reload(mg_auth_t *a)
{
    char err[256];
    if (mg_auth_load(a, st, err, sizeof(err)) != 0) fprintf(stderr, "reload: %s\n", err);
}

/* Check key k (NUL-terminated or NULL) for model "chat" at P2; releases at once when
 * granted. Returns the status (0 = allowed). */
static int try_key(mg_auth_t *a, const char *k, uint64_t at, mg_auth_result_t *r)
{
    int rc = mg_auth_check_key(a, k, k ? strlen(k) : 0, "chat", "P2", at, 10, r);
    if (rc == 0) {
        mg_auth_release(r);
        return 0;
    }
    return r->status;
}

/* ---- 401 --------------------------------------------------------------------------------- */

static void test_unauthenticated(void)
{
    char ok[64], expired[64], disabled[64], revoked[64], unknown[64];
    kopt_t o = {0};
    add_key(&o, ok);
    kopt_t e = {.expires_at = "1000"};
    add_key(&e, expired);
    kopt_t d = {.enabled = "0"};
    add_key(&d, disabled);
    kopt_t v = {.revoked_at = "5"};
    add_key(&v, revoked);
    mg_key_generate(unknown);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    CHECK_EQ_INT(mg_auth_key_count(a), 3); /* the revoked key is not loaded */
    CHECK_EQ_INT(try_key(a, ok, now_ms(), &r), 0);
    CHECK_STR(r.reason, "ok");
    CHECK(strncmp(r.key_display, "mg-", 3) == 0 && strstr(ok, r.key_display + 6) != NULL);
    CHECK_EQ_INT(r.tenant_id, tenant_id);
    struct {
        const char *key;
        const char *reason;
    } cases[] = {{NULL, "missing"},      {"", "missing"},      {unknown, "unknown"},
                 {"garbage", "unknown"}, {expired, "expired"}, {disabled, "disabled"},
                 {revoked, "unknown"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        CHECK_EQ_INT(try_key(a, cases[i].key, now_ms(), &r), 401);
        CHECK_STR(r.code, "AUTH_FAILED");
        CHECK_STR(r.reason, cases[i].reason);
        CHECK_EQ_INT(r.held, 0);
        /* the message never contains the presented key */
        if (cases[i].key && *cases[i].key) CHECK(strstr(r.message, cases[i].key) == NULL);
    }
    /* expiry is checked against the time given, on every call */
    char soon[64], at[24];
    snprintf(at, sizeof(at), "%lld", (long long)(time(NULL) + 100));
    kopt_t s = {.expires_at = at};
    add_key(&s, soon);
    reload(a);
    CHECK_EQ_INT(try_key(a, soon, now_ms(), &r), 0);
    CHECK_EQ_INT(try_key(a, soon, now_ms() + 100000, &r), 401);
    CHECK_STR(r.reason, "expired");
    mg_auth_free(a);
}

/* ---- 403 --------------------------------------------------------------------------------- */

static void test_forbidden(void)
{
    char noscope[64], model[64], prio[64];
    kopt_t o1 = {.scopes = "[\"models\"]"};
    add_key(&o1, noscope);
    kopt_t o2 = {.models = "[\"other\",\"chat\"]"};
    add_key(&o2, model);
    kopt_t o3 = {.priorities = "[\"P2\",\"P3\"]"};
    add_key(&o3, prio);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    CHECK_EQ_INT(try_key(a, noscope, now_ms(), &r), 403);
    CHECK_STR(r.code, "PERMISSION_DENIED");
    CHECK_STR(r.reason, "scope");
    CHECK_EQ_INT(try_key(a, model, now_ms(), &r), 0);
    CHECK_EQ_INT(mg_auth_check_key(a, model, strlen(model), "secret-model", "P2", now_ms(), 1, &r),
                 -1);
    CHECK_EQ_INT(r.status, 403);
    CHECK_STR(r.reason, "model");
    CHECK_EQ_INT(mg_auth_check_key(a, prio, strlen(prio), "chat", "P0", now_ms(), 1, &r), -1);
    CHECK_EQ_INT(r.status, 403);
    CHECK_STR(r.reason, "priority");
    CHECK_EQ_INT(mg_auth_check_key(a, prio, strlen(prio), "chat", "P3", now_ms(), 1, &r), 0);
    mg_auth_release(&r);
    /* no priority given = P2 */
    CHECK_EQ_INT(mg_auth_check_key(a, prio, strlen(prio), "chat", NULL, now_ms(), 1, &r), 0);
    mg_auth_release(&r);
    mg_auth_free(a);
}

/* ---- 429 --------------------------------------------------------------------------------- */

static void test_key_rpm(void)
{
    char k[64];
    kopt_t o = {.rpm = "2"};
    add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t + 10, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t + 20, &r), 429);
    CHECK_STR(r.code, "RATE_LIMITED");
    CHECK_STR(r.reason, "rpm");
    CHECK_STR(r.level, "key");
    CHECK(r.retry_after_ms >= 1000 && r.retry_after_ms <= 60000);
    CHECK_EQ_INT(r.held, 0);
    /* a minute later the window has room again */
    CHECK_EQ_INT(try_key(a, k, t + 61000, &r), 0);
    mg_auth_free(a);
}

static void test_key_tpm_settle(void)
{
    char k[64];
    kopt_t o = {.tpm = "1000"};
    add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r1, r2;
    uint64_t t = now_ms();
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 600, &r1), 0);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 600, &r2), -1);
    CHECK_EQ_INT(r2.status, 429);
    CHECK_STR(r2.reason, "tpm");
    /* the answer really cost 100 tokens: the window learns it, 600 more fit */
    mg_auth_settle(&r1, 100);
    mg_auth_settle(&r1, 5000); /* once only */
    mg_auth_release(&r1);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 600, &r2), 0);
    mg_auth_release(&r2);
    /* more than the whole limit: refused, waiting cannot help */
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 2000, &r2), -1);
    CHECK_STR(r2.reason, "too_large");
    CHECK_EQ_INT(r2.status, 429);
    mg_auth_free(a);
}

/* The project refuses while the key has room: the key level's take is rolled back. */
static void test_project_rollback(void)
{
    char k[64];
    kopt_t o = {.project = 1, .rpm = "2"};
    add_key(&o, k);
    const char *p[1] = {"1"};
    char pid[24];
    snprintf(pid, sizeof(pid), "%lld", (long long)project_id);
    p[0] = pid;
    sql("UPDATE projects SET rpm_limit = 1, max_concurrency = 5 WHERE id = ?1", 1, p);
    mg_auth_t *a = load();
    mg_auth_result_t r1, r2;
    uint64_t t = now_ms();
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 5, &r1), 0);
    CHECK_EQ_INT(r1.n_levels, 2);
    CHECK_EQ_INT(r1.project_id, project_id);
    mg_quota_level_t *keylv = r1.res.levels[0], *projlv = r1.res.levels[1];
    CHECK_EQ_INT(keylv->win->requests, 1);
    CHECK_EQ_INT(keylv->in_flight, 1);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 5, &r2), -1);
    CHECK_EQ_INT(r2.status, 429);
    CHECK_STR(r2.level, "project");
    CHECK(r2.retry_after_ms >= 1000);
    /* nothing of the refused request stays at the key level */
    CHECK_EQ_INT(keylv->win->requests, 1);
    CHECK_EQ_INT(keylv->win->tokens, 5);
    CHECK_EQ_INT(keylv->in_flight, 1);
    CHECK_EQ_INT(projlv->win->requests, 1);
    /* lift the project's limit: the key's own limit (2) now admits exactly one more */
    mg_auth_project_t pj = {.id = project_id, .tenant_id = tenant_id, .max_concurrency = 5};
    CHECK_EQ_INT(mg_auth_put_project(a, &pj), 0);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 5, &r2), 0);
    mg_auth_release(&r2);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 5, &r2), -1);
    CHECK_STR(r2.level, "key");
    mg_auth_release(&r1);
    CHECK_EQ_INT(keylv->in_flight, 0);
    CHECK_EQ_INT(projlv->in_flight, 0);
    mg_auth_free(a);
}

static void test_project_concurrency(void)
{
    char k1[64], k2[64];
    kopt_t o = {.project = 1};
    add_key(&o, k1);
    add_key(&o, k2);
    char pid[24];
    snprintf(pid, sizeof(pid), "%lld", (long long)project_id);
    const char *p[1] = {pid};
    sql("UPDATE projects SET max_concurrency = 1 WHERE id = ?1", 1, p);
    mg_auth_t *a = load();
    mg_auth_result_t r1, r2;
    CHECK_EQ_INT(mg_auth_check_key(a, k1, strlen(k1), "chat", "P2", now_ms(), 1, &r1), 0);
    /* another key of the same project: the project's lease is taken */
    CHECK_EQ_INT(mg_auth_check_key(a, k2, strlen(k2), "chat", "P2", now_ms(), 1, &r2), -1);
    CHECK_STR(r2.reason, "concurrency");
    CHECK_STR(r2.level, "project");
    CHECK_EQ_INT(r2.retry_after_ms, MG_AUTH_MIN_RETRY_MS);
    mg_auth_release(&r1);
    CHECK_EQ_INT(mg_auth_check_key(a, k2, strlen(k2), "chat", "P2", now_ms(), 1, &r2), 0);
    mg_auth_release(&r2);
    mg_auth_free(a);
}

/* A lease goes back exactly once however often release is called. */
static void test_release_once(void)
{
    char k[64];
    kopt_t o = {.conc = "1"};
    add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r1, r2, r3;
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", now_ms(), 1, &r1), 0);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", now_ms(), 1, &r2), -1);
    CHECK_STR(r2.reason, "concurrency");
    mg_auth_release(&r2); /* refused: nothing to release */
    mg_auth_release(&r1);
    mg_auth_release(&r1); /* again: no effect */
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", now_ms(), 1, &r2), 0);
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", now_ms(), 1, &r3), -1);
    mg_auth_release(&r2);
    /* a reservation outlives the auth state and its key (levels are refcounted) */
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", now_ms(), 1, &r3), 0);
    mg_auth_free(a);
    mg_auth_settle(&r3, 3);
    mg_auth_release(&r3);
    CHECK_EQ_INT(r3.held, 0);
}

/* Charge one granted request of key k at `at`. */
static void spend(mg_auth_t *a, const char *k, uint64_t at, int64_t micros)
{
    mg_auth_result_t r;
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", at, 10, &r), 0);
    mg_auth_charge(a, &r, micros, at, NULL, NULL);
    mg_auth_release(&r);
}

static void test_spend_limits(void)
{
    char k[64];
    kopt_t o = {.project = 1, .daily = "1000"};
    int64_t id = add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    /* metered: within the limit until the charges reach it */
    spend(a, k, t, 600);
    spend(a, k, t, 399);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    spend(a, k, t, 1);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    CHECK_STR(r.code, "QUOTA_EXCEEDED");
    CHECK_STR(r.reason, "daily_spend");
    CHECK(r.retry_after_ms >= 1000 && r.retry_after_ms <= 86400000);
    /* the figures are in the store: a state loaded afresh (a restart) still refuses */
    mg_store_flush(st);
    mg_auth_t *b = load();
    CHECK_EQ_INT(try_key(b, k, t, &r), 429);
    CHECK_STR(r.reason, "daily_spend");
    mg_auth_free(b);
    /* the next UTC day starts at zero */
    CHECK_EQ_INT(try_key(a, k, t + 86400000, &r), 0);
    mg_auth_set_spend(a, id, 0, 0, 0, t);
    /* the project's monthly quota */
    mg_auth_project_t pj = {.id = project_id, .tenant_id = tenant_id, .monthly_limit_micros = 50};
    mg_auth_put_project(a, &pj);
    mg_auth_set_spend(a, 0, project_id, 10, 60, t);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    CHECK_STR(r.reason, "monthly_spend");
    CHECK_STR(r.level, "project");
    mg_auth_free(a);
}

/* Admit one request of key k with an estimated cost of est micros: 0 (held) or the status. */
static int admit_cost(mg_auth_t *a, const char *k, uint64_t at, int64_t est, mg_auth_result_t *r)
{
    if (mg_auth_authenticate_key(a, k, strlen(k), at, r) != 0) return r->status;
    return mg_auth_admit(a, r, "chat", "P2", at, 10, est) == 0 ? 0 : r->status;
}

/* The estimate is held from admission: requests in flight count against the limit, the charge
 * replaces the estimate with the actual cost, a release gives it back; the tenant's limits
 * count every key of the tenant. */
static void test_spend_reservation(void)
{
    char k[64], k2[64];
    kopt_t o = {.daily = "1000"};
    int64_t id = add_key(&o, k);
    kopt_t o2 = {0};
    add_key(&o2, k2);
    mg_auth_t *a = load();
    mg_auth_result_t r1, r2, r3;
    uint64_t t = now_ms() + 3 * 86400000ull; /* a day nothing else spent in */
    CHECK_EQ_INT(admit_cost(a, k, t, 600, &r1), 0);
    CHECK_EQ_INT(mg_auth_spend_held(a, 0, id), 600);
    CHECK_EQ_INT(admit_cost(a, k, t, 600, &r2), 429); /* 600 held + 600 > 1000 */
    CHECK_STR(r2.code, "QUOTA_EXCEEDED");
    CHECK(strstr(r2.message, "in flight hold 600") != NULL);
    CHECK(r2.retry_after_ms >= 1000 && r2.retry_after_ms <= 86400000);
    CHECK_EQ_INT(admit_cost(a, k, t, 1001, &r2), 429); /* alone above the limit */
    mg_auth_release(&r1);                              /* failed: nothing charged, the hold goes */
    CHECK_EQ_INT(mg_auth_spend_held(a, 0, id), 0);
    CHECK_EQ_INT(admit_cost(a, k, t, 600, &r2), 0);
    mg_auth_charge(a, &r2, 300, t, NULL, NULL); /* the actual cost replaces the estimate */
    CHECK_EQ_INT(mg_auth_spend_held(a, 0, id), 0);
    mg_auth_release(&r2);
    CHECK_EQ_INT(mg_auth_spend_held(a, 0, id), 0);
    CHECK_EQ_INT(admit_cost(a, k, t, 701, &r3), 429); /* 300 spent + 701 > 1000 */
    CHECK_EQ_INT(admit_cost(a, k, t, 700, &r3), 0);
    mg_auth_release(&r3);
    /* the tenant's daily limit: both keys count */
    mg_auth_tenant_t tn = {.id = tenant_id, .daily_limit_micros = 2000};
    CHECK_EQ_INT(mg_auth_put_tenant(a, &tn), 0);
    CHECK_EQ_INT(admit_cost(a, k2, t, 1500, &r1), 0);
    CHECK_EQ_INT(mg_auth_spend_held(a, 2, tenant_id), 1500);
    CHECK_EQ_INT(admit_cost(a, k2, t, 300, &r2), 429); /* tenant: 300 + 1500 + 300 > 2000 */
    CHECK_STR(r2.level, "tenant");
    mg_auth_charge(a, &r1, 100, t, NULL, NULL);
    mg_auth_release(&r1);
    CHECK_EQ_INT(admit_cost(a, k2, t, 300, &r2), 0);
    mg_auth_release(&r2);
    CHECK_EQ_INT(mg_auth_spend_held(a, 2, tenant_id), 0);
    mg_auth_free(a);
}

/* ---- changes: disable, policy reload, rotation ---------------------------------------------- */

/* The record of key id as the store has it (one reference). */
static void rec_cb(void *ud, int n, const char *const *c)
{
    *(mg_key_record_t **)ud = mg_auth_record_from_row(n, c);
}

static mg_key_record_t *record_of(int64_t id)
{
    char err[256], sid[24];
    mg_key_record_t *rec = NULL;
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    const char *p[1] = {sid};
    mg_store_query(st, "SELECT " MG_AUTH_KEY_COLUMNS " FROM api_keys WHERE id = ?1", 1, p, rec_cb,
                   &rec, err, sizeof(err));
    return rec;
}

static void test_disable_enable(void)
{
    char k[64], sid[24];
    kopt_t o = {0};
    int64_t id = add_key(&o, k);
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    const char *p[1] = {sid};
    sql("UPDATE api_keys SET enabled = 0 WHERE id = ?1", 1, p);
    mg_key_record_t *rec = record_of(id);
    CHECK(rec != NULL);
    CHECK_EQ_INT(mg_auth_put_key(a, rec), 0);
    mg_key_record_unref(rec);
    CHECK_EQ_INT(try_key(a, k, now_ms(), &r), 401); /* the next request sees it */
    CHECK_STR(r.reason, "disabled");
    sql("UPDATE api_keys SET enabled = 1 WHERE id = ?1", 1, p);
    rec = record_of(id);
    CHECK_EQ_INT(mg_auth_put_key(a, rec), 0);
    mg_key_record_unref(rec);
    CHECK_EQ_INT(try_key(a, k, now_ms(), &r), 0);
    /* removal */
    unsigned char d[MG_KEY_DIGEST_LEN];
    mg_key_digest(k, strlen(k), d);
    CHECK_EQ_INT(mg_auth_remove_key(a, d), 0);
    CHECK_EQ_INT(mg_auth_remove_key(a, d), MG_KEYS_ENOENT);
    CHECK_EQ_INT(try_key(a, k, now_ms(), &r), 401);
    mg_auth_free(a);
}

/* A policy change through the store and a reload: the window of the key survives. */
static void test_reload_keeps_window(void)
{
    char k[64], sid[24];
    kopt_t o = {.rpm = "1"};
    int64_t id = add_key(&o, k);
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    reload(a);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429); /* same window after a reload */
    const char *p[1] = {sid};
    sql("UPDATE api_keys SET rpm_limit = 2 WHERE id = ?1", 1, p);
    reload(a);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0); /* one more under the new limit */
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    mg_auth_free(a);
}

/* ---- memory: the rate window only where a limit needs it ------------------------------------ */

static size_t windows(const mg_auth_t *a)
{
    mg_auth_memory_t m;
    mg_auth_memory(a, &m);
    return m.windows;
}

/* Set key id's rate limits in the store and apply the row as the admin API does. */
static int put_limits(mg_auth_t *a, int64_t id, const char *rpm, const char *tpm, const char *conc)
{
    char sid[24];
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    const char *p[4] = {sid, rpm, tpm, conc};
    sql("UPDATE api_keys SET rpm_limit = ?2, tpm_limit = ?3, max_concurrency = ?4 WHERE id = ?1", 4,
        p);
    mg_key_record_t *rec = record_of(id);
    int rc = rec ? mg_auth_put_key(a, rec) : -1;
    mg_key_record_unref(rec);
    return rc;
}

/* (a) Keys (and a project) without rpm/tpm limits allocate no window; a small level each. */
static void test_memory_no_window(void)
{
    char k1[64], k2[64], k3[64], k4[64];
    kopt_t none = {.project = 1}, conc = {.conc = "2"}, rpm = {.rpm = "5"};
    add_key(&none, k1);
    add_key(&none, k2);
    add_key(&conc, k3);
    mg_auth_t *a = load();
    mg_auth_memory_t m0, m1;
    mg_auth_memory(a, &m0);
    CHECK_EQ_INT(m0.keys, 3);
    CHECK_EQ_INT(m0.windows, 0); /* concurrency alone is a counter */
    CHECK_EQ_INT(m0.window_bytes, 0);
    CHECK(m0.index_bytes > 0);
    mg_auth_result_t r;
    CHECK_EQ_INT(try_key(a, k1, now_ms(), &r), 0); /* using a key allocates nothing either */
    CHECK_EQ_INT(try_key(a, k3, now_ms(), &r), 0);
    CHECK_EQ_INT(windows(a), 0);
    /* one more key through the admin path: its level is small (the table has room) */
    int64_t id4 = add_key(&rpm, k4);
    CHECK_EQ_INT(put_limits(a, id4, "0", "0", "0"), 0);
    mg_auth_memory(a, &m1);
    CHECK_EQ_INT(m1.windows, 0);
    CHECK(m1.level_bytes > m0.level_bytes && m1.level_bytes - m0.level_bytes <= 96);
    /* an rpm limit: one window, of the quota module's size */
    CHECK_EQ_INT(put_limits(a, id4, "5", "0", "0"), 0);
    mg_auth_memory(a, &m1);
    CHECK_EQ_INT(m1.windows, 1);
    CHECK_EQ_INT(m1.window_bytes, sizeof(mg_quota_window_t));
    mg_auth_free(a);
}

/* (b) A policy update that gives a limit-free key an rpm limit enforces it from then on. */
static void test_put_key_adds_limit(void)
{
    char k[64];
    kopt_t o = {0};
    int64_t id = add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(put_limits(a, id, "2", "0", "0"), 0);
    CHECK_EQ_INT(windows(a), 1);
    /* counting starts with the limit: the five earlier requests were not counted */
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    CHECK_STR(r.reason, "rpm");
    CHECK_EQ_INT(try_key(a, k, t + 61000, &r), 0);
    mg_auth_free(a);
}

/* (c) Changing a limit (or trading rpm for tpm) keeps the window and its counts. */
static void test_limit_change_keeps_counts(void)
{
    char k[64];
    kopt_t o = {.rpm = "2"};
    int64_t id = add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    CHECK_EQ_INT(try_key(a, k, t, &r), 0); /* 10 tokens each */
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    CHECK_EQ_INT(put_limits(a, id, "3", "0", "0"), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0); /* one more under the new limit, not three */
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    CHECK_EQ_INT(put_limits(a, id, "0", "35", "0"), 0); /* tpm alone keeps the window */
    CHECK_EQ_INT(windows(a), 1);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429); /* 30 tokens counted + 10 > 35 */
    CHECK_STR(r.reason, "tpm");
    CHECK_EQ_INT(put_limits(a, id, "0", "40", "0"), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    mg_auth_free(a);
}

/* (d) Lifting the limits frees the window at once, while a granted result still holds the
 * level; settling and releasing that result afterwards is safe (ASan) and exact. */
static void test_lift_limits_while_held(void)
{
    char k[64], pid[24];
    kopt_t o = {.project = 1, .rpm = "5", .tpm = "1000", .conc = "1"};
    int64_t id = add_key(&o, k);
    snprintf(pid, sizeof(pid), "%lld", (long long)project_id);
    const char *p[1] = {pid};
    sql("UPDATE projects SET rpm_limit = 10 WHERE id = ?1", 1, p);
    mg_auth_t *a = load();
    CHECK_EQ_INT(windows(a), 2);
    mg_auth_result_t held, r;
    uint64_t t = now_ms();
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 100, &held), 0);
    CHECK_EQ_INT(put_limits(a, id, "0", "0", "1"), 0); /* the key keeps its concurrency */
    mg_auth_project_t pj = {.id = project_id, .tenant_id = tenant_id};
    CHECK_EQ_INT(mg_auth_put_project(a, &pj), 0);
    CHECK_EQ_INT(windows(a), 0);
    CHECK_EQ_INT(try_key(a, k, t, &r), 429); /* the held lease still counts */
    CHECK_STR(r.reason, "concurrency");
    mg_auth_settle(&held, 900);
    mg_auth_release(&held);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    /* and the other way: a window given while a result holds a window-less level */
    CHECK_EQ_INT(mg_auth_check_key(a, k, strlen(k), "chat", "P2", t, 100, &held), 0);
    CHECK_EQ_INT(put_limits(a, id, "1", "0", "0"), 0);
    mg_auth_settle(&held, 900);
    mg_auth_release(&held);
    CHECK_EQ_INT(try_key(a, k, t, &r), 0); /* the new window counted nothing before */
    CHECK_EQ_INT(try_key(a, k, t, &r), 429);
    mg_auth_free(a);
}

/* 1 when k authenticates (allowed, or refused only by a rate limit). */
static int valid(mg_auth_t *a, const char *k)
{
    mg_auth_result_t r;
    return try_key(a, k, now_ms(), &r) != 401;
}

/* Rotation as the admin API does it: one transaction (revoke old, insert new), then one
 * index step. Before the step only the old key is valid, after it only the new one; a
 * reload from the store agrees; the new key inherits the old one's window. */
static void test_rotation(void)
{
    char oldk[64], newk[64], sid[24], nid[24], at[24];
    kopt_t o = {.rpm = "1"};
    int64_t id = add_key(&o, oldk);
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    uint64_t t = now_ms();
    CHECK_EQ_INT(try_key(a, oldk, t, &r), 0); /* uses the window's only request */

    unsigned char od[MG_KEY_DIGEST_LEN], nd[MG_KEY_DIGEST_LEN];
    char hex[65], disp[MG_KEY_DISPLAY_MAX], err[256];
    mg_key_digest(oldk, strlen(oldk), od);
    mg_key_generate(newk);
    mg_key_digest(newk, strlen(newk), nd);
    mg_auth_digest_hex(nd, hex);
    mg_key_display(newk, disp);
    snprintf(at, sizeof(at), "%lld", (long long)time(NULL));
    mg_store_tx_t *tx;
    CHECK_EQ_INT(mg_store_tx_begin(st, &tx, err, sizeof(err)), 0);
    const char *p1[2] = {sid, at};
    CHECK(mg_store_tx_exec(tx, "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1", 2, p1, NULL,
                           NULL, err, sizeof(err)) == 1);
    const char *p2[4] = {sid, hex, disp, at};
    CHECK(mg_store_tx_exec(tx,
                           "INSERT INTO api_keys(tenant_id, digest, display, created_at, scopes,"
                           " models, priorities, rpm_limit, enabled) SELECT tenant_id, ?2, ?3, ?4,"
                           " scopes, models, priorities, rpm_limit, enabled FROM api_keys"
                           " WHERE id = ?1",
                           4, p2, NULL, NULL, err, sizeof(err)) == 1);
    snprintf(nid, sizeof(nid), "%lld", (long long)mg_store_tx_last_id(tx));
    /* the database has changed but not committed, the index not at all: old only */
    CHECK(valid(a, oldk) && !valid(a, newk));
    CHECK_EQ_INT(mg_store_tx_commit(tx, err, sizeof(err)), 0);
    CHECK(valid(a, oldk) && !valid(a, newk)); /* committed; memory follows in one step */
    mg_key_record_t *rec = record_of(strtoll(nid, NULL, 10));
    CHECK(rec != NULL);
    CHECK_EQ_INT(mg_auth_rotate_key(a, od, rec), 0);
    mg_key_record_unref(rec);
    CHECK(!valid(a, oldk) && valid(a, newk));
    /* the new key inherits the window: no fresh minute by rotating */
    CHECK_EQ_INT(try_key(a, newk, t, &r), 429);
    CHECK_STR(r.reason, "rpm");
    /* a reload from the store agrees, and keeps the window under the new id */
    reload(a);
    CHECK(!valid(a, oldk) && valid(a, newk));
    CHECK_EQ_INT(try_key(a, newk, t, &r), 429);
    CHECK_EQ_INT(mg_auth_key_count(a), 1);
    /* rotating a key that is not indexed changes nothing */
    rec = record_of(id);
    CHECK_EQ_INT(mg_auth_rotate_key(a, od, rec), MG_KEYS_ENOENT);
    mg_key_record_unref(rec);
    mg_auth_free(a);
}

/* last_used_at reaches the database through the writer thread. */
static void last_used_cb(void *ud, int n, const char *const *c)
{
    snprintf(ud, 32, "%s", n > 0 && c[0] ? c[0] : "(null)");
}

static void test_last_used(void)
{
    char k[64], sid[24], got[32] = "", err[256];
    kopt_t o = {0};
    int64_t id = add_key(&o, k);
    snprintf(sid, sizeof(sid), "%lld", (long long)id);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    const char *p[1] = {sid};
    mg_store_query(st, "SELECT last_used_at FROM api_keys WHERE id = ?1", 1, p, last_used_cb, got,
                   err, sizeof(err));
    CHECK_STR(got, "(null)");
    uint64_t t = now_ms();
    CHECK_EQ_INT(try_key(a, k, t, &r), 0);
    mg_store_flush(st);
    mg_store_query(st, "SELECT last_used_at FROM api_keys WHERE id = ?1", 1, p, last_used_cb, got,
                   err, sizeof(err));
    char want[32];
    snprintf(want, sizeof(want), "%llu", (unsigned long long)(t / 1000));
    CHECK_STR(got, want);
    mg_auth_free(a);
}

/* Keys from the HTTP headers: Bearer first, then x-api-key. */
static void test_headers(void)
{
    char k[64], auth[80];
    kopt_t o = {0};
    add_key(&o, k);
    mg_auth_t *a = load();
    mg_auth_result_t r;
    mg_http_header_t h[2];
    mg_http_req_t req;
    memset(&req, 0, sizeof(req));
    req.headers = h;
    snprintf(auth, sizeof(auth), "Bearer %s", k);
    h[0].name = "authorization";
    h[0].value = auth;
    req.n_headers = 1;
    CHECK_EQ_INT(mg_auth_check(a, &req, "chat", "P2", now_ms(), 1, &r), 0);
    mg_auth_release(&r);
    h[0].name = "X-Api-Key";
    h[0].value = k;
    CHECK_EQ_INT(mg_auth_check(a, &req, "chat", "P2", now_ms(), 1, &r), 0);
    mg_auth_release(&r);
    h[0].name = "Authorization";
    h[0].value = "Basic Zm9vOmJhcg==";
    CHECK_EQ_INT(mg_auth_check(a, &req, "chat", "P2", now_ms(), 1, &r), -1);
    CHECK_STR(r.reason, "missing");
    h[1].name = "x-api-key";
    h[1].value = k;
    req.n_headers = 2;
    CHECK_EQ_INT(mg_auth_check(a, &req, "chat", "P2", now_ms(), 1, &r), 0);
    mg_auth_release(&r);
    req.n_headers = 0;
    CHECK_EQ_INT(mg_auth_check(a, &req, "chat", "P2", now_ms(), 1, &r), -1);
    CHECK_EQ_INT(r.status, 401);
    mg_auth_free(a);
}

static void test_parsers(void)
{
    uint8_t b;
    uint32_t s;
    CHECK_EQ_INT(mg_auth_priorities_parse("[\"P0\",\"P4\"]", &b), 0);
    CHECK_EQ_INT(b, MG_PRIORITY_BIT(0) | MG_PRIORITY_BIT(4));
    CHECK_EQ_INT(mg_auth_priorities_parse(NULL, &b), 0);
    CHECK_EQ_INT(b, MG_PRIORITY_ALL);
    CHECK_EQ_INT(mg_auth_priorities_parse("[\"P5\"]", &b), -1);
    CHECK_EQ_INT(mg_auth_scopes_parse("[\"inference\",\"usage\"]", &s), 0);
    CHECK_EQ_INT(s, MG_SCOPE_INFERENCE | MG_SCOPE_USAGE);
    CHECK_EQ_INT(mg_auth_scopes_parse("[\"root\"]", &s), -1);
    unsigned char d[MG_KEY_DIGEST_LEN], e[MG_KEY_DIGEST_LEN];
    char hex[65];
    for (int i = 0; i < MG_KEY_DIGEST_LEN; i++) d[i] = (unsigned char)(i * 7 + 3);
    mg_auth_digest_hex(d, hex);
    CHECK_EQ_INT(mg_auth_digest_parse(hex, e), 0);
    CHECK(memcmp(d, e, sizeof(d)) == 0);
    CHECK_EQ_INT(mg_auth_digest_parse("abc", e), -1);
}

/* Each test gets a fresh database. */
#define RUN_DB(fn)                                                                                 \
    do {                                                                                           \
        setup();                                                                                   \
        base_rows();                                                                               \
        MG_RUN(fn);                                                                                \
        teardown();                                                                                \
    } while (0)

int main(void)
{
    RUN_DB(test_unauthenticated);
    RUN_DB(test_forbidden);
    RUN_DB(test_key_rpm);
    RUN_DB(test_key_tpm_settle);
    RUN_DB(test_project_rollback);
    RUN_DB(test_project_concurrency);
    RUN_DB(test_release_once);
    RUN_DB(test_spend_limits);
    RUN_DB(test_spend_reservation);
    RUN_DB(test_disable_enable);
    RUN_DB(test_reload_keeps_window);
    RUN_DB(test_memory_no_window);
    RUN_DB(test_put_key_adds_limit);
    RUN_DB(test_limit_change_keeps_counts);
    RUN_DB(test_lift_limits_while_held);
    RUN_DB(test_rotation);
    RUN_DB(test_last_used);
    RUN_DB(test_headers);
    MG_RUN(test_parsers);
    return mg_test_summary();
}
