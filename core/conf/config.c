/* config: the YAML configuration file turned into a validated mg_config_t.
 *
 * libyaml's document API builds the node tree (each node keeps its start mark, so every
 * error can name the line). A small schema walker then visits the known sections in a
 * fixed order, expands ${NAME} references from the environment in scalar values, checks
 * types and ranges, and fills an mg_config_t that starts out holding every default.
 * This file is the walker, the defaults and the lifecycle; the section readers live by
 * subject beside it (conf/sections.h), and what they share is conf/loader.h.
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
#include "conf/sections.h"
#include "conf/cluster.h"
#include "store/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_HEADER_BYTES (16u * 1024u)
#define DEFAULT_STORAGE_PATH "data/moongate.db"
#define MAX_FILE_BYTES (4u * 1024u * 1024u)

/* usage: and prices: (conf/usage.c) */
static int load_usage_or_prices(conf_loader_t *l, yaml_node_t *v, int line, int prices)
{
    char why[320];
    return mg_conf_usage_section(l->doc, v, prices, l->cfg, &line, why, sizeof why)
               ? conf_fail(l, line, "%s", why)
               : 0;
}
static int load_usage(conf_loader_t *l, yaml_node_t *v, int line)
{
    return load_usage_or_prices(l, v, line, 0);
}
static int load_prices(conf_loader_t *l, yaml_node_t *v, int line)
{
    return load_usage_or_prices(l, v, line, 1);
}

typedef int (*section_fn)(conf_loader_t *l, yaml_node_t *v, int line);

/* Sections in load order: providers before models, whatever the file's order, because
 * routes refer to providers. */
static const struct {
    const char *key;
    section_fn load;
} sections[] = {
    {"server", conf_section_server},
    {"storage", conf_section_storage},
    {"tokenizer", conf_section_tokenizer},
    {"auth", conf_section_auth},
    {"lua", conf_section_lua},
    {"log", conf_section_log},
    {"upstream", conf_section_upstream},
    {"timeouts", conf_section_timeouts},
    {"routing", conf_section_routing},
    {"scheduler", conf_section_scheduler},
    {"tasks", conf_section_tasks},
    {"idempotency", conf_section_idempotency},
    {"circuit_breaker", conf_section_breaker},
    {"health", conf_section_health},
    {"providers", conf_section_providers},
    {"models", conf_section_models},
    {"applications", conf_section_applications},
    {"users", conf_section_users},
    {"dashboard", conf_section_dashboard},
    {"usage", load_usage},
    {"prices", load_prices},
    {"billing", conf_section_billing},
    {"context", conf_section_context},
    {"protocols", conf_section_protocols},
    {"cluster", mg_cluster_conf_load},
    {"observability", mg_observability_conf_load},
};

#define N_SECTIONS (sizeof sections / sizeof sections[0])

