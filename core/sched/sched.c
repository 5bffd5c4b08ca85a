/* sched: weighted fair queue with aging, gates, leases and memory admission; see sched.h
 * for the ordering and head-of-line rules.
 *
 * Data layout. Queued entries are grouped in flows: one flow per (model, app, user,
 * priority). Keys rise within a priority while it has queued tasks, so a flow is a plain
 * FIFO list and its head is its smallest key. Every flow lives in exactly one binary
 * heap, ordered by its head's (key, seq):
 *   - s->ready: flows that dispatch may consider;
 *   - g->parked: flows found blocked by gate g (a model/app/user gate, s->nonrt for the
 *     non-P0 slots, or s->memgate for memory).
 * A count gate that has room and parked flows also sits in s->ready, as one node keyed
 * by its best parked flow (gate_sync keeps this true). Dispatch looks at the top of
 * s->ready: a gate node lets its best flow out into s->ready; a flow that is blocked is
 * parked on the first gate that blocks it (which is then full, so not in s->ready); a
 * flow that is not blocked is the answer. The minimum of s->ready is therefore always the
 * minimum over every flow that is not waiting on a full gate, which makes the choice
 * exact, and a flow is moved only when it reaches the top, which keeps it O(log n) per
 * move. Memory has no unit size, so freeing memory lets every memory-parked flow out.
 * A separate heap of entries, ordered by deadline, serves expire().
 *
 * All allocation happens in enqueue and gate creation: heap capacities are reserved for
 * the worst case (every flow in the same heap) when a flow is created, so dispatch,
 * release, cancel and expire cannot fail. */
#include "sched/sched.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define IDLE_BIT (UINT64_C(1) << 63) /* in a P4 key: after every P0-P3 key */
#define NO_INDEX SIZE_MAX
#define US_PER_MS 1000u

/* ---- binary heap of (k0, k1, item); each item stores its own index ---------------- */

typedef struct hnode_s {
    uint64_t k0, k1; /* compared in order */
    void *item;
} hnode_t;

typedef struct heap_s {
    hnode_t *v; /* owned */
    size_t n, cap;
    size_t idx_off;  /* offset of the item's size_t index field */
    uint64_t *moves; /* the scheduler's count of element moves (a cost measure) */
} heap_t;

/* First member of flows and gates, which share s->ready. */
typedef struct node_s {
    size_t hidx; /* index in the heap holding it */
    int is_gate;
} node_t;

struct mg_sched_gate_s {
    node_t node; /* in s->ready while in_ready */
    int in_ready;
    char *name; /* owned; NULL for the built-in gates */
    mg_sched_gate_kind_t kind;
    size_t hash;
    uint32_t max_running; /* 0 = unlimited */
    uint32_t max_queued;  /* 0 = unlimited */
    uint32_t running, queued;
    size_t nflows; /* flows naming this gate: bounds parked.n */
    uint64_t weight_bytes, kv_per_token_bytes;
    int loaded;
    heap_t parked;          /* flows blocked here, best first */
    mg_sched_flow_t *flows; /* flows anchored here (see flow_anchor) */
    mg_sched_gate_t *hnext; /* hash chain */
};

struct mg_sched_flow_s {
    node_t node;                               /* in s->ready, or parked_on->parked */
    mg_sched_gate_t *parked_on;                /* NULL: in s->ready */
    mg_sched_gate_t *gate[MG_GATE_KIND_COUNT]; /* borrowed */
    mg_priority_t prio;
    mg_sched_entry_t *head, *tail; /* FIFO; keys ascend */
    mg_sched_flow_t *anext, *aprev;
    mg_sched_flow_t **anchor; /* the list it is on */
};

struct mg_sched_s {
    mg_sched_config_t cfg;
    uint64_t cost_us[MG_PRIO_COUNT];   /* WFQ tag increment per task */
    uint64_t offset_us[MG_PRIO_COUNT]; /* pads fresh-task gaps to one aging period */
    uint64_t vtime_us;                 /* V: largest tag dispatched */
    uint64_t last_tag_us[MG_PRIO_COUNT];
    uint32_t queued_by_prio[MG_PRIO_COUNT];
    uint32_t queued, running, running_rt;
    uint64_t seq; /* enqueue counter: tie-break */
    uint64_t heap_moves;
    uint64_t now_ms;         /* largest time seen */
    heap_t ready;            /* flows, and gates with room and parked flows */
    heap_t deadlines;        /* entries with a deadline */
    mg_sched_gate_t nonrt;   /* the max_running - reserved slots P1-P4 may use */
    mg_sched_gate_t memgate; /* flows waiting for memory */
    mg_sched_mem_t mem;
    size_t nflows;
    mg_sched_flow_t *root_flows; /* flows naming no gate */
    mg_sched_gate_t **buckets;   /* owned; gates by (kind, name) */
    size_t nbuckets, ngates;
};

static int hless(const hnode_t *a, const hnode_t *b)
{
    return a->k0 < b->k0 || (a->k0 == b->k0 && a->k1 < b->k1);
}

static void hset(heap_t *h, size_t i, hnode_t node)
{
    (*h->moves)++;
    h->v[i] = node;
    memcpy((char *)node.item + h->idx_off, &i, sizeof(i));
}

