/* Unit tests for core/tenancy/keys.c: key format and randomness, digests, display form, records
 * (allowlist, priorities, scopes, references), and the index: insert, lookup, remove,
 * rotation, expiry and disabled results, 100,000 keys, and forced collisions that
 * exercise long clusters and backward-shift deletion against a reference model. */
#include "tenancy/keys.h"
#include "base/crypto.h"
#include "mgtest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A record for key text `key` with default policy; the caller may adjust tmpl first. */
static mg_key_record_t *record_for(const char *key, int64_t id)
{
    mg_key_record_t t;
    memset(&t, 0, sizeof(t));
    mg_key_digest(key, strlen(key), t.digest);
    t.id = id;
    t.tenant_id = 7;
    t.project_id = 70;
    t.scopes = MG_SCOPE_INFERENCE;
    t.priorities = MG_PRIORITY_ALL;
    t.enabled = 1;
    return mg_key_record_new(&t);
}

/* A record with a given digest (for collision tests). */
static mg_key_record_t *record_with_digest(const unsigned char *digest, int64_t id)
{
    mg_key_record_t t;
    memset(&t, 0, sizeof(t));
    memcpy(t.digest, digest, MG_KEY_DIGEST_LEN);
    t.id = id;
    t.enabled = 1;
    return mg_key_record_new(&t);
}

static mg_key_result_t lookup(mg_key_index_t *ix, const char *key, int64_t now,
                              mg_key_record_t **rec)
{
    return mg_key_index_lookup(ix, key, strlen(key), now, rec);
}

static void test_generate_format(void)
{
    enum { N = 2000 };
    static char keys[N][MG_KEY_LEN + 1];
    int counts[256] = {0};
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(mg_key_generate(keys[i]), MG_KEYS_OK);
        CHECK_EQ_INT(strlen(keys[i]), 43);
        CHECK(strncmp(keys[i], "mg-", 3) == 0);
        CHECK(mg_key_is_well_formed(keys[i], strlen(keys[i])));
        for (int c = 3; c < MG_KEY_LEN; c++) counts[(unsigned char)keys[i][c]]++;
    }
    int dup = 0;
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++) dup += strcmp(keys[i], keys[j]) == 0;
    CHECK_EQ_INT(dup, 0);
    /* 80,000 characters over 62 symbols: about 1290 each; every symbol in a wide band */
    const char *alpha = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    int used = 0, out_of_band = 0;
    for (int c = 0; c < 256; c++) used += counts[c] > 0;
    for (const char *p = alpha; *p; p++)
        out_of_band += counts[(unsigned char)*p] < 1050 || counts[(unsigned char)*p] > 1550;
    CHECK_EQ_INT(used, 62);
    CHECK_EQ_INT(out_of_band, 0);
}

static void test_well_formed(void)
{
    char k[MG_KEY_LEN + 1];
    mg_key_generate(k);
    CHECK(mg_key_is_well_formed(k, MG_KEY_LEN));
    CHECK(!mg_key_is_well_formed(k, MG_KEY_LEN - 1));
    CHECK(!mg_key_is_well_formed(NULL, 0));
    char bad[MG_KEY_LEN + 1];
    memcpy(bad, k, sizeof(bad));
    bad[10] = '-';
    CHECK(!mg_key_is_well_formed(bad, MG_KEY_LEN));
    memcpy(bad, k, sizeof(bad));
    bad[0] = 'M';
    CHECK(!mg_key_is_well_formed(bad, MG_KEY_LEN));
    CHECK(!mg_key_is_well_formed("sk-abc", 6));
}

