/* Unit tests for core/tenancy/quota.c: each limit (rpm, tpm, concurrency) refusing at each
 * level, rollback of a partial reservation, the sliding window's edges, retry_after,
 * settle corrections (in the window and after it), release exactly once, bad input; the
 * window allocated only for rpm/tpm limits, kept with its counts across limit changes,
 * freed when they are lifted, and reservations made across such changes. */
#include "tenancy/quota.h"
#include "mgtest.h"

#include <string.h>

/* Snapshot of a level's counters, to show a refusal changed nothing. */
typedef struct {
    uint32_t req, in_flight;
    uint64_t tok;
} snap_t;

static snap_t snap(const mg_quota_level_t *lv)
{
    snap_t s = {lv->win ? lv->win->requests : 0, lv->in_flight, lv->win ? lv->win->tokens : 0};
    return s;
}

/* Free the windows of two levels (the end of a test, or before initialising them again). */
static void free2(mg_quota_level_t *a, mg_quota_level_t *b)
{
    mg_quota_level_free(a);
    mg_quota_level_free(b);
}

static int same(snap_t a, snap_t b)
{
    return a.req == b.req && a.in_flight == b.in_flight && a.tok == b.tok;
}

/* Reserve and release at once (RPM/TPM stay counted, the lease does not). */
static int hit(mg_quota_level_t **lv, size_t n, uint64_t now_ms, uint64_t est)
{
    mg_quota_res_t r;
    int rc = mg_quota_reserve(lv, n, now_ms, est, &r);
    if (rc == MG_QUOTA_OK) mg_quota_release(&r);
    return rc;
}

/* The RPM limit refuses at level `at` (0 = key, 1 = project) and the other is untouched. */
static void rpm_at_level(int at)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, at == 0 ? 3 : 0, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, at == 1 ? 3 : 0, 0, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    CHECK_EQ_INT(hit(lv, 2, 1000, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 1500, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 2500, 0), MG_QUOTA_OK);
    snap_t k0 = snap(&key), p0 = snap(&project);
    mg_quota_res_t r;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 3000, 0, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, at);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_RPM);
    /* two requests were counted in second 1: they leave at 61.000 s */
    CHECK_EQ_INT(r.retry_after_ms, 61000 - 3000);
    CHECK(same(snap(&key), k0) && same(snap(&project), p0));
    CHECK_EQ_INT(mg_quota_release(&r), MG_QUOTA_EINVAL); /* nothing to release */
    CHECK_EQ_INT(hit(lv, 2, 60999, 0), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 2, 61000, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 61001, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 61002, 0), MG_QUOTA_REFUSED); /* 2.5 s request still counts */
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 61002, 0, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.retry_after_ms, 62000 - 61002);
    free2(&key, &project);
}

static void test_rpm_each_level(void)
{
    rpm_at_level(0);
    rpm_at_level(1);
}

static void tpm_at_level(int at)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, 0, at == 0 ? 100 : 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, at == 1 ? 100 : 0, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    CHECK_EQ_INT(hit(lv, 2, 0, 60), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 10000, 30), MG_QUOTA_OK);
    snap_t k0 = snap(&key), p0 = snap(&project);
    mg_quota_res_t r;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 20000, 11, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, at);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_TPM);
    CHECK_EQ_INT(r.retry_after_ms, 60000 - 20000); /* the 60 of second 0 must go */
    CHECK(same(snap(&key), k0) && same(snap(&project), p0));
    CHECK_EQ_INT(hit(lv, 2, 20000, 10), MG_QUOTA_OK); /* exactly at the limit */
    CHECK_EQ_INT(hit(lv, 2, 20000, 1), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 2, 0, 0), MG_QUOTA_OK); /* zero tokens always fit */
    /* more than the limit can never fit: TOO_LARGE, nothing changes */
    k0 = snap(&key);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 500000, 101, &r), MG_QUOTA_TOO_LARGE);
    CHECK_EQ_INT(r.refused_level, at);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_TPM);
    CHECK_EQ_INT(r.retry_after_ms, 0);
    CHECK(same(snap(&key), k0));
    free2(&key, &project);
}

static void test_tpm_each_level(void)
{
    tpm_at_level(0);
    tpm_at_level(1);
}

