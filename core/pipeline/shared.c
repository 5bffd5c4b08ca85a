/* shared: the limits several instances share through Redis (cluster/limits.h, issue 24).
 *
 * With cluster.redis configured, admission leaves the key's and project's quota to this step
 * (c->auth.quota_deferred), which runs once the plan's entry is reserved (its provider known):
 * one script reserves the key's and project's RPM, TPM and concurrency lease and the
 * provider's RPM and TPM together, all or nothing. The call waits for the answer as it waits
 * for the upstream: the step returns MG_STEP_AGAIN and the script's callback resumes it
 * (encode when reserved; the next plan entry when the provider refused; 429 when the key or
 * project refused). A later attempt (failover) reserves at the provider only: the key's were
 * taken once.
 *
 * The provider's own window is still counted locally too (routing reads it for headroom);
 * the shared one is the bound across instances.
 *
 * Redis unreachable, late (cluster.redis.timeout_ms) or erroring: cluster.redis.degraded
 * decides, never a wait: local (the key's and project's quota reserved by this instance as a
 * single node would, against its share: limit / cluster.redis.expected_instances), fail_closed (503
 * CLUSTER_UNAVAILABLE), fail_open (no key or project limits). A script that answers after its
 * deadline may have reserved: its leases expire and its admissions leave the windows within a
 * minute.
 *
 * Leases: a concurrency lease and a spend hold live cluster.redis.lease_ttl_ms (or the request's
 * total deadline + 2 s when that is sooner), and the instance renews those of its calls in
 * flight every third of that (mg_pipeline_leases_start): a killed instance's return within the
 * TTL, however long its requests were allowed to run.
 *
 * Reconciliation: what a degraded instance let through (local or fail_open) is kept and given
 * back when Redis answers again (mg_shared_note_local): the admissions still inside the
 * minute join the shared RPM and TPM windows, the costs charged join the spend periods, so a
 * returning Redis does not admit a whole limit again on top of the degraded minute.
 *
 * Spend: with its key's, project's or tenant's daily or monthly spend limit, the request's
 * estimated cost is held in the same script (first reservation only), all or nothing with the
 * rates, against the spend of every instance; the call's end takes the hold out and charges
 * the cost charge_spend charged (0 when none). Admission has checked the limits locally
 * already (this instance's figures): that check is what remains while Redis cannot answer.
 *
 * The op of a script in flight owns itself: when the call ends meanwhile (the client left)
 * it is orphaned and, if the answer is "reserved", undoes the reservation. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "cluster/samples.h"
#include "route/persist.h"

#define LEASE_SLACK_MS 2000

typedef struct shared_op_s {
    call_t *c; /* NULL once the call is gone (orphaned) */
    mg_shared_t *s;
    mg_shared_level_t lv[MG_SHARED_MAX_LEVELS];
    size_t n;
    size_t key_levels; /* lv[0..key_levels) are the key's and project's */
    char lease[MG_SHARED_LEASE_MAX];
    uint64_t tokens;
    uint64_t at_s;
    mg_shared_spend_t spend; /* the spend levels held (spend.n 0: none) */
} shared_op_t;

void shared_defer_quota(call_t *c)
{
    c->auth.quota_deferred = 1;
}

/* The key's and the project's levels that have a limit. */
static void add_key_levels(call_t *c, shared_op_t *op)
{
    for (size_t i = 0; i < c->auth.n_levels && op->n < MG_SHARED_MAX_LEVELS - 1; i++) {
        int64_t id;
        uint32_t rpm, conc;
        uint64_t tpm;
        if (mg_auth_level_limits(&c->auth, i, &id, &rpm, &tpm, &conc) != 0) continue;
        if (!rpm && !tpm && !conc) continue;
        mg_shared_level_t *l = &op->lv[op->n++];
        snprintf(l->name, sizeof(l->name), "%c:%lld", i == 0 ? 'k' : 'p', (long long)id);
        l->rpm = rpm;
        l->tpm = tpm;
        l->conc = conc;
    }
    op->key_levels = op->n;
}

