/* protocols: the `protocols:` section of the config (issue 20): what the gateway does on the
 * client's wire beside the answer itself.
 *
 *   protocols:
 *     ping_interval_ms: 15000          # a stream whose upstream is silent this long gets a
 *                                      # keep-alive in the client's protocol (OpenAI and
 *                                      # Responses: an SSE comment ": ping"; Anthropic
 *                                      # Messages: event: ping); again every interval; 0 = off
 *     responses_retention_seconds: 2592000   # stored Responses (store: true) are kept this
 *                                      # long (60 s .. 10 years; default 30 days); a reload
 *                                      # applies to Responses stored after it
 *     models_refresh_seconds: 300      # the model lists of providers with a model_prefix
 *                                      # (GET /v1/models) are fetched again this often, in
 *                                      # the background (0 = never: GET /v1/models lists
 *                                      # the logical models only; up to 86400)
 *     forward_headers:                 # client headers handed to a translating adapter
 *       anthropic: [anthropic-version, anthropic-beta]   # by adapter name (the default);
 *                                      # a name ending in "*" is a prefix (anthropic-*)
 *
 * The values only; conf_section_protocols (conf/sections.h) reads them. */
#ifndef MG_CONF_PROTOCOLS_H
#define MG_CONF_PROTOCOLS_H

#include <stddef.h>
#include <yaml.h>

typedef struct mg_header_allow_s {
    char *adapter; /* owned */
    char **names;  /* owned: lower-case header names; "x-*" is a prefix */
    size_t n_names;
} mg_header_allow_t;

typedef struct mg_protocols_conf_s {
    int ping_interval_ms;      /* default 15000; 0 = no pings */
    int responses_retention_s; /* default 30 days (MG_RESP_RETENTION_DEFAULT_S) */
    int models_refresh_s;      /* default 300: upstream model lists kept this long; 0 = off */
    mg_header_allow_t *allow;  /* owned: one per adapter named; default anthropic's two */
    size_t n_allow;
} mg_protocols_conf_t;

/* The defaults above into c (-1 when out of memory). */
int mg_protocols_conf_defaults(mg_protocols_conf_t *c);
/* The section's reader is conf_section_protocols (conf/sections.h). */
/* The allowlist of an adapter, or NULL: none of the client's headers go to it. */
const mg_header_allow_t *mg_protocols_allow(const mg_protocols_conf_t *c, const char *adapter);
/* 1 when the header name (any case) is on the list. */
int mg_header_allowed(const mg_header_allow_t *a, const char *name);
void mg_protocols_conf_clear(mg_protocols_conf_t *c);

#endif
