/* metrics: Prometheus text exposition; see metrics.h. */
#include "obs/metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double bucket_le[MG_METRICS_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,   120};

static const double loop_le[MG_LOOP_BUCKETS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                                0.0025,  0.005,  0.01,    0.025,  0.1};

static const char *const ep_names[MG_EP_COUNT] = {"chat",     "completions", "embeddings", "models",
                                                  "messages", "other",       "responses"};

const char *mg_endpoint_name(mg_endpoint_t ep)
{
    return ep < MG_EP_COUNT ? ep_names[ep] : "other";
}

/* ---- the labelled families ----------------------------------------------------------- */

/* The OpenTelemetry GenAI semantic conventions' ExplicitBucketBoundaries. */
static const double genai_tokens_le[14] = {
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864};
static const double genai_duration_le[14] = {0.01, 0.02, 0.04, 0.08,  0.16,  0.32,  0.64,
                                             1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92};
static const double genai_ttft_le[16] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                         0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0};
static const double genai_tpot_le[13] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                         0.3,  0.4,   0.5,  0.75,  1.0, 2.5};

/* the relative error of a byte estimate, (estimate - reported) / reported: signed */
static const double estimate_error_le[14] = {-0.75, -0.5, -0.25, -0.1, -0.05, -0.01, 0,
                                             0.01,  0.05, 0.1,   0.25, 0.5,   1,     2};

#define GENAI_LABELS                                                                               \
    "gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model"

