/* otlp: OTLP/HTTP JSON export of the gateway's spans on a thread of its own (see otlp.h). */
#include "obs/otlp.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "base/log.h"

#define BACKOFF_FIRST_MS 500
#define BACKOFF_MAX_MS 30000

typedef struct node_s {
    mg_otlp_span_t s;
    struct node_s *next;
} node_t;

struct mg_otlp_s {
    char *url, *service_name;
    struct curl_slist *headers; /* Content-Type and the configured ones */
    int interval_ms, max_batch, max_queue, timeout_ms, max_retries;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    node_t *head, *tail; /* the queue, oldest first */
    int n, stopping;
    mg_otlp_stats_t st; /* under mu */
};

/* ---- the body -------------------------------------------------------------------------- */

/* Written straight into a buffer, not through a cJSON tree: the tree cost the exporter some
 * 100k instructions a span (bench/callgrind), the buffer a tenth of it. Every append's
 * failure (out of memory) is collected in b->err and checked once at the end. */
typedef struct body_s {
    mg_buf_t b;
    int err;
    int first; /* no comma before the next attribute */
} body_t;

static void put(body_t *w, const char *s)
{
    w->err |= mg_buf_append_str(&w->b, s);
}

static void put_str(body_t *w, const char *s)
{
    w->err |= mg_json_print_string(s, strlen(s), &w->b);
}

static void put_i64(body_t *w, int64_t v)
{
    w->err |= mg_buf_append_int(&w->b, (long long)v); /* no printf: it was a third of the cost */
}

/* keys are our own literals: written as they are, no escaping */
static void attr_begin(body_t *w, const char *key)
{
    put(w, w->first ? "{\"key\":\"" : ",{\"key\":\"");
    w->first = 0;
    put(w, key);
    put(w, "\",\"value\":{");
}

static void attr_str(body_t *w, const char *key, const char *v)
{
    if (!v || !*v) return;
    attr_begin(w, key);
    put(w, "\"stringValue\":");
    put_str(w, v);
    put(w, "}}");
}

/* OTLP JSON writes 64-bit integers as strings */
static void attr_int(body_t *w, const char *key, int64_t v)
{
    attr_begin(w, key);
    put(w, "\"intValue\":\"");
    put_i64(w, v);
    put(w, "\"}}");
}

static void attr_bool(body_t *w, const char *key, int v)
{
    attr_begin(w, key);
    put(w, v ? "\"boolValue\":true}}" : "\"boolValue\":false}}");
}

static void span_json(body_t *w, const mg_otlp_span_t *s)
{
    put(w, "{\"traceId\":");
    put_str(w, s->trace_id);
    put(w, ",\"spanId\":");
    put_str(w, s->span_id);
    if (s->parent_id[0]) {
        put(w, ",\"parentSpanId\":");
        put_str(w, s->parent_id);
    }
    /* the GenAI convention's name: "{gen_ai.operation.name} {gen_ai.request.model}" */
    char name[192];
    size_t on = strlen(s->operation), mn = strlen(s->request_model), n = 0;
    memcpy(name, s->operation, on < 32 ? on : 32);
    n = on < 32 ? on : 32;
    if (mn) {
        name[n++] = ' ';
        if (mn > sizeof(name) - 1 - n) mn = sizeof(name) - 1 - n;
        memcpy(name + n, s->request_model, mn);
        n += mn;
    }
    put(w, ",\"name\":");
    w->err |= mg_json_print_string(name, n, &w->b);
    put(w, ",\"kind\":2,\"startTimeUnixNano\":\""); /* SPAN_KIND_SERVER: the gateway serves it */
    put_i64(w, s->start_unix_ns);
    put(w, "\",\"endTimeUnixNano\":\"");
    put_i64(w, s->end_unix_ns);
    put(w, "\",\"attributes\":[");
    w->first = 1;
    attr_str(w, "gen_ai.operation.name", s->operation);
    attr_str(w, "gen_ai.system", s->system);
    attr_str(w, "gen_ai.provider.name", s->system);
    attr_str(w, "gen_ai.request.model", s->request_model);
    attr_str(w, "gen_ai.response.model", s->response_model);
    if (s->input_tokens || s->output_tokens) {
        attr_int(w, "gen_ai.usage.input_tokens", s->input_tokens);
        attr_int(w, "gen_ai.usage.output_tokens", s->output_tokens);
    }
    attr_str(w, "error.type", s->error_type);
    attr_int(w, "http.response.status_code", s->status);
    attr_str(w, "url.path", s->path);
    attr_str(w, "moongate.request_id", s->request_id);
    attr_str(w, "moongate.provider", s->provider);
    attr_bool(w, "moongate.stream", s->stream);
    attr_int(w, "moongate.attempts", s->attempts);
    if (s->tenant_id) attr_int(w, "moongate.tenant_id", s->tenant_id);
    /* whole milliseconds: a double's printing cost more than the rest of the span */
    if (s->ttft_s >= 0) attr_int(w, "moongate.time_to_first_token_ms", (int64_t)(s->ttft_s * 1000));
    /* a 4xx the client caused is still an error of the call: error.type says which */
    int err = s->status >= 500 || s->error_type[0];
    put(w, err ? "],\"status\":{\"code\":2" : "],\"status\":{\"code\":1"); /* ERROR : OK */
    if (err && s->error_type[0]) {
        put(w, ",\"message\":");
        put_str(w, s->error_type);
    }
    put(w, "}}");
}

