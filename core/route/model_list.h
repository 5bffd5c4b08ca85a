/* model_list: the models GET /v1/models lists beside the logical ones (issue 20, the Sidecar
 * ADR's 8.1 "aggregated" list): those the providers with a model_prefix report, each under
 * the name that reaches it.
 *
 * A prefix-served name goes to its provider as it was sent (admit.c: the longest model_prefix
 * the name starts with picks the providers; a logical model of that name comes first). So an
 * upstream id X that provider P reports is listed, as X, when and only when a request for X
 * would reach P under the id P knows: X starts with P's model_prefix, no provider's longer
 * prefix claims X, and X is not a logical model (which is listed as such). An id that does
 * not start with the prefix cannot be served through it and is left out. Each name comes
 * once, owned by the first provider (config order) that reports it; disabled providers
 * list nothing. owned_by is the provider's name (its id when it has none): never its
 * base_url or key.
 *
 * Pure: built from a config and each provider's last list; the api reads it. */
#ifndef MG_MODEL_LIST_H
#define MG_MODEL_LIST_H

#include <stddef.h>

#include "conf/config.h"

typedef struct mg_listed_model_s {
    char *id;       /* owned: the name a client sends */
    char *owned_by; /* owned: the provider's name, or its id */
} mg_listed_model_t;

typedef struct mg_model_list_s {
    mg_listed_model_t *items; /* owned, n of them, in listing order */
    size_t n;
    size_t *index; /* owned: open addressing over items (i + 1; 0 = empty), cap slots */
    size_t cap;
} mg_model_list_t;

/* One provider's reported ids (borrowed). */
typedef struct mg_model_ids_s {
    char *const *ids;
    size_t n;
} mg_model_ids_t;

/* Build out from cfg and lists (cfg->n_providers entries, lists[i] for cfg->providers[i]; n = 0
 * when it has none), by the rule above: providers in config order, each one's ids in the
 * upstream's order. 0, or -1 when out of memory (out empty then). */
int mg_model_list_build(const mg_config_t *cfg, const mg_model_ids_t *lists, mg_model_list_t *out);
/* The entry listed as id, or NULL. */
const mg_listed_model_t *mg_model_list_find(const mg_model_list_t *l, const char *id);
void mg_model_list_free(mg_model_list_t *l);

#endif
