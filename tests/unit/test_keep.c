/* Unit tests for what the core keeps around the Lua calls (core/luavm/keep.c, trace.c,
 * replay.c): the views route() gets, the plans kept under exactly the fields route() read and
 * given again (their moongate steps run in C with each request's numbers) while those fields
 * are unchanged, the step functions asked again only when what they read changed, the plans
 * of the shipped policy given again exactly as route() itself would give them, and encode
 * answers kept under the request fields encode read. */
#include "luavm_fixture.h"
#include "luavm/keep.h"
#include "luavm/order.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* The routes of model m in the generation's own config (the ones with slots). */
static int config_cands(mg_gen_t *g, mg_candidate_t *c, const int *routes, int n)
{
    const mg_model_conf_t *m = mg_config_model(g->cfg, "m");
    int avail[3] = {1, 1, 1};
    mg_candidate_t all[3];
    make_cands(g, all, avail);
    for (int i = 0; i < n; i++) {
        c[i] = all[routes[i]];
        c[i].route = &m->routes[routes[i]];
    }
    return n;
}

static int lua_int(mg_gen_t *g, const char *global)
{
    lua_getglobal(g->L, global);
    int n = (int)lua_tointeger(g->L, -1);
    lua_pop(g->L, 1);
    return n;
}

/* One routing call of a request that has no table yet. Returns the plan's length (-1 on an
 * error); *kept and *made: whether the plan was kept, whether a request table was made. */
static int call(mg_gen_t *g, const mg_lua_req_t *info, int attempt, int limit, int fresh,
                const mg_candidate_t *c, int n, mg_plan_entry_t *entries, int *kept, int *made)
{
    int rr = -1;
    mg_plan_t plan = {.entries = entries, .limit = limit, .fresh = fresh};
    err[0] = '\0';
    int rc = mg_gen_route(g, info, &rr, attempt, c, n, &plan, err, sizeof(err));
    if (kept) *kept = plan.kept;
    if (made) *made = rr >= 0;
    if (rr >= 0) mg_gen_req_release(g, rr);
    if (rc != 0) fprintf(stderr, "  route: %s\n", err);
    return rc == 0 ? plan.n : -1;
}

static mg_lua_req_t a_request(const char *model)
{
    return (mg_lua_req_t){.request_id = "req-keep",
                          .endpoint = "chat",
                          .model = model,
                          .max_tokens = -1,
                          .created = 1,
                          .priority = "P2",
                          .allow_cloud = 1,
                          .local_first = 1,
                          .random = 0.25};
}

/* ---- the views -------------------------------------------------------------------------- */

/* clang-format off */
static const char *viewing_routing =
    "local M = { name = 'routing', version = 1, cache = false }\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  lists, reqs = lists or {}, reqs or {}\n"
    "  lists[calls], reqs[calls] = c, req\n"
    "  if req.model == 'mark' then\n"
    "    c[1].degraded, c[1].emergency = 'fallback', true\n"
    "    c[2].note = 'mine'\n"
    "    return { c[1], c[2] }\n"
    "  elseif req.model == 'markboom' then\n"
    "    c[2].degraded = 'cloud'\n"
    "    error('failed after marking')\n"
    "  end\n"
    "  local p = {}\n"
    "  for i = 1, #c do p[i] = c[i] end\n"
    "  return p\n"
    "end\n"
    "return M\n";
/* clang-format on */

static int route_views(mg_gen_t *g, const char *model, const mg_candidate_t *c, int n, int *order,
                       const char **degraded, int *emergency)
{
    mg_lua_req_t info = a_request(model);
    mg_plan_entry_t entries[4];
    int got = call(g, &info, 1, 0, 0, c, n, entries, NULL, NULL);
    for (int i = 0; i < got; i++) {
        order[i] = entries[i].index;
        if (degraded) degraded[i] = entries[i].degraded;
        if (emergency) emergency[i] = entries[i].emergency;
    }
    return got;
}

