/* wallet: a call's estimated cost, and its prepaid reservation from admission to its end
 * (tenancy/wallet.h holds the ledger itself).
 *
 * The reservation is a store write: the call waits for it without blocking the loop, as it
 * waits for a slot or the upstream. Its state lives in a small op of its own rather than in
 * the call, because the client may leave while the write is on the writer thread: the call
 * is then freed, and the op, finding itself orphaned when the write comes back, releases
 * what was reserved. Otherwise the call's end decides (wallet_finish): the actual cost when
 * the upstream reported usage; nothing (release) when the call failed before any output;
 * metering_failed (held) when there was output, no usage, and the tenant requires usage;
 * else the tokenizer's count (estimate_tokens), as for any request without upstream usage.
 *
 * The settlement is not waited for: the answer does not acknowledge it (the spend charge
 * does, call.c). A process killed before it committed leaves the hold `held`; the next start
 * marks it metering_failed (mg_wallet_recover), so the money stays held, never lost or
 * guessed, until an administrator releases it. */
#include "pipeline/call.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "tenancy/cost.h"
#include "tenancy/wallet.h"

typedef struct wallet_op_s {
    call_t *c;             /* NULL once the call is gone (orphaned) */
    mg_store_t *store;     /* borrowed: the pipeline's */
    int pending;           /* the reservation's write is on the writer thread */
    int granted;           /* the hold stands (until wallet_finish ends it) */
    int64_t prompt_tokens; /* the prompt as admission counted it: the charge without usage
                              (the request, and so its body, may be gone at the call's end) */
    char request_id[MG_REQUEST_ID_LEN + 1];
} wallet_op_t;

int64_t call_estimated_cost(call_t *c)
{
    const mg_config_t *cfg = c->gen->cfg;
    mg_cost_rate_t rate = mg_cost_model_ceiling(cfg, c->model);
    int64_t out = c->ep == MG_EP_EMBEDDINGS ? 0 : output_estimate(c);
    return mg_cost_micros(rate, prompt_estimate(c, 1), out);
}

/* The disk full: a reservation is not held in memory as other writes are (the balance it
 * checks must be the database's), so the request fails at once rather than wait. */
#define DISK_FULL_MSG                                                                              \
    "the gateway's disk is full: a prepaid reservation cannot be recorded; retry later"

static void end_logged(void *ud, int rc, int64_t rows)
{
    (void)ud;
    (void)rows;
    if (rc != 0)
        mg_log_msg(MG_LOG_ERROR, NULL,
                   "wallet: a hold's end was not stored; it stays held (check-ledger shows it)");
}

static void on_reserved(void *ud, int rc, int granted)
{
    wallet_op_t *op = ud;
    op->pending = 0;
    call_t *c = op->c;
    if (!c) { /* the call ended meanwhile: nothing ran, nothing is owed */
        if (rc == 0 && granted &&
            mg_wallet_release(op->store, op->request_id, mg_unix_ms(), end_logged, NULL) != 0)
            end_logged(NULL, -1, 0);
        free(op);
        return;
    }
    op->granted = rc == 0 && granted;
    if (rc == MG_STORE_EFULL) {
        call_fail(c, 503, "DISK_FULL", DISK_FULL_MSG, 5000);
    } else if (rc != 0) {
        call_fail(c, 503, "RESOURCE_EXHAUSTED", "the wallet could not be read; retry later", 1000);
    } else if (!granted) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the tenant's prepaid balance does not cover this request's estimated cost"
                 " (%lld micros); top up the wallet",
                 (long long)c->est_cost_micros);
        call_fail(c, 402, "INSUFFICIENT_BALANCE", msg, 0);
    } else {
        call_resume(c, STEP_ENQUEUE);
    }
}

mg_step_rc_t step_wallet(call_t *c)
{
    if (!c->gen->cfg->auth_enabled || !c->auth.held || !c->auth.prepaid) return MG_STEP_NEXT;
    if (!c->pl->store)
        return call_error(c, 503, "RESOURCE_EXHAUSTED", "prepaid billing needs the store", 0);
    wallet_op_t *op = calloc(1, sizeof(*op));
    if (!op) return call_error(c, 500, "INTERNAL_ERROR", "out of memory", 0);
    op->c = c;
    op->store = c->pl->store;
    op->pending = 1;
    op->prompt_tokens = prompt_estimate(c, 1);
    snprintf(op->request_id, sizeof(op->request_id), "%s", c->req->request_id);
    c->wallet = op;
    int rc = mg_wallet_reserve(op->store, c->auth.tenant_id, op->request_id, c->est_cost_micros,
                               mg_unix_ms(), on_reserved, op);
    if (rc != 0) {
        c->wallet = NULL;
        free(op);
        if (rc == MG_STORE_EFULL) return call_error(c, 503, "DISK_FULL", DISK_FULL_MSG, 5000);
        return call_error(c, 503, "RESOURCE_EXHAUSTED", "the wallet could not be read", 1000);
    }
    c->step = STEP_ENQUEUE;
    return MG_STEP_AGAIN;
}

/* What the call's end does to its hold; see the file comment. */
static void end_hold(call_t *c, wallet_op_t *op)
{
    uint64_t now = mg_unix_ms();
    int ok = c->outcome && strcmp(c->outcome, "ok") == 0;
    int rc;
    if (!c->have_usage && !ok && c->chunks == 0) {
        rc = mg_wallet_release(op->store, op->request_id, now, end_logged, NULL);
    } else if (!c->have_usage && c->auth.require_upstream_usage) {
        mg_log_msg(MG_LOG_WARN, op->request_id,
                   "wallet: metering_failed: the upstream reported no usage; the reservation"
                   " stays held until an administrator releases it");
        rc = mg_wallet_metering_failed(op->store, op->request_id, now, end_logged, NULL);
    } else {
        long long in = c->prompt_tokens, out = c->completion_tokens;
        if (!c->have_usage) { /* the tokenizer's count (admission's), the chunks streamed */
            in = op->prompt_tokens;
            out = c->chunks;
        }
        int64_t cost = mg_cost_micros(mg_cost_rate_of(c->provider), in, out);
        rc = mg_wallet_settle(op->store, op->request_id, cost, now, end_logged, NULL);
    }
    if (rc != 0) end_logged(NULL, -1, 0);
}

void wallet_finish(call_t *c)
{
    wallet_op_t *op = c->wallet;
    if (!op) return;
    c->wallet = NULL;
    op->c = NULL;
    if (op->pending) return; /* orphaned: on_reserved releases and frees it */
    if (op->granted) end_hold(c, op);
    free(op);
}
