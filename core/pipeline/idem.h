/* idem: idempotency keys (edge PRD 3.8.1).
 *
 * A request with `idempotency_key` in the body (or an Idempotency-Key header) is keyed
 * by its scope + the key. The scope (pipeline/admit.c) is the caller's tenant and project
 * (application) when auth is on, so every key of one application shares its idempotency
 * keys and no other tenant or application ever sees them; in open mode the application
 * named in metadata plus the credential presented, if any. The first such request runs
 * once, detached from its connection; every request with the same key while it runs
 * waits for that one answer; afterwards the stored answer is replayed (header
 * Idempotent-Replayed: true) until the TTL passes, then the key runs anew. Answers are
 * kept in SQLite (writer thread) and read back at start, so a restart keeps them.
 * Idempotent requests are answered when complete: a stream is replayed whole. */
#ifndef MG_IDEM_H
#define MG_IDEM_H

#include <uv.h>

#include "net/endpoint.h"
#include "net/http.h"
#include "store/store.h"

typedef struct mg_idem_s mg_idem_t;

/* Read the stored answers that have not expired (before the loop runs; st may be NULL: no
 * store). ttl_s: how long an answer is kept. run(run_ud, req, ep) is the pipeline's entry
 * point, which runs a key's request once, detached. NULL when out of memory. */
mg_idem_t *mg_idem_open(mg_store_t *st, uv_loop_t *loop, int ttl_s, mg_handle_fn run,
                        void *run_ud);
void mg_idem_free(mg_idem_t *m);

/* The request's idempotency key (body field or header), or NULL. */
const char *mg_idem_key(const mg_http_req_t *req, const char *body_key);

/* Answer req through its idempotency key: replay, wait for the running twin, or run it
 * once (the entry point on a detached copy). */
void mg_idem_handle(mg_idem_t *m, mg_http_req_t *req, mg_endpoint_t ep, const char *scope,
                    const char *key, int stream);

#endif
