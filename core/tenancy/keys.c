/* keys: customer key generation and the digest → record index; see keys.h.
 *
 * Slots hold a 64-bit hash next to the record pointer, so a probe compares the hash
 * without touching the record; only on a hash match is the record's digest compared,
 * with CRYPTO_memcmp. The hash is the first eight digest bytes mixed with a per-index
 * random seed: digests are already uniform, the seed only keeps slot positions (and so
 * probe lengths) from being predictable by someone choosing presented keys.
 *
 * Removal uses backward-shift deletion: entries after the hole that may legally move
 * back do so, which keeps every probe sequence unbroken without tombstones, so lookups
 * of unknown keys stay short however many keys come and go. The table doubles when it
 * would exceed 3/4 full and never shrinks. */
#include "tenancy/keys.h"

#include "base/crypto.h"
#include "base/siphash.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

static const char b62dig[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

#define MIN_CAP 16
#define ELLIPSIS "\xe2\x80\xa6" /* U+2026 */

/* ---- keys ------------------------------------------------------------------------------ */

int mg_key_generate(char *out)
{
    unsigned char buf[64];
    size_t o = MG_KEY_PREFIX_LEN;
    out[0] = '\0';
    while (o < MG_KEY_LEN) {
        if (mg_random_bytes(buf, sizeof(buf)) != 0) return MG_KEYS_ERANDOM;
        /* 248 = 4 * 62: bytes below it map evenly onto the alphabet; the rest are
         * dropped (3% of them), so no character is more likely than another */
        for (size_t i = 0; i < sizeof(buf) && o < MG_KEY_LEN; i++)
            if (buf[i] < 248) out[o++] = b62dig[buf[i] % 62];
    }
    memcpy(out, MG_KEY_PREFIX, MG_KEY_PREFIX_LEN);
    out[MG_KEY_LEN] = '\0';
    OPENSSL_cleanse(buf, sizeof(buf));
    return MG_KEYS_OK;
}

static int is_base62(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
}

int mg_key_is_well_formed(const char *s, size_t n)
{
    if (!s || n != MG_KEY_LEN || memcmp(s, MG_KEY_PREFIX, MG_KEY_PREFIX_LEN) != 0) return 0;
    for (size_t i = MG_KEY_PREFIX_LEN; i < n; i++)
        if (!is_base62(s[i])) return 0;
    return 1;
}

int mg_key_digest(const char *key, size_t n, unsigned char *out)
{
    unsigned int len = 0;
    if (EVP_Digest(key, n, out, &len, EVP_sha256(), NULL) == 1 && len == MG_KEY_DIGEST_LEN)
        return 0;
    memset(out, 0, MG_KEY_DIGEST_LEN);
    return -1;
}

/* "mg-…" + the last characters of a key of MG_KEY_LEN bytes. */
static void format_display(const char *key, char *out)
{
    size_t o = 0;
    memcpy(out + o, MG_KEY_PREFIX, MG_KEY_PREFIX_LEN);
    o += MG_KEY_PREFIX_LEN;
    memcpy(out + o, ELLIPSIS, sizeof(ELLIPSIS) - 1);
    o += sizeof(ELLIPSIS) - 1;
    memcpy(out + o, key + MG_KEY_LEN - MG_KEY_DISPLAY_SUFFIX, MG_KEY_DISPLAY_SUFFIX);
    out[o + MG_KEY_DISPLAY_SUFFIX] = '\0';
}

int mg_key_display(const char *key, char *out)
{
    memcpy(out, ELLIPSIS, sizeof(ELLIPSIS));
    if (!key || !mg_key_is_well_formed(key, strlen(key))) return MG_KEYS_EINVAL;
    format_display(key, out);
    return MG_KEYS_OK;
}

void mg_key_display_matched(const char *key, size_t n, char *out)
{
    out[0] = '\0';
    if (key && n == MG_KEY_LEN && memcmp(key, MG_KEY_PREFIX, MG_KEY_PREFIX_LEN) == 0)
        format_display(key, out);
}

uint32_t mg_key_scope_bit(const char *name)
{
    static const struct {
        const char *name;
        uint32_t bit;
    } scopes[] = {{"inference", MG_SCOPE_INFERENCE},
                  {"models", MG_SCOPE_MODELS},
                  {"usage", MG_SCOPE_USAGE},
                  {"admin", MG_SCOPE_ADMIN}};
    for (size_t i = 0; name && i < sizeof(scopes) / sizeof(scopes[0]); i++)
        if (strcmp(name, scopes[i].name) == 0) return scopes[i].bit;
    return 0;
}

/* ---- records --------------------------------------------------------------------------- */

/* Allocation size for tmpl: struct, pointer array, model strings, application. 0 on bad
 * input. */
static size_t record_alloc_size(const mg_key_record_t *tmpl)
{
    size_t size = sizeof(mg_key_record_t) + (size_t)tmpl->n_models * sizeof(char *);
    if (tmpl->n_models && !tmpl->models) return 0;
    for (size_t i = 0; i < tmpl->n_models; i++) {
        if (!tmpl->models[i]) return 0;
        size += strlen(tmpl->models[i]) + 1;
    }
    if (tmpl->application) size += strlen(tmpl->application) + 1;
    return size > UINT32_MAX ? 0 : size;
}

/* Copy s to *p and advance *p past its NUL; returns where it was copied. */
static char *pack_string(char **p, const char *s)
{
    size_t len = strlen(s) + 1;
    char *at = memcpy(*p, s, len);
    *p += len;
    return at;
}

mg_key_record_t *mg_key_record_new(const mg_key_record_t *tmpl)
{
    size_t size = tmpl ? record_alloc_size(tmpl) : 0;
    if (!size) return NULL;
    mg_key_record_t *rec = malloc(size);
    if (!rec) return NULL;
    *rec = *tmpl;
    rec->refs = 1;
    rec->size = (uint32_t)size;
    const char **models = (const char **)(rec + 1);
    char *p = (char *)(models + rec->n_models);
    for (size_t i = 0; i < rec->n_models; i++) models[i] = pack_string(&p, tmpl->models[i]);
    rec->models = rec->n_models ? models : NULL;
    rec->application = tmpl->application ? pack_string(&p, tmpl->application) : NULL;
    return rec;
}

mg_key_record_t *mg_key_record_ref(mg_key_record_t *rec)
{
    rec->refs++;
    return rec;
}

void mg_key_record_unref(mg_key_record_t *rec)
{
    if (!rec || --rec->refs > 0) return;
    OPENSSL_cleanse(rec, rec->size);
    free(rec);
}

size_t mg_key_record_size(const mg_key_record_t *rec)
{
    return rec->size;
}

int mg_key_allows_model(const mg_key_record_t *rec, const char *model)
{
    if (rec->n_models == 0) return 1;
    for (size_t i = 0; model && i < rec->n_models; i++)
        if (strcmp(rec->models[i], model) == 0) return 1;
    return 0;
}

int mg_key_allows_priority(const mg_key_record_t *rec, int p)
{
    return p >= 0 && p <= 4 && (rec->priorities & MG_PRIORITY_BIT(p)) != 0;
}

int mg_key_has_scopes(const mg_key_record_t *rec, uint32_t need)
{
    return (rec->scopes & need) == need;
}

/* ---- index: table primitives ------------------------------------------------------------ */

static uint64_t slot_hash(const mg_key_index_t *ix, const unsigned char *digest)
{
    uint64_t v;
    memcpy(&v, digest, sizeof(v));
    v = (v ^ ix->seed) * 0x9e3779b97f4a7c15ull;
    v ^= v >> 29;
    return v ? v : 1; /* 0 marks an empty slot */
}

/* Slot index holding digest, or cap when absent. */
static size_t find_slot(const mg_key_index_t *ix, const unsigned char *digest)
{
    uint64_t h = slot_hash(ix, digest);
    size_t mask = ix->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        const mg_key_slot_t *s = &ix->slots[i];
        if (s->hash == 0) return ix->cap;
        if (s->hash == h && CRYPTO_memcmp(s->rec->digest, digest, MG_KEY_DIGEST_LEN) == 0) return i;
    }
}

