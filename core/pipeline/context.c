/* context: a chat request's context (edge PRD 3.3.2-3.3.4): the session's history replayed
 * in the PRD's order, the exact token budget of the model, the trimming policy when it does
 * not fit, and, when the request succeeded, its turn appended to the session.
 *
 * The order: platform rules (context.platform_rules), the application's system prompt (the
 * session's, then the request's own leading system messages), the session summary, the
 * session's turns, then the request's other messages (the current request: protected).
 *
 * The budget: context_window x (1 - context.safety_margin_ratio) minus the output reserve
 * (the request's max_tokens, else the model's max_output_tokens), and no more than the
 * session's max_tokens; counted by the chat rule (token/chat.h) with the model's encoding. A
 * request without a session is looked at only when its model has a window and its body's
 * count (which over-counts the messages: it includes the JSON around them) is over budget. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "token/chat.h"
#include "token/registry.h"
#include "pipeline/notes.h"
#include "pipeline/snippets.h"

#define MAX_TOOL_CALLS 32

typedef struct {
    mg_buf_t id, name, args;
} tool_acc_t;

typedef struct call_context_s {
    char session_id[MG_SESSION_ID_LEN + 2]; /* one longer than an id: too long is no id */
    int has_session_id;
    int64_t project_id; /* the caller's key's project (read before admission ends the
                           borrow of its record) */
    char policy[24];
    mg_session_t *session;      /* held (holder = the call) until context_end */
    mg_session_t *waiting_on;   /* the session this call waits for, or NULL */
    mg_session_waiter_t waiter; /* its place in that session's list */
    cJSON *turn_in;             /* owned: the request's own non-system messages */
    cJSON *retrieval;           /* owned: the request's retrieval snippets (snippets.h) */
    cJSON *identity, *output;   /* owned: its identity notes and output constraints (notes.h) */
    int rewritten;
    long input_tokens, budget; /* the report; budget -1: none */
    cJSON *steps;              /* owned: the trimming steps that ran */
    /* the streamed answer */
    mg_buf_t content, reasoning;
    int has_content;
    tool_acc_t tools[MAX_TOOL_CALLS];
    int n_tools;
} call_context_t;

static call_context_t *ctx_of(call_t *c)
{
    if (!c->ctx) c->ctx = calloc(1, sizeof(*c->ctx));
    return c->ctx;
}

void context_take_extensions(call_t *c, cJSON *body)
{
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(body, "session_id");
    const cJSON *pol = cJSON_GetObjectItemCaseSensitive(body, "context_policy");
    const cJSON *rag = cJSON_GetObjectItemCaseSensitive(body, "retrieval");
    const cJSON *idn = cJSON_GetObjectItemCaseSensitive(body, "identity_notes");
    const cJSON *outc = cJSON_GetObjectItemCaseSensitive(body, "output_constraints");
    int snippets = c->ep == MG_EP_CHAT && cJSON_GetArraySize(rag) > 0;
    int notes =
        c->ep == MG_EP_CHAT && ((idn && !cJSON_IsNull(idn)) || (outc && !cJSON_IsNull(outc)));
    if ((!sid || cJSON_IsNull(sid)) && !cJSON_IsString(pol) && !snippets && !notes) return;
    call_context_t *x = ctx_of(c);
    if (!x) return;
    if (snippets) x->retrieval = cJSON_DetachItemFromObjectCaseSensitive(body, "retrieval");
    if (notes && idn && !cJSON_IsNull(idn))
        x->identity = cJSON_DetachItemFromObjectCaseSensitive(body, "identity_notes");
    if (notes && outc && !cJSON_IsNull(outc))
        x->output = cJSON_DetachItemFromObjectCaseSensitive(body, "output_constraints");
    x->project_id = c->auth.rec ? c->auth.rec->project_id : 0;
    if (sid && !cJSON_IsNull(sid)) {
        x->has_session_id = 1;
        if (cJSON_IsString(sid))
            snprintf(x->session_id, sizeof(x->session_id), "%s", sid->valuestring);
    }
    if (cJSON_IsString(pol)) snprintf(x->policy, sizeof(x->policy), "%s", pol->valuestring);
}

int context_rewritten(const call_t *c)
{
    return c->ctx && c->ctx->rewritten;
}

/* ---- the budget ----------------------------------------------------------------------- */

