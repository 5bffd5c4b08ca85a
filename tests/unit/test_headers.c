/* Unit tests for core/upstream/headers.c: an error answer's headers as one block of
 * "name\0value\0" pairs, fed in pieces (llhttp) or as whole lines (curl), names lower-cased,
 * values trimmed, pairs that do not fit dropped whole. */
#include "mgtest.h"
#include "upstream/headers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The block as "name=value;" each. */
static const char *show(const char *block, size_t len)
{
    static char out[4096];
    size_t pos = 0, n = 0;
    const char *name, *value;
    out[0] = '\0';
    while (mg_headers_next(block, len, &pos, &name, &value) && n < sizeof(out))
        n += (size_t)snprintf(out + n, sizeof(out) - n, "%s=%s;", name, value);
    return out;
}

static void test_pieces_and_lines(void)
{
    mg_headers_t h = {0};
    /* llhttp's way: a name and a value in pieces */
    mg_headers_name(&h, "Retry-", 6);
    mg_headers_name(&h, "AFTER", 5);
    mg_headers_value(&h, "  1", 3);
    mg_headers_value(&h, "2 \t", 3);
    mg_headers_end_value(&h);
    /* an empty value: no value piece at all */
    mg_headers_name(&h, "X-Empty", 7);
    mg_headers_end_value(&h);
    /* curl's way: whole lines */
    mg_headers_line(&h, "X-RateLimit-Reset-Requests: 6m0s\r\n", 34);
    mg_headers_line(&h, "no colon here\r\n", 15);
    mg_headers_line(&h, "retry-after-ms:250\r\n", 20);
    size_t len;
    char *block = mg_headers_take(&h, &len);
    CHECK(block != NULL);
    CHECK_STR(show(block, len),
              "retry-after=12;x-empty=;x-ratelimit-reset-requests=6m0s;retry-after-ms=250;");
    CHECK_STR(mg_headers_find(block, len, "retry-after-ms"), "250");
    CHECK_STR(mg_headers_find(block, len, "x-empty"), "");
    CHECK(mg_headers_find(block, len, "Retry-After") == NULL); /* names are lower case */
    CHECK(mg_headers_find(block, len, "missing") == NULL);
    free(block);
    /* taken: empty, and a reset forgets what was fed */
    CHECK(mg_headers_take(&h, &len) == NULL && len == 0);
    mg_headers_line(&h, "A: 1\r\n", 6);
    mg_headers_reset(&h);
    CHECK(mg_headers_take(&h, &len) == NULL);
    CHECK(mg_headers_find(NULL, 0, "a") == NULL);
    mg_headers_free(&h);
}

static void test_bounded(void)
{
    mg_headers_t h = {0};
    char line[600], big[MG_HEADERS_MAX];
    int fed = 0;
    for (int i = 0; i < 40; i++) {
        int n = snprintf(line, sizeof(line), "X-Header-%02d: %0400d\r\n", i, i);
        mg_headers_line(&h, line, (size_t)n);
        fed++;
    }
    /* a value too large for what is left is dropped whole */
    memset(big, 'v', sizeof(big));
    mg_headers_name(&h, "X-Big", 5);
    mg_headers_value(&h, big, sizeof(big));
    mg_headers_end_value(&h);
    size_t len;
    char *block = mg_headers_take(&h, &len);
    CHECK(len <= MG_HEADERS_MAX);
    size_t pos = 0;
    int pairs = 0;
    const char *name, *value;
    while (mg_headers_next(block, len, &pos, &name, &value)) {
        char want[32];
        snprintf(want, sizeof(want), "x-header-%02d", pairs);
        CHECK_STR(name, want);
        CHECK_EQ_INT(strlen(value), 400);
        pairs++;
    }
    CHECK(pairs > 10 && pairs < fed); /* as many whole pairs as fit, in order */
    CHECK(mg_headers_find(block, len, "x-big") == NULL);
    free(block);
    mg_headers_free(&h);
}

int main(void)
{
    MG_RUN(test_pieces_and_lines);
    MG_RUN(test_bounded);
    return mg_test_summary();
}
