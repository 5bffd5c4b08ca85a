/* Unit tests for core/pipeline/snippets.c: the retrieval list's checks, its snippets as
 * marked system messages before the current request, and the join of the kept ones into one
 * unmarked message with the token count's change. */
#include "mgtest.h"
#include "base/json.h"
#include "pipeline/snippets.h"

#include <stdlib.h>
#include <string.h>

static char *printed(const cJSON *v)
{
    mg_buf_t b = {0};
    mg_json_print(v, &b);
    return b.data;
}

static void test_check(void)
{
    static const char *const good[] = {
        "[]", "[\"a\"]", "[{\"text\":\"a\",\"score\":0.5,\"source\":\"s\",\"id\":\"i\"}]",
        "[{\"text\":\"a\",\"score\":null}]", "null"};
    static const char *const bad[] = {"{}",
                                      "[3]",
                                      "[\"\"]",
                                      "[{\"score\":1}]",
                                      "[{\"text\":\"a\",\"score\":\"x\"}]",
                                      "[{\"text\":\"a\",\"id\":7}]",
                                      "[{\"text\":\"a\",\"source\":[]}]"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cJSON *v = cJSON_Parse(good[i]);
        CHECK(mg_snippets_check(v) == NULL);
        cJSON_Delete(v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *v = cJSON_Parse(bad[i]);
        CHECK(mg_snippets_check(v) != NULL);
        cJSON_Delete(v);
    }
    cJSON *many = cJSON_CreateArray();
    for (int i = 0; i <= MG_SNIPPETS_MAX; i++) cJSON_AddItemToArray(many, cJSON_CreateString("s"));
    CHECK(mg_snippets_check(many) != NULL);
    cJSON_Delete(many);
}

static void test_insert_and_join(void)
{
    cJSON *msgs = cJSON_Parse(
        "[{\"role\":\"user\",\"content\":\"old\"},{\"role\":\"user\",\"content\":\"q\"}]");
    cJSON *rag = cJSON_Parse(
        "[\"one\",{\"text\":\"two\",\"score\":0.25,\"source\":\"kb\",\"id\":\"d2\",\"x\":1}]");
    CHECK_EQ_INT(mg_snippets_insert(msgs, 1, rag), 2);
    char *s = printed(msgs);
    CHECK_STR(
        s,
        "[{\"role\":\"user\",\"content\":\"old\"},"
        "{\"role\":\"system\",\"content\":\"one\",\"moongate_snippet\":{\"rank\":1}},"
        "{\"role\":\"system\",\"content\":\"two\",\"moongate_snippet\":{\"rank\":2,\"score\":0.25,"
        "\"source\":\"kb\",\"id\":\"d2\"}},{\"role\":\"user\",\"content\":\"q\"}]");
    free(s);
    CHECK_EQ_INT((int)mg_snippets_join(NULL, msgs), 0);
    s = printed(msgs);
    CHECK_STR(
        s,
        "[{\"role\":\"user\",\"content\":\"old\"},{\"role\":\"system\",\"content\":\"one\\n\\ntwo\"},"
        "{\"role\":\"user\",\"content\":\"q\"}]");
    free(s);
    /* nothing marked: nothing changes */
    CHECK_EQ_INT((int)mg_snippets_join(NULL, msgs), 0);
    CHECK_EQ_INT(cJSON_GetArraySize(msgs), 3);
    /* the snippet last, the question first (a policy may reorder): joined where the first was */
    cJSON *tail = cJSON_Parse("[{\"role\":\"user\",\"content\":\"q\"}]");
    CHECK_EQ_INT(mg_snippets_insert(tail, 1, rag), 2);
    mg_snippets_join(NULL, tail);
    s = printed(tail);
    CHECK_STR(
        s,
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"system\",\"content\":\"one\\n\\ntwo\"}]");
    free(s);
    cJSON_Delete(tail);
    cJSON_Delete(msgs);
    cJSON_Delete(rag);
}

int main(void)
{
    MG_RUN(test_check);
    MG_RUN(test_insert_and_join);
    return mg_test_summary();
}
