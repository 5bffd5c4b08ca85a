/* h1client: plain HTTP/1.1 upstream transfers on libuv + llhttp; see h1client.h.
 *
 * Design. The client keeps one `host_t` per distinct "host[:port]" (linear list,
 * providers are few): its resolved addresses (literal IPs parsed once, names
 * resolved with uv_getaddrinfo on the threadpool, cached DNS_TTL_MS, one lookup in
 * flight per host with the connections waiting on it) and its pool of idle
 * keep-alive connections (a LIFO stack, so the warmest socket is reused). A
 * `conn_t` owns a uv_tcp_t, one uv_timer_t, the llhttp parser and the write
 * request; conn structs are recycled through a free list once both handles have
 * closed. A transfer is one malloc: the struct with the request head (and a small
 * body) behind it, built once at start and kept for a possible retry.
 *
 * Timers are lazy: a transfer stores absolute deadlines (connect, total, first
 * byte / idle) and its connection's single timer is only re-armed when a deadline
 * moves earlier than the time it is set for; when it fires early it recomputes
 * and re-arms. Keeping a streaming transfer alive thus costs one store per body
 * piece, not a timer-heap operation.
 *
 * Reading: every connection reads into the client's shared buffer and llhttp
 * parses it in place; idle pooled connections keep reading so that a peer's EOF
 * drops them from the pool at once. A pause (on_data returned 1) makes the
 * parser stop (HPE_PAUSED) right after that piece; the unparsed rest is copied to
 * the connection's own small buffer and reading stops until mg_h1_resume().
 * The parser also pauses at the end of each message, so the transfer ends (and
 * the connection goes back to the pool) outside llhttp's callbacks. A loop turn
 * reads at most TURN_READ_BYTES and one buffer more from all upstreams together:
 * past it, every transfer's connection stops reading until the turn ends (a
 * uv_check, after the poll; libuv then skips their ready events), so that a burst
 * of fast upstreams relaying big answers cannot hold the loop while every other
 * request waits (libuv reads up to 32 buffers of one socket per event: 2 MiB, and
 * as much again from each ready socket).
 *
 * Lifetimes: user callbacks may cancel their own transfer, start others (which
 * may take the connection just pooled) or close the client. A transfer that ends
 * while one of our frames still uses it is only marked `dead`; `busy` counts those
 * frames and the last one out frees it. Connections are never freed under a
 * frame either: uv_close defers that to the next loop turn. The client itself is
 * freed once it is closing, no connection handle is open and no lookup pending. */
#include "upstream/h1client.h"
#include "upstream/headers.h"

#include <llhttp.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define READ_BUF_SIZE (64 * 1024)
#define TURN_READ_BYTES (256 * 1024) /* from all upstreams in one loop turn; see above */
#define INLINE_BODY_MAX (16 * 1024)  /* bodies up to this go in the same buffer as the head */
#define DNS_TTL_MS 30000
#define DEFAULT_IDLE_MS 60000
#define DEFAULT_MAX_IDLE 256
#define MAX_ADDRS 4
#define CONN_FREE_MAX 64
#define MAX_KEY 300
#define NO_DUE UINT64_MAX

typedef struct host_s host_t;
typedef struct conn_s conn_t;

typedef enum {
    C_RESOLVING,  /* waiting for the host's address lookup */
    C_CONNECTING, /* TCP handshake in progress */
    C_ACTIVE,     /* carrying a transfer */
    C_IDLE,       /* in its host's pool */
    C_CLOSING,    /* handles closing; the struct is recycled after */
} conn_state_t;

struct conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t creq;
    uv_write_t wreq;
    llhttp_t parser;
    mg_h1_t *c;
    host_t *host;
    conn_t **list; /* the list the conn is on (pool, waiters, free list), or NULL */
    conn_t *prev, *next;
    mg_h1_xfer_t *x; /* the transfer it carries (RESOLVING..ACTIVE), else NULL */
    conn_state_t state;
    int handles;            /* open uv handles; recycled at 0 */
    int addr_index;         /* which of the host's addresses it connects to */
    int deferred_err;       /* a synchronous resolve/connect error, reported from the timer */
    uint64_t timer_due;     /* loop ms the timer is set for, 0 = stopped */
    uint64_t idle_due;      /* pooled: close at this loop ms */
    unsigned reused : 1;    /* the current request went out on a pooled connection */
    unsigned got_bytes : 1; /* a response byte arrived for the current request */
    unsigned reading : 1;
    unsigned writing : 1;  /* a uv_write of the request is pending */
    unsigned msg_done : 1; /* llhttp paused at the end of the response */
    unsigned in_1xx : 1;   /* parsing an interim 1xx response */
    char hname[16];        /* current header name, when short enough to matter */
    size_t hname_len;
    char *hdst; /* capture target for the current header value, or NULL */
    size_t hcap, hlen;
    char *pend; /* owned: input held back while paused */
    size_t pend_off, pend_len, pend_cap;
    conn_t *dnext, *dprev; /* on the client's deferred list (its turn's reading is done) */
    unsigned deferred : 1;
};

struct host_s {
    host_t *next;
    mg_h1_t *c;
    uint32_t hash;
    int port;
    int literal;   /* an IP literal: addrs[0] never expires */
    int resolving; /* gai in flight */
    int n_addrs, preferred;
    uint64_t addrs_due; /* resolved addresses valid until this loop ms */
    struct sockaddr_storage addrs[MAX_ADDRS];
    uv_getaddrinfo_t gai;
    conn_t *waiters; /* connections waiting for the lookup */
    conn_t *batch;   /* waiters being released by the lookup's callback */
    conn_t *idle;    /* pooled connections, most recently used first */
    size_t n_idle;
    const char *name; /* host for getaddrinfo (no brackets), inside key[] */
    size_t key_len;
    char key[]; /* "host[:port]" as sent in Host, NUL, then name */
};

struct mg_h1_s {
    uv_loop_t *loop;
    host_t *hosts;
    conn_t *free_conns;
    size_t n_free;
    mg_h1_xfer_t *xfers; /* live transfers */
    size_t n_active;
    size_t conns_open;  /* conn structs whose handles have not all closed */
    size_t n_resolving; /* lookups in flight */
    int idle_ms;
    size_t max_idle;
    int closing;
    char *rbuf;         /* owned: shared read buffer */
    size_t turn_read;   /* bytes read from upstreams in this loop turn */
    conn_t *deferred;   /* active connections waiting for the next turn to read again */
    uv_check_t turn;    /* after each poll: the turn ends */
    int turn_open;      /* turn's handle is not closed yet */
    uint64_t deferrals; /* reads put off to the next turn, ever (mg_h1_deferrals) */
};

