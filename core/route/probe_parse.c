/* probe_parse: see probe_parse.h. */
#include "route/probe_parse.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT_MAX 1e9

/* ------------------------------------------------------------------------ */
/* Pure helpers                                                              */
/* ------------------------------------------------------------------------ */

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static size_t skip_space(const char *s, size_t i, size_t len)
{
    while (i < len && is_space(s[i])) i++;
    return i;
}

int mg_probe_body_looks_json(const char *body, size_t len)
{
    if (!body) return 0;
    size_t i = skip_space(body, 0, len);
    return i < len && (body[i] == '{' || body[i] == '[');
}

int mg_probe_body_is_json(const char *body, size_t len)
{
    /* JSON's white space only before the value: cJSON would also skip control bytes */
    if (!mg_probe_body_looks_json(body, len)) return 0;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!j) return 0;
    int shape = cJSON_IsObject(j) || cJSON_IsArray(j);
    cJSON_Delete(j);
    if (!shape || !end || end < body || end > body + len) return 0;
    /* cJSON stops after the value: only white space may follow */
    return skip_space(body, (size_t)(end - body), len) == len;
}

int mg_probe_origin(const char *url, char *out, size_t outlen)
{
    if (!url || !out || outlen == 0) return -1;
    const char *sep = strstr(url, "://");
    if (!sep || sep == url) return -1;
    const char *host = sep + 3;
    size_t hlen = strcspn(host, "/?#");
    if (hlen == 0) return -1;
    size_t n = (size_t)(host - url) + hlen;
    if (n + 1 > outlen) return -1;
    memcpy(out, url, n);
    out[n] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Prometheus text                                                           */
/* ------------------------------------------------------------------------ */

static int name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

static int name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9');
}

/* The end of a {label="value",...} block starting at s[i] == '{': the index just
 * after the closing brace, or 0 when the line ends first. Quoted values may hold
 * braces, commas and backslash escapes. */
static size_t labels_end(const char *s, size_t i, size_t e)
{
    int quoted = 0;
    for (i++; i < e; i++) {
        char c = s[i];
        if (quoted) {
            if (c == '\\') i++;
            else if (c == '"') quoted = 0;
        } else if (c == '"') {
            quoted = 1;
        } else if (c == '}') {
            return i + 1;
        }
    }
    return 0;
}

/* Parse one sample line s[i..e); 0 and *out, or -1 when it is not one. */
static int prom_line(const char *s, size_t i, size_t e, mg_prom_sample_t *out)
{
    i = skip_space(s, i, e);
    if (i >= e || !name_start(s[i])) return -1; /* blank, comment or junk */
    out->name = s + i;
    while (i < e && name_char(s[i])) i++;
    out->name_len = (size_t)(s + i - out->name);
    out->labels = NULL;
    out->labels_len = 0;
    if (i < e && s[i] == '{') {
        size_t close = labels_end(s, i, e);
        if (!close) return -1;
        out->labels = s + i + 1;
        out->labels_len = close - i - 2;
        i = close;
    }
    if (i >= e || !is_space(s[i])) return -1;
    i = skip_space(s, i, e);
    size_t v = i;
    while (i < e && !is_space(s[i])) i++;
    char num[64];
    size_t n = i - v;
    if (n == 0 || n >= sizeof(num)) return -1;
    memcpy(num, s + v, n);
    num[n] = '\0';
    char *endp = NULL;
    out->value = strtod(num, &endp); /* also takes NaN, +Inf, -Inf */
    if (endp != num + n) return -1;
    return 0; /* an optional timestamp may follow; it is not needed */
}

size_t mg_probe_prom_scan(const char *text, size_t len,
                          void (*fn)(void *ud, const mg_prom_sample_t *sample), void *ud)
{
    size_t count = 0, i = 0;
    if (!text) return 0;
    while (i < len) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        mg_prom_sample_t sm;
        if (prom_line(text, i, e, &sm) == 0) {
            count++;
            if (fn) fn(ud, &sm);
        }
        i = e + 1;
    }
    return count;
}

