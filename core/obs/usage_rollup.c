/* usage_rollup: the usage events' buckets summed in memory; see usage_rollup.h.
 *
 * Two sets of sums: the batch's (strings point into the batch's write jobs, which live
 * until `committed` returned, so nothing is copied) and the pending ones, written about
 * once a second (strings copied). The buckets touched in a second are few (one per hour,
 * tenant, project, key, provider and model), so each kind is a plain array searched
 * linearly. */
#include "obs/usage_rollup.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* usage_hourly's and usage_hist's key */
typedef struct {
    int64_t hour, tenant, project, key;
    const char *provider, *model; /* '' rather than NULL */
} hour_key_t;

/* usage_hourly's sums, in the table's column order */
enum {
    H_REQUESTS,
    H_ERRORS,
    H_CANCELLED,
    H_INPUT,
    H_OUTPUT,
    H_CACHED_READ,
    H_CACHE_WRITE,
    H_REASONING,
    H_CACHE_HITS,
    H_MISSING_USAGE,
    H_COST,
    H_LATENCY_SUM,
    H_TTFT_SUM,
    H_TTFT_COUNT,
    H_N
};

typedef struct {
    hour_key_t k;
    int64_t v[H_N];
} hourly_t;

typedef struct {
    hour_key_t k;
    const char *kind; /* "latency" or "ttft" */
    int64_t bin, n;
} hist_t;

/* provider_usage_logs: per provider, actual model and hour */
typedef struct {
    const char *provider, *model;
    int64_t hour;
    int64_t prompt, completion, cost, requests, errors, latency, cached_read, cache_write;
} provider_t;

/* daily_stats: per UTC day and pool */
typedef struct {
    int64_t day;
    const char *pool;
    int64_t requests, errors, tokens, cost;
} daily_t;

#define ARRAY(T)                                                                                   \
    struct {                                                                                       \
        T *a;                                                                                      \
        int n, cap;                                                                                \
    }

typedef struct {
    ARRAY(hourly_t) hourly;
    ARRAY(hist_t) hist;
    ARRAY(provider_t) providers;
    ARRAY(daily_t) daily;
    int owned;       /* the strings are copies (always, since a drain's are the ring's) */
    int failed;      /* out of memory: these sums miss something */
    int64_t max_seq; /* the last event summed */
} sums_t;

typedef struct {
    sums_t batch, pending;
    sqlite3_stmt *hourly_st, *hist_st, *provider_st, *daily_st, *mark_st;
    sqlite3_stmt *hourly_day_st, *hist_day_st; /* usage_daily, usage_hist_daily */
    sqlite3_stmt *totals_st;                   /* usage_tenant_hourly */
} rollup_t;

/* A new zeroed element at the end of an array (a, n, cap), or NULL. */
static void *push(void **a, int *n, int *cap, size_t size)
{
    if (*n == *cap) {
        int ncap = *cap ? *cap * 2 : 16;
        void *na = realloc(*a, (size_t)ncap * size);
        if (!na) return NULL;
        *a = na;
        *cap = ncap;
    }
    void *e = (char *)*a + (size_t)(*n)++ * size;
    memset(e, 0, size);
    return e;
}
#define PUSH(arr) push((void **)&(arr).a, &(arr).n, &(arr).cap, sizeof(*(arr).a))

static int64_t num(const mg_store_val_t *p, int i)
{
    return p[i].kind == MG_STORE_INT ? p[i].i : 0;
}

static int is_null(const mg_store_val_t *p, int i)
{
    return p[i].kind == MG_STORE_NULL;
}

static const char *str_or(const mg_store_val_t *p, int i, const char *dflt)
{
    return p[i].kind == MG_STORE_TEXT && p[i].s ? p[i].s : dflt;
}

static int same_hour_key(const hour_key_t *a, const hour_key_t *b)
{
    return a->hour == b->hour && a->tenant == b->tenant && a->project == b->project &&
           a->key == b->key && strcmp(a->provider, b->provider) == 0 &&
           strcmp(a->model, b->model) == 0;
}

/* The string as the sums keep it: itself, or a copy in the pending sums (NULL: no memory). */
static const char *keep(sums_t *r, const char *s)
{
    return r->owned ? strdup(s) : s;
}

