/* control: the control plane replicated through PostgreSQL's control_log; see control.h.
 * The SQLite statements are in control_sql.c. */
#include "admin/control.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "cluster/control_sql.h"
#include "tenancy/keys.h"

#define POLL_MS 250      /* the follower's poll; NOTIFY wakes it sooner */
#define FETCH_ROWS "500" /* log entries per round trip */
#define SHIP_ROWS 200    /* unshipped audit records per turn */
#define CHANNEL "mg_control"
#define STALL_MIN_MS 1000  /* a stalled follower's first retry */
#define STALL_MAX_MS 15000 /* and its longest wait between two */
#define RETRY_MS                                                                                   \
    1000 /* after a failed connect, admin writes fail at once this long (a dead                    \
            host's connect timeout is paid once a second at most) */

/* A changed row of a table mirrored in memory (CT_AUTH), waiting for the follower. */
typedef struct pend_s {
    struct pend_s *next;
    int ti;
    char pk[32];
    char gone_digest[2 * MG_KEY_DIGEST_LEN + 1]; /* "" or: a local key the log's row evicted */
} pend_t;

/* One change for the loop thread's auth state. */
enum { FX_PUT_KEY, FX_REMOVE_KEY, FX_ROTATE_KEY, FX_PROJECT, FX_TENANT, FX_REBUILD };
typedef struct fx_s {
    struct fx_s *next;
    int kind;
    mg_key_record_t *rec; /* FX_PUT_KEY, FX_ROTATE_KEY (the new key): one reference */
    unsigned char digest[MG_KEY_DIGEST_LEN];
    mg_auth_project_t project;
    mg_auth_tenant_t tenant;
} fx_t;

struct mg_control_s {
    mg_control_deps_t d;
    char *url;
    char node[129];
    cp_schema_t schema;
    /* the admin worker's side (the transaction hook): one transaction at a time */
    PGconn *wconn;
    int in_tx;          /* a PostgreSQL transaction is open on wconn */
    int64_t wfail_ms;   /* when wconn's last connection attempt failed */
    pend_t *tx_pend;    /* rows applied by the open transaction, mirrored once it commits */
    int tx_touched;     /* CT_* flags of the tables it applied */
    int64_t tx_append;  /* entries the open transaction appended */
    int64_t tx_applied; /* the log id its SQLite transaction is at */
    uint64_t tx_count;  /* entries of others it applied */
    /* the follower */
    pthread_t thread;
    int started;
    sqlite3 *fdb; /* the follower's own SQLite connection */
    PGconn *rconn;
    int wake[2]; /* a pipe: a committed transaction or the stop wakes the follower */
    int64_t stall_wait_ms, stall_next_ms; /* stalled: the backoff, the next attempt */
    /* shared, under mu */
    pthread_mutex_t mu;
    int stopping;
    pend_t *pending;
    int touched;
    fx_t *fx_head, **fx_tail; /* for the loop thread */
    int attached;
    uv_async_t async;
    mg_control_stats_t stats;
};

/* ---- PostgreSQL ---------------------------------------------------------------------------- */

