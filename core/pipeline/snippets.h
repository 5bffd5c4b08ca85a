/* snippets: the request's retrieval results (the `retrieval` extension of a chat request,
 * edge PRD 3.3.2 step 6) as messages the context policy can weigh and drop.
 *
 *   "retrieval": ["text", {"text": "...", "score": 0.82, "source": "kb/doc-7", "id": "d7"}]
 *
 * Each snippet becomes a system message marked `moongate_snippet: {rank, score?, source?,
 * id?}`, placed before the current request, so policies/context.lua can drop repeats and
 * low-relevance ones (drop_snippets) and shrink the rest (shrink_retrieval) like any message.
 * What is kept is joined into one system message, the marks removed, before the request goes
 * upstream: the engine sees the snippets' text and nothing of the gateway's. */
#ifndef MG_PIPELINE_SNIPPETS_H
#define MG_PIPELINE_SNIPPETS_H

#include <cjson/cJSON.h>

#include "token/encoding.h"

#define MG_SNIPPETS_MAX 256
#define MG_SNIPPET_MARK "moongate_snippet"

/* NULL when v (the body's `retrieval`, not NULL) is a list of snippets, else the problem. */
const char *mg_snippets_check(const cJSON *v);
/* The snippets of `retrieval` as marked system messages, inserted into msgs before index at.
 * Returns how many, or -1 when out of memory. */
int mg_snippets_insert(cJSON *msgs, int at, const cJSON *retrieval);
/* The marked messages of msgs joined into one unmarked system message where the first was
 * (separated by a blank line); the others removed. Returns the change of the list's token
 * count by the chat rule of token/chat.h with e (<= 0: one message's overhead instead of
 * several), 0 when there were none. */
long mg_snippets_join(const mg_encoding_t *e, cJSON *msgs);

#endif
