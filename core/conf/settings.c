/* settings: runtime settings over the config file; see settings.h. */
#include "conf/settings.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

typedef enum { SET_BOOL, SET_INT, SET_LEVEL } set_type_t;

typedef struct setting_s {
    const char *key;
    set_type_t type;
    long lo, hi;   /* SET_INT range */
    size_t offset; /* of the field in mg_config_t */
} setting_t;

#define AT(field) offsetof(mg_config_t, field)

static const setting_t settings[] = {
    {"log.level", SET_LEVEL, 0, 0, AT(log_level)},
    {"routing.local_first", SET_BOOL, 0, 1, AT(routing.local_first)},
    {"routing.allow_smaller_model", SET_BOOL, 0, 1, AT(routing.allow_smaller_model)},
    {"routing.queue_timeout_ms", SET_INT, 0, 3600000, AT(routing.queue_timeout_ms)},
    {"upstream.max_retries", SET_INT, 1, 10, AT(max_retries)},
    {"timeouts.queue_ms", SET_INT, 1, 3600000, AT(timeouts.queue_ms)},
    {"scheduler.max_running_tasks", SET_INT, 1, 100000, AT(scheduler.max_running_tasks)},
    {"scheduler.max_queued_tasks", SET_INT, 0, 10000000, AT(scheduler.max_queued_tasks)},
    {"scheduler.priority_aging_seconds", SET_INT, 0, 86400, AT(scheduler.priority_aging_seconds)},
    {"scheduler.reserved_realtime_slots", SET_INT, 0, 100000,
     AT(scheduler.reserved_realtime_slots)},
    {"users.default_max_running_tasks", SET_INT, 0, 1000000, AT(user_max_running_tasks)},
    {"users.default_max_queued_tasks", SET_INT, 0, 1000000, AT(user_max_queued_tasks)},
    {"users.default_requests_per_minute", SET_INT, 0, 60000, AT(user_rpm_limit)},
};

#define N_SETTINGS (sizeof(settings) / sizeof(settings[0]))

static const setting_t *find(const char *key)
{
    for (size_t i = 0; key && i < N_SETTINGS; i++)
        if (strcmp(settings[i].key, key) == 0) return &settings[i];
    return NULL;
}

int mg_settings_known(const char *key)
{
    return find(key) != NULL;
}

static int is_level(const char *s)
{
    return !strcmp(s, "debug") || !strcmp(s, "info") || !strcmp(s, "warn") || !strcmp(s, "error");
}

int mg_settings_check(const char *key, const cJSON *v, char *out, size_t cap, char *err,
                      size_t errlen)
{
    const setting_t *s = find(key);
    if (!s) {
        snprintf(err, errlen, "'%.64s' is not a runtime setting", key);
        return -1;
    }
    if (s->type == SET_BOOL) {
        if (!cJSON_IsBool(v)) goto bad;
        snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    } else if (s->type == SET_INT) {
        if (!cJSON_IsNumber(v) || floor(v->valuedouble) != v->valuedouble ||
            v->valuedouble < (double)s->lo || v->valuedouble > (double)s->hi)
            goto bad;
        snprintf(out, cap, "%ld", (long)v->valuedouble);
    } else {
        if (!cJSON_IsString(v) || !is_level(v->valuestring)) goto bad;
        snprintf(out, cap, "\"%s\"", v->valuestring); /* stored as JSON text */
    }
    return 0;
bad:
    if (s->type == SET_BOOL) snprintf(err, errlen, "'%s' must be true or false", key);
    else if (s->type == SET_INT)
        snprintf(err, errlen, "'%s' must be an integer from %ld to %ld", key, s->lo, s->hi);
    else snprintf(err, errlen, "'%s' must be one of debug, info, warn, error", key);
    return -1;
}

/* Set the field from its value (already validated). 0 or -1. */
static int apply(mg_config_t *cfg, const setting_t *s, const cJSON *v)
{
    char *field = (char *)cfg + s->offset;
    if (s->type == SET_BOOL) {
        *(bool *)field = cJSON_IsTrue(v);
    } else if (s->type == SET_INT) {
        *(int *)field = (int)v->valuedouble;
    } else {
        char *copy = strdup(v->valuestring);
        if (!copy) return -1;
        free(*(char **)field);
        *(char **)field = copy;
    }
    return 0;
}

typedef struct overlay_s {
    mg_config_t *cfg;
    int oom;
} overlay_t;

static void overlay_row(void *ud, int ncols, const char *const *c)
{
    overlay_t *o = ud;
    if (ncols < 2 || !c[0] || !c[1]) return;
    const setting_t *s = find(c[0]);
    cJSON *v = s ? cJSON_Parse(c[1]) : NULL;
    char text[64], err[160];
    if (!s || !v || mg_settings_check(c[0], v, text, sizeof(text), err, sizeof(err)) != 0) {
        mg_log_msg(MG_LOG_WARN, NULL,
                   "system_config: '%.64s' ignored (not a valid runtime "
                   "setting)",
                   c[0]);
    } else if (apply(o->cfg, s, v) != 0) {
        o->oom = 1;
    }
    cJSON_Delete(v);
}

int mg_settings_overlay(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen)
{
    overlay_t o = {cfg, 0};
    if (mg_store_query(st, "SELECT key, value FROM system_config ORDER BY key", 0, NULL,
                       overlay_row, &o, err, errlen) != 0)
        return -1;
    if (o.oom) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

cJSON *mg_settings_json(const mg_config_t *cfg, const cJSON *overridden)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *set = cJSON_AddObjectToObject(root, "settings");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting_t *s = &settings[i];
        const char *field = (const char *)cfg + s->offset;
        if (s->type == SET_BOOL) cJSON_AddBoolToObject(set, s->key, *(const bool *)field);
        else if (s->type == SET_INT) cJSON_AddNumberToObject(set, s->key, *(const int *)field);
        else cJSON_AddStringToObject(set, s->key, *(char *const *)field);
    }
    cJSON_AddItemToObject(root, "overridden",
                          overridden ? cJSON_Duplicate(overridden, 1) : cJSON_CreateArray());
    return root;
}
