/* auth: customer-key authentication, permissions and key/project quotas; see auth.h.
 *
 * The state is three things: the digest index (keys.h) for the key lookup itself, and two
 * tables of quota levels — one per key id, one per project id — kept as arrays sorted by
 * id (a lookup is a binary search; inserts are rare, admin-driven, and may move entries).
 * A level is a small refcounted object: the table holds one reference, every granted
 * result one more, so a reservation can always give back what it took even if its key was
 * deleted or its project's limits changed meanwhile.
 *
 * Memory. There is one level per loaded key, so a level holds only what every key needs:
 * its leases, its spend figures, and a quota level (quota.h) whose 60-second window is
 * allocated only while the key has an rpm or tpm limit. Spend limits are not copied into
 * it: a key's are read from its record (the index holds the current one), a project's
 * sit after the common part of its level (project_level_t), as projects are few.
 *
 * Reloading from the store builds the new index and tables beside the old ones, reusing
 * the level objects of ids that still exist, and then swaps them in with plain pointer
 * assignments: a request on the loop thread sees either the old state or the new. */
#include "tenancy/auth.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "base/crypto.h"
#include "base/log.h"
#include "tenancy/spendhold.h"

struct mg_auth_level_s {
    mg_quota_level_t q;           /* limits, leases, and the window while rpm/tpm is limited */
    int64_t id;                   /* key or project row id */
    int64_t spent_day_micros;     /* spent in UTC day `day` */
    int64_t spent_month_micros;   /* spent in UTC month `month` */
    uint32_t refs;                /* the table's reference + one per granted result */
    int32_t day, month;           /* the periods those figures belong to (spend_period) */
    uint32_t last_used_written_s; /* keys: last last_used_at queued (unix s; fits to 2106) */
};

/* One per loaded key: at most 56 bytes, malloc's 64-byte chunk (memory per key:
 * bench/README.md). */
_Static_assert(sizeof(struct mg_auth_level_s) <= 56, "a key's level outgrew its malloc chunk");

/* A project's level: the common part first, then the project's spend limits. */
typedef struct project_level_s {
    mg_auth_level_t lv;
    int64_t daily_limit_micros;   /* 0 = none */
    int64_t monthly_limit_micros; /* 0 = none */
} project_level_t;

/* A tenant's level: spend figures only (its quota part stays unlimited), its spend limits
 * and its billing. */
typedef struct tenant_level_s {
    mg_auth_level_t lv;
    int64_t daily_limit_micros;   /* 0 = none */
    int64_t monthly_limit_micros; /* 0 = none */
    uint8_t prepaid;
    uint8_t require_upstream_usage;
} tenant_level_t;

/* Which table a level belongs to (the size of its allocation). */
enum { LV_KEY = 0, LV_PROJECT = 1, LV_TENANT = 2 };

typedef struct level_entry_s {
    int64_t id;          /* lv->id, beside it: a search reads this array and not a level per
                            step (100,000 keys: 17 steps, each a cache miss) */
    mg_auth_level_t *lv; /* one reference */
} level_entry_t;

/* Levels sorted by id. */
typedef struct level_table_s {
    level_entry_t *e; /* owned array */
    size_t n, cap;
} level_table_t;

struct mg_auth_s {
    mg_key_index_t ix;
    level_table_t keys;      /* by key id */
    level_table_t projects;  /* by project id: every level is in a project_level_t */
    level_table_t tenants;   /* by tenant id: every level is in a tenant_level_t */
    mg_spend_holds_t holds;  /* spend held by requests in flight */
    mg_store_t *store;       /* borrowed: last_used_at writes; NULL = none */
    uint64_t hint_logged_ms; /* when the "no keys yet" hint was last logged */
};

static const char LEVEL_KEY[] = "key";
static const char LEVEL_PROJECT[] = "project";
static const char LEVEL_TENANT[] = "tenant";

/* Levels of a result or a check come key first, project second, tenant third: the position
 * names them. */
static const char *level_name(size_t i)
{
    return i == 2 ? LEVEL_TENANT : i ? LEVEL_PROJECT : LEVEL_KEY;
}

/* ---- levels and tables ------------------------------------------------------------------ */

/* A new level without limits (so without a window), with the table's reference. Project
 * levels get room for the project's spend limit. NULL when out of memory. */
static mg_auth_level_t *level_new(int64_t id, int kind)
{
    size_t size = kind == LV_TENANT    ? sizeof(tenant_level_t)
                  : kind == LV_PROJECT ? sizeof(project_level_t)
                                       : sizeof(mg_auth_level_t);
    mg_auth_level_t *lv = calloc(1, size);
    if (!lv) return NULL;
    mg_quota_level_init(&lv->q, 0, 0, 0); /* no limits: cannot fail */
    lv->id = id;
    lv->refs = 1;
    return lv; /* day = month = 0: the first roll starts the current periods at 0 */
}

/* The project_level_t a project table's level sits in (the level is its first member). */
static project_level_t *project_of(mg_auth_level_t *lv)
{
    return (project_level_t *)((char *)lv - offsetof(project_level_t, lv));
}

static tenant_level_t *tenant_of(mg_auth_level_t *lv)
{
    return (tenant_level_t *)((char *)lv - offsetof(tenant_level_t, lv));
}

static void level_unref(mg_auth_level_t *lv)
{
    if (!lv || --lv->refs > 0) return;
    mg_quota_level_free(&lv->q);
    free(lv); /* also a project's: its level is at offset 0 */
}