/* Put (h, rec) into the first free slot of its probe sequence; the caller made sure
 * there is room and that the digest is absent. */
static void place(mg_key_slot_t *slots, size_t cap, uint64_t h, mg_key_record_t *rec)
{
    size_t mask = cap - 1, i = h & mask;
    while (slots[i].hash != 0) i = (i + 1) & mask;
    slots[i].hash = h;
    slots[i].rec = rec;
}

/* Empty slot i and shift later entries of the cluster back so no probe breaks. */
static void erase_slot(mg_key_index_t *ix, size_t i)
{
    size_t mask = ix->cap - 1;
    for (size_t j = (i + 1) & mask; ix->slots[j].hash != 0; j = (j + 1) & mask) {
        size_t home = ix->slots[j].hash & mask;
        /* the entry at j may fill the hole at i when i lies on its probe path, i.e.
         * its home is at least as far back from j as i is */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            ix->slots[i] = ix->slots[j];
            i = j;
        }
    }
    ix->slots[i].hash = 0;
    ix->slots[i].rec = NULL;
}

static size_t cap_for(size_t n)
{
    size_t cap = MIN_CAP;
    while (cap / 4 * 3 < n) cap *= 2;
    return cap;
}

/* Rehash into a table of new_cap slots. 0 or MG_KEYS_ENOMEM (table unchanged). */
static int resize(mg_key_index_t *ix, size_t new_cap)
{
    mg_key_slot_t *slots = calloc(new_cap, sizeof(*slots));
    if (!slots) return MG_KEYS_ENOMEM;
    for (size_t i = 0; i < ix->cap; i++)
        if (ix->slots[i].hash) place(slots, new_cap, ix->slots[i].hash, ix->slots[i].rec);
    free(ix->slots);
    ix->slots = slots;
    ix->cap = new_cap;
    return MG_KEYS_OK;
}

