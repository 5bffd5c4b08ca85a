/* Unit tests for core/token/calib.c: the per-route bytes-per-token learner. An unknown route
 * reads the default (bytes / 4); the first answer sets the value, later ones move it by an
 * EWMA that converges on the route's true ratio; the error reported is the estimate's before
 * learning from the sample; samples are clamped, unusable ones ignored; routes are apart and
 * the table is bounded; a value set from the store is clamped and read back. */
#include "mgtest.h"
#include "token/calib.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int near(double a, double b, double eps)
{
    return fabs(a - b) <= eps;
}

static void test_default_and_first_sample(void)
{
    mg_calib_t c;
    mg_calib_init(&c);
    CHECK(near(mg_calib_bpt(&c, "p", "m"), MG_CALIB_DEFAULT_BPT, 1e-9));
    CHECK_EQ_INT(mg_calib_tokens(MG_CALIB_DEFAULT_BPT, 400), 100);
    CHECK_EQ_INT(mg_calib_tokens(3.0, 10), 4); /* rounded up */
    CHECK_EQ_INT(mg_calib_tokens(3.0, 0), 0);
    double err = 99;
    /* 600 bytes, 100 tokens: 6 bytes a token; the default guessed 150 (+50 %) */
    mg_calib_route_t *r = mg_calib_observe(&c, "p", "m", 600, 100, &err);
    CHECK(r != NULL);
    CHECK(near(err, 0.5, 1e-9));
    CHECK(near(mg_calib_bpt(&c, "p", "m"), 6.0, 1e-9)); /* the first sample sets it */
    CHECK_EQ_INT(r ? (int)r->samples : -1, 1);
    /* the same again: no error left */
    mg_calib_observe(&c, "p", "m", 600, 100, &err);
    CHECK(near(err, 0, 1e-9));
    mg_calib_free(&c);
}

static void test_converges(void)
{
    mg_calib_t c;
    mg_calib_init(&c);
    double err = 0, first = 0;
    /* a route whose prompts take 2.5 bytes a token, with +-20 % noise around it */
    for (int i = 0; i < 200; i++) {
        int64_t tokens = 1000;
        size_t bytes = (size_t)(2500 * (1.0 + 0.2 * ((i % 5) - 2) / 2.0));
        mg_calib_observe(&c, "q", "m", bytes, tokens, &err);
        if (i == 0) first = err;
    }
    CHECK(first < -0.3); /* the default (4) guessed far too few tokens */
    CHECK(near(mg_calib_bpt(&c, "q", "m"), 2.5, 0.15));
    CHECK(fabs(err) < 0.25); /* the last estimate is within the noise */
    /* a step change: the route's ratio moves to 5; the EWMA follows within ~50 answers */
    for (int i = 0; i < 60; i++) mg_calib_observe(&c, "q", "m", 5000, 1000, &err);
    CHECK(near(mg_calib_bpt(&c, "q", "m"), 5.0, 0.05));
    CHECK(fabs(err) < 0.02);
    mg_calib_free(&c);
}

static void test_clamped_and_ignored(void)
{
    mg_calib_t c;
    mg_calib_init(&c);
    double err = 7;
    CHECK(mg_calib_observe(&c, "p", "m", 0, 10, &err) == NULL); /* no bytes */
    CHECK(mg_calib_observe(&c, "p", "m", 10, 0, &err) == NULL); /* no tokens */
    CHECK(mg_calib_observe(&c, NULL, "m", 10, 1, &err) == NULL);
    CHECK(near(err, 7, 0)); /* untouched */
    CHECK_EQ_INT(c.n, 0);
    /* one token for 10,000 bytes (an image part, say): at most MAX_BPT */
    mg_calib_observe(&c, "p", "m", 10000, 1, NULL);
    CHECK(near(mg_calib_bpt(&c, "p", "m"), MG_CALIB_MAX_BPT, 1e-9));
    /* more tokens than bytes: at least MIN_BPT */
    mg_calib_observe(&c, "p2", "m", 10, 1000, NULL);
    CHECK(near(mg_calib_bpt(&c, "p2", "m"), MG_CALIB_MIN_BPT, 1e-9));
    /* from the store: clamped too */
    mg_calib_route_t *r = mg_calib_set(&c, "s", "m", 100.0, 42);
    CHECK(r != NULL);
    CHECK(near(mg_calib_bpt(&c, "s", "m"), MG_CALIB_MAX_BPT, 1e-9));
    CHECK_EQ_INT(r ? (int)r->samples : -1, 42);
    mg_calib_set(&c, "s", "m", 3.25, 43);
    CHECK(near(mg_calib_bpt(&c, "s", "m"), 3.25, 1e-9));
    CHECK_EQ_INT(c.n, 3); /* set again: the same entry */
    mg_calib_free(&c);
}

static void test_routes_apart_and_bounded(void)
{
    mg_calib_t c;
    mg_calib_init(&c);
    mg_calib_observe(&c, "a", "m1", 300, 100, NULL);
    mg_calib_observe(&c, "a", "m2", 500, 100, NULL);
    mg_calib_observe(&c, "b", "m1", 700, 100, NULL);
    CHECK(near(mg_calib_bpt(&c, "a", "m1"), 3, 1e-9));
    CHECK(near(mg_calib_bpt(&c, "a", "m2"), 5, 1e-9));
    CHECK(near(mg_calib_bpt(&c, "b", "m1"), 7, 1e-9));
    CHECK(near(mg_calib_bpt(&c, "b", "m2"), MG_CALIB_DEFAULT_BPT, 1e-9));
    char name[32];
    for (int i = 0; i < MG_CALIB_ROUTES + 10; i++) {
        snprintf(name, sizeof(name), "r%d", i);
        mg_calib_observe(&c, name, "m", 200, 100, NULL);
    }
    CHECK_EQ_INT(c.n, MG_CALIB_ROUTES);
    /* past the bound: not learned, reads the default */
    snprintf(name, sizeof(name), "r%d", MG_CALIB_ROUTES + 5);
    CHECK(mg_calib_find(&c, name, "m") == NULL);
    CHECK(near(mg_calib_bpt(&c, name, "m"), MG_CALIB_DEFAULT_BPT, 1e-9));
    char longname[MG_CALIB_NAME_MAX + 8];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    mg_calib_free(&c);
    mg_calib_init(&c);
    CHECK(mg_calib_observe(&c, longname, "m", 200, 100, NULL) == NULL); /* never cut to match */
    mg_calib_free(&c);
}

int main(void)
{
    MG_RUN(test_default_and_first_sample);
    MG_RUN(test_converges);
    MG_RUN(test_clamped_and_ignored);
    MG_RUN(test_routes_apart_and_bounded);
    return mg_test_summary();
}
