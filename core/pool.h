/* pool: the runtime state of providers, kept across reloads by provider id.
 *
 * Configuration says what a provider is; this says how it is doing: its rate
 * windows (limiter), cooldown, circuit breaker, passive health, engine load and
 * counters. A generation swap keeps the state of providers that still exist
 * (applying new limits) and adds fresh state for new ones. All of it lives on the
 * loop thread: selecting a provider and reserving its capacity is one step. */
#ifndef MG_POOL_H
#define MG_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "health.h"
#include "limiter.h"

typedef struct mg_engine_load_s {
    int known;        /* the engine reported load at least once */
    int running;      /* requests being generated */
    int waiting;      /* requests queued in the engine */
    double kv_cache;  /* KV-cache usage 0..1, or -1 when unknown */
    uint64_t at_ms;   /* when it was read */
} mg_engine_load_t;

typedef struct mg_provider_state_s {
    char *id;                  /* owned */
    char pool[16];             /* "main" | "fallback", from the config */
    int in_flight;             /* upstream attempts in progress */
    int consecutive_failures;  /* connect errors, 429 and 5xx in a row */
    uint64_t requests_total;   /* attempts started */
    uint64_t failures_total;   /* attempts that failed */
    uint64_t cooldowns_total;  /* cooldowns applied */
    uint64_t emergency_total;  /* attempts let through the emergency channel */
    uint64_t status_counts[6]; /* answers by class: [0] no answer, [1..5] 1xx..5xx */
    int disabled;              /* taken out of routing by an operator */
    mg_limiter_t limiter;      /* owned: RPM / TPM windows */
    mg_cooldown_t cooldown;
    mg_breaker_t breaker;
    mg_health_t health;
    mg_engine_load_t load;
    int probe_in_flight;       /* an active probe is running */
    uint64_t last_probe_ms;
} mg_provider_state_t;

typedef struct mg_pool_s {
    mg_provider_state_t *items; /* owned array */
    size_t n;
} mg_pool_t;

void mg_pool_init(mg_pool_t *p);
/* Make the state set match cfg's providers, keeping existing state by id and applying
 * the configured limits and breaker settings. Returns 0 or -1 (out of memory; the
 * pool is unchanged). */
int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg);
/* State for provider id, or NULL. */
mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id);
/* Whether routing may consider the provider now: enabled, health not down and the
 * breaker letting a request through. Cooling is a separate state (see routing). */
int mg_pool_available(const mg_provider_state_t *s, uint64_t now_ms);
/* Count one finished attempt: success or failure (any no-answer, 429 or 5xx). */
void mg_pool_record(mg_provider_state_t *s, int success);
void mg_pool_free(mg_pool_t *p);

#endif
