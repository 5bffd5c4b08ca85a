/* stats: the usage analytics of the admin API, on the worker thread, read from the roll-ups
 * (O(buckets), never the raw events) except the event list: a range's whole UTC days from
 * usage_daily / usage_hist_daily and its partial days' hours from usage_hourly / usage_hist
 * (pieces(), below: the same answer as the hourly tables alone), the series from
 * usage_tenant_hourly, all of one answer in one read transaction (bench/README.md).
 *
 *   GET /api/v2/stats/overview                 today, this week (from Monday), this month:
 *                                              requests, errors, tokens in and out, cost
 *   GET /api/v2/stats/daily?days=N             the last N days (1..366, default 7), today
 *                                              included, days without traffic as zeros
 *   GET /api/v2/stats/tokens?bucket=hour|day&from=&to=
 *                                              tokens per bucket (default: the last 24 hours
 *                                              by hour, the last 30 days by day)
 *   GET /api/v2/stats/providers/{id}           one provider: today, 7 and 30 days, per model
 *   GET /api/v2/usage/analytics?group_by=model|provider|key|project&from=&to=
 *                                              per group: requests, success rate, tokens,
 *                                              cache hits, cost, missing usage, latency and
 *                                              TTFT P50/P95, and the change against the
 *                                              previous period of equal length
 *   GET /api/v2/usage/events?from=&to=&key_id=&project_id=&model=&provider=&status=
 *                         &request_id=&cursor=&limit=&scan=
 *                                              the raw events, newest first, cursor-paginated
 *                                              (never a prompt or an answer: none is stored);
 *                                              a page examines at most scan events (default
 *                                              and most 100,000), so a rare filter's page may
 *                                              be short with has_more true: go on with
 *                                              next_cursor; request_id= finds one event;
 *                                              key_id=0 / project_id=0: the events without one
 *                                              (the analytics' group null), as the roll-ups
 *                                              count them
 *
 * Times: from/to are unix seconds or "YYYY-MM-DDTHH:MM:SSZ", UTC; the roll-ups' from is
 * rounded down and to up to whole hours (to is exclusive). Percentiles come from log2
 * histograms: a P95 of 512 means "at most 512 ms" (the bin's upper bound). Money is in
 * micro-units of the currency. A tenant admin sees only its own tenant (adm_query_id);
 * the platform admin may filter with ?tenant_id=. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin/req.h"
#include "base/log.h"
#include "obs/usage.h"
#include "store/pg.h"
#include "store/sqlq.h"

#define MAX_GROUPS 1000

/* ---- time ---- */

static int64_t now_s(void)
{
    return (int64_t)time(NULL);
}

/* A from/to parameter: 1 and *out, 0 when absent, -1 (error set) when malformed. */
static int time_param(admin_t *a, const char *name, int64_t *out)
{
    char v[40];
    if (!adm_query_param(a, name, v, sizeof(v))) return 0;
    size_t n = strlen(v);
    if (n > 0 && n <= 12 && strspn(v, "0123456789") == n) {
        *out = strtoll(v, NULL, 10);
        return 1;
    }
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    char z = 0;
    /* ':' may arrive percent-encoded */
    for (char *p; (p = strstr(v, "%3A")) || (p = strstr(v, "%3a"));) {
        *p = ':';
        memmove(p + 1, p + 3, strlen(p + 3) + 1);
    }
    if (sscanf(v, "%4d-%2d-%2dT%2d:%2d:%2d%c", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &z) == 7 &&
        z == 'Z' && strlen(v) == 20) {
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        *out = (int64_t)timegm(&tm);
        return 1;
    }
    adm_set_error(a, 400, "INVALID_REQUEST", "%s must be unix seconds or YYYY-MM-DDTHH:MM:SSZ",
                  name);
    return -1;
}

/* from/to with defaults (to: now, from: to - def_span_s), rounded to whole hours; from < to
 * and at most 400 days apart. 0 or -1 (error set). */
static int range_params(admin_t *a, int64_t def_span_s, int64_t *from, int64_t *to)
{
    int64_t f = 0, t = now_s();
    int hf = time_param(a, "from", &f), ht = time_param(a, "to", &t);
    if (hf < 0 || ht < 0) return -1;
    if (!hf) f = t - def_span_s;
    f = f / 3600 * 3600;
    t = (t + 3599) / 3600 * 3600;
    if (t <= f) t = f + 3600;
    if (t - f > 400LL * 86400) {
        adm_set_error(a, 400, "INVALID_REQUEST", "from and to may be at most 400 days apart");
        return -1;
    }
    *from = f;
    *to = t;
    return 0;
}

static void fmt(char *buf, size_t cap, int64_t v)
{
    snprintf(buf, cap, "%" PRId64, v);
}