/* Copy the key's strings into owned sums; -1 when out of memory (nothing kept). */
static int keep_key(sums_t *r, hour_key_t *k)
{
    if (!r->owned) return 0;
    char *p = strdup(k->provider), *m = strdup(k->model);
    if (!p || !m) {
        free(p);
        free(m);
        return -1;
    }
    k->provider = p;
    k->model = m;
    return 0;
}

static hourly_t *hourly_at(sums_t *r, const hour_key_t *k)
{
    for (int i = 0; i < r->hourly.n; i++)
        if (same_hour_key(&r->hourly.a[i].k, k)) return &r->hourly.a[i];
    hour_key_t kept = *k;
    if (keep_key(r, &kept) != 0) return NULL;
    hourly_t *h = PUSH(r->hourly);
    if (h) h->k = kept;
    return h;
}

/* kind is a string literal ("latency" or "ttft"), never copied */
static int hist_add(sums_t *r, const hour_key_t *k, const char *kind, int64_t bin, int64_t n)
{
    for (int i = 0; i < r->hist.n; i++) {
        hist_t *h = &r->hist.a[i];
        if (h->bin == bin && strcmp(h->kind, kind) == 0 && same_hour_key(&h->k, k)) {
            h->n += n;
            return 0;
        }
    }
    hour_key_t kept = *k;
    if (keep_key(r, &kept) != 0) return -1;
    hist_t *h = PUSH(r->hist);
    if (!h) return -1;
    *h = (hist_t){kept, kind, bin, n};
    return 0;
}

static provider_t *provider_at(sums_t *r, const char *provider, const char *model, int64_t hour)
{
    for (int i = 0; i < r->providers.n; i++) {
        provider_t *p = &r->providers.a[i];
        if (p->hour == hour && strcmp(p->provider, provider) == 0 && strcmp(p->model, model) == 0)
            return p;
    }
    hour_key_t kept = {.provider = provider, .model = model};
    if (keep_key(r, &kept) != 0) return NULL;
    provider_t *p = PUSH(r->providers);
    if (p) *p = (provider_t){.provider = kept.provider, .model = kept.model, .hour = hour};
    return p;
}

static daily_t *daily_at(sums_t *r, int64_t day, const char *pool)
{
    for (int i = 0; i < r->daily.n; i++)
        if (r->daily.a[i].day == day && strcmp(r->daily.a[i].pool, pool) == 0)
            return &r->daily.a[i];
    const char *kept = keep(r, pool);
    if (!kept) return NULL;
    daily_t *d = PUSH(r->daily);
    if (d) *d = (daily_t){.day = day, .pool = kept};
    return d;
}

/* Empty the sums (freeing the copies of owned ones); the arrays stay for reuse. */
static void sums_clear(sums_t *r)
{
    if (r->owned) {
        for (int i = 0; i < r->hourly.n; i++) {
            free((char *)r->hourly.a[i].k.provider);
            free((char *)r->hourly.a[i].k.model);
        }
        for (int i = 0; i < r->hist.n; i++) {
            free((char *)r->hist.a[i].k.provider);
            free((char *)r->hist.a[i].k.model);
        }
        for (int i = 0; i < r->providers.n; i++) {
            free((char *)r->providers.a[i].provider);
            free((char *)r->providers.a[i].model);
        }
        for (int i = 0; i < r->daily.n; i++) free((char *)r->daily.a[i].pool);
    }
    r->hourly.n = r->hist.n = r->providers.n = r->daily.n = 0;
    r->failed = 0;
    r->max_seq = 0;
}

static void sums_free(sums_t *r)
{
    sums_clear(r);
    free(r->hourly.a);
    free(r->hist.a);
    free(r->providers.a);
    free(r->daily.a);
}

