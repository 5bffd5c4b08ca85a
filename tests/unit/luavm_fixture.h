/* luavm_fixture: what the luavm tests share: temp trees holding a copy of the repository's
 * adapters/, policies/ and lua/ (the config's lua.* keys point there, so a test may break one
 * file without touching the repository), loading generations from them, running Lua chunks
 * in a generation's state, and candidates for routing calls. A header of static functions:
 * each test file that includes it is one program. */
#ifndef MG_LUAVM_FIXTURE_H
#define MG_LUAVM_FIXTURE_H

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
static mg_gen_t *G; /* one generation on the repository's own files (tests that share one) */

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
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) fwrite(buf, 1, n, out);
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
        if (stat(a, &st) != 0) rc = -1;
        else if (S_ISDIR(st.st_mode)) rc = copy_tree(a, b);
        else if (S_ISREG(st.st_mode)) rc = copy_file(a, b);
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

/* mg_gen_route with the plan flattened to indexes, as the old API returned them; rr: the
 * request table made from info. */
static int route_order(mg_gen_t *g, const mg_lua_req_t *info, int rr, const mg_candidate_t *c,
                       int n, int *order, char *e, size_t elen)
{
    mg_plan_entry_t entries[8];
    mg_plan_t plan = {.entries = entries, .limit = 0};
    if (mg_gen_route(g, info, &rr, 1, c, n, &plan, e, elen) != 0) return -1;
    for (int i = 0; i < plan.n; i++) order[i] = entries[i].index;
    return plan.n;
}

static mg_route_conf_t test_routes[3] = {{.model = "up-a"}, {.model = "up-b"}, {.model = "up-c"}};

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
    mg_lua_req_t info = {.request_id = "req-route",
                         .endpoint = "chat",
                         .model = model,
                         .stream = 1,
                         .max_tokens = 100,
                         .created = 1700000000,
                         .allow_cloud = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_candidate_t c[3];
    int n = make_cands(g, c, avail);
    int top = lua_gettop(g->L);
    err[0] = '\0';
    int rc = route_order(g, &info, rr, c, n, order, err, sizeof(err));
    CHECK_EQ_INT(lua_gettop(g->L), top);
    mg_gen_unref_value(g, rr);
    return rc;
}

/* Keep the compiler quiet about helpers a test file does not use. */
static inline void luavm_fixture_used(void)
{
    (void)expect_load_error;
    (void)fixture;
    (void)adapter_of;
    (void)lua_expect;
    (void)load_routing;
    (void)unload_routing;
    (void)route;
    (void)write_text;
    (void)G;
}

#endif