struct mg_h1_xfer_s {
    int kind; /* MG_XFER_KIND_H1: upstream.c dispatches on this first member */
    mg_h1_t *c;
    mg_h1_xfer_t *prev, *next;
    host_t *host;
    conn_t *cn; /* connection carrying it, NULL before the first / between */
    mg_xfer_cbs_t cbs;
    void *ud;
    uint64_t connect_due, total_due, activity_due; /* loop ms, 0 = none */
    int connect_ms, first_byte_ms, idle_ms;
    int busy;           /* frames of ours using the struct */
    int addr_tries;     /* connect attempts for the current connection */
    unsigned ended : 1; /* no callback may fire any more */
    unsigned dead : 1;  /* unlinked: freed when busy drops to 0 */
    unsigned got_headers : 1;
    unsigned paused : 1;
    unsigned retried : 1;   /* the one transparent retry has been used */
    unsigned head_only : 1; /* HEAD: the response has no body */
    char *body;             /* owned, when too large to sit behind the head */
    size_t body_len;
    char retry_after[32];
    char content_type[96];
    mg_headers_t errh; /* an error answer's headers (headers.h) */
    size_t req_len;
    char req[]; /* request head (+ inline body) */
};

static llhttp_settings_t g_settings;
static int g_settings_ready;

static void conn_close(conn_t *cn);
static void conn_rearm(conn_t *cn);
static void conn_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
static void conn_on_timer(uv_timer_t *t);
static int xfer_connect(mg_h1_xfer_t *x);
static void client_maybe_free(mg_h1_t *c);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static void list_push(conn_t **head, conn_t *cn)
{
    cn->list = head;
    cn->prev = NULL;
    cn->next = *head;
    if (*head) (*head)->prev = cn;
    *head = cn;
}

static void list_remove(conn_t *cn)
{
    if (!cn->list) return;
    if (cn->prev) cn->prev->next = cn->next;
    else *cn->list = cn->next;
    if (cn->next) cn->next->prev = cn->prev;
    cn->list = NULL;
    cn->prev = cn->next = NULL;
}

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* Decimal digits of v at p; returns the end. */
static char *put_uint(char *p, size_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

static char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* ------------------------------------------------------------------------ */
/* URL and request head                                                      */
/* ------------------------------------------------------------------------ */

typedef struct {
    const char *host; /* without brackets */
    size_t host_len;
    int v6; /* was bracketed */
    int port;
    const char *path; /* from the first '/' or '?' to before '#'; may be empty */
    size_t path_len;
} url_t;

static int parse_port(const char **pp, int *port)
{
    const char *p = *pp;
    int v = 0, digits = 0;
    while (*p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > 65535) return -1;
        digits++;
    }
    if (!digits || v == 0) return -1;
    *port = v;
    *pp = p;
    return 0;
}

/* "http://host[:port][/path][?query][#frag]"; 0 or -1. */
static int url_parse(const char *s, url_t *u)
{
    if (!s || strncasecmp(s, "http://", 7) != 0) return -1;
    const char *p = s + 7;
    u->v6 = *p == '[';
    if (u->v6) {
        u->host = ++p;
        while (*p && *p != ']') p++;
        if (*p != ']') return -1;
        u->host_len = (size_t)(p++ - u->host);
    } else {
        u->host = p;
        while (*p && *p != ':' && *p != '/' && *p != '?' && *p != '#') {
            if (*p == '@' || (unsigned char)*p <= ' ') return -1;
            p++;
        }
        u->host_len = (size_t)(p - u->host);
    }
    if (u->host_len == 0 || u->host_len > 253) return -1;
    u->port = 80;
    if (*p == ':' && (p++, parse_port(&p, &u->port) != 0)) return -1;
    if (*p && *p != '/' && *p != '?' && *p != '#') return -1;
    u->path = p;
    while (*p && *p != '#') {
        if ((unsigned char)*p <= ' ' || *p == 0x7f) return -1;
        p++;
    }
    u->path_len = (size_t)(p - u->path);
    return 0;
}

enum { HDR_DROP, HDR_SEND, HDR_EMPTY };
enum { SEEN_HOST = 1, SEEN_CL = 2 };

/* How a caller header line goes on the wire, curl-style: "Name:" with an empty
 * value is dropped, "Name;" becomes "Name:", lines with CR/LF are dropped. Sets
 * *len (without CRLF) and notes a caller-supplied Host or Content-Length. */
static int header_classify_n(const char *s, size_t n, unsigned *seen)
{
    if (n < 2) return HDR_DROP;
    const char *colon = memchr(s, ':', n);
    size_t nl = colon ? (size_t)(colon - s) : n - 1;
    if (nl == 4 && strncasecmp(s, "host", 4) == 0) *seen |= SEEN_HOST;
    else if (nl == 14 && strncasecmp(s, "content-length", 14) == 0) *seen |= SEEN_CL;
    if (!colon) return s[n - 1] == ';' ? HDR_EMPTY : HDR_DROP;
    const char *v = colon + 1, *end = s + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    return v == end ? HDR_DROP : HDR_SEND;
}

static int header_classify(const char *s, size_t *len, unsigned *seen)
{
    size_t n = strcspn(s, "\r\n");
    *len = n;
    return s[n] != '\0' ? HDR_DROP : header_classify_n(s, n, seen);
}

/* Caller header lines as classified by the sizing pass, so the copying pass does
 * not scan them again (lines past HDR_CACHE are classified twice). */
#define HDR_CACHE 32
typedef struct {
    size_t len[HDR_CACHE];
    unsigned char kind[HDR_CACHE];
    size_t n;
    unsigned seen;
} hdr_scan_t;

static size_t headers_size(const struct curl_slist *h, hdr_scan_t *sc)
{
    size_t total = 0, n;
    sc->n = 0;
    sc->seen = 0;
    for (; h; h = h->next) {
        int kind = header_classify(h->data, &n, &sc->seen);
        if (sc->n < HDR_CACHE) {
            sc->len[sc->n] = n;
            sc->kind[sc->n++] = (unsigned char)kind;
        }
        if (kind != HDR_DROP) total += n + 2;
    }
    return total;
}

