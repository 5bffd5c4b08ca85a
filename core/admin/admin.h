/* admin: the admin API under /api/v2 (the token check and the live reads in front.c, the
 * rest on a worker thread in admin.c) and the audit trail of every admin request.
 *
 *   GET  /api/v2/tenants                 GET /api/v2/tenants/{id}
 *   POST /api/v2/tenants {name}          -> 201
 *   GET  /api/v2/projects[?tenant_id=]   GET /api/v2/projects/{id}
 *   POST /api/v2/projects {tenant_id, name, rpm_limit?, tpm_limit?, max_concurrency?,
 *                          daily_limit_micros?, monthly_limit_micros?}  -> 201
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
 *   POST|PUT|DELETE /api/v2/providers[/{id}[/enable|disable|test]]   (providers.c)
 *   POST /api/v2/admin-tokens {tenant_id, name?}     GET, DELETE /{id}  (scope.c)
 *   GET  /api/v2/usage[?tenant_id=]                  metered spend per key/project/tenant/period
 *   GET  /api/v2/stats/{overview|daily|tokens|providers/{id}},
 *        /api/v2/usage/{analytics|events}           usage analytics (stats.c)
 *   GET|POST /api/v2/prices                          versioned prices (prices.c)
 *   GET|PUT /api/v2/tenants/{id}/billing, GET .../wallet|ledger|holds, POST .../release|adjust,
 *   POST /api/v2/webhooks/topup (signed, no token)   the prepaid ledger (billing.c)
 *   GET|POST|PUT|DELETE /api/v2/models[/{name}]        logical models (defs.c)
 *   GET|POST|PUT|DELETE /api/v2/applications[/{name}]  applications (defs.c)
 *   GET|PUT /api/v2/quotas, /api/v2/policies         views over settings and applications
 *                                                   (views.c)
 *   GET|PUT /api/v2/config                           runtime settings (settings.h)
 *   GET  /api/v2/audit[?limit=N]                     the newest audit records first
 *   GET|POST|DELETE /api/v2/logging/full {duration_seconds, reason}  the full logging window
 *                                                   (front.c, platform admin only)
 *
 * Errors use the gateway's error shape: 400 INVALID_REQUEST naming the field (unknown
 * field, wrong type, out of range, duplicate name), 403 PERMISSION_DENIED (a tenant admin on
 * a platform endpoint), 404 NOT_FOUND, 409 CONFLICT (a revoked key cannot change), 500
 * INTERNAL_ERROR (storage; the detail goes to the log), 503 CONTROL_PLANE_UNAVAILABLE (with
 * cluster.postgres: PostgreSQL unreachable, nothing changed; admin/control.h).
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

#include <uv.h>
#include <cjson/cJSON.h>

#include "admin/authfail.h"
#include "luavm/gens.h"
#include "net/http.h"
#include "obs/fulllog.h"
#include "obs/metrics.h"
#include "route/pool.h"
#include "store/store.h"
#include "tenancy/auth.h"

typedef struct mg_admin_s mg_admin_t;

/* Rebuild: a new generation from the config file and the store (read after the call), in
 * place when done (done(done_ud, ok, error) on the loop thread). */
typedef void (*mg_rebuild_done_fn)(void *ud, int ok, const char *err);
typedef void (*mg_rebuild_fn)(void *ud, mg_rebuild_done_fn done, void *done_ud);

/* What the admin API works with, borrowed for its life. */
typedef struct mg_admin_deps_s {
    uv_loop_t *loop;
    mg_store_t *store;
    mg_auth_t *auth; /* committed key and project changes are mirrored here */
    mg_metrics_t *metrics;
    mg_gens_t *gens;       /* the config requests are checked against */
    mg_pool_t *pool;       /* the live reads: providers, pools, cooldowns */
    mg_rebuild_fn rebuild; /* after a change to providers, models, applications, settings */
    void *rebuild_ud;
    const char *token;     /* the platform admin token (MOONGATE_ADMIN_TOKEN), or NULL:
                              the admin API is off. Read once: only its digest is kept */
    mg_fulllog_t *fulllog; /* the full-mode logging window, switched by /api/v2/logging/full */
    int replicated;        /* cluster.postgres (admin/control.h): the audit records written on the
                              loop go through the worker's transaction too, so the cluster's control
                              log carries them to every instance */
} mg_admin_deps_t;

