/* reqtab: the request tables handed to route(), encode(), decode() and decode_event().
 *
 * Building one (a table, fourteen new keys) was the largest Lua cost of a request, so they are
 * recycled: a request that ends puts its table on the generation's free list and the next one
 * rewrites the same fields in it (mg_gen_req_new, mg_gen_req_release in luavm.h). A table to
 * which Lua code wrote a field of its own carries a mark (the registry reference
 * g->req_dirty_ref is its key) and is dropped instead, as is one whose metatable was
 * replaced: no request ever sees another's fields. trace.c sets the same mark when Lua
 * writes through a request view, so that a written table is never recorded again. */
#ifndef MG_REQTAB_H
#define MG_REQTAB_H

#include <stddef.h>

#include "luavm/luavm.h"

/* Compile the request tables' fill(), metatable and mark into g (at load). 0 or -1. */
int mg_reqtab_load(mg_gen_t *g, char *err, size_t errlen);

#endif