static PGconn *connect_pg(const char *url)
{
    /* a dead host must not hold an admin request for minutes */
    const char *keys[] = {"dbname", "connect_timeout", "application_name", NULL};
    const char *vals[] = {url, "2", "moongate-control", NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (c && PQstatus(c) == CONNECTION_OK) return c;
    PQfinish(c);
    return NULL;
}

/* A command that returns no rows; 0 or -1 with err (the server's message, never the url). */
static int pg_cmd(PGconn *c, const char *sql, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok) snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

static void pend_free(pend_t *p)
{
    while (p) {
        pend_t *n = p->next;
        free(p);
        p = n;
    }
}

/* A local api key deleted by a 'del' of the log or because the log's row holds its secondary
 * UNIQUE key (cp_apply): memory forgets it by its digest, as for a revocation. Tenants and
 * projects so deleted keep their (limits-only) entries in memory: nothing authenticates by
 * them. */
static void on_evicted(void *ud, int ti, sqlite3_stmt *row)
{
    mg_control_t *cp = ((void **)ud)[0];
    pend_t **pend = ((void **)ud)[1];
    if (strcmp(cp->schema.t[ti].name, "api_keys") != 0) return;
    const char *id = NULL, *digest = NULL;
    for (int i = 0; i < sqlite3_column_count(row); i++) {
        const char *name = sqlite3_column_name(row, i);
        if (strcmp(name, "id") == 0) id = (const char *)sqlite3_column_text(row, i);
        else if (strcmp(name, "digest") == 0) digest = (const char *)sqlite3_column_text(row, i);
    }
    pend_t *e = digest ? calloc(1, sizeof(*e)) : NULL;
    if (!e) return;
    e->ti = ti;
    snprintf(e->pk, sizeof(e->pk), "%s", id ? id : "");
    snprintf(e->gone_digest, sizeof(e->gone_digest), "%s", digest);
    e->next = *pend;
    *pend = e;
}

/* Apply the entries newer than *applied from c into db (its transaction open), in id order;
 * the rows of CT_AUTH tables onto *pend, the tables' flags into *touched. 0; -1 (PostgreSQL or
 * SQLite failed: roll back, try again); 1: the entry after *applied cannot be applied by this
 * binary (*stall its id, err the reason): what came before it may commit. */
static int fetch_apply(mg_control_t *cp, PGconn *c, sqlite3 *db, int64_t *applied, pend_t **pend,
                       int *touched, uint64_t *count, int64_t *stall, char *err, size_t errlen)
{
    void *evicted_ud[2] = {cp, pend};
    for (;;) {
        char from[24];
        snprintf(from, sizeof(from), "%lld", (long long)*applied);
        const char *p[1] = {from};
        PGresult *r = PQexecParams(c,
                                   "SELECT id, tbl, pk, op, row FROM control_log WHERE id > $1"
                                   " ORDER BY id LIMIT " FETCH_ROWS,
                                   1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(c));
            PQclear(r);
            return -1;
        }
        int n = PQntuples(r);
        for (int i = 0; i < n; i++) {
            const char *tbl = PQgetvalue(r, i, 1), *pk = PQgetvalue(r, i, 2);
            int64_t id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
            int ti = cp_schema_find(&cp->schema, tbl), rc = CP_UNAPPLICABLE;
            if (ti < 0) snprintf(err, errlen, "a table this binary does not know: %.64s", tbl);
            else
                rc = cp_apply(&cp->schema, db, ti, PQgetvalue(r, i, 3), pk,
                              PQgetisnull(r, i, 4) ? NULL : PQgetvalue(r, i, 4), on_evicted,
                              evicted_ud, err, errlen);
            if (rc != 0) {
                PQclear(r);
                *stall = id;
                return rc == CP_UNAPPLICABLE ? 1 : -1;
            }
            *touched |= cp->schema.t[ti].flags;
            pend_t *e = (cp->schema.t[ti].flags & CT_AUTH) ? calloc(1, sizeof(*e)) : NULL;
            if (e) {
                e->ti = ti;
                snprintf(e->pk, sizeof(e->pk), "%s", pk);
                e->next = *pend;
                *pend = e;
            }
            *applied = id;
            (*count)++;
        }
        PQclear(r);
        if (n < atoi(FETCH_ROWS)) return 0;
    }
}

/* Hand what a committed transaction applied to the follower, which mirrors it in memory. */
static void hand_over(mg_control_t *cp, pend_t *pend, int touched)
{
    pthread_mutex_lock(&cp->mu);
    pend_t *tail = pend;
    while (tail && tail->next) tail = tail->next;
    if (tail) { /* pend is newest first: keep the whole list newest first */
        tail->next = cp->pending;
        cp->pending = pend;
    }
    cp->touched |= touched;
    pthread_mutex_unlock(&cp->mu);
    char b = 1;
    if (write(cp->wake[1], &b, 1) < 0) { /* full: the follower is awake anyway */
    }
}

/* ---- the transaction hook (the admin worker's thread) -------------------------------------- */

static void wconn_drop(mg_control_t *cp)
{
    PQfinish(cp->wconn);
    cp->wconn = NULL;
    cp->in_tx = 0;
}

/* A PostgreSQL transaction holding the cluster-wide writer lock (until it commits or rolls
 * back) on wconn; a connection found dead is replaced once (PostgreSQL restarted since the
 * last admin write). 0, or -1 with err set and no connection. */
static int begin_locked(mg_control_t *cp, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (cp->wconn && PQstatus(cp->wconn) != CONNECTION_OK) wconn_drop(cp);
        int64_t now = (int64_t)(uv_hrtime() / 1000000);
        if (!cp->wconn && now - cp->wfail_ms < RETRY_MS) { /* failed just now: do not wait again */
            snprintf(err, errlen, "PostgreSQL unreachable");
            return -1;
        }
        if (!cp->wconn && !(cp->wconn = connect_pg(cp->url))) {
            cp->wfail_ms = (int64_t)(uv_hrtime() / 1000000);
            snprintf(err, errlen, "PostgreSQL unreachable");
            return -1;
        }
        if (pg_cmd(cp->wconn, "BEGIN", err, errlen) == 0) {
            cp->in_tx = 1;
            if (pg_cmd(cp->wconn, "SELECT pg_advisory_xact_lock(" MG_CONTROL_LOCK ")", err,
                       errlen) == 0)
                return 0;
        }
        wconn_drop(cp);
    }
    return -1;
}

