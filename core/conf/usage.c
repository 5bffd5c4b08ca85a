/* usage: the `usage:` and `prices:` sections and the stored price versions; see usage.h.
 *
 * The sections are read by turning their YAML subtree into JSON (plain scalars that read
 * as integers become numbers, true/false booleans, quoted scalars stay strings) and then
 * checking that JSON: a price entry from the file and one posted to /api/v2/prices go
 * through the same validator (mg_price_from_json). */
#include "conf/usage.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/siphash.h"
#include "conf/config.h"
#include "store/store.h"

void mg_usage_conf_defaults(mg_usage_conf_t *u)
{
    u->enabled = true;
    u->retention_days = 90;
    u->prune_batch = 1000;
    u->prune_interval_s = 10;
}

/* ---- YAML to JSON ---- */

static cJSON *scalar_json(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return cJSON_CreateString(s);
    if (!strcmp(s, "true")) return cJSON_CreateTrue();
    if (!strcmp(s, "false")) return cJSON_CreateFalse();
    if (!*s || !strcmp(s, "~") || !strcmp(s, "null")) return cJSON_CreateNull();
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end == '\0' && end != s) return cJSON_CreateNumber((double)v);
    return cJSON_CreateString(s);
}

/* The subtree at n as JSON, depth-limited (aliases cannot blow it up past 8 levels). NULL
 * when out of memory or too deep. */
static cJSON *yaml_json(yaml_document_t *doc, yaml_node_t *n, int depth)
{
    if (!n || depth > 8) return NULL;
    if (n->type == YAML_SCALAR_NODE) return scalar_json(n);
    if (n->type == YAML_SEQUENCE_NODE) {
        cJSON *a = cJSON_CreateArray();
        for (yaml_node_item_t *i = n->data.sequence.items.start;
             a && i < n->data.sequence.items.top; i++) {
            cJSON *v = yaml_json(doc, yaml_document_get_node(doc, *i), depth + 1);
            if (!v) {
                cJSON_Delete(a);
                return NULL;
            }
            cJSON_AddItemToArray(a, v);
        }
        return a;
    }
    cJSON *o = cJSON_CreateObject();
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; o && p < n->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        cJSON *v = yaml_json(doc, yaml_document_get_node(doc, p->value), depth + 1);
        if (!k || k->type != YAML_SCALAR_NODE || !v) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToObject(o, (const char *)k->data.scalar.value, v);
    }
    return o;
}

/* ---- checks ---- */

static int only_keys(const cJSON *o, const char *const *keys, const char *what, char *err,
                     size_t errlen)
{
    for (const cJSON *m = o->child; m; m = m->next) {
        int known = 0;
        for (int i = 0; keys[i]; i++) known |= !strcmp(m->string, keys[i]);
        if (!known) {
            snprintf(err, errlen, "%s: unknown field '%.64s'", what, m->string);
            return -1;
        }
    }
    return 0;
}

/* An integer member in [lo, hi]; absent: *out unchanged. 0 or -1. */
static int int_member(const cJSON *o, const char *key, long long lo, long long hi, int64_t *out,
                      const char *what, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(long long)v->valuedouble ||
        v->valuedouble < (double)lo || v->valuedouble > (double)hi) {
        snprintf(err, errlen, "%s.%s must be an integer from %lld to %lld", what, key, lo, hi);
        return -1;
    }
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* "YYYY-MM-DDTHH:MM:SSZ" into unix seconds; -1 when it is not that. */
static int64_t parse_utc(const char *s)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    char z = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &z) != 7 ||
        z != 'Z' || strlen(s) != 20)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (int64_t)timegm(&tm);
}

static int name_member(const cJSON *o, const char *key, int required, char **out, char *err,
                       size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v && !required) return 0;
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > 256) {
        snprintf(err, errlen, "price.%s must be a non-empty string (at most 256 bytes)", key);
        return -1;
    }
    *out = strdup(v->valuestring);
    return *out ? 0 : (snprintf(err, errlen, "out of memory"), -1);
}

