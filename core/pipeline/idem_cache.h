/* idem_cache: the in-memory part of the idempotency records, bounded per group.
 *
 * Entries are keyed by their id (the hex SHA-256 of scope and key, idem.c) and belong to a
 * group: the caller's tenant when auth is on, one group for everyone otherwise. An entry is
 * pending (its request runs, or its record is being committed or looked up; idem.c owns
 * what waits on it) or done (the stored answer, replayable until expires_ms). Each group
 * keeps at most max_per_group done entries: completing one more pushes the group's oldest
 * done entry out, so a tenant spraying keys only ever evicts its own. An evicted record is
 * still in the store; the group remembers until when such a record may be live
 * (mg_idem_cache_may_be_stored), and for that long idem.c reads the store on a miss.
 * Pending entries are not capped here: they are bounded by the requests in flight.
 *
 * Lookups hash the id with SipHash under a random key, so chosen keys cannot pile up in
 * one bucket. Loop thread only; no locks. */
#ifndef MG_IDEM_CACHE_H
#define MG_IDEM_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct mg_idem_group_s mg_idem_group_t;

typedef struct mg_idem_entry_s {
    struct mg_idem_entry_s *hnext;         /* the id's hash chain */
    struct mg_idem_entry_s *prev, *next;   /* the group's done entries, oldest first */
    struct mg_idem_entry_s *eprev, *enext; /* all done entries in completion order (expiry) */
    mg_idem_group_t *group;
    char id[65];
    int done;           /* the answer is stored and replayable */
    int status, stream; /* done: the answer */
    char *body;         /* owned, done only */
    size_t len;
    int64_t expires_ms; /* done: wall-clock ms after which it is gone */
    void *owner;        /* the caller's while pending (idem.c's run), never touched here */
} mg_idem_entry_t;

typedef struct mg_idem_cache_s {
    mg_idem_entry_t **buckets;
    size_t n_buckets, n_entries;
    mg_idem_group_t **gbuckets;
    size_t n_gbuckets, n_groups;
    mg_idem_entry_t *oldest, *newest; /* all done entries, completion order */
    int max_per_group;
    uint64_t evicted_total;
    uint8_t key[16]; /* SipHash key */
} mg_idem_cache_t;

/* Empty cache keeping at most max_per_group done entries per group. 0 or -1 (no memory). */
int mg_idem_cache_init(mg_idem_cache_t *c, int max_per_group);
/* Free every entry (pending ones too: their owners must be gone) and group. */
void mg_idem_cache_free(mg_idem_cache_t *c);

/* The entry of id, or NULL; a done entry past its expiry (at now_ms) is removed and not
 * returned. */
mg_idem_entry_t *mg_idem_cache_find(mg_idem_cache_t *c, const char *id, int64_t now_ms);

/* A new pending entry for id (not present) in group (a short name, copied). NULL when out
 * of memory. */
mg_idem_entry_t *mg_idem_cache_add(mg_idem_cache_t *c, const char *id, const char *group);

/* The pending entry's answer is stored: it becomes done with status, stream and body
 * (taken over: malloc'd, NUL-terminated, len bytes) until expires_ms, and its group's oldest
 * done entries beyond the cap are freed. Returns how many were evicted. */
int mg_idem_cache_complete(mg_idem_cache_t *c, mg_idem_entry_t *e, int status, int stream,
                           char *body, size_t len, int64_t expires_ms);

/* Unlink and free an entry (pending or done). */
void mg_idem_cache_remove(mg_idem_cache_t *c, mg_idem_entry_t *e);

/* Free done entries whose expiry passed (oldest completions first). */
void mg_idem_cache_prune(mg_idem_cache_t *c, int64_t now_ms);

/* Records of group (a name) that are not in memory may still be live in the store at now_ms
 * (the group evicted some, or had more at start-up than its cap allows): a miss must look
 * there. */
int mg_idem_cache_may_be_stored(const mg_idem_cache_t *c, const char *group, int64_t now_ms);

/* Group has records in the store that live until expires_ms and are not in memory (start-up
 * read only the newest of them). 0 or -1 (no memory). */
int mg_idem_cache_note_stored(mg_idem_cache_t *c, const char *group, int64_t expires_ms);

/* Done entries of group in memory (0 for an unknown group). */
size_t mg_idem_cache_group_count(const mg_idem_cache_t *c, const char *group);

#endif
