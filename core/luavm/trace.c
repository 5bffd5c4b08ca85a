/* trace: the views handed to route() and encode(), and the recorder behind them; see trace.h.
 *
 * A view is a table with a few raw fields and one shared metatable: a candidate's kept view
 * holds its code (the slot) and its config fields, a place view (what a step's result holds)
 * its code (slot and "a place") and its place, the request view the request's real table and
 * its routing fields. Their __index answers from the facts the current call was given
 * (t->facts, by slot) and notes the read: into the call's key (t->req_mask, t->cand_mask),
 * into a guard (a place's field), or, while a step's function runs (t->scope), into that
 * function's answer (a memo). Views outlive the call that made them (a policy may keep one, a
 * test reads them afterwards): outside a call they answer what they showed last and note
 * nothing.
 *
 * A step's functions (the weights and keys of weighted_order and sort_by) are asked once per
 * candidate and kept per function and slot (memos, at most MEMOS_PER_SLOT functions a slot)
 * under the values of the candidate's facts they read: a recording and a replay ask again
 * only for a candidate whose facts they read changed. An answer that read anything else (the
 * request, another view, the clock) is not kept. */
#include "luavm/trace.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "luavm/lcall.h"

/* Private keys of views (light userdata: no policy can spell them). */
static char PRIV_CODE; /* candidate and place views: their code (below) */
/* A view's code: slot + 1 in bits 0-23; for a place view also CODE_PLACE, the place in bits
 * 25-40, the step in bits 41-52 and the low 10 bits of the call's serial in bits 53-62 (a
 * place view kept from a call 1,024 calls ago would pass for one of this call's: views are not
 * to be kept past their call). */
#define CODE_PLACE ((lua_Integer)1 << 24)
#define CODE_SLOT_MAX ((1L << 24) - 2)
#define CODE_OPS_MAX 4096
#define SERIAL_BITS 0x3ffu
#define MEMOS_PER_SLOT 4
#define MEMO_FIELDS 6
static char PRIV_REAL; /* request views: the real request table */
static char PRIV_CALL; /* request views: the call's serial */

static const char *const cand_names[CF_N] = {"index",
                                             "provider",
                                             "model",
                                             "pool",
                                             "local",
                                             "smaller",
                                             "priority",
                                             "weight",
                                             "available",
                                             "cooling",
                                             "cooldown_remaining_ms",
                                             "consecutive_429",
                                             "observing",
                                             "trial",
                                             "rpm_limit",
                                             "rpm_used",
                                             "tpm_limit",
                                             "tpm_used",
                                             "headroom",
                                             "in_flight",
                                             "health",
                                             "breaker",
                                             "route_breaker",
                                             "avail_samples",
                                             "ttft_samples",
                                             "success_rate",
                                             "ttft_ms",
                                             "load"};

static const char *const req_names[RF_N] = {"request_id",
                                            "endpoint",
                                            "model",
                                            "stream",
                                            "max_tokens",
                                            "created",
                                            "priority",
                                            "pool",
                                            "pin",
                                            "local_only",
                                            "allow_smaller_model",
                                            "allow_cloud",
                                            "local_first",
                                            "random",
                                            "attempt",
                                            "plan_limit",
                                            "body"};

/* A step function's answer about a slot's candidate, and the facts of it that it read. */
typedef struct memo_s {
    const void *fn; /* the function (NULL: free) */
    int fn_ref;     /* a reference holding it while the answer is kept */
    int n;          /* fields read; MEMO_FIELDS + 1: too many (not kept) */
    uint8_t fid[MEMO_FIELDS];
    uint64_t val[MEMO_FIELDS];
    int other; /* it read something else (not kept) */
    int has;   /* it answered a number */
    double value;
    uint64_t serial;   /* the description it was made from (0: compare the fields) */
    mg_tstate_t state; /* the candidate's state then (CF_STATE_MASK) */
    unsigned used;     /* when it was last given (the least recent one goes) */
} memo_t;

struct mg_trace_s {
    lua_State *L;
    const mg_ljson_t *json;
    int dirty_ref; /* the request tables' "written by Lua" mark (reqtab.h) */
    size_t n_slots;
    mg_candidate_t *facts;                    /* owned, per slot: what its views show */
    int *index;                               /* owned, per slot: its view's index */
    const mg_provider_conf_t **view_provider; /* owned, per slot: whose config its view holds */
    long *pos_of;                             /* owned, per slot: its position in the call, -1 */
    int views_ref, view_mt_ref, req_mt_ref, written_ref, maker_ref, names_ref, places_ref;
    int n_places; /* place views handed out in this call */
    int route_req_mt_ref;
    int n_written;
    mg_lmod_hooks_t hooks;
    /* the call */
    int active;    /* a call runs: views answer it */
    int recording; /* ... and it is recorded */
    unsigned serial;
    int bad;    /* the recording cannot be followed */
    int moving; /* it read a moving number outside a step */
    mg_treq_t rq;
    const mg_candidate_t *cands;
    const long *slots;
    int n;
    uint32_t req_mask;
    uint64_t *cand_mask; /* owned, per position (CF_ALL bits) */
    int cap;
    struct memo_s *scope; /* the answer of the function running, or NULL */
    long scope_slot;
    struct memo_s *memos; /* owned, MEMOS_PER_SLOT per slot */
    unsigned memo_clock;
    mg_top_t *ops;
    int n_ops, cap_ops, n_draws;
    mg_tguard_t *guards;
    int n_guards, cap_guards;
    mg_teq_t *eqs;
    int n_eqs, cap_eqs;
};

/* ------------------------------------------------------------------------ */
/* Field values                                                              */
/* ------------------------------------------------------------------------ */

static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

uint64_t mg_trace_load_value(const mg_candidate_t *c)
{
    if (!c->load_known) return UINT64_MAX;
    return (uint64_t)(uint32_t)c->load_running << 32 | (uint32_t)c->load_waiting;
}

/* A candidate field's value, fid < CF_ALL (CF_INDEX: index). */
static uint64_t cand_value(const mg_candidate_t *c, int index, int fid)
{
    switch (fid) {
    case CF_INDEX: return (uint64_t)index;
    case CF_PROVIDER: return (uintptr_t)c->provider->id;
    case CF_MODEL: return (uintptr_t)c->route->model;
    case CF_POOL: return (uintptr_t)c->provider->pool;
    case CF_LOCAL: return (uint64_t)(c->provider->local != 0);
    case CF_SMALLER: return (uint64_t)(c->route->smaller != 0);
    case CF_PRIORITY: return (uint64_t)(int64_t)c->route->priority;
    case CF_WEIGHT: return bits_of(c->provider->weight);
    case CF_AVAILABLE: return (uint64_t)(c->available != 0);
    case CF_COOLING: return (uint64_t)(c->cooling != 0);
    case CF_COOLDOWN_REMAINING_MS: return (uint64_t)c->cooldown_remaining_ms;
    case CF_CONSECUTIVE_429: return (uint64_t)(int64_t)c->consecutive_429;
    case CF_OBSERVING: return (uint64_t)(c->observing != 0);
    case CF_TRIAL: return (uint64_t)(c->trial != 0);
    case CF_RPM_LIMIT: return (uint64_t)(int64_t)c->rpm_limit;
    case CF_RPM_USED: return (uint64_t)(int64_t)c->rpm_used;
    case CF_TPM_LIMIT: return (uint64_t)c->tpm_limit;
    case CF_TPM_USED: return (uint64_t)c->tpm_used;
    case CF_HEADROOM: return bits_of(c->headroom);
    case CF_IN_FLIGHT: return (uint64_t)(int64_t)c->in_flight;
    case CF_HEALTH: return (uintptr_t)c->health;
    case CF_BREAKER: return (uintptr_t)c->breaker;
    case CF_ROUTE_BREAKER: return (uintptr_t)c->route_breaker;
    case CF_AVAIL_SAMPLES: return (uint64_t)(int64_t)c->avail_samples;
    case CF_TTFT_SAMPLES: return (uint64_t)(int64_t)c->ttft_samples;
    case CF_SUCCESS_RATE: return c->success_rate < 0 ? UINT64_MAX : bits_of(c->success_rate);
    case CF_TTFT_MS: return c->ttft_ms < 0 ? UINT64_MAX : bits_of(c->ttft_ms);
    case CF_LOAD: return mg_trace_load_value(c);
    case CF_LOAD_KV:
        return !c->load_known || c->load_kv_cache < 0 ? UINT64_MAX : bits_of(c->load_kv_cache);
    default: return 0;
    }
}

