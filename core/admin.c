/* admin: tenants, projects and customer keys over /api/v2, with an audit record for every
 * request; see admin.h.
 *
 * One request is one admin_t: the router picks a handler, the handler validates the body,
 * runs its transaction, applies the committed change to the auth state and leaves either a
 * JSON answer or an error in the admin_t; finish() then writes the audit record and only
 * then answers (so an audit row exists by the time the client has its answer).
 *
 * Request bodies are checked against a field table per resource: every member must be a
 * known field of the right type and range, and its value is turned into the text bound to
 * the SQL statement (all parameters are bound as text; SQLite's column affinity stores
 * numbers as integers). A resource's values live in a small array of owned strings indexed
 * like its columns, so create (defaults, then the body) and update (the row, then the body)
 * share one code path. */
#include "admin.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include <openssl/crypto.h>

#include "api.h"
#include "auth.h"
#include "json.h"
#include "keys.h"
#include "log.h"
#include "store.h"

#define ACTOR "admin" /* the platform admin token; tenant-scoped tokens do not exist yet */
#define MAX_NAME 128
#define MAX_MODELS 1024
#define MAX_LABELS 64
#define MAX_ID 9007199254740991.0 /* 2^53 - 1: exact in a JSON number */

/* ---- one admin request -------------------------------------------------------------------- */

typedef struct admin_s {
    mg_server_t *s;
    mg_http_req_t *req;             /* borrowed until finish() answers */
    const char *action;             /* static: "key.create", ... */
    char target[48];                /* "key:12", "tenant:3", or "" */
    int status;                     /* the answer's status */
    cJSON *answer;                  /* owned: the success body */
    const char *code;               /* static error code, or NULL */
    char message[320];              /* error message */
    cJSON *in;                      /* owned: the parsed request body (an object) */
    char clear_key[MG_KEY_LEN + 1]; /* a key shown once: wiped after the answer */
} admin_t;

static void set_answer(admin_t *a, int status, cJSON *body)
{
    a->status = status;
    cJSON_Delete(a->answer);
    a->answer = body;
}

static void set_error(admin_t *a, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void set_error(admin_t *a, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->message, sizeof(a->message), fmt, ap);
    va_end(ap);
    a->status = status;
    a->code = code;
    cJSON_Delete(a->answer);
    a->answer = NULL;
}

/* Storage failed: the detail goes to the log, the client gets a generic 500. */
static void storage_error(admin_t *a, const char *err)
{
    mg_log_msg(MG_LOG_ERROR, a->req->request_id, "admin %s: storage error: %s", a->action, err);
    set_error(a, 500, "INTERNAL_ERROR", "storage error; see the gateway log");
}

static int64_t now_s(void)
{
    return (int64_t)time(NULL);
}

static void fmt_i64(char *buf, size_t cap, int64_t v)
{
    snprintf(buf, cap, "%lld", (long long)v);
}

/* ---- field tables --------------------------------------------------------------------------- */

typedef enum {
    F_NAME,   /* string 1..MAX_NAME bytes, no control characters */
    F_ID,     /* integer 1..2^53-1 */
    F_LIMIT,  /* integer 0..max */
    F_BOOL,   /* true/false, stored as 1/0 */
    F_TIME,   /* unix seconds (integer > 0) or "YYYY-MM-DDTHH:MM:SSZ" */
    F_SCOPES, /* array of scope names */
    F_MODELS, /* array of model names the config serves */
    F_PRIOS,  /* non-empty array of "P0".."P4" */
    F_LABELS, /* object of string values */
} ftype_t;

typedef struct field_s {
    const char *name;
    ftype_t type;
    int slot;     /* index into the resource's value array; -1 = not stored there */
    int nullable; /* null accepted (stored as SQL NULL) */
    double max;   /* F_LIMIT upper bound */
} field_t;

/* Values of a resource, indexed like its field slots: owned strings or NULL (SQL NULL). */
#define MAX_SLOTS 16
typedef struct vals_s {
    char *v[MAX_SLOTS];
} vals_t;

static void vals_free(vals_t *vs)
{
    for (int i = 0; i < MAX_SLOTS; i++)
        free(vs->v[i]);
    memset(vs, 0, sizeof(*vs));
}

/* Set slot i to a copy of s (NULL = SQL NULL). 0 or -1 (out of memory). */
static int vals_set(vals_t *vs, int i, const char *s)
{
    char *c = s ? strdup(s) : NULL;
    if (s && !c) return -1;
    free(vs->v[i]);
    vs->v[i] = c;
    return 0;
}

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
    K_N
};
#define KEY_VAL_COLUMNS                                                                            \
    "project_id, name, scopes, models, priorities, rpm_limit, tpm_limit, max_concurrency,"         \
    " max_queued, daily_limit_micros, monthly_limit_micros, expires_at, labels, enabled"

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
};

/* Project values. */
enum { P_NAME, P_RPM, P_TPM, P_CONC, P_MONTHLY, P_N };
#define PROJECT_VAL_COLUMNS "name, rpm_limit, tpm_limit, max_concurrency, monthly_limit_micros"

static const field_t project_fields[] = {
    {"tenant_id", F_ID, -1, 0, 0},
    {"name", F_NAME, P_NAME, 0, 0},
    {"rpm_limit", F_LIMIT, P_RPM, 0, 1e7},
    {"tpm_limit", F_LIMIT, P_TPM, 0, 4e9},
    {"max_concurrency", F_LIMIT, P_CONC, 0, 1e5},
    {"monthly_limit_micros", F_LIMIT, P_MONTHLY, 0, 1e15},
};

static const field_t tenant_fields[] = {
    {"name", F_NAME, 0, 0, 0},
};

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

static const field_t *field_find(const field_t *fs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(fs[i].name, name) == 0) return &fs[i];
    return NULL;
}

static int is_integer(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
           floor(v->valuedouble) == v->valuedouble && v->valuedouble >= lo && v->valuedouble <= hi;
}

static int good_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* "YYYY-MM-DDTHH:MM:SSZ" to unix seconds; -1 when malformed. */
static int64_t parse_time(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    char z = 0;
    int n = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &z, &n) != 7 ||
        z != 'Z' || s[n] != '\0' || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 ||
        tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t > 0 ? (int64_t)t : -1;
}

