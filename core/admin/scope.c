/* scope: who may do what in the admin API (multi-tenant design: platform roles have no
 * tenant, tenant roles are bound to one; permission is checked before the handler runs and
 * tenant filtering happens in the queries or by an ownership check).
 *
 *   MOONGATE_ADMIN_TOKEN    the platform admin: every endpoint, every tenant.
 *   tenant admin tokens     "mgt-" + 40 base62, created by the platform admin with
 *                           POST /api/v2/admin-tokens {tenant_id, name?} (shown in clear once,
 *                           stored as a SHA-256 digest), revoked with DELETE
 *                           /api/v2/admin-tokens/{id}. They see and change only their own
 *                           tenant's projects and keys, read their tenant and its usage;
 *                           everything else is 403 PERMISSION_DENIED, and another tenant's
 *                           records answer 404 exactly as records that do not exist.
 *
 * The token is resolved on the admin worker thread (a digest lookup in the store), so the
 * loop thread only ever compares against the platform token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>

#include "admin/req.h"

#define TOKEN_PREFIX "mgt-"
#define TOKEN_JSON_COLUMNS "id, tenant_id, name, display, created_at, revoked_at"

/* ---- resolving a tenant admin token ---------------------------------------------------------- */

static int token_digest_hex(const char *token, char *hex)
{
    unsigned char d[MG_KEY_DIGEST_LEN];
    if (mg_key_digest(token, strlen(token), d) != 0) return -1;
    mg_auth_digest_hex(d, hex);
    OPENSSL_cleanse(d, sizeof(d));
    return 0;
}

int adm_tenant_token_lookup(mg_store_t *st, const char *token, int64_t *tenant_id, char *token_id,
                            size_t cap, char *err, size_t errlen)
{
    char hex[2 * MG_KEY_DIGEST_LEN + 1];
    first_t f;
    memset(&f, 0, sizeof(f));
    if (strncmp(token, TOKEN_PREFIX, 4) != 0 || strlen(token) >= 128 ||
        token_digest_hex(token, hex) != 0)
        return 0;
    const char *p[1] = {hex};
    if (mg_store_query(st,
                       "SELECT id, tenant_id FROM admin_tokens WHERE digest = ?1"
                       " AND revoked_at IS NULL",
                       1, p, adm_first_row, &f, err, errlen) != 0)
        return -1;
    if (!f.rows) return 0;
    *tenant_id = strtoll(f.v[1], NULL, 10);
    size_t n = strnlen(f.v[0], cap - 1); /* an id: digits, far shorter than cap */
    memcpy(token_id, f.v[0], n);
    token_id[n] = '\0';
    return 1;
}

int adm_scope_resolve(admin_t *a)
{
    if (!a->tenant_token) return 0; /* the platform token, checked on the loop */
    char err[256], id[32];
    int found = adm_tenant_token_lookup(a->store, a->tenant_token, &a->scope_tenant, id, sizeof(id),
                                        err, sizeof(err));
    OPENSSL_cleanse(a->tenant_token, strlen(a->tenant_token));
    if (found < 0) {
        adm_storage_error(a, err);
        return -1;
    }
    if (!found) {
        a->unauthenticated = 1; /* audited as admin.auth_failed, counted per address */
        adm_set_error(a, 401, "AUTH_FAILED", "invalid admin token");
        return -1;
    }
    snprintf(a->actor, sizeof(a->actor), "tenant-admin:%.24s", id);
    return 0;
}

/* ---- what a tenant admin may do ------------------------------------------------------------ */

/* 1 when row id of table belongs to the scope's tenant; else 0 with a 404 set (another
 * tenant's record looks exactly like a missing one), -1 on storage errors. */
static int owned(admin_t *a, const char *table, const char *what, const char *id)
{
    char sql[96], err[256], scope[24];
    first_t f;
    memset(&f, 0, sizeof(f));
    snprintf(sql, sizeof(sql), "SELECT 1 FROM %s WHERE id = ?1 AND tenant_id = ?2", table);
    adm_fmt_i64(scope, sizeof(scope), a->scope_tenant);
    const char *p[2] = {id, scope};
    if (mg_store_query(a->store, sql, 2, p, adm_first_row, &f, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
        return -1;
    }
    if (f.rows) return 1;
    adm_set_error(a, 404, "NOT_FOUND", "%s %s does not exist", what, id);
    return 0;
}

static int forbidden(admin_t *a)
{
    adm_set_error(a, 403, "PERMISSION_DENIED",
                  "this admin endpoint needs the platform admin token");
    return -1;
}

/* A create must name the scope's own tenant. */
static int body_tenant_ok(admin_t *a)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(a->in, "tenant_id");
    if (!cJSON_IsNumber(t) || (int64_t)t->valuedouble == a->scope_tenant) return 0;
    adm_set_error(a, 403, "PERMISSION_DENIED", "field 'tenant_id': not the token's tenant");
    return -1;
}

int adm_scope_check(admin_t *a, const char *coll, const char *id, const char *verb)
{
    if (!a->scope_tenant) return 0;
    int get = a->method == HTTP_GET, post = a->method == HTTP_POST;
    char own[24];
    adm_fmt_i64(own, sizeof(own), a->scope_tenant);
    /* usage reads are filtered to the tenant by their handlers (adm_query_id) */
    if (strcmp(coll, "usage") == 0 || strcmp(coll, "stats") == 0) return get ? 0 : forbidden(a);
    if (strcmp(coll, "prices") == 0) return get && !id ? 0 : forbidden(a);
    if (strcmp(coll, "tenants") == 0) {
        if (!get) return forbidden(a);
        if (id && strcmp(id, own) != 0) {
            adm_set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", id);
            return -1;
        }
        return 0;
    }
    int projects = strcmp(coll, "projects") == 0, keys = strcmp(coll, "keys") == 0;
    if (!projects && !keys) return forbidden(a);
    if (!id) return post ? body_tenant_ok(a) : 0; /* lists are filtered by the handlers */
    (void)verb;
    int r = owned(a, projects ? "projects" : "api_keys", projects ? "project" : "key", id);
    return r == 1 ? 0 : -1;
}