static char *headers_copy(char *p, const struct curl_slist *h, const hdr_scan_t *sc)
{
    unsigned seen = 0;
    size_t n;
    for (size_t i = 0; h; h = h->next, i++) {
        int kind;
        if (i < sc->n) {
            kind = sc->kind[i];
            n = sc->len[i];
        } else {
            kind = header_classify(h->data, &n, &seen);
        }
        if (kind == HDR_DROP) continue;
        p = put(p, h->data, n);
        if (kind == HDR_EMPTY) p[-1] = ':';
        p = put(p, "\r\n", 2);
    }
    return p;
}

static int method_ok(const char *m)
{
    size_t n = 0;
    for (; m[n]; n++)
        if (!((m[n] >= 'A' && m[n] <= 'Z') || (m[n] >= 'a' && m[n] <= 'z'))) return 0;
    return n > 0 && n <= 16;
}

/* Allocate the transfer with its request head (and the body when small) behind
 * it. Takes ownership of `body` (kept, or copied and freed); NULL when out of
 * memory. */
static mg_h1_xfer_t *xfer_alloc(const host_t *h, const char *method, const url_t *u,
                                const struct curl_slist *hdrs, const char *own_head, char *body,
                                size_t body_len)
{
    int send_body = strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
    if (!send_body || !body) body_len = 0;
    hdr_scan_t sc;
    size_t own_len = own_head ? strlen(own_head) : 0;
    size_t hl = headers_size(hdrs, &sc) + own_len;
    unsigned seen = sc.seen;
    int slash = u->path_len == 0 || u->path[0] != '/';
    int inline_body = body_len <= INLINE_BODY_MAX;
    size_t head = strlen(method) + 1 + slash + u->path_len + 11 + 8 + h->key_len + hl + 40 + 2;
    size_t size = head + (inline_body ? body_len : 0);
    mg_h1_xfer_t *x = malloc(sizeof(*x) + size);
    if (!x) {
        free(body);
        return NULL;
    }
    memset(x, 0, sizeof(*x));
    x->kind = MG_XFER_KIND_H1;
    char *p = x->req;
    p = put(p, method, strlen(method));
    p = put(p, slash ? " /" : " ", slash ? 2 : 1);
    p = put(p, u->path, u->path_len);
    p = put(p, " HTTP/1.1\r\n", 11);
    if (!(seen & SEEN_HOST)) {
        p = put(p, "Host: ", 6);
        p = put(p, h->key, h->key_len);
        p = put(p, "\r\n", 2);
    }
    p = headers_copy(p, hdrs, &sc);
    if (own_len) p = put(p, own_head, own_len);
    if (send_body && !(seen & SEEN_CL)) {
        p = put(p, "Content-Length: ", 16);
        p = put_uint(p, body_len);
        p = put(p, "\r\n", 2);
    }
    p = put(p, "\r\n", 2);
    if (inline_body) {
        if (body_len) p = put(p, body, body_len);
        free(body);
    } else {
        x->body = body;
        x->body_len = body_len;
    }
    x->req_len = (size_t)(p - x->req);
    x->head_only = strcmp(method, "HEAD") == 0;
    return x;
}

/* ------------------------------------------------------------------------ */
/* Hosts: addresses and pools                                                */
/* ------------------------------------------------------------------------ */

/* "host[:port]" into key (brackets kept for IPv6, :80 left out); its length. */
static size_t url_key(const url_t *u, char *key)
{
    char *p = key;
    if (u->v6) *p++ = '[';
    p = put(p, u->host, u->host_len);
    if (u->v6) *p++ = ']';
    if (u->port != 80) {
        *p++ = ':';
        p = put_uint(p, (size_t)u->port);
    }
    return (size_t)(p - key);
}

static int name_ok(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '-' || *s == '_'))
            return 0;
    return 1;
}

/* Decide whether the host is an IP literal (its one address set) or a name. */
static int host_classify(host_t *h, int v6)
{
    if (v6) {
        h->literal = uv_ip6_addr(h->name, h->port, (struct sockaddr_in6 *)&h->addrs[0]) == 0;
        if (!h->literal) return -1;
    } else {
        h->literal = uv_ip4_addr(h->name, h->port, (struct sockaddr_in *)&h->addrs[0]) == 0;
        if (!h->literal && !name_ok(h->name)) return -1;
    }
    h->n_addrs = h->literal ? 1 : 0;
    return 0;
}

static host_t *host_new(mg_h1_t *c, const url_t *u, const char *key, size_t klen, uint32_t hash)
{
    host_t *h = calloc(1, sizeof(*h) + klen + 1 + u->host_len + 1);
    if (!h) return NULL;
    h->c = c;
    h->hash = hash;
    h->port = u->port;
    h->key_len = klen;
    memcpy(h->key, key, klen);
    char *name = h->key + klen + 1;
    memcpy(name, u->host, u->host_len);
    h->name = name;
    if (host_classify(h, u->v6) != 0) {
        free(h);
        return NULL;
    }
    h->next = c->hosts;
    c->hosts = h;
    return h;
}

static host_t *host_get(mg_h1_t *c, const url_t *u)
{
    char key[MAX_KEY];
    size_t klen = url_key(u, key);
    uint32_t hash = hash_bytes(key, klen);
    for (host_t *h = c->hosts; h; h = h->next)
        if (h->hash == hash && h->key_len == klen && memcmp(h->key, key, klen) == 0) return h;
    return host_new(c, u, key, klen, hash);
}

static int host_has_addrs(const host_t *h, uint64_t now)
{
    return h->literal || (h->n_addrs > 0 && now < h->addrs_due);
}

/* Keep up to MAX_ADDRS TCP addresses of the lookup, with the port set. */
static int host_store_addrs(host_t *h, const struct addrinfo *ai, uint64_t now)
{
    int n = 0;
    for (; ai && n < MAX_ADDRS; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET) {
            memcpy(&h->addrs[n], ai->ai_addr, sizeof(struct sockaddr_in));
            ((struct sockaddr_in *)&h->addrs[n++])->sin_port = htons((uint16_t)h->port);
        } else if (ai->ai_family == AF_INET6) {
            memcpy(&h->addrs[n], ai->ai_addr, sizeof(struct sockaddr_in6));
            ((struct sockaddr_in6 *)&h->addrs[n++])->sin6_port = htons((uint16_t)h->port);
        }
    }
    h->n_addrs = n;
    h->preferred = 0;
    h->addrs_due = now + DNS_TTL_MS;
    return n > 0 ? 0 : UV_EAI_NODATA;
}

static void pool_unlink(conn_t *cn)
{
    if (cn->list == &cn->host->idle) cn->host->n_idle--;
    list_remove(cn);
}

