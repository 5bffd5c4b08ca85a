/* Unit tests for core/route/pool.c: provider runtime state kept by id across config syncs,
 * providers added and removed, availability and failure accounting. */
#include "conf/config.h"
#include "mgtest.h"
#include "route/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char err_buf[512];

/* A config with the given provider ids (each with one model routing to it). */
static mg_config_t *config_with(const char *const *ids, int n)
{
    char yaml[4096];
    size_t off = 0;
    off += (size_t)snprintf(yaml + off, sizeof(yaml) - off, "providers:\n");
    for (int i = 0; i < n; i++)
        off += (size_t)snprintf(yaml + off, sizeof(yaml) - off,
                                "  - id: %s\n    adapter: openai\n"
                                "    base_url: http://127.0.0.1:%d/v1\n",
                                ids[i], 9000 + i);
    if (n > 0) {
        off += (size_t)snprintf(yaml + off, sizeof(yaml) - off, "models:\n");
        for (int i = 0; i < n; i++)
            off +=
                (size_t)snprintf(yaml + off, sizeof(yaml) - off,
                                 "  m%d:\n    routes: [ { provider: %s, model: x } ]\n", i, ids[i]);
    }
    mg_config_t *cfg = NULL;
    if (mg_config_parse("pool.yaml", yaml, off, &cfg, err_buf, sizeof(err_buf)) != 0) {
        fprintf(stderr, "config error: %s\n", err_buf);
        return NULL;
    }
    return cfg;
}

static void test_init_empty(void)
{
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(p.n, 0);
    CHECK(mg_pool_get(&p, "a") == NULL);
    CHECK(!mg_pool_available(NULL, 0));
    mg_pool_record(NULL, 0); /* tolerated */
    mg_pool_free(&p);
    mg_pool_free(&p); /* idempotent */
    CHECK_EQ_INT(p.n, 0);
}

static void test_sync_adds_fresh_state(void)
{
    const char *ids[] = {"alpha", "beta", "gamma"};
    mg_config_t *cfg = config_with(ids, 3);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    CHECK_EQ_INT(p.n, 3);
    for (int i = 0; i < 3; i++) {
        mg_provider_state_t *s = mg_pool_get(&p, ids[i]);
        CHECK(s != NULL);
        if (!s) continue;
        CHECK_STR(s->id, ids[i]);
        CHECK(s->id != cfg->providers[i].id); /* its own copy, not the config's */
        CHECK_EQ_INT(s->in_flight, 0);
        CHECK_EQ_INT(s->consecutive_failures, 0);
        CHECK_EQ_INT(s->requests_total, 0);
        CHECK_EQ_INT(s->failures_total, 0);
        CHECK(mg_pool_available(s, 0));
    }
    CHECK(mg_pool_get(&p, "delta") == NULL);
    mg_config_free(cfg);
    /* the pool does not depend on the config staying alive */
    CHECK(mg_pool_get(&p, "beta") != NULL);
    mg_pool_free(&p);
}

/* mg_pool_get_at: the state at the config's provider index, by id when that is wrong. */
static void test_get_at_index(void)
{
    const char *ids[] = {"alpha", "beta", "gamma"}, *other[] = {"gamma", "alpha"};
    mg_config_t *cfg = config_with(ids, 3), *was = config_with(other, 2);
    CHECK(cfg != NULL && was != NULL);
    if (!cfg || !was) {
        mg_config_free(cfg);
        mg_config_free(was);
        return;
    }
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    for (size_t i = 0; i < 3; i++) CHECK(mg_pool_get_at(&p, i, &cfg->providers[i]) == &p.items[i]);
    /* an older generation's order: gamma was its provider 0 */
    CHECK(mg_pool_get_at(&p, 0, &was->providers[0]) == mg_pool_get(&p, "gamma"));
    CHECK(mg_pool_get_at(&p, 1, &was->providers[1]) == mg_pool_get(&p, "alpha"));
    /* past the end */
    CHECK(mg_pool_get_at(&p, 7, &cfg->providers[1]) == mg_pool_get(&p, "beta"));
    /* gone: a config whose provider the pool does not have */
    const char *gone[] = {"delta"};
    mg_config_t *later = config_with(gone, 1);
    CHECK(later && mg_pool_get_at(&p, 0, &later->providers[0]) == NULL);
    mg_config_free(later);
    mg_pool_free(&p);
    mg_config_free(cfg);
    mg_config_free(was);
}

