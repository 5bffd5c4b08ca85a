/* persist: the provider state that survives a restart, cooldowns and health, logged when it
 * changes, written through the store's writer thread (the loop never waits for the disk) and
 * read back at start-up. Loop thread; st may be NULL (no store: logged only). */
#ifndef MG_PERSIST_H
#define MG_PERSIST_H

#include <stdint.h>

#include "route/pool.h"
#include "store/store.h"

/* A provider entered cooldown after an answer with `status` (its consecutive-429 count and
 * the seconds the policy gave): a log line, a cooldown_events row and its provider_state
 * row. now_ms is loop time. */
void mg_persist_cooldown(mg_store_t *st, const mg_provider_state_t *ps, int consecutive,
                         double seconds, int status, uint64_t now_ms);

/* An operator cleared a provider's cooldown (admin API): a log line and its provider_state
 * row back to no cooldown and no 429 count. */
void mg_persist_cooldown_cleared(mg_store_t *st, const mg_provider_state_t *ps);

/* A provider's health state changed: a log line and its provider_health row. */
void mg_persist_health(mg_store_t *st, const mg_provider_state_t *ps);

/* A circuit breaker after an attempt's outcome went in (model "" for the provider's own,
 * else the route's upstream model); was and was_until are its state and open_until_ms from
 * before. One that opened, or opened again, is stored with the unix time its open period
 * ends; one that closed is deleted. Nothing else is written. */
void mg_persist_breaker(mg_store_t *st, const char *provider, const char *model,
                        const mg_breaker_t *b, mg_breaker_state_t was, uint64_t was_until,
                        uint64_t now_ms);

/* Cooldowns, health and open breakers back into the pool's providers, before serving. now_ms is
 * loop time. A failed read is logged; the providers then start fresh. */
void mg_persist_restore(mg_store_t *st, mg_pool_t *pool, uint64_t now_ms);

#endif
