/* session: server-side conversations (edge PRD 3.3.1): a session's settings and its
 * messages, kept in memory and served from there; persisted through the store's writer
 * thread when context.enable_prompt_persistence is on.
 *
 * Memory: every session lives in a hash table by id and in an LRU list. With persistence
 * off the content exists only here, bounded by context.memory_budget_bytes: past it the
 * least recently used sessions that no request holds are dropped (and a restart loses them
 * all, by design). With persistence on every change is queued to the writer thread
 * (mg_store_write: the loop never waits) and the sessions are read back at start-up; the
 * budget does not evict then (the disk holds what memory holds).
 *
 * Expiry: a session expires ttl_seconds after it was made or idle_timeout_seconds after it
 * was last active, whichever comes first. An expired session is never found; the sweep
 * (at most once a second, from the calls below) drops it from memory and queues the
 * deletion of its rows; start-up prunes the rows of those that expired meanwhile.
 *
 * Ownership: a session belongs to its creator's tenant and key project; a caller of
 * another gets "not found". Loop thread only. */
#ifndef MG_SESSION_H
#define MG_SESSION_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "conf/context.h"
#include "store/store.h"

#define MG_SESSION_ID_LEN 29 /* "sess_" + 24 hex */

/* Who asks: every session (open mode, the platform admin) or a tenant's project's. */
typedef struct mg_session_owner_s {
    int all;
    int64_t tenant_id;
    int64_t project_id;
} mg_session_owner_t;

typedef struct mg_session_msg_s {
    int64_t seq; /* 1, 2, ... in the session: the messages' cursor */
    int64_t created_ms;
    long tokens;  /* by the chat rule (token/chat.h), -1: not counted (no encoding) */
    int encoding; /* the encoding id tokens was counted with (token/encoding.h); -1: not
                     known (read back from the store: counted again when used) */
    char *json;   /* owned: the message object as JSON text */
} mg_session_msg_t;

/* A request waiting for a held session (context.busy: wait), in the order they came. */
typedef struct mg_session_waiter_s {
    struct mg_session_waiter_s *next;
    void *ud; /* the waiting request */
} mg_session_waiter_t;

typedef struct mg_session_s {
    struct mg_session_s *hnext;               /* hash chain */
    struct mg_session_s *lru_prev, *lru_next; /* most recently used first */
    char id[MG_SESSION_ID_LEN + 1];
    int64_t tenant_id, project_id; /* the owner */
    char *model;                   /* owned, may be NULL: the default model of its requests */
    char *system;                  /* owned, may be NULL: the application's system prompt */
    char *policy;                  /* owned, may be NULL: its context_policy */
    char *metadata;                /* owned, may be NULL: a JSON object as text */
    int max_messages;              /* kept at most (the oldest dropped past it) */
    long long max_tokens;          /* the history's token budget (0: the model's alone) */
    int ttl_s, idle_s;
    int64_t created_ms, last_active_ms;
    char *summary;          /* owned, may be NULL: what replaced the earlier turns */
    mg_session_msg_t *msgs; /* owned array, oldest first */
    size_t n_msgs, cap_msgs;
    int64_t next_seq;
    size_t bytes;       /* content bytes, for the memory budget */
    const void *holder; /* the request holding the session (one at a time), or NULL */
    mg_session_waiter_t *wait_head, *wait_tail; /* borrowed: the requests waiting for it */
    char summary_req[40]; /* the request id of the summary call under way, or "" */
    int64_t summary_upto; /* the last seq that call summarises */
} mg_session_t;

typedef struct mg_sessions_s mg_sessions_t;

/* The sessions, read back from st when persist (before the loop runs: it reads the
 * database). st may be NULL (memory only). NULL when out of memory. */
mg_sessions_t *mg_sessions_open(mg_store_t *st, int persist, int64_t now_ms);
void mg_sessions_free(mg_sessions_t *s);

/* What a new session is made with: NULL/0 fields take the context config's defaults. */
typedef struct mg_session_spec_s {
    const char *model, *system, *policy, *metadata;
    int max_messages;
    long long max_tokens;
    int ttl_s, idle_s;
} mg_session_spec_t;

/* A new session for owner (its id random). NULL when out of memory. */
mg_session_t *mg_sessions_create(mg_sessions_t *s, const mg_session_owner_t *owner,
                                 const mg_session_spec_t *spec, const mg_context_conf_t *conf,
                                 int64_t now_ms);
/* The live session id that owner may see, or NULL. Sweeps first (at most once a second). */
mg_session_t *mg_sessions_find(mg_sessions_t *s, const char *id, const mg_session_owner_t *owner,
                               const mg_context_conf_t *conf, int64_t now_ms);
/* Delete a session now: gone from memory, its rows' deletion queued. Not while held. */
void mg_sessions_delete(mg_sessions_t *s, mg_session_t *sess);
/* Append one message (its JSON text copied) counted `tokens` with `encoding`; drops the oldest past
 * max_messages, never leaving a tool result without the call before it. 0 or -1. */
int mg_sessions_append(mg_sessions_t *s, mg_session_t *sess, const char *json, long tokens,
                       int encoding, int64_t now_ms);
/* The session was used now (its idle clock restarts); persisted. */
void mg_sessions_touch(mg_sessions_t *s, mg_session_t *sess, int64_t now_ms);
/* The waiting list: w (the waiter's own) queued last; removed (wherever it is; absent is
 * fine); the first taken off (NULL when none). */
void mg_session_wait(mg_session_t *sess, mg_session_waiter_t *w);
void mg_session_unwait(mg_session_t *sess, mg_session_waiter_t *w);
mg_session_waiter_t *mg_session_next_waiter(mg_session_t *sess);
/* The summary call under way for sess (request id, the last seq it covers). */
void mg_sessions_summary_started(mg_session_t *sess, const char *request_id, int64_t upto_seq);
/* The session whose summary call has that request id, or NULL (gone, or another call's). */
mg_session_t *mg_sessions_by_summary(mg_sessions_t *s, const char *request_id);
/* The summary call ended: with summary (NULL: it failed, nothing changes), it replaces the
 * messages up to the seq it covered; persisted. */
void mg_sessions_summary_done(mg_sessions_t *s, mg_session_t *sess, const char *summary);
/* Sum of the kept messages' tokens (uncounted ones as 0). */
long long mg_session_tokens(const mg_session_t *sess);
/* When it expires (unix ms). */
int64_t mg_session_expires_ms(const mg_session_t *sess);
/* What the context step did, counted for /metrics: a trimming step that ran (by name), a
 * request refused as too large, a summary call's end (ok or not). */
void mg_sessions_count_trim(mg_sessions_t *s, const char *step);
void mg_sessions_count_too_large(mg_sessions_t *s);
void mg_sessions_count_summary(mg_sessions_t *s, int ok);
/* The sessions' metrics in the Prometheus text format, appended to out (a mg_buf_t). */
struct mg_buf_s;
void mg_sessions_metrics(const mg_sessions_t *s, struct mg_buf_s *out);
/* Sessions in memory, and their content bytes. */
size_t mg_sessions_count(const mg_sessions_t *s);
size_t mg_sessions_bytes(const mg_sessions_t *s);
/* Drop expired sessions now (the sweep). */
void mg_sessions_sweep(mg_sessions_t *s, const mg_context_conf_t *conf, int64_t now_ms);

#endif