static void concurrency_at_level(int at)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, 0, 0, at == 0 ? 2 : 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 0, at == 1 ? 2 : 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    mg_quota_res_t a, b, c;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 0, 5, &a), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 0, 5, &b), MG_QUOTA_OK);
    snap_t k0 = snap(&key), p0 = snap(&project);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 10, 5, &c), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(c.refused_level, at);
    CHECK_EQ_INT(c.refused_limit, MG_QUOTA_CONCURRENCY);
    CHECK_EQ_INT(c.retry_after_ms, 0); /* unknowable */
    CHECK(same(snap(&key), k0) && same(snap(&project), p0));
    CHECK_EQ_INT(mg_quota_release(&a), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 20, 5, &c), MG_QUOTA_OK);
    CHECK_EQ_INT(key.in_flight, 2);
    CHECK_EQ_INT(project.in_flight, 2);
    mg_quota_release(&b);
    mg_quota_release(&c);
    CHECK_EQ_INT(key.in_flight, 0);
    CHECK_EQ_INT(project.in_flight, 0);
    free2(&key, &project);
}

static void test_concurrency_each_level(void)
{
    concurrency_at_level(0);
    concurrency_at_level(1);
}

/* Three levels; the last refuses: the first two are given back exactly. */
static void test_rollback_partial(void)
{
    mg_quota_level_t key, project, provider;
    CHECK_EQ_INT(mg_quota_level_init(&key, 10, 1000, 5), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 10, 1000, 5), 0);
    CHECK_EQ_INT(mg_quota_level_init(&provider, 1, 0, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project, &provider};
    mg_quota_res_t held;
    CHECK_EQ_INT(mg_quota_reserve(lv, 3, 5000, 100, &held), MG_QUOTA_OK);
    snap_t s[3] = {snap(&key), snap(&project), snap(&provider)};
    mg_quota_res_t r;
    CHECK_EQ_INT(mg_quota_reserve(lv, 3, 5200, 100, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 2);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_RPM);
    CHECK(same(snap(&key), s[0]) && same(snap(&project), s[1]) && same(snap(&provider), s[2]));
    CHECK_EQ_INT(key.in_flight, 1);
    CHECK_EQ_INT(key.win->req[5], 1);
    CHECK_EQ_INT(key.win->tok[5], 100);
    /* the middle level refuses: the first is given back, the third never touched */
    project.max_concurrency = 1;
    provider.win->rpm_limit = 0;
    CHECK_EQ_INT(mg_quota_reserve(lv, 3, 5300, 100, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 1);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_CONCURRENCY);
    CHECK(same(snap(&key), s[0]) && same(snap(&project), s[1]) && same(snap(&provider), s[2]));
    CHECK_EQ_INT(mg_quota_settle(&r, 50), MG_QUOTA_EINVAL);
    mg_quota_release(&held);
    CHECK_EQ_INT(mg_quota_reserve(lv, 3, 5400, 100, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(key.win->requests, 2);
    CHECK_EQ_INT(provider.win->requests, 2);
    mg_quota_release(&r);
    free2(&key, &project);
    mg_quota_level_free(&provider);
}

/* When several limits refuse, retry_after waits for all of them; the first is named. */
static void test_retry_after_max(void)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, 1, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 100, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    CHECK_EQ_INT(hit(lv, 2, 0, 90), MG_QUOTA_OK); /* second 0: 1 req, 90 tokens */
    key.win->rpm_limit = 2;
    CHECK_EQ_INT(hit(lv, 2, 30000, 0), MG_QUOTA_OK); /* second 30: 1 req */
    key.win->rpm_limit = 1;
    mg_quota_res_t r;
    /* at 40 s: rpm needs both requests gone (second 30 → 90 s); tpm needs second 0 gone */
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 40000, 20, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 0);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_RPM);
    CHECK_EQ_INT(r.retry_after_ms, 90000 - 40000);
    CHECK_EQ_INT(hit(lv, 2, 89999, 20), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 2, 90000, 20), MG_QUOTA_OK);
    /* the first refusing level frees up sooner than a later one: the later one decides */
    free2(&key, &project);
    CHECK_EQ_INT(mg_quota_level_init(&key, 2, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 100, 0), 0);
    CHECK_EQ_INT(hit(lv, 2, 0, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 30000, 90), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 40000, 20, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 0);
    CHECK_EQ_INT(r.refused_limit, MG_QUOTA_RPM);
    CHECK_EQ_INT(r.retry_after_ms, 90000 - 40000); /* key alone: 60000 - 40000 */
    CHECK_EQ_INT(hit(lv, 2, 60000, 20), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 2, 90000, 20), MG_QUOTA_OK);
    /* now rpm is fine again later, only tpm: */
    free2(&key, &project);
    CHECK_EQ_INT(mg_quota_level_init(&key, 0, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 100, 0), 0);
    CHECK_EQ_INT(hit(lv, 2, 1000, 40), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 2, 2000, 40), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 2500, 70, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 1);
    CHECK_EQ_INT(r.retry_after_ms, 62000 - 2500); /* 80+70-100 = 50: both buckets */
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 2500, 30, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.retry_after_ms, 61000 - 2500); /* 10: the first bucket suffices */
    free2(&key, &project);
}

