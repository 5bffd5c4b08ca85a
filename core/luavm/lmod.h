/* lmod: the `moongate` C module that policies and adapters may call (lua/README.md, "The
 * library"): time, logging, JSON, SHA-256, and the mechanism the routing policy orders with:
 * sort_by, weighted_order and the request's random draws (draw, draw:chance).
 *
 * The same code runs in two places. Inside the gateway, every generation opens it in its Lua
 * state (mg_lmod_open) with hooks that let the core's trace (trace.h) learn what a route()
 * being recorded asked the mechanism, so that the core can later replay those steps in C
 * with a new request's numbers, without Lua. Outside the gateway, CMake builds it as the
 * Lua module moongate.so (luaopen_moongate, no hooks), which the busted specs require: the
 * policies are tested against the very mechanism they run on. */
#ifndef MG_LMOD_H
#define MG_LMOD_H

#include <stddef.h>
#include <stdint.h>

#include "luavm/json.h"
#include "luavm/order.h"

typedef struct lua_State lua_State;

/* How a weighted_order / sort_by call was given its weights or keys. */
typedef enum { MG_SPEC_NONE = 0, MG_SPEC_LIST, MG_SPEC_FN } mg_spec_kind_t;

/* One call of weighted_order or sort_by, as the module understood it (for the hooks). */
typedef struct mg_order_call_s {
    int weighted; /* weighted_order (1) or sort_by (0) */
    int list;     /* stack index of the list */
    size_t n;     /* its length */
    mg_spec_kind_t weight_kind, key_kind;
    int weight_fn, key_fn;      /* stack indexes of the functions (MG_SPEC_FN) */
    const double *weights;      /* n weights as used (NULL: all 1) */
    const double *keys;         /* n keys as used (NULL: none, or not every value had one) */
    int draw_id;                /* the draw's number in the recording; -1: u and seed given */
    double u;                   /* the first draw */
    uint64_t seed;              /* the stream of the others */
    long limit;                 /* -1: none */
    const mg_order_item_t *out; /* the result, out_n positions (from 1) into the list */
    size_t out_n;
} mg_order_call_t;

/* What the recording of a route() call learns from the module (trace.c implements them).
 * Each one is called only while ud's recording runs. */
typedef struct mg_lmod_hooks_s {
    void *ud;
    /* moongate.draw(req) with the value at stack index req: 1 with *random (the request's
     * draw, read without a field read) and *id (the draw's number) when req is the request
     * being recorded; 0 otherwise (the module then reads req.random as any field). */
    int (*draw)(void *ud, lua_State *L, int req, double *random, int *id);
    /* draw id's chance(p) answered result. */
    void (*chance)(void *ud, int id, double p, int result);
    /* A function whose answer the recording cannot replay ran (now_ms, log). */
    void (*impure)(void *ud);
    /* An order call over the list at stack index list (n values) begins: its number, or -1
     * when the recording cannot follow it (it still runs). */
    int (*order_begin)(void *ud, lua_State *L, int list, size_t n);
    /* Push fn(value i of list) (i from 1), fn at stack index fn, for order op's weights
     * (which = 0) or keys (1); raises what fn raises. */
    void (*eval)(void *ud, lua_State *L, int op, int which, int fn, int list, size_t i);
    /* Order op is done (call says how and what it gave). */
    void (*order_end)(void *ud, lua_State *L, int op, const mg_order_call_t *call);
    /* Push the value for place j (from 1) of op's result, which is value pos of the list. */
    void (*push_result)(void *ud, lua_State *L, int op, int list, int pos, size_t j);
} mg_lmod_hooks_t;

typedef struct mg_lmod_s {
    mg_ljson_t json;              /* util.null and util.array_mt */
    const mg_lmod_hooks_t *hooks; /* borrowed; NULL when nothing is being recorded */
    mg_order_item_t *scratch;     /* owned: 3 x cap items */
    size_t cap;
} mg_lmod_t;

#define MG_LUA_API_VERSION 1

/* Open the module in L for a generation: package.loaded.moongate, with m (which must outlive
 * L) as its state. */
void mg_lmod_open(lua_State *L, mg_lmod_t *m);
/* Free m's scratch (the state itself is the caller's). */
void mg_lmod_free(mg_lmod_t *m);

/* The standalone module (moongate.so): require("moongate") outside the gateway. */
int luaopen_moongate(lua_State *L);

#endif
