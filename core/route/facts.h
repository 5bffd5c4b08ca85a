/* facts: what the routing policy sees of a route (mg_candidate_t, see luavm.h), described
 * from the pool's state of the route's provider and of the route itself.
 *
 * Under load the gateway decides several requests per loop millisecond, and between two
 * decisions only the providers that were used or answered change: describing every route
 * afresh (cooldown, both breakers, the recent health window, the rate windows) cost about
 * 400 instructions per route and request. So a description is kept in the generation's keep
 * (luavm/keep.h, under its one rule: given again while what it was made from is unchanged),
 * made from the loop's millisecond, the provider's and the route's versions
 * (mg_pool_changed) and the pool's epoch (a sync). Everything that is a function of time
 * alone changes at most once a millisecond, and the loop's clock is in milliseconds. */
#ifndef MG_FACTS_H
#define MG_FACTS_H

#include <stdint.h>

#include "luavm/keep.h"
#include "luavm/luavm.h"
#include "route/pool.h"

/* Describe route r of provider p into out (ps: p's state; rs: r's, or NULL for a route the
 * config does not list): the kept description when nothing it was made from changed, else a
 * fresh one, kept (k: the generation's keep, whose config r is in; NULL: always fresh). The
 * description carries a serial: two equal serials are one description. */
void mg_facts_describe(mg_keep_t *k, const mg_pool_t *pool, const mg_provider_conf_t *p,
                       const mg_route_conf_t *r, mg_provider_state_t *ps,
                       const mg_route_state_t *rs, uint64_t now, mg_candidate_t *out);

#endif
