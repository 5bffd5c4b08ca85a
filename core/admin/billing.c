/* billing: the admin side of the prepaid ledger (tenancy/wallet.h), on the admin worker.
 *
 *   GET  /api/v2/tenants/{id}/billing        {mode, require_upstream_usage, daily_limit_micros,
 *                                             monthly_limit_micros}
 *   PUT  /api/v2/tenants/{id}/billing        any of those (platform admin)
 *   GET  /api/v2/tenants/{id}/wallet         {balance_micros, held_micros, available_micros, ...}
 *   GET  /api/v2/tenants/{id}/ledger[?cursor=&limit=]   entries, newest first; next_cursor
 *   GET  /api/v2/tenants/{id}/holds[?state=] reservations, newest first (at most 500)
 *   POST /api/v2/tenants/{id}/release {request_id, reason}   a metering_failed hold released:
 *                                             audited as ledger.released_unmetered
 *   POST /api/v2/tenants/{id}/adjust {amount_micros, reason} an adjustment entry
 *   POST /api/v2/webhooks/topup              a payment provider's top-up (below)
 *
 * The webhook carries no admin token: it is signed. Moongate-Signature: t=<unix seconds>,
 * v1=<hex HMAC-SHA256 of "<t>.<body>" under billing.webhook_secret> (several v1 may be
 * given, for a secret being rotated at the sender). A timestamp further than
 * billing.webhook_tolerance_s from now is refused (a captured request cannot be replayed
 * later), and the event id is the top-up's primary key (a retried delivery adds nothing:
 * 200 with duplicate true; the same id with another tenant or amount is 409). Body:
 * {"id": "<event id>", "tenant_id": N, "amount_micros": N}. Reads of a tenant's wallet,
 * ledger and holds are open to its tenant admin; every change is the platform admin's. */
#include "admin/req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "conf/billing.h"

#define MAX_REASON 500
#define LEDGER_PAGE_DEFAULT 100
#define LEDGER_PAGE_MAX 500

/* ---- small helpers ---------------------------------------------------------------------- */

static int64_t now_ms(void)
{
    return (int64_t)mg_unix_ms();
}

/* A string member of 1..max bytes without control characters, or NULL (error set). */
static const char *body_text(admin_t *a, const char *name, size_t max)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    size_t n = s ? strlen(s) : 0;
    int ok = s && n > 0 && n <= max;
    for (size_t i = 0; ok && i < n; i++)
        if ((unsigned char)s[i] < 0x20) ok = 0;
    if (ok && strspn(s, " \t") == n) ok = 0;
    if (!ok) {
        adm_set_error(a, 400, "INVALID_REQUEST",
                      "field '%s': a non-blank string of at most %zu bytes", name, max);
        return NULL;
    }
    return s;
}

/* An integer member in [lo, hi] into *out. 0, or -1 (error set). */
static int body_int(admin_t *a, const char *name, double lo, double hi, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    if (!adm_is_integer(v, lo, hi)) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': an integer from %.0f to %.0f", name,
                      lo, hi);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* Refuse members other than the allowed ones (NULL-terminated). 0 or -1. */
static int only_fields(admin_t *a, const char *const *allowed)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, a->in) {
        int known = 0;
        for (const char *const *k = allowed; *k && !known; k++) known = strcmp(*k, it->string) == 0;
        if (!known) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': unknown", it->string);
            return -1;
        }
    }
    return 0;
}

static cJSON *id_json(int ncols, const char *const *c)
{
    return ncols > 0 && c[0] ? cJSON_CreateString(c[0]) : NULL;
}

/* Whether tenant id exists (1), else 0 with 404 set, -1 on storage errors (set). */
static int tenant_known(admin_t *a, const char *id)
{
    cJSON *list =
        adm_query_list(a, "SELECT id FROM tenants WHERE id = ?1", 1, (const char *[]){id}, id_json);
    if (!list) return -1;
    int n = cJSON_GetArraySize(list);
    cJSON_Delete(list);
    if (n) return 1;
    adm_set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", id);
    return 0;
}

/* ---- JSON views ------------------------------------------------------------------------- */

#define BILLING_COLUMNS                                                                            \
    "id, billing_mode, require_upstream_usage, daily_limit_micros, monthly_limit_micros"
