/* Unit tests for core/luavm/luavm.c: loading generations (and every way a load is rejected, with
 * its message), generation reference counting, the JSON <-> Lua mapping, the routing call
 * and the adapter calls (encode / decode / decode_event) with the repository's own
 * adapters on the Ollama fixtures.
 *
 * Each load test works on a fresh copy of adapters/, policies/ and lua/ in a temp
 * directory (the config's lua.* keys point there), so a test may break one file without
 * touching the repository. */
#include "conf/config.h"
#include "luavm/luavm.h"
#include "mgtest.h"
#include "luavm/order.h"

#include <dirent.h>
#include <ftw.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MG_SOURCE_DIR
#define MG_SOURCE_DIR "."
#endif

static char root[256];     /* the current temp tree */
static char cfg_path[512]; /* root/moongate.yaml */
static char err[2048];

/* ---- temp trees ------------------------------------------------------------------------ */

static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in) return -1;
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return -1;
    }
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        fwrite(buf, 1, n, out);
    fclose(in);
    return fclose(out);
}

static int copy_tree(const char *from, const char *to)
{
    if (mkdir(to, 0700) != 0) return -1;
    DIR *d = opendir(from);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char a[1024], b[1024];
        snprintf(a, sizeof(a), "%s/%s", from, e->d_name);
        snprintf(b, sizeof(b), "%s/%s", to, e->d_name);
        struct stat st;
        if (stat(a, &st) != 0)
            rc = -1;
        else if (S_ISDIR(st.st_mode))
            rc = copy_tree(a, b);
        else if (S_ISREG(st.st_mode))
            rc = copy_file(a, b);
    }
    closedir(d);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void tree_remove(void)
{
    if (root[0]) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    root[0] = '\0';
}

static void write_text(const char *rel, const char *text)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    if (!f) {
        perror(p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* clang-format off */
/* The provider block starts at line 7; ol (the third provider) is at line 15. */
static const char *providers_default =
    "providers:\n"                                  /* 7 */
    "  - id: oa\n"                                  /* 8 */
    "    adapter: openai\n"                         /* 9 */
    "    base_url: http://127.0.0.1:1/v1\n"         /* 10 */
    "    api_key: sk-test\n"                        /* 11 */
    "  - id: oa-nokey\n"                            /* 12 */
    "    adapter: openai\n"                         /* 13 */
    "    base_url: http://127.0.0.1:1/v1\n"         /* 14 */
    "  - id: ol\n"                                  /* 15 */
    "    adapter: ollama\n"                         /* 16 */
    "    base_url: %s\n"                            /* 17 */
    "    pool: fallback\n"                          /* 18 */
    "    local: true\n"                             /* 19 */
    "    weight: 2.5\n"                             /* 20 */
    "models:\n"
    "  m:\n"
    "    routes:\n"
    "      - { provider: oa, model: up-a }\n"
    "      - { provider: oa-nokey, model: up-b }\n"
    "      - { provider: ol, model: up-c }\n";
/* clang-format on */

/* A fresh tree with a config; ollama_url is the base_url of provider ol. */
static void tree_new_with(const char *ollama_url)
{
    tree_remove();
    snprintf(root, sizeof(root), "/tmp/mg-luavm-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        exit(1);
    }
    const char *dirs[] = {"adapters", "policies", "lua"};
    for (int i = 0; i < 3; i++) {
        char a[512], b[512];
        snprintf(a, sizeof(a), "%s/%s", MG_SOURCE_DIR, dirs[i]);
        snprintf(b, sizeof(b), "%s/%s", root, dirs[i]);
        if (copy_tree(a, b) != 0) {
            fprintf(stderr, "cannot copy %s\n", a);
            exit(1);
        }
    }
    char providers[2048], yaml[4096];
    snprintf(providers, sizeof(providers), providers_default, ollama_url);
    snprintf(yaml, sizeof(yaml),
             "server:\n"               /* 1 */
             "  listen: 127.0.0.1:0\n" /* 2 */
             "lua:\n"                  /* 3 */
             "  policies: %s/policies\n"
             "  adapters: %s/adapters\n"
             "  lib: %s/lua\n"
             "%s",
             root, root, root, providers);
    write_text("moongate.yaml", yaml);
    snprintf(cfg_path, sizeof(cfg_path), "%s/moongate.yaml", root);
}

static void tree_new(void)
{
    tree_new_with("http://127.0.0.1:2");
}

/* Load the current tree; returns the generation or NULL (message in err). */
static mg_gen_t *load(void)
{
    mg_gen_t *g = (mg_gen_t *)1;
    err[0] = '\0';
    int rc = mg_gen_load(cfg_path, 7, &g, err, sizeof(err));
    if (rc != 0) {
        if (g != NULL) fprintf(stderr, "  load failed but *out is not NULL\n");
        return NULL;
    }
    if (!g) fprintf(stderr, "  load succeeded but *out is NULL\n");
    return g;
}

/* Expect the load to fail with a message containing every given piece. */
static void expect_load_error(const char *a, const char *b, const char *c)
{
    mg_gen_t *g = load();
    CHECK(g == NULL);
    if (g) {
        mg_gen_unref(g);
        return;
    }
    const char *pieces[] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        if (!pieces[i]) continue;
        int found = strstr(err, pieces[i]) != NULL;
        if (!found) fprintf(stderr, "  error \"%s\" lacks \"%s\"\n", err, pieces[i]);
        CHECK(found);
    }
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

static cJSON *fixture(const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/tests/fixtures/ollama/%s", MG_SOURCE_DIR, name);
    char *s = read_all(p);
    if (!s) {
        fprintf(stderr, "  cannot read %s\n", p);
        return NULL;
    }
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

static int provider_index(mg_gen_t *g, const char *id)
{
    const mg_provider_conf_t *p = mg_config_provider(g->cfg, id);
    return p ? (int)(p - g->cfg->providers) : -1;
}

static int adapter_of(mg_gen_t *g, const char *provider_id)
{
    int i = provider_index(g, provider_id);
    return i >= 0 ? g->provider_adapter[i] : -1;
}

/* Run a Lua chunk in the generation's state that returns a string; compare. */
static void lua_expect(mg_gen_t *g, const char *code, const char *expect)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    if (luaL_dostring(L, code) != LUA_OK) {
        fprintf(stderr, "  lua error: %s\n", lua_tostring(L, -1));
        CHECK(!"lua chunk ran");
    } else {
        CHECK_STR(lua_tostring(L, -1), expect);
    }
    lua_settop(L, top);
}

/* A fresh tree whose routing policy is src, loaded; NULL (the tree removed) when the load
 * failed. */
static mg_gen_t *load_routing(const char *src)
{
    tree_new();
    write_text("policies/routing.lua", src);
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "  load: %s\n", err);
        tree_remove();
    }
    return g;
}

/* The end of a test that loaded: nothing left on the Lua stack, the generation and the tree
 * gone. */
static void unload_routing(mg_gen_t *g)
{
    CHECK_EQ_INT(lua_gettop(g->L), 0);
    mg_gen_unref(g);
    tree_remove();
}

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

/* mg_gen_route with the plan flattened to indexes, as the old API returned them. */
static int route_order(mg_gen_t *g, int rr, const mg_candidate_t *c, int n, int *order,
                       char *e, size_t elen)
{
    mg_plan_entry_t entries[8];
    mg_plan_t plan = {.entries = entries, .limit = 0};
    if (mg_gen_route(g, &(mg_lua_req_t){0}, &rr, 1, c, n, &plan, e, elen) != 0) return -1;
    for (int i = 0; i < plan.n; i++) order[i] = entries[i].index;
    return plan.n;
}