static const mg_family_def_t family_defs[MG_FAM_COUNT] = {
    [MG_FAM_REQUESTS] = {"moongate_requests_total",
                         "Inference requests answered, by application, logical model, priority "
                         "and HTTP status.",
                         MG_FAMILY_COUNTER,
                         4,
                         {"application", "model", "priority", "status"},
                         NULL,
                         0,
                         256},
    [MG_FAM_REQUEST_DURATION] = {"moongate_request_duration_seconds",
                                 "Inference requests: time from the request to the end of its "
                                 "answer.",
                                 MG_FAMILY_HISTOGRAM,
                                 2,
                                 {"application", "model"},
                                 bucket_le,
                                 MG_METRICS_BUCKETS,
                                 64},
    [MG_FAM_QUEUE_TIME] = {"moongate_queue_time_seconds",
                           "Time a task waited for its slot.",
                           MG_FAMILY_HISTOGRAM,
                           2,
                           {"application", "model"},
                           bucket_le,
                           MG_METRICS_BUCKETS,
                           64},
    [MG_FAM_FIRST_TOKEN] = {"moongate_first_token_latency_seconds",
                            "Streams: time from the request to the first upstream byte.",
                            MG_FAMILY_HISTOGRAM,
                            2,
                            {"application", "model"},
                            bucket_le,
                            MG_METRICS_BUCKETS,
                            64},
    [MG_FAM_TOKENS] = {"moongate_tokens_total",
                       "Tokens metered, by direction (input, output).",
                       MG_FAMILY_COUNTER,
                       3,
                       {"application", "model", "direction"},
                       NULL,
                       0,
                       128},
    [MG_FAM_TOKENS_PER_SECOND] = {"moongate_tokens_per_second",
                                  "Output tokens per second after the first token, moving "
                                  "average over the model's recent streams.",
                                  MG_FAMILY_GAUGE,
                                  1,
                                  {"model"},
                                  NULL,
                                  0,
                                  64},
    [MG_FAM_ACTIVE_TASKS] = {"moongate_active_tasks",
                             "Tasks holding a slot now.",
                             MG_FAMILY_GAUGE,
                             2,
                             {"application", "model"},
                             NULL,
                             0,
                             64},
    [MG_FAM_DEGRADATION] = {"moongate_degradation_total",
                            "Answers given by a degraded route (fallback, emergency, smaller, "
                            "cloud), by the model asked for and the model that answered.",
                            MG_FAMILY_COUNTER,
                            3,
                            {"application", "from_model", "to_model"},
                            NULL,
                            0,
                            64},
    [MG_FAM_POLICY_BLOCKED] = {"moongate_policy_blocked_total",
                               "Requests refused before any upstream attempt (authentication, "
                               "admission, rates, quotas), by error code.",
                               MG_FAMILY_COUNTER,
                               2,
                               {"application", "reason"},
                               NULL,
                               0,
                               64},
    [MG_FAM_CANCELLATION] = {"moongate_cancellation_total",
                             "Tasks cancelled, by reason.",
                             MG_FAMILY_COUNTER,
                             2,
                             {"application", "reason"},
                             NULL,
                             0,
                             64},
    [MG_FAM_COST] = {"moongate_cost_total",
                     "Spend metered: tokens at the provider's cost_per_1k_tokens (currency units).",
                     MG_FAMILY_COUNTER,
                     2,
                     {"application", "model"},
                     NULL,
                     0,
                     64},
    [MG_FAM_SC_LATENCY] = {"sidecar_latency_seconds",
                           "Inference requests: time from the request to the end of its answer.",
                           MG_FAMILY_HISTOGRAM,
                           0,
                           {NULL},
                           bucket_le,
                           MG_METRICS_BUCKETS,
                           2},
    [MG_FAM_SC_PROVIDER_REQUESTS] = {"sidecar_provider_requests_total",
                                     "Upstream answers by provider, pool and HTTP status code "
                                     "(none: no answer).",
                                     MG_FAMILY_COUNTER,
                                     3,
                                     {"provider_id", "pool", "status_code"},
                                     NULL,
                                     0,
                                     256},
    [MG_FAM_SC_PROVIDER_LATENCY] = {"sidecar_provider_latency_seconds",
                                    "Upstream attempts: time from sending to the end of the "
                                    "answer.",
                                    MG_FAMILY_HISTOGRAM,
                                    1,
                                    {"provider_id"},
                                    bucket_le,
                                    MG_METRICS_BUCKETS,
                                    64},
    [MG_FAM_GENAI_TOKENS] = {"gen_ai_client_token_usage",
                             "Tokens per request, by token type (OpenTelemetry "
                             "gen_ai.client.token.usage).",
                             MG_FAMILY_HISTOGRAM,
                             5,
                             {GENAI_LABELS, "gen_ai_token_type"},
                             genai_tokens_le,
                             14,
                             128},
    [MG_FAM_GENAI_DURATION] = {"gen_ai_server_request_duration_seconds",
                               "Request duration to the last byte (OpenTelemetry "
                               "gen_ai.server.request.duration).",
                               MG_FAMILY_HISTOGRAM,
                               4,
                               {GENAI_LABELS},
                               genai_duration_le,
                               14,
                               64},
    [MG_FAM_GENAI_TTFT] = {"gen_ai_server_time_to_first_token_seconds",
                           "Time to the first token of successful streams (OpenTelemetry "
                           "gen_ai.server.time_to_first_token).",
                           MG_FAMILY_HISTOGRAM,
                           4,
                           {GENAI_LABELS},
                           genai_ttft_le,
                           16,
                           64},
    [MG_FAM_GENAI_TPOT] = {"gen_ai_server_time_per_output_token_seconds",
                           "Time per output token after the first of successful streams "
                           "(OpenTelemetry gen_ai.server.time_per_output_token).",
                           MG_FAMILY_HISTOGRAM,
                           4,
                           {GENAI_LABELS},
                           genai_tpot_le,
                           13,
                           64},
    [MG_FAM_TOKEN_ESTIMATE_ERROR] = {"moongate_token_estimate_error_ratio",
                                     "Routes of models without a known tokenizer: the relative "
                                     "error of the prompt's byte estimate against the tokens "
                                     "the upstream reported, (estimate - reported) / reported, "
                                     "before learning from that answer.",
                                     MG_FAMILY_HISTOGRAM,
                                     2,
                                     {"provider", "model"},
                                     estimate_error_le,
                                     14,
                                     64},
    [MG_FAM_TOKEN_BPT] = {"moongate_token_estimate_bytes_per_token",
                          "Routes of models without a known tokenizer: the request body's bytes "
                          "per prompt token learned from the upstream's reported usage.",
                          MG_FAMILY_GAUGE,
                          2,
                          {"provider", "model"},
                          NULL,
                          0,
                          64},
};

