/* Unit tests for the byte path of core/pipeline/responses_out.c: mg_resp_chunk_scan (what a
 * chat chunk or completion carries, read from its bytes: content and reasoning literals,
 * finish_reason, usage; what only the tree path reads sends it there: tool calls, several
 * choices, a choice other than index 0, an error, an escaped key), and mg_resp_out_scanned
 * against mg_resp_out_chunk: the same chunks fed as bytes and as trees make the same events
 * (the same names, the same JSON), the same Response and the same history message. */
#include "mgtest.h"
#include "pipeline/responses_in.h"
#include "pipeline/responses_out.h"
#include "upstream/chunk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lit_is(const char *p, size_t n, const char *want)
{
    if (!p) {
        fprintf(stderr, "literal missing, want %s\n", want);
        return 0;
    }
    if (n == strlen(want) && memcmp(p, want, n) == 0) return 1;
    fprintf(stderr, "literal %.*s, want %s\n", (int)n, p, want);
    return 0;
}

static int scan(const char *json, const char *key, mg_resp_chunk_t *ch)
{
    return mg_resp_chunk_scan(json, strlen(json), key, ch);
}

static void test_scan_text_finish_usage(void)
{
    mg_resp_chunk_t ch;
    CHECK_EQ_INT(scan("{\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                      "\"a \\\"b\\\"\\n\"},\"logprobs\":null,\"finish_reason\":null}]}",
                      "delta", &ch),
                 0);
    CHECK(!ch.tree);
    CHECK_EQ_INT(ch.choices, 1);
    CHECK(lit_is(ch.content, ch.content_len, "\"a \\\"b\\\"\\n\""));
    CHECK(ch.finish == NULL && ch.usage == NULL && ch.reasoning == NULL);

    CHECK_EQ_INT(
        scan("{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}", "delta", &ch),
        0);
    CHECK(!ch.tree && ch.content == NULL);
    CHECK(lit_is(ch.finish, ch.finish_len, "stop"));

    CHECK_EQ_INT(scan("{\"choices\":[],\"usage\":{\"prompt_tokens\":4}}", "delta", &ch), 0);
    CHECK(!ch.tree);
    CHECK_EQ_INT(ch.choices, 0);
    CHECK(lit_is(ch.usage, ch.usage_len, "{\"prompt_tokens\":4}"));

    /* vLLM's empty tool_calls, a role, a null content: nothing for the tree */
    CHECK_EQ_INT(scan("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null,"
                      "\"tool_calls\":[ ]}}]}",
                      "delta", &ch),
                 0);
    CHECK(!ch.tree && ch.content == NULL);

    /* a whole completion's message; the first of duplicate keys, as cJSON reads them */
    CHECK_EQ_INT(scan("{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                      "\"content\":\"one\",\"content\":\"two\",\"refusal\":null},"
                      "\"finish_reason\":\"length\"}],\"usage\":{\"completion_tokens\":1}}",
                      "message", &ch),
                 0);
    CHECK(!ch.tree);
    CHECK(lit_is(ch.content, ch.content_len, "\"one\""));
    CHECK(lit_is(ch.finish, ch.finish_len, "length"));
    CHECK(ch.usage != NULL);
    /* the other key is not read */
    CHECK_EQ_INT(scan("{\"choices\":[{\"message\":{\"content\":\"x\"}}]}", "delta", &ch), 0);
    CHECK(!ch.tree && ch.content == NULL);
}

static void test_scan_reasoning(void)
{
    mg_resp_chunk_t ch;
    CHECK_EQ_INT(scan("{\"choices\":[{\"delta\":{\"reasoning\":\"r\",\"reasoning_content\":"
                      "\"rc\"}}]}",
                      "delta", &ch),
                 0);
    CHECK(lit_is(ch.reasoning, ch.reasoning_len, "\"rc\""));
    CHECK_EQ_INT(
        scan("{\"choices\":[{\"delta\":{\"reasoning_content\":null,\"reasoning\":\"r\"}}]}",
             "delta", &ch),
        0);
    CHECK(lit_is(ch.reasoning, ch.reasoning_len, "\"r\""));
}

static void test_scan_sends_to_tree(void)
{
    static const char *const tree[] = {
        "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\"}]}}]}",
        "{\"choices\":[{\"delta\":{\"content\":\"a\"}},{\"delta\":{\"content\":\"b\"}}]}",
        "{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"b\"}}]}",
        "{\"choices\":[{\"index\":0.5,\"delta\":{\"content\":\"b\"}}]}",
        "{\"choices\":[{\"delta\":{\"cont\\u0065nt\":\"b\"}}]}",
        "{\"ch\\u006fices\":[]}",
        "{\"choices\":[],\"error\":{\"message\":\"m\"}}",
        "{\"choices\":[{\"delta\":{},\"finish_reason\":\"st\\u006fp\"}]}",
        "{\"choices\":[7]}",
    };
    for (size_t i = 0; i < sizeof(tree) / sizeof(tree[0]); i++) {
        mg_resp_chunk_t ch;
        CHECK_EQ_INT(scan(tree[i], "delta", &ch), 0);
        if (!ch.tree) fprintf(stderr, "not sent to the tree: %s\n", tree[i]);
        CHECK(ch.tree);
    }
    mg_resp_chunk_t ch;
    CHECK_EQ_INT(scan("[1]", "delta", &ch), -1);
    CHECK_EQ_INT(scan("{\"choices\":", "delta", &ch), -1);
    CHECK_EQ_INT(scan("{\"choices\":[],\"error\":null}", "delta", &ch), 0);
    CHECK(!ch.tree);
}

