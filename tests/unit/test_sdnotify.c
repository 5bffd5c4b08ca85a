/* sdnotify: the datagram reaches a socket named by NOTIFY_SOCKET (a path or an abstract
 * name); without one nothing is sent. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/sdnotify.h"
#include "mgtest.h"

static int bound_socket(const char *name, int abstract)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    memcpy(sa.sun_path + (abstract ? 1 : 0), name, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0) {
        perror("bind");
        return -1;
    }
    return fd;
}

static void expect_datagram(int fd, const char *want)
{
    char buf[128] = {0};
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
    CHECK(n == (ssize_t)strlen(want));
    CHECK_STR(buf, want);
}

static void test_path_socket(void)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/mg-notify-%d", (int)getpid());
    unlink(path);
    int fd = bound_socket(path, 0);
    CHECK(fd >= 0);
    setenv("NOTIFY_SOCKET", path, 1);
    CHECK_EQ_INT(mg_sd_notify("READY=1"), 1);
    expect_datagram(fd, "READY=1");
    CHECK_EQ_INT(mg_sd_notify("STOPPING=1"), 1);
    expect_datagram(fd, "STOPPING=1");
    close(fd);
    unlink(path);
}

static void test_abstract_socket(void)
{
    char name[64], env[66];
    snprintf(name, sizeof(name), "mg-notify-abstract-%d", (int)getpid());
    int fd = bound_socket(name, 1);
    CHECK(fd >= 0);
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    CHECK_EQ_INT(mg_sd_notify("RELOADING=1"), 1);
    expect_datagram(fd, "RELOADING=1");
    close(fd);
}

static void test_no_manager(void)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK_EQ_INT(mg_sd_notify("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "relative/path", 1); /* neither a path nor @name */
    CHECK_EQ_INT(mg_sd_notify("READY=1"), -1);
    setenv("NOTIFY_SOCKET", "/tmp/mg-notify-nobody-listens", 1);
    CHECK_EQ_INT(mg_sd_notify("READY=1"), -1);
    unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
    MG_RUN(test_path_socket);
    MG_RUN(test_abstract_socket);
    MG_RUN(test_no_manager);
    return mg_test_summary();
}
