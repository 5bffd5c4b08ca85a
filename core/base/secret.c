/* secret: AES-256-GCM tokens for provider secrets, key parsing, masking; see secret.h.
 *
 * The token text is "v1:" followed by standard base64 (RFC 4648, with padding) of
 * nonce | ciphertext | tag. The decoder here is strict on purpose: it accepts only the
 * one canonical encoding of a byte string (no whitespace, padding only at the end, the
 * unused low bits of the last character zero). With a lenient decoder some one-bit
 * changes to the text would decode to the same bytes and go unnoticed; with this one
 * every change to the text either fails to parse or changes the bytes the GCM tag
 * covers. Every buffer that held plaintext or key material is wiped with
 * OPENSSL_cleanse() before it is freed. */
#include "base/secret.h"

#include "base/b64.h"
#include "base/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_PREFIX "v1:"
#define TOKEN_PREFIX_LEN 3
#define TOKEN_AAD "v1" /* the format version is authenticated with the data */
#define TOKEN_OVERHEAD (MG_SECRET_NONCE_LEN + MG_SECRET_TAG_LEN)

static const char b64dig[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char hexdig[] = "0123456789abcdef";

/* ---- base64 (strict) ---------------------------------------------------------------- */

static size_t b64_encoded_len(size_t n)
{
    return (n + 2) / 3 * 4;
}

/* Encode n bytes into out (b64_encoded_len(n) + 1 bytes), NUL-terminated. */
static void b64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        out[o++] = b64dig[(v >> 18) & 63];
        out[o++] = b64dig[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64dig[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64dig[v & 63] : '=';
    }
    out[o] = '\0';
}

/* Decoded length of a canonical encoding of len characters, or -1 when len or the
 * padding is impossible. */
static long b64_decoded_len(const char *s, size_t len)
{
    if (len == 0 || len % 4 != 0) return -1;
    size_t pad = 0;
    if (s[len - 1] == '=') pad++;
    if (s[len - 2] == '=') pad++;
    if (pad == 1 && s[len - 2] == '=') return -1;
    return (long)(len / 4 * 3 - pad);
}

/* Decode one 4-character group; `pad` trailing '=' allowed (last group only).
 * Returns the 24-bit value or -1 on any non-canonical input. */
static long b64_group(const char *g, size_t pad)
{
    uint32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int d = k >= 4 - pad ? (g[k] == '=' ? 0 : -1) : mg_b64_digit((unsigned char)g[k]);
        if (d < 0) return -1;
        v = v << 6 | (uint32_t)d;
    }
    /* bits that no output byte uses must be zero, or two texts would give one result */
    if ((pad == 1 && (v & 0xff)) || (pad == 2 && (v & 0xffff))) return -1;
    return (long)v;
}

/* Strictly decode s (len chars) into out, which has room for b64_decoded_len() bytes.
 * Returns the number of bytes written or -1. */
static long b64_decode(const char *s, size_t len, unsigned char *out)
{
    long total = b64_decoded_len(s, len);
    if (total < 0) return -1;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        size_t pad = i + 4 == len ? len / 4 * 3 - (size_t)total : 0;
        long v = b64_group(s + i, pad);
        if (v < 0) return -1;
        unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8), (unsigned char)v};
        for (size_t k = 0; k < 3 - pad; k++) out[o++] = b[k];
    }
    return total;
}

/* ---- keys ---------------------------------------------------------------------------- */

static int key_error(char *err, size_t errlen, const char *what, const char *why, size_t n)
{
    if (err && errlen) snprintf(err, errlen, "%s %s%zu", what, why, n);
    return MG_SECRET_EINVAL;
}

int mg_secret_key_parse_hex(const char *hex, const char *what, mg_secret_key_t *key, char *err,
                            size_t errlen)
{
    if (!what) what = "encryption key";
    if (!hex || !*hex) {
        if (err && errlen)
            snprintf(err, errlen,
                     "%s is empty: it must be 64 hex characters (32 bytes); "
                     "generate one with `moongate keygen`",
                     what);
        return MG_SECRET_EINVAL;
    }
    size_t len = strlen(hex);
    if (len != MG_SECRET_KEY_HEX_LEN)
        return key_error(err, errlen, what, "must be 64 hex characters (32 bytes); its length is ",
                         len);
    mg_secret_key_t k;
    for (size_t i = 0; i < MG_SECRET_KEY_LEN; i++) {
        int hi = mg_hex_digit(hex[2 * i]), lo = mg_hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            OPENSSL_cleanse(&k, sizeof(k));
            return key_error(err, errlen, what,
                             "must be hex digits only (0-9, a-f); bad character at position ",
                             2 * i + (hi < 0 ? 1 : 2));
        }
        k.bytes[i] = (unsigned char)(hi << 4 | lo);
    }
    *key = k;
    OPENSSL_cleanse(&k, sizeof(k));
    return MG_SECRET_OK;
}

