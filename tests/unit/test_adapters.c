/* Unit tests for the adapter calls (core/luavm/calls.c: encode, decode, decode_event) with the
 * repository's own adapters, the Ollama ones on the recorded fixtures, and the encode results
 * the core must refuse. */
#include "luavm_fixture.h"

/* ---- encode ---------------------------------------------------------------------------- */

static int header_count(const struct curl_slist *h)
{
    int n = 0;
    for (; h; h = h->next) n++;
    return n;
}

static int has_header(const struct curl_slist *h, const char *line)
{
    for (; h; h = h->next)
        if (strcmp(h->data, line) == 0) return 1;
    return 0;
}

static void test_encode_openai(void)
{
    const char *endpoints[] = {"chat", "completions", "embeddings"};
    const char *paths[] = {"/chat/completions", "/completions", "/embeddings"};
    int a = adapter_of(G, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(G->cfg, "oa");
    const mg_provider_conf_t *nokey = mg_config_provider(G->cfg, "oa-nokey");
    for (int i = 0; i < 3; i++) {
        mg_lua_req_t info = {.request_id = "req-e",
                             .endpoint = endpoints[i],
                             .model = "m",
                             .stream = i == 0,
                             .max_tokens = -1,
                             .created = 1};
        int rr = mg_gen_req_new(G, &info);
        mg_encoded_t e;
        err[0] = '\0';
        CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), 0);
        CHECK_STR(e.method, "POST");
        CHECK_STR(e.path, paths[i]);
        CHECK_EQ_INT(header_count(e.headers), 1);
        CHECK(has_header(e.headers, "Authorization: Bearer sk-test"));
        CHECK(e.body == NULL); /* passthrough: the core sends its canonical body */
        CHECK_EQ_INT(e.ndjson, 0);
        mg_encoded_free(&e);
        CHECK(e.path == NULL && e.headers == NULL);
        /* without a key: no Authorization header at all */
        CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, nokey, "up-b", &e, err, sizeof(err)), 0);
        CHECK_EQ_INT(header_count(e.headers), 0);
        CHECK_STR(e.path, paths[i]);
        mg_encoded_free(&e);
        mg_gen_unref_value(G, rr);
    }
    /* an endpoint the adapter does not know: its error comes back */
    mg_lua_req_t info = {.request_id = "req-e",
                         .endpoint = "audio",
                         .model = "m",
                         .stream = 0,
                         .max_tokens = -1,
                         .created = 1};
    int rr = mg_gen_req_new(G, &info);
    mg_encoded_t e;
    CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, oa, "up-a", &e, err, sizeof(err)), -1);
    CHECK(strstr(err, "unsupported endpoint") != NULL);
    CHECK_EQ_INT(e.refusal.kind, MG_LREFUSAL_NOT_FOR_ROUTE);
    CHECK_STR(e.refusal.param, "");
    CHECK(e.path == NULL && e.headers == NULL && e.body == NULL);
    mg_gen_unref_value(G, rr);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

