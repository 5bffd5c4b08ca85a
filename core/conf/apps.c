/* apps: stored applications; see apps.h. */
#include "conf/apps.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "conf/models.h"

int mg_app_name_ok(const char *name)
{
    return mg_model_name_ok(name); /* the same alphabet and length */
}

static int bad(char *err, size_t errlen, const char *field, const char *what)
{
    snprintf(err, errlen, "field '%s': %s", field, what);
    return -1;
}

static int opt_cap(const cJSON *def, const char *key, int *out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(def, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble || v->valuedouble < 0 ||
        v->valuedouble > 1e6)
        return bad(err, errlen, key, "must be an integer from 0 to 1000000");
    *out = (int)v->valuedouble;
    return 0;
}

static int priorities(const cJSON *v, unsigned *out, char *err, size_t errlen)
{
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *it;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0)
        return bad(err, errlen, "allowed_priorities", "must be a non-empty list of P0..P4");
    *out = 0;
    cJSON_ArrayForEach(it, v) {
        const char *t = cJSON_IsString(it) ? it->valuestring : "";
        if (strlen(t) != 2 || t[0] != 'P' || t[1] < '0' || t[1] > '4')
            return bad(err, errlen, "allowed_priorities", "must be a non-empty list of P0..P4");
        *out |= 1u << (t[1] - '0');
    }
    return 0;
}

static int models(const cJSON *v, mg_app_conf_t *a, char *err, size_t errlen)
{
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) > 1024)
        return bad(err, errlen, "allowed_models", "must be a list of model names");
    size_t n = (size_t)cJSON_GetArraySize(v);
    a->allowed_models = calloc(n ? n : 1, sizeof(*a->allowed_models));
    if (!a->allowed_models) return bad(err, errlen, "allowed_models", "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsString(it) || !*it->valuestring || strlen(it->valuestring) > 256)
            return bad(err, errlen, "allowed_models", "must be a list of model names");
        if (!(a->allowed_models[a->n_allowed_models] = strdup(it->valuestring)))
            return bad(err, errlen, "allowed_models", "out of memory");
        a->n_allowed_models++;
    }
    return 0;
}

static int data_policy(const cJSON *v, mg_app_conf_t *a, char *err, size_t errlen)
{
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *m, *ac = cJSON_GetObjectItemCaseSensitive(v, "allow_cloud");
    if (!cJSON_IsObject(v)) return bad(err, errlen, "data_policy", "must be an object");
    cJSON_ArrayForEach(m, v) {
        if (strcmp(m->string, "allow_cloud") && strcmp(m->string, "sensitive_level"))
            return bad(err, errlen, "data_policy", "knows allow_cloud and sensitive_level only");
    }
    if (ac && !cJSON_IsBool(ac))
        return bad(err, errlen, "data_policy.allow_cloud", "must be true or false");
    a->has_data_policy = true;
    a->allow_cloud = cJSON_IsTrue(ac);
    return 0;
}

/* An optional text: a string (empty: none) or null. */
static int opt_text(const cJSON *def, const char *key, char **out, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(def, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return bad(err, errlen, key, "must be a string");
    if (!*v->valuestring) return 0;
    if (!(*out = strdup(v->valuestring))) return bad(err, errlen, key, "out of memory");
    return 0;
}

int mg_app_from_json(const cJSON *def, const char *name, mg_app_conf_t *out, char *err,
                     size_t errlen)
{
    static const char *const keys[] = {"name",
                                       "max_running_tasks",
                                       "max_queued_tasks",
                                       "allowed_priorities",
                                       "allowed_models",
                                       "data_policy",
                                       "identity_notes",
                                       "output_constraints",
                                       NULL};
    memset(out, 0, sizeof(*out));
    out->stored = true;
    out->allowed_priorities = 0x1f;
    const cJSON *m;
    if (!cJSON_IsObject(def)) {
        snprintf(err, errlen, "the definition must be a JSON object");
        return -1;
    }
    cJSON_ArrayForEach(m, def) {
        int known = 0;
        for (size_t i = 0; keys[i]; i++) known |= strcmp(keys[i], m->string) == 0;
        if (!known) {
            snprintf(err, errlen, "unknown field '%.64s'", m->string);
            goto fail;
        }
    }
    if (!(out->name = strdup(name))) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (opt_cap(def, "max_running_tasks", &out->max_running_tasks, err, errlen) != 0 ||
        opt_cap(def, "max_queued_tasks", &out->max_queued_tasks, err, errlen) != 0 ||
        priorities(cJSON_GetObjectItemCaseSensitive(def, "allowed_priorities"),
                   &out->allowed_priorities, err, errlen) != 0 ||
        models(cJSON_GetObjectItemCaseSensitive(def, "allowed_models"), out, err, errlen) != 0 ||
        data_policy(cJSON_GetObjectItemCaseSensitive(def, "data_policy"), out, err, errlen) != 0 ||
        opt_text(def, "identity_notes", &out->identity_notes, err, errlen) != 0 ||
        opt_text(def, "output_constraints", &out->output_constraints, err, errlen) != 0)
        goto fail;
    return 0;
fail:
    mg_app_conf_clear(out);
    return -1;
}

cJSON *mg_app_to_json(const mg_app_conf_t *a)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", a->name);
    cJSON_AddStringToObject(o, "object", "application");
    cJSON_AddStringToObject(o, "source", a->stored ? "db" : "file");
    cJSON_AddNumberToObject(o, "max_running_tasks", a->max_running_tasks);
    cJSON_AddNumberToObject(o, "max_queued_tasks", a->max_queued_tasks);
    cJSON *pr = cJSON_AddArrayToObject(o, "allowed_priorities");
    for (int p = 0; p < 5; p++) {
        char t[3] = {'P', (char)('0' + p), 0};
        if (a->allowed_priorities & (1u << p)) cJSON_AddItemToArray(pr, cJSON_CreateString(t));
    }
    if (a->allowed_models) {
        cJSON *ms = cJSON_AddArrayToObject(o, "allowed_models");
        for (size_t i = 0; i < a->n_allowed_models; i++)
            cJSON_AddItemToArray(ms, cJSON_CreateString(a->allowed_models[i]));
    } else {
        cJSON_AddNullToObject(o, "allowed_models"); /* every model */
    }
    if (a->has_data_policy) {
        cJSON *dp = cJSON_AddObjectToObject(o, "data_policy");
        cJSON_AddBoolToObject(dp, "allow_cloud", a->allow_cloud);
    } else {
        cJSON_AddNullToObject(o, "data_policy");
    }
    if (a->identity_notes) cJSON_AddStringToObject(o, "identity_notes", a->identity_notes);
    else cJSON_AddNullToObject(o, "identity_notes");
    if (a->output_constraints)
        cJSON_AddStringToObject(o, "output_constraints", a->output_constraints);
    else cJSON_AddNullToObject(o, "output_constraints");
    return o;
}

/* One stored application into cfg: 0, -1 (not usable: err), -2 (out of memory). */
static int add_app(mg_config_t *cfg, const char *name, cJSON *def, char *err, size_t errlen)
{
    mg_app_conf_t a;
    if (mg_app_from_json(def, name, &a, err, errlen) != 0) return -1;
    if (mg_config_add_app(cfg, &a, err, errlen) == 0) return 0;
    mg_app_conf_clear(&a);
    return strcmp(err, "out of memory") == 0 ? -2 : -1;
}

int mg_apps_load(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen)
{
    return mg_defs_load(st, "applications", "application", cfg, add_app, err, errlen);
}
