/* loader: the config readers' shared helpers; see loader.h. */
#include "conf/loader.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------- errors and helpers */

/* ---------------------------------------------------------------- errors and helpers */

/* Writes "NAME:LINE: message" (or "NAME: message" when line <= 0) into the error buffer
 * and returns -1, so callers can `return conf_fail(...)`. */
int conf_fail(conf_loader_t *l, int line, const char *fmt, ...)
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

int conf_line_of(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 0;
}

yaml_node_t *conf_node_at(conf_loader_t *l, int index)
{
    return yaml_document_get_node(l->doc, index);
}

/* Takes `bytes` from the allocation budget; fails once a (probably aliased) document
 * would expand far beyond its own size. */
int conf_charge(conf_loader_t *l, int line, size_t bytes)
{
    if (bytes > l->budget) return conf_fail(l, line, "configuration expands too much (aliases?)");
    l->budget -= bytes;
    return 0;
}

/* Copies s for the result, charging the budget. */
char *conf_dup_str(conf_loader_t *l, int line, const char *s)
{
    size_t n = strlen(s) + 1;
    if (conf_charge(l, line, n) < 0) return NULL;
    char *p = malloc(n);
    if (!p) {
        conf_fail(l, line, "out of memory");
        return NULL;
    }
    memcpy(p, s, n);
    return p;
}

/* A short printable rendering of a value for messages (never used for secrets):
 * non-printable bytes become '?', long values end in "...". */
const char *conf_shown(const char *s, char *buf, size_t len)
{
    size_t i = 0;
    for (; s[i] && i + 4 < len; i++) buf[i] = isprint((unsigned char)s[i]) ? s[i] : '?';
    strcpy(buf + i, s[i] ? "..." : "");
    return buf;
}

bool conf_is_scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE;
}

const char *conf_scalar_text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A plain (unquoted) empty, ~ or null scalar is YAML's null. */
bool conf_is_null(const yaml_node_t *n)
{
    if (!conf_is_scalar(n) || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *s = conf_scalar_text(n);
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
char *conf_expand(conf_loader_t *l, const yaml_node_t *v, int line, const char *path, bool *missing)
{
    const char *s = conf_scalar_text(v);
    if (strlen(s) != v->data.scalar.length) {
        conf_fail(l, line, "%s contains a NUL character", path);
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
            conf_fail(l, line, "unterminated ${ in %s", path);
            goto err;
        }
        size_t n = (size_t)(end - name);
        if (!valid_env_name(name, n)) {
            conf_fail(l, line, "invalid environment variable reference in %s (expected ${NAME})",
                      path);
            goto err;
        }
        char var[256];
        if (n >= sizeof var) {
            conf_fail(l, line, "environment variable name too long in %s", path);
            goto err;
        }
        memcpy(var, name, n);
        var[n] = '\0';
        const char *val = getenv(var);
        if (missing && (!val || !*val)) {
            *missing = true;
        } else if (!val) {
            conf_fail(l, line, "undefined environment variable '%s' in %s", var, path);
            goto err;
        } else if (sb_add(&b, val, strlen(val)) < 0) {
            goto oom;
        }
        s = end + 1;
    }
    if (conf_charge(l, line, b.len + 1) < 0) goto err;
    return b.p;
oom:
    conf_fail(l, line, "out of memory");
err:
    free(b.p);
    return NULL;
}

/* ------------------------------------------------------------------ mapping walking */

bool conf_key_is(conf_loader_t *l, const yaml_node_pair_t *p, const char *key)
{
    yaml_node_t *k = conf_node_at(l, p->key);
    return conf_is_scalar(k) && !strcmp(conf_scalar_text(k), key);
}

/* The pair with scalar key `key` in mapping `map`, or NULL. */
yaml_node_pair_t *conf_find_pair(conf_loader_t *l, yaml_node_t *map, const char *key)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
        if (conf_key_is(l, p, key)) return p;
    return NULL;
}

