/* models: stored logical models; see models.h. */
#include "conf/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "token/encoding.h"

int mg_model_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 128) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              strchr("._-:@", c)))
            return 0;
    }
    return 1;
}

/* An optional integer member in [0, max]; 0 when absent. 0 or -1 (err set). */
static int opt_int(const cJSON *o, const char *key, double max, long long *out, char *err,
                   size_t errlen, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble || v->valuedouble < 0 ||
        v->valuedouble > max) {
        snprintf(err, errlen, "field '%s%s': must be an integer from 0 to %.0f", path, key, max);
        return -1;
    }
    *out = (long long)v->valuedouble;
    return 0;
}

/* Members other than these are refused, naming the first one. */
static int only_keys(const cJSON *o, const char *const *keys, const char *path, char *err,
                     size_t errlen)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, o) {
        int known = 0;
        for (size_t i = 0; keys[i]; i++) known |= strcmp(keys[i], m->string) == 0;
        if (!known) {
            snprintf(err, errlen, "unknown field '%s%.64s'", path, m->string);
            return -1;
        }
    }
    return 0;
}

static int route_from_json(const cJSON *r, size_t i, const mg_config_t *cfg, mg_route_conf_t *out,
                           char *err, size_t errlen)
{
    static const char *const keys[] = {"provider", "model",          "smaller",
                                       "priority", "context_window", NULL};
    char path[48];
    long long prio, window;
    snprintf(path, sizeof(path), "routes[%zu].", i);
    if (!cJSON_IsObject(r)) {
        snprintf(err, errlen, "field 'routes[%zu]': must be an object", i);
        return -1;
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "provider");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "model");
    const cJSON *sm = cJSON_GetObjectItemCaseSensitive(r, "smaller");
    if (only_keys(r, keys, path, err, errlen) != 0) return -1;
    if (!cJSON_IsString(p) || !mg_config_provider(cfg, p->valuestring)) {
        snprintf(err, errlen, "field '%sprovider': must name a provider this gateway has", path);
        return -1;
    }
    if (!cJSON_IsString(m) || !*m->valuestring || strlen(m->valuestring) > 256 ||
        strpbrk(m->valuestring, " \t\r\n")) {
        snprintf(err, errlen, "field '%smodel': must be the upstream's model name", path);
        return -1;
    }
    if (sm && !cJSON_IsBool(sm)) {
        snprintf(err, errlen, "field '%ssmaller': must be true or false", path);
        return -1;
    }
    if (opt_int(r, "priority", 1000, &prio, err, errlen, path) != 0 ||
        opt_int(r, "context_window", 1e8, &window, err, errlen, path) != 0)
        return -1;
    out->context_window = (int)window;
    out->provider = strdup(p->valuestring);
    out->model = strdup(m->valuestring);
    out->smaller = cJSON_IsTrue(sm);
    out->priority = (int)prio;
    if (out->provider && out->model) return 0;
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* tokenizer: an encoding's name or "estimate"; absent, by the first route's upstream family
 * (as models.<name>.tokenizer in the file, conf/catalog.c). */
static int tokenizer_from_json(const cJSON *def, mg_model_conf_t *out, char *err, size_t errlen)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(def, "tokenizer");
    int id = -1;
    if (!t || cJSON_IsNull(t)) {
        id = mg_encoding_for_model(out->routes[0].model);
    } else if (!cJSON_IsString(t) || ((id = mg_encoding_lookup(t->valuestring)) < 0 &&
                                      strcmp(t->valuestring, "estimate") != 0)) {
        snprintf(err, errlen,
                 "field 'tokenizer': must be one of o200k_base, cl100k_base, estimate");
        return -1;
    }
    out->tokenizer = id + 1;
    return 0;
}

int mg_model_from_json(const cJSON *def, const char *name, const mg_config_t *cfg,
                       mg_model_conf_t *out, char *err, size_t errlen)
{
    static const char *const keys[] = {"name",
                                       "routes",
                                       "max_concurrency",
                                       "weight_bytes",
                                       "kv_cache_per_token_bytes",
                                       "context_window",
                                       "max_output_tokens",
                                       "tokenizer",
                                       NULL};
    long long conc, window, reserve;
    memset(out, 0, sizeof(*out));
    out->stored = true;
    const cJSON *routes = cJSON_GetObjectItemCaseSensitive(def, "routes");
    if (!cJSON_IsObject(def) || only_keys(def, keys, "", err, errlen) != 0) goto fail;
    if (!cJSON_IsArray(routes) || cJSON_GetArraySize(routes) < 1 ||
        cJSON_GetArraySize(routes) > MG_MODEL_MAX_ROUTES) {
        snprintf(err, errlen, "field 'routes': must be a list of 1 to %d routes",
                 MG_MODEL_MAX_ROUTES);
        goto fail;
    }
    if (opt_int(def, "max_concurrency", 1e6, &conc, err, errlen, "") != 0 ||
        opt_int(def, "weight_bytes", 1125899906842624.0, &out->weight_bytes, err, errlen, "") !=
            0 ||
        opt_int(def, "kv_cache_per_token_bytes", 4294967296.0, &out->kv_cache_per_token_bytes, err,
                errlen, "") != 0 ||
        opt_int(def, "context_window", 1e8, &window, err, errlen, "") != 0 ||
        opt_int(def, "max_output_tokens", 1e8, &reserve, err, errlen, "") != 0)
        goto fail;
    out->max_concurrency = (int)conc;
    out->context_window = (int)window;
    out->max_output_tokens = (int)reserve;
    size_t n = (size_t)cJSON_GetArraySize(routes);
    out->name = strdup(name);
    out->routes = calloc(n, sizeof(*out->routes));
    if (!out->name || !out->routes) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        out->n_routes = i + 1;
        if (route_from_json(cJSON_GetArrayItem(routes, (int)i), i, cfg, &out->routes[i], err,
                            errlen) != 0)
            goto fail;
    }
    if (tokenizer_from_json(def, out, err, errlen) != 0) goto fail;
    return 0;
