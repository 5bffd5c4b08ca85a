/* upkeep: see upkeep.h. */
#include "store/upkeep.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "store/journal.h"

#define BACKUP_PREFIX "moongate-"
#define BACKUP_SUFFIX ".db"
#define MEASURE_EVERY_S 10

struct mg_upkeep_s {
    char *db_path;
    char *backup_dir;
    mg_upkeep_conf_t conf;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int stopping;
    mg_upkeep_stats_t stats; /* under mu */
};

static int sqlite_copy(const char *db_path, const char *tmp, char *err, size_t errlen)
{
    sqlite3 *src = NULL, *dst = NULL;
    int rc = -1;
    if (sqlite3_open_v2(db_path, &src, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", db_path, src ? sqlite3_errmsg(src) : "cannot open");
        goto out;
    }
    sqlite3_busy_timeout(src, 5000);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK) {
        snprintf(err, errlen, "%s: %s", tmp, dst ? sqlite3_errmsg(dst) : "cannot open");
        goto out;
    }
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    if (!b) {
        snprintf(err, errlen, "backup: %s", sqlite3_errmsg(dst));
        goto out;
    }
    /* all pages in one step: one read transaction, so the copy is one consistent state */
    int step = sqlite3_backup_step(b, -1);
    sqlite3_backup_finish(b);
    if (step != SQLITE_DONE) {
        snprintf(err, errlen, "backup: %s", sqlite3_errstr(step));
        goto out;
    }
    if (sqlite3_close(dst) != SQLITE_OK) {
        snprintf(err, errlen, "backup: cannot close %s", tmp);
        goto out;
    }
    dst = NULL;
    rc = 0;
out:
    if (dst) sqlite3_close(dst);
    if (src) sqlite3_close(src);
    return rc;
}

/* The copied journal's records into the copy: the store's own replay at open, and its close
 * drains them (and leaves no WAL beside the copy). */
static int replay_into(const char *tmp, mg_store_replay_fn replay, char *err, size_t errlen)
{
    mg_store_t *st;
    if (mg_store_open(tmp, &st, err, errlen) != 0) return -1;
    int rc = replay(st);
    mg_store_close(st);
    if (rc != 0) snprintf(err, errlen, "backup: the usage journal's copy could not be replayed");
    return rc;
}

int mg_store_backup(const char *db_path, const char *dest, mg_store_replay_fn replay, char *err,
                    size_t errlen)
{
    char tmp[4096], journal[4200], journal_copy[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", dest);
    snprintf(journal, sizeof(journal), "%s.usage-journal", db_path);
    snprintf(journal_copy, sizeof(journal_copy), "%s.usage-journal", tmp);
    unlink(tmp);
    int copied = replay ? mg_journal_copy(journal, journal_copy, err, errlen) : 0;
    int rc = copied < 0 ? -1 : sqlite_copy(db_path, tmp, err, errlen);
    if (rc == 0 && copied == 1) rc = replay_into(tmp, replay, err, errlen);
    if (copied == 1) unlink(journal_copy);
    if (rc == 0 && rename(tmp, dest) != 0) {
        snprintf(err, errlen, "backup: rename to %s: %s", dest, strerror(errno));
        rc = -1;
    }
    if (rc != 0) unlink(tmp);
    return rc;
}

static int64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : 0;
}

static void measure(mg_upkeep_t *u)
{
    char wal[4096];
    snprintf(wal, sizeof(wal), "%s-wal", u->db_path);
    int64_t db = file_size(u->db_path), w = file_size(wal);
    pthread_mutex_lock(&u->mu);
    u->stats.db_bytes = db;
    u->stats.wal_bytes = w;
    pthread_mutex_unlock(&u->mu);
}

static sqlite3 *open_db(const mg_upkeep_t *u)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(u->db_path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        mg_log_msg(MG_LOG_ERROR, NULL, "store upkeep: cannot open %s: %s", u->db_path,
                   db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 1000);
    return db;
}

static void checkpoint(mg_upkeep_t *u, sqlite3 *db)
{
    int rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    if (rc == SQLITE_BUSY) return; /* the writer or a reader held on: next period */
    if (rc != SQLITE_OK) {
        mg_log_msg(MG_LOG_WARN, NULL, "store upkeep: checkpoint: %s", sqlite3_errmsg(db));
        return;
    }
    pthread_mutex_lock(&u->mu);
    u->stats.checkpoints_total++;
    pthread_mutex_unlock(&u->mu);
}

/* integrity_check answers one row "ok", or rows that describe each problem */
static int integrity_cb(void *ud, int ncols, char **cols, char **names)
{
    int *ok = ud;
    if (ncols < 1 || !cols[0] || strcmp(cols[0], "ok") != 0) *ok = 0;
    return 0;
}

static void integrity(mg_upkeep_t *u, sqlite3 *db)
{
    int ok = 1;
    char *msg = NULL;
    if (sqlite3_exec(db, "PRAGMA integrity_check", integrity_cb, &ok, &msg) != SQLITE_OK) {
        mg_log_msg(MG_LOG_WARN, NULL, "store upkeep: integrity_check did not run: %s",
                   msg ? msg : "error");
        sqlite3_free(msg);
        return; /* not run is not a finding: the gauge keeps its last value */
    }
    if (!ok)
        mg_log_msg(MG_LOG_ERROR, NULL, "store upkeep: integrity_check found problems in %s",
                   u->db_path);
    pthread_mutex_lock(&u->mu);
    u->stats.integrity_ok = ok;
    u->stats.integrity_at = (int64_t)time(NULL);
    pthread_mutex_unlock(&u->mu);
}

