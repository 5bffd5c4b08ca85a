/* luavm: Lua generations: config + policies + adapters loaded into one Lua state.
 *
 * A generation is built off to the side (mg_gen_load may run on a worker thread),
 * validated as a whole, then swapped in for new requests by the server. Requests
 * hold a reference on the generation they started with, so a reload never changes
 * the rules under a running request; the generation is freed when its last
 * reference goes. A generation is only ever used by one thread at a time.
 *
 * Data crossing into Lua is plain values (tables, strings, numbers): policies never
 * see C pointers. JSON null is util.null and arrays carry util.array_mt (see
 * lua/moongate/util.lua), so JSON round-trips through Lua without loss.
 *
 * The floor's files, one concept each: gen.c (loading and checking a generation, its
 * references, its collections), reqtab.c (the request tables), calls.c (route, on_response,
 * encode, decode, decode_event), json.c (JSON <-> Lua), lcall.c (protected calls), lmod.c
 * (the moongate module), order.c (the orders it draws), and the cache around the calls:
 * keep.c (what is kept, one rule), trace.c (the views and what a call read), replay.c (a
 * kept plan given again). */
#ifndef MG_LUAVM_H
#define MG_LUAVM_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "conf/config.h"
#include "luavm/json.h"
#include "luavm/lcall.h"

typedef struct lua_State lua_State;

typedef struct mg_adapter_s {
    char *name;       /* owned */
    int ref;          /* registry reference to the module table */
    int passthrough;  /* OpenAI wire: the core forwards bodies and streams itself */
    char *probe_path; /* owned: health probe path under base_url (M.probe_path, default /models) */
    char *probe_key_header; /* owned: the header the health probe carries the key in, as it is
                               (M.probe_key_header); NULL: Authorization: Bearer <key> */
    char **probe_headers;   /* owned, NULL-terminated "Name: value" lines (M.probe_headers) */
    int entry_anthropic;    /* M.entry_wire == "anthropic": it sends a Messages client's own body
                               (req.entry), so what the canonical form cannot carry still reaches
                               its upstream */
    int entry_responses;    /* M.entry_wire == "responses" (a passthrough adapter): a Responses
                               client's own body goes to its upstream, which answers in the
                               Responses API (pipeline/responses_native.c) */
    int stream_eof;         /* M.stream_eof: its streams have no end marker; decode_event gets
                               util.null once at a clean end of the upstream's stream */
    int encode_untraced;    /* its encode() read the request's own fields: its answers are never
                               kept, so it gets the plain request table (keep.h) */
} mg_adapter_t;

#define MG_REQ_FREE_MAX 64 /* request tables a generation keeps for reuse */

typedef struct mg_gen_s {
    unsigned id;
    int refs;
    lua_State *L;           /* owned */
    mg_config_t *cfg;       /* owned */
    mg_adapter_t *adapters; /* owned array */
    size_t n_adapters;
    int *provider_adapter; /* owned; adapter index for each cfg->providers[i] */
    int routing_ref;       /* policies/routing.lua module table */
    int routing_cache;     /* its plans may be kept (M.cache ~= false) */
    int cooldown_ref;      /* policies/cooldown.lua module table, LUA_NOREF when absent */
    int context_ref;       /* policies/context.lua module table, LUA_NOREF when absent */
    mg_ljson_t json;       /* util.null and util.array_mt (json.h) */
    int req_fill_ref, req_mt_ref, req_dirty_ref; /* request tables' fill(), metatable, mark */
    int req_free[MG_REQ_FREE_MAX]; /* request tables ready for reuse (mg_gen_req_release) */
    unsigned n_req_free;
    struct mg_lmod_s *lmod;   /* owned: the moongate module's state (lmod.h) */
    struct mg_keep_s *keep;   /* owned: what is kept around the Lua calls (keep.h) */
    struct mg_trace_s *trace; /* owned: the views and recorder of those calls (trace.h) */
    size_t gc_base;           /* the state's bytes after its load or last collection (as far as
                                 mg_gen_collect_between knows) */
} mg_gen_t;

