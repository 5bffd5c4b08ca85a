/* call: one inference request on its way through the pipeline, and the steps it takes.
 * Private to core/pipeline/.
 *
 * The steps, in order (each a function in the file of its concept):
 *
 *   parse        body.c     the body read (as bytes when it can be, else a cJSON tree),
 *                           checked, the gateway's extensions taken out
 *   identify     admit.c    the caller authenticated (auth on): nothing below is touched
 *                           for a caller who is not
 *   idempotency  admit.c    a request with an idempotency key is handed to idem.c
 *   admit        admit.c    the logical model, the application's and the user's
 *                           permissions and rates, the key's quota reserved
 *   context      context.c  a chat request's session history replayed (waiting while another
 *                           request holds the session), the model's budget, the trimming
 *                           policy
 *   enqueue      admit.c    the scheduler's queue; resumed when a slot is free
 *   route        attempt.c  policies/routing.lua's plan over the model's routes
 *   reserve      attempt.c  the plan's next entry whose provider's limits let it through
 *   shared       shared.c   with cluster.redis: the key's, project's and provider's limits
 *                           reserved across instances in one Redis script (waits for its
 *                           answer; a no-op on a single node)
 *   encode       attempt.c  the adapter's upstream request
 *   send         attempt.c  the upstream transfer started; its callbacks (answer.c) stream
 *                           the answer, or go back to reserve when it failed before the
 *                           first byte reached the client
 *   stream       answer.c   the upstream's answer is complete: checked, annotated and
 *                           decoded, or the stream's end
 *   finish       call.c     the one end of every call: task state, metrics, log line, the
 *                           answer (or error) written, everything freed
 *
 * The runner (mg_call_run) calls the step c->step after setting c->step to the one after
 * it, so a step that returns MG_STEP_NEXT goes on in order, and a step may set c->step
 * first to go elsewhere (call_error goes to finish; a failed attempt goes back to reserve).
 * A step that waits (queue, timer, upstream) returns MG_STEP_AGAIN with c->step set to where
 * the call resumes; the callback that resumes it calls mg_call_run. MG_STEP_DONE: the call
 * is over and freed (finish, or handed to idem.c). A step or callback that may have run the
 * call synchronously to its end (the scheduler's pump dispatches at once) returns at once
 * without touching c. */
#ifndef MG_CALL_H
#define MG_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "obs/price.h"
#include "pipeline/pipeline.h"
#include "sched/task.h"
#include "upstream/chunk.h"
#include "upstream/sse.h"

typedef enum {
    STEP_PARSE,
    STEP_IDENTIFY,
    STEP_IDEMPOTENCY,
    STEP_ADMIT,
    STEP_CONTEXT,
    STEP_WALLET,
    STEP_ENQUEUE,
    STEP_ROUTE,
    STEP_RESERVE,
    STEP_SHARED,
    STEP_ENCODE,
    STEP_SEND,
    STEP_STREAM,
    STEP_FINISH,
    STEP_COUNT
} mg_step_t;

typedef enum {
    MG_STEP_NEXT,  /* go on with c->step */
    MG_STEP_AGAIN, /* wait: a callback resumes the call at c->step */
    MG_STEP_DONE,  /* the call is not this frame's any more (it is over and freed, or a
                      callback under this step ran it on): do not touch it */
} mg_step_rc_t;

/* Why the last failed attempt failed: decides the final status and message if all fail,
 * and is the request log's fail_reason (fail_reason_name). */
typedef enum {
    FAIL_NONE = 0,
    FAIL_CONNECT,       /* the provider could not be reached */
    FAIL_RATE_LIMITED,  /* 429 */
    FAIL_SERVER,        /* 5xx (the status is c->up_status) */
    FAIL_AUTH,          /* 401 / 403: the gateway's credentials */
    FAIL_GARBAGE,       /* an answer that is not the wire format */
    FAIL_TIMEOUT,       /* no first byte in time */
    FAIL_TIMEOUT_TOTAL, /* the inference / total deadline passed */
    FAIL_ADAPTER,       /* the adapter could not encode the request */
    FAIL_BROKEN,        /* the connection broke (reset, truncated) before the answer ended */
    FAIL_STALLED,       /* the answer stopped arriving (idle timeout) before it ended */
    FAIL_ERROR_EVENT,   /* the stream began with an error event */
    FAIL_REFUSED,       /* an adapter refused the request as not for its route (call_t's
                           refusal_message says why) */
} fail_kind_t;

/* The log's name of a failure kind ("connect", "http_5xx", ...). */
const char *fail_reason_name(fail_kind_t k);

/* What finish writes to the client. */
typedef enum {
    ANSWER_NONE = 0, /* nothing: the client left */
    ANSWER_ERROR,    /* the error in c->error_*: a JSON error answer */
    ANSWER_JSON,     /* c->answer: a complete JSON body */
    ANSWER_STREAM,   /* the rest of c->out and the stream's end ([DONE], or the error event) */
} answer_kind_t;

