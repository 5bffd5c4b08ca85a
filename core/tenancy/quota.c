/* quota: sliding-window RPM/TPM and concurrency leases across levels; see quota.h.
 *
 * A level with a window keeps 60 one-second buckets and running sums over them. Moving to
 * a later second clears the buckets that fall out of the window (at most 60, usually one)
 * and subtracts them from the sums, so a check is a comparison against the sums. A level
 * without a window (no rpm or tpm limit) counts only its leases.
 *
 * A reservation walks the levels in order: advance the window, check, take. When a
 * level refuses, the levels already taken are given back in reverse order; they are in
 * the same second (the window did not move in between), so giving back is the exact
 * inverse of taking. The refusal's wait is then computed, without changing anything, as
 * the longest wait over every level that would refuse now. */
#include "tenancy/quota.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- one level --------------------------------------------------------------------------- */

/* Only rpm and tpm count requests and tokens over time; concurrency is the in_flight
 * counter alone, so a level limited by nothing else needs no window. */
static int needs_window(uint32_t rpm_limit, uint64_t tpm_limit)
{
    return rpm_limit != 0 || tpm_limit != 0;
}

int mg_quota_level_init(mg_quota_level_t *lv, uint32_t rpm_limit, uint64_t tpm_limit,
                        uint32_t max_concurrency)
{
    memset(lv, 0, sizeof(*lv));
    return mg_quota_level_set_limits(lv, rpm_limit, tpm_limit, max_concurrency);
}

/* A new, empty window with a serial no other window of this process had or will have:
 * a reservation that counted in an earlier window must never take this one for it, even
 * at the same address. NULL when out of memory. */
static mg_quota_window_t *window_new(void)
{
    static _Atomic uint64_t last_serial; /* atomic: levels may live on several threads */
    mg_quota_window_t *w = calloc(1, sizeof(*w));
    if (w) w->serial = atomic_fetch_add_explicit(&last_serial, 1, memory_order_relaxed) + 1;
    return w;
}

int mg_quota_level_set_limits(mg_quota_level_t *lv, uint32_t rpm_limit, uint64_t tpm_limit,
                              uint32_t max_concurrency)
{
    if (!needs_window(rpm_limit, tpm_limit)) {
        mg_quota_level_free(lv);
    } else if (!lv->win && !(lv->win = window_new())) {
        return -1;
    }
    if (lv->win) {
        lv->win->rpm_limit = rpm_limit;
        lv->win->tpm_limit = tpm_limit;
    }
    lv->max_concurrency = max_concurrency;
    return 0;
}

void mg_quota_level_free(mg_quota_level_t *lv)
{
    if (!lv) return;
    free(lv->win);
    lv->win = NULL;
}

int mg_quota_level_has_window(const mg_quota_level_t *lv)
{
    return lv->win != NULL;
}

size_t mg_quota_level_heap_bytes(const mg_quota_level_t *lv)
{
    return lv->win ? sizeof(*lv->win) : 0;
}

/* Move the window so it ends at second now_s; an earlier now_s changes nothing. */
static void advance(mg_quota_window_t *w, uint64_t now_s)
{
    if (now_s <= w->head_s) return;
    if (now_s - w->head_s >= MG_QUOTA_WINDOW_S) {
        memset(w->req, 0, sizeof(w->req));
        memset(w->tok, 0, sizeof(w->tok));
        w->requests = 0;
        w->tokens = 0;
    } else {
        for (uint64_t s = w->head_s + 1; s <= now_s; s++) {
            size_t b = s % MG_QUOTA_WINDOW_S;
            w->requests -= w->req[b];
            w->tokens -= w->tok[b];
            w->req[b] = 0;
            w->tok[b] = 0;
        }
    }
    w->head_s = now_s;
}

static void level_advance(mg_quota_level_t *lv, uint64_t now_s)
{
    if (lv->win) advance(lv->win, now_s);
}

static void tokens_add(mg_quota_window_t *w, size_t b, uint64_t n)
{
    w->tok[b] += n;
    w->tokens += n;
}

/* Subtract up to n tokens from bucket b (never below zero). */
static void tokens_sub(mg_quota_window_t *w, size_t b, uint64_t n)
{
    if (n > w->tok[b]) n = w->tok[b];
    w->tok[b] -= n;
    w->tokens -= n;
}

