/* providers: the providers operators add through the admin API (source "db").
 *
 * They live in the store's `providers` table (the Sidecar ADR's DDL) with their API key
 * encrypted (secret.h, MOONGATE_ENCRYPTION_KEY) and join the providers of the config file in
 * every generation: mg_providers_load() reads and decrypts them for a generation being built
 * (start-up, SIGHUP, or an admin change). The adapter, `local` and `engine` of such a
 * provider are kept in the row's metadata JSON.
 *
 * Without MOONGATE_ENCRYPTION_KEY, or with a key that does not open a row, those providers
 * are left out (logged once per build, never with key material); providers whose keys come
 * from the config file or the environment keep serving.
 *
 * mg_providers_test() is the ADR's test call (GET {endpoint}/models with the key). Both
 * block: call them from a worker thread, never from the loop thread. */
#ifndef MG_PROVIDERS_H
#define MG_PROVIDERS_H

#include <stddef.h>

#include "conf/config.h"
#include "base/secret.h"
#include "store/store.h"

typedef struct mg_provider_list_s {
    mg_provider_conf_t *items; /* owned */
    size_t n;
} mg_provider_list_t;

/* Columns of a providers row, in the order mg_providers_row_conf() expects them. */
#define MG_PROVIDER_COLUMNS                                                                        \
    "id, name, api_key, endpoint_url, model_prefix, pool, status, rpm_limit, tpm_limit,"           \
    " weight, cost_per_1k_tokens, metadata"

/* Read every stored provider into out (keys decrypted). Rows that cannot be used are
 * skipped with a warning in the log. Returns 0, or -1 with the reason in err (storage). */
int mg_providers_load(mg_store_t *st, mg_provider_list_t *out, char *err, size_t errlen);
/* Free a list (keys wiped). */
void mg_provider_list_free(mg_provider_list_t *l);

/* Outcome of a test call. */
typedef enum {
    MG_PTEST_OK = 0,      /* 200 with a JSON body */
    MG_PTEST_KEY_INVALID, /* 401 or 403 */
    MG_PTEST_UNREACHABLE, /* refused, DNS, TLS or timed out */
    MG_PTEST_FAILED,      /* any other status, or a 200 that is not JSON */
} mg_ptest_result_t;

typedef struct mg_provider_test_s {
    mg_ptest_result_t result;
    int http_status; /* 0 when no answer */
    long latency_ms;
    char detail[160]; /* what happened, for the admin: never the key */
} mg_provider_test_t;

/* GET {endpoint_url}/models with "Authorization: Bearer api_key" (none when NULL or ""),
 * within timeout_ms. */
void mg_providers_test(const char *endpoint_url, const char *api_key, long timeout_ms,
                       mg_provider_test_t *out);

/* Encryption key rotation (`moongate rotate-encryption-key`): every stored provider key
 * decrypted with old_key and encrypted again with new_key, in one transaction: if one does
 * not decrypt, nothing changes. *count = keys re-encrypted. 0, or -1 with err set. */
int mg_providers_reencrypt(mg_store_t *st, const mg_secret_key_t *old_key,
                           const mg_secret_key_t *new_key, size_t *count, char *err, size_t errlen);

/* Short static names: "ok", "api_key_invalid", "cannot_connect", "failed". */
const char *mg_ptest_name(mg_ptest_result_t r);

#endif
