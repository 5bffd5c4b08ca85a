/* summary: a session's rolling summary (edge PRD 3.3.1, "max_messages reached: summary").
 *
 * When a session nears max_messages (three quarters of it) or its request had to be trimmed,
 * the older half of its turns (up to a user message: a turn boundary, so a tool call and its
 * result stay on one side) is sent to context.summarizer_model through the pipeline itself,
 * at P4, with the caller's credentials (metered and billed to it), as a detached request.
 * The earlier summary is folded in. When it answers, the summary replaces those turns; the
 * request that started it does not wait, and requests in between are trimmed as usual. The
 * cut moves by half the history at a time, so the prefix the engine sees (system, summary,
 * the turns after the cut) stays the same for many turns: its cache keeps serving. */
#include "pipeline/call.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static const char DEFAULT_SUMMARY_PROMPT[] =
    "Summarise the conversation below for the assistant that will continue it. Keep the facts, "
    "decisions, names, numbers, preferences and open questions; drop greetings and repetition. "
    "Write plain sentences, and answer with the summary only.";

static void append_str(mg_buf_t *b, const cJSON *v)
{
    if (cJSON_IsString(v)) mg_buf_append_str(b, v->valuestring);
}

static void transcript_line(mg_buf_t *t, const cJSON *m)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    mg_buf_append_str(t, cJSON_IsString(role) ? role->valuestring : "?");
    mg_buf_append_str(t, ": ");
    if (cJSON_IsString(content)) mg_buf_append_str(t, content->valuestring);
    for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next)
        append_str(t, cJSON_GetObjectItemCaseSensitive(p, "text"));
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    for (const cJSON *tc = cJSON_IsArray(tcs) ? tcs->child : NULL; tc; tc = tc->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        mg_buf_append_str(t, " [calls ");
        append_str(t, cJSON_GetObjectItemCaseSensitive(fn, "name"));
        mg_buf_append_str(t, " with ");
        append_str(t, cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
        mg_buf_append_str(t, "]");
    }
    mg_buf_append_str(t, "\n");
}

static void on_summary_done(void *ud, const mg_http_req_t *req, int status, const char *body,
                            size_t len)
{
    mg_sessions_t *ss = ud;
    mg_session_t *s = mg_sessions_by_summary(ss, req->request_id);
    if (!s) return; /* deleted or expired meanwhile */
    cJSON *resp = status == 200 ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    const cJSON *msg = cJSON_IsArray(choices) && choices->child
                           ? cJSON_GetObjectItemCaseSensitive(choices->child, "message")
                           : NULL;
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(msg, "content");
    int ok = cJSON_IsString(text) && text->valuestring[0];
    if (!ok)
        mg_log_msg(MG_LOG_WARN, req->request_id, "session %s: the summary call failed (status %d)",
                   s->id, status);
    mg_sessions_summary_done(ss, s, ok ? text->valuestring : NULL);
    mg_sessions_count_summary(ss, ok);
    cJSON_Delete(resp);
}

/* Where the older half ends: the index of the first user message from the middle on (0: no
 * cut worth a summary). */
static size_t summary_cut(const mg_session_t *s)
{
    for (size_t i = s->n_msgs / 2; i < s->n_msgs; i++) {
        cJSON *m = cJSON_Parse(s->msgs[i].json);
        int user = context_is_role(m, "user");
        cJSON_Delete(m);
        if (user) return i >= 2 ? i : 0;
    }
    return 0;
}

static char *summary_body(const mg_context_conf_t *cc, const mg_session_t *s, size_t cut)
{
    mg_buf_t t = {0};
    if (s->summary) {
        mg_buf_append_str(&t, "Summary so far:\n");
        mg_buf_append_str(&t, s->summary);
        mg_buf_append_str(&t, "\n\nThe conversation since:\n");
    }
    for (size_t i = 0; i < cut; i++) {
        cJSON *m = cJSON_Parse(s->msgs[i].json);
        if (m) transcript_line(&t, m);
        cJSON_Delete(m);
    }
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "model", cc->summarizer_model);
    cJSON *msgs = cJSON_AddArrayToObject(b, "messages");
    context_add_system(msgs, cc->summary_prompt ? cc->summary_prompt : DEFAULT_SUMMARY_PROMPT);
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", t.data ? t.data : "");
    cJSON_AddItemToArray(msgs, u);
    cJSON_AddNumberToObject(b, "max_tokens", cc->summary_max_tokens);
    cJSON_AddStringToObject(b, "priority", "P4");
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(b, "timeouts"), "total_ms",
                            cc->summary_timeout_ms);
    char *text = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    mg_buf_free(&t);
    return text;
}

void summary_maybe_start(call_t *c, mg_session_t *s, int trimmed)
{
    const mg_context_conf_t *cc = &c->gen->cfg->context;
    if (!cc->summarizer_model || s->summary_req[0] || !c->req || !c->pl->sessions) return;
    if (!trimmed && s->n_msgs * 4 < (size_t)s->max_messages * 3) return;
    size_t cut = summary_cut(s);
    char *body = cut ? summary_body(cc, s, cut) : NULL;
    mg_http_req_t *dreq =
        body ? mg_http_req_detached(HTTP_POST, "/v1/chat/completions", body, strlen(body), c->req,
                                    uv_now(c->pl->loop), on_summary_done, c->pl->sessions)
             : NULL;
    free(body);
    if (!dreq) return;
    mg_sessions_summary_started(s, dreq->request_id, s->msgs[cut - 1].seq);
    mg_log_msg(MG_LOG_INFO, c->req->request_id, "session %s: summarising %zu messages (%s)", s->id,
               cut, dreq->request_id);
    mg_pipeline_handle(c->pl, dreq, MG_EP_CHAT); /* may end at once: on_summary_done */
}
