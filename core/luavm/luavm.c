/* luavm: Lua generations and the `moongate` module; see luavm.h.
 *
 * Every call into Lua goes through lua_pcall with a message handler that keeps
 * the "file:line:" prefix of the error, so a broken policy fails one request (or
 * one reload) with a useful message and never unwinds through C. */
#include "luavm/luavm.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "base/crypto.h"
#include "base/log.h"
#include "upstream/headers.h"
#include "luavm/order.h"
#include "luavm/plankeep.h"

#define MG_LUA_API_VERSION 1
#define JSON_MAX_DEPTH 64

static const char *const MG_VERSION = "0.1.0";

/* ------------------------------------------------------------------------ */
/* JSON <-> Lua                                                              */
/* ------------------------------------------------------------------------ */

static void push_json(lua_State *L, const mg_gen_t *g, const cJSON *v, int depth)
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
        else
            lua_pushnumber(L, d);
    } else if (cJSON_IsString(v)) {
        lua_pushstring(L, v->valuestring);
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

void mg_lua_push_json(mg_gen_t *g, const cJSON *v)
{
    push_json(g->L, g, v, 0);
}

/* Is the table at idx an array: marked with util.array_mt, or keys exactly 1..n (n>0)? */
static int table_is_array(lua_State *L, const mg_gen_t *g, int idx, size_t *len)
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

static cJSON *to_json(lua_State *L, const mg_gen_t *g, int idx, int depth, char *err,
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
        if (lua_isinteger(L, idx)) return cJSON_CreateNumber((double)lua_tointeger(L, idx));
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

cJSON *mg_lua_to_json(mg_gen_t *g, int idx, char *err, size_t errlen)
{
    return to_json(g->L, g, idx, 0, err, errlen);
}

/* ------------------------------------------------------------------------ */
/* Per-generation cache: candidate tables kept across requests, sort scratch  */
/* ------------------------------------------------------------------------ */

/* Where a kept table is in its span's list: plan entries are found by address, without
 * reading their `index` field. */
typedef struct table_pos_s {
    const void *table; /* lua_topointer(); NULL = free */
    int index;
} table_pos_t;

/* Lists the core keeps beside a span's list, one value per kept table, copied from one field
 * of each table that the core itself computes with a function of the policy when the table's
 * facts change (rather than route() computing it for every route of every request):
 *   adaptive_keys  c.adaptive_key, routing.adaptive_key(...): rule 8's key;
 *   shares         c.share, routing.share(c): rule 7's weight.
 * The span's list says list.<list_field> = the column exactly while every value in it is a
 * number, so that a policy reads the whole column with one field read. */
enum { COL_KEYS, COL_SHARES, N_COLUMNS };

static const struct {
    const char *field, *list_field;
} column_names[N_COLUMNS] = {{"adaptive_key", "adaptive_keys"}, {"share", "shares"}};

typedef struct span_column_s {
    int ref;             /* with list_ref: the Lua list, LUA_NOREF when the policy has no function */
    const void *table;   /* with ref: the list's address (lua_topointer) */
    double *values;      /* with ref: owned, the list's numbers (NaN where it holds false), so
                            that moongate.weighted_order and sort_by read it without Lua */
    size_t missing;      /* how many of its values are not numbers */
} span_column_t;

/* One model's routes array: the routes of the config, found by address. */
typedef struct route_span_s {
    const mg_route_conf_t *routes;
    size_t n;
    size_t first_slot; /* slot of routes[0] */
    int list_ref;      /* Lua list of the kept tables of routes[0..n-1], LUA_NOREF until made */
    table_pos_t *pos;  /* owned, with list_ref: open addressing, pos_mask + 1 entries */
    size_t pos_mask;
    span_column_t cols[N_COLUMNS];
    int all_usable;    /* with list_ref: what list.all_usable says */
} route_span_t;

/* The candidate table of one config route, and the facts its fields hold. */
typedef struct cand_slot_s {
    int built;            /* the table exists, at tables[slot + 1] */
    unsigned call;        /* the mg_gen_route call that last handed it out */
    int index;            /* its `index` field */
    mg_candidate_t facts; /* what its other fields say */
} cand_slot_t;

struct mg_gen_cache_s {
    int routes_ready;         /* spans and slots built (on the first routing call) */
    route_span_t *spans;      /* owned; one per model */
    size_t n_spans, last_span;
    cand_slot_t *slots;       /* owned; one per route of every model */
    size_t n_slots;
    int tables_ref;           /* Lua array of the kept candidate tables, by slot */
    unsigned calls;           /* mg_gen_route calls so far */
    const route_span_t *call_span; /* during an mg_gen_route call: the span whose kept list
                                      route() got, or NULL */
    mg_order_item_t *order;   /* owned; 3 x order_cap items: moongate.sort_by scratch */
    size_t order_cap;
};

/* The generation's cache, made on first use; NULL when out of memory. */
static struct mg_gen_cache_s *gen_cache(mg_gen_t *g)
{
    if (!g->cache && (g->cache = calloc(1, sizeof(*g->cache)))) g->cache->tables_ref = LUA_NOREF;
    return g->cache;
}

static void gen_cache_free(struct mg_gen_cache_s *k)
{
    if (!k) return;
    for (size_t i = 0; i < k->n_spans; i++) {
        free(k->spans[i].pos);
        for (int col = 0; col < N_COLUMNS; col++) free(k->spans[i].cols[col].values);
    }
    free(k->spans);
    free(k->slots);
    free(k->order);
    free(k);
}

/* Room for 3 x n order items: the items, as many for the merge, as many for a second key
 * (kept for the next call); NULL when out of memory. */
static mg_order_item_t *order_scratch(mg_gen_t *g, size_t n)
{
    struct mg_gen_cache_s *k = gen_cache(g);
    if (!k) return NULL;
    if (n > k->order_cap) {
        size_t cap = n > 2 * k->order_cap ? n : 2 * k->order_cap;
        mg_order_item_t *items = realloc(k->order, 3 * cap * sizeof(*items));
        if (!items) return NULL;
        k->order = items;
        k->order_cap = cap;
    }
    return k->order;
}

/* ------------------------------------------------------------------------ */
/* The `moongate` module                                                     */
/* ------------------------------------------------------------------------ */

static mg_gen_t *gen_of(lua_State *L)
{
    void *ud = NULL;
    lua_getallocf(L, &ud);
    return ud;
}

static int l_now_ms(lua_State *L)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    lua_pushinteger(L, (lua_Integer)tv.tv_sec * 1000 + tv.tv_usec / 1000);
    return 1;
}

static int l_log(lua_State *L)
{
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
    cJSON *j = to_json(L, gen_of(L), 1, 0, err, sizeof(err));
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
    push_json(L, gen_of(L), j, 0);
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

/* The n numbers of the Lua list at t (t = 0: all 1) as order items (key, pos = i + 1) in
 * items; raises a Lua error for a value that is not a number. */
/* The numbers of the list at idx when it is a column of the span whose list the running
 * route() got (adaptive_keys, shares) and holds only numbers; NULL otherwise. */
static const double *span_column_values(lua_State *L, int idx, size_t n)
{
    const struct mg_gen_cache_s *k = gen_of(L)->cache;
    const route_span_t *sp = k ? k->call_span : NULL;
    if (!sp || sp->n != n) return NULL;
    const void *t = lua_topointer(L, idx);
    for (int col = 0; col < N_COLUMNS; col++)
        if (sp->cols[col].ref != LUA_NOREF && sp->cols[col].table == t &&
            sp->cols[col].missing == 0)
            return sp->cols[col].values;
    return NULL;
}

static void read_keys_into(lua_State *L, int t, size_t n, const char *fn, mg_order_item_t *items)
{
    const double *known = t ? span_column_values(L, t, n) : NULL;
    if (known) {
        for (size_t i = 0; i < n; i++) items[i] = (mg_order_item_t){.key = known[i], .pos = (int)i + 1};
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int isnum = 1;
        if (t) {
            lua_rawgeti(L, t, (lua_Integer)i + 1);
            items[i].key = lua_tonumberx(L, -1, &isnum);
            lua_pop(L, 1);
        } else {
            items[i].key = 1;
        }
        items[i].pos = (int)i + 1;
        if (!isnum) luaL_error(L, "%s: key %d is not a number", fn, (int)i + 1);
    }
}

/* The same into the scratch (see order_scratch). */
static mg_order_item_t *read_order_keys(lua_State *L, int t, size_t n, const char *fn)
{
    mg_order_item_t *items = order_scratch(gen_of(L), n ? n : 1);
    if (!items) luaL_error(L, "%s: out of memory", fn);
    read_keys_into(L, t, n, fn, items);
    return items;
}

/* Push a new list of the values of the list at idx, in the order of items (with room for
 * one field: a plan's `unmarked`). */
static void push_in_order(lua_State *L, int idx, const mg_order_item_t *items, size_t n)
{
    lua_createtable(L, (int)n, 1);
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, idx, items[i].pos);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

/* moongate.sort_by(list, keys): a new list of list's values by ascending keys[i], equal
 * keys in list order (see order.h; lua/README.md). */
static int l_sort_by(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    size_t n = lua_rawlen(L, 1);
    mg_order_item_t *items = read_order_keys(L, 2, n, "sort_by");
    mg_order_sort(items, n, items + n);
    push_in_order(L, 1, items, n);
    return 1;
}

/* moongate.weighted_order(list, weights, u, seed[, keys[, limit]]): a new list of list's
 * values in a weighted random order without replacement; weights nil = all 1; with keys, by
 * ascending keys[i] first, the weighted order among equal keys; with limit, only the first
 * `limit` values of that order (see order.h). */
static int l_weighted_order(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    int weighted = !lua_isnoneornil(L, 2);
    if (weighted) luaL_checktype(L, 2, LUA_TTABLE);
    double u = luaL_checknumber(L, 3);
    uint64_t seed = (uint64_t)luaL_checkinteger(L, 4);
    int keyed = !lua_isnoneornil(L, 5);
    if (keyed) luaL_checktype(L, 5, LUA_TTABLE);
    lua_Integer limit = -1; /* none */
    if (!lua_isnoneornil(L, 6)) {
        limit = luaL_checkinteger(L, 6);
        luaL_argcheck(L, limit >= 0, 6, "a limit is 0 or more");
    }
    size_t n = lua_rawlen(L, 1);
    mg_order_item_t *items = read_order_keys(L, weighted ? 2 : 0, n, "weighted_order");
    mg_order_item_t *keys = keyed ? items + 2 * n : NULL;
    if (keyed) read_keys_into(L, 5, n, "weighted_order", keys);
    if (limit >= 0 && (size_t)limit < n) {
        n = mg_order_weighted_first(items, n, (size_t)limit, u, seed, keys, items + n);
    } else {
        mg_order_weighted(items, n, u, seed, items + n);
        if (keyed) mg_order_then_by(items, n, keys, items + n);
    }
    push_in_order(L, 1, items, n);
    return 1;
}

static int open_moongate(lua_State *L)
{
    static const luaL_Reg fns[] = {{"now_ms", l_now_ms},
                                   {"log", l_log},
                                   {"json_encode", l_json_encode},
                                   {"json_decode", l_json_decode},
                                   {"sha256_hex", l_sha256_hex},
                                   {"sort_by", l_sort_by},
                                   {"weighted_order", l_weighted_order},
                                   {NULL, NULL}};
    luaL_newlib(L, fns);
    lua_pushstring(L, MG_VERSION);
    lua_setfield(L, -2, "version");
    lua_pushinteger(L, MG_LUA_API_VERSION);
    lua_setfield(L, -2, "api_version");
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Calling Lua safely                                                        */
/* ------------------------------------------------------------------------ */

static int msg_handler(lua_State *L)
{
    if (!lua_isstring(L, 1)) {
        lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    return 1;
}

/* pcall with the handler; on error copies the message into err and pops it. */
static int pcall(lua_State *L, int nargs, int nres, char *err, size_t errlen)
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

/* Push module[ref][name]; returns its Lua type. */
static int push_field(lua_State *L, int ref, const char *name)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    int t = lua_getfield(L, -1, name);
    lua_remove(L, -2);
    return t;
}

/* ------------------------------------------------------------------------ */
/* Loading a generation                                                      */
/* ------------------------------------------------------------------------ */

/* The module table at ref says who it is and which API it was written for: name = want
 * (the file's own name: "routing", "cooldown", the adapter's name) and version =
 * MG_LUA_API_VERSION. Anything else fails the load, naming the file and the fix. */
static int check_module_id(lua_State *L, int ref, const char *path, const char *want, char *err,
                           size_t errlen)
{
    int rc = -1;
    int t = push_field(L, ref, "name");
    if (t != LUA_TSTRING)
        snprintf(err, errlen, "%s: the module table needs name = \"%s\"", path, want);
    else if (strcmp(lua_tostring(L, -1), want) != 0)
        snprintf(err, errlen, "%s: name = \"%s\", but this file is \"%s\" (name = \"%s\")", path,
                 lua_tostring(L, -1), want, want);
    else
        rc = 0;
    lua_pop(L, 1);
    if (rc != 0) return -1;
    push_field(L, ref, "version");
    int isint = 0;
    lua_Integer v = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
    if (!isint || v != MG_LUA_API_VERSION) {
        if (lua_isnil(L, -1)) {
            snprintf(err, errlen, "%s: the module table needs version = %d (the API version it is "
                     "written for)", path, MG_LUA_API_VERSION);
        } else {
            int vt = lua_type(L, -1); /* (lua_tostring only where no metamethod can run) */
            const char *shown = vt == LUA_TNUMBER || vt == LUA_TSTRING ? lua_tostring(L, -1)
                                                                      : luaL_typename(L, -1);
            const char *q = vt == LUA_TSTRING ? "\"" : "";
            snprintf(err, errlen, "%s: version = %s%s%s, but this gateway speaks API version %d "
                     "(the number; lua/README.md)", path, q, shown, q, MG_LUA_API_VERSION);
        }
        lua_pop(L, 1);
        return -1;
    }
    lua_pop(L, 1);
    return 0;
}

static void *gen_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

/* Run a file and keep the table it returns in the registry. */
static int load_module_file(lua_State *L, const char *path, int *ref, char *err, size_t errlen)
{
    if (luaL_loadfile(L, path) != LUA_OK) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return -1;
    }
    if (pcall(L, 0, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: the file must return a module table", path);
        return -1;
    }
    *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* Field setters for the table on top of the stack. */
static void set_int(lua_State *L, const char *k, long long v)
{
    lua_pushinteger(L, v);
    lua_setfield(L, -2, k);
}

static void set_num(lua_State *L, const char *k, double v)
{
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

static void set_nil(lua_State *L, const char *k)
{
    lua_pushnil(L);
    lua_setfield(L, -2, k);
}

static void set_bool(lua_State *L, const char *k, int v)
{
    lua_pushboolean(L, v);
    lua_setfield(L, -2, k);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    lua_pushstring(L, v);
    lua_setfield(L, -2, k);
}

static void memo_free(struct mg_encode_memo_s *memo);

static void push_provider(lua_State *L, const mg_provider_conf_t *p)
{
    lua_createtable(L, 0, 10);
    set_str(L, "id", p->id);
    set_str(L, "adapter", p->adapter);
    set_str(L, "base_url", p->base_url);
    if (p->api_key) set_str(L, "api_key", p->api_key);
    set_str(L, "pool", p->pool);
    set_int(L, "rpm_limit", p->rpm_limit);
    set_int(L, "tpm_limit", p->tpm_limit);
    set_num(L, "weight", p->weight);
    set_bool(L, "local", p->local);
}

static int load_adapter(mg_gen_t *g, const char *name, mg_adapter_t *a, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.lua", g->cfg->adapters_dir, name);
    a->name = strdup(name);
    if (!a->name) return -1;
    if (load_module_file(L, path, &a->ref, err, errlen) != 0) return -1;
    if (push_field(L, a->ref, "encode") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: adapter has no encode(req, route) function", path);
        return -1;
    }
    lua_pop(L, 1);
    push_field(L, a->ref, "passthrough");
    a->passthrough = lua_toboolean(L, -1);
    lua_pop(L, 1);
    push_field(L, a->ref, "encode_per_route");
    a->encode_per_route = lua_toboolean(L, -1);
    lua_pop(L, 1);
    push_field(L, a->ref, "probe_path");
    a->probe_path = strdup(lua_isstring(L, -1) ? lua_tostring(L, -1) : "/models");
    lua_pop(L, 1);
    if (!a->probe_path) return -1;
    if (!a->passthrough) {
        const char *need[] = {"decode", "decode_event"};
        for (int i = 0; i < 2; i++) {
            if (push_field(L, a->ref, need[i]) != LUA_TFUNCTION) {
                lua_pop(L, 1);
                snprintf(err, errlen, "%s: a translating adapter (passthrough ~= true) needs %s()",
                         path, need[i]);
                return -1;
            }
            lua_pop(L, 1);
        }
    }
    return check_module_id(L, a->ref, path, name, err, errlen);
}

/* adapter.check(provider) for every provider that uses the adapter. */
static int check_providers(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    for (size_t i = 0; i < g->cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &g->cfg->providers[i];
        mg_adapter_t *a = &g->adapters[g->provider_adapter[i]];
        if (push_field(L, a->ref, "check") != LUA_TFUNCTION) {
            lua_pop(L, 1);
            continue;
        }
        push_provider(L, p);
        char lerr[512];
        if (pcall(L, 1, 1, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s:%d: provider '%s': %s", g->cfg->path, p->line, p->id, lerr);
            return -1;
        }
        if (lua_isstring(L, -1)) {
            snprintf(err, errlen, "%s:%d: provider '%s': %s", g->cfg->path, p->line, p->id,
                     lua_tostring(L, -1));
            lua_pop(L, 1);
            return -1;
        }
        lua_pop(L, 1);
    }
    return 0;
}

static int load_adapters(mg_gen_t *g, char *err, size_t errlen)
{
    size_t np = g->cfg->n_providers;
    g->adapters = calloc(np ? np : 1, sizeof(*g->adapters));
    g->provider_adapter = calloc(np ? np : 1, sizeof(int));
    if (!g->adapters || !g->provider_adapter) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < np; i++) {
        const char *name = g->cfg->providers[i].adapter;
        size_t k = 0;
        while (k < g->n_adapters && strcmp(g->adapters[k].name, name) != 0) k++;
        if (k == g->n_adapters) {
            if (load_adapter(g, name, &g->adapters[k], err, errlen) != 0) {
                g->n_adapters++; /* so free releases the name */
                return -1;
            }
            g->n_adapters++;
        }
        g->provider_adapter[i] = (int)k;
    }
    return check_providers(g, err, errlen);
}

/* policies/cooldown.lua is optional: without it a 429 cools for the default curve. */
static int load_cooldown_policy(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/cooldown.lua", g->cfg->policies_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    fclose(f);
    if (load_module_file(L, path, &g->cooldown_ref, err, errlen) != 0) return -1;
    if (push_field(L, g->cooldown_ref, "on_response") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no on_response(provider, status, headers, state)",
                 path);
        return -1;
    }
    lua_pop(L, 1);
    if (check_module_id(L, g->cooldown_ref, path, "cooldown", err, errlen) != 0) return -1;
    if (push_field(L, g->cooldown_ref, "selftest") == LUA_TFUNCTION) {
        char lerr[512];
        if (pcall(L, 0, 0, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s: selftest failed: %s", path, lerr);
            return -1;
        }
    } else {
        lua_pop(L, 1);
    }
    return 0;
}

static int load_policies(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    char path[1024];
    snprintf(path, sizeof(path), "%s/routing.lua", g->cfg->policies_dir);
    if (load_module_file(L, path, &g->routing_ref, err, errlen) != 0) return -1;
    if (push_field(L, g->routing_ref, "route") != LUA_TFUNCTION) {
        lua_pop(L, 1);
        snprintf(err, errlen, "%s: policy has no route(req, candidates) function", path);
        return -1;
    }
    lua_pop(L, 1);
    if (check_module_id(L, g->routing_ref, path, "routing", err, errlen) != 0) return -1;
    /* optional: rule 8's key and rule 7's share of one route, which the core keeps in the
       candidate tables */
    if (push_field(L, g->routing_ref, "adaptive_key") == LUA_TFUNCTION)
        g->adaptive_key_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    else
        lua_pop(L, 1);
    if (push_field(L, g->routing_ref, "share") == LUA_TFUNCTION)
        g->share_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    else
        lua_pop(L, 1);
    if (push_field(L, g->routing_ref, "selftest") == LUA_TFUNCTION) {
        char lerr[512];
        if (pcall(L, 0, 0, lerr, sizeof(lerr)) != 0) {
            snprintf(err, errlen, "%s: selftest failed: %s", path, lerr);
            return -1;
        }
    } else {
        lua_pop(L, 1);
    }
    return load_cooldown_policy(g, err, errlen);
}

static int load_library(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    luaL_openlibs(L);
    /* package.path: the moongate Lua library first, so policies can require it */
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/?.lua;%s/?/init.lua", g->cfg->lua_dir, g->cfg->lua_dir);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    luaL_requiref(L, "moongate", open_moongate, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "require");
    lua_pushstring(L, "moongate.util");
    int top = lua_gettop(L) - 2;
    if (pcall(L, 1, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1) || lua_getfield(L, -1, "null") != LUA_TTABLE ||
        lua_getfield(L, -2, "array_mt") != LUA_TTABLE) {
        lua_settop(L, top);
        snprintf(err, errlen, "%s/moongate/util.lua: must define util.null and util.array_mt",
                 g->cfg->lua_dir);
        return -1;
    }
    g->array_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    g->null_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);
    return 0;
}

static int load_candidate_maker(mg_gen_t *g, char *err, size_t errlen);
static int load_req_maker(mg_gen_t *g, char *err, size_t errlen);

int mg_gen_load(const char *config_path, unsigned id, mg_gen_t **out, char *err, size_t errlen)
{
    return mg_gen_load_with(config_path, NULL, NULL, id, out, err, errlen);
}

int mg_gen_load_with(const char *config_path, mg_config_extend_fn extend, void *ud, unsigned id,
                     mg_gen_t **out, char *err, size_t errlen)
{
    *out = NULL;
    mg_gen_t *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    g->id = id;
    g->refs = 1;
    g->routing_ref = g->cooldown_ref = g->null_ref = g->array_mt_ref = LUA_NOREF;
    g->make_candidate_ref = g->adaptive_key_ref = g->share_ref = LUA_NOREF;
    if (mg_config_load(config_path, &g->cfg, err, errlen) != 0 ||
        (extend && extend(g->cfg, ud, err, errlen) != 0)) {
        mg_gen_unref(g);
        return -1;
    }
    mg_config_link_routes(g->cfg); /* every provider and model is in: the routes' hints */
    g->L = lua_newstate(gen_alloc, g);
    if (!g->L) {
        snprintf(err, errlen, "cannot create a Lua state");
        mg_gen_unref(g);
        return -1;
    }
    /* request-scoped tables die young: generational collection suits them */
    lua_gc(g->L, LUA_GCGEN, MG_GC_AUTO_PCT, MG_GC_MAJOR_PCT);
    if (load_library(g, err, errlen) != 0 || load_candidate_maker(g, err, errlen) != 0 ||
        load_req_maker(g, err, errlen) != 0 ||
        load_adapters(g, err, errlen) != 0 || load_policies(g, err, errlen) != 0) {
        mg_gen_unref(g);
        return -1;
    }
    g->gc_base = mg_gen_lua_bytes(g);
    *out = g;
    return 0;
}

size_t mg_gen_lua_bytes(const mg_gen_t *g)
{
    return (size_t)lua_gc(g->L, LUA_GCCOUNT) * 1024 + (size_t)lua_gc(g->L, LUA_GCCOUNTB);
}

int mg_gen_collect_between(mg_gen_t *g, int idle)
{
    size_t now = mg_gen_lua_bytes(g);
    if (now < g->gc_base) g->gc_base = now; /* the automatic one ran */
    size_t pct = idle ? MG_GC_IDLE_PCT : MG_GC_BUSY_PCT;
    if ((now - g->gc_base) * 100 < g->gc_base * pct) return 0;
    /* A step with a debt of the whole heap is due at once; Lua then picks a young or a full
     * collection exactly as its automatic collector would. */
    lua_gc(g->L, LUA_GCSTEP, (int)(now / 1024) + 1);
    g->gc_base = mg_gen_lua_bytes(g);
    return 1;
}

void mg_gen_ref(mg_gen_t *g)
{
    g->refs++;
}

void mg_gen_unref(mg_gen_t *g)
{
    if (!g || --g->refs > 0) return;
    if (g->L) lua_close(g->L);
    gen_cache_free(g->cache);
    mg_plankeep_free(g->plans);
    for (size_t i = 0; i < g->n_adapters; i++) {
        free(g->adapters[i].name);
        free(g->adapters[i].probe_path);
        memo_free(g->adapters[i].memo);
    }
    free(g->adapters);
    free(g->provider_adapter);
    mg_config_free(g->cfg);
    free(g);
}

/* ------------------------------------------------------------------------ */
/* Per-request calls                                                         */
/* ------------------------------------------------------------------------ */

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
    "  random = true, attempt = true, plan_limit = true, body = true }\n"
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
static int load_req_maker(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    if (luaL_loadbuffer(L, req_src, sizeof(req_src) - 1, "=request") != LUA_OK ||
        pcall(L, 0, 3, err, errlen) != 0)
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
    push_json(L, g, body, 0);
    lua_setfield(L, -2, "body");
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

/* Candidate tables are built by a Lua table constructor: its keys are constants of the
 * compiled chunk, so a candidate costs one call and one pre-sized table instead of
 * twenty-five lua_setfield calls that each look their key up again. */
static const char make_candidate_src[] =
    "return function(index, provider, model, pool, loc, smaller, priority, weight, available,\n"
    "  cooling, cooldown_remaining_ms, consecutive_429, observing, rpm_limit, rpm_used,\n"
    "  tpm_limit, tpm_used, headroom, in_flight, health, breaker, route_breaker, avail_samples,\n"
    "  ttft_samples, success_rate, ttft_ms, load, adaptive_key)\n"
    "  return { index = index, provider = provider, model = model, pool = pool, ['local'] = loc,\n"
    "    smaller = smaller, priority = priority, weight = weight, available = available,\n"
    "    cooling = cooling, cooldown_remaining_ms = cooldown_remaining_ms,\n"
    "    consecutive_429 = consecutive_429, observing = observing, rpm_limit = rpm_limit,\n"
    "    rpm_used = rpm_used, tpm_limit = tpm_limit, tpm_used = tpm_used, headroom = headroom,\n"
    "    in_flight = in_flight, health = health, breaker = breaker,\n"
    "    route_breaker = route_breaker,\n"
    "    avail_samples = avail_samples, ttft_samples = ttft_samples,\n"
    "    success_rate = success_rate, ttft_ms = ttft_ms, load = load,\n"
    "    adaptive_key = adaptive_key }\n"
    "end\n";

static int load_candidate_maker(mg_gen_t *g, char *err, size_t errlen)
{
    lua_State *L = g->L;
    if (luaL_loadbuffer(L, make_candidate_src, sizeof(make_candidate_src) - 1, "=candidate") !=
            LUA_OK ||
        pcall(L, 0, 1, err, errlen) != 0)
        return -1;
    g->make_candidate_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 0;
}

/* c.load: what the engine reports, or nil. */
static void push_load(lua_State *L, const mg_candidate_t *c)
{
    if (!c->load_known) {
        lua_pushnil(L);
        return;
    }
    lua_createtable(L, 0, 3);
    set_int(L, "running", c->load_running);
    set_int(L, "waiting", c->load_waiting);
    if (c->load_kv_cache >= 0) set_num(L, "kv_cache", c->load_kv_cache);
}

/* A number that reads as nil when negative (no samples). */
static void push_opt_num(lua_State *L, double v)
{
    if (v >= 0) lua_pushnumber(L, v);
    else lua_pushnil(L);
}

/* c.adaptive_key: routing.adaptive_key(success_rate, avail_samples, ttft_ms, ttft_samples),
 * rule 8's key of the route, computed here when those facts change rather than by route()
 * for every route of every request (in steady state one route's samples move per request).
 * A number, false for the policy's nil (too few samples), or nil when the policy has no
 * adaptive_key or it failed or returned something else: route() then computes the key
 * itself, and an error shows there, as any error of the policy. */
static void push_adaptive_key(lua_State *L, const mg_gen_t *g, const mg_candidate_t *c)
{
    if (g->adaptive_key_ref == LUA_NOREF) {
        lua_pushnil(L);
        return;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->adaptive_key_ref);
    push_opt_num(L, c->success_rate);
    lua_pushinteger(L, c->avail_samples);
    push_opt_num(L, c->ttft_ms);
    lua_pushinteger(L, c->ttft_samples);
    if (lua_pcall(L, 4, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        lua_pushnil(L);
    } else if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 0);
    } else if (lua_type(L, -1) != LUA_TNUMBER) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
}

/* c.share of the candidate table on top of the stack: routing.share(c), rule 7's weight of
 * the route, rewritten when it changed. Called when the table was made and when its headroom
 * or load changed: by contract (lua/README.md) share depends only on those and on the
 * route's config fields, which never change within a generation. A number, or nil when the
 * policy has no share or it failed or returned something else (route() then computes it
 * itself, and an error shows there). Returns whether the field changed. */
static int refresh_share(lua_State *L, const mg_gen_t *g)
{
    if (g->share_ref == LUA_NOREF) return 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->share_ref);
    lua_pushvalue(L, -2);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK || lua_type(L, -1) != LUA_TNUMBER) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
    lua_getfield(L, -2, "share");
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 1);
    if (same) {
        lua_pop(L, 1);
        return 0;
    }
    lua_setfield(L, -2, "share");
    return 1;
}

static void push_candidate(lua_State *L, const mg_gen_t *g, int index, const mg_candidate_t *c)
{
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->make_candidate_ref);
    lua_pushinteger(L, index);
    lua_pushstring(L, c->provider->id);
    lua_pushstring(L, c->route->model);
    lua_pushstring(L, c->provider->pool);
    lua_pushboolean(L, c->provider->local);
    lua_pushboolean(L, c->route->smaller);
    lua_pushinteger(L, c->route->priority);
    lua_pushnumber(L, c->provider->weight);
    lua_pushboolean(L, c->available);
    lua_pushboolean(L, c->cooling);
    lua_pushinteger(L, c->cooldown_remaining_ms);
    lua_pushinteger(L, c->consecutive_429);
    lua_pushboolean(L, c->observing);
    lua_pushinteger(L, c->rpm_limit);
    lua_pushinteger(L, c->rpm_used);
    lua_pushinteger(L, c->tpm_limit);
    lua_pushinteger(L, c->tpm_used);
    lua_pushnumber(L, c->headroom);
    lua_pushinteger(L, c->in_flight);
    lua_pushstring(L, c->health);
    lua_pushstring(L, c->breaker);
    lua_pushstring(L, c->route_breaker);
    lua_pushinteger(L, c->avail_samples);
    lua_pushinteger(L, c->ttft_samples);
    push_opt_num(L, c->success_rate);
    push_opt_num(L, c->ttft_ms);
    push_load(L, c);
    push_adaptive_key(L, g, c);
    lua_call(L, 28, 1); /* the constructor cannot fail but for memory, as lua_createtable */
    refresh_share(L, g);
}

