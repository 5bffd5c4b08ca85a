/* The tokenizer (core/token/): tiktoken's public test vectors, the pieces of the
 * pre-tokenizer, UTF-8 repair, the long-piece merge against the slow reference, the rank
 * parser's refusals, and loading (checksums, the data directory). Equality with the npm
 * tiktoken package on a large corpus is tests/token/tiktoken.test.mjs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mgtest.h"
#include "../token/ref.h"
#include "token/bpe.h"
#include "token/encoding.h"
#include "token/pretok.h"
#include "token/ranks.h"
#include "token/tokenize.h"
#include "token/utf8.h"

static mg_encoding_t *enc[MG_ENC_COUNT];

static int ids_are(int e, const char *text, unsigned flags, const uint32_t *want, size_t n)
{
    mg_token_ids_t got = {0};
    int ok = mg_tokenize_encode(enc[e], text, strlen(text), flags, &got) == 0 && got.n == n &&
             memcmp(got.ids, want, n * sizeof(*want)) == 0 &&
             mg_tokenize_count(enc[e], text, strlen(text), flags) == (long)n;
    if (!ok) {
        fprintf(stderr, "  %s %s:", enc[e]->name, text);
        for (size_t i = 0; i < got.n; i++) fprintf(stderr, " %u", got.ids[i]);
        fprintf(stderr, "\n");
    }
    mg_token_ids_free(&got);
    return ok;
}
#define IDS(e, text, flags, ...)                                                                   \
    do {                                                                                           \
        const uint32_t want_[] = {__VA_ARGS__};                                                    \
        CHECK(ids_are(e, text, flags, want_, sizeof(want_) / sizeof(want_[0])));                   \
    } while (0)

/* Decode ids back to bytes (tests only): a malloc'd buffer of *len bytes. */
static uint8_t *decode(int e, const mg_token_ids_t *ids, size_t *len)
{
    size_t cap = 16, n = 0;
    uint8_t *out = malloc(cap);
    for (size_t i = 0; i < ids->n; i++) {
        size_t l = 0;
        const uint8_t *b = mg_ranks_bytes(enc[e]->ranks, ids->ids[i], &l);
        for (size_t k = 0; b == NULL && k < enc[e]->n_special; k++) {
            if (enc[e]->special[k].id == ids->ids[i]) {
                b = (const uint8_t *)enc[e]->special[k].text;
                l = enc[e]->special[k].len;
            }
        }
        if (!b) break;
        while (n + l > cap) out = realloc(out, cap *= 2);
        memcpy(out + n, b, l);
        n += l;
    }
    *len = n;
    return out;
}

static int roundtrips(int e, const char *text)
{
    mg_token_ids_t ids = {0};
    size_t len = 0;
    mg_tokenize_encode(enc[e], text, strlen(text), MG_TOKENIZE_SPECIAL, &ids);
    uint8_t *back = decode(e, &ids, &len);
    int ok = len == strlen(text) && memcmp(back, text, len) == 0;
    free(back);
    mg_token_ids_free(&ids);
    return ok;
}

/* tiktoken's own tests (github.com/openai/tiktoken, tests/test_encoding.py and
 * tests/test_simple_public.py; MIT License, Copyright (c) 2022 OpenAI, Shantanu Jain): the
 * vectors for the encodings this tokenizer knows, as they stand there. */
