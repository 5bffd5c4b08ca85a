/* trace: what a policy's call read, so that the core can tell when its answer holds again.
 *
 * route(req, candidates) and an adapter's encode(req, route) are handed views instead of
 * plain tables: `req` and each candidate are tables whose reads go through a metamethod into
 * C, which answers from the request and the route's facts and notes which field was read. A
 * candidate's config fields (provider, model, pool, local, smaller, priority, weight) never
 * change within a generation and sit in its view as plain fields: reading them costs nothing
 * and needs no note; nor does its state that changes now and then (available, cooling,
 * health, the breakers, ...: CF_STATE_MASK), brought up to date at each call and part of
 * every key. The request's routing fields (pool, pin, local_only,
 * allow_smaller_model, allow_cloud, local_first, plan_limit) sit in its view too and are part
 * of every key (they rarely differ between requests, and a plan mostly depends on them); its
 * other fields are noted when read (and then kept in the view: read once, noted once). The moongate
 * module's ordering steps (lmod.h: draw, chance, weighted_order, sort_by) are recorded too, with
 * the functions they were given; their results are views of "place j of step k", so that what the
 * policy then reads of them is noted against the place, not against whichever route happened to be
 * there.
 *
 * A finished recording becomes an entry (below): the fields read and their values (the key),
 * the steps, the checks on the steps' results (guards), and the plan as places and marks.
 * replay.h gives the entry again for a later request whose key is the same, running the
 * steps in C with that request's own numbers. A recording that read a number that moves with
 * every request outside a step (req.random, headroom, in_flight, samples, ...) is not worth
 * keeping and is dropped; one that cannot be followed at all (a view of another call, a
 * function with a clock, a request table written to) is dropped as well. The keep (keep.h)
 * owns the entries; this file owns the views and the recorder. */
#ifndef MG_TRACE_H
#define MG_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "luavm/luavm.h"
#include "luavm/lmod.h"

/* Fields of a candidate view. The config fields come first (CF_WEIGHT the last of them), then
 * the facts; CF_LOAD stands for the load table, whose three numbers are noted as one. */
enum {
    CF_INDEX,
    CF_PROVIDER,
    CF_MODEL,
    CF_POOL,
    CF_LOCAL,
    CF_SMALLER,
    CF_PRIORITY,
    CF_WEIGHT,
    CF_AVAILABLE,
    CF_COOLING,
    CF_COOLDOWN_REMAINING_MS,
    CF_CONSECUTIVE_429,
    CF_OBSERVING,
    CF_TRIAL,
    CF_RPM_LIMIT,
    CF_RPM_USED,
    CF_TPM_LIMIT,
    CF_TPM_USED,
    CF_HEADROOM,
    CF_IN_FLIGHT,
    CF_HEALTH,
    CF_BREAKER,
    CF_ROUTE_BREAKER,
    CF_AVAIL_SAMPLES,
    CF_TTFT_SAMPLES,
    CF_SUCCESS_RATE,
    CF_TTFT_MS,
    CF_LOAD,
    CF_N
};
/* The load's kv_cache: noted with CF_LOAD (no field of that name). */
#define CF_LOAD_KV CF_N
#define CF_ALL (CF_N + 1)
#define CF_CONFIG_MASK ((1u << (CF_WEIGHT + 1)) - 1)
/* A candidate's state that changes now and then (not with every request): plain fields of its
 * view, brought up to date at each call, and part of every key (route()'s and its step
 * functions' answers): a read of them costs no call into C. */
#define CF_STATE_MASK                                                                              \
    ((1u << CF_AVAILABLE) | (1u << CF_COOLING) | (1u << CF_CONSECUTIVE_429) |                      \
     (1u << CF_OBSERVING) | (1u << CF_TRIAL) | (1u << CF_RPM_LIMIT) | (1u << CF_TPM_LIMIT) |       \
     (1u << CF_HEALTH) | (1u << CF_BREAKER) | (1u << CF_ROUTE_BREAKER))
/* Facts that move from one request to the next: a plan that read one of them outside a step
 * would hardly ever hold again. */
#define CF_MOVING_MASK                                                                             \
    ((1u << CF_COOLDOWN_REMAINING_MS) | (1u << CF_RPM_USED) | (1u << CF_TPM_USED) |                \
     (1u << CF_HEADROOM) | (1u << CF_IN_FLIGHT) | (1u << CF_AVAIL_SAMPLES) |                       \
     (1u << CF_TTFT_SAMPLES) | (1u << CF_SUCCESS_RATE) | (1u << CF_TTFT_MS) | (1u << CF_LOAD))

