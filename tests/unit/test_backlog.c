/* The backlog of a degraded instance (core/cluster/backlog.c): admissions kept per (level,
 * second) with their counts and tokens, only levels with a window, aged out after a minute,
 * bounded (what does not fit is counted), spend summed per level and day, taken out oldest
 * first. */
#include "mgtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/backlog.h"

static mg_shared_level_t level(const char *name, uint32_t rpm, uint64_t tpm, uint32_t conc)
{
    mg_shared_level_t l = {.rpm = rpm, .tpm = tpm, .conc = conc};
    snprintf(l.name, sizeof(l.name), "%s", name);
    return l;
}

static void test_buckets_per_level_and_second(void)
{
    mg_backlog_t *bl = calloc(1, sizeof(*bl));
    mg_shared_level_t lv[3] = {level("k:1", 10, 0, 0), level("p:1", 0, 1000, 0),
                               level("v:x", 0, 0, 5)};
    uint64_t t0 = 1700000000000ull;
    mg_backlog_admit(bl, lv, 3, 7, t0);
    mg_backlog_admit(bl, lv, 3, 5, t0 + 400); /* the same second */
    mg_backlog_admit(bl, lv, 3, 1, t0 + 1200);
    CHECK(mg_backlog_pending(bl));
    mg_backlog_bucket_t out[8];
    size_t n = mg_backlog_take(bl, out, 8);
    CHECK_EQ_INT(n, 4); /* k:1 and p:1 in two seconds; a concurrency-only level is not kept */
    CHECK_STR(out[0].name, "k:1");
    CHECK_EQ_INT(out[0].count, 2);
    CHECK_EQ_INT(out[0].tokens, 12);
    CHECK_EQ_INT(out[0].last_ms, t0 + 400);
    CHECK(out[0].rpm && !out[0].tpm);
    CHECK_STR(out[1].name, "p:1");
    CHECK(!out[1].rpm && out[1].tpm);
    CHECK_EQ_INT(out[2].count, 1);
    CHECK(!mg_backlog_pending(bl));
    free(bl);
}

static void test_aged_out_and_bounded(void)
{
    mg_backlog_t *bl = calloc(1, sizeof(*bl));
    mg_shared_level_t k = level("k:2", 10, 0, 0);
    uint64_t t0 = 1700000000000ull;
    mg_backlog_admit(bl, &k, 1, 1, t0);
    mg_backlog_admit(bl, &k, 1, 1, t0 + 30000);
    mg_backlog_age(bl, t0 + MG_BACKLOG_WINDOW_MS); /* the first has left the window */
    CHECK_EQ_INT(bl->n, 1);
    for (size_t i = 0; i < MG_BACKLOG_BUCKETS + 10; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), "k:%zu", 100 + i);
        mg_shared_level_t l = level(nm, 1, 0, 0);
        mg_backlog_admit(bl, &l, 1, 1, t0 + 31000);
    }
    CHECK_EQ_INT(bl->n, MG_BACKLOG_BUCKETS);
    CHECK_EQ_INT(bl->dropped, 11);
    free(bl);
}

static void test_spend_summed(void)
{
    mg_backlog_t *bl = calloc(1, sizeof(*bl));
    mg_shared_spend_t sp = {.n = 2, .micros = 400, .day = "2026-12-03", .month = "2026-12"};
    snprintf(sp.lv[0].name, sizeof(sp.lv[0].name), "k:1");
    snprintf(sp.lv[1].name, sizeof(sp.lv[1].name), "t:1");
    mg_backlog_spend(bl, &sp);
    sp.micros = 100;
    mg_backlog_spend(bl, &sp);
    sp.micros = 0; /* nothing charged: nothing kept */
    mg_backlog_spend(bl, &sp);
    mg_backlog_spend_t out[4];
    CHECK_EQ_INT(mg_backlog_take_spend(bl, out, 1), 1);
    CHECK_STR(out[0].name, "k:1");
    CHECK_EQ_INT(out[0].micros, 500);
    CHECK_STR(out[0].month, "2026-12");
    CHECK_EQ_INT(mg_backlog_take_spend(bl, out, 4), 1);
    CHECK_STR(out[0].name, "t:1");
    CHECK(!mg_backlog_pending(bl));
    free(bl);
}

int main(void)
{
    MG_RUN(test_buckets_per_level_and_second);
    MG_RUN(test_aged_out_and_bounded);
    MG_RUN(test_spend_summed);
    return mg_test_summary();
}
