/* Unit tests for core/route/facts.c: a route's description for routing is kept (in the
 * generation's keep, luavm/keep.h) within one loop millisecond while neither its provider's
 * nor its route's state changed, and described afresh after any change that says so
 * (mg_pool_changed, the breakers), a new millisecond or a pool sync. */
#include "conf/config.h"
#include "route/facts.h"
#include "mgtest.h"
#include "route/pool.h"

#include <stdio.h>
#include <string.h>

static const char yaml[] =
    "providers:\n"
    "  - { id: a, adapter: openai, base_url: \"http://127.0.0.1:9001/v1\", rpm_limit: 100 }\n"
    "  - { id: b, adapter: openai, base_url: \"http://127.0.0.1:9002/v1\" }\n"
    "models:\n"
    "  m:\n"
    "    routes: [ { provider: a, model: x }, { provider: b, model: y } ]\n";

typedef struct fixture_s {
    mg_config_t *cfg;
    mg_pool_t pool;
    mg_keep_t *keep;
    const mg_provider_conf_t *p;
    const mg_route_conf_t *r;
    mg_provider_state_t *ps;
    mg_route_state_t *rs;
} fixture_t;

static int setup(fixture_t *f)
{
    char err[512];
    memset(f, 0, sizeof(*f));
    if (mg_config_parse("facts.yaml", yaml, sizeof(yaml) - 1, &f->cfg, err, sizeof(err)) != 0) {
        fprintf(stderr, "config: %s\n", err);
        return -1;
    }
    mg_config_link_routes(f->cfg);
    f->keep = mg_keep_new(f->cfg, 0);
    mg_pool_init(&f->pool);
    if (mg_pool_sync(&f->pool, f->cfg) != 0) return -1;
    f->r = &mg_config_model(f->cfg, "m")->routes[0];
    f->p = mg_config_route_provider(f->cfg, f->r);
    f->ps = mg_pool_get(&f->pool, "a");
    f->rs = mg_pool_route_of(&f->pool, f->r);
    return f->p && f->ps && f->rs && f->keep ? 0 : -1;
}

static void teardown(fixture_t *f)
{
    mg_keep_free(f->keep, NULL);
    mg_pool_free(&f->pool);
    mg_config_free(f->cfg);
}

/* Describe the fixture's route at now; returns 1 when the kept description answered. */
static int describe(fixture_t *f, uint64_t now, mg_candidate_t *out)
{
    uint64_t described, kept, after;
    mg_keep_facts_counts(f->keep, &described, &kept);
    mg_facts_describe(f->keep, &f->pool, f->p, f->r, f->ps, f->rs, now, out);
    mg_keep_facts_counts(f->keep, &described, &after);
    return after > kept;
}

static void test_kept_within_the_millisecond(void)
{
    fixture_t f;
    CHECK_EQ_INT(setup(&f), 0);
    mg_candidate_t a, b;
    CHECK(!describe(&f, 1000, &a));
    CHECK(describe(&f, 1000, &b));
    CHECK(memcmp(&a, &b, sizeof(a)) == 0); /* the serial too: the same description */
    CHECK(a.serial != 0);
    CHECK(a.provider == f.p && a.route == f.r);
    CHECK_EQ_INT(a.available, 1);
    CHECK_EQ_INT(a.rpm_limit, 100);
    CHECK(!describe(&f, 1001, &b)); /* a new millisecond: afresh... */
    CHECK(b.serial == a.serial);    /* ... but what did not change is the same description */
    CHECK(describe(&f, 1001, &b));
    /* a change is a new description, with a new serial */
    mg_pool_changed(f.ps);
    f.ps->in_flight++;
    CHECK(!describe(&f, 1001, &b));
    CHECK(b.serial != a.serial && b.in_flight == 1);
    teardown(&f);
}

