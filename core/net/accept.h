/* accept: a listening TCP socket on the loop, and what a listener counts.
 *
 * The acceptor binds and listens on "host:port", polls the socket and calls accept(2)
 * itself, a batch per wake-up, handing each new socket to its owner. When accept fails
 * (out of file descriptors: EMFILE, ENFILE; or anything else) the failure is counted,
 * logged at most once per REPORT_MS with the number since the last line, and accepting
 * pauses for ACCEPT_PAUSE_MS instead of spinning: the kernel's backlog holds the waiting
 * clients meanwhile. (libuv's own accept path hides EMFILE from its caller: it closes the
 * waiting connections with a reserved descriptor, so nothing could be counted or said.)
 * The owner reports the connections it refuses here too, for the same rate-limited log. */
#ifndef MG_ACCEPT_H
#define MG_ACCEPT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Why a request was answered 408 (or its connection closed) before it was complete. */
typedef enum {
    MG_READ_TIMEOUT_HEADERS = 0, /* header_read_ms passed before the head was complete */
    MG_READ_TIMEOUT_REQUEST,     /* request_read_ms passed before the request was complete */
    MG_READ_TIMEOUT_BODY_RATE,   /* the body came slower than min_body_bytes_per_s */
    MG_READ_TIMEOUT_COUNT
} mg_read_timeout_t;

typedef enum {
    MG_ACCEPT_EMFILE = 0,
    MG_ACCEPT_ENFILE,
    MG_ACCEPT_OTHER,
    MG_ACCEPT_ERR_COUNT
} mg_accept_err_t;

/* What a listener counts: kept by the owner (the metrics), written by the listener. */
typedef struct mg_conn_stats_s {
    uint64_t open;                                 /* gauge: connections open now */
    uint64_t max_connections;                      /* gauge: the cap in force (0: none) */
    uint64_t refused;                              /* connections refused past the cap */
    uint64_t accept_errors[MG_ACCEPT_ERR_COUNT];   /* accept(2) failures, each a pause */
    uint64_t read_timeouts[MG_READ_TIMEOUT_COUNT]; /* requests not read in time */
    uint64_t write_timeouts;                       /* connections closed by write_timeout_ms */
} mg_conn_stats_t;

/* A new connection's socket (non-blocking, close-on-exec): the callee owns it. */
typedef void (*mg_accept_fn)(void *ud, int fd);

typedef struct mg_acceptor_s {
    uv_poll_t poll;
    uv_timer_t resume;      /* ends a pause after an accept failure */
    uv_timer_t report;      /* the end of a report window */
    int fd;                 /* the listening socket, -1 when closed */
    int open;               /* the handles above are initialized and not closed */
    const char *name;       /* static: the listener's name in log lines */
    mg_conn_stats_t *stats; /* borrowed, may be NULL */
    mg_accept_fn fn;
    void *ud;
    uint64_t refused_unlogged, errors_unlogged; /* since the last report line */
    int last_errno;
    size_t max_connections; /* shown in the refusal line */
    char bound[72];         /* "host:port" actually bound */
} mg_acceptor_t;

/* Bind and listen on "host:port" (port 0: any; "[v6]:port"; "*" or "": every address) and
 * start accepting: fn(ud, fd) for each connection. Returns 0 or a negative libuv error
 * (then nothing is open). */
int mg_acceptor_open(mg_acceptor_t *a, uv_loop_t *loop, const char *addr, const char *name,
                     mg_conn_stats_t *stats, mg_accept_fn fn, void *ud);
/* Stop accepting and close the socket (its handles close on the next loop turn; the
 * struct must stay valid until then). A report still pending is logged now. Idempotent. */
void mg_acceptor_close(mg_acceptor_t *a);
/* The owner refused a connection (past its cap): counted and reported with the others. */
void mg_acceptor_refused(mg_acceptor_t *a);

#endif