static mg_route_conf_t test_routes[3] = {
    {.model = "up-a"}, {.model = "up-b"}, {.model = "up-c"}};

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
    mg_lua_req_t info = {.request_id = "req-1", .endpoint = "chat", .model = "m", .stream = 0,
                         .max_tokens = -1, .created = 1, .allow_cloud = 1};
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
    CHECK_EQ_INT(route_order(g, rr, c, 3, order, err, sizeof(err)), 3);
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
    mg_lua_req_t a = {.request_id = "req-a", .endpoint = "chat", .model = "m", .max_tokens = 5,
                      .created = 1, .pin = "oa", .pool = "fallback"};
    mg_lua_req_t b = {.request_id = "req-b", .endpoint = "chat", .model = "m", .max_tokens = -1,
                      .created = 2};
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

static mg_gen_t *G; /* one generation for the conversion and call tests */

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

static int make_cands(mg_gen_t *g, mg_candidate_t *c, const int *avail)
{
    const char *ids[] = {"oa", "oa-nokey", "ol"};
    for (int i = 0; i < 3; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        c[i].provider = mg_config_provider(g->cfg, ids[i]);
        c[i].route = &test_routes[i];
        c[i].available = avail[i];
        c[i].in_flight = i * 3 + 1;
        c[i].headroom = 1;
        c[i].health = "healthy";
        c[i].breaker = "closed";
        c[i].success_rate = c[i].ttft_ms = -1;
        c[i].load_kv_cache = -1;
    }
    return 3;
}

static int route(mg_gen_t *g, const char *model, const int *avail, int *order)
{
    mg_lua_req_t info = {.request_id = "req-route", .endpoint = "chat", .model = model, .stream = 1,
                         .max_tokens = 100, .created = 1700000000, .allow_cloud = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_candidate_t c[3];
    int n = make_cands(g, c, avail);
    int top = lua_gettop(g->L);
    err[0] = '\0';
    int rc = route_order(g, rr, c, n, order, err, sizeof(err));
    CHECK_EQ_INT(lua_gettop(g->L), top);
    mg_gen_unref_value(g, rr);
    return rc;
}

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
    mg_lua_req_t info = {.request_id = "req-limit", .endpoint = "chat", .model = "m",
                         .max_tokens = 100, .created = 1700000000, .allow_cloud = 1,
                         .random = 0.37};
    int rr = mg_gen_req_new(G, &info);
    mg_candidate_t c[3];
    int all[3] = {1, 1, 1};
    make_cands(G, c, all);
    mg_plan_entry_t full[3], cut[3], again[3];
    mg_plan_t p_full = {.entries = full, .limit = 0}, p_cut = {.entries = cut, .limit = 2}, p_again = {.entries = again, .limit = 0};
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
    mg_lua_req_t info = {.request_id = "req-x", .endpoint = "embeddings", .model = "inspect", .stream = 0, .max_tokens = -1, .created = 5};
    int rr = mg_gen_req_new(g, &info);
    mg_candidate_t c[3];
    make_cands(g, c, all);
    CHECK_EQ_INT(route_order(g, rr, c, 3, order, err, sizeof(err)), 0);
    mg_gen_unref_value(g, rr);
    lua_expect(g, "return tostring(seen_req.max_tokens) .. ' ' .. tostring(seen_req.stream)",
               "nil false");
    /* n smaller than what the policy returns: never more than n written */
    rr = mg_gen_req_new(g, &(mg_lua_req_t){.request_id = "req-y", .endpoint = "chat", .model = "dup", .stream = 0, .max_tokens = -1, .created = 5});
    int small[1] = {-1};
    CHECK_EQ_INT(route_order(g, rr, c, 1, small, err, sizeof(err)), 1);
    CHECK_EQ_INT(small[0], 0);
    mg_gen_unref_value(g, rr);
    unload_routing(g);
}

/* ---- candidate tables kept across calls -------------------------------------------------- */

/* clang-format off */
static const char *kept_routing =
    "local M = { name = 'routing', version = 1 }\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  lists = lists or {}\n"
    "  lists[calls] = c\n"
    "  if req.model == 'mark' then\n"
    "    c[1].degraded, c[1].emergency = 'fallback', true\n"
    "    return { c[1], c[2] }\n"
    "  elseif req.model == 'markboom' then\n"
    "    c[2].degraded = 'cloud'\n"
    "    error('failed after marking')\n"
    "  elseif req.model == 'unmarked' then\n"
    "    local p = { c[3], c[1], c[2] }\n"
    "    p.unmarked = true\n"
    "    return p\n"
    "  end\n"
    "  local p = {}\n"
    "  for i = 1, #c do p[i] = c[i] end\n"
    "  return p\n"
    "end\n"
    "return M\n";
/* clang-format on */

/* The routes of model m in the generation's own config (the ones with kept tables). */
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

