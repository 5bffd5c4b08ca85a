/* siphash: SipHash-2-4-128; see siphash.h. */
#include "base/siphash.h"

#include <string.h>

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

/* 8 bytes as a little-endian number, whatever the machine's byte order. */
static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

typedef struct {
    uint64_t v0, v1, v2, v3;
} sip_state_t;

static inline void sip_round(sip_state_t *s)
{
    s->v0 += s->v1;
    s->v1 = rotl(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = rotl(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = rotl(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = rotl(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = rotl(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = rotl(s->v2, 32);
}

/* One message word: two compression rounds (the "2" of SipHash-2-4). */
static inline void sip_word(sip_state_t *s, uint64_t m)
{
    s->v3 ^= m;
    sip_round(s);
    sip_round(s);
    s->v0 ^= m;
}

/* Four finalisation rounds (the "4"), then the state folded into 64 bits. */
static inline uint64_t sip_final(sip_state_t *s, uint64_t mark)
{
    s->v2 ^= mark;
    for (int i = 0; i < 4; i++) sip_round(s);
    return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

void mg_siphash128(const void *in, size_t n, const uint8_t key[16], uint64_t out[2])
{
    const uint8_t *p = in;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    sip_state_t s = {k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL,
                     k0 ^ 0x6c7967656e657261ULL, k1 ^ 0x7465646279746573ULL};
    s.v1 ^= 0xee; /* the 128-bit variant */
    size_t whole = n - n % 8;
    for (size_t i = 0; i < whole; i += 8) sip_word(&s, load_le64(p + i));
    /* the last word: the 0-7 bytes left, and the length's low byte on top */
    uint8_t last[8] = {0};
    memcpy(last, p + whole, n - whole);
    sip_word(&s, load_le64(last) | (uint64_t)(n & 0xff) << 56);
    out[0] = sip_final(&s, 0xee);
    s.v1 ^= 0xdd;
    out[1] = sip_final(&s, 0);
}
