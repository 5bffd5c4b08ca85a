/* quota: sliding-window RPM/TPM and concurrency leases across levels; see quota.h.
 *
 * A level keeps 60 one-second buckets and running sums over them. Moving to a later
 * second clears the buckets that fall out of the window (at most 60, usually one) and
 * subtracts them from the sums, so a check is a comparison against the sums.
 *
 * A reservation walks the levels in order: advance the window, check, take. When a
 * level refuses, the levels already taken are given back in reverse order; they are in
 * the same second (the window did not move in between), so giving back is the exact
 * inverse of taking. The refusal's wait is then computed, without changing anything, as
 * the longest wait over every level that would refuse now. */
#include "quota.h"

#include <string.h>

/* ---- one level --------------------------------------------------------------------------- */

void mg_quota_level_init(mg_quota_level_t *lv, const char *name, uint32_t rpm_limit,
                         uint64_t tpm_limit, uint32_t max_concurrency)
{
    memset(lv, 0, sizeof(*lv));
    lv->name = name;
    lv->rpm_limit = rpm_limit;
    lv->tpm_limit = tpm_limit;
    lv->max_concurrency = max_concurrency;
}

/* Move the window so it ends at second now_s; an earlier now_s changes nothing. */
static void advance(mg_quota_level_t *lv, uint64_t now_s)
{
    if (now_s <= lv->head_s) return;
    if (now_s - lv->head_s >= MG_QUOTA_WINDOW_S) {
        memset(lv->req, 0, sizeof(lv->req));
        memset(lv->tok, 0, sizeof(lv->tok));
        lv->win_requests = 0;
        lv->win_tokens = 0;
    } else {
        for (uint64_t s = lv->head_s + 1; s <= now_s; s++) {
            size_t b = s % MG_QUOTA_WINDOW_S;
            lv->win_requests -= lv->req[b];
            lv->win_tokens -= lv->tok[b];
            lv->req[b] = 0;
            lv->tok[b] = 0;
        }
    }
    lv->head_s = now_s;
}

static void tokens_add(mg_quota_level_t *lv, size_t b, uint64_t n)
{
    lv->tok[b] += n;
    lv->win_tokens += n;
}

/* Subtract up to n tokens from bucket b (never below zero). */
static void tokens_sub(mg_quota_level_t *lv, size_t b, uint64_t n)
{
    if (n > lv->tok[b]) n = lv->tok[b];
    lv->tok[b] -= n;
    lv->win_tokens -= n;
}

/* The first limit that would refuse one more request of est tokens, or MG_QUOTA_NONE. */
static mg_quota_limit_t level_check(const mg_quota_level_t *lv, uint64_t est)
{
    if (lv->rpm_limit && lv->win_requests >= lv->rpm_limit) return MG_QUOTA_RPM;
    if (lv->tpm_limit && lv->win_tokens + est > lv->tpm_limit) return MG_QUOTA_TPM;
    if (lv->max_concurrency && lv->in_flight >= lv->max_concurrency) return MG_QUOTA_CONCURRENCY;
    return MG_QUOTA_NONE;
}

static void level_take(mg_quota_level_t *lv, uint64_t est)
{
    size_t b = lv->head_s % MG_QUOTA_WINDOW_S;
    lv->req[b]++;
    lv->win_requests++;
    tokens_add(lv, b, est);
    lv->in_flight++;
}

/* Exact inverse of level_take() in the same second. */
static void level_untake(mg_quota_level_t *lv, uint64_t at_s, uint64_t est)
{
    size_t b = at_s % MG_QUOTA_WINDOW_S;
    lv->req[b]--;
    lv->win_requests--;
    tokens_sub(lv, b, est);
    lv->in_flight--;
}

/* Milliseconds from now_ms until at least `need` units of a bucket array (req or tok,
 * read through get) have left the window; 0 when they never will. */
static uint64_t wait_for(const mg_quota_level_t *lv, uint64_t now_ms, uint64_t need,
                         uint64_t (*get)(const mg_quota_level_t *, size_t))
{
    uint64_t gone = 0;
    for (uint64_t k = 0; k < MG_QUOTA_WINDOW_S; k++) {
        if (lv->head_s + k < MG_QUOTA_WINDOW_S - 1) continue;  /* before time 0 */
        uint64_t s = lv->head_s + k - (MG_QUOTA_WINDOW_S - 1); /* oldest first */
        gone += get(lv, s % MG_QUOTA_WINDOW_S);
        if (gone >= need) {
            uint64_t leaves_ms = (s + MG_QUOTA_WINDOW_S) * 1000;
            return leaves_ms > now_ms ? leaves_ms - now_ms : 1;
        }
    }
    return 0;
}

