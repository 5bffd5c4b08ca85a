/* websession: the dashboard's signed-in sessions, in memory only (a restart signs everyone
 * out). Loop thread only.
 *
 * Signing in with an admin token (api/dashboard.c) makes a session: a random 32-byte id
 * sent once as the HttpOnly, SameSite=Strict cookie `mg_websession` and kept here only as its
 * SHA-256 digest; a random CSRF token that the page holds in memory and sends back as
 * `X-CSRF-Token` on every state-changing call; an expiry; the role. A tenant admin's token
 * is kept (wiped when the session ends) because the admin API resolves it again on every
 * call, so revoking it ends what the session may do at once. The table has a fixed number
 * of slots: a sign-in past them ends the session closest to its expiry. */
#ifndef MG_API_WEBSESSION_H
#define MG_API_WEBSESSION_H

#include <stdint.h>

#include "admin/admin.h"
#include "net/http.h"

#define MG_WEBSESSION_COOKIE "mg_session"
#define MG_WEBSESSION_ID_LEN 64 /* hex of 32 random bytes */

typedef struct mg_websession_s {
    char id_digest[65]; /* SHA-256 hex of the cookie value; "" = a free slot */
    char csrf[MG_WEBSESSION_ID_LEN + 1];
    uint64_t expires_ms; /* unix ms */
    mg_admin_role_t role;
    int64_t tenant_id;  /* MG_ADMIN_TENANT only */
    char *tenant_token; /* owned, wiped on end: MG_ADMIN_TENANT only */
    uint64_t serial;    /* unique per session: a stream holds it, not the pointer */
} mg_websession_t;

typedef struct mg_websessions_s {
    mg_websession_t *slots; /* owned, cap of them */
    int cap;
    uint64_t next_serial;
} mg_websessions_t;

/* 0 or -1 (out of memory). */
int mg_websessions_init(mg_websessions_t *s, int cap);
/* End every session and free the table. */
void mg_websessions_free(mg_websessions_t *s);

/* A new session (tenant_token copied; NULL for the platform admin) and its cookie value in
 * cookie (MG_WEBSESSION_ID_LEN + 1 bytes). NULL when out of memory or randomness. */
mg_websession_t *mg_websession_create(mg_websessions_t *s, mg_admin_role_t role, int64_t tenant_id,
                                      const char *tenant_token, int ttl_s, uint64_t now_ms,
                                      char *cookie);
/* The live session named by req's Cookie header, or NULL (none, unknown, or expired: an
 * expired one is ended). */
mg_websession_t *mg_websession_find(mg_websessions_t *s, const mg_http_req_t *req, uint64_t now_ms);
/* The live session with this serial, or NULL. */
mg_websession_t *mg_websession_by_serial(mg_websessions_t *s, uint64_t serial, uint64_t now_ms);
/* Whether req's X-CSRF-Token header is the session's (constant time). */
int mg_websession_csrf_ok(const mg_websession_t *se, const mg_http_req_t *req);
/* End a session (its slot is free afterwards). */
void mg_websession_end(mg_websession_t *se);

#endif
