/* admin: the admin API's dispatch (queue, worker thread, effects, audit, answer) and its
 * tenants, projects and customer keys; see admin.h. Providers are in providers.c,
 * the helpers every resource shares in req.c.
 *
 * One request is one admin_t. mg_admin_handle() copies what the handler needs from the
 * HTTP request and queues it; requests run one at a time on a libuv worker thread (the
 * store's admin connection serves one transaction at a time, and nothing on the loop thread
 * ever waits for SQLite or a provider's test call). There the router picks a handler, the
 * handler validates the body, runs its transaction and leaves either a JSON answer or an
 * error, plus the effects its committed change has on loop-owned state; the audit record is
 * written in the same worker pass. Back on the loop thread the effects are applied (auth
 * index, project limits; a provider change rebuilds the generation first) and only then is
 * the client answered: database first, then memory, then the answer, so a request sent
 * after the answer sees the change. */
#include "admin/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <openssl/crypto.h>

#include "admin/req.h"
#include "base/clock.h"
#include "net/error.h"
#include "obs/answer.h"
#include "base/json.h"
#include "base/log.h"
#include "conf/settings.h"

#define PLATFORM_ACTOR "admin" /* the platform admin token (MOONGATE_ADMIN_TOKEN) */
#define UNAUTHENTICATED_ACTOR "unauthenticated" /* a token that matched nobody */
#define SYSTEM_ACTOR "system"                   /* the gateway itself (a window that expired) */

/* Key values: the columns an admin may set. */
enum {
    K_PROJECT,
    K_NAME,
    K_SCOPES,
    K_MODELS,
    K_PRIOS,
    K_RPM,
    K_TPM,
    K_CONC,
    K_QUEUED,
    K_DAILY,
    K_MONTHLY,
    K_EXPIRES,
    K_LABELS,
    K_ENABLED,
    K_APP,
    K_N
};
#define KEY_VAL_COLUMNS                                                                            \
    "project_id, name, scopes, models, priorities, rpm_limit, tpm_limit, max_concurrency,"         \
    " max_queued, daily_limit_micros, monthly_limit_micros, expires_at, labels, enabled,"          \
    " application"

static const field_t key_fields[] = {
    {"tenant_id", F_ID, -1, 0, 0},
    {"project_id", F_ID, K_PROJECT, 1, 0},
    {"name", F_NAME, K_NAME, 1, 0},
    {"scopes", F_SCOPES, K_SCOPES, 0, 0},
    {"models", F_MODELS, K_MODELS, 0, 0},
    {"priorities", F_PRIOS, K_PRIOS, 0, 0},
    {"rpm_limit", F_LIMIT, K_RPM, 0, 1e7},
    {"tpm_limit", F_LIMIT, K_TPM, 0, 4e9},
    {"max_concurrency", F_LIMIT, K_CONC, 0, 1e5},
    {"max_queued", F_LIMIT, K_QUEUED, 0, 1e5},
    {"daily_limit_micros", F_LIMIT, K_DAILY, 0, 1e15},
    {"monthly_limit_micros", F_LIMIT, K_MONTHLY, 0, 1e15},
    {"expires_at", F_TIME, K_EXPIRES, 1, 0},
    {"labels", F_LABELS, K_LABELS, 0, 0},
    {"enabled", F_BOOL, K_ENABLED, 0, 0},
    {"application", F_NAME, K_APP, 1, 0},
};

/* Project values. */
enum { P_NAME, P_RPM, P_TPM, P_CONC, P_MONTHLY, P_DAILY, P_N };
#define PROJECT_VAL_COLUMNS                                                                        \
    "name, rpm_limit, tpm_limit, max_concurrency, monthly_limit_micros, daily_limit_micros"

static const field_t project_fields[] = {
    {"tenant_id", F_ID, -1, 0, 0},
    {"name", F_NAME, P_NAME, 0, 0},
    {"rpm_limit", F_LIMIT, P_RPM, 0, 1e7},
    {"tpm_limit", F_LIMIT, P_TPM, 0, 4e9},
    {"max_concurrency", F_LIMIT, P_CONC, 0, 1e5},
    {"monthly_limit_micros", F_LIMIT, P_MONTHLY, 0, 1e15},
    {"daily_limit_micros", F_LIMIT, P_DAILY, 0, 1e15},
};

static const field_t tenant_fields[] = {
    {"name", F_NAME, 0, 0, 0},
};

#define TENANT_JSON_COLUMNS "id, name, created_at"
static cJSON *tenant_json(int ncols, const char *const *c)
{
    if (ncols < 3) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "tenant");
    adm_add_str(o, "name", c[1]);
    adm_add_int(o, "created_at", c[2]);
    return o;
}

#define PROJECT_JSON_COLUMNS                                                                        \
    "id, tenant_id, name, rpm_limit, tpm_limit, max_concurrency, monthly_limit_micros, created_at," \
    " daily_limit_micros"
static cJSON *project_json(int ncols, const char *const *c)
{
    if (ncols < 9) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "project");
    adm_add_int(o, "tenant_id", c[1]);
    adm_add_str(o, "name", c[2]);
    adm_add_int(o, "rpm_limit", c[3]);
    adm_add_int(o, "tpm_limit", c[4]);
    adm_add_int(o, "max_concurrency", c[5]);
    adm_add_int(o, "monthly_limit_micros", c[6]);
    adm_add_int(o, "created_at", c[7]);
    adm_add_int(o, "daily_limit_micros", c[8]);
    return o;
}

#define KEY_JSON_COLUMNS                                                                           \
    "id, tenant_id, project_id, name, display, scopes, models, priorities, rpm_limit,"             \
    " tpm_limit, max_concurrency, max_queued, daily_limit_micros, monthly_limit_micros,"           \
    " expires_at, labels, enabled, revoked_at, replaced_by, last_used_at, created_at,"             \
    " application"

static const char *key_status(const char *const *c)
{
    if (c[17]) return "revoked";
    if (!c[16] || strcmp(c[16], "1") != 0) return "disabled";
    if (c[14] && strtoll(c[14], NULL, 10) <= adm_now_s()) return "expired";
    return "active";
}

/* A key as the admin API shows it: never the digest, never the key. */
static cJSON *key_json(int ncols, const char *const *c)
{
    static const char *const limits[] = {"rpm_limit",          "tpm_limit",
                                         "max_concurrency",    "max_queued",
                                         "daily_limit_micros", "monthly_limit_micros"};
    if (ncols < 22) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "api_key");
    adm_add_int(o, "tenant_id", c[1]);
    adm_add_int(o, "project_id", c[2]);
    adm_add_str(o, "name", c[3]);
    adm_add_str(o, "display", c[4]);
    adm_add_json(o, "scopes", c[5], 0);
    adm_add_json(o, "models", c[6], 0);
    adm_add_json(o, "priorities", c[7], 0);
    for (int i = 0; i < 6; i++) adm_add_int(o, limits[i], c[8 + i]);
    adm_add_int(o, "expires_at", c[14]);
    adm_add_json(o, "labels", c[15], 1);
    cJSON_AddBoolToObject(o, "enabled", c[16] && strcmp(c[16], "1") == 0);
    cJSON_AddStringToObject(o, "status", key_status(c));
    adm_add_int(o, "revoked_at", c[17]);
    adm_add_int(o, "replaced_by", c[18]);
    adm_add_int(o, "last_used_at", c[19]);
    adm_add_int(o, "created_at", c[20]);
    adm_add_str(o, "application", c[21]);
    return o;
}

