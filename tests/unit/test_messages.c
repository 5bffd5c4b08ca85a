/* Unit tests for core/pipeline/messages_req.c, messages_resp.c and messages_stream.c: an
 * Anthropic Messages request as the canonical chat body, canonical answers and streams as
 * Messages and their event sequence (every tool call its own block, argument deltas as they
 * arrive, no empty deltas, thinking signatures as they were), fed in any cut, and the error
 * shape. */
#include "pipeline/messages_req.h"
#include "pipeline/messages_resp.h"
#include "pipeline/messages_stream.h"
#include "mgtest.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ---- request ------------------------------------------------------------------------ */

static cJSON *translate(const char *body, int count_only, int *rc, char *err, size_t errlen)
{
    mg_buf_t out = {0};
    *rc = mg_msgs_request(body, strlen(body), count_only, &out, err, errlen);
    cJSON *t = *rc >= 0 ? cJSON_Parse(out.data) : NULL;
    mg_buf_free(&out);
    return t;
}

/* The JSON text of item `path` ("messages.0.content"), for compact comparisons. */
static char *at(const cJSON *root, const char *path)
{
    char buf[200];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *v = root;
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(v, atoi(tok))
                                             : cJSON_GetObjectItemCaseSensitive(v, tok);
    return v ? cJSON_PrintUnformatted(v) : strdup("(absent)");
}

#define CHECK_AT(root, path, json)                                                                 \
    do {                                                                                           \
        char *s_ = at(root, path);                                                                 \
        CHECK_STR(s_, json);                                                                       \
        free(s_);                                                                                  \
    } while (0)

static void test_request_text_system_and_sampling(void)
{
    char err[300];
    int rc;
    cJSON *t = translate(
        "{\"model\":\"m\",\"max_tokens\":10,\"system\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}],\"temperature\":0.5,\"stop_sequences\":[\"X\"],"
        "\"priority\":\"P1\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
        0, &rc, err, sizeof(err));
    CHECK_EQ_INT(rc, 0);
    CHECK_AT(
        t, "messages",
        "[{\"role\":\"system\",\"content\":\"a\\nb\"},{\"role\":\"user\",\"content\":\"hi\"}]");
    CHECK_AT(t, "stop", "[\"X\"]");
    CHECK_AT(t, "temperature", "0.5");
    CHECK_AT(t, "priority", "\"P1\"");
    CHECK_AT(t, "max_tokens", "10");
    cJSON_Delete(t);
}

static void test_request_images_and_tools(void)
{
    char err[300];
    int rc;
    cJSON *t = translate(
        "{\"model\":\"m\",\"max_tokens\":10,\"messages\":["
        "{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"QUJD\"}},"
        "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"https://x/y.png\"}},{\"type\":\"text\",\"text\":\"what\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"let me\"},{\"type\":\"tool_use\",\"id\":\"tu1\",\"name\":\"f\",\"input\":{\"a\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\",\"content\":\"ok\"},{\"type\":\"text\",\"text\":\"next\"}]}],"
        "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true}}",
        0, &rc, err, sizeof(err));
    CHECK_EQ_INT(rc, 0);
    CHECK_AT(
        t, "messages.0.content",
        "[{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,QUJD\"}},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x/y.png\"}},{\"type\":\"text\",\"text\":\"what\"}]");
    CHECK_AT(
        t, "messages.1",
        "{\"role\":\"assistant\",\"content\":\"let me\",\"tool_calls\":[{\"id\":\"tu1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]}");
    CHECK_AT(t, "messages.2", "{\"role\":\"tool\",\"tool_call_id\":\"tu1\",\"content\":\"ok\"}");
    CHECK_AT(t, "messages.3", "{\"role\":\"user\",\"content\":\"next\"}");
    CHECK_AT(
        t, "tools",
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]");
    CHECK_AT(t, "tool_choice", "\"auto\"");
    CHECK_AT(t, "parallel_tool_calls", "false");
    cJSON_Delete(t);
}

