/* config: the YAML configuration file turned into a validated mg_config_t.
 *
 * libyaml's document API builds the node tree (each node keeps its start mark, so every
 * error can name the line). A small schema walker then visits the known sections in a
 * fixed order, expands ${NAME} references from the environment in scalar values, checks
 * types and ranges, and fills an mg_config_t that starts out holding every default.
 * Strictness is the point: unknown keys, duplicate keys and wrong types are errors, so a
 * typo in a config never passes silently.
 *
 * What this file deliberately does not do: merge keys (<<), tags, `$${` escapes, size
 * suffixes ("16MiB"), or more than one YAML document per file.
 *
 * Secrets: providers[].api_key is never copied into an error message, and neither is
 * the value of any environment variable it references.
 *
 * Aliases: the document API shares aliased nodes instead of copying them, so a small file
 * can describe a huge tree ("billion laughs"). The walker has a fixed depth, and every
 * byte the result allocates is charged to a budget proportional to the input size. */
#include "conf/config.h"
#include "store/store.h"

#include "token/encoding.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define DEFAULT_MAX_HEADER_BYTES (16u * 1024u)
#define DEFAULT_STORAGE_PATH "data/moongate.db"
#define MAX_FILE_BYTES (4u * 1024u * 1024u)
#define MAX_ID_LEN 128          /* provider ids and adapter names */
#define MAX_NAME_LEN 256        /* logical and upstream model names */
#define MAX_TIMEOUT_MS 86400000 /* one day: keeps ms arithmetic far from int overflow */
#define KIB 1024LL
#define MIB (1024LL * 1024LL)
#define GIB (1024LL * 1024LL * 1024LL)

typedef struct loader_s {
    const char *name;  /* file name for messages */
    const char *input; /* the YAML text (reader errors give a byte offset) */
    size_t input_len;
    yaml_document_t *doc;
    mg_config_t *cfg;
    char *err;
    size_t err_len;
    size_t budget; /* bytes the result may still allocate; bounds alias expansion */
} loader_t;

/* ---------------------------------------------------------------- errors and helpers */

/* Writes "NAME:LINE: message" (or "NAME: message" when line <= 0) into the error buffer
 * and returns -1, so callers can `return fail(...)`. */
static int fail(loader_t *l, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(loader_t *l, int line, const char *fmt, ...)
{
    if (!l->err || l->err_len == 0) return -1;
    int n;
    if (line > 0) n = snprintf(l->err, l->err_len, "%s:%d: ", l->name, line);
    else n = snprintf(l->err, l->err_len, "%s: ", l->name);
    if (n < 0 || (size_t)n >= l->err_len) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err + n, l->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static int line_of(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 0;
}

static yaml_node_t *node_at(loader_t *l, int index)
{
    return yaml_document_get_node(l->doc, index);
}

/* Takes `bytes` from the allocation budget; fails once a (probably aliased) document
 * would expand far beyond its own size. */
static int charge(loader_t *l, int line, size_t bytes)
{
    if (bytes > l->budget) return fail(l, line, "configuration expands too much (aliases?)");
    l->budget -= bytes;
    return 0;
}

/* Copies s for the result, charging the budget. */
static char *dup_str(loader_t *l, int line, const char *s)
{
    size_t n = strlen(s) + 1;
    if (charge(l, line, n) < 0) return NULL;
    char *p = malloc(n);
    if (!p) {
        fail(l, line, "out of memory");
        return NULL;
    }
    memcpy(p, s, n);
    return p;
}

/* A short printable rendering of a value for messages (never used for secrets):
 * non-printable bytes become '?', long values end in "...". */
static const char *shown(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    for (; s[i] && i + 4 < len; i++) buf[i] = isprint((unsigned char)s[i]) ? s[i] : '?';
    strcpy(buf + i, s[i] ? "..." : "");
    return buf;
}

static bool is_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE;
}

static const char *scalar_text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A plain (unquoted) empty, ~ or null scalar is YAML's null. */
static bool is_null(const yaml_node_t *n)
{
    if (!is_scalar(n) || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = scalar_text(n);
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

/* --------------------------------------------------------------- ${NAME} expansion */

typedef struct strbuf_s {
    char *p;
    size_t len, cap;
} strbuf_t;

static int sb_add(strbuf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static bool valid_env_name(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
    return true;
}

/* Returns a malloc'd copy of the scalar `v` with every ${NAME} replaced by the value of
 * environment variable NAME; text around references is kept. An undefined variable is an
 * error, unless `missing` is given (api_key): then an undefined or empty variable sets
 * *missing and the caller treats the whole value as absent. `path` names the key in
 * messages, which may name a variable but never show the value or the scalar, so this is
 * safe for secrets. Returns NULL with the error set on failure. */
static char *expand(loader_t *l, const yaml_node_t *v, int line, const char *path, bool *missing)
{
    const char *s = scalar_text(v);
    if (strlen(s) != v->data.scalar.length) {
        fail(l, line, "%s contains a NUL character", path);
        return NULL;
    }
    strbuf_t b = {0};
    if (sb_add(&b, "", 0) < 0) goto oom;
    while (*s) {
        const char *ref = strstr(s, "${");
        if (!ref) {
            if (sb_add(&b, s, strlen(s)) < 0) goto oom;
            break;
        }
        if (sb_add(&b, s, (size_t)(ref - s)) < 0) goto oom;
        const char *name = ref + 2;
        const char *end = strchr(name, '}');
        if (!end) {
            fail(l, line, "unterminated ${ in %s", path);
            goto err;
        }
        size_t n = (size_t)(end - name);
        if (!valid_env_name(name, n)) {
            fail(l, line, "invalid environment variable reference in %s (expected ${NAME})", path);
            goto err;
        }
        char var[256];
        if (n >= sizeof var) {
            fail(l, line, "environment variable name too long in %s", path);
            goto err;
        }
        memcpy(var, name, n);
        var[n] = '\0';
        const char *val = getenv(var);
        if (missing && (!val || !*val)) {
            *missing = true;
        } else if (!val) {
            fail(l, line, "undefined environment variable '%s' in %s", var, path);
            goto err;
        } else if (sb_add(&b, val, strlen(val)) < 0) {
            goto oom;
        }
        s = end + 1;
    }
    if (charge(l, line, b.len + 1) < 0) goto err;
    return b.p;
oom:
    fail(l, line, "out of memory");
err:
    free(b.p);
    return NULL;
}

/* ------------------------------------------------------------------ mapping walking */

static bool key_is(loader_t *l, const yaml_node_pair_t *p, const char *key)
{
    yaml_node_t *k = node_at(l, p->key);
    return is_scalar(k) && !strcmp(scalar_text(k), key);
}

/* The pair with scalar key `key` in mapping `map`, or NULL. */
static yaml_node_pair_t *find_pair(loader_t *l, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
        if (key_is(l, p, key)) return p;
    return NULL;
}

typedef struct keyref_s {
    const char *key;
    size_t index;
} keyref_t;

static int keyref_cmp(const void *a, const void *b)
{
    const keyref_t *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Index of the first entry (in file order) whose key repeats an earlier one, or -1.
 * Sorting keeps this O(n log n) for large, fuzzed inputs. Reorders `refs`. */
static long first_duplicate(keyref_t *refs, size_t n)
{
    qsort(refs, n, sizeof *refs, keyref_cmp);
    long best = -1;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(refs[i - 1].key, refs[i].key) && (best < 0 || refs[i].index < (size_t)best))
            best = (long)refs[i].index;
    return best;
}

/* Checks that every key of mapping `map` is a string, appears once and, when `allowed`
 * (NULL-terminated) is given, is one of the allowed keys. `where` completes messages:
 * "unknown key 'x' in server". */
static int check_keys(loader_t *l, yaml_node_t *map, const char *where, const char *const *allowed)
{
    yaml_node_pair_t *start = map->data.mapping.pairs.start;
    size_t n = (size_t)(map->data.mapping.pairs.top - start);
    char buf[72];
    unsigned long long seen = 0; /* bit i: allowed[i] already met */
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *k = node_at(l, start[i].key);
        if (!is_scalar(k) || is_null(k))
            return fail(l, line_of(k), "keys must be strings %s", where);
        const char *key = scalar_text(k);
        if (strlen(key) != k->data.scalar.length)
            return fail(l, line_of(k), "key contains a NUL character %s", where);
        if (!allowed) continue;
        size_t a = 0;
        while (allowed[a] && strcmp(allowed[a], key)) a++;
        if (!allowed[a])
            return fail(l, line_of(k), "unknown key '%s' %s", shown(key, buf, sizeof buf), where);
        if (seen & (1ULL << a)) return fail(l, line_of(k), "duplicate key '%s' %s", key, where);
        seen |= 1ULL << a;
    }
    if (allowed || n < 2) return 0;
    keyref_t *refs = malloc(n * sizeof *refs);
    if (!refs) return fail(l, line_of(map), "out of memory");
    for (size_t i = 0; i < n; i++) refs[i] = (keyref_t){scalar_text(node_at(l, start[i].key)), i};
    long dup = first_duplicate(refs, n);
    free(refs);
    if (dup >= 0) {
        yaml_node_t *k = node_at(l, start[dup].key);
        return fail(l, line_of(k), "duplicate key '%s' %s", shown(scalar_text(k), buf, sizeof buf),
                    where);
    }
    return 0;
}

/* Checks that `v` (the value at `path`, on `line`) is a mapping with only `allowed` keys.
 * Returns 1 for a mapping, 0 for null (an empty section), -1 on error. */
static int want_map(loader_t *l, yaml_node_t *v, int line, const char *path,
                    const char *const *allowed)
{
    if (is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE) return fail(l, line, "%s must be a mapping", path);
    char where[340];
    snprintf(where, sizeof where, "in %s", path);
    return check_keys(l, v, where, allowed) < 0 ? -1 : 1;
}

/* ----------------------------------------------------------------- typed field access */

/* A field being read: the mapping it lives in, the value and its dotted path. */
typedef struct field_s {
    yaml_node_t *val; /* NULL when the key is absent */
    int line;         /* the key's line (the mapping's when absent) */
    char path[360];   /* e.g. "server.listen", "providers[2].weight" */
} field_t;

static void field_get(loader_t *l, yaml_node_t *map, const char *path, const char *key, field_t *f)
{
    yaml_node_pair_t *p = map ? find_pair(l, map, key) : NULL;
    f->val = p ? node_at(l, p->value) : NULL;
    f->line = p ? line_of(node_at(l, p->key)) : line_of(map);
    snprintf(f->path, sizeof f->path, "%s.%s", path, key);
}

/* Reads the field as a string with ${NAME} expanded; the result is owned by the caller.
 * Null and non-scalars are type errors. */
static int field_string(loader_t *l, const field_t *f, char **out)
{
    if (!is_scalar(f->val) || is_null(f->val))
        return fail(l, f->line, "%s must be a string", f->path);
    *out = expand(l, f->val, f->line, f->path, NULL);
    return *out ? 0 : -1;
}

/* Optional non-empty string: absent leaves *dst unchanged; present replaces it. */
static int opt_string(loader_t *l, yaml_node_t *map, const char *path, const char *key, char **dst)
{
    field_t f;
    field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL;
    if (field_string(l, &f, &s) < 0) return -1;
    if (!*s) {
        free(s);
        return fail(l, f.line, "%s must not be empty", f.path);
    }
    free(*dst);
    *dst = s;
    return 0;
}

/* Required non-empty string. */
static int req_string(loader_t *l, yaml_node_t *map, const char *path, const char *key, char **dst)
{
    if (!find_pair(l, map, key))
        return fail(l, line_of(map), "%s is missing required key '%s'", path, key);
    return opt_string(l, map, path, key, dst);
}

/* Optional integer in [lo, hi] (decimal, optional sign). */
static int opt_int(loader_t *l, yaml_node_t *map, const char *path, const char *key, long long lo,
                   long long hi, long long *dst)
{
    field_t f;
    field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL;
    if (!is_scalar(f.val) || is_null(f.val))
        return fail(l, f.line, "%s must be an integer", f.path);
    if (field_string(l, &f, &s) < 0) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    bool ok = *s && !isspace((unsigned char)*s) && !*end && errno == 0;
    free(s);
    if (!ok) return fail(l, f.line, "%s must be an integer", f.path);
    if (v < lo || v > hi)
        return fail(l, f.line, "%s must be between %lld and %lld", f.path, lo, hi);
    *dst = v;
    return 0;
}

static int opt_int_field(loader_t *l, yaml_node_t *map, const char *path, const char *key,
                         long long lo, long long hi, int *dst)
{
    long long v = *dst;
    if (opt_int(l, map, path, key, lo, hi, &v) < 0) return -1;
    *dst = (int)v;
    return 0;
}

/* Optional boolean: true/false (also YAML 1.1's yes/no/on/off), any case. */
static int opt_bool(loader_t *l, yaml_node_t *map, const char *path, const char *key, bool *dst)
{
    field_t f;
    field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    if (!is_scalar(f.val) || is_null(f.val))
        return fail(l, f.line, "%s must be true or false", f.path);
    char *s = NULL;
    if (field_string(l, &f, &s) < 0) return -1;
    static const char *const yes[] = {"true", "yes", "on", NULL};
    static const char *const no[] = {"false", "no", "off", NULL};
    int v = -1;
    for (int i = 0; yes[i]; i++) {
        if (!strcasecmp(s, yes[i])) v = 1;
        if (!strcasecmp(s, no[i])) v = 0;
    }
    free(s);
    if (v < 0) return fail(l, f.line, "%s must be true or false", f.path);
    *dst = v == 1;
    return 0;
}

/* Optional finite number > 0 and <= hi. */
/* A number in (0, hi], or [0, hi] with zero_ok. */
static int opt_number(loader_t *l, yaml_node_t *map, const char *path, const char *key,
                      bool zero_ok, double hi, double *dst)
{
    field_t f;
    field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    if (!is_scalar(f.val) || is_null(f.val)) return fail(l, f.line, "%s must be a number", f.path);
    char *s = NULL;
    if (field_string(l, &f, &s) < 0) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    bool ok = *s && !isspace((unsigned char)*s) && !*end && errno == 0 && isfinite(v);
    free(s);
    if (!ok) return fail(l, f.line, "%s must be a number", f.path);
    if (!(zero_ok ? v >= 0 : v > 0) || v > hi)
        return fail(l, f.line, "%s must be %s 0 and at most %g", f.path,
                    zero_ok ? "at least" : "greater than", hi);
    *dst = v;
    return 0;
}

static int opt_positive(loader_t *l, yaml_node_t *map, const char *path, const char *key, double hi,
                        double *dst)
{
    return opt_number(l, map, path, key, false, hi, dst);
}

static int opt_cost(loader_t *l, yaml_node_t *map, const char *path, double *dst)
{
    return opt_number(l, map, path, "cost_per_1k_tokens", true, 1e6, dst);
}

/* ------------------------------------------------------------------- value checks */

static bool all_chars(const char *s, const char *extra)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(extra, *s)) return false;
    return true;
}

/* "host:port" with port 0-65535; host a name/IPv4 address or a bracketed IPv6 address. */
static bool valid_listen(const char *s)
{
    const char *colon;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':' || !memchr(s, ':', (size_t)(close - s))) return false;
        for (const char *p = s + 1; p < close; p++)
            if (!isxdigit((unsigned char)*p) && *p != ':' && *p != '.') return false;
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon || colon == s) return false;
        for (const char *p = s; p < colon; p++)
            if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-') return false;
    }
    const char *port = colon + 1;
    if (!*port || strlen(port) > 5) return false;
    for (const char *p = port; *p; p++)
        if (!isdigit((unsigned char)*p)) return false;
    return atol(port) <= 65535;
}

