/* json_bench: the JSON scans every passthrough request pays, on the bodies bench/run
 * sends and answers with:
 *   request check    mg_json_check_members over the ~300-byte chat request (the
 *                    client's body is validated as cJSON would and its members read);
 *   response scan    mg_json_members over the 414-byte chat completion (the answer is
 *                    forwarded as written; its members are scanned for usage);
 *   long content     both again with a 4 KiB message content, so that a change that
 *                    helps short strings cannot quietly cost long answers;
 *   stream chunk     one content chunk of bench/run's stream (every passthrough event):
 *                    mg_chunk_scan (validated as JSON, the keys the gateway acts on found)
 *                    and mg_chunk_scan_memo (the same answer, found against the stream's
 *                    previous content chunk, as a stream's content chunks are checked).
 * CPU ns per call, best of 5 rounds. Built by CMake (target json_bench); run it from
 * anywhere: build/json_bench. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "upstream/chunk.h"

#define ROUNDS 5
#ifndef CALLS
#define CALLS 200000
#endif

static const char request_body[] =
    "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"system\",\"content\":\"You are a concise "
    "assistant.\"},{\"role\":\"user\",\"content\":\"In one short sentence, explain why an HTTP "
    "reverse proxy should keep upstream connections alive and pooled.\"}],\"max_tokens\":64,"
    "\"temperature\":0.2,\"user\":\"bench-client-0001\"}";

static const char response_body[] =
    "{\"id\":\"chatcmpl-mock0001\",\"object\":\"chat.completion\",\"created\":1700000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_mock\",\"choices\":[{"
    "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Connection pooling reuses "
    "warm TCP connections, cutting handshake latency and CPU cost per request.\"},\"logprobs\":"
    "null,\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":18,"
    "\"total_tokens\":60}}";

static const char stream_chunk[] =
    "{\"id\":\"chatcmpl-mock0002\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_mock\",\"choices\":[{"
    "\"index\":0,\"delta\":{\"content\":\" connections\"},\"logprobs\":null,"
    "\"finish_reason\":null}]}";

static const char stream_chunk_b[] =
    "{\"id\":\"chatcmpl-mock0002\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
    "\"model\":\"gpt-4o-mini-2024-07-18\",\"system_fingerprint\":\"fp_mock\",\"choices\":[{"
    "\"index\":0,\"delta\":{\"content\":\" pooling\"},\"logprobs\":null,"
    "\"finish_reason\":null}]}";

static double cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); /* CPU time: others share the box */
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int count_member(void *ud, const mg_json_member_t *m)
{
    *(size_t *)ud += m->key_len;
    return 0;
}

typedef int (*scan_fn)(const char *s, size_t n, mg_json_member_cb cb, void *ud);

static double ns_per_call(scan_fn scan, const char *body, size_t n)
{
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        size_t sink = 0;
        double t0 = cpu_ns();
        for (int i = 0; i < CALLS; i++)
            if (scan(body, n, count_member, &sink) != 0) {
                fprintf(stderr, "json_bench: the body was refused\n");
                exit(1);
            }
        double ns = (cpu_ns() - t0) / CALLS;
        if (sink == 0) exit(1); /* keeps the calls */
        if (r == 0 || ns < best) best = ns;
    }
    return best;
}

typedef int (*chunk_fn)(const char *s, size_t n);

static double chunk_ns_per_call(chunk_fn scan, const char *body, size_t n)
{
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        volatile int sink = 0;
        double t0 = cpu_ns();
        for (int i = 0; i < CALLS; i++) sink += scan(body, n);
        double ns = (cpu_ns() - t0) / CALLS;
        if (sink != 0) exit(1); /* the chunk has none of the keys and is valid */
        if (r == 0 || ns < best) best = ns;
    }
    return best;
}

/* Content chunks one after the other, as a stream's: checked against the one before. */
static double memo_ns_per_call(void)
{
    double best = 0;
    mg_chunk_memo_t m = {0};
    const char *c[2] = {stream_chunk, stream_chunk_b};
    size_t n[2] = {strlen(stream_chunk), strlen(stream_chunk_b)};
    for (int r = 0; r < ROUNDS; r++) {
        volatile int sink = 0;
        double t0 = cpu_ns();
        for (int i = 0; i < CALLS; i++) sink += mg_chunk_scan_memo(&m, c[i & 1], n[i & 1]);
        double ns = (cpu_ns() - t0) / CALLS;
        if (sink != 0) exit(1);
        if (r == 0 || ns < best) best = ns;
    }
    mg_chunk_memo_free(&m);
    return best;
}

/* body with the first "content":"..." value's text replaced by `len` bytes of prose. */
static char *with_long_content(const char *body, size_t len)
{
    const char *at = strstr(body, "\"content\":\"");
    const char *end = at ? strchr(at + 11, '"') : NULL;
    if (!end) exit(1);
    size_t head = (size_t)(at + 11 - body), tail = strlen(end);
    char *out = malloc(head + len + tail + 1);
    if (!out) exit(1);
    memcpy(out, body, head);
    for (size_t i = 0; i < len; i++) out[head + i] = "pooled connections stay warm. "[i % 30];
    memcpy(out + head + len, end, tail + 1);
    return out;
}

int main(void)
{
    char *long_req = with_long_content(request_body, 4096);
    char *long_resp = with_long_content(response_body, 4096);
    printf("%-28s %8s %10s\n", "scan", "bytes", "ns/call");
    printf("%-28s %8zu %10.0f\n", "request check", strlen(request_body),
           ns_per_call(mg_json_check_members, request_body, strlen(request_body)));
    printf("%-28s %8zu %10.0f\n", "response scan", strlen(response_body),
           ns_per_call(mg_json_members, response_body, strlen(response_body)));
    printf("%-28s %8zu %10.0f\n", "request check, long content", strlen(long_req),
           ns_per_call(mg_json_check_members, long_req, strlen(long_req)));
    printf("%-28s %8zu %10.0f\n", "response scan, long content", strlen(long_resp),
           ns_per_call(mg_json_members, long_resp, strlen(long_resp)));
    printf("%-28s %8zu %10.0f\n", "stream chunk, validating", strlen(stream_chunk),
           chunk_ns_per_call(mg_chunk_scan, stream_chunk, strlen(stream_chunk)));
    printf("%-28s %8zu %10.0f\n", "stream chunk, memo", strlen(stream_chunk), memo_ns_per_call());
    free(long_req);
    free(long_resp);
    return 0;
}
