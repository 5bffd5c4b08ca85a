/* recent: the last finished inference requests, kept in a fixed ring for the dashboard's
 * request tail (api/stream.c). Pushing one is a copy of a few fixed-size fields: no
 * allocation, no lock, nothing per reader. Loop thread only.
 *
 * Each entry gets the next sequence number (1, 2, ...); a reader that remembers the last
 * one it saw (an SSE Last-Event-ID) asks for what came after it, and learns how many it
 * missed when the ring went round in between. Never a prompt, never a key: ids, names,
 * numbers. */
#ifndef MG_OBS_RECENT_H
#define MG_OBS_RECENT_H

#include <stdint.h>

#define MG_RECENT_CAP 256

typedef struct mg_recent_entry_s {
    uint64_t seq;
    int64_t at_ms; /* unix ms when it finished */
    char request_id[40];
    char path[32];
    char model[64];    /* the logical model, or "" */
    char provider[64]; /* the provider that answered (or was tried last), or "" */
    char outcome[16];  /* "ok", "error", "cancelled", ... */
    char error[32];    /* the error code, or "" */
    int status;
    int stream;
    double duration_ms;
    double ttft_ms; /* 0 = no first token */
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t tenant_id; /* 0 = no key (open mode) */
    int64_t key_id;
} mg_recent_entry_t;

typedef struct mg_recent_s {
    mg_recent_entry_t ring[MG_RECENT_CAP];
    uint64_t next_seq; /* the sequence number of the next push (starts at 1) */
} mg_recent_t;

void mg_recent_init(mg_recent_t *r);
/* Copy e into the ring (its seq is set); the oldest entry goes when full. */
void mg_recent_push(mg_recent_t *r, const mg_recent_entry_t *e);
/* The entry with sequence number seq, or NULL when it is not (or no longer) in the ring. */
const mg_recent_entry_t *mg_recent_get(const mg_recent_t *r, uint64_t seq);
/* The oldest sequence number still held (next_seq when empty). */
uint64_t mg_recent_first(const mg_recent_t *r);

#endif
