/* pool: provider runtime state; see pool.h. */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

void mg_pool_init(mg_pool_t *p)
{
    p->items = NULL;
    p->n = 0;
}

mg_provider_state_t *mg_pool_get(mg_pool_t *p, const char *id)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->items[i].id && strcmp(p->items[i].id, id) == 0) return &p->items[i];
    return NULL;
}

int mg_pool_sync(mg_pool_t *p, const mg_config_t *cfg)
{
    size_t n = cfg->n_providers;
    mg_provider_state_t *items = calloc(n ? n : 1, sizeof(*items));
    if (!items) return -1;
    /* allocate everything first, so running out of memory leaves the pool as it was */
    for (size_t i = 0; i < n; i++) {
        if (mg_pool_get(p, cfg->providers[i].id)) continue;
        items[i].id = strdup(cfg->providers[i].id);
        if (!items[i].id) {
            for (size_t k = 0; k < i; k++) free(items[k].id);
            free(items);
            return -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (items[i].id) continue;
        mg_provider_state_t *old = mg_pool_get(p, cfg->providers[i].id);
        items[i] = *old;
        old->id = NULL; /* moved */
    }
    mg_pool_free(p);
    p->items = items;
    p->n = n;
    return 0;
}

int mg_pool_available(const mg_provider_state_t *s)
{
    return s && !s->disabled;
}

void mg_pool_record(mg_provider_state_t *s, int success)
{
    if (!s) return;
    if (success) {
        s->consecutive_failures = 0;
    } else {
        s->consecutive_failures++;
        s->failures_total++;
    }
}

void mg_pool_free(mg_pool_t *p)
{
    for (size_t i = 0; i < p->n; i++) free(p->items[i].id);
    free(p->items);
    p->items = NULL;
    p->n = 0;
}
