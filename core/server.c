/* server: the composition root; see server.h.
 *
 * Start-up makes the parts bottom up (generation, store, pool, auth, upstream, scheduler,
 * prober, pipeline, idempotency, tasks, admin, api, listeners), each given what it uses.
 * Reload: the new generation is built on a libuv worker thread (it reads files and runs Lua,
 * neither of which may happen on the loop thread), then swapped in on the loop thread;
 * requests keep the generation they started with. Stop: no new connections, in-flight
 * requests drain up to timeouts.drain_ms, then everything closes. */
#include "cluster/limits.h"
#include "cluster/idem.h"
#include "cluster/redis.h"
#include "cluster/samples.h"
#include "tenancy/wallet.h"
#include "server.h"

#include "admin/control.h"

#include "token/registry.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/logfile.h"
#include "base/sdnotify.h"
#include "conf/apps.h"
#include "conf/models.h"
#include "conf/providers.h"
#include "conf/settings.h"
#include "net/fdlimit.h"
#include "obs/usage_rollup.h"
#include "pipeline/calib.h"
#include "pipeline/ping.h"
#include "pipeline/responses_store.h"
#include "route/persist.h"
#include "sched/setup.h"

/* What a connection past max_connections may still ask for on the main listener: the
 * admin API and the health and status endpoints (the metrics listener has its own cap). */
static const char *const reserve_paths[] = {"/api/v2/", "/health", "/ready", "/status", NULL};

static mg_http_limits_t limits_of(mg_server_t *s, const mg_config_t *cfg)
{
    mg_http_limits_t lim = {
        .max_body_bytes = cfg->max_body_bytes,
        .max_header_bytes = cfg->max_header_bytes,
        .header_read_ms = cfg->timeouts.header_read_ms,
        .keepalive_idle_ms = cfg->timeouts.keepalive_idle_ms,
        .request_read_ms = cfg->request_read_ms,
        .min_body_bytes_per_s = cfg->min_body_bytes_per_s,
        .write_timeout_ms = cfg->write_timeout_ms,
        .max_connections = mg_fdlimit_connection_cap(
            (size_t)cfg->max_connections, (size_t)cfg->reserved_connections, MG_HTTP_REFUSING_MAX),
        .reserved_connections = (size_t)cfg->reserved_connections,
        .reserve_paths = reserve_paths,
        .name = "api",
        .stats = &s->metrics.conns[MG_LISTENER_API],
        .trim = &s->memtrim,
    };
    return lim;
}

static void apply_log_level(const mg_config_t *cfg)
{
    mg_log_level_t lv;
    if (mg_log_level_parse(cfg->log_level, &lv) == 0) mg_log_set_level(lv);
    mg_log_set_text(cfg->log_text);
    mg_log_set_node(cfg->cluster.node_id);
}

/* ------------------------------------------------------------------------ */
/* Building a generation                                                     */
/* ------------------------------------------------------------------------ */

/* A generation from the config file plus the providers stored through the admin API.
 * Blocking (disk, decryption): a worker thread, or start-up before the loop runs. */