static void test_digest(void)
{
    const char *k = "mg-0123456789abcdefghijABCDEFGHIJ0123456789";
    unsigned char d[MG_KEY_DIGEST_LEN];
    CHECK_EQ_INT(mg_key_digest(k, strlen(k), d), 0);
    char hex[65], want[65];
    mg_sha256_hex(k, strlen(k), want);
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = "0123456789abcdef"[d[i] >> 4];
        hex[2 * i + 1] = "0123456789abcdef"[d[i] & 15];
    }
    hex[64] = '\0';
    CHECK_STR(hex, want);
    /* the empty string: the FIPS 180-2 value */
    mg_key_digest("", 0, d);
    CHECK_EQ_INT(d[0], 0xe3);
    CHECK_EQ_INT(d[31], 0x55);
}

static void test_display(void)
{
    char out[MG_KEY_DISPLAY_MAX];
    CHECK_EQ_INT(mg_key_display("mg-0123456789abcdefghijABCDEFGHIJ01234a1b2c3", out),
                 MG_KEYS_EINVAL); /* 44 characters */
    CHECK_STR(out, "\xe2\x80\xa6");
    CHECK_EQ_INT(mg_key_display("mg-0123456789abcdefghijABCDEFGHIJ0123a1b2c3", out), MG_KEYS_OK);
    CHECK_STR(out, "mg-\xe2\x80\xa6"
                   "a1b2c3");
    CHECK_EQ_INT(strlen(out), 12);
    CHECK_EQ_INT(mg_key_display(NULL, out), MG_KEYS_EINVAL);
    char k[MG_KEY_LEN + 1];
    mg_key_generate(k);
    mg_key_display(k, out);
    CHECK(strncmp(out, "mg-", 3) == 0 && strcmp(out + 6, k + 37) == 0);
    /* a matched key, not NUL-terminated: the same form; a wrong length or prefix: "" */
    char presented[MG_KEY_LEN + 8];
    memcpy(presented, k, MG_KEY_LEN);
    memcpy(presented + MG_KEY_LEN, "  tail", 7);
    char matched[MG_KEY_DISPLAY_MAX];
    mg_key_display_matched(presented, MG_KEY_LEN, matched);
    CHECK_STR(matched, out);
    mg_key_display_matched(presented, MG_KEY_LEN - 1, matched);
    CHECK_STR(matched, "");
    presented[0] = 'x';
    mg_key_display_matched(presented, MG_KEY_LEN, matched);
    CHECK_STR(matched, "");
    mg_key_display_matched(NULL, 0, matched);
    CHECK_STR(matched, "");
}

static void test_scopes(void)
{
    CHECK_EQ_INT(mg_key_scope_bit("inference"), MG_SCOPE_INFERENCE);
    CHECK_EQ_INT(mg_key_scope_bit("admin"), MG_SCOPE_ADMIN);
    CHECK_EQ_INT(mg_key_scope_bit("models"), MG_SCOPE_MODELS);
    CHECK_EQ_INT(mg_key_scope_bit("usage"), MG_SCOPE_USAGE);
    CHECK_EQ_INT(mg_key_scope_bit("root"), 0);
    CHECK_EQ_INT(mg_key_scope_bit(NULL), 0);
}