mg_family_t *mg_metrics_family(mg_metrics_t *m, mg_family_id_t id)
{
    mg_family_bind(&m->fam[id], &family_defs[id]);
    return &m->fam[id];
}

void mg_metrics_free(mg_metrics_t *m)
{
    for (int i = 0; i < MG_FAM_COUNT; i++) mg_family_free(&m->fam[i]);
}

/* The GenAI operation of an endpoint (gen_ai.operation.name's well-known values). */
static const char *genai_operation(mg_endpoint_t ep)
{
    switch (ep) {
    case MG_EP_CHAT: return "chat";
    case MG_EP_COMPLETIONS: return "text_completion";
    case MG_EP_EMBEDDINGS: return "embeddings";
    default: return "other";
    }
}

/* Output tokens per second of one answer, into the model's moving average (1/5 weight). */
static void tokens_per_second(mg_metrics_t *m, const mg_call_obs_t *o)
{
    double gen_s = o->duration_s - o->first_token_s;
    if (o->first_token_s < 0 || gen_s <= 0 || o->completion_tokens < 2 || o->status >= 400) return;
    double rate = (double)(o->completion_tokens - 1) / gen_s;
    mg_series_t *s = mg_family_series(mg_metrics_family(m, MG_FAM_TOKENS_PER_SECOND), &o->model);
    if (s) s->value = s->count++ ? s->value * 0.8 + rate * 0.2 : rate;
}

static void genai_call(mg_metrics_t *m, const mg_call_obs_t *o)
{
    const char *labels[5] = {genai_operation(o->ep), o->provider_kind, o->model, o->upstream_model,
                             "input"};
    int ok = o->status < 400;
    mg_family_observe(mg_metrics_family(m, MG_FAM_GENAI_DURATION), labels, o->duration_s);
    if (!ok) return;
    mg_family_observe(mg_metrics_family(m, MG_FAM_GENAI_TOKENS), labels, (double)o->prompt_tokens);
    if (o->ep != MG_EP_EMBEDDINGS) {
        labels[4] = "output";
        mg_family_observe(mg_metrics_family(m, MG_FAM_GENAI_TOKENS), labels,
                          (double)o->completion_tokens);
    }
    if (o->first_token_s < 0) return;
    mg_family_observe(mg_metrics_family(m, MG_FAM_GENAI_TTFT), labels, o->first_token_s);
    if (o->completion_tokens > 1 && o->duration_s > o->first_token_s)
        mg_family_observe(mg_metrics_family(m, MG_FAM_GENAI_TPOT), labels,
                          (o->duration_s - o->first_token_s) / (double)(o->completion_tokens - 1));
}

void mg_metrics_call(mg_metrics_t *m, const mg_call_obs_t *o)
{
    char status[16];
    snprintf(status, sizeof(status), "%d", o->status);
    const char *req[4] = {o->application, o->model, o->priority, status};
    mg_family_add(mg_metrics_family(m, MG_FAM_REQUESTS), req, 1);
    const char *am[2] = {o->application, o->model};
    mg_family_observe(mg_metrics_family(m, MG_FAM_REQUEST_DURATION), am, o->duration_s);
    mg_family_observe(mg_metrics_family(m, MG_FAM_SC_LATENCY), NULL, o->duration_s);
    if (o->first_token_s >= 0)
        mg_family_observe(mg_metrics_family(m, MG_FAM_FIRST_TOKEN), am, o->first_token_s);
    if (o->attempts > 0) {
        const char *tok[3] = {o->application, o->model, "input"};
        mg_family_add(mg_metrics_family(m, MG_FAM_TOKENS), tok, (double)o->prompt_tokens);
        tok[2] = "output";
        mg_family_add(mg_metrics_family(m, MG_FAM_TOKENS), tok, (double)o->completion_tokens);
        tokens_per_second(m, o);
        mg_family_add(mg_metrics_family(m, MG_FAM_COST), am, o->cost);
    }
    if (o->degraded && o->status < 400) {
        const char *dg[3] = {o->application, o->model, o->upstream_model};
        mg_family_add(mg_metrics_family(m, MG_FAM_DEGRADATION), dg, 1);
    }
    if (o->blocked_reason) {
        const char *bl[2] = {o->application, o->blocked_reason};
        mg_family_add(mg_metrics_family(m, MG_FAM_POLICY_BLOCKED), bl, 1);
    }
    if (o->cancel_reason) {
        const char *cr[2] = {o->application, o->cancel_reason};
        mg_family_add(mg_metrics_family(m, MG_FAM_CANCELLATION), cr, 1);
    }
    if (o->model && o->attempts > 0) genai_call(m, o);
}