/* Before SQLite's BEGIN IMMEDIATE: the cluster-wide lock. */
static int hook_lock(void *ud, char *err, size_t errlen)
{
    mg_control_t *cp = ud;
    cp->tx_pend = NULL;
    cp->tx_touched = 0;
    cp->tx_append = 0;
    cp->tx_applied = 0;
    cp->tx_count = 0;
    if (begin_locked(cp, err, errlen) == 0) return 0;
    pthread_mutex_lock(&cp->mu);
    cp->stats.refused_total++;
    pthread_mutex_unlock(&cp->mu);
    return -1;
}

/* Inside SQLite's transaction: the entries not seen yet, so ids allocated next are the
 * cluster's. */
static int hook_begin(void *ud, sqlite3 *db, char *err, size_t errlen)
{
    mg_control_t *cp = ud;
    if (cp_capture_ensure(&cp->schema, db, err, errlen) != 0) return -1;
    int64_t applied = cp_state_applied(db);
    uint64_t n = 0;
    if (applied < 0) {
        snprintf(err, errlen, "control_state unreadable");
        return -1;
    }
    int64_t before = applied, stall = 0;
    char why[256];
    int rc = fetch_apply(cp, cp->wconn, db, &applied, &cp->tx_pend, &cp->tx_touched, &n, &stall,
                         why, sizeof(why));
    if (rc == 1) /* an instance that cannot follow the log must not write after it */
        snprintf(err, errlen, "control log entry %lld cannot be applied here: %s", (long long)stall,
                 why);
    else if (rc != 0) snprintf(err, errlen, "%s", why);
    if (rc != 0) return -1;
    if (applied != before && cp_state_set(db, applied, err, errlen) != 0) return -1;
    cp->tx_applied = applied;
    cp->tx_count = n;
    /* what was just applied is not this transaction's change */
    if (cp_outbox_clear(db) != 0) {
        snprintf(err, errlen, "cannot clear the outbox");
        return -1;
    }
    return 0;
}

/* Append the outbox's rows to the log; the last id into *last. 0 or -1. */
static int append_outbox(mg_control_t *cp, sqlite3 *db, int64_t *last, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT tbl, pk, op, row FROM temp.mg_outbox ORDER BY rowid", -1,
                           &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(db));
        return -1;
    }
    char at[24];
    snprintf(at, sizeof(at), "%lld", (long long)time(NULL) * 1000);
    int rc = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        const char *p[6] = {(const char *)sqlite3_column_text(st, 0),
                            (const char *)sqlite3_column_text(st, 1),
                            (const char *)sqlite3_column_text(st, 2),
                            (const char *)sqlite3_column_text(st, 3),
                            cp->node,
                            at};
        PGresult *r = PQexecParams(cp->wconn,
                                   "INSERT INTO control_log(tbl, pk, op, row, node, at)"
                                   " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
                                   6, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
            *last = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
            cp->tx_append++;
        } else {
            snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(cp->wconn));
            rc = -1;
        }
        PQclear(r);
    }
    sqlite3_finalize(st);
    return rc;
}

static int hook_commit(void *ud, sqlite3 *db, char *err, size_t errlen)
{
    mg_control_t *cp = ud;
    int64_t last = 0;
    if (append_outbox(cp, db, &last, err, errlen) != 0) goto fail;
    if (last > 0) {
        /* this instance has its own entries already: applied up to the last of them */
        if (cp_state_set(db, last, err, errlen) != 0) goto fail;
        if (pg_cmd(cp->wconn, "NOTIFY " CHANNEL, err, errlen) != 0) goto fail;
    }
    cp_outbox_clear(db);
    if (pg_cmd(cp->wconn, "COMMIT", err, errlen) != 0) goto fail;
    cp->in_tx = 0;
    pthread_mutex_lock(&cp->mu);
    cp->stats.appended_total += (uint64_t)cp->tx_append;
    if (last > 0) cp->tx_applied = last;
    pthread_mutex_unlock(&cp->mu);
    return 0;
fail:
    if (PQstatus(cp->wconn) != CONNECTION_OK) wconn_drop(cp);
    pthread_mutex_lock(&cp->mu);
    cp->stats.refused_total++;
    pthread_mutex_unlock(&cp->mu);
    return -1;
}

