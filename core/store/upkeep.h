/* upkeep: the database's housekeeping inside the process, on a thread of its own (no cron):
 * a periodic WAL checkpoint that truncates the WAL file, a periodic integrity check, and
 * online backups into a directory with a retention in days. It also measures the database
 * and WAL file sizes for the metrics.
 *
 * It uses its own SQLite connection: WAL mode lets the writer thread keep committing while a
 * backup copies or the integrity check reads (a checkpoint that finds the writer busy waits
 * up to a second and is tried again next period). The loop thread never waits for it:
 * mg_upkeep_stats reads a snapshot under a mutex held only to copy it. */
#ifndef MG_UPKEEP_H
#define MG_UPKEEP_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

/* Opens a store's usage journal (the file beside its database), which replays the records
 * in it into the store: obs/usage's mg_usage_journal_replay. A backup passes it so that the
 * events still in the journal are in the copy. */
typedef int (*mg_store_replay_fn)(mg_store_t *st);

typedef struct mg_upkeep_conf_s {
    int64_t checkpoint_s; /* wal_checkpoint(TRUNCATE) every N seconds; 0: never */
    int64_t integrity_s; /* PRAGMA integrity_check every N seconds (first one at start); 0: never */
    const char *backup_dir;    /* online backups go here; NULL: no backups */
    int64_t backup_every_s;    /* one backup every N seconds (first one at start) */
    int64_t backup_keep_s;     /* backups older than this are deleted after each backup */
    mg_store_replay_fn replay; /* the usage journal's records into each backup; NULL: none */
} mg_upkeep_conf_t;

typedef struct mg_upkeep_stats_s {
    int64_t db_bytes;           /* the database file's size */
    int64_t wal_bytes;          /* the WAL file's size (0 when none) */
    int integrity_ok;           /* 1 ok, 0 the last check found a problem, -1 not checked yet */
    int64_t integrity_at;       /* unix seconds of the last check (0: none) */
    uint64_t checkpoints_total; /* truncating checkpoints completed */
    uint64_t backups_total;     /* backups written */
    uint64_t backup_failures_total;
    int64_t backup_at; /* unix seconds of the last backup written (0: none) */
} mg_upkeep_stats_t;

typedef struct mg_upkeep_s mg_upkeep_t;

/* Start the thread for the database at db_path (copied, as is conf). Returns NULL when the
 * thread cannot start (out of memory); then there is no upkeep, and nothing else changes. */
mg_upkeep_t *mg_upkeep_start(const char *db_path, const mg_upkeep_conf_t *conf);
/* Stop the thread (a running backup or check finishes first) and free it. NULL is fine. */
void mg_upkeep_stop(mg_upkeep_t *u);
/* The latest figures (any thread). */
void mg_upkeep_stats(mg_upkeep_t *u, mg_upkeep_stats_t *out);

/* An online, consistent copy of the database at db_path into dest, with SQLite's backup API,
 * while other connections keep reading and writing. With `replay`, the usage events still in
 * the journal beside db_path (store/journal.h) are in the copy too: the journal is copied
 * first, then the database, and the copy's journal is replayed into the copy (a record
 * drained in between is in both, and a replay adds it once). Written to dest + ".tmp" and
 * renamed, so dest is either the old file or a whole copy. Blocking: a worker thread or the
 * CLI. Returns 0, or -1 with the reason in err. */
int mg_store_backup(const char *db_path, const char *dest, mg_store_replay_fn replay, char *err,
                    size_t errlen);

#endif