char *mg_otlp_body(const mg_otlp_span_t *const *spans, int n, const char *service_name)
{
    body_t w = {.b = {0}, .err = 0, .first = 1};
    put(&w, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    attr_str(&w, "service.name", service_name ? service_name : "moongate");
    attr_str(&w, "service.version", MOONGATE_VERSION);
    put(&w, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"moongate\",\"version\":");
    put_str(&w, MOONGATE_VERSION);
    put(&w, "},\"spans\":[");
    for (int i = 0; i < n; i++) {
        if (i) put(&w, ",");
        span_json(&w, spans[i]);
    }
    put(&w, "]}]}]}");
    if (w.err) {
        mg_buf_free(&w.b);
        return NULL;
    }
    return w.b.data;
}

/* ---- the queue ------------------------------------------------------------------------- */

int mg_otlp_push(mg_otlp_t *o, const mg_otlp_span_t *s)
{
    pthread_mutex_lock(&o->mu);
    if (o->n >= o->max_queue || o->stopping) {
        o->st.dropped_full++;
        pthread_mutex_unlock(&o->mu);
        return -1;
    }
    pthread_mutex_unlock(&o->mu);
    node_t *nd = malloc(sizeof(*nd)); /* outside the lock */
    if (!nd) return -1;
    nd->s = *s;
    nd->next = NULL;
    pthread_mutex_lock(&o->mu);
    if (o->tail) o->tail->next = nd;
    else o->head = nd;
    o->tail = nd;
    o->n++;
    if (o->n >= o->max_batch) pthread_cond_signal(&o->cv); /* a full batch goes at once */
    pthread_mutex_unlock(&o->mu);
    return 0;
}

void mg_otlp_stats(mg_otlp_t *o, mg_otlp_stats_t *out)
{
    pthread_mutex_lock(&o->mu);
    *out = o->st;
    out->queued = (uint64_t)o->n;
    pthread_mutex_unlock(&o->mu);
}

/* Up to max_batch spans off the queue's head (under mu): their list, *count set. */
static node_t *take_batch(mg_otlp_t *o, int *count)
{
    node_t *first = o->head, *last = NULL, *p = o->head;
    int k = 0;
    for (; p && k < o->max_batch; k++) {
        last = p;
        p = p->next;
    }
    if (!k) {
        *count = 0;
        return NULL;
    }
    last->next = NULL;
    o->head = p;
    if (!p) o->tail = NULL;
    o->n -= k;
    *count = k;
    return first;
}

static void free_list(node_t *p)
{
    while (p) {
        node_t *next = p->next;
        free(p);
        p = next;
    }
}

/* ---- the export ------------------------------------------------------------------------ */

static size_t discard(char *p, size_t size, size_t n, void *ud)
{
    (void)p;
    (void)ud;
    return size * n;
}

enum { SENT = 0, RETRY = 1, REFUSED = 2 };

/* One POST of body: SENT (2xx), RETRY (transport error, 408, 429, 5xx) or REFUSED. */
static int post(mg_otlp_t *o, CURL *e, const char *body, long *status)
{
    curl_easy_setopt(e, CURLOPT_URL, o->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, o->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)o->timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    *status = 0;
    if (curl_easy_perform(e) != CURLE_OK) return RETRY;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    if (*status >= 200 && *status < 300) return SENT;
    if (*status == 408 || *status == 429 || *status >= 500) return RETRY;
    return REFUSED;
}

/* Wait ms, or less when the exporter stops or (batch_wakes) a batch is full (under mu). 1
 * when it is stopping. */
static int wait_ms(mg_otlp_t *o, int ms, int batch_wakes)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (!o->stopping) {
        int rc = pthread_cond_timedwait(&o->cv, &o->mu, &ts);
        if (rc == ETIMEDOUT) break;
        if (rc == 0 && batch_wakes && o->n >= o->max_batch) break; /* a full batch: go */
    }
    return o->stopping;
}