/* ---- applying committed key changes to the auth state -------------------------------------------
 */

typedef struct rec_row_s {
    mg_key_record_t *rec; /* one reference */
} rec_row_t;

static void rec_row(void *ud, int ncols, const char *const *cols)
{
    rec_row_t *r = ud;
    if (!r->rec) r->rec = mg_auth_record_from_row(ncols, cols);
}

/* The auth record of key `id` as the transaction wrote it. NULL with the error set. */
static mg_key_record_t *tx_record(admin_t *a, mg_store_tx_t *tx, const char *id)
{
    char err[256];
    rec_row_t r = {NULL};
    const char *p[1] = {id};
    if (mg_store_tx_exec(tx, "SELECT " MG_AUTH_KEY_COLUMNS " FROM api_keys WHERE id = ?1", 1, p,
                         rec_row, &r, err, sizeof(err)) < 0) {
        adm_storage_error(a, err);
        return NULL;
    }
    if (!r.rec) adm_storage_error(a, "cannot build the key record of the row just written");
    return r.rec;
}

/* After commit: index (or re-index) rec on the loop thread. Takes over the reference. */
static void auth_put(admin_t *a, mg_key_record_t *rec)
{
    adm_fx(a, ADM_FX_PUT_KEY, rec, NULL, NULL);
}

/* ---- tenants ------------------------------------------------------------------------------------
 */

