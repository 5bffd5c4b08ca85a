/* metrics: counters and histograms kept on the loop thread, rendered in the
 * Prometheus text format (version 0.0.4) on the metrics listener.
 *
 * Three name sets: moongate_* (the gateway's own, the edge PRD's 3.9.1 families among them,
 * labelled application/model/priority), sidecar_* (the Sidecar ADR's section 13 and 11.4)
 * and gen_ai_* (the OpenTelemetry GenAI semantic conventions' histograms with the spec's
 * bucket bounds). Labelled families keep their series in bounded tables (obs/family.h):
 * excess label values fold into "_other". */
#ifndef MG_METRICS_H
#define MG_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/accept.h"
#include "obs/family.h"
#include "net/endpoint.h"
#include "route/pool.h"

/* The listeners whose connections are counted. */
typedef enum {
    MG_LISTENER_API = 0,
    MG_LISTENER_METRICS,
    MG_LISTENER_ADMIN, /* server.admin_listen, when set */
    MG_LISTENER_COUNT
} mg_listener_id_t;

#define MG_METRICS_BUCKETS 14
#define MG_LOOP_BUCKETS 10 /* event-loop busy stretches: 50 us .. 100 ms */

/* The labelled families (their definitions are in metrics.c). */
typedef enum {
    MG_FAM_REQUESTS = 0,         /* moongate_requests_total{application,model,priority,status} */
    MG_FAM_REQUEST_DURATION,     /* moongate_request_duration_seconds{application,model} */
    MG_FAM_QUEUE_TIME,           /* moongate_queue_time_seconds{application,model} */
    MG_FAM_FIRST_TOKEN,          /* moongate_first_token_latency_seconds{application,model} */
    MG_FAM_TOKENS,               /* moongate_tokens_total{application,model,direction} */
    MG_FAM_TOKENS_PER_SECOND,    /* moongate_tokens_per_second{model} */
    MG_FAM_ACTIVE_TASKS,         /* moongate_active_tasks{application,model}: set per scrape */
    MG_FAM_DEGRADATION,          /* moongate_degradation_total{application,from_model,to_model} */
    MG_FAM_POLICY_BLOCKED,       /* moongate_policy_blocked_total{application,reason} */
    MG_FAM_CANCELLATION,         /* moongate_cancellation_total{application,reason} */
    MG_FAM_COST,                 /* moongate_cost_total{application,model} */
    MG_FAM_SC_LATENCY,           /* sidecar_latency_seconds */
    MG_FAM_SC_PROVIDER_REQUESTS, /* sidecar_provider_requests_total{provider_id,pool,status_code} */
    MG_FAM_SC_PROVIDER_LATENCY,  /* sidecar_provider_latency_seconds{provider_id} */
    MG_FAM_GENAI_TOKENS,         /* gen_ai_client_token_usage{...,gen_ai_token_type} */
    MG_FAM_GENAI_DURATION,       /* gen_ai_server_request_duration_seconds */
    MG_FAM_GENAI_TTFT,           /* gen_ai_server_time_to_first_token_seconds */
    MG_FAM_GENAI_TPOT,           /* gen_ai_server_time_per_output_token_seconds */
    MG_FAM_TOKEN_ESTIMATE_ERROR, /* moongate_token_estimate_error_ratio{provider,model} */
    MG_FAM_TOKEN_BPT,            /* moongate_token_estimate_bytes_per_token{provider,model} */
    MG_FAM_COUNT
} mg_family_id_t;

typedef struct mg_metrics_s {
    uv_loop_t *loop;                   /* borrowed: whose clock request durations are measured by */
    uint64_t requests[MG_EP_COUNT][6]; /* by status class 1xx..5xx (index 1..5), 0 = other */
    uint64_t duration_buckets[MG_EP_COUNT][MG_METRICS_BUCKETS];
    double duration_sum[MG_EP_COUNT];
    uint64_t duration_count[MG_EP_COUNT];
    uint64_t ttft_buckets[MG_METRICS_BUCKETS];
    double ttft_sum;
    uint64_t ttft_count;
    uint64_t cancelled_total;
    uint64_t stream_errors_total;
    uint64_t tokens_prompt_total;
    uint64_t tokens_completion_total;
    uint64_t reloads_ok, reloads_failed;
    uint64_t emergency_total; /* attempts through the emergency channel */
    uint64_t cancelled_by[4]; /* cancellations: client_disconnected, request, queued,
                                 client_stalled */
    uint64_t timeouts_by[4];  /* timeouts: queue, first_token, inference, idle */
    uint64_t queue_buckets[MG_METRICS_BUCKETS]; /* time waited for a slot */
    double queue_sum;
    uint64_t queue_count;
    uint64_t memory_reserved_bytes; /* gauge, set when rendering */
    uint64_t degraded_total[5];     /* answers by degradation: fallback, emergency, smaller, cloud,
                                       shorter_output */
    uint64_t cooldown_events_total;
    uint64_t routing_plans[2];    /* plans: from the policy's route(), kept (luavm/keep.h) */
    uint64_t routing_panic_total; /* route steps under the panic rule (too few healthy) */
    uint64_t loop_busy_buckets[MG_LOOP_BUCKETS]; /* busy time per loop iteration (loopstat.h) */
    double loop_busy_sum;
    uint64_t loop_busy_count;
    uint64_t loop_busy_max_ns;
    mg_conn_stats_t conns[MG_LISTENER_COUNT]; /* written by the listeners (net/accept.h) */
    mg_family_t fam[MG_FAM_COUNT]; /* owned series (mg_metrics_free); bound at first use */
} mg_metrics_t;