static void test_views(void)
{
    mg_gen_t *g = load_routing(viewing_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2}, last2[2] = {1, 2};
    mg_candidate_t c[3];
    int order[4];
    config_cands(g, c, all3, 3);
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    c[0].in_flight = 9;
    c[0].available = 0;
    c[0].breaker = c[0].route_breaker = "open";
    c[2].success_rate = 0.5;
    c[2].load_known = 1;
    c[2].load_waiting = 3;
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    /* a route keeps one view; each call shows its facts; the config fields are the route's */
    lua_expect(
        g,
        "local a, b = lists[1], lists[2]\n"
        "return tostring(a[1] == b[1] and rawequal(a[3], b[3])) .. ' ' ..\n"
        "  b[1].in_flight .. ' ' .. tostring(b[1].available) .. ' ' ..\n"
        "  b[1].breaker .. ' ' .. b[1].route_breaker .. ' ' .. tostring(b[2].route_breaker) ..\n"
        "  ' ' .. tostring(b[3].success_rate) .. ' ' .. b[3].provider .. ' ' .. b[3].pool ..\n"
        "  ' ' .. tostring(b[2].success_rate) .. ' ' .. b[3].load.waiting .. ' ' ..\n"
        "  tostring(b[1].weight) .. ' ' .. tostring(b[3]['local'])",
        "true 9 false open open nil 0.5 ol fallback nil 3 1.0 true");
    /* pairs() gives every field; the request view gives the request's */
    lua_expect(g,
               "local n, seen = 0, {}\n"
               "for k, v in pairs(lists[2][3]) do n = n + 1 seen[k] = v end\n"
               "local r = reqs[2]\n"
               "return n .. ' ' .. seen.provider .. ' ' .. tostring(seen.cooling) .. ' ' ..\n"
               "  r.request_id .. ' ' .. r.model .. ' ' .. r.attempt .. ' ' .. tostring(r.pin)",
               "26 ol false req-keep m 1 nil");
    /* markers: read into the plan, then cleared from the views; what else the policy wrote
       into a view is gone too */
    const char *deg[4] = {0};
    int emg[4] = {0};
    CHECK_EQ_INT(route_views(g, "mark", c, 3, order, deg, emg), 2);
    CHECK_STR(deg[0], "fallback");
    CHECK_EQ_INT(emg[0], 1);
    CHECK(deg[1] == NULL && emg[1] == 0);
    lua_expect(g,
               "local l = lists[3]\n"
               "return tostring(l[1].degraded) .. tostring(l[1].emergency) .. tostring(l[2].note)",
               "nilnilnil");
    /* a policy that fails after marking leaves no marker behind */
    CHECK_EQ_INT(route_views(g, "markboom", c, 3, order, NULL, NULL), -1);
    lua_expect(g, "return tostring(lists[4][2].degraded)", "nil");
    /* part of the routes: the views say their place in this list, and the next call over all
       of them theirs again */
    config_cands(g, c, last2, 2);
    CHECK_EQ_INT(route_views(g, "m", c, 2, order, NULL, NULL), 2);
    CHECK(order[0] == 0 && order[1] == 1);
    lua_expect(g,
               "local l = lists[#lists]\n"
               "return l[1].index .. l[2].index .. ' ' .. l[1].provider .. ' ' ..\n"
               "  tostring(rawequal(l[1], lists[1][2]))",
               "12 oa-nokey true");
    config_cands(g, c, all3, 3);
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "local l = lists[#lists] return l[1].index .. l[2].index .. l[3].index", "123");
    /* a route given twice: two tables */
    c[1].route = c[0].route;
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    CHECK(order[0] == 0 && order[1] == 1 && order[2] == 2);
    lua_expect(g, "local l = lists[#lists] return tostring(l[1] ~= l[2]) .. l[2].index", "true2");
    /* routes outside the config get fresh tables */
    int avail[3] = {1, 1, 1};
    make_cands(g, c, avail);
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    CHECK_EQ_INT(route_views(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "local n = #lists return tostring(lists[n][1] ~= lists[n - 1][1])", "true");
    /* M.cache = false: route() ran for every call */
    CHECK_EQ_INT(lua_int(g, "calls"), 9);
    unload_routing(g);
}

/* ---- plans kept under what route() read --------------------------------------------------- */

