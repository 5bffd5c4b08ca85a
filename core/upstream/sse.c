/* sse: incremental framing of text/event-stream and NDJSON upstream bodies.
 *
 * The gateway forwards most upstream streams verbatim, so the parser's first job is
 * framing: find where each event ends and hand back its exact bytes (raw), plus the
 * decoded fields for streams a Lua adapter translates. The SSE rules followed are the
 * framing parts of WHATWG HTML "Server-sent events":
 *  - a line ends with "\r\n", "\n" or "\r";
 *  - a blank line ends an event; an event without data lines is not reported;
 *  - "data" values accumulate, joined with '\n'; "event" names the event; one space after
 *    the colon is dropped; a line starting with ':' is a comment; other fields are ignored
 *    (a line without a colon is a field with an empty value, so "data" alone adds "").
 *
 * How it works:
 *  - Zero copy when possible. While nothing is held, events that lie whole inside the fed
 *    buffer are reported with pointers into it, and only the tail (the unfinished event) is
 *    copied into p->buf. While something is held, the new bytes up to the next blank line
 *    are appended to it, that block is parsed in place, and the rest of the input goes back
 *    to the zero-copy path.
 *  - No byte goes missing from raw. Blocks that are not reported (comment-only keep-alives,
 *    extra blank lines, blocks without data) are carried into the raw of the next reported
 *    event, so all raws concatenated plus mg_sse_pending() bytes are exactly the input.
 *    Consequence: at the end of a stream, pending > 0 may also mean a trailing comment.
 *  - A blank line ending in '\r' as the very last byte fed is held until the next byte
 *    shows whether it is "\r\n"; otherwise an event's raw would depend on where the stream
 *    was split. (CR-only streams thus see each event when the next one starts.)
 *  - The only state between feeds is the held bytes: the line state where the next input
 *    continues them is read back from their last bytes.
 *  - A single data line is reported as a pointer into raw; two or more are joined in a
 *    scratch area of p->buf past the held bytes, reused by every event.
 *
 * NDJSON: lines end at '\n' only (a '\r' before it is dropped from data); lines that are
 * empty or only spaces, tabs and '\r' are skipped and belong to no raw.
 *
 * Not done: stripping a UTF-8 BOM at the start of the stream; the "id" and "retry" fields.
 */
#include "upstream/sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MG_SSE_DEFAULT_MAX_EVENT ((size_t)4 << 20)
/* A buffer grown past this for one big event is given back instead of kept for the stream. */
#define MG_SSE_KEEP_CAP ((size_t)256 << 10)

/* ---- held bytes and scratch: p->buf ---------------------------------------------------- */

/* Grows p->buf to at least `need` bytes, keeping its contents. Pointers into the old
 * buffer die. Returns 0, or -1 when out of memory. */
static int buf_reserve(mg_sse_parser_t *p, size_t need)
{
    if (need <= p->cap) return 0;
    size_t cap = p->cap ? p->cap : 256;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *nb = realloc(p->buf, cap);
    if (!nb) return -1;
    p->buf = nb;
    p->cap = cap;
    return 0;
}

/* Appends n bytes to the held bytes. The caller has checked max_event. */
static int buf_append(mg_sse_parser_t *p, const char *s, size_t n)
{
    if (n == 0) return 0;
    if (buf_reserve(p, p->len + n)) return -1;
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    return 0;
}

/* A buffer grown past MG_SSE_KEEP_CAP for one big event goes back to the allocator. Only
 * while nothing is held (p->len == 0). */
static void buf_trim(mg_sse_parser_t *p)
{
    if (p->cap > MG_SSE_KEEP_CAP) {
        free(p->buf);
        p->buf = NULL;
        p->cap = 0;
    }
}

/* Our own error (an event over max_event, out of memory): the held bytes are dropped, the
 * stream cannot be framed exactly any more. Returns -1. Never called after a callback stop:
 * the parser may be gone then. */
