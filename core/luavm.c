/* luavm: Lua generations and the `moongate` module; see luavm.h.
 *
 * Every call into Lua goes through lua_pcall with a message handler that keeps
 * the "file:line:" prefix of the error, so a broken policy fails one request (or
 * one reload) with a useful message and never unwinds through C. */
#include "luavm.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "crypto.h"
#include "log.h"

#define MG_LUA_API_VERSION 1
#define JSON_MAX_DEPTH 64

static const char *const MG_VERSION = "0.1.0";

/* ------------------------------------------------------------------------ */
/* JSON <-> Lua                                                              */
/* ------------------------------------------------------------------------ */

static void push_json(lua_State *L, const mg_gen_t *g, const cJSON *v, int depth)
{
    luaL_checkstack(L, 4, "json too deep");
    if (!v || cJSON_IsNull(v) || depth > JSON_MAX_DEPTH) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->null_ref);
    } else if (cJSON_IsBool(v)) {
        lua_pushboolean(L, cJSON_IsTrue(v));
    } else if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        if (d > -9007199254740992.0 && d < 9007199254740992.0 && d == (double)(long long)d)
            lua_pushinteger(L, (lua_Integer)d);
        else
            lua_pushnumber(L, d);
    } else if (cJSON_IsString(v)) {
        lua_pushstring(L, v->valuestring);
    } else if (cJSON_IsArray(v)) {
        lua_createtable(L, cJSON_GetArraySize(v), 0);
        int i = 1;
        for (const cJSON *c = v->child; c; c = c->next) {
            push_json(L, g, c, depth + 1);
            lua_rawseti(L, -2, i++);
        }
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->array_mt_ref);
        lua_setmetatable(L, -2);
    } else if (cJSON_IsObject(v)) {
        lua_createtable(L, 0, 8);
        for (const cJSON *c = v->child; c; c = c->next) {
            push_json(L, g, c, depth + 1);
            lua_setfield(L, -2, c->string);
        }
    } else {
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->null_ref);
    }
}

void mg_lua_push_json(mg_gen_t *g, const cJSON *v)
{
    push_json(g->L, g, v, 0);
}

/* Is the table at idx an array: marked with util.array_mt, or keys exactly 1..n (n>0)? */
static int table_is_array(lua_State *L, const mg_gen_t *g, int idx, size_t *len)
{
    *len = lua_rawlen(L, idx);
    if (lua_getmetatable(L, idx)) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, g->array_mt_ref);
        int marked = lua_rawequal(L, -1, -2);
        lua_pop(L, 2);
        if (marked) return 1;
    }
    if (*len == 0) return 0;
    size_t count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (!lua_isinteger(L, -1)) {
            lua_pop(L, 1);
            return 0;
        }
        count++;
    }
    return count == *len;
}

static cJSON *to_json(lua_State *L, const mg_gen_t *g, int idx, int depth, char *err,
                      size_t errlen)
{
    idx = lua_absindex(L, idx);
    if (depth > JSON_MAX_DEPTH) {
        snprintf(err, errlen, "value nested too deep (cycle?)");
        return NULL;
    }
    switch (lua_type(L, idx)) {
    case LUA_TNIL: return cJSON_CreateNull();
    case LUA_TBOOLEAN: return cJSON_CreateBool(lua_toboolean(L, idx));
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) return cJSON_CreateNumber((double)lua_tointeger(L, idx));
        return cJSON_CreateNumber(lua_tonumber(L, idx));
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (strlen(s) != n) {
            snprintf(err, errlen, "string with an embedded NUL");
            return NULL;
        }
        return cJSON_CreateString(s);
    }
    case LUA_TTABLE: break;
    default:
        snprintf(err, errlen, "cannot encode a %s as JSON", luaL_typename(L, idx));
        return NULL;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->null_ref);
    int is_null = lua_rawequal(L, -1, idx);
    lua_pop(L, 1);
    if (is_null) return cJSON_CreateNull();
    luaL_checkstack(L, 6, "json too deep");
    size_t len;
    if (table_is_array(L, g, idx, &len)) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 1; arr && i <= len; i++) {
            lua_rawgeti(L, idx, (lua_Integer)i);
            cJSON *item = to_json(L, g, -1, depth + 1, err, errlen);
            lua_pop(L, 1);
            if (!item) {
                cJSON_Delete(arr);
                return NULL;
            }
            cJSON_AddItemToArray(arr, item);
        }
        return arr;
    }
    cJSON *obj = cJSON_CreateObject();
    lua_pushnil(L);
    while (obj && lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            lua_pop(L, 2);
            cJSON_Delete(obj);
            snprintf(err, errlen, "object keys must be strings");
            return NULL;
        }
        cJSON *item = to_json(L, g, -1, depth + 1, err, errlen);
        if (!item) {
            lua_pop(L, 2);
            cJSON_Delete(obj);
            return NULL;
        }
        cJSON_AddItemToObject(obj, lua_tostring(L, -2), item);
        lua_pop(L, 1);
    }
    return obj;
}

