/* proxy: one client request proxied to a model back-end.
 *
 * The steps, in order: validate the body → resolve the logical model → route
 * (policies/routing.lua orders the candidates) → for each candidate until one
 * answers: encode (the provider's adapter) → send (upstream) → on 429 / 5xx /
 * connect error / garbage before any byte reached the client, the next candidate
 * → stream or answer (passthrough adapters are forwarded by C, translating ones
 * decoded per event) → finish (log line, metrics, release).
 *
 * A client that leaves at any point aborts the upstream transfer at once. */
#ifndef MG_PROXY_H
#define MG_PROXY_H

#include "net/http.h"
#include "obs/metrics.h"
#include "server.h"

/* Handle POST /v1/chat/completions, /v1/completions or /v1/embeddings. */
void mg_proxy_handle(mg_server_t *s, mg_http_req_t *req, mg_endpoint_t ep);

/* Scheduler callbacks: the queued call `data` got its slot / ran out of queue time.
 * Each finishes or takes over the call; the entry must not be touched afterwards. */
void mg_proxy_dispatched(void *data);
void mg_proxy_queue_timeout(void *data);

/* GET /v1/tasks/{id} for a request in flight: its state and timing; DELETE: cancel it (its
 * client gets 409 REQUEST_CANCELLED, or an error event when streaming). Returns 0 when
 * answered, -1 (nothing answered) when no such request is in flight. */
int mg_proxy_task(mg_server_t *s, mg_http_req_t *req, const char *task_id);

#endif
