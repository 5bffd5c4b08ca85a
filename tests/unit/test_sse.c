/* Unit tests for core/upstream/sse.c: SSE and NDJSON framing, split at every byte boundary. */
#include "upstream/sse.h"
#include "mgtest.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- recording events ---------------------------------------------------------------- */

typedef struct {
    char *data; /* NUL-terminated copies */
    size_t data_len;
    char *event; /* NULL when the event had none */
    size_t event_len;
    char *raw;
    size_t raw_len;
    uintptr_t raw_ptr, data_ptr; /* where the parser pointed, to check zero copy */
} rec_t;

typedef struct {
    rec_t *ev;
    int n, cap;
    int stop_at; /* 1-based event number whose callback returns stop_val; 0 = never */
    int stop_val;
} log_t;

static char *dup_bytes(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static int record(void *ud, const mg_sse_event_t *ev)
{
    log_t *l = ud;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->ev = realloc(l->ev, (size_t)l->cap * sizeof(rec_t));
    }
    rec_t *r = &l->ev[l->n++];
    r->data = dup_bytes(ev->data, ev->data_len);
    r->data_len = ev->data_len;
    r->event = ev->event ? dup_bytes(ev->event, ev->event_len) : NULL;
    r->event_len = ev->event_len;
    r->raw = dup_bytes(ev->raw, ev->raw_len);
    r->raw_len = ev->raw_len;
    r->raw_ptr = (uintptr_t)ev->raw;
    r->data_ptr = (uintptr_t)ev->data;
    return l->stop_at == l->n ? l->stop_val : 0;
}

static void log_free(log_t *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->ev[i].data);
        free(l->ev[i].event);
        free(l->ev[i].raw);
    }
    free(l->ev);
    memset(l, 0, sizeof(*l));
}

static int rec_equal(const rec_t *a, const rec_t *b)
{
    if (a->data_len != b->data_len || memcmp(a->data, b->data, a->data_len) != 0) return 0;
    if (!a->event != !b->event) return 0;
    if (a->event && (a->event_len != b->event_len || memcmp(a->event, b->event, a->event_len)))
        return 0;
    return a->raw_len == b->raw_len && memcmp(a->raw, b->raw, a->raw_len) == 0;
}

static int logs_equal(const log_t *a, const log_t *b)
{
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (!rec_equal(&a->ev[i], &b->ev[i])) return 0;
    return 1;
}

/* Result of feeding a whole stream: events, the first non-zero return, pending bytes. */
typedef struct {
    log_t log;
    int rc;
    size_t pending;
} run_t;

/* Feeds s[0..n) in pieces ending at cuts[0] < cuts[1] < ... (then the rest), each piece in
 * its own heap buffer so ASan sees any read past a piece. Stops at the first non-zero return. */
static void run_cuts(run_t *out, mg_sse_mode_t mode, size_t max_event, const char *s, size_t n,
                     const size_t *cuts, int ncuts)
{
    mg_sse_parser_t p;
    mg_sse_init(&p, mode);
    if (max_event) p.max_event = max_event;
    memset(out, 0, sizeof(*out));
    size_t at = 0;
    for (int i = 0; i <= ncuts && out->rc == 0; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        char *piece = malloc(to - at + 1);
        memcpy(piece, s + at, to - at);
        out->rc = mg_sse_feed(&p, piece, to - at, record, &out->log);
        free(piece);
        at = to;
    }
    out->pending = mg_sse_pending(&p);
    mg_sse_free(&p);
}

static void run_whole(run_t *out, mg_sse_mode_t mode, size_t max_event, const char *s, size_t n)
{
    run_cuts(out, mode, max_event, s, n, NULL, 0);
}

static int runs_equal(const run_t *a, const run_t *b)
{
    return a->rc == b->rc && (a->rc != 0 || a->pending == b->pending) &&
           logs_equal(&a->log, &b->log);
}

/* Feeds the stream in every 2-piece split, byte by byte, and (when `three`) every 3-piece
 * split, and returns how many of those runs differ from the one-piece feed. */
