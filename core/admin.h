/* admin: the tenancy part of the admin API under /api/v2 — tenants, projects and customer
 * keys — and the audit trail of every admin request.
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
 *   GET  /api/v2/audit[?limit=N]                     the newest audit records first
 *
 * Errors use the gateway's error shape: 400 INVALID_REQUEST naming the field (unknown
 * field, wrong type, out of range, duplicate name), 404 NOT_FOUND, 409 CONFLICT (a revoked
 * key cannot change), 500 INTERNAL_ERROR (storage; the detail goes to the log).
 *
 * Writes run synchronously on the loop thread in one SQLite transaction on the store's
 * admin connection (mg_store_tx_*). That is acceptable because admin requests are rare,
 * operator-driven and touch a handful of rows; in exchange the answer is only sent once
 * the change is durable, and the in-memory auth state (auth.h) is updated right after the
 * commit, before any other request runs — database first, then memory, never the other
 * way round. Should the memory update fail, the whole auth state is reloaded from the
 * store. Reads use mg_store_query().
 *
 * Every request handled here writes one audit_logs row (actor, action, target, status,
 * request id, client address) after the change committed; a failed audit write does not
 * undo the change but is logged at error level. The clear key appears only in the 201 /
 * rotate response body; never in a log line, an error or the database. */
#ifndef MG_ADMIN_H
#define MG_ADMIN_H

#include "http.h"
#include "server.h"

/* Handle one admin request whose admin token was already checked (api.c admin_allowed).
 * Answers it (the request is gone afterwards) and writes its audit record. */
void mg_admin_handle(mg_server_t *s, mg_http_req_t *req);

/* Write one audit_logs row for an authenticated admin request answered elsewhere (the
 * read endpoints in api.c): actor "admin", action (e.g. "pools.read"), target (may be NULL),
 * the answer's status, the request id and the client's address. Synchronous, in its own
 * transaction; a failure is logged at error level ("audit write failed") and changes
 * nothing else. Call it before answering (the request is gone afterwards). */
void mg_admin_audit(mg_server_t *s, const mg_http_req_t *req, const char *action,
                    const char *target, int status);

#endif
