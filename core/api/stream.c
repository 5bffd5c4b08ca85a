/* stream: the dashboard's SSE stream; see stream.h. */
#include "api/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "api/api.h"
#include "base/clock.h"
#include "base/crypto.h"
#include "base/json.h"
#include "obs/answer.h"

#define REPLAY_NEW 50         /* requests a new stream starts with */
#define MAX_REQUESTS_TICK 100 /* request events written to one client per tick */
#define KEEPALIVE_MS 15000
#define DROP_AFTER_MS 10000 /* output still queued this long: the client is dropped */

struct mg_stream_client_s {
    mg_streams_t *s;
    mg_http_req_t *req;
    uint64_t serial; /* its session */
    mg_admin_role_t role;
    int64_t tenant_id;
    uint64_t last_seq;         /* the last request event considered */
    uint64_t snap_hash;        /* of the last snapshot sent */
    uint64_t last_write_ms;    /* loop time */
    uint64_t stalled_since_ms; /* 0 = writing freely */
    char model[64];            /* request events filtered by: "" = any */
    char provider[64];
    int errors_only; /* status >= 400 only */
    mg_stream_client_t *next;
};

/* ---- the snapshot ------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static cJSON *scheduler_json(mg_sched_t *sched)
{
    mg_sched_stats_t ss;
    mg_sched_stats(sched, &ss);
    cJSON *sc = cJSON_CreateObject();
    cJSON_AddNumberToObject(sc, "running", ss.running);
    cJSON_AddNumberToObject(sc, "queued", ss.queued);
    cJSON *qp = cJSON_AddObjectToObject(sc, "queued_by_priority");
    for (int p = 0; p < MG_PRIO_COUNT; p++)
        cJSON_AddNumberToObject(qp, mg_priority_name((mg_priority_t)p), ss.queued_by_prio[p]);
    cJSON_AddNumberToObject(sc, "load", ss.load);
    cJSON_AddNumberToObject(sc, "backpressure_level", ss.level);
    return sc;
}

/* The providers as the admin API lists them, less what a screen has no use for: the
 * masked key goes too (a dashboard is watched over shoulders). */
static cJSON *providers_json(mg_streams_t *s)
{
    cJSON *list = mg_admin_providers_view(s->admin);
    cJSON *p;
    cJSON_ArrayForEach(p, list) cJSON_DeleteItemFromObjectCaseSensitive(p, "api_key");
    return list;
}

static cJSON *platform_snapshot(mg_streams_t *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "scope", "platform");
    cJSON_AddNumberToObject(o, "generation", mg_gens_current(s->gens)->id);
    cJSON_AddNumberToObject(o, "in_flight", s->d.pipeline->in_flight);
    cJSON_AddNumberToObject(o, "connections", (double)s->d.listener->n_conns);
    cJSON_AddNumberToObject(o, "streams", s->n);
    cJSON_AddItemToObject(o, "scheduler", scheduler_json(s->d.sched));
    cJSON_AddItemToObject(o, "providers", providers_json(s));
    cJSON_AddItemToObject(o, "pools", mg_admin_pools_view(s->admin));
    if (s->d.pipeline->fulllog) { /* the banner while prompts are logged in full */
        cJSON *lg = mg_fulllog_view(s->d.pipeline->fulllog);
        cJSON_DeleteItemFromObjectCaseSensitive(lg,
                                                "remaining_seconds"); /* ticks: the page counts */
        cJSON_AddItemToObject(o, "logging", lg);
    }
    cJSON *rl = cJSON_AddObjectToObject(o, "reload");
    cJSON_AddStringToObject(rl, "result", s->d.proc->reload_result);
    if (s->d.proc->reload_error[0]) cJSON_AddStringToObject(rl, "error", s->d.proc->reload_error);
    else cJSON_AddNullToObject(rl, "error");
    cJSON_AddNumberToObject(rl, "at", (double)s->d.proc->reload_at);
    return o;
}

static cJSON *tenant_snapshot(int64_t tenant_id)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "scope", "tenant");
    cJSON_AddNumberToObject(o, "tenant_id", (double)tenant_id);
    return o;
}