/* Load config file `config_path`, then the Lua library, adapters and policies it
 * names; validate them (required functions, adapter check(), policy selftest()).
 * Returns 0 and *out (refs = 1), or -1 with "FILE:LINE: reason" in err. Does not
 * touch the event loop, so it may run on a worker thread. */
int mg_gen_load(const char *config_path, unsigned id, mg_gen_t **out, char *err, size_t errlen);
/* The same, with extend(cfg, ud, err, errlen) run on the parsed config before anything else
 * sees it: what the store adds (providers, models, runtime settings; see server.c). A
 * non-zero return fails the load with err. */
typedef int (*mg_config_extend_fn)(mg_config_t *cfg, void *ud, char *err, size_t errlen);
int mg_gen_load_with(const char *config_path, mg_config_extend_fn extend, void *ud, unsigned id,
                     mg_gen_t **out, char *err, size_t errlen);
void mg_gen_ref(mg_gen_t *g);
void mg_gen_unref(mg_gen_t *g);

/* Lua's collector, run between requests. Left to itself it runs inside whatever allocates:
 * in generational mode a young collection (the garbage of some 30 requests, tens of
 * microseconds) lands on the one request that crossed the threshold, and those requests
 * are the latency tail. The server calls this once per loop iteration, when the work of the
 * iteration is done and the loop is about to wait: it collects once the state has grown
 * MG_GC_IDLE_PCT % since its last collection when `idle` (nothing in flight: no request
 * waits for the loop), MG_GC_BUSY_PCT % otherwise. Both come before the automatic
 * threshold (MG_GC_AUTO_PCT %), which is left on as the backstop for a burst within one
 * iteration. Lua still decides between a young and a full collection. Returns 1 when it
 * collected. */
#define MG_GC_AUTO_PCT 20
#define MG_GC_MAJOR_PCT 100
#define MG_GC_IDLE_PCT 10
#define MG_GC_BUSY_PCT 17
int mg_gen_collect_between(mg_gen_t *g, int idle);
/* The bytes the generation's Lua state holds. */
size_t mg_gen_lua_bytes(const mg_gen_t *g);

/* The per-request view handed to policies and adapters. */
typedef struct mg_lua_req_s {
    const char *request_id;
    const char *endpoint; /* "chat" | "completions" | "embeddings" */
    const char *model;    /* logical model name */
    int stream;
    long long max_tokens; /* -1 when not given */
    long long created;    /* unix seconds */
    const char *priority; /* "P0".."P4" */
    const char *pool;     /* X-Sidecar-Pool, or NULL */
    const char *pin;      /* pinned provider id, or NULL */
    int local_only, allow_smaller_model, allow_cloud, local_first;
    double random; /* [0,1): the request's draw for randomised policies */
} mg_lua_req_t;

/* The request table of a new request; returns a registry reference. The table may be one
 * an ended request released: its fields are all rewritten. */
int mg_gen_req_new(mg_gen_t *g, const mg_lua_req_t *info);
/* The request's table made on first use: *req_ref, or a new one from info when it is < 0 (a
 * request no Lua function was called for has none). Returns *req_ref. */
int mg_gen_req_table(mg_gen_t *g, const mg_lua_req_t *info, int *req_ref);
/* The request ended: its table goes back for reuse, unless Lua code added fields to it
 * (then, or when the free list is full, the reference is dropped). */
void mg_gen_req_release(mg_gen_t *g, int req_ref);
/* Set (or replace) req.body from a JSON value. 0 or -1. */
int mg_gen_req_set_body(mg_gen_t *g, int req_ref, const cJSON *body);
/* Set req.entry: what the client sent on another wire than the canonical one (see
 * lua/README.md: { wire = "anthropic", body = ..., headers = {...} }). 0 or -1. */