static void test_record_and_available(void)
{
    const char *ids[] = {"a"};
    mg_config_t *cfg = config_with(ids, 1);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    mg_provider_state_t *s = mg_pool_get(&p, "a");
    CHECK(s != NULL);
    if (s) {
        mg_pool_record(s, 0);
        mg_pool_record(s, 0);
        CHECK_EQ_INT(s->consecutive_failures, 2);
        CHECK_EQ_INT(s->failures_total, 2);
        mg_pool_record(s, 1);
        CHECK_EQ_INT(s->consecutive_failures, 0);
        CHECK_EQ_INT(s->failures_total, 2);
        s->disabled = 1;
        CHECK(!mg_pool_available(s, 0));
        s->disabled = 0;
        CHECK(mg_pool_available(s, 0));
    }
    mg_pool_free(&p);
    mg_config_free(cfg);
}

/* A reload that keeps beta, drops alpha, adds delta and reorders: beta keeps its
 * counters, delta starts fresh, alpha is gone. */
static void test_sync_keeps_state_by_id(void)
{
    const char *ids1[] = {"alpha", "beta", "gamma"};
    const char *ids2[] = {"gamma", "delta", "beta"};
    mg_config_t *c1 = config_with(ids1, 3);
    mg_config_t *c2 = config_with(ids2, 3);
    CHECK(c1 && c2);
    if (!c1 || !c2) {
        mg_config_free(c1);
        mg_config_free(c2);
        return;
    }
    c2->providers[2].disabled = true; /* beta, disabled by an operator (a stored provider) */
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    mg_provider_state_t *b = mg_pool_get(&p, "beta");
    mg_provider_state_t *g = mg_pool_get(&p, "gamma");
    CHECK(b && g);
    if (!b || !g) return;
    b->in_flight = 4;
    b->requests_total = 100;
    b->failures_total = 7;
    b->consecutive_failures = 2;
    g->requests_total = 55;
    mg_pool_get(&p, "alpha")->requests_total = 9;

    CHECK_EQ_INT(mg_pool_sync(&p, c2), 0);
    CHECK_EQ_INT(p.n, 3);
    CHECK(mg_pool_get(&p, "alpha") == NULL);
    b = mg_pool_get(&p, "beta");
    CHECK(b != NULL);
    if (b) {
        CHECK_EQ_INT(b->in_flight, 4);
        CHECK_EQ_INT(b->requests_total, 100);
        CHECK_EQ_INT(b->failures_total, 7);
        CHECK_EQ_INT(b->consecutive_failures, 2);
        CHECK_EQ_INT(b->disabled, 1); /* follows the config */
        CHECK(!mg_pool_available(b, 0));
    }
    g = mg_pool_get(&p, "gamma");
    CHECK(g && g->requests_total == 55);
    mg_provider_state_t *d = mg_pool_get(&p, "delta");
    CHECK(d != NULL);
    if (d) {
        CHECK_EQ_INT(d->requests_total, 0);
        CHECK_EQ_INT(d->in_flight, 0);
        CHECK(mg_pool_available(d, 0));
    }
    /* the state array follows the new config's order */
    for (size_t i = 0; i < p.n; i++) CHECK_STR(p.items[i].id, ids2[i]);

    /* syncing the same config again changes nothing */
    CHECK_EQ_INT(mg_pool_sync(&p, c2), 0);
    b = mg_pool_get(&p, "beta");
    CHECK(b && b->requests_total == 100 && b->in_flight == 4);

    /* back to the first config: alpha comes back fresh (its old state was dropped) */
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    mg_provider_state_t *a = mg_pool_get(&p, "alpha");
    CHECK(a && a->requests_total == 0);
    CHECK(mg_pool_get(&p, "delta") == NULL);
    b = mg_pool_get(&p, "beta");
    CHECK(b && b->requests_total == 100);

    mg_pool_free(&p);
    mg_config_free(c1);
    mg_config_free(c2);
}