/* Port of a valid listen address. */
static long listen_port(const char *s)
{
    return atol(strrchr(s, ':') + 1);
}

/* Logical and upstream model names: non-empty, printable, no whitespace. */
static bool valid_name(const char *s)
{
    if (!*s || strlen(s) > MAX_NAME_LEN) return false;
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f) return false;
    return true;
}

/* ------------------------------------------------------------------------ sections */

/* The client connection limits: read deadlines, write timeout, connection cap. */
static int load_server_conns(loader_t *l, yaml_node_t *v)
{
    mg_config_t *c = l->cfg;
    return opt_int_field(l, v, "server", "request_read_ms", 1, MAX_TIMEOUT_MS,
                         &c->request_read_ms) < 0 ||
                   opt_int_field(l, v, "server", "min_body_bytes_per_s", 0, 1 << 30,
                                 &c->min_body_bytes_per_s) < 0 ||
                   opt_int_field(l, v, "server", "write_timeout_ms", 0, MAX_TIMEOUT_MS,
                                 &c->write_timeout_ms) < 0 ||
                   opt_int_field(l, v, "server", "max_connections", 0, 10000000,
                                 &c->max_connections) < 0 ||
                   opt_int_field(l, v, "server", "reserved_connections", 0, 10000,
                                 &c->reserved_connections) < 0
               ? -1
               : 0;
}

/* An origin as browsers send it: scheme://host[:port], no path; or "*". */
static bool valid_origin(const char *s)
{
    if (!strcmp(s, "*")) return true;
    const char *h = !strncmp(s, "http://", 7) ? s + 7 : !strncmp(s, "https://", 8) ? s + 8 : NULL;
    return h && *h && all_chars(h, ".-:[]");
}

static int load_cors(loader_t *l, yaml_node_t *map)
{
    static const char *const keys[] = {"allowed_origins", "allow_credentials", "max_age_s", NULL};
    yaml_node_pair_t *cp = find_pair(l, map, "cors");
    if (!cp) return 0;
    yaml_node_t *v = node_at(l, cp->value);
    const char *path = "server.cors";
    if (want_map(l, v, line_of(v), path, keys) < 0) return -1;
    mg_cors_conf_t *c = &l->cfg->cors;
    if (opt_bool(l, v, path, "allow_credentials", &c->allow_credentials) < 0 ||
        opt_int_field(l, v, path, "max_age_s", 0, 86400, &c->max_age_s) < 0)
        return -1;
    yaml_node_pair_t *op = find_pair(l, v, "allowed_origins");
    if (!op) return 0;
    yaml_node_t *ov = node_at(l, op->value);
    if (ov->type != YAML_SEQUENCE_NODE)
        return fail(l, line_of(ov), "%s.allowed_origins must be a list of origins", path);
    size_t n = (size_t)(ov->data.sequence.items.top - ov->data.sequence.items.start);
    c->origins = calloc(n ? n : 1, sizeof(*c->origins));
    if (!c->origins) return fail(l, line_of(ov), "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *e = node_at(l, ov->data.sequence.items.start[i]);
        if (!is_scalar(e) || !valid_origin(scalar_text(e)))
            return fail(l, line_of(e),
                        "%s.allowed_origins[%zu] must be an origin "
                        "(scheme://host[:port]) or \"*\"",
                        path, i);
        if (!strcmp(scalar_text(e), "*") && c->allow_credentials)
            return fail(l, line_of(e), "%s: \"*\" cannot go with allow_credentials", path);
        if (!(c->origins[c->n_origins++] = dup_str(l, line_of(e), scalar_text(e)))) return -1;
    }
    return 0;
}