static int fail(mg_sse_parser_t *p)
{
    p->len = 0;
    return -1;
}

/* ---- line terminators ------------------------------------------------------------------ */

/* Finds line terminators in s[0..n). The next '\n' and the next '\r' are remembered, so each
 * kind is searched with one memchr pass over the input, however the lines are ended. */
typedef struct {
    const char *s;
    size_t n;
    size_t lf, cr; /* next '\n' / '\r' at or after the last position asked; n if none */
} term_finder_t;

static size_t find_byte(const char *s, size_t n, size_t from, char c)
{
    if (from >= n) return n;
    const char *q = memchr(s + from, c, n - from);
    return q ? (size_t)(q - s) : n;
}

static void tf_init(term_finder_t *f, const char *s, size_t n, size_t from)
{
    f->s = s;
    f->n = n;
    f->lf = find_byte(s, n, from, '\n');
    f->cr = find_byte(s, n, from, '\r');
}

/* Position of the first '\r' or '\n' at or after `from` (n if none). Calls must not go
 * backwards. */
static size_t tf_next(term_finder_t *f, size_t from)
{
    if (f->lf < from) f->lf = find_byte(f->s, f->n, from, '\n');
    if (f->cr < from) f->cr = find_byte(f->s, f->n, from, '\r');
    return f->lf < f->cr ? f->lf : f->cr;
}

#define TRF_NONE ((size_t)-1)

static size_t rfind_byte(const char *s, size_t before, char c)
{
    const char *q = before ? memrchr(s, c, before) : NULL;
    return q ? (size_t)(q - s) : TRF_NONE;
}

/* tf_next's mirror, for scanning back: the last '\r' and '\n' found, each searched again only
 * once the scan has passed it, so every byte is looked at once per terminator (with memrchr,
 * not a byte at a time: an event's long data line is crossed at memory speed). */
typedef struct {
    const char *s;
    size_t lf, cr; /* TRF_NONE: none before the scan's position */
} term_rfinder_t;

static void trf_init(term_rfinder_t *f, const char *s, size_t before)
{
    f->s = s;
    f->lf = rfind_byte(s, before, '\n');
    f->cr = rfind_byte(s, before, '\r');
}

/* Position of the last '\r' or '\n' before `before` (TRF_NONE if none). Calls must not go
 * forwards. */
static size_t trf_prev(term_rfinder_t *f, size_t before)
{
    if (f->lf != TRF_NONE && f->lf >= before) f->lf = rfind_byte(f->s, before, '\n');
    if (f->cr != TRF_NONE && f->cr >= before) f->cr = rfind_byte(f->s, before, '\r');
    if (f->lf == TRF_NONE) return f->cr;
    if (f->cr == TRF_NONE) return f->lf;
    return f->lf > f->cr ? f->lf : f->cr;
}

/* ---- SSE: one block of fields ---------------------------------------------------------- */

/* The event being read: the fields seen since the last blank line. */
typedef struct {
    size_t ndata;      /* data lines so far */
    const char *data;  /* the value of the only data line, while ndata == 1 */
    size_t data_len;   /* length of the joined data */
    size_t scratch;    /* offset in p->buf where joined data lives once ndata > 1 */
    const char *event; /* value of the last event line, NULL if none */
    size_t event_len;
} block_t;

static void block_reset(block_t *b)
{
    b->ndata = 0;
    b->data = NULL;
    b->data_len = 0;
    b->event = NULL;
    b->event_len = 0;
}

/* Adds one data value. The first stays a pointer into its line; from the second on the values
 * are joined in p->buf at b->scratch, which lies past the held bytes. When the lines themselves
 * are in p->buf, the caller has reserved room for the joined data so p->buf never moves. */