int mg_trace_value_equal(int fid, uint64_t a, uint64_t b)
{
    if (a == b) return 1;
    switch (fid) {
    case CF_PROVIDER:
    case CF_MODEL:
    case CF_POOL:
    case CF_HEALTH:
    case CF_BREAKER:
    case CF_ROUTE_BREAKER:
        return a && b && strcmp((const char *)(uintptr_t)a, (const char *)(uintptr_t)b) == 0;
    default: return 0;
    }
}

uint64_t mg_trace_cand_value(const mg_candidate_t *c, int index, int fid)
{
    return cand_value(c, index, fid);
}

static void push_opt_num(lua_State *L, double v)
{
    if (v >= 0) lua_pushnumber(L, v);
    else lua_pushnil(L);
}

static void push_load(lua_State *L, const mg_candidate_t *c)
{
    if (!c->load_known) {
        lua_pushnil(L);
        return;
    }
    lua_createtable(L, 0, 3);
    mg_lset_int(L, "running", c->load_running);
    mg_lset_int(L, "waiting", c->load_waiting);
    if (c->load_kv_cache >= 0) mg_lset_num(L, "kv_cache", c->load_kv_cache);
}

static void push_cand_field(lua_State *L, const mg_candidate_t *c, int index, int fid)
{
    switch (fid) {
    case CF_INDEX: lua_pushinteger(L, index); break;
    case CF_PROVIDER: lua_pushstring(L, c->provider->id); break;
    case CF_MODEL: lua_pushstring(L, c->route->model); break;
    case CF_POOL: lua_pushstring(L, c->provider->pool); break;
    case CF_LOCAL: lua_pushboolean(L, c->provider->local); break;
    case CF_SMALLER: lua_pushboolean(L, c->route->smaller); break;
    case CF_PRIORITY: lua_pushinteger(L, c->route->priority); break;
    case CF_WEIGHT: lua_pushnumber(L, c->provider->weight); break;
    case CF_AVAILABLE: lua_pushboolean(L, c->available); break;
    case CF_COOLING: lua_pushboolean(L, c->cooling); break;
    case CF_COOLDOWN_REMAINING_MS: lua_pushinteger(L, c->cooldown_remaining_ms); break;
    case CF_CONSECUTIVE_429: lua_pushinteger(L, c->consecutive_429); break;
    case CF_OBSERVING: lua_pushboolean(L, c->observing); break;
    case CF_TRIAL: lua_pushboolean(L, c->trial); break;
    case CF_RPM_LIMIT: lua_pushinteger(L, c->rpm_limit); break;
    case CF_RPM_USED: lua_pushinteger(L, c->rpm_used); break;
    case CF_TPM_LIMIT: lua_pushinteger(L, c->tpm_limit); break;
    case CF_TPM_USED: lua_pushinteger(L, c->tpm_used); break;
    case CF_HEADROOM: lua_pushnumber(L, c->headroom); break;
    case CF_IN_FLIGHT: lua_pushinteger(L, c->in_flight); break;
    case CF_HEALTH: lua_pushstring(L, c->health); break;
    case CF_BREAKER: lua_pushstring(L, c->breaker); break;
    case CF_ROUTE_BREAKER: lua_pushstring(L, c->route_breaker); break; /* NULL: nil */
    case CF_AVAIL_SAMPLES: lua_pushinteger(L, c->avail_samples); break;
    case CF_TTFT_SAMPLES: lua_pushinteger(L, c->ttft_samples); break;
    case CF_SUCCESS_RATE: push_opt_num(L, c->success_rate); break;
    case CF_TTFT_MS: push_opt_num(L, c->ttft_ms); break;
    case CF_LOAD: push_load(L, c); break;
    default: lua_pushnil(L);
    }
}

/* The bits a read of fid notes (the load is two values). */
static uint64_t read_bits(int fid)
{
    return fid == CF_LOAD ? (1ull << CF_LOAD) | (1ull << CF_LOAD_KV) : 1ull << fid;
}

/* ------------------------------------------------------------------------ */
/* Notes                                                                     */
/* ------------------------------------------------------------------------ */

/* A place as view_slot gives it: the serial's low bits, the step and the place, with bit 63
 * set so that it is never 0. */
static uint64_t place_of(unsigned serial, int op, int j)
{
    return 1ull << 63 | (uint64_t)(serial & SERIAL_BITS) << 32 | (uint64_t)(uint16_t)op << 16 |
           (uint16_t)j;
}

static int place_is_ours(const mg_trace_t *t, uint64_t place)
{
    return (unsigned)(place >> 32 & SERIAL_BITS) == (t->serial & SERIAL_BITS);
}

static lua_Integer place_code(long slot, unsigned serial, int op, int j)
{
    return (lua_Integer)(slot + 1) | CODE_PLACE | (lua_Integer)(uint16_t)j << 25 |
           (lua_Integer)(op & 0xfff) << 41 | (lua_Integer)(serial & SERIAL_BITS) << 53;
}

/* Grow *arr (of size elem) to hold one more than *n. */
static int grow(void **arr, int *cap, int n, size_t elem)
{
    if (n < *cap) return 0;
    int c = *cap ? *cap * 2 : 8;
    void *a = realloc(*arr, (size_t)c * elem);
    if (!a) return -1;
    *arr = a;
    *cap = c;
    return 0;
}

/* The candidate (position) place j of step op holds, or -1. */
static int place_pos(const mg_trace_t *t, int op, int j)
{
    if (op < 0 || op >= t->n_ops || t->ops[op].kind != MG_TOP_ORDER) return -1;
    return j >= 0 && (size_t)j < t->ops[op].out_n ? t->ops[op].out[j] : -1;
}

static void note_guard(mg_trace_t *t, int op, int j, int fid)
{
    for (int g = 0; g < t->n_guards; g++)
        if (t->guards[g].ref.op == op && t->guards[g].ref.i == j && t->guards[g].fid == fid) return;
    if (grow((void **)&t->guards, &t->cap_guards, t->n_guards, sizeof(*t->guards)) != 0) {
        t->bad = 1;
        return;
    }
    t->guards[t->n_guards++] = (mg_tguard_t){{op, j}, fid, 0}; /* the value: at the end */
}