/* Window edges: a request at 10.9 s counts through 69.999 s, not at 70.0 s. */
static void test_window_edges(void)
{
    mg_quota_level_t a;
    CHECK_EQ_INT(mg_quota_level_init(&a, 1, 0, 0), 0);
    mg_quota_level_t *lv[] = {&a};
    CHECK_EQ_INT(hit(lv, 1, 10900, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 1, 69999, 0), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 1, 70000, 0), MG_QUOTA_OK);
    /* a long idle gap clears everything */
    uint32_t req;
    uint64_t tok;
    mg_quota_level_usage(&a, 70000, &req, &tok);
    CHECK_EQ_INT(req, 1);
    mg_quota_level_usage(&a, 10000000, &req, &tok);
    CHECK_EQ_INT(req, 0);
    /* time going backwards counts in the latest second seen */
    CHECK_EQ_INT(hit(lv, 1, 9000000, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(a.win->requests, 1);
    CHECK_EQ_INT(a.win->head_s, 10000);
    CHECK_EQ_INT(hit(lv, 1, 10059999, 0), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(hit(lv, 1, 10060000, 0), MG_QUOTA_OK);
    /* unlimited level: many requests */
    mg_quota_level_t u;
    CHECK_EQ_INT(mg_quota_level_init(&u, 0, 0, 0), 0);
    mg_quota_level_t *lu[] = {&u};
    int refused = 0;
    for (int i = 0; i < 10000; i++) refused += hit(lu, 1, (uint64_t)i * 7, 1000) != MG_QUOTA_OK;
    CHECK_EQ_INT(refused, 0);
    /* a sliding (not fixed) window: 60 per minute spread evenly never trips at 60 */
    mg_quota_level_t s;
    CHECK_EQ_INT(mg_quota_level_init(&s, 60, 0, 0), 0);
    mg_quota_level_t *ls[] = {&s};
    for (int i = 0; i < 600; i++) refused += hit(ls, 1, 100000 + (uint64_t)i * 1000, 0) != 0;
    CHECK_EQ_INT(refused, 0);
    CHECK_EQ_INT(hit(ls, 1, 100000 + 599 * 1000 + 1, 0), MG_QUOTA_REFUSED);
    free2(&a, &s);
    mg_quota_level_free(&u);
}

static void test_settle(void)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, 0, 1000, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 500, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    mg_quota_res_t r;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 3000, 400, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(project.win->tokens, 400);
    CHECK_EQ_INT(hit(lv, 2, 4000, 200), MG_QUOTA_REFUSED); /* 600 > 500 */
    /* overestimate: settle down frees room at once, at every level */
    CHECK_EQ_INT(mg_quota_settle(&r, 150), MG_QUOTA_OK);
    CHECK_EQ_INT(key.win->tokens, 150);
    CHECK_EQ_INT(project.win->tokens, 150);
    CHECK_EQ_INT(project.win->tok[3], 150);
    CHECK_EQ_INT(mg_quota_settle(&r, 10), MG_QUOTA_EINVAL); /* once */
    CHECK_EQ_INT(project.win->tokens, 150);
    CHECK_EQ_INT(hit(lv, 2, 4000, 200), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_release(&r), MG_QUOTA_OK);
    /* underestimate: settle up, in the reservation's own second */
    mg_quota_res_t u;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 5000, 10, &u), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_release(&u), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_settle(&u, 100), MG_QUOTA_OK); /* after release is fine */
    CHECK_EQ_INT(project.win->tok[5], 100);
    CHECK_EQ_INT(project.win->tokens, 150 + 200 + 100);
    /* the reservation's second has left the window: only the excess counts, now */
    mg_quota_res_t late;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 64000, 100, &late), MG_QUOTA_OK);
    uint32_t req;
    uint64_t tok;
    mg_quota_level_usage(&project, 130000, &req, &tok);
    CHECK_EQ_INT(tok, 0);
    CHECK_EQ_INT(mg_quota_settle(&late, 130), MG_QUOTA_OK);
    CHECK_EQ_INT(project.win->tok[130 % 60], 30);
    CHECK_EQ_INT(project.win->tokens, 30);
    CHECK_EQ_INT(key.win->tok[64 % 60], 130); /* key's window did not move: 100 -> 130 in place */
    mg_quota_release(&late);
    mg_quota_res_t low;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 140000, 100, &low), MG_QUOTA_OK);
    mg_quota_level_usage(&project, 200000, NULL, NULL);
    mg_quota_level_usage(&key, 200000, NULL, NULL);
    CHECK_EQ_INT(mg_quota_settle(&low, 40), MG_QUOTA_OK); /* below the estimate: nothing */
    CHECK_EQ_INT(project.win->tokens, 0);
    CHECK_EQ_INT(key.win->tokens, 0);
    mg_quota_release(&low);
    free2(&key, &project);
}

