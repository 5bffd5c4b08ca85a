/* Unit tests for core/luavm: loading generations (gen.c: and every way a load is rejected,
 * with its message), generation reference counting, the request tables (reqtab.c), the
 * collections between requests, the JSON <-> Lua mapping (json.c), the routing call
 * (calls.c) with the default and custom policies, and the moongate module's ordering
 * functions (lmod.c). The cache around the calls has test_keep.c, the adapters test_adapters.c. */
#include "luavm_fixture.h"

#include "base/json.h"

/* ---- loading --------------------------------------------------------------------------- */

static void test_load_success(void)
{
    tree_new();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "  load: %s\n", err);
        return;
    }
    CHECK_EQ_INT(g->id, 7);
    CHECK_EQ_INT(g->refs, 1);
    CHECK_EQ_INT(g->n_adapters, 2); /* openai shared by two providers */
    int a_oa = adapter_of(g, "oa"), a_nokey = adapter_of(g, "oa-nokey"), a_ol = adapter_of(g, "ol");
    CHECK(a_oa >= 0 && a_ol >= 0);
    CHECK_EQ_INT(a_oa, a_nokey);
    CHECK(a_oa != a_ol);
    if (a_oa >= 0 && a_ol >= 0) {
        CHECK_STR(g->adapters[a_oa].name, "openai");
        CHECK_EQ_INT(g->adapters[a_oa].passthrough, 1);
        CHECK_STR(g->adapters[a_ol].name, "ollama");
        CHECK_EQ_INT(g->adapters[a_ol].passthrough, 0);
    }
    CHECK_EQ_INT(lua_gettop(g->L), 0);
    /* the moongate module inside the generation */
    lua_expect(g,
               "local m = require('moongate'); "
               "local t = m.json_decode('{\"a\":[1,2,{}],\"n\":null}'); "
               "return tostring(m.api_version) .. ' ' .. type(m.version) .. ' ' .. "
               "m.json_encode(t.a) .. ' ' .. tostring(t.n == require('moongate.util').null) .. ' ' "
               ".. m.sha256_hex('abc'):sub(1, 8) .. ' ' .. math.type(m.now_ms())",
               "1 string [1,2,{}] true ba7816bf integer");
    lua_expect(
        g, "local v, e = require('moongate').json_decode('{bad'); return tostring(v) .. ' ' .. e",
        "nil invalid JSON");
    mg_gen_unref(g);
    tree_remove();
}

static void test_load_routing_syntax_error(void)
{
    tree_new();
    write_text("policies/routing.lua", "local M = {}\n"
                                       "function M.route(req, c)\n"
                                       "  local x = = 1\n"
                                       "end\n"
                                       "return M\n");
    expect_load_error("routing.lua:3:", NULL, NULL);
    tree_remove();
}

static void test_load_routing_runtime_error(void)
{
    tree_new();
    write_text("policies/routing.lua", "local M = {}\n\nerror('top-level failure')\nreturn M\n");
    expect_load_error("routing.lua:3:", "top-level failure", NULL);
    tree_remove();
}

static void test_load_routing_without_route(void)
{
    tree_new();
    write_text("policies/routing.lua", "return { name = 'routing', version = 1 }\n");
    expect_load_error("routing.lua", "route", NULL);
    tree_remove();
}

static void test_load_routing_not_a_table(void)
{
    tree_new();
    write_text("policies/routing.lua", "return 42\n");
    expect_load_error("routing.lua", "module table", NULL);
    tree_remove();
}

static void test_load_missing_routing(void)
{
    tree_new();
    char p[512];
    snprintf(p, sizeof(p), "%s/policies/routing.lua", root);
    remove(p);
    expect_load_error("routing.lua", NULL, NULL);
    tree_remove();
}

static void test_load_selftest_fails(void)
{
    tree_new();
    write_text("policies/routing.lua", "local M = { name = 'routing', version = 1 }\n"
                                       "function M.route(req, c) return c end\n"
                                       "function M.selftest()\n"
                                       "  error('selftest says no')\n"
                                       "end\n"
                                       "return M\n");
    expect_load_error("selftest", "selftest says no", "routing.lua:4:");
    tree_remove();
}

static void test_load_adapter_without_encode(void)
{
    tree_new();
    write_text("adapters/openai.lua", "return { name = 'openai', passthrough = true }\n");
    expect_load_error("openai.lua", "encode", NULL);
    tree_remove();
}

static void test_load_translating_adapter_without_decode_event(void)
{
    tree_new();
    write_text("adapters/ollama.lua", "local M = { name = 'ollama' }\n"
                                      "function M.encode(req, route) return {} end\n"
                                      "function M.decode(req, resp) return resp end\n"
                                      "return M\n");
    expect_load_error("ollama.lua", "decode_event", NULL);
    tree_remove();
    /* and without decode */
    tree_new();
    write_text("adapters/ollama.lua", "local M = { name = 'ollama' }\n"
                                      "function M.encode(req, route) return {} end\n"
                                      "function M.decode_event(req, d, s) return {} end\n"
                                      "return M\n");
    expect_load_error("ollama.lua", "decode", NULL);
    tree_remove();
}

static void test_load_missing_adapter_file(void)
{
    tree_new();
    char p[512];
    snprintf(p, sizeof(p), "%s/adapters/ollama.lua", root);
    remove(p);
    expect_load_error("ollama.lua", NULL, NULL);
    tree_remove();
}

/* ollama's check() rejects a /v1 base_url: the message names the config file, the
 * provider's line and id, and carries the adapter's own text. */