void mg_metrics_queue_time_of(mg_metrics_t *m, const char *application, const char *model,
                              double seconds)
{
    mg_metrics_queue_time(m, seconds);
    const char *am[2] = {application, model};
    mg_family_observe(mg_metrics_family(m, MG_FAM_QUEUE_TIME), am, seconds);
}

void mg_metrics_provider_answer(mg_metrics_t *m, const char *provider_id, const char *pool,
                                int status, double seconds)
{
    char code[16] = "none";
    if (status >= 100 && status <= 599) snprintf(code, sizeof(code), "%d", status);
    const char *pr[3] = {provider_id, pool, code};
    mg_family_add(mg_metrics_family(m, MG_FAM_SC_PROVIDER_REQUESTS), pr, 1);
    mg_family_observe(mg_metrics_family(m, MG_FAM_SC_PROVIDER_LATENCY), &provider_id, seconds);
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
    mg_label_escape(dst, size, src);
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
    uint64_t total = 0, errors = 0;
    for (int ep = 0; ep < MG_EP_COUNT; ep++)
        for (int c = 1; c <= 5; c++) {
            total += m->requests[ep][c];
            if (c >= 4) errors += m->requests[ep][c];
        }
    sb_printf(
        b,
        "# HELP sidecar_requests_total Requests answered.\n# TYPE sidecar_requests_total counter\n"
        "sidecar_requests_total %llu\n"
        "# HELP sidecar_errors_total Requests answered with an error status.\n"
        "# TYPE sidecar_errors_total counter\nsidecar_errors_total %llu\n",
        (unsigned long long)total, (unsigned long long)errors);
    sb_printf(b, "# HELP sidecar_token_bucket_available Requests a provider may still be sent "
                 "in the current 60 s window (+Inf: no rpm_limit).\n"
                 "# TYPE sidecar_token_bucket_available gauge\n");
    for (size_t i = 0; i < pool->n; i++) {
        int limit = pool->items[i].limiter.rpm.limit;
        int used = mg_limiter_rpm_used(&pool->items[i].limiter, now);
        if (limit > 0)
            sb_printf(b, "sidecar_token_bucket_available{provider_id=\"%s\"} %d\n",
                      pool->items[i].id, used < limit ? limit - used : 0);
        else
            sb_printf(b, "sidecar_token_bucket_available{provider_id=\"%s\"} +Inf\n",
                      pool->items[i].id);
    }
    sb_printf(b, "# HELP moongate_provider_rpm_limit The provider's rpm_limit (0: none).\n"
                 "# TYPE moongate_provider_rpm_limit gauge\n");
    for (size_t i = 0; i < pool->n; i++)
        sb_printf(b, "moongate_provider_rpm_limit{provider_id=\"%s\"} %d\n", pool->items[i].id,
                  pool->items[i].limiter.rpm.limit);
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
        sb_printf(b, "sidecar_emergency_channel_total{provider_id=\"%s\"} %llu\n",
                  pool->items[i].id, (unsigned long long)pool->items[i].emergency_total);
    sb_printf(b,
              "# HELP sidecar_pool_degradation_total Answers given by a degraded route.\n"
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
    sb_printf(
        b, "# HELP moongate_provider_breaker_open 1 while the provider's circuit breaker is open.\n"
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
    static const char *const names[MG_LISTENER_COUNT] = {"api", "metrics", "admin"};
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
    sb_printf(
        &b,
        "# HELP moongate_http_requests_total Every answer the API listener gave, by endpoint and status class.\n"
        "# TYPE moongate_http_requests_total counter\n");
    for (int ep = 0; ep < MG_EP_COUNT; ep++)
        for (int c = 1; c <= 5; c++)
            if (m->requests[ep][c])
                sb_printf(&b, "moongate_http_requests_total{endpoint=\"%s\",code=\"%dxx\"} %llu\n",
                          ep_names[ep], c, (unsigned long long)m->requests[ep][c]);
    sb_printf(
        &b,
        "# HELP moongate_http_request_duration_seconds Time from request to the end of the response.\n"
        "# TYPE moongate_http_request_duration_seconds histogram\n");
    for (int ep = 0; ep < MG_EP_COUNT; ep++) {
        if (!m->duration_count[ep]) continue;
        char labels[64];
        snprintf(labels, sizeof(labels), "endpoint=\"%s\"", ep_names[ep]);
        histogram(&b, "moongate_http_request_duration_seconds", labels, m->duration_buckets[ep],
                  m->duration_sum[ep], m->duration_count[ep]);
    }
    sb_printf(&b,
              "# HELP moongate_first_token_seconds Time from request to the first upstream byte.\n"
              "# TYPE moongate_first_token_seconds histogram\n");
    histogram(&b, "moongate_first_token_seconds", "", m->ttft_buckets, m->ttft_sum, m->ttft_count);
    sb_printf(&b,
              "# HELP moongate_requests_in_flight Proxied requests being answered.\n"
              "# TYPE moongate_requests_in_flight gauge\nmoongate_requests_in_flight %d\n"
              "# HELP moongate_cancelled_total Requests whose client left before the end.\n"
              "# TYPE moongate_cancelled_total counter\nmoongate_cancelled_total %llu\n"
              "# HELP moongate_stream_errors_total Streams ended by an error event.\n"
              "# TYPE moongate_stream_errors_total counter\nmoongate_stream_errors_total %llu\n"
              "# HELP moongate_reloads_total Configuration reloads, by result.\n"
              "# TYPE moongate_reloads_total counter\n"
              "moongate_reloads_total{result=\"ok\"} %llu\n"
              "moongate_reloads_total{result=\"failed\"} %llu\n"
              "# HELP moongate_generation The Lua generation serving new requests.\n"
              "# TYPE moongate_generation gauge\nmoongate_generation %u\n",
              in_flight, (unsigned long long)m->cancelled_total,
              (unsigned long long)m->stream_errors_total, (unsigned long long)m->reloads_ok,
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
    sb_printf(&b,
              "# HELP moongate_memory_reserved_bytes KV cache reserved by running tasks.\n"
              "# TYPE moongate_memory_reserved_bytes gauge\nmoongate_memory_reserved_bytes %llu\n",
              (unsigned long long)m->memory_reserved_bytes);
    sb_printf(&b, "# HELP moongate_loop_busy_seconds Time the event loop stayed busy in one"
                  " iteration, between two waits for I/O.\n"
                  "# TYPE moongate_loop_busy_seconds histogram\n");
    histogram_with(&b, "moongate_loop_busy_seconds", "", loop_le, MG_LOOP_BUCKETS,
                   m->loop_busy_buckets, m->loop_busy_sum, m->loop_busy_count);
    sb_printf(&b,
              "# HELP moongate_loop_busy_max_seconds Longest busy iteration since start.\n"
              "# TYPE moongate_loop_busy_max_seconds gauge\n"
              "moongate_loop_busy_max_seconds %.6f\n",
              (double)m->loop_busy_max_ns / 1e9);
    render_connections(&b, m);
    render_sidecar(&b, m, pool, now_ms);
    if (b.oom) {
        free(b.buf);
        return -1;
    }
    /* the labelled families, every one with its HELP and TYPE even before its first series */
    mg_buf_t fb = {b.buf, b.len, b.cap};
    int rc = 0;
    for (int i = 0; i < MG_FAM_COUNT; i++) {
        mg_family_t f = m->fam[i];
        f.def = &family_defs[i];
        rc |= mg_family_render(&f, &fb);
    }
    if (rc) {
        free(fb.data);
        return -1;
    }
    *out = fb.data;
    *len = fb.len;
    return 0;
}
