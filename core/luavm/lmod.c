/* lmod: the `moongate` module for policies and adapters; see lmod.h and lua/README.md.
 *
 * Every function finds the module's state (mg_lmod_t) in its first upvalue. The ordering
 * functions read their arguments once into C arrays (the weights and keys: given as lists or
 * as functions of a value, called once per value), order with order.c and build the new
 * list; while the core records a route() call (m->hooks), each step is also told to the
 * recording, and the function calls go through it, so that it can keep their answers. */
#include "luavm/lmod.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/crypto.h"
#include "base/log.h"

#define DRAW_MT "moongate.draw"

static mg_lmod_t *ctx_of(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

/* The hooks when a recording runs, else NULL. */
static const mg_lmod_hooks_t *hooks_of(const mg_lmod_t *m)
{
    return m->hooks;
}

static void impure(const mg_lmod_t *m)
{
    const mg_lmod_hooks_t *h = hooks_of(m);
    if (h && h->impure) h->impure(h->ud);
}

/* ------------------------------------------------------------------------ */
/* Time, log, JSON, hashing                                                  */
/* ------------------------------------------------------------------------ */

static int l_now_ms(lua_State *L)
{
    impure(ctx_of(L));
    struct timeval tv;
    gettimeofday(&tv, NULL);
    lua_pushinteger(L, (lua_Integer)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    return 1;
}

static int l_log(lua_State *L)
{
    impure(ctx_of(L)); /* a line per request is what a logging policy wants */
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
    cJSON *j = mg_ljson_to(L, &ctx_of(L)->json, 1, err, sizeof(err));
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
    mg_ljson_push(L, &ctx_of(L)->json, j);
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

/* ------------------------------------------------------------------------ */
/* The request's random draws                                                */
/* ------------------------------------------------------------------------ */

/* A draw (order.h's mg_draw_t) and its number in the recording (-1: none). */
typedef struct draw_s {
    mg_draw_t d;
    int id;
} draw_t;

/* moongate.draw(req): the random numbers of this request, from req.random ([0, 1); anything
 * else counts as 0). */
static int l_draw(lua_State *L)
{
    const mg_lmod_hooks_t *h = hooks_of(ctx_of(L));
    double r = 0;
    int id = -1;
    if (!(h && h->draw && h->draw(h->ud, L, 1, &r, &id))) {
        luaL_checktype(L, 1, LUA_TTABLE);
        lua_getfield(L, 1, "random");
        r = lua_tonumber(L, -1);
        lua_pop(L, 1);
    }
    draw_t *d = lua_newuserdatauv(L, sizeof(*d), 0);
    mg_draw_init(&d->d, r);
    d->id = id;
    luaL_setmetatable(L, DRAW_MT);
    return 1;
}

/* draw:chance(p): true for a share p of requests. */
static int l_chance(lua_State *L)
{
    draw_t *d = luaL_checkudata(L, 1, DRAW_MT);
    double p = luaL_checknumber(L, 2);
    int result = mg_draw_chance(&d->d, p);
    const mg_lmod_hooks_t *h = hooks_of(ctx_of(L));
    if (h && d->id >= 0) h->chance(h->ud, d->id, p, result);
    lua_pushboolean(L, result);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* sort_by and weighted_order                                                */
/* ------------------------------------------------------------------------ */

/* Room for 3 x n order items: the items, as many for the merge, as many for the keys. */
static mg_order_item_t *scratch(lua_State *L, mg_lmod_t *m, size_t n, const char *fn)
{
    if (n == 0) n = 1;
    if (n > m->cap) {
        size_t cap = n > 2 * m->cap ? n : 2 * m->cap;
        mg_order_item_t *items = realloc(m->scratch, 3 * cap * sizeof(*items));
        if (!items) luaL_error(L, "%s: out of memory", fn);
        m->scratch = items;
        m->cap = cap;
    }
    return m->scratch;
}

static mg_spec_kind_t spec_kind(lua_State *L, int arg)
{
    switch (lua_type(L, arg)) {
    case LUA_TNONE:
    case LUA_TNIL: return MG_SPEC_NONE;
    case LUA_TTABLE: return MG_SPEC_LIST;
    case LUA_TFUNCTION: return MG_SPEC_FN;
    default: luaL_typeerror(L, arg, "nil, a list of numbers or a function"); return MG_SPEC_NONE;
    }
}

/* The n values of the spec at arg (weights: which = 0, keys: 1) into items[i].key, positions
 * i + 1. A list holds numbers; a function is called with each value of the list and answers
 * a number, or nil / false for none (a weight of none is 0; a key of none means the keys are
 * not used). Returns 0 when some value has no key. */
static int spec_values(lua_State *L, const mg_lmod_t *m, int op, int which, int arg,
                       mg_spec_kind_t kind, int list, size_t n, mg_order_item_t *items,
                       const char *fn)
{
    const mg_lmod_hooks_t *h = hooks_of(m);
    int all = 1;
    for (size_t i = 0; i < n; i++) {
        items[i].pos = (int)i + 1;
        if (kind == MG_SPEC_NONE) {
            items[i].key = 1;
            continue;
        }
        if (kind == MG_SPEC_LIST) {
            lua_rawgeti(L, arg, (lua_Integer)i + 1);
        } else if (h && op >= 0) {
            h->eval(h->ud, L, op, which, arg, list, i + 1);
        } else {
            lua_pushvalue(L, arg);
            lua_rawgeti(L, list, (lua_Integer)i + 1);
            lua_call(L, 1, 1);
        }
        int isnum = 0;
        double v = lua_tonumberx(L, -1, &isnum);
        int none = kind == MG_SPEC_FN && !lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (!isnum && !none) luaL_error(L, "%s: key %d is not a number", fn, (int)i + 1);
        if (none) all = 0;
        items[i].key = none ? (which ? NAN : 0) : v;
    }
    return all;
}

/* Push a new list of the list's values in the order of items. */
static void push_in_order(lua_State *L, const mg_lmod_t *m, int op, int list,
                          const mg_order_item_t *items, size_t n)
{
    const mg_lmod_hooks_t *h = hooks_of(m);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        if (h && op >= 0) h->push_result(h->ud, L, op, list, items[i].pos, i + 1);
        else lua_rawgeti(L, list, items[i].pos);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int begin(lua_State *L, const mg_lmod_t *m, size_t n)
{
    const mg_lmod_hooks_t *h = hooks_of(m);
    return h ? h->order_begin(h->ud, L, 1, n) : -1;
}

static void end(lua_State *L, const mg_lmod_t *m, int op, const mg_order_call_t *call)
{
    const mg_lmod_hooks_t *h = hooks_of(m);
    if (h && op >= 0) h->order_end(h->ud, L, op, call);
}

/* moongate.sort_by(list, keys): a new list of list's values by ascending key (NaN last), equal
 * keys in list order; keys a list of numbers or a function of a value (nil: the list's
 * order, as when some value has no key). */
static int l_sort_by(lua_State *L)
{
    mg_lmod_t *m = ctx_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    mg_spec_kind_t kind = spec_kind(L, 2);
    size_t n = lua_rawlen(L, 1);
    mg_order_item_t *items = scratch(L, m, n, "sort_by");
    int op = begin(L, m, n);
    int keyed = kind != MG_SPEC_NONE && spec_values(L, m, op, 1, 2, kind, 1, n, items, "sort_by");
    double *keys = NULL;
    if (keyed && op >= 0) { /* what the recording keeps: the keys as the sort used them */
        keys = malloc((n ? n : 1) * sizeof(*keys));
        if (!keys) op = -1; /* (not recorded, still sorted) */
        for (size_t i = 0; keys && i < n; i++) keys[i] = items[i].key;
    }
    if (keyed) mg_order_sort(items, n, items + n);
    else
        for (size_t i = 0; i < n; i++) items[i] = (mg_order_item_t){.key = 0, .pos = (int)i + 1};
    mg_order_call_t call = {.weighted = 0,
                            .list = 1,
                            .n = n,
                            .key_kind = kind,
                            .key_fn = 2,
                            .keys = keys,
                            .draw_id = -1,
                            .limit = -1,
                            .out = items,
                            .out_n = n};
    end(L, m, op, &call);
    free(keys);
    push_in_order(L, m, op, 1, items, n);
    return 1;
}

/* moongate.weighted_order(list, weights, draw[, keys[, limit]]) (or, as first given,
 * (list, weights, u, seed[, keys[, limit]])): a new list of list's values in a weighted random
 * order without replacement; weights nil = all 1, a list, or a function of a value; with
 * keys, by ascending key first, the weighted order among equal keys; with limit, only the
 * first `limit` values of such an order (see order.h). */
static int l_weighted_order(lua_State *L)
{
    mg_lmod_t *m = ctx_of(L);
    luaL_checktype(L, 1, LUA_TTABLE);
    mg_spec_kind_t wkind = spec_kind(L, 2);
    double u;
    uint64_t seed;
    int draw_id = -1, keyarg = 5;
    if (lua_type(L, 3) == LUA_TUSERDATA) {
        draw_t *d = luaL_checkudata(L, 3, DRAW_MT);
        mg_draw_for_order(&d->d, &u, &seed);
        draw_id = d->id;
        keyarg = 4;
    } else {
        u = luaL_checknumber(L, 3);
        seed = (uint64_t)luaL_checkinteger(L, 4);
    }
    mg_spec_kind_t kkind = spec_kind(L, keyarg);
    lua_Integer limit = -1; /* none */
    if (!lua_isnoneornil(L, keyarg + 1)) {
        limit = luaL_checkinteger(L, keyarg + 1);
        luaL_argcheck(L, limit >= 0, keyarg + 1, "a limit is 0 or more");
    }
    size_t n = lua_rawlen(L, 1);
    mg_order_item_t *items = scratch(L, m, n, "weighted_order");
    int op = begin(L, m, n);
    spec_values(L, m, op, 0, 2, wkind, 1, n, items, "weighted_order");
    mg_order_item_t *keys = items + 2 * n;
    int keyed = kkind != MG_SPEC_NONE &&
                spec_values(L, m, op, 1, keyarg, kkind, 1, n, keys, "weighted_order");
    double *wcopy = NULL, *kcopy = NULL;
    if (op >= 0) { /* what the recording keeps: the weights and keys as the order used them */
        wcopy = malloc((n ? n : 1) * sizeof(double));
        kcopy = keyed ? malloc((n ? n : 1) * sizeof(double)) : NULL;
        if (!wcopy || (keyed && !kcopy)) op = -1;
        for (size_t i = 0; op >= 0 && i < n; i++) {
            wcopy[i] = items[i].key;
            if (keyed) kcopy[i] = keys[i].key;
        }
    }
    size_t out_n = n;
    if (limit >= 0 && (size_t)limit < n) {
        out_n = mg_order_weighted_first(items, n, (size_t)limit, u, seed, keyed ? keys : NULL,
                                        items + n);
    } else {
        mg_order_weighted(items, n, u, seed, items + n);
        if (keyed) mg_order_then_by(items, n, keys, items + n);
    }
    mg_order_call_t call = {.weighted = 1,
                            .list = 1,
                            .n = n,
                            .weight_kind = wkind,
                            .key_kind = kkind,
                            .weight_fn = 2,
                            .key_fn = keyarg,
                            .weights = wkind == MG_SPEC_NONE ? NULL : wcopy,
                            .keys = keyed ? kcopy : NULL,
                            .draw_id = draw_id,
                            .u = u,
                            .seed = seed,
                            .limit = (long)limit,
                            .out = items,
                            .out_n = out_n};
    end(L, m, op, &call);
    free(wcopy);
    free(kcopy);
    push_in_order(L, m, op, 1, items, out_n);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Opening the module                                                        */
/* ------------------------------------------------------------------------ */

static const luaL_Reg module_fns[] = {{"now_ms", l_now_ms},
                                      {"log", l_log},
                                      {"json_encode", l_json_encode},
                                      {"json_decode", l_json_decode},
                                      {"sha256_hex", l_sha256_hex},
                                      {"sort_by", l_sort_by},
                                      {"weighted_order", l_weighted_order},
                                      {"draw", l_draw},
                                      {NULL, NULL}};

/* The module table with its functions, each with the state (on top of the stack, popped) as
 * upvalue; leaves the table on the stack. */
static void push_module(lua_State *L)
{
    int state = lua_gettop(L);
    if (luaL_newmetatable(L, DRAW_MT)) {
        lua_createtable(L, 0, 1);
        lua_pushvalue(L, state);
        lua_pushcclosure(L, l_chance, 1);
        lua_setfield(L, -2, "chance");
        lua_setfield(L, -2, "__index");
    }
    lua_pop(L, 1);
    lua_createtable(L, 0, (int)(sizeof(module_fns) / sizeof(module_fns[0])) + 2);
    lua_pushvalue(L, state);
    luaL_setfuncs(L, module_fns, 1);
    lua_pushstring(L, MOONGATE_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushinteger(L, MG_LUA_API_VERSION);
    lua_setfield(L, -2, "api_version");
    lua_remove(L, state);
}

void mg_lmod_open(lua_State *L, mg_lmod_t *m)
{
    lua_pushlightuserdata(L, m);
    push_module(L);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");
    lua_pushvalue(L, -3);
    lua_setfield(L, -2, "moongate");
    lua_pop(L, 3);
}

void mg_lmod_free(mg_lmod_t *m)
{
    free(m->scratch);
    m->scratch = NULL;
    m->cap = 0;
}

/* ---- the standalone module ------------------------------------------------------------- */

static int standalone_gc(lua_State *L)
{
    mg_lmod_free(lua_touserdata(L, 1));
    return 0;
}

/* A registry reference to field k of the table on top of the stack when it is a table, else
 * to a new table of the module's own. */
static int sentinel_ref(lua_State *L, const char *k)
{
    if (lua_istable(L, -1)) {
        if (lua_getfield(L, -1, k) == LUA_TTABLE) return luaL_ref(L, LUA_REGISTRYINDEX);
        lua_pop(L, 1);
    }
    lua_newtable(L);
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* util.null and util.array_mt for the JSON functions: moongate.util's when it loads (busted's
 * helper puts lua/ on package.path), else tables of the module's own. */
static void standalone_sentinels(lua_State *L, mg_lmod_t *m)
{
    lua_getglobal(L, "require");
    lua_pushstring(L, "moongate.util");
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
    m->json.null_ref = sentinel_ref(L, "null");
    m->json.array_mt_ref = sentinel_ref(L, "array_mt");
    lua_pop(L, 1);
}

int luaopen_moongate(lua_State *L)
{
    mg_lmod_t *m = lua_newuserdatauv(L, sizeof(*m), 0);
    memset(m, 0, sizeof(*m));
    lua_createtable(L, 0, 1);
    lua_pushcfunction(L, standalone_gc);
    lua_setfield(L, -2, "__gc");
    lua_setmetatable(L, -2);
    int state = lua_gettop(L);
    standalone_sentinels(L, m);
    lua_settop(L, state);
    push_module(L); /* (the module's upvalues keep the state alive) */
    return 1;
}