/* A read, by the step function running, of field fid of its candidate. */
static void note_scope(memo_t *m, int fid)
{
    for (int i = 0; i < m->n && i < MEMO_FIELDS; i++)
        if (m->fid[i] == fid) return;
    if (m->n < MEMO_FIELDS) m->fid[m->n] = (uint8_t)fid;
    if (m->n <= MEMO_FIELDS) m->n++;
}

/* A read of field fid of the view with slot `slot` (place: its place code, 0 for a
 * candidate's own view). */
static void note_read(mg_trace_t *t, long slot, uint64_t place, int fid)
{
    if (!t->active) return;
    if (t->scope) { /* a step's function: its answer, if about its own candidate */
        if (!place && slot == t->scope_slot) {
            note_scope(t->scope, fid);
            if (fid == CF_LOAD) note_scope(t->scope, CF_LOAD_KV);
        } else {
            t->scope->other = 1;
        }
        return;
    }
    if (!t->recording) return;
    if (place) {
        if (!place_is_ours(t, place)) {
            t->bad = 1; /* a place of another call */
            return;
        }
        note_guard(t, (int)(place >> 16 & 0xffff), (int)(place & 0xffff), fid);
        if (fid == CF_LOAD)
            note_guard(t, (int)(place >> 16 & 0xffff), (int)(place & 0xffff), CF_LOAD_KV);
    } else {
        long pos = slot >= 0 && (size_t)slot < t->n_slots ? t->pos_of[slot] : -1;
        if (pos < 0) {
            t->bad = 1; /* a view kept from another call */
            return;
        }
        t->cand_mask[pos] |= read_bits(fid);
    }
    if (CF_MOVING_MASK & (1u << fid)) t->moving = 1;
}

static void note_req(mg_trace_t *t, int rid)
{
    if (t->scope) {
        t->scope->other = 1;
        return;
    }
    if (!t->recording) return;
    t->req_mask |= 1u << rid;
    if (RF_OWN_MASK & (1u << rid)) t->moving = 1;
}

/* ------------------------------------------------------------------------ */
/* The metamethods                                                           */
/* ------------------------------------------------------------------------ */

static mg_trace_t *trace_of(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

/* The field id of the key at idx (upvalue 2: name -> id + 1), or -1. */
static int field_id(lua_State *L, int idx)
{
    lua_pushvalue(L, idx);
    int id = lua_rawget(L, lua_upvalueindex(2)) == LUA_TNUMBER ? (int)lua_tointeger(L, -1) - 1 : -1;
    lua_pop(L, 1);
    return id;
}

/* The slot (and place code, 0 for none) of the view at idx; -1 when it is no view. */
static long view_slot(lua_State *L, int idx, uint64_t *place)
{
    *place = 0;
    if (!lua_istable(L, idx)) return -1;
    lua_rawgetp(L, idx, &PRIV_CODE);
    lua_Integer code = lua_isinteger(L, -1) ? lua_tointeger(L, -1) : 0;
    lua_pop(L, 1);
    if (code <= 0) return -1;
    if (code & CODE_PLACE)
        *place =
            place_of((unsigned)(code >> 53), (int)(code >> 41 & 0xfff), (int)(code >> 25 & 0xffff));
    return (long)(code & (CODE_PLACE - 1)) - 1;
}

static int view_index(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    int fid = field_id(L, 2);
    if (fid < 0) return 0;
    uint64_t place = 0;
    long slot = (long)lua_tointeger(L, lua_upvalueindex(3)); /* a kept view's own slot */
    if (slot < 0) slot = view_slot(L, 1, &place);
    if (slot < 0 || (size_t)slot >= t->n_slots) return 0;
    note_read(t, slot, place, fid);
    push_cand_field(L, &t->facts[slot], t->index[slot], fid);
    return 1;
}

static int view_newindex(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    lua_settop(L, 3);
    lua_rawset(L, 1);
    uint64_t place;
    if (view_slot(L, 1, &place) >= 0) { /* a kept or reused view: cleared after the call */
        lua_rawgeti(L, LUA_REGISTRYINDEX, t->written_ref);
        lua_pushvalue(L, 1);
        lua_rawseti(L, -2, ++t->n_written);
        lua_pop(L, 1);
    }
    return 0;
}

/* The reference of the view at idx in the current recording; 0, or -1 when it has none. */
static int view_ref(mg_trace_t *t, lua_State *L, int idx, mg_tref_t *ref)
{
    uint64_t place;
    long slot = view_slot(L, idx, &place);
    if (slot < 0) return -1;
    if (place) {
        if (!place_is_ours(t, place)) return -1;
        *ref = (mg_tref_t){(int)(place >> 16 & 0xffff), (int)(place & 0xffff)};
        return 0;
    }
    long pos = (size_t)slot < t->n_slots ? t->pos_of[slot] : -1;
    if (pos < 0) return -1;
    *ref = (mg_tref_t){-1, (int)pos};
    return 0;
}

/* a == b for two views: the same candidate. */
static int view_eq(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    uint64_t pa, pb;
    long a = view_slot(L, 1, &pa), b = view_slot(L, 2, &pb);
    int same = a >= 0 && a == b;
    if (t->active && t->scope && (pa || pb)) t->scope->other = 1;
    if (t->active && t->recording && !t->scope && (pa || pb)) {
        mg_tref_t ra, rb;
        if (view_ref(t, L, 1, &ra) != 0 || view_ref(t, L, 2, &rb) != 0 ||
            grow((void **)&t->eqs, &t->cap_eqs, t->n_eqs, sizeof(*t->eqs)) != 0)
            t->bad = 1;
        else t->eqs[t->n_eqs++] = (mg_teq_t){ra, rb, same};
    }
    lua_pushboolean(L, same);
    return 1;
}

/* pairs(view): every field, in the documented order (each one a read). */
static int view_next(lua_State *L)
{
    int fid = lua_isnil(L, 2) ? 0 : -1;
    if (fid < 0)
        for (int i = 0; i < CF_N; i++)
            if (lua_type(L, 2) == LUA_TSTRING && strcmp(lua_tostring(L, 2), cand_names[i]) == 0)
                fid = i + 1;
    if (fid < 0 || fid >= CF_N) return 0;
    for (; fid < CF_N; fid++) {
        lua_pushstring(L, cand_names[fid]);
        if (lua_gettable(L, 1) != LUA_TNIL) {
            lua_pushstring(L, cand_names[fid]);
            lua_insert(L, -2);
            return 2;
        }
        lua_pop(L, 1);
    }
    return 0;
}

static int view_pairs(lua_State *L)
{
    lua_pushcfunction(L, view_next);
    lua_pushvalue(L, 1);
    lua_pushnil(L);
    return 3;
}

static int req_index(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    int rid = field_id(L, 2);
    if (rid >= 0 && (RF_ROUTING_MASK & (1u << rid)) && lua_tointeger(L, lua_upvalueindex(3)) > 0)
        return 0; /* a routing field of a route() view: absent is nil, and keyed */
    lua_rawgetp(L, 1, &PRIV_REAL);
    lua_pushvalue(L, 2);
    lua_rawget(L, -2);
    if (t->active) {
        lua_rawgetp(L, 1, &PRIV_CALL);
        lua_Integer call = lua_tointeger(L, -1);
        int ours = (unsigned)(call < 0 ? -call : call) == t->serial;
        lua_pop(L, 1);
        if (rid >= 0 && ours) {
            note_req(t, rid);
            if (!lua_isnil(L, -1)) { /* read once, noted once: the view holds it now */
                lua_pushvalue(L, 2);
                lua_pushvalue(L, -2);
                lua_rawset(L, 1);
            }
        } else if (t->scope) {
            t->scope->other = 1;
        } else if (t->recording) {
            t->bad = 1; /* a field Lua wrote, or another call's request */
        }
    }
    return 1;
}

/* A write goes to the real table, which then counts as written by Lua: no later call of the
 * request is recorded (reqtab's mark), and the table is not reused. */
static int req_newindex(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    lua_settop(L, 3);
    lua_rawgetp(L, 1, &PRIV_REAL);
    lua_pushvalue(L, 2);
    lua_pushvalue(L, 3);
    lua_settable(L, 4);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->dirty_ref);
    lua_pushboolean(L, 1);
    lua_rawset(L, 4);
    if (t->active) t->bad = 1;
    return 0;
}

