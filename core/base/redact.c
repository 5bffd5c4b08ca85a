/* redact: secrets masked in free text (see redact.h). One pass over the text; at each word
 * start the rules are tried in order and the first that matches masks its span. */
#include "base/redact.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/json.h"
#include "base/secret.h"

static const char *const prefixes[] = {
    "mgt-",   "mg-",   "sk-",   "nvapi-", "hf_",  "ghp_", "gho_", "ghs_", "ghu_", "github_pat_",
    "glpat-", "xoxb-", "xoxp-", "xoxa-",  "AIza", "AKIA", "ASIA", "eyJ",  "v1:",
};

/* the tail of a name that says its value is a secret (compared in lower case) */
static const char *const secret_names[] = {
    "api_key", "api-key", "apikey",     "secret",      "password",
    "passwd",  "token",   "access_key", "private_key", "authorization",
};

static int tok(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '+' || c == '/' || c == '=';
}

static int ident(unsigned char c)
{
    return isalnum(c) || c == '_' || c == '-';
}

static size_t run(const char *s, size_t n, size_t i, int (*in)(unsigned char))
{
    size_t j = i;
    while (j < n && in((unsigned char)s[j])) j++;
    return j - i;
}

/* The masked form of s[0..n) appended to out (mg_secret_mask shows at most the first six
 * and the last four characters; a long secret is given to it as its first and last twelve). */
static int put_mask(mg_buf_t *out, const char *s, size_t n)
{
    char tmp[25], m[MG_SECRET_MASK_MAX];
    if (n > 24) {
        memcpy(tmp, s, 12);
        memcpy(tmp + 12, s + n - 12, 12);
        n = 24;
    } else {
        memcpy(tmp, s, n);
    }
    tmp[n] = '\0';
    mg_secret_mask(tmp, m);
    return mg_buf_append_str(out, m);
}

/* A known prefix and at least 8 token characters after it: the length of the token, or 0. */
static size_t prefixed(const char *s, size_t n, size_t i)
{
    for (size_t k = 0; k < sizeof(prefixes) / sizeof(prefixes[0]); k++) {
        size_t pl = strlen(prefixes[k]);
        if (n - i < pl || memcmp(s + i, prefixes[k], pl) != 0) continue;
        size_t r = run(s, n, i + pl, tok);
        if (r >= 8) return pl + r;
    }
    return 0;
}

/* "Bearer " / "Basic " and a credential of at least 8 characters: where the credential
 * starts (*at) and its length, or 0. */
static size_t scheme(const char *s, size_t n, size_t i, size_t *at)
{
    static const char *const schemes[] = {"bearer", "basic"};
    for (int k = 0; k < 2; k++) {
        size_t sl = strlen(schemes[k]);
        if (n - i <= sl || strncasecmp(s + i, schemes[k], sl) != 0 || s[i + sl] != ' ') continue;
        size_t j = i + sl;
        while (j < n && s[j] == ' ') j++;
        size_t r = run(s, n, j, tok);
        if (r >= 8) {
            *at = j;
            return r;
        }
    }
    return 0;
}

static int secret_name(const char *s, size_t len)
{
    for (size_t k = 0; k < sizeof(secret_names) / sizeof(secret_names[0]); k++) {
        size_t kl = strlen(secret_names[k]);
        if (len >= kl && strncasecmp(s + len - kl, secret_names[k], kl) == 0) return 1;
    }
    return 0;
}

static int value_end(unsigned char c)
{
    return c <= ' ' || c == '"' || c == '\'' || c == '\\' || c == ',' || c == ';' || c == '&' ||
           c == '}' || c == ')';
}

/* name [quote] [blanks] (: or =) [blanks] [\] [quote] value, the name ending in a secret
 * name and the value at least 4 characters: where the value starts (*at) and its length. */
static size_t assignment(const char *s, size_t n, size_t i, size_t *at)
{
    size_t id = run(s, n, i, ident);
    if (!id || !secret_name(s + i, id)) return 0;
    size_t j = i + id;
    if (j < n && s[j] == '\\') j++;
    if (j < n && (s[j] == '"' || s[j] == '\'')) j++;
    while (j < n && s[j] == ' ') j++;
    if (j >= n || (s[j] != ':' && s[j] != '=')) return 0;
    j++;
    while (j < n && s[j] == ' ') j++;
    if (j < n && s[j] == '\\') j++;
    if (j < n && (s[j] == '"' || s[j] == '\'')) j++;
    size_t cred = scheme(s, n, j, at); /* "Authorization: Bearer ...": the credential */
    if (cred) return cred;
    size_t v = j;
    while (v < n && !value_end((unsigned char)s[v])) v++;
    if (v - j < 4) return 0;
    *at = j;
    return v - j;
}

/* 32 or more token characters with letters and digits, no '.' and no "//" (a domain or a
 * URL is not a secret): the run's length, or 0. */
static size_t opaque(const char *s, size_t n, size_t i)
{
    size_t r = run(s, n, i, tok);
    if (r < 32) return 0;
    int alpha = 0, digit = 0;
    for (size_t k = i; k < i + r; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c == '.' || (c == '/' && k + 1 < i + r && s[k + 1] == '/')) return 0;
        alpha |= isalpha(c) != 0;
        digit |= isdigit(c) != 0;
    }
    return alpha && digit ? r : 0;
}

char *mg_redact(const char *s, size_t n, size_t *out_len, int *masked)
{
    mg_buf_t out = {0};
    int count = 0, err = mg_buf_reserve(&out, n + 1);
    size_t i = 0, plain = 0; /* s[plain..i) is copied as it is */
    while (!err && i < n) {
        if (i > 0 && tok((unsigned char)s[i - 1])) {
            i++;
            continue;
        }
        size_t at = i, len = prefixed(s, n, i);
        if (!len) len = scheme(s, n, i, &at);
        if (!len) len = assignment(s, n, i, &at);
        if (!len) len = opaque(s, n, i);
        if (!len) {
            i++;
            continue;
        }
        err = mg_buf_append(&out, s + plain, at - plain) || put_mask(&out, s + at, len);
        count++;
        i = plain = at + len;
    }
    if (!err) err = mg_buf_append(&out, s + plain, n - plain); /* NUL-terminates, even at 0 */
    if (err) {
        mg_buf_free(&out);
        return NULL;
    }
    if (out_len) *out_len = out.len;
    if (masked) *masked = count;
    return out.data;
}