/* dashboard: in conf/dashboard.c */
static int load_dashboard(loader_t *l, yaml_node_t *v, int line)
{
    char msg[256];
    int at = mg_dashboard_conf_parse(l->doc, v, &l->cfg->dashboard, msg, sizeof msg);
    return at ? fail(l, at, "%s", msg) : 0;
}

static int load_server(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"listen",
                                       "metrics_listen",
                                       "max_body_bytes",
                                       "max_header_bytes",
                                       "request_read_ms",
                                       "min_body_bytes_per_s",
                                       "write_timeout_ms",
                                       "max_connections",
                                       "reserved_connections",
                                       "cors",
                                       NULL};
    int r = want_map(l, v, line, "server", keys);
    if (r <= 0) return r;
    mg_config_t *c = l->cfg;
    if (load_cors(l, v) < 0 || opt_string(l, v, "server", "listen", &c->listen) < 0) return -1;
    field_t f;
    field_get(l, v, "server", "listen", &f);
    char buf[72];
    if (!valid_listen(c->listen))
        return fail(l, f.line,
                    "server.listen: invalid address '%s' (expected host:port, port 0-65535, IPv6 "
                    "as [addr]:port)",
                    shown(c->listen, buf, sizeof buf));

    field_get(l, v, "server", "metrics_listen", &f);
    if (f.val && is_null(f.val)) {
        free(c->metrics_listen); /* explicit null: no metrics listener */
        c->metrics_listen = NULL;
    } else if (f.val) {
        char *s = NULL;
        if (field_string(l, &f, &s) < 0) return -1;
        free(c->metrics_listen);
        c->metrics_listen = *s ? s : NULL; /* "" also disables it */
        if (!*s) free(s);
        if (c->metrics_listen && !valid_listen(c->metrics_listen))
            return fail(l, f.line,
                        "server.metrics_listen: invalid address '%s' (expected host:port, port "
                        "0-65535, IPv6 as [addr]:port)",
                        shown(c->metrics_listen, buf, sizeof buf));
        if (c->metrics_listen && listen_port(c->metrics_listen) != 0 &&
            !strcmp(c->metrics_listen, c->listen))
            return fail(l, f.line, "server.metrics_listen must differ from server.listen");
    }

    long long n = (long long)c->max_body_bytes;
    if (opt_int(l, v, "server", "max_body_bytes", KIB, GIB, &n) < 0) return -1;
    c->max_body_bytes = (size_t)n;
    n = (long long)c->max_header_bytes;
    if (opt_int(l, v, "server", "max_header_bytes", KIB, MIB, &n) < 0) return -1;
    c->max_header_bytes = (size_t)n;
    return load_server_conns(l, v);
}

static int load_backup(loader_t *l, yaml_node_t *map)
{
    static const char *const keys[] = {"dir", "every_hours", "keep_days", NULL};
    yaml_node_pair_t *bp = find_pair(l, map, "backup");
    if (!bp) return 0;
    yaml_node_t *v = node_at(l, bp->value);
    const char *path = "storage.backup";
    mg_config_t *c = l->cfg;
    if (want_map(l, v, line_of(v), path, keys) < 0 ||
        req_string(l, v, path, "dir", &c->storage_backup_dir) < 0 ||
        opt_int_field(l, v, path, "every_hours", 1, 8760, &c->storage_backup_every_hours) < 0 ||
        opt_int_field(l, v, path, "keep_days", 1, 3650, &c->storage_backup_keep_days) < 0)
        return -1;
    return 0;
}

static int load_storage(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {
        "path",   "queue_max", "synchronous", "checkpoint_minutes", "integrity_check_hours",
        "backup", NULL};
    int r = want_map(l, v, line, "storage", keys);
    if (r <= 0) return r;
    char *sync = NULL;
    mg_config_t *c = l->cfg;
    if (opt_string(l, v, "storage", "path", &c->storage_path) < 0 ||
        opt_int_field(l, v, "storage", "queue_max", 1, 1000000, &c->storage_queue_max) < 0 ||
        opt_int_field(l, v, "storage", "checkpoint_minutes", 0, 10080,
                      &c->storage_checkpoint_minutes) < 0 ||
        opt_int_field(l, v, "storage", "integrity_check_hours", 0, 8760,
                      &c->storage_integrity_hours) < 0 ||
        load_backup(l, v) < 0 || opt_string(l, v, "storage", "synchronous", &sync) < 0)
        return -1;
    if (!sync) return 0;
    int full = !strcasecmp(sync, "full"), normal = !strcasecmp(sync, "normal");
    if (!full && !normal) {
        field_t f;
        char buf[72];
        field_get(l, v, "storage", "synchronous", &f);
        r = fail(l, f.line, "storage.synchronous must be normal or full (got '%s')",
                 shown(sync, buf, sizeof buf));
        free(sync);
        return r;
    }
    free(sync);
    l->cfg->storage_synchronous_full = full;
    return 0;
}

static int load_tokenizer(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"data_dir", NULL};
    int r = want_map(l, v, line, "tokenizer", keys);
    return r <= 0 ? r : opt_string(l, v, "tokenizer", "data_dir", &l->cfg->tokenizer_data_dir);
}

/* models.<name>.tokenizer: an encoding's name or "estimate"; absent, by the upstream family. */
static int load_model_tokenizer(loader_t *l, yaml_node_t *v, const char *path, mg_model_conf_t *m)
{
    char *name = NULL;
    if (opt_string(l, v, path, "tokenizer", &name) < 0) return -1;
    int id = name ? mg_encoding_lookup(name) : mg_encoding_for_model(m->routes[0].model);
    if (name && id < 0 && strcmp(name, "estimate") != 0) {
        char buf[72];
        fail(l, line_of(v), "%s.tokenizer: '%s' is none of o200k_base, cl100k_base, estimate", path,
             shown(name, buf, sizeof buf));
        free(name);
        return -1;
    }
    free(name);
    m->tokenizer = id + 1;
    return 0;
}

static int load_auth(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"enabled", "default_application", NULL};
    int r = want_map(l, v, line, "auth", keys);
    if (r <= 0) return r;
    return opt_bool(l, v, "auth", "enabled", &l->cfg->auth_enabled) < 0 ||
                   opt_string(l, v, "auth", "default_application", &l->cfg->default_application) < 0
               ? -1
               : 0;
}

static int load_lua(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"policies", "adapters", "lib", NULL};
    int r = want_map(l, v, line, "lua", keys);
    if (r <= 0) return r;
    mg_config_t *c = l->cfg;
    if (opt_string(l, v, "lua", "policies", &c->policies_dir) < 0 ||
        opt_string(l, v, "lua", "adapters", &c->adapters_dir) < 0)
        return -1;
    return opt_string(l, v, "lua", "lib", &c->lua_dir);
}

static int load_log(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"level", "task_events", "format", "file", NULL};
    int r = want_map(l, v, line, "log", keys);
    if (r <= 0) return r;
    char *format = NULL;
    if (opt_string(l, v, "log", "level", &l->cfg->log_level) < 0 ||
        opt_bool(l, v, "log", "task_events", &l->cfg->task_events) < 0 ||
        opt_string(l, v, "log", "file", &l->cfg->log_file) < 0 ||
        opt_string(l, v, "log", "format", &format) < 0)
        return -1;
    l->cfg->log_text = format && strcmp(format, "text") == 0;
    int format_ok = !format || l->cfg->log_text || strcmp(format, "json") == 0;
    free(format);
    if (!format_ok) return fail(l, line, "log.format must be json or text");
    const char *lv = l->cfg->log_level;
    if (strcmp(lv, "debug") && strcmp(lv, "info") && strcmp(lv, "warn") && strcmp(lv, "error")) {
        field_t f;
        char buf[72];
        field_get(l, v, "log", "level", &f);
        return fail(l, f.line, "log.level must be one of debug, info, warn, error (got '%s')",
                    shown(lv, buf, sizeof buf));
    }
    return 0;
}

static int load_upstream(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"max_retries", NULL};
    int r = want_map(l, v, line, "upstream", keys);
    if (r <= 0) return r;
    return opt_int_field(l, v, "upstream", "max_retries", 1, 10, &l->cfg->max_retries);
}

static int load_timeouts(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"connect_ms",        "first_byte_ms",  "idle_ms",
                                       "total_ms",          "header_read_ms", "keepalive_idle_ms",
                                       "drain_ms",          "queue_ms",       "max_queue_ms",
                                       "max_first_byte_ms", "max_total_ms",   NULL};
    int r = want_map(l, v, line, "timeouts", keys);
    if (r <= 0) return r;
    mg_timeouts_conf_t *t = &l->cfg->timeouts;
    int *dst[] = {&t->connect_ms,     &t->first_byte_ms,     &t->idle_ms,     &t->total_ms,
                  &t->header_read_ms, &t->keepalive_idle_ms, &t->drain_ms,    &t->queue_ms,
                  &t->max_queue_ms,   &t->max_first_byte_ms, &t->max_total_ms};
    for (size_t i = 0; keys[i]; i++) /* the max_* keys last: 0 means "the limit itself" */
        if (opt_int_field(l, v, "timeouts", keys[i], strncmp(keys[i], "max_", 4) == 0 ? 0 : 1,
                          MAX_TIMEOUT_MS, dst[i]) < 0)
            return -1;
    /* a maximum below its limit would shorten every request that asks for more */
    const struct {
        const char *key;
        int *max, base;
    } caps[] = {
        {"max_queue_ms", &t->max_queue_ms, t->queue_ms},
        {"max_first_byte_ms", &t->max_first_byte_ms, t->first_byte_ms},
        {"max_total_ms", &t->max_total_ms, t->total_ms},
    };
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        if (*caps[i].max == 0) continue;
        if (*caps[i].max < caps[i].base) {
            field_t f;
            field_get(l, v, "timeouts", caps[i].key, &f);
            return fail(l, f.line, "timeouts.%s must be at least the limit it raises (%d)",
                        caps[i].key, caps[i].base);
        }
    }
    return 0;
}

