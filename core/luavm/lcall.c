/* lcall: protected calls into Lua and stack helpers; see lcall.h. */
#include "luavm/lcall.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>

static int msg_handler(lua_State *L)
{
    if (!lua_isstring(L, 1)) lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    return 1;
}

int mg_lcall(lua_State *L, int nargs, int nres, char *err, size_t errlen)
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

int mg_lpush_field(lua_State *L, int ref, const char *name)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    int t = lua_getfield(L, -1, name);
    lua_remove(L, -2);
    return t;
}

void mg_lset_int(lua_State *L, const char *k, long long v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

void mg_lset_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

void mg_lset_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

void mg_lset_str(lua_State *L, const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

void mg_lset_nil(lua_State *L, const char *k)
{
    lua_pushnil(L);
    lua_setfield(L, -2, k);
}

void mg_lpush_provider(lua_State *L, const mg_provider_conf_t *p)
{
    lua_createtable(L, 0, 10);
    mg_lset_str(L, "id", p->id);
    mg_lset_str(L, "adapter", p->adapter);
    mg_lset_str(L, "base_url", p->base_url);
    if (p->api_key) mg_lset_str(L, "api_key", p->api_key);
    mg_lset_str(L, "pool", p->pool);
    mg_lset_int(L, "rpm_limit", p->rpm_limit);
    mg_lset_int(L, "tpm_limit", p->tpm_limit);
    mg_lset_num(L, "weight", p->weight);
    mg_lset_bool(L, "local", p->local);
}
