/* admin: the admin API under /api/v2 (everything but the live reads api.c answers) and the
 * audit trail of every admin request.
 *
 *   GET  /api/v2/tenants                 GET /api/v2/tenants/{id}
 *   POST /api/v2/tenants {name}          -> 201
 *   GET  /api/v2/projects[?tenant_id=]   GET /api/v2/projects/{id}
 *   POST /api/v2/projects {tenant_id, name, rpm_limit?, tpm_limit?, max_concurrency?,
 *                          monthly_limit_micros?}                      -> 201
 *   PUT  /api/v2/projects/{id} {name?, limits...}
 *   GET  /api/v2/keys[?tenant_id=&project_id=&include_revoked=1]  (masked)
 *   GET  /api/v2/keys/{id}                                         (masked)
 *   POST /api/v2/keys {tenant_id, project_id?, name?, scopes?, models?, priorities?,
 *                      rpm_limit?, tpm_limit?, max_concurrency?, max_queued?,
 *                      daily_limit_micros?, monthly_limit_micros?, expires_at?, labels?,
 *                      enabled?}                     -> 201 {id, key, ...}: the key in clear, once
 *   PUT  /api/v2/keys/{id} {any of the above but tenant_id}
 *   POST /api/v2/keys/{id}/disable | /enable
 *   POST /api/v2/keys/{id}/rotate                    -> {id, key, replaces, ...} of the new key
 *   DELETE /api/v2/keys/{id}                         (revokes: the row stays for the record)
 *   POST|PUT|DELETE /api/v2/providers[/{id}[/enable|disable|test]]   (admin_providers.c)
 *   POST /api/v2/admin-tokens {tenant_id, name?}     GET, DELETE /{id}  (admin_scope.c)
 *   GET  /api/v2/usage[?tenant_id=]                  metered spend per key/project/period
 *   GET|POST|PUT|DELETE /api/v2/models[/{name}]        logical models (admin_defs.c)
 *   GET|POST|PUT|DELETE /api/v2/applications[/{name}]  applications (admin_defs.c)
 *   GET|PUT /api/v2/quotas, /api/v2/policies         views over settings and applications
 *                                                   (admin_views.c)
 *   GET|PUT /api/v2/config                           runtime settings (settings.h)
 *   GET  /api/v2/audit[?limit=N]                     the newest audit records first
 *
 * Errors use the gateway's error shape: 400 INVALID_REQUEST naming the field (unknown
 * field, wrong type, out of range, duplicate name), 403 PERMISSION_DENIED (a tenant admin on
 * a platform endpoint), 404 NOT_FOUND, 409 CONFLICT (a revoked key cannot change), 500
 * INTERNAL_ERROR (storage; the detail goes to the log).
 *
 * Requests are queued and run one at a time on a libuv worker thread (see admin.c): the
 * loop thread never waits for SQLite or a provider's test call. The answer is sent only
 * once the change is durable and mirrored in memory — database first, then memory, never
 * the other way round.
 *
 * Every authenticated request writes one audit_logs row (actor, action, target, status,
 * request id, client address); a failed audit write does not undo the change but is logged
 * at error level. A clear key or token appears only in its 201 / rotate response body;
 * never in a log line, an error or the database. */
#ifndef MG_ADMIN_H
#define MG_ADMIN_H

#include "net/http.h"
#include "server.h"

/* Handle one admin request whose admin token was already checked (api.c admin_allowed).
 * Answers it (the request is gone afterwards) and writes its audit record. */
/* tenant_token: NULL when the platform admin token was presented, else the tenant admin
 * token to resolve (copied; see admin_scope.c). */
void mg_admin_handle(mg_server_t *s, mg_http_req_t *req, const char *tenant_token);

/* Write one audit_logs row for a platform admin request answered on the loop (the live
 * read endpoints in api.c): actor "admin", action (e.g. "pools.read"), target (may be NULL),
 * the answer's status, the request id and the client's address. Queued for the store's
 * writer thread; a failure is logged at error level ("audit write failed"). Call it before
 * answering (the request is gone afterwards). */
void mg_admin_audit(mg_server_t *s, const mg_http_req_t *req, const char *action,
                    const char *target, int status);

#endif
