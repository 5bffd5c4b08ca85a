/* replay: a kept route() answer given again; see replay.h. */
#include "luavm/replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mg_replay_scratch_reserve(mg_replay_scratch_t *s, size_t n)
{
    if (n <= s->cap) return 0;
    size_t cap = n > 2 * s->cap ? n : 2 * s->cap;
    mg_order_item_t *items = realloc(s->items, 3 * cap * sizeof(*items));
    if (items) s->items = items;
    int *pos = realloc(s->pos, cap * sizeof(*pos));
    if (pos) s->pos = pos;
    unsigned char *seen = realloc(s->seen, cap);
    if (seen) s->seen = seen;
    if (!items || !pos || !seen) return -1;
    s->cap = cap;
    return 0;
}

void mg_replay_scratch_free(mg_replay_scratch_t *s)
{
    free(s->items);
    free(s->pos);
    free(s->seen);
    memset(s, 0, sizeof(*s));
}

int mg_replay_matches(mg_tentry_t *e, const mg_treq_t *rq, const mg_candidate_t *cands, int n)
{
    if (e->n != n) return 0;
    for (int i = 0; i < n; i++)
        if (e->routes[i] != cands[i].route) return 0;
    if (!mg_treq_key_matches(&e->req, rq)) return 0;
    for (int i = 0; i < n; i++) {
        const mg_candidate_t *c = &cands[i];
        if (c->serial && c->serial == e->serial[i]) continue;
        if (!mg_tstate_equal(&e->state[i], c)) return 0;
        const uint64_t *vals = &e->cand_vals[(size_t)i * CF_ALL];
        for (uint32_t m = e->cand_mask[i]; m; m &= m - 1) {
            int fid = __builtin_ctz(m);
            if (!mg_trace_value_equal(fid, mg_trace_cand_value(c, i + 1, fid), vals[fid])) return 0;
        }
        e->serial[i] = c->serial; /* (one description: its facts are these) */
    }
    return 1;
}

/* The position a reference stands for now, or -1. */
static int ref_pos(const mg_tentry_t *e, int n, mg_tref_t r)
{
    if (r.op < 0) return r.i >= 0 && r.i < n ? r.i : -1;
    if (r.op >= e->n_ops || e->ops[r.op].kind != MG_TOP_ORDER) return -1;
    const mg_top_t *o = &e->ops[r.op];
    return r.i >= 0 && (size_t)r.i < o->out_n ? o->out[r.i] : -1;
}

/* The values of one spec (weights: which = 0, keys: 1) into items[i].key (pos i + 1), asking
 * the function again where its memo no longer holds. Returns 1 when every value has one, 0
 * when some key is missing (the keys are then not used), -1 when the function raised. */
static int spec_values(mg_tentry_t *e, mg_top_t *o, int which, mg_trace_t *t, const mg_treq_t *rq,
                       const mg_candidate_t *cands, const long *slots, const int *pos,
                       mg_order_item_t *items)
{
    mg_spec_kind_t kind = which ? o->kkind : o->wkind;
    if (kind != MG_SPEC_FN) {
        const double *vals = which ? o->kvals : o->wvals;
        for (size_t i = 0; i < o->n; i++)
            items[i] = (mg_order_item_t){kind == MG_SPEC_NONE ? 1 : vals[i], (int)i + 1};
        return 1;
    }
    mg_tlast_t **lasts = which ? &o->klast : &o->wlast;
    if (!*lasts && (*lasts = malloc((o->n ? o->n : 1) * sizeof(**lasts))))
        for (size_t i = 0; i < o->n; i++) (*lasts)[i] = (mg_tlast_t){.memo = NULL, .pos = -1};
    int all = 1;
    const double none = which ? NAN : 0;
    for (size_t i = 0; i < o->n; i++) {
        int p = pos[i], has;
        double v;
        mg_tlast_t *last = *lasts ? &(*lasts)[i] : NULL;
        uint64_t serial = cands[p].serial;
        if (last && last->pos == p && serial && last->serial == serial) {
            has = last->has; /* the same description as last time: the same answer */
            v = last->value;
        } else {
            void *hint = last ? last->memo : NULL;
            if (mg_trace_answer(t, rq, which ? o->kfn : o->wfn, which ? o->kfn_id : o->wfn_id,
                                &cands[p], slots[p], p, &hint, &has, &v) != 0)
                return -1;
            if (last) *last = (mg_tlast_t){hint, p, has, v, serial};
        }
        all &= has;
        items[i] = (mg_order_item_t){has ? v : none, (int)i + 1};
    }
    return all;
}

