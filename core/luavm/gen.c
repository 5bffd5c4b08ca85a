/* gen: a generation: the config, the Lua library, the adapters and the policies loaded into
 * one Lua state and validated as a whole (see luavm.h); its reference count and its garbage
 * collection between requests.
 *
 * Loading checks everything a request would otherwise find out too late: each file compiles
 * and returns a module table with its name and API version, the functions the core calls
 * are there, every provider passes its adapter's check(), every policy's selftest() passes.
 * The first failure fails the load with "FILE:LINE: reason" and nothing of it stays. */
#include "luavm/luavm.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "luavm/keep.h"
#include "luavm/lcall.h"
#include "luavm/lmod.h"
#include "luavm/ltoken.h"
#include "luavm/reqtab.h"
#include "luavm/trace.h"

/* The module table at ref says who it is and which API it was written for: name = want
 * (the file's own name: "routing", "cooldown", the adapter's name) and version =
 * MG_LUA_API_VERSION. Anything else fails the load, naming the file and the fix. */
static int check_module_id(lua_State *L, int ref, const char *path, const char *want, char *err,
                           size_t errlen)
{
    int rc = -1;
    int t = mg_lpush_field(L, ref, "name");
    if (t != LUA_TSTRING)
        snprintf(err, errlen, "%s: the module table needs name = \"%s\"", path, want);
    else if (strcmp(lua_tostring(L, -1), want) != 0)
        snprintf(err, errlen, "%s: name = \"%s\", but this file is \"%s\" (name = \"%s\")", path,
                 lua_tostring(L, -1), want, want);
    else rc = 0;
    lua_pop(L, 1);
    if (rc != 0) return -1;
    mg_lpush_field(L, ref, "version");
    int isint = 0;
    lua_Integer v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
    if (!isint || v != MG_LUA_API_VERSION) {
        if (lua_isnil(L, -1)) {
            snprintf(err, errlen,
                     "%s: the module table needs version = %d (the API version it is "
                     "written for)",
                     path, MG_LUA_API_VERSION);
        } else {
            int vt = lua_type(L, -1); /* (lua_tostring only where no metamethod can run) */
            const char *shown =
                vt == LUA_TNUMBER || vt == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1);
            const char *q = vt == LUA_TSTRING ? "\"" : "";
            snprintf(err, errlen,
                     "%s: version = %s%s%s, but this gateway speaks API version %d "
                     "(the number; lua/README.md)",
                     path, q, shown, q, MG_LUA_API_VERSION);
        }
        lua_pop(L, 1);
        return -1;
    }
    lua_pop(L, 1);
    return 0;
}

static void *gen_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

/* Run a file and keep the table it returns in the registry. */
static int load_module_file(lua_State *L, const char *path, int *ref, char *err, size_t errlen)
{
    if (luaL_loadfile(L, path) != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return -1;
    }
    if (mg_lcall(L, 0, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: the file must return a module table", path);
        return -1;
    }
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* A header name or value the probe may send: printable, no CR/LF (nor ':' in a name). */
static int header_ok(const char *s, int name)
{
    if (!*s) return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f || (name && (*s == ':' || *s == ' '))) return 0;
    return 1;
}

/* M.probe_key_header and M.probe_headers. 0, or -1 with err set (what was read is freed with
 * the generation). */
static int load_probe_headers(lua_State *L, mg_adapter_t *a, const char *path, char *err,
                              size_t errlen)
{
    int t = mg_lpush_field(L, a->ref, "probe_key_header");
    if (t == LUA_TSTRING && header_ok(lua_tostring(L, -1), 1))
        a->probe_key_header = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (t != LUA_TNIL && !a->probe_key_header) {
        snprintf(err, errlen, "%s: probe_key_header must be a header name", path);
        return -1;
    }
    if (mg_lpush_field(L, a->ref, "probe_headers") != LUA_TTABLE) {
        lua_pop(L, 1);
        return 0;
    }
    size_t n = 0;
    for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) n++;
    a->probe_headers = calloc(n + 1, sizeof(char *));
    if (!a->probe_headers) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    size_t i = 0;
    for (lua_pushnil(L); lua_next(L, -2); lua_pop(L, 1)) {
        if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING ||
            !header_ok(lua_tostring(L, -2), 1) || !header_ok(lua_tostring(L, -1), 0)) {
            lua_pop(L, 3);
            snprintf(err, errlen, "%s: probe_headers must map header names to strings", path);
            return -1;
        }
        size_t len = strlen(lua_tostring(L, -2)) + strlen(lua_tostring(L, -1)) + 3;
        if (!(a->probe_headers[i] = malloc(len))) {
            lua_pop(L, 3);
            snprintf(err, errlen, "%s: out of memory", path);
            return -1;
        }
        snprintf(a->probe_headers[i++], len, "%s: %s", lua_tostring(L, -2), lua_tostring(L, -1));
    }
    lua_pop(L, 1);
    return 0;
}

