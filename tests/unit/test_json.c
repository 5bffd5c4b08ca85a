/* Tests for core/base/json.c: the serializer and the tree-less member scanner. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "mgtest.h"

static char *print(const cJSON *v)
{
    mg_buf_t b = {0};
    if (mg_json_print(v, &b) != 0) return NULL;
    return b.data ? b.data : strdup("");
}

static void check_number(double d, const char *want)
{
    mg_buf_t b = {0};
    CHECK_EQ_INT(mg_json_print_number(d, &b), 0);
    CHECK_STR(b.data, want);
    mg_buf_free(&b);
}

static void test_numbers(void)
{
    check_number(0, "0");
    check_number(42, "42");
    check_number(-7, "-7");
    check_number(1700000000, "1700000000");
    check_number(0.2, "0.2");
    check_number(-1.5, "-1.5");
    check_number(1e300, "1e+300");
    check_number(NAN, "null");
    check_number(INFINITY, "null");
    /* round trip for a value that needs 17 digits */
    mg_buf_t b = {0};
    mg_json_print_number(0.1 + 0.2, &b);
    CHECK(strtod(b.data, NULL) == 0.1 + 0.2);
    mg_buf_free(&b);
}

static void test_strings(void)
{
    mg_buf_t b = {0};
    const char in[] = "a\"b\\c\nd\te\x01"
                      "f\xc3\xa9";
    mg_json_print_string(in, sizeof(in) - 1, &b);
    CHECK_STR(b.data, "\"a\\\"b\\\\c\\nd\\te\\u0001f\xc3\xa9\"");
    mg_buf_free(&b);
}

static void test_tree_round_trip(void)
{
    const char *text =
        "{\"a\":[1,2.5,\"x\",true,false,null,{}],\"b\":{\"c\":[]},\"d\":\"\\u00e9\"}";
    cJSON *j = cJSON_Parse(text);
    char *out = print(j);
    CHECK_STR(out, "{\"a\":[1,2.5,\"x\",true,false,null,{}],\"b\":{\"c\":[]},\"d\":\"\xc3\xa9\"}");
    cJSON *again = cJSON_Parse(out);
    CHECK(cJSON_Compare(j, again, 1));
    cJSON_Delete(again);
    cJSON_Delete(j);
    free(out);
}

/* Integer literals past 2^53 at the top level come back exact; the rest is left alone. */
static void test_keep_big_ints(void)
{
    const char *text = "{\"seed\": 18446744073709551615, \"small\": 42, \"f\": 1e300,"
                       " \"neg\":-9007199254740993, \"in\": {\"x\": 9007199254740993}}";
    cJSON *j = cJSON_Parse(text);
    CHECK_EQ_INT(mg_json_keep_big_ints(j, text, strlen(text)), 0);
    char *out = print(j);
    CHECK_STR(out, "{\"seed\":18446744073709551615,\"small\":42,\"f\":1e+300,"
                   "\"neg\":-9007199254740993,\"in\":{\"x\":9007199254740992}}");
    free(out);
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "small")));
    cJSON_Delete(j);
    /* nothing that large: the tree is untouched (and the text not scanned) */
    const char *plain = "{\"seed\": 7}";
    j = cJSON_Parse(plain);
    CHECK_EQ_INT(mg_json_keep_big_ints(j, plain, strlen(plain)), 0);
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "seed")));
    cJSON_Delete(j);
}

typedef struct {
    int n;
    char keys[8][32];
    char values[8][96];
} members_t;

static int collect(void *ud, const mg_json_member_t *m)
{
    members_t *c = ud;
    if (c->n >= 8) return 7;
    snprintf(c->keys[c->n], 32, "%.*s", (int)m->key_len, m->key);
    snprintf(c->values[c->n], 96, "%.*s", (int)m->value_len, m->value);
    c->n++;
    return 0;
}