/* What the client asked of routing: priority, pool, pinning, local/smaller/cloud flags. */
typedef struct {
    const char *priority;
    const char *pool;
    char pin[160];
    int has_pin;
    int local_only;
    int allow_smaller_model; /* -1: the request does not say (routing.allow_smaller_model) */
    int queue_ms, first_token_ms, inference_ms,
        total_ms; /* from the body's timeouts, 0 = default */
} routing_input_t;

/* The body as the fast path read it from the bytes (body.c). */
typedef struct {
    const char *model;    /* in the request's arena */
    int stream;           /* "stream": true */
    int include_usage;    /* stream_options.include_usage: true */
    long long max_tokens; /* max_tokens, else max_completion_tokens; -1 if neither is a number */
    long long choices;    /* n, 1 when absent */
    const char *user;     /* the "user" string's bytes (no escapes in them), or NULL */
    size_t user_len;
    const mg_json_member_t *members; /* every member, in order (the request's arena), so
                                        that the upstream body is spliced without a second
                                        scan; NULL when there were too many to keep */
    size_t n_members;
} fast_body_t;

typedef struct call_s {
    struct call_s *prev, *next; /* the pipeline's list of calls in flight */
    mg_pipeline_t *pl;
    mg_step_t step;     /* the step the runner calls next (see above) */
    mg_http_req_t *req; /* borrowed; NULL once the client left */
    mg_endpoint_t ep;   /* MG_EP_CHAT for a Messages call too (it runs as chat) */
    int front_messages; /* the client spoke Anthropic Messages (messages.c) */
    char *entry_body;   /* owned: that client's own body (req->body holds the
                           canonical one), for req.entry */
    size_t entry_len, entry_cap;
    struct mg_msgs_stream_s *msgs; /* owned: the stream re-framed for that client, or NULL */
    char *msgs_lossy;              /* owned: what the canonical form of a Messages request left
                                      out (only an entry_wire = "anthropic" adapter serves it) */
    int native;                    /* the attempt's upstream speaks the Messages client's wire:
                                      its answer goes to the client as it is (messages_native.c) */
    int native_resp;               /* the same for a Responses client (responses_native.c) */
    struct resp_native_s *rnative; /* owned: that attempt's stream state, or NULL */
    mg_task_t task;                /* the PRD's state machine; every change is logged */
    mg_sched_entry_t entry;        /* the scheduler's view: queued, then a lease */
    int queued;                    /* entry is in the queue */
    mg_gen_t *gen;                 /* one reference held */
    /* parse */
    routing_input_t in;
    fast_body_t fb;
    int fast;                   /* the body was read as bytes (fb), not as a tree */
    const char *priority;       /* "P0".."P4" (static) */
    const mg_app_conf_t *app;   /* metadata.application, when configured */
    char *user;                 /* owned: metadata.user_id or the OpenAI "user" field (at most
                                   MG_CALL_USER_MAX bytes), NULL: none; read it with call_user */
    struct call_context_s *ctx; /* owned, may be NULL: the session and budget (context.c) */
    /* a model served through a provider's model_prefix rather than a logical model */
    mg_model_conf_t prefixed_model; /* routes: owned array; name: owned */
    char *prefixed_upstream;        /* owned: the model name as sent, shared by those routes */
    const char *prefix;             /* in gen->cfg: the prefix that matched */
    const mg_model_conf_t *model;   /* in gen->cfg, or prefixed_model */
    cJSON *body;                    /* owned: the sanitized client request; NULL until call_tree()
                                       after the fast path (see body.c) */
    const mg_json_member_t *body_members; /* the fast path's members of req->body (in its
                                             arena), or NULL: passthrough_body scans */
    size_t n_body_members;
    int stream;
    int client_include_usage;
    int usage_chunk_sent;        /* the usage-only chunk went to the client */
    long long max_tokens;        /* the client's output ceiling as asked, or -1 */
    long long n_choices;         /* the choices asked for (n) */
    long long finishes;          /* stream chunks that carried a finish_reason */
    long long mapped_max_tokens; /* max_output_tokens turned into max_tokens, or -1 */
    int tokens_capped;           /* the scheduler lowered max_tokens to mapped_max_tokens */
    long long asked_max_tokens;  /* the client's output ceiling, or -1 (from enqueue on) */
    const mg_route_conf_t *smaller_route; /* memory admission's smaller model, or NULL */
    int min_window; /* context: only routes with a window this large may serve (0: any) */
    const mg_route_conf_t *mem_smaller; /* memory admission chose it: only its routes */
    int output_shortened;               /* memory admission lowered max_tokens to fit: degraded */
    /* the request as Lua sees it; its table (req_ref) is made only when a policy or adapter
       is called for the request: a kept plan and a kept encode answer need none */
    mg_lua_req_t lua_info; /* strings: static, in gen or call, or the two below */
    char lua_request_id[MG_REQUEST_ID_LEN + 1]; /* (the pin is in.pin: set before, kept) */
    int req_ref, state_ref;                     /* Lua registry references in gen (-1: none yet) */
    /* routing: four arrays in routing_buf, one entry per route of the model */
    void *routing_buf;     /* owned; kept with a spare call (see call.c) */
    size_t routing_cap;    /* routes routing_buf has room for */
    mg_candidate_t *cands; /* in routing_buf */
    int *cand_route;       /* in routing_buf: candidate -> route index */
    int n_cands;
    int described; /* the candidates were described for the next route step
                      already; their fill_candidates answer is route_limit */
    int route_limit;
    int panic;             /* too few healthy routes: down ones are tried too */
    mg_plan_entry_t *plan; /* in routing_buf: the current plan */
    unsigned char *tried;  /* in routing_buf: per candidate, attempted in this request */
    int plan_n, plan_next;
    int plan_limit;                   /* the plan's req.plan_limit (0: none) */
    const mg_plan_entry_t *entry_now; /* the plan entry reserved for the attempt to come */
    mg_encoded_t enc;                 /* encode -> send: the adapter's request (owned until sent) */
    mg_buf_t up_body;                 /* encode -> send: its body (moved into the transfer) */
    int route_calls;                  /* times routing.route() was asked */
    int attempts;                     /* upstream attempts started */
    int limited;                      /* plan entries refused by a rate limit in this pass */
    uint64_t limited_until_ms;        /* loop time the earliest of them frees up */
    uint64_t deadline_ms;             /* loop time after which the request stops waiting */
    int queue_ms;                     /* effective timeouts: the request's, capped by the config */
    int first_token_ms;
    int inference_ms;
    uint64_t total_deadline_ms; /* loop time the whole request must end by */
    int own_first_token;        /* the client set a first-token deadline below the configured
                                   one: its firing is the client's doing, not the provider's */
    int own_total;              /* the same for the inference / total deadline */
    uv_timer_t *wait_timer;     /* owned (freed in its close callback) */
    int64_t est_tokens;         /* reserved against TPM limits */
    int64_t est_cost_micros;    /* the estimated cost held against spend limits and wallets */
    struct wallet_op_s *wallet; /* the prepaid reservation (wallet.c), or NULL; not owned
                                   while its store write is pending (see wallet_finish) */
    int64_t prompt_count;       /* the body's tokens by the model's encoding, -1: not counted
                                   (prompt_estimate in admit.c) */
    mg_auth_result_t auth;      /* the caller's identity and key/project reservation */
    struct shared_op_s *shared; /* owned: the first granted shared reservation (the
                                   key's leases; shared.c), or NULL */
    struct shared_op_s *shared_pending; /* a script in flight (its op owns itself), or NULL */
    int shared_attempts;                /* shared reservations made (names each lease) */
    mg_limiter_resv_t resv;             /* the current attempt's reservation */
    const char *degraded;               /* static: how the current attempt is degraded, or NULL */
    const char *fail_degraded;          /* static: X-Sidecar-Degraded on an error answer, or NULL */
    uint64_t attempt_start_ms;
    char up_span[MG_SPAN_ID_HEX + 1]; /* the last attempt's span id (its traceparent upstream) */
    const char *cancel_reason;        /* static: why the task was cancelled, or NULL */
    uint64_t cancel_ns, released_ns;  /* when it was cancelled and when its slot came back */
    /* the current attempt */
    mg_xfer_t *xfer;
    const mg_provider_conf_t *provider;
    const mg_route_conf_t *route; /* the attempt's route, in gen->cfg or prefixed_model */
    const char *upstream_model;
    const char *client_model;   /* the request's "model" as the client sent it (the answers'
                                   "model"; the upstream's is "actual_model"): the model's
                                   name or client_model_owned */
    char *client_model_owned;   /* owned, may be NULL: a name that is not the model's */
    mg_buf_t client_model_json; /* the client's name as a JSON string, made at first use */
    int rename_model;           /* the attempt's upstream model is not the client's name */
    size_t model_key_at, model_value_at; /* where the last chunk had "model" and its value
                                            (append_with_client_model), 0: not known */
    int adapter, passthrough, ndjson;
    int up_status;
    int paused_by_client; /* the attempt's upstream was paused: the client read slower
                             than the upstream sent */
    int unreachable;      /* the connection failed: a fault of the provider, not the route */
    char retry_after[32];
    char *error_headers; /* owned: an error answer's headers, for the cooldown policy */
    size_t error_headers_len;
    mg_buf_t resp; /* owned: response body (non-stream) or error body */
    mg_sse_parser_t sse;
    int sse_ready;
    mg_chunk_memo_t chunk_memo; /* owned: passthrough streams' last chunk scanned in full */
    /* stream state */
    int client_started;
    int first_chunk_done;
    cJSON *held_finish; /* owned: the finish_reason chunk, waiting for usage */
    mg_buf_t held_raw;  /* owned: the same for passthrough streams, as upstream bytes */
    int held_raw_first; /* the held raw chunk is also the first one (needs metadata) */
    int upstream_done;
    int stop_stream;               /* the stream was ended early by the gateway */
    uint64_t last_client_write_ms; /* loop time of the last bytes of the stream sent */
    int pings;                     /* keep-alives sent on the stream (ping.h) */
    mg_buf_t out;                  /* owned: SSE bytes batched for the client */
    /* the end (finish) */
    answer_kind_t answer_kind;
    mg_buf_t answer;          /* owned: ANSWER_JSON's body */
    mg_buf_t full_answer;     /* owned: a stream's text while full logging is on (content.c) */
    char *error_message;      /* owned: ANSWER_ERROR's message, or the stream's error
                                 event's (made only when the call fails) */
    char *error_passed[3];    /* owned: an upstream error passed on as it was: its code,
                                 type and param (NULL: the gateway's own, null) */
    long long error_retry_ms; /* may pass INT_MAX: a monthly limit's Retry-After is weeks */
    /* accounting */
    int have_usage;
    int charged;            /* charge_spend ran (it charges once) */
    int64_t charged_micros; /* what it charged (the shared spend's settlement, shared.c) */
    int spend_shared;       /* the spend is held in Redis (shared.c): once per call */
    int spend_local;        /* its spend went on without Redis: given back at the end */
    long long prompt_tokens, completion_tokens;
    /* the usage's cache and reasoning details, as reported (meter.c turns them into
       mutually exclusive billing buckets, obs/price.h) */
    long long cached_tokens;      /* read from the cache: OpenAI's prompt_tokens_details.
                                     cached_tokens (a subset of prompt_tokens) or Anthropic's
                                     cache_read_input_tokens (apart from input_tokens) */
    long long cache_write_tokens; /* Anthropic's cache_creation_input_tokens (apart) */
    long long reasoning_tokens;   /* completion_tokens_details.reasoning_tokens (a subset) */
    int cache_apart;              /* the cache fields are apart from prompt_tokens (Anthropic) */
    int routed;                   /* the call reached routing: it has a usage event */
    int metered;                  /* its usage event was queued (meter.c: once) */
    struct mg_hold_s *end_hold;   /* the usage event's hold on the answer's end, taken over
                                     by charge_spend (NULL: none) */
    long long chunks;
    fail_kind_t last_fail;
    char *refusal_message; /* owned: the last "not for this route" refusal's reason */
    char *refusal_param;   /* owned: the request field it named (NULL = none): on the heap,
                              not in every call, as refusals are rare */
    int retry_after_ms;
    uint64_t t_start, t_dispatch, t_first; /* uv_hrtime() ns */
    int status;
    const char *outcome;
    const char *error_code;
    const char *ended_by;          /* static: "client" | "upstream" when that side ended a call
                                      that did not succeed; NULL: the gateway did */
    struct resp_call_s *responses; /* owned: a Responses API call's front end (responses_call.c),
                                    NULL for the other endpoints; c->ep is then MG_EP_CHAT,
                                    the engine's side of it */
} call_t;