/* ---- index: public operations ----------------------------------------------------------- */

int mg_key_index_init(mg_key_index_t *ix, size_t expected)
{
    memset(ix, 0, sizeof(*ix));
    if (mg_random_bytes(&ix->seed, sizeof(ix->seed)) != 0 ||
        mg_random_bytes(ix->tag_key, sizeof(ix->tag_key)) != 0)
        return MG_KEYS_ERANDOM;
    ix->cap = cap_for(expected);
    ix->slots = calloc(ix->cap, sizeof(*ix->slots));
    ix->seen = calloc(MG_KEY_SEEN_SLOTS, sizeof(*ix->seen));
    ix->md_ctx = EVP_MD_CTX_new();
    ix->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (ix->slots && ix->seen && ix->md_ctx && ix->md) return MG_KEYS_OK;
    mg_key_index_free(ix);
    return MG_KEYS_ENOMEM;
}

void mg_key_index_free(mg_key_index_t *ix)
{
    for (size_t i = 0; ix->slots && i < ix->cap; i++)
        if (ix->slots[i].hash) mg_key_record_unref(ix->slots[i].rec);
    free(ix->slots);
    free(ix->seen);
    EVP_MD_CTX_free(ix->md_ctx);
    EVP_MD_free(ix->md);
    memset(ix, 0, sizeof(*ix));
}

int mg_key_index_insert(mg_key_index_t *ix, mg_key_record_t *rec)
{
    if (!rec) return MG_KEYS_EINVAL;
    if (find_slot(ix, rec->digest) != ix->cap) return MG_KEYS_EEXIST;
    if (cap_for(ix->n + 1) > ix->cap) {
        int rc = resize(ix, ix->cap * 2);
        if (rc != MG_KEYS_OK) return rc;
    }
    place(ix->slots, ix->cap, slot_hash(ix, rec->digest), rec);
    ix->n++;
    return MG_KEYS_OK;
}

int mg_key_index_remove(mg_key_index_t *ix, const unsigned char *digest)
{
    size_t i = find_slot(ix, digest);
    if (i == ix->cap) return MG_KEYS_ENOENT;
    mg_key_record_t *rec = ix->slots[i].rec;
    erase_slot(ix, i);
    ix->n--;
    mg_key_record_unref(rec);
    return MG_KEYS_OK;
}

