/* pool: provider runtime state; see pool.h. */
#include "route/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_pool_init(mg_pool_t *p)
{
    memset(p, 0, sizeof(*p));
}

mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].id && strcmp(p->items[i].id, id) == 0) return &p->items[i];
    return NULL;
}

mg_provider_state_t *mg_pool_get_at(mg_pool_t *p, size_t index, const mg_provider_conf_t *pc)
{
    /* a synced config lives as long as the generation that uses it, which outlives the
       pool's pointer to it (the next sync replaces it): equal pointers are the same entry */
    if (index < p->n && p->items[index].conf == pc) return &p->items[index];
    return mg_pool_get(p, pc->id);
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

/* The passive-health settings of the config (the thresholds are the ADR's). */
static void health_config(const mg_config_t *cfg, mg_health_config_t *hc)
{
    mg_health_config_default(hc);
    hc->retry_down_ms = cfg->health.retry_down_ms;
}

static int state_init(mg_provider_state_t *s, const char *id, const mg_breaker_config_t *bc,
                      const mg_health_config_t *hc)
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
    mg_health_init(&s->health, hc);
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

/* ------------------------------------------------------------------------ */
/* Routes                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t route_hash(const char *provider, const char *model)
{
    uint64_t h = 1469598103934665603u; /* FNV-1a */
    for (const char *c = provider; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211u;
    h = (h ^ 0x100) * 1099511628211u; /* no byte: ("ab", "c") and ("a", "bc") differ */
    for (const char *c = model; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211u;
    return h;
}

static mg_route_state_t *route_find(const mg_route_set_t *set, const char *provider,
                                    const char *model)
{
    if (!set->slots || !provider || !model) return NULL;
    for (size_t h = route_hash(provider, model) & set->mask;; h = (h + 1) & set->mask) {
        uint32_t i = set->slots[h];
        if (!i) return NULL;
        mg_route_state_t *r = &set->items[i - 1];
        if (strcmp(r->provider, provider) == 0 && strcmp(r->model, model) == 0) return r;
    }
}

static void route_set_free(mg_route_set_t *set)
{
    for (size_t i = 0; i < set->n; i++) {
        free(set->items[i].provider);
        free(set->items[i].model);
    }
    free(set->items);
    free(set->slots);
    free(set->confs);
    free(set->state_of);
    memset(set, 0, sizeof(*set));
}

/* Add route r of the config to set (room is there), with the breaker of the same route
 * in `old` (its state goes on) or a fresh one. */
static int route_add(mg_route_set_t *set, const mg_route_set_t *old, const mg_route_conf_t *r,
                     const mg_breaker_config_t *bc)
{
    mg_route_state_t *st = &set->items[set->n];
    st->provider = strdup(r->provider);
    st->model = strdup(r->model);
    if (!st->provider || !st->model) {
        free(st->provider);
        free(st->model);
        return -1;
    }
    const mg_route_state_t *was = route_find(old, r->provider, r->model);
    if (was) {
        st->breaker = was->breaker; /* a plain value: copied, the old set is freed later */
        mg_breaker_set_config(&st->breaker, bc);
    } else {
        mg_breaker_init(&st->breaker, bc);
    }
    size_t h = route_hash(r->provider, r->model) & set->mask;
    while (set->slots[h]) h = (h + 1) & set->mask;
    set->slots[h] = (uint32_t)++set->n;
    return 0;
}

/* The routes of cfg, each (provider, model) pair once however many models list it. */
static int route_set_build(mg_route_set_t *set, const mg_route_set_t *old, const mg_config_t *cfg,
                           const mg_breaker_config_t *bc)
{
    size_t max = 0, size = 4;
    for (size_t m = 0; m < cfg->n_models; m++) max += cfg->models[m].n_routes;
    while (size < 2 * max) size *= 2;
    memset(set, 0, sizeof(*set));
    set->items = calloc(max ? max : 1, sizeof(*set->items));
    set->slots = calloc(size, sizeof(*set->slots));
    set->confs = calloc(max ? max : 1, sizeof(*set->confs));
    set->state_of = calloc(max ? max : 1, sizeof(*set->state_of));
    set->mask = size - 1;
    if (!set->items || !set->slots || !set->confs || !set->state_of) goto fail;
    for (size_t m = 0; m < cfg->n_models; m++) {
        for (size_t i = 0; i < cfg->models[m].n_routes; i++) {
            const mg_route_conf_t *r = &cfg->models[m].routes[i];
            const mg_route_state_t *st = route_find(set, r->provider, r->model);
            if (!st && route_add(set, old, r, bc) != 0) goto fail;
            if (r->slot >= max) continue; /* slots not linked: lookups go by name */
            set->confs[r->slot] = r;
            set->state_of[r->slot] = (uint32_t)(st ? st - set->items : (ptrdiff_t)set->n - 1);
        }
    }
    set->n_confs = max;
    return 0;
fail:
    route_set_free(set);
    return -1;
}

mg_route_state_t *mg_pool_route(const mg_pool_t *p, const char *provider, const char *model)
{
    return route_find(&p->routes, provider, model);
}

mg_route_state_t *mg_pool_route_of(const mg_pool_t *p, const mg_route_conf_t *r)
{
    const mg_route_set_t *set = &p->routes;
    if (r->slot < set->n_confs && set->confs[r->slot] == r)
        return &set->items[set->state_of[r->slot]];
    return route_find(set, r->provider, r->model);
}

/* ------------------------------------------------------------------------ */
/* Sync                                                                       */
/* ------------------------------------------------------------------------ */

static void providers_free(mg_pool_t *p)
{
    for (size_t i = 0; i < p->n; i++) state_free(&p->items[i]);
    free(p->items);
    p->items = NULL;
    p->n = 0;
}

int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg)
{
    size_t n = cfg->n_providers;
    mg_breaker_config_t bc;
    breaker_config(cfg, &bc);
    mg_health_config_t hc;
    health_config(cfg, &hc);
    /* create everything new first, so running out of memory leaves the pool as it was */
    mg_route_set_t routes;
    if (route_set_build(&routes, &p->routes, cfg, &bc) != 0) return -1;
    mg_provider_state_t *items = calloc(n ? n : 1, sizeof(*items));
    if (!items) {
        route_set_free(&routes);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (mg_pool_get(p, cfg->providers[i].id)) continue;
        if (state_init(&items[i], cfg->providers[i].id, &bc, &hc) != 0) {
            for (size_t k = 0; k < i; k++) state_free(&items[k]);
            free(items);
            route_set_free(&routes);
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
            mg_health_set_config(&items[i].health, &hc);
        }
        snprintf(items[i].pool, sizeof(items[i].pool), "%s", pc->pool);
        items[i].conf = pc;
        items[i].disabled = pc->disabled;
        mg_limiter_set_limits(&items[i].limiter, pc->rpm_limit, pc->tpm_limit);
        mg_rpm_set_emergency_ratio(&items[i].limiter.rpm, cfg->routing.emergency_rpm_ratio);
    }
    providers_free(p);
    route_set_free(&p->routes);
    p->items = items;
    p->n = n;
    p->routes = routes;
    p->epoch++;
    return 0;
}

int mg_pool_available(const mg_provider_state_t *s, uint64_t now_ms)
{
    return s && !s->disabled && mg_health_would_allow(&s->health, now_ms) &&
           mg_breaker_would_allow(&s->breaker, now_ms);
}

int mg_pool_route_available_in_panic(const mg_provider_state_t *s, const mg_route_state_t *r,
                                     uint64_t now_ms)
{
    return s && !s->disabled && mg_breaker_would_allow(&s->breaker, now_ms) &&
           (!r || mg_breaker_would_allow(&r->breaker, now_ms));
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

/* ------------------------------------------------------------------------ */
/* The two breakers                                                           */
/* ------------------------------------------------------------------------ */

int mg_pool_route_available(const mg_provider_state_t *s, const mg_route_state_t *r,
                            uint64_t now_ms)
{
    return mg_pool_available(s, now_ms) && (!r || mg_breaker_would_allow(&r->breaker, now_ms));
}

/* open 2, half open 1, closed 0 */
static int severity(mg_breaker_state_t st)
{
    return st == MG_BREAKER_OPEN ? 2 : st == MG_BREAKER_HALF_OPEN ? 1 : 0;
}

mg_breaker_state_t mg_pool_breaker_state(const mg_provider_state_t *s, const mg_route_state_t *r,
                                         uint64_t now_ms)
{
    mg_breaker_state_t a = s ? mg_breaker_state(&s->breaker, now_ms) : MG_BREAKER_CLOSED;
    mg_breaker_state_t b = r ? mg_breaker_state(&r->breaker, now_ms) : MG_BREAKER_CLOSED;
    return severity(a) >= severity(b) ? a : b;
}

mg_breaker_state_t mg_pool_provider_breaker(const mg_pool_t *p, const mg_provider_state_t *s,
                                            uint64_t now_ms)
{
    mg_breaker_state_t own = mg_breaker_state(&s->breaker, now_ms), best = MG_BREAKER_OPEN;
    int routes = 0;
    if (own != MG_BREAKER_CLOSED) return own;
    for (size_t i = 0; i < p->routes.n; i++) {
        const mg_route_state_t *r = &p->routes.items[i];
        if (strcmp(r->provider, s->id) != 0) continue;
        mg_breaker_state_t st = mg_breaker_state(&r->breaker, now_ms);
        if (severity(st) < severity(best)) best = st;
        routes++;
    }
    return routes ? best : MG_BREAKER_CLOSED;
}

uint64_t mg_pool_breakers_retry_ms(const mg_provider_state_t *s, const mg_route_state_t *r,
                                   uint64_t now_ms)
{
    uint64_t a = s ? mg_breaker_retry_ms(&s->breaker, now_ms) : 0;
    uint64_t b = r ? mg_breaker_retry_ms(&r->breaker, now_ms) : 0;
    return a > b ? a : b;
}

/* A breaker of s, or r's own, changed (a half-open probe slot taken or given back counts). */
static void breakers_changed(mg_provider_state_t *s, mg_route_state_t *r)
{
    mg_pool_changed(s);
    if (r) r->version++;
}

int mg_pool_breakers_allow(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms)
{
    breakers_changed(s, r);
    if (s && !mg_breaker_allow(&s->breaker, now_ms)) return 0;
    if (r && !mg_breaker_allow(&r->breaker, now_ms)) {
        if (s) mg_breaker_release(&s->breaker, now_ms);
        return 0;
    }
    return 1;
}

void mg_pool_breakers_release(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms)
{
    breakers_changed(s, r);
    if (s) mg_breaker_release(&s->breaker, now_ms);
    if (r) mg_breaker_release(&r->breaker, now_ms);
}

void mg_pool_breakers_record(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms,
                             mg_attempt_outcome_t outcome)
{
    /* a route the config does not list (a prefix-served name) has no breaker of its own:
       its failures count against the provider, as they did before routes had breakers */
    int provider_fault = outcome == MG_ATTEMPT_UNREACHABLE || (!r && outcome == MG_ATTEMPT_FAILED);
    breakers_changed(s, r);
    if (s) mg_breaker_record(&s->breaker, now_ms, provider_fault);
    if (!r) return;
    if (outcome == MG_ATTEMPT_UNREACHABLE) mg_breaker_release(&r->breaker, now_ms); /* not tried */
    else mg_breaker_record(&r->breaker, now_ms, outcome == MG_ATTEMPT_FAILED);
}

void mg_pool_free(mg_pool_t *p)
{
    providers_free(p);
    route_set_free(&p->routes);
}