static void heap_up(heap_t *h, size_t i)
{
    hnode_t node = h->v[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!hless(&node, &h->v[parent])) break;
        hset(h, i, h->v[parent]);
        i = parent;
    }
    hset(h, i, node);
}

static void heap_down(heap_t *h, size_t i)
{
    hnode_t node = h->v[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hless(&h->v[c + 1], &h->v[c])) c++;
        if (!hless(&h->v[c], &node)) break;
        hset(h, i, h->v[c]);
        i = c;
    }
    hset(h, i, node);
}

static int heap_reserve(heap_t *h, size_t want)
{
    if (want <= h->cap) return 0;
    size_t cap = h->cap ? h->cap : 8;
    while (cap < want) cap *= 2;
    hnode_t *v = realloc(h->v, cap * sizeof(*v));
    if (!v) return -1;
    h->v = v;
    h->cap = cap;
    return 0;
}

/* Capacity must have been reserved. */
static void heap_push(heap_t *h, uint64_t k0, uint64_t k1, void *item)
{
    h->v[h->n] = (hnode_t){k0, k1, item};
    h->n++;
    heap_up(h, h->n - 1);
}

static void heap_remove(heap_t *h, size_t i)
{
    h->n--;
    if (i == h->n) return;
    hnode_t old = h->v[i];
    hset(h, i, h->v[h->n]);
    if (hless(&h->v[i], &old)) heap_up(h, i);
    else heap_down(h, i);
}

static void heap_rekey(heap_t *h, size_t i, uint64_t k0, uint64_t k1)
{
    hnode_t old = h->v[i];
    h->v[i].k0 = k0;
    h->v[i].k1 = k1;
    if (hless(&h->v[i], &old)) heap_up(h, i);
    else heap_down(h, i);
}

/* ---- priorities and results ---------------------------------------------------------- */

static const char *const prio_names[MG_PRIO_COUNT] = {"P0", "P1", "P2", "P3", "P4"};

int mg_priority_parse(const char *s, mg_priority_t *out)
{
    if (!s || !out || (s[0] != 'P' && s[0] != 'p') || s[1] < '0' || s[1] > '4' || s[2]) return -1;
    *out = (mg_priority_t)(s[1] - '0');
    return 0;
}

int mg_priority_from_header(const char *v, mg_priority_t *out)
{
    static const char *const words[] = {"urgent", "high", "normal", "low"};
    if (!v || !out) return -1;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, words[i]) == 0) {
            *out = (mg_priority_t)i;
            return 0;
        }
    }
    return -1;
}

const char *mg_priority_name(mg_priority_t p)
{
    return (unsigned)p < MG_PRIO_COUNT ? prio_names[p] : "P?";
}

const char *mg_sched_strerror(int rc)
{
    switch (rc) {
    case MG_SCHED_OK: return "OK";
    case MG_SCHED_EQUEUE_FULL: return "QUEUE_FULL";
    case MG_SCHED_EOVERLOAD:
    case MG_SCHED_ETOO_LARGE: return "RESOURCE_EXHAUSTED";
    default: return "INTERNAL_ERROR";
    }
}

/* ---- configuration ---------------------------------------------------------------- */

void mg_sched_config_defaults(mg_sched_config_t *c)
{
    static const uint32_t weights[MG_PRIO_COUNT] = {100, 50, 25, 10, 1};
    memset(c, 0, sizeof(*c));
    memcpy(c->weight, weights, sizeof(weights));
    c->aging_ms = 30000;
    c->max_running = 8;
    c->max_queued = 500;
    c->reserved_realtime_slots = 2;
    c->level_threshold[0] = 0.70;
    c->level_threshold[1] = 0.85;
    c->level_threshold[2] = 0.95;
    c->level2_max_output_tokens = 1024;
    c->user_max_running = 1;
    c->safety_margin_ratio = 0.08;
}

static int config_valid(const mg_sched_config_t *c)
{
    if (!c || c->max_running == 0 || c->max_queued == 0) return 0;
    if (c->reserved_realtime_slots >= c->max_running) return 0;
    if (c->aging_ms > UINT64_C(1) << 32) return 0; /* keeps keys far from overflow */
    for (int p = 0; p < MG_PRIO_COUNT; p++)
        if (c->weight[p] == 0) return 0;
    const double *t = c->level_threshold;
    if (!(t[0] > 0 && t[0] <= t[1] && t[1] <= t[2])) return 0;
    return c->safety_margin_ratio >= 0 && c->safety_margin_ratio < 1;
}

/* cost[p] = Q / weight[p], with Q such that the widest gap between adjacent levels
 * P0..P3 equals the aging period; offset[p] pads every gap to exactly one period. */
