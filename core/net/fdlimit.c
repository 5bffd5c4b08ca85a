/* fdlimit: raise the soft descriptor limit, count what is open, size the connection cap;
 * see fdlimit.h. */
#include "net/fdlimit.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "base/log.h"

size_t mg_fdlimit_fit(unsigned long long soft, int open_now, size_t reserved, size_t refusing)
{
    unsigned long long used = (unsigned long long)(open_now > 0 ? open_now : 0) +
                              MG_FDLIMIT_MARGIN + 2 * (unsigned long long)reserved + refusing;
    if (soft <= used + 2) return 1;
    unsigned long long n = (soft - used) / 2;
    return n > (size_t)-1 ? (size_t)-1 : (size_t)n;
}

/* Descriptors open now, or -1 when /proc is not there. */
static int open_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

size_t mg_fdlimit_connection_cap(size_t configured, size_t reserved, size_t refusing)
{
    struct rlimit rl;
    unsigned long long before = 0;
    int raise_err = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        before = rl.rlim_cur;
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max;
            rl.rlim_cur = want;
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) raise_err = errno;
            getrlimit(RLIMIT_NOFILE, &rl);
        }
    } else {
        rl.rlim_cur = rl.rlim_max = 1024; /* cannot happen on Linux; a cautious guess */
    }
    int open_now = open_count();
    size_t fit = mg_fdlimit_fit(rl.rlim_cur, open_now < 0 ? 64 : open_now, reserved, refusing);
    size_t cap = configured ? configured : fit;
    mg_logline_t l;
    mg_log_begin(&l, configured > fit ? MG_LOG_WARN : MG_LOG_INFO, "fd_limit");
    mg_log_int(&l, "soft_before", (int64_t)before);
    mg_log_int(&l, "soft", (int64_t)rl.rlim_cur);
    mg_log_int(&l, "hard", (int64_t)rl.rlim_max);
    if (raise_err) mg_log_str(&l, "raise_error", strerror(raise_err));
    mg_log_int(&l, "open", open_now);
    mg_log_int(&l, "max_connections", (int64_t)cap);
    mg_log_str(&l, "max_connections_from", configured ? "config" : "fd_limit");
    if (configured > fit) {
        /* honoured: the operator may know better (other limits, few upstream connections) */
        mg_log_int(&l, "fits", (int64_t)fit);
        mg_log_str(&l, "warning",
                   "server.max_connections is more than the descriptor limit "
                   "leaves room for: when descriptors run out, accepting "
                   "pauses and the reserve is not guaranteed");
    }
    mg_log_end(&l);
    return cap;
}