static cJSON *billing_json(int ncols, const char *const *c)
{
    if (ncols < 5) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "tenant_id", c[0]);
    cJSON_AddStringToObject(o, "object", "tenant.billing");
    adm_add_str(o, "mode", c[1]);
    cJSON_AddBoolToObject(o, "require_upstream_usage", c[2] && strcmp(c[2], "1") == 0);
    adm_add_int(o, "daily_limit_micros", c[3]);
    adm_add_int(o, "monthly_limit_micros", c[4]);
    return o;
}

static cJSON *billing_mode_json(int ncols, const char *const *c)
{
    if (ncols < 2) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    adm_add_str(o, "billing_mode", c[1]);
    return o;
}

#define WALLET_COLUMNS                                                                             \
    "t.id, COALESCE(w.balance_micros, 0), COALESCE(w.held_micros, 0), COALESCE(w.entries, 0),"     \
    " COALESCE(w.updated_ms, 0), t.billing_mode"
static cJSON *wallet_json(int ncols, const char *const *c)
{
    if (ncols < 6) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "tenant_id", c[0]);
    cJSON_AddStringToObject(o, "object", "wallet");
    adm_add_int(o, "balance_micros", c[1]);
    adm_add_int(o, "held_micros", c[2]);
    long long avail = strtoll(c[1] ? c[1] : "0", NULL, 10) - strtoll(c[2] ? c[2] : "0", NULL, 10);
    cJSON_AddNumberToObject(o, "available_micros", (double)avail);
    adm_add_int(o, "entries", c[3]);
    adm_add_int(o, "updated_ms", c[4]);
    adm_add_str(o, "billing_mode", c[5]);
    return o;
}

#define ENTRY_COLUMNS                                                                              \
    "id, tenant_id, kind, amount_micros, hold_micros, request_id, source_id, reason, actor, at_ms"
static cJSON *entry_json(int ncols, const char *const *c)
{
    if (ncols < 10) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "ledger.entry");
    adm_add_int(o, "tenant_id", c[1]);
    adm_add_str(o, "kind", c[2]);
    adm_add_int(o, "amount_micros", c[3]);
    adm_add_int(o, "hold_micros", c[4]);
    adm_add_str(o, "request_id", c[5]);
    adm_add_str(o, "source_id", c[6]);
    adm_add_str(o, "reason", c[7]);
    adm_add_str(o, "actor", c[8]);
    adm_add_int(o, "at_ms", c[9]);
    return o;
}

#define HOLD_COLUMNS                                                                               \
    "request_id, tenant_id, reserved_micros, state, charged_micros, failure, reason, actor,"       \
    " created_ms, ended_ms"
static cJSON *hold_json(int ncols, const char *const *c)
{
    if (ncols < 10) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_str(o, "request_id", c[0]);
    cJSON_AddStringToObject(o, "object", "ledger.hold");
    adm_add_int(o, "tenant_id", c[1]);
    adm_add_int(o, "reserved_micros", c[2]);
    adm_add_str(o, "state", c[3]);
    adm_add_int(o, "charged_micros", c[4]);
    adm_add_str(o, "failure", c[5]);
    adm_add_str(o, "reason", c[6]);
    adm_add_str(o, "actor", c[7]);
    adm_add_int(o, "created_ms", c[8]);
    adm_add_int(o, "ended_ms", c[9]);
    return o;
}

/* The first row of sql (?1 = id) as JSON into the answer (status), or 404 `what`. */
static void answer_row(admin_t *a, int status, const char *sql, int n, const char *const *p,
                       row_json_fn fn, const char *what)
{
    cJSON *list = adm_query_list(a, sql, n, p, fn);
    if (!list) return;
    cJSON *o = cJSON_DetachItemFromArray(list, 0);
    cJSON_Delete(list);
    if (!o) {
        adm_set_error(a, 404, "NOT_FOUND", "%s does not exist", what);
        return;
    }
    adm_set_answer(a, status, o);
}

/* ---- tenant billing ------------------------------------------------------------------------ */

static void billing_get(admin_t *a, const char *id)
{
    answer_row(a, 200, "SELECT " BILLING_COLUMNS " FROM tenants WHERE id = ?1", 1,
               (const char *[]){id}, billing_json, "the tenant");
}