static void sched_costs(mg_sched_t *s)
{
    const mg_sched_config_t *c = &s->cfg;
    double gap = 0;
    for (int p = MG_PRIO_P1; p <= MG_PRIO_P3; p++) {
        double d = 1.0 / c->weight[p] - 1.0 / c->weight[p - 1];
        if (d > gap) gap = d;
    }
    double aging_us = (double)c->aging_ms * US_PER_MS;
    double q = (aging_us > 0 && gap > 0) ? aging_us / gap : 1e8;
    for (int p = 0; p < MG_PRIO_COUNT; p++) {
        uint64_t cost = (uint64_t)(q / c->weight[p] + 0.5);
        s->cost_us[p] = cost ? cost : 1;
        s->offset_us[p] = 0;
    }
    if (!c->aging_ms) return;
    for (int p = MG_PRIO_P1; p <= MG_PRIO_P3; p++) {
        int64_t off = (int64_t)(p * aging_us) - ((int64_t)s->cost_us[p] - (int64_t)s->cost_us[0]);
        s->offset_us[p] = off > 0 ? (uint64_t)off : 0;
    }
}

/* ---- device memory ------------------------------------------------------------------ */

void mg_sched_mem_init(mg_sched_mem_t *m, uint64_t vram_bytes, double safety_margin_ratio)
{
    m->vram_bytes = vram_bytes;
    m->safety_margin_ratio = safety_margin_ratio;
    m->weights_bytes = 0;
    m->reserved_bytes = 0;
}

uint64_t mg_sched_mem_budget(const mg_sched_mem_t *m)
{
    if (!m->vram_bytes) return UINT64_MAX;
    uint64_t usable = (uint64_t)((double)m->vram_bytes * (1.0 - m->safety_margin_ratio));
    return usable > m->weights_bytes ? usable - m->weights_bytes : 0;
}

uint64_t mg_sched_mem_free(const mg_sched_mem_t *m)
{
    uint64_t budget = mg_sched_mem_budget(m);
    if (budget == UINT64_MAX) return UINT64_MAX;
    return budget > m->reserved_bytes ? budget - m->reserved_bytes : 0;
}

int mg_sched_mem_reserve(mg_sched_mem_t *m, uint64_t bytes)
{
    if (bytes > mg_sched_mem_free(m)) return MG_SCHED_ETOO_LARGE;
    m->reserved_bytes += bytes;
    return 0;
}

void mg_sched_mem_release(mg_sched_mem_t *m, uint64_t bytes)
{
    m->reserved_bytes = bytes < m->reserved_bytes ? m->reserved_bytes - bytes : 0;
}

int mg_sched_mem_load(mg_sched_mem_t *m, uint64_t weight_bytes)
{
    if (m->vram_bytes) {
        uint64_t usable = (uint64_t)((double)m->vram_bytes * (1.0 - m->safety_margin_ratio));
        uint64_t weights = m->weights_bytes + weight_bytes;
        if (weights > usable || usable - weights < m->reserved_bytes) return MG_SCHED_ETOO_LARGE;
    }
    m->weights_bytes += weight_bytes;
    return 0;
}

void mg_sched_mem_unload(mg_sched_mem_t *m, uint64_t weight_bytes)
{
    m->weights_bytes = weight_bytes < m->weights_bytes ? m->weights_bytes - weight_bytes : 0;
}

double mg_sched_mem_fraction(const mg_sched_mem_t *m)
{
    if (!m->vram_bytes) return 0;
    uint64_t budget = mg_sched_mem_budget(m);
    if (!budget) return 1;
    return (double)m->reserved_bytes / (double)budget;
}

int mg_sched_fit_output(uint64_t free_bytes, uint64_t kv_per_token_bytes, uint32_t input_tokens,
                        uint32_t asked, uint32_t min_tokens, uint32_t *ceiling)
{
    if (kv_per_token_bytes * ((uint64_t)input_tokens + asked) <= free_bytes) {
        *ceiling = asked;
        return 0;
    }
    /* kv_per_token_bytes > 0 from here: a zero reservation fits anything */
    if (!min_tokens || asked <= min_tokens) return MG_SCHED_ETOO_LARGE;
    uint64_t tokens = free_bytes / kv_per_token_bytes;
    if (tokens < (uint64_t)input_tokens + min_tokens) return MG_SCHED_ETOO_LARGE;
    *ceiling = (uint32_t)(tokens - input_tokens); /* < asked: asked did not fit */
    return 0;
}

/* ---- gates ----------------------------------------------------------------------- */

static uint32_t gate_room(const mg_sched_gate_t *g)
{
    if (!g->max_running) return UINT32_MAX;
    return g->running < g->max_running ? g->max_running - g->running : 0;
}

static int gate_queue_full(const mg_sched_gate_t *g)
{
    return g->max_queued && g->queued >= g->max_queued;
}

static void gate_setup(mg_sched_t *s, mg_sched_gate_t *g, mg_sched_gate_kind_t kind,
                       uint32_t max_running, uint32_t max_queued)
{
    g->node.is_gate = 1;
    g->parked.moves = &s->heap_moves;
    g->kind = kind;
    g->max_running = max_running;
    g->max_queued = max_queued;
    g->parked.idx_off = offsetof(node_t, hidx);
}

/* Keep g's node in s->ready exactly while g has room and parked flows, keyed by the
 * best of them. Memory is not a count gate and never has a node. */
static void gate_sync(mg_sched_t *s, mg_sched_gate_t *g)
{
    if (g == &s->memgate) return;
    int want = g->parked.n > 0 && gate_room(g) > 0;
    if (!want) {
        if (g->in_ready) heap_remove(&s->ready, g->node.hidx);
        g->in_ready = 0;
        return;
    }
    const hnode_t *best = &g->parked.v[0];
    if (g->in_ready) {
        heap_rekey(&s->ready, g->node.hidx, best->k0, best->k1);
    } else {
        heap_push(&s->ready, best->k0, best->k1, g);
        g->in_ready = 1;
    }
}