static int split_mismatches(mg_sse_mode_t mode, size_t max_event, const char *s, int three)
{
    size_t n = strlen(s);
    run_t whole, r;
    int bad = 0;
    run_whole(&whole, mode, max_event, s, n);
    for (size_t i = 1; i < n; i++) {
        size_t cuts[1] = {i};
        run_cuts(&r, mode, max_event, s, n, cuts, 1);
        if (!runs_equal(&whole, &r) && bad++ == 0) fprintf(stderr, "  split at %zu differs\n", i);
        log_free(&r.log);
    }
    for (size_t i = 1; three && i < n; i++) {
        for (size_t j = i + 1; j < n; j++) {
            size_t cuts[2] = {i, j};
            run_cuts(&r, mode, max_event, s, n, cuts, 2);
            if (!runs_equal(&whole, &r) && bad++ == 0)
                fprintf(stderr, "  split at %zu,%zu differs\n", i, j);
            log_free(&r.log);
        }
    }
    size_t *bytes = calloc(n + 1, sizeof(size_t)); /* n + 1: never a zero-size block */
    if (!bytes) return bad + 1;
    for (size_t i = 0; i < n; i++) bytes[i] = i + 1;
    run_cuts(&r, mode, max_event, s, n, bytes, (int)n - 1);
    if (!runs_equal(&whole, &r) && bad++ == 0) fprintf(stderr, "  byte-by-byte feed differs\n");
    log_free(&r.log);
    free(bytes);
    log_free(&whole.log);
    return bad;
}

/* ---- SSE ----------------------------------------------------------------------------- */

/* A stream that mixes every rule: carried comment block, CRLF, CR, event names, multi-line
 * data, a field without colon, ignored fields, a data-less block, a blank CRLF line, [DONE],
 * and an unfinished tail. */
static const char MIXED[] = ": comment only\n\n"
                            "data: one\n\n"
                            "event: delta\r\ndata: two\r\n\r\n"
                            "data: a\rdata:b\r\r"
                            "id: 7\nretry: 10\ndata\ndata:  x\n: c\n\n"
                            "event: ignored\n\n"
                            "\r\n"
                            "data: {\"k\":1}\n\n"
                            "data: [DONE]\n\n"
                            "data: tail";

static void test_sse_basic(void)
{
    run_t r;
    const char *s = "data: hello\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(r.log.n, 1);
    if (r.log.n == 1) {
        CHECK_STR(r.log.ev[0].data, "hello");
        CHECK(r.log.ev[0].event == NULL);
        CHECK_STR(r.log.ev[0].raw, s);
        CHECK_EQ_INT(r.log.ev[0].raw_len, strlen(s));
    }
    CHECK_EQ_INT(r.pending, 0);
    log_free(&r.log);
}

static void test_sse_mixed_whole(void)
{
    run_t r;
    run_whole(&r, MG_SSE_MODE_SSE, 0, MIXED, strlen(MIXED));
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(r.log.n, 6);
    if (r.log.n == 6) {
        rec_t *e = r.log.ev;
        CHECK_STR(e[0].data, "one");
        CHECK(e[0].event == NULL);
        CHECK_STR(e[0].raw, ": comment only\n\ndata: one\n\n");
        CHECK_STR(e[1].data, "two");
        CHECK_STR(e[1].event, "delta");
        CHECK_STR(e[1].raw, "event: delta\r\ndata: two\r\n\r\n");
        CHECK_STR(e[2].data, "a\nb");
        CHECK_STR(e[2].raw, "data: a\rdata:b\r\r");
        CHECK_STR(e[3].data, "\n x");
        CHECK(e[3].event == NULL);
        CHECK_STR(e[3].raw, "id: 7\nretry: 10\ndata\ndata:  x\n: c\n\n");
        CHECK_STR(e[4].data, "{\"k\":1}");
        CHECK(e[4].event == NULL); /* "event: ignored" ended with its data-less block */
        CHECK_STR(e[4].raw, "event: ignored\n\n\r\ndata: {\"k\":1}\n\n");
        CHECK_STR(e[5].data, "[DONE]");
    }
    CHECK_EQ_INT(r.pending, strlen("data: tail"));
    /* every byte is in some raw or pending */
    size_t sum = r.pending;
    for (int i = 0; i < r.log.n; i++) sum += r.log.ev[i].raw_len;
    CHECK_EQ_INT(sum, strlen(MIXED));
    log_free(&r.log);
}