static void test_load_adapter_check_string(void)
{
    tree_new_with("http://127.0.0.1:2/v1");
    char want[600];
    snprintf(want, sizeof(want), "%s:15:", cfg_path);
    expect_load_error(want, "provider 'ol'", "ollama: base_url must be the server root");
    tree_remove();
}

static void test_load_adapter_check_raises(void)
{
    tree_new();
    write_text("adapters/openai.lua",
               "local M = { name = 'openai', version = 1, passthrough = true }\n"
               "function M.encode() return {} end\n"
               "function M.check(p)\n"
               "  if p.id == 'oa-nokey' then error('no key for ' .. p.id) end\n"
               "end\n"
               "return M\n");
    char want[600];
    snprintf(want, sizeof(want), "%s:12:", cfg_path);
    expect_load_error(want, "provider 'oa-nokey'", "no key for oa-nokey");
    tree_remove();
}

/* check() gets the provider's config as a table. */
static void test_load_adapter_check_sees_provider(void)
{
    tree_new();
    write_text(
        "adapters/openai.lua",
        "local M = { name = 'openai', version = 1, passthrough = true }\n"
        "function M.encode() return {} end\n"
        "function M.check(p)\n"
        "  if p.id ~= 'oa' then return nil end\n"
        "  local s = table.concat({p.id, p.adapter, p.base_url, tostring(p.api_key),\n"
        "    p.pool, tostring(p['local']), tostring(p.weight), tostring(p.rpm_limit)}, '|')\n"
        "  return 'saw ' .. s\n"
        "end\n"
        "return M\n");
    expect_load_error("provider 'oa'", "saw oa|openai|http://127.0.0.1:1/v1|sk-test|main|false|1",
                      NULL);
    tree_remove();
}

/* Every policy and adapter says its name (the file's) and the API version it is written for
 * (1); without them, or with another, the load fails naming the file and the fix. */
static void test_load_name_and_version(void)
{
    static const struct {
        const char *file, *text, *piece;
    } cases[] = {
        {"policies/routing.lua", "return { route = function() return {} end }\n",
         "needs name = \"routing\""},
        {"policies/routing.lua", "return { name = 'routing', route = function() return {} end }\n",
         "needs version = 1"},
        {"policies/routing.lua",
         "return { name = 'routing', version = 2, route = function() return {} end }\n",
         "version = 2, but this gateway speaks API version 1"},
        {"policies/routing.lua",
         "return { name = 'routing', version = '1', route = function() return {} end }\n",
         "version = \"1\", but"},
        {"policies/routing.lua",
         "return { name = 'route', version = 1, route = function() return {} end }\n",
         "name = \"route\", but this file is \"routing\""},
        {"policies/cooldown.lua", "return { version = 1, on_response = function() end }\n",
         "needs name = \"cooldown\""},
        {"policies/cooldown.lua",
         "return { name = 'cooldown', version = 1.5, on_response = function() end }\n",
         "version = 1.5, but"},
        {"adapters/openai.lua",
         "return { name = 'openai', passthrough = true, encode = function() return {} end }\n",
         "needs version = 1"},
        {"adapters/ollama.lua",
         "return { name = 'openai', version = 1, passthrough = true,\n"
         "  encode = function() return {} end }\n",
         "name = \"openai\", but this file is \"ollama\""},
        {"adapters/ollama.lua",
         "return { name = 'ollama', version = {}, passthrough = true,\n"
         "  encode = function() return {} end }\n",
         "version = table, but"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tree_new();
        write_text(cases[i].file, cases[i].text);
        const char *base = strrchr(cases[i].file, '/') + 1;
        expect_load_error(base, cases[i].piece, NULL);
        tree_remove();
    }
    /* the shipped files say it */
    tree_new();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (g) mg_gen_unref(g);
    tree_remove();
}

static void test_load_missing_util(void)
{
    tree_new();
    char p[512];
    snprintf(p, sizeof(p), "%s/lua/moongate/util.lua", root);
    CHECK_EQ_INT(remove(p), 0);
    expect_load_error("moongate.util", NULL, NULL);
    tree_remove();
}

static void test_load_util_without_array_mt(void)
{
    tree_new();
    write_text("lua/moongate/util.lua", "return { null = {} }\n");
    expect_load_error("util.null", "util.array_mt", NULL);
    tree_remove();
}

/* Regression: a util.lua without util.null once unbalanced the Lua stack in
 * load_library and aborted the process; it must be an ordinary load error. */
static void test_load_util_without_null(void)
{
    tree_new();
    write_text("lua/moongate/util.lua", "return { array_mt = {} }\n");
    expect_load_error("util.null", NULL, NULL);
    tree_remove();
}

static void test_load_bad_config(void)
{
    tree_new();
    write_text("moongate.yaml", "providers:\n  - id: x\n");
    expect_load_error("moongate.yaml:", NULL, NULL);
    tree_remove();
}

/* ---- reference counting ---------------------------------------------------------------- */

static void test_refcount(void)
{
    tree_new();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) return;
    mg_gen_ref(g);
    CHECK_EQ_INT(g->refs, 2);
    mg_gen_unref(g);
    CHECK_EQ_INT(g->refs, 1);
    /* still fully usable after the first reference went */
    lua_expect(g, "return require('moongate').json_encode({1, 2})", "[1,2]");
    mg_lua_req_t info = {.request_id = "req-1",
                         .endpoint = "chat",
                         .model = "m",
                         .stream = 0,
                         .max_tokens = -1,
                         .created = 1,
                         .allow_cloud = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_candidate_t c[3];
    const char *ids[] = {"oa", "oa-nokey", "ol"};
    for (int i = 0; i < 3; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        c[i].provider = mg_config_provider(g->cfg, ids[i]);
        c[i].route = &test_routes[i];
        c[i].available = 1;
        c[i].headroom = 1;
        c[i].health = "healthy";
        c[i].breaker = "closed";
    }
    int order[3];
    CHECK_EQ_INT(route_order(g, &info, rr, c, 3, order, err, sizeof(err)), 3);
    mg_gen_unref_value(g, rr);
    mg_gen_unref(g); /* frees; ASan / valgrind report any leak or later use */
    mg_gen_unref(NULL);
    tree_remove();
}

/* ---- request tables, recycled ------------------------------------------------------------ */

/* Run `code` (a chunk taking the request table as ...) and return its result as a string
 * (malloc, "nil" for nil), or NULL when it raised. */
static char *on_req(mg_gen_t *g, int ref, const char *code)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    char *out = NULL;
    if (luaL_loadstring(L, code) == LUA_OK) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
        if (lua_pcall(L, 1, 1, 0) == LUA_OK) out = strdup(luaL_tolstring(L, -1, NULL));
    }
    if (!out) fprintf(stderr, "  lua error: %s\n", lua_tostring(L, -1));
    lua_settop(L, top);
    return out;
}

