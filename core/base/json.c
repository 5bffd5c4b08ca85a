/* json: buffer + serializer; see json.h. */
#include "base/json.h"

#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

static int buf_grow(mg_buf_t *b, size_t n)
{
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

int mg_buf_append(mg_buf_t *b, const void *data, size_t n)
{
    if (b->len + n + 1 > b->cap && buf_grow(b, n) != 0) return -1;
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int mg_buf_reserve(mg_buf_t *b, size_t n)
{
    return b->len + n + 1 > b->cap ? buf_grow(b, n) : 0;
}

int mg_buf_append_str(mg_buf_t *b, const char *s)
{
    return mg_buf_append(b, s, strlen(s));
}

void mg_buf_free(mg_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

const char *mg_int_digits(long long v, char tmp[MG_INT_DIGITS_MAX], size_t *len)
{
    char *end = tmp + MG_INT_DIGITS_MAX, *p = end;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *--p = '-';
    *len = (size_t)(end - p);
    return p;
}

int mg_buf_append_int(mg_buf_t *b, long long v)
{
    char tmp[MG_INT_DIGITS_MAX];
    size_t n;
    const char *p = mg_int_digits(v, tmp, &n);
    return mg_buf_append(b, p, n);
}

int mg_json_print_number(double d, mg_buf_t *out)
{
    char tmp[40];
    int n;
    if (!isfinite(d)) return mg_buf_append(out, "null", 4);
    if (d == floor(d) && fabs(d) < 1e15)
        return mg_buf_append_int(out, (long long)d); /* no printf */
    n = snprintf(tmp, sizeof(tmp), "%.15g", d);
    if (strtod(tmp, NULL) != d) n = snprintf(tmp, sizeof(tmp), "%.17g", d);
    return mg_buf_append(out, tmp, (size_t)n);
}

int mg_json_print_string(const char *s, size_t n, mg_buf_t *out)
{
    static const char hex[] = "0123456789abcdef";
    /* room for the worst case (every byte a \u00XX escape) once, then write in place */
    if (out->len + 6 * n + 3 > out->cap && buf_grow(out, 6 * n + 2) != 0) return -1;
    char *o = out->data + out->len;
    *o++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '\n': *o++ = 'n'; break;
        case '\r': *o++ = 'r'; break;
        case '\t': *o++ = 't'; break;
        case '\b': *o++ = 'b'; break;
        case '\f': *o++ = 'f'; break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    *o++ = '"';
    *o = '\0';
    out->len = (size_t)(o - out->data);
    return 0;
}

int mg_json_print(const cJSON *v, mg_buf_t *out)
{
    if (!v) return mg_buf_append(out, "null", 4);
    switch (v->type & 0xFF) {
    case cJSON_NULL: return mg_buf_append(out, "null", 4);
    case cJSON_False: return mg_buf_append(out, "false", 5);
    case cJSON_True: return mg_buf_append(out, "true", 4);
    case cJSON_Number: return mg_json_print_number(v->valuedouble, out);
    case cJSON_String: return mg_json_print_string(v->valuestring, strlen(v->valuestring), out);
    case cJSON_Raw: return mg_buf_append_str(out, v->valuestring ? v->valuestring : "null");
    case cJSON_Array:
    case cJSON_Object: {
        int obj = (v->type & 0xFF) == cJSON_Object;
        if (mg_buf_append(out, obj ? "{" : "[", 1)) return -1;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child && mg_buf_append(out, ",", 1)) return -1;
            if (obj) {
                const char *k = c->string ? c->string : "";
                if (mg_json_print_string(k, strlen(k), out) || mg_buf_append(out, ":", 1))
                    return -1;
            }
            if (mg_json_print(c, out)) return -1;
        }
        return mg_buf_append(out, obj ? "}" : "]", 1);
    }
    default: return mg_buf_append(out, "null", 4);
    }
}

/* ------------------------------------------------------------------------ */
/* Scanning without a tree                                                   */
/* ------------------------------------------------------------------------ */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

#ifdef __SSE2__
/* Bit k set when p[k] is '"' or '\\', for the 16 bytes at p. */
static unsigned quote_or_backslash_mask(const char *p)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
    __m128i hit =
        _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')), _mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
    return (unsigned)_mm_movemask_epi8(hit);
}
#endif