static heap_t *flow_heap(mg_sched_t *s, const mg_sched_flow_t *f)
{
    return f->parked_on ? &f->parked_on->parked : &s->ready;
}

static void flow_push_ready(mg_sched_t *s, mg_sched_flow_t *f)
{
    f->parked_on = NULL;
    heap_push(&s->ready, f->head->key_, f->head->seq_, f);
}

/* Move g's best parked flow into s->ready. */
static void gate_let_out(mg_sched_t *s, mg_sched_gate_t *g)
{
    mg_sched_flow_t *f = g->parked.v[0].item;
    heap_remove(&g->parked, 0);
    flow_push_ready(s, f);
    gate_sync(s, g);
}

/* Memory was freed: every flow waiting for it is considered again. */
static void mem_refill(mg_sched_t *s)
{
    while (s->memgate.parked.n) gate_let_out(s, &s->memgate);
}

static void gate_put(mg_sched_t *s, mg_sched_gate_t *g)
{
    g->running--;
    gate_sync(s, g);
}

static void gate_take(mg_sched_t *s, mg_sched_gate_t *g)
{
    g->running++;
    gate_sync(s, g);
}

static size_t gate_hash(mg_sched_gate_kind_t kind, const char *name)
{
    uint64_t h = UINT64_C(1469598103934665603) ^ (uint64_t)kind;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= UINT64_C(1099511628211);
    }
    return (size_t)h;
}

