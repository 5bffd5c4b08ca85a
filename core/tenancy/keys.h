/* keys: customer API keys — generation, digests, display form, and the in-memory index
 * the request path authenticates against.
 *
 * A key is "mg-" + 40 base62 characters from the CSPRNG (about 238 bits). The gateway
 * never stores it: the store keeps its SHA-256 digest (32 bytes) and a display form
 * ("mg-…a1b2c3"); the clear key is shown once, when it is created.
 *
 * The index maps digest → key record in an open-addressing hash table (linear probing,
 * power-of-two capacity, load at most 3/4, backward-shift deletion so there are no
 * tombstones). A lookup hashes the presented key, probes, and compares digests with
 * CRYPTO_memcmp; then it checks `enabled` and `expires_at` against the time it is given,
 * on every call. Everything runs on the loop thread; the index has no locks.
 *
 * Records are reference counted and immutable once indexed, except for the `enabled`
 * flag (mg_key_index_set_enabled). A request that authenticated takes a reference with
 * mg_key_record_ref() and keeps a consistent view of its key's policy until it ends,
 * even if the key is removed, rotated or updated meanwhile. */
#ifndef MG_KEYS_H
#define MG_KEYS_H

#include <stddef.h>
#include <stdint.h>

#define MG_KEY_PREFIX "mg-"
#define MG_KEY_PREFIX_LEN 3
#define MG_KEY_RANDOM_LEN 40                               /* base62 characters after the prefix */
#define MG_KEY_LEN (MG_KEY_PREFIX_LEN + MG_KEY_RANDOM_LEN) /* 43 */
#define MG_KEY_DIGEST_LEN 32                               /* SHA-256 */
#define MG_KEY_DISPLAY_SUFFIX 6                            /* characters shown at the end */
#define MG_KEY_DISPLAY_MAX 16 /* "mg-" + "…" (3 bytes of UTF-8) + 6 + NUL = 13, rounded up */

/* Scope bits: what a key may do. */
#define MG_SCOPE_INFERENCE (1u << 0) /* chat, completions, embeddings */
#define MG_SCOPE_MODELS (1u << 1)    /* list models */
#define MG_SCOPE_USAGE (1u << 2)     /* read its own usage */
#define MG_SCOPE_ADMIN (1u << 3)     /* the admin API */

/* Priority bits: bit p allows priority Pp (P0 = most urgent). */
#define MG_PRIORITY_BIT(p) (1u << (p))
#define MG_PRIORITY_ALL 0x1fu /* P0-P4 */

/* Return codes of index operations: 0 = ok, negative = error. */
enum {
    MG_KEYS_OK = 0,
    MG_KEYS_EINVAL = -1,
    MG_KEYS_ENOMEM = -2,
    MG_KEYS_EEXIST = -3, /* a record with that digest is already indexed */
    MG_KEYS_ENOENT = -4, /* no record with that digest */
    MG_KEYS_ERANDOM = -5 /* the random generator failed */
};

/* What a lookup found. Distinct so the caller can log the reason; the client should
 * get the same 401 for all three failures. */
typedef enum mg_key_result_e {
    MG_KEY_OK = 0,
    MG_KEY_UNKNOWN, /* no such key (never existed, removed, or rotated away) */
    MG_KEY_EXPIRED, /* now >= expires_at */
    MG_KEY_DISABLED /* switched off by an operator; takes precedence over EXPIRED */
} mg_key_result_t;

/* One customer key and its policy. Build one on the stack with borrowed `models` and
 * `application`, then mg_key_record_new() copies it into a single allocation. Zero limits
 * mean "no limit". */
