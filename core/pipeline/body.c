/* body: the parse step: the client's body read, checked and taken apart into what the
 * other steps use; and the upstream body spliced back from its bytes.
 *
 * Most requests carry no extension and are read as bytes (the fast path below): their
 * upstream body for a passthrough adapter is spliced from the client's bytes, no cJSON tree
 * is ever built. Everything else takes the tree path: parsed once, checked, sanitized (the
 * gateway's extensions taken out, max_output_tokens mapped, streams asked for usage). */
#include "pipeline/call.h"
#include "pipeline/notes.h"
#include "pipeline/snippets.h"

#include "base/json.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Extensions from the edge PRD: accepted from clients, never sent upstream. */
#define KEY(s)                                                                                     \
    {                                                                                              \
        s, sizeof(s) - 1                                                                           \
    }
static const struct {
    const char *name;
    size_t len;
} extension_keys[] = {KEY("priority"),          KEY("session_id"),        KEY("idempotency_key"),
                      KEY("timeouts"),          KEY("routing"),           KEY("context_policy"),
                      KEY("max_output_tokens"), KEY("metadata"),          KEY("retrieval"),
                      KEY("identity_notes"),    KEY("output_constraints")};
#define N_EXTENSIONS (sizeof(extension_keys) / sizeof(extension_keys[0]))

int member_is(const mg_json_member_t *m, const char *key)
{
    size_t n = strlen(key);
    return m->key_len == n && memcmp(m->key, key, n) == 0;
}

static int is_extension(const mg_json_member_t *m)
{
    for (size_t i = 0; i < N_EXTENSIONS; i++)
        if (m->key_len == extension_keys[i].len &&
            memcmp(m->key, extension_keys[i].name, m->key_len) == 0)
            return 1;
    return 0;
}

/* A member the gateway adds to answers: an upstream member of that name is a clash. */
int is_gateway_member(const mg_json_member_t *m)
{
    static const struct {
        const char *name;
        size_t len;
    } names[] = {KEY("request_id"),      KEY("logical_model"),    KEY("actual_model"),
                 KEY("node_id"),         KEY("timing"),           KEY("degraded"),
                 KEY("degraded_reason"), KEY("max_output_tokens")};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (m->key_len == names[i].len && memcmp(m->key, names[i].name, m->key_len) == 0) return 1;
    return 0;
}

/* [before]"key":value[after] into o, with one bounds check. */
static void append_member(mg_buf_t *o, const mg_json_member_t *m, const char *before,
                          const char *after)
{
    size_t nb = strlen(before), na = strlen(after);
    if (mg_buf_reserve(o, nb + m->key_len + m->value_len + 3 + na) != 0) return;
    char *p = o->data + o->len;
    memcpy(p, before, nb);
    p += nb;
    *p++ = '"';
    memcpy(p, m->key, m->key_len);
    p += m->key_len;
    *p++ = '"';
    *p++ = ':';
    memcpy(p, m->value, m->value_len);
    p += m->value_len;
    memcpy(p, after, na + 1); /* and the NUL mg_buf keeps */
    o->len = (size_t)(p + na - o->data);
}

void set_item(cJSON *obj, const char *key, cJSON *value)
{
    if (cJSON_HasObjectItem(obj, key)) cJSON_ReplaceItemInObject(obj, key, value);
    else cJSON_AddItemToObject(obj, key, value);
}

/* stream_options as the gateway sends it upstream: the last chunk's usage meters the answer. */
static cJSON *usage_options(void)
{
    cJSON *opts = cJSON_CreateObject();
    cJSON_AddTrueToObject(opts, "include_usage");
    return opts;
}