/* Route model `model` over c; plan indexes into order (entries' degraded into degraded). */
static int route_cands(mg_gen_t *g, const char *model, const mg_candidate_t *c, int n,
                       int *order, const char **degraded, int *emergency)
{
    mg_lua_req_t info = {.request_id = "req-kept", .endpoint = "chat", .model = model,
                         .max_tokens = -1, .created = 1, .allow_cloud = 1, .local_first = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_plan_entry_t entries[4];
    mg_plan_t plan = {.entries = entries, .limit = 0};
    err[0] = '\0';
    int rc = mg_gen_route(g, &info, &rr, 1, c, n, &plan, err, sizeof(err));
    mg_gen_unref_value(g, rr);
    for (int i = 0; rc == 0 && i < plan.n; i++) {
        order[i] = entries[i].index;
        if (degraded) degraded[i] = entries[i].degraded;
        if (emergency) emergency[i] = entries[i].emergency;
    }
    return rc == 0 ? plan.n : -1;
}

/* ---- plans that hold (plankeep.h) ------------------------------------------------------ */

/* clang-format off */
static const char *holding_routing =
    "local M = { name = 'routing', version = 1 }\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  if req.model == 'boom' then error('policy exploded') end\n"
    "  if req.model == 'wait' then return { wait_ms = 5, reuse = true } end\n"
    "  local p = {}\n"
    "  for i = #c, 1, -1 do if c[i].available then p[#p + 1] = c[i] end end\n"
    "  if req.model == 'marked' then c[#c].degraded = 'fallback' end\n"
    "  p.reuse = req.model ~= 'fresh'\n"
    "  return p\n"
    "end\n"
    "return M\n";
/* clang-format on */

static int lua_calls(mg_gen_t *g)
{
    lua_getglobal(g->L, "calls");
    int n = (int)lua_tointeger(g->L, -1);
    lua_pop(g->L, 1);
    return n;
}

/* Route a request that has no table yet; *made: whether one was made. */
static int hold_route(mg_gen_t *g, const mg_lua_req_t *info, int attempt, int keep,
                      const mg_candidate_t *c, int n, mg_plan_entry_t *entries, int *made)
{
    int rr = -1;
    mg_plan_t plan = {.entries = entries, .limit = 0, .keep = keep};
    int rc = mg_gen_route(g, info, &rr, attempt, c, n, &plan, err, sizeof(err));
    *made = rr >= 0;
    if (rr >= 0) mg_gen_unref_value(g, rr);
    return rc == 0 ? plan.n : -1;
}

static void test_route_kept_plans(void)
{
    mg_gen_t *g = load_routing(holding_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2};
    mg_candidate_t c[3];
    config_cands(g, c, all3, 3);
    mg_plan_entry_t e[3];
    int made = 0;
    mg_lua_req_t hold = {.request_id = "req-1", .endpoint = "chat", .model = "hold",
                         .max_tokens = -1, .created = 1, .priority = "P2", .allow_cloud = 1,
                         .local_first = 1, .random = 0.25};
    /* the first request asks the policy and the plan is kept; the next ones get it without
       a call and without a request table, whatever their own numbers */
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
    CHECK(e[0].index == 2 && e[1].index == 1 && e[2].index == 0);
    CHECK_EQ_INT(lua_calls(g), 1);
    CHECK(made);
    mg_lua_req_t other = hold;
    other.request_id = "req-2";
    other.random = 0.9;
    other.max_tokens = 500;
    c[0].in_flight = 40;
    c[1].headroom = 0.1;
    c[2].success_rate = 0.5;
    memset(e, 0xff, sizeof(e));
    CHECK_EQ_INT(hold_route(g, &other, 1, 1, c, 3, e, &made), 3);
    CHECK(e[0].index == 2 && e[1].index == 1 && e[2].index == 0);
    CHECK(e[0].degraded == NULL && !e[0].emergency);
    CHECK_EQ_INT(lua_calls(g), 1);
    CHECK(!made);
    /* a candidate's state changes: asked again (and that plan kept) */
    c[1].available = 0;
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 2);
    CHECK(e[0].index == 2 && e[1].index == 0);
    CHECK_EQ_INT(lua_calls(g), 2);
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 2);
    CHECK_EQ_INT(lua_calls(g), 2);
    c[1].available = 1;
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
    CHECK_EQ_INT(lua_calls(g), 3);
    const char *other_breaker = "open";
    c[2].breaker = other_breaker;
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
    CHECK_EQ_INT(lua_calls(g), 4);
    c[2].cooling = 1;
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
    CHECK_EQ_INT(lua_calls(g), 5);
    /* each routing field of the request is part of the key */
    mg_lua_req_t v[8];
    for (int i = 0; i < 8; i++) v[i] = hold;
    v[0].pin = "oa";
    v[1].pool = "fallback";
    v[2].priority = "P0";
    v[3].stream = 1;
    v[4].local_only = 1;
    v[5].allow_smaller_model = 1;
    v[6].allow_cloud = 0;
    v[7].endpoint = "completions";
    for (int i = 0; i < 8; i++) {
        CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
        int before = lua_calls(g);
        CHECK_EQ_INT(hold_route(g, &v[i], 1, 1, c, 3, e, &made), 3);
        CHECK_EQ_INT(lua_calls(g), before + 1);
    }
    /* a different candidate list (fewer routes) is asked about */
    int before = lua_calls(g);
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 2, e, &made), 2);
    CHECK_EQ_INT(lua_calls(g), before + 1);
    /* kept only at attempt 1 and when the caller allows it */
    CHECK_EQ_INT(hold_route(g, &hold, 1, 1, c, 3, e, &made), 3);
    before = lua_calls(g);
    CHECK_EQ_INT(hold_route(g, &hold, 2, 1, c, 3, e, &made), 3);
    CHECK_EQ_INT(hold_route(g, &hold, 1, 0, c, 3, e, &made), 3);
    CHECK_EQ_INT(lua_calls(g), before + 2);
    /* a plan without reuse, a wait and an error are never kept */
    mg_lua_req_t fresh = hold, wait = hold, boom = hold;
    fresh.model = "fresh";
    wait.model = "wait";
    boom.model = "boom";
    before = lua_calls(g);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(hold_route(g, &fresh, 1, 1, c, 3, e, &made), 3);
        CHECK_EQ_INT(hold_route(g, &wait, 1, 1, c, 3, e, &made), 0);
        CHECK_EQ_INT(hold_route(g, &boom, 1, 1, c, 3, e, &made), -1);
    }
    CHECK_EQ_INT(lua_calls(g), before + 6);
    /* markers are kept with the plan */
    mg_lua_req_t marked = hold;
    marked.model = "marked";
    for (int i = 0; i < 2; i++) {
        memset(e, 0, sizeof(e));
        CHECK_EQ_INT(hold_route(g, &marked, 1, 1, c, 3, e, &made), 3);
        CHECK(e[0].degraded && strcmp(e[0].degraded, "fallback") == 0);
        CHECK(e[1].degraded == NULL);
    }
    unload_routing(g);
}

static void test_route_kept_candidates(void)
{
    mg_gen_t *g = load_routing(kept_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2}, last2[2] = {1, 2}, first2[2] = {0, 1};
    mg_candidate_t c[3];
    int order[4];
    config_cands(g, c, all3, 3);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    c[0].in_flight = 9;
    c[0].available = 0;
    c[0].breaker = c[0].route_breaker = "open";
    c[2].success_rate = 0.5;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    /* the same list and tables, with the new facts; the config fields untouched */
    lua_expect(g,
               "local a, b = lists[1], lists[2]\n"
               "return tostring(a == b and a[1] == b[1] and a[3] == b[3]) .. ' ' ..\n"
               "  b[1].in_flight .. ' ' .. tostring(b[1].available) .. ' ' ..\n"
               "  b[1].breaker .. ' ' .. b[1].route_breaker .. ' ' .. tostring(b[2].route_breaker) ..\n"
               "  ' ' .. tostring(b[3].success_rate) .. ' ' .. b[3].provider .. ' ' .. b[3].pool ..\n"
               "  ' ' .. tostring(b[2].success_rate) .. ' ' .. tostring(a.alike)",
               "true 9 false open open nil 0.5 ol fallback nil false");
    /* markers: read into the plan, then cleared from the kept tables */
    const char *deg[4] = {0};
    int emg[4] = {0};
    CHECK_EQ_INT(route_cands(g, "mark", c, 3, order, deg, emg), 2);
    CHECK_STR(deg[0], "fallback");
    CHECK_EQ_INT(emg[0], 1);
    CHECK(deg[1] == NULL && emg[1] == 0);
    lua_expect(g, "return tostring(lists[3][1].degraded) .. tostring(lists[3][1].emergency)",
               "nilnil");
    /* a policy that fails after marking leaves no marker behind */
    CHECK_EQ_INT(route_cands(g, "markboom", c, 3, order, NULL, NULL), -1);
    lua_expect(g, "return tostring(lists[4][2].degraded)", "nil");
    /* an unmarked plan is read by address */
    CHECK_EQ_INT(route_cands(g, "unmarked", c, 3, order, deg, NULL), 3);
    CHECK(order[0] == 2 && order[1] == 0 && order[2] == 1);
    CHECK(deg[0] == NULL);
    /* part of the routes: the kept tables say their place in this list ... */
    config_cands(g, c, last2, 2);
    CHECK_EQ_INT(route_cands(g, "unmarked", c, 2, order, NULL, NULL), 0);
    CHECK_EQ_INT(route_cands(g, "m", c, 2, order, NULL, NULL), 2);
    CHECK(order[0] == 0 && order[1] == 1);
    lua_expect(g,
               "local l = lists[#lists]\n"
               "return l[1].index .. l[2].index .. ' ' .. l[1].provider .. ' ' ..\n"
               "  tostring(l[1] == lists[1][2]) .. ' ' .. tostring(l.alike)",
               "12 oa-nokey true false");
    config_cands(g, c, first2, 2);
    CHECK_EQ_INT(route_cands(g, "m", c, 2, order, NULL, NULL), 2);
    lua_expect(g, "return tostring(lists[#lists].alike)", "true");
    /* ... and the whole list again */
    config_cands(g, c, all3, 3);
    CHECK_EQ_INT(route_cands(g, "unmarked", c, 3, order, NULL, NULL), 3);
    CHECK(order[0] == 2 && order[1] == 0 && order[2] == 1);
    lua_expect(g, "local l = lists[#lists] return l[1].index .. l[2].index .. l[3].index",
               "123");
    /* a route given twice: two tables */
    c[1].route = c[0].route;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    CHECK(order[0] == 0 && order[1] == 1 && order[2] == 2);
    lua_expect(g, "local l = lists[#lists] return tostring(l[1] ~= l[2]) .. l[2].index",
               "true2");
    /* routes outside the config get fresh tables */
    int avail[3] = {1, 1, 1};
    make_cands(g, c, avail);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "local n = #lists return tostring(lists[n][1] ~= lists[n - 1][1])", "true");
    unload_routing(g);
}

