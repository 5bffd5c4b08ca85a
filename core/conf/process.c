/* process: the sections about the process itself: server (listeners, connection limits, CORS, the
 * dashboard switch), storage (path, upkeep, backups), tokenizer, auth, lua, log and upstream; see
 * sections.h. */
#include "conf/sections.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The client connection limits: read deadlines, write timeout, connection cap. */
static int load_server_conns(conf_loader_t *l, yaml_node_t *v)
{
    mg_config_t *c = l->cfg;
    return conf_opt_int_field(l, v, "server", "request_read_ms", 1, MAX_TIMEOUT_MS,
                              &c->request_read_ms) < 0 ||
                   conf_opt_int_field(l, v, "server", "min_body_bytes_per_s", 0, 1 << 30,
                                      &c->min_body_bytes_per_s) < 0 ||
                   conf_opt_int_field(l, v, "server", "write_timeout_ms", 0, MAX_TIMEOUT_MS,
                                      &c->write_timeout_ms) < 0 ||
                   conf_opt_int_field(l, v, "server", "max_connections", 0, 10000000,
                                      &c->max_connections) < 0 ||
                   conf_opt_int_field(l, v, "server", "reserved_connections", 0, 10000,
                                      &c->reserved_connections) < 0
               ? -1
               : 0;
}

/* An origin as browsers send it: scheme://host[:port], no path; or "*". */
static bool valid_origin(const char *s)
{
    if (!strcmp(s, "*")) return true;
    const char *h = !strncmp(s, "http://", 7) ? s + 7 : !strncmp(s, "https://", 8) ? s + 8 : NULL;
    return h && *h && conf_all_chars(h, ".-:[]");
}

static int load_cors(conf_loader_t *l, yaml_node_t *map)
{
    static const char *const keys[] = {"allowed_origins", "allow_credentials", "max_age_s", NULL};
    yaml_node_pair_t *cp = conf_find_pair(l, map, "cors");
    if (!cp) return 0;
    yaml_node_t *v = conf_node_at(l, cp->value);
    const char *path = "server.cors";
    if (conf_want_map(l, v, conf_line_of(v), path, keys) < 0) return -1;
    mg_cors_conf_t *c = &l->cfg->cors;
    if (conf_opt_bool(l, v, path, "allow_credentials", &c->allow_credentials) < 0 ||
        conf_opt_int_field(l, v, path, "max_age_s", 0, 86400, &c->max_age_s) < 0)
        return -1;
    yaml_node_pair_t *op = conf_find_pair(l, v, "allowed_origins");
    if (!op) return 0;
    yaml_node_t *ov = conf_node_at(l, op->value);
    if (ov->type != YAML_SEQUENCE_NODE)
        return conf_fail(l, conf_line_of(ov), "%s.allowed_origins must be a list of origins", path);
    size_t n = (size_t)(ov->data.sequence.items.top - ov->data.sequence.items.start);
    c->origins = calloc(n ? n : 1, sizeof(*c->origins));
    if (!c->origins) return conf_fail(l, conf_line_of(ov), "out of memory");
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *e = conf_node_at(l, ov->data.sequence.items.start[i]);
        if (!conf_is_scalar(e) || !valid_origin(conf_scalar_text(e)))
            return conf_fail(l, conf_line_of(e),
                             "%s.allowed_origins[%zu] must be an origin "
                             "(scheme://host[:port]) or \"*\"",
                             path, i);
        if (!strcmp(conf_scalar_text(e), "*") && c->allow_credentials)
            return conf_fail(l, conf_line_of(e), "%s: \"*\" cannot go with allow_credentials",
                             path);
        if (!(c->origins[c->n_origins++] = conf_dup_str(l, conf_line_of(e), conf_scalar_text(e))))
            return -1;
    }
    return 0;
}

/* server.admin_listen: the admin API and the dashboard on a listener of their own (then not
 * on server.listen); null or "" keeps them on server.listen. */
