/* crypto: OpenSSL-backed random ids and digests; see crypto.h. */
#include "base/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <string.h>

#include "base/clock.h"

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

/* Request ids come from a per-thread block of CSPRNG output, refilled 4 KiB at a time, so
 * a request costs a memcpy rather than a RAND_bytes call (bench/README.md). The bytes are
 * used once and then wiped. */
static _Thread_local struct {
    unsigned char bytes[4096];
    size_t used;
} id_pool = {{0}, sizeof(id_pool.bytes)};

int mg_request_id(char *out)
{
    unsigned char raw[7];
    if (id_pool.used + sizeof(raw) > sizeof(id_pool.bytes)) {
        if (RAND_bytes(id_pool.bytes, sizeof(id_pool.bytes)) != 1) return -1;
        id_pool.used = 0;
    }
    memcpy(raw, id_pool.bytes + id_pool.used, sizeof(raw));
    OPENSSL_cleanse(id_pool.bytes + id_pool.used, sizeof(raw));
    id_pool.used += sizeof(raw);
    uint64_t ms = mg_unix_ms();
    memcpy(out, "req-", 4);
    for (int i = 10; i >= 0; i--, ms >>= 4) out[4 + i] = hexdig[ms & 15];
    char tail[15];
    to_hex(raw, sizeof(raw), tail);
    memcpy(out + 15, tail, 13);
    out[MG_REQUEST_ID_LEN] = '\0';
    return 0;
}

int mg_hex_digit(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

double mg_request_id_draw(const char *id)
{
    if (strlen(id) != MG_REQUEST_ID_LEN) return 0;
    unsigned long v = 0;
    for (const char *h = id + MG_REQUEST_ID_LEN - 6; *h; h++) {
        int d = mg_hex_digit(*h);
        if (d < 0) return 0;
        v = v << 4 | (unsigned long)d;
    }
    return (double)v / 16777216.0;
}

/* SHA-256 runs for every authenticated request (the key's digest): the algorithm is
 * fetched once and each thread keeps its digest context (freed when the thread ends),
 * which EVP_Digest() would look up and allocate on every call (bench/README.md). */
static EVP_MD *sha256_md;
static pthread_key_t sha256_ctx_key;
static int sha256_ready;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_ctx_free(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void sha256_setup(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    sha256_ready = sha256_md && pthread_key_create(&sha256_ctx_key, sha256_ctx_free) == 0;
}

/* This thread's digest context, or NULL. */
static EVP_MD_CTX *sha256_ctx(void)
{
    pthread_once(&sha256_once, sha256_setup);
    if (!sha256_ready) return NULL;
    EVP_MD_CTX *ctx = pthread_getspecific(sha256_ctx_key);
    if (!ctx && (ctx = EVP_MD_CTX_new()) && pthread_setspecific(sha256_ctx_key, ctx) != 0) {
        EVP_MD_CTX_free(ctx);
        ctx = NULL;
    }
    return ctx;
}

void mg_sha256_hex(const void *data, size_t n, char *out)
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx = sha256_ctx();
    if (!ctx || !EVP_DigestInit_ex2(ctx, sha256_md, NULL) || !EVP_DigestUpdate(ctx, data, n) ||
        !EVP_DigestFinal_ex(ctx, md, &mdlen))
        EVP_Digest(data, n, md, &mdlen, EVP_sha256(), NULL); /* the plain way, always works */
    to_hex(md, 32, out);
}

int mg_const_time_eq(const void *a, size_t alen, const void *b, size_t blen)
{
    if (alen != blen) return 0;
    return CRYPTO_memcmp(a, b, alen) == 0;
}
