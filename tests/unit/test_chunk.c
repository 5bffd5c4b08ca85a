/* Unit tests for core/upstream/chunk.c: the keys of a stream chunk, wherever they fall relative to
 * the scan's 16-byte steps, and the JSON it accepts and refuses (RFC 8259, as JSON.parse). */
#include "upstream/chunk.h"
#include "mgtest.h"

#include <cjson/cJSON.h>
#include <stdint.h>
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
    /* our names as string values, not keys */
    {"\"a\":\"usage\",\"b\":[\"finish_reason\",\"error\"],\"c\":\"\\\"usage\\\":{\"", 0},
    /* nested deeper than a chunk puts them: still counted */
    {"\"x\":{\"y\":[{\"usage\":{}}]}", MG_CHUNK_USAGE},
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
            int got = mg_chunk_scan(s, n);
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

/* Exactly sized copies, so that a read past the end shows under the sanitizer build. */
static int scan_exact(const char *text, size_t n)
{
    char *s = malloc(n ? n : 1);
    memcpy(s, text, n);
    int r = mg_chunk_scan(s, n);
    free(s);
    return r;
}

static int scan_str(const char *text)
{
    return scan_exact(text, strlen(text));
}

/* Every proper prefix of a chunk is refused, whatever it cuts; nothing is read past the end. */
static void test_truncated(void)
{
    const char *full = "{\"id\":\"c\\u00e9\",\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9!\"},"
                       "\"finish_reason\":\"stop\",\"n\":-1.5e+3}],\"ok\":true,\"no\":null} ";
    size_t n = strlen(full);
    int wrong = 0;
    for (size_t k = 0; k < n - 1; k++) /* the last byte is a trailing space */
        if (scan_exact(full, k) != -1 && wrong++ == 0)
            fprintf(stderr, "  prefix %zu accepted\n", k);
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(scan_exact(full, n - 1), MG_CHUNK_FINISH);
    CHECK_EQ_INT(scan_exact(full, n), MG_CHUNK_FINISH);
}

static void test_empty(void)
{
    CHECK_EQ_INT(mg_chunk_scan("", 0), -1);
    CHECK_EQ_INT(scan_str(":"), -1);
    CHECK_EQ_INT(scan_str("\":"), -1);
    CHECK_EQ_INT(scan_str("   "), -1);
    CHECK_EQ_INT(scan_str("{}"), 0);
    CHECK_EQ_INT(scan_str(" \t\r\n{ \t\r\n} \t\r\n"), 0);
}

/* The event and its kind: everything a JSON parser refuses. */
static void test_refused(void)
{
    static const char *bad[] = {
        "{\"id\":\"x\",\"choices\":[...]],,NOT JSON}", /* issue 16, item 8 */
        "{this is not json",
        "[DONE]",
        "[]",
        "\"a string\"",
        "42",
        "null",
        "{\"a\":1,}",
        "{,}",
        "{\"a\" 1}",
        "{\"a\":}",
        "{\"a\":1 \"b\":2}",
        "{\"a\":[1,]}",
        "{\"a\":[,1]}",
        "{\"a\":1}}",
        "{\"a\":1}{}",
        "{\"a\":1} x",
        "{\"a\":{\"b\":1]}",
        "{\"a\":[1}",
        "{a:1}",
        "{'a':1}",
        "{\"a\":'x'}",
        "{\"a\":tru}",
        "{\"a\":True}",
        "{\"a\":nul}",
        "{\"a\":falsy}",
        "{\"a\":NaN}",
        "{\"a\":Infinity}",
        "{\"a\":01}",
        "{\"a\":-}",
        "{\"a\":+1}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":1e}",
        "{\"a\":1e+}",
        "{\"a\":0x10}",
        "{\"a\":--1}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\u12G4\"}",
        "{\"a\":\"\\'\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"new\nline\"}",
        "{\"a\":\"\x01\"}",
        "{\"a\":\"unterminated}",
        "{\"a\":\"ends in a backslash\\",
        "{\"a\":1}\x0b",
        "\xef\xbb\xbf{\"a\":1}",        /* a BOM */
        "{\"a\":\"\x80\"}",             /* a lone continuation byte */
        "{\"a\":\"\xc0\x80\"}",         /* overlong */
        "{\"a\":\"\xc1\xbf\"}",         /* overlong */
        "{\"a\":\"\xe0\x80\x80\"}",     /* overlong */
        "{\"a\":\"\xed\xa0\x80\"}",     /* an encoded surrogate */
        "{\"a\":\"\xf0\x80\x80\x80\"}", /* overlong */
        "{\"a\":\"\xf4\x90\x80\x80\"}", /* past U+10FFFF */
        "{\"a\":\"\xf5\x80\x80\x80\"}",
        "{\"a\":\"\xff\"}",
        "{\"a\":\"\xc3\"}", /* cut: the quote is no continuation */
        "{\"a\":\"\xe2\x82\"}",
        "{\"a\":\"\xe2\x28\xa1\"}",
        "{\"\xc3\":1}",      /* in a key too */
        "{\"a\":1}\xc3\xa9", /* outside strings */
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (scan_str(bad[i]) != -1 && wrong++ >= 0) fprintf(stderr, "  accepted: %s\n", bad[i]);
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(scan_exact("{\"a\":\"\0\"}", 8), -1); /* a NUL in a string */
    CHECK_EQ_INT(scan_exact("{\"a\":1}\0", 8), -1);
}

