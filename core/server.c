/* server: process lifecycle: start-up, SIGHUP reloads, graceful stop; see server.h.
 *
 * Reload: the new generation is built on a libuv worker thread (it reads files
 * and runs Lua, neither of which may happen on the loop thread), then swapped in
 * on the loop thread. Requests keep the generation they started with. */
#include "server.h"

#include "conf/apps.h"
#include "conf/models.h"
#include "conf/providers.h"
#include "conf/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "base/crypto.h"
#include "base/log.h"
#include "conf/providers.h"
#include "pipeline/proxy.h"
#include "pipeline/idem.h"
#include "pipeline/tasks.h"
#include "tenancy/userrate.h"

static mg_http_limits_t limits_of(const mg_config_t *cfg)
{
    mg_http_limits_t lim = {
        .max_body_bytes = cfg->max_body_bytes,
        .max_header_bytes = cfg->max_header_bytes,
        .header_read_ms = cfg->timeouts.header_read_ms,
        .keepalive_idle_ms = cfg->timeouts.keepalive_idle_ms,
    };
    return lim;
}

/* ------------------------------------------------------------------------ */
/* Scheduler                                                                 */
/* ------------------------------------------------------------------------ */

static void sched_config_of(const mg_config_t *cfg, mg_sched_config_t *sc)
{
    mg_sched_config_defaults(sc);
    sc->max_running = (uint32_t)cfg->scheduler.max_running_tasks;
    sc->max_queued = (uint32_t)cfg->scheduler.max_queued_tasks;
    sc->aging_ms = (uint64_t)cfg->scheduler.priority_aging_seconds * 1000;
    sc->reserved_realtime_slots = (uint32_t)cfg->scheduler.reserved_realtime_slots;
    for (int i = 0; i < 3; i++) sc->level_threshold[i] = cfg->scheduler.level_threshold[i];
    sc->vram_bytes = (uint64_t)cfg->scheduler.vram_bytes;
    for (int i = 0; i < MG_PRIO_COUNT; i++) sc->weight[i] = (uint32_t)cfg->scheduler.weights[i];
    sc->safety_margin_ratio = cfg->scheduler.safety_margin_ratio;
    sc->user_max_running = 0; /* no users without tenancy */
}

mg_sched_gate_t *mg_server_smaller_gate(mg_server_t *s, const mg_route_conf_t *r)
{
    if (!r->smaller || (!r->weight_bytes && !r->kv_cache_per_token_bytes)) return NULL;
    char name[300];
    snprintf(name, sizeof(name), "smaller:%s", r->model);
    return mg_sched_gate(s->sched, MG_GATE_MODEL, name);
}

/* Memory figures of a model gate; weights count as loaded (resident). */
static void sched_apply_memory(mg_server_t *s, mg_sched_gate_t *g, const char *name,
                               long long weight_bytes, long long kv_per_token_bytes)
{
    mg_sched_model_memory(s->sched, g, (uint64_t)weight_bytes, (uint64_t)kv_per_token_bytes);
    if (weight_bytes > 0 && mg_sched_model_load(s->sched, g, 1) != 0)
        mg_log_msg(MG_LOG_WARN, NULL,
                   "model %s: its weights (%lld bytes) do not fit scheduler.vram_bytes", name,
                   weight_bytes);
}

/* Per-model concurrency limits and memory figures from the config, and those of smaller
 * routes (memory admission's smaller-model step). A model with weight_bytes counts as
 * loaded (resident); its tasks reserve KV cache while they run. */
static void sched_apply_models(mg_server_t *s, const mg_config_t *cfg)
{
    for (size_t i = 0; i < cfg->n_models; i++) {
        const mg_model_conf_t *m = &cfg->models[i];
        mg_sched_gate_t *g = mg_sched_gate(s->sched, MG_GATE_MODEL, m->name);
        if (!g) continue;
        mg_sched_gate_limits(s->sched, g, (uint32_t)m->max_concurrency, 0);
        sched_apply_memory(s, g, m->name, m->weight_bytes, m->kv_cache_per_token_bytes);
        for (size_t j = 0; j < m->n_routes; j++) {
            const mg_route_conf_t *r = &m->routes[j];
            mg_sched_gate_t *rg = mg_server_smaller_gate(s, r);
            if (rg) sched_apply_memory(s, rg, r->model, r->weight_bytes, r->kv_cache_per_token_bytes);
        }
    }
}

