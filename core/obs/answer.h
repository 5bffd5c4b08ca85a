/* answer: the answers the gateway writes itself, outside the pipeline's calls (health,
 * status, models, the admin API, tasks, errors of the router), each with its request metric
 * and its one log line. The pipeline's calls account for themselves (pipeline/call.c). */
#ifndef MG_OBS_ANSWER_H
#define MG_OBS_ANSWER_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "net/endpoint.h"
#include "net/http.h"
#include "obs/metrics.h"

/* A JSON body (len bytes) with status; extra_headers as mg_http_respond's. */
void mg_answer_json(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status,
                    const char *extra_headers, const char *body, size_t len);

/* The same for a cJSON tree (consumed); 500 when it cannot be printed. */
void mg_answer_tree(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status, cJSON *obj);

/* The gateway's error shape (net/error.h), with Retry-After when retry_after_ms > 0. */
void mg_answer_error(mg_metrics_t *m, mg_http_req_t *req, mg_endpoint_t ep, int status,
                     const char *code, const char *message, int retry_after_ms);

/* Only the log line and the metric, for an answer written otherwise (before it is written:
 * the request is gone afterwards). error_code may be NULL. */
void mg_answer_account(mg_metrics_t *m, const mg_http_req_t *req, mg_endpoint_t ep, int status,
                       const char *error_code);

#endif