static void test_tiktoken_vectors(void)
{
    const int c = MG_ENC_CL100K, o = MG_ENC_O200K;
    /* test_simple */
    IDS(c, "hello world", 0, 15339, 1917);
    IDS(c, "hello <|endoftext|>", MG_TOKENIZE_SPECIAL, 15339, 220, 100257);
    /* test_simple_regex */
    IDS(c, "rer", 0, 38149);
    IDS(c, "'rer", 0, 2351, 81);
    IDS(c, "today\n ", 0, 31213, 198, 220);
    IDS(c, "today\n \n", 0, 31213, 27907);
    IDS(c, "today\n  \n", 0, 31213, 14211);
    /* test_basic_encode */
    IDS(c,
        " \xc2\x85"
        "0",
        0, 220, 126, 227, 15);
    /* test_encode_empty */
    CHECK_EQ_INT(mg_tokenize_count(enc[c], "", 0, 0), 0);
    /* test_encode_surrogate_pairs: a lone surrogate is replaced (here: its CESU bytes are
     * ill-formed, each maximal part becomes U+FFFD) */
    IDS(c, "\xf0\x9f\x91\x8d", 0, 9468, 239, 235);
    mg_token_ids_t a = {0}, b = {0};
    mg_tokenize_encode(enc[c], "\xef\xbf\xbd", 3, 0, &a);
    mg_tokenize_encode(enc[c], "\xed", 1, 0, &b);
    CHECK(a.n == 1 && b.n == 1 && a.ids[0] == b.ids[0]);
    mg_token_ids_free(&a);
    mg_token_ids_free(&b);
    /* test_catastrophically_repetitive and test_basic_roundtrip, both encodings */
    const char *rep[] = {"^", "0", "a", "'s", " ", "\n"};
    for (int e = 0; e < MG_ENC_COUNT; e++) {
        for (size_t i = 0; i < 6; i++) {
            size_t l = strlen(rep[i]);
            char *big = malloc(10000 * l + 3);
            big[0] = ' ';
            for (size_t k = 0; k < 10000; k++) memcpy(big + 1 + k * l, rep[i], l);
            big[1 + 10000 * l] = '\0';
            CHECK(roundtrips(e, big + 1));
            CHECK(roundtrips(e, big));
            strcat(big, "\n");
            CHECK(roundtrips(e, big));
            free(big);
        }
        const char *vals[] = {"hello",   "hello ",   "hello  ",     " hello",
                              " hello ", " hello  ", "hello world", "请考试我的软件！12345"};
        for (size_t i = 0; i < 8; i++) CHECK(roundtrips(e, vals[i]));
    }
    /* test_special_token: recognised only when allowed */
    const char *text = "<|endoftext|> hello <|fim_prefix|> there <|fim_middle|>";
    mg_token_ids_t plain = {0}, all = {0};
    mg_tokenize_encode(enc[c], text, strlen(text), 0, &plain);
    mg_tokenize_encode(enc[c], text, strlen(text), MG_TOKENIZE_SPECIAL, &all);
    int eot = 0, fip = 0, fim = 0;
    for (size_t i = 0; i < plain.n; i++) eot |= plain.ids[i] >= 100257;
    CHECK(!eot);
    for (size_t i = 0; i < all.n; i++) {
        eot |= all.ids[i] == 100257;
        fip |= all.ids[i] == 100258;
        fim |= all.ids[i] == 100259;
    }
    CHECK(eot && fip && fim);
    mg_token_ids_free(&plain);
    mg_token_ids_free(&all);
    /* test_large_repeated (o200k_base): a million x's encode */
    char *x = malloc(1000000);
    memset(x, 'x', 1000000);
    mg_token_ids_t big = {0};
    CHECK(mg_tokenize_encode(enc[o], x, 1000000, 0, &big) == 0 && big.n > 0);
    CHECK_EQ_INT(mg_tokenize_count(enc[o], x, 1000000, 0), (long)big.n);
    mg_token_ids_free(&big);
    free(x);
}

/* The pieces a text splits into, as "|"-joined text. */
static void pieces(mg_pretok_t p, const char *s, char *out)
{
    size_t n = strlen(s);
    out[0] = '\0';
    for (size_t i = 0; i < n;) {
        size_t e = mg_pretok_next(p, (const uint8_t *)s, n, i);
        CHECK(e == ref_next(p, (const uint8_t *)s, n, i));
        if (i) strcat(out, "|");
        strncat(out, s + i, e - i);
        i = e;
    }
}

static void test_pretok_pieces(void)
{
    char out[512];
    pieces(MG_PRETOK_CL100K, "Hello world, it's 12345 ok!!\n\n  x  ", out);
    CHECK_STR(out, "Hello| world|,| it|'s| |123|45| ok|!!\n\n| | x|  ");
    pieces(MG_PRETOK_O200K, "Hello world, it's 12345 ok!!\n\n  x  ", out);
    CHECK_STR(out, "Hello| world|,| it's| |123|45| ok|!!\n\n| | x|  ");
    /* o200k: case runs, marks, slashes */
    pieces(MG_PRETOK_O200K, "HTTPServer getHTTP CamelCase a//b\n", out);
    CHECK_STR(out, "HTTPServer| get|HTTP| Camel|Case| a|//|b|\n");
    pieces(MG_PRETOK_O200K,
           "\xcc\x81"
           "abc \xcc\x81",
           out); /* U+0301 before letters, alone */
    CHECK_STR(out, "\xcc\x81"
                   "abc| \xcc\x81");
    /* contractions: cl100k cuts them off, o200k keeps them on the word, any case, long s */
    pieces(MG_PRETOK_CL100K, "DON'T we'LL it'\xc5\xbf", out);
    CHECK_STR(out, "DON|'T| we|'LL| it|'\xc5\xbf");
    pieces(MG_PRETOK_O200K, "DON'T we'LL it'\xc5\xbf", out);
    CHECK_STR(out, "DON'T| we'LL| it'\xc5\xbf");
    /* whitespace: \s*[\r\n]+ then \s+(?!\S) */
    pieces(MG_PRETOK_CL100K, "a \t\n \n  b   ", out);
    CHECK_STR(out, "a| \t\n \n| | b|   ");
}

