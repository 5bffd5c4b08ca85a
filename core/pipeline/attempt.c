/* attempt: the steps that choose and call an upstream: route (the routing policy's plan
 * over the model's routes), reserve (the next plan entry whose provider's breakers and rate
 * limits let it through), encode (the adapter's request) and send (the transfer); and the
 * end of each attempt, which is what the provider's health, breakers and cooldown learn
 * from. A failure before the first byte reached the client goes back to reserve; the plan
 * exhausted, routing is asked again (or the request waits, or fails with what the last
 * failure says). */
#include "pipeline/call.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "route/persist.h"

/* The provider's answer status as the cooldown policy sees it; applies the
 * cooldown it asks for (persisted, counted, logged). */
static void apply_cooldown_policy(call_t *c, mg_provider_state_t *ps, uint64_t now)
{
    int status = c->up_status;
    mg_pool_changed(ps);
    int n = status == 429 ? mg_cooldown_note_429(&ps->cooldown, now) : ps->cooldown.consecutive_429;
    double secs = 0;
    char err[512];
    if (mg_gen_cooldown(c->gen, c->provider, status, c->error_headers, c->error_headers_len, n,
                        ps->cooldown.observing, &secs, err, sizeof(err)) != 0) {
        call_msg(c, MG_LOG_ERROR, "cooldown policy: %s", err);
        return;
    }
    if (secs <= 0) return;
    mg_cooldown_apply(&ps->cooldown, now, secs);
    ps->cooldowns_total++;
    c->pl->metrics->cooldown_events_total++;
    mg_persist_cooldown(c->pl->store, ps, n, secs, status, now);
    shared_cooldown_publish(c, ps, n, secs, status);
}

/* The pool's state of provider p (one of this call's generation): looked up at p's index,
 * one comparison rather than a search over every provider, per route and attempt. */
static mg_provider_state_t *provider_state(call_t *c, const mg_provider_conf_t *p)
{
    return mg_pool_get_at(c->pl->pool, (size_t)(p - c->gen->cfg->providers), p);
}

/* End of an attempt: the provider's counters, breaker, health and cooldown. */
void attempt_end(call_t *c, attempt_outcome_t outcome)
{
    mg_provider_state_t *ps = provider_state(c, c->provider);
    if (!ps) return;
    uint64_t now = uv_now(c->pl->loop);
    mg_pool_changed(ps); /* in_flight, health, cooldown, the TPM window */
    ps->in_flight--;
    if (outcome == ATTEMPT_CLIENT) {
        /* the probe slots a half-open breaker lent go back untried */
        mg_pool_breakers_release(ps, mg_pool_route_of(c->pl->pool, c->route), now);
        if (c->have_usage)
            mg_limiter_settle(&ps->limiter, &c->resv, c->prompt_tokens + c->completion_tokens);
        return;
    }
    int success = outcome == ATTEMPT_OK;
    mg_pool_record(ps, success);
    ps->status_counts[c->up_status / 100 <= 5 ? c->up_status / 100 : 0]++;
    mg_metrics_provider_answer(c->pl->metrics, c->provider->id, c->provider->pool, c->up_status,
                               (double)(now - c->attempt_start_ms) / 1000.0);
    /* a 4xx other than 429 is the client's doing: neither a breaker nor a health failure */
    int provider_fault = !success && (c->up_status == 0 || c->up_status == 429 ||
                                      c->up_status >= 500 || c->up_status < 400);
    /* a failed connection puts the provider's breaker on the way to open; a failed answer
       only this route's, so that the provider's other models keep serving */
    mg_route_state_t *rs = mg_pool_route_of(c->pl->pool, c->route);
    mg_breaker_state_t ps_was = ps->breaker.state,
                       rs_was = rs ? rs->breaker.state : MG_BREAKER_CLOSED;
    uint64_t ps_until = ps->breaker.open_until_ms, rs_until = rs ? rs->breaker.open_until_ms : 0;
    mg_pool_breakers_record(ps, rs, now,
                            !provider_fault  ? MG_ATTEMPT_OK
                            : c->unreachable ? MG_ATTEMPT_UNREACHABLE
                                             : MG_ATTEMPT_FAILED);
    /* an open breaker survives a restart: stored when it opens, deleted when it closes */
    mg_persist_breaker(c->pl->store, ps->id, "", &ps->breaker, ps_was, ps_until, now);
    shared_breaker_publish(c, ps->id, "", &ps->breaker, ps_was, ps_until, now);
    if (rs) {
        mg_persist_breaker(c->pl->store, rs->provider, rs->model, &rs->breaker, rs_was, rs_until,
                           now);
        shared_breaker_publish(c, rs->provider, rs->model, &rs->breaker, rs_was, rs_until, now);
    }
    /* only a stream has a first token; a whole answer's first byte measures the answer */
    int64_t ttft = c->stream && c->t_first ? (int64_t)ms_since(c->t_start, c->t_first) : -1;
    int64_t latency = (int64_t)(now - c->attempt_start_ms);
    if (mg_health_record(&ps->health, now, !provider_fault, latency, ttft))
        mg_persist_health(c->pl->store, ps);
    shared_sample_add(c, ps, !provider_fault, latency, ttft);
    if (c->up_status >= 400) apply_cooldown_policy(c, ps, now);
    else if (success) mg_cooldown_success(&ps->cooldown, now);
    /* the TPM window learns what the answer really cost */
    if (c->have_usage)
        mg_limiter_settle(&ps->limiter, &c->resv, c->prompt_tokens + c->completion_tokens);
}