static void test_request_refusals(void)
{
    static const struct {
        const char *body, *why;
    } bad[] = {
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[]}", "non-empty"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
         "'user' or 'assistant'"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"file\"}}]}]}",
         "source"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"image\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "only text"},
        {"[1]", "JSON object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[300] = "";
        int rc;
        cJSON *t = translate(bad[i].body, 0, &rc, err, sizeof(err));
        CHECK_EQ_INT(rc, -1);
        CHECK(t == NULL);
        if (!strstr(err, bad[i].why)) fprintf(stderr, "case %zu: %s\n", i, err);
        CHECK(strstr(err, bad[i].why) != NULL);
    }
    char err[300];
    int rc;
    cJSON *t = translate("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                         1, &rc, err, sizeof(err));
    CHECK_EQ_INT(rc, 0); /* count_tokens needs no max_tokens */
    cJSON_Delete(t);
}

/* What the canonical form cannot carry is left out and named (1), the rest translated: a
 * route serving the canonical form refuses with the reason, an Anthropic route serves it. */
static void test_request_lossy(void)
{
    static const struct {
        const char *body, *why, *messages;
    } cases[] = {
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"},{\"type\":\"text\",\"text\":\"sum\"}]}]}",
         "'document'", "[{\"role\":\"user\",\"content\":\"sum\"}]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"a\","
         "\"content\":[{\"type\":\"text\",\"text\":\"t\"},{\"type\":\"image\",\"source\":{}}]}]}]}",
         "'image' block", "[{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"t\"}]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}],\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "server tool", "[{\"role\":\"user\",\"content\":\"x\"}]"},
        {"{\"model\":\"m\",\"max_tokens\":1,\"mcp_servers\":[],\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"server_tool_use\"},"
         "{\"type\":\"text\",\"text\":\"a\"}]}]}",
         "mcp_servers", "[{\"role\":\"assistant\",\"content\":\"a\"}]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[300] = "";
        int rc;
        cJSON *t = translate(cases[i].body, 0, &rc, err, sizeof(err));
        CHECK_EQ_INT(rc, 1);
        if (!strstr(err, cases[i].why)) fprintf(stderr, "case %zu: %s\n", i, err);
        CHECK(strstr(err, cases[i].why) != NULL);
        CHECK_AT(t, "messages", cases[i].messages);
        cJSON_Delete(t);
    }
}

/* ---- answer ------------------------------------------------------------------------- */

static void test_answer(void)
{
    const char *chat =
        "{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"finish_reason\":\"tool_calls\","
        "\"message\":{\"role\":\"assistant\",\"content\":\"hi\",\"thinking_blocks\":[{\"type\":\"thinking\",\"thinking\":\"t\","
        "\"signature\":\"S+/=\"},{\"type\":\"redacted_thinking\",\"data\":\"R\"}],"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":[1]}\"}}]}}],"
        "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":8},"
        "\"cache_creation_input_tokens\":2}}";
    mg_msgs_usage_t fb = {0, 0, 0, 0};
    mg_buf_t out = {0};
    CHECK_EQ_INT(mg_msgs_answer(chat, strlen(chat), "msg_1", "claude", &fb, &out), 0);
    CHECK_STR(
        out.data,
        "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"S+/=\"},{\"type\":\"redacted_thinking\",\"data\":\"R\"},"
        "{\"type\":\"text\",\"text\":\"hi\"},{\"type\":\"tool_use\",\"id\":\"c1\",\"name\":\"f\",\"input\":{\"a\":[1]}}],"
        "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":4,"
        "\"cache_creation_input_tokens\":2,\"cache_read_input_tokens\":8}}");
    mg_buf_free(&out);

    /* vLLM's matched stop string, no usage: the call's counts */
    const char *stop =
        "{\"choices\":[{\"finish_reason\":\"stop\",\"stop_reason\":\"END\",\"message\":{\"content\":\"a\"}}]}";
    mg_msgs_usage_t calls = {3, 1, 0, 0};
    CHECK_EQ_INT(mg_msgs_answer(stop, strlen(stop), "m", "x", &calls, &out), 0);
    CHECK(strstr(out.data, "\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\"") != NULL);
    CHECK(strstr(out.data, "\"input_tokens\":3,\"output_tokens\":1") != NULL);
    mg_buf_free(&out);
    CHECK_EQ_INT(mg_msgs_answer("{\"choices\":[]}", 14, "m", "x", &calls, &out), -1);
    mg_buf_free(&out);

    /* an upstream's absurd usage is clamped, not an undefined cast */
    const char *huge =
        "{\"choices\":[{\"finish_reason\":\"stop\",\"message\":{\"content\":\"a\"}}],"
        "\"usage\":{\"prompt_tokens\":2.2e49,\"completion_tokens\":-1e300}}";
    CHECK_EQ_INT(mg_msgs_answer(huge, strlen(huge), "m", "x", &calls, &out), 0);
    CHECK(strstr(out.data, "\"output_tokens\":0") != NULL);
    mg_buf_free(&out);
}

static void test_stop_reasons(void)
{
    static const char *const cases[][3] = {
        {"{\"finish_reason\":\"stop\"}", "end_turn", NULL},
        {"{\"finish_reason\":\"length\"}", "max_tokens", NULL},
        {"{\"finish_reason\":\"tool_calls\"}", "tool_use", NULL},
        {"{\"finish_reason\":\"content_filter\"}", "refusal", NULL},
        {"{\"finish_reason\":\"stop\",\"stop_reason\":\"###\"}", "stop_sequence", "###"},
        {"{\"finish_reason\":\"stop\",\"stop_reason\":\"pause_turn\"}", "pause_turn", NULL},
        {"{\"finish_reason\":\"length\",\"stop_reason\":\"model_context_window_exceeded\"}",
         "model_context_window_exceeded", NULL},
        {"{\"finish_reason\":\"stop\",\"stop_reason\":128001}", "end_turn",
         NULL}, /* vLLM: a token id */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *ch = cJSON_Parse(cases[i][0]);
        const char *seq;
        CHECK_STR(mg_msgs_stop_reason(ch, &seq), cases[i][1]);
        if (cases[i][2]) CHECK_STR(seq, cases[i][2]);
        else CHECK(seq == NULL);
        cJSON_Delete(ch);
    }
}

static void test_error_body(void)
{
    mg_buf_t b = {0};
    mg_msgs_error_body(&b, 404, "MODEL_NOT_FOUND", "model 'x' does not \"exist\"", "req-1");
    CHECK_STR(b.data,
              "{\"type\":\"error\",\"error\":{\"type\":\"not_found_error\",\"message\":"
              "\"MODEL_NOT_FOUND: model 'x' does not \\\"exist\\\"\"},\"request_id\":\"req-1\"}");
    mg_buf_free(&b);
    CHECK_STR(mg_msgs_error_type(503, "MODEL_UNAVAILABLE"), "overloaded_error");
    CHECK_STR(mg_msgs_error_type(429, "QUEUE_FULL"), "overloaded_error");
    CHECK_STR(mg_msgs_error_type(429, "RATE_LIMITED"), "rate_limit_error");
    CHECK_STR(mg_msgs_error_type(401, "AUTH_FAILED"), "authentication_error");
    CHECK_STR(mg_msgs_error_type(403, "PERMISSION_DENIED"), "permission_error");
    CHECK_STR(mg_msgs_error_type(400, "INVALID_REQUEST"), "invalid_request_error");
    CHECK_STR(mg_msgs_error_type(413, "X"), "request_too_large");
    CHECK_STR(mg_msgs_error_type(504, "X"), "timeout_error");
    CHECK_STR(mg_msgs_error_type(500, "INTERNAL_ERROR"), "api_error");
}

/* ---- stream ------------------------------------------------------------------------- */

/* The canonical SSE of some chunks' JSON texts, with [DONE]. */
static void sse_of(const char *const *chunks, size_t n, mg_buf_t *out)
{
    for (size_t i = 0; i < n; i++) {
        mg_buf_append_str(out, "data: ");
        mg_buf_append_str(out, chunks[i]);
        mg_buf_append_str(out, "\n\n");
    }
}

/* The stream's events as "type[index]" words, and the whole output. */
static void feed_all(mg_msgs_stream_t *s, const char *in, size_t n, size_t cut, mg_buf_t *out)
{
    for (size_t at = 0; at < n; at += cut)
        mg_msgs_stream_feed(s, in + at, at + cut <= n ? cut : n - at, out);
}

static void event_types(const char *sse, mg_buf_t *types)
{
    for (const char *p = strstr(sse, "event: "); p; p = strstr(p + 1, "\nevent: ")) {
        if (*p == '\n') p++;
        const char *e = strchr(p, '\n');
        mg_buf_append(types, p + 7, (size_t)(e - p - 7));
        const char *idx = strstr(e, "\"index\":");
        const char *next = strstr(e, "\n\n");
        if (idx && idx < next) {
            mg_buf_append(types, "[", 1);
            mg_buf_append(types, idx + 8, 1);
            mg_buf_append(types, "]", 1);
        }
        mg_buf_append(types, " ", 1);
    }
}

#define CHUNK(delta, finish)                                                                        \
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":" delta \
    ",\"finish_reason\":" finish "}]}"

static void test_stream_tools(void)
{
    static const char *const chunks[] = {
        CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null"),
        CHUNK("{\"reasoning_content\":\"hmm\",\"tool_calls\":[]}", "null"),
        CHUNK("{\"reasoning_signature\":\"SIG+/=\"}", "null"),
        CHUNK("{\"content\":\"I will\",\"tool_calls\":[]}", "null"),
        CHUNK(
            "{\"tool_calls\":[{\"index\":0,\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}",
            "null"),
        CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"x\\\"\"}}]}",
              "null"),
        CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}", "null"),
        CHUNK(
            "{\"tool_calls\":[{\"index\":1,\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}",
            "null"),
        CHUNK("{}", "\"tool_calls\""),
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":7}}",
        "[DONE]",
    };
    mg_buf_t in = {0};
    sse_of(chunks, sizeof(chunks) / sizeof(chunks[0]), &in);
    /* whole, and cut into every small size: the same events */
    mg_buf_t first = {0};
    for (size_t cut = in.len; cut >= 1; cut = cut > 64 ? cut / 2 : cut - 1) {
        mg_msgs_stream_t s;
        CHECK_EQ_INT(mg_msgs_stream_init(&s, "msg_1", "claude", 5), 0);
        mg_buf_t out = {0};
        feed_all(&s, in.data, in.len, cut, &out);
        if (!first.len) mg_buf_append(&first, out.data, out.len);
        else CHECK(out.len == first.len && memcmp(out.data, first.data, out.len) == 0);
        mg_buf_free(&out);
        mg_msgs_stream_free(&s);
        if (cut == 1) break;
    }
    mg_buf_t types = {0};
    event_types(first.data, &types);
    CHECK_STR(
        types.data,
        "message_start ping content_block_start[0] content_block_delta[0] content_block_delta[0] "
        "content_block_stop[0] content_block_start[1] content_block_delta[1] content_block_stop[1] "
        "content_block_start[2] content_block_delta[2] content_block_delta[2] content_block_stop[2] "
        "content_block_start[3] content_block_delta[3] content_block_stop[3] message_delta message_stop ");
    CHECK(strstr(first.data, "\"delta\":{\"type\":\"signature_delta\",\"signature\":\"SIG+/=\"}") !=
          NULL);
    CHECK(
        strstr(
            first.data,
            "\"content_block\":{\"type\":\"tool_use\",\"id\":\"b\",\"name\":\"g\",\"input\":{}}") !=
        NULL);
    CHECK(strstr(first.data, "\"partial_json\":\"{\\\"x\\\"\"") != NULL);
    CHECK(strstr(first.data, "\"partial_json\":\"\"") == NULL); /* no empty deltas */
    CHECK(
        strstr(
            first.data,
            "\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":9,\"output_tokens\":7") !=
        NULL);
    CHECK(
        strstr(
            first.data,
            "\"usage\":{\"input_tokens\":5,\"output_tokens\":0,\"cache_creation_input_tokens\":null,"
            "\"cache_read_input_tokens\":null}") != NULL); /* message_start's estimate */
    mg_buf_free(&types);
    mg_buf_free(&first);
    mg_buf_free(&in);
}

