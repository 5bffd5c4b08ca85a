/* keys_bench: customer-key index lookup cost and memory per key.
 *
 * Built by CMake (target keys_bench, against the core library); run from the repository
 * root: build/keys_bench            # or: build/keys_bench 1000 100000 1000000
 *
 * For each index size it fills an index with generated keys and reports, in ns per call:
 *   lookup hit   mg_key_index_lookup() of an indexed key (SHA-256 + probe + checks)
 *   lookup miss  the same for a well-formed key that is not indexed
 *   probe hit    mg_key_index_lookup_digest() (the table alone, digest precomputed)
 *   sha256       mg_key_digest() (one-shot EVP_Digest, as the admin path uses)
 * The presented keys are laid out in a shuffled order and read in sequence (as a request
 * buffer would be, already in cache) while the index is hit at random places. Memory:
 * "index bytes/key" is mg_key_index_memory() / n (slot table + records, no allocator
 * overhead); "heap bytes/key" is the growth of glibc's in-use heap (mallinfo2) while
 * filling the index, so it includes malloc's headers. Records carry no allowlist and no
 * labels unless the size is followed by ":m", which gives each two models and an application.
 *
 * Then, per size, the whole auth state (auth.h) as the gateway holds it: an mg_auth_t
 * filled through mg_auth_put_key() with the same keys, each without limits (as
 * bench/seed_keys.c seeds them), with only a concurrency limit, or with an rpm limit.
 * "auth heap bytes/key" is its mallinfo2 growth per key (index, records and the per-key
 * quota and spend state); "beyond index" subtracts the plain index's heap bytes/key;
 * "levels bytes/key" is mg_auth_memory()'s level_bytes per key (levels, their tables and
 * windows, without malloc's overhead) and "windows" how many levels hold a rate window. */
