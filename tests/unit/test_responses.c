/* Unit tests for core/pipeline/responses_in.c and responses_out.c: a Responses request as a
 * chat body (input as a string and as items, instructions, function tools and tool_choice,
 * text.format, max_output_tokens, the gateway's extensions kept, refused parameters with
 * their param), the history of a previous response put after the instructions; chat chunks
 * as the Responses event sequence (sequence numbers, one id, item order, reasoning, empty
 * tool_calls making nothing, several
 * interleaved tool calls with their full arguments in .done, usage, incomplete), a whole
 * completion as the Response, a broken stream as response.failed. */
#include "mgtest.h"
#include "pipeline/responses_in.h"
#include "pipeline/responses_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cJSON *chat_of(const char *req_text, mg_resp_error_t *err)
{
    cJSON *req = cJSON_Parse(req_text);
    cJSON *chat = NULL;
    int rc = mg_resp_to_chat(req, &chat, err);
    cJSON_Delete(req);
    return rc == 0 ? chat : NULL;
}

static const char *str(const cJSON *o, const char *path)
{
    /* "a.b.c" through objects, numbers as array indices */
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *v = o;
    for (char *tok = strtok(buf, "."); tok && v; tok = strtok(NULL, "."))
        v = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(v, atoi(tok))
                                             : cJSON_GetObjectItemCaseSensitive(v, tok);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *at(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static void test_string_input_and_instructions(void)
{
    mg_resp_error_t err;
    cJSON *chat = chat_of("{\"model\":\"m\",\"input\":\"hi\",\"instructions\":\"be brief\","
                          "\"max_output_tokens\":7,\"temperature\":0.5,\"stream\":true,"
                          "\"priority\":\"P1\",\"metadata\":{\"a\":\"b\"},\"store\":false,"
                          "\"reasoning\":{\"effort\":\"low\"}}",
                          &err);
    CHECK(chat != NULL);
    CHECK_STR(str(chat, "model"), "m");
    CHECK_EQ_INT(cJSON_GetArraySize(at(chat, "messages")), 2);
    CHECK_STR(str(chat, "messages.0.role"), "system");
    CHECK_STR(str(chat, "messages.0.content"), "be brief");
    CHECK_STR(str(chat, "messages.1.role"), "user");
    CHECK_STR(str(chat, "messages.1.content"), "hi");
    CHECK_EQ_INT((int)at(chat, "max_tokens")->valuedouble, 7);
    CHECK(at(chat, "max_output_tokens") == NULL);
    CHECK(at(chat, "temperature")->valuedouble == 0.5);
    CHECK(cJSON_IsTrue(at(chat, "stream")));
    CHECK_STR(str(chat, "priority"), "P1");  /* the gateway's, taken out later */
    CHECK_STR(str(chat, "metadata.a"), "b"); /* read by the parse step, stripped */
    CHECK_STR(str(chat, "reasoning_effort"), "low");
    CHECK(at(chat, "store") == NULL && at(chat, "input") == NULL &&
          at(chat, "instructions") == NULL);
    cJSON *turn = mg_resp_turn_messages(chat, 1);
    CHECK_EQ_INT(cJSON_GetArraySize(turn), 1);
    CHECK_STR(str(turn, "0.content"), "hi");
    cJSON_Delete(turn);
    cJSON_Delete(chat);
}

static void test_items_tools_and_format(void)
{
    mg_resp_error_t err;
    cJSON *chat = chat_of(
        "{\"model\":\"m\",\"input\":["
        "{\"role\":\"developer\",\"content\":\"rules\"},"
        "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"look\"},"
        "{\"type\":\"input_image\",\"image_url\":\"data:image/png;base64,AAAA\",\"detail\":\"low\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"let me \"},"
        "{\"type\":\"output_text\",\"text\":\"check\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{}\"},"
        "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"two\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
        "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"parallel_tool_calls\":false,"
        "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\",\"schema\":{\"type\":\"object\"},\"strict\":true}}}",
        &err);
    CHECK(chat != NULL);
    if (!chat) {
        fprintf(stderr, "refused: %s (%s)\n", err.message, err.param);
        return;
    }
    const cJSON *msgs = at(chat, "messages");
    CHECK_EQ_INT(cJSON_GetArraySize(msgs), 5);
    CHECK_STR(str(msgs, "0.role"), "system");
    CHECK_STR(str(msgs, "0.content"), "rules");
    CHECK_STR(str(msgs, "1.content.0.type"), "text");
    CHECK_STR(str(msgs, "1.content.1.type"), "image_url");
    CHECK_STR(str(msgs, "1.content.1.image_url.url"), "data:image/png;base64,AAAA");
    CHECK_STR(str(msgs, "1.content.1.image_url.detail"), "low");
    /* the assistant's text and both calls are one turn */
    CHECK_STR(str(msgs, "2.role"), "assistant");
    CHECK_STR(str(msgs, "2.content"), "let me check");
    CHECK_STR(str(msgs, "2.tool_calls.0.id"), "c1");
    CHECK_STR(str(msgs, "2.tool_calls.0.function.name"), "f");
    CHECK_STR(str(msgs, "2.tool_calls.0.function.arguments"), "{\"x\":1}");
    CHECK_STR(str(msgs, "2.tool_calls.1.id"), "c2");
    CHECK_STR(str(msgs, "3.role"), "tool");
    CHECK_STR(str(msgs, "3.tool_call_id"), "c1");
    CHECK_STR(str(msgs, "3.content"), "one");
    CHECK_STR(str(msgs, "4.content"), "two");
    CHECK_STR(str(chat, "tools.0.type"), "function");
    CHECK_STR(str(chat, "tools.0.function.name"), "f");
    CHECK_STR(str(chat, "tools.0.function.description"), "d");
    CHECK(cJSON_IsTrue(at(at(cJSON_GetArrayItem(at(chat, "tools"), 0), "function"), "strict")));
    CHECK_STR(str(chat, "tool_choice.function.name"), "f");
    CHECK(cJSON_IsFalse(at(chat, "parallel_tool_calls")));
    CHECK_STR(str(chat, "response_format.type"), "json_schema");
    CHECK_STR(str(chat, "response_format.json_schema.name"), "n");
    CHECK_STR(str(chat, "response_format.json_schema.schema.type"), "object");
    cJSON_Delete(chat);
}

static void test_refused_with_param(void)
{
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"model\":\"m\",\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]"},
        {"{\"model\":\"m\",\"input\":\"x\",\"background\":true}", "background"},
        {"{\"model\":\"m\",\"input\":\"x\",\"truncation\":\"auto\"}", "truncation"},
        {"{\"model\":\"m\",\"input\":\"x\",\"include\":[\"reasoning.encrypted_content\"]}",
         "include"},
        {"{\"model\":\"m\",\"input\":\"x\",\"prompt\":{\"id\":\"p\"}}", "prompt"},
        {"{\"model\":\"m\",\"input\":\"x\",\"top_logprobs\":3}", "top_logprobs"},
        {"{\"model\":\"m\",\"input\":\"x\",\"bogus\":1}", "bogus"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"item_reference\",\"id\":\"i\"}]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\"}]}]}",
         "input[0].content[0]"},
        {"{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"file_id\":\"f\"}]}]}",
         "input[0].content[0]"},
        {"{\"model\":\"m\",\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]"},
        {"{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":{\"type\":\"file_search\"}}",
         "tool_choice"},
        {"{\"model\":\"m\",\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}",
         "text.format"},
        {"{\"model\":\"\",\"input\":\"x\"}", "model"},
        {"{\"model\":\"m\"}", "input"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mg_resp_error_t err;
        cJSON *chat = chat_of(cases[i].body, &err);
        CHECK(chat == NULL);
        CHECK_STR(err.param, cases[i].param);
        CHECK(err.message[0] != '\0');
        cJSON_Delete(chat);
    }
    /* their do-nothing values pass */
    mg_resp_error_t err;
    cJSON *chat =
        chat_of("{\"model\":\"m\",\"input\":\"x\",\"background\":false,\"truncation\":\"disabled\","
                "\"include\":[],\"top_logprobs\":0,\"conversation\":null}",
                &err);
    CHECK(chat != NULL);
    cJSON_Delete(chat);
}

static void test_tool_choice_none_shows_no_tools(void)
{
    mg_resp_error_t err;
    cJSON *chat = chat_of("{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"none\","
                          "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
                          &err);
    CHECK(chat != NULL);
    CHECK(at(chat, "tools") == NULL && at(chat, "tool_choice") == NULL);
    cJSON_Delete(chat);
    chat = chat_of("{\"model\":\"m\",\"input\":\"x\",\"tool_choice\":\"required\","
                   "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}]}",
                   &err);
    CHECK_STR(str(chat, "tool_choice"), "required");
    CHECK_STR(str(chat, "tools.0.function.name"), "f");
    cJSON_Delete(chat);
}

static void test_history_after_instructions(void)
{
    mg_resp_error_t err;
    cJSON *chat = chat_of("{\"model\":\"m\",\"input\":\"three\",\"instructions\":\"sys\"}", &err);
    cJSON *hist = cJSON_Parse("[{\"role\":\"user\",\"content\":\"one\"},"
                              "{\"role\":\"assistant\",\"content\":\"two\"}]");
    CHECK_EQ_INT(mg_resp_prepend_history(chat, hist), 0);
    const cJSON *msgs = at(chat, "messages");
    CHECK_EQ_INT(cJSON_GetArraySize(msgs), 4);
    CHECK_STR(str(msgs, "0.content"), "sys");
    CHECK_STR(str(msgs, "1.content"), "one");
    CHECK_STR(str(msgs, "2.content"), "two");
    CHECK_STR(str(msgs, "3.content"), "three");
    cJSON *turn = mg_resp_turn_messages(chat, 1);
    CHECK_EQ_INT(cJSON_GetArraySize(turn), 3);
    cJSON_Delete(turn);
    cJSON_Delete(chat);
    /* without instructions, and with an empty input (the history alone) */
    chat = chat_of("{\"model\":\"m\",\"input\":[]}", &err);
    CHECK(chat != NULL);
    CHECK_EQ_INT(mg_resp_prepend_history(chat, hist), 0);
    CHECK_EQ_INT(cJSON_GetArraySize(at(chat, "messages")), 2);
    CHECK_STR(str(chat, "messages.0.content"), "one");
    cJSON_Delete(chat);
    cJSON_Delete(hist);
}

static void test_input_items(void)
{
    cJSON *req = cJSON_Parse("{\"model\":\"m\",\"input\":\"hi\"}");
    cJSON *items = mg_resp_input_items(req, "abc");
    CHECK_EQ_INT(cJSON_GetArraySize(items), 1);
    CHECK_STR(str(items, "0.type"), "message");
    CHECK_STR(str(items, "0.role"), "user");
    CHECK_STR(str(items, "0.content.0.type"), "input_text");
    CHECK_STR(str(items, "0.content.0.text"), "hi");
    CHECK_STR(str(items, "0.id"), "msg_abc_in0");
    cJSON_Delete(items);
    cJSON_Delete(req);
    req =
        cJSON_Parse("{\"model\":\"m\",\"input\":[{\"role\":\"assistant\",\"content\":\"a\"},"
                    "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"c\",\"name\":\"f\","
                    "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"c\","
                    "\"output\":\"o\"}]}");
    items = mg_resp_input_items(req, "abc");
    CHECK_EQ_INT(cJSON_GetArraySize(items), 3);
    CHECK_STR(str(items, "0.content.0.type"), "output_text");
    CHECK_STR(str(items, "1.id"), "fc_1"); /* the client's own id kept */
    CHECK_STR(str(items, "2.id"), "fco_abc_in2");
    CHECK_STR(str(items, "2.output"), "o");
    cJSON_Delete(items);
    cJSON_Delete(req);
    /* printed: the text a string input is written as equals the tree's print; items too */
    const char *reqs[] = {"{\"input\":\"hi \\\"there\\\"\\n\\u00e9\"}", "{\"input\":\"\"}",
                          "{\"input\":[{\"role\":\"user\",\"content\":\"a\"}]}"};
    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        req = cJSON_Parse(reqs[i]);
        items = mg_resp_input_items(req, "abc");
        char *tree = cJSON_PrintUnformatted(items);
        mg_buf_t text = {0};
        CHECK_EQ_INT(mg_resp_input_items_print(req, "abc", &text), 0);
        CHECK_EQ_INT(mg_buf_append(&text, "", 1), 0);
        cJSON *back = cJSON_Parse(text.data);
        CHECK(back && cJSON_Compare(back, items, 1));
        CHECK(tree != NULL);
        cJSON_Delete(back);
        mg_buf_free(&text);
        free(tree);
        cJSON_Delete(items);
        cJSON_Delete(req);
    }
}

/* ---- the answer ---- */

/* The events in buf as a cJSON array of their data, checking the SSE framing. */
static cJSON *parse_events(const mg_buf_t *b)
{
    cJSON *all = cJSON_CreateArray();
    const char *p = b->data ? b->data : "";
    while (*p) {
        const char *ev = strstr(p, "event: "), *data = strstr(p, "\ndata: ");
        const char *end = data ? strstr(data, "\n\n") : NULL;
        if (ev != p || !data || !end) break;
        cJSON *j = cJSON_ParseWithLength(data + 7, (size_t)(end - data - 7));
        /* the event line names the type the data carries */
        size_t tl = (size_t)(data - ev - 7);
        const char *type = str(j, "type");
        if (!type || strlen(type) != tl || strncmp(type, ev + 7, tl) != 0) {
            cJSON_Delete(j);
            break;
        }
        cJSON_AddItemToArray(all, j);
        p = end + 2;
    }
    if (*p) {
        cJSON_Delete(all);
        return NULL;
    }
    return all;
}

static void feed(mg_resp_out_t *o, const char *chunk, mg_buf_t *out)
{
    cJSON *c = cJSON_Parse(chunk);
    mg_resp_out_chunk(o, c, out);
    cJSON_Delete(c);
}

static int type_at(const cJSON *evs, int i, const char *type)
{
    const char *t = str(cJSON_GetArrayItem(evs, i), "type");
    if (t && strcmp(t, type) == 0) return 1;
    fprintf(stderr, "event %d is %s, not %s\n", i, t ? t : "(none)", type);
    return 0;
}

static mg_resp_out_t *new_out(void)
{
    cJSON *req = cJSON_Parse("{\"model\":\"m\",\"input\":\"x\"}");
    mg_resp_out_t *o = mg_resp_out_new("resp_abc", 1700000000, "m", mg_resp_skeleton(req));
    cJSON_Delete(req);
    return o;
}

static void test_text_stream_sequence(void)
{
    mg_resp_out_t *o = new_out();
    mg_buf_t out = {0};
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}",
         &out);
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}", &out);
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}", &out);
    /* vLLM's empty tool_calls and empty content make nothing */
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\",\"tool_calls\":[]}}]}", &out);
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}", &out);
    feed(o,
         "{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
         "\"prompt_tokens_details\":{\"cached_tokens\":1}}}",
         &out);
    cJSON *final = cJSON_Parse(mg_resp_out_end(o, &out)->data); /* the Response's text */
    cJSON *evs = parse_events(&out);
    CHECK(evs != NULL);
    static const char *const want[] = {"response.created",           "response.in_progress",
                                       "response.output_item.added", "response.content_part.added",
                                       "response.output_text.delta", "response.output_text.delta",
                                       "response.output_text.done",  "response.content_part.done",
                                       "response.output_item.done",  "response.completed"};
    CHECK_EQ_INT(cJSON_GetArraySize(evs), 10);
    for (int i = 0; i < 10; i++) {
        CHECK(type_at(evs, i, want[i]));
        CHECK_EQ_INT((int)at(cJSON_GetArrayItem(evs, i), "sequence_number")->valuedouble, i);
    }
    CHECK_STR(str(evs, "0.response.id"), "resp_abc");
    CHECK_STR(str(evs, "9.response.id"), "resp_abc");
    CHECK_STR(str(evs, "0.response.status"), "in_progress");
    CHECK_STR(str(evs, "9.response.status"), "completed");
    CHECK_STR(str(evs, "2.item.id"), "msg_abc_0");
    CHECK_STR(str(evs, "4.item_id"), "msg_abc_0");
    CHECK_STR(str(evs, "6.text"), "Hello");
    CHECK_STR(str(evs, "9.response.output.0.content.0.text"), "Hello");
    const cJSON *usage = at(final, "usage");
    CHECK_EQ_INT((int)at(usage, "input_tokens")->valuedouble, 3);
    CHECK_EQ_INT((int)at(usage, "output_tokens")->valuedouble, 2);
    CHECK_EQ_INT((int)at(usage, "total_tokens")->valuedouble, 5);
    CHECK_EQ_INT((int)at(at(usage, "input_tokens_details"), "cached_tokens")->valuedouble, 1);
    long long in, outn;
    mg_resp_out_usage(o, &in, &outn);
    CHECK(in == 3 && outn == 2);
    cJSON_Delete(evs);
    mg_buf_free(&out);
    cJSON_Delete(final);
    mg_resp_out_free(o);
}

