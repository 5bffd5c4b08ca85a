/* dashboard (conf): the `dashboard:` section; see dashboard.h. */
#include "conf/dashboard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_dashboard_conf_defaults(mg_dashboard_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->enabled = true;
    c->session_ttl_s = 8 * 3600;
    c->max_sessions = 64;
    c->max_streams = 8;
    c->stream_interval_ms = 1000;
}

static int line_of(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 1;
}

static int say(char *msg, size_t cap, const yaml_node_t *n, const char *fmt, const char *key)
{
    snprintf(msg, cap, fmt, key);
    return line_of(n);
}

static int as_bool(const char *s, bool *out)
{
    if (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on")) *out = true;
    else if (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off")) *out = false;
    else return -1;
    return 0;
}

static int as_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

typedef struct int_key_s {
    const char *key;
    int lo, hi;
    size_t off;
} int_key_t;

static const int_key_t int_keys[] = {
    {"session_ttl_s", 60, 604800, offsetof(mg_dashboard_conf_t, session_ttl_s)},
    {"max_sessions", 1, 4096, offsetof(mg_dashboard_conf_t, max_sessions)},
    {"max_streams", 1, 256, offsetof(mg_dashboard_conf_t, max_streams)},
    {"stream_interval_ms", 250, 60000, offsetof(mg_dashboard_conf_t, stream_interval_ms)},
};

/* One key: value pair; 0 or the line of the error. */
static int parse_pair(const char *key, yaml_node_t *val, mg_dashboard_conf_t *c, char *msg,
                      size_t cap)
{
    if (val->type != YAML_SCALAR_NODE)
        return say(msg, cap, val, "dashboard.%s must be a plain value", key);
    const char *s = (const char *)val->data.scalar.value;
    for (size_t i = 0; i < sizeof(int_keys) / sizeof(int_keys[0]); i++) {
        if (strcmp(key, int_keys[i].key) != 0) continue;
        int *dst = (int *)((char *)c + int_keys[i].off);
        if (as_int(s, int_keys[i].lo, int_keys[i].hi, dst) == 0) return 0;
        snprintf(msg, cap, "dashboard.%s must be an integer from %d to %d", key, int_keys[i].lo,
                 int_keys[i].hi);
        return line_of(val);
    }
    if (!strcmp(key, "enabled") || !strcmp(key, "secure_cookie")) {
        if (as_bool(s, !strcmp(key, "enabled") ? &c->enabled : &c->secure_cookie) == 0) return 0;
        return say(msg, cap, val, "dashboard.%s must be true or false", key);
    }
    if (!strcmp(key, "dir")) {
        if (*s && strlen(s) < sizeof(c->dir)) {
            snprintf(c->dir, sizeof(c->dir), "%s", s);
            return 0;
        }
        return say(msg, cap, val, "dashboard.%s must be a directory path (1..511 bytes)", key);
    }
    return say(msg, cap, val,
               "dashboard: unknown key '%s' (enabled, dir, session_ttl_s, max_sessions, "
               "max_streams, stream_interval_ms, secure_cookie)",
               key);
}

int mg_dashboard_conf_parse(yaml_document_t *doc, yaml_node_t *v, mg_dashboard_conf_t *c, char *msg,
                            size_t cap)
{
    if (v->type == YAML_SCALAR_NODE && (!*(const char *)v->data.scalar.value ||
                                        !strcmp((const char *)v->data.scalar.value, "null")))
        return 0; /* an empty section: the defaults */
    if (v->type != YAML_MAPPING_NODE) return say(msg, cap, v, "%s must be a mapping", "dashboard");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *val = yaml_document_get_node(doc, p->value);
        if (!k || !val || k->type != YAML_SCALAR_NODE)
            return say(msg, cap, k ? k : v, "%s: keys must be plain names", "dashboard");
        int at = parse_pair((const char *)k->data.scalar.value, val, c, msg, cap);
        if (at) return at;
    }
    return 0;
}
