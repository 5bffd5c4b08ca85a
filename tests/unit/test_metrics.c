/* Unit tests for core/obs/metrics.c: the rendered text is checked line by line against the
 * Prometheus text exposition grammar (0.0.4) and its rules: HELP/TYPE before a family's
 * samples, a family's samples contiguous, no duplicate series, histogram buckets
 * cumulative with le ascending and le="+Inf" equal to _count. Then the numbers. */
#include "conf/config.h"
#include "obs/metrics.h"
#include "mgtest.h"
#include "route/pool.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a small exposition-format parser ------------------------------------------------ */

#define MAX_LABELS 8
#define MAX_FAMILIES 160
#define MAX_SERIES 4096

typedef struct {
    char name[128];
    int n_labels;
    char lname[MAX_LABELS][64];
    char lvalue[MAX_LABELS][128];
    double value;
} sample_t;

typedef struct {
    char name[128];
    char type[16];
    int has_help, has_type, has_samples, closed;
} family_t;

typedef struct {
    family_t fam[MAX_FAMILIES];
    int n_fam;
    sample_t s[MAX_SERIES];
    int n_s;
    int errors;
    int current; /* family index of the last sample, -1 none */
} expo_t;

static void expo_error(expo_t *e, int lineno, const char *line, const char *why)
{
    fprintf(stderr, "  metrics line %d: %s: %s\n", lineno, why, line);
    e->errors++;
}

static int name_start(int c)
{
    return isalpha(c) || c == '_' || c == ':';
}
static int name_char(int c)
{
    return isalnum(c) || c == '_' || c == ':';
}

/* Parse a metric name at *p; returns its length or 0. */
static size_t parse_name(const char *p, int allow_colon)
{
    size_t n = 0;
    if (!name_start((unsigned char)p[0]) || (!allow_colon && p[0] == ':')) return 0;
    while (name_char((unsigned char)p[n]) && (allow_colon || p[n] != ':')) n++;
    return n;
}

/* Prometheus accepts Go float syntax plus NaN, +Inf, -Inf. */
static int parse_value(const char *s, double *out)
{
    if (strcmp(s, "+Inf") == 0) {
        *out = INFINITY;
        return 0;
    }
    if (strcmp(s, "-Inf") == 0) {
        *out = -INFINITY;
        return 0;
    }
    if (strcmp(s, "NaN") == 0) {
        *out = NAN;
        return 0;
    }
    if (!*s || isspace((unsigned char)*s)) return -1;
    char *end;
    *out = strtod(s, &end);
    return *end == '\0' ? 0 : -1;
}

static family_t *family_get(expo_t *e, const char *name, int create)
{
    for (int i = 0; i < e->n_fam; i++)
        if (strcmp(e->fam[i].name, name) == 0) return &e->fam[i];
    if (!create || e->n_fam == MAX_FAMILIES) return NULL;
    family_t *f = &e->fam[e->n_fam++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    return f;
}

/* The family a sample belongs to: histogram samples carry a suffix. */
static family_t *family_of_sample(expo_t *e, const char *name)
{
    family_t *f = family_get(e, name, 0);
    if (f) return f;
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(name), sl = strlen(suffixes[i]);
        if (n > sl && strcmp(name + n - sl, suffixes[i]) == 0) {
            char base[128];
            snprintf(base, sizeof(base), "%.*s", (int)(n - sl), name);
            f = family_get(e, base, 0);
            if (f && strcmp(f->type, "histogram") == 0) return f;
        }
    }
    return NULL;
}

static void parse_comment(expo_t *e, int lineno, const char *line)
{
    int is_help = strncmp(line, "# HELP ", 7) == 0;
    int is_type = strncmp(line, "# TYPE ", 7) == 0;
    if (!is_help && !is_type) return; /* a plain comment */
    const char *p = line + 7;
    size_t n = parse_name(p, 1);
    if (n == 0) {
        expo_error(e, lineno, line, "bad metric name in HELP/TYPE");
        return;
    }
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)n, p);
    p += n;
    family_t *f = family_get(e, name, 1);
    if (!f) {
        expo_error(e, lineno, line, "too many families");
        return;
    }
    if (f->has_samples) expo_error(e, lineno, line, "HELP/TYPE after the family's samples");
    if (is_help) {
        if (f->has_help) expo_error(e, lineno, line, "second HELP");
        f->has_help = 1;
        if (*p != ' ' || p[1] == '\0') expo_error(e, lineno, line, "HELP without text");
        return;
    }
    if (f->has_type) expo_error(e, lineno, line, "second TYPE");
    f->has_type = 1;
    if (*p != ' ') {
        expo_error(e, lineno, line, "TYPE without type");
        return;
    }
    p++;
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    int ok = 0;
    for (int i = 0; i < 5; i++) ok |= strcmp(p, types[i]) == 0;
    if (!ok) expo_error(e, lineno, line, "unknown TYPE");
    snprintf(f->type, sizeof(f->type), "%s", p);
}