static int load_adapter(mg_gen_t *g, const char *name, mg_adapter_t *a, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.lua", g->cfg->adapters_dir, name);
    a->name = strdup(name);
    if (!a->name) return -1;
    if (load_module_file(L, path, &a->ref, err, errlen) != 0) return -1;
    if (mg_lpush_field(L, a->ref, "encode") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: adapter has no encode(req, route) function", path);
        return -1;
    }
    lua_pop(L, 1);
    mg_lpush_field(L, a->ref, "passthrough");
    a->passthrough = lua_toboolean(L, -1);
    lua_pop(L, 1);
    mg_lpush_field(L, a->ref, "probe_path");
    a->probe_path = strdup(lua_isstring(L, -1) ? lua_tostring(L, -1) : "/models");
    lua_pop(L, 1);
    mg_lpush_field(L, a->ref, "entry_wire");
    a->entry_anthropic = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "anthropic") == 0;
    a->entry_responses = lua_isstring(L, -1) && strcmp(lua_tostring(L, -1), "responses") == 0;
    lua_pop(L, 1);
    mg_lpush_field(L, a->ref, "stream_eof");
    a->stream_eof = lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (!a->probe_path || load_probe_headers(L, a, path, err, errlen) != 0) return -1;
    if (a->entry_responses && !a->passthrough) { /* the core forwards its answers itself */
        snprintf(err, errlen, "%s: entry_wire = \"responses\" needs passthrough = true", path);
        return -1;
    }
    if (!a->passthrough) {
        const char *need[] = {"decode", "decode_event"};
        for (int i = 0; i < 2; i++) {
            if (mg_lpush_field(L, a->ref, need[i]) != LUA_TFUNCTION) {
                lua_pop(L, 1);
                snprintf(err, errlen, "%s: a translating adapter (passthrough ~= true) needs %s()",
                         path, need[i]);
                return -1;
            }
            lua_pop(L, 1);
        }
    }
    return check_module_id(L, a->ref, path, name, err, errlen);
}