static int load_admin_listen(conf_loader_t *l, yaml_node_t *v)
{
    mg_config_t *c = l->cfg;
    conf_field_t f;
    conf_field_get(l, v, "server", "admin_listen", &f);
    if (!f.val || conf_is_null(f.val)) return 0;
    char *s = NULL, buf[72];
    if (conf_field_string(l, &f, &s) < 0) return -1;
    free(c->admin_listen);
    c->admin_listen = *s ? s : NULL;
    if (!*s) free(s);
    if (!c->admin_listen) return 0;
    if (!conf_valid_listen(c->admin_listen))
        return conf_fail(l, f.line,
                         "server.admin_listen: invalid address '%s' (expected host:port, port "
                         "0-65535, IPv6 as [addr]:port)",
                         conf_shown(c->admin_listen, buf, sizeof buf));
    if (conf_listen_port(c->admin_listen) != 0 &&
        (!strcmp(c->admin_listen, c->listen) ||
         (c->metrics_listen && !strcmp(c->admin_listen, c->metrics_listen))))
        return conf_fail(
            l, f.line,
            "server.admin_listen must differ from server.listen and server.metrics_listen");
    return 0;
}

int conf_section_server(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"listen",
                                       "metrics_listen",
                                       "admin_listen",
                                       "max_body_bytes",
                                       "max_header_bytes",
                                       "request_read_ms",
                                       "min_body_bytes_per_s",
                                       "write_timeout_ms",
                                       "max_connections",
                                       "reserved_connections",
                                       "cors",
                                       NULL};
    int r = conf_want_map(l, v, line, "server", keys);
    if (r <= 0) return r;
    mg_config_t *c = l->cfg;
    if (load_cors(l, v) < 0 || conf_opt_string(l, v, "server", "listen", &c->listen) < 0) return -1;
    conf_field_t f;
    conf_field_get(l, v, "server", "listen", &f);
    char buf[72];
    if (!conf_valid_listen(c->listen))
        return conf_fail(
            l, f.line,
            "server.listen: invalid address '%s' (expected host:port, port 0-65535, IPv6 "
            "as [addr]:port)",
            conf_shown(c->listen, buf, sizeof buf));

    conf_field_get(l, v, "server", "metrics_listen", &f);
    if (f.val && conf_is_null(f.val)) {
        free(c->metrics_listen); /* explicit null: no metrics listener */
        c->metrics_listen = NULL;
    } else if (f.val) {
        char *s = NULL;
        if (conf_field_string(l, &f, &s) < 0) return -1;
        free(c->metrics_listen);
        c->metrics_listen = *s ? s : NULL; /* "" also disables it */
        if (!*s) free(s);
        if (c->metrics_listen && !conf_valid_listen(c->metrics_listen))
            return conf_fail(
                l, f.line,
                "server.metrics_listen: invalid address '%s' (expected host:port, port "
                "0-65535, IPv6 as [addr]:port)",
                conf_shown(c->metrics_listen, buf, sizeof buf));
        if (c->metrics_listen && conf_listen_port(c->metrics_listen) != 0 &&
            !strcmp(c->metrics_listen, c->listen))
            return conf_fail(l, f.line, "server.metrics_listen must differ from server.listen");
    }

    if (load_admin_listen(l, v) < 0) return -1;

    long long n = (long long)c->max_body_bytes;
    if (conf_opt_int(l, v, "server", "max_body_bytes", KIB, GIB, &n) < 0) return -1;
    c->max_body_bytes = (size_t)n;
    n = (long long)c->max_header_bytes;
    if (conf_opt_int(l, v, "server", "max_header_bytes", KIB, MIB, &n) < 0) return -1;
    c->max_header_bytes = (size_t)n;
    return load_server_conns(l, v);
}

static int load_backup(conf_loader_t *l, yaml_node_t *map)
{
    static const char *const keys[] = {"dir", "every_hours", "keep_days", NULL};
    yaml_node_pair_t *bp = conf_find_pair(l, map, "backup");
    if (!bp) return 0;
    yaml_node_t *v = conf_node_at(l, bp->value);
    const char *path = "storage.backup";
    mg_config_t *c = l->cfg;
    if (conf_want_map(l, v, conf_line_of(v), path, keys) < 0 ||
        conf_req_string(l, v, path, "dir", &c->storage_backup_dir) < 0 ||
        conf_opt_int_field(l, v, path, "every_hours", 1, 8760, &c->storage_backup_every_hours) <
            0 ||
        conf_opt_int_field(l, v, path, "keep_days", 1, 3650, &c->storage_backup_keep_days) < 0)
        return -1;
    return 0;
}