/* The after-commit mirror of a tenant's billing in the auth state. */
static void tenant_effect(admin_t *a, const first_t *f, const char *id)
{
    if (a->n_fx >= ADM_MAX_FX) return;
    admin_fx_t *fx = &a->fx[a->n_fx++];
    memset(fx, 0, sizeof(*fx));
    fx->kind = ADM_FX_PUT_TENANT;
    fx->tenant.id = strtoll(id, NULL, 10);
    fx->tenant.prepaid = strcmp(f->v[0], "prepaid") == 0;
    fx->tenant.require_upstream_usage = strcmp(f->v[1], "1") == 0;
    fx->tenant.daily_limit_micros = strtoll(f->v[2], NULL, 10);
    fx->tenant.monthly_limit_micros = strtoll(f->v[3], NULL, 10);
}

static void billing_put(admin_t *a, const char *id)
{
    static const char *const allowed[] = {"mode", "require_upstream_usage", "daily_limit_micros",
                                          "monthly_limit_micros", NULL};
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (only_fields(a, allowed) != 0 || adm_tx_begin(a, &tx) != 0) goto out;
    if (adm_tx_first(a, tx,
                     "SELECT billing_mode, require_upstream_usage, daily_limit_micros,"
                     " monthly_limit_micros FROM tenants WHERE id = ?1",
                     1, (const char *[]){id}, &f) != 0)
        goto out;
    if (!f.rows) {
        adm_set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", id);
        goto out;
    }
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(a->in, "mode");
    if (mode) {
        if (!cJSON_IsString(mode) || (strcmp(mode->valuestring, "prepaid") != 0 &&
                                      strcmp(mode->valuestring, "postpaid") != 0)) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field 'mode': \"prepaid\" or \"postpaid\"");
            goto out;
        }
        snprintf(f.v[0], sizeof(f.v[0]), "%s", mode->valuestring);
    }
    const cJSON *req_usage = cJSON_GetObjectItemCaseSensitive(a->in, "require_upstream_usage");
    if (req_usage) {
        if (!cJSON_IsBool(req_usage)) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field 'require_upstream_usage': a boolean");
            goto out;
        }
        snprintf(f.v[1], sizeof(f.v[1]), "%d", cJSON_IsTrue(req_usage) ? 1 : 0);
    }
    const char *lim[2] = {"daily_limit_micros", "monthly_limit_micros"};
    for (int i = 0; i < 2; i++) {
        int64_t v;
        if (!cJSON_GetObjectItemCaseSensitive(a->in, lim[i])) continue;
        if (body_int(a, lim[i], 0, 1e15, &v) != 0) goto out;
        adm_fmt_i64(f.v[2 + i], sizeof(f.v[2 + i]), v);
    }
    const char *p[5] = {id, f.v[0], f.v[1], f.v[2], f.v[3]};
    if (adm_tx_write(a, tx,
                     "UPDATE tenants SET billing_mode = ?2, require_upstream_usage = ?3,"
                     " daily_limit_micros = ?4, monthly_limit_micros = ?5 WHERE id = ?1",
                     5, p, "mode") < 0)
        goto out;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (adm_tx_commit(a, t) != 0) goto out;
    tenant_effect(a, &f, id);
    billing_get(a, id);
out:
    mg_store_tx_rollback(tx);
}

/* ---- wallet, ledger, holds --------------------------------------------------------------------
 */

/* ---- the books in the cluster's PostgreSQL (store/pg.h), when configured --------------------
 * The tenant is the control plane's (replicated into this instance's SQLite); its wallet,
 * entries, holds and top-ups are the cluster's: read and changed there. */

typedef struct pg_row_s {
    int rows;
    char v[6][32];
} pg_row_t;

static void on_pg_row(void *ud, int ncols, const char *const *cols)
{
    pg_row_t *r = ud;
    if (r->rows++) return;
    for (int i = 0; i < ncols && i < 6; i++)
        snprintf(r->v[i], sizeof(r->v[i]), "%s", cols[i] ? cols[i] : "");
}

static int pg_first(admin_t *a, const char *sql, int n, const char *const *p, pg_row_t *out)
{
    char err[256];
    memset(out, 0, sizeof(*out));
    if (mg_pg_query_sync(mg_store_pg(a->store), sql, n, p, on_pg_row, out, err, sizeof(err)) != 0) {
        adm_set_error(a, 503, "RESOURCE_EXHAUSTED", "%s", err);
        return -1;
    }
    return 0;
}

typedef struct pg_list_s {
    cJSON *arr;
    cJSON *(*row)(int ncols, const char *const *cols);
} pg_list_t;