/* Which metrics of an engine carry its load. */
typedef struct prom_load_s {
    const char *running, *waiting, *kv_a, *kv_b; /* kv_b may be NULL */
    double run, wait, kv;
    int have_run, have_wait, have_kv;
} prom_load_t;

static int name_is(const mg_prom_sample_t *sm, const char *name)
{
    return name && strlen(name) == sm->name_len && memcmp(sm->name, name, sm->name_len) == 0;
}

static void prom_load_sample(void *ud, const mg_prom_sample_t *sm)
{
    prom_load_t *pl = ud;
    if (isnan(sm->value)) return;
    if (name_is(sm, pl->running)) {
        pl->run += sm->value;
        pl->have_run = 1;
    } else if (name_is(sm, pl->waiting)) {
        pl->wait += sm->value;
        pl->have_wait = 1;
    } else if (name_is(sm, pl->kv_a) || name_is(sm, pl->kv_b)) {
        /* several engines or models: the fullest cache is the one that limits */
        if (!pl->have_kv || sm->value > pl->kv) pl->kv = sm->value;
        pl->have_kv = 1;
    }
}

static int clamp_count(double v)
{
    if (isnan(v) || v <= 0) return 0;
    if (v >= COUNT_MAX) return (int)COUNT_MAX;
    return (int)(v + 0.5);
}

static double clamp_ratio(double v)
{
    if (isnan(v) || v <= 0) return 0;
    return v >= 1 ? 1 : v;
}

static int prom_load(const char *text, size_t len, prom_load_t *pl, mg_engine_load_t *out)
{
    mg_probe_prom_scan(text, len, prom_load_sample, pl);
    if (!pl->have_run) return -1;
    out->running = clamp_count(pl->run);
    out->waiting = pl->have_wait ? clamp_count(pl->wait) : 0;
    out->kv_cache = pl->have_kv ? clamp_ratio(pl->kv) : -1;
    return 0;
}

int mg_probe_parse_vllm_metrics(const char *text, size_t len, mg_engine_load_t *out)
{
    /* vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are 0..1 */
    prom_load_t pl = {.running = "vllm:num_requests_running",
                      .waiting = "vllm:num_requests_waiting",
                      .kv_a = "vllm:kv_cache_usage_perc",
                      .kv_b = "vllm:gpu_cache_usage_perc"};
    return prom_load(text, len, &pl, out);
}

int mg_probe_parse_llamacpp_metrics(const char *text, size_t len, mg_engine_load_t *out)
{
    prom_load_t pl = {.running = "llamacpp:requests_processing",
                      .waiting = "llamacpp:requests_deferred",
                      .kv_a = "llamacpp:kv_cache_usage_ratio"};
    return prom_load(text, len, &pl, out);
}

/* Triton: the queue of every model, and TensorRT-LLM's batch manager where it runs. */
typedef struct {
    double pending, active, scheduled, kv_used, kv_max, kv_fraction;
    int have_pending, have_active, have_scheduled, have_used, have_max, have_fraction;
} triton_load_t;

/* Whether the sample's labels hold key="value" (the label text as Prometheus writes it). */
static int label_is(const mg_prom_sample_t *sm, const char *key, const char *value)
{
    char want[96];
    int n = snprintf(want, sizeof(want), "%s=\"%s\"", key, value);
    if (!sm->labels || n <= 0 || (size_t)n >= sizeof(want) || sm->labels_len < (size_t)n) return 0;
    for (size_t i = 0; i + (size_t)n <= sm->labels_len; i++) {
        if ((i == 0 || sm->labels[i - 1] == ',' || sm->labels[i - 1] == ' ') &&
            memcmp(sm->labels + i, want, (size_t)n) == 0)
            return 1;
    }
    return 0;
}

static void add(double *sum, int *have, double v)
{
    *sum += v;
    *have = 1;
}

