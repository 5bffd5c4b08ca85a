/* json: buffer + serializer; see json.h. */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int mg_json_print_number(double d, mg_buf_t *out)
{
    char tmp[40];
    int n;
    if (!isfinite(d)) return mg_buf_append(out, "null", 4);
    if (d == floor(d) && fabs(d) < 1e15) {
        /* integers: digit by digit, no printf */
        long long v = (long long)d;
        char *p = tmp + sizeof(tmp);
        unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
        do {
            *--p = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0) *--p = '-';
        return mg_buf_append(out, p, (size_t)(tmp + sizeof(tmp) - p));
    }
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
    case cJSON_String:
        return mg_json_print_string(v->valuestring, strlen(v->valuestring), out);
    case cJSON_Raw: return mg_buf_append_str(out, v->valuestring ? v->valuestring : "null");
    case cJSON_Array:
    case cJSON_Object: {
        int obj = (v->type & 0xFF) == cJSON_Object;
        if (mg_buf_append(out, obj ? "{" : "[", 1)) return -1;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child && mg_buf_append(out, ",", 1)) return -1;
            if (obj) {
                const char *k = c->string ? c->string : "";
                if (mg_json_print_string(k, strlen(k), out) || mg_buf_append(out, ":", 1)) return -1;
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

/* s[i] is '"': return the index just past the closing quote, or n+1 on error.
 * memchr finds the candidates; a quote preceded by an odd run of backslashes is
 * escaped and the search goes on. */
static size_t skip_string(const char *s, size_t i, size_t n)
{
    size_t start = i + 1;
    size_t from = start;
    while (from < n) {
        const char *q = memchr(s + from, '"', n - from);
        if (!q) return n + 1;
        size_t j = (size_t)(q - s);
        size_t bs = 0;
        while (j - bs > start && s[j - bs - 1] == '\\') bs++;
        if (bs % 2 == 0) return j + 1;
        from = j + 1;
    }
    return n + 1;
}

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
