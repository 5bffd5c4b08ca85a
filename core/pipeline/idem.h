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
 * kept in SQLite (writer thread) and nobody is answered before the answer's record
 * committed (store.h says what that survives), so a restart keeps every answer a client saw.
 * Memory keeps at most idempotency.max_entries answers per group (the caller's tenant with
 * auth on, everyone otherwise), the oldest leave first; a key no longer in memory is read
 * back from the store (off the loop), so eviction never makes a key run twice.
 * Idempotent requests are answered when complete: a stream is replayed whole. */
#ifndef MG_IDEM_H
#define MG_IDEM_H

#include <uv.h>

#include "net/endpoint.h"
#include "net/http.h"
#include "store/store.h"

typedef struct mg_idem_s mg_idem_t;

/* What idempotency works with, borrowed for its life. */
typedef struct mg_idem_deps_s {
    mg_store_t *store; /* NULL: answers are kept in memory only */
    uv_loop_t *loop;
    mg_handle_fn run; /* the pipeline's entry point: runs a key's request once, detached */
    void *run_ud;
} mg_idem_deps_t;

/* Read the newest stored answers that have not expired, max_entries per group (before the
 * loop runs). ttl_s: how long an answer is kept. NULL when out of memory. */
mg_idem_t *mg_idem_open(const mg_idem_deps_t *d, int ttl_s, int max_entries);
struct mg_cidem_s;
/* Keys shared with the other instances through Redis (cluster/idem.h; borrowed, NULL: none):
 * a claim lives claim_ttl_ms (longer than any run may take). */
void mg_idem_cluster(mg_idem_t *m, struct mg_cidem_s *x, uint64_t claim_ttl_ms);
/* The process is closing: no key starts a run from now on. */
void mg_idem_stop(mg_idem_t *m);
void mg_idem_free(mg_idem_t *m);

/* The request's idempotency key (body field or header), or NULL. */
const char *mg_idem_key(const mg_http_req_t *req, const char *body_key);

/* Answer req through its idempotency key: replay, wait for the running twin, or run it
 * once (the entry point on a detached copy). group: whose memory cap the key counts against
 * ("tenant:<id>" with auth on, "" otherwise; at most 63 bytes). */
void mg_idem_handle(mg_idem_t *m, mg_http_req_t *req, mg_endpoint_t ep, const char *scope,
                    const char *group, const char *key, int stream);

#endif