int conf_section_storage(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {
        "path",   "queue_max",         "synchronous", "checkpoint_minutes", "integrity_check_hours",
        "backup", "usage_journal_mib", NULL};
    int r = conf_want_map(l, v, line, "storage", keys);
    if (r <= 0) return r;
    char *sync = NULL;
    mg_config_t *c = l->cfg;
    if (conf_opt_string(l, v, "storage", "path", &c->storage_path) < 0 ||
        conf_opt_int_field(l, v, "storage", "queue_max", 1, 1000000, &c->storage_queue_max) < 0 ||
        conf_opt_int_field(l, v, "storage", "checkpoint_minutes", 0, 10080,
                           &c->storage_checkpoint_minutes) < 0 ||
        conf_opt_int_field(l, v, "storage", "integrity_check_hours", 0, 8760,
                           &c->storage_integrity_hours) < 0 ||
        conf_opt_int_field(l, v, "storage", "usage_journal_mib", 1, 1024, &c->storage_journal_mib) <
            0 ||
        load_backup(l, v) < 0 || conf_opt_string(l, v, "storage", "synchronous", &sync) < 0)
        return -1;
    if (!sync) return 0;
    int full = !strcasecmp(sync, "full"), normal = !strcasecmp(sync, "normal");
    if (!full && !normal) {
        conf_field_t f;
        char buf[72];
        conf_field_get(l, v, "storage", "synchronous", &f);
        r = conf_fail(l, f.line, "storage.synchronous must be normal or full (got '%s')",
                      conf_shown(sync, buf, sizeof buf));
        free(sync);
        return r;
    }
    free(sync);
    l->cfg->storage_synchronous_full = full;
    return 0;
}

int conf_section_tokenizer(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"data_dir", NULL};
    int r = conf_want_map(l, v, line, "tokenizer", keys);
    return r <= 0 ? r : conf_opt_string(l, v, "tokenizer", "data_dir", &l->cfg->tokenizer_data_dir);
}

int conf_section_auth(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"enabled", "default_application", NULL};
    int r = conf_want_map(l, v, line, "auth", keys);
    if (r <= 0) return r;
    return conf_opt_bool(l, v, "auth", "enabled", &l->cfg->auth_enabled) < 0 ||
                   conf_opt_string(l, v, "auth", "default_application",
                                   &l->cfg->default_application) < 0
               ? -1
               : 0;
}

int conf_section_lua(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"policies", "adapters", "lib", NULL};
    int r = conf_want_map(l, v, line, "lua", keys);
    if (r <= 0) return r;
    mg_config_t *c = l->cfg;
    if (conf_opt_string(l, v, "lua", "policies", &c->policies_dir) < 0 ||
        conf_opt_string(l, v, "lua", "adapters", &c->adapters_dir) < 0)
        return -1;
    return conf_opt_string(l, v, "lua", "lib", &c->lua_dir);
}

int conf_section_log(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"level", "task_events", "format", "file", NULL};
    int r = conf_want_map(l, v, line, "log", keys);
    if (r <= 0) return r;
    char *format = NULL;
    if (conf_opt_string(l, v, "log", "level", &l->cfg->log_level) < 0 ||
        conf_opt_bool(l, v, "log", "task_events", &l->cfg->task_events) < 0 ||
        conf_opt_string(l, v, "log", "file", &l->cfg->log_file) < 0 ||
        conf_opt_string(l, v, "log", "format", &format) < 0)
        return -1;
    l->cfg->log_text = format && strcmp(format, "text") == 0;
    int format_ok = !format || l->cfg->log_text || strcmp(format, "json") == 0;
    free(format);
    if (!format_ok) return conf_fail(l, line, "log.format must be json or text");
    const char *lv = l->cfg->log_level;
    if (strcmp(lv, "debug") && strcmp(lv, "info") && strcmp(lv, "warn") && strcmp(lv, "error")) {
        conf_field_t f;
        char buf[72];
        conf_field_get(l, v, "log", "level", &f);
        return conf_fail(l, f.line, "log.level must be one of debug, info, warn, error (got '%s')",
                         conf_shown(lv, buf, sizeof buf));
    }
    return 0;
}

int conf_section_upstream(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"max_retries", NULL};
    int r = conf_want_map(l, v, line, "upstream", keys);
    if (r <= 0) return r;
    return conf_opt_int_field(l, v, "upstream", "max_retries", 1, 10, &l->cfg->max_retries);
}
