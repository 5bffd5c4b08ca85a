/* Unit tests for the health samples' stream entries (core/cluster/samples.c): a batch gathered
 * and encoded decodes to the same samples in the same order (routes shared by index, times
 * after the first), its bounds (samples, routes, names that cannot be shared), and bodies that
 * are not entries refused whole (nothing fed from a bad one); and the time a sample heard from
 * another instance is recorded at (core/route/health.c: never before the latest). */
#include "mgtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "cluster/samples.h"
#include "route/health.h"

typedef struct seen_s {
    mg_csample_t s[2048];
    char names[2048][2][64];
    int n;
} seen_t;

static void collect(void *ud, const mg_csample_t *s)
{
    seen_t *v = ud;
    if (v->n >= 2048) return;
    v->s[v->n] = *s;
    snprintf(v->names[v->n][0], 64, "%s", s->provider);
    snprintf(v->names[v->n][1], 64, "%s", s->model);
    v->n++;
}

static mg_csample_t sample(const char *p, const char *m, int ok, int ttft, int lat, uint64_t at)
{
    return (mg_csample_t){
        .provider = p, .model = m, .ok = ok, .ttft_ms = ttft, .latency_ms = lat, .at_ms = at};
}

static void test_round_trip(void)
{
    static mg_csamples_batch_t b; /* large: not on the stack */
    mg_csample_t in[] = {
        sample("prov-a", "up-1", 1, 120, 300, 1764700000000ull),
        sample("prov-b", "", 0, -1, 5000, 1764700000005ull),
        sample("prov-a", "up-1", 0, -1, -1, 1764700000010ull),
        sample("prov-a", "up-2", 1, 0, 7, 1764700000010ull),
    };
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(mg_csamples_batch_add(&b, &in[i]), 0);
    CHECK_EQ_INT(b.n_routes, 3);
    mg_buf_t out = {0};
    CHECK_EQ_INT(mg_csamples_encode(&b, &out), 0);
    CHECK_STR(out.data, "h1 1764700000000 3 4\n"
                        "prov-a\tup-1\nprov-b\t\nprov-a\tup-2\n"
                        "0 1 120 300 0\n1 0 -1 5000 5\n0 0 -1 -1 10\n2 1 0 7 10\n");
    static seen_t v;
    v.n = 0;
    CHECK_EQ_INT(mg_csamples_decode(out.data, out.len, collect, &v), 4);
    CHECK_EQ_INT(v.n, 4);
    for (int i = 0; i < 4 && i < v.n; i++) {
        CHECK_STR(v.names[i][0], in[i].provider);
        CHECK_STR(v.names[i][1], in[i].model);
        CHECK_EQ_INT(v.s[i].ok, in[i].ok);
        CHECK_EQ_INT(v.s[i].ttft_ms, in[i].ttft_ms);
        CHECK_EQ_INT(v.s[i].latency_ms, in[i].latency_ms);
        CHECK_EQ_INT(v.s[i].at_ms, in[i].at_ms);
    }
    CHECK_EQ_INT(mg_csamples_decode(out.data, out.len, NULL, NULL), 4); /* check only */
    mg_buf_free(&out);
    mg_csamples_batch_clear(&b);
    CHECK_EQ_INT(b.n, 0);
    CHECK_EQ_INT(b.n_routes, 0);
}

static void test_bounds(void)
{
    static mg_csamples_batch_t b;
    /* a time that goes back is stored as the one before (the body counts from the first) */
    mg_csample_t s = sample("p", "m", 1, -1, 3, 5000);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), 0);
    s.at_ms = 4000;
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), 0);
    CHECK_EQ_INT(b.s[1].at_ms, 5000);
    /* names holding a tab or a newline, or no provider: not shared */
    mg_csample_t bad = sample("p\tq", "m", 1, -1, -1, 5000);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &bad), -1);
    bad = sample("p", "m\nx", 1, -1, -1, 5000);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &bad), -1);
    bad = sample("", "m", 1, -1, -1, 5000);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &bad), -1);
    CHECK_EQ_INT(b.n, 2);
    mg_csamples_batch_clear(&b);
    /* at most MG_CSAMPLES_MAX_ROUTES routes ... */
    char name[32];
    for (int i = 0; i < MG_CSAMPLES_MAX_ROUTES; i++) {
        snprintf(name, sizeof(name), "p%d", i);
        s = sample(name, "m", 1, -1, -1, 5000);
        CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), 0);
    }
    s = sample("one-more", "m", 1, -1, -1, 5000);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), -1);
    s = sample("p3", "m", 0, -1, -1, 5000); /* a route it has: still fits */
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), 0);
    /* ... and MG_CSAMPLES_MAX_BATCH samples */
    while (b.n < MG_CSAMPLES_MAX_BATCH) CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), 0);
    CHECK_EQ_INT(mg_csamples_batch_add(&b, &s), -1);
    mg_buf_t out = {0};
    CHECK_EQ_INT(mg_csamples_encode(&b, &out), 0);
    static seen_t v;
    v.n = 0;
    CHECK_EQ_INT(mg_csamples_decode(out.data, out.len, collect, &v), MG_CSAMPLES_MAX_BATCH);
    CHECK_STR(v.names[MG_CSAMPLES_MAX_ROUTES - 1][0], "p63");
    CHECK_STR(v.names[MG_CSAMPLES_MAX_BATCH - 1][0], "p3");
    mg_buf_free(&out);
    mg_csamples_batch_clear(&b);
}

