/* cluster samples: route health samples shared by every instance through one bounded Redis
 * stream (issue 24; the multi-tenant design's "共享历史", hot path step 5).
 *
 * Each instance gathers the outcome of its upstream attempts (provider, upstream model,
 * success, TTFT, latency, when) and every 200 ms appends what it gathered as one entry of
 * the stream <key_prefix>health (XADD MAXLEN ~ 10000, then EXPIRE 300 s: pipelined, one round
 * trip). Every 200 ms it reads the entries past the last one it read (XREAD COUNT 256, never
 * BLOCK: the connection is shared with the limits' scripts) and hands the other instances'
 * samples to its feed callback, which records them in the local health state as its own.
 * At start the reader's cursor is 5 minutes back: the samples still in the TTL are replayed
 * (counted as `replayed` until a read comes back short, `heard` after).
 *
 * An entry names the run that wrote it: a random id drawn at each start, so an instance skips
 * its own entries (they are in its health already) but, after a restart, replays those of its
 * previous run (they are not).
 *
 * Bounded: at most 1024 samples and 64 routes wait for a flush; more are dropped and counted.
 * Redis unreachable, late or refusing: the batch is dropped and counted, routing goes on with
 * this instance's own samples, reading resumes when Redis answers again; one log line at each
 * change of that state. Loop thread only; nothing here waits. */
#ifndef MG_CLUSTER_SAMPLES_H
#define MG_CLUSTER_SAMPLES_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster/redis.h"

#define MG_CSAMPLES_MAX_BATCH 1024 /* samples in one entry */
#define MG_CSAMPLES_MAX_ROUTES 64  /* distinct provider + model pairs in one entry */
#define MG_CSAMPLES_TTL_MS 300000  /* samples older than this are neither replayed nor heard */

/* One attempt's outcome. Decoded ones point into the entry being read (valid during the
 * feed call only). */
typedef struct mg_csample_s {
    const char *provider;
    const char *model; /* the upstream model; "" when none */
    int ok;            /* the provider's success (a 4xx other than 429 is a success) */
    int32_t ttft_ms;   /* -1: none */
    int32_t latency_ms;
    uint64_t at_ms; /* unix ms */
} mg_csample_t;

/* A sample from another instance, taken age_ms ago (by this instance's clock). Returns 1
 * when it was recorded, 0 when it is not for this instance (a provider it does not have). */
typedef int (*mg_csamples_feed_fn)(void *ud, const mg_csample_t *s, uint64_t age_ms);

typedef struct mg_csamples_stats_s {
    unsigned long long added;    /* own samples appended to the stream (Redis said so) */
    unsigned long long dropped;  /* own samples not shared: buffer full, Redis away or late */
    unsigned long long heard;    /* the others' samples recorded here, live */
    unsigned long long replayed; /* ... recorded at start, from the TTL's history */
} mg_csamples_stats_t;

typedef struct mg_csamples_s mg_csamples_t;

/* Over r (borrowed: stopped before this is), the stream <prefix>health, entries naming
 * node_id and a fresh run id; feed(ud, ...) for the others' samples. Starts its timer at
 * once. NULL when r is NULL or out of memory. */
mg_csamples_t *mg_csamples_new(uv_loop_t *loop, mg_redis_t *r, const char *prefix,
                               const char *node_id, mg_csamples_feed_fn feed, void *ud);
/* Stops the timer; freed once it has closed. Call after mg_redis_stop (whose callbacks in
 * flight are then told). NULL is fine. */
void mg_csamples_stop(mg_csamples_t *x);
/* One of this instance's samples, for the next flush (copied). */
void mg_csamples_add(mg_csamples_t *x, const mg_csample_t *s);
void mg_csamples_stats(const mg_csamples_t *x, mg_csamples_stats_t *out);
/* This run's id (16 hex digits). */
const char *mg_csamples_run_id(const mg_csamples_t *x);

/* ---- the entry's body (pure; exposed for the unit test) --------------------------------
 *
 *   h1 <base unix ms> <routes> <samples>\n
 *   <provider>\t<model>\n                               x routes
 *   <route index> <ok 0|1> <ttft ms|-1> <latency ms|-1> <ms after base>\n    x samples
 *
 * Provider ids and model names holding a tab or a newline are not shared (the caller
 * checks with mg_csamples_name_ok). */
int mg_csamples_name_ok(const char *s);

/* A batch being gathered: routes by index, samples in time order. */
typedef struct mg_csamples_batch_s {
    char *provider[MG_CSAMPLES_MAX_ROUTES]; /* owned */
    char *model[MG_CSAMPLES_MAX_ROUTES];    /* owned */
    int n_routes;
    struct {
        uint16_t route;
        uint8_t ok;
        int32_t ttft_ms, latency_ms;
        uint64_t at_ms;
    } s[MG_CSAMPLES_MAX_BATCH];
    int n;
} mg_csamples_batch_t;

/* Add s to b: 0, or -1 when b is full (samples or routes), a name cannot be shared, or out
 * of memory (b unchanged). */
int mg_csamples_batch_add(mg_csamples_batch_t *b, const mg_csample_t *s);
/* Forget every sample and route (frees the names). */
void mg_csamples_batch_clear(mg_csamples_batch_t *b);
/* b's body appended to out: 0 or -1 (out of memory). */
struct mg_buf_s;
int mg_csamples_encode(const mg_csamples_batch_t *b, struct mg_buf_s *out);
/* Decode body (len bytes, need not end in NUL): each sample to fn(ud, sample) (fn NULL:
 * check only). Returns the number of samples, or -1 when body is not a valid entry (then
 * fn was not called: the whole body is checked first). */
typedef void (*mg_csamples_each_fn)(void *ud, const mg_csample_t *s);
int mg_csamples_decode(const char *body, size_t len, mg_csamples_each_fn fn, void *ud);

#endif