static const mg_encoding_t *encoding_of(const call_t *c)
{
    return c->model && c->model->tokenizer > 0 ? mg_token_registry_get(c->model->tokenizer - 1)
                                               : NULL;
}

/* The window every route of the model can hold: the model's, or a route's own when smaller
 * (any route may serve the request, a fallback included); 0 when none is known. */
static int window_of(const mg_model_conf_t *m)
{
    int w = m->context_window;
    for (size_t i = 0; i < m->n_routes; i++) {
        int r = m->routes[i].context_window;
        if (r > 0 && (w == 0 || r < w)) w = r;
    }
    return w;
}

/* The largest window a route of the model holds (its own, else the model's); 0: unknown. */
static int largest_window_of(const mg_model_conf_t *m)
{
    int w = 0;
    for (size_t i = 0; m->context_window && i < m->n_routes; i++) {
        int r = m->routes[i].context_window ? m->routes[i].context_window : m->context_window;
        if (r > w) w = r;
    }
    return w;
}

/* The budget of window for this request, or -1 when it has none. */
static long window_budget(const call_t *c, int window)
{
    const mg_model_conf_t *m = c->model;
    if (!window) return -1;
    long long reserve = c->max_tokens > 0 ? c->max_tokens : m->max_output_tokens;
    double usable = (double)window * (1.0 - c->gen->cfg->context.safety_margin_ratio);
    return (long)((long long)usable - reserve);
}

/* The model's budget for this request (every route's), or -1 when it has none (no window). */
static long model_budget(const call_t *c)
{
    return window_budget(c, window_of(c->model));
}

static int too_large(call_t *c, long n, long budget, const char *why)
{
    char msg[400];
    snprintf(msg, sizeof(msg),
             "the messages count %ld tokens; the budget is %ld (context_window %d of model '%s' "
             "less the output reserve and the safety margin)%s%s",
             n, budget, window_of(c->model), c->model->name, why ? ": " : "", why ? why : "");
    call_error(c, 400, "CONTEXT_TOO_LARGE", msg, 0);
    if (c->pl->sessions) mg_sessions_count_too_large(c->pl->sessions);
    return -1;
}

/* ---- assembly ------------------------------------------------------------------------- */

int context_is_role(const cJSON *m, const char *role)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) && strcmp(r->valuestring, role) == 0;
}

void context_add_system(cJSON *list, const char *text)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "system");
    cJSON_AddStringToObject(m, "content", text);
    cJSON_AddItemToArray(list, m);
}

/* The session's messages in order: platform rules, system prompts, summary, turns; then the
 * request's. *n_leading: the system messages before the turns; *first_current: where the
 * request's own (non-system) messages start. The request's messages are moved out of req. */
static cJSON *assemble(call_t *c, cJSON *req_msgs, int *n_leading, int *first_current)
{
    const mg_session_t *s = c->ctx->session;
    const char *rules = c->gen->cfg->context.platform_rules;
    cJSON *out = cJSON_CreateArray();
    if (rules) context_add_system(out, rules);
    if (s && s->system) context_add_system(out, s->system);
    while (req_msgs->child && context_is_role(req_msgs->child, "system"))
        cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(req_msgs, req_msgs->child));
    if (s && s->summary) {
        char *text = malloc(strlen(s->summary) + 64);
        if (text) {
            sprintf(text, "Summary of the earlier conversation:\n%s", s->summary);
            context_add_system(out, text);
            free(text);
        }
    }
    *n_leading = cJSON_GetArraySize(out);
    /* the turns as their stored text (cJSON_Raw): printed as they are, parsed only where a
     * tree is needed (a count without a stored one, the policy, a Lua adapter) */
    for (size_t i = 0; s && i < s->n_msgs; i++) {
        cJSON *m = cJSON_CreateRaw(s->msgs[i].json);
        if (m) cJSON_AddItemToArray(out, m);
    }
    *first_current = cJSON_GetArraySize(out);
    if (s) c->ctx->turn_in = cJSON_Duplicate(req_msgs, 1);
    while (req_msgs->child)
        cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(req_msgs, req_msgs->child));
    return out;
}

/* Without a session the current request is the last user message and what follows it; the
 * leading system messages are protected, the rest is history. */
