/* upmodels: the providers' model lists, fetched in the background; see upmodels.h.
 *
 * Lifetimes: one slot per provider id (a list; fetches point at their slot) holds the last
 * good list, the schedule and the fetch in flight. A slot whose provider left the
 * configuration (or lost its prefix, or was disabled) is dropped once nothing of it is in
 * flight. A fetch owns its body buffer and a reference on the generation it started with
 * (its adapter decodes the answer); it is freed when its transfer ends or is cancelled. The
 * listing is rebuilt on demand from the current generation and the slots' lists. */
#include "route/upmodels.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

typedef struct um_slot_s um_slot_t;

typedef struct um_fetch_s {
    mg_upmodels_t *u;
    um_slot_t *sl;
    mg_gen_t *gen; /* one reference held */
    int adapter;
    mg_xfer_t *x;
    int status;
    char *buf; /* owned: the body, up to MG_UPMODELS_MAX_BODY */
    size_t len, cap;
    int too_big;
    const char *detail; /* why the transfer failed; valid while it is being finished */
} um_fetch_t;

struct um_slot_s {
    um_slot_t *next;
    char *id;     /* owned */
    char *source; /* owned: adapter + " " + base_url the list came from */
    char **ids;   /* owned: the last good list */
    size_t n_ids;
    int have;        /* a list came (ids may still be empty) */
    int failing;     /* the failure was logged; said again only after a success */
    int fails;       /* in a row */
    int seen;        /* wanted by the current generation (set each tick) */
    uint64_t due_ms; /* 0 = now */
    um_fetch_t *fetch;
};

struct mg_upmodels_s {
    mg_upmodels_deps_t d;
    uv_timer_t timer;
    um_slot_t *slots;
    mg_model_list_t list; /* the listing, for list_gen and list_serial */
    unsigned list_gen;    /* 0 = none built */
    unsigned serial;      /* bumped when a slot's list changes */
    unsigned list_serial;
    int list_on; /* protocols.models_refresh_seconds > 0 when it was built */
};

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

static void fetch_free(um_fetch_t *f)
{
    mg_gen_unref(f->gen);
    free(f->buf);
    free(f);
}

static uint64_t refresh_ms(const mg_upmodels_t *u)
{
    return (uint64_t)mg_gens_current(u->d.gens)->cfg->protocols.models_refresh_s * 1000;
}

static void set_list(mg_upmodels_t *u, um_slot_t *sl, char **ids, size_t n)
{
    mg_model_ids_free(sl->ids, sl->n_ids);
    sl->ids = ids;
    sl->n_ids = n;
    sl->have = 1;
    u->serial++;
}

/* A fetch failed: the last list stays; said once; tried again sooner than the refresh. */
static void fetch_failed(um_fetch_t *f, mg_xfer_result_t r, const char *why)
{
    um_slot_t *sl = f->sl;
    uint64_t wait = MG_UPMODELS_RETRY_MS, most = refresh_ms(f->u);
    for (int i = 1; i < sl->fails && wait < most; i++) wait *= 2;
    sl->fails++;
    sl->due_ms = uv_now(f->u->d.loop) + (wait < most ? wait : most);
    if (sl->failing) return;
    sl->failing = 1;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_WARN, "provider models unavailable");
    mg_log_str(&l, "provider", sl->id);
    mg_log_int(&l, "status", f->status);
    mg_log_str(&l, "result", result_name(r));
    mg_log_str(&l, "reason", why);
    if (f->detail) mg_log_str(&l, "detail", f->detail);
    mg_log_int(&l, "kept", sl->have ? (long long)sl->n_ids : -1);
    mg_log_end(&l);
}

static void fetch_worked(um_fetch_t *f, char **ids, size_t n)
{
    um_slot_t *sl = f->sl;
    int tell = !sl->have || sl->failing || sl->n_ids != n;
    set_list(f->u, sl, ids, n);
    sl->fails = 0;
    sl->failing = 0;
    sl->due_ms = uv_now(f->u->d.loop) + refresh_ms(f->u);
    if (!tell) return;
    mg_logline_t l;
    mg_log_begin(&l, MG_LOG_INFO, "provider models");
    mg_log_str(&l, "provider", sl->id);
    mg_log_int(&l, "models", (long long)n);
    mg_log_end(&l);
}

/* The transfer of f ended (or was cut short by us): read its answer, free f. */
static void fetch_finish(um_fetch_t *f, mg_xfer_result_t r)
{
    f->sl->fetch = NULL;
    f->x = NULL;
    if (r != MG_XFER_OK || f->too_big || f->status < 200 || f->status > 299) {
        fetch_failed(f, r, r != MG_XFER_OK ? "no answer" : f->too_big ? "too large" : "status");
        fetch_free(f);
        return;
    }
    cJSON *body = cJSON_ParseWithLength(f->buf ? f->buf : "", f->len);
    char **ids = NULL, err[256] = "";
    size_t n = 0;
    if (!body) fetch_failed(f, r, "not json");
    else if (mg_gen_models_decode(f->gen, f->adapter, body, &ids, &n, err, sizeof(err)) != 0) {
        f->detail = err;
        fetch_failed(f, r, "unreadable list");
    } else fetch_worked(f, ids, n);
    cJSON_Delete(body);
    fetch_free(f);
}