/* The first limit that would refuse one more request of est tokens, or MG_QUOTA_NONE. */
static mg_quota_limit_t level_check(const mg_quota_level_t *lv, uint64_t est)
{
    const mg_quota_window_t *w = lv->win;
    if (w && w->rpm_limit && w->requests >= w->rpm_limit) return MG_QUOTA_RPM;
    if (w && w->tpm_limit && w->tokens + est > w->tpm_limit) return MG_QUOTA_TPM;
    if (lv->max_concurrency && lv->in_flight >= lv->max_concurrency) return MG_QUOTA_CONCURRENCY;
    return MG_QUOTA_NONE;
}

/* Count one request of est tokens (in the window, if any) and one lease. */
static void level_take(mg_quota_level_t *lv, uint64_t est)
{
    mg_quota_window_t *w = lv->win;
    if (w) {
        size_t b = w->head_s % MG_QUOTA_WINDOW_S;
        w->req[b]++;
        w->requests++;
        tokens_add(w, b, est);
    }
    lv->in_flight++;
}

/* Exact inverse of level_take() in the same second (and so the same window). */
static void level_untake(mg_quota_level_t *lv, uint64_t at_s, uint64_t est)
{
    mg_quota_window_t *w = lv->win;
    if (w) {
        size_t b = at_s % MG_QUOTA_WINDOW_S;
        w->req[b]--;
        w->requests--;
        tokens_sub(w, b, est);
    }
    lv->in_flight--;
}

/* Milliseconds from now_ms until at least `need` units of a bucket array (req or tok,
 * read through get) have left the window; 0 when they never will. */
static uint64_t wait_for(const mg_quota_window_t *w, uint64_t now_ms, uint64_t need,
                         uint64_t (*get)(const mg_quota_window_t *, size_t))
{
    uint64_t gone = 0;
    for (uint64_t k = 0; k < MG_QUOTA_WINDOW_S; k++) {
        if (w->head_s + k < MG_QUOTA_WINDOW_S - 1) continue;  /* before time 0 */
        uint64_t s = w->head_s + k - (MG_QUOTA_WINDOW_S - 1); /* oldest first */
        gone += get(w, s % MG_QUOTA_WINDOW_S);
        if (gone >= need) {
            uint64_t leaves_ms = (s + MG_QUOTA_WINDOW_S) * 1000;
            return leaves_ms > now_ms ? leaves_ms - now_ms : 1;
        }
    }
    return 0;
}

static uint64_t get_req(const mg_quota_window_t *w, size_t b)
{
    return w->req[b];
}

static uint64_t get_tok(const mg_quota_window_t *w, size_t b)
{
    return w->tok[b];
}

/* How long until this level would accept a request of est tokens as far as its window
 * goes (concurrency is not predictable and adds nothing). The window is current. */
static uint64_t level_wait(const mg_quota_level_t *lv, uint64_t now_ms, uint64_t est)
{
    const mg_quota_window_t *win = lv->win;
    uint64_t wait = 0, w;
    if (!win) return 0;
    if (win->rpm_limit && win->requests >= win->rpm_limit) {
        w = wait_for(win, now_ms, (uint64_t)win->requests + 1 - win->rpm_limit, get_req);
        if (w > wait) wait = w;
    }
    if (win->tpm_limit && win->tokens + est > win->tpm_limit) {
        w = wait_for(win, now_ms, win->tokens + est - win->tpm_limit, get_tok);
        if (w > wait) wait = w;
    }
    return wait;
}

/* ---- reservations ------------------------------------------------------------------------ */

static int refuse(mg_quota_res_t *res, size_t level, mg_quota_limit_t limit, int rc)
{
    res->refused_level = (int)level;
    res->refused_limit = limit;
    return rc;
}

/* Undo levels [0, upto) of a reservation in progress, last first. */
static void rollback(mg_quota_res_t *res, size_t upto, uint64_t est)
{
    while (upto-- > 0) level_untake(res->levels[upto], res->at_s[upto], est);
}

/* Reject what cannot be reserved at all: bad arguments (MG_QUOTA_EINVAL), an estimate
 * above a tpm limit (MG_QUOTA_TOO_LARGE). 0 when the reservation may proceed. */
