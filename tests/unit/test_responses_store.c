/* Unit tests for core/pipeline/responses_store.c: a record is found before its write
 * committed (memory) and after (the database, read on the thread pool), with its scope; a
 * lookup's callback never runs inside the call that asked, and not at all once cancelled;
 * an unknown or expired id is not found; without a store memory keeps the newest
 * MG_RESP_MEMORY_MAX records; the scope of a caller. Everything lives in a fresh temp
 * directory. */
#include "mgtest.h"
#include "pipeline/responses_store.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

typedef struct {
    int calls, found;
    char scope[64], response[256], input[256], messages[256];
} seen_t;

static void on_found(void *ud, const mg_resp_record_t *rec)
{
    seen_t *s = ud;
    s->calls++;
    s->found = rec != NULL;
    snprintf(s->scope, sizeof(s->scope), "%s", rec ? rec->scope : "");
    snprintf(s->response, sizeof(s->response), "%s", rec ? rec->response : "");
    snprintf(s->input, sizeof(s->input), "%s", rec ? rec->input : "");
    snprintf(s->messages, sizeof(s->messages), "%s", rec ? rec->messages : "");
}

static int put(mg_resp_store_t *rs, const char *id, const char *scope, const char *response,
               const char *messages)
{
    mg_resp_record_t rec = {scope, response, "[\"in\"]", messages};
    return mg_resp_store_put(rs, id, &rec);
}

/* Look id up and run the loop until the answer came. */
static seen_t lookup(mg_resp_store_t *rs, uv_loop_t *loop, const char *id)
{
    seen_t s = {0};
    mg_resp_lookup_t *l = mg_resp_store_get(rs, id, on_found, &s);
    CHECK(l != NULL);
    CHECK_EQ_INT(s.calls, 0); /* never inside the call */
    for (int i = 0; i < 1000 && s.calls == 0; i++) uv_run(loop, UV_RUN_ONCE);
    CHECK_EQ_INT(s.calls, 1);
    return s;
}

static void test_with_store(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-resp-XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL);
    char path[300], err[256];
    snprintf(path, sizeof(path), "%s/db.sqlite", tmpdir);
    mg_store_t *st = NULL;
    CHECK_EQ_INT(mg_store_open(path, &st, err, sizeof(err)), 0);
    uv_loop_t loop;
    uv_loop_init(&loop);
    CHECK_EQ_INT(mg_store_attach(st, &loop), 0);
    mg_resp_store_deps_t d = {st, &loop, NULL, NULL, NULL, 3600};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    CHECK(rs != NULL);

    CHECK_EQ_INT(put(rs, "resp_1", "cred:a", "{\"id\":\"resp_1\"}", "[1]"), 0);
    seen_t s = lookup(rs, &loop, "resp_1"); /* before the commit: from memory */
    CHECK_EQ_INT(s.found, 1);
    CHECK_STR(s.scope, "cred:a");
    CHECK_STR(s.response, "{\"id\":\"resp_1\"}");
    CHECK_STR(s.messages, "[1]");
    CHECK_STR(s.input, "[\"in\"]");
    mg_store_flush(st);
    for (int i = 0; i < 20; i++) uv_run(&loop, UV_RUN_NOWAIT); /* the commit's callback */
    s = lookup(rs, &loop, "resp_1");                           /* from the database */
    CHECK_EQ_INT(s.found, 1);
    CHECK_STR(s.scope, "cred:a");
    CHECK_STR(s.messages, "[1]");
    s = lookup(rs, &loop, "resp_nope");
    CHECK_EQ_INT(s.found, 0);

    /* an expired row is not found */
    const char *p[1] = {"resp_old"};
    mg_store_write(st,
                   "INSERT INTO responses(id, scope, response, input, messages, created_at,"
                   " expires_at) VALUES (?1, 'cred:a', '{}', '[]', '[]', 1, 2)",
                   1, p);
    mg_store_flush(st);
    s = lookup(rs, &loop, "resp_old");
    CHECK_EQ_INT(s.found, 0);

    /* a cancelled lookup never calls back */
    seen_t never = {0};
    mg_resp_lookup_t *l = mg_resp_store_get(rs, "resp_1", on_found, &never);
    mg_resp_lookup_cancel(l);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ_INT(never.calls, 0);

    mg_store_detach(st);
    uv_run(&loop, UV_RUN_DEFAULT);
    mg_store_close(st);
    mg_resp_store_free(rs);
    uv_loop_close(&loop);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void test_memory_only(void)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    mg_resp_store_deps_t d = {NULL, &loop, NULL, NULL, NULL, 0};
    mg_resp_store_t *rs = mg_resp_store_new(&d);
    char id[32];
    for (int i = 0; i < MG_RESP_MEMORY_MAX + 5; i++) {
        snprintf(id, sizeof(id), "resp_%d", i);
        CHECK_EQ_INT(put(rs, id, "s", "{}", "[]"), 0);
    }
    CHECK_EQ_INT(lookup(rs, &loop, "resp_0").found, 0);
    CHECK_EQ_INT(lookup(rs, &loop, "resp_4").found, 0);
    CHECK_EQ_INT(lookup(rs, &loop, "resp_5").found, 1);
    snprintf(id, sizeof(id), "resp_%d", MG_RESP_MEMORY_MAX + 4);
    CHECK_EQ_INT(lookup(rs, &loop, id).found, 1);
    mg_resp_store_free(rs);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
}

static void test_scope(void)
{
    mg_auth_result_t r;
    memset(&r, 0, sizeof(r));
    r.tenant_id = 3;
    r.project_id = 4;
    char out[128];
    mg_resp_scope(&r, NULL, out, sizeof(out));
    CHECK_STR(out, "tenant:3/project:4");
    mg_http_req_t req;
    memset(&req, 0, sizeof(req));
    mg_resp_scope(NULL, &req, out, sizeof(out));
    CHECK_STR(out, "cred:-");
    mg_http_header_t h[1] = {{"Authorization", "Bearer sk-1"}};
    req.headers = h;
    req.n_headers = 1;
    mg_resp_scope(NULL, &req, out, sizeof(out));
    CHECK(strncmp(out, "cred:", 5) == 0 && strlen(out) == 5 + 64);
    CHECK(strstr(out, "sk-1") == NULL); /* the credential's digest, never itself */
}

int main(void)
{
    MG_RUN(test_with_store);
    MG_RUN(test_memory_only);
    MG_RUN(test_scope);
    return mg_test_summary();
}
