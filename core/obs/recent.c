/* recent: a ring of the last finished requests; see recent.h. */
#include "obs/recent.h"

#include <string.h>

void mg_recent_init(mg_recent_t *r)
{
    memset(r, 0, sizeof(*r));
    r->next_seq = 1;
}

void mg_recent_push(mg_recent_t *r, const mg_recent_entry_t *e)
{
    mg_recent_entry_t *slot = &r->ring[r->next_seq % MG_RECENT_CAP];
    *slot = *e;
    slot->seq = r->next_seq++;
}

uint64_t mg_recent_first(const mg_recent_t *r)
{
    return r->next_seq > MG_RECENT_CAP ? r->next_seq - MG_RECENT_CAP : 1;
}

const mg_recent_entry_t *mg_recent_get(const mg_recent_t *r, uint64_t seq)
{
    if (seq < mg_recent_first(r) || seq >= r->next_seq) return NULL;
    return &r->ring[seq % MG_RECENT_CAP];
}