static void parse_sample(expo_t *e, int lineno, const char *line)
{
    if (e->n_s == MAX_SERIES) {
        expo_error(e, lineno, line, "too many samples");
        return;
    }
    sample_t *s = &e->s[e->n_s];
    memset(s, 0, sizeof(*s));
    const char *p = line;
    size_t n = parse_name(p, 1);
    if (n == 0 || n >= sizeof(s->name)) {
        expo_error(e, lineno, line, "bad metric name");
        return;
    }
    memcpy(s->name, p, n);
    p += n;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            size_t ln = parse_name(p, 0);
            if (ln == 0 || ln >= 64 || s->n_labels == MAX_LABELS) {
                expo_error(e, lineno, line, "bad label name");
                return;
            }
            memcpy(s->lname[s->n_labels], p, ln);
            p += ln;
            if (p[0] != '=' || p[1] != '"') {
                expo_error(e, lineno, line, "label without =\"value\"");
                return;
            }
            p += 2;
            size_t vl = 0;
            while (*p && *p != '"') {
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != '"' && p[1] != 'n') {
                        expo_error(e, lineno, line, "bad escape in label value");
                        return;
                    }
                    p++;
                }
                if (*p == '\n' || vl + 1 >= 128) {
                    expo_error(e, lineno, line, "bad label value");
                    return;
                }
                s->lvalue[s->n_labels][vl++] = *p++;
            }
            if (*p != '"') {
                expo_error(e, lineno, line, "unterminated label value");
                return;
            }
            p++;
            for (int k = 0; k < s->n_labels; k++)
                if (strcmp(s->lname[k], s->lname[s->n_labels]) == 0)
                    expo_error(e, lineno, line, "repeated label name");
            s->n_labels++;
            if (*p == ',') p++;
            else if (*p != '}') {
                expo_error(e, lineno, line, "expected , or }");
                return;
            }
        }
        p++;
    }
    if (*p != ' ') {
        expo_error(e, lineno, line, "no single space before the value");
        return;
    }
    p++;
    char val[64];
    const char *sp = strchr(p, ' ');
    size_t vlen = sp ? (size_t)(sp - p) : strlen(p);
    if (vlen == 0 || vlen >= sizeof(val)) {
        expo_error(e, lineno, line, "bad value");
        return;
    }
    memcpy(val, p, vlen);
    val[vlen] = '\0';
    if (parse_value(val, &s->value) != 0) {
        expo_error(e, lineno, line, "value is not a float");
        return;
    }
    if (sp) { /* optional integer timestamp */
        char *end;
        strtoll(sp + 1, &end, 10);
        if (*end != '\0' || end == sp + 1) expo_error(e, lineno, line, "bad timestamp");
    }
    family_t *f = family_of_sample(e, s->name);
    if (!f || !f->has_type) {
        expo_error(e, lineno, line, "sample without a TYPE line before it");
    } else {
        if (!f->has_help) expo_error(e, lineno, line, "sample without a HELP line before it");
        int idx = (int)(f - e->fam);
        if (f->closed) expo_error(e, lineno, line, "family's samples are not contiguous");
        if (e->current >= 0 && e->current != idx) e->fam[e->current].closed = 1;
        e->current = idx;
        f->has_samples = 1;
        if (strcmp(f->type, "counter") == 0 && s->value < 0)
            expo_error(e, lineno, line, "negative counter");
    }
    /* the same series (name + labels) must not appear twice */
    for (int i = 0; i < e->n_s; i++) {
        sample_t *o = &e->s[i];
        if (strcmp(o->name, s->name) || o->n_labels != s->n_labels) continue;
        int same = 1;
        for (int k = 0; k < s->n_labels && same; k++) {
            int found = 0;
            for (int j = 0; j < o->n_labels; j++)
                found |= !strcmp(o->lname[j], s->lname[k]) && !strcmp(o->lvalue[j], s->lvalue[k]);
            same = found;
        }
        if (same) expo_error(e, lineno, line, "duplicate series");
    }
    e->n_s++;
}

