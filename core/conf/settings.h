/* settings: the runtime settings operators change without a restart (GET/PUT /api/v2/config).
 *
 * A short list of config keys (log.level, routing.*, upstream.max_retries, scheduler slots
 * and queue bounds) may be overridden in the store's system_config table. Every generation
 * build reads the overrides and applies them over the config file's values, so a PUT takes
 * effect with the rebuild it triggers, a SIGHUP keeps them, and a restart too. Deleting an
 * override (PUT with null) brings the file's value back. */
#ifndef MG_SETTINGS_H
#define MG_SETTINGS_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "conf/config.h"
#include "store/store.h"

/* Whether key is a runtime setting. */
int mg_settings_known(const char *key);

/* Validate a JSON value for key and write its stored text (JSON) into out. 0, or -1 with what is
 * wrong in err (never the value itself when it is long). */
int mg_settings_check(const char *key, const cJSON *v, char *out, size_t cap, char *err,
                      size_t errlen);

/* Apply the store's overrides to cfg (a generation being built). Unknown keys and values that
 * no longer validate are skipped with a warning. 0, or -1 with err set (storage). */
int mg_settings_overlay(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen);

/* {"settings": {key: value, ...}, "overridden": [keys]} for cfg, given the stored keys. */
cJSON *mg_settings_json(const mg_config_t *cfg, const cJSON *overridden);

#endif
