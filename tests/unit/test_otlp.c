/* Unit tests for core/obs/otlp.c: the OTLP JSON body of a batch, and the bounded queue
 * (drops counted; what cannot be sent at stop is counted as failed, and stop returns). */
#include "obs/otlp.h"
#include "mgtest.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static mg_otlp_span_t sample(void)
{
    mg_otlp_span_t s;
    memset(&s, 0, sizeof(s));
    strcpy(s.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    strcpy(s.span_id, "00f067aa0ba902b7");
    strcpy(s.parent_id, "b7ad6b7169203331");
    s.start_unix_ns = 1700000000000000000LL;
    s.end_unix_ns = 1700000000250000000LL;
    s.operation = "chat";
    strcpy(s.system, "openai");
    strcpy(s.request_model, "chat");
    strcpy(s.response_model, "up-chat");
    strcpy(s.request_id, "req-1");
    s.status = 200;
    s.input_tokens = 12;
    s.output_tokens = 34;
    s.ttft_s = -1;
    return s;
}

static const cJSON *attr(const cJSON *span, const char *key)
{
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(span, "attributes")) {
        if (!strcmp(cJSON_GetObjectItem(a, "key")->valuestring, key))
            return cJSON_GetObjectItem(a, "value");
    }
    return NULL;
}

static void test_body(void)
{
    mg_otlp_span_t s = sample(), e = sample();
    strcpy(e.error_type, "MODEL_UNAVAILABLE");
    e.status = 502;
    e.parent_id[0] = '\0';
    const mg_otlp_span_t *v[2] = {&s, &e};
    char *text = mg_otlp_body(v, 2, "edge-gw");
    CHECK(text != NULL);
    cJSON *root = cJSON_Parse(text);
    CHECK(root != NULL);
    const cJSON *rs = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "resourceSpans"), 0);
    const cJSON *res = cJSON_GetObjectItem(rs, "resource");
    CHECK_STR(cJSON_GetObjectItem(attr(res, "service.name"), "stringValue")->valuestring,
              "edge-gw");
    const cJSON *spans =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(rs, "scopeSpans"), 0), "spans");
    CHECK_EQ_INT(cJSON_GetArraySize(spans), 2);
    const cJSON *a = cJSON_GetArrayItem(spans, 0), *b = cJSON_GetArrayItem(spans, 1);
    CHECK_STR(cJSON_GetObjectItem(a, "traceId")->valuestring, s.trace_id);
    CHECK_STR(cJSON_GetObjectItem(a, "parentSpanId")->valuestring, s.parent_id);
    CHECK_STR(cJSON_GetObjectItem(a, "name")->valuestring, "chat chat");
    CHECK_STR(cJSON_GetObjectItem(a, "startTimeUnixNano")->valuestring, "1700000000000000000");
    CHECK_STR(cJSON_GetObjectItem(attr(a, "gen_ai.usage.input_tokens"), "intValue")->valuestring,
              "12");
    CHECK_STR(cJSON_GetObjectItem(attr(a, "gen_ai.response.model"), "stringValue")->valuestring,
              "up-chat");
    CHECK(attr(a, "error.type") == NULL);
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(a, "status"), "code")->valueint, 1);
    CHECK(cJSON_GetObjectItem(b, "parentSpanId") == NULL);
    CHECK_EQ_INT(cJSON_GetObjectItem(cJSON_GetObjectItem(b, "status"), "code")->valueint, 2);
    CHECK_STR(cJSON_GetObjectItem(attr(b, "error.type"), "stringValue")->valuestring,
              "MODEL_UNAVAILABLE");
    cJSON_Delete(root);
    free(text);
}

static void test_queue_bounded(void)
{
    mg_otlp_conf_t c;
    memset(&c, 0, sizeof(c));
    c.endpoint = "http://127.0.0.1:9"; /* discard: nothing listens */
    c.interval_ms = 60000;
    c.max_batch = 100;
    c.max_queue = 3;
    c.timeout_ms = 500;
    c.max_retries = 3;
    mg_otlp_t *o = mg_otlp_start(&c);
    CHECK(o != NULL);
    if (!o) return;
    mg_otlp_span_t s = sample();
    int ok = 0;
    for (int i = 0; i < 5; i++) ok += mg_otlp_push(o, &s) == 0;
    CHECK_EQ_INT(ok, 3);
    mg_otlp_stats_t st;
    mg_otlp_stats(o, &st);
    CHECK_EQ_INT((long long)st.queued, 3);
    CHECK_EQ_INT((long long)st.dropped_full, 2);
    CHECK_EQ_INT((long long)st.exported_total, 0);
    /* 2 batches' worth: the first fails at the dead port, the rest is dropped with it */
    mg_otlp_stop(o); /* one try, no retries: returns */
}

int main(void)
{
    MG_RUN(test_body);
    MG_RUN(test_queue_bounded);
    return mg_test_summary();
}
