/* cors: cross-origin answers for the client API; see cors.h. */
#include "api/cors.h"

#include <stdio.h>
#include <string.h>

#include "obs/answer.h"

/* The headers the gateway's answers carry that a browser's script may read. */
#define EXPOSED "X-Request-Id, X-Sidecar-Degraded, Retry-After, Idempotent-Replayed"

static int allowed(const mg_cors_conf_t *cors, const char *origin)
{
    for (size_t i = 0; i < cors->n_origins; i++)
        if (!strcmp(cors->origins[i], "*") || !strcmp(cors->origins[i], origin)) return 1;
    return 0;
}

/* A header list as a preflight asks for it ("content-type, authorization"): only header-name
 * characters, commas and spaces, so that it can be echoed back as it is. */
static int header_list(const char *s)
{
    for (; *s; s++)
        if (!(*s == ',' || *s == ' ' || *s == '-' || *s == '_' || (*s >= '0' && *s <= '9') ||
              (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
            return 0;
    return 1;
}

int mg_cors_handle(const mg_cors_conf_t *cors, mg_http_req_t *req, mg_metrics_t *m)
{
    const char *origin = cors->n_origins ? mg_http_header(req, "Origin") : NULL;
    if (!origin || strncmp(req->path, "/v1/", 4) != 0) return 0;
    int preflight =
        req->method == HTTP_OPTIONS && mg_http_header(req, "Access-Control-Request-Method") != NULL;
    if (!allowed(cors, origin) || strlen(origin) > 256) {
        if (!preflight) return 0; /* served as usual; the browser keeps the answer from the page */
        mg_answer_error(m, req, MG_EP_OTHER, 403, "CORS_REFUSED",
                        "this origin may not call the API", 0);
        return 1;
    }
    char lines[512];
    snprintf(lines, sizeof(lines),
             "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n%s"
             "Access-Control-Expose-Headers: " EXPOSED "\r\n",
             origin, cors->allow_credentials ? "Access-Control-Allow-Credentials: true\r\n" : "");
    req->head_lines = mg_arena_strdup(&req->arena, lines);
    if (!preflight) return 0;
    const char *asked = mg_http_header(req, "Access-Control-Request-Headers");
    char extra[1024];
    snprintf(extra, sizeof(extra),
             "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS\r\n"
             "Access-Control-Allow-Headers: %s\r\nAccess-Control-Max-Age: %d\r\n",
             asked && *asked && strlen(asked) < 700 && header_list(asked)
                 ? asked
                 : "authorization, content-type, x-api-key, idempotency-key, x-priority",
             cors->max_age_s);
    mg_answer_account(m, req, MG_EP_OTHER, 204, NULL);
    mg_http_respond(req, 204, "text/plain", extra, "", 0);
    return 1;
}
