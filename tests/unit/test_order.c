/* Unit tests for core/luavm/order.c: the sort behind moongate.sort_by and the weighted random
 * order behind moongate.weighted_order (policies/routing.lua carries a Lua twin of both;
 * test_luavm checks that the two agree). */
#include "luavm/order.h"
#include "mgtest.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define N_MAX 300

static mg_order_item_t items[N_MAX], tmp[N_MAX], ref[N_MAX];

/* The reference order: qsort with the documented comparison. */
static int ref_cmp(const void *pa, const void *pb)
{
    const mg_order_item_t *a = pa, *b = pb;
    int na = isnan(a->key), nb = isnan(b->key);
    if (na != nb) return na - nb;
    if (!na && a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

static void test_splitmix_vector(void)
{
    /* the reference splitmix64 stream from seed 0 */
    uint64_t s = 0;
    CHECK(mg_splitmix64(&s) == 0xE220A8397B1DCDAFu);
    CHECK(mg_splitmix64(&s) == 0x6E789E6AA1B965F4u);
    double u = mg_unit_double(UINT64_MAX);
    CHECK(u < 1 && u > 0.999999);
    CHECK(mg_unit_double(0) == 0);
}

static void test_sort_matches_reference(void)
{
    uint64_t seed = 42;
    const double few[] = {0, 1, -1, 2.5, NAN, INFINITY, -INFINITY};
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(mg_splitmix64(&seed) % N_MAX);
        for (size_t i = 0; i < n; i++) {
            uint64_t z = mg_splitmix64(&seed);
            /* half the rounds draw from a few values: many ties, NaN, infinities */
            items[i].key = round % 2 ? few[z % 7] : mg_unit_double(z) * 100 - 50;
            items[i].pos = (int)i + 1;
            ref[i] = items[i];
        }
        mg_order_sort(items, n, tmp);
        qsort(ref, n, sizeof(*ref), ref_cmp);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= items[i].pos == ref[i].pos;
        CHECK(same);
    }
}

/* Weighted order over n items with these weights; returns the positions drawn. */
static void weighted(const double *w, size_t n, double u, uint64_t seed, int *out)
{
    for (size_t i = 0; i < n; i++) items[i] = (mg_order_item_t){w[i], (int)i + 1};
    mg_order_weighted(items, n, u, seed, tmp);
    for (size_t i = 0; i < n; i++) out[i] = items[i].pos;
}

static int is_permutation(const int *p, size_t n)
{
    int seen[N_MAX + 1] = {0};
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 1 || p[i] > (int)n || seen[p[i]]) return 0;
        seen[p[i]] = 1;
    }
    return 1;
}

static void test_weighted_first_pick_follows_weights(void)
{
    const double w[] = {1, 0, 3, 0, 4}; /* shares 1/8, 0, 3/8, 0, 4/8 */
    int firsts[6] = {0}, out[5];
    for (int k = 0; k < 800; k++) {
        weighted(w, 5, (k + 0.5) / 800, (uint64_t)k, out);
        CHECK(is_permutation(out, 5));
        firsts[out[0]]++;
        /* the routes without a weight come last, in position order */
        CHECK(out[3] == 2 && out[4] == 4);
    }
    CHECK_EQ_INT(firsts[1], 100);
    CHECK_EQ_INT(firsts[3], 300);
    CHECK_EQ_INT(firsts[5], 400);
}

static void test_weighted_second_place(void)
{
    /* after a first pick of position 1, position 2 (weight 3) comes second 3 times in 4 */
    const double w[] = {1, 3, 1};
    int second2 = 0, out[3];
    uint64_t seed = 7;
    for (int k = 0; k < 4000; k++) {
        weighted(w, 3, 0.01, mg_splitmix64(&seed), out);
        CHECK_EQ_INT(out[0], 1);
        second2 += out[1] == 2;
    }
    CHECK(second2 > 2800 && second2 < 3200);
}

static void test_weighted_equal_weights_shuffle(void)
{
    /* equal weights: a uniform order; each position lands in each place about as often */
    enum { n = 6, rounds = 6000 };
    const double w[n] = {2, 2, 2, 2, 2, 2};
    int place[n + 1][n] = {{0}}, out[n];
    uint64_t seed = 99;
    for (int k = 0; k < rounds; k++) {
        weighted(w, n, (k + 0.5) / rounds, mg_splitmix64(&seed), out);
        CHECK(is_permutation(out, n));
        for (int i = 0; i < n; i++) place[out[i]][i]++;
    }
    for (int p = 1; p <= n; p++)
        for (int i = 0; i < n; i++) CHECK(place[p][i] > 850 && place[p][i] < 1150);
}

