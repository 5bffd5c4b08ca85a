/* secret: provider secrets at rest (AES-256-GCM) and on screen (masked).
 *
 * A provider API key is stored as a self-describing text token:
 *
 *     "v1:" + base64(nonce[12] | ciphertext[n] | tag[16])
 *
 * encrypted with AES-256-GCM under the 32-byte key given to the process as 64 hex
 * characters in MOONGATE_ENCRYPTION_KEY. Every encryption draws a fresh random 96-bit
 * nonce; the version string "v1" is authenticated as additional data. Decryption
 * checks the tag before it hands out a single byte, so a token altered in any way (one
 * bit, a truncation, a different key) fails with MG_SECRET_EAUTH or MG_SECRET_EFORMAT.
 *
 * Nothing in this module logs, and no error message contains key or secret material.
 * Plaintexts returned to the caller are wiped by mg_secret_free(). */
#ifndef MG_SECRET_H
#define MG_SECRET_H

#include <stddef.h>

#define MG_SECRET_KEY_LEN 32      /* AES-256 key bytes */
#define MG_SECRET_KEY_HEX_LEN 64  /* the key as hex characters */
#define MG_SECRET_NONCE_LEN 12    /* GCM nonce bytes */
#define MG_SECRET_TAG_LEN 16      /* GCM tag bytes */
#define MG_SECRET_MAX_PLAIN 65536 /* largest secret accepted, in bytes */
#define MG_SECRET_MASK_MAX 24     /* buffer size for mg_secret_mask() */
#define MG_SECRET_ENV "MOONGATE_ENCRYPTION_KEY"
#define MG_SECRET_ENV_SIDECAR "SIDECAR_ENCRYPTION_KEY" /* read when MG_SECRET_ENV is unset */

/* Return codes: 0 = ok, negative = error. */
enum {
    MG_SECRET_OK = 0,
    MG_SECRET_EINVAL = -1,  /* bad argument: NULL, too long, bad key text */
    MG_SECRET_EFORMAT = -2, /* not a "v1:" token, bad base64, too short */
    MG_SECRET_EAUTH = -3,   /* authentication failed: tampered token or wrong key */
    MG_SECRET_ENOMEM = -4,
    MG_SECRET_ECRYPTO = -5 /* the random generator or OpenSSL failed */
};

/* A parsed encryption key. Wipe it with mg_secret_key_wipe() when done. */
typedef struct mg_secret_key_s {
    unsigned char bytes[MG_SECRET_KEY_LEN];
} mg_secret_key_t;

/* Parse exactly 64 hex characters (either case, no spaces, no "0x") into key.
 * On error returns MG_SECRET_EINVAL and, when err is not NULL, writes a message that
 * names what is wrong (length, position of a non-hex character) but never the text
 * itself. `what` names the source in the message (e.g. "MOONGATE_ENCRYPTION_KEY");
 * NULL means "encryption key". key is untouched on error. */
int mg_secret_key_parse_hex(const char *hex, const char *what, mg_secret_key_t *key, char *err,
                            size_t errlen);

/* Read and parse MOONGATE_ENCRYPTION_KEY from the environment (SIDECAR_ENCRYPTION_KEY, the
 * Sidecar's name, when that one is unset or empty). Returns 0, or
 * MG_SECRET_EINVAL with a message in err when it is unset, empty or malformed. */
int mg_secret_key_from_env(mg_secret_key_t *key, char *err, size_t errlen);

/* Overwrite the key bytes with zeros in a way the compiler cannot elide. */
void mg_secret_key_wipe(mg_secret_key_t *key);

/* Write 32 fresh CSPRNG bytes as 64 lowercase hex + NUL into out[65] (`moongate keygen`).
 * Returns 0, or MG_SECRET_ECRYPTO when the random generator failed (out is then "").
 * The result is a valid input for mg_secret_key_parse_hex(). */
int mg_secret_keygen_hex(char *out);

/* Encrypt n bytes of plain under key. On success *token is a malloc'd NUL-terminated
 * "v1:..." string owned by the caller (free()); it holds no secret in the clear.
 * Errors: MG_SECRET_EINVAL (NULL argument, n > MG_SECRET_MAX_PLAIN), MG_SECRET_ENOMEM,
 * MG_SECRET_ECRYPTO; *token is NULL then. An empty secret (n == 0) is allowed. */
int mg_secret_encrypt(const mg_secret_key_t *key, const void *plain, size_t n, char **token);

/* Decrypt a token made by mg_secret_encrypt(). On success *plain is a malloc'd buffer of
 * *n bytes followed by a NUL (so text secrets can be used as C strings), owned by the
 * caller, to be released with mg_secret_free(*plain, *n). n may be NULL.
 * Errors: MG_SECRET_EFORMAT (not a well-formed v1 token: wrong prefix, non-canonical
 * base64, too short), MG_SECRET_EAUTH (the tag does not verify: the token was altered or
 * the key is wrong), MG_SECRET_EINVAL, MG_SECRET_ENOMEM, MG_SECRET_ECRYPTO; *plain is
 * NULL then and no partial plaintext is left in memory. */
int mg_secret_decrypt(const mg_secret_key_t *key, const char *token, char **plain, size_t *n);

/* Wipe n + 1 bytes of a plaintext returned by mg_secret_decrypt() and free it.
 * NULL is allowed. */
void mg_secret_free(char *plain, size_t n);

/* Key rotation: decrypt token under old_key and encrypt the plaintext again under
 * new_key with a fresh nonce. On success *out is a new malloc'd token (free()).
 * Fails with the mg_secret_decrypt() / mg_secret_encrypt() codes; the intermediate
 * plaintext is wiped in every case. */
int mg_secret_reencrypt(const mg_secret_key_t *old_key, const mg_secret_key_t *new_key,
                        const char *token, char **out);

/* 1 when s has the shape of a v1 token ("v1:" + canonical base64 long enough for a
 * nonce and a tag), 0 otherwise. Says nothing about whether it decrypts; useful to tell
 * encrypted values from plaintext ones when migrating a store. */
int mg_secret_is_token(const char *s);

/* Masked form of a secret for display and logs, into out[MG_SECRET_MASK_MAX], as the
 * Sidecar ADR shows keys (its first 6 and last 4 characters):
 *
 *     first six + "*****" + "-" + last four      e.g. "nvapi-*****-a1b2"
 *
 * Shorter secrets show less: from 24 characters the first six and the last four (at most
 * 10 of 24); from 16, the first two and the last four; from 12, the last four alone; below
 * 12, "*****" alone. The mask's width does not grow with the secret, so its length is not
 * revealed. NULL or "" gives "". */
void mg_secret_mask(const char *secret, char *out);

/* A short static English description of a MG_SECRET_* code. */
const char *mg_secret_strerror(int code);

#endif