static void test_bad_bodies(void)
{
    static const char *const bad[] = {
        "",
        "h2 1 1 1\np\tm\n0 1 -1 -1 0\n",      /* another version */
        "h1 1 1 2\np\tm\n0 1 -1 -1 0\n",      /* a sample short */
        "h1 1 1 1\np\tm\n0 1 -1 -1 0\nextra", /* something after */
        "h1 1 1 1\np\tm\n1 1 -1 -1 0\n",      /* a route it has not */
        "h1 1 1 1\np\tm\n0 2 -1 -1 0\n",      /* ok neither 0 nor 1 */
        "h1 1 1 1\np\tm\n0 1 -2 -1 0\n",      /* ttft below -1 */
        "h1 1 1 1\np\tm\n0 1 -1 -1 -5\n",     /* time before the base */
        "h1 1 1 1\npm\n0 1 -1 -1 0\n",        /* route without its tab */
        "h1 1 1 1\n\tm\n0 1 -1 -1 0\n",       /* no provider */
        "h1 1 65 0\n",                        /* too many routes */
        "h1 1 1 1\np\tm\n0 1 -1 -1 0",        /* no last newline */
        "h1 1 1 1\np\tm\n0  1 -1 -1 0\n",     /* two spaces */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        static seen_t v;
        v.n = 0;
        int rc = mg_csamples_decode(bad[i], strlen(bad[i]), collect, &v);
        if (rc != -1) fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK_EQ_INT(rc, -1);
        CHECK_EQ_INT(v.n, 0); /* nothing fed from a bad body, not even its first samples */
    }
    /* a NUL inside is not an entry either */
    static seen_t v;
    CHECK_EQ_INT(mg_csamples_decode("h1 1 1 1\np\0m\n0 1 -1 -1 0\n", 24, collect, &v), -1);
    /* an empty batch is a valid entry with no samples */
    CHECK_EQ_INT(mg_csamples_decode("h1 0 0 0\n", 9, collect, &v), 0);
}

static void test_sample_at(void)
{
    mg_health_t h;
    mg_health_init(&h, NULL);
    uint64_t now = 1000000;
    CHECK_EQ_INT(mg_health_sample_at(&h, now, 250), now - 250); /* nothing yet: its own time */
    CHECK_EQ_INT(mg_health_sample_at(&h, now, 2 * now), 0);     /* before the clock's start */
    mg_health_record(&h, now - 100, 1, 10, -1);
    CHECK_EQ_INT(h.last_at_ms, now - 100);
    CHECK_EQ_INT(mg_health_sample_at(&h, now, 250), now - 100); /* never before the latest */
    CHECK_EQ_INT(mg_health_sample_at(&h, now, 50), now - 50);
    mg_health_probe_result(&h, now, 1);
    CHECK_EQ_INT(mg_health_sample_at(&h, now, 0), now);
    /* a replayed sample 4 minutes old leaves the 5-minute window a minute later */
    mg_health_init(&h, NULL);
    mg_health_record(&h, mg_health_sample_at(&h, now, 240000), 0, 10, -1);
    mg_health_snapshot_t s;
    mg_health_snapshot(&h, now, &s);
    CHECK_EQ_INT(s.window_samples, 1);
    mg_health_snapshot(&h, now + 70000, &s);
    CHECK_EQ_INT(s.window_samples, 0);
}

int main(void)
{
    MG_RUN(test_round_trip);
    MG_RUN(test_bounds);
    MG_RUN(test_bad_bodies);
    MG_RUN(test_sample_at);
    return mg_test_summary();
}