/* Check the body's shape for the endpoint; NULL when fine, else the problem. */
static const char *validate(mg_endpoint_t ep, const cJSON *body)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!cJSON_IsString(model) || !model->valuestring[0])
        return "'model' must be a non-empty string";
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream))
        return "'stream' must be a boolean";
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(body, "max_output_tokens");
    if (mot && !cJSON_IsNull(mot) && (!cJSON_IsNumber(mot) || mot->valuedouble < 1))
        return "'max_output_tokens' must be a positive integer";
    if (ep == MG_EP_CHAT) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
        if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
            return "'messages' must be a non-empty array";
        for (const cJSON *m = msgs->child; m; m = m->next)
            if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
                return "each message must be an object with a 'role'";
        const cJSON *retrieval = cJSON_GetObjectItemCaseSensitive(body, "retrieval");
        const char *bad = retrieval ? mg_snippets_check(retrieval) : NULL;
        if (bad) return bad;
        static const char *const notes[] = {"identity_notes", "output_constraints"};
        for (int i = 0; i < 2; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, notes[i]);
            if (v && (bad = mg_notes_check(v, notes[i])) != NULL)
                return i ? "'output_constraints' must be a non-empty string or an array of at "
                           "most 32 non-empty strings"
                         : "'identity_notes' must be a non-empty string or an array of at most 32 "
                           "non-empty strings";
        }
    } else if (ep == MG_EP_COMPLETIONS) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
        if (!cJSON_IsString(p) && !cJSON_IsArray(p)) return "'prompt' must be a string or an array";
    } else if (ep == MG_EP_EMBEDDINGS) {
        const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "input");
        if (!cJSON_IsString(in) && !cJSON_IsArray(in))
            return "'input' must be a string or an array";
    }
    return NULL;
}

/* Strip the extensions, map max_output_tokens, ask streams for usage. */
static void sanitize(call_t *c)
{
    cJSON *b = c->body;
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(b, "max_output_tokens");
    c->mapped_max_tokens = -1;
    if (cJSON_IsNumber(mot) && c->ep != MG_EP_EMBEDDINGS && !cJSON_HasObjectItem(b, "max_tokens") &&
        !cJSON_HasObjectItem(b, "max_completion_tokens")) {
        c->mapped_max_tokens = mg_json_ll(mot, -1);
        cJSON_AddNumberToObject(b, "max_tokens", (double)c->mapped_max_tokens);
    }
    context_take_extensions(c, b); /* session_id, context_policy, retrieval: before they go */
    const cJSON *prio = cJSON_GetObjectItemCaseSensitive(b, "priority");
    int engine_priority = cJSON_IsNumber(prio); /* the engine's, kept (see forwarded) */
    for (size_t i = 0; i < N_EXTENSIONS; i++)
        if (!(engine_priority && strcmp(extension_keys[i].name, "priority") == 0))
            cJSON_DeleteItemFromObjectCaseSensitive(b, extension_keys[i].name);
    c->stream =
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "stream")) && c->ep != MG_EP_EMBEDDINGS;
    if (c->stream) {
        const cJSON *so = cJSON_GetObjectItemCaseSensitive(b, "stream_options");
        c->client_include_usage =
            cJSON_IsObject(so) &&
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(so, "include_usage"));
        set_item(b, "stream_options", usage_options());
    }
}

/* ---- the fast path: the body read as bytes, no tree -------------------------------------
 * Most requests carry no extension, so sanitize() would not change their tree, and the
 * passthrough adapters send the client's bytes (spliced, see passthrough_body) rather than a
 * printed tree: for them the tree was built only to read a few members and then freed. The
 * fast path reads those members from the bytes instead, for a body that gives exactly what
 * the tree would: cJSON would accept it (mg_json_check_members), it is one object with only plain
 * whitespace, no extension, no escaped key (that could name anything once decoded), and its
 * model, stream and messages pass validate(). Anything else, every error included, takes the
 * tree path as before. A translating adapter gets its tree later (call_tree). */

#define FAST_MEMBERS 32

/* The members it reads, first occurrence (what cJSON's lookups find). */
enum {
    F_MODEL,
    F_STREAM,
    F_SHAPE,
    F_MAX_TOKENS,
    F_MAX_COMPLETION,
    F_STREAM_OPTIONS,
    F_USER,
    F_CHOICES,
    F_N
};

