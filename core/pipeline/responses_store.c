/* responses_store: stored Responses; see responses_store.h.
 *
 * Memory holds the records whose write has not committed yet (all of them without a
 * store, the newest MG_RESP_MEMORY_MAX), newest first: a lookup looks there first, and only
 * then asks the database from the thread pool. A lookup is always answered from the thread
 * pool's after-work callback, so its callback never runs inside the call that asked. */
#include "pipeline/responses_store.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crypto.h"
#include "base/log.h"
#include "net/endpoint.h"
#include "obs/answer.h"

/* A record's texts, owned. */
typedef struct {
    char *scope, *response, *input, *messages;
} texts_t;

typedef struct rec_s {
    struct rec_s *next;
    mg_resp_store_t *rs;
    char *id; /* owned */
    texts_t t;
    int committing; /* its write is queued: it leaves memory when that commits */
} rec_t;

struct mg_resp_store_s {
    mg_resp_store_deps_t d;
    int64_t last_key; /* the newest row key given out (or found in the table at start) */
    rec_t *recs;      /* owned, newest first */
    int n_recs;
};

struct mg_resp_lookup_s {
    uv_work_t work;
    mg_resp_store_t *rs;
    mg_resp_found_fn cb; /* NULL: cancelled */
    void *ud;
    char id[96];
    long long now_s;
    int found;
    texts_t t;
};

static long long unix_s(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (long long)tv.tv_sec;
}

static void texts_free(texts_t *t)
{
    free(t->scope);
    free(t->response);
    free(t->input);
    free(t->messages);
    memset(t, 0, sizeof(*t));
}

/* Copy the four texts; 0, or -1 (out of memory: t freed). */
static int texts_copy(texts_t *t, const char *scope, const char *response, const char *input,
                      const char *messages)
{
    t->scope = strdup(scope);
    t->response = strdup(response);
    t->input = strdup(input);
    t->messages = strdup(messages);
    if (t->scope && t->response && t->input && t->messages) return 0;
    texts_free(t);
    return -1;
}

static mg_resp_record_t record_of(const texts_t *t)
{
    return (mg_resp_record_t){t->scope, t->response, t->input, t->messages};
}

static void rec_free(rec_t *r)
{
    free(r->id);
    texts_free(&r->t);
    free(r);
}

/* Unlink r from memory (it is committed, deleted, or pushed out). */
static void rec_unlink(mg_resp_store_t *rs, rec_t *r)
{
    for (rec_t **pp = &rs->recs; *pp; pp = &(*pp)->next) {
        if (*pp != r) continue;
        *pp = r->next;
        rs->n_recs--;
        return;
    }
}

