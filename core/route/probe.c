/* probe: active health and engine-load probes; see probe.h.
 *
 * Lifetimes: the prober keeps one slot per provider id (a list, so probes can
 * point at their slot) with the provider's schedule and its probes in flight.
 * Provider state (mg_provider_state_t) is looked up by id whenever it is needed,
 * never kept: a reload may move it (mg_pool_sync) or remove it. A slot whose
 * provider left the configuration is dropped once nothing of it is in flight.
 * A probe owns its body buffer and is freed when its transfer ends or is
 * cancelled; the prober itself is freed in its timer's close callback. */
#include "route/probe.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "upstream/upstream.h"

#define LOAD_STALE_INTERVALS 3 /* a failed load probe forgets readings older than this */

/* ------------------------------------------------------------------------ */
/* Probes on the loop                                                        */
/* ------------------------------------------------------------------------ */

typedef enum { PROBE_HEALTH = 0, PROBE_LOAD = 1 } probe_kind_t;

/* Which answer a load probe asks for. */
typedef enum {
    LOAD_NONE,
    LOAD_VLLM,
    LOAD_LLAMA_METRICS,
    LOAD_LLAMA_SLOTS,
    LOAD_OLLAMA,
    LOAD_TRITON
} load_kind_t;

#define TRITON_METRICS_PORT 8002 /* tritonserver --metrics-port's default */

typedef struct probe_slot_s probe_slot_t;

typedef struct probe_s {
    mg_prober_t *pr;
    probe_slot_t *slot;
    probe_kind_t kind;
    load_kind_t load;
    mg_xfer_t *x;
    int status; /* HTTP status; 0 until the response head is in */
    char *buf;  /* owned: the body, up to MG_PROBE_MAX_BODY */
    size_t len, cap;
    int cut;            /* the body was longer than MG_PROBE_MAX_BODY */
    int status_only;    /* a KServe v2 health endpoint: its status is the answer, no body */
    const char *detail; /* why the transfer failed; valid while it is being finished */
} probe_t;

/* One provider id: its schedule and its probes in flight. */
struct probe_slot_s {
    probe_slot_t *next;
    char *id;               /* owned */
    int seen;               /* in the current generation (set each tick) */
    uint64_t health_due_ms; /* 0 = not scheduled yet */
    uint64_t load_due_ms;   /* 0 = due now */
    probe_t *probe[2];      /* in flight, by probe_kind_t */
    int llama_slots;        /* llama.cpp: /metrics is not served, read /slots */
};

struct mg_prober_s {
    mg_probe_deps_t d;
    uv_timer_t timer;
    probe_slot_t *slots;     /* owned list */
    probe_slot_t **by_index; /* owned: the slot of each provider of generation index_gen, by
                                its index in that config (a tick is then linear in providers) */
    size_t n_index;
    unsigned index_gen; /* 0 = none */
};

static load_kind_t load_kind_of(const mg_provider_conf_t *pc, const probe_slot_t *sl)
{
    const char *e = pc->engine;
    if (!e) return LOAD_NONE;
    if (strcmp(e, "vllm") == 0) return LOAD_VLLM;
    if (strcmp(e, "llamacpp") == 0) return sl->llama_slots ? LOAD_LLAMA_SLOTS : LOAD_LLAMA_METRICS;
    if (strcmp(e, "ollama") == 0) return LOAD_OLLAMA;
    if (strcmp(e, "triton") == 0) return LOAD_TRITON;
    return LOAD_NONE;
}

static const char *load_path(load_kind_t k)
{
    switch (k) {
    case LOAD_LLAMA_SLOTS: return "/slots";
    case LOAD_OLLAMA: return "/api/ps";
    default: return "/metrics";
    }
}

/* The provider state's probe_in_flight shows how many probes it has out. */
static void sync_in_flight(mg_prober_t *pr, const probe_slot_t *sl)
{
    mg_provider_state_t *ps = mg_pool_get(pr->d.pool, sl->id);
    if (ps)
        ps->probe_in_flight = (sl->probe[PROBE_HEALTH] != NULL) + (sl->probe[PROBE_LOAD] != NULL);
}

static void probe_free(probe_t *p)
{
    free(p->buf);
    free(p);
}