/* Add the batch's sums b to the pending ones a: 0, or -1 when out of memory. */
static int sums_merge(sums_t *a, const sums_t *b)
{
    for (int i = 0; i < b->hourly.n; i++) {
        hourly_t *h = hourly_at(a, &b->hourly.a[i].k);
        if (!h) return -1;
        for (int c = 0; c < H_N; c++) h->v[c] += b->hourly.a[i].v[c];
    }
    for (int i = 0; i < b->hist.n; i++) {
        const hist_t *h = &b->hist.a[i];
        if (hist_add(a, &h->k, h->kind, h->bin, h->n) != 0) return -1;
    }
    for (int i = 0; i < b->providers.n; i++) {
        const provider_t *s = &b->providers.a[i];
        provider_t *p = provider_at(a, s->provider, s->model, s->hour);
        if (!p) return -1;
        p->prompt += s->prompt;
        p->completion += s->completion;
        p->cost += s->cost;
        p->requests += s->requests;
        p->errors += s->errors;
        p->latency += s->latency;
        p->cached_read += s->cached_read;
        p->cache_write += s->cache_write;
    }
    for (int i = 0; i < b->daily.n; i++) {
        const daily_t *s = &b->daily.a[i];
        daily_t *d = daily_at(a, s->day, s->pool);
        if (!d) return -1;
        d->requests += s->requests;
        d->errors += s->errors;
        d->tokens += s->tokens;
        d->cost += s->cost;
    }
    if (b->max_seq > a->max_seq) a->max_seq = b->max_seq;
    return 0;
}

/* ---- the table's functions ---- */

static void *rollup_create(void)
{
    rollup_t *r = calloc(1, sizeof(rollup_t));
    /* the batch's strings are copies too: a record's text lives during add only (store.h) */
    if (r) r->pending.owned = r->batch.owned = 1;
    return r;
}

static void rollup_reset(void *state)
{
    rollup_t *r = state;
    sums_clear(&r->batch);
}

static void rollup_destroy(void *state)
{
    rollup_t *r = state;
    if (!r) return;
    sqlite3_finalize(r->hourly_st);
    sqlite3_finalize(r->hist_st);
    sqlite3_finalize(r->provider_st);
    sqlite3_finalize(r->daily_st);
    sqlite3_finalize(r->mark_st);
    sqlite3_finalize(r->hourly_day_st);
    sqlite3_finalize(r->hist_day_st);
    sqlite3_finalize(r->totals_st);
    sums_free(&r->batch);
    sums_free(&r->pending);
    free(r);
}

/* Sum one event (its INSERT's parameters p) into r. */
static void sums_add(sums_t *r, int64_t seq, int nparams, const mg_store_val_t *p)
{
    if (nparams < MG_UP_NPARAMS) return;
    if (seq > r->max_seq) r->max_seq = seq;
    int64_t at_ms = num(p, MG_UP_AT_MS), hour = at_ms / 3600000 * 3600;
    const char *status = str_or(p, MG_UP_STATUS, "");
    int failed = strcmp(status, "failed") == 0 || strcmp(status, "timed_out") == 0;
    int64_t in = num(p, MG_UP_INPUT), out = num(p, MG_UP_INPUT + 1), cr = num(p, MG_UP_INPUT + 2),
            cw = num(p, MG_UP_INPUT + 3), reasoning = num(p, MG_UP_INPUT + 4),
            cost = num(p, MG_UP_COST), latency = num(p, MG_UP_LATENCY);
    hour_key_t k = {hour,
                    num(p, MG_UP_TENANT),
                    num(p, MG_UP_PROJECT),
                    num(p, MG_UP_KEY),
                    str_or(p, MG_UP_PROVIDER, ""),
                    str_or(p, MG_UP_LOGICAL_MODEL, "")};
    hourly_t *h = hourly_at(r, &k);
    if (!h) goto oom;
    h->v[H_REQUESTS]++;
    h->v[H_ERRORS] += failed;
    h->v[H_CANCELLED] += strcmp(status, "cancelled") == 0;
    h->v[H_INPUT] += in;
    h->v[H_OUTPUT] += out;
    h->v[H_CACHED_READ] += cr;
    h->v[H_CACHE_WRITE] += cw;
    h->v[H_REASONING] += reasoning;
    h->v[H_CACHE_HITS] += cr > 0;
    h->v[H_MISSING_USAGE] +=
        strcmp(status, "succeeded") == 0 && (num(p, MG_UP_INPUT_EST) || num(p, MG_UP_OUTPUT_EST));
    h->v[H_COST] += cost;
    h->v[H_LATENCY_SUM] += latency;
    h->v[H_TTFT_SUM] += num(p, MG_UP_TTFT);
    h->v[H_TTFT_COUNT] += !is_null(p, MG_UP_TTFT);
    if (hist_add(r, &k, "latency", num(p, MG_UP_LATENCY_BIN), 1) != 0) goto oom;
    if (!is_null(p, MG_UP_TTFT_BIN) && hist_add(r, &k, "ttft", num(p, MG_UP_TTFT_BIN), 1) != 0)
        goto oom;
    if (!is_null(p, MG_UP_PROVIDER)) {
        provider_t *pv = provider_at(r, str_or(p, MG_UP_PROVIDER, ""),
                                     str_or(p, MG_UP_ACTUAL_MODEL, "unknown"), hour);
        if (!pv) goto oom;
        pv->prompt += in + cr + cw;
        pv->completion += out;
        pv->cost += cost;
        pv->requests++;
        pv->errors += failed;
        pv->latency += latency;
        pv->cached_read += cr;
        pv->cache_write += cw;
    }
    const char *pool = str_or(p, MG_UP_POOL, "");
    if (strcmp(pool, "main") == 0 || strcmp(pool, "fallback") == 0) {
        daily_t *d = daily_at(r, at_ms / 1000 / 86400, pool);
        if (!d) goto oom;
        d->requests++;
        d->errors += failed;
        d->tokens += in + cr + cw + out;
        d->cost += cost;
    }
    return;
oom:
    r->failed = 1;
}

