/* serving: the sections about how requests are served: timeouts, routing, scheduler, tasks,
 * idempotency, circuit_breaker and health; see sections.h. */
#include "conf/sections.h"

#include <stdlib.h>

int conf_section_timeouts(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"connect_ms",        "first_byte_ms",  "idle_ms",
                                       "total_ms",          "header_read_ms", "keepalive_idle_ms",
                                       "drain_ms",          "queue_ms",       "max_queue_ms",
                                       "max_first_byte_ms", "max_total_ms",   NULL};
    int r = conf_want_map(l, v, line, "timeouts", keys);
    if (r <= 0) return r;
    mg_timeouts_conf_t *t = &l->cfg->timeouts;
    int *dst[] = {&t->connect_ms,     &t->first_byte_ms,     &t->idle_ms,     &t->total_ms,
                  &t->header_read_ms, &t->keepalive_idle_ms, &t->drain_ms,    &t->queue_ms,
                  &t->max_queue_ms,   &t->max_first_byte_ms, &t->max_total_ms};
    for (size_t i = 0; keys[i]; i++) /* the max_* keys last: 0 means "the limit itself" */
        if (conf_opt_int_field(l, v, "timeouts", keys[i], strncmp(keys[i], "max_", 4) == 0 ? 0 : 1,
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
            conf_field_t f;
            conf_field_get(l, v, "timeouts", caps[i].key, &f);
            return conf_fail(l, f.line, "timeouts.%s must be at least the limit it raises (%d)",
                             caps[i].key, caps[i].base);
        }
    }
    return 0;
}

int conf_section_routing(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"local_first",         "queue_timeout_ms",
                                       "emergency_rpm_ratio", "allow_smaller_model",
                                       "panic_threshold",     NULL};
    int r = conf_want_map(l, v, line, "routing", keys);
    if (r <= 0) return r;
    mg_routing_conf_t *rc = &l->cfg->routing;
    if (conf_opt_bool(l, v, "routing", "local_first", &rc->local_first) < 0 ||
        conf_opt_int_field(l, v, "routing", "queue_timeout_ms", 1, MAX_TIMEOUT_MS,
                           &rc->queue_timeout_ms) < 0 ||
        conf_opt_positive(l, v, "routing", "emergency_rpm_ratio", 1.0, &rc->emergency_rpm_ratio) <
            0 ||
        conf_opt_bool(l, v, "routing", "allow_smaller_model", &rc->allow_smaller_model) < 0 ||
        conf_opt_number(l, v, "routing", "panic_threshold", true, 1.0, &rc->panic_threshold) < 0)
        return -1;
    return 0;
}

int conf_section_scheduler(conf_loader_t *l, yaml_node_t *v, int line)
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
    int r = conf_want_map(l, v, line, path, keys);
    if (r <= 0) return r;
    mg_scheduler_conf_t *sc = &l->cfg->scheduler;
    if (conf_opt_int_field(l, v, path, "max_running_tasks", 1, 1000000, &sc->max_running_tasks) <
            0 ||
        conf_opt_int_field(l, v, path, "max_queued_tasks", 0, 10000000, &sc->max_queued_tasks) <
            0 ||
        conf_opt_int_field(l, v, path, "priority_aging_seconds", 0, 86400,
                           &sc->priority_aging_seconds) < 0 ||
        conf_opt_int_field(l, v, path, "reserved_realtime_slots", 0, 1000000,
                           &sc->reserved_realtime_slots) < 0 ||
        conf_opt_int_field(l, v, path, "overflow_status", 429, 503, &sc->overflow_status) < 0 ||
        conf_opt_int(l, v, path, "vram_bytes", 0, (long long)1 << 50, &sc->vram_bytes) < 0 ||
        conf_opt_positive(l, v, path, "safety_margin_ratio", 0.99, &sc->safety_margin_ratio) < 0 ||
        conf_opt_int_field(l, v, path, "min_output_tokens", 0, 1000000, &sc->min_output_tokens) < 0)
        return -1;
    if (sc->overflow_status != 429 && sc->overflow_status != 503) {
        conf_field_t f;
        conf_field_get(l, v, path, "overflow_status", &f);
        return conf_fail(l, f.line, "scheduler.overflow_status must be 429 or 503");
    }
    yaml_node_pair_t *wp = conf_find_pair(l, v, "priority_weights");
    if (wp) {
        yaml_node_t *wv = conf_node_at(l, wp->value);
        int wl = conf_line_of(wv);
        if (wv->type != YAML_SEQUENCE_NODE ||
            wv->data.sequence.items.top - wv->data.sequence.items.start != 5)
            return conf_fail(l, wl,
                             "scheduler.priority_weights must be a list of 5 integers (P0..P4)");
        for (int i = 0; i < 5; i++) {
            yaml_node_t *e = conf_node_at(l, wv->data.sequence.items.start[i]);
            const char *t = conf_is_scalar(e) ? conf_scalar_text(e) : "";
            char *end;
            long w = strtol(t, &end, 10);
            if (!*t || *end || w < 1 || w > 1000000)
                return conf_fail(l, conf_line_of(e),
                                 "scheduler.priority_weights[%d] must be 1 .. 1000000", i);
            sc->weights[i] = (int)w;
        }
    }
    if (sc->reserved_realtime_slots >= sc->max_running_tasks)
        return conf_fail(l, line,
                         "scheduler.reserved_realtime_slots must be below max_running_tasks");
    yaml_node_pair_t *bp = conf_find_pair(l, v, "backpressure");
    if (bp) {
        static const char *const bkeys[] = {"level1_threshold", "level2_threshold",
                                            "level3_threshold", NULL};
        yaml_node_t *bv = conf_node_at(l, bp->value);
        const char *bpath = "scheduler.backpressure";
        int br = conf_want_map(l, bv, conf_line_of(conf_node_at(l, bp->key)), bpath, bkeys);
        if (br < 0) return -1;
        for (int i = 0; br > 0 && i < 3; i++)
            if (conf_opt_positive(l, bv, bpath, bkeys[i], 1.0, &sc->level_threshold[i]) < 0)
                return -1;
    }
    return 0;
}

