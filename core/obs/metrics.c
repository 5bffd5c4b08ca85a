/* metrics: Prometheus text exposition; see metrics.h. */
#include "obs/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double bucket_le[MG_METRICS_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,  120};

static const double loop_le[MG_LOOP_BUCKETS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                                 0.0025,  0.005,  0.01,    0.025,  0.1};

static const char *const ep_names[MG_EP_COUNT] = {"chat", "completions", "embeddings", "models",
                                                   "messages", "other", "responses"};

const char *mg_endpoint_name(mg_endpoint_t ep)
{
    return ep < MG_EP_COUNT ? ep_names[ep] : "other";
}

/* Count one value into cumulative buckets (as rendered): every bucket whose bound holds it.
 * From the top bound down, so that a value past a bound stops the walk. */
static void observe_with(uint64_t *buckets, const double *le, int n_le, double v)
{
    for (int i = n_le - 1; i >= 0 && v <= le[i]; i--) buckets[i]++;
}

static void observe(uint64_t *buckets, double seconds)
{
    observe_with(buckets, bucket_le, MG_METRICS_BUCKETS, seconds);
}

void mg_metrics_request(mg_metrics_t *m, mg_endpoint_t ep, int status, double seconds)
{
    int cls = status / 100;
    if (cls < 1 || cls > 5) cls = 0;
    m->requests[ep][cls]++;
    observe(m->duration_buckets[ep], seconds);
    m->duration_sum[ep] += seconds;
    m->duration_count[ep]++;
}

void mg_metrics_queue_time(mg_metrics_t *m, double seconds)
{
    observe(m->queue_buckets, seconds);
    m->queue_sum += seconds;
    m->queue_count++;
}

void mg_metrics_loop_busy(mg_metrics_t *m, uint64_t ns)
{
    double seconds = (double)ns / 1e9;
    observe_with(m->loop_busy_buckets, loop_le, MG_LOOP_BUCKETS, seconds);
    m->loop_busy_sum += seconds;
    m->loop_busy_count++;
    if (ns > m->loop_busy_max_ns) m->loop_busy_max_ns = ns;
}

void mg_metrics_ttft(mg_metrics_t *m, double seconds)
{
    observe(m->ttft_buckets, seconds);
    m->ttft_sum += seconds;
    m->ttft_count++;
}

typedef struct {
    char *buf;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->oom = 1;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
}

/* src as a Prometheus label value: backslash, double quote and newline escaped (an
 * upstream model name is the operator's free text). */
static void label_value(char *dst, size_t size, const char *src)
{
    size_t n = 0;
    for (; *src && n + 3 < size; src++) {
        if (*src == '\\' || *src == '"' || *src == '\n') dst[n++] = '\\';
        dst[n++] = *src == '\n' ? 'n' : *src;
    }
    dst[n] = '\0';
}

static void histogram_with(sbuf_t *b, const char *name, const char *labels, const double *le,
                           int n_le, const uint64_t *buckets, double sum, uint64_t count)
{
    const char *sep = labels[0] ? "," : "";
    for (int i = 0; i < n_le; i++)
        sb_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, le[i],
                  (unsigned long long)buckets[i]);
    sb_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)count);
    if (labels[0]) {
        sb_printf(b, "%s_sum{%s} %.6f\n", name, labels, sum);
        sb_printf(b, "%s_count{%s} %llu\n", name, labels, (unsigned long long)count);
    } else {
        sb_printf(b, "%s_sum %.6f\n", name, sum);
        sb_printf(b, "%s_count %llu\n", name, (unsigned long long)count);
    }
}

static void histogram(sbuf_t *b, const char *name, const char *labels, const uint64_t *buckets,
                      double sum, uint64_t count)
{
    histogram_with(b, name, labels, bucket_le, MG_METRICS_BUCKETS, buckets, sum, count);
}

static const char *const degraded_kinds[5] = {"fallback", "emergency", "smaller", "cloud",
                                              "shorter_output"};

