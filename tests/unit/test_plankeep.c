/* Unit tests for core/luavm/plankeep.c: which requests and candidates a kept plan applies to.
 * (test_luavm checks the same through mg_gen_route, with a policy.) */
#include "luavm/plankeep.h"
#include "mgtest.h"

#include <string.h>

#define MODELS 200 /* more than the keeper's slots: models share slots */
#define ROUTES 3

static mg_route_conf_t routes[MODELS][ROUTES];
static mg_provider_conf_t providers[ROUTES];

static void cands_of(int model, mg_candidate_t *c)
{
    for (int i = 0; i < ROUTES; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        c[i].route = &routes[model][i];
        c[i].provider = &providers[i];
        c[i].available = 1;
        c[i].health = "healthy";
        c[i].breaker = "closed";
    }
}

static mg_lua_req_t req_of(void)
{
    return (mg_lua_req_t){.request_id = "r", .endpoint = "chat", .model = "m", .priority = "P2",
                          .allow_cloud = 1, .local_first = 1};
}

/* The plan kept for model m: its routes in reverse, the middle one marked. */
static mg_plan_t plan_of(int model, mg_plan_entry_t *e)
{
    for (int i = 0; i < ROUTES; i++)
        e[i] = (mg_plan_entry_t){ROUTES - 1 - i, i == 1 ? "fallback" : NULL, model % 2};
    return (mg_plan_t){.entries = e, .n = ROUTES, .limit = 1};
}

/* Entry by entry (memcmp would compare the structs' padding too). */
static int same_plan(const mg_plan_entry_t *a, const mg_plan_entry_t *b, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].index != b[i].index || a[i].degraded != b[i].degraded ||
            a[i].emergency != b[i].emergency)
            return 0;
    return 1;
}

static int found(const mg_plankeep_t *k, const mg_lua_req_t *r, const mg_candidate_t *c, int n,
                 mg_plan_entry_t *out)
{
    mg_plan_t p = {.entries = out, .limit = 1};
    return mg_plankeep_find(k, r, c, n, &p) ? p.n : 0;
}

static void test_nothing_kept(void)
{
    mg_candidate_t c[ROUTES];
    mg_plan_entry_t out[ROUTES];
    mg_lua_req_t r = req_of();
    cands_of(0, c);
    CHECK_EQ_INT(found(NULL, &r, c, ROUTES, out), 0);
    mg_plankeep_t *k = NULL;
    mg_plan_entry_t e[ROUTES];
    mg_plan_t empty = {.entries = e, .n = 0, .limit = 1};
    mg_plankeep_put(&k, &r, c, ROUTES, &empty); /* an empty plan is not kept */
    CHECK_EQ_INT(found(k, &r, c, ROUTES, out), 0);
    mg_plankeep_free(k);
}

/* A keeper with model 0's plan (e) for request r over candidates c. */
static mg_plankeep_t *keeper_of_model0(mg_candidate_t *c, mg_plan_entry_t *e, mg_lua_req_t *r)
{
    mg_plankeep_t *k = NULL;
    *r = req_of();
    cands_of(0, c);
    mg_plan_t p = plan_of(0, e);
    mg_plankeep_put(&k, r, c, ROUTES, &p);
    return k;
}

static void test_found_again(void)
{
    mg_candidate_t c[ROUTES];
    mg_plan_entry_t e[ROUTES], out[ROUTES];
    mg_lua_req_t r;
    mg_plankeep_t *k = keeper_of_model0(c, e, &r);
    /* equal strings in other buffers, moving numbers changed: the same plan */
    char model[8], endpoint[8];
    strcpy(model, "m");
    strcpy(endpoint, "chat");
    mg_lua_req_t r2 = r;
    r2.model = model;
    r2.endpoint = endpoint;
    r2.request_id = "other";
    r2.random = 0.75;
    r2.max_tokens = 99;
    c[0].in_flight = 9;
    c[1].headroom = 0.5;
    c[2].cooldown_remaining_ms = 100;
    CHECK_EQ_INT(found(k, &r2, c, ROUTES, out), ROUTES);
    CHECK(same_plan(out, e, ROUTES));
    /* the plan_limit the caller asks with is part of the key */
    mg_plan_t other_limit = {.entries = out, .limit = 2};
    CHECK_EQ_INT(mg_plankeep_find(k, &r2, c, ROUTES, &other_limit), 0);
    mg_plankeep_free(k);
}

static void test_key_fields(void)
{
    mg_candidate_t c[ROUTES];
    mg_plan_entry_t e[ROUTES], out[ROUTES];
    mg_lua_req_t r;
    mg_plankeep_t *k = keeper_of_model0(c, e, &r);
    mg_lua_req_t v[11];
    for (int i = 0; i < 11; i++) v[i] = r;
    v[0].pin = "oa";
    v[1].pool = "main"; /* NULL and "main" differ as fields, though the policy reads both alike */
    v[2].priority = "P3";
    v[3].stream = 1;
    v[4].local_only = 1;
    v[5].allow_smaller_model = 1;
    v[6].allow_cloud = 0;
    v[7].local_first = 0;
    v[8].endpoint = "embeddings";
    v[9].model = "m2";
    v[10].priority = NULL;
    for (int i = 0; i < 11; i++) CHECK_EQ_INT(found(k, &v[i], c, ROUTES, out), 0);
    /* each candidate state */
    for (int f = 0; f < 8; f++) {
        mg_candidate_t d[ROUTES];
        memcpy(d, c, sizeof(d));
        mg_candidate_t *x = &d[f % ROUTES];
        switch (f) {
        case 0: x->available = 0; break;
        case 1: x->cooling = 1; break;
        case 2: x->observing = 1; break;
        case 3: x->health = "down"; break;
        case 4: x->breaker = "open"; break;
        case 5: x->route_breaker = "closed"; break;
        case 6: x->route = &routes[1][0]; break;
        default: x->provider = &providers[0]; break;
        }
        CHECK_EQ_INT(found(k, &r, d, ROUTES, out), 0);
    }
    CHECK_EQ_INT(found(k, &r, c, ROUTES - 1, out), 0); /* fewer candidates */
    CHECK_EQ_INT(found(k, &r, c, ROUTES, out), ROUTES);
    mg_plankeep_free(k);
}

/* Many models through few slots: a model either finds its own plan or none, never another's. */
static void test_shared_slots(void)
{
    mg_plankeep_t *k = NULL;
    mg_lua_req_t r = req_of();
    for (int m = 0; m < MODELS; m++) {
        mg_candidate_t c[ROUTES];
        mg_plan_entry_t e[ROUTES];
        cands_of(m, c);
        mg_plan_t p = plan_of(m, e);
        mg_plankeep_put(&k, &r, c, ROUTES, &p);
    }
    int hits = 0;
    for (int m = 0; m < MODELS; m++) {
        mg_candidate_t c[ROUTES];
        mg_plan_entry_t e[ROUTES], out[ROUTES];
        cands_of(m, c);
        plan_of(m, e);
        int n = found(k, &r, c, ROUTES, out);
        if (n) CHECK(same_plan(out, e, ROUTES));
        hits += n > 0;
    }
    CHECK(hits > 0 && hits < MODELS);
    mg_plankeep_free(k);
}

int main(void)
{
    MG_RUN(test_nothing_kept);
    MG_RUN(test_found_again);
    MG_RUN(test_key_fields);
    MG_RUN(test_shared_slots);
    return mg_test_summary();
}
