/* cors: the client API (/v1/) for web applications on other origins (server.cors). For an
 * allowed Origin the preflight (OPTIONS with Access-Control-Request-Method) is answered 204
 * with the methods, the headers asked for and Max-Age, and every answer, streams included,
 * carries Access-Control-Allow-Origin, Vary: Origin and Access-Control-Expose-Headers for
 * the gateway's own headers (X-Request-Id, the degradation and retry headers). A preflight
 * from an origin not listed is refused (403); other paths, the admin API among them, never
 * answer cross-origin. Loop thread. */
#ifndef MG_CORS_H
#define MG_CORS_H

#include "conf/config.h"
#include "net/http.h"
#include "obs/metrics.h"

/* Called first for every request on the API listener: 1 when it answered req (a preflight),
 * else 0, with req->head_lines set when the request comes from an allowed origin. */
int mg_cors_handle(const mg_cors_conf_t *cors, mg_http_req_t *req, mg_metrics_t *m);

#endif
