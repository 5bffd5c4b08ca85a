/* plankeep: routing plans kept for the requests that would get the same one.
 *
 * The routing policy is called for every request, yet for most models its answer does not
 * change from one request to the next: one route, or a fixed failover order. A plan that
 * route() returns with reuse = true promises that it depends on nothing but
 *   - the request's routing fields: endpoint, model, stream, priority, pool, pin,
 *     local_only, allow_smaller_model, allow_cloud, local_first, plan_limit;
 *   - each candidate's route (and with it its config fields) and its state: available,
 *     cooling, observing, health, breaker, route_breaker;
 * never on the numbers that move with every request (random, in_flight, headroom, samples,
 * load, cooldown_remaining_ms, ...). Such a plan is kept here, one per model (by its first
 * route), and given to the next request whose fields and candidate states are all equal,
 * without calling Lua. Anything different and the policy is asked again. The keeper lives
 * in a generation: a reload starts with none. See lua/README.md, "Plans that hold". */
#ifndef MG_PLANKEEP_H
#define MG_PLANKEEP_H

#include "luavm/luavm.h"

typedef struct mg_plankeep_s mg_plankeep_t;

/* The kept plan for this request and these candidates, if there is one: 1 with plan's
 * entries and n filled (plan->limit is part of the key), else 0. k may be NULL. */
int mg_plankeep_find(const mg_plankeep_t *k, const mg_lua_req_t *req,
                     const mg_candidate_t *cands, int n, mg_plan_t *plan);

/* Keep plan (n > 0 entries) for requests like req over candidates like cands, in place
 * of what the model had kept. *k is made on first use. Best effort: out of memory keeps
 * nothing. */
void mg_plankeep_put(mg_plankeep_t **k, const mg_lua_req_t *req, const mg_candidate_t *cands,
                     int n, const mg_plan_t *plan);

void mg_plankeep_free(mg_plankeep_t *k);

#endif