static void iso(char *buf, size_t cap, int64_t s)
{
    time_t t = (time_t)s;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* The tenant the request may see: NULL (all) or its id's text in buf. -1 when invalid. */
static int tenant_filter(admin_t *a, char *buf, size_t cap, const char **out)
{
    int q = adm_query_id(a, "tenant_id", buf, cap);
    if (q < 0) return -1;
    *out = q ? buf : NULL;
    return 0;
}

/* One stats call: its admin request, the tenant it may see (NULL: all) and where it reads.
 * Embedded: one SQLite read connection in one read transaction, so the pieces of a range
 * (below) and the periods of an answer are one snapshot of the roll-ups. With
 * cluster.postgres (pg set): the cluster's PostgreSQL, where every instance's events and
 * roll-ups are (store/pg_schema.c, migrations 1 and 5), so every instance answers the same;
 * each query there is a connection of its own (mg_pg_query_sync, with a connect timeout). */
typedef struct {
    admin_t *a;
    const char *tenant;
    mg_store_read_t *rd;
    mg_pg_t *pg;
} stats_t;

/* One query of the analytics on the backend of c, written once for both: SQLite's "?N"
 * parameters become PostgreSQL's "$N" (the texts below hold no '?' elsewhere), all
 * parameters are text either way (a parameter PostgreSQL could not type, "?3 IS NULL", is
 * CAST where it is tested). An error is answered: 503 when PostgreSQL could not be
 * read (as the cluster's books, admin/billing.c), 500 for the local store. 0 or -1. */
static int stats_query(stats_t *c, const char *sql, int n, const char *const *p,
                       void (*cb)(void *, int, const char *const *), void *ud)
{
    char err[256];
    if (!c->pg) {
        if (mg_store_read_query(c->rd, sql, n, p, cb, ud, err, sizeof(err)) == 0) return 0;
        adm_storage_error(c->a, err);
        return -1;
    }
    char text[MG_SQLQ_TEXT + 512];
    size_t len = strlen(sql);
    if (len >= sizeof(text)) {
        adm_set_error(c->a, 500, "INTERNAL_ERROR", "the analytics query did not fit");
        return -1;
    }
    for (size_t i = 0; i <= len; i++) text[i] = sql[i] == '?' ? '$' : sql[i];
    if (mg_pg_query_sync(c->pg, text, n, p, cb, ud, err, sizeof(err)) == 0) return 0;
    mg_log_msg(MG_LOG_ERROR, c->a->request_id, "admin %s: %s", c->a->action, err);
    adm_set_error(c->a, 503, "RESOURCE_EXHAUSTED",
                  "the cluster's usage store cannot be read now (%s)", err);
    return -1;
}

/* ---- sums over the roll-ups ---- */

#define SUM_COLUMNS                                                                                \
    "COALESCE(SUM(requests),0), COALESCE(SUM(errors),0), COALESCE(SUM(cancelled),0),"              \
    " COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0),"                              \
    " COALESCE(SUM(cached_read_tokens),0), COALESCE(SUM(cache_write_tokens),0),"                   \
    " COALESCE(SUM(reasoning_tokens),0), COALESCE(SUM(cache_hits),0),"                             \
    " COALESCE(SUM(missing_usage),0), COALESCE(SUM(cost_micros),0),"                               \
    " COALESCE(SUM(latency_ms_sum),0), COALESCE(SUM(ttft_ms_sum),0), COALESCE(SUM(ttft_count),0)"
#define N_SUMS 14
enum {
    S_REQ,
    S_ERR,
    S_CANC,
    S_IN,
    S_OUT,
    S_CR,
    S_CW,
    S_REAS,
    S_HITS,
    S_MISS,
    S_COST,
    S_LAT,
    S_TTFT,
    S_TTFTN
};

typedef struct {
    char key[160]; /* the group's value ("" for none) */
    int64_t s[N_SUMS];
    int64_t prev[N_SUMS];
    int64_t hist[2][25]; /* latency, ttft */
} group_t;

typedef struct {
    group_t *g;
    int n, cap;
    int key_cols; /* 1: the first column is the group's value */
    int into_prev;
} groups_t;

static group_t *group_of(groups_t *gs, const char *key)
{
    for (int i = 0; i < gs->n; i++)
        if (strcmp(gs->g[i].key, key) == 0) return &gs->g[i];
    if (gs->n == gs->cap) {
        int cap = gs->cap ? gs->cap * 2 : 16;
        if (cap > MAX_GROUPS) return NULL;
        group_t *g = realloc(gs->g, (size_t)cap * sizeof(*g));
        if (!g) return NULL;
        gs->g = g;
        gs->cap = cap;
    }
    group_t *g = &gs->g[gs->n++];
    memset(g, 0, sizeof(*g));
    snprintf(g->key, sizeof(g->key), "%s", key);
    return g;
}

static void sums_row(void *ud, int ncols, const char *const *c)
{
    groups_t *gs = ud;
    int k = gs->key_cols;
    if (ncols < k + N_SUMS) return;
    group_t *g = group_of(gs, k ? (c[0] ? c[0] : "") : "");
    if (!g) return;
    int64_t *s = gs->into_prev ? g->prev : g->s;
    for (int i = 0; i < N_SUMS; i++) s[i] += c[k + i] ? strtoll(c[k + i], NULL, 10) : 0;
}

static void hist_row(void *ud, int ncols, const char *const *c)
{
    groups_t *gs = ud;
    if (ncols < 4) return;
    group_t *g = group_of(gs, c[0] ? c[0] : "");
    int bin = c[2] ? atoi(c[2]) : 0;
    if (!g || bin < 0 || bin > 24) return;
    g->hist[c[1] && strcmp(c[1], "ttft") == 0][bin] += c[3] ? strtoll(c[3], NULL, 10) : 0;
}

/* The hours of [from, to) (those whose start is in it: what `hour >= from AND hour < to`
 * over usage_hourly counts) as up to three pieces, in time order: the whole UTC days among
 * them from the daily tables (usage_daily, usage_hist_daily), the hours before the first
 * whole day and after the last from the hourly ones. Every hour is in one piece only and a
 * day's row is the sum of its hours' rows (obs/usage_rollup.c adds each bucket to both in
 * the same transaction), so an answer is the hourly tables' to the unit, read from about
 * 24 times fewer rows over a month (bench/README.md). Hours before 1970 do not exist. */
typedef struct {
    int daily;
    int64_t lo, hi;
} piece_t;

static int64_t ceil_to(int64_t v, int64_t unit)
{
    return v <= 0 ? 0 : (v + unit - 1) / unit * unit;
}

static int pieces(int64_t from, int64_t to, int hourly_only, piece_t out[3])
{
    int64_t f = ceil_to(from, 3600), t = ceil_to(to, 3600);
    int64_t d0 = ceil_to(f, 86400), d1 = t / 86400 * 86400;
    int n = 0;
    if (hourly_only || d0 >= d1) { /* PostgreSQL keeps the hourly tables only */
        if (f < t) out[n++] = (piece_t){0, f, t};
        return n;
    }
    if (f < d0) out[n++] = (piece_t){0, f, d0};
    out[n++] = (piece_t){1, d0, d1};
    if (d1 < t) out[n++] = (piece_t){0, d1, t};
    return n;
}

/* A piece's tables and time column */
static const char *sums_table(const piece_t *p)
{
    return p->daily ? "usage_daily" : "usage_hourly";
}
static const char *hist_table(const piece_t *p)
{
    return p->daily ? "usage_hist_daily" : "usage_hist";
}
static const char *time_col(const piece_t *p)
{
    return p->daily ? "day" : "hour";
}

/* Sums over [from, to) for c's tenant (NULL: all), grouped by group_expr (NULL: one group),
 * into gs (prev: the previous-period slot), piece by piece (the groups add up). 0 or -1
 * (error set). */
static int sums(stats_t *c, groups_t *gs, const char *group_expr, const char *where, int64_t from,
                int64_t to, const char *extra, int prev)
{
    piece_t pc[3];
    int n = pieces(from, to, c->pg != NULL, pc);
    gs->key_cols = group_expr != NULL;
    gs->into_prev = prev;
    for (int i = 0; i < n; i++) {
        char sql[1400], f[24], t[24];
        snprintf(
            sql, sizeof(sql),
            "SELECT %s%s" SUM_COLUMNS " FROM %s WHERE %s >= ?1 AND %s < ?2"
            " AND (CAST(?3 AS BIGINT) IS NULL OR tenant_id = ?3) AND (CAST(?4 AS TEXT) IS NULL OR %s = ?4)%s",
            group_expr ? group_expr : "", group_expr ? ", " : "", sums_table(&pc[i]),
            time_col(&pc[i]), time_col(&pc[i]), where ? where : "''",
            group_expr ? " GROUP BY 1" : "");
        fmt(f, sizeof(f), pc[i].lo);
        fmt(t, sizeof(t), pc[i].hi);
        const char *p[4] = {f, t, c->tenant, extra};
        if (stats_query(c, sql, 4, p, sums_row, gs) != 0) return -1;
    }
    return 0;
}

static cJSON *totals_json(const int64_t *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "requests", (double)s[S_REQ]);
    cJSON_AddNumberToObject(o, "errors", (double)s[S_ERR]);
    cJSON_AddNumberToObject(o, "cancelled", (double)s[S_CANC]);
    cJSON_AddNumberToObject(o, "tokens_in", (double)(s[S_IN] + s[S_CR] + s[S_CW]));
    cJSON_AddNumberToObject(o, "tokens_out", (double)s[S_OUT]);
    cJSON_AddNumberToObject(o, "input_tokens", (double)s[S_IN]);
    cJSON_AddNumberToObject(o, "cached_read_tokens", (double)s[S_CR]);
    cJSON_AddNumberToObject(o, "cache_write_tokens", (double)s[S_CW]);
    cJSON_AddNumberToObject(o, "reasoning_tokens", (double)s[S_REAS]);
    cJSON_AddNumberToObject(o, "cost_micros", (double)s[S_COST]);
    return o;
}

