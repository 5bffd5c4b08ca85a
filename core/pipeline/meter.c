/* meter: a finished call's usage event and its cost; see call.h and obs/usage.h.
 *
 * Built on the loop at the call's one finish from what the call knows and appended to the
 * usage journal (obs/usage.h, store/journal.h), durable there at once; the store's writer
 * later makes it a row (INSERT OR IGNORE) and sums the roll-ups. Only when the journal cannot
 * take it (full, or not open) does the event go through the writer's queue, and then the
 * answer's last bytes wait for its commit (net/hold.h): either way "the client saw its whole
 * answer" implies "its event is durable". */
#include "pipeline/call.h"

#include <string.h>

#include "base/clock.h"
#include "net/hold.h"
#include "obs/usage.h"
#include "token/registry.h"
#include "token/tokenize.h"

void call_tokens(const call_t *c, mg_usage_tokens_t *t, int *input_estimated, int *output_estimated)
{
    memset(t, 0, sizeof(*t));
    if (input_estimated) *input_estimated = !c->have_usage;
    if (output_estimated) *output_estimated = !c->have_usage;
    /* no usage and no byte from the upstream: nothing was served, nothing is counted */
    if (!c->have_usage && !c->t_first) return;
    long long cached = c->cached_tokens > 0 ? c->cached_tokens : 0;
    long long written = c->cache_write_tokens > 0 ? c->cache_write_tokens : 0;
    long long prompt = c->prompt_tokens > 0 ? c->prompt_tokens : 0;
    if (!c->cache_apart) { /* OpenAI: cached_tokens are part of prompt_tokens */
        if (cached > prompt) cached = prompt;
        prompt -= cached;
    }
    t->input = prompt;
    t->cached_read = cached;
    t->cache_write = written;
    t->output = c->completion_tokens > 0 ? c->completion_tokens : 0;
    t->reasoning =
        c->reasoning_tokens > 0 && c->reasoning_tokens <= t->output ? c->reasoning_tokens : 0;
}

int64_t call_cost_micros(const call_t *c, const char **version)
{
    if (version) *version = NULL;
    if (!c->provider) return 0;
    mg_usage_tokens_t t;
    call_tokens(c, &t, NULL, NULL);
    return mg_price_cost(c->gen->cfg, c->provider->id, c->upstream_model, &t,
                         (int64_t)(mg_unix_ms() / 1000), version);
}

/* The event's outcome, as the task's terminal state says it. */
static const char *event_status(const call_t *c)
{
    switch (c->task.state) {
    case MG_TASK_SUCCEEDED: return "succeeded";
    case MG_TASK_CANCELLED: return "cancelled";
    case MG_TASK_TIMED_OUT: return "timed_out";
    default: return "failed";
    }
}

/* The surface the client called: a Messages or Responses call runs as chat, but its event
 * says what the client used. */
static const char *endpoint_name(const call_t *c)
{
    switch (call_client_ep(c)) {
    case MG_EP_CHAT: return "chat";
    case MG_EP_MESSAGES: return "messages";
    case MG_EP_RESPONSES: return "responses";
    case MG_EP_COMPLETIONS: return "completions";
    case MG_EP_EMBEDDINGS: return "embeddings";
    default: return c->req && c->req->path ? c->req->path : "other";
    }
}

static int64_t whole_ms(uint64_t from, uint64_t to)
{
    return (int64_t)ms_since(from, to);
}

/* The text of a whole answer's choices (message.content, text) counted with the model's
 * encoding, or its bytes / 4 without one. Only for answers without usage: it parses. */
static long long answer_output_tokens(const call_t *c)
{
    const mg_encoding_t *enc = c->model ? mg_token_registry_get(c->model->tokenizer - 1) : NULL;
    cJSON *a = c->answer.len ? cJSON_ParseWithLength(c->answer.data, c->answer.len) : NULL;
    long long n = 0;
    const cJSON *ch;
    cJSON_ArrayForEach(ch, cJSON_GetObjectItemCaseSensitive(a, "choices")) {
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        const cJSON *t = msg ? cJSON_GetObjectItemCaseSensitive(msg, "content")
                             : cJSON_GetObjectItemCaseSensitive(ch, "text");
        if (!cJSON_IsString(t)) continue;
        size_t len = strlen(t->valuestring);
        long k = enc ? mg_tokenize_count(enc, t->valuestring, len, 0) : -1;
        n += k >= 0 ? k : (long long)(len + 3) / 4;
    }
    cJSON_Delete(a);
    return n;
}

/* A whole answer whose upstream reported no usage: the gateway's counts (estimated). */
static void estimate_answer(call_t *c)
{
    if (c->have_usage || c->answer_kind != ANSWER_JSON) return;
    int64_t p = prompt_count(c);
    c->prompt_tokens = p >= 0 ? p : (long long)calib_estimate(calib_route_bpt(c), c->req->body_len);
    c->completion_tokens = c->ep == MG_EP_EMBEDDINGS ? 0 : answer_output_tokens(c);
}

void meter_finish(call_t *c, int answer_pending)
{
    if (c->metered || !c->routed || !c->req || !c->gen->cfg->usage.enabled || !c->pl->store) return;
    c->metered = 1;
    estimate_answer(c);
    uint64_t now = uv_hrtime();
    mg_usage_event_t e;
    memset(&e, 0, sizeof(e));
    e.request_id = c->req->request_id;
    e.at_ms = (int64_t)mg_unix_ms();
    e.endpoint = endpoint_name(c);
    if (c->auth.held) {
        e.tenant_id = c->auth.tenant_id;
        e.project_id = c->auth.project_id;
        e.key_id = c->auth.key_id;
    }
    e.application = c->app ? c->app->name : NULL;
    e.user = call_user(c);
    e.logical_model = c->model ? c->model->name : NULL;
    e.actual_model = c->provider ? c->upstream_model : NULL;
    e.provider = c->provider ? c->provider->id : NULL;
    e.pool = c->provider ? c->provider->pool : NULL;
    e.attempts = c->attempts;
    e.status = event_status(c);
    e.http_status = c->status;
    e.error_code = strcmp(e.status, "succeeded") ? c->error_code : NULL;
    e.stream = c->stream;
    call_tokens(c, &e.tokens, &e.input_estimated, &e.output_estimated);
    e.latency_ms = whole_ms(c->t_start, now);
    e.ttft_ms = c->t_first ? whole_ms(c->t_start, c->t_first) : -1;
    e.queue_ms = whole_ms(c->t_start, c->t_dispatch ? c->t_dispatch : now);
    e.cost_micros = call_cost_micros(c, &e.price_version);
    char rb[32];
    e.degraded = c->status < 400 ? degraded_reason(c, rb, sizeof(rb)) : NULL;
    e.cancelled = strcmp(e.status, "cancelled") == 0;
    /* the disk full: the event waits in memory, the answer does not wait for it */
    int full = c->pl->store && mg_store_disk_full(c->pl->store);
    mg_hold_t *h = answer_pending && !full ? mg_hold_new() : NULL;
    if (h) mg_hold_expect(h);
    if (mg_usage_write(c->pl->store, &e, h ? mg_hold_committed : NULL, h) != 0 && h)
        mg_hold_unexpect(h);
    c->end_hold = h; /* journaled (the common case): its commit came already, nothing waits */
}
