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

/* The `billing:` section at node v of doc into *out (defaults first). 0, or -1 with
 * "FILE:LINE: reason" in err (file = the config's name). */
int mg_conf_billing_section(yaml_document_t *doc, yaml_node_t *v, const char *file,
                            mg_billing_conf_t *out, char *err, size_t errlen);

/* Free what the section owns (NULL fine). */
void mg_billing_conf_free(mg_billing_conf_t *b);

#endif