/* The key's, project's and tenant's spend levels that have a limit, with the estimate. */
static void add_spend_levels(call_t *c, shared_op_t *op)
{
    static const char tag[3] = {'k', 'p', 't'};
    mg_shared_spend_t *sp = &op->spend;
    for (size_t i = 0; i < 3; i++) {
        const mg_auth_spend_view_t *v = &c->auth.spend[i];
        if (!v->id || (v->daily <= 0 && v->monthly <= 0)) continue;
        mg_shared_spend_level_t *l = &sp->lv[sp->n++];
        snprintf(l->name, sizeof(l->name), "%c:%lld", tag[i], (long long)v->id);
        l->daily = v->daily;
        l->monthly = v->monthly;
        l->local_day = v->spent_day;
        l->local_month = v->spent_month;
    }
    if (!sp->n) return;
    sp->micros = c->auth.spend_hold_micros > 0 ? c->auth.spend_hold_micros : 0;
    snprintf(sp->day, sizeof(sp->day), "%s", c->auth.spend_day);
    snprintf(sp->month, sizeof(sp->month), "%s", c->auth.spend_month);
}

/* A spend level refused across instances: 429 QUOTA_EXCEEDED until its period ends. */
static mg_step_rc_t spend_refused(call_t *c, shared_op_t *op, const mg_shared_answer_t *a)
{
    size_t j = (size_t)a->level - op->n;
    const char *nm = op->spend.lv[j].name;
    const char *who = nm[0] == 'k'   ? "the API key's"
                      : nm[0] == 'p' ? "the project's"
                                     : "the tenant's";
    int monthly = a->limit == 5;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "%s %s spend limit would be passed by this request's estimated cost (%lld micros;"
             " requests in flight on every instance hold %lld); lower max_tokens or retry later",
             who, monthly ? "monthly" : "daily", (long long)op->spend.micros,
             (long long)a->held_micros);
    uint64_t retry = mg_auth_until_period_end(mg_unix_ms(), monthly);
    attempt_unreserve_entry(c);
    call_error(c, 429, "QUOTA_EXCEEDED", msg, 0);
    c->error_retry_ms = (long long)retry; /* a month's wait passes INT_MAX ms */
    return MG_STEP_NEXT;
}

static void add_provider_level(call_t *c, shared_op_t *op)
{
    const mg_provider_conf_t *p = c->cands[c->entry_now->index].provider;
    if (!p || (p->rpm_limit <= 0 && p->tpm_limit <= 0)) return;
    mg_shared_level_t *l = &op->lv[op->n++];
    snprintf(l->name, sizeof(l->name), "v:%s", p->id);
    l->rpm = p->rpm_limit > 0 ? (uint32_t)p->rpm_limit : 0;
    l->tpm = p->tpm_limit > 0 ? (uint64_t)p->tpm_limit : 0;
    l->conc = 0;
}

/* The key's and the project's quota refused (by Redis, or locally when degraded): the
 * entry's local reservation back, the call's 429. */
static mg_step_rc_t key_refused(call_t *c, const char *msg, uint64_t retry_ms)
{
    attempt_unreserve_entry(c);
    call_error(c, 429, "RATE_LIMITED", msg, (int)(retry_ms > 0 ? retry_ms : 1000));
    c->error_retry_ms = (long long)(retry_ms > 0 ? retry_ms : 1000);
    return MG_STEP_NEXT;
}

/* What went on without Redis is kept to be given back when it answers (cluster/backlog.h). */
static void note_local(call_t *c, const shared_op_t *op)
{
    mg_shared_note_local(c->pl->shared, op->lv, op->n, op->tokens);
    if (op->spend.n) c->spend_local = 1;
}

