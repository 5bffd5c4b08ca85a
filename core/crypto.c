/* crypto: OpenSSL-backed random ids and digests; see crypto.h. */
#include "crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <string.h>

static const char hexdig[] = "0123456789abcdef";

static void to_hex(const unsigned char *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hexdig[in[i] >> 4];
        out[2 * i + 1] = hexdig[in[i] & 15];
    }
    out[2 * n] = '\0';
}

int mg_random_bytes(void *buf, size_t n)
{
    return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}

int mg_request_id(char *out)
{
    unsigned char raw[12];
    if (mg_random_bytes(raw, sizeof(raw)) != 0) return -1;
    memcpy(out, "req-", 4);
    to_hex(raw, sizeof(raw), out + 4);
    return 0;
}

void mg_sha256_hex(const void *data, size_t n, char *out)
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, n, md, &mdlen, EVP_sha256(), NULL);
    to_hex(md, 32, out);
}

int mg_const_time_eq(const void *a, size_t alen, const void *b, size_t blen)
{
    if (alen != blen) return 0;
    return CRYPTO_memcmp(a, b, alen) == 0;
}
