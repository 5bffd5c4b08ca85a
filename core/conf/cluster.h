/* cluster: the `cluster:` section of the config, for several instances sharing state
 * (multi-tenant design, "扩容方式"). Either part may be configured alone; with neither, the
 * instance is the embedded default (SQLite, local state) and nothing here is used but node_id.
 *
 *   cluster:
 *     node_id: edge-1                  # default: host name + ":" + server.listen's port
 *     redis:                           # shared limits, cooldowns, health, idempotency
 *       url: redis://127.0.0.1:6379/0  # redis://[:password@]host:port[/db] or unix:/path
 *       key_prefix: "moongate:"        # every key this instance writes starts with it
 *       timeout_ms: 50                 # a request never waits longer on Redis
 *       pool_size: 2                   # connections
 *       degraded: local                # Redis unreachable or late: local | fail_closed |
 *                                      # fail_open (the shared limits' fallback)
 *       expected_instances: 1          # local: each instance enforces limit / this
 *       lease_ttl_ms: 15000            # a concurrency lease or spend hold lives this long
 *                                      # unless renewed (every third of it, while its
 *                                      # request runs): a dead instance's return after it
 *       health_samples: true           # route health shared through <key_prefix>health
 *     postgres:                        # control plane, usage, ledger
 *       url: postgres://moongate@127.0.0.1:5432/moongate  # or postgresql://, or key=value
 *       pool_size: 4
 *
 * Both urls take ${NAME} from the environment and are secrets (they may hold passwords):
 * never logged, never shown in errors. */
#ifndef MG_CONF_CLUSTER_H
#define MG_CONF_CLUSTER_H

#include <stdbool.h>
#include <yaml.h>

typedef struct conf_loader_s conf_loader_t;

#define MG_NODE_ID_MAX 128

/* What the shared limits do while Redis is unreachable or late (cluster/limits.h). */
typedef enum mg_cluster_degraded_e {
    MG_DEGRADED_LOCAL = 0,   /* each instance enforces the limits locally, as a single node */
    MG_DEGRADED_FAIL_CLOSED, /* 503 CLUSTER_UNAVAILABLE */
    MG_DEGRADED_FAIL_OPEN,   /* admitted without the key's and project's limits */
} mg_cluster_degraded_t;

/* "local", "fail_closed", "fail_open". */
const char *mg_cluster_degraded_name(mg_cluster_degraded_t m);

typedef struct mg_cluster_conf_s {
    char node_id[MG_NODE_ID_MAX + 1]; /* always set after loading */
    struct {
        char *url;                      /* owned; NULL: no Redis */
        char *key_prefix;               /* owned, default "moongate:" */
        int timeout_ms;                 /* default 50 */
        int pool_size;                  /* default 2 */
        mg_cluster_degraded_t degraded; /* default local */
        int expected_instances;         /* local: each enforces its share, limit / this (1) */
        int lease_ttl_ms;               /* leases and spend holds unless renewed (15000) */
        bool health_samples;            /* share route health samples (cluster/samples.h): true */
    } redis;
    struct {
        char *url;     /* owned; NULL: no PostgreSQL */
        int pool_size; /* default 4 */
    } postgres;
} mg_cluster_conf_t;

void mg_cluster_conf_defaults(mg_cluster_conf_t *c);
/* Reads the section's node v (at line) into l's config. 0, or -1 with the loader's error set. */
int mg_cluster_conf_load(conf_loader_t *l, yaml_node_t *v, int line);
/* After every section: the default node id (host name + ":" + port of listen) when none was
 * given. */
void mg_cluster_conf_finish(mg_cluster_conf_t *c, const char *listen);
void mg_cluster_conf_clear(mg_cluster_conf_t *c);

#endif