typedef struct mg_key_record_s {
    unsigned char digest[MG_KEY_DIGEST_LEN]; /* SHA-256 of the clear key */
    int64_t id;                              /* store row id of the key */
    int64_t tenant_id;
    int64_t project_id;
    int64_t daily_limit_micros;   /* spend per UTC day, millionths of the currency unit */
    int64_t monthly_limit_micros; /* spend per calendar month */
    int64_t expires_at;           /* unix seconds; 0 = never */
    uint32_t rpm_limit;           /* requests per minute */
    uint32_t tpm_limit;           /* tokens per minute */
    uint32_t max_concurrency;     /* requests in flight */
    uint32_t max_queued;          /* requests waiting in the scheduler */
    uint32_t scopes;              /* MG_SCOPE_* bits */
    uint32_t refs;                /* reference count; see mg_key_record_ref() */
    uint32_t size;                /* bytes of the record's allocation (set by _new) */
    uint16_t n_models;            /* entries in models; 0 = every model allowed */
    uint8_t priorities;           /* MG_PRIORITY_BIT(p) for each allowed Pp */
    uint8_t enabled;              /* 0 = disabled */
    const char *const *models;    /* allowlist; owned by the record (in its allocation) */
    const char *application;      /* the application its requests count against (caps,
                                     models, data policy), or NULL; owned likewise (the key's
                                     labels stay in the store: the request path never reads
                                     them) */
} mg_key_record_t;

/* One table slot: 16 bytes. */
typedef struct mg_key_slot_s {
    uint64_t hash;        /* mixed digest bits; 0 marks an empty slot */
    mg_key_record_t *rec; /* one reference held by the index */
} mg_key_slot_t;

/* A key presented before and found: its tag (siphash.h, under the index's tag key) and its
 * SHA-256, so that presenting it again costs a SipHash instead of a SHA-256 (whose code, through
 * OpenSSL's EVP layer, is most of what auth adds to a request). No clear key is kept. */
typedef struct mg_key_seen_s {
    uint64_t tag[2];
    unsigned char digest[MG_KEY_DIGEST_LEN];
    int used;
} mg_key_seen_t;

#define MG_KEY_SEEN_SLOTS 256 /* direct-mapped by the tag; a collision only costs a SHA-256 */

typedef struct mg_key_index_s {
    mg_key_slot_t *slots; /* owned; capacity is a power of two */
    size_t cap;
    size_t n;
    uint64_t seed;       /* random per index: slot positions cannot be predicted */
    void *md_ctx;        /* EVP_MD_CTX, reused by lookups */
    void *md;            /* EVP_MD (SHA-256), fetched once */
    uint8_t tag_key[16]; /* random per index: the SipHash key of the seen keys' tags */
    mg_key_seen_t *seen; /* owned, MG_KEY_SEEN_SLOTS entries */
} mg_key_index_t;

/* ---- keys ---- */

/* Write a fresh key ("mg-" + 40 base62, NUL-terminated) into out[MG_KEY_LEN + 1].
 * Every character is uniform over the 62 (rejection sampling, no modulo bias).
 * Returns 0, or MG_KEYS_ERANDOM (out is then ""). */
int mg_key_generate(char *out);

/* 1 when s[0..n) has the generated shape: "mg-" + exactly 40 base62 characters. */
int mg_key_is_well_formed(const char *s, size_t n);

/* SHA-256 of the n bytes of key into out[MG_KEY_DIGEST_LEN]: the form the store keeps.
 * Returns 0, or -1 if OpenSSL failed (out is then zeroed). */
int mg_key_digest(const char *key, size_t n, unsigned char *out);

/* Display form "mg-…" + last six characters into out[MG_KEY_DISPLAY_MAX] ("…" is
 * U+2026 in UTF-8). Returns 0, or MG_KEYS_EINVAL when key is not well formed (out is
 * then "…"). */
int mg_key_display(const char *key, char *out);

/* The same for a presented key of n bytes (not NUL-terminated) that the index matched: its
 * digest is a stored key's, so it is a generated key and its characters are not checked one
 * by one again (only its length and prefix: out is "" when those do not fit). */
void mg_key_display_matched(const char *key, size_t n, char *out);

/* Scope bit for a name ("inference", "models", "usage", "admin"), or 0 if unknown. */
uint32_t mg_key_scope_bit(const char *name);

/* ---- records ---- */

/* Copy tmpl, its models and application into one new allocation with one reference.
 * tmpl->digest is taken as given; tmpl->refs and tmpl->size are ignored. Returns NULL when out of
 * memory, or when tmpl->n_models > 0 with a NULL models array or a NULL entry. */