static void on_sched_timer(uv_timer_t *t)
{
    mg_server_sched_run(t->data);
}

void mg_server_sched_run(mg_server_t *s)
{
    uint64_t now = uv_now(s->loop);
    mg_sched_entry_t *e;
    while ((e = mg_sched_expire(s->sched, now))) mg_proxy_queue_timeout(e->data);
    while (!s->stopping_hard && (e = mg_sched_dispatch(s->sched, now))) mg_proxy_dispatched(e->data);
    uint64_t deadline;
    if (mg_sched_next_deadline(s->sched, &deadline) == 0 && deadline > 0)
        uv_timer_start(&s->sched_timer, on_sched_timer, deadline > now ? deadline - now : 0, 0);
    else
        uv_timer_stop(&s->sched_timer);
}

void mg_server_sched_kick(mg_server_t *s)
{
    /* a freed slot matters only to a task that waits for one: most releases find none */
    if (mg_sched_queued(s->sched) == 0) return;
    uv_timer_start(&s->sched_timer, on_sched_timer, 0, 0);
}

mg_gen_t *mg_server_gen_acquire(mg_server_t *s)
{
    mg_gen_ref(s->gen);
    return s->gen;
}

static void apply_log_level(const mg_config_t *cfg)
{
    mg_log_level_t lv;
    if (mg_log_level_parse(cfg->log_level, &lv) == 0) mg_log_set_level(lv);
}

/* ------------------------------------------------------------------------ */
/* Reload                                                                    */
/* ------------------------------------------------------------------------ */

/* A generation from the config file plus the providers stored through the admin API.
 * Blocking (disk, decryption): a worker thread, or start-up before the loop runs. */
static int add_stored_providers(mg_config_t *cfg, const mg_provider_list_t *list, char *err,
                                size_t errlen)
{
    for (size_t i = 0; i < list->n; i++) {
        if (mg_config_provider(cfg, list->items[i].id)) {
            mg_log_msg(MG_LOG_WARN, NULL, "stored provider %s not served: the config file uses "
                       "the same id", list->items[i].id);
            continue;
        }
        if (mg_config_add_provider(cfg, &list->items[i], err, errlen) != 0) return -1;
    }
    return 0;
}

typedef struct build_s {
    mg_store_t *store;
    mg_provider_list_t providers; /* read and decrypted before the build */
} build_t;

/* What the store adds to the file's config: providers, models and applications added
 * through the admin API (in that order: stored models may route to stored providers), then
 * the runtime settings (PUT /api/v2/config) over the file's values. */
static int extend_from_store(mg_config_t *cfg, void *ud, char *err, size_t errlen)
{
    build_t *b = ud;
    return add_stored_providers(cfg, &b->providers, err, errlen) != 0 ||
                   mg_models_load(b->store, cfg, err, errlen) != 0 ||
                   mg_apps_load(b->store, cfg, err, errlen) != 0 ||
                   mg_settings_overlay(b->store, cfg, err, errlen) != 0
               ? -1
               : 0;
}

static int build_gen(mg_server_t *s, mg_gen_t **out, char *err, size_t errlen)
{
    build_t b = {s->store, {0}};
    *out = NULL;
    if (!s->store) return mg_gen_load(s->config_path, s->next_gen_id, out, err, errlen);
    if (mg_providers_load(s->store, &b.providers, err, errlen) != 0) return -1;
    int rc = mg_gen_load_with(s->config_path, extend_from_store, &b, s->next_gen_id, out, err,
                              errlen);
    mg_provider_list_free(&b.providers);
    return rc;
}

static void reload_work(uv_work_t *w)
{
    mg_server_t *s = w->data;
    s->reload_gen = NULL;
    build_gen(s, &s->reload_gen, s->reload_err_buf, sizeof(s->reload_err_buf));
}

/* Someone waiting for a rebuild (mg_server_rebuild). */
typedef struct waiter_s {
    struct waiter_s *next;
    mg_rebuild_fn fn;
    void *ud;
} waiter_t;

/* Tell the waiters of the reload that just ended how it went. */
static void notify_waiters(mg_server_t *s, int ok)
{
    waiter_t *w = s->waiters_current;
    s->waiters_current = NULL;
    while (w) {
        waiter_t *next = w->next;
        w->fn(w->ud, ok, ok ? "" : s->reload_error);
        free(w);
        w = next;
    }
}