static void on_pg_list_row(void *ud, int ncols, const char *const *cols)
{
    pg_list_t *l = ud;
    cJSON *o = l->row(ncols, cols);
    if (o) cJSON_AddItemToArray(l->arr, o);
}

/* The rows of sql in PostgreSQL as a JSON array (row makes each), or NULL with the 503 set. */
static cJSON *pg_list(admin_t *a, const char *sql, int n, const char *const *p,
                      cJSON *(*row)(int, const char *const *))
{
    char err[256];
    pg_list_t l = {cJSON_CreateArray(), row};
    if (mg_pg_query_sync(mg_store_pg(a->store), sql, n, p, on_pg_list_row, &l, err, sizeof(err)) !=
        0) {
        cJSON_Delete(l.arr);
        adm_set_error(a, 503, "RESOURCE_EXHAUSTED", "%s", err);
        return NULL;
    }
    return l.arr;
}

static void pg_wallet_get(admin_t *a, const char *id)
{
    cJSON *list = adm_query_list(a, "SELECT id, billing_mode FROM tenants WHERE id = ?1", 1,
                                 (const char *[]){id}, billing_mode_json);
    if (!list) return;
    cJSON *t = cJSON_GetArrayItem(list, 0);
    cJSON *mode = t ? cJSON_GetObjectItem(t, "billing_mode") : NULL;
    char m[32];
    snprintf(m, sizeof(m), "%s", cJSON_IsString(mode) ? mode->valuestring : "");
    cJSON_Delete(list);
    if (!t) {
        adm_set_error(a, 404, "NOT_FOUND", "the tenant does not exist");
        return;
    }
    pg_row_t r;
    if (pg_first(a,
                 "SELECT balance_micros, held_micros, entries, updated_ms FROM wallets"
                 " WHERE tenant_id = $1::bigint",
                 1, (const char *[]){id}, &r) != 0)
        return;
    const char *c[6] = {id,
                        r.rows ? r.v[0] : "0",
                        r.rows ? r.v[1] : "0",
                        r.rows ? r.v[2] : "0",
                        r.rows ? r.v[3] : "0",
                        m[0] ? m : NULL};
    adm_set_answer(a, 200, wallet_json(6, c));
}

static void wallet_get(admin_t *a, const char *id)
{
    if (mg_store_pg(a->store)) {
        pg_wallet_get(a, id);
        return;
    }
    answer_row(a, 200,
               "SELECT " WALLET_COLUMNS " FROM tenants t LEFT JOIN wallets w ON w.tenant_id = t.id"
               " WHERE t.id = ?1",
               1, (const char *[]){id}, wallet_json, "the tenant");
}

/* A list page as {object: "list", data, has_more, next_cursor}: rows fetched one past the
 * page tell whether more follow; the cursor is the last entry's id (entries are newest first,
 * so the next page has smaller ids). */
static void ledger_list(admin_t *a, const char *id)
{
    char cursor[24] = "", limit_s[16] = "";
    long limit = LEDGER_PAGE_DEFAULT;
    if (adm_query_param(a, "limit", limit_s, sizeof(limit_s))) {
        char *end;
        limit = strtol(limit_s, &end, 10);
        if (*end || limit < 1 || limit > LEDGER_PAGE_MAX) {
            adm_set_error(a, 400, "INVALID_REQUEST", "query 'limit': 1 to %d", LEDGER_PAGE_MAX);
            return;
        }
    }
    if (adm_query_param(a, "cursor", cursor, sizeof(cursor)) &&
        (!cursor[0] || strspn(cursor, "0123456789") != strlen(cursor))) {
        adm_set_error(a, 400, "INVALID_REQUEST", "query 'cursor': the next_cursor of a page");
        return;
    }
    if (tenant_known(a, id) != 1) return;
    char lim[16];
    snprintf(lim, sizeof(lim), "%ld", limit + 1);
    const char *p[3] = {id, cursor[0] ? cursor : NULL, lim};
    cJSON *list =
        mg_store_pg(a->store)
            ? pg_list(a,
                      "SELECT " ENTRY_COLUMNS " FROM ledger_entries"
                      " WHERE tenant_id = $1::bigint"
                      " AND ($2::text IS NULL OR id < $2::bigint)"
                      " ORDER BY id DESC LIMIT $3::bigint",
                      3, p, entry_json)
            : adm_query_list(a,
                             "SELECT " ENTRY_COLUMNS " FROM ledger_entries WHERE tenant_id = ?1"
                             " AND (?2 IS NULL OR id < CAST(?2 AS INTEGER))"
                             " ORDER BY id DESC LIMIT CAST(?3 AS INTEGER)",
                             3, p, entry_json);
    if (!list) return;
    int more = cJSON_GetArraySize(list) > limit;
    if (more) cJSON_DeleteItemFromArray(list, (int)limit);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", list);
    cJSON_AddBoolToObject(o, "has_more", more);
    cJSON *last = cJSON_GetArrayItem(list, cJSON_GetArraySize(list) - 1);
    cJSON *last_id = last ? cJSON_GetObjectItemCaseSensitive(last, "id") : NULL;
    if (more && cJSON_IsNumber(last_id)) {
        char next[24];
        snprintf(next, sizeof(next), "%.0f", last_id->valuedouble);
        cJSON_AddStringToObject(o, "next_cursor", next);
    } else {
        cJSON_AddNullToObject(o, "next_cursor");
    }
    adm_set_answer(a, 200, o);
}