/* A candidate's state fields (CF_STATE_MASK), compared at once. */
typedef struct mg_tstate_s {
    int available, cooling, observing, trial, consecutive_429, rpm_limit;
    long long tpm_limit;
    const char *health, *breaker, *route_breaker; /* state names */
} mg_tstate_t;

static inline mg_tstate_t mg_tstate_of(const mg_candidate_t *c)
{
    return (mg_tstate_t){c->available != 0,  c->cooling != 0, c->observing != 0, c->trial != 0,
                         c->consecutive_429, c->rpm_limit,    c->tpm_limit,      c->health,
                         c->breaker,         c->route_breaker};
}

static inline int mg_tstate_same_str(const char *a, const char *b)
{
    return a == b || (a && b && __builtin_strcmp(a, b) == 0);
}

static inline int mg_tstate_equal(const mg_tstate_t *a, const mg_candidate_t *c)
{
    return a->available == (c->available != 0) && a->cooling == (c->cooling != 0) &&
           a->observing == (c->observing != 0) && a->trial == (c->trial != 0) &&
           a->consecutive_429 == c->consecutive_429 && a->rpm_limit == c->rpm_limit &&
           a->tpm_limit == c->tpm_limit && mg_tstate_same_str(a->health, c->health) &&
           mg_tstate_same_str(a->breaker, c->breaker) &&
           mg_tstate_same_str(a->route_breaker, c->route_breaker);
}

/* Fields of the request view. */
enum {
    RF_REQUEST_ID,
    RF_ENDPOINT,
    RF_MODEL,
    RF_STREAM,
    RF_MAX_TOKENS,
    RF_CREATED,
    RF_PRIORITY,
    RF_POOL,
    RF_PIN,
    RF_LOCAL_ONLY,
    RF_ALLOW_SMALLER,
    RF_ALLOW_CLOUD,
    RF_LOCAL_FIRST,
    RF_RANDOM,
    RF_ATTEMPT,
    RF_PLAN_LIMIT,
    RF_BODY,
    RF_N
};
/* The request's routing fields: plain fields of a route() call's request view, in every key. */
#define RF_ROUTING_MASK                                                                            \
    ((1u << RF_POOL) | (1u << RF_PIN) | (1u << RF_LOCAL_ONLY) | (1u << RF_ALLOW_SMALLER) |         \
     (1u << RF_ALLOW_CLOUD) | (1u << RF_LOCAL_FIRST) | (1u << RF_PLAN_LIMIT))
/* The request's own fields: a call that read one is never kept. */
#define RF_OWN_MASK                                                                                \
    ((1u << RF_REQUEST_ID) | (1u << RF_CREATED) | (1u << RF_RANDOM) | (1u << RF_BODY))

/* What a request view answers beside the request's own info. */
typedef struct mg_treq_s {
    const mg_lua_req_t *info;
    int attempt;
    int plan_limit; /* 0: nil */
} mg_treq_t;

/* A request field's value: a string (request_id, endpoint, model, priority, pool, pin; NULL
 * for nil) or a number (the others; max_tokens -1 and plan_limit 0 for nil). */
static inline int mg_treq_is_str(int rid)
{
    return rid == RF_REQUEST_ID || rid == RF_ENDPOINT || rid == RF_MODEL || rid == RF_PRIORITY ||
           rid == RF_POOL || rid == RF_PIN;
}

static inline const char *mg_treq_str(const mg_treq_t *rq, int rid)
{
    const mg_lua_req_t *r = rq->info;
    switch (rid) {
    case RF_REQUEST_ID: return r->request_id;
    case RF_ENDPOINT: return r->endpoint;
    case RF_MODEL: return r->model;
    case RF_PRIORITY: return r->priority ? r->priority : "P2";
    case RF_POOL: return r->pool;
    case RF_PIN: return r->pin;
    default: return NULL;
    }
}