static const char *result_name(mg_xfer_result_t r)
{
    switch (r) {
    case MG_XFER_OK: return "ok";
    case MG_XFER_CONNECT_ERROR: return "connect_error";
    case MG_XFER_FIRST_BYTE_TIMEOUT: return "first_byte_timeout";
    case MG_XFER_IDLE_TIMEOUT: return "idle_timeout";
    case MG_XFER_TOTAL_TIMEOUT: return "total_timeout";
    default: return "error";
    }
}

static void log_failure(const probe_t *p, int status, mg_xfer_result_t r, const char *why)
{
    if (!mg_log_enabled(MG_LOG_DEBUG)) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_DEBUG, "probe failed");
    mg_log_str(&l, "provider", p->slot->id);
    mg_log_str(&l, "kind", p->kind == PROBE_HEALTH ? "health" : "load");
    mg_log_int(&l, "status", status);
    mg_log_str(&l, "result", result_name(r));
    mg_log_str(&l, "reason", why);
    if (p->detail) mg_log_str(&l, "detail", p->detail);
    mg_log_end(&l);
}

/* Whether a finished health probe found the provider answering properly. */
static int health_ok(const probe_t *p, mg_xfer_result_t r, const char **why)
{
    if (r != MG_XFER_OK) {
        *why = "no answer";
        return 0;
    }
    if (p->status < 200 || p->status > 299) {
        *why = "status";
        return 0;
    }
    if (p->status_only && !p->cut) return 1; /* KServe v2: 200 is "ready", the body empty */
    int json =
        p->cut ? mg_probe_body_looks_json(p->buf, p->len) : mg_probe_body_is_json(p->buf, p->len);
    *why = json ? NULL : "not json";
    return json;
}

static void health_done(probe_t *p, mg_provider_state_t *ps, mg_xfer_result_t r)
{
    const mg_probe_deps_t *d = &p->pr->d;
    const char *why = NULL;
    int ok = health_ok(p, r, &why);
    if (!ok) log_failure(p, p->status, r, why);
    uint64_t now = uv_now(d->loop);
    mg_pool_changed(ps);
    mg_breaker_probe_result(&ps->breaker, now, ok);
    if (mg_health_probe_result(&ps->health, now, ok)) d->health_changed(d->sink_ud, ps);
}

static int parse_load(load_kind_t k, const char *buf, size_t len, mg_engine_load_t *out)
{
    switch (k) {
    case LOAD_VLLM: return mg_probe_parse_vllm_metrics(buf, len, out);
    case LOAD_LLAMA_METRICS: return mg_probe_parse_llamacpp_metrics(buf, len, out);
    case LOAD_LLAMA_SLOTS: return mg_probe_parse_llamacpp_slots(buf, len, out);
    case LOAD_OLLAMA: return mg_probe_parse_ollama_ps(buf, len, out);
    case LOAD_TRITON: return mg_probe_parse_triton_metrics(buf, len, out);
    default: return -1;
    }
}

static void load_done(probe_t *p, mg_provider_state_t *ps, mg_xfer_result_t r)
{
    const mg_probe_deps_t *d = &p->pr->d;
    uint64_t now = uv_now(d->loop);
    int answered = r == MG_XFER_OK && p->status >= 200 && p->status <= 299 && !p->cut;
    mg_engine_load_t got = ps->load;
    mg_pool_changed(ps); /* the load, or its going stale */
    if (answered && parse_load(p->load, p->buf, p->len, &got) == 0) {
        got.known = 1;
        got.at_ms = now;
        ps->load = got;
        return;
    }
    log_failure(p, p->status, r, answered ? "unreadable load" : "no load answer");
    /* llama.cpp without --metrics answers /metrics with 501 (or 404): read /slots
     * from now on, at once; if /slots stops answering too, try /metrics again */
    if (r == MG_XFER_OK && (p->load == LOAD_LLAMA_METRICS || p->load == LOAD_LLAMA_SLOTS)) {
        p->slot->llama_slots = p->load == LOAD_LLAMA_METRICS;
        if (p->load == LOAD_LLAMA_METRICS) p->slot->load_due_ms = 0;
    }
    uint64_t interval = (uint64_t)mg_gens_current(d->gens)->cfg->health.load_interval_ms;
    if (ps->load.known && now - ps->load.at_ms > LOAD_STALE_INTERVALS * interval)
        ps->load.known = 0;
}