static const char *degraded_name(const char *s)
{
    static const char *const names[] = {"fallback", "emergency", "smaller", "cloud"};
    if (!s) return NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i]) == 0) return names[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Candidate tables kept across requests                                     */
/* ------------------------------------------------------------------------ */

/* Building every candidate table afresh was most of the cost of a routing decision (a
 * 25-field table per route per request). Each route of the config keeps one table for the
 * generation's life instead; a call hands out the same table and rewrites only the fields
 * whose facts changed since (usually none, or in_flight, rpm_used and headroom of a few).
 * Policies treat candidates as read-only but for the degraded/emergency markers of the plan
 * entries, which read_entry clears (lua/README.md has the contract). */

/* Index the config's routes by address (a model's routes are one array), and make the Lua
 * array that holds their tables. Runs once: on failure nothing is cached. */
static void cache_routes(mg_gen_t *g, struct mg_gen_cache_s *k)
{
    const mg_config_t *cfg = g->cfg;
    size_t total = 0;
    k->routes_ready = 1;
    for (size_t m = 0; m < cfg->n_models; m++) total += cfg->models[m].n_routes;
    k->spans = calloc(cfg->n_models ? cfg->n_models : 1, sizeof(*k->spans));
    k->slots = calloc(total ? total : 1, sizeof(*k->slots));
    if (!k->spans || !k->slots) {
        free(k->spans);
        free(k->slots);
        k->spans = NULL;
        k->slots = NULL;
        return;
    }
    for (size_t m = 0, first = 0; m < cfg->n_models; m++) {
        k->spans[m] = (route_span_t){.routes = cfg->models[m].routes,
                                     .n = cfg->models[m].n_routes,
                                     .first_slot = first,
                                     .list_ref = LUA_NOREF,
                                     .cols = {{.ref = LUA_NOREF}, {.ref = LUA_NOREF}}};
        first += cfg->models[m].n_routes;
    }
    k->n_spans = cfg->n_models;
    k->n_slots = total;
    lua_createtable(g->L, (int)total, 0);
    k->tables_ref = luaL_ref(g->L, LUA_REGISTRYINDEX);
}

/* The slot of config route r, or -1 (a route made up for one request). The span of the
 * last hit is tried first: the candidates of one call are the routes of one model. */
static long route_slot(struct mg_gen_cache_s *k, const mg_route_conf_t *r)
{
    for (size_t i = 0; i < k->n_spans; i++) {
        size_t si = (k->last_span + i) % k->n_spans;
        const route_span_t *sp = &k->spans[si];
        uintptr_t off = (uintptr_t)r - (uintptr_t)sp->routes;
        if (sp->n > 0 && off < sp->n * sizeof(*r) && off % sizeof(*r) == 0) {
            k->last_span = si;
            return (long)(sp->first_slot + off / sizeof(*r));
        }
    }
    return -1;
}

/* Rewrite field k of the table on top of the stack when its fact changed. */
static void sync_int(lua_State *L, const char *k, long long now, long long was)
{
    if (now != was) set_int(L, k, now);
}

static void sync_bool(lua_State *L, const char *k, int now, int was)
{
    if (!now != !was) set_bool(L, k, now);
}

static void sync_num(lua_State *L, const char *k, double now, double was)
{
    if (now != was) set_num(L, k, now);
}

/* Whether a number that reads as nil when negative reads differently now. */
static int opt_num_changed(double now, double was)
{
    return now != was && (now >= 0 || was >= 0);
}

static void sync_opt_num(lua_State *L, const char *k, double now, double was)
{
    if (!opt_num_changed(now, was)) return;
    push_opt_num(L, now);
    lua_setfield(L, -2, k);
}

/* Whether the facts routing.adaptive_key reads changed. */
static int samples_changed(const mg_candidate_t *a, const mg_candidate_t *b)
{
    return a->avail_samples != b->avail_samples || a->ttft_samples != b->ttft_samples ||
           opt_num_changed(a->success_rate, b->success_rate) ||
           opt_num_changed(a->ttft_ms, b->ttft_ms);
}

static void sync_str(lua_State *L, const char *k, const char *now, const char *was)
{
    if (now == was || (now && was && strcmp(now, was) == 0)) return;
    lua_pushstring(L, now);
    lua_setfield(L, -2, k);
}

static int load_changed(const mg_candidate_t *a, const mg_candidate_t *b)
{
    if (!a->load_known && !b->load_known) return 0;
    return a->load_known != b->load_known || a->load_running != b->load_running ||
           a->load_waiting != b->load_waiting || a->load_kv_cache != b->load_kv_cache;
}

/* The runtime fields of a kept candidate table (on top of the stack) brought up to date;
 * the config fields (provider, model, pool, local, smaller, priority, weight) never change
 * within a generation. Returns which of the columns' fields (adaptive_key, share) were
 * rewritten, a bit per column. */
static unsigned refresh_candidate(lua_State *L, const mg_gen_t *g, const mg_candidate_t *c,
                             const mg_candidate_t *was)
{
    sync_bool(L, "available", c->available, was->available);
    sync_bool(L, "cooling", c->cooling, was->cooling);
    sync_int(L, "cooldown_remaining_ms", c->cooldown_remaining_ms, was->cooldown_remaining_ms);
    sync_int(L, "consecutive_429", c->consecutive_429, was->consecutive_429);
    sync_bool(L, "observing", c->observing, was->observing);
    sync_int(L, "rpm_limit", c->rpm_limit, was->rpm_limit);
    sync_int(L, "rpm_used", c->rpm_used, was->rpm_used);
    sync_int(L, "tpm_limit", c->tpm_limit, was->tpm_limit);
    sync_int(L, "tpm_used", c->tpm_used, was->tpm_used);
    sync_num(L, "headroom", c->headroom, was->headroom);
    sync_int(L, "in_flight", c->in_flight, was->in_flight);
    sync_str(L, "health", c->health, was->health);
    sync_str(L, "breaker", c->breaker, was->breaker);
    sync_str(L, "route_breaker", c->route_breaker, was->route_breaker);
    sync_int(L, "avail_samples", c->avail_samples, was->avail_samples);
    sync_int(L, "ttft_samples", c->ttft_samples, was->ttft_samples);
    sync_opt_num(L, "success_rate", c->success_rate, was->success_rate);
    sync_opt_num(L, "ttft_ms", c->ttft_ms, was->ttft_ms);
    if (load_changed(c, was)) {
        push_load(L, c);
        lua_setfield(L, -2, "load");
    }
    unsigned changed = 0;
    if (samples_changed(c, was)) {
        push_adaptive_key(L, g, c);
        lua_setfield(L, -2, "adaptive_key");
        changed |= 1u << COL_KEYS;
    }
    if ((c->headroom != was->headroom || load_changed(c, was)) && refresh_share(L, g))
        changed |= 1u << COL_SHARES;
    return changed;
}

/* The span's list (at list) says list.<list_field> = the column exactly while every value in
 * it is a number. */
static void show_span_column(lua_State *L, const route_span_t *sp, int col, int list)
{
    if (sp->cols[col].missing == 0) lua_rawgeti(L, LUA_REGISTRYINDEX, sp->cols[col].ref);
    else lua_pushnil(L);
    lua_setfield(L, list, column_names[col].list_field);
}

/* Copy the column's field of the table on top of the stack, the span's i-th, into the
 * column's Lua list (at values) and its C copy: a number, or false (NaN). Returns 1 when
 * it is a number. */
static int copy_span_value(lua_State *L, span_column_t *cl, int col, int values, size_t i)
{
    int number = lua_getfield(L, -1, column_names[col].field) == LUA_TNUMBER;
    cl->values[i] = number ? lua_tonumber(L, -1) : NAN;
    if (!number) {
        lua_pop(L, 1);
        lua_pushboolean(L, 0);
    }
    lua_rawseti(L, values, (lua_Integer)i + 1);
    return number;
}

/* The fields of the span's i-th table (on top of the stack) in `changed` (a bit per column)
 * were rewritten: the columns follow. */
static void span_values_changed(lua_State *L, route_span_t *sp, size_t i, unsigned changed)
{
    for (int col = 0; col < N_COLUMNS; col++) {
        span_column_t *cl = &sp->cols[col];
        if (!(changed & (1u << col)) || cl->ref == LUA_NOREF) continue;
        lua_rawgeti(L, LUA_REGISTRYINDEX, cl->ref);
        int values = lua_gettop(L);
        int was = lua_rawgeti(L, values, (lua_Integer)i + 1) == LUA_TNUMBER;
        lua_pop(L, 1);
        lua_pushvalue(L, values - 1); /* the table */
        int now = copy_span_value(L, cl, col, values, i);
        lua_pop(L, 2);
        size_t before = cl->missing;
        cl->missing = cl->missing + (size_t)was - (size_t)now;
        if (!before == !cl->missing) continue;
        lua_rawgeti(L, LUA_REGISTRYINDEX, sp->list_ref);
        show_span_column(L, sp, col, lua_gettop(L));
        lua_pop(L, 1);
    }
}

/* The span that holds slot. */
static route_span_t *span_of_slot(struct mg_gen_cache_s *k, long slot)
{
    for (size_t i = 0; i < k->n_spans; i++) {
        route_span_t *sp = &k->spans[i];
        if ((size_t)slot >= sp->first_slot && (size_t)slot < sp->first_slot + sp->n) return sp;
    }
    return NULL;
}

/* Drop the list of the span that holds slot (made again on a later call). */
static void forget_span_list(lua_State *L, struct mg_gen_cache_s *k, long slot)
{
    route_span_t *sp = span_of_slot(k, slot);
    if (sp) {
        luaL_unref(L, LUA_REGISTRYINDEX, sp->list_ref);
        sp->list_ref = LUA_NOREF;
        for (int col = 0; col < N_COLUMNS; col++) {
            luaL_unref(L, LUA_REGISTRYINDEX, sp->cols[col].ref);
            sp->cols[col].ref = LUA_NOREF;
            free(sp->cols[col].values);
            sp->cols[col].values = NULL;
        }
        free(sp->pos);
        sp->pos = NULL;
    }
}

static int same_facts(const mg_candidate_t *a, const mg_candidate_t *b)
{
    if (a->serial && a->serial == b->serial) return 1; /* one description, kept: facts.h */
    return a->provider == b->provider && a->available == b->available &&
           a->cooling == b->cooling && a->observing == b->observing &&
           a->consecutive_429 == b->consecutive_429 &&
           a->cooldown_remaining_ms == b->cooldown_remaining_ms &&
           a->rpm_limit == b->rpm_limit && a->rpm_used == b->rpm_used &&
           a->tpm_limit == b->tpm_limit && a->tpm_used == b->tpm_used &&
           a->headroom == b->headroom && a->in_flight == b->in_flight &&
           a->health == b->health && a->breaker == b->breaker &&
           a->route_breaker == b->route_breaker &&
           a->avail_samples == b->avail_samples && a->ttft_samples == b->ttft_samples &&
           a->success_rate == b->success_rate && a->ttft_ms == b->ttft_ms &&
           !load_changed(a, b);
}

/* Push the kept table of c's route, up to date; -1 (nothing pushed) when the route has none:
 * not a config route, or already handed out in this call (a route given twice). */
static int push_kept_candidate(lua_State *L, const mg_gen_t *g, struct mg_gen_cache_s *k,
                               int tables, int index, const mg_candidate_t *c)
{
    long slot = route_slot(k, c->route);
    if (slot < 0 || k->slots[slot].call == k->calls) return -1;
    cand_slot_t *s = &k->slots[slot];
    s->call = k->calls;
    if (s->built && s->facts.provider == c->provider) {
        lua_rawgeti(L, tables, slot + 1);
        if (s->index != index) set_int(L, "index", index);
        unsigned changed = same_facts(c, &s->facts) ? 0 : refresh_candidate(L, g, c, &s->facts);
        route_span_t *sp = changed ? span_of_slot(k, slot) : NULL; /* its columns follow */
        if (sp && sp->list_ref != LUA_NOREF)
            span_values_changed(L, sp, (size_t)slot - sp->first_slot, changed);
    } else {
        push_candidate(L, g, index, c);
        lua_pushvalue(L, -1);
        lua_rawseti(L, tables, slot + 1);
        if (s->built) forget_span_list(L, k, slot); /* it holds the old table */
        s->built = 1;
    }
    s->index = index;
    s->facts = *c;
    return 0;
}

/* The span whose routes cands are, all of them in route order, or NULL. */
static route_span_t *whole_span(struct mg_gen_cache_s *k, const mg_candidate_t *cands, int n)
{
    long slot = n > 0 ? route_slot(k, cands[0].route) : -1;
    if (slot < 0) return NULL;
    route_span_t *sp = &k->spans[k->last_span];
    if (sp->n != (size_t)n || cands[0].route != sp->routes) return NULL;
    for (int i = 1; i < n; i++)
        if (cands[i].route != sp->routes + i) return NULL;
    return sp;
}

/* Whether every candidate is usable: available and not cooling. */
static int all_usable(const mg_candidate_t *cands, int n)
{
    for (int i = 0; i < n; i++)
        if (!cands[i].available || cands[i].cooling) return 0;
    return 1;
}

/* The span's list (on top of the stack) says all_usable = true exactly while every
 * candidate is usable, so that a policy need not look at each one to find out. */
static void show_all_usable(lua_State *L, route_span_t *sp, int usable)
{
    sp->all_usable = usable;
    set_bool(L, "all_usable", usable);
}

/* The usual call: every route of one model, in order, each with its kept table. The span's
 * list is handed out as it is (a policy treats it as read-only) and only the tables whose
 * facts changed are touched (no call stamps: the routes of a span are distinct). 0 = the
 * list is pushed; -1 = nothing pushed (the list is not made yet, or a table must be made
 * afresh): take the slow path. */
static int push_span_list(lua_State *L, const mg_gen_t *g, route_span_t *sp,
                          const mg_candidate_t *cands, int n)
{
    struct mg_gen_cache_s *k = g->cache;
    if (sp->list_ref == LUA_NOREF) return -1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, sp->list_ref);
    int usable = 1;
    for (int i = 0; i < n; i++) {
        cand_slot_t *s = &k->slots[sp->first_slot + (size_t)i];
        const mg_candidate_t *c = &cands[i];
        if (!s->built || s->facts.provider != c->provider) {
            lua_pop(L, 1);
            return -1;
        }
        usable &= c->available && !c->cooling;
        if (s->index == i + 1 && same_facts(c, &s->facts)) continue;
        lua_rawgeti(L, -1, i + 1);
        if (s->index != i + 1) set_int(L, "index", i + 1);
        unsigned changed = refresh_candidate(L, g, c, &s->facts);
        if (changed) span_values_changed(L, sp, (size_t)i, changed);
        lua_pop(L, 1);
        s->index = i + 1;
        s->facts = *c;
    }
    if (usable != sp->all_usable) show_all_usable(L, sp, usable);
    return 0;
}

