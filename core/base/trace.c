/* trace: W3C traceparent parsing and span ids; see trace.h. */
#include "base/trace.h"

#include <string.h>

#include "base/crypto.h"

static int lower_hex(const char *s, size_t n)
{
    int nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return -1;
        nonzero |= c != '0';
    }
    return nonzero;
}

int mg_trace_parse(const char *v, mg_trace_t *t)
{
    if (!v) return -1;
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t')) n--;
    if (n < MG_TRACEPARENT_LEN || v[2] != '-' || v[35] != '-' || v[52] != '-') return -1;
    if (lower_hex(v, 2) < 0 || memcmp(v, "ff", 2) == 0) return -1;
    /* version 00 is exactly 55 characters; a later version may add fields after a '-' */
    if (memcmp(v, "00", 2) == 0 ? n != MG_TRACEPARENT_LEN
                                : (n > MG_TRACEPARENT_LEN && v[55] != '-'))
        return -1;
    if (lower_hex(v + 3, MG_TRACE_ID_HEX) != 1 || lower_hex(v + 36, MG_SPAN_ID_HEX) != 1 ||
        lower_hex(v + 53, 2) < 0)
        return -1;
    memcpy(t->trace_id, v + 3, MG_TRACE_ID_HEX);
    t->trace_id[MG_TRACE_ID_HEX] = '\0';
    memcpy(t->parent_id, v + 36, MG_SPAN_ID_HEX);
    t->parent_id[MG_SPAN_ID_HEX] = '\0';
    memcpy(t->flags, v + 53, 2);
    t->flags[2] = '\0';
    return 0;
}

/* n random bytes as 2n lowercase hex digits into out (NUL terminated), never all zeros. */
static int random_hex(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    static const unsigned char zeros[16] = {0};
    unsigned char b[16];
    if (n > sizeof(b)) return -1;
    do {
        if (mg_random_bytes(b, n) != 0) return -1;
    } while (memcmp(b, zeros, n) == 0); /* an all-zero id is invalid */
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n] = '\0';
    return 0;
}

int mg_trace_start(mg_trace_t *t, const char *traceparent)
{
    memset(t, 0, sizeof(*t));
    if (mg_trace_parse(traceparent, t) != 0) {
        memset(t, 0, sizeof(*t));
        if (random_hex(t->trace_id, MG_TRACE_ID_HEX / 2) != 0) goto fail;
        memcpy(t->flags, "01", 3);
    }
    if (random_hex(t->span_id, MG_SPAN_ID_HEX / 2) != 0) goto fail;
    return 0;
fail:
    memset(t, 0, sizeof(*t));
    return -1;
}

static void format_with(const mg_trace_t *t, const char *span, char *out)
{
    memcpy(out, "00-", 3);
    memcpy(out + 3, t->trace_id, MG_TRACE_ID_HEX);
    out[35] = '-';
    memcpy(out + 36, span, MG_SPAN_ID_HEX);
    out[52] = '-';
    memcpy(out + 53, t->flags, 2);
    out[MG_TRACEPARENT_LEN] = '\0';
}

void mg_trace_format(const mg_trace_t *t, char *out)
{
    if (!t->trace_id[0]) {
        out[0] = '\0';
        return;
    }
    format_with(t, t->span_id, out);
}

int mg_trace_child(const mg_trace_t *t, char *out, char *span_out)
{
    char span[MG_SPAN_ID_HEX + 1];
    if (!t->trace_id[0] || random_hex(span, MG_SPAN_ID_HEX / 2) != 0) {
        out[0] = '\0';
        return -1;
    }
    format_with(t, span, out);
    if (span_out) memcpy(span_out, span, sizeof(span));
    return 0;
}
