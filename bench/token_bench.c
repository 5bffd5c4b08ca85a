/* token_bench: the tokenizer's throughput on the files named, for bench/token.mjs.
 *
 * usage: token_bench DATA_DIR ENCODING FILE...
 * For each file, the count-only path and the full encode are each run until at least
 * 0.3 s have passed (at least once); one JSON line per file:
 * {"file":..., "bytes":..., "tokens":..., "count_mbps":..., "encode_mbps":...}
 * (MB = 10^6 bytes, single-threaded). Also prints the load time of the encoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "token/encoding.h"
#include "token/tokenize.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n > 0 ? (size_t)n : 1);
    *len = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    char err[1024];
    mg_encoding_t *e = NULL;
    if (argc < 4) return 2;
    double t0 = now_s();
    if (mg_encoding_load(mg_encoding_lookup(argv[2]), argv[1], &e, err, sizeof(err)) != 0) {
        fprintf(stderr, "token_bench: %s\n", err);
        return 1;
    }
    printf("{\"load_ms\":%.1f}\n", (now_s() - t0) * 1e3);
    for (int i = 3; i < argc; i++) {
        size_t len = 0;
        char *text = slurp(argv[i], &len);
        if (!text) return 1;
        long tokens = 0;
        int runs = 0;
        double start = now_s(), t;
        do {
            tokens = mg_tokenize_count(e, text, len, 0);
            runs++;
        } while ((t = now_s() - start) < 0.3);
        double count_mbps = (double)len * runs / t / 1e6;
        mg_token_ids_t ids = {0};
        runs = 0;
        start = now_s();
        do {
            ids.n = 0;
            mg_tokenize_encode(e, text, len, 0, &ids);
            runs++;
        } while ((t = now_s() - start) < 0.3);
        double encode_mbps = (double)len * runs / t / 1e6;
        printf("{\"file\":\"%s\",\"bytes\":%zu,\"tokens\":%ld,\"ids\":%zu,\"count_mbps\":%.2f,"
               "\"encode_mbps\":%.2f}\n",
               argv[i], len, tokens, ids.n, count_mbps, encode_mbps);
        mg_token_ids_free(&ids);
        free(text);
    }
    mg_encoding_free(e);
    return 0;
}