/* clang-format off */
static const char *reading_routing =
    "local M = { name = 'routing', version = 1 }\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  if req.model == 'boom' then error('policy exploded') end\n"
    "  if req.model == 'wait' then return { wait_ms = 5 } end\n"
    "  if req.model == 'busy' and c[1].in_flight > 100 then return {} end\n"
    "  if req.model == 'own' then local _ = req.request_id end\n"
    "  if req.model == 'clock' then moongate.now_ms() end\n"
    "  if req.model == 'pinned' and req.pin then return { c[1] } end\n"
    "  if req.model == 'write' then req.mine = 1 end\n"
    "  local p = {}\n"
    "  for i = #c, 1, -1 do if c[i].available then p[#p + 1] = c[i] end end\n"
    "  if req.model == 'marked' then p[1].degraded = 'fallback' end\n"
    "  return p\n"
    "end\n"
    "moongate = require('moongate')\n"
    "return M\n";
/* clang-format on */

static void test_kept_plans(void)
{
    mg_gen_t *g = load_routing(reading_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2};
    mg_candidate_t c[3];
    config_cands(g, c, all3, 3);
    mg_plan_entry_t e[3];
    int kept = 0, made = 0;
    mg_lua_req_t req = a_request("m");
    /* the first request asks the policy; the next ones get its plan without a call and
       without a request table, whatever their numbers and the fields route() did not read
       (but for the request's routing fields, pool, pin, local_only, ..., and the candidates'
       state, available, cooling, health, the breakers, ...: always part of the key) */
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, &made), 3);
    CHECK(e[0].index == 2 && e[1].index == 1 && e[2].index == 0);
    CHECK(!kept && made);
    CHECK_EQ_INT(lua_int(g, "calls"), 1);
    mg_lua_req_t other = req;
    other.request_id = "req-2";
    other.random = 0.9;
    other.max_tokens = 500;
    other.priority = "P0";
    other.stream = 1;
    c[0].in_flight = 40;
    c[1].headroom = 0.1;
    c[2].success_rate = 0.5;
    c[2].ttft_ms = 900;
    memset(e, 0xff, sizeof(e));
    CHECK_EQ_INT(call(g, &other, 1, 0, 0, c, 3, e, &kept, &made), 3);
    CHECK(e[0].index == 2 && e[1].index == 1 && e[2].index == 0);
    CHECK(e[0].degraded == NULL && !e[0].emergency);
    CHECK(kept && !made);
    CHECK_EQ_INT(lua_int(g, "calls"), 1);
    /* at a later attempt too (this policy did not read req.attempt) */
    CHECK_EQ_INT(call(g, &req, 3, 0, 0, c, 3, e, &kept, NULL), 3);
    CHECK(kept);
    /* a candidate's state is always part of the key: a breaker opening asks again */
    c[2].breaker = "open";
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, NULL), 3);
    CHECK(!kept);
    CHECK_EQ_INT(lua_int(g, "calls"), 2);
    c[2].breaker = "closed";
    /* a field it read changes: asked again, and that plan kept too */
    c[1].available = 0;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, NULL), 2);
    CHECK(e[0].index == 2 && e[1].index == 0 && !kept);
    CHECK_EQ_INT(lua_int(g, "calls"), 3);
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, NULL), 2);
    CHECK(kept);
    c[1].available = 1;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, NULL), 3);
    CHECK(kept); /* (the first plan was kept beside it) */
    CHECK_EQ_INT(lua_int(g, "calls"), 3);
    /* the request fields it read are the key (model here) and the routing fields: pin for
       'pinned' */
    mg_lua_req_t pinned = a_request("pinned"), pinned_b;
    CHECK_EQ_INT(call(g, &pinned, 1, 0, 0, c, 3, e, &kept, NULL), 3);
    pinned_b = pinned;
    pinned_b.pin = "oa";
    CHECK_EQ_INT(call(g, &pinned_b, 1, 0, 0, c, 3, e, &kept, NULL), 1);
    CHECK(!kept);
    pinned_b.pin = strdup("oa"); /* the same text elsewhere: the same key */
    CHECK_EQ_INT(call(g, &pinned_b, 1, 0, 0, c, 3, e, &kept, NULL), 1);
    CHECK(kept);
    free((char *)pinned_b.pin);
    /* a different candidate list is asked about */
    int before = lua_int(g, "calls");
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 2, e, &kept, NULL), 2);
    CHECK(!kept);
    CHECK_EQ_INT(lua_int(g, "calls"), before + 1);
    /* fresh: asked, and what it says not kept */
    before = lua_int(g, "calls");
    CHECK_EQ_INT(call(g, &req, 1, 0, 1, c, 3, e, &kept, NULL), 3);
    CHECK(!kept);
    CHECK_EQ_INT(lua_int(g, "calls"), before + 1);
    /* never kept: what read a moving number, the request's own fields or the clock, wrote to
       the request, or raised; asked each time */
    const char *never[] = {"busy", "own", "clock", "write", "boom"};
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
        mg_lua_req_t r = a_request(never[i]);
        before = lua_int(g, "calls");
        int want = strcmp(never[i], "boom") == 0 ? -1 : 3;
        CHECK_EQ_INT(call(g, &r, 1, 0, 0, c, 3, e, &kept, NULL), want);
        CHECK_EQ_INT(call(g, &r, 1, 0, 0, c, 3, e, &kept, NULL), want);
        CHECK(!kept);
        CHECK_EQ_INT(lua_int(g, "calls"), before + 2);
    }
    /* a wait that read nothing that moves is kept as any plan; markers are kept with a plan */
    mg_lua_req_t wait = a_request("wait"), marked = a_request("marked");
    for (int i = 0; i < 2; i++) {
        mg_plan_t plan = {.entries = e};
        int rr = -1;
        CHECK_EQ_INT(mg_gen_route(g, &wait, &rr, 1, c, 3, &plan, err, sizeof(err)), 0);
        CHECK_EQ_INT(plan.wait_ms, 5);
        CHECK_EQ_INT(plan.kept, i);
        if (rr >= 0) mg_gen_req_release(g, rr);
        memset(e, 0, sizeof(e));
        CHECK_EQ_INT(call(g, &marked, 1, 0, 0, c, 3, e, &kept, NULL), 3);
        CHECK(e[0].degraded && strcmp(e[0].degraded, "fallback") == 0);
        CHECK(e[1].degraded == NULL);
        CHECK_EQ_INT(kept, i);
    }
    /* M.cache = false: asked every time */
    unload_routing(g);
    char *src = malloc(strlen(reading_routing) + 64);
    strcpy(src, reading_routing);
    char *at = strstr(src, "version = 1 }");
    memcpy(at, "version = 1, cache = false }", strlen("version = 1, cache = false }") + 1);
    strcat(src, strstr(reading_routing, "\nfunction M.route"));
    g = load_routing(src);
    free(src);
    if (!g) return;
    config_cands(g, c, all3, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, &kept, NULL), 3);
    CHECK(!kept);
    CHECK_EQ_INT(lua_int(g, "calls"), 3);
    unload_routing(g);
}