static int scan(const char *text, members_t *c)
{
    memset(c, 0, sizeof(*c));
    return mg_json_members(text, strlen(text), collect, c);
}

static void test_members(void)
{
    members_t c;
    CHECK_EQ_INT(scan(" { \"model\" : \"m\", \"n\":12 ,\"o\":{\"x\":[1,{\"y\":\"}\"}]},"
                      "\"s\":\"q\\\"uote\\\\\",\"t\":true,\"u\":null } ",
                      &c),
                 0);
    CHECK_EQ_INT(c.n, 6);
    CHECK_STR(c.keys[0], "model");
    CHECK_STR(c.values[0], "\"m\"");
    CHECK_STR(c.values[1], "12");
    CHECK_STR(c.values[2], "{\"x\":[1,{\"y\":\"}\"}]}");
    CHECK_STR(c.values[3], "\"q\\\"uote\\\\\"");
    CHECK_STR(c.values[4], "true");
    CHECK_STR(c.values[5], "null");
    CHECK_EQ_INT(scan("{}", &c), 0);
    CHECK_EQ_INT(c.n, 0);
}

static void test_members_malformed(void)
{
    members_t c;
    const char *bad[] = {"",         "[1,2]",        "{\"a\":1",    "{\"a\" 1}",
                         "{\"a\":}", "{\"a\":[1,2}", "{\"a\":\"x}", "{\"a\":1} x",
                         "<html>",   "{a:1}",        "{\"a\":1,}",  "{\"a\":{\"b\":1]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = scan(bad[i], &c);
        if (rc != -1) fprintf(stderr, "  accepted: %s\n", bad[i]);
        CHECK_EQ_INT(rc, -1);
    }
}

static void test_members_stop(void)
{
    members_t c;
    memset(&c, 0, sizeof(c));
    c.n = 8; /* the callback stops at once */
    CHECK_EQ_INT(mg_json_members("{\"a\":1}", 7, collect, &c), 7);
}

typedef struct {
    int n;
    char values[8][64];
} elements_t;

static int collect_element(void *ud, const char *v, size_t len)
{
    elements_t *e = ud;
    if (e->n >= 8) return 7;
    snprintf(e->values[e->n++], 64, "%.*s", (int)len, v);
    return 0;
}

