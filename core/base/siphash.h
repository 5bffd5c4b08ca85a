/* siphash: SipHash-2-4 with a 128-bit tag (Aumasson and Bernstein, "SipHash: a fast short-input
 * PRF"), written from the paper.
 *
 * A keyed pseudo-random function: without the 16-byte key, its tags can be neither predicted
 * nor made to collide on purpose. The key index (keys.c) uses it to recognise a key presented
 * before without computing its SHA-256 again: a tag match under a secret random key stands for
 * "the same bytes" with a 2^-128 chance of error, and the tag reveals nothing of the key.
 * SHA-256 remains the digest the store keeps. */
#ifndef MG_SIPHASH_H
#define MG_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* The tag of in[0..n) under key: out[0] and out[1] are the two 64-bit halves (as bytes, each
 * little-endian, first out[0]: the reference implementation's 16 output bytes). */
void mg_siphash128(const void *in, size_t n, const uint8_t key[16], uint64_t out[2]);

#endif
