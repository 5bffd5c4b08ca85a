/* backlog: what an instance admitted and charged while Redis could not answer, kept to be
 * given back to Redis when it answers again (issue 24: "counters reconcile when it returns").
 *
 * Without it, a Redis that comes back knows nothing of the degraded minute: the shared RPM and
 * TPM windows would admit a whole limit again on top of what every instance let through
 * locally, and the spend periods would miss what was charged meanwhile.
 *
 * Admissions are kept per (level, second): a count and a token sum, never one entry per
 * request, so a degraded minute costs at most MG_BACKLOG_BUCKETS entries; only the last 60
 * seconds matter (older ones have left every window), the rest is aged out. Spend is kept per
 * (spend level, day, month) as the micros charged. What does not fit is counted as dropped.
 * Loop thread only. */
#ifndef MG_CLUSTER_BACKLOG_H
#define MG_CLUSTER_BACKLOG_H

#include <stddef.h>
#include <stdint.h>

#include "cluster/limits.h"

#define MG_BACKLOG_BUCKETS 2048
#define MG_BACKLOG_SPEND 64
#define MG_BACKLOG_WINDOW_MS 60000

typedef struct mg_backlog_bucket_s {
    char name[MG_SHARED_NAME_MAX]; /* "k:12", "p:3", "v:openai" */
    uint64_t sec;                  /* unix second of the admissions */
    uint64_t last_ms;              /* the newest admission's unix ms */
    uint32_t count;                /* admissions (the RPM log's members) */
    uint64_t tokens;               /* their estimated tokens (the TPM window) */
    uint8_t rpm, tpm;              /* which windows the level has */
} mg_backlog_bucket_t;

typedef struct mg_backlog_spend_s {
    char name[MG_SHARED_NAME_MAX]; /* "k:12", "p:3", "t:1" */
    char day[16], month[16];
    int64_t micros;
} mg_backlog_spend_t;

typedef struct mg_backlog_s {
    mg_backlog_bucket_t b[MG_BACKLOG_BUCKETS]; /* a ring, oldest at head */
    size_t head, n;
    mg_backlog_spend_t sp[MG_BACKLOG_SPEND];
    size_t nsp;
    unsigned long long dropped; /* admissions or charges that did not fit */
} mg_backlog_t;

/* One admission made without Redis at now_ms: each level with an RPM or TPM limit. */
void mg_backlog_admit(mg_backlog_t *bl, const mg_shared_level_t *lv, size_t n, uint64_t tokens,
                      uint64_t now_ms);
/* A request's cost charged without Redis: sp->micros to each of its levels' periods. */
void mg_backlog_spend(mg_backlog_t *bl, const mg_shared_spend_t *sp);
/* Forget the buckets that have left the window by now_ms. */
void mg_backlog_age(mg_backlog_t *bl, uint64_t now_ms);
/* 1 when there is something to give back. */
int mg_backlog_pending(const mg_backlog_t *bl);
/* Take up to max buckets out (oldest first) into out; the number taken. */
size_t mg_backlog_take(mg_backlog_t *bl, mg_backlog_bucket_t *out, size_t max);
/* Take up to max spend entries out into out; the number taken. */
size_t mg_backlog_take_spend(mg_backlog_t *bl, mg_backlog_spend_t *out, size_t max);

#endif
