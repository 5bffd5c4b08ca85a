/* pool: provider runtime state; see pool.h. */
#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_pool_init(mg_pool_t *p)
{
    p->items = NULL;
    p->n = 0;
}

mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].id && strcmp(p->items[i].id, id) == 0) return &p->items[i];
    return NULL;
}

static void breaker_config(const mg_config_t *cfg, mg_breaker_config_t *bc)
{
    mg_breaker_config_default(bc);
    bc->consecutive_failures = cfg->breaker.consecutive_failures;
    bc->error_rate_threshold = cfg->breaker.error_rate_threshold;
    bc->min_requests = cfg->breaker.min_requests;
    bc->window_seconds = cfg->breaker.window_seconds;
    bc->open_duration_seconds = cfg->breaker.open_duration_seconds;
    bc->half_open_max_requests = cfg->breaker.half_open_max_requests;
}

static int state_init(mg_provider_state_t *s, const char *id, const mg_breaker_config_t *bc)
{
    memset(s, 0, sizeof(*s));
    s->id = strdup(id);
    if (!s->id || mg_limiter_init(&s->limiter, 0, 0) != 0) {
        free(s->id);
        s->id = NULL;
        return -1;
    }
    mg_cooldown_init(&s->cooldown);
    mg_breaker_init(&s->breaker, bc);
    mg_health_config_t hc;
    mg_health_config_default(&hc);
    mg_health_init(&s->health, &hc);
    s->load.kv_cache = -1;
    return 0;
}

static void state_free(mg_provider_state_t *s)
{
    if (!s->id) return;
    mg_limiter_free(&s->limiter);
    free(s->id);
    s->id = NULL;
}

int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg)
{
    size_t n = cfg->n_providers;
    mg_breaker_config_t bc;
    breaker_config(cfg, &bc);
    mg_provider_state_t *items = calloc(n ? n : 1, sizeof(*items));
    if (!items) return -1;
    /* create everything new first, so running out of memory leaves the pool as it was */
    for (size_t i = 0; i < n; i++) {
        if (mg_pool_get(p, cfg->providers[i].id)) continue;
        if (state_init(&items[i], cfg->providers[i].id, &bc) != 0) {
            for (size_t k = 0; k < i; k++) state_free(&items[k]);
            free(items);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const mg_provider_conf_t *pc = &cfg->providers[i];
        if (!items[i].id) {
            mg_provider_state_t *old = mg_pool_get(p, pc->id);
            items[i] = *old; /* moved, with its limiter's memory */
            old->id = NULL;
            mg_breaker_set_config(&items[i].breaker, &bc);
        }
        snprintf(items[i].pool, sizeof(items[i].pool), "%s", pc->pool);
        items[i].disabled = pc->disabled;
        mg_limiter_set_limits(&items[i].limiter, pc->rpm_limit, pc->tpm_limit);
        mg_rpm_set_emergency_ratio(&items[i].limiter.rpm, cfg->routing.emergency_rpm_ratio);
    }
    mg_pool_free(p);
    p->items = items;
    p->n = n;
    return 0;
}

int mg_pool_available(const mg_provider_state_t *s, uint64_t now_ms)
{
    return s && !s->disabled && s->health.state != MG_HEALTH_DOWN &&
           mg_breaker_would_allow(&s->breaker, now_ms);
}

void mg_pool_record(mg_provider_state_t *s, int success)
{
    if (!s) return;
    if (success) {
        s->consecutive_failures = 0;
    } else {
        s->consecutive_failures++;
        s->failures_total++;
    }
}

void mg_pool_free(mg_pool_t *p)
{
    for (size_t i = 0; i < p->n; i++) state_free(&p->items[i]);
    free(p->items);
    p->items = NULL;
    p->n = 0;
}