/* The caller's user id as the call keeps it: on the heap, not in every call (most requests
 * name none), cut at MG_CALL_USER_MAX bytes. */
#define MG_CALL_USER_MAX 127
static inline const char *call_user(const call_t *c)
{
    return c->user ? c->user : "";
}

/* A message about the call, with its request and trace ids (base/log.h). */
#define call_msg(c, level, ...)                                                                    \
    mg_log_msg_traced((level), (c)->req ? (c)->req->request_id : NULL,                             \
                      (c)->req ? (c)->req->trace.trace_id : NULL, __VA_ARGS__)

/* ---- call.c: the runner, the lifecycle, finish --------------------------------------- */

/* Run the call's steps from c->step until one waits or the call is over. */
void mg_call_run(call_t *c);
/* Resume a waiting call at `step` (from a callback). */
void call_resume(call_t *c, mg_step_t step);

/* A new call for req (the pipeline's list, in_flight counted), or NULL when out of memory. */
call_t *call_new(mg_pipeline_t *pl, mg_http_req_t *req, mg_endpoint_t ep);

/* The call ends with this error (a JSON error answer, or, once the stream reached the
 * client, the stream's error event): recorded, and c->step set to finish. Returns
 * MG_STEP_NEXT, so a step can `return call_error(...)`. */
