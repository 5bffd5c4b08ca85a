/* metrics: counters and histograms kept on the loop thread, rendered in the
 * Prometheus text format (version 0.0.4) on the metrics listener.
 * Every name starts with moongate_. */
#ifndef MG_METRICS_H
#define MG_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "net/accept.h"
#include "net/endpoint.h"
#include "route/pool.h"

/* The listeners whose connections are counted. */
typedef enum { MG_LISTENER_API = 0, MG_LISTENER_METRICS, MG_LISTENER_COUNT } mg_listener_id_t;

#define MG_METRICS_BUCKETS 14
#define MG_LOOP_BUCKETS 10 /* event-loop busy stretches: 50 us .. 100 ms */

typedef struct mg_metrics_s {
    uv_loop_t *loop; /* borrowed: whose clock request durations are measured by */
    uint64_t requests[MG_EP_COUNT][6];      /* by status class 1xx..5xx (index 1..5), 0 = other */
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
    uint64_t emergency_total;          /* attempts through the emergency channel */
    uint64_t cancelled_by[4];          /* cancellations: client_disconnected, request, queued,
                                          client_stalled */
    uint64_t timeouts_by[4];           /* timeouts: queue, first_token, inference, idle */
    uint64_t queue_buckets[MG_METRICS_BUCKETS]; /* time waited for a slot */
    double queue_sum;
    uint64_t queue_count;
    uint64_t memory_reserved_bytes;    /* gauge, set when rendering */
    uint64_t degraded_total[5];        /* answers by degradation: fallback, emergency, smaller, cloud,
                                          shorter_output */
    uint64_t cooldown_events_total;
    uint64_t routing_plans[2];         /* plans: from the policy's route(), kept (luavm/keep.h) */
    uint64_t routing_panic_total;      /* route steps under the panic rule (too few healthy) */
    uint64_t loop_busy_buckets[MG_LOOP_BUCKETS]; /* busy time per loop iteration (loopstat.h) */
    double loop_busy_sum;
    uint64_t loop_busy_count;
    uint64_t loop_busy_max_ns;
    mg_conn_stats_t conns[MG_LISTENER_COUNT]; /* written by the listeners (net/accept.h) */
} mg_metrics_t;

const char *mg_endpoint_name(mg_endpoint_t ep);
void mg_metrics_request(mg_metrics_t *m, mg_endpoint_t ep, int status, double seconds);
void mg_metrics_ttft(mg_metrics_t *m, double seconds);

typedef enum {
    MG_CANCEL_CLIENT = 0,
    MG_CANCEL_REQUEST,
    MG_CANCEL_QUEUED,
    MG_CANCEL_CLIENT_STALLED, /* the client took nothing of its answer for write_timeout_ms */
} mg_cancel_reason_t;
typedef enum { MG_TIMEOUT_QUEUE = 0, MG_TIMEOUT_FIRST_TOKEN, MG_TIMEOUT_INFERENCE, MG_TIMEOUT_IDLE } mg_timeout_layer_t;
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