/* Two calls whose argument fragments interleave (0, 1, 0, 1): blocks never overlap; the second
 * call waits and gets its block after the first closes, its fragments as they came. Then
 * calls sent one after another: each opens live when its own arguments come. */
static void test_stream_tools_interleaved(void)
{
#define TC(i, rest) CHUNK("{\"tool_calls\":[{\"index\":" #i "," rest "}]}", "null")
#define ARG(i, a) TC(i, "\"function\":{\"arguments\":\"" a "\"}")
    static const char *const inter[] = {
        TC(0,
           "\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}"),
        TC(1,
           "\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}"),
        ARG(0, "{\\\"x\\\""),
        ARG(1, "{\\\"y\\\""),
        ARG(0, ":1}"),
        ARG(1, ":2}"),
        CHUNK("{}", "\"tool_calls\""),
        "[DONE]",
    };
    static const char *const seq[] = {
        TC(0,
           "\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}"),
        ARG(0, "{\\\"x\\\":1}"),
        TC(1,
           "\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}"),
        ARG(1, "{\\\"y\\\":2}"),
        CHUNK("{\"content\":\"after\"}", "null"),
        CHUNK("{}", "\"stop\""),
        "[DONE]",
    };
    /* call 1 streams its whole arguments while call 0's are unfinished, then the engine goes
       back to call 0: call 1 must wait (block 0 cannot close on a half argument) */
    static const char *const back[] = {
        TC(0,
           "\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}"),
        ARG(0, "{\\\"x\\\""),
        TC(1,
           "\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"\"}"),
        ARG(1, "{\\\"y\\\":2}"),
        ARG(0, ":1}"),
        CHUNK("{}", "\"tool_calls\""),
        "[DONE]",
    };
#undef ARG
#undef TC
    {
        mg_buf_t in = {0}, out = {0}, types = {0};
        sse_of(back, sizeof(back) / sizeof(back[0]), &in);
        mg_msgs_stream_t s;
        CHECK_EQ_INT(mg_msgs_stream_init(&s, "msg_3", "claude", 5), 0);
        feed_all(&s, in.data, in.len, 5, &out);
        event_types(out.data, &types);
        CHECK_STR(types.data, "message_start ping content_block_start[0] content_block_delta[0] "
                              "content_block_delta[0] content_block_stop[0] "
                              "content_block_start[1] content_block_delta[1] "
                              "content_block_stop[1] message_delta message_stop ");
        const char *b = strstr(out.data, "\"id\":\"b\"");
        CHECK(b && strstr(out.data, "\"index\":0,\"delta\":{\"type\":\"input_json_delta\","
                                    "\"partial_json\":\":1}\"}") < b);
        mg_msgs_stream_free(&s);
        mg_buf_free(&types);
        mg_buf_free(&out);
        mg_buf_free(&in);
    }
    for (int round = 0; round < 2; round++) {
        mg_buf_t in = {0}, out = {0}, types = {0};
        if (round == 0) sse_of(inter, sizeof(inter) / sizeof(inter[0]), &in);
        else sse_of(seq, sizeof(seq) / sizeof(seq[0]), &in);
        mg_msgs_stream_t s;
        CHECK_EQ_INT(mg_msgs_stream_init(&s, "msg_2", "claude", 5), 0);
        feed_all(&s, in.data, in.len, 7, &out);
        event_types(out.data, &types);
        if (round == 0) {
            CHECK_STR(types.data,
                      "message_start ping content_block_start[0] content_block_delta[0] "
                      "content_block_delta[0] content_block_stop[0] content_block_start[1] "
                      "content_block_delta[1] content_block_delta[1] content_block_stop[1] "
                      "message_delta message_stop ");
            const char *b = strstr(out.data, "\"id\":\"b\"");
            CHECK(b && strstr(out.data, "\"index\":0,\"delta\":{\"type\":\"input_json_delta\","
                                        "\"partial_json\":\":1}\"}") < b);
            CHECK(b && strstr(b, "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
                                 "\"partial_json\":\"{\\\"y\\\"\"}") != NULL);
        } else {
            CHECK_STR(types.data,
                      "message_start ping content_block_start[0] content_block_delta[0] "
                      "content_block_stop[0] content_block_start[1] content_block_delta[1] "
                      "content_block_stop[1] content_block_start[2] content_block_delta[2] "
                      "content_block_stop[2] message_delta message_stop ");
        }
        mg_msgs_stream_free(&s);
        mg_buf_free(&types);
        mg_buf_free(&out);
        mg_buf_free(&in);
    }
}