static void expect_on_req(mg_gen_t *g, int ref, const char *code, const char *want)
{
    char *got = on_req(g, ref, code);
    CHECK_STR(got, want);
    free(got);
}

static const char FIELDS[] =
    "local r = ... return table.concat({r.request_id, tostring(r.pin), tostring(r.pool),"
    " tostring(r.max_tokens), type(r.body), tostring(r.attempt), tostring(r.mine),"
    " tostring(r.model)}, ' ')";

static void test_req_recycled(void)
{
    tree_new();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) return;
    mg_lua_req_t a = {.request_id = "req-a",
                      .endpoint = "chat",
                      .model = "m",
                      .max_tokens = 5,
                      .created = 1,
                      .pin = "oa",
                      .pool = "fallback"};
    mg_lua_req_t b = {
        .request_id = "req-b", .endpoint = "chat", .model = "m", .max_tokens = -1, .created = 2};
    int r = mg_gen_req_new(g, &a);
    cJSON *body = cJSON_Parse("{\"messages\": []}");
    mg_gen_req_set_body(g, r, body);
    cJSON_Delete(body);
    /* Lua code may write the core's fields: the next fill rewrites them all */
    expect_on_req(g, r, "local r = ... r.model = 'changed' r.attempt = 3 return r.model",
                  "changed");
    expect_on_req(g, r, FIELDS, "req-a oa fallback 5 table 3 nil changed");
    mg_gen_req_release(g, r);
    CHECK_EQ_INT((int)g->n_req_free, 1);
    int r2 = mg_gen_req_new(g, &b);
    CHECK_EQ_INT(r2, r);
    CHECK_EQ_INT((int)g->n_req_free, 0);
    /* every field is the new request's: nothing of a's, body and the others cleared */
    expect_on_req(g, r2, FIELDS, "req-b nil nil nil nil 1 nil m");
    expect_on_req(g, r2, "local r = ... r.pin = 'ol' return r.pin", "ol");
    mg_gen_req_release(g, r2);
    CHECK_EQ_INT((int)g->n_req_free, 1);
    r2 = mg_gen_req_new(g, &b);
    CHECK_EQ_INT(r2, r);
    expect_on_req(g, r2, FIELDS, "req-b nil nil nil nil 1 nil m");
    /* Lua code adds a field of its own: the table is not reused */
    expect_on_req(g, r2, "local r = ... r.mine = 'x' return r.mine", "x");
    mg_gen_req_release(g, r2);
    CHECK_EQ_INT((int)g->n_req_free, 0);
    int r3 = mg_gen_req_new(g, &b);
    expect_on_req(g, r3, FIELDS, "req-b nil nil nil nil 1 nil m");
    /* nor when it replaces the metatable (its __newindex is what marks) */
    expect_on_req(g, r3, "setmetatable(..., nil) return 'ok'", "ok");
    mg_gen_req_release(g, r3);
    CHECK_EQ_INT((int)g->n_req_free, 0);
    /* the free list is bounded */
    int refs[MG_REQ_FREE_MAX + 3];
    for (int i = 0; i < MG_REQ_FREE_MAX + 3; i++) refs[i] = mg_gen_req_new(g, &b);
    for (int i = 0; i < MG_REQ_FREE_MAX + 3; i++) mg_gen_req_release(g, refs[i]);
    CHECK_EQ_INT((int)g->n_req_free, MG_REQ_FREE_MAX);
    mg_gen_unref(g); /* the kept tables go with the state: ASan / valgrind see no leak */
    tree_remove();
}

/* ---- collections between requests ------------------------------------------------------ */

/* Make some garbage in the generation's state; the bytes it then holds. */
static size_t make_garbage(mg_gen_t *g)
{
    lua_createtable(g->L, 16, 0);
    for (int i = 1; i <= 16; i++) {
        lua_createtable(g->L, 0, 2);
        lua_rawseti(g->L, -2, i);
    }
    lua_pop(g->L, 1);
    return mg_gen_lua_bytes(g);
}

/* Grow the state until mg_gen_collect_between(g, idle) collects; the growth over gc_base (in
 * % of it) it collected at, or -1 when it never did or freed nothing. */
static int collect_growth(mg_gen_t *g, int idle)
{
    for (int i = 0; i < 100000; i++) {
        size_t base = g->gc_base, before = make_garbage(g);
        if (mg_gen_collect_between(g, idle)) {
            if (mg_gen_lua_bytes(g) >= before || g->gc_base != mg_gen_lua_bytes(g)) return -1;
            return (int)((before - base) * 100 / base);
        }
    }
    return -1;
}