static void test_weighted_edges(void)
{
    int out[3], out4[4];
    const double none[] = {0, -1, NAN};
    weighted(none, 3, 0.7, 1, out); /* no weight at all: position order */
    CHECK(out[0] == 1 && out[1] == 2 && out[2] == 3);
    const double one[] = {5};
    weighted(one, 1, 0.3, 1, out);
    CHECK_EQ_INT(out[0], 1);
    weighted(one, 0, 0.3, 1, out); /* nothing to order */
    /* an item without a weight comes after every weighted one, whatever the draws */
    const double mixed[] = {0, 1, 2, -3};
    for (uint64_t seed = 1; seed <= 200; seed++) {
        weighted(mixed, 4, (double)(seed % 10) / 10, seed, out4);
        CHECK(out4[2] == 1 && out4[3] == 4);
    }
    /* the same arguments give the same order */
    const double w[] = {1, 2, 3};
    int again[3];
    weighted(w, 3, 0.4, 1234, out);
    weighted(w, 3, 0.4, 1234, again);
    CHECK(out[0] == again[0] && out[1] == again[1] && out[2] == again[2]);
}

/* mg_order_then_by against the reference: the sequence (a shuffled permutation of the
 * positions) stable-sorted by its items' keys, by qsort on (key, place in the sequence). */
static void test_then_by_matches_reference(void)
{
    static mg_order_item_t keys[N_MAX], seq[N_MAX];
    uint64_t seed = 4242;
    const double few[] = {0, 1, -1, 2.5, NAN, INFINITY, -INFINITY};
    for (int round = 0; round < 300; round++) {
        size_t n = (size_t)(mg_splitmix64(&seed) % N_MAX);
        for (size_t i = 0; i < n; i++) {
            uint64_t z = mg_splitmix64(&seed);
            /* a third of the rounds all one key, a third a few keys, a third spread out */
            keys[i].key = round % 3 == 0   ? 7
                          : round % 3 == 1 ? few[z % 7]
                                           : (double)(z % 1000) - 500;
            items[i] = (mg_order_item_t){0, (int)i + 1};
        }
        for (size_t i = n; i > 1; i--) { /* a sequence in some random order */
            size_t j = (size_t)(mg_splitmix64(&seed) % i);
            mg_order_item_t t = items[i - 1];
            items[i - 1] = items[j];
            items[j] = t;
        }
        for (size_t i = 0; i < n; i++) {
            seq[i] = items[i];
            ref[i] = (mg_order_item_t){keys[items[i].pos - 1].key, (int)i + 1};
        }
        qsort(ref, n, sizeof(*ref), ref_cmp); /* NaN keys alike: sequence order */
        mg_order_then_by(items, n, keys, tmp);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= items[i].pos == seq[ref[i].pos - 1].pos;
        CHECK(same);
    }
}

/* A key order with NaN last: -1, 0 or 1. */
static int key_cmp(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

/* mg_order_weighted_first's draws, checked for what they must be on random inputs (weights
 * with ties, zeros, NaN and infinities, keys with ties and NaN, k from 0 to past n): k
 * distinct items; each the group of the smallest key left; in a group the ones with a
 * weight before the ones without, and those by position. */
static void test_weighted_first_properties(void)
{
    static mg_order_item_t keys[N_MAX], in[N_MAX];
    uint64_t seed = 777;
    const double weights[] = {1, 2, 0.5, 0, NAN, INFINITY, 1e-300, 3};
    const double few[] = {0, 1, -1, 2.5, NAN};
    int good = 0;
    for (int round = 0; round < 400; round++) {
        size_t n = (size_t)(mg_splitmix64(&seed) % 40);
        int keyed = round % 3 != 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t z = mg_splitmix64(&seed);
            in[i] = items[i] = (mg_order_item_t){round % 4 == 0 ? 2 : weights[z % 8], (int)i + 1};
            keys[i].key = few[(z >> 8) % 5];
        }
        size_t k = (size_t)(mg_splitmix64(&seed) % (n + 3));
        double u = mg_unit_double(mg_splitmix64(&seed));
        size_t got =
            mg_order_weighted_first(items, n, k, u, mg_splitmix64(&seed), keyed ? keys : NULL, tmp);
        int ok = got == (k < n ? k : n);
        unsigned char taken[N_MAX] = {0};
        for (size_t m = 0; ok && m < got; m++) {
            int pos = items[m].pos;
            ok = pos >= 1 && pos <= (int)n && !taken[pos - 1];
            if (!ok) break;
            double key = keyed ? keys[pos - 1].key : 0;
            int weighted = in[pos - 1].key > 0;
            for (size_t j = 0; ok && j < n; j++) {
                if (taken[j] || j == (size_t)pos - 1) continue;
                int c = key_cmp(keyed ? keys[j].key : 0, key);
                if (c < 0) ok = 0; /* a smaller key was left */
                else if (c == 0 && !weighted && (in[j].key > 0 || (int)j + 1 < pos))
                    ok = 0; /* a weighted one, or an earlier one, was left */
            }
            taken[pos - 1] = 1;
        }
        good += ok;
    }
    CHECK_EQ_INT(good, 400);
}

