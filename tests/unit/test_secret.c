/* Unit tests for core/base/secret.c: key parsing and its messages, key generation, the
 * AES-256-GCM token round trip, tamper detection (every single-bit change of a token
 * fails), wrong keys, fresh nonces, re-encryption for key rotation, masking. */
#include "base/secret.h"
#include "mgtest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KEY_A "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define KEY_B "F0E1D2C3B4A5968778695A4B3C2D1E0F00112233445566778899AABBCCDDEEFF"

static mg_secret_key_t parse_key(const char *hex)
{
    mg_secret_key_t k;
    memset(&k, 0, sizeof(k));
    int rc = mg_secret_key_parse_hex(hex, NULL, &k, NULL, 0);
    CHECK_EQ_INT(rc, MG_SECRET_OK);
    return k;
}

/* Encrypt then decrypt n bytes; checks the plaintext comes back byte for byte. */
static void round_trip(const mg_secret_key_t *k, const void *data, size_t n)
{
    char *token = NULL, *plain = NULL;
    size_t out_n = 12345;
    CHECK_EQ_INT(mg_secret_encrypt(k, data, n, &token), MG_SECRET_OK);
    CHECK(token != NULL);
    if (!token) return;
    CHECK(strncmp(token, "v1:", 3) == 0);
    CHECK_EQ_INT(strlen(token), 3 + (12 + n + 16 + 2) / 3 * 4);
    CHECK_EQ_INT(mg_secret_decrypt(k, token, &plain, &out_n), MG_SECRET_OK);
    CHECK_EQ_INT(out_n, n);
    CHECK(plain != NULL && (n == 0 || memcmp(plain, data, n) == 0) && plain[n] == '\0');
    mg_secret_free(plain, out_n);
    free(token);
}

static void test_key_parse(void)
{
    mg_secret_key_t k;
    char err[256];
    CHECK_EQ_INT(mg_secret_key_parse_hex(KEY_A, "K", &k, err, sizeof(err)), MG_SECRET_OK);
    CHECK_EQ_INT(k.bytes[0], 0x00);
    CHECK_EQ_INT(k.bytes[31], 0x1f);
    CHECK_EQ_INT(mg_secret_key_parse_hex(KEY_B, "K", &k, err, sizeof(err)), MG_SECRET_OK);
    CHECK_EQ_INT(k.bytes[0], 0xf0);
    CHECK_EQ_INT(k.bytes[31], 0xff);
    mg_secret_key_wipe(&k);
    for (size_t i = 0; i < sizeof(k.bytes); i++) CHECK_EQ_INT(k.bytes[i], 0);
}

static void test_key_parse_errors(void)
{
    mg_secret_key_t k;
    memset(&k, 0x5a, sizeof(k));
    char err[256];
    /* too short: message names the source, the rule and the length, not the text */
    const char *short_key = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef012345678";
    CHECK_EQ_INT(
        mg_secret_key_parse_hex(short_key, "MOONGATE_ENCRYPTION_KEY", &k, err, sizeof(err)),
        MG_SECRET_EINVAL);
    CHECK(strstr(err, "MOONGATE_ENCRYPTION_KEY") != NULL);
    CHECK(strstr(err, "64 hex characters") != NULL);
    CHECK(strstr(err, "63") != NULL);
    CHECK(strstr(err, "abcdef") == NULL);
    /* too long ("0x" prefix) */
    char longer[70] = "0x";
    strcat(longer, KEY_A);
    CHECK_EQ_INT(mg_secret_key_parse_hex(longer, NULL, &k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "encryption key") != NULL && strstr(err, "66") != NULL);
    /* a non-hex character: its 1-based position */
    char bad[65];
    memcpy(bad, KEY_A, 65);
    bad[40] = 'g';
    CHECK_EQ_INT(mg_secret_key_parse_hex(bad, "K", &k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "position 41") != NULL);
    bad[40] = '0';
    bad[63] = ' ';
    CHECK_EQ_INT(mg_secret_key_parse_hex(bad, "K", &k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "position 64") != NULL);
    /* empty and NULL; a NULL err buffer is fine */
    CHECK_EQ_INT(mg_secret_key_parse_hex("", "K", &k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "empty") != NULL && strstr(err, "moongate keygen") != NULL);
    CHECK_EQ_INT(mg_secret_key_parse_hex(NULL, "K", &k, NULL, 0), MG_SECRET_EINVAL);
    /* the key is untouched by every failure */
    for (size_t i = 0; i < sizeof(k.bytes); i++) CHECK_EQ_INT(k.bytes[i], 0x5a);
}