typedef struct {
    const char *keys[F_N];
    size_t key_len[F_N];
    mg_json_member_t m[F_N];
    unsigned char seen[F_N];
    mg_json_member_t *all; /* room for FAST_MEMBERS, or NULL */
    size_t n_all;          /* members seen: more than FAST_MEMBERS means not all kept */
} fast_scan_t;

static int has_escape(const char *s, size_t n)
{
    return memchr(s, '\\', n) != NULL;
}

static int fast_member(void *ud, const mg_json_member_t *m)
{
    fast_scan_t *f = ud;
    if (has_escape(m->key, m->key_len) || is_extension(m)) return 1;
    if (f->all && f->n_all < FAST_MEMBERS) f->all[f->n_all] = *m;
    f->n_all++;
    for (int k = 0; k < F_N; k++) {
        if (m->key_len != f->key_len[k] || !f->keys[k] || memcmp(m->key, f->keys[k], m->key_len))
            continue;
        if (!f->seen[k]) f->m[k] = *m;
        f->seen[k] = 1;
        break;
    }
    return 0;
}

/* A string value whose bytes are its text: no escape, no control byte. */
static int plain_string(const mg_json_member_t *m)
{
    if (m->value_len < 2 || m->value[0] != '"') return 0;
    for (size_t i = 1; i + 1 < m->value_len; i++)
        if ((unsigned char)m->value[i] < 0x20 || m->value[i] == '\\') return 0;
    return 1;
}

static int is_literal(const mg_json_member_t *m, const char *lit)
{
    size_t n = strlen(lit);
    return m->value_len == n && memcmp(m->value, lit, n) == 0;
}

/* A number value as cJSON reads it (the checked text makes the value exactly the number):
 * 1 and *out, 0 when not a number, -1 when too long to bother (the tree path reads it). */
static int number_value(const mg_json_member_t *m, long long *out)
{
    char num[64];
    if (m->value[0] != '-' && (m->value[0] < '0' || m->value[0] > '9')) return 0;
    if (m->value_len >= sizeof(num)) return -1;
    if (m->value_len <= 15 && m->value[0] != '-') { /* digits only: exact in a double */
        long long v = 0;
        size_t i = 0;
        while (i < m->value_len && m->value[i] >= '0' && m->value[i] <= '9')
            v = v * 10 + (m->value[i++] - '0');
        if (i == m->value_len) {
            *out = v;
            return 1;
        }
    }
    const char *dp = localeconv()->decimal_point; /* as cJSON, which hands '.' to strtod so */
    for (size_t i = 0; i < m->value_len; i++) num[i] = m->value[i] == '.' ? dp[0] : m->value[i];
    num[m->value_len] = '\0';
    *out = (long long)strtod(num, NULL);
    return 1;
}

/* stream_options.include_usage: 1 true, 0 anything else, -1 an escaped key. */
static int usage_flag(void *ud, const mg_json_member_t *m)
{
    int *flag = ud;
    if (has_escape(m->key, m->key_len)) *flag = -1;
    else if (member_is(m, "include_usage")) *flag = is_literal(m, "true");
    else return 0;
    return 1;
}

/* validate()'s rule for one chat message: an object whose first "role" is a string. */
static int role_member(void *ud, const mg_json_member_t *m)
{
    int *role = ud;
    if (has_escape(m->key, m->key_len)) *role = -1;
    else if (member_is(m, "role")) *role = m->value[0] == '"';
    else return 0;
    return 1;
}

static int message_ok(void *ud, const char *v, size_t n)
{
    int role = 0;
    if (v[0] != '{' || mg_json_members(v, n, role_member, &role) < 0 || role != 1) return 1;
    ++*(int *)ud;
    return 0;
}