const char *fail_reason_name(fail_kind_t k)
{
    static const char *const names[] = {
        [FAIL_NONE] = "none",
        [FAIL_CONNECT] = "connect",
        [FAIL_RATE_LIMITED] = "rate_limited",
        [FAIL_SERVER] = "http_5xx",
        [FAIL_AUTH] = "provider_auth",
        [FAIL_GARBAGE] = "invalid_answer",
        [FAIL_TIMEOUT] = "first_byte_timeout",
        [FAIL_TIMEOUT_TOTAL] = "total_timeout",
        [FAIL_ADAPTER] = "adapter",
        [FAIL_BROKEN] = "connection_broken",
        [FAIL_STALLED] = "stalled",
        [FAIL_ERROR_EVENT] = "error_event",
        [FAIL_REFUSED] = "refused",
    };
    return (size_t)k < sizeof(names) / sizeof(names[0]) ? names[k] : "error";
}

/* The request is the client's error, as an adapter said: 400 INVALID_REQUEST with the
 * adapter's reason and the field it named as `param`. */
static mg_step_rc_t call_refused(call_t *c, const char *msg, const char *param)
{
    free(c->error_passed[2]);
    c->error_passed[2] = param && *param ? strdup(param) : NULL;
    c->fail_degraded = NULL; /* not the end of a degradation chain: nothing to fall back to */
    return call_error(c, 400, "INVALID_REQUEST", msg ? msg : "no provider can take this request",
                      0);
}

/* Every candidate failed (or none was left): answer with what the last failure says (the
 * provider was reached unless the failure says otherwise). */
static mg_step_rc_t fail_exhausted(call_t *c)
{
    /* no route takes this request as it is: the client's to change, not to retry */
    if (c->last_fail == FAIL_REFUSED) return call_refused(c, c->refusal_message, c->refusal_param);
    /* the degradation chain ended: the caller's own fallback is next (Sidecar ADR 3.7) */
    if (c->last_fail != FAIL_TIMEOUT && c->last_fail != FAIL_TIMEOUT_TOTAL)
        c->fail_degraded = "openclaw_fallback";
    char msg[160];
    switch (c->last_fail) {
    case FAIL_RATE_LIMITED:
        return call_error(c, 503, "MODEL_UNAVAILABLE",
                          "every provider for this model is rate limited",
                          c->retry_after_ms > 0 ? c->retry_after_ms : 5000);
    case FAIL_TIMEOUT:
        return call_error(c, 408, "FIRST_TOKEN_TIMEOUT", "no provider answered in time", 0);
    case FAIL_TIMEOUT_TOTAL:
        return call_error(c, 408, "INFERENCE_TIMEOUT", "the answer did not complete in time", 0);
    case FAIL_NONE:
        return call_error(c, 503, "MODEL_UNAVAILABLE", "no provider is available for this model",
                          1000);
    case FAIL_AUTH:
        return call_error(c, 502, "MODEL_UNAVAILABLE",
                          "the provider rejected the gateway's credentials", 0);
    case FAIL_GARBAGE:
        return call_error(c, 502, "MODEL_UNAVAILABLE", "the provider sent an invalid response", 0);
    case FAIL_ADAPTER:
        return call_error(c, 502, "MODEL_UNAVAILABLE",
                          "no provider adapter could encode the request", 0);
    case FAIL_SERVER:
        snprintf(msg, sizeof(msg), "the provider failed: it answered HTTP %d", c->up_status);
        return call_error(c, 502, "MODEL_UNAVAILABLE", msg, 0);
    case FAIL_BROKEN:
        return call_error(c, 502, "MODEL_UNAVAILABLE",
                          "the connection to the provider broke before its answer was complete", 0);
    case FAIL_STALLED:
        return call_error(c, 502, "MODEL_UNAVAILABLE",
                          "the provider stopped sending before its answer was complete", 0);
    case FAIL_ERROR_EVENT:
        return call_error(c, 502, "MODEL_UNAVAILABLE", "the provider's stream began with an error",
                          0);
    case FAIL_CONNECT:
    default: return call_error(c, 502, "MODEL_UNAVAILABLE", "no provider could be reached", 0);
    }
}