static int gates_grow(mg_sched_t *s)
{
    size_t nb = s->nbuckets * 2;
    mg_sched_gate_t **b = calloc(nb, sizeof(*b));
    if (!b) return -1;
    for (size_t i = 0; i < s->nbuckets; i++) {
        mg_sched_gate_t *g = s->buckets[i];
        while (g) {
            mg_sched_gate_t *next = g->hnext;
            g->hnext = b[g->hash & (nb - 1)];
            b[g->hash & (nb - 1)] = g;
            g = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
    return 0;
}

static mg_sched_gate_t *gate_new(mg_sched_t *s, mg_sched_gate_kind_t kind, const char *name)
{
    mg_sched_gate_t *g = calloc(1, sizeof(*g));
    if (!g) return NULL;
    g->name = strdup(name);
    if (!g->name) {
        free(g);
        return NULL;
    }
    const mg_sched_config_t *c = &s->cfg;
    if (kind == MG_GATE_MODEL) gate_setup(s, g, kind, c->model_max_running, 0);
    if (kind == MG_GATE_APP) gate_setup(s, g, kind, c->app_max_running, c->app_max_queued);
    if (kind == MG_GATE_USER) gate_setup(s, g, kind, c->user_max_running, c->user_max_queued);
    return g;
}

mg_sched_gate_t *mg_sched_gate(mg_sched_t *s, mg_sched_gate_kind_t kind, const char *name)
{
    if (!s || !name || (unsigned)kind >= MG_GATE_KIND_COUNT) return NULL;
    size_t h = gate_hash(kind, name);
    for (mg_sched_gate_t *g = s->buckets[h & (s->nbuckets - 1)]; g; g = g->hnext)
        if (g->hash == h && g->kind == kind && strcmp(g->name, name) == 0) return g;
    if (s->ngates >= s->nbuckets && gates_grow(s) != 0) return NULL;
    /* every gate may need a node in s->ready (the + 1 is s->nonrt) */
    if (heap_reserve(&s->ready, s->nflows + s->ngates + 2) != 0) return NULL;
    mg_sched_gate_t *g = gate_new(s, kind, name);
    if (!g) return NULL;
    g->hash = h;
    g->hnext = s->buckets[h & (s->nbuckets - 1)];
    s->buckets[h & (s->nbuckets - 1)] = g;
    s->ngates++;
    return g;
}

void mg_sched_gate_limits(mg_sched_t *s, mg_sched_gate_t *g, uint32_t max_running,
                          uint32_t max_queued)
{
    if (!s || !g) return;
    g->max_running = max_running;
    g->max_queued = max_queued;
    gate_sync(s, g);
}

uint32_t mg_sched_gate_running(const mg_sched_gate_t *g)
{
    return g ? g->running : 0;
}

uint32_t mg_sched_gate_queued(const mg_sched_gate_t *g)
{
    return g ? g->queued : 0;
}

void mg_sched_model_memory(mg_sched_t *s, mg_sched_gate_t *model, uint64_t weight_bytes,
                           uint64_t kv_per_token_bytes)
{
    if (!s || !model) return;
    if (model->loaded) {
        mg_sched_mem_unload(&s->mem, model->weight_bytes);
        s->mem.weights_bytes += weight_bytes; /* already resident: no refusal */
    }
    model->weight_bytes = weight_bytes;
    model->kv_per_token_bytes = kv_per_token_bytes;
    mem_refill(s);
}

int mg_sched_model_load(mg_sched_t *s, mg_sched_gate_t *model, int loaded)
{
    if (!s || !model || model->kind != MG_GATE_MODEL) return MG_SCHED_EINVAL;
    loaded = loaded != 0;
    if (loaded == model->loaded) return 0;
    if (loaded) {
        int rc = mg_sched_mem_load(&s->mem, model->weight_bytes);
        if (rc) return rc;
    } else {
        mg_sched_mem_unload(&s->mem, model->weight_bytes);
        mem_refill(s);
    }
    model->loaded = loaded;
    return 0;
}

/* ---- flows ----------------------------------------------------------------------- */

/* Flows are found through the most specific gate they name: a user has few flows. */
static mg_sched_flow_t **flow_anchor(mg_sched_t *s, mg_sched_gate_t *const gate[])
{
    for (int i = MG_GATE_KIND_COUNT - 1; i >= 0; i--)
        if (gate[i]) return &gate[i]->flows;
    return &s->root_flows;
}

static mg_sched_flow_t *flow_find(mg_sched_flow_t *list, const mg_sched_entry_t *e)
{
    for (mg_sched_flow_t *f = list; f; f = f->anext) {
        if (f->prio != e->priority) continue;
        if (memcmp(f->gate, e->gate, sizeof(f->gate)) == 0) return f;
    }
    return NULL;
}

/* Room for one more flow in every heap it could ever sit in. */
static int flow_reserve(mg_sched_t *s, const mg_sched_entry_t *e)
{
    size_t n = s->nflows + 1;
    if (heap_reserve(&s->ready, n + s->ngates + 1) || heap_reserve(&s->nonrt.parked, n) ||
        heap_reserve(&s->memgate.parked, n))
        return -1;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++) {
        mg_sched_gate_t *g = e->gate[i];
        if (g && heap_reserve(&g->parked, g->nflows + 1)) return -1;
    }
    return 0;
}

static mg_sched_flow_t *flow_create(mg_sched_t *s, const mg_sched_entry_t *e,
                                    mg_sched_flow_t **anchor)
{
    if (flow_reserve(s, e) != 0) return NULL;
    mg_sched_flow_t *f = calloc(1, sizeof(*f));
    if (!f) return NULL;
    f->node.is_gate = 0;
    memcpy(f->gate, e->gate, sizeof(f->gate));
    f->prio = e->priority;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (f->gate[i]) f->gate[i]->nflows++;
    s->nflows++;
    f->anchor = anchor;
    f->anext = *anchor;
    if (*anchor) (*anchor)->aprev = f;
    *anchor = f;
    return f;
}

/* Move f from s->ready to g's parked heap (g blocks it, so g is full: no node). */
static void flow_park(mg_sched_t *s, mg_sched_flow_t *f, mg_sched_gate_t *g)
{
    heap_remove(&s->ready, f->node.hidx);
    f->parked_on = g;
    heap_push(&g->parked, f->head->key_, f->head->seq_, f);
    gate_sync(s, g);
}

static void flow_destroy(mg_sched_t *s, mg_sched_flow_t *f)
{
    heap_remove(flow_heap(s, f), f->node.hidx);
    if (f->parked_on) gate_sync(s, f->parked_on);
    if (f->aprev) f->aprev->anext = f->anext;
    else *f->anchor = f->anext;
    if (f->anext) f->anext->aprev = f->aprev;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (f->gate[i]) f->gate[i]->nflows--;
    s->nflows--;
    free(f);
}

/* f's head was removed: drop an empty flow, else re-sort it where it is. A flow waiting
 * for memory is considered again, as its new head may fit where the old did not. */
static void flow_head_changed(mg_sched_t *s, mg_sched_flow_t *f)
{
    if (!f->head) {
        flow_destroy(s, f);
    } else if (f->parked_on == &s->memgate) {
        heap_remove(&s->memgate.parked, f->node.hidx);
        flow_push_ready(s, f);
    } else {
        heap_rekey(flow_heap(s, f), f->node.hidx, f->head->key_, f->head->seq_);
        if (f->parked_on) gate_sync(s, f->parked_on);
    }
}

/* ---- memory fit: the degrade steps ------------------------------------------------ */

/* How a task fits some amount of memory: its output ceiling, its bytes, the steps taken. */
typedef struct fit_s {
    uint32_t max_output_tokens;
    uint64_t mem_bytes;
    unsigned degraded; /* MG_SCHED_SHORTER | MG_SCHED_SMALLER */
} fit_t;

/* e on one model's figures: as asked, else shorter. 0, or -1 when it does not fit. */
static int fit_on_model(const mg_sched_entry_t *e, const mg_sched_gate_t *model,
                        uint64_t free_bytes, fit_t *fit)
{
    uint64_t kv = model ? model->kv_per_token_bytes : 0;
    uint32_t ceiling;
    if (mg_sched_fit_output(free_bytes, kv, e->input_tokens, e->max_output_tokens,
                            e->min_output_tokens, &ceiling) != 0)
        return -1;
    fit->max_output_tokens = ceiling;
    fit->mem_bytes = kv * ((uint64_t)e->input_tokens + ceiling);
    fit->degraded = ceiling != e->max_output_tokens ? MG_SCHED_SHORTER : 0;
    return 0;
}

/* The PRD 3.4.3 order within free_bytes: as asked, shorter output, then the smaller model
 * (as asked, then shorter). 0 and *fit filled, or -1: the task must wait. */
static int entry_fit(const mg_sched_entry_t *e, uint64_t free_bytes, fit_t *fit)
{
    if (fit_on_model(e, e->gate[MG_GATE_MODEL], free_bytes, fit) == 0) return 0;
    if (!e->smaller || fit_on_model(e, e->smaller, free_bytes, fit) != 0) return -1;
    fit->degraded |= MG_SCHED_SMALLER;
    return 0;
}

/* Dispatch takes e as it fits now (flow_blocker has checked that it does). */
static void entry_take_fit(mg_sched_t *s, mg_sched_entry_t *e)
{
    fit_t fit = {e->max_output_tokens, e->mem_bytes_, 0};
    entry_fit(e, mg_sched_mem_free(&s->mem), &fit);
    e->max_output_tokens = fit.max_output_tokens;
    e->mem_bytes_ = fit.mem_bytes;
    e->degraded = fit.degraded;
}

/* The first gate that keeps f's head from running now, or NULL. */
static mg_sched_gate_t *flow_blocker(mg_sched_t *s, const mg_sched_flow_t *f)
{
    if (f->prio != MG_PRIO_P0 && gate_room(&s->nonrt) == 0) return &s->nonrt;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (f->gate[i] && gate_room(f->gate[i]) == 0) return f->gate[i];
    fit_t fit;
    if (entry_fit(f->head, mg_sched_mem_free(&s->mem), &fit) != 0) return &s->memgate;
    return NULL;
}

/* The flow whose head dispatch takes, moving flows between heaps on the way; NULL if
 * none. Each turn moves one flow, so it ends after at most two turns per flow. */
static mg_sched_flow_t *select_flow(mg_sched_t *s)
{
    for (;;) {
        if (s->running >= s->cfg.max_running || s->ready.n == 0) return NULL;
        node_t *top = s->ready.v[0].item;
        if (top->is_gate) {
            gate_let_out(s, (mg_sched_gate_t *)top);
            continue;
        }
        mg_sched_flow_t *f = (mg_sched_flow_t *)top;
        if (f->prio == MG_PRIO_P4 && s->queued > s->queued_by_prio[MG_PRIO_P4]) return NULL;
        mg_sched_gate_t *g = flow_blocker(s, f);
        if (!g) return f;
        flow_park(s, f, g);
    }
}

/* ---- entries --------------------------------------------------------------------- */

void mg_sched_entry_init(mg_sched_entry_t *e, mg_priority_t p)
{
    memset(e, 0, sizeof(*e));
    e->priority = p;
    e->dl_index_ = NO_INDEX;
}

static void sched_tick(mg_sched_t *s, uint64_t now_ms)
{
    if (now_ms > s->now_ms) s->now_ms = now_ms;
}

/* The fixed key: WFQ tag + level offset + enqueue time (the aging term). */
static void entry_key(mg_sched_t *s, mg_sched_entry_t *e)
{
    int p = e->priority;
    uint64_t start = s->vtime_us;
    if (s->queued_by_prio[p] && s->last_tag_us[p] > start) start = s->last_tag_us[p];
    e->tag_ = start + s->cost_us[p];
    s->last_tag_us[p] = e->tag_;
    uint64_t key = e->tag_ + s->offset_us[p];
    if (s->cfg.aging_ms) key += s->now_ms * US_PER_MS;
    e->key_ = p == MG_PRIO_P4 ? (key | IDLE_BIT) : key;
    e->seq_ = ++s->seq;
    e->enqueued_ms = s->now_ms;
}

static void count_queued(mg_sched_t *s, mg_sched_entry_t *e, int up)
{
    uint32_t d = up ? 1u : (uint32_t)-1;
    s->queued += d;
    s->queued_by_prio[e->priority] += d;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (e->gate[i]) e->gate[i]->queued += d;
    e->queued_ = up;
}

static uint64_t entry_mem_bytes(const mg_sched_entry_t *e)
{
    const mg_sched_gate_t *m = e->gate[MG_GATE_MODEL];
    if (!m) return 0;
    return m->kv_per_token_bytes * ((uint64_t)e->input_tokens + e->max_output_tokens);
}

/* Queued caps, backpressure, output cap, memory size: the checks before queueing. A full
 * queue is QUEUE_FULL for every priority, although its fill alone means level 3. */
static int entry_admit(mg_sched_t *s, mg_sched_entry_t *e)
{
    if (s->queued >= s->cfg.max_queued) return MG_SCHED_EQUEUE_FULL;
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (e->gate[i] && gate_queue_full(e->gate[i])) return MG_SCHED_EQUEUE_FULL;
    int level = mg_sched_level(s);
    if (!mg_sched_level_admits(level, e->priority)) return MG_SCHED_EOVERLOAD;
    uint32_t cap = s->cfg.level2_max_output_tokens;
    if (level >= 2 && cap && (e->max_output_tokens == 0 || e->max_output_tokens > cap))
        e->max_output_tokens = cap;
    e->mem_bytes_ = entry_mem_bytes(e);
    e->degraded = 0;
    /* refused only when no degrade step could ever make it fit */
    fit_t fit;
    if (entry_fit(e, mg_sched_mem_budget(&s->mem), &fit) != 0) return MG_SCHED_ETOO_LARGE;
    return 0;
}

static void entry_append(mg_sched_flow_t *f, mg_sched_entry_t *e)
{
    e->flow_ = f;
    e->next_ = NULL;
    e->prev_ = f->tail;
    if (f->tail) f->tail->next_ = e;
    else f->head = e;
    f->tail = e;
}

/* Take e out of its flow list, the deadline heap and the counts (not the flow heap). */
static void entry_leave(mg_sched_t *s, mg_sched_entry_t *e)
{
    mg_sched_flow_t *f = e->flow_;
    if (e->dl_index_ != NO_INDEX) {
        heap_remove(&s->deadlines, e->dl_index_);
        e->dl_index_ = NO_INDEX;
    }
    if (e->prev_) e->prev_->next_ = e->next_;
    else f->head = e->next_;
    if (e->next_) e->next_->prev_ = e->prev_;
    else f->tail = e->prev_;
    e->prev_ = e->next_ = NULL;
    e->flow_ = NULL;
    count_queued(s, e, 0);
}

/* Cancel and expire: e leaves the queue without running. */
static void entry_remove(mg_sched_t *s, mg_sched_entry_t *e)
{
    mg_sched_flow_t *f = e->flow_;
    int was_head = f->head == e;
    entry_leave(s, e);
    if (was_head) flow_head_changed(s, f);
}

int mg_sched_enqueue(mg_sched_t *s, mg_sched_entry_t *e, uint64_t now_ms)
{
    if (!s || !e || (unsigned)e->priority >= MG_PRIO_COUNT) return MG_SCHED_EINVAL;
    if (e->queued_ || e->lease.held) return MG_SCHED_ESTATE;
    sched_tick(s, now_ms);
    int rc = entry_admit(s, e);
    if (rc) return rc;
    if (e->deadline_ms && heap_reserve(&s->deadlines, s->deadlines.n + 1)) return MG_SCHED_ENOMEM;
    mg_sched_flow_t **anchor = flow_anchor(s, e->gate);
    mg_sched_flow_t *f = flow_find(*anchor, e);
    int fresh = f == NULL;
    if (fresh && !(f = flow_create(s, e, anchor))) return MG_SCHED_ENOMEM;
    entry_key(s, e);
    entry_append(f, e);
    if (fresh) flow_push_ready(s, f);
    e->dl_index_ = NO_INDEX;
    if (e->deadline_ms) heap_push(&s->deadlines, e->deadline_ms, e->seq_, e);
    count_queued(s, e, 1);
    return 0;
}

/* ---- dispatch and leases ----------------------------------------------------------- */

static void lease_take(mg_sched_t *s, mg_sched_entry_t *e)
{
    mg_sched_lease_t *l = &e->lease;
    l->sched = s;
    l->realtime = e->priority == MG_PRIO_P0;
    s->running++;
    if (l->realtime) s->running_rt++;
    else gate_take(s, &s->nonrt);
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++) {
        l->gate[i] = e->gate[i];
        if (l->gate[i]) gate_take(s, l->gate[i]);
    }
    l->mem_bytes = e->mem_bytes_;
    s->mem.reserved_bytes += l->mem_bytes; /* fits: checked by flow_blocker */
    l->held = 1;
}

