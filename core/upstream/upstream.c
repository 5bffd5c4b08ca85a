/* upstream: libcurl multi on the libuv loop; see upstream.h.
 *
 * Lifetimes: a transfer owns its easy handle (returned to a small free list for
 * reuse), its header list, its request body and one uv_timer_t; the struct itself
 * is freed in the timer's close callback.
 *
 * Re-entrancy: curl refuses to add or remove handles while it is running one of
 * our callbacks (CURLM_RECURSIVE_API_CALL), yet those callbacks legitimately start
 * and cancel transfers (a failed attempt moves to the next provider, a finished
 * response lets the next pipelined request start). While curl is "in action",
 * starts and cancels are queued and applied as soon as curl returns. */
#include "upstream/upstream.h"

#include "upstream/h1client.h"
#include "upstream/headers.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define EASY_POOL_MAX 64

struct mg_upstream_s {
    uv_loop_t *loop;
    mg_h1_t *h1; /* owned: the plain-HTTP client */
    CURLM *multi;
    uv_timer_t timer;
    CURL *easy_pool[EASY_POOL_MAX]; /* owned idle easy handles */
    size_t n_easy_pool;
    mg_xfer_t *xfers; /* intrusive list of live transfers */
    size_t n_active;
    int closing;
    int in_action;        /* inside curl: add/remove must wait */
    mg_xfer_t **deferred; /* owned array: transfers to add or remove later */
    size_t n_deferred, cap_deferred;
};

struct mg_xfer_s {
    int kind; /* MG_XFER_KIND_CURL */
    mg_upstream_t *up;
    mg_xfer_t *prev, *next;
    CURL *easy;
    struct curl_slist *headers; /* owned */
    char *body;                 /* owned */
    uv_timer_t timer;           /* first-byte / idle deadline */
    mg_xfer_cbs_t cbs;
    void *ud;
    int first_byte_ms, idle_ms;
    int got_headers;
    int added;     /* handed to curl */
    int deferred;  /* on up->deferred */
    int cancelled; /* no more user callbacks */
    int timed_out; /* mg_xfer_result_t of our own timer, 0 if none */
    int paused;
    char retry_after[32];
    char content_type[96];
    int status;        /* of the status line being read (a 1xx is followed by another) */
    mg_headers_t errh; /* an error answer's headers (headers.h) */
};

typedef struct {
    uv_poll_t poll;
    curl_socket_t fd;
    mg_upstream_t *up;
} sock_ctx_t;

static void check_done(mg_upstream_t *up);
static void after_action(mg_upstream_t *up);

/* ------------------------------------------------------------------------ */
/* Curl <-> libuv plumbing                                                   */
/* ------------------------------------------------------------------------ */

static void on_poll(uv_poll_t *h, int status, int events)
{
    sock_ctx_t *s = h->data;
    int flags = 0;
    if (status < 0) flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
    int running;
    mg_upstream_t *up = s->up;
    up->in_action = 1;
    curl_multi_socket_action(up->multi, s->fd, flags, &running);
    up->in_action = 0;
    after_action(up);
}

static void on_poll_closed(uv_handle_t *h)
{
    free(h->data);
}

static int on_curl_socket(CURL *e, curl_socket_t fd, int what, void *userp, void *socketp)
{
    mg_upstream_t *up = userp;
    sock_ctx_t *s = socketp;
    if (what == CURL_POLL_REMOVE) {
        if (s) {
            uv_poll_stop(&s->poll);
            uv_close((uv_handle_t *)&s->poll, on_poll_closed);
            curl_multi_assign(up->multi, fd, NULL);
        }
        return 0;
    }
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s) return -1;
        s->fd = fd;
        s->up = up;
        if (uv_poll_init_socket(up->loop, &s->poll, fd) != 0) {
            free(s);
            return -1;
        }
        s->poll.data = s;
        curl_multi_assign(up->multi, fd, s);
    }
    int events = 0;
    if (what & CURL_POLL_IN) events |= UV_READABLE;
    if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
    uv_poll_start(&s->poll, events, on_poll);
    return 0;
}

static void on_multi_timer(uv_timer_t *t)
{
    mg_upstream_t *up = t->data;
    int running;
    up->in_action = 1;
    curl_multi_socket_action(up->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    up->in_action = 0;
    after_action(up);
}

static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp)
{
    mg_upstream_t *up = userp;
    if (timeout_ms < 0) uv_timer_stop(&up->timer);
    else uv_timer_start(&up->timer, on_multi_timer, (uint64_t)timeout_ms, 0);
    return 0;
}