static void test_utf8_repair(void)
{
    /* each maximal subpart becomes one U+FFFD (what TextDecoder does) */
    struct {
        const char *in, *out;
    } cases[] = {
        {"a\x80"
         "b",
         "a\xef\xbf\xbd"
         "b"},
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xf0\x9f\x91", "\xef\xbf\xbd"},                         /* truncated: one */
        {"\xf0\x9f\x91"
         "x",
         "\xef\xbf\xbd"
         "x"},
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xc3\xa9\xff", "\xc3\xa9\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const uint8_t *in = (const uint8_t *)cases[i].in;
        size_t n = strlen(cases[i].in);
        uint8_t out[64];
        CHECK(mg_utf8_valid_prefix(in, n) < n);
        CHECK_EQ_INT(mg_utf8_repaired_len(in, n), strlen(cases[i].out));
        size_t m = mg_utf8_repair(in, n, out);
        CHECK(m == strlen(cases[i].out) && memcmp(out, cases[i].out, m) == 0);
    }
    CHECK_EQ_INT(mg_utf8_valid_prefix((const uint8_t *)"h\xc3\xa9llo \xf0\x9f\x91\x8d", 11), 11);
    /* the tokenizer counts the repaired text */
    CHECK_EQ_INT(mg_tokenize_count(enc[MG_ENC_O200K], "ab \x80 cd", 7, 0),
                 mg_tokenize_count(enc[MG_ENC_O200K], "ab \xef\xbf\xbd cd", 9, 0));
}

/* Long pieces (the heap merge) and short ones (the scans) against the reference, on texts
 * without spaces made of random vocabulary bytes. */
static void test_bpe_against_reference(void)
{
    unsigned seed = 7;
    mg_bpe_scratch_t sc = {0};
    for (int e = 0; e < MG_ENC_COUNT; e++) {
        const mg_ranks_t *t = enc[e]->ranks;
        for (int round = 0; round < 300; round++) {
            uint8_t s[2048];
            size_t n = 0, want = 1 + (size_t)(rand_r(&seed) % (round < 150 ? 120 : 2000));
            while (n < want) {
                size_t l = 0;
                const uint8_t *b = mg_ranks_bytes(t, (uint32_t)rand_r(&seed) % t->n_ranks, &l);
                if (!b || n + l > sizeof(s)) break;
                memcpy(s + n, b, l);
                n += l;
            }
            if (n == 0) continue;
            uint32_t *got = malloc(n * sizeof(*got)), *ref = malloc(n * sizeof(*ref));
            long k = mg_bpe_encode(t, s, n, got, &sc);
            size_t r = ref_bpe(t, s, n, ref);
            CHECK(k == (long)r && memcmp(got, ref, r * sizeof(*ref)) == 0);
            CHECK(mg_bpe_count(t, s, n, &sc) == k);
            free(got);
            free(ref);
        }
    }
    mg_bpe_scratch_free(&sc);
}

static void test_ranks_parse_refusals(void)
{
    char err[256];
    mg_ranks_t *t = NULL;
    CHECK(mg_ranks_parse("", 0, &t, err, sizeof(err)) < 0 && t == NULL);
    const char *bad_line = "YQ== 0\nnot-a-line\n";
    CHECK(mg_ranks_parse(bad_line, strlen(bad_line), &t, err, sizeof(err)) < 0);
    CHECK(strstr(err, "line 2") != NULL);
    const char *twice = "YQ== 0\nYQ== 1\n";
    CHECK(mg_ranks_parse(twice, strlen(twice), &t, err, sizeof(err)) < 0);
    CHECK(strstr(err, "same bytes") != NULL);
    const char *few = "YQ== 0\nYg== 1\n"; /* not every byte is a token */
    CHECK(mg_ranks_parse(few, strlen(few), &t, err, sizeof(err)) < 0);
    CHECK(strstr(err, "is no token") != NULL);
}

