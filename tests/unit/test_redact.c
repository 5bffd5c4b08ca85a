/* Unit tests for core/base/redact.c: secrets masked in free text (the full-mode request log),
 * everything else left as it was. */
#include "base/redact.h"
#include "mgtest.h"

#include <stdlib.h>
#include <string.h>

static char *red(const char *s, int *masked)
{
    size_t n = 0;
    char *r = mg_redact(s, strlen(s), &n, masked);
    CHECK(r != NULL);
    if (r) CHECK_EQ_INT((long long)n, (long long)strlen(r));
    return r;
}

/* s redacted: equal to want, with `count` secrets masked. */
static void expect(const char *s, const char *want, int count)
{
    int masked = -1;
    char *r = red(s, &masked);
    CHECK_STR(r, want);
    CHECK_EQ_INT(masked, count);
    free(r);
}

/* s redacted no longer holds secret (but keeps the rest). */
static void hides(const char *s, const char *secret)
{
    char *r = red(s, NULL);
    if (r && strstr(r, secret)) fprintf(stderr, "still there in: %s\n", r);
    CHECK(r && !strstr(r, secret));
    free(r);
}

static void test_plain_text_unchanged(void)
{
    expect("", "", 0);
    expect("hello, how are you?", "hello, how are you?", 0);
    expect("see https://example.com/docs/v1/chat-completions-reference-2024 ok",
           "see https://example.com/docs/v1/chat-completions-reference-2024 ok", 0);
    expect("a sk-short one", "a sk-short one", 0); /* fewer than 8 after the prefix */
    expect("the token budget is 400", "the token budget is 400", 0);
    expect("{\"role\":\"user\",\"content\":\"hi\"}", "{\"role\":\"user\",\"content\":\"hi\"}", 0);
}

static void test_known_prefixes(void)
{
    /* the gateway's own key: "mg-" + 40 base62 */
    expect("my key is mg-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcd, thanks",
           "my key is mg-AbC*****-abcd, thanks", 1);
    expect("sk-proj-1234567890abcdefghijKLMN", "sk-pro*****-KLMN", 1);
    hides("use sk-ant-api03-aaaaBBBBccccDDDDeeee please", "aaaaBBBBccccDDDD");
    hides("nvapi-0123456789abcdefXYZW", "0123456789abcdef");
    hides("tenant token mgt-abcdefghijklmnopqrstuvwxyz0123456789ABCD", "abcdefghijklmnop");
    hides("AKIAIOSFODNN7EXAMPLE", "IOSFODNN7");
    hides("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnop");
    hides("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc", "eyJzdWIiOiIxIn0");
    /* inside a word it is not a key prefix */
    expect("ask-questions-about-it", "ask-questions-about-it", 0);
}

static void test_schemes(void)
{
    expect("Authorization: Bearer abcdefgh12345678xyz", "Authorization: Bearer ab*****-8xyz", 1);
    hides("curl -H 'authorization: bearer 0123456789qwertyuiop'", "0123456789qwerty");
    hides("Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA");
}

static void test_assignments(void)
{
    expect("password=hunter22 and more", "password=***** and more", 1);
    expect("OPENAI_API_KEY: abcd1234efgh", "OPENAI_API_KEY: *****-efgh", 1);
    /* the JSON of a prompt: quoted, and escaped inside a JSON string */
    hides("{\"api_key\": \"zz9-plural-z-alpha\"}", "plural-z-alpha");
    hides("{\"content\":\"config {\\\"secret\\\": \\\"s3cr3t-value!\\\"}\"}", "s3cr3t-value");
    expect("tokens: 12", "tokens: 12", 0); /* "tokens" is not "...token" */
}

static void test_opaque_runs(void)
{
    hides("here: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 end",
          "884c7d659a2feaa0c55ad015");
    hides("Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4OTBhYmNkZWY= is base64", "YmF6cXV4cXV1eDEy");
    /* a long word without digits is a word */
    expect("pneumonoultramicroscopicsilicovolcanoconiosis",
           "pneumonoultramicroscopicsilicovolcanoconiosis", 0);
}

static void test_several_and_edges(void)
{
    int masked = 0;
    char *r = red("a sk-aaaaaaaaaaaaaaaaaaaaaaaa1 b mg-bbbbbbbbbbbbbbbbbbbbbbbbbbbb2 c", &masked);
    CHECK_EQ_INT(masked, 2);
    CHECK(r && strstr(r, " b ") && strstr(r, " c") && strncmp(r, "a ", 2) == 0);
    free(r);
    /* a secret at the very end, and binary bytes around */
    hides("\x01\xff sk-0123456789abcdefgh", "0123456789abcdef");
    /* a length given, not the NUL */
    size_t n = 0;
    char *p = mg_redact("sk-0123456789abcdefghXXXX", 5, &n, NULL);
    CHECK_STR(p, "sk-01");
    free(p);
}

int main(void)
{
    MG_RUN(test_plain_text_unchanged);
    MG_RUN(test_known_prefixes);
    MG_RUN(test_schemes);
    MG_RUN(test_assignments);
    MG_RUN(test_opaque_runs);
    MG_RUN(test_several_and_edges);
    return mg_test_summary();
}
