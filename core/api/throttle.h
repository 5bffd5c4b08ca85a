/* throttle: failed dashboard sign-ins per client address, so that guessing the admin token
 * from one address is slow: past MG_THROTTLE_MAX failures within a minute that address gets
 * 429 until the minute is over. A fixed table (the least recently failing address makes room);
 * a success does not reset the count. Loop thread only. */
#ifndef MG_API_THROTTLE_H
#define MG_API_THROTTLE_H

#include <stddef.h>
#include <stdint.h>

#define MG_THROTTLE_SLOTS 64
#define MG_THROTTLE_MAX 10
#define MG_THROTTLE_WINDOW_MS 60000

typedef struct mg_throttle_slot_s {
    char addr[64];          /* the client's IP (no port); "" = free */
    uint64_t window_start;  /* ms */
    int failures;
} mg_throttle_slot_t;

typedef struct mg_throttle_s {
    mg_throttle_slot_t slots[MG_THROTTLE_SLOTS];
} mg_throttle_t;

/* ms until addr may try again (0: now). */
uint64_t mg_throttle_wait_ms(const mg_throttle_t *t, const char *addr, uint64_t now_ms);
/* Count one failure of addr at now_ms. */
void mg_throttle_fail(mg_throttle_t *t, const char *addr, uint64_t now_ms);
/* The IP part of "ip:port" / "[ip]:port" into out. */
void mg_throttle_addr(const char *peer, char *out, size_t cap);

#endif