static void test_tool_calls_interleaved(void)
{
    mg_resp_out_t *o = new_out();
    mg_buf_t out = {0};
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}", &out);
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}", &out);
    feed(o,
         "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"ca\","
         "\"function\":{\"name\":\"a\",\"arguments\":\"\"}},{\"index\":1,\"id\":\"cb\","
         "\"function\":{\"name\":\"b\",\"arguments\":\"{\\\"y\\\"\"}}]}}]}",
         &out);
    feed(o,
         "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
         "\"function\":{\"arguments\":\"{\\\"x\\\":1}\"}}]}}]}",
         &out);
    feed(o,
         "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,"
         "\"function\":{\"arguments\":\":2}\"}}]}}]}",
         &out);
    feed(o,
         "{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":2,\"id\":\"cc\","
         "\"function\":{\"name\":\"c\"}}]},\"finish_reason\":\"tool_calls\"}]}",
         &out);
    cJSON *final = cJSON_Parse(mg_resp_out_end(o, &out)->data); /* the Response's text */
    cJSON *evs = parse_events(&out);
    CHECK(evs != NULL);
    const cJSON *output = at(final, "output");
    CHECK_EQ_INT(cJSON_GetArraySize(output), 5);
    CHECK_STR(str(output, "0.type"), "reasoning");
    CHECK_STR(str(output, "0.summary.0.text"), "hmm");
    CHECK_STR(str(output, "1.type"), "message");
    CHECK_STR(str(output, "2.type"), "function_call");
    CHECK_STR(str(output, "2.call_id"), "ca");
    CHECK_STR(str(output, "2.arguments"), "{\"x\":1}");
    CHECK_STR(str(output, "3.call_id"), "cb");
    CHECK_STR(str(output, "3.arguments"), "{\"y\":2}");
    CHECK_STR(str(output, "4.name"), "c");
    CHECK_STR(str(output, "4.arguments"), "{}");
    /* every call: added before its deltas; .done has the whole arguments, the deltas add up */
    for (int item = 2; item <= 4; item++) {
        int added = -1, first_delta = -1, done = -1;
        mg_buf_t sum = {0};
        int i = 0;
        for (const cJSON *e = evs->child; e; e = e->next, i++) {
            const cJSON *oi = at(e, "output_index");
            if (!cJSON_IsNumber(oi) || (int)oi->valuedouble != item) continue;
            const char *t = str(e, "type");
            if (strcmp(t, "response.output_item.added") == 0) added = i;
            if (strcmp(t, "response.function_call_arguments.delta") == 0) {
                if (first_delta < 0) first_delta = i;
                mg_buf_append_str(&sum, str(e, "delta"));
            }
            if (strcmp(t, "response.function_call_arguments.done") == 0) {
                done = i;
                CHECK_STR(str(e, "arguments"), str(output, item == 2   ? "2.arguments"
                                                           : item == 3 ? "3.arguments"
                                                                       : "4.arguments"));
                CHECK_STR(sum.data ? sum.data : "", str(e, "arguments"));
            }
        }
        CHECK(added >= 0 && first_delta > added && done > first_delta);
        mg_buf_free(&sum);
    }
    /* the reasoning item closes before the message opens, the message before the calls */
    int rs_done = -1, msg_added = -1, msg_done = -1, fc_added = -1, i = 0;
    for (const cJSON *e = evs->child; e; e = e->next, i++) {
        const char *t = str(e, "type");
        const char *type = str(e, "item.type");
        if (strcmp(t, "response.output_item.done") == 0 && strcmp(type, "reasoning") == 0)
            rs_done = i;
        if (strcmp(t, "response.output_item.added") == 0 && strcmp(type, "message") == 0)
            msg_added = i;
        if (strcmp(t, "response.output_item.done") == 0 && strcmp(type, "message") == 0)
            msg_done = i;
        if (strcmp(t, "response.output_item.added") == 0 && strcmp(type, "function_call") == 0 &&
            fc_added < 0)
            fc_added = i;
    }
    CHECK(rs_done >= 0 && rs_done < msg_added && msg_done < fc_added);
    cJSON *m = mg_resp_out_message(o);
    CHECK_STR(str(m, "content"), "ok");
    CHECK_EQ_INT(cJSON_GetArraySize(at(m, "tool_calls")), 3);
    CHECK_STR(str(m, "tool_calls.1.function.arguments"), "{\"y\":2}");
    cJSON_Delete(m);
    cJSON_Delete(evs);
    mg_buf_free(&out);
    cJSON_Delete(final);
    mg_resp_out_free(o);
}

