/* pool: the runtime state of providers, kept across reloads by provider id, and of
 * routes (provider + upstream model pairs of the config), kept by that pair.
 *
 * Configuration says what a provider is; this says how it is doing: its rate
 * windows (limiter), cooldown, circuit breaker, passive health, engine load and
 * counters. A generation swap keeps the state of providers that still exist
 * (applying new limits) and adds fresh state for new ones. All of it lives on the
 * loop thread: selecting a provider and reserving its capacity is one step.
 *
 * Two circuit breakers stand between a request and an upstream model: the
 * provider's, fed by connection failures (the provider cannot be reached: every
 * model is out), and the route's, fed by the failures of answers (429, 5xx, a
 * time-out, a broken answer: the provider is up, this model is failing), so that
 * one model failing does not take the provider's other models down. Both follow
 * the config's circuit_breaker block. */
#ifndef MG_POOL_H
#define MG_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "conf/config.h"
#include "route/health.h"
#include "route/limiter.h"

typedef struct mg_engine_load_s {
    int known;       /* the engine reported load at least once */
    int running;     /* requests being generated */
    int waiting;     /* requests queued in the engine */
    double kv_cache; /* KV-cache usage 0..1, or -1 when unknown */
    uint64_t at_ms;  /* when it was read */
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
    uint64_t trials_total;     /* trial requests while down (health.retry_down_ms) */
    uint64_t status_counts[6]; /* answers by class: [0] no answer, [1..5] 1xx..5xx */
    int disabled;              /* taken out of routing by an operator */
    mg_limiter_t limiter;      /* owned: RPM / TPM windows */
    mg_cooldown_t cooldown;
    mg_breaker_t breaker;
    mg_health_t health;
    mg_engine_load_t load;
    int probe_in_flight; /* an active probe is running */
    uint64_t last_probe_ms;
    uint32_t version;               /* bumped by every change routing can see (mg_pool_changed) */
    const mg_provider_conf_t *conf; /* its entry in the config last synced: compared, never
                                       read (the request path's lookup, mg_pool_get_at) */
} mg_provider_state_t;

/* One route of the config: a provider + upstream model pair, however many logical
 * models list it. Routes the config does not list (prefix-served model names, chosen
 * by clients) have none: they never create state. */
typedef struct mg_route_state_s {
    char *provider;       /* owned: provider id */
    char *model;          /* owned: upstream model name */
    mg_breaker_t breaker; /* answers that failed: 429, 5xx, time-outs, broken answers */
    uint32_t version;     /* bumped with every change of the breaker */
} mg_route_state_t;

/* The routes, found by (provider, model) through an open-addressing hash, and the config
 * routes of the generation the set was made for, by their slot (mg_route_conf_t): the
 * request path's lookup is then one comparison. */
typedef struct mg_route_set_s {
    mg_route_state_t *items; /* owned array */
    size_t n;
    uint32_t *slots; /* owned, mask + 1 of them: index into items + 1, 0 = empty */
    size_t mask;
    const mg_route_conf_t **confs; /* owned, n_confs of them: the config's routes by slot */
    uint32_t *state_of;            /* owned, n_confs of them: the index into items of each */
    size_t n_confs;
} mg_route_set_t;

typedef struct mg_pool_s {
    mg_provider_state_t *items; /* owned array */
    size_t n;
    mg_route_set_t routes;
    uint32_t epoch; /* bumped by every sync: the arrays above are new */
} mg_pool_t;

/* Say that provider state s changed in a way routing can see: in_flight, the rate windows,
 * cooldown, health, the breakers (mg_pool_breakers_* say it themselves), the engine's load.
 * Descriptions kept for routing (facts.h) are then made afresh. Whoever changes one of
 * those must call this, in the same loop turn. */
static inline void mg_pool_changed(mg_provider_state_t *s)
{
    if (s) s->version++;
}