/* The most recently pooled live connection of the host, or NULL. */
static conn_t *pool_take(host_t *h, uint64_t now)
{
    conn_t *cn;
    while ((cn = h->idle) != NULL) {
        if (now < cn->idle_due) {
            pool_unlink(cn);
            cn->state = C_ACTIVE;
            return cn;
        }
        conn_close(cn);
    }
    return NULL;
}

static int conn_read_start(conn_t *cn);

/* Park a finished connection in its host's pool, or close it. */
static void pool_put(conn_t *cn)
{
    mg_h1_t *c = cn->c;
    host_t *h = cn->host;
    if (c->closing || c->idle_ms <= 0 || h->n_idle >= c->max_idle ||
        (!cn->reading && conn_read_start(cn) != 0)) {
        conn_close(cn);
        return;
    }
    cn->state = C_IDLE;
    cn->idle_due = uv_now(c->loop) + (uint64_t)c->idle_ms;
    list_push(&h->idle, cn);
    h->n_idle++;
    conn_rearm(cn);
}

/* ------------------------------------------------------------------------ */
/* Transfer lifetime                                                          */
/* ------------------------------------------------------------------------ */

static void xfer_free(mg_h1_xfer_t *x)
{
    free(x->body);
    mg_headers_free(&x->errh);
    free(x);
}

static void xfer_unbusy(mg_h1_xfer_t *x)
{
    if (--x->busy == 0 && x->dead) xfer_free(x);
}

static conn_t *xfer_detach(mg_h1_xfer_t *x)
{
    conn_t *cn = x->cn;
    if (cn) cn->x = NULL;
    x->cn = NULL;
    return cn;
}

/* End a detached transfer: unlink it, report unless `notify` is 0 (cancel), and
 * free it once no frame of ours uses it. */
static void xfer_end(mg_h1_xfer_t *x, mg_xfer_result_t res, const char *detail, int notify)
{
    mg_h1_t *c = x->c;
    x->ended = 1;
    if (x->prev) x->prev->next = x->next;
    else c->xfers = x->next;
    if (x->next) x->next->prev = x->prev;
    c->n_active--;
    if (notify && x->cbs.on_done) {
        x->busy++;
        x->cbs.on_done(x->ud, res, detail);
        x->busy--;
    }
    x->dead = 1;
    if (x->busy == 0) xfer_free(x);
}

/* Fail the transfer and close its connection (never pooled). */
static void xfer_fail(mg_h1_xfer_t *x, mg_xfer_result_t res, const char *detail)
{
    conn_t *cn = xfer_detach(x);
    if (cn) conn_close(cn);
    xfer_end(x, res, detail, 1);
}

/* The input held back while paused is consumed: its buffer goes too. It is needed only while a
 * slow client holds the transfer, so a pooled or recycled connection must not keep it (a
 * burst of slow readers left up to 64 KiB on each of hundreds of connections: bench/README.md,
 * the slow-clients RSS). */
static void pend_release(conn_t *cn)
{
    free(cn->pend);
    cn->pend = NULL;
    cn->pend_off = cn->pend_len = cn->pend_cap = 0;
}

/* The response is complete: pool the connection when it can carry another. */
static void xfer_complete(mg_h1_xfer_t *x, conn_t *cn, int reusable)
{
    int keep = reusable && !cn->writing && llhttp_should_keep_alive(&cn->parser);
    xfer_detach(x);
    pend_release(cn);
    if (keep) pool_put(cn);
    else conn_close(cn);
    xfer_end(x, MG_XFER_OK, NULL, 1);
}

/* A pooled connection turned out stale before any response byte: send again on
 * a fresh one (once). */
static void xfer_retry(mg_h1_xfer_t *x)
{
    conn_close(xfer_detach(x));
    x->retried = 1;
    if (xfer_connect(x) != 0) xfer_end(x, MG_XFER_CONNECT_ERROR, "out of memory", 1);
}

/* ------------------------------------------------------------------------ */
/* Timers and deadlines                                                       */
/* ------------------------------------------------------------------------ */

static uint64_t xfer_next_due(const mg_h1_xfer_t *x, const conn_t *cn)
{
    uint64_t due = NO_DUE;
    if (cn->state != C_ACTIVE && x->connect_due) due = x->connect_due;
    if (x->total_due && x->total_due < due) due = x->total_due;
    if (!x->paused && x->activity_due && x->activity_due < due) due = x->activity_due;
    return due;
}

/* Make the timer fire no later than `due` (it may fire earlier: then it re-arms). */
static void conn_timer_at(conn_t *cn, uint64_t due)
{
    if (due == NO_DUE || (cn->timer_due && cn->timer_due <= due)) return;
    uint64_t now = uv_now(cn->c->loop);
    uv_timer_start(&cn->timer, conn_on_timer, due > now ? due - now : 0, 0);
    cn->timer_due = due > now ? due : now;
}

static void conn_rearm(conn_t *cn)
{
    if (cn->state == C_IDLE) conn_timer_at(cn, cn->idle_due);
    else if (cn->x) conn_timer_at(cn, xfer_next_due(cn->x, cn));
}

/* A synchronous error, reported from the next timer run (never inside start). */
static void conn_fail_soon(conn_t *cn, int err)
{
    cn->deferred_err = err;
    cn->timer_due = 0;
    conn_timer_at(cn, uv_now(cn->c->loop));
}

/* Which deadline, if any, has passed. */
static int xfer_expired(const mg_h1_xfer_t *x, const conn_t *cn, uint64_t now,
                        mg_xfer_result_t *res, const char **detail)
{
    int connecting = cn->state != C_ACTIVE;
    if (connecting && x->connect_due && now >= x->connect_due) {
        *res = MG_XFER_CONNECT_ERROR;
        *detail = "connect to upstream timed out";
    } else if (x->total_due && now >= x->total_due) {
        *res = connecting ? MG_XFER_CONNECT_ERROR : MG_XFER_TOTAL_TIMEOUT;
        *detail = "upstream transfer timed out";
    } else if (!x->paused && x->activity_due && now >= x->activity_due) {
        *res = x->got_headers ? MG_XFER_IDLE_TIMEOUT : MG_XFER_FIRST_BYTE_TIMEOUT;
        *detail = x->got_headers ? "upstream stalled" : "no response from upstream in time";
    } else {
        return 0;
    }
    return 1;
}

static void conn_connect_failed(conn_t *cn, int err);

