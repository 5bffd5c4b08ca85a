/* replay: a kept route() answer given again, without calling route().
 *
 * An entry (trace.h) holds for a request when every field the recorded call read has the
 * value it had then (mg_replay_matches). The answer is then the recorded one, but for what the
 * call left to the moongate module's steps: those run again here, in C, with this request's
 * numbers: its random draws, the functions' answers (kept per function and candidate by
 * trace.c, asked again only when the facts they read changed), the orders themselves (order.c, the
 * code the module runs). What the call read of a step's result must read the same again (the
 * guards); if it does not, the entry does not hold and route() is asked. */
#ifndef MG_REPLAY_H
#define MG_REPLAY_H

#include "luavm/trace.h"

/* Scratch a replay of n candidates needs: 3 x n order items, n ints, n bytes. */
typedef struct mg_replay_scratch_s {
    mg_order_item_t *items;
    int *pos;
    unsigned char *seen;
    size_t cap;
} mg_replay_scratch_t;

/* Room for n candidates; 0 or -1. */
int mg_replay_scratch_reserve(mg_replay_scratch_t *s, size_t n);
void mg_replay_scratch_free(mg_replay_scratch_t *s);

/* Whether e's key holds: the same routes, the same values of the request fields and
 * candidate facts it read. */
int mg_replay_matches(mg_tentry_t *e, const mg_treq_t *rq, const mg_candidate_t *cands, int n);

/* Run e's steps for this request (after mg_replay_matches said yes) and fill
 * plan (entries: room for n). Returns 1 when it holds, 0 when a step's result reads
 * otherwise (ask route()), -1 when a step's function raised (ditto: route() will say so).
 * slots: the candidates' slots (trace.h). */
int mg_replay_run(mg_tentry_t *e, mg_trace_t *t, const mg_treq_t *rq, const mg_candidate_t *cands,
                  int n, const long *slots, mg_replay_scratch_t *s, mg_plan_t *plan);

#endif
