/* crypto: random identifiers and hashing (OpenSSL).
 *
 * Request ids are 96 random bits from the OpenSSL CSPRNG, so they cannot be guessed
 * from earlier ones. Hashing small inputs is cheap enough for the loop thread. */
#ifndef MG_CRYPTO_H
#define MG_CRYPTO_H

#include <stddef.h>

#define MG_REQUEST_ID_LEN 28 /* "req-" + 24 hex chars */

/* Write a NUL-terminated request id ("req-" + 24 lowercase hex) into out[MG_REQUEST_ID_LEN + 1]:
 * 11 hex of the unix time in ms, then 13 random (52 bits). Ids sort by time, so the unique
 * index on usage_events.request_id (and the ledger's) grows at its right edge: a random key
 * would dirty a random index page per event (bench/README.md). Returns 0, or -1 when the
 * random generator failed. */
int mg_request_id(char *out);
/* A number in [0,1) from the last 24 bits of a request id: the request's own random draw
 * (0 for an id that is not one of ours). */
double mg_request_id_draw(const char *id);
/* The value of one hex digit (either case), or -1. */
int mg_hex_digit(char c);
/* Fill buf with n random bytes; 0 or -1. */
int mg_random_bytes(void *buf, size_t n);
/* SHA-256 of data as 64 lowercase hex chars + NUL into out[65]. */
void mg_sha256_hex(const void *data, size_t n, char *out);
/* Compare two buffers in time independent of their contents; 1 when equal. */
int mg_const_time_eq(const void *a, size_t alen, const void *b, size_t blen);

#endif
