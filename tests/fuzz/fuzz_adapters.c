/* fuzz_adapters: the Lua adapters' decode functions (adapters/NAME.lua, called through
 * core/luavm/calls.c) on what an upstream answers. An engine is not trusted: decode(req, resp)
 * of a whole answer and decode_event(req, line, state) of each line of a stream either return
 * what the contract says (0 and a JSON object, or 0 and an array of chunks) or fail with an
 * error message (-1); the Lua stack is as it was, and the state stays usable for the next line. The
 * repository's own adapters, policies and lib are loaded once, from the working directory
 * (tests/fuzz/run runs from the repository root; MG_FUZZ_ROOT overrides it).
 *
 * Input: byte 0 picks the adapter (ollama, anthropic, triton: openai passes answers through
 * and has no decode), byte 1 the endpoint
 * (chat, completions, embeddings), whether the request streams and whether the request's body
 * carries tools; the rest is the answer: for decode one JSON text, for decode_event lines
 * (each parsed as JSON, a line that is not JSON passed as a string, as an SSE data line that
 * is not JSON may be). A failed check traps. */
#include <cjson/cJSON.h>
#include <lua.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conf/config.h"
#include "luavm/luavm.h"

static mg_gen_t *G;
static int adapters[3];

static const char *BODY_PLAIN =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
static const char *BODY_TOOLS =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":"
    "\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"tool_choice\":\"auto\",\"echo\":true,\"n\":2,\"logprobs\":true}";

static int adapter_of(const char *provider_id)
{
    const mg_provider_conf_t *p = mg_config_provider(G->cfg, provider_id);
    return p ? G->provider_adapter[p - G->cfg->providers] : -1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char cwd[1024], dir[] = "/tmp/mg-fuzz-adapters-XXXXXX", path[1200], err[2048];
    const char *root = getenv("MG_FUZZ_ROOT");
    if (!root) root = getcwd(cwd, sizeof(cwd));
    if (!root || !mkdtemp(dir)) abort();
    snprintf(path, sizeof(path), "%s/moongate.yaml", dir);
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fprintf(f,
            "server:\n  listen: 127.0.0.1:0\n"
            "lua:\n  policies: %s/policies\n  adapters: %s/adapters\n  lib: %s/lua\n"
            "providers:\n"
            "  - { id: ol, adapter: ollama, base_url: http://127.0.0.1:1 }\n"
            "  - { id: an, adapter: anthropic, base_url: http://127.0.0.1:1, api_key: k }\n"
            "  - { id: tr, adapter: triton, base_url: http://127.0.0.1:1 }\n"
            "models:\n  m:\n    routes:\n      - { provider: ol, model: up }\n",
            root, root, root);
    fclose(f);
    if (mg_gen_load(path, 1, &G, err, sizeof(err)) != 0) {
        fprintf(stderr, "fuzz_adapters: cannot load %s: %s\n", path, err);
        abort();
    }
    unlink(path);
    rmdir(dir);
    const char *ids[] = {"ol", "an", "tr"};
    for (int i = 0; i < 3; i++)
        if ((adapters[i] = adapter_of(ids[i])) < 0) abort();
    return 0;
}

/* One line as the core hands it over: parsed JSON, else the text as a string. */
static cJSON *value_of(const char *s, size_t n)
{
    cJSON *v = cJSON_ParseWithLength(s, n);
    if (v) return v;
    char *t = malloc(n + 1);
    if (!t) return NULL;
    memcpy(t, s, n);
    t[n] = '\0';
    v = cJSON_CreateString(t);
    free(t);
    return v;
}

static void check_out(int rc, cJSON *out, const char *err, int want_array)
{
    if (rc == 0) {
        if (!out) __builtin_trap();
        if (want_array ? !cJSON_IsArray(out) : !cJSON_IsObject(out)) __builtin_trap();
    } else {
        if (rc != -1 || out) __builtin_trap();
        if (!err[0]) __builtin_trap(); /* a failure says why */
    }
    cJSON_Delete(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    static const char *endpoints[] = {"chat", "completions", "embeddings"};
    int adapter = adapters[data[0] % 3];
    int stream = (data[1] >> 2) & 1, tools = (data[1] >> 3) & 1;
    mg_lua_req_t info = {.request_id = "req-fuzz",
                         .endpoint = endpoints[(data[1] & 3) % 3],
                         .model = "m",
                         .stream = stream,
                         .max_tokens = -1,
                         .created = 1,
                         .priority = "P2"};
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    lua_State *L = G->L;
    int top = lua_gettop(L);
    int req = mg_gen_req_new(G, &info);
    cJSON *body = cJSON_Parse(tools ? BODY_TOOLS : BODY_PLAIN);
    if (cJSON_AddBoolToObject(body, "stream", stream) == NULL) __builtin_trap();
    if (mg_gen_req_set_body(G, req, body) != 0) __builtin_trap();
    cJSON_Delete(body);
    char err[1024];
    if (!stream) {
        cJSON *resp = value_of(text, n), *out = NULL;
        err[0] = '\0';
        int rc = mg_gen_decode(G, adapter, req, resp, &out, err, sizeof(err));
        check_out(rc, out, err, 0);
        cJSON_Delete(resp);
    } else {
        int state = mg_gen_table_new(G);
        for (size_t at = 0; at <= n;) {
            const char *nl = memchr(text + at, '\n', n - at);
            size_t len = (nl ? (size_t)(nl - text) : n) - at;
            cJSON *line = value_of(text + at, len), *out = NULL;
            int done = 0;
            err[0] = '\0';
            int rc =
                mg_gen_decode_event(G, adapter, req, state, line, &out, &done, err, sizeof(err));
            check_out(rc, out, err, 1);
            cJSON_Delete(line);
            if (lua_gettop(L) != top) __builtin_trap();
            if (rc != 0 || !nl) break; /* the core ends a stream at its first failed line */
            at += len + 1;
        }
        mg_gen_unref_value(G, state);
    }
    if (lua_gettop(L) != top) __builtin_trap(); /* the stack is as it was */
    mg_gen_req_release(G, req);
    /* A full collection after every input frees all it made, so an input's mallocs and frees
     * balance. libFuzzer runs LeakSanitizer's whole-heap scan after an input with more
     * mallocs than frees and, after 1,000 such scans, stops looking for leaks at all: with
     * the collector stepping only now and then, nearly every input left garbage behind, the
     * scans took ~95% of the time (~170 executions a second) until leak detection was
     * switched off. Balanced, a scan runs only when an input really keeps memory. */
    lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