int mg_gen_req_set_entry(mg_gen_t *g, int req_ref, const cJSON *entry);
/* A fresh empty table for decode_event state; registry reference. */
int mg_gen_table_new(mg_gen_t *g);
void mg_gen_unref_value(mg_gen_t *g, int ref);

/* Runtime facts about one route, for the routing policy (see lua/README.md). health,
 * breaker and route_breaker must be static strings (the state names): the generation keeps
 * the pointers to tell what changed since the route's candidate table was last handed out. */
typedef struct mg_candidate_s {
    const mg_provider_conf_t *provider;
    const mg_route_conf_t *route; /* upstream model, smaller, priority group */
    int available;                /* enabled, not down, both breakers let a request through */
    int cooling, observing, consecutive_429;
    int trial; /* health down, and its trial request is due (available) */
    long long cooldown_remaining_ms;
    int rpm_limit, rpm_used;
    long long tpm_limit, tpm_used;
    double headroom; /* 0..1 */
    int in_flight;
    const char *health;        /* state name */
    const char *breaker;       /* the worse of the provider's and the route's breakers */
    const char *route_breaker; /* the route's own breaker (NULL = none: nil) */
    int avail_samples, ttft_samples;
    double success_rate, ttft_ms; /* < 0 = no samples */
    int load_known, load_running, load_waiting;
    double load_kv_cache; /* < 0 = unknown */
    long keep_slot;       /* the route's slot in the generation's keep + 1 (facts.c
                             says it); 0: not known */
    uint64_t serial;      /* the description's number (keep.h): two equal non-zero
                             serials are the same facts; 0 = compare them */
} mg_candidate_t;

/* One entry of a routing plan. */
typedef struct mg_plan_entry_s {
    int index;            /* into the candidates given */
    const char *degraded; /* static string: "fallback" | "emergency" | "smaller" | "cloud" | NULL */
    int emergency;        /* let through at the emergency share of its RPM while cooling */
} mg_plan_entry_t;

typedef struct mg_plan_s {
    mg_plan_entry_t *entries; /* caller's array with room for n candidates */
    int n;                    /* entries to try, in order */
    int wait_ms;              /* > 0: nothing now, ask again after this long */
    int limit;                /* in: the entries the caller needs before it asks again (0: no
                                 limit); route() sees it as req.plan_limit */
    int fresh;                /* in: call route() whatever is kept, and keep nothing (tests,
                                 benchmarks of the policy itself) */
    int kept;                 /* out: the plan was kept: route() was not called */
} mg_plan_t;

/* Call routing.route(req, candidates) with req.attempt = attempt and req.plan_limit =
 * plan->limit (nil for 0). Fills plan (entries unique, indexes in range). Returns 0, or -1
 * with err set. The request's table is *req_ref, made from info when it is < 0 and route()
 * is called (a request that no Lua function was called for has none).
 * route() gets views: the request and one table per candidate whose fields are read from
 * info and cands. Unless plan->fresh, the answer of an earlier call is given instead of
 * calling route() when every field that call read has the same value now, its moongate
 * ordering steps run again in C with this request's numbers (keep.h); plan->kept says so.
 * The degraded and emergency markers route() writes are read into the plan and cleared. */
int mg_gen_route(mg_gen_t *g, const mg_lua_req_t *info, int *req_ref, int attempt,
                 const mg_candidate_t *cands, int n, mg_plan_t *plan, char *err, size_t errlen);

/* Ask policies/cooldown.lua what an upstream error answer means for the provider:
 * on_response(provider, status, headers, state), with headers the answer's response headers
 * (a block of "name\0value\0" pairs, names lower case: upstream/headers.h; NULL for none)
 * as a table. *cooldown_s = seconds to cool down, 0 for none. Without a cooldown policy a
 * 429 cools for the default curve (or its Retry-After, when longer). 0 or -1. */
int mg_gen_cooldown(mg_gen_t *g, const mg_provider_conf_t *p, int status, const char *headers,
                    size_t headers_len, int consecutive_429, int observing, double *cooldown_s,
                    char *err, size_t errlen);