/* ---- bytes and trees make the same answer ---- */

static mg_resp_out_t *new_out(void)
{
    cJSON *req = cJSON_Parse("{\"model\":\"m\",\"input\":\"x\",\"metadata\":{\"k\":\"v\"}}");
    mg_resp_out_t *o = mg_resp_out_new("resp_abc", 1700000000, "m", mg_resp_skeleton(req));
    cJSON_Delete(req);
    return o;
}

/* One chunk fed both ways: by bytes into a (the tree when the scan says so), as a tree into
 * b. Returns whether the bytes path took it. */
static int feed_both(mg_resp_out_t *a, mg_buf_t *out_a, mg_resp_out_t *b, mg_buf_t *out_b,
                     const char *json, mg_chunk_memo_t *memo)
{
    size_t n = strlen(json);
    mg_resp_chunk_t ch;
    int bytes;
    if (memo) { /* as the pipeline reads a stream: the memo checks, the scan uses it */
        CHECK(mg_chunk_scan_memo(memo, json, n) >= 0);
        bytes = mg_resp_out_scan_chunk(a, memo, json, n, &ch) == 0 && !ch.tree;
    } else {
        CHECK(mg_chunk_scan(json, n) >= 0);
        bytes = mg_resp_chunk_scan(json, n, "delta", &ch) == 0 && !ch.tree;
    }
    cJSON *t = cJSON_Parse(json);
    if (bytes) mg_resp_out_scanned(a, &ch, out_a);
    else mg_resp_out_chunk(a, t, out_a);
    mg_resp_out_chunk(b, t, out_b);
    cJSON_Delete(t);
    return bytes;
}

/* The SSE events of x and y the same: names, and data as JSON (escapes may differ: a literal
 * read from its bytes keeps the upstream's, a tree's string is escaped anew). */
static int same_events(const mg_buf_t *x, const mg_buf_t *y)
{
    const char *p = x->data ? x->data : "", *q = y->data ? y->data : "";
    int n = 0;
    while (*p || *q) {
        const char *pe = strstr(p, "\n\n"), *qe = strstr(q, "\n\n");
        const char *pd = strstr(p, "\ndata: "), *qd = strstr(q, "\ndata: ");
        if (!pe || !qe || !pd || !qd || pd - p != qd - q || memcmp(p, q, (size_t)(pd - p))) {
            fprintf(stderr, "event %d differs: %.60s | %.60s\n", n, p, q);
            return 0;
        }
        cJSON *a = cJSON_ParseWithLength(pd + 7, (size_t)(pe - pd - 7));
        cJSON *b = cJSON_ParseWithLength(qd + 7, (size_t)(qe - qd - 7));
        int same = a && cJSON_Compare(a, b, 1);
        cJSON_Delete(a);
        cJSON_Delete(b);
        if (!same) {
            fprintf(stderr, "event %d data differs: %.*s | %.*s\n", n, (int)(pe - pd), pd,
                    (int)(qe - qd), qd);
            return 0;
        }
        p = pe + 2;
        q = qe + 2;
        n++;
    }
    return n > 0;
}

/* The Response texts equal but for completed_at (each end reads the clock). */
static int same_response(const mg_buf_t *x, const mg_buf_t *y)
{
    cJSON *a = cJSON_Parse(x->data), *b = cJSON_Parse(y->data);
    cJSON_DeleteItemFromObjectCaseSensitive(a, "completed_at");
    cJSON_DeleteItemFromObjectCaseSensitive(b, "completed_at");
    int same = a && cJSON_Compare(a, b, 1);
    cJSON_Delete(a);
    cJSON_Delete(b);
    return same;
}