static void on_headers(void *ud, int status)
{
    ((um_fetch_t *)ud)->status = status;
}

static int on_data(void *ud, const char *data, size_t len)
{
    um_fetch_t *f = ud;
    if (f->len + len > MG_UPMODELS_MAX_BODY) {
        f->too_big = 1;
        mg_xfer_cancel(f->x);
        fetch_finish(f, MG_XFER_OK);
        return 0;
    }
    if (f->len + len > f->cap) {
        size_t cap = f->cap ? f->cap : 16384;
        while (cap < f->len + len) cap *= 2;
        char *nb = realloc(f->buf, cap);
        if (!nb) {
            mg_xfer_cancel(f->x);
            f->detail = "out of memory";
            fetch_finish(f, MG_XFER_ERROR);
            return 0;
        }
        f->buf = nb;
        f->cap = cap;
    }
    memcpy(f->buf + f->len, data, len);
    f->len += len;
    return 0;
}

static void on_done(void *ud, mg_xfer_result_t result, const char *detail)
{
    um_fetch_t *f = ud;
    f->detail = detail;
    fetch_finish(f, result);
}

/* Ask provider i of g for its list. Nothing in flight when it could not start. */
static void fetch_start(mg_upmodels_t *u, um_slot_t *sl, mg_gen_t *g, size_t i)
{
    const mg_provider_conf_t *p = &g->cfg->providers[i];
    int adapter = g->provider_adapter[i];
    mg_encoded_t req;
    char err[256];
    sl->due_ms = uv_now(u->d.loop) + refresh_ms(u);
    int rc = mg_gen_models_request(g, adapter, p, &req, err, sizeof(err));
    if (rc != 0) { /* 1: the adapter lists none after all */
        if (rc < 0) mg_log_msg(MG_LOG_WARN, NULL, "provider models: %s", err);
        return;
    }
    size_t n = strlen(p->base_url) + strlen(req.path) + 1;
    char *url = malloc(n);
    um_fetch_t *f = calloc(1, sizeof(*f));
    struct curl_slist *h = req.headers, *nh;
    req.headers = NULL;
    const char *fixed[] = {"Accept: application/json",
                           "User-Agent: moongate/" MOONGATE_VERSION " (models)"};
    for (size_t k = 0; k < 2 && h; k++)
        if ((nh = curl_slist_append(h, fixed[k]))) h = nh;
    if (!h) h = curl_slist_append(NULL, fixed[0]);
    if (!url || !f || !h) {
        free(url);
        free(f);
        curl_slist_free_all(h);
        mg_encoded_free(&req);
        return;
    }
    snprintf(url, n, "%s%s", p->base_url, req.path);
    mg_encoded_free(&req);
    int t = g->cfg->health.probe_timeout_ms;
    mg_xfer_opts_t o = {.method = "GET",
                        .url = url,
                        .headers = h,
                        .connect_timeout_ms = t,
                        .first_byte_timeout_ms = t,
                        .idle_timeout_ms = t,
                        .total_timeout_ms = 3 * t};
    mg_xfer_cbs_t cbs = {on_headers, on_data, on_done, NULL};
    *f = (um_fetch_t){.u = u, .sl = sl, .gen = g, .adapter = adapter};
    mg_gen_ref(g);
    /* the headers belong to the transfer now, whether or not it starts */
    if (mg_xfer_start(u->d.upstream, &o, &cbs, f, &f->x) != 0) fetch_free(f);
    else sl->fetch = f;
    free(url);
}

static um_slot_t *slot_get(mg_upmodels_t *u, const char *id)
{
    for (um_slot_t *sl = u->slots; sl; sl = sl->next)
        if (strcmp(sl->id, id) == 0) return sl;
    um_slot_t *sl = calloc(1, sizeof(*sl));
    if (!sl || !(sl->id = strdup(id))) {
        free(sl);
        return NULL;
    }
    sl->next = u->slots;
    u->slots = sl;
    return sl;
}

static void slot_free(um_slot_t *sl)
{
    mg_model_ids_free(sl->ids, sl->n_ids);
    free(sl->source);
    free(sl->id);
    free(sl);
}

/* Whether provider i of g is one whose models are listed. */
static int wanted(const mg_gen_t *g, size_t i)
{
    const mg_provider_conf_t *p = &g->cfg->providers[i];
    int a = g->provider_adapter ? g->provider_adapter[i] : -1;
    return p->model_prefix && !p->disabled && a >= 0 && (size_t)a < g->n_adapters;
}

