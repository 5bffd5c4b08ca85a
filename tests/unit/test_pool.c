/* Unit tests for core/pool.c: provider runtime state kept by id across config syncs,
 * providers added and removed, availability and failure accounting. */
#include "config.h"
#include "mgtest.h"
#include "pool.h"

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
    for (size_t i = 0; i < p.n; i++)
        CHECK_STR(p.items[i].id, ids2[i]);

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

int main(void)
{
    MG_RUN(test_init_empty);
    MG_RUN(test_sync_adds_fresh_state);
    MG_RUN(test_record_and_available);
    MG_RUN(test_sync_keeps_state_by_id);
    MG_RUN(test_sync_to_empty);
    return mg_test_summary();
}