mg_key_record_t *mg_key_record_new(const mg_key_record_t *tmpl);

/* Take one more reference; returns rec. */
mg_key_record_t *mg_key_record_ref(mg_key_record_t *rec);

/* Drop a reference; the record is freed (and wiped) when the last one goes. NULL ok. */
void mg_key_record_unref(mg_key_record_t *rec);

/* Bytes a record occupies (struct + models + application), excluding malloc's own overhead. */
size_t mg_key_record_size(const mg_key_record_t *rec);

/* 1 when the allowlist is empty or contains model exactly. */
int mg_key_allows_model(const mg_key_record_t *rec, const char *model);

/* 1 when priority p (0-4) is allowed. */
int mg_key_allows_priority(const mg_key_record_t *rec, int p);

/* 1 when every bit of `need` is among the record's scopes. */
int mg_key_has_scopes(const mg_key_record_t *rec, uint32_t need);

/* ---- index ---- */

/* Initialize an empty index sized for `expected` keys without growing (0 is fine).
 * Returns 0, MG_KEYS_ENOMEM or MG_KEYS_ERANDOM; on error there is nothing to free. */
int mg_key_index_init(mg_key_index_t *ix, size_t expected);

/* Drop the index's reference to every record and free the table. */
void mg_key_index_free(mg_key_index_t *ix);

/* Index rec under rec->digest. On success the index owns the reference the caller
 * passed in (from mg_key_record_new). Errors: MG_KEYS_EEXIST, MG_KEYS_ENOMEM (the
 * table could not grow); the caller keeps its reference then. */
int mg_key_index_insert(mg_key_index_t *ix, mg_key_record_t *rec);

/* Remove the record with that digest and drop the index's reference.
 * Returns 0 or MG_KEYS_ENOENT. */
int mg_key_index_remove(mg_key_index_t *ix, const unsigned char *digest);

/* Rotation and policy update in one step: the record under old_digest leaves the index
 * and rec (digest rec->digest) enters it, with no call in between, so no lookup ever
 * sees both keys valid or neither. rec->digest may equal old_digest (policy update).
 * On success the index owns the caller's reference to rec and has dropped its own to
 * the old record. Errors, with the index unchanged and the caller keeping its
 * reference: MG_KEYS_ENOENT (old_digest not indexed), MG_KEYS_EEXIST (the new digest is
 * already indexed under another record), MG_KEYS_ENOMEM. */
int mg_key_index_replace(mg_key_index_t *ix, const unsigned char *old_digest, mg_key_record_t *rec);

/* Switch a key on or off in place. Returns 0 or MG_KEYS_ENOENT. */
int mg_key_index_set_enabled(mg_key_index_t *ix, const unsigned char *digest, int enabled);

/* The record indexed under digest, or NULL; no expiry or enabled check (admin use). */
mg_key_record_t *mg_key_index_find(const mg_key_index_t *ix, const unsigned char *digest);

/* Authenticate a presented key (n bytes, need not be NUL-terminated, any format):
 * hash it, find its record, check enabled and expiry against now_s (unix seconds).
 * *rec (if rec is not NULL) is set to the record for MG_KEY_OK, MG_KEY_EXPIRED and
 * MG_KEY_DISABLED (borrowed: take a reference to keep it), NULL for MG_KEY_UNKNOWN. */
mg_key_result_t mg_key_index_lookup(mg_key_index_t *ix, const char *key, size_t n, int64_t now_s,
                                    mg_key_record_t **rec);

/* As mg_key_index_lookup() for a digest the caller already computed. */
mg_key_result_t mg_key_index_lookup_digest(const mg_key_index_t *ix, const unsigned char *digest,
                                           int64_t now_s, mg_key_record_t **rec);

/* Bytes held by the index: the slot table plus every record (mg_key_record_size). */
size_t mg_key_index_memory(const mg_key_index_t *ix);

/* A short static name for a lookup result ("ok", "unknown", "expired", "disabled"). */
const char *mg_key_result_name(mg_key_result_t r);

#endif