static void test_key_from_env(void)
{
    mg_secret_key_t k;
    char err[256];
    unsetenv(MG_SECRET_ENV);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "MOONGATE_ENCRYPTION_KEY is not set") != NULL);
    setenv(MG_SECRET_ENV, "nothex", 1);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "MOONGATE_ENCRYPTION_KEY must be 64 hex") != NULL);
    CHECK(strstr(err, "nothex") == NULL);
    setenv(MG_SECRET_ENV, KEY_A, 1);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_OK);
    CHECK_EQ_INT(k.bytes[1], 0x01);
    unsetenv(MG_SECRET_ENV);
    /* the Sidecar's name, read when ours is unset or empty; ours wins when both are set */
    setenv(MG_SECRET_ENV_SIDECAR, "nothex", 1);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_EINVAL);
    CHECK(strstr(err, "SIDECAR_ENCRYPTION_KEY must be 64 hex") != NULL);
    setenv(MG_SECRET_ENV_SIDECAR, KEY_A, 1);
    setenv(MG_SECRET_ENV, "", 1);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_OK);
    setenv(MG_SECRET_ENV, "nothex", 1);
    CHECK_EQ_INT(mg_secret_key_from_env(&k, err, sizeof(err)), MG_SECRET_EINVAL);
    unsetenv(MG_SECRET_ENV);
    unsetenv(MG_SECRET_ENV_SIDECAR);
}

static void test_keygen(void)
{
    char a[65], b[65];
    CHECK_EQ_INT(mg_secret_keygen_hex(a), MG_SECRET_OK);
    CHECK_EQ_INT(mg_secret_keygen_hex(b), MG_SECRET_OK);
    CHECK_EQ_INT(strlen(a), 64);
    CHECK(strspn(a, "0123456789abcdef") == 64);
    CHECK(strcmp(a, b) != 0);
    mg_secret_key_t k;
    CHECK_EQ_INT(mg_secret_key_parse_hex(a, NULL, &k, NULL, 0), MG_SECRET_OK);
}

static void test_round_trip(void)
{
    mg_secret_key_t k = parse_key(KEY_A);
    const char *s = "nvapi-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcdefghijklmnopqrstuv";
    round_trip(&k, s, strlen(s));
    round_trip(&k, "", 0);
    round_trip(&k, NULL, 0);
    /* every length up to 100 covers all three base64 paddings */
    unsigned char buf[100];
    for (size_t i = 0; i < sizeof(buf); i++) buf[i] = (unsigned char)(i * 37 + 11);
    buf[5] = 0; /* binary secrets with NUL bytes survive */
    for (size_t n = 0; n <= sizeof(buf); n++) round_trip(&k, buf, n);
    /* the largest accepted size, and one past it */
    char *big = calloc(MG_SECRET_MAX_PLAIN + 1, 1);
    char *token = NULL;
    if (big) {
        memset(big, 'x', MG_SECRET_MAX_PLAIN);
        round_trip(&k, big, MG_SECRET_MAX_PLAIN);
        CHECK_EQ_INT(mg_secret_encrypt(&k, big, MG_SECRET_MAX_PLAIN + 1, &token), MG_SECRET_EINVAL);
        CHECK(token == NULL);
    }
    free(big);
}

static void test_token_hides_plaintext(void)
{
    mg_secret_key_t k = parse_key(KEY_A);
    const char *s = "sk-live-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    char *t = NULL;
    CHECK_EQ_INT(mg_secret_encrypt(&k, s, strlen(s), &t), MG_SECRET_OK);
    CHECK(t && strstr(t, "sk-live") == NULL && strstr(t, "AAAAAAAA") == NULL);
    CHECK(mg_secret_is_token(t));
    CHECK(!mg_secret_is_token(s));
    CHECK(!mg_secret_is_token("v1:"));
    CHECK(!mg_secret_is_token("v1:AAAA"));
    CHECK(!mg_secret_is_token(NULL));
    free(t);
}

static void test_nonce_differs(void)
{
    mg_secret_key_t k = parse_key(KEY_A);
    enum { N = 200 };
    char *t[N];
    for (int i = 0; i < N; i++) CHECK_EQ_INT(mg_secret_encrypt(&k, "same", 4, &t[i]), 0);
    int same_nonce = 0, same_token = 0;
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++) {
            /* the first 16 base64 characters encode exactly the 12 nonce bytes */
            if (strncmp(t[i] + 3, t[j] + 3, 16) == 0) same_nonce++;
            if (strcmp(t[i], t[j]) == 0) same_token++;
        }
    CHECK_EQ_INT(same_nonce, 0);
    CHECK_EQ_INT(same_token, 0);
    for (int i = 0; i < N; i++) free(t[i]);
}

