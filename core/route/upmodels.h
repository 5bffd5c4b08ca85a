/* upmodels: the model lists of the providers with a model_prefix, fetched from their
 * upstreams in the background and cached, for GET /v1/models (issue 20; the listing rule is
 * model_list.h's).
 *
 * Each provider of the current generation that has a model_prefix, is not disabled and whose
 * adapter lists models (list_models / decode_models: lua/README.md; openai: GET
 * {base_url}/models, anthropic: GET /v1/models, ollama: GET /api/tags) is asked for its list
 * through the upstream client, with the headers its adapter gives (its key as on every
 * request), the probes' time-out (health.probe_timeout_ms) and answers read up to
 * MG_UPMODELS_MAX_BODY. A list is kept protocols.models_refresh_seconds (default 300; 0 turns
 * the lists off) and then fetched again, in the background: GET /v1/models never waits for an
 * upstream, it answers with what is cached. A failed fetch (no answer, a status other than 2xx, a
 * body that is not JSON or that the adapter cannot read) keeps the provider's last good list and is
 * tried again sooner (5 s, doubling up to the refresh interval); the failure is logged once (warn
 * "provider models unavailable") until a fetch works again (info "provider models"), never per
 * request. A provider that never answered lists nothing. A provider whose base_url or adapter
 * changes in a reload starts over. At most one fetch per provider is in flight; everything runs on
 * the loop thread, the fetches' Lua calls on the generation they started with. */
#ifndef MG_UPMODELS_H
#define MG_UPMODELS_H

#include <uv.h>

#include "luavm/gens.h"
#include "route/model_list.h"
#include "upstream/upstream.h"

#define MG_UPMODELS_TICK_MS 1000
#define MG_UPMODELS_MAX_BODY (8u * 1024u * 1024u)
#define MG_UPMODELS_RETRY_MS 5000

typedef struct mg_upmodels_s mg_upmodels_t;

/* Borrowed for the fetcher's life. */
typedef struct mg_upmodels_deps_s {
    uv_loop_t *loop;
    mg_gens_t *gens;
    mg_upstream_t *upstream;
} mg_upmodels_deps_t;

/* Start: the first fetches at once (on the next loop turn), then a timer every
 * MG_UPMODELS_TICK_MS. NULL when out of memory. */
mg_upmodels_t *mg_upmodels_start(const mg_upmodels_deps_t *d);
/* Cancel the fetches in flight (no callback of theirs fires afterwards), drop the lists and
 * free the fetcher once its timer has closed. Before mg_upstream_close(). NULL is a no-op. */
void mg_upmodels_stop(mg_upmodels_t *u);
/* The listing for the current generation and the lists as they are now (rebuilt when either
 * changed); borrowed until the caller returns to the loop. Never NULL: an empty list for a
 * NULL u or when out of memory. */
const mg_model_list_t *mg_upmodels_list(mg_upmodels_t *u);

#endif