/* A snapshot's text (no server time: it is what "changed" compares). */
typedef struct snap_s {
    mg_buf_t text;
    uint64_t hash;
    int built;
} snap_t;

static int snap_build(snap_t *sn, cJSON *tree)
{
    int rc = tree ? mg_json_print(tree, &sn->text) : -1;
    cJSON_Delete(tree);
    if (rc != 0) return -1;
    sn->hash = fnv1a(sn->text.data, sn->text.len);
    sn->built = 1;
    return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

static void request_event(mg_buf_t *b, const mg_recent_entry_t *e)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "seq", (double)e->seq);
    cJSON_AddNumberToObject(o, "at_ms", (double)e->at_ms);
    cJSON_AddStringToObject(o, "request_id", e->request_id);
    cJSON_AddStringToObject(o, "path", e->path);
    cJSON_AddStringToObject(o, "model", e->model);
    cJSON_AddStringToObject(o, "provider", e->provider);
    cJSON_AddStringToObject(o, "outcome", e->outcome);
    if (e->error[0]) cJSON_AddStringToObject(o, "error", e->error);
    cJSON_AddNumberToObject(o, "status", e->status);
    cJSON_AddBoolToObject(o, "stream", e->stream);
    cJSON_AddNumberToObject(o, "duration_ms", e->duration_ms);
    if (e->ttft_ms > 0) cJSON_AddNumberToObject(o, "ttft_ms", e->ttft_ms);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)e->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)e->completion_tokens);
    if (e->tenant_id) cJSON_AddNumberToObject(o, "tenant_id", (double)e->tenant_id);
    if (e->key_id) cJSON_AddNumberToObject(o, "key_id", (double)e->key_id);
    mg_buf_append_str(b, "event: request\nid: ");
    mg_buf_append_int(b, (long long)e->seq);
    mg_buf_append_str(b, "\ndata: ");
    mg_json_print(o, b);
    mg_buf_append_str(b, "\n\n");
    cJSON_Delete(o);
}

/* The request events after c->last_seq that c may see (its tenant's only, for a tenant). */
static void add_requests(mg_stream_client_t *c, mg_buf_t *b)
{
    const mg_recent_t *r = c->s->d.recent;
    uint64_t first = mg_recent_first(r);
    if (c->last_seq + 1 < first) {
        char gap[80];
        snprintf(gap, sizeof(gap), "event: gap\ndata: {\"missed\":%llu}\n\n",
                 (unsigned long long)(first - c->last_seq - 1));
        mg_buf_append_str(b, gap);
        c->last_seq = first - 1;
    }
    int sent = 0;
    while (c->last_seq + 1 < r->next_seq && sent < MAX_REQUESTS_TICK) {
        const mg_recent_entry_t *e = mg_recent_get(r, ++c->last_seq);
        if (!e || (c->role == MG_ADMIN_TENANT && e->tenant_id != c->tenant_id)) continue;
        if ((c->model[0] && strcmp(c->model, e->model) != 0) ||
            (c->provider[0] && strcmp(c->provider, e->provider) != 0) ||
            (c->errors_only && e->status < 400))
            continue;
        request_event(b, e);
        sent++;
    }
}

static void add_snapshot(mg_stream_client_t *c, mg_buf_t *b, const snap_t *sn, uint64_t now)
{
    if (sn->built && sn->hash != c->snap_hash) {
        char head[96];
        snprintf(head, sizeof(head), "event: snapshot\nid: %llu\ndata: {\"server_time_ms\":%llu,",
                 (unsigned long long)c->last_seq, (unsigned long long)mg_unix_ms());
        mg_buf_append_str(b, head);
        mg_buf_append(b, sn->text.data + 1, sn->text.len - 1); /* past its '{' */
        mg_buf_append_str(b, "\n\n");
        c->snap_hash = sn->hash;
    } else if (!b->len && now - c->last_write_ms >= KEEPALIVE_MS) {
        mg_buf_append_str(b, ": keepalive\n\n");
    }
}