/* Flip each bit of each character of a token of an n-byte secret: never decrypts. */
static void tamper_every_bit(const mg_secret_key_t *k, size_t n)
{
    char data[64];
    memset(data, 'q', sizeof(data));
    char *t = NULL;
    CHECK_EQ_INT(mg_secret_encrypt(k, data, n, &t), MG_SECRET_OK);
    if (!t) return;
    size_t len = strlen(t);
    int accepted = 0, auth_failures = 0;
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            t[i] ^= (char)(1 << bit);
            char *p = NULL;
            int rc = mg_secret_decrypt(k, t, &p, NULL);
            if (rc == MG_SECRET_OK) accepted++;
            if (rc == MG_SECRET_EAUTH) auth_failures++;
            CHECK(rc == MG_SECRET_OK || p == NULL);
            mg_secret_free(p, n);
            t[i] ^= (char)(1 << bit);
        }
    }
    CHECK_EQ_INT(accepted, 0);
    CHECK(auth_failures > (int)len); /* most flips reach the tag check */
    char *p = NULL;
    CHECK_EQ_INT(mg_secret_decrypt(k, t, &p, NULL), MG_SECRET_OK); /* restored intact */
    mg_secret_free(p, n);
    free(t);
}

static void test_tamper_bits(void)
{
    mg_secret_key_t k = parse_key(KEY_A);
    /* 28 + n bytes: n = 0, 1, 2 give "==", "=" and no padding */
    for (size_t n = 0; n <= 2; n++) tamper_every_bit(&k, n);
    tamper_every_bit(&k, 40);
}

static void test_tamper_shape(void)
{
    mg_secret_key_t k = parse_key(KEY_A);
    char *t = NULL, *p = NULL;
    CHECK_EQ_INT(mg_secret_encrypt(&k, "secret-value", 12, &t), MG_SECRET_OK);
    if (!t) return;
    size_t len = strlen(t);
    char *copy = malloc(len + 8);
    /* every truncation */
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(copy, t, cut);
        copy[cut] = '\0';
        CHECK(mg_secret_decrypt(&k, copy, &p, NULL) != MG_SECRET_OK && p == NULL);
    }
    /* trailing junk, a newline, a wrong version */
    const char *tails[] = {"\n", " ", "A", "AAAA", "===="};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        strcpy(copy, t);
        strcat(copy, tails[i]);
        CHECK(mg_secret_decrypt(&k, copy, &p, NULL) != MG_SECRET_OK && p == NULL);
    }
    strcpy(copy, t);
    copy[1] = '2';
    CHECK_EQ_INT(mg_secret_decrypt(&k, copy, &p, NULL), MG_SECRET_EFORMAT);
    CHECK_EQ_INT(mg_secret_decrypt(&k, "plaintext-key", &p, NULL), MG_SECRET_EFORMAT);
    CHECK_EQ_INT(mg_secret_decrypt(&k, NULL, &p, NULL), MG_SECRET_EINVAL);
    free(copy);
    free(t);
}

static void test_wrong_key(void)
{
    mg_secret_key_t a = parse_key(KEY_A), b = parse_key(KEY_B);
    char *t = NULL, *p = (char *)1;
    size_t n = 99;
    CHECK_EQ_INT(mg_secret_encrypt(&a, "hello", 5, &t), MG_SECRET_OK);
    CHECK_EQ_INT(mg_secret_decrypt(&b, t, &p, &n), MG_SECRET_EAUTH);
    CHECK(p == NULL);
    CHECK_EQ_INT(n, 0);
    /* a key differing in a single bit fails too */
    a.bytes[17] ^= 0x01;
    CHECK_EQ_INT(mg_secret_decrypt(&a, t, &p, &n), MG_SECRET_EAUTH);
    free(t);
}