/* How an attempt ended, for the breakers. */
typedef enum {
    MG_ATTEMPT_OK = 0,      /* an answer that is not the provider's fault (also a 4xx) */
    MG_ATTEMPT_FAILED,      /* the provider answered, badly or not in time: the route's */
    MG_ATTEMPT_UNREACHABLE, /* the connection failed: the provider's */
} mg_attempt_outcome_t;

void mg_pool_init(mg_pool_t *p);
/* Make the state set match cfg's providers and routes, keeping existing state by id (and
 * by provider + model for routes) and applying the configured limits and breaker
 * settings. Returns 0 or -1 (out of memory; the pool is unchanged). */
int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg);
/* State for provider id, or NULL. */
mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id);
/* The state of provider pc, the entry at index of its config's providers: the pool keeps
 * the providers in the order of the config it was last synced with, so for that config's
 * entries one pointer comparison finds it (a config of an older generation: by id). The
 * request path's lookup, once per route. */
mg_provider_state_t *mg_pool_get_at(mg_pool_t *p, size_t index, const mg_provider_conf_t *pc);
/* Whether routing may consider the provider now: enabled, health not down (or down with its
 * trial request due) and the breaker letting a request through. Cooling is a separate state
 * (see routing). */
int mg_pool_available(const mg_provider_state_t *s, uint64_t now_ms);
/* Count one finished attempt: success or failure (any no-answer, 429 or 5xx). */
void mg_pool_record(mg_provider_state_t *s, int success);

/* The state of route (provider id, upstream model), or NULL when the config does not
 * list that route. */
mg_route_state_t *mg_pool_route(const mg_pool_t *p, const char *provider, const char *model);
/* The same for route r of a config: by its slot when r is a route of the config the pool was
 * last synced with (one comparison), else by its provider and model. */
mg_route_state_t *mg_pool_route_of(const mg_pool_t *p, const mg_route_conf_t *r);
/* Whether routing may consider the route now: the provider is available and the route's
 * breaker lets a request through (r NULL: no route breaker). */
int mg_pool_route_available(const mg_provider_state_t *s, const mg_route_state_t *r,
                            uint64_t now_ms);
/* The same under the panic rule (too few healthy routes: routing.panic_threshold): health
 * not asked. */
int mg_pool_route_available_in_panic(const mg_provider_state_t *s, const mg_route_state_t *r,
                                     uint64_t now_ms);
/* The breaker state that governs a route: the worse of the provider's and the route's
 * (open, then half open, then closed). */
mg_breaker_state_t mg_pool_breaker_state(const mg_provider_state_t *s, const mg_route_state_t *r,
                                         uint64_t now_ms);
/* The provider as a whole: its own breaker's state, or, when that is closed and every
 * route of the provider in the config is open (or half open), the best of those. */
mg_breaker_state_t mg_pool_provider_breaker(const mg_pool_t *p, const mg_provider_state_t *s,
                                            uint64_t now_ms);
/* Milliseconds until both breakers would let a request through (0 = now). */
uint64_t mg_pool_breakers_retry_ms(const mg_provider_state_t *s, const mg_route_state_t *r,
                                   uint64_t now_ms);
/* Let one attempt through both breakers (reserving a half-open probe slot in each), or
 * neither: 1 = send it, 0 = do not. */
int mg_pool_breakers_allow(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms);
/* Give back what mg_pool_breakers_allow() reserved, for an attempt not sent after all. */
void mg_pool_breakers_release(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms);
/* An attempt's outcome into the breakers: unreachable counts against the provider (the
 * route's probe slot, if any, is given back: the route was not tried); failed against the
 * route (for the provider it was an answer: a success); ok for both. */
void mg_pool_breakers_record(mg_provider_state_t *s, mg_route_state_t *r, uint64_t now_ms,
                             mg_attempt_outcome_t outcome);
void mg_pool_free(mg_pool_t *p);

#endif
