/* otlp: the gateway's spans exported over OTLP/HTTP with JSON bodies (POST {endpoint}/v1/traces,
 * https://opentelemetry.io/docs/specs/otlp/), one span per request with the OpenTelemetry
 * GenAI semantic conventions' attributes (gen_ai.operation.name, gen_ai.system,
 * gen_ai.provider.name, gen_ai.request.model, gen_ai.response.model,
 * gen_ai.usage.input_tokens, gen_ai.usage.output_tokens, error.type, ...), in the trace the
 * client's traceparent named (base/trace.h).
 *
 * The loop only copies a finished request's span into a bounded queue (mg_otlp_push: a
 * malloc and a mutex, never I/O); a thread of the exporter's own takes batches of up to
 * max_batch spans every interval_ms (sooner when a batch is full) and POSTs them with libcurl,
 * a failed batch tried again with backoff (0.5 s doubling to 30 s, max_retries times;
 * 429, 5xx and transport errors only: another 4xx is the collector refusing the data). A full
 * queue drops the new span and counts it; so does a batch that ran out of tries. Header
 * values (credentials) are never logged. */
#ifndef MG_OTLP_H
#define MG_OTLP_H

#include <stdint.h>

#include "conf/observability.h"

typedef struct mg_otlp_s mg_otlp_t;

/* One finished request, as the loop hands it over (copied). */
typedef struct mg_otlp_span_s {
    char trace_id[33], span_id[17], parent_id[17]; /* hex; parent "" when the trace is ours */
    int64_t start_unix_ns, end_unix_ns;
    const char *operation; /* static: "chat", "embeddings", "text_completion", ... */
    char system[32];       /* the provider's adapter ("openai", "ollama", ...); "" unknown */
    char provider[64];     /* the provider id */
    char request_model[128], response_model[128];
    char request_id[48];
    char error_type[48]; /* the error code; "" when it succeeded */
    char path[64];
    int status; /* the HTTP status answered */
    int stream, attempts;
    int64_t input_tokens, output_tokens, tenant_id;
    double ttft_s; /* < 0: none */
} mg_otlp_span_t;

typedef struct mg_otlp_stats_s {
    uint64_t queued;          /* spans waiting now */
    uint64_t exported_total;  /* spans the collector accepted */
    uint64_t dropped_full;    /* spans dropped: the queue was full */
    uint64_t dropped_failed;  /* spans dropped: their batch ran out of tries or was refused */
    uint64_t export_failures; /* failed export attempts (each retry counts) */
} mg_otlp_stats_t;

/* Start the exporter for conf (copied; conf->endpoint must be set). NULL when out of
 * memory or the thread cannot start. */
mg_otlp_t *mg_otlp_start(const mg_otlp_conf_t *conf);
/* Queue a copy of s: 0, or -1 when the queue is full (counted). Any thread. */
int mg_otlp_push(mg_otlp_t *o, const mg_otlp_span_t *s);
/* Send what is queued (one try per batch, bounded by timeout_ms each; the first that fails
 * drops the rest), stop the thread and free everything. NULL is allowed. Blocks: call once the loop
 * has ended. */
void mg_otlp_stop(mg_otlp_t *o);
void mg_otlp_stats(mg_otlp_t *o, mg_otlp_stats_t *out);
/* The export body of n spans (OTLP JSON) into a malloc'd string (the caller frees it), NULL
 * when out of memory. For the exporter and its tests. */
char *mg_otlp_body(const mg_otlp_span_t *const *spans, int n, const char *service_name);

#endif
