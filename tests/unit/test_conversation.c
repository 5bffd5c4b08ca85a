/* Unit tests for core/session/session.c: create, find by owner (another tenant or project
 * finds nothing), expiry by ttl and by idle time, the message cap that never leaves a tool
 * result without its call, the memory budget (least recently used out, a held session
 * kept), persistence through the store's writer thread (a reopened store gives the
 * sessions back, deletion and expiry remove the rows), and the chat token rule
 * (token/chat.h). */
#include "mgtest.h"
#include "session/session.h"
#include "token/chat.h"
#include "token/registry.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

static mg_context_conf_t conf(void)
{
    mg_context_conf_t c;
    mg_context_conf_defaults(&c);
    return c;
}

static const mg_session_owner_t alice = {0, 1, 10}, bob = {0, 2, 20}, alice_other = {0, 1, 11};

static void test_create_and_owner(void)
{
    mg_context_conf_t c = conf();
    mg_sessions_t *s = mg_sessions_open(NULL, 0, 1000);
    mg_session_spec_t spec = {.system = "be brief", .max_messages = 10};
    mg_session_t *x = mg_sessions_create(s, &alice, &spec, &c, 1000);
    CHECK(x != NULL);
    CHECK(strncmp(x->id, "sess_", 5) == 0 && strlen(x->id) == MG_SESSION_ID_LEN);
    CHECK_STR(x->system, "be brief");
    CHECK_EQ_INT(x->max_messages, 10);
    CHECK_EQ_INT(x->idle_s, 60 * 60);
    CHECK(mg_sessions_find(s, x->id, &alice, &c, 1001) == x);
    CHECK(mg_sessions_find(s, x->id, &bob, &c, 1001) == NULL);
    CHECK(mg_sessions_find(s, x->id, &alice_other, &c, 1001) == NULL);
    mg_session_owner_t all = {.all = 1};
    CHECK(mg_sessions_find(s, x->id, &all, &c, 1001) == x);
    char id[64];
    snprintf(id, sizeof(id), "%s", x->id);
    mg_sessions_delete(s, x);
    CHECK(mg_sessions_find(s, id, &alice, &c, 1002) == NULL);
    CHECK_EQ_INT((int)mg_sessions_count(s), 0);
    CHECK_EQ_INT((int)mg_sessions_bytes(s), 0);
    mg_sessions_free(s);
}

static void test_expiry(void)
{
    mg_context_conf_t c = conf();
    mg_sessions_t *s = mg_sessions_open(NULL, 0, 0);
    mg_session_spec_t spec = {.ttl_s = 100, .idle_s = 10};
    mg_session_t *x = mg_sessions_create(s, &alice, &spec, &c, 0);
    char id[64];
    snprintf(id, sizeof(id), "%s", x->id);
    CHECK(mg_sessions_find(s, id, &alice, &c, 9000) == x);
    mg_sessions_touch(s, x, 9000); /* idle clock restarts */
    CHECK(mg_sessions_find(s, id, &alice, &c, 18000) == x);
    mg_sessions_touch(s, x, 18000);
    CHECK_EQ_INT((int)(mg_session_expires_ms(x) / 1000), 28);
    CHECK(mg_sessions_find(s, id, &alice, &c, 28000) == NULL); /* idle */
    CHECK_EQ_INT((int)mg_sessions_count(s), 0);                /* and swept by that find */
    /* ttl wins over activity */
    x = mg_sessions_create(s, &alice, &spec, &c, 0);
    for (int t = 5000; t < 100000; t += 5000) mg_sessions_touch(s, x, t);
    CHECK_EQ_INT((int)(mg_session_expires_ms(x) / 1000), 100);
    /* a held session is not swept while its request runs */
    x->holder = x;
    mg_sessions_sweep(s, &c, 200000);
    CHECK_EQ_INT((int)mg_sessions_count(s), 1);
    x->holder = NULL;
    mg_sessions_sweep(s, &c, 200000);
    CHECK_EQ_INT((int)mg_sessions_count(s), 0);
    mg_sessions_free(s);
}

