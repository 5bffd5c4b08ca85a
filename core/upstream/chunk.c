/* chunk: one validating pass over a stream chunk's bytes; see chunk.h.
 *
 * A chunk is mostly string bytes (keys, ids, the content), so strings are crossed 16 bytes a
 * step (SSE2): one compare each for the quote and the backslash, one for a control byte and
 * the sign bit for a non-ASCII one; everything else is a byte-at-a-time walk over the few
 * structural characters between strings. Containers are tracked with one bit per level
 * (object or array) instead of a recursion, so a deep input costs no stack. Non-ASCII is
 * checked as UTF-8 where it appears: ASCII-only content pays nothing for it. */
#include "upstream/chunk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

typedef const unsigned char *pos_t;

/* JSON's whitespace: space, tab, LF, CR. */
static const unsigned char ws_byte[256] = {[' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1};

/* Bytes a string scan stops at: the quote, the backslash, control bytes, non-ASCII. */
#define STR_STOP(c) ((c) == '"' || (c) == '\\' || (c) < 0x20 || (c) >= 0x80)

static inline int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static inline int is_hex(unsigned char c)
{
    return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* ---- strings --------------------------------------------------------------------------- */

/* p at a backslash: past the escape, or NULL when it is not one of the grammar's. */
static pos_t scan_escape(pos_t p, pos_t end)
{
    if (end - p < 2) return NULL;
    switch (p[1]) {
    case '"':
    case '\\':
    case '/':
    case 'b':
    case 'f':
    case 'n':
    case 'r':
    case 't': return p + 2;
    case 'u':
        /* a lone surrogate escape is JSON (JSON.parse takes it); only the digits are checked */
        return end - p >= 6 && is_hex(p[2]) && is_hex(p[3]) && is_hex(p[4]) && is_hex(p[5]) ? p + 6
                                                                                            : NULL;
    default: return NULL;
    }
}

/* p at a byte >= 0x80: past one well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF), or NULL. */
static pos_t scan_utf8(pos_t p, pos_t end)
{
    unsigned char c = p[0];
    int more;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c < 0xC2) return NULL;          /* a continuation byte, or an overlong 2-byte form */
    if (c < 0xE0) {
        more = 1;
    } else if (c < 0xF0) {
        more = 2;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* U+D800..U+DFFF */
    } else if (c < 0xF5) {
        more = 3;
        if (c == 0xF0) lo = 0x90; /* overlong */
        if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else {
        return NULL;
    }
    if (end - p <= more || p[1] < lo || p[1] > hi) return NULL;
    for (int i = 2; i <= more; i++)
        if ((p[i] & 0xC0) != 0x80) return NULL;
    return p + 1 + more;
}

#ifdef __SSE2__
/* Bit k set when p[k] is a byte a string scan stops at (STR_STOP). A signed compare with 0x20
 * finds the control bytes and the non-ASCII ones (negative as signed bytes) at once. */
static inline unsigned stop_mask(pos_t p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i hit =
        _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
    hit = _mm_or_si128(hit, _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
    return (unsigned)_mm_movemask_epi8(hit);
}
#endif

/* The first byte at or after p a string scan stops at, or end. */
static inline pos_t find_stop(pos_t p, pos_t end)
{
#ifdef __SSE2__
    for (; end - p >= 16; p += 16) {
        unsigned m = stop_mask(p);
        if (m) return p + __builtin_ctz(m);
    }
#endif
    while (p < end && !STR_STOP(*p)) p++;
    return p;
}

/* p just past a string's opening quote: just past its closing quote, or NULL when the string
 * is not well formed or not closed. The general loop; scan_string tries the common case. */
static pos_t scan_string_rest(pos_t p, pos_t end)
{
    for (;;) {
        p = find_stop(p, end);
        if (p == end) return NULL;
        if (*p == '"') return p + 1;
        if (*p == '\\') p = scan_escape(p, end);
        else if (*p >= 0x80) p = scan_utf8(p, end);
        else return NULL; /* a raw control byte */
        if (!p) return NULL;
    }
}

/* The same, with the common case inline: a string with nothing to look at before its
 * closing quote (most keys and values of a chunk), 16 bytes a step. */
static inline pos_t scan_string(pos_t p, pos_t end)
{
#ifdef __SSE2__
    for (; end - p >= 16; p += 16) {
        unsigned m = stop_mask(p);
        if (m) {
            p += __builtin_ctz(m);
            return *p == '"' ? p + 1 : scan_string_rest(p, end);
        }
    }
#endif
    return scan_string_rest(p, end);
}

/* ---- scalars --------------------------------------------------------------------------- */

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? at p: just past it, or NULL. Needs no bound:
 * the chunk's closing brace stops every loop here. */
static pos_t scan_number(pos_t p)
{
    if (*p == '-') p++;
    if (!is_digit(*p)) return NULL;
    if (*p++ != '0')
        while (is_digit(*p)) p++;
    if (*p == '.') {
        if (!is_digit(*++p)) return NULL;
        while (is_digit(*p)) p++;
    }
    if ((*p | 0x20) == 'e') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!is_digit(*p)) return NULL;
        while (is_digit(*p)) p++;
    }
    return p;
}

/* ---- the chunk ------------------------------------------------------------------------- */

/* The flag of the key k[0..n) (n is 5 or 13) whose value starts with v. */
static inline int key_flag(pos_t k, size_t n, unsigned char v)
{
    if (n == 13) return v == '"' && memcmp(k, "finish_reason", 13) == 0 ? MG_CHUNK_FINISH : 0;
    if (k[0] == 'u') return v == '{' && memcmp(k, "usage", 5) == 0 ? MG_CHUNK_USAGE : 0;
    if (k[0] == 'e')
        return (v == '{' || v == '"') && memcmp(k, "error", 5) == 0 ? MG_CHUNK_ERROR : 0;
    return 0;
}

/* Whitespace needs no bound either: the closing brace is not whitespace. */
#define SKIP_WS(p)                                                                                 \
    do {                                                                                           \
        while (ws_byte[*(p)]) (p)++;                                                               \
    } while (0)

/* One pass, a state per label: `value` at a value, `key` at a member's key, `next` just past
 * a value (a comma or the container's end comes), `close` just past a container's end.
 *
 * The bound: the text, without trailing whitespace, must end with the object's closing brace
 * at `last`. Every byte the scan reads outside strings is then at or before `last`: loops
 * over whitespace and digits stop at that brace, a string cannot close past it, a literal is
 * checked to end before it, and only a close can step past it (then the object must be
 * complete). So the state code reads *p without comparing p to the end each time, the cost
 * that dominated a chunk's scan.
 *
 * The open containers are one bit per level in is_obj (1: object); obj and close_ch say what
 * the innermost one is. With `rec`, the value strings' quotes go there (the first
 * MG_CHUNK_MEMO_STRINGS of them), for mg_chunk_scan_memo. */
static int scan_full(const char *s, size_t n, mg_chunk_memo_t *rec)
{
    pos_t p = (pos_t)s, end = p + n;
    while (end > p && ws_byte[end[-1]]) end--;
    if (end == p || end[-1] != '}') return -1; /* a chunk is an object */
    pos_t last = end - 1;
    uint64_t is_obj[MG_CHUNK_MAX_DEPTH / 64];
    int depth = 0, obj = 0, flags = 0;
    unsigned char close_ch = 0;
    SKIP_WS(p);
    if (*p != '{') return -1;

value: /* p at a value, p <= last */
    switch (*p) {
    case '"':
        if (rec && rec->n_strings < MG_CHUNK_MEMO_STRINGS) {
            rec->open[rec->n_strings] = (uint32_t)(p - (pos_t)s);
            if (!(p = scan_string(p + 1, last))) return -1;
            rec->close[rec->n_strings++] = (uint32_t)(p - 1 - (pos_t)s);
        } else if (!(p = scan_string(p + 1, last))) {
            return -1;
        }
        goto next;
    case '{':
    case '[':
        if (depth == MG_CHUNK_MAX_DEPTH) return -1;
        obj = *p == '{';
        close_ch = obj ? '}' : ']';
        {
            uint64_t bit = (uint64_t)1 << (depth & 63), *w = &is_obj[depth >> 6];
            *w = (*w & ~bit) | (bit & (uint64_t) - (int64_t)obj);
        }
        depth++;
        p++;
        SKIP_WS(p);
        if (*p == close_ch) {
            p++;
            goto close;
        }
        if (obj) goto key;
        goto value;
    case 't':
        if (last - p < 4 || memcmp(p, "true", 4) != 0) return -1;
        p += 4;
        goto next;
    case 'f':
        if (last - p < 5 || memcmp(p, "false", 5) != 0) return -1;
        p += 5;
        goto next;
    case 'n':
        if (last - p < 4 || memcmp(p, "null", 4) != 0) return -1;
        p += 4;
        goto next;
    default:
        if (!(p = scan_number(p))) return -1;
        goto next;
    }

key: /* p at a member's key, p <= last */
    if (*p != '"') return -1;
    {
        pos_t k = p + 1;
        if (!(p = scan_string(k, last))) return -1;
        size_t kn = (size_t)(p - 1 - k);
        if (*p != ':') {
            SKIP_WS(p);
            if (*p != ':') return -1;
        }
        p++;
        SKIP_WS(p);
        if (kn == 5 || kn == 13) flags |= key_flag(k, kn, *p);
    }
    goto value;

close: /* p just past the end of the innermost container */
    if (--depth == 0) return p == end ? flags : -1;
    if (p == end) return -1; /* the last brace closed an inner container */
    obj = (int)((is_obj[(depth - 1) >> 6] >> ((depth - 1) & 63)) & 1);
    close_ch = obj ? '}' : ']';

next: /* p just past a value inside a container, p <= last */
    if (*p == ',') {
        p++;
        SKIP_WS(p);
        if (obj) goto key;
        goto value;
    }
    if (*p == close_ch) {
        p++;
        goto close;
    }
    if (!ws_byte[*p]) return -1;
    SKIP_WS(p);
    goto next;
}

int mg_chunk_scan(const char *s, size_t n)
{
    return scan_full(s, n, NULL);
}

/* ---- a stream's chunks against the last one scanned in full ---------------------------- */

#define CANNOT_TELL (-2)

/* How many leading bytes a[0..an) and b[0..bn) have in common. */
static size_t common_prefix(pos_t a, size_t an, pos_t b, size_t bn)
{
    size_t n = an < bn ? an : bn, i = 0;
#ifdef __SSE2__
    for (; i + 16 <= n; i += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(a + i));
        __m128i y = _mm_loadu_si128((const __m128i *)(const void *)(b + i));
        unsigned same = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y));
        if (same != 0xFFFF) return i + (size_t)__builtin_ctz(~same);
    }
