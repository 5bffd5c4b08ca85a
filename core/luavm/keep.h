/* keep: what the core keeps around the Lua boundary so that Lua stays off the request path,
 * under one rule: a kept thing is given again only while what it was made from is unchanged.
 *
 *   route descriptions  a config route's facts for routing (route/facts.c describes them),
 *                       kept under the stamp they were made from: the loop's millisecond,
 *                       the provider's and the route's state versions, the pool's epoch;
 *   routing plans       route()'s answer, kept under the values of exactly the request
 *                       fields and candidate facts that route() read (trace.h), its ordering
 *                       steps run again for each request (replay.h); a few per model;
 *   encode answers      an adapter's encode(req, route) without a body, kept per route
 *                       under the values of the request fields it read.
 *
 * A policy or adapter that is a pure function of its arguments is kept without saying
 * anything; one that reads a request's own fields (request_id, created, random, body) or a
 * number that moves with every request outside a moongate step is simply asked every time.
 * Everything lives in one generation: a reload starts with nothing kept. */
#ifndef MG_KEEP_H
#define MG_KEEP_H

#include <stddef.h>
#include <stdint.h>

#include "conf/config.h"
#include "luavm/luavm.h"
#include "luavm/replay.h"

typedef struct mg_keep_s mg_keep_t;

/* The keep of a generation's config with n_adapters adapters; NULL when out of memory. */
mg_keep_t *mg_keep_new(const mg_config_t *cfg, size_t n_adapters);
/* Free it; L: the generation's state, to drop the plans' function references (NULL when the
 * state is closed already). */
void mg_keep_free(mg_keep_t *k, lua_State *L);

/* The number of the config route r (its slot: 0 .. mg_keep_slots() - 1), or -1 for a route
 * the config does not list. */
long mg_keep_slot(mg_keep_t *k, const mg_route_conf_t *r);
size_t mg_keep_slots(const mg_keep_t *k);

/* ---- route descriptions ---------------------------------------------------------------- */

#define MG_KEEP_STAMP 4

/* The kept description of slot when it was made from stamp: 1 with *out (its serial set), or
 * 0. */
int mg_keep_facts_get(mg_keep_t *k, long slot, const uint64_t stamp[MG_KEEP_STAMP],
                      mg_candidate_t *out);
/* Keep c (a fresh description of slot, made from stamp), giving it its serial (c->serial):
 * the kept description's when c says the same (so that what is kept for it holds without a
 * look at the fields), else a number no other description has. slot < 0: only the serial. */
void mg_keep_facts_put(mg_keep_t *k, long slot, const uint64_t stamp[MG_KEEP_STAMP],
                       mg_candidate_t *c);
/* Descriptions made and given again so far (for tests and profiling). */
void mg_keep_facts_counts(const mg_keep_t *k, uint64_t *described, uint64_t *kept);

/* ---- routing plans --------------------------------------------------------------------- */

/* The slots of cands into slots (room for n); returns 1 when a plan for them may be kept:
 * distinct config routes of one model. A candidate without a slot (or a route given twice)
 * gets -1. */
int mg_keep_slots_of(mg_keep_t *k, const mg_candidate_t *cands, int n, long *slots);
/* Room for n slots; NULL when out of memory. */
long *mg_keep_slots_scratch(mg_keep_t *k, int n);

/* A kept plan for this request and these candidates (slots from mg_keep_slots_of): 1 with
 * plan filled, else 0 (ask route()). May call Lua (trace.h: a step's function asked again). */
int mg_keep_plan_find(mg_keep_t *k, mg_trace_t *t, const mg_treq_t *rq, const mg_candidate_t *cands,
                      int n, const long *slots, mg_plan_t *plan);
/* Keep entry e (ownership moves) for the model of these slots, in place of its least
 * recently used one. */
void mg_keep_plan_put(mg_keep_t *k, lua_State *L, const long *slots, int n, mg_tentry_t *e);

/* ---- encode answers -------------------------------------------------------------------- */

/* The kept answer of adapter for provider p's upstream model, for this request: 1 with *out
 * (a fresh copy the caller owns), 0 none, -1 out of memory (err set). */
int mg_keep_encode_find(mg_keep_t *k, int adapter, const mg_provider_conf_t *p, const char *model,
                        const mg_treq_t *rq, mg_encoded_t *out, char *err, size_t errlen);
/* Keep an answer without a body, made from the request fields in req_mask (best effort: out
 * of memory, or MG_KEEP_ENCODE_MAX answers for the adapter already, keeps nothing). */
#define MG_KEEP_ENCODE_MAX 64
void mg_keep_encode_put(mg_keep_t *k, int adapter, const mg_provider_conf_t *p, const char *model,
                        uint32_t req_mask, const mg_treq_t *rq, const mg_encoded_t *enc);

#endif
