/* req: one admin API request and the helpers every admin resource shares (admin.c for
 * tenants, projects and keys; providers.c for providers). Internal to the admin API.
 *
 * An admin_t is built on the loop thread from the HTTP request (path, query, method, body,
 * request id and client address are copied, so the handler never touches the connection)
 * and then handled on a worker thread: validation, the SQLite transaction, a test call to a
 * provider. What must change in loop-owned state once the transaction committed is not done
 * there but recorded as effects (admin_fx_t) that admin.c applies on the loop thread before
 * it answers.
 *
 * Request bodies are checked against a field table per resource: every member must be a
 * known field of the right type and range, and its value is turned into the text bound to
 * the SQL statement (all parameters are bound as text; SQLite's column affinity stores
 * numbers as integers). A resource's values live in a small array of owned strings indexed
 * like its columns, so create (defaults, then the body) and update (the row, then the body)
 * share one code path. */
#ifndef MG_ADMIN_REQ_H
#define MG_ADMIN_REQ_H

#include <stdint.h>
#include <cjson/cJSON.h>
#include <uv.h>

#include "admin/authfail.h"
#include "tenancy/auth.h"
#include "tenancy/keys.h"
#include "luavm/luavm.h"
#include "admin/admin.h"
#include "conf/settings.h"
#include "store/store.h"

#define ADM_MAX_NAME 128
#define ADM_MAX_ID 9007199254740991.0 /* 2^53 - 1: exact in a JSON number */
#define ADM_MAX_FX 2

/* A change to loop-owned state, applied after the transaction committed. */
typedef enum {
    ADM_FX_PUT_KEY,     /* index rec (new key, or a changed policy) */
    ADM_FX_REMOVE_KEY,  /* drop the key with digest */
    ADM_FX_ROTATE_KEY,  /* digest out, rec in, in one step */
    ADM_FX_PUT_PROJECT, /* project limits */
    ADM_FX_PUT_TENANT,  /* tenant spend limits and billing */
} adm_fx_kind_t;

/* The admin API's state (admin.h): what it was given, its queue, the token's digest. */
struct mg_admin_s {
    mg_admin_deps_t d;
    struct admin_s *queue;   /* requests waiting for the worker, in order */
    struct admin_s *running; /* the one on the worker */
    int audits_queued;       /* audit-only items in the queue (replicated: bounded) */
    char token_digest[65];   /* SHA-256 of the platform admin token; "" = none */
    mg_authfail_t fails;     /* failed sign-ins per client address */
};

typedef struct admin_fx_s {
    adm_fx_kind_t kind;
    mg_key_record_t *rec; /* one reference, or NULL */
    unsigned char digest[MG_KEY_DIGEST_LEN];
    mg_auth_project_t project;
    mg_auth_tenant_t tenant;
} admin_fx_t;

typedef struct admin_s {
    struct mg_admin_s *adm; /* the admin API's state: loop thread only */
    mg_store_t *store;      /* the one thing the worker uses of it */
    mg_http_req_t *req;     /* loop thread only; NULL once the client left */
    mg_gen_t *gen;          /* one reference: the config the request is checked against */
    struct admin_s *next;   /* admin.c's queue: one request in the worker at a time */
    int audit_only;         /* no request: a loop-side audit record to write (replicated) */
    uv_work_t work;
    int method; /* llhttp_method_t */
    char path[256];
    char *query; /* owned copy, or NULL */
    char request_id[40];
    char peer[80];        /* the client's address */
    const char *action;   /* static: "key.create", ... */
    char target[160];     /* "key:12", "provider:p_1a2b", or "" */
    int status;           /* the answer's status */
    cJSON *answer;        /* owned: the success body */
    const char *code;     /* static error code, or NULL */
    char message[320];    /* error message */
    cJSON *in;            /* owned: the parsed request body (an object) */
    char clear_key[64];   /* a key or token shown once: wiped after the answer */
    char *tenant_token;   /* owned, wiped: a tenant admin token to resolve, or NULL */
    int64_t scope_tenant; /* 0 = platform admin; else the only tenant it may touch */
    char actor[48];       /* "admin" (platform) or "tenant-admin:<token id>" */
    int unauthenticated;  /* the token did not resolve: answered 401, audited as
                             admin.auth_failed and counted against the address */
    char *raw_body;       /* owned: a webhook's body as sent (its signature covers
                             these bytes), or NULL */
    size_t raw_len;
    char signature[320];       /* a webhook's Moongate-Signature header, or "" */
    admin_fx_t fx[ADM_MAX_FX]; /* effects for the loop thread, in order */
    int n_fx;
    int rebuild; /* providers changed: the generation must be rebuilt */
    /* with rebuild: the answer made again from the rebuilt generation's config (prev: the
     * worker's answer, to take parts from); NULL = the worker's answer stands */
    cJSON *(*answer_from)(const mg_config_t *cfg, cJSON *prev);
} admin_t;