fail:
    mg_model_conf_clear(out);
    return -1;
}

cJSON *mg_model_to_json(const mg_model_conf_t *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "object", "model");
    cJSON_AddStringToObject(o, "source", m->stored ? "db" : "file");
    cJSON_AddNumberToObject(o, "max_concurrency", m->max_concurrency);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)m->weight_bytes);
    cJSON_AddNumberToObject(o, "kv_cache_per_token_bytes", (double)m->kv_cache_per_token_bytes);
    cJSON_AddNumberToObject(o, "context_window", m->context_window);
    cJSON_AddNumberToObject(o, "max_output_tokens", m->max_output_tokens);
    const char *enc = m->tokenizer > 0 ? mg_encoding_name(m->tokenizer - 1) : NULL;
    cJSON_AddStringToObject(o, "tokenizer", enc ? enc : "estimate");
    cJSON *routes = cJSON_AddArrayToObject(o, "routes");
    for (size_t i = 0; i < m->n_routes; i++) {
        const mg_route_conf_t *r = &m->routes[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "provider", r->provider);
        cJSON_AddStringToObject(x, "model", r->model);
        cJSON_AddBoolToObject(x, "smaller", r->smaller);
        cJSON_AddNumberToObject(x, "priority", r->priority);
        if (r->context_window) cJSON_AddNumberToObject(x, "context_window", r->context_window);
        cJSON_AddItemToArray(routes, x);
    }
    return o;
}

/* Drop the routes whose provider the config no longer has (deleted since). */
static void drop_missing_routes(cJSON *def, const mg_config_t *cfg, const char *name)
{
    cJSON *routes = cJSON_GetObjectItemCaseSensitive(def, "routes");
    for (int i = cJSON_GetArraySize(routes) - 1; i >= 0; i--) {
        const cJSON *p =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(routes, i), "provider");
        if (cJSON_IsString(p) && mg_config_provider(cfg, p->valuestring)) continue;
        mg_log_msg(MG_LOG_WARN, NULL, "stored model %s: route %d left out (its provider is gone)",
                   name, i);
        cJSON_DeleteItemFromArray(routes, i);
    }
}

/* The generic part of loading stored definitions (models, applications). */
typedef struct load_s {
    mg_config_t *cfg;
    mg_def_add_fn add;
    const char *what;
    int oom;
} load_t;

static void load_row(void *ud, int ncols, const char *const *c)
{
    load_t *l = ud;
    char err[256] = "its definition is not JSON";
    if (ncols < 2 || !c[0] || !c[1]) return;
    cJSON *def = cJSON_Parse(c[1]);
    int rc = def ? l->add(l->cfg, c[0], def, err, sizeof(err)) : -1;
    if (rc != 0) mg_log_msg(MG_LOG_WARN, NULL, "stored %s %s not used: %s", l->what, c[0], err);
    l->oom |= rc == -2;
    cJSON_Delete(def);
}

int mg_defs_load(mg_store_t *st, const char *table, const char *what, mg_config_t *cfg,
                 mg_def_add_fn add, char *err, size_t errlen)
{
    char sql[128];
    load_t l = {cfg, add, what, 0};
    snprintf(sql, sizeof(sql), "SELECT name, definition FROM %s ORDER BY created_at, name", table);
    if (mg_store_query(st, sql, 0, NULL, load_row, &l, err, errlen) != 0) return -1;
    if (!l.oom) return 0;
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* One stored model into cfg: 0, -1 (not usable: err), -2 (out of memory). */
static int add_model(mg_config_t *cfg, const char *name, cJSON *def, char *err, size_t errlen)
{
    mg_model_conf_t m;
    drop_missing_routes(def, cfg, name);
    if (mg_model_from_json(def, name, cfg, &m, err, errlen) != 0) return -1;
    if (mg_config_add_model(cfg, &m, err, errlen) == 0) return 0;
    mg_model_conf_clear(&m);
    return strcmp(err, "out of memory") == 0 ? -2 : -1;
}

int mg_models_load(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen)
{
    return mg_defs_load(st, "models", "model", cfg, add_model, err, errlen);
}
