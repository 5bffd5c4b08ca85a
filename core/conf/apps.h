/* apps: applications operators add through the admin API (the PRD's /admin/applications,
 * served as /api/v2/applications), and their JSON form.
 *
 * A stored application is one row of the store's `applications` table: its name and its
 * definition in the config file's shape (PRD 3.2.2):
 *
 *   {"max_running_tasks": 4, "max_queued_tasks": 100, "allowed_priorities": ["P1","P2"],
 *    "allowed_models": ["general-chat"], "data_policy": {"allow_cloud": false}}
 *
 * Every generation build adds them after the file's applications (mg_apps_load); a name
 * the file also defines stays the file's (logged). Blocking: worker threads and start-up. */
#ifndef MG_APPS_H
#define MG_APPS_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "conf/config.h"
#include "store/store.h"

/* 1..128 of letters, digits and ". _ - : @". */
int mg_app_name_ok(const char *name);

/* Parse and validate a definition into *out (name copied). 0, or -1 with a message naming
 * the field in err (*out cleared). */
int mg_app_from_json(const cJSON *def, const char *name, mg_app_conf_t *out, char *err,
                     size_t errlen);

/* The application as JSON (the shape above, plus name and source). */
cJSON *mg_app_to_json(const mg_app_conf_t *a);

/* Add every stored application to cfg (a generation being built). 0, or -1 with err. */
int mg_apps_load(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen);

#endif
