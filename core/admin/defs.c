/* defs: the admin resources stored as JSON definitions in the config file's shape —
 * logical models (/api/v2/models, the PRD's /admin/models; models.h) and applications
 * (/api/v2/applications, the PRD's /admin/applications; apps.h) — on the admin worker thread
 * (see admin.c, req.h).
 *
 *   GET    /api/v2/{kind}              every one the gateway uses (file and stored)
 *   GET    /api/v2/{kind}/{name}
 *   POST   /api/v2/{kind} {name, ...definition}
 *   PUT    /api/v2/{kind}/{name} {...}    members given replace the stored ones
 *   DELETE /api/v2/{kind}/{name}
 *
 * A change is in force at once: it rebuilds the generation before the answer. Those from
 * the config file are read-only here (409). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/req.h"
#include "conf/apps.h"
#include "conf/models.h"
#include "conf/settings.h"

/* What differs between the kinds. */
typedef struct def_kind_s {
    const char *table; /* also the collection name */
    const char *what;  /* "model" */
    /* validate def as name against cfg; on success *out is the JSON as it will serve */
    int (*build)(const mg_config_t *cfg, const cJSON *def, const char *name, cJSON **out, char *err,
                 size_t errlen);
    /* the JSON of name in cfg, or NULL; *stored = whether it came from the store */
    cJSON *(*find)(const mg_config_t *cfg, const char *name, int *stored);
    cJSON *(*at)(const mg_config_t *cfg, size_t i); /* the i-th, NULL past the end */
} def_kind_t;

static int model_build(const mg_config_t *cfg, const cJSON *def, const char *name, cJSON **out,
                       char *err, size_t errlen)
{
    mg_model_conf_t m;
    if (mg_model_from_json(def, name, cfg, &m, err, errlen) != 0) return -1;
    *out = mg_model_to_json(&m);
    mg_model_conf_clear(&m);
    return 0;
}

static cJSON *model_find(const mg_config_t *cfg, const char *name, int *stored)
{
    const mg_model_conf_t *m = mg_config_model(cfg, name);
    *stored = m && m->stored;
    return m ? mg_model_to_json(m) : NULL;
}

static cJSON *model_at(const mg_config_t *cfg, size_t i)
{
    return i < cfg->n_models ? mg_model_to_json(&cfg->models[i]) : NULL;
}

static int app_build(const mg_config_t *cfg, const cJSON *def, const char *name, cJSON **out,
                     char *err, size_t errlen)
{
    mg_app_conf_t a;
    (void)cfg;
    if (mg_app_from_json(def, name, &a, err, errlen) != 0) return -1;
    *out = mg_app_to_json(&a);
    mg_app_conf_clear(&a);
    return 0;
}

static cJSON *app_find(const mg_config_t *cfg, const char *name, int *stored)
{
    const mg_app_conf_t *a = mg_config_app(cfg, name);
    *stored = a && a->stored;
    return a ? mg_app_to_json(a) : NULL;
}

static cJSON *app_at(const mg_config_t *cfg, size_t i)
{
    return i < cfg->n_apps ? mg_app_to_json(&cfg->apps[i]) : NULL;
}

static const def_kind_t kinds[] = {
    {"models", "model", model_build, model_find, model_at},
    {"applications", "application", app_build, app_find, app_at},
};

static void list_all(admin_t *a, const def_kind_t *k)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *o;
    for (size_t i = 0; (o = k->at(a->gen->cfg, i)); i++) cJSON_AddItemToArray(data, o);
    cJSON_AddNumberToObject(root, "total", cJSON_GetArraySize(data));
    adm_set_answer(a, 200, root);
}

static void def_row(void *ud, int ncols, const char *const *c)
{
    cJSON **out = ud;
    if (ncols >= 1 && c[0] && !*out) *out = cJSON_Parse(c[0]);
}