/* Index of the first entry with id >= id. */
static size_t table_lower(const level_table_t *t, int64_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->e[mid].id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static mg_auth_level_t *table_find(const level_table_t *t, int64_t id)
{
    size_t i = table_lower(t, id);
    return i < t->n && t->e[i].id == id ? t->e[i].lv : NULL;
}

/* Make room for `more` further entries. 0 or -1. */
static int table_reserve(level_table_t *t, size_t more)
{
    if (t->n + more <= t->cap) return 0;
    size_t cap = t->cap ? t->cap : 16;
    while (cap < t->n + more) cap *= 2;
    level_entry_t *e = realloc(t->e, cap * sizeof(*e));
    if (!e) return -1;
    t->e = e;
    t->cap = cap;
    return 0;
}

/* Insert lv (its id absent) taking over the caller's reference. Room must be reserved. */
static void table_insert(level_table_t *t, mg_auth_level_t *lv)
{
    size_t i = table_lower(t, lv->id);
    memmove(t->e + i + 1, t->e + i, (t->n - i) * sizeof(*t->e));
    t->e[i] = (level_entry_t){lv->id, lv};
    t->n++;
}

/* Take lv's entry out of the table without dropping the reference (returned). */
static mg_auth_level_t *table_take(level_table_t *t, int64_t id)
{
    size_t i = table_lower(t, id);
    if (i >= t->n || t->e[i].id != id) return NULL;
    mg_auth_level_t *lv = t->e[i].lv;
    memmove(t->e + i, t->e + i + 1, (t->n - i - 1) * sizeof(*t->e));
    t->n--;
    return lv;
}

static void table_free(level_table_t *t)
{
    for (size_t i = 0; i < t->n; i++) level_unref(t->e[i].lv);
    free(t->e);
    memset(t, 0, sizeof(*t));
}

/* The level for id, created when absent (a project's when project is 1); *created says
 * which. NULL when out of memory. */
static mg_auth_level_t *table_get(level_table_t *t, int64_t id, int kind, int *created)
{
    *created = 0;
    mg_auth_level_t *lv = table_find(t, id);
    if (lv) return lv;
    if (table_reserve(t, 1) != 0 || !(lv = level_new(id, kind))) return NULL;
    table_insert(t, lv);
    *created = 1;
    return lv;
}

/* Bytes of a table and its levels (structs and windows, without malloc's overhead); adds
 * the number of windows to *windows and their bytes to *window_bytes. */
static size_t table_bytes(const level_table_t *t, size_t level_size, size_t *windows,
                          size_t *window_bytes)
{
    size_t bytes = t->cap * sizeof(*t->e);
    for (size_t i = 0; i < t->n; i++) {
        size_t w = mg_quota_level_heap_bytes(&t->e[i].lv->q);
        *windows += w != 0;
        *window_bytes += w;
        bytes += level_size + w;
    }
    return bytes;
}

/* The rate and concurrency limits of a key: the window comes or goes with rpm/tpm (quota.h),
 * a window kept keeps its counts. 0, or -1 (nothing changed) when out of memory. Its spend
 * limits stay in its record. */
static int level_set_key_limits(mg_auth_level_t *lv, const mg_key_record_t *r)
{
    return mg_quota_level_set_limits(&lv->q, r->rpm_limit, r->tpm_limit, r->max_concurrency);
}

/* A project table's level takes the project's limits. 0, or -1 (nothing changed). */
static int level_set_project_limits(mg_auth_level_t *lv, const mg_auth_project_t *p)
{
    if (mg_quota_level_set_limits(&lv->q, p->rpm_limit, p->tpm_limit, p->max_concurrency) != 0)
        return -1;
    project_of(lv)->daily_limit_micros = p->daily_limit_micros;
    project_of(lv)->monthly_limit_micros = p->monthly_limit_micros;
    return 0;
}

/* A tenant table's level takes the tenant's spend limits and billing. */
static void level_set_tenant(mg_auth_level_t *lv, const mg_auth_tenant_t *t)
{
    tenant_level_t *tl = tenant_of(lv);
    tl->daily_limit_micros = t->daily_limit_micros;
    tl->monthly_limit_micros = t->monthly_limit_micros;
    tl->prepaid = t->prepaid ? 1 : 0;
    tl->require_upstream_usage = t->require_upstream_usage ? 1 : 0;
}

/* ---- small parsers ------------------------------------------------------------------------ */

void mg_auth_digest_hex(const unsigned char *digest, char *hex)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < MG_KEY_DIGEST_LEN; i++) {
        hex[2 * i] = d[digest[i] >> 4];
        hex[2 * i + 1] = d[digest[i] & 15];
    }
    hex[2 * MG_KEY_DIGEST_LEN] = '\0';
}