static void rollup_add(void *state, int64_t rowid, int nparams, const mg_store_val_t *p)
{
    sums_add(&((rollup_t *)state)->batch, rowid, nparams, p);
}

/* The batch committed: its sums join the pending ones. Out of memory, the pending sums are
 * marked failed, and the next flush sums again from the events past the watermark. */
static void rollup_committed(void *state)
{
    rollup_t *r = state;
    if (r->batch.failed || sums_merge(&r->pending, &r->batch) != 0) r->pending.failed = 1;
    sums_clear(&r->batch);
}

/* The columns of the INSERT of usage.c, in its order, then seq */
static const char *const RECOVER_SQL =
    "SELECT request_id, at_ms, endpoint, tenant_id, project_id, key_id, application, user_id,"
    " logical_model, actual_model, provider_id, pool, attempts, status, http_status,"
    " error_code, stream, input_tokens, output_tokens, cached_read_tokens, cache_write_tokens,"
    " reasoning_tokens, input_estimated, output_estimated, latency_ms, ttft_ms, queue_ms,"
    " cost_micros, price_version, degraded, cancelled, latency_bin, ttft_bin, seq"
    " FROM usage_events WHERE seq > (SELECT seq FROM usage_rollup_mark) ORDER BY seq";

/* Sum the events past the watermark into empty pending sums (start-up, or after running
 * out of memory). Each row goes through the batch's sums, whose strings are the row's. */
static int rollup_recover(void *state, sqlite3 *db)
{
    rollup_t *r = state;
    sqlite3_stmt *st = NULL;
    sums_clear(&r->pending);
    if (sqlite3_prepare_v2(db, RECOVER_SQL, -1, &st, NULL) != SQLITE_OK) return -1;
    mg_store_val_t p[MG_UP_NPARAMS];
    int step, rc = 0;
    while (rc == 0 && (step = sqlite3_step(st)) == SQLITE_ROW) {
        for (int i = 0; i < MG_UP_NPARAMS; i++) {
            int t = sqlite3_column_type(st, i);
            if (t == SQLITE_NULL) p[i] = (mg_store_val_t){MG_STORE_NULL, 0, NULL, 0};
            else if (t == SQLITE_INTEGER)
                p[i] = (mg_store_val_t){MG_STORE_INT, sqlite3_column_int64(st, i), NULL, 0};
            else
                p[i] =
                    (mg_store_val_t){MG_STORE_TEXT, 0, (const char *)sqlite3_column_text(st, i), 0};
        }
        sums_clear(&r->batch);
        sums_add(&r->batch, sqlite3_column_int64(st, MG_UP_NPARAMS), MG_UP_NPARAMS, p);
        if (r->batch.failed || sums_merge(&r->pending, &r->batch) != 0) rc = -1;
    }
    if (rc == 0 && step != SQLITE_DONE) rc = -1;
    sums_clear(&r->batch);
    sqlite3_finalize(st);
    if (rc != 0) r->pending.failed = 1;
    return rc;
}

