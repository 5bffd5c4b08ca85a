/* Unit tests for core/pipeline/notes.c: the checks of identity_notes / output_constraints and
 * their insertion as one plain system message at a given place. */
#include "mgtest.h"
#include "base/json.h"
#include "pipeline/notes.h"

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
    static const char *const good[] = {"\"a\"", "[]", "[\"a\",\"b\"]", "null"};
    static const char *const bad[] = {"\"\"", "3", "{}", "[\"a\",3]", "[\"\"]", "[null]"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        cJSON *v = cJSON_Parse(good[i]);
        CHECK(mg_notes_check(v, "identity_notes") == NULL);
        cJSON_Delete(v);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *v = cJSON_Parse(bad[i]);
        CHECK(mg_notes_check(v, "identity_notes") != NULL);
        cJSON_Delete(v);
    }
    cJSON *many = cJSON_CreateArray();
    for (int i = 0; i <= MG_NOTES_MAX; i++) cJSON_AddItemToArray(many, cJSON_CreateString("n"));
    CHECK(mg_notes_check(many, "output_constraints") != NULL);
    cJSON_Delete(many);
}

static void test_insert(void)
{
    cJSON *msgs = cJSON_Parse("[{\"role\":\"system\",\"content\":\"s\"},"
                              "{\"role\":\"user\",\"content\":\"q\"}]");
    cJSON *idn = cJSON_Parse("[\"agent 7\",\"read-only\"]");
    cJSON *out = cJSON_Parse("\"answer in JSON\"");
    cJSON *none = cJSON_Parse("[]");
    CHECK(mg_notes_insert(msgs, 1, NULL, idn) == 1);
    CHECK(mg_notes_insert(msgs, cJSON_GetArraySize(msgs), NULL, out) == 1);
    CHECK(mg_notes_insert(msgs, 0, NULL, none) == 0);
    CHECK(mg_notes_insert(msgs, 0, NULL, NULL) == 0);
    CHECK(mg_notes_insert(msgs, 0, "", NULL) == 0);
    char *s = printed(msgs);
    CHECK_STR(s, "[{\"role\":\"system\",\"content\":\"s\"},"
                 "{\"role\":\"system\",\"content\":\"agent 7\\n\\nread-only\"},"
                 "{\"role\":\"user\",\"content\":\"q\"},"
                 "{\"role\":\"system\",\"content\":\"answer in JSON\"}]");
    free(s);
    cJSON_Delete(msgs);
    cJSON_Delete(idn);
    cJSON_Delete(out);
    cJSON_Delete(none);
}

/* The application's configured notes come first, then the request's; either alone works. */
static void test_configured_first(void)
{
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"q\"}]");
    cJSON *idn = cJSON_Parse("[\"agent 7\"]");
    cJSON *out = cJSON_Parse("\"in JSON\"");
    CHECK(mg_notes_insert(msgs, 0, "tenant acme", idn) == 1);
    CHECK(mg_notes_insert(msgs, cJSON_GetArraySize(msgs), "be brief", out) == 1);
    CHECK(mg_notes_insert(msgs, cJSON_GetArraySize(msgs), "app only", NULL) == 1);
    char *s = printed(msgs);
    CHECK_STR(s, "[{\"role\":\"system\",\"content\":\"tenant acme\\n\\nagent 7\"},"
                 "{\"role\":\"user\",\"content\":\"q\"},"
                 "{\"role\":\"system\",\"content\":\"be brief\\n\\nin JSON\"},"
                 "{\"role\":\"system\",\"content\":\"app only\"}]");
    free(s);
    cJSON_Delete(msgs);
    cJSON_Delete(idn);
    cJSON_Delete(out);
}

int main(void)
{
    MG_RUN(test_check);
    MG_RUN(test_insert);
    MG_RUN(test_configured_first);
    return mg_test_summary();
}
