/* authfail: see authfail.h. */
#include "admin/authfail.h"

#include <stdio.h>
#include <string.h>

void mg_authfail_addr(const char *peer, char *out, size_t cap)
{
    const char *end = strrchr(peer, ':');
    size_t n = end ? (size_t)(end - peer) : strlen(peer);
    if (n >= cap) n = cap - 1;
    memcpy(out, peer, n);
    out[n] = '\0';
}

static const mg_authfail_slot_t *find(const mg_authfail_t *t, const char *addr)
{
    for (size_t i = 0; i < MG_AUTHFAIL_SLOTS; i++)
        if (t->slots[i].addr[0] && strcmp(t->slots[i].addr, addr) == 0) return &t->slots[i];
    return NULL;
}

int mg_authfail_blocked(const mg_authfail_t *t, const char *addr, uint64_t now_ms,
                        uint64_t *retry_ms)
{
    const mg_authfail_slot_t *s = find(t, addr);
    if (!s || s->failures < MG_AUTHFAIL_MAX || now_ms >= s->window_start_ms + MG_AUTHFAIL_WINDOW_MS)
        return 0;
    *retry_ms = s->window_start_ms + MG_AUTHFAIL_WINDOW_MS - now_ms;
    return 1;
}

void mg_authfail_count(mg_authfail_t *t, const char *addr, uint64_t now_ms)
{
    mg_authfail_slot_t *s = (mg_authfail_slot_t *)find(t, addr);
    if (!s) { /* a free slot, else the one whose window is oldest */
        s = &t->slots[0];
        for (size_t i = 0; i < MG_AUTHFAIL_SLOTS && s->addr[0]; i++)
            if (!t->slots[i].addr[0] || t->slots[i].window_start_ms < s->window_start_ms)
                s = &t->slots[i];
        snprintf(s->addr, sizeof(s->addr), "%s", addr);
        s->failures = 0;
        s->window_start_ms = now_ms;
    }
    if (now_ms >= s->window_start_ms + MG_AUTHFAIL_WINDOW_MS) {
        s->window_start_ms = now_ms;
        s->failures = 0;
    }
    s->failures++;
}