static int add_stored_providers(mg_config_t *cfg, const mg_provider_list_t *list, char *err,
                                size_t errlen)
{
    for (size_t i = 0; i < list->n; i++) {
        if (mg_config_provider(cfg, list->items[i].id)) {
            mg_log_msg(MG_LOG_WARN, NULL,
                       "stored provider %s not served: the config file uses "
                       "the same id",
                       list->items[i].id);
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
                   mg_settings_overlay(b->store, cfg, err, errlen) != 0 ||
                   mg_prices_load(b->store, cfg, err, errlen) != 0
               ? -1
               : 0;
}

static int build_gen(mg_server_t *s, mg_gen_t **out, char *err, size_t errlen)
{
    build_t b = {s->store, {0}};
    *out = NULL;
    unsigned id = s->gens.next_id;
    if (!s->store) return mg_gen_load(s->config_path, id, out, err, errlen);
    if (mg_providers_load(s->store, &b.providers, err, errlen) != 0) return -1;
    int rc = mg_gen_load_with(s->config_path, extend_from_store, &b, id, out, err, errlen);
    mg_provider_list_free(&b.providers);
    return rc;
}

/* The scheduler follows a new generation's settings and models. */
static void sched_follow(mg_server_t *s, const mg_config_t *cfg)
{
    mg_sched_config_t sc;
    mg_sched_setup_config(cfg, &sc);
    if (mg_sched_reconfigure(s->sched, &sc) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "scheduler settings rejected; keeping the previous ones");
    mg_sched_setup_models(s->sched, cfg);
}

/* ------------------------------------------------------------------------ */
/* Reload                                                                    */
/* ------------------------------------------------------------------------ */

static void reload_work(uv_work_t *w)
{
    mg_server_t *s = w->data;
    s->reload_gen = NULL;
    build_gen(s, &s->reload_gen, s->reload_err_buf, sizeof(s->reload_err_buf));
}

/* Someone waiting for a rebuild (mg_server_rebuild). */
typedef struct waiter_s {
    struct waiter_s *next;
    mg_rebuild_done_fn fn;
    void *ud;
} waiter_t;

/* Tell the waiters of the reload that just ended how it went. */
static void notify_waiters(mg_server_t *s, int ok)
{
    waiter_t *w = s->waiters_current;
    s->waiters_current = NULL;
    while (w) {
        waiter_t *next = w->next;
        w->fn(w->ud, ok, ok ? "" : s->proc.reload_error);
        free(w);
        w = next;
    }
}

/* Start the next reload when someone asked for one while the last one ran. */
static void reload_next(mg_server_t *s)
{
    if (!s->waiters_next && !s->reload_again) return;
    s->reload_again = 0;
    if (s->proc.stopping) {
        s->waiters_current = s->waiters_next;
        s->waiters_next = NULL;
        snprintf(s->proc.reload_error, sizeof(s->proc.reload_error), "the gateway is stopping");
        notify_waiters(s, 0);
        return;
    }
    mg_server_reload(s);
}

static void reload_failed(mg_server_t *s)
{
    s->metrics.reloads_failed++;
    snprintf(s->proc.reload_result, sizeof(s->proc.reload_result), "failed");
    snprintf(s->proc.reload_error, sizeof(s->proc.reload_error), "%s", s->reload_err_buf);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_ERROR, "reload");
    mg_log_str(&l, "result", "failed");
    mg_log_str(&l, "error", s->proc.reload_error);
    mg_log_int(&l, "generation", mg_gens_current(&s->gens)->id);
    mg_log_end(&l);
}

static void reload_swap(mg_server_t *s, mg_gen_t *g)
{
    s->gens.next_id++;
    mg_gens_swap(&s->gens, g); /* the old one is freed now, or when its last request ends */
    sched_follow(s, g->cfg);
    apply_log_level(g->cfg);
    s->metrics.reloads_ok++;
    snprintf(s->proc.reload_result, sizeof(s->proc.reload_result), "ok");
    s->proc.reload_error[0] = '\0';
    /* listen addresses change only with a restart; the log line says which one is in force */
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "reload");
    mg_log_str(&l, "result", "ok");
    mg_log_int(&l, "generation", g->id);
    mg_log_int(&l, "providers", (int64_t)g->cfg->n_providers);
    mg_log_int(&l, "models", (int64_t)g->cfg->n_models);
    mg_log_str(&l, "listen", s->listener.bound);
    mg_log_end(&l);
}

static void reload_done(uv_work_t *w, int status)
{
    mg_server_t *s = w->data;
    s->reloading = 0;
    s->proc.reload_at = (int64_t)time(NULL);
    mg_gen_t *g = s->reload_gen;
    s->reload_gen = NULL;
    if (g && s->proc.stopping) {
        mg_gen_unref(g);
        snprintf(s->proc.reload_error, sizeof(s->proc.reload_error), "the gateway is stopping");
        notify_waiters(s, 0);
        reload_next(s);
        return;
    }
    if (g && mg_pool_sync(&s->pool, g->cfg) != 0) {
        mg_gen_unref(g);
        g = NULL;
        snprintf(s->reload_err_buf, sizeof(s->reload_err_buf), "out of memory");
    }
    if (g) reload_swap(s, g);
    else reload_failed(s);
    mg_sd_notify("READY=1"); /* serving either way: the new generation or the old one */
    notify_waiters(s, g != NULL);
    reload_next(s);
}