static void test_encode_ollama(void)
{
    int a = adapter_of(G, "ol");
    const mg_provider_conf_t *ol = mg_config_provider(G->cfg, "ol");
    mg_lua_req_t info = {.request_id = "req-o",
                         .endpoint = "chat",
                         .model = "m",
                         .stream = 1,
                         .max_tokens = -1,
                         .created = 1};
    int rr = mg_gen_req_new(G, &info);
    cJSON *body = cJSON_Parse("{\"model\":\"up-c\",\"messages\":[{\"role\":\"user\",\"content\":"
                              "\"hi\"}],\"max_tokens\":5,\"temperature\":0.5,\"stream\":true}");
    CHECK_EQ_INT(mg_gen_req_set_body(G, rr, body), 0);
    mg_encoded_t e;
    err[0] = '\0';
    CHECK_EQ_INT(mg_gen_encode(G, a, &info, &rr, ol, "up-c", &e, err, sizeof(err)), 0);
    if (err[0]) fprintf(stderr, "  err: %s\n", err);
    CHECK_STR(e.method, "POST");
    CHECK_STR(e.path, "/api/chat");
    CHECK_EQ_INT(e.ndjson, 1);
    CHECK_EQ_INT(header_count(e.headers), 0);
    CHECK(e.body != NULL);
    if (e.body) {
        cJSON *want = cJSON_Parse("{\"model\":\"up-c\",\"messages\":[{\"role\":\"user\","
                                  "\"content\":\"hi\"}],\"stream\":true,"
                                  "\"options\":{\"num_predict\":5,\"temperature\":0.5}}");
        if (!cJSON_Compare(e.body, want, 1)) {
            char *s = cJSON_PrintUnformatted(e.body);
            fprintf(stderr, "  ollama body: %s\n", s);
            free(s);
        }
        CHECK(cJSON_Compare(e.body, want, 1));
        cJSON_Delete(want);
    }
    mg_encoded_free(&e);
    /* non-stream: stream is explicitly false (Ollama streams by default) */
    mg_gen_unref_value(G, rr);
    mg_lua_req_t info2 = {.request_id = "req-o2",
                          .endpoint = "embeddings",
                          .model = "m",
                          .stream = 0,
                          .max_tokens = -1,
                          .created = 1};
    rr = mg_gen_req_new(G, &info2);
    cJSON_Delete(body);
    body = cJSON_Parse("{\"input\":[]}");
    mg_gen_req_set_body(G, rr, body);
    CHECK_EQ_INT(mg_gen_encode(G, a, &info2, &rr, ol, "emb", &e, err, sizeof(err)), 0);
    CHECK_STR(e.path, "/api/embed");
    if (e.body) {
        char *s = cJSON_PrintUnformatted(e.body);
        CHECK(strstr(s, "\"input\":[]") != NULL); /* the empty array stays an array */
        free(s);
    }
    mg_encoded_free(&e);
    mg_gen_unref_value(G, rr);
    cJSON_Delete(body);
    /* a part Ollama cannot take: refused as not for this route, with its reason and param */
    mg_lua_req_t info3 = {.request_id = "req-o3",
                          .endpoint = "chat",
                          .model = "m",
                          .stream = 0,
                          .max_tokens = -1,
                          .created = 1};
    rr = mg_gen_req_new(G, &info3);
    body = cJSON_Parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
                       "\"content\":[{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"audio\"}]}]}");
    mg_gen_req_set_body(G, rr, body);
    CHECK_EQ_INT(mg_gen_encode(G, a, &info3, &rr, ol, "up-c", &e, err, sizeof(err)), -1);
    CHECK(strstr(err, "content part type audio") != NULL);
    CHECK_EQ_INT(e.refusal.kind, MG_LREFUSAL_NOT_FOR_ROUTE);
    CHECK_STR(e.refusal.param, "messages[1].content[1].type");
    mg_gen_unref_value(G, rr);
    cJSON_Delete(body);
    /* tool-call arguments that are not JSON: the request is invalid, wherever it goes */
    rr = mg_gen_req_new(G, &info3);
    body = cJSON_Parse("{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                       "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
                       "\"arguments\":\"{oops\"}}]}]}");
    mg_gen_req_set_body(G, rr, body);
    CHECK_EQ_INT(mg_gen_encode(G, a, &info3, &rr, ol, "up-c", &e, err, sizeof(err)), -1);
    CHECK(strstr(err, "not valid JSON") != NULL);
    CHECK_EQ_INT(e.refusal.kind, MG_LREFUSAL_INVALID);
    CHECK_STR(e.refusal.param, "messages[0].tool_calls[0].function.arguments");
    mg_gen_unref_value(G, rr);
    cJSON_Delete(body);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