/* Export the batch list of count spans (called without mu), with retries unless stopping. */
static int export_batch(mg_otlp_t *o, CURL *e, node_t *list, int count)
{
    const mg_otlp_span_t **v = malloc(sizeof(*v) * (size_t)count);
    char *body = NULL;
    if (v) {
        int i = 0;
        for (node_t *p = list; p; p = p->next) v[i++] = &p->s;
        body = mg_otlp_body(v, count, o->service_name);
    }
    free(v);
    int rc = body ? RETRY : REFUSED, tries = 0;
    long status = 0;
    while (body) {
        rc = post(o, e, body, &status);
        tries++;
        if (rc != RETRY) break;
        pthread_mutex_lock(&o->mu);
        o->st.export_failures++;
        int stop = o->stopping || tries > o->max_retries;
        long long delay = (long long)BACKOFF_FIRST_MS << (tries - 1 < 16 ? tries - 1 : 16);
        if (!stop) stop = wait_ms(o, delay > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : (int)delay, 0);
        pthread_mutex_unlock(&o->mu);
        if (stop) break;
    }
    free(body);
    pthread_mutex_lock(&o->mu);
    if (rc == SENT) o->st.exported_total += (uint64_t)count;
    else {
        if (rc == REFUSED) o->st.export_failures++;
        o->st.dropped_failed += (uint64_t)count;
    }
    pthread_mutex_unlock(&o->mu);
    if (rc != SENT && status)
        mg_log_msg(MG_LOG_WARN, NULL,
                   "otlp export failed: %d spans dropped after %d tries (status %ld)", count, tries,
                   status);
    else if (rc != SENT)
        mg_log_msg(MG_LOG_WARN, NULL,
                   "otlp export failed: %d spans dropped after %d tries (no answer)", count, tries);
    free_list(list);
    return rc;
}

static void *run(void *arg)
{
    mg_otlp_t *o = arg;
    CURL *e = curl_easy_init();
    pthread_mutex_lock(&o->mu);
    for (;;) {
        if (!o->stopping && o->n < o->max_batch) wait_ms(o, o->interval_ms, 1);
        int count = 0;
        node_t *list = take_batch(o, &count);
        int stopping = o->stopping;
        if (!list && stopping) break;
        if (!list) continue;
        pthread_mutex_unlock(&o->mu);
        int rc = e ? export_batch(o, e, list, count) : REFUSED;
        if (!e) free_list(list);
        pthread_mutex_lock(&o->mu);
        if (stopping && rc != SENT) { /* stopping and the collector fails: the rest go too, so
                                         that stop takes one timeout at most */
            o->st.dropped_failed += (uint64_t)o->n;
            free_list(o->head);
            o->head = o->tail = NULL;
            o->n = 0;
            break;
        }
    }
    pthread_mutex_unlock(&o->mu);
    if (e) curl_easy_cleanup(e);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------- */

/* {endpoint}/v1/traces, unless it already ends so. */
static char *traces_url(const char *endpoint)
{
    size_t n = strlen(endpoint);
    while (n && endpoint[n - 1] == '/') n--;
    const char *suffix = "/v1/traces";
    int has = n >= 10 && memcmp(endpoint + n - 10, suffix, 10) == 0;
    char *u = malloc(n + 11);
    if (u) snprintf(u, n + 11, "%.*s%s", (int)n, endpoint, has ? "" : suffix);
    return u;
}

static void free_otlp(mg_otlp_t *o)
{
    free_list(o->head);
    curl_slist_free_all(o->headers);
    free(o->url);
    free(o->service_name);
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    free(o);
}

mg_otlp_t *mg_otlp_start(const mg_otlp_conf_t *c)
{
    if (!c->endpoint) return NULL;
    mg_otlp_t *o = calloc(1, sizeof(*o));
    if (!o) return NULL;
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    o->url = traces_url(c->endpoint);
    o->service_name = strdup(c->service_name ? c->service_name : "moongate");
    o->interval_ms = c->interval_ms;
    o->max_batch = c->max_batch;
    o->max_queue = c->max_queue;
    o->timeout_ms = c->timeout_ms;
    o->max_retries = c->max_retries;
    int ok = o->url && o->service_name;
    struct curl_slist *h = ok ? curl_slist_append(NULL, "Content-Type: application/json") : NULL;
    ok = h != NULL;
    for (size_t i = 0; ok && i < c->n_headers; i++) {
        size_t len = strlen(c->header_names[i]) + strlen(c->header_values[i]) + 3;
        char *line = malloc(len);
        struct curl_slist *nh = NULL;
        if (line) {
            snprintf(line, len, "%s: %s", c->header_names[i], c->header_values[i]);
            nh = curl_slist_append(h, line);
            explicit_bzero(line, len);
            free(line);
        }
        if (nh) h = nh;
        ok = nh != NULL;
    }
    o->headers = h;
    if (!ok || pthread_create(&o->thread, NULL, run, o) != 0) {
        free_otlp(o);
        return NULL;
    }
    return o;
}

void mg_otlp_stop(mg_otlp_t *o)
{
    if (!o) return;
    pthread_mutex_lock(&o->mu);
    o->stopping = 1;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    free_otlp(o);
}