static int check_levels(mg_quota_level_t **levels, size_t n, uint64_t est, mg_quota_res_t *res)
{
    if (!levels || n == 0 || n > MG_QUOTA_MAX_LEVELS) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!levels[i]) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        const mg_quota_window_t *w = levels[i]->win;
        if (w && w->tpm_limit && est > w->tpm_limit)
            return refuse(res, i, MG_QUOTA_TPM, MG_QUOTA_TOO_LARGE);
    }
    return MG_QUOTA_OK;
}

/* The wait after which every level that refuses now would accept (windows current). */
static uint64_t retry_after(mg_quota_level_t **levels, size_t n, uint64_t now_ms, uint64_t est)
{
    uint64_t wait = 0;
    for (size_t j = 0; j < n; j++) {
        uint64_t w = level_wait(levels[j], now_ms, est);
        if (w > wait) wait = w;
    }
    return wait;
}

int mg_quota_reserve(mg_quota_level_t **levels, size_t n, uint64_t now_ms, uint64_t est_tokens,
                     mg_quota_res_t *res)
{
    if (!res) return MG_QUOTA_EINVAL;
    memset(res, 0, sizeof(*res));
    res->refused_level = -1;
    int rc = check_levels(levels, n, est_tokens, res);
    if (rc != MG_QUOTA_OK) return rc;
    uint64_t now_s = now_ms / 1000;
    for (size_t i = 0; i < n; i++) level_advance(levels[i], now_s);
    for (size_t i = 0; i < n; i++) {
        mg_quota_level_t *lv = levels[i];
        mg_quota_limit_t lim = level_check(lv, est_tokens);
        if (lim != MG_QUOTA_NONE) {
            rollback(res, i, est_tokens);
            res->retry_after_ms = retry_after(levels, n, now_ms, est_tokens);
            return refuse(res, i, lim, MG_QUOTA_REFUSED);
        }
        level_take(lv, est_tokens);
        res->levels[i] = lv;
        res->at_s[i] = lv->win ? lv->win->head_s : now_s;
        res->win_serial[i] = lv->win ? lv->win->serial : 0;
    }
    res->n = n;
    res->tokens = est_tokens;
    res->held = 1;
    return MG_QUOTA_OK;
}

/* Settle one level: correct in place while the reservation's second is in the window,
 * else count only the excess over the (already expired) estimate, in the latest second.
 * Only in the window the reservation counted in: if that one was freed or replaced since
 * (its limits were lifted), its counts are gone and nothing is owed. */
static void settle_level(mg_quota_level_t *lv, uint64_t serial, uint64_t at_s, uint64_t est,
                         uint64_t actual)
{
    mg_quota_window_t *w = lv->win;
    if (!w || w->serial != serial) return; /* serial 0 (no window then) never matches */
    if (w->head_s - at_s < MG_QUOTA_WINDOW_S) {
        size_t b = at_s % MG_QUOTA_WINDOW_S;
        tokens_sub(w, b, est);
        tokens_add(w, b, actual);
    } else if (actual > est) {
        tokens_add(w, w->head_s % MG_QUOTA_WINDOW_S, actual - est);
    }
}

int mg_quota_settle(mg_quota_res_t *res, uint64_t actual_tokens)
{
    if (!res || !res->held || res->settled) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < res->n; i++)
        settle_level(res->levels[i], res->win_serial[i], res->at_s[i], res->tokens, actual_tokens);
    res->tokens = actual_tokens;
    res->settled = 1;
    return MG_QUOTA_OK;
}

int mg_quota_release(mg_quota_res_t *res)
{
    if (!res || !res->held || res->released) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < res->n; i++)
        if (res->levels[i]->in_flight > 0) res->levels[i]->in_flight--;
    res->released = 1;
    return MG_QUOTA_OK;
}

void mg_quota_level_usage(mg_quota_level_t *lv, uint64_t now_ms, uint32_t *requests,
                          uint64_t *tokens)
{
    level_advance(lv, now_ms / 1000);
    if (requests) *requests = lv->win ? lv->win->requests : 0;
    if (tokens) *tokens = lv->win ? lv->win->tokens : 0;
}

const char *mg_quota_limit_name(mg_quota_limit_t limit)
{
    switch (limit) {
    case MG_QUOTA_NONE: return "none";
    case MG_QUOTA_RPM: return "rpm";
    case MG_QUOTA_TPM: return "tpm";
    case MG_QUOTA_CONCURRENCY: return "concurrency";
    }
    return "none";
}