mg_upstream_t *mg_upstream_new(uv_loop_t *loop)
{
    mg_upstream_t *up = calloc(1, sizeof(*up));
    if (!up) return NULL;
    up->loop = loop;
    up->multi = curl_multi_init();
    if (!up->multi) {
        free(up);
        return NULL;
    }
    up->h1 = mg_h1_new(loop);
    if (!up->h1) {
        curl_multi_cleanup(up->multi);
        free(up);
        return NULL;
    }
    uv_timer_init(loop, &up->timer);
    up->timer.data = up;
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(up->multi, CURLMOPT_SOCKETDATA, up);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(up->multi, CURLMOPT_TIMERDATA, up);
    curl_multi_setopt(up->multi, CURLMOPT_MAXCONNECTS, 1024L);
    return up;
}

size_t mg_upstream_active(const mg_upstream_t *up)
{
    return up->n_active + mg_h1_active(up->h1);
}

/* ------------------------------------------------------------------------ */
/* Transfers                                                                 */
/* ------------------------------------------------------------------------ */

static void on_xfer_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

static CURL *easy_get(mg_upstream_t *up)
{
    if (up->n_easy_pool > 0) {
        CURL *e = up->easy_pool[--up->n_easy_pool];
        curl_easy_reset(e);
        return e;
    }
    return curl_easy_init();
}

static void easy_put(mg_upstream_t *up, CURL *e)
{
    if (up->n_easy_pool < EASY_POOL_MAX && !up->closing) up->easy_pool[up->n_easy_pool++] = e;
    else curl_easy_cleanup(e);
}

/* Detach from curl and free (the struct goes in the timer's close callback). */
static void xfer_free(mg_xfer_t *x)
{
    mg_upstream_t *up = x->up;
    if (x->easy) {
        if (x->added) curl_multi_remove_handle(up->multi, x->easy);
        easy_put(up, x->easy);
        x->easy = NULL;
    }
    if (x->prev) x->prev->next = x->next;
    else up->xfers = x->next;
    if (x->next) x->next->prev = x->prev;
    up->n_active--;
    curl_slist_free_all(x->headers);
    free(x->body);
    mg_headers_free(&x->errh);
    uv_timer_stop(&x->timer);
    uv_close((uv_handle_t *)&x->timer, on_xfer_timer_closed);
}

static void xfer_finish(mg_xfer_t *x, mg_xfer_result_t res, const char *detail)
{
    mg_xfer_cbs_t cbs = x->cbs;
    void *ud = x->ud;
    int notify = !x->cancelled;
    x->cancelled = 1;
    xfer_free(x);
    if (notify && cbs.on_done) cbs.on_done(ud, res, detail);
}

static void on_deadline(uv_timer_t *t)
{
    mg_xfer_t *x = t->data;
    xfer_finish(x, x->got_headers ? MG_XFER_IDLE_TIMEOUT : MG_XFER_FIRST_BYTE_TIMEOUT,
                x->got_headers ? "upstream stalled" : "no response from upstream in time");
}

static void arm_deadline(mg_xfer_t *x)
{
    int ms = x->got_headers ? x->idle_ms : x->first_byte_ms;
    if (ms > 0) uv_timer_start(&x->timer, on_deadline, (uint64_t)ms, 0);
}

static void capture_header(mg_xfer_t *x, const char *line, size_t len)
{
    const char *colon = memchr(line, ':', len);
    if (!colon) return;
    size_t nlen = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    while (vlen && (*v == ' ' || *v == '\t')) v++, vlen--;
    while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' ')) vlen--;
    char *dst = NULL;
    size_t cap = 0;
    if (nlen == 11 && strncasecmp(line, "retry-after", 11) == 0) {
        dst = x->retry_after;
        cap = sizeof(x->retry_after);
    } else if (nlen == 12 && strncasecmp(line, "content-type", 12) == 0) {
        dst = x->content_type;
        cap = sizeof(x->content_type);
    }
    if (!dst) return;
    if (vlen >= cap) vlen = cap - 1;
    memcpy(dst, v, vlen);
    dst[vlen] = '\0';
}

static size_t on_curl_header(char *buf, size_t size, size_t n, void *userp)
{
    mg_xfer_t *x = userp;
    size_t len = size * n;
    if (x->cancelled) return 0;
    if (len >= 5 && strncmp(buf, "HTTP/", 5) == 0) {
        /* a new status line (after a 1xx) starts a fresh header set */
        x->retry_after[0] = x->content_type[0] = '\0';
        mg_headers_reset(&x->errh);
        const char *sp = memchr(buf, ' ', len);
        x->status = sp ? atoi(sp + 1) : 0;
        return len;
    }
    if (len <= 2 && (buf[0] == '\r' || buf[0] == '\n')) {
        long status = 0;
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
        if (status >= 100 && status < 200) return len;
        x->got_headers = 1;
        arm_deadline(x);
        if (x->cbs.on_headers) x->cbs.on_headers(x->ud, (int)status);
        return x->cancelled ? 0 : len;
    }
    capture_header(x, buf, len);
    if (x->status >= 400) mg_headers_line(&x->errh, buf, len);
    return len;
}