static int req_pairs(lua_State *L)
{
    mg_trace_t *t = trace_of(L);
    if (t->active) t->moving = 1; /* every field, its own ones too */
    lua_getglobal(L, "next");
    lua_rawgetp(L, 1, &PRIV_REAL);
    lua_pushnil(L);
    return 3;
}

/* ------------------------------------------------------------------------ */
/* Setting up                                                                */
/* ------------------------------------------------------------------------ */

static void names_table(lua_State *L, const char *const *names, int n)
{
    lua_createtable(L, 0, n);
    for (int i = 0; i < n; i++) {
        lua_pushinteger(L, i + 1);
        lua_setfield(L, -2, names[i]);
    }
}

/* A metatable whose methods have (t, names) as upvalues. */
static int metatable_ref(lua_State *L, mg_trace_t *t, const char *const *names, int n,
                         const luaL_Reg *fns, lua_Integer up3)
{
    lua_createtable(L, 0, 5);
    lua_pushlightuserdata(L, t);
    names_table(L, names, n);
    lua_pushinteger(L, up3); /* views: -1 (a slot's own metatable has its slot here:
                                view_metatable); request views: 1 for route()'s */
    luaL_setfuncs(L, fns, 3);
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable"); /* getmetatable(view) says false: hands off */
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Plain candidate tables for the candidates a call's views cannot show (a route the config
 * does not list, a route given twice): one Lua table constructor. */
static const char maker_src[] =
    "return function(index, provider, model, pool, loc, smaller, priority, weight, available,\n"
    "  cooling, cooldown_remaining_ms, consecutive_429, observing, trial, rpm_limit, rpm_used,\n"
    "  tpm_limit, tpm_used, headroom, in_flight, health, breaker, route_breaker, avail_samples,\n"
    "  ttft_samples, success_rate, ttft_ms, load)\n"
    "  return { index = index, provider = provider, model = model, pool = pool, ['local'] = loc,\n"
    "    smaller = smaller, priority = priority, weight = weight, available = available,\n"
    "    cooling = cooling, cooldown_remaining_ms = cooldown_remaining_ms,\n"
    "    consecutive_429 = consecutive_429, observing = observing, trial = trial,\n"
    "    rpm_limit = rpm_limit,\n"
    "    rpm_used = rpm_used, tpm_limit = tpm_limit, tpm_used = tpm_used, headroom = headroom,\n"
    "    in_flight = in_flight, health = health, breaker = breaker,\n"
    "    route_breaker = route_breaker, avail_samples = avail_samples,\n"
    "    ttft_samples = ttft_samples, success_rate = success_rate, ttft_ms = ttft_ms,\n"
    "    load = load }\n"
    "end\n";

static int hook_draw(void *ud, lua_State *L, int req, double *random, int *id);
static void hook_chance(void *ud, int id, double p, int result);
static void hook_impure(void *ud);
static int hook_order_begin(void *ud, lua_State *L, int list, size_t n);
static void hook_eval(void *ud, lua_State *L, int op, int which, int fn, int list, size_t i);
static void hook_order_end(void *ud, lua_State *L, int op, const mg_order_call_t *call);
static void hook_push_result(void *ud, lua_State *L, int op, int list, int pos, size_t j);

mg_trace_t *mg_trace_new(lua_State *L, size_t n_slots, int dirty_ref, const mg_ljson_t *json)
{
    mg_trace_t *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    size_t ns = n_slots ? n_slots : 1;
    t->L = L;
    t->json = json;
    t->dirty_ref = dirty_ref;
    t->n_slots = n_slots;
    t->facts = calloc(ns, sizeof(*t->facts));
    t->index = calloc(ns, sizeof(*t->index));
    t->view_provider = calloc(ns, sizeof(*t->view_provider));
    t->pos_of = malloc(ns * sizeof(*t->pos_of));
    t->memos = calloc(ns * MEMOS_PER_SLOT, sizeof(*t->memos));
    if (!t->facts || !t->index || !t->view_provider || !t->pos_of || !t->memos ||
        luaL_loadbuffer(L, maker_src, sizeof(maker_src) - 1, "=candidate") != LUA_OK ||
        lua_pcall(L, 0, 1, 0) != LUA_OK) {
        if (lua_gettop(L) > 0 && !lua_isfunction(L, -1)) lua_pop(L, 1);
        mg_trace_free(t);
        return NULL;
    }
    t->maker_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    for (size_t i = 0; i < ns; i++) t->pos_of[i] = -1;
    static const luaL_Reg view_fns[] = {{"__index", view_index},
                                        {"__newindex", view_newindex},
                                        {"__eq", view_eq},
                                        {"__pairs", view_pairs},
                                        {NULL, NULL}};
    static const luaL_Reg req_fns[] = {
        {"__index", req_index}, {"__newindex", req_newindex}, {"__pairs", req_pairs}, {NULL, NULL}};
    t->view_mt_ref = metatable_ref(L, t, cand_names, CF_N, view_fns, -1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->view_mt_ref);
    lua_getfield(L, -1, "__index");
    lua_getupvalue(L, -1, 2);
    t->names_ref = luaL_ref(L, LUA_REGISTRYINDEX); /* the names, shared with slots' metatables */
    lua_pop(L, 2);
    t->req_mt_ref = metatable_ref(L, t, req_names, RF_N, req_fns, -1);
    t->route_req_mt_ref = metatable_ref(L, t, req_names, RF_N, req_fns, 1);
    lua_createtable(L, (int)n_slots, 0);
    t->views_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    t->written_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    t->places_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    t->hooks =
        (mg_lmod_hooks_t){t,         hook_draw,      hook_chance,     hook_impure, hook_order_begin,
                          hook_eval, hook_order_end, hook_push_result};
    return t;
}

/* Free the resources of the recording's steps. */
static void ops_clear(mg_trace_t *t)
{
    for (int i = 0; i < t->n_ops; i++) {
        mg_top_t *o = &t->ops[i];
        free(o->refs);
        free(o->wvals);
        free(o->kvals);
        free(o->out);
        if (o->wfn != LUA_NOREF) luaL_unref(t->L, LUA_REGISTRYINDEX, o->wfn);
        if (o->kfn != LUA_NOREF) luaL_unref(t->L, LUA_REGISTRYINDEX, o->kfn);
    }
    t->n_ops = t->n_draws = t->n_guards = t->n_eqs = 0;
}

