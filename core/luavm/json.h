/* json: JSON values <-> Lua values, with moongate's conventions for what Lua lacks.
 *
 * JSON null is util.null (a sentinel table) and every JSON array gets util.array_mt, so that
 * a value survives the round trip JSON -> Lua -> JSON unchanged (lua/README.md, "JSON values").
 * Going back, a table is an array when it carries util.array_mt or its keys are exactly 1..n
 * with n > 0; util.null and nil become null. Nesting deeper than 64 levels is cut (to null on
 * the way in, an error on the way out: a cycle). Used by the calls (request bodies, upstream
 * answers) and by the moongate module's json_encode / json_decode. */
#ifndef MG_JSON_LUA_H
#define MG_JSON_LUA_H

#include <stddef.h>
#include <cjson/cJSON.h>

typedef struct lua_State lua_State;

/* Where the two sentinels are: registry references to util.null and util.array_mt. */
typedef struct mg_ljson_s {
    int null_ref, array_mt_ref;
} mg_ljson_t;

/* Push v (NULL pushes util.null). */
void mg_ljson_push(lua_State *L, const mg_ljson_t *j, const cJSON *v);
/* The value at idx as JSON (caller frees), or NULL with err set (a function, a cycle, a
 * non-string key, a string with a NUL...). */
cJSON *mg_ljson_to(lua_State *L, const mg_ljson_t *j, int idx, char *err, size_t errlen);

#endif