static int keyref_cmp(const void *a, const void *b)
{
    const conf_keyref_t *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Index of the first entry (in file order) whose key repeats an earlier one, or -1.
 * Sorting keeps this O(n log n) for large, fuzzed inputs. Reorders `refs`. */
long conf_first_duplicate(conf_keyref_t *refs, size_t n)
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
int conf_check_keys(conf_loader_t *l, yaml_node_t *map, const char *where,
                    const char *const *allowed)
{
    yaml_node_pair_t *start = map->data.mapping.pairs.start;
    size_t n = (size_t)(map->data.mapping.pairs.top - start);
    char buf[72];
    unsigned long long seen = 0; /* bit i: allowed[i] already met */
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *k = conf_node_at(l, start[i].key);
        if (!conf_is_scalar(k) || conf_is_null(k))
            return conf_fail(l, conf_line_of(k), "keys must be strings %s", where);
        const char *key = conf_scalar_text(k);
        if (strlen(key) != k->data.scalar.length)
            return conf_fail(l, conf_line_of(k), "key contains a NUL character %s", where);
        if (!allowed) continue;
        size_t a = 0;
        while (allowed[a] && strcmp(allowed[a], key)) a++;
        if (!allowed[a])
            return conf_fail(l, conf_line_of(k), "unknown key '%s' %s",
                             conf_shown(key, buf, sizeof buf), where);
        if (seen & (1ULL << a))
            return conf_fail(l, conf_line_of(k), "duplicate key '%s' %s", key, where);
        seen |= 1ULL << a;
    }
    if (allowed || n < 2) return 0;
    conf_keyref_t *refs = malloc(n * sizeof *refs);
    if (!refs) return conf_fail(l, conf_line_of(map), "out of memory");
    for (size_t i = 0; i < n; i++)
        refs[i] = (conf_keyref_t){conf_scalar_text(conf_node_at(l, start[i].key)), i};
    long dup = conf_first_duplicate(refs, n);
    free(refs);
    if (dup >= 0) {
        yaml_node_t *k = conf_node_at(l, start[dup].key);
        return conf_fail(l, conf_line_of(k), "duplicate key '%s' %s",
                         conf_shown(conf_scalar_text(k), buf, sizeof buf), where);
    }
    return 0;
}

/* Checks that `v` (the value at `path`, on `line`) is a mapping with only `allowed` keys.
 * Returns 1 for a mapping, 0 for null (an empty section), -1 on error. */
int conf_want_map(conf_loader_t *l, yaml_node_t *v, int line, const char *path,
                  const char *const *allowed)
{
    if (conf_is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE) return conf_fail(l, line, "%s must be a mapping", path);
    char where[340];
    snprintf(where, sizeof where, "in %s", path);
    return conf_check_keys(l, v, where, allowed) < 0 ? -1 : 1;
}

/* ----------------------------------------------------------------- typed field access */

void conf_field_get(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    conf_field_t *f)
{
    yaml_node_pair_t *p = map ? conf_find_pair(l, map, key) : NULL;
    f->val = p ? conf_node_at(l, p->value) : NULL;
    f->line = p ? conf_line_of(conf_node_at(l, p->key)) : conf_line_of(map);
    snprintf(f->path, sizeof f->path, "%s.%s", path, key);
}

/* Reads the field as a string with ${NAME} expanded; the result is owned by the caller.
 * Null and non-scalars are type errors. */
int conf_field_string(conf_loader_t *l, const conf_field_t *f, char **out)
{
    if (!conf_is_scalar(f->val) || conf_is_null(f->val))
        return conf_fail(l, f->line, "%s must be a string", f->path);
    *out = conf_expand(l, f->val, f->line, f->path, NULL);
    return *out ? 0 : -1;
}

/* Optional non-empty string: absent leaves *dst unchanged; present replaces it. */
int conf_opt_string(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    char **dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL;
    if (conf_field_string(l, &f, &s) < 0) return -1;
    if (!*s) {
        free(s);
        return conf_fail(l, f.line, "%s must not be empty", f.path);
    }
    free(*dst);
    *dst = s;
    return 0;
}

/* Required non-empty string. */
int conf_req_string(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    char **dst)
{
    if (!conf_find_pair(l, map, key))
        return conf_fail(l, conf_line_of(map), "%s is missing required key '%s'", path, key);
    return conf_opt_string(l, map, path, key, dst);
}