/* The transfer of p ended (or was cut short by us): count the result, free p. */
static void probe_finish(probe_t *p, mg_xfer_result_t r)
{
    mg_prober_t *pr = p->pr;
    p->slot->probe[p->kind] = NULL;
    p->x = NULL;
    sync_in_flight(pr, p->slot);
    mg_provider_state_t *ps = mg_pool_get(pr->d.pool, p->slot->id);
    if (ps) {
        if (p->kind == PROBE_HEALTH) health_done(p, ps, r);
        else load_done(p, ps, r);
    }
    probe_free(p);
}

static void on_probe_headers(void *ud, int status)
{
    probe_t *p = ud;
    p->status = status;
}

static int on_probe_data(void *ud, const char *data, size_t len)
{
    probe_t *p = ud;
    if (p->cut) return 0;
    size_t room = MG_PROBE_MAX_BODY - p->len;
    size_t take = len < room ? len : room;
    if (p->len + take > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->len + take) cap *= 2;
        if (cap > MG_PROBE_MAX_BODY) cap = MG_PROBE_MAX_BODY;
        char *nb = realloc(p->buf, cap);
        if (!nb) {
            mg_xfer_cancel(p->x);
            p->detail = "out of memory";
            probe_finish(p, MG_XFER_ERROR);
            return 0;
        }
        p->buf = nb;
        p->cap = cap;
    }
    memcpy(p->buf + p->len, data, take);
    p->len += take;
    if (take < len) {
        /* enough read to judge: stop the transfer here rather than swallow the rest */
        p->cut = 1;
        mg_xfer_cancel(p->x);
        probe_finish(p, MG_XFER_OK);
    }
    return 0;
}

static void on_probe_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    probe_t *p = ud;
    p->detail = detail;
    probe_finish(p, result);
}

/* GET url for slot sl; 0, or -1 when it could not start (nothing in flight then). */
/* The request's headers: the fixed ones, the adapter's (a: NULL for an engine's load page)
 * and the key, as Authorization: Bearer or in the adapter's own header. NULL: no memory. */
static struct curl_slist *probe_headers(probe_kind_t kind, const mg_adapter_t *a,
                                        const char *api_key)
{
    struct curl_slist *h = NULL, *nh;
    const char *fixed[] = {kind == PROBE_HEALTH ? "Accept: application/json" : "Accept: */*",
                           "User-Agent: moongate/" MOONGATE_VERSION " (probe)"};
    for (size_t i = 0; i < 2; i++) {
        if (!(nh = curl_slist_append(h, fixed[i]))) goto fail;
        h = nh;
    }
    for (char **x = a ? a->probe_headers : NULL; x && *x; x++) {
        if (!(nh = curl_slist_append(h, *x))) goto fail;
        h = nh;
    }
    if (api_key && api_key[0]) {
        const char *name = a && a->probe_key_header ? a->probe_key_header : NULL;
        size_t n = strlen(api_key) + (name ? strlen(name) : 0) + 32;
        char *line = malloc(n);
        if (!line) goto fail;
        if (name) snprintf(line, n, "%s: %s", name, api_key);
        else snprintf(line, n, "Authorization: Bearer %s", api_key);
        nh = curl_slist_append(h, line);
        free(line);
        if (!nh) goto fail;
        h = nh;
    }
    return h;
fail:
    curl_slist_free_all(h);
    return NULL;
}

