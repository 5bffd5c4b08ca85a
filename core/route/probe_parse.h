/* probe_parse: what the probes read in an engine's answer (see probe.h for when they run):
 * whether a health answer is JSON, the origin of a base URL, and the load an engine reports
 * (vLLM's, llama.cpp's and Triton's Prometheus text, llama.cpp's /slots, Ollama's /api/ps). Pure:
 * no loop, no allocation kept, any thread; the input is never trusted (tests/fuzz/fuzz_probe.c). */
#ifndef MG_PROBE_PARSE_H
#define MG_PROBE_PARSE_H

#include <stddef.h>

#include "route/pool.h"

/* Whether body[0..len) is one JSON object or array (surrounding white space
 * allowed, nothing else): the health probe's test of an answer. 1 or 0. */
int mg_probe_body_is_json(const char *body, size_t len);

/* Whether a body cut at the size limit starts like a JSON object or array
 * (first non-white-space byte '{' or '['). 1 or 0. */
int mg_probe_body_looks_json(const char *body, size_t len);

/* Write scheme://host[:port] of url into out (NUL-terminated). Returns 0, or -1
 * when url has no "scheme://" or out is too small. */
int mg_probe_origin(const char *url, char *out, size_t outlen);

/* Parsers of engine answers. Each reads text[0..len) (no NUL needed), never
 * crashes on garbage, and returns 0 and fills running, waiting and kv_cache of
 * *out (kv_cache -1 when the engine does not say), or -1 when the answer does not
 * carry the load (then *out is unchanged). known and at_ms are the caller's.
 * Counts are clamped to 0..1000000000, kv_cache to 0..1; NaN samples are ignored. */

/* vLLM Prometheus text: needs vllm:num_requests_running; waiting 0 when absent. */
int mg_probe_parse_vllm_metrics(const char *text, size_t len, mg_engine_load_t *out);
/* llama.cpp server Prometheus text: needs llamacpp:requests_processing. */
int mg_probe_parse_llamacpp_metrics(const char *text, size_t len, mg_engine_load_t *out);
/* Triton Prometheus text (its metrics port, 8002 by default): needs
 * nv_inference_pending_request_count (waiting, summed over models) or TensorRT-LLM's
 * nv_trt_llm_request_metrics. With TensorRT-LLM, running = request_type "scheduled" (else
 * "active"), and the active requests it did not schedule wait too; kv_cache =
 * nv_trt_llm_kv_cache_block_metrics "fraction" (else used / max). Without it running is 0
 * (Triton has no in-flight gauge) and kv_cache unknown. */
int mg_probe_parse_triton_metrics(const char *text, size_t len, mg_engine_load_t *out);
/* scheme://host:port/metrics of base_url (its own port replaced): where an engine that
 * serves its metrics on a port of their own (Triton: 8002) has them. 0, or -1. */
int mg_probe_metrics_url(const char *base_url, int port, char *out, size_t outlen);
/* llama.cpp server GET /slots: a JSON array of slot objects. */
int mg_probe_parse_llamacpp_slots(const char *json, size_t len, mg_engine_load_t *out);
/* Ollama GET /api/ps: {"models": [...]}. */
int mg_probe_parse_ollama_ps(const char *json, size_t len, mg_engine_load_t *out);

/* One sample of a Prometheus text exposition. */
typedef struct mg_prom_sample_s {
    const char *name; /* metric name, not NUL-terminated */
    size_t name_len;
    const char *labels; /* the text between { and }, or NULL */
    size_t labels_len;
    double value;
} mg_prom_sample_t;

/* Call fn(ud, sample) for each well-formed sample line of text[0..len), in order;
 * comments, blank and malformed lines are skipped. Returns the number of samples. */
size_t mg_probe_prom_scan(const char *text, size_t len,
                          void (*fn)(void *ud, const mg_prom_sample_t *sample), void *ud);

#endif
