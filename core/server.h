/* server: the process: listeners, the current Lua generation, the upstream client,
 * the store, reloads and graceful stop. One mg_server_t is created in main() and
 * passed explicitly; nothing else in the core keeps mutable global state. */
#ifndef MG_SERVER_H
#define MG_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "tenancy/auth.h"
#include "net/http.h"
#include "obs/loopstat.h"
#include "luavm/luavm.h"
#include "obs/metrics.h"
#include "route/pool.h"
#include "route/probe.h"
#include "sched/sched.h"
#include "store/store.h"
#include "upstream/upstream.h"

typedef struct mg_server_s {
    uv_loop_t *loop;
    char *config_path;          /* owned */
    mg_gen_t *gen;              /* current generation (one reference held) */
    unsigned next_gen_id;
    mg_listener_t api;          /* server.listen */
    mg_listener_t metrics_l;    /* server.metrics_listen */
    int metrics_on;
    mg_upstream_t *upstream;    /* owned */
    mg_prober_t *prober;        /* owned: active health and load probes */
    mg_store_t *store;          /* owned */
    mg_auth_t *auth;            /* owned: customer keys, projects and their quotas */
    mg_pool_t pool;             /* provider runtime state */
    mg_sched_t *sched;          /* owned: priority queue and execution slots */
    uv_timer_t sched_timer;     /* queue deadlines, and dispatch passes after a release */
    mg_metrics_t metrics;
    mg_loopstat_t loopstat;     /* the loop's busy time per iteration, into metrics */
    uv_prepare_t gc_prepare;    /* Lua collections between requests, once per iteration */
    int in_flight;              /* proxied requests being answered */
    void *calls;                /* proxy.c's list of those requests (for /v1/tasks/{id}) */
    struct mg_tasks_s *tasks;   /* owned: async task records */
    struct mg_idem_s *idem;     /* owned: idempotency keys and stored answers */
    struct mg_userrate_s *userrate; /* owned: requests per minute per application user */
    int64_t started_at;         /* unix seconds */
    /* reload state, shown in /status */
    int reloading;
    char reload_result[16];     /* "ok" | "failed" | "none" */
    char reload_error[1024];
    int64_t reload_at;          /* unix seconds */
    uv_work_t reload_work;
    mg_gen_t *reload_gen;       /* built by the worker */
    char reload_err_buf[1024];
    struct waiter_s *waiters_current; /* told when the running reload ends */
    struct waiter_s *waiters_next;    /* told when the next reload ends */
    /* admin requests (admin.c): queued, one on a worker thread at a time */
    struct admin_s *admin_queue;
    struct admin_s *admin_running;
    /* stop */
    int stopping;
    int stopping_hard;          /* closing everything: dispatch no more */
    uv_timer_t drain_timer;
    uint64_t drain_started;     /* loop time of the stop signal */
    uv_signal_t sig_hup, sig_term, sig_int;
    int exit_code;
} mg_server_t;

/* Load the config and the first generation, open the store, bind the listeners.
 * Returns 0, or -1 after printing the reason. */
int mg_server_init(mg_server_t *s, uv_loop_t *loop, const char *config_path);
/* Run the loop until stopped; returns the process exit code. */
int mg_server_run(mg_server_t *s);
/* Build a new generation off the loop thread and swap it in (SIGHUP). */
void mg_server_reload(mg_server_t *s);
/* Build a new generation (config file, policies, adapters, stored providers) that reads the
 * store after this call, swap it in, then call fn(ud, ok, error) on the loop thread. Builds
 * never overlap: a request made while one runs is served by the next. */
typedef void (*mg_rebuild_fn)(void *ud, int ok, const char *err);
void mg_server_rebuild(mg_server_t *s, mg_rebuild_fn fn, void *ud);
/* Stop accepting, let in-flight requests finish up to drain_ms, then close. */
void mg_server_stop(mg_server_t *s);

/* A provider entered cooldown: log it, count it and persist it (writer thread). */
void mg_server_cooldown_applied(mg_server_t *s, const mg_provider_state_t *ps, int consecutive,
                                double seconds, int status);
/* A provider's health state changed: log and persist it. */
void mg_server_health_changed(mg_server_t *s, const mg_provider_state_t *ps);

/* Run the scheduler now: time out expired queued tasks, dispatch what fits. The
 * tasks' callbacks (proxy.c) run from here. */
void mg_server_sched_run(mg_server_t *s);
/* A slot was released: if a task waits, run the scheduler on the next loop turn (never
 * under the caller, which may be deep in a callback chain). */
void mg_server_sched_kick(mg_server_t *s);

/* The scheduler's memory gate of a smaller route with its own memory figures (created on
 * first use), named after its upstream model: routes that serve the same smaller model
 * share its weights. NULL for any other route, or when out of memory. */
mg_sched_gate_t *mg_server_smaller_gate(mg_server_t *s, const mg_route_conf_t *r);

/* Take a reference on the current generation for a new request. */
mg_gen_t *mg_server_gen_acquire(mg_server_t *s);

#endif
