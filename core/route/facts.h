/* facts: what the routing policy sees of a route (mg_candidate_t, see luavm.h), described
 * from the pool's state of the route's provider and of the route itself, and kept.
 *
 * Under load the gateway decides several requests per loop millisecond, and between two
 * decisions only the providers that were used or answered change: describing every route
 * afresh (cooldown, both breakers, the recent health window, the rate windows) cost about
 * 400 instructions per route and request. So a description is kept and reused while the
 * loop's millisecond, the provider's and the route's versions (mg_pool_changed) and the
 * pool's epoch (a sync) are the ones it was made at. Everything that is a function of time
 * alone changes at most once a millisecond, and the loop's clock is in milliseconds. */
#ifndef MG_FACTS_H
#define MG_FACTS_H

#include <stddef.h>
#include <stdint.h>

#include "luavm/luavm.h"
#include "route/pool.h"

typedef struct mg_facts_entry_s {
    mg_candidate_t facts;
    uint64_t at_ms;            /* loop time of the description */
    uint32_t version;          /* the provider's version then */
    uint32_t route_version;    /* the route's */
    uint32_t epoch;            /* the pool's */
    int valid;
} mg_facts_entry_t;

typedef struct mg_facts_s {
    mg_facts_entry_t *items;   /* owned: by the route's index in the pool's route set */
    size_t cap;
    uint64_t described, kept;  /* counts, for tests and profiling; described also numbers
                                  the descriptions (mg_candidate_t.serial) */
} mg_facts_t;

/* Describe route r of provider p into out (ps: p's state; rs: r's, or NULL for a route the
 * config does not list): the kept description when nothing it depends on changed, else a
 * fresh one, kept. f NULL: always fresh. */
void mg_facts_describe(mg_facts_t *f, const mg_pool_t *pool, const mg_provider_conf_t *p,
                       const mg_route_conf_t *r, mg_provider_state_t *ps,
                       const mg_route_state_t *rs, uint64_t now, mg_candidate_t *out);

void mg_facts_free(mg_facts_t *f);

#endif