/* One total over [from, to) as JSON, or NULL (error set). */
static cJSON *period_json(stats_t *c, int64_t from, int64_t to, const char *col, const char *val)
{
    groups_t gs = {0};
    if (sums(c, &gs, NULL, col, from, to, val, 0) != 0) {
        free(gs.g);
        return NULL;
    }
    int64_t zero[N_SUMS] = {0};
    cJSON *o = totals_json(gs.n ? gs.g[0].s : zero);
    char b[32];
    iso(b, sizeof(b), from);
    cJSON_AddStringToObject(o, "from", b);
    free(gs.g);
    return o;
}

/* ---- /stats/overview, /stats/providers/{id} ---- */

static void periods(int64_t now, int64_t *day, int64_t *week, int64_t *month)
{
    time_t t = (time_t)now;
    struct tm tm;
    gmtime_r(&t, &tm);
    *day = now - (now % 86400);
    *week = *day - (int64_t)((tm.tm_wday + 6) % 7) * 86400; /* Monday */
    *month = *day - (int64_t)(tm.tm_mday - 1) * 86400;
}

static void overview(stats_t *c, cJSON *o)
{
    int64_t now = now_s(), day, week, month;
    periods(now, &day, &week, &month);
    const char *names[3] = {"today", "this_week", "this_month"};
    int64_t from[3] = {day, week, month};
    for (int i = 0; i < 3; i++) {
        cJSON *p = period_json(c, from[i], now + 3600, NULL, NULL);
        if (!p) {
            cJSON_Delete(o);
            return;
        }
        cJSON_AddItemToObject(o, names[i], p);
    }
    adm_set_answer(c->a, 200, o);
}

