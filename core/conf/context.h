/* context: the `context:` section of the config (edge PRD 4.1): how sessions are kept and
 * how a conversation is fitted into a model's window.
 *
 *   context:
 *     safety_margin_ratio: 0.08        # budget = window x (1 - ratio) - output reserve
 *     default_policy: summary_and_recent  # | recent_only | none (fail instead of trim)
 *     max_session_messages: 200        # a session keeps at most this many messages
 *     session_idle_ttl_minutes: 60     # idle sessions expire
 *     session_ttl_minutes: 1440        # every session expires this long after creation
 *     enable_prompt_persistence: false # true: session content is written to the store
 *     memory_budget_bytes: 67108864    # in-memory sessions' content at most (LRU out)
 *     busy: wait                       # a request on a busy session waits (within its queue
 *                                      # timeout, then 409 SESSION_BUSY); reject: 409 at once
 *     append_on_failure: none          # | user_turn: what a failed request leaves
 *     platform_rules: "..."            # optional system text put first in every session
 *     summarizer_model: local-chat     # a logical model that folds old turns into a summary
 *     summary_timeout_ms: 30000        # the summary call's total deadline
 *     summary_max_tokens: 512          # the summary's length at most
 *     summary_prompt: "..."            # the summariser's instructions (a default is built in)
 *     switch_to_larger_window: false   # true: what the policy cannot fit in the smallest
 *                                      # route's window goes to the routes with a larger one
 *
 * The values only; conf_section_context (conf/sections.h) reads them. */
#ifndef MG_CONF_CONTEXT_H
#define MG_CONF_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <yaml.h>

typedef struct mg_context_conf_s {
    double safety_margin_ratio;     /* 0..0.9, default 0.08 */
    char default_policy[24];        /* "summary_and_recent" | "recent_only" | "none" */
    int max_session_messages;       /* default 200 */
    int session_idle_ttl_minutes;   /* default 60 */
    int session_ttl_minutes;        /* default 1440 */
    bool enable_prompt_persistence; /* default false: content in memory only */
    long long memory_budget_bytes;  /* default 64 MiB */
    bool append_user_on_failure;    /* append_on_failure: user_turn */
    bool busy_reject;               /* busy: reject (409 at once) rather than wait (the default) */
    char *platform_rules;           /* owned, may be NULL */
    char *summarizer_model;         /* owned, may be NULL: no summaries (old turns are dropped) */
    int summary_timeout_ms;         /* default 30000 */
    int summary_max_tokens;         /* default 512 */
    char *summary_prompt;           /* owned, may be NULL: the built-in instructions */
    bool switch_to_larger_window;   /* PRD 3.3.4 step 6, default false */
} mg_context_conf_t;

/* The defaults above into c. */
void mg_context_conf_defaults(mg_context_conf_t *c);
/* The section's reader is conf_section_context (conf/sections.h). */
/* 1 when p names a context policy variant. */
int mg_context_policy_known(const char *p);
void mg_context_conf_clear(mg_context_conf_t *c);

#endif