static void split_plain(const cJSON *msgs, int *n_leading, int *first_current)
{
    int i = 0, last_user = -1;
    const cJSON *m = msgs->child;
    for (; m && context_is_role(m, "system"); m = m->next) i++;
    *n_leading = i;
    for (; m; m = m->next, i++)
        if (context_is_role(m, "user")) last_user = i;
    *first_current = last_user >= 0 ? last_user : *n_leading;
}

/* The list's tokens, each message's into tokens[] (may be NULL). known[i] >= 0 (known may
 * be NULL, or shorter: n_known) is message i's count already: the session's turns were
 * counted when they were appended, and are not counted again. */
static long count_known(const mg_encoding_t *e, const cJSON *msgs, long *tokens, const long *known,
                        int n_known)
{
    long n = MG_CHAT_TOKENS_REPLY;
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        long t = i < n_known && known[i] >= 0 ? known[i] : -1;
        if (t < 0 && cJSON_IsRaw(m)) { /* a session turn of another encoding */
            cJSON *tree = cJSON_Parse(m->valuestring);
            t = tree ? mg_chat_message_tokens(e, tree) : -1;
            cJSON_Delete(tree);
        } else if (t < 0) {
            t = mg_chat_message_tokens(e, m);
        }
        if (t < 0) return -1;
        if (tokens) tokens[i] = t;
        n += t;
    }
    return n;
}

static long count_all(const mg_encoding_t *e, const cJSON *msgs, long *tokens)
{
    return count_known(e, msgs, tokens, NULL, 0);
}

/* The context policy of this call: the request's, else the session's, else the config's. */
static const char *policy_of(const call_t *c)
{
    const call_context_t *x = c->ctx;
    return x->policy[0]                       ? x->policy
           : x->session && x->session->policy ? x->session->policy
                                              : c->gen->cfg->context.default_policy;
}

static int trim(call_t *c, cJSON **msgs, const long *tokens, int n_leading, int first_current,
                long n, long budget);

/* PRD 3.3.4 step 6: what the policy cannot fit in the window every route holds goes, when
 * context.switch_to_larger_window allows, to the routes with the largest window (the others
 * left out of routing: attempt.c), trimmed to that budget if need be. 0 switched (the step
 * "switch_route" reported), -1 not possible (no error set), -2 failed (the error set). */
static int switch_window(call_t *c, cJSON **msgs, const long *tokens, int n_leading,
                         int first_current, long n, long budget)
{
    int big = largest_window_of(c->model);
    long big_budget = window_budget(c, big);
    if (c->min_window || !c->gen->cfg->context.switch_to_larger_window || big_budget <= budget ||
        (c->ctx->session && c->ctx->session->max_tokens))
        return -1;
    c->min_window = big;
    c->ctx->budget = big_budget;
    if (n > big_budget && trim(c, msgs, tokens, n_leading, first_current, n, big_budget) != 0)
        return -2; /* that trim answered the error */
    call_context_t *x = c->ctx;
    if (!x->steps) x->steps = cJSON_CreateArray();
    if (x->steps) cJSON_AddItemToArray(x->steps, cJSON_CreateString("switch_route"));
    if (c->pl->sessions) mg_sessions_count_trim(c->pl->sessions, "switch_route");
    return 0;
}

/* Over budget: the policy's trimmed list, re-counted here. 0 with *msgs replaced, or -1. */
static int trim(call_t *c, cJSON **msgs, const long *tokens, int n_leading, int first_current,
                long n, long budget)
{
    call_context_t *x = c->ctx;
    const char *policy = policy_of(c);
    if (!strcmp(policy, "none"))
        return too_large(c, n, budget, "context_policy none does not trim");
    mg_context_in_t in = {*msgs, tokens, first_current, n_leading, policy, c->model->tokenizer - 1};
    cJSON *out = NULL, *steps = NULL;
    char err[400] = "";
    int rc = mg_gen_context_trim(c->gen, &in, budget, &out, &steps, err, sizeof(err));
    if (rc < 0) mg_log_msg(MG_LOG_WARN, c->req->request_id, "context policy: %s", err);
    long after = out ? count_all(encoding_of(c), out, NULL) : -1;
    if (rc != 0 || after < 0 || after > budget) {
        cJSON_Delete(out);
        cJSON_Delete(steps);
        int sw = switch_window(c, msgs, tokens, n_leading, first_current, n, budget);
        if (sw != -1) return sw == 0 ? 0 : -1;
        return too_large(c, n, budget, rc > 0 ? err : "the context policy could not fit them");
    }
    cJSON_Delete(*msgs);
    *msgs = out;
    x->steps = cJSON_IsArray(steps) ? steps : (cJSON_Delete(steps), cJSON_CreateArray());
    x->input_tokens = after;
    for (const cJSON *st = x->steps->child; st && c->pl->sessions; st = st->next)
        if (cJSON_IsString(st)) mg_sessions_count_trim(c->pl->sessions, st->valuestring);
    return 0;
}

