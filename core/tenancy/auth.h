/* auth: who is calling, and may they — the identity and quota state of tenancy.
 *
 * An mg_auth_t holds what the request path needs to authenticate a customer key
 * without touching the disk: the digest index of every usable key (enabled or disabled,
 * not revoked; see keys.h), each project's limits, and one quota level (quota.h) per
 * key and per project. The levels are keyed by the store's row id, so their windows and
 * leases survive a policy update, a reload from the store and a key rotation (the new
 * key inherits the old one's level: rotating cannot reset a rate limit).
 *
 * Memory. A level is kept small (56 bytes) because there is one per loaded key: its
 * 60-second rate window (quota.h, 760 bytes) exists only while the key or project has an
 * rpm_limit or tpm_limit. A policy change keeps the window and its counts as long as
 * one of the two stays set, so changing a limit cannot reset it; setting the first one
 * starts an empty window (requests before it were not counted), lifting both frees it.
 * Leases and spend figures are kept with or without limits. mg_auth_memory() reports it.
 *
 * mg_auth_check() is the whole decision for one inference request, in this order, in two
 * parts the request path runs as two steps (authenticate first of all, admit once the model
 * is known):
 *   mg_auth_authenticate():
 *   key presented (Authorization: Bearer, or x-api-key)  else 401 AUTH_FAILED
 *   key known, enabled, not expired at now                else 401 AUTH_FAILED
 *   mg_auth_admit():
 *   scope "inference", the model, the priority allowed    else 403 PERMISSION_DENIED
 *   spend within the daily / monthly limits of the key,
 *   its project and its tenant, counting what requests in
 *   flight hold and this request's estimated cost         else 429 QUOTA_EXCEEDED
 *   rpm, tpm and concurrency at key and project levels,
 *   reserved all or nothing (quota.h)                     else 429 RATE_LIMITED
 * Every 429 carries retry_after_ms >= 1000 (the Retry-After header is whole seconds).
 *
 * Spend limits (daily_limit_micros and monthly_limit_micros of keys, projects and tenants)
 * hold for the UTC day and month. Admission reserves the request's estimated cost
 * (est_micros: the prompt's tokens x the input price + max_tokens x the output price,
 * tenancy/cost.h) at the key, its project and its tenant (spendhold.h), and refuses when
 * spent + held + the estimate would pass a limit, with Retry-After at the start of the next
 * day or month. The hold goes when the request is charged its actual cost (mg_auth_charge,
 * which the caller calls with the cost of the usage) or ends without a charge
 * (mg_auth_release: a failure costs nothing). An actual cost above the estimate may take a
 * figure past its limit; the next request is refused until the period ends. The figures are
 * kept in the store's `spend` table (per scope, id and period) and read back at start-up, so
 * a restart forgets nothing once the charge's write committed (the caller holds the answer's
 * end until then, see mg_auth_charge and net/hold.h).
 *
 * Ownership and threads: everything runs on the loop thread, without locks. A granted
 * result holds references to its quota levels, which therefore outlive the removal of
 * their key or project; mg_auth_release() must be called exactly once for it.
 * last_used_at is written through mg_store_write() (the writer thread batches it), at most
 * once per key per MG_AUTH_LAST_USED_EVERY_S: the loop never waits on the disk. */
#ifndef MG_AUTH_H
#define MG_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "net/http.h"
#include "tenancy/keys.h"
#include "tenancy/quota.h"
#include "store/store.h"

#define MG_AUTH_LAST_USED_EVERY_S 1 /* last_used_at is accurate to this many seconds */
#define MG_AUTH_MIN_RETRY_MS 1000   /* the smallest wait a 429 announces */

typedef struct mg_auth_s mg_auth_t;
typedef struct mg_auth_level_s mg_auth_level_t; /* private: a refcounted quota level */

/* Limits of a project, as the store keeps them (0 = no limit). */
typedef struct mg_auth_project_s {
    int64_t id;
    int64_t tenant_id;
    uint32_t rpm_limit;
    uint32_t tpm_limit;
    uint32_t max_concurrency;
    int64_t daily_limit_micros;
    int64_t monthly_limit_micros;
} mg_auth_project_t;

/* A tenant's spend limits and billing, as the store keeps them (0 = no limit). */
typedef struct mg_auth_tenant_s {
    int64_t id;
    int64_t daily_limit_micros;
    int64_t monthly_limit_micros;
    int prepaid;                /* billing.mode prepaid: every request reserves from its wallet */
    int require_upstream_usage; /* billing.require_upstream_usage */
} mg_auth_tenant_t;

