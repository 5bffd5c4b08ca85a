/* moongate.tokens (core/luavm/ltoken.c): counts by the loaded encodings, nil and a message
 * for one that is not loaded, an error for an unknown one. */
#include <lauxlib.h>
#include <lualib.h>

#include "mgtest.h"
#include "luavm/ltoken.h"
#include "token/registry.h"

static lua_State *L;

static int run(const char *code)
{
    return luaL_dostring(L, code) == LUA_OK;
}

static void test_tokens(void)
{
    CHECK(run("return moongate.tokens('hello world')"));
    CHECK_EQ_INT(lua_tointeger(L, -1), 2);
    CHECK(run("return moongate.tokens('<|endoftext|>', 'o200k_base')"));
    CHECK(lua_tointeger(L, -1) > 1); /* special tokens are plain text */
    CHECK(run("return moongate.tokens('', 'o200k_base')"));
    CHECK_EQ_INT(lua_tointeger(L, -1), 0);
}

static void test_not_loaded_and_unknown(void)
{
    CHECK(run("local n, err = moongate.tokens('hi', 'cl100k_base'); return n == nil and err"));
    CHECK(strstr(lua_tostring(L, -1), "cl100k_base is not loaded") != NULL);
    CHECK(!run("return moongate.tokens('hi', 'p50k_base')"));
    CHECK(strstr(lua_tostring(L, -1), "unknown encoding 'p50k_base'") != NULL);
    CHECK(!run("return moongate.tokens({})"));
}

int main(void)
{
    char dir[4096], err[512];
    int want[MG_ENC_COUNT] = {[MG_ENC_O200K] = 1};
    mg_encoding_data_dir(NULL, dir, sizeof(dir));
    if (mg_token_registry_load(dir, want, err, sizeof(err)) != 0) {
        fprintf(stderr, "test_ltoken: %s\n", err);
        return 1;
    }
    L = luaL_newstate();
    luaL_openlibs(L);
    lua_newtable(L);
    lua_pushcfunction(L, mg_lua_tokens);
    lua_setfield(L, -2, "tokens");
    lua_setglobal(L, "moongate");
    MG_RUN(test_tokens);
    MG_RUN(test_not_loaded_and_unknown);
    lua_close(L);
    mg_token_registry_free();
    return mg_test_summary();
}