mg_step_rc_t call_error(call_t *c, int status, const char *code, const char *msg,
                        int retry_after_ms);
/* The call ends with the upstream's own error (a 4xx the client caused): its status, code,
 * type, param and message kept, the gateway's request_id added. From a callback. */
void call_fail_upstream(call_t *c, int status, const char *code, const char *type,
                        const char *param, const char *msg);
/* The stream ends with an error event and [DONE] (after bytes reached the client the route
 * is locked: a truncated answer never looks complete). Returns MG_STEP_NEXT. */
mg_step_rc_t stream_error(call_t *c, const char *code, const char *msg);
/* From a callback: end the call now with that error / error event. */
void call_fail(call_t *c, int status, const char *code, const char *msg, int retry_after_ms);
void stream_fail(call_t *c, const char *code, const char *msg);

/* The finish step: see above. Always MG_STEP_DONE. */
mg_step_rc_t step_finish(call_t *c);

/* The spend of the call charged once (call.c): NULL, or the hold that releases the
 * answer's end once the charge is durable (net/hold.h). */
struct mg_hold_s *charge_spend(call_t *c);

/* Move the task to state `to` (logged once per change). */
void task_to(call_t *c, mg_task_state_t to, const char *reason);
/* Give the slot (and the queue place) back now, at cancellation, and note when. */
void release_on_cancel(call_t *c, const char *reason);
/* The client left (abort hook) or the task was cancelled: the call ends without an answer
 * (or with the cancellation's answer, see pipeline.c). */