/* validate()'s rule for the endpoint's main member, on the bytes. */
static int shape_ok(mg_endpoint_t ep, const fast_scan_t *f)
{
    const mg_json_member_t *m = &f->m[F_SHAPE];
    if (!f->keys[F_SHAPE]) return 1;
    if (!f->seen[F_SHAPE]) return 0;
    if (ep != MG_EP_CHAT) return m->value[0] == '"' || m->value[0] == '[';
    int n = 0;
    return m->value[0] == '[' && mg_json_elements(m->value, m->value_len, message_ok, &n) == 0 &&
           n > 0;
}

/* The output ceiling the client asked for, as the admit step reads it from the tree. */
static int fast_max_tokens(const fast_scan_t *f, long long *out)
{
    *out = -1;
    int rc = f->seen[F_MAX_TOKENS] ? number_value(&f->m[F_MAX_TOKENS], out) : 0;
    if (rc == 0 && f->seen[F_MAX_COMPLETION]) rc = number_value(&f->m[F_MAX_COMPLETION], out);
    return rc < 0 ? -1 : 0;
}

static int fast_stream(const fast_scan_t *f, fast_body_t *fb)
{
    const mg_json_member_t *st = &f->m[F_STREAM];
    if (f->seen[F_STREAM] && !is_literal(st, "true") && !is_literal(st, "false") &&
        !is_literal(st, "null"))
        return -1;
    fb->stream = f->seen[F_STREAM] && is_literal(st, "true");
    fb->include_usage = 0;
    const mg_json_member_t *so = &f->m[F_STREAM_OPTIONS];
    if (!f->seen[F_STREAM_OPTIONS] || so->value[0] != '{') return 0;
    int flag = 0;
    if (mg_json_members(so->value, so->value_len, usage_flag, &flag) < 0 || flag < 0) return -1;
    fb->include_usage = flag;
    return 0;
}

/* 0 = read (fb filled, the model copied into the request's arena); -1 = the tree path. */
static int fast_body(mg_http_req_t *req, mg_endpoint_t ep, fast_body_t *fb)
{
    fast_scan_t f = {.keys = {"model", "stream", NULL, "max_tokens", "max_completion_tokens",
                              "stream_options", "user", "n"}};
    f.keys[F_SHAPE] = ep == MG_EP_CHAT          ? "messages"
                      : ep == MG_EP_COMPLETIONS ? "prompt"
                      : ep == MG_EP_EMBEDDINGS  ? "input"
                                                : NULL;
    for (int k = 0; k < F_N; k++) f.key_len[k] = f.keys[k] ? strlen(f.keys[k]) : 0;
    f.all = mg_arena_alloc(&req->arena, FAST_MEMBERS * sizeof(*f.all));
    if (mg_json_check_members(req->body, req->body_len, fast_member, &f) != 0) return -1;
    fb->members = f.all && f.n_all <= FAST_MEMBERS ? f.all : NULL;
    fb->n_members = f.n_all;
    const mg_json_member_t *model = &f.m[F_MODEL];
    if (!f.seen[F_MODEL] || !plain_string(model) || model->value_len == 2) return -1;
    if (fast_stream(&f, fb) != 0 || !shape_ok(ep, &f) || fast_max_tokens(&f, &fb->max_tokens) != 0)
        return -1;
    fb->choices = 1;
    if (f.seen[F_CHOICES] && number_value(&f.m[F_CHOICES], &fb->choices) < 0) return -1;
    fb->user = NULL;
    fb->user_len = 0;
    if (f.seen[F_USER] && f.m[F_USER].value[0] == '"') {
        if (!plain_string(&f.m[F_USER])) return -1;
        fb->user = f.m[F_USER].value + 1;
        fb->user_len = f.m[F_USER].value_len - 2;
    }
    fb->model = mg_arena_strndup(&req->arena, model->value + 1, model->value_len - 2);
    return fb->model ? 0 : -1;
}

/* sanitize() and the caller's identity on the tree path: metadata (an extension, so read
 * before sanitize() strips it) names the application and the user. */
/* The application a request counts against (its caps, models and data policy): with auth on
 * the key's, whatever the body says (metadata.application cannot choose another); in open
 * mode the one the body names; either way auth.default_application when that gives none.
 * NULL when no such application is configured. */
