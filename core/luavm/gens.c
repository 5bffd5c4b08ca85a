/* gens: the current generation; see gens.h. */
#include "luavm/gens.h"

#include <stddef.h>

mg_gen_t *mg_gens_acquire(mg_gens_t *g)
{
    mg_gen_ref(g->current);
    return g->current;
}

void mg_gens_swap(mg_gens_t *g, mg_gen_t *next)
{
    mg_gen_t *old = g->current;
    g->current = next;
    if (old) mg_gen_unref(old); /* freed now, or when its last request ends */
}

void mg_gens_close(mg_gens_t *g)
{
    mg_gens_swap(g, NULL);
}