int mg_auth_digest_parse(const char *hex, unsigned char *digest)
{
    if (!hex || strlen(hex) != 2 * MG_KEY_DIGEST_LEN) return -1;
    for (size_t i = 0; i < MG_KEY_DIGEST_LEN; i++) {
        int hi = mg_hex_digit(hex[2 * i]), lo = mg_hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        digest[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* The priority level 0..4 of "P0".."P4", or -1. */
static int priority_level(const char *s)
{
    if (!s || s[0] != 'P' || s[1] < '0' || s[1] > '4' || s[2]) return -1;
    return s[1] - '0';
}

int mg_auth_priorities_parse(const char *json, uint8_t *bits)
{
    *bits = MG_PRIORITY_ALL;
    if (!json || !*json) return 0;
    cJSON *a = cJSON_Parse(json);
    int rc = cJSON_IsArray(a) ? 0 : -1;
    uint8_t b = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        int p = cJSON_IsString(it) ? priority_level(it->valuestring) : -1;
        if (p < 0) rc = -1;
        else b |= (uint8_t)MG_PRIORITY_BIT(p);
    }
    cJSON_Delete(a);
    if (rc == 0 && b) *bits = b;
    return rc;
}

int mg_auth_scopes_parse(const char *json, uint32_t *bits)
{
    *bits = 0;
    cJSON *a = json ? cJSON_Parse(json) : NULL;
    int rc = cJSON_IsArray(a) ? 0 : -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        uint32_t bit = cJSON_IsString(it) ? mg_key_scope_bit(it->valuestring) : 0;
        if (!bit) rc = -1;
        *bits |= bit;
    }
    cJSON_Delete(a);
    return rc;
}

static int64_t col_int(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

static uint32_t col_u32(const char *s)
{
    long long v = s ? strtoll(s, NULL, 10) : 0;
    return v < 0 ? 0 : v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

mg_key_record_t *mg_auth_record_from_row(int ncols, const char *const *cols)
{
    if (ncols < MG_AUTH_KEY_NCOLS || !cols[0] || !cols[1]) return NULL;
    mg_key_record_t t;
    memset(&t, 0, sizeof(t));
    if (mg_auth_digest_parse(cols[3], t.digest) != 0) return NULL;
    t.id = col_int(cols[0]);
    t.tenant_id = col_int(cols[1]);
    t.project_id = col_int(cols[2]);
    if (mg_auth_scopes_parse(cols[4], &t.scopes) != 0 ||
        mg_auth_priorities_parse(cols[6], &t.priorities) != 0)
        return NULL;
    t.rpm_limit = col_u32(cols[7]);
    t.tpm_limit = col_u32(cols[8]);
    t.max_concurrency = col_u32(cols[9]);
    t.max_queued = col_u32(cols[10]);
    t.daily_limit_micros = col_int(cols[11]);
    t.monthly_limit_micros = col_int(cols[12]);
    t.expires_at = col_int(cols[13]);
    t.application = cols[16] && cols[16][0] ? cols[16] : NULL;
    t.enabled = col_int(cols[15]) ? 1 : 0;
    /* the model allowlist: a JSON array of names; [] = every model */
    cJSON *models = cols[5] ? cJSON_Parse(cols[5]) : NULL;
    int n = cJSON_IsArray(models) ? cJSON_GetArraySize(models) : -1;
    const char **names = n > 0 ? calloc((size_t)n, sizeof(*names)) : NULL;
    mg_key_record_t *rec = NULL;
    if (n >= 0 && n <= UINT16_MAX && (n == 0 || names)) {
        int i = 0, ok = 1;
        const cJSON *it;
        cJSON_ArrayForEach(it, models) {
            if (!cJSON_IsString(it)) ok = 0;
            else names[i++] = it->valuestring;
        }
        t.n_models = (uint16_t)n;
        t.models = names;
        if (ok) rec = mg_key_record_new(&t);
    }
    free(names);
    cJSON_Delete(models);
    return rec;
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

mg_auth_t *mg_auth_new(void)
{
    mg_auth_t *a = calloc(1, sizeof(*a));
    if (!a) return NULL;
    if (mg_key_index_init(&a->ix, 0) != MG_KEYS_OK) {
        free(a);
        return NULL;
    }
    return a;
}

void mg_auth_free(mg_auth_t *a)
{
    if (!a) return;
    mg_key_index_free(&a->ix);
    table_free(&a->keys);
    table_free(&a->projects);
    table_free(&a->tenants);
    mg_spend_holds_free(&a->holds);
    free(a);
}

size_t mg_auth_key_count(const mg_auth_t *a)
{
    return a->ix.n;
}

void mg_auth_memory(const mg_auth_t *a, mg_auth_memory_t *m)
{
    memset(m, 0, sizeof(*m));
    m->keys = a->ix.n;
    m->index_bytes = mg_key_index_memory(&a->ix);
    m->level_bytes =
        table_bytes(&a->keys, sizeof(mg_auth_level_t), &m->windows, &m->window_bytes) +
        table_bytes(&a->projects, sizeof(project_level_t), &m->windows, &m->window_bytes) +
        table_bytes(&a->tenants, sizeof(tenant_level_t), &m->windows, &m->window_bytes) +
        a->holds.cap * sizeof(mg_spend_hold_t);
}

/* Rows gathered by the load queries. */
typedef struct load_s {
    mg_key_record_t **recs; /* one reference each */
    size_t n, cap;
    mg_auth_project_t *projects;
    size_t np, pcap;
    mg_auth_tenant_t *tenants;
    size_t nt, tcap;
    int failed;
} load_t;

static void load_key_row(void *ud, int ncols, const char *const *cols)
{
    load_t *l = ud;
    mg_key_record_t *rec = mg_auth_record_from_row(ncols, cols);
    if (!rec) {
        /* a malformed row must not stop every other key from working: skip it loudly */
        mg_log_msg(MG_LOG_ERROR, NULL, "auth: api_keys row %s is malformed; key ignored",
                   ncols > 0 && cols[0] ? cols[0] : "?");
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        mg_key_record_t **v = realloc(l->recs, cap * sizeof(*v));
        if (!v) {
            mg_key_record_unref(rec);
            l->failed = 1;
            return;
        }
        l->recs = v;
        l->cap = cap;
    }
    l->recs[l->n++] = rec;
}

static void load_project_row(void *ud, int ncols, const char *const *cols)
{
    load_t *l = ud;
    if (ncols < 7 || !cols[0]) return;
    if (l->np == l->pcap) {
        size_t cap = l->pcap ? l->pcap * 2 : 16;
        mg_auth_project_t *v = realloc(l->projects, cap * sizeof(*v));
        if (!v) {
            l->failed = 1;
            return;
        }
        l->projects = v;
        l->pcap = cap;
    }
    mg_auth_project_t *p = &l->projects[l->np++];
    p->id = col_int(cols[0]);
    p->tenant_id = col_int(cols[1]);
    p->rpm_limit = col_u32(cols[2]);
    p->tpm_limit = col_u32(cols[3]);
    p->max_concurrency = col_u32(cols[4]);
    p->monthly_limit_micros = col_int(cols[5]);
    p->daily_limit_micros = col_int(cols[6]);
}

static void load_tenant_row(void *ud, int ncols, const char *const *cols)
{
    load_t *l = ud;
    if (ncols < 5 || !cols[0]) return;
    if (l->nt == l->tcap) {
        size_t cap = l->tcap ? l->tcap * 2 : 16;
        mg_auth_tenant_t *v = realloc(l->tenants, cap * sizeof(*v));
        if (!v) {
            l->failed = 1;
            return;
        }
        l->tenants = v;
        l->tcap = cap;
    }
    mg_auth_tenant_t *t = &l->tenants[l->nt++];
    t->id = col_int(cols[0]);
    t->daily_limit_micros = col_int(cols[1]);
    t->monthly_limit_micros = col_int(cols[2]);
    t->prepaid = cols[3] && strcmp(cols[3], "prepaid") == 0;
    t->require_upstream_usage = col_int(cols[4]) != 0;
}

static void load_free(load_t *l)
{
    for (size_t i = 0; i < l->n; i++) mg_key_record_unref(l->recs[i]);
    free(l->recs);
    free(l->projects);
    free(l->tenants);
}

/* Add to `to` the level of id: the one in `from` (another reference) or a new one. */
static mg_auth_level_t *carry_level(level_table_t *to, const level_table_t *from, int64_t id,
                                    int kind)
{
    mg_auth_level_t *lv = table_find(to, id);
    if (lv) return lv; /* a duplicate row: the first one wins */
    if (table_reserve(to, 1) != 0) return NULL;
    lv = table_find(from, id);
    if (lv) lv->refs++;
    else if (!(lv = level_new(id, kind))) return NULL;
    table_insert(to, lv);
    return lv;
}

/* Build the new index and tables from the rows. 0 or -1 (everything built is freed). */
static int build_state(mg_auth_t *a, load_t *l, mg_key_index_t *ix, level_table_t *keys,
                       level_table_t *projects, level_table_t *tenants)
{
    if (mg_key_index_init(ix, l->n) != MG_KEYS_OK) return -1;
    /* sized once: a table grown by doubling would leave up to half of it unused */
    if (table_reserve(keys, l->n) != 0 || table_reserve(projects, l->np) != 0 ||
        table_reserve(tenants, l->nt) != 0)
        return -1;
    for (size_t i = 0; i < l->nt; i++) {
        mg_auth_level_t *lv = carry_level(tenants, &a->tenants, l->tenants[i].id, LV_TENANT);
        if (!lv) return -1;
        level_set_tenant(lv, &l->tenants[i]);
    }
    for (size_t i = 0; i < l->np; i++) {
        mg_auth_level_t *lv = carry_level(projects, &a->projects, l->projects[i].id, LV_PROJECT);
        if (!lv || level_set_project_limits(lv, &l->projects[i]) != 0) return -1;
    }
    for (size_t i = 0; i < l->n; i++) {
        mg_key_record_t *rec = l->recs[i];
        mg_auth_level_t *lv = carry_level(keys, &a->keys, rec->id, LV_KEY);
        if (!lv || level_set_key_limits(lv, rec) != 0) return -1;
        int rc = mg_key_index_insert(ix, rec);
        if (rc == MG_KEYS_EEXIST) continue; /* cannot happen: digest is UNIQUE */
        if (rc != MG_KEYS_OK) return -1;
        l->recs[i] = NULL; /* the index owns it now */
    }
    return 0;
}

static int load_spend(mg_auth_t *a, mg_store_t *st, char *err, size_t errlen);

int mg_auth_load(mg_auth_t *a, mg_store_t *st, char *err, size_t errlen)
{
    load_t l;
    memset(&l, 0, sizeof(l));
    if (mg_store_query(st, "SELECT " MG_AUTH_KEY_COLUMNS " FROM api_keys WHERE revoked_at IS NULL",
                       0, NULL, load_key_row, &l, err, errlen) != 0 ||
        mg_store_query(st,
                       "SELECT id, tenant_id, rpm_limit, tpm_limit, max_concurrency,"
                       " monthly_limit_micros, daily_limit_micros FROM projects",
                       0, NULL, load_project_row, &l, err, errlen) != 0 ||
        mg_store_query(st,
                       "SELECT id, daily_limit_micros, monthly_limit_micros, billing_mode,"
                       " require_upstream_usage FROM tenants",
                       0, NULL, load_tenant_row, &l, err, errlen) != 0) {
        load_free(&l);
        return -1;
    }
    mg_key_index_t ix;
    level_table_t keys = {0}, projects = {0}, tenants = {0};
    memset(&ix, 0, sizeof(ix));
    if (l.failed || build_state(a, &l, &ix, &keys, &projects, &tenants) != 0) {
        snprintf(err, errlen, "out of memory loading %zu keys", l.n);
        if (ix.slots) mg_key_index_free(&ix);
        table_free(&keys);
        table_free(&projects);
        table_free(&tenants);
        load_free(&l);
        return -1;
    }
    /* the switch: nothing below can fail, and nothing runs between these lines */
    mg_key_index_free(&a->ix);
    a->ix = ix;
    table_free(&a->keys);
    a->keys = keys;
    table_free(&a->projects);
    a->projects = projects;
    table_free(&a->tenants);
    a->tenants = tenants;
    a->store = st;
    load_free(&l);
    return load_spend(a, st, err, errlen);
}

void mg_auth_log_status(const mg_auth_t *a, int enabled, const char *listen)
{
    mg_logline_t l;
    if (!enabled) {
        mg_log_begin(&l, MG_LOG_INFO, "auth");
        mg_log_str(&l, "mode", "open");
        mg_log_str(&l, "detail", "auth.enabled is false: inference requests need no key");
        mg_log_end(&l);
        return;
    }
    mg_log_begin(&l, a->ix.n ? MG_LOG_INFO : MG_LOG_WARN, "auth");
    mg_log_str(&l, "mode", "keys");
    mg_log_int(&l, "keys", (int64_t)a->ix.n);
    mg_log_int(&l, "projects", (int64_t)a->projects.n);
    if (!a->ix.n) {
        char hint[600];
        snprintf(hint, sizeof(hint),
                 "no API key exists, so every inference request is refused with 401. Create "
                 "the first one with the admin API (MOONGATE_ADMIN_TOKEN must be set): "
                 "curl -X POST http://%s/api/v2/tenants -H \"Authorization: Bearer "
                 "$MOONGATE_ADMIN_TOKEN\" -d '{\"name\":\"default\"}' then "
                 "curl -X POST http://%s/api/v2/keys -H \"Authorization: Bearer "
                 "$MOONGATE_ADMIN_TOKEN\" -d '{\"tenant_id\":1}' (the key is shown once)",
                 listen ? listen : "HOST:PORT", listen ? listen : "HOST:PORT");
        mg_log_str(&l, "detail", hint);
    }
    mg_log_end(&l);
}

/* ---- the request path ------------------------------------------------------------------------ */

static int refuse(mg_auth_result_t *out, int status, const char *code, const char *reason,
                  const char *message)
{
    out->status = status;
    out->code = code;
    out->reason = reason;
    snprintf(out->message, sizeof(out->message), "%s", message);
    if (status == 429 && out->retry_after_ms < MG_AUTH_MIN_RETRY_MS)
        out->retry_after_ms = MG_AUTH_MIN_RETRY_MS;
    return -1;
}

/* Milliseconds from now_ms to the next UTC midnight (monthly: the first of next month). */
uint64_t mg_auth_until_period_end(uint64_t now_ms, int monthly)
{
    time_t now = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&now, &tm);
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    if (monthly) {
        tm.tm_mday = 1;
        tm.tm_mon++;
    } else {
        tm.tm_mday++;
    }
    time_t end = timegm(&tm); /* normalizes month/day overflow */
    uint64_t end_ms = (uint64_t)end * 1000;
    return end_ms > now_ms ? end_ms - now_ms : MG_AUTH_MIN_RETRY_MS;
}

/* The UTC day (days since 1970) and month (year * 12 + month) of a unix time in ms, and
 * their names in the store ("d:2026-11-30", "m:2026-11"). */
static void spend_period(uint64_t now_ms, int32_t *day, int32_t *month, char *dname, char *mname)
{
    time_t now = (time_t)(now_ms / 1000);
    struct tm tm;
    gmtime_r(&now, &tm);
    *day = (int32_t)(now_ms / 86400000);
    *month = (int32_t)((tm.tm_year + 1900) * 12 + tm.tm_mon);
    if (dname)
        snprintf(dname, 40, "d:%04d-%02d-%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
    if (mname) snprintf(mname, 40, "m:%04d-%02d", tm.tm_year + 1900, tm.tm_mon + 1);
}

/* A new day or month starts its figure at zero. */
static void level_roll(mg_auth_level_t *lv, uint64_t now_ms)
{
    int32_t day = (int32_t)(now_ms / 86400000), month;
    if (lv->day == day) return; /* the same day is the same month: no calendar work */
    spend_period(now_ms, &day, &month, NULL, NULL);
    if (lv->day != day) {
        lv->day = day;
        lv->spent_day_micros = 0;
    }
    if (lv->month != month) {
        lv->month = month;
        lv->spent_month_micros = 0;
    }
}

/* One spend limit of the level at position i (0 = key, 1 = project, 2 = tenant): refused
 * when the period's spend has reached it, or would pass it with what requests in flight
 * hold and this request's estimate. 0 = within (or no limit), -1 = refused (out filled). */
static int check_limit(mg_auth_level_t *lv, size_t i, int64_t limit, int monthly, int64_t held,
                       int64_t est, uint64_t now_ms, mg_auth_result_t *out)
{
    static const char *const whose[3] = {"the API key's", "the project's", "the tenant's"};
    int64_t spent = monthly ? lv->spent_month_micros : lv->spent_day_micros;
    if (limit <= 0 || (spent < limit && spent + held + est <= limit)) return 0;
    char msg[192];
    const char *period = monthly ? "monthly" : "daily";
    out->retry_after_ms = mg_auth_until_period_end(now_ms, monthly);
    out->level = level_name(i);
    const char *what = i == 1 && monthly ? "quota" : "spend limit";
    if (spent >= limit) snprintf(msg, sizeof(msg), "%s %s %s is reached", whose[i], period, what);
    else
        snprintf(msg, sizeof(msg),
                 "%s %s %s would be passed by this request's estimated cost (%lld micros;"
                 " requests in flight hold %lld); lower max_tokens or retry later",
                 whose[i], period, what, (long long)est, (long long)held);
    return refuse(out, 429, "QUOTA_EXCEEDED", monthly ? "monthly_spend" : "daily_spend", msg);
}

/* The daily and monthly limits of one level. */
static int check_spend(mg_auth_t *a, mg_auth_level_t *lv, size_t i, int64_t daily, int64_t monthly,
                       int64_t est, uint64_t now_ms, mg_auth_result_t *out)
{
    level_roll(lv, now_ms);
    int64_t held = mg_spend_held(&a->holds, (mg_spend_scope_t)i, lv->id);
    if (check_limit(lv, i, daily, 0, held, est, now_ms, out)) return -1;
    return check_limit(lv, i, monthly, 1, held, est, now_ms, out);
}

/* Spend limits at the key's level (limits from its record), its project's and its tenant's. */
static int check_spends(mg_auth_t *a, mg_auth_level_t **lv, size_t n, mg_auth_level_t *tenant,
                        const mg_key_record_t *rec, int64_t est, uint64_t now_ms,
                        mg_auth_result_t *out)
{
    if (check_spend(a, lv[0], 0, rec->daily_limit_micros, rec->monthly_limit_micros, est, now_ms,
                    out))
        return -1;
    if (n > 1 && check_spend(a, lv[1], 1, project_of(lv[1])->daily_limit_micros,
                             project_of(lv[1])->monthly_limit_micros, est, now_ms, out))
        return -1;
    if (tenant && check_spend(a, tenant, 2, tenant_of(tenant)->daily_limit_micros,
                              tenant_of(tenant)->monthly_limit_micros, est, now_ms, out))
        return -1;
    return 0;
}

/* Hold the estimate (> 0; nothing to hold otherwise) at every level of a granted result,
 * all or none, under the ids the levels have now (a rotation renames a key's level; the
 * hold must go from where it was put). 0 or -1 (out of memory: nothing held). */
static int spend_hold(mg_auth_t *a, mg_auth_result_t *r, int64_t est)
{
    mg_auth_level_t *lv[3] = {r->levels[0], r->n_levels > 1 ? r->levels[1] : NULL, r->tenant_level};
    if (est <= 0) return 0;
    for (size_t i = 0; i < 3; i++) {
        r->spend_hold_ids[i] = lv[i] ? lv[i]->id : 0;
        if (!lv[i] || mg_spend_hold(&a->holds, (mg_spend_scope_t)i, lv[i]->id, est) == 0) continue;
        while (i-- > 0)
            if (lv[i]) mg_spend_unhold(&a->holds, (mg_spend_scope_t)i, lv[i]->id, est);
        return -1;
    }
    r->spend_hold_micros = est;
    r->spend_held = 1;
    return 0;
}

/* Give the result's spend hold back (once). */
static void spend_unhold(mg_auth_t *a, mg_auth_result_t *r)
{
    if (!r->spend_held) return;
    for (size_t i = 0; i < 3; i++)
        if (r->spend_hold_ids[i])
            mg_spend_unhold(&a->holds, (mg_spend_scope_t)i, r->spend_hold_ids[i],
                            r->spend_hold_micros);
    r->spend_held = 0;
}

/* The levels' spend limits and figures (rolled to now by check_spends) into the result. */
static void spend_view(mg_auth_result_t *r, mg_auth_level_t **lv, size_t n, mg_auth_level_t *tenant,
                       const mg_key_record_t *rec, uint64_t now_ms)
{
    mg_auth_level_t *l[3] = {lv[0], n > 1 ? lv[1] : NULL, tenant};
    int64_t lim[3][2] = {{rec->daily_limit_micros, rec->monthly_limit_micros},
                         {n > 1 ? project_of(lv[1])->daily_limit_micros : 0,
                          n > 1 ? project_of(lv[1])->monthly_limit_micros : 0},
                         {tenant ? tenant_of(tenant)->daily_limit_micros : 0,
                          tenant ? tenant_of(tenant)->monthly_limit_micros : 0}};
    for (size_t i = 0; i < 3; i++) {
        mg_auth_spend_view_t *v = &r->spend[i];
        memset(v, 0, sizeof(*v));
        if (!l[i]) continue;
        v->id = l[i]->id;
        v->daily = lim[i][0];
        v->monthly = lim[i][1];
        v->spent_day = l[i]->spent_day_micros;
        v->spent_month = l[i]->spent_month_micros;
    }
    int32_t day, month;
    char dname[40], mname[40];
    spend_period(now_ms, &day, &month, dname, mname);
    snprintf(r->spend_day, sizeof(r->spend_day), "%.15s", dname + 2); /* without "d:" */
    snprintf(r->spend_month, sizeof(r->spend_month), "%.15s", mname + 2);
}

/* A refused reservation (rc from mg_quota_reserve) as the result's 429. Returns -1. */
static int refuse_quota(mg_auth_result_t *out, int rc)
{
    const char *who = level_name(out->res.refused_level == 1);
    const char *lim = mg_quota_limit_name(out->res.refused_limit);
    char msg[160];
    out->level = who;
    if (rc == MG_QUOTA_TOO_LARGE) {
        snprintf(msg, sizeof(msg),
                 "the request's estimated tokens exceed the %s's tpm_limit; lower max_tokens", who);
        return refuse(out, 429, "RATE_LIMITED", "too_large", msg);
    }
    out->retry_after_ms = out->res.retry_after_ms;
    snprintf(msg, sizeof(msg), "the %s's %s limit is reached; retry later", who, lim);
    return refuse(out, 429, "RATE_LIMITED", lim, msg);
}

/* Reserve at the key's and the project's levels (rates) and hold the estimated cost there
 * and at the tenant's (spend); -1 = refused (out filled). */
static int reserve(mg_auth_t *a, const mg_key_record_t *rec, uint64_t now_ms, int64_t est,
                   int64_t est_micros, mg_auth_result_t *out)
{
    mg_auth_level_t *lv[2];
    size_t n = 0;
    lv[n++] = table_find(&a->keys, rec->id);
    if (!lv[0]) return refuse(out, 401, "AUTH_FAILED", "unknown", "invalid API key");
    if (rec->project_id > 0 && (lv[n] = table_find(&a->projects, rec->project_id))) n++;
    /* a tenant created after the last load has no level yet: its first request makes it (no
     * limits until PUT .../billing sets them; its spend is counted from the start) */
    int created;
    mg_auth_level_t *tenant =
        rec->tenant_id > 0 ? table_get(&a->tenants, rec->tenant_id, LV_TENANT, &created) : NULL;
    if (est_micros < 0) est_micros = 0;
    if (check_spends(a, lv, n, tenant, rec, est_micros, now_ms, out) != 0) return -1;
    mg_quota_level_t *q[2] = {&lv[0]->q, n > 1 ? &lv[1]->q : NULL};
    if (!out->quota_deferred) {
        int rc = mg_quota_reserve(q, n, now_ms, est > 0 ? (uint64_t)est : 0, &out->res);
        if (rc != MG_QUOTA_OK) return refuse_quota(out, rc);
    }
    for (size_t i = 0; i < n; i++) {
        lv[i]->refs++;
        out->levels[i] = lv[i];
    }
    out->n_levels = n;
    if (tenant) {
        tenant->refs++;
        out->tenant_level = tenant;
        out->prepaid = tenant_of(tenant)->prepaid;
        out->require_upstream_usage = tenant_of(tenant)->require_upstream_usage;
    }
    out->held = 1;
    spend_view(out, lv, n, tenant, rec, now_ms);
    if (spend_hold(a, out, est_micros) != 0) {
        mg_auth_release(out);
        return refuse(out, 503, "RESOURCE_EXHAUSTED", "memory", "out of memory; retry later");
    }
    return 0;
}

/* Queue a last_used_at update for the writer thread, at most once per key per period. */
static void note_used(mg_auth_t *a, mg_auth_level_t *lv, uint64_t now_ms)
{
    int64_t now_s = (int64_t)(now_ms / 1000);
    if (!a->store || now_s < (int64_t)lv->last_used_written_s + MG_AUTH_LAST_USED_EVERY_S) return;
    lv->last_used_written_s = (uint32_t)now_s;
    char id[24], at[24];
    snprintf(id, sizeof(id), "%lld", (long long)lv->id);
    snprintf(at, sizeof(at), "%lld", (long long)now_s);
    const char *p[2] = {id, at};
    if (mg_store_write(a->store,
                       "UPDATE api_keys SET last_used_at = CAST(?2 AS INTEGER) WHERE id = ?1"
                       " AND (last_used_at IS NULL OR last_used_at < CAST(?2 AS INTEGER))",
                       2, p) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "auth: last_used_at of key %s not recorded", id);
}

/* With no key at all, say (at most once a minute) how to create the first one. */
static void hint_no_keys(mg_auth_t *a, uint64_t now_ms)
{
    if (a->ix.n || (a->hint_logged_ms && now_ms - a->hint_logged_ms < 60000)) return;
    a->hint_logged_ms = now_ms;
    mg_log_msg(MG_LOG_WARN, NULL,
               "auth: request refused because no API key exists; create one with "
               "POST /api/v2/tenants then POST /api/v2/keys (Authorization: Bearer "
               "$MOONGATE_ADMIN_TOKEN)");
}

int mg_auth_authenticate_key(mg_auth_t *a, const char *key, size_t n, uint64_t now_ms,
                             mg_auth_result_t *out)
{
    memset(out, 0, sizeof(*out));
    out->res.refused_level = -1;
    if (!key || n == 0) {
        hint_no_keys(a, now_ms);
        return refuse(out, 401, "AUTH_FAILED", "missing",
                      "missing API key: send Authorization: Bearer <key> or x-api-key: <key>");
    }
    mg_key_record_t *rec = NULL;
    mg_key_result_t kr = mg_key_index_lookup(&a->ix, key, n, (int64_t)(now_ms / 1000), &rec);
    if (kr != MG_KEY_OK) {
        hint_no_keys(a, now_ms);
        /* one answer for unknown, expired and disabled: the reason goes to the log only */
        return refuse(out, 401, "AUTH_FAILED", mg_key_result_name(kr),
                      "invalid API key (unknown, expired or disabled)");
    }
    out->rec = rec;
    out->key_id = rec->id;
    out->tenant_id = rec->tenant_id;
    out->max_queued = rec->max_queued;
    mg_key_display_matched(key, n, out->key_display);
    return 0;
}

int mg_auth_admit(mg_auth_t *a, mg_auth_result_t *out, const char *model, const char *priority,
                  uint64_t now_ms, int64_t est_tokens, int64_t est_micros)
{
    const mg_key_record_t *rec = out->rec;
    out->rec = NULL; /* borrowed for this call only */
    if (!rec) return refuse(out, 401, "AUTH_FAILED", "missing", "not authenticated");
    if (!mg_key_has_scopes(rec, MG_SCOPE_INFERENCE))
        return refuse(out, 403, "PERMISSION_DENIED", "scope",
                      "this API key does not have the 'inference' scope");
    if (!mg_key_allows_model(rec, model))
        return refuse(out, 403, "PERMISSION_DENIED", "model",
                      "this API key is not allowed to use this model");
    int p = priority ? priority_level(priority) : 2;
    if (!mg_key_allows_priority(rec, p))
        return refuse(out, 403, "PERMISSION_DENIED", "priority",
                      "this API key is not allowed to use this priority");
    out->auth = a;
    if (reserve(a, rec, now_ms, est_tokens, est_micros, out) != 0) return -1;
    out->project_id = out->n_levels > 1 ? rec->project_id : 0;
    out->reason = "ok";
    note_used(a, out->levels[0], now_ms);
    return 0;
}

int mg_auth_check_key(mg_auth_t *a, const char *key, size_t n, const char *model,
                      const char *priority, uint64_t now_ms, int64_t est_tokens,
                      mg_auth_result_t *out)
{
    if (mg_auth_authenticate_key(a, key, n, now_ms, out) != 0) return -1;
    return mg_auth_admit(a, out, model, priority, now_ms, est_tokens, 0);
}

/* The presented key: "Authorization: Bearer <key>", else "x-api-key: <key>". */
static const char *presented_key(const mg_http_req_t *req, size_t *n)
{
    const char *k = NULL;
    const char *h = mg_http_header(req, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0) k = h + 7;
    if (!k || !*k) k = mg_http_header(req, "x-api-key");
    if (!k) return NULL;
    while (*k == ' ' || *k == '\t') k++;
    size_t len = strlen(k);
    while (len > 0 && (k[len - 1] == ' ' || k[len - 1] == '\t')) len--;
    *n = len;
    return len ? k : NULL;
}

int mg_auth_identify(mg_auth_t *a, const mg_http_req_t *req, uint64_t now_ms, int64_t *tenant,
                     int64_t *project)
{
    size_t n = 0;
    const char *key = presented_key(req, &n);
    mg_key_record_t *rec = NULL;
    if (!key || mg_key_index_lookup(&a->ix, key, n, (int64_t)(now_ms / 1000), &rec) != MG_KEY_OK)
        return -1;
    *tenant = rec->tenant_id;
    *project = rec->project_id;
    return 0;
}

int mg_auth_check(mg_auth_t *a, const mg_http_req_t *req, const char *model, const char *priority,
                  uint64_t now_ms, int64_t est_tokens, mg_auth_result_t *out)
{
    size_t n = 0;
    const char *key = presented_key(req, &n);
    return mg_auth_check_key(a, key, n, model, priority, now_ms, est_tokens, out);
}

int mg_auth_authenticate(mg_auth_t *a, const mg_http_req_t *req, uint64_t now_ms,
                         mg_auth_result_t *out)
{
    size_t n = 0;
    const char *key = presented_key(req, &n);
    return mg_auth_authenticate_key(a, key, n, now_ms, out);
}

/* x / share rounded up; 0 (no limit) stays 0. */
static uint64_t share_of(uint64_t x, int share)
{
    return x && share > 1 ? (x + (uint64_t)share - 1) / (uint64_t)share : x;
}

int mg_auth_quota_local(mg_auth_result_t *out, uint64_t now_ms, int64_t est_tokens, int share)
{
    if (!out->held || !out->quota_deferred || out->res.held) return 0;
    mg_quota_level_t *q[2] = {NULL, NULL};
    uint32_t rpm[2] = {0, 0}, conc[2] = {0, 0};
    uint64_t tpm[2] = {0, 0};
    /* the share applies to this one decision: the levels keep their whole limits (one
     * thread; nothing else looks at them in between) */
    for (size_t i = 0; i < out->n_levels; i++) {
        q[i] = &out->levels[i]->q;
        conc[i] = q[i]->max_concurrency;
        q[i]->max_concurrency = (uint32_t)share_of(conc[i], share);
        if (!q[i]->win) continue;
        rpm[i] = q[i]->win->rpm_limit;
        tpm[i] = q[i]->win->tpm_limit;
        q[i]->win->rpm_limit = (uint32_t)share_of(rpm[i], share);
        q[i]->win->tpm_limit = share_of(tpm[i], share);
    }
    out->quota_deferred = 0;
    int rc = mg_quota_reserve(q, out->n_levels, now_ms, est_tokens > 0 ? (uint64_t)est_tokens : 0,
                              &out->res);
    for (size_t i = 0; i < out->n_levels; i++) {
        q[i]->max_concurrency = conc[i];
        if (!q[i]->win) continue;
        q[i]->win->rpm_limit = rpm[i];
        q[i]->win->tpm_limit = tpm[i];
    }
    return rc == MG_QUOTA_OK ? 0 : refuse_quota(out, rc);
}

int mg_auth_level_limits(const mg_auth_result_t *r, size_t i, int64_t *id, uint32_t *rpm,
                         uint64_t *tpm, uint32_t *conc)
{
    if (!r->held || i >= r->n_levels) return -1;
    const mg_quota_level_t *q = &r->levels[i]->q;
    *id = r->levels[i]->id;
    *rpm = q->win ? q->win->rpm_limit : 0;
    *tpm = q->win ? q->win->tpm_limit : 0;
    *conc = q->max_concurrency;
    return 0;
}

void mg_auth_settle(mg_auth_result_t *r, int64_t actual_tokens)
{
    if (!r || !r->held || r->res.settled) return;
    mg_quota_settle(&r->res, actual_tokens > 0 ? (uint64_t)actual_tokens : 0);
}

void mg_auth_release(mg_auth_result_t *r)
{
    if (!r || !r->held) return;
    if (r->spend_held) spend_unhold(r->auth, r); /* ended without a charge: the hold goes */
    mg_quota_release(&r->res);
    for (size_t i = 0; i < r->n_levels; i++) {
        level_unref(r->levels[i]);
        r->levels[i] = NULL;
    }
    r->n_levels = 0;
    level_unref(r->tenant_level);
    r->tenant_level = NULL;
    r->held = 0;
}

void mg_auth_set_spend(mg_auth_t *a, int64_t key_id, int64_t project_id, int64_t day_micros,
                       int64_t month_micros, uint64_t now_ms)
{
    mg_auth_level_t *lv[2] = {key_id > 0 ? table_find(&a->keys, key_id) : NULL,
                              project_id > 0 ? table_find(&a->projects, project_id) : NULL};
    for (int i = 0; i < 2; i++) {
        if (!lv[i]) continue;
        level_roll(lv[i], now_ms);
        if (day_micros >= 0) lv[i]->spent_day_micros = day_micros;
        if (month_micros >= 0) lv[i]->spent_month_micros = month_micros;
    }
}

/* The charge's store rows (scope "key" or "project", both periods per level) as one
 * upsert, so that one commit callback covers all of them. */
#define SPEND_UPSERT_HEAD "INSERT INTO spend(scope, id, period, micros) VALUES "
#define SPEND_UPSERT_TAIL                                                                          \
    " ON CONFLICT(scope, id, period) DO UPDATE SET micros = micros + excluded.micros"

/* The levels a result charges: key, project (or NULL), tenant (or NULL). */
static void charged_levels(const mg_auth_result_t *r, mg_auth_level_t **lv)
{
    lv[0] = r->n_levels > 0 ? r->levels[0] : NULL;
    lv[1] = r->n_levels > 1 ? r->levels[1] : NULL;
    lv[2] = r->tenant_level;
}

static int persist_spend(mg_auth_t *a, const mg_auth_result_t *r, int64_t micros, const char *dname,
                         const char *mname, mg_store_done_fn done, void *ud)
{
    /* ?1 micros, ?2 day, ?3 month, then per level ?(4+2n) scope and ?(5+2n) id */
    char sql[sizeof(SPEND_UPSERT_HEAD) + sizeof(SPEND_UPSERT_TAIL) + 3 * 64 * 2];
    char m[24], ids[3][24];
    const char *p[9] = {m, dname, mname};
    mg_auth_level_t *lv[3];
    charged_levels(r, lv);
    size_t n = 0, len = (size_t)snprintf(sql, sizeof(sql), "%s", SPEND_UPSERT_HEAD);
    snprintf(m, sizeof(m), "%lld", (long long)micros);
    for (size_t i = 0; i < 3; i++) {
        if (!lv[i]) continue;
        snprintf(ids[n], sizeof(ids[n]), "%lld", (long long)lv[i]->id);
        p[3 + 2 * n] = level_name(i);
        p[4 + 2 * n] = ids[n];
        int s_ = (int)(4 + 2 * n), id_ = s_ + 1;
        len += (size_t)snprintf(sql + len, sizeof(sql) - len,
                                "%s(?%d, ?%d, ?2, ?1), (?%d, ?%d, ?3, ?1)", n ? ", " : "", s_, id_,
                                s_, id_);
        n++;
    }
    snprintf(sql + len, sizeof(sql) - len, "%s", SPEND_UPSERT_TAIL);
    if (mg_store_write_cb(a->store, sql, (int)(3 + 2 * n), p, done, ud) != 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "spend of key %s not stored: the store is not writable",
                   ids[0]);
        return -1;
    }
    return 1;
}

int mg_auth_charge(mg_auth_t *a, mg_auth_result_t *r, int64_t micros, uint64_t now_ms,
                   mg_store_done_fn done, void *ud)
{
    if (!r || !r->held) return 0;
    spend_unhold(a, r); /* the estimate gives way to the actual cost, in the same turn */
    if (micros <= 0 || r->n_levels == 0) return 0;
    char dname[40], mname[40];
    int32_t day, month;
    spend_period(now_ms, &day, &month, dname, mname);
    mg_auth_level_t *lv[3];
    charged_levels(r, lv);
    for (size_t i = 0; i < 3; i++) {
        if (!lv[i]) continue;
        level_roll(lv[i], now_ms);
        lv[i]->spent_day_micros += micros;
        lv[i]->spent_month_micros += micros;
    }
    return a->store ? persist_spend(a, r, micros, dname, mname, done, ud) : 0;
}

/* The spend of the current periods, from the store (start-up and reloads). */
typedef struct spend_load_s {
    mg_auth_t *a;
    uint64_t now_ms;
} spend_load_t;

static void load_spend_row(void *ud, int ncols, const char *const *c)
{
    spend_load_t *sl = ud;
    if (ncols < 4 || !c[0] || !c[1] || !c[2] || !c[3]) return;
    int64_t id = strtoll(c[1], NULL, 10), micros = strtoll(c[3], NULL, 10);
    int project = strcmp(c[0], LEVEL_PROJECT) == 0;
    int daily = c[2][0] == 'd';
    if (strcmp(c[0], LEVEL_TENANT) == 0) {
        mg_auth_level_t *lv = table_find(&sl->a->tenants, id);
        if (!lv) return;
        level_roll(lv, sl->now_ms);
        if (daily) lv->spent_day_micros = micros;
        else lv->spent_month_micros = micros;
        return;
    }
    mg_auth_set_spend(sl->a, project ? 0 : id, project ? id : 0, daily ? micros : -1,
                      daily ? -1 : micros, sl->now_ms);
}

static int load_spend(mg_auth_t *a, mg_store_t *st, char *err, size_t errlen)
{
    char dname[40], mname[40];
    int32_t day, month;
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    spend_load_t sl = {a, (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000};
    spend_period(sl.now_ms, &day, &month, dname, mname);
    const char *p[2] = {dname, mname};
    return mg_store_query(st,
                          "SELECT scope, id, period, micros FROM spend WHERE period IN (?1, ?2)", 2,
                          p, load_spend_row, &sl, err, errlen);
}

/* ---- changes after an admin commit ----------------------------------------------------------- */

/* Index rec and give lv the limits of tmpl: both or neither. Of the two steps only
 * indexing a new digest (the table may grow) and a window for new limits can fail; each
 * is done while the other can still be undone. Takes over the reference to rec (dropped
 * on failure). 0 or a negative MG_KEYS_* code. */
static int index_put(mg_auth_t *a, mg_auth_level_t *lv, mg_key_record_t *rec,
                     const mg_key_record_t *tmpl)
{
    int rc;
    if (mg_key_index_find(&a->ix, tmpl->digest)) {
        /* a policy update: replacing in place cannot fail, so the limits go first */
        if (level_set_key_limits(lv, tmpl) != 0) {
            mg_key_record_unref(rec);
            return MG_KEYS_ENOMEM;
        }
        rc = mg_key_index_replace(&a->ix, tmpl->digest, rec);
        if (rc != MG_KEYS_OK) mg_key_record_unref(rec); /* not reached: found above */
        return rc;
    }
    if ((rc = mg_key_index_insert(&a->ix, rec)) != MG_KEYS_OK) {
        mg_key_record_unref(rec);
        return rc;
    }
    if (level_set_key_limits(lv, tmpl) != 0) {
        mg_key_index_remove(&a->ix, tmpl->digest); /* drops rec */
        return MG_KEYS_ENOMEM;
    }
    return MG_KEYS_OK;
}

int mg_auth_put_key(mg_auth_t *a, const mg_key_record_t *tmpl)
{
    int created;
    mg_auth_level_t *lv = table_get(&a->keys, tmpl->id, 0, &created);
    mg_key_record_t *rec = lv ? mg_key_record_new(tmpl) : NULL;
    int rc = rec ? index_put(a, lv, rec, tmpl) : MG_KEYS_ENOMEM;
    if (rc != MG_KEYS_OK && created) level_unref(table_take(&a->keys, tmpl->id));
    return rc;
}

int mg_auth_remove_key(mg_auth_t *a, const unsigned char *digest)
{
    mg_key_record_t *rec = mg_key_index_find(&a->ix, digest);
    if (!rec) return MG_KEYS_ENOENT;
    int64_t id = rec->id;
    mg_key_index_remove(&a->ix, digest); /* rec may be freed now */
    level_unref(table_take(&a->keys, id));
    return MG_KEYS_OK;
}

int mg_auth_rotate_key(mg_auth_t *a, const unsigned char *old_digest, const mg_key_record_t *tmpl)
{
    mg_key_record_t *old = mg_key_index_find(&a->ix, old_digest);
    if (!old) return MG_KEYS_ENOENT;
    int64_t old_id = old->id;
    /* everything that can fail happens before the index changes; after these checks
     * mg_key_index_replace() cannot (no clash, and the count does not rise) */
    mg_key_record_t *clash = mg_key_index_find(&a->ix, tmpl->digest);
    if (clash && clash != old) return MG_KEYS_EEXIST;
    if (table_reserve(&a->keys, 1) != 0) return MG_KEYS_ENOMEM;
    mg_auth_level_t *lv = table_find(&a->keys, old_id);
    mg_key_record_t *rec = mg_key_record_new(tmpl);
    mg_auth_level_t *fresh = rec && !lv ? level_new(tmpl->id, 0) : NULL;
    mg_auth_level_t *target = lv ? lv : fresh;
    int rc = rec && target && level_set_key_limits(target, tmpl) == 0 ? MG_KEYS_OK : MG_KEYS_ENOMEM;
    if (rc == MG_KEYS_OK) rc = mg_key_index_replace(&a->ix, old_digest, rec);
    if (rc != MG_KEYS_OK) {
        mg_key_record_unref(rec);
        level_unref(fresh);
        return rc;
    }
    /* the new id takes over the old key's level (its window and leases) */
    if (lv) table_take(&a->keys, old_id);        /* its table reference moves with it */
    level_unref(table_take(&a->keys, tmpl->id)); /* a stale level under the new id, if any */
    target->id = tmpl->id;
    table_insert(&a->keys, target);
    return MG_KEYS_OK;
}

int mg_auth_put_project(mg_auth_t *a, const mg_auth_project_t *p)
{
    int created;
    mg_auth_level_t *lv = table_get(&a->projects, p->id, LV_PROJECT, &created);
    if (!lv) return -1;
    if (level_set_project_limits(lv, p) != 0) {
        if (created) level_unref(table_take(&a->projects, p->id));
        return -1;
    }
    return 0;
}

int mg_auth_put_tenant(mg_auth_t *a, const mg_auth_tenant_t *t)
{
    int created;
    mg_auth_level_t *lv = table_get(&a->tenants, t->id, LV_TENANT, &created);
    if (!lv) return -1;
    level_set_tenant(lv, t);
    return 0;
}

int64_t mg_auth_spend_held(const mg_auth_t *a, int scope, int64_t id)
{
    return scope < 0 || scope > 2 ? 0 : mg_spend_held(&a->holds, (mg_spend_scope_t)scope, id);
}