/* ---- clients ------------------------------------------------------------------------------ */

static void unlink_client(mg_stream_client_t *c)
{
    mg_streams_t *s = c->s;
    for (mg_stream_client_t **p = &s->clients; *p; p = &(*p)->next) {
        if (*p != c) continue;
        *p = c->next;
        s->n--;
        break;
    }
    if (!s->n && s->timer_on) {
        uv_timer_stop(&s->timer);
        s->timer_on = 0;
    }
}

/* End c's stream (with a last event, may be NULL) and free it. */
static void end_client(mg_stream_client_t *c, const char *last, int drop)
{
    unlink_client(c);
    mg_http_req_t *req = c->req;
    req->on_abort = NULL;
    if (drop) mg_http_set_close(req);
    mg_http_stream_send(req, last ? last : "", last ? strlen(last) : 0, 1);
    free(c);
}

static void on_client_gone(void *data)
{
    mg_stream_client_t *c = data;
    unlink_client(c);
    free(c);
}

/* One client's turn: 0 written or skipped, -1 ended. */
static int serve_client(mg_stream_client_t *c, const snap_t *platform, uint64_t now)
{
    mg_streams_t *s = c->s;
    if (!mg_websession_by_serial(s->sessions, c->serial, mg_unix_ms())) {
        end_client(c, "event: signed_out\ndata: {}\n\n", 0);
        return -1;
    }
    if (mg_http_write_pending(c->req)) {
        if (!c->stalled_since_ms) c->stalled_since_ms = now;
        if (now - c->stalled_since_ms < DROP_AFTER_MS) return 0;
        s->dropped_total++;
        end_client(c, NULL, 1);
        return -1;
    }
    c->stalled_since_ms = 0;
    mg_buf_t b = {0};
    snap_t own = {0};
    add_requests(c, &b);
    if (c->role == MG_ADMIN_TENANT) snap_build(&own, tenant_snapshot(c->tenant_id));
    add_snapshot(c, &b, c->role == MG_ADMIN_TENANT ? &own : platform, now);
    if (b.len) {
        mg_http_stream_write(c->req, b.data, b.len);
        c->last_write_ms = now;
    }
    mg_buf_free(&b);
    mg_buf_free(&own.text);
    return 0;
}

static void tick_all(mg_streams_t *s, mg_stream_client_t *only)
{
    uint64_t now = uv_now(s->loop);
    snap_t platform = {0};
    for (mg_stream_client_t *c = s->clients, *next; c; c = next) {
        next = c->next;
        if (only && c != only) continue;
        if (c->role == MG_ADMIN_PLATFORM && !platform.built)
            snap_build(&platform, platform_snapshot(s));
        serve_client(c, &platform, now);
    }
    mg_buf_free(&platform.text);
}

static void on_tick(uv_timer_t *t)
{
    tick_all(t->data, NULL);
}

/* ---- lifecycle ---------------------------------------------------------------------------- */

int mg_streams_init(mg_streams_t *s, uv_loop_t *loop, mg_gens_t *gens, mg_metrics_t *metrics,
                    mg_admin_t *admin, mg_websessions_t *sessions, const mg_stream_deps_t *d)
{
    memset(s, 0, sizeof(*s));
    s->d = *d;
    s->loop = loop;
    s->gens = gens;
    s->metrics = metrics;
    s->admin = admin;
    s->sessions = sessions;
    s->timer.data = s;
    return uv_timer_init(loop, &s->timer);
}

/* ?name=value of the query string, %XX and '+' decoded, into out; 1 when present (and
 * short enough, decodable), else 0. */
static int query_param(const char *query, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = query; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
        if (strncmp(p, name, n) != 0 || p[n] != '=') continue;
        size_t w = 0;
        for (const char *r = p + n + 1; *r && *r != '&'; r++) {
            int ch = *r == '+' ? ' ' : (unsigned char)*r;
            if (*r == '%') {
                int hi = mg_hex_digit(r[1]), lo = hi < 0 ? -1 : mg_hex_digit(r[2]);
                if (lo < 0 || (hi | lo) == 0) return 0;
                ch = hi * 16 + lo;
                r += 2;
            }
            if (w + 1 >= cap) return 0;
            out[w++] = (char)ch;
        }
        out[w] = '\0';
        return 1;
    }
    return 0;
}

