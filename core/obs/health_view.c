/* health_view: a provider's passive health as JSON members; see health_view.h. */
#include "obs/health_view.h"

void mg_health_view(cJSON *o, const mg_health_t *h, uint64_t now_ms)
{
    cJSON_AddStringToObject(o, "health", mg_health_state_name(h->state));
    if (h->state != MG_HEALTH_DOWN) return;
    cJSON_AddStringToObject(o, "down_reason", h->down_reason ? h->down_reason : "unknown");
    cJSON_AddNumberToObject(o, "down_since_ms",
                            now_ms > h->changed_at_ms ? (double)(now_ms - h->changed_at_ms) : 0);
    int64_t next = mg_health_trial_in_ms(h, now_ms);
    if (next < 0) cJSON_AddNullToObject(o, "next_trial_in_ms");
    else cJSON_AddNumberToObject(o, "next_trial_in_ms", (double)next);
}