/* The stored definition of name (owned) in *def, NULL when there is none. 0 or -1. */
static int stored_def(admin_t *a, const def_kind_t *k, const char *name, cJSON **def)
{
    char err[256], sql[96];
    const char *p[1] = {name};
    *def = NULL;
    snprintf(sql, sizeof(sql), "SELECT definition FROM %s WHERE name = ?1", k->table);
    if (mg_store_query(a->store, sql, 1, p, def_row, def, err, sizeof(err)) == 0) return 0;
    adm_storage_error(a, err);
    return -1;
}

/* Validate, write (INSERT or UPDATE) and answer with what will serve. */
static void store_def(admin_t *a, const def_kind_t *k, const char *name, cJSON *def, int create)
{
    char err[256], sql[160];
    cJSON *answer = NULL;
    mg_store_tx_t *tx = NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(def, "name");
    if (k->build(a->gen->cfg, def, name, &answer, err, sizeof(err)) != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "%s", err);
        return;
    }
    char *text = cJSON_PrintUnformatted(def);
    const char *p[2] = {name, text};
    if (create)
        snprintf(sql, sizeof(sql), "INSERT INTO %s(name, definition) VALUES (?1, ?2)", k->table);
    else
        snprintf(sql, sizeof(sql),
                 "UPDATE %s SET definition = ?2, updated_at = datetime('now') WHERE name = ?1",
                 k->table);
    if (text && adm_tx_begin(a, &tx) == 0 && adm_tx_write(a, tx, sql, 2, p, "name") >= 0) {
        mg_store_tx_t *t = tx;
        tx = NULL;
        if (adm_tx_commit(a, t) == 0) {
            adm_set_answer(a, create ? 201 : 200, answer);
            answer = NULL;
            a->rebuild = 1;
        }
    } else if (!text) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    }
    mg_store_tx_rollback(tx);
    cJSON_Delete(answer);
    free(text);
}

static void def_create(admin_t *a, const def_kind_t *k)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(a->in, "name");
    int stored;
    if (!cJSON_IsString(name) || !mg_model_name_ok(name->valuestring)) {
        adm_set_error(a, 400, "INVALID_REQUEST",
                      "field 'name': 1 to 128 letters, digits or . _ - : @");
        return;
    }
    snprintf(a->target, sizeof(a->target), "%s:%.140s", k->what, name->valuestring);
    cJSON *existing = k->find(a->gen->cfg, name->valuestring, &stored);
    if (existing) {
        cJSON_Delete(existing);
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': a %s with this name exists",
                      k->what);
        return;
    }
    char *n = strdup(name->valuestring);
    if (n) store_def(a, k, n, a->in, 1);
    free(n);
}

/* The stored definition of name: 404 when unknown, 409 when it comes from the file. */
static int stored_only(admin_t *a, const def_kind_t *k, const char *name, cJSON **def)
{
    int stored;
    cJSON *live = k->find(a->gen->cfg, name, &stored);
    cJSON_Delete(live);
    if (live && !stored) {
        adm_set_error(a, 409, "CONFLICT", "%s %s comes from the config file and is read-only here",
                      k->what, name);
        return -1;
    }
    if (stored_def(a, k, name, def) != 0) return -1;
    if (*def) return 0;
    adm_set_error(a, 404, "NOT_FOUND", "%s %s does not exist", k->what, name);
    return -1;
}

int adm_app_stored_def(admin_t *a, const char *name, cJSON **def)
{
    return stored_only(a, &kinds[1], name, def);
}

int adm_app_write_tx(admin_t *a, mg_store_tx_t *tx, const char *name, const cJSON *def)
{
    char err[256];
    cJSON *view = NULL;
    if (app_build(a->gen->cfg, def, name, &view, err, sizeof(err)) != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "applications.%s: %s", name, err);
        return -1;
    }
    cJSON_Delete(view);
    char *text = cJSON_PrintUnformatted(def);
    const char *p[2] = {name, text};
    int rc = text ? adm_tx_write(a, tx,
                                 "UPDATE applications SET definition = ?2,"
                                 " updated_at = datetime('now') WHERE name = ?1",
                                 2, p, "name")
                  : -1;
    if (!text) adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
    free(text);
    return rc < 0 ? -1 : 0;
}

