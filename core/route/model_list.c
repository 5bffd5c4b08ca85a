/* model_list: the upstream models GET /v1/models lists; see model_list.h. */
#include "route/model_list.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a: the names come from the operator's own upstreams, and a collision only costs a
 * longer probe. */
static uint64_t hash_of(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot of id in l's index: where it is, or the empty slot where it would go. */
static size_t slot_of(const mg_model_list_t *l, const char *id)
{
    size_t mask = l->cap - 1, i = (size_t)hash_of(id) & mask;
    while (l->index[i] && strcmp(l->items[l->index[i] - 1].id, id) != 0) i = (i + 1) & mask;
    return i;
}

const mg_listed_model_t *mg_model_list_find(const mg_model_list_t *l, const char *id)
{
    if (!l || !l->cap || !id) return NULL;
    size_t i = l->index[slot_of(l, id)];
    return i ? &l->items[i - 1] : NULL;
}

void mg_model_list_free(mg_model_list_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->items[i].id);
        free(l->items[i].owned_by);
    }
    free(l->items);
    free(l->index);
    memset(l, 0, sizeof(*l));
}

/* Whether a request for id would reach provider p under that id (model_list.h). */
static int served_by(const mg_config_t *cfg, const mg_provider_conf_t *p, const char *id)
{
    size_t plen = strlen(p->model_prefix);
    if (strncmp(id, p->model_prefix, plen) != 0 || mg_config_model(cfg, id)) return 0;
    for (size_t j = 0; j < cfg->n_providers; j++) {
        const char *q = cfg->providers[j].model_prefix;
        if (q && strlen(q) > plen && strncmp(id, q, strlen(q)) == 0) return 0; /* a longer one */
    }
    return 1;
}

static int add(mg_model_list_t *l, const char *id, const char *owner)
{
    size_t s = slot_of(l, id);
    if (l->index[s]) return 0; /* listed already */
    mg_listed_model_t *m = &l->items[l->n];
    m->id = strdup(id);
    m->owned_by = strdup(owner);
    if (!m->id || !m->owned_by) {
        free(m->id);
        free(m->owned_by);
        return -1;
    }
    l->index[s] = ++l->n;
    return 0;
}

int mg_model_list_build(const mg_config_t *cfg, const mg_model_ids_t *lists, mg_model_list_t *out)
{
    memset(out, 0, sizeof(*out));
    size_t total = 0;
    for (size_t i = 0; i < cfg->n_providers; i++) total += lists[i].n;
    if (!total) return 0;
    out->cap = 16;
    while (out->cap < total * 2) out->cap *= 2; /* at most half full */
    out->items = calloc(total, sizeof(*out->items));
    out->index = calloc(out->cap, sizeof(*out->index));
    if (!out->items || !out->index) goto oom;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const mg_provider_conf_t *p = &cfg->providers[i];
        if (!p->model_prefix || p->disabled) continue;
        const char *owner = p->name && p->name[0] ? p->name : p->id;
        for (size_t k = 0; k < lists[i].n; k++)
            if (served_by(cfg, p, lists[i].ids[k]) && add(out, lists[i].ids[k], owner) != 0)
                goto oom;
    }
    return 0;
oom:
    mg_model_list_free(out);
    return -1;
}