/* The index of the first '"' or '\\' in s[i..n), or n. 16 bytes a step: most JSON strings
 * are short keys and values, where a memchr call per string (two in a validating scan: the
 * quote, then any backslash before it) cost more than the bytes. */
static size_t find_quote_or_backslash(const char *s, size_t i, size_t n)
{
#ifdef __SSE2__
    for (; i + 16 <= n; i += 16) {
        unsigned mask = quote_or_backslash_mask(s + i);
        if (mask) return i + (size_t)__builtin_ctz(mask);
    }
#endif
    for (; i < n; i++)
        if (s[i] == '"' || s[i] == '\\') return i;
    return n;
}

/* The string's contents start at s[i]: return the index of its closing quote (the first
 * quote no backslash escapes, as cJSON finds it), or n when there is none. *escaped is set
 * when the contents hold a backslash. */
static size_t string_close(const char *s, size_t i, size_t n, int *escaped)
{
    for (;;) {
        size_t j = find_quote_or_backslash(s, i, n);
        if (j >= n || s[j] == '"') return j;
        *escaped = 1;
        i = j + 2; /* the escaped byte cannot close the string */
        if (i > n) return n;
    }
}

/* s[i] is '"': return the index just past the closing quote, or n+1 on error. */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    int escaped = 0;
    size_t j = string_close(s, i + 1, n, &escaped);
    return j < n ? j + 1 : n + 1;
}

/* The bytes a bracket scan stops at; everything else is skipped with one lookup. */
static const unsigned char structural[256] = {
    ['"'] = 1, ['{'] = 1, ['['] = 1, ['}'] = 1, [']'] = 1};

/* Return the index just past the value starting at s[i], or n+1 on error. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    if (i >= n) return n + 1;
    if (s[i] == '"') return skip_string(s, i, n);
    if (s[i] == '{' || s[i] == '[') {
        /* brackets only need to balance: the upstream's own parser already ran */
        char stack[64];
        size_t depth = 0;
        while (i < n) {
            char ch = s[i];
            if (!structural[(unsigned char)ch]) {
                i++;
                continue;
            }
            if (ch == '"') {
                i = skip_string(s, i, n);
                if (i > n) return n + 1;
                continue;
            }
            if (ch == '{' || ch == '[') {
                if (depth == sizeof(stack)) return n + 1;
                stack[depth++] = ch == '{' ? '}' : ']';
            } else if (ch == '}' || ch == ']') {
                if (depth == 0 || stack[depth - 1] != ch) return n + 1;
                if (--depth == 0) return i + 1;
            }
            i++;
        }
        return n + 1;
    }
    size_t start = i;
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++;
    return i > start ? i : n + 1;
}

int mg_json_members(const char *s, size_t n, mg_json_member_cb cb, void *ud)
{
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '{') return -1;
    i = skip_ws(s, i + 1, n);
    if (i < n && s[i] == '}') return skip_ws(s, i + 1, n) == n ? 0 : -1;
    for (;;) {
        if (i >= n || s[i] != '"') return -1;
        size_t kend = skip_string(s, i, n);
        if (kend > n) return -1;
        mg_json_member_t m = {s + i + 1, kend - i - 2, NULL, 0};
        i = skip_ws(s, kend, n);
        if (i >= n || s[i] != ':') return -1;
        i = skip_ws(s, i + 1, n);
        size_t vend = skip_value(s, i, n);
        if (vend > n) return -1;
        m.value = s + i;
        m.value_len = vend - i;
        int rc = cb(ud, &m);
        if (rc) return rc;
        i = skip_ws(s, vend, n);
        if (i < n && s[i] == ',') {
            i = skip_ws(s, i + 1, n);
            continue;
        }
        if (i < n && s[i] == '}') return skip_ws(s, i + 1, n) == n ? 0 : -1;
        return -1;
    }
}

