/* dashboard (conf): the `dashboard:` section; see dashboard.h. */
#include "conf/dashboard.h"
#include "conf/sections.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_dashboard_conf_defaults(mg_dashboard_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->enabled = true;
    c->session_ttl_s = 8 * 3600;
    c->max_sessions = 64;
    c->max_streams = 8;
    c->stream_interval_ms = 1000;
}

int conf_section_dashboard(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"enabled",       "dir",         "session_ttl_s",
                                       "max_sessions",  "max_streams", "stream_interval_ms",
                                       "secure_cookie", NULL};
    const char *P = "dashboard";
    int m = conf_want_map(l, v, line, P, keys);
    if (m <= 0) return m;
    mg_dashboard_conf_t *c = &l->cfg->dashboard;
    char *dir = NULL;
    if (conf_opt_bool(l, v, P, "enabled", &c->enabled) < 0 ||
        conf_opt_bool(l, v, P, "secure_cookie", &c->secure_cookie) < 0 ||
        conf_opt_int_field(l, v, P, "session_ttl_s", 60, 604800, &c->session_ttl_s) < 0 ||
        conf_opt_int_field(l, v, P, "max_sessions", 1, 4096, &c->max_sessions) < 0 ||
        conf_opt_int_field(l, v, P, "max_streams", 1, 256, &c->max_streams) < 0 ||
        conf_opt_int_field(l, v, P, "stream_interval_ms", 250, 60000, &c->stream_interval_ms) < 0 ||
        conf_opt_string(l, v, P, "dir", &dir) < 0)
        return -1;
    int fits = !dir || strlen(dir) < sizeof c->dir;
    if (dir && fits) snprintf(c->dir, sizeof c->dir, "%s", dir);
    free(dir);
    return fits ? 0 : conf_fail(l, line, "dashboard.dir must be a directory path (1..511 bytes)");
}