/* ------------------------------------------------------------------------ */
/* Attempts                                                                  */
/* ------------------------------------------------------------------------ */

/* The gateway's own request headers, after the adapter's: the transfer's extra_head, one
 * preformatted block sent as it is (no list node per header; lines built here need no
 * check). */
#define BASE_HEAD_MAX 256
static const char *base_head(call_t *c, char *buf)
{
    static const char json[] = "Content-Type: application/json\r\nAccept: application/json\r\n"
                               "User-Agent: moongate/" MOONGATE_VERSION "\r\nX-Request-Id: ";
    static const char sse[] = "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                              "User-Agent: moongate/" MOONGATE_VERSION "\r\nX-Request-Id: ";
    _Static_assert(sizeof(sse) + MG_REQUEST_ID_LEN + 2 + 15 + MG_TRACEPARENT_LEN + 2 <=
                       BASE_HEAD_MAX,
                   "BASE_HEAD_MAX");
    const char *head = c->stream ? sse : json;
    size_t n = c->stream ? sizeof(sse) - 1 : sizeof(json) - 1;
    size_t id = strlen(c->req->request_id);
    memcpy(buf, head, n);
    memcpy(buf + n, c->req->request_id, id);
    memcpy(buf + n + id, "\r\n", 3);
    /* the attempt is a child span of the gateway's (W3C trace context, base/trace.h) */
    char tp[MG_TRACEPARENT_LEN + 1];
    if (mg_trace_child(&c->req->trace, tp, c->up_span) == 0) {
        char *p = buf + n + id + 2;
        memcpy(p, "traceparent: ", 13);
        memcpy(p + 13, tp, MG_TRACEPARENT_LEN);
        memcpy(p + 13 + MG_TRACEPARENT_LEN, "\r\n", 3);
    }
    return buf;
}

/* How long this attempt may take: the inference budget, cut to what is left of the
 * request's total deadline (at least 1 ms: an expired budget fails at once). */
static int attempt_budget_ms(const call_t *c, uint64_t now)
{
    long long left = (long long)c->total_deadline_ms - (long long)now;
    long long ms = c->inference_ms;
    if (left < ms) ms = left;
    return ms < 1 ? 1 : (int)ms;
}

/* Data leaving the machine is audited (edge PRD 3.7.3): which request, which application,
 * which cloud provider. */
static void audit_cloud(call_t *c)
{
    if (!mg_log_enabled(MG_LOG_INFO)) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "audit");
    mg_log_str(&l, "event", "cloud_egress");
    if (c->req) mg_http_log_ids(&l, c->req);
    mg_log_str(&l, "provider", c->provider->id);
    mg_log_str(&l, "application", c->app ? c->app->name : NULL);
    mg_log_str(&l, "degraded", c->degraded);
    mg_log_end(&l);
}

/* A down provider's trial request goes (one every health.retry_down_ms): said in the log. */
static void take_trial(call_t *c, mg_provider_state_t *ps, uint64_t now)
{
    mg_health_take_trial(&ps->health, now);
    ps->trials_total++;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "health_trial");
    if (c->req) mg_http_log_ids(&l, c->req);
    mg_log_str(&l, "provider", ps->id);
    mg_log_str(&l, "down_reason", ps->health.down_reason);
    mg_log_end(&l);
}

/* Reserve the provider's capacity for one attempt: the probe slots of the provider's and
 * the route's breakers, then RPM/TPM (at the emergency share when the plan says so).
 * 0 = reserved, -1 = a breaker refused, -2 = a rate limit refused (limited_until_ms
 * updated). */
static int reserve_provider(call_t *c, mg_provider_state_t *ps, mg_route_state_t *rs,
                            const mg_plan_entry_t *e)
{
    uint64_t now = uv_now(c->pl->loop);
    if (!c->panic && !mg_health_would_allow(&ps->health, now)) return -1; /* down, no trial due */
    if (!mg_pool_breakers_allow(ps, rs, now)) return -1;
    mg_pool_changed(ps); /* the rate windows, a trial taken */
    int rc = e->emergency ? mg_limiter_reserve_emergency(&ps->limiter, now, c->est_tokens, &c->resv)
                          : mg_limiter_reserve(&ps->limiter, now, c->est_tokens, &c->resv);
    if (rc == MG_LIMIT_OK) {
        if (!c->panic && ps->health.state == MG_HEALTH_DOWN) take_trial(c, ps, now);
        return 0;
    }
    mg_pool_breakers_release(ps, rs, now);
    uint64_t next = mg_limiter_next_ms(&ps->limiter, now, c->est_tokens);
    if (e->emergency) next = mg_rpm_next_ms(&ps->limiter.emergency, now);
    if (!c->limited || next < c->limited_until_ms) c->limited_until_ms = next;
    c->limited++;
    return -2;
}