/* ---- the steps, replayed ----------------------------------------------------------------- */

/* clang-format off */
static const char *stepping_routing =
    "local moongate = require('moongate')\n"
    "local M = { name = 'routing', version = 1 }\n"
    "local function share(c)\n"
    "  share_calls = (share_calls or 0) + 1\n"
    "  if c.headroom == 0.25 then error('share exploded') end\n"
    "  return c.weight * c.headroom\n"
    "end\n"
    "local function rank(c)\n"
    "  rank_calls = (rank_calls or 0) + 1\n"
    "  if (c.avail_samples or 0) < 5 then return nil end\n"
    "  return -c.success_rate\n"
    "end\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  local d = moongate.draw(req)\n"
    "  local explore = d:chance(0.1)\n"
    "  local plan = moongate.weighted_order(c, share, d, not explore and rank or nil, req.plan_limit)\n"
    "  if plan[1] and plan[1].pool == 'fallback' then plan[1].degraded = 'fallback' end\n"
    "  return plan\n"
    "end\n"
    "return M\n";
/* clang-format on */

/* The plan of a fresh call (route() itself) and of a kept one: the same, entry for entry. */
static void same_as_fresh(mg_gen_t *g, const mg_lua_req_t *req, int limit, const mg_candidate_t *c,
                          int n, int *kept_count)
{
    mg_plan_entry_t a[12], b[12];
    int kept;
    int na = call(g, req, 1, limit, 0, c, n, a, &kept, NULL);
    int nb = call(g, req, 1, limit, 1, c, n, b, NULL, NULL);
    CHECK_EQ_INT(na, nb);
    for (int i = 0; i < na && i < nb; i++) {
        CHECK_EQ_INT(a[i].index, b[i].index);
        CHECK(a[i].degraded == b[i].degraded && a[i].emergency == b[i].emergency);
    }
    *kept_count += kept;
}