int mg_key_index_replace(mg_key_index_t *ix, const unsigned char *old_digest, mg_key_record_t *rec)
{
    if (!rec) return MG_KEYS_EINVAL;
    size_t i = find_slot(ix, old_digest);
    if (i == ix->cap) return MG_KEYS_ENOENT;
    mg_key_record_t *old = ix->slots[i].rec;
    if (CRYPTO_memcmp(old->digest, rec->digest, MG_KEY_DIGEST_LEN) == 0) {
        ix->slots[i].rec = rec; /* same key, new policy: same slot */
    } else {
        if (find_slot(ix, rec->digest) != ix->cap) return MG_KEYS_EEXIST;
        /* remove first, then insert: the count never rises, so nothing can fail now */
        erase_slot(ix, i);
        place(ix->slots, ix->cap, slot_hash(ix, rec->digest), rec);
    }
    mg_key_record_unref(old);
    return MG_KEYS_OK;
}

int mg_key_index_set_enabled(mg_key_index_t *ix, const unsigned char *digest, int enabled)
{
    size_t i = find_slot(ix, digest);
    if (i == ix->cap) return MG_KEYS_ENOENT;
    ix->slots[i].rec->enabled = enabled ? 1 : 0;
    return MG_KEYS_OK;
}

mg_key_record_t *mg_key_index_find(const mg_key_index_t *ix, const unsigned char *digest)
{
    size_t i = find_slot(ix, digest);
    return i == ix->cap ? NULL : ix->slots[i].rec;
}

mg_key_result_t mg_key_index_lookup_digest(const mg_key_index_t *ix, const unsigned char *digest,
                                           int64_t now_s, mg_key_record_t **rec)
{
    mg_key_record_t *r = mg_key_index_find(ix, digest);
    if (rec) *rec = r;
    if (!r) return MG_KEY_UNKNOWN;
    if (!r->enabled) return MG_KEY_DISABLED;
    if (r->expires_at != 0 && now_s >= r->expires_at) return MG_KEY_EXPIRED;
    return MG_KEY_OK;
}

/* SHA-256 with the index's reusable context (no allocation per lookup). 0 or -1. */
static int index_digest(mg_key_index_t *ix, const char *key, size_t n, unsigned char *out)
{
    unsigned int len = 0;
    EVP_MD_CTX *c = ix->md_ctx;
    if (EVP_DigestInit_ex2(c, ix->md, NULL) == 1 && EVP_DigestUpdate(c, key, n) == 1 &&
        EVP_DigestFinal_ex(c, out, &len) == 1 && len == MG_KEY_DIGEST_LEN)
        return 0;
    return -1;
}

mg_key_result_t mg_key_index_lookup(mg_key_index_t *ix, const char *key, size_t n, int64_t now_s,
                                    mg_key_record_t **rec)
{
    if (rec) *rec = NULL;
    if (!key) return MG_KEY_UNKNOWN;
    uint64_t tag[2];
    mg_siphash128(key, n, ix->tag_key, tag);
    mg_key_seen_t *seen = &ix->seen[tag[0] & (MG_KEY_SEEN_SLOTS - 1)];
    if (seen->used && seen->tag[0] == tag[0] && seen->tag[1] == tag[1]) /* the same bytes */
        return mg_key_index_lookup_digest(ix, seen->digest, now_s, rec);
    unsigned char digest[MG_KEY_DIGEST_LEN];
    if (index_digest(ix, key, n, digest) != 0) return MG_KEY_UNKNOWN; /* fail closed */
    mg_key_result_t r = mg_key_index_lookup_digest(ix, digest, now_s, rec);
    /* only keys the index holds: a flood of made-up keys cannot evict the ones in use (the
       digest still goes through the index every time: a removed or disabled key is refused) */
    if (r == MG_KEY_OK) {
        *seen = (mg_key_seen_t){.tag = {tag[0], tag[1]}, .used = 1};
        memcpy(seen->digest, digest, sizeof(digest));
    }
    return r;
}

size_t mg_key_index_memory(const mg_key_index_t *ix)
{
    size_t bytes = ix->cap * sizeof(mg_key_slot_t);
    for (size_t i = 0; i < ix->cap; i++)
        if (ix->slots[i].hash) bytes += ix->slots[i].rec->size;
    return bytes;
}

const char *mg_key_result_name(mg_key_result_t r)
{
    switch (r) {
    case MG_KEY_OK: return "ok";
    case MG_KEY_UNKNOWN: return "unknown";
    case MG_KEY_EXPIRED: return "expired";
    case MG_KEY_DISABLED: return "disabled";
    }
    return "unknown";
}