static void test_sse_all_splits(void)
{
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 0, MIXED, 1), 0);
    /* the same with a max_event that some events exceed: -1 at the same point every way */
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 30, MIXED, 1), 0);
    run_t r;
    run_whole(&r, MG_SSE_MODE_SSE, 30, MIXED, strlen(MIXED));
    CHECK_EQ_INT(r.rc, -1); /* the 35-byte fourth event */
    CHECK_EQ_INT(r.log.n, 3);
    log_free(&r.log);
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 0, "data: x\r\n\r\ndata: y\r\r\ndata: z\r\r", 1),
                 0);
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 0, "\r\r\n\n\r\r:\r\n\rdata\r\r\r\n", 1), 0);
}

static void test_sse_crlf(void)
{
    run_t r;
    const char *s = "data: a\r\n\r\ndata: b\r\ndata: c\r\n\r\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 2);
    if (r.log.n == 2) {
        CHECK_STR(r.log.ev[0].raw, "data: a\r\n\r\n");
        CHECK_STR(r.log.ev[1].data, "b\nc");
        CHECK_STR(r.log.ev[1].raw, "data: b\r\ndata: c\r\n\r\n");
    }
    CHECK_EQ_INT(r.pending, 0);
    log_free(&r.log);
}

/* A blank "\r" at the end of a feed waits: the next byte may be its '\n'. */
static void test_sse_cr_lf_split_across_feeds(void)
{
    mg_sse_parser_t p;
    log_t l = {0};
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    CHECK_EQ_INT(mg_sse_feed(&p, "data: x\r\n\r", 10, record, &l), 0);
    CHECK_EQ_INT(l.n, 0);
    CHECK_EQ_INT(mg_sse_pending(&p), 10);
    CHECK_EQ_INT(mg_sse_feed(&p, "\ndata: y\r", 9, record, &l), 0);
    CHECK_EQ_INT(l.n, 1);
    if (l.n == 1) CHECK_STR(l.ev[0].raw, "data: x\r\n\r\n");
    CHECK_EQ_INT(mg_sse_pending(&p), 8);
    /* "\r|\n" inside a line, then a blank line */
    CHECK_EQ_INT(mg_sse_feed(&p, "\n\r\n", 3, record, &l), 0);
    CHECK_EQ_INT(l.n, 2);
    if (l.n == 2) {
        CHECK_STR(l.ev[1].data, "y");
        CHECK_STR(l.ev[1].raw, "data: y\r\n\r\n");
    }
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p);
    log_free(&l);
}

static void test_sse_cr_only(void)
{
    mg_sse_parser_t p;
    log_t l = {0};
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    CHECK_EQ_INT(mg_sse_feed(&p, "data: a\r\r", 9, record, &l), 0);
    CHECK_EQ_INT(l.n, 0); /* held: "\r\r" might still become "\r\r\n" */
    CHECK_EQ_INT(mg_sse_pending(&p), 9);
    CHECK_EQ_INT(mg_sse_feed(&p, "data: b\r\r", 9, record, &l), 0);
    CHECK_EQ_INT(l.n, 1);
    if (l.n == 1) {
        CHECK_STR(l.ev[0].data, "a");
        CHECK_STR(l.ev[0].raw, "data: a\r\r");
    }
    CHECK_EQ_INT(mg_sse_pending(&p), 9);
    CHECK_EQ_INT(mg_sse_feed(&p, "\n", 1, record, &l), 0);
    CHECK_EQ_INT(l.n, 2);
    if (l.n == 2) CHECK_STR(l.ev[1].raw, "data: b\r\r\n");
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p);
    log_free(&l);
}

static void test_sse_multiline_data(void)
{
    run_t r;
    const char *s = "data: a\ndata: b\ndata\ndata:c\ndata: \n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 1);
    if (r.log.n == 1) {
        CHECK_EQ_INT(r.log.ev[0].data_len, 7);
        CHECK_STR(r.log.ev[0].data, "a\nb\n\nc\n");
    }
    log_free(&r.log);
    /* data lines with empty values still make an event */
    s = "data\n\ndata:\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 2);
    if (r.log.n == 2) {
        CHECK_EQ_INT(r.log.ev[0].data_len, 0);
        CHECK_EQ_INT(r.log.ev[1].data_len, 0);
    }
    log_free(&r.log);
    /* the same multi-line event, held across feeds, twice in a row (scratch reuse) */
    const char *two = "data: 1\ndata: 22\n\ndata: 333\ndata: 4\n\n";
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 0, two, 0), 0);
}

