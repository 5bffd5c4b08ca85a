/* usage_rollup: the usage events' roll-ups, summed in C on the store's writer thread.
 *
 * Every usage event (usage.c) is written with mg_store_write_agg and this table: for each
 * event really inserted in a batch (not a replay the INSERT OR IGNORE ignored), its figures
 * are added to the batch's sums in memory; when the batch commits they join the pending
 * sums, which the writer writes about once a second (store.h) with one UPSERT per touched
 * bucket, and the watermark usage_rollup_mark.seq (the last event summed) in the same
 * transaction: usage_hourly (per hour, tenant, project, key, provider and logical model),
 * usage_hist (latency and TTFT log2 bins of the same key), their daily twins usage_daily and
 * usage_hist_daily (the same key with the UTC day's midnight for the hour: each hourly
 * bucket is added to its hour's row and its day's, so a day's row is its hours' sum to the
 * unit), usage_tenant_hourly (the hourly buckets summed per hour and tenant at the flush:
 * what the series read), the ADR's provider_usage_logs (per provider, actual model and
 * hour) and daily_stats (per day and pool). The daily and per-tenant tables cost the flush
 * about one UPSERT more per bucket (bench/rollup_bench: 300 buckets 1.5 -> 3.1 ms), once a
 * second on the writer, nothing per request. A request's own transaction is its event row
 * alone. At start-up (mg_store_use_agg, before serving) the events past the watermark are
 * summed again into all of them, so a kill -9 between two flushes loses no sum and adds
 * none twice. The numbers are those the per-event trigger of migration 13 gave (migration
 * 17 drops it). Reads: the admin API's stats call mg_store_sync_aggs first (no lag), and
 * read a range's whole days from the daily tables and its partial days' hours from the
 * hourly ones (admin/stats.c); anything that reads the tables directly sees them at most
 * about a second behind. It reads the event's parameters in the order of usage.c's
 * INSERT. */
#ifndef MG_OBS_USAGE_ROLLUP_H
#define MG_OBS_USAGE_ROLLUP_H

#include "store/store.h"

extern const mg_store_agg_t mg_usage_rollup;

/* The parameter positions of usage.c's INSERT the roll-ups read (0-based). */
enum {
    MG_UP_AT_MS = 1,
    MG_UP_TENANT = 3,
    MG_UP_PROJECT = 4,
    MG_UP_KEY = 5,
    MG_UP_LOGICAL_MODEL = 8,
    MG_UP_ACTUAL_MODEL = 9,
    MG_UP_PROVIDER = 10,
    MG_UP_POOL = 11,
    MG_UP_STATUS = 13,
    MG_UP_INPUT = 17, /* then output, cached_read, cache_write, reasoning */
    MG_UP_INPUT_EST = 22,
    MG_UP_OUTPUT_EST = 23,
    MG_UP_LATENCY = 24,
    MG_UP_TTFT = 25,
    MG_UP_COST = 27,
    MG_UP_LATENCY_BIN = 31,
    MG_UP_TTFT_BIN = 32,
    MG_UP_NPARAMS = 33,
};

#endif