/* Optional integer in [lo, hi] (decimal, optional sign). */
int conf_opt_int(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                 long long lo, long long hi, long long *dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL;
    if (!conf_is_scalar(f.val) || conf_is_null(f.val))
        return conf_fail(l, f.line, "%s must be an integer", f.path);
    if (conf_field_string(l, &f, &s) < 0) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    bool ok = *s && !isspace((unsigned char)*s) && !*end && errno == 0;
    free(s);
    if (!ok) return conf_fail(l, f.line, "%s must be an integer", f.path);
    if (v < lo || v > hi)
        return conf_fail(l, f.line, "%s must be between %lld and %lld", f.path, lo, hi);
    *dst = v;
    return 0;
}

int conf_opt_int_field(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                       long long lo, long long hi, int *dst)
{
    long long v = *dst;
    if (conf_opt_int(l, map, path, key, lo, hi, &v) < 0) return -1;
    *dst = (int)v;
    return 0;
}

/* Optional boolean: true/false (also YAML 1.1's yes/no/on/off), any case. */
int conf_opt_bool(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key, bool *dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    if (!conf_is_scalar(f.val) || conf_is_null(f.val))
        return conf_fail(l, f.line, "%s must be true or false", f.path);
    char *s = NULL;
    if (conf_field_string(l, &f, &s) < 0) return -1;
    static const char *const yes[] = {"true", "yes", "on", NULL};
    static const char *const no[] = {"false", "no", "off", NULL};
    int v = -1;
    for (int i = 0; yes[i]; i++) {
        if (!strcasecmp(s, yes[i])) v = 1;
        if (!strcasecmp(s, no[i])) v = 0;
    }
    free(s);
    if (v < 0) return conf_fail(l, f.line, "%s must be true or false", f.path);
    *dst = v == 1;
    return 0;
}

/* Optional finite number > 0 and <= hi. */
/* A number in (0, hi], or [0, hi] with zero_ok. */
int conf_opt_number(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    bool zero_ok, double hi, double *dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    if (!conf_is_scalar(f.val) || conf_is_null(f.val))
        return conf_fail(l, f.line, "%s must be a number", f.path);
    char *s = NULL;
    if (conf_field_string(l, &f, &s) < 0) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    bool ok = *s && !isspace((unsigned char)*s) && !*end && errno == 0 && isfinite(v);
    free(s);
    if (!ok) return conf_fail(l, f.line, "%s must be a number", f.path);
    if (!(zero_ok ? v >= 0 : v > 0) || v > hi)
        return conf_fail(l, f.line, "%s must be %s 0 and at most %g", f.path,
                         zero_ok ? "at least" : "greater than", hi);
    *dst = v;
    return 0;
}

int conf_opt_positive(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                      double hi, double *dst)
{
    return conf_opt_number(l, map, path, key, false, hi, dst);
}

/* ------------------------------------------------------------------- value checks */

bool conf_all_chars(const char *s, const char *extra)
{
    if (!*s) return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr(extra, *s)) return false;
    return true;
}

/* "host:port" with port 0-65535; host a name/IPv4 address or a bracketed IPv6 address. */
bool conf_valid_listen(const char *s)
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
long conf_listen_port(const char *s)
{
    return atol(strrchr(s, ':') + 1);
}

/* Logical and upstream model names: non-empty, printable, no whitespace. */
bool conf_valid_name(const char *s)
{
    if (!*s || strlen(s) > MAX_NAME_LEN) return false;
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || *s == 0x7f) return false;
    return true;
}

int conf_opt_choice(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key,
                    const char *const *choices, int *dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL, list[200] = "";
    if (conf_field_string(l, &f, &s) < 0) return -1;
    for (int i = 0; choices[i]; i++) {
        if (!strcmp(s, choices[i])) {
            free(s);
            *dst = i;
            return 0;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", choices[i]);
    }
    free(s);
    return conf_fail(l, f.line, "%s must be one of %s", f.path, list);
}

int conf_opt_text(conf_loader_t *l, yaml_node_t *map, const char *path, const char *key, char **dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, key, &f);
    if (!f.val) return 0;
    char *s = NULL;
    if (conf_field_string(l, &f, &s) < 0) return -1;
    free(*dst);
    *dst = *s ? s : NULL;
    if (!*s) free(s);
    return 0;
}
