/* keep: the Lua boundary's cache, one rule for all it keeps; see keep.h.
 *
 * Config routes are numbered by slot: a model's routes are one array in the config, so a
 * route's slot is its model's first slot plus its offset in that array, found by address
 * (the model of the last lookup first: one request's candidates are one model's routes). */
#include "luavm/keep.h"

#include <lua.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* kept plans of one model: its usual request, the exploring one, a pinned one, ...; the least
 * recently used one goes */
#define PLANS_PER_MODEL 4

typedef struct span_s {
    const mg_route_conf_t *routes; /* the model's routes array */
    size_t n;
    size_t first_slot;
    mg_tentry_t *plans[PLANS_PER_MODEL]; /* owned; most recently used first */
} span_t;

typedef struct facts_s {
    mg_candidate_t c;
    uint64_t stamp[MG_KEEP_STAMP];
    int valid;
} facts_t;

typedef struct answer_s {
    const mg_provider_conf_t *p; /* in the generation's config */
    char *model;                 /* owned */
    mg_treq_key_t req;           /* the request fields encode read */
    char method[8];
    char *path;     /* owned */
    char **headers; /* owned: the "Name: value" lines */
    size_t n_headers;
    int ndjson;
} answer_t;

/* Answers are found by provider through an open-addressing index, not by walking them. */
/* a power of two, twice MG_KEEP_ENCODE_MAX: a probe meets an empty one */
#define ANSWER_SLOTS 128

typedef struct answers_s {
    answer_t e[MG_KEEP_ENCODE_MAX];
    size_t n;
    unsigned char slot[ANSWER_SLOTS]; /* 1 + an index into e; 0 = empty */
} answers_t;

struct mg_keep_s {
    span_t *spans; /* owned, one per model */
    size_t n_spans, last_span;
    size_t n_slots;
    facts_t *facts;                   /* owned, per slot */
    const mg_route_conf_t **route_of; /* owned, per slot: its route */
    span_t **span_at;                 /* owned, per slot: its model's span */
    uint64_t described, kept;
    uint64_t serials;    /* the last serial given */
    answers_t **answers; /* owned, per adapter, made on first use */
    size_t n_adapters;
    long *slots; /* owned scratch (mg_keep_slots_scratch) */
    int slots_cap;
    unsigned *seen; /* owned, per slot: the mg_keep_slots_of call that saw it last */
    unsigned calls;
    mg_replay_scratch_t scratch;
};

mg_keep_t *mg_keep_new(const mg_config_t *cfg, size_t n_adapters)
{
    mg_keep_t *k = calloc(1, sizeof(*k));
    if (!k) return NULL;
    size_t total = 0;
    for (size_t m = 0; m < cfg->n_models; m++) total += cfg->models[m].n_routes;
    k->spans = calloc(cfg->n_models ? cfg->n_models : 1, sizeof(*k->spans));
    k->facts = calloc(total ? total : 1, sizeof(*k->facts));
    k->seen = calloc(total ? total : 1, sizeof(*k->seen));
    k->route_of = calloc(total ? total : 1, sizeof(*k->route_of));
    k->span_at = calloc(total ? total : 1, sizeof(*k->span_at));
    k->answers = calloc(n_adapters ? n_adapters : 1, sizeof(*k->answers));
    if (!k->spans || !k->facts || !k->seen || !k->route_of || !k->span_at || !k->answers) {
        mg_keep_free(k, NULL);
        return NULL;
    }
    for (size_t m = 0, first = 0; m < cfg->n_models; m++) {
        k->spans[m] = (span_t){
            .routes = cfg->models[m].routes, .n = cfg->models[m].n_routes, .first_slot = first};
        for (size_t i = 0; i < cfg->models[m].n_routes; i++) {
            k->route_of[first + i] = &cfg->models[m].routes[i];
            k->span_at[first + i] = &k->spans[m];
        }
        first += cfg->models[m].n_routes;
    }
    k->n_spans = cfg->n_models;
    k->n_slots = total;
    k->n_adapters = n_adapters;
    return k;
}

static void answer_free(answer_t *a)
{
    free(a->model);
    free(a->path);
    for (size_t i = 0; i < a->n_headers; i++) free(a->headers[i]);
    free(a->headers);
    mg_treq_key_free(&a->req);
}