mg_sched_entry_t *mg_sched_peek(mg_sched_t *s)
{
    mg_sched_flow_t *f = s ? select_flow(s) : NULL;
    return f ? f->head : NULL;
}

mg_sched_entry_t *mg_sched_dispatch(mg_sched_t *s, uint64_t now_ms)
{
    if (!s) return NULL;
    sched_tick(s, now_ms);
    mg_sched_flow_t *f = select_flow(s);
    if (!f) return NULL;
    mg_sched_entry_t *e = f->head;
    entry_take_fit(s, e);
    entry_leave(s, e);
    lease_take(s, e);
    if (e->priority != MG_PRIO_P4 && e->tag_ > s->vtime_us) s->vtime_us = e->tag_;
    flow_head_changed(s, f);
    return e;
}

int mg_sched_release(mg_sched_lease_t *l)
{
    if (!l || !l->held) return 1;
    mg_sched_t *s = l->sched;
    l->held = 0;
    s->running--;
    if (l->realtime) s->running_rt--;
    else gate_put(s, &s->nonrt);
    for (int i = 0; i < MG_GATE_KIND_COUNT; i++)
        if (l->gate[i]) gate_put(s, l->gate[i]);
    if (l->mem_bytes) {
        mg_sched_mem_release(&s->mem, l->mem_bytes);
        mem_refill(s);
    }
    return 0;
}