/* Whether the current config serves `name` (a logical model, or a provider's model_prefix). */
static int model_known(const mg_config_t *cfg, const char *name)
{
    if (mg_config_model(cfg, name)) return 1;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const char *pre = cfg->providers[i].model_prefix;
        if (pre && strncmp(name, pre, strlen(pre)) == 0) return 1;
    }
    return 0;
}

/* Check an array of strings; each element through ok(). Returns NULL or a problem. */
static const char *check_string_array(const cJSON *v, size_t max_n, const mg_config_t *cfg,
                                      ftype_t type, int *bad_index)
{
    if (!cJSON_IsArray(v)) return "must be an array of strings";
    int i = 0;
    const cJSON *it;
    if ((size_t)cJSON_GetArraySize(v) > max_n) return "has too many entries";
    cJSON_ArrayForEach(it, v)
    {
        *bad_index = i++;
        if (!cJSON_IsString(it) || !good_name(it->valuestring, 256)) return "must be a string";
        if (type == F_SCOPES && !mg_key_scope_bit(it->valuestring))
            return "is not a scope (inference, models, usage, admin)";
        if (type == F_PRIOS && (strlen(it->valuestring) != 2 || it->valuestring[0] != 'P' ||
                                it->valuestring[1] < '0' || it->valuestring[1] > '4'))
            return "must be one of P0, P1, P2, P3, P4";
        if (type == F_MODELS && !model_known(cfg, it->valuestring))
            return "is not a model this gateway serves";
    }
    *bad_index = -1;
    if (type == F_PRIOS && i == 0) return "must name at least one priority";
    return NULL;
}

static const char *check_labels(const cJSON *v)
{
    if (!cJSON_IsObject(v)) return "must be an object of strings";
    if (cJSON_GetArraySize(v) > MAX_LABELS) return "has too many labels";
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (!good_name(it->string, 64)) return "has an invalid label name";
        if (!cJSON_IsString(it) || strlen(it->valuestring) > 256) return "values must be strings";
    }
    return NULL;
}

/* Validate one scalar member (name, id, limit, bool, time) into its text in buf (or NULL
 * for null). Returns NULL, or what is wrong with it. */
static const char *scalar_text(const field_t *f, const cJSON *v, char *buf, size_t cap,
                               const char **text)
{
    *text = NULL;
    if (cJSON_IsNull(v) && f->nullable) return NULL;
    if (f->type == F_NAME) {
        if (!cJSON_IsString(v) || !good_name(v->valuestring, MAX_NAME))
            return "must be a string of 1 to 128 characters without control characters";
        *text = v->valuestring;
    } else if (f->type == F_ID) {
        if (!is_integer(v, 1, MAX_ID)) return "must be a positive integer";
        fmt_i64(buf, cap, (int64_t)v->valuedouble);
        *text = buf;
    } else if (f->type == F_LIMIT) {
        if (!is_integer(v, 0, f->max)) return "must be an integer in range"; /* see apply_field */
        fmt_i64(buf, cap, (int64_t)v->valuedouble);
        *text = buf;
    } else if (f->type == F_BOOL) {
        if (!cJSON_IsBool(v)) return "must be true or false";
        *text = cJSON_IsTrue(v) ? "1" : "0";
    } else {
        int64_t t = is_integer(v, 1, MAX_ID) ? (int64_t)v->valuedouble
                    : cJSON_IsString(v)      ? parse_time(v->valuestring)
                                             : -1;
        if (t <= 0) return "must be unix seconds, \"YYYY-MM-DDTHH:MM:SSZ\" or null";
        fmt_i64(buf, cap, t);
        *text = buf;
    }
    return NULL;
}

/* Validate one member against its field and, when it has a slot, store its text in vs.
 * Returns 0, or -1 with the error set (400 naming the field). */
static int apply_field(admin_t *a, const field_t *f, const cJSON *v, vals_t *vs)
{
    char buf[32], *printed = NULL;
    const char *text = NULL, *problem;
    int idx = -1, structured = f->type == F_LABELS || f->type == F_SCOPES || f->type == F_MODELS ||
                               f->type == F_PRIOS;
    if (!structured)
        problem = scalar_text(f, v, buf, sizeof(buf), &text);
    else if (f->type == F_LABELS)
        problem = check_labels(v);
    else
        problem = check_string_array(v, MAX_MODELS, a->s->gen->cfg, f->type, &idx);
    if (problem) {
        if (f->type == F_LIMIT)
            set_error(a, 400, "INVALID_REQUEST", "field '%s': must be an integer from 0 to %.0f",
                      f->name, f->max);
        else if (idx >= 0)
            set_error(a, 400, "INVALID_REQUEST", "field '%s[%d]': %s", f->name, idx, problem);
        else
            set_error(a, 400, "INVALID_REQUEST", "field '%s': %s", f->name, problem);
        return -1;
    }
    if (f->slot < 0) return 0;
    if (structured && !(text = printed = cJSON_PrintUnformatted(v))) goto oom;
    if (vals_set(vs, f->slot, text) != 0) goto oom;
    free(printed);
    return 0;
oom:
    free(printed);
    set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    return -1;
}

/* Check every member of the body against the table and store the values. Members named in
 * `fixed` are refused ("cannot be changed"). 0 or -1 (error set). */
static int apply_body(admin_t *a, const field_t *fs, size_t n, const char *fixed, vals_t *vs)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, a->in)
    {
        const field_t *f = field_find(fs, n, m->string);
        if (!f) {
            set_error(a, 400, "INVALID_REQUEST", "unknown field '%.64s'", m->string);
            return -1;
        }
        if (fixed && strcmp(fixed, m->string) == 0) {
            set_error(a, 400, "INVALID_REQUEST", "field '%s': cannot be changed", m->string);
            return -1;
        }
        if (apply_field(a, f, m, vs) != 0) return -1;
    }
    return 0;
}

/* A required integer id member, validated (apply_body already checked its type). */
static int64_t body_id(const admin_t *a, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    return is_integer(v, 1, MAX_ID) ? (int64_t)v->valuedouble : 0;
}

static int require(admin_t *a, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    if (v && !cJSON_IsNull(v)) return 0;
    set_error(a, 400, "INVALID_REQUEST", "field '%s' is required", name);
    return -1;
}