static void conn_on_timer(uv_timer_t *t)
{
    conn_t *cn = t->data;
    uint64_t now = uv_now(t->loop);
    cn->timer_due = 0;
    if (cn->state == C_IDLE) {
        if (now >= cn->idle_due) conn_close(cn);
        else conn_rearm(cn);
        return;
    }
    mg_h1_xfer_t *x = cn->x;
    if (!x) return;
    if (cn->deferred_err) {
        int err = cn->deferred_err;
        cn->deferred_err = 0;
        if (cn->state == C_RESOLVING)
            xfer_fail(x, MG_XFER_CONNECT_ERROR, "could not resolve the upstream host");
        else conn_connect_failed(cn, err);
        return;
    }
    mg_xfer_result_t res;
    const char *detail;
    if (xfer_expired(x, cn, now, &res, &detail)) xfer_fail(x, res, detail);
    else conn_rearm(cn);
}

/* ------------------------------------------------------------------------ */
/* Connections                                                                */
/* ------------------------------------------------------------------------ */

static void conn_on_closed(uv_handle_t *hd)
{
    conn_t *cn = hd->data;
    if (--cn->handles > 0) return;
    mg_h1_t *c = cn->c;
    c->conns_open--;
    pend_release(cn);
    if (c->closing || c->n_free >= CONN_FREE_MAX) {
        free(cn);
    } else {
        list_push(&c->free_conns, cn);
        c->n_free++;
    }
    client_maybe_free(c);
}

/* ---- the turn's read budget ---- */

static void defer_remove(conn_t *cn)
{
    if (!cn->deferred) return;
    if (cn->dprev) cn->dprev->dnext = cn->dnext;
    else cn->c->deferred = cn->dnext;
    if (cn->dnext) cn->dnext->dprev = cn->dprev;
    cn->dnext = cn->dprev = NULL;
    cn->deferred = 0;
}

/* This connection reads again in the next turn. */
static void defer_read(conn_t *cn)
{
    mg_h1_t *c = cn->c;
    uv_read_stop((uv_stream_t *)&cn->tcp);
    cn->reading = 0;
    cn->deferred = 1;
    cn->dprev = NULL;
    cn->dnext = c->deferred;
    if (c->deferred) c->deferred->dprev = cn;
    c->deferred = cn;
    c->deferrals++;
}

/* The turn's budget is spent: no transfer reads more in this turn. */
static void defer_all(mg_h1_t *c)
{
    for (mg_h1_xfer_t *x = c->xfers; x; x = x->next) {
        conn_t *cn = x->cn;
        if (cn && cn->state == C_ACTIVE && cn->reading && !cn->deferred) defer_read(cn);
    }
}

/* After the poll: a new turn's budget, and the deferred connections read again (those whose
 * transfer paused or ended meanwhile stay as they are). */
static void on_turn_end(uv_check_t *h)
{
    mg_h1_t *c = h->data;
    c->turn_read = 0;
    while (c->deferred) {
        conn_t *cn = c->deferred;
        defer_remove(cn);
        mg_h1_xfer_t *x = cn->x;
        if (cn->state != C_ACTIVE || !x || x->ended || x->paused || cn->reading) continue;
        if (conn_read_start(cn) != 0) xfer_fail(x, MG_XFER_ERROR, "cannot read from upstream");
    }
}

static void conn_close(conn_t *cn)
{
    if (cn->state == C_CLOSING) return;
    defer_remove(cn);
    pool_unlink(cn);
    cn->state = C_CLOSING;
    cn->x = NULL;
    cn->reading = 0;
    uv_close((uv_handle_t *)&cn->tcp, conn_on_closed);
    uv_close((uv_handle_t *)&cn->timer, conn_on_closed);
}

static conn_t *conn_new(mg_h1_t *c, host_t *h)
{
    conn_t *cn = c->free_conns;
    if (cn) {
        list_remove(cn);
        c->n_free--;
    } else if (!(cn = malloc(sizeof(*cn)))) {
        return NULL;
    }
    memset(cn, 0, sizeof(*cn)); /* a recycled one has no held input left (pend_release) */
    cn->c = c;
    cn->host = h;
    uv_tcp_init(c->loop, &cn->tcp);
    uv_timer_init(c->loop, &cn->timer);
    cn->tcp.data = cn->timer.data = cn;
    cn->handles = 2;
    c->conns_open++;
    return cn;
}

/* Bind a transfer to a connection with a fresh parser. */
static void conn_attach(conn_t *cn, mg_h1_xfer_t *x)
{
    cn->x = x;
    x->cn = cn;
    llhttp_init(&cn->parser, HTTP_RESPONSE, &g_settings);
    cn->parser.data = cn;
    cn->got_bytes = cn->msg_done = cn->in_1xx = 0;
    cn->hdst = NULL;
    cn->hname_len = 0;
}

static void conn_on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    conn_t *cn = hd->data;
    *buf = uv_buf_init(cn->c->rbuf, READ_BUF_SIZE);
}

static int conn_read_start(conn_t *cn)
{
    int rc = uv_read_start((uv_stream_t *)&cn->tcp, conn_on_alloc, conn_on_read);
    cn->reading = rc == 0;
    return rc;
}

static void conn_on_written(uv_write_t *w, int status)
{
    conn_t *cn = w->data;
    cn->writing = 0;
    if (status == 0 || cn->state != C_ACTIVE) return;
    mg_h1_xfer_t *x = cn->x;
    if (cn->reused && !cn->got_bytes && !x->retried) xfer_retry(x);
    else xfer_fail(x, MG_XFER_ERROR, "could not send the request upstream");
}

/* Send the request: uv_try_write, then queue whatever the socket did not take. */
static int conn_send(conn_t *cn)
{
    mg_h1_xfer_t *x = cn->x;
    uv_buf_t b[2] = {uv_buf_init(x->req, (unsigned)x->req_len),
                     uv_buf_init(x->body, (unsigned)x->body_len)};
    unsigned nb = x->body ? 2 : 1, i = 0;
    int n = uv_try_write((uv_stream_t *)&cn->tcp, b, nb);
    if (n == UV_EAGAIN) n = 0;
    if (n < 0) return n;
    size_t left = (size_t)n;
    while (i < nb && left >= b[i].len) left -= b[i++].len;
    if (i == nb) return 0;
    b[i].base += left;
    b[i].len -= left;
    cn->wreq.data = cn;
    int rc = uv_write(&cn->wreq, (uv_stream_t *)&cn->tcp, b + i, nb - i, conn_on_written);
    cn->writing = rc == 0;
    return rc;
}

static void conn_connect(conn_t *cn, int index);

