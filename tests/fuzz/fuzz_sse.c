/* libFuzzer target for core/upstream/sse.c (see README.md in this directory).
 *
 * Input: byte 0 chooses how the rest is fed and limited; bytes 1.. are the stream.
 *   bits 0-5: piece size - 1 (1..64)
 *   bit 6:    max_event = 48 (exercises the oversize error) instead of the 4 MiB default
 *   bit 7:    piece sizes vary (1..piece size) instead of being fixed
 * In both modes the stream is fed whole, in pieces, and byte by byte; all three must give the
 * same events, return code and pending count, and the same as a naive whole-input reference
 * parser written straight from the rules. Invariants checked on every event:
 *   SSE:    the raws, concatenated, are the input from its start; event lies inside raw;
 *           with no error, sum of raw_len + pending == bytes fed.
 *   NDJSON: raw ends with '\n'; data is raw without "\n" / "\r\n"; data is not blank.
 *
 * Stop-and-free mode (environment FUZZ_SSE_MODE=stop-free): byte 1 chooses an event, and the
 * stream starts at byte 2.
 *   bits 0-6: the event (0-based) whose callback stops the feed and frees the parser
 *   bit 7:    the callback returns -2 instead of 1 (the parser must pass either through)
 * Everything above is checked as before, and then the stream is fed again whole, in pieces
 * and byte by byte to a parser on the heap whose callback, at that event, calls mg_sse_free,
 * frees the parser and returns the stop value (what proxy.c's callback does when it ends the
 * call). After that the driver never touches the parser: any read or write of it by the
 * parser is a use after free that ASan reports. The feed must return the stop value, and the
 * events up to the stop must be the reference's first ones; a run that keeps the parser after
 * the stop must find nothing held (mg_sse_pending() == 0). The reproduction is the
 * input "\x05\x00{\"a\":1}\n{\"b\":2}\n" (pieces of 6 bytes, stop at the first event).
 *
 * Any violation aborts (__builtin_trap), which libFuzzer reports as a crash. */
#include "upstream/sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) __builtin_trap();                                                                \
    } while (0)

/* ---- event records: a growable byte string, compared with memcmp ---------------------- */

typedef struct {
    unsigned char *b;
    size_t len, cap;
} bytes_t;

static void put(bytes_t *v, const void *s, size_t n)
{
    if (v->len + n > v->cap) {
        v->cap = (v->len + n) * 2 + 64;
        v->b = realloc(v->b, v->cap);
        CHECK(v->b);
    }
    if (n) memcpy(v->b + v->len, s, n);
    v->len += n;
}

static void put_field(bytes_t *v, const char *s, size_t n)
{
    put(v, &n, sizeof(n));
    put(v, s, n);
}

static void put_event(bytes_t *v, const char *data, size_t dlen, const char *ev, size_t elen,
                      const char *raw, size_t rlen)
{
    put_field(v, data, dlen);
    unsigned char has = ev != NULL;
    put(v, &has, 1);
    if (ev) put_field(v, ev, elen);
    put_field(v, raw, rlen);
}

typedef struct {
    bytes_t rec;
    int events;
    mg_sse_mode_t mode;
    const char *in; /* the whole stream, for the SSE raw invariant */
    size_t n;
    size_t raw_sum; /* SSE: bytes of the input covered by reported raws */
    int rc;
    size_t pending;
    /* stop-and-free runs */
    mg_sse_parser_t *p; /* the parser on the heap; NULL once the callback freed it */
    int stop_at;        /* 0-based event that stops the feed, -1: none */
    int stop_val;
    int free_at_stop; /* the stopping callback frees the parser (else it is kept) */
    int stopped;
} run_t;

static int stop_free_mode;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *m = getenv("FUZZ_SSE_MODE");
    stop_free_mode = m && strcmp(m, "stop-free") == 0;
    return 0;
}

