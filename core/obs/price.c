/* price: the price in force and the cost of a call's tokens; see price.h. */
#include "obs/price.h"

#include <string.h>

/* entries per provider are few: a linear scan over the config's list is cheaper than any
 * index would be to keep */
const mg_price_t *mg_price_find(const mg_config_t *cfg, const char *provider, const char *model,
                                int64_t at_s)
{
    const mg_price_t *exact = NULL, *any = NULL;
    if (!provider) return NULL;
    for (size_t i = 0; i < cfg->n_prices; i++) {
        const mg_price_t *p = &cfg->prices[i];
        if (p->effective_at > at_s || strcmp(p->provider, provider) != 0) continue;
        int star = strcmp(p->model, "*") == 0;
        if (!star && (!model || strcmp(p->model, model) != 0)) continue;
        const mg_price_t **best = star ? &any : &exact;
        if (!*best || p->effective_at >= (*best)->effective_at) *best = p;
    }
    return exact ? exact : any;
}

static int64_t mul_div_up(int64_t tokens, int64_t per_1m)
{
    return tokens > 0 && per_1m > 0 ? tokens * per_1m : 0;
}

int64_t mg_price_apply(const mg_price_t *p, const mg_usage_tokens_t *t)
{
    /* tokens up to 2^31 x prices up to 1e12 stay below 2^63 in the sum of four terms only
       when each product is below 2^61: cap tokens at 1e9 per bucket (a billion tokens in one
       request is beyond any model) */
    const int64_t cap = 1000000000;
    int64_t in = t->input < cap ? t->input : cap, out = t->output < cap ? t->output : cap;
    int64_t cr = t->cached_read < cap ? t->cached_read : cap;
    int64_t cw = t->cache_write < cap ? t->cache_write : cap;
    __int128 sum = (__int128)mul_div_up(in, p->input_micros) + mul_div_up(out, p->output_micros) +
                   mul_div_up(cr, p->cached_input_micros) + mul_div_up(cw, p->cache_write_micros);
    return (int64_t)((sum + 999999) / 1000000);
}

static const mg_provider_conf_t *provider_of(const mg_config_t *cfg, const char *id)
{
    for (size_t i = 0; id && i < cfg->n_providers; i++)
        if (strcmp(cfg->providers[i].id, id) == 0) return &cfg->providers[i];
    return NULL;
}

int64_t mg_price_cost(const mg_config_t *cfg, const char *provider, const char *model,
                      const mg_usage_tokens_t *t, int64_t at_s, const char **version)
{
    if (version) *version = NULL;
    const mg_price_t *p = mg_price_find(cfg, provider, model, at_s);
    if (p) {
        if (version) *version = p->version;
        return mg_price_apply(p, t);
    }
    const mg_provider_conf_t *pc = provider_of(cfg, provider);
    if (!pc || pc->cost_per_1k_tokens <= 0) return 0;
    /* currency per 1k tokens -> micros per 1M tokens: x 1e6 (micros) x 1e3 (1k -> 1M) */
    int64_t per_1m = (int64_t)(pc->cost_per_1k_tokens * 1e9 + 0.5);
    mg_price_t shorthand = {.input_micros = per_1m,
                            .output_micros = per_1m,
                            .cached_input_micros = per_1m,
                            .cache_write_micros = per_1m};
    if (version) *version = "cost_per_1k";
    return mg_price_apply(&shorthand, t);
}