static void test_completion_and_incomplete(void)
{
    mg_resp_out_t *o = new_out();
    cJSON *c = cJSON_Parse("{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                           "\"content\":\"cut\",\"reasoning_content\":\"why\"},"
                           "\"finish_reason\":\"length\"}],"
                           "\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":9,"
                           "\"completion_tokens_details\":{\"reasoning_tokens\":2}}}");
    mg_resp_out_completion(o, c);
    cJSON_Delete(c);
    cJSON *r = cJSON_Parse(mg_resp_out_end(o, NULL)->data);
    CHECK_STR(str(r, "object"), "response");
    CHECK_STR(str(r, "status"), "incomplete");
    CHECK_STR(str(r, "incomplete_details.reason"), "max_output_tokens");
    CHECK_STR(str(r, "output.0.type"), "reasoning");
    CHECK_STR(str(r, "output.1.content.0.text"), "cut");
    CHECK_STR(str(r, "output.1.status"), "incomplete"); /* the message the limit cut */
    CHECK_EQ_INT(
        (int)at(at(at(r, "usage"), "output_tokens_details"), "reasoning_tokens")->valuedouble, 2);
    CHECK_STR(str(r, "tool_choice"), "auto");
    CHECK_STR(str(r, "text.format.type"), "text");
    CHECK(cJSON_IsTrue(at(r, "store")));
    cJSON_Delete(r);
    mg_resp_out_free(o);
}