static void tenant_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    char at[24], id[24];
    if (adm_apply_body(a, tenant_fields, NFIELDS(tenant_fields), NULL, &vs) != 0 ||
        adm_require(a, "name") != 0 || adm_tx_begin(a, &tx) != 0)
        goto out;
    const char *pn[1] = {vs.v[0]};
    if (adm_tx_first(a, tx, "SELECT id FROM tenants WHERE name = ?1", 1, pn, &f) != 0) goto out;
    if (f.rows) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': a tenant with this name exists");
        goto out;
    }
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[2] = {vs.v[0], at};
    if (adm_tx_write(a, tx, "INSERT INTO tenants(name, created_at) VALUES (?1, ?2)", 2, p, "name") <
        0)
        goto out;
    adm_fmt_i64(id, sizeof(id), mg_store_tx_last_id(tx));
    snprintf(a->target, sizeof(a->target), "tenant:%s", id);
    cJSON *o = adm_tx_json(a, tx, "SELECT " TENANT_JSON_COLUMNS " FROM tenants WHERE id = ?1", id,
                           tenant_json);
    if (!o) goto out;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (adm_tx_commit(a, t) != 0) {
        cJSON_Delete(o);
        goto out;
    }
    adm_set_answer(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

/* GET one row by id, or a list; 404 when the one row does not exist. */

static void tenant_get(admin_t *a, const char *id)
{
    char own[24];
    if (!id && a->scope_tenant) { /* a tenant admin's list is its own tenant */
        adm_fmt_i64(own, sizeof(own), a->scope_tenant);
        const char *p[1] = {own};
        adm_get_rows(a, NULL, "SELECT " TENANT_JSON_COLUMNS " FROM tenants WHERE id = ?1", NULL, 1,
                     p, tenant_json, "tenant");
        return;
    }
    adm_get_rows(a, "SELECT " TENANT_JSON_COLUMNS " FROM tenants WHERE id = ?1",
                 "SELECT " TENANT_JSON_COLUMNS " FROM tenants ORDER BY id", id, 0, NULL,
                 tenant_json, "tenant");
}

/* ---- projects -----------------------------------------------------------------------------------
 */

/* Whether tenant `id` exists (0/1), or -1 with the error set. */
static int tenant_exists(admin_t *a, mg_store_tx_t *tx, const char *id)
{
    first_t f;
    const char *p[1] = {id};
    if (adm_tx_first(a, tx, "SELECT id FROM tenants WHERE id = ?1", 1, p, &f) != 0) return -1;
    if (f.rows) return 1;
    adm_set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", id);
    return 0;
}

/* After commit: mirror a project's limits in the auth state. */
static void auth_project(admin_t *a, int64_t id, int64_t tenant, const vals_t *vs)
{
    mg_auth_project_t p = {
        .id = id,
        .tenant_id = tenant,
        .rpm_limit = (uint32_t)strtoul(vs->v[P_RPM], NULL, 10),
        .tpm_limit = (uint32_t)strtoul(vs->v[P_TPM], NULL, 10),
        .max_concurrency = (uint32_t)strtoul(vs->v[P_CONC], NULL, 10),
        .monthly_limit_micros = strtoll(vs->v[P_MONTHLY], NULL, 10),
        .daily_limit_micros = strtoll(vs->v[P_DAILY], NULL, 10),
    };
    adm_fx(a, ADM_FX_PUT_PROJECT, NULL, NULL, &p);
}

static int project_defaults(vals_t *vs)
{
    for (int i = P_RPM; i < P_N; i++)
        if (adm_vals_set(vs, i, "0") != 0) return -1;
    return 0;
}

/* A project's name must be unique within its tenant. 0 free, -1 taken or error (set). */
static int project_name_free(admin_t *a, mg_store_tx_t *tx, const char *tenant, const char *name,
                             const char *self)
{
    first_t f;
    const char *p[3] = {tenant, name, self ? self : "0"};
    if (adm_tx_first(a, tx,
                     "SELECT id FROM projects WHERE tenant_id = ?1 AND name = ?2 AND id <> ?3", 3,
                     p, &f) != 0)
        return -1;
    if (!f.rows) return 0;
    adm_set_error(a, 400, "INVALID_REQUEST",
                  "field 'name': the tenant has a project with this name");
    return -1;
}

static void project_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    char tenant[24], at[24], id[24];
    if (project_defaults(&vs) != 0) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (adm_apply_body(a, project_fields, NFIELDS(project_fields), NULL, &vs) != 0 ||
        adm_require(a, "tenant_id") != 0 || adm_require(a, "name") != 0 ||
        adm_tx_begin(a, &tx) != 0)
        goto out;
    adm_fmt_i64(tenant, sizeof(tenant), adm_body_id(a, "tenant_id"));
    if (tenant_exists(a, tx, tenant) != 1 ||
        project_name_free(a, tx, tenant, vs.v[P_NAME], NULL) != 0)
        goto out;
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[8] = {tenant,       vs.v[P_NAME],    vs.v[P_RPM],   vs.v[P_TPM],
                        vs.v[P_CONC], vs.v[P_MONTHLY], vs.v[P_DAILY], at};
    if (adm_tx_write(a, tx,
                     "INSERT INTO projects(tenant_id, " PROJECT_VAL_COLUMNS ", created_at)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                     8, p, "name") < 0)
        goto out;
    int64_t pid = mg_store_tx_last_id(tx);
    adm_fmt_i64(id, sizeof(id), pid);
    snprintf(a->target, sizeof(a->target), "project:%s", id);
    cJSON *o = adm_tx_json(a, tx, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1", id,
                           project_json);
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (!o || adm_tx_commit(a, t) != 0) {
        if (!o) mg_store_tx_rollback(t);
        cJSON_Delete(o);
        goto out;
    }
    auth_project(a, pid, strtoll(tenant, NULL, 10), &vs);
    adm_set_answer(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

/* Read the settable columns of one row into vs (columns in slot order). */
typedef struct row_vals_s {
    vals_t *vs;
    int n;
    int rows;
    int oom;
} row_vals_t;

static void row_vals(void *ud, int ncols, const char *const *cols)
{
    row_vals_t *r = ud;
    if (r->rows++) return;
    for (int i = 0; i < r->n && i < ncols; i++)
        if (adm_vals_set(r->vs, i, cols[i]) != 0) r->oom = 1;
}

/* Load `n` columns (sql) of row id into vs. 1 found, 0 not found (404 set), -1 error. */
static int tx_vals(admin_t *a, mg_store_tx_t *tx, const char *sql, const char *id, int n,
                   vals_t *vs, const char *what)
{
    char err[256];
    row_vals_t r = {vs, n, 0, 0};
    const char *p[1] = {id};
    if (mg_store_tx_exec(tx, sql, 1, p, row_vals, &r, err, sizeof(err)) < 0) {
        adm_storage_error(a, err);
        return -1;
    }
    if (r.oom) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        return -1;
    }
    if (!r.rows) adm_set_error(a, 404, "NOT_FOUND", "%s %s does not exist", what, id);
    return r.rows ? 1 : 0;
}

static void project_update(admin_t *a, const char *id)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (adm_tx_begin(a, &tx) != 0 ||
        tx_vals(a, tx, "SELECT " PROJECT_VAL_COLUMNS " FROM projects WHERE id = ?1", id, P_N, &vs,
                "project") != 1 ||
        adm_apply_body(a, project_fields, NFIELDS(project_fields), "tenant_id", &vs) != 0)
        goto out;
    const char *pid[1] = {id};
    if (adm_tx_first(a, tx, "SELECT tenant_id FROM projects WHERE id = ?1", 1, pid, &f) != 0 ||
        project_name_free(a, tx, f.v[0], vs.v[P_NAME], id) != 0)
        goto out;
    const char *p[7] = {id,           vs.v[P_NAME],    vs.v[P_RPM],  vs.v[P_TPM],
                        vs.v[P_CONC], vs.v[P_MONTHLY], vs.v[P_DAILY]};
    if (adm_tx_write(a, tx,
                     "UPDATE projects SET name = ?2, rpm_limit = ?3, tpm_limit = ?4,"
                     " max_concurrency = ?5, monthly_limit_micros = ?6, daily_limit_micros = ?7"
                     " WHERE id = ?1",
                     7, p, "name") < 0)
        goto out;
    cJSON *o = adm_tx_json(a, tx, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1", id,
                           project_json);
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (!o || adm_tx_commit(a, t) != 0) {
        if (!o) mg_store_tx_rollback(t);
        cJSON_Delete(o);
        goto out;
    }
    auth_project(a, strtoll(id, NULL, 10), strtoll(f.v[0], NULL, 10), &vs);
    adm_set_answer(a, 200, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

static void project_get(admin_t *a, const char *id)
{
    char tenant[24];
    int q = id ? 0 : adm_query_id(a, "tenant_id", tenant, sizeof(tenant));
    if (q < 0) return;
    const char *p[1] = {tenant};
    adm_get_rows(a, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1",
                 q ? "SELECT " PROJECT_JSON_COLUMNS
                     " FROM projects WHERE tenant_id = ?1 ORDER BY id"
                   : "SELECT " PROJECT_JSON_COLUMNS " FROM projects ORDER BY id",
                 id, q, p, project_json, "project");
}

/* ---- keys ---------------------------------------------------------------------------------------
 */

static int key_defaults(vals_t *vs)
{
    static const struct {
        int slot;
        const char *v;
    } d[] = {{K_SCOPES, "[\"inference\"]"},
             {K_MODELS, "[]"},
             {K_PRIOS, "[\"P0\",\"P1\",\"P2\",\"P3\",\"P4\"]"},
             {K_RPM, "0"},
             {K_TPM, "0"},
             {K_CONC, "0"},
             {K_QUEUED, "0"},
             {K_DAILY, "0"},
             {K_MONTHLY, "0"},
             {K_LABELS, "{}"},
             {K_ENABLED, "1"}};
    for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
        if (adm_vals_set(vs, d[i].slot, d[i].v) != 0) return -1;
    return 0;
}

/* The project (when set) must exist and belong to the tenant; the name (when set) must be
 * unused among the tenant's live keys. 0, or -1 with the error set. */
static int key_refs_ok(admin_t *a, mg_store_tx_t *tx, const char *tenant, const vals_t *vs,
                       const char *self)
{
    first_t f;
    if (vs->v[K_PROJECT]) {
        const char *p[1] = {vs->v[K_PROJECT]};
        if (adm_tx_first(a, tx, "SELECT tenant_id FROM projects WHERE id = ?1", 1, p, &f) != 0)
            return -1;
        if (!f.rows) {
            adm_set_error(a, 404, "NOT_FOUND", "project %s does not exist", vs->v[K_PROJECT]);
            return -1;
        }
        if (strcmp(f.v[0], tenant) != 0 && a->scope_tenant) {
            adm_set_error(a, 404, "NOT_FOUND", "project %s does not exist", vs->v[K_PROJECT]);
            return -1;
        }
        if (strcmp(f.v[0], tenant) != 0) {
            adm_set_error(a, 400, "INVALID_REQUEST",
                          "field 'project_id': the project belongs to another tenant");
            return -1;
        }
    }
    if (vs->v[K_APP] && !mg_config_app(a->gen->cfg, vs->v[K_APP])) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'application': no application '%.100s'",
                      vs->v[K_APP]);
        return -1;
    }
    if (vs->v[K_NAME]) {
        const char *p[3] = {tenant, vs->v[K_NAME], self ? self : "0"};
        if (adm_tx_first(a, tx,
                         "SELECT id FROM api_keys WHERE tenant_id = ?1 AND name = ?2"
                         " AND revoked_at IS NULL AND id <> ?3",
                         3, p, &f) != 0)
            return -1;
        if (f.rows) {
            adm_set_error(a, 400, "INVALID_REQUEST",
                          "field 'name': the tenant has a key with this name");
            return -1;
        }
    }
    return 0;
}

/* Commit a key change and mirror it: select its JSON and auth record inside tx, commit,
 * then index the record. Takes tx. On success *out is the key's JSON. 0 or -1. */
static int key_commit(admin_t *a, mg_store_tx_t *tx, const char *id, cJSON **out)
{
    *out = NULL;
    mg_key_record_t *rec = tx_record(a, tx, id);
    cJSON *o = rec ? adm_tx_json(a, tx, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1",
                                 id, key_json)
                   : NULL;
    if (!o) {
        mg_key_record_unref(rec);
        mg_store_tx_rollback(tx);
        return -1;
    }
    if (adm_tx_commit(a, tx) != 0) {
        mg_key_record_unref(rec);
        cJSON_Delete(o);
        return -1;
    }
    auth_put(a, rec); /* database first, then memory */
    *out = o;
    return 0;
}

/* Generate a fresh key into a->clear_key with its digest (hex) and display form. */
static int new_key(admin_t *a, char *hex, char *display)
{
    unsigned char digest[MG_KEY_DIGEST_LEN];
    if (mg_key_generate(a->clear_key) != 0 ||
        mg_key_digest(a->clear_key, MG_KEY_LEN, digest) != 0 ||
        mg_key_display(a->clear_key, display) != 0) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "cannot generate a key");
        return -1;
    }
    mg_auth_digest_hex(digest, hex);
    OPENSSL_cleanse(digest, sizeof(digest));
    return 0;
}