int conf_section_tasks(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"retention_seconds", NULL};
    int r = conf_want_map(l, v, line, "tasks", keys);
    if (r <= 0) return r;
    return conf_opt_int_field(l, v, "tasks", "retention_seconds", 60, 365 * 86400,
                              &l->cfg->tasks_retention_seconds);
}

int conf_section_idempotency(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"ttl_seconds", "max_entries", NULL};
    int r = conf_want_map(l, v, line, "idempotency", keys);
    if (r <= 0) return r;
    return conf_opt_int_field(l, v, "idempotency", "ttl_seconds", 1, 30 * 86400,
                              &l->cfg->idempotency_ttl_seconds) < 0 ||
                   conf_opt_int_field(l, v, "idempotency", "max_entries", 1, 10000000,
                                      &l->cfg->idempotency_max_entries) < 0
               ? -1
               : 0;
}

int conf_section_breaker(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"consecutive_failures",
                                       "error_rate_threshold",
                                       "min_requests",
                                       "window_seconds",
                                       "open_duration_seconds",
                                       "half_open_max_requests",
                                       NULL};
    const char *path = "circuit_breaker";
    int r = conf_want_map(l, v, line, path, keys);
    if (r <= 0) return r;
    mg_breaker_conf_t *b = &l->cfg->breaker;
    if (conf_opt_int_field(l, v, path, "consecutive_failures", 1, 1000, &b->consecutive_failures) <
            0 ||
        conf_opt_positive(l, v, path, "error_rate_threshold", 1.0, &b->error_rate_threshold) < 0 ||
        conf_opt_int_field(l, v, path, "min_requests", 1, 1000000, &b->min_requests) < 0 ||
        conf_opt_int_field(l, v, path, "window_seconds", 1, 86400, &b->window_seconds) < 0 ||
        conf_opt_int_field(l, v, path, "open_duration_seconds", 1, 86400,
                           &b->open_duration_seconds) < 0 ||
        conf_opt_int_field(l, v, path, "half_open_max_requests", 1, 1000,
                           &b->half_open_max_requests) < 0)
        return -1;
    return 0;
}

int conf_section_health(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"probes",           "probe_interval_ms", "probe_timeout_ms",
                                       "load_interval_ms", "retry_down_ms",     NULL};
    int r = conf_want_map(l, v, line, "health", keys);
    if (r <= 0) return r;
    mg_health_conf_t *h = &l->cfg->health;
    if (conf_opt_bool(l, v, "health", "probes", &h->probes) < 0 ||
        conf_opt_int_field(l, v, "health", "probe_interval_ms", 100, MAX_TIMEOUT_MS,
                           &h->probe_interval_ms) < 0 ||
        conf_opt_int_field(l, v, "health", "probe_timeout_ms", 1, MAX_TIMEOUT_MS,
                           &h->probe_timeout_ms) < 0 ||
        conf_opt_int_field(l, v, "health", "load_interval_ms", 100, MAX_TIMEOUT_MS,
                           &h->load_interval_ms) < 0 ||
        conf_opt_int_field(l, v, "health", "retry_down_ms", 0, MAX_TIMEOUT_MS, &h->retry_down_ms) <
            0)
        return -1;
    return 0;
}
