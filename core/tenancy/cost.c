/* cost: tokens x price in micro-units; see cost.h. */
#include "tenancy/cost.h"

#include <math.h>

#define COST_MAX_MICROS (INT64_MAX / 4)

mg_cost_rate_t mg_cost_rate_of(const mg_provider_conf_t *p)
{
    /* cost_per_1k_tokens is currency units per 1,000 tokens: x 1e6 for micro-units */
    double per_1k = p && p->cost_per_1k_tokens > 0 ? p->cost_per_1k_tokens * 1e6 : 0;
    return (mg_cost_rate_t){per_1k, per_1k};
}

mg_cost_rate_t mg_cost_model_ceiling(const mg_config_t *cfg, const mg_model_conf_t *m)
{
    mg_cost_rate_t top = {0, 0};
    for (size_t i = 0; m && i < m->n_routes; i++) {
        mg_cost_rate_t r = mg_cost_rate_of(mg_config_route_provider(cfg, &m->routes[i]));
        if (r.input_micros_per_1k > top.input_micros_per_1k)
            top.input_micros_per_1k = r.input_micros_per_1k;
        if (r.output_micros_per_1k > top.output_micros_per_1k)
            top.output_micros_per_1k = r.output_micros_per_1k;
    }
    return top;
}

int64_t mg_cost_micros(mg_cost_rate_t rate, int64_t input_tokens, int64_t output_tokens)
{
    double in = input_tokens > 0 ? (double)input_tokens : 0;
    double out = output_tokens > 0 ? (double)output_tokens : 0;
    double micros = (in * rate.input_micros_per_1k + out * rate.output_micros_per_1k) / 1000.0;
    /* a hair below an integer is that integer: 1,000 tokens at 0.002 must be 2,000, not 2,001 */
    double up = ceil(micros - 1e-6);
    if (!(up > 0)) return 0;
    return up >= (double)COST_MAX_MICROS ? COST_MAX_MICROS : (int64_t)up;
}
