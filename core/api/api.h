/* api: the client-facing HTTP surface: routing of paths to handlers, the JSON
 * error shape, and the small endpoints the gateway answers itself (health,
 * readiness, status, models, metrics). Proxied endpoints go to proxy.c. */
#ifndef MG_API_H
#define MG_API_H

#include "net/http.h"
#include "obs/metrics.h"
#include "server.h"

/* The listener handler for server.listen. */
void mg_api_handle(void *server, mg_http_req_t *req);
/* The listener handler for server.metrics_listen. */
void mg_api_handle_metrics(void *server, mg_http_req_t *req);

/* Answer with the error shape
 * {"error":{"message","type","param":null,"code","request_id"[,"retry_after_ms"]}}
 * plus Retry-After when retry_after_ms > 0, and log the request. `message` is
 * JSON-escaped here. */
void mg_api_error(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep, int status,
                  const char *code, const char *message, int retry_after_ms);

/* OpenAI error type for a status. */
const char *mg_api_error_type(int status);

#endif
