/* redact: secrets masked in free text (a prompt or an answer logged in full mode).
 *
 * What counts as a secret, wherever it stands in the text:
 *   - a token with a known key prefix: the gateway's own keys ("mg-", tenant admin tokens
 *     "mgt-"), OpenAI and Anthropic ("sk-", "sk-ant-", "sk-proj-"), NVIDIA ("nvapi-"),
 *     Hugging Face ("hf_"), GitHub ("ghp_", "gho_", "ghs_", "github_pat_"), GitLab
 *     ("glpat-"), Slack ("xoxb-", "xoxp-", "xoxa-"), Google ("AIza"), AWS ("AKIA", "ASIA"),
 *     the encrypted-at-rest form ("v1:"), followed by at least 8 token characters;
 *   - what follows "Bearer " or "Basic " (an Authorization value);
 *   - the value of an assignment whose name says secret (api_key, apikey, secret, password,
 *     passwd, token, access_key, private_key, authorization), as `name=value`, `name: value`
 *     or `"name": "value"`;
 *   - any run of 32 or more token characters mixing letters and digits (a JWT, a hex or
 *     base64 secret without a known prefix).
 * Token characters are ASCII letters, digits, '-', '_', '.', '+', '/' and '='. Each secret
 * becomes mg_secret_mask()'s form (at most its first six and last four characters), so a
 * logged line still tells which key was meant without revealing it. Pure; any thread. */
#ifndef MG_REDACT_H
#define MG_REDACT_H

#include <stddef.h>

/* The text s[0..n) with every secret masked: a malloc'd NUL-terminated string of *out_len
 * bytes (the caller frees it), NULL when out of memory. *masked (may be NULL) counts the
 * secrets masked. */
char *mg_redact(const char *s, size_t n, size_t *out_len, int *masked);

#endif