static void test_accepted(void)
{
    static const char *good[] = {
        "{\"a\":\"\"}",
        "{\"\":0}",
        "{\"a\":-0}",
        "{\"a\":0.5}",
        "{\"a\":-12.25e-10}",
        "{\"a\":1E5}",
        "{\"a\":1e+05}",
        "{\"a\":123456789012345678901234567890}",
        "{\"a\":[true,false,null,{},[],\"\",0]}",
        "{\"a\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\uD83D\\uDE00\\ud800\"}", /* lone surrogate
                                                                                 escape */
        "{\"a\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbf \xf4\x8f\xbf\xbf \xed\x9f\xbf\"}",
        "{\"a\":\"\xe2\x80\xa8\"}", /* U+2028 raw: JSON, not JavaScript source */
        "{\"a\":\"\x7f\"}",         /* DEL is not a control character to JSON */
        "{ \"a\" : [ 1 , 2 ] , \"b\" :\t{ } }",
        "{\"a\":1,\"a\":2}", /* duplicate keys: JSON.parse keeps the last */
    };
    int wrong = 0;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (scan_str(good[i]) != 0 && wrong++ >= 0) fprintf(stderr, "  refused: %s\n", good[i]);
    CHECK_EQ_INT(wrong, 0);
}

/* Non-ASCII, escapes and control bytes at every offset of the 16-byte steps. */
static void test_string_bytes_at_every_offset(void)
{
    static const struct {
        const char *piece;
        int ok;
    } pieces[] = {
        {"\xc3\xa9", 1},     {"\xe2\x82\xac", 1}, {"\xf0\x9f\x98\x80", 1},
        {"\\u00e9", 1},      {"\\n", 1},          {"\xc3", 0},
        {"\xed\xa0\x80", 0}, {"\x1f", 0},         {"\\q", 0},
        {"\\u00", 0},        {"\"", 0},
    };
    int wrong = 0;
    char buf[128];
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        for (int pad = 0; pad < 40; pad++) {
            int n = snprintf(buf, sizeof(buf), "{\"k\":\"%*s%s tail\"}", pad, "", pieces[i].piece);
            int want = pieces[i].ok ? 0 : -1;
            if (scan_exact(buf, (size_t)n) != want && wrong++ == 0)
                fprintf(stderr, "  piece %zu pad %d: want %d\n", i, pad, want);
            /* the piece at the very end of a string that ends the text */
            n = snprintf(buf, sizeof(buf), "{\"k\":\"%*s%s\"}", pad, "", pieces[i].piece);
            if (scan_exact(buf, (size_t)n) != want && wrong++ == 0)
                fprintf(stderr, "  piece %zu pad %d at the end: want %d\n", i, pad, want);
        }
    }
    CHECK_EQ_INT(wrong, 0);
}