static void test_steps_replayed(void)
{
    mg_gen_t *g = load_routing(stepping_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2};
    mg_candidate_t c[3];
    config_cands(g, c, all3, 3); /* weights 1, 1, 2.5 (ol, the fallback one) */
    int kept = 0;
    mg_lua_req_t req = a_request("m");
    /* the weighted draw is made again in C with each request's own number: the plans are
       those route() gives, the explore draws (chance) kept beside the others */
    for (int i = 0; i < 200; i++) {
        req.random = (i + 0.5) / 200;
        same_as_fresh(g, &req, 0, c, 3, &kept);
    }
    CHECK(kept >= 190);
    /* with req.plan_limit: one draw after the other (and plans that differ by their limit) */
    for (int i = 0; i < 100; i++) {
        req.random = (i + 0.5) / 100;
        same_as_fresh(g, &req, 1 + i % 2, c, 3, &kept);
    }
    /* the functions are asked again only when the facts they read change: the samples for
       rank, the headroom for share (in_flight neither) */
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, (mg_plan_entry_t[3]){0}, NULL, NULL), 3);
    int shares = lua_int(g, "share_calls"), ranks = lua_int(g, "rank_calls");
    int calls = lua_int(g, "calls");
    c[0].in_flight = 7;
    c[1].rpm_used = 9;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, (mg_plan_entry_t[3]){0}, NULL, NULL), 3);
    CHECK_EQ_INT(lua_int(g, "share_calls"), shares);
    CHECK_EQ_INT(lua_int(g, "rank_calls"), ranks);
    c[1].headroom = 0.5;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, (mg_plan_entry_t[3]){0}, NULL, NULL), 3);
    CHECK_EQ_INT(lua_int(g, "share_calls"), shares + 1);
    CHECK_EQ_INT(lua_int(g, "rank_calls"), ranks);
    c[2].avail_samples = 3;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, (mg_plan_entry_t[3]){0}, NULL, NULL), 3);
    CHECK_EQ_INT(lua_int(g, "rank_calls"), ranks + 1);
    CHECK_EQ_INT(lua_int(g, "calls"), calls); /* and route() not at all */
    /* every route measured: rank orders (and the replay with it) */
    for (int i = 0; i < 3; i++) {
        c[i].avail_samples = 10;
        c[i].success_rate = 1 - 0.1 * i;
    }
    for (int i = 0; i < 100; i++) {
        req.random = (i + 0.5) / 100;
        same_as_fresh(g, &req, 0, c, 3, &kept);
    }
    /* a step's function that raises: the kept plan does not hold, route() raises the same */
    c[1].headroom = 0.25;
    mg_plan_entry_t e[3];
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, NULL, NULL), -1);
    CHECK(strstr(err, "share exploded") != NULL);
    c[1].headroom = 1;
    CHECK_EQ_INT(call(g, &req, 1, 0, 0, c, 3, e, NULL, NULL), 3);
    unload_routing(g);
}

/* What route() read of a step's result is checked again: here the pool of whoever the draw
 * puts first (two main routes and a fallback one of a much larger weight). */
static void test_step_results_checked(void)
{
    mg_gen_t *g = load_routing(stepping_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2};
    mg_candidate_t c[3];
    config_cands(g, c, all3, 3);
    int kept = 0, marked = 0;
    mg_lua_req_t req = a_request("m");
    for (int i = 0; i < 300; i++) {
        req.random = (double)((i * 7919) % 300) / 300; /* scattered over [0, 1) */
        mg_plan_entry_t e[3];
        call(g, &req, 1, 1, 0, c, 3, e, NULL, NULL);
        marked += e[0].degraded != NULL;
        same_as_fresh(g, &req, 1, c, 3, &kept);
    }
    CHECK(marked > 100 && marked < 250); /* both kinds of first place came up */
    CHECK(kept > 250);
    unload_routing(g);
}