/* Reserve what one plan entry needs. 0 = reserved, -1 = the entry cannot serve this request
 * (a breaker refused, or out of memory), -2 = a rate limit refused it for now. */
static int reserve_entry(call_t *c, const mg_plan_entry_t *e)
{
    const mg_candidate_t *cand = &c->cands[e->index];
    int pi = (int)(cand->provider - c->gen->cfg->providers);
    mg_provider_state_t *ps = provider_state(c, cand->provider);
    if (!ps) return -1;
    int translating = !c->gen->adapters[c->gen->provider_adapter[pi]].passthrough;
    if (translating && !call_tree(c)) return -1; /* out of memory */
    return reserve_provider(c, ps, mg_pool_route_of(c->pl->pool, cand->route), e);
}

/* The reservation of an entry that will not be sent after all. */
static void unreserve(call_t *c)
{
    mg_provider_state_t *ps = provider_state(c, c->provider);
    if (!ps) return;
    mg_limiter_cancel(&ps->limiter, &c->resv); /* (the release says it changed) */
    mg_pool_breakers_release(ps, mg_pool_route_of(c->pl->pool, c->route), uv_now(c->pl->loop));
}

static void on_wait_timer(uv_timer_t *t)
{
    call_resume(t->data, STEP_ROUTE);
}

/* Ask routing again after `ms` (bounded by the request's deadline). 0 = waiting. */
static int wait_then_replan(call_t *c, uint64_t ms)
{
    uint64_t now = uv_now(c->pl->loop);
    if (now + ms > c->deadline_ms) return -1;
    if (!c->wait_timer) {
        c->wait_timer = malloc(sizeof(*c->wait_timer));
        if (!c->wait_timer) return -1;
        uv_timer_init(c->pl->loop, c->wait_timer);
        c->wait_timer->data = c;
    }
    uv_timer_start(c->wait_timer, on_wait_timer, ms ? ms : 1, 0);
    return 0;
}

static int fill_candidates(call_t *c, uint64_t now);

/* Back to route, on candidates described already (their fill_candidates answer: limit). */
static mg_step_rc_t reroute(call_t *c, int limit)
{
    c->described = 1;
    c->route_limit = limit;
    c->step = STEP_ROUTE;
    return MG_STEP_NEXT;
}

/* Every entry of the plan was tried or refused. A plan cut at req.plan_limit is asked for
 * again when the limit is now higher: after a failed attempt (its route is now passed over),
 * or when entries were passed over that it did not count (an adapter that could not encode
 * the request, a provider that reached its rate limit during an attempt). Tried routes count
 * towards the limit, so it only grows, up to every candidate: this ends. */
static mg_step_rc_t plan_exhausted(call_t *c)
{
    int max = c->gen->cfg->max_retries;
    int limit = -1; /* -1: the candidates are not described afresh yet */
    if (c->plan_limit != 0 && c->attempts < max) {
        limit = fill_candidates(c, uv_now(c->pl->loop));
        if (limit == 0 || limit > c->plan_limit) return reroute(c, limit);
    }
    if (c->limited && c->attempts == 0) {
        /* every candidate is at its rate limit: wait for the earliest token */
        uint64_t now = uv_now(c->pl->loop);
        uint64_t wait = c->limited_until_ms > now ? c->limited_until_ms - now : 1;
        if (wait_then_replan(c, wait) == 0) {
            c->step = STEP_ROUTE;
            return MG_STEP_AGAIN;
        }
        c->fail_degraded = "openclaw_fallback";
        return call_error(c, 503, "MODEL_UNAVAILABLE",
                          "every provider for this model is at its rate limit", (int)wait);
    }
    /* a failed attempt may have changed the picture (a provider now cooling): ask again */
    if (c->attempts > 0 && c->attempts < max && c->route_calls <= max)
        return reroute(c, limit >= 0 ? limit : fill_candidates(c, uv_now(c->pl->loop)));
    return fail_exhausted(c);
}

void attempt_failed(call_t *c, fail_kind_t why)
{
    c->last_fail = why;
    c->ended_by = "upstream";
    call_resume(c, STEP_RESERVE);
}

/* The routing arrays for the model's routes, in one block (reused when the call's is big
 * enough), each entry's alignment kept by the order: 8-byte structs, then ints, then bytes.
 * Only `tried` needs zeros: the others are written before they are read. */