static void stats_provider(stats_t *c, const char *id)
{
    admin_t *a = c->a;
    if (!mg_config_provider(a->gen->cfg, id)) {
        adm_set_error(a, 404, "NOT_FOUND", "provider %.64s does not exist", id);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "stats.provider");
    cJSON_AddStringToObject(o, "provider", id);
    int64_t now = now_s(), day = now - now % 86400;
    const char *names[3] = {"today", "last_7_days", "last_30_days"};
    int64_t from[3] = {day, day - 6 * 86400, day - 29 * 86400};
    for (int i = 0; i < 3; i++) {
        cJSON *p = period_json(c, from[i], now + 3600, "provider_id", id);
        if (!p) {
            cJSON_Delete(o);
            return;
        }
        cJSON_AddItemToObject(o, names[i], p);
    }
    groups_t gs = {0};
    if (sums(c, &gs, "model", "provider_id", from[2], now + 3600, id, 0) != 0) {
        cJSON_Delete(o);
        free(gs.g);
        return;
    }
    cJSON *models = cJSON_AddArrayToObject(o, "models_last_30_days");
    for (int i = 0; i < gs.n; i++) {
        cJSON *m = totals_json(gs.g[i].s);
        cJSON_AddStringToObject(m, "model", gs.g[i].key);
        int64_t n = gs.g[i].s[S_REQ];
        cJSON_AddNumberToObject(m, "avg_latency_ms", n ? (double)(gs.g[i].s[S_LAT] / n) : 0);
        cJSON_AddItemToArray(models, m);
    }
    free(gs.g);
    adm_set_answer(a, 200, o);
}

/* ---- /stats/daily, /stats/tokens: series ---- */

typedef struct {
    cJSON *rows; /* array, ordered by bucket */
} series_t;

static void series_row(void *ud, int ncols, const char *const *c)
{
    series_t *s = ud;
    if (ncols < 1 + N_SUMS) return;
    int64_t v[N_SUMS];
    for (int i = 0; i < N_SUMS; i++) v[i] = c[1 + i] ? strtoll(c[1 + i], NULL, 10) : 0;
    cJSON *o = totals_json(v);
    cJSON_AddNumberToObject(o, "bucket_start", (double)strtoll(c[0] ? c[0] : "0", NULL, 10));
    cJSON_AddItemToArray(s->rows, o);
}

/* usage_tenant_hourly summed per bucket of `width` seconds (a multiple of 3600) over
 * [from, to), with empty buckets filled in (the caller bounds their count): one row per
 * hour and tenant, whatever the keys, projects, providers and models. */
static cJSON *series(stats_t *c, int64_t width, int64_t from, int64_t to)
{
    char sql[900], f[24], t[24], w[24];
    /* PostgreSQL keeps no per-tenant copy: its usage_hourly holds the same sums */
    snprintf(
        sql, sizeof(sql),
        "SELECT hour / ?4 * ?4, " SUM_COLUMNS " FROM %s WHERE hour >= ?1"
        " AND hour < ?2 AND (CAST(?3 AS BIGINT) IS NULL OR tenant_id = ?3) GROUP BY 1 ORDER BY 1",
        c->pg ? "usage_hourly" : "usage_tenant_hourly");
    fmt(f, sizeof(f), from);
    fmt(t, sizeof(t), to);
    fmt(w, sizeof(w), width);
    const char *p[4] = {f, t, c->tenant, w};
    series_t s = {cJSON_CreateArray()};
    if (stats_query(c, sql, 4, p, series_row, &s) != 0) {
        cJSON_Delete(s.rows);
        return NULL;
    }
    /* fill: one entry per bucket, in order */
    cJSON *out = cJSON_CreateArray();
    cJSON *next = s.rows->child;
    int64_t zero[N_SUMS] = {0};
    for (int64_t b = from / width * width; b < to; b += width) {
        cJSON *o;
        if (next && (int64_t)cJSON_GetObjectItem(next, "bucket_start")->valuedouble == b) {
            cJSON *cur = next;
            next = next->next;
            o = cJSON_Duplicate(cur, 1);
        } else {
            o = totals_json(zero);
            cJSON_AddNumberToObject(o, "bucket_start", (double)b);
        }
        char d[32];
        iso(d, sizeof(d), b);
        cJSON_AddStringToObject(o, "bucket", width == 86400 ? (d[10] = '\0', d) : d);
        cJSON_AddItemToArray(out, o);
    }
    cJSON_Delete(s.rows);
    return out;
}

static void stats_daily(stats_t *c)
{
    admin_t *a = c->a;
    char v[16];
    int days = 7;
    if (adm_query_param(a, "days", v, sizeof(v))) {
        days = atoi(v);
        if (strspn(v, "0123456789") != strlen(v) || days < 1 || days > 366) {
            adm_set_error(a, 400, "INVALID_REQUEST", "days must be an integer from 1 to 366");
            return;
        }
    }
    int64_t now = now_s(), today = now - now % 86400;
    cJSON *rows = series(c, 86400, today - (int64_t)(days - 1) * 86400, today + 86400);
    if (!rows) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "stats.daily");
    cJSON_AddNumberToObject(o, "days", days);
    cJSON_AddItemToObject(o, "data", rows);
    adm_set_answer(a, 200, o);
}