/* Redis could not answer for op: the configured degraded mode. */
static mg_step_rc_t degraded(call_t *c, const shared_op_t *op)
{
    mg_cluster_degraded_t mode = c->gen->cfg->cluster.redis.degraded;
    mg_shared_note_degraded(c->pl->shared, (int)mode);
    if (mode == MG_DEGRADED_FAIL_CLOSED) {
        attempt_unreserve_entry(c);
        return call_error(c, 503, "CLUSTER_UNAVAILABLE",
                          "the limits shared across instances (Redis) cannot be reached and "
                          "cluster.redis.degraded is fail_closed; retry later",
                          1000);
    }
    if (op->key_levels && mode == MG_DEGRADED_FAIL_OPEN) {
        c->auth.quota_deferred = 0; /* admitted without the key's limits */
    } else if (op->key_levels) {
        int share = c->gen->cfg->cluster.redis.expected_instances;
        if (mg_auth_quota_local(&c->auth, mg_unix_ms(), c->est_tokens, share) != 0)
            return key_refused(c, c->auth.message, c->auth.retry_after_ms);
    }
    note_local(c, op);
    return MG_STEP_NEXT;
}

static const char *limit_name(int limit)
{
    return limit == 1 ? "rpm" : limit == 2 ? "tpm" : "concurrency";
}

static void on_answer(void *ud, const mg_shared_answer_t *a)
{
    shared_op_t *op = ud;
    call_t *c = op->c;
    if (!c) { /* the call ended meanwhile: nothing was sent */
        if (a->rc == MG_SHARED_OK) {
            op->spend.micros = 0; /* nothing ran: nothing charged */
            mg_shared_release(op->s, op->lv, op->n, op->lease, a->at_s, -(int64_t)op->tokens, 1,
                              op->spend.n ? &op->spend : NULL);
        }
        free(op);
        return;
    }
    c->shared_pending = NULL;
    c->step = STEP_ENCODE;
    mg_step_rc_t rc = MG_STEP_NEXT;
    if (a->rc == MG_SHARED_OK) {
        op->at_s = a->at_s;
        if (op->key_levels) c->auth.quota_deferred = 0; /* taken, here */
        if (op->spend.n) c->spend_shared = 1;
        if (!c->shared) c->shared = op;
        else free(op);
        op = NULL;
    } else if (a->rc == MG_SHARED_UNAVAILABLE) {
        rc = degraded(c, op);
    } else if (a->level >= 0 && (size_t)a->level >= op->n) {
        rc = spend_refused(c, op, a);
    } else if (a->level >= 0 && (size_t)a->level < op->key_levels) {
        char msg[192];
        const char *who = op->lv[a->level].name[0] == 'k' ? "key" : "project";
        if (a->rc == MG_SHARED_TOO_LARGE)
            snprintf(msg, sizeof(msg),
                     "the request's estimated tokens exceed the %s's tpm_limit; lower max_tokens",
                     who);
        else
            snprintf(msg, sizeof(msg), "the %s's %s limit is reached; retry later", who,
                     limit_name(a->limit));
        rc = key_refused(c, msg, a->retry_after_ms);
    } else { /* the provider's window, across instances: the plan's next entry */
        uint64_t wait = a->rc == MG_SHARED_TOO_LARGE ? MG_LIMIT_WINDOW_MS : a->retry_after_ms;
        rc = attempt_shared_limited(c, uv_now(c->pl->loop) + (wait ? wait : 1));
    }
    free(op);
    if (rc == MG_STEP_NEXT) mg_call_run(c);
}

/* How long a lease of c lives from now: the configured TTL, or less when the request's
 * deadline comes first. */
static uint64_t lease_ttl(const call_t *c, uint64_t now)
{
    uint64_t conf = (uint64_t)c->gen->cfg->cluster.redis.lease_ttl_ms;
    uint64_t left = (c->total_deadline_ms > now ? c->total_deadline_ms - now : 0) + LEASE_SLACK_MS;
    return left < conf ? left : conf;
}