static void test_depth(void)
{
    size_t cap = 4 * MG_CHUNK_MAX_DEPTH + 16;
    char *s = malloc(cap);
    for (int extra = -1; extra <= 1; extra++) {
        /* the object plus `arrays` nested arrays */
        int arrays = MG_CHUNK_MAX_DEPTH - 1 + extra;
        size_t n = 0;
        n += (size_t)snprintf(s + n, cap - n, "{\"a\":");
        for (int i = 0; i < arrays; i++) s[n++] = '[';
        for (int i = 0; i < arrays; i++) s[n++] = ']';
        s[n++] = '}';
        CHECK_EQ_INT(scan_exact(s, n), extra <= 0 ? 0 : -1);
    }
    /* objects and arrays alternating across the 64-level words of the nesting bits */
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(s + n, cap - n, i % 3 ? "{\"k\":" : "{\"k\":[");
    n += (size_t)snprintf(s + n, cap - n, "1");
    for (int i = 199; i >= 0; i--) n += (size_t)snprintf(s + n, cap - n, i % 3 ? "}" : "]}");
    CHECK_EQ_INT(scan_exact(s, n), 0);
    s[n - 1] = ']';
    CHECK_EQ_INT(scan_exact(s, n), -1);
    free(s);
}

/* The flags a tree gives: keys anywhere, with the value kinds of chunk.h. */
static int tree_flags(const cJSON *v)
{
    int f = 0;
    for (const cJSON *c = v ? v->child : NULL; c; c = c->next) {
        if (c->string && strcmp(c->string, "finish_reason") == 0 && cJSON_IsString(c))
            f |= MG_CHUNK_FINISH;
        if (c->string && strcmp(c->string, "usage") == 0 && cJSON_IsObject(c)) f |= MG_CHUNK_USAGE;
        if (c->string && strcmp(c->string, "error") == 0 &&
            (cJSON_IsObject(c) || cJSON_IsString(c)))
            f |= MG_CHUNK_ERROR;
        f |= tree_flags(c);
    }
    return f;
}

/* Random damage to real chunks (a fixed seed, bounded): whatever the scan accepts, cJSON (more
 * lenient) accepts too, and the flags are the tree's. */
static void test_mutations_against_cjson(void)
{
    static const char *seeds[] = {
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" caf\xc3\xa9\\n\"},"
        "\"logprobs\":null,\"finish_reason\":null}]}",
        "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":42,\"completion_tokens\":17,\"total_tokens\":59}}",
        "{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":-1.5e3}}",
    };
    static const char alphabet[] = "{}[]\":,\\ 0-1.eE+tfnul\"a\xc3\xa9\x80\x1f";
    uint32_t rng = 12345;
    int accepted = 0, wrong = 0;
    char buf[512];
    for (int iter = 0; iter < 20000; iter++) {
        const char *seed = seeds[iter % 3];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int edits = 1 + (int)((rng = rng * 1103515245u + 12345u) >> 16) % 3;
        for (int e = 0; e < edits; e++) {
            rng = rng * 1103515245u + 12345u;
            size_t at = (rng >> 8) % n;
            char c = alphabet[(rng >> 20) % (sizeof(alphabet) - 1)];
            int kind = (int)(rng >> 28) % 3;
            if (kind == 0) {
                buf[at] = c; /* replace */
            } else if (kind == 1 && n + 1 < sizeof(buf)) {
                memmove(buf + at + 1, buf + at, n - at); /* insert */
                buf[at] = c;
                n++;
            } else if (n > 1) {
                memmove(buf + at, buf + at + 1, n - at - 1); /* delete */
                n--;
            }
        }
        int got = scan_exact(buf, n);
        if (got < 0) continue;
        accepted++;
        cJSON *t = cJSON_ParseWithLength(buf, n);
        if ((!cJSON_IsObject(t) || tree_flags(t) != got) && wrong++ == 0)
            fprintf(stderr, "  accepted %.*s: flags %d, tree %d\n", (int)n, buf, got,
                    t ? tree_flags(t) : -1);
        cJSON_Delete(t);
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK(accepted > 100); /* the damage kept enough valid texts to mean something */
}