void mg_server_reload(mg_server_t *s)
{
    if (s->proc.stopping) return;
    if (s->reloading) {
        /* the files may have changed after the running build read them: build once more */
        s->reload_again = 1;
        mg_log_msg(MG_LOG_INFO, NULL, "reload requested while one runs; another follows it");
        return;
    }
    /* whoever waits now is served by this build: it reads the store after their commit */
    s->waiters_current = s->waiters_next;
    s->waiters_next = NULL;
    s->reloading = 1;
    mg_sd_notify("RELOADING=1");
    s->reload_work.data = s;
    if (uv_queue_work(s->loop, &s->reload_work, reload_work, reload_done) != 0) {
        s->reloading = 0;
        mg_sd_notify("READY=1");
        mg_log_msg(MG_LOG_ERROR, NULL, "cannot start the reload");
        snprintf(s->proc.reload_error, sizeof(s->proc.reload_error), "cannot start the reload");
        notify_waiters(s, 0);
    }
}

void mg_server_rebuild(void *server, mg_rebuild_done_fn fn, void *ud)
{
    mg_server_t *s = server;
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
    if (s->proc.stopping) {
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
    mg_usage_pruner_stop(&s->usage_pruner);
    mg_pump_close(&s->pump);
    mg_ping_stop(&s->pipeline);
    mg_pipeline_leases_stop(&s->pipeline);
    mg_idem_stop(s->idem);
    mg_dashboard_close(&s->dashboard);
    mg_listener_close(&s->listener);
    if (s->metrics_on) mg_listener_close(&s->metrics_l);
    if (s->admin_on) mg_listener_close(&s->admin_l);
    mg_memtrim_close(&s->memtrim);
    mg_fulllog_close(&s->fulllog);
    mg_probe_stop(s->prober);
    s->prober = NULL;
    mg_upmodels_stop(s->upmodels); /* its fetches go before the upstream client */
    s->upmodels = NULL;
    s->api.upmodels = NULL;
    mg_redis_stop(s->redis_sub); /* the cooldown channel's: its timers held the loop */
    s->redis_sub = NULL;
    mg_redis_stop(s->redis);   /* frees itself once its handles close */
    mg_shared_free(s->shared); /* after: the callbacks in flight have been told */
    mg_csamples_stop(s->samples);
    s->samples = s->pipeline.samples = s->api.samples = NULL;
    mg_idem_cluster(s->idem, NULL, 0);
    mg_cidem_free(s->cidem);
    s->cidem = NULL;
    s->api.cidem = NULL;
    s->redis = NULL;
    s->shared = NULL;
    s->pipeline.shared = NULL;
    s->api.redis = NULL;
    s->api.shared = NULL;
    mg_loopstat_stop(&s->loopstat);
    uv_prepare_stop(&s->gc_prepare);
    uv_close((uv_handle_t *)&s->gc_prepare, NULL);
    mg_upstream_close(s->upstream);
    s->upstream = NULL;
    uv_signal_stop(&s->sig_hup);
    uv_signal_stop(&s->sig_term);
    uv_signal_stop(&s->sig_int);
    uv_signal_stop(&s->sig_usr1);
    uv_close((uv_handle_t *)&s->sig_hup, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->sig_usr1, NULL);
    mg_store_detach(s->store); /* writes still commit; their callbacks run in mg_store_close */
    mg_pg_detach(s->pg);       /* likewise: its callbacks run in mg_pg_close */
    mg_control_detach(s->control);
}

static void on_drain_tick(uv_timer_t *t)
{
    mg_server_t *s = t->data;
    uint64_t waited = uv_now(s->loop) - s->drain_started;
    size_t busy =
        mg_listener_busy(&s->listener) + (s->admin_on ? mg_listener_busy(&s->admin_l) : 0);
    if (busy == 0 && s->pipeline.in_flight == 0) {
        mg_log_msg(MG_LOG_INFO, NULL, "drained; stopping");
        s->exit_code = 0;
        close_everything(s);
        return;
    }
    if (waited >= (uint64_t)mg_gens_current(&s->gens)->cfg->timeouts.drain_ms) {
        mg_log_msg(MG_LOG_WARN, NULL,
                   "drain timeout: closing %zu connections with requests in flight", busy);
        s->exit_code = 0;
        close_everything(s);
    }
}

void mg_server_stop(mg_server_t *s)
{
    if (s->proc.stopping) return;
    s->proc.stopping = 1;
    mg_sd_notify("STOPPING=1");
    mg_log_msg(MG_LOG_INFO, NULL, "stopping: no new connections; waiting for %d requests in flight",
               s->pipeline.in_flight);
    mg_listener_stop(&s->listener);
    if (s->metrics_on) mg_listener_stop(&s->metrics_l);
    if (s->admin_on) mg_listener_stop(&s->admin_l);
    mg_dashboard_stop(&s->dashboard); /* its streams would hold the drain up */
    mg_probe_stop(s->prober);         /* background work ends with the serving */
    s->prober = NULL;
    s->drain_started = uv_now(s->loop);
    uv_timer_start(&s->drain_timer, on_drain_tick, 0, 50);
}

static void on_signal(uv_signal_t *h, int signum)
{
    mg_server_t *s = h->data;
    const char *log_file = mg_gens_current(&s->gens)->cfg->log_file;
    if (signum == SIGHUP) {
        mg_server_reload(s);
    } else if (signum == SIGUSR1) {
        if (log_file) mg_logfile_reopen(s->loop, log_file);
        else mg_log_msg(MG_LOG_INFO, NULL, "SIGUSR1: no log.file to reopen (the log is stdout)");
    } else if (s->proc.stopping) {
        mg_log_msg(MG_LOG_WARN, NULL, "second stop signal: closing now");
        close_everything(s);
    } else {
        mg_server_stop(s);
    }
}

/* ------------------------------------------------------------------------ */
/* Start                                                                     */
/* ------------------------------------------------------------------------ */

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
    s->gens.next_id++;
    mg_gens_swap(&s->gens, g);
    return 0;
}