/* Where to resume: Last-Event-ID (the browser's reconnect), else ?last_event_id= (a page
 * that reopens its stream with other filters); -1 for none. */
static long long last_event_id(const mg_http_req_t *req)
{
    char q[24] = "";
    const char *h = mg_http_header(req, "Last-Event-ID");
    if ((!h || !*h) && query_param(req->query, "last_event_id", q, sizeof(q))) h = q;
    if (!h || !*h) return -1;
    char *end;
    long long v = strtoll(h, &end, 10);
    return *end || v < 0 ? -1 : v;
}

static void read_filters(mg_stream_client_t *c, const mg_http_req_t *req)
{
    char errors[8] = "";
    if (!query_param(req->query, "model", c->model, sizeof(c->model))) c->model[0] = '\0';
    if (!query_param(req->query, "provider", c->provider, sizeof(c->provider)))
        c->provider[0] = '\0';
    c->errors_only =
        query_param(req->query, "errors", errors, sizeof(errors)) && !strcmp(errors, "1");
}

void mg_streams_open(mg_streams_t *s, mg_http_req_t *req, const mg_websession_t *se)
{
    const mg_dashboard_conf_t *dc = &mg_gens_current(s->gens)->cfg->dashboard;
    if (s->stopping || s->n >= dc->max_streams) {
        mg_answer_error(s->metrics, req, MG_EP_OTHER, 503, "STREAMS_FULL",
                        s->stopping ? "the gateway is stopping"
                                    : "too many dashboard streams are open (dashboard.max_streams)",
                        5000);
        return;
    }
    mg_stream_client_t *c = calloc(1, sizeof(*c));
    if (!c) {
        mg_answer_error(s->metrics, req, MG_EP_OTHER, 500, "INTERNAL_ERROR", "out of memory", 0);
        return;
    }
    uint64_t next = s->d.recent->next_seq;
    long long resume = last_event_id(req);
    *c = (mg_stream_client_t){.s = s,
                              .req = req,
                              .serial = se->serial,
                              .role = se->role,
                              .tenant_id = se->tenant_id,
                              .last_seq = next > REPLAY_NEW ? next - 1 - REPLAY_NEW : 0,
                              .last_write_ms = uv_now(s->loop)};
    if (resume >= 0 && (uint64_t)resume < next) c->last_seq = (uint64_t)resume;
    read_filters(c, req);
    c->next = s->clients;
    s->clients = c;
    s->n++;
    req->on_abort = on_client_gone;
    req->hook_data = c;
    mg_answer_account(s->metrics, req, MG_EP_OTHER, 200, NULL);
    static const char first[] = "retry: 3000\n: moongate dashboard stream\n\n";
    mg_http_stream_open(req, 200, "text/event-stream",
                        "Cache-Control: no-store\r\nX-Accel-Buffering: no\r\n", first,
                        sizeof(first) - 1, 0);
    if (!s->timer_on) {
        uv_timer_start(&s->timer, on_tick, (uint64_t)dc->stream_interval_ms,
                       (uint64_t)dc->stream_interval_ms);
        s->timer_on = 1;
    }
    tick_all(s, c); /* the first snapshot at once */
}

void mg_streams_end_session(mg_streams_t *s, uint64_t serial)
{
    for (mg_stream_client_t *c = s->clients, *next; c; c = next) {
        next = c->next;
        if (c->serial == serial) end_client(c, "event: signed_out\ndata: {}\n\n", 0);
    }
}

void mg_streams_stop(mg_streams_t *s)
{
    s->stopping = 1;
    while (s->clients) end_client(s->clients, NULL, 1);
}

void mg_streams_close(mg_streams_t *s)
{
    mg_streams_stop(s);
    if (!uv_is_closing((uv_handle_t *)&s->timer)) uv_close((uv_handle_t *)&s->timer, NULL);
}