static size_t table_hash(const void *t, size_t mask)
{
    return (size_t)(((uintptr_t)t >> 4) * 0x9E3779B97F4A7C15u >> 17) & mask;
}

/* The position (from 1) of the table at address t in the span's list, or 0. */
static int span_pos(const route_span_t *sp, const void *t)
{
    if (!sp->pos || !t) return 0;
    for (size_t h = table_hash(t, sp->pos_mask);; h = (h + 1) & sp->pos_mask) {
        if (sp->pos[h].table == t) return sp->pos[h].index;
        if (!sp->pos[h].table) return 0;
    }
}

/* Make the span's columns from the tables of its list (on top of the stack), those whose
 * function the policy has. */
static void keep_span_columns(lua_State *L, const mg_gen_t *g, route_span_t *sp)
{
    const int fn_refs[N_COLUMNS] = {g->adaptive_key_ref, g->share_ref};
    int list = lua_gettop(L);
    for (int col = 0; col < N_COLUMNS; col++) {
        if (fn_refs[col] == LUA_NOREF) continue;
        span_column_t *cl = &sp->cols[col];
        cl->values = malloc((sp->n ? sp->n : 1) * sizeof(*cl->values));
        if (!cl->values) continue; /* not kept: route() reads the fields itself */
        lua_createtable(L, (int)sp->n, 0);
        cl->missing = 0;
        for (size_t i = 0; i < sp->n; i++) {
            lua_rawgeti(L, list, (lua_Integer)i + 1);
            cl->missing += !copy_span_value(L, cl, col, list + 1, i);
            lua_pop(L, 1);
        }
        cl->table = lua_topointer(L, -1);
        cl->ref = luaL_ref(L, LUA_REGISTRYINDEX);
        show_span_column(L, sp, col, list);
    }
}

