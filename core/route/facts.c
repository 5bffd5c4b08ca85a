/* facts: routing's view of a route, kept while nothing it depends on changed; see facts.h. */
#include "route/facts.h"

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
    cd->trial = cd->available && ps->health.state == MG_HEALTH_DOWN;
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

void mg_facts_describe(mg_keep_t *k, const mg_pool_t *pool, const mg_provider_conf_t *p,
                       const mg_route_conf_t *r, mg_provider_state_t *ps,
                       const mg_route_state_t *rs, uint64_t now, mg_candidate_t *out)
{
    long slot = rs ? mg_keep_slot(k, r) : -1;
    uint64_t stamp[MG_KEEP_STAMP] = {now, ps->version, rs ? rs->version : 0, pool->epoch};
    if (slot >= 0 && mg_keep_facts_get(k, slot, stamp, out) && out->provider == p) return;
    describe(out, p, r, ps, rs, now);
    out->keep_slot = slot + 1;
    mg_keep_facts_put(k, slot, stamp, out);
}
