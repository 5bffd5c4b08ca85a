/* fuzz_codec: the C side that re-encodes what an upstream answered (through the adapters'
 * canonical form) for the Anthropic Messages and OpenAI Responses clients:
 * core/pipeline/messages_resp.c (a whole answer as a Message), messages_stream.c (a canonical
 * SSE stream as Anthropic's events) and responses_out.c (chunks and whole answers as Responses
 * events). An upstream is not trusted: its bytes reach these through the adapters unchanged.
 *
 * The first byte chooses the piece size of the stream feed (bits 0-5, 0 = whole) and whether
 * the Responses answer fails or ends (bit 6); the rest is the upstream's bytes. Checks:
 *   - mg_msgs_answer: 0 only with an output that is one JSON object of type "message";
 *   - mg_msgs_stream_feed, given the canonical stream the pipeline makes of the input (each
 *     line's chunk that mg_chunk_scan accepts, and [DONE], as "data: ...\n\n"; the pipeline
 *     ends a stream with an error on any other chunk, so that never reaches the encoder):
 *     the same Anthropic output whole, in the pieces and byte by byte
 *     (the stream may be cut anywhere), every event's data one JSON object whose type is the
 *     event's name, content blocks never overlapping, started and stopped in index order
 *     (deltas for a started block only),
 *     nothing after message_stop or error;
 *   - mg_resp_out: each input line that cJSON reads is a chunk (and the whole input, when it
 *     reads, a completion), read from its bytes (mg_resp_chunk_scan) when it is strict JSON as
 *     the pipeline checks it (mg_chunk_scan) and the scan takes it, else from its tree; every
 *     event's data one JSON object, the final Response an object. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/messages_resp.h"
#include "pipeline/messages_stream.h"
#include "pipeline/responses_out.h"
#include "upstream/chunk.h"

/* Walk SSE output "event: T\ndata: J\n\n": each J an object of type T (when check_type). */
static void check_events(const mg_buf_t *out, int anthropic)
{
    if (!out->len) return;
    const char *p = out->data, *end = out->data + out->len;
    int open = -1, next = 0, ended = 0;
    while (p < end) {
        if (ended) __builtin_trap(); /* nothing after message_stop or error */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || nl - p < 7 || memcmp(p, "event: ", 7) != 0) __builtin_trap();
        const char *name = p + 7;
        size_t name_len = (size_t)(nl - name);
        p = nl + 1;
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || nl - p < 6 || memcmp(p, "data: ", 6) != 0) __builtin_trap();
        cJSON *d = cJSON_ParseWithLength(p + 6, (size_t)(nl - p - 6));
        if (!cJSON_IsObject(d)) __builtin_trap();
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "type"));
        if (!type || strlen(type) != name_len || memcmp(type, name, name_len)) __builtin_trap();
        if (anthropic) {
            const cJSON *ix = cJSON_GetObjectItemCaseSensitive(d, "index");
            if (!strcmp(type, "content_block_start")) {
                if (open >= 0 || !cJSON_IsNumber(ix) || ix->valueint != next) __builtin_trap();
                open = next++;
            } else if (!strcmp(type, "content_block_delta")) {
                /* a started block: an interleaved tool call's later argument fragment goes to
                   its own block, already stopped (messages_stream.c: no argument is lost) */
                if (!cJSON_IsNumber(ix) || ix->valueint < 0 || ix->valueint >= next)
                    __builtin_trap();
            } else if (!strcmp(type, "content_block_stop")) {
                if (open < 0 || !cJSON_IsNumber(ix) || ix->valueint != open) __builtin_trap();
                open = -1;
            } else if (!strcmp(type, "message_stop") || !strcmp(type, "error")) {
                if (!strcmp(type, "message_stop") && open >= 0) __builtin_trap();
                ended = 1;
            }
        }
        cJSON_Delete(d);
        p = nl + 1;
        if (p >= end || *p != '\n') __builtin_trap();
        p++;
    }
}

static void feed_messages(const char *in, size_t n, size_t piece, mg_buf_t *out)
{
    mg_msgs_stream_t s;
    if (mg_msgs_stream_init(&s, "msg_fuzz", "claude-fuzz", 7) != 0) abort();
    for (size_t off = 0; off < n;) {
        size_t k = piece && n - off > piece ? piece : n - off;
        if (mg_msgs_stream_feed(&s, in + off, k, out) != 0) abort();
        off += k;
    }
    mg_msgs_stream_free(&s);
}

