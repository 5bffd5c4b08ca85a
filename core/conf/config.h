/* config: the YAML configuration file turned into a validated mg_config_t.
 *
 * The runtime never sees YAML: mg_config_load() reads the file, expands ${ENV}
 * references in scalar values, checks every field and either returns a complete
 * config or an error naming the file, the line and the reason. The same function
 * guards start-up, `moongate --check` and SIGHUP reloads. */
#ifndef MG_CONFIG_H
#define MG_CONFIG_H

#include "conf/billing.h"
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "conf/dashboard.h"
#include "conf/usage.h"
#include "conf/context.h"
#include "conf/cluster.h"
#include "conf/observability.h"
#include "conf/protocols.h"

#define MG_DEFAULT_LISTEN "127.0.0.1:9190"
#define MG_DEFAULT_METRICS_LISTEN "127.0.0.1:9191"
#define MG_DEFAULT_MAX_BODY_BYTES (16u * 1024u * 1024u)
/* the answer's tokens assumed for admission (TPM, spend) when a request sets no max_tokens */
#define MG_DEFAULT_OUTPUT_ESTIMATE 256

typedef struct mg_provider_conf_s {
    char *id;       /* owned; unique across providers */
    char *adapter;  /* owned; file name in adapters/ without .lua */
    char *base_url; /* owned; no trailing slash */
    char *api_key;  /* owned, may be NULL; secret: never log */
    char *pool;     /* owned; "main" or "fallback" */
    int rpm_limit;  /* requests per minute, 0 = unlimited */
    int tpm_limit;  /* tokens per minute, 0 = unlimited */
    double weight;  /* routing weight, default 1.0 */
    bool local;     /* counts as on-device for routing.local_only */
    char
        *engine; /* owned, may be NULL: "vllm" | "llamacpp" | "ollama" | "triton" for load probes */
    char *metrics_url;  /* owned, may be NULL: where the engine's Prometheus load metrics are */
    char *model_prefix; /* owned, may be NULL: also serves any model name starting with this
                           that is not a logical model ("" = every such name), passed as is */
    char *source;       /* owned: "file", "env" (the Sidecar V1 provider) or "db" (added
                           through the admin API, stored encrypted in the store) */
    char *name;         /* owned, may be NULL (= id): the operator's label */
    bool disabled;      /* taken out of routing by an operator (db providers only) */
    double cost_per_1k_tokens; /* currency units per 1,000 tokens, for spend metering */
    bool no_stream_usage;      /* stream_usage: false: the upstream refuses stream_options, so the
                                  gateway never asks it for a usage chunk (counts are its own) */
    unsigned forward;          /* MG_FORWARD_* bits: request members the gateway reads that this
                                  upstream gets too (forward: [metadata]; default: metadata for
                                  api.openai.com, where it is an OpenAI parameter, none elsewhere) */
    int line;                  /* line of the provider's entry in the file */
} mg_provider_conf_t;

#define MG_FORWARD_METADATA 1u /* the body's metadata */

/* The forward bits a provider has when its config does not say. */
unsigned mg_provider_forward_default(const char *base_url);

typedef struct mg_route_conf_s {
    char *provider;     /* owned; a provider id */
    int provider_hint;  /* where that id most likely is in cfg->providers (mg_config_link_routes):
                           checked before use, so a stale or unset hint only costs a search */
    const void *linked; /* &cfg->providers[provider_hint] when linked: while the array has not
                           moved the hint needs no check (providers are only ever appended) */
    char *model;        /* owned; the upstream model name */
    size_t slot;        /* the route's place among all routes of all models, in model and route
                           order (mg_config_link_routes): the pool finds its state by it */
    bool smaller;       /* a smaller model: used only with routing.allow_smaller_model */
    int priority;       /* route group, lower first (default 0) */
    /* a smaller route's own memory figures (0 = none): memory admission may move a task
       that does not fit the model's figures here (the model's apply to other routes) */
    long long weight_bytes;
    long long kv_cache_per_token_bytes;
    int context_window; /* this route's own window when smaller than the model's (a fallback
                           on a smaller engine); 0: the model's */
    int line;
} mg_route_conf_t;