static void hook_end(void *ud, int committed)
{
    mg_control_t *cp = ud;
    if (cp->in_tx) {
        char err[64];
        if (pg_cmd(cp->wconn, "ROLLBACK", err, sizeof(err)) != 0) wconn_drop(cp);
        cp->in_tx = 0;
    }
    if (committed) {
        pthread_mutex_lock(&cp->mu);
        if (cp->tx_applied > cp->stats.applied_id) cp->stats.applied_id = cp->tx_applied;
        cp->stats.applied_total += cp->tx_count;
        pthread_mutex_unlock(&cp->mu);
    }
    if (committed && (cp->tx_pend || cp->tx_touched)) hand_over(cp, cp->tx_pend, cp->tx_touched);
    else pend_free(cp->tx_pend);
    cp->tx_pend = NULL;
    cp->tx_touched = 0;
}

/* ---- memory: the auth state and the generation (built here, applied on the loop) ---------- */

typedef struct rowfx_s {
    mg_control_t *cp;
    int ti;
    fx_t *fx;
} rowfx_t;

static int64_t col_i64(const char *s)
{
    return s ? strtoll(s, NULL, 10) : 0;
}

/* The record of the unrevoked key replaced_by names (a rotation's new key), or NULL. */
static mg_key_record_t *replacement(mg_control_t *cp, const char *id)
{
    sqlite3_stmt *st = NULL;
    mg_key_record_t *rec = NULL;
    if (sqlite3_prepare_v2(cp->fdb,
                           "SELECT " MG_AUTH_KEY_COLUMNS
                           " FROM api_keys WHERE id = ?1 AND revoked_at IS NULL",
                           -1, &st, NULL) != SQLITE_OK)
        return NULL;
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_count(st) == MG_AUTH_KEY_NCOLS) {
        const char *cols[MG_AUTH_KEY_NCOLS];
        for (int i = 0; i < MG_AUTH_KEY_NCOLS; i++)
            cols[i] = (const char *)sqlite3_column_text(st, i);
        rec = mg_auth_record_from_row(MG_AUTH_KEY_NCOLS, cols);
    }
    sqlite3_finalize(st);
    return rec;
}

static void fx_from_row(rowfx_t *r, int ncols, const char *const *cols)
{
    fx_t *f = calloc(1, sizeof(*f));
    if (!f) return;
    const char *name = r->cp->schema.t[r->ti].name;
    if (strcmp(name, "api_keys") == 0 && ncols > MG_AUTH_KEY_NCOLS) {
        if (cols[MG_AUTH_KEY_NCOLS]) { /* revoked; replaced: a rotation, its level moves */
            f->kind = FX_REMOVE_KEY;
            if (!cols[3] || mg_auth_digest_parse(cols[3], f->digest) != 0) f->kind = -1;
            else if (ncols > MG_AUTH_KEY_NCOLS + 1 && cols[MG_AUTH_KEY_NCOLS + 1] &&
                     (f->rec = replacement(r->cp, cols[MG_AUTH_KEY_NCOLS + 1])))
                f->kind = FX_ROTATE_KEY;
        } else {
            f->kind = FX_PUT_KEY;
            if (!(f->rec = mg_auth_record_from_row(MG_AUTH_KEY_NCOLS, cols))) f->kind = -1;
        }
    } else if (strcmp(name, "projects") == 0 && ncols >= 7) {
        f->kind = FX_PROJECT;
        f->project = (mg_auth_project_t){.id = col_i64(cols[0]),
                                         .tenant_id = col_i64(cols[1]),
                                         .rpm_limit = (uint32_t)col_i64(cols[2]),
                                         .tpm_limit = (uint32_t)col_i64(cols[3]),
                                         .max_concurrency = (uint32_t)col_i64(cols[4]),
                                         .monthly_limit_micros = col_i64(cols[5]),
                                         .daily_limit_micros = col_i64(cols[6])};
    } else if (strcmp(name, "tenants") == 0 && ncols >= 5) {
        f->kind = FX_TENANT;
        f->tenant = (mg_auth_tenant_t){.id = col_i64(cols[0]),
                                       .daily_limit_micros = col_i64(cols[1]),
                                       .monthly_limit_micros = col_i64(cols[2]),
                                       .prepaid = cols[3] && strcmp(cols[3], "prepaid") == 0,
                                       .require_upstream_usage = col_i64(cols[4]) != 0};
    } else {
        f->kind = -1;
    }
    if (f->kind < 0) {
        mg_log_msg(MG_LOG_ERROR, NULL, "control: replicated %s row unusable", name);
        free(f);
        return;
    }
    f->next = r->fx;
    r->fx = f;
}

