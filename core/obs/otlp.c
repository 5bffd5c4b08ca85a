/* otlp: OTLP/HTTP JSON export of the gateway's spans on a thread of its own (see otlp.h). */
#include "obs/otlp.h"

#include <curl/curl.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static void attr_str(cJSON *attrs, const char *key, const char *v)
{
    if (!v || !*v) return;
    cJSON *a = cJSON_CreateObject(), *val = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "key", key);
    cJSON_AddStringToObject(val, "stringValue", v);
    cJSON_AddItemToObject(a, "value", val);
    cJSON_AddItemToArray(attrs, a);
}

/* OTLP JSON writes 64-bit integers as strings */
static void attr_int(cJSON *attrs, const char *key, int64_t v)
{
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)v);
    cJSON *a = cJSON_CreateObject(), *val = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "key", key);
    cJSON_AddStringToObject(val, "intValue", t);
    cJSON_AddItemToObject(a, "value", val);
    cJSON_AddItemToArray(attrs, a);
}

static void attr_double(cJSON *attrs, const char *key, double v)
{
    cJSON *a = cJSON_CreateObject(), *val = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "key", key);
    cJSON_AddNumberToObject(val, "doubleValue", v);
    cJSON_AddItemToObject(a, "value", val);
    cJSON_AddItemToArray(attrs, a);
}

static void attr_bool(cJSON *attrs, const char *key, int v)
{
    cJSON *a = cJSON_CreateObject(), *val = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "key", key);
    cJSON_AddBoolToObject(val, "boolValue", v);
    cJSON_AddItemToObject(a, "value", val);
    cJSON_AddItemToArray(attrs, a);
}

static void add_nanos(cJSON *o, const char *key, int64_t ns)
{
    char t[24];
    snprintf(t, sizeof(t), "%lld", (long long)ns);
    cJSON_AddStringToObject(o, key, t);
}

static cJSON *span_json(const mg_otlp_span_t *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "traceId", s->trace_id);
    cJSON_AddStringToObject(o, "spanId", s->span_id);
    if (s->parent_id[0]) cJSON_AddStringToObject(o, "parentSpanId", s->parent_id);
    char name[192]; /* the GenAI convention: "{gen_ai.operation.name} {gen_ai.request.model}" */
    snprintf(name, sizeof(name), "%s%s%s", s->operation, s->request_model[0] ? " " : "",
             s->request_model);
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "kind", 2); /* SPAN_KIND_SERVER: the gateway serves the call */
    add_nanos(o, "startTimeUnixNano", s->start_unix_ns);
    add_nanos(o, "endTimeUnixNano", s->end_unix_ns);
    cJSON *attrs = cJSON_AddArrayToObject(o, "attributes");
    attr_str(attrs, "gen_ai.operation.name", s->operation);
    attr_str(attrs, "gen_ai.system", s->system);
    attr_str(attrs, "gen_ai.provider.name", s->system);
    attr_str(attrs, "gen_ai.request.model", s->request_model);
    attr_str(attrs, "gen_ai.response.model", s->response_model);
    if (s->input_tokens || s->output_tokens) {
        attr_int(attrs, "gen_ai.usage.input_tokens", s->input_tokens);
        attr_int(attrs, "gen_ai.usage.output_tokens", s->output_tokens);
    }
    attr_str(attrs, "error.type", s->error_type);
    attr_int(attrs, "http.response.status_code", s->status);
    attr_str(attrs, "url.path", s->path);
    attr_str(attrs, "moongate.request_id", s->request_id);
    attr_str(attrs, "moongate.provider", s->provider);
    attr_bool(attrs, "moongate.stream", s->stream);
    attr_int(attrs, "moongate.attempts", s->attempts);
    if (s->tenant_id) attr_int(attrs, "moongate.tenant_id", s->tenant_id);
    if (s->ttft_s >= 0) attr_double(attrs, "moongate.time_to_first_token_s", s->ttft_s);
    cJSON *status = cJSON_AddObjectToObject(o, "status");
    int err = s->status >= 500 || s->error_type[0]; /* a 4xx the client caused is still an error
                                                       of the call: error.type says which */
    cJSON_AddNumberToObject(status, "code", err ? 2 : 1); /* STATUS_CODE_ERROR : _OK */
    if (err && s->error_type[0]) cJSON_AddStringToObject(status, "message", s->error_type);
    return o;
}

char *mg_otlp_body(const mg_otlp_span_t *const *spans, int n, const char *service_name)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *rs = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "resourceSpans"), rs);
    cJSON *res = cJSON_AddObjectToObject(rs, "resource");
    cJSON *rattrs = cJSON_AddArrayToObject(res, "attributes");
    attr_str(rattrs, "service.name", service_name ? service_name : "moongate");
    attr_str(rattrs, "service.version", MOONGATE_VERSION);
    cJSON *ss = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(rs, "scopeSpans"), ss);
    cJSON *scope = cJSON_AddObjectToObject(ss, "scope");
    cJSON_AddStringToObject(scope, "name", "moongate");
    cJSON_AddStringToObject(scope, "version", MOONGATE_VERSION);
    cJSON *list = cJSON_AddArrayToObject(ss, "spans");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(list, span_json(spans[i]));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
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
