/* sdnotify: the service manager's readiness protocol (systemd's sd_notify), without libsystemd.
 *
 * When the process runs under a manager that set NOTIFY_SOCKET (a unit with Type=notify),
 * mg_sd_notify sends it one datagram such as "READY=1", "RELOADING=1" or "STOPPING=1";
 * without NOTIFY_SOCKET it does nothing. One non-blocking sendto on a local socket: safe on
 * the loop thread. */
#ifndef MG_SDNOTIFY_H
#define MG_SDNOTIFY_H

/* Send `state` (one or more "KEY=value" lines). Returns 1 when sent, 0 when no manager is
 * listening (NOTIFY_SOCKET unset), -1 on a send error (errno set). */
int mg_sd_notify(const char *state);

#endif