static void test_record(void)
{
    const char *models[] = {"general-chat", "fast-chat"};
    char label[] = "team=search";
    mg_key_record_t t;
    memset(&t, 0, sizeof(t));
    t.id = 1;
    t.scopes = MG_SCOPE_INFERENCE | MG_SCOPE_MODELS;
    t.priorities = MG_PRIORITY_BIT(1) | MG_PRIORITY_BIT(2) | MG_PRIORITY_BIT(3);
    t.models = models;
    t.n_models = 2;
    t.application = label;
    t.rpm_limit = 60;
    t.daily_limit_micros = 5000000;
    mg_key_record_t *r = mg_key_record_new(&t);
    CHECK(r != NULL);
    if (!r) return;
    label[0] = 'X'; /* the record has its own copy */
    CHECK_STR(r->application, "team=search");
    CHECK(r->models != models);
    CHECK(mg_key_allows_model(r, "general-chat"));
    CHECK(mg_key_allows_model(r, "fast-chat"));
    CHECK(!mg_key_allows_model(r, "general"));
    CHECK(!mg_key_allows_model(r, NULL));
    CHECK(!mg_key_allows_priority(r, 0));
    CHECK(mg_key_allows_priority(r, 2));
    CHECK(!mg_key_allows_priority(r, 4));
    CHECK(!mg_key_allows_priority(r, 5));
    CHECK(!mg_key_allows_priority(r, -1));
    CHECK(mg_key_has_scopes(r, MG_SCOPE_INFERENCE));
    CHECK(mg_key_has_scopes(r, MG_SCOPE_INFERENCE | MG_SCOPE_MODELS));
    CHECK(!mg_key_has_scopes(r, MG_SCOPE_ADMIN));
    CHECK_EQ_INT(r->refs, 1);
    CHECK_EQ_INT(r->rpm_limit, 60);
    CHECK_EQ_INT(mg_key_record_size(r), sizeof(mg_key_record_t) + 2 * sizeof(char *) +
                                            sizeof("general-chat") + sizeof("fast-chat") +
                                            sizeof("team=search"));
    mg_key_record_unref(r);
    /* an empty allowlist allows every model */
    t.n_models = 0;
    t.models = NULL;
    t.application = NULL;
    r = mg_key_record_new(&t);
    CHECK(r && mg_key_allows_model(r, "anything") && r->application == NULL);
    CHECK_EQ_INT(mg_key_record_size(r), sizeof(mg_key_record_t));
    mg_key_record_unref(r);
    /* a NULL entry is refused */
    const char *holes[] = {"a", NULL};
    t.models = holes;
    t.n_models = 2;
    CHECK(mg_key_record_new(&t) == NULL);
    CHECK_EQ_INT(sizeof(mg_key_record_t), 128);
    CHECK_EQ_INT(sizeof(mg_key_slot_t), 16);
}

static int seen_used(const mg_key_index_t *ix)
{
    int n = 0;
    for (int i = 0; i < MG_KEY_SEEN_SLOTS; i++) n += ix->seen[i].used;
    return n;
}

/* The seen-keys table: a found key is remembered by its tag and digest (never its clear
 * text), a made-up one is not; more keys than slots still all resolve (a slot taken by
 * another key only costs a SHA-256); a key one character off a seen one is unknown. */