static int probe_start(mg_prober_t *pr, probe_slot_t *sl, probe_kind_t kind, load_kind_t lk,
                       const char *url, const mg_adapter_t *a, const char *api_key, int timeout_ms)
{
    probe_t *p = calloc(1, sizeof(*p));
    if (!p) return -1;
    p->pr = pr;
    p->slot = sl;
    p->kind = kind;
    p->load = lk;
    struct curl_slist *h = probe_headers(kind, a, api_key);
    if (!h) {
        probe_free(p);
        return -1;
    }
    mg_xfer_opts_t o = {
        .method = "GET",
        .url = url,
        .headers = h,
        .connect_timeout_ms = timeout_ms,
        .first_byte_timeout_ms = timeout_ms,
        .idle_timeout_ms = timeout_ms,
        .total_timeout_ms = timeout_ms,
    };
    mg_xfer_cbs_t cbs = {on_probe_headers, on_probe_data, on_probe_done, NULL};
    /* the headers belong to the transfer now, whether or not it starts */
    if (mg_xfer_start(pr->d.upstream, &o, &cbs, p, &p->x) != 0) {
        probe_free(p);
        return -1;
    }
    sl->probe[kind] = p;
    sync_in_flight(pr, sl);
    return 0;
}

/* base + path, malloc'd; NULL when out of memory. */
static char *join_url(const char *base, const char *path)
{
    size_t n = strlen(base) + strlen(path) + 1;
    char *u = malloc(n);
    if (u) snprintf(u, n, "%s%s", base, path);
    return u;
}

static void maybe_health(mg_prober_t *pr, probe_slot_t *sl, const mg_gen_t *g, size_t i,
                         mg_provider_state_t *ps, uint64_t now)
{
    const mg_health_conf_t *hc = &g->cfg->health;
    uint64_t interval = (uint64_t)hc->probe_interval_ms;
    /* a provider restored as degraded or down gets its chance at once */
    if (!sl->health_due_ms)
        sl->health_due_ms = ps->health.state == MG_HEALTH_HEALTHY ? now + interval : now;
    if (sl->health_due_ms > now + interval)
        sl->health_due_ms = now + interval; /* interval shortened */
    if (now < sl->health_due_ms || sl->probe[PROBE_HEALTH]) return;
    const mg_provider_conf_t *pc = &g->cfg->providers[i];
    const char *path = "/models";
    const mg_adapter_t *a = NULL;
    if (g->provider_adapter && g->provider_adapter[i] >= 0 &&
        (size_t)g->provider_adapter[i] < g->n_adapters)
        a = &g->adapters[g->provider_adapter[i]];
    if (a && a->probe_path) path = a->probe_path;
    char *url = join_url(pc->base_url, path);
    sl->health_due_ms = now + interval;
    if (!url) return;
    ps->last_probe_ms = now;
    if (probe_start(pr, sl, PROBE_HEALTH, LOAD_NONE, url, a, pc->api_key, hc->probe_timeout_ms) ==
        0)
        sl->probe[PROBE_HEALTH]->status_only = strncmp(path, "/v2/health/", 11) == 0;
    free(url);
}

static void maybe_load(mg_prober_t *pr, probe_slot_t *sl, const mg_config_t *cfg,
                       const mg_provider_conf_t *pc, uint64_t now)
{
    load_kind_t lk = load_kind_of(pc, sl);
    uint64_t interval = (uint64_t)cfg->health.load_interval_ms;
    if (lk == LOAD_NONE) return;
    if (sl->load_due_ms > now + interval) sl->load_due_ms = now + interval;
    if (now < sl->load_due_ms || sl->probe[PROBE_LOAD]) return;
    sl->load_due_ms = now + interval;
    char *url = NULL;
    if (pc->metrics_url && lk != LOAD_LLAMA_SLOTS && lk != LOAD_OLLAMA) {
        url = strdup(pc->metrics_url); /* the engine's Prometheus text is elsewhere */
    } else if (lk == LOAD_TRITON) {
        char u[600];
        if (mg_probe_metrics_url(pc->base_url, TRITON_METRICS_PORT, u, sizeof(u)) == 0)
            url = strdup(u);
    } else {
        size_t n = strlen(pc->base_url) + 1;
        char *origin = malloc(n);
        if (!origin) return;
        if (mg_probe_origin(pc->base_url, origin, n) == 0) url = join_url(origin, load_path(lk));
        free(origin);
    }
    if (!url) return;
    probe_start(pr, sl, PROBE_LOAD, lk, url, NULL, pc->api_key, cfg->health.probe_timeout_ms);
    free(url);
}