int mg_json_elements(const char *s, size_t n, mg_json_element_cb cb, void *ud)
{
    size_t i = skip_ws(s, 0, n);
    if (i >= n || s[i] != '[') return -1;
    i = skip_ws(s, i + 1, n);
    if (i < n && s[i] == ']') return skip_ws(s, i + 1, n) == n ? 0 : -1;
    for (;;) {
        size_t vend = skip_value(s, i, n);
        if (vend > n) return -1;
        int rc = cb(ud, s + i, vend - i);
        if (rc) return rc;
        i = skip_ws(s, vend, n);
        if (i < n && s[i] == ',') {
            i = skip_ws(s, i + 1, n);
            continue;
        }
        if (i < n && s[i] == ']') return skip_ws(s, i + 1, n) == n ? 0 : -1;
        return -1;
    }
}

/* ------------------------------------------------------------------------ */
/* cJSON's verdict without cJSON: mirrors cJSON 1.7's parse_value and friends */
/* ------------------------------------------------------------------------ */

#define V_ERR SIZE_MAX
#define V_DEPTH_LIMIT 1000 /* CJSON_NESTING_LIMIT */

typedef struct {
    const unsigned char *s;
    size_t n;
    int odd_ws;           /* whitespace other than space, tab, CR, LF was skipped */
    mg_json_member_cb cb; /* the top-level object's members go here (may be NULL) */
    void *ud;
    int stopped; /* cb's non-zero return */
} vctx_t;

static size_t v_ws(vctx_t *v, size_t i)
{
    while (i < v->n && v->s[i] <= 32) {
        unsigned char c = v->s[i++];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') v->odd_ws = 1;
    }
    return i;
}

/* cJSON's parse_hex4: a bad digit makes the whole value 0 (and the escape passes). */
static unsigned v_hex4(const unsigned char *p)
{
    unsigned h = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = p[i];
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else return 0;
        h = (h << 4) | d;
    }
    return h;
}

/* Length of the \u escape at p (6, or 12 for a surrogate pair); 0 when refused. `end` is the
 * string's closing quote. */
static size_t v_utf16(const unsigned char *p, const unsigned char *end)
{
    if (end - p < 6) return 0;
    unsigned first = v_hex4(p + 2);
    if (first >= 0xDC00 && first <= 0xDFFF) return 0;
    if (first < 0xD800 || first > 0xDBFF) return 6;
    const unsigned char *second = p + 6;
    if (end - second < 6 || second[0] != '\\' || second[1] != 'u') return 0;
    unsigned low = v_hex4(second + 2);
    return low >= 0xDC00 && low <= 0xDFFF ? 12 : 0;
}

/* The escapes of a string's contents [p, end), stepped through as cJSON decodes them. */
static int v_escapes(const unsigned char *p, const unsigned char *end)
{
    while (p < end) {
        if (*p != '\\') {
            p++;
            continue;
        }
        size_t len = 2;
        switch (p[1]) {
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
        case '"':
        case '\\':
        case '/': break;
        case 'u':
            len = v_utf16(p, end);
            if (!len) return -1;
            break;
        default: return -1;
        }
        p += len;
    }
    return 0;
}

/* s[i] is '"'. The string ends at the first quote that a backslash does not escape
 * (cJSON's first loop); raw control bytes are accepted, as cJSON does. */
static size_t v_string(const vctx_t *v, size_t i)
{
    int escaped = 0;
    size_t j = string_close((const char *)v->s, i + 1, v->n, &escaped);
    if (j >= v->n) return V_ERR;
    if (escaped && v_escapes(v->s + i + 1, v->s + j) != 0) return V_ERR;
    return j + 1;
}

static int v_number_char(unsigned char c)
{
    return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == 'e' || c == 'E' || c == '.';
}

