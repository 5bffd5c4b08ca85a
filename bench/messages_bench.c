/* messages_bench: what the Anthropic Messages front end costs beside pass-through, on the
 * bodies bench/run sends and answers with (the same text, in Anthropic's shape):
 *   request          mg_msgs_request over the Messages form of bench/run's chat request
 *                    (pass-through: mg_json_check_members over the chat body, what the fast
 *                    path pays);
 *   answer           mg_msgs_answer over the 414-byte chat completion;
 *   stream event     one content chunk re-framed (mg_msgs_stream_event; pass-through:
 *                    mg_chunk_scan_memo, what every forwarded event pays), and the whole
 *                    20-event stream of bench/run fed through mg_msgs_stream_feed.
 * CPU ns per call, best of 5 rounds. Built by CMake (target messages_bench): build/messages_bench.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "pipeline/messages_req.h"
#include "pipeline/messages_resp.h"
#include "pipeline/messages_stream.h"
#include "upstream/chunk.h"

#define ROUNDS 5
#define CALLS 100000

static const char chat_body[] =
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a concise "
    "assistant.\"},{\"role\":\"user\",\"content\":\"In one short sentence, explain why an HTTP "
    "reverse proxy should keep upstream connections alive and pooled.\"}],\"max_tokens\":64,"
    "\"temperature\":0.2,\"user\":\"bench-client-0001\"}";

static const char messages_body[] =
    "{\"model\":\"gpt-4o-mini\",\"system\":\"You are a concise assistant.\",\"messages\":[{\"role\":"
    "\"user\",\"content\":\"In one short sentence, explain why an HTTP reverse proxy should keep "
    "upstream connections alive and pooled.\"}],\"max_tokens\":64,\"temperature\":0.2,"
    "\"metadata\":{\"user_id\":\"bench-client-0001\"}}";

static const char response_body[] =
    "{\"id\":\"chatcmpl-mock0001\",\"object\":\"chat.completion\",\"created\":1700000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_mock\",\"choices\":[{"
    "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Connection pooling reuses "
    "warm TCP connections, cutting handshake latency and CPU cost per request.\"},\"logprobs\":"
    "null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":18,"
    "\"total_tokens\":60}}";

#define CHUNK(delta, finish)                                                                       \
    "{\"id\":\"chatcmpl-mock0002\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"   \
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_mock\",\"choices\":[{"       \
    "\"index\":0,\"delta\":" delta ",\"logprobs\":null,\"finish_reason\":" finish "}]}"

static const char content_chunk[] = CHUNK("{\"content\":\" connections\"}", "null");
static const char content_chunk_b[] = CHUNK("{\"content\":\" pooling\"}", "null");

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int count_member(void *ud, const mg_json_member_t *m)
{
    *(size_t *)ud += m->key_len;
    return 0;
}

/* bench/run's stream: role chunk, 17 content chunks, finish chunk, usage chunk, [DONE]. */
static void stream_of(mg_buf_t *out)
{
    static const char *const words[] = {
        "Connection", " pooling", " reuses",    " warm",    " TCP", " connections",
        ",",          " cutting", " handshake", " latency", " and", " CPU",
        " cost",      " per",     " request",   ".",        " Done"};
    mg_buf_append_str(out,
                      "data: " CHUNK("{\"role\":\"assistant\",\"content\":\"\"}", "null") "\n\n");
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        char chunk[512];
        snprintf(chunk, sizeof(chunk), "data: " CHUNK("{\"content\":\"%s\"}", "null") "\n\n",
                 words[i]);
        mg_buf_append_str(out, chunk);
    }
    mg_buf_append_str(out, "data: " CHUNK("{}", "\"stop\"") "\n\n");
    mg_buf_append_str(out,
                      "data: {\"id\":\"chatcmpl-mock0002\",\"object\":\"chat.completion.chunk\","
                      "\"choices\":[],\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":18,"
                      "\"total_tokens\":60}}\n\ndata: [DONE]\n\n");
}

typedef double (*round_fn)(void);

static double best_of(round_fn fn)
{
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double ns = fn();
        if (r == 0 || ns < best) best = ns;
    }
    return best;
}