static void stats_tokens(stats_t *c)
{
    admin_t *a = c->a;
    char b[8] = "hour";
    adm_query_param(a, "bucket", b, sizeof(b));
    int day = strcmp(b, "day") == 0;
    if (!day && strcmp(b, "hour") != 0) {
        adm_set_error(a, 400, "INVALID_REQUEST", "bucket must be hour or day");
        return;
    }
    int64_t from, to;
    if (range_params(a, day ? 30 * 86400 : 86400, &from, &to) != 0) return;
    if (day) {
        from -= from % 86400;
        to = (to + 86399) / 86400 * 86400;
    }
    cJSON *rows = series(c, day ? 86400 : 3600, from, to);
    if (!rows) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "stats.tokens");
    cJSON_AddStringToObject(o, "bucket", day ? "day" : "hour");
    cJSON_AddNumberToObject(o, "from", (double)from);
    cJSON_AddNumberToObject(o, "to", (double)to);
    cJSON_AddItemToObject(o, "data", rows);
    adm_set_answer(a, 200, o);
}

/* ---- /usage/analytics ---- */

/* The p-th percentile (0..100) of a log2 histogram: its bin's upper bound in ms, or -1. */
static int64_t percentile(const int64_t *h, int p)
{
    int64_t n = 0, seen = 0;
    for (int b = 0; b < 25; b++) n += h[b];
    if (!n) return -1;
    int64_t rank = (n * p + 99) / 100;
    for (int b = 0; b < 25; b++)
        if ((seen += h[b]) >= rank) return mg_usage_bin_upper_ms(b);
    return mg_usage_bin_upper_ms(24);
}

static void add_ms(cJSON *o, const char *k, int64_t v)
{
    if (v < 0) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, (double)v);
}

static void add_change(cJSON *o, const char *k, int64_t now, int64_t before)
{
    if (before <= 0) cJSON_AddNullToObject(o, k);
    else cJSON_AddNumberToObject(o, k, (double)(now - before) / (double)before);
}

static cJSON *group_json(const group_t *g, const char *group_by)
{
    const int64_t *s = g->s;
    cJSON *o = totals_json(s);
    int numeric = !strcmp(group_by, "key") || !strcmp(group_by, "project");
    if (numeric && strcmp(g->key, "0") != 0)
        cJSON_AddNumberToObject(o, "group", (double)strtoll(g->key, NULL, 10));
    else if (numeric || !g->key[0]) cJSON_AddNullToObject(o, "group");
    else cJSON_AddStringToObject(o, "group", g->key);
    int64_t succeeded = s[S_REQ] - s[S_ERR] - s[S_CANC];
    if (s[S_REQ]) cJSON_AddNumberToObject(o, "success_rate", (double)succeeded / (double)s[S_REQ]);
    else cJSON_AddNullToObject(o, "success_rate");
    cJSON_AddNumberToObject(o, "cache_hits", (double)s[S_HITS]);
    cJSON_AddNumberToObject(o, "missing_usage", (double)s[S_MISS]);
    cJSON *lat = cJSON_AddObjectToObject(o, "latency_ms");
    add_ms(lat, "avg", s[S_REQ] ? s[S_LAT] / s[S_REQ] : -1);
    add_ms(lat, "p50", percentile(g->hist[0], 50));
    add_ms(lat, "p95", percentile(g->hist[0], 95));
    cJSON *tt = cJSON_AddObjectToObject(o, "ttft_ms");
    add_ms(tt, "avg", s[S_TTFTN] ? s[S_TTFT] / s[S_TTFTN] : -1);
    add_ms(tt, "p50", percentile(g->hist[1], 50));
    add_ms(tt, "p95", percentile(g->hist[1], 95));
    const int64_t *p = g->prev;
    cJSON *prev = cJSON_AddObjectToObject(o, "previous");
    cJSON_AddNumberToObject(prev, "requests", (double)p[S_REQ]);
    cJSON_AddNumberToObject(prev, "tokens", (double)(p[S_IN] + p[S_CR] + p[S_CW] + p[S_OUT]));
    cJSON_AddNumberToObject(prev, "cost_micros", (double)p[S_COST]);
    cJSON_AddNumberToObject(prev, "errors", (double)p[S_ERR]);
    cJSON *ch = cJSON_AddObjectToObject(o, "change");
    add_change(ch, "requests", s[S_REQ], p[S_REQ]);
    add_change(ch, "tokens", s[S_IN] + s[S_CR] + s[S_CW] + s[S_OUT],
               p[S_IN] + p[S_CR] + p[S_CW] + p[S_OUT]);
    add_change(ch, "cost_micros", s[S_COST], p[S_COST]);
    return o;
}

static void usage_analytics(stats_t *c)
{
    admin_t *a = c->a;
    static const char *const by[4][2] = {{"model", "model"},
                                         {"provider", "provider_id"},
                                         {"key", "key_id"},
                                         {"project", "project_id"}};
    char g[16] = "model";
    adm_query_param(a, "group_by", g, sizeof(g));
    const char *col = NULL;
    for (int i = 0; i < 4; i++)
        if (strcmp(g, by[i][0]) == 0) col = by[i][1];
    if (!col) {
        adm_set_error(a, 400, "INVALID_REQUEST",
                      "group_by must be model, provider, key or project");
        return;
    }
    int64_t from, to;
    if (range_params(a, 7 * 86400, &from, &to) != 0) return;
    int64_t len = to - from;
    groups_t gs = {0};
    if (sums(c, &gs, col, NULL, from, to, NULL, 0) != 0 ||
        sums(c, &gs, col, NULL, from - len, from, NULL, 1) != 0)
        goto out;
    piece_t pc[3];
    int n = pieces(from, to, c->pg != NULL, pc);
    for (int i = 0; i < n; i++) {
        char sql[600], f[24], t[24];
        snprintf(sql, sizeof(sql),
                 "SELECT %s, kind, bin, SUM(n) FROM %s WHERE %s >= ?1 AND %s < ?2"
                 " AND (CAST(?3 AS BIGINT) IS NULL OR tenant_id = ?3) GROUP BY 1, 2, 3",
                 col, hist_table(&pc[i]), time_col(&pc[i]), time_col(&pc[i]));
        fmt(f, sizeof(f), pc[i].lo);
        fmt(t, sizeof(t), pc[i].hi);
        const char *p[3] = {f, t, c->tenant};
        if (stats_query(c, sql, 3, p, hist_row, &gs) != 0) goto out;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "usage.analytics");
    cJSON_AddStringToObject(o, "group_by", g);
    cJSON_AddNumberToObject(o, "from", (double)from);
    cJSON_AddNumberToObject(o, "to", (double)to);
    cJSON *pp = cJSON_AddObjectToObject(o, "previous_period");
    cJSON_AddNumberToObject(pp, "from", (double)(from - len));
    cJSON_AddNumberToObject(pp, "to", (double)from);
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (int i = 0; i < gs.n; i++)
        if (gs.g[i].s[S_REQ] || gs.g[i].prev[S_REQ])
            cJSON_AddItemToArray(data, group_json(&gs.g[i], g));
    adm_set_answer(a, 200, o);
out:
    free(gs.g);
}