uint32_t mg_sched_queued(const mg_sched_t *s)
{
    return s ? s->queued : 0;
}

int mg_sched_cancel(mg_sched_t *s, mg_sched_entry_t *e)
{
    if (!s || !e || !e->queued_) return MG_SCHED_ESTATE;
    entry_remove(s, e);
    return 0;
}

int mg_sched_next_deadline(const mg_sched_t *s, uint64_t *deadline_ms)
{
    if (!s || s->deadlines.n == 0) return MG_SCHED_ESTATE;
    if (deadline_ms) *deadline_ms = s->deadlines.v[0].k0;
    return 0;
}

mg_sched_entry_t *mg_sched_expire(mg_sched_t *s, uint64_t now_ms)
{
    if (!s) return NULL;
    sched_tick(s, now_ms);
    if (s->deadlines.n == 0 || s->deadlines.v[0].k0 > s->now_ms) return NULL;
    mg_sched_entry_t *e = s->deadlines.v[0].item;
    entry_remove(s, e);
    return e;
}

/* ---- backpressure and stats ------------------------------------------------------- */

/* Load = max(queue fill, memory reserved). Busy slots alone are not overload: with
 * every slot running and nothing waiting the gateway is simply at capacity, and new
 * work should queue, not be shed (counting running slots made a saturated engine
 * reject P2 traffic the queue exists for). Running slots still show in the stats. */
