/* req: the helpers every admin resource shares; see req.h. */
#include "admin/req.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "base/secret.h"

#define MAX_MODELS 1024
#define MAX_LABELS 64
#define MAX_SECRET 4096

void adm_set_answer(admin_t *a, int status, cJSON *body)
{
    a->status = status;
    cJSON_Delete(a->answer);
    a->answer = body;
}

void adm_set_error(admin_t *a, int status, const char *code, const char *fmt, ...)
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
void adm_fx(admin_t *a, adm_fx_kind_t kind, mg_key_record_t *rec, const unsigned char *digest,
            const mg_auth_project_t *project)
{
    admin_fx_t *fx = &a->fx[a->n_fx++]; /* at most ADM_MAX_FX per request, by construction */
    fx->kind = kind;
    fx->rec = rec;
    if (digest) memcpy(fx->digest, digest, sizeof(fx->digest));
    if (project) fx->project = *project;
}

void adm_storage_error(admin_t *a, const char *err)
{
    mg_log_msg(MG_LOG_ERROR, a->request_id, "admin %s: storage error: %s", a->action, err);
    adm_set_error(a, 500, "INTERNAL_ERROR", "storage error; see the gateway log");
}

int64_t adm_now_s(void)
{
    return (int64_t)time(NULL);
}

void adm_fmt_i64(char *buf, size_t cap, int64_t v)
{
    snprintf(buf, cap, "%lld", (long long)v);
}

void adm_vals_free(vals_t *vs)
{
    for (int i = 0; i < MAX_SLOTS; i++) free(vs->v[i]);
    memset(vs, 0, sizeof(*vs));
}

/* Set slot i to a copy of s (NULL = SQL NULL). 0 or -1 (out of memory). */
int adm_vals_set(vals_t *vs, int i, const char *s)
{
    char *c = s ? strdup(s) : NULL;
    if (s && !c) return -1;
    free(vs->v[i]);
    vs->v[i] = c;
    return 0;
}

static const field_t *field_find(const field_t *fs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(fs[i].name, name) == 0) return &fs[i];
    return NULL;
}

int adm_is_integer(const cJSON *v, double lo, double hi)
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
    cJSON_ArrayForEach(it, v) {
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
    cJSON_ArrayForEach(it, v) {
        if (!good_name(it->string, 64)) return "has an invalid label name";
        if (!cJSON_IsString(it) || strlen(it->valuestring) > 256) return "values must be strings";
    }
    return NULL;
}

/* An upstream base URL: http(s)://host[...], no whitespace, control characters, '?' or '#'. */
static int good_url(const char *u)
{
    const char *host = !strncmp(u, "http://", 7)    ? u + 7
                       : !strncmp(u, "https://", 8) ? u + 8
                                                    : NULL;
    if (!host || !*host || *host == '/' || strlen(u) > 2048) return 0;
    for (const char *c = u; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f || *c == '?' || *c == '#') return 0;
    return 1;
}

/* Whether the generation has loaded an adapter of this name. */
static int adapter_known(const mg_gen_t *g, const char *name)
{
    for (size_t i = 0; i < g->n_adapters; i++)
        if (strcmp(g->adapters[i].name, name) == 0) return 1;
    return 0;
}

/* Validate one scalar member (name, id, limit, bool, time, ...) into its text in buf (or NULL
 * for null). Returns NULL, or what is wrong with it. */