int alloc_routing(call_t *c)
{
    _Static_assert(sizeof(mg_candidate_t) % _Alignof(mg_plan_entry_t) == 0 &&
                       sizeof(mg_plan_entry_t) % _Alignof(int) == 0,
                   "routing block layout");
    size_t n = c->model->n_routes ? c->model->n_routes : 1;
    if (n > c->routing_cap) {
        free(c->routing_buf);
        c->routing_buf = malloc(n * (sizeof(*c->cands) + sizeof(*c->plan) + sizeof(int) + 1));
        c->routing_cap = c->routing_buf ? n : 0;
        if (!c->routing_buf) return -1;
    }
    char *p = c->routing_buf;
    c->cands = (mg_candidate_t *)(void *)p;
    p += n * sizeof(*c->cands);
    c->plan = (mg_plan_entry_t *)(void *)p;
    p += n * sizeof(*c->plan);
    c->cand_route = (int *)(void *)p;
    p += n * sizeof(int);
    c->tried = (unsigned char *)p;
    memset(c->tried, 0, n);
    return 0;
}

/* Whether try_next would pass over the candidate without an attempt: its route was tried
 * in this request already, or its provider's rate limit refuses this request now (the
 * candidate's limits are the limiter's, so this is what mg_limiter_reserve decides). */
static int passed_over(const call_t *c, const mg_candidate_t *cd, int route)
{
    if (c->tried[route]) return 1;
    if (cd->rpm_limit > 0 && cd->rpm_used >= cd->rpm_limit) return 1;
    int64_t tokens = c->est_tokens > 0 ? c->est_tokens : 0;
    return cd->tpm_limit > 0 && tokens > cd->tpm_limit - cd->tpm_used;
}

/* The panic rule (Envoy's): when fewer than routing.panic_threshold of the model's enabled
 * routes are healthy enough to route to (not down), health is not asked: a down route counts
 * as available (if its breakers let a request through), since a try may answer where a
 * refusal never does. The descriptions changed are this call's own (serial 0: compared by
 * their fields) and the plan is not kept. */
static void apply_panic(call_t *c, uint64_t now)
{
    double threshold = c->gen->cfg->routing.panic_threshold;
    int enabled = 0, down = 0;
    c->panic = 0;
    for (int i = 0; i < c->n_cands; i++) {
        const mg_provider_state_t *ps = provider_state(c, c->cands[i].provider);
        if (!ps || ps->disabled) continue;
        enabled++;
        down += ps->health.state == MG_HEALTH_DOWN;
    }
    if (!down || threshold <= 0 || (double)(enabled - down) >= threshold * enabled) return;
    c->panic = 1;
    c->pl->metrics->routing_panic_total++;
    for (int i = 0; i < c->n_cands; i++) {
        mg_candidate_t *cd = &c->cands[i];
        const mg_provider_state_t *ps = provider_state(c, cd->provider);
        if (!ps || ps->health.state != MG_HEALTH_DOWN) continue;
        cd->available =
            mg_pool_route_available_in_panic(ps, mg_pool_route_of(c->pl->pool, cd->route), now);
        cd->trial = 0;
        cd->serial = 0;
    }
}

/* The facts of every route of the model, for the routing policy (fresh, or kept from an
 * earlier request of the same millisecond: facts.h). A route's provider and its state are
 * found by index (the route's provider_hint), not by searching. Returns the plan entries
 * try_next needs before it asks route() again: one for the next attempt (should it fail,
 * route() decides the next one on what the failure changed: plan_exhausted), and one
 * more for each candidate it would pass over (0: as many as there are candidates). */
static int fill_candidates(call_t *c, uint64_t now)
{
    const mg_config_t *cfg = c->gen->cfg;
    int usable = c->attempts < cfg->max_retries ? 1 : 0;
    c->n_cands = 0;
    for (int i = 0; i < (int)c->model->n_routes; i++) {
        const mg_route_conf_t *r = &c->model->routes[i];
        /* memory was reserved for the smaller model: no other route may serve */
        if (c->mem_smaller && (!r->smaller || strcmp(r->model, c->mem_smaller->model) != 0))
            continue;
        /* switched to a larger window (context.c): a smaller route cannot hold the prompt */
        if (c->min_window &&
            (r->context_window ? r->context_window : c->model->context_window) < c->min_window)
            continue;
        const mg_provider_conf_t *p = mg_config_route_provider(cfg, r);
        mg_provider_state_t *ps = p ? provider_state(c, p) : NULL;
        if (!ps) continue;
        mg_route_state_t *rs = mg_pool_route_of(c->pl->pool, r);
        mg_candidate_t *cd = &c->cands[c->n_cands];
        c->cand_route[c->n_cands++] = i;
        mg_facts_describe(c->gen->keep, c->pl->pool, p, r, ps, rs, now, cd);
        usable += passed_over(c, cd, i);
    }
    apply_panic(c, now);
    return usable > 0 && usable < c->n_cands ? usable : 0;
}

