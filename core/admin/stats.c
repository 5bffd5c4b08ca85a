/* stats: the usage analytics of the admin API, on the worker thread, read from the roll-ups
 * (usage_hourly, usage_hist: O(buckets), never the raw events) except the event list.
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
 *   GET /api/v2/usage/events?from=&to=&key_id=&project_id=&model=&provider=&status=&cursor=&limit=
 *                                              the raw events, newest first, cursor-paginated
 *                                              (never a prompt or an answer: none is stored);
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
#include "obs/usage.h"

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

/* ---- sums over usage_hourly ---- */

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

/* Sums of usage_hourly over [from, to) for the tenant (NULL: all), grouped by group_expr
 * (NULL: one group), into gs (prev: the previous-period slot). 0 or -1 (error set). */
static int sums(admin_t *a, groups_t *gs, const char *group_expr, const char *where, int64_t from,
                int64_t to, const char *tenant, const char *extra, int prev)
{
    char sql[1400], f[24], t[24], err[256];
    snprintf(sql, sizeof(sql),
             "SELECT %s%s" SUM_COLUMNS " FROM usage_hourly WHERE hour >= ?1 AND hour < ?2"
             " AND (?3 IS NULL OR tenant_id = ?3) AND (?4 IS NULL OR %s = ?4)%s%s",
             group_expr ? group_expr : "", group_expr ? ", " : "", where ? where : "1", "",
             group_expr ? " GROUP BY 1" : "");
    fmt(f, sizeof(f), from);
    fmt(t, sizeof(t), to);
    const char *p[4] = {f, t, tenant, extra};
    gs->key_cols = group_expr != NULL;
    gs->into_prev = prev;
    if (mg_store_query(a->store, sql, 4, p, sums_row, gs, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
        return -1;
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
static cJSON *period_json(admin_t *a, int64_t from, int64_t to, const char *tenant, const char *col,
                          const char *val)
{
    groups_t gs = {0};
    if (sums(a, &gs, NULL, col, from, to, tenant, val, 0) != 0) {
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

static void overview(admin_t *a, const char *tenant, const char *col, const char *val, cJSON *o)
{
    int64_t now = now_s(), day, week, month;
    periods(now, &day, &week, &month);
    const char *names[3] = {"today", "this_week", "this_month"};
    int64_t from[3] = {day, week, month};
    for (int i = 0; i < 3; i++) {
        cJSON *p = period_json(a, from[i], now + 3600, tenant, col, val);
        if (!p) {
            cJSON_Delete(o);
            return;
        }
        cJSON_AddItemToObject(o, names[i], p);
    }
    adm_set_answer(a, 200, o);
}

static void stats_provider(admin_t *a, const char *tenant, const char *id)
{
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
        cJSON *p = period_json(a, from[i], now + 3600, tenant, "provider_id", id);
        if (!p) {
            cJSON_Delete(o);
            return;
        }
        cJSON_AddItemToObject(o, names[i], p);
    }
    groups_t gs = {0};
    if (sums(a, &gs, "model", "provider_id", from[2], now + 3600, tenant, id, 0) != 0) {
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

/* Rows of usage_hourly summed per bucket of `width` seconds over [from, to), with empty
 * buckets filled in (the caller bounds their count). */
static cJSON *series(admin_t *a, int64_t width, int64_t from, int64_t to, const char *tenant)
{
    char sql[900], f[24], t[24], w[24], err[256];
    snprintf(sql, sizeof(sql),
             "SELECT hour / ?4 * ?4, " SUM_COLUMNS " FROM usage_hourly WHERE hour >= ?1"
             " AND hour < ?2 AND (?3 IS NULL OR tenant_id = ?3) GROUP BY 1 ORDER BY 1");
    fmt(f, sizeof(f), from);
    fmt(t, sizeof(t), to);
    fmt(w, sizeof(w), width);
    const char *p[4] = {f, t, tenant, w};
    series_t s = {cJSON_CreateArray()};
    if (mg_store_query(a->store, sql, 4, p, series_row, &s, err, sizeof(err)) != 0) {
        cJSON_Delete(s.rows);
        adm_storage_error(a, err);
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

static void stats_daily(admin_t *a, const char *tenant)
{
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
    cJSON *rows = series(a, 86400, today - (int64_t)(days - 1) * 86400, today + 86400, tenant);
    if (!rows) return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "stats.daily");
    cJSON_AddNumberToObject(o, "days", days);
    cJSON_AddItemToObject(o, "data", rows);
    adm_set_answer(a, 200, o);
}

static void stats_tokens(admin_t *a, const char *tenant)
{
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
    cJSON *rows = series(a, day ? 86400 : 3600, from, to, tenant);
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

static void usage_analytics(admin_t *a, const char *tenant)
{
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
    char sql[600], f[24], t[24], err[256];
    if (sums(a, &gs, col, NULL, from, to, tenant, NULL, 0) != 0 ||
        sums(a, &gs, col, NULL, from - len, from, tenant, NULL, 1) != 0)
        goto out;
    snprintf(sql, sizeof(sql),
             "SELECT %s, kind, bin, SUM(n) FROM usage_hist WHERE hour >= ?1 AND hour < ?2"
             " AND (?3 IS NULL OR tenant_id = ?3) GROUP BY 1, 2, 3",
             col);
    fmt(f, sizeof(f), from);
    fmt(t, sizeof(t), to);
    const char *p[3] = {f, t, tenant};
    if (mg_store_query(a->store, sql, 3, p, hist_row, &gs, err, sizeof(err)) != 0) {
        adm_storage_error(a, err);
        goto out;
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

static void usage_events(admin_t *a, const char *tenant)
{
    char key[24], proj[24], model[160], prov[160], status[16], cursor[24], lim[8], f[24], t[24],
        n[16];
    const char *p[10] = {tenant};
    int64_t from = 0, to = 0;
    int hf = time_param(a, "from", &from), ht = time_param(a, "to", &to);
    if (hf < 0 || ht < 0) return;
    int hk = adm_query_id(a, "key_id", key, sizeof(key));
    if (hk < 0) return;
    int hj = adm_query_id(a, "project_id", proj, sizeof(proj));
    if (hj < 0) return;
    int hc = adm_query_id(a, "cursor", cursor, sizeof(cursor));
    if (hc < 0) return;
    if (hf) fmt(f, sizeof(f), from * 1000), p[1] = f;
    if (ht) fmt(t, sizeof(t), to * 1000), p[2] = t;
    if (hk) p[3] = key;
    if (adm_query_param(a, "model", model, sizeof(model))) p[4] = model;
    if (adm_query_param(a, "status", status, sizeof(status))) p[5] = status;
    if (hc) p[6] = cursor;
    if (hj) p[8] = proj;
    if (adm_query_param(a, "provider", prov, sizeof(prov))) p[9] = prov;
    int limit = 50;
    if (adm_query_param(a, "limit", lim, sizeof(lim))) {
        limit = atoi(lim);
        if (strspn(lim, "0123456789") != strlen(lim) || limit < 1 || limit > 1000) {
            adm_set_error(a, 400, "INVALID_REQUEST", "limit must be an integer from 1 to 1000");
            return;
        }
    }
    snprintf(n, sizeof(n), "%d", limit + 1);
    p[7] = n;
    events_t e = {cJSON_CreateArray(), 0, limit, ""};
    char err[256];
    if (mg_store_query(
            a->store,
            "SELECT " EVENT_COLUMNS " FROM usage_events WHERE (?1 IS NULL OR tenant_id = ?1)"
            " AND (?2 IS NULL OR at_ms >= ?2) AND (?3 IS NULL OR at_ms < ?3)"
            " AND (?4 IS NULL OR COALESCE(key_id, 0) = CAST(?4 AS INTEGER))"
            " AND (?9 IS NULL OR COALESCE(project_id, 0) = CAST(?9 AS INTEGER))"
            " AND (?5 IS NULL OR logical_model = ?5) AND (?10 IS NULL OR provider_id = ?10)"
            " AND (?6 IS NULL OR status = ?6) AND (?7 IS NULL OR seq < ?7)"
            " ORDER BY seq DESC LIMIT ?8",
            10, p, event_row, &e, err, sizeof(err)) != 0) {
        cJSON_Delete(e.data);
        adm_storage_error(a, err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddItemToObject(o, "data", e.data);
    cJSON_AddBoolToObject(o, "has_more", e.n > limit);
    if (e.n > limit) cJSON_AddStringToObject(o, "next_cursor", e.last_seq);
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
    if (usage && !verb) {
        if (id[0] == 'a') usage_analytics(a, tenant);
        else usage_events(a, tenant);
    } else if (stats && id && !strcmp(id, "overview") && !verb) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "stats.overview");
        overview(a, tenant, NULL, NULL, o);
    } else if (stats && id && !strcmp(id, "daily") && !verb) {
        stats_daily(a, tenant);
    } else if (stats && id && !strcmp(id, "tokens") && !verb) {
        stats_tokens(a, tenant);
    } else if (stats && id && !strcmp(id, "providers") && verb) {
        snprintf(a->target, sizeof(a->target), "provider:%.64s", verb);
        stats_provider(a, tenant, verb);
    } else {
        a->action = "admin.unknown";
        adm_set_error(a, 404, "NOT_FOUND", "no such admin endpoint");
    }
    return 1;
}
