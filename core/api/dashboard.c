/* dashboard: the WebUI's files, sign-in, sessions at the admin API, the stream; see
 * dashboard.h. */
#include "api/dashboard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <cjson/cJSON.h>
#include <openssl/crypto.h>

#include "base/clock.h"
#include "base/json.h"
#include "base/log.h"
#include "obs/answer.h"

#define PREFIX "/api/dashboard"
#define MAX_TOKEN 256

/* Every file of the page: only this origin's scripts, styles, images and connections.
 * 'unsafe-eval' because Alpine.js evaluates its attribute expressions (its standard build);
 * no inline script and no other origin. */
#define PAGE_HEADERS                                                                               \
    "Content-Security-Policy: default-src 'self'; script-src 'self' 'unsafe-eval'; "               \
    "style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "         \
    "base-uri 'none'; form-action 'self'\r\n"                                                      \
    "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n"                                 \
    "Referrer-Policy: no-referrer\r\nCache-Control: no-cache\r\n"

static const mg_dashboard_conf_t *conf_of(const mg_dashboard_t *d)
{
    return &mg_gens_current(d->gens)->cfg->dashboard;
}

int mg_dashboard_init(mg_dashboard_t *d, uv_loop_t *loop, mg_gens_t *gens, mg_metrics_t *metrics,
                      mg_admin_t *admin, const mg_stream_deps_t *sd)
{
    memset(d, 0, sizeof(*d));
    d->loop = loop;
    d->gens = gens;
    d->metrics = metrics;
    d->admin = admin;
    const mg_dashboard_conf_t *dc = conf_of(d);
    if (mg_websessions_init(&d->sessions, dc->max_sessions) != 0) return -1;
    if (mg_streams_init(&d->streams, loop, gens, metrics, admin, &d->sessions, sd) != 0) return -1;
    if (!dc->enabled) return 0;
    char err[600] = "";
    if (mg_webui_load(&d->webui, dc->dir, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "dashboard: the WebUI files are missing: %s", err);
    return 0;
}

void mg_dashboard_stop(mg_dashboard_t *d)
{
    mg_streams_stop(&d->streams);
}

void mg_dashboard_close(mg_dashboard_t *d)
{
    mg_streams_close(&d->streams);
}

void mg_dashboard_free(mg_dashboard_t *d)
{
    mg_websessions_free(&d->sessions);
    mg_webui_free(&d->webui);
}

/* ---- files ---------------------------------------------------------------------------------- */

static void serve_file(mg_dashboard_t *d, mg_http_req_t *req, const char *rel)
{
    if (!d->webui.n) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 503, "DASHBOARD_UNAVAILABLE",
                        "the WebUI files were not found at start (dashboard.dir)", 0);
        return;
    }
    const mg_webui_file_t *f = mg_webui_find(&d->webui, rel);
    if (!f) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 404, "NOT_FOUND", "no such file", 0);
        return;
    }
    char headers[1024];
    snprintf(headers, sizeof(headers), PAGE_HEADERS "ETag: %s\r\n", f->etag);
    const char *inm = mg_http_header(req, "If-None-Match");
    int fresh = inm && strcmp(inm, f->etag) == 0;
    mg_answer_account(d->metrics, req, MG_EP_OTHER, fresh ? 304 : 200, NULL);
    mg_http_respond(req, fresh ? 304 : 200, f->type, headers, fresh ? NULL : f->data,
                    fresh ? 0 : f->len);
}

/* ---- sign-in -------------------------------------------------------------------------------- */

static cJSON *session_json(const mg_websession_t *se)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "role", se->role == MG_ADMIN_TENANT ? "tenant_admin" : "platform");
    if (se->role == MG_ADMIN_TENANT) cJSON_AddNumberToObject(o, "tenant_id", (double)se->tenant_id);
    else cJSON_AddNullToObject(o, "tenant_id");
    cJSON_AddStringToObject(o, "csrf_token", se->csrf);
    cJSON_AddNumberToObject(o, "expires_at", (double)(se->expires_ms / 1000));
    return o;
}

static void answer_session(mg_dashboard_t *d, mg_http_req_t *req, const mg_websession_t *se,
                           const char *cookie_headers)
{
    mg_buf_t text = {0};
    cJSON *o = session_json(se);
    int rc = mg_json_print(o, &text);
    cJSON_Delete(o);
    char headers[512];
    snprintf(headers, sizeof(headers), "Cache-Control: no-store\r\n%s",
             cookie_headers ? cookie_headers : "");
    if (rc != 0)
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
    else mg_answer_json(d->metrics, req, MG_EP_OTHER, 200, headers, text.data, text.len);
    mg_buf_free(&text);
}

