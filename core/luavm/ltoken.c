/* ltoken: the tokenizer for Lua, over the encodings the process loaded at start-up
 * (token/registry.h). Counting runs on the calling thread (the loop, for policies) at the
 * tokenizer's 50-100 MB/s: cheap for a message, a millisecond for a 100 KB text. */
#include "luavm/ltoken.h"

#include <lauxlib.h>

#include "token/registry.h"
#include "token/tokenize.h"

int mg_lua_tokens(lua_State *L)
{
    size_t len = 0;
    const char *text = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "o200k_base");
    int id = mg_encoding_lookup(name);
    if (id < 0) return luaL_error(L, "moongate.tokens: unknown encoding '%s'", name);
    const mg_encoding_t *e = mg_token_registry_get(id);
    long n = e ? mg_tokenize_count(e, text, len, 0) : -1;
    if (n < 0) {
        lua_pushnil(L);
        lua_pushfstring(L, "moongate.tokens: encoding %s is not loaded", name);
        return 2;
    }
    lua_pushinteger(L, n);
    return 1;
}
