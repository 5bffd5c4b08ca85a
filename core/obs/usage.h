/* usage: the usage event of a request, written by the store's writer thread, and the
 * pruning of old events.
 *
 * One event per request that reached routing, whatever its endpoint and outcome, keyed by
 * its request id: the write is INSERT OR IGNORE, so a retried or replayed write never
 * doubles it. The store's migration 13 has the tables (19 the events' current shape); the
 * hourly and daily roll-ups are summed by the writer thread in C and written about once a
 * second (obs/usage_rollup.h); every chart and stats call reads those, never the raw
 * events. A request's transaction is its event row alone: one INSERT with typed bound
 * parameters (no number printed on the loop or parsed on the writer), the rowid and the
 * request id's UNIQUE index, nothing else (bench/README.md has what each costs).
 *
 * Durable (what a client may rely on): on the loop thread the event is appended to the usage
 * journal (store/journal.h, mg_usage_journal_open), a memory-mapped ring file that is in the
 * OS page cache as soon as it is written, and the answer goes on at once; the writer drains it
 * into usage_events every ~250 ms and a start replays what a kill left. Without the journal
 * (ring full, another thread) the pipeline holds the last bytes of an answer until the
 * transaction with its event committed (net/hold.h). Either way a client that received its
 * complete answer has its event: kill -9 loses none of them (a power loss may lose the
 * journal's last records even with storage.synchronous: full). A call without a client at its end
 * (the client left) or cancelled (its answer acknowledges the cancellation) writes its event
 * fire and forget: a kill -9 in the next group commit's few milliseconds may lose it. A
 * request answered without routing (refused, an idempotent replay) has no event. */
#ifndef MG_USAGE_H
#define MG_USAGE_H

#include <stdint.h>
#include <uv.h>

#include "conf/config.h"
#include "obs/price.h"
#include "store/store.h"

typedef struct mg_usage_event_s {
    const char *request_id;                /* required */
    int64_t at_ms;                         /* unix ms of the call's end */
    const char *endpoint;                  /* "chat", "completions", "embeddings", ... */
    int64_t tenant_id, project_id, key_id; /* 0: none (auth off, no project) */
    const char *application, *user;        /* NULL: none */
    const char *logical_model, *actual_model, *provider, *pool; /* NULL: none */
    int attempts;
    const char *status; /* "succeeded" | "failed" | "cancelled" | "timed_out" */
    int http_status;
    const char *error_code; /* NULL on success */
    int stream;
    mg_usage_tokens_t tokens;
    int input_estimated, output_estimated; /* counted by the gateway, not the upstream */
    int64_t latency_ms, ttft_ms, queue_ms; /* ttft_ms < 0: no first token */
    int64_t cost_micros;
    const char *price_version; /* NULL: not priced */
    const char *degraded;      /* NULL: not degraded */
    int cancelled;
} mg_usage_event_t;

/* The histogram bin of a duration: 0 for < 1 ms, else 1 + floor(log2(ms)), at most 24. Bin b
 * > 0 holds [2^(b-1), 2^b) ms. */
int mg_usage_bin(int64_t ms);
/* The upper bound in ms of bin b (what a percentile read from the bins says). */
int64_t mg_usage_bin_upper_ms(int bin);

/* Queue the event's write (copies it). done (may be NULL) as mg_store_write_cb, but with the
 * journal open (mg_usage_journal_open) and on the loop thread: the event is appended to the
 * journal and done runs inside the call, rc 0 (store.h's mg_store_journal_write). Returns 0 or
 * -1 (not queued: done is never called; logged). */
int mg_usage_write(mg_store_t *st, const mg_usage_event_t *e, mg_store_done_fn done, void *ud);

/* The usage journal (store.h's mg_store_use_journal; `bytes` 0: the default): call at
 * start-up after mg_store_use_agg(&mg_usage_rollup); replays what a killed run left. */
int mg_usage_journal_open(mg_store_t *st, size_t bytes);
/* A store opened on a backup's copy: its roll-ups recovered and the copied journal beside it
 * replayed (store/upkeep.h's mg_store_replay_fn; the writer drains it by mg_store_close). */
int mg_usage_journal_replay(mg_store_t *st);

/* The pruner: every usage.prune_interval_s, one write that looks at the oldest
 * usage.prune_batch events (by seq) and deletes those older than usage.retention_days (the writer
 * thread runs it between other batches, so no transaction grows large). `conf` is read at every
 * tick (the current generation's). */
typedef const mg_usage_conf_t *(*mg_usage_conf_fn)(void *ud);
typedef struct mg_usage_pruner_s {
    uv_timer_t timer;
    mg_store_t *store; /* borrowed */
    mg_usage_conf_fn conf;
    void *conf_ud;
    int64_t last_interval_ms;
} mg_usage_pruner_t;

/* Start it (the first prune after one interval). 0 or a negative libuv error. */
int mg_usage_pruner_start(mg_usage_pruner_t *p, uv_loop_t *loop, mg_store_t *st,
                          mg_usage_conf_fn conf, void *ud);
/* Stop it; its timer is closed (the struct may go after the loop ran once more). */
void mg_usage_pruner_stop(mg_usage_pruner_t *p);
/* The pruning statement's parameters for now_ms (tests): the cut-off and the batch. */
void mg_usage_prune_params(const mg_usage_conf_t *u, int64_t now_ms, char cut[24], char batch[16]);
extern const char *const MG_USAGE_PRUNE_SQL;

#endif