/* encode results the core must refuse: bad method, missing path, header injection. */
static void test_encode_rejects_bad_results(void)
{
    tree_new();
    write_text(
        "adapters/openai.lua",
        "local M = { name = 'openai', version = 1, passthrough = true }\n"
        "function M.encode(req, route)\n"
        "  if req.model == 'method' then return { method = 'DELETE', path = '/x' } end\n"
        "  if req.model == 'nopath' then return { method = 'POST' } end\n"
        "  if req.model == 'crlf' then return { path = '/x', headers = { X = 'a\\r\\nB: c' } } "
        "end\n"
        "  if req.model == 'colon' then return { path = '/x', headers = { ['X:Y'] = 'a' } } end\n"
        "  if req.model == 'notable' then return 'nope' end\n"
        "  if req.model == 'badbody' then return { path = '/x', body = { f = print } } end\n"
        "  if req.model == 'tblerr' then error({ refusal = 'other', message = 'm', param = 'p' }) end\n"
        "  return { path = '/ok', headers = { ['X-N'] = 5 }, body = { a = 1 } }\n"
        "end\n"
        "return M\n");
    mg_gen_t *g = load();
    CHECK(g != NULL);
    if (!g) {
        tree_remove();
        return;
    }
    int a = adapter_of(g, "oa");
    const mg_provider_conf_t *oa = mg_config_provider(g->cfg, "oa");
    const char *bad[] = {"method", "nopath", "crlf", "colon", "notable", "badbody", "tblerr"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        mg_lua_req_t info = {.request_id = "r",
                             .endpoint = "chat",
                             .model = bad[i],
                             .stream = 0,
                             .max_tokens = -1,
                             .created = 1};
        int rr = mg_gen_req_new(g, &info);
        mg_encoded_t e;
        err[0] = '\0';
        int rc = mg_gen_encode(g, a, &info, &rr, oa, "up", &e, err, sizeof(err));
        if (rc != -1) fprintf(stderr, "  '%s' accepted\n", bad[i]);
        CHECK_EQ_INT(rc, -1);
        CHECK(err[0] != '\0');
        CHECK_EQ_INT(e.refusal.kind, MG_LREFUSAL_NONE); /* a failure, not a refusal */
        CHECK(e.path == NULL && e.headers == NULL && e.body == NULL);
        CHECK_EQ_INT(lua_gettop(g->L), 0);
        mg_gen_unref_value(g, rr);
    }
    mg_lua_req_t info = {.request_id = "r",
                         .endpoint = "chat",
                         .model = "ok",
                         .stream = 0,
                         .max_tokens = -1,
                         .created = 1};
    int rr = mg_gen_req_new(g, &info);
    mg_encoded_t e;
    CHECK_EQ_INT(mg_gen_encode(g, a, &info, &rr, oa, "up", &e, err, sizeof(err)), 0);
    CHECK_STR(e.method, "POST"); /* the default */
    CHECK_STR(e.path, "/ok");
    CHECK(has_header(e.headers, "X-N: 5"));
    CHECK(e.body != NULL);
    mg_encoded_free(&e);
    mg_gen_unref_value(g, rr);
    unload_routing(g);
}

/* ---- decode ---------------------------------------------------------------------------- */

static cJSON *decode_fixture(const char *endpoint, const char *file, cJSON *req_body)
{
    int a = adapter_of(G, "ol");
    mg_lua_req_t info = {.request_id = "req-dec",
                         .endpoint = endpoint,
                         .model = "m",
                         .stream = 0,
                         .max_tokens = -1,
                         .created = 1700000000};
    int rr = mg_gen_req_new(G, &info);
    if (req_body) mg_gen_req_set_body(G, rr, req_body);
    cJSON *resp = fixture(file);
    cJSON *out = NULL;
    err[0] = '\0';
    int rc = resp ? mg_gen_decode(G, a, rr, resp, &out, err, sizeof(err)) : -1;
    if (rc != 0) fprintf(stderr, "  decode %s: %s\n", file, err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
    cJSON_Delete(resp);
    mg_gen_unref_value(G, rr);
    return out;
}

static const char *jstr(const cJSON *o, const char *path)
{
    /* path like "choices.0.message.content" */
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        if (cJSON_IsArray(cur)) cur = cJSON_GetArrayItem(cur, atoi(tok));
        else cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    }
    static char out[1024];
    if (!cur) return "(missing)";
    if (cJSON_IsString(cur)) return cur->valuestring;
    if (cJSON_IsNull(cur)) return "(null)";
    char *s = cJSON_PrintUnformatted(cur);
    snprintf(out, sizeof(out), "%s", s ? s : "");
    free(s);
    return out;
}

