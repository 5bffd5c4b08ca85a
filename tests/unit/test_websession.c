/* Unit tests for core/api/websession.c: a session found by its cookie (among others in the
 * Cookie header) and only by it, kept as a digest, ended at its expiry, the CSRF token
 * compared exactly, the table full (the session closest to its expiry goes), a tenant's token
 * kept and ended with it, serials never reused. */
#include "api/websession.h"
#include "mgtest.h"

#include <stdio.h>
#include <string.h>

/* A request carrying up to two headers. */
typedef struct {
    mg_http_req_t req;
    mg_http_header_t h[2];
    char names[2][32], values[2][512];
} fake_t;

static mg_http_req_t *fake(fake_t *f, const char *n1, const char *v1, const char *n2,
                           const char *v2)
{
    memset(f, 0, sizeof(*f));
    const char *n[2] = {n1, n2}, *v[2] = {v1, v2};
    for (int i = 0; i < 2 && n[i]; i++) {
        snprintf(f->names[i], sizeof(f->names[i]), "%s", n[i]);
        snprintf(f->values[i], sizeof(f->values[i]), "%s", v[i]);
        f->h[i].name = f->names[i];
        f->h[i].value = f->values[i];
        f->req.n_headers++;
    }
    f->req.headers = f->h;
    return &f->req;
}

static mg_http_req_t *with_cookie(fake_t *f, const char *cookie_value)
{
    char c[600];
    snprintf(c, sizeof(c), "theme=dark; " MG_WEBSESSION_COOKIE "=%s; other=1", cookie_value);
    return fake(f, "Cookie", c, NULL, NULL);
}

static void test_create_find(void)
{
    mg_websessions_t s;
    CHECK(mg_websessions_init(&s, 4) == 0);
    char cookie[MG_WEBSESSION_ID_LEN + 1];
    mg_websession_t *se = mg_websession_create(&s, MG_ADMIN_PLATFORM, 0, NULL, 60, 1000, cookie);
    CHECK(se != NULL);
    CHECK_EQ_INT(strlen(cookie), MG_WEBSESSION_ID_LEN);
    CHECK(strstr(se->id_digest, cookie) == NULL); /* a digest, not the value */
    CHECK_EQ_INT(strlen(se->csrf), MG_WEBSESSION_ID_LEN);
    CHECK(strcmp(se->csrf, cookie) != 0);
    fake_t f;
    CHECK(mg_websession_find(&s, with_cookie(&f, cookie), 2000) == se);
    char wrong[MG_WEBSESSION_ID_LEN + 1];
    memcpy(wrong, cookie, sizeof(wrong));
    wrong[0] = wrong[0] == 'a' ? 'b' : 'a';
    CHECK(mg_websession_find(&s, with_cookie(&f, wrong), 2000) == NULL);
    CHECK(mg_websession_find(&s, with_cookie(&f, "short"), 2000) == NULL);
    CHECK(mg_websession_find(&s, fake(&f, "Cookie", "mg_sessionx=1", NULL, NULL), 2000) == NULL);
    CHECK(mg_websession_find(&s, fake(&f, NULL, NULL, NULL, NULL), 2000) == NULL);
    /* the cookie alone in the header, and first */
    char alone[100];
    snprintf(alone, sizeof(alone), MG_WEBSESSION_COOKIE "=%s", cookie);
    CHECK(mg_websession_find(&s, fake(&f, "Cookie", alone, NULL, NULL), 2000) == se);
    mg_websessions_free(&s);
}

static void test_expiry(void)
{
    mg_websessions_t s;
    mg_websessions_init(&s, 2);
    char cookie[MG_WEBSESSION_ID_LEN + 1];
    mg_websession_t *se = mg_websession_create(&s, MG_ADMIN_PLATFORM, 0, NULL, 60, 1000, cookie);
    uint64_t serial = se->serial;
    fake_t f;
    CHECK(mg_websession_find(&s, with_cookie(&f, cookie), 1000 + 59999) == se);
    CHECK(mg_websession_by_serial(&s, serial, 1000 + 59999) == se);
    CHECK(mg_websession_find(&s, with_cookie(&f, cookie), 1000 + 60000) == NULL);
    CHECK(mg_websession_by_serial(&s, serial, 1000) == NULL); /* ended: gone for good */
    CHECK(!s.slots[0].id_digest[0] && !s.slots[1].id_digest[0]);
    mg_websessions_free(&s);
}

static void test_csrf(void)
{
    mg_websessions_t s;
    mg_websessions_init(&s, 1);
    char cookie[MG_WEBSESSION_ID_LEN + 1];
    mg_websession_t *se = mg_websession_create(&s, MG_ADMIN_PLATFORM, 0, NULL, 60, 0, cookie);
    fake_t f;
    CHECK(mg_websession_csrf_ok(se, fake(&f, "X-CSRF-Token", se->csrf, NULL, NULL)));
    CHECK(mg_websession_csrf_ok(se, fake(&f, "x-csrf-token", se->csrf, NULL, NULL)));
    CHECK(!mg_websession_csrf_ok(se, fake(&f, NULL, NULL, NULL, NULL)));
    CHECK(!mg_websession_csrf_ok(se, fake(&f, "X-CSRF-Token", "", NULL, NULL)));
    char longer[MG_WEBSESSION_ID_LEN + 2];
    snprintf(longer, sizeof(longer), "%sx", se->csrf);
    CHECK(!mg_websession_csrf_ok(se, fake(&f, "X-CSRF-Token", longer, NULL, NULL)));
    CHECK(!mg_websession_csrf_ok(se, fake(&f, "X-CSRF-Token", cookie, NULL, NULL)));
    mg_websessions_free(&s);
}

static void test_full_table_and_tenant(void)
{
    mg_websessions_t s;
    mg_websessions_init(&s, 2);
    char c1[MG_WEBSESSION_ID_LEN + 1], c2[MG_WEBSESSION_ID_LEN + 1], c3[MG_WEBSESSION_ID_LEN + 1];
    mg_websession_t *a = mg_websession_create(&s, MG_ADMIN_TENANT, 7, "mgt-abc", 100, 0, c1);
    CHECK(a && a->tenant_id == 7);
    CHECK_STR(a->tenant_token, "mgt-abc");
    uint64_t sa = a->serial;
    mg_websession_t *b = mg_websession_create(&s, MG_ADMIN_PLATFORM, 9, NULL, 200, 0, c2);
    CHECK(b && b->tenant_id == 0 && !b->tenant_token); /* a platform session has no tenant */
    /* full: the one closest to its expiry (a) goes */
    mg_websession_t *c = mg_websession_create(&s, MG_ADMIN_PLATFORM, 0, NULL, 300, 10, c3);
    CHECK(c == a);
    CHECK(c->serial != sa);
    CHECK(!c->tenant_token);
    fake_t f;
    CHECK(mg_websession_find(&s, with_cookie(&f, c1), 20) == NULL);
    CHECK(mg_websession_find(&s, with_cookie(&f, c2), 20) == b);
    CHECK(mg_websession_find(&s, with_cookie(&f, c3), 20) == c);
    mg_websession_end(b);
    CHECK(mg_websession_find(&s, with_cookie(&f, c2), 20) == NULL);
    mg_websessions_free(&s);
}

int main(void)
{
    MG_RUN(test_create_find);
    MG_RUN(test_expiry);
    MG_RUN(test_csrf);
    MG_RUN(test_full_table_and_tenant);
    return mg_test_summary();
}