void mg_trace_free(mg_trace_t *t)
{
    if (!t) return;
    free(t->facts);
    free(t->index);
    free(t->view_provider);
    free(t->pos_of);
    free(t->memos); /* (their references went with the state, or go with it) */
    free(t->cand_mask);
    for (int i = 0; i < t->n_ops; i++) { /* (the state may be gone: no unref) */
        free(t->ops[i].refs);
        free(t->ops[i].wvals);
        free(t->ops[i].kvals);
        free(t->ops[i].out);
    }
    free(t->ops);
    free(t->guards);
    free(t->eqs);
    free(t);
}

const mg_lmod_hooks_t *mg_trace_hooks(mg_trace_t *t)
{
    return &t->hooks;
}

/* ------------------------------------------------------------------------ */
/* Beginning a call                                                          */
/* ------------------------------------------------------------------------ */

/* Set a config field of the view on top of the stack. */
static void set_config(lua_State *L, const mg_candidate_t *c)
{
    mg_lset_str(L, "provider", c->provider->id);
    mg_lset_str(L, "model", c->route->model);
    mg_lset_str(L, "pool", c->provider->pool);
    mg_lset_bool(L, "local", c->provider->local);
    mg_lset_bool(L, "smaller", c->route->smaller);
    mg_lset_int(L, "priority", c->route->priority);
    mg_lset_num(L, "weight", c->provider->weight);
}

/* Bring the state fields (CF_STATE_MASK) of the view on top of the stack to c's; was: what
 * they show now (NULL: nothing yet). A nil value (no route breaker) is no field: its read goes
 * to view_index. */
static void set_state(lua_State *L, const mg_candidate_t *c, const mg_candidate_t *was)
{
    for (uint32_t m = CF_STATE_MASK; m; m &= m - 1) {
        int fid = __builtin_ctz(m);
        if (was && mg_trace_value_equal(fid, cand_value(c, 0, fid), cand_value(was, 0, fid)))
            continue;
        lua_pushstring(L, cand_names[fid]);
        push_cand_field(L, c, 0, fid);
        lua_rawset(L, -3);
    }
}

/* Push the metatable of slot's kept view: the views' methods with the slot as their third
 * upvalue, so that a read finds it without a lookup. */
static void view_metatable(mg_trace_t *t, long slot)
{
    lua_State *L = t->L;
    static const luaL_Reg fns[] = {{"__index", view_index},
                                   {"__newindex", view_newindex},
                                   {"__eq", view_eq},
                                   {"__pairs", view_pairs},
                                   {NULL, NULL}};
    lua_createtable(L, 0, 5);
    lua_pushlightuserdata(L, t);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->names_ref);
    lua_pushinteger(L, slot);
    luaL_setfuncs(L, fns, 3);
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
}

/* Push the kept view of slot for candidate c at index, made (or made again, when its
 * provider is not the one it shows) as needed. Its index is a fact like the others (the
 * same route sits at another place in a list of part of the model's routes). */
static void push_view(mg_trace_t *t, long slot, const mg_candidate_t *c, int index)
{
    lua_State *L = t->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->views_ref);
    if (lua_rawgeti(L, -1, slot + 1) != LUA_TTABLE || t->view_provider[slot] != c->provider) {
        lua_pop(L, 1);
        lua_createtable(L, 0, 18);
        lua_pushinteger(L, slot + 1);
        lua_rawsetp(L, -2, &PRIV_CODE);
        set_config(L, c);
        set_state(L, c, NULL);
        view_metatable(t, slot);
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, slot + 1);
        t->view_provider[slot] = c->provider;
    } else {
        set_state(L, c, &t->facts[slot]); /* (what the view shows: t->facts[slot]'s) */
    }
    t->facts[slot] = *c;
    t->index[slot] = index;
    lua_remove(L, -2);
}

/* Push a plain table of candidate c (see maker_src). */
static void push_plain(mg_trace_t *t, const mg_candidate_t *c, int index)
{
    lua_State *L = t->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->maker_ref);
    for (int fid = CF_INDEX; fid < CF_N; fid++) push_cand_field(L, c, index, fid);
    lua_call(L, CF_N, 1);
}

/* Push the request view of the real table at req_ref: for route() (routing) with the routing
 * fields in it (its PRIV_CALL is -serial then), for encode() without. */
static void push_req_view(mg_trace_t *t, int req_ref, int routing)
{
    lua_State *L = t->L;
    lua_createtable(L, 0, routing ? 9 : 2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    lua_rawsetp(L, -2, &PRIV_REAL);
    lua_pushinteger(L, routing ? -(lua_Integer)t->serial : (lua_Integer)t->serial);
    lua_rawsetp(L, -2, &PRIV_CALL);
    if (routing) {
        const mg_lua_req_t *r = t->rq.info;
        if (r->pool) mg_lset_str(L, "pool", r->pool);
        if (r->pin) mg_lset_str(L, "pin", r->pin);
        mg_lset_bool(L, "local_only", r->local_only);
        mg_lset_bool(L, "allow_smaller_model", r->allow_smaller_model);
        mg_lset_bool(L, "allow_cloud", r->allow_cloud);
        mg_lset_bool(L, "local_first", r->local_first);
        if (t->rq.plan_limit > 0) mg_lset_int(L, "plan_limit", t->rq.plan_limit);
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, routing ? t->route_req_mt_ref : t->req_mt_ref);
    lua_setmetatable(L, -2);
}

/* Whether the real request table at req_ref was written to by Lua. */
static int req_written(mg_trace_t *t, int req_ref)
{
    lua_State *L = t->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, req_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->dirty_ref);
    int written = lua_rawget(L, -2) != LUA_TNIL;
    lua_pop(L, 2);
    return written;
}

static void begin(mg_trace_t *t, const mg_treq_t *rq, int record)
{
    t->serial++;
    t->active = 1;
    t->recording = record;
    t->bad = t->moving = 0;
    t->req_mask = 0;
    t->rq = *rq;
    t->scope = NULL;
    t->n_places = 0;
    ops_clear(t);
}

void mg_trace_begin_route(mg_trace_t *t, const mg_treq_t *rq, int req_ref,
                          const mg_candidate_t *cands, int n, const long *slots, int record)
{
    lua_State *L = t->L;
    begin(t, rq, record && !req_written(t, req_ref));
    t->req_mask = RF_ROUTING_MASK; /* (in the view: in every key) */
    t->cands = cands;
    t->slots = slots;
    t->n = n;
    if (n > t->cap) {
        uint64_t *m = realloc(t->cand_mask, (size_t)n * sizeof(*m));
        if (m) {
            t->cand_mask = m;
            t->cap = n;
        }
    }
    if (n > t->cap) t->recording = 0; /* out of memory: not recorded (no mask is written) */
    else if (n > 0) memset(t->cand_mask, 0, (size_t)n * sizeof(*t->cand_mask));
    push_req_view(t, req_ref, 1);
    lua_checkstack(L, CF_N + 8);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        long slot = slots ? slots[i] : -1;
        if (slot >= 0 && (size_t)slot < t->n_slots && slot <= CODE_SLOT_MAX) {
            t->pos_of[slot] = i;
            push_view(t, slot, &cands[i], i + 1);
        } else {
            push_plain(t, &cands[i], i + 1);
        }
        lua_rawseti(L, -2, i + 1);
    }
}