static const char *row_sql(const char *name)
{
    if (strcmp(name, "api_keys") == 0)
        return "SELECT " MG_AUTH_KEY_COLUMNS
               ", revoked_at, replaced_by FROM api_keys WHERE id = ?1";
    if (strcmp(name, "projects") == 0)
        return "SELECT id, tenant_id, rpm_limit, tpm_limit, max_concurrency,"
               " monthly_limit_micros, daily_limit_micros FROM projects WHERE id = ?1";
    return "SELECT id, daily_limit_micros, monthly_limit_micros, billing_mode,"
           " require_upstream_usage FROM tenants WHERE id = ?1";
}

/* The effect of one changed row as it is now in fdb, prepended to r->fx. */
static void row_effect(mg_control_t *cp, rowfx_t *r, const pend_t *p)
{
    if (p->gone_digest[0]) { /* evicted: no row to read any more */
        fx_t *f = calloc(1, sizeof(*f));
        if (!f) return;
        f->kind = FX_REMOVE_KEY;
        if (mg_auth_digest_parse(p->gone_digest, f->digest) != 0) {
            free(f);
            return;
        }
        f->next = r->fx;
        r->fx = f;
        return;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(cp->fdb, row_sql(cp->schema.t[p->ti].name), -1, &st, NULL) != SQLITE_OK)
        return;
    sqlite3_bind_text(st, 1, p->pk, -1, SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW) {
        int n = sqlite3_column_count(st);
        const char *cols[24];
        if (n > 24) n = 24;
        for (int i = 0; i < n; i++) cols[i] = (const char *)sqlite3_column_text(st, i);
        r->ti = p->ti;
        fx_from_row(r, n, cols);
    }
    sqlite3_finalize(st);
}

/* Follower thread: turn what was applied into effects and hand them to the loop. */
static void mirror(mg_control_t *cp)
{
    pthread_mutex_lock(&cp->mu);
    pend_t *pend = cp->pending;
    int touched = cp->touched;
    cp->pending = NULL;
    cp->touched = 0;
    pthread_mutex_unlock(&cp->mu);
    if (!pend && !(touched & CT_REBUILD)) return;
    /* pend is newest first; effects are built newest first onto a list, so oldest first */
    rowfx_t r = {cp, 0, NULL};
    for (pend_t *p = pend; p; p = p->next) row_effect(cp, &r, p);
    pend_free(pend);
    if (touched & CT_REBUILD) {
        fx_t *f = calloc(1, sizeof(*f));
        if (f) {
            f->kind = FX_REBUILD;
            fx_t **t = &r.fx;
            while (*t) t = &(*t)->next;
            *t = f;
        }
    }
    pthread_mutex_lock(&cp->mu);
    for (fx_t *f = r.fx, *n; f; f = n) {
        n = f->next;
        f->next = NULL;
        *cp->fx_tail = f;
        cp->fx_tail = &f->next;
    }
    if (cp->attached) uv_async_send(&cp->async);
    pthread_mutex_unlock(&cp->mu);
}

static void rebuilt(void *ud, int ok, const char *err)
{
    (void)ud;
    if (!ok) mg_log_msg(MG_LOG_ERROR, NULL, "control: replicated change, rebuild failed: %s", err);
}

static void fx_free(fx_t *f)
{
    mg_key_record_unref(f->rec);
    free(f);
}

/* A rotation replayed: the new key takes over the old one's level (its counters), as on the
 * instance that rotated (mg_auth_rotate_key). The old key already gone (the same rotation's
 * rows seen again): the new key is put. The new key already indexed (its row mirrored before
 * the old one's): it is dropped first, so the old key's counters still move to it. */
static int rotate_key(mg_auth_t *auth, const fx_t *f)
{
    int rc = mg_auth_rotate_key(auth, f->digest, f->rec);
    if (rc == MG_KEYS_ENOENT) return mg_auth_put_key(auth, f->rec);
    if (rc == MG_KEYS_EEXIST && mg_auth_remove_key(auth, f->rec->digest) == 0)
        rc = mg_auth_rotate_key(auth, f->digest, f->rec);
    return rc;
}

/* Loop thread: the replicated changes reach memory, as a local admin write's do. */
static void on_async(uv_async_t *h)
{
    mg_control_t *cp = h->data;
    pthread_mutex_lock(&cp->mu);
    fx_t *list = cp->fx_head;
    cp->fx_head = NULL;
    cp->fx_tail = &cp->fx_head;
    pthread_mutex_unlock(&cp->mu);
    int rebuild = 0;
    mg_auth_t *auth = cp->d.auth;
    for (fx_t *f = list, *n; f; f = n) {
        n = f->next;
        int rc = 0;
        if (f->kind == FX_PUT_KEY && auth) rc = mg_auth_put_key(auth, f->rec);
        else if (f->kind == FX_REMOVE_KEY && auth) mg_auth_remove_key(auth, f->digest);
        else if (f->kind == FX_ROTATE_KEY && auth) rc = rotate_key(auth, f);
        else if (f->kind == FX_PROJECT && auth) rc = mg_auth_put_project(auth, &f->project);
        else if (f->kind == FX_TENANT && auth) rc = mg_auth_put_tenant(auth, &f->tenant);
        else if (f->kind == FX_REBUILD) rebuild = 1;
        if (rc != 0)
            mg_log_msg(MG_LOG_ERROR, NULL, "control: a replicated change missed memory (%d)", rc);
        fx_free(f);
    }
    if (rebuild && cp->d.rebuild) cp->d.rebuild(cp->d.rebuild_ud, rebuilt, cp);
}

