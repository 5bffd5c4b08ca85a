/* cooldowns: GET /api/v2/cooldowns/history, the ADR's cooldown event timeline (9.3) from
 * the cooldown_events table that route/persist.c appends to, newest first, on the admin
 * worker. (GET /api/v2/cooldowns, the live list, and DELETE /api/v2/cooldowns/{id}, which
 * clears one, change or read loop-owned state and are answered in front.c.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/req.h"

#define EVENT_COLUMNS                                                                              \
    "id, provider_id, consecutive_count, cooldown_seconds, response_summary, started_at, ended_at"

static cJSON *event_json(int ncols, const char *const *c)
{
    if (ncols < 7) return NULL;
    cJSON *o = cJSON_CreateObject();
    adm_add_str(o, "id", c[0]);
    adm_add_str(o, "provider_id", c[1]);
    adm_add_int(o, "consecutive_count", c[2]);
    adm_add_int(o, "cooldown_seconds", c[3]);
    adm_add_str(o, "response_summary", c[4]);
    adm_add_str(o, "started_at", c[5]); /* UTC, "YYYY-MM-DD HH:MM:SS" (the ADR's column) */
    adm_add_str(o, "ended_at", c[6]);
    return o;
}

static void history(admin_t *a)
{
    char limit[24] = "100", provider[160] = "";
    if (adm_query_id(a, "limit", limit, sizeof(limit)) < 0) return;
    if (strtoll(limit, NULL, 10) > 1000) snprintf(limit, sizeof(limit), "1000");
    int by_provider = adm_query_param(a, "provider_id", provider, sizeof(provider));
    const char *p[2] = {limit, provider};
    adm_get_rows(a, NULL,
                 by_provider ? "SELECT " EVENT_COLUMNS
                               " FROM cooldown_events WHERE provider_id = ?2"
                               " ORDER BY started_at DESC, rowid DESC LIMIT ?1"
                             : "SELECT " EVENT_COLUMNS " FROM cooldown_events"
                               " ORDER BY started_at DESC, rowid DESC LIMIT ?1",
                 NULL, by_provider ? 2 : 1, p, event_json, "cooldown event");
}

int adm_cooldowns_route(admin_t *a, const char *coll, const char *id, const char *verb)
{
    if (strcmp(coll, "cooldowns") != 0 || !id || strcmp(id, "history") != 0 || verb) return 0;
    a->action = "cooldowns.history";
    if (a->method != HTTP_GET) adm_set_error(a, 405, "METHOD_NOT_ALLOWED", "use GET");
    else history(a);
    return 1;
}