/* Keep the list on top of the stack, of the candidates cands, as the span's list, with its
 * tables' positions (and columns). */
static void keep_span_list(lua_State *L, const mg_gen_t *g, route_span_t *sp,
                           const mg_candidate_t *cands)
{
    size_t size = 4;
    while (size < 2 * sp->n) size *= 2;
    sp->pos = calloc(size, sizeof(*sp->pos));
    if (!sp->pos) return; /* not kept: the slow path keeps working */
    sp->pos_mask = size - 1;
    for (size_t i = 0; i < sp->n; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        const void *t = lua_topointer(L, -1);
        lua_pop(L, 1);
        size_t h = table_hash(t, sp->pos_mask);
        while (sp->pos[h].table) h = (h + 1) & sp->pos_mask;
        sp->pos[h] = (table_pos_t){t, (int)i + 1};
    }
    keep_span_columns(L, g, sp);
    show_all_usable(L, sp, all_usable(cands, (int)sp->n));
    lua_pushvalue(L, -1);
    sp->list_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Whether every candidate has the same config fields (pool, local, smaller, priority,
 * weight): candidates.alike, so that a policy can decide the rules on those fields once for
 * the whole list. */
static int candidates_alike(const mg_candidate_t *cands, int n)
{
    for (int i = 1; i < n; i++) {
        const mg_provider_conf_t *p = cands[i].provider, *p0 = cands[0].provider;
        const mg_route_conf_t *r = cands[i].route, *r0 = cands[0].route;
        if (p != p0 && (strcmp(p->pool, p0->pool) != 0 || p->local != p0->local ||
                        p->weight != p0->weight))
            return 0;
        if (r->smaller != r0->smaller || r->priority != r0->priority) return 0;
    }
    return 1;
}

/* Push the candidates list of one call; returns the span whose kept list it is, or NULL. */
static route_span_t *push_candidates(lua_State *L, mg_gen_t *g, const mg_candidate_t *cands,
                                     int n)
{
    /* a candidate's constructor call and its adaptive_key take ~35 slots: more than the
       LUA_MINSTACK a C caller may use unchecked */
    lua_checkstack(L, 48);
    struct mg_gen_cache_s *k = gen_cache(g);
    if (k && !k->routes_ready) cache_routes(g, k);
    if (!k || k->tables_ref == LUA_NOREF) {
        lua_createtable(L, n, 1);
        for (int i = 0; i < n; i++) {
            push_candidate(L, g, i + 1, &cands[i]);
            lua_rawseti(L, -2, i + 1);
        }
        set_bool(L, "alike", candidates_alike(cands, n));
        return NULL;
    }
    k->calls++;
    route_span_t *sp = whole_span(k, cands, n);
    if (sp && push_span_list(L, g, sp, cands, n) == 0) return sp;
    lua_rawgeti(L, LUA_REGISTRYINDEX, k->tables_ref);
    int tables = lua_gettop(L);
    lua_createtable(L, n, 1);
    for (int i = 0; i < n; i++) {
        if (push_kept_candidate(L, g, k, tables, i + 1, &cands[i]) != 0)
            push_candidate(L, g, i + 1, &cands[i]);
        lua_rawseti(L, -2, i + 1);
    }
    set_bool(L, "alike", candidates_alike(cands, n));
    lua_remove(L, tables);
    if (sp && sp->list_ref == LUA_NOREF) keep_span_list(L, g, sp, cands); /* every table is kept now */
    return NULL;
}

/* Clear the markers of the table at idx: the core reads them once, so the kept table
 * starts the next call unmarked. */
static void clear_marks(lua_State *L, int idx)
{
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    lua_setfield(L, idx, "degraded");
    lua_pushnil(L);
    lua_setfield(L, idx, "emergency");
}

/* After a failed route(): it may have marked some candidates before it failed. */
static void clear_all_marks(lua_State *L, int list)
{
    lua_Integer len = (lua_Integer)lua_rawlen(L, list);
    for (lua_Integer i = 1; i <= len; i++) {
        if (lua_rawgeti(L, list, i) == LUA_TTABLE) clear_marks(L, -1);
        lua_pop(L, 1);
    }
}

/* Read one plan entry (a candidate table or {index = i}) at the top of the stack, clearing
 * the table's markers. */
static int read_entry(lua_State *L, int n, mg_plan_entry_t *e)
{
    lua_Integer idx = 0;
    e->degraded = NULL;
    e->emergency = 0;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "index");
        idx = lua_tointeger(L, -1);
        int marked = lua_getfield(L, -2, "degraded") != LUA_TNIL;
        e->degraded = degraded_name(lua_tostring(L, -1));
        marked |= lua_getfield(L, -3, "emergency") != LUA_TNIL;
        e->emergency = lua_toboolean(L, -1);
        lua_pop(L, 3);
        if (marked) clear_marks(L, -1);
    } else {
        idx = lua_tointeger(L, -1); /* a plain index is accepted too */
    }
    if (idx < 1 || idx > n) return -1;
    e->index = (int)idx - 1;
    return 0;
}