/* ---- rule 8's keys kept by the core ------------------------------------------------------ */

/* The end of a test policy: route() keeps every candidates list it gets (lists[n], calls =
 * n) and returns the candidates in order. */
#define RECORDING_ROUTE                                                                          \
    "function M.route(req, c)\n"                                                                 \
    "  calls = (calls or 0) + 1\n"                                                               \
    "  lists = lists or {}\n"                                                                    \
    "  lists[calls] = c\n"                                                                       \
    "  local p = {}\n"                                                                           \
    "  for i = 1, #c do p[i] = c[i] end\n"                                                       \
    "  return p\n"                                                                               \
    "end\n"                                                                                      \
    "return M\n"

/* clang-format off */
static const char *keyed_routing =
    "local M = { name = 'routing', version = 1 }\n"
    "function M.adaptive_key(rate, n, ttft, ttft_n)\n"
    "  key_calls = (key_calls or 0) + 1\n"
    "  if rate == 0.25 then error('key exploded') end\n"
    "  if n < 5 then return nil end\n"
    "  return (ttft or 0) - rate * 1000\n"
    "end\n"
    RECORDING_ROUTE;
/* clang-format on */

/* c.adaptive_key and candidates.adaptive_keys of the last call, as "k1 k2 k3 | list". */
static const char *last_keys =
    "local l, out = lists[#lists], {}\n"
    "for i = 1, #l do\n"
    "  local k = l[i].adaptive_key\n"
    "  out[i] = type(k) == 'number' and string.format('%g', k) or tostring(k)\n"
    "end\n"
    "local keys = l.adaptive_keys\n"
    "local shown = keys and string.format('%g %g %g', keys[1], keys[2], keys[3]) or 'nil'\n"
    "return table.concat(out, ' ') .. ' | ' .. shown";

static void set_samples(mg_candidate_t *c, int n, double rate, double ttft)
{
    c->avail_samples = c->ttft_samples = n;
    c->success_rate = rate;
    c->ttft_ms = ttft;
}

static void test_route_adaptive_keys_kept(void)
{
    mg_gen_t *g = load_routing(keyed_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2}, last2[2] = {1, 2};
    mg_candidate_t c[3];
    int order[4];
    config_cands(g, c, all3, 3);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "false false false | nil"); /* no samples: no keys */
    set_samples(&c[0], 10, 1, 100);
    set_samples(&c[1], 10, 0.5, 200);
    set_samples(&c[2], 10, 0.9, 300);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "-900 -300 -600 | -900 -300 -600");
    lua_expect(g, "return tostring(lists[1] == lists[2])", "true");
    /* computed when the samples change, not on every call */
    lua_expect(g, "local n = key_calls return n", "6");
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "return key_calls", "6");
    set_samples(&c[1], 2, 0.5, 200); /* too few again: the list has no keys */
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "-900 false -600 | nil");
    /* a call over part of the routes moves keys: the whole list's keys follow */
    config_cands(g, c, last2, 2);
    set_samples(&c[0], 10, 0.5, 200);
    set_samples(&c[1], 10, 0.9, 400);
    CHECK_EQ_INT(route_cands(g, "m", c, 2, order, NULL, NULL), 2);
    config_cands(g, c, all3, 3);
    set_samples(&c[0], 10, 1, 100);
    set_samples(&c[1], 10, 0.5, 200);
    set_samples(&c[2], 10, 0.9, 400);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "-900 -300 -500 | -900 -300 -500");
    /* adaptive_key raising: no key (route() would compute it, and fail, itself) */
    set_samples(&c[0], 10, 0.25, 100);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "nil -300 -500 | nil");
    /* tables made for one call have their key too, the list none */
    int avail[3] = {1, 1, 1};
    make_cands(g, c, avail);
    set_samples(&c[2], 10, 0.5, 100);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_keys, "false false -400 | nil");
    unload_routing(g);
}

/* ---- rule 7's shares kept by the core ------------------------------------------------------ */

/* clang-format off */
static const char *shared_routing =
    "local M = { name = 'routing', version = 1 }\n"
    "function M.share(c)\n"
    "  share_calls = (share_calls or 0) + 1\n"
    "  if c.headroom == 0.25 then error('share exploded') end\n"
    "  return c.weight * c.headroom\n"
    "end\n"
    RECORDING_ROUTE;

/* c.share and candidates.shares of the last call, then all_usable: "s1 s2 s3 | list | u". */
static const char *last_shares =
    "local l, out = lists[#lists], {}\n"
    "for i = 1, #l do out[i] = string.format('%g', l[i].share or -1) end\n"
    "local s = l.shares\n"
    "local shown = s and string.format('%g %g %g', s[1], s[2], s[3]) or 'nil'\n"
    "return table.concat(out, ' ') .. ' | ' .. shown .. ' | ' .. tostring(l.all_usable)";
/* clang-format on */

static void test_route_shares_kept(void)
{
    mg_gen_t *g = load_routing(shared_routing);
    if (!g) return;
    const int all3[3] = {0, 1, 2};
    mg_candidate_t c[3];
    int order[4];
    config_cands(g, c, all3, 3); /* weights 1, 1, 2.5 (ol) */
    for (int i = 0; i < 3; i++) c[i].headroom = 1;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_shares, "1 1 2.5 | 1 1 2.5 | true");
    lua_expect(g, "return share_calls", "3");
    /* in_flight, rpm_used, samples: the share stays, no call */
    c[0].in_flight = 4;
    c[1].rpm_used = 9;
    c[2].avail_samples = 12;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "return share_calls", "3");
    /* headroom moves: that route's share, and the list's, follow */
    c[1].headroom = 0.5;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_shares, "1 0.5 2.5 | 1 0.5 2.5 | true");
    lua_expect(g, "return share_calls", "4");
    /* share raising: no share there, no list (route() would compute it, and fail, itself) */
    c[0].headroom = 0.25;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_shares, "-1 0.5 2.5 | nil | true");
    c[0].headroom = 0.75;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, last_shares, "0.75 0.5 2.5 | 0.75 0.5 2.5 | true");
    /* all_usable: false while a route is unavailable or cooling */
    c[1].available = 0;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "return tostring(lists[#lists].all_usable)", "false");
    c[1].available = 1;
    c[2].cooling = 1;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "return tostring(lists[#lists].all_usable)", "false");
    c[2].cooling = 0;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "return tostring(lists[#lists].all_usable)", "true");
    /* tables made for one call have their share too */
    int avail[3] = {1, 1, 1};
    make_cands(g, c, avail);
    c[2].headroom = 0.5;
    CHECK_EQ_INT(route_cands(g, "m", c, 3, order, NULL, NULL), 3);
    lua_expect(g, "local l = lists[#lists] return string.format('%g', l[3].share)", "1.25");
    unload_routing(g);
}

/* The default policy over the core's kept tables (keys and shares kept by the core, the
 * whole list's keys, shares and all_usable at once, weighted_order reading the core's copies
 * of those lists) and over plain copies of them (all of it computed by route()): the same
 * plans.
 * The wrapper below runs both on every call. */