static void holds_list(admin_t *a, const char *id)
{
    char state[32] = "";
    int filtered = adm_query_param(a, "state", state, sizeof(state));
    if (tenant_known(a, id) != 1) return;
    const char *p[2] = {id, filtered ? state : NULL};
    cJSON *list =
        mg_store_pg(a->store)
            ? pg_list(a,
                      "SELECT " HOLD_COLUMNS " FROM ledger_holds"
                      " WHERE tenant_id = $1::bigint AND ($2::text IS NULL OR state = $2)"
                      " ORDER BY created_ms DESC, request_id DESC LIMIT 500",
                      2, p, hold_json)
            : adm_query_list(a,
                             "SELECT " HOLD_COLUMNS " FROM ledger_holds WHERE tenant_id = ?1"
                             " AND (?2 IS NULL OR state = ?2)"
                             " ORDER BY created_ms DESC, rowid DESC LIMIT 500",
                             2, p, hold_json);
    if (!list) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddNumberToObject(o, "total", cJSON_GetArraySize(list));
    cJSON_AddItemToObject(o, "data", list);
    adm_set_answer(a, 200, o);
}

/* ---- release and adjust ------------------------------------------------------------------------
 */

/* One row of sql in PostgreSQL as the answer (row makes it), 404 naming what when none. */
static void pg_answer_row(admin_t *a, int status, const char *sql, const char *key,
                          cJSON *(*row)(int, const char *const *), const char *what)
{
    cJSON *list = pg_list(a, sql, 1, (const char *[]){key}, row);
    if (!list) return;
    cJSON *o = cJSON_DetachItemFromArray(list, 0);
    cJSON_Delete(list);
    if (o) adm_set_answer(a, status, o);
    else adm_set_error(a, 404, "NOT_FOUND", "%s does not exist", what);
}

/* The release of a metering_failed hold in the cluster's books: one function call, the
 * wallet row locked (store/pg_schema.c, mg_wallet_release_unmetered). */
static void pg_release_unmetered(admin_t *a, const char *id, const char *rid, const char *reason)
{
    char at[24];
    adm_fmt_i64(at, sizeof(at), now_ms());
    pg_row_t r;
    if (pg_first(a, "SELECT mg_wallet_release_unmetered($1, $2::bigint, $3, $4, $5::bigint)", 5,
                 (const char *[]){rid, id, reason, a->actor, at}, &r) != 0)
        return;
    if (strcmp(r.v[0], "missing") == 0) {
        adm_set_error(a, 404, "NOT_FOUND", "tenant %s has no hold for request %s", id, rid);
        return;
    }
    if (strcmp(r.v[0], "released") != 0) {
        adm_set_error(a, 409, "CONFLICT",
                      "the hold is %s: only a metering_failed hold is released by an administrator",
                      r.v[0]);
        return;
    }
    pg_answer_row(a, 200, "SELECT " HOLD_COLUMNS " FROM ledger_holds WHERE request_id = $1", rid,
                  hold_json, "the hold");
}

/* A metering_failed hold released by an administrator, with the reason: its release entry
 * carries the reason and the actor; no token and no charge is invented. */