static void test_collect_between(void)
{
    tree_new();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) return;
    CHECK_EQ_INT(mg_gen_collect_between(g, 1), 0); /* nothing grew since the load measured it */
    CHECK(g->gc_base > 0);
    CHECK(collect_growth(g, 1) >= 0); /* from here Lua's threshold counts from ours */
    /* nothing in flight: at a tenth, before Lua's own collector (a fifth) would run */
    int idle = collect_growth(g, 1);
    CHECK(idle >= MG_GC_IDLE_PCT && idle < MG_GC_BUSY_PCT);
    /* requests in flight: later, still before the automatic threshold */
    int busy = collect_growth(g, 0);
    CHECK(busy >= MG_GC_BUSY_PCT && busy < MG_GC_AUTO_PCT);
    mg_gen_unref(g);
    tree_remove();
}

/* ---- JSON <-> Lua ---------------------------------------------------------------------- */

/* JSON text -> Lua -> JSON; returns the printed result (malloc) or NULL. */
static char *round_trip(const char *json)
{
    cJSON *in = cJSON_Parse(json);
    if (!in) {
        fprintf(stderr, "  bad test JSON: %s\n", json);
        return NULL;
    }
    int top = lua_gettop(G->L);
    mg_lua_push_json(G, in);
    CHECK_EQ_INT(lua_gettop(G->L), top + 1);
    char e[256] = "";
    cJSON *out = mg_lua_to_json(G, -1, e, sizeof(e));
    CHECK_EQ_INT(lua_gettop(G->L), top + 1); /* conversion leaves the stack as it was */
    lua_settop(G->L, top);
    char *s = NULL;
    if (!out) {
        fprintf(stderr, "  to_json failed: %s\n", e);
    } else {
        if (!cJSON_Compare(in, out, 1)) fprintf(stderr, "  round trip changed %s\n", json);
        CHECK(cJSON_Compare(in, out, 1));
        s = cJSON_PrintUnformatted(out);
    }
    cJSON_Delete(in);
    cJSON_Delete(out);
    return s;
}

static void expect_round_trip(const char *json, const char *printed)
{
    char *s = round_trip(json);
    CHECK_STR(s, printed);
    free(s);
}

static void test_json_round_trip(void)
{
    expect_round_trip("{\"a\":{\"b\":{\"c\":[1,{\"d\":\"e\"}]}}}",
                      "{\"a\":{\"b\":{\"c\":[1,{\"d\":\"e\"}]}}}");
    expect_round_trip("[]", "[]");
    expect_round_trip("{}", "{}");
    expect_round_trip("null", "null");
    expect_round_trip("[{\"e\":[]},{\"o\":{}},{\"n\":null}]",
                      "[{\"e\":[]},{\"o\":{}},{\"n\":null}]");
}

/* Object key order is not kept by Lua, so compare structurally where keys > 1. */
static void expect_same(const char *json)
{
    char *s = round_trip(json);
    CHECK(s != NULL);
    free(s);
}

static void test_json_empty_and_null_kept(void)
{
    expect_same("{\"e\":[],\"o\":{},\"n\":null,\"an\":[null,null],\"nested\":[[],{},[[]]]}");
    expect_round_trip("[null]", "[null]");
    expect_round_trip("[[],[{}]]", "[[],[{}]]");
    expect_round_trip("[true,false]", "[true,false]");
    expect_round_trip("\"\"", "\"\"");
    /* in Lua: null is util.null, an empty JSON array carries the array metatable */
    cJSON *j = cJSON_Parse("{\"n\":null,\"e\":[],\"o\":{}}");
    mg_lua_push_json(G, j);
    lua_setglobal(G->L, "probe");
    lua_expect(
        G,
        "local u = require('moongate.util'); "
        "return tostring(probe.n == u.null) .. ' ' .. tostring(getmetatable(probe.e) == u.array_mt)"
        " .. ' ' .. tostring(getmetatable(probe.o) == nil) .. ' ' .. tostring(u.is_array(probe.e))",
        "true true true true");
    lua_pushnil(G->L);
    lua_setglobal(G->L, "probe");
    cJSON_Delete(j);
}

static void test_json_numbers(void)
{
    expect_round_trip("[1,-7,0,1.5,-0.25]", "[1,-7,0,1.5,-0.25]");
    expect_same("[1e300,-1e300,9007199254740993,1e-300,123456789012]");
    cJSON *j = cJSON_Parse("[1, 2.0, 1.5, -3, 1e20, 4503599627370496]");
    mg_lua_push_json(G, j);
    lua_setglobal(G->L, "probe");
    /* whole numbers become Lua integers (2.0 too: JSON has one number type), others floats */
    lua_expect(G,
               "local t = {} for i, v in ipairs(probe) do t[i] = math.type(v) end "
               "return table.concat(t, ',')",
               "integer,integer,float,integer,float,integer");
    lua_pushnil(G->L);
    lua_setglobal(G->L, "probe");
    cJSON_Delete(j);
    /* Lua -> JSON: integers print without a fraction, floats keep theirs */
    lua_State *L = G->L;
    luaL_dostring(L, "return { i = 42, f = 0.5, big = 2^53, neg = -1 }");
    char e[256] = "";
    cJSON *out = mg_lua_to_json(G, -1, e, sizeof(e));
    lua_pop(L, 1);
    CHECK(out != NULL);
    if (out) {
        cJSON *i = cJSON_GetObjectItem(out, "i");
        cJSON *f = cJSON_GetObjectItem(out, "f");
        CHECK(i && cJSON_IsNumber(i) && i->valuedouble == 42);
        CHECK(f && cJSON_IsNumber(f) && f->valuedouble == 0.5);
        char *s = cJSON_PrintUnformatted(i);
        CHECK_STR(s, "42");
        free(s);
        s = cJSON_PrintUnformatted(f);
        CHECK_STR(s, "0.5");
        free(s);
        cJSON_Delete(out);
    }
}