/* This address failed: try the host's next one, else report the failure. */
static void conn_connect_failed(conn_t *cn, int err)
{
    mg_h1_xfer_t *x = cn->x;
    host_t *h = cn->host;
    int next = h->n_addrs > 0 ? (cn->addr_index + 1) % h->n_addrs : 0;
    conn_close(xfer_detach(x));
    if (x->addr_tries < h->n_addrs) {
        conn_t *n = conn_new(x->c, h);
        if (n) {
            conn_attach(n, x);
            conn_connect(n, next);
            conn_rearm(n);
            return;
        }
    }
    xfer_end(x, MG_XFER_CONNECT_ERROR, uv_strerror(err), 1);
}

static void conn_on_connected(uv_connect_t *req, int status)
{
    conn_t *cn = req->data;
    if (cn->state != C_CONNECTING) return; /* closed meanwhile */
    if (status < 0) {
        conn_connect_failed(cn, status);
        return;
    }
    cn->state = C_ACTIVE;
    cn->host->preferred = cn->addr_index;
    uv_tcp_nodelay(&cn->tcp, 1);
    if (conn_read_start(cn) != 0 || conn_send(cn) != 0)
        xfer_fail(cn->x, MG_XFER_ERROR, "could not send the request upstream");
}

static void conn_connect(conn_t *cn, int index)
{
    host_t *h = cn->host;
    cn->state = C_CONNECTING;
    cn->addr_index = index;
    cn->x->addr_tries++;
    cn->creq.data = cn;
    int rc = uv_tcp_connect(&cn->creq, &cn->tcp, (const struct sockaddr *)&h->addrs[index],
                            conn_on_connected);
    if (rc != 0) conn_fail_soon(cn, rc);
}

/* ------------------------------------------------------------------------ */
/* Name resolution                                                            */
/* ------------------------------------------------------------------------ */

/* Connect (or fail) every connection that waited for the lookup. Callbacks may
 * start, cancel or close anything, hence the batch list the waiters move to. */
static void host_release_waiters(host_t *h, int status)
{
    h->batch = h->waiters;
    h->waiters = NULL;
    for (conn_t *cn = h->batch; cn; cn = cn->next) cn->list = &h->batch;
    conn_t *cn;
    while ((cn = h->batch) != NULL) {
        list_remove(cn);
        if (status == 0) {
            conn_connect(cn, h->preferred);
            conn_rearm(cn);
        } else {
            xfer_fail(cn->x, MG_XFER_CONNECT_ERROR, "could not resolve the upstream host");
        }
    }
}

static void host_on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    host_t *h = req->data;
    mg_h1_t *c = h->c;
    h->resolving = 0;
    if (status == 0) status = host_store_addrs(h, res, uv_now(c->loop));
    uv_freeaddrinfo(res);
    if (!c->closing) host_release_waiters(h, status);
    c->n_resolving--;
    client_maybe_free(c);
}

/* Park the connection until the host's addresses are known; one lookup per host. */
static void host_resolve(host_t *h, conn_t *cn)
{
    mg_h1_t *c = h->c;
    cn->state = C_RESOLVING;
    if (!h->resolving) {
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_protocol = IPPROTO_TCP;
        h->gai.data = h;
        int rc = uv_getaddrinfo(c->loop, &h->gai, host_on_resolved, h->name, NULL, &hints);
        if (rc != 0) {
            conn_fail_soon(cn, rc);
            return;
        }
        h->resolving = 1;
        c->n_resolving++;
    }
    list_push(&h->waiters, cn);
}

/* Open a new connection for x (resolving first if needed). 0, or -1 when out of
 * memory; connect errors are reported later through on_done. */
static int xfer_connect(mg_h1_xfer_t *x)
{
    mg_h1_t *c = x->c;
    host_t *h = x->host;
    conn_t *cn = conn_new(c, h);
    if (!cn) return -1;
    conn_attach(cn, x);
    uint64_t now = uv_now(c->loop);
    x->connect_due = x->connect_ms > 0 ? now + (uint64_t)x->connect_ms : 0;
    x->addr_tries = 0;
    if (host_has_addrs(h, now)) conn_connect(cn, h->preferred < h->n_addrs ? h->preferred : 0);
    else host_resolve(h, cn);
    conn_rearm(cn);
    return 0;
}

/* Send on a pooled connection, or open one. 0, or negative when nothing could be
 * started (no callback fired). */
static int xfer_dispatch(mg_h1_xfer_t *x)
{
    conn_t *cn = pool_take(x->host, uv_now(x->c->loop));
    if (cn) {
        conn_attach(cn, x);
        cn->reused = 1;
        if (conn_send(cn) == 0) {
            conn_rearm(cn);
            return 0;
        }
        conn_close(xfer_detach(x)); /* stale: the peer had closed it */
        x->retried = 1;
    }
    return xfer_connect(x);
}

/* ------------------------------------------------------------------------ */
/* Response parsing (llhttp callbacks)                                         */
/* ------------------------------------------------------------------------ */

static int p_on_message_begin(llhttp_t *p)
{
    conn_t *cn = p->data;
    cn->x->retry_after[0] = cn->x->content_type[0] = '\0';
    mg_headers_reset(&cn->x->errh);
    cn->hname_len = 0;
    cn->hdst = NULL;
    return 0;
}

static int p_on_header_field(llhttp_t *p, const char *at, size_t len)
{
    conn_t *cn = p->data;
    if (p->status_code >= 400) mg_headers_name(&cn->x->errh, at, len);
    if (cn->hname_len + len > sizeof(cn->hname)) {
        cn->hname_len = sizeof(cn->hname); /* too long to be one we capture */
        return 0;
    }
    memcpy(cn->hname + cn->hname_len, at, len);
    cn->hname_len += len;
    return 0;
}

static int p_on_header_field_complete(llhttp_t *p)
{
    conn_t *cn = p->data;
    mg_h1_xfer_t *x = cn->x;
    cn->hdst = NULL;
    if (cn->hname_len == 11 && strncasecmp(cn->hname, "retry-after", 11) == 0) {
        cn->hdst = x->retry_after;
        cn->hcap = sizeof(x->retry_after);
    } else if (cn->hname_len == 12 && strncasecmp(cn->hname, "content-type", 12) == 0) {
        cn->hdst = x->content_type;
        cn->hcap = sizeof(x->content_type);
    }
    if (cn->hdst) cn->hdst[0] = '\0';
    cn->hname_len = 0;
    cn->hlen = 0;
    return 0;
}