/* The body must be empty or {} (actions without parameters). */
static int no_body(admin_t *a)
{
    if (!cJSON_GetArraySize(a->in)) return 0;
    set_error(a, 400, "INVALID_REQUEST", "unknown field '%.64s'", a->in->child->string);
    return -1;
}

/* ---- storage helpers ----------------------------------------------------------------------------
 */

typedef struct first_s {
    char v[4][80]; /* first row's first four columns */
    int cols[4];   /* 1 when that column was not NULL */
    int rows;
} first_t;

static void first_row(void *ud, int ncols, const char *const *cols)
{
    first_t *f = ud;
    if (f->rows++) return;
    for (int i = 0; i < ncols && i < 4; i++) {
        f->cols[i] = cols[i] != NULL;
        snprintf(f->v[i], sizeof(f->v[i]), "%s", cols[i] ? cols[i] : "");
    }
}

/* Run sql in tx and keep its first row in *f. 0, or -1 with the storage error set. */
static int tx_first(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                    first_t *f)
{
    char err[256];
    memset(f, 0, sizeof(*f));
    if (mg_store_tx_exec(tx, sql, n, p, first_row, f, err, sizeof(err)) < 0) {
        storage_error(a, err);
        return -1;
    }
    return 0;
}

/* Run a write in tx. Returns rows changed, or -1 with the error set: a constraint becomes
 * 400 naming `field` (the only constraint the caller did not check beforehand is a race on
 * a unique name), anything else 500. */
static int tx_write(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                    const char *field)
{
    char err[256];
    int rc = mg_store_tx_exec(tx, sql, n, p, NULL, NULL, err, sizeof(err));
    if (rc == MG_STORE_ECONSTRAINT) {
        set_error(a, 400, "INVALID_REQUEST", "field '%s': conflicts with an existing record",
                  field);
        return -1;
    }
    if (rc < 0) storage_error(a, err);
    return rc;
}

static int tx_begin(admin_t *a, mg_store_tx_t **tx)
{
    char err[256];
    if (mg_store_tx_begin(a->s->store, tx, err, sizeof(err)) == 0) return 0;
    storage_error(a, err);
    return -1;
}

static int tx_commit(admin_t *a, mg_store_tx_t *tx)
{
    char err[256];
    if (mg_store_tx_commit(tx, err, sizeof(err)) == 0) return 0;
    storage_error(a, err);
    return -1;
}

/* Rows into a JSON array through a row builder (mg_store_query, or inside tx). */
typedef cJSON *(*row_json_fn)(int ncols, const char *const *cols);
typedef struct rows_s {
    row_json_fn fn;
    cJSON *list;
} rows_t;

static void rows_add(void *ud, int ncols, const char *const *cols)
{
    rows_t *r = ud;
    cJSON *o = r->fn(ncols, cols);
    if (o) cJSON_AddItemToArray(r->list, o);
}

/* SELECT into a new array (read connection). NULL with the error set on failure. */
static cJSON *query_list(admin_t *a, const char *sql, int n, const char *const *p, row_json_fn fn)
{
    char err[256];
    rows_t r = {fn, cJSON_CreateArray()};
    if (!r.list) {
        set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        return NULL;
    }
    if (mg_store_query(a->s->store, sql, n, p, rows_add, &r, err, sizeof(err)) != 0) {
        cJSON_Delete(r.list);
        storage_error(a, err);
        return NULL;
    }
    return r.list;
}

/* SELECT one row inside tx as JSON; NULL with the error set on failure or no row. */
static cJSON *tx_json(admin_t *a, mg_store_tx_t *tx, const char *sql, const char *id,
                      row_json_fn fn)
{
    char err[256];
    rows_t r = {fn, cJSON_CreateArray()};
    const char *p[1] = {id};
    if (!r.list || mg_store_tx_exec(tx, sql, 1, p, rows_add, &r, err, sizeof(err)) < 0) {
        cJSON_Delete(r.list);
        storage_error(a, r.list ? err : "out of memory");
        return NULL;
    }
    cJSON *o = cJSON_DetachItemFromArray(r.list, 0);
    cJSON_Delete(r.list);
    if (!o) storage_error(a, "row vanished inside its transaction");
    return o;
}

/* ---- JSON views of rows -------------------------------------------------------------------------
 */

static void add_int(cJSON *o, const char *k, const char *v)
{
    if (v)
        cJSON_AddNumberToObject(o, k, (double)strtoll(v, NULL, 10));
    else
        cJSON_AddNullToObject(o, k);
}

static void add_str(cJSON *o, const char *k, const char *v)
{
    if (v)
        cJSON_AddStringToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

/* A JSON text column as a value; fallback (array or object) when absent or malformed. */
static void add_json(cJSON *o, const char *k, const char *v, int object)
{
    cJSON *j = v ? cJSON_Parse(v) : NULL;
    if (!j) j = object ? cJSON_CreateObject() : cJSON_CreateArray();
    cJSON_AddItemToObject(o, k, j);
}

#define TENANT_JSON_COLUMNS "id, name, created_at"
static cJSON *tenant_json(int ncols, const char *const *c)
{
    if (ncols < 3) return NULL;
    cJSON *o = cJSON_CreateObject();
    add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "tenant");
    add_str(o, "name", c[1]);
    add_int(o, "created_at", c[2]);
    return o;
}

#define PROJECT_JSON_COLUMNS                                                                       \
    "id, tenant_id, name, rpm_limit, tpm_limit, max_concurrency, monthly_limit_micros, created_at"
static cJSON *project_json(int ncols, const char *const *c)
{
    if (ncols < 8) return NULL;
    cJSON *o = cJSON_CreateObject();
    add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "project");
    add_int(o, "tenant_id", c[1]);
    add_str(o, "name", c[2]);
    add_int(o, "rpm_limit", c[3]);
    add_int(o, "tpm_limit", c[4]);
    add_int(o, "max_concurrency", c[5]);
    add_int(o, "monthly_limit_micros", c[6]);
    add_int(o, "created_at", c[7]);
    return o;
}

