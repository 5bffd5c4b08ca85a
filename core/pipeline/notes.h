/* notes: the request's identity and permission notes and its output constraints (edge PRD
 * 3.3.2, steps 3 and 8), two extensions of a chat request:
 *
 *   "identity_notes":     "the caller is agent 7, read-only on billing"  (or a list of strings)
 *   "output_constraints": ["answer in JSON", "at most 100 words"]         (or one string)
 *
 * An application may carry its own (applications.<name>.identity_notes, .output_constraints in
 * the config or through the admin API): they come first, then the request's.
 *
 * Each becomes one plain system message (the texts joined by a blank line), never stored in a
 * session and never sent as a field of its own: the identity notes right after the leading
 * system messages (platform rules, system prompt), so they count among the protected leading
 * ones; the output constraints last, after the current request, inside the protected tail. */
#ifndef MG_PIPELINE_NOTES_H
#define MG_PIPELINE_NOTES_H

#include <cjson/cJSON.h>

#define MG_NOTES_MAX 32

/* NULL when v (the member `name`'s value, not NULL) is a non-empty string or a list of at
 * most MG_NOTES_MAX of them (null: none), else the problem. */
const char *mg_notes_check(const cJSON *v, const char *name);
/* The notes as one system message inserted into msgs before index at (at past the end:
 * appended): `configured` (the application's, conf applications.<name>; may be NULL) first,
 * then v's (the request's; may be NULL). Returns 1, 0 when there are none, -1 when out of
 * memory. */
int mg_notes_insert(cJSON *msgs, int at, const char *configured, const cJSON *v);

#endif