static void busy(call_t *c, int waited)
{
    call_context_t *x = c->ctx;
    if (x->waiting_on) mg_session_unwait(x->waiting_on, &x->waiter);
    x->waiting_on = NULL;
    const char *msg = waited ? "another request on this session ran past this one's queue timeout"
                             : "another request on this session is running; retry when it ended";
    if (waited) call_fail(c, 409, "SESSION_BUSY", msg, 1000);
    else call_error(c, 409, "SESSION_BUSY", msg, 1000);
}

static void on_wait_timeout(uv_timer_t *t)
{
    busy(t->data, 1);
}

/* The session was handed to this call: on with the step (from the loop, not from inside the
 * end of the call that let it go). */
static void on_handed(uv_timer_t *t)
{
    call_resume(t->data, STEP_CONTEXT);
}

static int arm(call_t *c, uv_timer_cb cb, uint64_t ms)
{
    if (!c->wait_timer) {
        c->wait_timer = malloc(sizeof(*c->wait_timer));
        if (!c->wait_timer) return -1;
        uv_timer_init(c->pl->loop, c->wait_timer);
        c->wait_timer->data = c;
    }
    uv_timer_start(c->wait_timer, cb, ms, 0);
    return 0;
}

/* The session of the request, held by the call: 0, 1 when it waits for it (another request
 * holds it), or -1 with the error set. */
static int take_session(call_t *c)
{
    call_context_t *x = c->ctx;
    mg_session_owner_t who = {.all = 1};
    if (c->gen->cfg->auth_enabled) who = (mg_session_owner_t){0, c->auth.tenant_id, x->project_id};
    mg_session_t *s =
        c->pl->sessions && x->session_id[0] && strlen(x->session_id) <= MG_SESSION_ID_LEN
            ? mg_sessions_find(c->pl->sessions, x->session_id, &who, &c->gen->cfg->context,
                               (int64_t)mg_unix_ms())
            : NULL;
    if (!s) {
        call_error(c, 404, "SESSION_NOT_FOUND", "no such session", 0);
        return -1;
    }
    if (s->holder && s->holder != c) {
        if (c->gen->cfg->context.busy_reject ||
            arm(c, on_wait_timeout, (uint64_t)c->queue_ms) != 0) {
            busy(c, 0);
            return -1;
        }
        x->waiter.ud = c;
        x->waiting_on = s;
        mg_session_wait(s, &x->waiter);
        return 1;
    }
    if (c->wait_timer) uv_timer_stop(c->wait_timer);
    s->holder = c;
    x->session = s;
    return 0;
}

/* Let the session go: to the first waiter, whose call resumes from the loop. */
static void release_session(call_t *c, mg_session_t *s)
{
    s->holder = NULL;
    mg_session_waiter_t *w = mg_session_next_waiter(s);
    if (!w) return;
    call_t *next = w->ud;
    next->ctx->waiting_on = NULL;
    next->ctx->session = s; /* its end lets it go, should it end before it resumes */
    s->holder = next;
    if (arm(next, on_handed, 0) != 0) { /* out of memory: it times out as if still waiting */
        next->ctx->session = NULL;
        s->holder = NULL;
    }
}

/* The session's own token limit narrows the model's. */
static long session_budget(const call_context_t *x, long budget)
{
    if (!x || !x->session || !x->session->max_tokens) return budget;
    long own = (long)x->session->max_tokens;
    return budget < 0 || own < budget ? own : budget;
}

