/* order: sorting mechanics for the routing policy; see order.h. */
#include "luavm/order.h"

#include <math.h>
#include <string.h>

/* Ascending key, then ascending pos: a strict total order for keys that are numbers
 * (positions are distinct). */
static inline int before(const mg_order_item_t *a, const mg_order_item_t *b)
{
    return a->key < b->key || (a->key == b->key && a->pos < b->pos);
}

static void insertion_sort(mg_order_item_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        mg_order_item_t x = a[i];
        size_t j = i;
        for (; j > 0 && before(&x, &a[j - 1]); j--) a[j] = a[j - 1];
        a[j] = x;
    }
}

/* A merge sort with the comparison inlined: qsort's call per comparison cost more than
 * everything else the routing decision does in C. */
static void sort_numbers(mg_order_item_t *items, size_t n, mg_order_item_t *tmp)
{
    if (n <= 16) {
        insertion_sort(items, n);
        return;
    }
    size_t h = n / 2;
    sort_numbers(items, h, tmp);
    sort_numbers(items + h, n - h, tmp);
    if (before(&items[h - 1], &items[h])) return; /* the halves are in order already */
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = before(&items[j], &items[i]) ? items[j++] : items[i++];
    while (i < h) tmp[k++] = items[i++];
    memcpy(items, tmp, k * sizeof(*items)); /* the rest of the second half is in place */
}

/* Move the NaN keys after the numbers, both keeping their order; returns the numbers. */
static size_t nans_last(mg_order_item_t *items, size_t n, mg_order_item_t *tmp)
{
    size_t m = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(items[i].key)) tmp[k++] = items[i];
        else items[m++] = items[i];
    }
    memcpy(items + m, tmp, k * sizeof(*items));
    return m;
}

void mg_order_sort(mg_order_item_t *items, size_t n, mg_order_item_t *tmp)
{
    sort_numbers(items, nans_last(items, n, tmp), tmp);
}

uint64_t mg_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

double mg_unit_double(uint64_t z)
{
    return (double)(z >> 11) * 0x1p-53;
}

void mg_draw_init(mg_draw_t *d, double random)
{
    if (!(random >= 0 && random < 1)) random = 0;
    *d = (mg_draw_t){.first = random, .used = 0, .state = (uint64_t)(random * 0x1p53)};
}

int mg_draw_chance(mg_draw_t *d, double p)
{
    if (d->used) return mg_unit_double(mg_splitmix64(&d->state)) < p;
    double u = d->first;
    int result = u < p;
    if (p > 0 && p < 1) d->first = result ? u / p : (u - p) / (1 - p);
    return result;
}

void mg_draw_for_order(mg_draw_t *d, double *u, uint64_t *seed)
{
    *u = d->used ? mg_unit_double(mg_splitmix64(&d->state)) : d->first;
    d->used = 1;
    *seed = mg_splitmix64(&d->state);
}

/* The first pick: where u falls when each weighted item covers a stretch of [0, total)
 * proportional to its weight. The last weighted item should rounding leave x >= 0. */
static size_t draw_first(const mg_order_item_t *items, size_t n, double total, double u)
{
    if (total <= 0) return 0;
    double x = u * total;
    size_t pick = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].key <= 0) continue;
        pick = i;
        x -= items[i].key;
        if (x < 0) break;
    }
    return pick;
}

/* The Efraimidis-Spirakis key of an item of weight w, as its logarithm: -log(r)/w, smaller
 * first, orders as r^(1/w) larger first, and a log costs half a pow. */
static double es_key(double r, double w)
{
    return -log(r) / w;
}

/* Every item has the same weight, and a weight. */
static int equal_weights(const mg_order_item_t *items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(items[i].key > 0) || items[i].key != items[0].key) return 0;
    return 1;
}

/* items[first] first, the others after it in a uniformly random order: a Fisher-Yates
 * shuffle, one draw per place from the last down to the third. */
static void shuffle_after(mg_order_item_t *items, size_t n, size_t first, uint64_t seed)
{
    mg_order_item_t pick = items[first];
    memmove(items + 1, items, first * sizeof(*items)); /* the others keep position order */
    items[0] = pick;
    for (size_t i = n - 1; i >= 2; i--) {
        size_t j = 1 + (size_t)(mg_unit_double(mg_splitmix64(&seed)) * (double)i);
        if (j > i) j = i;
        mg_order_item_t t = items[i];
        items[i] = items[j];
        items[j] = t;
    }
}

void mg_order_weighted(mg_order_item_t *items, size_t n, double u, uint64_t seed,
                       mg_order_item_t *tmp)
{
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(items[i].key > 0)) items[i].key = 0;
        total += items[i].key;
    }
    size_t first = draw_first(items, n, total, u);
    if (n > 1 && equal_weights(items, n)) {
        /* equal weights: the keys order like r, a uniformly random order, without the sort */
        shuffle_after(items, n, first, seed);
        return;
    }
    /* sorted ascending: the first pick before all (-1; keys are >= 0), no weight after
       every weighted item (NaN, even after an infinite key: r = 0) */
    for (size_t i = 0; i < n; i++) {
        double w = items[i].key;
        if (i == first) items[i].key = -1;
        else if (w > 0) items[i].key = es_key(mg_unit_double(mg_splitmix64(&seed)), w);
        else items[i].key = NAN;
    }
    mg_order_sort(items, n, tmp);
}