/* A sign-in waiting for the admin API to say who its token is. */
typedef struct signin_wait_s {
    mg_dashboard_t *d;
    mg_http_req_t *req;        /* NULL once the client left */
    char token[MAX_TOKEN + 1]; /* wiped when done */
} signin_wait_t;

static void signin_gone(void *data)
{
    ((signin_wait_t *)data)->req = NULL;
}

static void signed_in(void *ud, mg_admin_role_t role, int64_t tenant_id)
{
    signin_wait_t *w = ud;
    mg_dashboard_t *d = w->d;
    mg_http_req_t *req = w->req;
    if (req) req->on_abort = NULL;
    const mg_dashboard_conf_t *dc = conf_of(d);
    char cookie[MG_WEBSESSION_ID_LEN + 1];
    mg_websession_t *se = NULL;
    if (req && role != MG_ADMIN_NONE)
        se = mg_websession_create(&d->sessions, role, tenant_id,
                                  role == MG_ADMIN_TENANT ? w->token : NULL, dc->session_ttl_s,
                                  mg_unix_ms(), cookie);
    OPENSSL_cleanse(w->token, sizeof(w->token));
    free(w);
    if (!req) return;
    if (role == MG_ADMIN_NONE) {
        char peer[80], addr[64];
        mg_http_peer(req, peer, sizeof(peer));
        mg_authfail_addr(peer, addr, sizeof(addr));
        mg_authfail_count(mg_admin_fails(d->admin), addr, uv_now(d->loop));
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 401, "AUTH_FAILED", "invalid admin token", 0);
        return;
    }
    if (!se) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR",
                        "cannot make a session", 0);
        return;
    }
    char set_cookie[256];
    snprintf(set_cookie, sizeof(set_cookie),
             "Set-Cookie: " MG_WEBSESSION_COOKIE "=%s; Path=/; Max-Age=%d; HttpOnly; "
             "SameSite=Strict%s\r\n",
             cookie, dc->session_ttl_s, dc->secure_cookie ? "; Secure" : "");
    OPENSSL_cleanse(cookie, sizeof(cookie));
    mg_log_msg(MG_LOG_INFO, req->request_id, "dashboard sign-in: %s",
               role == MG_ADMIN_TENANT ? "tenant admin" : "platform admin");
    answer_session(d, req, se, set_cookie);
    OPENSSL_cleanse(set_cookie, sizeof(set_cookie));
}

/* The token member of a JSON body; 0, or -1 after answering 400 / 415. */
static int body_token(mg_dashboard_t *d, mg_http_req_t *req, char *out)
{
    const char *ct = mg_http_header(req, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16) != 0) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 415, "INVALID_REQUEST",
                        "send {\"token\": \"...\"} as application/json", 0);
        return -1;
    }
    cJSON *in = req->body ? cJSON_ParseWithLength(req->body, req->body_len) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(in, "token");
    size_t n = cJSON_IsString(t) ? strlen(t->valuestring) : 0;
    int ok = n > 0 && n <= MAX_TOKEN;
    if (ok) memcpy(out, t->valuestring, n + 1);
    if (cJSON_IsString(t)) OPENSSL_cleanse(t->valuestring, n);
    if (req->body) OPENSSL_cleanse(req->body, req->body_len);
    cJSON_Delete(in);
    if (!ok)
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 400, "INVALID_REQUEST",
                        "field 'token': a string of 1 to 256 characters is required", 0);
    return ok ? 0 : -1;
}

static void handle_login(mg_dashboard_t *d, mg_http_req_t *req)
{
    char peer[80], addr[64];
    mg_http_peer(req, peer, sizeof(peer));
    mg_authfail_addr(peer, addr, sizeof(addr));
    uint64_t wait = 0;
    if (mg_authfail_blocked(mg_admin_fails(d->admin), addr, uv_now(d->loop), &wait)) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 429, "RATE_LIMITED",
                        "too many failed sign-ins from this address: wait", (int)wait);
        return;
    }
    signin_wait_t *w = calloc(1, sizeof(*w));
    if (!w) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    if (body_token(d, req, w->token) != 0) {
        free(w);
        return;
    }
    w->d = d;
    w->req = req;
    req->on_abort = signin_gone;
    req->hook_data = w;
    char token[MAX_TOKEN + 1];
    memcpy(token, w->token, sizeof(token)); /* done may free w before the call returns */
    mg_admin_signin(d->admin, token, signed_in, w);
    OPENSSL_cleanse(token, sizeof(token));
}