void call_cancelled(call_t *c, const char *reason);
/* The request went to another owner (idem.c): the call ends without a log line or an
 * answer. */
void call_handed_over(call_t *c);
/* Without upstream counts: a byte-based guess for the prompt, one token per streamed chunk
 * for the answer (what OpenAI-style servers send). */
void estimate_tokens(call_t *c);
/* The request's Lua table (req), made on first use. */
int req_table(call_t *c);
/* Milliseconds between two uv_hrtime() readings (0 when either is unset). */
double ms_since(uint64_t from, uint64_t to);

/* ---- meter.c: the usage event and the call's cost ------------------------------------- */

/* The finished call's tokens in billing buckets (obs/price.h), and whether the input and
 * output counts are the gateway's own estimate (the upstream reported no usage). */
void call_tokens(const call_t *c, mg_usage_tokens_t *t, int *input_estimated,
                 int *output_estimated);
/* What the finished call cost in micros at the price in force now for its provider and
 * upstream model (obs/price.h; the provider's cost_per_1k_tokens as the shorthand), on the
 * tokens call_tokens gives: the cost its usage event records and the ledger settles. The
 * price's version in *version (may be NULL; NULL when unpriced; valid while the call's
 * generation lives). 0 for a call without a provider. */
int64_t call_cost_micros(const call_t *c, const char **version);

/* The surface the client called: MG_EP_RESPONSES or MG_EP_MESSAGES for the front ends (whose
 * calls run as chat, c->ep MG_EP_CHAT), else c->ep. Metrics and replays use it. */
static inline mg_endpoint_t call_client_ep(const call_t *c)
{
    return c->responses ? MG_EP_RESPONSES : c->front_messages ? MG_EP_MESSAGES : c->ep;
}
/* finish: the usage event of a call that reached routing (once), with usage.enabled.
 * When the answer's end is still to be sent, the end waits for the event's commit
 * (c->end_hold, taken over by charge_spend); otherwise fire and forget. */
void meter_finish(call_t *c, int answer_pending);

/* ---- body.c: parse ------------------------------------------------------------------- */

mg_step_rc_t step_parse(call_t *c);
/* Who is asking and what is sent on: the extensions taken out (after the idempotency step
 * read its key), metadata's application and user, max_output_tokens mapped, streams asked
 * for usage; c->max_tokens set. */
void body_sanitize(call_t *c);
/* The sanitized tree of the client's body, made on first use after the fast path. NULL
 * when out of memory. */
cJSON *call_tree(call_t *c);
/* The tree's side of a lowered output ceiling (see admit.c, take_admission). */
void cap_tree_tokens(call_t *c);
/* The upstream body for a passthrough adapter, spliced from the client's bytes. 0 or -1. */
int passthrough_body(call_t *c, const char *model, mg_buf_t *out);
/* Whether a member is one the gateway adds to answers (a clash when the upstream has it). */
int is_gateway_member(const mg_json_member_t *m);
int member_is(const mg_json_member_t *m, const char *key);
/* A usage object's bytes (chat's, the Responses API's or Anthropic's names) into the call's
 * counts (answer.c). */
void take_usage_bytes(call_t *c, const char *json, size_t n);
void set_item(cJSON *obj, const char *key, cJSON *value);

/* ---- messages.c: the Anthropic Messages front end ------------------------------------- */

/* parse: the body replaced by its canonical translation. 0, or -1 with the call's error set. */
int msgs_parse(call_t *c);
/* The client's own body back in req (for a run of its own: idempotency). */
void msgs_restore_body(call_t *c);
/* "msg_<request id>" */
void msgs_message_id(const call_t *c, char *id, size_t cap);
/* finish: c->answer as a Message (0), or -1 (then an error is answered). */
int msgs_answer(call_t *c);
/* finish: the call's error in Anthropic's shape, appended to body. */
void msgs_error_body(call_t *c, mg_buf_t *body);
/* Every stream write: c->out re-framed as Anthropic events (with `end`, the call's counts
 * stand in for usage the upstream did not send). */
void msgs_reframe(call_t *c, int end);
void msgs_free(call_t *c);

/* ---- messages_native.c: an Anthropic upstream's answer to a Messages client, as it is --- */

/* One upstream stream event forwarded (its usage read, message_stop its end, an error event
 * the attempt's failure). 0, or 1 when the call moved on. */
