/* Unit tests for core/upstream/chunk.c: the keys of a stream chunk, wherever they fall relative to
 * the scan's 16-byte steps. */
#include "upstream/chunk.h"
#include "mgtest.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    const char *members; /* the object's members after the padding one */
    int flags;
} case_t;

static const case_t cases[] = {
    {"\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":"
     "{\"content\":\" word\"},\"logprobs\":null,\"finish_reason\":null}]",
     0},
    {"\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
     "\"finish_reason\":null}]",
     0},
    {"\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]", MG_CHUNK_FINISH},
    {"\"choices\":[{\"delta\":{},\"finish_reason\" : \"length\"}]", MG_CHUNK_FINISH},
    {"\"choices\":[{\"delta\":{},\"finish_reason\"\n:\n\"stop\"}]", MG_CHUNK_FINISH},
    {"\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}", MG_CHUNK_USAGE},
    {"\"choices\":[],\"usage\":null", 0},
    {"\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1}",
     MG_CHUNK_FINISH | MG_CHUNK_USAGE},
    {"\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}", MG_CHUNK_ERROR},
    {"\"error\":\"overloaded\"", MG_CHUNK_ERROR},
    {"\"error\":null,\"choices\":[]", 0},
    /* names that end like ours but are not */
    {"\"xfinish_reason\":\"stop\",\"reusage\":{},\"terror\":\"x\"", 0},
    {"\"reason\":\"stop\",\"sage\":{},\"rror\":{}", 0},
};

/* The case's object with a padding member of pad bytes first: every key lands at every
 * offset of a 16-byte step, and in the tail the steps leave. Exactly sized, so a read past
 * the end is caught by the sanitizer build. */
static char *object_with_padding(const char *members, int pad, size_t *n)
{
    size_t len = strlen(members) + (size_t)pad + 16;
    char *buf = malloc(len);
    int w = snprintf(buf, len, "{\"p\":\"%*s\",%s}", pad, "", members);
    *n = (size_t)w;
    char *exact = malloc(*n);
    memcpy(exact, buf, *n);
    free(buf);
    return exact;
}

static void test_cases_at_every_offset(void)
{
    int wrong = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int pad = 0; pad < 48; pad++) {
            size_t n;
            char *s = object_with_padding(cases[c].members, pad, &n);
            int got = mg_chunk_keys(s, n);
            if (got != cases[c].flags) {
                fprintf(stderr, "  case %zu pad %d: flags %d, want %d\n", c, pad, got,
                        cases[c].flags);
                wrong++;
            }
            free(s);
        }
    }
    CHECK_EQ_INT(wrong, 0);
}

/* A key cut off by the end of the text is not there; nothing is read past the end. */
static void test_truncated(void)
{
    const char *full = "{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}";
    size_t n = strlen(full);
    for (size_t k = 0; k <= n; k++) {
        char *s = malloc(k ? k : 1);
        memcpy(s, full, k);
        int got = mg_chunk_keys(s, k);
        /* the value's opening quote is what marks it: present from there on */
        size_t quote_at = (size_t)(strstr(full, ":\"stop") - full) + 1;
        CHECK_EQ_INT(got, k > quote_at ? MG_CHUNK_FINISH : 0);
        free(s);
    }
}

static void test_empty(void)
{
    CHECK_EQ_INT(mg_chunk_keys("", 0), 0);
    CHECK_EQ_INT(mg_chunk_keys(":", 1), 0);
    CHECK_EQ_INT(mg_chunk_keys("\":", 2), 0);
}

int main(void)
{
    MG_RUN(test_cases_at_every_offset);
    MG_RUN(test_truncated);
    MG_RUN(test_empty);
    return mg_test_summary();
}
