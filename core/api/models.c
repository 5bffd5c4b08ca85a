/* models: GET /v1/models and /v1/models/{id}; see models.h. */
#include "api/models.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "obs/answer.h"
#include "pipeline/messages_resp.h"
#include "route/upmodels.h"

/* Who asks, and what that lets it see. */
typedef struct viewer_s {
    const mg_key_record_t *rec; /* NULL: open mode */
    const mg_app_conf_t *app;   /* NULL: no application's allowlist applies */
    int anthropic;              /* anthropic-version: Anthropic's shapes */
} viewer_t;

static void models_error(mg_api_t *s, mg_http_req_t *req, const viewer_t *v, int status,
                         const char *code, const char *msg)
{
    if (!v->anthropic) {
        mg_answer_error(s->metrics, req, MG_EP_MODELS, status, code, msg, 0);
        return;
    }
    mg_buf_t body = {0};
    mg_msgs_request_id_header(req);
    mg_msgs_error_body(&body, status, code, msg, req->request_id);
    mg_answer_json(s->metrics, req, MG_EP_MODELS, status, NULL, body.data, body.len);
    mg_buf_free(&body);
}

/* The caller (0), or -1 after answering 401 / 403. */
static int viewer_of(mg_api_t *s, mg_http_req_t *req, const mg_config_t *cfg, viewer_t *v)
{
    memset(v, 0, sizeof(*v));
    v->anthropic = mg_http_header(req, "anthropic-version") != NULL;
    const char *app = cfg->default_application;
    if (cfg->auth_enabled) {
        mg_auth_result_t r;
        if (mg_auth_authenticate(s->auth, req, mg_unix_ms(), &r) != 0) {
            models_error(s, req, v, r.status, r.code, r.message);
            return -1;
        }
        if (!mg_key_has_scopes(r.rec, MG_SCOPE_INFERENCE) &&
            !mg_key_has_scopes(r.rec, MG_SCOPE_MODELS)) {
            models_error(s, req, v, 403, "PERMISSION_DENIED",
                         "this API key has neither the 'inference' nor the 'models' scope");
            return -1;
        }
        v->rec = r.rec; /* borrowed for this loop turn, as admission does */
        if (r.rec->application) app = r.rec->application;
    }
    v->app = app ? mg_config_app(cfg, app) : NULL;
    return 0;
}

/* The rule admission applies (admit.c): the key's allowlist, the application's. */
static int visible(const viewer_t *v, const char *name)
{
    return (!v->rec || mg_key_allows_model(v->rec, name)) &&
           (!v->app || mg_app_allows_model(v->app, name));
}

/* One model as OpenAI's Model object, or as Anthropic's ModelInfo. A stable creation time:
 * when the process started is as honest as any. */
static cJSON *model_json(const mg_api_t *s, const viewer_t *v, const char *id, const char *owner)
{
    cJSON *m = cJSON_CreateObject();
    if (v->anthropic) {
        char created[32];
        time_t t = (time_t)s->proc->started_at;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
        cJSON_AddStringToObject(m, "type", "model");
        cJSON_AddStringToObject(m, "id", id);
        cJSON_AddStringToObject(m, "display_name", id);
        cJSON_AddStringToObject(m, "created_at", created);
        return m;
    }
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->proc->started_at);
    cJSON_AddStringToObject(m, "owned_by", owner);
    return m;
}

void mg_api_models(mg_api_t *s, mg_http_req_t *req)
{
    const mg_config_t *cfg = mg_gens_current(s->gens)->cfg;
    viewer_t v;
    if (viewer_of(s, req, cfg, &v) != 0) return;
    const mg_model_list_t *up = mg_upmodels_list(s->upmodels);
    cJSON *root = cJSON_CreateObject();
    if (!v.anthropic) cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    const char *first = NULL, *last = NULL;
    for (size_t i = 0; i < cfg->n_models + up->n; i++) {
        const char *id = i < cfg->n_models ? cfg->models[i].name : up->items[i - cfg->n_models].id;
        if (!visible(&v, id)) continue;
        const char *owner = i < cfg->n_models ? "moongate" : up->items[i - cfg->n_models].owned_by;
        cJSON_AddItemToArray(data, model_json(s, &v, id, owner));
        if (!first) first = id;
        last = id;
    }
    if (v.anthropic) { /* one page holds them all */
        cJSON_AddFalseToObject(root, "has_more");
        if (first) cJSON_AddStringToObject(root, "first_id", first);
        else cJSON_AddNullToObject(root, "first_id");
        if (last) cJSON_AddStringToObject(root, "last_id", last);
        else cJSON_AddNullToObject(root, "last_id");
    }
    mg_answer_tree(s->metrics, req, MG_EP_MODELS, 200, root);
}

/* %XX decoded in place (a model id may hold a '/', which clients send as %2F); -1 when a
 * %-escape is malformed or decodes to NUL. */
static int percent_decode(char *p)
{
    char *w = p;
    for (const char *r = p; *r; r++) {
        if (*r != '%') {
            *w++ = *r;
            continue;
        }
        int hi = mg_hex_digit(r[1]), lo = hi < 0 ? -1 : mg_hex_digit(r[2]);
        if (lo < 0 || (hi == 0 && lo == 0)) return -1;
        *w++ = (char)(hi * 16 + lo);
        r += 2;
    }
    *w = '\0';
    return 0;
}

void mg_api_model(mg_api_t *s, mg_http_req_t *req, char *id)
{
    const mg_config_t *cfg = mg_gens_current(s->gens)->cfg;
    viewer_t v;
    if (viewer_of(s, req, cfg, &v) != 0) return;
    const char *owner = NULL;
    if (percent_decode(id) == 0 && visible(&v, id)) {
        const mg_listed_model_t *m = NULL;
        if (mg_config_model(cfg, id)) owner = "moongate";
        else if ((m = mg_model_list_find(mg_upmodels_list(s->upmodels), id))) owner = m->owned_by;
    }
    if (!owner) {
        char msg[300];
        snprintf(msg, sizeof(msg), "model '%.200s' does not exist", id);
        models_error(s, req, &v, 404, "MODEL_NOT_FOUND", msg);
        return;
    }
    mg_answer_tree(s->metrics, req, MG_EP_MODELS, 200, model_json(s, &v, id, owner));
}