static void test_decode_ollama(void)
{
    cJSON *o = decode_fixture("chat", "chat.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "id"), "chatcmpl-req-dec");
        CHECK_STR(jstr(o, "object"), "chat.completion");
        CHECK_STR(jstr(o, "created"), "1700000000");
        CHECK_STR(jstr(o, "model"), "llama3.2");
        CHECK_STR(jstr(o, "choices.0.index"), "0");
        CHECK_STR(jstr(o, "choices.0.message.role"), "assistant");
        CHECK_STR(jstr(o, "choices.0.message.content"), "Hello! How are you today?");
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "stop");
        CHECK_STR(jstr(o, "choices.0.logprobs"), "(null)");
        CHECK_STR(jstr(o, "usage.prompt_tokens"), "26");
        CHECK_STR(jstr(o, "usage.completion_tokens"), "298");
        CHECK_STR(jstr(o, "usage.total_tokens"), "324");
        CHECK(cJSON_IsArray(cJSON_GetObjectItem(o, "choices")));
        cJSON_Delete(o);
    }
    o = decode_fixture("chat", "chat_length.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "length");
        CHECK_STR(jstr(o, "usage.total_tokens"), "41");
        cJSON_Delete(o);
    }
    o = decode_fixture("chat", "chat_tools.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "tool_calls");
        CHECK_STR(jstr(o, "choices.0.message.content"), "(null)");
        CHECK_STR(jstr(o, "choices.0.message.tool_calls.0.type"), "function");
        CHECK_STR(jstr(o, "choices.0.message.tool_calls.0.function.name"), "get_current_weather");
        /* arguments become a JSON string, OpenAI style */
        const char *args = jstr(o, "choices.0.message.tool_calls.0.function.arguments");
        cJSON *parsed = cJSON_Parse(args);
        CHECK(parsed != NULL);
        if (parsed) CHECK_STR(jstr(parsed, "location"), "Paris, FR");
        cJSON_Delete(parsed);
        CHECK(strncmp(jstr(o, "choices.0.message.tool_calls.0.id"), "call_", 5) == 0);
        cJSON_Delete(o);
    }
    o = decode_fixture("completions", "generate.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "id"), "cmpl-req-dec");
        CHECK_STR(jstr(o, "object"), "text_completion");
        CHECK_STR(jstr(o, "choices.0.text"), "The sky is blue because it is the color of the sky.");
        CHECK_STR(jstr(o, "choices.0.finish_reason"), "stop");
        CHECK_STR(jstr(o, "usage.completion_tokens"), "290");
        cJSON_Delete(o);
    }
    o = decode_fixture("embeddings", "embed.json", NULL);
    if (o) {
        CHECK_STR(jstr(o, "object"), "list");
        CHECK_STR(jstr(o, "model"), "all-minilm");
        cJSON *data = cJSON_GetObjectItem(o, "data");
        CHECK(cJSON_IsArray(data) && cJSON_GetArraySize(data) == 2);
        CHECK_STR(jstr(o, "data.1.index"), "1");
        CHECK_STR(jstr(o, "data.0.object"), "embedding");
        cJSON *v =
            cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 0), "embedding"), 0);
        CHECK(v && fabs(v->valuedouble - 0.010071029) < 1e-12);
        CHECK_EQ_INT(
            cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(data, 1), "embedding")), 10);
        CHECK_STR(jstr(o, "usage.prompt_tokens"), "8");
        cJSON_Delete(o);
    }
    /* base64 embeddings when the request asked for them */
    cJSON *rb = cJSON_Parse("{\"input\":\"x\",\"encoding_format\":\"base64\"}");
    o = decode_fixture("embeddings", "embed.json", rb);
    if (o) {
        const char *b64 = jstr(o, "data.0.embedding");
        CHECK_EQ_INT(strlen(b64), 56); /* 10 floats * 4 bytes = 40 bytes -> 56 chars */
        cJSON_Delete(o);
    }
    cJSON_Delete(rb);
    /* an error object from Ollama is an adapter error */
    int a = adapter_of(G, "ol");
    int rr = mg_gen_req_new(G, &(mg_lua_req_t){.request_id = "r",
                                               .endpoint = "chat",
                                               .model = "m",
                                               .stream = 0,
                                               .max_tokens = -1,
                                               .created = 1});
    cJSON *resp = cJSON_Parse("{\"error\":\"model 'x' not found\"}");
    cJSON *out = (cJSON *)1;
    CHECK_EQ_INT(mg_gen_decode(G, a, rr, resp, &out, err, sizeof(err)), -1);
    CHECK(out == NULL);
    CHECK(strstr(err, "model 'x' not found") != NULL);
    cJSON_Delete(resp);
    mg_gen_unref_value(G, rr);
    CHECK_EQ_INT(lua_gettop(G->L), 0);
}

typedef struct {
    cJSON *chunks; /* all chunks, in order */
    int done_at;   /* 1-based line where done was first reported; 0 never */
    int error_at;  /* 1-based line that failed; 0 none */
    char error[512];
} stream_t;

