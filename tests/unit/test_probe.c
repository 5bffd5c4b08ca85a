/* Unit tests for core/route/probe.c's pure parts: the health probe's JSON test, the
 * origin of a base_url, the Prometheus text scanner and the engine-load parsers
 * (vLLM /metrics, llama.cpp /metrics and /slots, Ollama /api/ps) on realistic
 * answers, and all of them on garbage, cut-off and mutated input (they must
 * never crash or read past the given length; run under ASan to check that). */
#include "mgtest.h"
#include "route/probe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Samples                                                                    */

static const char VLLM_METRICS[] =
    "# HELP python_gc_objects_collected_total Objects collected during gc\n"
    "# TYPE python_gc_objects_collected_total counter\n"
    "python_gc_objects_collected_total{generation=\"0\"} 12811.0\n"
    "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
    "# TYPE process_resident_memory_bytes gauge\n"
    "process_resident_memory_bytes 1.234567168e+09\n"
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\"} 3.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\"} 7.0\n"
    "# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.\n"
    "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
    "vllm:num_requests_waiting_by_reason{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\","
    "reason=\"capacity\"} 99.0\n"
    "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:gpu_cache_usage_perc gauge\n"
    "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\"} 0.4213\n"
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE vllm:prompt_tokens_total counter\n"
    "vllm:prompt_tokens_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\"} 123456.0\n"
    "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n"
    "# TYPE vllm:time_to_first_token_seconds histogram\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\","
    "model_name=\"Qwen/Qwen3-8B-AWQ\"} 0.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\","
    "model_name=\"Qwen/Qwen3-8B-AWQ\"} 42.0\n"
    "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"Qwen/Qwen3-8B-AWQ\"} 42.0\n";

/* Newer vLLM (v1 engine, data parallel): kv_cache_usage_perc, two engines, a
 * label value holding a brace, a comma, an escaped quote; a timestamp; CRLF. */
static const char VLLM_METRICS_DP[] =
    "# TYPE vllm:num_requests_running gauge\r\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"we}ird, \\\"name\\\"\"} 2\r\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"we}ird, \\\"name\\\"\"} 4 "
    "1712000000000\r\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1\r\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0\r\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\r\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\r\n"
    "vllm:num_requests_swapped{engine=\"0\"} 3"; /* no final newline */

static const char LLAMA_METRICS[] =
    "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    "# TYPE llamacpp:prompt_tokens_total counter\n"
    "llamacpp:prompt_tokens_total 2048\n"
    "# HELP llamacpp:prompt_seconds_total Prompt process time\n"
    "# TYPE llamacpp:prompt_seconds_total counter\n"
    "llamacpp:prompt_seconds_total 1.5\n"
    "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
    "# TYPE llamacpp:tokens_predicted_total counter\n"
    "llamacpp:tokens_predicted_total 512\n"
    "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\n"
    "llamacpp:kv_cache_usage_ratio 0.125\n"
    "# HELP llamacpp:requests_processing Number of requests processing.\n"
    "# TYPE llamacpp:requests_processing gauge\n"
    "llamacpp:requests_processing 2\n"
    "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
    "# TYPE llamacpp:requests_deferred gauge\n"
    "llamacpp:requests_deferred 5\n";

static const char LLAMA_SLOTS[] =
    "[{\"id\":0,\"id_task\":57,\"n_ctx\":4096,\"speculative\":false,\"is_processing\":true,"
    "\"params\":{\"n_predict\":-1,\"seed\":4294967295,\"temperature\":0.800000011920929,"
    "\"top_k\":40,\"top_p\":0.949999988079071,\"stop\":[],\"stream\":true},"
    "\"prompt\":\"<|im_start|>user\\nhello<|im_end|>\","
    "\"next_token\":{\"has_next_token\":true,\"has_new_line\":false,\"n_remain\":-1,"
    "\"n_decoded\":12,\"stopping_word\":\"\"}},"
    "{\"id\":1,\"id_task\":-1,\"n_ctx\":4096,\"speculative\":false,\"is_processing\":false,"
    "\"params\":{},\"prompt\":\"\",\"next_token\":{\"has_next_token\":true,\"n_decoded\":0}},"
    "{\"id\":2,\"id_task\":58,\"n_ctx\":4096,\"is_processing\":true,\"params\":{}},"
    "{\"id\":3,\"id_task\":-1,\"n_ctx\":4096,\"is_processing\":false,\"params\":{}}]";