#define KEY_JSON_COLUMNS                                                                           \
    "id, tenant_id, project_id, name, display, scopes, models, priorities, rpm_limit,"             \
    " tpm_limit, max_concurrency, max_queued, daily_limit_micros, monthly_limit_micros,"           \
    " expires_at, labels, enabled, revoked_at, replaced_by, last_used_at, created_at"

static const char *key_status(const char *const *c)
{
    if (c[17]) return "revoked";
    if (!c[16] || strcmp(c[16], "1") != 0) return "disabled";
    if (c[14] && strtoll(c[14], NULL, 10) <= now_s()) return "expired";
    return "active";
}

/* A key as the admin API shows it: never the digest, never the key. */
static cJSON *key_json(int ncols, const char *const *c)
{
    static const char *const limits[] = {"rpm_limit",          "tpm_limit",
                                         "max_concurrency",    "max_queued",
                                         "daily_limit_micros", "monthly_limit_micros"};
    if (ncols < 21) return NULL;
    cJSON *o = cJSON_CreateObject();
    add_int(o, "id", c[0]);
    cJSON_AddStringToObject(o, "object", "api_key");
    add_int(o, "tenant_id", c[1]);
    add_int(o, "project_id", c[2]);
    add_str(o, "name", c[3]);
    add_str(o, "display", c[4]);
    add_json(o, "scopes", c[5], 0);
    add_json(o, "models", c[6], 0);
    add_json(o, "priorities", c[7], 0);
    for (int i = 0; i < 6; i++)
        add_int(o, limits[i], c[8 + i]);
    add_int(o, "expires_at", c[14]);
    add_json(o, "labels", c[15], 1);
    cJSON_AddBoolToObject(o, "enabled", c[16] && strcmp(c[16], "1") == 0);
    cJSON_AddStringToObject(o, "status", key_status(c));
    add_int(o, "revoked_at", c[17]);
    add_int(o, "replaced_by", c[18]);
    add_int(o, "last_used_at", c[19]);
    add_int(o, "created_at", c[20]);
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
        storage_error(a, err);
        return NULL;
    }
    if (!r.rec) storage_error(a, "cannot build the key record of the row just written");
    return r.rec;
}

/* The committed change could not be mirrored in memory: rebuild the whole state from the
 * store, so memory follows the database again. */
static void auth_resync(admin_t *a, int rc)
{
    char err[256];
    mg_log_msg(MG_LOG_ERROR, a->req->request_id,
               "admin %s: in-memory key index update failed (%d); reloading it from the store",
               a->action, rc);
    if (mg_auth_load(a->s->auth, a->s->store, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_ERROR, a->req->request_id, "auth reload failed: %s", err);
}

/* After commit: index (or re-index) rec. Takes over the caller's reference. */
static void auth_put(admin_t *a, mg_key_record_t *rec)
{
    int rc = a->s->auth ? mg_auth_put_key(a->s->auth, rec) : 0;
    if (rc != 0) auth_resync(a, rc);
    mg_key_record_unref(rec);
}

/* ---- tenants ------------------------------------------------------------------------------------
 */

static void tenant_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    char at[24], id[24];
    if (apply_body(a, tenant_fields, NFIELDS(tenant_fields), NULL, &vs) != 0 ||
        require(a, "name") != 0 || tx_begin(a, &tx) != 0)
        goto out;
    const char *pn[1] = {vs.v[0]};
    if (tx_first(a, tx, "SELECT id FROM tenants WHERE name = ?1", 1, pn, &f) != 0) goto out;
    if (f.rows) {
        set_error(a, 400, "INVALID_REQUEST", "field 'name': a tenant with this name exists");
        goto out;
    }
    fmt_i64(at, sizeof(at), now_s());
    const char *p[2] = {vs.v[0], at};
    if (tx_write(a, tx, "INSERT INTO tenants(name, created_at) VALUES (?1, ?2)", 2, p, "name") < 0)
        goto out;
    fmt_i64(id, sizeof(id), mg_store_tx_last_id(tx));
    snprintf(a->target, sizeof(a->target), "tenant:%s", id);
    cJSON *o = tx_json(a, tx, "SELECT " TENANT_JSON_COLUMNS " FROM tenants WHERE id = ?1", id,
                       tenant_json);
    if (!o) goto out;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (tx_commit(a, t) != 0) {
        cJSON_Delete(o);
        goto out;
    }
    set_answer(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    vals_free(&vs);
}

/* GET one row by id, or a list; 404 when the one row does not exist. */
static void get_rows(admin_t *a, const char *sql_one, const char *sql_list, const char *id, int n,
                     const char *const *p, row_json_fn fn, const char *what)
{
    const char *pid[1] = {id};
    cJSON *list = id ? query_list(a, sql_one, 1, pid, fn) : query_list(a, sql_list, n, p, fn);
    if (!list) return;
    if (!id) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
        cJSON_AddItemToObject(root, "data", list);
        set_answer(a, 200, root);
        return;
    }
    cJSON *o = cJSON_DetachItemFromArray(list, 0);
    cJSON_Delete(list);
    if (o)
        set_answer(a, 200, o);
    else
        set_error(a, 404, "NOT_FOUND", "%s %s does not exist", what, id);
}

/* ?name=value from the query string into out (digits only for ids); 1 when present. */
static int query_param(const admin_t *a, const char *name, char *out, size_t cap)
{
    const char *q = a->req->query;
    size_t n = strlen(name);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, name, n) != 0 || p[n] != '=') continue;
        size_t len = strcspn(p + n + 1, "&");
        if (len >= cap) len = cap - 1;
        memcpy(out, p + n + 1, len);
        out[len] = '\0';
        return 1;
    }
    return 0;
}

/* An id query parameter: 0 absent, 1 present and valid, -1 invalid (error set). */
static int query_id(admin_t *a, const char *name, char *out, size_t cap)
{
    if (!query_param(a, name, out, cap)) return 0;
    size_t len = strlen(out);
    if (len == 0 || len > 15 || strspn(out, "0123456789") != len) {
        set_error(a, 400, "INVALID_REQUEST", "query parameter '%s' must be a positive integer",
                  name);
        return -1;
    }
    return 1;
}

static void tenant_get(admin_t *a, const char *id)
{
    get_rows(a, "SELECT " TENANT_JSON_COLUMNS " FROM tenants WHERE id = ?1",
             "SELECT " TENANT_JSON_COLUMNS " FROM tenants ORDER BY id", id, 0, NULL, tenant_json,
             "tenant");
}