/* The slot's list came from another adapter or base_url than provider p's now: start over. */
static void check_source(mg_upmodels_t *u, um_slot_t *sl, const mg_provider_conf_t *p)
{
    char src[2048];
    snprintf(src, sizeof(src), "%s %s", p->adapter, p->base_url);
    if (sl->source && strcmp(sl->source, src) == 0) return;
    if (sl->source) {
        if (sl->fetch) {
            mg_xfer_cancel(sl->fetch->x);
            fetch_free(sl->fetch);
            sl->fetch = NULL;
        }
        mg_model_ids_free(sl->ids, sl->n_ids);
        sl->ids = NULL;
        sl->n_ids = 0;
        sl->have = sl->failing = sl->fails = 0;
        sl->due_ms = 0;
        u->serial++;
    }
    free(sl->source);
    sl->source = strdup(src);
}

/* Drop the slots no provider wants any more. */
static void slots_prune(mg_upmodels_t *u)
{
    for (um_slot_t **pp = &u->slots; *pp;) {
        um_slot_t *sl = *pp;
        if (sl->seen) {
            pp = &sl->next;
            continue;
        }
        if (sl->fetch) {
            mg_xfer_cancel(sl->fetch->x);
            fetch_free(sl->fetch);
        }
        *pp = sl->next;
        if (sl->have) u->serial++;
        slot_free(sl);
    }
}

static void on_tick(uv_timer_t *t)
{
    mg_upmodels_t *u = t->data;
    mg_gen_t *g = mg_gens_current(u->d.gens);
    if (!g) return;
    uint64_t now = uv_now(u->d.loop);
    for (um_slot_t *sl = u->slots; sl; sl = sl->next) sl->seen = 0;
    int on = g->cfg->protocols.models_refresh_s > 0; /* 0: off, every list dropped */
    for (size_t i = 0; on && i < g->cfg->n_providers; i++) {
        if (!wanted(g, i)) continue;
        um_slot_t *sl = slot_get(u, g->cfg->providers[i].id);
        if (!sl) continue;
        sl->seen = 1;
        check_source(u, sl, &g->cfg->providers[i]);
        if (!sl->fetch && now >= sl->due_ms) fetch_start(u, sl, g, i);
    }
    slots_prune(u);
}

mg_upmodels_t *mg_upmodels_start(const mg_upmodels_deps_t *d)
{
    mg_upmodels_t *u = calloc(1, sizeof(*u));
    if (!u) return NULL;
    u->d = *d;
    if (uv_timer_init(d->loop, &u->timer) != 0) {
        free(u);
        return NULL;
    }
    u->timer.data = u;
    uv_timer_start(&u->timer, on_tick, 0, MG_UPMODELS_TICK_MS);
    uv_unref((uv_handle_t *)&u->timer); /* background work never keeps the loop running */
    return u;
}

static void on_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

void mg_upmodels_stop(mg_upmodels_t *u)
{
    if (!u) return;
    uv_timer_stop(&u->timer);
    while (u->slots) {
        um_slot_t *sl = u->slots;
        u->slots = sl->next;
        if (sl->fetch) {
            mg_xfer_cancel(sl->fetch->x);
            fetch_free(sl->fetch);
        }
        slot_free(sl);
    }
    mg_model_list_free(&u->list);
    uv_close((uv_handle_t *)&u->timer, on_timer_closed);
}

static const um_slot_t *slot_find(const mg_upmodels_t *u, const char *id)
{
    for (const um_slot_t *sl = u->slots; sl; sl = sl->next)
        if (strcmp(sl->id, id) == 0) return sl;
    return NULL;
}

const mg_model_list_t *mg_upmodels_list(mg_upmodels_t *u)
{
    static const mg_model_list_t empty = {0};
    const mg_gen_t *g = u ? mg_gens_current(u->d.gens) : NULL;
    if (!g) return &empty;
    const mg_config_t *cfg = g->cfg;
    int on = cfg->protocols.models_refresh_s > 0;
    if (u->list_gen == g->id && u->list_serial == u->serial && u->list_on == on) return &u->list;
    mg_model_ids_t *lists = calloc(cfg->n_providers ? cfg->n_providers : 1, sizeof(*lists));
    if (!lists) return &empty;
    for (size_t i = 0; i < cfg->n_providers; i++) {
        const um_slot_t *sl = on && wanted(g, i) ? slot_find(u, cfg->providers[i].id) : NULL;
        if (sl && sl->have) lists[i] = (mg_model_ids_t){sl->ids, sl->n_ids};
    }
    mg_model_list_free(&u->list);
    int rc = mg_model_list_build(cfg, lists, &u->list);
    free(lists);
    if (rc != 0) {
        u->list_gen = 0;
        return &empty;
    }
    u->list_gen = g->id;
    u->list_serial = u->serial;
    u->list_on = on;
    return &u->list;
}