static void test_sync_to_empty(void)
{
    const char *ids[] = {"a", "b"};
    mg_config_t *c1 = config_with(ids, 2);
    mg_config_t *c0 = config_with(NULL, 0);
    CHECK(c1 && c0);
    if (!c1 || !c0) {
        mg_config_free(c1);
        mg_config_free(c0);
        return;
    }
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    CHECK_EQ_INT(mg_pool_sync(&p, c0), 0);
    CHECK_EQ_INT(p.n, 0);
    CHECK(mg_pool_get(&p, "a") == NULL);
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    CHECK_EQ_INT(p.n, 2);
    mg_pool_free(&p);
    mg_config_free(c1);
    mg_config_free(c0);
}

/* ---- route breakers ------------------------------------------------------------------ */

/* Provider p serves up-a and up-b (up-a for two logical models), q serves up-a too. */
static mg_config_t *routes_config(int open_s)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof(yaml),
                     "circuit_breaker: { consecutive_failures: 3, open_duration_seconds: %d }\n"
                     "providers:\n"
                     "  - { id: p, adapter: openai, base_url: \"http://127.0.0.1:9001/v1\" }\n"
                     "  - { id: q, adapter: openai, base_url: \"http://127.0.0.1:9002/v1\" }\n"
                     "models:\n"
                     "  a:  { routes: [ { provider: p, model: up-a },\n"
                     "                  { provider: q, model: up-a } ] }\n"
                     "  a2: { routes: [ { provider: p, model: up-a } ] }\n"
                     "  b:  { routes: [ { provider: p, model: up-b } ] }\n",
                     open_s);
    mg_config_t *cfg = NULL;
    if (mg_config_parse("routes.yaml", yaml, (size_t)n, &cfg, err_buf, sizeof(err_buf)) != 0) {
        fprintf(stderr, "config error: %s\n", err_buf);
        return NULL;
    }
    return cfg;
}

static void test_routes_one_state_per_pair(void)
{
    mg_config_t *cfg = routes_config(30);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    CHECK_EQ_INT(p.routes.n, 3); /* (p, up-a) once, though models a and a2 both list it */
    mg_route_state_t *pa = mg_pool_route(&p, "p", "up-a");
    CHECK(pa != NULL && pa != mg_pool_route(&p, "q", "up-a"));
    CHECK(mg_pool_route(&p, "p", "up-b") != NULL);
    CHECK(mg_pool_route(&p, "q", "up-b") == NULL); /* not a route of the config */
    CHECK(mg_pool_route(&p, "p", "up-") == NULL);
    CHECK(mg_pool_route(&p, "p", NULL) == NULL);
    if (pa) {
        CHECK_STR(pa->provider, "p");
        CHECK_STR(pa->model, "up-a");
        CHECK(pa->model != cfg->models[0].routes[0].model); /* its own copy */
        CHECK_EQ_INT(pa->breaker.cfg.consecutive_failures, 3);
    }
    mg_pool_free(&p);
    CHECK_EQ_INT(p.routes.n, 0);
    mg_config_free(cfg);
}

/* Model up-a failing on p opens (p, up-a) only: p and (p, up-b) keep serving. */
static void test_route_failures_open_the_route_only(void)
{
    mg_config_t *cfg = routes_config(30);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    mg_provider_state_t *ps = mg_pool_get(&p, "p");
    mg_route_state_t *a = mg_pool_route(&p, "p", "up-a"), *b = mg_pool_route(&p, "p", "up-b");
    uint64_t t = 1000;
    for (int i = 0; i < 3; i++) {
        CHECK(mg_pool_breakers_allow(ps, a, t));
        mg_pool_breakers_record(ps, a, t, MG_ATTEMPT_FAILED);
    }
    CHECK_EQ_INT(mg_breaker_state(&a->breaker, t), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_breaker_state(&ps->breaker, t), MG_BREAKER_CLOSED);
    CHECK(!mg_pool_route_available(ps, a, t));
    CHECK(mg_pool_route_available(ps, b, t));
    CHECK(mg_pool_available(ps, t));
    CHECK(!mg_pool_breakers_allow(ps, a, t));
    CHECK(mg_pool_breakers_allow(ps, b, t));
    mg_pool_breakers_record(ps, b, t, MG_ATTEMPT_OK);
    CHECK_EQ_INT(mg_pool_breaker_state(ps, a, t), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_pool_breaker_state(ps, b, t), MG_BREAKER_CLOSED);
    CHECK_EQ_INT(mg_pool_provider_breaker(&p, ps, t), MG_BREAKER_CLOSED); /* up-b serves */
    CHECK(mg_pool_breakers_retry_ms(ps, a, t) == 30000);
    CHECK(mg_pool_breakers_retry_ms(ps, b, t) == 0);
    /* 30 s later one probe goes through; its success closes the route */
    t += 30000;
    CHECK_EQ_INT(mg_pool_breaker_state(ps, a, t), MG_BREAKER_HALF_OPEN);
    CHECK(mg_pool_breakers_allow(ps, a, t));
    CHECK(!mg_pool_breakers_allow(ps, a, t)); /* one probe at a time */
    mg_pool_breakers_record(ps, a, t, MG_ATTEMPT_OK);
    CHECK_EQ_INT(mg_breaker_state(&a->breaker, t), MG_BREAKER_CLOSED);
    mg_pool_free(&p);
    mg_config_free(cfg);
}