static const mg_app_conf_t *app_of(const call_t *c, const char *named)
{
    const mg_config_t *cfg = c->gen->cfg;
    const char *name = !cfg->auth_enabled ? named : c->auth.rec ? c->auth.rec->application : NULL;
    if (!name) name = cfg->default_application;
    return name ? mg_config_app(cfg, name) : NULL;
}

static void sanitize_tree(call_t *c)
{
    cJSON *req_meta = cJSON_DetachItemFromObjectCaseSensitive(c->body, "metadata");
    sanitize(c);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(req_meta, "application");
    c->app = app_of(c, cJSON_IsString(meta) ? meta->valuestring : NULL);
    const cJSON *uid = cJSON_GetObjectItemCaseSensitive(req_meta, "user_id");
    if (!cJSON_IsString(uid)) uid = cJSON_GetObjectItemCaseSensitive(c->body, "user");
    free(c->user); /* (a call parses once; this keeps it so if that changes) */
    c->user = NULL;
    if (cJSON_IsString(uid) && uid->valuestring[0])
        c->user = strndup(uid->valuestring, MG_CALL_USER_MAX);
    cJSON_Delete(req_meta);
}

/* The same from the fast path's view: no extension, so nothing is mapped or stripped and
 * there is no metadata. */
static void sanitize_fast(call_t *c, const fast_body_t *fb)
{
    c->body_members = fb->members;
    c->n_body_members = fb->n_members;
    c->mapped_max_tokens = -1;
    c->stream = fb->stream && c->ep != MG_EP_EMBEDDINGS;
    c->client_include_usage = c->stream && fb->include_usage;
    c->app = app_of(c, NULL);
    size_t n = fb->user_len < MG_CALL_USER_MAX ? fb->user_len : MG_CALL_USER_MAX;
    free(c->user);
    c->user = fb->user && n ? strndup(fb->user, n) : NULL;
}

/* The client's output ceiling on the tree path (after sanitize(), which may have mapped
 * max_output_tokens to max_tokens); -1 when it sets none. */
static long long tree_max_tokens(const cJSON *body)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (!cJSON_IsNumber(mt)) mt = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens");
    return mg_json_ll(mt, -1);
}

/* The tree's side of a lowered output ceiling (see take_admission). */
void cap_tree_tokens(call_t *c)
{
    cJSON_DeleteItemFromObjectCaseSensitive(c->body, "max_completion_tokens");
    set_item(c->body, "max_tokens", cJSON_CreateNumber((double)c->mapped_max_tokens));
}

/* The sanitized tree of the client's body, for an adapter that encodes from it. After the
 * fast path it is parsed on the first such attempt, with the edits sanitize() and
 * take_admission() would have made (for a body without extensions: stream_options and the
 * lowered ceiling). NULL when out of memory. */
cJSON *call_tree(call_t *c)
{
    if (c->body || !c->req) return c->body;
    c->body = cJSON_ParseWithLength(c->req->body, c->req->body_len);
    if (!c->body) return NULL;
    mg_json_keep_big_ints(c->body, c->req->body, c->req->body_len); /* a seed kept exact */
    if (c->stream) set_item(c->body, "stream_options", usage_options());
    if (c->tokens_capped) cap_tree_tokens(c);
    return c->body;
}

typedef struct {
    call_t *c;
    mg_buf_t *out;
} splice_t;

/* An extension member the upstream gets too: metadata for a provider that reads it as its
 * own parameter (forward: [metadata]), and an integer priority, which is the engine's (vLLM's
 * priority scheduling; the gateway's is a P0..P4 string or X-Priority). */
static int forwarded(const call_t *c, const mg_json_member_t *m)
{
    if (member_is(m, "metadata")) return (c->provider->forward & MG_FORWARD_METADATA) != 0;
    if (member_is(m, "priority"))
        return m->value[0] == '-' || (m->value[0] >= '0' && m->value[0] <= '9');
    return 0;
}