/* What policies/context.lua's trim(ctx, budget) is given (lua/README.md, "context"). */
typedef struct mg_context_in_s {
    const cJSON *messages; /* the assembled list */
    const long *tokens;    /* each message's tokens by the chat rule (token/chat.h) */
    int first_current;     /* 0-based index of the current request's first message: it and
                              every later one are protected, as are the leading system ones */
    int n_leading;         /* the leading system messages (platform, application, summary) */
    const char *policy;    /* "summary_and_recent" | "recent_only" */
    int encoding;          /* token/encoding.h id the count function counts with */
} mg_context_in_t;

/* 1 when the generation has a context policy. */
int mg_gen_has_context(const mg_gen_t *g);
/* Call context.trim(ctx, budget). *out: the new message list (owned); *steps: the report's
 * steps as a JSON array (owned, may be empty). Returns 0; 1 when the policy says it cannot fit
 * (*out NULL, its reason in err); -1 with err on an error of the policy. */
int mg_gen_context_trim(mg_gen_t *g, const mg_context_in_t *in, long budget, cJSON **out,
                        cJSON **steps, char *err, size_t errlen);

typedef struct mg_encoded_s {
    char method[8];
    char *path;                 /* owned (malloc) */
    struct curl_slist *headers; /* owned */
    cJSON *body;                /* owned; NULL = send the canonical body */
    int ndjson;                 /* stream_format == "ndjson" */
    mg_lrefusal_t refusal;      /* when encode failed: the adapter's refusal, if it was one
                                   (kept by mg_encoded_free) */
} mg_encoded_t;

/* Call adapter.encode(req, route), or give a kept answer of it: an answer without a body
 * is kept per route under the values of the request fields encode read (keep.h). The
 * request's table is *req_ref, made from info when it is < 0 and encode is called. 0 or -1
 * with err set; on -1 out->refusal says whether the adapter refused the request on purpose
 * (util.not_for_route / util.invalid_request: err is its reason) or failed. */
int mg_gen_encode(mg_gen_t *g, int adapter, const mg_lua_req_t *info, int *req_ref,
                  const mg_provider_conf_t *p, const char *upstream_model, mg_encoded_t *out,
                  char *err, size_t errlen);
void mg_encoded_free(mg_encoded_t *e);

/* adapter.decode(req, resp) -> canonical response (*out owned by caller). */
int mg_gen_decode(mg_gen_t *g, int adapter, int req_ref, const cJSON *resp, cJSON **out, char *err,
                  size_t errlen);
/* adapter.decode_event(req, data, state) -> array of chunks (*out owned, a cJSON array);
 * *done is set from state.done. */
int mg_gen_decode_event(mg_gen_t *g, int adapter, int req_ref, int state_ref, const cJSON *data,
                        cJSON **out, int *done, char *err, size_t errlen);

/* An upstream's model list (route/upmodels.h; lua/README.md): adapter.list_models(route) ->
 * the GET under the provider's base_url that lists its models, as out->path and
 * out->headers (out->method "GET", no body). Returns 0; 1 when the adapter lists none (no
 * list_models, or it returned nil: out untouched); -1 with err. route has no model. */
int mg_gen_models_request(mg_gen_t *g, int adapter, const mg_provider_conf_t *p, mg_encoded_t *out,
                          char *err, size_t errlen);
/* adapter.decode_models(resp) -> the upstream's model ids in its order: *ids an owned array of
 * *n owned strings (mg_model_ids_free; entries that are not non-empty strings are left out).
 * 0 or -1 with err. */
int mg_gen_models_decode(mg_gen_t *g, int adapter, const cJSON *resp, char ***ids, size_t *n,
                         char *err, size_t errlen);
void mg_model_ids_free(char **ids, size_t n);

/* JSON <-> Lua conversion (exposed for tests). */
void mg_lua_push_json(mg_gen_t *g, const cJSON *v);
cJSON *mg_lua_to_json(mg_gen_t *g, int idx, char *err, size_t errlen);

#endif
