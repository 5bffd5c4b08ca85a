/* hold: an answer's end waiting for its records' commits; see hold.h.
 *
 * Two counts decide when the hold acts and when it goes: `pending` commits still to come,
 * and whether the end was handed over (`handed`). The end leaves when pending reaches 0
 * after the hand-over; the hold is freed when, in addition, no commit is pending, so a
 * late callback never finds freed memory (the client may leave in between: the abort hook
 * forgets the request and the hold waits for its commits alone). A commit arrives from the
 * store's async handle, or inside the call that queued it (a write durable at once, as the
 * usage journal's): before the hand-over either way, the hold only counts it. */
#include "net/hold.h"

#include <stdlib.h>
#include <string.h>

typedef enum { END_RESPOND, END_STREAM } end_kind_t;

struct mg_hold_s {
    int pending;        /* commits expected and not yet arrived */
    int handed;         /* the end was handed over */
    mg_http_req_t *req; /* borrowed from the hand-over until sent or aborted */
    end_kind_t kind;
    int head; /* END_STREAM: the stream is still to be opened */
    int status;
    char *content_type; /* owned */
    char *extra;        /* owned, may be NULL */
    char *data;         /* owned, may be NULL */
    size_t len;
};

mg_hold_t *mg_hold_new(void)
{
    return calloc(1, sizeof(mg_hold_t));
}

void mg_hold_expect(mg_hold_t *h)
{
    h->pending++;
}

static void hold_free(mg_hold_t *h)
{
    free(h->content_type);
    free(h->extra);
    free(h->data);
    free(h);
}

/* The client left while the end was held: nothing to send any more. */
static void on_abort(void *data)
{
    mg_hold_t *h = data;
    h->req = NULL;
    if (!h->pending) hold_free(h);
}

static void send_end(mg_hold_t *h)
{
    mg_http_req_t *req = h->req;
    h->req = NULL;
    req->on_abort = NULL;
    req->on_drain = NULL;
    if (h->kind == END_RESPOND)
        mg_http_respond(req, h->status, h->content_type, h->extra, h->data ? h->data : "", h->len);
    else if (h->head)
        mg_http_stream_open(req, h->status, h->content_type, h->extra, h->data, h->len, 1);
    else mg_http_stream_send(req, h->data, h->len, 1);
}

/* Send the end if it may go; free the hold once nothing refers to it. */
static void settle(mg_hold_t *h)
{
    if (!h->handed || h->pending) return;
    if (h->req) send_end(h);
    hold_free(h);
}

void mg_hold_committed(void *ud, int rc)
{
    mg_hold_t *h = ud;
    (void)rc; /* a failed write still releases the answer (hold.h) */
    h->pending--;
    settle(h);
}

void mg_hold_unexpect(mg_hold_t *h)
{
    h->pending--;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Take the end's bytes and the request; -1 when out of memory (then it is sent now). */
static int take(mg_hold_t *h, mg_http_req_t *req, int status, const char *content_type,
                const char *extra, const char *data, size_t len)
{
    h->req = req;
    h->status = status;
    h->content_type = strdup(content_type ? content_type : "application/json");
    h->extra = dup_or_null(extra);
    h->data = len ? malloc(len) : NULL;
    if (!h->content_type || (extra && !h->extra) || (len && !h->data)) return -1;
    if (len) memcpy(h->data, data, len);
    h->len = len;
    return 0;
}

/* The hand-over of an end that waits: the hold takes the request's hooks until the commits
 * arrived. */
static void handed_over(mg_hold_t *h)
{
    h->handed = 1;
    h->req->on_abort = on_abort;
    h->req->on_drain = NULL;
    h->req->hook_data = h;
}

void mg_hold_respond(mg_hold_t *h, mg_http_req_t *req, int status, const char *content_type,
                     const char *extra_headers, const char *body, size_t len)
{
    h->kind = END_RESPOND;
    /* nothing to wait for (every commit arrived already, or none was expected), or no memory
     * for the copy (the answer goes unheld rather than not at all): sent now, uncopied */
    if (!h->pending || take(h, req, status, content_type, extra_headers, body, len) != 0) {
        h->req = NULL;
        h->handed = 1;
        mg_http_respond(req, status, content_type, extra_headers, body, len);
        if (!h->pending) hold_free(h);
        return;
    }
    handed_over(h);
}

void mg_hold_stream_end(mg_hold_t *h, mg_http_req_t *req, int head, int status,
                        const char *content_type, const char *extra_headers, const char *data,
                        size_t len)
{
    h->kind = END_STREAM;
    h->head = head;
    if (!h->pending || take(h, req, status, content_type, extra_headers, data, len) != 0) {
        h->req = NULL;
        h->handed = 1;
        if (head) mg_http_stream_open(req, status, content_type, extra_headers, data, len, 1);
        else mg_http_stream_send(req, data, len, 1);
        if (!h->pending) hold_free(h);
        return;
    }
    handed_over(h);
}