/* adapter.check(provider) for every provider that uses the adapter. */
static int check_providers(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    for (size_t i = 0; i < g->cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &g->cfg->providers[i];
        mg_adapter_t *a = &g->adapters[g->provider_adapter[i]];
        if (mg_lpush_field(L, a->ref, "check") != LUA_TFUNCTION) {
            lua_pop(L, 1);
            continue;
        }
        mg_lpush_provider(L, p);
        char lerr[512];
        if (mg_lcall(L, 1, 1, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s:%d: provider '%s': %s", g->cfg->path, p->line, p->id, lerr);
            return -1;
        }
        if (lua_isstring(L, -1)) {
            snprintf(err, errlen, "%s:%d: provider '%s': %s", g->cfg->path, p->line, p->id,
                     lua_tostring(L, -1));
            lua_pop(L, 1);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

static int load_adapters(mg_gen_t *g, char *err, size_t errlen)
{
    size_t np = g->cfg->n_providers;
    g->adapters = calloc(np ? np : 1, sizeof(*g->adapters));
    g->provider_adapter = calloc(np ? np : 1, sizeof(int));
    if (!g->adapters || !g->provider_adapter) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < np; i++) {
        const char *name = g->cfg->providers[i].adapter;
        size_t k = 0;
        while (k < g->n_adapters && strcmp(g->adapters[k].name, name) != 0) k++;
        if (k == g->n_adapters) {
            if (load_adapter(g, name, &g->adapters[k], err, errlen) != 0) {
                g->n_adapters++; /* so free releases the name */
                return -1;
            }
            g->n_adapters++;
        }
        g->provider_adapter[i] = (int)k;
    }
    return check_providers(g, err, errlen);
}

/* moongate.tokens: the gateway's own (it counts with the encodings the server loaded), so
 * not in lmod.c, which the busted specs load as moongate.so without them. */
static void add_tokens(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    if (lua_getfield(L, -1, "moongate") == LUA_TTABLE) {
        lua_pushcfunction(L, mg_lua_tokens);
        lua_setfield(L, -2, "tokens");
    }
    lua_pop(L, 2);
}

/* The module's selftest() (at ref), when it has one: an error fails the load. */
static int run_selftest(lua_State *L, int ref, const char *path, char *err, size_t errlen)
{
    if (mg_lpush_field(L, ref, "selftest") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        return 0;
    }
    char lerr[512];
    if (mg_lcall(L, 0, 0, lerr, sizeof(lerr)) == 0) return 0;
    snprintf(err, errlen, "%s: selftest failed: %s", path, lerr);
    return -1;
}

/* policies/cooldown.lua is optional: without it a 429 cools for the default curve. */
static int load_cooldown_policy(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/cooldown.lua", g->cfg->policies_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    fclose(f);
    if (load_module_file(L, path, &g->cooldown_ref, err, errlen) != 0) return -1;
    if (mg_lpush_field(L, g->cooldown_ref, "on_response") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no on_response(provider, status, headers, state)",
                 path);
        return -1;
    }
    lua_pop(L, 1);
    if (check_module_id(L, g->cooldown_ref, path, "cooldown", err, errlen) != 0) return -1;
    return run_selftest(L, g->cooldown_ref, path, err, errlen);
}

/* policies/context.lua is optional: without it a conversation over its budget is refused. */
static int load_context_policy(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/context.lua", g->cfg->policies_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    fclose(f);
    if (load_module_file(L, path, &g->context_ref, err, errlen) != 0) return -1;
    if (mg_lpush_field(L, g->context_ref, "trim") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no trim(ctx, budget)", path);
        return -1;
    }
    lua_pop(L, 1);
    if (check_module_id(L, g->context_ref, path, "context", err, errlen) != 0) return -1;
    return run_selftest(L, g->context_ref, path, err, errlen);
}

static int load_policies(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/routing.lua", g->cfg->policies_dir);
    if (load_module_file(L, path, &g->routing_ref, err, errlen) != 0) return -1;
    if (mg_lpush_field(L, g->routing_ref, "route") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no route(req, candidates) function", path);
        return -1;
    }
    lua_pop(L, 1);
    if (check_module_id(L, g->routing_ref, path, "routing", err, errlen) != 0) return -1;
    /* M.cache = false: a policy that keeps state between calls, asked every time */
    g->routing_cache =
        mg_lpush_field(L, g->routing_ref, "cache") != LUA_TBOOLEAN || lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (run_selftest(L, g->routing_ref, path, err, errlen) != 0) return -1;
    if (load_cooldown_policy(g, err, errlen) != 0) return -1;
    return load_context_policy(g, err, errlen);
}

static int load_library(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    luaL_openlibs(L);
    /* package.path: the moongate Lua library first, so policies can require it */
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua", g->cfg->lua_dir, g->cfg->lua_dir);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    if (!(g->lmod = calloc(1, sizeof(*g->lmod)))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->lmod->json = g->json;
    mg_lmod_open(L, g->lmod);
    add_tokens(L);
    lua_getglobal(L, "require");
    lua_pushstring(L, "moongate.util");
    int top = lua_gettop(L) - 2;
    if (mg_lcall(L, 1, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1) || lua_getfield(L, -1, "null") != LUA_TTABLE ||
        lua_getfield(L, -2, "array_mt") != LUA_TTABLE) {
        lua_settop(L, top);
        snprintf(err, errlen, "%s/moongate/util.lua: must define util.null and util.array_mt",
                 g->cfg->lua_dir);
        return -1;
    }
    g->json.array_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->json.null_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->lmod->json = g->json;
    lua_pop(L, 1);
    return 0;
}

/* The cache around the Lua calls and the views they record through (keep.h, trace.h). */
static int make_keep(mg_gen_t *g, char *err, size_t errlen)
{
    g->keep = mg_keep_new(g->cfg, g->n_adapters);
    g->trace =
        g->keep ? mg_trace_new(g->L, mg_keep_slots(g->keep), g->req_dirty_ref, &g->json) : NULL;
    if (!g->trace) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->lmod->hooks = mg_trace_hooks(g->trace);
    return 0;
}

int mg_gen_load(const char *config_path, unsigned id, mg_gen_t **out, char *err, size_t errlen)
{
    return mg_gen_load_with(config_path, NULL, NULL, id, out, err, errlen);
}

int mg_gen_load_with(const char *config_path, mg_config_extend_fn extend, void *ud, unsigned id,
                     mg_gen_t **out, char *err, size_t errlen)
{
    *out = NULL;
    mg_gen_t *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->id = id;
    g->refs = 1;
    g->routing_ref = g->cooldown_ref = g->context_ref = g->json.null_ref = g->json.array_mt_ref =
        LUA_NOREF;
    if (mg_config_load(config_path, &g->cfg, err, errlen) != 0 ||
        (extend && extend(g->cfg, ud, err, errlen) != 0)) {
        mg_gen_unref(g);
        return -1;
    }
    mg_config_link_routes(g->cfg); /* every provider and model is in: the routes' hints */
    g->L = lua_newstate(gen_alloc, g);
    if (!g->L) {
        snprintf(err, errlen, "cannot create a Lua state");
        mg_gen_unref(g);
        return -1;
    }
    /* request-scoped tables die young: generational collection suits them */
    lua_gc(g->L, LUA_GCGEN, MG_GC_AUTO_PCT, MG_GC_MAJOR_PCT);
    if (load_library(g, err, errlen) != 0 || mg_reqtab_load(g, err, errlen) != 0 ||
        load_adapters(g, err, errlen) != 0 || make_keep(g, err, errlen) != 0 ||
        load_policies(g, err, errlen) != 0) {
        mg_gen_unref(g);
        return -1;
    }
    g->gc_base = mg_gen_lua_bytes(g);
    *out = g;
    return 0;
}

size_t mg_gen_lua_bytes(const mg_gen_t *g)
{
    return (size_t)lua_gc(g->L, LUA_GCCOUNT) * 1024 + (size_t)lua_gc(g->L, LUA_GCCOUNTB);
}

int mg_gen_collect_between(mg_gen_t *g, int idle)
{
    size_t now = mg_gen_lua_bytes(g);
    if (now < g->gc_base) g->gc_base = now; /* the automatic one ran */
    size_t pct = idle ? MG_GC_IDLE_PCT : MG_GC_BUSY_PCT;
    if ((now - g->gc_base) * 100 < g->gc_base * pct) return 0;
    /* A basic step: in generational mode Lua then picks a young or a full collection
     * exactly as its automatic collector would, whatever its own debt (a step given a debt
     * of the whole heap did nothing when the collector's credit after a full collection was
     * larger still). */
    lua_gc(g->L, LUA_GCSTEP, 0);
    g->gc_base = mg_gen_lua_bytes(g);
    return 1;
}

void mg_gen_ref(mg_gen_t *g)
{
    g->refs++;
}

void mg_gen_unref(mg_gen_t *g)
{
    if (!g || --g->refs > 0) return;
    if (g->L) lua_close(g->L);
    mg_keep_free(g->keep, NULL); /* (the state is closed: its references went with it) */
    mg_trace_free(g->trace);
    if (g->lmod) mg_lmod_free(g->lmod);
    free(g->lmod);
    for (size_t i = 0; i < g->n_adapters; i++) {
        free(g->adapters[i].name);
        free(g->adapters[i].probe_path);
        free(g->adapters[i].probe_key_header);
        for (char **h = g->adapters[i].probe_headers; h && *h; h++) free(*h);
        free(g->adapters[i].probe_headers);
    }
    free(g->adapters);
    free(g->provider_adapter);
    mg_config_free(g->cfg);
    free(g);
}

void mg_lua_push_json(mg_gen_t *g, const cJSON *v)
{
    mg_ljson_push(g->L, &g->json, v);
}

cJSON *mg_lua_to_json(mg_gen_t *g, int idx, char *err, size_t errlen)
{
    return mg_ljson_to(g->L, &g->json, idx, err, errlen);
}
