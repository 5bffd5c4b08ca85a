/* usage: the config of usage metering (`usage:`) and the versioned price tables (`prices:`).
 *
 *   usage:
 *     enabled: true           # one usage event per request that reached routing (default)
 *     retention_days: 90      # raw events kept this long; the hourly and daily roll-ups stay
 *     prune_batch: 1000       # events deleted per pruning write (the writer thread's)
 *     prune_interval_s: 10    # how often a pruning write is queued
 *   prices:
 *     - provider: openai      # a provider id
 *       model: gpt-4o         # the upstream model name; "*" (the default) = any of its models
 *       input_per_1m_micros: 2500000        # micro-units of the currency per 1M tokens
 *       output_per_1m_micros: 10000000
 *       cached_input_per_1m_micros: 1250000 # optional, default input_per_1m_micros
 *       cache_write_per_1m_micros: 3125000  # optional, default input_per_1m_micros
 *       effective_at: 2026-01-01T00:00:00Z  # or unix seconds; default 0 (always)
 *
 * A price entry is one version: entries for the same provider and model with different
 * effective_at are the price's history, and the one in force at a request's end is the
 * greatest effective_at not in the future (obs/price.h). Entries from the file are versioned
 * "cfg-<hash of the entry>" (the same entry keeps its version across reloads); entries
 * posted through /api/v2/prices are stored rows, versioned "db-<row id>", and are never
 * rewritten (mg_prices_load adds them at every generation build). The JSON shape of an entry
 * (the POST body, the GET answer) is the YAML one. */
#ifndef MG_CONF_USAGE_H
#define MG_CONF_USAGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <cjson/cJSON.h>
#include <yaml.h>

struct mg_config_s;
struct mg_store_s;

typedef struct mg_usage_conf_s {
    bool enabled;         /* usage.enabled, default true */
    int retention_days;   /* usage.retention_days, default 90 */
    int prune_batch;      /* usage.prune_batch, default 1000 */
    int prune_interval_s; /* usage.prune_interval_s, default 10 */
} mg_usage_conf_t;

typedef struct mg_price_s {
    char *provider;              /* owned */
    char *model;                 /* owned; "*" = every model of the provider */
    int64_t input_micros;        /* per 1M uncached input tokens */
    int64_t output_micros;       /* per 1M output tokens (reasoning included) */
    int64_t cached_input_micros; /* per 1M cached input tokens read */
    int64_t cache_write_micros;  /* per 1M input tokens written to the cache */
    int64_t effective_at;        /* unix seconds */
    char version[24];            /* "cfg-<8 hex>" or "db-<id>" */
} mg_price_t;

#define MG_PRICE_MAX_MICROS 1000000000000LL /* 1M currency units per 1M tokens */

/* The defaults of `usage:`. */
void mg_usage_conf_defaults(mg_usage_conf_t *u);

/* The `usage:` (is_prices 0) or `prices:` (1) section at node v of doc into cfg. 0, or -1
 * with the reason in err and its line in *line. */
int mg_conf_usage_section(yaml_document_t *doc, yaml_node_t *v, int is_prices,
                          struct mg_config_s *cfg, int *line, char *err, size_t errlen);

/* One price entry from JSON (the YAML shape) into *out (strings owned). 0, or -1 with the
 * field named in err (*out cleared). */
int mg_price_from_json(const cJSON *o, mg_price_t *out, char *err, size_t errlen);
/* An entry as JSON (with its version). */
cJSON *mg_price_to_json(const mg_price_t *p);
/* Append p (taken over) to cfg's prices. 0 or -1 (out of memory: p cleared). */
int mg_prices_add(struct mg_config_s *cfg, mg_price_t *p);
void mg_price_clear(mg_price_t *p);
/* Free cfg's price entries (mg_config_free). */
void mg_prices_free(struct mg_config_s *cfg);
/* Add the store's price rows to cfg (a generation being built; blocking). 0, or -1 with
 * err set. */
int mg_prices_load(struct mg_store_s *st, struct mg_config_s *cfg, char *err, size_t errlen);

#endif
