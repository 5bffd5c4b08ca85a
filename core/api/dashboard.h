/* dashboard: the WebUI served by the gateway (ADR 8.3, 9): its files, the sign-in that
 * turns an admin token into a session cookie, the admin API called with that cookie, and
 * the live stream.
 *
 *   GET  /                        302 to /api/dashboard (404 when dashboard.enabled is false)
 *   GET  /api/dashboard           the page (index.html); /api/dashboard/<file>: its files
 *   POST /api/dashboard/login     {"token": "..."} -> 200 {role, tenant_id, csrf_token,
 *                                 expires_at} + Set-Cookie: mg_session=...; HttpOnly;
 *                                 SameSite=Strict; Path=/; Max-Age=dashboard.session_ttl_s
 *                                 (401 AUTH_FAILED for any other token; 429 RATE_LIMITED
 *                                 after 10 failures from one address within a minute)
 *   GET  /api/dashboard/session   the same body for the cookie's session, or 401
 *   POST /api/dashboard/logout    ends the session (X-CSRF-Token required) -> 204, the
 *                                 cookie cleared, its streams ended
 *   GET  /api/dashboard/stream    SSE (api/stream.h)
 *   /api/v2/...                   with the cookie instead of Authorization: Bearer, as the
 *                                 session's admin; POST, PUT, PATCH, DELETE need the
 *                                 session's X-CSRF-Token (403 CSRF_FAILED otherwise)
 *
 * The token never leaves the sign-in request: the page keeps only the CSRF token, in memory
 * (never localStorage), and the cookie is HttpOnly. Every answer of the page's files carries
 * a Content-Security-Policy of 'self' only (no CDN, no inline script). Loop thread only. */
#ifndef MG_API_DASHBOARD_H
#define MG_API_DASHBOARD_H

#include <uv.h>

#include "admin/admin.h"
#include "api/websession.h"
#include "api/stream.h"
#include "api/webui.h"
#include "luavm/gens.h"
#include "obs/metrics.h"

typedef struct mg_dashboard_s {
    uv_loop_t *loop;
    mg_gens_t *gens;
    mg_metrics_t *metrics;
    mg_admin_t *admin;
    mg_webui_t webui; /* empty when the files were not found (logged at start) */
    mg_websessions_t sessions;
    mg_streams_t streams;
} mg_dashboard_t;

/* Read the files and make the session table (start-up: blocking). A missing webui/ is
 * logged and leaves the page answering 503; only out of memory fails (-1). sd: what the
 * stream's snapshots read. */
int mg_dashboard_init(mg_dashboard_t *d, uv_loop_t *loop, mg_gens_t *gens, mg_metrics_t *metrics,
                      mg_admin_t *admin, const mg_stream_deps_t *sd);
/* Handle "/" and "/api/dashboard[/...]": 1 when req was one of them (answered), else 0. */
int mg_dashboard_handle(mg_dashboard_t *d, mg_http_req_t *req);
/* Handle a request under /api/v2/: with an Authorization header as the admin API does;
 * with only a session cookie, as the session's admin (CSRF checked). */
void mg_dashboard_admin(mg_dashboard_t *d, mg_http_req_t *req);
/* For endpoints outside /api/v2 that the operator may use from the page (/v1/tasks): 1 when
 * req comes with a platform admin's session (and, for a write, its X-CSRF-Token), 0 when it
 * has no such session (nothing answered), -1 after answering 403 CSRF_FAILED. */
int mg_dashboard_platform(mg_dashboard_t *d, mg_http_req_t *req);
/* Draining: end every stream (they would hold the drain up) and refuse new ones. */
void mg_dashboard_stop(mg_dashboard_t *d);
/* Close the stream timer (with the loop's other handles). */
void mg_dashboard_close(mg_dashboard_t *d);
/* After the loop ended. */
void mg_dashboard_free(mg_dashboard_t *d);

#endif