/* Exactly the JSON grammar's number over all of p[0..n): strtod takes all of it. */
static int v_plain_number(const unsigned char *p, size_t n)
{
    size_t i = p[0] == '-';
    if (i >= n) return 0;
    if (p[i] == '0') i++;
    else if (p[i] >= '1' && p[i] <= '9')
        while (i < n && p[i] >= '0' && p[i] <= '9') i++;
    else return 0;
    if (i < n && p[i] == '.') {
        size_t d = ++i;
        while (i < n && p[i] >= '0' && p[i] <= '9') i++;
        if (i == d) return 0;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) i++;
        size_t d = i;
        while (i < n && p[i] >= '0' && p[i] <= '9') i++;
        if (i == d) return 0;
    }
    return i == n;
}

/* cJSON's parse_number: the run of number characters through strtod, with '.' as the locale's
 * decimal point; what strtod leaves of the run is left for the caller. */
static size_t v_number(const vctx_t *v, size_t i)
{
    size_t run = 0;
    while (i + run < v->n && v_number_char(v->s[i + run])) run++;
    if (v_plain_number(v->s + i, run)) return i + run;
    char small[64], *end;
    char *buf = run < sizeof(small) ? small : malloc(run + 1);
    if (!buf) return V_ERR;
    const char *dp = localeconv()->decimal_point;
    for (size_t k = 0; k < run; k++) buf[k] = v->s[i + k] == '.' ? dp[0] : (char)v->s[i + k];
    buf[run] = '\0';
    (void)strtod(buf, &end);
    size_t used = (size_t)(end - buf);
    if (buf != small) free(buf);
    return used == 0 ? V_ERR : i + used;
}

static size_t v_value(vctx_t *v, size_t i, int depth);

/* s[i] is '{' or '['. */
static size_t v_container(vctx_t *v, size_t i, int depth)
{
    if (depth >= V_DEPTH_LIMIT) return V_ERR;
    int obj = v->s[i] == '{';
    unsigned char close = obj ? '}' : ']';
    i = v_ws(v, i + 1);
    if (i < v->n && v->s[i] == close) return i + 1;
    for (;;) {
        size_t key = i, key_end = 0;
        if (obj) {
            if (i >= v->n || v->s[i] != '"' || (i = key_end = v_string(v, i)) == V_ERR)
                return V_ERR;
            i = v_ws(v, i);
            if (i >= v->n || v->s[i] != ':') return V_ERR;
            i = v_ws(v, i + 1);
        }
        size_t value = i;
        if ((i = v_value(v, i, depth + 1)) == V_ERR) return V_ERR;
        if (obj && depth == 0 && v->cb) {
            mg_json_member_t m = {(const char *)v->s + key + 1, key_end - key - 2,
                                  (const char *)v->s + value, i - value};
            if ((v->stopped = v->cb(v->ud, &m)) != 0) return V_ERR;
        }
        i = v_ws(v, i);
        if (i < v->n && v->s[i] == ',') {
            i = v_ws(v, i + 1);
            continue;
        }
        return i < v->n && v->s[i] == close ? i + 1 : V_ERR;
    }
}

static size_t v_literal(const vctx_t *v, size_t i, const char *lit, size_t n)
{
    return v->n - i >= n && memcmp(v->s + i, lit, n) == 0 ? i + n : V_ERR;
}

static size_t v_value(vctx_t *v, size_t i, int depth)
{
    if (i >= v->n) return V_ERR;
    switch (v->s[i]) {
    case 'n': return v_literal(v, i, "null", 4);
    case 'f': return v_literal(v, i, "false", 5);
    case 't': return v_literal(v, i, "true", 4);
    case '"': return v_string(v, i);
    case '[':
    case '{': return v_container(v, i, depth);
    case '-': return v_number(v, i);
    default: return v->s[i] >= '0' && v->s[i] <= '9' ? v_number(v, i) : V_ERR;
    }
}