void mg_keep_free(mg_keep_t *k, lua_State *L)
{
    if (!k) return;
    for (size_t s = 0; k->spans && s < k->n_spans; s++)
        for (int i = 0; i < PLANS_PER_MODEL; i++) mg_tentry_free(k->spans[s].plans[i], L);
    for (size_t a = 0; k->answers && a < k->n_adapters; a++) {
        if (!k->answers[a]) continue;
        for (size_t i = 0; i < k->answers[a]->n; i++) answer_free(&k->answers[a]->e[i]);
        free(k->answers[a]);
    }
    free(k->answers);
    free(k->spans);
    free(k->facts);
    free(k->seen);
    free(k->route_of);
    free(k->span_at);
    free(k->slots);
    mg_replay_scratch_free(&k->scratch);
    free(k);
}

/* The span of route r, or NULL. */
static span_t *span_of(mg_keep_t *k, const mg_route_conf_t *r)
{
    for (size_t i = 0; i < k->n_spans; i++) {
        size_t si = (k->last_span + i) % k->n_spans;
        span_t *sp = &k->spans[si];
        uintptr_t off = (uintptr_t)r - (uintptr_t)sp->routes;
        if (sp->n > 0 && off < sp->n * sizeof(*r) && off % sizeof(*r) == 0) {
            k->last_span = si;
            return sp;
        }
    }
    return NULL;
}

long mg_keep_slot(mg_keep_t *k, const mg_route_conf_t *r)
{
    span_t *sp = k && r ? span_of(k, r) : NULL;
    return sp ? (long)(sp->first_slot + (size_t)(r - sp->routes)) : -1;
}

size_t mg_keep_slots(const mg_keep_t *k)
{
    return k->n_slots;
}

/* ---- route descriptions ---------------------------------------------------------------- */

int mg_keep_facts_get(mg_keep_t *k, long slot, const uint64_t stamp[MG_KEEP_STAMP],
                      mg_candidate_t *out)
{
    if (!k || slot < 0 || (size_t)slot >= k->n_slots) return 0;
    const facts_t *f = &k->facts[slot];
    if (!f->valid || memcmp(f->stamp, stamp, sizeof(f->stamp)) != 0) return 0;
    *out = f->c;
    k->kept++;
    return 1;
}

void mg_keep_facts_put(mg_keep_t *k, long slot, const uint64_t stamp[MG_KEEP_STAMP],
                       mg_candidate_t *c)
{
    if (!k) return;
    facts_t *f = slot >= 0 && (size_t)slot < k->n_slots ? &k->facts[slot] : NULL;
    k->described++;
    /* what did not change is the same description: its serial stays, and so does everything
       kept for it (plans' checks, step functions' answers) */
    if (f && f->valid && memcmp(&f->c, c, offsetof(mg_candidate_t, serial)) == 0)
        c->serial = f->c.serial;
    else c->serial = ++k->serials;
    if (!f) return;
    f->c = *c;
    memcpy(f->stamp, stamp, sizeof(f->stamp));
    f->valid = 1;
}

void mg_keep_facts_counts(const mg_keep_t *k, uint64_t *described, uint64_t *kept)
{
    *described = k->described;
    *kept = k->kept;
}

/* ---- routing plans --------------------------------------------------------------------- */

long *mg_keep_slots_scratch(mg_keep_t *k, int n)
{
    if (n > k->slots_cap) {
        long *s = realloc(k->slots, (size_t)n * sizeof(*s));
        if (!s) return NULL;
        k->slots = s;
        k->slots_cap = n;
    }
    return k->slots ? k->slots : (k->slots = malloc(sizeof(*k->slots)));
}

int mg_keep_slots_of(mg_keep_t *k, const mg_candidate_t *cands, int n, long *slots)
{
    int keepable = n > 0;
    const span_t *first = NULL;
    if (++k->calls == 0) { /* (wrapped: no stamp may look recent) */
        memset(k->seen, 0, k->n_slots * sizeof(*k->seen));
        k->calls = 1;
    }
    for (int i = 0; i < n; i++) {
        long known = cands[i].keep_slot - 1; /* (facts.c found it already) */
        span_t *sp = NULL;
        if (known >= 0 && (size_t)known < k->n_slots && k->route_of[known] == cands[i].route) {
            slots[i] = known;
            sp = k->span_at[known];
        } else {
            sp = span_of(k, cands[i].route);
            slots[i] = sp ? (long)(sp->first_slot + (size_t)(cands[i].route - sp->routes)) : -1;
        }
        if (slots[i] >= 0 && k->seen[slots[i]] == k->calls)
            slots[i] = -1; /* given twice: the
                              second has none */
        if (slots[i] >= 0) k->seen[slots[i]] = k->calls;
        if (slots[i] < 0 || (first && sp != first)) keepable = 0;
        if (!first) first = sp;
    }
    return keepable;
}

static span_t *span_of_slot(mg_keep_t *k, long slot)
{
    return slot >= 0 && (size_t)slot < k->n_slots ? k->span_at[slot] : NULL;
}