static void expo_parse(expo_t *e, const char *text, size_t len)
{
    memset(e, 0, sizeof(*e));
    e->current = -1;
    if (len == 0 || text[len - 1] != '\n') {
        fprintf(stderr, "  metrics text does not end with a newline\n");
        e->errors++;
    }
    if (strlen(text) != len) {
        fprintf(stderr, "  metrics text length mismatch / embedded NUL\n");
        e->errors++;
    }
    int lineno = 0;
    const char *p = text;
    while (p < text + len) {
        const char *nl = memchr(p, '\n', (size_t)(text + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(text + len - p);
        char line[512];
        lineno++;
        if (n >= sizeof(line)) {
            expo_error(e, lineno, "(long)", "line too long");
        } else {
            memcpy(line, p, n);
            line[n] = '\0';
            if (n == 0) expo_error(e, lineno, line, "empty line");
            else if (line[0] == '#') parse_comment(e, lineno, line);
            else parse_sample(e, lineno, line);
        }
        p += n + 1;
    }
}

static const char *label(const sample_t *s, const char *name)
{
    for (int i = 0; i < s->n_labels; i++)
        if (strcmp(s->lname[i], name) == 0) return s->lvalue[i];
    return NULL;
}

/* Labels of s other than le, as one comparable string. */
static void label_key(const sample_t *s, char *out, size_t cap)
{
    out[0] = '\0';
    size_t off = 0;
    for (int i = 0; i < s->n_labels; i++) {
        if (strcmp(s->lname[i], "le") == 0) continue;
        off += (size_t)snprintf(out + off, cap - off, "%s=%s;", s->lname[i], s->lvalue[i]);
        if (off >= cap) break;
    }
}

/* Histogram rules for every series of every histogram family. Returns the number of
 * histogram series checked. */
static int check_histograms(expo_t *e)
{
    int series = 0;
    for (int f = 0; f < e->n_fam; f++) {
        if (strcmp(e->fam[f].type, "histogram") != 0) continue;
        char bucket[160], sum[160], count[160];
        snprintf(bucket, sizeof(bucket), "%s_bucket", e->fam[f].name);
        snprintf(sum, sizeof(sum), "%s_sum", e->fam[f].name);
        snprintf(count, sizeof(count), "%s_count", e->fam[f].name);
        /* each distinct label set seen in _count */
        for (int i = 0; i < e->n_s; i++) {
            if (strcmp(e->s[i].name, count) != 0) continue;
            series++;
            char key[256];
            label_key(&e->s[i], key, sizeof(key));
            double prev_le = -INFINITY, prev_v = -1, inf_v = -1;
            int n_buckets = 0, has_sum = 0, order_ok = 1, cumulative = 1;
            for (int j = 0; j < e->n_s; j++) {
                char k2[256];
                label_key(&e->s[j], k2, sizeof(k2));
                if (strcmp(k2, key) != 0) continue;
                if (strcmp(e->s[j].name, sum) == 0) has_sum = 1;
                if (strcmp(e->s[j].name, bucket) != 0) continue;
                const char *le = label(&e->s[j], "le");
                double lev;
                CHECK(le != NULL);
                if (!le || parse_value(le, &lev) != 0) {
                    CHECK(!"le label is a float");
                    continue;
                }
                n_buckets++;
                if (!(lev > prev_le)) order_ok = 0;
                if (e->s[j].value < prev_v) cumulative = 0;
                prev_le = lev;
                prev_v = e->s[j].value;
                if (isinf(lev)) inf_v = e->s[j].value;
            }
            if (!order_ok || !cumulative || inf_v != e->s[i].value || !has_sum)
                fprintf(stderr,
                        "  histogram %s{%s}: order %d cumulative %d +Inf %g count %g sum %d\n",
                        e->fam[f].name, key, order_ok, cumulative, inf_v, e->s[i].value, has_sum);
            CHECK(n_buckets >= 2);
            CHECK(order_ok);
            CHECK(cumulative);
            CHECK(isinf(prev_le)); /* the last bucket is +Inf */
            CHECK(inf_v == e->s[i].value);
            CHECK(has_sum);
        }
    }
    return series;
}

static const sample_t *find(const expo_t *e, const char *name, const char *l1, const char *v1,
                            const char *l2, const char *v2)
{
    for (int i = 0; i < e->n_s; i++) {
        const sample_t *s = &e->s[i];
        if (strcmp(s->name, name) != 0) continue;
        if (l1 && (!label(s, l1) || strcmp(label(s, l1), v1) != 0)) continue;
        if (l2 && (!label(s, l2) || strcmp(label(s, l2), v2) != 0)) continue;
        return s;
    }
    return NULL;
}

static double value_of(const expo_t *e, const char *name, const char *l1, const char *v1,
                       const char *l2, const char *v2)
{
    const sample_t *s = find(e, name, l1, v1, l2, v2);
    if (!s)
        fprintf(stderr, "  missing sample %s{%s=%s,%s=%s}\n", name, l1 ? l1 : "", v1 ? v1 : "",
                l2 ? l2 : "", v2 ? v2 : "");
    return s ? s->value : NAN;
}

/* ---- tests ---------------------------------------------------------------------------- */

static expo_t E; /* big: keep off the stack */

static mg_config_t *two_providers(void)
{
    static const char yaml[] = "providers:\n"
                               "  - id: local-vllm\n    adapter: openai\n"
                               "    base_url: http://127.0.0.1:8001/v1\n"
                               "  - id: cloud.b_2\n    adapter: openai\n"
                               "    base_url: http://127.0.0.1:8002/v1\n"
                               "models:\n"
                               "  m:\n    routes: [ { provider: local-vllm, model: x } ]\n";
    char err[256];
    mg_config_t *cfg = NULL;
    if (mg_config_parse("m.yaml", yaml, sizeof(yaml) - 1, &cfg, err, sizeof(err)) != 0)
        fprintf(stderr, "config: %s\n", err);
    return cfg;
}

static void test_render_empty_is_valid(void)
{
    mg_metrics_t m;
    memset(&m, 0, sizeof(m));
    mg_pool_t pool;
    mg_pool_init(&pool);
    char *out = NULL;
    size_t len = 0;
    CHECK_EQ_INT(mg_metrics_render(&m, &pool, 0, 1, 1000, &out, &len), 0);
    CHECK(out != NULL);
    if (!out) return;
    expo_parse(&E, out, len);
    CHECK_EQ_INT(E.errors, 0);
    /* the first-token and loop-busy histograms are always rendered; the labelled ones have
       their HELP and TYPE but no series yet */
    CHECK_EQ_INT(check_histograms(&E), 2);
    family_t *qt = family_get(&E, "moongate_queue_time_seconds", 0);
    CHECK(qt && qt->has_help && strcmp(qt->type, "histogram") == 0 && !qt->has_samples);
    CHECK(value_of(&E, "moongate_loop_busy_max_seconds", NULL, NULL, NULL, NULL) == 0);
    CHECK(value_of(&E, "moongate_generation", NULL, NULL, NULL, NULL) == 1);
    CHECK(value_of(&E, "moongate_first_token_seconds_count", NULL, NULL, NULL, NULL) == 0);
    /* every family name has the moongate_ prefix, sidecar_ for the Sidecar ADR names or
       gen_ai_ for the OpenTelemetry GenAI conventions */
    for (int i = 0; i < E.n_fam; i++)
        CHECK(strncmp(E.fam[i].name, "moongate_", 9) == 0 ||
              strncmp(E.fam[i].name, "sidecar_", 8) == 0 ||
              strncmp(E.fam[i].name, "gen_ai_", 7) == 0);
    free(out);
    mg_pool_free(&pool);
}

static void test_render_full_is_valid_and_correct(void)
{
    mg_metrics_t m;
    memset(&m, 0, sizeof(m));
    mg_metrics_request(&m, MG_EP_CHAT, 200, 0.003);
    mg_metrics_request(&m, MG_EP_CHAT, 200, 0.2);
    mg_metrics_request(&m, MG_EP_CHAT, 503, 1.0);   /* exactly on a bucket bound */
    mg_metrics_request(&m, MG_EP_CHAT, 429, 500.0); /* beyond every finite bucket */
    mg_metrics_request(&m, MG_EP_EMBEDDINGS, 200, 0.05);
    mg_metrics_request(&m, MG_EP_MODELS, 404, 0.0001);
    mg_metrics_request(&m, MG_EP_OTHER, 100, 0.01);
    mg_metrics_ttft(&m, 0.3);
    mg_metrics_ttft(&m, 7.0);
    m.cancelled_total = 3;
    m.stream_errors_total = 2;
    m.tokens_prompt_total = 1234;
    m.tokens_completion_total = 567;
    m.reloads_ok = 4;
    m.reloads_failed = 1;
    mg_metrics_loop_busy(&m, 30000);     /* 30 us: in every bucket */
    mg_metrics_loop_busy(&m, 1000000);   /* 1 ms: exactly on a bound */
    mg_metrics_loop_busy(&m, 7500000);   /* 7.5 ms */
    mg_metrics_loop_busy(&m, 250000000); /* 250 ms: beyond every finite bucket */
    m.cancelled_by[MG_CANCEL_CLIENT_STALLED] = 6;
    m.conns[MG_LISTENER_API].open = 12;
    m.conns[MG_LISTENER_API].max_connections = 15;
    m.conns[MG_LISTENER_API].refused = 185;
    m.conns[MG_LISTENER_API].accept_errors[MG_ACCEPT_EMFILE] = 42;
    m.conns[MG_LISTENER_API].read_timeouts[MG_READ_TIMEOUT_BODY_RATE] = 15;
    m.conns[MG_LISTENER_API].write_timeouts = 7;
    m.conns[MG_LISTENER_METRICS].open = 1;

    mg_config_t *cfg = two_providers();
    CHECK(cfg != NULL);
    if (!cfg) return;
    mg_pool_t pool;
    mg_pool_init(&pool);
    CHECK_EQ_INT(mg_pool_sync(&pool, cfg), 0);
    mg_provider_state_t *s = mg_pool_get(&pool, "local-vllm");
    if (s) {
        s->requests_total = 10;
        s->failures_total = 2;
        s->in_flight = 3;
    }

    char *out = NULL;
    size_t len = 0;
    CHECK_EQ_INT(mg_metrics_render(&m, &pool, 5, 42, 1000, &out, &len), 0);
    CHECK(out != NULL);
    if (!out) goto done;
    expo_parse(&E, out, len);
    CHECK_EQ_INT(E.errors, 0);
    if (E.errors) fprintf(stderr, "----\n%s----\n", out);
    /* chat, embeddings, models, other durations + first token + loop busy (the labelled
       families have no series here) */
    CHECK_EQ_INT(check_histograms(&E), 6);
    const char *lb = "moongate_loop_busy_seconds_bucket";
    CHECK(value_of(&E, lb, "le", "5e-05", NULL, NULL) == 1);
    CHECK(value_of(&E, lb, "le", "0.0005", NULL, NULL) == 1);
    CHECK(value_of(&E, lb, "le", "0.001", NULL, NULL) == 2);
    CHECK(value_of(&E, lb, "le", "0.005", NULL, NULL) == 2);
    CHECK(value_of(&E, lb, "le", "0.01", NULL, NULL) == 3);
    CHECK(value_of(&E, lb, "le", "0.1", NULL, NULL) == 3);
    CHECK(value_of(&E, lb, "le", "+Inf", NULL, NULL) == 4);
    CHECK(fabs(value_of(&E, "moongate_loop_busy_seconds_sum", NULL, NULL, NULL, NULL) - 0.25853) <
          1e-6);
    CHECK(fabs(value_of(&E, "moongate_loop_busy_max_seconds", NULL, NULL, NULL, NULL) - 0.25) <
          1e-9);

    const char *rt = "moongate_http_requests_total";
    CHECK(value_of(&E, rt, "endpoint", "chat", "code", "2xx") == 2);
    CHECK(value_of(&E, rt, "endpoint", "chat", "code", "5xx") == 1);
    CHECK(value_of(&E, rt, "endpoint", "chat", "code", "4xx") == 1);
    CHECK(value_of(&E, rt, "endpoint", "embeddings", "code", "2xx") == 1);
    CHECK(value_of(&E, rt, "endpoint", "models", "code", "4xx") == 1);
    CHECK(value_of(&E, rt, "endpoint", "other", "code", "1xx") == 1);
    CHECK(find(&E, rt, "endpoint", "completions", NULL, NULL) == NULL);

    const char *b = "moongate_http_request_duration_seconds_bucket";
    CHECK(value_of(&E, b, "endpoint", "chat", "le", "0.005") == 1);
    CHECK(value_of(&E, b, "endpoint", "chat", "le", "0.25") == 2);
    CHECK(value_of(&E, b, "endpoint", "chat", "le", "1") == 3); /* le is inclusive */
    CHECK(value_of(&E, b, "endpoint", "chat", "le", "120") == 3);
    CHECK(value_of(&E, b, "endpoint", "chat", "le", "+Inf") == 4);
    CHECK(value_of(&E, "moongate_http_request_duration_seconds_count", "endpoint", "chat", NULL,
                   NULL) == 4);
    double sum =
        value_of(&E, "moongate_http_request_duration_seconds_sum", "endpoint", "chat", NULL, NULL);
    CHECK(fabs(sum - 501.203) < 1e-6);
    CHECK(find(&E, b, "endpoint", "completions", NULL, NULL) == NULL); /* no observations */

    const char *t = "moongate_first_token_seconds_bucket";
    CHECK(value_of(&E, t, "le", "0.25", NULL, NULL) == 0);
    CHECK(value_of(&E, t, "le", "0.5", NULL, NULL) == 1);
    CHECK(value_of(&E, t, "le", "10", NULL, NULL) == 2);
    CHECK(value_of(&E, t, "le", "+Inf", NULL, NULL) == 2);
    CHECK(fabs(value_of(&E, "moongate_first_token_seconds_sum", NULL, NULL, NULL, NULL) - 7.3) <
          1e-6);

    CHECK(value_of(&E, "moongate_requests_in_flight", NULL, NULL, NULL, NULL) == 5);
    CHECK(value_of(&E, "moongate_cancelled_total", NULL, NULL, NULL, NULL) == 3);
    CHECK(value_of(&E, "moongate_stream_errors_total", NULL, NULL, NULL, NULL) == 2);
    CHECK(value_of(&E, "moongate_reloads_total", "result", "ok", NULL, NULL) == 4);
    CHECK(value_of(&E, "moongate_reloads_total", "result", "failed", NULL, NULL) == 1);
    CHECK(value_of(&E, "moongate_generation", NULL, NULL, NULL, NULL) == 42);
    CHECK(value_of(&E, "moongate_provider_requests_total", "provider_id", "local-vllm", NULL,
                   NULL) == 10);
    CHECK(value_of(&E, "moongate_provider_failures_total", "provider_id", "local-vllm", NULL,
                   NULL) == 2);
    CHECK(value_of(&E, "moongate_provider_in_flight", "provider_id", "local-vllm", NULL, NULL) ==
          3);
    CHECK(value_of(&E, "moongate_provider_requests_total", "provider_id", "cloud.b_2", NULL,
                   NULL) == 0);

    /* the listeners' connections */
    CHECK(value_of(&E, "moongate_cancellations_total", "reason", "client_stalled", NULL, NULL) ==
          6);
    CHECK(value_of(&E, "moongate_connections_open", "listener", "api", NULL, NULL) == 12);
    CHECK(value_of(&E, "moongate_connections_open", "listener", "metrics", NULL, NULL) == 1);
    CHECK(value_of(&E, "moongate_connections_max", "listener", "api", NULL, NULL) == 15);
    CHECK(value_of(&E, "moongate_connections_refused_total", "listener", "api", NULL, NULL) == 185);
    CHECK(value_of(&E, "moongate_accept_errors_total", "listener", "api", "error", "EMFILE") == 42);
    CHECK(value_of(&E, "moongate_accept_errors_total", "listener", "metrics", "error", "ENFILE") ==
          0);
    const char *ct = "moongate_client_timeouts_total";
    CHECK(value_of(&E, ct, "listener", "api", "reason", "min_body_rate") == 15);
    CHECK(value_of(&E, ct, "listener", "api", "reason", "header_read") == 0);
    CHECK(value_of(&E, ct, "listener", "api", "reason", "write") == 7);

    /* counters follow the _total naming convention; types are the expected ones */
    for (int i = 0; i < E.n_fam; i++) {
        size_t n = strlen(E.fam[i].name);
        if (strcmp(E.fam[i].type, "counter") == 0)
            CHECK(n > 6 && strcmp(E.fam[i].name + n - 6, "_total") == 0);
    }
    family_t *f = family_get(&E, "moongate_requests_in_flight", 0);
    CHECK(f && strcmp(f->type, "gauge") == 0);
    f = family_get(&E, "moongate_request_duration_seconds", 0);
    CHECK(f && strcmp(f->type, "histogram") == 0);
    free(out);
done:
    mg_pool_free(&pool);
    mg_config_free(cfg);
}

/* Large counters render as exact integers (no %g rounding to 1e+07 and the like). */
static void test_large_counts_exact(void)
{
    mg_metrics_t m;
    memset(&m, 0, sizeof(m));
    mg_call_obs_t big = {.ep = MG_EP_CHAT,
                         .model = "m",
                         .status = 200,
                         .attempts = 1,
                         .duration_s = 1,
                         .first_token_s = -1,
                         .prompt_tokens = 12345678901234LL};
    mg_metrics_call(&m, &big);
    m.cancelled_total = 10000000;
    for (int i = 0; i < 3; i++) mg_metrics_request(&m, MG_EP_COMPLETIONS, 200, 0.7);
    mg_pool_t pool;
    mg_pool_init(&pool);
    char *out = NULL;
    size_t len = 0;
    CHECK_EQ_INT(mg_metrics_render(&m, &pool, 0, 7, 1000, &out, &len), 0);
    if (!out) return;
    expo_parse(&E, out, len);
    CHECK_EQ_INT(E.errors, 0);
    CHECK(strstr(out,
                 "moongate_tokens_total{application=\"_none\",model=\"m\",direction=\"input\"} "
                 "12345678901234\n") != NULL);
    CHECK(strstr(out, "moongate_cancelled_total 10000000\n") != NULL);
    CHECK(value_of(&E, "moongate_http_request_duration_seconds_bucket", "endpoint", "completions",
                   "le", "0.5") == 0);
    CHECK(value_of(&E, "moongate_http_request_duration_seconds_bucket", "endpoint", "completions",
                   "le", "1") == 3);
    /* completions, the two always rendered, and the big call's duration, sidecar latency,
       GenAI duration and (input and output) token histograms */
    CHECK_EQ_INT(check_histograms(&E), 8);
    free(out);
    mg_pool_free(&pool);
    mg_metrics_free(&m);
}

/* The labelled families: every value as the calls made it, the OpenTelemetry bucket bounds,
 * escaping, and the bound on the series ("_other" past it). */
static void test_labelled_families(void)
{
    mg_metrics_t m;
    memset(&m, 0, sizeof(m));
    mg_call_obs_t ok = {.ep = MG_EP_CHAT,
                        .application = "shop",
                        .model = "general-chat",
                        .priority = "P1",
                        .provider_kind = "openai",
                        .upstream_model = "qwen3",
                        .status = 200,
                        .stream = 1,
                        .attempts = 1,
                        .duration_s = 2.0,
                        .first_token_s = 0.001,
                        .prompt_tokens = 64,
                        .completion_tokens = 11};
    mg_metrics_call(&m, &ok);
    ok.duration_s = 3.0; /* TPOT (3 - 1) / 10 = 0.2; tokens/s 10 / 2 = 5, averaged with 5 */
    ok.first_token_s = 1.0;
    mg_metrics_call(&m, &ok);
    mg_call_obs_t degraded = ok;
    degraded.degraded = "fallback";
    degraded.upstream_model = "small\"q";
    mg_metrics_call(&m, &degraded);
    mg_call_obs_t blocked = {.ep = MG_EP_CHAT,
                             .application = "shop",
                             .model = "general-chat",
                             .priority = "P2",
                             .status = 401,
                             .blocked_reason = "AUTH_FAILED",
                             .duration_s = 0.001,
                             .first_token_s = -1,
                             .prompt_tokens = 5};
    mg_metrics_call(&m, &blocked);
    mg_call_obs_t cancelled = ok;
    cancelled.status = 499;
    cancelled.cancel_reason = "client_disconnected";
    mg_metrics_call(&m, &cancelled);
    mg_metrics_queue_time_of(&m, "shop", "general-chat", 0.02);
    mg_metrics_provider_answer(&m, "p1", "main", 429, 0.5);
    mg_metrics_provider_answer(&m, "p1", "main", 200, 1.5);
    mg_metrics_provider_answer(&m, "p1", "main", 0, 0.01);
    /* a client sending a new model name on every request: the table stops at its bound */
    for (int i = 0; i < 400; i++) {
        char name[32];
        snprintf(name, sizeof(name), "m%d", i);
        mg_call_obs_t one = {.ep = MG_EP_CHAT,
                             .model = name,
                             .priority = "P2",
                             .status = 404,
                             .duration_s = 0.001,
                             .first_token_s = -1};
        mg_metrics_call(&m, &one);
    }
    mg_pool_t pool;
    mg_pool_init(&pool);
    char *out = NULL;
    size_t len = 0;
    CHECK_EQ_INT(mg_metrics_render(&m, &pool, 0, 1, 1000, &out, &len), 0);
    if (!out) goto done;
    expo_parse(&E, out, len);
    CHECK_EQ_INT(E.errors, 0);
    check_histograms(&E);
    const char *rt = "moongate_requests_total";
    CHECK(value_of(&E, rt, "priority", "P1", "status", "200") == 2 + 1);
    CHECK(value_of(&E, rt, "priority", "P2", "status", "401") == 1);
    CHECK(value_of(&E, rt, "application", "shop", "status", "499") == 1);
    /* 256 series at most: 3 above, 252 new models, the rest in "_other" */
    int n_req = 0;
    for (int i = 0; i < E.n_s; i++) n_req += strcmp(E.s[i].name, rt) == 0;
    CHECK_EQ_INT(n_req, 256);
    CHECK(value_of(&E, rt, "model", "_other", "status", "_other") == 400 - 252);
    CHECK(value_of(&E, rt, "model", "m0", "application", "_none") == 1);
    const char *d = "moongate_request_duration_seconds_bucket";
    CHECK(value_of(&E, d, "model", "general-chat", "le", "2.5") == 2); /* 2.0 and the 401 */
    CHECK(value_of(&E, d, "model", "general-chat", "le", "5") == 5);
    CHECK(value_of(&E, "moongate_first_token_latency_seconds_count", "model", "general-chat", NULL,
                   NULL) == 4);
    CHECK(value_of(&E, "moongate_queue_time_seconds_bucket", "model", "general-chat", "le",
                   "0.025") == 1);
    CHECK(value_of(&E, "moongate_tokens_total", "model", "general-chat", "direction", "input") ==
          64 * 4);
    CHECK(value_of(&E, "moongate_tokens_total", "model", "general-chat", "direction", "output") ==
          44);
    /* 10 tokens in 1.999 s first, then 5/s twice (the cancelled one does not count) */
    CHECK(fabs(value_of(&E, "moongate_tokens_per_second", "model", "general-chat", NULL, NULL) -
               (10 / 1.999 * 0.64 + 5 * 0.36)) < 1e-9);
    CHECK(value_of(&E, "moongate_degradation_total", "from_model", "general-chat", "to_model",
                   "small\"q") == 1);
    CHECK(strstr(out, "to_model=\"small\\\"q\"") != NULL); /* escaped */
    CHECK(value_of(&E, "moongate_policy_blocked_total", "application", "shop", "reason",
                   "AUTH_FAILED") == 1);
    CHECK(value_of(&E, "moongate_cancellation_total", "application", "shop", "reason",
                   "client_disconnected") == 1);
    /* the Sidecar names */
    CHECK(value_of(&E, "sidecar_latency_seconds_count", NULL, NULL, NULL, NULL) == 405);
    const char *pr = "sidecar_provider_requests_total";
    CHECK(value_of(&E, pr, "provider_id", "p1", "status_code", "429") == 1);
    CHECK(value_of(&E, pr, "provider_id", "p1", "status_code", "200") == 1);
    CHECK(value_of(&E, pr, "pool", "main", "status_code", "none") == 1);
    CHECK(value_of(&E, "sidecar_provider_latency_seconds_bucket", "provider_id", "p1", "le", "1") ==
          2);
    CHECK(
        fabs(value_of(&E, "sidecar_provider_latency_seconds_sum", "provider_id", "p1", NULL, NULL) -
             2.01) < 1e-9);
    /* the GenAI conventions: labels, the spec's bounds (a first token of exactly 1 ms is in
       the first bucket), token types; the refused and the unknown-model calls are not there */
    const char *tt = "gen_ai_server_time_to_first_token_seconds_bucket";
    CHECK(value_of(&E, tt, "gen_ai_request_model", "general-chat", "le", "0.001") == 1);
    CHECK(value_of(&E, tt, "gen_ai_response_model", "qwen3", "le", "1") == 2);
    CHECK(find(&E, tt, "le", "0.005", "gen_ai_operation_name", "chat") != NULL);
    CHECK(value_of(&E, "gen_ai_server_time_per_output_token_seconds_bucket",
                   "gen_ai_response_model", "qwen3", "le", "0.2") == 2);
    CHECK(value_of(&E, "gen_ai_server_time_per_output_token_seconds_bucket",
                   "gen_ai_response_model", "qwen3", "le", "0.15") == 0);
    CHECK(value_of(&E, "gen_ai_client_token_usage_bucket", "gen_ai_token_type", "input", "le",
                   "64") == 2);
    CHECK(value_of(&E, "gen_ai_client_token_usage_bucket", "gen_ai_token_type", "output", "le",
                   "16") == 2);
    CHECK(value_of(&E, "gen_ai_server_request_duration_seconds_count", "gen_ai_provider_name",
                   "openai", "gen_ai_response_model", "qwen3") == 3);
    CHECK(find(&E, "gen_ai_server_request_duration_seconds_count", "gen_ai_request_model", "m0",
               NULL, NULL) == NULL);
    free(out);
done:
    mg_pool_free(&pool);
    mg_metrics_free(&m);
}

static void test_endpoint_names(void)
{
    CHECK_STR(mg_endpoint_name(MG_EP_CHAT), "chat");
    CHECK_STR(mg_endpoint_name(MG_EP_COMPLETIONS), "completions");
    CHECK_STR(mg_endpoint_name(MG_EP_EMBEDDINGS), "embeddings");
    CHECK_STR(mg_endpoint_name(MG_EP_MODELS), "models");
    CHECK_STR(mg_endpoint_name(MG_EP_OTHER), "other");
    CHECK_STR(mg_endpoint_name(MG_EP_COUNT), "other");
}

/* The parser itself rejects what it should (so a passing render means something). */
static void test_validator_rejects_bad_text(void)
{
    const char *bad[] = {
        "moongate_x 1\n",                                        /* no TYPE */
        "# HELP a h\n# TYPE a counter\na{l=\"v\"} x\n",          /* bad value */
        "# HELP a h\n# TYPE a counter\na{l=v} 1\n",              /* unquoted label */
        "# HELP a h\n# TYPE a counter\na 1\n# TYPE a counter\n", /* TYPE after samples */
        "# HELP a h\n# TYPE a gauge\n# HELP b h\n# TYPE b gauge\na 1\nb 1\na{x=\"1\"} 2\n",
        "# HELP a h\n# TYPE a counter\na 1\na 2\n", /* duplicate series */
        "# HELP a h\n# TYPE a counter\na 1",        /* no final newline */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fprintf(stderr, "  (expected rejection %zu)\n", i);
        expo_parse(&E, bad[i], strlen(bad[i]));
        CHECK(E.errors > 0);
    }
    const char *good = "# HELP h_s h\n# TYPE h_s histogram\nh_s_bucket{le=\"1\"} 1\n"
                       "h_s_bucket{le=\"+Inf\"} 2\nh_s_sum 3.5\nh_s_count 2\n";
    expo_parse(&E, good, strlen(good));
    CHECK_EQ_INT(E.errors, 0);
    CHECK_EQ_INT(check_histograms(&E), 1);
}

int main(void)
{
    MG_RUN(test_validator_rejects_bad_text);
    MG_RUN(test_render_empty_is_valid);
    MG_RUN(test_render_full_is_valid_and_correct);
    MG_RUN(test_large_counts_exact);
    MG_RUN(test_labelled_families);
    MG_RUN(test_endpoint_names);
    return mg_test_summary();
}
