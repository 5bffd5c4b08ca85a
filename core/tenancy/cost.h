/* cost: what a call costs, in integer micro-units (millionths) of the currency, from its
 * tokens and a price.
 *
 * The seam between metering and the price the gateway knows. Today the price is the config's
 * single one: a provider's cost_per_1k_tokens (currency units per 1,000 tokens, input and
 * output alike). Spend limits and prepaid wallets ask only this file, so pointing
 * mg_cost_rate_of() (and mg_cost_model_ceiling()) at the versioned price table — separate
 * input, output, cached-read and cache-write prices, the version in force at the request's
 * end — changes every caller at once; the rest of the ledger never sees a price.
 *
 * Rounding: a cost is rounded up to the next micro-unit, so a priced request never costs
 * nothing. Pure: any thread. */
#ifndef MG_COST_H
#define MG_COST_H

#include <stdint.h>

#include "conf/config.h"

/* A price as the ledger uses it: micro-units per 1,000 tokens, input and output apart. */
typedef struct mg_cost_rate_s {
    double input_micros_per_1k;
    double output_micros_per_1k;
} mg_cost_rate_t;

/* The price of the provider a call went to (zero for NULL). */
mg_cost_rate_t mg_cost_rate_of(const mg_provider_conf_t *p);

/* The dearest price among the routes of a model (each of input and output apart): what an
 * estimate made before routing must assume, since any route may serve the call. */
mg_cost_rate_t mg_cost_model_ceiling(const mg_config_t *cfg, const mg_model_conf_t *m);

/* input_tokens x the input price + output_tokens x the output price, rounded up; negative
 * counts count as 0; saturates at INT64_MAX / 4 (no overflow in sums of a few). */
int64_t mg_cost_micros(mg_cost_rate_t rate, int64_t input_tokens, int64_t output_tokens);

#endif