static int load_routing(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"local_first",         "queue_timeout_ms",
                                       "emergency_rpm_ratio", "allow_smaller_model",
                                       "panic_threshold",     NULL};
    int r = want_map(l, v, line, "routing", keys);
    if (r <= 0) return r;
    mg_routing_conf_t *rc = &l->cfg->routing;
    if (opt_bool(l, v, "routing", "local_first", &rc->local_first) < 0 ||
        opt_int_field(l, v, "routing", "queue_timeout_ms", 1, MAX_TIMEOUT_MS,
                      &rc->queue_timeout_ms) < 0 ||
        opt_positive(l, v, "routing", "emergency_rpm_ratio", 1.0, &rc->emergency_rpm_ratio) < 0 ||
        opt_bool(l, v, "routing", "allow_smaller_model", &rc->allow_smaller_model) < 0 ||
        opt_number(l, v, "routing", "panic_threshold", true, 1.0, &rc->panic_threshold) < 0)
        return -1;
    return 0;
}

static int load_scheduler(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"max_running_tasks",
                                       "max_queued_tasks",
                                       "priority_aging_seconds",
                                       "reserved_realtime_slots",
                                       "overflow_status",
                                       "backpressure",
                                       "vram_bytes",
                                       "safety_margin_ratio",
                                       "priority_weights",
                                       "min_output_tokens",
                                       NULL};
    const char *path = "scheduler";
    int r = want_map(l, v, line, path, keys);
    if (r <= 0) return r;
    mg_scheduler_conf_t *sc = &l->cfg->scheduler;
    if (opt_int_field(l, v, path, "max_running_tasks", 1, 1000000, &sc->max_running_tasks) < 0 ||
        opt_int_field(l, v, path, "max_queued_tasks", 0, 10000000, &sc->max_queued_tasks) < 0 ||
        opt_int_field(l, v, path, "priority_aging_seconds", 0, 86400, &sc->priority_aging_seconds) <
            0 ||
        opt_int_field(l, v, path, "reserved_realtime_slots", 0, 1000000,
                      &sc->reserved_realtime_slots) < 0 ||
        opt_int_field(l, v, path, "overflow_status", 429, 503, &sc->overflow_status) < 0 ||
        opt_int(l, v, path, "vram_bytes", 0, (long long)1 << 50, &sc->vram_bytes) < 0 ||
        opt_positive(l, v, path, "safety_margin_ratio", 0.99, &sc->safety_margin_ratio) < 0 ||
        opt_int_field(l, v, path, "min_output_tokens", 0, 1000000, &sc->min_output_tokens) < 0)
        return -1;
    if (sc->overflow_status != 429 && sc->overflow_status != 503) {
        field_t f;
        field_get(l, v, path, "overflow_status", &f);
        return fail(l, f.line, "scheduler.overflow_status must be 429 or 503");
    }
    yaml_node_pair_t *wp = find_pair(l, v, "priority_weights");
    if (wp) {
        yaml_node_t *wv = node_at(l, wp->value);
        int wl = line_of(wv);
        if (wv->type != YAML_SEQUENCE_NODE ||
            wv->data.sequence.items.top - wv->data.sequence.items.start != 5)
            return fail(l, wl, "scheduler.priority_weights must be a list of 5 integers (P0..P4)");
        for (int i = 0; i < 5; i++) {
            yaml_node_t *e = node_at(l, wv->data.sequence.items.start[i]);
            const char *t = is_scalar(e) ? scalar_text(e) : "";
            char *end;
            long w = strtol(t, &end, 10);
            if (!*t || *end || w < 1 || w > 1000000)
                return fail(l, line_of(e), "scheduler.priority_weights[%d] must be 1 .. 1000000",
                            i);
            sc->weights[i] = (int)w;
        }
    }
    if (sc->reserved_realtime_slots >= sc->max_running_tasks)
        return fail(l, line, "scheduler.reserved_realtime_slots must be below max_running_tasks");
    yaml_node_pair_t *bp = find_pair(l, v, "backpressure");
    if (bp) {
        static const char *const bkeys[] = {"level1_threshold", "level2_threshold",
                                            "level3_threshold", NULL};
        yaml_node_t *bv = node_at(l, bp->value);
        const char *bpath = "scheduler.backpressure";
        int br = want_map(l, bv, line_of(node_at(l, bp->key)), bpath, bkeys);
        if (br < 0) return -1;
        for (int i = 0; br > 0 && i < 3; i++)
            if (opt_positive(l, bv, bpath, bkeys[i], 1.0, &sc->level_threshold[i]) < 0) return -1;
    }
    return 0;
}

static int load_tasks(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"retention_seconds", NULL};
    int r = want_map(l, v, line, "tasks", keys);
    if (r <= 0) return r;
    return opt_int_field(l, v, "tasks", "retention_seconds", 60, 365 * 86400,
                         &l->cfg->tasks_retention_seconds);
}

static int load_idempotency(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"ttl_seconds", "max_entries", NULL};
    int r = want_map(l, v, line, "idempotency", keys);
    if (r <= 0) return r;
    return opt_int_field(l, v, "idempotency", "ttl_seconds", 1, 30 * 86400,
                         &l->cfg->idempotency_ttl_seconds) < 0 ||
                   opt_int_field(l, v, "idempotency", "max_entries", 1, 10000000,
                                 &l->cfg->idempotency_max_entries) < 0
               ? -1
               : 0;
}

static int load_breaker(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"consecutive_failures",
                                       "error_rate_threshold",
                                       "min_requests",
                                       "window_seconds",
                                       "open_duration_seconds",
                                       "half_open_max_requests",
                                       NULL};
    const char *path = "circuit_breaker";
    int r = want_map(l, v, line, path, keys);
    if (r <= 0) return r;
    mg_breaker_conf_t *b = &l->cfg->breaker;
    if (opt_int_field(l, v, path, "consecutive_failures", 1, 1000, &b->consecutive_failures) < 0 ||
        opt_positive(l, v, path, "error_rate_threshold", 1.0, &b->error_rate_threshold) < 0 ||
        opt_int_field(l, v, path, "min_requests", 1, 1000000, &b->min_requests) < 0 ||
        opt_int_field(l, v, path, "window_seconds", 1, 86400, &b->window_seconds) < 0 ||
        opt_int_field(l, v, path, "open_duration_seconds", 1, 86400, &b->open_duration_seconds) <
            0 ||
        opt_int_field(l, v, path, "half_open_max_requests", 1, 1000, &b->half_open_max_requests) <
            0)
        return -1;
    return 0;
}

static int load_health(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"probes",           "probe_interval_ms", "probe_timeout_ms",
                                       "load_interval_ms", "retry_down_ms",     NULL};
    int r = want_map(l, v, line, "health", keys);
    if (r <= 0) return r;
    mg_health_conf_t *h = &l->cfg->health;
    if (opt_bool(l, v, "health", "probes", &h->probes) < 0 ||
        opt_int_field(l, v, "health", "probe_interval_ms", 100, MAX_TIMEOUT_MS,
                      &h->probe_interval_ms) < 0 ||
        opt_int_field(l, v, "health", "probe_timeout_ms", 1, MAX_TIMEOUT_MS, &h->probe_timeout_ms) <
            0 ||
        opt_int_field(l, v, "health", "load_interval_ms", 100, MAX_TIMEOUT_MS,
                      &h->load_interval_ms) < 0 ||
        opt_int_field(l, v, "health", "retry_down_ms", 0, MAX_TIMEOUT_MS, &h->retry_down_ms) < 0)
        return -1;
    return 0;
}

/* The api_key: optional; an undefined or empty ${VAR} in it, or an empty value, means
 * "no key". No message here ever shows the value. */
static int load_api_key(loader_t *l, yaml_node_t *map, const char *path, char **dst)
{
    field_t f;
    field_get(l, map, path, "api_key", &f);
    if (!f.val || is_null(f.val)) return 0;
    if (!is_scalar(f.val)) return fail(l, f.line, "%s must be a string", f.path);
    bool missing = false;
    char *s = expand(l, f.val, f.line, f.path, &missing);
    if (!s) return -1;
    if (missing || !*s) {
        free(s);
        return 0;
    }
    *dst = s;
    return 0;
}

unsigned mg_provider_forward_default(const char *base_url)
{
    static const char openai[] = "https://api.openai.com";
    size_t n = sizeof(openai) - 1;
    return base_url && strncmp(base_url, openai, n) == 0 && (base_url[n] == '/' || !base_url[n])
               ? MG_FORWARD_METADATA
               : 0;
}

/* forward: [metadata]: the gateway's extensions this upstream gets too (it reads them as
 * its own parameters); without the key, mg_provider_forward_default. */
static int load_forward(loader_t *l, yaml_node_t *map, const char *path, mg_provider_conf_t *p)
{
    p->forward = mg_provider_forward_default(p->base_url);
    yaml_node_pair_t *fp = find_pair(l, map, "forward");
    if (!fp) return 0;
    yaml_node_t *fv = node_at(l, fp->value);
    if (fv->type != YAML_SEQUENCE_NODE)
        return fail(l, line_of(fv), "%s.forward must be a list (of: metadata)", path);
    p->forward = 0;
    for (yaml_node_item_t *it = fv->data.sequence.items.start; it < fv->data.sequence.items.top;
         it++) {
        yaml_node_t *e = node_at(l, *it);
        if (!is_scalar(e) || strcmp(scalar_text(e), "metadata") != 0)
            return fail(l, line_of(e), "%s.forward: only metadata can be forwarded", path);
        p->forward |= MG_FORWARD_METADATA;
    }
    return 0;
}

