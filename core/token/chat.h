/* chat: the tokens a list of chat messages takes in the model's prompt, by the rule OpenAI
 * documents for its chat models (and that the context budget is counted by):
 *
 *   each message:  3 + tokens(role) + tokens(content) + tokens(name) + 1 if it has a name
 *                  + tokens(reasoning_content) + tokens(tool_call_id)
 *                  + for each tool call: tokens(function.name) + tokens(function.arguments) + 3
 *   the list:      the messages' sum + 3 (the assistant's reply is primed)
 *
 * content is a string, or an array of parts whose "text" strings count (images and other
 * parts count 0: their cost is the engine's, not text). Pure, any thread. */
#ifndef MG_TOKEN_CHAT_H
#define MG_TOKEN_CHAT_H

#include <cjson/cJSON.h>

#include "token/encoding.h"

#define MG_CHAT_TOKENS_PER_MESSAGE 3
#define MG_CHAT_TOKENS_REPLY 3

/* One message's tokens by the rule above, or -1 (out of memory, or not an object). */
long mg_chat_message_tokens(const mg_encoding_t *e, const cJSON *msg);
/* A message list's tokens (the reply priming included), or -1. */
long mg_chat_messages_tokens(const mg_encoding_t *e, const cJSON *messages);

#endif