cJSON *mg_lua_to_json(mg_gen_t *g, int idx, char *err, size_t errlen)
{
    return to_json(g->L, g, idx, 0, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* The `moongate` module                                                     */
/* ------------------------------------------------------------------------ */

static mg_gen_t *gen_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

static int l_now_ms(lua_State *L)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    lua_pushinteger(L, (lua_Integer)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    return 1;
}

static int l_log(lua_State *L)
{
    const char *level = luaL_checkstring(L, 1);
    const char *msg = luaL_checkstring(L, 2);
    mg_log_level_t lv;
    if (mg_log_level_parse(level, &lv) != 0) return luaL_argerror(L, 1, "debug|info|warn|error");
    if (!mg_log_enabled(lv)) return 0;
    mg_logline_t l;
    mg_log_begin(&l, lv, msg);
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar)) {
        mg_log_str(&l, "source", ar.short_src);
        mg_log_int(&l, "line", ar.currentline);
    }
    mg_log_end(&l);
    return 0;
}

static int l_json_encode(lua_State *L)
{
    char err[128];
    luaL_checkany(L, 1);
    cJSON *j = to_json(L, gen_of(L), 1, 0, err, sizeof(err));
    if (!j) return luaL_error(L, "json_encode: %s", err);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!s) return luaL_error(L, "json_encode: out of memory");
    lua_pushstring(L, s);
    free(s);
    return 1;
}

static int l_json_decode(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    cJSON *j = cJSON_ParseWithLength(s, n);
    if (!j) {
        lua_pushnil(L);
        lua_pushstring(L, "invalid JSON");
        return 2;
    }
    push_json(L, gen_of(L), j, 0);
    cJSON_Delete(j);
    return 1;
}

static int l_sha256_hex(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    char out[65];
    mg_sha256_hex(s, n, out);
    lua_pushstring(L, out);
    return 1;
}

