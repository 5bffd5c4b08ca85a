/* snippets: retrieval results as marked messages; see snippets.h. */
#include "pipeline/snippets.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "token/chat.h"

static const char *snippet_problem(const cJSON *s)
{
    if (cJSON_IsString(s)) return s->valuestring[0] ? NULL : "a snippet's text must not be empty";
    if (!cJSON_IsObject(s)) return "each snippet must be a string or an object with 'text'";
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(s, "text");
    if (!cJSON_IsString(text) || !text->valuestring[0])
        return "each snippet object needs a non-empty string 'text'";
    const cJSON *score = cJSON_GetObjectItemCaseSensitive(s, "score");
    if (score && !cJSON_IsNull(score) && !cJSON_IsNumber(score))
        return "a snippet's 'score' must be a number";
    static const char *const strings[] = {"source", "id"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, strings[i]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsString(v))
            return i ? "a snippet's 'id' must be a string"
                     : "a snippet's 'source' must be a string";
    }
    return NULL;
}

const char *mg_snippets_check(const cJSON *v)
{
    if (cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsArray(v)) return "'retrieval' must be an array of snippets";
    if (cJSON_GetArraySize(v) > MG_SNIPPETS_MAX) return "'retrieval' holds at most 256 snippets";
    for (const cJSON *s = v->child; s; s = s->next) {
        const char *p = snippet_problem(s);
        if (p) return p;
    }
    return NULL;
}

static void copy_member(cJSON *to, const cJSON *from, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(from, key);
    if (v && !cJSON_IsNull(v)) cJSON_AddItemToObject(to, key, cJSON_Duplicate(v, 0));
}

static cJSON *snippet_message(const cJSON *s, int rank)
{
    const cJSON *text = cJSON_IsString(s) ? s : cJSON_GetObjectItemCaseSensitive(s, "text");
    cJSON *m = cJSON_CreateObject(), *mark = cJSON_CreateObject();
    if (!m || !mark || !cJSON_AddStringToObject(m, "role", "system") ||
        !cJSON_AddStringToObject(m, "content", text->valuestring) ||
        !cJSON_AddNumberToObject(mark, "rank", rank)) {
        cJSON_Delete(m);
        cJSON_Delete(mark);
        return NULL;
    }
    if (cJSON_IsObject(s)) {
        copy_member(mark, s, "score");
        copy_member(mark, s, "source");
        copy_member(mark, s, "id");
    }
    cJSON_AddItemToObject(m, MG_SNIPPET_MARK, mark);
    return m;
}

int mg_snippets_insert(cJSON *msgs, int at, const cJSON *retrieval)
{
    cJSON *tail = mg_json_cut(msgs, at);
    if (!tail) return -1;
    int n = 0, failed = 0;
    for (const cJSON *s = cJSON_IsArray(retrieval) ? retrieval->child : NULL; s && !failed;
         s = s->next) {
        cJSON *sm = snippet_message(s, n + 1);
        if (!sm) failed = 1;
        else if (cJSON_AddItemToArray(msgs, sm)) n++;
    }
    mg_json_rejoin(msgs, tail);
    return failed ? -1 : n;
}

static int is_snippet(const cJSON *m)
{
    return cJSON_HasObjectItem(m, MG_SNIPPET_MARK);
}

static long tokens_of(const mg_encoding_t *e, const cJSON *m)
{
    long n = e ? mg_chat_message_tokens(e, m) : 0;
    return n > 0 ? n : 0;
}

long mg_snippets_join(const mg_encoding_t *e, cJSON *msgs)
{
    cJSON *first = NULL;
    mg_buf_t text = {0};
    long before = 0;
    for (cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL, *next; m; m = next) {
        next = m->next;
        if (!is_snippet(m)) continue;
        before += tokens_of(e, m);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(content)) {
            if (text.len) mg_buf_append_str(&text, "\n\n");
            mg_buf_append_str(&text, content->valuestring);
        }
        if (!first) first = m;
        else cJSON_Delete(cJSON_DetachItemViaPointer(msgs, m));
    }
    if (!first) return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(first, MG_SNIPPET_MARK);
    cJSON_ReplaceItemInObjectCaseSensitive(first, "content",
                                           cJSON_CreateString(text.len ? text.data : ""));
    mg_buf_free(&text);
    return tokens_of(e, first) - before;
}
