/* tasks: asynchronous tasks; see tasks.h.
 *
 * Records live in a list, newest first, bounded by the retention and by MAX_RECORDS;
 * every change is also queued to the store's writer thread, so the loop thread never
 * waits on the disk. The in-flight view (state, timing, cancel) comes from the pipeline. */
#include "pipeline/tasks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "obs/answer.h"

#define MAX_RECORDS 10000

typedef struct task_rec_s {
    struct task_rec_s *next;
    char id[MG_REQUEST_ID_LEN + 1];
    char *model;    /* owned */
    char state[16]; /* QUEUED until done, then a terminal state name */
    char *reason;   /* owned, may be NULL */
    int http_status;
    char *result; /* owned: the answer's JSON, NULL while running */
    int64_t created_ms, finished_ms;
    int64_t key_id; /* the submitter's key; 0 = none (open mode) */
} task_rec_t;

struct mg_tasks_s {
    mg_store_t *store; /* borrowed; NULL = records in memory only */
    uv_loop_t *loop;
    mg_metrics_t *metrics;
    mg_handle_fn run;          /* the pipeline's entry point */
    mg_task_view_fn in_flight; /* the pipeline's view of a request in flight */
    void *pipeline;
    task_rec_t *head;
    int count;
    int retention_s;
};

static int64_t wall_ms(void)
{
    return (int64_t)mg_unix_ms();
}

static void rec_free(task_rec_t *r)
{
    free(r->model);
    free(r->reason);
    free(r->result);
    free(r);
}

static task_rec_t *rec_find(mg_tasks_t *t, const char *id)
{
    for (task_rec_t *r = t->head; r; r = r->next)
        if (strcmp(r->id, id) == 0) return r;
    return NULL;
}

/* Drop records past the retention or beyond MAX_RECORDS (the list is newest first). */
static void prune(mg_tasks_t *t, int64_t now)
{
    int64_t oldest = now - (int64_t)t->retention_s * 1000;
    task_rec_t **pp = &t->head;
    int n = 0;
    while (*pp) {
        task_rec_t *r = *pp;
        int done = r->finished_ms > 0;
        if ((done && r->created_ms < oldest) || (done && n >= MAX_RECORDS)) {
            *pp = r->next;
            rec_free(r);
            t->count--;
            continue;
        }
        n++;
        pp = &r->next;
    }
}

static void persist(mg_tasks_t *t, const task_rec_t *r)
{
    if (!t->store) return;
    char status[16], created[24], finished[24];
    snprintf(status, sizeof(status), "%d", r->http_status);
    snprintf(created, sizeof(created), "%lld", (long long)r->created_ms);
    snprintf(finished, sizeof(finished), "%lld", (long long)r->finished_ms);
    char key[24];
    snprintf(key, sizeof(key), "%lld", (long long)r->key_id);
    const char *p[9] = {r->id,
                        r->model,
                        r->state,
                        r->reason,
                        r->finished_ms ? status : NULL,
                        r->result,
                        created,
                        r->finished_ms ? finished : NULL,
                        r->key_id ? key : NULL};
    mg_store_write(t->store,
                   "INSERT INTO tasks(id, model, state, reason, http_status, result, created_ms,"
                   " finished_ms, key_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                   " ON CONFLICT(id) DO UPDATE SET state = excluded.state,"
                   " reason = excluded.reason, http_status = excluded.http_status,"
                   " result = excluded.result, finished_ms = excluded.finished_ms",
                   9, p);
}