static rec_t *rec_find(mg_resp_store_t *rs, const char *id)
{
    for (rec_t *r = rs->recs; r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

/* Keys are unix ms << 16 (so above every key of migration 23's rows of before, < 2^56)
 * and grow by one at least: up to 65,536 ids a millisecond stay in time order. */
#define KEY_SHIFT 16
#define KEY_LEGACY_MAX 72057594037927936ll /* 2^56: the partial index's bound */

static int hex_digit(char ch)
{
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

int64_t mg_resp_store_key(const char *id)
{
    if (strncmp(id, "resp_", 5) != 0 || strlen(id) != 5 + 16 + 24) return -1;
    uint64_t k = 0;
    for (int i = 0; i < 16 + 24; i++) {
        int d = hex_digit(id[5 + i]);
        if (d < 0) return -1;
        if (i < 16) k = k << 4 | (uint64_t)d;
    }
    return k >= (uint64_t)KEY_LEGACY_MAX && k <= (uint64_t)INT64_MAX ? (int64_t)k : -1;
}

int mg_resp_store_new_id(mg_resp_store_t *rs, const char *random_hex, char *out, size_t cap)
{
    size_t n = strlen(random_hex);
    if (n > 24) random_hex += n - 24;
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    int64_t key = ((int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000) << KEY_SHIFT;
    if (rs && key <= rs->last_key) key = rs->last_key + 1; /* the clock went back, or a burst */
    if (rs) rs->last_key = key;
    int w = snprintf(out, cap, "resp_%016llx%.24s", (unsigned long long)key, random_hex);
    return w > 0 && (size_t)w < cap ? 0 : -1;
}

static void max_key_row(void *ud, int ncols, const char *const *cols)
{
    if (ncols > 0 && cols[0]) *(int64_t *)ud = strtoll(cols[0], NULL, 10);
}

mg_resp_store_t *mg_resp_store_new(const mg_resp_store_deps_t *d)
{
    mg_resp_store_t *rs = calloc(1, sizeof(*rs));
    if (!rs) return NULL;
    rs->d = *d;
    if (rs->d.retention_s <= 0) rs->d.retention_s = MG_RESP_RETENTION_DEFAULT_S;
    if (rs->d.store) {
        char now[24], err[256];
        snprintf(now, sizeof(now), "%lld", unix_s());
        const char *p[1] = {now};
        /* before the loop runs: new keys stay above the table's (a clock set back) */
        if (mg_store_query(rs->d.store, "SELECT max(rid) FROM responses", 0, NULL, max_key_row,
                           &rs->last_key, err, sizeof(err)) != 0)
            mg_log_msg(MG_LOG_WARN, NULL, "responses: cannot read the newest key: %s", err);
        /* expired rows: every row older than the oldest live one (keys are in time order;
         * a newer row that expired sooner, after retention was shortened, is never
         * returned and goes once the rows before it went) */
        mg_store_write(rs->d.store,
                       "DELETE FROM responses WHERE rid < coalesce((SELECT rid FROM responses"
                       " WHERE expires_at > CAST(?1 AS INTEGER) ORDER BY rid LIMIT 1),"
                       " 9223372036854775807)",
                       1, p);
    }
    return rs;
}

void mg_resp_store_free(mg_resp_store_t *rs)
{
    if (!rs) return;
    while (rs->recs) {
        rec_t *r = rs->recs;
        rs->recs = r->next;
        if (r->committing) r->rs = NULL; /* its commit callback frees it (mg_store_close) */
        else rec_free(r);
    }
    free(rs);
}

void mg_resp_scope(const mg_auth_result_t *auth, const mg_http_req_t *req, char *out, size_t cap)
{
    if (auth) {
        /* the key's record holds its project until admission fills project_id (auth.h) */
        long long project =
            auth->rec ? (long long)auth->rec->project_id : (long long)auth->project_id;
        snprintf(out, cap, "tenant:%lld/project:%lld", (long long)auth->tenant_id, project);
        return;
    }
    const char *cred = mg_http_header(req, "Authorization");
    if (!cred) cred = mg_http_header(req, "x-api-key");
    char digest[65] = "-";
    if (cred) mg_sha256_hex(cred, strlen(cred), digest);
    snprintf(out, cap, "cred:%s", digest);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */
/* ------------------------------------------------------------------------ */

static void on_committed(void *ud, int rc)
{
    rec_t *r = ud;
    if (rc != 0) mg_log_msg(MG_LOG_WARN, NULL, "responses: response %s was not stored", r->id);
    if (r->rs) rec_unlink(r->rs, r);
    rec_free(r);
}

/* Without a store, memory is the store: the oldest records beyond the cap leave. */
static void trim_memory(mg_resp_store_t *rs)
{
    if (rs->n_recs <= MG_RESP_MEMORY_MAX) return;
    rec_t **pp = &rs->recs;
    for (int i = 0; *pp && i < MG_RESP_MEMORY_MAX; i++) pp = &(*pp)->next;
    while (*pp) {
        rec_t *r = *pp;
        *pp = r->next;
        rs->n_recs--;
        rec_free(r);
    }
}

int mg_resp_store_put(mg_resp_store_t *rs, const char *id, const mg_resp_record_t *rec)
{
    int64_t key = rs->d.store ? mg_resp_store_key(id) : 0;
    if (key < 0) {
        mg_log_msg(MG_LOG_WARN, NULL, "responses: %s is not an id this store gave out", id);
        return -1;
    }
    rec_t *r = calloc(1, sizeof(*r));
    if (!r) return -1;
    r->rs = rs;
    r->id = strdup(id);
    if (!r->id || texts_copy(&r->t, rec->scope, rec->response, rec->input, rec->messages) != 0) {
        rec_free(r);
        return -1;
    }
    r->next = rs->recs;
    rs->recs = r;
    rs->n_recs++;
    if (!rs->d.store) {
        trim_memory(rs);
        return 0;
    }
    long long now = unix_s();
    const mg_gen_t *g = rs->d.gens ? mg_gens_current(rs->d.gens) : NULL;
    int retention = g && g->cfg->protocols.responses_retention_s > 0
                        ? g->cfg->protocols.responses_retention_s /* a reload's, from now on */
                        : rs->d.retention_s;
    const mg_store_val_t v[8] = {
        {.kind = MG_STORE_INT, .i = key},         {.kind = MG_STORE_INT, .i = now + retention},
        {.kind = MG_STORE_INT, .i = now},         {.kind = MG_STORE_TEXT, .s = id},
        {.kind = MG_STORE_TEXT, .s = rec->scope}, {.kind = MG_STORE_TEXT, .s = rec->response},
        {.kind = MG_STORE_TEXT, .s = rec->input}, {.kind = MG_STORE_TEXT, .s = rec->messages},
    };
    r->committing = 1;
    /* a plain INSERT: a key taken (it cannot be: keys only grow) fails, logged, never
     * replacing another Response */
    if (mg_store_write_vals(
            rs->d.store,
            "INSERT INTO responses(rid, expires_at, created_at, id, scope, response,"
            " input, messages) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            8, v, NULL, on_committed, r) == 0)
        return 0;
    mg_log_msg(MG_LOG_WARN, NULL, "responses: the store is not writable; response %s not kept", id);
    rec_unlink(rs, r);
    rec_free(r);
    return -1;
}

/* The record leaves memory and the database (a delete queued after its insert, which the
 * writer runs in order); done(ud, rc) once the delete committed (at once without a store).
 * 0, or -1 when the delete could not be queued (done is not called). */
static int forget(mg_resp_store_t *rs, const char *id, mg_store_done_fn done, void *ud)
{
    rec_t *r = rec_find(rs, id);
    if (r) {
        rec_unlink(rs, r);
        if (r->committing) r->rs = NULL;
        else rec_free(r);
    }
    if (!rs->d.store) {
        done(ud, 0);
        return 0;
    }
    int64_t key = mg_resp_store_key(id);
    const mg_store_val_t v[2] = {{.kind = MG_STORE_TEXT, .s = id},
                                 {.kind = MG_STORE_INT, .i = key}};
    if (key < 0) /* a row of before migration 23: by its id, through the partial index */
        return mg_store_write_vals(
            rs->d.store, "DELETE FROM responses WHERE id = ?1 AND rid < 72057594037927936", 1, v,
            NULL, done, ud);
    return mg_store_write_vals(rs->d.store, "DELETE FROM responses WHERE rid = ?2 AND id = ?1", 2,
                               v, NULL, done, ud);
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */
/* ------------------------------------------------------------------------ */

static void lookup_row(void *ud, int ncols, const char *const *cols)
{
    mg_resp_lookup_t *l = ud;
    if (ncols < 4 || l->found || !cols[0] || !cols[1] || !cols[2] || !cols[3]) return;
    l->found = texts_copy(&l->t, cols[0], cols[1], cols[2], cols[3]) == 0;
}

/* Thread pool: the row, unless memory answered already. */
static void lookup_work(uv_work_t *w)
{
    mg_resp_lookup_t *l = w->data;
    if (l->found || !l->rs->d.store) return;
    char now[24], key[24], err[256];
    int64_t k = mg_resp_store_key(l->id);
    snprintf(now, sizeof(now), "%lld", l->now_s);
    snprintf(key, sizeof(key), "%lld", (long long)k);
    const char *p[3] = {l->id, now, key};
    /* by key and id; an id of before migration 23 by the partial index */
    const char *sql = k >= 0 ? "SELECT scope, response, input, messages FROM responses"
                               " WHERE rid = CAST(?3 AS INTEGER) AND id = ?1"
                               " AND expires_at > CAST(?2 AS INTEGER)"
                             : "SELECT scope, response, input, messages FROM responses"
                               " WHERE id = ?1 AND rid < 72057594037927936"
                               " AND expires_at > CAST(?2 AS INTEGER)";
    if (mg_store_query(l->rs->d.store, sql, k >= 0 ? 3 : 2, p, lookup_row, l, err, sizeof(err)) !=
        0)
        mg_log_msg(MG_LOG_WARN, NULL, "responses: cannot read a stored response: %s", err);
}

static void lookup_done(uv_work_t *w, int status)
{
    mg_resp_lookup_t *l = w->data;
    (void)status;
    if (l->cb) {
        mg_resp_record_t rec = record_of(&l->t);
        l->cb(l->ud, l->found ? &rec : NULL);
    }
    texts_free(&l->t);
    free(l);
}

mg_resp_lookup_t *mg_resp_store_get(mg_resp_store_t *rs, const char *id, mg_resp_found_fn cb,
                                    void *ud)
{
    mg_resp_lookup_t *l = calloc(1, sizeof(*l));
    if (!l) return NULL;
    l->rs = rs;
    l->cb = cb;
    l->ud = ud;
    l->now_s = unix_s();
    snprintf(l->id, sizeof(l->id), "%s", id);
    const rec_t *r = strlen(id) < sizeof(l->id) ? rec_find(rs, id) : NULL;
    if (r) {
        lookup_row(l, 4,
                   (const char *const[]){r->t.scope, r->t.response, r->t.input, r->t.messages});
        if (!l->found) {
            free(l);
            return NULL;
        }
    } else if (strlen(id) >= sizeof(l->id)) {
        l->id[0] = '\0'; /* no such id: the query finds nothing */
    }
    l->work.data = l;
    if (uv_queue_work(rs->d.loop, &l->work, lookup_work, lookup_done) != 0) {
        texts_free(&l->t);
        free(l);
        return NULL;
    }
    return l;
}

void mg_resp_lookup_cancel(mg_resp_lookup_t *l)
{
    if (l) l->cb = NULL;
}

/* ------------------------------------------------------------------------ */
/* GET / DELETE /v1/responses/{id}                                           */
/* ------------------------------------------------------------------------ */

typedef struct {
    mg_resp_store_t *rs;
    mg_http_req_t *req; /* NULL once the client left */
    mg_resp_lookup_t *lookup;
    char scope[128];
    char id[96];
    mg_resp_path_t what;
    /* GET .../input_items */
    int limit, asc;
    char after[96]; /* "": from the first */
} api_call_t;

/* The value of key in a query string ("a=1&b=2") into buf; 1 when present. */
static int query_value(const char *q, const char *key, char *buf, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, key, kl) != 0 || p[kl] != '=') continue;
        const char *v = p + kl + 1, *end = strchr(v, '&');
        size_t n = end ? (size_t)(end - v) : strlen(v);
        snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), v);
        return 1;
    }
    return 0;
}

/* limit, order and after of an input_items request; NULL, or what is wrong. */
static const char *list_params(api_call_t *a, const char *q)
{
    char v[96];
    a->limit = 20;
    a->asc = 0;
    if (query_value(q, "limit", v, sizeof(v))) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 100) return "'limit' must be an integer from 1 to 100";
        a->limit = (int)n;
    }
    if (query_value(q, "order", v, sizeof(v))) {
        if (strcmp(v, "asc") != 0 && strcmp(v, "desc") != 0) return "'order' must be asc or desc";
        a->asc = strcmp(v, "asc") == 0;
    }
    if (!query_value(q, "after", a->after, sizeof(a->after))) a->after[0] = '\0';
    return NULL;
}

/* The input items as a list page: in the order asked, from after the `after` item. */
static cJSON *items_page(const api_call_t *a, const char *input)
{
    cJSON *items = cJSON_Parse(input);
    cJSON *page = cJSON_CreateObject();
    cJSON_AddStringToObject(page, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(page, "data");
    int n = cJSON_GetArraySize(items), taken = 0, more = 0, started = !a->after[0];
    for (int k = 0; k < n; k++) {
        cJSON *it = cJSON_GetArrayItem(items, a->asc ? k : n - 1 - k);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (!started) {
            started = cJSON_IsString(id) && strcmp(id->valuestring, a->after) == 0;
            continue;
        }
        if (taken == a->limit) {
            more = 1;
            break;
        }
        cJSON_AddItemToArray(data, cJSON_Duplicate(it, 1));
        taken++;
    }
    const cJSON *first = cJSON_GetObjectItemCaseSensitive(data->child, "id");
    const cJSON *last = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, taken - 1), "id");
    if (cJSON_IsString(first)) cJSON_AddStringToObject(page, "first_id", first->valuestring);
    else cJSON_AddNullToObject(page, "first_id");
    if (cJSON_IsString(last)) cJSON_AddStringToObject(page, "last_id", last->valuestring);
    else cJSON_AddNullToObject(page, "last_id");
    cJSON_AddBoolToObject(page, "has_more", more);
    cJSON_Delete(items);
    return page;
}

