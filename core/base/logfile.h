/* logfile: the log written to a file (log.file) and reopened on request (SIGUSR1), so that
 * logrotate can move the file away and the gateway carries on in a new one.
 *
 * The log itself (base/log.h) always writes to standard output; a log file takes the place
 * of standard output (mg_log_redirect), so lines already buffered and lines written by other
 * threads end up whole in one file or the other. */
#ifndef MG_LOGFILE_H
#define MG_LOGFILE_H

#include <stddef.h>
#include <uv.h>

/* At start-up, before the loop runs: open `path` for appending (created 0640 when missing)
 * and send the log there. Returns 0, or -1 with the reason in err (the log is unchanged). */
int mg_logfile_open(const char *path, char *err, size_t errlen);

/* On the loop: open `path` again off the loop thread (libuv's pool) and move the log to it
 * when it is open; a failure keeps the old file and is logged. One reopen at a time (a
 * request while one runs is served by it). path is copied. */
void mg_logfile_reopen(uv_loop_t *loop, const char *path);

#endif
