/* reqtab: the request tables route(), encode() and the decoders get; see reqtab.h. */
#include "luavm/reqtab.h"

#include <lauxlib.h>
#include <lua.h>

#include "luavm/json.h"
#include "luavm/lcall.h"

/* Request tables are recycled. Building one (a table, fourteen new keys) was the largest Lua
 * cost of a request; now a request that ends puts its table on the generation's free list
 * and the next one rewrites the same fields in it. fill() below rewrites every field the core
 * gives (so whatever Lua code wrote to those is gone); a table to which Lua code added a field
 * of its own carries a mark, set by its metatable's __newindex, and is dropped instead, as is
 * one whose metatable was replaced: no request ever sees another's fields. fill() only assigns
 * an optional field when it changes, so that the usual fill runs no metamethod. */
static const char req_src[] =
    "local rawset = rawset\n"
    "local CORE <const> = { request_id = true, endpoint = true, model = true, stream = true,\n"
    "  max_tokens = true, created = true, priority = true, pool = true, pin = true,\n"
    "  local_only = true, allow_smaller_model = true, allow_cloud = true, local_first = true,\n"
    "  random = true, attempt = true, plan_limit = true, body = true, entry = true }\n"
    "local DIRTY <const> = {}\n"
    "local mt <const> = { __newindex = function(t, k, v)\n"
    "  rawset(t, k, v)\n"
    "  if not CORE[k] then rawset(t, DIRTY, true) end\n"
    "end }\n"
    "local function fill(t, request_id, endpoint, model, stream, max_tokens, created, priority,\n"
    "  pool, pin, local_only, allow_smaller_model, allow_cloud, local_first, random)\n"
    "  t.request_id = request_id; t.endpoint = endpoint; t.model = model; t.stream = stream\n"
    "  if t.max_tokens ~= max_tokens then t.max_tokens = max_tokens end\n"
    "  t.created = created; t.priority = priority\n"
    "  if t.pool ~= pool then t.pool = pool end\n"
    "  if t.pin ~= pin then t.pin = pin end\n"
    "  t.local_only = local_only; t.allow_smaller_model = allow_smaller_model\n"
    "  t.allow_cloud = allow_cloud; t.local_first = local_first; t.random = random\n"
    "  t.attempt = 1\n"
    "  if t.plan_limit ~= nil then t.plan_limit = nil end\n"
    "  return t\n"
    "end\n"
    "return fill, mt, DIRTY\n";
int mg_reqtab_load(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    if (luaL_loadbuffer(L, req_src, sizeof(req_src) - 1, "=request") != LUA_OK ||
        mg_lcall(L, 0, 3, err, errlen) != 0)
        return -1;
    /* registry integer refs: a light-userdata key (lua_rawgetp) is a hash lookup, about
       seven times a ref's array read, and these are read three times per request */
    g->req_dirty_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->req_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->req_fill_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

static void push_opt_str(lua_State *L, const char *s)
{
    if (s) lua_pushstring(L, s);
    else lua_pushnil(L);
}

/* fill(t, info...) for the table on top of the stack, which it leaves there. */
static void fill_req(const mg_gen_t *g, const mg_lua_req_t *info)
{
    lua_State *L = g->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->req_fill_ref);
    lua_insert(L, -2);
    lua_pushstring(L, info->request_id);
    lua_pushstring(L, info->endpoint);
    lua_pushstring(L, info->model);
    lua_pushboolean(L, info->stream);
    if (info->max_tokens >= 0) lua_pushinteger(L, info->max_tokens);
    else lua_pushnil(L);
    lua_pushinteger(L, info->created);
    lua_pushstring(L, info->priority ? info->priority : "P2");
    push_opt_str(L, info->pool);
    push_opt_str(L, info->pin);
    lua_pushboolean(L, info->local_only);
    lua_pushboolean(L, info->allow_smaller_model);
    lua_pushboolean(L, info->allow_cloud);
    lua_pushboolean(L, info->local_first);
    lua_pushnumber(L, info->random);
    lua_call(L, 15, 1); /* plain assignments: raises only when out of memory */
}

int mg_gen_req_new(mg_gen_t *g, const mg_lua_req_t *info)
{
    lua_State *L = g->L;
    if (g->n_req_free > 0) {
        int ref = g->req_free[--g->n_req_free];
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
        fill_req(g, info);
        lua_pop(L, 1);
        return ref;
    }
    lua_createtable(L, 0, 17); /* the fields fill() sets, plan_limit and body */
    fill_req(g, info);         /* before the metatable: no metamethod for the new keys */
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->req_mt_ref);
    lua_setmetatable(L, -2);
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

int mg_gen_req_table(mg_gen_t *g, const mg_lua_req_t *info, int *req_ref)
{
    if (*req_ref < 0) *req_ref = mg_gen_req_new(g, info);
    return *req_ref;
}

/* Whether the request table on top of the stack is still as the core made it. */
static int req_is_clean(const mg_gen_t *g)
{
    lua_State *L = g->L;
    if (!lua_getmetatable(L, -1)) return 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->req_mt_ref);
    int ours = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->req_dirty_ref);
    int marked = lua_rawget(L, -2) != LUA_TNIL;
    lua_pop(L, 1);
    return ours && !marked;
}

void mg_gen_req_release(mg_gen_t *g, int ref)
{
    if (ref < 0) return;
    lua_State *L = g->L;
    if (g->n_req_free < MG_REQ_FREE_MAX) {
        int top = lua_gettop(L);
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
        int clean = req_is_clean(g);
        if (clean && lua_getfield(L, -1, "body") != LUA_TNIL) { /* collectable now, not at reuse */
            lua_pushnil(L);
            lua_setfield(L, -3, "body");
        }
        if (clean && lua_getfield(L, top + 1, "entry") != LUA_TNIL) {
            lua_pushnil(L);
            lua_setfield(L, top + 1, "entry");
        }
        lua_settop(L, top);
        if (clean) {
            g->req_free[g->n_req_free++] = ref;
            return;
        }
    }
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
}

int mg_gen_req_set_body(mg_gen_t *g, int req_ref, const cJSON *body)
{
    lua_State *L = g->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    mg_ljson_push(L, &g->json, body);
    lua_setfield(L, -2, "body");
    lua_pop(L, 1);
    return 0;
}

int mg_gen_req_set_entry(mg_gen_t *g, int req_ref, const cJSON *entry)
{
    lua_State *L = g->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    mg_ljson_push(L, &g->json, entry);
    lua_setfield(L, -2, "entry");
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