#endif
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The chunk s[0..n) against the memo's template T, a valid chunk: s is T with the contents
 * of some value strings replaced. Walking both from the start, the bytes up to a difference
 * are the same, so the strict parser is in the same state in both there; a difference inside
 * one of T's value strings (after its opening quote) means s has a string in that place,
 * which is scanned on its own, and both walks go on past the two strings' closing quotes.
 * If they end together, s is T with strings swapped for strings: valid, with T's flags (its
 * keys and every value's first byte are T's). A difference anywhere else: CANNOT_TELL. A
 * string of s that does not scan: -1 (the parser would fail there too). */
static int scan_against(mg_chunk_memo_t *m, const char *s, size_t n)
{
    pos_t t = (pos_t)m->text, c = (pos_t)s;
    size_t tn = m->len, ti = 0, ci = 0;
    int i = 0; /* the first recorded string that may hold the next difference */
    for (;;) {
        size_t k = common_prefix(t + ti, tn - ti, c + ci, n - ci);
        ti += k;
        ci += k;
        int end = ti == tn && ci == n;
        if (m->places) { /* the strings passed unchanged are where T has them, shifted */
            size_t shift = ci - ti;
            for (; i < m->n_strings && (end || m->close[i] < ti); i++) {
                m->at_open[i] = (uint32_t)(m->open[i] + shift);
                m->at_close[i] = (uint32_t)(m->close[i] + shift);
            }
        }
        if (end) return m->flags;
        if (ti == tn || ci == n) return CANNOT_TELL;
        while (i < m->n_strings && m->close[i] < ti) i++;
        if (i == m->n_strings || m->open[i] >= ti) return CANNOT_TELL;
        size_t open = ci - (ti - m->open[i]); /* that string's opening quote in s */
        pos_t e = scan_string(c + open + 1, c + n);
        if (!e) return -1;
        ci = (size_t)(e - c);
        ti = m->close[i] + 1;
        m->at_open[i] = (uint32_t)open;
        m->at_close[i] = (uint32_t)(ci - 1);
        i++;
    }
}

