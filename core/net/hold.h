/* hold: the end of an answer held until the records it acknowledges are durable.
 *
 * A request whose answer acknowledges something the store must keep (its spend, its
 * idempotency record) must not let the answer's last byte leave before that record's
 * transaction committed: a client that saw the whole answer may rely on the record.
 * The owner makes a hold, passes mg_hold_committed and the hold to each such write
 * (mg_hold_expect before each one), and then hands the hold the end of the answer: a
 * whole response, or the last bytes of a chunked stream with its terminating chunk. The
 * hold sends it when the last expected commit arrived, at once when none is pending.
 *
 * Ownership: after the hand-over the hold owns the request's end (it takes the request's
 * abort and drain hooks; the owner must not touch the request again) and a copy of the
 * bytes. It frees itself when both have happened: the end was sent (or the client left)
 * and every expected commit arrived. A failed write (rc < 0) still releases the end: the
 * answer is the client's, the loss was logged by whoever queued the write. */
#ifndef MG_HOLD_H
#define MG_HOLD_H

#include <stddef.h>

#include "net/http.h"

typedef struct mg_hold_s mg_hold_t;

/* A hold with nothing expected yet; NULL when out of memory. */
mg_hold_t *mg_hold_new(void);

/* One more commit to wait for: call before queueing the write whose callback is
 * mg_hold_committed(h, rc). */
void mg_hold_expect(mg_hold_t *h);

/* The store's callback (mg_store_done_fn) for a write expected with mg_hold_expect. */
void mg_hold_committed(void *h, int rc);

/* The write expected last could not be queued (its callback will never come). */
void mg_hold_unexpect(mg_hold_t *h);

/* Hand over a whole response (as mg_http_respond). Copies everything when it must wait; with
 * no commit pending (all arrived, as a write durable inside its call has) it sends at once. */
void mg_hold_respond(mg_hold_t *h, mg_http_req_t *req, int status, const char *content_type,
                     const char *extra_headers, const char *body, size_t len);

/* Hand over a stream's end: when `head`, the stream is not open yet and is opened with
 * status, content_type and extra_headers (as mg_http_stream_open); then `data` (len may be
 * 0) and the terminating chunk. Copies everything. */
void mg_hold_stream_end(mg_hold_t *h, mg_http_req_t *req, int head, int status,
                        const char *content_type, const char *extra_headers, const char *data,
                        size_t len);

#endif
