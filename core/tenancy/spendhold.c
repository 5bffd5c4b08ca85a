/* spendhold: spend held by requests in flight; see spendhold.h. */
#include "tenancy/spendhold.h"

#include <stdlib.h>
#include <string.h>

static uint64_t key_of(mg_spend_scope_t scope, int64_t id)
{
    return (uint64_t)scope << 62 | ((uint64_t)id & ((1ull << 62) - 1));
}

/* Index of the first entry with key >= k. */
static size_t lower(const mg_spend_holds_t *h, uint64_t k)
{
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (h->e[mid].key < k) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int64_t mg_spend_held(const mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id)
{
    uint64_t k = key_of(scope, id);
    size_t i = lower(h, k);
    return i < h->n && h->e[i].key == k ? h->e[i].micros : 0;
}

int mg_spend_hold(mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id, int64_t micros)
{
    uint64_t k = key_of(scope, id);
    size_t i = lower(h, k);
    if (i < h->n && h->e[i].key == k) {
        h->e[i].micros += micros;
        h->e[i].holds++;
        return 0;
    }
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 16;
        mg_spend_hold_t *e = realloc(h->e, cap * sizeof(*e));
        if (!e) return -1;
        h->e = e;
        h->cap = cap;
    }
    memmove(h->e + i + 1, h->e + i, (h->n - i) * sizeof(*h->e));
    h->e[i] = (mg_spend_hold_t){k, micros, 1};
    h->n++;
    return 0;
}

void mg_spend_unhold(mg_spend_holds_t *h, mg_spend_scope_t scope, int64_t id, int64_t micros)
{
    uint64_t k = key_of(scope, id);
    size_t i = lower(h, k);
    if (i >= h->n || h->e[i].key != k) return;
    h->e[i].micros -= micros;
    if (--h->e[i].holds > 0) return;
    memmove(h->e + i, h->e + i + 1, (h->n - i - 1) * sizeof(*h->e));
    h->n--;
}

size_t mg_spend_holders(const mg_spend_holds_t *h)
{
    return h->n;
}

void mg_spend_holds_free(mg_spend_holds_t *h)
{
    free(h->e);
    memset(h, 0, sizeof(*h));
}
