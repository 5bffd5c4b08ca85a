/* context: the config's context section; see context.h. Its own small reader of scalar
 * values, so config.c only hands the node over. */
#include "conf/context.h"

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

int mg_context_policy_known(const char *p)
{
    return p &&
           (!strcmp(p, "summary_and_recent") || !strcmp(p, "recent_only") || !strcmp(p, "none"));
}

static int fail(const char *name, const yaml_node_t *n, char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "%s:%d: context%s", name, n ? (int)n->start_mark.line + 1 : 0, what);
    return -1;
}

static const char *text(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int read_int(const yaml_node_t *n, long long lo, long long hi, long long *out)
{
    const char *s = text(n);
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int read_bool(const yaml_node_t *n, bool *out)
{
    const char *s = text(n);
    if (s && !strcmp(s, "true")) *out = true;
    else if (s && !strcmp(s, "false")) *out = false;
    else return -1;
    return 0;
}

/* A text value (empty: none). 0 or -1. */
static int set_text(char **dst, const yaml_node_t *v)
{
    const char *s = text(v);
    if (!s) return -1;
    free(*dst);
    *dst = s[0] ? strdup(s) : NULL;
    return s[0] && !*dst ? -1 : 0;
}

/* One key of the section. 0, 1 for an unknown key, -1 for a bad value (err set). */
static int load_key(const char *key, const yaml_node_t *v, mg_context_conf_t *c)
{
    long long n = 0;
    if (!strcmp(key, "safety_margin_ratio")) {
        const char *s = text(v);
        char *end = NULL;
        double d = s ? strtod(s, &end) : -1;
        if (!s || !*s || *end || d < 0 || d > 0.9) return -1;
        c->safety_margin_ratio = d;
    } else if (!strcmp(key, "default_policy")) {
        if (!mg_context_policy_known(text(v))) return -1;
        snprintf(c->default_policy, sizeof(c->default_policy), "%s", text(v));
    } else if (!strcmp(key, "max_session_messages")) {
        if (read_int(v, 2, 100000, &n)) return -1;
        c->max_session_messages = (int)n;
    } else if (!strcmp(key, "session_idle_ttl_minutes")) {
        if (read_int(v, 1, 525600, &n)) return -1;
        c->session_idle_ttl_minutes = (int)n;
    } else if (!strcmp(key, "session_ttl_minutes")) {
        if (read_int(v, 1, 5256000, &n)) return -1;
        c->session_ttl_minutes = (int)n;
    } else if (!strcmp(key, "enable_prompt_persistence")) {
        if (read_bool(v, &c->enable_prompt_persistence)) return -1;
    } else if (!strcmp(key, "switch_to_larger_window")) {
        if (read_bool(v, &c->switch_to_larger_window)) return -1;
    } else if (!strcmp(key, "memory_budget_bytes")) {
        if (read_int(v, 4096, 1ll << 40, &c->memory_budget_bytes)) return -1;
    } else if (!strcmp(key, "append_on_failure")) {
        const char *s = text(v);
        if (!s || (strcmp(s, "none") && strcmp(s, "user_turn"))) return -1;
        c->append_user_on_failure = !strcmp(s, "user_turn");
    } else if (!strcmp(key, "busy")) {
        const char *s = text(v);
        if (!s || (strcmp(s, "wait") && strcmp(s, "reject"))) return -1;
        c->busy_reject = !strcmp(s, "reject");
    } else if (!strcmp(key, "platform_rules")) {
        return set_text(&c->platform_rules, v);
    } else if (!strcmp(key, "summarizer_model")) {
        return set_text(&c->summarizer_model, v);
    } else if (!strcmp(key, "summary_prompt")) {
        return set_text(&c->summary_prompt, v);
    } else if (!strcmp(key, "summary_timeout_ms")) {
        if (read_int(v, 100, 3600000, &n)) return -1;
        c->summary_timeout_ms = (int)n;
    } else if (!strcmp(key, "summary_max_tokens")) {
        if (read_int(v, 16, 100000, &n)) return -1;
        c->summary_max_tokens = (int)n;
    } else {
        return 1;
    }
    return 0;
}

int mg_context_conf_load(yaml_document_t *doc, yaml_node_t *v, const char *name,
                         mg_context_conf_t *c, char *err, size_t errlen)
{
    if (!v || (v->type == YAML_SCALAR_NODE && !v->data.scalar.length)) return 0;
    if (v->type != YAML_MAPPING_NODE) return fail(name, v, err, errlen, " must be a mapping");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *val = yaml_document_get_node(doc, p->value);
        const char *key = text(k);
        if (!key) return fail(name, k, err, errlen, ": keys must be plain names");
        int rc = load_key(key, val, c);
        char what[160];
        if (rc > 0) {
            snprintf(what, sizeof(what), ".%.60s is not a known key", key);
            return fail(name, k, err, errlen, what);
        }
        if (rc < 0) {
            snprintf(what, sizeof(what),
                     ".%.60s has an invalid value (see config/moongate.example.yaml)", key);
            return fail(name, val, err, errlen, what);
        }
    }
    return 0;
}