static size_t on_curl_write(char *buf, size_t size, size_t n, void *userp)
{
    mg_xfer_t *x = userp;
    size_t len = size * n;
    if (x->cancelled) return 0;
    arm_deadline(x);
    int pause = x->cbs.on_data ? x->cbs.on_data(x->ud, buf, len) : 0;
    if (!x->cancelled && x->cbs.on_read_end) x->cbs.on_read_end(x->ud); /* curl's piece = a read */
    if (x->cancelled) return 0;
    if (pause) {
        /* The bytes were consumed: returning CURL_WRITEFUNC_PAUSE would make curl
         * deliver them again on resume. Take them, then pause receiving. */
        x->paused = 1;
        uv_timer_stop(&x->timer); /* a slow client is not a stalled upstream */
        curl_easy_pause(x->easy, CURLPAUSE_RECV);
    }
    return len;
}

static int defer(mg_upstream_t *up, mg_xfer_t *x)
{
    if (up->n_deferred == up->cap_deferred) {
        size_t cap = up->cap_deferred ? up->cap_deferred * 2 : 16;
        mg_xfer_t **d = realloc(up->deferred, cap * sizeof(*d));
        if (!d) return -1;
        up->deferred = d;
        up->cap_deferred = cap;
    }
    up->deferred[up->n_deferred++] = x;
    x->deferred = 1;
    return 0;
}

/* Curl has returned: apply the queued removals and additions, then report what
 * finished. Callbacks run from here may queue more, hence the loop. */
static void after_action(mg_upstream_t *up)
{
    for (;;) {
        while (up->n_deferred > 0) {
            mg_xfer_t *x = up->deferred[--up->n_deferred];
            x->deferred = 0;
            if (x->cancelled) {
                xfer_free(x);
            } else if (!x->added) {
                if (curl_multi_add_handle(up->multi, x->easy) == CURLM_OK) x->added = 1;
                else xfer_finish(x, MG_XFER_CONNECT_ERROR, "cannot start the transfer");
            }
        }
        check_done(up);
        if (up->n_deferred == 0) break;
    }
}

static mg_xfer_result_t classify(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK: return MG_XFER_OK;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR: return MG_XFER_CONNECT_ERROR;
    case CURLE_OPERATION_TIMEDOUT: return MG_XFER_TOTAL_TIMEOUT;
    default: return MG_XFER_ERROR;
    }
}

static void check_done(mg_upstream_t *up)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(up->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        mg_xfer_t *x = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        if (!x || x->cancelled) continue;
        CURLcode rc = msg->data.result;
        mg_xfer_result_t res = classify(rc);
        /* curl reports a connect timeout as a timeout: before headers without a
         * connection it is a connect failure */
        if (rc == CURLE_OPERATION_TIMEDOUT) {
            long connected = 0;
            curl_easy_getinfo(x->easy, CURLINFO_CONNECT_TIME_T, &connected);
            if (connected == 0 && !x->got_headers) res = MG_XFER_CONNECT_ERROR;
        }
        xfer_finish(x, res, res == MG_XFER_OK ? NULL : curl_easy_strerror(rc));
    }
}

/* The list curl sends: the caller's headers, "Expect:" (which keeps curl from waiting for a
 * 100 Continue before a larger body: an upstream that never sends one would cost a second per
 * request), then the lines of extra (see mg_xfer_opts_t). NULL when out of memory (headers
 * freed then). */
static struct curl_slist *all_headers(struct curl_slist *headers, const char *extra)
{
    struct curl_slist *with = curl_slist_append(headers, "Expect:");
    if (!with) {
        curl_slist_free_all(headers);
        return NULL;
    }
    headers = with;
    while (extra && *extra) {
        const char *eol = strstr(extra, "\r\n");
        size_t n = eol ? (size_t)(eol - extra) : strlen(extra);
        char *line = strndup(extra, n);
        struct curl_slist *more = line ? curl_slist_append(headers, line) : NULL;
        free(line);
        if (!more) {
            curl_slist_free_all(headers);
            return NULL;
        }
        headers = more;
        extra = eol ? eol + 2 : extra + n;
    }
    return headers;
}

/* A transfer through curl, whatever the URL's scheme (mg_xfer_start sends only https://
 * here; tests/unit/test_upstream.c reaches curl over http:// through it). */