/* clang-format off */
static const char *keys_twin_routing =
    "local real = dofile(%s)\n"
    "local M = { name = 'routing', version = 1, adaptive_key = real.adaptive_key,\n"
    "  share = real.share }\n"
    "local function plain(list)\n"
    "  local out = { alike = list.alike }\n"
    "  for i, c in ipairs(list) do\n"
    "    out[i] = {}\n"
    "    for k, v in pairs(c) do\n"
    "      if k ~= 'adaptive_key' and k ~= 'share' then out[i][k] = v end\n"
    "    end\n"
    "  end\n"
    "  return out\n"
    "end\n"
    "local function describe(plan)\n"
    "  if plan.wait_ms then return 'wait ' .. plan.wait_ms end\n"
    "  local p = {}\n"
    "  for i, c in ipairs(plan) do\n"
    "    p[i] = c.index .. ':' .. tostring(c.degraded) .. ':' .. tostring(c.emergency)\n"
    "  end\n"
    "  return table.concat(p, ',')\n"
    "end\n"
    "function M.route(req, c)\n"
    "  calls = (calls or 0) + 1\n"
    "  if c.adaptive_keys then keyed = (keyed or 0) + 1 end\n"
    "  if c.shares then shared = (shared or 0) + 1 end\n"
    "  if c.all_usable then usable = (usable or 0) + 1 end\n"
    "  local want = describe(real.route(req, plain(c)))\n"
    "  local plan = real.route(req, c)\n"
    "  local got = describe(plan)\n"
    "  if got ~= want and not mismatch then mismatch = calls .. ': ' .. got .. ' / ' .. want end\n"
    "  return plan\n"
    "end\n"
    "return M\n";
/* clang-format on */

/* 12 providers (main and fallback, a local one, weights), model "mixed" over all of them in
 * two priority groups, model "alike" over five alike main providers. */
static void write_keys_twin_config(void)
{
    char yaml[4096], policy[2048], path[600];
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
                      "      - { provider: p%d, model: up%d, priority: %d }\n", i, i, i == 7);
    n += snprintf(yaml + n, sizeof(yaml) - (size_t)n, "  alike:\n    routes:\n");
    for (int i = 0; i < 5; i++)
        n += snprintf(yaml + n, sizeof(yaml) - (size_t)n,
                      "      - { provider: p%d, model: a%d }\n", i, i);
    write_text("moongate.yaml", yaml);
    snprintf(path, sizeof(path), "'%s/policies/routing.lua'", MG_SOURCE_DIR); /* the real one */
    snprintf(policy, sizeof(policy), keys_twin_routing, path);
    write_text("policies/routing.lua", policy);
}

/* Random facts for the routes of model `name`: measured (all of them in half the rounds),
 * now and then unavailable or cooling, various loads. */
static int random_facts(mg_gen_t *g, const char *name, mg_candidate_t *c, uint64_t *seed)
{
    static const double rates[] = {1, 0.97, 0.9, 0.5}, ttfts[] = {80, 85, 120, 900};
    const mg_model_conf_t *m = mg_config_model(g->cfg, name);
    int all_measured = mg_splitmix64(seed) % 2;
    for (size_t i = 0; i < m->n_routes; i++) {
        uint64_t z = mg_splitmix64(seed);
        memset(&c[i], 0, sizeof(c[i]));
        c[i].provider = mg_config_provider(g->cfg, m->routes[i].provider);
        c[i].route = &m->routes[i];
        c[i].available = z % 20 != 0;
        c[i].cooling = (z >> 5) % 25 == 0;
        c[i].cooldown_remaining_ms = c[i].cooling ? (long long)((z >> 10) % 20000) : 0;
        c[i].headroom = (z >> 16) % 4 == 0 ? 0.5 : 1;
        c[i].in_flight = (int)((z >> 20) % 3);
        c[i].health = "healthy";
        c[i].breaker = "closed";
        c[i].load_kv_cache = -1;
        int measured = all_measured || (z >> 24) % 3 != 0;
        set_samples(&c[i], measured ? 5 + (int)((z >> 28) % 10) : (int)((z >> 28) % 3),
                    rates[(z >> 32) % 4], ttfts[(z >> 36) % 4] + (double)((z >> 40) % 3));
    }
    return (int)m->n_routes;
}

static void test_route_kept_keys_twin(void)
{
    tree_new();
    write_keys_twin_config();
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        fprintf(stderr, "  load: %s\n", err);
        tree_remove();
        return;
    }
    uint64_t seed = 2024;
    mg_candidate_t c[12];
    mg_plan_entry_t entries[12];
    for (int round = 0; round < 600; round++) {
        const char *name = round % 2 ? "alike" : "mixed";
        int n = random_facts(g, name, c, &seed);
        mg_lua_req_t info = {.request_id = "req-twin", .endpoint = "chat", .model = name,
                             .max_tokens = -1, .created = 1, .allow_cloud = 1,
                             .local_first = round % 5 != 0,
                             .pool = round % 7 == 0 ? "fallback" : NULL,
                             .random = mg_unit_double(mg_splitmix64(&seed))};
        int rr = mg_gen_req_new(g, &info);
        mg_plan_t plan = {.entries = entries, .limit = 0};
        CHECK(mg_gen_route(g, &info, &rr, 1, c, n, &plan, err, sizeof(err)) == 0);
        mg_gen_unref_value(g, rr);
    }
    lua_expect(g, "return tostring(mismatch)", "nil");
    lua_expect(g, "return tostring(calls == 600 and keyed > 50 and shared > 50 and usable > 50)",
               "true");
    unload_routing(g);
}

/* policies/routing.lua orders with moongate.sort_by / weighted_order in the gateway and with
 * its own Lua twins under busted: the two must give the same plans. */
static const char *twin_check =
    "local dir = ...\n"
    "local saved = package.loaded.moongate\n"
    "package.loaded.moongate = nil\n"
    "local twin = dofile(dir .. '/routing.lua')\n"
    "package.loaded.moongate = saved\n"
    "local core = dofile(dir .. '/routing.lua')\n"
    "local state = 12345\n"
    "local function rnd()\n"
    "  state = state * 6364136223846793005 + 1442695040888963407\n"
    "  return (state >> 11) * 2.0 ^ -53\n"
    "end\n"
    "local function pick(t) return t[1 + math.floor(rnd() * #t)] end\n"
    "local function build(spec)\n"
    "  local c = {}\n"
    "  for i, s in ipairs(spec) do\n"
    "    c[i] = {}\n"
    "    for k, v in pairs(s) do c[i][k] = v end\n"
    "  end\n"
    "  c.alike = spec.alike\n"
    "  return c\n"
    "end\n"
    "local function describe(plan)\n"
    "  if plan.wait_ms then return 'wait ' .. plan.wait_ms end\n"
    "  local p = {}\n"
    "  for i, c in ipairs(plan) do\n"
    "    p[i] = c.index .. ':' .. tostring(c.degraded) .. ':' .. tostring(c.emergency)\n"
    "  end\n"
    "  return table.concat(p, ',')\n"
    "end\n"
    "for k = 1, 1500 do\n"
    "  local spec, same, measured_share = {}, rnd() < 0.5, pick({ 0.5, 1 })\n"
    "  for i = 1, 1 + math.floor(rnd() * 30) do\n"
    "    local measured = rnd() < measured_share -- all measured: rule 8 orders every group\n"
    "    spec[i] = { index = i, provider = 'p' .. i, pool = pick({ 'main', 'main', 'fallback' }),\n"
    "      ['local'] = rnd() < 0.3, smaller = rnd() < 0.2, priority = pick({ 0, 0, 1 }),\n"
    "      weight = pick({ 1, 1, 2, 0.5 }), headroom = pick({ 1, 1, 0.5, 0 }),\n"
    "      available = rnd() < 0.85, cooling = rnd() < 0.15,\n"
    "      cooldown_remaining_ms = math.floor(rnd() * 20000), in_flight = math.floor(rnd() * 4),\n"
    "      avail_samples = measured and 10 or 0, ttft_samples = measured and 5 or 0,\n"
    "      success_rate = pick({ 1, 0.9, 0.5 }), ttft_ms = pick({ 100, 120, 900 }) }\n"
    "    if same and i > 1 then\n"
    "      for _, f in ipairs({ 'pool', 'local', 'smaller', 'priority', 'weight' }) do\n"
    "        spec[i][f] = spec[1][f]\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  spec.alike = same\n"
    "  local pool = pick({ 'none', 'main', 'fallback' })\n"
    "  local req = { request_id = 'twin', random = rnd(), pool = pool ~= 'none' and pool or nil,\n"
    "    allow_smaller_model = rnd() < 0.4, allow_cloud = rnd() < 0.9, local_first = rnd() < 0.8,\n"
    "    local_only = rnd() < 0.1, pin = rnd() < 0.1 and 'p1' or nil,\n"
    "    plan_limit = rnd() < 0.5 and 1 + math.floor(rnd() * 6) or nil }\n"
    "  local a = describe(core.route(req, build(spec)))\n"
    "  local b = describe(twin.route(req, build(spec)))\n"
    "  if a ~= b then return 'differ at ' .. k .. ': ' .. a .. ' / ' .. b end\n"
    "end\n"
    "return 'same'\n";