/* One order step: its result positions into o->out. */
static int run_order(mg_tentry_t *e, mg_top_t *o, mg_trace_t *t, const mg_treq_t *rq,
                     const mg_candidate_t *cands, int n, const long *slots, mg_draw_t *draws,
                     mg_replay_scratch_t *s)
{
    size_t m = o->n;
    int *pos = s->pos;
    mg_order_item_t *items = s->items, *tmp = items + m, *keys = items + 2 * m;
    for (size_t i = 0; i < m; i++) {
        mg_tref_t r = o->refs[i];
        pos[i] = r.op < 0 && r.i >= 0 && r.i < n ? r.i : ref_pos(e, n, r); /* (mostly the first) */
        if (pos[i] < 0) return 0;
    }
    int keyed = 0;
    if (o->kkind != MG_SPEC_NONE) {
        keyed = spec_values(e, o, 1, t, rq, cands, slots, pos, o->weighted ? keys : items);
        if (keyed < 0) return -1;
    }
    size_t out_n = m;
    if (!o->weighted) {
        if (keyed) mg_order_sort(items, m, tmp);
        else
            for (size_t i = 0; i < m; i++) items[i] = (mg_order_item_t){0, (int)i + 1};
    } else {
        if (spec_values(e, o, 0, t, rq, cands, slots, pos, items) < 0) return -1;
        double u = o->u;
        uint64_t seed = o->seed;
        if (o->draw >= 0) mg_draw_for_order(&draws[o->draw], &u, &seed);
        if (o->limit >= 0 && (size_t)o->limit < m) {
            out_n = mg_order_weighted_first(items, m, (size_t)o->limit, u, seed,
                                            keyed ? keys : NULL, tmp);
        } else {
            mg_order_weighted(items, m, u, seed, tmp);
            if (keyed) mg_order_then_by(items, m, keys, tmp);
        }
    }
    for (size_t j = 0; j < out_n; j++) o->out[j] = pos[items[j].pos - 1];
    o->out_n = out_n;
    return 1;
}

/* The steps, in order. */
static int run_steps(mg_tentry_t *e, mg_trace_t *t, const mg_treq_t *rq,
                     const mg_candidate_t *cands, int n, const long *slots, mg_replay_scratch_t *s)
{
    mg_draw_t small[4],
        *draws = e->n_draws <= 4 ? small : malloc((size_t)e->n_draws * sizeof(*draws));
    if (!draws) return 0;
    int rc = 1;
    for (int k = 0; rc == 1 && k < e->n_ops; k++) {
        mg_top_t *o = &e->ops[k];
        if (o->kind == MG_TOP_DRAW) mg_draw_init(&draws[o->draw], rq->info->random);
        else if (o->kind == MG_TOP_CHANCE) rc = mg_draw_chance(&draws[o->draw], o->p) == o->result;
        else rc = run_order(e, o, t, rq, cands, n, slots, draws, s);
    }
    if (draws != small) free(draws);
    return rc;
}

static int guards_hold(const mg_tentry_t *e, const mg_candidate_t *cands, int n)
{
    for (int g = 0; g < e->n_guards; g++) {
        int p = ref_pos(e, n, e->guards[g].ref);
        if (p < 0 || !mg_trace_value_equal(e->guards[g].fid,
                                           mg_trace_cand_value(&cands[p], p + 1, e->guards[g].fid),
                                           e->guards[g].value))
            return 0;
    }
    for (int q = 0; q < e->n_eqs; q++) {
        int a = ref_pos(e, n, e->eqs[q].a), b = ref_pos(e, n, e->eqs[q].b);
        if (a < 0 || b < 0 || (a == b) != e->eqs[q].same) return 0;
    }
    return 1;
}

int mg_replay_run(mg_tentry_t *e, mg_trace_t *t, const mg_treq_t *rq, const mg_candidate_t *cands,
                  int n, const long *slots, mg_replay_scratch_t *s, mg_plan_t *plan)
{
    if ((size_t)n > s->cap && mg_replay_scratch_reserve(s, (size_t)n) != 0) return 0;
    if (e->n_ops > 0) {
        int rc = run_steps(e, t, rq, cands, n, slots, s);
        if (rc != 1) return rc;
    }
    if (!guards_hold(e, cands, n)) return 0;
    plan->n = 0;
    plan->wait_ms = e->wait_ms;
    if (e->n_items == 1) { /* (the usual plan of one entry: nothing to deduplicate) */
        int p = ref_pos(e, n, e->items[0].ref);
        if (p >= 0)
            plan->entries[plan->n++] =
                (mg_plan_entry_t){p, e->items[0].degraded, e->items[0].emergency};
    }
    if (e->n_items > 1) memset(s->seen, 0, (size_t)n);
    for (int k = 0; e->n_items > 1 && k < e->n_items && plan->n < n; k++) {
        int p = ref_pos(e, n, e->items[k].ref);
        if (p < 0 || s->seen[p]) continue;
        s->seen[p] = 1;
        plan->entries[plan->n++] =
            (mg_plan_entry_t){p, e->items[k].degraded, e->items[k].emergency};
    }
    if (plan->n > 0) plan->wait_ms = 0;
    return 1;
}