/* Delete this gateway's backups (moongate-*.db) older than backup_keep_s. */
static void prune_backups(const mg_upkeep_t *u, time_t now)
{
    DIR *d = opendir(u->backup_dir);
    if (!d) return;
    struct dirent *e;
    size_t plen = strlen(BACKUP_PREFIX), slen = strlen(BACKUP_SUFFIX);
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= plen + slen || strncmp(e->d_name, BACKUP_PREFIX, plen) != 0 ||
            strcmp(e->d_name + n - slen, BACKUP_SUFFIX) != 0)
            continue;
        char path[4096];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", u->backup_dir, e->d_name);
        if (stat(path, &st) == 0 && now - st.st_mtime > (time_t)u->conf.backup_keep_s) unlink(path);
    }
    closedir(d);
}

static void backup(mg_upkeep_t *u)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char path[4096], err[512];
    snprintf(path, sizeof(path), "%s/" BACKUP_PREFIX "%04d%02d%02d-%02d%02d%02d" BACKUP_SUFFIX,
             u->backup_dir, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
             tm.tm_sec);
    mkdir(u->backup_dir, 0750);
    int rc = mg_store_backup(u->db_path, path, u->conf.replay, err, sizeof(err));
    if (rc != 0) mg_log_msg(MG_LOG_ERROR, NULL, "store upkeep: %s", err);
    else mg_log_msg(MG_LOG_INFO, NULL, "store upkeep: backup written to %s", path);
    pthread_mutex_lock(&u->mu);
    if (rc == 0) {
        u->stats.backups_total++;
        u->stats.backup_at = (int64_t)now;
    } else {
        u->stats.backup_failures_total++;
    }
    pthread_mutex_unlock(&u->mu);
    if (rc == 0) prune_backups(u, now);
}

/* Sleep up to `seconds`; returns 1 when asked to stop. */
static int nap(mg_upkeep_t *u, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&u->mu);
    while (!u->stopping && pthread_cond_timedwait(&u->wake, &u->mu, &until) != ETIMEDOUT) {
    }
    int stop = u->stopping;
    pthread_mutex_unlock(&u->mu);
    return stop;
}

/* Is a job every `every_s` seconds due (0: never)? Its first run is at start. */
static int due(int64_t every_s, int64_t *next, int64_t now)
{
    if (every_s <= 0 || now < *next) return 0;
    *next = now + every_s;
    return 1;
}

static void *upkeep_main(void *arg)
{
    mg_upkeep_t *u = arg;
    sqlite3 *db = open_db(u);
    int64_t now = (int64_t)time(NULL);
    int64_t next_ckpt = now + u->conf.checkpoint_s, next_check = now, next_backup = now,
            next_measure = now;
    do {
        now = (int64_t)time(NULL);
        if (db && due(u->conf.checkpoint_s, &next_ckpt, now)) checkpoint(u, db);
        if (db && due(u->conf.integrity_s, &next_check, now)) integrity(u, db);
        if (u->backup_dir && due(u->conf.backup_every_s, &next_backup, now)) backup(u);
        if (due(MEASURE_EVERY_S, &next_measure, now)) measure(u);
    } while (!nap(u, 1));
    sqlite3_close(db);
    return NULL;
}

mg_upkeep_t *mg_upkeep_start(const char *db_path, const mg_upkeep_conf_t *conf)
{
    mg_upkeep_t *u = calloc(1, sizeof(*u));
    if (!u) return NULL;
    u->conf = *conf;
    u->db_path = strdup(db_path);
    u->backup_dir = conf->backup_dir ? strdup(conf->backup_dir) : NULL;
    u->conf.backup_dir = u->backup_dir;
    u->stats.integrity_ok = -1;
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->wake, NULL);
    if (!u->db_path || (conf->backup_dir && !u->backup_dir) ||
        pthread_create(&u->thread, NULL, upkeep_main, u) != 0) {
        free(u->db_path);
        free(u->backup_dir);
        pthread_mutex_destroy(&u->mu);
        pthread_cond_destroy(&u->wake);
        free(u);
        return NULL;
    }
    return u;
}

void mg_upkeep_stop(mg_upkeep_t *u)
{
    if (!u) return;
    pthread_mutex_lock(&u->mu);
    u->stopping = 1;
    pthread_cond_signal(&u->wake);
    pthread_mutex_unlock(&u->mu);
    pthread_join(u->thread, NULL);
    pthread_mutex_destroy(&u->mu);
    pthread_cond_destroy(&u->wake);
    free(u->db_path);
    free(u->backup_dir);
    free(u);
}

void mg_upkeep_stats(mg_upkeep_t *u, mg_upkeep_stats_t *out)
{
    pthread_mutex_lock(&u->mu);
    *out = u->stats;
    pthread_mutex_unlock(&u->mu);
}