/* Integers past 2^53 stay exact both ways: a raw literal (mg_json_keep_big_ints) becomes a
 * Lua integer, and a Lua integer that large leaves as its digits. */
static void test_json_big_integers(void)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "seed", cJSON_CreateRaw("9007199254740993"));
    cJSON_AddItemToObject(j, "neg", cJSON_CreateRaw("-9223372036854775807"));
    mg_lua_push_json(G, j);
    lua_setglobal(G->L, "probe");
    lua_expect(G,
               "return math.type(probe.seed) .. ' ' .. tostring(probe.seed + 1) .. ' ' .. "
               "tostring(probe.neg)",
               "integer 9007199254740994 -9223372036854775807");
    lua_State *L = G->L;
    luaL_dostring(L, "return { seed = probe.seed, small = 2^53 - 1 | 0, neg = probe.neg }");
    char e[256] = "";
    cJSON *out = mg_lua_to_json(G, -1, e, sizeof(e));
    lua_pop(L, 1);
    CHECK(out != NULL);
    if (out) {
        mg_buf_t b = {0};
        CHECK_EQ_INT(mg_json_print(cJSON_GetObjectItem(out, "seed"), &b), 0);
        CHECK_STR(b.data, "9007199254740993");
        b.len = 0;
        CHECK_EQ_INT(mg_json_print(cJSON_GetObjectItem(out, "neg"), &b), 0);
        CHECK_STR(b.data, "-9223372036854775807");
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(out, "small"))); /* exact as a double */
        mg_buf_free(&b);
        cJSON_Delete(out);
    }
    lua_pushnil(L);
    lua_setglobal(L, "probe");
    cJSON_Delete(j);
}

/* A message kept as its JSON text (a session's turn, cJSON_Raw) reaches Lua as its table. */
static void test_json_raw_text(void)
{
    cJSON *j = cJSON_CreateArray();
    cJSON_AddItemToArray(j, cJSON_CreateRaw("{\"role\":\"user\",\"content\":\"hi\",\"n\":[1,2]}"));
    cJSON_AddItemToArray(j, cJSON_CreateRaw("[true]"));
    mg_lua_push_json(G, j);
    lua_setglobal(G->L, "probe");
    lua_expect(G,
               "return probe[1].role .. probe[1].content .. #probe[1].n .. tostring(probe[2][1])",
               "userhi2true");
    lua_pushnil(G->L);
    lua_setglobal(G->L, "probe");
    cJSON_Delete(j);
}

static void test_json_unicode(void)
{
    /* UTF-8 strings, escapes and a key with non-ASCII characters */
    expect_round_trip(
        "[\"h\\u00e9llo \\u2713 \\ud83d\\ude00\",\"tab\\tquote\\\"back\\\\\"]",
        "[\"h\xc3\xa9llo \xe2\x9c\x93 \xf0\x9f\x98\x80\",\"tab\\tquote\\\"back\\\\\"]");
    expect_round_trip("{\"cl\xc3\xa9\":\"\xe6\x97\xa5\xe6\x9c\xac\"}",
                      "{\"cl\xc3\xa9\":\"\xe6\x97\xa5\xe6\x9c\xac\"}");
}

/* Lua values that have no JSON form: an error message, no crash, stack unchanged. */
static void expect_to_json_error(const char *code, const char *piece)
{
    lua_State *L = G->L;
    int top = lua_gettop(L);
    if (luaL_dostring(L, code) != LUA_OK) {
        fprintf(stderr, "  lua: %s\n", lua_tostring(L, -1));
        CHECK(!"chunk ran");
        lua_settop(L, top);
        return;
    }
    char e[256] = "";
    cJSON *out = mg_lua_to_json(G, -1, e, sizeof(e));
    CHECK(out == NULL);
    cJSON_Delete(out);
    if (!strstr(e, piece)) fprintf(stderr, "  error \"%s\" lacks \"%s\" (%s)\n", e, piece, code);
    CHECK(strstr(e, piece) != NULL);
    CHECK_EQ_INT(lua_gettop(L), top + 1);
    lua_settop(L, top);
}

static void test_json_unencodable(void)
{
    expect_to_json_error("local t = {} t.self = t return t", "cycle");
    expect_to_json_error("local t = {} t[1] = t return t", "cycle");
    expect_to_json_error("local a, b = {}, {} a.b = b b.a = a return { a }", "cycle");
    expect_to_json_error("return { f = function() end }", "function");
    expect_to_json_error("return { 1, 2, print }", "function");
    expect_to_json_error("return function() end", "function");
    expect_to_json_error("return { [true] = 1 }", "keys");
    expect_to_json_error("return { co = coroutine.create(function() end) }", "thread");
    expect_to_json_error("return { s = 'a\\0b' }", "NUL");
    /* the state is still healthy afterwards */
    lua_expect(G, "return 'alive'", "alive");
}

/* ---- routing --------------------------------------------------------------------------- */