static void release_unmetered(admin_t *a, const char *id)
{
    static const char *const allowed[] = {"request_id", "reason", NULL};
    mg_store_tx_t *tx = NULL;
    first_t f;
    const char *rid, *reason;
    if (only_fields(a, allowed) != 0 || !(rid = body_text(a, "request_id", 64)) ||
        !(reason = body_text(a, "reason", MAX_REASON)))
        return;
    snprintf(a->target, sizeof(a->target), "tenant:%s/hold:%.60s", id, rid);
    if (mg_store_pg(a->store)) {
        if (tenant_known(a, id) == 1) pg_release_unmetered(a, id, rid, reason);
        return;
    }
    if (adm_tx_begin(a, &tx) != 0) goto out;
    if (adm_tx_first(a, tx,
                     "SELECT state FROM ledger_holds WHERE request_id = ?1 AND tenant_id = ?2", 2,
                     (const char *[]){rid, id}, &f) != 0)
        goto out;
    if (!f.rows) {
        adm_set_error(a, 404, "NOT_FOUND", "tenant %s has no hold for request %s", id, rid);
        goto out;
    }
    if (strcmp(f.v[0], "metering_failed") != 0) {
        adm_set_error(a, 409, "CONFLICT",
                      "the hold is %s: only a metering_failed hold is released by an administrator",
                      f.v[0]);
        goto out;
    }
    char at[24];
    adm_fmt_i64(at, sizeof(at), now_ms());
    const char *p[4] = {rid, reason, a->actor, at};
    if (adm_tx_write(a, tx,
                     "UPDATE ledger_holds SET state = 'released_unmetered', reason = ?2,"
                     " actor = ?3, ended_ms = CAST(?4 AS INTEGER)"
                     " WHERE request_id = ?1 AND state = 'metering_failed'",
                     4, p, "request_id") != 1) {
        if (!a->code) adm_set_error(a, 409, "CONFLICT", "the hold changed meanwhile");
        goto out;
    }
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (adm_tx_commit(a, t) != 0) goto out;
    answer_row(a, 200, "SELECT " HOLD_COLUMNS " FROM ledger_holds WHERE request_id = ?1", 1,
               (const char *[]){rid}, hold_json, "the hold");
out:
    mg_store_tx_rollback(tx);
}

static void adjust(admin_t *a, const char *id)
{
    static const char *const allowed[] = {"amount_micros", "reason", NULL};
    mg_store_tx_t *tx = NULL;
    int64_t amount;
    const char *reason;
    if (only_fields(a, allowed) != 0 || body_int(a, "amount_micros", -1e15, 1e15, &amount) != 0 ||
        !(reason = body_text(a, "reason", MAX_REASON)))
        return;
    if (amount == 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'amount_micros': not 0");
        return;
    }
    if (tenant_known(a, id) != 1) return;
    char amt[24], at[24], source[64];
    adm_fmt_i64(amt, sizeof(amt), amount);
    adm_fmt_i64(at, sizeof(at), now_ms());
    snprintf(source, sizeof(source), "adj-%s", a->request_id);
    if (mg_store_pg(a->store)) { /* the cluster's books: one function call, the row locked */
        pg_row_t r;
        if (pg_first(a, "SELECT mg_wallet_adjust($1::bigint, $2::bigint, $3, $4, $5, $6::bigint)",
                     6, (const char *[]){id, amt, source, reason, a->actor, at}, &r) == 0)
            pg_answer_row(a, 201,
                          "SELECT " ENTRY_COLUMNS " FROM ledger_entries WHERE source_id = $1",
                          source, entry_json, "the entry");
        return;
    }
    if (adm_tx_begin(a, &tx) != 0) return;
    const char *p[6] = {id, amt, source, reason, a->actor, at};
    if (adm_tx_write(a, tx,
                     "INSERT INTO ledger_entries(tenant_id, kind, amount_micros, hold_micros,"
                     " source_id, reason, actor, at_ms) VALUES (CAST(?1 AS INTEGER), 'adjustment',"
                     " CAST(?2 AS INTEGER), 0, ?3, ?4, ?5, CAST(?6 AS INTEGER))",
                     6, p, "amount_micros") < 0)
        goto out;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (adm_tx_commit(a, t) != 0) goto out;
    answer_row(a, 201, "SELECT " ENTRY_COLUMNS " FROM ledger_entries WHERE source_id = ?1", 1,
               (const char *[]){source}, entry_json, "the entry");
out:
    mg_store_tx_rollback(tx);
}

/* ---- the top-up webhook ------------------------------------------------------------------------
 */

