/* Unit tests for core/net/hold.c: an answer's end leaves only after every expected commit
 * arrived (also when a write failed), at once when nothing is expected; a stream's end
 * opens the stream when asked; a client gone while the end is held gets nothing and the
 * hold still waits for its commits (ASan checks that nothing is touched after a free).
 * Detached requests (mg_http_req_detached) stand in for a connection: their answer goes to
 * a callback. */
#include "mgtest.h"
#include "net/hold.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int calls;
    int status;
    char body[256];
} answer_t;

static void on_answer(void *ud, const mg_http_req_t *req, int status, const char *body, size_t len)
{
    answer_t *a = ud;
    (void)req;
    a->calls++;
    a->status = status;
    snprintf(a->body, sizeof(a->body), "%.*s", (int)len, body);
}

static mg_http_req_t *request(answer_t *a)
{
    memset(a, 0, sizeof(*a));
    return mg_http_req_detached(HTTP_POST, "/v1/chat/completions", "{}", 2, NULL, 0, on_answer, a);
}

static void test_respond_waits_for_every_commit(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_hold_t *h = mg_hold_new();
    CHECK(req && h);
    mg_hold_expect(h);
    mg_hold_expect(h);
    char body[] = "{\"ok\":true}";
    mg_hold_respond(h, req, 200, "application/json", NULL, body, strlen(body));
    memset(body, 'x', strlen(body)); /* the hold has its own copy */
    CHECK_EQ_INT(a.calls, 0);
    mg_hold_committed(h, 0);
    CHECK_EQ_INT(a.calls, 0);
    mg_hold_committed(h, -1); /* a failed write still releases the answer */
    CHECK_EQ_INT(a.calls, 1);
    CHECK_EQ_INT(a.status, 200);
    CHECK_STR(a.body, "{\"ok\":true}");
}

static void test_commit_before_hand_over(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_hold_t *h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_committed(h, 0); /* not handed over yet: nothing to send, the hold stays */
    CHECK_EQ_INT(a.calls, 0);
    mg_hold_respond(h, req, 201, "application/json", "X-A: b\r\n", "{}", 2);
    CHECK_EQ_INT(a.calls, 1);
    CHECK_EQ_INT(a.status, 201);
}

/* A commit inside the call that queued it (the usage journal's), then the hand-over of a
 * stream's end: sent within the hand-over, and the hold gone with it (ASan reports a leak
 * otherwise). */
static void test_settled_stream_end_sent_at_once(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_hold_t *h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_committed(h, 0);
    mg_hold_stream_end(h, req, 1, 200, "text/event-stream", NULL, "data: [DONE]\n\n", 14);
    CHECK_EQ_INT(a.calls, 1);
    CHECK_EQ_INT(a.status, 200);
    CHECK(strstr(a.body, "data: [DONE]") != NULL);
}

static void test_nothing_expected_sends_at_once(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_hold_t *h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_unexpect(h); /* the write could not be queued */
    mg_hold_respond(h, req, 200, NULL, NULL, "{}", 2);
    CHECK_EQ_INT(a.calls, 1);
}

static void test_stream_end_held(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_http_stream_open(req, 200, "text/event-stream", NULL, "data: 1\n\n", 9, 0);
    mg_hold_t *h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_stream_end(h, req, 0, 200, "text/event-stream", NULL, "data: [DONE]\n\n", 14);
    CHECK_EQ_INT(a.calls, 0);
    mg_hold_committed(h, 0);
    CHECK_EQ_INT(a.calls, 1);
    CHECK_STR(a.body, "data: 1\n\ndata: [DONE]\n\n");
    /* a stream whose head was never sent: the hold opens it */
    req = request(&a);
    h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_stream_end(h, req, 1, 200, "text/event-stream", "Cache-Control: no-cache\r\n",
                       "data: x\n\ndata: [DONE]\n\n", 23);
    CHECK_EQ_INT(a.calls, 0);
    mg_hold_committed(h, 0);
    CHECK_EQ_INT(a.calls, 1);
    CHECK_STR(a.body, "data: x\n\ndata: [DONE]\n\n");
}

/* The client leaves while the end is held: the connection runs the abort hook and frees the
 * request; the commit that arrives later sends nothing. */
static void test_client_gone(void)
{
    answer_t a;
    mg_http_req_t *req = request(&a);
    mg_hold_t *h = mg_hold_new();
    mg_hold_expect(h);
    mg_hold_respond(h, req, 200, NULL, NULL, "{}", 2);
    CHECK(req->on_abort != NULL);
    req->on_abort(req->hook_data); /* as http.c does, before it frees the request */
    req->on_abort = NULL;
    mg_http_respond(req, 499, NULL, NULL, "gone", 4); /* frees the detached request */
    CHECK_EQ_INT(a.calls, 1);
    CHECK_EQ_INT(a.status, 499);
    mg_hold_committed(h, 0); /* frees the hold; nothing is sent */
    CHECK_EQ_INT(a.calls, 1);
}

int main(void)
{
    MG_RUN(test_respond_waits_for_every_commit);
    MG_RUN(test_commit_before_hand_over);
    MG_RUN(test_settled_stream_end_sent_at_once);
    MG_RUN(test_nothing_expected_sends_at_once);
    MG_RUN(test_stream_end_held);
    MG_RUN(test_client_gone);
    return mg_test_summary();
}