static void test_route_default_policy(void)
{
    int order[3] = {-1, -1, -1};
    int all[3] = {1, 1, 1}, mid_down[3] = {1, 0, 1}, none[3] = {0, 0, 0}, first_down[3] = {0, 1, 1};
    CHECK_EQ_INT(route(G, "m", all, order), 3);
    CHECK(order[0] == 0 && order[1] == 1 && order[2] == 2);
    CHECK_EQ_INT(route(G, "m", mid_down, order), 2);
    CHECK(order[0] == 0 && order[1] == 2);
    CHECK_EQ_INT(route(G, "m", first_down, order), 2);
    CHECK(order[0] == 1 && order[1] == 2);
    CHECK_EQ_INT(route(G, "m", none, order), 0);
}

/* plan->limit reaches route() as req.plan_limit (nil for 0, also on a request table that had
 * one), and the default policy's plan stops there: the first entries of the full plan. */
static void test_route_plan_limit(void)
{
    mg_lua_req_t info = {.request_id = "req-limit",
                         .endpoint = "chat",
                         .model = "m",
                         .max_tokens = 100,
                         .created = 1700000000,
                         .allow_cloud = 1,
                         .random = 0.37};
    int rr = mg_gen_req_new(G, &info);
    mg_candidate_t c[3];
    int all[3] = {1, 1, 1};
    make_cands(G, c, all);
    mg_plan_entry_t full[3], cut[3], again[3];
    mg_plan_t p_full = {.entries = full, .limit = 0}, p_cut = {.entries = cut, .limit = 2},
              p_again = {.entries = again, .limit = 0};
    CHECK_EQ_INT(mg_gen_route(G, &info, &rr, 1, c, 3, &p_full, err, sizeof(err)), 0);
    CHECK_EQ_INT(mg_gen_route(G, &info, &rr, 2, c, 3, &p_cut, err, sizeof(err)), 0);
    lua_rawgeti(G->L, LUA_REGISTRYINDEX, rr);
    lua_getfield(G->L, -1, "plan_limit");
    CHECK_EQ_INT((int)lua_tointeger(G->L, -1), 2);
    lua_pop(G->L, 2);
    CHECK_EQ_INT(mg_gen_route(G, &info, &rr, 3, c, 3, &p_again, err, sizeof(err)), 0);
    CHECK_EQ_INT(p_full.n, 3);
    CHECK_EQ_INT(p_cut.n, 2);
    CHECK_EQ_INT(p_again.n, 3);
    CHECK(cut[0].index == full[0].index && cut[1].index == full[1].index);
    mg_gen_unref_value(G, rr);
}

/* clang-format off */
static const char *custom_routing =
    "local M = { name = 'routing', version = 1 }\n"           /* 1 */
    "function M.route(req, c)\n"                              /* 2 */
    "  if req.model == 'dup' then\n"                          /* 3 */
    "    return { c[2], c[2], 99, 0, -1, c[1], 'x', 3, c[3] }\n" /* 4 */
    "  elseif req.model == 'boom' then\n"                     /* 5 */
    "    error('policy exploded')\n"                          /* 6 */
    "  elseif req.model == 'number' then\n"                   /* 7 */
    "    return 42\n"                                         /* 8 */
    "  elseif req.model == 'nil' then\n"                      /* 9 */
    "    return nil\n"                                        /* 10 */
    "  elseif req.model == 'reverse' then\n"                  /* 11 */
    "    return { c[3], c[2], c[1] }\n"                       /* 12 */
    "  elseif req.model == 'errtable' then\n"                 /* 13 */
    "    error({ code = 1 })\n"                               /* 14 */
    "  elseif req.model == 'inspect' then\n"                  /* 15 */
    "    seen_req, seen_c = req, c\n"                         /* 16 */
    "    return {}\n"                                         /* 17 */
    "  end\n"
    "  return c\n"
    "end\n"
    "return M\n";
/* clang-format on */

static void test_route_custom_policy(void)
{
    mg_gen_t *g = load_routing(custom_routing);
    if (!g) return;
    int all[3] = {1, 1, 1}, mixed[3] = {1, 0, 1};
    int order[3] = {-1, -1, -1};
    /* duplicates and out-of-range entries ignored; plain indexes accepted */
    CHECK_EQ_INT(route(g, "dup", all, order), 3);
    CHECK(order[0] == 1 && order[1] == 0 && order[2] == 2);
    CHECK_EQ_INT(route(g, "reverse", all, order), 3);
    CHECK(order[0] == 2 && order[1] == 1 && order[2] == 0);
    /* the policy decides: an unavailable candidate it returns is kept */
    CHECK_EQ_INT(route(g, "reverse", mixed, order), 3);
    /* a policy error: -1 with file:line */
    CHECK_EQ_INT(route(g, "boom", all, order), -1);
    if (!strstr(err, "routing.lua:6:") || !strstr(err, "policy exploded"))
        fprintf(stderr, "  err = %s\n", err);
    CHECK(strstr(err, "routing.lua:6:") != NULL);
    CHECK(strstr(err, "policy exploded") != NULL);
    CHECK_EQ_INT(route(g, "errtable", all, order), -1);
    CHECK(err[0] != '\0');
    CHECK_EQ_INT(route(g, "number", all, order), -1);
    CHECK(strstr(err, "list") != NULL);
    CHECK_EQ_INT(route(g, "nil", all, order), -1);
    /* what the policy sees */
    CHECK_EQ_INT(route(g, "inspect", mixed, order), 0);
    lua_expect(g,
               "local r, c = seen_req, seen_c\n"
               "local p = {r.request_id, r.endpoint, r.model, tostring(r.stream),\n"
               "  tostring(r.max_tokens), tostring(r.created), tostring(#c)}\n"
               "for i = 1, #c do\n"
               "  local x = c[i]\n"
               "  p[#p + 1] = table.concat({x.index, x.provider, x.model, x.pool,\n"
               "    tostring(x['local']), tostring(x.weight), tostring(x.available),\n"
               "    tostring(x.in_flight)}, ':')\n"
               "end\n"
               "return table.concat(p, ' ')",
               "req-route chat inspect true 100 1700000000 3 "
               "1:oa:up-a:main:false:1.0:true:1 2:oa-nokey:up-b:main:false:1.0:false:4 "
               "3:ol:up-c:fallback:true:2.5:true:7");
    /* max_tokens -1 leaves req.max_tokens nil */
    mg_lua_req_t info = {.request_id = "req-x",
                         .endpoint = "embeddings",
                         .model = "inspect",
                         .stream = 0,
                         .max_tokens = -1,
                         .created = 5};
    int rr = mg_gen_req_new(g, &info);
    mg_candidate_t c[3];
    make_cands(g, c, all);
    CHECK_EQ_INT(route_order(g, &info, rr, c, 3, order, err, sizeof(err)), 0);
    mg_gen_unref_value(g, rr);
    lua_expect(g, "return tostring(seen_req.max_tokens) .. ' ' .. tostring(seen_req.stream)",
               "nil false");
    /* n smaller than what the policy returns: never more than n written */
    mg_lua_req_t dup = {.request_id = "req-y",
                        .endpoint = "chat",
                        .model = "dup",
                        .stream = 0,
                        .max_tokens = -1,
                        .created = 5};
    rr = mg_gen_req_new(g, &dup);
    int small[1] = {-1};
    CHECK_EQ_INT(route_order(g, &dup, rr, c, 1, small, err, sizeof(err)), 1);
    CHECK_EQ_INT(small[0], 0);
    mg_gen_unref_value(g, rr);
    unload_routing(g);
}