/* The shortest time until a cooling candidate recovers, for Retry-After. */
static int shortest_cooldown_ms(call_t *c)
{
    long long best = 0;
    uint64_t now = uv_now(c->pl->loop);
    for (int i = 0; i < c->n_cands; i++) {
        const mg_candidate_t *cd = &c->cands[i];
        long long r = cd->cooldown_remaining_ms;
        mg_provider_state_t *ps = provider_state(c, cd->provider);
        mg_route_state_t *rs = mg_pool_route_of(c->pl->pool, cd->route);
        long long b = ps ? (long long)mg_pool_breakers_retry_ms(ps, rs, now) : 0;
        if (b > r) r = b;
        if (r > 0 && (best == 0 || r < best)) best = r;
    }
    return best > 0 ? (int)(best > 3600000 ? 3600000 : best) : 1000;
}

/* ------------------------------------------------------------------------ */
/* The steps                                                                 */
/* ------------------------------------------------------------------------ */

/* Ask routing.route() for a plan over the model's candidates. */
mg_step_rc_t step_route(call_t *c)
{
    c->routed = 1; /* from here on the call has a usage event (meter.c) */
    int limit = c->described ? c->route_limit : fill_candidates(c, uv_now(c->pl->loop));
    c->described = 0;
    char err[512];
    /* a prefix-served model's routes are the call's own: no plan is kept for them */
    mg_plan_t plan = {.entries = c->plan, .limit = limit, .fresh = c->panic};
    c->route_calls++;
    if (mg_gen_route(c->gen, &c->lua_info, &c->req_ref, c->route_calls, c->cands, c->n_cands, &plan,
                     err, sizeof(err)) != 0) {
        call_msg(c, MG_LOG_ERROR, "routing policy: %s", err);
        return call_error(c, 500, "INTERNAL_ERROR",
                          "the routing policy failed; see the gateway log", 0);
    }
    c->pl->metrics->routing_plans[plan.kept]++;
    c->plan_n = plan.n;
    c->plan_limit = plan.limit;
    c->plan_next = 0;
    c->limited = 0;
    if (plan.n > 0) {
        if (!c->t_dispatch) c->t_dispatch = uv_hrtime();
        return MG_STEP_NEXT; /* reserve */
    }
    if (plan.wait_ms > 0 && wait_then_replan(c, (uint64_t)plan.wait_ms) == 0) {
        c->step = STEP_ROUTE;
        return MG_STEP_AGAIN;
    }
    c->fail_degraded = "openclaw_fallback"; /* the chain is at its end: the caller's fallback now */
    if (c->attempts > 0 || c->last_fail == FAIL_REFUSED) return fail_exhausted(c);
    return call_error(c, 503, "MODEL_UNAVAILABLE", "no provider can serve this model now",
                      shortest_cooldown_ms(c));
}

/* The plan's next entry whose provider lets the request through (one attempt per route and
 * request: a re-plan must not hammer what just failed). */
mg_step_rc_t step_reserve(call_t *c)
{
    int max = c->gen->cfg->max_retries;
    while (c->plan_next < c->plan_n && c->attempts < max) {
        const mg_plan_entry_t *e = &c->plan[c->plan_next++];
        int route = c->cand_route[e->index];
        if (c->tried[route]) continue;
        int rc = reserve_entry(c, e);
        if (rc == 0) {
            c->entry_now = e;
            return MG_STEP_NEXT; /* encode */
        }
        if (rc == -1) c->tried[route] = 1;
    }
    if (c->attempts >= max) return fail_exhausted(c);
    return plan_exhausted(c);
}

void attempt_unreserve_entry(call_t *c)
{
    const mg_candidate_t *cand = &c->cands[c->entry_now->index];
    const mg_provider_conf_t *was_p = c->provider;
    const mg_route_conf_t *was_r = c->route;
    c->provider = cand->provider; /* what unreserve reads; step_encode sets them when sent */
    c->route = cand->route;
    unreserve(c);
    c->provider = was_p;
    c->route = was_r;
}

mg_step_rc_t attempt_shared_limited(call_t *c, uint64_t until_ms)
{
    attempt_unreserve_entry(c);
    if (!c->limited || until_ms < c->limited_until_ms) c->limited_until_ms = until_ms;
    c->limited++;
    c->step = STEP_RESERVE;
    return MG_STEP_NEXT;
}

/* An entry reserved but not sent after all: the next one. */
static mg_step_rc_t entry_dropped(call_t *c)
{
    unreserve(c);
    c->tried[c->cand_route[c->entry_now->index]] = 1;
    c->step = STEP_RESERVE;
    return MG_STEP_NEXT;
}

/* The client's headers on the adapter's allowlist (protocols.forward_headers), names in
 * lower case, a header sent twice joined with ", ". */
