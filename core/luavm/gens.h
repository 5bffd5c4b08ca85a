/* gens: the current generation, as the request path and the background work see it.
 *
 * One holder per process (the server owns it). A request takes a reference on the
 * generation current when it starts and keeps it to its end (mg_gens_acquire), so a reload
 * never changes the rules under a running request; background readers that finish within
 * one loop callback (probes, status pages) borrow the current one (mg_gens_current). A
 * swap (mg_gens_swap) makes the new generation current and drops the holder's reference on
 * the old one, which is freed when its last request ends. Loop thread only. */
#ifndef MG_GENS_H
#define MG_GENS_H

#include "luavm/luavm.h"

typedef struct mg_gens_s {
    mg_gen_t *current; /* one reference held; NULL before the first load and after close */
    unsigned next_id;  /* the id the next generation built gets */
} mg_gens_t;

/* The current generation with a reference taken for the caller (mg_gen_unref when done). */
mg_gen_t *mg_gens_acquire(mg_gens_t *g);

/* The current generation, borrowed until the caller returns to the loop. */
static inline mg_gen_t *mg_gens_current(const mg_gens_t *g)
{
    return g->current;
}

/* Make next current (the holder takes over the caller's reference) and drop the holder's
 * reference on the previous one. */
void mg_gens_swap(mg_gens_t *g, mg_gen_t *next);

/* Drop the holder's reference; current is NULL afterwards. */
void mg_gens_close(mg_gens_t *g);

#endif