static const char *scalar_text(const field_t *f, const cJSON *v, char *buf, size_t cap,
                               const char **text)
{
    *text = NULL;
    if (cJSON_IsNull(v) && f->nullable) return NULL;
    if (f->type == F_NAME) {
        if (!cJSON_IsString(v) || !good_name(v->valuestring, ADM_MAX_NAME))
            return "must be a string of 1 to 128 characters without control characters";
        *text = v->valuestring;
    } else if (f->type == F_ID) {
        if (!adm_is_integer(v, 1, ADM_MAX_ID)) return "must be a positive integer";
        adm_fmt_i64(buf, cap, (int64_t)v->valuedouble);
        *text = buf;
    } else if (f->type == F_LIMIT) {
        if (!adm_is_integer(v, 0, f->max))
            return "must be an integer in range"; /* see apply_field */
        adm_fmt_i64(buf, cap, (int64_t)v->valuedouble);
        *text = buf;
    } else if (f->type == F_BOOL) {
        if (!cJSON_IsBool(v)) return "must be true or false";
        *text = cJSON_IsTrue(v) ? "1" : "0";
    } else if (f->type == F_NUMBER) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 ||
            v->valuedouble > f->max)
            return "must be a number in range"; /* see apply_field */
        snprintf(buf, cap, "%.17g", v->valuedouble);
        *text = buf;
    } else if (f->type == F_URL) {
        if (!cJSON_IsString(v) || !good_url(v->valuestring))
            return "must be an http:// or https:// URL with a host, without spaces, '?' or '#'";
        *text = v->valuestring;
    } else if (f->type == F_SECRET) {
        if (!cJSON_IsString(v) || !good_name(v->valuestring, MAX_SECRET))
            return "must be a string of 1 to 4096 characters without control characters";
        *text = v->valuestring;
    } else if (f->type == F_POOL) {
        if (!cJSON_IsString(v) ||
            (strcmp(v->valuestring, "main") != 0 && strcmp(v->valuestring, "fallback") != 0))
            return "must be \"main\" or \"fallback\"";
        *text = v->valuestring;
    } else if (f->type == F_PREFIX) {
        if (!cJSON_IsString(v) || (*v->valuestring && !good_name(v->valuestring, ADM_MAX_NAME)))
            return "must be a string of at most 128 characters without control characters";
        *text = v->valuestring;
    } else if (f->type == F_ADAPTER) {
        if (!cJSON_IsString(v)) return "must be a string";
        *text = v->valuestring;
    } else {
        int64_t t = adm_is_integer(v, 1, ADM_MAX_ID) ? (int64_t)v->valuedouble
                    : cJSON_IsString(v)              ? parse_time(v->valuestring)
                                                     : -1;
        if (t <= 0) return "must be unix seconds, \"YYYY-MM-DDTHH:MM:SSZ\" or null";
        adm_fmt_i64(buf, cap, t);
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
    if (!structured) problem = scalar_text(f, v, buf, sizeof(buf), &text);
    else if (f->type == F_LABELS) problem = check_labels(v);
    else problem = check_string_array(v, MAX_MODELS, a->gen->cfg, f->type, &idx);
    if (!problem && f->type == F_ADAPTER && text && !adapter_known(a->gen, text))
        problem = "is not an adapter in adapters/";
    if (problem) {
        if (f->type == F_LIMIT)
            adm_set_error(a, 400, "INVALID_REQUEST",
                          "field '%s': must be an integer from 0 to %.0f", f->name, f->max);
        else if (f->type == F_NUMBER)
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': must be a number from 0 to %g",
                          f->name, f->max);
        else if (idx >= 0)
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s[%d]': %s", f->name, idx, problem);
        else adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': %s", f->name, problem);
        return -1;
    }
    if (f->slot < 0) return 0;
    if (structured && !(text = printed = cJSON_PrintUnformatted(v))) goto oom;
    if (adm_vals_set(vs, f->slot, text) != 0) goto oom;
    free(printed);
    if (f->type == F_URL && vs->v[f->slot]) { /* "https://x/v1/" and "https://x/v1" alike */
        char *u = vs->v[f->slot];
        size_t n = strlen(u);
        while (n > 8 && u[n - 1] == '/') u[--n] = '\0';
    }
    return 0;
oom:
    free(printed);
    adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    return -1;
}

/* Check every member of the body against the table and store the values. Members named in
 * `fixed` are refused ("cannot be changed"). 0 or -1 (error set). */
