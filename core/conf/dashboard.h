/* dashboard (conf): the `dashboard:` section of the config file, its defaults and its
 * validation. The WebUI it configures is served by api/dashboard.c.
 *
 *   dashboard:
 *     enabled: true             # GET / redirects to /api/dashboard; false: both answer 404
 *     dir: /usr/share/moongate/webui  # where index.html is; default:
 * <exe>/../share/moongate/webui, # else the source tree's webui/ (read once at start)
 *     session_ttl_s: 28800      # a sign-in lasts this long (60..604800)
 *     max_sessions: 64          # signed-in sessions at once (read at start); past them the one
 *                               # closest to its expiry ends (1..4096)
 *     max_streams: 8            # /api/dashboard/stream clients at once (1..256)
 *     stream_interval_ms: 1000  # one snapshot per client this often at most (250..60000)
 *     secure_cookie: false      # add Secure to the session cookie (behind a TLS proxy)
 *
 * Values may use ${NAME} like the rest of the file. */
#ifndef MG_CONF_DASHBOARD_H
#define MG_CONF_DASHBOARD_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

typedef struct mg_dashboard_conf_s {
    bool enabled;
    char dir[512]; /* "" = looked up (api/webui.h) */
    int session_ttl_s;
    int max_sessions;
    int max_streams;
    int stream_interval_ms;
    bool secure_cookie;
} mg_dashboard_conf_t;

void mg_dashboard_conf_defaults(mg_dashboard_conf_t *c);

/* The section's reader is conf_section_dashboard (conf/sections.h). */

#endif