int msgs_native_event(call_t *c, const mg_sse_event_t *ev);
/* The whole answer forwarded (the stream step's non-stream half). */
mg_step_rc_t msgs_native_answer(call_t *c);
/* The stream's end for the client: Anthropic's error event when the call failed. */
void msgs_native_end(call_t *c);

/* ---- admit.c: identify, idempotency, admit, enqueue ----------------------------------- */

mg_step_rc_t step_identify(call_t *c);
mg_step_rc_t step_idempotency(call_t *c);
mg_step_rc_t step_admit(call_t *c);
/* The prompt's tokens: counted with the model's encoding when a decision takes them (once per
 * call, kept in prompt_count), else the body's bytes at the calibrated bytes per token
 * (calib_model_bpt) times `margin` (1, or less for a generous guess). */
int64_t prompt_estimate(call_t *c, double margin);
/* The answer's tokens admission reserves: max_tokens, else MG_DEFAULT_OUTPUT_ESTIMATE. */
int64_t output_estimate(const call_t *c);
/* The bytes that are the prompt: the body, or a Responses call's chat messages (a previous
 * response's conversation included, which its body only names). c->req must be set. */
const char *prompt_bytes(call_t *c, size_t *len);
/* The body counted with the model's encoding (once per call), or -1 without one. */
int64_t prompt_count(call_t *c);
mg_step_rc_t step_enqueue(call_t *c);

/* ---- calib.c: the calibrated byte estimate (pipeline/calib.h) ------------------------- */

/* Bytes per token for a reservation before routing: the smallest learned among the model's
 * routes, at most 4 (never fewer tokens than bytes / 4). */
double calib_model_bpt(const call_t *c);
/* Bytes per token of the call's route for its usage (a charge): learned, else 4. */
double calib_route_bpt(const call_t *c);
/* `bytes` at bpt bytes per token (rounded down, as bytes / 4 was). */
int64_t calib_estimate(double bpt, size_t bytes);
/* At the finish: an answer with the upstream's prompt tokens teaches the route (models
 * without a loaded encoding only). */
void calib_learn(call_t *c);

/* ---- wallet.c: the estimated cost, the prepaid reservation and its end ----------------- */

/* The call's estimated cost: the prompt's tokens (counted) x the dearest input price among
 * the model's routes + its output ceiling (max_tokens, else 256; none for embeddings) x the
 * dearest output price (tenancy/cost.h). */
int64_t call_estimated_cost(call_t *c);
/* With auth on and a prepaid tenant: reserve the estimate in the tenant's wallet on the
 * store's writer thread; the call waits (asynchronously) and goes on to enqueue when the
 * reservation holds, or ends 402 INSUFFICIENT_BALANCE. Otherwise it goes on at once. */
mg_step_rc_t step_wallet(call_t *c);
/* At the call's end (call_free): settle the hold with the actual cost, release it when the
 * call did no work, or leave it held as metering_failed (the tenant requires upstream usage
 * and there was none). A reservation still pending is released when it comes back. */
void wallet_finish(call_t *c);

/* ---- context.c: the session's history and the budget ------------------------------------ */

/* The extensions the context step reads (session_id, context_policy), kept from the tree
 * before sanitize() strips them. */
void context_take_extensions(call_t *c, cJSON *body);
/* The context step: the chat request's messages assembled (the session's history replayed)
 * and fitted into the model's budget (policies/context.lua); errors 404 SESSION_NOT_FOUND,
 * 409 SESSION_BUSY, 400 CONTEXT_TOO_LARGE. Waits (MG_STEP_AGAIN) while another request holds
 * the session. */
mg_step_rc_t step_context(call_t *c);
/* 1 when the messages were rewritten: the upstream body is printed from the tree. */
int context_rewritten(const call_t *c);
/* A streamed chunk of the answer (canonical), for the session's assistant turn. */
void context_take_chunk(call_t *c, const cJSON *chunk);
/* The same from an OpenAI-wire event's JSON bytes. */
void context_take_event(call_t *c, const char *json, size_t n);
/* session_id and the context report into an answer or the first chunk (tree or bytes). */
void context_annotate(call_t *c, cJSON *obj);
void context_annotate_raw(call_t *c, mg_buf_t *o);
/* The request log line's session_id, context_tokens, context_budget, context_trimmed. */
struct mg_logline_s;
void context_log(const call_t *c, struct mg_logline_s *l);
/* The call ends: the turn appended to the session when it succeeded, the session let go,
 * the context freed. */
void context_end(call_t *c);
/* Whether chat message m has that role; append a system message with text to list (the
 * context step's and the summary's message lists). */
int context_is_role(const cJSON *m, const char *role);
void context_add_system(cJSON *list, const char *text);

/* ---- content.c: prompt and answer in the request log in full mode (obs/fulllog.h) ---------- */

/* A stream's chunk (canonical) or OpenAI-wire event: its content delta kept while the
 * window is open; nothing otherwise. */