typedef struct mg_model_conf_s {
    char *name;                         /* owned; the logical model name clients use */
    int max_concurrency;                /* running tasks of this model at once, 0 = no own limit */
    long long weight_bytes;             /* device memory its weights take while loaded */
    long long kv_cache_per_token_bytes; /* KV cache per token: a task reserves this x
                                           (input + max output tokens) while it runs */
    mg_route_conf_t *routes;            /* owned array */
    size_t n_routes;
    int line;
    bool stored;           /* added through the admin API (models.h), not the file */
    int tokenizer;         /* 1 + the encoding its prompts are counted with (token/encoding.h:
                              models.<name>.tokenizer, default by the first route's upstream
                              model family); 0: none known, estimated from the bytes */
    int context_window;    /* tokens the model sees at most (prompt + answer); 0: unknown */
    int max_output_tokens; /* the output reserve when a request sets no max_tokens; 0: none */
} mg_model_conf_t;

/* server.cors: which web origins may call the client API (/v1/) from a browser. Off (no
 * origin) by default; the admin API never answers cross-origin. */
typedef struct mg_cors_conf_s {
    char **origins; /* owned: exact origins ("https://app.example.com"), or "*" */
    size_t n_origins;
    bool allow_credentials; /* Access-Control-Allow-Credentials (never with "*"), default false */
    int max_age_s;          /* how long a browser keeps a preflight's answer, default 600 */
} mg_cors_conf_t;

typedef struct mg_timeouts_conf_s {
    int connect_ms;        /* upstream TCP/TLS connect, default 5000 */
    int first_byte_ms;     /* request sent -> first response byte, default 60000 */
    int idle_ms;           /* gap between upstream bytes while streaming, default 30000 */
    int total_ms;          /* whole upstream exchange, default 600000 */
    int header_read_ms;    /* client must send complete headers within, default 10000 */
    int keepalive_idle_ms; /* idle client keep-alive connection closed after, default 75000 */
    int drain_ms;          /* graceful stop waits this long for in-flight requests, default 30000 */
    int queue_ms;          /* a task waits in the scheduler's queue at most, default 30000 */
    /* what a request's own `timeouts` may raise the limits to (a request may always ask for
       less); 0 in the file = the limit itself, so raising is the operator's opt-in */
    int max_queue_ms;      /* for timeouts.queue_ms */
    int max_first_byte_ms; /* for timeouts.first_token_ms */
    int max_total_ms;      /* for timeouts.inference_ms and total_ms */
} mg_timeouts_conf_t;

typedef struct mg_routing_conf_s {
    bool local_first;           /* local providers before cloud ones, default true */
    int queue_timeout_ms;       /* wait for a rate-limit token at most this long, default 30000
                                   (SIDECAR_QUEUE_TIMEOUT seconds overrides the default) */
    double emergency_rpm_ratio; /* share of rpm_limit the emergency channel may use, default 0.1 */
    bool allow_smaller_model;   /* smaller routes for requests that do not say, default false */
    double panic_threshold;     /* below this share of a model's routes healthy (not down),
                                   its down routes count as available too (Envoy's panic
                                   mode: better a try than a refusal), default 0.5, 0 = never */
} mg_routing_conf_t;

typedef struct mg_scheduler_conf_s {
    int max_running_tasks;       /* tasks dispatched at once, default 256 */
    int max_queued_tasks;        /* default 500 (SIDECAR_QUEUE_MAX overrides the default) */
    int priority_aging_seconds;  /* a waiting task gains one level per this, default 30 */
    int reserved_realtime_slots; /* of max_running_tasks, usable by P0 only, default 2 */
    int overflow_status;         /* 429 (default) or 503 for a full queue */
    int weights[5];              /* weighted fair queueing, P0..P4, default 100 50 25 10 1 */
    double level_threshold[3];   /* backpressure levels, default 0.70 0.85 0.95 */
    long long vram_bytes;        /* device memory for admission, 0 = no memory admission */
    double safety_margin_ratio;  /* of vram_bytes kept free, default 0.08 */
    int min_output_tokens;       /* memory admission shortens max_tokens to what fits, not
                                    below this, before it makes a task wait; default 256,
                                    0 = never shorten */
} mg_scheduler_conf_t;

typedef struct mg_breaker_conf_s {
    int consecutive_failures;    /* opens after this many in a row, default 3 */
    double error_rate_threshold; /* or this error rate ... default 0.1 */
    int min_requests;            /* ... over at least this many requests, default 10 */
    int window_seconds;          /* ... in this window, default 60 */
    int open_duration_seconds;   /* stays open this long, default 30 */
    int half_open_max_requests;  /* probes let through when half open, default 1 */
} mg_breaker_conf_t;