static void test_route_lua_twins_agree(void)
{
    lua_State *L = G->L;
    int top = lua_gettop(L);
    if (luaL_loadstring(L, twin_check) != LUA_OK) {
        fprintf(stderr, "  %s\n", lua_tostring(L, -1));
        CHECK(!"twin check compiles");
        lua_settop(L, top);
        return;
    }
    lua_pushstring(L, G->cfg->policies_dir);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        fprintf(stderr, "  %s\n", lua_tostring(L, -1));
        CHECK(!"twin check ran");
    } else {
        CHECK_STR(lua_tostring(L, -1), "same");
    }
    lua_settop(L, top);
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
    lua_expect(G,
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

/* ---- encode ---------------------------------------------------------------------------- */

static int header_count(const struct curl_slist *h)
{
    int n = 0;
    for (; h; h = h->next)
        n++;
    return n;
}

static int has_header(const struct curl_slist *h, const char *line)
{
    for (; h; h = h->next)
        if (strcmp(h->data, line) == 0) return 1;
    return 0;
}

static void test_encode_openai(void)
{
    const char *endpoints[] = {"chat", "completions", "embeddings"};
    const char *paths[] = {"/chat/completions", "/completions", "/embeddings"};
    int a = adapter_of(G, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(G->cfg, "oa");
    const mg_provider_conf_t *nokey = mg_config_provider(G->cfg, "oa-nokey");
    for (int i = 0; i < 3; i++) {
        mg_lua_req_t info = {.request_id = "req-e", .endpoint = endpoints[i], .model = "m", .stream = i == 0, .max_tokens = -1, .created = 1};
        int rr = mg_gen_req_new(G, &info);
        mg_encoded_t e;
        err[0] = '\0';
        CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), 0);
        CHECK_STR(e.method, "POST");
        CHECK_STR(e.path, paths[i]);
        CHECK_EQ_INT(header_count(e.headers), 1);
        CHECK(has_header(e.headers, "Authorization: Bearer sk-test"));
        CHECK(e.body == NULL); /* passthrough: the core sends its canonical body */
        CHECK_EQ_INT(e.ndjson, 0);
        mg_encoded_free(&e);
        CHECK(e.path == NULL && e.headers == NULL);
        /* without a key: no Authorization header at all */
        CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, nokey, "up-b", &e, err, sizeof(err)), 0);
        CHECK_EQ_INT(header_count(e.headers), 0);
        CHECK_STR(e.path, paths[i]);
        mg_encoded_free(&e);
        mg_gen_unref_value(G, rr);
    }
    /* an endpoint the adapter does not know: its error comes back */
    mg_lua_req_t info = {.request_id = "req-e", .endpoint = "audio", .model = "m", .stream = 0, .max_tokens = -1, .created = 1};
    int rr = mg_gen_req_new(G, &info);
    mg_encoded_t e;
    CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), -1);
    CHECK(strstr(err, "unsupported endpoint") != NULL);
    CHECK(e.path == NULL && e.headers == NULL && e.body == NULL);
    mg_gen_unref_value(G, rr);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

/* encode_per_route = true: one encode() per route, endpoint and stream mode, its answer
 * reused (keyed by the model's text, not its pointer); errors are not kept. */
