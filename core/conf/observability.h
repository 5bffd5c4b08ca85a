/* observability: the `observability:` section of the config (the edge PRD's 3.10 names the
 * section): where the gateway's traces go over OTLP (obs/otlp.h).
 *
 *   observability:
 *     otlp:
 *       endpoint: http://127.0.0.1:4318   # OTLP/HTTP; spans are POSTed (JSON) to
 *                                         # {endpoint}/v1/traces (an endpoint that already
 *                                         # ends in /v1/traces is used as it is)
 *       headers:                          # sent with every export; ${NAME} expanded, never
 *         authorization: Bearer ${OTLP_TOKEN}   # logged
 *       interval_ms: 1000                 # a batch at least this often (50..60000)
 *       max_batch: 512                    # spans per export (1..8192)
 *       max_queue: 4096                   # spans waiting; past it new ones are dropped and
 *                                         # counted (1..1000000)
 *       timeout_ms: 5000                  # one export's deadline (100..60000)
 *       max_retries: 5                    # a failed batch is tried again this often, with
 *                                         # backoff 0.5 s, 1 s, 2 s ... 30 s (0..20)
 *       service_name: moongate            # the resource's service.name
 *
 * Read at start (like the listen addresses): a reload does not move the exporter. Without
 * `otlp` (the default) nothing is exported and the request path pays nothing. */
#ifndef MG_CONF_OBSERVABILITY_H
#define MG_CONF_OBSERVABILITY_H

#include <stddef.h>
#include <yaml.h>

typedef struct conf_loader_s conf_loader_t;

typedef struct mg_otlp_conf_s {
    char *endpoint;                       /* owned; NULL: no export */
    char **header_names, **header_values; /* owned, n_headers each */
    size_t n_headers;
    int interval_ms, max_batch, max_queue, timeout_ms, max_retries;
    char *service_name; /* owned, default "moongate" */
} mg_otlp_conf_t;

typedef struct mg_observability_conf_s {
    mg_otlp_conf_t otlp;
} mg_observability_conf_t;

void mg_observability_conf_defaults(mg_observability_conf_t *c);
/* Reads the section's node v (at line) into l's config. 0, or -1 with the loader's error set. */
int mg_observability_conf_load(conf_loader_t *l, yaml_node_t *v, int line);
void mg_observability_conf_clear(mg_observability_conf_t *c);

#endif