static void test_sort_primitives(void)
{
    lua_expect(G,
               "local m = require('moongate')\n"
               "local l = { 'a', 'b', 'c', 'd' }\n"
               "local s = m.sort_by(l, { 3, 1, 0 / 0, 1 })\n"
               "local ok = pcall(m.sort_by, l, { 1, 'x', 2, 3 })\n"
               "local w = m.weighted_order(l, { 0, 0, 5, 0 }, 0.5, 7)\n"
               "local e = m.weighted_order({}, nil, 0.5, 7)\n"
               "return table.concat(s) .. ' ' .. tostring(ok) .. ' ' .. table.concat(w) ..\n"
               "  ' ' .. #e .. ' ' .. #m.weighted_order(l, nil, 0.99, 1)",
               "bdac false cabd 0 4");
    /* with keys: by key first, the weighted order among equal keys */
    lua_expect(G,
               "local m = require('moongate')\n"
               "local l, w = { 'a', 'b', 'c', 'd', 'e' }, { 1, 3, 2, 1, 1 }\n"
               "local keys = { 2, 1, 2, 1, 0 / 0 }\n"
               "local key_of = { a = 2, b = 1, c = 2, d = 1, e = 0 / 0 }\n"
               "for seed = 1, 20 do\n"
               "  local plain = m.weighted_order(l, w, seed / 21, seed)\n"
               "  local want = {}\n"
               "  for _, k in ipairs({ 1, 2 }) do\n"
               "    for _, v in ipairs(plain) do\n"
               "      if key_of[v] == k then want[#want + 1] = v end\n"
               "    end\n"
               "  end\n"
               "  for _, v in ipairs(plain) do if v == 'e' then want[#want + 1] = v end end\n"
               "  local got = table.concat(m.weighted_order(l, w, seed / 21, seed, keys))\n"
               "  want = table.concat(want)\n"
               "  if got ~= want then return got .. ' ~= ' .. want end\n"
               "end\n"
               "local ok = pcall(m.weighted_order, l, nil, 0.5, 7, { 1, 'x', 1, 1, 1 })\n"
               "return 'same ' .. tostring(ok)",
               "same false");
    /* with a limit: that many distinct values, by key first (NaN last), the first drawn
       with u; 0 = none; a limit at or past the length = the full order */
    lua_expect(
        G,
        "local m = require('moongate')\n"
        "local l, w, keys = { 'a', 'b', 'c', 'd', 'e' }, { 1, 3, 2, 0, 1 }, { 2, 1, 2, 1, 0 / 0 }\n"
        "local key_of = { a = 2, b = 1, c = 2, d = 1, e = 1000 }\n"
        "for seed = 1, 30 do\n"
        "  for _, k in ipairs({ false, true }) do\n"
        "    for limit = 0, 6 do\n"
        "      local got = m.weighted_order(l, w, seed / 31, seed, k and keys or nil, limit)\n"
        "      if #got ~= math.min(limit, 5) then return 'length ' .. #got end\n"
        "      local seen = {}\n"
        "      for i, v in ipairs(got) do\n"
        "        if seen[v] then return 'twice ' .. v end\n"
        "        seen[v] = true\n"
        "        if k and i > 1 and key_of[v] < key_of[got[i - 1]] then return 'keys ' .. table.concat(got) end\n"
        "      end\n"
        "      if k and limit > 0 and got[1] ~= 'b' and limit < 5 then return 'first ' .. got[1] end\n"
        "    end\n"
        "    local full = table.concat(m.weighted_order(l, w, seed / 31, seed, k and keys or nil))\n"
        "    if table.concat(m.weighted_order(l, w, seed / 31, seed, k and keys or nil, 5)) ~= full then\n"
        "      return 'full'\n"
        "    end\n"
        "  end\n"
        "end\n"
        "local neg = pcall(m.weighted_order, l, w, 0.5, 7, nil, -1)\n"
        "local frac = pcall(m.weighted_order, l, w, 0.5, 7, nil, 1.5)\n"
        "return 'drawn ' .. tostring(neg) .. ' ' .. tostring(frac)",
        "drawn false false");
}

