/* calib: the per-route bytes-per-token learner; see calib.h. */
#include "token/calib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_calib_init(mg_calib_t *c)
{
    memset(c, 0, sizeof(*c));
}

void mg_calib_free(mg_calib_t *c)
{
    free(c->routes);
    mg_calib_init(c);
}

mg_calib_route_t *mg_calib_find(const mg_calib_t *c, const char *provider, const char *model)
{
    if (!provider || !model) return NULL;
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->routes[i].provider, provider) == 0 && strcmp(c->routes[i].model, model) == 0)
            return &c->routes[i];
    return NULL;
}

double mg_calib_bpt(const mg_calib_t *c, const char *provider, const char *model)
{
    const mg_calib_route_t *r = mg_calib_find(c, provider, model);
    return r ? r->bpt : MG_CALIB_DEFAULT_BPT;
}

int64_t mg_calib_tokens(double bpt, size_t bytes)
{
    if (!bytes) return 0;
    if (!(bpt >= MG_CALIB_MIN_BPT)) bpt = MG_CALIB_MIN_BPT; /* NaN too */
    return (int64_t)ceil((double)bytes / bpt);
}

static double clamp(double v)
{
    if (!(v >= MG_CALIB_MIN_BPT)) return MG_CALIB_MIN_BPT;
    return v > MG_CALIB_MAX_BPT ? MG_CALIB_MAX_BPT : v;
}

/* The route's entry, made when new (NULL: full, names too long, out of memory). */
static mg_calib_route_t *entry(mg_calib_t *c, const char *provider, const char *model)
{
    mg_calib_route_t *r = mg_calib_find(c, provider, model);
    if (r || !provider || !model) return r;
    if (strlen(provider) >= MG_CALIB_NAME_MAX || strlen(model) >= MG_CALIB_NAME_MAX) return NULL;
    if (c->n >= MG_CALIB_ROUTES) return NULL;
    if (!c->routes && !(c->routes = calloc(MG_CALIB_ROUTES, sizeof(*c->routes)))) return NULL;
    r = &c->routes[c->n++];
    memset(r, 0, sizeof(*r));
    snprintf(r->provider, sizeof(r->provider), "%s", provider);
    snprintf(r->model, sizeof(r->model), "%s", model);
    r->bpt = MG_CALIB_DEFAULT_BPT;
    return r;
}

mg_calib_route_t *mg_calib_observe(mg_calib_t *c, const char *provider, const char *model,
                                   size_t bytes, int64_t tokens, double *error)
{
    if (!bytes || tokens <= 0) return NULL;
    mg_calib_route_t *r = entry(c, provider, model);
    if (!r) return NULL;
    if (error) *error = (double)(mg_calib_tokens(r->bpt, bytes) - tokens) / (double)tokens;
    double sample = clamp((double)bytes / (double)tokens);
    r->samples++;
    double w = r->samples < MG_CALIB_WARMUP ? 1.0 / (double)r->samples : MG_CALIB_ALPHA;
    if (w < MG_CALIB_ALPHA) w = MG_CALIB_ALPHA;
    r->bpt = clamp(r->bpt + w * (sample - r->bpt));
    return r;
}

mg_calib_route_t *mg_calib_set(mg_calib_t *c, const char *provider, const char *model, double bpt,
                               uint64_t samples)
{
    mg_calib_route_t *r = entry(c, provider, model);
    if (!r) return NULL;
    r->bpt = clamp(bpt);
    r->samples = samples;
    return r;
}
