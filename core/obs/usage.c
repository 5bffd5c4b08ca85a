/* usage: the event's row and the pruner; see usage.h. */
#include "obs/usage.h"

#include <inttypes.h>
#include <stdio.h>

#include "base/clock.h"
#include "base/log.h"
#include "obs/usage_rollup.h"

int mg_usage_bin(int64_t ms)
{
    int b = 0;
    while (ms > 0 && b < 24) {
        ms >>= 1;
        b++;
    }
    return b;
}

int64_t mg_usage_bin_upper_ms(int bin)
{
    return bin <= 0 ? 1 : (int64_t)1 << bin;
}

static const char *const INSERT_SQL =
    "INSERT OR IGNORE INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id,"
    " key_id, application, user_id, logical_model, actual_model, provider_id, pool, attempts,"
    " status, http_status, error_code, stream, input_tokens, output_tokens, cached_read_tokens,"
    " cache_write_tokens, reasoning_tokens, input_estimated, output_estimated, latency_ms,"
    " ttft_ms, queue_ms, cost_micros, price_version, degraded, cancelled, latency_bin, ttft_bin)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,"
    " ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33)";

/* The same event in the cluster's PostgreSQL (store/pg.h): ON CONFLICT DO NOTHING makes the
 * write idempotent across instances and across its retries after a reconnection. */
static const char *const PG_INSERT_SQL =
    "INSERT INTO usage_events(request_id, at_ms, endpoint, tenant_id, project_id,"
    " key_id, application, user_id, logical_model, actual_model, provider_id, pool, attempts,"
    " status, http_status, error_code, stream, input_tokens, output_tokens, cached_read_tokens,"
    " cache_write_tokens, reasoning_tokens, input_estimated, output_estimated, latency_ms,"
    " ttft_ms, queue_ms, cost_micros, price_version, degraded, cancelled, latency_bin, ttft_bin,"
    " node_id)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,"
    " $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34)"
    " ON CONFLICT (request_id) DO NOTHING";

#define INT(x) ((mg_store_val_t){MG_STORE_INT, (int64_t)(x), NULL, 0})
#define TEXT(x) ((mg_store_val_t){MG_STORE_TEXT, 0, (x), 0})
#define NUL ((mg_store_val_t){MG_STORE_NULL, 0, NULL, 0})
#define ID(x) ((x) > 0 ? INT(x) : NUL)

/* The INSERT's parameters, typed: no number goes through text on the loop or the writer. */
static void event_vals(const mg_usage_event_t *e, mg_store_val_t *v)
{
    v[0] = TEXT(e->request_id);
    v[1] = INT(e->at_ms);
    v[2] = TEXT(e->endpoint);
    v[3] = ID(e->tenant_id);
    v[4] = ID(e->project_id);
    v[5] = ID(e->key_id);
    v[6] = TEXT(e->application);
    v[7] = e->user && *e->user ? TEXT(e->user) : NUL;
    v[8] = TEXT(e->logical_model);
    v[9] = TEXT(e->actual_model);
    v[10] = TEXT(e->provider);
    v[11] = TEXT(e->pool);
    v[12] = INT(e->attempts);
    v[13] = TEXT(e->status);
    v[14] = e->http_status ? INT(e->http_status) : NUL;
    v[15] = TEXT(e->error_code);
    v[16] = INT(e->stream != 0);
    v[17] = INT(e->tokens.input);
    v[18] = INT(e->tokens.output);
    v[19] = INT(e->tokens.cached_read);
    v[20] = INT(e->tokens.cache_write);
    v[21] = INT(e->tokens.reasoning);
    v[22] = INT(e->input_estimated != 0);
    v[23] = INT(e->output_estimated != 0);
    v[24] = INT(e->latency_ms);
    v[25] = e->ttft_ms >= 0 ? INT(e->ttft_ms) : NUL;
    v[26] = INT(e->queue_ms);
    v[27] = INT(e->cost_micros);
    v[28] = TEXT(e->price_version);
    v[29] = TEXT(e->degraded);
    v[30] = INT(e->cancelled != 0);
    v[31] = INT(mg_usage_bin(e->latency_ms));
    v[32] = e->ttft_ms >= 0 ? INT(mg_usage_bin(e->ttft_ms)) : NUL;
}

/* The same values as text for PostgreSQL's client (store/pg.h), the bins included (PG's
 * migration 5 rolls them up as SQLite does), and the node id. */
