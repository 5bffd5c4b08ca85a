/* models: logical models operators add through the admin API (the PRD's /admin/models,
 * served as /api/v2/models).
 *
 * A stored model is one row of the store's `models` table: its name and its definition as
 * JSON, in the config file's shape:
 *
 *   {"routes": [{"provider": "p_1a2b", "model": "llama-3.1-8b", "smaller": false,
 *                "priority": 0, "context_window": 0}, ...],
 *    "max_concurrency": 0, "weight_bytes": 0, "kv_cache_per_token_bytes": 0,
 *    "context_window": 0, "max_output_tokens": 0, "tokenizer": "o200k_base"}
 *
 * context_window, max_output_tokens (and a route's context_window) make the context budget
 * of a chat on the model as in the file (conf/context.h); tokenizer is an encoding's name
 * or "estimate", by the first route's upstream family when absent. An encoding no file
 * model names is not loaded by a reload (server.c): such a model counts by the estimate.
 *
 * Every generation build adds them after the file's models and the stored providers
 * (mg_models_load), so their routes may name file or stored providers. A name the file
 * also defines stays the file's; a route whose provider is gone is left out (a model left
 * without routes is not served); both are logged. Blocking (store reads): worker threads
 * and start-up only. */
#ifndef MG_MODELS_H
#define MG_MODELS_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "conf/config.h"
#include "store/store.h"

#define MG_MODEL_MAX_ROUTES 1000

/* Check a model name for the admin API: 1..128 of letters, digits and ". _ - : @" (no
 * '/', so it can be addressed as /api/v2/models/{name}). */
int mg_model_name_ok(const char *name);

/* Parse and validate a definition into *out (name copied). Every route's provider must be
 * one of cfg's. 0, or -1 with a message naming the field in err (*out cleared). */
int mg_model_from_json(const cJSON *def, const char *name, const mg_config_t *cfg,
                       mg_model_conf_t *out, char *err, size_t errlen);

/* The definition of a model as JSON (the shape above, plus name and source). */
cJSON *mg_model_to_json(const mg_model_conf_t *m);

/* Stored definitions (models, applications): add(cfg, name, def, err, errlen) puts one
 * into cfg and returns 0, -1 (not usable: logged with err, skipped) or -2 (out of memory). */
typedef int (*mg_def_add_fn)(mg_config_t *cfg, const char *name, cJSON *def, char *err,
                             size_t errlen);
/* Every row of table (name, definition) through add, oldest first. 0, or -1 with err set
 * (storage, out of memory). */
int mg_defs_load(mg_store_t *st, const char *table, const char *what, mg_config_t *cfg,
                 mg_def_add_fn add, char *err, size_t errlen);

/* Add every stored model to cfg (a generation being built). 0, or -1 with err set
 * (storage, out of memory); unusable rows are logged and skipped. */
int mg_models_load(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen);

#endif