/* Queue an admin request whose token was checked (front.c) for the worker (admin.c). */
void adm_enqueue(struct mg_admin_s *adm, mg_http_req_t *req, const char *tenant_token);

void adm_set_answer(admin_t *a, int status, cJSON *body);
void adm_set_error(admin_t *a, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Storage failed: the detail goes to the log, the client gets a generic 500. */
void adm_storage_error(admin_t *a, const char *err);
int64_t adm_now_s(void);
void adm_fmt_i64(char *buf, size_t cap, int64_t v);
/* Record an effect (takes over rec's reference). */
void adm_fx(admin_t *a, adm_fx_kind_t kind, mg_key_record_t *rec, const unsigned char *digest,
            const mg_auth_project_t *project);

/* ---- field tables ---- */

typedef enum {
    F_NAME,    /* string 1..ADM_MAX_NAME bytes, no control characters */
    F_ID,      /* integer 1..2^53-1 */
    F_LIMIT,   /* integer 0..max */
    F_BOOL,    /* true/false, stored as 1/0 */
    F_TIME,    /* unix seconds (integer > 0) or "YYYY-MM-DDTHH:MM:SSZ" */
    F_SCOPES,  /* array of scope names */
    F_MODELS,  /* array of model names the config serves */
    F_PRIOS,   /* non-empty array of "P0".."P4" */
    F_LABELS,  /* object of string values */
    F_NUMBER,  /* number 0..max (min_positive: > 0) */
    F_URL,     /* http:// or https:// URL without spaces, '?' or '#'; trailing '/' dropped */
    F_SECRET,  /* string 1..4096 bytes without control characters; never echoed */
    F_POOL,    /* "main" or "fallback" */
    F_PREFIX,  /* string 0..ADM_MAX_NAME bytes without control characters */
    F_ADAPTER, /* an adapter the current generation has loaded */
} ftype_t;

typedef struct field_s {
    const char *name;
    ftype_t type;
    int slot;     /* index into the resource's value array; -1 = not stored there */
    int nullable; /* null accepted (stored as SQL NULL) */
    double max;   /* F_LIMIT / F_NUMBER upper bound */
} field_t;

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* Values of a resource, indexed like its field slots: owned strings or NULL (SQL NULL). */
#define MAX_SLOTS 16
typedef struct vals_s {
    char *v[MAX_SLOTS];
} vals_t;

void adm_vals_free(vals_t *vs);
/* Set slot i to a copy of s (NULL = SQL NULL). 0 or -1 (out of memory). */
int adm_vals_set(vals_t *vs, int i, const char *s);

/* Check every member of the body against the table and store the values. Members named in
 * `fixed` are refused ("cannot be changed"). 0 or -1 (error set). */
int adm_apply_body(admin_t *a, const field_t *fs, size_t n, const char *fixed, vals_t *vs);
/* A required integer id member, validated (apply_body already checked its type). */
int64_t adm_body_id(const admin_t *a, const char *name);
/* A member that must be present and not null. 0, or -1 with the error set. */
int adm_require(admin_t *a, const char *name);
/* The body must be empty or {} (actions without parameters). */
int adm_no_body(admin_t *a);
int adm_is_integer(const cJSON *v, double lo, double hi);

/* ---- storage ---- */

typedef struct first_s {
    char v[4][80]; /* first row's first four columns */
    int cols[4];   /* 1 when that column was not NULL */
    int rows;
} first_t;

/* Row callback keeping the first row in a first_t (ud). */
void adm_first_row(void *ud, int ncols, const char *const *cols);
/* Run sql in tx and keep its first row in *f. 0, or -1 with the storage error set. */
int adm_tx_first(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                 first_t *f);
/* Run a write in tx. Returns rows changed, or -1 with the error set: a constraint becomes
 * 400 naming `field`, anything else 500. */
int adm_tx_write(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                 const char *field);
int adm_tx_begin(admin_t *a, mg_store_tx_t **tx);
int adm_tx_commit(admin_t *a, mg_store_tx_t *tx);

typedef cJSON *(*row_json_fn)(int ncols, const char *const *cols);
/* SELECT into a new array (read connection). NULL with the error set on failure. */
cJSON *adm_query_list(admin_t *a, const char *sql, int n, const char *const *p, row_json_fn fn);
/* SELECT one row inside tx as JSON; NULL with the error set on failure or no row. */
cJSON *adm_tx_json(admin_t *a, mg_store_tx_t *tx, const char *sql, const char *id, row_json_fn fn);
/* GET one row by id (sql_one, ?1 = id), or a list (sql_list with n params p) as
 * {object: "list", total, data}; 404 "<what> <id> does not exist" when the row is absent. */
void adm_get_rows(admin_t *a, const char *sql_one, const char *sql_list, const char *id, int n,
                  const char *const *p, row_json_fn fn, const char *what);
/* ?name=value from the query string into out; 1 when present. */
int adm_query_param(const admin_t *a, const char *name, char *out, size_t cap);
/* An id query parameter: 0 absent, 1 present and valid, -1 invalid (error set). */
int adm_query_id(admin_t *a, const char *name, char *out, size_t cap);

/* ---- JSON views of rows ---- */

void adm_add_int(cJSON *o, const char *k, const char *v);
void adm_add_str(cJSON *o, const char *k, const char *v);
/* A JSON text column as a value; fallback (array or object) when absent or malformed. */
void adm_add_json(cJSON *o, const char *k, const char *v, int object);

/* ---- scope (scope.c) ---- */

/* Any thread: the tenant of a live tenant admin token (its digest looked up on a read
 * connection): 1 with *tenant_id and the token's id, 0 when unknown or revoked, -1 with err. */
int adm_tenant_token_lookup(mg_store_t *st, const char *token, int64_t *tenant_id, char *token_id,
                            size_t cap, char *err, size_t errlen);
/* Worker: resolve a tenant admin token (a->tenant_token, wiped) to its tenant. 0, or -1
 * with 401 / 500 set. */
int adm_scope_resolve(admin_t *a);
/* Worker: whether the request's scope may run this endpoint on this record; 0, or -1 with
 * 403 (not for tenant admins) or 404 (another tenant's record) set. Lists are filtered by
 * the handlers through adm_query_id("tenant_id"). */
int adm_scope_check(admin_t *a, const char *coll, const char *id, const char *verb);
/* /api/v2/admin-tokens[/{id}]: create, list, revoke (platform admin only). */
void adm_admin_tokens_route(admin_t *a, const char *id);

/* ---- models and applications (defs.c) ---- */

/* /api/v2/models[/{name}] and /api/v2/applications[/{name}]: list, get, create, update,
 * delete. 1 when coll is one of them (answered), 0 otherwise. */
int adm_defs_route(admin_t *a, const char *coll, const char *name, const char *verb);

/* The stored definition of application name (owned) in *def: 404 when unknown, 409 when
 * it comes from the config file. 0 or -1 (error set). */
int adm_app_stored_def(admin_t *a, const char *name, cJSON **def);
/* Write application name's definition inside tx (validated first). 0 or -1 (error set). */
int adm_app_write_tx(admin_t *a, mg_store_tx_t *tx, const char *name, const cJSON *def);

/* ---- runtime settings (admin.c) ---- */

/* Write one setting (null = remove the override) inside tx. 0 or -1 (error set). */
int adm_setting_write_tx(admin_t *a, mg_store_tx_t *tx, const char *key, const cJSON *v);

/* ---- quotas and policies (views.c) ---- */

/* /api/v2/quotas and /api/v2/policies (GET, PUT). 1 when coll is one of them. */
int adm_views_route(admin_t *a, const char *coll, const char *id, const char *verb);

/* ---- cooldown history (cooldowns.c) ---- */

/* GET /api/v2/cooldowns/history[?provider_id=&limit=]: the cooldown_events rows, newest
 * first. 1 when it was that endpoint (answered), 0 otherwise. */
int adm_cooldowns_route(admin_t *a, const char *coll, const char *id, const char *verb);

/* ---- usage analytics (stats.c) and prices (prices.c) ---- */

/* /api/v2/stats/{overview|daily|tokens|providers/{id}}, /api/v2/usage/{analytics|events}:
 * reads of the usage roll-ups. 1 when coll/id is one of them (answered). */
int adm_stats_route(admin_t *a, const char *coll, const char *id, const char *verb);
/* /api/v2/prices: list, add a version. 1 when coll is prices (answered). */
int adm_prices_route(admin_t *a, const char *coll, const char *id, const char *verb);

/* ---- billing (billing.c) ---- */

/* /api/v2/tenants/{id}/{billing|wallet|ledger|holds|release|adjust} and
 * /api/v2/webhooks/topup. 1 when coll/verb is one of them (answered), 0 otherwise. */
int adm_billing_route(admin_t *a, const char *coll, const char *id, const char *verb);

/* ---- providers (providers.c) ---- */

/* /api/v2/providers[/{id}[/{verb}]] writes and tests, on the worker thread. */
void adm_providers_route(admin_t *a, const char *id, const char *verb);

#endif