/* ---- projects -----------------------------------------------------------------------------------
 */

/* Whether tenant `id` exists (0/1), or -1 with the error set. */
static int tenant_exists(admin_t *a, mg_store_tx_t *tx, const char *id)
{
    first_t f;
    const char *p[1] = {id};
    if (tx_first(a, tx, "SELECT id FROM tenants WHERE id = ?1", 1, p, &f) != 0) return -1;
    if (f.rows) return 1;
    set_error(a, 404, "NOT_FOUND", "tenant %s does not exist", id);
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
    };
    if (a->s->auth && mg_auth_put_project(a->s->auth, &p) != 0) auth_resync(a, -1);
}

static int project_defaults(vals_t *vs)
{
    for (int i = P_RPM; i < P_N; i++)
        if (vals_set(vs, i, "0") != 0) return -1;
    return 0;
}

/* A project's name must be unique within its tenant. 0 free, -1 taken or error (set). */
static int project_name_free(admin_t *a, mg_store_tx_t *tx, const char *tenant, const char *name,
                             const char *self)
{
    first_t f;
    const char *p[3] = {tenant, name, self ? self : "0"};
    if (tx_first(a, tx, "SELECT id FROM projects WHERE tenant_id = ?1 AND name = ?2 AND id <> ?3",
                 3, p, &f) != 0)
        return -1;
    if (!f.rows) return 0;
    set_error(a, 400, "INVALID_REQUEST", "field 'name': the tenant has a project with this name");
    return -1;
}

static void project_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    char tenant[24], at[24], id[24];
    if (project_defaults(&vs) != 0) {
        set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (apply_body(a, project_fields, NFIELDS(project_fields), NULL, &vs) != 0 ||
        require(a, "tenant_id") != 0 || require(a, "name") != 0 || tx_begin(a, &tx) != 0)
        goto out;
    fmt_i64(tenant, sizeof(tenant), body_id(a, "tenant_id"));
    if (tenant_exists(a, tx, tenant) != 1 ||
        project_name_free(a, tx, tenant, vs.v[P_NAME], NULL) != 0)
        goto out;
    fmt_i64(at, sizeof(at), now_s());
    const char *p[7] = {tenant,       vs.v[P_NAME],    vs.v[P_RPM], vs.v[P_TPM],
                        vs.v[P_CONC], vs.v[P_MONTHLY], at};
    if (tx_write(a, tx,
                 "INSERT INTO projects(tenant_id, " PROJECT_VAL_COLUMNS ", created_at)"
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                 7, p, "name") < 0)
        goto out;
    int64_t pid = mg_store_tx_last_id(tx);
    fmt_i64(id, sizeof(id), pid);
    snprintf(a->target, sizeof(a->target), "project:%s", id);
    cJSON *o = tx_json(a, tx, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1", id,
                       project_json);
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (!o || tx_commit(a, t) != 0) {
        if (!o) mg_store_tx_rollback(t);
        cJSON_Delete(o);
        goto out;
    }
    auth_project(a, pid, strtoll(tenant, NULL, 10), &vs);
    set_answer(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    vals_free(&vs);
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
        if (vals_set(r->vs, i, cols[i]) != 0) r->oom = 1;
}

/* Load `n` columns (sql) of row id into vs. 1 found, 0 not found (404 set), -1 error. */
static int tx_vals(admin_t *a, mg_store_tx_t *tx, const char *sql, const char *id, int n,
                   vals_t *vs, const char *what)
{
    char err[256];
    row_vals_t r = {vs, n, 0, 0};
    const char *p[1] = {id};
    if (mg_store_tx_exec(tx, sql, 1, p, row_vals, &r, err, sizeof(err)) < 0) {
        storage_error(a, err);
        return -1;
    }
    if (r.oom) {
        set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        return -1;
    }
    if (!r.rows) set_error(a, 404, "NOT_FOUND", "%s %s does not exist", what, id);
    return r.rows ? 1 : 0;
}

static void project_update(admin_t *a, const char *id)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (tx_begin(a, &tx) != 0 ||
        tx_vals(a, tx, "SELECT " PROJECT_VAL_COLUMNS " FROM projects WHERE id = ?1", id, P_N, &vs,
                "project") != 1 ||
        apply_body(a, project_fields, NFIELDS(project_fields), "tenant_id", &vs) != 0)
        goto out;
    const char *pid[1] = {id};
    if (tx_first(a, tx, "SELECT tenant_id FROM projects WHERE id = ?1", 1, pid, &f) != 0 ||
        project_name_free(a, tx, f.v[0], vs.v[P_NAME], id) != 0)
        goto out;
    const char *p[6] = {id, vs.v[P_NAME], vs.v[P_RPM], vs.v[P_TPM], vs.v[P_CONC], vs.v[P_MONTHLY]};
    if (tx_write(a, tx,
                 "UPDATE projects SET name = ?2, rpm_limit = ?3, tpm_limit = ?4,"
                 " max_concurrency = ?5, monthly_limit_micros = ?6 WHERE id = ?1",
                 6, p, "name") < 0)
        goto out;
    cJSON *o = tx_json(a, tx, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1", id,
                       project_json);
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (!o || tx_commit(a, t) != 0) {
        if (!o) mg_store_tx_rollback(t);
        cJSON_Delete(o);
        goto out;
    }
    auth_project(a, strtoll(id, NULL, 10), strtoll(f.v[0], NULL, 10), &vs);
    set_answer(a, 200, o);
out:
    mg_store_tx_rollback(tx);
    vals_free(&vs);
}