int mg_secret_key_from_env(mg_secret_key_t *key, char *err, size_t errlen)
{
    const char *v = getenv(MG_SECRET_ENV), *what = MG_SECRET_ENV;
    const char *sidecar = getenv(MG_SECRET_ENV_SIDECAR); /* the Sidecar's name (its SOP) */
    if ((!v || !*v) && sidecar && *sidecar) {
        v = sidecar;
        what = MG_SECRET_ENV_SIDECAR;
    }
    if (!v) {
        if (err && errlen)
            snprintf(err, errlen,
                     "%s is not set: it must be 64 hex characters (32 bytes); "
                     "generate one with `moongate keygen`",
                     MG_SECRET_ENV);
        return MG_SECRET_EINVAL;
    }
    return mg_secret_key_parse_hex(v, what, key, err, errlen);
}

void mg_secret_key_wipe(mg_secret_key_t *key)
{
    if (key) OPENSSL_cleanse(key->bytes, sizeof(key->bytes));
}

int mg_secret_keygen_hex(char *out)
{
    unsigned char raw[MG_SECRET_KEY_LEN];
    out[0] = '\0';
    if (mg_random_bytes(raw, sizeof(raw)) != 0) return MG_SECRET_ECRYPTO;
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hexdig[raw[i] >> 4];
        out[2 * i + 1] = hexdig[raw[i] & 15];
    }
    out[2 * sizeof(raw)] = '\0';
    OPENSSL_cleanse(raw, sizeof(raw));
    return MG_SECRET_OK;
}

/* ---- AES-256-GCM ----------------------------------------------------------------------- */

/* Encrypt n bytes into ct (n bytes) and tag under key and nonce. 0 or MG_SECRET_ECRYPTO. */
static int gcm_seal(const mg_secret_key_t *key, const unsigned char *nonce,
                    const unsigned char *plain, size_t n, unsigned char *ct, unsigned char *tag)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, ok = c != NULL;
    ok = ok && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, key->bytes, nonce) == 1;
    ok = ok && EVP_EncryptUpdate(c, NULL, &len, (const unsigned char *)TOKEN_AAD,
                                 (int)strlen(TOKEN_AAD)) == 1;
    ok = ok && (n == 0 || EVP_EncryptUpdate(c, ct, &len, plain, (int)n) == 1);
    ok = ok && EVP_EncryptFinal_ex(c, ct + (n ? len : 0), &len) == 1;
    ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, MG_SECRET_TAG_LEN, tag) == 1;
    EVP_CIPHER_CTX_free(c);
    return ok ? MG_SECRET_OK : MG_SECRET_ECRYPTO;
}

/* Decrypt n bytes of ct into plain and verify tag. 0, MG_SECRET_EAUTH or ECRYPTO.
 * The caller wipes plain on failure. */
static int gcm_open(const mg_secret_key_t *key, const unsigned char *nonce, const unsigned char *ct,
                    size_t n, const unsigned char *tag, unsigned char *plain)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int len = 0, ok = c != NULL;
    ok = ok && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key->bytes, nonce) == 1;
    ok = ok && EVP_DecryptUpdate(c, NULL, &len, (const unsigned char *)TOKEN_AAD,
                                 (int)strlen(TOKEN_AAD)) == 1;
    ok = ok && (n == 0 || EVP_DecryptUpdate(c, plain, &len, ct, (int)n) == 1);
    ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, MG_SECRET_TAG_LEN, (void *)tag) == 1;
    if (!ok) {
        EVP_CIPHER_CTX_free(c);
        return MG_SECRET_ECRYPTO;
    }
    /* the tag is checked here; a mismatch is the only expected way to fail */
    ok = EVP_DecryptFinal_ex(c, plain + (n ? len : 0), &len) == 1;
    EVP_CIPHER_CTX_free(c);
    return ok ? MG_SECRET_OK : MG_SECRET_EAUTH;
}

int mg_secret_encrypt(const mg_secret_key_t *key, const void *plain, size_t n, char **token)
{
    if (!token) return MG_SECRET_EINVAL;
    *token = NULL;
    if (!key || (!plain && n) || n > MG_SECRET_MAX_PLAIN) return MG_SECRET_EINVAL;
    size_t raw_len = TOKEN_OVERHEAD + n;
    unsigned char *raw = malloc(raw_len);
    char *out = malloc(TOKEN_PREFIX_LEN + b64_encoded_len(raw_len) + 1);
    int rc = raw && out ? MG_SECRET_OK : MG_SECRET_ENOMEM;
    if (rc == MG_SECRET_OK && mg_random_bytes(raw, MG_SECRET_NONCE_LEN) != 0)
        rc = MG_SECRET_ECRYPTO;
    if (rc == MG_SECRET_OK)
        rc = gcm_seal(key, raw, plain, n, raw + MG_SECRET_NONCE_LEN, raw + MG_SECRET_NONCE_LEN + n);
    if (rc == MG_SECRET_OK) {
        memcpy(out, TOKEN_PREFIX, TOKEN_PREFIX_LEN);
        b64_encode(raw, raw_len, out + TOKEN_PREFIX_LEN);
        *token = out;
        out = NULL;
    }
    free(raw); /* nonce, ciphertext and tag: nothing secret */
    free(out);
    return rc;
}