void mg_metrics_degraded(mg_metrics_t *m, const char *kind)
{
    for (int i = 0; i < 5; i++)
        if (kind && strcmp(kind, degraded_kinds[i]) == 0) m->degraded_total[i]++;
}

/* The Sidecar ADR's metric names (section 13), per provider. */
static void render_sidecar(sbuf_t *b, const mg_metrics_t *m, mg_pool_t *pool, uint64_t now)
{
    static const char *const classes[6] = {"none", "1xx", "2xx", "3xx", "4xx", "5xx"};
    uint64_t total = 0, errors = 0;
    for (int ep = 0; ep < MG_EP_COUNT; ep++)
        for (int c = 1; c <= 5; c++) {
            total += m->requests[ep][c];
            if (c >= 4) errors += m->requests[ep][c];
        }
    sb_printf(b, "# HELP sidecar_requests_total Requests answered.\n# TYPE sidecar_requests_total counter\n"
                 "sidecar_requests_total %llu\n"
                 "# HELP sidecar_errors_total Requests answered with an error status.\n"
                 "# TYPE sidecar_errors_total counter\nsidecar_errors_total %llu\n",
              (unsigned long long)total, (unsigned long long)errors);
    sb_printf(b, "# HELP sidecar_provider_requests_total Upstream answers by provider, pool and status class.\n"
                 "# TYPE sidecar_provider_requests_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        for (int c = 0; c < 6; c++)
            if (pool->items[i].status_counts[c])
                sb_printf(b,
                          "sidecar_provider_requests_total{provider_id=\"%s\",pool=\"%s\",status_code=\"%s\"} %llu\n",
                          pool->items[i].id, pool->items[i].pool, classes[c],
                          (unsigned long long)pool->items[i].status_counts[c]);
    sb_printf(b, "# HELP sidecar_provider_rpm_current Requests sent in the last 60 s.\n"
                 "# TYPE sidecar_provider_rpm_current gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "sidecar_provider_rpm_current{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  mg_limiter_rpm_used(&pool->items[i].limiter, now));
    sb_printf(b, "# HELP sidecar_provider_cooldown_active 1 while the provider cools down.\n"
                 "# TYPE sidecar_provider_cooldown_active gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "sidecar_provider_cooldown_active{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  mg_cooldown_cooling(&pool->items[i].cooldown, now) ? 1 : 0);
    sb_printf(b, "# HELP sidecar_cooldown_events_total Cooldowns applied.\n"
                 "# TYPE sidecar_cooldown_events_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "sidecar_cooldown_events_total{provider_id=\"%s\"} %llu\n", pool->items[i].id,
                  (unsigned long long)pool->items[i].cooldowns_total);
    sb_printf(b, "# HELP sidecar_emergency_channel_total Attempts through the emergency channel.\n"
                 "# TYPE sidecar_emergency_channel_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "sidecar_emergency_channel_total{provider_id=\"%s\"} %llu\n", pool->items[i].id,
                  (unsigned long long)pool->items[i].emergency_total);
    sb_printf(b, "# HELP sidecar_pool_degradation_total Answers given by a degraded route.\n"
                 "# TYPE sidecar_pool_degradation_total counter\n"
                 "sidecar_pool_degradation_total{from_pool=\"main\",to_pool=\"fallback\"} %llu\n"
                 "sidecar_pool_degradation_total{from_pool=\"main\",to_pool=\"emergency\"} %llu\n",
              (unsigned long long)m->degraded_total[0], (unsigned long long)m->degraded_total[1]);
    sb_printf(b, "# HELP moongate_degraded_total Answers by degradation kind.\n"
                 "# TYPE moongate_degraded_total counter\n");
    for (int k = 0; k < 5; k++)
        sb_printf(b, "moongate_degraded_total{kind=\"%s\"} %llu\n", degraded_kinds[k],
                  (unsigned long long)m->degraded_total[k]);
    sb_printf(b, "# HELP moongate_provider_health Provider health: 0 healthy, 1 degraded, 2 down.\n"
                 "# TYPE moongate_provider_health gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "moongate_provider_health{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  (int)pool->items[i].health.state);
    sb_printf(b, "# HELP moongate_provider_health_trials_total Requests sent to a provider while "
                 "it was down, one per health.retry_down_ms.\n"
                 "# TYPE moongate_provider_health_trials_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "moongate_provider_health_trials_total{provider_id=\"%s\"} %llu\n",
                  pool->items[i].id, (unsigned long long)pool->items[i].trials_total);
    sb_printf(b, "# HELP moongate_provider_breaker_open 1 while the provider's circuit breaker is open.\n"
                 "# TYPE moongate_provider_breaker_open gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "moongate_provider_breaker_open{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  mg_breaker_state(&pool->items[i].breaker, now) == MG_BREAKER_OPEN);
    sb_printf(b, "# HELP moongate_route_breaker_open 1 while the circuit breaker of a provider's "
                 "upstream model is open.\n"
                 "# TYPE moongate_route_breaker_open gauge\n");
    for (size_t i = 0; i < pool->routes.n; i++) {
        const mg_route_state_t *r = &pool->routes.items[i];
        char model[256];
        label_value(model, sizeof(model), r->model);
        sb_printf(b, "moongate_route_breaker_open{provider_id=\"%s\",model=\"%s\"} %d\n",
                  r->provider, model, mg_breaker_state(&r->breaker, now) == MG_BREAKER_OPEN);
    }
}

/* The listeners' connections: open, the cap, refusals, accept failures, timeouts. */
static void render_connections(sbuf_t *b, const mg_metrics_t *m)
{
    static const char *const names[MG_LISTENER_COUNT] = {"api", "metrics"};
    static const char *const accept_errors[MG_ACCEPT_ERR_COUNT] = {"EMFILE", "ENFILE", "other"};
    static const char *const read_timeouts[MG_READ_TIMEOUT_COUNT] = {"header_read", "request_read",
                                                                     "min_body_rate"};
    sb_printf(b, "# HELP moongate_connections_open Client connections open, by listener.\n"
                 "# TYPE moongate_connections_open gauge\n");
    for (int i = 0; i < MG_LISTENER_COUNT; i++)
        sb_printf(b, "moongate_connections_open{listener=\"%s\"} %llu\n", names[i],
                  (unsigned long long)m->conns[i].open);
    sb_printf(b, "# HELP moongate_connections_max Connections a listener serves before its "
                 "reserve and refusals (0: no cap).\n"
                 "# TYPE moongate_connections_max gauge\n");
    for (int i = 0; i < MG_LISTENER_COUNT; i++)
        sb_printf(b, "moongate_connections_max{listener=\"%s\"} %llu\n", names[i],
                  (unsigned long long)m->conns[i].max_connections);
    sb_printf(b, "# HELP moongate_connections_refused_total Connections refused past the cap "
                 "(503 and close, or a plain close).\n"
                 "# TYPE moongate_connections_refused_total counter\n");
    for (int i = 0; i < MG_LISTENER_COUNT; i++)
        sb_printf(b, "moongate_connections_refused_total{listener=\"%s\"} %llu\n", names[i],
                  (unsigned long long)m->conns[i].refused);
    sb_printf(b, "# HELP moongate_accept_errors_total accept(2) failures (each pauses accepting "
                 "for 100 ms), by error.\n"
                 "# TYPE moongate_accept_errors_total counter\n");
    for (int i = 0; i < MG_LISTENER_COUNT; i++)
        for (int e = 0; e < MG_ACCEPT_ERR_COUNT; e++)
            sb_printf(b, "moongate_accept_errors_total{listener=\"%s\",error=\"%s\"} %llu\n",
                      names[i], accept_errors[e], (unsigned long long)m->conns[i].accept_errors[e]);
    sb_printf(b, "# HELP moongate_client_timeouts_total Client connections timed out, by what "
                 "they did not do in time.\n"
                 "# TYPE moongate_client_timeouts_total counter\n");
    for (int i = 0; i < MG_LISTENER_COUNT; i++) {
        for (int r = 0; r < MG_READ_TIMEOUT_COUNT; r++)
            sb_printf(b, "moongate_client_timeouts_total{listener=\"%s\",reason=\"%s\"} %llu\n",
                      names[i], read_timeouts[r], (unsigned long long)m->conns[i].read_timeouts[r]);
        sb_printf(b, "moongate_client_timeouts_total{listener=\"%s\",reason=\"write\"} %llu\n",
                  names[i], (unsigned long long)m->conns[i].write_timeouts);
    }
}

int mg_metrics_render(const mg_metrics_t *m, mg_pool_t *pool, int in_flight, unsigned generation,
                      uint64_t now_ms, char **out, size_t *len)
{
    sbuf_t b = {malloc(8192), 0, 8192, 0};
    if (!b.buf) return -1;
    sb_printf(&b, "# HELP moongate_requests_total Client requests answered, by endpoint and status class.\n"
                  "# TYPE moongate_requests_total counter\n");
    for (int ep = 0; ep < MG_EP_COUNT; ep++)
        for (int c = 1; c <= 5; c++)
            if (m->requests[ep][c])
                sb_printf(&b, "moongate_requests_total{endpoint=\"%s\",code=\"%dxx\"} %llu\n",
                          ep_names[ep], c, (unsigned long long)m->requests[ep][c]);
    sb_printf(&b, "# HELP moongate_request_duration_seconds Time from request to the end of the response.\n"
                  "# TYPE moongate_request_duration_seconds histogram\n");
    for (int ep = 0; ep < MG_EP_COUNT; ep++) {
        if (!m->duration_count[ep]) continue;
        char labels[64];
        snprintf(labels, sizeof(labels), "endpoint=\"%s\"", ep_names[ep]);
        histogram(&b, "moongate_request_duration_seconds", labels, m->duration_buckets[ep],
                  m->duration_sum[ep], m->duration_count[ep]);
    }
    sb_printf(&b, "# HELP moongate_first_token_seconds Time from request to the first upstream byte.\n"
                  "# TYPE moongate_first_token_seconds histogram\n");
    histogram(&b, "moongate_first_token_seconds", "", m->ttft_buckets, m->ttft_sum, m->ttft_count);
    sb_printf(&b,
              "# HELP moongate_requests_in_flight Proxied requests being answered.\n"
              "# TYPE moongate_requests_in_flight gauge\nmoongate_requests_in_flight %d\n"
              "# HELP moongate_cancelled_total Requests whose client left before the end.\n"
              "# TYPE moongate_cancelled_total counter\nmoongate_cancelled_total %llu\n"
              "# HELP moongate_stream_errors_total Streams ended by an error event.\n"
              "# TYPE moongate_stream_errors_total counter\nmoongate_stream_errors_total %llu\n"
              "# HELP moongate_tokens_total Tokens metered, by direction.\n"
              "# TYPE moongate_tokens_total counter\n"
              "moongate_tokens_total{direction=\"input\"} %llu\n"
              "moongate_tokens_total{direction=\"output\"} %llu\n"
              "# HELP moongate_reloads_total Configuration reloads, by result.\n"
              "# TYPE moongate_reloads_total counter\n"
              "moongate_reloads_total{result=\"ok\"} %llu\n"
              "moongate_reloads_total{result=\"failed\"} %llu\n"
              "# HELP moongate_generation The Lua generation serving new requests.\n"
              "# TYPE moongate_generation gauge\nmoongate_generation %u\n",
              in_flight, (unsigned long long)m->cancelled_total,
              (unsigned long long)m->stream_errors_total,
              (unsigned long long)m->tokens_prompt_total,
              (unsigned long long)m->tokens_completion_total, (unsigned long long)m->reloads_ok,
              (unsigned long long)m->reloads_failed, generation);
    sb_printf(&b, "# HELP moongate_provider_requests_total Upstream attempts, by provider.\n"
                  "# TYPE moongate_provider_requests_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(&b, "moongate_provider_requests_total{provider_id=\"%s\"} %llu\n",
                  pool->items[i].id, (unsigned long long)pool->items[i].requests_total);
    sb_printf(&b, "# HELP moongate_provider_failures_total Failed upstream attempts, by provider.\n"
                  "# TYPE moongate_provider_failures_total counter\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(&b, "moongate_provider_failures_total{provider_id=\"%s\"} %llu\n",
                  pool->items[i].id, (unsigned long long)pool->items[i].failures_total);
    sb_printf(&b, "# HELP moongate_provider_in_flight Upstream attempts in progress, by provider.\n"
                  "# TYPE moongate_provider_in_flight gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(&b, "moongate_provider_in_flight{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  pool->items[i].in_flight);
    static const char *const cancel_reasons[4] = {"client_disconnected", "request", "queued",
                                                  "client_stalled"};
    static const char *const layers[4] = {"queue", "first_token", "inference", "idle"};
    sb_printf(&b, "# HELP moongate_cancellations_total Tasks cancelled, by reason.\n"
                  "# TYPE moongate_cancellations_total counter\n");
    for (int i = 0; i < 4; i++)
        sb_printf(&b, "moongate_cancellations_total{reason=\"%s\"} %llu\n", cancel_reasons[i],
                  (unsigned long long)m->cancelled_by[i]);
    sb_printf(&b, "# HELP moongate_timeouts_total Timeouts, by layer.\n"
                  "# TYPE moongate_timeouts_total counter\n");
    for (int i = 0; i < 4; i++)
        sb_printf(&b, "moongate_timeouts_total{layer=\"%s\"} %llu\n", layers[i],
                  (unsigned long long)m->timeouts_by[i]);
    sb_printf(&b,
              "# HELP moongate_routing_plans_total Routing plans, by source: the policy's route(), "
              "or a kept plan that held (lua/README.md).\n"
              "# TYPE moongate_routing_plans_total counter\n"
              "moongate_routing_plans_total{source=\"policy\"} %llu\n"
              "moongate_routing_plans_total{source=\"kept\"} %llu\n",
              (unsigned long long)m->routing_plans[0], (unsigned long long)m->routing_plans[1]);
    sb_printf(&b,
              "# HELP moongate_routing_panic_total Routing decisions under the panic rule (fewer "
              "than routing.panic_threshold of a model's routes healthy: down ones tried too).\n"
              "# TYPE moongate_routing_panic_total counter\nmoongate_routing_panic_total %llu\n",
              (unsigned long long)m->routing_panic_total);
    sb_printf(&b, "# HELP moongate_queue_time_seconds Time a task waited for its slot.\n"
                  "# TYPE moongate_queue_time_seconds histogram\n");
    histogram(&b, "moongate_queue_time_seconds", "", m->queue_buckets, m->queue_sum, m->queue_count);
    sb_printf(&b, "# HELP moongate_memory_reserved_bytes KV cache reserved by running tasks.\n"
                  "# TYPE moongate_memory_reserved_bytes gauge\nmoongate_memory_reserved_bytes %llu\n",
              (unsigned long long)m->memory_reserved_bytes);
    sb_printf(&b, "# HELP moongate_loop_busy_seconds Time the event loop stayed busy in one"
                  " iteration, between two waits for I/O.\n"
                  "# TYPE moongate_loop_busy_seconds histogram\n");
    histogram_with(&b, "moongate_loop_busy_seconds", "", loop_le, MG_LOOP_BUCKETS,
                   m->loop_busy_buckets, m->loop_busy_sum, m->loop_busy_count);
    sb_printf(&b, "# HELP moongate_loop_busy_max_seconds Longest busy iteration since start.\n"
                  "# TYPE moongate_loop_busy_max_seconds gauge\n"
                  "moongate_loop_busy_max_seconds %.6f\n",
              (double)m->loop_busy_max_ns / 1e9);
    render_connections(&b, m);
    render_sidecar(&b, m, pool, now_ms);
    if (b.oom) {
        free(b.buf);
        return -1;
    }
    *out = b.buf;
    *len = b.len;
    return 0;
}
