/* session: the sessions in memory and their rows in the store; see session.h.
 *
 * The rows: sessions (one per session: owner, settings as JSON, summary, times) and
 * session_messages (one per message, keyed by session and seq). Every write goes to the
 * store's writer thread in the order made, so a deletion queued after an append removes
 * what the append wrote. */
#include "session/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crypto.h"
#include "base/json.h"
#include "base/log.h"

#define N_BUCKETS 4096
#define SWEEP_EVERY_MS 1000

/* The trimming steps the shipped policy names; any other counts as "other". */
static const char *const TRIM_STEPS[] = {"drop_snippets",     "compress_tool_results",
                                         "drop_oldest_turns", "shrink_retrieval",
                                         "switch_route",      "other"};
#define N_TRIM_STEPS (sizeof(TRIM_STEPS) / sizeof(TRIM_STEPS[0]))

struct mg_sessions_s {
    uint64_t trims[N_TRIM_STEPS];
    uint64_t too_large, summaries[2]; /* summaries: failed, ok */
    mg_store_t *store;                /* borrowed; NULL or !persist: memory only */
    int persist;
    mg_session_t *buckets[N_BUCKETS];
    mg_session_t *lru_head, *lru_tail;
    size_t count, bytes;
    int64_t last_sweep_ms;
};

static unsigned bucket_of(const char *id)
{
    unsigned h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) h = (h ^ *p) * 16777619u;
    return h % N_BUCKETS;
}

/* ---- the LRU list and the table ------------------------------------------------------- */

static void lru_unlink(mg_sessions_t *s, mg_session_t *x)
{
    if (x->lru_prev) x->lru_prev->lru_next = x->lru_next;
    else s->lru_head = x->lru_next;
    if (x->lru_next) x->lru_next->lru_prev = x->lru_prev;
    else s->lru_tail = x->lru_prev;
    x->lru_prev = x->lru_next = NULL;
}

static void lru_front(mg_sessions_t *s, mg_session_t *x)
{
    x->lru_next = s->lru_head;
    if (s->lru_head) s->lru_head->lru_prev = x;
    s->lru_head = x;
    if (!s->lru_tail) s->lru_tail = x;
}

static void insert(mg_sessions_t *s, mg_session_t *x)
{
    unsigned b = bucket_of(x->id);
    x->hnext = s->buckets[b];
    s->buckets[b] = x;
    lru_front(s, x);
    s->count++;
    s->bytes += x->bytes;
}

static mg_session_t *lookup(mg_sessions_t *s, const char *id)
{
    for (mg_session_t *x = s->buckets[bucket_of(id)]; x; x = x->hnext)
        if (strcmp(x->id, id) == 0) return x;
    return NULL;
}

static void session_free(mg_session_t *x)
{
    for (size_t i = 0; i < x->n_msgs; i++) free(x->msgs[i].json);
    free(x->msgs);
    free(x->model);
    free(x->system);
    free(x->policy);
    free(x->metadata);
    free(x->summary);
    free(x);
}

/* Out of the table and the list, and freed. */
static void forget(mg_sessions_t *s, mg_session_t *x)
{
    mg_session_t **pp = &s->buckets[bucket_of(x->id)];
    while (*pp && *pp != x) pp = &(*pp)->hnext;
    if (*pp) *pp = x->hnext;
    lru_unlink(s, x);
    s->count--;
    s->bytes -= x->bytes;
    session_free(x);
}

/* ---- persistence ---------------------------------------------------------------------- */

static int persisting(const mg_sessions_t *s)
{
    return s->store && s->persist;
}