/* ------------------------------------------------------------------------ */
/* Start-up                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct {
    mg_tasks_t *t;
    task_rec_t *tail;
} load_ctx_t;

static void load_row(void *ud, int ncols, const char *const *cols)
{
    load_ctx_t *lc = ud;
    if (ncols < 8 || !cols[0] || strlen(cols[0]) > MG_REQUEST_ID_LEN) return;
    task_rec_t *r = calloc(1, sizeof(*r));
    if (!r) return;
    snprintf(r->id, sizeof(r->id), "%s", cols[0]);
    r->model = strdup(cols[1] ? cols[1] : "");
    snprintf(r->state, sizeof(r->state), "%s", cols[2] ? cols[2] : "FAILED");
    r->reason = cols[3] ? strdup(cols[3]) : NULL;
    r->http_status = cols[4] ? atoi(cols[4]) : 0;
    r->result = cols[5] ? strdup(cols[5]) : NULL;
    r->created_ms = cols[6] ? atoll(cols[6]) : 0;
    r->finished_ms = cols[7] ? atoll(cols[7]) : 0;
    r->key_id = ncols > 8 && cols[8] ? atoll(cols[8]) : 0;
    /* rows come newest first: append to keep that order */
    if (lc->tail) lc->tail->next = r;
    else lc->t->head = r;
    lc->tail = r;
    lc->t->count++;
}