static void test_release_once(void)
{
    mg_quota_level_t key;
    CHECK_EQ_INT(mg_quota_level_init(&key, 0, 0, 2), 0);
    mg_quota_level_t *lv[] = {&key};
    mg_quota_res_t a, b;
    CHECK_EQ_INT(mg_quota_reserve(lv, 1, 0, 0, &a), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_reserve(lv, 1, 0, 0, &b), MG_QUOTA_OK);
    CHECK_EQ_INT(key.in_flight, 2);
    CHECK_EQ_INT(mg_quota_release(&a), MG_QUOTA_OK);
    CHECK_EQ_INT(key.in_flight, 1);
    /* a second release must not return b's lease */
    CHECK_EQ_INT(mg_quota_release(&a), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(key.in_flight, 1);
    CHECK_EQ_INT(mg_quota_release(&b), MG_QUOTA_OK);
    CHECK_EQ_INT(key.in_flight, 0);
    CHECK_EQ_INT(mg_quota_release(NULL), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(mg_quota_settle(NULL, 1), MG_QUOTA_EINVAL);
    mg_quota_level_free(&key);
}

static void test_bad_args(void)
{
    mg_quota_level_t a;
    CHECK_EQ_INT(mg_quota_level_init(&a, 1, 1, 1), 0);
    mg_quota_level_t *lv[MG_QUOTA_MAX_LEVELS + 1] = {&a, &a, &a, &a, &a, &a, &a};
    mg_quota_level_t *holes[] = {&a, NULL};
    mg_quota_res_t r;
    CHECK_EQ_INT(mg_quota_reserve(lv, 0, 0, 0, &r), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(mg_quota_reserve(lv, MG_QUOTA_MAX_LEVELS + 1, 0, 0, &r), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(mg_quota_reserve(NULL, 1, 0, 0, &r), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(mg_quota_reserve(holes, 2, 0, 0, &r), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(mg_quota_reserve(lv, 1, 0, 0, NULL), MG_QUOTA_EINVAL);
    CHECK_EQ_INT(a.in_flight, 0);
    CHECK_EQ_INT(a.win->requests, 0);
    /* the same level twice needs room for two */
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 0, 0, &r), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r.refused_level, 1);
    CHECK_EQ_INT(a.win->requests, 0);
    CHECK_STR(mg_quota_limit_name(MG_QUOTA_RPM), "rpm");
    CHECK_STR(mg_quota_limit_name(MG_QUOTA_TPM), "tpm");
    CHECK_STR(mg_quota_limit_name(MG_QUOTA_CONCURRENCY), "concurrency");
    CHECK_STR(mg_quota_limit_name(MG_QUOTA_NONE), "none");
    mg_quota_level_free(&a);
}

/* Requests a level counts now (0 without a window), without moving its window. */
static uint32_t counted(const mg_quota_level_t *lv)
{
    return lv->win ? lv->win->requests : 0;
}

/* Only rpm and tpm need a window; concurrency alone is a counter. */
static void test_window_only_for_rate_limits(void)
{
    mg_quota_level_t none, conc, rpm, tpm;
    CHECK_EQ_INT(mg_quota_level_init(&none, 0, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&conc, 0, 0, 1), 0);
    CHECK_EQ_INT(mg_quota_level_init(&rpm, 5, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&tpm, 0, 50, 0), 0);
    CHECK_EQ_INT(mg_quota_level_has_window(&none), 0);
    CHECK_EQ_INT(mg_quota_level_has_window(&conc), 0);
    CHECK_EQ_INT(mg_quota_level_heap_bytes(&conc), 0);
    CHECK_EQ_INT(mg_quota_level_has_window(&rpm), 1);
    CHECK_EQ_INT(mg_quota_level_has_window(&tpm), 1);
    CHECK_EQ_INT(mg_quota_level_heap_bytes(&rpm), sizeof(mg_quota_window_t));
    CHECK(sizeof(mg_quota_level_t) <= 16);
    /* all four levels in one reservation: leases everywhere, counts where there is a window */
    mg_quota_level_t *lv[] = {&none, &conc, &rpm, &tpm};
    mg_quota_res_t r, r2;
    CHECK_EQ_INT(mg_quota_reserve(lv, 4, 1000, 10, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(none.in_flight, 1);
    CHECK_EQ_INT(rpm.win->requests, 1);
    CHECK_EQ_INT(tpm.win->tokens, 10);
    CHECK_EQ_INT(mg_quota_reserve(lv, 4, 1000, 10, &r2), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(r2.refused_level, 1);
    CHECK_EQ_INT(r2.refused_limit, MG_QUOTA_CONCURRENCY);
    CHECK_EQ_INT(none.in_flight, 1); /* rolled back, window-less levels included */
    CHECK_EQ_INT(mg_quota_settle(&r, 20), MG_QUOTA_OK);
    CHECK_EQ_INT(tpm.win->tokens, 20);
    CHECK_EQ_INT(mg_quota_release(&r), MG_QUOTA_OK);
    CHECK_EQ_INT(none.in_flight + conc.in_flight, 0);
    uint32_t req = 9;
    uint64_t tok = 9;
    mg_quota_level_usage(&none, 2000, &req, &tok);
    CHECK_EQ_INT(req, 0);
    CHECK_EQ_INT(tok, 0);
    free2(&none, &conc);
    free2(&rpm, &tpm);
    CHECK_EQ_INT(mg_quota_level_has_window(&rpm), 0); /* freed: unlimited for rpm and tpm */
}

/* Setting the first rate limit starts counting; changing it keeps the counts; lifting it
 * frees the window; the leases stay throughout. */
static void test_set_limits(void)
{
    mg_quota_level_t a;
    CHECK_EQ_INT(mg_quota_level_init(&a, 0, 0, 3), 0);
    mg_quota_level_t *lv[] = {&a};
    mg_quota_res_t held;
    CHECK_EQ_INT(mg_quota_reserve(lv, 1, 1000, 0, &held), MG_QUOTA_OK); /* a lease, uncounted */
    CHECK_EQ_INT(hit(lv, 1, 1000, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_level_set_limits(&a, 2, 0, 3), 0);
    CHECK_EQ_INT(mg_quota_level_has_window(&a), 1);
    CHECK_EQ_INT(counted(&a), 0); /* earlier requests were not counted */
    CHECK_EQ_INT(a.in_flight, 1);
    CHECK_EQ_INT(hit(lv, 1, 2000, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 1, 2100, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 1, 2200, 0), MG_QUOTA_REFUSED);
    /* a limit change keeps the window and what it counts */
    const mg_quota_window_t *w = a.win;
    uint64_t serial = a.win->serial;
    CHECK_EQ_INT(mg_quota_level_set_limits(&a, 3, 1000, 3), 0);
    CHECK(a.win == w && a.win->serial == serial);
    CHECK_EQ_INT(a.win->rpm_limit, 3);
    CHECK_EQ_INT(a.win->tpm_limit, 1000);
    CHECK_EQ_INT(counted(&a), 2);
    CHECK_EQ_INT(hit(lv, 1, 2300, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(hit(lv, 1, 2400, 0), MG_QUOTA_REFUSED);
    CHECK_EQ_INT(mg_quota_level_set_limits(&a, 0, 1000, 3), 0); /* tpm alone still needs it */
    CHECK(a.win == w);
    CHECK_EQ_INT(counted(&a), 3);
    /* lifting both frees it; the lease of the held reservation stays and goes back once */
    CHECK_EQ_INT(mg_quota_level_set_limits(&a, 0, 0, 3), 0);
    CHECK_EQ_INT(mg_quota_level_has_window(&a), 0);
    CHECK_EQ_INT(hit(lv, 1, 2500, 0), MG_QUOTA_OK);
    CHECK_EQ_INT(a.in_flight, 1);
    CHECK_EQ_INT(mg_quota_release(&held), MG_QUOTA_OK);
    CHECK_EQ_INT(a.in_flight, 0);
    mg_quota_level_free(&a);
}

/* A reservation outlives its window: settling after the window was freed, or replaced by a
 * new one, touches neither (ASan: no use after free) and the new window's counts stay. */
static void test_settle_after_window_change(void)
{
    mg_quota_level_t key, project;
    CHECK_EQ_INT(mg_quota_level_init(&key, 5, 1000, 0), 0);
    CHECK_EQ_INT(mg_quota_level_init(&project, 0, 1000, 0), 0);
    mg_quota_level_t *lv[] = {&key, &project};
    mg_quota_res_t r, fresh;
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 10000, 100, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 0, 0, 0), 0); /* key's window freed */
    CHECK_EQ_INT(mg_quota_settle(&r, 300), MG_QUOTA_OK);
    CHECK_EQ_INT(project.win->tokens, 300); /* the level that kept its window is settled */
    CHECK_EQ_INT(mg_quota_release(&r), MG_QUOTA_OK);
    CHECK_EQ_INT(key.in_flight, 0);
    /* freed and given again within the reservation's second: a new serial */
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 5, 1000, 0), 0);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 20000, 100, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 0, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 5, 1000, 0), 0);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 20000, 50, &fresh), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_settle(&r, 0), MG_QUOTA_OK); /* would take 100 off the new window */
    CHECK_EQ_INT(key.win->tokens, 50);
    CHECK_EQ_INT(key.win->requests, 1);
    CHECK_EQ_INT(mg_quota_settle(&fresh, 70), MG_QUOTA_OK); /* its own window: settled */
    CHECK_EQ_INT(key.win->tokens, 70);
    mg_quota_release(&r);
    mg_quota_release(&fresh);
    /* reserved without a window, settled after one was given: nothing to correct */
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 0, 0, 0), 0);
    CHECK_EQ_INT(mg_quota_reserve(lv, 2, 30000, 10, &r), MG_QUOTA_OK);
    CHECK_EQ_INT(mg_quota_level_set_limits(&key, 0, 1000, 0), 0);
    CHECK_EQ_INT(mg_quota_settle(&r, 500), MG_QUOTA_OK);
    CHECK_EQ_INT(key.win->tokens, 0);
    mg_quota_release(&r);
    free2(&key, &project);
}

int main(void)
{
    MG_RUN(test_rpm_each_level);
    MG_RUN(test_tpm_each_level);
    MG_RUN(test_concurrency_each_level);
    MG_RUN(test_rollback_partial);
    MG_RUN(test_retry_after_max);
    MG_RUN(test_window_edges);
    MG_RUN(test_settle);
    MG_RUN(test_release_once);
    MG_RUN(test_bad_args);
    MG_RUN(test_window_only_for_rate_limits);
    MG_RUN(test_set_limits);
    MG_RUN(test_settle_after_window_change);
    return mg_test_summary();
}
