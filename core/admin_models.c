/* admin_models: /api/v2/models — logical models and their routes (the PRD's /admin/models),
 * on the admin worker thread (see admin.c, admin_req.h, models.h).
 *
 *   GET    /api/v2/models              every model the gateway serves (file and stored)
 *   GET    /api/v2/models/{name}
 *   POST   /api/v2/models {name, routes: [{provider, model, smaller?, priority?}],
 *                          max_concurrency?, weight_bytes?, kv_cache_per_token_bytes?}
 *   PUT    /api/v2/models/{name} {routes?, max_concurrency?, ...}  (members given replace)
 *   DELETE /api/v2/models/{name}
 *
 * A stored model serves at once: every change rebuilds the generation before the answer.
 * Models from the config file are read-only here (409). Routes must name providers the
 * gateway has (file or stored). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin_req.h"
#include "models.h"

static void models_list(admin_t *a)
{
    const mg_config_t *cfg = a->gen->cfg;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddNumberToObject(root, "total", (double)cfg->n_models);
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (size_t i = 0; i < cfg->n_models; i++)
        cJSON_AddItemToArray(data, mg_model_to_json(&cfg->models[i]));
    adm_set_answer(a, 200, root);
}

/* The stored definition of name (owned JSON) or NULL; *found = whether a row exists. */
static void def_row(void *ud, int ncols, const char *const *c)
{
    cJSON **out = ud;
    if (ncols >= 1 && c[0] && !*out) *out = cJSON_Parse(c[0]);
}

static int stored_def(admin_t *a, const char *name, cJSON **def)
{
    char err[256];
    const char *p[1] = {name};
    *def = NULL;
    if (mg_store_query(a->s->store, "SELECT definition FROM models WHERE name = ?1", 1, p,
                       def_row, def, err, sizeof(err)) == 0)
        return 0;
    adm_storage_error(a, err);
    return -1;
}

/* Validate def as name's definition against the current config: 0, or -1 with 400 set. */
static int def_ok(admin_t *a, const cJSON *def, const char *name)
{
    char err[256];
    mg_model_conf_t m;
    if (mg_model_from_json(def, name, a->gen->cfg, &m, err, sizeof(err)) != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "%s", err);
        return -1;
    }
    mg_model_conf_clear(&m);
    return 0;
}

/* Write name's definition (INSERT or UPDATE) and answer with the model as it will serve. */
static void store_def(admin_t *a, const char *name, cJSON *def, int create)
{
    char err[256];
    mg_store_tx_t *tx = NULL;
    mg_model_conf_t m;
    cJSON_DeleteItemFromObjectCaseSensitive(def, "name");
    char *text = cJSON_PrintUnformatted(def);
    if (!text) {
        adm_set_error(a, 500, "INTERNAL_ERROR", "out of memory");
        return;
    }
    const char *p[2] = {name, text};
    const char *sql = create ? "INSERT INTO models(name, definition) VALUES (?1, ?2)"
                             : "UPDATE models SET definition = ?2, updated_at = datetime('now')"
                               " WHERE name = ?1";
    if (adm_tx_begin(a, &tx) == 0 && adm_tx_write(a, tx, sql, 2, p, "name") >= 0) {
        mg_store_tx_t *t = tx;
        tx = NULL;
        if (adm_tx_commit(a, t) == 0 &&
            mg_model_from_json(def, name, a->gen->cfg, &m, err, sizeof(err)) == 0) {
            adm_set_answer(a, create ? 201 : 200, mg_model_to_json(&m));
            mg_model_conf_clear(&m);
            a->rebuild = 1;
        }
    }
    mg_store_tx_rollback(tx);
    free(text);
}

static void model_create(admin_t *a)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(a->in, "name");
    if (!cJSON_IsString(name) || !mg_model_name_ok(name->valuestring)) {
        adm_set_error(a, 400, "INVALID_REQUEST",
                      "field 'name': 1 to 128 letters, digits or . _ - : @");
        return;
    }
    snprintf(a->target, sizeof(a->target), "model:%.140s", name->valuestring);
    if (mg_config_model(a->gen->cfg, name->valuestring)) {
        adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': a model with this name exists");
        return;
    }
    if (def_ok(a, a->in, name->valuestring) != 0) return;
    char *n = strdup(name->valuestring);
    if (n) store_def(a, n, a->in, 1);
    free(n);
}

/* The stored model name (404 when unknown, 409 when it comes from the file). 0 or -1. */
static int stored_model(admin_t *a, const char *name, cJSON **def)
{
    const mg_model_conf_t *m = mg_config_model(a->gen->cfg, name);
    if (m && !m->stored) {
        adm_set_error(a, 409, "CONFLICT",
                      "model %s comes from the config file and is read-only here", name);
        return -1;
    }
    if (stored_def(a, name, def) != 0) return -1;
    if (*def) return 0;
    adm_set_error(a, 404, "NOT_FOUND", "model %s does not exist", name);
    return -1;
}

static void model_update(admin_t *a, const char *name)
{
    cJSON *def = NULL;
    if (stored_model(a, name, &def) != 0) return;
    const cJSON *m;
    cJSON_ArrayForEach(m, a->in)
    {
        if (strcmp(m->string, "name") == 0) {
            adm_set_error(a, 400, "INVALID_REQUEST", "field 'name': cannot be changed");
            break;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(def, m->string);
        cJSON_AddItemToObject(def, m->string, cJSON_Duplicate(m, 1));
    }
    if (!a->code && def_ok(a, def, name) == 0) store_def(a, name, def, 0);
    cJSON_Delete(def);
}

static void model_delete(admin_t *a, const char *name)
{
    cJSON *def = NULL;
    mg_store_tx_t *tx = NULL;
    if (adm_no_body(a) != 0 || stored_model(a, name, &def) != 0) return;
    cJSON_Delete(def);
    const char *p[1] = {name};
    if (adm_tx_begin(a, &tx) != 0) return;
    if (adm_tx_write(a, tx, "DELETE FROM models WHERE name = ?1", 1, p, "name") < 0) {
        mg_store_tx_rollback(tx);
        return;
    }
    if (adm_tx_commit(a, tx) != 0) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddStringToObject(o, "object", "model");
    cJSON_AddBoolToObject(o, "deleted", 1);
    adm_set_answer(a, 200, o);
    a->rebuild = 1;
}

void adm_models_route(admin_t *a, const char *name, const char *verb)
{
    int get = a->method == HTTP_GET, post = a->method == HTTP_POST, put = a->method == HTTP_PUT,
        del = a->method == HTTP_DELETE;
    if (name) snprintf(a->target, sizeof(a->target), "model:%.140s", name);
    if (verb) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    } else if (get) {
        a->action = name ? "model.get" : "model.list";
        const mg_model_conf_t *m = name ? mg_config_model(a->gen->cfg, name) : NULL;
        if (!name)
            models_list(a);
        else if (m)
            adm_set_answer(a, 200, mg_model_to_json(m));
        else
            adm_set_error(a, 404, "NOT_FOUND", "model %s does not exist", name);
    } else if (post && !name) {
        a->action = "model.create";
        model_create(a);
    } else if (put && name) {
        a->action = "model.update";
        model_update(a, name);
    } else if (del && name) {
        a->action = "model.delete";
        model_delete(a, name);
    } else {
        a->action = "model.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "method not allowed on this admin endpoint");
    }
}