mg_tasks_t *mg_tasks_open(const mg_tasks_deps_t *d, int retention_s)
{
    mg_tasks_t *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->store = d->store;
    t->loop = d->loop;
    t->metrics = d->metrics;
    t->run = d->run;
    t->in_flight = d->in_flight;
    t->pipeline = d->pipeline;
    t->retention_s = retention_s;
    if (!t->store) return t;
    char err[256], since[24];
    int64_t now = wall_ms();
    snprintf(since, sizeof(since), "%lld", (long long)(now - (int64_t)retention_s * 1000));
    const char *p[1] = {since};
    load_ctx_t lc = {t, NULL};
    if (mg_store_query(
            t->store,
            "SELECT id, model, state, reason, http_status, result, created_ms,"
            " finished_ms, key_id FROM tasks WHERE created_ms >= ?1 ORDER BY created_ms DESC"
            " LIMIT 10000",
            1, p, load_row, &lc, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot read async tasks: %s", err);
    /* a task that was queued or running when the process stopped will never finish */
    for (task_rec_t *r = t->head; r; r = r->next) {
        if (r->finished_ms) continue;
        snprintf(r->state, sizeof(r->state), "FAILED");
        free(r->reason);
        r->reason = strdup("restart");
        r->finished_ms = now;
        persist(t, r);
    }
    const char *old[1] = {since};
    mg_store_write(t->store, "DELETE FROM tasks WHERE created_ms < ?1", 1, old);
    return t;
}

void mg_tasks_free(mg_tasks_t *t)
{
    if (!t) return;
    while (t->head) {
        task_rec_t *n = t->head->next;
        rec_free(t->head);
        t->head = n;
    }
    free(t);
}

/* ------------------------------------------------------------------------ */
/* Submitting and answering                                                  */
/* ------------------------------------------------------------------------ */

static const char *state_for(int status, const char *body)
{
    if (status >= 200 && status < 300) return "SUCCEEDED";
    if (status == 408) return "TIMED_OUT";
    if (status == 409 || strstr(body, "\"REQUEST_CANCELLED\"")) return "CANCELLED";
    if (status == 429 || status == 503) return strstr(body, "QUEUE_FULL") ? "REJECTED" : "FAILED";
    return "FAILED";
}

/* The detached request's answer: the task is over. */
static void on_task_done(void *ud, const mg_http_req_t *req, int status, const char *body,
                         size_t len)
{
    mg_tasks_t *t = ud;
    task_rec_t *r = rec_find(t, req->request_id);
    if (!r) return;
    snprintf(r->state, sizeof(r->state), "%s", state_for(status, body));
    r->http_status = status;
    free(r->result);
    r->result = strndup(body, len);
    r->finished_ms = wall_ms();
    persist(t, r);
}

static cJSON *task_json(const task_rec_t *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task_id", r->id);
    cJSON_AddStringToObject(o, "object", "task");
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON_AddStringToObject(o, "status", r->state);
    if (r->reason) cJSON_AddStringToObject(o, "reason", r->reason);
    cJSON_AddNumberToObject(o, "created_ms", (double)r->created_ms);
    if (r->finished_ms) cJSON_AddNumberToObject(o, "finished_ms", (double)r->finished_ms);
    if (r->http_status) cJSON_AddNumberToObject(o, "http_status", r->http_status);
    cJSON *result = r->result ? cJSON_Parse(r->result) : NULL;
    if (result) cJSON_AddItemToObject(o, "result", result);
    return o;
}

static void respond_task(mg_tasks_t *t, mg_http_req_t *req, const task_rec_t *r, int status)
{
    mg_answer_tree(t->metrics, req, MG_EP_OTHER, status, task_json(r));
}

static int may_see(const mg_task_caller_t *who, const task_rec_t *r)
{
    return who->all || r->key_id == who->key_id;
}

void mg_tasks_list(mg_tasks_t *t, mg_http_req_t *req, const mg_task_caller_t *who)
{
    int limit = 100;
    const char *q = req->query ? strstr(req->query, "limit=") : NULL;
    if (q && atoi(q + 6) > 0 && atoi(q + 6) < limit) limit = atoi(q + 6);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    for (const task_rec_t *r = t->head; r && limit > 0; r = r->next) {
        if (!may_see(who, r)) continue;
        cJSON_AddItemToArray(data, task_json(r));
        limit--;
    }
    mg_answer_tree(t->metrics, req, MG_EP_OTHER, 200, root);
}

void mg_tasks_submit(mg_tasks_t *t, mg_http_req_t *req, int64_t key_id)
{
    cJSON *body = req->body_len ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    if (!cJSON_IsObject(body) || !cJSON_IsString(model)) {
        cJSON_Delete(body);
        mg_answer_error(t->metrics, req, MG_EP_OTHER, 400, "INVALID_REQUEST",
                        "the body must be a chat completion request with a 'model'", 0);
        return;
    }
    /* the answer is collected whole: a task does not stream */
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream");
    cJSON_DeleteItemFromObjectCaseSensitive(body, "stream_options");
    mg_buf_t text = {0};
    mg_json_print(body, &text);
    task_rec_t *r = calloc(1, sizeof(*r));
    /* the task carries the submitter's headers: its key, X-Priority, X-Sidecar-* */
    mg_http_req_t *dreq =
        r ? mg_http_req_detached(HTTP_POST, "/v1/tasks", text.data ? text.data : "", text.len, req,
                                 uv_now(t->loop), on_task_done, t)
          : NULL;
    if (r) r->model = strdup(model->valuestring);
    cJSON_Delete(body);
    mg_buf_free(&text);
    if (!dreq || !r->model) {
        if (r) rec_free(r);
        mg_answer_error(t->metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    snprintf(r->id, sizeof(r->id), "%s", dreq->request_id);
    snprintf(r->state, sizeof(r->state), "QUEUED");
    r->created_ms = wall_ms();
    r->key_id = key_id;
    r->next = t->head;
    t->head = r;
    t->count++;
    prune(t, r->created_ms);
    persist(t, r);
    t->run(t->pipeline, dreq, MG_EP_CHAT); /* may finish at once (e.g. an unknown model) */
    respond_task(t, req, r, 202);
}

void mg_tasks_handle(mg_tasks_t *t, mg_http_req_t *req, const char *id, const mg_task_caller_t *who)
{
    if (t->in_flight(t->pipeline, req, id, who) == 0) return; /* in flight: answered there */
    task_rec_t *r = rec_find(t, id);
    if (!r || !may_see(who, r)) {
        mg_answer_error(t->metrics, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such task", 0);
        return;
    }
    if (req->method == HTTP_DELETE) {
        mg_answer_error(t->metrics, req, MG_EP_OTHER, 409, "CONFLICT",
                        "the task has already finished", 0);
        return;
    }
    respond_task(t, req, r, 200);
}
