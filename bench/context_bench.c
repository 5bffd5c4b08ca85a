/* context_bench: what the context step costs a chat request on a 50-turn session: counting
 * the assembled messages by the chat rule (token/chat.h, o200k_base), and the trimming
 * policy (policies/context.lua's trim through the generation, its result re-counted), in
 * microseconds of CPU per request, with the token counts. Run from the checkout's root
 * (policies/ and lua/ are read from there): build/context_bench [TURNS]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "luavm/luavm.h"
#include "token/chat.h"
#include "token/encoding.h"
#include "token/registry.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: others share the box */
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* A session's worth of turns: a question of ~40 tokens and an answer of ~120, then the
 * current question. */
static cJSON *conversation(int turns)
{
    cJSON *msgs = cJSON_CreateArray();
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content",
                            "You are a maintenance assistant for the plant's pumps.");
    cJSON_AddItemToArray(msgs, sys);
    char q[512], a[1024];
    for (int i = 0; i <= turns; i++) {
        snprintf(q, sizeof(q),
                 "Turn %d: the pressure on pump %d dropped to %d bar after the "
                 "morning shift; what should the operator check first, and in which order?",
                 i, i % 7, 3 + i % 5);
        cJSON *u = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user");
        cJSON_AddStringToObject(u, "content", q);
        cJSON_AddItemToArray(msgs, u);
        if (i == turns) break;
        snprintf(a, sizeof(a),
                 "Check the suction strainer of pump %d for clogging, then the seal "
                 "water flow, then the discharge valve position. If the strainer is clean and the "
                 "seal water flows, compare the motor current with its nameplate: a low current "
                 "with low pressure points at cavitation or air in the line, a high one at a "
                 "blocked impeller. Log the readings in the shift book before restarting.",
                 i % 7);
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", a);
        cJSON_AddItemToArray(msgs, m);
    }
    return msgs;
}

int main(int argc, char **argv)
{
    int turns = argc > 1 ? atoi(argv[1]) : 50;
    char dir[1024], err[512];
    int want[MG_ENC_COUNT] = {0};
    want[MG_ENC_O200K] = 1;
    mg_encoding_data_dir(NULL, dir, sizeof(dir));
    if (mg_token_registry_load(dir, want, err, sizeof(err)) != 0) {
        fprintf(stderr, "context_bench: %s\n", err);
        return 1;
    }
    char path[] = "/tmp/context_bench_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 1;
    dprintf(fd, "storage:\n  path: /tmp/context_bench.db\nproviders:\n"
                "  - { id: p, adapter: openai, base_url: \"http://127.0.0.1:1/v1\" }\n"
                "models:\n  m:\n    routes: [{ provider: p, model: gpt-4o }]\n");
    close(fd);
    mg_gen_t *g = NULL;
    int rc = mg_gen_load(path, 1, &g, err, sizeof(err));
    unlink(path);
    if (rc != 0) {
        fprintf(stderr, "context_bench: %s\n", err);
        return 1;
    }
    const mg_encoding_t *e = mg_token_registry_get(MG_ENC_O200K);
    cJSON *msgs = conversation(turns);
    int n = cJSON_GetArraySize(msgs);
    long *tokens = calloc((size_t)n, sizeof(*tokens));
    long total = mg_chat_messages_tokens(e, msgs);
    int iters = 200;
    double best_count = 0, best_trim = 0;
    long after = 0;
    for (int round = 0; round < 5; round++) {
        double t0 = now_ns();
        for (int k = 0; k < iters; k++) {
            int i = 0;
            for (const cJSON *m = msgs->child; m; m = m->next)
                tokens[i++] = mg_chat_message_tokens(e, m);
        }
        double t1 = now_ns();
        for (int k = 0; k < iters; k++) {
            mg_context_in_t in = {msgs, tokens, n - 1, 1, "summary_and_recent", MG_ENC_O200K};
            cJSON *out = NULL, *steps = NULL;
            if (mg_gen_context_trim(g, &in, total / 2, &out, &steps, err, sizeof(err)) != 0) {
                fprintf(stderr, "context_bench: trim: %s\n", err);
                return 1;
            }
            after = mg_chat_messages_tokens(e, out); /* the core re-counts what it gets */
            cJSON_Delete(out);
            cJSON_Delete(steps);
        }
        double t2 = now_ns();
        double c = (t1 - t0) / iters, t = (t2 - t1) / iters;
        if (round == 0 || c < best_count) best_count = c;
        if (round == 0 || t < best_trim) best_trim = t;
    }
    printf("%d turns, %d messages, %ld tokens | count: %8.1f us per request\n", turns, n, total,
           best_count / 1000);
    printf("trim to %ld (half): %ld tokens kept | trim + re-count: %8.1f us per request\n",
           total / 2, after, best_trim / 1000);
    free(tokens);
    cJSON_Delete(msgs);
    mg_gen_unref(g);
    mg_token_registry_free();
    return 0;
}
