/* authfail: failed admin sign-ins counted per client address, so that guessing the admin
 * token from one address is slowed to a trickle (and every failure is audited by the caller).
 *
 * At most MG_AUTHFAIL_MAX failures per address in a window of MG_AUTHFAIL_WINDOW_MS; past
 * that the address is refused (429 with Retry-After: the window's end) without the token
 * being looked at. A fixed table of MG_AUTHFAIL_SLOTS addresses: a new address takes the slot
 * whose window is oldest, so the table never grows. Loop thread only. */
#ifndef MG_AUTHFAIL_H
#define MG_AUTHFAIL_H

#include <stddef.h>
#include <stdint.h>

#define MG_AUTHFAIL_MAX 10
#define MG_AUTHFAIL_WINDOW_MS 60000
#define MG_AUTHFAIL_SLOTS 256

typedef struct mg_authfail_slot_s {
    char addr[64]; /* the client address without its port; "" = free */
    uint64_t window_start_ms;
    uint32_t failures;
} mg_authfail_slot_t;

typedef struct mg_authfail_s {
    mg_authfail_slot_t slots[MG_AUTHFAIL_SLOTS];
} mg_authfail_t;

/* The address part of a peer as net/http.h writes it ("1.2.3.4:5678", "[::1]:5678"). */
void mg_authfail_addr(const char *peer, char *out, size_t cap);

/* Whether addr is refused now; when it is, *retry_ms says for how long. */
int mg_authfail_blocked(const mg_authfail_t *t, const char *addr, uint64_t now_ms,
                        uint64_t *retry_ms);

/* One more failure from addr. */
void mg_authfail_count(mg_authfail_t *t, const char *addr, uint64_t now_ms);

#endif
