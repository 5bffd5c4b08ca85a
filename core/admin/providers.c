/* providers: /api/v2/providers writes (create, update, delete, enable, disable) and the
 * test call, on the admin worker thread (see admin.c, req.h).
 *
 *   POST   /api/v2/providers {name, api_key, endpoint_url, pool?, rpm_limit?, tpm_limit?,
 *                             weight?, cost_per_1k_tokens?, model_prefix?, adapter?, local?}
 *   PUT    /api/v2/providers/{id} {any of the above}
 *   DELETE /api/v2/providers/{id}
 *   POST   /api/v2/providers/{id}/enable | /disable | /test
 * (GET /api/v2/providers[/{id}] is answered by front.c from the live state.)
 *
 * Create and any change of api_key or endpoint_url first make the Sidecar ADR's test call
 * (providers.h) with the key, outside any transaction: 200 with JSON stores it; 401/403 is
 * 400 api_key_invalid; no connection or a timeout is 400 provider_unreachable ("cannot
 * connect"); anything else is 400 provider_test_failed with the upstream's status. The key
 * is stored AES-256-GCM encrypted (secret.h) and shown only masked. Every committed change
 * asks admin.c to rebuild the generation, so routing uses it before the client is answered.
 * Providers from the config file (source=file) or the Sidecar V1 environment (source=env)
 * are read-only here: 409. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "admin/req.h"
#include "conf/providers.h"
#include "base/secret.h"

/* Provider values: the columns an admin may set (adapter and local go to metadata). */
enum {
    PV_NAME,
    PV_KEY,
    PV_URL,
    PV_PREFIX,
    PV_POOL,
    PV_RPM,
    PV_TPM,
    PV_WEIGHT,
    PV_COST,
    PV_ADAPTER,
    PV_LOCAL,
    PV_N
};

static const field_t provider_fields[] = {
    {"name", F_NAME, PV_NAME, 0, 0},
    {"api_key", F_SECRET, PV_KEY, 0, 0},
    {"endpoint_url", F_URL, PV_URL, 0, 0},
    {"model_prefix", F_PREFIX, PV_PREFIX, 0, 0},
    {"pool", F_POOL, PV_POOL, 0, 0},
    {"rpm_limit", F_LIMIT, PV_RPM, 0, 1e7},
    {"tpm_limit", F_LIMIT, PV_TPM, 1, 4e9},
    {"weight", F_NUMBER, PV_WEIGHT, 0, 1e6},
    {"cost_per_1k_tokens", F_NUMBER, PV_COST, 0, 1e6},
    {"adapter", F_ADAPTER, PV_ADAPTER, 0, 0},
    {"local", F_BOOL, PV_LOCAL, 0, 0},
};

/* A stored row: MG_PROVIDER_COLUMNS, created_at, updated_at, source. */
#define ROW_COLUMNS MG_PROVIDER_COLUMNS ", created_at, updated_at, source"
enum {
    R_ID,
    R_NAME,
    R_KEY,
    R_URL,
    R_PREFIX,
    R_POOL,
    R_STATUS,
    R_RPM,
    R_TPM,
    R_WEIGHT,
    R_COST,
    R_META,
    R_CREATED,
    R_UPDATED,
    R_SOURCE,
    R_N
};

typedef struct row_s {
    char *c[R_N];
    int found;
} row_t;

static void row_capture(void *ud, int ncols, const char *const *cols)
{
    row_t *r = ud;
    if (r->found++ || ncols < R_N) return;
    for (int i = 0; i < R_N; i++) r->c[i] = cols[i] ? strdup(cols[i]) : NULL;
}

static void row_free(row_t *r)
{
    if (r->c[R_KEY]) OPENSSL_cleanse(r->c[R_KEY], strlen(r->c[R_KEY]));
    for (int i = 0; i < R_N; i++) free(r->c[i]);
    memset(r, 0, sizeof(*r));
}