/* ---- the shipped policy: a kept plan is the plan route() gives ----------------------------- */

/* 12 providers (main and fallback, a local one, weights), model "mixed" over all of them in
 * two priority groups, model "alike" over five alike main providers. */
static void write_mixed_config(void)
{
    char yaml[4096];
    int n = snprintf(yaml, sizeof(yaml),
                     "server:\n  listen: 127.0.0.1:0\n"
                     "lua:\n  policies: %s/policies\n  adapters: %s/adapters\n  lib: %s/lua\n"
                     "providers:\n",
                     root, root, root);
    for (int i = 0; i < 12; i++)
        n += snprintf(yaml + n, sizeof(yaml) - (size_t)n,
                      "  - { id: p%d, adapter: openai, base_url: \"http://127.0.0.1:1/v1\", "
                      "pool: %s, local: %s, weight: %s }\n",
                      i, i >= 9 ? "fallback" : "main", i == 6 ? "true" : "false",
                      i == 5 ? "2" : "1");
    n += snprintf(yaml + n, sizeof(yaml) - (size_t)n, "models:\n  mixed:\n    routes:\n");
    for (int i = 0; i < 12; i++)
        n += snprintf(yaml + n, sizeof(yaml) - (size_t)n,
                      "      - { provider: p%d, model: up%d, priority: %d%s }\n", i, i, i == 7,
                      i == 8 ? ", smaller: true" : "");
    n += snprintf(yaml + n, sizeof(yaml) - (size_t)n, "  alike:\n    routes:\n");
    for (int i = 0; i < 5; i++)
        n += snprintf(yaml + n, sizeof(yaml) - (size_t)n, "      - { provider: p%d, model: a%d }\n",
                      i, i);
    write_text("moongate.yaml", yaml);
}

static void set_samples(mg_candidate_t *c, int n, double rate, double ttft)
{
    c->avail_samples = c->ttft_samples = n;
    c->success_rate = rate;
    c->ttft_ms = ttft;
}

/* Facts for the routes of model `name` that change now and then as under load: a route's
 * samples or headroom move, one goes down or cools for a while. */
static void move_facts(mg_gen_t *g, const char *name, mg_candidate_t *c, uint64_t *seed, int fresh)
{
    static const double rates[] = {1, 0.97, 0.9, 0.5}, ttfts[] = {80, 85, 120, 900};
    const mg_model_conf_t *m = mg_config_model(g->cfg, name);
    for (size_t i = 0; i < m->n_routes; i++) {
        uint64_t z = mg_splitmix64(seed);
        if (!fresh && z % 8 != 0) continue; /* most routes keep their facts */
        memset(&c[i], 0, sizeof(c[i]));
        c[i].provider = mg_config_provider(g->cfg, m->routes[i].provider);
        c[i].route = &m->routes[i];
        c[i].available = (z >> 3) % 12 != 0;
        c[i].cooling = (z >> 8) % 15 == 0;
        c[i].cooldown_remaining_ms = c[i].cooling ? (long long)((z >> 12) % 20000) : 0;
        c[i].headroom = (z >> 16) % 4 == 0 ? 0.5 : 1;
        c[i].in_flight = (int)((z >> 20) % 3);
        c[i].health = "healthy";
        c[i].breaker = "closed";
        c[i].load_kv_cache = -1;
        int measured = (z >> 24) % 3 != 0;
        set_samples(&c[i], measured ? 5 + (int)((z >> 28) % 10) : (int)((z >> 28) % 3),
                    rates[(z >> 32) % 4], ttfts[(z >> 36) % 4] + (double)((z >> 40) % 3));
    }
}