/* Read the entry at the top of the stack. A table of the span's list needs no field read
 * when the plan says it is unmarked: its position is its index. */
static int read_plan_entry(lua_State *L, int n, const route_span_t *sp, int unmarked,
                           mg_plan_entry_t *e)
{
    int pos = unmarked && sp ? span_pos(sp, lua_topointer(L, -1)) : 0;
    if (pos == 0) return read_entry(L, n, e);
    *e = (mg_plan_entry_t){pos - 1, NULL, 0};
    return 0;
}

/* Read the list plan at the top of the stack into plan: entries in range, each once.
 * Every entry is read, also past n, so that every marked table gets cleared. sp: the span
 * whose kept list the candidates were (or NULL). */
static int read_plan(lua_State *L, int n, const route_span_t *sp, mg_plan_t *plan)
{
    unsigned char small[256];
    unsigned char *seen = n <= (int)sizeof(small) ? small : calloc((size_t)n, 1);
    if (!seen) return -1;
    if (seen == small) memset(small, 0, sizeof(small));
    lua_getfield(L, -1, "unmarked");
    int unmarked = lua_toboolean(L, -1);
    lua_pop(L, 1);
    lua_Integer len = (lua_Integer)lua_rawlen(L, -1);
    for (lua_Integer i = 1; i <= len; i++) {
        lua_rawgeti(L, -1, i);
        mg_plan_entry_t e;
        int ok = read_plan_entry(L, n, sp, unmarked, &e) == 0;
        lua_pop(L, 1);
        if (!ok || seen[e.index] || plan->n >= n) continue;
        seen[e.index] = 1;
        plan->entries[plan->n++] = e;
    }
    if (seen != small) free(seen);
    if (plan->n > 0) plan->wait_ms = 0;
    return 0;
}