/* The stored row of provider id (r->found = 0 when none). 0, or -1 with the error set. */
static int row_read(admin_t *a, const char *id, row_t *r)
{
    char err[256];
    const char *p[1] = {id};
    memset(r, 0, sizeof(*r));
    if (mg_store_query(a->store, "SELECT " ROW_COLUMNS " FROM providers WHERE id = ?1", 1, p,
                       row_capture, r, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
        return -1;
    }
    return 0;
}

/* The encryption key from the environment; 0, or -1 with a 503 that says what to do. */
static int encryption_key(admin_t *a, mg_secret_key_t *key)
{
    char err[160];
    if (mg_secret_key_from_env(key, err, sizeof(err)) == 0) return 0;
    adm_set_error(a, 503, "ENCRYPTION_KEY_MISSING",
                  "%s; provider keys cannot be stored or read (create a key with `moongate "
                  "keygen` and start the gateway with it)",
                  err);
    return -1;
}

/* The provider as the API shows it: from the row, with the key masked from its plaintext. */
static cJSON *provider_json(const row_t *r, const char *plain_key)
{
    char masked[MG_SECRET_MASK_MAX];
    mg_secret_mask(plain_key, masked);
    cJSON *o = cJSON_CreateObject();
    cJSON *meta = r->c[R_META] ? cJSON_Parse(r->c[R_META]) : NULL;
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(meta, "adapter");
    cJSON_AddStringToObject(o, "id", r->c[R_ID]);
    cJSON_AddStringToObject(o, "object", "provider");
    adm_add_str(o, "name", r->c[R_NAME]);
    cJSON_AddStringToObject(o, "api_key", masked);
    adm_add_str(o, "endpoint_url", r->c[R_URL]);
    adm_add_str(o, "model_prefix", r->c[R_PREFIX] ? r->c[R_PREFIX] : "");
    adm_add_str(o, "pool", r->c[R_POOL]);
    adm_add_str(o, "status", r->c[R_STATUS]);
    cJSON_AddStringToObject(o, "source", "db");
    adm_add_int(o, "rpm_limit", r->c[R_RPM]);
    adm_add_int(o, "tpm_limit", r->c[R_TPM]);
    cJSON_AddNumberToObject(o, "weight", r->c[R_WEIGHT] ? atof(r->c[R_WEIGHT]) : 1.0);
    cJSON_AddNumberToObject(o, "cost_per_1k_tokens", r->c[R_COST] ? atof(r->c[R_COST]) : 0.0);
    cJSON_AddStringToObject(o, "adapter", cJSON_IsString(ad) ? ad->valuestring : "openai");
    cJSON_AddBoolToObject(o, "local",
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "local")));
    adm_add_str(o, "created_at", r->c[R_CREATED]);
    adm_add_str(o, "updated_at", r->c[R_UPDATED]);
    cJSON_Delete(meta);
    return o;
}

/* The test call; on failure the error the ADR asks for. 0 when the key works. */
static int test_key(admin_t *a, const char *url, const char *key, mg_provider_test_t *t)
{
    /* the same call as the active health probe, with its timeout (10 s by default) */
    mg_providers_test(url, key, a->gen->cfg->health.probe_timeout_ms, t);
    if (t->result == MG_PTEST_OK) return 0;
    if (t->result == MG_PTEST_KEY_INVALID)
        adm_set_error(a, 400, "api_key_invalid", "API key validation failed: %s", t->detail);
    else if (t->result == MG_PTEST_UNREACHABLE)
        adm_set_error(a, 400, "provider_unreachable", "%s (%s/models)", t->detail, url);
    else
        adm_set_error(a, 400, "provider_test_failed", "test call GET %s/models: %s", url,
                      t->detail);
    return -1;
}

/* "p_" + 12 random hex characters, not taken by the config file. */
static int new_id(admin_t *a, char *out, size_t cap)
{
    unsigned char b[6];
    if (RAND_bytes(b, sizeof(b)) != 1) return -1;
    snprintf(out, cap, "p_%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5]);
    return mg_config_provider(a->gen->cfg, out) ? -1 : 0;
}

/* metadata JSON from the adapter and local values. Owned by the caller. */
static char *metadata_json(const vals_t *vs)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "adapter", vs->v[PV_ADAPTER]);
    cJSON_AddBoolToObject(m, "local", vs->v[PV_LOCAL] && strcmp(vs->v[PV_LOCAL], "1") == 0);
    char *s = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    return s;
}

/* Whether another stored provider has this name (0/1), or -1 with the error set. */
static int name_taken(admin_t *a, mg_store_tx_t *tx, const char *name, const char *self)
{
    first_t f;
    const char *p[2] = {name, self ? self : ""};
    if (adm_tx_first(a, tx, "SELECT id FROM providers WHERE name = ?1 AND id != ?2", 2, p, &f) != 0)
        return -1;
    if (!f.rows) return 0;
    adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': a provider with this name exists");
    return 1;
}

/* Validate the values every write needs; 0 or -1 (error set). */
static int values_ok(admin_t *a, const vals_t *vs)
{
    if (vs->v[PV_WEIGHT] && !(atof(vs->v[PV_WEIGHT]) > 0)) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'weight': must be greater than 0");
        return -1;
    }
    return 0;
}

