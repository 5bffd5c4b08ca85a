/* lcall: protected calls into Lua and stack helpers; see lcall.h. */
#include "luavm/lcall.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

/* Strings keep their "file:line:" prefix; a table (a refusal) is read after the call. */
static int msg_handler(lua_State *L)
{
    if (!lua_isstring(L, 1) && !lua_istable(L, 1))
        lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    return 1;
}

static mg_lrefusal_kind_t refusal_kind(const char *s)
{
    if (!s) return MG_LREFUSAL_NONE;
    if (strcmp(s, "not_for_route") == 0) return MG_LREFUSAL_NOT_FOR_ROUTE;
    if (strcmp(s, "invalid_request") == 0) return MG_LREFUSAL_INVALID;
    return MG_LREFUSAL_NONE;
}

/* The error object on the stack top into err (and *r): a string as it is, a table by its
 * message, refusal and param fields. */
static void read_error(lua_State *L, char *err, size_t errlen, mg_lrefusal_t *r)
{
    if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        return;
    }
    lua_getfield(L, -1, "message");
    const char *msg = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
    snprintf(err, errlen, "%s", msg ? msg : "(error object is a table value)");
    lua_pop(L, 1);
    if (!r) return;
    lua_getfield(L, -1, "refusal");
    r->kind = lua_type(L, -1) == LUA_TSTRING ? refusal_kind(lua_tostring(L, -1)) : MG_LREFUSAL_NONE;
    lua_pop(L, 1);
    lua_getfield(L, -1, "param");
    if (r->kind != MG_LREFUSAL_NONE && lua_type(L, -1) == LUA_TSTRING)
        snprintf(r->param, sizeof(r->param), "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
}

int mg_lcall_refusal(lua_State *L, int nargs, int nres, char *err, size_t errlen, mg_lrefusal_t *r)
{
    if (r) *r = (mg_lrefusal_t){0};
    int base = lua_gettop(L) - nargs;
    lua_pushcfunction(L, msg_handler);
    lua_insert(L, base);
    int rc = lua_pcall(L, nargs, nres, base);
    lua_remove(L, base);
    if (rc != LUA_OK) {
        read_error(L, err, errlen, r);
        lua_pop(L, 1);
        return -1;
    }
    return 0;
}

int mg_lcall(lua_State *L, int nargs, int nres, char *err, size_t errlen)
{
    return mg_lcall_refusal(L, nargs, nres, err, errlen, NULL);
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
