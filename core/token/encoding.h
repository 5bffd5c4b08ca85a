/* encoding: the registry of the encodings this tokenizer knows, and loading one.
 *
 * An encoding is a rank table, a pre-tokenizer pattern and its special tokens. Two are
 * known: o200k_base (gpt-4o, o1, o3, gpt-4.1, gpt-5) and cl100k_base (gpt-4, gpt-3.5,
 * text-embedding-3). Their rank files are extracted from the npm tiktoken package by
 * scripts/setup (scripts/tokenizer-data.mjs) and checked here against the SHA-256 tiktoken
 * itself pins; nothing is fetched at run time. Loading reads a file of 2-4 MB and builds
 * tables of 4-8 MB: do it off the event loop (at start-up before the loop runs, or on a
 * worker). A loaded encoding is read-only and may be used from any thread. */
#ifndef MG_ENCODING_H
#define MG_ENCODING_H

#include <stddef.h>
#include <stdint.h>

#include "token/pretok.h"
#include "token/ranks.h"

typedef enum {
    MG_ENC_O200K = 0,
    MG_ENC_CL100K = 1,
    MG_ENC_COUNT = 2,
} mg_encoding_id_t;

#define MG_ENC_MAX_SPECIAL 8

typedef struct {
    const char *text; /* e.g. "<|endoftext|>" */
    size_t len;
    uint32_t id;
} mg_special_t;

/* A loaded encoding. Read-only after mg_encoding_load. */
typedef struct mg_encoding {
    mg_encoding_id_t id;
    const char *name; /* static */
    mg_pretok_t pattern;
    mg_ranks_t *ranks;           /* owned */
    const mg_special_t *special; /* static, n_special entries */
    size_t n_special;
} mg_encoding_t;

/* The id of the encoding named name ("o200k_base", "cl100k_base"), or -1. */
int mg_encoding_lookup(const char *name);

/* The name of encoding id (static), or NULL for none. */
const char *mg_encoding_name(int id);

/* The encoding of an upstream model by its family name: o200k_base for gpt-4o, chatgpt-4o,
 * o1, o3, o4, gpt-4.1, gpt-4.5, gpt-5 and their dated or suffixed names; cl100k_base for
 * gpt-4 (other than those), gpt-3.5, gpt-35 and text-embedding-3 / -ada-002; -1 for every
 * other family (whose tokenizer is not known here). */
int mg_encoding_for_model(const char *model);

/* The file name of encoding id's ranks ("o200k_base.tiktoken") and the SHA-256 (hex) it
 * must have; NULL for none. */
const char *mg_encoding_file(int id);
const char *mg_encoding_sha256(int id);

/* The directory the rank files are read from, into out[0..cap): configured when it is set
 * (non-NULL, non-empty); else <directory of the executable>/../share/moongate/tokenizer
 * when it holds the o200k_base file (an installed moongate); else the checkout's
 * data/tokenizer, where scripts/setup puts them. Returns 0, or -1 when out is too small. */
int mg_encoding_data_dir(const char *configured, char *out, size_t cap);

/* Load encoding id from dir (blocking file I/O and a few tens of milliseconds of work):
 * *out gets a new encoding, freed with mg_encoding_free. Returns 0, or -1 with the reason
 * (missing file, wrong checksum, bad format) in err. */
int mg_encoding_load(int id, const char *dir, mg_encoding_t **out, char *err, size_t errlen);

/* Free an encoding (NULL is fine). */
void mg_encoding_free(mg_encoding_t *e);

#endif
