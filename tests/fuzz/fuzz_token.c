/* fuzz_token: the tokenizer (core/token/) against the slow reference of
 * tests/token/ref.h, which is tiktoken's definition written out plainly (a backtracking
 * matcher over the patterns as data, byte_pair_merge by full scans).
 *
 * Input: the first byte chooses the encoding (bit 0: cl100k_base, else o200k_base) and
 * whether special tokens are allowed (bit 1); the rest, up to 512 bytes, is the text (any
 * bytes: ill-formed UTF-8 is repaired by both). The ids of mg_tokenize_encode must equal the
 * reference's, and mg_tokenize_count must equal their number; otherwise __builtin_trap().
 * The rank files come from $FUZZ_TOKEN_DATA (default data/tokenizer, where scripts/setup
 * puts them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../token/ref.h"
#include "token/encoding.h"
#include "token/tokenize.h"

static mg_encoding_t *enc[MG_ENC_COUNT];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("FUZZ_TOKEN_DATA");
    char err[1024];
    for (int i = 0; i < MG_ENC_COUNT; i++) {
        if (mg_encoding_load(i, dir ? dir : "data/tokenizer", &enc[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "fuzz_token: %s\n", err);
            exit(1);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 513) return 0;
    const mg_encoding_t *e = enc[(data[0] & 1) ? MG_ENC_CL100K : MG_ENC_O200K];
    int special = (data[0] >> 1) & 1;
    const uint8_t *text = data + 1;
    size_t n = size - 1;
    uint32_t *want = malloc((3 * n + 1) * sizeof(*want));
    size_t k = ref_tokenize(e, text, n, special, want);
    mg_token_ids_t got = {0};
    unsigned flags = special ? MG_TOKENIZE_SPECIAL : 0;
    if (mg_tokenize_encode(e, text, n, flags, &got) != 0) __builtin_trap();
    if (got.n != k || (k && memcmp(got.ids, want, k * sizeof(*want)) != 0)) __builtin_trap();
    if (mg_tokenize_count(e, text, n, flags) != (long)k) __builtin_trap();
    mg_token_ids_free(&got);
    free(want);
    return 0;
}