static int p_on_header_value(llhttp_t *p, const char *at, size_t len)
{
    conn_t *cn = p->data;
    if (p->status_code >= 400) mg_headers_value(&cn->x->errh, at, len);
    if (!cn->hdst) return 0;
    size_t room = cn->hcap - 1 - cn->hlen;
    if (len > room) len = room;
    memcpy(cn->hdst + cn->hlen, at, len);
    cn->hlen += len;
    cn->hdst[cn->hlen] = '\0';
    return 0;
}

static int p_on_header_value_complete(llhttp_t *p)
{
    conn_t *cn = p->data;
    if (p->status_code >= 400) mg_headers_end_value(&cn->x->errh);
    if (!cn->hdst) return 0;
    while (cn->hlen && (cn->hdst[cn->hlen - 1] == ' ' || cn->hdst[cn->hlen - 1] == '\t'))
        cn->hdst[--cn->hlen] = '\0';
    cn->hdst = NULL;
    return 0;
}

static int p_on_headers_complete(llhttp_t *p)
{
    conn_t *cn = p->data;
    mg_h1_xfer_t *x = cn->x;
    int status = (int)p->status_code;
    if (status < 100) return -1; /* "HTTP/1.1 0 x" is no status at all */
    if (status < 200) {
        if (status == 101) return -1; /* we never ask to switch protocols */
        cn->in_1xx = 1;               /* interim: the real response follows */
        return 0;
    }
    x->got_headers = 1;
    x->activity_due = x->idle_ms > 0 ? uv_now(x->c->loop) + (uint64_t)x->idle_ms : 0;
    conn_rearm(cn); /* the idle deadline may come before the first-byte one */
    if (x->cbs.on_headers) x->cbs.on_headers(x->ud, status);
    if (x->ended) return HPE_PAUSED;
    return x->head_only ? 1 : 0;
}

static int p_on_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *cn = p->data;
    mg_h1_xfer_t *x = cn->x;
    if (len == 0) return 0;
    /* an interim (1xx) answer has no body: bytes there are not the final answer's (fuzz_h1client)
     */
    if (!x->got_headers) return -1;
    if (x->idle_ms > 0) x->activity_due = uv_now(x->c->loop) + (uint64_t)x->idle_ms;
    int pause = x->cbs.on_data ? x->cbs.on_data(x->ud, at, len) : 0;
    if (x->ended) return HPE_PAUSED;
    if (pause) {
        x->paused = 1;
        return HPE_PAUSED;
    }
    return 0;
}

static int p_on_message_complete(llhttp_t *p)
{
    conn_t *cn = p->data;
    if (cn->in_1xx) {
        cn->in_1xx = 0;
        return 0;
    }
    cn->msg_done = 1;
    return HPE_PAUSED; /* end the transfer outside the parser */
}

static void settings_init(void)
{
    if (g_settings_ready) return;
    llhttp_settings_init(&g_settings);
    g_settings.on_message_begin = p_on_message_begin;
    g_settings.on_header_field = p_on_header_field;
    g_settings.on_header_field_complete = p_on_header_field_complete;
    g_settings.on_header_value = p_on_header_value;
    g_settings.on_header_value_complete = p_on_header_value_complete;
    g_settings.on_headers_complete = p_on_headers_complete;
    g_settings.on_body = p_on_body;
    g_settings.on_message_complete = p_on_message_complete;
    g_settings_ready = 1;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                    */
/* ------------------------------------------------------------------------ */

/* Paused mid-input: keep the unparsed rest and stop reading. */
static int conn_hold(conn_t *cn, const char *rest, size_t n, int from_pend)
{
    if (from_pend) {
        if (cn->pend) cn->pend_off = (size_t)(rest - cn->pend);
    } else if (n > 0) {
        if (n > cn->pend_cap) {
            size_t cap = (n + 4095) & ~(size_t)4095; /* at most one read: READ_BUF_SIZE */
            char *b = realloc(cn->pend, cap);
            if (!b) return -1;
            cn->pend = b;
            cn->pend_cap = cap;
        }
        memcpy(cn->pend, rest, n);
        cn->pend_off = 0;
        cn->pend_len = n;
    }
    if (cn->reading) uv_read_stop((uv_stream_t *)&cn->tcp);
    cn->reading = 0;
    return 0;
}

/* What llhttp's return means for the transfer (which is still live). */
static void feed_outcome(conn_t *cn, mg_h1_xfer_t *x, llhttp_errno_t e, const char *data,
                         size_t len, int from_pend)
{
    if (e == HPE_OK) {
        if (from_pend) pend_release(cn); /* all of it parsed */
        return;
    }
    size_t used = e == HPE_PAUSED ? (size_t)(llhttp_get_error_pos(&cn->parser) - data) : 0;
    if (e == HPE_PAUSED && cn->msg_done) {
        xfer_complete(x, cn, used == len); /* bytes after the response: do not reuse */
    } else if (e == HPE_PAUSED && x->paused) {
        if (conn_hold(cn, data + used, len - used, from_pend) != 0)
            xfer_fail(x, MG_XFER_ERROR, "out of memory");
    } else {
        xfer_fail(x, MG_XFER_ERROR, "malformed response from upstream");
    }
}

/* Parse input for the connection's transfer. */
static void conn_feed(conn_t *cn, const char *data, size_t len, int from_pend)
{
    mg_h1_xfer_t *x = cn->x;
    x->busy++;
    llhttp_errno_t e = llhttp_execute(&cn->parser, data, len);
    if (!x->ended) feed_outcome(cn, x, e, data, len, from_pend);
    if (!x->ended && x->cbs.on_read_end) x->cbs.on_read_end(x->ud);
    xfer_unbusy(x);
}

/* EOF after response bytes: completes a close-delimited body, else truncation. */
static void conn_feed_eof(conn_t *cn)
{
    mg_h1_xfer_t *x = cn->x;
    x->busy++;
    llhttp_errno_t e = llhttp_finish(&cn->parser);
    if (!x->ended) {
        if (e == HPE_PAUSED && cn->msg_done) xfer_complete(x, cn, 0);
        else xfer_fail(x, MG_XFER_ERROR, "upstream closed the connection mid-response");
    }
    xfer_unbusy(x);
}

static void conn_read_error(conn_t *cn, int err)
{
    mg_h1_xfer_t *x = cn->x;
    int gone = err == UV_EOF || err == UV_ECONNRESET || err == UV_EPIPE;
    if (gone && cn->reused && !cn->got_bytes && !x->retried) xfer_retry(x);
    else if (err == UV_EOF && cn->got_bytes) conn_feed_eof(cn);
    else if (err == UV_EOF)
        xfer_fail(x, MG_XFER_ERROR, "upstream closed the connection without a response");
    else xfer_fail(x, MG_XFER_ERROR, uv_strerror(err));
}

static void conn_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    conn_t *cn = s->data;
    if (n == 0) return;
    if (cn->state != C_ACTIVE) {
        conn_close(cn); /* pooled: EOF, reset or stray bytes all retire it */
        return;
    }
    if (n < 0) {
        conn_read_error(cn, (int)n);
        return;
    }
    cn->got_bytes = 1;
    conn_feed(cn, buf->base, (size_t)n, 0);
    /* cn outlives the feed (a close frees it after this turn); back in the pool, it keeps
     * reading for the peer's EOF */
    mg_h1_t *c = cn->c;
    c->turn_read += (size_t)n;
    if (c->turn_read >= TURN_READ_BYTES && cn->state == C_ACTIVE && cn->reading) defer_all(c);
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                 */
/* ------------------------------------------------------------------------ */

mg_h1_t *mg_h1_new(uv_loop_t *loop)
{
    settings_init();
    mg_h1_t *c = calloc(1, sizeof(*c));
    char *rbuf = malloc(READ_BUF_SIZE);
    if (!c || !rbuf) {
        free(c);
        free(rbuf);
        return NULL;
    }
    c->loop = loop;
    c->rbuf = rbuf;
    c->idle_ms = DEFAULT_IDLE_MS;
    c->max_idle = DEFAULT_MAX_IDLE;
    uv_check_init(loop, &c->turn);
    c->turn.data = c;
    uv_check_start(&c->turn, on_turn_end);
    uv_unref((uv_handle_t *)&c->turn); /* it never keeps the loop alive */
    c->turn_open = 1;
    return c;
}

uint64_t mg_h1_deferrals(const mg_h1_t *c)
{
    return c->deferrals;
}

void mg_h1_set_keepalive(mg_h1_t *c, int idle_ms, size_t max_idle_per_host)
{
    c->idle_ms = idle_ms;
    c->max_idle = max_idle_per_host;
}

size_t mg_h1_active(const mg_h1_t *c)
{
    return c->n_active;
}

/* Free a closing client once no handle and no lookup refers to it. */
static void client_maybe_free(mg_h1_t *c)
{
    if (!c->closing || c->conns_open > 0 || c->n_resolving > 0 || c->turn_open) return;
    while (c->hosts) {
        host_t *h = c->hosts;
        c->hosts = h->next;
        free(h);
    }
    while (c->free_conns) {
        conn_t *cn = c->free_conns;
        list_remove(cn);
        free(cn->pend);
        free(cn);
    }
    free(c->rbuf);
    free(c);
}

static void on_turn_closed(uv_handle_t *h)
{
    mg_h1_t *c = h->data;
    c->turn_open = 0;
    client_maybe_free(c);
}

void mg_h1_close(mg_h1_t *c)
{
    if (c->closing) return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->turn, on_turn_closed);
    while (c->xfers) mg_h1_cancel(c->xfers);
    for (host_t *h = c->hosts; h; h = h->next) {
        while (h->idle) conn_close(h->idle);
        if (h->resolving) uv_cancel((uv_req_t *)&h->gai);
    }
    client_maybe_free(c);
}

