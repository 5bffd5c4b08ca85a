/* spendhold: the spend reserved by requests in flight, per key, project and tenant.
 *
 * A spend limit is checked against what was spent in the period plus what requests still
 * running may spend: each one holds its estimated cost (the prompt's tokens x the input price
 * + its max_tokens x the output price, tenancy/cost.h) from admission until it is charged
 * its actual cost or ends without one. The holds live here rather than in the auth levels
 * (auth.c keeps a key's level at 56 bytes, one per loaded key): only the few keys, projects
 * and tenants with requests in flight have an entry, and it goes when their last hold does.
 *
 * A sorted array of (scope, id) -> (micros held, holds): lookups are binary searches; an
 * entry is inserted at a request's admission only when its owner had none in flight. Loop
 * thread only, no locks. */
#ifndef MG_SPENDHOLD_H
#define MG_SPENDHOLD_H

#include <stddef.h>
#include <stdint.h>

typedef enum { MG_SPEND_KEY = 0, MG_SPEND_PROJECT = 1, MG_SPEND_TENANT = 2 } mg_spend_scope_t;

typedef struct mg_spend_hold_s {
    uint64_t key;   /* scope << 62 | id */
    int64_t micros; /* held by the holds below */
    uint32_t holds; /* requests holding; the entry goes at 0 */
} mg_spend_hold_t;

typedef struct mg_spend_holds_s {
    mg_spend_hold_t *e; /* owned, sorted by key */
    size_t n, cap;
} mg_spend_holds_t;

/* Micros held for (scope, id) now; 0 when nothing is. */
int64_t mg_spend_held(const mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id);

/* One more hold of micros (>= 0) for (scope, id). 0, or -1 when out of memory (nothing
 * held). */
int mg_spend_hold(mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id, int64_t micros);

/* Give back one hold of micros for (scope, id) (as held before; an absent entry is left
 * alone). */
void mg_spend_unhold(mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id, int64_t micros);

/* Entries in flight (tests, memory reports). */
size_t mg_spend_holders(const mg_spend_holds_t *h);

void mg_spend_holds_free(mg_spend_holds_t *h);

#endif