/* ---- the memo ------------------------------------------------------------------------ */

/* A stream's chunks: the role chunk, content chunks, the finish chunk, the usage chunk. */
static const char *stream[] = {
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,"
    "\"finish_reason\":null}],\"obfuscation\":\"aB3\"}",
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,"
    "\"finish_reason\":null}],\"obfuscation\":\"x\"}",
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" w\xc3\xb6rld \\\"q\\\" \\u00e9\\n\"},"
    "\"logprobs\":null,\"finish_reason\":null}],\"obfuscation\":\"Zz9_-\"}",
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"logprobs\":null,"
    "\"finish_reason\":null}],\"obfuscation\":\"\"}",
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
    "\"obfuscation\":\"q\"}",
    "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
    "\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}",
};
#define N_STREAM (sizeof(stream) / sizeof(stream[0]))

static int memo_scan(mg_chunk_memo_t *m, const char *text, size_t n)
{
    char *c = malloc(n ? n : 1); /* exactly sized: a read past it shows under ASan */
    memcpy(c, text, n);
    int r = mg_chunk_scan_memo(m, c, n);
    free(c);
    return r;
}

static void test_memo_stream(void)
{
    mg_chunk_memo_t m = {0};
    static const int want[N_STREAM] = {0, 0, 0, 0, MG_CHUNK_FINISH, MG_CHUNK_USAGE};
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < N_STREAM; i++)
            CHECK_EQ_INT(memo_scan(&m, stream[i], strlen(stream[i])), want[i]);
    /* content chunks after the first are checked against it: the template stays */
    mg_chunk_memo_free(&m);
    CHECK_EQ_INT(memo_scan(&m, stream[1], strlen(stream[1])), 0);
    CHECK(m.len == strlen(stream[1]) && memcmp(m.text, stream[1], m.len) == 0);
    CHECK_EQ_INT(memo_scan(&m, stream[2], strlen(stream[2])), 0);
    CHECK_EQ_INT(memo_scan(&m, stream[3], strlen(stream[3])), 0);
    CHECK(m.len == strlen(stream[1]) && memcmp(m.text, stream[1], m.len) == 0);
    /* strings swapped for broken ones are refused without a full scan too */
    const char *bad[] = {
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\x01\"},\"logprobs\":null,"
        "\"finish_reason\":null}],\"obfuscation\":\"x\"}",
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\x\"},\"logprobs\":null,"
        "\"finish_reason\":null}],\"obfuscation\":\"x\"}",
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xed\xa0\x80\"},\"logprobs\":null,"
        "\"finish_reason\":null}],\"obfuscation\":\"x\"}",
        /* a value that closes early and smuggles members in: a structure the template lacks */
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\",\"usage\":{\"x\":1},\"b\":\"\"},"
        "\"logprobs\":null,\"finish_reason\":null}],\"obfuscation\":\"x\"",
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,"
        "\"finish_reason\":null}],\"obfuscation\":\"x\"}}",
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,"
        "\"finish_reason\":null}],\"obfuscation\":\"x",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ_INT(memo_scan(&m, bad[i], strlen(bad[i])), mg_chunk_scan(bad[i], strlen(bad[i])));
    CHECK_EQ_INT(memo_scan(&m, bad[0], strlen(bad[0])), -1);
    /* the smuggled members, valid JSON: found by the full scan, with the usage flag */
    const char *smuggled =
        "{\"id\":\"c-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","
        "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\",\"usage\":{\"x\":1},\"b\":\"\"},"
        "\"logprobs\":null,\"finish_reason\":null}],\"obfuscation\":\"x\"}";
    CHECK_EQ_INT(memo_scan(&m, smuggled, strlen(smuggled)), MG_CHUNK_USAGE);
    mg_chunk_memo_free(&m);
    CHECK(m.text == NULL && m.len == 0);
}

