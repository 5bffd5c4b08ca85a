/* notes: identity and permission notes, output constraints; see notes.h. */
#include "pipeline/notes.h"

#include <stdlib.h>

#include "base/json.h"

const char *mg_notes_check(const cJSON *v, const char *name)
{
    (void)name;
    if (cJSON_IsNull(v)) return NULL;
    if (cJSON_IsString(v)) return v->valuestring[0] ? NULL : "a note must not be empty";
    if (!cJSON_IsArray(v)) return "notes must be a string or an array of strings";
    if (cJSON_GetArraySize(v) > MG_NOTES_MAX) return "at most 32 notes";
    for (const cJSON *s = v->child; s; s = s->next)
        if (!cJSON_IsString(s) || !s->valuestring[0]) return "each note must be a non-empty string";
    return NULL;
}

static int insert_at(cJSON *msgs, int at, cJSON *item)
{
    cJSON *tail = mg_json_cut(msgs, at);
    if (!tail) return -1;
    cJSON_AddItemToArray(msgs, item);
    mg_json_rejoin(msgs, tail);
    return 0;
}

int mg_notes_insert(cJSON *msgs, int at, const char *configured, const cJSON *v)
{
    mg_buf_t text = {0};
    if (configured && *configured) mg_buf_append_str(&text, configured);
    if (cJSON_IsString(v) && text.len) mg_buf_append_str(&text, "\n\n");
    if (cJSON_IsString(v)) mg_buf_append_str(&text, v->valuestring);
    for (const cJSON *s = cJSON_IsArray(v) ? v->child : NULL; s; s = s->next) {
        if (!cJSON_IsString(s)) continue;
        if (text.len) mg_buf_append_str(&text, "\n\n");
        mg_buf_append_str(&text, s->valuestring);
    }
    if (!text.len) return mg_buf_free(&text), 0;
    cJSON *m = cJSON_CreateObject();
    int ok = m && cJSON_AddStringToObject(m, "role", "system") &&
             cJSON_AddStringToObject(m, "content", text.data);
    mg_buf_free(&text);
    if (!ok || insert_at(msgs, at, m) < 0) return cJSON_Delete(m), -1;
    return 1;
}
