/* Tests for core/json.c: the serializer and the tree-less member scanner. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
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
    const char in[] = "a\"b\\c\nd\te\x01" "f\xc3\xa9";
    mg_json_print_string(in, sizeof(in) - 1, &b);
    CHECK_STR(b.data, "\"a\\\"b\\\\c\\nd\\te\\u0001f\xc3\xa9\"");
    mg_buf_free(&b);
}

static void test_tree_round_trip(void)
{
    const char *text = "{\"a\":[1,2.5,\"x\",true,false,null,{}],\"b\":{\"c\":[]},\"d\":\"\\u00e9\"}";
    cJSON *j = cJSON_Parse(text);
    char *out = print(j);
    CHECK_STR(out, "{\"a\":[1,2.5,\"x\",true,false,null,{}],\"b\":{\"c\":[]},\"d\":\"\xc3\xa9\"}");
    cJSON *again = cJSON_Parse(out);
    CHECK(cJSON_Compare(j, again, 1));
    cJSON_Delete(again);
    cJSON_Delete(j);
    free(out);
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
    const char *bad[] = {"",          "[1,2]",         "{\"a\":1",       "{\"a\" 1}",
                         "{\"a\":}",  "{\"a\":[1,2}",  "{\"a\":\"x}",    "{\"a\":1} x",
                         "<html>",    "{a:1}",         "{\"a\":1,}",     "{\"a\":{\"b\":1]}"};
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

int main(void)
{
    MG_RUN(test_numbers);
    MG_RUN(test_strings);
    MG_RUN(test_tree_round_trip);
    MG_RUN(test_members);
    MG_RUN(test_members_malformed);
    MG_RUN(test_members_stop);
    return mg_test_summary();
}