/* Older llama.cpp servers: "state": 0 idle, 1 processing. */
static const char LLAMA_SLOTS_OLD[] = "[{\"id\":0,\"state\":1,\"n_ctx\":2048,\"model\":\"m.gguf\"},"
                                      "{\"id\":1,\"state\":0,\"n_ctx\":2048,\"model\":\"m.gguf\"},"
                                      "7, null, \"x\"]";

static const char OLLAMA_PS[] =
    "{\"models\":[{\"name\":\"llama3.2:latest\",\"model\":\"llama3.2:latest\",\"size\":3823012864,"
    "\"digest\":\"a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72\","
    "\"details\":{\"parent_model\":\"\",\"format\":\"gguf\",\"family\":\"llama\","
    "\"families\":[\"llama\"],\"parameter_size\":\"3.2B\",\"quantization_level\":\"Q4_K_M\"},"
    "\"expires_at\":\"2025-01-01T12:05:00.000000000Z\",\"size_vram\":3823012864},"
    "{\"name\":\"nomic-embed-text:latest\",\"model\":\"nomic-embed-text:latest\",\"size\":"
    "577000000,"
    "\"digest\":\"0a109f422b47\",\"details\":{\"format\":\"gguf\",\"family\":\"nomic-bert\"},"
    "\"expires_at\":\"2025-01-01T12:04:00Z\",\"size_vram\":577000000}]}";

static mg_engine_load_t sentinel(void)
{
    mg_engine_load_t l = {.known = 0, .running = -7, .waiting = -7, .kv_cache = -7, .at_ms = 0};
    return l;
}

static int unchanged(const mg_engine_load_t *l)
{
    return l->running == -7 && l->waiting == -7 && l->kv_cache == -7;
}

/* ------------------------------------------------------------------------ */
/* Health probe body, origin                                                  */