static int splice_member(void *ud, const mg_json_member_t *m)
{
    splice_t *sp = ud;
    if ((is_extension(m) && !forwarded(sp->c, m)) || member_is(m, "model") ||
        (sp->c->stream && member_is(m, "stream_options")))
        return 0;
    if (sp->c->tokens_capped &&
        (member_is(m, "max_tokens") || member_is(m, "max_completion_tokens")))
        return 0;
    append_member(sp->out, m, "", ",");
    return 0;
}

/* The upstream body for a passthrough adapter, spliced from the client's bytes:
 * the same members minus the extensions (but those the provider gets too), with the route's
 * model and, for a stream, the gateway's stream_options (unless the provider refuses them:
 * stream_usage: false). Equivalent to printing the sanitized tree, at a fraction of the
 * cost. */
int passthrough_body(call_t *c, const char *model, mg_buf_t *out)
{
    if (context_rewritten(c)) { /* the messages are the tree's now */
        set_item(c->body, "model", cJSON_CreateString(model));
        if (c->stream && c->provider->no_stream_usage)
            cJSON_DeleteItemFromObjectCaseSensitive(c->body, "stream_options");
        return mg_json_print(c->body, out);
    }
    splice_t sp = {c, out};
    /* room for all of it up front: the members, the model (escaping reserve included), the
       options; growth would copy the body once more per doubling */
    mg_buf_reserve(out, c->req->body_len + 6 * strlen(model) + 96);
    mg_buf_append(out, "{", 1);
    if (c->body_members) {
        for (size_t i = 0; i < c->n_body_members; i++) splice_member(&sp, &c->body_members[i]);
    } else if (mg_json_members(c->req->body, c->req->body_len, splice_member, &sp) != 0) {
        return -1;
    }
    mg_buf_append(out, "\"model\":", 8);
    mg_json_print_string(model, strlen(model), out);
    if (c->stream && !c->provider->no_stream_usage)
        mg_buf_append_str(out, ",\"stream_options\":{\"include_usage\":true}");
    if (c->mapped_max_tokens >= 0) {
        mg_buf_append_str(out, ",\"max_tokens\":");
        mg_json_print_number((double)c->mapped_max_tokens, out);
    }
    return mg_buf_append(out, "}", 1);
}

/* The body's "timeouts": {queue_ms, first_token_ms, inference_ms, total_ms}, positive integers;
 * each is capped later by the configured value (a client may ask for less, never more). */
static const char *timeout_inputs(const cJSON *body, routing_input_t *in)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "timeouts");
    if (!t || cJSON_IsNull(t)) return NULL;
    if (!cJSON_IsObject(t)) return "'timeouts' must be an object";
    static const char *const keys[] = {"queue_ms", "first_token_ms", "inference_ms", "total_ms"};
    int *dst[] = {&in->queue_ms, &in->first_token_ms, &in->inference_ms, &in->total_ms};
    for (int i = 0; i < 4; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 86400000)
            return "'timeouts' values must be positive integers of milliseconds";
        *dst[i] = (int)v->valuedouble;
    }
    return NULL;
}

static const char *priority_of(const cJSON *body, const mg_http_req_t *req, const char **problem)
{
    static const char *const levels[] = {"P0", "P1", "P2", "P3", "P4"};
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "priority");
    if (p && !cJSON_IsNull(p) && !cJSON_IsNumber(p)) { /* a number is the engine's */
        for (int i = 0; i < 5; i++)
            if (cJSON_IsString(p) && strcmp(p->valuestring, levels[i]) == 0) return levels[i];
        *problem = "'priority' must be one of P0, P1, P2, P3, P4 (or an integer: the engine's)";
        return NULL;
    }
    /* X-Priority: P0..P4, or the Sidecar V1's words urgent/high/normal/low = P0..P3 */
    static const char *const words[] = {"urgent", "high", "normal", "low"};
    const char *h = mg_http_header(req, "X-Priority");
    for (int i = 0; h && i < 5; i++)
        if (strcasecmp(h, levels[i]) == 0 || (i < 4 && strcasecmp(h, words[i]) == 0))
            return levels[i];
    return "P2";
}