static void add_allowed_headers(call_t *c, cJSON *h)
{
    const mg_header_allow_t *a = mg_protocols_allow(&c->gen->cfg->protocols, c->provider->adapter);
    for (size_t i = 0; a && i < c->req->n_headers; i++) {
        const mg_http_header_t *hd = &c->req->headers[i];
        if (!mg_header_allowed(a, hd->name)) continue;
        char name[128];
        size_t n = 0;
        for (; hd->name[n] && n < sizeof(name) - 1; n++)
            name[n] = (char)tolower((unsigned char)hd->name[n]);
        name[n] = '\0';
        cJSON *had = cJSON_GetObjectItemCaseSensitive(h, name);
        if (cJSON_IsString(had)) {
            size_t len = strlen(had->valuestring) + strlen(hd->value) + 3;
            char *joined = malloc(len);
            if (!joined) continue;
            snprintf(joined, len, "%s, %s", had->valuestring, hd->value);
            cJSON_ReplaceItemInObjectCaseSensitive(h, name, cJSON_CreateString(joined));
            free(joined);
        } else {
            cJSON_AddStringToObject(h, name, hd->value);
        }
    }
}

/* req.entry for a translating adapter: the Messages client's own body and headers, so that
 * an adapter speaking Anthropic upstream sends them as they were (thinking signatures, cache
 * control, betas: nothing the canonical form lacks is lost). */
static void set_entry(call_t *c)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "wire", "anthropic");
    cJSON *body = c->entry_body ? cJSON_ParseWithLength(c->entry_body, c->entry_len) : NULL;
    cJSON_AddItemToObject(e, "body", body ? body : cJSON_CreateObject());
    add_allowed_headers(c, cJSON_AddObjectToObject(e, "headers"));
    mg_gen_req_set_entry(c->gen, req_table(c), e);
    cJSON_Delete(e);
}

/* req.entry for an adapter that speaks Responses natively: the wire only (it is a
 * passthrough adapter: the core sends the client's body itself), so that its encode picks
 * the upstream's /responses. */
static void set_responses_entry(call_t *c)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "wire", "responses");
    mg_gen_req_set_entry(c->gen, req_table(c), e);
    cJSON_Delete(e);
}

/* The adapter gave no request for the entry. A refusal of invalid input ends the call
 * (400, its reason and param: no other route is tried); "not for this route" goes on to the
 * next entry and is the answer when no route takes the request, unless an attempt failed
 * for another reason; any other error is the adapter's fault (502 when nothing serves). */
static mg_step_rc_t encode_failed(call_t *c, const char *err)
{
    const mg_lrefusal_t *r = &c->enc.refusal;
    mg_log_msg(r->kind == MG_LREFUSAL_NONE ? MG_LOG_WARN : MG_LOG_INFO, c->req->request_id,
               "adapter %s encode for provider %s: %s%s", c->provider->adapter, c->provider->id,
               r->kind == MG_LREFUSAL_NONE ? "" : "refused: ", err);
    if (r->kind == MG_LREFUSAL_INVALID) {
        unreserve(c);
        c->ended_by = NULL;
        return call_refused(c, err, r->param);
    }
    if (r->kind == MG_LREFUSAL_NOT_FOR_ROUTE) {
        free(c->refusal_message);
        c->refusal_message = strdup(err);
        free(c->refusal_param);
        c->refusal_param = r->param[0] ? strdup(r->param) : NULL;
        if (c->last_fail == FAIL_NONE || c->last_fail == FAIL_ADAPTER) c->last_fail = FAIL_REFUSED;
    } else if (c->last_fail != FAIL_REFUSED) {
        c->last_fail = FAIL_ADAPTER;
    }
    return entry_dropped(c);
}