static void test_sse_comments_and_fields(void)
{
    run_t r;
    const char *s = ": ping\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 0);
    CHECK_EQ_INT(r.pending, strlen(s)); /* carried until an event follows */
    log_free(&r.log);

    s = ": c1\ndata: x\n:c2\nid: 9\nretry: 5\nfoo: bar\nData: no\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 1);
    if (r.log.n == 1) {
        CHECK_STR(r.log.ev[0].data, "x"); /* field names are case-sensitive */
        CHECK_STR(r.log.ev[0].raw, s);
    }
    log_free(&r.log);

    /* only fields other than data: no event */
    s = "id: 1\nevent: e\nretry: 1\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 0);
    log_free(&r.log);
}

static void test_sse_event_names(void)
{
    run_t r;
    const char *s = "event: first\nevent: content_block_delta\ndata: {}\n\n"
                    "data: plain\n\n"
                    "event:\ndata: e\n\n"
                    "event:nospace\ndata: f\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 4);
    if (r.log.n == 4) {
        CHECK_STR(r.log.ev[0].event, "content_block_delta"); /* the last one wins */
        CHECK_EQ_INT(r.log.ev[0].event_len, 19);
        CHECK(r.log.ev[1].event == NULL); /* names do not carry over */
        CHECK(r.log.ev[2].event != NULL);
        CHECK_EQ_INT(r.log.ev[2].event_len, 0);
        CHECK_STR(r.log.ev[3].event, "nospace");
    }
    log_free(&r.log);
}

/* Concatenated raws are the input, byte for byte, in every split. */
static void test_sse_raw_exact(void)
{
    const char *s = ":hi\r\n\r\nevent: x\rdata: 1\r\r\ndata: 2\n\n\n\ndata: 3\r\n\r\n\n\n";
    size_t n = strlen(s);
    for (size_t cut = 0; cut <= n; cut++) {
        size_t cuts[1] = {cut};
        run_t r;
        run_cuts(&r, MG_SSE_MODE_SSE, 0, s, n, cuts, 1);
        char joined[256];
        size_t at = 0;
        for (int i = 0; i < r.log.n; i++) {
            memcpy(joined + at, r.log.ev[i].raw, r.log.ev[i].raw_len);
            at += r.log.ev[i].raw_len;
        }
        CHECK_EQ_INT(r.log.n, 3);
        CHECK_EQ_INT(at + r.pending, n);
        CHECK(memcmp(joined, s, at) == 0);
        CHECK_EQ_INT(r.pending, 2); /* the two trailing blank lines wait for an event */
        log_free(&r.log);
    }
}

/* Whole events in a buffer with nothing held point into the input; only held events are
 * copied. */
static void test_sse_zero_copy(void)
{
    mg_sse_parser_t p;
    log_t l = {0};
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    char in1[] = "data: x\n\ndata: y\n\nda";
    CHECK_EQ_INT(mg_sse_feed(&p, in1, strlen(in1), record, &l), 0);
    CHECK_EQ_INT(l.n, 2);
    if (l.n == 2) {
        CHECK(l.ev[0].raw_ptr == (uintptr_t)in1);
        CHECK(l.ev[0].data_ptr == (uintptr_t)(in1 + 6));
        CHECK(l.ev[1].raw_ptr == (uintptr_t)(in1 + 9));
    }
    CHECK_EQ_INT(mg_sse_pending(&p), 2);
    char in2[] = "ta: z\n\ndata: w\n\n";
    CHECK_EQ_INT(mg_sse_feed(&p, in2, strlen(in2), record, &l), 0);
    CHECK_EQ_INT(l.n, 4);
    if (l.n == 4) {
        CHECK_STR(l.ev[2].raw, "data: z\n\n");
        CHECK(l.ev[2].raw_ptr == (uintptr_t)p.buf); /* the held event */
        CHECK(l.ev[3].raw_ptr == (uintptr_t)(in2 + 7));
        CHECK(l.ev[3].data_ptr == (uintptr_t)(in2 + 13));
    }
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p);
    log_free(&l);
}

