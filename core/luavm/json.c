/* json: JSON <-> Lua with util.null and util.array_mt; see json.h. */
#include "luavm/json.h"

#include <lauxlib.h>
#include <lua.h>
#include <stdio.h>
#include <string.h>

#define JSON_MAX_DEPTH 64
#define MG_EXACT_INT 9007199254740992LL /* 2^53 */

static void push_json(lua_State *L, const mg_ljson_t *g, const cJSON *v, int depth)
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
        else lua_pushnumber(L, d);
    } else if (cJSON_IsString(v)) {
        lua_pushstring(L, v->valuestring);
    } else if (cJSON_IsRaw(v) && v->valuestring &&
               (v->valuestring[0] == '{' || v->valuestring[0] == '[')) {
        /* JSON text kept as it was stored (a session's turns): its tree */
        cJSON *tree = cJSON_Parse(v->valuestring);
        push_json(L, g, tree, depth);
        cJSON_Delete(tree);
    } else if (cJSON_IsRaw(v)) {
        /* an integer literal kept exact (mg_json_keep_big_ints): a Lua integer when it fits */
        if (!v->valuestring || !lua_stringtonumber(L, v->valuestring))
            lua_rawgeti(L, LUA_REGISTRYINDEX, g->null_ref);
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

void mg_ljson_push(lua_State *L, const mg_ljson_t *j, const cJSON *v)
{
    push_json(L, j, v, 0);
}

/* Is the table at idx an array: marked with util.array_mt, or keys exactly 1..n (n>0)? */
static int table_is_array(lua_State *L, const mg_ljson_t *g, int idx, size_t *len)
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

static cJSON *to_json(lua_State *L, const mg_ljson_t *g, int idx, int depth, char *err,
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
        if (lua_isinteger(L, idx)) {
            lua_Integer i = lua_tointeger(L, idx);
            if (i > -MG_EXACT_INT && i < MG_EXACT_INT) return cJSON_CreateNumber((double)i);
            /* past 2^53 a double is not exact: the digits themselves */
            char digits[24];
            snprintf(digits, sizeof(digits), "%lld", (long long)i);
            return cJSON_CreateRaw(digits);
        }
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

cJSON *mg_ljson_to(lua_State *L, const mg_ljson_t *j, int idx, char *err, size_t errlen)
{
    return to_json(L, j, idx, 0, err, errlen);
}