static const char *routing_inputs(const cJSON *body, const mg_http_req_t *req, routing_input_t *in)
{
    const char *problem = NULL;
    memset(in, 0, sizeof(*in));
    in->allow_smaller_model = -1;
    in->priority = priority_of(body, req, &problem);
    if (problem) return problem;
    const char *pool = mg_http_header(req, "X-Sidecar-Pool");
    if (pool && *pool) {
        if (strcmp(pool, "main") != 0 && strcmp(pool, "fallback") != 0)
            return "X-Sidecar-Pool must be main or fallback";
        in->pool = pool;
    }
    const char *pin = mg_http_header(req, "X-Sidecar-Provider");
    if (pin && *pin) {
        snprintf(in->pin, sizeof(in->pin), "%s", pin);
        in->has_pin = 1;
    }
    const cJSON *routing = cJSON_GetObjectItemCaseSensitive(body, "routing");
    if (routing && !cJSON_IsNull(routing)) {
        if (!cJSON_IsObject(routing)) return "'routing' must be an object";
        const cJSON *lo = cJSON_GetObjectItemCaseSensitive(routing, "local_only");
        const cJSON *sm = cJSON_GetObjectItemCaseSensitive(routing, "allow_smaller_model");
        if ((lo && !cJSON_IsBool(lo)) || (sm && !cJSON_IsBool(sm)))
            return "'routing.local_only' and 'routing.allow_smaller_model' must be booleans";
        in->local_only = cJSON_IsTrue(lo);
        if (sm) in->allow_smaller_model = cJSON_IsTrue(sm);
    }
    return timeout_inputs(body, in);
}

/* ------------------------------------------------------------------------ */
/* The step                                                                  */
/* ------------------------------------------------------------------------ */

mg_step_rc_t step_parse(call_t *c)
{
    mg_http_req_t *req = c->req;
    if (!req->body_len) return call_error(c, 400, "INVALID_REQUEST", "request body is empty", 0);
    if (c->front_messages && msgs_parse(c) != 0) return MG_STEP_NEXT; /* its 400 */
    const char *problem;
    int waiting = 0;
    if (c->ep == MG_EP_RESPONSES) { /* its chat body is made from it (responses_call.c) */
        waiting = responses_parse(c);
        if (waiting < 0) return MG_STEP_NEXT; /* to finish */
        problem = routing_inputs(c->body, req, &c->in);
    } else if (fast_body(req, c->ep, &c->fb) == 0) {
        c->fast = 1;
        problem = routing_inputs(NULL, req, &c->in); /* no extension: only the headers count */
    } else {
        c->body = cJSON_ParseWithLength(req->body, req->body_len);
        if (!cJSON_IsObject(c->body))
            return call_error(c, 400, "INVALID_REQUEST", "request body is not a JSON object", 0);
        if (mg_json_keep_big_ints(c->body, req->body, req->body_len) != 0)
            return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
        problem = validate(c->ep, c->body);
        if (!problem) problem = routing_inputs(c->body, req, &c->in);
    }
    if (problem) return call_error(c, 400, "INVALID_REQUEST", problem, 0);
    c->priority = c->in.priority;
    if (!waiting) return MG_STEP_NEXT;
    c->step = STEP_IDENTIFY; /* the previous response's lookup resumes the call there */
    return MG_STEP_AGAIN;
}

void body_sanitize(call_t *c)
{
    if (c->fast) {
        sanitize_fast(c, &c->fb);
        c->max_tokens = c->fb.max_tokens;
        c->n_choices = c->fb.choices;
    } else {
        sanitize_tree(c);
        c->max_tokens = tree_max_tokens(c->body);
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c->body, "n");
        c->n_choices = mg_json_ll(n, 1);
    }
    if (c->n_choices < 1) c->n_choices = 1;
}
