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
    mg_sse_mode_t mode;
    const char *in; /* the whole stream, for the SSE raw invariant */
    size_t n;
    size_t raw_sum; /* SSE: bytes of the input covered by reported raws */
    int rc;
    size_t pending;
} run_t;

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
    put_event(&r->rec, ev->data, ev->data_len, ev->event, ev->event_len, ev->raw, ev->raw_len);
    return 0;
}

/* Feeds in[0..n) in pieces of piece(i) bytes (copied to their own heap buffers, so ASan sees
 * reads past a piece). */
static void run(run_t *r, mg_sse_mode_t mode, size_t max_event, const char *in, size_t n,
                size_t step, int vary)
{
    mg_sse_parser_t p;
    mg_sse_init(&p, mode);
    if (max_event) p.max_event = max_event;
    memset(r, 0, sizeof(*r));
    r->mode = mode;
    r->in = in;
    r->n = n;
    size_t at = 0;
    for (size_t i = 0; at < n && r->rc == 0; i++) {
        size_t k = vary ? 1 + (i * 7 + 3) % step : step;
        if (k > n - at) k = n - at;
        char *piece = malloc(k);
        CHECK(piece);
        memcpy(piece, in + at, k);
        r->rc = mg_sse_feed(&p, piece, k, on_event, r);
        free(piece);
        at += k;
    }
    r->pending = mg_sse_pending(&p);
    if (r->rc == 0 && mode == MG_SSE_MODE_SSE) CHECK(r->raw_sum + r->pending == n);
    if (r->rc == 0 && mode == MG_SSE_MODE_NDJSON) CHECK(r->pending <= n);
    if (r->rc != 0) CHECK(r->rc == -1 && r->pending == 0);
    mg_sse_free(&p);
}

/* ---- reference: the rules applied to the whole input at once, no cleverness ----------- */

/* Ends of the line starting at i: *le = end of its content, returns the index after its
 * terminator, or 0 when the line is unterminated or ends in a '\r' that is the last byte. */
static size_t ref_line(const char *s, size_t n, size_t i, size_t *le)
{
    while (i < n && s[i] != '\r' && s[i] != '\n')
        i++;
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
        while (colon < len && line[colon] != ':')
            colon++;
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
        while (j < n && s[j] != '\n')
            j++;
        if (j == n) break;
        if (j + 1 - i > max) {
            r->rc = -1;
            r->pending = 0;
            return;
        }
        size_t len = j - i;
        if (len && s[j - 1] == '\r') len--;
        size_t k = 0;
        while (k < len && (s[i + k] == ' ' || s[i + k] == '\t' || s[i + k] == '\r'))
            k++;
        if (k < len) put_event(&r->rec, s + i, len, NULL, 0, s + i, j + 1 - i);
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
    CHECK(a->rec.len == b->rec.len);
    CHECK(a->rec.len == 0 || memcmp(a->rec.b, b->rec.b, a->rec.len) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t size)
{
    if (size < 1) return 0;
    size_t step = (size_t)(d[0] & 0x3f) + 1;
    size_t max_event = (d[0] & 0x40) ? 48 : 0;
    int vary = (d[0] & 0x80) != 0;
    const char *in = (const char *)d + 1;
    size_t n = size - 1;
    for (int m = 0; m < 2; m++) {
        mg_sse_mode_t mode = m ? MG_SSE_MODE_NDJSON : MG_SSE_MODE_SSE;
        run_t whole, pieces, bytes, ref;
        run(&whole, mode, max_event, in, n, n ? n : 1, 0);
        run(&pieces, mode, max_event, in, n, step, vary);
        run(&bytes, mode, max_event, in, n, 1, 0);
        memset(&ref, 0, sizeof(ref));
        if (mode == MG_SSE_MODE_SSE)
            ref_sse(&ref, max_event ? max_event : (size_t)4 << 20, in, n);
        else
            ref_ndjson(&ref, max_event ? max_event : (size_t)4 << 20, in, n);
        same(&whole, &ref);
        same(&pieces, &ref);
        same(&bytes, &ref);
        if (!max_event) CHECK(whole.rc == 0); /* fuzz inputs are far below the 4 MiB default */
        free(whole.rec.b);
        free(pieces.rec.b);
        free(bytes.rec.b);
        free(ref.rec.b);
    }
    return 0;
}