/* 0 to go on, 1 waiting for the session, -1 with the error set. */
static int context_assemble(call_t *c)
{
    if (c->ep != MG_EP_CHAT) return 0;
    int with_session = c->ctx && c->ctx->has_session_id;
    int with_snippets = c->ctx && c->ctx->retrieval;
    const char *app_identity = c->app ? c->app->identity_notes : NULL;
    const char *app_output = c->app ? c->app->output_constraints : NULL;
    int with_notes = (c->ctx && (c->ctx->identity || c->ctx->output)) || app_identity || app_output;
    const mg_encoding_t *e = encoding_of(c);
    int windowed = window_of(c->model) > 0;
    long budget = windowed ? model_budget(c) : -1;
    if (!with_session && !with_snippets && !with_notes &&
        (!windowed || !e || (budget > 0 && prompt_count(c) <= budget)))
        return 0;
    call_context_t *x = ctx_of(c);
    if (!x) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0), -1;
    int taken = with_session ? take_session(c) : 0;
    if (taken != 0) return taken;
    if (windowed && budget <= 0)
        return too_large(c, 0, budget, "the output reserve leaves no room for the messages");
    budget = session_budget(x, budget);
    cJSON *body = call_tree(c);
    cJSON *req_msgs = body ? cJSON_DetachItemFromObjectCaseSensitive(body, "messages") : NULL;
    if (!req_msgs) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0), -1;
    int n_leading = 0, first_current = 0;
    cJSON *msgs = req_msgs;
    if (with_session) {
        msgs = assemble(c, req_msgs, &n_leading, &first_current);
        cJSON_Delete(req_msgs);
    } else {
        split_plain(msgs, &n_leading, &first_current);
    }
    /* identity notes join the protected leading system messages, before the session's summary
     * (the PRD's order); output constraints close the protected tail (notes.h) */
    int summary_at_end = with_session && x->session && x->session->summary && n_leading > 0;
    int ni = mg_notes_insert(msgs, n_leading - summary_at_end, app_identity, x->identity);
    n_leading += ni > 0 ? ni : 0;
    first_current += ni > 0 ? ni : 0;
    int no = mg_notes_insert(msgs, cJSON_GetArraySize(msgs), app_output, x->output);
    /* the snippets go before the current request; the policy finds them by their mark */
    if (ni < 0 || no < 0 ||
        (with_snippets && mg_snippets_insert(msgs, first_current, x->retrieval) < 0)) {
        cJSON_AddItemToObject(body, "messages", msgs);
        return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0), -1;
    }
    int n_msgs = cJSON_GetArraySize(msgs);
    long *tokens = calloc((size_t)n_msgs + 1, sizeof(*tokens));
    long *known = calloc((size_t)n_msgs + 1, sizeof(*known));
    const mg_session_t *s = x->session;
    int n_known = 0;
    if (known) {
        for (int i = 0; i < n_msgs; i++) known[i] = -1;
        /* the turns' stored counts, when every turn made it into the list */
        if (s && (size_t)(first_current - n_leading) == s->n_msgs) {
            for (size_t i = 0; i < s->n_msgs; i++)
                if (s->msgs[i].encoding == c->model->tokenizer - 1)
                    known[n_leading + (int)i] = s->msgs[i].tokens;
            n_known = first_current;
        }
    }
    long n = e && tokens ? count_known(e, msgs, tokens, known, n_known) : -1;
    free(known);
    x->input_tokens = n;
    x->budget = budget;
    int rc = 0;
    if (n >= 0 && budget > 0 && n > budget)
        rc = trim(c, &msgs, tokens, n_leading, first_current, n, budget);
    free(tokens);
    long joined = with_snippets ? mg_snippets_join(e, msgs) : 0;
    if (x->input_tokens >= 0) x->input_tokens += joined;
    cJSON_AddItemToObject(body, "messages", msgs);
    x->rewritten = 1;
    if (x->input_tokens >= 0) c->prompt_count = x->input_tokens;
    return rc;
}

/* 1 when a step other than the snippets' changed the history (a summary is due). */
static int history_trimmed(const cJSON *steps)
{
    for (const cJSON *st = steps ? steps->child : NULL; st; st = st->next)
        if (cJSON_IsString(st) && strcmp(st->valuestring, "drop_snippets") != 0 &&
            strcmp(st->valuestring, "shrink_retrieval") != 0)
            return 1;
    return 0;
}

mg_step_rc_t step_context(call_t *c)
{
    int64_t before = c->prompt_count;
    int rc = context_assemble(c);
    if (rc > 0) {
        c->step = STEP_CONTEXT; /* resumed when the session is this call's, or it timed out */
        return MG_STEP_AGAIN;
    }
    if (rc == 0 && c->prompt_count != before && c->prompt_count >= 0) /* TPM: what is sent */
        c->est_tokens = c->prompt_count + output_estimate(c);
    /* recent_only keeps the recent turns and nothing else: no summary is made for it */
    if (rc == 0 && c->ctx && c->ctx->session && strcmp(policy_of(c), "recent_only") != 0)
        summary_maybe_start(c, c->ctx->session, history_trimmed(c->ctx->steps));
    return MG_STEP_NEXT;
}

