/* plankeep: routing plans kept for the requests that would get the same one (plankeep.h). */
#include "luavm/plankeep.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KEEP_SLOTS 64 /* models with a kept plan at once; more share slots (last one wins) */

/* What a candidate's plan may depend on (plankeep.h). The state names are static strings:
 * equal states are equal pointers. */
typedef struct {
    const mg_route_conf_t *route;
    const mg_provider_conf_t *provider;
    const char *health, *breaker, *route_breaker;
    int available, cooling, observing;
} cand_state_t;

typedef struct {
    /* the request's routing fields (owned copies) */
    char *endpoint, *model, *priority, *pool, *pin;
    int stream, local_only, allow_smaller_model, allow_cloud, local_first;
    int limit;
    cand_state_t *cands; /* owned, n_cands */
    int n_cands;
    mg_plan_entry_t *plan; /* owned, n_plan */
    int n_plan;
} kept_t;

struct mg_plankeep_s {
    kept_t *slot[KEEP_SLOTS];
};

static size_t slot_of(const mg_candidate_t *cands)
{
    uintptr_t p = (uintptr_t)cands[0].route;
    return (size_t)((p >> 4) ^ (p >> 10)) & (KEEP_SLOTS - 1);
}

static int same_str(const char *a, const char *b)
{
    if (!a || !b) return a == b;
    return a == b || strcmp(a, b) == 0;
}

static cand_state_t state_of(const mg_candidate_t *c)
{
    return (cand_state_t){c->route, c->provider, c->health, c->breaker, c->route_breaker,
                          c->available != 0, c->cooling != 0, c->observing != 0};
}

static int same_state(const cand_state_t *a, const cand_state_t *b)
{
    return a->route == b->route && a->provider == b->provider && a->health == b->health &&
           a->breaker == b->breaker && a->route_breaker == b->route_breaker &&
           a->available == b->available && a->cooling == b->cooling &&
           a->observing == b->observing;
}

static int same_request(const kept_t *k, const mg_lua_req_t *r, int limit)
{
    return k->stream == (r->stream != 0) && k->local_only == (r->local_only != 0) &&
           k->allow_smaller_model == (r->allow_smaller_model != 0) &&
           k->allow_cloud == (r->allow_cloud != 0) && k->local_first == (r->local_first != 0) &&
           k->limit == limit && same_str(k->endpoint, r->endpoint) &&
           same_str(k->model, r->model) && same_str(k->priority, r->priority) &&
           same_str(k->pool, r->pool) && same_str(k->pin, r->pin);
}

int mg_plankeep_find(const mg_plankeep_t *k, const mg_lua_req_t *req,
                     const mg_candidate_t *cands, int n, mg_plan_t *plan)
{
    if (!k || n < 1) return 0;
    const kept_t *e = k->slot[slot_of(cands)];
    if (!e || e->n_cands != n || !same_request(e, req, plan->limit)) return 0;
    for (int i = 0; i < n; i++) {
        cand_state_t s = state_of(&cands[i]);
        if (!same_state(&e->cands[i], &s)) return 0;
    }
    memcpy(plan->entries, e->plan, (size_t)e->n_plan * sizeof(*e->plan));
    plan->n = e->n_plan;
    plan->wait_ms = 0;
    return 1;
}

static void kept_free(kept_t *e)
{
    if (!e) return;
    free(e->endpoint);
    free(e->model);
    free(e->priority);
    free(e->pool);
    free(e->pin);
    free(e->cands);
    free(e->plan);
    free(e);
}

/* strdup that keeps NULL; *ok drops to 0 when a copy fails. */
static char *copy_str(const char *s, int *ok)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *ok = 0;
    return d;
}

static kept_t *kept_new(const mg_lua_req_t *r, const mg_candidate_t *cands, int n,
                        const mg_plan_t *plan)
{
    kept_t *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    int ok = 1;
    e->endpoint = copy_str(r->endpoint, &ok);
    e->model = copy_str(r->model, &ok);
    e->priority = copy_str(r->priority, &ok);
    e->pool = copy_str(r->pool, &ok);
    e->pin = copy_str(r->pin, &ok);
    e->stream = r->stream != 0;
    e->local_only = r->local_only != 0;
    e->allow_smaller_model = r->allow_smaller_model != 0;
    e->allow_cloud = r->allow_cloud != 0;
    e->local_first = r->local_first != 0;
    e->limit = plan->limit;
    e->cands = malloc((size_t)n * sizeof(*e->cands));
    e->plan = malloc((size_t)plan->n * sizeof(*e->plan));
    if (!ok || !e->cands || !e->plan) {
        kept_free(e);
        return NULL;
    }
    for (int i = 0; i < n; i++) e->cands[i] = state_of(&cands[i]);
    e->n_cands = n;
    memcpy(e->plan, plan->entries, (size_t)plan->n * sizeof(*e->plan));
    e->n_plan = plan->n;
    return e;
}

void mg_plankeep_put(mg_plankeep_t **k, const mg_lua_req_t *req, const mg_candidate_t *cands,
                     int n, const mg_plan_t *plan)
{
    if (n < 1 || plan->n < 1 || plan->n > n) return;
    if (!*k && !(*k = calloc(1, sizeof(**k)))) return;
    kept_t *e = kept_new(req, cands, n, plan);
    if (!e) return;
    size_t s = slot_of(cands);
    kept_free((*k)->slot[s]);
    (*k)->slot[s] = e;
}

void mg_plankeep_free(mg_plankeep_t *k)
{
    if (!k) return;
    for (size_t i = 0; i < KEEP_SLOTS; i++) kept_free(k->slot[i]);
    free(k);
}
