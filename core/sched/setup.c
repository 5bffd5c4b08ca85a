/* setup: the scheduler from the configuration; see setup.h. */
#include "sched/setup.h"

#include <stdio.h>

#include "base/log.h"

void mg_sched_setup_config(const mg_config_t *cfg, mg_sched_config_t *sc)
{
    mg_sched_config_defaults(sc);
    sc->max_running = (uint32_t)cfg->scheduler.max_running_tasks;
    sc->max_queued = (uint32_t)cfg->scheduler.max_queued_tasks;
    sc->aging_ms = (uint64_t)cfg->scheduler.priority_aging_seconds * 1000;
    sc->reserved_realtime_slots = (uint32_t)cfg->scheduler.reserved_realtime_slots;
    for (int i = 0; i < 3; i++) sc->level_threshold[i] = cfg->scheduler.level_threshold[i];
    sc->vram_bytes = (uint64_t)cfg->scheduler.vram_bytes;
    for (int i = 0; i < MG_PRIO_COUNT; i++) sc->weight[i] = (uint32_t)cfg->scheduler.weights[i];
    sc->safety_margin_ratio = cfg->scheduler.safety_margin_ratio;
    sc->user_max_running = 0; /* no users without tenancy */
}

mg_sched_gate_t *mg_sched_smaller_gate(mg_sched_t *s, const mg_route_conf_t *r)
{
    if (!r->smaller || (!r->weight_bytes && !r->kv_cache_per_token_bytes)) return NULL;
    char name[300];
    snprintf(name, sizeof(name), "smaller:%s", r->model);
    return mg_sched_gate(s, MG_GATE_MODEL, name);
}

/* Memory figures of a model gate; weights count as loaded (resident). */
static void apply_memory(mg_sched_t *s, mg_sched_gate_t *g, const char *name,
                         long long weight_bytes, long long kv_per_token_bytes)
{
    mg_sched_model_memory(s, g, (uint64_t)weight_bytes, (uint64_t)kv_per_token_bytes);
    if (weight_bytes > 0 && mg_sched_model_load(s, g, 1) != 0)
        mg_log_msg(MG_LOG_WARN, NULL,
                   "model %s: its weights (%lld bytes) do not fit scheduler.vram_bytes", name,
                   weight_bytes);
}

void mg_sched_setup_models(mg_sched_t *s, const mg_config_t *cfg)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        const mg_model_conf_t *m = &cfg->models[i];
        mg_sched_gate_t *g = mg_sched_gate(s, MG_GATE_MODEL, m->name);
        if (!g) continue;
        mg_sched_gate_limits(s, g, (uint32_t)m->max_concurrency, 0);
        apply_memory(s, g, m->name, m->weight_bytes, m->kv_cache_per_token_bytes);
        for (size_t j = 0; j < m->n_routes; j++) {
            const mg_route_conf_t *r = &m->routes[j];
            mg_sched_gate_t *rg = mg_sched_smaller_gate(s, r);
            if (rg) apply_memory(s, rg, r->model, r->weight_bytes, r->kv_cache_per_token_bytes);
        }
    }
}