static void pg_write(mg_store_t *st, const mg_usage_event_t *e, const mg_store_val_t *v)
{
    char num[MG_UP_NPARAMS][24];
    const char *p[MG_UP_NPARAMS + 1];
    for (int i = 0; i < MG_UP_NPARAMS; i++) {
        if (v[i].kind == MG_STORE_INT) {
            snprintf(num[i], sizeof(num[i]), "%" PRId64, v[i].i);
            p[i] = num[i];
        } else {
            p[i] = v[i].kind == MG_STORE_TEXT ? v[i].s : NULL;
        }
    }
    p[MG_UP_NPARAMS] = mg_store_node_id(st);
    if (mg_pg_exec(mg_store_pg(st), PG_INSERT_SQL, MG_UP_NPARAMS + 1, p, 1, NULL, NULL) != 0)
        mg_log_msg(MG_LOG_ERROR, e->request_id,
                   "usage: the event could not be queued for PostgreSQL (queue full; lost"
                   " there, kept in the local store)");
}

int mg_usage_write(mg_store_t *st, const mg_usage_event_t *e, mg_store_done_fn done, void *ud)
{
    mg_store_val_t v[MG_UP_NPARAMS];
    event_vals(e, v);
    int rc = mg_store_journal_write(st, INSERT_SQL, MG_UP_NPARAMS, v, &mg_usage_rollup, done, ud);
    if (rc != 0)
        mg_log_msg(MG_LOG_ERROR, e->request_id, "usage: the event could not be queued (lost)");
    /* durable there too: kept and retried while PostgreSQL is away */
    if (rc == 0 && mg_store_pg(st)) pg_write(st, e, v);
    return rc;
}

int mg_usage_journal_open(mg_store_t *st, size_t bytes)
{
    return mg_store_use_journal(st, INSERT_SQL, &mg_usage_rollup, bytes);
}

int mg_usage_journal_replay(mg_store_t *st)
{
    if (mg_store_use_agg(st, &mg_usage_rollup) != 0) return -1;
    return mg_usage_journal_open(st, 0);
}

/* The oldest ?2 events by seq (the rowid: no index to keep up per event, store.c's
 * migration 20), those of them older than the cut deleted. Events are written in the order
 * their calls end, so seq follows at_ms but for the writer's few milliseconds and a clock
 * step: an event kept by the window only stays a little past its retention, none goes early.
 * The newest event is never pruned: seq is a rowid, which SQLite takes as max(seq) + 1, so
 * keeping it keeps seq growing past the roll-ups' watermark (usage_rollup.h) */
const char *const MG_USAGE_PRUNE_SQL =
    "DELETE FROM usage_events WHERE seq IN (SELECT seq FROM (SELECT seq, at_ms FROM usage_events"
    " ORDER BY seq LIMIT ?2) WHERE at_ms < ?1 AND seq < (SELECT max(seq) FROM usage_events))";

void mg_usage_prune_params(const mg_usage_conf_t *u, int64_t now_ms, char cut[24], char batch[16])
{
    snprintf(cut, 24, "%" PRId64, now_ms - (int64_t)u->retention_days * 86400000);
    snprintf(batch, 16, "%d", u->prune_batch);
}

static void on_prune_tick(uv_timer_t *t)
{
    mg_usage_pruner_t *p = t->data;
    const mg_usage_conf_t *u = p->conf(p->conf_ud);
    char cut[24], batch[16];
    mg_usage_prune_params(u, (int64_t)mg_unix_ms(), cut, batch);
    const char *params[2] = {cut, batch};
    mg_store_write(p->store, MG_USAGE_PRUNE_SQL, 2, params); /* fire and forget */
    int64_t every = (int64_t)u->prune_interval_s * 1000;
    if (every != p->last_interval_ms) { /* a reload changed it */
        p->last_interval_ms = every;
        uv_timer_start(t, on_prune_tick, (uint64_t)every, (uint64_t)every);
    }
}

int mg_usage_pruner_start(mg_usage_pruner_t *p, uv_loop_t *loop, mg_store_t *st,
                          mg_usage_conf_fn conf, void *ud)
{
    p->store = st;
    p->conf = conf;
    p->conf_ud = ud;
    int rc = uv_timer_init(loop, &p->timer);
    if (rc != 0) return rc;
    p->timer.data = p;
    uv_unref((uv_handle_t *)&p->timer);
    p->last_interval_ms = (int64_t)conf(ud)->prune_interval_s * 1000;
    return uv_timer_start(&p->timer, on_prune_tick, (uint64_t)p->last_interval_ms,
                          (uint64_t)p->last_interval_ms);
}

void mg_usage_pruner_stop(mg_usage_pruner_t *p)
{
    if (!p->store) return;
    uv_timer_stop(&p->timer);
    uv_close((uv_handle_t *)&p->timer, NULL);
    p->store = NULL;
}
