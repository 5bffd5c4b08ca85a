/* catalog: what is served: providers (ids, adapters, keys from the environment, forwarding) and
 * models (routes checked against the providers), the lookups over them, and the providers and
 * models the admin API adds at run time; see sections.h. */
#include "conf/sections.h"

#include "token/encoding.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int opt_cost(conf_loader_t *l, yaml_node_t *map, const char *path, double *dst)
{
    return conf_opt_number(l, map, path, "cost_per_1k_tokens", true, 1e6, dst);
}

/* models.<name>.tokenizer: an encoding's name or "estimate"; absent, by the upstream family. */
static int load_model_tokenizer(conf_loader_t *l, yaml_node_t *v, const char *path,
                                mg_model_conf_t *m)
{
    char *name = NULL;
    if (conf_opt_string(l, v, path, "tokenizer", &name) < 0) return -1;
    int id = name ? mg_encoding_lookup(name) : mg_encoding_for_model(m->routes[0].model);
    if (name && id < 0 && strcmp(name, "estimate") != 0) {
        char buf[72];
        conf_fail(l, conf_line_of(v),
                  "%s.tokenizer: '%s' is none of o200k_base, cl100k_base, estimate", path,
                  conf_shown(name, buf, sizeof buf));
        free(name);
        return -1;
    }
    free(name);
    m->tokenizer = id + 1;
    return 0;
}

/* The api_key: optional; an undefined or empty ${VAR} in it, or an empty value, means
 * "no key". No message here ever shows the value. */