static void test_changes_are_seen_at_once(void)
{
    fixture_t f;
    CHECK_EQ_INT(setup(&f), 0);
    mg_candidate_t c;
    describe(&f, 5000, &c);
    CHECK_EQ_INT(c.in_flight, 0);
    /* an attempt starts: in_flight and the RPM window */
    mg_limiter_resv_t resv;
    mg_pool_changed(f.ps);
    f.ps->in_flight++;
    CHECK_EQ_INT(mg_limiter_reserve(&f.ps->limiter, 5000, 10, &resv), MG_LIMIT_OK);
    CHECK(!describe(&f, 5000, &c));
    CHECK_EQ_INT(c.in_flight, 1);
    CHECK_EQ_INT(c.rpm_used, 1);
    CHECK(c.headroom < 1);
    /* a 429 cools the provider down: the very next decision sees it */
    mg_pool_changed(f.ps);
    mg_cooldown_apply(&f.ps->cooldown, 5000, 30);
    CHECK(!describe(&f, 5000, &c));
    CHECK_EQ_INT(c.cooling, 1);
    CHECK(c.cooldown_remaining_ms > 0);
    /* the route's own breaker opening (three failed answers) */
    for (int i = 0; i < 3; i++) mg_pool_breakers_record(f.ps, f.rs, 5000, MG_ATTEMPT_FAILED);
    CHECK(!describe(&f, 5000, &c));
    CHECK(strcmp(c.route_breaker, "open") == 0);
    CHECK_EQ_INT(c.available, 0);
    CHECK(describe(&f, 5000, &c));
    teardown(&f);
}

/* The limits described are the ones the limiter enforces (the newest config's, after a
 * sync), not those of the config the caller holds: try_next's count of the candidates a
 * rate limit refuses must agree with mg_limiter_reserve. */
static void test_limits_are_the_limiters(void)
{
    fixture_t f;
    CHECK_EQ_INT(setup(&f), 0);
    mg_candidate_t c;
    CHECK_EQ_INT(mg_limiter_set_limits(&f.ps->limiter, 7, 500), 0);
    mg_pool_changed(f.ps);
    describe(&f, 8000, &c);
    CHECK_EQ_INT(c.rpm_limit, 7);
    CHECK(c.tpm_limit == 500);
    CHECK_EQ_INT(f.p->rpm_limit, 100); /* the config this call holds says otherwise */
    teardown(&f);
}

/* The contract: a change made without saying so is not seen until the next millisecond. */
static void test_unannounced_change_lasts_a_millisecond_at_most(void)
{
    fixture_t f;
    CHECK_EQ_INT(setup(&f), 0);
    mg_candidate_t c;
    describe(&f, 7000, &c);
    f.ps->in_flight = 5;
    CHECK(describe(&f, 7000, &c));
    CHECK_EQ_INT(c.in_flight, 0);
    CHECK(!describe(&f, 7001, &c));
    CHECK_EQ_INT(c.in_flight, 5);
    teardown(&f);
}

static void test_sync_and_other_routes(void)
{
    fixture_t f;
    CHECK_EQ_INT(setup(&f), 0);
    mg_candidate_t c;
    describe(&f, 9000, &c);
    /* a sync makes new state arrays: nothing kept survives it */
    CHECK_EQ_INT(mg_pool_sync(&f.pool, f.cfg), 0);
    f.ps = mg_pool_get(&f.pool, "a");
    f.rs = mg_pool_route_of(&f.pool, f.r);
    CHECK(!describe(&f, 9000, &c));
    /* another route keeps its own description */
    const mg_route_conf_t *r2 = &mg_config_model(f.cfg, "m")->routes[1];
    const mg_provider_conf_t *p2 = mg_config_route_provider(f.cfg, r2);
    mg_provider_state_t *ps2 = mg_pool_get(&f.pool, "b");
    mg_route_state_t *rs2 = mg_pool_route_of(&f.pool, r2);
    mg_candidate_t d;
    uint64_t described, kept, now_described;
    mg_keep_facts_counts(f.keep, &described, &kept);
    mg_facts_describe(f.keep, &f.pool, p2, r2, ps2, rs2, 9000, &d);
    mg_keep_facts_counts(f.keep, &now_described, &kept);
    CHECK(now_described == described + 1);
    CHECK(d.provider == p2 && d.rpm_limit == 0);
    CHECK(describe(&f, 9000, &c)); /* route 1's is still kept */
    CHECK(c.provider == f.p);
    /* a route the config does not list (no route state) is always described afresh */
    mg_keep_facts_counts(f.keep, &described, &kept);
    mg_facts_describe(f.keep, &f.pool, f.p, f.r, f.ps, NULL, 9000, &c);
    mg_facts_describe(f.keep, &f.pool, f.p, f.r, f.ps, NULL, 9000, &c);
    mg_keep_facts_counts(f.keep, &now_described, &kept);
    CHECK(now_described == described + 2);
    teardown(&f);
}

int main(void)
{
    MG_RUN(test_kept_within_the_millisecond);
    MG_RUN(test_changes_are_seen_at_once);
    MG_RUN(test_limits_are_the_limiters);
    MG_RUN(test_unannounced_change_lasts_a_millisecond_at_most);
    MG_RUN(test_sync_and_other_routes);
    return mg_test_summary();
}
