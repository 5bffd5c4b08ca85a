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

#include "net/http.h"

struct mg_server_s;
typedef struct mg_tasks_s mg_tasks_t;

/* Read the kept task records (before the loop runs), closing the interrupted ones.
 * retention_s: how long finished records are kept. NULL when out of memory. */
mg_tasks_t *mg_tasks_open(struct mg_server_s *s, int retention_s);
void mg_tasks_free(mg_tasks_t *t);

/* POST /v1/tasks. */
void mg_tasks_submit(struct mg_server_s *s, mg_http_req_t *req);
/* GET or DELETE /v1/tasks/{id}. */
void mg_tasks_handle(struct mg_server_s *s, mg_http_req_t *req, const char *id);

#endif