static void def_update(admin_t *a, const def_kind_t *k, const char *name)
{
    cJSON *def = NULL;
    const cJSON *m;
    if (stored_only(a, k, name, &def) != 0) return;
    cJSON_ArrayForEach(m, a->in) {
        if (strcmp(m->string, "name") == 0) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': cannot be changed");
            break;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(def, m->string);
        cJSON_AddItemToObject(def, m->string, cJSON_Duplicate(m, 1));
    }
    if (!a->code) store_def(a, k, name, def, 0);
    cJSON_Delete(def);
}

static void def_delete(admin_t *a, const def_kind_t *k, const char *name)
{
    cJSON *def = NULL;
    mg_store_tx_t *tx = NULL;
    char sql[96];
    if (adm_no_body(a) != 0 || stored_only(a, k, name, &def) != 0) return;
    cJSON_Delete(def);
    const char *p[1] = {name};
    snprintf(sql, sizeof(sql), "DELETE FROM %s WHERE name = ?1", k->table);
    if (adm_tx_begin(a, &tx) != 0) return;
    if (adm_tx_write(a, tx, sql, 1, p, "name") < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    if (adm_tx_commit(a, tx) != 0) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "object", k->what);
    cJSON_AddBoolToObject(o, "deleted", 1);
    adm_set_answer(a, 200, o);
    a->rebuild = 1;
}

/* Static action names, per kind and operation. */
static const char *action_of(const def_kind_t *k, int op)
{
    static const char *const names[2][6] = {{"model.list", "model.get", "model.create",
                                             "model.update", "model.delete", "model.invalid"},
                                            {"application.list", "application.get",
                                             "application.create", "application.update",
                                             "application.delete", "application.invalid"}};
    return names[k == &kinds[0] ? 0 : 1][op];
}

int adm_defs_route(admin_t *a, const char *coll, const char *name, const char *verb)
{
    const def_kind_t *k = NULL;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strcmp(coll, kinds[i].table) == 0) k = &kinds[i];
    if (!k) return 0;
    int get = a->method == HTTP_GET, post = a->method == HTTP_POST, put = a->method == HTTP_PUT,
        del = a->method == HTTP_DELETE, stored;
    if (name) snprintf(a->target, sizeof(a->target), "%s:%.140s", k->what, name);
    if (verb) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    } else if (get && !name) {
        a->action = action_of(k, 0);
        list_all(a, k);
    } else if (get) {
        a->action = action_of(k, 1);
        cJSON *o = k->find(a->gen->cfg, name, &stored);
        if (o) adm_set_answer(a, 200, o);
        else adm_set_error(a, 404, "NOT_FOUND", "%s %s does not exist", k->what, name);
    } else if (post && !name) {
        a->action = action_of(k, 2);
        def_create(a, k);
    } else if (put && name) {
        a->action = action_of(k, 3);
        def_update(a, k, name);
    } else if (del && name) {
        a->action = action_of(k, 4);
        def_delete(a, k, name);
    } else {
        a->action = action_of(k, 5);
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
    }
    return 1;
}

/* One setting override written in tx (null removes it), validated first: 400 when invalid. */
int adm_setting_write_tx(admin_t *a, mg_store_tx_t *tx, const char *key, const cJSON *v)
{
    char text[64], err[256];
    const char *p[2] = {key, text};
    if (cJSON_IsNull(v))
        return adm_tx_write(a, tx, "DELETE FROM system_config WHERE key = ?1", 1, p, key) < 0 ? -1
                                                                                              : 0;
    if (mg_settings_check(key, v, text, sizeof(text), err, sizeof(err)) != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field %s", err);
        return -1;
    }
    return adm_tx_write(a, tx,
                        "INSERT INTO system_config(key, value) VALUES (?1, ?2)"
                        " ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
                        " updated_at = datetime('now')",
                        2, p, key) < 0
               ? -1
               : 0;
}