mg_step_rc_t step_shared(call_t *c)
{
    mg_shared_t *s = c->pl->shared;
    if (!s) return MG_STEP_NEXT; /* a single node */
    shared_op_t *op = calloc(1, sizeof(*op));
    if (!op) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    op->c = c;
    op->s = s;
    int with_keys = c->auth.held && c->auth.quota_deferred;
    if (with_keys) add_key_levels(c, op);
    add_provider_level(c, op);
    if (c->auth.held && !c->spend_shared) add_spend_levels(c, op);
    if (op->n == 0 && op->spend.n == 0) { /* nothing limited: no round trip */
        free(op);
        if (with_keys) c->auth.quota_deferred = 0;
        return MG_STEP_NEXT;
    }
    snprintf(op->lease, sizeof(op->lease), "%s:%d", c->lua_request_id, c->shared_attempts++);
    op->tokens = c->est_tokens > 0 ? (uint64_t)c->est_tokens : 0;
    uint64_t ttl = lease_ttl(c, uv_now(c->pl->loop));
    if (!mg_redis_up(mg_shared_redis(s)) ||
        mg_shared_reserve(s, op->lv, op->n, op->lease, op->tokens, ttl,
                          op->spend.n ? &op->spend : NULL, on_answer, op) != 0) {
        mg_step_rc_t rc = degraded(c, op);
        free(op);
        return rc;
    }
    c->shared_pending = op;
    return MG_STEP_AGAIN; /* on_answer resumes it */
}

/* The cost of a call whose spend could not be held in Redis: kept to be given back. */
static void give_back_spend(call_t *c)
{
    shared_op_t op = {0};
    add_spend_levels(c, &op);
    op.spend.micros = c->charged_micros;
    mg_shared_note_local_spend(c->pl->shared, &op.spend);
}

void shared_finish(call_t *c)
{
    if (c->shared_pending) { /* on_answer undoes what it reserved */
        c->shared_pending->c = NULL;
        c->shared_pending = NULL;
        attempt_unreserve_entry(c); /* the entry reserved locally was never sent (a breaker's
                                       trial slot included) */
    }
    if (c->spend_local && !c->spend_shared && c->charged) give_back_spend(c);
    shared_op_t *op = c->shared;
    if (!op) return;
    c->shared = NULL;
    int undo = c->attempts == 0; /* never sent */
    int64_t delta = 0;
    if (undo) delta = -(int64_t)op->tokens;
    else if (c->have_usage)
        delta = (int64_t)(c->prompt_tokens + c->completion_tokens) - (int64_t)op->tokens;
    int leases = 0, windows = 0;
    for (size_t i = 0; i < op->n; i++) {
        leases |= op->lv[i].conc > 0;
        windows |= op->lv[i].tpm > 0 || (undo && op->lv[i].rpm > 0);
    }
    if (op->spend.n) op->spend.micros = c->charged ? c->charged_micros : 0;
    if (leases || (windows && (delta || undo)) || op->spend.n)
        mg_shared_release(op->s, op->lv, op->n, op->lease, op->at_s, delta, undo,
                          op->spend.n ? &op->spend : NULL);
    free(op);
}

/* ------------------------------------------------------------------------ */
/* Lease renewal                                                             */
/* ------------------------------------------------------------------------ */

static int holds_leases(const shared_op_t *op)
{
    for (size_t i = 0; i < op->n; i++)
        if (op->lv[i].conc > 0) return 1;
    return op->spend.n > 0 && op->spend.micros > 0;
}

static void on_lease_tick(uv_timer_t *t)
{
    mg_pipeline_t *pl = t->data;
    uint64_t period = (uint64_t)mg_gens_current(pl->gens)->cfg->cluster.redis.lease_ttl_ms / 3;
    mg_shared_t *s = pl->shared;
    if (s && mg_redis_up(mg_shared_redis(s))) {
        mg_shared_reconcile(s); /* what went on without Redis, when no request came since */
        uint64_t now = uv_now(pl->loop);
        for (call_t *c = pl->calls; c; c = c->next) {
            shared_op_t *op = c->shared;
            if (op && holds_leases(op))
                mg_shared_renew(s, op->lv, op->n, op->lease, lease_ttl(c, now),
                                op->spend.n ? &op->spend : NULL);
        }
    }
    uv_timer_start(t, on_lease_tick, period, 0);
}

