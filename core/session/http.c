/* http: the session endpoints; see http.h. */
#include "session/http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "obs/answer.h"

static void not_found(mg_metrics_t *m, mg_http_req_t *req)
{
    mg_answer_error(m, req, MG_EP_OTHER, 404, "SESSION_NOT_FOUND", "no such session", 0);
}

static void bad(mg_metrics_t *m, mg_http_req_t *req, const char *msg)
{
    mg_answer_error(m, req, MG_EP_OTHER, 400, "INVALID_REQUEST", msg, 0);
}

cJSON *mg_session_json(const mg_session_t *x)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", x->id);
    cJSON_AddStringToObject(o, "object", "session");
    if (x->model) cJSON_AddStringToObject(o, "model", x->model);
    else cJSON_AddNullToObject(o, "model");
    if (x->system) cJSON_AddStringToObject(o, "system", x->system);
    else cJSON_AddNullToObject(o, "system");
    cJSON_AddNumberToObject(o, "max_messages", x->max_messages);
    if (x->max_tokens) cJSON_AddNumberToObject(o, "max_tokens", (double)x->max_tokens);
    else cJSON_AddNullToObject(o, "max_tokens");
    cJSON_AddNumberToObject(o, "ttl_seconds", x->ttl_s);
    cJSON_AddNumberToObject(o, "idle_timeout_seconds", x->idle_s);
    if (x->policy) cJSON_AddStringToObject(o, "context_policy", x->policy);
    else cJSON_AddNullToObject(o, "context_policy");
    cJSON *meta = x->metadata ? cJSON_Parse(x->metadata) : NULL;
    if (meta) cJSON_AddItemToObject(o, "metadata", meta);
    else cJSON_AddObjectToObject(o, "metadata");
    cJSON_AddNumberToObject(o, "message_count", (double)x->n_msgs);
    cJSON_AddNumberToObject(o, "token_count", (double)mg_session_tokens(x));
    if (x->summary) cJSON_AddStringToObject(o, "summary", x->summary);
    else cJSON_AddNullToObject(o, "summary");
    cJSON_AddNumberToObject(o, "created_at", (double)(x->created_ms / 1000));
    cJSON_AddNumberToObject(o, "last_active_at", (double)(x->last_active_ms / 1000));
    cJSON_AddNumberToObject(o, "expires_at", (double)(mg_session_expires_ms(x) / 1000));
    return o;
}

/* A positive integer member no larger than max, or 0 when absent; -1 when invalid. */
static long long pos_int(const cJSON *body, const char *key, long long max)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > (double)max ||
        v->valuedouble != (double)(long long)v->valuedouble)
        return -1;
    return (long long)v->valuedouble;
}

static const char *opt_str(const cJSON *body, const char *key, int *bad_type)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v)) *bad_type = 1;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The body's settings into spec; NULL when fine, else the problem. meta_text: owned out. */
static const char *read_spec(const cJSON *body, const mg_config_t *cfg, mg_session_spec_t *spec,
                             char **meta_text)
{
    int bad_type = 0;
    memset(spec, 0, sizeof(*spec));
    spec->model = opt_str(body, "model", &bad_type);
    spec->system = opt_str(body, "system", &bad_type);
    spec->policy = opt_str(body, "context_policy", &bad_type);
    if (bad_type) return "'model', 'system' and 'context_policy' must be strings";
    if (spec->model && !mg_config_model(cfg, spec->model))
        return "'model' is not a model of this gateway";
    if (spec->policy && !mg_context_policy_known(spec->policy))
        return "'context_policy' must be summary_and_recent, recent_only or none";
    long long mm = pos_int(body, "max_messages", 100000),
              mt = pos_int(body, "max_tokens", 100000000);
    long long ttl = pos_int(body, "ttl_seconds", 10ll * 365 * 86400);
    long long idle = pos_int(body, "idle_timeout_seconds", 10ll * 365 * 86400);
    if (mm < 0 || mt < 0 || ttl < 0 || idle < 0)
        return "'max_messages', 'max_tokens', 'ttl_seconds' and 'idle_timeout_seconds' must be "
               "positive integers";
    if (mm == 1) return "'max_messages' must be at least 2 (a turn is a question and its answer)";
    spec->max_messages = (int)mm;
    spec->max_tokens = mt;
    spec->ttl_s = (int)ttl;
    spec->idle_s = (int)idle;
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(body, "metadata");
    if (meta && !cJSON_IsNull(meta)) {
        if (!cJSON_IsObject(meta)) return "'metadata' must be an object";
        *meta_text = cJSON_PrintUnformatted(meta);
        if (*meta_text && strlen(*meta_text) > 16384) return "'metadata' is larger than 16 KiB";
        spec->metadata = *meta_text;
    }
    return NULL;
}