static void test_elements(void)
{
    elements_t e = {0};
    const char *text = " [ {\"role\":\"user\",\"x\":[1,\"]\"]} , \"s\",12,true ,[] ] ";
    CHECK_EQ_INT(mg_json_elements(text, strlen(text), collect_element, &e), 0);
    CHECK_EQ_INT(e.n, 5);
    CHECK_STR(e.values[0], "{\"role\":\"user\",\"x\":[1,\"]\"]}");
    CHECK_STR(e.values[1], "\"s\"");
    CHECK_STR(e.values[2], "12");
    CHECK_STR(e.values[3], "true");
    CHECK_STR(e.values[4], "[]");
    memset(&e, 0, sizeof(e));
    CHECK_EQ_INT(mg_json_elements("[]", 2, collect_element, &e), 0);
    CHECK_EQ_INT(e.n, 0);
    const char *bad[] = {"", "{}", "[1,", "[1,]", "[1 2]", "[1] x", "[\"a]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ_INT(mg_json_elements(bad[i], strlen(bad[i]), collect_element, &e), -1);
}

/* mg_json_check must say what cJSON says, and end where cJSON stops. */
static int check_like_cjson(const char *s, size_t n)
{
    const char *cend = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(s, n, &cend, 0);
    size_t end = 0;
    int rc = mg_json_check(s, n, &end);
    int same = (j != NULL) == (rc >= 0) && (!j || end == (size_t)(cend - s));
    if (!same)
        fprintf(stderr, "  differs (cJSON %s, check %d): %.*s\n", j ? "accepts" : "refuses", rc,
                (int)n, s);
    cJSON_Delete(j);
    return same;
}

static void test_check_cases(void)
{
    static const char *const cases[] = {
        "{}",
        "[]",
        "{\"a\":1}",
        " \t\r\n{\"a\":[1,2,{\"b\":null}]} ",
        "\"x\"",
        "12",
        "-0.5e+3",
        "true",
        "false",
        "null",
        "nul",
        "tru",
        "{\"a\":1} garbage",
        "{\"a\":1,}",
        "[1,]",
        "[,1]",
        "{\"a\" 1}",
        "{a:1}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":-.5}",
        "{\"a\":+1}",
        "{\"a\":1e}",
        "{\"a\":1e5}",
        "{\"a\":1.5.5}",
        "{\"a\":--1}",
        "{\"a\":0x10}",
        "{\"a\":-}",
        "{\"a\":\"\\u00e9\"}",
        "{\"a\":\"\\uZZZZ\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\\udc00\"}",
        "{\"a\":\"\\ud83d\\ude00\"}",
        "{\"a\":\"\\ud83d\\u0041\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"}",
        "{\"a\":\"\\u\\\"ab\"}",
        "{\"a\":\"raw\x01\"}",
        "\xEF\xBB\xBF{\"a\":1}",
        "\xEF\xBB\xBF",
        "{\"a\":1}\f",
        "{\"a\":\f1}",
        "{\"a\":1\x0b}",
        "[\"\\\\\"]",
        "[\"\\\\\\\"]",
        "[1 2]",
        "{\"a\":[}",
        "{\"a\":{]}",
        "",
        " ",
        "[",
        "{",
        "{\"a\":1e400}",
        "{\"\\u0000\":1}",
        "[1111111111111111111111111111111111111111111111111111111111111111]",
        "[111111111111111111111111111111111111111111111111111111111111111]",
        "[1e2e3]",
        "[1000000000000000000000000000000000000000000000000000000000000000000000000.5e-3]",
        "[00000000000000000000000000000000000000000000000000000000000000000000000000.5e-3-]",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK(check_like_cjson(cases[i], strlen(cases[i])));
    /* a NUL byte is whitespace to cJSON, and the length is what counts */
    CHECK(check_like_cjson("{\"a\":\0 1}", 9));
    CHECK(check_like_cjson("{\"a\":\"x\0y\"}", 11));
    /* whitespace other than space, tab, CR, LF is accepted but reported */
    CHECK_EQ_INT(mg_json_check("{\"a\":1}", 7, NULL), 0);
    CHECK_EQ_INT(mg_json_check("{\"a\":1\f}", 8, NULL), 1);
    CHECK_EQ_INT(mg_json_check("\xEF\xBB\xBF{\"a\":1}", 10, NULL), 1);
}

static int check_scan(const char *text, members_t *c)
{
    memset(c, 0, sizeof(*c));
    return mg_json_check_members(text, strlen(text), collect, c);
}

static void test_check_members(void)
{
    members_t c, d;
    const char *text = " { \"model\" : \"m\", \"n\":12 ,\"o\":{\"x\":[1,{\"y\":\"}\"}]},"
                       "\"s\":\"q\\\"uote\\\\\",\"t\":true,\"u\":null } ";
    CHECK_EQ_INT(check_scan(text, &c), 0);
    CHECK_EQ_INT(scan(text, &d), 0);
    CHECK_EQ_INT(c.n, 6);
    CHECK(memcmp(&c, &d, sizeof(c)) == 0); /* the same members as mg_json_members */
    CHECK_EQ_INT(check_scan("{}", &c), 0);
    CHECK_EQ_INT(c.n, 0);
    /* refused by cJSON, not an object, garbage after it, unusual whitespace: -1 */
    const char *no[] = {
        "{\"a\":tru}",           "[1]", "\"s\"",       "{\"a\":1} x", "{\"a\":1}\f", "{\"a\":\f1}",
        "\xEF\xBB\xBF{\"a\":1}", "",    "{\"a\":[1,]}"};
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) CHECK_EQ_INT(check_scan(no[i], &c), -1);
    /* a callback's stop comes back */
    memset(&c, 0, sizeof(c));
    c.n = 8;
    CHECK_EQ_INT(mg_json_check_members("{\"a\":1}", 7, collect, &c), 7);
}

