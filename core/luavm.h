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
 * lua/moongate/util.lua), so JSON round-trips through Lua without loss. */
#ifndef MG_LUAVM_H
#define MG_LUAVM_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "config.h"

typedef struct lua_State lua_State;

typedef struct mg_adapter_s {
    char *name;       /* owned */
    int ref;          /* registry reference to the module table */
    int passthrough;  /* OpenAI wire: the core forwards bodies and streams itself */
} mg_adapter_t;

typedef struct mg_gen_s {
    unsigned id;
    int refs;
    lua_State *L;               /* owned */
    mg_config_t *cfg;           /* owned */
    mg_adapter_t *adapters;     /* owned array */
    size_t n_adapters;
    int *provider_adapter;      /* owned; adapter index for each cfg->providers[i] */
    int routing_ref;            /* policies/routing.lua module table */
    int null_ref, array_mt_ref; /* util.null and util.array_mt */
} mg_gen_t;

/* Load config file `config_path`, then the Lua library, adapters and policies it
 * names; validate them (required functions, adapter check(), policy selftest()).
 * Returns 0 and *out (refs = 1), or -1 with "FILE:LINE: reason" in err. Does not
 * touch the event loop, so it may run on a worker thread. */
int mg_gen_load(const char *config_path, unsigned id, mg_gen_t **out, char *err, size_t errlen);
void mg_gen_ref(mg_gen_t *g);
void mg_gen_unref(mg_gen_t *g);

/* The per-request view handed to policies and adapters. */
typedef struct mg_lua_req_s {
    const char *request_id;
    const char *endpoint;  /* "chat" | "completions" | "embeddings" */
    const char *model;     /* logical model name */
    int stream;
    long long max_tokens;  /* -1 when not given */
    long long created;     /* unix seconds */
} mg_lua_req_t;

/* Build the request table once per request; returns a registry reference (or -1).
 * `body` (may be NULL) becomes req.body: pass it only for non-passthrough adapters. */
int mg_gen_req_new(mg_gen_t *g, const mg_lua_req_t *info);
/* Set (or replace) req.body from a JSON value. 0 or -1. */
int mg_gen_req_set_body(mg_gen_t *g, int req_ref, const cJSON *body);
/* A fresh empty table for decode_event state; registry reference. */
int mg_gen_table_new(mg_gen_t *g);
void mg_gen_unref_value(mg_gen_t *g, int ref);

/* Runtime facts about one route, for the routing policy. */
typedef struct mg_candidate_s {
    const mg_provider_conf_t *provider;
    const char *model;   /* upstream model */
    int available;
    int in_flight;
} mg_candidate_t;

/* Call routing.route(req, candidates). Writes the order to try as indexes into
 * `cands` (at most n, no duplicates) and returns how many, or -1 with err set. */
int mg_gen_route(mg_gen_t *g, int req_ref, const mg_candidate_t *cands, int n, int *order,
                 char *err, size_t errlen);

typedef struct mg_encoded_s {
    char method[8];
    char *path;                  /* owned (malloc) */
    struct curl_slist *headers;  /* owned */
    cJSON *body;                 /* owned; NULL = send the canonical body */
    int ndjson;                  /* stream_format == "ndjson" */
} mg_encoded_t;

/* Call adapter.encode(req, route). 0 or -1 with err set. */
int mg_gen_encode(mg_gen_t *g, int adapter, int req_ref, const mg_provider_conf_t *p,
                  const char *upstream_model, mg_encoded_t *out, char *err, size_t errlen);
void mg_encoded_free(mg_encoded_t *e);

/* adapter.decode(req, resp) -> canonical response (*out owned by caller). */
int mg_gen_decode(mg_gen_t *g, int adapter, int req_ref, const cJSON *resp, cJSON **out,
                  char *err, size_t errlen);
/* adapter.decode_event(req, data, state) -> array of chunks (*out owned, a cJSON array);
 * *done is set from state.done. */
int mg_gen_decode_event(mg_gen_t *g, int adapter, int req_ref, int state_ref, const cJSON *data,
                        cJSON **out, int *done, char *err, size_t errlen);

/* JSON <-> Lua conversion (exposed for tests). */
void mg_lua_push_json(mg_gen_t *g, const cJSON *v);
cJSON *mg_lua_to_json(mg_gen_t *g, int idx, char *err, size_t errlen);

#endif
