/* order: the sorting mechanics behind the routing policy's orders.
 *
 * policies/routing.lua decides which routes go in which order; these do the per-route
 * arithmetic for it (exposed to Lua as moongate.sort_by, moongate.weighted_order and
 * moongate.draw, see lmod.c and lua/README.md), and the core's replay of a kept plan
 * (replay.c) runs the very same functions with a new request's numbers. */
#ifndef MG_ORDER_H
#define MG_ORDER_H

#include <stddef.h>
#include <stdint.h>

typedef struct mg_order_item_s {
    double key;
    int pos; /* the item's position in the caller's list, from 1 */
} mg_order_item_t;

/* A request's random draws (moongate.draw): its random number `first`, handed out first and
 * stretched back over [0, 1) by each chance() it answers, so that it stays uniform whatever
 * they said; then a splitmix64 stream seeded with floor(random * 2^53). */
typedef struct mg_draw_s {
    double first;
    int used;       /* first was handed out */
    uint64_t state; /* the stream */
} mg_draw_t;

/* A draw from the request's random number (anything outside [0, 1) counts as 0). */
void mg_draw_init(mg_draw_t *d, double random);
/* True for a share p of requests: the first number below p (then stretched), or, once it was
 * handed out, the stream's next. */
int mg_draw_chance(mg_draw_t *d, double p);
/* The first number (or, once it was handed out, the stream's next) and the seed of a weighted
 * order's own stream. */
void mg_draw_for_order(mg_draw_t *d, double *u, uint64_t *seed);

/* Sort by ascending key, NaN after every number, equal keys by ascending pos. The items
 * come in ascending pos (the NaN ones keep that order); tmp has room for n items. */
void mg_order_sort(mg_order_item_t *items, size_t n, mg_order_item_t *tmp);

/* The next number of a splitmix64 stream. */
uint64_t mg_splitmix64(uint64_t *state);

/* The splitmix64 output as a number in [0, 1) (its top 53 bits). */
double mg_unit_double(uint64_t z);

/* A weighted random order without replacement. On input items[i].key is the weight of
 * the item at position items[i].pos (<= 0 or NaN: no weight); on output items are in the
 * order drawn:
 *   - the first is one draw with u in [0, 1): each item with a weight covers a stretch of
 *     [0, total) proportional to it, in position order (no weight at all: position 1);
 *   - the others follow by Efraimidis-Spirakis keys r^(1/w), largest first (computed as
 *     -log(r)/w, smallest first), equal keys by position, r drawn in position order from
 *     the splitmix64 stream seeded with seed (one per item with a weight, the first
 *     excepted);
 *   - items without a weight last, by position;
 *   - but when every item has the same weight (the keys would order like r), the others
 *     follow in a Fisher-Yates shuffle instead: in position order, then for i = n-1 down
 *     to 2 (from 0) swap items i and 1 + floor(r * i), r from the same stream. Same
 *     distribution, no sort.
 * tmp has room for n items. */
void mg_order_weighted(mg_order_item_t *items, size_t n, double u, uint64_t seed,
                       mg_order_item_t *tmp);

/* k items (at most n) of a weighted random order without replacement, by keys first (NULL:
 * none; keys[j].key belongs to the item at position j + 1, NaN after every number; not
 * overwritten), drawn one after the other: each next item a draw among those left in the
 * group of the smallest key left, over their weights (items[i].key; <= 0 or NaN: none),
 * the first with u, the others with the splitmix64 stream seeded with seed; a group with
 * no weight left gives its items by position. The same distribution as the first k of the
 * full order (mg_order_weighted, then mg_order_then_by) but not the same draws, for at most
 * n * k steps (a group is gathered once, then drawn from until it is empty) and no
 * logarithm: for a small k, as a request's plan needs no more entries than it can try.
 * Returns min(k, n): the items now in items. tmp has room for n items. */
size_t mg_order_weighted_first(mg_order_item_t *items, size_t n, size_t k, double u, uint64_t seed,
                               const mg_order_item_t *keys, mg_order_item_t *tmp);

/* Order the sequence items (as mg_order_weighted drew it, say) by ascending key first:
 * keys[j].key is the key of the item at position j + 1 (keys[j].pos is not read), NaN
 * after every number, and items with equal keys (NaN ones too) keep their order in the
 * sequence. This is a stable sort of the sequence by those keys: rule 8 of the routing
 * policy over rule 7's weighted order, in the same call. Only the items' pos mean
 * something afterwards; keys is overwritten; it and tmp have room for n items each. */
void mg_order_then_by(mg_order_item_t *items, size_t n, mg_order_item_t *keys,
                      mg_order_item_t *tmp);

#endif
