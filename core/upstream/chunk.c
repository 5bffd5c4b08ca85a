/* chunk: the keys of an OpenAI stream chunk the gateway acts on; see chunk.h. */
#include "upstream/chunk.h"

#include <stddef.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

static inline int json_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/* The first character of a member's value, from just past its key (whitespace and the
 * colon skipped), or 0 at the end of the text. */
static int value_after(const char *p, const char *end)
{
    while (p < end && (json_ws(*p) || *p == ':')) p++;
    return p < end ? *p : 0;
}

/* Whether the n bytes before the closing quote at q - 1 are key, with its opening quote. */
static inline int key_is(const char *s, const char *q, const char *key, size_t n)
{
    return (size_t)(q - s) >= n + 2 && q[-(ptrdiff_t)n - 2] == '"' &&
           memcmp(q - n - 1, key, n) == 0;
}

/* What the colon at p says: the key before it, when it is one the gateway acts on with a
 * value that matters, recognised by the last letter of the name first. */
static int colon_flags(const char *s, const char *p, const char *end)
{
    const char *q = p++; /* back from the colon to just past the name's closing quote */
    while (q > s && json_ws(q[-1])) q--;
    if (q - s < 2 || q[-1] != '"') return 0;
    int v;
    switch (q[-2]) {
    case 'n':
        return value_after(p, end) == '"' && key_is(s, q, "finish_reason", 13) ? MG_CHUNK_FINISH
                                                                               : 0;
    case 'e':
        return value_after(p, end) == '{' && key_is(s, q, "usage", 5) ? MG_CHUNK_USAGE : 0;
    case 'r':
        v = value_after(p, end);
        return (v == '{' || v == '"') && key_is(s, q, "error", 5) ? MG_CHUNK_ERROR : 0;
    default:
        return 0;
    }
}

#ifdef __SSE2__
/* Bit k set when p[k] is a colon that may end one of our keys: right after a quote with
 * 'n', 'e' or 'r' before it (finish_reason, usage, error), or after whitespace or another
 * control byte (a key spaced from its colon, judged in full). p[-2] must be readable. */
static __m128i load16(const char *p)
{
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

static unsigned candidate_mask(const char *p)
{
    __m128i c0 = load16(p), c1 = load16(p - 1), c2 = load16(p - 2);
    __m128i last = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(c2, _mm_set1_epi8('n')),
                                             _mm_cmpeq_epi8(c2, _mm_set1_epi8('e'))),
                                _mm_cmpeq_epi8(c2, _mm_set1_epi8('r')));
    __m128i quoted = _mm_and_si128(_mm_cmpeq_epi8(c1, _mm_set1_epi8('"')), last);
    __m128i spaced = _mm_cmpeq_epi8(_mm_min_epu8(c1, _mm_set1_epi8(' ')), c1);
    __m128i colon = _mm_cmpeq_epi8(c0, _mm_set1_epi8(':'));
    return (unsigned)_mm_movemask_epi8(_mm_and_si128(colon, _mm_or_si128(quoted, spaced)));
}
#endif

/* Every key is followed by a colon. 16 bytes a step, only the colons that may end one of
 * our keys are judged in full: a chunk has about ten colons, and a memchr call and a look
 * back from each cost more than the bytes between them. */
int mg_chunk_keys(const char *s, size_t n)
{
    const char *end = s + n;
    int flags = 0;
    size_t i = 0;
#ifdef __SSE2__
    /* a colon at 0 or 1 ends no key: the steps start at 2, so p[-2] is in the text */
    for (i = 2; i + 16 <= n; i += 16)
        for (unsigned mask = candidate_mask(s + i); mask; mask &= mask - 1)
            flags |= colon_flags(s, s + i + __builtin_ctz(mask), end);
#endif
    for (; i < n; i++)
        if (s[i] == ':') flags |= colon_flags(s, s + i, end);
    return flags;
}