static inline long long mg_treq_num(const mg_treq_t *rq, int rid)
{
    const mg_lua_req_t *r = rq->info;
    switch (rid) {
    case RF_STREAM: return r->stream != 0;
    case RF_MAX_TOKENS: return r->max_tokens < 0 ? -1 : r->max_tokens;
    case RF_CREATED: return r->created;
    case RF_LOCAL_ONLY: return r->local_only != 0;
    case RF_ALLOW_SMALLER: return r->allow_smaller_model != 0;
    case RF_ALLOW_CLOUD: return r->allow_cloud != 0;
    case RF_LOCAL_FIRST: return r->local_first != 0;
    case RF_ATTEMPT: return rq->attempt;
    case RF_PLAN_LIMIT: return rq->plan_limit;
    default: return 0;
    }
}

/* The values of some request fields (mask): what a kept answer was made from. */
typedef struct mg_treq_key_s {
    uint32_t mask;
    uint32_t flags;  /* the boolean fields in mask (MG_TREQ_FLAGS), as mg_treq_flags gives them */
    char *str[RF_N]; /* owned copies (string fields) */
    long long num[RF_N];
} mg_treq_key_t;

/* The boolean request fields, compared at once. */
#define MG_TREQ_FLAGS                                                                              \
    ((1u << RF_STREAM) | (1u << RF_LOCAL_ONLY) | (1u << RF_ALLOW_SMALLER) |                        \
     (1u << RF_ALLOW_CLOUD) | (1u << RF_LOCAL_FIRST))

/* The request's boolean fields as bits at their field numbers. */
static inline uint32_t mg_treq_flags(const mg_lua_req_t *r)
{
    return (uint32_t)(r->stream != 0) << RF_STREAM |
           (uint32_t)(r->local_only != 0) << RF_LOCAL_ONLY |
           (uint32_t)(r->allow_smaller_model != 0) << RF_ALLOW_SMALLER |
           (uint32_t)(r->allow_cloud != 0) << RF_ALLOW_CLOUD |
           (uint32_t)(r->local_first != 0) << RF_LOCAL_FIRST;
}

/* Copy the fields in mask from rq; 0, or -1 when out of memory. */
int mg_treq_key_set(mg_treq_key_t *k, uint32_t mask, const mg_treq_t *rq);
/* Whether rq has those values. */
int mg_treq_key_matches(const mg_treq_key_t *k, const mg_treq_t *rq);
void mg_treq_key_free(mg_treq_key_t *k);

/* A candidate in a recording: position i of the call's list (op < 0), or place i of step
 * op's result. */
typedef struct mg_tref_s {
    int32_t op, i;
} mg_tref_t;

/* A field's value as a number that compares exactly (strings by address: they are the
 * config's or the state names: mg_trace_value_equal compares them), for fid < CF_ALL;
 * index is CF_INDEX's value. */
uint64_t mg_trace_cand_value(const mg_candidate_t *c, int index, int fid);
/* Whether two values of field fid are the same (strings: the same text). */
int mg_trace_value_equal(int fid, uint64_t a, uint64_t b);
/* The load table's numbers as one value (CF_LOAD). */
uint64_t mg_trace_load_value(const mg_candidate_t *c);

typedef enum { MG_TOP_DRAW, MG_TOP_CHANCE, MG_TOP_ORDER } mg_top_kind_t;

/* A step's last answer for one of its values (replay.c): the candidate and description it
 * was for. */
typedef struct mg_tlast_s {
    void *memo; /* where trace.c keeps that answer (mg_trace_answer's hint) */
    int pos;    /* -1: none yet */
    int has;
    double value;
    uint64_t serial; /* 0: not reusable */
} mg_tlast_t;

/* One step: a draw made from the request, a chance() asked of it, or an order. */
typedef struct mg_top_s {
    mg_top_kind_t kind;
    int draw; /* DRAW: its number; CHANCE, ORDER: the draw used (-1: u and
                 seed given) */
    double p; /* CHANCE */
    int result;
    int weighted; /* ORDER: weighted_order (1) or sort_by (0) */
    size_t n;
    mg_tref_t *refs; /* owned: the list's n values */
    mg_spec_kind_t wkind, kkind;
    double *wvals, *kvals;       /* owned, MG_SPEC_LIST: the values as given */
    int wfn, kfn;                /* MG_SPEC_FN: registry references to the functions */
    const void *wfn_id, *kfn_id; /* ... and the functions themselves (their answers are kept
                                    per function and candidate: mg_trace_answer) */
    mg_tlast_t *wlast, *klast;   /* owned (replay.c, made on first use): per value */
    double u;
    uint64_t seed;
    long limit; /* -1: none */
    size_t out_n;
    int *out; /* owned: positions (into the call's list) of the result */
} mg_top_t;

