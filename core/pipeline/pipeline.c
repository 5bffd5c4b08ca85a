/* pipeline: the entry point, the client's hooks, and the view of calls in flight for
 * /v1/tasks/{id}; see pipeline.h. The steps themselves are in call.h's files. */
#include "pipeline/pipeline.h"

#include <string.h>

#include "base/json.h"
#include "net/error.h"
#include "pipeline/call.h"
#include "pipeline/messages_resp.h"

static void on_client_abort(void *data)
{
    call_t *c = data;
    int stalled = c->req->abort == MG_HTTP_ABORT_STALLED; /* took nothing for write_timeout_ms */
    c->pl->metrics->cancelled_by[c->queued ? MG_CANCEL_QUEUED
                                 : stalled ? MG_CANCEL_CLIENT_STALLED
                                           : MG_CANCEL_CLIENT]++;
    call_cancelled(c, stalled ? "client_stalled" : "client_disconnected");
    c->status = c->client_started ? 200 : 499;
    c->answer_kind = ANSWER_NONE; /* the connection frees the request after this hook */
    call_resume(c, STEP_FINISH);
}

static void on_client_drain(void *data)
{
    call_t *c = data;
    if (c->xfer) mg_xfer_resume(c->xfer);
}

void mg_pipeline_handle(void *pipeline, mg_http_req_t *req, mg_endpoint_t ep)
{
    mg_pipeline_t *pl = pipeline;
    call_t *c = call_new(pl, req, ep);
    if (!c) {
        mg_error_respond(req, 500, "INTERNAL_ERROR", "out of memory", 0, NULL);
        return;
    }
    req->on_abort = on_client_abort;
    req->on_drain = on_client_drain;
    req->hook_data = c;
    if (ep == MG_EP_MESSAGES) mg_msgs_request_id_header(req);
    mg_call_run(c);
}

/* ------------------------------------------------------------------------ */
/* /v1/tasks/{id}                                                            */
/* ------------------------------------------------------------------------ */

/* The call in flight with that id, when the caller may see it (its key's own). */
static call_t *find_call(mg_pipeline_t *pl, const char *task_id, const mg_task_caller_t *who)
{
    for (call_t *c = pl->calls; c; c = c->next)
        if (c->req && strcmp(c->req->request_id, task_id) == 0)
            return who->all || c->auth.key_id == who->key_id ? c : NULL;
    return NULL;
}

/* Cancel on request of DELETE /v1/tasks/{id}: queued → leaves the queue; running → the
 * upstream transfer is closed; the task's own client is told. */
static void cancel_call(call_t *c)
{
    c->pl->metrics->cancelled_by[MG_CANCEL_REQUEST]++;
    call_cancelled(c, "request");
    c->fail_degraded = NULL;
    if (c->client_started) stream_fail(c, "REQUEST_CANCELLED", "the task was cancelled");
    else call_fail(c, 409, "REQUEST_CANCELLED", "the task was cancelled", 0);
}

int mg_pipeline_task(void *pipeline, mg_http_req_t *req, const char *task_id,
                     const mg_task_caller_t *who)
{
    call_t *c = find_call(pipeline, task_id, who);
    if (!c) return -1;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "task_id", task_id);
    cJSON_AddStringToObject(o, "object", "task");
    cJSON_AddStringToObject(o, "model", c->model ? c->model->name : "");
    cJSON_AddStringToObject(o, "priority", c->priority ? c->priority : "P2");
    if (req->method == HTTP_DELETE) {
        cancel_call(c); /* c is gone after this */
        cJSON_AddStringToObject(o, "status", "CANCELLED");
    } else {
        cJSON_AddStringToObject(o, "status", mg_task_state_name(c->task.state));
        cJSON_AddItemToObject(o, "timing", timing_json(c, uv_hrtime()));
    }
    mg_buf_t text = {0};
    mg_json_print(o, &text);
    cJSON_Delete(o);
    mg_http_respond(req, 200, "application/json", NULL, text.data, text.len);
    mg_buf_free(&text);
    return 0;
}

void mg_pipeline_active_tasks(const mg_pipeline_t *pl, mg_family_t *f)
{
    mg_family_clear(f);
    for (const call_t *c = pl->calls; c; c = c->next) {
        if (!c->entry.lease.held) continue;
        const char *am[2] = {c->app ? c->app->name : NULL, c->model ? c->model->name : NULL};
        mg_family_add(f, am, 1);
    }
}