int mg_json_check(const char *s, size_t n, size_t *end)
{
    if (!s || n == 0) return -1;
    vctx_t v = {(const unsigned char *)s, n, 0, NULL, NULL, 0};
    size_t i = 0;
    if (n > 4 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
        i = 3;
        v.odd_ws = 1;
    }
    i = v_value(&v, v_ws(&v, i), 0);
    if (i == V_ERR) return -1;
    if (end) *end = i;
    return v.odd_ws;
}

int mg_json_check_members(const char *s, size_t n, mg_json_member_cb cb, void *ud)
{
    vctx_t v = {(const unsigned char *)s, n, 0, cb, ud, 0};
    size_t i = s ? v_ws(&v, 0) : n;
    if (i >= n || s[i] != '{') return -1;
    i = v_value(&v, i, 0);
    if (v.stopped) return v.stopped;
    if (i == V_ERR || v.odd_ws || v_ws(&v, i) != n || v.odd_ws) return -1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Integers beyond a double                                                  */
/* ------------------------------------------------------------------------ */

#define EXACT_DOUBLE_LIMIT 9007199254740992.0 /* 2^53 */

static int big_number(const cJSON *v)
{
    return cJSON_IsNumber(v) &&
           (v->valuedouble >= EXACT_DOUBLE_LIMIT || v->valuedouble <= -EXACT_DOUBLE_LIMIT);
}

static int integer_literal(const char *s, size_t n)
{
    size_t i = n > 0 && s[0] == '-';
    if (i >= n) return 0;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return 1;
}

static int keep_big_int(void *ud, const mg_json_member_t *m)
{
    cJSON *obj = ud;
    char key[64], lit[64];
    if (m->key_len >= sizeof(key) || m->value_len >= sizeof(lit) ||
        memchr(m->key, '\\', m->key_len) || !integer_literal(m->value, m->value_len))
        return 0;
    memcpy(key, m->key, m->key_len);
    key[m->key_len] = '\0';
    cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!big_number(item)) return 0;
    memcpy(lit, m->value, m->value_len);
    lit[m->value_len] = '\0';
    cJSON *raw = cJSON_CreateRaw(lit);
    if (!raw || !cJSON_ReplaceItemInObjectCaseSensitive(obj, key, raw)) {
        cJSON_Delete(raw);
        return 2; /* out of memory (-1 is the scan's own refusal of the text) */
    }
    return 0;
}

int mg_json_keep_big_ints(cJSON *obj, const char *s, size_t n)
{
    if (!cJSON_IsObject(obj)) return 0;
    const cJSON *c = obj->child;
    while (c && !big_number(c)) c = c->next;
    if (!c) return 0;
    /* a text the scan cannot read (cJSON accepts a few more) keeps its doubles */
    return mg_json_members(s, n, keep_big_int, obj) == 2 ? -1 : 0;
}

cJSON *mg_json_cut(cJSON *arr, int at)
{
    cJSON *cut = cJSON_CreateArray(), *m = arr->child;
    if (!cut) return NULL;
    for (int i = 0; m && i < at; i++) m = m->next;
    for (cJSON *next; m; m = next) {
        next = m->next;
        cJSON_AddItemToArray(cut, cJSON_DetachItemViaPointer(arr, m));
    }
    return cut;
}

void mg_json_rejoin(cJSON *arr, cJSON *cut)
{
    while (cut->child) cJSON_AddItemToArray(arr, cJSON_DetachItemViaPointer(cut, cut->child));
    cJSON_Delete(cut);
}

long long mg_json_ll(const cJSON *v, long long dflt)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != v->valuedouble) return dflt;
    double d = v->valuedouble;
    if (d >= 9.2e18) return LLONG_MAX; /* 9.2e18 < 2^63: every smaller double fits */
    if (d <= -9.2e18) return LLONG_MIN;
    return (long long)d;
}

int mg_json_int(const cJSON *v, int dflt)
{
    long long x = mg_json_ll(v, dflt);
    return x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
}