/* One level's spend limits and this instance's figures, as admission read them (for the spend
 * shared across instances, cluster/limits.h). */
typedef struct mg_auth_spend_view_s {
    int64_t id;                     /* the key's, project's or tenant's row id; 0: no such level */
    int64_t daily, monthly;         /* limits in micros, 0 = none */
    int64_t spent_day, spent_month; /* what this instance counts spent in the periods */
} mg_auth_spend_view_t;

/* The outcome of mg_auth_check(). On refusal, status/code/message/retry_after_ms say
 * what to answer; on success the identity and the reservation. Do not copy a granted
 * result (the reservation is settled and released in place). */
typedef struct mg_auth_result_s {
    int status;              /* 0 = allowed; else 401, 403 or 429 */
    const char *code;        /* static: AUTH_FAILED, PERMISSION_DENIED, RATE_LIMITED,
                                QUOTA_EXCEEDED; NULL when allowed */
    const char *reason;      /* static, for logs: missing, unknown, expired, disabled, scope,
                                model, priority, daily_spend, monthly_spend, rpm, tpm,
                                concurrency, too_large; "ok" when allowed */
    const char *level;       /* static: "key", "project" or "tenant" for a quota refusal */
    char message[192];       /* for the client; never contains the key */
    uint64_t retry_after_ms; /* > 0 for every 429 */
    /* identity, when allowed */
    int64_t key_id;
    int64_t tenant_id;
    int64_t project_id;         /* 0 = the key has no project */
    uint32_t max_queued;        /* the key's cap on tasks waiting in the scheduler; 0 = none */
    const mg_key_record_t *rec; /* authenticated, not yet admitted: the key's record, borrowed
                                   from the index until mg_auth_admit (in the same loop turn) */
    char key_display[MG_KEY_DISPLAY_MAX]; /* "mg-…a1b2c3": safe to log */
    /* the reservation, when allowed */
    mg_quota_res_t res;
    mg_auth_level_t *levels[2]; /* one reference each; key first, project second */
    size_t n_levels;
    mg_auth_level_t *tenant_level; /* one reference, or NULL (the tenant has no row) */
    int64_t spend_hold_micros;     /* the estimated cost held at the key, project and tenant */
    int64_t spend_hold_ids[3];     /* where it is held: key, project, tenant ids (0: none) */
    int spend_held;                /* 1 while that hold stands (until charge or release); a
                                      result holding spend must be released before mg_auth_free */
    mg_auth_spend_view_t spend[3]; /* key, project, tenant: their spend limits at admission */
    char spend_day[16], spend_month[16]; /* admission's periods: "2026-12-02", "2026-12" */
    int prepaid;                         /* the tenant bills prepaid (tenancy/wallet.h) */
    int require_upstream_usage;
    mg_auth_t *auth;    /* borrowed: the state the hold is in */
    int held;           /* 1 from a granted check until mg_auth_release() */
    int quota_deferred; /* set by the caller between authenticate and admit: the key's and
                           project's rates and leases are reserved elsewhere (shared through
                           Redis, cluster/limits.h); admit checks the rest and reserves none of
                           them here (mg_auth_quota_local does, when Redis cannot) */
} mg_auth_result_t;

/* ---- lifecycle ---- */

/* A new, empty auth state (every key unknown). NULL when out of memory. */
mg_auth_t *mg_auth_new(void);

/* Free a and drop its references; levels still held by granted results live on until
 * those are released. NULL is fine. */
void mg_auth_free(mg_auth_t *a);

/* (Re)build the state from the store: every key with revoked_at NULL (enabled or not)
 * and every project. Quota levels of ids present before keep their state with the new
 * limits; levels of ids gone are dropped (in-flight results keep theirs). The switch is
 * one step on the caller's thread: a lookup sees the old state or the new, never a mix.
 * st is remembered for last_used_at writes. Returns 0, or -1 with err set (the state is
 * unchanged then). Reads the database: call at start-up, or after an admin change. */
int mg_auth_load(mg_auth_t *a, mg_store_t *st, char *err, size_t errlen);

/* Keys in the index (usable or disabled). */
size_t mg_auth_key_count(const mg_auth_t *a);

