/* fuzz_probe: the parsers of what engines answer to the load probes (core/route/probe.c):
 * vLLM's and llama.cpp's Prometheus text, llama.cpp's /slots and Ollama's /api/ps JSON, the
 * sample scanner under them and the JSON body checks. An engine is not trusted: on any input
 * a parser either leaves its output unchanged (-1) or fills it within the documented bounds
 * (counts 0..1e9, kv_cache -1 or 0..1). The input is not NUL-terminated (copied to a buffer
 * of its exact size, so ASan sees a read past it). A failed check traps. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "route/probe_parse.h"

static void check_load(int rc, const mg_engine_load_t *before, const mg_engine_load_t *after)
{
    if (rc != 0) {
        if (memcmp(before, after, sizeof(*after)) != 0) __builtin_trap(); /* unchanged */
        return;
    }
    if (after->running < 0 || after->running > 1000000000) __builtin_trap();
    if (after->waiting < 0 || after->waiting > 1000000000) __builtin_trap();
    if (isnan(after->kv_cache)) __builtin_trap();
    if (after->kv_cache != -1 && (after->kv_cache < 0 || after->kv_cache > 1)) __builtin_trap();
}

static void count_sample(void *ud, const mg_prom_sample_t *s)
{
    size_t *n = ud;
    if (!s->name || s->name_len == 0) __builtin_trap();
    (*n)++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    int (*parsers[])(const char *, size_t, mg_engine_load_t *) = {
        mg_probe_parse_vllm_metrics, mg_probe_parse_llamacpp_metrics, mg_probe_parse_llamacpp_slots,
        mg_probe_parse_ollama_ps, mg_probe_parse_triton_metrics};
    for (size_t i = 0; i < sizeof(parsers) / sizeof(parsers[0]); i++) {
        mg_engine_load_t before = {
            .known = 7, .running = 3, .waiting = 5, .kv_cache = 0.5, .at_ms = 9};
        mg_engine_load_t after = before;
        check_load(parsers[i](text, size, &after), &before, &after);
    }
    size_t n = 0;
    size_t reported = mg_probe_prom_scan(text, size, count_sample, &n);
    if (reported != n) __builtin_trap();
    int is = mg_probe_body_is_json(text, size), looks = mg_probe_body_looks_json(text, size);
    if (is && !looks) __builtin_trap(); /* a whole JSON value also starts like one */
    free(text);
    return 0;
}
