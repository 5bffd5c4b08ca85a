/* fdlimit: the process's file descriptor budget, and the client connections that fit in it.
 *
 * Every client connection is a descriptor, and one being proxied needs a second one for its
 * upstream. Under systemd's default soft RLIMIT_NOFILE (1,024) a thousand slow clients used
 * to take them all, and nothing else could be accepted or opened. At start the soft limit is
 * raised to the hard one, and the connection cap is derived from what is left. */
#ifndef MG_FDLIMIT_H
#define MG_FDLIMIT_H

#include <stddef.h>

/* Descriptors kept out of the connection budget for everything else: the store, the log,
 * the thread pool, resolver threads, idle pooled upstream connections. */
#define MG_FDLIMIT_MARGIN 32

/* How many client connections fit under a soft limit of `soft` with `open_now` descriptors
 * in use: half of what is left after the margin, the reserve (`reserved` on the main
 * listener and as many on the metrics listener) and `refusing` answers in flight (each
 * connection may pair with an upstream one). At least 1. */
size_t mg_fdlimit_fit(unsigned long long soft, int open_now, size_t reserved, size_t refusing);

/* Raise the soft RLIMIT_NOFILE to the hard limit, count the descriptors open now, and
 * return the connection cap: `configured` when it is not 0 (a warning is logged when it
 * is more than fits), else what fits (mg_fdlimit_fit). Logs one line with the limits and
 * the cap. Call at start, before the loop runs (it reads /proc/self/fd). */
size_t mg_fdlimit_connection_cap(size_t configured, size_t reserved, size_t refusing);

#endif