int adm_apply_body(admin_t *a, const field_t *fs, size_t n, const char *fixed, vals_t *vs)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, a->in) {
        const field_t *f = field_find(fs, n, m->string);
        if (!f) {
            adm_set_error(a, 400, "INVALID_REQUEST", "unknown field '%.64s'", m->string);
            return -1;
        }
        if (fixed && strcmp(fixed, m->string) == 0) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': cannot be changed", m->string);
            return -1;
        }
        if (apply_field(a, f, m, vs) != 0) return -1;
    }
    return 0;
}

/* A required integer id member, validated (apply_body already checked its type). */
int64_t adm_body_id(const admin_t *a, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    return adm_is_integer(v, 1, ADM_MAX_ID) ? (int64_t)v->valuedouble : 0;
}

int adm_require(admin_t *a, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(a->in, name);
    if (v && !cJSON_IsNull(v)) return 0;
    adm_set_error(a, 400, "INVALID_REQUEST", "field '%s' is required", name);
    return -1;
}

/* The body must be empty or {} (actions without parameters). */
int adm_no_body(admin_t *a)
{
    if (!cJSON_GetArraySize(a->in)) return 0;
    adm_set_error(a, 400, "INVALID_REQUEST", "unknown field '%.64s'", a->in->child->string);
    return -1;
}

void adm_first_row(void *ud, int ncols, const char *const *cols)
{
    first_t *f = ud;
    if (f->rows++) return;
    for (int i = 0; i < ncols && i < 4; i++) {
        f->cols[i] = cols[i] != NULL;
        snprintf(f->v[i], sizeof(f->v[i]), "%s", cols[i] ? cols[i] : "");
    }
}

/* Run sql in tx and keep its first row in *f. 0, or -1 with the storage error set. */
int adm_tx_first(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                 first_t *f)
{
    char err[256];
    memset(f, 0, sizeof(*f));
    if (mg_store_tx_exec(tx, sql, n, p, adm_first_row, f, err, sizeof(err)) < 0) {
        adm_storage_error(a, err);
        return -1;
    }
    return 0;
}

/* Run a write in tx. Returns rows changed, or -1 with the error set: a constraint becomes
 * 400 naming `field` (the only constraint the caller did not check beforehand is a race on
 * a unique name), anything else 500. */
int adm_tx_write(admin_t *a, mg_store_tx_t *tx, const char *sql, int n, const char *const *p,
                 const char *field)
{
    char err[256];
    int rc = mg_store_tx_exec(tx, sql, n, p, NULL, NULL, err, sizeof(err));
    if (rc == MG_STORE_ECONSTRAINT) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': conflicts with an existing record",
                      field);
        return -1;
    }
    if (rc < 0) adm_storage_error(a, err);
    return rc;
}

/* A failed begin or commit: 503 when the shared control plane refused (nothing changed,
 * here or anywhere: the client may retry), 500 otherwise. */
static void tx_error(admin_t *a, int rc, const char *err)
{
    if (rc != MG_STORE_EUNAVAIL) {
        adm_storage_error(a, err);
        return;
    }
    mg_log_msg(MG_LOG_WARN, a->request_id, "admin %s: control plane unavailable: %s", a->action,
               err);
    adm_set_error(a, 503, "CONTROL_PLANE_UNAVAILABLE",
                  "the cluster's control plane (PostgreSQL) is unreachable: nothing was changed");
}

int adm_tx_begin(admin_t *a, mg_store_tx_t **tx)
{
    char err[256];
    int rc = mg_store_tx_begin(a->store, tx, err, sizeof(err));
    if (rc == 0) return 0;
    tx_error(a, rc, err);
    return -1;
}

int adm_tx_commit(admin_t *a, mg_store_tx_t *tx)
{
    char err[256];
    int rc = mg_store_tx_commit(tx, err, sizeof(err));
    if (rc == 0) return 0;
    tx_error(a, rc, err);
    return -1;
}