static void test_sse_callback_stop(void)
{
    const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    run_t r;
    memset(&r, 0, sizeof(r));
    mg_sse_parser_t p;
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    r.log.stop_at = 2;
    r.log.stop_val = 7;
    CHECK_EQ_INT(mg_sse_feed(&p, s, strlen(s), record, &r.log), 7);
    CHECK_EQ_INT(r.log.n, 2);
    mg_sse_free(&p);
    log_free(&r.log);

    /* stop from a held event */
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    r.log.stop_at = 1;
    r.log.stop_val = -5;
    CHECK_EQ_INT(mg_sse_feed(&p, "data: a\n", 8, record, &r.log), 0);
    CHECK_EQ_INT(mg_sse_feed(&p, "\ndata: b\n\n", 10, record, &r.log), -5);
    CHECK_EQ_INT(r.log.n, 1);
    mg_sse_free(&p);
    log_free(&r.log);
}

static void test_sse_oversize(void)
{
    mg_sse_parser_t p;
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    CHECK_EQ_INT(p.max_event, 4 << 20);
    mg_sse_free(&p);

    run_t r;
    const char *exact = "data: 01234567\n\n"; /* 16 bytes */
    run_whole(&r, MG_SSE_MODE_SSE, 16, exact, strlen(exact));
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(r.log.n, 1);
    log_free(&r.log);
    const char *big = "data: 1\n\ndata: 0123456789\n\n";
    run_whole(&r, MG_SSE_MODE_SSE, 16, big, strlen(big));
    CHECK_EQ_INT(r.rc, -1);
    CHECK_EQ_INT(r.log.n, 1);
    log_free(&r.log);
    /* an unfinished event over the limit fails as soon as it is held */
    const char *tail = "data: 0123456789abcdef";
    run_whole(&r, MG_SSE_MODE_SSE, 16, tail, strlen(tail));
    CHECK_EQ_INT(r.rc, -1);
    log_free(&r.log);
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 16, big, 1), 0);

    /* the default limit: 4 MiB of data in 64 KiB pieces */
    size_t n = ((size_t)4 << 20) + 64;
    char *s = malloc(n);
    memset(s, 'x', n);
    memcpy(s, "data: ", 6);
    s[n - 2] = '\n';
    s[n - 1] = '\n';
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    log_t l = {0};
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0; at += 65536)
        rc = mg_sse_feed(&p, s + at, n - at < 65536 ? n - at : 65536, record, &l);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(l.n, 0);
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p);
    free(s);
}

/* A big multi-line event held across many feeds: joined in scratch, in order. */
static void test_sse_big_multiline(void)
{
    size_t lines = 1000, line_len = 1024;
    size_t n = lines * (6 + line_len + 1) + 1;
    char *s = malloc(n);
    size_t at = 0;
    for (size_t i = 0; i < lines; i++) {
        memcpy(s + at, "data: ", 6);
        memset(s + at + 6, 'a' + (int)(i % 26), line_len);
        s[at + 6 + line_len] = '\n';
        at += 6 + line_len + 1;
    }
    s[at++] = '\n';
    mg_sse_parser_t p;
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    log_t l = {0};
    for (size_t i = 0; i < n; i += 4000)
        CHECK_EQ_INT(mg_sse_feed(&p, s + i, n - i < 4000 ? n - i : 4000, record, &l), 0);
    CHECK_EQ_INT(l.n, 1);
    if (l.n == 1) {
        CHECK_EQ_INT(l.ev[0].data_len, lines * (line_len + 1) - 1);
        CHECK_EQ_INT(l.ev[0].raw_len, n);
        CHECK(memcmp(l.ev[0].raw, s, n) == 0);
        int ok = 1;
        for (size_t i = 0; i < lines; i++) {
            const char *d = l.ev[0].data + i * (line_len + 1);
            ok &= d[0] == 'a' + (int)(i % 26) && d[line_len - 1] == d[0];
            ok &= i + 1 == lines || d[line_len] == '\n';
        }
        CHECK(ok);
    }
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p);
    log_free(&l);
    free(s);
}