/* Something read of a place of a step's result: its value then. */
typedef struct mg_tguard_s {
    mg_tref_t ref;
    int fid;
    uint64_t value;
} mg_tguard_t;

/* Whether two views were the same candidate (==). */
typedef struct mg_teq_s {
    mg_tref_t a, b;
    int same;
} mg_teq_t;

/* One entry of the plan: where it came from and its marks. */
typedef struct mg_titem_s {
    mg_tref_t ref;
    const char *degraded; /* static */
    int emergency;
} mg_titem_t;

/* A finished recording of route(). */
typedef struct mg_tentry_s {
    int n;                          /* the candidates: n routes */
    const mg_route_conf_t **routes; /* owned array */
    mg_treq_key_t req;              /* the request fields read, and their values */
    mg_tstate_t *state;             /* owned: per position, the state (always in the key) */
    uint32_t *cand_mask;            /* owned: per position, the other facts read */
    uint64_t *cand_vals;            /* owned: per position, CF_ALL values */
    uint64_t *serial;               /* owned: per position, the description it last held for
                                       (0: compare the fields) */
    mg_top_t *ops;                  /* owned */
    int n_ops, n_draws;
    mg_tguard_t *guards; /* owned */
    int n_guards;
    mg_teq_t *eqs; /* owned */
    int n_eqs;
    int is_list; /* the plan was a list (else {wait_ms} or {}) */
    int wait_ms;
    mg_titem_t *items; /* owned */
    int n_items;
} mg_tentry_t;

/* Free an entry and unreference its functions in L (NULL: the state is gone already). */
void mg_tentry_free(mg_tentry_t *e, lua_State *L);

/* ---- views and the recorder ------------------------------------------------------------ */

typedef struct mg_trace_s mg_trace_t;

/* The recorder of a generation's state L, for n_slots config routes (keep.h numbers them);
 * dirty_ref: the request tables' mark of "written by Lua" (reqtab.h). NULL when out of
 * memory. */
mg_trace_t *mg_trace_new(lua_State *L, size_t n_slots, int dirty_ref, const mg_ljson_t *json);
void mg_trace_free(mg_trace_t *t);
/* The hooks the moongate module calls while a recording runs (set them in mg_lmod_t). */
const mg_lmod_hooks_t *mg_trace_hooks(mg_trace_t *t);

/* Begin a route() call over cands (n of them, slots[i] their routes' slots in the keep, -1
 * for one it does not know), the request's real table at req_ref: pushes the request view
 * and the candidates list. record: whether to record (the call's answer may be kept). */
void mg_trace_begin_route(mg_trace_t *t, const mg_treq_t *rq, int req_ref,
                          const mg_candidate_t *cands, int n, const long *slots, int record);
/* Begin an encode() call: pushes the request view. */
void mg_trace_begin_encode(mg_trace_t *t, const mg_treq_t *rq, int req_ref);

/* Read the plan entry at the top of the stack (a candidate view, a place, a table with an
 * index or an index): its position in the call's list (or -1: not a candidate) and marks
 * into *item. */
int mg_trace_plan_item(mg_trace_t *t, int n, mg_titem_t *item);

/* End the call (failed: it raised or gave no plan). For route(), when the recording is worth
 * keeping, returns a new entry (the caller owns it) with the plan items given; else NULL.
 * Clears the marks the call left on candidate views. For encode(), returns NULL and sets
 * *req_mask to the request fields read, or to all of them when the answer must not be
 * kept. */
mg_tentry_t *mg_trace_end(mg_trace_t *t, int failed, int is_list, int wait_ms,
                          const mg_titem_t *items, int n_items, uint32_t *req_mask);

/* A step's function's answer about the candidate c (slot, at position pos of the current
 * call): the kept one while the facts of c it read are the same, else asked (fn_ref/fn_id:
 * the function) and kept. *has: it answered a number (*value). *hint (NULL at first) is
 * where the answer was kept the last time: looked at first. 0, or -1 when it raised. */
int mg_trace_answer(mg_trace_t *t, const mg_treq_t *rq, int fn_ref, const void *fn_id,
                    const mg_candidate_t *c, long slot, int pos, void **hint, int *has,
                    double *value);

#endif