/* Encrypt the clear key in vs->v[PV_KEY] in place (the clear text is wiped). */
static int encrypt_slot(admin_t *a, const mg_secret_key_t *key, vals_t *vs)
{
    char *token = NULL, *plain = vs->v[PV_KEY];
    if (mg_secret_encrypt(key, plain, strlen(plain), &token) != MG_SECRET_OK) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "cannot encrypt the key");
        return -1;
    }
    OPENSSL_cleanse(plain, strlen(plain));
    free(plain);
    vs->v[PV_KEY] = token;
    return 0;
}

/* Write vs (key already encrypted) as provider id: INSERT when create, else UPDATE. Then
 * answer with the row (masked from plain). */
static void store_provider(admin_t *a, const char *id, vals_t *vs, int create, const char *plain,
                           const mg_provider_test_t *t)
{
    mg_store_tx_t *tx = NULL;
    char *meta = metadata_json(vs);
    row_t r = {0};
    const char *p[10] = {id,
                         vs->v[PV_NAME],
                         vs->v[PV_KEY],
                         vs->v[PV_URL],
                         vs->v[PV_PREFIX],
                         vs->v[PV_POOL],
                         vs->v[PV_RPM],
                         vs->v[PV_TPM],
                         vs->v[PV_WEIGHT],
                         vs->v[PV_COST]};
    if (!meta) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (adm_tx_begin(a, &tx) != 0 || name_taken(a, tx, vs->v[PV_NAME], create ? NULL : id) != 0)
        goto out;
    const char *q[11];
    memcpy(q, p, sizeof(p));
    q[10] = meta;
    const char *sql =
        create ? "INSERT INTO providers(id, name, api_key, endpoint_url, model_prefix, pool,"
                 " rpm_limit, tpm_limit, weight, cost_per_1k_tokens, metadata, source, status)"
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 'db', 'active')"
               : "UPDATE providers SET name = ?2, api_key = ?3, endpoint_url = ?4,"
                 " model_prefix = ?5, pool = ?6, rpm_limit = ?7, tpm_limit = ?8, weight = ?9,"
                 " cost_per_1k_tokens = ?10, metadata = ?11, updated_at = datetime('now')"
                 " WHERE id = ?1";
    if (adm_tx_write(a, tx, sql, 11, q, "name") < 0) goto out;
    mg_store_tx_t *t2 = tx;
    tx = NULL;
    if (adm_tx_commit(a, t2) != 0 || row_read(a, id, &r) != 0) goto out;
    a->rebuild = 1;
    cJSON *o = provider_json(&r, plain);
    if (t) {
        cJSON_AddStringToObject(o, "test_result", mg_ptest_name(t->result));
        cJSON_AddNumberToObject(o, "test_latency_ms", (double)t->latency_ms);
    }
    adm_set_answer(a, create ? 201 : 200, o);
out:
    mg_store_tx_rollback(tx);
    free(meta);
    row_free(&r);
}

static void provider_create(admin_t *a)
{
    static const char *const defaults[PV_N] = {
        [PV_PREFIX] = "", [PV_POOL] = "main",      [PV_RPM] = "60", [PV_WEIGHT] = "1",
        [PV_COST] = "0",  [PV_ADAPTER] = "openai", [PV_LOCAL] = "0"};
    vals_t vs = {0};
    mg_secret_key_t key;
    int have_key = 0;
    char id[24], *plain = NULL;
    mg_provider_test_t t;
    for (int i = 0; i < PV_N; i++)
        if (defaults[i] && adm_vals_set(&vs, i, defaults[i]) != 0) goto oom;
    if (adm_apply_body(a, provider_fields, NFIELDS(provider_fields), NULL, &vs) != 0 ||
        adm_require(a, "name") != 0 || adm_require(a, "api_key") != 0 ||
        adm_require(a, "endpoint_url") != 0 || values_ok(a, &vs) != 0)
        goto out;
    if (encryption_key(a, &key) != 0) goto out;
    have_key = 1;
    if (test_key(a, vs.v[PV_URL], vs.v[PV_KEY], &t) != 0) goto out;
    if (new_id(a, id, sizeof(id)) != 0 || !(plain = strdup(vs.v[PV_KEY]))) goto oom;
    snprintf(a->target, sizeof(a->target), "provider:%s", id);
    if (encrypt_slot(a, &key, &vs) != 0) goto out;
    store_provider(a, id, &vs, 1, plain, &t);
    goto out;
oom:
    adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
out:
    if (have_key) mg_secret_key_wipe(&key);
    if (plain) OPENSSL_cleanse(plain, strlen(plain));
    free(plain);
    if (vs.v[PV_KEY]) OPENSSL_cleanse(vs.v[PV_KEY], strlen(vs.v[PV_KEY]));
    adm_vals_free(&vs);
}