static int rollup_dirty(const void *state)
{
    const rollup_t *r = state;
    return r->pending.hourly.n > 0 || r->pending.failed;
}

static void rollup_flushed(void *state)
{
    sums_clear(&((rollup_t *)state)->pending);
}

/* ---- the flush: one UPSERT per bucket ---- */

/* The sums' UPSERT: the key's columns (the values' first `key` parameters), then the 14
 * sums added to a row already there */
#define SUMS_SET                                                                                   \
    " ON CONFLICT DO UPDATE SET requests = requests + excluded.requests,"                          \
    " errors = errors + excluded.errors, cancelled = cancelled + excluded.cancelled,"              \
    " input_tokens = input_tokens + excluded.input_tokens,"                                        \
    " output_tokens = output_tokens + excluded.output_tokens,"                                     \
    " cached_read_tokens = cached_read_tokens + excluded.cached_read_tokens,"                      \
    " cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,"                      \
    " reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,"                            \
    " cache_hits = cache_hits + excluded.cache_hits,"                                              \
    " missing_usage = missing_usage + excluded.missing_usage,"                                     \
    " cost_micros = cost_micros + excluded.cost_micros,"                                           \
    " latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,"                                  \
    " ttft_ms_sum = ttft_ms_sum + excluded.ttft_ms_sum,"                                           \
    " ttft_count = ttft_count + excluded.ttft_count"
/* usage_hourly's and usage_daily's: the key's first the hour or the day */
#define SUMS_UPSERT(table)                                                                         \
    "INSERT INTO " table " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13,"        \
    " ?14, ?15, ?16, ?17, ?18, ?19, ?20)" SUMS_SET
#define HIST_UPSERT(table)                                                                         \
    "INSERT INTO " table " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"                            \
    " ON CONFLICT DO UPDATE SET n = n + excluded.n"

static const char *const HOURLY_SQL = SUMS_UPSERT("usage_hourly");
static const char *const HOURLY_DAY_SQL = SUMS_UPSERT("usage_daily");
static const char *const HIST_SQL = HIST_UPSERT("usage_hist");
static const char *const HIST_DAY_SQL = HIST_UPSERT("usage_hist_daily");
static const char *const TOTALS_SQL =
    "INSERT INTO usage_tenant_hourly VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12,"
    " ?13, ?14, ?15, ?16)" SUMS_SET;

/* the ADR's columns: cost in currency units beside the exact micros, the average latency
 * as the integer quotient of the sums (what the per-event trigger left after N events) */
static const char *const PROVIDER_SQL =
    "INSERT INTO provider_usage_logs(id, provider_id, model, prompt_tokens, completion_tokens,"
    " total_tokens, cost, request_count, error_count, avg_latency_ms, hour_bucket, cost_micros,"
    " cached_read_tokens, cache_write_tokens, latency_ms_sum)"
    " SELECT ?1 || '|' || ?2 || '|' || h, ?1, ?2, ?3, ?4, ?3 + ?4, ?5 / 1e6, ?6, ?7, ?8 / ?6, h,"
    " ?5, ?9, ?10, ?8 FROM (SELECT strftime('%Y-%m-%dT%H:00:00Z', ?11, 'unixepoch') AS h)"
    " WHERE true ON CONFLICT(provider_id, model, hour_bucket) DO UPDATE SET"
    " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = completion_tokens + excluded.completion_tokens,"
    " total_tokens = total_tokens + excluded.total_tokens,"
    " cost_micros = cost_micros + excluded.cost_micros,"
    " cost = (cost_micros + excluded.cost_micros) / 1e6,"
    " request_count = request_count + excluded.request_count,"
    " error_count = error_count + excluded.error_count,"
    " cached_read_tokens = cached_read_tokens + excluded.cached_read_tokens,"
    " cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens,"
    " latency_ms_sum = latency_ms_sum + excluded.latency_ms_sum,"
    " avg_latency_ms = (latency_ms_sum + excluded.latency_ms_sum)"
    " / (request_count + excluded.request_count)";

