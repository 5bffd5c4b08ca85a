/* pretok: the two patterns of pretok.h as code.
 *
 * How each alternative resolves its backtracking, which is what makes one pass enough:
 *  - [A]*[B]+ (o200k's first word form, A and B overlapping): A* takes the longest run; if
 *    the character after it is in B, B+ takes the run from there; otherwise A* gives back
 *    characters until B+ can take one, so the match ends after the last character of the A
 *    run that is also in B (none: no match).
 *  - the optional leading [^\r\n\p{L}\p{N}]: tried with it first, then without (a mark is
 *    both that class and a word character, so both can match).
 *  - \s*[\r\n]+ ends after the last \r or \n of the whitespace run; \s+(?!\S) is the whole
 *    run at the end of the text, else the run less its last character when that leaves one;
 *    \s+ what remains.
 * The text is well-formed UTF-8 (the tokenizer repairs it first). */
#include "token/pretok.h"

#include "token/uclass.h"
#include "token/utf8.h"

/* The class of the code point at s[i] (i < n), its length in *len. */
static inline mg_uclass_t class_at(const uint8_t *s, size_t n, size_t i, size_t *len)
{
    if (s[i] < 0x80) {
        *len = 1;
        return (mg_uclass_t)mg_uclass_ascii[s[i]];
    }
    uint32_t cp;
    *len = mg_utf8_decode(s + i, n - i, &cp);
    return mg_uclass(cp);
}

/* The end of the longest run from i of characters in the set. */
static inline size_t run_of(const uint8_t *s, size_t n, size_t i, unsigned set)
{
    size_t len;
    while (i < n && mg_uclass_in(class_at(s, n, i, &len), set)) i += len;
    return i;
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i]: its end, or i when none matches. The only
 * non-ASCII case variant of these letters is U+017F LATIN SMALL LETTER LONG S, which
 * folds to s. */
static inline size_t contraction(const uint8_t *s, size_t n, size_t i)
{
    if (i + 1 >= n || s[i] != '\'') return i;
    uint8_t c = s[i + 1];
    uint8_t lc = c | 0x20;
    if (c == 0xC5 && i + 2 < n && s[i + 2] == 0xBF) return i + 3;
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return i;
    if (lc == 's' || lc == 't' || lc == 'm' || lc == 'd') return i + 2;
    if (i + 2 < n) {
        uint8_t d = s[i + 2] | 0x20;
        if ((lc == 'r' || lc == 'v') && d == 'e') return i + 3;
        if (lc == 'l' && d == 'l') return i + 3;
    }
    return i;
}

/* o200k's [A]*[B]+ from q: its end, or 0 when it does not match. */
static size_t word_lower(const uint8_t *s, size_t n, size_t q)
{
    size_t i = q, len, last_b = 0;
    while (i < n) {
        mg_uclass_t c = class_at(s, n, i, &len);
        if (!mg_uclass_in(c, MG_UC_SET_UPPER)) {
            if (mg_uclass_in(c, MG_UC_SET_LOWER)) return run_of(s, n, i + len, MG_UC_SET_LOWER);
            break;
        }
        i += len;
        if (mg_uclass_in(c, MG_UC_SET_LOWER)) last_b = i;
    }
    return last_b;
}

/* o200k's [A]+[B]* from q: its end, or 0 when it does not match. */
static size_t word_upper(const uint8_t *s, size_t n, size_t q)
{
    size_t i = run_of(s, n, q, MG_UC_SET_UPPER);
    if (i == q) return 0;
    return run_of(s, n, i, MG_UC_SET_LOWER);
}

/* \p{N}{1,3} from p (s[p] is a number). */
static size_t digits(const uint8_t *s, size_t n, size_t p, size_t l0)
{
    size_t i = p + l0, len;
    for (int k = 1; k < 3 && i < n && class_at(s, n, i, &len) == MG_UC_N; k++) i += len;
    return i;
}

/* ` ?[^\s\p{L}\p{N}]+` then [\r\n]* (cl100k) or [\r\n/]* (o200k): its end, or 0. */
static size_t punct(const uint8_t *s, size_t n, size_t p, mg_uclass_t c0, int slash)
{
    size_t q = p, len;
    if (s[p] == ' ' && p + 1 < n && mg_uclass_in(class_at(s, n, p + 1, &len), MG_UC_SET_PUNCT))
        q = p + 1;
    else if (!mg_uclass_in(c0, MG_UC_SET_PUNCT)) return 0;
    size_t i = run_of(s, n, q, MG_UC_SET_PUNCT);
    while (i < n && (s[i] == '\r' || s[i] == '\n' || (slash && s[i] == '/'))) i++;
    return i;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ from p (s[p] is whitespace). */
static size_t space(const uint8_t *s, size_t n, size_t p)
{
    size_t i = p, len, last_start = p, after_nl = 0, chars = 0;
    while (i < n) {
        mg_uclass_t c = class_at(s, n, i, &len);
        if (!mg_uclass_in(c, MG_UC_SET_WS)) break;
        last_start = i;
        i += len;
        chars++;
        if (c == MG_UC_CRLF) after_nl = i;
    }
    if (after_nl) return after_nl;
    if (i == n || chars < 2) return i;
    return last_start;
}

static size_t next_o200k(const uint8_t *s, size_t n, size_t p)
{
    size_t l0, e;
    mg_uclass_t c0 = class_at(s, n, p, &l0);
    int pre = mg_uclass_in(c0, MG_UC_SET_PRE) && p + l0 < n;
    if (pre && (e = word_lower(s, n, p + l0))) return contraction(s, n, e);
    if (mg_uclass_in(c0, MG_UC_SET_UPPER | MG_UC_SET_LOWER) && (e = word_lower(s, n, p)))
        return contraction(s, n, e);
    if (pre && (e = word_upper(s, n, p + l0))) return contraction(s, n, e);
    if (mg_uclass_in(c0, MG_UC_SET_UPPER) && (e = word_upper(s, n, p))) return contraction(s, n, e);
    if (c0 == MG_UC_N) return digits(s, n, p, l0);
    if ((e = punct(s, n, p, c0, 1))) return e;
    return space(s, n, p);
}

static size_t next_cl100k(const uint8_t *s, size_t n, size_t p)
{
    size_t l0, len, e;
    if (s[p] == '\'' && (e = contraction(s, n, p)) != p) return e;
    mg_uclass_t c0 = class_at(s, n, p, &l0);
    if (mg_uclass_in(c0, MG_UC_SET_L)) return run_of(s, n, p + l0, MG_UC_SET_L);
    if (mg_uclass_in(c0, MG_UC_SET_PRE) && p + l0 < n &&
        mg_uclass_in(class_at(s, n, p + l0, &len), MG_UC_SET_L))
        return run_of(s, n, p + l0 + len, MG_UC_SET_L);
    if (c0 == MG_UC_N) return digits(s, n, p, l0);
    if ((e = punct(s, n, p, c0, 0))) return e;
    return space(s, n, p);
}

size_t mg_pretok_next(mg_pretok_t pattern, const uint8_t *s, size_t n, size_t p)
{
    return pattern == MG_PRETOK_O200K ? next_o200k(s, n, p) : next_cl100k(s, n, p);
}
