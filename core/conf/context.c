/* context: the config's context section; see context.h. */
#include "conf/context.h"
#include "conf/sections.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mg_context_conf_defaults(mg_context_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->safety_margin_ratio = 0.08;
    snprintf(c->default_policy, sizeof(c->default_policy), "summary_and_recent");
    c->max_session_messages = 200;
    c->session_idle_ttl_minutes = 60;
    c->session_ttl_minutes = 1440;
    c->memory_budget_bytes = 64ll << 20;
    c->summary_timeout_ms = 30000;
    c->summary_max_tokens = 512;
}

void mg_context_conf_clear(mg_context_conf_t *c)
{
    free(c->platform_rules);
    free(c->summarizer_model);
    free(c->summary_prompt);
    c->platform_rules = c->summarizer_model = c->summary_prompt = NULL;
}

static const char *const policies[] = {"summary_and_recent", "recent_only", "none", NULL};
int mg_context_policy_known(const char *p)
{
    for (int i = 0; p && policies[i]; i++)
        if (!strcmp(p, policies[i])) return 1;
    return 0;
}

static const char *const on_failure[] = {"none", "user_turn", NULL};
static const char *const on_busy[] = {"wait", "reject", NULL};

int conf_section_context(conf_loader_t *l, yaml_node_t *v, int line)
{
    static const char *const keys[] = {"safety_margin_ratio",     "default_policy",
                                       "max_session_messages",    "session_idle_ttl_minutes",
                                       "session_ttl_minutes",     "enable_prompt_persistence",
                                       "switch_to_larger_window", "memory_budget_bytes",
                                       "append_on_failure",       "busy",
                                       "platform_rules",          "summarizer_model",
                                       "summary_prompt",          "summary_timeout_ms",
                                       "summary_max_tokens",      NULL};
    const char *P = "context";
    int m = conf_want_map(l, v, line, P, keys);
    if (m <= 0) return m;
    mg_context_conf_t *c = &l->cfg->context;
    int policy = -1, fail_mode = c->append_user_on_failure, busy = c->busy_reject;
    if (conf_opt_number(l, v, P, "safety_margin_ratio", true, 0.9, &c->safety_margin_ratio) < 0 ||
        conf_opt_choice(l, v, P, "default_policy", policies, &policy) < 0 ||
        conf_opt_int_field(l, v, P, "max_session_messages", 2, 100000, &c->max_session_messages) <
            0 ||
        conf_opt_int_field(l, v, P, "session_idle_ttl_minutes", 1, 525600,
                           &c->session_idle_ttl_minutes) < 0 ||
        conf_opt_int_field(l, v, P, "session_ttl_minutes", 1, 5256000, &c->session_ttl_minutes) <
            0 ||
        conf_opt_bool(l, v, P, "enable_prompt_persistence", &c->enable_prompt_persistence) < 0 ||
        conf_opt_bool(l, v, P, "switch_to_larger_window", &c->switch_to_larger_window) < 0 ||
        conf_opt_int(l, v, P, "memory_budget_bytes", 4096, 1ll << 40, &c->memory_budget_bytes) <
            0 ||
        conf_opt_choice(l, v, P, "append_on_failure", on_failure, &fail_mode) < 0 ||
        conf_opt_choice(l, v, P, "busy", on_busy, &busy) < 0 ||
        conf_opt_text(l, v, P, "platform_rules", &c->platform_rules) < 0 ||
        conf_opt_text(l, v, P, "summarizer_model", &c->summarizer_model) < 0 ||
        conf_opt_text(l, v, P, "summary_prompt", &c->summary_prompt) < 0 ||
        conf_opt_int_field(l, v, P, "summary_timeout_ms", 100, 3600000, &c->summary_timeout_ms) <
            0 ||
        conf_opt_int_field(l, v, P, "summary_max_tokens", 16, 100000, &c->summary_max_tokens) < 0)
        return -1;
    if (policy >= 0) snprintf(c->default_policy, sizeof c->default_policy, "%s", policies[policy]);
    c->append_user_on_failure = fail_mode == 1;
    c->busy_reject = busy == 1;
    return 0;
}
