/* registry: the encodings this process has loaded, for every module that counts tokens.
 *
 * Filled once at start-up, before the event loop and the worker threads run (server.c), and
 * read-only from then on: any thread may read it without a lock. An encoding that no model
 * names is not loaded (it would cost start-up time and 5-10 MB for nothing), and a lookup of
 * it answers NULL: its callers fall back to their estimate. */
#ifndef MG_TOKEN_REGISTRY_H
#define MG_TOKEN_REGISTRY_H

#include "token/encoding.h"

/* Load the encodings whose want[id] is set from dir (mg_encoding_data_dir resolves it).
 * Blocking file I/O: call before the loop runs. Already loaded ones stay. Returns 0, or -1
 * with the reason of the first failure in err (the others loaded stay usable). */
int mg_token_registry_load(const char *dir, const int want[MG_ENC_COUNT], char *err, size_t errlen);

/* The loaded encoding id, or NULL when it is not loaded (or id is no encoding). */
const mg_encoding_t *mg_token_registry_get(int id);

/* Free every loaded encoding; only when nothing can use them any more (process exit). */
void mg_token_registry_free(void);

#endif