/* Same key: numbers equal, or both NaN (NaN keys are alike: they keep sequence order). */
static inline int same_key(double a, double b)
{
    return a == b || (isnan(a) && isnan(b));
}

/* a < b, NaN after every number; two NaN are equal (neither is less). */
static inline int less_nan_last(double a, double b)
{
    return a < b || (isnan(b) && !isnan(a)); /* (a < b is false when either is NaN) */
}

/* The key of the group item i belongs to (keys[pos - 1]; no keys: all alike). A taken item
 * has its pos negated. */
static inline double group_key(const mg_order_item_t *it, const mg_order_item_t *keys)
{
    return keys ? keys[(it->pos < 0 ? -it->pos : it->pos) - 1].key : 0;
}

/* The group of the smallest key left among the items not taken (pos > 0), in position
 * order, into group: each its weight (items[i].key, > 0 or 0) and its index i in items (as
 * pos). Returns its size. */
static size_t gather_group(const mg_order_item_t *items, size_t n, const mg_order_item_t *keys,
                           mg_order_item_t *group)
{
    size_t m = 0;
    double best = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].pos < 0) continue;
        double k = group_key(&items[i], keys);
        if (m == 0 || less_nan_last(k, best)) {
            best = k;
            m = 0;
        } else if (less_nan_last(best, k)) {
            continue;
        }
        group[m++] = (mg_order_item_t){.key = items[i].key, .pos = (int)i};
    }
    return m;
}

/* The place in group (m entries) of the next draw: a weighted draw over their weights with
 * u the first time (*first_draw), then with the stream's next number; none with a weight:
 * the first by position. The total is summed afresh for every draw, in position order. */
static size_t draw_in_group(const mg_order_item_t *group, size_t m, double u, int *first_draw,
                            uint64_t *state)
{
    double total = 0;
    for (size_t g = 0; g < m; g++) total += group[g].key;
    if (!(total > 0)) return 0;
    double x = (*first_draw ? u : mg_unit_double(mg_splitmix64(state))) * total;
    *first_draw = 0;
    size_t pick = 0;
    for (size_t g = 0; g < m; g++) {
        if (!(group[g].key > 0)) continue;
        pick = g; /* the last with a weight, should rounding leave x >= 0 */
        x -= group[g].key;
        if (x < 0) break;
    }
    return pick;
}

size_t mg_order_weighted_first(mg_order_item_t *items, size_t n, size_t k, double u, uint64_t seed,
                               const mg_order_item_t *keys, mg_order_item_t *tmp)
{
    if (k > n) k = n;
    for (size_t i = 0; i < n; i++)
        if (!(items[i].key > 0)) items[i].key = 0;
    uint64_t state = seed;
    int first_draw = 1;
    /* tmp holds the group being drawn from at its start (m entries: at most the items left)
       and the draws made at its end, the j-th at tmp[n - 1 - j]: they never meet. A group
       is gathered once and drawn from until it is empty, not rescanned for every draw. */
    size_t m = 0;
    for (size_t j = 0; j < k; j++) {
        if (m == 0) m = gather_group(items, n, keys, tmp);
        size_t g = draw_in_group(tmp, m, u, &first_draw, &state);
        size_t i = (size_t)tmp[g].pos;
        memmove(&tmp[g], &tmp[g + 1], (m - g - 1) * sizeof(*tmp));
        m--;
        tmp[n - 1 - j] = items[i];
        items[i].pos = -items[i].pos; /* taken */
    }
    for (size_t j = 0; j < k; j++) items[j] = tmp[n - 1 - j];
    return k;
}

/* keys sorted by (key, pos): the rank of each distinct key from 0, stored per position
 * (rank_of[pos - 1].pos), and how many items have each rank (keys[rank].pos, overwriting
 * entries already read). Returns the number of ranks. */
static size_t rank_keys(mg_order_item_t *keys, size_t n, mg_order_item_t *rank_of)
{
    size_t ranks = 0;
    double last = 0;
    for (size_t s = 0; s < n; s++) {
        double k = keys[s].key;
        int pos = keys[s].pos;
        if (s == 0 || !same_key(k, last)) keys[ranks++].pos = 0;
        last = k;
        rank_of[pos - 1].pos = (int)ranks - 1;
        keys[ranks - 1].pos++;
    }
    return ranks;
}

void mg_order_then_by(mg_order_item_t *items, size_t n, mg_order_item_t *keys, mg_order_item_t *tmp)
{
    /* A counting sort of the sequence by the rank of its key: the keys are sorted once
     * (in position order, the same from one request to the next but for the routes whose
     * samples moved), the sequence, new every time, is only walked: no comparison whose
     * outcome the branch predictor cannot know. */
    for (size_t j = 0; j < n; j++) keys[j].pos = (int)j + 1;
    mg_order_sort(keys, n, tmp);
    size_t ranks = rank_keys(keys, n, tmp);
    for (size_t i = 0; i < n; i++) items[i].key = tmp[items[i].pos - 1].pos; /* its rank */
    for (size_t r = 0, start = 0; r < ranks; r++) { /* counts into first places */
        size_t count = (size_t)keys[r].pos;
        keys[r].pos = (int)start;
        start += count;
    }
    for (size_t i = 0; i < n; i++) tmp[keys[(size_t)items[i].key].pos++] = items[i];
    memcpy(items, tmp, n * sizeof(*items));
}