static int curl_start(mg_upstream_t *up, const mg_xfer_opts_t *o, const mg_xfer_cbs_t *cbs,
                      void *ud, mg_xfer_t **out)
{
    struct curl_slist *headers = all_headers(o->headers, o->extra_head);
    if (!headers) {
        free(o->body);
        return -1;
    }
    mg_xfer_t *x = calloc(1, sizeof(*x));
    CURL *e = x ? easy_get(up) : NULL;
    if (!x || !e) {
        free(x);
        curl_slist_free_all(headers);
        free(o->body);
        return -1;
    }
    x->kind = MG_XFER_KIND_CURL;
    x->up = up;
    x->easy = e;
    x->headers = headers;
    x->body = o->body;
    x->cbs = *cbs;
    x->ud = ud;
    x->first_byte_ms = o->first_byte_timeout_ms;
    x->idle_ms = o->idle_timeout_ms;
    uv_timer_init(up->loop, &x->timer);
    x->timer.data = x;

    curl_easy_setopt(e, CURLOPT_URL, o->url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_PIPEWAIT, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_curl_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_curl_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    if (o->connect_timeout_ms > 0)
        curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
    if (o->total_timeout_ms > 0) curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)o->total_timeout_ms);
    if (o->method && strcmp(o->method, "GET") == 0) {
        curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    } else {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body ? x->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(x->body ? o->body_len : 0));
    }

    x->next = up->xfers;
    if (up->xfers) up->xfers->prev = x;
    up->xfers = x;
    up->n_active++;
    if (up->in_action) {
        if (defer(up, x) != 0) {
            x->cancelled = 1;
            xfer_free(x);
            return -1;
        }
    } else if (curl_multi_add_handle(up->multi, e) != CURLM_OK) {
        x->cancelled = 1;
        xfer_free(x);
        return -1;
    } else {
        x->added = 1;
    }
    arm_deadline(x);
    *out = x;
    return 0;
}

int mg_xfer_start(mg_upstream_t *up, const mg_xfer_opts_t *o, const mg_xfer_cbs_t *cbs, void *ud,
                  mg_xfer_t **out)
{
    if (strncmp(o->url, "http://", 7) == 0)
        return mg_h1_start(up->h1, o, cbs, ud, (mg_h1_xfer_t **)out);
    return curl_start(up, o, cbs, ud, out);
}

void mg_xfer_cancel(mg_xfer_t *x)
{
    if (x->kind == MG_XFER_KIND_H1) {
        mg_h1_cancel((mg_h1_xfer_t *)x);
        return;
    }
    if (x->cancelled) return;
    x->cancelled = 1;
    uv_timer_stop(&x->timer);
    if (x->up->in_action) {
        /* its callbacks now fail; it is removed once curl returns */
        if (!x->deferred && defer(x->up, x) != 0) return;
        return;
    }
    xfer_free(x);
}

void mg_xfer_resume(mg_xfer_t *x)
{
    if (x->kind == MG_XFER_KIND_H1) {
        mg_h1_resume((mg_h1_xfer_t *)x);
        return;
    }
    mg_upstream_t *up = x->up;
    if (!x->paused || x->cancelled || !x->added) return;
    x->paused = 0;
    arm_deadline(x);
    /* may call the write callback right away with the data curl held back */
    int nested = up->in_action;
    up->in_action = 1;
    curl_easy_pause(x->easy, CURLPAUSE_CONT);
    if (!nested) {
        up->in_action = 0;
        after_action(up);
    }
}

char *mg_xfer_take_error_headers(mg_xfer_t *x, size_t *len)
{
    if (x->kind == MG_XFER_KIND_H1) return mg_h1_take_error_headers((mg_h1_xfer_t *)x, len);
    return mg_headers_take(&x->errh, len);
}

const char *mg_xfer_header(const mg_xfer_t *x, const char *name)
{
    if (x->kind == MG_XFER_KIND_H1) return mg_h1_header((const mg_h1_xfer_t *)x, name);
    const char *v = NULL;
    if (strcasecmp(name, "retry-after") == 0) v = x->retry_after;
    else if (strcasecmp(name, "content-type") == 0) v = x->content_type;
    return v && v[0] ? v : NULL;
}

static void on_upstream_timer_closed(uv_handle_t *h)
{
    mg_upstream_t *up = h->data;
    for (size_t i = 0; i < up->n_easy_pool; i++) curl_easy_cleanup(up->easy_pool[i]);
    curl_multi_cleanup(up->multi);
    free(up->deferred);
    free(up);
}

void mg_upstream_close(mg_upstream_t *up)
{
    up->closing = 1;
    up->n_deferred = 0;
    mg_h1_close(up->h1);
    up->h1 = NULL;
    while (up->xfers) {
        up->xfers->cancelled = 1;
        xfer_free(up->xfers);
    }
    uv_timer_stop(&up->timer);
    uv_close((uv_handle_t *)&up->timer, on_upstream_timer_closed);
}
