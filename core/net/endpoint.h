/* endpoint: the gateway's API surfaces, as metrics count them and the pipeline serves them,
 * and the signature of an entry point that answers an inference request. */
#ifndef MG_ENDPOINT_H
#define MG_ENDPOINT_H

#include "net/http.h"

typedef enum {
    MG_EP_CHAT = 0,
    MG_EP_COMPLETIONS,
    MG_EP_EMBEDDINGS,
    MG_EP_MODELS,
    MG_EP_MESSAGES, /* Anthropic Messages: /v1/messages (served as chat) and count_tokens */
    MG_EP_OTHER,
    MG_EP_RESPONSES, /* POST /v1/responses (bridged to chat engines) and /v1/responses/{id} */
    MG_EP_COUNT
} mg_endpoint_t;

/* Answer an inference request for endpoint ep; the request is the callee's from then on
 * (the pipeline's entry point, handed to modules that run requests of their own: async
 * tasks, idempotent runs). */
typedef void (*mg_handle_fn)(void *ud, mg_http_req_t *req, mg_endpoint_t ep);

#endif
