/* Unit tests for core/obs/recent.c: sequence numbers from 1, what a reader gets back by
 * number, and the ring going round (the oldest gone, first() moving on). */
#include "obs/recent.h"
#include "mgtest.h"

#include <stdio.h>
#include <stdlib.h>

static mg_recent_t R;

static void push(int status)
{
    mg_recent_entry_t e = {0};
    e.status = status;
    snprintf(e.request_id, sizeof(e.request_id), "req-%d", status);
    mg_recent_push(&R, &e);
}

static void test_empty_and_first(void)
{
    mg_recent_init(&R);
    CHECK_EQ_INT(R.next_seq, 1);
    CHECK_EQ_INT(mg_recent_first(&R), 1);
    CHECK(mg_recent_get(&R, 0) == NULL);
    CHECK(mg_recent_get(&R, 1) == NULL);
    push(200);
    const mg_recent_entry_t *e = mg_recent_get(&R, 1);
    CHECK(e && e->seq == 1 && e->status == 200);
    CHECK_STR(e->request_id, "req-200");
    CHECK(mg_recent_get(&R, 2) == NULL);
}

static void test_wrap(void)
{
    mg_recent_init(&R);
    for (int i = 1; i <= MG_RECENT_CAP + 10; i++) push(i);
    CHECK_EQ_INT(R.next_seq, MG_RECENT_CAP + 11);
    CHECK_EQ_INT(mg_recent_first(&R), 11);
    CHECK(mg_recent_get(&R, 10) == NULL); /* went round */
    const mg_recent_entry_t *e = mg_recent_get(&R, 11);
    CHECK(e && e->seq == 11 && e->status == 11);
    e = mg_recent_get(&R, MG_RECENT_CAP + 10);
    CHECK(e && e->status == MG_RECENT_CAP + 10);
    int ok = 1;
    for (uint64_t s = mg_recent_first(&R); s < R.next_seq; s++) {
        e = mg_recent_get(&R, s);
        ok &= e && e->seq == s && e->status == (int)s;
    }
    CHECK(ok);
}

int main(void)
{
    MG_RUN(test_empty_and_first);
    MG_RUN(test_wrap);
    return mg_test_summary();
}
