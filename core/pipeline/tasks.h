/* tasks: asynchronous tasks (edge PRD 3.1: POST/GET/DELETE /v1/tasks).
 *
 * POST /v1/tasks takes a chat completion request and answers 202 with a task id at once;
 * the request then runs through the ordinary pipeline as a detached request (no client
 * connection: its answer is collected), and GET /v1/tasks/{id} shows its state, timing
 * and, once done, its result. DELETE cancels it. Task records are written to SQLite by the
 * store's writer thread and read back at start-up (a task that was running when the
 * process stopped ends FAILED with reason "restart"); records older than the retention
 * are dropped. Requests answered synchronously show in GET/DELETE while they run too. */
#ifndef MG_TASKS_H
#define MG_TASKS_H

#include <uv.h>

#include "net/endpoint.h"
#include "net/http.h"
#include "obs/metrics.h"
#include "store/store.h"

typedef struct mg_tasks_s mg_tasks_t;

/* Whose tasks a caller may see and cancel: every one (the operator; anyone in open mode), or
 * only those submitted with its key. */
typedef struct mg_task_caller_s {
    int all;
    int64_t key_id; /* when not all */
} mg_task_caller_t;

/* A request in flight answered by its id (GET: state and timing; DELETE: cancel) when the
 * caller may see it: 0 when answered, -1 (nothing answered) otherwise. */
typedef int (*mg_task_view_fn)(void *pipeline, mg_http_req_t *req, const char *id,
                               const mg_task_caller_t *who);

typedef struct mg_tasks_deps_s {
    mg_store_t *store; /* NULL: records in memory only */
    uv_loop_t *loop;
    mg_metrics_t *metrics;
    mg_handle_fn run;          /* the pipeline's entry point, ud = pipeline */
    mg_task_view_fn in_flight; /* the pipeline's view of requests in flight */
    void *pipeline;
} mg_tasks_deps_t;

/* Read the kept task records (before the loop runs), closing the interrupted ones.
 * retention_s: how long finished records are kept. NULL when out of memory. */
mg_tasks_t *mg_tasks_open(const mg_tasks_deps_t *d, int retention_s);
void mg_tasks_free(mg_tasks_t *t);

/* POST /v1/tasks; key_id: the submitter's key (0: open mode). */
void mg_tasks_submit(mg_tasks_t *t, mg_http_req_t *req, int64_t key_id);
/* GET or DELETE /v1/tasks/{id}: 404 for a task the caller may not see. */
void mg_tasks_handle(mg_tasks_t *t, mg_http_req_t *req, const char *id,
                     const mg_task_caller_t *who);
/* GET /v1/tasks: the caller's tasks, newest first (?limit=N, default and at most 100). */
void mg_tasks_list(mg_tasks_t *t, mg_http_req_t *req, const mg_task_caller_t *who);

#endif
