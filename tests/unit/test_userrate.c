/* test_userrate: per-user requests per minute (userrate.h): the limit, the sliding window,
 * Retry-After, users kept apart, and bounded state under a flood of distinct users. */
#include "tenancy/userrate.h"
#include "mgtest.h"

#include <stdio.h>
#include <string.h>

static int take(mg_userrate_t *u, const char *user, uint32_t limit, uint64_t now_ms, uint64_t *wait)
{
    return mg_userrate_take(u, user, strlen(user), limit, now_ms, wait);
}

static void test_limit_and_window(void)
{
    mg_userrate_t *u = mg_userrate_new();
    uint64_t wait, t0 = 1000000; /* second 1000 */
    CHECK_EQ_INT(take(u, "app/alice", 3, t0, &wait), MG_USERRATE_OK);
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 10000, &wait), MG_USERRATE_OK);
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 20000, &wait), MG_USERRATE_OK);
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 30500, &wait), MG_USERRATE_LIMITED);
    /* the first request (second 1000) leaves the window at second 1060 */
    CHECK(wait == 1060000 - (t0 + 30500));
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 59999, &wait), MG_USERRATE_LIMITED);
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 60000, &wait), MG_USERRATE_OK);
    CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 60001, &wait), MG_USERRATE_LIMITED);
    /* other users, and the same user in another application, count on their own */
    CHECK_EQ_INT(take(u, "app/bob", 3, t0 + 30500, &wait), MG_USERRATE_OK);
    CHECK_EQ_INT(take(u, "other/alice", 3, t0 + 30500, &wait), MG_USERRATE_OK);
    /* after a quiet minute the window is empty again */
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(take(u, "app/alice", 3, t0 + 200000, &wait), 0);
    CHECK_EQ_INT(mg_userrate_active(u, t0 + 200000), 1);
    mg_userrate_free(u);
}

static void test_bounded(void)
{
    mg_userrate_t *u = mg_userrate_new();
    uint64_t wait, t = 5000000;
    char name[32];
    int ok = 0, full = 0;
    for (int i = 0; i < MG_USERRATE_MAX + 5000; i++) {
        snprintf(name, sizeof(name), "app/u%d", i);
        int rc = take(u, name, 10, t, &wait);
        ok += rc == MG_USERRATE_OK;
        full += rc == MG_USERRATE_FULL;
    }
    CHECK(full >= 5000); /* never more users tracked than the table holds */
    CHECK(ok <= MG_USERRATE_MAX);
    CHECK(mg_userrate_active(u, t) == (size_t)ok);
    /* a minute later their slots are reused */
    CHECK_EQ_INT(take(u, "app/late", 10, t + 61000, &wait), MG_USERRATE_OK);
    mg_userrate_free(u);
}

int main(void)
{
    MG_RUN(test_limit_and_window);
    MG_RUN(test_bounded);
    return mg_test_summary();
}
