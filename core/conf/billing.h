/* billing: the config of the prepaid ledger's inbound side (`billing:`).
 *
 *   billing:
 *     webhook_secret: ${MOONGATE_TOPUP_SECRET}  # HMAC-SHA256 key of POST /api/v2/webhooks/topup;
 *                                               # absent or empty: the webhook answers 503
 *     webhook_tolerance_s: 300                  # a signature's timestamp may be this far from
 *                                               # now (the replay window), default 300
 *
 * A tenant's billing mode, spend limits and require_upstream_usage are the tenant's own
 * (PUT /api/v2/tenants/{id}/billing), not config. */
#ifndef MG_CONF_BILLING_H
#define MG_CONF_BILLING_H

#include <stddef.h>
#include <yaml.h>

typedef struct mg_billing_conf_s {
    char *webhook_secret;    /* owned, ${NAME} expanded; NULL: no webhook */
    int webhook_tolerance_s; /* default 300 */
} mg_billing_conf_t;

#define MG_BILLING_TOLERANCE_DEFAULT_S 300

/* The section's reader is conf_section_billing (conf/sections.h). */

/* Free what the section owns (NULL fine). */
void mg_billing_conf_free(mg_billing_conf_t *b);

#endif
