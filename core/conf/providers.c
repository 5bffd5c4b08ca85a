/* providers: stored providers for generations, and the test call; see providers.h. */
#include "conf/providers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/crypto.h>

#include "base/log.h"
#include "base/secret.h"

#define TEST_BODY_MAX (256 * 1024)

typedef struct load_s {
    mg_provider_list_t *out;
    mg_secret_key_t key;
    int have_key;
    int skipped_no_key, skipped_bad;
    int oom;
} load_t;

static void conf_free(mg_provider_conf_t *p)
{
    free(p->id);
    free(p->name);
    free(p->adapter);
    free(p->base_url);
    if (p->api_key) OPENSSL_cleanse(p->api_key, strlen(p->api_key));
    free(p->api_key);
    free(p->pool);
    free(p->engine);
    free(p->metrics_url);
    free(p->model_prefix);
    free(p->source);
    memset(p, 0, sizeof(*p));
}

/* adapter, local and engine from the metadata JSON (defaults: openai, false, none). */
static int conf_metadata(mg_provider_conf_t *p, const char *json)
{
    cJSON *m = json ? cJSON_Parse(json) : NULL;
    const cJSON *ad = cJSON_GetObjectItemCaseSensitive(m, "adapter");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(m, "engine");
    p->adapter = strdup(cJSON_IsString(ad) ? ad->valuestring : "openai");
    p->engine = cJSON_IsString(en) ? strdup(en->valuestring) : NULL;
    p->local = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "local"));
    int ok = p->adapter && (!cJSON_IsString(en) || p->engine);
    cJSON_Delete(m);
    return ok ? 0 : -1;
}

static void load_row(void *ud, int ncols, const char *const *c)
{
    load_t *l = ud;
    if (ncols < 12 || !c[0] || !c[2] || !c[3]) return;
    if (!l->have_key) {
        l->skipped_no_key++;
        return;
    }
    char *plain = NULL;
    size_t plain_len = 0;
    int rc = mg_secret_decrypt(&l->key, c[2], &plain, &plain_len);
    if (rc != MG_SECRET_OK) {
        mg_log_msg(MG_LOG_WARN, NULL, "provider %s: stored key does not decrypt (%s); not served",
                   c[0], mg_secret_strerror(rc));
        l->skipped_bad++;
        return;
    }
    mg_provider_list_t *out = l->out;
    mg_provider_conf_t *items = realloc(out->items, (out->n + 1) * sizeof(*items));
    if (!items) {
        mg_secret_free(plain, plain_len);
        l->oom = 1;
        return;
    }
    out->items = items;
    mg_provider_conf_t *p = &items[out->n++];
    memset(p, 0, sizeof(*p));
    p->api_key = strdup(plain);
    mg_secret_free(plain, plain_len);
    p->id = strdup(c[0]);
    p->name = c[1] ? strdup(c[1]) : NULL;
    p->base_url = strdup(c[3]);
    p->model_prefix = strdup(c[4] ? c[4] : "");
    p->pool = strdup(c[5] && !strcmp(c[5], "fallback") ? "fallback" : "main");
    p->disabled = c[6] && strcmp(c[6], "disabled") == 0;
    p->rpm_limit = c[7] ? atoi(c[7]) : 0;
    p->tpm_limit = c[8] ? atoi(c[8]) : 0;
    p->weight = c[9] && atof(c[9]) > 0 ? atof(c[9]) : 1.0;
    p->cost_per_1k_tokens = c[10] ? atof(c[10]) : 0;
    p->source = strdup("db");
    if (!p->api_key || !p->id || (c[1] && !p->name) || !p->base_url || !p->model_prefix ||
        !p->pool || !p->source || conf_metadata(p, c[11]) != 0)
        l->oom = 1;
}