/* ---- the answer, for the session ------------------------------------------------------ */

static void append_str(mg_buf_t *b, const cJSON *v)
{
    if (cJSON_IsString(v)) mg_buf_append_str(b, v->valuestring);
}

void context_take_chunk(call_t *c, const cJSON *chunk)
{
    call_context_t *x = c->ctx;
    if (!x || !x->session) return;
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(chunk, "choices");
    const cJSON *ch = cJSON_IsArray(choices) ? choices->child : NULL;
    const cJSON *delta = ch ? cJSON_GetObjectItemCaseSensitive(ch, "delta") : NULL;
    if (!cJSON_IsObject(delta)) return;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    if (cJSON_IsString(content)) x->has_content = 1;
    append_str(&x->content, content);
    append_str(&x->reasoning, cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content"));
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls");
    for (const cJSON *tc = cJSON_IsArray(tcs) ? tcs->child : NULL; tc; tc = tc->next) {
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(tc, "index");
        int i = mg_json_int(idx, 0);
        if (i < 0 || i >= MAX_TOOL_CALLS) continue;
        if (i >= x->n_tools) x->n_tools = i + 1;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        append_str(&x->tools[i].id, cJSON_GetObjectItemCaseSensitive(tc, "id"));
        append_str(&x->tools[i].name, cJSON_GetObjectItemCaseSensitive(fn, "name"));
        append_str(&x->tools[i].args, cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
    }
}

void context_take_event(call_t *c, const char *json, size_t n)
{
    if (!c->ctx || !c->ctx->session) return;
    cJSON *chunk = cJSON_ParseWithLength(json, n);
    if (chunk) context_take_chunk(c, chunk);
    cJSON_Delete(chunk);
}

static const char *buf_text(const mg_buf_t *b)
{
    return b->data ? b->data : "";
}

/* The streamed answer as one assistant message. */
static cJSON *streamed_message(const call_context_t *x)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (x->has_content || !x->n_tools) cJSON_AddStringToObject(m, "content", buf_text(&x->content));
    else cJSON_AddNullToObject(m, "content");
    if (x->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", buf_text(&x->reasoning));
    if (!x->n_tools) return m;
    cJSON *tcs = cJSON_AddArrayToObject(m, "tool_calls");
    for (int i = 0; i < x->n_tools; i++) {
        cJSON *tc = cJSON_CreateObject();
        cJSON_AddStringToObject(tc, "id", buf_text(&x->tools[i].id));
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(tc, "function");
        cJSON_AddStringToObject(fn, "name", buf_text(&x->tools[i].name));
        cJSON_AddStringToObject(fn, "arguments", buf_text(&x->tools[i].args));
        cJSON_AddItemToArray(tcs, tc);
    }
    return m;
}

/* The whole answer's first choice's message, as the session keeps it. */
static cJSON *answer_message(const call_t *c)
{
    cJSON *resp = cJSON_ParseWithLength(c->answer.data ? c->answer.data : "", c->answer.len);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(resp, "choices");
    const cJSON *msg = cJSON_IsArray(choices) && choices->child
                           ? cJSON_GetObjectItemCaseSensitive(choices->child, "message")
                           : NULL;
    cJSON *m = NULL;
    if (cJSON_IsObject(msg)) {
        m = cJSON_CreateObject();
        static const char *const keep[] = {"role", "content", "reasoning_content", "tool_calls"};
        for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, keep[i]);
            if (v && !(cJSON_IsNull(v) && strcmp(keep[i], "content") != 0))
                cJSON_AddItemToObject(m, keep[i], cJSON_Duplicate(v, 1));
        }
    }
    cJSON_Delete(resp);
    return m;
}

static void append_message(call_t *c, const cJSON *m, int64_t now)
{
    char *text = cJSON_PrintUnformatted(m);
    const mg_encoding_t *e = encoding_of(c);
    long tokens = e ? mg_chat_message_tokens(e, m) : -1;
    if (text)
        mg_sessions_append(c->pl->sessions, c->ctx->session, text, tokens,
                           e ? c->model->tokenizer - 1 : -1, now);
    free(text);
}