/* NULL when out of memory. */
mg_admin_t *mg_admin_new(const mg_admin_deps_t *d);
/* Free the state; call once no admin request runs (after the loop ended). */
void mg_admin_free(mg_admin_t *a);

/* Handle one request under /api/v2/: the admin token checked (401 otherwise), then the live
 * reads answered on the loop, everything else on the worker. Answers it (the request is gone
 * afterwards) and writes its audit record. */
void mg_admin_handle(mg_admin_t *a, mg_http_req_t *req);

/* Who an admin token is (the dashboard's sign-in, api/dashboard.c). */
typedef enum {
    MG_ADMIN_NONE = 0,     /* refused */
    MG_ADMIN_PLATFORM = 1, /* MOONGATE_ADMIN_TOKEN: everything */
    MG_ADMIN_TENANT = 2,   /* a tenant admin token (scope.c): its own tenant only */
} mg_admin_role_t;

typedef void (*mg_admin_signin_fn)(void *ud, mg_admin_role_t role, int64_t tenant_id);

/* Resolve token (not kept): the platform token is compared on the loop and done runs before
 * the call returns; a tenant admin token is looked up in the store on a worker thread and
 * done runs later on the loop thread. done(ud, role, tenant_id) runs exactly once
 * (MG_ADMIN_NONE when refused or the store failed; tenant_id 0 unless MG_ADMIN_TENANT). */
void mg_admin_signin(mg_admin_t *a, const char *token, mg_admin_signin_fn done, void *ud);

/* Handle one request under /api/v2/ for a caller already identified by its dashboard
 * session: as the platform admin (tenant_token NULL) or as that tenant admin token (resolved
 * again on the worker, so a revoked token stops working at once). As mg_admin_handle
 * otherwise. */
void mg_admin_handle_as(mg_admin_t *a, mg_http_req_t *req, const char *tenant_token);

/* The live provider state as GET /api/v2/providers lists it (keys masked), and the pools
 * as GET /api/v2/pools: new trees (the caller owns them), for the dashboard's snapshot.
 * Loop thread. */
cJSON *mg_admin_providers_view(mg_admin_t *a);
cJSON *mg_admin_pools_view(mg_admin_t *a);

/* Whether req presents the platform admin token (Authorization: Bearer): 1 or 0; answers
 * nothing. For endpoints outside /api/v2 where the operator may see more. */
int mg_admin_is_platform(const mg_admin_t *a, const mg_http_req_t *req);

/* Write one audit_logs row for a platform admin request answered on the loop (the live
 * reads): actor "admin", action (e.g. "pools.read"), target (may be NULL), the answer's
 * status, the request id and the client's address. Queued for the store's writer thread; a
 * failure is logged at error level ("audit write failed"). Call it before answering (the
 * request is gone afterwards). */
void mg_admin_audit(mg_admin_t *a, const mg_http_req_t *req, const char *action, const char *target,
                    int status);
/* Write one audit_logs row for what the gateway did by itself (actor "system", status 200,
 * no request): e.g. logging.full.expired. Loop thread. */
void mg_admin_audit_system(mg_admin_t *a, const char *action, const char *target);
/* Audit a refused admin token (actor "unauthenticated", action admin.auth_failed, 401). */
void mg_admin_audit_auth_failed(mg_admin_t *a, const mg_http_req_t *req);
/* The failed sign-ins per client address (authfail.h), one table for every door to the admin
 * token: the admin API and the dashboard's sign-in. */
mg_authfail_t *mg_admin_fails(mg_admin_t *a);

#endif
