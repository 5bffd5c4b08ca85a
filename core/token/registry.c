/* registry: the loaded encodings, one slot per encoding id. File-scope state, written only
 * before any other thread starts (core/README.md lists it with the others). */
#include "token/registry.h"

static mg_encoding_t *loaded[MG_ENC_COUNT];

int mg_token_registry_load(const char *dir, const int want[MG_ENC_COUNT], char *err, size_t errlen)
{
    int rc = 0;
    for (int i = 0; i < MG_ENC_COUNT; i++) {
        if (!want[i] || loaded[i]) continue;
        if (mg_encoding_load(i, dir, &loaded[i], rc ? (char[256]){0} : err, rc ? 256 : errlen) != 0)
            rc = -1;
    }
    return rc;
}

const mg_encoding_t *mg_token_registry_get(int id)
{
    return id >= 0 && id < MG_ENC_COUNT ? loaded[id] : NULL;
}

void mg_token_registry_free(void)
{
    for (int i = 0; i < MG_ENC_COUNT; i++) {
        mg_encoding_free(loaded[i]);
        loaded[i] = NULL;
    }
}