/* The adapter's upstream request for the reserved entry: method, path, headers and body. */
mg_step_rc_t step_encode(call_t *c)
{
    const mg_candidate_t *cand = &c->cands[c->entry_now->index];
    const mg_route_conf_t *r = cand->route;
    int pi = (int)(cand->provider - c->gen->cfg->providers);
    c->provider = cand->provider;
    c->route = r;
    c->upstream_model = r->model;
    c->rename_model = c->client_model && strcmp(c->client_model, r->model) != 0;
    c->model_value_at = 0;
    c->degraded = c->entry_now->degraded;
    c->adapter = c->gen->provider_adapter[pi];
    c->passthrough = c->gen->adapters[c->adapter].passthrough;
    c->native =
        c->front_messages && !c->passthrough && c->gen->adapters[c->adapter].entry_anthropic;
    if (c->msgs_lossy && !c->gen->adapters[c->adapter].entry_anthropic) {
        /* the canonical form lacks part of this Messages request: not for this route */
        free(c->refusal_message);
        c->refusal_message = strdup(c->msgs_lossy);
        free(c->refusal_param);
        c->refusal_param = NULL;
        if (c->last_fail == FAIL_NONE || c->last_fail == FAIL_ADAPTER) c->last_fail = FAIL_REFUSED;
        return entry_dropped(c);
    }
    c->native_resp = c->responses && c->gen->adapters[c->adapter].entry_responses;
    const char *why, *param;
    if (c->responses && responses_route_refused(c, c->native_resp, &why, &param)) {
        /* the model's other kind of route may serve it */
        free(c->refusal_message);
        c->refusal_message = strdup(why);
        free(c->refusal_param);
        c->refusal_param = param && *param ? strdup(param) : NULL;
        if (c->last_fail == FAIL_NONE || c->last_fail == FAIL_ADAPTER) c->last_fail = FAIL_REFUSED;
        return entry_dropped(c);
    }
    if (c->native_resp && resp_native_begin(c) != 0) return entry_dropped(c);
    /* a Responses call's chat body exists only as the tree (responses_call.c) */
    int from_tree = !c->passthrough || (c->responses && !c->native_resp);
    if (from_tree) set_item(c->body, "model", cJSON_CreateString(r->model));
    if (!c->passthrough) mg_gen_req_set_body(c->gen, req_table(c), c->body);
    if (!c->passthrough && c->front_messages) set_entry(c);
    if (c->native_resp) set_responses_entry(c);
    if (c->responses && c->passthrough && c->stream && c->provider->no_stream_usage)
        cJSON_DeleteItemFromObjectCaseSensitive(c->body, "stream_options");
    char err[512];
    if (mg_gen_encode(c->gen, c->adapter, &c->lua_info, &c->req_ref, c->provider, r->model, &c->enc,
                      err, sizeof(err)) != 0)
        return encode_failed(c, err);
    c->ndjson = c->enc.ndjson;
    c->up_body.len = 0;
    int rc = c->enc.body      ? mg_json_print(c->enc.body, &c->up_body)
             : c->native_resp ? resp_native_body(c, r->model, &c->up_body)
             : !from_tree     ? passthrough_body(c, r->model, &c->up_body)
                              : mg_json_print(c->body, &c->up_body);
    if (rc != 0) {
        mg_buf_free(&c->up_body);
        mg_encoded_free(&c->enc);
        return entry_dropped(c);
    }
    return MG_STEP_NEXT; /* send */
}

/* Start the transfer of the encoded request; the answer comes through answer.c. */
mg_step_rc_t step_send(call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    const mg_plan_entry_t *e = c->entry_now;
    mg_provider_state_t *ps = provider_state(c, c->provider);
    size_t base_len = strlen(c->provider->base_url), path_len = strlen(c->enc.path);
    char url_buf[512];
    char *url = base_len + path_len < sizeof(url_buf) ? url_buf : malloc(base_len + path_len + 1);
    if (!url || !ps) {
        if (url != url_buf) free(url);
        mg_buf_free(&c->up_body);
        mg_encoded_free(&c->enc);
        return entry_dropped(c);
    }
    memcpy(url, c->provider->base_url, base_len);
    memcpy(url + base_len, c->enc.path, path_len + 1);
    uint64_t now = uv_now(c->pl->loop);
    char head[BASE_HEAD_MAX];
    mg_xfer_opts_t o = {
        .method = c->enc.method,
        .url = url,
        .headers = c->enc.headers,
        .extra_head = base_head(c, head),
        .body = c->up_body.data, /* moved into the transfer */
        .body_len = c->up_body.len,
        .connect_timeout_ms = cfg->timeouts.connect_ms,
        /* a whole answer's first byte is the answer: it is bounded by the inference and
           total deadlines, not by the first-token one, which is a stream's */
        .first_byte_timeout_ms = c->stream ? c->first_token_ms : 0,
        .idle_timeout_ms = cfg->timeouts.idle_ms,
        .total_timeout_ms = attempt_budget_ms(c, now),
    };
    c->enc.headers = NULL; /* moved into the transfer */
    c->up_body = (mg_buf_t){0};
    c->up_status = 0;
    c->unreachable = 0;
    c->resp.len = 0;
    c->t_first = 0;
    c->paused_by_client = 0;
    c->attempts++;
    c->attempt_start_ms = now;
    task_to(c, MG_TASK_RUNNING, "upstream_request_sent");
    if (!c->provider->local) audit_cloud(c);
    mg_pool_changed(ps);
    ps->in_flight++;
    ps->requests_total++;
    if (e->emergency) {
        ps->emergency_total++;
        c->pl->metrics->emergency_total++;
    }
    c->tried[c->cand_route[e->index]] = 1;
    int rc = mg_xfer_start(c->pl->upstream, &o, &mg_call_xfer_cbs, c, &c->xfer);
    if (url != url_buf) free(url);
    mg_encoded_free(&c->enc);
    if (rc != 0) {
        c->last_fail = FAIL_CONNECT;
        c->unreachable = 1;
        attempt_end(c, ATTEMPT_FAILED);
        c->step = STEP_RESERVE;
        return MG_STEP_NEXT;
    }
    c->step = STEP_STREAM; /* when the upstream's answer is complete (answer.c resumes it) */
    return MG_STEP_AGAIN;
}