double mg_sched_load(const mg_sched_t *s)
{
    double q = s->cfg.max_queued ? (double)s->queued / s->cfg.max_queued : 0;
    double m = mg_sched_mem_fraction(&s->mem);
    return m > q ? m : q;
}

int mg_sched_level_for(const mg_sched_config_t *cfg, double load)
{
    int level = 0;
    for (int i = 0; i < 3; i++)
        if (load >= cfg->level_threshold[i]) level = i + 1;
    return level;
}

int mg_sched_level(const mg_sched_t *s)
{
    return mg_sched_level_for(&s->cfg, mg_sched_load(s));
}

int mg_sched_level_admits(int level, mg_priority_t p)
{
    static const int lowest_admitted[4] = {MG_PRIO_P4, MG_PRIO_P3, MG_PRIO_P2, MG_PRIO_P1};
    if ((unsigned)p >= MG_PRIO_COUNT) return 0;
    if (level <= 0) return 1;
    if (level > 3) level = 3;
    return (int)p <= lowest_admitted[level];
}

void mg_sched_stats(const mg_sched_t *s, mg_sched_stats_t *st)
{
    st->running = s->running;
    st->running_realtime = s->running_rt;
    st->queued = s->queued;
    memcpy(st->queued_by_prio, s->queued_by_prio, sizeof(st->queued_by_prio));
    st->mem_reserved_bytes = s->mem.reserved_bytes;
    st->mem_budget_bytes = mg_sched_mem_budget(&s->mem);
    st->load = mg_sched_load(s);
    st->level = mg_sched_level(s);
    st->heap_moves = s->heap_moves;
}

/* ---- lifecycle --------------------------------------------------------------------- */

static void sched_apply(mg_sched_t *s, const mg_sched_config_t *cfg)
{
    s->cfg = *cfg;
    sched_costs(s);
    s->nonrt.max_running = cfg->max_running - cfg->reserved_realtime_slots;
    s->mem.vram_bytes = cfg->vram_bytes;
    s->mem.safety_margin_ratio = cfg->safety_margin_ratio;
}

mg_sched_t *mg_sched_new(const mg_sched_config_t *cfg)
{
    if (!config_valid(cfg)) return NULL;
    mg_sched_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->nbuckets = 16;
    s->buckets = calloc(s->nbuckets, sizeof(*s->buckets));
    if (!s->buckets) {
        free(s);
        return NULL;
    }
    s->ready.idx_off = offsetof(node_t, hidx);
    s->ready.moves = &s->heap_moves;
    s->deadlines.idx_off = offsetof(mg_sched_entry_t, dl_index_);
    s->deadlines.moves = &s->heap_moves;
    gate_setup(s, &s->nonrt, MG_GATE_KIND_COUNT, 0, 0);
    gate_setup(s, &s->memgate, MG_GATE_KIND_COUNT, 0, 0);
    mg_sched_mem_init(&s->mem, cfg->vram_bytes, cfg->safety_margin_ratio);
    sched_apply(s, cfg);
    return s;
}

int mg_sched_reconfigure(mg_sched_t *s, const mg_sched_config_t *cfg)
{
    if (!s || !config_valid(cfg)) return MG_SCHED_EINVAL;
    sched_apply(s, cfg);
    gate_sync(s, &s->nonrt);
    mem_refill(s);
    return 0;
}

/* Free a flow list, leaving its entries detached (they are the caller's). */
static void flows_free(mg_sched_flow_t *f)
{
    while (f) {
        mg_sched_flow_t *next = f->anext;
        for (mg_sched_entry_t *e = f->head; e;) {
            mg_sched_entry_t *en = e->next_;
            e->queued_ = 0;
            e->flow_ = NULL;
            e->prev_ = e->next_ = NULL;
            e->dl_index_ = NO_INDEX;
            e = en;
        }
        free(f);
        f = next;
    }
}

void mg_sched_free(mg_sched_t *s)
{
    if (!s) return;
    flows_free(s->root_flows);
    for (size_t i = 0; i < s->nbuckets; i++) {
        mg_sched_gate_t *g = s->buckets[i];
        while (g) {
            mg_sched_gate_t *next = g->hnext;
            flows_free(g->flows);
            free(g->parked.v);
            free(g->name);
            free(g);
            g = next;
        }
    }
    free(s->buckets);
    free(s->ready.v);
    free(s->deadlines.v);
    free(s->nonrt.parked.v);
    free(s->memgate.parked.v);
    free(s);
}