static double round_passthrough_request(void)
{
    size_t sink = 0;
    double t0 = cpu_ns();
    for (int i = 0; i < CALLS; i++)
        mg_json_check_members(chat_body, sizeof(chat_body) - 1, count_member, &sink);
    if (!sink) exit(1);
    return (cpu_ns() - t0) / CALLS;
}

static double round_request(void)
{
    mg_buf_t out = {0};
    char err[200];
    double t0 = cpu_ns();
    for (int i = 0; i < CALLS; i++) {
        out.len = 0;
        if (mg_msgs_request(messages_body, sizeof(messages_body) - 1, 0, &out, err, sizeof(err)) !=
            0)
            exit(1);
    }
    double ns = (cpu_ns() - t0) / CALLS;
    mg_buf_free(&out);
    return ns;
}

static double round_answer(void)
{
    mg_buf_t out = {0};
    mg_msgs_usage_t fb = {0, 0, 0, 0};
    double t0 = cpu_ns();
    for (int i = 0; i < CALLS; i++) {
        out.len = 0;
        if (mg_msgs_answer(response_body, sizeof(response_body) - 1, "msg_x", "m", &fb, &out) != 0)
            exit(1);
    }
    double ns = (cpu_ns() - t0) / CALLS;
    mg_buf_free(&out);
    return ns;
}

static double round_passthrough_event(void)
{
    mg_chunk_memo_t m = {0};
    const char *c[2] = {content_chunk, content_chunk_b};
    size_t n[2] = {sizeof(content_chunk) - 1, sizeof(content_chunk_b) - 1};
    volatile int sink = 0;
    double t0 = cpu_ns();
    for (int i = 0; i < CALLS; i++) sink += mg_chunk_scan_memo(&m, c[i & 1], n[i & 1]);
    double ns = (cpu_ns() - t0) / CALLS;
    mg_chunk_memo_free(&m);
    if (sink) exit(1);
    return ns;
}

static double round_event(void)
{
    mg_msgs_stream_t s;
    mg_msgs_stream_init(&s, "msg_x", "m", 0);
    mg_buf_t out = {0};
    double t0 = cpu_ns();
    for (int i = 0; i < CALLS; i++) {
        out.len = 0;
        mg_msgs_stream_event(&s, i & 1 ? content_chunk : content_chunk_b,
                             i & 1 ? sizeof(content_chunk) - 1 : sizeof(content_chunk_b) - 1, &out);
    }
    double ns = (cpu_ns() - t0) / CALLS;
    mg_buf_free(&out);
    mg_msgs_stream_free(&s);
    return ns;
}

static mg_buf_t stream_bytes;

static double round_stream(void)
{
    mg_buf_t out = {0};
    int n = CALLS / 20;
    double t0 = cpu_ns();
    for (int i = 0; i < n; i++) {
        mg_msgs_stream_t s;
        mg_msgs_stream_init(&s, "msg_x", "m", 42);
        out.len = 0;
        mg_msgs_stream_feed(&s, stream_bytes.data, stream_bytes.len, &out);
        mg_msgs_stream_free(&s);
    }
    double ns = (cpu_ns() - t0) / n;
    mg_buf_free(&out);
    return ns;
}

int main(void)
{
    stream_of(&stream_bytes);
    double pr = best_of(round_passthrough_request), rq = best_of(round_request);
    double an = best_of(round_answer);
    double pe = best_of(round_passthrough_event), ev = best_of(round_event);
    double st = best_of(round_stream);
    printf("messages_bench (CPU ns per call, best of %d rounds)\n", ROUNDS);
    printf("  request    pass-through check %7.0f   Messages -> chat %7.0f\n", pr, rq);
    printf("  answer     chat -> Message %7.0f\n", an);
    printf("  event      pass-through scan  %7.0f   chunk -> events  %7.0f\n", pe, ev);
    printf("  stream     20 events -> Anthropic SSE %7.0f (%.0f per event)\n", st, st / 20);
    mg_buf_free(&stream_bytes);
    return 0;
}
