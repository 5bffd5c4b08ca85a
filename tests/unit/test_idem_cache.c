/* Unit tests for core/pipeline/idem_cache.c: done entries per group capped, the oldest out
 * first; one group spraying keys never evicts another's; pending entries are not evicted;
 * expiry by time (find and prune); the group remembers until when evicted records may be
 * live in the store; start-up notes; many entries (the table grows). */
#include "mgtest.h"
#include "pipeline/idem_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void id_of(int n, char out[65])
{
    snprintf(out, 65, "%064d", n);
}

/* Add id n to group and complete it with body "b<n>" expiring at exp. */
static mg_idem_entry_t *put(mg_idem_cache_t *c, int n, const char *group, int64_t exp)
{
    char id[65], body[32];
    id_of(n, id);
    mg_idem_entry_t *e = mg_idem_cache_add(c, id, group);
    if (!e) return NULL;
    snprintf(body, sizeof(body), "b%d", n);
    mg_idem_cache_complete(c, e, 200, 0, strdup(body), strlen(body), exp);
    return e;
}

static int present(mg_idem_cache_t *c, int n, int64_t now)
{
    char id[65];
    id_of(n, id);
    return mg_idem_cache_find(c, id, now) != NULL;
}

static void test_cap_per_group_oldest_first(void)
{
    mg_idem_cache_t c;
    CHECK_EQ_INT(mg_idem_cache_init(&c, 3), 0);
    for (int i = 1; i <= 3; i++) put(&c, i, "tenant:1", 1000);
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, "tenant:1"), 3);
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:1", 0), 0);
    char id[65];
    id_of(4, id);
    mg_idem_entry_t *e = mg_idem_cache_add(&c, id, "tenant:1");
    CHECK_EQ_INT(mg_idem_cache_complete(&c, e, 200, 1, strdup("b4"), 2, 2000), 1);
    CHECK(!present(&c, 1, 0));
    CHECK(present(&c, 2, 0) && present(&c, 3, 0) && present(&c, 4, 0));
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, "tenant:1"), 3);
    /* the evicted record lives in the store until its expiry (1000) */
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:1", 999), 1);
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:1", 1000), 0);
    e = mg_idem_cache_find(&c, id, 0);
    CHECK(e && e->done && e->stream == 1 && e->len == 2 && strcmp(e->body, "b4") == 0);
    CHECK_EQ_INT(c.evicted_total, 1);
    mg_idem_cache_free(&c);
}

static void test_groups_are_isolated(void)
{
    mg_idem_cache_t c;
    CHECK_EQ_INT(mg_idem_cache_init(&c, 5), 0);
    for (int i = 0; i < 5; i++) put(&c, 100 + i, "tenant:victim", 10000);
    for (int i = 0; i < 1000; i++) put(&c, 1000 + i, "tenant:sprayer", 10000);
    for (int i = 0; i < 5; i++) CHECK(present(&c, 100 + i, 0));
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, "tenant:victim"), 5);
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, "tenant:sprayer"), 5);
    CHECK(present(&c, 1999, 0) && !present(&c, 1994, 0));
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:victim", 0), 0);
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:sprayer", 0), 1);
    CHECK_EQ_INT(c.n_entries, 10);
    mg_idem_cache_free(&c);
}

static void test_pending_not_evicted(void)
{
    mg_idem_cache_t c;
    CHECK_EQ_INT(mg_idem_cache_init(&c, 1), 0);
    char id[65];
    id_of(7, id);
    mg_idem_entry_t *running = mg_idem_cache_add(&c, id, "");
    int owner;
    running->owner = &owner;
    for (int i = 0; i < 10; i++) put(&c, 20 + i, "", 5000);
    mg_idem_entry_t *e = mg_idem_cache_find(&c, id, 0);
    CHECK(e == running && !e->done && e->owner == &owner);
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, ""), 1);
    mg_idem_cache_remove(&c, running);
    CHECK(!present(&c, 7, 0));
    mg_idem_cache_free(&c);
}

static void test_expiry(void)
{
    mg_idem_cache_t c;
    CHECK_EQ_INT(mg_idem_cache_init(&c, 100), 0);
    put(&c, 1, "a", 100);
    put(&c, 2, "b", 200);
    put(&c, 3, "a", 300);
    CHECK(!present(&c, 1, 100)); /* expired: find removes it */
    CHECK_EQ_INT(mg_idem_cache_group_count(&c, "a"), 1);
    mg_idem_cache_prune(&c, 250);
    CHECK(!present(&c, 2, 0));
    CHECK(present(&c, 3, 0));
    mg_idem_cache_prune(&c, 1000);
    CHECK_EQ_INT(c.n_entries, 0);
    CHECK(c.oldest == NULL && c.newest == NULL);
    mg_idem_cache_free(&c);
}

static void test_start_up_note_and_growth(void)
{
    mg_idem_cache_t c;
    CHECK_EQ_INT(mg_idem_cache_init(&c, 100000), 0);
    CHECK_EQ_INT(mg_idem_cache_note_stored(&c, "tenant:9", 5000), 0);
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:9", 4999), 1);
    CHECK_EQ_INT(mg_idem_cache_may_be_stored(&c, "tenant:8", 0), 0);
    for (int i = 0; i < 20000; i++) put(&c, i, i % 2 ? "x" : "y", 1000);
    int found = 0;
    for (int i = 0; i < 20000; i++) found += present(&c, i, 0);
    CHECK_EQ_INT(found, 20000);
    CHECK(c.n_buckets >= 16384);
    mg_idem_cache_free(&c);
}

int main(void)
{
    MG_RUN(test_cap_per_group_oldest_first);
    MG_RUN(test_groups_are_isolated);
    MG_RUN(test_pending_not_evicted);
    MG_RUN(test_expiry);
    MG_RUN(test_start_up_note_and_growth);
    return mg_test_summary();
}