/* Parse a token into a malloc'd raw buffer (nonce | ct | tag). 0 or EFORMAT / ENOMEM. */
static int token_raw(const char *token, unsigned char **raw, size_t *raw_len)
{
    if (strncmp(token, TOKEN_PREFIX, TOKEN_PREFIX_LEN) != 0) return MG_SECRET_EFORMAT;
    const char *b = token + TOKEN_PREFIX_LEN;
    size_t blen = strlen(b);
    long want = b64_decoded_len(b, blen);
    if (want < (long)TOKEN_OVERHEAD || want > (long)(TOKEN_OVERHEAD + MG_SECRET_MAX_PLAIN))
        return MG_SECRET_EFORMAT;
    *raw = malloc((size_t)want);
    if (!*raw) return MG_SECRET_ENOMEM;
    if (b64_decode(b, blen, *raw) != want) {
        free(*raw);
        *raw = NULL;
        return MG_SECRET_EFORMAT;
    }
    *raw_len = (size_t)want;
    return MG_SECRET_OK;
}

int mg_secret_decrypt(const mg_secret_key_t *key, const char *token, char **plain, size_t *n)
{
    if (!plain) return MG_SECRET_EINVAL;
    *plain = NULL;
    if (n) *n = 0;
    if (!key || !token) return MG_SECRET_EINVAL;
    unsigned char *raw = NULL;
    size_t raw_len = 0;
    int rc = token_raw(token, &raw, &raw_len);
    if (rc != MG_SECRET_OK) return rc;
    size_t ct_len = raw_len - TOKEN_OVERHEAD;
    char *out = malloc(ct_len + 1);
    if (!out) {
        free(raw);
        return MG_SECRET_ENOMEM;
    }
    rc = gcm_open(key, raw, raw + MG_SECRET_NONCE_LEN, ct_len, raw + MG_SECRET_NONCE_LEN + ct_len,
                  (unsigned char *)out);
    free(raw);
    if (rc != MG_SECRET_OK) {
        mg_secret_free(out, ct_len);
        return rc;
    }
    out[ct_len] = '\0';
    *plain = out;
    if (n) *n = ct_len;
    return MG_SECRET_OK;
}

void mg_secret_free(char *plain, size_t n)
{
    if (!plain) return;
    OPENSSL_cleanse(plain, n + 1);
    free(plain);
}

int mg_secret_reencrypt(const mg_secret_key_t *old_key, const mg_secret_key_t *new_key,
                        const char *token, char **out)
{
    if (!out) return MG_SECRET_EINVAL;
    *out = NULL;
    if (!new_key) return MG_SECRET_EINVAL;
    char *plain = NULL;
    size_t n = 0;
    int rc = mg_secret_decrypt(old_key, token, &plain, &n);
    if (rc != MG_SECRET_OK) return rc;
    rc = mg_secret_encrypt(new_key, plain, n, out);
    mg_secret_free(plain, n);
    return rc;
}

int mg_secret_is_token(const char *s)
{
    if (!s || strncmp(s, TOKEN_PREFIX, TOKEN_PREFIX_LEN) != 0) return 0;
    unsigned char *raw = NULL;
    size_t raw_len = 0;
    if (token_raw(s, &raw, &raw_len) != MG_SECRET_OK) return 0;
    free(raw);
    return 1;
}

/* ---- masking ----------------------------------------------------------------------------- */

/* Length of the recognizable prefix: through the first '-' if it is among the first six
 * characters, else six characters (or the whole string if shorter). */
void mg_secret_mask(const char *secret, char *out)
{
    out[0] = '\0';
    if (!secret || !*secret) return;
    size_t len = strlen(secret);
    size_t pre = len >= 24 ? 6 : len >= 16 ? 2 : 0;
    if (len < 12) {
        memcpy(out, "*****", 6);
        return;
    }
    memcpy(out, secret, pre);
    memcpy(out + pre, "*****-", 6);
    memcpy(out + pre + 6, secret + len - 4, 4);
    out[pre + 10] = '\0';
}

const char *mg_secret_strerror(int code)
{
    switch (code) {
    case MG_SECRET_OK: return "ok";
    case MG_SECRET_EINVAL: return "invalid argument";
    case MG_SECRET_EFORMAT: return "not a valid encrypted secret token";
    case MG_SECRET_EAUTH: return "secret failed authentication (wrong key or altered token)";
    case MG_SECRET_ENOMEM: return "out of memory";
    case MG_SECRET_ECRYPTO: return "crypto library or random generator failure";
    default: return "unknown error";
    }
}
