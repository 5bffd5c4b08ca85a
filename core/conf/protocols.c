/* protocols: the config's protocols section; see protocols.h. Its own small reader, so
 * config.c only hands the node over. */
#include "conf/protocols.h"

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

static int fail(const char *name, const yaml_node_t *n, char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "%s:%d: protocols%s", name, n ? (int)n->start_mark.line + 1 : 0, what);
    return -1;
}

static const char *text(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
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

/* forward_headers: { adapter: [names] } replaces the defaults. */
static int load_allow(yaml_document_t *doc, yaml_node_t *v, const char *name,
                      mg_protocols_conf_t *c, char *err, size_t errlen)
{
    if (v->type != YAML_MAPPING_NODE)
        return fail(name, v, err, errlen, ".forward_headers must be a mapping of adapter: [names]");
    mg_protocols_conf_clear(c);
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *list = yaml_document_get_node(doc, p->value);
        const char *adapter = text(k);
        if (!adapter || !*adapter || mg_protocols_allow(c, adapter))
            return fail(name, k, err, errlen, ".forward_headers: adapter names, each once");
        if (!list || list->type != YAML_SEQUENCE_NODE)
            return fail(name, list ? list : k, err, errlen,
                        ".forward_headers: each adapter's value is a list of header names");
        mg_header_allow_t *a = allow_add(c, adapter);
        if (!a) return fail(name, k, err, errlen, ": out of memory");
        for (yaml_node_item_t *i = list->data.sequence.items.start;
             i < list->data.sequence.items.top; i++) {
            yaml_node_t *h = yaml_document_get_node(doc, *i);
            const char *hn = text(h);
            if (!header_name_ok(hn))
                return fail(name, h, err, errlen,
                            ".forward_headers: a header name (letters, digits, '-', '_'; a "
                            "final '*' for a prefix)");
            if (!strcasecmp(hn, "authorization") || !strcasecmp(hn, "x-api-key") ||
                !strcasecmp(hn, "cookie") || !strcasecmp(hn, "host") ||
                !strcasecmp(hn, "content-length"))
                return fail(name, h, err, errlen,
                            ".forward_headers: credentials and framing headers (authorization, "
                            "x-api-key, cookie, host, content-length) are never forwarded");
            if (allow_name(a, hn)) return fail(name, h, err, errlen, ": out of memory");
        }
    }
    return 0;
}

int mg_protocols_conf_load(yaml_document_t *doc, yaml_node_t *v, const char *name,
                           mg_protocols_conf_t *c, char *err, size_t errlen)
{
    if (!v || (v->type == YAML_SCALAR_NODE && !v->data.scalar.length)) return 0;
    if (v->type != YAML_MAPPING_NODE) return fail(name, v, err, errlen, " must be a mapping");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *val = yaml_document_get_node(doc, p->value);
        const char *key = text(k);
        if (key && !strcmp(key, "ping_interval_ms")) {
            const char *s = text(val);
            char *end = NULL;
            long long n = s ? strtoll(s, &end, 10) : -1;
            if (!s || !*s || *end || n < 0 || n > 3600000 || (n > 0 && n < 100))
                return fail(name, val, err, errlen,
                            ".ping_interval_ms must be 0 (off) or 100..3600000 milliseconds");
            c->ping_interval_ms = (int)n;
        } else if (key && !strcmp(key, "forward_headers")) {
            if (load_allow(doc, val, name, c, err, errlen)) return -1;
        } else {
            char what[160];
            snprintf(what, sizeof(what), ".%.60s is not a known key", key ? key : "?");
            return fail(name, k, err, errlen, what);
        }
    }
    return 0;
}