static void test_message_cap_keeps_tool_pairs(void)
{
    mg_context_conf_t c = conf();
    mg_sessions_t *s = mg_sessions_open(NULL, 0, 0);
    mg_session_spec_t spec = {.max_messages = 4};
    mg_session_t *x = mg_sessions_create(s, &alice, &spec, &c, 0);
    const char *msgs[] = {
        "{\"role\":\"user\",\"content\":\"weather?\"}",
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
        "\"function\":{\"name\":\"w\",\"arguments\":\"{}\"}}]}",
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"}",
        "{\"role\":\"assistant\",\"content\":\"sunny\"}",
        "{\"role\":\"user\",\"content\":\"thanks\"}",
    };
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(mg_sessions_append(s, x, msgs[i], 5, -1, i), 0);
    /* five past a cap of four: the first goes; the call and its result stay together */
    CHECK_EQ_INT((int)x->n_msgs, 4);
    CHECK_EQ_INT((int)x->msgs[0].seq, 2);
    CHECK(strstr(x->msgs[1].json, "\"tool\"") != NULL);
    /* one more: the call goes, and its result with it (it would lead without its call) */
    CHECK_EQ_INT(mg_sessions_append(s, x, msgs[4], 5, -1, 6), 0);
    CHECK_EQ_INT((int)x->n_msgs, 3);
    CHECK_EQ_INT((int)x->msgs[0].seq, 4);
    CHECK(strstr(x->msgs[0].json, "\"sunny\"") != NULL);
    CHECK_EQ_INT((int)mg_session_tokens(x), 15);
    mg_sessions_free(s);
}