/* Start the next reload when someone asked for one while the last one ran. */
static void reload_next(mg_server_t *s)
{
    if (!s->waiters_next) return;
    if (s->stopping) {
        s->waiters_current = s->waiters_next;
        s->waiters_next = NULL;
        snprintf(s->reload_error, sizeof(s->reload_error), "the gateway is stopping");
        notify_waiters(s, 0);
        return;
    }
    mg_server_reload(s);
}

static void reload_done(uv_work_t *w, int status)
{
    mg_server_t *s = w->data;
    s->reloading = 0;
    s->reload_at = (int64_t)time(NULL);
    mg_gen_t *g = s->reload_gen;
    s->reload_gen = NULL;
    if (g && s->stopping) {
        mg_gen_unref(g);
        snprintf(s->reload_error, sizeof(s->reload_error), "the gateway is stopping");
        notify_waiters(s, 0);
        reload_next(s);
        return;
    }
    if (g && mg_pool_sync(&s->pool, g->cfg) != 0) {
        mg_gen_unref(g);
        g = NULL;
        snprintf(s->reload_err_buf, sizeof(s->reload_err_buf), "out of memory");
    }
    mg_logline_t l;
    if (!g) {
        s->metrics.reloads_failed++;
        snprintf(s->reload_result, sizeof(s->reload_result), "failed");
        snprintf(s->reload_error, sizeof(s->reload_error), "%s", s->reload_err_buf);
        mg_log_begin(&l, MG_LOG_ERROR, "reload");
        mg_log_str(&l, "result", "failed");
        mg_log_str(&l, "error", s->reload_error);
        mg_log_int(&l, "generation", s->gen->id);
        mg_log_end(&l);
        notify_waiters(s, 0);
        reload_next(s);
        return;
    }
    s->next_gen_id++;
    mg_gen_t *old = s->gen;
    s->gen = g;
    mg_sched_config_t sc;
    sched_config_of(g->cfg, &sc);
    if (mg_sched_reconfigure(s->sched, &sc) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "scheduler settings rejected; keeping the previous ones");
    sched_apply_models(s, g->cfg);
    mg_gen_unref(old); /* freed now, or when its last request ends */
    apply_log_level(g->cfg);
    s->metrics.reloads_ok++;
    snprintf(s->reload_result, sizeof(s->reload_result), "ok");
    s->reload_error[0] = '\0';
    /* listen addresses change only with a restart; the log line says which one is in force */
    mg_log_begin(&l, MG_LOG_INFO, "reload");
    mg_log_str(&l, "result", "ok");
    mg_log_int(&l, "generation", g->id);
    mg_log_int(&l, "providers", (int64_t)g->cfg->n_providers);
    mg_log_int(&l, "models", (int64_t)g->cfg->n_models);
    mg_log_str(&l, "listen", s->api.bound);
    mg_log_end(&l);
    notify_waiters(s, 1);
    reload_next(s);
}

void mg_server_reload(mg_server_t *s)
{
    if (s->reloading || s->stopping) {
        mg_log_msg(MG_LOG_WARN, NULL, "reload already in progress; signal ignored");
        return;
    }
    /* whoever waits now is served by this build: it reads the store after their commit */
    s->waiters_current = s->waiters_next;
    s->waiters_next = NULL;
    s->reloading = 1;
    s->reload_work.data = s;
    if (uv_queue_work(s->loop, &s->reload_work, reload_work, reload_done) != 0) {
        s->reloading = 0;
        mg_log_msg(MG_LOG_ERROR, NULL, "cannot start the reload");
        snprintf(s->reload_error, sizeof(s->reload_error), "cannot start the reload");
        notify_waiters(s, 0);
    }
}

void mg_server_rebuild(mg_server_t *s, mg_rebuild_fn fn, void *ud)
{
    waiter_t *w = calloc(1, sizeof(*w));
    if (!w) {
        fn(ud, 0, "out of memory");
        return;
    }
    w->fn = fn;
    w->ud = ud;
    waiter_t **tail = &s->waiters_next;
    while (*tail) tail = &(*tail)->next;
    *tail = w;
    if (s->stopping) {
        reload_next(s);
        return;
    }
    if (!s->reloading) mg_server_reload(s); /* else reload_done starts the next one */
}