static int load_provider(loader_t *l, yaml_node_t *v, size_t i, mg_provider_conf_t *p)
{
    static const char *const keys[] = {
        "id",           "adapter", "base_url", "api_key", "pool",         "rpm_limit",
        "tpm_limit",    "weight",  "local",    "engine",  "model_prefix", "cost_per_1k_tokens",
        "stream_usage", "forward", NULL};
    char path[32], buf[72];
    snprintf(path, sizeof path, "providers[%zu]", i);
    p->line = line_of(v);
    p->weight = 1.0;
    if (v->type != YAML_MAPPING_NODE) return fail(l, p->line, "%s must be a mapping", path);
    if (want_map(l, v, p->line, path, keys) < 0) return -1;
    field_t f;

    if (req_string(l, v, path, "id", &p->id) < 0) return -1;
    field_get(l, v, path, "id", &f);
    if (strlen(p->id) > MAX_ID_LEN || !all_chars(p->id, "._-"))
        return fail(l, f.line, "%s.id '%s' is invalid (letters, digits, '.', '_', '-'; at most %d)",
                    path, shown(p->id, buf, sizeof buf), MAX_ID_LEN);

    if (req_string(l, v, path, "adapter", &p->adapter) < 0) return -1;
    field_get(l, v, path, "adapter", &f);
    if (strlen(p->adapter) > MAX_ID_LEN || !all_chars(p->adapter, "_-"))
        return fail(l, f.line, "%s.adapter '%s' is invalid (letters, digits, '_', '-')", path,
                    shown(p->adapter, buf, sizeof buf));

    if (req_string(l, v, path, "base_url", &p->base_url) < 0) return -1;
    field_get(l, v, path, "base_url", &f);
    char *u = p->base_url;
    const char *host = !strncmp(u, "http://", 7)    ? u + 7
                       : !strncmp(u, "https://", 8) ? u + 8
                                                    : NULL;
    if (!host) return fail(l, f.line, "%s.base_url must start with http:// or https://", path);
    for (const char *c = u; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f || *c == '?' || *c == '#')
            return fail(l, f.line,
                        "%s.base_url must not contain spaces, control characters, '?' or '#'",
                        path);
    size_t n = strlen(u);
    while (n > (size_t)(host - u) && u[n - 1] == '/') u[--n] = '\0';
    if (!*host || *host == '/') return fail(l, f.line, "%s.base_url has no host", path);

    if (load_api_key(l, v, path, &p->api_key) < 0) return -1;

    p->pool = dup_str(l, p->line, "main");
    if (!p->pool || opt_string(l, v, path, "pool", &p->pool) < 0) return -1;
    if (strcmp(p->pool, "main") && strcmp(p->pool, "fallback")) {
        field_get(l, v, path, "pool", &f);
        return fail(l, f.line, "%s.pool must be main or fallback (got '%s')", path,
                    shown(p->pool, buf, sizeof buf));
    }
    if (opt_int_field(l, v, path, "rpm_limit", 0, INT_MAX, &p->rpm_limit) < 0 ||
        opt_int_field(l, v, path, "tpm_limit", 0, INT_MAX, &p->tpm_limit) < 0 ||
        opt_positive(l, v, path, "weight", 1e6, &p->weight) < 0 ||
        opt_string(l, v, path, "engine", &p->engine) < 0 ||
        opt_string(l, v, path, "model_prefix", &p->model_prefix) < 0 ||
        opt_cost(l, v, path, &p->cost_per_1k_tokens) < 0)
        return -1;
    p->source = dup_str(l, p->line, "file");
    if (!p->source) return -1;
    if (p->engine && strcmp(p->engine, "vllm") && strcmp(p->engine, "llamacpp") &&
        strcmp(p->engine, "ollama") && strcmp(p->engine, "none")) {
        field_get(l, v, path, "engine", &f);
        return fail(l, f.line, "%s.engine must be vllm, llamacpp, ollama or none (got '%s')", path,
                    shown(p->engine, buf, sizeof buf));
    }
    bool stream_usage = true;
    if (opt_bool(l, v, path, "stream_usage", &stream_usage) < 0 || load_forward(l, v, path, p) < 0)
        return -1;
    p->no_stream_usage = !stream_usage;
    return opt_bool(l, v, path, "local", &p->local);
}

/* Rejects a repeated provider id, naming the line of the first definition. */
static int check_provider_ids(loader_t *l)
{
    mg_config_t *c = l->cfg;
    if (c->n_providers < 2) return 0;
    keyref_t *refs = malloc(c->n_providers * sizeof *refs);
    if (!refs) return fail(l, 0, "out of memory");
    for (size_t i = 0; i < c->n_providers; i++) refs[i] = (keyref_t){c->providers[i].id, i};
    long dup = first_duplicate(refs, c->n_providers);
    free(refs);
    if (dup < 0) return 0;
    const mg_provider_conf_t *d = &c->providers[dup], *first = NULL;
    for (size_t i = 0; !first; i++)
        if (!strcmp(c->providers[i].id, d->id)) first = &c->providers[i];
    return fail(l, d->line, "duplicate provider id '%s' (first defined at line %d)", d->id,
                first->line);
}

static int load_providers(loader_t *l, yaml_node_t *v, int line)
{
    if (is_null(v)) return 0;
    if (v->type != YAML_SEQUENCE_NODE) return fail(l, line, "providers must be a list");
    yaml_node_item_t *items = v->data.sequence.items.start;
    size_t n = (size_t)(v->data.sequence.items.top - items);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    if (charge(l, line, n * sizeof *c->providers) < 0) return -1;
    c->providers = calloc(n, sizeof *c->providers);
    if (!c->providers) return fail(l, line, "out of memory");
    for (size_t i = 0; i < n; i++) {
        c->n_providers = i + 1; /* so mg_config_free sees a partly filled entry */
        if (load_provider(l, node_at(l, items[i]), i, &c->providers[i]) < 0) return -1;
    }
    return check_provider_ids(l);
}

static int cmp_provider_id(const void *key, const void *elem)
{
    const mg_provider_conf_t *const *p = elem;
    return strcmp(key, (*p)->id);
}

static int cmp_provider_ptr(const void *a, const void *b)
{
    const mg_provider_conf_t *const *x = a, *const *y = b;
    return strcmp((*x)->id, (*y)->id);
}

static int load_route(loader_t *l, yaml_node_t *v, const char *path, mg_route_conf_t *r,
                      const mg_provider_conf_t **by_id, size_t n_providers)
{
    static const char *const keys[] = {"provider",       "model",
                                       "smaller",        "priority",
                                       "weight_bytes",   "kv_cache_per_token_bytes",
                                       "context_window", NULL};
    char buf[72];
    r->line = line_of(v);
    if (v->type != YAML_MAPPING_NODE)
        return fail(l, r->line, "%s must be a mapping with provider and model", path);
    if (want_map(l, v, r->line, path, keys) < 0 ||
        req_string(l, v, path, "provider", &r->provider) < 0 ||
        req_string(l, v, path, "model", &r->model) < 0 ||
        opt_bool(l, v, path, "smaller", &r->smaller) < 0 ||
        opt_int_field(l, v, path, "priority", 0, 1000, &r->priority) < 0 ||
        opt_int(l, v, path, "weight_bytes", 0, (long long)1 << 50, &r->weight_bytes) < 0 ||
        opt_int(l, v, path, "kv_cache_per_token_bytes", 0, (long long)1 << 32,
                &r->kv_cache_per_token_bytes) < 0 ||
        opt_int_field(l, v, path, "context_window", 0, 100000000, &r->context_window) < 0)
        return -1;
    /* a full-size route runs the model itself: the model's figures are its figures */
    if (!r->smaller && (r->weight_bytes || r->kv_cache_per_token_bytes))
        return fail(l, r->line,
                    "%s: weight_bytes and kv_cache_per_token_bytes belong on the model, or on "
                    "a route with smaller: true",
                    path);
    if (!valid_name(r->model))
        return fail(l, r->line,
                    "%s.model '%s' is invalid (no spaces or control characters, at most %d)", path,
                    shown(r->model, buf, sizeof buf), MAX_NAME_LEN);
    if (!by_id || !bsearch(r->provider, by_id, n_providers, sizeof *by_id, cmp_provider_id))
        return fail(l, r->line, "%s: unknown provider '%s'", path,
                    shown(r->provider, buf, sizeof buf));
    return 0;
}