/* The module's request draws (moongate.draw, draw:chance) and the ordering functions given
 * functions for their weights and keys: the same orders as the first form with the numbers
 * they stand for (u, seed from the request's random number as order.h says). */
static void test_module_draws_and_functions(void)
{
    lua_expect(
        G,
        "local m = require('moongate')\n"
        "local function splitmix(s)\n"
        "  s = s + 0x9E3779B97F4A7C15\n"
        "  local z = s\n"
        "  z = (z ~ (z >> 30)) * 0xBF58476D1CE4E5B9\n"
        "  z = (z ~ (z >> 27)) * 0x94D049BB133111EB\n"
        "  return s, z ~ (z >> 31)\n"
        "end\n"
        "local l, w = { 'a', 'b', 'c', 'd', 'e' }, { 1, 3, 2, 1, 1 }\n"
        "local weight = { a = 1, b = 3, c = 2, d = 1, e = 1 }\n"
        "for k = 0, 99 do\n"
        "  local r = (k + 0.5) / 100\n"
        "  local d = m.draw({ random = r })\n"
        "  local explore = d:chance(0.05)\n"
        "  if explore ~= (r < 0.05) then return 'chance at ' .. r end\n"
        "  local u = explore and r / 0.05 or (r - 0.05) / 0.95\n"
        "  local _, seed = splitmix(math.floor(r * 2 ^ 53))\n"
        "  local want = table.concat(m.weighted_order(l, w, u, seed))\n"
        "  local got = table.concat(m.weighted_order(l, function(v) return weight[v] end, d))\n"
        "  if got ~= want then return r .. ': ' .. got .. ' ~= ' .. want end\n"
        "end\n"
        "local d = m.draw({ random = 0.3 })\n"
        "local a = table.concat(m.weighted_order(l, w, d))\n"
        "local b = table.concat(m.weighted_order(l, w, d)) -- the stream's next numbers\n"
        "local bad = m.draw({ random = 7 }) -- outside [0, 1): 0\n"
        "local x = table.concat(m.weighted_order(l, nil, bad))\n"
        "local y = table.concat(m.weighted_order(l, nil, 0, select(2, splitmix(0))))\n"
        "return 'same ' .. tostring(a ~= b) .. ' ' .. tostring(x == y)",
        "same true true");
    /* keys as a function: nil for some value means the keys are not used */
    lua_expect(
        G,
        "local m = require('moongate')\n"
        "local l = { 'a', 'b', 'c' }\n"
        "local key = { a = 3, b = 1, c = 2 }\n"
        "local s1 = table.concat(m.sort_by(l, function(v) return key[v] end))\n"
        "local s2 = table.concat(m.sort_by(l, function(v) if v ~= 'b' then return key[v] end end))\n"
        "local s3 = table.concat(m.sort_by(l, nil))\n"
        "local d1, d2 = m.draw({ random = 0.6 }), m.draw({ random = 0.6 })\n"
        "local w1 = table.concat(m.weighted_order(l, nil, d1, function(v) return key[v] end))\n"
        "local w2 = table.concat(m.weighted_order(l, nil, d2, function(v) return false end))\n"
        "local ok1 = pcall(m.weighted_order, l, function() return 'x' end, m.draw({}))\n"
        "local ok2 = pcall(m.sort_by, l, 'x')\n"
        "return s1 .. ' ' .. s2 .. ' ' .. s3 .. ' ' .. w1 .. ' ' .. #w2 .. ' ' ..\n"
        "  tostring(ok1) .. ' ' .. tostring(ok2)",
        "bca abc abc bca 3 false false");
}

int main(void)
{
    MG_RUN(test_load_success);
    MG_RUN(test_collect_between);
    MG_RUN(test_req_recycled);
    MG_RUN(test_load_routing_syntax_error);
    MG_RUN(test_load_routing_runtime_error);
    MG_RUN(test_load_routing_without_route);
    MG_RUN(test_load_routing_not_a_table);
    MG_RUN(test_load_missing_routing);
    MG_RUN(test_load_selftest_fails);
    MG_RUN(test_load_adapter_without_encode);
    MG_RUN(test_load_translating_adapter_without_decode_event);
    MG_RUN(test_load_missing_adapter_file);
    MG_RUN(test_load_adapter_check_string);
    MG_RUN(test_load_adapter_check_raises);
    MG_RUN(test_load_adapter_check_sees_provider);
    MG_RUN(test_load_name_and_version);
    MG_RUN(test_load_missing_util);
    MG_RUN(test_load_util_without_array_mt);
    MG_RUN(test_load_util_without_null);
    MG_RUN(test_load_bad_config);
    MG_RUN(test_refcount);

    /* one generation on the repository's own files for the call tests */
    tree_new();
    G = load();
    if (!G) {
        fprintf(stderr, "cannot load the shared generation: %s\n", err);
        tree_remove();
        return 1;
    }
    MG_RUN(test_json_round_trip);
    MG_RUN(test_json_empty_and_null_kept);
    MG_RUN(test_json_numbers);
    MG_RUN(test_json_big_integers);
    MG_RUN(test_json_raw_text);
    MG_RUN(test_json_unicode);
    MG_RUN(test_json_unencodable);
    MG_RUN(test_route_default_policy);
    MG_RUN(test_route_plan_limit);
    MG_RUN(test_sort_primitives);
    MG_RUN(test_module_draws_and_functions);
    mg_gen_unref(G);
    tree_remove();

    MG_RUN(test_route_custom_policy);
    return mg_test_summary();
}
