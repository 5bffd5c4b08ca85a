/* probe: active health probes and engine-load probes for providers.
 *
 * Health probe (PRD issue 3, ADR 4.1): every health.probe_interval_ms, for each
 * provider that is not disabled (when health.probes is on), GET base_url + the
 * adapter's probe_path (openai: /models) with the provider's bearer key and a
 * health.probe_timeout_ms time-out. The probe succeeds when the answer is 2xx and
 * its body is a JSON object or array; HTML, garbage, other statuses, time-outs and
 * connect errors are failures. The result feeds the provider's passive health and
 * its circuit breaker, so a provider that is down and gets no traffic comes back.
 * A healthy provider is first probed one interval after start-up (or after it
 * first appears); one restored as degraded or down is probed at once.
 *
 * Load probe: every health.load_interval_ms, for each provider with an engine
 * (provider.engine), read what the engine says about its own load and write it to
 * the provider state (mg_engine_load_t), where the routing policy sees it:
 *   vllm      GET {origin}/metrics (Prometheus text): vllm:num_requests_running,
 *             vllm:num_requests_waiting (summed over label sets) and
 *             vllm:kv_cache_usage_perc / vllm:gpu_cache_usage_perc (a 0..1 fraction
 *             despite the name; the largest over label sets).
 *   llamacpp  GET {origin}/metrics (needs llama-server --metrics):
 *             llamacpp:requests_processing, llamacpp:requests_deferred and, where the
 *             version has it, llamacpp:kv_cache_usage_ratio. When /metrics is not
 *             available, GET {origin}/slots instead: running = slots with
 *             is_processing true (or a non-zero "state" in older versions); waiting 0
 *             (slots do not show the deferred queue); KV-cache unknown.
 *   triton    GET {scheme}://{host}:8002/metrics (Triton serves its Prometheus text on a
 *             port of its own): nv_inference_pending_request_count summed over models
 *             (waiting) and, with the TensorRT-LLM backend, nv_trt_llm_request_metrics
 *             (running: "scheduled"; "active" beyond it wait too) and
 *             nv_trt_llm_kv_cache_block_metrics (kv_cache: "fraction", else used / max).
 *   provider.metrics_url, when set, is where vllm, llamacpp and triton are read instead.
 *   ollama    GET {origin}/api/ps: running = number of models loaded. Ollama exposes
 *             no queue depth or request count, so waiting is 0 and KV-cache unknown;
 *             the signal only says whether (and how many) models are resident.
 * origin = scheme://host[:port] of base_url (base_url without its path, e.g. /v1).
 * Load probes run regardless of health.probes (setting engine is the opt-in) and
 * do not touch health. A failed load probe keeps the last reading until it is
 * older than three intervals, then the load becomes unknown again.
 *
 * At most one probe of each kind is in flight per provider; the provider state's
 * probe_in_flight says how many are (0..2) and last_probe_ms when the latest health
 * probe started. Probes never count as requests (no in_flight, no limiter).
 * Bodies are read up to MG_PROBE_MAX_BODY: a longer /models answer counts as
 * healthy when it starts like JSON, a longer load answer is a failure. Failed
 * probes are logged at debug level ("probe failed"); health changes go to the health
 * sink the prober was given (logged and persisted: persist.h). Everything runs on the loop
 * thread. */
#ifndef MG_PROBE_H
#define MG_PROBE_H

#include <stddef.h>

#include <uv.h>

#include "luavm/gens.h"
#include "route/pool.h"
#include "route/probe_parse.h"
#include "upstream/upstream.h"

#define MG_PROBE_MAX_BODY (1024u * 1024u)
#define MG_PROBE_TICK_MS 100

typedef struct mg_prober_s mg_prober_t;

/* What the prober works with, borrowed for its life. */
typedef struct mg_probe_deps_s {
    uv_loop_t *loop;
    mg_pool_t *pool; /* provider state: health, breaker, load */
    mg_gens_t *gens; /* the current generation's providers are probed */
    mg_upstream_t *upstream;
    /* a provider's health state changed */
    void (*health_changed)(void *ud, const mg_provider_state_t *ps);
    void *sink_ud;
} mg_probe_deps_t;

/* Start probing: a timer on d->loop that looks every MG_PROBE_TICK_MS at the current
 * generation's providers and starts the probes that are due, through d->upstream. Returns
 * the prober, or NULL when out of memory (then nothing was started). */
mg_prober_t *mg_probe_start(const mg_probe_deps_t *d);

/* Cancel every probe in flight (no callback of theirs fires afterwards), stop the
 * timer and free the prober once its handle has closed (keep running the loop).
 * Call before mg_upstream_close(). NULL is a no-op; p must not be used after. */
void mg_probe_stop(mg_prober_t *p);

#endif