/* The family `id` of m, bound to its definition. */
mg_family_t *mg_metrics_family(mg_metrics_t *m, mg_family_id_t id);
/* Free the labelled families' series (m stays usable: they are made again when used). */
void mg_metrics_free(mg_metrics_t *m);

/* One inference call at its end, as the labelled families count it. Strings are borrowed
 * for the call; NULL where unknown ("_none" in the labels). */
typedef struct mg_call_obs_s {
    mg_endpoint_t ep;
    const char *application;    /* metadata.application, when configured */
    const char *model;          /* the logical model */
    const char *priority;       /* "P0".."P4" */
    const char *provider_kind;  /* the adapter of the last attempt's provider ("openai", ...) */
    const char *upstream_model; /* the model name the provider was asked for */
    const char *degraded;       /* how the answer was degraded, or NULL */
    const char *cancel_reason;  /* why the call was cancelled, or NULL */
    const char *blocked_reason; /* the error code of a call refused before any attempt
                                   (authentication, admission, rate, quota), or NULL */
    int status;
    int stream;
    int attempts; /* upstream attempts made (0: refused or answered before) */
    double duration_s;
    double first_token_s; /* < 0: no first token (not a stream, or none came) */
    long long prompt_tokens, completion_tokens; /* counted only for calls that reached an
                                                   upstream */
    double cost; /* the tokens at the provider's cost_per_1k_tokens */
} mg_call_obs_t;
void mg_metrics_call(mg_metrics_t *m, const mg_call_obs_t *o);
/* The time a call of (application, model) waited for its slot (and the unlabelled sum). */
void mg_metrics_queue_time_of(mg_metrics_t *m, const char *application, const char *model,
                              double seconds);
/* One upstream attempt's end: its HTTP status (0: no answer) and how long it took. */
void mg_metrics_provider_answer(mg_metrics_t *m, const char *provider_id, const char *pool,
                                int status, double seconds);

const char *mg_endpoint_name(mg_endpoint_t ep);
void mg_metrics_request(mg_metrics_t *m, mg_endpoint_t ep, int status, double seconds);
void mg_metrics_ttft(mg_metrics_t *m, double seconds);

typedef enum {
    MG_CANCEL_CLIENT = 0,
    MG_CANCEL_REQUEST,
    MG_CANCEL_QUEUED,
    MG_CANCEL_CLIENT_STALLED, /* the client took nothing of its answer for write_timeout_ms */
} mg_cancel_reason_t;
typedef enum {
    MG_TIMEOUT_QUEUE = 0,
    MG_TIMEOUT_FIRST_TOKEN,
    MG_TIMEOUT_INFERENCE,
    MG_TIMEOUT_IDLE
} mg_timeout_layer_t;
void mg_metrics_queue_time(mg_metrics_t *m, double seconds);
/* One event-loop iteration that kept the loop busy for `ns` nanoseconds. */
void mg_metrics_loop_busy(mg_metrics_t *m, uint64_t ns);

/* Count an answer given through a degraded route ("fallback", "emergency", "smaller", "cloud")
 * or with an output ceiling lowered by memory admission ("shorter_output"). */
void mg_metrics_degraded(mg_metrics_t *m, const char *kind);

/* Render everything (now_ms: loop time for windows and cooldowns); *out is malloc'd
 * (caller frees). Returns 0 or -1. */
int mg_metrics_render(const mg_metrics_t *m, mg_pool_t *pool, int in_flight, unsigned generation,
                      uint64_t now_ms, char **out, size_t *len);

#endif