/* The file entry's version: a hash of what it says, so it survives reloads unchanged. */
static void cfg_version(mg_price_t *p)
{
    char text[640];
    int n = snprintf(text, sizeof(text),
                     "%s|%s|%" PRId64 "|%" PRId64 "|%" PRId64 "|%" PRId64 "|%" PRId64, p->provider,
                     p->model, p->input_micros, p->output_micros, p->cached_input_micros,
                     p->cache_write_micros, p->effective_at);
    static const uint8_t key[16] = "moongate-prices";
    uint64_t h[2];
    mg_siphash128(text, n > 0 ? (size_t)n : 0, key, h);
    snprintf(p->version, sizeof(p->version), "cfg-%08" PRIx64, h[0] & 0xffffffffu);
}

int mg_price_from_json(const cJSON *o, mg_price_t *out, char *err, size_t errlen)
{
    static const char *const keys[] = {"provider",
                                       "model",
                                       "input_per_1m_micros",
                                       "output_per_1m_micros",
                                       "cached_input_per_1m_micros",
                                       "cache_write_per_1m_micros",
                                       "effective_at",
                                       NULL};
    memset(out, 0, sizeof(*out));
    if (!cJSON_IsObject(o)) {
        snprintf(err, errlen, "a price must be an object");
        return -1;
    }
    if (only_keys(o, keys, "price", err, errlen) != 0 ||
        name_member(o, "provider", 1, &out->provider, err, errlen) != 0 ||
        name_member(o, "model", 0, &out->model, err, errlen) != 0)
        goto bad;
    if (!out->model && !(out->model = strdup("*"))) goto bad;
    out->input_micros = out->output_micros = -1;
    if (int_member(o, "input_per_1m_micros", 0, MG_PRICE_MAX_MICROS, &out->input_micros, "price",
                   err, errlen) ||
        int_member(o, "output_per_1m_micros", 0, MG_PRICE_MAX_MICROS, &out->output_micros, "price",
                   err, errlen))
        goto bad;
    if (out->input_micros < 0 || out->output_micros < 0) {
        snprintf(err, errlen,
                 "price.input_per_1m_micros and price.output_per_1m_micros are required");
        goto bad;
    }
    out->cached_input_micros = out->cache_write_micros = out->input_micros;
    if (int_member(o, "cached_input_per_1m_micros", 0, MG_PRICE_MAX_MICROS,
                   &out->cached_input_micros, "price", err, errlen) ||
        int_member(o, "cache_write_per_1m_micros", 0, MG_PRICE_MAX_MICROS, &out->cache_write_micros,
                   "price", err, errlen))
        goto bad;
    const cJSON *at = cJSON_GetObjectItemCaseSensitive(o, "effective_at");
    if (cJSON_IsString(at)) {
        out->effective_at = parse_utc(at->valuestring);
        if (out->effective_at < 0) {
            snprintf(err, errlen,
                     "price.effective_at must be YYYY-MM-DDTHH:MM:SSZ or unix seconds");
            goto bad;
        }
    } else if (int_member(o, "effective_at", 0, 253402300799LL, &out->effective_at, "price", err,
                          errlen)) {
        goto bad;
    }
    cfg_version(out);
    return 0;
bad:
    mg_price_clear(out);
    return -1;
}

cJSON *mg_price_to_json(const mg_price_t *p)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "object", "price");
    cJSON_AddStringToObject(o, "version", p->version);
    cJSON_AddStringToObject(o, "provider", p->provider);
    cJSON_AddStringToObject(o, "model", p->model);
    cJSON_AddNumberToObject(o, "input_per_1m_micros", (double)p->input_micros);
    cJSON_AddNumberToObject(o, "output_per_1m_micros", (double)p->output_micros);
    cJSON_AddNumberToObject(o, "cached_input_per_1m_micros", (double)p->cached_input_micros);
    cJSON_AddNumberToObject(o, "cache_write_per_1m_micros", (double)p->cache_write_micros);
    cJSON_AddNumberToObject(o, "effective_at", (double)p->effective_at);
    return o;
}

void mg_price_clear(mg_price_t *p)
{
    free(p->provider);
    free(p->model);
    memset(p, 0, sizeof(*p));
}

int mg_prices_add(mg_config_t *cfg, mg_price_t *p)
{
    mg_price_t *a = realloc(cfg->prices, (cfg->n_prices + 1) * sizeof(*a));
    if (!a) {
        mg_price_clear(p);
        return -1;
    }
    cfg->prices = a;
    a[cfg->n_prices++] = *p;
    memset(p, 0, sizeof(*p));
    return 0;
}

void mg_prices_free(mg_config_t *cfg)
{
    for (size_t i = 0; i < cfg->n_prices; i++) mg_price_clear(&cfg->prices[i]);
    free(cfg->prices);
    cfg->prices = NULL;
    cfg->n_prices = 0;
}

