/* facts: routing's view of a route, kept while nothing it depends on changed; see facts.h. */
#include "route/facts.h"

#include <stdlib.h>
#include <string.h>

/* The facts of route r of provider p, from the provider's state ps and the route's rs. */
static void describe(mg_candidate_t *cd, const mg_provider_conf_t *p, const mg_route_conf_t *r,
                     mg_provider_state_t *ps, const mg_route_state_t *rs, uint64_t now)
{
    mg_cooldown_update(&ps->cooldown, now);
    mg_health_snapshot_t hs;
    mg_health_recent(&ps->health, now, &hs); /* not the 5-minute sums: routing reads none */
    mg_limiter_usage_t use;
    mg_limiter_usage(&ps->limiter, now, &use);
    memset(cd, 0, sizeof(*cd));
    cd->provider = p;
    cd->route = r;
    cd->available = mg_pool_route_available(ps, rs, now);
    cd->cooling = mg_cooldown_cooling(&ps->cooldown, now);
    cd->cooldown_remaining_ms = (long long)mg_cooldown_remaining_ms(&ps->cooldown, now);
    cd->observing = mg_cooldown_observing(&ps->cooldown, now);
    cd->consecutive_429 = ps->cooldown.consecutive_429;
    /* the limits the limiter enforces: the newest config's, also for a call of an older one */
    cd->rpm_limit = ps->limiter.rpm.limit;
    cd->rpm_used = use.rpm_used;
    cd->tpm_limit = ps->limiter.tpm.limit;
    cd->tpm_used = use.tpm_used;
    cd->headroom = use.headroom;
    cd->in_flight = ps->in_flight;
    cd->health = mg_health_state_name(hs.state);
    cd->breaker = mg_breaker_state_name(mg_pool_breaker_state(ps, rs, now));
    cd->route_breaker = rs ? mg_breaker_state_name(mg_breaker_state(&rs->breaker, now)) : NULL;
    cd->avail_samples = hs.avail_samples;
    cd->ttft_samples = hs.ttft_samples;
    cd->success_rate = hs.avail_samples > 0 ? hs.success_rate : -1;
    cd->ttft_ms = hs.ttft_samples > 0 ? hs.ttft_ms : -1;
    cd->load_known = ps->load.known;
    cd->load_running = ps->load.running;
    cd->load_waiting = ps->load.waiting;
    cd->load_kv_cache = ps->load.kv_cache;
}

/* The entry kept for route state rs, or NULL (none: not a listed route, or no memory). */
static mg_facts_entry_t *entry_of(mg_facts_t *f, const mg_pool_t *pool,
                                  const mg_route_state_t *rs)
{
    if (!f || !rs) return NULL;
    size_t i = (size_t)(rs - pool->routes.items);
    if (i >= pool->routes.n) return NULL;
    if (i >= f->cap) {
        size_t cap = pool->routes.n;
        mg_facts_entry_t *items = realloc(f->items, cap * sizeof(*items));
        if (!items) return NULL;
        memset(items + f->cap, 0, (cap - f->cap) * sizeof(*items));
        f->items = items;
        f->cap = cap;
    }
    return &f->items[i];
}

static int still_true(const mg_facts_entry_t *e, const mg_pool_t *pool,
                      const mg_provider_conf_t *p, const mg_route_conf_t *r,
                      const mg_provider_state_t *ps, const mg_route_state_t *rs, uint64_t now)
{
    return e->valid && e->at_ms == now && e->epoch == pool->epoch &&
           e->version == ps->version && e->route_version == rs->version &&
           e->facts.provider == p && e->facts.route == r;
}

void mg_facts_describe(mg_facts_t *f, const mg_pool_t *pool, const mg_provider_conf_t *p,
                       const mg_route_conf_t *r, mg_provider_state_t *ps,
                       const mg_route_state_t *rs, uint64_t now, mg_candidate_t *out)
{
    mg_facts_entry_t *e = entry_of(f, pool, rs);
    if (e && still_true(e, pool, p, r, ps, rs, now)) {
        *out = e->facts;
        f->kept++;
        return;
    }
    describe(out, p, r, ps, rs, now);
    if (f) out->serial = ++f->described;
    if (!e) return;
    *e = (mg_facts_entry_t){.facts = *out, .at_ms = now, .version = ps->version,
                            .route_version = rs->version, .epoch = pool->epoch, .valid = 1};
}

void mg_facts_free(mg_facts_t *f)
{
    free(f->items);
    *f = (mg_facts_t){0};
}