/* The current generation's Lua collections, at the end of an iteration rather than inside a
 * request (mg_gen_collect_between); earlier when no request is in flight. Generations that
 * were swapped out keep only Lua's automatic collector: little runs on them. */
static void on_gc_prepare(uv_prepare_t *h)
{
    mg_server_t *s = h->data;
    mg_gen_collect_between(mg_gens_current(&s->gens), s->pipeline.in_flight == 0);
}

static void health_sink(void *ud, const mg_provider_state_t *ps)
{
    mg_server_t *s = ud;
    mg_persist_health(s->store, ps);
}

/* The encodings the models count with, loaded before the loop runs (token/registry.h). A
 * missing or wrong rank file is logged and leaves those models on the byte estimate; an
 * encoding first named by a reload is not loaded (that would block the loop). */
static void load_tokenizers(const mg_config_t *cfg)
{
    int want[MG_ENC_COUNT] = {0}, any = 0;
    char dir[4096], err[1024];
    for (size_t i = 0; i < cfg->n_models; i++) {
        if (cfg->models[i].tokenizer > 0) want[cfg->models[i].tokenizer - 1] = any = 1;
    }
    if (!any) return;
    if (mg_encoding_data_dir(cfg->tokenizer_data_dir, dir, sizeof(dir)) != 0 ||
        mg_token_registry_load(dir, want, err, sizeof(err)) != 0) {
        mg_logline_t l;
        mg_log_begin(&l, MG_LOG_WARN, "tokenizer_unavailable");
        mg_log_str(&l, "reason", err);
        mg_log_end(&l);
    }
}

/* The database's housekeeping (store/upkeep.h), as the first config says: read at start. */
static void start_upkeep(mg_server_t *s, const mg_config_t *cfg)
{
    mg_upkeep_conf_t uc = {
        .checkpoint_s = (int64_t)cfg->storage_checkpoint_minutes * 60,
        .integrity_s = (int64_t)cfg->storage_integrity_hours * 3600,
        .backup_dir = cfg->storage_backup_dir,
        .backup_every_s = (int64_t)cfg->storage_backup_every_hours * 3600,
        .backup_keep_s = (int64_t)cfg->storage_backup_keep_days * 86400,
        .replay = mg_usage_journal_replay,
    };
    s->upkeep = mg_upkeep_start(cfg->storage_path, &uc);
    if (!s->upkeep) mg_log_msg(MG_LOG_ERROR, NULL, "store upkeep: cannot start its thread");
}

/* cluster.postgres: the shared books (store/pg.h), kept there as well as in the store. The
 * connection and the migrations happen on the client's thread; start-up does not wait. */