static void create(mg_sessions_t *s, mg_metrics_t *m, const mg_config_t *cfg, mg_http_req_t *req,
                   const mg_session_owner_t *owner)
{
    cJSON *body =
        req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : cJSON_CreateObject();
    if (!cJSON_IsObject(body)) {
        cJSON_Delete(body);
        bad(m, req, "the body must be a JSON object");
        return;
    }
    mg_session_spec_t spec;
    char *meta = NULL;
    const char *problem = read_spec(body, cfg, &spec, &meta);
    mg_session_t *x =
        problem ? NULL : mg_sessions_create(s, owner, &spec, &cfg->context, mg_unix_ms());
    cJSON_Delete(body);
    free(meta);
    if (problem) bad(m, req, problem);
    else if (!x) mg_answer_error(m, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
    else mg_answer_tree(m, req, MG_EP_OTHER, 201, mg_session_json(x));
}

/* The value of query parameter `key` into out (no decoding: ids and numbers need none). */
static int query_param(const char *q, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = q; p && *p;) {
        if (strncmp(p, key, kl) == 0 && p[kl] == '=') {
            const char *v = p + kl + 1;
            size_t n = strcspn(v, "&");
            if (n >= cap) n = cap - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 1;
        }
        p = strchr(p, '&');
        if (p) p++;
    }
    return 0;
}

static void messages(mg_metrics_t *m, mg_http_req_t *req, const mg_session_t *x)
{
    char v[64];
    long limit = 20;
    int64_t after = 0;
    if (query_param(req->query, "limit", v, sizeof(v))) {
        limit = atol(v);
        if (limit < 1 || limit > 100) {
            bad(m, req, "'limit' must be between 1 and 100");
            return;
        }
    }
    if (query_param(req->query, "after", v, sizeof(v))) {
        if (strncmp(v, "msg_", 4) != 0 || atoll(v + 4) < 0) {
            bad(m, req, "'after' must be a message id (msg_N) from an earlier page");
            return;
        }
        after = atoll(v + 4);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    size_t i = 0;
    while (i < x->n_msgs && x->msgs[i].seq <= after) i++;
    char first[32] = "", last[32] = "";
    for (long n = 0; i < x->n_msgs && n < limit; i++, n++) {
        const mg_session_msg_t *msg = &x->msgs[i];
        cJSON *o = cJSON_CreateObject();
        snprintf(last, sizeof(last), "msg_%lld", (long long)msg->seq);
        if (!first[0]) memcpy(first, last, sizeof(first));
        cJSON_AddStringToObject(o, "id", last);
        cJSON_AddStringToObject(o, "object", "session.message");
        cJSON_AddNumberToObject(o, "created_at", (double)(msg->created_ms / 1000));
        if (msg->tokens >= 0) cJSON_AddNumberToObject(o, "tokens", (double)msg->tokens);
        cJSON *body = cJSON_Parse(msg->json);
        cJSON_AddItemToObject(o, "message", body ? body : cJSON_CreateNull());
        cJSON_AddItemToArray(data, o);
    }
    if (first[0]) cJSON_AddStringToObject(root, "first_id", first);
    else cJSON_AddNullToObject(root, "first_id");
    if (last[0]) cJSON_AddStringToObject(root, "last_id", last);
    else cJSON_AddNullToObject(root, "last_id");
    cJSON_AddBoolToObject(root, "has_more", i < x->n_msgs);
    mg_answer_tree(m, req, MG_EP_OTHER, 200, root);
}

void mg_sessions_http(mg_sessions_t *s, mg_metrics_t *m, const mg_config_t *cfg, mg_http_req_t *req,
                      const char *rest, const mg_session_owner_t *owner)
{
    if (!*rest) {
        if (req->method != HTTP_POST)
            mg_answer_error(m, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED", "use POST", 0);
        else create(s, m, cfg, req, owner);
        return;
    }
    char id[MG_SESSION_ID_LEN + 2];
    const char *slash = strchr(rest + 1, '/');
    size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    const char *sub = slash ? slash : "";
    if (n == 0 || n > MG_SESSION_ID_LEN || (*sub && strcmp(sub, "/messages") != 0)) {
        mg_answer_error(m, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such endpoint", 0);
        return;
    }
    memcpy(id, rest + 1, n);
    id[n] = '\0';
    int ok = *sub ? req->method == HTTP_GET : req->method == HTTP_GET || req->method == HTTP_DELETE;
    if (!ok) {
        mg_answer_error(m, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED",
                        *sub ? "use GET" : "use GET or DELETE", 0);
        return;
    }
    mg_session_t *x = mg_sessions_find(s, id, owner, &cfg->context, mg_unix_ms());
    if (!x) {
        not_found(m, req);
        return;
    }
    if (*sub) {
        messages(m, req, x);
    } else if (req->method == HTTP_GET) {
        mg_answer_tree(m, req, MG_EP_OTHER, 200, mg_session_json(x));
    } else if (x->holder) {
        mg_answer_error(m, req, MG_EP_OTHER, 409, "SESSION_BUSY",
                        "a request on this session is running; delete it when that ends", 1000);
    } else {
        mg_sessions_delete(s, x);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "session.deleted");
        cJSON_AddTrueToObject(o, "deleted");
        mg_answer_tree(m, req, MG_EP_OTHER, 200, o);
    }
}