static probe_slot_t *slot_get(mg_prober_t *pr, const char *id)
{
    for (probe_slot_t *sl = pr->slots; sl; sl = sl->next)
        if (strcmp(sl->id, id) == 0) return sl;
    probe_slot_t *sl = calloc(1, sizeof(*sl));
    if (!sl) return NULL;
    sl->id = strdup(id);
    if (!sl->id) {
        free(sl);
        return NULL;
    }
    sl->next = pr->slots;
    pr->slots = sl;
    return sl;
}

/* Drop the slots of providers that left the configuration once they are idle. */
static void slots_prune(mg_prober_t *pr)
{
    probe_slot_t **pp = &pr->slots;
    while (*pp) {
        probe_slot_t *sl = *pp;
        if (sl->seen || sl->probe[PROBE_HEALTH] || sl->probe[PROBE_LOAD]) {
            pp = &sl->next;
            continue;
        }
        *pp = sl->next;
        free(sl->id);
        free(sl);
    }
}

/* The slots of generation g's providers by index, found by id once per generation: the
 * slot list is searched by name, which at a thousand providers every 100 ms would cost more
 * than the probing. */
static void index_slots(mg_prober_t *pr, const mg_gen_t *g)
{
    const mg_config_t *cfg = g->cfg;
    if (pr->index_gen == g->id && pr->n_index == cfg->n_providers) return;
    free(pr->by_index);
    pr->by_index = calloc(cfg->n_providers ? cfg->n_providers : 1, sizeof(*pr->by_index));
    pr->n_index = pr->by_index ? cfg->n_providers : 0;
    pr->index_gen = g->id;
    for (size_t i = 0; i < pr->n_index; i++) {
        pr->by_index[i] = slot_get(pr, cfg->providers[i].id);
        if (!pr->by_index[i]) pr->index_gen = 0; /* out of memory: again next tick */
    }
}

static void on_tick(uv_timer_t *t)
{
    mg_prober_t *pr = t->data;
    const mg_gen_t *g = mg_gens_current(pr->d.gens);
    if (!g) return;
    const mg_config_t *cfg = g->cfg;
    uint64_t now = uv_now(pr->d.loop);
    index_slots(pr, g);
    for (probe_slot_t *sl = pr->slots; sl; sl = sl->next) sl->seen = 0;
    for (size_t i = 0; i < pr->n_index; i++) {
        const mg_provider_conf_t *pc = &cfg->providers[i];
        probe_slot_t *sl = pr->by_index[i];
        if (!sl) continue;
        sl->seen = 1; /* kept by slots_prune: by_index holds it */
        mg_provider_state_t *ps = mg_pool_get_at(pr->d.pool, i, pc);
        if (!ps || ps->disabled) continue;
        if (cfg->health.probes) maybe_health(pr, sl, g, i, ps, now);
        maybe_load(pr, sl, cfg, pc, now);
    }
    slots_prune(pr);
}

mg_prober_t *mg_probe_start(const mg_probe_deps_t *d)
{
    mg_prober_t *pr = calloc(1, sizeof(*pr));
    if (!pr) return NULL;
    pr->d = *d;
    if (uv_timer_init(d->loop, &pr->timer) != 0) {
        free(pr);
        return NULL;
    }
    pr->timer.data = pr;
    uv_timer_start(&pr->timer, on_tick, MG_PROBE_TICK_MS, MG_PROBE_TICK_MS);
    /* background work: the timer alone never keeps the loop running */
    uv_unref((uv_handle_t *)&pr->timer);
    return pr;
}

static void on_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

void mg_probe_stop(mg_prober_t *pr)
{
    if (!pr) return;
    uv_timer_stop(&pr->timer);
    while (pr->slots) {
        probe_slot_t *sl = pr->slots;
        pr->slots = sl->next;
        for (int k = 0; k < 2; k++) {
            probe_t *p = sl->probe[k];
            if (!p) continue;
            sl->probe[k] = NULL;
            mg_xfer_cancel(p->x);
            probe_free(p);
        }
        sync_in_flight(pr, sl);
        free(sl->id);
        free(sl);
    }
    free(pr->by_index);
    pr->by_index = NULL;
    pr->n_index = 0;
    uv_close((uv_handle_t *)&pr->timer, on_timer_closed);
}