/* What the state holds in memory, without malloc's own overhead. */
typedef struct mg_auth_memory_s {
    size_t keys;         /* keys in the index */
    size_t index_bytes;  /* mg_key_index_memory(): slot table and key records */
    size_t level_bytes;  /* quota and spend levels of keys and projects, tables, windows */
    size_t windows;      /* levels holding a rate window (an rpm or tpm limit) */
    size_t window_bytes; /* those windows' bytes (included in level_bytes) */
} mg_auth_memory_t;

/* Fill *m for the current state (levels only granted results still hold are not counted). */
void mg_auth_memory(const mg_auth_t *a, mg_auth_memory_t *m);

/* Log, at start-up, whether inference needs a key, and, when it does and no key exists,
 * how to create the first one (listen = "host:port" of the API listener). */
void mg_auth_log_status(const mg_auth_t *a, int enabled, const char *listen);

/* ---- the request path ---- */

/* Authenticate and admit one inference request for the logical `model` at `priority`
 * ("P0".."P4"; NULL = P2), reserving est_tokens (<0 counts as 0) at the key's and its
 * project's levels. now_ms is the wall clock in unix milliseconds (expiry is checked
 * against it on every call; the quota windows use it too). Fills *out either way.
 * Returns 0 when allowed (the caller must mg_auth_release(out) exactly once, and may
 * mg_auth_settle(out) once), or -1 when refused (nothing to release). */
int mg_auth_check(mg_auth_t *a, const mg_http_req_t *req, const char *model, const char *priority,
                  uint64_t now_ms, int64_t est_tokens, mg_auth_result_t *out);

/* As mg_auth_check() with the presented key given directly (n bytes, may be NULL for
 * "no key"): the same decision without an HTTP request (tests, other entry points). */
int mg_auth_check_key(mg_auth_t *a, const char *key, size_t n, const char *model,
                      const char *priority, uint64_t now_ms, int64_t est_tokens,
                      mg_auth_result_t *out);

/* The first half of mg_auth_check(): is the presented key known, enabled and unexpired? 0
 * with the identity in *out (key_id, tenant_id, max_queued, key_display, rec) and nothing
 * reserved (nothing to release), or -1 with the 401 in *out. */
int mg_auth_authenticate(mg_auth_t *a, const mg_http_req_t *req, uint64_t now_ms,
                         mg_auth_result_t *out);
int mg_auth_authenticate_key(mg_auth_t *a, const char *key, size_t n, uint64_t now_ms,
                             mg_auth_result_t *out);

/* The second half, on a result mg_auth_authenticate() filled in the same loop turn: scope,
 * model, priority, spend (est_micros, the request's estimated cost, held at the key, project
 * and tenant) and the quota reservation. 0 when allowed (then the caller must
 * mg_auth_release(out) exactly once), or -1 with the refusal in *out (nothing to release). */
int mg_auth_admit(mg_auth_t *a, mg_auth_result_t *out, const char *model, const char *priority,
                  uint64_t now_ms, int64_t est_tokens, int64_t est_micros);

/* A granted result whose quota was deferred: reserve it locally after all (Redis was
 * unreachable: the degraded mode "local"), against this instance's share of each limit: the
 * limit / share (rounded up; share 1: the whole limit). 0, or -1 with the 429 in *out (the
 * result stays granted: release it as always). */
int mg_auth_quota_local(mg_auth_result_t *out, uint64_t now_ms, int64_t est_tokens, int share);

/* The limits of a granted result's level i (0 the key, 1 its project; i < n_levels): its row
 * id and rpm, tpm and concurrency limits (0 = none). 0, or -1 when there is no such level. */
int mg_auth_level_limits(const mg_auth_result_t *r, size_t i, int64_t *id, uint32_t *rpm,
                         uint64_t *tpm, uint32_t *conc);

/* Milliseconds from now_ms to the end of the UTC day (monthly: month), at least
 * MG_AUTH_MIN_RETRY_MS: a spend refusal's Retry-After. */
uint64_t mg_auth_until_period_end(uint64_t now_ms, int monthly);

/* Replace the token estimate of a granted result with the actual count (at most once;
 * later calls and calls on refused results do nothing). */
void mg_auth_settle(mg_auth_result_t *r, int64_t actual_tokens);

/* Whose is the presented key (Authorization: Bearer or x-api-key), when it is usable now:
 * 0 with its tenant and project (0 = none), -1 otherwise. Checks and reserves nothing
 * (idempotency scopes answers by it). */
int mg_auth_identify(mg_auth_t *a, const mg_http_req_t *req, uint64_t now_ms, int64_t *tenant,
                     int64_t *project);

/* Return the concurrency leases and drop the level references of a granted result. The
 * first call does it; later calls, and calls on refused or zeroed results, do nothing. */