/* Put the clear key into an answer (the only place it ever appears). */
static void answer_with_key(admin_t *a, int status, cJSON *o)
{
    cJSON_AddStringToObject(o, "key", a->clear_key);
    adm_set_answer(a, status, o);
}

static void key_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    char tenant[24], at[24], id[24], hex[2 * MG_KEY_DIGEST_LEN + 1], display[MG_KEY_DISPLAY_MAX];
    if (key_defaults(&vs) != 0) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (adm_apply_body(a, key_fields, NFIELDS(key_fields), NULL, &vs) != 0 ||
        adm_require(a, "tenant_id") != 0)
        goto out;
    if (vs.v[K_EXPIRES] && strtoll(vs.v[K_EXPIRES], NULL, 10) <= adm_now_s()) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'expires_at': must be in the future");
        goto out;
    }
    adm_fmt_i64(tenant, sizeof(tenant), adm_body_id(a, "tenant_id"));
    if (adm_tx_begin(a, &tx) != 0 || tenant_exists(a, tx, tenant) != 1 ||
        key_refs_ok(a, tx, tenant, &vs, NULL) != 0 || new_key(a, hex, display) != 0)
        goto out;
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[4 + K_N] = {tenant, hex, display, at};
    for (int i = 0; i < K_N; i++) p[4 + i] = vs.v[i];
    if (adm_tx_write(
            a, tx,
            "INSERT INTO api_keys(tenant_id, digest, display, created_at, " KEY_VAL_COLUMNS ")"
            " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
            " ?17, ?18, ?19)",
            4 + K_N, p, "name") < 0)
        goto out;
    adm_fmt_i64(id, sizeof(id), mg_store_tx_last_id(tx));
    snprintf(a->target, sizeof(a->target), "key:%s", id);
    cJSON *o;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (key_commit(a, t, id, &o) != 0) goto out;
    answer_with_key(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

/* Start a change of key `id`: begin, and check that it exists and is not revoked. The
 * tenant id and digest (hex) are returned in f->v[0] and f->v[1]. 0, or -1 (error set, tx
 * rolled back). */
static int key_begin(admin_t *a, const char *id, mg_store_tx_t **tx, first_t *f)
{
    const char *p[1] = {id};
    if (adm_tx_begin(a, tx) != 0) return -1;
    if (adm_tx_first(a, *tx, "SELECT tenant_id, digest, revoked_at FROM api_keys WHERE id = ?1", 1,
                     p, f) != 0)
        goto fail;
    if (!f->rows) {
        adm_set_error(a, 404, "NOT_FOUND", "key %s does not exist", id);
        goto fail;
    }
    if (f->cols[2]) {
        adm_set_error(a, 409, "CONFLICT", "key %s is revoked and cannot change", id);
        goto fail;
    }
    return 0;
fail:
    mg_store_tx_rollback(*tx);
    *tx = NULL;
    return -1;
}

static void key_update(admin_t *a, const char *id)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (key_begin(a, id, &tx, &f) != 0 ||
        tx_vals(a, tx, "SELECT " KEY_VAL_COLUMNS " FROM api_keys WHERE id = ?1", id, K_N, &vs,
                "key") != 1 ||
        adm_apply_body(a, key_fields, NFIELDS(key_fields), "tenant_id", &vs) != 0 ||
        key_refs_ok(a, tx, f.v[0], &vs, id) != 0)
        goto out;
    const char *p[1 + K_N] = {id};
    for (int i = 0; i < K_N; i++) p[1 + i] = vs.v[i];
    if (adm_tx_write(
            a, tx,
            "UPDATE api_keys SET project_id = ?2, name = ?3, scopes = ?4, models = ?5,"
            " priorities = ?6, rpm_limit = ?7, tpm_limit = ?8, max_concurrency = ?9,"
            " max_queued = ?10, daily_limit_micros = ?11, monthly_limit_micros = ?12,"
            " expires_at = ?13, labels = ?14, enabled = ?15, application = ?16 WHERE id = ?1",
            1 + K_N, p, "name") < 0)
        goto out;
    cJSON *o;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (key_commit(a, t, id, &o) == 0) adm_set_answer(a, 200, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

static void key_set_enabled(admin_t *a, const char *id, int enabled)
{
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (adm_no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    const char *p[2] = {id, enabled ? "1" : "0"};
    if (adm_tx_write(a, tx, "UPDATE api_keys SET enabled = ?2 WHERE id = ?1", 2, p, "enabled") <
        0) {
        mg_store_tx_rollback(tx);
        return;
    }
    cJSON *o;
    if (key_commit(a, tx, id, &o) == 0) adm_set_answer(a, 200, o);
}

static void key_delete(admin_t *a, const char *id)
{
    mg_store_tx_t *tx = NULL;
    first_t f;
    char at[24];
    unsigned char digest[MG_KEY_DIGEST_LEN];
    if (adm_no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[2] = {id, at};
    if (adm_tx_write(a, tx, "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1", 2, p, "id") < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    if (adm_tx_commit(a, tx) != 0) return;
    if (mg_auth_digest_parse(f.v[1], digest) == 0) adm_fx(a, ADM_FX_REMOVE_KEY, NULL, digest, NULL);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)strtoll(id, NULL, 10));
    cJSON_AddStringToObject(o, "object", "api_key");
    cJSON_AddBoolToObject(o, "deleted", 1);
    adm_set_answer(a, 200, o);
}

/* Rotation: in one transaction revoke the old key and insert the new one with the same
 * policy; then swap them in the index in one step (mg_auth_rotate_key). The old key is
 * valid until that step and the new one from it: never both, never neither. */
static void key_rotate(admin_t *a, const char *id)
{
    mg_store_tx_t *tx = NULL;
    first_t f;
    char at[24], nid[24], hex[2 * MG_KEY_DIGEST_LEN + 1], display[MG_KEY_DISPLAY_MAX];
    unsigned char old_digest[MG_KEY_DIGEST_LEN];
    if (adm_no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[4] = {id, at, NULL, NULL};
    if (new_key(a, hex, display) != 0 ||
        adm_tx_write(a, tx, "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1", 2, p, "id") < 0)
        goto fail;
    p[1] = hex;
    p[2] = display;
    p[3] = at;
    if (adm_tx_write(
            a, tx,
            "INSERT INTO api_keys(tenant_id, digest, display, created_at, " KEY_VAL_COLUMNS ")"
            " SELECT tenant_id, ?2, ?3, ?4, " KEY_VAL_COLUMNS " FROM api_keys WHERE id = ?1",
            4, p, "name") < 0)
        goto fail;
    adm_fmt_i64(nid, sizeof(nid), mg_store_tx_last_id(tx));
    const char *q[2] = {id, nid};
    if (adm_tx_write(a, tx, "UPDATE api_keys SET replaced_by = ?2 WHERE id = ?1", 2, q, "id") < 0)
        goto fail;
    mg_key_record_t *rec = tx_record(a, tx, nid);
    cJSON *o = rec ? adm_tx_json(a, tx, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1",
                                 nid, key_json)
                   : NULL;
    if (!o || adm_tx_commit(a, tx) != 0) {
        if (!o) mg_store_tx_rollback(tx);
        mg_key_record_unref(rec);
        cJSON_Delete(o);
        return;
    }
    snprintf(a->target, sizeof(a->target), "key:%s", id);
    if (mg_auth_digest_parse(f.v[1], old_digest) == 0)
        adm_fx(a, ADM_FX_ROTATE_KEY, rec, old_digest, NULL);
    else adm_fx(a, ADM_FX_PUT_KEY, rec, NULL, NULL); /* cannot happen: the digest is ours */
    cJSON_AddNumberToObject(o, "replaces", (double)strtoll(id, NULL, 10));
    answer_with_key(a, 200, o);
    return;
fail:
    mg_store_tx_rollback(tx);
}

static void key_get(admin_t *a, const char *id)
{
    if (id) {
        adm_get_rows(a, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1", NULL, id, 0,
                     NULL, key_json, "key");
        return;
    }
    char tenant[24] = "", project[24] = "", revoked[8] = "";
    int qt = adm_query_id(a, "tenant_id", tenant, sizeof(tenant));
    int qp = qt < 0 ? -1 : adm_query_id(a, "project_id", project, sizeof(project));
    if (qt < 0 || qp < 0) return;
    adm_query_param(a, "include_revoked", revoked, sizeof(revoked));
    int all = strcmp(revoked, "1") == 0 || strcmp(revoked, "true") == 0;
    const char *p[3] = {qt ? tenant : NULL, qp ? project : NULL, all ? "1" : "0"};
    adm_get_rows(a, NULL,
                 "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE (?1 IS NULL OR tenant_id = ?1)"
                 " AND (?2 IS NULL OR project_id = ?2) AND (?3 = '1' OR revoked_at IS NULL)"
                 " ORDER BY id",
                 NULL, 3, p, key_json, "key");
}

/* ---- audit trail --------------------------------------------------------------------------------
 */

#define AUDIT_JSON_COLUMNS "id, at, actor, action, target, status, request_id, client_addr"
static cJSON *audit_json(int ncols, const char *const *c)
{
    if (ncols < 8) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    adm_add_int(o, "at_ms", c[1]);
    adm_add_str(o, "actor", c[2]);
    adm_add_str(o, "action", c[3]);
    adm_add_str(o, "target", c[4]);
    adm_add_int(o, "status", c[5]);
    adm_add_str(o, "request_id", c[6]);
    adm_add_str(o, "client_addr", c[7]);
    return o;
}

/* GET /api/v2/audit[?limit=N]: the newest records first (N 1..1000, default 100). */
static void audit_list(admin_t *a)
{
    char limit[24] = "100";
    int q = adm_query_id(a, "limit", limit, sizeof(limit));
    if (q < 0) return;
    if (strtoll(limit, NULL, 10) > 1000) snprintf(limit, sizeof(limit), "1000");
    const char *p[1] = {limit};
    adm_get_rows(a, NULL,
                 "SELECT " AUDIT_JSON_COLUMNS " FROM audit_logs ORDER BY at DESC, id DESC LIMIT ?1",
                 NULL, 1, p, audit_json, "record");
}

/* ---- usage (GET /api/v2/usage) ------------------------------------------------------------------
 */

#define USAGE_JSON_COLUMNS                                                                         \
    "s.scope, s.id, COALESCE(k.tenant_id, p.tenant_id, CASE s.scope WHEN 'tenant' THEN s.id END)," \
    " s.period, s.micros"
static cJSON *usage_json(int ncols, const char *const *c)
{
    if (ncols < 5) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_str(o, "scope", c[0]);
    adm_add_int(o, "id", c[1]);
    adm_add_int(o, "tenant_id", c[2]);
    adm_add_str(o, "period", c[3]);
    adm_add_int(o, "spent_micros", c[4]);
    return o;
}

/* Metered spend per key and project and period ("d:YYYY-MM-DD", "m:YYYY-MM"), newest
 * periods first; ?tenant_id= filters (a tenant admin always sees only its own). */
static void usage_list(admin_t *a)
{
    char tenant[24];
    int q = adm_query_id(a, "tenant_id", tenant, sizeof(tenant));
    if (q < 0) return;
    const char *p[1] = {q ? tenant : NULL};
    adm_get_rows(a, NULL,
                 "SELECT " USAGE_JSON_COLUMNS " FROM spend s"
                 " LEFT JOIN api_keys k ON s.scope = 'key' AND k.id = s.id"
                 " LEFT JOIN projects p ON s.scope = 'project' AND p.id = s.id"
                 " WHERE ?1 IS NULL OR COALESCE(k.tenant_id, p.tenant_id,"
                 "  CASE s.scope WHEN 'tenant' THEN s.id END) = CAST(?1 AS INTEGER)"
                 " ORDER BY s.period DESC, s.scope, s.id LIMIT 1000",
                 NULL, 1, p, usage_json, "usage");
}

/* ---- runtime settings (GET/PUT /api/v2/config) -------------------------------------------------
 */

static void key_name(void *ud, int ncols, const char *const *cols)
{
    if (ncols >= 1 && cols[0]) cJSON_AddItemToArray(ud, cJSON_CreateString(cols[0]));
}

/* The keys the store overrides, as a JSON array; NULL with the error set. */
static cJSON *overridden_keys(admin_t *a)
{
    char err[256];
    cJSON *keys = cJSON_CreateArray();
    if (keys && mg_store_query(a->store, "SELECT key FROM system_config ORDER BY key", 0, NULL,
                               key_name, keys, err, sizeof(err)) == 0)
        return keys;
    cJSON_Delete(keys);
    adm_storage_error(a, keys ? err : "out of memory");
    return NULL;
}

static void config_get(admin_t *a)
{
    cJSON *keys = overridden_keys(a);
    if (!keys) return;
    adm_set_answer(a, 200, mg_settings_json(a->gen->cfg, keys));
    cJSON_Delete(keys);
}

/* PUT {key: value | null, ...}: every member validated first (adm_setting_write_tx, in
 * admin/defs.c), then one transaction; null removes the override (the config file's value
 * comes back). */

/* The config view after the rebuild: the new generation's settings. */
static cJSON *config_view(const mg_config_t *cfg, cJSON *prev)
{
    cJSON *keys = cJSON_DetachItemFromObject(prev, "overridden");
    cJSON *o = mg_settings_json(cfg, keys);
    cJSON_Delete(keys);
    return o;
}

static void config_put(admin_t *a)
{
    const cJSON *m;
    char text[64], err[256];
    mg_store_tx_t *tx = NULL;
    cJSON_ArrayForEach(m, a->in) {
        if (cJSON_IsNull(m) && mg_settings_known(m->string)) continue;
        if (mg_settings_check(m->string, m, text, sizeof(text), err, sizeof(err)) != 0) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field %s", err);
            return;
        }
    }
    if (adm_tx_begin(a, &tx) != 0) return;
    cJSON_ArrayForEach(m, a->in) {
        if (adm_setting_write_tx(a, tx, m->string, m) != 0) {
            mg_store_tx_rollback(tx);
            return;
        }
    }
    if (adm_tx_commit(a, tx) != 0) return;
    cJSON *keys = overridden_keys(a);
    if (!keys) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "overridden", keys);
    adm_set_answer(a, 200, o);
    a->rebuild = 1;
    a->answer_from = config_view;
}

/* ---- routing ------------------------------------------------------------------------------------
 */

/* Split "coll[/id[/verb]]" into its parts (in buf). 0, or -1 when the shape is wrong. */
static int split_path(const char *sub, char *buf, size_t cap, char **coll, char **id, char **verb)
{
    *coll = *id = *verb = NULL;
    if (strlen(sub) >= cap) return -1;
    strcpy(buf, sub);
    *coll = buf;
    char *s = strchr(buf, '/');
    if (!s) return 0;
    *s++ = '\0';
    *id = s;
    if ((s = strchr(s, '/'))) {
        *s++ = '\0';
        *verb = s;
        if (strchr(s, '/') || !*s) return -1;
    }
    return **id ? 0 : -1;
}

static int numeric_id(const char *id)
{
    size_t n = strlen(id);
    return n > 0 && n <= 15 && strspn(id, "0123456789") == n;
}

static int method_is(const admin_t *a, int m)
{
    return a->method == m;
}

/* The handler for a collection path ({id} absent) or an item path. 1 when one ran. */
static int route_plain(admin_t *a, const char *coll, const char *id)
{
    int get = method_is(a, HTTP_GET), post = method_is(a, HTTP_POST) && !id,
        put = method_is(a, HTTP_PUT) && id, del = method_is(a, HTTP_DELETE) && id;
    if (strcmp(coll, "tenants") == 0) {
        a->action = get ? (id ? "tenant.get" : "tenant.list") : post ? "tenant.create" : NULL;
        if (get) tenant_get(a, id);
        else if (post) tenant_create(a);
    } else if (strcmp(coll, "projects") == 0) {
        a->action = get    ? (id ? "project.get" : "project.list")
                    : post ? "project.create"
                    : put  ? "project.update"
                           : NULL;
        if (get) project_get(a, id);
        else if (post) project_create(a);
        else if (put) project_update(a, id);
    } else {
        a->action = get    ? (id ? "key.get" : "key.list")
                    : post ? "key.create"
                    : put  ? "key.update"
                    : del  ? "key.delete"
                           : NULL;
        if (get) key_get(a, id);
        else if (post) key_create(a);
        else if (put) key_update(a, id);
        else if (del) key_delete(a, id);
    }
    return a->action != NULL;
}

/* POST /api/v2/keys/{id}/{disable|enable|rotate}. 1 when one ran. */
static int route_key_verb(admin_t *a, const char *id, const char *verb)
{
    if (strcmp(verb, "disable") == 0) a->action = "key.disable";
    else if (strcmp(verb, "enable") == 0) a->action = "key.enable";
    else if (strcmp(verb, "rotate") == 0) a->action = "key.rotate";
    else return 0;
    if (!method_is(a, HTTP_POST)) return 0;
    if (verb[0] == 'r') key_rotate(a, id);
    else key_set_enabled(a, id, verb[0] == 'e');
    return 1;
}

/* Which handler, by collection, id, action and method; sets a->action and a->target. */
static void route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    static const char *const colls[3][2] = {
        {"tenants", "tenant"}, {"projects", "project"}, {"keys", "key"}};
    const char *kind = NULL;
    if (adm_scope_check(a, coll, id, verb) != 0) {
        a->action = "admin.denied";
        return;
    }
    if (strcmp(coll, "admin-tokens") == 0 && !verb && (!id || numeric_id(id))) {
        adm_admin_tokens_route(a, id);
        return;
    }
    if (adm_stats_route(a, coll, id, verb) || adm_prices_route(a, coll, id, verb)) return;
    if (strcmp(coll, "usage") == 0 && !id && method_is(a, HTTP_GET)) {
        a->action = "usage.read";
        usage_list(a);
        return;
    }
    if (strcmp(coll, "providers") == 0) {
        adm_providers_route(a, id, verb);
        return;
    }
    if (adm_defs_route(a, coll, id, verb) || adm_views_route(a, coll, id, verb)) return;
    if (strcmp(coll, "config") == 0 && !id) {
        int get = method_is(a, HTTP_GET), put = method_is(a, HTTP_PUT);
        a->action = get ? "config.get" : put ? "config.update" : "config.invalid";
        if (get) config_get(a);
        else if (put) config_put(a);
        else adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "use GET or PUT");
        return;
    }
    if (adm_cooldowns_route(a, coll, id, verb)) return;
    if (!strcmp(coll, "pools") || !strcmp(coll, "cooldowns")) {
        a->action = "admin.read_only"; /* front.c answers their reads */
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "this admin endpoint is read-only");
        return;
    }
    if (strcmp(coll, "audit") == 0 && !id && method_is(a, HTTP_GET)) {
        a->action = "audit.list";
        audit_list(a);
        return;
    }
    if (adm_billing_route(a, coll, id, verb)) return;
    for (int i = 0; i < 3; i++)
        if (strcmp(coll, colls[i][0]) == 0) kind = colls[i][1];
    if (!kind || (verb && strcmp(kind, "key") != 0) || (id && !numeric_id(id))) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
        return;
    }
    if (id) snprintf(a->target, sizeof(a->target), "%s:%s", kind, id);
    if (verb ? route_key_verb(a, id, verb) : route_plain(a, coll, id)) return;
    if (verb && !a->action) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
        return;
    }
    if (!a->action) a->action = "admin.unknown";
    adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
}