static void test_load_checks(void)
{
    char err[512], dir[4096];
    mg_encoding_t *e = NULL;
    CHECK_EQ_INT(mg_encoding_lookup("o200k_base"), MG_ENC_O200K);
    CHECK_EQ_INT(mg_encoding_lookup("cl100k_base"), MG_ENC_CL100K);
    CHECK_EQ_INT(mg_encoding_lookup("p50k_base"), -1);
    CHECK(mg_encoding_load(MG_ENC_O200K, "/nonexistent", &e, err, sizeof(err)) < 0 && !e);
    CHECK(strstr(err, "o200k_base.tiktoken") != NULL);
    /* a rank file that is not the one pinned is refused */
    char tmp[] = "/tmp/mg-token-XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(dir, sizeof(dir), "%s/cl100k_base.tiktoken", tmp);
    FILE *f = fopen(dir, "w");
    fputs("YQ== 0\n", f);
    fclose(f);
    CHECK(mg_encoding_load(MG_ENC_CL100K, tmp, &e, err, sizeof(err)) < 0 && !e);
    CHECK(strstr(err, "SHA-256") != NULL);
    remove(dir);
    rmdir(tmp);
    /* the configured directory wins; the digests are scripts/tokenizer.sha256's */
    CHECK(mg_encoding_data_dir("/x/y", dir, sizeof(dir)) == 0 && strcmp(dir, "/x/y") == 0);
    f = fopen(MG_SOURCE_DIR "/scripts/tokenizer.sha256", "r");
    char line[256];
    int seen = 0;
    while (f && fgets(line, sizeof(line), f)) {
        for (int i = 0; i < MG_ENC_COUNT; i++) {
            if (strstr(line, mg_encoding_file(i))) {
                CHECK(strncmp(line, mg_encoding_sha256(i), 64) == 0);
                seen++;
            }
        }
    }
    if (f) fclose(f);
    CHECK_EQ_INT(seen, MG_ENC_COUNT);
}

/* The whole tokenizer against the reference on mixed texts, specials allowed and not. */
static void test_tokenize_against_reference(void)
{
    const char *texts[] = {
        "The gateway's numbers add up.\n\n  Indented\tcode();  \r\n",
        "人工智能 网关。日本語のテキスト、한국어 문장 مرحبا بالعالم",
        "👨\xe2\x80\x8d👩\xe2\x80\x8d👧 🇯🇵 a\xcc\x81 HTTPServer x//y ½ ١٢٣٤ 1234567",
        "<|endoftext|>hi<|fim_prefix|> <|endofprompt|>\xff\xfe'S 'll",
    };
    uint32_t ref[1024];
    for (int e = 0; e < MG_ENC_COUNT; e++) {
        for (size_t i = 0; i < 4; i++) {
            for (int sp = 0; sp < 2; sp++) {
                mg_token_ids_t got = {0};
                size_t n = strlen(texts[i]);
                mg_tokenize_encode(enc[e], texts[i], n, sp ? MG_TOKENIZE_SPECIAL : 0, &got);
                size_t r = ref_tokenize(enc[e], (const uint8_t *)texts[i], n, sp, ref);
                CHECK(got.n == r && memcmp(got.ids, ref, r * sizeof(*ref)) == 0);
                mg_token_ids_free(&got);
            }
        }
    }
}

int main(void)
{
    char dir[4096], err[512];
    mg_encoding_data_dir(NULL, dir, sizeof(dir));
    for (int i = 0; i < MG_ENC_COUNT; i++) {
        if (mg_encoding_load(i, dir, &enc[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "test_token: %s\n", err);
            return 1;
        }
    }
    MG_RUN(test_tiktoken_vectors);
    MG_RUN(test_pretok_pieces);
    MG_RUN(test_utf8_repair);
    MG_RUN(test_bpe_against_reference);
    MG_RUN(test_ranks_parse_refusals);
    MG_RUN(test_load_checks);
    MG_RUN(test_tokenize_against_reference);
    for (int i = 0; i < MG_ENC_COUNT; i++) mg_encoding_free(enc[i]);
    return mg_test_summary();
}