static void test_memory_budget(void)
{
    mg_context_conf_t c = conf();
    c.memory_budget_bytes = 8192;
    mg_sessions_t *s = mg_sessions_open(NULL, 0, 0);
    mg_session_spec_t spec = {0};
    char big[3000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    mg_session_t *first = mg_sessions_create(s, &alice, &spec, &c, 0);
    first->holder = first; /* held: never evicted */
    mg_sessions_append(s, first, big, 1, -1, 0);
    char ids[4][64];
    for (int i = 0; i < 4; i++) {
        mg_session_t *x = mg_sessions_create(s, &alice, &spec, &c, i + 1);
        snprintf(ids[i], sizeof(ids[i]), "%s", x->id);
        mg_sessions_append(s, x, big, 1, -1, i + 1);
        mg_sessions_sweep(s, &c, i + 1);
    }
    CHECK(mg_sessions_bytes(s) <= 8192);
    CHECK(mg_sessions_find(s, first->id, &alice, &c, 10) == first);
    CHECK(mg_sessions_find(s, ids[3], &alice, &c, 10) != NULL); /* the newest stays */
    CHECK(mg_sessions_find(s, ids[0], &alice, &c, 10) == NULL); /* the oldest went */
    first->holder = NULL;
    mg_sessions_free(s);
}

static void test_persistence(void)
{
    mg_context_conf_t c = conf();
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/s.db", tmpdir);
    mg_store_t *st = NULL;
    CHECK_EQ_INT(mg_store_open(path, &st, err, sizeof(err)), 0);
    mg_sessions_t *s = mg_sessions_open(st, 1, 1000);
    mg_session_spec_t spec = {.model = "m", .system = "sys", .metadata = "{\"a\":1}", .ttl_s = 50};
    mg_session_t *keep = mg_sessions_create(s, &alice, &spec, &c, 1000);
    mg_sessions_append(s, keep, "{\"role\":\"user\",\"content\":\"hi\"}", 7, -1, 1000);
    mg_sessions_append(s, keep, "{\"role\":\"assistant\",\"content\":\"hello\"}", 8, -1, 1000);
    mg_session_t *gone = mg_sessions_create(s, &bob, &spec, &c, 1000);
    mg_sessions_append(s, gone, "{\"role\":\"user\",\"content\":\"x\"}", 1, -1, 1000);
    char keep_id[64], gone_id[64];
    snprintf(keep_id, sizeof(keep_id), "%s", keep->id);
    snprintf(gone_id, sizeof(gone_id), "%s", gone->id);
    mg_sessions_delete(s, gone);
    mg_sessions_free(s);
    mg_store_flush(st);
    s = mg_sessions_open(st, 1, 2000);
    mg_session_t *back = mg_sessions_find(s, keep_id, &alice, &c, 2000);
    CHECK(back != NULL);
    if (back) {
        CHECK_STR(back->system, "sys");
        CHECK_STR(back->model, "m");
        CHECK_STR(back->metadata, "{\"a\":1}");
        CHECK_EQ_INT((int)back->n_msgs, 2);
        CHECK_EQ_INT((int)mg_session_tokens(back), 15);
        CHECK_EQ_INT((int)back->next_seq, 3);
        CHECK_EQ_INT(back->ttl_s, 50);
    }
    CHECK(mg_sessions_find(s, gone_id, &bob, &c, 2000) == NULL);
    mg_sessions_free(s);
    mg_store_flush(st);
    /* past its ttl: start-up prunes the rows on the writer thread */
    s = mg_sessions_open(st, 1, 60000);
    CHECK_EQ_INT((int)mg_sessions_count(s), 0);
    mg_sessions_free(s);
    mg_store_flush(st);
    int rows = -1;
    char e2[256];
    void count_cb(void *ud, int n, const char *const *cols);
    mg_store_query(
        st, "SELECT (SELECT COUNT(*) FROM sessions) + (SELECT COUNT(*) FROM session_messages)", 0,
        NULL, count_cb, &rows, e2, sizeof(e2));
    CHECK_EQ_INT(rows, 0);
    mg_store_close(st);
}

void count_cb(void *ud, int n, const char *const *cols)
{
    *(int *)ud = n > 0 && cols[0] ? atoi(cols[0]) : -1;
}

static void test_chat_tokens(void)
{
    int want[MG_ENC_COUNT] = {0};
    want[MG_ENC_O200K] = 1;
    char err[256], dir[1024];
    mg_encoding_data_dir(NULL, dir, sizeof(dir));
    if (mg_token_registry_load(dir, want, err, sizeof(err)) != 0) {
        fprintf(stderr, "  (no rank files: %s)\n", err);
        CHECK(0);
        return;
    }
    const mg_encoding_t *e = mg_token_registry_get(MG_ENC_O200K);
    /* "user" and "hello" are one token each in o200k_base */
    cJSON *m = cJSON_Parse("{\"role\":\"user\",\"content\":\"hello\"}");
    CHECK_EQ_INT((int)mg_chat_message_tokens(e, m), 3 + 1 + 1);
    cJSON *named = cJSON_Parse("{\"role\":\"user\",\"name\":\"bob\",\"content\":\"hello\"}");
    CHECK_EQ_INT((int)mg_chat_message_tokens(e, named), 3 + 1 + 1 + 1 + 1);
    cJSON *parts =
        cJSON_Parse("{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hello\"},"
                    "{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}");
    CHECK_EQ_INT((int)mg_chat_message_tokens(e, parts), 5);
    cJSON *list = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hello\"},"
                              "{\"role\":\"user\",\"content\":\"hello\"}]");
    CHECK_EQ_INT((int)mg_chat_messages_tokens(e, list), 5 + 5 + 3);
    cJSON_Delete(m);
    cJSON_Delete(named);
    cJSON_Delete(parts);
    cJSON_Delete(list);
    mg_token_registry_free();
}

int main(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mg-session-XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    MG_RUN(test_create_and_owner);
    MG_RUN(test_expiry);
    MG_RUN(test_message_cap_keeps_tool_pairs);
    MG_RUN(test_memory_budget);
    MG_RUN(test_persistence);
    MG_RUN(test_chat_tokens);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return mg_test_summary();
}