static int start_cluster_pg(mg_server_t *s, const mg_config_t *cfg)
{
    const char *url = cfg->cluster.postgres.url;
    if (!url) return 0;
    char err[256];
    if (mg_pg_open(url, cfg->cluster.postgres.pool_size, 0, &s->pg, err, sizeof(err)) != 0 ||
        mg_pg_attach(s->pg, s->loop) != 0) {
        fprintf(stderr, "moongate: cluster.postgres: %s\n", s->pg ? "cannot attach" : err);
        return -1;
    }
    mg_store_set_pg(s->store, s->pg, cfg->cluster.node_id);
    mg_log_msg(MG_LOG_INFO, NULL, "cluster: usage and the prepaid ledger in PostgreSQL (node %s)",
               cfg->cluster.node_id);
    return 0;
}

/* The first generation, the store, the provider state it remembers. */
static int start_state(mg_server_t *s, const char *config_path)
{
    char err[1024];
    mg_gen_t *g = NULL;
    if (mg_gen_load(config_path, s->gens.next_id, &g, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s\n", err);
        return -1;
    }
    s->gens.next_id++;
    mg_gens_swap(&s->gens, g);
    apply_log_level(g->cfg);
    if (g->cfg->log_file && mg_logfile_open(g->cfg->log_file, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: %s\n", err);
        return -1;
    }
    load_tokenizers(g->cfg);
    mg_store_opts_t so = {.queue_max = g->cfg->storage_queue_max,
                          .synchronous_full = g->cfg->storage_synchronous_full};
    if (mg_store_open_with(g->cfg->storage_path, &so, &s->store, err, sizeof(err)) != 0 ||
        mg_store_attach(s->store, s->loop) != 0) {
        fprintf(stderr, "moongate: storage: %s\n", s->store ? "cannot attach to the loop" : err);
        return -1;
    }
    /* the usage roll-ups are written once a second: sum what the last run left unwritten
     * (a kill -9 between two flushes) before serving */
    if (mg_store_use_agg(s->store, &mg_usage_rollup) != 0) {
        fprintf(stderr, "moongate: storage: cannot recover the usage roll-ups\n");
        return -1;
    }
    /* the usage events' journal: an event is durable once in it (obs/usage.h); failing to
     * open it, they take the write queue as before. Not with synchronous: full, which
     * promises power-loss durability: a journal record is in the page cache only. */
    if (!g->cfg->storage_synchronous_full)
        mg_usage_journal_open(s->store, (size_t)g->cfg->storage_journal_mib << 20);
    start_upkeep(s, g->cfg);
    if (start_cluster_pg(s, g->cfg) != 0) return -1;
    if (with_stored_providers(s) != 0) return -1;
    if (mg_pool_sync(&s->pool, mg_gens_current(&s->gens)->cfg) != 0) return -1;
    uv_update_time(s->loop);
    mg_persist_restore(s->store, &s->pool, uv_now(s->loop));
    s->auth = mg_auth_new();
    if (!s->auth || mg_auth_load(s->auth, s->store, err, sizeof(err)) != 0) {
        fprintf(stderr, "moongate: storage: cannot load API keys: %s\n",
                s->auth ? err : "out of memory");
        return -1;
    }
    mg_wallet_recover(s->store, mg_unix_ms()); /* holds a killed process left open */
    s->userrate = mg_userrate_new();
    return s->userrate ? 0 : -1;
}

/* The scheduler, the upstream client and the prober. */
static int start_engines(mg_server_t *s)
{
    const mg_config_t *cfg = mg_gens_current(&s->gens)->cfg;
    mg_sched_config_t sc;
    mg_sched_setup_config(cfg, &sc);
    s->sched = mg_sched_new(&sc);
    if (!s->sched) {
        fprintf(stderr, "moongate: invalid scheduler settings\n");
        return -1;
    }
    mg_sched_setup_models(s->sched, cfg);
    if (mg_pump_init(&s->pump, s->loop, s->sched) != 0) return -1;
    s->upstream = mg_upstream_new(s->loop);
    if (!s->upstream) return -1;
    mg_probe_deps_t pd = {s->loop, &s->pool, &s->gens, s->upstream, health_sink, s};
    s->prober = mg_probe_start(&pd);
    mg_upmodels_deps_t ud = {s->loop, &s->gens, s->upstream};
    s->upmodels = mg_upmodels_start(&ud);
    return s->prober && s->upmodels ? 0 : -1;
}

/* The request path: pipeline, idempotency, tasks, admin, api. */
/* The full logging window ended by itself: the audit trail says so, as it said when it opened. */
static void fulllog_expired(void *ud, const mg_fulllog_t *f)
{
    mg_server_t *s = ud;
    char target[224];
    snprintf(target, sizeof(target), "reason=%s", f->reason);
    if (s->admin) mg_admin_audit_system(s->admin, "logging.full.expired", target);
}

static int start_services(mg_server_t *s)
{
    const mg_config_t *cfg = mg_gens_current(&s->gens)->cfg;
    s->metrics.loop = s->loop;
    s->pipeline = (mg_pipeline_t){
        .loop = s->loop,
        .gens = &s->gens,
        .pool = &s->pool,
        .sched = s->sched,
        .pump = &s->pump,
        .upstream = s->upstream,
        .auth = s->auth,
        .userrate = s->userrate,
        .metrics = &s->metrics,
        .store = s->store,
    };
    mg_calib_init(&s->calib);
    s->pipeline.calib = &s->calib;
    mg_pipeline_calib_load(&s->pipeline); /* a failure is logged: the estimate starts at 4 */
    mg_ping_start(&s->pipeline);
    mg_pipeline_leases_start(&s->pipeline);
    mg_idem_deps_t id = {s->store, s->loop, mg_pipeline_handle, &s->pipeline};
    s->idem = mg_idem_open(&id, cfg->idempotency_ttl_seconds, cfg->idempotency_max_entries);
    s->pipeline.idem = s->idem;
    mg_resp_store_deps_t rd = {s->store,    s->loop,  s->auth,
                               &s->metrics, &s->gens, cfg->protocols.responses_retention_s};
    s->responses = mg_resp_store_new(&rd);
    s->pipeline.responses = s->responses;
    mg_tasks_deps_t td = {s->store,           s->loop,          &s->metrics,
                          mg_pipeline_handle, mg_pipeline_task, &s->pipeline};
    s->tasks = mg_tasks_open(&td, cfg->tasks_retention_seconds);
    s->sessions = mg_sessions_open(s->store, cfg->context.enable_prompt_persistence, mg_unix_ms());
    s->pipeline.sessions = s->sessions;
    const char *token = getenv("MOONGATE_ADMIN_TOKEN");
    if (!token || !*token) token = getenv("SIDECAR_ADMIN_TOKEN"); /* the Sidecar's name */
    if (mg_fulllog_init(&s->fulllog, s->loop) != 0) return -1;
    if (cfg->observability.otlp.endpoint) { /* read at start; its thread does the I/O */
        s->otlp = mg_otlp_start(&cfg->observability.otlp);
        if (!s->otlp) return -1;
        s->pipeline.otlp = s->otlp;
    }
    s->pipeline.fulllog = &s->fulllog;
    mg_admin_deps_t ad = {s->loop,
                          s->store,
                          s->auth,
                          &s->metrics,
                          &s->gens,
                          &s->pool,
                          mg_server_rebuild,
                          s,
                          token,
                          &s->fulllog,
                          cfg->cluster.postgres.url != NULL};
    s->admin = mg_admin_new(&ad);
    if (cfg->cluster.postgres.url) { /* the control plane shared through it (admin/control.h) */
        char err[512];
        mg_control_deps_t cd = {s->loop,           s->store, s->auth,
                                mg_server_rebuild, s,        cfg->cluster.postgres.url};
        if (!(s->control = mg_control_start(&cd, err, sizeof(err)))) {
            fprintf(stderr, "moongate: cluster.postgres: %s\n", err);
            return -1;
        }
    }
    s->fulllog.on_expired = fulllog_expired;
    s->fulllog.on_expired_ud = s;
    if (!s->idem || !s->tasks || !s->sessions || !s->admin || !s->responses) return -1;
    mg_recent_init(&s->recent);
    s->pipeline.recent = &s->recent;
    mg_stream_deps_t sd = {s->sched, &s->pipeline, &s->recent, &s->listener, &s->proc};
    if (mg_dashboard_init(&s->dashboard, s->loop, &s->gens, &s->metrics, s->admin, &sd) != 0)
        return -1;
    s->api = (mg_api_t){
        .loop = s->loop,
        .gens = &s->gens,
        .metrics = &s->metrics,
        .pool = &s->pool,
        .sched = s->sched,
        .upstream = s->upstream,
        .store = s->store,
        .upkeep = s->upkeep,
        .pipeline = &s->pipeline,
        .tasks = s->tasks,
        .admin = s->admin,
        .auth = s->auth,
        .dashboard = &s->dashboard,
        .responses = s->responses,
        .sessions = s->sessions,
        .listener = &s->listener,
        .proc = &s->proc,
        .otlp = s->otlp,
        .upmodels = s->upmodels,
        .control = s->control,
    };
    return 0;
}

/* server.admin_listen: the admin API and the dashboard there, no longer on server.listen.
 * Read at start, like the other listen addresses. */
static int start_admin_listener(mg_server_t *s, const mg_config_t *cfg, const mg_http_limits_t *lim)
{
    if (!cfg->admin_listen) return 0;
    mg_http_limits_t alim = *lim;
    alim.reserve_paths = NULL;
    alim.name = "admin";
    alim.stats = &s->metrics.conns[MG_LISTENER_ADMIN];
    int rc = mg_listener_start(&s->admin_l, s->loop, cfg->admin_listen, &alim, mg_api_handle_admin,
                               &s->api);
    if (rc != 0) {
        fprintf(stderr, "moongate: %s: cannot listen on %s: %s\n", cfg->path, cfg->admin_listen,
                uv_strerror(rc));
        return -1;
    }
    s->admin_on = 1;
    s->api.admin_apart = 1;
    return 0;
}

static int start_listeners(mg_server_t *s)
{
    const mg_config_t *cfg = mg_gens_current(&s->gens)->cfg;
    mg_memtrim_init(&s->memtrim, s->loop);
    mg_http_limits_t lim = limits_of(s, cfg);
    int rc = mg_listener_start(&s->listener, s->loop, cfg->listen, &lim, mg_api_handle, &s->api);
    if (rc != 0) {
        fprintf(stderr, "moongate: %s: cannot listen on %s: %s\n", cfg->path, cfg->listen,
                uv_strerror(rc));
        return -1;
    }
    if (start_admin_listener(s, cfg, &lim) != 0) return -1;
    if (!cfg->metrics_listen) return 0;
    mg_http_limits_t mlim = lim;
    mlim.max_body_bytes = 4096;
    mlim.max_connections = lim.reserved_connections; /* the scrapers' own cap */
    mlim.reserve_paths = NULL;
    mlim.name = "metrics";
    mlim.stats = &s->metrics.conns[MG_LISTENER_METRICS];
    rc = mg_listener_start(&s->metrics_l, s->loop, cfg->metrics_listen, &mlim,
                           mg_api_handle_metrics, &s->api);
    if (rc != 0) {
        fprintf(stderr, "moongate: %s: cannot listen on %s: %s\n", cfg->path, cfg->metrics_listen,
                uv_strerror(rc));
        return -1;
    }
    s->metrics_on = 1;
    return 0;
}

/* The pruner's view of the config: the current generation's usage: section. */
static const mg_usage_conf_t *usage_conf(void *ud)
{
    mg_server_t *s = ud;
    return &mg_gens_current(&s->gens)->cfg->usage;
}

static void start_loop_hooks(mg_server_t *s)
{
    s->redis = mg_redis_start(s->loop, &mg_gens_current(&s->gens)->cfg->cluster);
    s->api.redis = s->redis;
    s->shared = mg_shared_new(s->redis, mg_gens_current(&s->gens)->cfg->cluster.redis.key_prefix);
    s->pipeline.shared = s->api.shared = s->shared;
    const mg_config_t *cfg = mg_gens_current(&s->gens)->cfg;
    s->cidem = mg_cidem_new(s->redis, cfg->cluster.redis.key_prefix, cfg->cluster.node_id);
    s->api.cidem = s->cidem;
    /* a claim outlives any run: the longest total deadline, the queue wait, and slack */
    int total = cfg->timeouts.max_total_ms > cfg->timeouts.total_ms ? cfg->timeouts.max_total_ms
                                                                    : cfg->timeouts.total_ms;
    mg_idem_cluster(s->idem, s->cidem,
                    (uint64_t)total + (uint64_t)cfg->routing.queue_timeout_ms + 5000);
    /* health samples heard from the other instances, and this one's shared with them */
    if (cfg->cluster.redis.health_samples)
        s->samples = mg_csamples_new(s->loop, s->redis, cfg->cluster.redis.key_prefix,
                                     cfg->cluster.node_id, mg_pipeline_sample_heard, &s->pipeline);
    s->pipeline.samples = s->api.samples = s->samples;
    if (s->shared) { /* cooldowns heard from the other instances */
        const mg_cluster_conf_t *cc = &mg_gens_current(&s->gens)->cfg->cluster;
        char channel[160];
        snprintf(channel, sizeof(channel), "%scooldown", cc->redis.key_prefix);
        s->redis_sub =
            mg_redis_subscribe(s->loop, cc, channel, mg_pipeline_cooldown_heard, &s->pipeline);
    }
    if (s->store && mg_usage_pruner_start(&s->usage_pruner, s->loop, s->store, usage_conf, s) != 0)
        fprintf(stderr, "moongate: cannot start pruning usage events\n");
    uv_prepare_init(s->loop, &s->gc_prepare);
    s->gc_prepare.data = s;
    uv_prepare_start(&s->gc_prepare, on_gc_prepare);
    int rc = mg_loopstat_start(&s->loopstat, s->loop, &s->metrics);
    if (rc != 0) /* only the metric is lost */
        fprintf(stderr, "moongate: cannot measure the event loop: %s\n", uv_strerror(rc));
    uv_timer_init(s->loop, &s->drain_timer);
    s->drain_timer.data = s;
    uv_signal_init(s->loop, &s->sig_hup);
    uv_signal_init(s->loop, &s->sig_term);
    uv_signal_init(s->loop, &s->sig_int);
    uv_signal_init(s->loop, &s->sig_usr1);
    s->sig_hup.data = s->sig_term.data = s->sig_int.data = s->sig_usr1.data = s;
    uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_signal_start(&s->sig_usr1, on_signal, SIGUSR1);
}

int mg_server_init(mg_server_t *s, uv_loop_t *loop, const char *config_path)
{
    memset(s, 0, sizeof(*s));
    s->loop = loop;
    s->config_path = strdup(config_path);
    s->gens.next_id = 1;
    s->proc.started_at = (int64_t)time(NULL);
    /* the start-up load counts as the first (successful) load */
    snprintf(s->proc.reload_result, sizeof(s->proc.reload_result), "ok");
    s->proc.reload_at = s->proc.started_at;
    mg_pool_init(&s->pool);
    if (!s->config_path || start_state(s, config_path) != 0 || start_engines(s) != 0 ||
        start_services(s) != 0)
        return -1;
    start_loop_hooks(s);
    return start_listeners(s);
}

int mg_server_run(mg_server_t *s)
{
    mg_log_attach(s->loop);
    const mg_config_t *cfg = mg_gens_current(&s->gens)->cfg;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "listening");
    mg_log_str(&l, "listen", s->listener.bound);
    mg_log_str(&l, "metrics_listen", s->metrics_on ? s->metrics_l.bound : NULL);
    mg_log_str(&l, "admin_listen", s->admin_on ? s->admin_l.bound : NULL);
    mg_log_str(&l, "config", cfg->path);
    mg_log_int(&l, "generation", mg_gens_current(&s->gens)->id);
    mg_log_int(&l, "providers", (int64_t)cfg->n_providers);
    mg_log_int(&l, "models", (int64_t)cfg->n_models);
    mg_log_int(&l, "pid", (int64_t)uv_os_getpid());
    mg_log_end(&l);
    mg_auth_log_status(s->auth, cfg->auth_enabled, s->listener.bound);
    mg_log_flush();
    mg_sd_notify("READY=1"); /* listening: a Type=notify unit is started */
    uv_run(s->loop, UV_RUN_DEFAULT);
    mg_log_detach();
    /* free what the loop no longer needs; the store first: the callbacks of its last
       writes still reach idem's entries */
    mg_upkeep_stop(s->upkeep);
    mg_control_stop(s->control); /* before the store: its thread writes there */
    s->control = NULL;
    mg_store_close(s->store);
    mg_pg_close(s->pg);    /* after the store: its last callbacks may end holds */
    mg_otlp_stop(s->otlp); /* the spans still queued sent, bounded by its timeout */
    s->otlp = NULL;
    mg_gens_close(&s->gens);
    mg_pool_free(&s->pool);
    mg_metrics_free(&s->metrics);
    mg_calib_free(&s->calib);
    mg_sched_free(s->sched);
    mg_auth_free(s->auth);
    mg_userrate_free(s->userrate);
    mg_tasks_free(s->tasks);
    mg_sessions_free(s->sessions);
    mg_idem_free(s->idem);
    mg_dashboard_free(&s->dashboard);
    mg_resp_store_free(s->responses);
    mg_admin_free(s->admin);
    mg_token_registry_free();
    free(s->config_path);
    return s->exit_code;
}