static void test_body_is_json(void)
{
    const char *ok[] = {"{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\"}]}",
                        "  []\n", "\r\n{}\t ", "{\"models\":[]}"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        CHECK_EQ_INT(mg_probe_body_is_json(ok[i], strlen(ok[i])), 1);
    const char *bad[] = {"",
                         "   ",
                         "<html><body>Login</body></html>",
                         "<!DOCTYPE html>\n<html>",
                         "{\"a\":1} trailing",
                         "{\"a\":1}{\"b\":2}",
                         "\"just a string\"",
                         "42",
                         "null",
                         "true",
                         "{",
                         "[1,2",
                         "{'a':1}",
                         "OK"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ_INT(mg_probe_body_is_json(bad[i], strlen(bad[i])), 0);
    CHECK_EQ_INT(mg_probe_body_is_json(NULL, 0), 0);
    /* the length is honoured: a valid document followed by bytes not given */
    const char cut[] = "{\"a\":[1,2,3]}<html>";
    CHECK_EQ_INT(mg_probe_body_is_json(cut, 13), 1);
    CHECK_EQ_INT(mg_probe_body_is_json(cut, 12), 0);
    /* control bytes are not JSON's white space (found by fuzz_probe: cJSON skips them) */
    const char nul_lead[] = "\0\0[1]", ctl_lead[] = "\x01{}";
    CHECK_EQ_INT(mg_probe_body_is_json(nul_lead, sizeof(nul_lead) - 1), 0);
    CHECK_EQ_INT(mg_probe_body_is_json(ctl_lead, sizeof(ctl_lead) - 1), 0);
}

static void test_body_looks_json(void)
{
    CHECK_EQ_INT(mg_probe_body_looks_json("  {\"data\":[{\"id\"", 17), 1);
    CHECK_EQ_INT(mg_probe_body_looks_json("\n[1,", 4), 1);
    CHECK_EQ_INT(mg_probe_body_looks_json("<html>", 6), 0);
    CHECK_EQ_INT(mg_probe_body_looks_json("   ", 3), 0);
    CHECK_EQ_INT(mg_probe_body_looks_json("{", 0), 0);
    CHECK_EQ_INT(mg_probe_body_looks_json(NULL, 4), 0);
}

static void test_origin(void)
{
    char o[64];
    CHECK_EQ_INT(mg_probe_origin("http://127.0.0.1:8001/v1", o, sizeof(o)), 0);
    CHECK_STR(o, "http://127.0.0.1:8001");
    CHECK_EQ_INT(mg_probe_origin("http://localhost:11434", o, sizeof(o)), 0);
    CHECK_STR(o, "http://localhost:11434");
    CHECK_EQ_INT(mg_probe_origin("https://api.example.com/openai/v1?x=1", o, sizeof(o)), 0);
    CHECK_STR(o, "https://api.example.com");
    CHECK_EQ_INT(mg_probe_origin("http://[::1]:8080/v1", o, sizeof(o)), 0);
    CHECK_STR(o, "http://[::1]:8080");
    CHECK_EQ_INT(mg_probe_origin("http://h?q", o, sizeof(o)), 0);
    CHECK_STR(o, "http://h");
    CHECK_EQ_INT(mg_probe_origin("127.0.0.1:8001/v1", o, sizeof(o)), -1);
    CHECK_EQ_INT(mg_probe_origin("http:///v1", o, sizeof(o)), -1);
    CHECK_EQ_INT(mg_probe_origin("://h/v1", o, sizeof(o)), -1);
    CHECK_EQ_INT(mg_probe_origin(NULL, o, sizeof(o)), -1);
    char small[8];
    CHECK_EQ_INT(mg_probe_origin("http://long-host-name/v1", small, sizeof(small)), -1);
    char exact[11]; /* "http://abc" + NUL */
    CHECK_EQ_INT(mg_probe_origin("http://abc/v1", exact, sizeof(exact) - 1), -1);
    CHECK_EQ_INT(mg_probe_origin("http://abc/v1", exact, sizeof(exact)), 0);
    CHECK_STR(exact, "http://abc");
}

/* ------------------------------------------------------------------------ */
/* Prometheus scanner                                                         */

typedef struct {
    int n;
    char names[16][64];
    char labels[16][128];
    double values[16];
} seen_t;

static void collect(void *ud, const mg_prom_sample_t *s)
{
    seen_t *v = ud;
    if (v->n >= 16) return;
    snprintf(v->names[v->n], sizeof(v->names[0]), "%.*s", (int)s->name_len, s->name);
    if (s->labels)
        snprintf(v->labels[v->n], sizeof(v->labels[0]), "%.*s", (int)s->labels_len, s->labels);
    else snprintf(v->labels[v->n], sizeof(v->labels[0]), "-");
    v->values[v->n] = s->value;
    v->n++;
}

static void test_prom_scan(void)
{
    const char text[] = "# HELP a_metric help text {with braces}\n"
                        "# TYPE a_metric gauge\n"
                        "a_metric 1\n"
                        "\n"
                        "   b:metric{x=\"1\",y=\"a b\"}   2.5   1712000000\n"
                        "c{} -3e2\n"
                        "d{k=\"}\\\\\"} +Inf\n"
                        "e NaN\n"
                        "broken{x=\"1\" 4\n"
                        "novalue\n"
                        "f 12abc\n"
                        "9starts_with_digit 1\n"
                        "g{x=\"1\"}5\n"
                        "h\t7\r\n";
    seen_t v;
    memset(&v, 0, sizeof(v));
    size_t n = mg_probe_prom_scan(text, strlen(text), collect, &v);
    CHECK_EQ_INT(n, 6);
    CHECK_EQ_INT(v.n, 6);
    CHECK_STR(v.names[0], "a_metric");
    CHECK_STR(v.labels[0], "-");
    CHECK(v.values[0] == 1);
    CHECK_STR(v.names[1], "b:metric");
    CHECK_STR(v.labels[1], "x=\"1\",y=\"a b\"");
    CHECK(v.values[1] == 2.5);
    CHECK_STR(v.names[2], "c");
    CHECK_STR(v.labels[2], "");
    CHECK(v.values[2] == -300);
    CHECK_STR(v.names[3], "d");
    CHECK_STR(v.labels[3], "k=\"}\\\\\"");
    CHECK(v.values[3] > 1e300);
    CHECK_STR(v.names[4], "e");
    CHECK(v.values[4] != v.values[4]); /* NaN */
    CHECK_STR(v.names[5], "h");
    CHECK(v.values[5] == 7);
    CHECK_EQ_INT(mg_probe_prom_scan(NULL, 10, collect, &v), 0);
    CHECK_EQ_INT(mg_probe_prom_scan("", 0, NULL, NULL), 0);
    CHECK_EQ_INT(mg_probe_prom_scan("x 1", 3, NULL, NULL), 1);
}

/* ------------------------------------------------------------------------ */
/* Load parsers                                                               */

static void test_vllm_metrics(void)
{
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(VLLM_METRICS, strlen(VLLM_METRICS), &l), 0);
    CHECK_EQ_INT(l.running, 3);
    CHECK_EQ_INT(l.waiting, 7); /* not the waiting_by_reason series */
    CHECK(l.kv_cache > 0.4212 && l.kv_cache < 0.4214);
    CHECK_EQ_INT(l.known, 0); /* the caller's */

    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(VLLM_METRICS_DP, strlen(VLLM_METRICS_DP), &l), 0);
    CHECK_EQ_INT(l.running, 6); /* summed over engines */
    CHECK_EQ_INT(l.waiting, 1);
    CHECK(l.kv_cache == 0.75); /* the fullest cache */
}

