/* Unit tests for core/base/crypto.c: request id format, uniqueness and random draw, hex digits,
 * SHA-256 against the FIPS 180-2 vectors, constant-time comparison. */
#include "base/clock.h"
#include "base/crypto.h"
#include "mgtest.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static int is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* "req-" + 24 lowercase hex digits, NUL right after. */
static int valid_request_id(const char *id)
{
    if (strlen(id) != MG_REQUEST_ID_LEN) return 0;
    if (strncmp(id, "req-", 4) != 0) return 0;
    for (int i = 4; i < MG_REQUEST_ID_LEN; i++)
        if (!is_lower_hex(id[i])) return 0;
    return 1;
}

static void test_request_id_format(void)
{
    CHECK_EQ_INT(MG_REQUEST_ID_LEN, 28);
    char id[MG_REQUEST_ID_LEN + 1 + 8];
    memset(id, 'Z', sizeof(id));
    CHECK_EQ_INT(mg_request_id(id), 0);
    CHECK(valid_request_id(id));
    CHECK(id[MG_REQUEST_ID_LEN] == '\0');
    CHECK(id[MG_REQUEST_ID_LEN + 1] == 'Z'); /* writes nothing past the NUL */
}

static int cmp_ids(const void *a, const void *b)
{
    return memcmp(a, b, MG_REQUEST_ID_LEN + 1);
}

/* 10k ids: all well-formed, all distinct, and every random hex position (after the 11 of the
 * time) takes many values (a constant or counter-like position would show up here). */
static void test_request_id_unique(void)
{
    enum { N = 10000 };
    char(*ids)[MG_REQUEST_ID_LEN + 1] = malloc((size_t)N * sizeof(*ids));
    CHECK(ids != NULL);
    if (!ids) return;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        if (mg_request_id(ids[i]) != 0 || !valid_request_id(ids[i])) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    int seen[MG_REQUEST_ID_LEN][16];
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < N; i++)
        for (int k = 4; k < MG_REQUEST_ID_LEN; k++) {
            char c = ids[i][k];
            int v = c <= '9' ? c - '0' : c - 'a' + 10;
            if (v >= 0 && v < 16) seen[k][v]++;
        }
    int thin_positions = 0;
    for (int k = 15; k < MG_REQUEST_ID_LEN; k++) {
        int distinct = 0;
        for (int v = 0; v < 16; v++) distinct += seen[k][v] > 0;
        if (distinct < 16) thin_positions++;
    }
    CHECK_EQ_INT(thin_positions, 0);
    qsort(ids, N, sizeof(*ids), cmp_ids);
    int dups = 0;
    for (int i = 1; i < N; i++)
        if (memcmp(ids[i - 1], ids[i], MG_REQUEST_ID_LEN + 1) == 0) dups++;
    CHECK_EQ_INT(dups, 0);
    free(ids);
}

/* The first 11 hex digits are the unix time in ms: ids sort by the time they were made. */
static void test_request_id_time_ordered(void)
{
    char a[MG_REQUEST_ID_LEN + 1], b[MG_REQUEST_ID_LEN + 1];
    uint64_t before = mg_unix_ms();
    CHECK_EQ_INT(mg_request_id(a), 0);
    uint64_t t = 0;
    for (int i = 4; i < 15; i++) t = t << 4 | (uint64_t)mg_hex_digit(a[i]);
    CHECK(t >= before && t <= mg_unix_ms());
    while (mg_unix_ms() < t + 2) {
    }
    CHECK_EQ_INT(mg_request_id(b), 0);
    CHECK(strcmp(a, b) < 0);
}

/* Ids made on different threads (each may keep its own block of random bytes) never
 * collide either. */
#define PER_THREAD 3000
static char thread_ids[2][PER_THREAD][MG_REQUEST_ID_LEN + 1];

static void *make_ids(void *arg)
{
    char(*ids)[MG_REQUEST_ID_LEN + 1] = arg;
    for (int i = 0; i < PER_THREAD; i++)
        if (mg_request_id(ids[i]) != 0) ids[i][0] = '\0';
    return NULL;
}