static void test_sse_openai_done(void)
{
    const char *s =
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n"
        "data: [DONE]\n\n";
    run_t r;
    run_whole(&r, MG_SSE_MODE_SSE, 0, s, strlen(s));
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(r.log.n, 3);
    if (r.log.n == 3) {
        CHECK(strncmp(r.log.ev[0].data, "{\"id\":\"c1\"", 10) == 0);
        CHECK_STR(r.log.ev[2].data, "[DONE]");
        CHECK_STR(r.log.ev[2].raw, "data: [DONE]\n\n");
    }
    CHECK_EQ_INT(r.pending, 0);
    log_free(&r.log);
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_SSE, 0, s, 0), 0);
}

/* ---- NDJSON -------------------------------------------------------------------------- */

static void test_ndjson_lines(void)
{
    run_t r;
    const char *s = "{\"a\":1}\n{\"b\":2}\r\n";
    run_whole(&r, MG_SSE_MODE_NDJSON, 0, s, strlen(s));
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(r.log.n, 2);
    if (r.log.n == 2) {
        CHECK_STR(r.log.ev[0].data, "{\"a\":1}");
        CHECK_STR(r.log.ev[0].raw, "{\"a\":1}\n");
        CHECK(r.log.ev[0].event == NULL);
        CHECK_STR(r.log.ev[1].data, "{\"b\":2}");
        CHECK_STR(r.log.ev[1].raw, "{\"b\":2}\r\n");
    }
    CHECK_EQ_INT(r.pending, 0);
    log_free(&r.log);
}

static void test_ndjson_no_trailing_newline(void)
{
    run_t r;
    const char *s = "{\"a\":1}\n{\"done\":true}";
    run_whole(&r, MG_SSE_MODE_NDJSON, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 1);
    CHECK_EQ_INT(r.pending, strlen("{\"done\":true}"));
    CHECK(r.pending > 0);
    log_free(&r.log);
}

static void test_ndjson_blank_lines(void)
{
    run_t r;
    const char *s = "\n\r\n  \t\n{\"a\":1}\n\n\n{\"b\":2}\n";
    run_whole(&r, MG_SSE_MODE_NDJSON, 0, s, strlen(s));
    CHECK_EQ_INT(r.log.n, 2);
    if (r.log.n == 2) {
        CHECK_STR(r.log.ev[0].raw, "{\"a\":1}\n");
        CHECK_STR(r.log.ev[1].raw, "{\"b\":2}\n");
    }
    CHECK_EQ_INT(r.pending, 0);
    log_free(&r.log);
}

static void test_ndjson_splits_stop_oversize(void)
{
    const char *s =
        "{\"a\":1}\n\n{\"model\":\"m\",\"message\":{\"content\":\"x\"}}\r\n \n{\"done\":true}\n{";
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_NDJSON, 0, s, 1), 0);
    CHECK_EQ_INT(split_mismatches(MG_SSE_MODE_NDJSON, 20, s, 1), 0);

    run_t r;
    run_whole(&r, MG_SSE_MODE_NDJSON, 20, s, strlen(s));
    CHECK_EQ_INT(r.rc, -1);
    CHECK_EQ_INT(r.log.n, 1);
    log_free(&r.log);

    /* an unterminated line over the limit fails as soon as it is held */
    const char *tail = "{}\n{\"content\":\"0123456789abc";
    run_whole(&r, MG_SSE_MODE_NDJSON, 20, tail, strlen(tail));
    CHECK_EQ_INT(r.rc, -1);
    CHECK_EQ_INT(r.log.n, 1);
    log_free(&r.log);

    mg_sse_parser_t p;
    mg_sse_init(&p, MG_SSE_MODE_NDJSON);
    memset(&r, 0, sizeof(r));
    r.log.stop_at = 1;
    r.log.stop_val = 3;
    CHECK_EQ_INT(mg_sse_feed(&p, "{}\n{}\n", 6, record, &r.log), 3);
    CHECK_EQ_INT(r.log.n, 1);
    mg_sse_free(&p);
    log_free(&r.log);
}

/* ---- a callback that stops and frees the parser -------------------------------------- */

/* The owner of a heap parser, as proxy.c's call is: the callback at event `stop_at` returns
 * a stop value and either frees the parser (`free_it`: ASan reports any later touch) or
 * poisons it (every byte 0xA5, memory kept: a later write shows in any build). */
typedef struct {
    mg_sse_parser_t *p;
    int n, stop_at, stop_val, free_it;
    int poisoned;
} owner_t;