static uint64_t get_req(const mg_quota_level_t *lv, size_t b)
{
    return lv->req[b];
}

static uint64_t get_tok(const mg_quota_level_t *lv, size_t b)
{
    return lv->tok[b];
}

/* How long until this level would accept a request of est tokens as far as its windows
 * go (concurrency is not predictable and adds nothing). The window is current. */
static uint64_t level_wait(const mg_quota_level_t *lv, uint64_t now_ms, uint64_t est)
{
    uint64_t wait = 0, w;
    if (lv->rpm_limit && lv->win_requests >= lv->rpm_limit) {
        w = wait_for(lv, now_ms, (uint64_t)lv->win_requests + 1 - lv->rpm_limit, get_req);
        if (w > wait) wait = w;
    }
    if (lv->tpm_limit && lv->win_tokens + est > lv->tpm_limit) {
        w = wait_for(lv, now_ms, lv->win_tokens + est - lv->tpm_limit, get_tok);
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
    while (upto-- > 0)
        level_untake(res->levels[upto], res->at_s[upto], est);
}

int mg_quota_reserve(mg_quota_level_t **levels, size_t n, uint64_t now_ms, uint64_t est_tokens,
                     mg_quota_res_t *res)
{
    if (!res) return MG_QUOTA_EINVAL;
    memset(res, 0, sizeof(*res));
    res->refused_level = -1;
    if (!levels || n == 0 || n > MG_QUOTA_MAX_LEVELS) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!levels[i]) return MG_QUOTA_EINVAL;
        if (levels[i]->tpm_limit && est_tokens > levels[i]->tpm_limit)
            return refuse(res, i, MG_QUOTA_TPM, MG_QUOTA_TOO_LARGE);
    }
    uint64_t now_s = now_ms / 1000;
    for (size_t i = 0; i < n; i++) {
        mg_quota_level_t *lv = levels[i];
        advance(lv, now_s);
        mg_quota_limit_t lim = level_check(lv, est_tokens);
        if (lim != MG_QUOTA_NONE) {
            rollback(res, i, est_tokens);
            for (size_t j = 0; j < n; j++) {
                advance(levels[j], now_s);
                uint64_t w = level_wait(levels[j], now_ms, est_tokens);
                if (w > res->retry_after_ms) res->retry_after_ms = w;
            }
            return refuse(res, i, lim, MG_QUOTA_REFUSED);
        }
        level_take(lv, est_tokens);
        res->levels[i] = lv;
        res->at_s[i] = lv->head_s;
    }
    res->n = n;
    res->tokens = est_tokens;
    res->held = 1;
    return MG_QUOTA_OK;
}

/* Settle one level: correct in place while the reservation's second is in the window,
 * else count only the excess over the (already expired) estimate, in the latest second. */
static void settle_level(mg_quota_level_t *lv, uint64_t at_s, uint64_t est, uint64_t actual)
{
    if (lv->head_s - at_s < MG_QUOTA_WINDOW_S) {
        size_t b = at_s % MG_QUOTA_WINDOW_S;
        tokens_sub(lv, b, est);
        tokens_add(lv, b, actual);
    } else if (actual > est) {
        tokens_add(lv, lv->head_s % MG_QUOTA_WINDOW_S, actual - est);
    }
}

int mg_quota_settle(mg_quota_res_t *res, uint64_t actual_tokens)
{
    if (!res || !res->held || res->settled) return MG_QUOTA_EINVAL;
    for (size_t i = 0; i < res->n; i++)
        settle_level(res->levels[i], res->at_s[i], res->tokens, actual_tokens);
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
    advance(lv, now_ms / 1000);
    if (requests) *requests = lv->win_requests;
    if (tokens) *tokens = lv->win_tokens;
}

const char *mg_quota_limit_name(mg_quota_limit_t limit)
{
    switch (limit) {
    case MG_QUOTA_NONE:
        return "none";
    case MG_QUOTA_RPM:
        return "rpm";
    case MG_QUOTA_TPM:
        return "tpm";
    case MG_QUOTA_CONCURRENCY:
        return "concurrency";
    }
    return "none";
}