static int load_api_key(conf_loader_t *l, yaml_node_t *map, const char *path, char **dst)
{
    conf_field_t f;
    conf_field_get(l, map, path, "api_key", &f);
    if (!f.val || conf_is_null(f.val)) return 0;
    if (!conf_is_scalar(f.val)) return conf_fail(l, f.line, "%s must be a string", f.path);
    bool missing = false;
    char *s = conf_expand(l, f.val, f.line, f.path, &missing);
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
static int load_forward(conf_loader_t *l, yaml_node_t *map, const char *path, mg_provider_conf_t *p)
{
    p->forward = mg_provider_forward_default(p->base_url);
    yaml_node_pair_t *fp = conf_find_pair(l, map, "forward");
    if (!fp) return 0;
    yaml_node_t *fv = conf_node_at(l, fp->value);
    if (fv->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, conf_line_of(fv), "%s.forward must be a list (of: metadata)", path);
    p->forward = 0;
    for (yaml_node_item_t *it = fv->data.sequence.items.start; it < fv->data.sequence.items.top;
         it++) {
        yaml_node_t *e = conf_node_at(l, *it);
        if (!conf_is_scalar(e) || strcmp(conf_scalar_text(e), "metadata") != 0)
            return conf_fail(l, conf_line_of(e), "%s.forward: only metadata can be forwarded",
                             path);
        p->forward |= MG_FORWARD_METADATA;
    }
    return 0;
}

static int load_provider(conf_loader_t *l, yaml_node_t *v, size_t i, mg_provider_conf_t *p)
{
    static const char *const keys[] = {"id",
                                       "adapter",
                                       "base_url",
                                       "api_key",
                                       "pool",
                                       "rpm_limit",
                                       "tpm_limit",
                                       "weight",
                                       "local",
                                       "engine",
                                       "model_prefix",
                                       "cost_per_1k_tokens",
                                       "stream_usage",
                                       "forward",
                                       "metrics_url",
                                       "name",
                                       NULL};
    char path[32], buf[72];
    snprintf(path, sizeof path, "providers[%zu]", i);
    p->line = conf_line_of(v);
    p->weight = 1.0;
    if (v->type != YAML_MAPPING_NODE) return conf_fail(l, p->line, "%s must be a mapping", path);
    if (conf_want_map(l, v, p->line, path, keys) < 0) return -1;
    conf_field_t f;

    if (conf_req_string(l, v, path, "id", &p->id) < 0) return -1;
    conf_field_get(l, v, path, "id", &f);
    if (strlen(p->id) > MAX_ID_LEN || !conf_all_chars(p->id, "._-"))
        return conf_fail(l, f.line,
                         "%s.id '%s' is invalid (letters, digits, '.', '_', '-'; at most %d)", path,
                         conf_shown(p->id, buf, sizeof buf), MAX_ID_LEN);

    if (conf_req_string(l, v, path, "adapter", &p->adapter) < 0) return -1;
    conf_field_get(l, v, path, "adapter", &f);
    if (strlen(p->adapter) > MAX_ID_LEN || !conf_all_chars(p->adapter, "_-"))
        return conf_fail(l, f.line, "%s.adapter '%s' is invalid (letters, digits, '_', '-')", path,
                         conf_shown(p->adapter, buf, sizeof buf));

    if (conf_req_string(l, v, path, "base_url", &p->base_url) < 0) return -1;
    conf_field_get(l, v, path, "base_url", &f);
    char *u = p->base_url;
    const char *host = !strncmp(u, "http://", 7)    ? u + 7
                       : !strncmp(u, "https://", 8) ? u + 8
                                                    : NULL;
    if (!host) return conf_fail(l, f.line, "%s.base_url must start with http:// or https://", path);
    for (const char *c = u; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f || *c == '?' || *c == '#')
            return conf_fail(l, f.line,
                             "%s.base_url must not contain spaces, control characters, '?' or '#'",
                             path);
    size_t n = strlen(u);
    while (n > (size_t)(host - u) && u[n - 1] == '/') u[--n] = '\0';
    if (!*host || *host == '/') return conf_fail(l, f.line, "%s.base_url has no host", path);

    if (load_api_key(l, v, path, &p->api_key) < 0) return -1;

    p->pool = conf_dup_str(l, p->line, "main");
    if (!p->pool || conf_opt_string(l, v, path, "pool", &p->pool) < 0) return -1;
    if (strcmp(p->pool, "main") && strcmp(p->pool, "fallback")) {
        conf_field_get(l, v, path, "pool", &f);
        return conf_fail(l, f.line, "%s.pool must be main or fallback (got '%s')", path,
                         conf_shown(p->pool, buf, sizeof buf));
    }
    if (conf_opt_int_field(l, v, path, "rpm_limit", 0, INT_MAX, &p->rpm_limit) < 0 ||
        conf_opt_int_field(l, v, path, "tpm_limit", 0, INT_MAX, &p->tpm_limit) < 0 ||
        conf_opt_positive(l, v, path, "weight", 1e6, &p->weight) < 0 ||
        conf_opt_string(l, v, path, "engine", &p->engine) < 0 ||
        conf_opt_string(l, v, path, "model_prefix", &p->model_prefix) < 0 ||
        conf_opt_string(l, v, path, "name", &p->name) < 0 ||
        conf_opt_string(l, v, path, "metrics_url", &p->metrics_url) < 0 ||
        opt_cost(l, v, path, &p->cost_per_1k_tokens) < 0)
        return -1;
    p->source = conf_dup_str(l, p->line, "file");
    if (!p->source) return -1;
    if (p->engine && strcmp(p->engine, "vllm") && strcmp(p->engine, "llamacpp") &&
        strcmp(p->engine, "ollama") && strcmp(p->engine, "triton") && strcmp(p->engine, "none")) {
        conf_field_get(l, v, path, "engine", &f);
        return conf_fail(l, f.line,
                         "%s.engine must be vllm, llamacpp, ollama, triton or none (got '%s')",
                         path, conf_shown(p->engine, buf, sizeof buf));
    }
    if (p->metrics_url && strncmp(p->metrics_url, "http://", 7) &&
        strncmp(p->metrics_url, "https://", 8)) {
        conf_field_get(l, v, path, "metrics_url", &f);
        return conf_fail(l, f.line, "%s.metrics_url must start with http:// or https://", path);
    }
    bool stream_usage = true;
    if (conf_opt_bool(l, v, path, "stream_usage", &stream_usage) < 0 ||
        load_forward(l, v, path, p) < 0)
        return -1;
    p->no_stream_usage = !stream_usage;
    return conf_opt_bool(l, v, path, "local", &p->local);
}

/* Rejects a repeated provider id, naming the line of the first definition. */
static int check_provider_ids(conf_loader_t *l)
{
    mg_config_t *c = l->cfg;
    if (c->n_providers < 2) return 0;
    conf_keyref_t *refs = malloc(c->n_providers * sizeof *refs);
    if (!refs) return conf_fail(l, 0, "out of memory");
    for (size_t i = 0; i < c->n_providers; i++) refs[i] = (conf_keyref_t){c->providers[i].id, i};
    long dup = conf_first_duplicate(refs, c->n_providers);
    free(refs);
    if (dup < 0) return 0;
    const mg_provider_conf_t *d = &c->providers[dup], *first = NULL;
    for (size_t i = 0; !first; i++)
        if (!strcmp(c->providers[i].id, d->id)) first = &c->providers[i];
    return conf_fail(l, d->line, "duplicate provider id '%s' (first defined at line %d)", d->id,
                     first->line);
}

int conf_section_providers(conf_loader_t *l, yaml_node_t *v, int line)
{
    if (conf_is_null(v)) return 0;
    if (v->type != YAML_SEQUENCE_NODE) return conf_fail(l, line, "providers must be a list");
    yaml_node_item_t *items = v->data.sequence.items.start;
    size_t n = (size_t)(v->data.sequence.items.top - items);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    if (conf_charge(l, line, n * sizeof *c->providers) < 0) return -1;
    c->providers = calloc(n, sizeof *c->providers);
    if (!c->providers) return conf_fail(l, line, "out of memory");
    for (size_t i = 0; i < n; i++) {
        c->n_providers = i + 1; /* so mg_config_free sees a partly filled entry */
        if (load_provider(l, conf_node_at(l, items[i]), i, &c->providers[i]) < 0) return -1;
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

static int load_route(conf_loader_t *l, yaml_node_t *v, const char *path, mg_route_conf_t *r,
                      const mg_provider_conf_t **by_id, size_t n_providers)
{
    static const char *const keys[] = {"provider",       "model",
                                       "smaller",        "priority",
                                       "weight_bytes",   "kv_cache_per_token_bytes",
                                       "context_window", NULL};
    char buf[72];
    r->line = conf_line_of(v);
    if (v->type != YAML_MAPPING_NODE)
        return conf_fail(l, r->line, "%s must be a mapping with provider and model", path);
    if (conf_want_map(l, v, r->line, path, keys) < 0 ||
        conf_req_string(l, v, path, "provider", &r->provider) < 0 ||
        conf_req_string(l, v, path, "model", &r->model) < 0 ||
        conf_opt_bool(l, v, path, "smaller", &r->smaller) < 0 ||
        conf_opt_int_field(l, v, path, "priority", 0, 1000, &r->priority) < 0 ||
        conf_opt_int(l, v, path, "weight_bytes", 0, (long long)1 << 50, &r->weight_bytes) < 0 ||
        conf_opt_int(l, v, path, "kv_cache_per_token_bytes", 0, (long long)1 << 32,
                     &r->kv_cache_per_token_bytes) < 0 ||
        conf_opt_int_field(l, v, path, "context_window", 0, 100000000, &r->context_window) < 0)
        return -1;
    /* a full-size route runs the model itself: the model's figures are its figures */
    if (!r->smaller && (r->weight_bytes || r->kv_cache_per_token_bytes))
        return conf_fail(l, r->line,
                         "%s: weight_bytes and kv_cache_per_token_bytes belong on the model, or on "
                         "a route with smaller: true",
                         path);
    if (!conf_valid_name(r->model))
        return conf_fail(l, r->line,
                         "%s.model '%s' is invalid (no spaces or control characters, at most %d)",
                         path, conf_shown(r->model, buf, sizeof buf), MAX_NAME_LEN);
    if (!by_id || !bsearch(r->provider, by_id, n_providers, sizeof *by_id, cmp_provider_id))
        return conf_fail(l, r->line, "%s: unknown provider '%s'", path,
                         conf_shown(r->provider, buf, sizeof buf));
    return 0;
}

static int load_model(conf_loader_t *l, yaml_node_t *key, yaml_node_t *v, mg_model_conf_t *m,
                      const mg_provider_conf_t **by_id, size_t n_providers)
{
    static const char *const keys[] = {
        "routes",    "max_concurrency", "weight_bytes",      "kv_cache_per_token_bytes",
        "tokenizer", "context_window",  "max_output_tokens", NULL};
    char buf[72], path[300];
    m->line = conf_line_of(key);
    const char *name = conf_scalar_text(key);
    if (!conf_valid_name(name))
        return conf_fail(l, m->line,
                         "model name '%s' is invalid (no spaces or control characters, at most %d)",
                         conf_shown(name, buf, sizeof buf), MAX_NAME_LEN);
    m->name = conf_dup_str(l, m->line, name);
    if (!m->name) return -1;
    snprintf(path, sizeof path, "models.%s", name);
    if (conf_is_null(v) || v->type != YAML_MAPPING_NODE)
        return conf_fail(l, m->line, "%s must be a mapping with routes", path);
    if (conf_want_map(l, v, m->line, path, keys) < 0 ||
        conf_opt_int_field(l, v, path, "max_concurrency", 0, 1000000, &m->max_concurrency) < 0 ||
        conf_opt_int(l, v, path, "weight_bytes", 0, (long long)1 << 50, &m->weight_bytes) < 0 ||
        conf_opt_int(l, v, path, "kv_cache_per_token_bytes", 0, (long long)1 << 32,
                     &m->kv_cache_per_token_bytes) < 0 ||
        conf_opt_int_field(l, v, path, "context_window", 0, 100000000, &m->context_window) < 0 ||
        conf_opt_int_field(l, v, path, "max_output_tokens", 0, 100000000, &m->max_output_tokens) <
            0)
        return -1;
    yaml_node_pair_t *rp = conf_find_pair(l, v, "routes");
    if (!rp) return conf_fail(l, m->line, "%s is missing required key 'routes'", path);
    yaml_node_t *routes = conf_node_at(l, rp->value);
    int rline = conf_line_of(conf_node_at(l, rp->key));
    if (routes->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, rline, "%s.routes must be a list", path);
    yaml_node_item_t *items = routes->data.sequence.items.start;
    size_t n = (size_t)(routes->data.sequence.items.top - items);
    if (n == 0) return conf_fail(l, rline, "%s.routes must have at least one route", path);
    if (conf_charge(l, rline, n * sizeof *m->routes) < 0) return -1;
    m->routes = calloc(n, sizeof *m->routes);
    if (!m->routes) return conf_fail(l, rline, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char rpath[330];
        snprintf(rpath, sizeof rpath, "%s.routes[%zu]", path, i);
        m->n_routes = i + 1;
        if (load_route(l, conf_node_at(l, items[i]), rpath, &m->routes[i], by_id, n_providers) < 0)
            return -1;
    }
    return load_model_tokenizer(l, v, path, m);
}

int conf_section_models(conf_loader_t *l, yaml_node_t *v, int line)
{
    if (conf_is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE)
        return conf_fail(l, line, "models must be a mapping of model names to {routes: [...]}");
    if (conf_check_keys(l, v, "in models", NULL) < 0) return -1;
    yaml_node_pair_t *pairs = v->data.mapping.pairs.start;
    size_t n = (size_t)(v->data.mapping.pairs.top - pairs);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    /* Providers sorted by id, so each route's provider is found by binary search. */
    const mg_provider_conf_t **by_id = NULL;
    if (c->n_providers) {
        by_id = malloc(c->n_providers * sizeof *by_id);
        if (!by_id) return conf_fail(l, line, "out of memory");
        for (size_t i = 0; i < c->n_providers; i++) by_id[i] = &c->providers[i];
        qsort(by_id, c->n_providers, sizeof *by_id, cmp_provider_ptr);
    }
    int rc = conf_charge(l, line, n * sizeof *c->models);
    if (rc == 0 && !(c->models = calloc(n, sizeof *c->models)))
        rc = conf_fail(l, line, "out of memory");
    for (size_t i = 0; rc == 0 && i < n; i++) {
        c->n_models = i + 1;
        rc = load_model(l, conf_node_at(l, pairs[i].key), conf_node_at(l, pairs[i].value),
                        &c->models[i], by_id, c->n_providers);
    }
    free(by_id);
    return rc;
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
    p->metrics_url = dup_or(tmpl->metrics_url, NULL);
    p->model_prefix = dup_or(tmpl->model_prefix, NULL);
    p->source = dup_or(tmpl->source, "db");
    p->name = dup_or(tmpl->name, NULL);
    p->forward = mg_provider_forward_default(p->base_url); /* stored providers do not say */
    cfg->n_providers++; /* counted now so mg_config_free releases a partly copied entry */
    if (!p->id || !p->adapter || !p->base_url || (tmpl->api_key && !p->api_key) || !p->pool ||
        (tmpl->engine && !p->engine) || (tmpl->metrics_url && !p->metrics_url) ||
        (tmpl->model_prefix && !p->model_prefix) || !p->source || (tmpl->name && !p->name))
        goto oom;
    return 0;
oom:
    snprintf(err, err_len, "out of memory");
    return -1;
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

const mg_model_conf_t *mg_config_model(const mg_config_t *cfg, const char *name)
{
    if (!cfg || !name) return NULL;
    for (size_t i = 0; i < cfg->n_models; i++)
        if (!strcmp(cfg->models[i].name, name)) return &cfg->models[i];
    return NULL;
}
