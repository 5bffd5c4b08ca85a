/* access: who may use it: applications (allowed models and priorities, caps) and the users
 * section's defaults, and the applications the admin API adds; see sections.h. */
#include "conf/sections.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* allowed_priorities: [P0, P1, ...] into a bit set. */
static int load_priorities(conf_loader_t *l, yaml_node_t *map, const char *path, unsigned *out)
{
    yaml_node_pair_t *pp = conf_find_pair(l, map, "allowed_priorities");
    if (!pp) return 0;
    yaml_node_t *v = conf_node_at(l, pp->value);
    int line = conf_line_of(v);
    if (v->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, line, "%s.allowed_priorities must be a list like [P0, P1]", path);
    *out = 0;
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top;
         it++) {
        yaml_node_t *e = conf_node_at(l, *it);
        const char *t = conf_is_scalar(e) ? conf_scalar_text(e) : "";
        if (strlen(t) != 2 || t[0] != 'P' || t[1] < '0' || t[1] > '4')
            return conf_fail(l, conf_line_of(e), "%s.allowed_priorities: '%s' is not one of P0..P4",
                             path, t);
        *out |= 1u << (t[1] - '0');
    }
    return 0;
}

/* allowed_models: [name, ...] — logical model names (checked against the models when a
 * request arrives: models may also come from the store). */
static int load_allowed_models(conf_loader_t *l, yaml_node_t *map, const char *path,
                               mg_app_conf_t *a)
{
    yaml_node_pair_t *pp = conf_find_pair(l, map, "allowed_models");
    if (!pp) return 0;
    yaml_node_t *v = conf_node_at(l, pp->value);
    if (v->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, conf_line_of(v), "%s.allowed_models must be a list of model names",
                         path);
    size_t n = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
    a->allowed_models = calloc(n ? n : 1, sizeof(*a->allowed_models));
    if (!a->allowed_models) return conf_fail(l, conf_line_of(v), "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *e = conf_node_at(l, v->data.sequence.items.start[i]);
        const char *t = conf_is_scalar(e) ? conf_scalar_text(e) : "";
        if (!conf_valid_name(t))
            return conf_fail(l, conf_line_of(e), "%s.allowed_models[%zu] is not a model name", path,
                             i);
        if (!(a->allowed_models[i] = conf_dup_str(l, conf_line_of(e), t))) return -1;
        a->n_allowed_models = i + 1;
    }
    return 0;
}

static int load_app(conf_loader_t *l, yaml_node_t *key, yaml_node_t *v, mg_app_conf_t *a)
{
    static const char *const keys[] = {
        "max_running_tasks", "max_queued_tasks", "allowed_priorities", "allowed_models",
        "data_policy",       "identity_notes",   "output_constraints", NULL};
    char path[300];
    a->line = conf_line_of(key);
    a->name = conf_dup_str(l, a->line, conf_scalar_text(key));
    if (!a->name) return -1;
    snprintf(path, sizeof path, "applications.%s", a->name);
    a->allowed_priorities = 0x1f;
    if (conf_is_null(v)) return 0;
    if (conf_want_map(l, v, a->line, path, keys) < 0 ||
        conf_opt_int_field(l, v, path, "max_running_tasks", 0, 1000000, &a->max_running_tasks) <
            0 ||
        conf_opt_int_field(l, v, path, "max_queued_tasks", 0, 1000000, &a->max_queued_tasks) < 0 ||
        load_priorities(l, v, path, &a->allowed_priorities) < 0 ||
        load_allowed_models(l, v, path, a) < 0 ||
        conf_opt_text(l, v, path, "identity_notes", &a->identity_notes) < 0 ||
        conf_opt_text(l, v, path, "output_constraints", &a->output_constraints) < 0)
        return -1;
    yaml_node_pair_t *dp = conf_find_pair(l, v, "data_policy");
    if (dp) {
        static const char *const dkeys[] = {"allow_cloud", "sensitive_level", NULL};
        char dpath[320];
        snprintf(dpath, sizeof dpath, "%s.data_policy", path);
        yaml_node_t *dv = conf_node_at(l, dp->value);
        if (conf_want_map(l, dv, conf_line_of(conf_node_at(l, dp->key)), dpath, dkeys) < 0 ||
            conf_opt_bool(l, dv, dpath, "allow_cloud", &a->allow_cloud) < 0)
            return -1;
        a->has_data_policy = true;
    }
    return 0;
}

int conf_section_applications(conf_loader_t *l, yaml_node_t *v, int line)
{
    if (conf_is_null(v)) return 0;
    if (v->type != YAML_MAPPING_NODE)
        return conf_fail(l, line,
                         "applications must be a mapping of application names to settings");
    if (conf_check_keys(l, v, "in applications", NULL) < 0) return -1;
    yaml_node_pair_t *pairs = v->data.mapping.pairs.start;
    size_t n = (size_t)(v->data.mapping.pairs.top - pairs);
    if (n == 0) return 0;
    mg_config_t *c = l->cfg;
    if (conf_charge(l, line, n * sizeof *c->apps) < 0) return -1;
    c->apps = calloc(n, sizeof *c->apps);
    if (!c->apps) return conf_fail(l, line, "out of memory");
    for (size_t i = 0; i < n; i++) {
        c->n_apps = i + 1;
        if (load_app(l, conf_node_at(l, pairs[i].key), conf_node_at(l, pairs[i].value),
                     &c->apps[i]) < 0)
            return -1;
    }
    return 0;
}

int conf_section_users(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"default_max_running_tasks", "default_max_queued_tasks",
                                       "default_requests_per_minute", NULL};
    int r = conf_want_map(l, v, line, "users", keys);
    if (r <= 0) return r;
    if (conf_opt_int_field(l, v, "users", "default_max_running_tasks", 0, 1000000,
                           &l->cfg->user_max_running_tasks) < 0 ||
        conf_opt_int_field(l, v, "users", "default_max_queued_tasks", 0, 1000000,
                           &l->cfg->user_max_queued_tasks) < 0 ||
        conf_opt_int_field(l, v, "users", "default_requests_per_minute", 0, 60000,
                           &l->cfg->user_rpm_limit) < 0)
        return -1;
    return 0;
}

void mg_app_conf_clear(mg_app_conf_t *app)
{
    for (size_t i = 0; i < app->n_allowed_models; i++) free(app->allowed_models[i]);
    free(app->allowed_models);
    free(app->identity_notes);
    free(app->output_constraints);
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

const mg_app_conf_t *mg_config_app(const mg_config_t *cfg, const char *name)
{
    for (size_t i = 0; name && i < cfg->n_apps; i++)
        if (strcmp(cfg->apps[i].name, name) == 0) return &cfg->apps[i];
    return NULL;
}