int mg_keep_plan_find(mg_keep_t *k, mg_trace_t *t, const mg_treq_t *rq, const mg_candidate_t *cands,
                      int n, const long *slots, mg_plan_t *plan)
{
    span_t *sp = n > 0 && slots[0] >= 0 ? span_of_slot(k, slots[0]) : NULL;
    if (!sp) return 0;
    for (int i = 0; i < PLANS_PER_MODEL && sp->plans[i]; i++) {
        mg_tentry_t *e = sp->plans[i];
        if (!mg_replay_matches(e, rq, cands, n)) continue;
        if (mg_replay_run(e, t, rq, cands, n, slots, &k->scratch, plan) != 1) continue;
        if (i > 0) { /* most recently used first */
            memmove(&sp->plans[1], &sp->plans[0], (size_t)i * sizeof(sp->plans[0]));
            sp->plans[0] = e;
        }
        return 1;
    }
    return 0;
}

void mg_keep_plan_put(mg_keep_t *k, lua_State *L, const long *slots, int n, mg_tentry_t *e)
{
    span_t *sp = n > 0 && slots[0] >= 0 ? span_of_slot(k, slots[0]) : NULL;
    if (!sp) {
        mg_tentry_free(e, L);
        return;
    }
    mg_tentry_free(sp->plans[PLANS_PER_MODEL - 1], L);
    memmove(&sp->plans[1], &sp->plans[0], (PLANS_PER_MODEL - 1) * sizeof(sp->plans[0]));
    sp->plans[0] = e;
}

/* ---- encode answers -------------------------------------------------------------------- */

static size_t answer_slot(const mg_provider_conf_t *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15u;
    return (size_t)(h >> 57) & (ANSWER_SLOTS - 1);
}

int mg_keep_encode_find(mg_keep_t *k, int adapter, const mg_provider_conf_t *p, const char *model,
                        const mg_treq_t *rq, mg_encoded_t *out, char *err, size_t errlen)
{
    const answers_t *as =
        adapter >= 0 && (size_t)adapter < k->n_adapters ? k->answers[adapter] : NULL;
    if (!as) return 0;
    for (size_t h = answer_slot(p); as->slot[h]; h = (h + 1) & (ANSWER_SLOTS - 1)) {
        const answer_t *a = &as->e[as->slot[h] - 1];
        if (a->p != p || strcmp(a->model, model) != 0 || !mg_treq_key_matches(&a->req, rq))
            continue;
        memset(out, 0, sizeof(*out));
        memcpy(out->method, a->method, sizeof(out->method));
        out->ndjson = a->ndjson;
        out->path = strdup(a->path);
        int ok = out->path != NULL;
        for (size_t i = 0; ok && i < a->n_headers; i++) {
            struct curl_slist *nl = curl_slist_append(out->headers, a->headers[i]);
            ok = nl != NULL;
            if (ok) out->headers = nl;
        }
        if (ok) return 1;
        free(out->path);
        curl_slist_free_all(out->headers);
        memset(out, 0, sizeof(*out));
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

void mg_keep_encode_put(mg_keep_t *k, int adapter, const mg_provider_conf_t *p, const char *model,
                        uint32_t req_mask, const mg_treq_t *rq, const mg_encoded_t *enc)
{
    if (adapter < 0 || (size_t)adapter >= k->n_adapters || enc->body) return;
    answers_t **as = &k->answers[adapter];
    if (!*as && !(*as = calloc(1, sizeof(**as)))) return;
    if ((*as)->n >= MG_KEEP_ENCODE_MAX) return;
    answer_t *a = &(*as)->e[(*as)->n];
    memset(a, 0, sizeof(*a));
    a->p = p;
    a->ndjson = enc->ndjson;
    memcpy(a->method, enc->method, sizeof(a->method));
    a->model = strdup(model);
    a->path = strdup(enc->path);
    size_t n = 0;
    for (const struct curl_slist *h = enc->headers; h; h = h->next) n++;
    a->headers = n ? calloc(n, sizeof(*a->headers)) : NULL;
    int ok =
        a->model && a->path && (!n || a->headers) && mg_treq_key_set(&a->req, req_mask, rq) == 0;
    for (const struct curl_slist *h = enc->headers; ok && h; h = h->next)
        ok = (a->headers[a->n_headers++] = strdup(h->data)) != NULL;
    if (!ok) {
        answer_free(a);
        return;
    }
    size_t h = answer_slot(p);
    while ((*as)->slot[h]) h = (h + 1) & (ANSWER_SLOTS - 1);
    (*as)->slot[h] = (unsigned char)(++(*as)->n);
}
