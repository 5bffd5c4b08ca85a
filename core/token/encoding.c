/* encoding: what defines o200k_base and cl100k_base (tiktoken's openai_public definitions:
 * pattern, special tokens, the rank file's digest), where their rank files are found, and
 * loading one: read, check the digest, parse. */
#include "token/encoding.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crypto.h"

#define SPECIAL(s, id)                                                                             \
    {                                                                                              \
        s, sizeof(s) - 1, id                                                                       \
    }

static const mg_special_t o200k_special[] = {
    SPECIAL("<|endoftext|>", 199999),
    SPECIAL("<|endofprompt|>", 200018),
};
static const mg_special_t cl100k_special[] = {
    SPECIAL("<|endoftext|>", 100257),   SPECIAL("<|fim_prefix|>", 100258),
    SPECIAL("<|fim_middle|>", 100259),  SPECIAL("<|fim_suffix|>", 100260),
    SPECIAL("<|endofprompt|>", 100276),
};

typedef struct {
    const char *name;
    const char *file;
    const char *sha256; /* the same digests as scripts/tokenizer.sha256 */
    mg_pretok_t pattern;
    const mg_special_t *special;
    size_t n_special;
} def_t;

static const def_t defs[MG_ENC_COUNT] = {
    [MG_ENC_O200K] = {"o200k_base", "o200k_base.tiktoken",
                      "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
                      MG_PRETOK_O200K, o200k_special, 2},
    [MG_ENC_CL100K] = {"cl100k_base", "cl100k_base.tiktoken",
                       "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
                       MG_PRETOK_CL100K, cl100k_special, 5},
};

int mg_encoding_lookup(const char *name)
{
    for (int i = 0; name && i < MG_ENC_COUNT; i++)
        if (strcmp(name, defs[i].name) == 0) return i;
    return -1;
}

const char *mg_encoding_name(int id)
{
    return id >= 0 && id < MG_ENC_COUNT ? defs[id].name : NULL;
}

const char *mg_encoding_file(int id)
{
    return id >= 0 && id < MG_ENC_COUNT ? defs[id].file : NULL;
}

const char *mg_encoding_sha256(int id)
{
    return id >= 0 && id < MG_ENC_COUNT ? defs[id].sha256 : NULL;
}

/* 1 when s starts with family and the name goes on with nothing, '-', '.' or ':' ("o1" is
 * the family of "o1-mini" but not of "o10"). */
static int of_family(const char *s, const char *family)
{
    size_t n = strlen(family);
    return strncmp(s, family, n) == 0 &&
           (s[n] == '\0' || s[n] == '-' || s[n] == '.' || s[n] == ':');
}

int mg_encoding_for_model(const char *model)
{
    static const char *const o200k[] = {"gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5",
                                        "o1",     "o3",         "o4",      NULL};
    static const char *const cl100k[] = {
        "gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada-002", NULL};
    if (!model) return -1;
    const char *slash = strrchr(model, '/'); /* "openai/gpt-4o" as some providers name it */
    if (slash) model = slash + 1;
    for (size_t i = 0; o200k[i]; i++)
        if (of_family(model, o200k[i])) return MG_ENC_O200K;
    for (size_t i = 0; cl100k[i]; i++)
        if (of_family(model, cl100k[i])) return MG_ENC_CL100K;
    return -1;
}

/* out = <executable's directory>/../share/moongate/tokenizer; -1 when unknown or too long. */
static int installed_dir(char *out, size_t cap)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    int w = snprintf(out, cap, "%s/../share/moongate/tokenizer", dirname(exe));
    return w > 0 && (size_t)w < cap ? 0 : -1;
}

int mg_encoding_data_dir(const char *configured, char *out, size_t cap)
{
    int w;
    if (configured && *configured) {
        w = snprintf(out, cap, "%s", configured);
        return w >= 0 && (size_t)w < cap ? 0 : -1;
    }
    if (installed_dir(out, cap) == 0) {
        char probe[4200];
        snprintf(probe, sizeof(probe), "%s/%s", out, defs[MG_ENC_O200K].file);
        if (access(probe, R_OK) == 0) return 0;
    }
#ifdef MG_SOURCE_DIR
    w = snprintf(out, cap, "%s/data/tokenizer", MG_SOURCE_DIR);
#else
    w = snprintf(out, cap, "data/tokenizer");
#endif
    return w >= 0 && (size_t)w < cap ? 0 : -1;
}

/* Read the whole file into a malloc'd buffer; NULL with err. */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s (scripts/setup extracts the rank files)", path,
                 strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (size > 0 && size < (64L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)size)) && fread(buf, 1, (size_t)size, f) == (size_t)size) {
        fclose(f);
        *len = (size_t)size;
        return buf;
    }
    snprintf(err, errlen, "%s: cannot read it", path);
    free(buf);
    fclose(f);
    return NULL;
}

int mg_encoding_load(int id, const char *dir, mg_encoding_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (id < 0 || id >= MG_ENC_COUNT) {
        snprintf(err, errlen, "no encoding %d", id);
        return -1;
    }
    const def_t *d = &defs[id];
    char path[4200], digest[65], why[256];
    snprintf(path, sizeof(path), "%s/%s", dir, d->file);
    size_t len = 0;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return -1;
    mg_sha256_hex(text, len, digest);
    if (strcmp(digest, d->sha256) != 0) {
        snprintf(err, errlen, "%s: SHA-256 %s, expected %s (run scripts/setup again)", path, digest,
                 d->sha256);
        free(text);
        return -1;
    }
    mg_encoding_t *e = calloc(1, sizeof(*e));
    if (!e || mg_ranks_parse(text, len, &e->ranks, why, sizeof(why)) < 0) {
        snprintf(err, errlen, "%s: %s", path, e ? why : "out of memory");
        free(e);
        free(text);
        return -1;
    }
    free(text);
    e->id = (mg_encoding_id_t)id;
    e->name = d->name;
    e->pattern = d->pattern;
    e->special = d->special;
    e->n_special = d->n_special;
    *out = e;
    return 0;
}

void mg_encoding_free(mg_encoding_t *e)
{
    if (!e) return;
    mg_ranks_free(e->ranks);
    free(e);
}