static void test_encode_memo(void)
{
    tree_new();
    write_text("adapters/openai.lua",
               "local M = { name = 'openai', version = 1, passthrough = true, encode_per_route = true }\n"
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
        mg_lua_req_t info = {.request_id = "req-m", .endpoint = steps[i].endpoint, .model = "m",
                             .stream = steps[i].stream, .max_tokens = -1, .created = 1};
        int rr = mg_gen_req_new(g, &info);
        char model[16]; /* a fresh copy each time: the memo compares the text */
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
    /* a full memo: 64 answers kept (the 6 above among them), found again among the others;
       past that, answers are made afresh every time, never wrong */
    int kept = 0, fresh = 0;
    for (int i = 0; i < 70; i++) {
        char model[24], first[64] = "";
        snprintf(model, sizeof(model), "many-%d", i);
        for (int round = 0; round < 2; round++) {
            mg_lua_req_t info = {.request_id = "req-f", .endpoint = "chat", .model = "m",
                                 .stream = i % 2, .max_tokens = -1, .created = 1};
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
    mg_lua_req_t info = {.request_id = "req-l", .endpoint = "chat", .model = "m",
                         .max_tokens = -1, .created = 1};
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

static void test_encode_ollama(void)
{
    int a = adapter_of(G, "ol");
    const mg_provider_conf_t *ol = mg_config_provider(G->cfg, "ol");
    mg_lua_req_t info = {.request_id = "req-o", .endpoint = "chat", .model = "m", .stream = 1, .max_tokens = -1, .created = 1};
    int rr = mg_gen_req_new(G, &info);
    cJSON *body = cJSON_Parse("{\"model\":\"up-c\",\"messages\":[{\"role\":\"user\",\"content\":"
                              "\"hi\"}],\"max_tokens\":5,\"temperature\":0.5,\"stream\":true}");
    CHECK_EQ_INT(mg_gen_req_set_body(G, rr, body), 0);
    mg_encoded_t e;
    err[0] = '\0';
    CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, ol, "up-c", &e, err, sizeof(err)), 0);
    if (err[0]) fprintf(stderr, "  err: %s\n", err);
    CHECK_STR(e.method, "POST");
    CHECK_STR(e.path, "/api/chat");
    CHECK_EQ_INT(e.ndjson, 1);
    CHECK_EQ_INT(header_count(e.headers), 0);
    CHECK(e.body != NULL);
    if (e.body) {
        cJSON *want = cJSON_Parse("{\"model\":\"up-c\",\"messages\":[{\"role\":\"user\","
                                  "\"content\":\"hi\"}],\"stream\":true,"
                                  "\"options\":{\"num_predict\":5,\"temperature\":0.5}}");
        if (!cJSON_Compare(e.body, want, 1)) {
            char *s = cJSON_PrintUnformatted(e.body);
            fprintf(stderr, "  ollama body: %s\n", s);
            free(s);
        }
        CHECK(cJSON_Compare(e.body, want, 1));
        cJSON_Delete(want);
    }
    mg_encoded_free(&e);
    /* non-stream: stream is explicitly false (Ollama streams by default) */
    mg_gen_unref_value(G, rr);
    mg_lua_req_t info2 = {.request_id = "req-o2", .endpoint = "embeddings", .model = "m", .stream = 0, .max_tokens = -1, .created = 1};
    rr = mg_gen_req_new(G, &info2);
    cJSON_Delete(body);
    body = cJSON_Parse("{\"input\":[]}");
    mg_gen_req_set_body(G, rr, body);
    CHECK_EQ_INT(mg_gen_encode(G, a, &info2, &rr, ol, "emb", &e, err, sizeof(err)), 0);
    CHECK_STR(e.path, "/api/embed");
    if (e.body) {
        char *s = cJSON_PrintUnformatted(e.body);
        CHECK(strstr(s, "\"input\":[]") != NULL); /* the empty array stays an array */
        free(s);
    }
    mg_encoded_free(&e);
    mg_gen_unref_value(G, rr);
    cJSON_Delete(body);
    /* adapter error (bad content part) comes back as -1 with its message */
    mg_lua_req_t info3 = {.request_id = "req-o3", .endpoint = "chat", .model = "m", .stream = 0, .max_tokens = -1, .created = 1};
    rr = mg_gen_req_new(G, &info3);
    body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}");
    mg_gen_req_set_body(G, rr, body);
    CHECK_EQ_INT(mg_gen_encode(G, a, &info3, &rr, ol, "up-c", &e, err, sizeof(err)), -1);
    CHECK(strstr(err, "unsupported content part") != NULL);
    mg_gen_unref_value(G, rr);
    cJSON_Delete(body);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

/* encode results the core must refuse: bad method, missing path, header injection. */
static void test_encode_rejects_bad_results(void)
{
    tree_new();
    write_text(
        "adapters/openai.lua",
        "local M = { name = 'openai', version = 1, passthrough = true }\n"
        "function M.encode(req, route)\n"
        "  if req.model == 'method' then return { method = 'DELETE', path = '/x' } end\n"
        "  if req.model == 'nopath' then return { method = 'POST' } end\n"
        "  if req.model == 'crlf' then return { path = '/x', headers = { X = 'a\\r\\nB: c' } } "
        "end\n"
        "  if req.model == 'colon' then return { path = '/x', headers = { ['X:Y'] = 'a' } } end\n"
        "  if req.model == 'notable' then return 'nope' end\n"
        "  if req.model == 'badbody' then return { path = '/x', body = { f = print } } end\n"
        "  return { path = '/ok', headers = { ['X-N'] = 5 }, body = { a = 1 } }\n"
        "end\n"
        "return M\n");
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        tree_remove();
        return;
    }
    int a = adapter_of(g, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(g->cfg, "oa");
    const char *bad[] = {"method", "nopath", "crlf", "colon", "notable", "badbody"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mg_lua_req_t info = {.request_id = "r", .endpoint = "chat", .model = bad[i], .stream = 0, .max_tokens = -1, .created = 1};
        int rr = mg_gen_req_new(g, &info);
        mg_encoded_t e;
        err[0] = '\0';
        int rc = mg_gen_encode(g, a, &info, &rr, oa, "up", &e, err, sizeof(err));
        if (rc != -1) fprintf(stderr, "  '%s' accepted\n", bad[i]);
        CHECK_EQ_INT(rc, -1);
        CHECK(err[0] != '\0');
        CHECK(e.path == NULL && e.headers == NULL && e.body == NULL);
        CHECK_EQ_INT(lua_gettop(g->L), 0);
        mg_gen_unref_value(g, rr);
    }
    mg_lua_req_t info = {.request_id = "r", .endpoint = "chat", .model = "ok", .stream = 0, .max_tokens = -1, .created = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_encoded_t e;
    CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, "up", &e, err, sizeof(err)), 0);
    CHECK_STR(e.method, "POST"); /* the default */
    CHECK_STR(e.path, "/ok");
    CHECK(has_header(e.headers, "X-N: 5"));
    CHECK(e.body != NULL);
    mg_encoded_free(&e);
    mg_gen_unref_value(g, rr);
    unload_routing(g);
}

/* ---- decode ---------------------------------------------------------------------------- */

static cJSON *decode_fixture(const char *endpoint, const char *file, cJSON *req_body)
{
    int a = adapter_of(G, "ol");
    mg_lua_req_t info = {.request_id = "req-dec", .endpoint = endpoint, .model = "m", .stream = 0, .max_tokens = -1, .created = 1700000000};
    int rr = mg_gen_req_new(G, &info);
    if (req_body) mg_gen_req_set_body(G, rr, req_body);
    cJSON *resp = fixture(file);
    cJSON *out = NULL;
    err[0] = '\0';
    int rc = resp ? mg_gen_decode(G, a, rr, resp, &out, err, sizeof(err)) : -1;
    if (rc != 0) fprintf(stderr, "  decode %s: %s\n", file, err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
    cJSON_Delete(resp);
    mg_gen_unref_value(G, rr);
    return out;
}

static const char *jstr(const cJSON *o, const char *path)
{
    /* path like "choices.0.message.content" */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        if (cJSON_IsArray(cur))
            cur = cJSON_GetArrayItem(cur, atoi(tok));
        else
            cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    }
    static char out[1024];
    if (!cur) return "(missing)";
    if (cJSON_IsString(cur)) return cur->valuestring;
    if (cJSON_IsNull(cur)) return "(null)";
    char *s = cJSON_PrintUnformatted(cur);
    snprintf(out, sizeof(out), "%s", s ? s : "");
    free(s);
    return out;
}

static void test_decode_ollama(void)
{
    cJSON *o = decode_fixture("chat", "chat.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "id"), "chatcmpl-req-dec");
        CHECK_STR(jstr(o, "object"), "chat.completion");
        CHECK_STR(jstr(o, "created"), "1700000000");
        CHECK_STR(jstr(o, "model"), "llama3.2");
        CHECK_STR(jstr(o, "choices.0.index"), "0");
        CHECK_STR(jstr(o, "choices.0.message.role"), "assistant");
        CHECK_STR(jstr(o, "choices.0.message.content"), "Hello! How are you today?");
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "stop");
        CHECK_STR(jstr(o, "choices.0.logprobs"), "(null)");
        CHECK_STR(jstr(o, "usage.prompt_tokens"), "26");
        CHECK_STR(jstr(o, "usage.completion_tokens"), "298");
        CHECK_STR(jstr(o, "usage.total_tokens"), "324");
        CHECK(cJSON_IsArray(cJSON_GetObjectItem(o, "choices")));
        cJSON_Delete(o);
    }
    o = decode_fixture("chat", "chat_length.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "length");
        CHECK_STR(jstr(o, "usage.total_tokens"), "41");
        cJSON_Delete(o);
    }
    o = decode_fixture("chat", "chat_tools.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "tool_calls");
        CHECK_STR(jstr(o, "choices.0.message.content"), "(null)");
        CHECK_STR(jstr(o, "choices.0.message.tool_calls.0.type"), "function");
        CHECK_STR(jstr(o, "choices.0.message.tool_calls.0.function.name"), "get_current_weather");
        /* arguments become a JSON string, OpenAI style */
        const char *args = jstr(o, "choices.0.message.tool_calls.0.function.arguments");
        cJSON *parsed = cJSON_Parse(args);
        CHECK(parsed != NULL);
        if (parsed) CHECK_STR(jstr(parsed, "location"), "Paris, FR");
        cJSON_Delete(parsed);
        CHECK(strncmp(jstr(o, "choices.0.message.tool_calls.0.id"), "call_", 5) == 0);
        cJSON_Delete(o);
    }
    o = decode_fixture("completions", "generate.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "id"), "cmpl-req-dec");
        CHECK_STR(jstr(o, "object"), "text_completion");
        CHECK_STR(jstr(o, "choices.0.text"), "The sky is blue because it is the color of the sky.");
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "stop");
        CHECK_STR(jstr(o, "usage.completion_tokens"), "290");
        cJSON_Delete(o);
    }
    o = decode_fixture("embeddings", "embed.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "object"), "list");
        CHECK_STR(jstr(o, "model"), "all-minilm");
        cJSON *data = cJSON_GetObjectItem(o, "data");
        CHECK(cJSON_IsArray(data) && cJSON_GetArraySize(data) == 2);
        CHECK_STR(jstr(o, "data.1.index"), "1");
        CHECK_STR(jstr(o, "data.0.object"), "embedding");
        cJSON *v =
            cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "embedding"), 0);
        CHECK(v && fabs(v->valuedouble - 0.010071029) < 1e-12);
        CHECK_EQ_INT(
            cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 1), "embedding")), 10);
        CHECK_STR(jstr(o, "usage.prompt_tokens"), "8");
        cJSON_Delete(o);
    }
    /* base64 embeddings when the request asked for them */
    cJSON *rb = cJSON_Parse("{\"input\":\"x\",\"encoding_format\":\"base64\"}");
    o = decode_fixture("embeddings", "embed.json", rb);
    if (o) {
        const char *b64 = jstr(o, "data.0.embedding");
        CHECK_EQ_INT(strlen(b64), 56); /* 10 floats * 4 bytes = 40 bytes -> 56 chars */
        cJSON_Delete(o);
    }
    cJSON_Delete(rb);
    /* an error object from Ollama is an adapter error */
    int a = adapter_of(G, "ol");
    int rr = mg_gen_req_new(G, &(mg_lua_req_t){.request_id = "r", .endpoint = "chat", .model = "m", .stream = 0, .max_tokens = -1, .created = 1});
    cJSON *resp = cJSON_Parse("{\"error\":\"model 'x' not found\"}");
    cJSON *out = (cJSON *)1;
    CHECK_EQ_INT(mg_gen_decode(G, a, rr, resp, &out, err, sizeof(err)), -1);
    CHECK(out == NULL);
    CHECK(strstr(err, "model 'x' not found") != NULL);
    cJSON_Delete(resp);
    mg_gen_unref_value(G, rr);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