static void test_vllm_metrics_partial(void)
{
    mg_engine_load_t l = sentinel();
    const char only_running[] = "vllm:num_requests_running{model_name=\"m\"} 2\n";
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(only_running, strlen(only_running), &l), 0);
    CHECK_EQ_INT(l.running, 2);
    CHECK_EQ_INT(l.waiting, 0);
    CHECK(l.kv_cache == -1);

    l = sentinel();
    const char no_running[] = "vllm:num_requests_waiting 4\nvllm:gpu_cache_usage_perc 0.5\n";
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(no_running, strlen(no_running), &l), -1);
    CHECK(unchanged(&l));

    /* out-of-range values are clamped; NaN samples ignored */
    l = sentinel();
    const char wild[] = "vllm:num_requests_running -5\n"
                        "vllm:num_requests_running NaN\n"
                        "vllm:num_requests_waiting +Inf\n"
                        "vllm:kv_cache_usage_perc 1.7\n";
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(wild, strlen(wild), &l), 0);
    CHECK_EQ_INT(l.running, 0);
    CHECK_EQ_INT(l.waiting, 1000000000);
    CHECK(l.kv_cache == 1);

    l = sentinel();
    const char negkv[] = "vllm:num_requests_running 2.6\nvllm:gpu_cache_usage_perc -0.1\n";
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(negkv, strlen(negkv), &l), 0);
    CHECK_EQ_INT(l.running, 3); /* rounded */
    CHECK(l.kv_cache == 0);

    /* the length is honoured: the running line lies past it */
    l = sentinel();
    const char *cut = "vllm:num_requests_waiting 1\nvllm:num_requests_running 9\n";
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(cut, 28, &l), -1);
    CHECK(unchanged(&l));
    /* a last line without its newline still counts */
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(cut, strlen(cut) - 1, &l), 0);
    CHECK_EQ_INT(l.running, 9);
}