static const char *const DAILY_SQL =
    "INSERT INTO daily_stats(id, date, pool, total_requests, total_errors, total_tokens,"
    " total_cost, total_cost_micros)"
    " SELECT d || '|' || ?2, d, ?2, ?3, ?4, ?5, ?6 / 1e6, ?6"
    " FROM (SELECT date(?1, 'unixepoch') AS d) WHERE true"
    " ON CONFLICT(date, pool) DO UPDATE SET total_requests = total_requests + excluded.total_requests,"
    " total_errors = total_errors + excluded.total_errors,"
    " total_tokens = total_tokens + excluded.total_tokens,"
    " total_cost_micros = total_cost_micros + excluded.total_cost_micros,"
    " total_cost = (total_cost_micros + excluded.total_cost_micros) / 1e6";

static int prepare(sqlite3 *db, sqlite3_stmt **st, const char *sql)
{
    if (*st) return 0;
    return sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL) == SQLITE_OK ? 0
                                                                                             : -1;
}

/* Step a bound statement once and reset it: 0 or -1. */
static int run(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* The key's hour, or its UTC day (the midnight's unix seconds) when day is set. */
static void bind_hour_key(sqlite3_stmt *st, const hour_key_t *k, int day)
{
    sqlite3_bind_int64(st, 1, day ? k->hour - k->hour % 86400 : k->hour);
    sqlite3_bind_int64(st, 2, k->tenant);
    sqlite3_bind_int64(st, 3, k->project);
    sqlite3_bind_int64(st, 4, k->key);
    sqlite3_bind_text(st, 5, k->provider, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, k->model, -1, SQLITE_STATIC);
}

static const char *const MARK_SQL = "UPDATE usage_rollup_mark SET seq = max(seq, ?1)";

static int upsert_sums(sqlite3_stmt *st, const hourly_t *h, int day)
{
    bind_hour_key(st, &h->k, day);
    for (int c = 0; c < H_N; c++) sqlite3_bind_int64(st, 7 + c, h->v[c]);
    return run(st);
}

static int upsert_hist(sqlite3_stmt *st, const hist_t *h, int day)
{
    bind_hour_key(st, &h->k, day);
    sqlite3_bind_text(st, 7, h->kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 8, h->bin);
    sqlite3_bind_int64(st, 9, h->n);
    return run(st);
}

/* Each hourly bucket and histogram bin is added to its hour's row and to its day's: the
 * daily tables are the hourly ones summed per day by construction, in the same
 * transaction (one UPSERT more per bucket; the buckets of a second mostly share an hour,
 * so summing them per day first would save next to nothing). */
static int flush_hourly(rollup_t *rs, const sums_t *r)
{
    for (int i = 0; i < r->hourly.n; i++)
        if (upsert_sums(rs->hourly_st, &r->hourly.a[i], 0) != 0 ||
            upsert_sums(rs->hourly_day_st, &r->hourly.a[i], 1) != 0)
            return -1;
    for (int i = 0; i < r->hist.n; i++)
        if (upsert_hist(rs->hist_st, &r->hist.a[i], 0) != 0 ||
            upsert_hist(rs->hist_day_st, &r->hist.a[i], 1) != 0)
            return -1;
    return 0;
}

/* usage_tenant_hourly: the hourly buckets summed per hour and tenant, what the series by
 * hour or day read (admin/stats.c: one row per hour and tenant instead of one per key,
 * project, provider and model). Summed here, at the flush, so a second of traffic costs an
 * UPSERT or two more, not one per bucket; the sums are few (one per hour and tenant of
 * the second), searched from the newest. */
typedef struct {
    int64_t hour, tenant, v[H_N];
} total_t;