/* Random damage to a stream's chunks, scanned in order with one memo: always the full scan's
 * answer (fixed seed, bounded). */
static void test_memo_against_full(void)
{
    static const char alphabet[] = "{}[]\":,\\ 0-1.eE+tfnul\"a\xc3\xa9\x80\x1f";
    uint32_t rng = 777;
    int wrong = 0, valid = 0;
    char buf[600];
    mg_chunk_memo_t m = {0};
    for (int iter = 0; iter < 30000; iter++) {
        const char *seed = stream[iter % N_STREAM];
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        rng = rng * 1103515245u + 12345u;
        int edits = (int)(rng >> 16) % 4; /* 0: the chunk as it is */
        for (int e = 0; e < edits; e++) {
            rng = rng * 1103515245u + 12345u;
            size_t at = (rng >> 8) % n;
            char c = alphabet[(rng >> 20) % (sizeof(alphabet) - 1)];
            int kind = (int)(rng >> 28) % 3;
            if (kind == 0) {
                buf[at] = c;
            } else if (kind == 1 && n + 1 < sizeof(buf)) {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
            } else if (n > 1) {
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
            }
        }
        int full = scan_exact(buf, n);
        int got = memo_scan(&m, buf, n);
        valid += full >= 0;
        if (got != full && wrong++ == 0)
            fprintf(stderr, "  memo %d, full %d: %.*s\n", got, full, (int)n, buf);
    }
    mg_chunk_memo_free(&m);
    CHECK_EQ_INT(wrong, 0);
    CHECK(valid > 5000);
}

/* A chunk matched against the template: matched, and every value string's quotes where the
 * chunk has them (the swapped ones and those after them shifted); a chunk of another
 * structure makes a new template (the generation moves). */
static void test_memo_string_places(void)
{
    mg_chunk_memo_t m = {0};
    m.places = 1;
    const char *t = "{\"id\":\"a\",\"n\":1,\"choices\":[{\"delta\":{\"content\":\"xy\"}}],"
                    "\"tail\":\"z\"}";
    const char *c = "{\"id\":\"abcd\",\"n\":1,\"choices\":[{\"delta\":{\"content\":\"\\\"q\"}}],"
                    "\"tail\":\"z\"}";
    CHECK_EQ_INT(mg_chunk_scan_memo(&m, t, strlen(t)), 0);
    CHECK(m.matched);
    CHECK_EQ_INT(m.n_strings, 3);
    unsigned gen = m.generation;
    CHECK_EQ_INT(mg_chunk_scan_memo(&m, c, strlen(c)), 0);
    CHECK(m.matched && m.generation == gen);
    static const char *const want[] = {"\"abcd\"", "\"\\\"q\"", "\"z\""};
    for (int i = 0; i < 3; i++) {
        size_t len = m.at_close[i] - m.at_open[i] + 1;
        CHECK(len == strlen(want[i]) && memcmp(c + m.at_open[i], want[i], len) == 0);
    }
    const char *other = "{\"id\":\"a\",\"choices\":[]}";
    CHECK_EQ_INT(mg_chunk_scan_memo(&m, other, strlen(other)), 0);
    CHECK(m.matched && m.generation == gen + 1);
    CHECK(m.at_open[0] == 6 && m.at_close[0] == 8);
    CHECK_EQ_INT(mg_chunk_scan_memo(&m, "{", 1), -1);
    CHECK(!m.matched);
    mg_chunk_memo_free(&m);
}

int main(void)
{
    MG_RUN(test_cases_at_every_offset);
    MG_RUN(test_truncated);
    MG_RUN(test_empty);
    MG_RUN(test_refused);
    MG_RUN(test_accepted);
    MG_RUN(test_string_bytes_at_every_offset);
    MG_RUN(test_depth);
    MG_RUN(test_mutations_against_cjson);
    MG_RUN(test_memo_stream);
    MG_RUN(test_memo_against_full);
    MG_RUN(test_memo_string_places);
    return mg_test_summary();
}