/* Connection failures open the provider: every route of it is out. */
static void test_unreachable_opens_the_provider(void)
{
    mg_config_t *cfg = routes_config(30);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    mg_provider_state_t *ps = mg_pool_get(&p, "p"), *qs = mg_pool_get(&p, "q");
    mg_route_state_t *a = mg_pool_route(&p, "p", "up-a"), *b = mg_pool_route(&p, "p", "up-b");
    mg_route_state_t *qa = mg_pool_route(&p, "q", "up-a");
    uint64_t t = 1000;
    for (int i = 0; i < 3; i++)
        mg_pool_breakers_record(ps, i % 2 ? a : b, t, MG_ATTEMPT_UNREACHABLE);
    CHECK_EQ_INT(mg_breaker_state(&ps->breaker, t), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_breaker_state(&a->breaker, t), MG_BREAKER_CLOSED); /* not the model's fault */
    CHECK(!mg_pool_route_available(ps, a, t) && !mg_pool_route_available(ps, b, t));
    CHECK(mg_pool_route_available(qs, qa, t));
    CHECK_EQ_INT(mg_pool_breaker_state(ps, b, t), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_pool_provider_breaker(&p, ps, t), MG_BREAKER_OPEN);
    mg_pool_free(&p);
    mg_config_free(cfg);
}

/* Probe slots: a route probe given back when the provider refuses, or when the connection
 * fails (the route was not tried); every route open makes the provider open as a whole. */
static void test_route_probe_slots(void)
{
    mg_config_t *cfg = routes_config(1);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    mg_provider_state_t *ps = mg_pool_get(&p, "p");
    mg_route_state_t *a = mg_pool_route(&p, "p", "up-a"), *b = mg_pool_route(&p, "p", "up-b");
    uint64_t t = 1000;
    for (int i = 0; i < 3; i++) {
        mg_pool_breakers_record(ps, a, t, MG_ATTEMPT_FAILED);
        mg_pool_breakers_record(ps, b, t, MG_ATTEMPT_FAILED);
    }
    CHECK_EQ_INT(mg_pool_provider_breaker(&p, ps, t), MG_BREAKER_OPEN); /* no model serves */
    t += 1000;                                                          /* both routes half open */
    CHECK_EQ_INT(mg_pool_provider_breaker(&p, ps, t), MG_BREAKER_HALF_OPEN);
    CHECK(mg_pool_breakers_allow(ps, a, t));
    mg_pool_breakers_record(ps, a, t, MG_ATTEMPT_UNREACHABLE); /* probe slot back, route untried */
    CHECK_EQ_INT(mg_breaker_state(&a->breaker, t), MG_BREAKER_HALF_OPEN);
    CHECK(mg_pool_breakers_allow(ps, a, t));
    mg_pool_breakers_release(ps, a, t); /* not sent after all */
    CHECK(mg_pool_breakers_allow(ps, a, t));
    mg_pool_breakers_record(ps, a, t, MG_ATTEMPT_FAILED); /* a failed probe opens it again */
    CHECK_EQ_INT(mg_breaker_state(&a->breaker, t), MG_BREAKER_OPEN);
    /* provider and route half open, the route's probe out: the attempt is refused and
       the provider's probe slot given back */
    for (int i = 0; i < 3; i++) mg_pool_breakers_record(ps, b, t, MG_ATTEMPT_UNREACHABLE);
    CHECK_EQ_INT(mg_breaker_state(&ps->breaker, t), MG_BREAKER_OPEN);
    t += 1000;
    CHECK(mg_pool_breakers_allow(NULL, a, t)); /* the route's one probe */
    CHECK(!mg_pool_breakers_allow(ps, a, t));
    CHECK_EQ_INT(ps->breaker.probes, 0);
    CHECK(mg_pool_breakers_allow(ps, b, t)); /* the provider's probe is still free */
    mg_pool_free(&p);
    mg_config_free(cfg);
}

