/* logfile: see logfile.h. */
#include "base/logfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

#define LOGFILE_FLAGS (O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC)
#define LOGFILE_MODE 0640

int mg_logfile_open(const char *path, char *err, size_t errlen)
{
    int fd = open(path, LOGFILE_FLAGS, LOGFILE_MODE);
    if (fd < 0) {
        snprintf(err, errlen, "log.file: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = mg_log_redirect(fd);
    if (rc != 0) snprintf(err, errlen, "log.file: cannot write to %s: %s", path, strerror(errno));
    close(fd);
    return rc;
}

/* The one reopen in flight (log output is process-wide, so is its reopening). */
typedef struct {
    uv_fs_t req;
    char *path;
} reopen_t;

static int g_reopening;

static void on_opened(uv_fs_t *req)
{
    reopen_t *r = req->data;
    int fd = (int)req->result;
    if (fd < 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "log.file: cannot reopen %s: %s; still writing the old one",
                   r->path, uv_strerror(fd));
    } else {
        if (mg_log_redirect(fd) == 0)
            mg_log_msg(MG_LOG_INFO, NULL, "log.file reopened: %s", r->path);
        close(fd); /* a file's descriptor: closing it does not wait for the disk */
    }
    uv_fs_req_cleanup(req);
    free(r->path);
    free(r);
    g_reopening = 0;
}

void mg_logfile_reopen(uv_loop_t *loop, const char *path)
{
    if (g_reopening) return;
    reopen_t *r = calloc(1, sizeof(*r));
    if (!r || !(r->path = strdup(path))) {
        free(r);
        mg_log_msg(MG_LOG_ERROR, NULL, "log.file: cannot reopen: out of memory");
        return;
    }
    r->req.data = r;
    int rc = uv_fs_open(loop, &r->req, r->path, LOGFILE_FLAGS, LOGFILE_MODE, on_opened);
    if (rc != 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "log.file: cannot reopen %s: %s", path, uv_strerror(rc));
        free(r->path);
        free(r);
        return;
    }
    g_reopening = 1;
}