static int route_call(mg_gen_t *g, int req_ref, int attempt, const mg_candidate_t *cands, int n,
                      mg_plan_t *plan, char *err, size_t errlen);

int mg_gen_route(mg_gen_t *g, const mg_lua_req_t *info, int *req_ref, int attempt,
                 const mg_candidate_t *cands, int n, mg_plan_t *plan, char *err, size_t errlen)
{
    int keep = plan->keep && attempt == 1;
    plan->reuse = plan->kept = 0;
    if (keep && mg_plankeep_find(g->plans, info, cands, n, plan)) {
        plan->reuse = plan->kept = 1;
        return 0;
    }
    int req = mg_gen_req_table(g, info, req_ref);
    if (route_call(g, req, attempt, cands, n, plan, err, errlen) != 0) return -1;
    if (keep && plan->reuse) mg_plankeep_put(&g->plans, info, cands, n, plan);
    return 0;
}

/* routing.route(req, candidates) itself. */
static int route_call(mg_gen_t *g, int req_ref, int attempt, const mg_candidate_t *cands, int n,
                      mg_plan_t *plan, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    int list = top + 1;
    plan->n = 0;
    plan->wait_ms = 0;
    const route_span_t *sp = push_candidates(L, g, cands, n);
    push_field(L, g->routing_ref, "route");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    set_int(L, "attempt", attempt);
    if (plan->limit > 0) set_int(L, "plan_limit", plan->limit);
    else if (attempt > 1) set_nil(L, "plan_limit"); /* the request's fill cleared it */
    lua_pushvalue(L, list);
    if (g->cache) g->cache->call_span = sp;
    int failed = pcall(L, 2, 1, err, errlen) != 0;
    if (g->cache) g->cache->call_span = NULL;
    if (failed) {
        clear_all_marks(L, list);
        lua_settop(L, top);
        return -1;
    }
    if (!lua_istable(L, -1)) {
        lua_settop(L, top);
        snprintf(err, errlen, "routing.route must return a plan (a list, {wait_ms = N} or {})");
        return -1;
    }
    lua_getfield(L, -1, "wait_ms");
    if (lua_isnumber(L, -1)) {
        double w = lua_tonumber(L, -1);
        plan->wait_ms = w < 1 ? 1 : w > 3600000 ? 3600000 : (int)w;
    }
    lua_getfield(L, -2, "reuse");
    plan->reuse = lua_toboolean(L, -1) && plan->wait_ms == 0;
    lua_pop(L, 2);
    int rc = read_plan(L, n, sp, plan);
    lua_settop(L, top);
    if (rc != 0) snprintf(err, errlen, "out of memory");
    return rc;
}