/* The stored row of a writable provider, or an error: 404 unknown, 409 file/env. */
static int writable_row(admin_t *a, const char *id, row_t *r)
{
    const mg_provider_conf_t *p = mg_config_provider(a->gen->cfg, id);
    if (p && p->source && strcmp(p->source, "db") != 0) {
        adm_set_error(a, 409, "CONFLICT",
                      "provider %s comes from the %s (source=%s) and is read-only here", id,
                      strcmp(p->source, "env") == 0 ? "environment" : "config file", p->source);
        return -1;
    }
    if (row_read(a, id, r) != 0) return -1;
    if (r->found && r->c[R_SOURCE] && strcmp(r->c[R_SOURCE], "db") == 0) return 0;
    row_free(r);
    adm_set_error(a, 404, "NOT_FOUND", "provider %s does not exist", id);
    return -1;
}

/* Decrypt the row's key; 0, or -1 with the error set. *plain is freed with mg_secret_free. */
static int row_key(admin_t *a, const mg_secret_key_t *key, const row_t *r, char **plain, size_t *n)
{
    if (mg_secret_decrypt(key, r->c[R_KEY], plain, n) == MG_SECRET_OK) return 0;
    adm_set_error(a, 409, "CONFLICT",
                  "the stored key of provider %s does not decrypt with this "
                  "MOONGATE_ENCRYPTION_KEY; set a new api_key",
                  r->c[R_ID]);
    return -1;
}

/* Row values into vs, in field slots (metadata split into adapter and local). */
static int row_vals(const row_t *r, vals_t *vs)
{
    static const int map[][2] = {{PV_NAME, R_NAME},     {PV_URL, R_URL},  {PV_PREFIX, R_PREFIX},
                                 {PV_POOL, R_POOL},     {PV_RPM, R_RPM},  {PV_TPM, R_TPM},
                                 {PV_WEIGHT, R_WEIGHT}, {PV_COST, R_COST}};
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (adm_vals_set(vs, map[i][0], r->c[map[i][1]]) != 0) return -1;
    cJSON *meta = r->c[R_META] ? cJSON_Parse(r->c[R_META]) : NULL;
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(meta, "adapter");
    int local = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "local"));
    int rc = adm_vals_set(vs, PV_ADAPTER, cJSON_IsString(ad) ? ad->valuestring : "openai") |
             adm_vals_set(vs, PV_LOCAL, local ? "1" : "0");
    cJSON_Delete(meta);
    return rc;
}

static void provider_update(admin_t *a, const char *id)
{
    row_t r = {0};
    vals_t vs = {0};
    mg_secret_key_t key;
    int have_key = 0;
    char *stored = NULL, *plain = NULL;
    size_t stored_n = 0;
    mg_provider_test_t t;
    if (writable_row(a, id, &r) != 0) goto out;
    if (row_vals(&r, &vs) != 0) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (adm_apply_body(a, provider_fields, NFIELDS(provider_fields), NULL, &vs) != 0 ||
        values_ok(a, &vs) != 0 || encryption_key(a, &key) != 0)
        goto out;
    have_key = 1;
    int new_key = vs.v[PV_KEY] != NULL;
    int new_url = strcmp(vs.v[PV_URL], r.c[R_URL]) != 0;
    if (!new_key && row_key(a, &key, &r, &stored, &stored_n) != 0) goto out;
    plain = strdup(new_key ? vs.v[PV_KEY] : stored);
    if (!plain) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if ((new_key || new_url) && test_key(a, vs.v[PV_URL], plain, &t) != 0) goto out;
    if (!new_key && adm_vals_set(&vs, PV_KEY, plain) != 0) goto out; /* re-encrypted below */
    if (encrypt_slot(a, &key, &vs) != 0) goto out;
    store_provider(a, id, &vs, 0, plain, new_key || new_url ? &t : NULL);
out:
    if (have_key) mg_secret_key_wipe(&key);
    mg_secret_free(stored, stored_n);
    if (plain) OPENSSL_cleanse(plain, strlen(plain));
    free(plain);
    if (vs.v[PV_KEY]) OPENSSL_cleanse(vs.v[PV_KEY], strlen(vs.v[PV_KEY]));
    adm_vals_free(&vs);
    row_free(&r);
}