void mg_pipeline_leases_start(mg_pipeline_t *pl)
{
    uv_timer_init(pl->loop, &pl->lease_timer);
    pl->lease_timer.data = pl;
    on_lease_tick(&pl->lease_timer);
}

void mg_pipeline_leases_stop(mg_pipeline_t *pl)
{
    uv_timer_stop(&pl->lease_timer);
    uv_close((uv_handle_t *)&pl->lease_timer, NULL);
}

/* ------------------------------------------------------------------------ */
/* Cooldowns shared over pub/sub                                             */
/* ------------------------------------------------------------------------ */

/* The message: node id, provider id, seconds, consecutive 429s, status, one a line. */
static void no_answer(void *ud, struct redisReply *reply)
{
    (void)ud, (void)reply;
}

void shared_cooldown_publish(call_t *c, const mg_provider_state_t *ps, int consecutive, double secs,
                             int status)
{
    mg_shared_t *s = c->pl->shared;
    if (!s) return;
    const mg_config_t *cfg = c->gen->cfg;
    char channel[160], msg[512];
    snprintf(channel, sizeof(channel), "%scooldown",
             cfg->cluster.redis.key_prefix ? cfg->cluster.redis.key_prefix : "moongate:");
    int n = snprintf(msg, sizeof(msg), "%s\n%s\n%.3f\n%d\n%d", cfg->cluster.node_id, ps->id, secs,
                     consecutive, status);
    if (n <= 0 || (size_t)n >= sizeof(msg)) return;
    const char *argv[3] = {"PUBLISH", channel, msg};
    size_t lens[3] = {7, strlen(channel), (size_t)n};
    mg_redis_command(mg_shared_redis(s), no_answer, NULL, 3, argv, lens); /* best effort */
}

/* The breaker message: "breaker", node id, provider id, model ("" the provider's own), "open"
 * or "closed", the open period's milliseconds left; one a line. */
void shared_breaker_publish(call_t *c, const char *provider, const char *model,
                            const mg_breaker_t *b, mg_breaker_state_t was, uint64_t was_until,
                            uint64_t now)
{
    mg_shared_t *s = c->pl->shared;
    if (!s) return;
    int opened =
        b->state == MG_BREAKER_OPEN && (was != MG_BREAKER_OPEN || b->open_until_ms != was_until);
    int closed = b->state == MG_BREAKER_CLOSED && was != MG_BREAKER_CLOSED;
    if (!opened && !closed) return;
    const mg_config_t *cfg = c->gen->cfg;
    char channel[160], msg[512];
    snprintf(channel, sizeof(channel), "%scooldown",
             cfg->cluster.redis.key_prefix ? cfg->cluster.redis.key_prefix : "moongate:");
    unsigned long long left = opened && b->open_until_ms > now ? b->open_until_ms - now : 0;
    int n = snprintf(msg, sizeof(msg), "breaker\n%s\n%s\n%s\n%s\n%llu", cfg->cluster.node_id,
                     provider, model, opened ? "open" : "closed", left);
    if (n <= 0 || (size_t)n >= sizeof(msg)) return;
    const char *argv[3] = {"PUBLISH", channel, msg};
    size_t lens[3] = {7, strlen(channel), (size_t)n};
    mg_redis_command(mg_shared_redis(s), no_answer, NULL, 3, argv, lens); /* best effort */
}