static void test_reencrypt(void)
{
    mg_secret_key_t a = parse_key(KEY_A), b = parse_key(KEY_B);
    const char *s = "nvapi-rotate-me-0123456789";
    char *t = NULL, *t2 = NULL, *p = NULL;
    size_t n = 0;
    CHECK_EQ_INT(mg_secret_encrypt(&a, s, strlen(s), &t), MG_SECRET_OK);
    CHECK_EQ_INT(mg_secret_reencrypt(&a, &b, t, &t2), MG_SECRET_OK);
    CHECK(t2 && strcmp(t, t2) != 0);
    CHECK_EQ_INT(mg_secret_decrypt(&b, t2, &p, &n), MG_SECRET_OK);
    CHECK_STR(p, s);
    mg_secret_free(p, n);
    CHECK_EQ_INT(mg_secret_decrypt(&a, t2, &p, &n), MG_SECRET_EAUTH);
    /* rotating with the wrong old key fails and produces nothing */
    char *t3 = (char *)1;
    CHECK_EQ_INT(mg_secret_reencrypt(&b, &a, t, &t3), MG_SECRET_EAUTH);
    CHECK(t3 == NULL);
    /* same key: a fresh nonce, same plaintext */
    CHECK_EQ_INT(mg_secret_reencrypt(&a, &a, t, &t3), MG_SECRET_OK);
    CHECK(t3 && strcmp(t3, t) != 0);
    CHECK_EQ_INT(mg_secret_decrypt(&a, t3, &p, &n), MG_SECRET_OK);
    CHECK_STR(p, s);
    mg_secret_free(p, n);
    free(t);
    free(t2);
    free(t3);
}

static void check_mask(const char *secret, const char *want)
{
    char out[MG_SECRET_MASK_MAX];
    mg_secret_mask(secret, out);
    CHECK_STR(out, want);
}

static void test_mask(void)
{
    char nv[71] = "nvapi-";
    for (int i = 0; i < 60; i++) nv[6 + i] = 'Q';
    memcpy(nv + 66, "a1b2", 5);
    check_mask(nv, "nvapi-*****-a1b2"); /* the ADR's example */
    check_mask("sk-proj-abcdefghijklmnopqrstuvwxyz0123456789", "sk-pro*****-6789");
    check_mask("AIzaSyD0123456789abcdefghijklmnopqrstuv", "AIzaSy*****-stuv");
    check_mask("abcdefghijklmnopqrstuvwx", "abcdef*****-uvwx"); /* 24: six and four */
    check_mask("abcdefghijklmnopqrstuvw", "ab*****-tuvw");      /* 23: two and four */
    check_mask("nvapi-xxxxxxxxxx", "nv*****-xxxx");             /* 16 */
    check_mask("abcdefghijklmno", "*****-lmno");                /* 15: the last four */
    check_mask("abcdefghijkl", "*****-ijkl");                   /* 12 */
    check_mask("abcdefghijk", "*****");                         /* 11: nothing */
    check_mask("abc", "*****");
    check_mask("", "");
    check_mask(NULL, "");
}

/* For every length: at most ten characters shown, never more than 10 of 24 (42%), and
 * what is shown is the secret's own first and last characters. */
static void test_mask_budget(void)
{
    char s[301], out[MG_SECRET_MASK_MAX];
    for (size_t len = 1; len <= 300; len++) {
        for (size_t i = 0; i < len; i++) s[i] = (char)('a' + (i * 7 + len) % 26);
        s[len] = '\0';
        mg_secret_mask(s, out);
        const char *stars = strstr(out, "*****");
        CHECK(stars != NULL);
        if (!stars) continue;
        size_t pre = (size_t)(stars - out), shown = len < 12 ? 0 : strlen(out) - 6;
        CHECK(shown <= 10);
        CHECK(shown * 100 <= len * 42);
        CHECK(strncmp(out, s, pre) == 0);
        if (len >= 12) CHECK_STR(out + pre + 6, s + len - 4);
        CHECK(strlen(out) < MG_SECRET_MASK_MAX);
    }
}

static void test_strerror(void)
{
    CHECK_STR(mg_secret_strerror(MG_SECRET_OK), "ok");
    CHECK(strstr(mg_secret_strerror(MG_SECRET_EAUTH), "authentication") != NULL);
    CHECK_STR(mg_secret_strerror(-99), "unknown error");
}

int main(void)
{
    MG_RUN(test_key_parse);
    MG_RUN(test_key_parse_errors);
    MG_RUN(test_key_from_env);
    MG_RUN(test_keygen);
    MG_RUN(test_round_trip);
    MG_RUN(test_token_hides_plaintext);
    MG_RUN(test_nonce_differs);
    MG_RUN(test_tamper_bits);
    MG_RUN(test_tamper_shape);
    MG_RUN(test_wrong_key);
    MG_RUN(test_reencrypt);
    MG_RUN(test_mask);
    MG_RUN(test_mask_budget);
    MG_RUN(test_strerror);
    return mg_test_summary();
}
