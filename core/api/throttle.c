/* throttle: failed sign-ins per address; see throttle.h. */
#include "api/throttle.h"

#include <stdio.h>
#include <string.h>

void mg_throttle_addr(const char *peer, char *out, size_t cap)
{
    const char *end = peer[0] == '[' ? strchr(peer, ']') : strrchr(peer, ':');
    const char *start = peer[0] == '[' ? peer + 1 : peer;
    size_t n = end && end >= start ? (size_t)(end - start) : strlen(start);
    if (n >= cap) n = cap - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

static const mg_throttle_slot_t *find(const mg_throttle_t *t, const char *addr)
{
    for (int i = 0; i < MG_THROTTLE_SLOTS; i++)
        if (t->slots[i].addr[0] && strcmp(t->slots[i].addr, addr) == 0) return &t->slots[i];
    return NULL;
}

uint64_t mg_throttle_wait_ms(const mg_throttle_t *t, const char *addr, uint64_t now_ms)
{
    const mg_throttle_slot_t *s = find(t, addr);
    if (!s || s->failures < MG_THROTTLE_MAX || now_ms >= s->window_start + MG_THROTTLE_WINDOW_MS)
        return 0;
    return s->window_start + MG_THROTTLE_WINDOW_MS - now_ms;
}

void mg_throttle_fail(mg_throttle_t *t, const char *addr, uint64_t now_ms)
{
    mg_throttle_slot_t *s = (mg_throttle_slot_t *)find(t, addr);
    if (!s) { /* a free slot, else the one whose window started first */
        s = &t->slots[0];
        for (int i = 0; i < MG_THROTTLE_SLOTS && s->addr[0]; i++)
            if (!t->slots[i].addr[0] || t->slots[i].window_start < s->window_start) s = &t->slots[i];
        snprintf(s->addr, sizeof(s->addr), "%s", addr);
        s->failures = 0;
        s->window_start = now_ms;
    }
    if (now_ms >= s->window_start + MG_THROTTLE_WINDOW_MS) {
        s->window_start = now_ms;
        s->failures = 0;
    }
    s->failures++;
}