static int load_root(conf_loader_t *l, yaml_node_t *root)
{
    if (conf_is_null(root)) return 0;
    if (root->type != YAML_MAPPING_NODE)
        return conf_fail(l, conf_line_of(root), "the top level must be a mapping of sections");
    const char *keys[N_SECTIONS + 1];
    for (size_t i = 0; i < N_SECTIONS; i++) keys[i] = sections[i].key;
    keys[N_SECTIONS] = NULL;
    if (conf_check_keys(l, root, "at top level", keys) < 0) return -1;
    for (size_t i = 0; i < N_SECTIONS; i++) {
        yaml_node_pair_t *p = conf_find_pair(l, root, sections[i].key);
        if (p && sections[i].load(l, conf_node_at(l, p->value),
                                  conf_line_of(conf_node_at(l, p->key))) < 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ lifecycle */

static int sidecar_v1_provider(conf_loader_t *l);

static int set_defaults(conf_loader_t *l, const char *name)
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
    c->billing.webhook_tolerance_s = MG_BILLING_TOLERANCE_DEFAULT_S;
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
    mg_cluster_conf_defaults(&c->cluster);
    mg_observability_conf_defaults(&c->observability);
    c->idempotency_ttl_seconds = 600;
    c->idempotency_max_entries = 10000;
    c->storage_queue_max = MG_STORE_QUEUE_MAX_DEFAULT;
    c->storage_checkpoint_minutes = 60; /* the ADR: hourly wal_checkpoint(TRUNCATE) */
    c->storage_integrity_hours = 24;
    c->storage_journal_mib = 4;
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
        return conf_fail(l, 0, "out of memory");
    return 0;
}

/* Turns a libyaml failure into "NAME:LINE: YAML syntax error: ...". */
static int yaml_fail(conf_loader_t *l, const yaml_parser_t *p)
{
    if (p->error == YAML_MEMORY_ERROR) return conf_fail(l, 0, "out of memory");
    if (p->error == YAML_READER_ERROR) {
        /* Reader errors (bad encoding, control characters) carry a byte offset only. */
        int line = 1;
        for (size_t i = 0; i < p->problem_offset && i < l->input_len; i++)
            line += l->input[i] == '\n';
        return conf_fail(l, line, "YAML error: %s", p->problem ? p->problem : "unreadable input");
    }
    int line = (int)p->problem_mark.line + 1;
    if (p->context)
        return conf_fail(l, line, "YAML syntax error: %s (%s at line %d)",
                         p->problem ? p->problem : "invalid YAML", p->context,
                         (int)p->context_mark.line + 1);
    return conf_fail(l, line, "YAML syntax error: %s", p->problem ? p->problem : "invalid YAML");
}

int mg_config_parse(const char *name, const char *yaml, size_t len, mg_config_t **out, char *err,
                    size_t err_len)
{
    conf_loader_t l = {.name = name ? name : "(config)",
                       .input = yaml,
                       .input_len = len,
                       .err = err,
                       .err_len = err_len,
                       .budget = 8 * len + 64 * 1024};
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    l.cfg = calloc(1, sizeof *l.cfg);
    if (!l.cfg) return conf_fail(&l, 0, "out of memory");
    if (set_defaults(&l, l.name) < 0) {
        mg_config_free(l.cfg);
        return -1;
    }

    yaml_parser_t parser;
    yaml_document_t doc, extra;
    int rc = -1;
    if (!yaml_parser_initialize(&parser)) {
        mg_config_free(l.cfg);
        return conf_fail(&l, 0, "out of memory");
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
    if (second) conf_fail(&l, conf_line_of(second), "only one YAML document is allowed");
    yaml_document_delete(&extra);
    if (second) goto out_doc;

    l.doc = &doc;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    rc = root ? load_root(&l, root) : 0;
    if (rc == 0) rc = sidecar_v1_provider(&l);
    if (rc == 0) mg_cluster_conf_finish(&l.cfg->cluster, l.cfg->listen);
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
static int sidecar_v1_provider(conf_loader_t *l)
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
        if (!conf_valid_listen(listen))
            return conf_fail(l, 0, "SIDECAR_HOST/SIDECAR_PORT give an invalid address");
        free(c->listen);
        c->listen = conf_dup_str(l, 0, listen);
        if (!c->listen) return -1;
    }
    c->providers = calloc(1, sizeof(*c->providers));
    if (!c->providers) return conf_fail(l, 0, "out of memory");
    c->n_providers = 1;
    mg_provider_conf_t *p = &c->providers[0];
    const char *url = upstream && *upstream ? upstream : "https://integrate.api.nvidia.com/v1";
    p->id = conf_dup_str(l, 0, "env");
    p->adapter = conf_dup_str(l, 0, "openai");
    p->base_url = conf_dup_str(l, 0, url);
    p->pool = conf_dup_str(l, 0, "main");
    p->model_prefix = conf_dup_str(l, 0, "");
    p->source = conf_dup_str(l, 0, "env");
    p->api_key = key && *key ? conf_dup_str(l, 0, key) : NULL;
    p->weight = 1.0;
    const char *rpm = getenv("SIDECAR_RATE_RPM");
    p->rpm_limit = rpm && atoi(rpm) > 0 ? atoi(rpm) : 40;
    if (!p->id || !p->adapter || !p->base_url || !p->pool || !p->model_prefix || !p->source)
        return -1;
    size_t n = strlen(p->base_url);
    while (n > 8 && p->base_url[n - 1] == '/') p->base_url[--n] = '\0';
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return conf_fail(l, 0, "SIDECAR_UPSTREAM must start with http:// or https://");
    p->forward = mg_provider_forward_default(p->base_url);
    return 0;
}

/* Reads the whole file into a malloc'd buffer, refusing more than MAX_FILE_BYTES. */
static int read_file(conf_loader_t *l, FILE *f, char **out, size_t *out_len)
{
    size_t len = 0, cap = 0;
    char *buf = NULL;
    for (;;) {
        if (len == cap) {
            if (cap > MAX_FILE_BYTES) {
                free(buf);
                return conf_fail(l, 0, "file too large (more than %u bytes)", MAX_FILE_BYTES);
            }
            cap = cap ? cap * 2 : 16 * 1024;
            if (cap > MAX_FILE_BYTES + 1)
                cap = MAX_FILE_BYTES + 1; /* one byte more tells "too large" from "exact" */
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                return conf_fail(l, 0, "out of memory");
            }
            buf = p;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f)) {
                free(buf);
                return conf_fail(l, 0, "cannot read: %s", strerror(errno));
            }
            break;
        }
    }
    if (len > MAX_FILE_BYTES) {
        free(buf);
        return conf_fail(l, 0, "file too large (more than %u bytes)", MAX_FILE_BYTES);
    }
    *out = buf;
    *out_len = len;
    return 0;
}

int mg_config_load(const char *path, mg_config_t **out, char *err, size_t err_len)
{
    conf_loader_t l = {.name = path, .err = err, .err_len = err_len};
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return conf_fail(&l, 0, "cannot open: %s", strerror(errno));
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
        free(p->metrics_url);
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
    free(cfg->admin_listen);
    free(cfg->storage_path);
    free(cfg->storage_backup_dir);
    free(cfg->tokenizer_data_dir);
    mg_context_conf_clear(&cfg->context);
    mg_protocols_conf_clear(&cfg->protocols);
    mg_cluster_conf_clear(&cfg->cluster);
    mg_observability_conf_clear(&cfg->observability);
    free(cfg->policies_dir);
    free(cfg->adapters_dir);
    free(cfg->lua_dir);
    free(cfg->log_level);
    free(cfg->log_file);
    free(cfg);
}