/* Another instance's breaker opened or closed: ours does the same, stored as our own. */
static void breaker_heard(mg_pipeline_t *pl, char **parts)
{
    mg_provider_state_t *ps = mg_pool_get(pl->pool, parts[2]);
    mg_route_state_t *rs = parts[3][0] ? mg_pool_route(pl->pool, parts[2], parts[3]) : NULL;
    if (!ps || (parts[3][0] && !rs)) return; /* not in our config */
    mg_breaker_t *b = rs ? &rs->breaker : &ps->breaker;
    uint64_t now = uv_now(pl->loop);
    mg_breaker_state_t was = b->state;
    uint64_t was_until = b->open_until_ms;
    int open = strcmp(parts[4], "open") == 0;
    uint64_t left = strtoull(parts[5], NULL, 10);
    if (open && left > 86400000ull) return;
    if (open && !(b->state == MG_BREAKER_OPEN && b->open_until_ms >= now + left)) {
        mg_breaker_restore_open(b, now, left);
        b->trips++;
    } else if (!open && b->state != MG_BREAKER_CLOSED) {
        mg_breaker_close(b);
    } else {
        return; /* ours says so already */
    }
    if (rs) rs->version++;
    mg_pool_changed(ps);
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "breaker heard");
    mg_log_str(&l, "provider", parts[2]);
    if (parts[3][0]) mg_log_str(&l, "model", parts[3]);
    mg_log_str(&l, "state", open ? "open" : "closed");
    mg_log_str(&l, "from_node", parts[1]);
    mg_log_end(&l);
    mg_persist_breaker(pl->store, parts[2], parts[3], b, was, was_until, now);
}

void mg_pipeline_cooldown_heard(void *pipeline, const char *payload, size_t len)
{
    mg_pipeline_t *pl = pipeline;
    char buf[512];
    if (len >= sizeof(buf)) return;
    memcpy(buf, payload, len);
    buf[len] = '\0';
    char *parts[6];
    int n = 0;
    for (char *p = buf, *nl; n < 6; p = nl + 1) {
        parts[n++] = p;
        if (!(nl = strchr(p, '\n'))) break;
        *nl = '\0';
    }
    const mg_config_t *cfg = mg_gens_current(pl->gens)->cfg;
    if (n == 6 && strcmp(parts[0], "breaker") == 0) {
        if (strcmp(parts[1], cfg->cluster.node_id) != 0) breaker_heard(pl, parts);
        return;
    }
    if (n != 5) return;
    if (strcmp(parts[0], cfg->cluster.node_id) == 0) return; /* our own */
    double secs = strtod(parts[2], NULL);
    mg_provider_state_t *ps = mg_pool_get(pl->pool, parts[1]);
    if (!ps || !(secs > 0) || secs > 86400) return;
    uint64_t now = uv_now(pl->loop);
    mg_pool_changed(ps);
    mg_cooldown_apply(&ps->cooldown, now, secs);
    ps->cooldowns_total++;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "cooldown heard");
    mg_log_str(&l, "provider", ps->id);
    mg_log_str(&l, "from_node", parts[0]);
    mg_log_double(&l, "cooldown_s", secs);
    mg_log_end(&l);
    mg_persist_cooldown(pl->store, ps, atoi(parts[3]), secs, atoi(parts[4]), now);
}

/* ------------------------------------------------------------------------ */
/* Health samples shared through a Redis stream (cluster/samples.h)          */
/* ------------------------------------------------------------------------ */

static int32_t ms32(int64_t v)
{
    return v < 0 ? -1 : v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

void shared_sample_add(call_t *c, const mg_provider_state_t *ps, int ok, int64_t latency_ms,
                       int64_t ttft_ms)
{
    if (!c->pl->samples) return;
    mg_csample_t s = {.provider = ps->id,
                      .model = c->upstream_model ? c->upstream_model : "",
                      .ok = ok,
                      .ttft_ms = ms32(ttft_ms),
                      .latency_ms = ms32(latency_ms),
                      .at_ms = mg_unix_ms()};
    mg_csamples_add(c->pl->samples, &s);
}

int mg_pipeline_sample_heard(void *pipeline, const mg_csample_t *s, uint64_t age_ms)
{
    mg_pipeline_t *pl = pipeline;
    mg_provider_state_t *ps = mg_pool_get(pl->pool, s->provider);
    if (!ps) return 0;
    uint64_t now = uv_now(pl->loop);
    mg_pool_changed(ps); /* the recent counters routing scores with */
    if (mg_health_record(&ps->health, mg_health_sample_at(&ps->health, now, age_ms), s->ok,
                         s->latency_ms, s->ttft_ms))
        mg_persist_health(pl->store, ps);
    return 1;
}