static int load_model(loader_t *l, yaml_node_t *key, yaml_node_t *v, mg_model_conf_t *m,
                      const mg_provider_conf_t **by_id, size_t n_providers)
{
    static const char *const keys[] = {
        "routes",    "max_concurrency", "weight_bytes",      "kv_cache_per_token_bytes",
        "tokenizer", "context_window",  "max_output_tokens", NULL};
    char buf[72], path[300];
    m->line = line_of(key);
    const char *name = scalar_text(key);
    if (!valid_name(name))
        return fail(l, m->line,
                    "model name '%s' is invalid (no spaces or control characters, at most %d)",
                    shown(name, buf, sizeof buf), MAX_NAME_LEN);
    m->name = dup_str(l, m->line, name);
    if (!m->name) return -1;
    snprintf(path, sizeof path, "models.%s", name);
    if (is_null(v) || v->type != YAML_MAPPING_NODE)
        return fail(l, m->line, "%s must be a mapping with routes", path);
    if (want_map(l, v, m->line, path, keys) < 0 ||
        opt_int_field(l, v, path, "max_concurrency", 0, 1000000, &m->max_concurrency) < 0 ||
        opt_int(l, v, path, "weight_bytes", 0, (long long)1 << 50, &m->weight_bytes) < 0 ||
        opt_int(l, v, path, "kv_cache_per_token_bytes", 0, (long long)1 << 32,
                &m->kv_cache_per_token_bytes) < 0 ||
        opt_int_field(l, v, path, "context_window", 0, 100000000, &m->context_window) < 0 ||
        opt_int_field(l, v, path, "max_output_tokens", 0, 100000000, &m->max_output_tokens) < 0)
        return -1;
    yaml_node_pair_t *rp = find_pair(l, v, "routes");
    if (!rp) return fail(l, m->line, "%s is missing required key 'routes'", path);
    yaml_node_t *routes = node_at(l, rp->value);
    int rline = line_of(node_at(l, rp->key));
    if (routes->type != YAML_SEQUENCE_NODE) return fail(l, rline, "%s.routes must be a list", path);
    yaml_node_item_t *items = routes->data.sequence.items.start;
    size_t n = (size_t)(routes->data.sequence.items.top - items);
    if (n == 0) return fail(l, rline, "%s.routes must have at least one route", path);
    if (charge(l, rline, n * sizeof *m->routes) < 0) return -1;
    m->routes = calloc(n, sizeof *m->routes);
    if (!m->routes) return fail(l, rline, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char rpath[330];
        snprintf(rpath, sizeof rpath, "%s.routes[%zu]", path, i);
        m->n_routes = i + 1;
        if (load_route(l, node_at(l, items[i]), rpath, &m->routes[i], by_id, n_providers) < 0)
            return -1;
    }
    return load_model_tokenizer(l, v, path, m);
}

static int load_models(loader_t *l, yaml_node_t *v, int line)
{
    if (is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE)
        return fail(l, line, "models must be a mapping of model names to {routes: [...]}");
    if (check_keys(l, v, "in models", NULL) < 0) return -1;
    yaml_node_pair_t *pairs = v->data.mapping.pairs.start;
    size_t n = (size_t)(v->data.mapping.pairs.top - pairs);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    /* Providers sorted by id, so each route's provider is found by binary search. */
    const mg_provider_conf_t **by_id = NULL;
    if (c->n_providers) {
        by_id = malloc(c->n_providers * sizeof *by_id);
        if (!by_id) return fail(l, line, "out of memory");
        for (size_t i = 0; i < c->n_providers; i++) by_id[i] = &c->providers[i];
        qsort(by_id, c->n_providers, sizeof *by_id, cmp_provider_ptr);
    }
    int rc = charge(l, line, n * sizeof *c->models);
    if (rc == 0 && !(c->models = calloc(n, sizeof *c->models))) rc = fail(l, line, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        c->n_models = i + 1;
        rc = load_model(l, node_at(l, pairs[i].key), node_at(l, pairs[i].value), &c->models[i],
                        by_id, c->n_providers);
    }
    free(by_id);
    return rc;
}

/* allowed_priorities: [P0, P1, ...] into a bit set. */
static int load_priorities(loader_t *l, yaml_node_t *map, const char *path, unsigned *out)
{
    yaml_node_pair_t *pp = find_pair(l, map, "allowed_priorities");
    if (!pp) return 0;
    yaml_node_t *v = node_at(l, pp->value);
    int line = line_of(v);
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(l, line, "%s.allowed_priorities must be a list like [P0, P1]", path);
    *out = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = node_at(l, *it);
        const char *t = is_scalar(e) ? scalar_text(e) : "";
        if (strlen(t) != 2 || t[0] != 'P' || t[1] < '0' || t[1] > '4')
            return fail(l, line_of(e), "%s.allowed_priorities: '%s' is not one of P0..P4", path, t);
        *out |= 1u << (t[1] - '0');
    }
    return 0;
}

/* allowed_models: [name, ...] — logical model names (checked against the models when a
 * request arrives: models may also come from the store). */
static int load_allowed_models(loader_t *l, yaml_node_t *map, const char *path, mg_app_conf_t *a)
{
    yaml_node_pair_t *pp = find_pair(l, map, "allowed_models");
    if (!pp) return 0;
    yaml_node_t *v = node_at(l, pp->value);
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(l, line_of(v), "%s.allowed_models must be a list of model names", path);
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    a->allowed_models = calloc(n ? n : 1, sizeof(*a->allowed_models));
    if (!a->allowed_models) return fail(l, line_of(v), "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *e = node_at(l, v->data.sequence.items.start[i]);
        const char *t = is_scalar(e) ? scalar_text(e) : "";
        if (!valid_name(t))
            return fail(l, line_of(e), "%s.allowed_models[%zu] is not a model name", path, i);
        if (!(a->allowed_models[i] = dup_str(l, line_of(e), t))) return -1;
        a->n_allowed_models = i + 1;
    }
    return 0;
}

static int load_app(loader_t *l, yaml_node_t *key, yaml_node_t *v, mg_app_conf_t *a)
{
    static const char *const keys[] = {"max_running_tasks",  "max_queued_tasks",
                                       "allowed_priorities", "allowed_models",
                                       "data_policy",        NULL};
    char path[300];
    a->line = line_of(key);
    a->name = dup_str(l, a->line, scalar_text(key));
    if (!a->name) return -1;
    snprintf(path, sizeof path, "applications.%s", a->name);
    a->allowed_priorities = 0x1f;
    if (is_null(v)) return 0;
    if (want_map(l, v, a->line, path, keys) < 0 ||
        opt_int_field(l, v, path, "max_running_tasks", 0, 1000000, &a->max_running_tasks) < 0 ||
        opt_int_field(l, v, path, "max_queued_tasks", 0, 1000000, &a->max_queued_tasks) < 0 ||
        load_priorities(l, v, path, &a->allowed_priorities) < 0 ||
        load_allowed_models(l, v, path, a) < 0)
        return -1;
    yaml_node_pair_t *dp = find_pair(l, v, "data_policy");
    if (dp) {
        static const char *const dkeys[] = {"allow_cloud", "sensitive_level", NULL};
        char dpath[320];
        snprintf(dpath, sizeof dpath, "%s.data_policy", path);
        yaml_node_t *dv = node_at(l, dp->value);
        if (want_map(l, dv, line_of(node_at(l, dp->key)), dpath, dkeys) < 0 ||
            opt_bool(l, dv, dpath, "allow_cloud", &a->allow_cloud) < 0)
            return -1;
        a->has_data_policy = true;
    }
    return 0;
}

static int load_applications(loader_t *l, yaml_node_t *v, int line)
{
    if (is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE)
        return fail(l, line, "applications must be a mapping of application names to settings");
    if (check_keys(l, v, "in applications", NULL) < 0) return -1;
    yaml_node_pair_t *pairs = v->data.mapping.pairs.start;
    size_t n = (size_t)(v->data.mapping.pairs.top - pairs);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    if (charge(l, line, n * sizeof *c->apps) < 0) return -1;
    c->apps = calloc(n, sizeof *c->apps);
    if (!c->apps) return fail(l, line, "out of memory");
    for (size_t i = 0; i < n; i++) {
        c->n_apps = i + 1;
        if (load_app(l, node_at(l, pairs[i].key), node_at(l, pairs[i].value), &c->apps[i]) < 0)
            return -1;
    }
    return 0;
}

static int load_users(loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"default_max_running_tasks", "default_max_queued_tasks",
                                       "default_requests_per_minute", NULL};
    int r = want_map(l, v, line, "users", keys);
    if (r <= 0) return r;
    if (opt_int_field(l, v, "users", "default_max_running_tasks", 0, 1000000,
                      &l->cfg->user_max_running_tasks) < 0 ||
        opt_int_field(l, v, "users", "default_max_queued_tasks", 0, 1000000,
                      &l->cfg->user_max_queued_tasks) < 0 ||
        opt_int_field(l, v, "users", "default_requests_per_minute", 0, 60000,
                      &l->cfg->user_rpm_limit) < 0)
        return -1;
    return 0;
}

/* usage: and prices: (conf/usage.c) */
static int load_usage_or_prices(loader_t *l, yaml_node_t *v, int line, int prices)
{
    char why[320];
    return mg_conf_usage_section(l->doc, v, prices, l->cfg, &line, why, sizeof why)
               ? fail(l, line, "%s", why)
               : 0;
}
static int load_usage(loader_t *l, yaml_node_t *v, int line)
{
    return load_usage_or_prices(l, v, line, 0);
}
static int load_prices(loader_t *l, yaml_node_t *v, int line)
{
    return load_usage_or_prices(l, v, line, 1);
}
static int load_billing(loader_t *l, yaml_node_t *v, int line)
{
    (void)line;
    return mg_conf_billing_section(l->doc, v, l->name, &l->cfg->billing, l->err, l->err_len);
}

typedef int (*section_fn)(loader_t *l, yaml_node_t *v, int line);

/* Sections in load order: providers before models, whatever the file's order, because
 * routes refer to providers. */
static int load_context(loader_t *l, yaml_node_t *v, int line)
{
    (void)line;
    return mg_context_conf_load(l->doc, v, l->name, &l->cfg->context, l->err, l->err_len);
}

static int load_protocols(loader_t *l, yaml_node_t *v, int line)
{
    (void)line;
    return mg_protocols_conf_load(l->doc, v, l->name, &l->cfg->protocols, l->err, l->err_len);
}

static const struct {
    const char *key;
    section_fn load;
} sections[] = {
    {"server", load_server},
    {"storage", load_storage},
    {"tokenizer", load_tokenizer},
    {"auth", load_auth},
    {"lua", load_lua},
    {"log", load_log},
    {"upstream", load_upstream},
    {"timeouts", load_timeouts},
    {"routing", load_routing},
    {"scheduler", load_scheduler},
    {"tasks", load_tasks},
    {"idempotency", load_idempotency},
    {"circuit_breaker", load_breaker},
    {"health", load_health},
    {"providers", load_providers},
    {"models", load_models},
    {"applications", load_applications},
    {"users", load_users},
    {"dashboard", load_dashboard},
    {"usage", load_usage},
    {"prices", load_prices},
    {"billing", load_billing},
    {"context", load_context},
    {"protocols", load_protocols},
};