static int stop_and_free(void *ud, const mg_sse_event_t *ev)
{
    owner_t *o = ud;
    CHECK(o->p != NULL); /* never called again after the stop */
    if (++o->n != o->stop_at) return 0;
    mg_sse_free(o->p);
    if (o->free_it) {
        free(o->p);
        o->p = NULL;
    } else {
        memset(o->p, 0xA5, sizeof(*o->p));
        o->poisoned = 1;
    }
    return o->stop_val;
}

static int still_poisoned(const mg_sse_parser_t *p)
{
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < sizeof(*p); i++)
        if (b[i] != 0xA5) return 0;
    return 1;
}

/* Feeds s in pieces ending at cuts[] to a heap parser whose callback stops at event k; returns
 * the feed's result at the stop (0 if the stream had fewer events). The parser is not touched
 * by this driver after the stop either. */
static int feed_until_freed(mg_sse_mode_t mode, const char *s, const size_t *cuts, int ncuts, int k,
                            int stop_val, int free_it, int *events)
{
    owner_t o = {malloc(sizeof(mg_sse_parser_t)), 0, k, stop_val, free_it, 0};
    mg_sse_init(o.p, mode);
    mg_sse_parser_t *keep = o.p;
    size_t n = strlen(s), at = 0;
    int rc = 0;
    for (int i = 0; i <= ncuts && rc == 0; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        char *piece = malloc(to - at + 1);
        memcpy(piece, s + at, to - at);
        rc = mg_sse_feed(keep, piece, to - at, stop_and_free, &o);
        free(piece);
        at = to;
    }
    *events = o.n;
    if (o.poisoned) {
        CHECK(still_poisoned(keep)); /* nothing wrote to the parser after the callback */
        free(keep);
    } else if (o.p) {
        mg_sse_free(o.p);
        free(o.p);
    }
    return rc;
}

/* The case: an NDJSON line held across reads, completed by the next read, whose
 * callback frees the parser (the gateway's ollama stream whose one line was an error). */
static void test_ndjson_stop_and_free_held_line(void)
{
    const char *s = "{\"a\":1}\n{\"b\":2}\n";
    size_t cuts[1] = {6}; /* "{\"a\":1" then "}\n{\"b\":2}\n", as fuzz input \x05\x00... */
    int events;
    CHECK_EQ_INT(feed_until_freed(MG_SSE_MODE_NDJSON, s, cuts, 1, 1, 1, 1, &events), 1);
    CHECK_EQ_INT(events, 1);
    CHECK_EQ_INT(feed_until_freed(MG_SSE_MODE_NDJSON, s, cuts, 1, 1, 1, 0, &events), 1);
    CHECK_EQ_INT(events, 1);
    /* the last line arriving without its newline, completed by the "\n" the gateway adds */
    const char *err = "{\"error\":\"model runner crashed\"}\n";
    size_t at_end[1] = {strlen(err) - 1};
    CHECK_EQ_INT(feed_until_freed(MG_SSE_MODE_NDJSON, err, at_end, 1, 1, 1, 0, &events), 1);
    CHECK_EQ_INT(events, 1);
}

/* Every split (two pieces, and byte by byte), every event as the one that frees, both modes,
 * a positive and a negative stop value: the feed returns the stop value and the parser is
 * not written after the callback. Run under ASan (make asan), a read shows too. */
static void test_stop_and_free_everywhere(void)
{
    static const char *streams[2] = {
        "data: 1\n\n: keep\n\ndata: a\ndata: b\r\n\r\nevent: e\rdata: 3\r\rdata: [DONE]\n\n",
        "{\"a\":1}\n\n  \n{\"b\":2}\r\n{\"c\":3}\n{\"d\":4}\n",
    };
    static const int n_events[2] = {4, 4};
    for (int m = 0; m < 2; m++) {
        mg_sse_mode_t mode = m ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE;
        const char *s = streams[m];
        size_t n = strlen(s);
        size_t *bytes = malloc(n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) bytes[i] = i + 1;
        int bad = 0;
        for (int k = 1; k <= n_events[m]; k++) {
            for (int v = 0; v < 2; v++) {
                int stop_val = v ? -7 : 3, events;
                for (size_t i = 0; i < n; i++) {
                    size_t cuts[1] = {i};
                    for (int f = 0; f < 2; f++) {
                        int rc =
                            feed_until_freed(mode, s, cuts, i ? 1 : 0, k, stop_val, f, &events);
                        if ((rc != stop_val || events != k) && bad++ == 0)
                            fprintf(stderr, "  mode %d stop at %d, split %zu: rc %d, %d events\n",
                                    m, k, i, rc, events);
                    }
                }
                int rc = feed_until_freed(mode, s, bytes, (int)n - 1, k, stop_val, 0, &events);
                if ((rc != stop_val || events != k) && bad++ == 0)
                    fprintf(stderr, "  mode %d stop at %d, byte by byte: rc %d\n", m, k, rc);
            }
        }
        CHECK_EQ_INT(bad, 0);
        free(bytes);
    }
}