static void test_llamacpp_metrics(void)
{
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_llamacpp_metrics(LLAMA_METRICS, strlen(LLAMA_METRICS), &l), 0);
    CHECK_EQ_INT(l.running, 2);
    CHECK_EQ_INT(l.waiting, 5);
    CHECK(l.kv_cache == 0.125);
    /* newer servers dropped kv_cache_usage_ratio */
    l = sentinel();
    const char nokv[] = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
    CHECK_EQ_INT(mg_probe_parse_llamacpp_metrics(nokv, strlen(nokv), &l), 0);
    CHECK_EQ_INT(l.running, 1);
    CHECK_EQ_INT(l.waiting, 0);
    CHECK(l.kv_cache == -1);
    /* vLLM's text is not llama.cpp's */
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_llamacpp_metrics(VLLM_METRICS, strlen(VLLM_METRICS), &l), -1);
    CHECK(unchanged(&l));
    /* the 501 body of a server started without --metrics */
    const char e501[] =
        "{\"error\":{\"code\":501,\"message\":\"This server does not support metrics "
        "endpoint. Start it with `--metrics`\",\"type\":\"not_supported_error\"}}";
    CHECK_EQ_INT(mg_probe_parse_llamacpp_metrics(e501, strlen(e501), &l), -1);
}

/* The answer of a server started with --no-slots. */
static const char SLOTS_501[] =
    "{\"error\":{\"code\":501,\"message\":\"This server does not support slots endpoint. Start "
    "it with `--slots`\",\"type\":\"not_supported_error\"}}";

static void test_llamacpp_slots(void)
{
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_llamacpp_slots(LLAMA_SLOTS, strlen(LLAMA_SLOTS), &l), 0);
    CHECK_EQ_INT(l.running, 2);
    CHECK_EQ_INT(l.waiting, 0);
    CHECK(l.kv_cache == -1);
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_llamacpp_slots(LLAMA_SLOTS_OLD, strlen(LLAMA_SLOTS_OLD), &l), 0);
    CHECK_EQ_INT(l.running, 1);
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_llamacpp_slots("[]", 2, &l), 0);
    CHECK_EQ_INT(l.running, 0);
    const char *bad[] = {"{\"slots\":[]}", "<html>", "", "[{\"is_processing\":true}",
                         "null",           SLOTS_501};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        l = sentinel();
        CHECK_EQ_INT(mg_probe_parse_llamacpp_slots(bad[i], strlen(bad[i]), &l), -1);
        CHECK(unchanged(&l));
    }
    CHECK_EQ_INT(mg_probe_parse_llamacpp_slots(NULL, 3, &l), -1);
}

static void test_ollama_ps(void)
{
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_ollama_ps(OLLAMA_PS, strlen(OLLAMA_PS), &l), 0);
    CHECK_EQ_INT(l.running, 2);
    CHECK_EQ_INT(l.waiting, 0);
    CHECK(l.kv_cache == -1);
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_ollama_ps("{\"models\":[]}", 13, &l), 0);
    CHECK_EQ_INT(l.running, 0);
    const char *bad[] = {"{\"models\":null}", "{\"models\":{}}",          "[]", "{}", "<html>", "",
                         "{\"models\":[1,2",  "{\"error\":\"not found\"}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        l = sentinel();
        CHECK_EQ_INT(mg_probe_parse_ollama_ps(bad[i], strlen(bad[i]), &l), -1);
        CHECK(unchanged(&l));
    }
}

/* ------------------------------------------------------------------------ */
/* Garbage                                                                    */

/* Run every parser on buf[0..len) from a heap copy of exactly len bytes, so
 * ASan catches any read past the end. Results do not matter, only survival. */