static void xfer_init(mg_h1_xfer_t *x, mg_h1_t *c, host_t *h, const mg_xfer_opts_t *o,
                      const mg_xfer_cbs_t *cbs, void *ud)
{
    uint64_t now = uv_now(c->loop);
    x->c = c;
    x->host = h;
    x->cbs = *cbs;
    x->ud = ud;
    x->connect_ms = o->connect_timeout_ms;
    x->first_byte_ms = o->first_byte_timeout_ms;
    x->idle_ms = o->idle_timeout_ms;
    x->total_due = o->total_timeout_ms > 0 ? now + (uint64_t)o->total_timeout_ms : 0;
    x->activity_due = o->first_byte_timeout_ms > 0 ? now + (uint64_t)o->first_byte_timeout_ms : 0;
    x->next = c->xfers;
    if (c->xfers) c->xfers->prev = x;
    c->xfers = x;
    c->n_active++;
}

int mg_h1_start(mg_h1_t *c, const mg_xfer_opts_t *o, const mg_xfer_cbs_t *cbs, void *ud,
                mg_h1_xfer_t **out)
{
    const char *method = o->method ? o->method : "POST";
    url_t u;
    host_t *h = NULL;
    if (!c->closing && method_ok(method) && url_parse(o->url, &u) == 0) h = host_get(c, &u);
    mg_h1_xfer_t *x = NULL;
    if (h) x = xfer_alloc(h, method, &u, o->headers, o->extra_head, o->body, o->body_len);
    else free(o->body);
    curl_slist_free_all(o->headers);
    if (!x) return -1;
    xfer_init(x, c, h, o, cbs, ud);
    if (xfer_dispatch(x) != 0) {
        xfer_end(x, MG_XFER_ERROR, NULL, 0);
        return -1;
    }
    *out = x;
    return 0;
}

void mg_h1_cancel(mg_h1_xfer_t *x)
{
    if (x->ended) return;
    conn_t *cn = xfer_detach(x);
    if (cn) conn_close(cn);
    xfer_end(x, MG_XFER_ERROR, NULL, 0);
}

void mg_h1_resume(mg_h1_xfer_t *x)
{
    if (x->ended || !x->paused) return;
    conn_t *cn = x->cn;
    x->paused = 0;
    if (x->idle_ms > 0) x->activity_due = uv_now(x->c->loop) + (uint64_t)x->idle_ms;
    conn_rearm(cn);
    llhttp_resume(&cn->parser);
    x->busy++;
    /* even with nothing held, the parser may owe the end of the message */
    const char *held = cn->pend ? cn->pend + cn->pend_off : "";
    conn_feed(cn, held, cn->pend_len - cn->pend_off, 1);
    if (!x->ended && !x->paused && !cn->reading && conn_read_start(cn) != 0)
        xfer_fail(x, MG_XFER_ERROR, "cannot read from upstream");
    xfer_unbusy(x);
}

char *mg_h1_take_error_headers(mg_h1_xfer_t *x, size_t *len)
{
    return mg_headers_take(&x->errh, len);
}

const char *mg_h1_header(const mg_h1_xfer_t *x, const char *name)
{
    const char *v = NULL;
    if (strcasecmp(name, "retry-after") == 0) v = x->retry_after;
    else if (strcasecmp(name, "content-type") == 0) v = x->content_type;
    return v && v[0] ? v : NULL;
}