void content_take_chunk(call_t *c, const cJSON *chunk);
void content_take_event(call_t *c, const char *json, size_t n);
/* A native Anthropic stream's content_block_delta event: its text kept while the window is
 * open. */
void content_take_anthropic(call_t *c, const char *json, size_t n);
/* A native Responses stream's response.output_text.delta event, likewise. */
void content_take_responses(call_t *c, const char *json, size_t n);
/* End the request line: with prompt and answer (redacted) while the window is open, else as
 * mg_log_end. */
void content_log_end(call_t *c, struct mg_logline_s *l);

/* ---- summary.c: a session's rolling summary ---------------------------------------------- */

/* The context step took session s for call c (trimmed: its messages had to be trimmed): when
 * the session nears max_messages or was trimmed and no summary is under way, its older half
 * goes to context.summarizer_model as a detached P4 request (summary.c says how). */
void summary_maybe_start(call_t *c, mg_session_t *s, int trimmed);

/* ---- shared.c: the limits shared through Redis (cluster/limits.h) ---------------------- */

/* admit: with shared limits configured, the key's and project's quota is left to the shared
 * step (c->auth.quota_deferred). */
void shared_defer_quota(call_t *c);
mg_step_rc_t step_shared(call_t *c);
/* call_free: the leases returned and the tokens corrected; a script still in flight is
 * orphaned and undoes its reservation when it comes back. */
void shared_finish(call_t *c);
/* A cooldown this instance applied, told to the others (PUBLISH on
 * <key_prefix>cooldown; mg_pipeline_cooldown_heard applies it there). */
/* A breaker (the provider's: model "", or a route's) that opened, opened again or closed in
 * this attempt's end is published on the same channel: the others open or close theirs. */
void shared_breaker_publish(call_t *c, const char *provider, const char *model,
                            const mg_breaker_t *b, mg_breaker_state_t was, uint64_t was_until,
                            uint64_t now);
void shared_cooldown_publish(call_t *c, const mg_provider_state_t *ps, int consecutive, double secs,
                             int status);

/* ---- attempt.c: route, reserve, encode, send ------------------------------------------ */

mg_step_rc_t step_route(call_t *c);
mg_step_rc_t step_reserve(call_t *c);
/* attempt_end: the attempt's health sample, for the other instances (cluster/samples.h). */
void shared_sample_add(call_t *c, const mg_provider_state_t *ps, int ok, int64_t latency_ms,
                       int64_t ttft_ms);
/* The shared step refused the reserved entry's provider until `until_ms` (loop time): its
 * local reservation taken back, the plan's next entry. */
mg_step_rc_t attempt_shared_limited(call_t *c, uint64_t until_ms);
/* The reserved entry will not be sent (the call ends): its local reservation taken back. */
void attempt_unreserve_entry(call_t *c);
mg_step_rc_t step_encode(call_t *c);
mg_step_rc_t step_send(call_t *c);
/* How an attempt ended, as the provider's health, breakers, cooldown and adaptive samples
 * learn it: only the upstream's own failures count against it; what the client side did
 * (it left, stalled, read so slowly that a deadline passed, or set a shorter deadline of its
 * own) counts neither way. */
typedef enum {
    ATTEMPT_FAILED = 0, /* the provider failed */
    ATTEMPT_OK = 1,     /* the provider answered (a 4xx the client caused included) */
    ATTEMPT_CLIENT = 2, /* the client side ended it: nothing is learnt of the provider */
} attempt_outcome_t;

/* End of an attempt: the provider's counters, breaker, health and cooldown. */
void attempt_end(call_t *c, attempt_outcome_t outcome);
/* The routing arrays for the model's routes. 0 or -1 (out of memory). */
int alloc_routing(call_t *c);
/* A failed attempt before the first byte reached the client: the next entry. */
void attempt_failed(call_t *c, fail_kind_t why);

/* ---- answer.c: the upstream's answer -------------------------------------------------- */

extern const mg_xfer_cbs_t mg_call_xfer_cbs;
/* A stream event the upstream sent as an error object / that is not JSON: the attempt
 * fails (the next entry before the first byte, the stream's error end after). 1. */
int upstream_error_event(call_t *c, const cJSON *err);
int garbage_event(call_t *c);
/* The whole answer is not one the gateway can pass on: the next entry. */
mg_step_rc_t answer_garbage(call_t *c);
mg_step_rc_t step_stream(call_t *c);
/* The answer's members the gateway adds: request_id, logical_model, actual_model,
 * degraded (and timing, by the callers that add it). */
cJSON *timing_json(call_t *c, uint64_t now);
/* "X-Sidecar-Degraded: ...\r\n" for the call's answer into buf, or NULL. */
const char *degraded_header(const call_t *c, char *buf, size_t cap);
const char *degraded_reason(const call_t *c, char *buf, size_t cap);
/* The stream's pending bytes to the client: the head first when nothing was sent yet;
 * with `end`, the stream's end too. */