/* Rows into a JSON array through a row builder (mg_store_query, or inside tx). */
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
cJSON *adm_query_list(admin_t *a, const char *sql, int n, const char *const *p, row_json_fn fn)
{
    char err[256];
    rows_t r = {fn, cJSON_CreateArray()};
    if (!r.list) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        return NULL;
    }
    if (mg_store_query(a->store, sql, n, p, rows_add, &r, err, sizeof(err)) != 0) {
        cJSON_Delete(r.list);
        adm_storage_error(a, err);
        return NULL;
    }
    return r.list;
}

/* SELECT one row inside tx as JSON; NULL with the error set on failure or no row. */
cJSON *adm_tx_json(admin_t *a, mg_store_tx_t *tx, const char *sql, const char *id, row_json_fn fn)
{
    char err[256];
    rows_t r = {fn, cJSON_CreateArray()};
    const char *p[1] = {id};
    if (!r.list || mg_store_tx_exec(tx, sql, 1, p, rows_add, &r, err, sizeof(err)) < 0) {
        cJSON_Delete(r.list);
        adm_storage_error(a, r.list ? err : "out of memory");
        return NULL;
    }
    cJSON *o = cJSON_DetachItemFromArray(r.list, 0);
    cJSON_Delete(r.list);
    if (!o) adm_storage_error(a, "row vanished inside its transaction");
    return o;
}

/* ---- JSON views of rows -------------------------------------------------------------------------
 */

void adm_add_int(cJSON *o, const char *k, const char *v)
{
    if (v) cJSON_AddNumberToObject(o, k, (double)strtoll(v, NULL, 10));
    else cJSON_AddNullToObject(o, k);
}

void adm_add_str(cJSON *o, const char *k, const char *v)
{
    if (v) cJSON_AddStringToObject(o, k, v);
    else cJSON_AddNullToObject(o, k);
}

/* A JSON text column as a value; fallback (array or object) when absent or malformed. */
void adm_add_json(cJSON *o, const char *k, const char *v, int object)
{
    cJSON *j = v ? cJSON_Parse(v) : NULL;
    if (!j) j = object ? cJSON_CreateObject() : cJSON_CreateArray();
    cJSON_AddItemToObject(o, k, j);
}
void adm_get_rows(admin_t *a, const char *sql_one, const char *sql_list, const char *id, int n,
                  const char *const *p, row_json_fn fn, const char *what)
{
    const char *pid[1] = {id};
    cJSON *list =
        id ? adm_query_list(a, sql_one, 1, pid, fn) : adm_query_list(a, sql_list, n, p, fn);
    if (!list) return;
    if (!id) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(list));
        cJSON_AddItemToObject(root, "data", list);
        adm_set_answer(a, 200, root);
        return;
    }
    cJSON *o = cJSON_DetachItemFromArray(list, 0);
    cJSON_Delete(list);
    if (o) adm_set_answer(a, 200, o);
    else adm_set_error(a, 404, "NOT_FOUND", "%s %s does not exist", what, id);
}

/* ?name=value from the query string into out (digits only for ids); 1 when present. */
int adm_query_param(const admin_t *a, const char *name, char *out, size_t cap)
{
    const char *q = a->query;
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
int adm_query_id(admin_t *a, const char *name, char *out, size_t cap)
{
    if (a->scope_tenant && strcmp(name, "tenant_id") == 0) {
        /* a tenant admin lists its own tenant's records, whatever it asked for */
        adm_fmt_i64(out, cap, a->scope_tenant);
        return 1;
    }
    if (!adm_query_param(a, name, out, cap)) return 0;
    size_t len = strlen(out);
    if (len == 0 || len > 15 || strspn(out, "0123456789") != len) {
        adm_set_error(a, 400, "INVALID_REQUEST", "query parameter '%s' must be a positive integer",
                      name);
        return -1;
    }
    return 1;
}