static int open_moongate(lua_State *L)
{
    static const luaL_Reg fns[] = {{"now_ms", l_now_ms},
                                   {"log", l_log},
                                   {"json_encode", l_json_encode},
                                   {"json_decode", l_json_decode},
                                   {"sha256_hex", l_sha256_hex},
                                   {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_pushstring(L, MG_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushinteger(L, MG_LUA_API_VERSION);
    lua_setfield(L, -2, "api_version");
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Calling Lua safely                                                        */
/* ------------------------------------------------------------------------ */

static int msg_handler(lua_State *L)
{
    if (!lua_isstring(L, 1)) {
        lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    return 1;
}

/* pcall with the handler; on error copies the message into err and pops it. */
static int pcall(lua_State *L, int nargs, int nres, char *err, size_t errlen)
{
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, msg_handler);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    if (rc != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return -1;
    }
    return 0;
}

/* Push module[ref][name]; returns its Lua type. */
static int push_field(lua_State *L, int ref, const char *name)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    int t = lua_getfield(L, -1, name);
    lua_remove(L, -2);
    return t;
}

/* ------------------------------------------------------------------------ */
/* Loading a generation                                                      */
/* ------------------------------------------------------------------------ */

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
    if (pcall(L, 0, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: the file must return a module table", path);
        return -1;
    }
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Field setters for the table on top of the stack. */
static void set_int(lua_State *L, const char *k, long long v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void push_provider(lua_State *L, const mg_provider_conf_t *p)
{
    lua_createtable(L, 0, 10);
    set_str(L, "id", p->id);
    set_str(L, "adapter", p->adapter);
    set_str(L, "base_url", p->base_url);
    if (p->api_key) set_str(L, "api_key", p->api_key);
    set_str(L, "pool", p->pool);
    set_int(L, "rpm_limit", p->rpm_limit);
    set_int(L, "tpm_limit", p->tpm_limit);
    set_num(L, "weight", p->weight);
    set_bool(L, "local", p->local);
}

static int load_adapter(mg_gen_t *g, const char *name, mg_adapter_t *a, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.lua", g->cfg->adapters_dir, name);
    a->name = strdup(name);
    if (!a->name) return -1;
    if (load_module_file(L, path, &a->ref, err, errlen) != 0) return -1;
    if (push_field(L, a->ref, "encode") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: adapter has no encode(req, route) function", path);
        return -1;
    }
    lua_pop(L, 1);
    push_field(L, a->ref, "passthrough");
    a->passthrough = lua_toboolean(L, -1);
    lua_pop(L, 1);
    push_field(L, a->ref, "probe_path");
    a->probe_path = strdup(lua_isstring(L, -1) ? lua_tostring(L, -1) : "/models");
    lua_pop(L, 1);
    if (!a->probe_path) return -1;
    if (!a->passthrough) {
        const char *need[] = {"decode", "decode_event"};
        for (int i = 0; i < 2; i++) {
            if (push_field(L, a->ref, need[i]) != LUA_TFUNCTION) {
                lua_pop(L, 1);
                snprintf(err, errlen, "%s: a translating adapter (passthrough ~= true) needs %s()",
                         path, need[i]);
                return -1;
            }
            lua_pop(L, 1);
        }
    }
    return 0;
}

/* adapter.check(provider) for every provider that uses the adapter. */
static int check_providers(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    for (size_t i = 0; i < g->cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &g->cfg->providers[i];
        mg_adapter_t *a = &g->adapters[g->provider_adapter[i]];
        if (push_field(L, a->ref, "check") != LUA_TFUNCTION) {
            lua_pop(L, 1);
            continue;
        }
        push_provider(L, p);
        char lerr[512];
        if (pcall(L, 1, 1, lerr, sizeof(lerr)) != 0) {
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
    if (push_field(L, g->cooldown_ref, "on_response") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no on_response(provider, status, headers, state)",
                 path);
        return -1;
    }
    lua_pop(L, 1);
    if (push_field(L, g->cooldown_ref, "selftest") == LUA_TFUNCTION) {
        char lerr[512];
        if (pcall(L, 0, 0, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s: selftest failed: %s", path, lerr);
            return -1;
        }
    } else {
        lua_pop(L, 1);
    }
    return 0;
}

static int load_policies(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/routing.lua", g->cfg->policies_dir);
    if (load_module_file(L, path, &g->routing_ref, err, errlen) != 0) return -1;
    if (push_field(L, g->routing_ref, "route") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no route(req, candidates) function", path);
        return -1;
    }
    lua_pop(L, 1);
    if (push_field(L, g->routing_ref, "selftest") == LUA_TFUNCTION) {
        char lerr[512];
        if (pcall(L, 0, 0, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s: selftest failed: %s", path, lerr);
            return -1;
        }
    } else {
        lua_pop(L, 1);
    }
    return load_cooldown_policy(g, err, errlen);
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
    luaL_requiref(L, "moongate", open_moongate, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "require");
    lua_pushstring(L, "moongate.util");
    int top = lua_gettop(L) - 2;
    if (pcall(L, 1, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1) || lua_getfield(L, -1, "null") != LUA_TTABLE ||
        lua_getfield(L, -2, "array_mt") != LUA_TTABLE) {
        lua_settop(L, top);
        snprintf(err, errlen, "%s/moongate/util.lua: must define util.null and util.array_mt",
                 g->cfg->lua_dir);
        return -1;
    }
    g->array_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->null_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    return 0;
}

static int load_candidate_maker(mg_gen_t *g, char *err, size_t errlen);

/* The stored providers join the file's; one whose id the file took meanwhile is left out. */
static int add_providers(mg_config_t *cfg, const mg_provider_conf_t *extra, size_t n, char *err,
                         size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        if (mg_config_provider(cfg, extra[i].id)) {
            mg_log_msg(MG_LOG_WARN, NULL, "stored provider %s not served: the config file uses "
                       "the same id", extra[i].id);
            continue;
        }
        if (mg_config_add_provider(cfg, &extra[i], err, errlen) != 0) return -1;
    }
    return 0;
}

int mg_gen_load(const char *config_path, unsigned id, mg_gen_t **out, char *err, size_t errlen)
{
    return mg_gen_load_with(config_path, NULL, 0, id, out, err, errlen);
}

int mg_gen_load_with(const char *config_path, const mg_provider_conf_t *extra, size_t n_extra,
                     unsigned id, mg_gen_t **out, char *err, size_t errlen)
{
    *out = NULL;
    mg_gen_t *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->id = id;
    g->refs = 1;
    g->routing_ref = g->cooldown_ref = g->null_ref = g->array_mt_ref = LUA_NOREF;
    g->make_candidate_ref = LUA_NOREF;
    if (mg_config_load(config_path, &g->cfg, err, errlen) != 0 ||
        add_providers(g->cfg, extra, n_extra, err, errlen) != 0) {
        mg_gen_unref(g);
        return -1;
    }
    g->L = lua_newstate(gen_alloc, g);
    if (!g->L) {
        snprintf(err, errlen, "cannot create a Lua state");
        mg_gen_unref(g);
        return -1;
    }
    /* request-scoped tables die young: generational collection suits them */
    lua_gc(g->L, LUA_GCGEN, 0, 0);
    if (load_library(g, err, errlen) != 0 || load_candidate_maker(g, err, errlen) != 0 ||
        load_adapters(g, err, errlen) != 0 || load_policies(g, err, errlen) != 0) {
        mg_gen_unref(g);
        return -1;
    }
    *out = g;
    return 0;
}

void mg_gen_ref(mg_gen_t *g)
{
    g->refs++;
}

void mg_gen_unref(mg_gen_t *g)
{
    if (!g || --g->refs > 0) return;
    if (g->L) lua_close(g->L);
    for (size_t i = 0; i < g->n_adapters; i++) {
        free(g->adapters[i].name);
        free(g->adapters[i].probe_path);
    }
    free(g->adapters);
    free(g->provider_adapter);
    mg_config_free(g->cfg);
    free(g);
}

/* ------------------------------------------------------------------------ */
/* Per-request calls                                                         */
/* ------------------------------------------------------------------------ */

int mg_gen_req_new(mg_gen_t *g, const mg_lua_req_t *info)
{
    lua_State *L = g->L;
    lua_createtable(L, 0, 20); /* all fields below plus attempt and body: no rehash */
    set_str(L, "request_id", info->request_id);
    set_str(L, "endpoint", info->endpoint);
    set_str(L, "model", info->model);
    set_bool(L, "stream", info->stream);
    if (info->max_tokens >= 0) set_int(L, "max_tokens", info->max_tokens);
    set_int(L, "created", info->created);
    set_str(L, "priority", info->priority ? info->priority : "P2");
    if (info->pool) set_str(L, "pool", info->pool);
    if (info->pin) set_str(L, "pin", info->pin);
    set_bool(L, "local_only", info->local_only);
    set_bool(L, "allow_smaller_model", info->allow_smaller_model);
    set_bool(L, "allow_cloud", info->allow_cloud);
    set_bool(L, "local_first", info->local_first);
    set_num(L, "random", info->random);
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

int mg_gen_req_set_body(mg_gen_t *g, int req_ref, const cJSON *body)
{
    lua_State *L = g->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_json(L, g, body, 0);
    lua_setfield(L, -2, "body");
    lua_pop(L, 1);
    return 0;
}

int mg_gen_table_new(mg_gen_t *g)
{
    lua_newtable(g->L);
    return luaL_ref(g->L, LUA_REGISTRYINDEX);
}

void mg_gen_unref_value(mg_gen_t *g, int ref)
{
    if (ref >= 0) luaL_unref(g->L, LUA_REGISTRYINDEX, ref);
}

/* Candidate tables are built by a Lua table constructor: its keys are constants of the
 * compiled chunk, so a candidate costs one call and one pre-sized table instead of
 * twenty-five lua_setfield calls that each look their key up again. */
static const char make_candidate_src[] =
    "return function(index, provider, model, pool, loc, smaller, priority, weight, available,\n"
    "  cooling, cooldown_remaining_ms, consecutive_429, observing, rpm_limit, rpm_used,\n"
    "  tpm_limit, tpm_used, headroom, in_flight, health, breaker, avail_samples, ttft_samples,\n"
    "  success_rate, ttft_ms, load)\n"
    "  return { index = index, provider = provider, model = model, pool = pool, ['local'] = loc,\n"
    "    smaller = smaller, priority = priority, weight = weight, available = available,\n"
    "    cooling = cooling, cooldown_remaining_ms = cooldown_remaining_ms,\n"
    "    consecutive_429 = consecutive_429, observing = observing, rpm_limit = rpm_limit,\n"
    "    rpm_used = rpm_used, tpm_limit = tpm_limit, tpm_used = tpm_used, headroom = headroom,\n"
    "    in_flight = in_flight, health = health, breaker = breaker,\n"
    "    avail_samples = avail_samples, ttft_samples = ttft_samples,\n"
    "    success_rate = success_rate, ttft_ms = ttft_ms, load = load }\n"
    "end\n";

static int load_candidate_maker(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    if (luaL_loadbuffer(L, make_candidate_src, sizeof(make_candidate_src) - 1, "=candidate") !=
            LUA_OK ||
        pcall(L, 0, 1, err, errlen) != 0)
        return -1;
    g->make_candidate_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static void push_candidate(lua_State *L, const mg_gen_t *g, int index, const mg_candidate_t *c)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->make_candidate_ref);
    lua_pushinteger(L, index);
    lua_pushstring(L, c->provider->id);
    lua_pushstring(L, c->route->model);
    lua_pushstring(L, c->provider->pool);
    lua_pushboolean(L, c->provider->local);
    lua_pushboolean(L, c->route->smaller);
    lua_pushinteger(L, c->route->priority);
    lua_pushnumber(L, c->provider->weight);
    lua_pushboolean(L, c->available);
    lua_pushboolean(L, c->cooling);
    lua_pushinteger(L, c->cooldown_remaining_ms);
    lua_pushinteger(L, c->consecutive_429);
    lua_pushboolean(L, c->observing);
    lua_pushinteger(L, c->rpm_limit);
    lua_pushinteger(L, c->rpm_used);
    lua_pushinteger(L, c->tpm_limit);
    lua_pushinteger(L, c->tpm_used);
    lua_pushnumber(L, c->headroom);
    lua_pushinteger(L, c->in_flight);
    lua_pushstring(L, c->health);
    lua_pushstring(L, c->breaker);
    lua_pushinteger(L, c->avail_samples);
    lua_pushinteger(L, c->ttft_samples);
    if (c->success_rate >= 0) lua_pushnumber(L, c->success_rate);
    else lua_pushnil(L);
    if (c->ttft_ms >= 0) lua_pushnumber(L, c->ttft_ms);
    else lua_pushnil(L);
    if (c->load_known) {
        lua_createtable(L, 0, 3);
        set_int(L, "running", c->load_running);
        set_int(L, "waiting", c->load_waiting);
        if (c->load_kv_cache >= 0) set_num(L, "kv_cache", c->load_kv_cache);
    } else {
        lua_pushnil(L);
    }
    lua_call(L, 26, 1); /* the constructor cannot fail but for memory, as lua_createtable */
}

static const char *degraded_name(const char *s)
{
    static const char *const names[] = {"fallback", "emergency", "smaller", "cloud"};
    if (!s) return NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i]) == 0) return names[i];
    return NULL;
}

/* Read one plan entry (a candidate table or {index = i}) at the top of the stack. */
static int read_entry(lua_State *L, int n, mg_plan_entry_t *e)
{
    lua_Integer idx = 0;
    e->degraded = NULL;
    e->emergency = 0;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "index");
        idx = lua_tointeger(L, -1);
        lua_getfield(L, -2, "degraded");
        e->degraded = degraded_name(lua_tostring(L, -1));
        lua_getfield(L, -3, "emergency");
        e->emergency = lua_toboolean(L, -1);
        lua_pop(L, 3);
    } else {
        idx = lua_tointeger(L, -1); /* a plain index is accepted too */
    }
    if (idx < 1 || idx > n) return -1;
    e->index = (int)idx - 1;
    return 0;
}

int mg_gen_route(mg_gen_t *g, int req_ref, int attempt, const mg_candidate_t *cands, int n,
                 mg_plan_t *plan, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    plan->n = 0;
    plan->wait_ms = 0;
    push_field(L, g->routing_ref, "route");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    set_int(L, "attempt", attempt);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        push_candidate(L, g, i + 1, &cands[i]);
        lua_rawseti(L, -2, i + 1);
    }
    if (pcall(L, 2, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        lua_settop(L, top);
        snprintf(err, errlen, "routing.route must return a plan (a list, {wait_ms = N} or {})");
        return -1;
    }
    lua_getfield(L, -1, "wait_ms");
    if (lua_isnumber(L, -1)) {
        double w = lua_tonumber(L, -1);
        plan->wait_ms = w < 1 ? 1 : w > 3600000 ? 3600000 : (int)w;
    }
    lua_pop(L, 1);
    lua_Integer len = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= len && plan->n < n; i++) {
        lua_rawgeti(L, -1, i);
        mg_plan_entry_t e;
        int ok = read_entry(L, n, &e) == 0;
        lua_pop(L, 1);
        if (!ok) continue;
        int dup = 0;
        for (int k = 0; k < plan->n; k++) dup |= plan->entries[k].index == e.index;
        if (!dup) plan->entries[plan->n++] = e;
    }
    if (plan->n > 0) plan->wait_ms = 0;
    lua_settop(L, top);
    return 0;
}

/* The default curve when no cooldown policy is loaded: 30 s doubling, at most 600 s. */
static double default_backoff(int n)
{
    double s = 30;
    for (int i = 1; i < n && s < 600; i++) s *= 2;
    return s > 600 ? 600 : s;
}

int mg_gen_cooldown(mg_gen_t *g, const mg_provider_conf_t *p, int status, const char *retry_after,
                    int consecutive_429, int observing, double *cooldown_s, char *err,
                    size_t errlen)
{
    *cooldown_s = 0;
    if (g->cooldown_ref == LUA_NOREF) {
        if (status == 429) {
            double ra = retry_after ? atof(retry_after) : 0;
            double b = default_backoff(consecutive_429);
            *cooldown_s = ra > b ? ra : b;
        }
        return 0;
    }
    lua_State *L = g->L;
    int top = lua_gettop(L);
    push_field(L, g->cooldown_ref, "on_response");
    push_provider(L, p);
    lua_pushinteger(L, status);
    lua_createtable(L, 0, 1);
    if (retry_after) set_str(L, "retry-after", retry_after);
    lua_createtable(L, 0, 2);
    set_int(L, "consecutive_429", consecutive_429);
    set_bool(L, "observing", observing);
    if (pcall(L, 4, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "cooldown_s");
        double v = lua_tonumber(L, -1);
        *cooldown_s = v > 0 ? (v > 86400 ? 86400 : v) : 0;
    }
    lua_settop(L, top);
    return 0;
}

static void push_route(lua_State *L, const mg_provider_conf_t *p, const char *model)
{
    lua_createtable(L, 0, 6);
    set_str(L, "provider", p->id);
    set_str(L, "model", model);
    set_str(L, "base_url", p->base_url);
    if (p->api_key) set_str(L, "api_key", p->api_key);
    set_str(L, "pool", p->pool);
    set_bool(L, "local", p->local);
}

/* Read the headers table at the top of the stack into a curl list. */
static int read_headers(lua_State *L, struct curl_slist **list, char *err, size_t errlen)
{
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1)) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: headers must map names to strings");
            return -1;
        }
        const char *name = lua_tostring(L, -2);
        const char *value = lua_tostring(L, -1);
        if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: header '%s' contains a forbidden character", name);
            return -1;
        }
        size_t len = strlen(name) + strlen(value) + 3;
        char *line = malloc(len);
        if (!line) {
            lua_pop(L, 2);
            return -1;
        }
        snprintf(line, len, "%s: %s", name, value);
        struct curl_slist *nl = curl_slist_append(*list, line);
        free(line);
        if (!nl) {
            lua_pop(L, 2);
            return -1;
        }
        *list = nl;
        lua_pop(L, 1);
    }
    return 0;
}