/* ---- /usage/events ---- */

#define EVENT_COLUMNS                                                                              \
    "seq, request_id, at_ms, endpoint, tenant_id, project_id, key_id, application, user_id,"       \
    " logical_model, actual_model, provider_id, pool, attempts, status, http_status, error_code,"  \
    " stream, input_tokens, output_tokens, cached_read_tokens, cache_write_tokens,"                \
    " reasoning_tokens, input_estimated, output_estimated, latency_ms, ttft_ms, queue_ms,"         \
    " cost_micros, price_version, degraded, cancelled"

static const char *const event_names[] = {NULL,
                                          "request_id",
                                          "at_ms",
                                          "endpoint",
                                          "tenant_id",
                                          "project_id",
                                          "key_id",
                                          "application",
                                          "user",
                                          "logical_model",
                                          "actual_model",
                                          "provider",
                                          "pool",
                                          "attempts",
                                          "status",
                                          "http_status",
                                          "error_code",
                                          "stream",
                                          "input_tokens",
                                          "output_tokens",
                                          "cached_read_tokens",
                                          "cache_write_tokens",
                                          "reasoning_tokens",
                                          "input_estimated",
                                          "output_estimated",
                                          "latency_ms",
                                          "ttft_ms",
                                          "queue_ms",
                                          "cost_micros",
                                          "price_version",
                                          "degraded",
                                          "cancelled"};
/* text columns (the rest are integers; booleans below) */
static const char text_cols[] = {0, 1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 0,
                                 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0};

typedef struct {
    cJSON *data;
    int n, limit;
    char last_seq[24]; /* the seq of the last row within the limit: the next page's cursor */
} events_t;

static void event_row(void *ud, int ncols, const char *const *c)
{
    events_t *e = ud;
    if (ncols < 32 || ++e->n > e->limit) return; /* the extra row only says there is more */
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "usage.event");
    for (int i = 1; i < 32; i++) {
        const char *k = event_names[i];
        if (!strcmp(k, "stream") || !strcmp(k, "cancelled") || strstr(k, "_estimated"))
            cJSON_AddBoolToObject(o, k, c[i] && strcmp(c[i], "0") != 0);
        else if (text_cols[i]) adm_add_str(o, k, c[i]);
        else adm_add_int(o, k, c[i]);
    }
    cJSON_AddItemToArray(e->data, o);
    snprintf(e->last_seq, sizeof(e->last_seq), "%s", c[0] ? c[0] : "0");
}

/* One integer out of a single-row query (NULL: 0 and *has 0). */
typedef struct {
    int64_t v[2];
    int has[2];
} ints_t;

static void ints_row(void *ud, int ncols, const char *const *c)
{
    ints_t *r = ud;
    for (int i = 0; i < ncols && i < 2; i++)
        if (c[i]) r->v[i] = strtoll(c[i], NULL, 10), r->has[i] = 1;
}

/* Events are written in the order their calls end and at_ms is that end, so at_ms rises with
 * seq but for the writer's few milliseconds and a clock step: a time bound taken this much
 * wider as a seq bound loses no event (the at_ms terms stay, so none is shown too many). */
#define EVENT_TIME_SLACK_MS 60000

/* seq_at on PostgreSQL, one statement (each is a connection of its own there, so no probes):
 * the least seq in [lo, hi) of an event at or after at_ms, over the at_ms or the seq index,
 * or hi. */
static int64_t seq_at_pg(stats_t *c, int64_t at_ms, int64_t lo, int64_t hi)
{
    char l[24], h[24], t[24];
    fmt(l, sizeof(l), lo);
    fmt(h, sizeof(h), hi);
    fmt(t, sizeof(t), at_ms);
    const char *p[3] = {l, h, t};
    ints_t r = {{0, 0}, {0, 0}};
    if (stats_query(c,
                    "SELECT COALESCE(min(seq), ?2) FROM usage_events WHERE seq >= ?1"
                    " AND seq < ?2 AND at_ms >= ?3",
                    3, p, ints_row, &r) != 0)
        return -1;
    return r.has[0] ? r.v[0] : hi;
}

/* The first seq in [lo, hi) whose event is at or after at_ms (hi when none): a binary search
 * over the rowid, each probe one seek, about log2(hi - lo) of them. -1 on a storage error. */