static void test_check_nesting(void)
{
    /* cJSON allows 1,000 levels */
    char buf[2100];
    for (int depth = 998; depth <= 1002; depth++) {
        size_t n = 0;
        for (int i = 0; i < depth; i++) buf[n++] = '[';
        for (int i = 0; i < depth; i++) buf[n++] = ']';
        CHECK(check_like_cjson(buf, n));
    }
}

/* Random documents and random damage to them, judged by both. */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

static void gen_value(mg_buf_t *b, int depth)
{
    static const char *const good[] = {
        "null",
        "true",
        "false",
        "0",
        "-1",
        "12.5",
        "1e3",
        "-0.0E-2",
        "01",
        "1.",
        "\"\"",
        "\"ab\"",
        "\"\\n\\t\\\"\"",
        "\"\\u00e9\"",
        "\"\\ud83d\\ude00\"",
        "\"\\uzz00\"",
        "\"a\\\\\"",
        "\"\x01\"",
        /* past 16 bytes: escapes on and across the scan's 16-byte steps */
        "\"0123456789abcde\\\"fghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOP\"",
        "\"0123456789abcdefghijklmnopqrstu\\\\\"",
        "\"0123456789abcd\\u00e9fghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ\"",
    };
    static const char *const bad[] = {".5", "\"\\uD800\"", "\"\\q\"",  "+1",
                                      "1e", "nul",         "\"\\u12\""};
    static const char *const ws[] = {"", " ", "\n", "\t", "\r\n ", "\f", "\x0b"};
    int kind = depth > 4 ? 0 : (int)rnd(4);
    mg_buf_append_str(b, ws[rnd(7)]);
    if (kind <= 1) {
        if (rnd(16)) mg_buf_append_str(b, good[rnd(sizeof(good) / sizeof(good[0]))]);
        else mg_buf_append_str(b, bad[rnd(sizeof(bad) / sizeof(bad[0]))]);
    } else {
        int obj = kind == 3, n = (int)rnd(4);
        mg_buf_append_str(b, obj ? "{" : "[");
        for (int i = 0; i < n; i++) {
            if (i) mg_buf_append_str(b, ",");
            if (obj) {
                mg_buf_append_str(b, ws[rnd(7)]);
                mg_buf_append_str(b, rnd(8) ? "\"k\"" : "\"k\\u0041\"");
                mg_buf_append_str(b, ws[rnd(7)]);
                mg_buf_append_str(b, ":");
            }
            gen_value(b, depth + 1);
        }
        mg_buf_append_str(b, ws[rnd(7)]);
        mg_buf_append_str(b, obj ? "}" : "]");
    }
    mg_buf_append_str(b, ws[rnd(7)]);
}

static void damage(mg_buf_t *b)
{
    static const char bytes[] = "{}[],:\"\\ 0-+.eEtfnu\x01\xEF";
    if (!b->len) return;
    size_t at = rnd((unsigned)b->len);
    switch (rnd(4)) {
    case 0: b->data[at] = bytes[rnd(sizeof(bytes) - 1)]; break; /* replace */
    case 1: b->len = at; break;                                 /* truncate */
    case 2:
        memmove(b->data + at, b->data + at + 1, b->len - at - 1);
        b->len--;
        break; /* drop */
    default:   /* insert */
        mg_buf_append(b, "x", 1);
        memmove(b->data + at + 1, b->data + at, b->len - at - 1);
        b->data[at] = bytes[rnd(sizeof(bytes) - 1)];
    }
}