static int flush_totals(rollup_t *rs, const sums_t *r)
{
    if (!r->hourly.n) return 0;
    total_t *t = malloc((size_t)r->hourly.n * sizeof(*t));
    if (!t) return -1;
    int n = 0, rc = 0;
    for (int i = 0; i < r->hourly.n; i++) {
        const hourly_t *h = &r->hourly.a[i];
        int j = n - 1;
        while (j >= 0 && (t[j].hour != h->k.hour || t[j].tenant != h->k.tenant)) j--;
        if (j < 0) {
            j = n++;
            t[j] = (total_t){.hour = h->k.hour, .tenant = h->k.tenant};
        }
        for (int c = 0; c < H_N; c++) t[j].v[c] += h->v[c];
    }
    for (int j = 0; j < n && rc == 0; j++) {
        sqlite3_bind_int64(rs->totals_st, 1, t[j].hour);
        sqlite3_bind_int64(rs->totals_st, 2, t[j].tenant);
        for (int c = 0; c < H_N; c++) sqlite3_bind_int64(rs->totals_st, 3 + c, t[j].v[c]);
        rc = run(rs->totals_st);
    }
    free(t);
    return rc;
}

static int flush_pools(rollup_t *rs, const sums_t *r)
{
    sqlite3_stmt *st = rs->provider_st;
    for (int i = 0; i < r->providers.n; i++) {
        const provider_t *p = &r->providers.a[i];
        sqlite3_bind_text(st, 1, p->provider, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, p->model, -1, SQLITE_STATIC);
        int64_t v[] = {p->prompt,  p->completion,  p->cost,        p->requests, p->errors,
                       p->latency, p->cached_read, p->cache_write, p->hour};
        for (int c = 0; c < 9; c++) sqlite3_bind_int64(st, 3 + c, v[c]);
        if (run(st) != 0) return -1;
    }
    st = rs->daily_st;
    for (int i = 0; i < r->daily.n; i++) {
        const daily_t *d = &r->daily.a[i];
        sqlite3_bind_int64(st, 1, d->day * 86400);
        sqlite3_bind_text(st, 2, d->pool, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, d->requests);
        sqlite3_bind_int64(st, 4, d->errors);
        sqlite3_bind_int64(st, 5, d->tokens);
        sqlite3_bind_int64(st, 6, d->cost);
        if (run(st) != 0) return -1;
    }
    return 0;
}

/* Inside the store's transaction: the pending sums' UPSERTs and the watermark. */
static int rollup_flush(void *state, sqlite3 *db)
{
    rollup_t *r = state;
    if (r->pending.failed && rollup_recover(r, db) != 0) return -1;
    if (!r->pending.hourly.n) return 0;
    if (prepare(db, &r->hourly_st, HOURLY_SQL) != 0 || prepare(db, &r->hist_st, HIST_SQL) != 0 ||
        prepare(db, &r->provider_st, PROVIDER_SQL) != 0 ||
        prepare(db, &r->daily_st, DAILY_SQL) != 0 || prepare(db, &r->mark_st, MARK_SQL) != 0 ||
        prepare(db, &r->hourly_day_st, HOURLY_DAY_SQL) != 0 ||
        prepare(db, &r->hist_day_st, HIST_DAY_SQL) != 0 ||
        prepare(db, &r->totals_st, TOTALS_SQL) != 0)
        return -1;
    int rc = flush_hourly(r, &r->pending) == 0 && flush_totals(r, &r->pending) == 0 &&
                     flush_pools(r, &r->pending) == 0
                 ? 0
                 : -1;
    if (rc == 0) {
        sqlite3_bind_int64(r->mark_st, 1, r->pending.max_seq);
        rc = run(r->mark_st);
    }
    /* the bound strings die with the pending sums */
    sqlite3_clear_bindings(r->hourly_st);
    sqlite3_clear_bindings(r->hist_st);
    sqlite3_clear_bindings(r->hourly_day_st);
    sqlite3_clear_bindings(r->hist_day_st);
    sqlite3_clear_bindings(r->provider_st);
    sqlite3_clear_bindings(r->daily_st);
    return rc;
}

const mg_store_agg_t mg_usage_rollup = {
    .create = rollup_create,
    .destroy = rollup_destroy,
    .reset = rollup_reset,
    .add = rollup_add,
    .committed = rollup_committed,
    .recover = rollup_recover,
    .flush = rollup_flush,
    .flushed = rollup_flushed,
    .dirty = rollup_dirty,
};