static void test_request_id_threads(void)
{
    pthread_t a, b;
    pthread_create(&a, NULL, make_ids, thread_ids[0]);
    pthread_create(&b, NULL, make_ids, thread_ids[1]);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    qsort(thread_ids, 2 * PER_THREAD, MG_REQUEST_ID_LEN + 1, cmp_ids);
    int bad = 0, dups = 0;
    for (int i = 0; i < 2 * PER_THREAD; i++) {
        const char *id = thread_ids[i / PER_THREAD][i % PER_THREAD];
        if (!valid_request_id(id)) bad++;
        if (i > 0 && strcmp(id, thread_ids[(i - 1) / PER_THREAD][(i - 1) % PER_THREAD]) == 0)
            dups++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(dups, 0);
}

static void test_random_bytes(void)
{
    unsigned char a[32], b[32], zero[32];
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    memset(zero, 0, sizeof(zero));
    CHECK_EQ_INT(mg_random_bytes(a, sizeof(a)), 0);
    CHECK_EQ_INT(mg_random_bytes(b, sizeof(b)), 0);
    CHECK(memcmp(a, zero, sizeof(a)) != 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    CHECK_EQ_INT(mg_random_bytes(a, 0), 0);
}

static void sha(const void *data, size_t n, char *out)
{
    memset(out, 'Z', 66);
    mg_sha256_hex(data, n, out);
}

/* Each thread keeps its own digest context: digests in parallel stay right. */
static void *sha_in_thread(void *arg)
{
    int *bad = arg;
    char out[66];
    for (int i = 0; i < 2000; i++) {
        mg_sha256_hex("abc", 3, out);
        *bad +=
            strcmp(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") != 0;
    }
    return NULL;
}

static void test_sha256_threads(void)
{
    pthread_t t[4];
    int bad[4] = {0};
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, sha_in_thread, &bad[i]) == 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(bad[i], 0);
}

static void test_sha256_vectors(void)
{
    char out[66];
    sha("", 0, out);
    CHECK_STR(out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(out[65] == 'Z');
    sha("abc", 3, out);
    CHECK_STR(out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha(two_blocks, strlen(two_blocks), out);
    CHECK_STR(out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *long_msg = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                           "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    sha(long_msg, strlen(long_msg), out);
    CHECK_STR(out, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    size_t million = 1000000;
    char *as = malloc(million);
    CHECK(as != NULL);
    if (as) {
        memset(as, 'a', million);
        sha(as, million, out);
        CHECK_STR(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        free(as);
    }
    /* binary input with NUL bytes: the length counts, not strlen */
    const unsigned char bin[] = {0x00, 0x01, 0x00};
    char a[66], b[66];
    sha(bin, 3, a);
    sha(bin, 1, b);
    CHECK(strcmp(a, b) != 0);
    CHECK(strcmp(b, "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d") == 0);
}

static void test_const_time_eq(void)
{
    CHECK_EQ_INT(mg_const_time_eq("secret", 6, "secret", 6), 1);
    CHECK_EQ_INT(mg_const_time_eq("secret", 6, "secreT", 6), 0);
    CHECK_EQ_INT(mg_const_time_eq("secret", 6, "Secret", 6), 0);
    CHECK_EQ_INT(mg_const_time_eq("secret", 6, "secret!", 7), 0);
    CHECK_EQ_INT(mg_const_time_eq("secret!", 7, "secret", 6), 0);
    CHECK_EQ_INT(mg_const_time_eq("", 0, "", 0), 1);
    CHECK_EQ_INT(mg_const_time_eq("", 0, "x", 1), 0);
    /* embedded NULs are compared as bytes */
    CHECK_EQ_INT(mg_const_time_eq("a\0b", 3, "a\0c", 3), 0);
    CHECK_EQ_INT(mg_const_time_eq("a\0b", 3, "a\0b", 3), 1);
    /* long buffers differing only in the last byte */
    char x[4096], y[4096];
    memset(x, 'q', sizeof(x));
    memcpy(y, x, sizeof(y));
    CHECK_EQ_INT(mg_const_time_eq(x, sizeof(x), y, sizeof(y)), 1);
    y[4095] = 'r';
    CHECK_EQ_INT(mg_const_time_eq(x, sizeof(x), y, sizeof(y)), 0);
}

static void test_hex_digit(void)
{
    CHECK_EQ_INT(mg_hex_digit('0'), 0);
    CHECK_EQ_INT(mg_hex_digit('9'), 9);
    CHECK_EQ_INT(mg_hex_digit('a'), 10);
    CHECK_EQ_INT(mg_hex_digit('F'), 15);
    CHECK_EQ_INT(mg_hex_digit('g'), -1);
    CHECK_EQ_INT(mg_hex_digit('/'), -1);
    CHECK_EQ_INT(mg_hex_digit('\0'), -1);
}

/* The draw is the id's last 24 bits over 2^24; anything not shaped like our ids draws 0. */
static void test_request_id_draw(void)
{
    CHECK(mg_request_id_draw("req-000000000000000000000000") == 0.0);
    CHECK(mg_request_id_draw("req-ffffffffffffffffff800000") == 0.5);
    CHECK(mg_request_id_draw("req-0123456789abcdef00ffffff") == 16777215.0 / 16777216.0);
    CHECK(mg_request_id_draw("req-0123456789abcdef00c00000") == 0.75);
    CHECK(mg_request_id_draw("req-short") == 0.0);
    CHECK(mg_request_id_draw("req-0123456789abcdef00c0000x") == 0.0);
    double sum = 0;
    for (int i = 0; i < 2000; i++) {
        char id[MG_REQUEST_ID_LEN + 1];
        CHECK_EQ_INT(mg_request_id(id), 0);
        double r = mg_request_id_draw(id);
        CHECK(r >= 0 && r < 1);
        sum += r;
    }
    CHECK(sum / 2000 > 0.4 && sum / 2000 < 0.6); /* uniform: mean 0.5, sd of the mean 0.0065 */
}

int main(void)
{
    MG_RUN(test_request_id_format);
    MG_RUN(test_request_id_unique);
    MG_RUN(test_request_id_time_ordered);
    MG_RUN(test_request_id_threads);
    MG_RUN(test_random_bytes);
    MG_RUN(test_sha256_vectors);
    MG_RUN(test_sha256_threads);
    MG_RUN(test_const_time_eq);
    MG_RUN(test_hex_digit);
    MG_RUN(test_request_id_draw);
    return mg_test_summary();
}