/* The default curve when no cooldown policy is loaded: 30 s doubling, at most 600 s. */
static double default_backoff(int n)
{
    double s = 30;
    for (int i = 1; i < n && s < 600; i++) s *= 2;
    return s > 600 ? 600 : s;
}

/* The headers table of on_response: every pair of the block, names lower case; a name that
 * comes twice gets its values joined with ", " (as HTTP allows). */
static void push_headers(lua_State *L, const char *block, size_t len)
{
    lua_createtable(L, 0, 8);
    size_t pos = 0;
    const char *name, *value;
    while (mg_headers_next(block, len, &pos, &name, &value)) {
        if (lua_getfield(L, -1, name) == LUA_TSTRING) {
            lua_pushliteral(L, ", ");
            lua_pushstring(L, value);
            lua_concat(L, 3);
        } else {
            lua_pop(L, 1);
            lua_pushstring(L, value);
        }
        lua_setfield(L, -2, name);
    }
}

int mg_gen_cooldown(mg_gen_t *g, const mg_provider_conf_t *p, int status, const char *headers,
                    size_t headers_len, int consecutive_429, int observing, double *cooldown_s,
                    char *err, size_t errlen)
{
    *cooldown_s = 0;
    if (g->cooldown_ref == LUA_NOREF) {
        if (status == 429) {
            const char *retry_after = mg_headers_find(headers, headers_len, "retry-after");
            double ra = retry_after ? atof(retry_after) : 0;
            double b = default_backoff(consecutive_429);
            *cooldown_s = ra > b ? ra : b;
        }
        return 0;
    }
    lua_State *L = g->L;
    int top = lua_gettop(L);
    lua_checkstack(L, 8);
    push_field(L, g->cooldown_ref, "on_response");
    push_provider(L, p);
    lua_pushinteger(L, status);
    push_headers(L, headers, headers_len);
    lua_createtable(L, 0, 2);
    set_int(L, "consecutive_429", consecutive_429);
    set_bool(L, "observing", observing);
    if (pcall(L, 4, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "cooldown_s");
        double v = lua_tonumber(L, -1);
        *cooldown_s = v > 0 ? (v > 86400 ? 86400 : v) : 0;
    }
    lua_settop(L, top);
    return 0;
}

static void push_route(lua_State *L, const mg_provider_conf_t *p, const char *model)
{
    lua_createtable(L, 0, 6);
    set_str(L, "provider", p->id);
    set_str(L, "model", model);
    set_str(L, "base_url", p->base_url);
    if (p->api_key) set_str(L, "api_key", p->api_key);
    set_str(L, "pool", p->pool);
    set_bool(L, "local", p->local);
}

/* Read the headers table at the top of the stack into a curl list. */
static int read_headers(lua_State *L, struct curl_slist **list, char *err, size_t errlen)
{
    lua_pushnil(L);
    while (lua_next(L, -2)) {
        if (lua_type(L, -2) != LUA_TSTRING || !lua_isstring(L, -1)) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: headers must map names to strings");
            return -1;
        }
        const char *name = lua_tostring(L, -2);
        const char *value = lua_tostring(L, -1);
        if (strpbrk(name, "\r\n:") || strpbrk(value, "\r\n")) {
            lua_pop(L, 2);
            snprintf(err, errlen, "encode: header '%s' contains a forbidden character", name);
            return -1;
        }
        size_t len = strlen(name) + strlen(value) + 3;
        char *line = malloc(len);
        if (!line) {
            lua_pop(L, 2);
            return -1;
        }
        snprintf(line, len, "%s: %s", name, value);
        struct curl_slist *nl = curl_slist_append(*list, line);
        free(line);
        if (!nl) {
            lua_pop(L, 2);
            return -1;
        }
        *list = nl;
        lua_pop(L, 1);
    }
    return 0;
}

/* ---- encode's answers, kept for adapters that say they may be ---------------------------
 * An adapter with encode_per_route = true promises that encode(req, route) reads nothing of
 * req but endpoint and stream, so its answer is the same for every request with those on the
 * same route: the core asks once per route, endpoint and stream mode and keeps the answer for
 * the generation's life (a reload asks again). Only answers without a body are kept, and at
 * most MEMO_MAX of them per adapter (names served by a model_prefix come from clients). */
#define MEMO_MAX 64

typedef struct {
    const mg_provider_conf_t *p; /* in the generation's config */
    char *model;                 /* owned */
    char endpoint[16];
    int stream;
    char method[8];
    char *path;     /* owned */
    char **headers; /* owned: the "Name: value" lines */
    size_t n_headers;
    int ndjson;
} memo_entry_t;

/* Entries are found by provider and stream mode through an open-addressing index, not by
 * walking them: with ten providers, a walk past the other routes' entries (and past the
 * other stream mode's) touched a dozen cache lines per request. */
#define MEMO_SLOTS 128 /* a power of two, twice MEMO_MAX: a probe always meets an empty slot */

struct mg_encode_memo_s {
    memo_entry_t e[MEMO_MAX];
    size_t n;
    unsigned char slot[MEMO_SLOTS]; /* 1 + an index into e; 0 = empty */
};

