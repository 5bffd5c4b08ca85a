/* headers: an upstream error answer's response headers as one block; see headers.h. */
#include "upstream/headers.h"

#include <stdlib.h>
#include <string.h>

void mg_headers_reset(mg_headers_t *h)
{
    h->len = h->pair_start = 0;
    h->in_value = h->dropped = 0;
}

/* Room for n more bytes (and the two terminators of the pair), else the pair is dropped. */
static int room(mg_headers_t *h, size_t n)
{
    if (h->dropped) return 0;
    size_t need = h->len + n + 2;
    if (need > MG_HEADERS_MAX) goto drop;
    if (need > h->cap) {
        size_t cap = h->cap ? h->cap : 512;
        while (cap < need) cap *= 2;
        if (cap > MG_HEADERS_MAX) cap = MG_HEADERS_MAX;
        char *d = realloc(h->data, cap);
        if (!d) goto drop;
        h->data = d;
        h->cap = cap;
    }
    return 1;
drop:
    h->dropped = 1;
    h->len = h->pair_start;
    return 0;
}

void mg_headers_name(mg_headers_t *h, const char *at, size_t len)
{
    if (!room(h, len)) return;
    for (size_t i = 0; i < len; i++) {
        char ch = at[i];
        h->data[h->len++] = ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
    }
}

/* The name is complete: its terminator. */
static void end_name(mg_headers_t *h)
{
    if (h->in_value) return;
    h->in_value = 1;
    if (room(h, 0)) h->data[h->len++] = '\0';
}

void mg_headers_value(mg_headers_t *h, const char *at, size_t len)
{
    end_name(h);
    int empty = h->len > 0 && h->data[h->len - 1] == '\0'; /* nothing of the value yet */
    while (empty && len && (*at == ' ' || *at == '\t')) at++, len--;
    if (!room(h, len)) return;
    memcpy(h->data + h->len, at, len);
    h->len += len;
}

void mg_headers_end_value(mg_headers_t *h)
{
    end_name(h);
    if (!h->dropped) {
        while (h->len > h->pair_start && h->data[h->len - 1] != '\0' &&
               (h->data[h->len - 1] == ' ' || h->data[h->len - 1] == '\t'))
            h->len--;
        h->data[h->len++] = '\0'; /* room() kept a byte for it */
    }
    h->pair_start = h->len;
    h->in_value = h->dropped = 0;
}

void mg_headers_line(mg_headers_t *h, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (!colon || colon == line) return;
    size_t nlen = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n')) vlen--;
    mg_headers_name(h, line, nlen);
    mg_headers_value(h, v, vlen);
    mg_headers_end_value(h);
}

char *mg_headers_take(mg_headers_t *h, size_t *len)
{
    char *d = h->len ? h->data : NULL;
    *len = h->len;
    if (d) {
        h->data = NULL;
        h->cap = 0;
    }
    mg_headers_reset(h);
    return d;
}

void mg_headers_free(mg_headers_t *h)
{
    free(h->data);
    memset(h, 0, sizeof(*h));
}

int mg_headers_next(const char *block, size_t len, size_t *pos, const char **name,
                    const char **value)
{
    if (!block || *pos >= len) return 0;
    *name = block + *pos;
    size_t nl = strnlen(*name, len - *pos);
    if (*pos + nl + 1 >= len) return 0; /* a name without its value: not a pair */
    *value = *name + nl + 1;
    size_t vl = strnlen(*value, len - *pos - nl - 1);
    *pos += nl + 1 + vl + 1;
    return 1;
}

const char *mg_headers_find(const char *block, size_t len, const char *name)
{
    size_t pos = 0;
    const char *n, *v;
    while (mg_headers_next(block, len, &pos, &n, &v))
        if (strcmp(n, name) == 0) return v;
    return NULL;
}