/* The first draw follows the weights exactly over u (in the best group only), the later
 * ones the weights of what is left. */
static void test_weighted_first_draws_follow_weights(void)
{
    const double w[] = {1, 3, 0, 4};
    int first[4] = {0}, second_of_2[4] = {0};
    uint64_t seed = 99;
    const int N = 4000;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 4; j++) items[j] = (mg_order_item_t){w[j], j + 1};
        size_t got =
            mg_order_weighted_first(items, 4, 2, (i + 0.5) / N, mg_splitmix64(&seed), NULL, tmp);
        CHECK(got == 2);
        first[items[0].pos - 1]++;
        if (items[0].pos == 2) second_of_2[items[1].pos - 1]++;
    }
    /* u spread evenly: shares 1/8, 3/8, 0, 4/8 exactly */
    CHECK_EQ_INT(first[0], N / 8);
    CHECK_EQ_INT(first[1], 3 * N / 8);
    CHECK_EQ_INT(first[2], 0);
    CHECK_EQ_INT(first[3], N / 2);
    /* after item 2: items 1 and 4 by 1:4 (about 20% / 80% of 1,500), never the weightless */
    CHECK(second_of_2[0] > 200 && second_of_2[0] < 400);
    CHECK_EQ_INT(second_of_2[2], 0);
    /* keys: only the best group (key 1: items 1 and 3) comes first, whatever the weights */
    mg_order_item_t keys[4] = {{2, 0}, {2, 0}, {1, 0}, {1, 0}};
    int best[4] = {0}, group_next = 0;
    for (int i = 0; i < 400; i++) {
        for (int j = 0; j < 4; j++) items[j] = (mg_order_item_t){w[j], j + 1};
        mg_order_weighted_first(items, 4, 3, (i + 0.5) / 400, mg_splitmix64(&seed), keys, tmp);
        best[items[0].pos - 1]++;
        group_next += items[1].pos == 3 || items[1].pos == 4; /* the rest of the group next */
    }
    CHECK_EQ_INT(best[3], 400); /* item 3 has no weight: item 4 is drawn first */
    CHECK_EQ_INT(group_next, 400);
}

static void test_then_by_small(void)
{
    /* drawn order 3 1 4 2; keys by position: 1 -> 5, 2 -> 1, 3 -> 5, 4 -> 1 */
    mg_order_item_t seq[4] = {{0, 3}, {0, 1}, {0, 4}, {0, 2}};
    mg_order_item_t keys[4] = {{5, 0}, {1, 0}, {5, 0}, {1, 0}};
    mg_order_then_by(seq, 4, keys, tmp);
    CHECK(seq[0].pos == 4 && seq[1].pos == 2 && seq[2].pos == 3 && seq[3].pos == 1);
    mg_order_then_by(seq, 0, keys, tmp); /* nothing to order */
}

int main(void)
{
    MG_RUN(test_splitmix_vector);
    MG_RUN(test_sort_matches_reference);
    MG_RUN(test_weighted_first_pick_follows_weights);
    MG_RUN(test_weighted_second_place);
    MG_RUN(test_weighted_equal_weights_shuffle);
    MG_RUN(test_weighted_edges);
    MG_RUN(test_then_by_matches_reference);
    MG_RUN(test_then_by_small);
    MG_RUN(test_weighted_first_properties);
    MG_RUN(test_weighted_first_draws_follow_weights);
    return mg_test_summary();
}