/* A route the config does not list (a prefix-served name) has no breaker: its failures
 * count against the provider. */
static void test_unlisted_route_counts_for_the_provider(void)
{
    mg_config_t *cfg = routes_config(30);
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, cfg), 0);
    mg_provider_state_t *ps = mg_pool_get(&p, "q");
    for (int i = 0; i < 3; i++) mg_pool_breakers_record(ps, NULL, 1000, MG_ATTEMPT_FAILED);
    CHECK_EQ_INT(mg_breaker_state(&ps->breaker, 1000), MG_BREAKER_OPEN);
    CHECK_EQ_INT(mg_pool_breaker_state(ps, NULL, 1000), MG_BREAKER_OPEN);
    mg_pool_free(&p);
    mg_config_free(cfg);
}

/* A reload keeps a route's breaker by (provider, model), with the new settings; a route
 * the new config drops is gone, and comes back fresh. */
static void test_route_state_across_reloads(void)
{
    mg_config_t *c1 = routes_config(30), *c2 = routes_config(5);
    const char *ids[] = {"p"};
    mg_config_t *c3 = config_with(ids, 1); /* p serving model x only */
    CHECK(c1 && c2 && c3);
    if (!c1 || !c2 || !c3) {
        mg_config_free(c1);
        mg_config_free(c2);
        mg_config_free(c3);
        return;
    }
    mg_pool_t p;
    mg_pool_init(&p);
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    mg_provider_state_t *ps = mg_pool_get(&p, "p");
    for (int i = 0; i < 3; i++)
        mg_pool_breakers_record(ps, mg_pool_route(&p, "p", "up-a"), 1000, MG_ATTEMPT_FAILED);
    CHECK_EQ_INT(mg_pool_sync(&p, c2), 0);
    mg_route_state_t *a = mg_pool_route(&p, "p", "up-a");
    CHECK(a != NULL);
    if (a) {
        CHECK_EQ_INT(mg_breaker_state(&a->breaker, 1000), MG_BREAKER_OPEN);
        CHECK_EQ_INT(a->breaker.cfg.open_duration_seconds, 5);
        CHECK_EQ_INT(a->breaker.trips, 1);
    }
    CHECK_EQ_INT(mg_pool_sync(&p, c3), 0);
    CHECK_EQ_INT(p.routes.n, 1);
    CHECK(mg_pool_route(&p, "p", "up-a") == NULL);
    CHECK(mg_pool_route(&p, "p", "x") != NULL);
    CHECK_EQ_INT(mg_pool_sync(&p, c1), 0);
    a = mg_pool_route(&p, "p", "up-a");
    CHECK(a && mg_breaker_state(&a->breaker, 1000) == MG_BREAKER_CLOSED && a->breaker.trips == 0);
    mg_pool_free(&p);
    mg_config_free(c1);
    mg_config_free(c2);
    mg_config_free(c3);
}

int main(void)
{
    MG_RUN(test_init_empty);
    MG_RUN(test_sync_adds_fresh_state);
    MG_RUN(test_record_and_available);
    MG_RUN(test_sync_keeps_state_by_id);
    MG_RUN(test_get_at_index);
    MG_RUN(test_sync_to_empty);
    MG_RUN(test_routes_one_state_per_pair);
    MG_RUN(test_route_failures_open_the_route_only);
    MG_RUN(test_unreachable_opens_the_provider);
    MG_RUN(test_route_probe_slots);
    MG_RUN(test_unlisted_route_counts_for_the_provider);
    MG_RUN(test_route_state_across_reloads);
    return mg_test_summary();
}