/* ---- the sections ---- */

static int usage_section(const cJSON *o, mg_usage_conf_t *u, char *err, size_t errlen)
{
    static const char *const keys[] = {"enabled", "retention_days", "prune_batch",
                                       "prune_interval_s", NULL};
    if (cJSON_IsNull(o)) return 0;
    if (!cJSON_IsObject(o)) {
        snprintf(err, errlen, "usage must be a mapping");
        return -1;
    }
    if (only_keys(o, keys, "usage", err, errlen) != 0) return -1;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(o, "enabled");
    if (en && !cJSON_IsBool(en)) {
        snprintf(err, errlen, "usage.enabled must be true or false");
        return -1;
    }
    if (en) u->enabled = cJSON_IsTrue(en);
    int64_t days = u->retention_days, batch = u->prune_batch, every = u->prune_interval_s;
    if (int_member(o, "retention_days", 1, 36500, &days, "usage", err, errlen) ||
        int_member(o, "prune_batch", 1, 100000, &batch, "usage", err, errlen) ||
        int_member(o, "prune_interval_s", 1, 86400, &every, "usage", err, errlen))
        return -1;
    u->retention_days = (int)days;
    u->prune_batch = (int)batch;
    u->prune_interval_s = (int)every;
    return 0;
}

static int line_of(const yaml_node_t *n)
{
    return n ? (int)n->start_mark.line + 1 : 0;
}

static int prices_section(yaml_document_t *doc, yaml_node_t *v, const cJSON *a, mg_config_t *cfg,
                          int *line, char *err, size_t errlen)
{
    if (cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a)) {
        snprintf(err, errlen, "prices must be a list of price entries");
        return -1;
    }
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        mg_price_t p;
        char why[256];
        if (mg_price_from_json(e, &p, why, sizeof(why)) != 0) {
            *line = line_of(yaml_document_get_node(doc, v->data.sequence.items.start[i]));
            snprintf(err, errlen, "prices[%d]: %s", i, why);
            return -1;
        }
        if (mg_prices_add(cfg, &p) != 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

int mg_conf_usage_section(yaml_document_t *doc, yaml_node_t *v, int is_prices, mg_config_t *cfg,
                          int *line, char *err, size_t errlen)
{
    *line = line_of(v);
    cJSON *j = yaml_json(doc, v, 0);
    if (!j) {
        snprintf(err, errlen, "%s: nested too deep or out of memory",
                 is_prices ? "prices" : "usage");
        return -1;
    }
    int rc = is_prices ? prices_section(doc, v, j, cfg, line, err, errlen)
                       : usage_section(j, &cfg->usage, err, errlen);
    cJSON_Delete(j);
    return rc;
}

/* ---- stored versions ---- */

typedef struct {
    mg_config_t *cfg;
    int failed;
} load_t;

static void load_row(void *ud, int ncols, const char *const *c)
{
    load_t *l = ud;
    if (ncols < 8 || l->failed) return;
    mg_price_t p;
    memset(&p, 0, sizeof(p));
    p.provider = strdup(c[1] ? c[1] : "");
    p.model = strdup(c[2] ? c[2] : "*");
    int64_t *f[6] = {&p.input_micros,       &p.output_micros, &p.cached_input_micros,
                     &p.cache_write_micros, &p.effective_at,  NULL};
    for (int i = 0; f[i]; i++) *f[i] = c[3 + i] ? strtoll(c[3 + i], NULL, 10) : 0;
    snprintf(p.version, sizeof(p.version), "db-%s", c[0] ? c[0] : "0");
    if (!p.provider || !p.model || mg_prices_add(l->cfg, &p) != 0) {
        mg_price_clear(&p);
        l->failed = 1;
    }
}

int mg_prices_load(mg_store_t *st, mg_config_t *cfg, char *err, size_t errlen)
{
    load_t l = {cfg, 0};
    if (mg_store_query(st,
                       "SELECT id, provider_id, model, input_micros, output_micros,"
                       " cached_input_micros, cache_write_micros, effective_at FROM prices"
                       " ORDER BY id",
                       0, NULL, load_row, &l, err, errlen) != 0)
        return -1;
    if (l.failed) {
        snprintf(err, errlen, "out of memory loading prices");
        return -1;
    }
    return 0;
}