typedef struct mg_health_conf_s {
    bool probes;           /* active probes on, default true */
    int probe_interval_ms; /* GET {base_url}/models every ..., default 60000 */
    int probe_timeout_ms;  /* default 10000 */
    int load_interval_ms;  /* engine load (vLLM /metrics, llama.cpp /slots, Ollama /api/ps), default
                              5000 */
    int retry_down_ms;     /* a provider down by passive health gets one real request this
                              often (half open), default 30000, 0 = only probes bring it back */
} mg_health_conf_t;

/* An application (edge PRD 3.2.2): what its requests may do and how many may run. */
typedef struct mg_app_conf_s {
    char *name;                  /* owned; metadata.application in requests */
    int max_running_tasks;       /* 0 = no own limit */
    int max_queued_tasks;        /* 0 = no own limit */
    unsigned allowed_priorities; /* bit n = Pn allowed; all when the key is absent */
    bool has_data_policy;        /* data_policy given: cloud only with data_policy.allow_cloud */
    bool allow_cloud;
    char **allowed_models; /* owned list of logical model names; NULL = every model */
    size_t n_allowed_models;
    char *identity_notes;     /* owned, may be NULL: its requests' identity and permission
                                 notes (pipeline/notes.h), before the request's own */
    char *output_constraints; /* owned, may be NULL: the same for output constraints */
    int line;
    bool stored; /* added through the admin API (apps.h), not the file */
} mg_app_conf_t;

typedef struct mg_config_s {
    char *path;                     /* owned; file the config came from */
    char *listen;                   /* owned; "host:port" (port 0 = any free port) */
    char *metrics_listen;           /* owned, may be NULL = no metrics listener */
    char *admin_listen;             /* owned, may be NULL = the admin API and dashboard on listen */
    size_t max_body_bytes;          /* request body limit, default 16 MiB */
    size_t max_header_bytes;        /* request line + headers limit, default 16 KiB */
    int request_read_ms;            /* a client request, head and body, within, default 60000 */
    int min_body_bytes_per_s;       /* a body's average rate after timeouts.header_read_ms of grace,
                                       default 1024, 0 = no rate check */
    int write_timeout_ms;           /* no progress writing to a client this long closes it, default
                                       30000, 0 = never */
    int max_connections;            /* client connections on server.listen, default 0 = what the
                                       file descriptor limit allows */
    int reserved_connections;       /* more past max_connections for /api/v2, /health, /ready and
                                       /status, and the metrics listener's cap, default 16 */
    mg_cors_conf_t cors;            /* server.cors: browsers on other origins calling /v1/ */
    mg_dashboard_conf_t dashboard;  /* dashboard: the WebUI (conf/dashboard.h) */
    char *storage_path;             /* owned; SQLite file, default data/moongate.db */
    int storage_queue_max;          /* writes waiting for the store's writer at most
                                       (storage.queue_max), default 4096 */
    bool storage_synchronous_full;  /* storage.synchronous: full (fsync every commit: survives
                                       power loss) or normal (the default: survives a crash) */
    int storage_checkpoint_minutes; /* storage.checkpoint_minutes: WAL truncated every N
                                       minutes (0: never), default 60 */
    int storage_integrity_hours;    /* storage.integrity_check_hours (0: never), default 24 */
    int storage_journal_mib;        /* storage.usage_journal_mib: the usage journal's ring,
                                       default 4 (~10,000 events) */
    char *storage_backup_dir;       /* owned, may be NULL: storage.backup.dir (no backups) */
    int storage_backup_every_hours; /* storage.backup.every_hours, default 24 */
    int storage_backup_keep_days;   /* storage.backup.keep_days, default 7 */
    char *tokenizer_data_dir;       /* owned, may be NULL: tokenizer.data_dir, where the rank files
                                       are (NULL: token/encoding.h's lookup) */
    bool auth_enabled;              /* default false */
    char *default_application;      /* owned, may be NULL: auth.default_application, the
                                     application of requests that have none of their own (a key
                                     without one; open mode: a body that names none) */
    char *policies_dir; /* owned; default "policies" (relative to the working directory) */
    char *adapters_dir; /* owned; default "adapters" */
    char *lua_dir;      /* owned; default "lua" (the moongate Lua library) */
    char *log_level;    /* owned; "debug" | "info" | "warn" | "error", default "info" */
    bool task_events;   /* log every task state change (log.task_events), default true */
    bool log_text;      /* log.format: text (key=value lines for a terminal); default json */
    char *log_file;     /* owned, may be NULL: log.file, the file the log is appended to
                           instead of stdout (reopened on SIGUSR1; read at start) */
    int tasks_retention_seconds; /* async task records kept this long (tasks.retention_seconds),
                                    default 86400 */
    int idempotency_ttl_seconds; /* a stored answer replays this long (idempotency.ttl_seconds),
                                    default 600 */
    int idempotency_max_entries; /* stored answers kept in memory per tenant (auth on) or in
                                    all (auth off), oldest out first; the store keeps the rest
                                    (idempotency.max_entries), default 10000 */
    mg_billing_conf_t billing;   /* billing: the top-up webhook (conf/billing.h) */
    int max_retries;             /* upstream attempts before the first byte, default 3 */
    mg_timeouts_conf_t timeouts;
    mg_context_conf_t context; /* context: sessions and budgets (conf/context.h) */
    mg_cluster_conf_t cluster; /* cluster: node id, Redis, PostgreSQL (conf/cluster.h) */
    mg_observability_conf_t observability; /* observability: OTLP export (conf/observability.h) */
    mg_protocols_conf_t protocols; /* protocols: pings and forwarded headers (conf/protocols.h) */
    mg_routing_conf_t routing;
    mg_scheduler_conf_t scheduler;
    mg_breaker_conf_t breaker;
    mg_health_conf_t health;
    mg_provider_conf_t *providers; /* owned array */
    size_t n_providers;
    mg_model_conf_t *models; /* owned array */
    size_t n_models;
    mg_app_conf_t *apps; /* owned array */
    size_t n_apps;
    int user_max_running_tasks; /* per user (metadata.user_id or "user"), 0 = off */
    int user_max_queued_tasks;
    int user_rpm_limit;    /* requests per minute per user of an application, 0 = off */
    mg_usage_conf_t usage; /* usage: (conf/usage.h) */
    mg_price_t *prices;    /* owned array: prices: and the stored versions (conf/usage.h) */
    size_t n_prices;
} mg_config_t;

