/* http: the session endpoints (edge PRD 3.3.1), answered from memory:
 *
 *   POST   /v1/sessions                 {model?, system?, max_messages?, max_tokens?,
 *                                        ttl_seconds?, idle_timeout_seconds?,
 *                                        context_policy?, metadata?} -> 201 the session
 *   GET    /v1/sessions/{id}            the session: settings, counts, summary, times
 *   DELETE /v1/sessions/{id}            -> 200 {id, object, deleted: true}; gone at once
 *   GET    /v1/sessions/{id}/messages   ?limit=N (1..100, default 20) &after=msg_N:
 *                                       {object: "list", data, first_id, last_id, has_more}
 *
 * A session the caller may not see answers 404 SESSION_NOT_FOUND, as one that never was.
 * Loop thread only. */
#ifndef MG_SESSION_HTTP_H
#define MG_SESSION_HTTP_H

#include "conf/config.h"
#include "net/http.h"
#include "obs/metrics.h"
#include "session/session.h"

/* Answer req, whose path is /v1/sessions followed by `rest` ("", "/{id}" or
 * "/{id}/messages"), for owner. */
void mg_sessions_http(mg_sessions_t *s, mg_metrics_t *m, const mg_config_t *cfg, mg_http_req_t *req,
                      const char *rest, const mg_session_owner_t *owner);

/* The session as GET /v1/sessions/{id} shows it. */
cJSON *mg_session_json(const mg_session_t *x);

#endif