static void all_parsers(const char *buf, size_t len)
{
    char *copy = malloc(len ? len : 1);
    if (!copy) return;
    if (len) memcpy(copy, buf, len);
    mg_engine_load_t l = sentinel();
    mg_probe_parse_vllm_metrics(copy, len, &l);
    mg_probe_parse_llamacpp_metrics(copy, len, &l);
    mg_probe_parse_llamacpp_slots(copy, len, &l);
    mg_probe_parse_ollama_ps(copy, len, &l);
    mg_probe_parse_triton_metrics(copy, len, &l);
    mg_probe_body_is_json(copy, len);
    mg_probe_body_looks_json(copy, len);
    mg_probe_prom_scan(copy, len, NULL, NULL);
    /* whatever came out is within the documented ranges */
    if (!unchanged(&l)) {
        CHECK(l.running >= 0 && l.running <= 1000000000);
        CHECK(l.waiting >= 0 && l.waiting <= 1000000000);
        CHECK(l.kv_cache == -1 || (l.kv_cache >= 0 && l.kv_cache <= 1));
    }
    free(copy);
}

static uint32_t rng_state = 12345;
static uint32_t rng(void)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return rng_state >> 8;
}

/* A fixture file's text (the tests run from the source tree), or NULL. */
static char *fixture(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *len = buf ? fread(buf, 1, (1 << 16) - 1, f) : 0;
    fclose(f);
    if (buf) buf[*len] = '\0';
    return buf;
}

/* Triton with the TensorRT-LLM backend (tests/fixtures/triton/metrics_trtllm.txt, its metrics
 * port's text): waiting = the models' pending requests + the active ones not scheduled,
 * running = scheduled, kv_cache = used / max blocks (no "fraction" sample there); a
 * "fraction" sample wins; plain Triton: the pending requests only. */
static void test_triton_metrics(void)
{
    size_t n = 0;
    char *text = fixture("tests/fixtures/triton/metrics_trtllm.txt", &n);
    CHECK(text != NULL);
    if (!text) return;
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_triton_metrics(text, n, &l), 0);
    CHECK_EQ_INT(l.running, 6);
    CHECK_EQ_INT(l.waiting, 2 + 3 + (8 - 6));
    CHECK(l.kv_cache > 0.2499 && l.kv_cache < 0.2501); /* 612 / 2448 */
    CHECK_EQ_INT(l.known, 0);
    free(text);

    const char *fraction =
        "nv_trt_llm_request_metrics{model=\"a\",request_type=\"active\",version=\"1\"} 4\n"
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"a\"} 0.5\n"
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\",model=\"b\"} 0.8\n"
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\",model=\"a\"} 1\n"
        "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"a\"} 100\n";
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_triton_metrics(fraction, strlen(fraction), &l), 0);
    CHECK_EQ_INT(l.running, 4); /* no "scheduled": the active ones run */
    CHECK_EQ_INT(l.waiting, 0);
    CHECK(l.kv_cache == 0.8);

    const char *plain = "# TYPE nv_inference_pending_request_count gauge\n"
                        "nv_inference_pending_request_count{model=\"resnet\",version=\"1\"} 5\n"
                        "nv_inference_pending_request_count{model=\"bert\",version=\"2\"} 1\n"
                        "nv_gpu_utilization{gpu_uuid=\"GPU-1\"} 0.5\n";
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_triton_metrics(plain, strlen(plain), &l), 0);
    CHECK_EQ_INT(l.running, 0);
    CHECK_EQ_INT(l.waiting, 6);
    CHECK(l.kv_cache == -1);

    /* a label value that only ends like ours, and vLLM's text: not Triton's load */
    const char *near = "nv_trt_llm_request_metrics{request_type=\"inactive\"} 9\n";
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_triton_metrics(near, strlen(near), &l), -1);
    CHECK(unchanged(&l));
    CHECK_EQ_INT(mg_probe_parse_triton_metrics(VLLM_METRICS, strlen(VLLM_METRICS), &l), -1);
}

