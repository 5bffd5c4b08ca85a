/* views: the PRD's /admin/quotas and /admin/policies (3.2.3) as views over the same
 * state the rest of the admin API changes, on the admin worker thread.
 *
 *   GET /api/v2/quotas    {users: {default_max_running_tasks, default_max_queued_tasks,
 *                                   default_requests_per_minute},
 *                          applications: {name: {max_running_tasks, max_queued_tasks, source}}}
 *   GET /api/v2/policies  {routing: {local_first, allow_smaller_model},
 *                          applications: {name: {allowed_priorities, allowed_models,
 *                                                data_policy, source}}}
 *   PUT either with any part of the same shape: the users / routing members are runtime
 *   settings (settings.h; null = back to the file's value), the application members change
 *   stored applications (apps.h; those of the config file answer 409). Everything is
 *   validated first and written in one transaction, then the generation is rebuilt and the
 *   answer is the view as it now holds. Customer keys and projects keep their own limits
 *   under /api/v2/keys and /api/v2/projects. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/req.h"
#include "conf/apps.h"

typedef struct view_s {
    const char *coll;            /* "quotas" */
    const char *section;         /* the settings section: "users" */
    const char *const *settings; /* its members (each a setting "<section>.<member>") */
    const char *const *app_keys; /* the application members this view shows and changes */
} view_t;

static const char *const quota_settings[] = {
    "default_max_running_tasks", "default_max_queued_tasks", "default_requests_per_minute", NULL};
static const char *const quota_app_keys[] = {"max_running_tasks", "max_queued_tasks", NULL};
static const char *const policy_settings[] = {"local_first", "allow_smaller_model", NULL};
static const char *const policy_app_keys[] = {"allowed_priorities", "allowed_models", "data_policy",
                                              NULL};

static const view_t views[] = {
    {"quotas", "users", quota_settings, quota_app_keys},
    {"policies", "routing", policy_settings, policy_app_keys},
};

static int listed(const char *const *keys, const char *k)
{
    for (size_t i = 0; keys[i]; i++)
        if (strcmp(keys[i], k) == 0) return 1;
    return 0;
}

/* The view of cfg. */
static cJSON *view_json(const view_t *v, const mg_config_t *cfg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *sec = cJSON_AddObjectToObject(root, v->section);
    cJSON *all = mg_settings_json(cfg, NULL);
    cJSON *settings = cJSON_GetObjectItemCaseSensitive(all, "settings");
    for (size_t i = 0; v->settings[i]; i++) {
        char key[96];
        snprintf(key, sizeof(key), "%s.%s", v->section, v->settings[i]);
        cJSON_AddItemToObject(sec, v->settings[i],
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(settings, key), 1));
    }
    cJSON_Delete(all);
    cJSON *apps = cJSON_AddObjectToObject(root, "applications");
    for (size_t i = 0; i < cfg->n_apps; i++) {
        cJSON *full = mg_app_to_json(&cfg->apps[i]), *one = cJSON_CreateObject();
        for (size_t k = 0; v->app_keys[k]; k++)
            cJSON_AddItemToObject(one, v->app_keys[k],
                                  cJSON_DetachItemFromObject(full, v->app_keys[k]));
        cJSON_AddItemToObject(one, "source", cJSON_DetachItemFromObject(full, "source"));
        cJSON_AddItemToObject(apps, cfg->apps[i].name, one);
        cJSON_Delete(full);
    }
    return root;
}

static cJSON *quotas_after(const mg_config_t *cfg, cJSON *prev)
{
    (void)prev;
    return view_json(&views[0], cfg);
}

static cJSON *policies_after(const mg_config_t *cfg, cJSON *prev)
{
    (void)prev;
    return view_json(&views[1], cfg);
}

/* Check the body's shape: only the section and applications, known members. */
static int body_ok(admin_t *a, const view_t *v)
{
    const cJSON *part, *m;
    cJSON_ArrayForEach(part, a->in) {
        int settings = strcmp(part->string, v->section) == 0;
        if (!settings && strcmp(part->string, "applications") != 0) {
            adm_set_error(a, 400, "INVALID_REQUEST", "unknown field '%.64s'", part->string);
            return -1;
        }
        if (!cJSON_IsObject(part)) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s': must be an object", part->string);
            return -1;
        }
        cJSON_ArrayForEach(m, part) {
            if (settings ? listed(v->settings, m->string) : cJSON_IsObject(m)) continue;
            adm_set_error(a, 400, "INVALID_REQUEST", "field '%s.%.64s': %s", part->string,
                          m->string, settings ? "unknown" : "must be an object");
            return -1;
        }
    }
    return 0;
}

/* One application's members, merged into its stored definition and written in tx. */
static int put_app(admin_t *a, const view_t *v, mg_store_tx_t *tx, const cJSON *patch)
{
    cJSON *def = NULL;
    const cJSON *m;
    cJSON_ArrayForEach(m, patch) {
        if (listed(v->app_keys, m->string)) continue;
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'applications.%s.%.64s': unknown",
                      patch->string, m->string);
        return -1;
    }
    if (adm_app_stored_def(a, patch->string, &def) != 0) return -1;
    cJSON_ArrayForEach(m, patch) {
        cJSON_DeleteItemFromObjectCaseSensitive(def, m->string);
        if (!cJSON_IsNull(m)) cJSON_AddItemToObject(def, m->string, cJSON_Duplicate(m, 1));
    }
    int rc = adm_app_write_tx(a, tx, patch->string, def);
    cJSON_Delete(def);
    return rc;
}

static void view_put(admin_t *a, const view_t *v)
{
    mg_store_tx_t *tx = NULL;
    const cJSON *settings = cJSON_GetObjectItemCaseSensitive(a->in, v->section);
    const cJSON *apps = cJSON_GetObjectItemCaseSensitive(a->in, "applications");
    const cJSON *m;
    if (body_ok(a, v) != 0 || adm_tx_begin(a, &tx) != 0) return;
    cJSON_ArrayForEach(m, settings) {
        char key[96];
        snprintf(key, sizeof(key), "%s.%s", v->section, m->string);
        if (adm_setting_write_tx(a, tx, key, m) != 0) goto fail;
    }
    cJSON_ArrayForEach(m, apps) {
        if (put_app(a, v, tx, m) != 0) goto fail;
    }
    if (adm_tx_commit(a, tx) != 0) return;
    adm_set_answer(a, 200, view_json(v, a->gen->cfg)); /* replaced once rebuilt */
    a->rebuild = 1;
    a->answer_from = v == &views[0] ? quotas_after : policies_after;
    return;
fail:
    mg_store_tx_rollback(tx);
}

int adm_views_route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    const view_t *v = NULL;
    for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++)
        if (strcmp(coll, views[i].coll) == 0) v = &views[i];
    if (!v) return 0;
    int quotas = v == &views[0];
    if (id || verb) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    } else if (a->method == HTTP_GET) {
        a->action = quotas ? "quotas.read" : "policies.read";
        adm_set_answer(a, 200, view_json(v, a->gen->cfg));
    } else if (a->method == HTTP_PUT) {
        a->action = quotas ? "quotas.update" : "policies.update";
        view_put(a, v);
    } else {
        a->action = quotas ? "quotas.invalid" : "policies.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "use GET or PUT");
    }
    return 1;
}