static void test_index_seen_keys(void)
{
    mg_key_index_t ix;
    CHECK_EQ_INT(mg_key_index_init(&ix, 0), MG_KEYS_OK);
    enum { N = 3 * MG_KEY_SEEN_SLOTS };
    static char k[N][MG_KEY_LEN + 1];
    for (int i = 0; i < N; i++) {
        mg_key_generate(k[i]);
        CHECK_EQ_INT(mg_key_index_insert(&ix, record_for(k[i], i + 1)), MG_KEYS_OK);
    }
    mg_key_record_t *r = NULL;
    CHECK_EQ_INT(seen_used(&ix), 0);
    CHECK_EQ_INT(lookup(&ix, k[0], 1000, &r), MG_KEY_OK);
    CHECK_EQ_INT(seen_used(&ix), 1);
    unsigned char d[MG_KEY_DIGEST_LEN];
    mg_key_digest(k[0], MG_KEY_LEN, d);
    int holds_digest = 0, holds_clear = 0;
    for (int i = 0; i < MG_KEY_SEEN_SLOTS; i++) {
        holds_digest |= ix.seen[i].used && memcmp(ix.seen[i].digest, d, sizeof(d)) == 0;
        holds_clear |= memmem(&ix.seen[i], sizeof(ix.seen[i]), k[0] + 3, 8) != NULL;
    }
    CHECK(holds_digest && !holds_clear);
    char other[MG_KEY_LEN + 1];
    mg_key_generate(other);
    CHECK_EQ_INT(lookup(&ix, other, 1000, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(seen_used(&ix), 1);
    char near[MG_KEY_LEN + 1];
    memcpy(near, k[0], sizeof(near));
    near[30] = near[30] == 'a' ? 'b' : 'a';
    CHECK_EQ_INT(lookup(&ix, near, 1000, &r), MG_KEY_UNKNOWN);
    int good = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < N; i++)
            good += lookup(&ix, k[i], 1000, &r) == MG_KEY_OK && r->id == i + 1;
    CHECK_EQ_INT(good, 2 * N);
    CHECK(seen_used(&ix) > MG_KEY_SEEN_SLOTS / 2);
    mg_key_index_free(&ix);
}

static void test_index_basic(void)
{
    mg_key_index_t ix;
    CHECK_EQ_INT(mg_key_index_init(&ix, 0), MG_KEYS_OK);
    char k[3][MG_KEY_LEN + 1];
    for (int i = 0; i < 3; i++) {
        mg_key_generate(k[i]);
        CHECK_EQ_INT(mg_key_index_insert(&ix, record_for(k[i], i + 1)), MG_KEYS_OK);
    }
    CHECK_EQ_INT(ix.n, 3);
    mg_key_record_t *r = NULL;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(lookup(&ix, k[i], 1000, &r), MG_KEY_OK);
        CHECK(r && r->id == i + 1 && r->tenant_id == 7 && r->project_id == 70);
    }
    /* unknown: another key, a prefix, one changed character, empty, NULL */
    char other[MG_KEY_LEN + 1];
    mg_key_generate(other);
    CHECK_EQ_INT(lookup(&ix, other, 1000, &r), MG_KEY_UNKNOWN);
    CHECK(r == NULL);
    CHECK_EQ_INT(mg_key_index_lookup(&ix, k[0], MG_KEY_LEN - 1, 1000, &r), MG_KEY_UNKNOWN);
    char changed[MG_KEY_LEN + 1];
    memcpy(changed, k[1], sizeof(changed));
    changed[20] = changed[20] == 'a' ? 'b' : 'a';
    CHECK_EQ_INT(lookup(&ix, changed, 1000, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(lookup(&ix, "", 1000, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(mg_key_index_lookup(&ix, NULL, 0, 1000, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(lookup(&ix, k[2], 1000, NULL), MG_KEY_OK); /* rec may be NULL */
    /* duplicate insert */
    mg_key_record_t *dup = record_for(k[1], 99);
    CHECK_EQ_INT(mg_key_index_insert(&ix, dup), MG_KEYS_EEXIST);
    mg_key_record_unref(dup);
    CHECK_EQ_INT(mg_key_index_insert(&ix, NULL), MG_KEYS_EINVAL);
    /* remove */
    unsigned char d[MG_KEY_DIGEST_LEN];
    mg_key_digest(k[1], MG_KEY_LEN, d);
    CHECK_EQ_INT(mg_key_index_remove(&ix, d), MG_KEYS_OK);
    CHECK_EQ_INT(mg_key_index_remove(&ix, d), MG_KEYS_ENOENT);
    CHECK_EQ_INT(lookup(&ix, k[1], 1000, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(lookup(&ix, k[0], 1000, &r), MG_KEY_OK);
    CHECK_EQ_INT(lookup(&ix, k[2], 1000, &r), MG_KEY_OK);
    CHECK_EQ_INT(ix.n, 2);
    CHECK(mg_key_index_find(&ix, d) == NULL);
    mg_key_index_free(&ix);
}

static void test_expiry_disabled(void)
{
    mg_key_index_t ix;
    mg_key_index_init(&ix, 4);
    const char *ka = "mg-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    const char *kb = "mg-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";
    mg_key_record_t t;
    memset(&t, 0, sizeof(t));
    mg_key_digest(ka, strlen(ka), t.digest);
    t.enabled = 1;
    t.expires_at = 1700000000;
    mg_key_index_insert(&ix, mg_key_record_new(&t));
    mg_key_index_insert(&ix, record_for(kb, 2)); /* never expires */
    mg_key_record_t *r = NULL;
    CHECK_EQ_INT(lookup(&ix, ka, 1699999999, &r), MG_KEY_OK);
    CHECK_EQ_INT(lookup(&ix, ka, 1700000000, &r), MG_KEY_EXPIRED);
    CHECK(r != NULL && r->expires_at == 1700000000); /* the record, for the log */
    CHECK_EQ_INT(lookup(&ix, ka, 1800000000, &r), MG_KEY_EXPIRED);
    CHECK_EQ_INT(lookup(&ix, kb, INT64_MAX, &r), MG_KEY_OK);
    /* disabled, then enabled again; disabled wins over expired */
    unsigned char da[32], db[32];
    mg_key_digest(ka, strlen(ka), da);
    mg_key_digest(kb, strlen(kb), db);
    CHECK_EQ_INT(mg_key_index_set_enabled(&ix, db, 0), MG_KEYS_OK);
    CHECK_EQ_INT(lookup(&ix, kb, 1000, &r), MG_KEY_DISABLED);
    CHECK(r != NULL && r->id == 2);
    CHECK_EQ_INT(mg_key_index_set_enabled(&ix, db, 1), MG_KEYS_OK);
    CHECK_EQ_INT(lookup(&ix, kb, 1000, &r), MG_KEY_OK);
    mg_key_index_set_enabled(&ix, da, 0);
    CHECK_EQ_INT(lookup(&ix, ka, 1800000000, &r), MG_KEY_DISABLED);
    unsigned char none[32] = {1};
    CHECK_EQ_INT(mg_key_index_set_enabled(&ix, none, 0), MG_KEYS_ENOENT);
    CHECK_STR(mg_key_result_name(MG_KEY_EXPIRED), "expired");
    CHECK_STR(mg_key_result_name(MG_KEY_DISABLED), "disabled");
    CHECK_STR(mg_key_result_name(MG_KEY_UNKNOWN), "unknown");
    CHECK_STR(mg_key_result_name(MG_KEY_OK), "ok");
    mg_key_index_free(&ix);
}

static void test_rotate(void)
{
    mg_key_index_t ix;
    mg_key_index_init(&ix, 0);
    char old_key[MG_KEY_LEN + 1], new_key[MG_KEY_LEN + 1], third[MG_KEY_LEN + 1];
    mg_key_generate(old_key);
    mg_key_generate(new_key);
    mg_key_generate(third);
    mg_key_index_insert(&ix, record_for(old_key, 1));
    mg_key_index_insert(&ix, record_for(third, 3));
    unsigned char d_old[32], d_new[32], d_third[32];
    mg_key_digest(old_key, MG_KEY_LEN, d_old);
    mg_key_digest(new_key, MG_KEY_LEN, d_new);
    mg_key_digest(third, MG_KEY_LEN, d_third);
    /* a request in flight holds the old record */
    mg_key_record_t *held = NULL;
    CHECK_EQ_INT(lookup(&ix, old_key, 1, &held), MG_KEY_OK);
    mg_key_record_ref(held);
    /* errors leave everything as it was, and the caller keeps its record */
    mg_key_record_t *nr = record_for(new_key, 2);
    CHECK_EQ_INT(mg_key_index_replace(&ix, d_new, nr), MG_KEYS_ENOENT);
    mg_key_record_t *clash = record_for(third, 4);
    CHECK_EQ_INT(mg_key_index_replace(&ix, d_old, clash), MG_KEYS_EEXIST);
    mg_key_record_unref(clash);
    CHECK_EQ_INT(lookup(&ix, old_key, 1, NULL), MG_KEY_OK);
    CHECK_EQ_INT(lookup(&ix, third, 1, NULL), MG_KEY_OK);
    CHECK_EQ_INT(ix.n, 2);
    /* the rotation: old out, new in, in one call */
    CHECK_EQ_INT(mg_key_index_replace(&ix, d_old, nr), MG_KEYS_OK);
    mg_key_record_t *r = NULL;
    CHECK_EQ_INT(lookup(&ix, old_key, 1, &r), MG_KEY_UNKNOWN);
    CHECK_EQ_INT(lookup(&ix, new_key, 1, &r), MG_KEY_OK);
    CHECK(r == nr && r->id == 2);
    CHECK_EQ_INT(lookup(&ix, third, 1, NULL), MG_KEY_OK);
    CHECK_EQ_INT(ix.n, 2);
    /* the in-flight request still reads its record (ASan would catch a use after free) */
    CHECK_EQ_INT(held->id, 1);
    CHECK_EQ_INT(held->refs, 1);
    mg_key_record_unref(held);
    /* policy update: same digest, new record */
    mg_key_record_t t = *nr;
    t.rpm_limit = 5;
    mg_key_record_t *upd = mg_key_record_new(&t);
    CHECK_EQ_INT(mg_key_index_replace(&ix, d_new, upd), MG_KEYS_OK);
    CHECK_EQ_INT(lookup(&ix, new_key, 1, &r), MG_KEY_OK);
    CHECK(r == upd && r->rpm_limit == 5);
    CHECK_EQ_INT(ix.n, 2);
    CHECK_EQ_INT(mg_key_index_replace(&ix, d_new, NULL), MG_KEYS_EINVAL);
    mg_key_index_free(&ix);
}

/* 100,000 generated keys: all found, strangers not, half removed, the rest still found. */
static void test_100k(void)
{
    enum { N = 100000 };
    char(*keys)[MG_KEY_LEN + 1] = malloc((size_t)N * sizeof(*keys));
    CHECK(keys != NULL);
    if (!keys) return;
    mg_key_index_t ix;
    CHECK_EQ_INT(mg_key_index_init(&ix, 0), MG_KEYS_OK); /* grows from 16 slots */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        mg_key_generate(keys[i]);
        bad += mg_key_index_insert(&ix, record_for(keys[i], i)) != MG_KEYS_OK;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ix.n, N);
    CHECK(ix.n * 4 <= ix.cap * 3);
    mg_key_record_t *r = NULL;
    for (int i = 0; i < N; i++) bad += lookup(&ix, keys[i], 0, &r) != MG_KEY_OK || r->id != i;
    CHECK_EQ_INT(bad, 0);
    char stranger[MG_KEY_LEN + 1];
    for (int i = 0; i < 10000; i++) {
        mg_key_generate(stranger);
        bad += lookup(&ix, stranger, 0, &r) != MG_KEY_UNKNOWN;
    }
    CHECK_EQ_INT(bad, 0);
    unsigned char d[32];
    for (int i = 0; i < N; i += 2) {
        mg_key_digest(keys[i], MG_KEY_LEN, d);
        bad += mg_key_index_remove(&ix, d) != MG_KEYS_OK;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ix.n, N / 2);
    for (int i = 0; i < N; i++)
        bad += lookup(&ix, keys[i], 0, NULL) != (i % 2 ? MG_KEY_OK : MG_KEY_UNKNOWN);
    CHECK_EQ_INT(bad, 0);
    size_t mem = mg_key_index_memory(&ix);
    CHECK(mem >= ix.n * sizeof(mg_key_record_t) + ix.cap * sizeof(mg_key_slot_t));
    mg_key_index_free(&ix);
    free(keys);
}

/* Digests sharing their first eight bytes share a hash, whatever the seed: one long
 * cluster. Each is still found; removing from the middle keeps the rest reachable. */
static void test_collisions(void)
{
    enum { N = 40 };
    mg_key_index_t ix;
    mg_key_index_init(&ix, 0);
    unsigned char d[N][32];
    for (int i = 0; i < N; i++) {
        memset(d[i], 0xab, 32);
        d[i][31] = (unsigned char)i; /* differ only in the last byte */
        CHECK_EQ_INT(mg_key_index_insert(&ix, record_with_digest(d[i], i)), MG_KEYS_OK);
    }
    mg_key_record_t *r = NULL;
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(mg_key_index_lookup_digest(&ix, d[i], 0, &r), MG_KEY_OK);
        CHECK(r && r->id == i);
    }
    unsigned char absent[32];
    memset(absent, 0xab, 32);
    absent[31] = 200;
    CHECK_EQ_INT(mg_key_index_lookup_digest(&ix, absent, 0, &r), MG_KEY_UNKNOWN);
    for (int i = 1; i < N; i += 3) CHECK_EQ_INT(mg_key_index_remove(&ix, d[i]), MG_KEYS_OK);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(mg_key_index_lookup_digest(&ix, d[i], 0, NULL),
                     i % 3 == 1 ? MG_KEY_UNKNOWN : MG_KEY_OK);
    mg_key_index_free(&ix);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Random inserts, removals and rotations over a small universe of digests in groups that
 * share hashes (so clusters form, merge and wrap around the table end), checked after
 * every operation against a plain array of which digests are present. */
static void test_random_model(void)
{
    enum { U = 300, OPS = 20000 };
    static unsigned char d[U][32];
    int present[U] = {0};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < U; i++) {
        for (int b = 0; b < 32; b++) d[i][b] = (unsigned char)xorshift(&rng);
        if (i % 3) memcpy(d[i], d[i - i % 3], 8); /* groups of three share a hash */
    }
    mg_key_index_t ix;
    mg_key_index_init(&ix, 0);
    int bad = 0;
    size_t n = 0;
    for (int op = 0; op < OPS; op++) {
        int i = (int)(xorshift(&rng) % U), j = (int)(xorshift(&rng) % U);
        int kind = (int)(xorshift(&rng) % 3);
        if (kind == 0) {
            mg_key_record_t *r = record_with_digest(d[i], i);
            int rc = mg_key_index_insert(&ix, r);
            bad += rc != (present[i] ? MG_KEYS_EEXIST : MG_KEYS_OK);
            if (rc) mg_key_record_unref(r);
            if (!present[i]) n++;
            present[i] = 1;
        } else if (kind == 1) {
            bad += mg_key_index_remove(&ix, d[i]) != (present[i] ? MG_KEYS_OK : MG_KEYS_ENOENT);
            if (present[i]) n--;
            present[i] = 0;
        } else {
            mg_key_record_t *r = record_with_digest(d[j], j);
            int want =
                !present[i] ? MG_KEYS_ENOENT : (present[j] && i != j ? MG_KEYS_EEXIST : MG_KEYS_OK);
            int rc = mg_key_index_replace(&ix, d[i], r);
            bad += rc != want;
            if (rc) mg_key_record_unref(r);
            if (rc == MG_KEYS_OK) {
                present[i] = 0;
                present[j] = 1;
            }
        }
        bad += ix.n != n;
        if (op % 97 == 0 || op == OPS - 1)
            for (int k = 0; k < U; k++) {
                mg_key_record_t *r = mg_key_index_find(&ix, d[k]);
                bad += present[k] ? (r == NULL || r->id != k) : r != NULL;
            }
    }
    CHECK_EQ_INT(bad, 0);
    mg_key_index_free(&ix);
}

int main(void)
{
    MG_RUN(test_generate_format);
    MG_RUN(test_well_formed);
    MG_RUN(test_digest);
    MG_RUN(test_display);
    MG_RUN(test_index_seen_keys);
    MG_RUN(test_scopes);
    MG_RUN(test_record);
    MG_RUN(test_index_basic);
    MG_RUN(test_expiry_disabled);
    MG_RUN(test_rotate);
    MG_RUN(test_100k);
    MG_RUN(test_collisions);
    MG_RUN(test_random_model);
    return mg_test_summary();
}