/* Triton's metrics port in place of the base URL's own. */
static void test_metrics_url(void)
{
    char u[128];
    CHECK_EQ_INT(mg_probe_metrics_url("http://triton:8000/v2", 8002, u, sizeof(u)), 0);
    CHECK_STR(u, "http://triton:8002/metrics");
    CHECK_EQ_INT(mg_probe_metrics_url("https://gpu.example", 8002, u, sizeof(u)), 0);
    CHECK_STR(u, "https://gpu.example:8002/metrics");
    CHECK_EQ_INT(mg_probe_metrics_url("http://[::1]:8000", 9002, u, sizeof(u)), 0);
    CHECK_STR(u, "http://[::1]:9002/metrics");
    CHECK_EQ_INT(mg_probe_metrics_url("triton:8000", 8002, u, sizeof(u)), -1);
    CHECK_EQ_INT(mg_probe_metrics_url("http://h:1", 8002, u, 10), -1);
}

static void test_garbage(void)
{
    const char *html = "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head>"
                       "<body><h1>Bad Gateway</h1></body></html>";
    mg_engine_load_t l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(html, strlen(html), &l), -1);
    CHECK_EQ_INT(mg_probe_parse_llamacpp_metrics(html, strlen(html), &l), -1);
    CHECK_EQ_INT(mg_probe_parse_llamacpp_slots(html, strlen(html), &l), -1);
    CHECK_EQ_INT(mg_probe_parse_ollama_ps(html, strlen(html), &l), -1);
    CHECK(unchanged(&l));
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics("", 0, &l), -1);
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(NULL, 0, &l), -1);

    /* every prefix of every sample */
    const char *samples[] = {VLLM_METRICS, VLLM_METRICS_DP, LLAMA_METRICS,
                             LLAMA_SLOTS,  LLAMA_SLOTS_OLD, OLLAMA_PS};
    for (size_t s = 0; s < sizeof(samples) / sizeof(samples[0]); s++) {
        size_t n = strlen(samples[s]);
        for (size_t k = 0; k <= n; k++) all_parsers(samples[s], k);
    }
    /* random mutations of the samples: flipped bytes, NULs, quotes, braces, newlines */
    const char specials[] = "\"{}\\\n\r\0 #:[],";
    for (int round = 0; round < 3000; round++) {
        const char *src = samples[rng() % (sizeof(samples) / sizeof(samples[0]))];
        size_t n = strlen(src);
        char *buf = malloc(n);
        memcpy(buf, src, n);
        int edits = 1 + (int)(rng() % 8);
        for (int e = 0; e < edits; e++) {
            size_t at = rng() % n;
            buf[at] = (rng() & 1) ? (char)(rng() & 0xff) : specials[rng() % (sizeof(specials) - 1)];
        }
        all_parsers(buf, rng() % (n + 1));
        all_parsers(buf, n);
        free(buf);
    }
    /* pure noise */
    for (int round = 0; round < 500; round++) {
        char buf[512];
        size_t n = rng() % sizeof(buf);
        for (size_t i = 0; i < n; i++) buf[i] = (char)(rng() & 0xff);
        all_parsers(buf, n);
    }
    /* a very long line and a very long value token */
    size_t big = 200000;
    char *longline = malloc(big);
    memset(longline, 'a', big);
    all_parsers(longline, big);
    memcpy(longline, "vllm:num_requests_running ", 26);
    memset(longline + 26, '1', big - 26);
    l = sentinel();
    CHECK_EQ_INT(mg_probe_parse_vllm_metrics(longline, big, &l), -1); /* value too long to be one */
    /* deep JSON nesting */
    memset(longline, '[', big);
    all_parsers(longline, big);
    free(longline);
}

int main(void)
{
    MG_RUN(test_body_is_json);
    MG_RUN(test_body_looks_json);
    MG_RUN(test_origin);
    MG_RUN(test_prom_scan);
    MG_RUN(test_vllm_metrics);
    MG_RUN(test_vllm_metrics_partial);
    MG_RUN(test_llamacpp_metrics);
    MG_RUN(test_llamacpp_slots);
    MG_RUN(test_ollama_ps);
    MG_RUN(test_triton_metrics);
    MG_RUN(test_metrics_url);
    MG_RUN(test_garbage);
    return mg_test_summary();
}