int mg_gen_encode(mg_gen_t *g, int adapter, int req_ref, const mg_provider_conf_t *p,
                  const char *upstream_model, mg_encoded_t *out, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    memset(out, 0, sizeof(*out));
    push_field(L, g->adapters[adapter].ref, "encode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_route(L, p, upstream_model);
    if (pcall(L, 2, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "%s.encode must return a table", g->adapters[adapter].name);
        goto fail;
    }
    lua_getfield(L, -1, "method");
    const char *method = lua_isstring(L, -1) ? lua_tostring(L, -1) : "POST";
    if (strcmp(method, "POST") != 0 && strcmp(method, "GET") != 0) {
        snprintf(err, errlen, "%s.encode: method must be POST or GET", g->adapters[adapter].name);
        goto fail;
    }
    snprintf(out->method, sizeof(out->method), "%s", method);
    lua_pop(L, 1);
    if (lua_getfield(L, -1, "path") != LUA_TSTRING) {
        snprintf(err, errlen, "%s.encode: path must be a string", g->adapters[adapter].name);
        goto fail;
    }
    out->path = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    int t = lua_getfield(L, -1, "headers");
    if (t == LUA_TTABLE && read_headers(L, &out->headers, err, errlen) != 0) goto fail;
    lua_pop(L, 1);
    t = lua_getfield(L, -1, "body");
    if (t != LUA_TNIL) {
        out->body = to_json(L, g, -1, 0, err, errlen);
        if (!out->body) goto fail;
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "stream_format");
    const char *fmt = lua_tostring(L, -1);
    out->ndjson = fmt && strcmp(fmt, "ndjson") == 0;
    lua_settop(L, top);
    if (!out->path) {
        snprintf(err, errlen, "out of memory");
        mg_encoded_free(out);
        return -1;
    }
    return 0;
fail:
    lua_settop(L, top);
    mg_encoded_free(out);
    return -1;
}

void mg_encoded_free(mg_encoded_t *e)
{
    free(e->path);
    curl_slist_free_all(e->headers);
    cJSON_Delete(e->body);
    memset(e, 0, sizeof(*e));
}

int mg_gen_decode(mg_gen_t *g, int adapter, int req_ref, const cJSON *resp, cJSON **out,
                  char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    push_field(L, g->adapters[adapter].ref, "decode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_json(L, g, resp, 0);
    if (pcall(L, 2, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) *out = to_json(L, g, -1, 0, err, errlen);
    else snprintf(err, errlen, "%s.decode must return a table", g->adapters[adapter].name);
    lua_settop(L, top);
    return *out ? 0 : -1;
}

int mg_gen_decode_event(mg_gen_t *g, int adapter, int req_ref, int state_ref, const cJSON *data,
                        cJSON **out, int *done, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    push_field(L, g->adapters[adapter].ref, "decode_event");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_json(L, g, data, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    if (pcall(L, 3, 1, err, errlen) != 0) return -1;
    if (lua_isnil(L, -1)) {
        *out = cJSON_CreateArray();
    } else if (lua_istable(L, -1)) {
        /* always an array of chunks, even if the adapter returned a single empty table */
        size_t len = lua_rawlen(L, -1);
        *out = cJSON_CreateArray();
        for (size_t i = 1; *out && i <= len; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i);
            cJSON *chunk = to_json(L, g, -1, 0, err, errlen);
            lua_pop(L, 1);
            if (!chunk) {
                cJSON_Delete(*out);
                *out = NULL;
                break;
            }
            cJSON_AddItemToArray(*out, chunk);
        }
    } else {
        snprintf(err, errlen, "%s.decode_event must return a list", g->adapters[adapter].name);
    }
    lua_settop(L, top);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    lua_getfield(L, -1, "done");
    *done = lua_toboolean(L, -1);
    lua_settop(L, top);
    return *out ? 0 : -1;
}