typedef struct {
    cJSON *chunks; /* all chunks, in order */
    int done_at;   /* 1-based line where done was first reported; 0 never */
    int error_at;  /* 1-based line that failed; 0 none */
    char error[512];
} stream_t;

static void run_stream(const char *endpoint, const char *file, stream_t *st)
{
    memset(st, 0, sizeof(*st));
    st->chunks = cJSON_CreateArray();
    int a = adapter_of(G, "ol");
    int rr = mg_gen_req_new(G, &(mg_lua_req_t){.request_id = "req-s", .endpoint = endpoint, .model = "m", .stream = 1, .max_tokens = -1, .created = 1700000001});
    int state = mg_gen_table_new(G);
    char p[512];
    snprintf(p, sizeof(p), "%s/tests/fixtures/ollama/%s", MG_SOURCE_DIR, file);
    char *text = read_all(p);
    CHECK(text != NULL);
    int lineno = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        lineno++;
        cJSON *data = cJSON_Parse(line);
        CHECK(data != NULL);
        cJSON *out = NULL;
        int done = -1;
        int rc =
            mg_gen_decode_event(G, a, rr, state, data, &out, &done, st->error, sizeof(st->error));
        cJSON_Delete(data);
        CHECK_EQ_INT(lua_gettop(G->L), 0);
        if (rc != 0) {
            CHECK(out == NULL);
            st->error_at = lineno;
            break;
        }
        CHECK(cJSON_IsArray(out));
        if (done && !st->done_at) st->done_at = lineno;
        cJSON *c;
        while ((c = cJSON_DetachItemFromArray(out, 0)))
            cJSON_AddItemToArray(st->chunks, c);
        cJSON_Delete(out);
    }
    free(text);
    mg_gen_unref_value(G, state);
    mg_gen_unref_value(G, rr);
}

static void test_decode_event_chat_stream(void)
{
    stream_t st;
    run_stream("chat", "chat_stream.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 6); /* only the last line says done */
    int n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 6); /* 5 content chunks + the finish chunk */
    char text[256] = "";
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_GetArrayItem(st.chunks, i);
        CHECK_STR(jstr(c, "object"), "chat.completion.chunk");
        CHECK_STR(jstr(c, "id"), "chatcmpl-req-s");
        CHECK_STR(jstr(c, "created"), "1700000001");
        CHECK_STR(jstr(c, "model"), "llama3.2");
        const char *content = jstr(c, "choices.0.delta.content");
        if (strcmp(content, "(missing)") != 0)
            strncat(text, content, sizeof(text) - strlen(text) - 1);
        if (i == 0)
            CHECK_STR(jstr(c, "choices.0.delta.role"), "assistant");
        else
            CHECK_STR(jstr(c, "choices.0.delta.role"), "(missing)");
        if (i < n - 1) {
            /* explicitly null, not absent, on every non-final chunk */
            CHECK_STR(jstr(c, "choices.0.finish_reason"), "(null)");
            CHECK_STR(jstr(c, "usage"), "(missing)");
        }
    }
    CHECK_STR(text, "The sky is blue.");
    cJSON *last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "stop");
    CHECK_STR(jstr(last, "choices.0.delta"), "{}"); /* an empty object, not [] */
    CHECK_STR(jstr(last, "usage.prompt_tokens"), "26");
    CHECK_STR(jstr(last, "usage.completion_tokens"), "5");
    CHECK_STR(jstr(last, "usage.total_tokens"), "31");
    cJSON_Delete(st.chunks);
}

static void test_decode_event_tools_and_generate(void)
{
    stream_t st;
    run_stream("chat", "chat_stream_tools.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 2);
    int n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 2);
    cJSON *first = cJSON_GetArrayItem(st.chunks, 0);
    CHECK_STR(jstr(first, "choices.0.delta.tool_calls.0.index"), "0");
    CHECK_STR(jstr(first, "choices.0.delta.tool_calls.0.function.name"), "get_current_weather");
    cJSON *last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "tool_calls");
    CHECK_STR(jstr(last, "usage.total_tokens"), "155");
    cJSON_Delete(st.chunks);

    run_stream("completions", "generate_stream.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 4);
    n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 4);
    char text[128] = "";
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_GetArrayItem(st.chunks, i);
        CHECK_STR(jstr(c, "object"), "text_completion");
        strncat(text, jstr(c, "choices.0.text"), sizeof(text) - strlen(text) - 1);
    }
    CHECK_STR(text, "The sky is blue");
    last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "length");
    CHECK_STR(jstr(last, "usage.completion_tokens"), "3");
    cJSON_Delete(st.chunks);
}

static void test_decode_event_error_line(void)
{
    stream_t st;
    run_stream("chat", "chat_stream_error.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 2);
    CHECK_EQ_INT(st.done_at, 0);
    CHECK(strstr(st.error, "unexpected EOF") != NULL);
    CHECK_EQ_INT(cJSON_GetArraySize(st.chunks), 1); /* the chunk before the error */
    cJSON_Delete(st.chunks);
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
    MG_RUN(test_json_unicode);
    MG_RUN(test_json_unencodable);
    MG_RUN(test_route_default_policy);
    MG_RUN(test_route_plan_limit);
    MG_RUN(test_route_lua_twins_agree);
    MG_RUN(test_sort_primitives);
    MG_RUN(test_encode_openai);
    MG_RUN(test_encode_memo);
    MG_RUN(test_encode_ollama);
    MG_RUN(test_decode_ollama);
    MG_RUN(test_decode_event_chat_stream);
    MG_RUN(test_decode_event_tools_and_generate);
    MG_RUN(test_decode_event_error_line);
    mg_gen_unref(G);
    tree_remove();

    MG_RUN(test_route_custom_policy);
    MG_RUN(test_route_kept_candidates);
    MG_RUN(test_route_kept_plans);
    MG_RUN(test_route_adaptive_keys_kept);
    MG_RUN(test_route_shares_kept);
    MG_RUN(test_route_kept_keys_twin);
    MG_RUN(test_encode_rejects_bad_results);
    return mg_test_summary();
}