static void test_check_random(void)
{
    int differ = 0, accepted = 0;
    for (int round = 0; round < 200000 && differ < 10; round++) {
        mg_buf_t b = {0};
        gen_value(&b, 0);
        int hits = (int)rnd(3);
        for (int i = 0; i < hits; i++) damage(&b);
        if (b.len && !check_like_cjson(b.data, b.len)) differ++;
        /* where the one-pass scan accepts, it sees what mg_json_members sees */
        members_t c1, c2;
        memset(&c1, 0, sizeof(c1));
        memset(&c2, 0, sizeof(c2));
        if (b.len && mg_json_check_members(b.data, b.len, collect, &c1) == 0 &&
            (mg_json_members(b.data, b.len, collect, &c2) != 0 ||
             memcmp(&c1, &c2, sizeof(c1)) != 0))
            differ++;
        if (getenv("JSON_STATS") && b.len) accepted += mg_json_check(b.data, b.len, NULL) >= 0;
        mg_buf_free(&b);
    }
    if (getenv("JSON_STATS")) fprintf(stderr, "  accepted %d of 200000\n", accepted);
    CHECK_EQ_INT(differ, 0);
}

/* Numbers as integers: clamped, never the undefined cast of an out-of-range double. */
static void test_int_of_number(void)
{
    cJSON *o =
        cJSON_Parse("{\"a\":2.22222e+49,\"b\":-1e300,\"c\":42.9,\"d\":\"7\",\"e\":3e9,\"f\":-5}");
    CHECK(o != NULL);
    CHECK(mg_json_ll(cJSON_GetObjectItem(o, "a"), -1) == LLONG_MAX);
    CHECK(mg_json_ll(cJSON_GetObjectItem(o, "b"), -1) == LLONG_MIN);
    CHECK(mg_json_ll(cJSON_GetObjectItem(o, "c"), -1) == 42);
    CHECK(mg_json_ll(cJSON_GetObjectItem(o, "d"), -1) == -1);
    CHECK(mg_json_ll(NULL, 9) == 9);
    CHECK_EQ_INT(mg_json_int(cJSON_GetObjectItem(o, "e"), 0), INT_MAX);
    CHECK_EQ_INT(mg_json_int(cJSON_GetObjectItem(o, "b"), 0), INT_MIN);
    CHECK_EQ_INT(mg_json_int(cJSON_GetObjectItem(o, "f"), 0), -5);
    cJSON_Delete(o);
}

/* Items put in the middle of a parsed array (cJSON 1.7.15 refuses InsertItemInArray there). */
static void test_cut_rejoin(void)
{
    cJSON *a = cJSON_Parse("[1,2,3]");
    cJSON *tail = mg_json_cut(a, 1);
    CHECK(tail != NULL);
    cJSON_AddItemToArray(a, cJSON_CreateString("x"));
    mg_json_rejoin(a, tail);
    char *s = cJSON_PrintUnformatted(a);
    CHECK_STR(s, "[1,\"x\",2,3]");
    free(s);
    tail = mg_json_cut(a, 9); /* past the end: nothing moves */
    cJSON_AddItemToArray(a, cJSON_CreateNumber(4));
    mg_json_rejoin(a, tail);
    s = cJSON_PrintUnformatted(a);
    CHECK_STR(s, "[1,\"x\",2,3,4]");
    free(s);
    cJSON_Delete(a);
}

int main(void)
{
    MG_RUN(test_cut_rejoin);
    MG_RUN(test_numbers);
    MG_RUN(test_strings);
    MG_RUN(test_tree_round_trip);
    MG_RUN(test_keep_big_ints);
    MG_RUN(test_members);
    MG_RUN(test_members_malformed);
    MG_RUN(test_members_stop);
    MG_RUN(test_elements);
    MG_RUN(test_check_cases);
    MG_RUN(test_check_members);
    MG_RUN(test_check_nesting);
    MG_RUN(test_check_random);
    MG_RUN(test_int_of_number);
    return mg_test_summary();
}