void send_out(call_t *c, int head, int end);
/* The stream reaches the client now (its head goes with the next send_out); 1 the first
 * time. */
int stream_start(call_t *c);
/* The held finish chunk (with usage and timing when with_totals) into c->out. */
void emit_held_finish(call_t *c, int with_totals);
/* Our usage-only chunk into c->out when the client asked for one and the upstream sent none. */
void emit_own_usage_chunk(call_t *c);
/* One SSE event into c->out. */
void out_event(call_t *c, const char *json, size_t n);
/* 1 when the answers' "model" must be rewritten to the client's name. */
int model_renamed(const call_t *c);
/* Append raw[0..n) (an upstream's JSON chunk or answer, or its SSE event whose JSON starts
 * `lead` bytes in) with the value of its first "model" member replaced by the client's name. */
void append_with_client_model(call_t *c, mg_buf_t *out, const char *raw, size_t n, size_t lead);

/* ---- responses_call.c: the Responses API's front end over a chat call ---------------
 * POST /v1/responses is parsed into a chat body (responses_in.h) and runs as a chat call;
 * its answer, whole or streamed, is turned back (responses_out.h) and kept for
 * previous_response_id (responses_store.h). */

/* The parse step for MG_EP_RESPONSES: c->body the chat body, c->ep MG_EP_CHAT, or the
 * call's error (-1). A previous_response_id is looked up (off the loop) while the call
 * waits: then 1, and the lookup resumes the call at STEP_IDENTIFY; else 0. */
int responses_parse(call_t *c);
/* After identify (the caller's scope known): the previous response's conversation put in
 * front of the input, or the call's 404 / 400. */
mg_step_rc_t responses_identified(call_t *c);
/* One upstream chunk (borrowed) as Responses events into c->out. */
void responses_chunk(call_t *c, const cJSON *chunk);
/* The same for a chunk read from its bytes (responses_out.h: mg_resp_chunk_scan, not
 * ch->tree). */
struct mg_resp_chunk_s;
void responses_scanned(call_t *c, const struct mg_resp_chunk_s *ch);
/* A stream chunk's bytes scanned for responses_scanned (c->chunk_memo just checked them:
 * mg_resp_out_scan_chunk). 0 or -1 (not an object). */
int responses_scan(call_t *c, const char *json, size_t n, struct mg_resp_chunk_s *ch);
/* The whole chat completion (taken) as the Response in c->answer, kept when store is on. */
mg_step_rc_t responses_answer(call_t *c, cJSON *completion);
/* The same for a completion read from its bytes (c->resp, scanned with key "message"). */
mg_step_rc_t responses_answer_scanned(call_t *c, const struct mg_resp_chunk_s *ch);
/* A whole answer's Response kept (store on), at the finish: beside the call's usage event,
 * in its commit. */
void responses_keep(call_t *c);
/* The stream's end into c->out: response.completed (kept), or response.failed with the
 * call's error message when the call failed. */
void responses_stream_end(call_t *c, const char *error_message);
/* The prompt as bytes, for counting: the chat body's messages printed once (they hold a
 * previous response's conversation, which the client's body only names). Leaves *text and
 * *len as they are when out of memory. */
void responses_prompt(call_t *c, const char **text, size_t *len);
/* The front end's state freed, a lookup in flight cancelled (call_free). */
void responses_free(call_t *c);
/* The client's Responses body (borrowed), as it came. */
const cJSON *responses_request(const call_t *c);
/* Whether a route of this kind (native: its adapter speaks Responses) cannot serve this
 * call: 1 with the reason and the param it names, else 0. A bridged route cannot serve a
 * request the bridge cannot translate, nor a previous_response_id the gateway does not
 * hold (both kept for the model's native routes); a native route cannot continue a
 * response the gateway keeps (its upstream never saw that id). */
int responses_route_refused(const call_t *c, int native, const char **msg, const char **param);

/* ---- responses_native.c: a Responses upstream's answer to a Responses client, as it is -
 * (adapters with entry_wire = "responses"). */

/* Whether provider p's adapter speaks Responses natively. */
int resp_native_adapter(const mg_gen_t *g, const mg_provider_conf_t *p);
/* Whether the model a client names (a logical model, "model:provider", or one served by a
 * model_prefix) has a route whose provider speaks Responses natively. */
int resp_native_model(const mg_gen_t *g, const char *name);
/* An attempt on such a route begins (its stream state reset). 0 or -1 (out of memory). */
int resp_native_begin(call_t *c);
void resp_native_free(call_t *c);
/* The upstream body: the client's, the gateway's extensions out, model the route's. */
int resp_native_body(call_t *c, const char *model, mg_buf_t *out);
/* One upstream event forwarded (see responses_native.c). 0, or 1 when the call moved on. */
int resp_native_event(call_t *c, const mg_sse_event_t *ev);
/* The whole answer forwarded. */
mg_step_rc_t resp_native_answer(call_t *c);
/* The stream's end: the API's error event when the gateway's own failure ended it. */
void resp_native_end(call_t *c);

#endif
