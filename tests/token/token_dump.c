/* token_dump: the tokenizer for tests/token/tiktoken.test.mjs, many texts per process.
 *
 * stdin: records "<encoding> <special 0|1> <bytes>\n" each followed by that many bytes of
 * text; stdout: per record one line, the ids as a JSON array. Each record is also counted
 * with the count-only path, and a count that differs from the ids is an error (exit 1).
 * usage: token_dump DATA_DIR < records */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token/encoding.h"
#include "token/tokenize.h"

int main(int argc, char **argv)
{
    char err[1024], name[64];
    mg_encoding_t *enc[MG_ENC_COUNT] = {0};
    if (argc != 2) return 2;
    for (int i = 0; i < MG_ENC_COUNT; i++) {
        if (mg_encoding_load(i, argv[1], &enc[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "token_dump: %s\n", err);
            return 1;
        }
    }
    int special;
    size_t len;
    while (scanf("%63s %d %zu", name, &special, &len) == 3) {
        if (getchar() != '\n') return 2;
        int id = mg_encoding_lookup(name);
        char *text = malloc(len ? len : 1);
        if (id < 0 || !text || fread(text, 1, len, stdin) != len) return 2;
        unsigned flags = special ? MG_TOKENIZE_SPECIAL : 0;
        mg_token_ids_t ids = {0};
        long count = mg_tokenize_count(enc[id], text, len, flags);
        if (mg_tokenize_encode(enc[id], text, len, flags, &ids) != 0 || count != (long)ids.n) {
            fprintf(stderr, "token_dump: count %ld, ids %zu\n", count, ids.n);
            return 1;
        }
        putchar('[');
        for (size_t i = 0; i < ids.n; i++) printf(i ? ",%u" : "%u", ids.ids[i]);
        puts("]");
        mg_token_ids_free(&ids);
        free(text);
    }
    for (int i = 0; i < MG_ENC_COUNT; i++) mg_encoding_free(enc[i]);
    return 0;
}