static void test_shipped_policy_kept_plans_are_its_plans(void)
{
    tree_new();
    write_mixed_config();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "  load: %s\n", err);
        tree_remove();
        return;
    }
    uint64_t seed = 2024;
    mg_candidate_t mixed[12], alike[5];
    move_facts(g, "mixed", mixed, &seed, 1);
    move_facts(g, "alike", alike, &seed, 1);
    int kept = 0, rounds = 4000;
    for (int round = 0; round < rounds; round++) {
        int is_mixed = round % 2;
        const char *name = is_mixed ? "mixed" : "alike";
        mg_candidate_t *c = is_mixed ? mixed : alike;
        if (round % 4 < 2) move_facts(g, name, c, &seed, 0);
        uint64_t z = mg_splitmix64(&seed);
        mg_lua_req_t info = {.request_id = "req-twin",
                             .endpoint = "chat",
                             .model = name,
                             .max_tokens = -1,
                             .created = 1,
                             .allow_cloud = z % 9 != 0,
                             .local_first = (z >> 4) % 5 != 0,
                             .allow_smaller_model = (z >> 8) % 3 == 0,
                             .local_only = (z >> 12) % 17 == 0,
                             .pin = (z >> 16) % 13 == 0 ? "p1" : NULL,
                             .pool = (z >> 20) % 7 == 0 ? "fallback" : NULL,
                             .random = mg_unit_double(mg_splitmix64(&seed))};
        same_as_fresh(g, &info, (z >> 24) % 3 == 0 ? 1 + (int)((z >> 28) % 3) : 0, c,
                      is_mixed ? 12 : 5, &kept);
    }
    fprintf(stderr, "  %d of %d plans kept\n", kept, rounds);
    CHECK(kept > rounds / 8);
    unload_routing(g);
}

/* ---- encode answers ----------------------------------------------------------------------- */

static int header_count(const struct curl_slist *h)
{
    int n = 0;
    for (; h; h = h->next) n++;
    return n;
}

static int has_header(const struct curl_slist *h, const char *line)
{
    for (; h; h = h->next)
        if (strcmp(h->data, line) == 0) return 1;
    return 0;
}

/* An encode() that reads only req.endpoint and req.stream is asked once per route, endpoint
 * and stream mode, its answer reused (keyed by the model's text, not its pointer); errors are
 * not kept. */