static void on_api_abort(void *data)
{
    api_call_t *a = data;
    if (!a->lookup) { /* deleting: the commit's callback frees it */
        a->req = NULL;
        return;
    }
    mg_resp_lookup_cancel(a->lookup);
    free(a);
}

static void api_deleted(void *ud, int rc)
{
    api_call_t *a = ud;
    mg_http_req_t *req = a->req;
    if (!req) { /* the client left; the delete happened anyway */
        free(a);
        return;
    }
    req->on_abort = NULL;
    if (rc != 0) {
        mg_answer_error(a->rs->d.metrics, req, MG_EP_RESPONSES, 500, "INTERNAL_ERROR",
                        "the response could not be deleted", 0);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", a->id);
        cJSON_AddStringToObject(o, "object", "response");
        cJSON_AddTrueToObject(o, "deleted");
        mg_answer_tree(a->rs->d.metrics, req, MG_EP_RESPONSES, 200, o);
    }
    free(a);
}

static int what_is_delete(const api_call_t *a, const mg_http_req_t *req)
{
    return a->what == MG_RESP_ITSELF && req->method == HTTP_DELETE;
}

static void api_found(void *ud, const mg_resp_record_t *rec)
{
    api_call_t *a = ud;
    mg_resp_store_t *rs = a->rs;
    mg_http_req_t *req = a->req;
    req->on_abort = NULL;
    if (!rec || strcmp(rec->scope, a->scope) != 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "Response with id '%.96s' not found.", a->id);
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 404, "NOT_FOUND", msg, 0);
    } else if (what_is_delete(a, req)) {
        /* answered once the delete committed: a GET after the answer finds nothing */
        a->lookup = NULL;
        req->on_abort = on_api_abort;
        if (forget(rs, a->id, api_deleted, a) == 0) return;
        req->on_abort = NULL;
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 500, "INTERNAL_ERROR",
                        "the store is not writable", 0);
    } else if (a->what == MG_RESP_CANCEL) {
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 400, "INVALID_REQUEST",
                        "Only background responses can be cancelled, and this one ran in the"
                        " foreground (background is not supported by the chat bridge).",
                        0);
    } else if (a->what == MG_RESP_INPUT_ITEMS) {
        mg_answer_tree(rs->d.metrics, req, MG_EP_RESPONSES, 200, items_page(a, rec->input));
    } else {
        mg_answer_json(rs->d.metrics, req, MG_EP_RESPONSES, 200, NULL, rec->response,
                       strlen(rec->response));
    }
    free(a);
}

