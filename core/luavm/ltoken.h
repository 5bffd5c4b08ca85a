/* ltoken: moongate.tokens(text [, encoding]) for Lua policies. */
#ifndef MG_LTOKEN_H
#define MG_LTOKEN_H

#include <lua.h>

/* moongate.tokens(text [, encoding]): the number of tokens of the string text by encoding
 * ("o200k_base", the default, or "cl100k_base"), special tokens as plain text. Returns nil
 * and a message when that encoding is not loaded (no model names it, or its rank files are
 * missing); raises an error for an unknown encoding or a text that is not a string. */
int mg_lua_tokens(lua_State *L);

#endif
