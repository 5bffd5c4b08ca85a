/* signin: who an admin token is, for the dashboard's sign-in (admin.h: mg_admin_signin).
 * The platform token is compared as a SHA-256 digest in constant time on the loop; a tenant
 * admin token needs the store, so its lookup runs on a libuv worker thread (a read
 * connection of its own: it never waits for the admin worker's queue). */
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>

#include "admin/req.h"
#include "base/crypto.h"
#include "base/log.h"

typedef struct signin_s {
    uv_work_t work;
    mg_store_t *store;
    char token[128]; /* wiped as soon as it was looked up */
    int found;       /* 1, 0, -1 (storage error) */
    int64_t tenant_id;
    char err[256];
    mg_admin_signin_fn done;
    void *ud;
} signin_t;

static void signin_work(uv_work_t *w)
{
    signin_t *s = w->data;
    char id[32];
    s->found = adm_tenant_token_lookup(s->store, s->token, &s->tenant_id, id, sizeof(id), s->err,
                                       sizeof(s->err));
    OPENSSL_cleanse(s->token, sizeof(s->token));
}

static void signin_done(uv_work_t *w, int status)
{
    signin_t *s = w->data;
    if (s->found < 0) mg_log_msg(MG_LOG_ERROR, NULL, "dashboard sign-in: storage: %s", s->err);
    int ok = status == 0 && s->found == 1;
    s->done(s->ud, ok ? MG_ADMIN_TENANT : MG_ADMIN_NONE, ok ? s->tenant_id : 0);
    free(s);
}

void mg_admin_signin(mg_admin_t *a, const char *token, mg_admin_signin_fn done, void *ud)
{
    char given[65];
    size_t n = strlen(token);
    if (!a->token_digest[0]) { /* the admin API is off, tenant tokens with it (front.c) */
        done(ud, MG_ADMIN_NONE, 0);
        return;
    }
    mg_sha256_hex(token, n, given);
    if (mg_const_time_eq(a->token_digest, 64, given, 64)) {
        done(ud, MG_ADMIN_PLATFORM, 0);
        return;
    }
    signin_t *s = NULL;
    if (strncmp(token, "mgt-", 4) != 0 || n >= sizeof(s->token) || !a->d.store ||
        !(s = calloc(1, sizeof(*s)))) {
        done(ud, MG_ADMIN_NONE, 0);
        return;
    }
    memcpy(s->token, token, n + 1);
    s->store = a->d.store;
    s->done = done;
    s->ud = ud;
    s->work.data = s;
    if (uv_queue_work(a->d.loop, &s->work, signin_work, signin_done) != 0) {
        OPENSSL_cleanse(s->token, sizeof(s->token));
        free(s);
        done(ud, MG_ADMIN_NONE, 0);
    }
}
