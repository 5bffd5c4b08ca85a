/* cluster: the config's cluster section; see cluster.h. */
#include "conf/cluster.h"
#include "conf/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_KEY_PREFIX "moongate:"

void mg_cluster_conf_defaults(mg_cluster_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->redis.timeout_ms = 50;
    c->redis.pool_size = 2;
    c->redis.expected_instances = 1;
    c->redis.lease_ttl_ms = 15000;
    c->redis.health_samples = true;
    c->postgres.pool_size = 4;
}

void mg_cluster_conf_clear(mg_cluster_conf_t *c)
{
    if (c->redis.url) explicit_bzero(c->redis.url, strlen(c->redis.url));
    if (c->postgres.url) explicit_bzero(c->postgres.url, strlen(c->postgres.url));
    free(c->redis.url);
    free(c->redis.key_prefix);
    free(c->postgres.url);
    c->redis.url = c->redis.key_prefix = c->postgres.url = NULL;
}

const char *mg_cluster_degraded_name(mg_cluster_degraded_t m)
{
    return m == MG_DEGRADED_FAIL_CLOSED ? "fail_closed"
           : m == MG_DEGRADED_FAIL_OPEN ? "fail_open"
                                        : "local";
}

static int load_degraded(conf_loader_t *l, yaml_node_t *v, int line, mg_cluster_conf_t *c)
{
    char *mode = NULL;
    if (conf_opt_string(l, v, "cluster.redis", "degraded", &mode) < 0) return -1;
    if (!mode) return 0;
    int ok = 1;
    if (strcmp(mode, "local") == 0) c->redis.degraded = MG_DEGRADED_LOCAL;
    else if (strcmp(mode, "fail_closed") == 0) c->redis.degraded = MG_DEGRADED_FAIL_CLOSED;
    else if (strcmp(mode, "fail_open") == 0) c->redis.degraded = MG_DEGRADED_FAIL_OPEN;
    else ok = 0;
    free(mode);
    return ok ? 0
              : conf_fail(l, line,
                          "cluster.redis.degraded must be local, fail_closed or fail_open");
}

static int starts(const char *s, const char *prefix)
{
    return !strncmp(s, prefix, strlen(prefix));
}

/* The url's scheme only is checked here (the client library parses the rest); the message
 * never shows the url, which may hold a password. */
static int load_redis(conf_loader_t *l, yaml_node_t *v, int line, mg_cluster_conf_t *c)
{
    static const char *const keys[] = {"url",          "key_prefix",     "timeout_ms",
                                       "pool_size",    "degraded",       "expected_instances",
                                       "lease_ttl_ms", "health_samples", NULL};
    int m = conf_want_map(l, v, line, "cluster.redis", keys);
    if (m <= 0) return m;
    if (conf_req_string(l, v, "cluster.redis", "url", &c->redis.url) < 0 ||
        conf_opt_string(l, v, "cluster.redis", "key_prefix", &c->redis.key_prefix) < 0 ||
        conf_opt_int_field(l, v, "cluster.redis", "timeout_ms", 1, 60000, &c->redis.timeout_ms) <
            0 ||
        conf_opt_int_field(l, v, "cluster.redis", "pool_size", 1, 64, &c->redis.pool_size) < 0 ||
        load_degraded(l, v, line, c) < 0 ||
        conf_opt_int_field(l, v, "cluster.redis", "expected_instances", 1, 1000,
                           &c->redis.expected_instances) < 0 ||
        conf_opt_int_field(l, v, "cluster.redis", "lease_ttl_ms", 1000, 3600000,
                           &c->redis.lease_ttl_ms) < 0 ||
        conf_opt_bool(l, v, "cluster.redis", "health_samples", &c->redis.health_samples) < 0)
        return -1;
    if (!starts(c->redis.url, "redis://") && !starts(c->redis.url, "unix:"))
        return conf_fail(l, line, "cluster.redis.url must start with redis:// or unix:");
    if (c->redis.key_prefix && strlen(c->redis.key_prefix) > 64)
        return conf_fail(l, line, "cluster.redis.key_prefix must be at most 64 characters");
    return 0;
}

static int load_postgres(conf_loader_t *l, yaml_node_t *v, int line, mg_cluster_conf_t *c)
{
    static const char *const keys[] = {"url", "pool_size", NULL};
    int m = conf_want_map(l, v, line, "cluster.postgres", keys);
    if (m <= 0) return m;
    if (conf_req_string(l, v, "cluster.postgres", "url", &c->postgres.url) < 0 ||
        conf_opt_int_field(l, v, "cluster.postgres", "pool_size", 1, 64, &c->postgres.pool_size) <
            0)
        return -1;
    const char *u = c->postgres.url;
    if (!starts(u, "postgres://") && !starts(u, "postgresql://") && !strchr(u, '='))
        return conf_fail(l, line,
                         "cluster.postgres.url must be a postgres:// or postgresql:// URL or "
                         "key=value connection string");
    return 0;
}

static int load_part(conf_loader_t *l, yaml_node_t *v, const char *key,
                     int (*load)(conf_loader_t *, yaml_node_t *, int, mg_cluster_conf_t *))
{
    yaml_node_pair_t *p = conf_find_pair(l, v, key);
    if (!p) return 0;
    return load(l, conf_node_at(l, p->value), conf_line_of(conf_node_at(l, p->key)),
                &l->cfg->cluster);
}

static int valid_node_id(const char *s)
{
    return strlen(s) <= MG_NODE_ID_MAX && conf_all_chars(s, "._:-");
}

int mg_cluster_conf_load(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"node_id", "redis", "postgres", NULL};
    int m = conf_want_map(l, v, line, "cluster", keys);
    if (m <= 0) return m;
    mg_cluster_conf_t *c = &l->cfg->cluster;
    char *node = NULL;
    if (conf_opt_string(l, v, "cluster", "node_id", &node) < 0) return -1;
    if (node) {
        int ok = valid_node_id(node);
        if (ok) snprintf(c->node_id, sizeof c->node_id, "%s", node);
        free(node);
        if (!ok)
            return conf_fail(l, line,
                             "cluster.node_id must be 1-%d letters, digits or . _ : - characters",
                             MG_NODE_ID_MAX);
    }
    if (load_part(l, v, "redis", load_redis) < 0 || load_part(l, v, "postgres", load_postgres) < 0)
        return -1;
    if (c->redis.url && !c->redis.key_prefix) c->redis.key_prefix = strdup(DEFAULT_KEY_PREFIX);
    if (c->redis.url && !c->redis.key_prefix) return conf_fail(l, line, "out of memory");
    return 0;
}

void mg_cluster_conf_finish(mg_cluster_conf_t *c, const char *listen)
{
    if (c->node_id[0]) return;
    char host[64] = "localhost";
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    const char *port = listen ? strrchr(listen, ':') : NULL;
    snprintf(c->node_id, sizeof c->node_id, "%s:%s", host, port ? port + 1 : "0");
}
