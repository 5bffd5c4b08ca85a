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
    " ttft_ms, queue_ms, cost_micros, price_version, degraded, cancelled, node_id)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,"
    " $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32)"
    " ON CONFLICT (request_id) DO NOTHING";

#define N_NUM 22
int mg_usage_write(mg_store_t *st, const mg_usage_event_t *e, mg_store_done_fn done, void *ud)
{
    char num[N_NUM][24];
    int k = 0;
#define NUM(v) (snprintf(num[k], sizeof(num[k]), "%" PRId64, (int64_t)(v)), num[k++])
#define ID(v) ((v) > 0 ? NUM(v) : NULL)
    const char *p[33];
    p[0] = e->request_id;
    p[1] = NUM(e->at_ms);
    p[2] = e->endpoint;
    p[3] = ID(e->tenant_id);
    p[4] = ID(e->project_id);
    p[5] = ID(e->key_id);
    p[6] = e->application;
    p[7] = e->user && *e->user ? e->user : NULL;
    p[8] = e->logical_model;
    p[9] = e->actual_model;
    p[10] = e->provider;
    p[11] = e->pool;
    p[12] = NUM(e->attempts);
    p[13] = e->status;
    p[14] = e->http_status ? NUM(e->http_status) : NULL;
    p[15] = e->error_code;
    p[16] = NUM(e->stream != 0);
    p[17] = NUM(e->tokens.input);
    p[18] = NUM(e->tokens.output);
    p[19] = NUM(e->tokens.cached_read);
    p[20] = NUM(e->tokens.cache_write);
    p[21] = NUM(e->tokens.reasoning);
    p[22] = e->input_estimated ? "1" : "0";
    p[23] = e->output_estimated ? "1" : "0";
    p[24] = NUM(e->latency_ms);
    p[25] = e->ttft_ms >= 0 ? NUM(e->ttft_ms) : NULL;
    p[26] = NUM(e->queue_ms);
    p[27] = NUM(e->cost_micros);
    p[28] = e->price_version;
    p[29] = e->degraded;
    p[30] = e->cancelled ? "1" : "0";
    p[31] = NUM(mg_usage_bin(e->latency_ms));
    p[32] = e->ttft_ms >= 0 ? NUM(mg_usage_bin(e->ttft_ms)) : NULL;
#undef NUM
#undef ID
    int rc = mg_store_write_agg(st, INSERT_SQL, MG_UP_NPARAMS, p, &mg_usage_rollup, done, ud);
    if (rc != 0)
        mg_log_msg(MG_LOG_ERROR, e->request_id, "usage: the event could not be queued (lost)");
    mg_pg_t *pg = mg_store_pg(st);
    if (rc == 0 && pg) { /* durable: kept and retried while PostgreSQL is away */
        p[31] = mg_store_node_id(st);
        if (mg_pg_exec(pg, PG_INSERT_SQL, 32, p, 1, NULL, NULL) != 0)
            mg_log_msg(MG_LOG_ERROR, e->request_id,
                       "usage: the event could not be queued for PostgreSQL (queue full; lost"
                       " there, kept in the local store)");
    }
    return rc;
}

/* The newest event is never pruned: seq is a rowid, which SQLite takes as max(seq) + 1, so
 * keeping it keeps seq growing past the roll-ups' watermark (usage_rollup.h) */
const char *const MG_USAGE_PRUNE_SQL =
    "DELETE FROM usage_events WHERE seq IN (SELECT seq FROM usage_events WHERE at_ms < ?1"
    " AND seq < (SELECT max(seq) FROM usage_events) ORDER BY at_ms LIMIT ?2)";

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
