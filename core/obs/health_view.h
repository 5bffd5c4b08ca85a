/* health_view: what /status and the admin API show of a provider's passive health: its
 * state, and while it is down the rule that took it down and when its next trial request
 * goes (route/health.h), so an operator sees why a provider gets no traffic and when it will
 * be tried again. */
#ifndef MG_HEALTH_VIEW_H
#define MG_HEALTH_VIEW_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "route/health.h"

/* Add "health" and, while down, "down_reason", "down_since_ms" (how long ago, ms) and
 * "next_trial_in_ms" (null: no trials, health.retry_down_ms 0) to o. */
void mg_health_view(cJSON *o, const mg_health_t *h, uint64_t now_ms);

#endif