/* Parse "t=<digits>,v1=<hex>[,v1=<hex>...]": 0 with *t and up to 4 signatures, else -1. */
static int parse_signature(const char *h, int64_t *t, char sigs[4][65], int *n)
{
    *t = -1;
    *n = 0;
    char buf[320];
    snprintf(buf, sizeof(buf), "%s", h);
    for (char *save = NULL, *part = strtok_r(buf, ",", &save); part;
         part = strtok_r(NULL, ",", &save)) {
        while (*part == ' ') part++;
        if (strncmp(part, "t=", 2) == 0 && part[2] &&
            strspn(part + 2, "0123456789") == strlen(part + 2) && strlen(part + 2) <= 12)
            *t = strtoll(part + 2, NULL, 10);
        else if (strncmp(part, "v1=", 3) == 0 && strlen(part + 3) == 64 && *n < 4)
            snprintf(sigs[(*n)++], 65, "%s", part + 3);
    }
    return *t >= 0 && *n > 0 ? 0 : -1;
}

/* 1 when one of the signatures is HMAC-SHA256(secret, "<t>.<body>"), compared in constant
 * time. */
static int signature_ok(const char *secret, int64_t t, const char *body, size_t len,
                        char sigs[4][65], int n)
{
    char head[32];
    int hl = snprintf(head, sizeof(head), "%lld.", (long long)t);
    size_t total = (size_t)hl + len;
    unsigned char *msg = malloc(total + 1), mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0;
    if (!msg) return 0;
    memcpy(msg, head, (size_t)hl);
    if (len) memcpy(msg + hl, body, len);
    int ok = HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, total, mac, &maclen) != NULL;
    free(msg);
    if (!ok || maclen != 32) return 0;
    char hex[65];
    for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    int match = 0;
    for (int i = 0; i < n; i++) {
        for (char *c = sigs[i]; *c; c++)
            if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
        match |= mg_const_time_eq(hex, 64, sigs[i], 64);
    }
    OPENSSL_cleanse(mac, sizeof(mac));
    return match;
}

/* The signature and the replay window; 0, or -1 with the error set. */
static int webhook_verify(admin_t *a)
{
    const mg_billing_conf_t *b = &a->gen->cfg->billing;
    int64_t t;
    char sigs[4][65];
    int n;
    if (!b->webhook_secret) {
        adm_set_error(a, 503, "WEBHOOK_DISABLED",
                      "the top-up webhook is not configured (billing.webhook_secret)");
        return -1;
    }
    if (parse_signature(a->signature, &t, sigs, &n) != 0) {
        adm_set_error(a, 401, "AUTH_FAILED",
                      "missing or malformed Moongate-Signature (t=<unix seconds>,v1=<hex>)");
        return -1;
    }
    int64_t now = now_ms() / 1000, tol = b->webhook_tolerance_s > 0
                                             ? b->webhook_tolerance_s
                                             : MG_BILLING_TOLERANCE_DEFAULT_S;
    if (t < now - tol || t > now + tol) {
        adm_set_error(a, 401, "AUTH_FAILED",
                      "the signature's timestamp is outside the replay window (%lld s)",
                      (long long)tol);
        return -1;
    }
    if (!a->raw_body || !signature_ok(b->webhook_secret, t, a->raw_body, a->raw_len, sigs, n)) {
        adm_set_error(a, 401, "AUTH_FAILED", "the signature does not match the body");
        return -1;
    }
    return 0;
}

static cJSON *topup_answer(const char *event, const char *tenant, const char *amount, int duplicate)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "topup");
    cJSON_AddStringToObject(o, "id", event);
    adm_add_int(o, "tenant_id", tenant);
    adm_add_int(o, "amount_micros", amount);
    cJSON_AddBoolToObject(o, "duplicate", duplicate);
    return o;
}

/* The top-up into the cluster's wallet: one call of mg_wallet_topup (the wallet row locked). */
static void pg_topup(admin_t *a, const char *event, const char *t, const char *amt, const char *at)
{
    pg_row_t r;
    if (pg_first(a, "SELECT mg_wallet_topup($1, $2::bigint, $3::bigint, $4::bigint, 'webhook')", 4,
                 (const char *[]){event, t, amt, at}, &r) != 0)
        return;
    if (r.rows && strcmp(r.v[0], "t") == 0) {
        adm_set_answer(a, 200, topup_answer(event, t, amt, 0));
        return;
    }
    if (pg_first(a, "SELECT tenant_id, amount_micros FROM topups WHERE event_id = $1", 1,
                 (const char *[]){event}, &r) != 0)
        return;
    if (r.rows && strcmp(r.v[0], t) == 0 && strcmp(r.v[1], amt) == 0)
        adm_set_answer(a, 200, topup_answer(event, t, amt, 1));
    else
        adm_set_error(a, 409, "CONFLICT",
                      "event %s was credited already with another tenant or amount", event);
}

