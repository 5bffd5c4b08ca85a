/* prices: the versioned price tables of the admin API (conf/usage.h, obs/price.h).
 *
 *   GET  /api/v2/prices   every version, the file's and the stored ones, each with
 *                         in_force (the one a request to its provider and model pays now)
 *   POST /api/v2/prices   {provider, model?, input_per_1m_micros, output_per_1m_micros,
 *                          cached_input_per_1m_micros?, cache_write_per_1m_micros?,
 *                          effective_at?}  -> 201, the new version ("db-<id>")
 *
 * A version is never rewritten: a POST adds a row, and the generation rebuilt after it
 * serves the new one from its effective_at on, the old ones before. Tenant admins may read
 * the prices, not post them. On the worker thread. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "admin/req.h"
#include "obs/price.h"

static cJSON *prices_json(const mg_config_t *cfg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; i < cfg->n_prices; i++) {
        const mg_price_t *p = &cfg->prices[i];
        cJSON *e = mg_price_to_json(p);
        const char *model = strcmp(p->model, "*") ? p->model : NULL;
        const mg_price_t *cur = mg_price_find(cfg, p->provider, model, now);
        cJSON_AddBoolToObject(e, "in_force", cur == p);
        cJSON_AddStringToObject(e, "source", strncmp(p->version, "db-", 3) ? "file" : "db");
        cJSON_AddItemToArray(data, e);
    }
    cJSON_AddNumberToObject(o, "total", (double)cfg->n_prices);
    return o;
}

/* After the rebuild: the list as the new generation has it, with the new version. */
static cJSON *answer_from(const mg_config_t *cfg, cJSON *prev)
{
    cJSON *o = cJSON_Duplicate(prev, 1);
    const cJSON *v = cJSON_GetObjectItem(prev, "version");
    for (size_t i = 0; o && cJSON_IsString(v) && i < cfg->n_prices; i++)
        if (strcmp(cfg->prices[i].version, v->valuestring) == 0) {
            cJSON_Delete(o);
            o = mg_price_to_json(&cfg->prices[i]);
        }
    return o;
}

static void price_create(admin_t *a)
{
    mg_price_t p;
    char err[256];
    if (mg_price_from_json(a->in, &p, err, sizeof(err)) != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "%s", err);
        return;
    }
    if (!mg_config_provider(a->gen->cfg, p.provider)) {
        adm_set_error(a, 400, "INVALID_REQUEST", "price.provider: no provider %.64s", p.provider);
        mg_price_clear(&p);
        return;
    }
    char v[5][24], now[24];
    int64_t f[5] = {p.input_micros, p.output_micros, p.cached_input_micros, p.cache_write_micros,
                    p.effective_at};
    for (int i = 0; i < 5; i++) snprintf(v[i], sizeof(v[i]), "%" PRId64, f[i]);
    snprintf(now, sizeof(now), "%" PRId64, adm_now_s());
    const char *params[8] = {p.provider, p.model, v[0], v[1], v[2], v[3], v[4], now};
    mg_store_tx_t *tx = NULL;
    if (adm_tx_begin(a, &tx) != 0) goto out;
    if (adm_tx_write(a, tx,
                     "INSERT INTO prices(provider_id, model, input_micros, output_micros,"
                     " cached_input_micros, cache_write_micros, effective_at, created_at)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                     8, params, "price") < 0) {
        mg_store_tx_rollback(tx);
        goto out;
    }
    snprintf(p.version, sizeof(p.version), "db-%" PRId64, mg_store_tx_last_id(tx));
    if (adm_tx_commit(a, tx) != 0) goto out;
    snprintf(a->target, sizeof(a->target), "price:%s", p.version);
    adm_set_answer(a, 201, mg_price_to_json(&p));
    a->rebuild = 1;
    a->answer_from = answer_from;
out:
    mg_price_clear(&p);
}

int adm_prices_route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    if (strcmp(coll, "prices") != 0) return 0;
    (void)verb;
    if (id) {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    } else if (a->method == HTTP_GET) {
        a->action = "price.list";
        adm_set_answer(a, 200, prices_json(a->gen->cfg));
    } else if (a->method == HTTP_POST) {
        a->action = "price.create";
        price_create(a);
    } else {
        a->action = "price.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "use GET or POST");
    }
    return 1;
}
