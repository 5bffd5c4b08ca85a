/* protocols: the config's protocols section; see protocols.h. */
#include "conf/protocols.h"
#include "conf/sections.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void allow_clear(mg_header_allow_t *a)
{
    for (size_t i = 0; i < a->n_names; i++) free(a->names[i]);
    free(a->names);
    free(a->adapter);
    memset(a, 0, sizeof(*a));
}

void mg_protocols_conf_clear(mg_protocols_conf_t *c)
{
    for (size_t i = 0; i < c->n_allow; i++) allow_clear(&c->allow[i]);
    free(c->allow);
    c->allow = NULL;
    c->n_allow = 0;
}

/* A new (empty) allowlist for adapter at the end of c's; NULL when out of memory. */
static mg_header_allow_t *allow_add(mg_protocols_conf_t *c, const char *adapter)
{
    mg_header_allow_t *n = realloc(c->allow, (c->n_allow + 1) * sizeof(*n));
    if (!n) return NULL;
    c->allow = n;
    mg_header_allow_t *a = &n[c->n_allow];
    memset(a, 0, sizeof(*a));
    a->adapter = strdup(adapter);
    if (!a->adapter) return NULL;
    c->n_allow++;
    return a;
}

/* name, lower-cased, onto a's list. 0 or -1 (out of memory). */
static int allow_name(mg_header_allow_t *a, const char *name)
{
    char **n = realloc(a->names, (a->n_names + 1) * sizeof(*n));
    if (!n) return -1;
    a->names = n;
    char *s = strdup(name);
    if (!s) return -1;
    for (char *p = s; *p; p++) *p = (char)tolower((unsigned char)*p);
    a->names[a->n_names++] = s;
    return 0;
}

int mg_protocols_conf_defaults(mg_protocols_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->ping_interval_ms = 15000;
    c->responses_retention_s = 30 * 86400;
    c->models_refresh_s = 300;
    mg_header_allow_t *a = allow_add(c, "anthropic");
    if (!a || allow_name(a, "anthropic-version") || allow_name(a, "anthropic-beta")) return -1;
    return 0;
}

const mg_header_allow_t *mg_protocols_allow(const mg_protocols_conf_t *c, const char *adapter)
{
    for (size_t i = 0; adapter && i < c->n_allow; i++)
        if (!strcmp(c->allow[i].adapter, adapter)) return &c->allow[i];
    return NULL;
}

int mg_header_allowed(const mg_header_allow_t *a, const char *name)
{
    if (!a || !name) return 0;
    size_t len = strlen(name);
    for (size_t i = 0; i < a->n_names; i++) {
        const char *n = a->names[i];
        size_t nl = strlen(n);
        if (nl && n[nl - 1] == '*') {
            if (len >= nl - 1 && !strncasecmp(name, n, nl - 1)) return 1;
        } else if (!strcasecmp(name, n)) return 1;
    }
    return 0;
}

/* A header name as HTTP allows it (a token), with an optional "*" at its end. */
static int header_name_ok(const char *s)
{
    if (!s || !*s) return 0;
    for (const char *p = s; *p; p++) {
        if (*p == '*' && !p[1] && p > s) return 1;
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_') return 0;
    }
    return 1;
}

static int forbidden_header(const char *n)
{
    static const char *const never[] = {"authorization", "x-api-key",      "cookie",
                                        "host",          "content-length", NULL};
    for (int i = 0; never[i]; i++)
        if (!strcasecmp(n, never[i])) return 1;
    return 0;
}

/* One adapter's list of header names. */
static int load_names(conf_loader_t *l, yaml_node_t *list, int line, mg_header_allow_t *a)
{
    if (!list || list->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, line,
                         "protocols.forward_headers: each adapter's value is a list of header "
                         "names");
    for (yaml_node_item_t *i = list->data.sequence.items.start; i < list->data.sequence.items.top;
         i++) {
        yaml_node_t *h = conf_node_at(l, *i);
        const char *hn = conf_is_scalar(h) ? conf_scalar_text(h) : NULL;
        if (!header_name_ok(hn))
            return conf_fail(l, conf_line_of(h),
                             "protocols.forward_headers: a header name (letters, digits, '-', "
                             "'_'; a final '*' for a prefix)");
        if (forbidden_header(hn))
            return conf_fail(l, conf_line_of(h),
                             "protocols.forward_headers: credentials and framing headers "
                             "(authorization, x-api-key, cookie, host, content-length) are never "
                             "forwarded");
        if (allow_name(a, hn)) return conf_fail(l, conf_line_of(h), "out of memory");
    }
    return 0;
}

/* forward_headers: { adapter: [names] } replaces the defaults. */
static int load_allow(conf_loader_t *l, yaml_node_t *v, int line, mg_protocols_conf_t *c)
{
    if (conf_want_map(l, v, line, "protocols.forward_headers", NULL) < 0) return -1;
    if (v->type != YAML_MAPPING_NODE)
        return conf_fail(l, line,
                         "protocols.forward_headers must be a mapping of adapter: [names]");
    mg_protocols_conf_clear(c);
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = conf_node_at(l, p->key);
        const char *adapter = conf_scalar_text(k);
        if (!*adapter)
            return conf_fail(l, conf_line_of(k), "protocols.forward_headers: an adapter name");
        mg_header_allow_t *a = allow_add(c, adapter);
        if (!a) return conf_fail(l, conf_line_of(k), "out of memory");
        if (load_names(l, conf_node_at(l, p->value), conf_line_of(k), a) < 0) return -1;
    }
    return 0;
}

int conf_section_protocols(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"ping_interval_ms", "forward_headers",
                                       "responses_retention_seconds", "models_refresh_seconds",
                                       NULL};
    int m = conf_want_map(l, v, line, "protocols", keys);
    if (m <= 0) return m;
    mg_protocols_conf_t *c = &l->cfg->protocols;
    int ping = c->ping_interval_ms;
    if (conf_opt_int_field(l, v, "protocols", "ping_interval_ms", 0, 3600000, &ping) < 0) return -1;
    if (ping > 0 && ping < 100)
        return conf_fail(l, line,
                         "protocols.ping_interval_ms must be 0 (off) or 100..3600000 "
                         "milliseconds");
    c->ping_interval_ms = ping;
    if (conf_opt_int_field(l, v, "protocols", "responses_retention_seconds", 60, 3650 * 86400,
                           &c->responses_retention_s) < 0)
        return -1;
    if (conf_opt_int_field(l, v, "protocols", "models_refresh_seconds", 0, 86400,
                           &c->models_refresh_s) < 0)
        return -1;
    yaml_node_pair_t *fh = conf_find_pair(l, v, "forward_headers");
    return fh ? load_allow(l, conf_node_at(l, fh->value), conf_line_of(conf_node_at(l, fh->key)), c)
              : 0;
}