/* A stop that keeps the parser leaves nothing held, so a parser reused for another stream
 * (a failover to the next provider) starts clean. */
static void test_stop_leaves_nothing_held(void)
{
    for (int m = 0; m < 2; m++) {
        mg_sse_mode_t mode = m ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE;
        const char *a = m ? "{\"x\"" : "data: x";
        const char *b = m ? ":1}\n{\"tail\"" : "\n\ndata: tail";
        mg_sse_parser_t p;
        mg_sse_init(&p, mode);
        log_t l = {0};
        l.stop_at = 1;
        l.stop_val = 9;
        CHECK_EQ_INT(mg_sse_feed(&p, a, strlen(a), record, &l), 0);
        CHECK(mg_sse_pending(&p) > 0);
        CHECK_EQ_INT(mg_sse_feed(&p, b, strlen(b), record, &l), 9); /* the held event stops */
        CHECK_EQ_INT(mg_sse_pending(&p), 0);
        l.stop_at = 0;
        const char *c = m ? "{\"next\":1}\n" : "data: next\n\n";
        CHECK_EQ_INT(mg_sse_feed(&p, c, strlen(c), record, &l), 0);
        CHECK_EQ_INT(l.n, 2);
        CHECK_STR(l.ev[1].data, m ? "{\"next\":1}" : "next");
        mg_sse_free(&p);
        log_free(&l);
    }
}

/* ---- lifecycle ----------------------------------------------------------------------- */

static void test_free(void)
{
    mg_sse_parser_t p;
    log_t l = {0};
    mg_sse_init(&p, MG_SSE_MODE_SSE);
    CHECK_EQ_INT(mg_sse_feed(&p, "data: partial", 13, record, &l), 0);
    CHECK_EQ_INT(mg_sse_pending(&p), 13);
    CHECK_EQ_INT(mg_sse_feed(&p, "", 0, record, &l), 0);
    CHECK_EQ_INT(mg_sse_pending(&p), 13);
    mg_sse_free(&p);
    CHECK(p.buf == NULL);
    CHECK_EQ_INT(mg_sse_pending(&p), 0);
    mg_sse_free(&p); /* twice is fine */
    log_free(&l);
}

int main(void)
{
    MG_RUN(test_sse_basic);
    MG_RUN(test_sse_mixed_whole);
    MG_RUN(test_sse_all_splits);
    MG_RUN(test_sse_crlf);
    MG_RUN(test_sse_cr_lf_split_across_feeds);
    MG_RUN(test_sse_cr_only);
    MG_RUN(test_sse_multiline_data);
    MG_RUN(test_sse_comments_and_fields);
    MG_RUN(test_sse_event_names);
    MG_RUN(test_sse_raw_exact);
    MG_RUN(test_sse_zero_copy);
    MG_RUN(test_sse_callback_stop);
    MG_RUN(test_sse_oversize);
    MG_RUN(test_sse_big_multiline);
    MG_RUN(test_sse_openai_done);
    MG_RUN(test_ndjson_lines);
    MG_RUN(test_ndjson_no_trailing_newline);
    MG_RUN(test_ndjson_blank_lines);
    MG_RUN(test_ndjson_splits_stop_oversize);
    MG_RUN(test_ndjson_stop_and_free_held_line);
    MG_RUN(test_stop_and_free_everywhere);
    MG_RUN(test_stop_leaves_nothing_held);
    MG_RUN(test_free);
    return mg_test_summary();
}