static char *settings_json(const mg_session_t *x)
{
    cJSON *o = cJSON_CreateObject();
    if (x->model) cJSON_AddStringToObject(o, "model", x->model);
    if (x->system) cJSON_AddStringToObject(o, "system", x->system);
    if (x->policy) cJSON_AddStringToObject(o, "context_policy", x->policy);
    if (x->metadata) cJSON_AddRawToObject(o, "metadata", x->metadata);
    cJSON_AddNumberToObject(o, "max_messages", x->max_messages);
    cJSON_AddNumberToObject(o, "max_tokens", (double)x->max_tokens);
    cJSON_AddNumberToObject(o, "ttl_seconds", x->ttl_s);
    cJSON_AddNumberToObject(o, "idle_timeout_seconds", x->idle_s);
    cJSON_AddNumberToObject(o, "next_seq", (double)x->next_seq);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* The session's row (made or replaced): settings, summary and times. */
static void persist_session(mg_sessions_t *s, const mg_session_t *x)
{
    if (!persisting(s)) return;
    char *settings = settings_json(x);
    char tenant[24], project[24], created[24], active[24], expires[24];
    snprintf(tenant, sizeof(tenant), "%lld", (long long)x->tenant_id);
    snprintf(project, sizeof(project), "%lld", (long long)x->project_id);
    snprintf(created, sizeof(created), "%lld", (long long)x->created_ms);
    snprintf(active, sizeof(active), "%lld", (long long)x->last_active_ms);
    snprintf(expires, sizeof(expires), "%lld", (long long)mg_session_expires_ms(x));
    const char *p[8] = {x->id,      tenant,  project, settings ? settings : "{}",
                        x->summary, created, active,  expires};
    if (mg_store_write(s->store,
                       "INSERT INTO sessions(id, tenant_id, project_id, settings, summary,"
                       " created_ms, last_active_ms, expires_ms) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)"
                       " ON CONFLICT(id) DO UPDATE SET settings = excluded.settings,"
                       " summary = excluded.summary, last_active_ms = excluded.last_active_ms,"
                       " expires_ms = excluded.expires_ms",
                       8, p) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "session %s: its row could not be queued", x->id);
    free(settings);
}

static void persist_message(mg_sessions_t *s, const mg_session_t *x, const mg_session_msg_t *m)
{
    if (!persisting(s)) return;
    char seq[24], created[24], tokens[24];
    snprintf(seq, sizeof(seq), "%lld", (long long)m->seq);
    snprintf(created, sizeof(created), "%lld", (long long)m->created_ms);
    snprintf(tokens, sizeof(tokens), "%ld", m->tokens);
    const char *p[5] = {x->id, seq, created, tokens, m->json};
    mg_store_write(s->store,
                   "INSERT OR REPLACE INTO session_messages(session_id, seq, created_ms, tokens,"
                   " message) VALUES (?1, ?2, ?3, ?4, ?5)",
                   5, p);
}

static void unpersist(mg_sessions_t *s, const char *id)
{
    if (!persisting(s)) return;
    const char *p[1] = {id};
    mg_store_write(s->store, "DELETE FROM session_messages WHERE session_id = ?1", 1, p);
    mg_store_write(s->store, "DELETE FROM sessions WHERE id = ?1", 1, p);
}

/* ---- start-up ------------------------------------------------------------------------- */

static char *dup_or_null(const cJSON *v)
{
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

static int num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return mg_json_int(v, 0);
}

static void load_session_row(void *ud, int ncols, const char *const *cols)
{
    mg_sessions_t *s = ud;
    if (ncols < 7 || !cols[0] || strlen(cols[0]) > MG_SESSION_ID_LEN || lookup(s, cols[0])) return;
    mg_session_t *x = calloc(1, sizeof(*x));
    cJSON *set = cJSON_Parse(cols[3] ? cols[3] : "{}");
    if (!x || !set) {
        free(x);
        cJSON_Delete(set);
        return;
    }
    snprintf(x->id, sizeof(x->id), "%s", cols[0]);
    x->tenant_id = cols[1] ? atoll(cols[1]) : 0;
    x->project_id = cols[2] ? atoll(cols[2]) : 0;
    x->model = dup_or_null(cJSON_GetObjectItemCaseSensitive(set, "model"));
    x->system = dup_or_null(cJSON_GetObjectItemCaseSensitive(set, "system"));
    x->policy = dup_or_null(cJSON_GetObjectItemCaseSensitive(set, "context_policy"));
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(set, "metadata");
    x->metadata = cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
    x->max_messages = num(set, "max_messages");
    x->max_tokens = num(set, "max_tokens");
    x->ttl_s = num(set, "ttl_seconds");
    x->idle_s = num(set, "idle_timeout_seconds");
    x->next_seq = num(set, "next_seq");
    if (x->next_seq < 1) x->next_seq = 1;
    x->summary = cols[4] ? strdup(cols[4]) : NULL;
    x->created_ms = cols[5] ? atoll(cols[5]) : 0;
    x->last_active_ms = cols[6] ? atoll(cols[6]) : 0;
    cJSON_Delete(set);
    insert(s, x);
}

static int grow(mg_session_t *x)
{
    if (x->n_msgs < x->cap_msgs) return 0;
    size_t cap = x->cap_msgs ? x->cap_msgs * 2 : 8;
    mg_session_msg_t *m = realloc(x->msgs, cap * sizeof(*m));
    if (!m) return -1;
    x->msgs = m;
    x->cap_msgs = cap;
    return 0;
}

static void load_message_row(void *ud, int ncols, const char *const *cols)
{
    mg_sessions_t *s = ud;
    mg_session_t *x = ncols >= 5 && cols[0] && cols[4] ? lookup(s, cols[0]) : NULL;
    if (!x || grow(x) != 0) return;
    mg_session_msg_t *m = &x->msgs[x->n_msgs];
    m->seq = cols[1] ? atoll(cols[1]) : 0;
    m->created_ms = cols[2] ? atoll(cols[2]) : 0;
    m->tokens = cols[3] ? atol(cols[3]) : -1;
    m->encoding = -1;
    m->json = strdup(cols[4]);
    if (!m->json) return;
    x->n_msgs++;
    size_t n = strlen(m->json);
    x->bytes += n;
    s->bytes += n;
    if (m->seq >= x->next_seq) x->next_seq = m->seq + 1;
}

static void load(mg_sessions_t *s, int64_t now_ms)
{
    char now[24], err[256];
    snprintf(now, sizeof(now), "%lld", (long long)now_ms);
    const char *p[1] = {now};
    /* what expired while the process was down goes first, on the writer thread */
    mg_store_write(s->store,
                   "DELETE FROM session_messages WHERE session_id IN"
                   " (SELECT id FROM sessions WHERE expires_ms <= ?1)",
                   1, p);
    mg_store_write(s->store, "DELETE FROM sessions WHERE expires_ms <= ?1", 1, p);
    if (mg_store_query(s->store,
                       "SELECT id, tenant_id, project_id, settings, summary, created_ms,"
                       " last_active_ms FROM sessions WHERE expires_ms > ?1"
                       " ORDER BY last_active_ms ASC",
                       1, p, load_session_row, s, err, sizeof(err)) != 0 ||
        mg_store_query(s->store,
                       "SELECT m.session_id, m.seq, m.created_ms, m.tokens, m.message"
                       " FROM session_messages m JOIN sessions s ON s.id = m.session_id"
                       " WHERE s.expires_ms > ?1 ORDER BY m.session_id, m.seq",
                       1, p, load_message_row, s, err, sizeof(err)) != 0)
        mg_log_msg(MG_LOG_WARN, NULL, "cannot read sessions: %s", err);
}

mg_sessions_t *mg_sessions_open(mg_store_t *st, int persist, int64_t now_ms)
{
    mg_sessions_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->store = st;
    s->persist = persist;
    s->last_sweep_ms = now_ms;
    if (persisting(s)) load(s, now_ms);
    return s;
}

void mg_sessions_free(mg_sessions_t *s)
{
    if (!s) return;
    while (s->lru_head) forget(s, s->lru_head);
    free(s);
}

/* ---- expiry and the memory budget ----------------------------------------------------- */

int64_t mg_session_expires_ms(const mg_session_t *x)
{
    int64_t ttl = x->created_ms + (int64_t)x->ttl_s * 1000;
    int64_t idle = x->last_active_ms + (int64_t)x->idle_s * 1000;
    return ttl < idle ? ttl : idle;
}

static int expired(const mg_session_t *x, int64_t now_ms)
{
    return !x->holder && mg_session_expires_ms(x) <= now_ms;
}

void mg_sessions_sweep(mg_sessions_t *s, const mg_context_conf_t *conf, int64_t now_ms)
{
    s->last_sweep_ms = now_ms;
    int any = 0;
    for (mg_session_t *x = s->lru_tail, *prev; x; x = prev) {
        prev = x->lru_prev;
        if (!expired(x, now_ms)) continue;
        forget(s, x);
        any = 1;
    }
    if (any && persisting(s)) { /* the rows of all of them, in two statements */
        char now[24];
        snprintf(now, sizeof(now), "%lld", (long long)now_ms);
        const char *p[1] = {now};
        mg_store_write(s->store,
                       "DELETE FROM session_messages WHERE session_id IN"
                       " (SELECT id FROM sessions WHERE expires_ms <= ?1)",
                       1, p);
        mg_store_write(s->store, "DELETE FROM sessions WHERE expires_ms <= ?1", 1, p);
    }
    /* memory only: the least recently used past the budget go */
    if (persisting(s)) return;
    for (mg_session_t *x = s->lru_tail, *prev; x && s->bytes > (size_t)conf->memory_budget_bytes;
         x = prev) {
        prev = x->lru_prev;
        if (!x->holder) forget(s, x);
    }
}

/* ---- the calls ------------------------------------------------------------------------ */

static char *opt_dup(const char *v)
{
    return v && *v ? strdup(v) : NULL;
}

mg_session_t *mg_sessions_create(mg_sessions_t *s, const mg_session_owner_t *owner,
                                 const mg_session_spec_t *spec, const mg_context_conf_t *conf,
                                 int64_t now_ms)
{
    mg_session_t *x = calloc(1, sizeof(*x));
    unsigned char raw[12];
    if (!x || mg_random_bytes(raw, sizeof(raw)) != 0) {
        free(x);
        return NULL;
    }
    memcpy(x->id, "sess_", 5);
    for (size_t i = 0; i < sizeof(raw); i++) snprintf(x->id + 5 + 2 * i, 3, "%02x", raw[i]);
    x->tenant_id = owner->all ? 0 : owner->tenant_id;
    x->project_id = owner->all ? 0 : owner->project_id;
    x->model = opt_dup(spec->model);
    x->system = opt_dup(spec->system);
    x->policy = opt_dup(spec->policy);
    x->metadata = opt_dup(spec->metadata);
    int cap = conf->max_session_messages;
    x->max_messages = spec->max_messages > 0 && spec->max_messages < cap ? spec->max_messages : cap;
    x->max_tokens = spec->max_tokens > 0 ? spec->max_tokens : 0;
    x->ttl_s = spec->ttl_s > 0 ? spec->ttl_s : conf->session_ttl_minutes * 60;
    x->idle_s = spec->idle_s > 0 ? spec->idle_s : conf->session_idle_ttl_minutes * 60;
    x->created_ms = x->last_active_ms = now_ms;
    x->next_seq = 1;
    x->bytes =
        sizeof(*x) + (x->system ? strlen(x->system) : 0) + (x->metadata ? strlen(x->metadata) : 0);
    if ((spec->model && *spec->model && !x->model) ||
        (spec->system && *spec->system && !x->system) ||
        (spec->policy && *spec->policy && !x->policy) ||
        (spec->metadata && *spec->metadata && !x->metadata)) {
        session_free(x);
        return NULL;
    }
    insert(s, x);
    persist_session(s, x);
    mg_sessions_sweep(s, conf, now_ms); /* the budget, now that it grew */
    return x;
}

static int may_see(const mg_session_owner_t *o, const mg_session_t *x)
{
    return o->all || (o->tenant_id == x->tenant_id && o->project_id == x->project_id);
}

mg_session_t *mg_sessions_find(mg_sessions_t *s, const char *id, const mg_session_owner_t *owner,
                               const mg_context_conf_t *conf, int64_t now_ms)
{
    if (now_ms - s->last_sweep_ms >= SWEEP_EVERY_MS) mg_sessions_sweep(s, conf, now_ms);
    mg_session_t *x = id ? lookup(s, id) : NULL;
    if (!x || !may_see(owner, x) || (!x->holder && mg_session_expires_ms(x) <= now_ms)) return NULL;
    lru_unlink(s, x);
    lru_front(s, x);
    return x;
}

void mg_sessions_delete(mg_sessions_t *s, mg_session_t *x)
{
    char id[MG_SESSION_ID_LEN + 1];
    memcpy(id, x->id, sizeof(id));
    forget(s, x);
    unpersist(s, id);
}

static int is_role(const char *json, const char *role)
{
    cJSON *m = cJSON_Parse(json);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    int yes = cJSON_IsString(r) && strcmp(r->valuestring, role) == 0;
    cJSON_Delete(m);
    return yes;
}

/* The first `drop` messages out of memory, and their rows. */
static void drop_first(mg_sessions_t *s, mg_session_t *x, size_t drop)
{
    for (size_t i = 0; i < drop; i++) {
        size_t n = strlen(x->msgs[i].json);
        x->bytes -= n;
        s->bytes -= n;
        free(x->msgs[i].json);
    }
    int64_t first_kept = drop < x->n_msgs ? x->msgs[drop].seq : x->next_seq;
    memmove(x->msgs, x->msgs + drop, (x->n_msgs - drop) * sizeof(*x->msgs));
    x->n_msgs -= drop;
    if (!persisting(s)) return;
    char seq[24];
    snprintf(seq, sizeof(seq), "%lld", (long long)first_kept);
    const char *p[2] = {x->id, seq};
    mg_store_write(s->store, "DELETE FROM session_messages WHERE session_id = ?1 AND seq < ?2", 2,
                   p);
}

/* Drop the oldest messages past max_messages; a tool result left first would have lost its
 * call, so it goes too. */
static void keep_recent(mg_sessions_t *s, mg_session_t *x)
{
    size_t drop = x->n_msgs > (size_t)x->max_messages ? x->n_msgs - (size_t)x->max_messages : 0;
    while (drop < x->n_msgs && drop > 0 && is_role(x->msgs[drop].json, "tool")) drop++;
    if (drop) drop_first(s, x, drop);
}

int mg_sessions_append(mg_sessions_t *s, mg_session_t *x, const char *json, long tokens,
                       int encoding, int64_t now_ms)
{
    if (grow(x) != 0) return -1;
    mg_session_msg_t *m = &x->msgs[x->n_msgs];
    m->json = strdup(json);
    if (!m->json) return -1;
    m->seq = x->next_seq++;
    m->created_ms = now_ms;
    m->tokens = tokens;
    m->encoding = encoding;
    x->n_msgs++;
    size_t n = strlen(json);
    x->bytes += n;
    s->bytes += n;
    persist_message(s, x, m);
    keep_recent(s, x);
    return 0;
}

void mg_sessions_touch(mg_sessions_t *s, mg_session_t *x, int64_t now_ms)
{
    x->last_active_ms = now_ms;
    persist_session(s, x);
}

void mg_session_wait(mg_session_t *x, mg_session_waiter_t *w)
{
    w->next = NULL;
    if (x->wait_tail) x->wait_tail->next = w;
    else x->wait_head = w;
    x->wait_tail = w;
}

void mg_session_unwait(mg_session_t *x, mg_session_waiter_t *w)
{
    mg_session_waiter_t *prev = NULL;
    for (mg_session_waiter_t *it = x->wait_head; it; prev = it, it = it->next) {
        if (it != w) continue;
        if (prev) prev->next = it->next;
        else x->wait_head = it->next;
        if (x->wait_tail == it) x->wait_tail = prev;
        it->next = NULL;
        return;
    }
}

mg_session_waiter_t *mg_session_next_waiter(mg_session_t *x)
{
    mg_session_waiter_t *w = x->wait_head;
    if (w) mg_session_unwait(x, w);
    return w;
}

void mg_sessions_summary_started(mg_session_t *x, const char *request_id, int64_t upto_seq)
{
    snprintf(x->summary_req, sizeof(x->summary_req), "%s", request_id);
    x->summary_upto = upto_seq;
}

mg_session_t *mg_sessions_by_summary(mg_sessions_t *s, const char *request_id)
{
    for (mg_session_t *x = s->lru_head; x; x = x->lru_next)
        if (x->summary_req[0] && strcmp(x->summary_req, request_id) == 0) return x;
    return NULL;
}

void mg_sessions_summary_done(mg_sessions_t *s, mg_session_t *x, const char *summary)
{
    x->summary_req[0] = '\0';
    if (!summary) return;
    char *copy = strdup(summary);
    if (!copy) return;
    size_t old = x->summary ? strlen(x->summary) : 0;
    free(x->summary);
    x->summary = copy;
    x->bytes += strlen(copy) - old;
    s->bytes += strlen(copy) - old;
    size_t drop = 0;
    while (drop < x->n_msgs && x->msgs[drop].seq <= x->summary_upto) drop++;
    if (drop) drop_first(s, x, drop);
    persist_session(s, x);
}

long long mg_session_tokens(const mg_session_t *x)
{
    long long n = 0;
    for (size_t i = 0; i < x->n_msgs; i++) n += x->msgs[i].tokens > 0 ? x->msgs[i].tokens : 0;
    return n;
}

void mg_sessions_count_trim(mg_sessions_t *s, const char *step)
{
    size_t i = 0;
    while (i + 1 < N_TRIM_STEPS && strcmp(TRIM_STEPS[i], step) != 0) i++;
    s->trims[i]++;
}

void mg_sessions_count_too_large(mg_sessions_t *s)
{
    s->too_large++;
}

void mg_sessions_count_summary(mg_sessions_t *s, int ok)
{
    s->summaries[ok ? 1 : 0]++;
}

void mg_sessions_metrics(const mg_sessions_t *s, mg_buf_t *out)
{
    char line[400];
    mg_buf_append_str(out, "# HELP moongate_context_trimming_total Trimming steps that changed a "
                           "request's messages (policies/context.lua).\n"
                           "# TYPE moongate_context_trimming_total counter\n");
    for (size_t i = 0; i < N_TRIM_STEPS; i++) {
        snprintf(line, sizeof(line), "moongate_context_trimming_total{step=\"%s\"} %llu\n",
                 TRIM_STEPS[i], (unsigned long long)s->trims[i]);
        mg_buf_append_str(out, line);
    }
    snprintf(
        line, sizeof(line),
        "# HELP moongate_context_too_large_total Requests refused as CONTEXT_TOO_LARGE.\n"
        "# TYPE moongate_context_too_large_total counter\nmoongate_context_too_large_total %llu\n",
        (unsigned long long)s->too_large);
    mg_buf_append_str(out, line);
    mg_buf_append_str(out, "# HELP moongate_session_summaries_total Summary calls that ended, by "
                           "outcome.\n# TYPE moongate_session_summaries_total counter\n");
    snprintf(line, sizeof(line),
             "moongate_session_summaries_total{outcome=\"ok\"} %llu\n"
             "moongate_session_summaries_total{outcome=\"failed\"} %llu\n",
             (unsigned long long)s->summaries[1], (unsigned long long)s->summaries[0]);
    mg_buf_append_str(out, line);
    snprintf(line, sizeof(line),
             "# HELP moongate_sessions Sessions in memory.\n# TYPE moongate_sessions gauge\n"
             "moongate_sessions %zu\n"
             "# HELP moongate_session_bytes Sessions' content in memory.\n"
             "# TYPE moongate_session_bytes gauge\nmoongate_session_bytes %zu\n",
             s->count, s->bytes);
    mg_buf_append_str(out, line);
}

size_t mg_sessions_count(const mg_sessions_t *s)
{
    return s->count;
}

size_t mg_sessions_bytes(const mg_sessions_t *s)
{
    return s->bytes;
}