#define N_SECTIONS (sizeof sections / sizeof sections[0])

static int load_root(loader_t *l, yaml_node_t *root)
{
    if (is_null(root)) return 0;
    if (root->type != YAML_MAPPING_NODE)
        return fail(l, line_of(root), "the top level must be a mapping of sections");
    const char *keys[N_SECTIONS + 1];
    for (size_t i = 0; i < N_SECTIONS; i++) keys[i] = sections[i].key;
    keys[N_SECTIONS] = NULL;
    if (check_keys(l, root, "at top level", keys) < 0) return -1;
    for (size_t i = 0; i < N_SECTIONS; i++) {
        yaml_node_pair_t *p = find_pair(l, root, sections[i].key);
        if (p && sections[i].load(l, node_at(l, p->value), line_of(node_at(l, p->key))) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ lifecycle */

static int sidecar_v1_provider(loader_t *l);

static int set_defaults(loader_t *l, const char *name)
{
    mg_config_t *c = l->cfg;
    c->max_body_bytes = MG_DEFAULT_MAX_BODY_BYTES;
    c->max_header_bytes = DEFAULT_MAX_HEADER_BYTES;
    mg_usage_conf_defaults(&c->usage);
    c->request_read_ms = 60000;
    c->min_body_bytes_per_s = 1024;
    c->write_timeout_ms = 30000;
    c->max_connections = 0; /* as many as RLIMIT_NOFILE allows (server.c) */
    c->reserved_connections = 16;
    c->cors.max_age_s = 600;
    mg_dashboard_conf_defaults(&c->dashboard);
    c->auth_enabled = false;
    c->max_retries = 3;
    c->timeouts = (mg_timeouts_conf_t){
        .connect_ms = 5000,
        .first_byte_ms = 60000,
        .idle_ms = 30000,
        .total_ms = 600000,
        .header_read_ms = 10000,
        .keepalive_idle_ms = 75000,
        .drain_ms = 30000,
        .queue_ms = 30000,
    };
    c->scheduler = (mg_scheduler_conf_t){
        .max_running_tasks = 256,
        .max_queued_tasks = 500,
        .priority_aging_seconds = 30,
        .reserved_realtime_slots = 2,
        .overflow_status = 429,
        .level_threshold = {0.70, 0.85, 0.95},
        .safety_margin_ratio = 0.08,
        .weights = {100, 50, 25, 10, 1},
        .min_output_tokens = 256,
    };
    /* Sidecar V1 compatibility: SIDECAR_QUEUE_MAX sets the default queue size */
    const char *qm = getenv("SIDECAR_QUEUE_MAX");
    if (qm && atoi(qm) > 0 && atoi(qm) <= 1000000) c->scheduler.max_queued_tasks = atoi(qm);
    c->task_events = true;
    c->tasks_retention_seconds = 86400;
    mg_context_conf_defaults(&c->context);
    (void)mg_protocols_conf_defaults(&c->protocols); /* out of memory: no allowlist */
    c->idempotency_ttl_seconds = 600;
    c->idempotency_max_entries = 10000;
    c->storage_queue_max = MG_STORE_QUEUE_MAX_DEFAULT;
    c->storage_checkpoint_minutes = 60; /* the ADR: hourly wal_checkpoint(TRUNCATE) */
    c->storage_integrity_hours = 24;
    c->storage_backup_every_hours = 24;
    c->storage_backup_keep_days = 7;
    c->routing = (mg_routing_conf_t){
        .local_first = true,
        .queue_timeout_ms = 30000,
        .emergency_rpm_ratio = 0.1,
        .panic_threshold = 0.5,
    };
    /* Sidecar V1 compatibility: SIDECAR_QUEUE_TIMEOUT (seconds) sets the default */
    const char *qt = getenv("SIDECAR_QUEUE_TIMEOUT");
    if (qt && atoi(qt) > 0 && atoi(qt) < 86400) c->routing.queue_timeout_ms = atoi(qt) * 1000;
    c->breaker = (mg_breaker_conf_t){
        .consecutive_failures = 3,
        .error_rate_threshold = 0.1,
        .min_requests = 10,
        .window_seconds = 60,
        .open_duration_seconds = 30,
        .half_open_max_requests = 1,
    };
    c->health = (mg_health_conf_t){
        .probes = true,
        .probe_interval_ms = 60000,
        .probe_timeout_ms = 10000,
        .load_interval_ms = 5000,
        .retry_down_ms = 30000,
    };
    c->path = strdup(name);
    c->listen = strdup(MG_DEFAULT_LISTEN);
    c->metrics_listen = strdup(MG_DEFAULT_METRICS_LISTEN);
    c->storage_path = strdup(DEFAULT_STORAGE_PATH);
    c->policies_dir = strdup("policies");
    c->adapters_dir = strdup("adapters");
    c->lua_dir = strdup("lua");
    c->log_level = strdup("info");
    if (!c->path || !c->listen || !c->metrics_listen || !c->storage_path || !c->policies_dir ||
        !c->adapters_dir || !c->lua_dir || !c->log_level)
        return fail(l, 0, "out of memory");
    return 0;
}

/* Turns a libyaml failure into "NAME:LINE: YAML syntax error: ...". */
static int yaml_fail(loader_t *l, const yaml_parser_t *p)
{
    if (p->error == YAML_MEMORY_ERROR) return fail(l, 0, "out of memory");
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad encoding, control characters) carry a byte offset only. */
        int line = 1;
        for (size_t i = 0; i < p->problem_offset && i < l->input_len; i++)
            line += l->input[i] == '\n';
        return fail(l, line, "YAML error: %s", p->problem ? p->problem : "unreadable input");
    }
    int line = (int)p->problem_mark.line + 1;
    if (p->context)
        return fail(l, line, "YAML syntax error: %s (%s at line %d)",
                    p->problem ? p->problem : "invalid YAML", p->context,
                    (int)p->context_mark.line + 1);
    return fail(l, line, "YAML syntax error: %s", p->problem ? p->problem : "invalid YAML");
}

int mg_config_parse(const char *name, const char *yaml, size_t len, mg_config_t **out, char *err,
                    size_t err_len)
{
    loader_t l = {.name = name ? name : "(config)",
                  .input = yaml,
                  .input_len = len,
                  .err = err,
                  .err_len = err_len,
                  .budget = 8 * len + 64 * 1024};
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    l.cfg = calloc(1, sizeof *l.cfg);
    if (!l.cfg) return fail(&l, 0, "out of memory");
    if (set_defaults(&l, l.name) < 0) {
        mg_config_free(l.cfg);
        return -1;
    }

    yaml_parser_t parser;
    yaml_document_t doc, extra;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) {
        mg_config_free(l.cfg);
        return fail(&l, 0, "out of memory");
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        yaml_fail(&l, &parser);
        goto out_parser;
    }
    if (!yaml_parser_load(&parser, &extra)) {
        yaml_fail(&l, &parser);
        goto out_doc;
    }
    yaml_node_t *second = yaml_document_get_root_node(&extra);
    if (second) fail(&l, line_of(second), "only one YAML document is allowed");
    yaml_document_delete(&extra);
    if (second) goto out_doc;

    l.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    rc = root ? load_root(&l, root) : 0;
    if (rc == 0) rc = sidecar_v1_provider(&l);
out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&parser);
    if (rc < 0) {
        mg_config_free(l.cfg);
        return -1;
    }
    *out = l.cfg;
    return 0;
}

/* Sidecar V1 compatibility (ADR 12): with no providers configured, SIDECAR_API_KEY /
 * SIDECAR_UPSTREAM create one provider (source=env) that serves every model name;
 * SIDECAR_RATE_RPM is its rate limit, SIDECAR_HOST / SIDECAR_PORT the listen address. */
static int sidecar_v1_provider(loader_t *l)
{
    mg_config_t *c = l->cfg;
    const char *key = getenv("SIDECAR_API_KEY");
    const char *upstream = getenv("SIDECAR_UPSTREAM");
    if (c->n_providers > 0 || ((!key || !*key) && (!upstream || !*upstream))) return 0;
    const char *host = getenv("SIDECAR_HOST"), *port = getenv("SIDECAR_PORT");
    if ((host && *host) || (port && *port)) {
        char listen[300];
        snprintf(listen, sizeof(listen), "%s:%s", host && *host ? host : "127.0.0.1",
                 port && *port ? port : "9190");
        if (!valid_listen(listen))
            return fail(l, 0, "SIDECAR_HOST/SIDECAR_PORT give an invalid address");
        free(c->listen);
        c->listen = dup_str(l, 0, listen);
        if (!c->listen) return -1;
    }
    c->providers = calloc(1, sizeof(*c->providers));
    if (!c->providers) return fail(l, 0, "out of memory");
    c->n_providers = 1;
    mg_provider_conf_t *p = &c->providers[0];
    const char *url = upstream && *upstream ? upstream : "https://integrate.api.nvidia.com/v1";
    p->id = dup_str(l, 0, "env");
    p->adapter = dup_str(l, 0, "openai");
    p->base_url = dup_str(l, 0, url);
    p->pool = dup_str(l, 0, "main");
    p->model_prefix = dup_str(l, 0, "");
    p->source = dup_str(l, 0, "env");
    p->api_key = key && *key ? dup_str(l, 0, key) : NULL;
    p->weight = 1.0;
    const char *rpm = getenv("SIDECAR_RATE_RPM");
    p->rpm_limit = rpm && atoi(rpm) > 0 ? atoi(rpm) : 40;
    if (!p->id || !p->adapter || !p->base_url || !p->pool || !p->model_prefix || !p->source)
        return -1;
    size_t n = strlen(p->base_url);
    while (n > 8 && p->base_url[n - 1] == '/') p->base_url[--n] = '\0';
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return fail(l, 0, "SIDECAR_UPSTREAM must start with http:// or https://");
    p->forward = mg_provider_forward_default(p->base_url);
    return 0;
}