void mg_auth_release(mg_auth_result_t *r);

/* Set what a key (key_id > 0) or a project (project_id > 0) has spent today and this month
 * (UTC, of now_ms in unix ms), in micros; -1 leaves that figure as it is. */
void mg_auth_set_spend(mg_auth_t *a, int64_t key_id, int64_t project_id, int64_t day_micros,
                       int64_t month_micros, uint64_t now_ms);

/* Charge a granted request's cost (micros > 0) to its key, project and tenant for the
 * periods of now_ms (unix ms), in memory at once and in the store through its writer thread,
 * as one write; the request's spend hold goes at the same moment (also for micros <= 0). done (may
 * be NULL) gets that write's outcome once it committed (store.h: on the loop thread, later).
 * Returns 1 when the write was queued (done will be called), 0 when nothing was to be written (no
 * store, nothing charged), -1 when the write could not be queued (logged; done is never called). */
int mg_auth_charge(mg_auth_t *a, mg_auth_result_t *r, int64_t micros, uint64_t now_ms,
                   mg_store_done_fn done, void *ud);

/* ---- changes after an admin transaction committed (loop thread) ----
 * Each applies one committed change to the in-memory state at once. On error the state
 * is unchanged and the caller should resynchronize with mg_auth_load(). */

/* Index a key built from tmpl (copied) or, when its digest is indexed, replace that
 * record (policy update, enable/disable). Creates or updates the key's quota level: its
 * window is allocated, kept (with its counts) or freed as rpm/tpm limits are set, changed or
 * lifted (see "Memory" above); results still holding the level stay safe to settle and
 * release. Returns 0 or a negative MG_KEYS_* code. */
int mg_auth_put_key(mg_auth_t *a, const mg_key_record_t *tmpl);

/* Remove the key with this digest and drop its quota level. 0 or MG_KEYS_ENOENT. */
int mg_auth_remove_key(mg_auth_t *a, const unsigned char *digest);

/* Rotation: the key under old_digest leaves the index and the one built from tmpl enters
 * it in one step (mg_key_index_replace), and tmpl->id takes over the old key's quota
 * level. Returns 0 or a negative MG_KEYS_* code. */
int mg_auth_rotate_key(mg_auth_t *a, const unsigned char *old_digest, const mg_key_record_t *tmpl);

/* Create or update a project's limits (its quota level keeps its state). 0 or -1 (out
 * of memory). */
int mg_auth_put_project(mg_auth_t *a, const mg_auth_project_t *p);

/* Create or update a tenant's spend limits and billing (its spend figures stay). 0 or -1. */
int mg_auth_put_tenant(mg_auth_t *a, const mg_auth_tenant_t *t);

/* Micros held by requests in flight for a key (scope 0), project (1) or tenant (2): tests
 * and reports. */
int64_t mg_auth_spend_held(const mg_auth_t *a, int scope, int64_t id);

/* ---- helpers shared with the admin API ---- */

/* Digest as 64 lowercase hex characters + NUL into hex[65]. */
void mg_auth_digest_hex(const unsigned char *digest, char *hex);

/* Parse 64 hex characters into digest[MG_KEY_DIGEST_LEN]. 0 or -1. */
int mg_auth_digest_parse(const char *hex, unsigned char *digest);

/* Priority bits (MG_PRIORITY_BIT) from a JSON array text like ["P0","P2"]; a NULL or
 * empty text means all. -1 when the text is not such an array. */
int mg_auth_priorities_parse(const char *json, uint8_t *bits);

/* Scope bits from a JSON array text like ["inference"]. -1 when not such an array or a
 * name is unknown. */
int mg_auth_scopes_parse(const char *json, uint32_t *bits);

/* Build a key record from one api_keys row as selected by MG_AUTH_KEY_COLUMNS
 * (text columns; NULL = SQL NULL). Returns a record with one reference, or NULL when
 * the row is malformed or memory runs out. */
mg_key_record_t *mg_auth_record_from_row(int ncols, const char *const *cols);

/* The api_keys columns mg_auth_record_from_row() expects, in order. */
#define MG_AUTH_KEY_COLUMNS                                                                        \
    "id, tenant_id, project_id, digest, scopes, models, priorities, rpm_limit, tpm_limit,"         \
    " max_concurrency, max_queued, daily_limit_micros, monthly_limit_micros, expires_at,"          \
    " labels, enabled, application"
#define MG_AUTH_KEY_NCOLS 17

#endif