static void webhook_topup(admin_t *a)
{
    static const char *const allowed[] = {"id", "tenant_id", "amount_micros", "currency", NULL};
    mg_store_tx_t *tx = NULL;
    first_t f;
    int64_t tenant, amount;
    const char *event;
    if (webhook_verify(a) != 0 || only_fields(a, allowed) != 0 ||
        !(event = body_text(a, "id", 128)) ||
        body_int(a, "tenant_id", 1, ADM_MAX_ID, &tenant) != 0 ||
        body_int(a, "amount_micros", 1, 1e15, &amount) != 0)
        return;
    char t[24], amt[24], at[24];
    adm_fmt_i64(t, sizeof(t), tenant);
    adm_fmt_i64(amt, sizeof(amt), amount);
    adm_fmt_i64(at, sizeof(at), now_ms());
    snprintf(a->target, sizeof(a->target), "tenant:%s/topup:%.100s", t, event);
    if (tenant_known(a, t) != 1) return;
    if (mg_store_pg(a->store)) {
        pg_topup(a, event, t, amt, at);
        return;
    }
    if (adm_tx_begin(a, &tx) != 0) return;
    if (adm_tx_first(a, tx, "SELECT tenant_id, amount_micros FROM topups WHERE event_id = ?1", 1,
                     (const char *[]){event}, &f) != 0)
        goto out;
    if (f.rows) { /* delivered again: nothing is added */
        if (strcmp(f.v[0], t) != 0 || strcmp(f.v[1], amt) != 0)
            adm_set_error(a, 409, "CONFLICT",
                          "event %s was credited already with another tenant or amount", event);
        else adm_set_answer(a, 200, topup_answer(event, t, amt, 1));
        goto out;
    }
    const char *p[4] = {event, t, amt, at};
    if (adm_tx_write(a, tx,
                     "INSERT INTO topups(event_id, tenant_id, amount_micros, at_ms) VALUES"
                     " (?1, CAST(?2 AS INTEGER), CAST(?3 AS INTEGER), CAST(?4 AS INTEGER))",
                     4, p, "id") < 0)
        goto out;
    mg_store_tx_t *done = tx;
    tx = NULL;
    if (adm_tx_commit(a, done) != 0) goto out;
    adm_set_answer(a, 200, topup_answer(event, t, amt, 0));
out:
    mg_store_tx_rollback(tx);
}

/* ---- routing ------------------------------------------------------------------------------------
 */

int adm_billing_route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    int get = a->method == HTTP_GET, post = a->method == HTTP_POST, put = a->method == HTTP_PUT;
    if (strcmp(coll, "webhooks") == 0) {
        if (id && strcmp(id, "topup") == 0 && !verb && post) {
            a->action = "wallet.topup";
            webhook_topup(a);
        } else {
            a->action = "admin.unknown";
            adm_set_error(a, 404, "NOT_FOUND", "no such webhook");
        }
        return 1;
    }
    if (strcmp(coll, "tenants") != 0 || !id || !verb || strspn(id, "0123456789") != strlen(id))
        return 0;
    snprintf(a->target, sizeof(a->target), "tenant:%s", id);
    if (strcmp(verb, "billing") == 0 && (get || put)) {
        a->action = get ? "tenant.billing.get" : "tenant.billing.update";
        if (get) billing_get(a, id);
        else billing_put(a, id);
    } else if (strcmp(verb, "wallet") == 0 && get) {
        a->action = "wallet.get";
        wallet_get(a, id);
    } else if (strcmp(verb, "ledger") == 0 && get) {
        a->action = "ledger.list";
        ledger_list(a, id);
    } else if (strcmp(verb, "holds") == 0 && get) {
        a->action = "ledger.holds";
        holds_list(a, id);
    } else if (strcmp(verb, "release") == 0 && post) {
        a->action = "ledger.released_unmetered";
        release_unmetered(a, id);
    } else if (strcmp(verb, "adjust") == 0 && post) {
        a->action = "ledger.adjustment";
        adjust(a, id);
    } else {
        return 0;
    }
    return 1;
}