/* Reads the whole file into a malloc'd buffer, refusing more than MAX_FILE_BYTES. */
static int read_file(loader_t *l, FILE *f, char **out, size_t *out_len)
{
    size_t len = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            if (cap > MAX_FILE_BYTES) {
                free(buf);
                return fail(l, 0, "file too large (more than %u bytes)", MAX_FILE_BYTES);
            }
            cap = cap ? cap * 2 : 16 * 1024;
            if (cap > MAX_FILE_BYTES + 1)
                cap = MAX_FILE_BYTES + 1; /* one byte more tells "too large" from "exact" */
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                return fail(l, 0, "out of memory");
            }
            buf = p;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                free(buf);
                return fail(l, 0, "cannot read: %s", strerror(errno));
            }
            break;
        }
    }
    if (len > MAX_FILE_BYTES) {
        free(buf);
        return fail(l, 0, "file too large (more than %u bytes)", MAX_FILE_BYTES);
    }
    *out = buf;
    *out_len = len;
    return 0;
}

int mg_config_load(const char *path, mg_config_t **out, char *err, size_t err_len)
{
    loader_t l = {.name = path, .err = err, .err_len = err_len};
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return fail(&l, 0, "cannot open: %s", strerror(errno));
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(&l, f, &buf, &len);
    fclose(f);
    if (rc == 0) rc = mg_config_parse(path, buf, len, out, err, err_len);
    free(buf);
    return rc;
}

void mg_config_free(mg_config_t *cfg)
{
    if (!cfg) return;
    mg_billing_conf_free(&cfg->billing);
    free(cfg->default_application);
    for (size_t i = 0; i < cfg->cors.n_origins; i++) free(cfg->cors.origins[i]);
    free(cfg->cors.origins);
    for (size_t i = 0; i < cfg->n_providers; i++) {
        mg_provider_conf_t *p = &cfg->providers[i];
        free(p->id);
        free(p->adapter);
        free(p->engine);
        free(p->model_prefix);
        free(p->source);
        free(p->name);
        free(p->base_url);
        if (p->api_key) /* a secret: do not leave it in freed memory */
            explicit_bzero(p->api_key, strlen(p->api_key));
        free(p->api_key);
        free(p->pool);
    }
    free(cfg->providers);
    for (size_t i = 0; i < cfg->n_models; i++) mg_model_conf_clear(&cfg->models[i]);
    free(cfg->models);
    for (size_t i = 0; i < cfg->n_apps; i++) mg_app_conf_clear(&cfg->apps[i]);
    free(cfg->apps);
    mg_prices_free(cfg);
    free(cfg->path);
    free(cfg->listen);
    free(cfg->metrics_listen);
    free(cfg->storage_path);
    free(cfg->storage_backup_dir);
    free(cfg->tokenizer_data_dir);
    mg_context_conf_clear(&cfg->context);
    mg_protocols_conf_clear(&cfg->protocols);
    free(cfg->policies_dir);
    free(cfg->adapters_dir);
    free(cfg->lua_dir);
    free(cfg->log_level);
    free(cfg->log_file);
    free(cfg);
}

static char *dup_or(const char *s, const char *dflt)
{
    return s ? strdup(s) : dflt ? strdup(dflt) : NULL;
}

int mg_config_add_provider(mg_config_t *cfg, const mg_provider_conf_t *tmpl, char *err,
                           size_t err_len)
{
    if (mg_config_provider(cfg, tmpl->id)) {
        snprintf(err, err_len, "provider id '%s' is taken", tmpl->id);
        return -1;
    }
    mg_provider_conf_t *list = realloc(cfg->providers, (cfg->n_providers + 1) * sizeof(*list));
    if (!list) goto oom;
    cfg->providers = list;
    mg_provider_conf_t *p = &list[cfg->n_providers];
    *p = *tmpl;
    p->id = strdup(tmpl->id);
    p->adapter = dup_or(tmpl->adapter, "openai");
    p->base_url = strdup(tmpl->base_url);
    p->api_key = dup_or(tmpl->api_key, NULL);
    p->pool = dup_or(tmpl->pool, "main");
    p->engine = dup_or(tmpl->engine, NULL);
    p->model_prefix = dup_or(tmpl->model_prefix, NULL);
    p->source = dup_or(tmpl->source, "db");
    p->name = dup_or(tmpl->name, NULL);
    p->forward = mg_provider_forward_default(p->base_url); /* stored providers do not say */
    cfg->n_providers++; /* counted now so mg_config_free releases a partly copied entry */
    if (!p->id || !p->adapter || !p->base_url || (tmpl->api_key && !p->api_key) || !p->pool ||
        (tmpl->engine && !p->engine) || (tmpl->model_prefix && !p->model_prefix) || !p->source ||
        (tmpl->name && !p->name))
        goto oom;
    return 0;
oom:
    snprintf(err, err_len, "out of memory");
    return -1;
}

void mg_app_conf_clear(mg_app_conf_t *app)
{
    for (size_t i = 0; i < app->n_allowed_models; i++) free(app->allowed_models[i]);
    free(app->allowed_models);
    free(app->name);
    memset(app, 0, sizeof(*app));
}

bool mg_app_allows_model(const mg_app_conf_t *app, const char *name)
{
    if (!app->allowed_models) return true;
    for (size_t i = 0; i < app->n_allowed_models; i++)
        if (strcmp(app->allowed_models[i], name) == 0) return true;
    return false;
}

int mg_config_add_app(mg_config_t *cfg, mg_app_conf_t *app, char *err, size_t err_len)
{
    if (mg_config_app(cfg, app->name)) {
        snprintf(err, err_len, "application name '%s' is taken", app->name);
        return -1;
    }
    mg_app_conf_t *list = realloc(cfg->apps, (cfg->n_apps + 1) * sizeof(*list));
    if (!list) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    cfg->apps = list;
    list[cfg->n_apps++] = *app;
    memset(app, 0, sizeof(*app));
    return 0;
}

void mg_model_conf_clear(mg_model_conf_t *m)
{
    for (size_t j = 0; j < m->n_routes; j++) {
        free(m->routes[j].provider);
        free(m->routes[j].model);
    }
    free(m->routes);
    free(m->name);
    memset(m, 0, sizeof(*m));
}

int mg_config_add_model(mg_config_t *cfg, mg_model_conf_t *m, char *err, size_t err_len)
{
    if (mg_config_model(cfg, m->name)) {
        snprintf(err, err_len, "model name '%s' is taken", m->name);
        return -1;
    }
    mg_model_conf_t *list = realloc(cfg->models, (cfg->n_models + 1) * sizeof(*list));
    if (!list) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    cfg->models = list;
    list[cfg->n_models++] = *m;
    memset(m, 0, sizeof(*m));
    return 0;
}

const mg_provider_conf_t *mg_config_provider(const mg_config_t *cfg, const char *id)
{
    if (!cfg || !id) return NULL;
    for (size_t i = 0; i < cfg->n_providers; i++)
        if (!strcmp(cfg->providers[i].id, id)) return &cfg->providers[i];
    return NULL;
}

void mg_config_link_routes(mg_config_t *cfg)
{
    for (size_t m = 0, slot = 0; m < cfg->n_models; m++)
        for (size_t i = 0; i < cfg->models[m].n_routes; i++) cfg->models[m].routes[i].slot = slot++;
    if (!cfg->n_providers) return;
    /* providers sorted by id, each route's found by binary search, as at load */
    const mg_provider_conf_t **by_id = malloc(cfg->n_providers * sizeof *by_id);
    if (!by_id) return; /* hints unset: lookups search, slower but right */
    for (size_t i = 0; i < cfg->n_providers; i++) by_id[i] = &cfg->providers[i];
    qsort(by_id, cfg->n_providers, sizeof *by_id, cmp_provider_ptr);
    for (size_t m = 0; m < cfg->n_models; m++) {
        for (size_t i = 0; i < cfg->models[m].n_routes; i++) {
            mg_route_conf_t *r = &cfg->models[m].routes[i];
            const mg_provider_conf_t **p =
                bsearch(r->provider, by_id, cfg->n_providers, sizeof *by_id, cmp_provider_id);
            r->provider_hint = p ? (int)(*p - cfg->providers) : -1;
            r->linked = p ? *p : NULL;
        }
    }
    free(by_id);
}

const mg_provider_conf_t *mg_config_route_provider(const mg_config_t *cfg, const mg_route_conf_t *r)
{
    int i = r->provider_hint;
    if (i >= 0 && (size_t)i < cfg->n_providers &&
        (r->linked == &cfg->providers[i] || strcmp(cfg->providers[i].id, r->provider) == 0))
        return &cfg->providers[i];
    return mg_config_provider(cfg, r->provider);
}

const mg_app_conf_t *mg_config_app(const mg_config_t *cfg, const char *name)
{
    for (size_t i = 0; name && i < cfg->n_apps; i++)
        if (strcmp(cfg->apps[i].name, name) == 0) return &cfg->apps[i];
    return NULL;
}

const mg_model_conf_t *mg_config_model(const mg_config_t *cfg, const char *name)
{
    if (!cfg || !name) return NULL;
    for (size_t i = 0; i < cfg->n_models; i++)
        if (!strcmp(cfg->models[i].name, name)) return &cfg->models[i];
    return NULL;
}
