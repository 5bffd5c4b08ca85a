/* responses_store: Responses kept server-side (store: true, the Responses API's default) for
 * GET /v1/responses/{id}, DELETE /v1/responses/{id} and previous_response_id.
 *
 * A record is the Response as the client saw it, its input items (GET .../input_items),
 * the conversation through it as chat
 * messages (what a follow-up replays to a chat engine: the previous turns' input and
 * answers, never their instructions), and its owner's scope: "tenant:T/project:P" with auth
 * on, "cred:<sha256 of the credential presented>" in open mode. A caller of another scope
 * finds nothing (404, as if it did not exist).
 *
 * Writes go to the store's writer thread (mg_store_write_cb); until a record committed it is
 * also kept in memory, so a follow-up that comes before the commit finds it. Reads run on
 * libuv's thread pool (mg_store_query), never on the loop. Records expire after retention_s
 * (rows past it are never returned; they are deleted at start-up). Without a store (NULL)
 * the newest MG_RESP_MEMORY_MAX records are kept in memory only. Loop thread only. */
#ifndef MG_RESPONSES_STORE_H
#define MG_RESPONSES_STORE_H

#include <stdint.h>
#include <uv.h>

#include "luavm/gens.h"
#include "net/http.h"
#include "obs/metrics.h"
#include "store/store.h"
#include "tenancy/auth.h"

#define MG_RESP_MEMORY_MAX 1024
#define MG_RESP_RETENTION_DEFAULT_S (30 * 86400)

typedef struct mg_resp_store_s mg_resp_store_t;

typedef struct mg_resp_store_deps_s {
    mg_store_t *store; /* NULL: memory only */
    uv_loop_t *loop;
    mg_auth_t *auth; /* GET and DELETE authenticate like any inference call */
    mg_metrics_t *metrics;
    mg_gens_t *gens; /* whether auth is on */
    int retention_s; /* 0: MG_RESP_RETENTION_DEFAULT_S; with gens, the current config's
                        protocols.responses_retention_seconds is used instead */
} mg_resp_store_deps_t;

/* Before the loop runs (expired rows are deleted, through the writer). NULL: no memory. */
mg_resp_store_t *mg_resp_store_new(const mg_resp_store_deps_t *d);
void mg_resp_store_free(mg_resp_store_t *rs);

/* The scope of a caller: auth NULL in open mode (the credential's digest), else its
 * tenant and project (auth just authenticated: its key record is read, in the same loop
 * turn). */
void mg_resp_scope(const mg_auth_result_t *auth, const mg_http_req_t *req, char *out, size_t cap);

/* A record: JSON texts (and the scope). */
typedef struct mg_resp_record_s {
    const char *scope;
    const char *response; /* the Response object */
    const char *input;    /* its input items, an array */
    const char *messages; /* the conversation through it, an array of chat messages */
} mg_resp_record_t;

/* A new Response id into out: "resp_" + 16 hex digits of a row key that grows in time
 * order (unix ms << 16, one more than the last at least) + the last 24 characters of
 * random_hex (the request id's random digits). rs may be NULL (no store: the key is the
 * clock's). 0, or -1 when cap is too small. Stored rows are appended in key order: one
 * B-tree, no index entry (store migration 23). */
int mg_resp_store_new_id(mg_resp_store_t *rs, const char *random_hex, char *out, size_t cap);
/* The row key an id from mg_resp_store_new_id carries, or -1 for any other id (a row kept
 * from before migration 23 is found by its id). */
int64_t mg_resp_store_key(const char *id);

/* Keep a record under id (every string copied; with a store, an id from
 * mg_resp_store_new_id). 0, or -1 when out of memory, the id is not one, or the store
 * refused the write (logged): the record is then not kept. */
int mg_resp_store_put(mg_resp_store_t *rs, const char *id, const mg_resp_record_t *rec);

/* The outcome of a lookup: the record (borrowed for the callback's duration), or NULL when
 * there is none. */
typedef void (*mg_resp_found_fn)(void *ud, const mg_resp_record_t *rec);
typedef struct mg_resp_lookup_s mg_resp_lookup_t;

/* Look up id (off the loop). cb runs later on the loop thread, never inside this call.
 * Returns the lookup (for mg_resp_lookup_cancel until cb ran), or NULL when out of
 * memory: then cb is never called. */
mg_resp_lookup_t *mg_resp_store_get(mg_resp_store_t *rs, const char *id, mg_resp_found_fn cb,
                                    void *ud);
/* cb will not be called (its ud is going away). */
void mg_resp_lookup_cancel(mg_resp_lookup_t *l);

/* What a request under /v1/responses/{id} asks. */
typedef enum {
    MG_RESP_ITSELF,      /* GET, DELETE /v1/responses/{id} */
    MG_RESP_INPUT_ITEMS, /* GET .../input_items (query: limit 1..100, default 20; order asc |
                            desc, default desc; after an item id) */
    MG_RESP_CANCEL,      /* POST .../cancel: only background responses can be, and the
                            bridge runs none (400 for one that exists) */
} mg_resp_path_t;

/* Answer a request under /v1/responses/{id} (id is the path's). */
void mg_resp_store_handle(mg_resp_store_t *rs, mg_http_req_t *req, const char *id,
                          mg_resp_path_t what);

#endif