/* ---- /api/v2/admin-tokens (platform admin only) --------------------------------------------- */

static cJSON *token_json(int ncols, const char *const *c)
{
    if (ncols < 6) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "admin_token");
    adm_add_int(o, "tenant_id", c[1]);
    adm_add_str(o, "name", c[2]);
    adm_add_str(o, "token", c[3]); /* the display form: "mgt-…" + last six */
    cJSON_AddStringToObject(o, "role", "tenant_admin");
    adm_add_int(o, "created_at", c[4]);
    adm_add_int(o, "revoked_at", c[5]);
    return o;
}

/* "mgt-" + the 40 random characters of a fresh key, its digest and display form. */
static int new_token(admin_t *a, char *hex, char *display, size_t dcap)
{
    char key[MG_KEY_LEN + 1];
    if (mg_key_generate(key) != 0) return -1;
    snprintf(a->clear_key, sizeof(a->clear_key), TOKEN_PREFIX "%s", key + MG_KEY_PREFIX_LEN);
    OPENSSL_cleanse(key, sizeof(key));
    size_t n = strlen(a->clear_key);
    snprintf(display, dcap, TOKEN_PREFIX "\xe2\x80\xa6%s", a->clear_key + n - 6);
    return token_digest_hex(a->clear_key, hex);
}

static const field_t token_fields[] = {
    {"tenant_id", F_ID, 0, 0, 0},
    {"name", F_NAME, 1, 1, 0},
};

static void token_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    char hex[2 * MG_KEY_DIGEST_LEN + 1], display[32], at[24], id[24];
    if (adm_apply_body(a, token_fields, NFIELDS(token_fields), NULL, &vs) != 0 ||
        adm_require(a, "tenant_id") != 0 || adm_tx_begin(a, &tx) != 0)
        goto out;
    const char *pt[1] = {vs.v[0]};
    if (adm_tx_first(a, tx, "SELECT id FROM tenants WHERE id = ?1", 1, pt, &f) != 0) goto out;
    if (!f.rows) {
        adm_set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", vs.v[0]);
        goto out;
    }
    if (new_token(a, hex, display, sizeof(display)) != 0) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "cannot generate a token");
        goto out;
    }
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[5] = {vs.v[0], vs.v[1], hex, display, at};
    if (adm_tx_write(a, tx,
                     "INSERT INTO admin_tokens(tenant_id, name, digest, display, created_at)"
                     " VALUES (?1, ?2, ?3, ?4, ?5)",
                     5, p, "name") < 0)
        goto out;
    adm_fmt_i64(id, sizeof(id), mg_store_tx_last_id(tx));
    snprintf(a->target, sizeof(a->target), "admin_token:%s", id);
    cJSON *o = adm_tx_json(a, tx, "SELECT " TOKEN_JSON_COLUMNS " FROM admin_tokens WHERE id = ?1",
                           id, token_json);
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (!o || adm_tx_commit(a, t) != 0) {
        if (!o) mg_store_tx_rollback(t);
        cJSON_Delete(o);
        goto out;
    }
    cJSON_ReplaceItemInObject(o, "token", cJSON_CreateString(a->clear_key)); /* this once */
    adm_set_answer(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    adm_vals_free(&vs);
}

static void token_revoke(admin_t *a, const char *id)
{
    mg_store_tx_t *tx = NULL;
    char at[24];
    adm_fmt_i64(at, sizeof(at), adm_now_s());
    const char *p[2] = {id, at};
    if (adm_no_body(a) != 0 || adm_tx_begin(a, &tx) != 0) return;
    int n = adm_tx_write(a, tx,
                         "UPDATE admin_tokens SET revoked_at = ?2 WHERE id = ?1"
                         " AND revoked_at IS NULL",
                         2, p, "id");
    if (n < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    if (n == 0) {
        mg_store_tx_rollback(tx);
        adm_set_error(a, 404, "NOT_FOUND", "admin token %s does not exist or is revoked", id);
        return;
    }
    if (adm_tx_commit(a, tx) != 0) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)strtoll(id, NULL, 10));
    cJSON_AddStringToObject(o, "object", "admin_token");
    cJSON_AddBoolToObject(o, "revoked", 1);
    adm_set_answer(a, 200, o);
}

void adm_admin_tokens_route(admin_t *a, const char *id)
{
    if (a->scope_tenant) {
        a->action = "admin_token.denied";
        forbidden(a);
        return;
    }
    if (id) snprintf(a->target, sizeof(a->target), "admin_token:%.40s", id);
    if (!id && a->method == HTTP_POST) {
        a->action = "admin_token.create";
        token_create(a);
    } else if (!id && a->method == HTTP_GET) {
        a->action = "admin_token.list";
        adm_get_rows(a, NULL, "SELECT " TOKEN_JSON_COLUMNS " FROM admin_tokens ORDER BY id", NULL,
                     0, NULL, token_json, "admin token");
    } else if (id && a->method == HTTP_DELETE) {
        a->action = "admin_token.revoke";
        token_revoke(a, id);
    } else {
        a->action = "admin_token.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
    }
}
