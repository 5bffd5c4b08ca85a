/* Unit tests for core/base/siphash.c: SipHash-2-4-128 against the reference test vectors (key
 * 00 01 .. 0f, message 00 01 .. (len - 1)), at lengths that cover an empty message, a partial
 * last word, exactly one word and a word plus a byte. */
#include "mgtest.h"
#include "base/siphash.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The tag as the reference prints it: 16 bytes, each half little-endian, in hex. */
static void tag_hex(size_t len, char out[33])
{
    uint8_t key[16], msg[64];
    for (int i = 0; i < 16; i++) key[i] = (uint8_t)i;
    for (size_t i = 0; i < len; i++) msg[i] = (uint8_t)i;
    uint64_t tag[2];
    mg_siphash128(msg, len, key, tag);
    for (int i = 0; i < 16; i++)
        sprintf(out + 2 * i, "%02x", (unsigned)(tag[i / 8] >> (8 * (i % 8))) & 0xff);
}

static void test_reference_vectors(void)
{
    static const struct {
        size_t len;
        const char *hex;
    } v[] = {{0, "a3817f04ba25a8e66df67214c7550293"}, {1, "da87c1d86b99af44347659119b22fc45"},
             {2, "8177228da4a45dc7fca38bdef60affe4"}, {7, "a1f1ebbed8dbc153c0b84aa61ff08239"},
             {8, "3b62a9ba6258f5610f83e264f31497b4"}, {9, "264499060ad9baabc47f8b02bb6d71ed"}};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char got[33];
        tag_hex(v[i].len, got);
        CHECK_STR(got, v[i].hex);
    }
}

/* A different key or one changed byte gives an unrelated tag. */
static void test_key_and_message_matter(void)
{
    uint8_t k1[16] = {0}, k2[16] = {0};
    k2[15] = 1;
    const char *m = "mg-0123456789abcdefghijABCDEFGHIJ0123a1b2c3";
    uint64_t a[2], b[2], c[2];
    mg_siphash128(m, strlen(m), k1, a);
    mg_siphash128(m, strlen(m), k2, b);
    mg_siphash128(m, strlen(m) - 1, k1, c);
    CHECK(a[0] != b[0] && a[1] != b[1]);
    CHECK(a[0] != c[0] && a[1] != c[1]);
}

int main(void)
{
    MG_RUN(test_reference_vectors);
    MG_RUN(test_key_and_message_matter);
    return mg_test_summary();
}
