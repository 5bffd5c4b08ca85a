/* billing: the `billing:` config section; see billing.h. Parsed apart from config.c (which
 * calls it with the section's node), with its own small ${NAME} expansion: the secret must
 * never be written in the file in clear. */
#include "conf/billing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *file, const yaml_node_t *n, char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s:%d: billing.%s", file, n ? (int)n->start_mark.line + 1 : 0, msg);
    return -1;
}

/* s with every ${NAME} replaced by the environment's value (malloc'd), or NULL when a
 * reference is malformed or names an unset variable. */
static char *expand(const char *s)
{
    size_t cap = strlen(s) + 1, len = 0;
    char *out = malloc(cap);
    while (out && *s) {
        const char *piece = s, *end = NULL;
        size_t n = 1;
        char name[128];
        if (s[0] == '$' && s[1] == '{' && (end = strchr(s + 2, '}')) &&
            (size_t)(end - s - 2) < sizeof(name) && end > s + 2) {
            snprintf(name, sizeof(name), "%.*s", (int)(end - s - 2), s + 2);
            piece = getenv(name);
            if (!piece) {
                free(out);
                return NULL;
            }
            n = strlen(piece);
            s = end + 1;
        } else if (s[0] == '$' && s[1] == '{') {
            free(out);
            return NULL;
        } else {
            s++;
        }
        if (len + n + 1 > cap) {
            char *grown = realloc(out, (cap = (len + n + 1) * 2));
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        memcpy(out + len, piece, n);
        len += n;
    }
    if (out) out[len] = '\0';
    return out;
}

static int scalar(const yaml_node_t *n, const char **text)
{
    if (!n || n->type != YAML_SCALAR_NODE) return -1;
    *text = (const char *)n->data.scalar.value;
    return 0;
}

int mg_conf_billing_section(yaml_document_t *doc, yaml_node_t *v, const char *file,
                            mg_billing_conf_t *out, char *err, size_t errlen)
{
    mg_billing_conf_free(out);
    out->webhook_tolerance_s = MG_BILLING_TOLERANCE_DEFAULT_S;
    if (!v || (v->type == YAML_SCALAR_NODE && !*v->data.scalar.value)) return 0;
    if (v->type != YAML_MAPPING_NODE) return fail(file, v, err, errlen, "must be a mapping");
    for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key);
        yaml_node_t *val = yaml_document_get_node(doc, p->value);
        const char *key, *text;
        if (scalar(k, &key) != 0) return fail(file, k, err, errlen, "keys must be scalars");
        if (scalar(val, &text) != 0) return fail(file, val, err, errlen, "values must be scalars");
        if (strcmp(key, "webhook_secret") == 0) {
            char *s = expand(text);
            if (!s)
                return fail(file, val, err, errlen,
                            "webhook_secret: an unset or malformed ${NAME} reference");
            free(out->webhook_secret);
            out->webhook_secret = *s ? s : NULL;
            if (!*s) free(s);
        } else if (strcmp(key, "webhook_tolerance_s") == 0) {
            char *endp;
            long n = strtol(text, &endp, 10);
            if (*endp || endp == text || n < 1 || n > 86400)
                return fail(file, val, err, errlen, "webhook_tolerance_s: an integer 1..86400");
            out->webhook_tolerance_s = (int)n;
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg), "%.100s: unknown key (webhook_secret, webhook_tolerance_s)",
                     key);
            return fail(file, k, err, errlen, msg);
        }
    }
    return 0;
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