static void triton_sample(void *ud, const mg_prom_sample_t *sm)
{
    triton_load_t *t = ud;
    if (isnan(sm->value)) return;
    if (name_is(sm, "nv_inference_pending_request_count")) {
        add(&t->pending, &t->have_pending, sm->value);
    } else if (name_is(sm, "nv_trt_llm_request_metrics")) {
        if (label_is(sm, "request_type", "active")) add(&t->active, &t->have_active, sm->value);
        else if (label_is(sm, "request_type", "scheduled"))
            add(&t->scheduled, &t->have_scheduled, sm->value);
    } else if (name_is(sm, "nv_trt_llm_kv_cache_block_metrics")) {
        if (label_is(sm, "kv_cache_block_type", "used")) add(&t->kv_used, &t->have_used, sm->value);
        else if (label_is(sm, "kv_cache_block_type", "max"))
            add(&t->kv_max, &t->have_max, sm->value);
        else if (label_is(sm, "kv_cache_block_type", "fraction") &&
                 (!t->have_fraction || sm->value > t->kv_fraction)) {
            t->kv_fraction = sm->value; /* several models: the fullest cache limits */
            t->have_fraction = 1;
        }
    }
}

int mg_probe_parse_triton_metrics(const char *text, size_t len, mg_engine_load_t *out)
{
    triton_load_t t = {0};
    mg_probe_prom_scan(text, len, triton_sample, &t);
    if (!t.have_pending && !t.have_active) return -1;
    /* the batch manager's active requests are the scheduled ones and those it holds back */
    double running = t.have_scheduled ? t.scheduled : t.have_active ? t.active : 0;
    double held =
        t.have_active && t.have_scheduled && t.active > t.scheduled ? t.active - t.scheduled : 0;
    out->running = clamp_count(running);
    out->waiting = clamp_count((t.have_pending ? t.pending : 0) + held);
    out->kv_cache = t.have_fraction                             ? clamp_ratio(t.kv_fraction)
                    : t.have_used && t.have_max && t.kv_max > 0 ? clamp_ratio(t.kv_used / t.kv_max)
                                                                : -1;
    return 0;
}

int mg_probe_metrics_url(const char *base_url, int port, char *out, size_t outlen)
{
    char origin[512];
    if (mg_probe_origin(base_url, origin, sizeof(origin)) != 0) return -1;
    /* the host without its port: after "scheme://", up to a ':' that is not in [IPv6] */
    char *host = strstr(origin, "://") + 3;
    char *colon = NULL;
    if (*host == '[') {
        char *close = strchr(host, ']');
        colon = close ? strchr(close, ':') : NULL;
    } else {
        colon = strchr(host, ':');
    }
    if (colon) *colon = '\0';
    int n = snprintf(out, outlen, "%s:%d/metrics", origin, port);
    return n > 0 && (size_t)n < outlen ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* JSON answers                                                              */
/* ------------------------------------------------------------------------ */

static int slot_busy(const cJSON *slot)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(slot, "is_processing");
    if (cJSON_IsBool(p)) return cJSON_IsTrue(p);
    /* older servers: "state": 0 idle, 1 processing */
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(slot, "state");
    return cJSON_IsNumber(st) && st->valuedouble != 0;
}

int mg_probe_parse_llamacpp_slots(const char *json, size_t len, mg_engine_load_t *out)
{
    if (!json || len == 0) return -1;
    cJSON *j = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        return -1;
    }
    int busy = 0;
    const cJSON *slot;
    cJSON_ArrayForEach(slot, j) {
        if (cJSON_IsObject(slot) && slot_busy(slot)) busy++;
    }
    cJSON_Delete(j);
    out->running = busy;
    out->waiting = 0; /* /slots does not show the deferred queue */
    out->kv_cache = -1;
    return 0;
}

int mg_probe_parse_ollama_ps(const char *json, size_t len, mg_engine_load_t *out)
{
    if (!json || len == 0) return -1;
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *models = cJSON_GetObjectItemCaseSensitive(j, "models");
    if (!cJSON_IsObject(j) || !cJSON_IsArray(models)) {
        cJSON_Delete(j);
        return -1;
    }
    out->running = cJSON_GetArraySize(models);
    out->waiting = 0; /* Ollama exposes no queue depth */
    out->kv_cache = -1;
    cJSON_Delete(j);
    return 0;
}