void mg_trace_begin_encode(mg_trace_t *t, const mg_treq_t *rq, int req_ref)
{
    begin(t, rq, !req_written(t, req_ref));
    t->cands = NULL;
    t->slots = NULL;
    t->n = 0;
    push_req_view(t, req_ref, 0);
}

/* ------------------------------------------------------------------------ */
/* The moongate module's steps                                               */
/* ------------------------------------------------------------------------ */

static mg_top_t *new_op(mg_trace_t *t, mg_top_kind_t kind)
{
    if (grow((void **)&t->ops, &t->cap_ops, t->n_ops, sizeof(*t->ops)) != 0) {
        t->bad = 1;
        return NULL;
    }
    mg_top_t *o = &t->ops[t->n_ops++];
    memset(o, 0, sizeof(*o));
    o->kind = kind;
    o->draw = -1;
    o->wfn = o->kfn = LUA_NOREF;
    o->limit = -1;
    return o;
}

/* Whether the value at idx is this call's request view. */
static int is_our_req(mg_trace_t *t, lua_State *L, int idx)
{
    if (!lua_istable(L, idx) || lua_rawgetp(L, idx, &PRIV_CALL) != LUA_TNUMBER) {
        if (lua_istable(L, idx)) lua_pop(L, 1);
        return 0;
    }
    lua_Integer call = lua_tointeger(L, -1);
    lua_pop(L, 1);
    return (unsigned)(call < 0 ? -call : call) == t->serial;
}

static int hook_draw(void *ud, lua_State *L, int req, double *random, int *id)
{
    mg_trace_t *t = ud;
    if (!t->active || !is_our_req(t, L, req)) return 0;
    *random = t->rq.info->random;
    *id = -1;
    if (t->scope) {
        t->scope->other = 1;
        return 1;
    }
    if (!t->recording) return 1;
    mg_top_t *o = new_op(t, MG_TOP_DRAW);
    if (!o) return 1;
    o->draw = *id = t->n_draws++;
    return 1;
}

static void hook_chance(void *ud, int id, double p, int result)
{
    mg_trace_t *t = ud;
    if (!t->active || !t->recording) return;
    if (t->scope) {
        t->bad = 1;
        return;
    }
    mg_top_t *o = new_op(t, MG_TOP_CHANCE);
    if (!o) return;
    o->draw = id;
    o->p = p;
    o->result = result;
}

static void hook_impure(void *ud)
{
    mg_trace_t *t = ud;
    if (!t->active) return;
    t->moving = 1;
    if (t->scope) t->scope->other = 1;
}

/* The position of a reference now (-1: none). */
static int ref_pos(const mg_trace_t *t, mg_tref_t r)
{
    return r.op < 0 ? (r.i >= 0 && r.i < t->n ? r.i : -1) : place_pos(t, r.op, r.i);
}

static int hook_order_begin(void *ud, lua_State *L, int list, size_t n)
{
    mg_trace_t *t = ud;
    if (!t->active || !t->recording) return -1;
    if (t->scope || n > 0xffff || t->n_ops >= CODE_OPS_MAX) {
        t->bad = 1;
        return -1;
    }
    mg_top_t *o = new_op(t, MG_TOP_ORDER);
    if (!o) return -1;
    o->n = n;
    o->refs = malloc((n ? n : 1) * sizeof(*o->refs));
    if (!o->refs) {
        t->bad = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, list, (lua_Integer)i + 1);
        int ok = view_ref(t, L, -1, &o->refs[i]) == 0 && ref_pos(t, o->refs[i]) >= 0;
        lua_pop(L, 1);
        if (!ok) { /* a value that is no candidate of this call: the order cannot be replayed */
            t->bad = 1;
            return -1;
        }
    }
    return t->n_ops - 1;
}

/* Whether the answer m holds for the facts c (of its slot). One description (the same
 * serial) holds without a look at its fields. */
static int memo_holds(memo_t *m, const mg_candidate_t *c, int index)
{
    if (c->serial && c->serial == m->serial) return 1;
    if (!mg_tstate_equal(&m->state, c)) return 0;
    for (int i = 0; i < m->n; i++)
        if (!mg_trace_value_equal(m->fid[i], cand_value(c, index, m->fid[i]), m->val[i])) return 0;
    m->serial = c->serial;
    return 1;
}

/* The kept answer of function fn about slot's candidate, or NULL. */
static memo_t *memo_find(mg_trace_t *t, long slot, const void *fn)
{
    memo_t *ms = &t->memos[(size_t)slot * MEMOS_PER_SLOT];
    for (int i = 0; i < MEMOS_PER_SLOT; i++)
        if (ms[i].fn == fn) return &ms[i];
    return NULL;
}

/* The place for fn's answer about slot: its own, or the least recently used one. */
static memo_t *memo_place(mg_trace_t *t, long slot, const void *fn)
{
    memo_t *m = memo_find(t, slot, fn);
    if (m) return m;
    memo_t *ms = &t->memos[(size_t)slot * MEMOS_PER_SLOT];
    m = &ms[0];
    for (int i = 1; i < MEMOS_PER_SLOT; i++)
        if (!ms[i].fn || (m->fn && ms[i].used < m->used)) m = &ms[i];
    if (m->fn) luaL_unref(t->L, LUA_REGISTRYINDEX, m->fn_ref);
    memset(m, 0, sizeof(*m));
    m->fn_ref = LUA_NOREF;
    return m;
}

/* Call the function at stack index fn with the kept view of slot, noting what it reads into
 * a scratch answer; keeps the answer when it read nothing but its candidate's facts (and
 * not too many of them). Pushes the result, or returns -1 with the error on the stack. */
static int ask(mg_trace_t *t, lua_State *L, int fn, long slot, int *has, double *value)
{
    memo_t scratch = {0}, *saved = t->scope;
    long saved_slot = t->scope_slot;
    t->scope = &scratch;
    t->scope_slot = slot;
    lua_pushvalue(L, fn);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->views_ref);
    lua_rawgeti(L, -1, slot + 1);
    lua_remove(L, -2);
    int rc = lua_pcall(L, 1, 1, 0);
    t->scope = saved;
    t->scope_slot = saved_slot;
    if (rc != LUA_OK) return -1;
    int isnum = 0;
    *value = lua_tonumberx(L, -1, &isnum);
    *has = isnum;
    if (saved) saved->other = 1; /* (a function asked inside another: not followed) */
    if (scratch.other || scratch.n > MEMO_FIELDS || saved) return 0;
    const void *id = lua_topointer(L, fn);
    memo_t *m = memo_place(t, slot, id);
    if (m->fn != id) {
        lua_pushvalue(L, fn);
        m->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        m->fn = id;
    }
    m->n = scratch.n;
    memcpy(m->fid, scratch.fid, sizeof(m->fid));
    for (int i = 0; i < m->n; i++)
        m->val[i] = cand_value(&t->facts[slot], t->index[slot], m->fid[i]);
    m->state = mg_tstate_of(&t->facts[slot]);
    m->has = *has;
    m->value = *value;
    m->serial = t->facts[slot].serial;
    m->used = ++t->memo_clock;
    return 0;
}