static void test_encode_answers(void)
{
    tree_new();
    write_text("adapters/openai.lua",
               "local M = { name = 'openai', version = 1, passthrough = true }\n"
               "local calls = 0\n"
               "function M.encode(req, route)\n"
               "  calls = calls + 1\n"
               "  if req.endpoint == 'bad' then error('no ' .. req.endpoint, 0) end\n"
               "  local h = {}\n"
               "  if route.api_key then h.Authorization = 'Bearer ' .. route.api_key end\n"
               "  return { method = 'POST', headers = h, path = '/' .. req.endpoint .. '/' ..\n"
               "    route.model .. '/' .. calls .. (req.stream and '/s' or '') }\n"
               "end\n"
               "return M\n");
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) return;
    int a = adapter_of(g, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(g->cfg, "oa");
    const mg_provider_conf_t *nokey = mg_config_provider(g->cfg, "oa-nokey");
    struct {
        const char *endpoint;
        int stream;
        const mg_provider_conf_t *p;
        const char *model;
        const char *want; /* NULL: an error */
    } steps[] = {
        {"chat", 0, oa, "up-a", "/chat/up-a/1"},
        {"chat", 0, oa, "up-a", "/chat/up-a/1"},
        {"chat", 1, oa, "up-a", "/chat/up-a/2/s"},
        {"completions", 0, oa, "up-a", "/completions/up-a/3"},
        {"chat", 0, nokey, "up-b", "/chat/up-b/4"},
        {"chat", 0, oa, "up-z", "/chat/up-z/5"},
        {"bad", 0, oa, "up-a", NULL},
        {"bad", 0, oa, "up-a", NULL},
        {"chat", 0, oa, "up-y", "/chat/up-y/8"},
        {"chat", 1, oa, "up-a", "/chat/up-a/2/s"},
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        mg_lua_req_t info = {.request_id = "req-m",
                             .endpoint = steps[i].endpoint,
                             .model = "m",
                             .stream = steps[i].stream,
                             .max_tokens = -1,
                             .created = 1};
        int rr = mg_gen_req_new(g, &info);
        char model[16]; /* a fresh copy each time: the answers are found by the text */
        snprintf(model, sizeof(model), "%s", steps[i].model);
        mg_encoded_t e;
        int rc = mg_gen_encode(g, a, &info, &rr, steps[i].p, model, &e, err, sizeof(err));
        CHECK_EQ_INT(rc, steps[i].want ? 0 : -1);
        if (rc == 0) {
            CHECK_STR(e.path, steps[i].want);
            CHECK_STR(e.method, "POST");
            CHECK_EQ_INT(header_count(e.headers), steps[i].p == oa ? 1 : 0);
            if (steps[i].p == oa) CHECK(has_header(e.headers, "Authorization: Bearer sk-test"));
            mg_encoded_free(&e);
        }
        mg_gen_unref_value(g, rr);
    }
    /* a full store: 64 answers kept (the 6 above among them), found again among the others;
       past that, answers are made afresh every time, never wrong */
    int kept = 0, fresh = 0;
    for (int i = 0; i < 70; i++) {
        char model[24], first[64] = "";
        snprintf(model, sizeof(model), "many-%d", i);
        for (int round = 0; round < 2; round++) {
            mg_lua_req_t info = {.request_id = "req-f",
                                 .endpoint = "chat",
                                 .model = "m",
                                 .stream = i % 2,
                                 .max_tokens = -1,
                                 .created = 1};
            int rr = mg_gen_req_new(g, &info);
            mg_encoded_t e;
            CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, model, &e, err, sizeof(err)), 0);
            if (round == 0) snprintf(first, sizeof(first), "%s", e.path);
            else if (strcmp(first, e.path) == 0) kept++;
            else fresh += strncmp(e.path, "/chat/many-", 11) == 0;
            mg_encoded_free(&e);
            mg_gen_unref_value(g, rr);
        }
    }
    CHECK_EQ_INT(kept, 64 - 6);
    CHECK_EQ_INT(fresh, 70 - (64 - 6));
    /* a request without a table yet: a kept answer makes none, a call makes it */
    mg_lua_req_t info = {
        .request_id = "req-l", .endpoint = "chat", .model = "m", .max_tokens = -1, .created = 1};
    int rr = -1;
    mg_encoded_t e;
    CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), 0);
    CHECK_STR(e.path, "/chat/up-a/1");
    CHECK_EQ_INT(rr, -1);
    mg_encoded_free(&e);
    CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, "up-new", &e, err, sizeof(err)), 0);
    CHECK(rr >= 0);
    mg_encoded_free(&e);
    mg_gen_unref_value(g, rr);
    unload_routing(g);
}

/* An encode() that reads the request's own fields (here its id) is never kept: asked for every
 * request, and handed the plain request table from then on. */
static void test_encode_own_fields(void)
{
    tree_new();
    write_text("adapters/openai.lua",
               "local M = { name = 'openai', version = 1, passthrough = true }\n"
               "function M.encode(req, route)\n"
               "  return { method = 'POST', path = '/' .. req.request_id }\n"
               "end\n"
               "return M\n");
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) return;
    int a = adapter_of(g, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(g->cfg, "oa");
    const char *ids[] = {"req-1", "req-2", "req-3"};
    for (int i = 0; i < 3; i++) {
        mg_lua_req_t info = {
            .request_id = ids[i], .endpoint = "chat", .model = "m", .max_tokens = -1, .created = 1};
        int rr = -1;
        mg_encoded_t e;
        CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), 0);
        char want[16];
        snprintf(want, sizeof(want), "/%s", ids[i]);
        CHECK_STR(e.path, want);
        mg_encoded_free(&e);
        mg_gen_req_release(g, rr);
    }
    CHECK(g->adapters[a].encode_untraced);
    unload_routing(g);
}

int main(void)
{
    MG_RUN(test_views);
    MG_RUN(test_kept_plans);
    MG_RUN(test_steps_replayed);
    MG_RUN(test_step_results_checked);
    MG_RUN(test_shipped_policy_kept_plans_are_its_plans);
    MG_RUN(test_encode_answers);
    MG_RUN(test_encode_own_fields);
    return mg_test_summary();
}