static void test_broken_stream_fails(void)
{
    mg_resp_out_t *o = new_out();
    mg_buf_t out = {0};
    feed(o, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}", &out);
    mg_resp_out_fail(o, "server_error", "UPSTREAM_ERROR: the upstream connection failed", &out);
    cJSON *evs = parse_events(&out);
    CHECK(evs != NULL);
    int n = cJSON_GetArraySize(evs);
    CHECK(type_at(evs, n - 1, "response.failed"));
    const cJSON *last = cJSON_GetArrayItem(evs, n - 1);
    CHECK_STR(str(last, "response.id"), "resp_abc");
    CHECK_STR(str(last, "response.status"), "failed");
    CHECK_STR(str(last, "response.error.code"), "server_error");
    CHECK_STR(str(last, "response.output.0.content.0.text"), "par");
    for (const cJSON *e = evs->child; e; e = e->next)
        CHECK(strcmp(str(e, "type"), "response.completed") != 0);
    cJSON_Delete(evs);
    mg_buf_free(&out);
    mg_resp_out_free(o);
}

int main(void)
{
    MG_RUN(test_string_input_and_instructions);
    MG_RUN(test_items_tools_and_format);
    MG_RUN(test_refused_with_param);
    MG_RUN(test_tool_choice_none_shows_no_tools);
    MG_RUN(test_history_after_instructions);
    MG_RUN(test_input_items);
    MG_RUN(test_text_stream_sequence);
    MG_RUN(test_tool_calls_interleaved);
    MG_RUN(test_completion_and_incomplete);
    MG_RUN(test_broken_stream_fails);
    return mg_test_summary();
}