/* Parse the body into a->in (an object; empty body = {}). 0, or -1 with the error set. */
static int parse_body(admin_t *a, const mg_http_req_t *req)
{
    a->in = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : cJSON_CreateObject();
    if (cJSON_IsObject(a->in)) return 0;
    cJSON_Delete(a->in);
    a->in = NULL;
    adm_set_error(a, 400, "INVALID_REQUEST", "request body is not a JSON object");
    return -1;
}

/* ---- audit -----------------------------------------------------------------------------------
 */

#define AUDIT_INSERT                                                                               \
    "INSERT INTO audit_logs(at, actor, action, target, status, request_id, client_addr)"           \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"

/* Replicated, the control plane out of reach: the record stays here, listed as not shipped
 * yet (store migration 25); the control follower appends it to the log once it is back. */
#define AUDIT_INSERT_UNSHIPPED                                                                     \
    "INSERT INTO audit_unshipped_new(at, actor, action, target, status, request_id, client_addr)"  \
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"

typedef struct audit_row_s {
    char at[24], status[8];
    const char *p[7];
} audit_row_t;

static void audit_row(audit_row_t *r, const char *actor, const char *action, const char *target,
                      int status, const char *request_id, const char *addr)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    adm_fmt_i64(r->at, sizeof(r->at), (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    snprintf(r->status, sizeof(r->status), "%d", status);
    const char *p[7] = {r->at,
                        actor,
                        action,
                        target && *target ? target : NULL,
                        r->status,
                        request_id && *request_id ? request_id : NULL,
                        addr && *addr ? addr : NULL};
    memcpy(r->p, p, sizeof(p));
}

static void audit_failed(const char *request_id, const char *actor, const char *action,
                         const char *target, int status, const char *addr, const char *err)
{
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_ERROR, "audit write failed");
    mg_log_str(&l, "request_id", request_id);
    mg_log_str(&l, "actor", actor);
    mg_log_str(&l, "action", action);
    mg_log_str(&l, "target", target);
    mg_log_int(&l, "status", status);
    mg_log_str(&l, "client_addr", addr);
    mg_log_str(&l, "error", err);
    mg_log_end(&l);
}