static void test_stream_error_and_fallback(void)
{
    static const char *const failed[] = {
        CHUNK("{\"role\":\"assistant\",\"content\":\"a\"}", "null"),
        "{\"error\":{\"message\":\"broke\",\"type\":\"server_error\",\"code\":\"UPSTREAM_ERROR\"}}",
        "[DONE]",
    };
    mg_buf_t in = {0}, out = {0};
    sse_of(failed, 3, &in);
    mg_msgs_stream_t s;
    mg_msgs_stream_init(&s, "msg_2", "m", 0);
    mg_msgs_stream_feed(&s, in.data, in.len, &out);
    CHECK(strstr(out.data,
                 "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                 "\"message\":\"UPSTREAM_ERROR: broke\"}}\n\n") != NULL);
    CHECK(strstr(out.data, "message_stop") == NULL);
    CHECK(strstr(out.data, "content_block_stop") == NULL);
    mg_msgs_stream_free(&s);
    mg_buf_free(&in);
    mg_buf_free(&out);

    /* no usage from upstream, a stop at max tokens: the call's counts */
    static const char *const plain[] = {CHUNK("{\"content\":\"a\"}", "\"length\""), "[DONE]"};
    sse_of(plain, 2, &in);
    mg_msgs_stream_init(&s, "msg_3", "m", 0);
    s.fallback.input = 11;
    s.fallback.output = 1;
    mg_msgs_stream_feed(&s, in.data, in.len, &out);
    CHECK(strstr(out.data, "\"stop_reason\":\"max_tokens\"") != NULL);
    CHECK(strstr(out.data, "\"input_tokens\":11,\"output_tokens\":1") != NULL);
    CHECK(strstr(out.data, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") != NULL);
    mg_msgs_stream_free(&s);
    mg_buf_free(&in);
    mg_buf_free(&out);
}

/* A text piece's JSON literal is copied as it came (escapes and all): what a client decodes is
 * the engine's text; the tree path (a chunk with more in it) says the same. */
static void test_stream_text_bytes(void)
{
    static const char *const chunks[] = {
        CHUNK("{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null}", "null"),
        CHUNK("{\"content\":\"a\\\"b\\u00e9\\n\"}", "null"),
        CHUNK("{\"content\":\"c\\u00e9\"}", "\"stop\""), /* finish: the tree path */
        "[DONE]",
    };
    mg_buf_t in = {0}, out = {0};
    sse_of(chunks, 4, &in);
    mg_msgs_stream_t s;
    mg_msgs_stream_init(&s, "msg_4", "m", 0);
    mg_msgs_stream_feed(&s, in.data, in.len, &out);
    CHECK(strstr(out.data, "\"delta\":{\"type\":\"text_delta\",\"text\":\"a\\\"b\\u00e9\\n\"}") !=
          NULL);
    CHECK(strstr(out.data, "\"delta\":{\"type\":\"text_delta\",\"text\":\"c\xc3\xa9\"}") != NULL);
    mg_buf_t types = {0};
    event_types(out.data, &types);
    CHECK_STR(
        types.data,
        "message_start ping content_block_start[0] content_block_delta[0] content_block_delta[0] "
        "content_block_stop[0] message_delta message_stop ");
    mg_buf_free(&types);
    mg_msgs_stream_free(&s);
    mg_buf_free(&in);
    mg_buf_free(&out);
}

int main(void)
{
    MG_RUN(test_request_text_system_and_sampling);
    MG_RUN(test_request_images_and_tools);
    MG_RUN(test_request_refusals);
    MG_RUN(test_request_lossy);
    MG_RUN(test_answer);
    MG_RUN(test_stop_reasons);
    MG_RUN(test_error_body);
    MG_RUN(test_stream_tools);
    MG_RUN(test_stream_tools_interleaved);
    MG_RUN(test_stream_error_and_fallback);
    MG_RUN(test_stream_text_bytes);
    return mg_test_summary();
}