void mg_chunk_memo_free(mg_chunk_memo_t *m)
{
    free(m->text);
    memset(m, 0, sizeof(*m));
}

int mg_chunk_scan_memo(mg_chunk_memo_t *m, const char *s, size_t n)
{
    if (m->len) {
        int r = scan_against(m, s, n);
        m->matched = r >= 0;
        if (r != CANNOT_TELL) return r;
    }
    m->matched = 0;
    m->len = 0; /* the recorded strings are being replaced */
    m->n_strings = 0;
    int r = scan_full(s, n, m);
    if (r < 0 || n > MG_CHUNK_MEMO_MAX) return r;
    if (n > m->cap) {
        size_t cap = n < 512 ? 512 : n; /* a stream's chunks in one allocation, mostly */
        char *t = realloc(m->text, cap);
        if (!t) return r; /* no template: the next chunk is scanned in full */
        m->text = t;
        m->cap = cap;
    }
    memcpy(m->text, s, n);
    m->len = n;
    m->flags = r;
    m->generation++;
    m->matched = 1;
    if (m->places) {
        memcpy(m->at_open, m->open, sizeof(m->open[0]) * (size_t)m->n_strings);
        memcpy(m->at_close, m->close, sizeof(m->close[0]) * (size_t)m->n_strings);
    }
    return r;
}