static void bytes_match_tree_stream(int with_memo)
{
    static const char *const chunks[] = {
        "{\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"
        "\"\"},\"logprobs\":null,\"finish_reason\":null}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think \\u00e9\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\" more\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\\"q\\\" \\ud83d\\ude00\\n\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\",\"tool_calls\":[]}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xc3\xa9/<\\/>\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"ca\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after\"}}]}",
        "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,"
        "\"prompt_tokens_details\":{\"cached_tokens\":1},"
        "\"completion_tokens_details\":{\"reasoning_tokens\":1e0}}}",
    };
    mg_resp_out_t *a = new_out(), *b = new_out();
    mg_buf_t out_a = {0}, out_b = {0};
    mg_chunk_memo_t memo = {0};
    memo.places = 1;
    int by_bytes = 0;
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++)
        by_bytes += feed_both(a, &out_a, b, &out_b, chunks[i], with_memo ? &memo : NULL);
    mg_chunk_memo_free(&memo);
    CHECK_EQ_INT(by_bytes, 10); /* all but the tool call */
    CHECK(same_events(&out_a, &out_b));
    const mg_buf_t *fa = mg_resp_out_end(a, NULL), *fb = mg_resp_out_end(b, NULL);
    CHECK(same_response(fa, fb));
    long long ia, oa, ib, ob;
    mg_resp_out_usage(a, &ia, &oa);
    mg_resp_out_usage(b, &ib, &ob);
    CHECK(ia == 3 && oa == 2 && ib == 3 && ob == 2);
    cJSON *r = cJSON_Parse(fa->data);
    CHECK(r != NULL);
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(r, "output");
    CHECK_EQ_INT(cJSON_GetArraySize(output), 4); /* reasoning, message, call, message */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(output, 1), "content"), 0),
        "text");
    CHECK(cJSON_IsString(text) &&
          strcmp(text->valuestring, "Hello \"q\" \xf0\x9f\x98\x80\ncaf\xc3\xa9/</>") == 0);
    cJSON_Delete(r);
    /* the history message is the same text both ways */
    mg_buf_t ma = {0}, mb = {0};
    CHECK(mg_resp_out_message_print(a, &ma) == 0 && mg_resp_out_message_print(b, &mb) == 0);
    cJSON *m = cJSON_Parse(ma.data), *mt = cJSON_Parse(mb.data);
    CHECK(m != NULL && cJSON_Compare(m, mt, 1));
    cJSON_Delete(mt);
    mg_buf_free(&ma);
    mg_buf_free(&mb);
    cJSON_Delete(m);
    mg_buf_free(&out_a);
    mg_buf_free(&out_b);
    mg_resp_out_free(a);
    mg_resp_out_free(b);
}

static void test_bytes_match_tree_stream(void)
{
    bytes_match_tree_stream(0);
}

/* Chunks that are one template with strings swapped, read by the template's shape: a text
 * of another length, a finish reason, an escape, then a chunk of another shape. */
static void test_bytes_match_tree_by_template(void)
{
    bytes_match_tree_stream(1);
    static const char *const chunks[] = {
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
        "\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"bcd\"},"
        "\"finish_reason\":null}]}",
        "{\"id\":\"c2\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
        "\"\\\"e\\u00e9\"},\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},"
        "\"finish_reason\":\"stop\"}]}",
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"f\"},"
        "\"finish_reason\":\"length\"}]}",
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"r\"},"
        "\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"s\"},"
        "\"finish_reason\":null}]}",
    };
    mg_resp_out_t *a = new_out(), *b = new_out();
    mg_buf_t out_a = {0}, out_b = {0};
    mg_chunk_memo_t memo = {0};
    memo.places = 1;
    int by_bytes = 0;
    for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++)
        by_bytes += feed_both(a, &out_a, b, &out_b, chunks[i], &memo);
    CHECK_EQ_INT(by_bytes, 7);
    CHECK(same_events(&out_a, &out_b));
    CHECK(same_response(mg_resp_out_end(a, NULL), mg_resp_out_end(b, NULL)));
    mg_chunk_memo_free(&memo);
    mg_buf_free(&out_a);
    mg_buf_free(&out_b);
    mg_resp_out_free(a);
    mg_resp_out_free(b);
}

static void test_bytes_match_tree_completion(void)
{
    const char *json =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":\"Pooling \\\"reuses\\\".\","
        "\"reasoning_content\":\"why\",\"refusal\":null},\"logprobs\":null,"
        "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":42,"
        "\"completion_tokens\":18,\"total_tokens\":60}}";
    size_t n = strlen(json);
    mg_resp_chunk_t ch;
    CHECK(mg_chunk_scan(json, n) >= 0);
    CHECK(mg_resp_chunk_scan(json, n, "message", &ch) == 0 && !ch.tree);
    mg_resp_out_t *a = new_out(), *b = new_out();
    mg_resp_out_scanned(a, &ch, NULL);
    cJSON *t = cJSON_Parse(json);
    mg_resp_out_completion(b, t);
    cJSON_Delete(t);
    const mg_buf_t *fa = mg_resp_out_end(a, NULL), *fb = mg_resp_out_end(b, NULL);
    CHECK(fa->len == fb->len && memcmp(fa->data, fb->data, fa->len) == 0);
    CHECK(mg_resp_out_end(a, NULL) == fa); /* written once */
    cJSON *r = cJSON_Parse(fa->data);
    const cJSON *status = cJSON_GetObjectItemCaseSensitive(r, "status");
    CHECK(cJSON_IsString(status) && strcmp(status->valuestring, "incomplete") == 0);
    cJSON_Delete(r);
    mg_resp_out_free(a);
    mg_resp_out_free(b);
}

int main(void)
{
    MG_RUN(test_scan_text_finish_usage);
    MG_RUN(test_scan_reasoning);
    MG_RUN(test_scan_sends_to_tree);
    MG_RUN(test_bytes_match_tree_stream);
    MG_RUN(test_bytes_match_tree_by_template);
    MG_RUN(test_bytes_match_tree_completion);
    return mg_test_summary();
}