static int block_add_data(mg_sse_parser_t *p, block_t *b, const char *v, size_t vlen)
{
    if (++b->ndata == 1) {
        b->data = v;
        b->data_len = vlen;
        return 0;
    }
    if (buf_reserve(p, b->scratch + b->data_len + 1 + vlen)) return -1;
    char *dst = p->buf + b->scratch;
    if (b->ndata == 2) memcpy(dst, b->data, b->data_len);
    dst[b->data_len] = '\n';
    memcpy(dst + b->data_len + 1, v, vlen);
    b->data_len += 1 + vlen;
    return 0;
}

/* Applies one non-blank line (without its terminator) to the block. */
static int block_line(mg_sse_parser_t *p, block_t *b, const char *line, size_t len)
{
    if (line[0] == ':') return 0; /* comment */
    const char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    const char *v = colon ? colon + 1 : line + len;
    size_t vlen = (size_t)(line + len - v);
    if (vlen > 0 && v[0] == ' ') {
        v++;
        vlen--;
    }
    if (name_len == 4 && memcmp(line, "data", 4) == 0) return block_add_data(p, b, v, vlen);
    if (name_len == 5 && memcmp(line, "event", 5) == 0) {
        b->event = v;
        b->event_len = vlen;
    }
    return 0;
}

static int block_emit(mg_sse_parser_t *p, const block_t *b, const char *raw, size_t raw_len,
                      mg_sse_event_cb cb, void *ud)
{
    mg_sse_event_t ev;
    ev.data = b->ndata > 1 ? p->buf + b->scratch : b->data;
    ev.data_len = b->data_len;
    ev.event = b->event;
    ev.event_len = b->event_len;
    ev.raw = raw;
    ev.raw_len = raw_len;
    return cb(ud, &ev);
}

/* Reads s[from..n) line by line; `from` is the start of a block and s[*raw..from) holds only
 * carried bytes. Reports each event whose blank line ends inside, its raw starting at *raw;
 * on return *raw is where the unreported bytes start. A '\r' as the last byte ends its line
 * only when `final` (the caller knows no '\n' follows); otherwise the scan stops before that
 * line, as before an unterminated one. Joined data goes to p->buf from offset `scratch` on.
 * Returns 0, the callback's non-zero value (then it returns at once: p may be gone), or -1
 * (event over max_event, out of memory; p->len is 0 during every scan, see the callers). */
static int sse_scan(mg_sse_parser_t *p, const char *s, size_t n, size_t from, int final,
                    size_t scratch, size_t *raw, mg_sse_event_cb cb, void *ud)
{
    term_finder_t f;
    block_t b;
    block_reset(&b);
    b.scratch = scratch;
    tf_init(&f, s, n, from);
    size_t pos = from;
    while (pos < n) {
        size_t t = tf_next(&f, pos);
        if (t == n) break;
        size_t end = t + 1;
        if (s[t] == '\r') {
            if (end < n) end += s[end] == '\n';
            else if (!final) break;
        }
        if (t > pos) {
            if (block_line(p, &b, s + pos, t - pos)) return -1;
        } else if (b.ndata > 0) {
            if (end - *raw > p->max_event) return -1;
            int r = block_emit(p, &b, s + *raw, end - *raw, cb, ud);
            *raw = end;
            if (r) return r;
            block_reset(&b);
        } else {
            block_reset(&b); /* no data: nothing to report, the event name is forgotten */
        }
        pos = end;
    }
    return 0;
}

/* ---- SSE: held bytes ------------------------------------------------------------------- */

/* Looks in in[from..n) for the end of the first blank line. With `junction`, in[from] directly
 * continues the held bytes as the previous feed left them, and their last bytes give the line
 * state (they may end in a blank "\r" held back for its '\n'); otherwise in[from] starts a
 * line. Returns 1 and sets *end, or 0 if no blank line ends here (a blank "\r" as the last
 * input byte does not count yet). Needs p->len > 0 and from < n. */