static int64_t seq_at(stats_t *c, int64_t at_ms, int64_t lo, int64_t hi)
{
    char m[24];
    const char *p[1] = {m};
    if (c->pg) return seq_at_pg(c, at_ms, lo, hi);
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        fmt(m, sizeof(m), mid);
        ints_t r = {{0, 0}, {0, 0}};
        if (stats_query(c,
                        "SELECT seq, at_ms FROM usage_events WHERE seq >= ?1 ORDER BY seq LIMIT 1",
                        1, p, ints_row, &r) != 0)
            return -1;
        if (!r.has[0] || r.v[0] >= hi || r.v[1] >= at_ms) hi = mid;
        else lo = r.v[0] + 1;
    }
    return lo;
}

/* An id filter: "0" is the events without one (the analytics' group null). */
static void id_term(mg_sqlq_t *q, const char *col_eq, const char *col_null, const char *v)
{
    if (!strcmp(v, "0")) mg_sqlq_and(q, col_null, NULL);
    else mg_sqlq_and(q, col_eq, v);
}

static int known_status(const char *s)
{
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled") ||
           !strcmp(s, "timed_out");
}

/* The newest events matching the filters given, a page of them, newest first.
 *
 * The statement holds only the filters given (store/sqlq.h) and walks seq, the rowid, newest
 * first: a filter that matches often stops after limit + 1 rows. A time range becomes a seq
 * range (seq_at), so a filter that matches rarely reads only the events of its range. No
 * index is kept for the filters: each costs the metering insert an index entry and page
 * per commit (a partial one of the events that did not succeed cost +6k instructions per
 * request, bench/README.md). Instead a page examines at most ?scan events (EVENTS_SCAN,
 * the worst case: bench/README.md); when those hold fewer matches than a page, the page
 * is short, has_more is true and next_cursor goes on below them. */
#define EVENTS_SCAN 100000

/* The listing's parameters, checked (NULL / 0: not given). */
typedef struct {
    const char *tenant, *rid;
    int hf;
    int64_t from;
    int ht;
    int64_t to;
    const char *cursor, *key, *proj, *status;
    int limit, scan;
} events_args_t;

static void events_read(stats_t *c, const events_args_t *g);

static void usage_events(admin_t *a, const char *tenant, mg_pg_t *pg)
{
    char key[24], proj[24], status[16], cursor[24], lim[8], rid[80], scan_s[16];
    int64_t from = 0, to = 0;
    int hf = time_param(a, "from", &from), ht = time_param(a, "to", &to);
    if (hf < 0 || ht < 0) return;
    int hk = adm_query_id(a, "key_id", key, sizeof(key));
    if (hk < 0) return;
    int hj = adm_query_id(a, "project_id", proj, sizeof(proj));
    if (hj < 0) return;
    int hc = adm_query_id(a, "cursor", cursor, sizeof(cursor));
    if (hc < 0) return;
    int hs = adm_query_param(a, "status", status, sizeof(status));
    if (hs && !known_status(status)) {
        adm_set_error(a, 400, "INVALID_REQUEST",
                      "status must be succeeded, failed, cancelled or timed_out");
        return;
    }
    int limit = 50, scan = EVENTS_SCAN;
    if (adm_query_param(a, "limit", lim, sizeof(lim))) {
        limit = atoi(lim);
        if (strspn(lim, "0123456789") != strlen(lim) || limit < 1 || limit > 1000) {
            adm_set_error(a, 400, "INVALID_REQUEST", "limit must be an integer from 1 to 1000");
            return;
        }
    }
    if (adm_query_param(a, "scan", scan_s, sizeof(scan_s))) {
        scan = atoi(scan_s);
        if (strspn(scan_s, "0123456789") != strlen(scan_s) || scan < 1 || scan > EVENTS_SCAN) {
            adm_set_error(a, 400, "INVALID_REQUEST", "scan must be an integer from 1 to %d",
                          EVENTS_SCAN);
            return;
        }
    }
    int hr = adm_query_param(a, "request_id", rid, sizeof(rid));
    char err[256];
    stats_t c = {a, tenant, NULL, pg};
    /* one connection for all the queries below (the binary searches' probes) */
    if (!pg && !(c.rd = mg_store_read_open(a->store, err, sizeof(err)))) {
        adm_storage_error(a, err);
        return;
    }
    events_read(&c, &(events_args_t){tenant, hr ? rid : NULL, hf, from, ht, to, hc ? cursor : NULL,
                                     hk ? key : NULL, hj ? proj : NULL, hs ? status : NULL, limit,
                                     scan});
    if (c.rd) mg_store_read_close(c.rd);
}

