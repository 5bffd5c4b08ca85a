/* context: the call of policies/context.lua (luavm.h, mg_gen_context_trim).
 *
 * The policy gets ctx = {messages, tokens, first_current, n_leading, policy, overhead,
 * count}; retrieval snippets are messages marked moongate_snippet (pipeline/snippets.h).
 * count(msg) is the chat rule of token/chat.h over the encoding of the request's model, so a
 * step that rewrites a message (a compressed tool result) re-counts it exactly as the core
 * will when it checks the answer. */
#include "luavm/luavm.h"

#include <stdio.h>
#include <lauxlib.h>
#include <lua.h>

#include "luavm/lcall.h"
#include "token/chat.h"
#include "token/registry.h"

int mg_gen_has_context(const mg_gen_t *g)
{
    return g->context_ref != LUA_NOREF;
}

/* count(msg): upvalues 1 = the generation (light userdata, unseen by Lua code), 2 = the
 * encoding id. */
static int lua_count(lua_State *L)
{
    mg_gen_t *g = lua_touserdata(L, lua_upvalueindex(1));
    const mg_encoding_t *e = mg_token_registry_get((int)lua_tointeger(L, lua_upvalueindex(2)));
    char err[128];
    cJSON *m = e ? mg_lua_to_json(g, 1, err, sizeof(err)) : NULL;
    long n = m ? mg_chat_message_tokens(e, m) : -1;
    cJSON_Delete(m);
    if (n < 0) return luaL_error(L, "count: not a message, or no encoding loaded");
    lua_pushinteger(L, n);
    return 1;
}

static void push_ctx(mg_gen_t *g, const mg_context_in_t *in)
{
    lua_State *L = g->L;
    lua_createtable(L, 0, 8);
    mg_lua_push_json(g, in->messages);
    lua_setfield(L, -2, "messages");
    int n = cJSON_GetArraySize(in->messages);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, in->tokens[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "tokens");
    mg_lset_int(L, "first_current", in->first_current + 1);
    mg_lset_int(L, "n_leading", in->n_leading);
    mg_lset_str(L, "policy", in->policy);
    mg_lset_int(L, "overhead", MG_CHAT_TOKENS_REPLY);
    lua_pushlightuserdata(L, g);
    lua_pushinteger(L, in->encoding);
    lua_pushcclosure(L, lua_count, 2);
    lua_setfield(L, -2, "count");
}

int mg_gen_context_trim(mg_gen_t *g, const mg_context_in_t *in, long budget, cJSON **out,
                        cJSON **steps, char *err, size_t errlen)
{
    *out = *steps = NULL;
    if (g->context_ref == LUA_NOREF) {
        snprintf(err, errlen, "no context policy is loaded");
        return 1;
    }
    lua_State *L = g->L;
    int top = lua_gettop(L);
    lua_checkstack(L, 8);
    mg_lpush_field(L, g->context_ref, "trim");
    push_ctx(g, in);
    lua_pushinteger(L, budget);
    if (mg_lcall(L, 2, 2, err, errlen) != 0) return -1;
    int rc = 0;
    if (lua_isnil(L, -2)) { /* nil, reason: it cannot fit */
        snprintf(err, errlen, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "it cannot fit");
        rc = 1;
    } else {
        *out = mg_lua_to_json(g, top + 1, err, errlen);
        if (!cJSON_IsArray(*out)) {
            cJSON_Delete(*out);
            *out = NULL;
            if (!err[0]) snprintf(err, errlen, "trim must return a message list");
            rc = -1;
        } else if (lua_istable(L, -1)) {
            lua_getfield(L, -1, "steps");
            *steps = lua_istable(L, -1) ? mg_lua_to_json(g, lua_gettop(L), err, errlen) : NULL;
        }
    }
    if (!*steps) *steps = cJSON_CreateArray();
    lua_settop(L, top);
    return rc;
}