/* On the worker, after the change: its own transaction, committed before the answer. */
static void audit_sync(admin_t *a)
{
    mg_store_tx_t *tx = NULL;
    char err[256] = "";
    audit_row_t r;
    if (a->unauthenticated) { /* a tenant admin token that resolved to nobody */
        a->action = "admin.auth_failed";
        snprintf(a->actor, sizeof(a->actor), UNAUTHENTICATED_ACTOR);
    }
    audit_row(&r, a->actor, a->action, a->target, a->status, a->request_id, a->peer);
    int rc = mg_store_tx_begin(a->store, &tx, err, sizeof(err));
    if (rc == 0) rc = mg_store_tx_exec(tx, AUDIT_INSERT, 7, r.p, NULL, NULL, err, sizeof(err));
    if (rc >= 0) rc = mg_store_tx_commit(tx, err, sizeof(err));
    else if (rc != MG_STORE_EUNAVAIL) mg_store_tx_rollback(tx);
    /* the shared control plane is down: the record stays here until it is back */
    if (rc == MG_STORE_EUNAVAIL && mg_store_write(a->store, AUDIT_INSERT_UNSHIPPED, 7, r.p) == 0)
        rc = 0;
    if (rc < 0)
        audit_failed(a->request_id, a->actor, a->action, a->target, a->status, a->peer, err);
}

