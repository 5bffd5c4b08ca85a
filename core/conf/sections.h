/* sections: the readers of the config's sections, each filling the loader's mg_config_t from
 * one top-level mapping (conf/config.c walks the file and calls them in its fixed order).
 * They live by subject:
 *   conf/process.c  server, storage, tokenizer, auth, lua, log, upstream
 *   conf/serving.c  timeouts, routing, scheduler, tasks, idempotency, circuit_breaker, health
 *   conf/catalog.c  providers, models
 *   conf/access.c   applications, users
 * and the smaller sections in files of their own (usage, billing, context, cluster, ...).
 * Each returns 0, or -1 with "NAME:LINE: reason" in the loader's error. */
#ifndef MG_CONF_SECTIONS_H
#define MG_CONF_SECTIONS_H

#include "conf/loader.h"

int conf_section_server(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_storage(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_tokenizer(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_auth(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_lua(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_log(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_upstream(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_timeouts(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_routing(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_scheduler(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_tasks(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_idempotency(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_breaker(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_health(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_providers(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_models(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_applications(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_users(conf_loader_t *l, yaml_node_t *v, int line);
/* in files of their own */
int conf_section_context(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_protocols(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_billing(conf_loader_t *l, yaml_node_t *v, int line);
int conf_section_dashboard(conf_loader_t *l, yaml_node_t *v, int line);

#endif