static int sse_find_block_end(const mg_sse_parser_t *p, const char *in, size_t n, size_t from,
                              int junction, size_t *end)
{
    size_t pos = from;
    int at_line_start = 1;
    if (junction) {
        char last = p->buf[p->len - 1];
        if (last == '\r') {
            char before = p->len > 1 ? p->buf[p->len - 2] : '\n';
            pos += in[pos] == '\n'; /* the rest of a "\r\n" */
            if (before == '\n' || before == '\r') {
                *end = pos; /* the held "\r" was a blank line */
                return 1;
            }
        } else {
            at_line_start = last == '\n';
        }
    }
    term_finder_t f;
    tf_init(&f, in, n, pos);
    while (pos < n) {
        size_t t = tf_next(&f, pos);
        if (t == n) return 0;
        size_t e = t + 1;
        if (in[t] == '\r') {
            if (e == n) return 0; /* "\r" or "\r\n"? the next feed tells */
            e += in[e] == '\n';
        }
        if (t == pos && at_line_start) {
            *end = e;
            return 1;
        }
        at_line_start = 1;
        pos = e;
    }
    return 0;
}

/* Where the last block of the held bytes starts. The held bytes end with a complete blank
 * line; everything before the blank line preceding it is carried. Scans back over the last
 * block only. */
static size_t sse_held_block_start(const mg_sse_parser_t *p)
{
    const char *s = p->buf;
    size_t n = p->len;
    size_t last_blank = (n >= 2 && s[n - 2] == '\r' && s[n - 1] == '\n') ? n - 2 : n - 1;
    term_rfinder_t f;
    trf_init(&f, s, last_blank);
    for (size_t i = trf_prev(&f, last_blank); i != TRF_NONE; i = trf_prev(&f, i)) {
        char c = s[i];
        /* a terminator at a line start is a blank line; a '\n' after '\r' is half a "\r\n" */
        if (i > 0 && s[i - 1] != '\n' && !(s[i - 1] == '\r' && c != '\n')) continue;
        return i + 1 + (c == '\r' && s[i + 1] == '\n');
    }
    return 0;
}

/* The held bytes end with a complete blank line: reports their last block as one event (raw =
 * all held bytes) and drops them, or keeps them as carried bytes if the block has no data.
 * They are let go before the callback runs (p->len = 0; the bytes stay where they are, and
 * the event points at them), so that a callback that stops leaves nothing held and the
 * parser untouched afterwards. */
static int sse_held_emit(mg_sse_parser_t *p, mg_sse_event_cb cb, void *ud)
{
    size_t held = p->len;
    size_t start = sse_held_block_start(p);
    /* Joined data is never longer than its block: reserving it now keeps p->buf in place
     * while the scan holds pointers into it. */
    if (buf_reserve(p, held + (held - start))) return fail(p);
    size_t raw = 0;
    p->len = 0;
    int r = sse_scan(p, p->buf, held, start, 1, held, &raw, cb, ud);
    if (r) return r;
    if (raw < held) p->len = held; /* a block without data: carried into the next event */
    else buf_trim(p);
    return 0;
}

/* Zero-copy path, nothing held: reports the events that lie whole in `in`, then holds the
 * tail. */
static int sse_feed_direct(mg_sse_parser_t *p, const char *in, size_t n, mg_sse_event_cb cb,
                           void *ud)
{
    size_t raw = 0;
    int r = sse_scan(p, in, n, 0, 0, 0, &raw, cb, ud);
    if (r) return r;
    buf_trim(p); /* nothing is held; only gives back a scratch grown big */
    if (n - raw > p->max_event) return fail(p);
    return buf_append(p, in + raw, n - raw) ? fail(p) : 0;
}