static void admin_start(mg_admin_t *adm);

/* The audit-only items a replicated instance may have waiting for the worker: past it (a flood
 * of refused sign-ins, the control plane slow) a record is written here and shipped later. */
#define AUDIT_QUEUE_MAX 256

/* Replicated (cluster.postgres): a record written on the loop joins the worker's queue and is
 * written in a transaction of its own there, as a request's is (audit_sync), so the control
 * log carries it to the other instances. 0, or -1 when it stays with the caller. */
static int audit_enqueue(mg_admin_t *adm, const char *actor, const char *action, const char *target,
                         int status, const char *request_id, const char *addr)
{
    if (!adm->d.replicated || adm->audits_queued >= AUDIT_QUEUE_MAX) return -1;
    admin_t *a = calloc(1, sizeof(*a));
    if (!a) return -1;
    a->adm = adm;
    a->store = adm->d.store;
    a->audit_only = 1;
    a->action = action;
    a->status = status;
    snprintf(a->actor, sizeof(a->actor), "%s", actor);
    snprintf(a->target, sizeof(a->target), "%s", target ? target : "");
    snprintf(a->request_id, sizeof(a->request_id), "%s", request_id ? request_id : "");
    snprintf(a->peer, sizeof(a->peer), "%s", addr ? addr : "");
    admin_t **tail = &adm->queue;
    while (*tail) tail = &(*tail)->next;
    *tail = a;
    adm->audits_queued++;
    admin_start(adm);
    return 0;
}

/* On the loop: through the worker when replicated, else by the store's writer. */
static void audit_write(mg_admin_t *adm, const char *actor, const char *action, const char *target,
                        int status, const char *request_id, const char *addr)
{
    if (audit_enqueue(adm, actor, action, target, status, request_id, addr) == 0) return;
    audit_row_t r;
    audit_row(&r, actor, action, target, status, request_id, addr);
    if (mg_store_write(adm->d.store, adm->d.replicated ? AUDIT_INSERT_UNSHIPPED : AUDIT_INSERT, 7,
                       r.p) != 0)
        audit_failed(request_id, actor, action, target, status, addr, "the store is not writable");
}

static void audit_async(mg_admin_t *adm, const mg_http_req_t *req, const char *actor,
                        const char *action, const char *target, int status)
{
    char addr[80];
    mg_http_peer(req, addr, sizeof(addr));
    audit_write(adm, actor, action, target, status, req->request_id, addr);
}

void mg_admin_audit(mg_admin_t *adm, const mg_http_req_t *req, const char *action,
                    const char *target, int status)
{
    audit_async(adm, req, PLATFORM_ACTOR, action, target, status);
}

void mg_admin_audit_system(mg_admin_t *adm, const char *action, const char *target)
{
    audit_write(adm, SYSTEM_ACTOR, action, target, 200, NULL, NULL);
}

void mg_admin_audit_auth_failed(mg_admin_t *adm, const mg_http_req_t *req)
{
    audit_async(adm, req, UNAUTHENTICATED_ACTOR, "admin.auth_failed", NULL, 401);
}

/* ---- dispatch ----------------------------------------------------------------------------------
 */

/* Worker thread: route, handle, audit. */
static void admin_work(uv_work_t *w)
{
    admin_t *a = w->data;
    char buf[256], *coll, *id, *verb;
    if (a->audit_only) {
        audit_sync(a);
        return;
    }
    if (!a->code && adm_scope_resolve(a) != 0) a->action = "admin.auth";
    if (!a->code) {
        if (strncmp(a->path, "/api/v2/", 8) != 0 ||
            split_path(a->path + 8, buf, sizeof(buf), &coll, &id, &verb) != 0) {
            a->action = "admin.unknown";
            adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
        } else {
            route(a, coll, id, verb);
        }
    }
    if (!a->action) a->action = "admin.unknown";
    if (!a->code && !a->answer) adm_set_error(a, 500, "INTERNAL_ERROR", "no answer");
    audit_sync(a);
}

/* A committed change could not be mirrored in memory (out of memory): rebuild the whole
 * auth state from the store, so memory follows the database again. This reads the store on
 * the loop thread; it only happens after an allocation failed. */