static void project_get(admin_t *a, const char *id)
{
    char tenant[24];
    int q = id ? 0 : query_id(a, "tenant_id", tenant, sizeof(tenant));
    if (q < 0) return;
    const char *p[1] = {tenant};
    get_rows(a, "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE id = ?1",
             q ? "SELECT " PROJECT_JSON_COLUMNS " FROM projects WHERE tenant_id = ?1 ORDER BY id"
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
        if (vals_set(vs, d[i].slot, d[i].v) != 0) return -1;
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
        if (tx_first(a, tx, "SELECT tenant_id FROM projects WHERE id = ?1", 1, p, &f) != 0)
            return -1;
        if (!f.rows) {
            set_error(a, 404, "NOT_FOUND", "project %s does not exist", vs->v[K_PROJECT]);
            return -1;
        }
        if (strcmp(f.v[0], tenant) != 0) {
            set_error(a, 400, "INVALID_REQUEST",
                      "field 'project_id': the project belongs to another tenant");
            return -1;
        }
    }
    if (vs->v[K_NAME]) {
        const char *p[3] = {tenant, vs->v[K_NAME], self ? self : "0"};
        if (tx_first(a, tx,
                     "SELECT id FROM api_keys WHERE tenant_id = ?1 AND name = ?2"
                     " AND revoked_at IS NULL AND id <> ?3",
                     3, p, &f) != 0)
            return -1;
        if (f.rows) {
            set_error(a, 400, "INVALID_REQUEST",
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
    cJSON *o = rec ? tx_json(a, tx, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1", id,
                             key_json)
                   : NULL;
    if (!o) {
        mg_key_record_unref(rec);
        mg_store_tx_rollback(tx);
        return -1;
    }
    if (tx_commit(a, tx) != 0) {
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
        set_error(a, 500, "INTERNAL_ERROR", "cannot generate a key");
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
    set_answer(a, status, o);
}

static void key_create(admin_t *a)
{
    vals_t vs = {0};
    mg_store_tx_t *tx = NULL;
    char tenant[24], at[24], id[24], hex[2 * MG_KEY_DIGEST_LEN + 1], display[MG_KEY_DISPLAY_MAX];
    if (key_defaults(&vs) != 0) {
        set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        goto out;
    }
    if (apply_body(a, key_fields, NFIELDS(key_fields), NULL, &vs) != 0 ||
        require(a, "tenant_id") != 0)
        goto out;
    if (vs.v[K_EXPIRES] && strtoll(vs.v[K_EXPIRES], NULL, 10) <= now_s()) {
        set_error(a, 400, "INVALID_REQUEST", "field 'expires_at': must be in the future");
        goto out;
    }
    fmt_i64(tenant, sizeof(tenant), body_id(a, "tenant_id"));
    if (tx_begin(a, &tx) != 0 || tenant_exists(a, tx, tenant) != 1 ||
        key_refs_ok(a, tx, tenant, &vs, NULL) != 0 || new_key(a, hex, display) != 0)
        goto out;
    fmt_i64(at, sizeof(at), now_s());
    const char *p[4 + K_N] = {tenant, hex, display, at};
    for (int i = 0; i < K_N; i++)
        p[4 + i] = vs.v[i];
    if (tx_write(a, tx,
                 "INSERT INTO api_keys(tenant_id, digest, display, created_at, " KEY_VAL_COLUMNS ")"
                 " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,"
                 " ?17, ?18)",
                 4 + K_N, p, "name") < 0)
        goto out;
    fmt_i64(id, sizeof(id), mg_store_tx_last_id(tx));
    snprintf(a->target, sizeof(a->target), "key:%s", id);
    cJSON *o;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (key_commit(a, t, id, &o) != 0) goto out;
    answer_with_key(a, 201, o);
out:
    mg_store_tx_rollback(tx);
    vals_free(&vs);
}

/* Start a change of key `id`: begin, and check that it exists and is not revoked. The
 * tenant id and digest (hex) are returned in f->v[0] and f->v[1]. 0, or -1 (error set, tx
 * rolled back). */
static int key_begin(admin_t *a, const char *id, mg_store_tx_t **tx, first_t *f)
{
    const char *p[1] = {id};
    if (tx_begin(a, tx) != 0) return -1;
    if (tx_first(a, *tx, "SELECT tenant_id, digest, revoked_at FROM api_keys WHERE id = ?1", 1, p,
                 f) != 0)
        goto fail;
    if (!f->rows) {
        set_error(a, 404, "NOT_FOUND", "key %s does not exist", id);
        goto fail;
    }
    if (f->cols[2]) {
        set_error(a, 409, "CONFLICT", "key %s is revoked and cannot change", id);
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
        apply_body(a, key_fields, NFIELDS(key_fields), "tenant_id", &vs) != 0 ||
        key_refs_ok(a, tx, f.v[0], &vs, id) != 0)
        goto out;
    const char *p[1 + K_N] = {id};
    for (int i = 0; i < K_N; i++)
        p[1 + i] = vs.v[i];
    if (tx_write(a, tx,
                 "UPDATE api_keys SET project_id = ?2, name = ?3, scopes = ?4, models = ?5,"
                 " priorities = ?6, rpm_limit = ?7, tpm_limit = ?8, max_concurrency = ?9,"
                 " max_queued = ?10, daily_limit_micros = ?11, monthly_limit_micros = ?12,"
                 " expires_at = ?13, labels = ?14, enabled = ?15 WHERE id = ?1",
                 1 + K_N, p, "name") < 0)
        goto out;
    cJSON *o;
    mg_store_tx_t *t = tx;
    tx = NULL;
    if (key_commit(a, t, id, &o) == 0) set_answer(a, 200, o);
out:
    mg_store_tx_rollback(tx);
    vals_free(&vs);
}

static void key_set_enabled(admin_t *a, const char *id, int enabled)
{
    mg_store_tx_t *tx = NULL;
    first_t f;
    if (no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    const char *p[2] = {id, enabled ? "1" : "0"};
    if (tx_write(a, tx, "UPDATE api_keys SET enabled = ?2 WHERE id = ?1", 2, p, "enabled") < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    cJSON *o;
    if (key_commit(a, tx, id, &o) == 0) set_answer(a, 200, o);
}

static void key_delete(admin_t *a, const char *id)
{
    mg_store_tx_t *tx = NULL;
    first_t f;
    char at[24];
    unsigned char digest[MG_KEY_DIGEST_LEN];
    if (no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    fmt_i64(at, sizeof(at), now_s());
    const char *p[2] = {id, at};
    if (tx_write(a, tx, "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1", 2, p, "id") < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    if (tx_commit(a, tx) != 0) return;
    if (a->s->auth &&
        (mg_auth_digest_parse(f.v[1], digest) != 0 || mg_auth_remove_key(a->s->auth, digest) != 0))
        auth_resync(a, MG_KEYS_ENOENT);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)strtoll(id, NULL, 10));
    cJSON_AddStringToObject(o, "object", "api_key");
    cJSON_AddBoolToObject(o, "deleted", 1);
    set_answer(a, 200, o);
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
    if (no_body(a) != 0 || key_begin(a, id, &tx, &f) != 0) return;
    fmt_i64(at, sizeof(at), now_s());
    const char *p[4] = {id, at, NULL, NULL};
    if (new_key(a, hex, display) != 0 ||
        tx_write(a, tx, "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1", 2, p, "id") < 0)
        goto fail;
    p[1] = hex;
    p[2] = display;
    p[3] = at;
    if (tx_write(a, tx,
                 "INSERT INTO api_keys(tenant_id, digest, display, created_at, " KEY_VAL_COLUMNS ")"
                 " SELECT tenant_id, ?2, ?3, ?4, " KEY_VAL_COLUMNS " FROM api_keys WHERE id = ?1",
                 4, p, "name") < 0)
        goto fail;
    fmt_i64(nid, sizeof(nid), mg_store_tx_last_id(tx));
    const char *q[2] = {id, nid};
    if (tx_write(a, tx, "UPDATE api_keys SET replaced_by = ?2 WHERE id = ?1", 2, q, "id") < 0)
        goto fail;
    mg_key_record_t *rec = tx_record(a, tx, nid);
    cJSON *o = rec ? tx_json(a, tx, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1", nid,
                             key_json)
                   : NULL;
    if (!o || tx_commit(a, tx) != 0) {
        if (!o) mg_store_tx_rollback(tx);
        mg_key_record_unref(rec);
        cJSON_Delete(o);
        return;
    }
    snprintf(a->target, sizeof(a->target), "key:%s", id);
    int rc = !a->s->auth ? 0
             : mg_auth_digest_parse(f.v[1], old_digest) != 0
                 ? MG_KEYS_EINVAL
                 : mg_auth_rotate_key(a->s->auth, old_digest, rec);
    if (rc != 0) auth_resync(a, rc);
    mg_key_record_unref(rec);
    cJSON_AddNumberToObject(o, "replaces", (double)strtoll(id, NULL, 10));
    answer_with_key(a, 200, o);
    return;
fail:
    mg_store_tx_rollback(tx);
}

static void key_get(admin_t *a, const char *id)
{
    if (id) {
        get_rows(a, "SELECT " KEY_JSON_COLUMNS " FROM api_keys WHERE id = ?1", NULL, id, 0, NULL,
                 key_json, "key");
        return;
    }
    char tenant[24] = "", project[24] = "", revoked[8] = "";
    int qt = query_id(a, "tenant_id", tenant, sizeof(tenant));
    int qp = qt < 0 ? -1 : query_id(a, "project_id", project, sizeof(project));
    if (qt < 0 || qp < 0) return;
    query_param(a, "include_revoked", revoked, sizeof(revoked));
    int all = strcmp(revoked, "1") == 0 || strcmp(revoked, "true") == 0;
    const char *p[3] = {qt ? tenant : NULL, qp ? project : NULL, all ? "1" : "0"};
    get_rows(a, NULL,
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
    add_int(o, "id", c[0]);
    add_int(o, "at_ms", c[1]);
    add_str(o, "actor", c[2]);
    add_str(o, "action", c[3]);
    add_str(o, "target", c[4]);
    add_int(o, "status", c[5]);
    add_str(o, "request_id", c[6]);
    add_str(o, "client_addr", c[7]);
    return o;
}

/* GET /api/v2/audit[?limit=N]: the newest records first (N 1..1000, default 100). */
static void audit_list(admin_t *a)
{
    char limit[24] = "100";
    int q = query_id(a, "limit", limit, sizeof(limit));
    if (q < 0) return;
    if (strtoll(limit, NULL, 10) > 1000) snprintf(limit, sizeof(limit), "1000");
    const char *p[1] = {limit};
    get_rows(a, NULL, "SELECT " AUDIT_JSON_COLUMNS " FROM audit_logs ORDER BY id DESC LIMIT ?1",
             NULL, 1, p, audit_json, "record");
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
    size_t n = strlen(*id);
    return n > 0 && n <= 15 && strspn(*id, "0123456789") == n ? 0 : -1;
}

static int method_is(const admin_t *a, int m)
{
    return a->req->method == m;
}

/* The handler for a collection path ({id} absent) or an item path. 1 when one ran. */
static int route_plain(admin_t *a, const char *coll, const char *id)
{
    int get = method_is(a, HTTP_GET), post = method_is(a, HTTP_POST) && !id,
        put = method_is(a, HTTP_PUT) && id, del = method_is(a, HTTP_DELETE) && id;
    if (strcmp(coll, "tenants") == 0) {
        a->action = get ? (id ? "tenant.get" : "tenant.list") : post ? "tenant.create" : NULL;
        if (get)
            tenant_get(a, id);
        else if (post)
            tenant_create(a);
    } else if (strcmp(coll, "projects") == 0) {
        a->action = get    ? (id ? "project.get" : "project.list")
                    : post ? "project.create"
                    : put  ? "project.update"
                           : NULL;
        if (get)
            project_get(a, id);
        else if (post)
            project_create(a);
        else if (put)
            project_update(a, id);
    } else {
        a->action = get    ? (id ? "key.get" : "key.list")
                    : post ? "key.create"
                    : put  ? "key.update"
                    : del  ? "key.delete"
                           : NULL;
        if (get)
            key_get(a, id);
        else if (post)
            key_create(a);
        else if (put)
            key_update(a, id);
        else if (del)
            key_delete(a, id);
    }
    return a->action != NULL;
}

/* POST /api/v2/keys/{id}/{disable|enable|rotate}. 1 when one ran. */
static int route_key_verb(admin_t *a, const char *id, const char *verb)
{
    if (strcmp(verb, "disable") == 0)
        a->action = "key.disable";
    else if (strcmp(verb, "enable") == 0)
        a->action = "key.enable";
    else if (strcmp(verb, "rotate") == 0)
        a->action = "key.rotate";
    else
        return 0;
    if (!method_is(a, HTTP_POST)) return 0;
    if (verb[0] == 'r')
        key_rotate(a, id);
    else
        key_set_enabled(a, id, verb[0] == 'e');
    return 1;
}

/* Which handler, by collection, id, action and method; sets a->action and a->target. */
static void route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    static const char *const colls[3][2] = {
        {"tenants", "tenant"}, {"projects", "project"}, {"keys", "key"}};
    const char *kind = NULL;
    if (!strcmp(coll, "providers") || !strcmp(coll, "pools") || !strcmp(coll, "cooldowns")) {
        a->action = "admin.read_only"; /* api.c answers their reads */
        set_error(a, 405, "METHOD_NOT_ALLOWED", "this admin endpoint is read-only");
        return;
    }
    if (strcmp(coll, "audit") == 0 && !id && method_is(a, HTTP_GET)) {
        a->action = "audit.list";
        audit_list(a);
        return;
    }
    for (int i = 0; i < 3; i++)
        if (strcmp(coll, colls[i][0]) == 0) kind = colls[i][1];
    if (!kind || (verb && strcmp(kind, "key") != 0)) {
        a->action = "admin.unknown";
        set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
        return;
    }
    if (id) snprintf(a->target, sizeof(a->target), "%s:%s", kind, id);
    if (verb ? route_key_verb(a, id, verb) : route_plain(a, coll, id)) return;
    if (verb && !a->action) {
        a->action = "admin.unknown";
        set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
        return;
    }
    if (!a->action) a->action = "admin.unknown";
    set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
}

/* Parse the body into a->in (an object; empty body = {}). 0, or -1 with the error set. */
static int parse_body(admin_t *a)
{
    mg_http_req_t *req = a->req;
    a->in = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : cJSON_CreateObject();
    if (cJSON_IsObject(a->in)) return 0;
    cJSON_Delete(a->in);
    a->in = NULL;
    set_error(a, 400, "INVALID_REQUEST", "request body is not a JSON object");
    return -1;
}

/* ---- audit and answer ---------------------------------------------------------------------------
 */

void mg_admin_audit(mg_server_t *s, const mg_http_req_t *req, const char *action,
                    const char *target, int status)
{
    mg_store_tx_t *tx = NULL;
    char err[256] = "", at[24], st[8], addr[80];
    mg_http_peer(req, addr, sizeof(addr));
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    fmt_i64(at, sizeof(at), (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    snprintf(st, sizeof(st), "%d", status);
    const char *p[7] = {at,
                        ACTOR,
                        action,
                        target && *target ? target : NULL,
                        st,
                        req->request_id,
                        addr[0] ? addr : NULL};
    int rc = mg_store_tx_begin(s->store, &tx, err, sizeof(err));
    if (rc == 0)
        rc =
            mg_store_tx_exec(tx,
                             "INSERT INTO audit_logs(at, actor, action, target, status, request_id,"
                             " client_addr) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                             7, p, NULL, NULL, err, sizeof(err));
    if (rc >= 0)
        rc = mg_store_tx_commit(tx, err, sizeof(err));
    else
        mg_store_tx_rollback(tx);
    if (rc >= 0) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_ERROR, "audit write failed");
    mg_log_str(&l, "request_id", req->request_id);
    mg_log_str(&l, "actor", ACTOR);
    mg_log_str(&l, "action", action);
    mg_log_str(&l, "target", target);
    mg_log_int(&l, "status", status);
    mg_log_str(&l, "client_addr", addr);
    mg_log_str(&l, "error", err);
    mg_log_end(&l);
}

/* Answer a success body: metrics, the request log line, the response; the printed body is
 * wiped before it is freed (it may hold a key shown once). */
static void respond(admin_t *a)
{
    mg_http_req_t *req = a->req;
    mg_buf_t text = {0};
    if (mg_json_print(a->answer, &text) != 0) {
        mg_buf_free(&text);
        mg_api_error(a->s, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    double secs = (double)(uv_now(a->s->loop) - req->start_ms) / 1000.0;
    mg_metrics_request(&a->s->metrics, MG_EP_OTHER, a->status, secs);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "request");
    mg_log_str(&l, "request_id", req->request_id);
    mg_log_str(&l, "method", llhttp_method_name((llhttp_method_t)req->method));
    mg_log_str(&l, "path", req->path);
    mg_log_int(&l, "status", a->status);
    mg_log_str(&l, "admin_action", a->action);
    mg_log_end(&l);
    mg_http_respond(req, a->status, "application/json", NULL, text.data, text.len);
    OPENSSL_cleanse(text.data, text.len);
    mg_buf_free(&text);
}

/* Wipe the clear key from the answer tree before it is freed. */
static void wipe_answer(admin_t *a)
{
    cJSON *k = a->answer ? cJSON_GetObjectItemCaseSensitive(a->answer, "key") : NULL;
    if (cJSON_IsString(k)) OPENSSL_cleanse(k->valuestring, strlen(k->valuestring));
    cJSON_Delete(a->answer);
    a->answer = NULL;
    OPENSSL_cleanse(a->clear_key, sizeof(a->clear_key));
}

void mg_admin_handle(mg_server_t *s, mg_http_req_t *req)
{
    admin_t a;
    memset(&a, 0, sizeof(a));
    a.s = s;
    a.req = req;
    char buf[256], *coll, *id, *verb;
    const char *sub = req->path + strlen("/api/v2/");
    if (strncmp(req->path, "/api/v2/", 8) != 0 ||
        split_path(sub, buf, sizeof(buf), &coll, &id, &verb) != 0) {
        a.action = "admin.unknown";
        set_error(&a, 404, "NOT_FOUND", "no such admin endpoint");
    } else if (parse_body(&a) == 0) {
        route(&a, coll, id, verb);
    } else {
        a.action = "admin.invalid";
    }
    if (!a.action) a.action = "admin.unknown";
    if (!a.code && !a.answer) set_error(&a, 500, "INTERNAL_ERROR", "no answer");
    mg_admin_audit(s, req, a.action, a.target, a.status);
    if (a.code)
        mg_api_error(s, req, MG_EP_OTHER, a.status, a.code, a.message, 0);
    else
        respond(&a);
    wipe_answer(&a);
    cJSON_Delete(a.in);
}
