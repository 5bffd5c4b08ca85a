/* server: the composition root: the process's parts made, wired to each other through the
 * narrow contexts each module declares, started, reloaded on SIGHUP and stopped on
 * SIGTERM. One mg_server_t is created in main() and passed explicitly; no module below
 * includes this header. */
#ifndef MG_SERVER_H
#define MG_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "admin/admin.h"
#include "api/api.h"
#include "base/memtrim.h"
#include "luavm/gens.h"
#include "net/http.h"
#include "obs/loopstat.h"
#include "obs/metrics.h"
#include "obs/usage.h"
#include "pipeline/idem.h"
#include "pipeline/pipeline.h"
#include "pipeline/tasks.h"
#include "route/pool.h"
#include "route/probe.h"
#include "route/upmodels.h"
#include "sched/pump.h"
#include "sched/sched.h"
#include "store/store.h"
#include "tenancy/auth.h"
#include "tenancy/userrate.h"
#include "upstream/upstream.h"

typedef struct mg_server_s {
    uv_loop_t *loop;
    char *config_path;       /* owned */
    mg_gens_t gens;          /* the current generation */
    mg_listener_t listener;  /* server.listen */
    mg_listener_t metrics_l; /* server.metrics_listen */
    int metrics_on;
    mg_listener_t admin_l; /* server.admin_listen */
    int admin_on;
    mg_upstream_t *upstream; /* owned */
    mg_prober_t *prober;     /* owned: active health and load probes */
    mg_upmodels_t *upmodels; /* owned: the model lists of providers with a model_prefix */
    mg_store_t *store;       /* owned */
    struct mg_pg_s *pg;      /* owned: cluster.postgres's client, NULL: none */
    mg_upkeep_t *upkeep;     /* owned, may be NULL: the database's housekeeping thread */
    mg_auth_t *auth;         /* owned: customer keys, projects and their quotas */
    mg_pool_t pool;          /* provider runtime state */
    mg_sched_t *sched;       /* owned: priority queue and execution slots */
    mg_pump_t pump;          /* runs the scheduler on the loop */
    mg_metrics_t metrics;
    mg_loopstat_t loopstat;            /* the loop's busy time per iteration, into metrics */
    mg_memtrim_t memtrim;              /* malloc_trim after bursts of freed client output */
    uv_prepare_t gc_prepare;           /* Lua collections between requests, once per iteration */
    mg_userrate_t *userrate;           /* owned: requests per minute per application user */
    mg_idem_t *idem;                   /* owned: idempotency keys and stored answers */
    struct mg_resp_store_s *responses; /* owned: stored Responses (/v1/responses) */
    mg_tasks_t *tasks;                 /* owned: async task records */
    mg_sessions_t *sessions;           /* owned: server-side conversations */
    mg_admin_t *admin;                 /* owned: the admin API */
    struct mg_redis_s *redis;          /* owned, NULL without cluster.redis (cluster/redis.h) */
    struct mg_shared_s *shared;        /* owned: the limits shared through it (cluster/limits.h) */
    struct mg_redis_s *redis_sub;      /* owned: the cooldown channel's listening connection */
    struct mg_cidem_s *cidem;          /* owned: idempotency keys shared through redis */
    struct mg_control_s *control;      /* owned: the control plane through cluster.postgres */
    struct mg_csamples_s *samples;     /* owned: health samples shared through redis */
    mg_dashboard_t dashboard;          /* the WebUI: files, sessions, live stream */
    mg_recent_t recent;                /* the last finished requests, for the dashboard */
    mg_otlp_t *otlp;                   /* the OTLP span exporter; NULL: observability.otlp unset */
    mg_fulllog_t fulllog;              /* the full-mode logging window (obs/fulllog.h) */
    mg_pipeline_t pipeline;            /* inference requests and the calls in flight */
    mg_calib_t calib;                  /* bytes per token learned per route (pipeline/calib.h) */
    mg_api_t api;                      /* the listeners' handlers */
    mg_proc_status_t proc;             /* what /status says of the process */
    /* reloads: one at a time; one more when asked while one runs (the last ask wins) */
    int reloading;
    int reload_again; /* a SIGHUP or a rebuild came while one ran */
    uv_work_t reload_work;
    mg_gen_t *reload_gen; /* built by the worker */
    char reload_err_buf[1024];
    struct waiter_s *waiters_current; /* told when the running reload ends */
    struct waiter_s *waiters_next;    /* told when the next reload ends */
    /* stop */
    int stopping_hard; /* closing everything: dispatch no more */
    uv_timer_t drain_timer;
    mg_usage_pruner_t usage_pruner; /* old usage events out (obs/usage.h) */
    uint64_t drain_started;         /* loop time of the stop signal */
    uv_signal_t sig_hup, sig_term, sig_int, sig_usr1;
    int exit_code;
} mg_server_t;

/* Load the config and the first generation, open the store, bind the listeners.
 * Returns 0, or -1 after printing the reason. */
int mg_server_init(mg_server_t *s, uv_loop_t *loop, const char *config_path);
/* Run the loop until stopped; returns the process exit code. */
int mg_server_run(mg_server_t *s);
/* Build a new generation off the loop thread and swap it in (SIGHUP). A reload asked for
 * while one runs is done once it ends, so the last request always wins. */
void mg_server_reload(mg_server_t *s);
/* Build a new generation (config file, policies, adapters, stored providers) that reads the
 * store after this call, swap it in, then call fn(ud, ok, error) on the loop thread (an
 * mg_rebuild_fn with ud = the server). */
void mg_server_rebuild(void *server, mg_rebuild_done_fn fn, void *ud);
/* Stop accepting, let in-flight requests finish up to drain_ms, then close. */
void mg_server_stop(mg_server_t *s);

#endif
