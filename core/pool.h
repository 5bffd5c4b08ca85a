/* pool: the runtime state of providers, kept across reloads by provider id.
 *
 * Configuration says what a provider is; this says how it is doing: requests in
 * flight, recent failures, whether routing should consider it available. A
 * generation swap keeps the state of providers that still exist and adds fresh
 * state for new ones. */
#ifndef MG_POOL_H
#define MG_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct mg_provider_state_s {
    char *id;                  /* owned */
    int in_flight;             /* upstream attempts in progress */
    int consecutive_failures;  /* connect errors, 429 and 5xx in a row */
    uint64_t requests_total;   /* attempts started */
    uint64_t failures_total;   /* attempts that failed */
    int disabled;              /* taken out of routing by an operator */
} mg_provider_state_t;

typedef struct mg_pool_s {
    mg_provider_state_t *items; /* owned array */
    size_t n;
} mg_pool_t;

void mg_pool_init(mg_pool_t *p);
/* Make the state set match cfg's providers, keeping existing state by id.
 * Returns 0 or -1 (out of memory; the pool is unchanged). */
int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg);
/* State for provider id, or NULL. */
mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id);
/* Whether routing may use the provider now. */
int mg_pool_available(const mg_provider_state_t *s);
void mg_pool_record(mg_provider_state_t *s, int success);
void mg_pool_free(mg_pool_t *p);

#endif
