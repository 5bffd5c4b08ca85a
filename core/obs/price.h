/* price: what a call cost, in integer micro-units of the currency, by the versioned price
 * tables of the config (conf/usage.h).
 *
 * Tokens come in mutually exclusive billing buckets (mg_usage_tokens_t): `input` is the
 * uncached input (OpenAI's cached_tokens are a subset of prompt_tokens and are taken out of
 * it; Anthropic's cache fields are apart already and nothing is subtracted), `cached_read`
 * the input read from the provider's cache, `cache_write` the input written to it, `output`
 * every output token (reasoning included: `reasoning` is a subset of `output`, shown apart
 * and never charged twice).
 *
 * The price in force for (provider, upstream model) at a time: among the entries for that
 * provider and model whose effective_at is not after it, the latest (the last listed on a
 * tie: a stored version after the file's); an entry for the model itself beats the
 * provider's "*" entry. Without any entry, the provider's cost_per_1k_tokens is the
 * shorthand: one price for every kind of token, version "cost_per_1k". Without either the
 * call costs 0 and has no version.
 *
 * cost = ceil(sum over buckets of tokens x price per 1M / 1,000,000): a priced call that used
 * a token never costs nothing. Pure; any thread. */
#ifndef MG_PRICE_H
#define MG_PRICE_H

#include <stdint.h>

#include "conf/config.h"

typedef struct mg_usage_tokens_s {
    int64_t input;       /* uncached input tokens */
    int64_t output;      /* output tokens, reasoning included */
    int64_t cached_read; /* input tokens read from the cache */
    int64_t cache_write; /* input tokens written to the cache */
    int64_t reasoning;   /* of output: the reasoning tokens (not charged apart) */
} mg_usage_tokens_t;

/* The price in force for provider and model at unix second at_s (its version in
 * ->version), or NULL when the config has none (then see cost_per_1k_tokens). */
const mg_price_t *mg_price_find(const mg_config_t *cfg, const char *provider, const char *model,
                                int64_t at_s);

/* The cost in micros of tokens t on provider (an id of cfg, may be NULL) serving model (the
 * upstream model, may be NULL) at unix second at_s; *version (may be NULL) gets the price's
 * version (static or in cfg, valid as long as cfg) or NULL when nothing is priced. */
int64_t mg_price_cost(const mg_config_t *cfg, const char *provider, const char *model,
                      const mg_usage_tokens_t *t, int64_t at_s, const char **version);

/* The cost of t at one price (the arithmetic above). */
int64_t mg_price_apply(const mg_price_t *p, const mg_usage_tokens_t *t);

#endif