static void run_stream(const char *endpoint, const char *file, stream_t *st)
{
    memset(st, 0, sizeof(*st));
    st->chunks = cJSON_CreateArray();
    int a = adapter_of(G, "ol");
    int rr = mg_gen_req_new(G, &(mg_lua_req_t){.request_id = "req-s",
                                               .endpoint = endpoint,
                                               .model = "m",
                                               .stream = 1,
                                               .max_tokens = -1,
                                               .created = 1700000001});
    int state = mg_gen_table_new(G);
    char p[512];
    snprintf(p, sizeof(p), "%s/tests/fixtures/ollama/%s", MG_SOURCE_DIR, file);
    char *text = read_all(p);
    CHECK(text != NULL);
    int lineno = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        lineno++;
        cJSON *data = cJSON_Parse(line);
        CHECK(data != NULL);
        cJSON *out = NULL;
        int done = -1;
        int rc =
            mg_gen_decode_event(G, a, rr, state, data, &out, &done, st->error, sizeof(st->error));
        cJSON_Delete(data);
        CHECK_EQ_INT(lua_gettop(G->L), 0);
        if (rc != 0) {
            CHECK(out == NULL);
            st->error_at = lineno;
            break;
        }
        CHECK(cJSON_IsArray(out));
        if (done && !st->done_at) st->done_at = lineno;
        cJSON *c;
        while ((c = cJSON_DetachItemFromArray(out, 0))) cJSON_AddItemToArray(st->chunks, c);
        cJSON_Delete(out);
    }
    free(text);
    mg_gen_unref_value(G, state);
    mg_gen_unref_value(G, rr);
}

static void test_decode_event_chat_stream(void)
{
    stream_t st;
    run_stream("chat", "chat_stream.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 6); /* only the last line says done */
    int n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 6); /* 5 content chunks + the finish chunk */
    char text[256] = "";
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_GetArrayItem(st.chunks, i);
        CHECK_STR(jstr(c, "object"), "chat.completion.chunk");
        CHECK_STR(jstr(c, "id"), "chatcmpl-req-s");
        CHECK_STR(jstr(c, "created"), "1700000001");
        CHECK_STR(jstr(c, "model"), "llama3.2");
        const char *content = jstr(c, "choices.0.delta.content");
        if (strcmp(content, "(missing)") != 0)
            strncat(text, content, sizeof(text) - strlen(text) - 1);
        if (i == 0) CHECK_STR(jstr(c, "choices.0.delta.role"), "assistant");
        else CHECK_STR(jstr(c, "choices.0.delta.role"), "(missing)");
        if (i < n - 1) {
            /* explicitly null, not absent, on every non-final chunk */
            CHECK_STR(jstr(c, "choices.0.finish_reason"), "(null)");
            CHECK_STR(jstr(c, "usage"), "(missing)");
        }
    }
    CHECK_STR(text, "The sky is blue.");
    cJSON *last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "stop");
    CHECK_STR(jstr(last, "choices.0.delta"), "{}"); /* an empty object, not [] */
    CHECK_STR(jstr(last, "usage.prompt_tokens"), "26");
    CHECK_STR(jstr(last, "usage.completion_tokens"), "5");
    CHECK_STR(jstr(last, "usage.total_tokens"), "31");
    cJSON_Delete(st.chunks);
}

static void test_decode_event_tools_and_generate(void)
{
    stream_t st;
    run_stream("chat", "chat_stream_tools.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 2);
    int n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 2);
    cJSON *first = cJSON_GetArrayItem(st.chunks, 0);
    CHECK_STR(jstr(first, "choices.0.delta.tool_calls.0.index"), "0");
    CHECK_STR(jstr(first, "choices.0.delta.tool_calls.0.function.name"), "get_current_weather");
    cJSON *last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "tool_calls");
    CHECK_STR(jstr(last, "usage.total_tokens"), "155");
    cJSON_Delete(st.chunks);

    run_stream("completions", "generate_stream.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 0);
    CHECK_EQ_INT(st.done_at, 4);
    n = cJSON_GetArraySize(st.chunks);
    CHECK_EQ_INT(n, 4);
    char text[128] = "";
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_GetArrayItem(st.chunks, i);
        CHECK_STR(jstr(c, "object"), "text_completion");
        strncat(text, jstr(c, "choices.0.text"), sizeof(text) - strlen(text) - 1);
    }
    CHECK_STR(text, "The sky is blue");
    last = cJSON_GetArrayItem(st.chunks, n - 1);
    CHECK_STR(jstr(last, "choices.0.finish_reason"), "length");
    CHECK_STR(jstr(last, "usage.completion_tokens"), "3");
    cJSON_Delete(st.chunks);
}

