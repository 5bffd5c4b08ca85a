/* calib: the calibrated byte estimate of a call's prompt, learning and persisting it; see
 * calib.h and token/calib.h. */
#include "pipeline/calib.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "pipeline/call.h"
#include "token/registry.h"

/* The model has no loaded encoding: its prompts are estimated from their bytes. */
static int model_estimated(const call_t *c)
{
    return c->model && !mg_token_registry_get(c->model->tokenizer - 1);
}

/* A reservation's side: never fewer tokens than bytes / 4, more where a route learned that
 * its prompts take more (CJK, code). */
double calib_model_bpt(const call_t *c)
{
    const mg_calib_t *cal = c->pl->calib;
    double bpt = MG_CALIB_DEFAULT_BPT;
    if (!cal || !cal->n || !c->model) return bpt;
    for (size_t i = 0; i < c->model->n_routes; i++) {
        const mg_route_conf_t *r = &c->model->routes[i];
        const mg_calib_route_t *e = mg_calib_find(cal, r->provider, r->model);
        if (e && e->bpt < bpt) bpt = e->bpt;
    }
    return bpt;
}

/* A charge's side: the best estimate, whichever way it errs. */
double calib_route_bpt(const call_t *c)
{
    const mg_calib_route_t *e =
        c->pl->calib && c->provider
            ? mg_calib_find(c->pl->calib, c->provider->id, c->upstream_model)
            : NULL;
    return e ? e->bpt : MG_CALIB_DEFAULT_BPT;
}

int64_t calib_estimate(double bpt, size_t bytes)
{
    return bpt > 0 ? (int64_t)((double)bytes / bpt) : (int64_t)(bytes / 4);
}

static const char *const SAVE_SQL =
    "INSERT INTO token_calibration(provider_id, model, bytes_per_token, samples, updated_ms)"
    " VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT(provider_id, model) DO UPDATE SET"
    " bytes_per_token = excluded.bytes_per_token, samples = excluded.samples,"
    " updated_ms = excluded.updated_ms";

static void save(mg_store_t *st, mg_calib_route_t *e, int64_t now)
{
    mg_store_val_t v[5] = {
        {MG_STORE_TEXT, 0, e->provider, 0}, {MG_STORE_TEXT, 0, e->model, 0},
        {MG_STORE_REAL, 0, NULL, e->bpt},   {MG_STORE_INT, (int64_t)e->samples, NULL, 0},
        {MG_STORE_INT, now, NULL, 0},
    };
    if (mg_store_write_vals(st, SAVE_SQL, 5, v, NULL, NULL, NULL) == 0) e->saved_ms = (uint64_t)now;
}

static void set_gauge(mg_metrics_t *m, const mg_calib_route_t *e)
{
    const char *labels[2] = {e->provider, e->model};
    mg_family_set(mg_metrics_family(m, MG_FAM_TOKEN_BPT), labels, e->bpt);
}

void calib_learn(call_t *c)
{
    mg_calib_t *cal = c->pl->calib;
    if (!cal || !c->have_usage || !c->req || !c->provider || !c->upstream_model ||
        !model_estimated(c) || c->prompt_tokens <= 0)
        return;
    long long tokens = c->prompt_tokens; /* OpenAI: cached_tokens are part of it */
    if (c->cache_apart)
        tokens += (c->cached_tokens > 0 ? c->cached_tokens : 0) +
                  (c->cache_write_tokens > 0 ? c->cache_write_tokens : 0);
    size_t bytes;
    prompt_bytes(c, &bytes);
    double error = 0;
    mg_calib_route_t *e =
        mg_calib_observe(cal, c->provider->id, c->upstream_model, bytes, tokens, &error);
    if (!e) return;
    const char *labels[2] = {e->provider, e->model};
    mg_family_observe(mg_metrics_family(c->pl->metrics, MG_FAM_TOKEN_ESTIMATE_ERROR), labels,
                      error);
    set_gauge(c->pl->metrics, e);
    int64_t now = (int64_t)mg_unix_ms();
    if (c->pl->store &&
        (e->samples <= MG_CALIB_WARMUP || now - (int64_t)e->saved_ms >= MG_CALIB_SAVE_MS))
        save(c->pl->store, e, now);
}

static void on_row(void *ud, int ncols, const char *const *cols)
{
    mg_pipeline_t *pl = ud;
    if (ncols < 4 || !cols[0] || !cols[1] || !cols[2] || !cols[3]) return;
    mg_calib_route_t *e = mg_calib_set(pl->calib, cols[0], cols[1], strtod(cols[2], NULL),
                                       strtoull(cols[3], NULL, 10));
    if (e && pl->metrics) set_gauge(pl->metrics, e);
}

int mg_pipeline_calib_load(mg_pipeline_t *pl)
{
    if (!pl->calib || !pl->store) return 0;
    char err[256];
    if (mg_store_query(pl->store,
                       "SELECT provider_id, model, bytes_per_token, samples FROM token_calibration"
                       " ORDER BY updated_ms DESC",
                       0, NULL, on_row, pl, err, sizeof(err)) != 0) {
        mg_log_msg(MG_LOG_WARN, NULL, "calibration: cannot load the learned estimates: %s", err);
        return -1;
    }
    return 0;
}
