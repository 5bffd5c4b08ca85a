/* backlog: see backlog.h. */
#include "cluster/backlog.h"

#include <stdio.h>
#include <string.h>

static mg_backlog_bucket_t *at(mg_backlog_t *bl, size_t i)
{
    return &bl->b[(bl->head + i) % MG_BACKLOG_BUCKETS];
}

void mg_backlog_age(mg_backlog_t *bl, uint64_t now_ms)
{
    while (bl->n && at(bl, 0)->last_ms + MG_BACKLOG_WINDOW_MS <= now_ms) {
        bl->head = (bl->head + 1) % MG_BACKLOG_BUCKETS;
        bl->n--;
    }
}

/* The bucket of (name, sec): admissions come in time order, so it is among the newest, those
 * of the same second at the ring's end. */
static mg_backlog_bucket_t *bucket_of(mg_backlog_t *bl, const char *name, uint64_t sec)
{
    for (size_t i = bl->n; i-- > 0;) {
        mg_backlog_bucket_t *b = at(bl, i);
        if (b->sec != sec) break;
        if (strcmp(b->name, name) == 0) return b;
    }
    if (bl->n == MG_BACKLOG_BUCKETS) return NULL;
    mg_backlog_bucket_t *b = at(bl, bl->n++);
    memset(b, 0, sizeof(*b));
    snprintf(b->name, sizeof(b->name), "%s", name);
    b->sec = sec;
    return b;
}

void mg_backlog_admit(mg_backlog_t *bl, const mg_shared_level_t *lv, size_t n, uint64_t tokens,
                      uint64_t now_ms)
{
    mg_backlog_age(bl, now_ms);
    for (size_t i = 0; i < n; i++) {
        if (!lv[i].rpm && !lv[i].tpm) continue; /* a concurrency lease ends with its request */
        mg_backlog_bucket_t *b = bucket_of(bl, lv[i].name, now_ms / 1000);
        if (!b) {
            bl->dropped++;
            continue;
        }
        b->last_ms = now_ms;
        b->count++;
        b->tokens += tokens;
        b->rpm |= lv[i].rpm > 0;
        b->tpm |= lv[i].tpm > 0;
    }
}

void mg_backlog_spend(mg_backlog_t *bl, const mg_shared_spend_t *sp)
{
    if (sp->micros <= 0) return;
    for (size_t j = 0; j < sp->n; j++) {
        mg_backlog_spend_t *e = NULL;
        for (size_t k = 0; k < bl->nsp && !e; k++)
            if (strcmp(bl->sp[k].name, sp->lv[j].name) == 0 && strcmp(bl->sp[k].day, sp->day) == 0)
                e = &bl->sp[k];
        if (!e && bl->nsp < MG_BACKLOG_SPEND) {
            e = &bl->sp[bl->nsp++];
            memset(e, 0, sizeof(*e));
            snprintf(e->name, sizeof(e->name), "%s", sp->lv[j].name);
            snprintf(e->day, sizeof(e->day), "%s", sp->day);
            snprintf(e->month, sizeof(e->month), "%s", sp->month);
        }
        if (e) e->micros += sp->micros;
        else bl->dropped++;
    }
}

int mg_backlog_pending(const mg_backlog_t *bl)
{
    return bl->n > 0 || bl->nsp > 0;
}

size_t mg_backlog_take(mg_backlog_t *bl, mg_backlog_bucket_t *out, size_t max)
{
    size_t k = 0;
    for (; k < max && bl->n; k++) {
        out[k] = *at(bl, 0);
        bl->head = (bl->head + 1) % MG_BACKLOG_BUCKETS;
        bl->n--;
    }
    return k;
}

size_t mg_backlog_take_spend(mg_backlog_t *bl, mg_backlog_spend_t *out, size_t max)
{
    size_t k = bl->nsp < max ? bl->nsp : max;
    memcpy(out, bl->sp, k * sizeof(*out));
    memmove(bl->sp, bl->sp + k, (bl->nsp - k) * sizeof(*out));
    bl->nsp -= k;
    return k;
}