/* ---- the follower thread ------------------------------------------------------------------- */

/* The follower is stalled at entry id (0: not stalled), for why. One log line per entry. */
static void set_stall(mg_control_t *cp, int64_t id, const char *why)
{
    pthread_mutex_lock(&cp->mu);
    int64_t was = cp->stats.stalled_id;
    cp->stats.stalled_id = id;
    snprintf(cp->stats.stalled_reason, sizeof(cp->stats.stalled_reason), "%.255s", id ? why : "");
    pthread_mutex_unlock(&cp->mu);
    if (id && id != was)
        mg_log_msg(MG_LOG_ERROR, NULL,
                   "control: stalled at log entry %lld, which this instance cannot apply: %s"
                   " (retrying with backoff; an upgrade lets it resume)",
                   (long long)id, why);
    else if (!id && was)
        mg_log_msg(MG_LOG_INFO, NULL, "control: log entry %lld applied, following again",
                   (long long)was);
    if (!id) cp->stall_wait_ms = 0;
    else if (id != was) cp->stall_wait_ms = STALL_MIN_MS;
    else if ((cp->stall_wait_ms *= 2) > STALL_MAX_MS) cp->stall_wait_ms = STALL_MAX_MS;
    cp->stall_next_ms = (int64_t)(uv_hrtime() / 1000000) + cp->stall_wait_ms;
}

/* Append the oldest unshipped audit records (cp_schema_t.unshipped) to the log as this
 * instance's 'add' entries, as its admin transactions do, and remove them from
 * audit_unshipped: inside the follower's SQLite transaction, with the writers' lock held on
 * rconn. An entry already in the log (the same node, record id and row: shipped before a
 * crash lost the removal) is not appended twice. The last appended id into *last. 0 or -1. */
static int ship_audit(mg_control_t *cp, int64_t *last, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(cp->fdb, cp->schema.unshipped, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s", sqlite3_errmsg(cp->fdb));
        return -1;
    }
    sqlite3_bind_int(st, 1, SHIP_ROWS);
    char at[24];
    snprintf(at, sizeof(at), "%lld", (long long)time(NULL) * 1000);
    int64_t upto = 0;
    int rc = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        upto = sqlite3_column_int64(st, 0);
        if (sqlite3_column_type(st, 1) == SQLITE_NULL) continue; /* the record is gone */
        const char *p[4] = {(const char *)sqlite3_column_text(st, 1),
                            (const char *)sqlite3_column_text(st, 2), cp->node, at};
        PGresult *r = PQexecParams(cp->rconn,
                                   "INSERT INTO control_log(tbl, pk, op, row, node, at)"
                                   " SELECT 'audit_logs', $1, 'add', $2, $3, $4 WHERE NOT EXISTS"
                                   " (SELECT 1 FROM control_log WHERE node = $3"
                                   " AND tbl = 'audit_logs' AND pk = $1 AND row = $2)"
                                   " RETURNING id",
                                   4, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            snprintf(err, errlen, "PostgreSQL: %s", PQerrorMessage(cp->rconn));
            rc = -1;
        } else if (PQntuples(r) == 1) {
            *last = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
            pthread_mutex_lock(&cp->mu);
            cp->stats.appended_total++;
            cp->stats.shipped_total++;
            pthread_mutex_unlock(&cp->mu);
        }
        PQclear(r);
    }
    sqlite3_finalize(st);
    if (rc == 0 && upto > 0) rc = cp_unshipped_clear(cp->fdb, upto, err, errlen);
    if (rc == 0 && *last > 0) rc = pg_cmd(cp->rconn, "NOTIFY " CHANNEL, err, errlen);
    return rc;
}

/* One turn: apply what the log has beyond this instance's SQLite, and ship the audit records
 * kept here while the log was out of reach. Shipping takes the writers' lock before SQLite's
 * write lock, as an admin transaction does, and writes nothing past an entry this binary
 * cannot apply. */