static void test_decode_event_error_line(void)
{
    stream_t st;
    run_stream("chat", "chat_stream_error.ndjson", &st);
    CHECK_EQ_INT(st.error_at, 2);
    CHECK_EQ_INT(st.done_at, 0);
    CHECK(strstr(st.error, "unexpected EOF") != NULL);
    CHECK_EQ_INT(cJSON_GetArraySize(st.chunks), 1); /* the chunk before the error */
    cJSON_Delete(st.chunks);
}

/* ---- list_models, decode_models ------------------------------------------------------- */

static void test_models_calls(void)
{
    int a = adapter_of(G, "oa");
    mg_encoded_t e;
    CHECK_EQ_INT(
        mg_gen_models_request(G, a, mg_config_provider(G->cfg, "oa"), &e, err, sizeof(err)), 0);
    CHECK_STR(e.method, "GET");
    CHECK_STR(e.path, "/models");
    CHECK(has_header(e.headers, "Authorization: Bearer sk-test"));
    CHECK(e.body == NULL);
    mg_encoded_free(&e);
    CHECK_EQ_INT(
        mg_gen_models_request(G, a, mg_config_provider(G->cfg, "oa-nokey"), &e, err, sizeof(err)),
        0);
    CHECK_EQ_INT(header_count(e.headers), 0); /* no key, no Authorization */
    mg_encoded_free(&e);
    cJSON *list = cJSON_Parse("{\"object\":\"list\",\"data\":[{\"id\":\"meta/a\"},{\"id\":\"\"},"
                              "{\"name\":\"x\"},7,{\"id\":\"meta/b\",\"owned_by\":\"n\"}]}");
    char **ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(mg_gen_models_decode(G, a, list, &ids, &n, err, sizeof(err)), 0);
    CHECK_EQ_INT(n, 2); /* the entries without an id are left out */
    if (n == 2) {
        CHECK_STR(ids[0], "meta/a");
        CHECK_STR(ids[1], "meta/b");
    }
    mg_model_ids_free(ids, n);
    cJSON_Delete(list);
    /* an answer of another shape lists nothing, without an error */
    cJSON *odd = cJSON_Parse("[1,2]");
    CHECK_EQ_INT(mg_gen_models_decode(G, a, odd, &ids, &n, err, sizeof(err)), 0);
    CHECK_EQ_INT(n, 0);
    mg_model_ids_free(ids, n);
    cJSON_Delete(odd);

    int o = adapter_of(G, "ol");
    CHECK_EQ_INT(
        mg_gen_models_request(G, o, mg_config_provider(G->cfg, "ol"), &e, err, sizeof(err)), 0);
    CHECK_STR(e.path, "/api/tags");
    mg_encoded_free(&e);
    cJSON *tags = cJSON_Parse("{\"models\":[{\"name\":\"llama3.2:latest\",\"size\":1},"
                              "{\"model\":\"qwen3:8b\"}]}");
    CHECK_EQ_INT(mg_gen_models_decode(G, o, tags, &ids, &n, err, sizeof(err)), 0);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK_STR(ids[0], "llama3.2:latest");
        CHECK_STR(ids[1], "qwen3:8b");
    }
    mg_model_ids_free(ids, n);
    cJSON_Delete(tags);
}

int main(void)
{
    tree_new();
    G = load();
    if (!G) {
        fprintf(stderr, "cannot load the shared generation: %s\n", err);
        tree_remove();
        return 1;
    }
    MG_RUN(test_encode_openai);
    MG_RUN(test_encode_ollama);
    MG_RUN(test_decode_ollama);
    MG_RUN(test_decode_event_chat_stream);
    MG_RUN(test_decode_event_tools_and_generate);
    MG_RUN(test_decode_event_error_line);
    MG_RUN(test_models_calls);
    mg_gen_unref(G);
    tree_remove();
    MG_RUN(test_encode_rejects_bad_results);
    return mg_test_summary();
}
