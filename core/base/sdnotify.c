/* sdnotify: see sdnotify.h. */
#include "base/sdnotify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Fill *sa from NOTIFY_SOCKET: a path, or "@name" for the abstract namespace. Returns the
 * address length, 0 when unset, -1 when unusable. */
static socklen_t notify_address(struct sockaddr_un *sa)
{
    const char *p = getenv("NOTIFY_SOCKET");
    if (!p || !*p) return 0;
    size_t n = strlen(p);
    if ((p[0] != '/' && p[0] != '@') || n >= sizeof(sa->sun_path)) return (socklen_t)-1;
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, p, n);
    if (p[0] == '@') sa->sun_path[0] = '\0'; /* abstract: no terminating NUL counted */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (p[0] == '/'));
}

int mg_sd_notify(const char *state)
{
    struct sockaddr_un sa;
    socklen_t len = notify_address(&sa);
    if (len == 0) return 0;
    if (len == (socklen_t)-1) {
        errno = EINVAL;
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, len);
    int saved = errno;
    close(fd);
    errno = saved;
    return w < 0 ? -1 : 1;
}