static int sse_feed(mg_sse_parser_t *p, const char *in, size_t n, mg_sse_event_cb cb, void *ud)
{
    size_t pos = 0;
    int junction = 1;
    /* Finish what is held first: it needs the new bytes up to its end copied next to it. */
    while (p->len > 0 && pos < n) {
        size_t end;
        int found = sse_find_block_end(p, in, n, pos, junction, &end);
        size_t take = (found ? end : n) - pos;
        if (p->len + take > p->max_event) return fail(p);
        if (buf_append(p, in + pos, take)) return fail(p);
        pos += take;
        if (!found) return 0;
        int r = sse_held_emit(p, cb, ud);
        if (r) return r;
        junction = 0;
    }
    if (p->len > 0) return 0; /* input ended with a carried block; what is held waits for more */
    return sse_feed_direct(p, in + pos, n - pos, cb, ud);
}

/* ---- NDJSON ---------------------------------------------------------------------------- */

/* Reports one line (raw = the line with its '\n') unless it is blank. */
static int nd_emit(const char *line, size_t raw_len, mg_sse_event_cb cb, void *ud)
{
    size_t len = raw_len - 1;
    if (len > 0 && line[len - 1] == '\r') len--;
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    if (i == len) return 0;
    mg_sse_event_t ev = {line, len, NULL, 0, line, raw_len};
    return cb(ud, &ev);
}

/* The held line is completed by the input: it is let go before the callback runs (as in
 * sse_held_emit), so a stop leaves nothing held and nothing touches p after the callback. */
static int nd_feed(mg_sse_parser_t *p, const char *in, size_t n, mg_sse_event_cb cb, void *ud)
{
    size_t pos = 0;
    if (p->len > 0) {
        size_t nl = find_byte(in, n, 0, '\n');
        size_t take = nl < n ? nl + 1 : n;
        if (p->len + take > p->max_event) return fail(p);
        if (buf_append(p, in, take)) return fail(p);
        if (nl == n) return 0;
        size_t line = p->len;
        p->len = 0;
        int r = nd_emit(p->buf, line, cb, ud);
        if (r) return r;
        buf_trim(p);
        pos = take;
    }
    while (pos < n) {
        size_t nl = find_byte(in, n, pos, '\n');
        if (nl == n) break;
        if (nl + 1 - pos > p->max_event) return fail(p);
        int r = nd_emit(in + pos, nl + 1 - pos, cb, ud);
        if (r) return r;
        pos = nl + 1;
    }
    if (n - pos > p->max_event) return fail(p);
    return buf_append(p, in + pos, n - pos) ? fail(p) : 0;
}

/* ---- public ---------------------------------------------------------------------------- */

void mg_sse_init(mg_sse_parser_t *p, mg_sse_mode_t mode)
{
    p->mode = mode;
    p->buf = NULL;
    p->len = 0;
    p->cap = 0;
    p->max_event = MG_SSE_DEFAULT_MAX_EVENT;
}

/* Besides the header's contract: the event's pointers are not NUL-terminated; `event` is NULL
 * without an event line and points at "" for an empty one. Any non-zero return (callback stop,
 * oversize event, out of memory) abandons the rest of this input: the stream cannot be framed
 * exactly any more and the caller is expected to end it.
 *
 * The lifetime rule, kept by every path above: a callback's non-zero return is passed straight
 * up, and no code between the callback and this function's return reads or writes p. Whatever
 * the parser still had to do for that event (letting go of held bytes) is done before the
 * callback runs; our own errors reset p where they happen (fail()), never here. */
int mg_sse_feed(mg_sse_parser_t *p, const char *data, size_t len, mg_sse_event_cb cb, void *ud)
{
    if (len == 0) return 0;
    return p->mode == MG_SSE_MODE_NDJSON ? nd_feed(p, data, len, cb, ud)
                                         : sse_feed(p, data, len, cb, ud);
}

size_t mg_sse_pending(const mg_sse_parser_t *p)
{
    return p->len;
}

void mg_sse_free(mg_sse_parser_t *p)
{
    free(p->buf);
    p->buf = NULL;
    p->len = 0;
    p->cap = 0;
}