static int succeeded(const call_t *c)
{
    return c->status == 200 && c->outcome && strcmp(c->outcome, "ok") == 0 &&
           (c->answer_kind == ANSWER_JSON || c->answer_kind == ANSWER_STREAM);
}

void context_end(call_t *c)
{
    call_context_t *x = c->ctx;
    if (!x) return;
    if (x->waiting_on) mg_session_unwait(x->waiting_on, &x->waiter);
    if (x->session) {
        int ok = succeeded(c);
        cJSON *answer = !ok                             ? NULL
                        : c->answer_kind == ANSWER_JSON ? answer_message(c)
                                                        : streamed_message(x);
        int64_t now = (int64_t)mg_unix_ms();
        if ((ok && answer) || c->gen->cfg->context.append_user_on_failure) {
            for (const cJSON *m = x->turn_in ? x->turn_in->child : NULL; m; m = m->next)
                append_message(c, m, now);
        }
        if (ok && answer) append_message(c, answer, now);
        cJSON_Delete(answer);
        mg_sessions_touch(c->pl->sessions, x->session, now);
        release_session(c, x->session);
    }
    cJSON_Delete(x->turn_in);
    cJSON_Delete(x->retrieval);
    cJSON_Delete(x->identity);
    cJSON_Delete(x->output);
    cJSON_Delete(x->steps);
    mg_buf_free(&x->content);
    mg_buf_free(&x->reasoning);
    for (int i = 0; i < MAX_TOOL_CALLS; i++) {
        mg_buf_free(&x->tools[i].id);
        mg_buf_free(&x->tools[i].name);
        mg_buf_free(&x->tools[i].args);
    }
    free(x);
    c->ctx = NULL;
}

/* ---- the report ----------------------------------------------------------------------- */

static cJSON *report_json(const call_context_t *x)
{
    cJSON *r = cJSON_CreateObject();
    if (x->input_tokens >= 0) cJSON_AddNumberToObject(r, "input_tokens", (double)x->input_tokens);
    else cJSON_AddNullToObject(r, "input_tokens");
    if (x->budget > 0) cJSON_AddNumberToObject(r, "budget", (double)x->budget);
    else cJSON_AddNullToObject(r, "budget");
    cJSON_AddItemToObject(r, "trimmed",
                          x->steps ? cJSON_Duplicate(x->steps, 1) : cJSON_CreateArray());
    cJSON_AddBoolToObject(r, "summary_used", x->session && x->session->summary);
    return r;
}

void context_annotate(call_t *c, cJSON *obj)
{
    const call_context_t *x = c->ctx;
    if (!x || !x->rewritten) return;
    if (x->session) set_item(obj, "session_id", cJSON_CreateString(x->session->id));
    set_item(obj, "context", report_json(x));
}

void context_log(const call_t *c, struct mg_logline_s *l)
{
    const call_context_t *x = c->ctx;
    if (!x || !x->rewritten) return;
    if (x->session) mg_log_str(l, "session_id", x->session->id);
    if (x->input_tokens >= 0) mg_log_int(l, "context_tokens", x->input_tokens);
    if (x->budget > 0) mg_log_int(l, "context_budget", x->budget);
    if (!x->steps || !x->steps->child) return;
    char steps[160] = "";
    size_t n = 0;
    for (const cJSON *st = x->steps->child; st; st = st->next)
        if (cJSON_IsString(st))
            n += (size_t)snprintf(steps + n, n < sizeof(steps) ? sizeof(steps) - n : 0, "%s%s",
                                  n ? "," : "", st->valuestring);
    mg_log_str(l, "context_trimmed", steps);
}

void context_annotate_raw(call_t *c, mg_buf_t *o)
{
    const call_context_t *x = c->ctx;
    if (!x || !x->rewritten) return;
    cJSON *obj = cJSON_CreateObject();
    context_annotate(c, obj);
    mg_buf_t tmp = {0};
    if (mg_json_print(obj, &tmp) == 0 && tmp.len > 2) {
        mg_buf_append(o, ",", 1);
        mg_buf_append(o, tmp.data + 1, tmp.len - 2); /* the members, without the braces */
    }
    mg_buf_free(&tmp);
    cJSON_Delete(obj);
}