/* ------------------------------------------------------------------------ */
/* Stop                                                                      */
/* ------------------------------------------------------------------------ */

static void close_everything(mg_server_t *s)
{
    s->stopping_hard = 1;
    uv_timer_stop(&s->drain_timer);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
    uv_timer_stop(&s->sched_timer);
    uv_close((uv_handle_t *)&s->sched_timer, NULL);
    mg_listener_close(&s->api);
    if (s->metrics_on) mg_listener_close(&s->metrics_l);
    mg_probe_stop(s->prober);
    s->prober = NULL;
    mg_loopstat_stop(&s->loopstat);
    uv_prepare_stop(&s->gc_prepare);
    uv_close((uv_handle_t *)&s->gc_prepare, NULL);
    mg_upstream_close(s->upstream);
    s->upstream = NULL;
    uv_signal_stop(&s->sig_hup);
    uv_signal_stop(&s->sig_term);
    uv_signal_stop(&s->sig_int);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
}

static void on_drain_tick(uv_timer_t *t)
{
    mg_server_t *s = t->data;
    uint64_t waited = uv_now(s->loop) - s->drain_started;
    size_t busy = mg_listener_busy(&s->api);
    if (busy == 0 && s->in_flight == 0) {
        mg_log_msg(MG_LOG_INFO, NULL, "drained; stopping");
        s->exit_code = 0;
        close_everything(s);
        return;
    }
    if (waited >= (uint64_t)s->gen->cfg->timeouts.drain_ms) {
        mg_log_msg(MG_LOG_WARN, NULL, "drain timeout: closing %zu connections with requests in flight",
                   busy);
        s->exit_code = 0;
        close_everything(s);
    }
}

void mg_server_stop(mg_server_t *s)
{
    if (s->stopping) return;
    s->stopping = 1;
    mg_log_msg(MG_LOG_INFO, NULL, "stopping: no new connections; waiting for %d requests in flight",
               s->in_flight);
    mg_listener_stop(&s->api);
    if (s->metrics_on) mg_listener_stop(&s->metrics_l);
    s->drain_started = uv_now(s->loop);
    uv_timer_start(&s->drain_timer, on_drain_tick, 0, 50);
}

static void on_signal(uv_signal_t *h, int signum)
{
    mg_server_t *s = h->data;
    if (signum == SIGHUP) {
        mg_server_reload(s);
    } else if (s->stopping) {
        mg_log_msg(MG_LOG_WARN, NULL, "second stop signal: closing now");
        close_everything(s);
    } else {
        mg_server_stop(s);
    }
}

/* ------------------------------------------------------------------------ */
/* Start                                                                     */
/* ------------------------------------------------------------------------ */

static uint64_t unix_ms(void);

static void restore_row(void *ud, int ncols, const char *const *cols)
{
    mg_server_t *s = ud;
    if (ncols < 4 || !cols[0]) return;
    mg_provider_state_t *ps = mg_pool_get(&s->pool, cols[0]);
    if (!ps) return;
    uint64_t until = cols[1] ? strtoull(cols[1], NULL, 10) : 0;
    int n = cols[2] ? atoi(cols[2]) : 0;
    mg_pool_changed(ps);
    mg_cooldown_restore(&ps->cooldown, uv_now(s->loop), unix_ms(), until, n, 0);
    if (cols[3]) {
        int st = mg_health_state_from_name(cols[3]);
        if (st >= 0) ps->health.state = (mg_health_state_t)st;
    }
}