#include "tenancy/auth.h"
#include "tenancy/keys.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef char key_text_t[MG_KEY_LEN + 1];

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random permutation of [0, n) (Fisher-Yates). */
static uint32_t *permutation(size_t n)
{
    uint32_t *p = malloc(n * sizeof(*p));
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; p && i < n; i++) p[i] = (uint32_t)i;
    for (size_t i = n - 1; p && i > 0; i--) {
        size_t j = (size_t)(next_rand(&s) % (i + 1));
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

/* Latency of one dependent random read from a 64 MiB array: the price of a cache miss
 * on this machine, to read the figures below against. */
static double dram_ns(void)
{
    size_t n = (64u << 20) / sizeof(uint32_t);
    uint32_t *next = permutation(n), *cycle = malloc(n * sizeof(*cycle));
    if (!next || !cycle) exit(1);
    for (size_t i = 0; i < n; i++) cycle[next[i]] = next[(i + 1) % n]; /* one big cycle */
    uint32_t at = 0;
    size_t steps = 4000000;
    double t0 = now_ns();
    for (size_t i = 0; i < steps; i++) at = cycle[at];
    double t1 = now_ns();
    if (at == UINT32_MAX) fputc(' ', stderr);
    free(next);
    free(cycle);
    return (t1 - t0) / (double)steps;
}

/* Heap in use (glibc): uordblks, plus the large blocks malloc placed in their own mappings. */
static size_t heap_in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

/* The policy of benchmark key `id` (digest of `key`), as a template. */
static void make_template(mg_key_record_t *t, const char *key, int64_t id, int with_models)
{
    static const char *const models[] = {"general-chat", "fast-chat"};
    memset(t, 0, sizeof(*t));
    mg_key_digest(key, MG_KEY_LEN, t->digest);
    t->id = id;
    t->tenant_id = 1;
    t->project_id = 1;
    t->scopes = MG_SCOPE_INFERENCE;
    t->priorities = MG_PRIORITY_ALL;
    t->rpm_limit = 600;
    t->enabled = 1;
    if (with_models) {
        t->models = models;
        t->n_models = 2;
        t->application = "search-assistant";
    }
}

static mg_key_record_t *make_record(const char *key, int64_t id, int with_models)
{
    mg_key_record_t t;
    make_template(&t, key, id, with_models);
    return mg_key_record_new(&t);
}

/* Limits of the auth-state runs. */
typedef enum { LIM_NONE, LIM_CONCURRENCY, LIM_RPM } limits_t;

static const char *const limits_name[] = {"no limits", "max_concurrency", "rpm_limit"};

/* What an mg_auth_t holding n keys costs. */
typedef struct auth_cost_s {
    double heap_per_key;   /* mallinfo2 growth / n */
    double levels_per_key; /* mg_auth_memory().level_bytes / n */
    size_t windows;        /* mg_auth_memory().windows */
} auth_cost_t;

/* Fill an mg_auth_t with n keys with the given limits through mg_auth_put_key(). */
static auth_cost_t auth_cost(key_text_t *keys, size_t n, int with_models, limits_t lim)
{
    size_t h0 = heap_in_use();
    mg_auth_t *a = mg_auth_new();
    if (!a) exit(1);
    for (size_t i = 0; i < n; i++) {
        mg_key_record_t t;
        make_template(&t, keys[i], (int64_t)i + 1, with_models);
        t.rpm_limit = lim == LIM_RPM ? 600 : 0;
        t.max_concurrency = lim == LIM_CONCURRENCY ? 4 : 0;
        if (mg_auth_put_key(a, &t) != 0) {
            fprintf(stderr, "mg_auth_put_key failed at %zu\n", i);
            exit(1);
        }
    }
    auth_cost_t c = {(double)(heap_in_use() - h0) / (double)n, 0, 0};
    mg_auth_memory_t m;
    mg_auth_memory(a, &m);
    c.levels_per_key = (double)m.level_bytes / (double)n;
    c.windows = m.windows;
    mg_auth_free(a);
    return c;
}

/* Fill an index with n keys; returns heap bytes used (mallinfo2 delta). */
static size_t fill(mg_key_index_t *ix, key_text_t *keys, size_t n, int with_models)
{
    size_t h0 = heap_in_use();
    mg_key_index_init(ix, 0);
    for (size_t i = 0; i < n; i++)
        if (mg_key_index_insert(ix, make_record(keys[i], (int64_t)i, with_models)) != 0) {
            fprintf(stderr, "insert failed at %zu\n", i);
            exit(1);
        }
    return heap_in_use() - h0;
}

/* `presented` holds n keys in a shuffled order: read in sequence (like a request buffer,
 * already in cache) while the index is hit at random places. */
static double time_lookups(mg_key_index_t *ix, key_text_t *presented, size_t n, size_t count,
                           mg_key_result_t want)
{
    size_t bad = 0;
    double t0 = now_ns();
    for (size_t i = 0; i < count; i++)
        bad += mg_key_index_lookup(ix, presented[i % n], MG_KEY_LEN, 1000, NULL) != want;
    double t1 = now_ns();
    if (bad) fprintf(stderr, "unexpected lookup results: %zu\n", bad);
    return (t1 - t0) / (double)count;
}

static double time_probes(mg_key_index_t *ix, unsigned char (*digests)[MG_KEY_DIGEST_LEN], size_t n,
                          size_t count)
{
    size_t bad = 0;
    double t0 = now_ns();
    for (size_t i = 0; i < count; i++)
        bad += mg_key_index_lookup_digest(ix, digests[i % n], 1000, NULL) != MG_KEY_OK;
    double t1 = now_ns();
    if (bad) fprintf(stderr, "unexpected probe results: %zu\n", bad);
    return (t1 - t0) / (double)count;
}

static double time_sha(key_text_t *keys, size_t n, size_t count)
{
    unsigned char d[MG_KEY_DIGEST_LEN];
    unsigned sink = 0;
    double t0 = now_ns();
    for (size_t i = 0; i < count; i++) {
        mg_key_digest(keys[i % n], MG_KEY_LEN, d);
        sink += d[0];
    }
    double t1 = now_ns();
    if (sink == 1u) fputc(' ', stderr); /* keep the loop */
    return (t1 - t0) / (double)count;
}

static void run(size_t n, size_t count, int with_models)
{
    key_text_t *keys = malloc(n * sizeof(*keys)), *presented = malloc(n * sizeof(*keys));
    key_text_t *strangers = malloc(n * sizeof(*keys));
    unsigned char(*digests)[MG_KEY_DIGEST_LEN] = malloc(n * sizeof(*digests));
    uint32_t *order = permutation(n);
    if (!keys || !presented || !strangers || !digests || !order) exit(1);
    for (size_t i = 0; i < n; i++) {
        mg_key_generate(keys[i]);
        mg_key_generate(strangers[i]);
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(presented[i], keys[order[i]], sizeof(key_text_t));
        mg_key_digest(presented[i], MG_KEY_LEN, digests[i]);
    }
    mg_key_index_t ix;
    size_t heap = fill(&ix, keys, n, with_models);
    time_lookups(&ix, presented, n, count / 10, MG_KEY_OK); /* warm up */
    double hit = time_lookups(&ix, presented, n, count, MG_KEY_OK);
    double miss = time_lookups(&ix, strangers, n, count, MG_KEY_UNKNOWN);
    double probe = time_probes(&ix, digests, n, count);
    double sha = time_sha(presented, n, count);
    printf("%8zu keys%s | lookup hit %6.1f ns | lookup miss %6.1f ns | probe hit %5.1f ns | "
           "sha256 one-shot %6.1f ns | slots %zu (load %.2f) | index bytes/key %.1f | "
           "heap bytes/key %.1f\n",
           n, with_models ? " +models" : "", hit, miss, probe, sha, ix.cap,
           (double)ix.n / (double)ix.cap, (double)mg_key_index_memory(&ix) / (double)n,
           (double)heap / (double)n);
    mg_key_index_free(&ix);
    for (limits_t lim = LIM_NONE; lim <= LIM_RPM; lim++) {
        auth_cost_t c = auth_cost(keys, n, with_models, lim);
        printf("%8zu keys%s | auth state, %-15s | auth heap bytes/key %7.1f | beyond index "
               "%7.1f | levels bytes/key %6.1f | windows %zu\n",
               n, with_models ? " +models" : "", limits_name[lim], c.heap_per_key,
               c.heap_per_key - (double)heap / (double)n, c.levels_per_key, c.windows);
    }
    free(keys);
    free(presented);
    free(strangers);
    free(digests);
    free(order);
}

int main(int argc, char **argv)
{
    size_t count = 2000000;
    printf("record %zu bytes, slot %zu bytes; %zu lookups per figure; "
           "one random DRAM read %.1f ns\n",
           sizeof(mg_key_record_t), sizeof(mg_key_slot_t), count, dram_ns());
    if (argc < 2) {
        run(1000, count, 0);
        run(100000, count, 0);
        run(100000, count, 1);
        return 0;
    }
    for (int i = 1; i < argc; i++)
        run(strtoul(argv[i], NULL, 10), count, strstr(argv[i], ":m") != NULL);
    return 0;
}