static void follow_once(mg_control_t *cp)
{
    char err[512] = "";
    if (cp->stall_wait_ms && (int64_t)(uv_hrtime() / 1000000) < cp->stall_next_ms) return;
    int64_t local = cp_state_applied(cp->fdb);
    PGresult *r = PQexec(cp->rconn, "SELECT COALESCE(max(id), 0) FROM control_log");
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
    int64_t remote = ok ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    int ship = ok && cp_unshipped_any(cp->fdb);
    if (!ok || local < 0 || (remote <= local && !ship)) return;
    if (ship && (pg_cmd(cp->rconn, "BEGIN", err, sizeof(err)) != 0 ||
                 pg_cmd(cp->rconn, "SELECT pg_advisory_xact_lock(" MG_CONTROL_LOCK ")", err,
                        sizeof(err)) != 0)) {
        pg_cmd(cp->rconn, "ROLLBACK", err, sizeof(err));
        mg_log_msg(MG_LOG_WARN, NULL, "control: cannot ship the audit records kept here: %s", err);
        return;
    }
    pend_t *pend = NULL;
    int touched = 0, rc = -1;
    uint64_t n = 0;
    int64_t stall = 0, last = 0;
    if (sqlite3_exec(cp->fdb, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
        if (ship) pg_cmd(cp->rconn, "ROLLBACK", err, sizeof(err));
        return;
    }
    int64_t applied = cp_state_applied(cp->fdb); /* again, under the write lock */
    if (applied >= 0)
        rc = fetch_apply(cp, cp->rconn, cp->fdb, &applied, &pend, &touched, &n, &stall, err,
                         sizeof(err));
    if (rc == 0 && ship && ship_audit(cp, &last, err, sizeof(err)) != 0) rc = -1;
    if (last > 0) applied = last; /* its own entries: applied already */
    if (rc >= 0 && cp_state_set(cp->fdb, applied, err, sizeof(err)) != 0) rc = -1;
    /* PostgreSQL commits first, as in an admin transaction: should SQLite's commit fail, the
     * records are shipped again and found in the log */
    char ignore[64];
    if (ship && rc < 0) pg_cmd(cp->rconn, "ROLLBACK", ignore, sizeof(ignore));
    else if (ship && pg_cmd(cp->rconn, "COMMIT", err, sizeof(err)) != 0) rc = -1;
    if (rc >= 0 && sqlite3_exec(cp->fdb, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) rc = -1;
    if (rc < 0) {
        sqlite3_exec(cp->fdb, "ROLLBACK", NULL, NULL, NULL);
        mg_log_msg(MG_LOG_ERROR, NULL, "control: cannot apply the log: %s", err);
        pend_free(pend);
        return;
    }
    /* rc 1: the entries before the stalled one are committed; it is retried with backoff */
    set_stall(cp, rc == 1 ? stall : 0, err);
    pthread_mutex_lock(&cp->mu);
    if (applied > cp->stats.applied_id) cp->stats.applied_id = applied;
    cp->stats.applied_total += n;
    pthread_mutex_unlock(&cp->mu);
    hand_over(cp, pend, touched);
}

static void set_connected(mg_control_t *cp, int on)
{
    pthread_mutex_lock(&cp->mu);
    cp->stats.follower_connected = on;
    pthread_mutex_unlock(&cp->mu);
}

static int stopping(mg_control_t *cp)
{
    pthread_mutex_lock(&cp->mu);
    int s = cp->stopping;
    pthread_mutex_unlock(&cp->mu);
    return s;
}

/* Wait up to ms for a notification, a wake-up byte or the stop. */
static void wait_for(mg_control_t *cp, int ms)
{
    struct pollfd fds[2] = {{cp->wake[0], POLLIN, 0}, {-1, POLLIN, 0}};
    if (cp->rconn) fds[1].fd = PQsocket(cp->rconn);
    if (poll(fds, 2, ms) > 0 && (fds[0].revents & POLLIN)) {
        char buf[64];
        while (read(cp->wake[0], buf, sizeof(buf)) > 0) {
        }
    }
    if (!cp->rconn) return;
    PQconsumeInput(cp->rconn);
    PGnotify *n;
    while ((n = PQnotifies(cp->rconn))) PQfreemem(n);
}

static void *follow_main(void *arg)
{
    mg_control_t *cp = arg;
    int backoff = POLL_MS;
    while (!stopping(cp)) {
        if (cp->rconn && PQstatus(cp->rconn) != CONNECTION_OK) {
            PQfinish(cp->rconn);
            cp->rconn = NULL;
            set_connected(cp, 0);
            mg_log_msg(MG_LOG_WARN, NULL, "control: the log's connection was lost");
        }
        if (!cp->rconn && (cp->rconn = connect_pg(cp->url))) {
            char err[256];
            if (pg_cmd(cp->rconn, "LISTEN " CHANNEL, err, sizeof(err)) != 0) {
                PQfinish(cp->rconn);
                cp->rconn = NULL;
            } else {
                set_connected(cp, 1);
                backoff = POLL_MS;
            }
        }
        if (cp->rconn) follow_once(cp);
        mirror(cp);
        wait_for(cp, cp->rconn ? POLL_MS : backoff);
        if (!cp->rconn && backoff < 4000) backoff *= 2;
    }
    PQfinish(cp->rconn);
    cp->rconn = NULL;
    return NULL;
}

/* ---- life ---------------------------------------------------------------------------------- */

static int open_fdb(mg_control_t *cp, char *err, size_t errlen)
{
    if (sqlite3_open_v2(mg_store_path(cp->d.store), &cp->fdb,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        snprintf(err, errlen, "control: %s", cp->fdb ? sqlite3_errmsg(cp->fdb) : "cannot open");
        return -1;
    }
    sqlite3_busy_timeout(cp->fdb, 5000);
    if (cp_state_ensure(cp->fdb, err, errlen) != 0) return -1;
    cp->stats.applied_id = cp_state_applied(cp->fdb);
    return cp_schema_build(&cp->schema, cp->fdb, err, errlen);
}

static void control_free(mg_control_t *cp)
{
    cp_schema_free(&cp->schema);
    if (cp->fdb) sqlite3_close(cp->fdb);
    for (fx_t *f = cp->fx_head, *n; f; f = n) {
        n = f->next;
        fx_free(f);
    }
    pend_free(cp->pending);
    if (cp->wake[0] >= 0) close(cp->wake[0]);
    if (cp->wake[1] >= 0) close(cp->wake[1]);
    pthread_mutex_destroy(&cp->mu);
    free(cp->url);
    free(cp);
}

mg_control_t *mg_control_start(const mg_control_deps_t *d, char *err, size_t errlen)
{
    mg_control_t *cp = calloc(1, sizeof(*cp));
    if (!cp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    cp->d = *d;
    cp->wake[0] = cp->wake[1] = -1;
    cp->fx_tail = &cp->fx_head;
    pthread_mutex_init(&cp->mu, NULL);
    snprintf(cp->node, sizeof(cp->node), "%s", mg_store_node_id(d->store));
    if (!(cp->url = strdup(d->url)) || pipe(cp->wake) != 0) {
        snprintf(err, errlen, "control: cannot start");
        control_free(cp);
        return NULL;
    }
    for (int i = 0; i < 2; i++)
        fcntl(cp->wake[i], F_SETFL, fcntl(cp->wake[i], F_GETFL) | O_NONBLOCK);
    if (open_fdb(cp, err, errlen) != 0 || uv_async_init(d->loop, &cp->async, on_async) != 0) {
        control_free(cp);
        return NULL;
    }
    cp->async.data = cp;
    cp->attached = 1;
    mg_store_txhook_t h = {hook_lock, hook_begin, hook_commit, hook_end, cp};
    mg_store_set_txhook(d->store, &h);
    if (pthread_create(&cp->thread, NULL, follow_main, cp) != 0) {
        snprintf(err, errlen, "control: cannot start its thread");
        mg_store_set_txhook(d->store, NULL);
        mg_control_detach(cp);
        return NULL; /* freed by the detach's close callback */
    }
    cp->started = 1;
    return cp;
}

static void on_closed(uv_handle_t *h)
{
    mg_control_t *cp = h->data;
    if (!cp->started) control_free(cp);
}

void mg_control_detach(mg_control_t *cp)
{
    if (!cp) return;
    pthread_mutex_lock(&cp->mu);
    int was = cp->attached;
    cp->attached = 0;
    pthread_mutex_unlock(&cp->mu);
    if (was) uv_close((uv_handle_t *)&cp->async, on_closed);
}

void mg_control_stop(mg_control_t *cp)
{
    if (!cp) return;
    pthread_mutex_lock(&cp->mu);
    cp->stopping = 1;
    pthread_mutex_unlock(&cp->mu);
    char b = 1;
    if (write(cp->wake[1], &b, 1) < 0) {
    }
    pthread_join(cp->thread, NULL);
    mg_store_set_txhook(cp->d.store, NULL);
    if (cp->in_tx) hook_end(cp, 0);
    PQfinish(cp->wconn);
    control_free(cp);
}

void mg_control_stats(mg_control_t *cp, mg_control_stats_t *out)
{
    pthread_mutex_lock(&cp->mu);
    *out = cp->stats;
    pthread_mutex_unlock(&cp->mu);
}