/* A one-statement change of provider id; answers with the row afterwards. */
static void provider_exec(admin_t *a, const char *id, const char *sql, int deleted)
{
    row_t r = {0};
    mg_store_tx_t *tx = NULL;
    mg_secret_key_t key;
    char *plain = NULL;
    size_t n = 0;
    if (adm_no_body(a) != 0 || writable_row(a, id, &r) != 0) return;
    const char *p[1] = {id};
    if (adm_tx_begin(a, &tx) != 0 || adm_tx_write(a, tx, sql, 1, p, "id") < 0) goto out;
    mg_store_tx_t *t2 = tx;
    tx = NULL;
    if (adm_tx_commit(a, t2) != 0) goto out;
    a->rebuild = 1;
    if (deleted) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "provider");
        cJSON_AddBoolToObject(o, "deleted", 1);
        adm_set_answer(a, 200, o);
        goto out;
    }
    row_free(&r);
    if (row_read(a, id, &r) != 0) goto out;
    /* the mask needs the clear key; without the encryption key the whole key is hidden */
    int have_key = mg_secret_key_from_env(&key, NULL, 0) == 0;
    if (have_key && mg_secret_decrypt(&key, r.c[R_KEY], &plain, &n) != MG_SECRET_OK) plain = NULL;
    if (have_key) mg_secret_key_wipe(&key);
    adm_set_answer(a, 200, provider_json(&r, plain ? plain : ""));
out:
    mg_store_tx_rollback(tx);
    mg_secret_free(plain, n);
    row_free(&r);
}

/* 1 when a stored model routes to provider id (409 set), 0 when none, -1 on errors. */
static int provider_in_use(admin_t *a, const char *id)
{
    char err[256];
    first_t f;
    memset(&f, 0, sizeof(f));
    const char *p[1] = {id};
    if (mg_store_query(a->store,
                       "SELECT m.name FROM models m, json_each(m.definition, '$.routes') r"
                       " WHERE json_extract(r.value, '$.provider') = ?1 LIMIT 1",
                       1, p, adm_first_row, &f, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
        return -1;
    }
    if (!f.rows) return 0;
    adm_set_error(a, 409, "CONFLICT", "provider %s is a route of model %s: change the model first",
                  id, f.v[0]);
    return 1;
}

/* POST /providers/{id}/test: the test call with the provider's current key. Works for every
 * provider (file and env ones use the key the generation holds). Always 200: the outcome
 * is in the body. */
static void provider_test(admin_t *a, const char *id)
{
    const mg_provider_conf_t *p = mg_config_provider(a->gen->cfg, id);
    mg_provider_test_t t;
    if (adm_no_body(a) != 0) return;
    if (!p) {
        adm_set_error(a, 404, "NOT_FOUND", "provider %s does not exist", id);
        return;
    }
    mg_providers_test(p->base_url, p->api_key, a->gen->cfg->health.probe_timeout_ms, &t);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "test_result", mg_ptest_name(t.result));
    cJSON_AddNumberToObject(o, "test_latency_ms", (double)t.latency_ms);
    if (t.http_status) cJSON_AddNumberToObject(o, "upstream_status", t.http_status);
    else cJSON_AddNullToObject(o, "upstream_status");
    cJSON_AddStringToObject(o, "message", t.detail);
    adm_set_answer(a, 200, o);
}

void adm_providers_route(admin_t *a, const char *id, const char *verb)
{
    int post = a->method == HTTP_POST, put = a->method == HTTP_PUT, del = a->method == HTTP_DELETE;
    if (id) snprintf(a->target, sizeof(a->target), "provider:%.140s", id);
    if (!id && post) {
        a->action = "provider.create";
        provider_create(a);
    } else if (id && !verb && put) {
        a->action = "provider.update";
        provider_update(a, id);
    } else if (id && !verb && del) {
        a->action = "provider.delete";
        if (provider_in_use(a, id) == 0)
            provider_exec(a, id, "DELETE FROM providers WHERE id = ?1", 1);
    } else if (id && verb && post && !strcmp(verb, "enable")) {
        a->action = "provider.enable";
        provider_exec(a, id,
                      "UPDATE providers SET status = 'active', updated_at = datetime('now')"
                      " WHERE id = ?1",
                      0);
    } else if (id && verb && post && !strcmp(verb, "disable")) {
        a->action = "provider.disable";
        provider_exec(a, id,
                      "UPDATE providers SET status = 'disabled', updated_at = datetime('now')"
                      " WHERE id = ?1",
                      0);
    } else if (id && verb && post && !strcmp(verb, "test")) {
        a->action = "provider.test";
        provider_test(a, id);
    } else if (verb && strcmp(verb, "enable") && strcmp(verb, "disable") && strcmp(verb, "test")) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    } else {
        a->action = "provider.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
    }
}
