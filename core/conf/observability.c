/* observability: the config's observability section; see observability.h. */
#include "conf/observability.h"
#include "conf/loader.h"

#include <stdlib.h>
#include <string.h>

void mg_observability_conf_defaults(mg_observability_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->otlp.interval_ms = 1000;
    c->otlp.max_batch = 512;
    c->otlp.max_queue = 4096;
    c->otlp.timeout_ms = 5000;
    c->otlp.max_retries = 5;
}

void mg_observability_conf_clear(mg_observability_conf_t *c)
{
    mg_otlp_conf_t *o = &c->otlp;
    for (size_t i = 0; i < o->n_headers; i++) {
        free(o->header_names[i]);
        if (o->header_values[i]) explicit_bzero(o->header_values[i], strlen(o->header_values[i]));
        free(o->header_values[i]);
    }
    free(o->header_names);
    free(o->header_values);
    free(o->endpoint);
    free(o->service_name);
    o->header_names = o->header_values = NULL;
    o->n_headers = 0;
    o->endpoint = o->service_name = NULL;
}

/* An HTTP header name: a token (RFC 9110), at most 128 characters. */
static int header_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (!n || n > 128) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("!#$%&'*+-.^_`|~", s[i]) &&
            !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

/* headers: a mapping of names to strings (${NAME} expanded; a value may be a secret, so no
 * message shows it). */
static int load_headers(conf_loader_t *l, yaml_node_t *v, int line, mg_otlp_conf_t *o)
{
    int m = conf_want_map(l, v, line, "observability.otlp.headers", NULL);
    if (m <= 0) return m;
    size_t n = (size_t)(v->data.mapping.pairs.top - v->data.mapping.pairs.start);
    if (n > 32) return conf_fail(l, line, "observability.otlp.headers: at most 32 headers");
    o->header_names = calloc(n ? n : 1, sizeof(char *));
    o->header_values = calloc(n ? n : 1, sizeof(char *));
    if (!o->header_names || !o->header_values) return conf_fail(l, line, "out of memory");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = conf_node_at(l, p->key), *val = conf_node_at(l, p->value);
        int at = conf_line_of(k);
        const char *name = conf_scalar_text(k);
        if (!header_name_ok(name))
            return conf_fail(l, at, "observability.otlp.headers: '%.64s' is not a header name",
                             name);
        if (!conf_is_scalar(val) || conf_is_null(val))
            return conf_fail(l, at, "observability.otlp.headers.%s must be a string", name);
        char *value = conf_expand(l, val, at, "observability.otlp.headers", NULL);
        if (!value) return -1;
        if (strpbrk(value, "\r\n")) {
            free(value);
            return conf_fail(l, at, "observability.otlp.headers.%s: no line breaks", name);
        }
        o->header_names[o->n_headers] = strdup(name);
        o->header_values[o->n_headers++] = value;
        if (!o->header_names[o->n_headers - 1]) return conf_fail(l, at, "out of memory");
    }
    return 0;
}

static int load_otlp(conf_loader_t *l, yaml_node_t *v, int line, mg_otlp_conf_t *o)
{
    static const char *const keys[] = {"endpoint",    "headers",      "interval_ms",
                                       "max_batch",   "max_queue",    "timeout_ms",
                                       "max_retries", "service_name", NULL};
    const char *p = "observability.otlp";
    int m = conf_want_map(l, v, line, p, keys);
    if (m <= 0) return m;
    if (conf_req_string(l, v, p, "endpoint", &o->endpoint) < 0 ||
        conf_opt_int_field(l, v, p, "interval_ms", 50, 60000, &o->interval_ms) < 0 ||
        conf_opt_int_field(l, v, p, "max_batch", 1, 8192, &o->max_batch) < 0 ||
        conf_opt_int_field(l, v, p, "max_queue", 1, 1000000, &o->max_queue) < 0 ||
        conf_opt_int_field(l, v, p, "timeout_ms", 100, 60000, &o->timeout_ms) < 0 ||
        conf_opt_int_field(l, v, p, "max_retries", 0, 20, &o->max_retries) < 0 ||
        conf_opt_string(l, v, p, "service_name", &o->service_name) < 0)
        return -1;
    if (strncmp(o->endpoint, "http://", 7) != 0 && strncmp(o->endpoint, "https://", 8) != 0)
        return conf_fail(l, line,
                         "observability.otlp.endpoint must start with http:// or https://");
    yaml_node_pair_t *h = conf_find_pair(l, v, "headers");
    if (h &&
        load_headers(l, conf_node_at(l, h->value), conf_line_of(conf_node_at(l, h->key)), o) < 0)
        return -1;
    if (!o->service_name) o->service_name = strdup("moongate");
    if (!o->service_name) return conf_fail(l, line, "out of memory");
    return 0;
}

int mg_observability_conf_load(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"otlp", NULL};
    int m = conf_want_map(l, v, line, "observability", keys);
    if (m <= 0) return m;
    yaml_node_pair_t *p = conf_find_pair(l, v, "otlp");
    if (!p) return 0;
    return load_otlp(l, conf_node_at(l, p->value), conf_line_of(conf_node_at(l, p->key)),
                     &l->cfg->observability.otlp);
}