static void auth_resync(admin_t *a, int rc)
{
    char err[256];
    mg_log_msg(MG_LOG_ERROR, a->request_id,
               "admin %s: in-memory key index update failed (%d); reloading it from the store",
               a->action, rc);
    if (mg_auth_load(a->adm->d.auth, a->store, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_ERROR, a->request_id, "auth reload failed: %s", err);
}

/* Loop thread: the committed change reaches the auth state. */
static void apply_effects(admin_t *a)
{
    mg_auth_t *auth = a->adm->d.auth;
    for (int i = 0; i < a->n_fx; i++) {
        admin_fx_t *fx = &a->fx[i];
        int rc = 0;
        if (auth && fx->kind == ADM_FX_PUT_KEY) rc = mg_auth_put_key(auth, fx->rec);
        else if (auth && fx->kind == ADM_FX_REMOVE_KEY) rc = mg_auth_remove_key(auth, fx->digest);
        else if (auth && fx->kind == ADM_FX_ROTATE_KEY)
            rc = mg_auth_rotate_key(auth, fx->digest, fx->rec);
        else if (auth && fx->kind == ADM_FX_PUT_PROJECT)
            rc = mg_auth_put_project(auth, &fx->project);
        else if (auth && fx->kind == ADM_FX_PUT_TENANT) rc = mg_auth_put_tenant(auth, &fx->tenant);
        if (rc != 0) auth_resync(a, rc);
        mg_key_record_unref(fx->rec);
        fx->rec = NULL;
    }
    a->n_fx = 0;
}

/* Answer a success body: metrics, the request log line, the response; the printed body is
 * wiped before it is freed (it may hold a key shown once). */
static void respond(admin_t *a)
{
    mg_http_req_t *req = a->req;
    mg_buf_t text = {0};
    if (mg_json_print(a->answer, &text) != 0) {
        mg_buf_free(&text);
        mg_answer_error(a->adm->d.metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory",
                        0);
        return;
    }
    double secs = (double)(uv_now(a->adm->d.loop) - req->start_ms) / 1000.0;
    mg_metrics_request(a->adm->d.metrics, MG_EP_OTHER, a->status, secs);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "request");
    mg_http_log_ids(&l, req);
    mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
    mg_log_str(&l, "path", req->path);
    mg_log_int(&l, "status", a->status);
    mg_log_str(&l, "admin_action", a->action);
    mg_log_end(&l);
    mg_http_respond(req, a->status, "application/json", NULL, text.data, text.len);
    OPENSSL_cleanse(text.data, text.len);
    mg_buf_free(&text);
}

static void admin_free(admin_t *a)
{
    cJSON *k = a->answer ? cJSON_GetObjectItemCaseSensitive(a->answer, "key") : NULL;
    if (cJSON_IsString(k)) OPENSSL_cleanse(k->valuestring, strlen(k->valuestring));
    cJSON_Delete(a->answer);
    OPENSSL_cleanse(a->clear_key, sizeof(a->clear_key));
    for (int i = 0; i < a->n_fx; i++) mg_key_record_unref(a->fx[i].rec);
    cJSON_Delete(a->in);
    free(a->query);
    free(a->raw_body);
    if (a->tenant_token) OPENSSL_cleanse(a->tenant_token, strlen(a->tenant_token));
    free(a->tenant_token);
    if (a->gen) mg_gen_unref(a->gen);
    free(a);
}

/* Answer (when the client is still there) and free. */
static void admin_finish(admin_t *a)
{
    if (a->req) {
        a->req->on_abort = NULL;
        if (a->code)
            mg_answer_error(a->adm->d.metrics, a->req, MG_EP_OTHER, a->status, a->code, a->message,
                            0);
        else respond(a);
    }
    admin_free(a);
}

/* The generation with the provider change is in place (or could not be built). */
static void admin_rebuilt(void *ud, int ok, const char *err)
{
    admin_t *a = ud;
    if (!ok && !a->code) {
        /* committed, but not serving: say so rather than pretend */
        mg_log_msg(MG_LOG_ERROR, a->request_id,
                   "admin %s: stored, but the new generation failed: %s", a->action, err);
        cJSON_AddFalseToObject(a->answer, "applied");
        cJSON_AddStringToObject(a->answer, "apply_error", err);
    } else if (ok && a->answer_from && a->answer) {
        /* the resource as the new generation has it */
        adm_set_answer(a, a->status,
                       a->answer_from(mg_gens_current(a->adm->d.gens)->cfg, a->answer));
    }
    admin_finish(a);
}

static void admin_done(uv_work_t *w, int status)
{
    admin_t *a = w->data;
    mg_admin_t *adm = a->adm;
    (void)status;
    adm->running = NULL;
    if (a->audit_only) adm->audits_queued--;
    if (a->unauthenticated) {
        char addr[64];
        mg_authfail_addr(a->peer, addr, sizeof(addr));
        mg_authfail_count(&adm->fails, addr, uv_now(adm->d.loop));
    }
    apply_effects(a);
    if (a->rebuild) adm->d.rebuild(adm->d.rebuild_ud, admin_rebuilt, a);
    else admin_finish(a);
    admin_start(adm);
}

/* Run the next queued request, if the worker is free. */
static void admin_start(mg_admin_t *adm)
{
    admin_t *a = adm->queue;
    if (adm->running || !a) return;
    adm->queue = a->next;
    adm->running = a;
    a->work.data = a;
    if (uv_queue_work(adm->d.loop, &a->work, admin_work, admin_done) != 0) {
        adm->running = NULL;
        adm_set_error(a, 500, "INTERNAL_ERROR", "cannot start the admin request");
        admin_finish(a);
        admin_start(adm);
    }
}

/* The client left: the request still runs to the end (its change is committed and
 * audited), nobody is answered. */
static void admin_abort(void *data)
{
    admin_t *a = data;
    a->req = NULL;
}

void adm_enqueue(mg_admin_t *adm, mg_http_req_t *req, const char *tenant_token)
{
    admin_t *a = calloc(1, sizeof(*a));
    if (!a) {
        mg_answer_error(adm->d.metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory",
                        0);
        return;
    }
    a->adm = adm;
    a->store = adm->d.store;
    a->req = req;
    a->gen = mg_gens_acquire(adm->d.gens);
    a->method = req->method;
    snprintf(a->actor, sizeof(a->actor), "%s", PLATFORM_ACTOR);
    if (tenant_token && !(a->tenant_token = strdup(tenant_token)))
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    snprintf(a->path, sizeof(a->path), "%s", req->path);
    snprintf(a->request_id, sizeof(a->request_id), "%s", req->request_id);
    mg_http_peer(req, a->peer, sizeof(a->peer));
    if (strncmp(req->path, "/api/v2/webhooks/", 17) == 0) {
        /* a signed webhook: its signature covers the body's exact bytes */
        const char *sig = mg_http_header(req, "Moongate-Signature");
        snprintf(a->signature, sizeof(a->signature), "%s", sig ? sig : "");
        snprintf(a->actor, sizeof(a->actor), "webhook");
        if ((a->raw_body = malloc(req->body_len + 1))) {
            memcpy(a->raw_body, req->body, req->body_len);
            a->raw_body[req->body_len] = '\0';
            a->raw_len = req->body_len;
        }
    }
    if (req->query && !(a->query = strdup(req->query)))
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    else if (strlen(req->path) >= sizeof(a->path))
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    else if (parse_body(a, req) != 0) a->action = "admin.invalid";
    req->on_abort = admin_abort;
    req->hook_data = a;
    admin_t **tail = &adm->queue;
    while (*tail) tail = &(*tail)->next;
    *tail = a;
    admin_start(adm);
}