static int on_event(void *ud, const mg_sse_event_t *ev)
{
    run_t *r = ud;
    CHECK(ev->data != NULL && ev->raw != NULL && ev->raw_len > 0);
    if (r->mode == MG_SSE_MODE_SSE) {
        CHECK(r->raw_sum + ev->raw_len <= r->n);
        CHECK(memcmp(ev->raw, r->in + r->raw_sum, ev->raw_len) == 0);
        r->raw_sum += ev->raw_len;
        char last = ev->raw[ev->raw_len - 1];
        CHECK(last == '\n' || last == '\r');
        CHECK(ev->data_len < ev->raw_len);
        if (ev->event)
            CHECK(ev->event >= ev->raw && ev->event + ev->event_len <= ev->raw + ev->raw_len);
    } else {
        CHECK(ev->event == NULL);
        CHECK(ev->raw[ev->raw_len - 1] == '\n');
        size_t term = ev->raw_len - ev->data_len;
        CHECK(term == 1 || (term == 2 && ev->raw[ev->raw_len - 2] == '\r'));
        CHECK(ev->data == ev->raw);
        size_t i = 0;
        while (i < ev->data_len &&
               (ev->data[i] == ' ' || ev->data[i] == '\t' || ev->data[i] == '\r'))
            i++;
        CHECK(i < ev->data_len);
    }
    CHECK(!r->stopped); /* no callback after a stop */
    put_event(&r->rec, ev->data, ev->data_len, ev->event, ev->event_len, ev->raw, ev->raw_len);
    if (r->events++ != r->stop_at) return 0;
    r->stopped = 1;
    if (r->free_at_stop) {
        mg_sse_free(r->p);
        free(r->p);
        r->p = NULL;
    }
    return r->stop_val;
}

/* Feeds in[0..n) in pieces of piece(i) bytes (copied to their own heap buffers, so ASan sees
 * reads past a piece) to a parser on the heap. With stop_at >= 0 the callback stops at that
 * event (and frees the parser when free_at_stop): the parser is not touched afterwards. */
static void run(run_t *r, mg_sse_mode_t mode, size_t max_event, const char *in, size_t n,
                size_t step, int vary, int stop_at, int stop_val, int free_at_stop)
{
    memset(r, 0, sizeof(*r));
    r->p = malloc(sizeof(*r->p));
    CHECK(r->p);
    mg_sse_init(r->p, mode);
    if (max_event) r->p->max_event = max_event;
    r->mode = mode;
    r->in = in;
    r->n = n;
    r->stop_at = stop_at;
    r->stop_val = stop_val;
    r->free_at_stop = free_at_stop;
    mg_sse_parser_t *p = r->p; /* fed through this copy: the callback may free r->p */
    size_t at = 0;
    for (size_t i = 0; at < n && r->rc == 0; i++) {
        size_t k = vary ? 1 + (i * 7 + 3) % step : step;
        if (k > n - at) k = n - at;
        char *piece = malloc(k);
        CHECK(piece);
        memcpy(piece, in + at, k);
        r->rc = mg_sse_feed(p, piece, k, on_event, r);
        free(piece);
        at += k;
    }
    if (r->stopped) {
        CHECK(r->rc == stop_val);
        if (!r->p) return;             /* freed by the callback: not one more look at it */
        CHECK(mg_sse_pending(p) == 0); /* a stop leaves nothing held */
        mg_sse_free(p);
        free(p);
        return;
    }
    r->pending = mg_sse_pending(p);
    if (r->rc == 0 && mode == MG_SSE_MODE_SSE) CHECK(r->raw_sum + r->pending == n);
    if (r->rc == 0 && mode == MG_SSE_MODE_NDJSON) CHECK(r->pending <= n);
    if (r->rc != 0) CHECK(r->rc == -1 && r->pending == 0);
    mg_sse_free(p);
    free(p);
}

/* ---- reference: the rules applied to the whole input at once, no cleverness ----------- */

/* Ends of the line starting at i: *le = end of its content, returns the index after its
 * terminator, or 0 when the line is unterminated or ends in a '\r' that is the last byte. */
static size_t ref_line(const char *s, size_t n, size_t i, size_t *le)
{
    while (i < n && s[i] != '\r' && s[i] != '\n') i++;
    *le = i;
    if (i == n) return 0;
    if (s[i] == '\n') return i + 1;
    if (i + 1 == n) return 0;
    return s[i + 1] == '\n' ? i + 2 : i + 1;
}

static void ref_sse(run_t *r, size_t max, const char *s, size_t n)
{
    bytes_t data = {0};
    size_t ndata = 0, raw = 0, i = 0, le;
    const char *ev = NULL;
    size_t ev_len = 0;
    for (size_t next; (next = ref_line(s, n, i, &le)) != 0; i = next) {
        const char *line = s + i;
        size_t len = le - i;
        if (len == 0) {
            if (ndata > 0) {
                if (next - raw > max) {
                    r->rc = -1;
                    break;
                }
                put_event(&r->rec, (const char *)data.b, data.len, ev, ev_len, s + raw, next - raw);
                r->events++;
                raw = next;
            }
            ndata = 0;
            data.len = 0;
            ev = NULL;
            ev_len = 0;
            continue;
        }
        if (line[0] == ':') continue;
        size_t colon = 0;
        while (colon < len && line[colon] != ':') colon++;
        const char *v = line + (colon < len ? colon + 1 : len);
        size_t vlen = (size_t)(line + len - v);
        if (vlen && v[0] == ' ') {
            v++;
            vlen--;
        }
        if (colon == 4 && memcmp(line, "data", 4) == 0) {
            if (ndata++ > 0) put(&data, "\n", 1);
            put(&data, v, vlen);
        } else if (colon == 5 && memcmp(line, "event", 5) == 0) {
            ev = v;
            ev_len = vlen;
        }
    }
    r->pending = r->rc ? 0 : n - raw;
    if (r->pending > max) {
        r->rc = -1;
        r->pending = 0;
    }
    free(data.b);
}

