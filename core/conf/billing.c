/* billing: the `billing:` config section; see billing.h. The secret comes through ${NAME}
 * (conf_expand), so it need never be written in the file in clear. */
#include "conf/billing.h"
#include "conf/sections.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int conf_section_billing(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"webhook_secret", "webhook_tolerance_s", NULL};
    mg_billing_conf_t *b = &l->cfg->billing;
    int m = conf_want_map(l, v, line, "billing", keys);
    if (m <= 0) return m;
    return conf_opt_text(l, v, "billing", "webhook_secret", &b->webhook_secret) < 0 ||
                   conf_opt_int_field(l, v, "billing", "webhook_tolerance_s", 1, 86400,
                                      &b->webhook_tolerance_s) < 0
               ? -1
               : 0;
}

void mg_billing_conf_free(mg_billing_conf_t *b)
{
    if (!b) return;
    if (b->webhook_secret) {
        memset(b->webhook_secret, 0, strlen(b->webhook_secret));
        free(b->webhook_secret);
    }
    b->webhook_secret = NULL;
}
