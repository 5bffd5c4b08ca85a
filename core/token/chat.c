/* chat: a chat message list's prompt tokens; see chat.h. */
#include "token/chat.h"

#include <string.h>

#include "token/tokenize.h"

static long str_tokens(const mg_encoding_t *e, const cJSON *s)
{
    if (!cJSON_IsString(s) || !s->valuestring[0]) return 0;
    return mg_tokenize_count(e, s->valuestring, strlen(s->valuestring), 0);
}

static long content_tokens(const mg_encoding_t *e, const cJSON *content)
{
    if (!cJSON_IsArray(content)) return str_tokens(e, content);
    long n = 0;
    for (const cJSON *part = content->child; part; part = part->next) {
        long t = str_tokens(e, cJSON_GetObjectItemCaseSensitive(part, "text"));
        if (t < 0) return -1;
        n += t;
    }
    return n;
}

static long tool_calls_tokens(const mg_encoding_t *e, const cJSON *calls)
{
    long n = 0;
    for (const cJSON *tc = cJSON_IsArray(calls) ? calls->child : NULL; tc; tc = tc->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        long a = str_tokens(e, cJSON_GetObjectItemCaseSensitive(fn, "name"));
        long b = str_tokens(e, cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
        if (a < 0 || b < 0) return -1;
        n += a + b + 3;
    }
    return n;
}

long mg_chat_message_tokens(const mg_encoding_t *e, const cJSON *msg)
{
    if (!cJSON_IsObject(msg)) return -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(msg, "name");
    long parts[] = {
        str_tokens(e, cJSON_GetObjectItemCaseSensitive(msg, "role")),
        content_tokens(e, cJSON_GetObjectItemCaseSensitive(msg, "content")),
        str_tokens(e, name),
        str_tokens(e, cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content")),
        str_tokens(e, cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id")),
        tool_calls_tokens(e, cJSON_GetObjectItemCaseSensitive(msg, "tool_calls")),
    };
    long n = MG_CHAT_TOKENS_PER_MESSAGE + (cJSON_IsString(name) ? 1 : 0);
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        if (parts[i] < 0) return -1;
        n += parts[i];
    }
    return n;
}

long mg_chat_messages_tokens(const mg_encoding_t *e, const cJSON *messages)
{
    long n = MG_CHAT_TOKENS_REPLY;
    for (const cJSON *m = cJSON_IsArray(messages) ? messages->child : NULL; m; m = m->next) {
        long t = mg_chat_message_tokens(e, m);
        if (t < 0) return -1;
        n += t;
    }
    return n;
}