int mg_providers_load(mg_store_t *st, mg_provider_list_t *out, char *err, size_t errlen)
{
    load_t l;
    memset(&l, 0, sizeof(l));
    memset(out, 0, sizeof(*out));
    l.out = out;
    char kerr[160];
    l.have_key = mg_secret_key_from_env(&l.key, kerr, sizeof(kerr)) == 0;
    int rc = mg_store_query(st,
                            "SELECT " MG_PROVIDER_COLUMNS " FROM providers WHERE source = 'db'"
                            " ORDER BY created_at, id",
                            0, NULL, load_row, &l, err, errlen);
    mg_secret_key_wipe(&l.key);
    if (rc == 0 && l.oom) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    if (rc != 0) {
        mg_provider_list_free(out);
        return -1;
    }
    if (l.skipped_no_key)
        mg_log_msg(MG_LOG_WARN, NULL,
                   "%d stored provider(s) not served: %s (create one with `moongate keygen`)",
                   l.skipped_no_key, kerr);
    return 0;
}

void mg_provider_list_free(mg_provider_list_t *l)
{
    for (size_t i = 0; i < l->n; i++) conf_free(&l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

/* ---- the test call ---- */

typedef struct body_s {
    char *data;
    size_t len;
} body_t;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    body_t *b = ud;
    size_t n = size * nmemb;
    if (b->len + n > TEST_BODY_MAX) return 0; /* too big for a model list: abort */
    char *d = realloc(b->data, b->len + n + 1);
    if (!d) return 0;
    memcpy(d + b->len, ptr, n);
    b->len += n;
    d[b->len] = '\0';
    b->data = d;
    return n;
}

static long elapsed_ms(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (long)((t1.tv_sec - t0->tv_sec) * 1000 + (t1.tv_nsec - t0->tv_nsec) / 1000000);
}

static void classify(mg_provider_test_t *out, CURLcode cc, long status, const body_t *b)
{
    out->http_status = (int)status;
    if (cc == CURLE_OPERATION_TIMEDOUT) {
        out->result = MG_PTEST_UNREACHABLE;
        snprintf(out->detail, sizeof(out->detail), "cannot connect to the provider: timed out");
    } else if (cc == CURLE_WRITE_ERROR) {
        out->result = MG_PTEST_FAILED;
        snprintf(out->detail, sizeof(out->detail), "the provider's answer is too large");
    } else if (cc != CURLE_OK) {
        out->result = MG_PTEST_UNREACHABLE;
        snprintf(out->detail, sizeof(out->detail), "cannot connect to the provider: %s",
                 curl_easy_strerror(cc));
    } else if (status == 401 || status == 403) {
        out->result = MG_PTEST_KEY_INVALID;
        snprintf(out->detail, sizeof(out->detail),
                 "the provider refused the API key (upstream answered %ld)", status);
    } else if (status != 200) {
        out->result = MG_PTEST_FAILED;
        snprintf(out->detail, sizeof(out->detail), "the provider answered %ld", status);
    } else {
        cJSON *j = b->data ? cJSON_Parse(b->data) : NULL;
        int json = cJSON_IsObject(j) || cJSON_IsArray(j);
        cJSON_Delete(j);
        out->result = json ? MG_PTEST_OK : MG_PTEST_FAILED;
        snprintf(out->detail, sizeof(out->detail), "%s",
                 json ? "ok" : "the provider answered 200 but not with JSON");
    }
}

void mg_providers_test(const char *endpoint_url, const char *api_key, long timeout_ms,
                       mg_provider_test_t *out)
{
    memset(out, 0, sizeof(*out));
    out->result = MG_PTEST_FAILED;
    snprintf(out->detail, sizeof(out->detail), "cannot start the test call");
    char url[2200], *auth = NULL;
    snprintf(url, sizeof(url), "%s/models", endpoint_url);
    body_t b = {NULL, 0};
    struct curl_slist *hdrs = NULL;
    CURL *h = curl_easy_init();
    if (!h) return;
    if (api_key && *api_key) {
        size_t n = strlen(api_key) + 32;
        auth = malloc(n);
        if (!auth) goto out;
        snprintf(auth, n, "Authorization: Bearer %s", api_key);
        struct curl_slist *t = curl_slist_append(hdrs, auth);
        if (!t) goto out;
        hdrs = t;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "moongate");
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CURLcode cc = curl_easy_perform(h);
    out->latency_ms = elapsed_ms(&t0);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    classify(out, cc, status, &b);
out:
    curl_easy_cleanup(h);
    for (struct curl_slist *t = hdrs; t; t = t->next) OPENSSL_cleanse(t->data, strlen(t->data));
    curl_slist_free_all(hdrs);
    if (auth) OPENSSL_cleanse(auth, strlen(auth));
    free(auth);
    free(b.data);
}

const char *mg_ptest_name(mg_ptest_result_t r)
{
    switch (r) {
    case MG_PTEST_OK: return "ok";
    case MG_PTEST_KEY_INVALID: return "api_key_invalid";
    case MG_PTEST_UNREACHABLE: return "cannot_connect";
    default: return "failed";
    }
}

/* ---- encryption key rotation ---- */

typedef struct token_list_s {
    char **ids, **tokens;
    size_t n;
    int oom;
} token_list_t;

static void collect_token(void *ud, int ncols, const char *const *c)
{
    token_list_t *t = ud;
    if (ncols < 2 || !c[0] || !c[1]) return;
    char **ids = realloc(t->ids, (t->n + 1) * sizeof(*ids));
    if (ids) t->ids = ids;
    char **tokens = ids ? realloc(t->tokens, (t->n + 1) * sizeof(*tokens)) : NULL;
    if (tokens) t->tokens = tokens;
    if (!ids || !tokens) {
        t->oom = 1;
        return;
    }
    t->ids[t->n] = strdup(c[0]);
    t->tokens[t->n] = strdup(c[1]);
    t->n++;
    if (!t->ids[t->n - 1] || !t->tokens[t->n - 1]) t->oom = 1;
}

static void token_list_free(token_list_t *t)
{
    for (size_t i = 0; i < t->n; i++) {
        free(t->ids[i]);
        free(t->tokens[i]);
    }
    free(t->ids);
    free(t->tokens);
}

/* Re-encrypt one token and store it; 0, or -1 with err set. */
static int reencrypt_one(mg_store_tx_t *tx, const char *id, const char *token,
                         const mg_secret_key_t *old_key, const mg_secret_key_t *new_key, char *err,
                         size_t errlen)
{
    char *fresh = NULL;
    int rc = mg_secret_reencrypt(old_key, new_key, token, &fresh);
    if (rc != MG_SECRET_OK) {
        snprintf(err, errlen, "provider %s: the stored key does not decrypt with the old key (%s)",
                 id, mg_secret_strerror(rc));
        return -1;
    }
    const char *p[2] = {id, fresh};
    rc = mg_store_tx_exec(tx, "UPDATE providers SET api_key = ?2 WHERE id = ?1", 2, p, NULL, NULL,
                          err, errlen);
    free(fresh);
    return rc < 0 ? -1 : 0;
}

int mg_providers_reencrypt(mg_store_t *st, const mg_secret_key_t *old_key,
                           const mg_secret_key_t *new_key, size_t *count, char *err, size_t errlen)
{
    mg_store_tx_t *tx = NULL;
    token_list_t t = {0};
    *count = 0;
    if (mg_store_tx_begin(st, &tx, err, errlen) != 0) return -1;
    int rc = mg_store_tx_exec(tx, "SELECT id, api_key FROM providers WHERE source = 'db'", 0, NULL,
                              collect_token, &t, err, errlen) < 0
                 ? -1
                 : 0;
    if (rc == 0 && t.oom) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < t.n; i++)
        rc = reencrypt_one(tx, t.ids[i], t.tokens[i], old_key, new_key, err, errlen);
    size_t n = t.n;
    token_list_free(&t);
    if (rc != 0) {
        mg_store_tx_rollback(tx); /* all or nothing: no row is left under the other key */
        return -1;
    }
    if (mg_store_tx_commit(tx, err, errlen) != 0) return -1;
    *count = n;
    return 0;
}