/* Load and validate the YAML file at `path`. On success returns 0 and sets *out
 * (caller frees with mg_config_free). On failure returns -1, sets *out to NULL and
 * writes "FILE:LINE: reason" (or "FILE: reason" when no line applies) into err. */
int mg_config_load(const char *path, mg_config_t **out, char *err, size_t err_len);

/* Same as mg_config_load but from a string; `name` is used in error messages. */
int mg_config_parse(const char *name, const char *yaml, size_t len, mg_config_t **out, char *err,
                    size_t err_len);

void mg_config_free(mg_config_t *cfg);

/* Append a copy of tmpl (strings duplicated; NULL adapter = "openai", NULL pool = "main",
 * NULL source = "db") to cfg's providers. Refuses an id that is already taken. Only while
 * the config is private to its builder: it moves the providers array. Returns 0, or -1
 * with the reason in err. */
int mg_config_add_provider(mg_config_t *cfg, const mg_provider_conf_t *tmpl, char *err,
                           size_t err_len);

/* Append m (moved: cfg owns its strings and routes afterwards, *m is zeroed) to cfg's
 * models. Refuses a name that is taken. Only while the config is private to its builder.
 * Returns 0, or -1 with the reason in err (m untouched then). */
int mg_config_add_model(mg_config_t *cfg, mg_model_conf_t *m, char *err, size_t err_len);

/* Append app (moved, like mg_config_add_model) to cfg's applications. 0, or -1 with err. */
int mg_config_add_app(mg_config_t *cfg, mg_app_conf_t *app, char *err, size_t err_len);

/* Free what an application owns (not app itself). */
void mg_app_conf_clear(mg_app_conf_t *app);

/* Whether the application may use logical model `name` (its allowed_models). */
bool mg_app_allows_model(const mg_app_conf_t *app, const char *name);

/* Free what a model owns (not m itself). */
void mg_model_conf_clear(mg_model_conf_t *m);

/* Lookups; return NULL when absent. */
const mg_provider_conf_t *mg_config_provider(const mg_config_t *cfg, const char *id);
const mg_model_conf_t *mg_config_model(const mg_config_t *cfg, const char *name);
const mg_app_conf_t *mg_config_app(const mg_config_t *cfg, const char *name);

/* Set every route's provider_hint and slot, once the providers and models are all there
 * (the request path then finds a route's provider and its state without a search per
 * route). */
void mg_config_link_routes(mg_config_t *cfg);

/* The provider of route r (NULL when cfg has none by that id): at r->provider_hint when
 * the id is there, else by search. */
const mg_provider_conf_t *mg_config_route_provider(const mg_config_t *cfg,
                                                   const mg_route_conf_t *r);

#endif