static size_t memo_slot(const mg_provider_conf_t *p, int stream)
{
    uint64_t h = ((uint64_t)(uintptr_t)p << 1 | (stream != 0)) * 0x9E3779B97F4A7C15u;
    return (size_t)(h >> 57) & (MEMO_SLOTS - 1);
}

static void memo_entry_free(memo_entry_t *m)
{
    free(m->model);
    free(m->path);
    for (size_t i = 0; i < m->n_headers; i++) free(m->headers[i]);
    free(m->headers);
}

static void memo_free(struct mg_encode_memo_s *memo)
{
    if (!memo) return;
    for (size_t i = 0; i < memo->n; i++) memo_entry_free(&memo->e[i]);
    free(memo);
}

static memo_entry_t *memo_find(struct mg_encode_memo_s *memo, const mg_provider_conf_t *p,
                               const char *model, const char *endpoint, int stream)
{
    if (!memo) return NULL;
    for (size_t h = memo_slot(p, stream); memo->slot[h]; h = (h + 1) & (MEMO_SLOTS - 1)) {
        memo_entry_t *m = &memo->e[memo->slot[h] - 1];
        if (m->p == p && m->stream == stream && strcmp(m->endpoint, endpoint) == 0 &&
            strcmp(m->model, model) == 0)
            return m;
    }
    return NULL;
}

/* The kept answer as a fresh mg_encoded_t (the caller owns and frees it, as always). */
static int memo_answer(const memo_entry_t *m, mg_encoded_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    memcpy(out->method, m->method, sizeof(out->method));
    out->ndjson = m->ndjson;
    out->path = strdup(m->path);
    int ok = out->path != NULL;
    for (size_t i = 0; ok && i < m->n_headers; i++) {
        struct curl_slist *nl = curl_slist_append(out->headers, m->headers[i]);
        ok = nl != NULL;
        if (ok) out->headers = nl;
    }
    if (ok) return 0;
    mg_encoded_free(out);
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* Keep an answer (best effort: out of memory or a full memo keeps nothing). */
static void memo_put(mg_adapter_t *a, const mg_provider_conf_t *p, const char *model,
                     const char *endpoint, int stream, const mg_encoded_t *enc)
{
    if (!a->memo && !(a->memo = calloc(1, sizeof(*a->memo)))) return;
    if (a->memo->n >= MEMO_MAX) return;
    memo_entry_t *m = &a->memo->e[a->memo->n];
    memset(m, 0, sizeof(*m));
    m->p = p;
    m->stream = stream;
    m->ndjson = enc->ndjson;
    snprintf(m->endpoint, sizeof(m->endpoint), "%s", endpoint);
    memcpy(m->method, enc->method, sizeof(m->method));
    m->model = strdup(model);
    m->path = strdup(enc->path);
    size_t n = 0;
    for (const struct curl_slist *h = enc->headers; h; h = h->next) n++;
    m->headers = n ? calloc(n, sizeof(*m->headers)) : NULL;
    int ok = m->model && m->path && (!n || m->headers);
    for (const struct curl_slist *h = enc->headers; ok && h; h = h->next)
        ok = (m->headers[m->n_headers++] = strdup(h->data)) != NULL;
    if (!ok) {
        memo_entry_free(m);
        return;
    }
    size_t h = memo_slot(p, stream);
    while (a->memo->slot[h]) h = (h + 1) & (MEMO_SLOTS - 1);
    a->memo->slot[h] = (unsigned char)(++a->memo->n);
}

static int encode_call(mg_gen_t *g, int adapter, int req_ref, const mg_provider_conf_t *p,
                       const char *upstream_model, mg_encoded_t *out, char *err, size_t errlen);

/* A memo entry is keyed by the route, req.endpoint and req.stream (info's: what the
 * table's fill() writes). An endpoint too long for the key gets no memo. */
int mg_gen_encode(mg_gen_t *g, int adapter, const mg_lua_req_t *info, int *req_ref,
                  const mg_provider_conf_t *p, const char *upstream_model, mg_encoded_t *out,
                  char *err, size_t errlen)
{
    mg_adapter_t *a = &g->adapters[adapter];
    const char *endpoint = info->endpoint;
    int stream = info->stream != 0;
    int memo = a->encode_per_route && endpoint &&
               strlen(endpoint) < sizeof(a->memo->e[0].endpoint);
    const memo_entry_t *m = memo ? memo_find(a->memo, p, upstream_model, endpoint, stream) : NULL;
    if (m) return memo_answer(m, out, err, errlen);
    int rc = encode_call(g, adapter, mg_gen_req_table(g, info, req_ref), p, upstream_model, out,
                         err, errlen);
    if (rc == 0 && memo && !out->body) memo_put(a, p, upstream_model, endpoint, stream, out);
    return rc;
}

/* adapter.encode(req, route) itself. */
static int encode_call(mg_gen_t *g, int adapter, int req_ref, const mg_provider_conf_t *p,
                       const char *upstream_model, mg_encoded_t *out, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    memset(out, 0, sizeof(*out));
    push_field(L, g->adapters[adapter].ref, "encode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_route(L, p, upstream_model);
    if (pcall(L, 2, 1, err, errlen) != 0) return -1;
    if (!lua_istable(L, -1)) {
        snprintf(err, errlen, "%s.encode must return a table", g->adapters[adapter].name);
        goto fail;
    }
    lua_getfield(L, -1, "method");
    const char *method = lua_isstring(L, -1) ? lua_tostring(L, -1) : "POST";
    if (strcmp(method, "POST") != 0 && strcmp(method, "GET") != 0) {
        snprintf(err, errlen, "%s.encode: method must be POST or GET", g->adapters[adapter].name);
        goto fail;
    }
    snprintf(out->method, sizeof(out->method), "%s", method);
    lua_pop(L, 1);
    if (lua_getfield(L, -1, "path") != LUA_TSTRING) {
        snprintf(err, errlen, "%s.encode: path must be a string", g->adapters[adapter].name);
        goto fail;
    }
    out->path = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    int t = lua_getfield(L, -1, "headers");
    if (t == LUA_TTABLE && read_headers(L, &out->headers, err, errlen) != 0) goto fail;
    lua_pop(L, 1);
    t = lua_getfield(L, -1, "body");
    if (t != LUA_TNIL) {
        out->body = to_json(L, g, -1, 0, err, errlen);
        if (!out->body) goto fail;
    }
    lua_pop(L, 1);
    lua_getfield(L, -1, "stream_format");
    const char *fmt = lua_tostring(L, -1);
    out->ndjson = fmt && strcmp(fmt, "ndjson") == 0;
    lua_settop(L, top);
    if (!out->path) {
        snprintf(err, errlen, "out of memory");
        mg_encoded_free(out);
        return -1;
    }
    return 0;
fail:
    lua_settop(L, top);
    mg_encoded_free(out);
    return -1;
}

void mg_encoded_free(mg_encoded_t *e)
{
    free(e->path);
    curl_slist_free_all(e->headers);
    cJSON_Delete(e->body);
    memset(e, 0, sizeof(*e));
}

int mg_gen_decode(mg_gen_t *g, int adapter, int req_ref, const cJSON *resp, cJSON **out,
                  char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    push_field(L, g->adapters[adapter].ref, "decode");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_json(L, g, resp, 0);
    if (pcall(L, 2, 1, err, errlen) != 0) return -1;
    if (lua_istable(L, -1)) *out = to_json(L, g, -1, 0, err, errlen);
    else snprintf(err, errlen, "%s.decode must return a table", g->adapters[adapter].name);
    lua_settop(L, top);
    return *out ? 0 : -1;
}

int mg_gen_decode_event(mg_gen_t *g, int adapter, int req_ref, int state_ref, const cJSON *data,
                        cJSON **out, int *done, char *err, size_t errlen)
{
    lua_State *L = g->L;
    int top = lua_gettop(L);
    *out = NULL;
    push_field(L, g->adapters[adapter].ref, "decode_event");
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    push_json(L, g, data, 0);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    if (pcall(L, 3, 1, err, errlen) != 0) return -1;
    if (lua_isnil(L, -1)) {
        *out = cJSON_CreateArray();
    } else if (lua_istable(L, -1)) {
        /* always an array of chunks, even if the adapter returned a single empty table */
        size_t len = lua_rawlen(L, -1);
        *out = cJSON_CreateArray();
        for (size_t i = 1; *out && i <= len; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i);
            cJSON *chunk = to_json(L, g, -1, 0, err, errlen);
            lua_pop(L, 1);
            if (!chunk) {
                cJSON_Delete(*out);
                *out = NULL;
                break;
            }
            cJSON_AddItemToArray(*out, chunk);
        }
    } else {
        snprintf(err, errlen, "%s.decode_event must return a list", g->adapters[adapter].name);
    }
    lua_settop(L, top);
    lua_rawgeti(L, LUA_REGISTRYINDEX, state_ref);
    lua_getfield(L, -1, "done");
    *done = lua_toboolean(L, -1);
    lua_settop(L, top);
    return *out ? 0 : -1;
}