static void hook_eval(void *ud, lua_State *L, int op, int which, int fn, int list, size_t i)
{
    mg_trace_t *t = ud;
    mg_top_t *o = &t->ops[op];
    long slot = t->slots[ref_pos(t, o->refs[i - 1])];
    memo_t *m = memo_find(t, slot, lua_topointer(L, fn));
    if (m && memo_holds(m, &t->facts[slot], t->index[slot])) {
        m->used = ++t->memo_clock;
        if (m->has) lua_pushnumber(L, m->value);
        else lua_pushnil(L);
        return;
    }
    int has;
    double value;
    if (ask(t, L, fn, slot, &has, &value) != 0) lua_error(L); /* (the scope is back) */
}

static double *copy_values(const double *v, size_t n)
{
    double *c = malloc((n ? n : 1) * sizeof(*c));
    if (c && n) memcpy(c, v, n * sizeof(*c));
    return c;
}

static void hook_order_end(void *ud, lua_State *L, int op, const mg_order_call_t *call)
{
    mg_trace_t *t = ud;
    mg_top_t *o = &t->ops[op];
    o->weighted = call->weighted;
    o->wkind = call->weight_kind;
    o->kkind = call->key_kind;
    o->draw = call->draw_id;
    o->u = call->u;
    o->seed = call->seed;
    o->limit = call->limit;
    if (o->wkind == MG_SPEC_LIST && !(o->wvals = copy_values(call->weights, o->n))) t->bad = 1;
    if (o->kkind == MG_SPEC_LIST && !(o->kvals = copy_values(call->keys, o->n))) t->bad = 1;
    if (o->wkind == MG_SPEC_FN) {
        lua_pushvalue(L, call->weight_fn);
        o->wfn_id = lua_topointer(L, -1);
        o->wfn = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    if (o->kkind == MG_SPEC_FN) {
        lua_pushvalue(L, call->key_fn);
        o->kfn_id = lua_topointer(L, -1);
        o->kfn = luaL_ref(L, LUA_REGISTRYINDEX);
    }
    o->out = malloc((o->n ? o->n : 1) * sizeof(*o->out));
    if (!o->out) {
        t->bad = 1;
        return;
    }
    o->out_n = call->out_n;
    for (size_t j = 0; j < call->out_n; j++) o->out[j] = ref_pos(t, o->refs[call->out[j].pos - 1]);
}

static void hook_push_result(void *ud, lua_State *L, int op, int list, int pos, size_t j)
{
    mg_trace_t *t = ud;
    int cpos = place_pos(t, op, (int)j - 1);
    long slot = cpos >= 0 ? t->slots[cpos] : -1;
    if (slot < 0) {
        lua_rawgeti(L, list, pos);
        return;
    }
    /* place views are reused from call to call (cleared of what a call wrote: clear_written) */
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->places_ref);
    if (lua_rawgeti(L, -1, ++t->n_places) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_createtable(L, 0, 1);
        lua_rawgeti(L, LUA_REGISTRYINDEX, t->view_mt_ref);
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_rawseti(L, -3, t->n_places);
    }
    lua_remove(L, -2);
    lua_pushinteger(L, place_code(slot, t->serial, op, (int)j - 1));
    lua_rawsetp(L, -2, &PRIV_CODE);
}

/* ------------------------------------------------------------------------ */
/* The plan, and the end of a call                                           */
/* ------------------------------------------------------------------------ */

static const char *degraded_name(const char *s)
{
    static const char *const names[] = {"fallback", "emergency", "smaller", "cloud"};
    if (!s) return NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i]) == 0) return names[i];
    return NULL;
}

/* The marks of the table on top of the stack (raw for a view: they sit in it). */
static void read_marks(lua_State *L, int view, mg_titem_t *item)
{
    if (view) {
        lua_pushliteral(L, "degraded");
        lua_rawget(L, -2);
        lua_pushliteral(L, "emergency");
        lua_rawget(L, -3);
    } else {
        lua_getfield(L, -1, "degraded");
        lua_getfield(L, -2, "emergency");
    }
    item->degraded = degraded_name(lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL);
    item->emergency = lua_toboolean(L, -1);
    lua_pop(L, 2);
}

int mg_trace_plan_item(mg_trace_t *t, int n, mg_titem_t *item)
{
    lua_State *L = t->L;
    item->degraded = NULL;
    item->emergency = 0;
    if (lua_istable(L, -1)) {
        uint64_t place;
        long slot = view_slot(L, -1, &place);
        if (slot >= 0) {
            int pos = view_ref(t, L, -1, &item->ref) == 0 ? ref_pos(t, item->ref) : -1;
            if (pos < 0) t->bad = 1;
            else read_marks(L, 1, item);
            return pos;
        }
        lua_getfield(L, -1, "index");
        lua_Integer idx = lua_tointeger(L, -1);
        lua_pop(L, 1);
        read_marks(L, 0, item);
        item->ref = (mg_tref_t){-1, (int)idx - 1};
        return idx >= 1 && idx <= n ? (int)idx - 1 : -1;
    }
    lua_Integer idx = lua_tointeger(L, -1); /* a plain index is accepted too */
    item->ref = (mg_tref_t){-1, (int)idx - 1};
    return idx >= 1 && idx <= n ? (int)idx - 1 : -1;
}

/* Remove what a call wrote into kept views (marks, and anything else but their own fields). */
static void clear_written(mg_trace_t *t)
{
    if (t->n_written == 0) return;
    lua_State *L = t->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->written_ref);
    int w = lua_gettop(L);
    for (int i = 1; i <= t->n_written; i++) {
        lua_rawgeti(L, w, i);
        int v = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, v)) {
            lua_pop(L, 1);
            int keep = lua_type(L, -1) == LUA_TLIGHTUSERDATA;
            if (lua_type(L, -1) == LUA_TSTRING)
                for (int f = CF_PROVIDER; f < CF_N && !keep; f++)
                    keep = (f <= CF_WEIGHT || (CF_STATE_MASK & (1u << f))) &&
                           strcmp(lua_tostring(L, -1), cand_names[f]) == 0;
            if (!keep) {
                lua_pushvalue(L, -1);
                lua_pushnil(L);
                lua_rawset(L, v); /* (clearing a field during lua_next is allowed) */
            }
        }
        lua_pop(L, 1);
        lua_pushnil(L);
        lua_rawseti(L, w, i);
    }
    lua_pop(L, 1);
    t->n_written = 0;
}

int mg_treq_key_set(mg_treq_key_t *k, uint32_t mask, const mg_treq_t *rq)
{
    memset(k, 0, sizeof(*k));
    k->mask = mask;
    k->flags = mg_treq_flags(rq->info) & mask & MG_TREQ_FLAGS;
    for (uint32_t m = mask & ~MG_TREQ_FLAGS; m; m &= m - 1) {
        int rid = __builtin_ctz(m);
        if (!mg_treq_is_str(rid)) {
            k->num[rid] = mg_treq_num(rq, rid);
        } else {
            const char *s = mg_treq_str(rq, rid);
            if (s && !(k->str[rid] = strdup(s))) return -1;
        }
    }
    return 0;
}

