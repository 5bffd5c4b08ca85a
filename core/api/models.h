/* models: GET /v1/models and GET /v1/models/{id} (issue 20).
 *
 * The list holds the logical models (config order), then the models the providers with a
 * model_prefix report, each under the name that reaches it (route/model_list.h), from the
 * cache route/upmodels.h keeps: the answer never waits for an upstream. owned_by is
 * "moongate" for a logical model and the provider's name for an upstream one (never a base
 * URL or a key). A request carrying anthropic-version gets Anthropic's shapes ({data: [{type,
 * id, display_name, created_at}], has_more, first_id, last_id}; its errors too), every other
 * one OpenAI's.
 *
 * Who sees what: with auth on, a key is required (401 AUTH_FAILED without a valid one, 403
 * PERMISSION_DENIED without the "inference" or "models" scope), and the caller sees only the
 * models it may use, by the rule admission applies: the key's model allowlist and its
 * application's allowed_models (auth.default_application when the key has none; in open mode
 * that one alone). GET /v1/models/{id} answers 404 MODEL_NOT_FOUND for a model the caller
 * may not use, as for one that does not exist. */
#ifndef MG_API_MODELS_H
#define MG_API_MODELS_H

#include "api/api.h"

void mg_api_models(mg_api_t *s, mg_http_req_t *req);
/* id: the path's rest, %-decoded in place. */
void mg_api_model(mg_api_t *s, mg_http_req_t *req, char *id);

#endif