static void handle_logout(mg_dashboard_t *d, mg_http_req_t *req, mg_websession_t *se)
{
    if (!mg_websession_csrf_ok(se, req)) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 403, "CSRF_FAILED",
                        "X-CSRF-Token is missing or wrong", 0);
        return;
    }
    uint64_t serial = se->serial;
    mg_websession_end(se);
    mg_streams_end_session(&d->streams, serial);
    mg_answer_account(d->metrics, req, MG_EP_OTHER, 204, NULL);
    mg_http_respond(req, 204, "application/json",
                    "Set-Cookie: " MG_WEBSESSION_COOKIE "=; Path=/; Max-Age=0; HttpOnly; "
                    "SameSite=Strict\r\nCache-Control: no-store\r\n",
                    NULL, 0);
}

/* ---- routing -------------------------------------------------------------------------------- */

static int method_is(mg_dashboard_t *d, mg_http_req_t *req, int method)
{
    if (req->method == method) return 1;
    mg_answer_error(d->metrics, req, MG_EP_OTHER, 405, "METHOD_NOT_ALLOWED",
                    method == HTTP_POST ? "use POST" : "use GET", 0);
    return 0;
}

/* The endpoints that need a session: 401 without one. */
static void handle_signed(mg_dashboard_t *d, mg_http_req_t *req, const char *sub)
{
    mg_websession_t *se = mg_websession_find(&d->sessions, req, mg_unix_ms());
    int logout = strcmp(sub, "logout") == 0;
    if (!method_is(d, req, logout ? HTTP_POST : HTTP_GET)) return;
    if (!se) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 401, "AUTH_FAILED",
                        "not signed in (or the session expired)", 0);
        return;
    }
    if (logout) handle_logout(d, req, se);
    else if (strcmp(sub, "session") == 0) answer_session(d, req, se, NULL);
    else mg_streams_open(&d->streams, req, se);
}

int mg_dashboard_handle(mg_dashboard_t *d, mg_http_req_t *req)
{
    const char *path = req->path;
    int ours = strcmp(path, "/") == 0 || strcmp(path, PREFIX) == 0 ||
               strncmp(path, PREFIX "/", sizeof(PREFIX)) == 0;
    if (!ours || !conf_of(d)->enabled) return 0;
    if (strcmp(path, "/") == 0) {
        if (!method_is(d, req, HTTP_GET)) return 1;
        mg_answer_account(d->metrics, req, MG_EP_OTHER, 302, NULL);
        mg_http_respond(req, 302, "text/plain", "Location: " PREFIX "\r\n", NULL, 0);
        return 1;
    }
    const char *sub = path[sizeof(PREFIX) - 1] ? path + sizeof(PREFIX) : "";
    if (strcmp(sub, "login") == 0) {
        if (method_is(d, req, HTTP_POST)) handle_login(d, req);
    } else if (!strcmp(sub, "logout") || !strcmp(sub, "session") || !strcmp(sub, "stream")) {
        handle_signed(d, req, sub);
    } else if (method_is(d, req, HTTP_GET)) {
        serve_file(d, req, *sub ? sub : "index.html");
    }
    return 1;
}

void mg_dashboard_admin(mg_dashboard_t *d, mg_http_req_t *req)
{
    mg_websession_t *se = NULL;
    if (!mg_http_header(req, "Authorization") && conf_of(d)->enabled)
        se = mg_websession_find(&d->sessions, req, mg_unix_ms());
    if (!se) {
        mg_admin_handle(d->admin, req); /* the Bearer token, or its 401 */
        return;
    }
    int safe = req->method == HTTP_GET || req->method == HTTP_HEAD;
    if (!safe && !mg_websession_csrf_ok(se, req)) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 403, "CSRF_FAILED",
                        "X-CSRF-Token is missing or wrong", 0);
        return;
    }
    mg_admin_handle_as(d->admin, req, se->role == MG_ADMIN_TENANT ? se->tenant_token : NULL);
}

int mg_dashboard_platform(mg_dashboard_t *d, mg_http_req_t *req)
{
    if (mg_http_header(req, "Authorization") || !conf_of(d)->enabled) return 0;
    mg_websession_t *se = mg_websession_find(&d->sessions, req, mg_unix_ms());
    if (!se || se->role != MG_ADMIN_PLATFORM) return 0;
    if (req->method != HTTP_GET && req->method != HTTP_HEAD && !mg_websession_csrf_ok(se, req)) {
        mg_answer_error(d->metrics, req, MG_EP_OTHER, 403, "CSRF_FAILED",
                        "X-CSRF-Token is missing or wrong", 0);
        return -1;
    }
    return 1;
}