/* (short strings, compared in place: a call to strcmp costs more than they do) */
static inline int same_str(const char *a, const char *b)
{
    if (a == b) return 1;
    if (!a || !b) return 0;
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

int mg_treq_key_matches(const mg_treq_key_t *k, const mg_treq_t *rq)
{
    if ((mg_treq_flags(rq->info) & k->mask & MG_TREQ_FLAGS) != k->flags) return 0;
    uint32_t m = k->mask & ~MG_TREQ_FLAGS;
    const uint32_t routing = (1u << RF_PLAN_LIMIT) | (1u << RF_POOL) | (1u << RF_PIN);
    if ((m & routing) == routing) { /* the routing fields every route() key has, first */
        if (k->num[RF_PLAN_LIMIT] != rq->plan_limit || !same_str(k->str[RF_POOL], rq->info->pool) ||
            !same_str(k->str[RF_PIN], rq->info->pin))
            return 0;
        m &= ~routing;
    }
    for (; m; m &= m - 1) {
        int rid = __builtin_ctz(m);
        if (mg_treq_is_str(rid) ? !same_str(k->str[rid], mg_treq_str(rq, rid))
                                : k->num[rid] != mg_treq_num(rq, rid))
            return 0;
    }
    return 1;
}

void mg_treq_key_free(mg_treq_key_t *k)
{
    for (int i = 0; i < RF_N; i++) free(k->str[i]);
    memset(k, 0, sizeof(*k));
}

void mg_tentry_free(mg_tentry_t *e, lua_State *L)
{
    if (!e) return;
    free(e->routes);
    mg_treq_key_free(&e->req);
    free(e->cand_mask);
    free(e->cand_vals);
    free(e->serial);
    free(e->state);
    for (int i = 0; i < e->n_ops; i++) {
        mg_top_t *o = &e->ops[i];
        free(o->refs);
        free(o->wvals);
        free(o->kvals);
        free(o->out);
        free(o->wlast);
        free(o->klast);
        if (L && o->wfn != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, o->wfn);
        if (L && o->kfn != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, o->kfn);
    }
    free(e->ops);
    free(e->guards);
    free(e->eqs);
    free(e->items);
    free(e);
}

/* The entry of the recording that just ended (its steps move into it). */
static mg_tentry_t *make_entry(mg_trace_t *t, int is_list, int wait_ms, const mg_titem_t *items,
                               int n_items)
{
    int n = t->n;
    mg_tentry_t *e = calloc(1, sizeof(*e));
    if (!e) return NULL;
    e->n = n;
    e->routes = malloc((size_t)(n ? n : 1) * sizeof(*e->routes));
    e->cand_mask = calloc((size_t)(n ? n : 1), sizeof(*e->cand_mask));
    e->cand_vals = calloc((size_t)(n ? n : 1) * CF_ALL, sizeof(*e->cand_vals));
    e->serial = calloc((size_t)(n ? n : 1), sizeof(*e->serial));
    e->state = malloc((size_t)(n ? n : 1) * sizeof(*e->state));
    e->items = malloc((size_t)(n_items ? n_items : 1) * sizeof(*e->items));
    e->guards = malloc((size_t)(t->n_guards ? t->n_guards : 1) * sizeof(*e->guards));
    e->eqs = malloc((size_t)(t->n_eqs ? t->n_eqs : 1) * sizeof(*e->eqs));
    int ok = e->routes && e->cand_mask && e->cand_vals && e->serial && e->state && e->items &&
             e->guards && e->eqs;
    if (ok && mg_treq_key_set(&e->req, t->req_mask, &t->rq) != 0) ok = 0;
    for (int i = 0; ok && i < n; i++) {
        const mg_candidate_t *c = &t->cands[i];
        e->routes[i] = c->route;
        e->state[i] = mg_tstate_of(c);
        e->cand_mask[i] = (uint32_t)(t->cand_mask[i] & ~(uint64_t)(CF_CONFIG_MASK | CF_STATE_MASK));
        for (int fid = CF_AVAILABLE; fid < CF_ALL; fid++)
            if (t->cand_mask[i] & (1ull << fid))
                e->cand_vals[(size_t)i * CF_ALL + fid] = cand_value(c, i + 1, fid);
        e->serial[i] = c->serial;
    }
    if (!ok) {
        mg_tentry_free(e, NULL);
        return NULL;
    }
    for (int g = 0; g < t->n_guards; g++) {
        e->guards[g] = t->guards[g];
        int pos = ref_pos(t, t->guards[g].ref);
        e->guards[g].value = pos >= 0 ? cand_value(&t->cands[pos], pos + 1, t->guards[g].fid) : 0;
    }
    e->n_guards = t->n_guards;
    if (t->n_eqs) memcpy(e->eqs, t->eqs, (size_t)t->n_eqs * sizeof(*e->eqs));
    e->n_eqs = t->n_eqs;
    if (n_items) memcpy(e->items, items, (size_t)n_items * sizeof(*items));
    e->n_items = n_items;
    e->is_list = is_list;
    e->wait_ms = wait_ms;
    e->ops = t->ops; /* the steps move over, with their function references */
    e->n_ops = t->n_ops;
    e->n_draws = t->n_draws;
    t->ops = NULL;
    t->n_ops = t->cap_ops = 0;
    return e;
}

mg_tentry_t *mg_trace_end(mg_trace_t *t, int failed, int is_list, int wait_ms,
                          const mg_titem_t *items, int n_items, uint32_t *req_mask)
{
    clear_written(t);
    for (int i = 0; t->slots && i < t->n; i++)
        if (t->slots[i] >= 0 && (size_t)t->slots[i] < t->n_slots) t->pos_of[t->slots[i]] = -1;
    int keep = !failed && t->recording && !t->bad && !t->moving;
    mg_tentry_t *e = NULL;
    if (req_mask) *req_mask = keep ? t->req_mask : UINT32_MAX;
    else if (keep) e = make_entry(t, is_list, wait_ms, items, n_items);
    if (!e) ops_clear(t);
    t->active = t->recording = 0;
    return e;
}

int mg_trace_answer(mg_trace_t *t, const mg_treq_t *rq, int fn_ref, const void *fn_id,
                    const mg_candidate_t *c, long slot, int pos, void **hint, int *has,
                    double *value)
{
    if (slot < 0 || (size_t)slot >= t->n_slots) return -1;
    memo_t *m = *hint;
    memo_t *own = &t->memos[(size_t)slot * MEMOS_PER_SLOT];
    if (!m || m < own || m >= own + MEMOS_PER_SLOT || m->fn != fn_id) m = memo_find(t, slot, fn_id);
    *hint = m;
    if (m && memo_holds(m, c, pos + 1)) {
        m->used = ++t->memo_clock;
        *has = m->has;
        *value = m->value;
        return 0;
    }
    lua_State *L = t->L;
    int top0 = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->views_ref);
    if (lua_rawgeti(L, -1, slot + 1) == LUA_TTABLE) set_state(L, c, &t->facts[slot]);
    lua_settop(L, top0);
    t->facts[slot] = *c; /* what its view shows now */
    t->index[slot] = pos + 1;
    t->serial++; /* places of earlier calls are another call's now */
    t->active = 1;
    t->recording = 0;
    t->rq = *rq;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->views_ref);
    int have_view = lua_rawgeti(L, -1, slot + 1) == LUA_TTABLE;
    lua_settop(L, top);
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
    int rc = have_view ? ask(t, L, top + 1, slot, has, value) : -1;
    *hint = memo_find(t, slot, fn_id);
    lua_settop(L, top);
    t->active = 0;
    return rc;
}