void mg_resp_store_handle(mg_resp_store_t *rs, mg_http_req_t *req, const char *id,
                          mg_resp_path_t what)
{
    int ok = what == MG_RESP_CANCEL        ? req->method == HTTP_POST
             : what == MG_RESP_INPUT_ITEMS ? req->method == HTTP_GET
                                           : req->method == HTTP_GET || req->method == HTTP_DELETE;
    if (!ok) {
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 405, "METHOD_NOT_ALLOWED",
                        what == MG_RESP_CANCEL        ? "use POST"
                        : what == MG_RESP_INPUT_ITEMS ? "use GET"
                                                      : "use GET or DELETE",
                        0);
        return;
    }
    api_call_t *a = calloc(1, sizeof(*a));
    if (!a) {
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 500, "INTERNAL_ERROR", "out of memory",
                        0);
        return;
    }
    a->what = what;
    const char *bad =
        what == MG_RESP_INPUT_ITEMS ? list_params(a, req->query ? req->query : "") : NULL;
    if (bad) {
        free(a);
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 400, "INVALID_REQUEST", bad, 0);
        return;
    }
    mg_auth_result_t r;
    int auth_on = mg_gens_current(rs->d.gens)->cfg->auth_enabled;
    if (auth_on) {
        if (mg_auth_authenticate(rs->d.auth, req, mg_unix_ms(), &r) != 0) {
            free(a);
            mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, r.status, r.code, r.message, 0);
            return;
        }
    }
    mg_resp_scope(auth_on ? &r : NULL, req, a->scope, sizeof(a->scope));
    a->rs = rs;
    a->req = req;
    snprintf(a->id, sizeof(a->id), "%s", id);
    a->lookup = mg_resp_store_get(rs, id, api_found, a);
    if (!a->lookup) {
        free(a);
        mg_answer_error(rs->d.metrics, req, MG_EP_RESPONSES, 500, "INTERNAL_ERROR", "out of memory",
                        0);
        return;
    }
    req->on_abort = on_api_abort;
    req->on_drain = NULL;
    req->hook_data = a;
}
