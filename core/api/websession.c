/* websession: the dashboard's sessions; see session.h. */
#include "api/websession.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>

#include "base/crypto.h"

int mg_websessions_init(mg_websessions_t *s, int cap)
{
    s->slots = calloc((size_t)cap, sizeof(*s->slots));
    s->cap = s->slots ? cap : 0;
    s->next_serial = 1;
    return s->slots ? 0 : -1;
}

void mg_websession_end(mg_websession_t *se)
{
    if (se->tenant_token) {
        OPENSSL_cleanse(se->tenant_token, strlen(se->tenant_token));
        free(se->tenant_token);
    }
    OPENSSL_cleanse(se, sizeof(*se));
}

void mg_websessions_free(mg_websessions_t *s)
{
    for (int i = 0; i < s->cap; i++) mg_websession_end(&s->slots[i]);
    free(s->slots);
    s->slots = NULL;
    s->cap = 0;
}

/* 32 random bytes as 64 hex digits. */
static int random_hex(char *out)
{
    unsigned char b[32];
    if (mg_random_bytes(b, sizeof(b)) != 0) return -1;
    for (size_t i = 0; i < sizeof(b); i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    OPENSSL_cleanse(b, sizeof(b));
    return 0;
}

/* A free slot, else the one that expires first (ended). Expired ones are ended on the way. */
static mg_websession_t *free_slot(mg_websessions_t *s, uint64_t now_ms)
{
    mg_websession_t *best = NULL;
    for (int i = 0; i < s->cap; i++) {
        mg_websession_t *se = &s->slots[i];
        if (se->id_digest[0] && se->expires_ms <= now_ms) mg_websession_end(se);
        if (!se->id_digest[0]) return se;
        if (!best || se->expires_ms < best->expires_ms) best = se;
    }
    mg_websession_end(best);
    return best;
}

mg_websession_t *mg_websession_create(mg_websessions_t *s, mg_admin_role_t role, int64_t tenant_id,
                                      const char *tenant_token, int ttl_s, uint64_t now_ms,
                                      char *cookie)
{
    if (s->cap <= 0) return NULL;
    char *tok = tenant_token ? strdup(tenant_token) : NULL;
    if (tenant_token && !tok) return NULL;
    mg_websession_t *se = free_slot(s, now_ms);
    if (random_hex(cookie) != 0 || random_hex(se->csrf) != 0) {
        free(tok);
        mg_websession_end(se);
        return NULL;
    }
    mg_sha256_hex(cookie, MG_WEBSESSION_ID_LEN, se->id_digest);
    se->expires_ms = now_ms + (uint64_t)ttl_s * 1000;
    se->role = role;
    se->tenant_id = role == MG_ADMIN_TENANT ? tenant_id : 0;
    se->tenant_token = tok;
    se->serial = s->next_serial++;
    return se;
}

/* The value of cookie `name` in a Cookie header into out; 0 or -1 (absent, too long). */
static int cookie_value(const char *header, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = header; p && *p;) {
        while (*p == ' ' || *p == ';') p++;
        const char *end = strchr(p, ';');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
            size_t vl = len - nl - 1;
            if (vl >= cap) return -1;
            memcpy(out, p + nl + 1, vl);
            out[vl] = '\0';
            return 0;
        }
        p = end;
    }
    return -1;
}

mg_websession_t *mg_websession_find(mg_websessions_t *s, const mg_http_req_t *req, uint64_t now_ms)
{
    const char *h = mg_http_header(req, "Cookie");
    char value[MG_WEBSESSION_ID_LEN + 1], digest[65];
    if (!h || cookie_value(h, MG_WEBSESSION_COOKIE, value, sizeof(value)) != 0 ||
        strlen(value) != MG_WEBSESSION_ID_LEN)
        return NULL;
    mg_sha256_hex(value, MG_WEBSESSION_ID_LEN, digest);
    OPENSSL_cleanse(value, sizeof(value));
    for (int i = 0; i < s->cap; i++) {
        mg_websession_t *se = &s->slots[i];
        if (!se->id_digest[0] || !mg_const_time_eq(se->id_digest, 64, digest, 64)) continue;
        if (se->expires_ms > now_ms) return se;
        mg_websession_end(se);
        return NULL;
    }
    return NULL;
}

mg_websession_t *mg_websession_by_serial(mg_websessions_t *s, uint64_t serial, uint64_t now_ms)
{
    for (int i = 0; i < s->cap; i++) {
        mg_websession_t *se = &s->slots[i];
        if (se->id_digest[0] && se->serial == serial) return se->expires_ms > now_ms ? se : NULL;
    }
    return NULL;
}

int mg_websession_csrf_ok(const mg_websession_t *se, const mg_http_req_t *req)
{
    const char *h = mg_http_header(req, "X-CSRF-Token");
    return h && mg_const_time_eq(se->csrf, strlen(se->csrf), h, strlen(h));
}