/* The page of usage_events for args on rd; the answer or the error set. */
static void events_read(stats_t *c, const events_args_t *g)
{
    admin_t *a = c->a;
    char model[160], prov[160], n[16], f[24], t[24], lo_s[24], hi_s[24];
    const char *tenant = g->tenant, *rid = g->rid, *key = g->key, *proj = g->proj,
               *status = g->status;
    int hr = rid != NULL, hf = g->hf, ht = g->ht, hk = key != NULL, hj = proj != NULL,
        hs = status != NULL, limit = g->limit, scan = g->scan;
    int64_t from = g->from, to = g->to;

    /* the seq range to read: [lo, hi) */
    ints_t mm = {{0, 0}, {0, 0}};
    if (stats_query(c,
                    "SELECT (SELECT min(seq) FROM usage_events),"
                    " (SELECT max(seq) FROM usage_events)",
                    0, NULL, ints_row, &mm) != 0)
        return;
    int64_t lo = mm.v[0], hi = mm.has[1] ? mm.v[1] + 1 : 0;
    if (g->cursor) {
        int64_t cur = strtoll(g->cursor, NULL, 10);
        if (cur < hi) hi = cur;
    }
    if (hf && lo < hi && (lo = seq_at(c, from * 1000 - EVENT_TIME_SLACK_MS, lo, hi)) < 0) return;
    if (ht && lo < hi && (hi = seq_at(c, to * 1000 + EVENT_TIME_SLACK_MS, lo, hi)) < 0) return;
    /* one request is found by its unique index, wherever it is: no window */
    int windowed = !hr;
    int64_t win_lo = windowed && hi - lo > scan ? hi - scan : lo;

    mg_sqlq_t q;
    mg_sqlq_init(&q, "SELECT " EVENT_COLUMNS " FROM usage_events");
    fmt(lo_s, sizeof(lo_s), win_lo);
    fmt(hi_s, sizeof(hi_s), hi);
    mg_sqlq_and(&q, "seq >= ?", lo_s);
    mg_sqlq_and(&q, "seq < ?", hi_s);
    if (tenant) mg_sqlq_and(&q, "tenant_id = ?", tenant);
    if (hr) mg_sqlq_and(&q, "request_id = ?", rid);
    if (hf) fmt(f, sizeof(f), from * 1000), mg_sqlq_and(&q, "at_ms >= ?", f);
    if (ht) fmt(t, sizeof(t), to * 1000), mg_sqlq_and(&q, "at_ms < ?", t);
    if (hk) id_term(&q, "key_id = ?", "key_id IS NULL", key);
    if (hj) id_term(&q, "project_id = ?", "project_id IS NULL", proj);
    if (adm_query_param(a, "model", model, sizeof(model)))
        mg_sqlq_and(&q, "logical_model = ?", model);
    if (adm_query_param(a, "provider", prov, sizeof(prov)))
        mg_sqlq_and(&q, "provider_id = ?", prov);
    if (hs) mg_sqlq_and(&q, "status = ?", status);
    snprintf(n, sizeof(n), "%d", limit + 1);
    mg_sqlq_tail(&q, " ORDER BY seq DESC LIMIT ?", n);

    events_t e = {cJSON_CreateArray(), 0, limit, ""};
    if (!mg_sqlq_ok(&q)) {
        cJSON_Delete(e.data);
        adm_set_error(a, 500, "INTERNAL_ERROR", "the events query did not fit");
        return;
    }
    if (lo < hi && stats_query(c, q.sql, q.nparams, q.params, event_row, &e) != 0) {
        cJSON_Delete(e.data);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", e.data);
    /* more: the page is full, or the window stopped above the range's oldest event */
    int more = e.n > limit || (lo < hi && win_lo > lo);
    cJSON_AddBoolToObject(o, "has_more", more);
    if (e.n > limit) cJSON_AddStringToObject(o, "next_cursor", e.last_seq);
    else if (more) cJSON_AddStringToObject(o, "next_cursor", lo_s);
    else cJSON_AddNullToObject(o, "next_cursor");
    adm_set_answer(a, 200, o);
}

/* ---- routing ---- */

int adm_stats_route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    int stats = strcmp(coll, "stats") == 0;
    int usage =
        strcmp(coll, "usage") == 0 && id && (!strcmp(id, "analytics") || !strcmp(id, "events"));
    if (!stats && !usage) return 0;
    if (a->method != HTTP_GET) {
        a->action = "stats.invalid";
        adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "use GET");
        return 1;
    }
    char tb[24];
    const char *tenant;
    a->action = usage ? (id[0] == 'a' ? "usage.analytics" : "usage.events") : "stats.read";
    if (tenant_filter(a, tb, sizeof(tb), &tenant) != 0) return 1;
    /* the roll-ups are written once a second; a read first has the writer write what is
     * pending (this is the worker thread), so it sees every committed event; the turn
     * drains the usage journal first (store.h), so every answered request's event too */
    mg_store_sync_aggs(a->store);
    /* with cluster.postgres the cluster's figures are read there; this instance's own events
     * still queued for it are sent first (bounded: PostgreSQL away must not hold the worker;
     * the read then fails with 503 anyway) */
    mg_pg_t *pg = mg_store_pg(a->store);
    if (pg) mg_pg_flush(pg, 2000);
    if (usage && !verb && id[0] == 'e') {
        usage_events(a, tenant, pg);
        return 1;
    }
    char err[256];
    stats_t c = {a, tenant, NULL, pg};
    if (!pg && !(c.rd = mg_store_read_open(a->store, err, sizeof(err)))) {
        adm_storage_error(a, err);
        return 1;
    }
    /* one read transaction: every query of the answer sees the same roll-ups (the close
     * ends it); on PostgreSQL each query is its own statement */
    if (!pg && mg_store_read_query(c.rd, "BEGIN", 0, NULL, NULL, NULL, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
    } else if (usage && !verb) {
        usage_analytics(&c);
    } else if (stats && id && !strcmp(id, "overview") && !verb) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "stats.overview");
        overview(&c, o);
    } else if (stats && id && !strcmp(id, "daily") && !verb) {
        stats_daily(&c);
    } else if (stats && id && !strcmp(id, "tokens") && !verb) {
        stats_tokens(&c);
    } else if (stats && id && !strcmp(id, "providers") && verb) {
        snprintf(a->target, sizeof(a->target), "provider:%.64s", verb);
        stats_provider(&c, verb);
    } else {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    }
    if (c.rd) mg_store_read_close(c.rd);
    return 1;
}