/* Cooldowns and health survive a restart: read them back before serving. */
static void restore_provider_state(mg_server_t *s)
{
    char err[256];
    uv_update_time(s->loop);
    if (mg_store_query(s->store,
                       "SELECT s.provider_id, s.cooldown_until_ms, s.consecutive_429, h.state"
                       " FROM provider_state s LEFT JOIN provider_health h"
                       " ON h.provider_id = s.provider_id",
                       0, NULL, restore_row, s, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot restore provider state: %s", err);
}

/* At start-up, once the store is open: the first generation again, with the providers
 * stored through the admin API (the first one only told where the store is). */
static int with_stored_providers(mg_server_t *s)
{
    char err[1024];
    mg_gen_t *g = NULL;
    if (build_gen(s, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s\n", err);
        return -1;
    }
    s->next_gen_id++;
    mg_gen_unref(s->gen);
    s->gen = g;
    return 0;
}

/* The current generation's Lua collections, at the end of an iteration rather than inside a
 * request (mg_gen_collect_between); earlier when no request is in flight. Generations that
 * were swapped out keep only Lua's automatic collector: little runs on them. */
static void on_gc_prepare(uv_prepare_t *h)
{
    mg_server_t *s = h->data;
    mg_gen_collect_between(s->gen, s->in_flight == 0);
}

int mg_server_init(mg_server_t *s, uv_loop_t *loop, const char *config_path)
{
    char err[1024];
    memset(s, 0, sizeof(*s));
    s->loop = loop;
    s->config_path = strdup(config_path);
    s->next_gen_id = 1;
    s->started_at = (int64_t)time(NULL);
    /* the start-up load counts as the first (successful) load */
    snprintf(s->reload_result, sizeof(s->reload_result), "ok");
    s->reload_at = s->started_at;
    mg_pool_init(&s->pool);
    if (mg_gen_load(config_path, s->next_gen_id, &s->gen, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s\n", err);
        return -1;
    }
    s->next_gen_id++;
    apply_log_level(s->gen->cfg);
    if (mg_store_open(s->gen->cfg->storage_path, &s->store, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: storage: %s\n", err);
        return -1;
    }
    if (with_stored_providers(s) != 0) return -1;
    const mg_config_t *cfg = s->gen->cfg;
    if (mg_pool_sync(&s->pool, cfg) != 0) return -1;
    restore_provider_state(s);
    s->tasks = mg_tasks_open(s, cfg->tasks_retention_seconds);
    s->idem = mg_idem_open(s, cfg->idempotency_ttl_seconds);
    if (!s->tasks || !s->idem) return -1;
    s->userrate = mg_userrate_new();
    if (!s->userrate) return -1;
    s->auth = mg_auth_new();
    if (!s->auth || mg_auth_load(s->auth, s->store, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: storage: cannot load API keys: %s\n",
                s->auth ? err : "out of memory");
        return -1;
    }
    s->upstream = mg_upstream_new(loop);
    if (!s->upstream) return -1;
    s->prober = mg_probe_start(s);
    if (!s->prober) return -1;
    mg_sched_config_t sc;
    sched_config_of(cfg, &sc);
    s->sched = mg_sched_new(&sc);
    if (!s->sched) {
        fprintf(stderr, "moongate: invalid scheduler settings\n");
        return -1;
    }
    sched_apply_models(s, cfg);
    uv_timer_init(loop, &s->sched_timer);
    s->sched_timer.data = s;
    uv_prepare_init(loop, &s->gc_prepare);
    s->gc_prepare.data = s;
    uv_prepare_start(&s->gc_prepare, on_gc_prepare);
    int rc = mg_loopstat_start(&s->loopstat, loop, &s->metrics);
    if (rc != 0) { /* only the metric is lost */
        fprintf(stderr, "moongate: cannot measure the event loop: %s\n", uv_strerror(rc));
    }
    mg_http_limits_t lim = limits_of(cfg);
    rc = mg_listener_start(&s->api, loop, cfg->listen, &lim, mg_api_handle, s);
    if (rc != 0) {
        fprintf(stderr, "moongate: %s: cannot listen on %s: %s\n", cfg->path, cfg->listen,
                uv_strerror(rc));
        return -1;
    }
    if (cfg->metrics_listen) {
        mg_http_limits_t mlim = lim;
        mlim.max_body_bytes = 4096;
        rc = mg_listener_start(&s->metrics_l, loop, cfg->metrics_listen, &mlim,
                               mg_api_handle_metrics, s);
        if (rc != 0) {
            fprintf(stderr, "moongate: %s: cannot listen on %s: %s\n", cfg->path,
                    cfg->metrics_listen, uv_strerror(rc));
            return -1;
        }
        s->metrics_on = 1;
    }
    uv_timer_init(loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_signal_init(loop, &s->sig_hup);
    uv_signal_init(loop, &s->sig_term);
    uv_signal_init(loop, &s->sig_int);
    s->sig_hup.data = s->sig_term.data = s->sig_int.data = s;
    uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    return 0;
}

int mg_server_run(mg_server_t *s)
{
    mg_log_attach(s->loop);
    const mg_config_t *cfg = s->gen->cfg;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "listening");
    mg_log_str(&l, "listen", s->api.bound);
    mg_log_str(&l, "metrics_listen", s->metrics_on ? s->metrics_l.bound : NULL);
    mg_log_str(&l, "config", cfg->path);
    mg_log_int(&l, "generation", s->gen->id);
    mg_log_int(&l, "providers", (int64_t)cfg->n_providers);
    mg_log_int(&l, "models", (int64_t)cfg->n_models);
    mg_log_int(&l, "pid", (int64_t)uv_os_getpid());
    mg_log_end(&l);
    mg_auth_log_status(s->auth, cfg->auth_enabled, s->api.bound);
    mg_log_flush();
    uv_run(s->loop, UV_RUN_DEFAULT);
    mg_log_detach();
    /* free what the loop no longer needs */
    mg_gen_unref(s->gen);
    s->gen = NULL;
    mg_pool_free(&s->pool);
    mg_sched_free(s->sched);
    mg_auth_free(s->auth);
    mg_userrate_free(s->userrate);
    mg_tasks_free(s->tasks);
    mg_idem_free(s->idem);
    mg_store_close(s->store);
    free(s->config_path);
    return s->exit_code;
}

/* ------------------------------------------------------------------------ */
/* Provider state: logging and persistence                                   */
/* ------------------------------------------------------------------------ */

static uint64_t unix_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

void mg_server_cooldown_applied(mg_server_t *s, const mg_provider_state_t *ps, int consecutive,
                                double seconds, int status)
{
    s->metrics.cooldown_events_total++;
    uint64_t now = uv_now(s->loop);
    uint64_t until = mg_cooldown_until_unix_ms(&ps->cooldown, now, unix_ms());
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "cooldown");
    mg_log_str(&l, "provider", ps->id);
    mg_log_int(&l, "status", status);
    mg_log_int(&l, "consecutive", consecutive);
    mg_log_double(&l, "seconds", seconds);
    mg_log_end(&l);
    if (!s->store) return;
    char id[40], n[16], secs[32], until_s[32], summary[64];
    mg_request_id(id);
    snprintf(n, sizeof(n), "%d", consecutive);
    snprintf(secs, sizeof(secs), "%d", (int)(seconds + 0.5));
    snprintf(until_s, sizeof(until_s), "%llu", (unsigned long long)until);
    snprintf(summary, sizeof(summary), "HTTP %d", status);
    const char *ev[5] = {id, ps->id, n, secs, summary};
    mg_store_write(s->store,
                   "INSERT INTO cooldown_events(id, provider_id, consecutive_count, cooldown_seconds,"
                   " response_summary) VALUES (?1, ?2, ?3, ?4, ?5)",
                   5, ev);
    const char *st[3] = {ps->id, until_s, n};
    mg_store_write(s->store,
                   "INSERT INTO provider_state(provider_id, cooldown_until_ms, consecutive_429)"
                   " VALUES (?1, ?2, ?3) ON CONFLICT(provider_id) DO UPDATE SET"
                   " cooldown_until_ms = excluded.cooldown_until_ms,"
                   " consecutive_429 = excluded.consecutive_429, updated_at = datetime('now')",
                   3, st);
}

void mg_server_health_changed(mg_server_t *s, const mg_provider_state_t *ps)
{
    const char *state = mg_health_state_name(ps->health.state);
    mg_logline_t l;
    mg_log_begin(&l, ps->health.state == MG_HEALTH_HEALTHY ? MG_LOG_INFO : MG_LOG_WARN, "health");
    mg_log_str(&l, "provider", ps->id);
    mg_log_str(&l, "state", state);
    mg_log_int(&l, "consecutive_failures", ps->health.consecutive_failures);
    mg_log_end(&l);
    if (!s->store) return;
    char fails[16];
    snprintf(fails, sizeof(fails), "%d", ps->health.consecutive_failures);
    const char *p[3] = {ps->id, state, fails};
    mg_store_write(s->store,
                   "INSERT INTO provider_health(provider_id, state, consecutive_failures)"
                   " VALUES (?1, ?2, ?3) ON CONFLICT(provider_id) DO UPDATE SET"
                   " state = excluded.state, consecutive_failures = excluded.consecutive_failures,"
                   " last_check_at = datetime('now')",
                   3, p);
}