/* The input's lines as the pipeline's canonical stream (answer.c: passthrough_event). */
static void canonical_stream(const char *in, size_t n, mg_buf_t *sse)
{
    for (const char *p = in, *end = in + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        const char *d = p;
        size_t dn = len;
        if (dn >= 6 && memcmp(d, "data: ", 6) == 0) d += 6, dn -= 6;
        if ((dn == 6 && memcmp(d, "[DONE]", 6) == 0) || mg_chunk_scan(d, dn) >= 0) {
            mg_buf_append(sse, "data: ", 6);
            mg_buf_append(sse, d, dn);
            mg_buf_append(sse, "\n\n", 2);
        }
        p += len + (nl != NULL);
    }
}

static void check_messages(const char *raw, size_t raw_n, size_t piece)
{
    mg_buf_t sse = {0}, whole = {0}, cut = {0}, bytes = {0};
    canonical_stream(raw, raw_n, &sse);
    const char *in = sse.data ? sse.data : "";
    size_t n = sse.len;
    feed_messages(in, n, 0, &whole);
    feed_messages(in, n, piece, &cut);
    feed_messages(in, n, 1, &bytes);
    if (whole.len != cut.len || whole.len != bytes.len ||
        (whole.len &&
         (memcmp(whole.data, cut.data, whole.len) || memcmp(whole.data, bytes.data, whole.len))))
        __builtin_trap(); /* the stream may be cut anywhere */
    if (getenv("FUZZ_CODEC_DUMP")) fwrite(whole.data, 1, whole.len, stderr); /* replaying */
    check_events(&whole, 1);
    mg_buf_free(&whole);
    mg_buf_free(&cut);
    mg_buf_free(&bytes);
    mg_buf_free(&sse);

    mg_buf_t msg = {0};
    mg_msgs_usage_t fallback = {3, 4, 0, 0};
    int rc = mg_msgs_answer(raw, raw_n, "msg_fuzz", "claude-fuzz", &fallback, &msg);
    if (rc == 0) {
        cJSON *m = cJSON_ParseWithLength(msg.data, msg.len);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        if (!cJSON_IsObject(m) || !type || strcmp(type, "message")) __builtin_trap();
        cJSON_Delete(m);
    } else if (rc != -1) {
        abort(); /* out of memory */
    }
    mg_buf_free(&msg);
}

static void check_responses(const char *in, size_t n, int fail)
{
    mg_resp_out_t *o = mg_resp_out_new("resp_fuzz", 1700000000, "gpt-fuzz", NULL);
    if (!o) abort();
    mg_buf_t out = {0};
    mg_chunk_memo_t memo = {0}; /* as the pipeline reads a stream: checked, then scanned */
    memo.places = 1;
    for (const char *p = in, *end = in + n; p < end;) { /* each line a chunk */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        mg_resp_chunk_t ch;
        if (mg_chunk_scan_memo(&memo, p, len) >= 0 &&
            mg_resp_out_scan_chunk(o, &memo, p, len, &ch) == 0 && !ch.tree) {
            mg_resp_out_scanned(o, &ch, &out);
        } else {
            cJSON *chunk = cJSON_ParseWithLength(p, len);
            if (chunk) mg_resp_out_chunk(o, chunk, &out);
            cJSON_Delete(chunk);
        }
        p += len + (nl != NULL);
    }
    mg_chunk_memo_free(&memo);
    mg_resp_chunk_t ch;
    if (mg_chunk_scan(in, n) >= 0 && mg_resp_chunk_scan(in, n, "message", &ch) == 0 && !ch.tree) {
        mg_resp_out_scanned(o, &ch, NULL);
    } else {
        cJSON *whole = cJSON_ParseWithLength(in, n);
        if (whole) mg_resp_out_completion(o, whole);
        cJSON_Delete(whole);
    }
    long long input, output;
    mg_resp_out_usage(o, &input, &output);
    if (fail) {
        mg_resp_out_fail(o, "server_error", "upstream broke off", &out);
    } else {
        const mg_buf_t *text = mg_resp_out_end(o, &out);
        cJSON *r = cJSON_ParseWithLength(text->data, text->len);
        if (!cJSON_IsObject(r)) __builtin_trap();
        cJSON_Delete(r);
    }
    check_events(&out, 0);
    cJSON *m = mg_resp_out_message(o);
    if (!cJSON_IsObject(m)) __builtin_trap();
    cJSON_Delete(m);
    mg_buf_free(&out);
    mg_resp_out_free(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t piece = data[0] & 63;
    int fail = (data[0] >> 6) & 1;
    char *in = malloc(size - 1 ? size - 1 : 1); /* exact size: ASan sees a read past it */
    if (!in) return 0;
    memcpy(in, data + 1, size - 1);
    check_messages(in, size - 1, piece);
    check_responses(in, size - 1, fail);
    free(in);
    return 0;
}