static void ref_ndjson(run_t *r, size_t max, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != '\n') j++;
        if (j == n) break;
        if (j + 1 - i > max) {
            r->rc = -1;
            r->pending = 0;
            return;
        }
        size_t len = j - i;
        if (len && s[j - 1] == '\r') len--;
        size_t k = 0;
        while (k < len && (s[i + k] == ' ' || s[i + k] == '\t' || s[i + k] == '\r')) k++;
        if (k < len) {
            put_event(&r->rec, s + i, len, NULL, 0, s + i, j + 1 - i);
            r->events++;
        }
        i = j + 1;
    }
    r->pending = n - i;
    if (r->pending > max) {
        r->rc = -1;
        r->pending = 0;
    }
}

static void same(const run_t *a, const run_t *b)
{
    CHECK(a->rc == b->rc);
    CHECK(a->pending == b->pending);
    CHECK(a->events == b->events);
    CHECK(a->rec.len == b->rec.len);
    CHECK(a->rec.len == 0 || memcmp(a->rec.b, b->rec.b, a->rec.len) == 0);
}

/* A run stopped at event k against the reference: the reference's first k + 1 events and the
 * stop value, or, with fewer events in the stream, exactly the reference. */
static void same_until_stop(const run_t *r, const run_t *ref, int k, int stop_val)
{
    if (ref->events <= k) {
        CHECK(!r->stopped);
        same(r, ref);
        return;
    }
    CHECK(r->stopped && r->rc == stop_val && r->events == k + 1);
    CHECK(r->rec.len <= ref->rec.len && memcmp(r->rec.b, ref->rec.b, r->rec.len) == 0);
}

static void free_run(run_t *r)
{
    free(r->rec.b);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    size_t head = stop_free_mode ? 2 : 1;
    if (size < head) return 0;
    size_t step = (size_t)(d[0] & 0x3f) + 1;
    size_t max_event = (d[0] & 0x40) ? 48 : 0;
    int vary = (d[0] & 0x80) != 0;
    int stop_at = stop_free_mode ? d[1] & 0x7f : -1;
    int stop_val = stop_free_mode && (d[1] & 0x80) ? -2 : 1;
    const char *in = (const char *)d + head;
    size_t n = size - head;
    for (int m = 0; m < 2; m++) {
        mg_sse_mode_t mode = m ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE;
        run_t whole, pieces, bytes, ref;
        run(&whole, mode, max_event, in, n, n ? n : 1, 0, -1, 0, 0);
        run(&pieces, mode, max_event, in, n, step, vary, -1, 0, 0);
        run(&bytes, mode, max_event, in, n, 1, 0, -1, 0, 0);
        memset(&ref, 0, sizeof(ref));
        if (mode == MG_SSE_MODE_SSE) ref_sse(&ref, max_event ? max_event : (size_t)4 << 20, in, n);
        else ref_ndjson(&ref, max_event ? max_event : (size_t)4 << 20, in, n);
        same(&whole, &ref);
        same(&pieces, &ref);
        same(&bytes, &ref);
        if (!max_event) CHECK(whole.rc == 0); /* fuzz inputs are far below the 4 MiB default */
        if (stop_free_mode) {
            run_t sw, sp, sb, kept;
            run(&sw, mode, max_event, in, n, n ? n : 1, 0, stop_at, stop_val, 1);
            run(&sp, mode, max_event, in, n, step, vary, stop_at, stop_val, 1);
            run(&sb, mode, max_event, in, n, 1, 0, stop_at, stop_val, 1);
            run(&kept, mode, max_event, in, n, step, vary, stop_at, stop_val, 0);
            same_until_stop(&sw, &ref, stop_at, stop_val);
            same_until_stop(&sp, &ref, stop_at, stop_val);
            same_until_stop(&sb, &ref, stop_at, stop_val);
            same_until_stop(&kept, &ref, stop_at, stop_val);
            free_run(&sw);
            free_run(&sp);
            free_run(&sb);
            free_run(&kept);
        }
        free_run(&whole);
        free_run(&pieces);
        free_run(&bytes);
        free_run(&ref);
    }
    return 0;
}
